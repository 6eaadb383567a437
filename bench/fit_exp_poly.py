#!/usr/bin/env python3
"""Fits the vector exps' polynomials (src/simd/exp_poly.h).

The exp of the f32 kernels: after the reduction x = n ln2 + r, |r| <= ln2/2,
exp(r) = 1 + r + r^2 q(r), q of degree 4 fitted to g(r) = (exp(r) - 1 - r) / r^2 minimizing
the max of the relative error of exp, w(r) |q(r) - g(r)| with w = r^2 / exp(r).

The exp of the tile products' P (rounded to bf16 right after): after t = n + f, |f| <= 1/2,
2^f = 1 + f e(f), e of degree 3 fitted to (2^f - 1) / f with w = f / 2^f.

Both by iteratively reweighted least squares on 2000 Chebyshev nodes in 40-digit arithmetic
(Lawson's algorithm), a little beyond the interval (the reduced argument carries rounding).
Prints each max relative error and the coefficients rounded to float. Needs mpmath and numpy.
"""
import re

import mpmath as mp
import numpy as np

mp.mp.dps = 40


def fit(g, w, half, deg):
    """The minimax q of degree deg for w (q - g) on [-half, half]: (max error, coefficients)."""
    xs = [mp.cos(mp.pi * (k + 0.5) / 2000) * half for k in range(2000)]
    ws = [w(x) for x in xs]
    lam = [mp.mpf(1)] * len(xs)
    for _ in range(60):
        a = mp.matrix(len(xs), deg + 1)
        b = mp.matrix(len(xs), 1)
        for i, x in enumerate(xs):
            s = mp.sqrt(lam[i]) * ws[i]
            for j in range(deg + 1):
                a[i, j] = s * x**j
            b[i] = s * g(x)
        coef = mp.lu_solve(a.T * a, a.T * b)
        err = [abs(ws[i] * (sum(coef[j] * xs[i] ** j for j in range(deg + 1)) - g(xs[i])))
               for i in range(len(xs))]
        worst = max(err)
        lam = [lam[i] * err[i] / worst for i in range(len(xs))]
        total = sum(lam)
        lam = [v / total * len(xs) for v in lam]
    return worst, coef


def show(title, prefix, worst, coef):
    print(f"{title}: max relative error before rounding {mp.nstr(worst, 5)}")
    for j in range(len(coef) - 1, -1, -1):
        h = float(np.float32(float(coef[j]))).hex()  # 0x1.6a24300000000p-10 -> 0x1.6a243p-10
        print(f"{prefix}{j} {re.sub(r'0+p', 'p', h)}f")


worst, coef = fit(lambda r: (mp.exp(r) - 1 - r) / r**2, lambda r: r**2 / mp.exp(r),
                  mp.log(2) / 2 * mp.mpf("1.0001"), 4)
show("exp(r), |r| <= ln2/2", "FAI_EXP_Q", worst, coef)
worst, coef = fit(lambda f: (mp.power(2, f) - 1) / f, lambda f: f / mp.power(2, f),
                  mp.mpf("0.5001"), 3)
show("2^f, |f| <= 1/2 (P)", "FAI_EXP2_E", worst, coef)
