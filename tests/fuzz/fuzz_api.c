/*
 * The C API's argument validation on anything: shapes, strides, dtypes, data pointers (NULL,
 * shared, overlapping), every fa_params field, through fa_forward and fa_backward of the three
 * CPU backends on tiny buffers. Each tensor gets a buffer of exactly the bytes its shape and
 * strides reach (computed here in 128-bit arithmetic, independently of the library), so a
 * read or write outside one is the sanitizers' to see. Contract checked: inputs are never
 * written; a refused call leaves every output byte as it was and a message in fa_last_error;
 * any status is one of fa_status.
 *
 * Tensors whose reach exceeds the harness's budget are not run when the harness cannot tell
 * they are invalid (a valid huge problem would need its memory); those whose reach overflows
 * int64 are always run, with a small buffer: the library must refuse them before any access.
 */
#include "config.h"

#include <math.h>
#include <string.h>

#include "flashattn.h"
#include "fuzz.h"

#define NT 9              /* q k v out lse dout dq dk dv */
#define MAX_ELEMS (1 << 14) /* per tensor */
#define MAX_WORK (1 << 20) /* B Hq Sq Sk (Dqk + Dv): the call's arithmetic */

enum { Q, K, V, OUT, LSE, DOUT, DQ, DK, DV };
/* each tensor's part in the op: 0 unused, 1 input, 2 output */
static const int role_fwd[NT] = {1, 1, 1, 2, 2, 0, 0, 0, 0};
static const int role_bwd[NT] = {1, 1, 1, 1, 1, 1, 2, 2, 2};

static fa_context *context(int backend)
{
    static fa_context *ctx[3];
    static const fa_backend bes[3] = {FA_BACKEND_REFERENCE, FA_BACKEND_CONVENTIONAL,
                                      FA_BACKEND_TILED};
    if (!ctx[backend]) {
        fa_options o;
        fa_options_init(&o);
        o.backend = bes[backend];
        o.num_threads = 1;
        if (fa_context_create(&o, &ctx[backend]) != FA_OK)
            fuzz_fail("context: %s", fa_last_error());
    }
    return ctx[backend];
}

/* A dimension: mostly small, sometimes at or past the library's limits. */
static int64_t take_dim(fuzz_bytes *b)
{
    static const int64_t special[8] = {-1, 0, (int64_t)1 << 40, ((int64_t)1 << 40) + 1,
                                       INT64_MAX, INT64_MIN, (int64_t)1 << 32, 65536};
    uint8_t x = (uint8_t)fuzz_take(b, 1);
    return x < 240 ? x % 9 : special[x % 8];
}

static int64_t take_stride(fuzz_bytes *b, int64_t contiguous)
{
    static const int64_t special[6] = {-1, (int64_t)1 << 40, INT64_MAX / 2, INT64_MAX,
                                       (int64_t)1 << 62, 3};
    uint8_t x = (uint8_t)fuzz_take(b, 1);
    if (x < 160)
        return contiguous;
    if (x < 240)
        return x % 40;
    return special[x % 6];
}

static size_t dtype_size(int dt)
{
    switch (dt) {
    case FA_F16:
    case FA_BF16: return 2;
    case FA_F64: return 8;
    default: return 4;
    }
}

/* The bytes t reaches from its data pointer: 0 if a dimension is 0; -1 if the reach does not
 * fit in int64 or a field is out of range, so that the library must refuse it. */
static __int128 reach_bytes(const fa_tensor *t)
{
    const int64_t d[4] = {t->batch, t->seqlen, t->heads, t->headdim};
    const int64_t s[3] = {t->batch_stride, t->seq_stride, t->head_stride};
    for (int i = 0; i < 4; i++)
        if (d[i] < 0)
            return -1;
    for (int i = 0; i < 3; i++)
        if (s[i] < 0)
            return -1;
    for (int i = 0; i < 4; i++)
        if (d[i] == 0)
            return 0;
    __int128 e = (__int128)t->headdim;
    for (int i = 0; i < 3; i++)
        e += (__int128)(d[i] - 1) * s[i];
    return e * (__int128)dtype_size(t->dtype);
}

typedef struct {
    fa_tensor t[NT];
    unsigned char *buf[NT]; /* owned buffers (NULL where the data pointer is borrowed) */
    size_t bytes[NT];       /* of the tensor's reach */
    unsigned char *copy[NT];
} tensors;

static void release(tensors *x)
{
    for (int i = 0; i < NT; i++) {
        free(x->buf[i]);
        free(x->copy[i]);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_bytes in = {data, size};
    const int op = (int)fuzz_take(&in, 1);
    const int backward = op & 1, with_lse = backward || (op & 2);
    int role[NT];
    memcpy(role, backward ? role_bwd : role_fwd, sizeof role);
    if (!with_lse)
        role[LSE] = 0;
    const int backend = (int)(fuzz_take(&in, 1) % 3);
    const int dt_all = (int)(fuzz_take(&in, 1) % 5); /* 4: some invalid value */
    const int64_t B = take_dim(&in), Sq = take_dim(&in), Sk = take_dim(&in);
    const int64_t Hk = take_dim(&in), G = take_dim(&in), Dqk = take_dim(&in), Dv = take_dim(&in);
    const int64_t Hq = Hk > 0 && Hk <= 64 && G > 0 && G < 9 ? Hk * G : Hk; /* GQA groups */

    tensors x;
    memset(&x, 0, sizeof x);
    const int64_t S[NT] = {Sq, Sk, Sk, Sq, Sq, Sq, Sq, Sk, Sk};
    const int64_t H[NT] = {Hq, Hk, Hk, Hq, Hq, Hq, Hq, Hk, Hk};
    const int64_t D[NT] = {Dqk, Dqk, Dv, Dv, 1, Dv, Dqk, Dqk, Dv};
    int must_refuse = 0, too_big = 0;
    for (int i = 0; i < NT; i++) {
        fa_tensor *t = &x.t[i];
        int dt = dt_all == 4 ? 99 : (int)(FA_F32 + dt_all);
        if (i == LSE)
            dt = dt_all == FA_F64 ? FA_F64 : FA_F32;
        const uint8_t how = (uint8_t)fuzz_take(&in, 1);
        if (how >= 250) /* this tensor's own, possibly wrong, dtype */
            dt = how - 250;
        fa_tensor_init(t, NULL, (fa_dtype)dt, B, S[i], H[i], D[i], i == LSE);
        if (how % 7 == 1) /* one field replaced */
            switch (fuzz_take(&in, 1) % 5) {
            case 0: t->batch = take_dim(&in); break;
            case 1: t->seqlen = take_dim(&in); break;
            case 2: t->heads = take_dim(&in); break;
            case 3: t->headdim = take_dim(&in); break;
            default: t->headdim_stride = (int64_t)(fuzz_take(&in, 1) % 3) - 1;
            }
        if (how % 5 == 2) { /* strides of its own */
            t->batch_stride = take_stride(&in, t->batch_stride);
            t->seq_stride = take_stride(&in, t->seq_stride);
            t->head_stride = take_stride(&in, t->head_stride);
        }
        const __int128 r = reach_bytes(t);
        if (r < 0 || r > (__int128)INT64_MAX) {
            must_refuse |= role[i] != 0;
            x.bytes[i] = 64; /* a small buffer: never to be touched */
        } else if (r > (__int128)MAX_ELEMS * 8) {
            too_big |= role[i] != 0;
            x.bytes[i] = 64;
        } else {
            x.bytes[i] = (size_t)r;
        }
    }
    if (too_big && !must_refuse)
        return 0; /* possibly valid and large: not ours to run */

    /* data: own buffers; now and then NULL, or another tensor's (aliasing) */
    for (int i = 0; i < NT; i++) {
        const uint8_t how = (uint8_t)fuzz_take(&in, 1);
        if (how == 255)
            continue; /* NULL data */
        x.buf[i] = malloc(x.bytes[i] ? x.bytes[i] : 1);
        if (!x.buf[i])
            fuzz_fail("out of memory");
        for (size_t j = 0; j < x.bytes[i]; j++) /* values from the input, tame or not */
            x.buf[i][j] = (unsigned char)(j % 7 ? 0x3c - (j & 3) : fuzz_take(&in, 1));
        x.t[i].data = x.buf[i];
        if (how >= 248 && how < 255) { /* share another tensor's buffer, at an offset */
            const int j = how - 248 + (how - 248 >= i);
            const size_t off = (size_t)fuzz_take(&in, 1);
            if (j < NT && x.buf[j] && off <= x.bytes[j] && x.bytes[i] <= x.bytes[j] - off) {
                free(x.buf[i]);
                x.buf[i] = NULL;
                x.t[i].data = x.buf[j] + off;
            }
        }
    }

    fa_params p;
    fa_params_init(&p);
    float slopes[64];
    const uint8_t f = (uint8_t)fuzz_take(&in, 1);
    static const double reals[8] = {0, 1, -1, NAN, INFINITY, 1e-300, 0.5, 30};
    if (f & 1)
        p.scale = reals[fuzz_take(&in, 1) % 8];
    if (f & 2)
        p.causal = (int)fuzz_take(&in, 1) % 3 - 1;
    if (f & 4) {
        p.window_left = (int64_t)(fuzz_take(&in, 1) % 12) - 2;
        p.window_right = (int64_t)(fuzz_take(&in, 1) % 12) - 2;
        if (fuzz_take(&in, 1) == 255)
            p.window_left = INT64_MAX;
    }
    if (f & 8)
        p.align = (fa_align)(fuzz_take(&in, 1) % 3);
    if (f & 16)
        p.softcap = reals[fuzz_take(&in, 1) % 8];
    if (f & 32) {
        p.dropout_p = reals[fuzz_take(&in, 1) % 8];
        p.dropout_seed = fuzz_take(&in, 8);
        p.dropout_offset = fuzz_take(&in, 8);
    }
    if ((f & 64) && Hq > 0 && Hq <= 64) {
        for (int h = 0; h < Hq; h++)
            slopes[h] = h == (int)(fuzz_take(&in, 1) % 64) ? NAN : 0.125f * (float)h;
        p.alibi_slopes = slopes;
    }
    if (f & 128)
        p.score_order = (fa_score_order)(fuzz_take(&in, 1) % 3);
    if (!must_refuse && (double)B * (double)Hq * (double)Sq * (double)Sk *
                                ((double)Dqk + (double)Dv) > (double)MAX_WORK)
        goto done; /* valid shapes would take too long */

    for (int i = 0; i < NT; i++)
        if (x.t[i].data && x.bytes[i] && role[i] == 2) /* outputs: a sentinel */
            memset(x.t[i].data, 0xA5, x.bytes[i]);
    for (int i = 0; i < NT; i++) /* after the sentinels: shared buffers hold what they hold */
        if (x.t[i].data && x.bytes[i] && (x.copy[i] = malloc(x.bytes[i])))
            memcpy(x.copy[i], x.t[i].data, x.bytes[i]);

    const fa_tensor *t = x.t;
    fa_status s = backward ? fa_backward(context(backend), &p, &t[Q], &t[K], &t[V], &t[OUT],
                                         &t[LSE], &t[DOUT], &x.t[DQ], &x.t[DK], &x.t[DV])
                           : fa_forward(context(backend), &p, &t[Q], &t[K], &t[V], &x.t[OUT],
                                        with_lse ? &x.t[LSE] : NULL);
    if (s < FA_OK || s > FA_ERR_DEVICE)
        fuzz_fail("status %d is not a fa_status", (int)s);
    if (must_refuse && s == FA_OK)
        fuzz_fail("accepted a tensor whose reach overflows int64");
    if (s != FA_OK && !fa_last_error()[0])
        fuzz_fail("%s without a message", fa_status_string(s));
    for (int i = 0; i < NT; i++) {
        if (!x.copy[i] || role[i] == 0 || (role[i] == 2 && s == FA_OK))
            continue;
        /* an input shares no byte with a written output once the call succeeded (the
         * aliasing rule), so every input, and every output of a refused call, is unchanged */
        if (memcmp(x.copy[i], x.t[i].data, x.bytes[i]) != 0)
            fuzz_fail("%s call changed tensor %d (%s)", s == FA_OK ? "a successful" : "a refused",
                      i, fa_last_error());
    }
done:
    release(&x);
    return 0;
}
