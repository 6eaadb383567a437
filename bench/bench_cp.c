/*
 * Context parallelism over MPI against one process: `mpirun -np W bench/bench_cp [options]`.
 * Every rank runs one thread; the yardstick is one process (rank 0) running fa_forward /
 * fa_backward on the whole sequence with W threads, in the same run, rounds alternating their
 * order. For the ring it also reports how much of its K/V messages the compute hid: 1 - (time
 * the ranks waited on them after their blocks, fa_context_describe's "waited") / (the same
 * messages sent alone, W - 1 steps of MPI_Sendrecv of the largest shard's K/V, measured here),
 * and, for the backward, the time waited on other ranks' dK/dV terms ("synced": their compute,
 * then the message). CSV columns: op, W, layout, causal, N, H, D, one process s, ring s,
 * allgather s, ring K/V wait s, K/V messages alone s, ring terms wait s.
 *
 *   --seqlen N (16384)  --heads H (8)  --dim D (128)  --layout zigzag|contiguous
 *   --no-causal  --backward  --rounds R (3)  --csv FILE
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn_mpi.h"
#include "bench_util.h"

static int W, R;
static double flop_n; /* the N the model's flop count is for */

static fa_context *context(const char *schedule, int threads)
{
    setenv("FA_CP_SCHEDULE", schedule, 1);
    fa_options o;
    fa_options_init(&o);
    o.backend = FA_BACKEND_TILED;
    o.num_threads = threads;
    fa_context *ctx;
    if (fa_context_create(&o, &ctx) != FA_OK) {
        fprintf(stderr, "bench_cp: %s\n", fa_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    unsetenv("FA_CP_SCHEDULE");
    return ctx;
}

static void must(fa_status st, const char *what)
{
    if (st != FA_OK) {
        fprintf(stderr, "bench_cp: rank %d: %s: %s\n", R, what, fa_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
}

static float *tensor(fa_tensor *t, int64_t S, int64_t H, int64_t D, uint64_t seed)
{
    float *x = malloc((size_t)(S * H * D) * sizeof *x + 4);
    for (int64_t i = 0; i < S * H * D; i++)
        x[i] = (float)normal_draw(&seed);
    fa_tensor_init(t, x, FA_F32, 1, S, H, D, 0);
    return x;
}

/* The rows of shard s of a global tensor in a new local tensor. */
static float *shard(fa_tensor *l, const fa_tensor *g, const fa_cp_shard *s)
{
    const size_t row = (size_t)(g->heads * g->headdim);
    float *x = malloc((size_t)s->local * row * sizeof *x + 4);
    int64_t at = 0;
    for (int p = 0; p < s->parts; p++) {
        memcpy(x + (size_t)at * row, (float *)g->data + (size_t)s->first[p] * row,
               (size_t)s->count[p] * row * sizeof *x);
        at += s->count[p];
    }
    fa_tensor_init(l, x, FA_F32, 1, s->local, g->heads, g->headdim, 0);
    return x;
}

/* A figure of the context's last call in its description: "waited=" (seconds blocked on K/V
 * messages) or "synced=" (on other ranks' dK/dV terms). */
static double described(const fa_context *ctx, const char *key)
{
    char buf[1024];
    fa_context_describe(ctx, buf, sizeof buf);
    const char *w = strstr(buf, key);
    return w ? atof(w + strlen(key)) : -1;
}

static double slowest(double t)
{
    double m;
    MPI_Allreduce(&t, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return m;
}

/* The ring's messages alone: W - 1 steps of `bytes` to the next rank (buffers touched first;
 * the best of 3). */
static double messages_alone(size_t bytes)
{
    char *a = malloc(bytes + 1), *b = malloc(bytes + 1);
    memset(a, 1, bytes + 1);
    memset(b, 2, bytes + 1);
    double best = 1e30;
    for (int round = 0; round < 3; round++) {
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = now();
        for (int s = 0; s < W - 1; s++)
            MPI_Sendrecv(a, (int)bytes, MPI_BYTE, (R + 1) % W, 9, b, (int)bytes, MPI_BYTE,
                         (R + W - 1) % W, 9, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        const double t = slowest(now() - t0);
        best = t < best ? t : best;
    }
    free(a);
    free(b);
    return best;
}

/*
 * The alpha-beta model of the two schedules (docs/notes/context-parallel.md states it): per rank
 * F / W flops at rate `rate` (this run's ring, per rank: its overheads included), in W ring
 * steps of F / W^2 each against one shard's K/V message of alpha + bytes / beta (the
 * backward's terms as many bytes again); a ring step takes the longer of the two, the first
 * step has no message to hide behind. The allgather sends (W - 1) shards before it computes.
 * Efficiency: the compute alone over the time taken.
 */
static void model(double flop, double rate, double bytes_per_row, int backward, double alpha,
                  double beta, const char *link)
{
    static const int ws[] = {8, 64, 256, 1024};
    static const double ns[] = {131072, 1048576};
    printf("  model, %s (alpha %.2g s, beta %.3g GB/s), efficiency ring / allgather:\n", link,
           alpha, beta * 1e-9);
    for (int a = 0; a < 2; a++) {
        printf("    N=%-8.0f", ns[a]);
        for (int b = 0; b < 4; b++) {
            const double w = ws[b], f = flop * (ns[a] / flop_n) * (ns[a] / flop_n);
            const double tc = f / (w * w) / rate;
            const double tm = (backward ? 2 : 1) * (alpha + ns[a] / w * bytes_per_row / beta);
            const double ring = w * tc / (tc + (w - 1) * (tc > tm ? tc : tm));
            const double ag = w * tc / (w * tc + (w - 1) * tm);
            printf("  W=%-4d %.3f / %.3f", ws[b], ring, ag);
        }
        printf("\n");
    }
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_size(MPI_COMM_WORLD, &W);
    MPI_Comm_rank(MPI_COMM_WORLD, &R);
    int64_t N = 16384, H = 8, D = 128;
    int causal = 1, backward = 0, rounds = 3;
    fa_cp_layout layout = FA_CP_ZIGZAG;
    const char *csv = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seqlen") && i + 1 < argc)
            N = atol(argv[++i]);
        else if (!strcmp(argv[i], "--heads") && i + 1 < argc)
            H = atol(argv[++i]);
        else if (!strcmp(argv[i], "--dim") && i + 1 < argc)
            D = atol(argv[++i]);
        else if (!strcmp(argv[i], "--layout") && i + 1 < argc)
            layout = !strcmp(argv[++i], "contiguous") ? FA_CP_CONTIGUOUS : FA_CP_ZIGZAG;
        else if (!strcmp(argv[i], "--no-causal"))
            causal = 0;
        else if (!strcmp(argv[i], "--backward"))
            backward = 1;
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--csv") && i + 1 < argc)
            csv = argv[++i];
        else {
            if (R == 0)
                fprintf(stderr, "bench_cp: unknown option %s (see the file's head)\n", argv[i]);
            MPI_Finalize();
            return 2;
        }
    }
    fa_params p;
    fa_params_init(&p);
    p.causal = causal;
    fa_tensor q, k, v, dout;
    float *mem[16];
    int nm = 0;
    mem[nm++] = tensor(&q, N, H, D, 1);
    mem[nm++] = tensor(&k, N, H, D, 2);
    mem[nm++] = tensor(&v, N, H, D, 3);
    mem[nm++] = tensor(&dout, N, H, D, 4);
    fa_cp_shard s;
    must(fa_cp_local_size(layout, N, W, R, &s), "fa_cp_local_size");
    fa_tensor lq, lk, lv, ldo, lo, ll, ldq, ldk, ldv;
    mem[nm++] = shard(&lq, &q, &s);
    mem[nm++] = shard(&lk, &k, &s);
    mem[nm++] = shard(&lv, &v, &s);
    mem[nm++] = shard(&ldo, &dout, &s);
    mem[nm++] = shard(&lo, &q, &s);
    mem[nm++] = shard(&ldq, &q, &s);
    mem[nm++] = shard(&ldk, &q, &s);
    mem[nm++] = shard(&ldv, &q, &s);
    float *lse_mem = malloc((size_t)(s.local * H) * sizeof(float) + 4);
    fa_tensor_init(&ll, lse_mem, FA_F32, 1, s.local, H, 1, 0);
    fa_tensor o, lse, dq, dk, dv; /* rank 0's whole-sequence results */
    float *whole[5] = {0};
    if (R == 0) {
        whole[0] = tensor(&o, N, H, D, 5);
        whole[1] = tensor(&dq, N, H, D, 6);
        whole[2] = tensor(&dk, N, H, D, 7);
        whole[3] = tensor(&dv, N, H, D, 8);
        whole[4] = tensor(&lse, N, H, 1, 9);
    }
    fa_context *one = R == 0 ? context("ring", W) : NULL, *ring = context("ring", 1),
               *ag = context("allgather", 1);
    /* one call each, untimed: first touches, the plan's allocations */
    must(fa_cp_forward(ring, MPI_COMM_WORLD, layout, &p, &lq, &lk, &lv, &lo, &ll), "warm-up");
    /* the largest shard's K and V: what a ring step sends (the forward's, and the backward's
     * again; its dK/dV terms are waited on as other ranks' work, "synced") */
    int64_t most;
    MPI_Allreduce(&s.local, &most, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
    const size_t pair = (size_t)(most * H * 2 * D) * sizeof(float);
    const double alone = messages_alone(pair) * (backward ? 2 : 1);
    double best[3] = {1e30, 1e30, 1e30}, wait_ring = 1e30, sync_ring = 1e30;
    for (int r = 0; r < rounds; r++)
        for (int j = 0; j < 3; j++) {
            const int which = r % 2 ? 2 - j : j; /* 0 one process, 1 ring, 2 allgather */
            MPI_Barrier(MPI_COMM_WORLD);
            const double t0 = now();
            if (which == 0 && R == 0) {
                must(fa_forward(one, &p, &q, &k, &v, &o, &lse), "fa_forward");
                if (backward)
                    must(fa_backward(one, &p, &q, &k, &v, &o, &lse, &dout, &dq, &dk, &dv),
                         "fa_backward");
            } else if (which > 0) {
                fa_context *ctx = which == 1 ? ring : ag;
                must(fa_cp_forward(ctx, MPI_COMM_WORLD, layout, &p, &lq, &lk, &lv, &lo, &ll),
                     "fa_cp_forward");
                double w = described(ctx, "waited="), y = 0;
                if (backward) {
                    must(fa_cp_backward(ctx, MPI_COMM_WORLD, layout, &p, &lq, &lk, &lv, &lo,
                                        &ll, &ldo, &ldq, &ldk, &ldv), "fa_cp_backward");
                    w += described(ctx, "waited=");
                    y = described(ctx, "synced=");
                }
                w = slowest(w);
                y = slowest(y);
                if (which == 1 && w < wait_ring)
                    wait_ring = w, sync_ring = y;
            }
            const double t = slowest(now() - t0);
            if (t < best[which])
                best[which] = t;
        }
    /* latency: W - 1 steps of 8 bytes */
    const double alpha = messages_alone(8) / (W > 1 ? W - 1 : 1);
    const double beta = W > 1 ? (double)pair * (W - 1) / (alone / (backward ? 2 : 1)) : 0;
    if (R == 0) {
        const double hidden = alone > 0 ? 1 - wait_ring / alone : 1;
        printf("W=%d %s %s N=%lld H=%lld D=%lld f32, %s, best of %d rounds:\n", W,
               layout == FA_CP_ZIGZAG ? "zigzag" : "contiguous", causal ? "causal" : "full",
               (long long)N, (long long)H, (long long)D,
               backward ? "forward+backward" : "forward", rounds);
        printf("  one process, %d threads: %.3f s\n", W, best[0]);
        printf("  ring, %d ranks x 1 thread: %.3f s (x%.3f)\n", W, best[1], best[1] / best[0]);
        printf("  allgather:                %.3f s (x%.3f)\n", best[2], best[2] / best[0]);
        printf("  ring waited %.4f s on K/V messages that take %.4f s alone: %.0f%% hidden\n",
               wait_ring, alone, 100 * (hidden < 0 ? 0 : hidden));
        if (backward)
            printf("  and %.4f s on other ranks' dK/dV terms (%.1f%% of the ring's time)\n",
                   sync_ring, 100 * sync_ring / best[1]);
        /* causal halves the 4 N^2 D H flops of a forward; a backward is 2.5 forwards */
        const double flop = 4.0 * (double)N * (double)N * (double)D * (double)H *
                            (causal ? 0.5 : 1.0) * (backward ? 3.5 : 1.0);
        flop_n = (double)N;
        const double rate = flop / W / best[1]; /* per rank, this run's ring */
        printf("  per rank: %.1f GFLOP/s; messages here: alpha %.2g s, beta %.3g GB/s\n",
               rate * 1e-9, alpha, beta * 1e-9);
        /* bytes a rank sends: the ring's K/V at each of W - 1 steps (the backward's again,
         * and its dK/dV terms as many); the allgather's K/V to each other rank, the
         * backward's dK/dV partials to each owner */
        const double mb = (double)pair * (W - 1) / 1e6;
        printf("  sent per rank: ring %.1f MB, allgather %.1f MB\n",
               mb * (backward ? 3 : 1), mb * (backward ? 3 : 1));
        const double row = (double)pair / (double)most; /* K/V bytes a row */
        if (W > 1)
            model(flop, rate, row, backward, alpha, beta, "this machine's shared memory");
        model(flop, rate, row, backward, 2e-6, 12.5e9, "ranks as here, 100 Gb/s links, 2 us");
        model(flop, 32 * rate, row, backward, 2e-6, 12.5e9,
              "ranks of 32 such threads, 100 Gb/s links, 2 us");
        if (csv) {
            FILE *f = fopen(csv, "a");
            if (f) {
                fprintf(f, "%s,%d,%s,%d,%lld,%lld,%lld,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f\n",
                        backward ? "fwd+bwd" : "fwd", W,
                        layout == FA_CP_ZIGZAG ? "zigzag" : "contiguous", causal, (long long)N,
                        (long long)H, (long long)D, best[0], best[1], best[2], wait_ring, alone,
                        sync_ring);
                fclose(f);
            }
        }
    }
    for (int i = 0; i < nm; i++)
        free(mem[i]);
    for (int i = 0; i < 5; i++)
        free(whole[i]);
    free(lse_mem);
    if (one)
        fa_context_destroy(one);
    fa_context_destroy(ring);
    fa_context_destroy(ag);
    MPI_Finalize();
    return 0;
}
