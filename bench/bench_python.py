"""The Python package's call overhead (issue 17's bar: <= 20 us at B=1, H=1, S=16, D=16):
flashattn.attention against the same fa_forward call made through ctypes with its arguments
built once, and a ctypes call of a function that does nothing (fa_version_string), in one
process, best of several rounds. Runs from the repository (PYTHONPATH=python) or an install.

    python3 bench/bench_python.py [--rounds 7] [--calls 20000]
"""
import argparse
import ctypes
import time

import numpy as np

import flashattn
from flashattn import _native as N


def best_us(fn, calls, rounds):
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=20000)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 16, 1, 16)).astype(np.float32) for _ in range(3))
    out = np.empty_like(q)

    def api():
        flashattn.attention(q, k, v, threads=1)

    def api_out():
        flashattn.attention(q, k, v, out=out, threads=1)

    api()  # the context is made once, on the first call
    ctx = N.contexts.get("auto", "auto", 1, 0, False)
    p = N.Params()
    N.lib.fa_params_init(ctypes.byref(p))
    t = [N.Tensor(x.ctypes.data, N.F32, 1, 16, 1, 16, 256, 16, 16, 1) for x in (q, k, v, out)]
    args = [ctypes.byref(x) for x in t]

    def bare():
        N.lib.fa_forward(ctx, ctypes.byref(p), *args, None)

    def nothing():
        N.lib.fa_version_string()

    rows = [("flashattn.attention(q, k, v)", best_us(api, a.calls, a.rounds)),
            ("flashattn.attention(q, k, v, out=out)", best_us(api_out, a.calls, a.rounds)),
            ("fa_forward through ctypes, arguments built once", best_us(bare, a.calls, a.rounds)),
            ("a ctypes call that does nothing", best_us(nothing, a.calls, a.rounds))]
    for name, us in rows:
        print(f"{name:<50} {us:8.2f} us")
    over = rows[0][1] - rows[2][1] + rows[3][1]
    print(f"overhead of flashattn.attention over the C call: {over:.2f} us "
          f"(API - bare ctypes call + a ctypes call's own cost); with out=: "
          f"{rows[1][1] - rows[2][1] + rows[3][1]:.2f} us")


if __name__ == "__main__":
    main()
