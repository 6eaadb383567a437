#!/usr/bin/env python3
"""Checking an attention kernel against flashattn's float64 oracle, from Python with numpy only.

The "kernel" here is a plain numpy attention in float32 (causal, GQA); replace `candidate` with
your own. It saves the inputs and the candidate's outputs as .npy, runs `flashattn check --json`
and asserts on the verdict. A deliberately buggy candidate (causal mask off by one) must FAIL.

    python3 examples/check_with_numpy.py [path/to/flashattn]
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

FLASHATTN = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("FLASHATTN", "flashattn")


def candidate(q, k, v, causal=True, mask_shift=0):
    """float32 attention, BSHD, natural-log LSE (B, H, S): what a typical kernel returns."""
    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    group = hq // hk
    scale = np.float32(1.0 / np.sqrt(d))
    out = np.empty((b, sq, hq, v.shape[3]), np.float32)
    lse = np.empty((b, hq, sq), np.float32)
    for h in range(hq):
        s = np.einsum("bid,bjd->bij", q[:, :, h], k[:, :, h // group]) * scale
        if causal:  # bottom-right alignment: row i sees keys j <= i + sk - sq
            i = np.arange(sq)[:, None]
            j = np.arange(sk)[None, :]
            s = np.where(j <= i + sk - sq + mask_shift, s, -np.inf)
        m = s.max(axis=-1, keepdims=True)
        p = np.exp(s - m)
        l = p.sum(axis=-1, keepdims=True)
        out[:, :, h] = np.einsum("bij,bjd->bid", p / l, v[:, :, h // group])
        lse[:, h] = (m + np.log(l))[..., 0]
    return out, lse


def check(workdir, tensors, extra=()):
    paths = {}
    for name, array in tensors.items():
        paths[name] = os.path.join(workdir, name + ".npy")
        np.save(paths[name], array)
    cmd = [FLASHATTN, "check", "--q", paths["q"], "--k", paths["k"], "--v", paths["v"],
           "--candidate-out", paths["out"], "--candidate-lse", paths["lse"], "--causal",
           "--json", *extra]
    run = subprocess.run(cmd, capture_output=True, text=True)
    assert run.returncode in (0, 1), f"flashattn check failed to run:\n{run.stderr}"
    report = json.loads(run.stdout)
    assert (run.returncode == 0) == (report["verdict"] == "PASS")
    return report


def main():
    rng = np.random.default_rng(0)
    b, sq, sk, hq, hk, d = 2, 200, 256, 8, 2, 64
    q = rng.standard_normal((b, sq, hq, d), dtype=np.float32)
    k = rng.standard_normal((b, sk, hk, d), dtype=np.float32)
    v = rng.standard_normal((b, sk, hk, d), dtype=np.float32)

    with tempfile.TemporaryDirectory() as tmp:
        out, lse = candidate(q, k, v)
        good = check(tmp, {"q": q, "k": k, "v": v, "out": out, "lse": lse})
        for t in good["tensors"]:
            print(f"correct   {t['name']:>3}: {t['verdict']}  max_abs {t['max_abs']:.3g}"
                  f"  bound {t['bound']:.3g}")
        assert good["verdict"] == "PASS", good

        out, lse = candidate(q, k, v, mask_shift=1)  # each row also sees one future key
        bad = check(tmp, {"q": q, "k": k, "v": v, "out": out, "lse": lse})
        for t in bad["tensors"]:
            w = t["worst_index"]
            print(f"off-by-1  {t['name']:>3}: {t['verdict']}  max_abs {t['max_abs']:.3g}"
                  f"  worst at b{w['batch']} s{w['seq']} h{w['head']} d{w['dim']}")
        assert bad["verdict"] == "FAIL", bad
    print("check_with_numpy: correct candidate PASS, off-by-one candidate FAIL")


if __name__ == "__main__":
    main()
