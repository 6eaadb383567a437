#!/usr/bin/env python3
"""`flashattn` subcommands and options, end to end, through .npy files written and read by numpy.

Most option tests follow one pattern: `forward --opt` writes O and LSE; `check --opt` on them
must PASS, and `check` without the option (or with another value) must FAIL. That shows the
option is parsed and applied the same way in both commands, and that it changes the result.
Run: python3 tests/test_cli.py path/to/flashattn
"""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

EXE = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "./flashattn")
# FA_CLI_WRAPPER: a command line every run goes through (CI: libtool --mode=execute valgrind ...)
WRAP = shlex.split(os.environ.get("FA_CLI_WRAPPER", ""))
TMP = tempfile.mkdtemp(prefix="flashattn-cli-")
RNG = np.random.default_rng(7)
results = []
TESTS = []


def path(name):
    return os.path.join(TMP, name)


def run(*args, code=None, timeout=600, **kw):
    try:
        p = subprocess.run([*WRAP, EXE, *map(str, args)], capture_output=True, text=True,
                           timeout=timeout, **kw)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{args}: still running after {timeout} s")
    if code is not None:
        assert p.returncode == code, f"{args}: exit {p.returncode}, want {code}\n{p.stdout}{p.stderr}"
    return p


def save(name, a):
    np.save(path(name), a)
    return path(name)


def inputs(sq=40, sk=56, hq=4, hk=2, d=16, dtype=np.float32, prefix=""):
    q = RNG.standard_normal((2, sq, hq, d)).astype(dtype)
    k = RNG.standard_normal((2, sk, hk, d)).astype(dtype)
    v = RNG.standard_normal((2, sk, hk, d)).astype(dtype)
    return [save(prefix + "q.npy", q), save(prefix + "k.npy", k), save(prefix + "v.npy", v)]


QKV = []


def qkv_args(files=None):
    q, k, v = files or QKV
    return ["--q", q, "--k", k, "--v", v]


def forward(*opts, files=None, out="o.npy", lse="l.npy", code=0):
    run("forward", *qkv_args(files), "--out", path(out), "--lse", path(lse), *opts, code=code)
    return path(out), path(lse)


def check(o, l, *opts, files=None, code=None):
    p = run("check", *qkv_args(files), "--candidate-out", o, "--candidate-lse", l, *opts)
    assert p.returncode in (0, 1), f"check {opts}: exit {p.returncode}\n{p.stderr}"
    if code is not None:
        assert p.returncode == code, f"check {opts}: exit {p.returncode}, want {code}\n{p.stdout}"
    return p


def test(fn):
    TESTS.append(fn)
    return fn


# ------------------------------------------------------------------ option pairs

def pair(forward_opts, check_same, check_other):
    o, l = forward(*forward_opts)
    check(o, l, *check_same, code=0)
    check(o, l, *check_other, code=1)


@test
def plain_forward_passes_check():
    o, l = forward()
    check(o, l, code=0)
    out, lse = np.load(o), np.load(l)  # numpy reads what we write
    assert out.shape == (2, 40, 4, 16) and out.dtype == np.float32
    assert lse.shape == (2, 4, 40) and lse.dtype == np.float32


@test
def causal():
    pair(["--causal"], ["--causal"], [])


@test
def align_top_left():
    pair(["--causal", "--align", "top-left"], ["--causal", "--align", "top-left"], ["--causal"])


@test
def window_pair():
    pair(["--window", "5,2"], ["--window", "5,2"], ["--window", "5,3"])


@test
def window_single_is_left_bound():
    pair(["--window", "6,-1"], ["--window", "6"], ["--window", "7"])


@test
def softcap():
    pair(["--softcap", "1.5"], ["--softcap", "1.5"], ["--softcap", "3"])


@test
def scale():
    pair(["--scale", "0.5"], ["--scale", "0.5"], [])


@test
def alibi():
    slopes = save("slopes.npy", np.array([0.5, 0.25, 0.125, 0.0625], np.float32))
    pair(["--alibi", slopes, "--causal"], ["--alibi", slopes, "--causal"], ["--causal"])
    wrong = save("slopes3.npy", np.array([0.5, 0.25, 0.125], np.float64))
    p = run("forward", *qkv_args(), "--out", path("x.npy"), "--alibi", wrong, code=2)
    assert "slopes" in p.stderr


@test
def sinks():
    s = save("sinks.npy", np.array([0.5, -np.inf, 2.0, -1.0], np.float32))
    pair(["--sinks", s, "--causal"], ["--sinks", s, "--causal"], ["--causal"])
    # against the definition: LSE = ln(sum exp(s) + exp(sink)); rows 0-4 see no key (Sq 9,
    # Sk 4, bottom-right causal): LSE = sink, O = 0
    files = inputs(sq=9, sk=4, prefix="sk_")
    o, l = forward("--sinks", s, "--causal", files=files)
    q, k, v = (np.load(f).astype(np.float64) for f in files)
    out, lse = np.load(o).astype(np.float64), np.load(l).astype(np.float64)
    sink = np.array([0.5, -np.inf, 2.0, -1.0])
    kk, vv = np.repeat(k, 2, axis=2), np.repeat(v, 2, axis=2)  # GQA: 4 query heads, 2 kv heads
    sc = np.einsum("bihd,bjhd->bhij", q, kk) / 4.0
    allowed = np.arange(4)[None, :] <= np.arange(9)[:, None] - 5
    sc = np.where(allowed, sc, -np.inf)
    mx = np.maximum(sc.max(-1), sink[None, :, None])
    live = mx > -np.inf
    m = np.where(live, mx, 0)
    den = np.exp(sc - m[..., None]).sum(-1) + np.exp(sink[None, :, None] - m)
    want_lse = np.where(live, m + np.log(den), -np.inf)
    assert np.array_equal(np.isinf(lse), np.isinf(want_lse))
    fin = np.isfinite(want_lse)
    assert np.abs(lse[fin] - want_lse[fin]).max() < 1e-5, np.abs(lse[fin] - want_lse[fin]).max()
    assert (lse[:, 0, :5] == np.float32(0.5)).all() and (out[:, :5] == 0).all()
    p = np.where(live[..., None], np.exp(sc - np.where(live, want_lse, 0)[..., None]), 0)
    want_o = np.einsum("bhij,bjhd->bihd", p, vv)
    assert np.abs(out - want_o).max() < 1e-5, np.abs(out - want_o).max()
    # the backward's --dsinks: d loss / d sink_h = -sum exp(sink_h - LSE) dO . O
    dout = save("sk_do.npy", RNG.standard_normal(out.shape).astype(np.float32))
    grads = [path("sk_dq.npy"), path("sk_dk.npy"), path("sk_dv.npy"), path("sk_ds.npy")]
    bwd = ["backward", *qkv_args(files), "--out", o, "--lse", l, "--dout", dout, "--dq", grads[0],
           "--dk", grads[1], "--dv", grads[2], "--causal"]
    run(*bwd, "--sinks", s, "--dsinks", grads[3], code=0)
    ds = np.load(grads[3])
    assert ds.shape == (4,) and ds.dtype == np.float32
    di = np.einsum("bihd,bihd->bhi", np.load(dout).astype(np.float64), out)
    want = np.array([0.0 if np.isinf(sink[h]) else
                     -(np.exp(sink[h] - lse[:, h, :]) * di[:, h, :]).sum() for h in range(4)])
    assert np.abs(ds - want).max() <= 1e-5 * (1 + np.abs(want).max()), (ds, want)
    os.remove(grads[3])
    p = run(*bwd, "--dsinks", grads[3], code=2)  # no sinks, no gradient: nothing written
    assert "--sinks" in p.stderr and not os.path.exists(grads[3])
    wrong = save("sinks3.npy", np.array([0.5, 0.25, 0.125], np.float64))
    p = run("forward", *qkv_args(), "--out", path("x.npy"), "--sinks", wrong, code=2)
    assert "sink logits" in p.stderr
    nan = save("sinks_nan.npy", np.array([0.5, np.nan, 0, 0], np.float32))
    p = run("forward", *qkv_args(), "--out", path("x.npy"), "--sinks", nan, code=2)
    assert "sink_logits[1]" in p.stderr


@test
def sink_tokens():
    # StreamingLLM: the first 3 keys beside a window of 6 (causal, bottom-right): forward
    # against the definition, check with the same tokens PASSes, with none FAILs
    win = ["--causal", "--window", "5,0"]
    pair([*win, "--sink-tokens", "3"], [*win, "--sink-tokens", "3"], win)
    files = inputs(sq=30, sk=40, prefix="st_")
    o, l = forward(*win, "--sink-tokens", "3", files=files)
    q, k, v = (np.load(f).astype(np.float64) for f in files)
    kk, vv = np.repeat(k, 2, axis=2), np.repeat(v, 2, axis=2)
    sc = np.einsum("bihd,bjhd->bhij", q, kk) / 4.0
    i, j = np.arange(30)[:, None] + 10, np.arange(40)[None, :]  # off = Sk - Sq = 10
    allowed = (j <= i) & ((j >= i - 5) | (j < 3))
    sc = np.where(allowed, sc, -np.inf)
    want_lse = np.log(np.exp(sc).sum(-1))
    want_o = np.einsum("bhij,bjhd->bihd", np.exp(sc - want_lse[..., None]), vv)
    assert np.abs(np.load(l) - want_lse).max() < 1e-5
    assert np.abs(np.load(o) - want_o).max() < 1e-5
    p = run("forward", *qkv_args(), "--out", path("x.npy"), "--sink-tokens", "-1", code=2)
    assert "--sink-tokens" in p.stderr


@test
def varlen_packed_sequences():
    # three sequences packed as FlashAttention's varlen functions take them: (total, H, D),
    # the LSE (H, total); the middle one has no query rows
    lq, lk = [7, 0, 20], [12, 5, 20]
    cq = save("vl_cq.npy", np.cumsum([0] + lq).astype(np.int32))
    ck = save("vl_ck.npy", np.cumsum([0] + lk).astype(np.int64))
    q = RNG.standard_normal((sum(lq), 4, 16)).astype(np.float32)
    k = RNG.standard_normal((sum(lk), 2, 16)).astype(np.float32)
    v = RNG.standard_normal((sum(lk), 2, 16)).astype(np.float32)
    files = [save("vl_q.npy", q), save("vl_k.npy", k), save("vl_v.npy", v)]
    cu = ["--cu-seqlens-q", cq, "--cu-seqlens-k", ck]
    o, l = forward("--causal", *cu, files=files, out="vl_o.npy", lse="vl_l.npy")
    out, lse = np.load(o), np.load(l)
    assert out.shape == (27, 4, 16) and lse.shape == (4, 27)
    # each sequence alone, as a dense batch of one, gives the same bits
    for s, (q0, k0) in enumerate(zip(np.cumsum([0] + lq)[:-1], np.cumsum([0] + lk)[:-1])):
        if lq[s] == 0:
            continue
        one = [save(f"vl1_{n}.npy", x[None, a:a + m]) for n, x, a, m in
               (("q", q, q0, lq[s]), ("k", k, k0, lk[s]), ("v", v, k0, lk[s]))]
        o1, l1 = forward("--causal", files=one, out="vl1_o.npy", lse="vl1_l.npy")
        assert np.array_equal(np.load(o1)[0], out[q0:q0 + lq[s]]), s
        assert np.array_equal(np.load(l1)[0], lse[:, q0:q0 + lq[s]]), s
    check(o, l, "--causal", *cu, files=files, code=0)
    check(o, l, *cu, files=files, code=1)  # not causal: other results
    ck2 = save("vl_ck2.npy", np.array([0, 12, 12, 37], np.int64))  # another split of the keys
    check(o, l, "--causal", "--cu-seqlens-q", cq, "--cu-seqlens-k", ck2, files=files, code=1)
    dout = save("vl_do.npy", RNG.standard_normal(out.shape).astype(np.float32))
    grads = [path("vl_dq.npy"), path("vl_dk.npy"), path("vl_dv.npy")]
    run("backward", *qkv_args(files), "--out", o, "--lse", l, "--dout", dout, "--dq", grads[0],
        "--dk", grads[1], "--dv", grads[2], "--causal", *cu, code=0)
    assert np.load(grads[1]).shape == (37, 2, 16)
    assert (np.load(grads[1])[12:17] == 0).all()  # no query saw the middle sequence's keys
    run("check", *qkv_args(files), "--dout", dout, "--candidate-dq", grads[0], "--candidate-dk",
        grads[1], "--candidate-dv", grads[2], "--causal", *cu, code=0)
    # bad offsets and layouts: exit 2, the library's or the reader's reason
    bad_end = save("vl_bad.npy", np.array([0, 7, 7, 26], np.int32))
    flt = save("vl_flt.npy", np.array([0, 7, 7, 27], np.float32))
    for opts, says in ((["--cu-seqlens-q", cq], "--cu-seqlens-k"),
                       (["--cu-seqlens-q", bad_end, "--cu-seqlens-k", ck],
                        "cu_seqlens_q[3] = 26 but q->seqlen = 27"),
                       (["--cu-seqlens-q", flt, "--cu-seqlens-k", ck], "1-D int32 or int64"),
                       ([*cu, "--layout", "bhsd"], "packed sequences")):
        p = run("forward", *qkv_args(files), "--out", path("vl_x.npy"), *opts, code=2)
        assert says in p.stderr, (opts, p.stderr)
    p = run("forward", *qkv_args(), "--out", path("vl_x.npy"), *cu, code=2)  # 4-D files
    assert "3-D (total, heads, headdim)" in p.stderr, p.stderr
    assert not os.path.exists(path("vl_x.npy"))


@test
def paged_cache():
    # pages of 4 keys (num_pages, page, Hk, D), a (B, max_pages) table in a shuffled order;
    # sequence 2 shares its first page with sequence 0; sequence 1 has no key
    page, used = 4, [5, 0, 9]
    kp = RNG.standard_normal((12, page, 2, 16)).astype(np.float32)
    vp = RNG.standard_normal((12, page, 2, 16)).astype(np.float32)
    table = np.array([[7, 2, 0], [0, 0, 0], [7, 11, 4]], np.int32)
    q = RNG.standard_normal((3, 2, 4, 16)).astype(np.float32)
    files = [save("pg_q.npy", q), save("pg_k.npy", kp), save("pg_v.npy", vp)]
    bt, su = save("pg_bt.npy", table), save("pg_su.npy", np.array(used, np.int64))
    pg = ["--block-table", bt, "--seqused-k", su]
    o, l = forward("--causal", *pg, files=files, out="pg_o.npy", lse="pg_l.npy")
    out, lse = np.load(o), np.load(l)
    assert out.shape == (3, 2, 4, 16) and lse.shape == (3, 4, 2)
    for b in (0, 2):  # the same keys stored contiguously give the same bits
        k = np.concatenate([kp[p] for p in table[b]])[None, :used[b]]
        v = np.concatenate([vp[p] for p in table[b]])[None, :used[b]]
        one = [save("pg1_q.npy", q[b:b + 1]), save("pg1_k.npy", k), save("pg1_v.npy", v)]
        o1, l1 = forward("--causal", files=one, out="pg1_o.npy", lse="pg1_l.npy")
        assert np.array_equal(np.load(o1)[0], out[b]) and np.array_equal(np.load(l1)[0], lse[b])
    assert (out[1] == 0).all() and (lse[1] == -np.inf).all()  # no key: empty rows
    check(o, l, "--causal", *pg, files=files, code=0)
    su2 = save("pg_su2.npy", np.array([4, 0, 9], np.int64))  # one key fewer: other results
    check(o, l, "--causal", "--block-table", bt, "--seqused-k", su2, files=files, code=1)
    # FlashInfer's CSR form of the same pages
    csr = ["--kv-indptr", save("pg_ip.npy", np.array([0, 2, 2, 5], np.int32)),
           "--kv-indices", save("pg_ix.npy", np.array([7, 2, 7, 11, 4], np.int32)),
           "--kv-last-page-len", save("pg_lp.npy", np.array([1, 0, 1], np.int32))]
    o2, l2 = forward("--causal", *csr, files=files, out="pg_o2.npy", lse="pg_l2.npy")
    assert np.array_equal(np.load(o2), out) and np.array_equal(np.load(l2), lse)
    check(o, l, "--causal", *csr, files=files, code=0)
    bad_bt = save("pg_bad.npy", np.array([[7, 2, 0], [0, 0, 0], [7, 12, 4]], np.int32))
    bad_lp = save("pg_lp0.npy", np.array([0, 0, 1], np.int32))
    for opts, says in ((["--block-table", bt], "--seqused-k"),
                       (["--block-table", bad_bt, "--seqused-k", su],
                        "pages->block_table[2][1] = 12 is not a page of k"),
                       ([*csr[:4], "--kv-last-page-len", bad_lp], "a last page holds 1 to 4"),
                       ([*pg, "--cu-seqlens-q", su, "--cu-seqlens-k", su], "goes with neither")):
        p = run("forward", *qkv_args(files), "--out", path("pg_x.npy"), *opts, code=2)
        assert says in p.stderr, (opts, p.stderr)
    # a contiguous cache with lengths (--seqused-k alone): the pages laid out in order
    kc = np.stack([np.concatenate([kp[p] for p in table[b]]) for b in range(3)])
    vc = np.stack([np.concatenate([vp[p] for p in table[b]]) for b in range(3)])
    cf = [files[0], save("pg_kc.npy", kc), save("pg_vc.npy", vc)]
    o3, l3 = forward("--causal", "--seqused-k", su, files=cf, out="pg_o3.npy", lse="pg_l3.npy")
    assert np.array_equal(np.load(o3), out) and np.array_equal(np.load(l3), lse)
    check(o, l, "--causal", "--seqused-k", su, files=cf, code=0)
    p = run("backward", *qkv_args(files), "--out", o, "--lse", l, "--dout", o, "--dq",
            path("pg_x.npy"), "--dk", path("pg_y.npy"), "--dv", path("pg_z.npy"), *pg, code=2)
    assert "forward only" in p.stderr and not os.path.exists(path("pg_x.npy"))


@test
def dropout_seed_offset():
    opts = ["--dropout", "0.3", "--seed", "77", "--offset", "5"]
    pair(opts, opts, ["--dropout", "0.3", "--seed", "78", "--offset", "5"])
    o, l = forward(*opts)
    check(o, l, "--dropout", "0.3", "--seed", "77", "--offset", "6", code=1)


@test
def layout_bhsd():
    o1, l1 = forward(out="o1.npy", lse="l1.npy")
    q, k, v = (np.load(f) for f in QKV)
    files = [save("qt.npy", q.transpose(0, 2, 1, 3).copy()), save("kt.npy", k.transpose(0, 2, 1, 3).copy()),
             save("vt.npy", v.transpose(0, 2, 1, 3).copy())]
    o2, l2 = forward("--layout", "bhsd", files=files, out="o2.npy", lse="l2.npy")
    assert np.array_equal(np.load(o1), np.load(o2).transpose(0, 2, 1, 3))
    assert np.array_equal(np.load(l1), np.load(l2))
    check(o2, l2, "--layout", "bhsd", files=files, code=0)
    p = run("check", *qkv_args(files), "--candidate-out", o2, code=2)  # read as bshd: shapes clash
    assert f"--q {files[0]}: 40 heads, not a multiple of the 56 of --k {files[1]}" in p.stderr, \
        p.stderr


@test
def threads_bitwise_equal():
    for be in ["tiled", "reference", "conventional"]:
        o1, _ = forward("--threads", "1", "--backend", be, "--causal", out="t1.npy", lse="tl1.npy")
        o3, _ = forward("--threads", "3", "--backend", be, "--causal", out="t3.npy", lse="tl3.npy")
        with open(o1, "rb") as a, open(o3, "rb") as b:
            assert a.read() == b.read(), be


@test
def backends_all_pass():
    for be in ["reference", "conventional", "tiled"]:
        o, l = forward("--backend", be, "--causal")
        check(o, l, "--causal", code=0)
    p = run("forward", *qkv_args(), "--out", path("x.npy"), "--backend", "cuda", code=3)
    assert "cuda" in p.stderr.lower()


@test
def isa():
    o, l = forward("--isa", "scalar")
    check(o, l, code=0)
    run("forward", *qkv_args(), "--out", path("x.npy"), "--isa", "neon", code=3)
    run("forward", *qkv_args(), "--out", path("x.npy"), "--isa", "sse", code=2)


@test
def isa_names():
    """Every ISA --help lists (the library's names, from its registry) is accepted by --isa:
    the run passes the check, or the ISA is refused as unavailable here with its name, never as
    an unknown spelling; an unknown one is refused with all of them listed."""
    names = re.search(r"--isa (\S+)", run("forward", "--help", code=0).stdout).group(1).split("|")
    assert {"scalar", "avx2", "avx512", "avx512bf16", "neon", "amx"} <= set(names), names
    for name in names:
        p = run("forward", *qkv_args(), "--out", path("x.npy"), "--lse", path("xl.npy"),
                "--isa", name)
        assert p.returncode in (0, 3), (name, p.returncode, p.stderr)
        if p.returncode == 0:
            check(path("x.npy"), path("xl.npy"), code=0)
        else:
            assert name in p.stderr, (name, p.stderr)
    p = run("forward", *qkv_args(), "--out", path("x.npy"), "--isa", "sse", code=2)
    assert all(name in p.stderr for name in names), p.stderr


@test
def every_dtype_numpy_wrote():
    for dt in [np.float16, np.float32, np.float64]:
        files = inputs(dtype=dt, prefix=np.dtype(dt).name)
        o, l = forward(files=files, out="od.npy", lse="ld.npy")
        assert np.load(o).dtype == dt
        assert np.load(l).dtype == (np.float64 if dt == np.float64 else np.float32)
        check(o, l, files=files, code=0)


@test
def bf16_as_uint16():
    def to_bf16(a):  # round to nearest even, as uint16 bit patterns
        u = a.astype(np.float32).view(np.uint32)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    files = [save(n, to_bf16(np.load(f))) for n, f in zip(["qb.npy", "kb.npy", "vb.npy"], QKV)]
    p = run("forward", *qkv_args(files), "--out", path("ob.npy"), code=2)
    assert "--bf16" in p.stderr
    o, l = forward("--bf16", files=files, out="ob.npy", lse="lb.npy")
    assert np.load(o).dtype == np.uint16
    out = (np.load(o).astype(np.uint32) << 16).view(np.float32)
    assert np.all(np.isfinite(out)) and np.abs(out).max() < 10
    check(o, l, "--bf16", files=files, code=0)


FP8 = {"e4m3": (4, 3), "e5m2": (5, 2)}  # exponent and mantissa bits (OCP formats)


def fp8_codes(fmt, shape):
    """Random FP8 codes (uint8, what --fp8 reads) of magnitude 1/8 to 8: no NaN or inf."""
    e_bits, m_bits = FP8[fmt]
    bias = (1 << (e_bits - 1)) - 1
    sign, e, m = (RNG.integers(0, 2, shape), RNG.integers(bias - 3, bias + 3, shape),
                  RNG.integers(0, 1 << m_bits, shape))
    return (sign << 7 | e << m_bits | m).astype(np.uint8)


def fp8_values(fmt, codes):
    """What finite FP8 codes stand for, written from the formats' definition."""
    e_bits, m_bits = FP8[fmt]
    bias = (1 << (e_bits - 1)) - 1
    c = codes.astype(np.int64)
    e, m = c >> m_bits & ((1 << e_bits) - 1), (c & ((1 << m_bits) - 1)) / (1 << m_bits)
    mag = np.where(e == 0, m * 2.0 ** (1 - bias), (1 + m) * 2.0 ** (e - bias))
    return np.where(c >> 7, -mag, mag)


def descaled(x, d):
    """x times its descale: one factor, or (B, Hk) (query head h: kv head h // group)."""
    d = np.asarray(d, np.float64)
    return x * (np.repeat(d, x.shape[2] // d.shape[1], 1)[:, None, :, None] if d.ndim else d)


def np_attention(q, k, v):
    g = q.shape[2] // k.shape[2]
    s = np.einsum("bihd,bjhd->bhij", q, np.repeat(k, g, 2)) / np.sqrt(q.shape[3])
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhij,bjhd->bihd", p / p.sum(-1, keepdims=True), np.repeat(v, g, 2))


def fp8_case(fmt, per_head, name):
    """FP8 input files, their --fp8 and --descale options, and O in float64 by numpy."""
    codes = [fp8_codes(fmt, s) for s in ((2, 9, 4, 16), (2, 13, 2, 16), (2, 13, 2, 16))]
    ds = [RNG.uniform(0.25, 4, (2, 2) if per_head else ()).astype(np.float32) for _ in "qkv"]
    files = [save(f"{name}_{x}.npy", c) for x, c in zip("qkv", codes)]
    opts = ["--fp8", fmt]
    for x, d in zip("qkv", ds):
        opts += [f"--descale-{x}", save(f"{name}_d{x}.npy", d)]
    want = np_attention(*(descaled(fp8_values(fmt, c), d) for c, d in zip(codes, ds)))
    return files, opts, want


def bf16_values(a):
    return (a.astype(np.uint32) << 16).view(np.float32)


@test
def fp8_forward_equals_numpy():
    """--fp8 reads uint8 codes, or what np.save writes for ml_dtypes' float8_e4m3fn ('<V1')
    and float8_e5m2 ('<f1'); O is attention on the descaled values: the reference's f64 to
    1e-12, the tiled default (bf16) to bf16's precision."""
    for fmt, per_head in (("e4m3", False), ("e5m2", True)):
        files, opts, want = fp8_case(fmt, per_head, f"f8{fmt}")
        o, l = forward(*opts, "--backend", "reference", "--out-dtype", "f64", files=files,
                       out="f8o.npy", lse="f8l.npy")
        assert np.load(o).dtype == np.load(l).dtype == np.float64
        assert np.abs(np.load(o) - want).max() <= 1e-12 * np.abs(want).max()
        o, _ = forward(*opts, "--backend", "tiled", files=files, out="f8t.npy", lse="f8tl.npy")
        bf = np.load(o)
        assert bf.dtype == np.uint16  # bf16, FlashAttention-3's default
        assert np.abs(bf16_values(bf) - want).max() <= 0.02 * np.abs(want).max()
        ml = []
        for f in files:
            with open(f, "rb") as src, open(f + ".ml.npy", "wb") as dst:
                dst.write(src.read().replace(b"'|u1'", b"'<V1'" if fmt == "e4m3" else b"'<f1'"))
            ml.append(f + ".ml.npy")
        o, _ = forward(*opts, "--backend", "tiled", files=ml, out="f8m.npy", lse="f8ml.npy")
        assert np.array_equal(np.load(o), bf)
        p = run("forward", *qkv_args(files), "--out", path("f8x.npy"), code=2)
        assert "--fp8" in p.stderr and not os.path.exists(path("f8x.npy"))


@test
def fp8_check_against_the_fp8_yardstick():
    files, opts, _ = fp8_case("e4m3", True, "f8c")
    o, l = forward(*opts, "--backend", "tiled", files=files, out="f8co.npy", lse="f8cl.npy")
    p = check(o, l, *opts, "--bf16", files=files, code=0)
    assert "yardstick conventional e4m3 -> bf16" in p.stdout, p.stdout
    o32, l32 = forward(*opts, "--out-dtype", "f32", files=files, out="f8c32.npy",
                       lse="f8cl32.npy")
    assert "-> f32" in check(o32, l32, *opts, files=files, code=0).stdout
    dv = opts.index("--descale-v") + 1
    wrong = opts[:dv] + [save("f8c_dv2.npy", 2 * np.load(opts[dv]))] + opts[dv + 1:]
    bad, bad_l = forward(*wrong, "--backend", "tiled", files=files, out="f8cb.npy",
                         lse="f8cbl.npy")
    check(bad, bad_l, *opts, "--bf16", files=files, code=1)
    p = run("backward", *qkv_args(files), *opts, "--out", o32, "--lse", l32, "--dout", o32,
            "--dq", path("f8dq.npy"), "--dk", path("f8dk.npy"), "--dv", path("f8dv.npy"), code=3)
    assert "forward only" in p.stderr and not os.path.exists(path("f8dq.npy"))
    p = run("check", "--q", QKV[0], "--k", files[1], "--v", files[2], "--fp8", "e4m3",
            "--candidate-out", QKV[0], code=2)  # an FP8 K/V under f32 Q: no yardstick
    assert "FP8 K/V" in p.stderr


def ggml_blocks(fmt, n):
    """n random blocks of ggml's q8_0 or q4_0 (bytes, n x 34 or 18) and their values (n x 32,
    f32), from the format's definition: an f16 scale d, then int8 codes q (value d q) or 16
    bytes of nibbles (element j < 16 the low nibble u of byte j, j >= 16 the high nibble of
    byte j - 16; value d (u - 8))."""
    d = (RNG.uniform(0.5, 2, n) * 2.0 ** RNG.integers(-6, 0, n)).astype(np.float16)
    if fmt == "q8_0":
        q = RNG.integers(-128, 128, (n, 32)).astype(np.int8)
        codes, vals = q.view(np.uint8), q.astype(np.float32)
    else:
        u = RNG.integers(0, 16, (n, 32)).astype(np.uint8)
        codes, vals = u[:, :16] | (u[:, 16:] << 4), u.astype(np.float32) - 8
    return (np.concatenate([d.view(np.uint8).reshape(n, 2), codes], axis=1),
            d.astype(np.float32)[:, None] * vals)


@test
def block_cache_files():
    """--k-dtype q8_0 --v-dtype q4_0 read uint8 files of ggml blocks (last dim a row's bytes):
    forward gives the bits of the f32 files of their values (decode: Sq 1, GQA 4; and tiles);
    check judges against the dequantized values: the candidate passes, a 1% error fails; bad
    files and names are refused naming the option, nothing written."""
    b, s, h, d = 2, 300, 2, 64
    kb, kv = ggml_blocks("q8_0", b * s * h * d // 32)
    vb, vv = ggml_blocks("q4_0", b * s * h * d // 32)
    k8 = save("qk8.npy", kb.reshape(b, s, h, d // 32 * 34))
    v4 = save("qv4.npy", vb.reshape(b, s, h, d // 32 * 18))
    kf, vf = save("qkf.npy", kv.reshape(b, s, h, d)), save("qvf.npy", vv.reshape(b, s, h, d))
    blocks = ["--k-dtype", "q8_0", "--v-dtype", "q4_0"]
    for sq, hq in ((1, 8), (40, 2)):
        q = save("qq.npy", RNG.standard_normal((b, sq, hq, d)).astype(np.float32))
        o, l = forward(*blocks, files=[q, k8, v4], out="qob.npy", lse="qlb.npy")
        of, lf = forward(files=[q, kf, vf], out="qof.npy", lse="qlf.npy")
        assert same_bits([o, l], [of, lf]), sq
        p = check(o, l, *blocks, files=[q, k8, v4], code=0)
        assert "PASS" in p.stdout
        bad = np.load(o)
        bad[0, 0, 0] *= 1.01
        check(save("qobad.npy", bad), l, *blocks, files=[q, k8, v4], code=1)
    for files, opts, why in [
            ([q, k8, v4], ["--k-dtype", "q4_0", "--v-dtype", "q4_0"], "not whole q4_0 blocks"),
            ([q, kf, v4], blocks, "not a uint8 array"),
            ([q, k8, vf], ["--k-dtype", "q8_0"], "--v " + vf),
            ([q, k8, v4], ["--k-dtype", "q5_0"], "expected q8_0 or q4_0")]:
        p = run("forward", *qkv_args(files), *opts, "--out", path("qx.npy"), code=2)
        assert why in p.stderr, (opts, p.stderr)
        assert not os.path.exists(path("qx.npy"))
    p = run("backward", *qkv_args([q, k8, v4]), *blocks, "--out", o, "--lse", l, "--dout", o,
            "--dq", path("qdq.npy"), "--dk", path("qdk.npy"), "--dv", path("qdv.npy"), code=2)
    assert "--k-dtype" in p.stderr and not os.path.exists(path("qdq.npy"))


@test
def fp8_bad_descale_files():
    files, opts, _ = fp8_case("e5m2", False, "f8b")
    dv = opts.index("--descale-v") + 1
    for bad, why in [(np.float32(0), "finite and > 0"), (np.float32(np.nan), "finite and > 0"),
                     (np.array([1, -1, 1, 1], np.float32).reshape(2, 2), "layout"),
                     (np.ones(3, np.float32), "shape"), (np.ones((2, 2, 1), np.float32), "shape"),
                     (np.ones(1, np.int32), "floats")]:
        f = save("f8b_bad.npy", bad)
        p = run("forward", *qkv_args(files), *opts[:dv], f, *opts[dv + 1:], "--out",
                path("f8b_o.npy"), "--lse", path("f8b_l.npy"), code=2)
        assert f in p.stderr and why in p.stderr, (bad, p.stderr)
        assert ("--descale-v" in p.stderr or why == "floats") and not temps_in(TMP)
        assert not os.path.exists(path("f8b_o.npy")) and not os.path.exists(path("f8b_l.npy"))
    run("forward", *qkv_args(files), *opts, "--out", path("f8b_o.npy"), "--fp8", "e3m4", code=2)
    run("forward", *qkv_args(files), *opts, "--out", path("f8b_o.npy"), "--out-dtype", "e4m3",
        code=2)
    run("check", *qkv_args(files), *opts, "--candidate-out", QKV[0], "--out-dtype", "f32",
        code=2)  # check takes --dtype


@test
def backward_and_gradient_check():
    o, l = forward("--causal")
    dout = save("do.npy", RNG.standard_normal((2, 40, 4, 16)).astype(np.float32))
    grads = [path("dq.npy"), path("dk.npy"), path("dv.npy")]
    run("backward", *qkv_args(), "--out", o, "--lse", l, "--dout", dout, "--dq", grads[0],
        "--dk", grads[1], "--dv", grads[2], "--causal", code=0)
    cands = ["--candidate-dq", grads[0], "--candidate-dk", grads[1], "--candidate-dv", grads[2]]
    run("check", *qkv_args(), "--dout", dout, *cands, "--causal", code=0)
    dq = np.load(grads[0])
    dq[1, 7, 2, 3] += 1e-3 * np.abs(dq).max()  # one element off
    bad = save("dq_bad.npy", dq)
    p = run("check", *qkv_args(), "--dout", dout, "--candidate-dq", bad, "--causal", "--json", code=1)
    rep = json.loads(p.stdout)
    w = rep["tensors"][0]["worst_index"]
    assert rep["verdict"] == "FAIL" and (w["batch"], w["seq"], w["head"], w["dim"]) == (1, 7, 2, 3)
    p = run("check", *qkv_args(), "--candidate-dq", grads[0], code=2)
    assert "--dout" in p.stderr
    run("backward", *qkv_args(), "--out", o, "--lse", l, "--dout", dout, "--dq", grads[0], code=2)


@test
def tolerance_options_and_json():
    o, l = forward("--backend", "tiled")
    p = check(o, l, "--json", code=0)
    rep = json.loads(p.stdout)
    assert rep["verdict"] == "PASS" and rep["profile"] == "flashattn"
    t = {x["name"]: x for x in rep["tensors"]}
    assert set(t) == {"out", "lse"} and t["out"]["rule"].startswith("flash:")
    for key in ["max_abs", "rel_error", "nmse", "worst_index", "worst_candidate",
                "worst_reference", "nonfinite_mismatches", "bound", "baseline_error"]:
        assert key in t["out"], key
    assert "max_rel" not in t["out"] and rep["hint"] is None
    p = check(o, l, "--atol", "1e-12", "--json", code=1)
    assert json.loads(p.stdout)["tensors"][0]["rule"].startswith("explicit")
    check(o, l, "--atol", "1e-4", "--rtol", "1e-4", code=0)
    run("check", *qkv_args(), "--candidate-out", o, "--atol", "-1", code=2)


@test
def text_report():
    o, l = forward()
    p = check(o, l, code=0)
    assert "verdict: PASS" in p.stdout and "rule: flash" in p.stdout and "worst" in p.stdout


# ------------------------------------------------------------------ profiles

@test
def profile_fa2_empty_row_lse_plus_inf():
    files = inputs(sq=60, sk=30, prefix="e")  # bottom-right causal: rows 0..29 see no key
    o, l = forward("--causal", files=files)
    lse = np.load(l)
    assert np.all(np.isneginf(lse[:, :, :30])) and np.all(np.load(o)[:, :30] == 0)
    check(o, l, "--causal", files=files, code=0)
    check(o, l, "--causal", "--profile", "fa3", files=files, code=0)
    lse[np.isneginf(lse)] = np.inf  # what FlashAttention-2 writes
    l2 = save("l_fa2.npy", lse)
    check(o, l2, "--causal", "--profile", "fa2", files=files, code=0)
    check(o, l2, "--causal", files=files, code=1)


@test
def profile_flashinfer_lse_base2():
    o, l = forward("--causal")
    l2 = save("l_b2.npy", (np.load(l).astype(np.float64) / np.log(2)).astype(np.float32))
    check(o, l2, "--causal", "--profile", "flashinfer", code=0)
    check(o, l2, "--causal", code=1)


@test
def profile_flashinfer_alibi_before_softcap():
    slopes = save("slopes.npy", np.array([0.5, 0.25, 0.125, 0.0625], np.float32))
    o, l = forward("--alibi", slopes, "--softcap", "2", "--profile", "flashinfer")  # LSE in base 2
    check(o, l, "--alibi", slopes, "--softcap", "2", "--profile", "flashinfer", code=0)
    p = run("check", *qkv_args(), "--candidate-out", o, "--alibi", slopes, "--softcap", "2")
    assert p.returncode == 1  # the default order (softcap, then ALiBi) differs


@test
def profile_pytorch_top_left():
    o, l = forward("--causal", "--align", "top-left")
    check(o, l, "--causal", "--profile", "pytorch", code=0)
    check(o, l, "--causal", "--profile", "fa2", code=1)


@test
def profile_window_as_key_count():
    for prof, align in [("xformers", "top-left"), ("ggml", "bottom-right")]:
        o, l = forward("--window", "4,0", "--align", align)
        p = run("check", *qkv_args(), "--candidate-out", o, "--window", "5", "--profile", prof)
        assert p.returncode == 0, prof
        p = run("check", *qkv_args(), "--candidate-out", o, "--window", "5", "--align", align)
        assert p.returncode == 1, prof  # the default profile reads 5 as a left bound
    p = run("check", *qkv_args(), "--candidate-out", o, "--candidate-lse", l, "--profile", "ggml", code=2)
    assert "no LSE" in p.stderr
    run("check", *qkv_args(), "--candidate-out", o, "--profile", "nope", code=2)


# ------------------------------------------------------------------ bias and keep-masks

def allowed_keys(sq, sk, left=-1, right=0):
    """Bottom-right aligned window (left, right) as a (Sq, Sk) bool array (-1: unbounded)."""
    i, j = np.arange(sq)[:, None] + sk - sq, np.arange(sk)[None, :]
    return (j <= i + right if right >= 0 else j >= 0) & (j >= i - left if left >= 0 else j >= 0)


def same_bits(a, b):
    return all(open(x, "rb").read() == open(y, "rb").read() for x, y in zip(a, b))


@test
def attn_mask_bool_causal_is_causal():
    # np.tril below the diagonal Sk - Sq: the bottom-right causal mask, bit for bit on the
    # tiled backend; as a float 0/1 array with --mask-kind keep, and as (B, H, Sq, Sk), too
    tril = np.tril(np.ones((40, 56), bool), 16)
    assert (tril == allowed_keys(40, 56)).all()
    want = forward("--causal", "--backend", "tiled", out="mc_o.npy", lse="mc_l.npy")
    for name, a, opts in (("mc_m.npy", tril, []),
                          ("mc_f.npy", tril.astype(np.float32), ["--mask-kind", "keep"]),
                          ("mc_4.npy", np.broadcast_to(tril, (2, 4, 40, 56)).copy(), [])):
        got = forward("--attn-mask", save(name, a), *opts, "--backend", "tiled", "--threads", "3",
                      out="mc_o2.npy", lse="mc_l2.npy")
        assert same_bits(want, got), name
    check(*got, "--attn-mask", save("mc_m.npy", tril), code=0)
    check(*got, code=1)


@test
def bias_of_minus_inf_is_a_window():
    # a float bias of 0 inside the window (5, 2) and -inf outside it: the window's result, bit
    # for bit on the reference; within the f32 rule on the tiled backend, whose arithmetic with
    # a bias differs (the bias is added to the scaled score)
    w = save("bw.npy", np.where(allowed_keys(40, 56, 5, 2), 0, -np.inf).astype(np.float32))
    for be in ["reference", "tiled"]:
        want = forward("--window", "5,2", "--backend", be, out="bw_o.npy", lse="bw_l.npy")
        got = forward("--bias", w, "--backend", be, out="bw_o2.npy", lse="bw_l2.npy")
        assert be != "reference" or same_bits(want, got)
        check(*got, "--window", "5,2", code=0)
        check(*want, "--bias", w, code=0)
        check(*got, "--window", "5,3", code=1)


@test
def bias_broadcasts_like_sdpa():
    # (1, 1, Sq, Sk), (Sq, Sk) and (1, Sq, Sk) give what the bias repeated to (B, H, Sq, Sk) gives
    b = RNG.standard_normal((40, 56)).astype(np.float32)
    full = forward("--bias", save("bb4.npy", np.broadcast_to(b, (2, 4, 40, 56)).copy()),
                   "--backend", "tiled", out="bb_o.npy", lse="bb_l.npy")
    for name, a in (("bb1.npy", b[None, None]), ("bb2.npy", b), ("bb3.npy", b[None])):
        got = forward("--bias", save(name, a), "--backend", "tiled", out="bb_o2.npy",
                      lse="bb_l2.npy")
        assert same_bits(full, got), name
    # per head: head 2 alone differs
    bh = np.broadcast_to(b, (2, 4, 40, 56)).copy()
    bh[:, 2] += 1.5 * np.eye(40, 56, 16, dtype=np.float32)
    got = forward("--bias", save("bbh.npy", bh), out="bb_o3.npy", lse="bb_l3.npy")
    o1, o2 = np.load(full[0]), np.load(got[0])
    assert (o1[:, :, [0, 1, 3]] == o2[:, :, [0, 1, 3]]).all() and (o1[:, :, 2] != o2[:, :, 2]).any()
    check(*got, "--bias", path("bbh.npy"), code=0)
    check(*got, "--bias", path("bb4.npy"), code=1)


@test
def check_with_a_mask_and_its_profiles():
    # a keep-mask with a fully masked row: the tiled candidate PASSes with the mask, FAILs
    # without; a profile whose empty rows are undefined (pytorch) does not compare that row
    m = np.tril(np.ones((2, 1, 40, 56), bool), 16)
    m[1, 0, 7] = False
    mask = save("cm_m.npy", m)
    pair(["--backend", "tiled", "--attn-mask", mask], ["--attn-mask", mask], [])
    o, l = forward("--backend", "tiled", "--attn-mask", mask, out="cm_o.npy", lse="cm_l.npy")
    assert (np.load(o)[1, 7] == 0).all() and np.isneginf(np.load(l)[1, :, 7]).all()
    out = np.load(o)
    out[1, 7] = np.nan
    junk = save("cm_junk.npy", out)
    # (not "flashattn": under CI's valgrind stage libtool's execute mode swaps an argument that
    # names a program of the build, ./flashattn, for its binary's path)
    for prof, code in (("pytorch", 0), ("xformers", 0), ("fa3", 1), ("fa2", 1)):
        p = run("check", *qkv_args(), "--candidate-out", junk, "--attn-mask", mask, "--profile",
                prof, "--align", "bottom-right")
        assert p.returncode == code, (prof, p.stdout, p.stderr)
    # the gradients, dbias among them: PASS, and one element off FAILs
    b = save("cm_b.npy", np.where(m, RNG.standard_normal(m.shape), -np.inf).astype(np.float32))
    o, l = forward("--bias", b, out="cm_o.npy", lse="cm_l.npy")
    dout = save("cm_do.npy", RNG.standard_normal((2, 40, 4, 16)).astype(np.float32))
    g = [path(f"cm_{n}.npy") for n in ("dq", "dk", "dv", "db")]
    run("backward", *qkv_args(), "--out", o, "--lse", l, "--dout", dout, "--dq", g[0], "--dk",
        g[1], "--dv", g[2], "--bias", b, "--dbias", g[3], code=0)
    db = np.load(g[3])
    assert db.shape == (2, 1, 40, 56) and db.dtype == np.float32 and (db[~m] == 0).all()
    cands = ["--candidate-dq", g[0], "--candidate-dk", g[1], "--candidate-dv", g[2],
             "--candidate-dbias", g[3]]
    run("check", *qkv_args(), "--dout", dout, *cands, "--bias", b, code=0)
    db[0, 0, 3, 4] += 1e-3 * np.abs(db).max()
    p = run("check", *qkv_args(), "--dout", dout, "--candidate-dbias", save("cm_db2.npy", db),
            "--bias", b, "--json", code=1)
    t = json.loads(p.stdout)["tensors"][0]  # in the file's (B, H, Sq, Sk) order
    assert t["name"] == "dbias" and list(t["worst_index"].items()) == [
        ("batch", 0), ("head", 0), ("query", 3), ("key", 4)], t["worst_index"]


@test
def dbias_against_finite_differences():
    # f64, B 2, Sq 3, Sk 5, a (H, Sq, Sk) bias: dbias (summed over the batch, in the file's
    # shape) against central differences of loss = sum(O * dO), one entry at a time
    files = inputs(sq=3, sk=5, hq=2, hk=1, d=4, dtype=np.float64, prefix="fd_")
    bias = RNG.standard_normal((2, 3, 5))
    dout = RNG.standard_normal((2, 3, 2, 4))
    opts = ["--causal", "--softcap", "2"]
    o, l = forward("--bias", save("fd_b.npy", bias), *opts, files=files, out="fd_o.npy",
                   lse="fd_l.npy")
    g = [path(f"fd_{n}.npy") for n in ("dq", "dk", "dv", "db")]
    run("backward", *qkv_args(files), "--out", o, "--lse", l, "--dout", save("fd_do.npy", dout),
        "--dq", g[0], "--dk", g[1], "--dv", g[2], "--bias", path("fd_b.npy"), "--dbias", g[3],
        *opts, code=0)
    db = np.load(g[3])
    assert db.shape == (2, 3, 5) and db.dtype == np.float64

    def loss(b):
        o, _ = forward("--bias", save("fd_b2.npy", b), *opts, files=files, out="fd_o2.npy",
                       lse="fd_l2.npy")
        return (np.load(o) * dout).sum()
    for at in [(0, 2, 1), (1, 1, 0), (1, 2, 4), (0, 0, 0)]:
        e = np.zeros_like(bias)
        e[at] = 1e-6
        fd = (loss(bias + e) - loss(bias - e)) / 2e-6
        assert abs(fd - db[at]) <= 1e-6 * max(abs(fd), 1e-3), (at, fd, db[at])
    assert db[1, 2, 4] != 0 and (db[:, 0, 3:] == 0).all()  # masked keys (causal): no gradient


@test
def bias_place_and_slopes_from_the_profile():
    # ggml's mask enters after softcap and is scaled by the ALiBi slopes: --profile ggml sets
    # both, as --bias-place after-softcap --bias-by-slope do
    slopes = save("gg_s.npy", np.array([0.5, 0.25, 0.125, 0.0625], np.float32))
    b = save("gg_b.npy", (RNG.standard_normal((40, 56)) * 3).astype(np.float32))
    opts = ["--bias", b, "--softcap", "2", "--alibi", slopes, "--backend", "tiled"]
    want = forward(*opts, "--bias-place", "after-softcap", "--bias-by-slope", out="gg_o.npy",
                   lse="gg_l.npy")
    got = forward(*opts, "--profile", "ggml", out="gg_o2.npy", lse="gg_l2.npy")
    assert np.array_equal(np.load(want[0]), np.load(got[0]))
    plain = forward(*opts, out="gg_o3.npy", lse="gg_l3.npy")
    assert not np.array_equal(np.load(plain[0]), np.load(got[0]))
    p = run("check", *qkv_args(), "--candidate-out", got[0], *opts[:-2], "--profile", "ggml")
    assert p.returncode == 0, p.stdout
    p = run("check", *qkv_args(), "--candidate-out", got[0], *opts[:-2], "--profile", "ggml",
            "--bias-place", "after-scale")  # an explicit flag overrides the profile
    assert p.returncode == 1, p.stdout


# ------------------------------------------------------------------ block masks

def block_lists(seed, b=1, h=4, nq=3, nk=7, density=0.5, full=False, dtype=np.int32):
    """A random block mask of nq x nk blocks (each key block listed with probability density,
    in random order; with full, about half of them in the full lists; entries past a row's
    count out of range, never read): its arrays (counts, indices, and the full ones) and the
    (b, h, nq, nk) bool of the blocks listed."""
    rng = np.random.default_rng(seed)
    listed = rng.random((b, h, nq, nk)) < density
    in_full = listed & (rng.random(listed.shape) < 0.5) if full else np.zeros_like(listed)
    arrays = []
    for part in (listed & ~in_full, in_full)[:1 + full]:
        idx = np.full(part.shape, nk + 3, dtype)
        for at in np.ndindex(*part.shape[:3]):
            cols = rng.permutation(np.flatnonzero(part[at]))
            idx[at][:len(cols)] = cols
        arrays += [part.sum(-1).astype(dtype), idx]
    return arrays, listed


def block_mask_opts(prefix, arrays, size="16,8"):
    names = ("--kv-num-blocks", "--kv-block-indices", "--full-kv-num-blocks",
             "--full-kv-block-indices")
    opts = ["--block-size", size]
    for i, (opt, a) in enumerate(zip(names, arrays)):
        opts += [opt, save(f"{prefix}{i}.npy", a)]
    return opts


@test
def block_mask_is_its_dense_mask():
    # a block mask of 16 x 8 blocks (batch broadcast, int64 full lists) gives the bits of the
    # dense keep-mask it stands for on the tiled backend, forward and backward; check PASSes
    # those results with the block mask and FAILs them without (profile flex: top-left causal)
    arrays, listed = block_lists(3, full=True, dtype=np.int64)
    assert arrays[2].sum() > 0 and arrays[0].sum() > 0
    bm = block_mask_opts("bm_", arrays)
    dense = np.repeat(np.repeat(listed, 16, axis=2), 8, axis=3)[:, :, :40, :56]
    mask = ["--attn-mask", save("bm_dense.npy", dense)]
    opts = ["--causal", "--profile", "flex", "--backend", "tiled"]
    want = forward(*opts, *mask, out="bm_o.npy", lse="bm_l.npy")
    got = forward(*opts, *bm, out="bm_o2.npy", lse="bm_l2.npy")
    assert same_bits(want, got)
    dout = save("bm_do.npy", RNG.standard_normal((2, 40, 4, 16)).astype(np.float32))
    grads = []
    for name, m in (("w", mask), ("g", bm)):
        g = [path(f"bm_{name}{n}.npy") for n in ("dq", "dk", "dv")]
        run("backward", *qkv_args(), "--out", got[0], "--lse", got[1], "--dout", dout, "--dq",
            g[0], "--dk", g[1], "--dv", g[2], *opts, *m, code=0)
        grads.append(g)
    assert same_bits(*grads)
    cands = ["--candidate-out", got[0], "--candidate-lse", got[1], "--dout", dout,
             "--candidate-dq", grads[1][0], "--candidate-dk", grads[1][1], "--candidate-dv",
             grads[1][2]]
    run("check", *qkv_args(), *cands, *opts[:3], *bm, code=0)
    p = run("check", *qkv_args(), *cands, *opts[:3], "--json", code=1)
    assert all(t["verdict"] == "FAIL" for t in json.loads(p.stdout)["tensors"]), p.stdout


# ------------------------------------------------------------------ other subcommands, usage, bad input

@test
def info_and_help():
    p = run("info", code=0)
    assert "cpu features:" in p.stdout and "backend=" in p.stdout and "CUDA:" in p.stdout
    assert "flashattn 0." in p.stdout
    for cmd in ["check", "forward", "backward", "info", "demo"]:
        p = run(cmd, "--help", code=0)
        assert "usage: flashattn " + cmd in p.stdout, cmd
    run("--help", code=0)
    run(code=2)
    run("frobnicate", code=2)
    run("info", "extra", code=2)


@test
def demo_runs():
    p = run("demo", "--seqlens", "64,96", "--heads", "1", "--headdim", "16", "--dtype", "bf16",
            "--causal", "--threads", "1", code=0)
    assert "conv err" in p.stdout and "\n     64 |" in p.stdout and "\n     96 |" in p.stdout
    run("demo", "--dtype", "f8", code=2)


@test
def usage_errors():
    run("forward", "--k", QKV[1], "--v", QKV[2], "--out", path("x.npy"), code=2)  # no --q
    run("forward", *qkv_args(), code=2)                                          # no --out
    run("forward", *qkv_args(), "--out", path("x.npy"), "--frob", code=2)
    run("forward", *qkv_args(), "--out", path("x.npy"), "--candidate-out", "x", code=2)
    run("forward", *qkv_args(), "--out", path("x.npy"), "--dropout", "1.5", code=2)
    run("forward", *qkv_args(), "--out", path("x.npy"), "--window", "a,b", code=2)
    run("forward", *qkv_args(), "--out", path("x.npy"), "--layout", "sbhd", code=2)
    run("forward", *qkv_args(), "--out", path("x.npy"), "--threads", code=2)
    run("check", *qkv_args(), code=2)  # no candidate
    p = run("forward", *qkv_args(), "--out", path("x.npy"), "--causal", "--window", "3,2", code=2)
    assert "window_right" in p.stderr
    for bad in ["-5", " 5", "5x", "0x10"]:
        run("forward", *qkv_args(), "--out", path("x.npy"), "--seed", bad, code=2)
    run("check", *qkv_args(), "--candidate-out", QKV[0], "--dtype", "f8", code=2)
    p = run("check", "--help", code=0)
    assert "--backend" not in p.stdout and "--dtype" in p.stdout


@test
def bad_files():
    p = run("forward", "--q", path("missing.npy"), "--k", QKV[1], "--v", QKV[2], "--out", path("x.npy"), code=2)
    assert "missing.npy" in p.stderr
    raw = open(QKV[0], "rb").read()
    cases = {
        "trunc.npy": raw[: len(raw) - 10],
        "magic.npy": b"\x93NUMPX" + raw[6:],
        "dict.npy": raw.replace(b"'shape'", b"'shope'"),
        "short.npy": raw.replace(b"(2, 40, 4, 16)", b"(2, 41, 4, 16)"),  # more than the data
    }
    for name, data in cases.items():
        with open(path(name), "wb") as f:
            f.write(data)
        p = run("forward", "--q", path(name), "--k", QKV[1], "--v", QKV[2], "--out", path("x.npy"), code=2)
        assert name in p.stderr, (name, p.stderr)
    np.save(path("fortran.npy"), np.asfortranarray(np.load(QKV[0])))
    p = run("forward", "--q", path("fortran.npy"), "--k", QKV[1], "--v", QKV[2], "--out", path("x.npy"), code=2)
    assert "Fortran" in p.stderr
    np.save(path("int.npy"), np.zeros((2, 40, 4, 16), np.int32))
    run("forward", "--q", path("int.npy"), "--k", QKV[1], "--v", QKV[2], "--out", path("x.npy"), code=2)
    np.save(path("3d.npy"), np.zeros((2, 40, 64), np.float32))
    p = run("forward", "--q", path("3d.npy"), "--k", QKV[1], "--v", QKV[2], "--out", path("x.npy"), code=2)
    assert "4-D" in p.stderr
    # shapes that disagree: k with another head dim
    np.save(path("k8.npy"), np.zeros((2, 56, 2, 8), np.float32))
    p = run("forward", "--q", QKV[0], "--k", path("k8.npy"), "--v", QKV[2], "--out", path("x.npy"), code=2)
    assert f"--k {path('k8.npy')}: head dim 8, but --q {QKV[0]} has 16" in p.stderr, p.stderr
    o, _ = forward()
    np.save(path("o_short.npy"), np.load(o)[:, :10])
    p = run("check", *qkv_args(), "--candidate-out", path("o_short.npy"), code=2)
    assert "o_short.npy" in p.stderr


@test
def huge_declared_shape_refused_quickly():
    import time
    hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776, 1048576, 1, 1), }"
    hdr = hdr + " " * (63 - (10 + len(hdr)) % 64) + "\n"
    with open(path("big.npy"), "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + len(hdr).to_bytes(2, "little") + hdr.encode())
    t = time.time()
    p = run("forward", "--q", path("big.npy"), "--k", QKV[1], "--v", QKV[2], "--out", path("x.npy"), code=2)
    assert time.time() - t < 5 and "big.npy" in p.stderr


@test
def profile_empty_rows_not_compared():
    files = inputs(sq=60, sk=30, prefix="a")  # bottom-right causal: rows 0..29 see no key
    o, l = forward("--causal", files=files)
    lse = np.load(l)
    lse[np.isneginf(lse)] = -49993.98  # what FlashInfer writes there, say
    l2 = save("l_any.npy", lse)
    for prof in ["pytorch", "xformers"]:  # top-left by default: give the alignment used
        check(o, l2, "--causal", "--align", "bottom-right", "--profile", prof, files=files, code=0)
    check(o, l2, "--causal", files=files, code=1)  # the default profile wants -inf


@test
def profile_lse_round_trip_forward_backward():
    o, l = forward("--causal", "--profile", "flashinfer")
    lse2 = np.load(l)
    o_nat, l_nat = forward("--causal", out="on.npy", lse="ln.npy")
    assert np.allclose(lse2, np.load(l_nat) / np.log(2), rtol=1e-6)  # written in base 2
    dout = save("do2.npy", RNG.standard_normal((2, 40, 4, 16)).astype(np.float32))
    g = [path("fq.npy"), path("fk.npy"), path("fv.npy")]
    run("backward", *qkv_args(), "--out", o, "--lse", l, "--dout", dout, "--dq", g[0], "--dk", g[1],
        "--dv", g[2], "--causal", "--profile", "flashinfer", code=0)  # read back from base 2
    run("check", *qkv_args(), "--dout", dout, "--candidate-dq", g[0], "--candidate-dk", g[1],
        "--candidate-dv", g[2], "--causal", code=0)


@test
def dtype_of_the_kernel():
    def bf16_round(a):
        u = a.astype(np.float32).view(np.uint32)
        return ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
    files = [save(n, bf16_round(np.load(f))) for n, f in zip(["q16.npy", "k16.npy", "v16.npy"], QKV)]
    o, l = forward(files=files, out="o32.npy", lse="l32.npy")
    o16 = save("o16as32.npy", bf16_round(np.load(o)))  # a bf16 kernel's output, saved as f32
    run("check", *qkv_args(files), "--candidate-out", o16, code=1)  # held to the f32 yardstick
    run("check", *qkv_args(files), "--candidate-out", o16, "--dtype", "bf16", code=0)


@test
def json_escapes_file_names():
    o, _ = forward()
    odd = path('we"ird\\name.npy')
    shutil.copy(o, odd)
    p = run("check", *qkv_args(), "--candidate-out", odd, "--json", code=0)
    assert json.loads(p.stdout)["tensors"][0]["file"] == odd


@test
def explicit_rule_needs_no_yardstick():
    o, _ = forward()
    p = run("check", *qkv_args(), "--candidate-out", o, "--atol", "1e-5", "--json", code=0)
    t = json.loads(p.stdout)["tensors"][0]
    assert t["baseline_error"] == 0 and t["rule"].startswith("explicit")


# ------------------------------------------------------------------ check's messages (issue 35)

@test
def check_hints_at_dtype_for_a_wider_candidate():
    """An f32 kernel's output saved as f64 FAILs against the f64 yardstick: the report says to
    pass --dtype f32, which PASSes it; the rule line names the yardstick's dtype and the
    floor's, the coarser of the file's and the yardstick's (f32 under --dtype f32)."""
    o, _ = forward()
    o64 = save("wide_o64.npy", np.load(o).astype(np.float64))
    p = run("check", *qkv_args(), "--candidate-out", o64, code=1)
    assert f"hint: --candidate-out {o64} holds f64 but the inputs hold f32" in p.stdout, p.stdout
    assert "pass --dtype f32" in p.stdout and "(conventional f64 error)" in p.stdout, p.stdout
    p = run("check", *qkv_args(), "--candidate-out", o64, "--json", code=1)
    assert "--dtype f32" in json.loads(p.stdout)["hint"]
    p = run("check", *qkv_args(), "--candidate-out", o64, "--dtype", "f32", code=0)
    assert "hint" not in p.stdout, p.stdout
    assert "(conventional f32 error)" in p.stdout and "(f32 floor)" in p.stdout, p.stdout
    # no hint where the candidate is of the inputs' dtype, or under an explicit rule
    bad = np.load(o)
    bad[0, 0, 0, 0] += 1
    p = run("check", *qkv_args(), "--candidate-out", save("wide_bad.npy", bad), code=1)
    assert "hint" not in p.stdout, p.stdout
    p = run("check", *qkv_args(), "--candidate-out", o64, "--atol", "1e-12", code=1)
    assert "hint" not in p.stdout, p.stdout


@test
def check_refuses_mixed_input_dtypes():
    """q, k, v (and dout) of one dtype, but for an f16 K/V cache under f32 q: the message
    names the file at fault and the one it disagrees with, with both dtypes."""
    q, k, v = QKV
    k64 = save("mix_k64.npy", np.load(k).astype(np.float64))
    v64 = save("mix_v64.npy", np.load(v).astype(np.float64))
    o, _ = forward()
    for files, want in (([q, k64, v], f"--k {k64} holds f64, but --q {q} holds f32"),
                        ([q, k, v64], f"--v {v64} holds f64, but --k {k} holds f32"),
                        ([q, k64, v64], f"--k {k64} holds f64, but --q {q} holds f32")):
        p = run("check", *qkv_args(files), "--candidate-out", o, code=2)
        assert want in p.stderr, (want, p.stderr)
    d64 = save("mix_do.npy", RNG.standard_normal((2, 40, 4, 16)))
    p = run("check", *qkv_args(), "--dout", d64, "--candidate-dq", o, code=2)
    assert f"--dout {d64} holds f64, but --q {q} holds f32" in p.stderr, p.stderr
    k16 = save("mix_k16.npy", np.load(k).astype(np.float16))
    v16 = save("mix_v16.npy", np.load(v).astype(np.float16))
    o16, _ = forward(files=[q, k16, v16], out="mix_o.npy", lse="mix_l.npy")
    run("check", *qkv_args([q, k16, v16]), "--candidate-out", o16, code=0)  # a cache: taken


@test
def check_blames_the_input_at_fault():
    """Dims that disagree are told in the files' terms, the option and file at fault first, by
    check, forward and backward alike."""
    q, k, v = QKV
    K, V = np.load(k), np.load(v)
    f = lambda name, a: save("blame_" + name + ".npy", a)
    h3 = lambda a: np.concatenate([a, a[:, :, :1]], 2)  # 3 heads
    o, _ = forward()
    cases = [
        ([q, f("k_d8", K[..., :8]), v], "--k {1}: head dim 8, but --q {0} has 16"),
        ([q, f("k_h3", h3(K)), v], "--k {1}: 3 heads, but --v {2} has 2"),
        ([q, k, f("v_h3", h3(V))], "--v {2}: 3 heads, but --k {1} has 2"),
        ([q, f("k_h1", K[:, :, :1]), f("v_h3b", h3(V))], "--v {2}: 3 heads, but --k {1} has 1"),
        ([q, k, f("v_s30", V[:, :30])], "--v {2}: sequence length 30, but --k {1} has 56"),
        ([q, f("k_b1", K[:1]), v], "--k {1}: batch 1, but --q {0} has 2"),
        ([q, f("k_b1b", K[:1]), f("v_b1", V[:1])], "--q {0}: batch 2, but --k {1} has 1"),
        ([q, f("k_h3c", h3(K)), f("v_h3c", h3(V))],
         "--q {0}: 4 heads, not a multiple of the 3 of --k {1}"),
    ]
    _, l = forward(out="blame_o.npy", lse="blame_l.npy")
    grads = ["--dq", path("blame_dq.npy"), "--dk", path("blame_dk.npy"), "--dv",
             path("blame_dv.npy")]
    for files, want in cases:
        want = want.format(*files)
        for cmd in (["check", "--candidate-out", o], ["forward", "--out", path("blame_x.npy")],
                    ["backward", "--out", o, "--lse", l, "--dout", o, *grads]):
            p = run(cmd[0], *qkv_args(files), *cmd[1:], code=2)
            assert want in p.stderr and "->" not in p.stderr, (cmd[0], want, p.stderr)
    d = f("do_s10", RNG.standard_normal((2, 10, 4, 16)).astype(np.float32))
    p = run("check", *qkv_args(), "--dout", d, "--candidate-dq", q, code=2)
    assert f"--dout {d}: sequence length 10, but --q {q} has 40" in p.stderr, p.stderr
    p = run("backward", *qkv_args(), "--out", o, "--lse", l, "--dout", d, *grads, code=2)
    assert f"--dout {d}: sequence length 10, but --q {q} has 40" in p.stderr, p.stderr


@test
def check_candidate_shapes_in_the_files_layout():
    o, l = forward()
    lse = np.load(l)
    bsh = save("shape_lse_bsh.npy", lse.transpose(0, 2, 1).copy())
    p = run("check", *qkv_args(), "--candidate-lse", bsh, code=2)
    assert (f"--candidate-lse {bsh}: shape (2, 40, 4), but the inputs give (2, 4, 40), (batch, "
            "heads, seqlen); it looks like (batch, seqlen, heads)") in p.stderr, p.stderr
    short = save("shape_o_short.npy", np.load(o)[:, :10])
    p = run("check", *qkv_args(), "--candidate-out", short, code=2)
    assert (f"--candidate-out {short}: shape (2, 10, 4, 16), but the inputs give (2, 40, 4, 16), "
            "(batch, seqlen, heads, headdim)") in p.stderr, p.stderr
    dout = save("shape_do.npy", RNG.standard_normal((2, 40, 4, 16)).astype(np.float32))
    p = run("check", *qkv_args(), "--dout", dout, "--candidate-dk", short, code=2)
    assert f"--candidate-dk {short}: shape (2, 10, 4, 16), but --k {QKV[1]} gives (2, 56, 2, 16)" \
        in p.stderr, p.stderr
    p = run("check", *qkv_args(), "--candidate-lse", save("shape_lse_2d.npy", lse[0]), code=2)
    assert "--candidate-lse" in p.stderr and "3-D (batch, heads, seqlen)" in p.stderr, p.stderr


@test
def check_worst_index_in_the_files_order():
    """The worst element's index in each file's own order, named: the text's [b=..,s=..] and
    the JSON's object agree, for a bshd and a bhsd out and for the LSE."""
    o, l = forward()
    out, lse = np.load(o), np.load(l)
    out[1, 7, 2, 3] += 0.25
    lse[1, 2, 7] += 0.25  # (batch, head, seq)
    ob, lb = save("wi_o.npy", out), save("wi_l.npy", lse)
    p = check(ob, lb, code=1)
    assert "[b=1,s=7,h=2,d=3]" in p.stdout and "[b=1,h=2,s=7]" in p.stdout, p.stdout
    t = {x["name"]: x for x in json.loads(check(ob, lb, "--json", code=1).stdout)["tensors"]}
    assert list(t["out"]["worst_index"].items()) == [("batch", 1), ("seq", 7), ("head", 2),
                                                     ("dim", 3)]
    assert list(t["lse"]["worst_index"].items()) == [("batch", 1), ("head", 2), ("seq", 7)]
    files = [save("wi_" + n, np.load(x).transpose(0, 2, 1, 3).copy())
             for n, x in zip(("q.npy", "k.npy", "v.npy"), QKV)]
    oh = save("wi_oh.npy", out.transpose(0, 2, 1, 3).copy())
    p = check(oh, lb, "--layout", "bhsd", files=files, code=1)
    assert "[b=1,h=2,s=7,d=3]" in p.stdout and "[b=1,h=2,s=7]" in p.stdout, p.stdout
    p = check(oh, lb, "--layout", "bhsd", "--json", files=files, code=1)
    t = json.loads(p.stdout)["tensors"][0]
    assert list(t["worst_index"].items()) == [("batch", 1), ("head", 2), ("seq", 7), ("dim", 3)]


@test
def check_rel_error_relative_to_the_tensor():
    """rel err is max abs over the tensor's largest |ref|: an error at a reference near 0 does
    not blow it up; a reference of zeros has none (- and null)."""
    o, _ = forward("--backend", "reference", out="rel_o.npy", lse="rel_l.npy")
    out = np.load(o)
    at = np.unravel_index(np.argmin(np.abs(out)), out.shape)
    out[at] += 1e-3
    p = run("check", *qkv_args(), "--candidate-out", save("rel_bad.npy", out), "--json", code=1)
    t = json.loads(p.stdout)["tensors"][0]
    ref = np.load(o).astype(np.float64)  # the f64 reference's, to f32 rounding
    want = t["max_abs"] / np.abs(ref).max()
    assert abs(t["rel_error"] - want) < 1e-5 * want and t["rel_error"] < 1e-2, (t, want)
    p = run("check", *qkv_args(), "--candidate-out", save("rel_bad.npy", out), code=1)
    assert f"{t['rel_error']:10.3g}" in p.stdout and "rel err" in p.stdout, p.stdout
    zeros = [QKV[0], QKV[1], save("rel_v0.npy", np.zeros((2, 56, 2, 16), np.float32))]
    o0 = save("rel_o0.npy", np.zeros((2, 40, 4, 16), np.float32))
    p = run("check", *qkv_args(zeros), "--candidate-out", o0, "--json", code=0)
    assert json.loads(p.stdout)["tensors"][0]["rel_error"] is None
    p = run("check", *qkv_args(zeros), "--candidate-out", o0, code=0)
    assert re.search(r"^out +PASS +0 +- ", p.stdout, re.M), p.stdout


@test
def check_statistics_catch_truncation():
    """f16, 2^16 outputs: an output rounded by truncation passes the max rule and FAILs the
    least-squares scale, in the text (a stats line), in --json (statistics, each with value,
    bound, pass); --rule max judges the max alone; a bad --rule is refused by name."""
    files = inputs(sq=256, sk=256, hq=4, hk=4, d=64, dtype=np.float16, prefix="st_")
    wide = [save(f"st_{n}64.npy", np.load(f).astype(np.float64)) for n, f in zip("qkv", files)]
    o, _ = forward("--backend", "reference", files=wide, out="st_o.npy", lse="st_l.npy")
    exact = np.load(o)
    r = exact.astype(np.float16)
    cut = np.where(np.abs(r.astype(np.float64)) > np.abs(exact), np.nextafter(r, np.float16(0)), r)
    c = save("st_cut.npy", cut)
    p = run("check", *qkv_args(files), "--candidate-out", c, code=1)
    assert re.search(r"stats: bias \S+ \(<= \S+\), scale \S+ \(1 \+- \S+\) FAILED", p.stdout), p.stdout
    p = run("check", *qkv_args(files), "--candidate-out", c, "--json", code=1)
    t = json.loads(p.stdout)["tensors"][0]
    assert t["max_abs"] <= t["bound"], t
    assert set(t["statistics"]) == {"bias", "scale", "rms", "decorrelation"}, t
    assert t["statistics"]["scale"]["pass"] is False and t["statistics"]["bias"]["pass"], t
    assert t["statistics"]["scale"]["value"] < 1 - t["statistics"]["scale"]["bound"], t
    run("check", *qkv_args(files), "--candidate-out", c, "--rule", "max", code=0)
    honest = save("st_rn.npy", exact.astype(np.float16))
    run("check", *qkv_args(files), "--candidate-out", honest, code=0)
    p = run("check", *qkv_args(files), "--candidate-out", c, "--rule", "both", code=2)
    assert "--rule" in p.stderr and "both" in p.stderr, p.stderr


@test
def check_lse_held_to_its_own_dtype():
    """docs/DESIGN.md §4: the f32 LSE of a 16-bit kernel is judged against the conventional
    path in f32 plus FA_LSE16_ALLOWANCE(_REL), not the 16-bit path (its bound about 1e-2 here).
    In f16 and bf16 at 2^16 outputs: the library's own LSE PASSes, its rule naming the f32
    yardstick and the allowance; the LSE + 1e-3 (a softmax denominator 0.1% off) and + log 2
    FAIL, also under --rule max (the max alone, which the 16-bit yardstick let + 1e-3 pass); an
    LSE saved as f16 is held to the 16-bit yardstick, with no allowance. With f32 input files
    and an f16 out (the kernel rounded the inputs), the f32 yardstick runs on the inputs
    rounded to f16 too: the LSE PASSes."""
    def to_bf16(a):  # round to nearest even, as uint16 bit patterns
        u = a.astype(np.float32).view(np.uint32)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    f16 = inputs(sq=256, sk=256, hq=4, hk=4, d=64, dtype=np.float16, prefix="ol_")
    b16 = [save(f"ol_b{n}.npy", to_bf16(np.load(f))) for n, f in zip("qkv", f16)]
    for files, opts in ((f16, []), (b16, ["--bf16"])):
        o, l = forward(*opts, files=files, out="ol_o.npy", lse="ol_l.npy")
        lse = np.load(l)
        assert lse.dtype == np.float32, lse.dtype
        p = check(o, l, *opts, files=files, code=0)
        rule = re.search(r"^lse .*\n +rule: (.*)$", p.stdout, re.M).group(1)
        assert "conventional f32 error" in rule and "(allowance)" in rule, p.stdout
        check(o, save("ol_l3.npy", lse + 1e-3), *opts, files=files, code=1)
        check(o, save("ol_l3.npy", lse + 1e-3), *opts, "--rule", "max", files=files, code=1)
        check(o, save("ol_l3.npy", lse + np.log(2)), *opts, files=files, code=1)
        p = check(o, save("ol_l16.npy", lse.astype(np.float16)), *opts, files=files, code=0)
        rule = re.search(r"^lse .*\n +rule: (.*)$", p.stdout, re.M).group(1)
        assert "allowance" not in rule and "f16 floor" in rule, p.stdout
    wide = inputs(sq=256, sk=256, hq=4, hk=4, d=64, dtype=np.float32, prefix="ol_w")
    narrow = [save(f"ol_n{n}.npy", np.load(f).astype(np.float16)) for n, f in zip("qkv", wide)]
    o, l = forward(files=narrow, out="ol_o16.npy", lse="ol_l16f.npy")
    check(o, l, files=wide, code=0)


def options_of(cmd):
    """The options `cmd` takes, read from src/cli/options.c's table (its groups)."""
    src = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src", "cli",
                            "options.c")).read()
    table = src[src.index("static const opt_def defs[]"):]
    table = table[:table.index("{NULL, NULL}")]
    groups = {"forward": "io fwd pages", "backward": "io grad pages", "check": "check pages"}[cmd]
    return {name for name, g in re.findall(r'\{"(--[a-z0-9-]+)", "([a-z ]+)"\}', table)
            if any(x == "attn" or x in groups for x in g.split())}


@test
def help_lists_what_each_command_takes():
    """Each command's --help names every option it takes and none it refuses; check's says
    how the LSE is laid out; the top-level help names --version."""
    everything = set().union(*(options_of(c) for c in ("forward", "backward", "check")))
    assert {"--backend", "--candidate-out", "--out-dtype", "--seqused-k"} <= everything
    for cmd in ("forward", "backward", "check"):
        helptext = run(cmd, "--help", code=0).stdout
        named = set(re.findall(r"(?<![\w-])--[a-z0-9][a-z0-9-]*", helptext)) - {"--help"}
        takes = options_of(cmd)
        assert takes - named == set(), (cmd, "missing from --help", takes - named)
        assert named - takes == set(), (cmd, "in --help but refused", named - takes)
    helptext = run("check", "--help", code=0).stdout
    assert "LSE (batch, heads, seqlen)" in helptext and "worst element's index" in helptext
    assert "--version" in run("--help", code=0).stdout
    assert re.match(r"flashattn \d", run("--version", code=0).stdout)


# ------------------------------------------------------------------ hostile files and paths

def temps_in(d):
    return [n for n in os.listdir(d) if n.startswith(".flashattn-")]


def fwd_to(out, lse, *opts, code=None, **kw):
    return run("forward", *qkv_args(), "--out", out, "--lse", lse, *opts, code=code, **kw)


@test
def fifo_input_refused_without_blocking():
    fifo = path("fifo.npy")
    os.mkfifo(fifo)
    p = run("forward", "--q", fifo, "--k", QKV[1], "--v", QKV[2], "--out", path("x.npy"), code=2,
            timeout=20)  # 15de60b: blocked in open() forever
    assert "FIFO" in p.stderr and "fifo.npy" in p.stderr, p.stderr
    p = run("forward", "--q", TMP, "--k", QKV[1], "--v", QKV[2], "--out", path("x.npy"), code=2)
    assert "directory" in p.stderr, p.stderr


@test
def outputs_all_or_nothing():
    # a second output that cannot be written leaves no first one, new or old
    fwd_to(path("aon_o.npy"), path("no/dir/l.npy"), code=3)
    assert not os.path.exists(path("aon_o.npy"))  # 15de60b: o written, then the lse failed
    keep = save("aon_keep.npy", np.arange(5, dtype=np.float32))
    before = open(keep, "rb").read()
    p = fwd_to(keep, path("no/dir/l.npy"), code=3)
    assert open(keep, "rb").read() == before and "no/dir" in p.stderr
    # backward: an unwritable --dk leaves no dq
    o, l = forward(out="aon_fo.npy", lse="aon_fl.npy")
    dout = save("aon_do.npy", RNG.standard_normal((2, 40, 4, 16)).astype(np.float32))
    run("backward", *qkv_args(), "--out", o, "--lse", l, "--dout", dout, "--dq", path("aon_dq.npy"),
        "--dk", path("no/dir/dk.npy"), "--dv", path("aon_dv.npy"), code=3)
    assert not os.path.exists(path("aon_dq.npy")) and not os.path.exists(path("aon_dv.npy"))
    # a write that fails half-way (the file-size limit as a full disk: EFBIG): nothing changed,
    # no truncated file, no temporary file left
    import resource
    import signal

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))  # O is 20 KiB
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    p = fwd_to(keep, path("aon_l2.npy"), code=3, preexec_fn=small_files)
    assert open(keep, "rb").read() == before, "a failed write changed an existing output"
    assert not os.path.exists(path("aon_l2.npy")) and not temps_in(TMP), temps_in(TMP)
    assert "aon_keep.npy" in p.stderr and "write failed" in p.stderr, p.stderr
    # success: both in place, mode as a plain create gives, no temporary file
    fwd_to(path("aon_o.npy"), path("aon_l.npy"), code=0)
    assert np.load(path("aon_o.npy")).shape == (2, 40, 4, 16) and not temps_in(TMP)
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(path("aon_l.npy")).st_mode & 0o777 == 0o666 & ~umask


@test
def outputs_removed_on_a_signal():
    import signal
    import time
    if WRAP:
        return  # the signal would reach the wrapper
    d = path("sig")
    os.mkdir(d)
    q = save("sig/q.npy", RNG.standard_normal((1, 1500, 4, 64)).astype(np.float32))
    args = [EXE, "forward", "--q", q, "--k", q, "--v", q, "--out", os.path.join(d, "o.npy"),
            "--backend", "reference", "--threads", "1"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t = time.time()
    while not temps_in(d) and proc.poll() is None and time.time() - t < 60:
        time.sleep(0.005)
    assert temps_in(d), "no temporary file seen while the command ran"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == -signal.SIGTERM
    assert not temps_in(d) and not os.path.exists(os.path.join(d, "o.npy")), os.listdir(d)


@test
def outputs_that_name_inputs_or_each_other():
    x = save("same_q.npy", np.load(QKV[0]))
    before = open(x, "rb").read()
    p = run("forward", "--q", x, "--k", QKV[1], "--v", QKV[2], "--out", x, code=2)
    assert "input" in p.stderr and open(x, "rb").read() == before  # 15de60b: overwrote q, exit 0
    os.link(x, path("same_q_link.npy"))  # another name, the same inode
    run("forward", "--q", x, "--k", QKV[1], "--v", QKV[2], "--out", path("same_q_link.npy"), code=2)
    os.symlink(x, path("same_q_sym.npy"))
    run("forward", "--q", x, "--k", QKV[1], "--v", QKV[2], "--out", path("same_q_sym.npy"), code=2)
    assert open(x, "rb").read() == before
    # two outputs on one new path, spelled alike or not (15de60b: exit 0 with O lost)
    p = fwd_to(path("same_o.npy"), path("same_o.npy"), code=2)
    assert "same file" in p.stderr and not os.path.exists(path("same_o.npy"))
    os.mkdir(path("sub"))
    fwd_to(path("same_o.npy"), os.path.join(TMP, "sub", "..", "same_o.npy"), code=2)
    assert not os.path.exists(path("same_o.npy"))
    # a symbolic link as an output is written through, the link kept
    real = save("same_real.npy", np.zeros(3, np.float32))
    os.symlink(real, path("same_link.npy"))
    fwd_to(path("same_link.npy"), path("same_l.npy"), code=0)
    assert os.path.islink(path("same_link.npy")) and np.load(real).shape == (2, 40, 4, 16)


@test
def ignored_signals_stay_ignored_and_read_only_outputs_refused():
    import signal
    import time
    # under nohup (SIGHUP ignored) the command must not die of SIGHUP
    q = save("nohup_q.npy", RNG.standard_normal((1, 1500, 4, 64)).astype(np.float32))
    out = path("nohup_o.npy")
    proc = subprocess.Popen([*WRAP, EXE, "forward", "--q", q, "--k", q, "--v", q, "--out", out,
                             "--backend", "reference", "--threads", "1"],
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    proc.send_signal(signal.SIGHUP)
    assert proc.wait(timeout=120) == 0 and np.load(out).shape == (1, 1500, 4, 64)
    if os.geteuid() != 0:  # root writes anything
        ro = save("ro_o.npy", np.zeros(3, np.float32))
        os.chmod(ro, 0o444)
        before = open(ro, "rb").read()
        p = fwd_to(ro, path("ro_l.npy"), code=3)
        assert "Permission denied" in p.stderr and open(ro, "rb").read() == before


@test
def outputs_that_are_not_regular_files():
    p = fwd_to("/dev/null", path("nr_l.npy"), code=2)
    assert "character device" in p.stderr and not os.path.exists(path("nr_l.npy"))
    assert os.path.exists("/dev/null") and not os.path.isfile("/dev/null")
    run("forward", *qkv_args(), "--out", TMP, code=2)
    run("forward", *qkv_args(), "--out", path("sub") + "/", code=2)


@test
def messages_keep_their_reason():
    long_dir = os.path.join(TMP, *["d" * 60] * 8)  # about 500 characters, none of it existing
    p = run("forward", "--q", os.path.join(long_dir, "q.npy"), "--k", QKV[1], "--v", QKV[2],
            "--out", path("x.npy"), code=2)  # 15de60b: the path filled the message
    assert "No such file or directory" in p.stderr and "..." in p.stderr, p.stderr
    p = run("forward", *qkv_args(), "--out", os.path.join(long_dir, "o.npy"), code=3)
    assert "No such file or directory" in p.stderr, p.stderr
    p = run("forward", "--q", "/proc/self/status", "--k", QKV[1], "--v", QKV[2], "--out",
            path("x.npy"), code=2)
    assert "/proc" in p.stderr and "empty" not in p.stderr, p.stderr


@test
def output_size_bounded_like_an_input():
    # Sk = 0: the output's head dim is v's, declared by a file of 128 bytes
    q = save("big_q.npy", np.zeros((1, 1024, 1, 4), np.float32))
    k = save("big_k.npy", np.zeros((1, 0, 1, 4), np.float32))
    hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 0, 1, 68719476736), }"
    hdr = hdr + " " * (63 - (10 + len(hdr)) % 64) + "\n"
    with open(path("big_v.npy"), "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + len(hdr).to_bytes(2, "little") + hdr.encode())
    p = run("forward", "--q", q, "--k", k, "--v", path("big_v.npy"), "--out", path("big_o.npy"),
            code=2, timeout=20)
    assert "memory" in p.stderr and not os.path.exists(path("big_o.npy")), p.stderr


@test
def hostile_cli_table():
    """Each row: a command line that must fail with its exit code and a message naming the
    culprit, leaving the output directory as it was (no new file, no temporary file, the
    existing output byte for byte)."""
    d = path("tbl")
    os.mkdir(d)
    q, k, v = QKV
    o_keep = save("tbl/keep.npy", np.arange(7, dtype=np.float32))
    lse_ok = save("tbl/lse_in.npy", np.zeros((2, 4, 40), np.float32))
    out_ok = save("tbl/out_in.npy", np.zeros((2, 40, 4, 16), np.float32))
    dout = save("tbl/dout.npy", np.zeros((2, 40, 4, 16), np.float32))
    raw = open(q, "rb").read()
    bad = {}  # input files with one problem each, and the reason the message must give
    for name, (data, reason) in {
        "trunc": (raw[:-3], "truncated data"), "magic": (b"\x93NUMPZ" + raw[6:], "bad magic"),
        "hdr": (raw[:8] + b"\xff\xff" + raw[10:], "runs past end of file"),
        "noterm": (raw.replace(b"\n", b" ", 1), "not terminated"),
        "shape_key": (raw.replace(b"'shape'", b"'shope'"), "'shope'"),
        "extra": (raw + b"\0" * 4, "trailing bytes"),
        "version": (raw[:6] + b"\x01\x05" + raw[8:], "version 1.5"),
        "empty": (b"", "empty file"), "be": (raw.replace(b"<f4", b">f4"), "big-endian"),
        "fortran": (raw.replace(b"False", b"True "), "Fortran-order"),
    }.items():
        with open(os.path.join(d, name + ".npy"), "wb") as f:
            f.write(data)
        bad[name] = (os.path.join(d, name + ".npy"), reason)
    np.save(os.path.join(d, "i4.npy"), np.zeros((2, 40, 4, 16), np.int32))
    np.save(os.path.join(d, "d3.npy"), np.zeros((2, 40, 64), np.float32))
    np.save(os.path.join(d, "k_d8.npy"), np.zeros((2, 56, 2, 8), np.float32))
    np.save(os.path.join(d, "k_h3.npy"), np.zeros((2, 56, 3, 16), np.float32))
    np.save(os.path.join(d, "k_b3.npy"), np.zeros((3, 56, 2, 16), np.float32))
    np.save(os.path.join(d, "k_f64.npy"), np.zeros((2, 56, 2, 16), np.float64))
    np.save(os.path.join(d, "slopes3.npy"), np.ones(3, np.float32))
    np.save(os.path.join(d, "slopes2d.npy"), np.ones((4, 1), np.float32))
    np.save(os.path.join(d, "slopes_nan.npy"), np.array([1, np.nan, 1, 1], np.float32))
    np.save(os.path.join(d, "lse_bad.npy"), np.zeros((2, 40, 4), np.float32))
    np.save(os.path.join(d, "mask_sk.npy"), np.ones((40, 57), bool))
    np.save(os.path.join(d, "mask_h3.npy"), np.ones((1, 3, 40, 56), bool))
    np.save(os.path.join(d, "mask_5d.npy"), np.ones((1, 1, 1, 40, 56), bool))
    np.save(os.path.join(d, "mask_i4.npy"), np.ones((40, 56), np.int32))
    np.save(os.path.join(d, "bias_ok.npy"), np.zeros((40, 56), np.float32))
    (num, idx), _ = block_lists(4, density=1.0)
    bm_bad = {"out_of_range": idx.copy(), "repeated": idx.copy()}
    bm_bad["out_of_range"][0, 2, 1, 3] = 7
    bm_bad["repeated"][0, 1, 2, 1] = bm_bad["repeated"][0, 1, 2, 0]
    bm_bad.update(num=num, idx=idx, counts_2d=num[0], other_shape=idx[:, :2],
                  float=idx.astype(np.float32), counts_over=num + 1)
    bm_file = {n: save(f"tbl/bm_{n}.npy", a) for n, a in bm_bad.items()}
    BM = ["--block-size", "16,8", "--kv-num-blocks", bm_file["num"], "--kv-block-indices",
          bm_file["idx"]]
    BMi = lambda n: BM[:5] + [bm_file[n]]         # the indices replaced
    BMn = lambda n: BM[:3] + [bm_file[n]] + BM[4:]  # the counts replaced
    os.mkfifo(os.path.join(d, "fifo.npy"))
    os.symlink(os.path.join(d, "nowhere.npy"), os.path.join(d, "dangling.npy"))
    F = lambda *a: ["forward", "--q", q, "--k", k, "--v", v, "--out", o_keep, *a]
    Fq = lambda x, *a: ["forward", "--q", x, "--k", k, "--v", v, "--out", o_keep, *a]
    B = lambda *a: ["backward", "--q", q, "--k", k, "--v", v, "--out", out_ok, "--lse", lse_ok,
                    "--dout", dout, "--dq", os.path.join(d, "dq.npy"), "--dk", os.path.join(d, "dk.npy"),
                    "--dv", os.path.join(d, "dv.npy"), *a]
    rows = [
        # the options
        ("unknown option", F("--frob"), 2, "--frob"),
        ("missing value", F("--seed"), 2, "--seed"),
        ("dropout 1", F("--dropout", "1"), 2, "dropout"),
        ("dropout -0.1", F("--dropout", "-0.1"), 2, "dropout"),
        ("dropout nan", F("--dropout", "nan"), 2, "dropout"),
        ("dropout text", F("--dropout", "half"), 2, "--dropout"),
        ("scale -1", F("--scale", "-1"), 2, "scale"),
        ("scale nan", F("--scale", "nan"), 2, "scale"),
        ("scale inf", F("--scale", "inf"), 2, "scale"),
        ("softcap -1", F("--softcap", "-1"), 2, "softcap"),
        ("softcap nan", F("--softcap", "nan"), 2, "softcap"),
        ("window text", F("--window", "a,b"), 2, "--window"),
        ("window three", F("--window", "1,2,3"), 2, "--window"),
        ("window -2", F("--window", "-2,0"), 2, "window"),
        ("causal and window right", F("--causal", "--window", "3,2"), 2, "window_right"),
        ("threads -1", F("--threads", "-1"), 2, "threads"),
        ("threads text", F("--threads", "x"), 2, "--threads"),
        ("seed negative", F("--seed", "-5"), 2, "--seed"),
        ("seed hex", F("--seed", "0x10"), 2, "--seed"),
        ("seed 2^64", F("--seed", "18446744073709551616"), 2, "--seed"),
        ("offset blank", F("--offset", " 5"), 2, "--offset"),
        ("layout", F("--layout", "sbhd"), 2, "--layout"),
        ("align", F("--align", "middle"), 2, "--align"),
        ("profile", F("--profile", "fa9"), 2, "--profile"),
        ("backend", F("--backend", "gpu"), 2, "--backend"),
        ("isa", F("--isa", "sse9"), 2, "--isa"),
        ("check option in forward", F("--candidate-out", q), 2, "--candidate-out"),
        ("check --dtype", ["check", "--q", q, "--k", k, "--v", v, "--candidate-out", q, "--dtype", "f8"], 2, "--dtype"),
        ("check without candidate", ["check", "--q", q, "--k", k, "--v", v], 2, "candidate"),
        ("no --q", ["forward", "--k", k, "--v", v, "--out", o_keep], 2, "--q"),
        ("no --out", ["forward", "--q", q, "--k", k, "--v", v], 2, "--out"),
        ("backward without --dv", B()[:-2], 2, "--dv"),
        # the inputs
        ("q missing", Fq(os.path.join(d, "none.npy")), 2, "No such file"),
        ("q a directory", Fq(d), 2, "directory"),
        ("q a FIFO", Fq(os.path.join(d, "fifo.npy")), 2, "FIFO"),
        ("q a character device", Fq("/dev/zero"), 2, "character device"),
        ("q from /proc", Fq("/proc/self/stat"), 2, "0 bytes but has content"),
        *[(f"q {n}", Fq(bad[n][0]), 2, bad[n][1]) for n in bad],
        ("q int32", Fq(os.path.join(d, "i4.npy")), 2, "an integer array"),
        ("q 3-D", Fq(os.path.join(d, "d3.npy")), 2, "4-D"),
        ("q uint16 without --bf16", Fq(save("tbl/u2.npy", np.zeros((2, 40, 4, 16), np.uint16))), 2, "--bf16"),
        ("k head dim 8", ["forward", "--q", q, "--k", os.path.join(d, "k_d8.npy"), "--v", v, "--out", o_keep], 2, f"--k {d}/k_d8.npy: head dim 8, but --q {q} has 16"),
        ("k 3 heads", ["forward", "--q", q, "--k", os.path.join(d, "k_h3.npy"), "--v", v, "--out", o_keep], 2, f"--k {d}/k_h3.npy: 3 heads, but --v {v} has 2"),
        ("k batch 3", ["forward", "--q", q, "--k", os.path.join(d, "k_b3.npy"), "--v", v, "--out", o_keep], 2, f"--k {d}/k_b3.npy: batch 3, but --q {q} has 2"),
        ("k f64 with q f32", ["forward", "--q", q, "--k", os.path.join(d, "k_f64.npy"), "--v", v, "--out", o_keep], 2, "k->dtype = f64"),
        ("check: k f64 with q f32", ["check", "--q", q, "--k", os.path.join(d, "k_f64.npy"), "--v", v, "--candidate-out", out_ok], 2, f"--k {d}/k_f64.npy holds f64, but --q {q} holds f32"),
        ("check: k 3 heads", ["check", "--q", q, "--k", os.path.join(d, "k_h3.npy"), "--v", v, "--candidate-out", out_ok], 2, f"--k {d}/k_h3.npy: 3 heads, but --v {v} has 2"),
        ("check: k head dim 8", ["check", "--q", q, "--k", os.path.join(d, "k_d8.npy"), "--v", v, "--candidate-out", out_ok], 2, f"--k {d}/k_d8.npy: head dim 8, but --q {q} has 16"),
        ("check: lse transposed", ["check", "--q", q, "--k", k, "--v", v, "--candidate-lse", os.path.join(d, "lse_bad.npy")], 2, "it looks like (batch, seqlen, heads)"),
        ("v truncated", ["forward", "--q", q, "--k", k, "--v", bad["trunc"][0], "--out", o_keep], 2, "truncated"),
        ("alibi 3 slopes", F("--alibi", os.path.join(d, "slopes3.npy")), 2, "1-D array of 4 slopes"),
        ("alibi 2-D", F("--alibi", os.path.join(d, "slopes2d.npy")), 2, "1-D array of 4 slopes"),
        ("alibi NaN", F("--alibi", os.path.join(d, "slopes_nan.npy")), 2, "alibi_slopes[1] = nan"),
        ("alibi missing", F("--alibi", os.path.join(d, "none.npy")), 2, "No such file"),
        ("lse input transposed", B("--lse", os.path.join(d, "lse_bad.npy")), 2, "lse->seqlen = 4"),
        ("mask of Sk + 1", F("--attn-mask", os.path.join(d, "mask_sk.npy")), 2, "params->bias->headdim = 57"),
        ("mask of 3 heads", F("--attn-mask", os.path.join(d, "mask_h3.npy")), 2, "params->bias->heads = 3"),
        ("mask 5-D", F("--attn-mask", os.path.join(d, "mask_5d.npy")), 2, "--attn-mask: 5-D"),
        ("mask int32", F("--attn-mask", os.path.join(d, "mask_i4.npy")), 2, "--mask-kind keep"),
        ("bias bool", F("--bias", os.path.join(d, "mask_sk.npy")), 2, "--bias takes floats"),
        ("mask and bias", F("--attn-mask", os.path.join(d, "mask_sk.npy"), "--bias", os.path.join(d, "bias_ok.npy")), 2, "--attn-mask or --bias"),
        ("mask kind", F("--attn-mask", os.path.join(d, "bias_ok.npy"), "--mask-kind", "mask"), 2, "--mask-kind"),
        ("mask kind with --bias", F("--bias", os.path.join(d, "bias_ok.npy"), "--mask-kind", "keep"), 2, "--mask-kind"),
        ("bias place", F("--bias-place", "before"), 2, "--bias-place"),
        ("bias by slope without slopes", F("--bias", os.path.join(d, "bias_ok.npy"), "--bias-by-slope"), 2, "alibi_slopes"),
        ("mask with varlen", F("--attn-mask", os.path.join(d, "bias_ok.npy"), "--cu-seqlens-q", q, "--cu-seqlens-k", q), 2, "--attn-mask"),
        ("dbias without a bias", B("--dbias", os.path.join(d, "db.npy")), 2, "--dbias"),
        ("dbias of a keep-mask", B("--dbias", os.path.join(d, "db.npy"), "--attn-mask", os.path.join(d, "mask_h3.npy")), 2, "keep-mask"),
        ("check dbias without a bias", ["check", "--q", q, "--k", k, "--v", v, "--dout", dout, "--candidate-dbias", os.path.join(d, "bias_ok.npy")], 2, "--candidate-dbias needs"),
        ("dbias of a bool mask read as a bias", B("--dbias", os.path.join(d, "db.npy"), "--attn-mask", os.path.join(d, "mask_sk.npy"), "--mask-kind", "bias"), 2, "--attn-mask takes floats"),
        ("block index out of range", F(*BMi("out_of_range")), 2, "--kv-block-indices"),
        ("block listed twice", F(*BMi("repeated")), 2, "--kv-block-indices"),
        ("block index out of range (backward)", B(*BMi("out_of_range")), 2, "--kv-block-indices"),
        ("block index out of range (check)", ["check", "--q", q, "--k", k, "--v", v, "--candidate-out", out_ok, *BMi("out_of_range")], 2, "--kv-block-indices"),
        ("block indices float", F(*BMi("float")), 2, "--kv-block-indices"),
        ("block indices of another shape", F(*BMi("other_shape")), 2, "--kv-block-indices"),
        ("block counts 2-D", F(*BMn("counts_2d")), 2, "--kv-num-blocks"),
        ("block counts past the key blocks", F(*BMn("counts_over")), 2, "--kv-num-blocks"),
        ("block size not Sq's blocks", F(*BM[2:]), 2, "--kv-num-blocks"),
        ("block size 0", F(*BM, "--block-size", "0,8"), 2, "--block-size"),
        ("block size text", F(*BM, "--block-size", "16,x"), 2, "--block-size"),
        ("block size without a mask", F("--block-size", "16"), 2, "--block-size"),
        ("block counts alone", F(*BM[:4]), 2, "--kv-block-indices"),
        ("one full list", F(*BM, "--full-kv-num-blocks", bm_file["num"]), 2, "--full-kv-block-indices"),
        ("block mask with varlen", F(*BM, "--cu-seqlens-q", q, "--cu-seqlens-k", q), 2, "--kv-num-blocks"),
        ("dout missing", B("--dout", os.path.join(d, "none.npy")), 2, "No such file"),
        ("dout a FIFO", B("--dout", os.path.join(d, "fifo.npy")), 2, "FIFO"),
        # the outputs
        ("out in a missing directory", F("--lse", os.path.join(d, "no", "l.npy")), 3, "no/l.npy"),
        ("out = q", ["forward", "--q", q, "--k", k, "--v", v, "--out", q], 2, "input"),
        ("lse = v", F("--lse", v), 2, "input"),
        ("out = lse", F("--lse", o_keep), 2, "same file"),
        ("out a directory", ["forward", "--q", q, "--k", k, "--v", v, "--out", d], 2, "directory"),
        ("out /dev/null", F("--lse", "/dev/null"), 2, "character device"),
        ("out ends in /", F("--lse", d + "/"), 2, "directory"),
        ("out ends in / (new)", F("--lse", os.path.join(d, "new") + "/"), 2, "not a file name"),
        ("dq = dk", B("--dk", os.path.join(d, "dq.npy")), 2, "same file"),
        ("dv = dout", B("--dv", dout), 2, "input"),
        ("dq = out", B("--dq", out_ok), 2, "input"),
        ("dk a FIFO", B("--dk", os.path.join(d, "fifo.npy")), 2, "FIFO"),
        ("out a dangling symbolic link", F("--lse", os.path.join(d, "dangling.npy")), 2, "missing file"),
        ("dv in a missing directory", B("--dv", os.path.join(d, "no", "dv.npy")), 3, "no/dv.npy"),
    ]
    # FA_CLI_TABLE_STRIDE=s runs every s-th row only (CI's valgrind stage: the other stages run
    # them all, and each row under valgrind costs seconds)
    rows = rows[::int(os.environ.get("FA_CLI_TABLE_STRIDE", "1"))]
    listing = sorted(os.listdir(d))
    keep = {n: open(os.path.join(d, n), "rb").read() for n in listing if os.path.isfile(os.path.join(d, n))}
    failures = []
    for name, args, code, needle in rows:
        p = run(*args, timeout=60)
        now = sorted(os.listdir(d))
        changed = [n for n in keep if open(os.path.join(d, n), "rb").read() != keep[n]]
        if p.returncode != code or needle not in p.stderr or now != listing or changed:
            failures.append(f"{name}: exit {p.returncode} (want {code}), files +{set(now) - set(listing)} "
                            f"changed {changed}: {p.stderr.strip()[:200]}")
    print(f"     hostile_cli_table: {len(rows)} rows")
    assert not failures, "\n".join(failures)


@test
def reader_allocation_failures():
    """A build with --enable-fault-injection (CI's sanitizer stage): the reader's n-th
    allocation fails, for every n until the command succeeds; each failure is exit 3 with
    nothing written (and, under ASan, nothing leaked)."""
    if "fault injection" not in run("info", code=0).stdout:
        print("     reader_allocation_failures: not a fault-injection build, skipped")
        return
    out, lse = path("fault_o.npy"), path("fault_l.npy")
    for n in range(1, 60):
        env = dict(os.environ, FLASHATTN_FAULT_ALLOC=str(n))
        p = fwd_to(out, lse, env=env)
        if p.returncode == 0:
            break
        assert p.returncode == 3 and "out of memory" in p.stderr, (n, p.returncode, p.stderr)
        assert not os.path.exists(out) and not os.path.exists(lse) and not temps_in(TMP)
    assert p.returncode == 0 and n == 7, n  # q, k, v: a header and data each


QKV[:] = inputs()
# FA_CLI_TESTS: a comma-separated list of the tests to run (default: all)
ONLY = set(filter(None, os.environ.get("FA_CLI_TESTS", "").split(",")))
unknown = ONLY - {fn.__name__ for fn in TESTS}
if unknown:
    sys.exit(f"FA_CLI_TESTS names no test: {sorted(unknown)}")
for fn in TESTS:
    if ONLY and fn.__name__ not in ONLY:
        continue
    t0 = time.monotonic()
    try:
        fn()
        results.append((fn.__name__, None, time.monotonic() - t0))
    except AssertionError as e:
        results.append((fn.__name__, str(e) or "assertion failed", time.monotonic() - t0))
for name, err, secs in results:
    print(("ok   " if err is None else "FAIL ") + f"{name} ({secs:.1f} s)" +
          ("" if err is None else ": " + err))
failed = sum(err is not None for _, err, _ in results)
shutil.rmtree(TMP, ignore_errors=True)
print(f"{len(results) - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
