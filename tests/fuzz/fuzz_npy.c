/*
 * The .npy reader on any bytes: it must either load exactly what the header declares or refuse
 * with a message naming the file -- never crash, read out of bounds or leak (the sanitizers),
 * never return a buffer of a size other than its shape's. A file it loads must survive a round
 * trip through the writer: read(write(a)) == a, byte for byte.
 */
#include "config.h"

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memfd_create */
#endif

#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../../src/cli/npy.h"
#include "fuzz.h"

/* A file in memory under a path: the reader opens paths. */
static const char *memfile(int *fd, char *path, size_t n, const uint8_t *data, size_t size)
{
    if (*fd < 0) {
        *fd = memfd_create("fuzz_npy", 0);
        if (*fd < 0)
            fuzz_fail("memfd_create");
        snprintf(path, n, "/proc/self/fd/%d", *fd);
    }
    if (ftruncate(*fd, 0) != 0 || (size && pwrite(*fd, data, size, 0) != (ssize_t)size))
        fuzz_fail("writing the input file");
    return path;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int in_fd = -1, out_fd = -1;
    static char in_path[64], out_path[64];
    const char *p = memfile(&in_fd, in_path, sizeof in_path, data, size);
    npy_array a;
    char err[512];
    memset(err, 'x', sizeof err);
    int r = npy_read(p, (size_t)1 << 24, &a, err, sizeof err);
    if (!memchr(err, '\0', sizeof err))
        fuzz_fail("the message is not terminated");
    if (r != 0) {
        if (a.data || a.nbytes || a.ndim)
            fuzz_fail("a refused file left an array behind");
        if (strncmp(err, p, strlen(p)) != 0)
            fuzz_fail("the message does not start with the path: %s", err);
        return 0;
    }
    if (a.ndim < 0 || a.ndim > NPY_MAX_DIMS)
        fuzz_fail("loaded an array of %d dims", a.ndim);
    size_t want = npy_kind_size(a.kind);
    for (int i = 0; i < a.ndim; i++)
        want *= (size_t)a.shape[i];
    if (a.data == NULL || a.nbytes != want)
        fuzz_fail("loaded %zu bytes for a shape of %zu", a.nbytes, want);
    /* the round trip */
    memfile(&out_fd, out_path, sizeof out_path, NULL, 0);
    FILE *f = fopen(out_path, "wb");
    if (!f || npy_write_stream(f, out_path, a.kind, a.ndim, a.shape, a.data, err, sizeof err))
        fuzz_fail("writing back what was read: %s", err);
    fclose(f);
    npy_array b;
    if (npy_read(out_path, (size_t)1 << 24, &b, err, sizeof err))
        fuzz_fail("reading back what was written: %s", err);
    if (b.kind != a.kind || b.ndim != a.ndim || memcmp(b.shape, a.shape, sizeof a.shape) ||
        b.nbytes != a.nbytes || memcmp(b.data, a.data, a.nbytes))
        fuzz_fail("the round trip changed the array");
    npy_free(&a);
    npy_free(&b);
    return 0;
}
