/*
 * The .npy reader and writer (src/cli/npy.c): round trips of every kind and rank, the header
 * variations the format allows (versions 2.0 and 3.0, key order, quotes, blanks), and every
 * refusal: each failing read must return nonzero, leave the array zeroed (data NULL), and say
 * in its message the path and the specific problem. A fuzz loop mutates a valid file 2000
 * times; run the runner under valgrind or ASan to see that no mutation reads out of bounds.
 *
 * Each test gets a fresh directory from mkdtemp (checked fixture); files are crafted byte by
 * byte so the tests depend on nothing but the format specification.
 */
#include "config.h"

#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* mkdtemp, opendir, clock_gettime */
#endif

#include <check.h>
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/npy.h"

Suite *make_npy_suite(void);

/* ---------------------------------------------------------------------------------------- */
/* Scratch directory and file crafting                                                      */

static char tmpdir[64];

static void tmp_setup(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/check_npy.XXXXXX");
    ck_assert_msg(mkdtemp(tmpdir) != NULL, "mkdtemp failed");
}

/* Removes every file the test made, then the directory (tests make no subdirectories). */
static void tmp_teardown(void)
{
    DIR *d = opendir(tmpdir);
    if (d == NULL)
        return;
    struct dirent *e;
    char p[512];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        snprintf(p, sizeof p, "%s/%s", tmpdir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(tmpdir);
}

/* A path in the scratch directory; four rotating buffers so a test can hold several. */
static const char *tpath(const char *name)
{
    static char buf[4][256];
    static unsigned next;
    char *p = buf[next++ % 4];
    snprintf(p, sizeof buf[0], "%s/%s", tmpdir, name);
    return p;
}

static void put_bytes(const char *path, const void *bytes, size_t n)
{
    FILE *f = fopen(path, "wb");
    ck_assert_msg(f != NULL, "cannot create %s", path);
    ck_assert(n == 0 || fwrite(bytes, 1, n, f) == n);
    ck_assert(fclose(f) == 0);
}

/* Reads a whole (small) file; returns a malloc'd buffer and its length in *n. */
static unsigned char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    size_t cap = 1 << 16, len = 0;
    unsigned char *b = malloc(cap);
    ck_assert(b != NULL);
    len = fread(b, 1, cap, f);
    ck_assert(len < cap);
    fclose(f);
    *n = len;
    return b;
}

/* The preamble of version major.minor for a header of hlen bytes: 10 bytes for major 1
 * (uint16 length), 12 otherwise (uint32 length), little-endian. Returns its length. */
static size_t preamble(unsigned char *p, int major, int minor, uint32_t hlen)
{
    static const unsigned char magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
    memcpy(p, magic, 6);
    p[6] = (unsigned char)major;
    p[7] = (unsigned char)minor;
    size_t lb = major == 1 ? 2 : 4;
    for (size_t i = 0; i < lb; i++)
        p[8 + i] = (unsigned char)(hlen >> (8 * i));
    return 8 + lb;
}

/* Writes preamble + the header bytes exactly as given + ndata data bytes (7*i+3 mod 256). */
static void put_raw(const char *path, int major, int minor, const char *hdr, size_t hlen,
                    size_t ndata)
{
    size_t cap = 16 + hlen + ndata;
    unsigned char *b = malloc(cap);
    ck_assert(b != NULL);
    size_t o = preamble(b, major, minor, (uint32_t)hlen);
    memcpy(b + o, hdr, hlen);
    o += hlen;
    for (size_t i = 0; i < ndata; i++)
        b[o++] = (unsigned char)(7 * i + 3);
    put_bytes(path, b, o);
    free(b);
}

/* Writes `dict` as a header the way numpy pads it (spaces, then '\n', total a multiple of 64),
 * under version major.0, followed by ndata pattern bytes. */
static void put_dict(const char *path, int major, int minor, const char *dict, size_t ndata)
{
    char hdr[1024];
    size_t pre = major == 1 ? 10 : 12, dl = strlen(dict);
    size_t pad = (64 - (pre + dl + 1) % 64) % 64;
    ck_assert(dl + pad + 1 <= sizeof hdr);
    memcpy(hdr, dict, dl);
    memset(hdr + dl, ' ', pad);
    hdr[dl + pad] = '\n';
    put_raw(path, major, minor, hdr, dl + pad + 1, ndata);
}

/* ---------------------------------------------------------------------------------------- */
/* Expectations                                                                             */

static int is_zeroed(const npy_array *a)
{
    npy_array z;
    memset(&z, 0, sizeof z);
    return memcmp(a, &z, sizeof z) == 0;
}

/* A refused read: nonzero, *out zeroed, message terminated, starting with the path, and
 * containing kw (and kw2 when given). */
static void expect_fail_at(const char *path, size_t max_bytes, const char *kw, const char *kw2,
                           int line)
{
    npy_array a;
    char err[512];
    memset(&a, 0xa5, sizeof a);
    memset(err, 'X', sizeof err);
    int rc = npy_read(path, max_bytes, &a, err, sizeof err);
    ck_assert_msg(rc != 0, "line %d: %s was accepted", line, path);
    ck_assert_msg(a.data == NULL && is_zeroed(&a), "line %d: output not zeroed", line);
    ck_assert_msg(memchr(err, '\0', sizeof err) != NULL, "line %d: message not terminated", line);
    size_t pl = strlen(path);
    ck_assert_msg(strncmp(err, path, pl) == 0 && strncmp(err + pl, ": ", 2) == 0,
                  "line %d: message does not start with the path: %s", line, err);
    ck_assert_msg(strstr(err, kw) != NULL, "line %d: '%s' not in: %s", line, kw, err);
    ck_assert_msg(kw2 == NULL || strstr(err, kw2) != NULL, "line %d: '%s' not in: %s", line, kw2,
                  err);
}
#define expect_fail(path, max, kw, kw2) expect_fail_at((path), (max), (kw), (kw2), __LINE__)

/* An accepted read with the given kind and shape whose data are the pattern put_raw writes. */
static void expect_ok_at(const char *path, npy_kind kind, int ndim, const int64_t *shape, int line)
{
    npy_array a;
    char err[512];
    int rc = npy_read(path, (size_t)1 << 20, &a, err, sizeof err);
    ck_assert_msg(rc == 0, "line %d: refused: %s", line, err);
    ck_assert_msg(a.kind == kind, "line %d: kind %d, want %d", line, (int)a.kind, (int)kind);
    ck_assert_int_eq(a.ndim, ndim);
    size_t n = npy_kind_size(kind);
    for (int i = 0; i < ndim; i++) {
        ck_assert_msg(a.shape[i] == shape[i], "line %d: dim %d", line, i);
        n *= (size_t)shape[i];
    }
    for (int i = ndim; i < NPY_MAX_DIMS; i++)
        ck_assert(a.shape[i] == 0);
    ck_assert_uint_eq(a.nbytes, n);
    ck_assert_ptr_nonnull(a.data);
    const unsigned char *d = a.data;
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(d[i] == (unsigned char)(7 * i + 3), "line %d: data byte %zu", line, i);
    npy_free(&a);
    ck_assert(is_zeroed(&a));
}
#define expect_ok(path, kind, ndim, shape) expect_ok_at((path), (kind), (ndim), (shape), __LINE__)

/* ---------------------------------------------------------------------------------------- */
/* Round trips and the writer's exact bytes                                                 */

static const npy_kind kinds[] = {NPY_F16, NPY_F32, NPY_F64, NPY_U2, NPY_I4, NPY_I8};
static const struct {
    int ndim;
    int64_t shape[NPY_MAX_DIMS];
} shapes[] = {
    {0, {0}},          /* 0-d: one item */
    {1, {5}},          /* 1-d, "(5,)" */
    {2, {2, 3}},
    {4, {2, 3, 1, 4}},
    {3, {3, 0, 2}},    /* zero-size */
    {8, {1, 2, 1, 2, 1, 2, 1, 3}},
};
#define NSHAPES ((int)(sizeof shapes / sizeof shapes[0]))

/* _i runs over kinds x shapes. */
START_TEST(round_trip)
{
    npy_kind kind = kinds[_i / NSHAPES];
    int ndim = shapes[_i % NSHAPES].ndim;
    const int64_t *shape = shapes[_i % NSHAPES].shape;
    size_t n = npy_kind_size(kind);
    for (int i = 0; i < ndim; i++)
        n *= (size_t)shape[i];
    unsigned char *src = malloc(n + 1);
    ck_assert(src != NULL);
    for (size_t i = 0; i < n; i++)
        src[i] = (unsigned char)(31 * i + (size_t)_i);
    char err[512];
    const char *p = tpath("rt.npy");
    ck_assert_msg(npy_write(p, kind, ndim, shape, src, err, sizeof err) == 0, "%s", err);

    npy_array a;
    ck_assert_msg(npy_read(p, n, &a, err, sizeof err) == 0, "%s", err); /* limit == size: ok */
    ck_assert(a.kind == kind);
    ck_assert_int_eq(a.ndim, ndim);
    for (int i = 0; i < NPY_MAX_DIMS; i++)
        ck_assert(a.shape[i] == (i < ndim ? shape[i] : 0));
    ck_assert_uint_eq(a.nbytes, n);
    ck_assert_ptr_nonnull(a.data);
    ck_assert(n == 0 || memcmp(a.data, src, n) == 0);
    npy_free(&a);

    /* The whole header is a multiple of 64 bytes, so the data is aligned. */
    size_t len;
    unsigned char *b = slurp(p, &len);
    ck_assert_uint_eq((len - n) % 64, 0);
    free(b);
    if (n > 0) /* one byte under the size limit is refused */
        expect_fail(p, n - 1, "exceeds the limit", NULL);
    free(src);
}
END_TEST

/* The header exactly as numpy.save writes it. */
static void check_header_bytes(npy_kind kind, int ndim, const int64_t *shape, const char *dict)
{
    char err[512];
    const char *p = tpath("hdr.npy");
    const double zeros[64] = {0};
    ck_assert_msg(npy_write(p, kind, ndim, shape, zeros, err, sizeof err) == 0, "%s", err);
    size_t len;
    unsigned char *b = slurp(p, &len);
    ck_assert(len > 10 && memcmp(b, "\x93NUMPY\x01\x00", 8) == 0);
    size_t hlen = (size_t)b[8] | (size_t)b[9] << 8;
    ck_assert_uint_eq((10 + hlen) % 64, 0);
    ck_assert(10 + hlen <= len);
    size_t dl = strlen(dict);
    ck_assert_msg(hlen > dl && memcmp(b + 10, dict, dl) == 0, "header is %.*s", (int)hlen,
                  (const char *)b + 10);
    for (size_t i = 10 + dl; i < 10 + hlen - 1; i++)
        ck_assert(b[i] == ' ');
    ck_assert(b[10 + hlen - 1] == '\n');
    free(b);
}

START_TEST(writer_header_like_numpy)
{
    const int64_t s23[] = {2, 3}, s5[] = {5}, s4d[] = {1, 2, 3, 4};
    check_header_bytes(NPY_F32, 2, s23,
                       "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }");
    check_header_bytes(NPY_F16, 1, s5, "{'descr': '<f2', 'fortran_order': False, 'shape': (5,), }");
    check_header_bytes(NPY_U2, 0, NULL, "{'descr': '<u2', 'fortran_order': False, 'shape': (), }");
    check_header_bytes(NPY_F64, 4, s4d,
                       "{'descr': '<f8', 'fortran_order': False, 'shape': (1, 2, 3, 4), }");
}
END_TEST

START_TEST(kind_table)
{
    ck_assert_uint_eq(npy_kind_size(NPY_F16), 2);
    ck_assert_uint_eq(npy_kind_size(NPY_F32), 4);
    ck_assert_uint_eq(npy_kind_size(NPY_F64), 8);
    ck_assert_uint_eq(npy_kind_size(NPY_U2), 2);
    ck_assert_uint_eq(npy_kind_size(NPY_I4), 4);
    ck_assert_uint_eq(npy_kind_size(NPY_I8), 8);
    ck_assert_str_eq(npy_kind_descr(NPY_F16), "<f2");
    ck_assert_str_eq(npy_kind_descr(NPY_F32), "<f4");
    ck_assert_str_eq(npy_kind_descr(NPY_F64), "<f8");
    ck_assert_str_eq(npy_kind_descr(NPY_U2), "<u2");
    ck_assert_str_eq(npy_kind_descr(NPY_I4), "<i4");
    ck_assert_str_eq(npy_kind_descr(NPY_I8), "<i8");
    ck_assert_uint_eq(npy_kind_size((npy_kind)17), 0);
    ck_assert_ptr_null(npy_kind_descr((npy_kind)17));
}
END_TEST

/* Known float values survive, not just bytes: 1.5f is 0x3fc00000 little-endian on disk. */
START_TEST(values_and_disk_order)
{
    const float v[3] = {1.5f, -2.0f, 0x1p-126f};
    const int64_t s[] = {3};
    char err[512];
    const char *p = tpath("v.npy");
    ck_assert_msg(npy_write(p, NPY_F32, 1, s, v, err, sizeof err) == 0, "%s", err);
    size_t len;
    unsigned char *b = slurp(p, &len);
    size_t off = 10 + ((size_t)b[8] | (size_t)b[9] << 8);
    ck_assert_uint_eq(len, off + 12);
    ck_assert(b[off] == 0x00 && b[off + 1] == 0x00 && b[off + 2] == 0xc0 && b[off + 3] == 0x3f);
    free(b);
    npy_array a;
    ck_assert_msg(npy_read(p, 1024, &a, err, sizeof err) == 0, "%s", err);
    const float *r = a.data;
    ck_assert(r[0] == 1.5f && r[1] == -2.0f && r[2] == 0x1p-126f);
    npy_free(&a);
}
END_TEST

/* ---------------------------------------------------------------------------------------- */
/* Accepted header variations                                                               */

static const struct good_header {
    const char *name;
    int major;
    const char *dict;
    npy_kind kind;
    int ndim;
    int64_t shape[4];
} good_headers[] = {
    {"v2.0", 2, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", NPY_F32, 2, {2, 3}},
    {"v3.0", 3, "{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }", NPY_F64, 1, {3}},
    {"reordered, double quotes", 1,
     "{\"shape\": (2, 3), \"fortran_order\": False, \"descr\": \"<f4\"}", NPY_F32, 2, {2, 3}},
    {"mixed quotes", 1, "{'fortran_order': False, \"descr\": '<f2', 'shape': (4,)}", NPY_F16, 1,
     {4}},
    {"no spaces, no trailing comma", 1, "{'descr':'<f8','fortran_order':False,'shape':(1,2)}",
     NPY_F64, 2, {1, 2}},
    {"blanks everywhere", 1,
     "  { 'shape' :\t( 2 , 3 , ) ,\n 'descr' : '<f2' , 'fortran_order' : False ,  }",
     NPY_F16, 2, {2, 3}},
    {"0-d", 1, "{'descr': '<u2', 'fortran_order': False, 'shape': (), }", NPY_U2, 0, {0}},
    {"|V2 is bf16 as raw words", 1, "{'descr': '|V2', 'fortran_order': False, 'shape': (3,), }",
     NPY_U2, 1, {3}},
    {"= is native order", 1, "{'descr': '=f4', 'fortran_order': False, 'shape': (2,), }", NPY_F32,
     1, {2}},
    {"=u2", 3, "{'descr': '=u2', 'fortran_order': False, 'shape': (2,), }", NPY_U2, 1, {2}},
    {"Python 2 longs in 1.0", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 3L), }",
     NPY_F32, 2, {2, 3}},
    {"+ sign and -0", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (+2, 1, -0, 3), }",
     NPY_F32, 4, {2, 1, 0, 3}},
    {"zero-size", 2, "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 1000000000000), }",
     NPY_F32, 2, {0, 1000000000000}},
};
#define NGOOD ((int)(sizeof good_headers / sizeof good_headers[0]))

START_TEST(good_header)
{
    const struct good_header *g = &good_headers[_i];
    const char *p = tpath("good.npy");
    size_t n = npy_kind_size(g->kind);
    for (int i = 0; i < g->ndim; i++)
        n *= (size_t)g->shape[i];
    put_dict(p, g->major, 0, g->dict, n);
    expect_ok(p, g->kind, g->ndim, g->shape);
}
END_TEST

/* numpy pads to 64, but the format only requires the '\n': a minimal header is fine too. */
START_TEST(unpadded_header)
{
    const char *h = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }\n";
    const int64_t s[] = {2};
    put_raw(tpath("u.npy"), 1, 0, h, strlen(h), 8);
    expect_ok(tpath("u.npy"), NPY_F32, 1, s);
}
END_TEST

/* ---------------------------------------------------------------------------------------- */
/* Refused headers (each with 8 data bytes: right for a (2,) f4 array)                      */

#define F4_2 "'descr': '<f4', 'fortran_order': False, 'shape': (2,)"
#define DICT(descr, shape) "{'descr': " descr ", 'fortran_order': False, 'shape': " shape "}"
static const struct bad_header {
    int major, minor;
    const char *dict;
    const char *kw, *kw2;
} bad_headers[] = {
    /* dict syntax */
    {1, 0, F4_2 ", }", "syntax", "'{'"},                                        /* no '{' */
    {1, 0, "{" F4_2 ", ", "syntax", "end of header"},                           /* no '}' */
    {1, 0, "{'descr' '<f4', 'fortran_order': False, 'shape': (2,)}", "syntax",
     "':' after key 'descr'"},
    {1, 0, "{descr: '<f4', 'fortran_order': False, 'shape': (2,)}", "syntax", "quoted key"},
    {1, 0, "{'descr': '<f4' 'fortran_order': False, 'shape': (2,)}", "syntax", "',' or '}'"},
    {1, 0, "{," F4_2 "}", "syntax", "quoted key"},
    {1, 0, "{" F4_2 ",,}", "syntax", "quoted key"},
    {1, 0, "{" F4_2 "} x", "syntax", "padding"},
    {1, 0, "{" F4_2 "}}", "syntax", "padding"},
    {1, 0, "{'descr': '<f4, 'fortran_order': False, 'shape': (2,)}", "syntax", NULL},
    {1, 0, "{'descr': '<f4", "unterminated string", NULL},
    {1, 0, DICT("'<f\\x34'", "(2,)"), "backslash", NULL},
    {1, 0, "{" F4_2 "} # comment", "unexpected character", "'#'"},
    {1, 0, DICT("'<f4'", "(2,), \x80"), "unexpected character", "\\x80"},
    {1, 0, "[" F4_2 "]", "syntax", "'{'"},
    /* keys */
    {1, 0, "{" F4_2 ", 'extra': 1}", "unknown header key", "'extra'"},
    {1, 0, "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}",
     "duplicate header key", "'descr'"},
    {1, 0, "{'shape': (2,), 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}",
     "duplicate header key", "'shape'"},
    {1, 0, "{'descr': '<f4', 'fortran_order': False}", "missing header key", "'shape'"},
    {1, 0, "{'fortran_order': False, 'shape': (2,)}", "missing header key", "'descr'"},
    {1, 0, "{'descr': '<f4', 'shape': (2,)}", "missing header key", "'fortran_order'"},
    {1, 0, "{}", "missing header key", NULL},
    /* value types */
    {1, 0, "{'descr': 4, 'fortran_order': False, 'shape': (2,)}", "syntax", "'descr'"},
    {1, 0, "{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}", "True or False", NULL},
    {1, 0, "{'descr': '<f4', 'fortran_order': false, 'shape': (2,)}", "True or False", NULL},
    {1, 0, DICT("'<f4'", "[2]"), "syntax", "tuple"},
    {1, 0, DICT("'<f4'", "2"), "syntax", "tuple"},
    {1, 0, DICT("'<f4'", "(2)"), "not a tuple", "(2,)"},
    {1, 0, DICT("'<f4'", "(2,"), "syntax", "')'"},
    {1, 0, DICT("'<f4'", "(2 3)"), "syntax", "',' or ')'"},
    {1, 0, DICT("'<f4'", "(,)"), "syntax", NULL},
    /* dims */
    {1, 0, DICT("'<f4'", "(2, -3)"), "negative dimension", "-3"},
    {1, 0, DICT("'<f4'", "(-1,)"), "negative dimension", NULL},
    {1, 0, DICT("'<f4'", "(2.5,)"), "not a non-negative integer", "2.5"},
    {1, 0, DICT("'<f4'", "('2',)"), "not a non-negative integer", NULL},
    {1, 0, DICT("'<f4'", "(None,)"), "not a non-negative integer", "None"},
    {1, 0, DICT("'<f4'", "(1e3,)"), "not a non-negative integer", NULL},
    {1, 0, DICT("'<f4'", "(02,)"), "not a non-negative integer", NULL},
    /* Python 2 longs ("2L") are accepted in 1.x/2.x only, like numpy */
    {3, 0, DICT("'<f4'", "(2L,)"), "not a non-negative integer", "2L"},
    {1, 0, DICT("'<f4'", "(1,1,1,1,1,1,1,1,2)"), "too many dimensions", NULL},
    {1, 0, DICT("'<f4'", "(99999999999999999999,)"), "overflow", NULL},
    {1, 0, DICT("'<f4'", "(9223372036854775808,)"), "overflow", NULL},
    {1, 0, DICT("'<f4'", "(4294967296, 4294967296)"), "overflow", NULL},
    /* 2^61 items fit in int64, their 2^63 bytes do not */
    {1, 0, DICT("'<f4'", "(2305843009213693952,)"), "overflow", NULL},
    /* empty, but the non-zero dims overflow: numpy refuses it too */
    {1, 0, DICT("'<f4'", "(0, 4294967296, 4294967296)"), "overflow", NULL},
    /* descr */
    {1, 0, DICT("'>f4'", "(2,)"), "'>f4'", "big-endian"},
    {1, 0, DICT("'>u2'", "(4,)"), "'>u2'", "big-endian"},
    {1, 0, DICT("'<i2'", "(2,)"), "unsupported descr '<i2'", "supported: '<f2'"},
    {1, 0, DICT("'<c8'", "(1,)"), "unsupported descr '<c8'", NULL},
    {1, 0, DICT("'|O'", "(1,)"), "unsupported descr '|O'", NULL},
    {1, 0, DICT("'|u2'", "(4,)"), "unsupported descr '|u2'", NULL},
    {1, 0, DICT("'<f4 '", "(2,)"), "unsupported descr '<f4 '", NULL},
    {1, 0, DICT("''", "(2,)"), "unsupported descr ''", NULL},
    {1, 0, DICT("[('a', '<f4')]", "(2,)"), "structured", "[('a', '<f4')]"},
    {1, 0, DICT("[('a', '<f4', (2,)), ('b', '|u1')]", "(1,)"), "structured", "supported:"},
    {1, 0, "{'descr': [('a', '<f4'), 'fortran_order': False, 'shape': (2,)}", "unbalanced", NULL},
    /* 3.0 headers are UTF-8; non-ASCII bytes show escaped in the message */
    {3, 0, DICT("'<f4\xc3\xa9'", "(2,)"), "unsupported descr", "'<f4\\xc3\\xa9'"},
    /* order */
    {1, 0, "{'descr': '<f4', 'fortran_order': True, 'shape': (2,)}",
     "Fortran-order arrays are not supported: save with np.ascontiguousarray", NULL},
};
#define NBAD ((int)(sizeof bad_headers / sizeof bad_headers[0]))

START_TEST(bad_header)
{
    const struct bad_header *b = &bad_headers[_i];
    const char *p = tpath("bad.npy");
    put_dict(p, b->major, b->minor, b->dict, 8);
    expect_fail(p, (size_t)1 << 20, b->kw, b->kw2);
}
END_TEST

/* ---------------------------------------------------------------------------------------- */
/* Refused files                                                                            */

START_TEST(missing_file)
{
    expect_fail(tpath("nope.npy"), 1024, "cannot open", "No such file");
}
END_TEST

START_TEST(not_a_regular_file)
{
    expect_fail(tmpdir, 1024, "not a regular file", NULL);
}
END_TEST

START_TEST(empty_file)
{
    put_bytes(tpath("e.npy"), "", 0);
    expect_fail(tpath("e.npy"), 1024, "empty file", NULL);
}
END_TEST

START_TEST(bad_magic)
{
    put_bytes(tpath("zip.npy"), "PK\x03\x04\x14\x00\x00\x00\x08\x00", 10); /* an .npz */
    expect_fail(tpath("zip.npy"), 1024, "bad magic", "PK");
    put_bytes(tpath("x.npy"), "\x93NUMPX\x01\x00\x10\x00", 10);
    expect_fail(tpath("x.npy"), 1024, "bad magic", NULL);
    put_bytes(tpath("one.npy"), "{", 1);
    expect_fail(tpath("one.npy"), 1024, "bad magic", NULL);
    /* A prefix of the magic is a truncated file, not a foreign one. */
    put_bytes(tpath("pre.npy"), "\x93NUM", 4);
    expect_fail(tpath("pre.npy"), 1024, "truncated preamble", NULL);
}
END_TEST

/* Exactly 1.0, 2.0, 3.0: numpy refuses other minors too, and so do we. */
START_TEST(unsupported_version)
{
    const char *d = "{" F4_2 "}";
    put_dict(tpath("v40.npy"), 4, 0, d, 8);
    expect_fail(tpath("v40.npy"), 1024, "unsupported format version 4.0", "1.0, 2.0, 3.0");
    put_dict(tpath("v15.npy"), 1, 5, d, 8);
    expect_fail(tpath("v15.npy"), 1024, "unsupported format version 1.5", NULL);
    put_dict(tpath("v00.npy"), 0, 0, d, 8);
    expect_fail(tpath("v00.npy"), 1024, "version 0.0", NULL);
    put_dict(tpath("v255.npy"), 255, 255, d, 8);
    expect_fail(tpath("v255.npy"), 1024, "version 255.255", NULL);
}
END_TEST

START_TEST(truncated_preamble)
{
    put_bytes(tpath("a.npy"), "\x93NUMPY\x01", 7);
    expect_fail(tpath("a.npy"), 1024, "truncated preamble", NULL);
    put_bytes(tpath("b.npy"), "\x93NUMPY\x01\x00\x40", 9); /* half the uint16 */
    expect_fail(tpath("b.npy"), 1024, "truncated preamble", NULL);
    put_bytes(tpath("c.npy"), "\x93NUMPY\x02\x00\x40\x00\x00", 11); /* 3/4 of the uint32 */
    expect_fail(tpath("c.npy"), 1024, "truncated preamble", NULL);
}
END_TEST

START_TEST(header_length)
{
    /* Declared 118 header bytes, 20 present. */
    unsigned char b[40];
    size_t o = preamble(b, 1, 0, 118);
    memset(b + o, ' ', 20);
    put_bytes(tpath("past.npy"), b, o + 20);
    expect_fail(tpath("past.npy"), 1024, "header length 118 runs past end of file", NULL);
    /* 2.0 with a 4 GiB - 1 header: refused on the 1 MiB limit, before any allocation. */
    o = preamble(b, 2, 0, 0xffffffffu);
    memset(b + o, ' ', 20);
    put_bytes(tpath("huge.npy"), b, o + 20);
    expect_fail(tpath("huge.npy"), 1024, "header length 4294967295 exceeds the 1 MiB limit", NULL);
    /* Zero header bytes. */
    o = preamble(b, 1, 0, 0);
    put_bytes(tpath("zero.npy"), b, o);
    expect_fail(tpath("zero.npy"), 1024, "not terminated", NULL);
}
END_TEST

START_TEST(header_not_terminated)
{
    char h[64];
    const char *d = "{" F4_2 "}";
    memset(h, ' ', sizeof h);
    memcpy(h, d, strlen(d)); /* padded with spaces, but no '\n' at the end */
    put_raw(tpath("nt.npy"), 1, 0, h, strlen(d) + 5, 8);
    expect_fail(tpath("nt.npy"), 1024, "header not terminated by '\\n'", NULL);
    /* A NUL inside the header is just a bad byte, never a terminator. */
    memcpy(h + strlen(d), "\0\n", 2);
    put_raw(tpath("nul.npy"), 1, 0, h, strlen(d) + 2, 8);
    expect_fail(tpath("nul.npy"), 1024, "unexpected character", "\\x00");
}
END_TEST

/* The hostile shape of the brief: 2^60 items of 4 bytes, declared in a 128-byte file. It must
 * be refused at once, by arithmetic, with the limit named. */
START_TEST(declared_size_above_limit)
{
    const char *p = tpath("big.npy");
    put_dict(p, 1, 0, DICT("'<f4'", "(1099511627776, 1048576), "), 0);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    expect_fail(p, (size_t)1 << 30, "declared data size 4611686018427387904 bytes",
                "exceeds the limit of 1073741824 bytes");
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double dt = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    ck_assert_msg(dt < 0.5, "refusal took %g s", dt);
    /* With no limit at all the file size still refuses it before any allocation. */
    expect_fail(p, SIZE_MAX,
                "truncated data: header declares 4611686018427387904 bytes, file has 0", NULL);
}
END_TEST

START_TEST(truncated_and_trailing_data)
{
    const char *d = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
    put_dict(tpath("short.npy"), 1, 0, d, 20);
    expect_fail(tpath("short.npy"), 1024, "truncated data: header declares 24 bytes, file has 20",
                NULL);
    put_dict(tpath("none.npy"), 1, 0, d, 0);
    expect_fail(tpath("none.npy"), 1024, "truncated data", "file has 0");
    put_dict(tpath("long.npy"), 1, 0, d, 28);
    expect_fail(tpath("long.npy"), 1024, "trailing bytes", "4 extra");
    const int64_t s[] = {2, 3};
    put_dict(tpath("exact.npy"), 1, 0, d, 24);
    expect_ok(tpath("exact.npy"), NPY_F32, 2, s);
}
END_TEST

/* Arguments: no output, no message buffer, a message buffer too small for the message. */
START_TEST(read_arguments)
{
    const char *p = tpath("args.npy");
    put_dict(p, 1, 0, "{'descr': '<f4', 'fortran_order': True, 'shape': (2,)}", 8);
    char err[512];
    ck_assert(npy_read(p, 1024, NULL, err, sizeof err) != 0);
    ck_assert(strstr(err, "no output") != NULL);
    npy_array a;
    ck_assert(npy_read(p, 1024, &a, NULL, 0) != 0);
    ck_assert(is_zeroed(&a));
    ck_assert(npy_read(p, 1024, &a, err, 0) != 0);
    memset(err, 'X', sizeof err);
    ck_assert(npy_read(p, 1024, &a, err, 12) != 0);
    ck_assert_uint_eq(strlen(err), 11);
    ck_assert(strncmp(err, p, 11) == 0);
    ck_assert(err[12] == 'X'); /* nothing written past errlen */
    ck_assert(npy_read(NULL, 1024, &a, err, sizeof err) != 0);
    npy_free(NULL);
    npy_free(&a);
}
END_TEST

START_TEST(write_errors)
{
    char err[512];
    const float x[4] = {0};
    const int64_t s[] = {2, 2}, neg[] = {2, -1}, ovf[] = {INT64_MAX, 3};
    const char *p = tpath("nodir/x.npy");
    ck_assert(npy_write(p, NPY_F32, 2, s, x, err, sizeof err) != 0);
    ck_assert_msg(strncmp(err, p, strlen(p)) == 0 && strstr(err, "cannot open for writing"), "%s",
                  err);
    p = tpath("w.npy");
    ck_assert(npy_write(p, NPY_F32, -1, s, x, err, sizeof err) != 0);
    ck_assert_msg(strstr(err, "invalid ndim") != NULL, "%s", err);
    ck_assert(npy_write(p, NPY_F32, NPY_MAX_DIMS + 1, s, x, err, sizeof err) != 0);
    ck_assert(npy_write(p, NPY_F32, 2, NULL, x, err, sizeof err) != 0);
    ck_assert(npy_write(p, NPY_F32, 2, neg, x, err, sizeof err) != 0);
    ck_assert_msg(strstr(err, "negative dimension -1") != NULL, "%s", err);
    ck_assert(npy_write(p, NPY_F32, 2, ovf, x, err, sizeof err) != 0);
    ck_assert_msg(strstr(err, "overflow") != NULL, "%s", err);
    ck_assert(npy_write(p, NPY_F32, 2, s, NULL, err, sizeof err) != 0);
    ck_assert_msg(strstr(err, "no data") != NULL, "%s", err);
    ck_assert(npy_write(p, (npy_kind)9, 2, s, x, err, sizeof err) != 0);
    ck_assert_msg(strstr(err, "invalid kind") != NULL, "%s", err);
    ck_assert(npy_write(NULL, NPY_F32, 2, s, x, err, sizeof err) != 0);
    /* Zero-size needs no data pointer. */
    const int64_t z[] = {0, 3};
    ck_assert_msg(npy_write(p, NPY_F32, 2, z, NULL, err, sizeof err) == 0, "%s", err);
    /* A full disk shows at the flush in fclose. */
    FILE *probe = fopen("/dev/full", "wb");
    if (probe != NULL) {
        fclose(probe);
        static float big[1 << 14];
        const int64_t sb[] = {1 << 14};
        ck_assert(npy_write("/dev/full", NPY_F32, 1, sb, big, err, sizeof err) != 0);
        ck_assert_msg(strstr(err, "/dev/full: write failed") != NULL, "%s", err);
    }
}
END_TEST

/* ---------------------------------------------------------------------------------------- */
/* Fuzz                                                                                     */

static uint64_t fuzz_state;

static uint64_t fuzz_next(void) /* splitmix64 */
{
    uint64_t z = (fuzz_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* 2000 mutants of a valid 1.0 file and of a valid 2.0 file: bit flips, bytes the grammar
 * cares about, overwritten length fields, truncation, appended junk. Every read either fails
 * with a well-formed message or returns an array consistent with itself and the limit. Under
 * valgrind/ASan this is the out-of-bounds check. */
START_TEST(fuzz)
{
    static const char alphabet[] = "{}()[]:,'\" \t\n0123456789-+.LTFNe<>|=fuV\\\x00\x93\xff";
    const char *p = tpath("fuzz.npy");
    const int64_t s[] = {2, 3};
    const float x[6] = {1, 2, 3, 4, 5, 6};
    char err[256];
    unsigned char base[2][256], buf[512];
    size_t blen[2];

    ck_assert(npy_write(p, NPY_F32, 2, s, x, err, sizeof err) == 0);
    unsigned char *b = slurp(p, &blen[0]);
    ck_assert(blen[0] <= sizeof base[0]);
    memcpy(base[0], b, blen[0]);
    free(b);
    put_dict(p, 2, 0, "{\"shape\": (2, 3,), 'descr': '=f4', 'fortran_order': False}", 24);
    b = slurp(p, &blen[1]);
    ck_assert(blen[1] <= sizeof base[1]);
    memcpy(base[1], b, blen[1]);
    free(b);

    fuzz_state = 20261129;
    int accepted = 0;
    for (int it = 0; it < 2000; it++) {
        int which = it & 1;
        size_t len = blen[which];
        memcpy(buf, base[which], len);
        int nmut = 1 + (int)(fuzz_next() % 4);
        for (int m = 0; m < nmut; m++) {
            uint64_t r = fuzz_next();
            /* Mostly in the preamble and header (the first 128 bytes), where parsing happens. */
            size_t pos = (r >> 8) % 4 ? (size_t)((r >> 16) % 128) : (size_t)((r >> 16) % len);
            if (pos >= len)
                pos = len - 1;
            switch (r % 6) {
            case 0: buf[pos] ^= (unsigned char)(1u << ((r >> 40) % 8)); break;
            case 1: buf[pos] = (unsigned char)alphabet[(r >> 40) % (sizeof alphabet - 1)]; break;
            case 2: buf[8 + (r >> 40) % 4] = (unsigned char)(r >> 48); break; /* length field */
            case 3: len = (size_t)((r >> 40) % (len + 1)); break;             /* truncate */
            case 4:                                                            /* append junk */
                for (size_t k = (r >> 40) % 9; k > 0 && len < sizeof buf; k--)
                    buf[len++] = (unsigned char)fuzz_next();
                break;
            default: buf[pos] = (unsigned char)(r >> 40); break;
            }
            if (len == 0)
                break;
        }
        put_bytes(p, buf, len);
        npy_array a;
        memset(err, 'X', sizeof err);
        int rc = npy_read(p, 4096, &a, err, sizeof err);
        ck_assert(memchr(err, '\0', sizeof err) != NULL);
        if (rc != 0) {
            ck_assert(is_zeroed(&a));
            ck_assert_msg(strncmp(err, p, strlen(p)) == 0, "iteration %d: %s", it, err);
            continue;
        }
        accepted++;
        ck_assert(a.ndim >= 0 && a.ndim <= NPY_MAX_DIMS);
        size_t n = npy_kind_size(a.kind);
        ck_assert(n > 0);
        for (int i = 0; i < a.ndim; i++) {
            ck_assert(a.shape[i] >= 0);
            n *= (size_t)a.shape[i];
        }
        ck_assert_uint_eq(a.nbytes, n);
        ck_assert(a.nbytes <= 4096 && a.data != NULL);
        npy_free(&a);
    }
    /* Some mutants stay valid (a flip in the data, a changed padding byte): the loop ran. */
    ck_assert_int_gt(accepted, 0);
}
END_TEST

Suite *make_npy_suite(void)
{
    Suite *s = suite_create("npy");
    TCase *tc = tcase_create("npy");
    tcase_add_checked_fixture(tc, tmp_setup, tmp_teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, round_trip, 0, (int)(sizeof kinds / sizeof kinds[0]) * NSHAPES);
    tcase_add_test(tc, writer_header_like_numpy);
    tcase_add_test(tc, kind_table);
    tcase_add_test(tc, values_and_disk_order);
    tcase_add_loop_test(tc, good_header, 0, NGOOD);
    tcase_add_test(tc, unpadded_header);
    tcase_add_loop_test(tc, bad_header, 0, NBAD);
    tcase_add_test(tc, missing_file);
    tcase_add_test(tc, not_a_regular_file);
    tcase_add_test(tc, empty_file);
    tcase_add_test(tc, bad_magic);
    tcase_add_test(tc, unsupported_version);
    tcase_add_test(tc, truncated_preamble);
    tcase_add_test(tc, header_length);
    tcase_add_test(tc, header_not_terminated);
    tcase_add_test(tc, declared_size_above_limit);
    tcase_add_test(tc, truncated_and_trailing_data);
    tcase_add_test(tc, read_arguments);
    tcase_add_test(tc, write_errors);
    tcase_add_test(tc, fuzz);
    suite_add_tcase(s, tc);
    return s;
}
