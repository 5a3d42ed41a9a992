//! Inline f32 `exp`, `erf` and `tanh`, emitted as plain `arith`/`math` operations so that
//! LLVM vectorises the loops around them (a call to libm's `expf`/`erff` keeps a loop scalar,
//! and MLIR 22 registers no polynomial-approximation pass).
//!
//! Each is a range reduction plus a polynomial fitted by `codegen/tools/fit_mathfn.py`
//! (least squares at Chebyshev nodes against mpmath, then monomial coefficients for Horner);
//! the script also simulates the whole f32 algorithm and prints its worst error: exp
//! 1.2e-7, erf 1.4e-7, tanh 1.1e-7 relative (about one ulp). Multiply-adds carry
//! `fastmath<contract>` so the backend fuses them where the CPU has FMA.
//!
//! * `exp(x)`: `n = ⌊x·log₂e + ½⌋`, `r = x − n·ln2` (two-part ln2), `eʳ = 1 + r + r²·P(r)`,
//!   scaled by `2ⁿ` in two halves (so subnormal results and overflow to ∞ come out right);
//!   `x` is clamped to [−104, 89] first, beyond which the f32 result is 0 or ∞.
//! * `erf(x)`: `|x| < 1`: `x·P(2x² − 1)`; `1 ≤ |x| ≤ 4`: `1 − e^{−x²}·Q((|x| − 2.5)/1.5)`
//!   (Q fits `erfc(x)·e^{x²}`); beyond 4 the f32 result is ±1. Odd by `copysign`.
//! * `tanh(x)`: `|x| < 0.7`: `x·P(x²/0.245 − 1)`; else `1 − 2/(e^{2|x|} + 1)` with `|x|`
//!   clamped to 10 (tanh rounds to 1 in f32 from 9.01 on). Odd by `copysign`.
//!
//! NaN inputs give NaN (selected at the end). f64 and the half types keep `math.*` (libm).

// The coefficients are printed by the fitting script at f64 precision and rounded to f32
// where they are emitted.
#![allow(clippy::excessive_precision)]

use super::Body;

/// eʳ = 1 + r + r²·P(r) on |r| ≤ ln2/2, lowest coefficient first.
const EXP_P: [f64; 6] = [
    5.00000001346221912e-01,
    1.66666667190076917e-01,
    4.16664649761263883e-02,
    8.33329848036461901e-03,
    1.39336435225996232e-03,
    1.98992762170281255e-04,
];
/// erf(x)/x as a polynomial in s = 2x² − 1, |x| < 1.
const ERF_SMALL: [f64; 7] = [
    9.65468738637551116e-01,
    -1.40536097281537015e-01,
    1.98524977227800097e-02,
    -2.28541952889237078e-03,
    2.17511989755767861e-04,
    -1.76690808117398171e-05,
    1.23164017471065432e-06,
];
/// erfc(x)·e^{x²} as a polynomial in s = (x − 2.5)/1.5, 1 ≤ x ≤ 4.
const ERFC_Q: [f64; 12] = [
    2.10806357528338983e-01,
    -1.11521004695381842e-01,
    5.61109584116327095e-02,
    -2.70057252897404759e-02,
    1.24840356857481901e-02,
    -5.56733290952513178e-03,
    2.42588510121670127e-03,
    -1.01711777431486689e-03,
    3.67868672463678528e-04,
    -1.43948597882936815e-04,
    9.64045152214223773e-05,
    -3.69287235751963988e-05,
];
/// tanh(x)/x as a polynomial in s = x²/0.245 − 1, |x| < 0.7.
const TANH_SMALL: [f64; 7] = [
    9.25614681341561885e-01,
    -6.77607556524345983e-02,
    6.02710153143157928e-03,
    -5.43477017559327908e-04,
    4.90794093042885371e-05,
    -4.49738374348911867e-06,
    4.07060998902274862e-07,
];

fn c32(b: &mut Body, x: f64) -> String {
    b.constant(ppir::DType::F32, x)
}

fn ci32(b: &mut Body, x: i32) -> String {
    b.op(format!("arith.constant {x} : i32"))
}

fn bin(b: &mut Body, op: &str, x: &str, y: &str) -> String {
    b.op(format!("arith.{op} {x}, {y} : f32"))
}

/// `x·y + z`, fusable into one FMA.
fn mul_add(b: &mut Body, x: &str, y: &str, z: &str) -> String {
    let p = b.op(format!("arith.mulf {x}, {y} fastmath<contract> : f32"));
    b.op(format!("arith.addf {p}, {z} fastmath<contract> : f32"))
}

/// Horner evaluation of `coef` (lowest first) at `s`.
fn horner(b: &mut Body, coef: &[f64], s: &str) -> String {
    let mut acc = c32(b, coef[coef.len() - 1]);
    for &c in coef[..coef.len() - 1].iter().rev() {
        let k = c32(b, c);
        acc = mul_add(b, &acc, s, &k);
    }
    acc
}

/// `x` where `x` is NaN, else `y`.
fn keep_nan(b: &mut Body, x: &str, y: &str) -> String {
    let nan = b.op(format!("arith.cmpf uno, {x}, {x} : f32"));
    b.op(format!("arith.select {nan}, {x}, {y} : f32"))
}

/// `2^k` for an i32 `k` in [−126, 127], as f32.
fn pow2(b: &mut Body, k: &str) -> String {
    let bias = ci32(b, 127);
    let e = b.op(format!("arith.addi {k}, {bias} : i32"));
    let sh = ci32(b, 23);
    let bits = b.op(format!("arith.shli {e}, {sh} : i32"));
    b.op(format!("arith.bitcast {bits} : i32 to f32"))
}

/// `eˣ` for an f32 `x`, without a NaN check (the callers' clamps make `x` finite or
/// select NaN themselves).
fn exp_core(b: &mut Body, x: &str) -> String {
    let lo = c32(b, -104.0);
    let hi = c32(b, 89.0);
    let xc = bin(b, "maxnumf", x, &lo);
    let xc = bin(b, "minnumf", &xc, &hi);
    let log2e = c32(b, std::f64::consts::LOG2_E);
    let half = c32(b, 0.5);
    let k = mul_add(b, &xc, &log2e, &half);
    let n = b.op(format!("math.floor {k} : f32"));
    // r = x − n·ln2 with ln2 = 0.693359375 − 2.12194440e−4 (the first part has few bits,
    // so n·0.693359375 is exact).
    let c1 = c32(b, -0.693359375);
    let c2 = c32(b, 2.121_944_4e-4);
    let r = b.op(format!("math.fma {n}, {c1}, {xc} : f32"));
    let r = b.op(format!("math.fma {n}, {c2}, {r} : f32"));
    let p = horner(b, &EXP_P, &r);
    let r2 = bin(b, "mulf", &r, &r);
    let y = mul_add(b, &r2, &p, &r);
    let one = c32(b, 1.0);
    let y = bin(b, "addf", &y, &one);
    let ni = b.op(format!("arith.fptosi {n} : f32 to i32"));
    let one_i = ci32(b, 1);
    let n1 = b.op(format!("arith.shrsi {ni}, {one_i} : i32"));
    let n2 = b.op(format!("arith.subi {ni}, {n1} : i32"));
    let s1 = pow2(b, &n1);
    let s2 = pow2(b, &n2);
    let y = bin(b, "mulf", &y, &s1);
    bin(b, "mulf", &y, &s2)
}

/// `eˣ` for an f32 `x`.
pub fn exp_f32(b: &mut Body, x: &str) -> String {
    let y = exp_core(b, x);
    keep_nan(b, x, &y)
}

/// `erf(x)` for an f32 `x`.
pub fn erf_f32(b: &mut Body, x: &str) -> String {
    let ax = b.op(format!("math.absf {x} : f32"));
    let t = bin(b, "mulf", &ax, &ax);
    let two = c32(b, 2.0);
    let m1 = c32(b, -1.0);
    let s = mul_add(b, &t, &two, &m1);
    let p = horner(b, &ERF_SMALL, &s);
    let small = bin(b, "mulf", &ax, &p);
    let one = c32(b, 1.0);
    let four = c32(b, 4.0);
    let xc = bin(b, "maxnumf", &ax, &one);
    let xc = bin(b, "minnumf", &xc, &four);
    let scale = c32(b, 1.0 / 1.5);
    let shift = c32(b, -2.5 / 1.5);
    let s = mul_add(b, &xc, &scale, &shift);
    let q = horner(b, &ERFC_Q, &s);
    let x2 = bin(b, "mulf", &xc, &xc);
    let nx2 = b.op(format!("arith.negf {x2} : f32"));
    let e = exp_core(b, &nx2);
    let eq = bin(b, "mulf", &e, &q);
    let large = bin(b, "subf", &one, &eq);
    let is_small = b.op(format!("arith.cmpf olt, {ax}, {one} : f32"));
    let y = b.op(format!("arith.select {is_small}, {small}, {large} : f32"));
    let y = b.op(format!("math.copysign {y}, {x} : f32"));
    keep_nan(b, x, &y)
}

/// `tanh(x)` for an f32 `x`.
pub fn tanh_f32(b: &mut Body, x: &str) -> String {
    let ax = b.op(format!("math.absf {x} : f32"));
    let t = bin(b, "mulf", &ax, &ax);
    let scale = c32(b, 1.0 / 0.245);
    let m1 = c32(b, -1.0);
    let s = mul_add(b, &t, &scale, &m1);
    let p = horner(b, &TANH_SMALL, &s);
    let small = bin(b, "mulf", &ax, &p);
    // tanh(x) rounds to 1 in f32 from x ≈ 9.01 on; clamp a little beyond.
    let ten = c32(b, 10.0);
    let xc = bin(b, "minnumf", &ax, &ten);
    let x2 = bin(b, "addf", &xc, &xc);
    let e = exp_core(b, &x2);
    let one = c32(b, 1.0);
    let two = c32(b, 2.0);
    let den = bin(b, "addf", &e, &one);
    let q = bin(b, "divf", &two, &den);
    let large = bin(b, "subf", &one, &q);
    let lim = c32(b, 0.7);
    let is_small = b.op(format!("arith.cmpf olt, {ax}, {lim} : f32"));
    let y = b.op(format!("arith.select {is_small}, {small}, {large} : f32"));
    let y = b.op(format!("math.copysign {y}, {x} : f32"));
    keep_nan(b, x, &y)
}
