/*
 * The fuzz harnesses of tests/fuzz/: each defines LLVMFuzzerTestOneInput. Built two ways: with
 * libFuzzer (configure --enable-fuzz, CC=clang: `make fuzz` runs each for FUZZ_SECONDS), and
 * with replay.c's plain main, which feeds every file of the harness's corpus
 * (tests/fuzz/corpus/<name>/) to it -- `make check` runs that, so every input that ever found
 * something stays a regression test. A harness reports a broken contract with fuzz_fail
 * (abort, so that libFuzzer records the input); memory errors are the sanitizers'.
 */
#ifndef FA_FUZZ_H
#define FA_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* to file descriptor 2 itself: a harness may point stdio's stderr elsewhere */
#define fuzz_fail(...)                                                                         \
    do {                                                                                       \
        dprintf(2, "fuzz: %s:%d: ", __FILE__, __LINE__);                                       \
        dprintf(2, __VA_ARGS__);                                                               \
        dprintf(2, "\n");                                                                      \
        abort();                                                                               \
    } while (0)

/* Bytes taken one value at a time; past the end every read gives 0. */
typedef struct {
    const uint8_t *p;
    size_t n;
} fuzz_bytes;

static inline uint64_t fuzz_take(fuzz_bytes *b, int nbytes)
{
    uint64_t v = 0;
    for (int i = 0; i < nbytes; i++) {
        v = v << 8 | (b->n ? *b->p : 0);
        if (b->n)
            b->p++, b->n--;
    }
    return v;
}

#endif
