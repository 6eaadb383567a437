#!/usr/bin/env python3
"""Checking an attention kernel against flashattn's float64 oracle, from Python with numpy.

The "kernel" here is a plain numpy attention in float32 (causal, GQA); replace `candidate`
with your own. flashattn.check runs the float64 reference and the conventional yardstick on
the same inputs and gives a verdict per tensor; a deliberately buggy candidate (causal mask
off by one) must FAIL. (`flashattn check` does the same from .npy files on the command line.)

    pip install .                      # from the repository's root, once
    python3 examples/check_with_numpy.py
"""
import numpy as np

import flashattn


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


def main():
    rng = np.random.default_rng(0)
    b, sq, sk, hq, hk, d = 2, 200, 256, 8, 2, 64
    q = rng.standard_normal((b, sq, hq, d), dtype=np.float32)
    k = rng.standard_normal((b, sk, hk, d), dtype=np.float32)
    v = rng.standard_normal((b, sk, hk, d), dtype=np.float32)

    out, lse = candidate(q, k, v)
    good = flashattn.check(q, k, v, out=out, lse=lse, causal=True)
    print(good)
    assert good, "the correct candidate must PASS"

    out, lse = candidate(q, k, v, mask_shift=1)  # each row also sees one future key
    bad = flashattn.check(q, k, v, out=out, lse=lse, causal=True)
    print(bad)
    assert not bad and not bad["out"].passed, "the off-by-one candidate must FAIL"
    print("check_with_numpy: correct candidate PASS, off-by-one candidate FAIL")


if __name__ == "__main__":
    main()
