/*
 * The backend sweep's cases and their mapping to sizes, shapes, fa_params and input draws
 * (tests/sweep_cases.h).
 *
 * One table for every runner, the CUDA-only and digest-only cases included (a CUDA table of
 * its own would split what one name means and hide which runners share a case), each case
 * marked for the sweeps that take it: one place shows what runs where, a name means one shape
 * and one set of switches everywhere, and any runner may pick any case by name. A case that
 * check_backends.c and check_cuda.c share draws the same inputs in both wherever its sizes
 * agree (sweep_digest.c draws from its runs' numbers instead of the seeds; some seeds repeat, in
 * cases of other shapes).
 *
 * Seeds are the numbers the runners used before the table was shared (their rows' positions
 * then). Where check_backends.c and check_cuda.c drew one shape from different seeds, the
 * case keeps check_cuda.c's, so that no CUDA run changed where none can be run (CI has no
 * GPU): gqa_window_softcap_alibi_dropout and alibi_then_softcap (check_backends.c's 19 and 20,
 * shifted there by mqa_8_heads' insertion), sink_tokens_inside_tile (check_backends.c's 25).
 */
#include "config.h"

#include "sweep_cases.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const sw_case sw_cases[] = {
    /* ---- check_backends.c's sweep (check_cuda.c resolves sizes relative to tiles against
     * 64 x 64, sweep_digest.c against 128 x 256) */
    {.name = "one_key", .runs = SW_BACKENDS | SW_CUDA, .seed = 0,
     .dims = {.b = 1, .sq = 1, .sk = 1, .hq = 1, .hk = 1, .dqk = 16, .dv = 16}},
    {.name = "tiny_gqa_causal", .runs = SW_BACKENDS | SW_CUDA, .seed = 1,
     .dims = {.b = 2, .sq = 2, .sk = 3, .hq = 2, .hk = 1, .dqk = 8, .dv = 8}, .causal = 1,
     .layout = SW_BHSD},
    /* row 0 sees no key */
    {.name = "causal_first_row_empty", .runs = SW_BACKENDS | SW_CUDA, .seed = 2,
     .dims = {.b = 1, .sq = 3, .sk = 2, .hq = 1, .hk = 1, .dqk = 5, .dv = 7}, .causal = 1},
    {.name = "causal_key_tile_minus_1", .runs = SW_BACKENDS | SW_CUDA | SW_CUDA_MMA, .seed = 3,
     .dims = {.b = 1, .sq = SW_BK(-1), .sk = SW_BK(-1), .hq = 1, .hk = 1, .dqk = 64, .dv = 64},
     .causal = 1},
    {.name = "causal_key_tile_dropout", .runs = SW_BACKENDS | SW_CUDA, .seed = 4,
     .dims = {.b = 1, .sq = SW_BK(0), .sk = SW_BK(0), .hq = 2, .hk = 2, .dqk = 64, .dv = 64},
     .causal = 1, .dropout = 0.2},
    {.name = "window_key_tile_plus_1", .runs = SW_BACKENDS | SW_CUDA, .seed = 5,
     .dims = {.b = 1, .sq = SW_BK(1), .sk = SW_BK(1), .hq = 1, .hk = 1, .dqk = 64, .dv = 64},
     .window = SW_WINDOW(5, 3), .layout = SW_PADDED},
    {.name = "query_tile_minus_1", .runs = SW_BACKENDS | SW_CUDA, .seed = 6,
     .dims = {.b = 1, .sq = SW_BQ(-1), .sk = 97, .hq = 1, .hk = 1, .dqk = 32, .dv = 32},
     .layout = SW_PADDED},
    {.name = "query_tile_top_left_alibi", .runs = SW_BACKENDS | SW_CUDA, .seed = 7,
     .dims = {.b = 1, .sq = SW_BQ(0), .sk = 113, .hq = 2, .hk = 1, .dqk = 32, .dv = 32},
     .causal = 1, .top_left = 1, .alibi = 1},
    {.name = "query_tile_plus_1_softcap", .runs = SW_BACKENDS | SW_CUDA, .seed = 8,
     .dims = {.b = 1, .sq = SW_BQ(1), .sk = 127, .hq = 1, .hk = 1, .dqk = 32, .dv = 48},
     .causal = 1, .softcap = 5, .layout = SW_BHSD},
    {.name = "odd_dims_window_softcap_alibi", .runs = SW_BACKENDS | SW_CUDA, .seed = 9,
     .dims = {.b = 1, .sq = 97, .sk = 113, .hq = 4, .hk = 2, .dqk = 59, .dv = 111},
     .window = SW_WINDOW(16, 8), .softcap = 10, .alibi = 1},
    {.name = "long_keys_top_left_dropout", .runs = SW_BACKENDS | SW_CUDA, .seed = 10,
     .dims = {.b = 1, .sq = 127, .sk = 1025, .hq = 2, .hk = 1, .dqk = 16, .dv = 16},
     .causal = 1, .top_left = 1, .dropout = 0.3},
    /* 898 empty rows */
    {.name = "long_queries_empty_rows_alibi", .runs = SW_BACKENDS | SW_CUDA, .seed = 11,
     .dims = {.b = 1, .sq = 1025, .sk = 127, .hq = 1, .hk = 1, .dqk = 16, .dv = 16},
     .causal = 1, .alibi = 1, .layout = SW_BHSD},
    /* MQA, one key per row */
    {.name = "mqa_one_key_per_row_dropout", .runs = SW_BACKENDS | SW_CUDA, .seed = 12,
     .dims = {.b = 2, .sq = 113, .sk = 97, .hq = 4, .hk = 1, .dqk = 59, .dv = 59},
     .window = SW_WINDOW(0, 0), .dropout = 0.5},
    {.name = "left_unbounded_window", .runs = SW_BACKENDS | SW_CUDA, .seed = 13,
     .dims = {.b = 1, .sq = 129, .sk = 129, .hq = 2, .hk = 2, .dqk = 111, .dv = 59},
     .window = SW_WINDOW(-1, 0), .layout = SW_PADDED},
    /* everything at once */
    {.name = "everything_d128", .runs = SW_BACKENDS | SW_CUDA, .seed = 14,
     .dims = {.b = 1, .sq = 65, .sk = 200, .hq = 1, .hk = 1, .dqk = 128, .dv = 128},
     .window = SW_WINDOW(20, -1), .softcap = 3, .alibi = 1, .dropout = 0.1, .layout = SW_BHSD},
    {.name = "causal_top_left_more_queries", .runs = SW_BACKENDS | SW_CUDA, .seed = 15,
     .dims = {.b = 1, .sq = 200, .sk = 65, .hq = 2, .hk = 1, .dqk = 24, .dv = 40},
     .causal = 1, .top_left = 1},
    /* only the last row sees the key */
    {.name = "causal_last_row_only", .runs = SW_BACKENDS | SW_CUDA, .seed = 16,
     .dims = {.b = 1, .sq = 5, .sk = 1, .hq = 1, .hk = 1, .dqk = 4, .dv = 4}, .causal = 1},
    {.name = "plain_257", .runs = SW_BACKENDS | SW_CUDA | SW_CUDA_MMA, .seed = 17,
     .dims = {.b = 1, .sq = 257, .sk = 257, .hq = 2, .hk = 2, .dqk = 64, .dv = 64},
     .layout = SW_PADDED},
    /* MQA: dK and dV sum 8 heads' terms (summed in one chain over the group's rows, the f32
     * gradients carried 3-4.5x the conventional error, past the 3x rule) */
    {.name = "mqa_8_heads", .runs = SW_BACKENDS, .seed = 18,
     .dims = {.b = 2, .sq = 128, .sk = 128, .hq = 8, .hk = 1, .dqk = 64, .dv = 64}, .causal = 1},
    {.name = "gqa_window_softcap_alibi_dropout", .runs = SW_BACKENDS | SW_CUDA, .seed = 18,
     .dims = {.b = 3, .sq = 61, .sk = 67, .hq = 6, .hk = 3, .dqk = 19, .dv = 23}, .causal = 1,
     .window = SW_WINDOW(7, -1), .softcap = 2, .alibi = 1, .dropout = 0.15, .layout = SW_BHSD},
    {.name = "alibi_then_softcap", .runs = SW_BACKENDS | SW_CUDA | SW_CUDA_MMA, .seed = 19,
     .dims = {.b = 1, .sq = 90, .sk = 90, .hq = 2, .hk = 1, .dqk = 32, .dv = 32}, .causal = 1,
     .softcap = 2, .alibi = 1, .order = FA_ALIBI_THEN_SOFTCAP, .dropout = 0.1},
    /* decode shapes (the tiled forward's decode path: group x Sq <= 16, no dropout), keys over
     * several 512-key chunks: GQA at D=128; MQA with a window whose edge differs per query
     * position, odd head dims; causal with softcap and ALiBi over two chunks (the per-element
     * pipeline, whose key index is the chunk's offset plus the column) */
    {.name = "decode_gqa_d128", .runs = SW_BACKENDS, .seed = 21,
     .dims = {.b = 1, .sq = 1, .sk = 1537, .hq = 8, .hk = 2, .dqk = 128, .dv = 128}, .causal = 1},
    {.name = "decode_mqa_window", .runs = SW_BACKENDS, .seed = 22,
     .dims = {.b = 2, .sq = 3, .sk = 1100, .hq = 4, .hk = 1, .dqk = 80, .dv = 72},
     .window = SW_WINDOW(600, 0), .layout = SW_BHSD},
    {.name = "decode_softcap_alibi", .runs = SW_BACKENDS, .seed = 23,
     .dims = {.b = 1, .sq = 4, .sk = 700, .hq = 4, .hk = 2, .dqk = 33, .dv = 17}, .causal = 1,
     .softcap = 5, .alibi = 1, .order = FA_ALIBI_THEN_SOFTCAP, .layout = SW_PADDED},
    /* sink tokens: the first keys beside a window, over several tiles and decode chunks; sinks
     * that end inside a key tile whose later keys the window holds; sinks over a chunk
     * boundary (600 > 512) */
    {.name = "sink_tokens_window", .runs = SW_BACKENDS, .seed = 24,
     .dims = {.b = 1, .sq = 300, .sk = 300, .hq = 2, .hk = 1, .dqk = 32, .dv = 32}, .causal = 1,
     .window = SW_WINDOW(40, -1), .sink_tokens = 5},
    {.name = "sink_tokens_inside_tile", .runs = SW_BACKENDS, .seed = 201,
     .dims = {.b = 2, .sq = 150, .sk = 200, .hq = 4, .hk = 2, .dqk = 24, .dv = 16},
     .top_left = 1, .window = SW_WINDOW(30, 10), .sink_tokens = 70, .softcap = 4, .alibi = 1,
     .dropout = 0.2, .layout = SW_BHSD},
    {.name = "sink_tokens_decode", .runs = SW_BACKENDS, .seed = 26,
     .dims = {.b = 2, .sq = 3, .sk = 1600, .hq = 4, .hk = 1, .dqk = 64, .dv = 64}, .causal = 1,
     .window = SW_WINDOW(700, -1), .sink_tokens = 4},
    {.name = "sink_tokens_past_chunk", .runs = SW_BACKENDS, .seed = 27,
     .dims = {.b = 1, .sq = 2, .sk = 1300, .hq = 8, .hk = 2, .dqk = 32, .dv = 32}, .causal = 1,
     .window = SW_WINDOW(100, -1), .sink_tokens = 600, .softcap = 3, .alibi = 1,
     .order = FA_ALIBI_THEN_SOFTCAP, .layout = SW_PADDED},

    /* ---- logits in [90, 100] (XNNPACK's range): exp(90) overflows f32, so a path that
     * skipped the max subtraction would return inf/NaN */
    {.name = "large_logits", .runs = SW_BACKENDS, .seed = 100,
     .dims = {.b = 1, .sq = 70, .sk = 90, .hq = 2, .hk = 1, .dqk = 64, .dv = 64},
     .logits = {90, 100}},
    {.name = "large_logits_causal_dropout", .runs = SW_BACKENDS, .seed = 101,
     .dims = {.b = 1, .sq = 90, .sk = 70, .hq = 1, .hk = 1, .dqk = 64, .dv = 32}, .causal = 1,
     .dropout = 0.2, .layout = SW_BHSD, .logits = {90, 100}},
    {.name = "large_logits_causal_dropout_d64", .seed = 101,
     .dims = {.b = 1, .sq = 90, .sk = 70, .hq = 1, .hk = 1, .dqk = 64, .dv = 64}, .causal = 1,
     .dropout = 0.2, .layout = SW_BHSD, .logits = {90, 100}},

    /* ---- CUDA: the tensor-core head dims, every feature, tails on both sides */
    {.name = "tc_d32_causal", .runs = SW_CUDA | SW_CUDA_TC, .seed = 20,
     .dims = {.b = 2, .sq = 130, .sk = 200, .hq = 4, .hk = 2, .dqk = 32, .dv = 32}, .causal = 1},
    {.name = "tc_d64_top_left", .runs = SW_CUDA | SW_CUDA_TC, .seed = 21,
     .dims = {.b = 1, .sq = 200, .sk = 130, .hq = 4, .hk = 1, .dqk = 64, .dv = 64}, .causal = 1,
     .top_left = 1, .layout = SW_BHSD},
    {.name = "tc_d96_window", .runs = SW_CUDA | SW_CUDA_TC, .seed = 22,
     .dims = {.b = 1, .sq = 193, .sk = 193, .hq = 2, .hk = 2, .dqk = 96, .dv = 96},
     .window = SW_WINDOW(33, 17)},
    {.name = "tc_d128_softcap_alibi", .runs = SW_CUDA | SW_CUDA_TC, .seed = 23,
     .dims = {.b = 1, .sq = 150, .sk = 300, .hq = 4, .hk = 2, .dqk = 128, .dv = 128},
     .causal = 1, .softcap = 30, .alibi = 1},
    {.name = "tc_d128_dropout", .runs = SW_CUDA | SW_CUDA_TC, .seed = 24,
     .dims = {.b = 1, .sq = 129, .sk = 257, .hq = 2, .hk = 1, .dqk = 128, .dv = 128},
     .dropout = 0.25, .layout = SW_BHSD},
    {.name = "tc_d256_causal", .runs = SW_CUDA | SW_CUDA_TC | SW_CUDA_MMA, .seed = 25,
     .dims = {.b = 1, .sq = 100, .sk = 161, .hq = 2, .hk = 2, .dqk = 256, .dv = 256},
     .causal = 1},
    {.name = "tc_d256_everything", .runs = SW_CUDA | SW_CUDA_TC, .seed = 26,
     .dims = {.b = 1, .sq = 77, .sk = 77, .hq = 2, .hk = 1, .dqk = 256, .dv = 256},
     .top_left = 1, .window = SW_WINDOW(10, 10), .softcap = 20, .alibi = 1,
     .order = FA_ALIBI_THEN_SOFTCAP, .dropout = 0.1},
    /* 200 empty rows */
    {.name = "tc_d128_empty_rows", .runs = SW_CUDA | SW_CUDA_TC, .seed = 27,
     .dims = {.b = 1, .sq = 300, .sk = 100, .hq = 2, .hk = 2, .dqk = 128, .dv = 128},
     .causal = 1},
    /* the wgmma kernels' shapes (scale only): several query blocks of 128 rows and key tiles
     * of 128, windows cutting tiles on both sides, both causal alignments */
    {.name = "wgmma_window", .runs = SW_CUDA | SW_CUDA_TC | SW_CUDA_MMA, .seed = 28,
     .dims = {.b = 1, .sq = 300, .sk = 517, .hq = 2, .hk = 1, .dqk = 128, .dv = 128},
     .window = SW_WINDOW(100, 37)},
    {.name = "wgmma_d64_causal", .runs = SW_CUDA | SW_CUDA_TC | SW_CUDA_MMA, .seed = 29,
     .dims = {.b = 2, .sq = 257, .sk = 385, .hq = 4, .hk = 2, .dqk = 64, .dv = 64}, .causal = 1,
     .layout = SW_BHSD},
    {.name = "wgmma_top_left", .runs = SW_CUDA | SW_CUDA_TC | SW_CUDA_MMA, .seed = 30,
     .dims = {.b = 1, .sq = 385, .sk = 129, .hq = 2, .hk = 2, .dqk = 128, .dv = 128},
     .causal = 1, .top_left = 1},
    {.name = "wgmma_plain", .runs = SW_CUDA | SW_CUDA_TC | SW_CUDA_MMA, .seed = 31,
     .dims = {.b = 1, .sq = 200, .sk = 700, .hq = 2, .hk = 2, .dqk = 128, .dv = 128},
     .layout = SW_BHSD},
    /* D 96 (Q, K, V, dO padded to 128 columns by TMA in shared memory, O, dQ, dK, dV stored
     * to 96): GQA, both query blocks and key blocks cut; D 256 (forward key tiles of 64, the
     * backward's key blocks of 64 with the dims split between the consumers): a window
     * cutting tiles on both sides, a bottom-right causal mask with Sq < Sk, a top-left one
     * with Sq > Sk over a GQA group of 2 and a last key block of 2 keys */
    {.name = "wgmma_d96_gqa", .runs = SW_CUDA | SW_CUDA_TC | SW_CUDA_MMA, .seed = 34,
     .dims = {.b = 2, .sq = 201, .sk = 301, .hq = 4, .hk = 2, .dqk = 96, .dv = 96}},
    {.name = "wgmma_d96_causal", .runs = SW_CUDA | SW_CUDA_TC | SW_CUDA_MMA, .seed = 35,
     .dims = {.b = 1, .sq = 300, .sk = 300, .hq = 2, .hk = 1, .dqk = 96, .dv = 96}, .causal = 1,
     .layout = SW_BHSD},
    {.name = "wgmma_d256_window", .runs = SW_CUDA | SW_CUDA_TC | SW_CUDA_MMA, .seed = 36,
     .dims = {.b = 1, .sq = 260, .sk = 333, .hq = 2, .hk = 2, .dqk = 256, .dv = 256},
     .window = SW_WINDOW(70, 30)},
    {.name = "wgmma_d256_causal", .runs = SW_CUDA | SW_CUDA_TC | SW_CUDA_MMA, .seed = 37,
     .dims = {.b = 1, .sq = 150, .sk = 390, .hq = 4, .hk = 1, .dqk = 256, .dv = 256},
     .causal = 1},
    {.name = "wgmma_d256_top_left", .runs = SW_CUDA | SW_CUDA_TC | SW_CUDA_MMA, .seed = 38,
     .dims = {.b = 2, .sq = 200, .sk = 130, .hq = 4, .hk = 2, .dqk = 256, .dv = 256},
     .causal = 1, .top_left = 1, .layout = SW_BHSD},
    /* the wgmma backward's: key blocks of 128 over query tiles of 64 of a GQA group of 4 */
    {.name = "wgmma_backward_gqa", .runs = SW_CUDA | SW_CUDA_TC | SW_CUDA_MMA, .seed = 32,
     .dims = {.b = 2, .sq = 333, .sk = 333, .hq = 4, .hk = 1, .dqk = 128, .dv = 128},
     .causal = 1},
    /* one key block whose second group holds only padding keys, one partial query tile, 10
     * empty rows */
    {.name = "wgmma_padding_keys", .runs = SW_CUDA | SW_CUDA_TC | SW_CUDA_MMA, .seed = 33,
     .dims = {.b = 1, .sq = 50, .sk = 40, .hq = 2, .hk = 2, .dqk = 128, .dv = 128}, .causal = 1},
    /* sink tokens on the generic kernels: at D 64 (mma's shape) and in decode at D 128 */
    {.name = "sink_tokens_window_d64", .seed = 200,
     .dims = {.b = 1, .sq = 300, .sk = 300, .hq = 2, .hk = 1, .dqk = 64, .dv = 64}, .causal = 1,
     .window = SW_WINDOW(40, -1), .sink_tokens = 5},
    {.name = "sink_tokens_decode_d128", .seed = 202,
     .dims = {.b = 2, .sq = 3, .sk = 1600, .hq = 4, .hk = 1, .dqk = 128, .dv = 128},
     .causal = 1, .window = SW_WINDOW(700, -1), .sink_tokens = 4},

    /* ---- sweep_digest.c: past the forward's 4096-row query tile; GQA; D = 128 with AMX's
     * multiples */
    {.name = "past_query_tile", .seed = 22,
     .dims = {.b = 1, .sq = 4097, .sk = 300, .hq = 2, .hk = 1, .dqk = 128, .dv = 128},
     .causal = 1},
    {.name = "past_query_tile_keys_window", .seed = 23,
     .dims = {.b = 1, .sq = 600, .sk = 4100, .hq = 4, .hk = 2, .dqk = 64, .dv = 64},
     .window = SW_WINDOW(700, 33)},
    /* non-finite values: the selection paths */
    {.name = "nonfinite_causal", .seed = 24,
     .dims = {.b = 1, .sq = 300, .sk = 300, .hq = 2, .hk = 1, .dqk = 32, .dv = 32}, .causal = 1,
     .nonfinite = 1},
    {.name = "nonfinite_window_dropout", .seed = 25,
     .dims = {.b = 1, .sq = 70, .sk = 290, .hq = 1, .hk = 1, .dqk = 64, .dv = 64},
     .window = SW_WINDOW(40, 2), .dropout = 0.25, .nonfinite = 1},
};
const int sw_ncases = (int)(sizeof sw_cases / sizeof *sw_cases);

const sw_case *sw_case_named(const char *name)
{
    const sw_case *found = NULL;
    int n = 0;
    for (int i = 0; i < sw_ncases; i++)
        if (strcmp(sw_cases[i].name, name) == 0)
            found = &sw_cases[i], n++;
    if (n != 1) {
        fprintf(stderr, "tests/sweep_cases.c: %s case named \"%s\"\n", n ? "more than one" : "no",
                name);
        abort();
    }
    return found;
}

int sw_select(unsigned runs, const sw_case **out, int max)
{
    int n = 0;
    for (int i = 0; i < sw_ncases; i++) {
        if (!(sw_cases[i].runs & runs))
            continue;
        if (n == max) {
            fprintf(stderr, "tests/sweep_cases.c: more than %d cases marked %#x\n", max, runs);
            abort();
        }
        out[n++] = &sw_cases[i];
    }
    return n;
}

/* SW_BQ(x) and SW_BK(x) lie within 2^19 of their bases, far above any fixed size */
static int64_t resolve(int64_t x, int64_t bq, int64_t bk)
{
    const int64_t near = (int64_t)1 << 19;
    return x >= SW_BK(0) - near   ? bk + (x - SW_BK(0))
           : x >= SW_BQ(0) - near ? bq + (x - SW_BQ(0))
                                  : x;
}

sw_dims sw_dims_of(const sw_case *c, int64_t bq, int64_t bk)
{
    sw_dims d = c->dims;
    d.sq = resolve(d.sq, bq, bk);
    d.sk = resolve(d.sk, bq, bk);
    return d;
}

void sw_shape(const sw_dims *d, sw_tensor t, int64_t shape[4])
{
    const int q_rows = t == SW_Q || t == SW_DOUT || t == SW_OUT || t == SW_DQ || t == SW_LSE;
    shape[0] = d->b;
    shape[1] = q_rows ? d->sq : d->sk;
    shape[2] = q_rows ? d->hq : d->hk;
    shape[3] = t == SW_LSE ? 1 : t == SW_V || t == SW_DOUT || t == SW_OUT || t == SW_DV ? d->dv
                                                                                     : d->dqk;
}

/*
 * The backward reads P = exp(s - LSE): an LSE rounded to f32 carries |LSE| 2^-24 into every
 * gradient of its row, which the conventional yardstick (it never stores one) does not. So f64
 *  - at large logits: an f32 LSE near 100 is only good to 4e-6;
 *  - where ALiBi reaches past 128 keys: its bias grows with the distance, so |LSE| reaches
 *    slope x Sq (128 in query_tile_top_left_alibi); measured there on the CPU, dV: 1.14e-5
 *    from an f32 LSE, 7.6e-6 from an f64 one, against a bound of 1.06e-5.
 */
fa_dtype sw_lse_dtype(const sw_case *c, const sw_dims *d, fa_dtype dt)
{
    const int large_logits = c->logits[0] > 0, far_alibi = c->alibi && (d->sq > 128 || d->sk > 128);
    return dt == FA_F64 || large_logits || far_alibi ? FA_F64 : FA_F32;
}

void sw_params(const sw_case *c, fa_params *p)
{
    static const float slopes[8] = {0.5f,     0.25f,     0.125f,     0.0625f,
                                    0.03125f, 0.015625f, 0.0078125f, 0.004f};
    if (c->alibi && c->dims.hq > 8) {
        fprintf(stderr, "tests/sweep_cases.c: case %s: ALiBi slopes for 8 heads only\n", c->name);
        abort();
    }
    fa_params_init(p);
    p->causal = c->causal;
    p->window_left = c->window.on ? c->window.left : -1;
    p->window_right = c->window.on ? c->window.right : -1;
    p->align = c->top_left ? FA_ALIGN_TOP_LEFT : FA_ALIGN_BOTTOM_RIGHT;
    p->softcap = c->softcap;
    p->alibi_slopes = c->alibi ? slopes : NULL;
    p->dropout_p = c->dropout;
    p->dropout_seed = 0xfeedface12345678ull + (uint64_t)c->seed;
    p->dropout_offset = 3;
    p->score_order = c->order;
    p->sink_tokens = c->sink_tokens;
}

void sw_draw(const sw_case *c, sw_tensor t, uint64_t *seed, double *lo, double *hi)
{
    *seed = 1000 * (uint64_t)(t + 1) + (uint64_t)c->seed; /* q 1000, k 2000, v 3000, dout 4000 */
    *lo = -1, *hi = 1;
    if (t != SW_Q && t != SW_K)
        return;
    if (c->logits[0] == 0 && c->logits[1] == 0) {
        *lo = 1, *hi = -1; /* N(0, 1) */
        return;
    }
    /* q, k entries in [a, b] with a^2 sqrt(D) and b^2 sqrt(D) the logits' magnitudes */
    const double m0 = fmin(fabs(c->logits[0]), fabs(c->logits[1]));
    const double m1 = fmax(fabs(c->logits[0]), fabs(c->logits[1]));
    const double a = sqrt(m0 / sqrt((double)c->dims.dqk)), b = sqrt(m1 / sqrt((double)c->dims.dqk));
    const int negate = t == SW_K && c->logits[1] < 0;
    *lo = negate ? -b : a;
    *hi = negate ? -a : b;
}
