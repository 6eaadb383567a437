#!/usr/bin/env python3
"""The oracle's trial on real GPU kernels (issue 35, docs/notes/oracle.md): SDPA's flash,
efficient, cuDNN and math kernels, FlashAttention-4 (where its wheels import) and this
library's CUDA backend run over seeds x shapes x dtypes, forward and backward; each output
(out, its LSE where the kernel returns one, dq, dk, dv) is judged by flashattn.check, the max
rule and the statistics. An honest kernel must PASS every time: the count of candidates and of
FAILs, and each metric's largest value / bound per kernel, go to OUT/oracle.txt, one row per
candidate to OUT/oracle.csv. Then mutants of the same real outputs, which must FAIL: out x 1.005
(a wrong scale under bf16/f16 noise) and the LSE + log 2.

Beside the verdicts, each kernel's LSE error against the float64 reference is set beside the
conventional path's in float32 on the same (16-bit, exactly widened) inputs, the yardstick of
the LSE's rule (docs/DESIGN.md §4): what an f32 LSE of a 16-bit kernel achieves, in
OUT/oracle_lse.csv.

    FLASHATTN_LIBRARY=/path/libflashattn.so.9 PYTHONPATH=python python3 bench/oracle_gpu.py \
        [--seeds 3] [--first-seed 0] [--out DIR]
"""

import argparse
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn as fa

# B, Hq, Hk, Sq, Sk, D: every one at least a few thousand outputs (2^14 to 2^18)
SHAPES = ((2, 8, 8, 256, 256, 64), (1, 8, 8, 384, 384, 128), (2, 4, 4, 200, 333, 64),
          (1, 8, 2, 256, 512, 128), (1, 4, 4, 256, 256, 96), (1, 4, 4, 256, 256, 256))
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}
METRICS = ("max", "bias", "scale", "rms", "decorr")


def lse_allowances():
    """The LSE rule's allowances for a 16-bit kernel's f32 LSE (fa_lse_rule, docs/DESIGN.md
    §4): (absolute, times max |LSE|)."""
    from ctypes import byref, c_int
    from flashattn import _native as N
    y, tol = c_int(), N.Tolerance()
    N.check_status(N.lib.fa_lse_rule(None, N.BF16, N.F32, 0, byref(y), byref(tol)), "lse rule")
    return tol.allowance, tol.allowance_rel


ALLOWANCE, ALLOWANCE_REL = lse_allowances()


def sdpa_lse(backend, q, k, v, causal):
    """SDPA's backend's LSE (B, H, Sq), float32, through its private op; None where the op
    refuses (GQA, a shape)."""
    try:
        if backend == "FLASH_ATTENTION":
            r = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False)
        elif backend == "EFFICIENT_ATTENTION":
            r = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0,
                                                                      causal)
        elif backend == "CUDNN_ATTENTION":
            r = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0,
                                                                  causal, False)
        else:
            return None
    except Exception:
        return None
    lse = r[1]
    b, h, sq = q.shape[0], q.shape[1], q.shape[2]
    return lse.reshape(b, h, -1)[..., :sq].float().contiguous()  # efficient pads Sq to 32


def run_sdpa(backend):
    def run(q, k, v, dout, causal):
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        with sdpa_kernel(getattr(SDPBackend, backend)):
            out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal,
                                                 enable_gqa=q.shape[1] != k.shape[1])
            out.backward(dout)
            lse = sdpa_lse(backend, q, k, v, causal) if q.shape[1] == k.shape[1] else None
        return out.detach(), lse, qg.grad, kg.grad, vg.grad
    return run


def run_fa4(fn):
    def run(q, k, v, dout, causal):  # (B, S, H, D) copies, results back to (B, H, S, D)
        qs, ks, vs = (t.transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
        out, lse = fn(qs, ks, vs, causal=causal, return_lse=True)
        out.backward(dout.transpose(1, 2).contiguous())
        bh = lambda t: t.transpose(1, 2)
        return bh(out.detach()), lse.float(), bh(qs.grad), bh(ks.grad), bh(vs.grad)
    return run


def run_ours(q, k, v, dout, causal):
    out, lse = fa.attention(q, k, v, layout="bhsd", causal=causal, return_lse=True)
    dq, dk, dv = fa.attention_backward(dout, q, k, v, out, lse, layout="bhsd", causal=causal)
    return out, lse, dq, dk, dv


def kernels():
    """(name, profile, run) for each kernel this machine has."""
    ks = [("sdpa-" + b.split("_")[0].lower(), "pytorch", run_sdpa(b))
          for b in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH")]
    try:
        from flash_attn.cute import flash_attn_func
        ks.append(("fa4", "fa3", run_fa4(flash_attn_func)))
    except Exception as e:
        print("fa4 not imported: %s" % (str(e).splitlines() or [type(e).__name__])[0],
              file=sys.stderr)
    ks.append(("flashattn-cuda", "flashattn", run_ours))
    return ks


def ratios(t):
    """Each metric's value / bound (scale: |scale - 1| / bound) of a TensorReport."""
    r = {"max": t.max_abs / t.bound if t.bound > 0 else (0.0 if t.max_abs == 0 else math.inf)}
    for m in METRICS[1:]:
        v, b, _ = t.statistics["decorrelation" if m == "decorr" else m]
        v = abs(v - 1) if m == "scale" else abs(v)
        r[m] = v / b if b > 0 else (0.0 if v == 0 else math.inf)
    return r


def lse_errors(q, k, v, lse, causal, align):
    """max |lse - ref| over finite rows: the kernel's, and the conventional path's in float32
    on the same inputs; the float32 floor eps32 max(1, max |ref|); max |ref|."""
    x64 = [t.detach().cpu().double().numpy() for t in (q, k, v)]
    x32 = [t.detach().cpu().float().numpy() for t in (q, k, v)]
    kw = dict(layout="bhsd", causal=causal, align=align, return_lse=True)
    _, ref = fa.attention(*x64, backend="reference", **kw)
    _, c32 = fa.attention(*x32, backend="conventional", **kw)
    cand = lse.detach().cpu().double().numpy()
    fin = np.isfinite(ref)
    err = float(np.max(np.abs(cand - ref)[fin]))
    err32 = float(np.max(np.abs(c32.astype(np.float64) - ref)[fin]))
    top = float(np.max(np.abs(ref[fin])))
    return err, err32, float(np.finfo(np.float32).eps * max(1.0, top)), top


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--first-seed", type=int, default=0, help="seeds first-seed .. +seeds-1")
    ap.add_argument("--out", default="report/gpu")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    ks = kernels()
    rows, lrows, mrows = [], [], []
    worst = {}   # kernel -> metric -> largest ratio
    counts = {}  # kernel -> [candidates, FAILs]
    t0 = time.time()
    n_cases = len(SHAPES) * len(DTYPES) * 2 * a.seeds
    case = 0
    for shape in SHAPES:
        b, hq, hk, sq, sk, d = shape
        for dname, dt in DTYPES.items():
            for causal in (False, True):
                for seed in range(a.first_seed, a.first_seed + a.seeds):
                    case += 1
                    g = torch.Generator(device="cuda").manual_seed(1000 * case + seed)
                    q = torch.randn(b, hq, sq, d, device="cuda", dtype=dt, generator=g)
                    k = torch.randn(b, hk, sk, d, device="cuda", dtype=dt, generator=g)
                    v = torch.randn(b, hk, sk, d, device="cuda", dtype=dt, generator=g)
                    dout = torch.randn(b, hq, sq, d, device="cuda", dtype=dt, generator=g)
                    for name, profile, run in ks:
                        try:
                            out, lse, dq, dk, dv = run(q, k, v, dout, causal)
                        except Exception as e:  # a kernel that refuses the shape
                            print("  %s %s %s causal=%d: refused: %s" % (
                                name, dname, shape, causal,
                                (str(e).splitlines() or [type(e).__name__])[0][:120]),
                                file=sys.stderr)
                            continue
                        torch.cuda.synchronize()
                        cands = dict(out=out, dq=dq, dk=dk, dv=dv)
                        if lse is not None:
                            cands["lse"] = lse
                        kw = dict(causal=causal, layout="bhsd", profile=profile)
                        r = fa.check(q, k, v, dout=dout, **cands, **kw)
                        c = counts.setdefault(name, [0, 0])
                        for tn, t in r.tensors.items():
                            rt = ratios(t)
                            c[0] += 1
                            c[1] += not t.passed
                            w = worst.setdefault(name, {})
                            for m in METRICS:
                                w[m] = max(w.get(m, 0.0), rt[m])
                            rows.append((name, dname, *shape, int(causal), seed, tn,
                                         int(t.passed), *(rt[m] for m in METRICS)))
                            if not t.passed:
                                print("  FAIL %s %s %s causal=%d seed %d %s\n%s" % (
                                    name, dname, shape, causal, seed, tn, t), file=sys.stderr)
                        if lse is not None:
                            align = "top-left" if profile == "pytorch" else "bottom-right"
                            e, e32, fl, top = lse_errors(q, k, v, lse, causal, align)
                            lrows.append((name, dname, *shape, int(causal), seed, e, e32, fl,
                                          e / (2 * e32 + fl + ALLOWANCE + ALLOWANCE_REL * top)))
                        if seed == a.first_seed:  # mutants of its real outputs: must FAIL
                            muts = [("out*1.005", dict(out=(out.float() * 1.005).to(dt)))]
                            if lse is not None:
                                muts.append(("lse+log2", dict(out=out, lse=lse + math.log(2))))
                            for mname, mc in muts:
                                mr = fa.check(q, k, v, **mc, **kw)
                                bad = [tn for tn, t in mr.tensors.items() if not t.passed]
                                mrows.append((name, dname, *shape, int(causal), mname,
                                              int(not mr.passed), "+".join(
                                                  m for m in METRICS for tn in bad
                                                  if not ratios(mr.tensors[tn])[m] <= 1)))
                    print("case %d/%d (%s %s causal=%d seed %d) %.0f s" % (
                        case, n_cases, dname, shape, causal, seed, time.time() - t0),
                        flush=True)
                    del q, k, v, dout
    head = "kernel,dtype,B,Hq,Hk,Sq,Sk,D,causal,seed"
    with open(os.path.join(a.out, "oracle.csv"), "w") as f:
        f.write(head + ",tensor,pass," + ",".join(m + "_ratio" for m in METRICS) + "\n")
        for r in rows:
            f.write(",".join(str(x) if not isinstance(x, float) else "%.4g" % x for x in r)
                    + "\n")
    with open(os.path.join(a.out, "oracle_lse.csv"), "w") as f:
        f.write(head + ",err,err_conventional_f32,floor_f32,err_over_max_bound\n")
        for r in lrows:
            f.write(",".join(str(x) if not isinstance(x, float) else "%.4g" % x for x in r)
                    + "\n")
    dev = torch.cuda.get_device_properties(0)
    with open(os.path.join(a.out, "oracle.txt"), "w") as f:
        f.write("%s UTC; %s; torch %s (cuDNN %s); flashattn %s; %d cases (shapes x dtypes x "
                "causal x %d seeds)\n" % (time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                                          dev.name, torch.__version__,
                                          torch.backends.cudnn.version(), fa.__version__,
                                          n_cases, a.seeds))
        f.write("kernel: candidates, FAILs; largest value / bound of " + ", ".join(METRICS)
                + "\n")
        for name, (n, bad) in counts.items():
            f.write("%s: %d, %d; %s\n" % (name, n, bad, ", ".join(
                "%s %.3g" % (m, worst[name][m]) for m in METRICS)))
        for name in counts:
            ls = [r for r in lrows if r[0] == name]
            if ls:
                f.write("%s LSE: max err %.3g, largest err / (2 err_f32 + floor + allowance) "
                        "%.3g\n" % (
                    name, max(r[-4] for r in ls), max(r[-1] for r in ls)))
        caught = sum(r[-2] for r in mrows)
        f.write("mutants: %d of %d FAIL\n" % (caught, len(mrows)))
        for r in mrows:
            f.write("  %s %s %s causal=%d %s: %s (%s)\n" % (
                r[0], r[1], r[2:8], r[8], r[9], "FAIL" if r[10] else "PASS", r[11]))
    print(open(os.path.join(a.out, "oracle.txt")).read())


if __name__ == "__main__":
    main()
