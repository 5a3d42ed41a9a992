//! The error function on f64, written out so the oracle does not depend on a libm that may
//! or may not provide it. Absolute error stays below 1e-15 (checked against 40-digit
//! reference values in the tests):
//!
//! - `|x| < 1`: the Maclaurin series `2/√π Σ (-1)^n x^(2n+1) / (n! (2n+1))`; its terms
//!   never exceed `|x|`, so cancellation costs little.
//! - `1 ≤ |x| < 1.5`: the series with positive terms
//!   `2/√π e^(-x²) Σ 2^n x^(2n+1) / (1·3···(2n+1))`, which does not cancel.
//! - `1.5 ≤ |x| < 6`: `1 - erfc(x)` with erfc from its continued fraction
//!   `e^(-x²)/√π · 1/(x + (1/2)/(x + 1/(x + (3/2)/(x + ...))))`, evaluated bottom-up.
//! - `|x| ≥ 6`: `erfc(x) < 2.2e-17`, so erf rounds to ±1.

use std::f64::consts::{FRAC_2_SQRT_PI, PI};

/// The error function.
pub fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let a = x.abs();
    let r = if a < 1.0 {
        maclaurin(a)
    } else if a < 1.5 {
        positive_series(a)
    } else if a < 6.0 {
        1.0 - erfc_continued_fraction(a)
    } else {
        1.0
    };
    r.copysign(x)
}

/// `e^(-a²)` without the rounding error of `a²` (its low part is recovered with an FMA).
fn exp_neg_square(a: f64) -> f64 {
    let hi = a * a;
    let lo = a.mul_add(a, -hi);
    (-hi).exp() * (1.0 - lo)
}

fn maclaurin(a: f64) -> f64 {
    let a2 = a * a;
    let mut power = a; // (-1)^n a^(2n+1) / n!
    let mut sum = a;
    let mut n = 1.0;
    loop {
        power = -power * a2 / n;
        let term = power / (2.0 * n + 1.0);
        sum += term;
        if term.abs() <= 1e-17 * sum.abs() {
            break;
        }
        n += 1.0;
    }
    FRAC_2_SQRT_PI * sum
}

fn positive_series(a: f64) -> f64 {
    let k = 2.0 * a * a;
    let mut term = a;
    let mut sum = a;
    let mut n = 1.0;
    loop {
        term *= k / (2.0 * n + 1.0);
        sum += term;
        if term <= 1e-17 * sum {
            break;
        }
        n += 1.0;
    }
    FRAC_2_SQRT_PI * exp_neg_square(a) * sum
}

/// erfc for `a ≥ 1.5`; 80 levels reach full precision there (40 from 2.5 on).
fn erfc_continued_fraction(a: f64) -> f64 {
    let depth = if a < 2.5 { 80 } else { 40 };
    let mut f = a;
    for n in (1..=depth).rev() {
        f = a + (n as f64 * 0.5) / f;
    }
    exp_neg_square(a) / (PI.sqrt() * f)
}

#[cfg(test)]
mod tests {
    use super::erf;

    /// erf at a few points, to 20 digits (mpmath, 40-digit working precision).
    #[allow(clippy::excessive_precision)] // reference digits kept as computed
    const REFERENCE: &[(f64, f64)] = &[
        (1e-10, 1.128379167095512615e-10),
        (0.1, 0.1124629160182848984),
        (0.5, 0.52049987781304653768),
        (0.9, 0.79690821242283213966),
        (1.0, 0.84270079294971486934),
        (1.2, 0.91031397822963536837),
        (1.5, 0.96610514647531072707),
        (2.0, 0.99532226501895273416),
        (2.5, 0.99959304798255504106),
        (3.0, 0.99997790950300141456),
        (4.0, 0.99999998458274209972),
        (5.5, 0.99999999999999264215),
    ];

    #[test]
    fn matches_reference_values() {
        for &(x, want) in REFERENCE {
            let got = erf(x);
            assert!(
                (got - want).abs() < 1e-15,
                "erf({x}) = {got:e}, want {want:e}"
            );
            assert_eq!(erf(-x), -got);
        }
        assert_eq!(erf(0.0), 0.0);
        assert_eq!(erf(7.0), 1.0);
        assert_eq!(erf(f64::INFINITY), 1.0);
        assert_eq!(erf(f64::NEG_INFINITY), -1.0);
        assert!(erf(f64::NAN).is_nan());
    }

    /// Independent check on a dense grid (no gaps between the regions of the piecewise
    /// method): composite Simpson's rule on 2/√π e^(-t²), itself good to ~1e-14 here.
    #[test]
    fn agrees_with_quadrature() {
        let h = 1e-3;
        let g = |t: f64| std::f64::consts::FRAC_2_SQRT_PI * (-t * t).exp();
        let mut integral = 0.0;
        let mut x: f64 = 0.0;
        for step in 1..=4000 {
            let x1 = step as f64 * h;
            integral += h / 6.0 * (g(x) + 4.0 * g(0.5 * (x + x1)) + g(x1));
            x = x1;
            if step % 50 == 0 {
                assert!(
                    (erf(x) - integral).abs() < 5e-14,
                    "erf({x}) = {}, quadrature {integral}",
                    erf(x)
                );
            }
        }
    }
}
