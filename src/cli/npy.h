/*
 * .npy files for the command: a strict reader and a numpy-compatible writer of the five storage
 * types the CLI exchanges with Python (float16/32/64, 16-bit words, the way bfloat16 travels,
 * and bytes, the way FP8 codes travel), of the two integer types its offsets and indices come
 * in (int32, int64) and of numpy's bool (a keep-mask).
 *
 * Written from the NPY format specification (numpy/doc/neps/nep-0001-npy-format.rst):
 *   "\x93NUMPY" | major | minor | header length (LE uint16 for 1.x, LE uint32 for 2.x/3.x)
 *   | header: a Python dict literal {'descr': .., 'fortran_order': .., 'shape': (..)}, padded
 *     with spaces and ending in '\n' | the raw data, exactly prod(shape) * itemsize bytes.
 *
 * Contract of the reader (npy_read):
 *   - a file is either loaded completely and exactly as declared, or refused with a message that
 *     starts with the path and names the problem; nothing in between (no partial arrays);
 *   - only a regular file is read: the path is opened without blocking (a FIFO would wait for
 *     a writer) and its type checked before the first read; a file whose size reads 0 but has
 *     content (/proc, /sys) is refused, since its size cannot be checked up front;
 *   - a long path is shortened in the message (its start and end), so the reason always fits;
 *   - it never allocates more than max_bytes + the header (at most 1 MiB) + a few bytes: the
 *     declared data size is checked against max_bytes AND against the real file size before
 *     the data buffer exists, so a hostile shape costs nothing;
 *   - accepted versions are exactly 1.0, 2.0 and 3.0 (numpy itself refuses others, e.g. 1.5);
 *   - the header: keys in any order, either quote, any blanks, trailing commas optional;
 *     unknown/duplicate/missing keys, escapes and non-decimal dims are refused (grammar in npy.c);
 *   - accepted descr: '<f2' '<f4' '<f8' '<u2' '|V2' '<i4' '<i8' '|b1', and '=' in place of '<'
 *     (native order, which on the little-endian hosts we build for is '<'); bytes as '|u1',
 *     '|V1', or '<V1' / '<f1', what np.save writes for ml_dtypes' float8_e4m3fn / float8_e5m2;
 *     fortran_order must be False.
 * The writer emits what numpy.save emits for a C-contiguous little-endian array: version 1.0,
 * keys in sorted order, shape as a Python tuple repr, total header a multiple of 64 bytes.
 *
 * Every function is reentrant; none keeps state between calls.
 */
#ifndef FA_CLI_NPY_H
#define FA_CLI_NPY_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* NPY_U2: 16-bit words, how bf16 travels ('<u2' or '|V2' on disk; written as '<u2'). NPY_I4,
 * NPY_I8: signed integers. NPY_B1: numpy's bool, one byte per element ('|b1'). NPY_U1: bytes,
 * how FP8 codes travel ('|u1', '|V1', '<V1' or '<f1'; written as '|u1'). */
typedef enum { NPY_F16, NPY_F32, NPY_F64, NPY_U2, NPY_I4, NPY_I8, NPY_B1, NPY_U1 } npy_kind;

#define NPY_MAX_DIMS 8

/* Largest header npy_read accepts (the format allows 4 GiB in 2.x/3.x; numpy writes < 1 KiB). */
#define NPY_MAX_HEADER_BYTES ((size_t)1 << 20)

typedef struct {
    npy_kind kind;
    int ndim;                    /* 0 ..= NPY_MAX_DIMS; shape[ndim..] are 0 */
    int64_t shape[NPY_MAX_DIMS]; /* each >= 0; product * itemsize fits in int64 and size_t */
    void *data;                  /* malloc'd, C order, host little-endian; never NULL after a
                                  * successful read, even for zero-size arrays (then 1 byte) */
    size_t nbytes;               /* product(shape) * npy_kind_size(kind); 0-d: one item */
} npy_array;

/* Reads `path`. Returns 0 on success; otherwise NPY_ERR_NO_MEMORY if an allocation failed or -1
 * for anything else, leaves *out zeroed, and writes into err (errlen bytes, always terminated)
 * a message that names the file and the exact problem. Any declared data size above max_bytes
 * is refused before any allocation. err may be NULL or errlen 0 (no message). */
#define NPY_ERR_NO_MEMORY (-2)
int npy_read(const char *path, size_t max_bytes, npy_array *out, char *err, size_t errlen);

/* Allocation-failure injection for the tests: after npy_fault_arm(n) the reader's n-th
 * allocation from then on fails (once; 0 disarms); npy_fault_fired says whether it has. Not
 * thread-safe (the reader's callers are single-threaded). */
void npy_fault_arm(long n);
int npy_fault_fired(void);

/* Writes a C-order little-endian .npy (format 1.0; 2.0 only when the header needs it). Returns
 * 0 on success; otherwise nonzero with a message in err that starts with the path. Invalid
 * arguments create no file; on a write error the partial file is left in place (it can never
 * pass npy_read: its data is short) -- the command writes through npy_write_stream into a
 * temporary file instead (src/cli/outputs.c). */
int npy_write(const char *path, npy_kind kind, int ndim, const int64_t *shape, const void *data,
              char *err, size_t errlen);

/* The same into an open stream, flushed (not closed); `path` names it in messages. */
int npy_write_stream(FILE *f, const char *path, npy_kind kind, int ndim, const int64_t *shape,
                     const void *data, char *err, size_t errlen);

/* "a directory", "a FIFO", "a character device", ... for a stat st_mode. */
const char *npy_file_type(unsigned mode);

/* Frees a->data and zeroes *a; safe on a zeroed array and on NULL. */
void npy_free(npy_array *a);

/* Bytes per item: 2, 4, 8, 2, 4, 8, 1, 1; 0 for a value outside the enum. */
size_t npy_kind_size(npy_kind k);

/* "<f2", "<f4", "<f8", "<u2", "<i4", "<i8", "|b1", "|u1"; NULL for a value outside the enum. */
const char *npy_kind_descr(npy_kind k);

#endif /* FA_CLI_NPY_H */
