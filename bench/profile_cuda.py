#!/usr/bin/env python3
"""One forward (or backward) launch of the CUDA backend at the bar's shape, for profilers:
  ncu --clock-control none -k regex:fa_fwd python3 bench/profile_cuda.py --lib ... [--backward]
      [--d 64 --heads 32]
"""
import argparse
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_cuda import Lib, inputs  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--lib", default=".libs/libflashattn.so")
ap.add_argument("--n", type=int, default=8192)
ap.add_argument("--d", type=int, default=128, help="head dim")
ap.add_argument("--heads", type=int, default=8)
ap.add_argument("--causal", action="store_true")
ap.add_argument("--backward", action="store_true")
a = ap.parse_args()
lib = Lib(a.lib)
q, k, v = inputs(2 if not a.backward else 1, a.heads, a.n, a.d)
out = torch.empty_like(q)
lse = torch.empty(q.shape[0], a.heads, a.n, device="cuda", dtype=torch.float32)
lib.forward(q, k, v, out, lse, a.causal)
if a.backward:
    dout = torch.randn_like(q)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    lib.backward(q, k, v, out, lse, dout, dq, dk, dv, a.causal)
torch.cuda.synchronize()
