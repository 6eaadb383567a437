#!/usr/bin/env python3
"""The seed article's measured claims on a GPU (issue 20), the GPU half of `make report`.

  python3 bench/report_gpu.py --lib .libs/libflashattn.so [--quick] [--dir report]

Writes DIR/GPU.md, one CSV per table under DIR/gpu/ and DIR/gpu/claims.tsv (id, figure,
verdict: the H200 column of REPORT.md's table; ids as bench/report.c names its claims).
`make report` draws the plots from these CSVs (bench/report.gp). Needs PyTorch with CUDA;
flashattn's CUDA backend is loaded through ctypes (bench/bench_cuda.py's binding) and measured
beside the conventional path (explicit matmul, softmax, matmul in the storage dtype: the
article's "two intermediates materialized"), SDPA's FLASH_ATTENTION (FlashAttention-2) and
CUDNN_ATTENTION backends, on the same device tensors. Energy from NVML (nvidia-ml-py) when it
is installed. Device times from CUDA events; each section names itself on stderr.
"""
import argparse
import math
import os
import sys
import time
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_cuda import Lib, enqueue_ms, inputs, time_ms, wall_ms  # noqa: E402

T0 = time.time()
warnings.filterwarnings("ignore")  # SDPA's "kernel not used because" for the shapes it refuses
MIB = 1024.0 * 1024.0


def progress(section, what):
    print("[%6.1f s] %-16s %s" % (time.time() - T0, section, what), file=sys.stderr, flush=True)


def conventional(q, k, v, causal):
    """S and P materialized in the storage dtype (a framework's unfused path)."""
    s = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    if causal:
        n = q.shape[-2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1),
                          float("-inf"))
    return torch.matmul(torch.softmax(s, dim=-1), v)


def sdpa(backend, causal):
    def f(q, k, v):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return f


class Ours:
    """flashattn's CUDA backend as a q, k, v -> out function (out and LSE allocated once)."""

    def __init__(self, lib, causal):
        self.lib, self.causal, self.bufs = lib, causal, {}

    def __call__(self, q, k, v):
        key = (q.shape, q.dtype)
        if key not in self.bufs:
            b, h, n, _ = q.shape
            self.bufs = {key: (torch.empty_like(q),
                               torch.empty(b, h, n, device="cuda", dtype=torch.float32))}
        out, lse = self.bufs[key]
        self.lib.forward(q, k, v, out, lse, self.causal)
        return out


def paths(lib, causal):
    return [("conventional", lambda q, k, v: conventional(q, k, v, causal)),
            ("flash", sdpa(SDPBackend.FLASH_ATTENTION, causal)),
            ("cudnn", sdpa(SDPBackend.CUDNN_ATTENTION, causal)),
            ("flashattn", Ours(lib, causal))]


def try_ms(fn, reps):
    try:
        return time_ms(fn, reps)
    except Exception as e:  # a backend that refuses the shape, or memory
        print("   %s" % str(e).splitlines()[0][:120], file=sys.stderr)
        torch.cuda.empty_cache()
        return float("nan")


class Report:
    def __init__(self, d, quick):
        self.dir, self.quick, self.md, self.claims = d, quick, [], []
        os.makedirs(os.path.join(d, "gpu"), exist_ok=True)

    def csv(self, name, header, rows):
        with open(os.path.join(self.dir, "gpu", name), "w") as f:
            f.write(",".join(header) + "\n")
            for r in rows:
                f.write(",".join(("%.6g" % x) if isinstance(x, float) else str(x) for x in r)
                        + "\n")

    def table(self, header, rows):
        self.md.append("| " + " | ".join(header) + " |")
        self.md.append("|" + " --- |" * len(header))
        for r in rows:
            self.md.append("| " + " | ".join(cell(x) for x in r) + " |")
        self.md.append("")

    def claim(self, cid, figure, verdict):
        self.claims.append((cid, " ".join(figure.split()), verdict))


def cell(x):
    """A table cell: counts as integers, times and sizes to 4 digits, errors in e-notation."""
    if not isinstance(x, float):
        return str(x)
    if x != x:
        return "n/a"
    if abs(x) >= 1000:
        return "%.0f" % x
    return "%.4g" % x if abs(x) >= 0.01 else "%.2e" % x


def nbytes(*ts):
    return sum(t.numel() * t.element_size() for t in ts)


def peak_of(fn, *held):
    """Peak bytes torch allocated while fn ran, above what was allocated before it (cuBLAS's
    workspace, earlier points' buffers), plus the tensors `held` that the call reads or writes
    and that were allocated before it (inputs, preallocated outputs)."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before + nbytes(*held)


def sec_memory(r, lib):
    ns = [256, 512, 1024] if r.quick else [512, 1024, 2048, 4096, 8192, 16384, 32768]
    rows = []
    for n in ns:
        progress("§2.2 memory", "N=%d" % n)
        q, k, v = inputs(1, 8, n, 128)
        row = [n]
        for name, f in paths(lib, False):
            if name == "cudnn":
                continue
            try:
                f(q, k, v)  # warm: cuBLAS's workspace, our out and LSE
                out = f(q, k, v)
                held = (q, k, v, out) if name == "flashattn" else (q, k, v)
                if name == "flashattn":
                    held += (f.bufs[(q.shape, q.dtype)][1],)
                    lib.mem_reset()  # our workspace is not torch's
                peak = peak_of(lambda: f(q, k, v), *held)
                if name == "flashattn":
                    peak += lib.mem()[1]
                del out
                row.append(peak / MIB)
            except torch.cuda.OutOfMemoryError:
                row.append(float("nan"))
            torch.cuda.empty_cache()
        rows.append(row + [row[1] / row[2]])
        del q, k, v
    r.csv("memory.csv", ["N", "conventional_MiB", "fused_MiB", "flashattn_MiB", "ratio"], rows)
    r.md += ["## Memory is a slope (§2.2)", "",
             "Forward, bf16, B=1, H=8, D=128, non-causal; torch's peak allocated bytes (inputs "
             "included), plus flashattn's workspace for its column.", "",
             "![memory](gpu-memory.png)", ""]
    r.table(["N", "conventional MiB", "SDPA flash MiB", "flashattn MiB", "conv / flash"], rows)
    first, last = rows[0][-1], rows[-1][-1]
    r.claim("memory", "%.2fx at N=%d, %.1fx at N=%d" % (first, ns[0], last, ns[-1]),
            "reproduced" if last > 4 * first else "not reproduced")


def sec_speedup(r, lib):
    ns = [256, 512, 1024] if r.quick else [512, 1024, 2048, 4096, 8192, 16384]
    rows = []
    for n in ns:
        progress("§6.1 speedup", "N=%d" % n)
        q, k, v = inputs(2, 8, n, 128)
        reps = 5 if n >= 8192 else 20
        rows.append([n] + [try_ms(lambda: f(q, k, v), reps) for _, f in paths(lib, True)])
        del q, k, v
        torch.cuda.empty_cache()
    for row in rows:
        row.append(row[1] / min(x for x in row[2:5] if x == x))
    r.csv("speedup.csv", ["N", "conventional_ms", "flash_ms", "cudnn_ms", "flashattn_ms",
                          "speedup_best_fused"], rows)
    r.md += ["## Speedup grows with N (§6.1)", "",
             "Forward, bf16, B=2, H=8, D=128, causal; median device time (CUDA events).", "",
             "![time](gpu-time.png)", ""]
    r.table(["N", "conventional ms", "SDPA flash ms", "cuDNN ms", "flashattn ms",
             "conventional / fastest fused"], rows)
    a, b = rows[0][-1], rows[-1][-1]
    r.claim("speedup", "%.2fx at N=%d -> %.1fx at N=%d (fastest fused)" % (a, ns[0], b, ns[-1]),
            "reproduced" if b > 1.2 * a else "not reproduced")


def sec_headdim(r, lib):
    n = 1024 if r.quick else 8192
    rows = []
    for d in (32, 64, 128, 256):
        progress("§5.3 head dim", "D=%d" % d)
        q, k, v = inputs(1, 1024 // d, n, d)
        rows.append([d, 1024 // d] + [try_ms(lambda: f(q, k, v), 10) for _, f in paths(lib, False)])
        del q, k, v
        torch.cuda.empty_cache()
    r.csv("headdim.csv", ["D", "H", "conventional_ms", "flash_ms", "cudnn_ms", "flashattn_ms"],
          rows)
    r.md += ["## The head dimension (§5.3)", "",
             "Forward, bf16, N=%d, B=1, H x D = 1024, non-causal; median device ms." % n, ""]
    r.table(["D", "H", "conventional", "SDPA flash", "cuDNN", "flashattn"], rows)
    fl = rows[-1][3] / rows[0][3]
    cu = rows[-1][4] / rows[0][4]
    r.claim("headdim", "SDPA flash D=256/D=32 time %.2fx, cuDNN %.2fx, flashattn %.2fx"
            % (fl, cu, rows[-1][5] / rows[0][5]), "reproduced" if fl > 1.5 else "not reproduced")  # bench/report.c's rule


def backward_call(name, f, q, k, v, do):
    """A function running one backward of path `name` after its forward, and the tensors that
    call holds beyond q, k, v, do (our preallocated out, LSE and gradients)."""
    if name == "flashattn":
        out = f(q, k, v)
        lse = f.bufs[(q.shape, q.dtype)][1]
        dq, dk, dv = (torch.empty_like(x) for x in (q, k, v))
        return (lambda: f.lib.backward(q, k, v, out, lse, do, dq, dk, dv, f.causal),
                (out, lse, dq, dk, dv))
    qq, kk, vv = (x.detach().requires_grad_() for x in (q, k, v))
    out = f(qq, kk, vv)
    return lambda: torch.autograd.grad(out, (qq, kk, vv), do, retain_graph=True), ()


def fwd_bwd(name, f, q, k, v, do, reps):
    """(forward ms, backward ms, peak MiB over a forward and a backward)."""
    fwd = time_ms(lambda: f(q, k, v), reps)
    call, held = backward_call(name, f, q, k, v, do)
    bwd = time_ms(call, reps)
    if name == "flashattn":  # out, LSE and gradients preallocated: held
        f.lib.mem_reset()
        peak = peak_of(lambda: (f(q, k, v), call()), q, k, v, do, *held) + f.lib.mem()[1]
    else:
        del call  # the graph kept for the timing
        qq, kk, vv = (x.detach().requires_grad_() for x in (q, k, v))
        peak = peak_of(lambda: torch.autograd.grad(f(qq, kk, vv), (qq, kk, vv), do),
                       q, k, v, do)
    return fwd, bwd, peak / MIB


def sec_backward(r, lib):
    n = 1024 if r.quick else 8192
    q, k, v = inputs(1, 8, n, 128)
    do = torch.randn_like(q)
    rows = []
    for name, f in paths(lib, False):
        progress("§4.5 backward", "%s N=%d" % (name, n))
        try:
            fw, bw, pk = fwd_bwd(name, f, q, k, v, do, 10)
            rows.append([name, fw, bw, bw / fw, pk])
        except Exception as e:
            print("   %s" % str(e).splitlines()[0][:120], file=sys.stderr)
        torch.cuda.empty_cache()
    r.csv("backward.csv", ["path", "forward_ms", "backward_ms", "backward_over_forward",
                           "peak_MiB"], rows)
    r.md += ["## Backward by recomputation (§4.5)", "",
             "bf16, N=%d, B=1, H=8, D=128, non-causal; peak over forward+backward (inputs "
             "and dO included)." % n, ""]
    r.table(["path", "forward ms", "backward ms", "backward / forward", "peak MiB"], rows)
    by = {row[0]: row for row in rows}
    if "conventional" in by and "flash" in by:
        mem = by["conventional"][4] / by["flash"][4]
        r.claim("backward-memory", "%.1fx smaller (SDPA flash %.0f vs %.0f MiB)"
                % (mem, by["flash"][4], by["conventional"][4]),
                "reproduced" if mem >= 10 else "not reproduced")
        fl, cv = by["flash"][3], by["conventional"][3]
        ours = ", flashattn %.2f" % by["flashattn"][3] if "flashattn" in by else ""
        r.claim("backward-time", "SDPA flash %.2f%s, conventional %.2f" % (fl, ours, cv),
                "reproduced" if fl > cv and fl >= 2.5 else  # bench/report.c's rule
                "partly" if fl > cv else "not reproduced")
    # Launch overhead: the host's enqueue time and the wall time against the device time of
    # the same backward call, at the article's N and at a short one.
    rows = []
    for m in ([256, 1024] if r.quick else [512, 8192]):
        q, k, v = inputs(1, 8, m, 128)
        do = torch.randn_like(q)
        for name, f in paths(lib, False)[1:]:
            if name == "cudnn":
                continue
            progress("§4.5 overhead", "%s backward N=%d device, enqueue, wall" % (name, m))
            call = backward_call(name, f, q, k, v, do)[0]
            rows.append([m, name, time_ms(call, 20), enqueue_ms(call, 20), wall_ms(call, 20)])
            rows[-1].append(rows[-1][4] / rows[-1][2])
    r.csv("overhead.csv", ["N", "path", "device_ms", "enqueue_ms", "wall_ms", "wall_over_device"],
          rows)
    r.md += ["## Launch overhead (§4.5)", "",
             "Backward, bf16, B=1, H=8, D=128: median device time (CUDA events), host time to "
             "enqueue the call (no synchronize), and wall time (the call and a synchronize).", ""]
    r.table(["N", "path", "device ms", "enqueue ms", "wall ms", "wall / device"], rows)
    short = [x for x in rows if x[0] == rows[0][0]]
    r.claim("overhead", "; ".join("N=%d %s: %.3f ms device, %.3f ms enqueue, %.3f ms wall"
                                  % (x[0], x[1], x[2], x[3], x[4]) for x in short),
            "reproduced" if any(x[3] > x[2] for x in short) else
            "partly" if any(x[3] > 0.5 * x[2] for x in short) else "not reproduced")


class Block(torch.nn.Module):
    def __init__(self, d, dff, heads, attn):
        super().__init__()
        self.heads, self.attn = heads, attn
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.ff1, self.ff2 = torch.nn.Linear(d, dff), torch.nn.Linear(dff, d)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, n, 3, self.heads, d // self.heads).permute(
            2, 0, 3, 1, 4)
        o = self.attn(q, k, v).transpose(1, 2).reshape(b, n, d)
        x = x + self.proj(o)
        return x + self.ff2(F.gelu(self.ff1(self.ln2(x))))


def sec_training(r, lib):
    layers, d, dff, heads, batch = (2, 256, 1024, 4, 2) if r.quick else (8, 512, 2048, 8, 8)
    seqs = [128, 256] if r.quick else [256, 1024, 4096]
    rows = []
    for n in seqs:
        res = {}
        for name, attn in (("conventional", lambda q, k, v: conventional(q, k, v, True)),
                           ("flash", sdpa(SDPBackend.FLASH_ATTENTION, True))):
            progress("§7.1 training", "seqlen=%d %s" % (n, name))
            torch.manual_seed(0)
            model = torch.nn.Sequential(*[Block(d, dff, heads, attn) for _ in range(layers)]).to(
                "cuda", torch.bfloat16)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
            x = torch.randn(batch, n, d, device="cuda", dtype=torch.bfloat16)
            y = torch.randn_like(x)

            def step():
                opt.zero_grad(set_to_none=True)
                F.mse_loss(model(x), y).backward()
                opt.step()
            torch.cuda.reset_peak_memory_stats()
            step_ms = time_ms(step, 5, warmup=2)
            peak = torch.cuda.max_memory_allocated() / MIB
            q, k, v = (torch.randn(batch, heads, n, d // heads, device="cuda",
                                   dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
            do = torch.randn(batch, heads, n, d // heads, device="cuda", dtype=torch.bfloat16)
            attn_ms = layers * time_ms(
                lambda: torch.autograd.grad(attn(q, k, v), (q, k, v), do), 5)
            res[name] = (step_ms, attn_ms, peak)
            rows.append([n, name, step_ms, attn_ms, attn_ms / step_ms,
                         batch * n / (step_ms * 1e-3), peak])
            del model, opt, x, y, q, k, v, do
            torch.cuda.empty_cache()
        c, f = res["conventional"], res["flash"]
        res["speedups"] = (c[0] / f[0], c[1] / f[1], c[1] / c[0])
        rows[-1].append(res["speedups"])
    r.csv("training.csv", ["seqlen", "path", "step_ms", "attention_ms", "attention_share",
                           "tokens_per_s", "peak_MiB"], [x[:7] for x in rows])
    r.md += ["## A kernel speedup is not a step speedup (§7.1)", "",
             "%d pre-norm layers, model dim %d, FFN %d (GELU), %d heads, batch %d, bf16, causal, "
             "AdamW; step = forward, MSE loss, backward, optimizer (median of 5 after 2). "
             "Attention ms = %d x one attention forward+backward at the step's shape, timed "
             "alone." % (layers, d, dff, heads, batch, layers), ""]
    r.table(["seqlen", "path", "step ms", "attention ms", "attention share", "tokens/s",
             "peak MiB"], [x[:4] + ["%.1f%%" % (100 * x[4])] + x[5:7] for x in rows])
    sp = [x[7] for x in rows if len(x) > 7]
    r.md += ["| seqlen | step speedup | attention speedup | attention share (conventional) |",
             "| --- | --- | --- | --- |"]
    r.md += ["| %d | %.2fx | %.2fx | %.1f%% |" % (n, s[0], s[1], 100 * s[2])
             for n, s in zip(seqs, sp)] + [""]
    r.claim("training", "seqlen %d: attention %.1f%% of the step, step %.2fx; seqlen %d: %.1f%%, "
            "step %.2fx (attention %.2fx)" % (seqs[0], 100 * sp[0][2], sp[0][0], seqs[-1],
                                              100 * sp[-1][2], sp[-1][0], sp[-1][1]),
            # bench/report.c's rule: the step gains more at long N, and less than attention
            "reproduced" if sp[-1][0] > sp[0][0] and sp[-1][0] < sp[-1][1] else "partly")


def sec_energy(r, lib):
    try:
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        energy = lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(h) * 1e-3  # noqa: E731 (J)
        energy()
    except Exception as e:
        r.md += ["## Energy (§7.2)", "", "No NVML energy counter: %s" % e, ""]
        r.claim("energy", "no counter (%s)" % type(e).__name__, "not measured")
        return
    n = 2048 if r.quick else 16384
    seconds = 1.0 if r.quick else 4.0
    progress("§7.2 energy", "idle draw")
    torch.cuda.synchronize()
    e0, t0 = energy(), time.time()
    time.sleep(seconds)
    idle = (energy() - e0) / (time.time() - t0)
    q, k, v = inputs(2, 8, n, 128)
    rows = []
    for name, f in paths(lib, True):
        progress("§7.2 energy", "%s N=%d" % (name, n))
        try:
            f(q, k, v)
            torch.cuda.synchronize()
            calls, e0, t0 = 0, energy(), time.time()
            while time.time() - t0 < seconds:
                f(q, k, v)
                torch.cuda.synchronize()
                calls += 1
            dt, de = time.time() - t0, energy() - e0
            rows.append([name, 1e3 * dt / calls, de / dt - idle, (de - idle * dt) / calls])
        except Exception as e:
            print("   %s" % str(e).splitlines()[0][:120], file=sys.stderr)
        torch.cuda.empty_cache()
    r.csv("energy.csv", ["path", "ms_per_call", "watts_above_idle", "joules_per_call"], rows)
    r.md += ["## Energy (§7.2)", "",
             "NVML's total-energy counter around back-to-back forwards (bf16, B=2, H=8, N=%d, "
             "D=128, causal) for %.0f s each; idle %.0f W subtracted." % (n, seconds, idle), ""]
    r.table(["path", "ms per call", "W above idle", "J per call above idle"], rows)
    by = {x[0]: x for x in rows}
    if "conventional" in by and "flash" in by:
        c, f = by["conventional"], by["flash"]
        r.claim("energy", "SDPA flash %.0f W vs conventional %.0f W above idle; %.1fx fewer J"
                % (f[2], c[2], c[3] / f[3]),
                "reproduced" if f[3] < c[3] and f[2] > c[2] else
                "partly" if f[3] < c[3] else "not reproduced")


def sec_accuracy(r, lib):
    n = 1024 if r.quick else 8192
    rows = []
    g = torch.Generator(device="cuda").manual_seed(5)
    base = [torch.randn(1, 2, n, 128, device="cuda", dtype=torch.float64, generator=g)
            for _ in range(3)]
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        progress("§8 accuracy", "N=%d %s" % (n, dt))
        q, k, v = (x.to(dt) for x in base)
        ref = conventional(*(x.double() for x in (q, k, v)), False)
        row = [str(dt).replace("torch.", "")]
        for name, f in paths(lib, False):
            try:
                row.append((f(q, k, v).double() - ref).abs().max().item())
            except Exception:
                row.append(float("nan"))
        rows.append(row)
    r.csv("accuracy.csv", ["dtype", "conventional", "flash", "cudnn", "flashattn"], rows)
    r.md += ["## Accuracy (§8)", "",
             "Max |out - float64| (torch float64 on the device, same rounded inputs), N=%d, "
             "B=1, H=2, D=128, non-causal." % n, ""]
    r.table(["dtype", "conventional", "SDPA flash", "cuDNN", "flashattn"], rows)
    half = [x for x in rows if x[0] != "float32"]
    better = all(x[2] < x[1] and x[4] < x[1] for x in half)
    r.claim("accuracy-dtype", "; ".join("%s conventional %.2g, flash %.2g, flashattn %.2g"
                                        % (x[0], x[1], x[2], x[4]) for x in half),
            "reproduced" if better else "not reproduced")
    ns = [256, 512, 1024] if r.quick else [512, 1024, 2048, 4096, 8192]
    rows = []
    ours = Ours(lib, False)
    for m in ns:
        progress("§8 accuracy", "f32 error against N=%d" % m)
        q, k, v = (x[:, :, :m].float().contiguous() for x in base)
        ref = conventional(*(x.double() for x in (q, k, v)), False)
        rows.append([m, (conventional(q, k, v, False).double() - ref).abs().max().item(),
                     (ours(q, k, v).double() - ref).abs().max().item()])
    r.csv("error_vs_n.csv", ["N", "conventional_max_err", "flashattn_max_err"], rows)
    r.md += ["f32 against N (flashattn's CUDA backend; SDPA flash takes no f32):", ""]
    r.table(["N", "conventional", "flashattn"], rows)
    lo, hi = min(x[2] for x in rows), max(x[2] for x in rows)
    r.claim("accuracy-n", "flashattn f32 %.2g to %.2g over N=%d..%d" % (lo, hi, ns[0], ns[-1]),
            "reproduced" if hi < 4 * lo else "not reproduced")
    rows = []
    q, k, v = (x.to(torch.bfloat16) for x in base)
    for name, f in paths(lib, True):
        progress("§8 bitwise", name)
        try:
            first = f(q, k, v).clone()
            same = sum(bool(torch.equal(first, f(q, k, v))) for _ in range(9)) + 1
            rows.append([name, 10, same])
        except Exception as e:
            print("   %s: %s" % (name, str(e).splitlines()[0][:120]), file=sys.stderr)
    r.csv("bitwise.csv", ["path", "runs", "bitwise_equal_to_first"], rows)
    r.md += ["Bitwise: 10 identical forward calls (bf16, causal, N=%d), compared with the first:"
             % n, ""]
    r.table(["path", "runs", "equal to the first"], rows)
    r.claim("bitwise", ", ".join("%s %d/%d" % (x[0], x[2], x[1]) for x in rows),
            "reproduced" if len(rows) == 4 and all(x[2] == x[1] for x in rows) else
            "not reproduced")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default=".libs/libflashattn.so")
    ap.add_argument("--dir", default="report")
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    a = ap.parse_args()
    r = Report(a.dir, a.quick)
    lib = Lib(a.lib)
    sections = (sec_memory, sec_speedup, sec_headdim, sec_backward, sec_training, sec_energy,
                sec_accuracy)
    for s in sections:
        try:
            s(r, lib)
        except Exception as e:  # one section's failure is reported, the others still run
            progress(s.__name__, "FAILED: %s" % e)
            r.md += ["## %s failed" % s.__name__, "", "    %s" % e, ""]
        torch.cuda.empty_cache()
    prop = torch.cuda.get_device_properties(0)
    head = ["# The article's measurements on a GPU", "",
            "Written by `bench/report_gpu.py`%s on %s: %s (%d SMs, %.0f GiB), torch %s, CUDA %s, "
            "flashattn's CUDA backend; %.0f s. The figures enter REPORT.md's table through "
            "report/gpu/claims.tsv." % (" --quick" if a.quick else "",
                                        time.strftime("%Y-%m-%d", time.gmtime()), prop.name,
                                        prop.multi_processor_count, prop.total_memory / 2**30,
                                        torch.__version__, torch.version.cuda, time.time() - T0),
            "", "| claim | H200 | |", "| --- | --- | --- |"]
    head += ["| %s | %s | %s |" % c for c in r.claims] + [""]
    with open(os.path.join(a.dir, "GPU.md"), "w") as f:
        f.write("\n".join(head + r.md) + "\n")
    with open(os.path.join(a.dir, "gpu", "claims.tsv"), "w") as f:  # figures hold commas
        f.write("".join("%s\t%s\t%s\n" % c for c in r.claims))
    progress("done", "%s/GPU.md" % a.dir)


if __name__ == "__main__":
    main()
