#!/usr/bin/env python3
"""The CUDA backend beside torch.nn.functional.scaled_dot_product_attention (flash = FA2, and
cuDNN), on the same device tensors, timed with CUDA events (median of --reps calls after
warm-up). Loads libflashattn.so through ctypes; needs PyTorch with CUDA.

  python3 bench/bench_cuda.py --lib .libs/libflashattn.so [--quick]

  python3 bench/bench_cuda.py --lib .libs/libflashattn.so --frontier [--dtypes bf16,f16]

  python3 bench/bench_cuda.py --compare old.so,new.so [--ops fwd] [--rounds 5]

--frontier: the CUDA frontier issue's table (B = 2, H D = 2048; forward at D 64/96/128/256,
backward at D 64/96/128/256, causal at D 128), ours beside FlashAttention-4 (flash_attn.cute,
where it imports: docs/notes/cuda.md says how to carry it), cuDNN and FA2 through SDPA, in
TFLOP/s, into report/gpu/frontier.csv (and the device, versions and date beside it in
report/gpu/frontier.txt). A kernel that refuses a shape gets nan.

--compare: two or more builds of the library on the frontier points, alternated round by round
in one process (the A/B of a kernel change: ratios to the first build, median over rounds).

Tables: the article's forward table (B=2, H=8, D=128, bf16, causal, N=512..32768), the bar
points (non-causal N=8192 forward; causal N=16384; backward N=8192), the head-dim sweep at
N=8192 with H*D fixed, forward+backward at B=1, H=8, N=8192 with peak memory, and device vs
wall time. FLOPs per docs/DESIGN.md §5: forward 4 B H Sq Sk D (halved for causal), backward 2.5x.
"""
import argparse
import ctypes as C
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

FA_F32, FA_F64, FA_F16, FA_BF16 = 0, 1, 2, 3
FA_BACKEND_CUDA = 4


class Tensor(C.Structure):
    _fields_ = [("data", C.c_void_p), ("dtype", C.c_int), ("batch", C.c_int64),
                ("seqlen", C.c_int64), ("heads", C.c_int64), ("headdim", C.c_int64),
                ("batch_stride", C.c_int64), ("seq_stride", C.c_int64),
                ("head_stride", C.c_int64), ("headdim_stride", C.c_int64)]


class Params(C.Structure):
    _fields_ = [("scale", C.c_double), ("causal", C.c_int), ("window_left", C.c_int64),
                ("window_right", C.c_int64), ("align", C.c_int), ("softcap", C.c_double),
                ("alibi_slopes", C.c_void_p), ("dropout_p", C.c_double),
                ("dropout_seed", C.c_uint64), ("dropout_offset", C.c_uint64),
                ("score_order", C.c_int), ("sink_logits", C.c_void_p), ("sink_grad", C.c_void_p),
                ("sink_tokens", C.c_int64), ("bias", C.c_void_p), ("bias_place", C.c_int),
                ("bias_by_slope", C.c_int), ("bias_grad", C.c_void_p), ("descale_q", C.c_void_p),
                ("descale_k", C.c_void_p), ("descale_v", C.c_void_p), ("descale_layout", C.c_int),
                ("block_mask", C.c_void_p)]  # all of fa_params: fa_params_init writes every field


class Options(C.Structure):
    _fields_ = [("backend", C.c_int), ("isa", C.c_int), ("num_threads", C.c_int),
                ("cuda_stream", C.c_void_p), ("deterministic", C.c_int)]


DT = {torch.bfloat16: FA_BF16, torch.float16: FA_F16, torch.float32: FA_F32}


def view(t):
    """fa_tensor of a torch (B, H, S, D) tensor (any strides, D contiguous); LSE is (B, H, S)."""
    if t.dim() == 3:
        b, h, s = t.shape
        return Tensor(t.data_ptr(), FA_F32, b, s, h, 1, t.stride(0), t.stride(2), t.stride(1), 1)
    b, h, s, d = t.shape
    assert t.stride(3) == 1
    return Tensor(t.data_ptr(), DT[t.dtype], b, s, h, d, t.stride(0), t.stride(2), t.stride(1), 1)


class Lib:
    def __init__(self, path, deterministic=0, kernel=None):
        """kernel: FA_CUDA_KERNEL while the context is made (the backend reads it then)."""
        self.l = C.CDLL(path)
        self.l.fa_last_error.restype = C.c_char_p
        o = Options()
        self.l.fa_options_init(C.byref(o))
        o.backend = FA_BACKEND_CUDA
        o.cuda_stream = torch.cuda.current_stream().cuda_stream
        o.deterministic = deterministic
        self.ctx = C.c_void_p()
        before = os.environ.pop("FA_CUDA_KERNEL", None)
        if kernel:
            os.environ["FA_CUDA_KERNEL"] = kernel
        try:
            self.check(self.l.fa_context_create(C.byref(o), C.byref(self.ctx)))
        finally:
            os.environ.pop("FA_CUDA_KERNEL", None)
            if before is not None:
                os.environ["FA_CUDA_KERNEL"] = before

    def check(self, s):
        if s != 0:
            raise RuntimeError("flashattn: status %d: %s" % (s, self.l.fa_last_error().decode()))

    def params(self, causal):
        p = Params()
        self.l.fa_params_init(C.byref(p))
        p.causal = 1 if causal else 0
        p.align = 1  # top-left, as torch's is_causal (the same when Sq == Sk)
        return p

    def forward(self, q, k, v, out, lse, causal):
        p = self.params(causal)
        self.check(self.l.fa_forward(self.ctx, C.byref(p), C.byref(view(q)), C.byref(view(k)),
                                     C.byref(view(v)), C.byref(view(out)), C.byref(view(lse))))

    def backward(self, q, k, v, out, lse, dout, dq, dk, dv, causal):
        p = self.params(causal)
        self.check(self.l.fa_backward(self.ctx, C.byref(p), C.byref(view(q)), C.byref(view(k)),
                                      C.byref(view(v)), C.byref(view(out)), C.byref(view(lse)),
                                      C.byref(view(dout)), C.byref(view(dq)), C.byref(view(dk)),
                                      C.byref(view(dv))))

    def mem(self):
        cur, peak = C.c_size_t(), C.c_size_t()
        self.l.fa_memory_stats(self.ctx, C.byref(cur), C.byref(peak))
        return cur.value, peak.value

    def mem_reset(self):
        self.l.fa_memory_stats_reset(self.ctx)


def time_ms(fn, reps, warmup=3):
    """Median device time of one call (CUDA events around each call)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def wall_ms(fn, reps, warmup=3):
    """Median wall time of one call including the host launch path, synchronized."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def enqueue_ms(fn, reps):
    """Median host time to issue one call, without waiting for the device."""
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(ts)


def inputs(B, H, N, D, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    mk = lambda: torch.randn(B, H, N, D, device="cuda", dtype=dtype, generator=g)
    return mk(), mk(), mk()


def sdpa(backend, q, k, v, causal):
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def fwd_flops(B, H, N, D, causal):
    f = 4.0 * B * H * N * N * D
    return f / 2 if causal else f


def fwd_row(lib, B, H, N, D, causal, reps, check=True, mma=None):
    q, k, v = inputs(B, H, N, D)
    out = torch.empty_like(q)
    lse = torch.empty(B, H, N, device="cuda", dtype=torch.float32)
    ours = time_ms(lambda: lib.forward(q, k, v, out, lse, causal), reps)
    res = {"ours": ours}
    if mma:  # the mma.sync kernel instead of wgmma (mma: a Lib made with FA_CUDA_KERNEL=mma)
        res["mma"] = time_ms(lambda: mma.forward(q, k, v, out, lse, causal), reps)
        lib.forward(q, k, v, out, lse, causal)  # the output checked below is the default's
    for name, be in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:
            res[name] = time_ms(lambda: sdpa(be, q, k, v, causal), reps)
        except Exception as e:  # a backend that refuses the shape
            res[name] = float("nan")
            print("  %s: %s" % (name, str(e).splitlines()[0]), file=sys.stderr)
    if check:
        ref = sdpa(SDPBackend.FLASH_ATTENTION, q, k, v, causal)
        res["maxdiff"] = (out.float() - ref.float()).abs().max().item()
    return res


# The frontier table's points: op, causal, H, N, D (B = 2).
FRONTIER = (("fwd", False, 16, 16384, 128), ("fwd", True, 16, 16384, 128),
            ("fwd", False, 32, 8192, 64), ("fwd", False, 21, 8192, 96), ("fwd", False, 8, 8192, 256),
            ("bwd", False, 16, 8192, 128), ("bwd", True, 16, 16384, 128),
            ("bwd", False, 32, 8192, 64), ("bwd", False, 21, 8192, 96), ("bwd", False, 8, 8192, 256))


def fa4_function():
    """FlashAttention-4's flash_attn_func (its CuTe DSL kernels), or None where it does not
    import (then its column is nan)."""
    try:
        from flash_attn.cute import flash_attn_func
        return flash_attn_func
    except Exception as e:  # not carried, or its DSL refused to load
        print("  fa4: %s" % (str(e).splitlines() or [type(e).__name__])[0], file=sys.stderr)
        return None


def peer_ms(op, fwd, q, k, v, reps):
    """A peer's median device time: its forward fwd(q, k, v) -> out, or its backward (autograd
    from one forward, the graph kept: the backward alone); nan where it refuses the shape."""
    try:
        if op == "fwd":
            with torch.no_grad():
                return time_ms(lambda: fwd(q, k, v), reps)
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        out = fwd(qg, kg, vg)
        dout = torch.randn_like(out)
        return time_ms(lambda: torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True),
                       reps, warmup=2)
    except Exception as e:
        print("  peer refused: %s" % (str(e).splitlines() or [type(e).__name__])[0][:160],
              file=sys.stderr)
        return float("nan")


def frontier(lib, dtypes, reps, out_dir):
    """The frontier table (FRONTIER, each dtype) into out_dir/frontier.csv."""
    fa4 = fa4_function()
    torch_dt = {"bf16": torch.bfloat16, "f16": torch.float16}
    rows = []
    for name in dtypes:
        dt = torch_dt[name]
        for op, causal, H, N, D in FRONTIER:
            B = 2
            q, k, v = inputs(B, H, N, D, dtype=dt)
            fl = fwd_flops(B, H, N, D, causal) * (2.5 if op == "bwd" else 1.0) / 1e9
            out = torch.empty_like(q)
            lse = torch.empty(B, H, N, device="cuda", dtype=torch.float32)
            try:
                lib.forward(q, k, v, out, lse, causal)
                if op == "fwd":
                    ours = time_ms(lambda: lib.forward(q, k, v, out, lse, causal), reps)
                else:
                    dout = torch.randn_like(q)
                    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
                    ours = time_ms(lambda: lib.backward(q, k, v, out, lse, dout, dq, dk, dv, causal),
                                   reps, warmup=2)
            except RuntimeError as e:
                print("  ours refused: %s" % str(e)[:160], file=sys.stderr)
                ours = float("nan")
            # FA4 takes (B, S, H, D): its own contiguous copies
            qs, ks, vs = (t.transpose(1, 2).contiguous() for t in (q, k, v))
            f4 = (lambda a, b, c: fa4(a, b, c, causal=causal)[0]) if fa4 else None
            t_fa4 = peer_ms(op, f4, qs, ks, vs, reps) if fa4 else float("nan")
            del qs, ks, vs
            t_cudnn = peer_ms(op, lambda a, b, c: sdpa(SDPBackend.CUDNN_ATTENTION, a, b, c, causal),
                              q, k, v, reps)
            t_fa2 = peer_ms(op, lambda a, b, c: sdpa(SDPBackend.FLASH_ATTENTION, a, b, c, causal),
                            q, k, v, reps)
            tf = [fl / t for t in (ours, t_fa4, t_cudnn, t_fa2)]
            best = max((x for x in tf[1:3] if x == x), default=float("nan"))
            print("%s %s causal=%d B=%d H=%d N=%d D=%d: ours %.0f | fa4 %.0f | cudnn %.0f | fa2 %.0f "
                  "TF/s | ours/best %.2f" % (op, name, causal, B, H, N, D, *tf, tf[0] / best))
            rows.append((op, name, int(causal), B, H, N, D, *tf))
            del q, k, v, out, lse
            torch.cuda.empty_cache()
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "frontier.csv"), "w") as f:
        f.write("op,dtype,causal,B,H,N,D,ours,fa4,cudnn,fa2\n")
        for r in rows:
            f.write("%s,%s,%d,%d,%d,%d,%d,%.1f,%.1f,%.1f,%.1f\n" % r)
    dev = torch.cuda.get_device_properties(0)
    try:  # the wheel's version (flash_attn itself has no __version__)
        from importlib.metadata import version
        fa4_version = version("flash-attn-4") if fa4 else "not imported"
    except Exception:
        fa4_version = "?"
    with open(os.path.join(out_dir, "frontier.txt"), "w") as f:
        f.write("%s UTC; %s, %d SMs; torch %s (cuDNN %s); flash_attn %s; TFLOP/s, CUDA-event "
                "medians of %d calls\n" % (time.strftime("%Y-%m-%d %H:%M", time.gmtime()), dev.name,
                                           dev.multi_processor_count, torch.__version__,
                                           torch.backends.cudnn.version(), fa4_version, reps))


def parse_points(text):
    """--points' list, "op:causal:H:N:D,..." (causal 0 or 1), as FRONTIER's tuples."""
    points = []
    for item in text.split(","):
        f = item.split(":")
        if len(f) != 5 or f[0] not in ("fwd", "bwd") or f[1] not in ("0", "1"):
            raise SystemExit("--points: %r is not op:causal:H:N:D (op fwd or bwd, causal 0 or 1)"
                             % item)
        points.append((f[0], f[1] == "1", int(f[2]), int(f[3]), int(f[4])))
    return points


def compare(paths, rounds, reps, ops, dims, points=FRONTIER):
    """Builds of the library side by side on the points (the frontier's by default) of `ops`
    (bf16): each round times every build once per point, the order rotated from round to
    round; prints each build's median TFLOP/s and the median over rounds of its per-round
    ratio to the first."""
    libs = [Lib(p) for p in paths]
    for op, causal, H, N, D in points:
        if op not in ops or D not in dims:
            continue
        B = 2
        q, k, v = inputs(B, H, N, D)
        out = torch.empty_like(q)
        lse = torch.empty(B, H, N, device="cuda", dtype=torch.float32)
        dout, dq, dk, dv = (torch.randn_like(q), torch.empty_like(q), torch.empty_like(k),
                            torch.empty_like(v))
        libs[0].forward(q, k, v, out, lse, causal)
        fl = fwd_flops(B, H, N, D, causal) * (2.5 if op == "bwd" else 1.0) / 1e9
        tf = [[] for _ in libs]
        for r in range(rounds):
            for x in range(len(libs)):
                i = (x + r) % len(libs)
                lib = libs[i]
                call = ((lambda: lib.forward(q, k, v, out, lse, causal)) if op == "fwd" else
                        (lambda: lib.backward(q, k, v, out, lse, dout, dq, dk, dv, causal)))
                tf[i].append(fl / time_ms(call, reps))
        ratios = [statistics.median(t[r] / tf[0][r] for r in range(rounds)) for t in tf]
        print("%s causal=%d H=%d N=%d D=%d: %s" % (
            op, causal, H, N, D, " | ".join("%s %.0f TF/s x%.3f" % (os.path.basename(p),
                                                                    statistics.median(t), x)
                                            for p, t, x in zip(paths, tf, ratios))))
        del q, k, v, out, lse, dout, dq, dk, dv
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default=".libs/libflashattn.so")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="fewer sizes")
    ap.add_argument("--skip-backward", action="store_true")
    ap.add_argument("--only-bar", action="store_true", help="the forward bar points only")
    ap.add_argument("--only-bwd", action="store_true", help="the forward+backward table only")
    ap.add_argument("--frontier", action="store_true", help="the frontier table only")
    ap.add_argument("--dtypes", default="bf16", help="--frontier's dtypes: bf16, f16")
    ap.add_argument("--out", default="report/gpu", help="--frontier's folder")
    ap.add_argument("--compare", help="builds to set side by side (comma-separated library "
                    "paths; the first is the baseline) on the frontier points")
    ap.add_argument("--rounds", type=int, default=5, help="--compare's rounds")
    ap.add_argument("--ops", default="fwd,bwd", help="--compare's ops: fwd, bwd")
    ap.add_argument("--dims", default="64,96,128,256", help="--compare's head dims")
    ap.add_argument("--points", help="--compare's points instead of the frontier's: "
                    "op:causal:H:N:D,... (B = 2)")
    a = ap.parse_args()
    if a.compare:
        compare(a.compare.split(","), a.rounds, a.reps, a.ops.split(","),
                [int(d) for d in a.dims.split(",")],
                parse_points(a.points) if a.points else FRONTIER)
        return
    lib = Lib(a.lib)
    dev = torch.cuda.get_device_properties(0)
    print("device: %s, %d SMs; torch %s" % (dev.name, dev.multi_processor_count, torch.__version__))

    if a.frontier:
        frontier(lib, a.dtypes.split(","), a.reps, a.out)
        return
    if a.only_bwd:
        backward_table(lib, Lib(a.lib, deterministic=1), Lib(a.lib, kernel="mma"))
        return
    if a.only_bar:
        for causal, N in ((False, 8192), (True, 16384)):
            r = fwd_row(lib, 2, 8, N, 128, causal, a.reps, mma=Lib(a.lib, kernel="mma"))
            fl = fwd_flops(2, 8, N, 128, causal) / 1e9
            print("bar fwd causal=%d N=%d: ours %.3f ms %.1f TF/s | mma.sync %.3f ms %.1f | flash %.3f ms "
                  "%.1f | cudnn %.3f ms %.1f | x%.2f flash x%.2f cudnn | maxdiff %.2e" % (
                      causal, N, r["ours"], fl / r["ours"], r["mma"], fl / r["mma"], r["flash"],
                      fl / r["flash"], r["cudnn"], fl / r["cudnn"], r["flash"] / r["ours"],
                      r["cudnn"] / r["ours"], r["maxdiff"]))
        return
    print("\n== forward, B=2 H=8 D=128 bf16 causal (ms, TFLOP/s; ratio = torch time / ours)")
    print("%6s %9s %7s %9s %7s %9s %7s %7s %7s %9s" % ("N", "ours ms", "TF/s", "flash ms", "TF/s",
                                                      "cudnn ms", "TF/s", "xflash", "xcudnn", "maxdiff"))
    Ns = [512, 1024, 2048, 4096, 8192, 16384, 32768]
    if a.quick:
        Ns = [1024, 8192, 16384]
    for N in Ns:
        r = fwd_row(lib, 2, 8, N, 128, True, a.reps)
        fl = fwd_flops(2, 8, N, 128, True) / 1e9
        print("%6d %9.3f %7.1f %9.3f %7.1f %9.3f %7.1f %7.2f %7.2f %9.2e" % (
            N, r["ours"], fl / r["ours"], r["flash"], fl / r["flash"], r["cudnn"], fl / r["cudnn"],
            r["flash"] / r["ours"], r["cudnn"] / r["ours"], r["maxdiff"]))

    print("\n== kernels that ran (torch profiler), forward + backward B=1 H=8 N=1024 D=128 bf16")
    q, k, v = inputs(1, 8, 1024, 128)
    out, dout = torch.empty_like(q), torch.randn_like(q)
    lse = torch.empty(1, 8, 1024, device="cuda", dtype=torch.float32)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        lib.forward(q, k, v, out, lse, False)
        lib.backward(q, k, v, out, lse, dout, dq, dk, dv, False)
        torch.cuda.synchronize()
    for e in prof.key_averages():
        if e.device_type == torch.autograd.DeviceType.CUDA or "kernel" in e.key:
            print("  %s" % e.key[:150])

    print("\n== bar: forward non-causal N=8192 B=2 H=8 D=128 bf16")
    r = fwd_row(lib, 2, 8, 8192, 128, False, a.reps)
    fl = fwd_flops(2, 8, 8192, 128, False) / 1e9
    print("ours %.3f ms %.1f TF/s | flash %.3f ms %.1f TF/s | cudnn %.3f ms %.1f TF/s | "
          "ours/flash speed %.2fx, vs cudnn %.2fx | maxdiff %.2e" % (
              r["ours"], fl / r["ours"], r["flash"], fl / r["flash"], r["cudnn"], fl / r["cudnn"],
              r["flash"] / r["ours"], r["cudnn"] / r["ours"], r["maxdiff"]))

    print("\n== head-dim sweep, forward, N=8192, B=2, H*D=1024, bf16 (non-causal | causal)")
    for D in (32, 64, 96, 128, 256):
        H = 1024 // D if D != 96 else 10
        for causal in (False, True):
            r = fwd_row(lib, 2, H, 8192, D, causal, max(5, a.reps // 2))
            fl = fwd_flops(2, H, 8192, D, causal) / 1e9
            print("D=%3d H=%2d causal=%d: ours %.3f ms %.1f TF/s | flash %.3f ms %.1f | cudnn %.3f ms "
                  "%.1f | x%.2f flash x%.2f cudnn | maxdiff %.2e" % (
                      D, H, causal, r["ours"], fl / r["ours"], r["flash"], fl / r["flash"], r["cudnn"],
                      fl / r["cudnn"], r["flash"] / r["ours"], r["cudnn"] / r["ours"], r["maxdiff"]))

    print("\n== peak memory, forward N=32768 B=2 H=8 D=128 causal (MiB beyond the inputs)")
    q, k, v = inputs(2, 8, 32768, 128)
    torch.cuda.synchronize()
    for name, be in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        o = sdpa(be, q, k, v, True)
        torch.cuda.synchronize()
        print("%s: %.1f MiB (output included)" % (name, (torch.cuda.max_memory_allocated() - base) / 2**20))
        del o
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = torch.empty_like(q)
    lse = torch.empty(2, 8, 32768, device="cuda", dtype=torch.float32)
    lib.mem_reset()
    lib.forward(q, k, v, out, lse, True)
    torch.cuda.synchronize()
    print("ours: %.1f MiB (output + LSE, allocated by the caller) + %.3f MiB library peak" % (
        (torch.cuda.max_memory_allocated() - base) / 2**20, lib.mem()[1] / 2**20))
    del q, k, v, out, lse

    print("\n== device vs wall time, forward causal B=2 H=8 D=128 (ms)")
    for N in (512, 8192):
        q, k, v = inputs(2, 8, N, 128)
        out = torch.empty_like(q)
        lse = torch.empty(2, 8, N, device="cuda", dtype=torch.float32)
        fo = lambda: lib.forward(q, k, v, out, lse, True)
        ff = lambda: sdpa(SDPBackend.FLASH_ATTENTION, q, k, v, True)
        print("N=%5d: ours device %.3f wall %.3f | flash device %.3f wall %.3f" % (
            N, time_ms(fo, a.reps), wall_ms(fo, a.reps), time_ms(ff, a.reps), wall_ms(ff, a.reps)))

    if a.skip_backward:
        return
    backward_table(lib, Lib(a.lib, deterministic=1), Lib(a.lib, kernel="mma"))


def backward_table(lib, lib_det, lib_mma):
    print("\n== forward + backward, B=1 H=8 N=8192 D=128 bf16 (non-causal | causal)")
    for causal in (False, True):
        B, H, N, D = 1, 8, 8192, 128
        q, k, v = inputs(B, H, N, D)
        dout = torch.randn_like(q)
        out = torch.empty_like(q)
        lse = torch.empty(B, H, N, device="cuda", dtype=torch.float32)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        lib.forward(q, k, v, out, lse, causal)
        tf = time_ms(lambda: lib.forward(q, k, v, out, lse, causal), 5)
        lib.mem_reset()
        tb = time_ms(lambda: lib.backward(q, k, v, out, lse, dout, dq, dk, dv, causal), 3, warmup=1)
        libpeak = lib.mem()[1]
        tbd = time_ms(lambda: lib_det.backward(q, k, v, out, lse, dout, dq, dk, dv, causal), 3, warmup=1)
        # the mma.sync backward, for the version table
        tbm = time_ms(lambda: lib_mma.backward(q, k, v, out, lse, dout, dq, dk, dv, causal), 3,
                      warmup=1)
        lib.backward(q, k, v, out, lse, dout, dq, dk, dv, causal)  # the default's, compared below
        fl = fwd_flops(B, H, N, D, causal) / 1e9
        # torch: autograd through the flash backend
        qt, kt, vt = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
        res = {}
        for name, be in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            try:
                with sdpa_kernel(be):
                    o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                    tfw = time_ms(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal), 5)
                    torch.cuda.reset_peak_memory_stats()
                    base = torch.cuda.memory_allocated()
                    tbw = time_ms(lambda: torch.autograd.grad(o, (qt, kt, vt), dout, retain_graph=True), 5)
                    pk = torch.cuda.max_memory_allocated() - base
                    g = torch.autograd.grad(o, (qt, kt, vt), dout, retain_graph=True)
                res[name] = (tfw, tbw, pk, g)
            except Exception as e:
                print("  %s: %s" % (name, str(e).splitlines()[0]), file=sys.stderr)
        gd = max((dq.float() - res["flash"][3][0].float()).abs().max().item(),
                 (dk.float() - res["flash"][3][1].float()).abs().max().item(),
                 (dv.float() - res["flash"][3][2].float()).abs().max().item()) if "flash" in res else float("nan")
        print("causal=%d ours: fwd %.3f ms, bwd %.3f ms (%.1f TF/s), bwd/fwd %.2f, library peak %.1f MiB, "
              "max|grad - flash grad| %.2e; deterministic bwd %.3f ms (%.1f TF/s); "
              "mma.sync bwd %.3f ms (%.1f TF/s)" % (
                  causal, tf, tb, 2.5 * fl / tb, tb / tf, libpeak / 2**20, gd, tbd,
                  2.5 * fl / tbd, tbm, 2.5 * fl / tbm))
        for name, (tfw, tbw, pk, _) in res.items():
            print("causal=%d %s: fwd %.3f ms, bwd %.3f ms (%.1f TF/s), bwd/fwd %.2f, bwd peak %.1f MiB; "
                  "ours bwd speed = %.3fx %s" % (causal, name, tfw, tbw, 2.5 * fl / tbw, tbw / tfw,
                                                 pk / 2**20, tbw / tb, name))


if __name__ == "__main__":
    main()
