#!/usr/bin/env python3
"""Fit the polynomials of ppcc's inline f32 exp / erf / tanh (codegen/src/lower/mathfn.rs).

    .venv/bin/pip install mpmath && .venv/bin/python codegen/tools/fit_mathfn.py

Each function is approximated on a small interval by a polynomial in a variable mapped to
[-1, 1], fitted by least squares at Chebyshev nodes against mpmath at 40 digits (near-minimax),
then converted to monomial coefficients for Horner evaluation. The script prints the Rust
constants and the worst relative error of the whole f32 algorithm, simulated in numpy
float32 arithmetic, over a dense sweep — so the numbers in mathfn.rs can be regenerated and
checked by anyone.
"""

import mpmath as mp
import numpy as np

mp.mp.dps = 40
C = np.polynomial.chebyshev


def fit(f, a, b, deg, n=600):
    """Monomial coefficients (lowest first) of p(s) ≈ f(a + (s+1)(b-a)/2), s in [-1, 1]."""
    k = np.arange(n)
    s = np.cos((2 * k + 1) * np.pi / (2 * n))
    u = [mp.mpf(a) + (mp.mpf(v) + 1) / 2 * (mp.mpf(b) - mp.mpf(a)) for v in s]
    y = np.array([float(f(v)) for v in u])
    c = C.chebfit(s, y, deg)
    return C.cheb2poly(c)


def horner32(coef, s):
    acc = np.full_like(s, np.float32(coef[-1]))
    for c in reversed(coef[:-1]):
        acc = (acc.astype(np.float64) * s + np.float32(c)).astype(np.float32)
    return acc


F = np.float32


def exp32(x, P):
    x = x.astype(F)
    xc = np.clip(x, F(-104.0), F(89.0))
    n = np.floor(xc * F(1.4426950408889634) + F(0.5)).astype(F)
    r = (xc.astype(np.float64) - n * F(0.693359375)).astype(F)
    r = (r.astype(np.float64) - n * F(-2.12194440e-4)).astype(F)
    p = horner32(P, r)
    y = (F(1) + r + (r * r).astype(F) * p).astype(F)
    ni = n.astype(np.int64)
    n1 = ni >> 1
    n2 = ni - n1
    with np.errstate(over="ignore"):
        return (y * np.ldexp(F(1), n1).astype(F) * np.ldexp(F(1), n2).astype(F)).astype(F)


def rust(name, coef):
    body = ", ".join(f"{float(c):.17e}" for c in coef)
    return f"const {name}: [f64; {len(coef)}] = [{body}];"


def main():
    half_ln2 = float(mp.log(2) / 2)
    # exp(r) = 1 + r + r² P(r) on |r| ≤ ln2/2, fitted directly in r (no mapping needed:
    # the interval is already small); the fit is in s = r / (ln2/2), then rescaled.
    ps = fit(lambda r: (mp.exp(r) - 1 - r) / r**2 if r != 0 else mp.mpf(1) / 2,
             -half_ln2, half_ln2, 5)
    exp_p = [c / half_ln2**k for k, c in enumerate(ps)]
    print(rust("EXP_P", exp_p))
    x = np.linspace(-87, 88.7, 2_000_001).astype(F)
    ref = np.array([float(mp.exp(mp.mpf(float(v)))) for v in x[::50]])
    got = exp32(x[::50], exp_p)
    print("// exp: max rel error", np.max(np.abs(got - ref) / ref))

    # erf(x) = x · P(2x² - 1) for |x| < 1.
    erf_small = fit(lambda t: mp.erf(mp.sqrt(t)) / mp.sqrt(t) if t > 0 else 2 / mp.sqrt(mp.pi),
                    0, 1, 6)
    print(rust("ERF_SMALL", erf_small))
    # erf(x) = 1 - e^{-x²} Q((x - 2.5) / 1.5) for 1 ≤ x ≤ 4 (x > 4: 1 in f32); a
    # polynomial in x rather than 1/x costs a few more terms but no division.
    erfc_q = fit(lambda x: mp.erfc(x) * mp.exp(x**2), 1, 4, 11)
    print(rust("ERFC_Q", erfc_q))
    xs = np.linspace(1e-4, 4.5, 200_001).astype(F)
    small = xs < 1
    t = (xs * xs).astype(F)
    got = np.where(small,
                   (xs * horner32(erf_small, (F(2) * t - F(1)).astype(F))).astype(F),
                   np.float32(0))
    xc = np.clip(xs, F(1), F(4))
    q = horner32(erfc_q, ((xc - F(2.5)) * F(1 / 1.5)).astype(F))
    e = exp32(-(xc * xc).astype(F), exp_p)
    got = np.where(small, got, (F(1) - (e * q).astype(F)).astype(F))
    ref = np.array([float(mp.erf(mp.mpf(float(v)))) for v in xs])
    print("// erf: max rel error", np.max(np.abs(got - ref) / ref),
          "max abs error", np.max(np.abs(got - ref)))

    # tanh(x) = x · P(t/0.1225 - 1), t = x², for |x| < 0.7 (0.7² = 0.49 → mapped [0, 0.49]).
    tanh_small = fit(lambda t: mp.tanh(mp.sqrt(t)) / mp.sqrt(t) if t > 0 else mp.mpf(1),
                     0, 0.49, 6)
    print(rust("TANH_SMALL", tanh_small))
    xs = np.linspace(1e-4, 10, 200_001).astype(F)
    t = (xs * xs).astype(F)
    small = (xs * horner32(tanh_small, (t / F(0.245) - F(1)).astype(F))).astype(F)
    xc = np.minimum(xs, F(10))
    e = exp32((F(2) * xc).astype(F), exp_p)
    large = (F(1) - (F(2) / (e + F(1))).astype(F)).astype(F)
    got = np.where(xs < 0.7, small, large)
    ref = np.array([float(mp.tanh(mp.mpf(float(v)))) for v in xs])
    print("// tanh: max rel error", np.max(np.abs(got - ref) / ref))


if __name__ == "__main__":
    main()
