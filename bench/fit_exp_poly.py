#!/usr/bin/env python3
"""Fits the vector exp's polynomial (src/kernels/exp_poly.h).

After the reduction x = n ln2 + r, |r| <= ln2/2, exp(r) = 1 + r + r^2 q(r). q (degree 4) is
fitted to g(r) = (exp(r) - 1 - r) / r^2 minimizing the max of the relative error of exp,
w(r) |q(r) - g(r)| with w = r^2 / exp(r), by iteratively reweighted least squares on 2000
Chebyshev nodes in 40-digit arithmetic (Lawson's algorithm). Prints the max relative error and
the coefficients rounded to float. Needs mpmath and numpy.
"""
import mpmath as mp
import numpy as np

mp.mp.dps = 40
DEG = 4
H = mp.log(2) / 2 * mp.mpf("1.0001")  # a little beyond ln2/2: r carries rounding


def g(r):
    return (mp.exp(r) - 1 - r) / r**2


xs = [mp.cos(mp.pi * (k + 0.5) / 2000) * H for k in range(2000)]
w = [x**2 / mp.exp(x) for x in xs]
lam = [mp.mpf(1)] * len(xs)
for _ in range(60):
    a = mp.matrix(len(xs), DEG + 1)
    b = mp.matrix(len(xs), 1)
    for i, x in enumerate(xs):
        s = mp.sqrt(lam[i]) * w[i]
        for j in range(DEG + 1):
            a[i, j] = s * x**j
        b[i] = s * g(x)
    coef = mp.lu_solve(a.T * a, a.T * b)
    err = [abs(w[i] * (sum(coef[j] * xs[i] ** j for j in range(DEG + 1)) - g(xs[i])))
           for i in range(len(xs))]
    worst = max(err)
    lam = [lam[i] * err[i] / worst for i in range(len(xs))]
    total = sum(lam)
    lam = [v / total * len(xs) for v in lam]
print("max relative error of exp before rounding:", mp.nstr(worst, 5))
for j in range(DEG, -1, -1):
    print(f"FAI_EXP_Q{j} {float(np.float32(float(coef[j]))).hex()}f")
