"""Our CPU attention against PyTorch's CPU flash kernel, side by side in one process on the same
tensors (issue 19's table): forward and backward GFLOP/s and their ratio, per thread count,
head dim and dtype, B=1, H=8, non-causal by default. Torch's kernel is called by its ATen ops
(_scaled_dot_product_flash_attention_for_cpu and its backward), so no other SDPA backend and no
autograd bookkeeping is timed; ours through the Python package on the same torch tensors
(DLPack, no copies), layout BHSD. Each point times the two in rounds, one right after the other
(the order swapped every round), and its ratio is the median of the rounds' ratios, with their
quartiles: on a shared VM whose speed moves for seconds at a time (the GPU machine's Xeon: up
to 2.5x, docs/notes/bf16.md) the two of a round see the same speed, where the best of each
side alone may come from different periods. The GFLOP/s columns are each side's best round.
FLOPs: forward 4 B H N^2 D, backward 2.5 times that (docs/DESIGN.md §5). Prints the
CPU model, and per thread count the line fa_context_describe gives (the kernel set ours chose).

    PYTHONPATH=python python3 bench/bench_torch_cpu.py [--n 4096] [--threads 1,16]
        [--dims 64,128] [--dtypes float32,bfloat16,float16] [--rounds 10] [--no-backward]
        [--accuracy-n 1024] [--csv FILE]

Then a table of errors against our float64 reference (ours, our conventional path in the same
dtype: the tolerance rule's yardstick, and torch's kernel) at a shorter length.

Exits 0 with a note where torch is not installed.
"""
import argparse
import os
import sys
import time

import flashattn


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def best_ms(fn, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, (time.perf_counter() - t0) * 1e3)
    return best


def quartiles(xs):
    """First quartile, median and third quartile of xs (linear interpolation between the
    sorted values, numpy's default)."""
    s = sorted(xs)

    def at(f):
        i = f * (len(s) - 1)
        lo = int(i)
        hi = min(lo + 1, len(s) - 1)
        return s[lo] + (s[hi] - s[lo]) * (i - lo)

    return at(0.25), at(0.5), at(0.75)


def max_err(xs, refs) -> float:
    return max(float((x.double() - r.double()).abs().max()) for x, r in zip(xs, refs))


def accuracy(torch, dt, d: int, n: int, heads: int, causal: bool, threads: int):
    """Max |error| against our float64 reference of out (forward) and of dq, dk, dv
    (backward) for ours (tiled), our conventional path in dt (the tolerance rule's yardstick:
    docs/DESIGN.md §4) and torch's flash kernel, on one set of inputs rounded to dt."""
    aten = torch.ops.aten
    g = torch.Generator().manual_seed(1000 + d)
    shape = (1, heads, n, d)
    q, k, v, dout = (torch.randn(shape, generator=g).to(dt) for _ in range(4))
    q64, k64, v64, d64 = (x.double() for x in (q, k, v, dout))
    kw = dict(layout="bhsd", causal=causal, return_lse=True, threads=threads)
    o_ref, l_ref = flashattn.attention(q64, k64, v64, backend="reference", **kw)
    g_ref = flashattn.attention_backward(d64, q64, k64, v64, o_ref, l_ref, layout="bhsd",
                                         causal=causal, backend="reference", threads=threads)
    errs = {}
    for name, backend in (("ours", "tiled"), ("conv", "conventional")):
        o, lse = flashattn.attention(q, k, v, backend=backend, **kw)
        grads = flashattn.attention_backward(dout, q, k, v, o, lse, layout="bhsd",
                                             causal=causal, backend=backend, threads=threads)
        errs[name] = (max_err([o], [o_ref]), max_err(grads, g_ref))
    o, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)[:2]
    grads = aten._scaled_dot_product_flash_attention_for_cpu_backward(dout, q, k, v, o, lse,
                                                                      0.0, causal)
    errs["torch"] = (max_err([o], [o_ref]), max_err(grads[:3], g_ref))
    return errs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--threads", default="1,%d" % (os.cpu_count() or 1))
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--dtypes", default="float32,bfloat16,float16")
    ap.add_argument("--rounds", type=int, default=10,
                    help="paired rounds (even: each side first as often)")
    ap.add_argument("--reps", type=int, default=1, help="calls per round; the best counts")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--no-backward", action="store_true")
    ap.add_argument("--accuracy-n", type=int, default=1024,
                    help="sequence length of the accuracy table (0: none)")
    ap.add_argument("--csv")
    a = ap.parse_args()
    if a.rounds < 1 or a.reps < 1:
        ap.error("--rounds and --reps must be at least 1")
    try:
        import torch
    except ImportError:
        print("bench_torch_cpu: torch is not installed: nothing to compare against (skipped)")
        return 0
    aten = torch.ops.aten
    print("CPU: %s; torch %s; flashattn %s" % (cpu_model(), torch.__version__, flashattn.__version__))
    print("B=1 H=%d N=%d %s; %d rounds x %d calls, ours and torch paired per round (the order "
          "swapped every round); ratio: ours / torch, the median of the rounds' ratios "
          "[quartiles]; GFLOP/s: each side's best round\n"
          % (a.heads, a.n, "causal" if a.causal else "non-causal", a.rounds, a.reps))
    hdr = ("threads", "D", "dtype", "fwd ours", "fwd torch", "fwd ratio", "bwd ours",
           "bwd torch", "bwd ratio")
    for threads in [int(t) for t in a.threads.split(",")]:
        print("ours at %d threads: %s" % (threads, flashattn.describe(threads=threads)))
    print()
    print("| " + " | ".join(hdr) + " |")
    print("|" + " --- |" * len(hdr))
    rows = []
    for threads in [int(t) for t in a.threads.split(",")]:
        torch.set_num_threads(threads)
        for d in [int(x) for x in a.dims.split(",")]:
            for name in a.dtypes.split(","):
                dt = getattr(torch, name)
                g = torch.Generator().manual_seed(d)
                shape = (1, a.heads, a.n, d)
                q, k, v, dout = (torch.randn(shape, generator=g).to(dt) for _ in range(4))
                flops = 4.0 * a.heads * a.n * a.n * d / (2 if a.causal else 1)

                def ours_fwd():
                    return flashattn.attention(q, k, v, layout="bhsd", causal=a.causal,
                                               return_lse=True, threads=threads)

                def torch_fwd():
                    return aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0,
                                                                            a.causal)

                o_ours, lse_ours = ours_fwd()
                o_t, lse_t = torch_fwd()[:2]

                def ours_bwd():
                    flashattn.attention_backward(dout, q, k, v, o_ours, lse_ours, layout="bhsd",
                                                 causal=a.causal, threads=threads)

                def torch_bwd():
                    aten._scaled_dot_product_flash_attention_for_cpu_backward(
                        dout, q, k, v, o_t, lse_t, 0.0, a.causal)

                pairs = [("f", ours_fwd, torch_fwd)]
                if not a.no_backward:
                    pairs.append(("b", ours_bwd, torch_bwd))
                    ours_bwd()  # a first call each, untimed, as the forward's above
                    torch_bwd()
                best, ratios = {}, {}
                for rnd in range(a.rounds):
                    for key, ours, theirs in pairs:
                        sides = [("o", ours), ("t", theirs)]
                        ms = {}
                        for side, fn in sides if rnd % 2 == 0 else sides[::-1]:
                            ms[side] = best_ms(fn, a.reps)
                            best[key + side] = min(best.get(key + side, float("inf")), ms[side])
                        ratios.setdefault(key, []).append(ms["t"] / ms["o"])
                gf = {key: (2.5 if key[0] == "b" else 1) * flops / (ms * 1e-3) * 1e-9
                      for key, ms in best.items()}
                r = [threads, d, name]
                cells = []
                for key, _, _ in pairs:
                    q1, med, q3 = quartiles(ratios[key])
                    r += [gf[key + "o"], gf[key + "t"], med, q1, q3]
                    cells.append("%.1f | %.1f | **%.2f** [%.2f, %.2f]"
                                 % (gf[key + "o"], gf[key + "t"], med, q1, q3))
                if a.no_backward:
                    r += [""] * 5
                    cells.append("- | - | -")
                rows.append(r)
                print("| %d | %d | %s | %s |" % (threads, d, name, " | ".join(cells)))
                sys.stdout.flush()
    if a.accuracy_n:
        print("\nMax |error| against our float64 reference, N=%d H=2 %s (forward: out; "
              "backward: dq, dk, dv); ratio: ours / our conventional path in the same dtype "
              "(the tolerance rule allows 2 forward, 3 backward, plus a floor)\n"
              % (a.accuracy_n, "causal" if a.causal else "non-causal"))
        hdr = ("D", "dtype", "fwd ours", "fwd conv", "fwd torch", "fwd ours/conv",
               "bwd ours", "bwd conv", "bwd torch", "bwd ours/conv")
        print("| " + " | ".join(hdr) + " |")
        print("|" + " --- |" * len(hdr))
        torch.set_num_threads(os.cpu_count() or 1)
        for d in [int(x) for x in a.dims.split(",")]:
            for name in a.dtypes.split(","):
                e = accuracy(torch, getattr(torch, name), d, a.accuracy_n, 2, a.causal, 0)
                print("| %d | %s | %.3g | %.3g | %.3g | %.2f | %.3g | %.3g | %.3g | %.2f |"
                      % (d, name, e["ours"][0], e["conv"][0], e["torch"][0],
                         e["ours"][0] / e["conv"][0], e["ours"][1], e["conv"][1],
                         e["torch"][1], e["ours"][1] / e["conv"][1]))
                sys.stdout.flush()
    if a.csv:
        with open(a.csv, "w") as f:
            f.write("threads,D,dtype,fwd_ours_gflops,fwd_torch_gflops,fwd_ratio,fwd_ratio_q1,"
                    "fwd_ratio_q3,bwd_ours_gflops,bwd_torch_gflops,bwd_ratio,bwd_ratio_q1,"
                    "bwd_ratio_q3\n")
            for r in rows:
                f.write(",".join(str(x) for x in r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
