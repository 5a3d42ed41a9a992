//! Interpreter tests. Expected values are worked out by hand or by direct, naive
//! transcriptions of each op's definition written here (never by calling the code under
//! test), on shapes large enough to exercise broadcasting, padding and strides.

use std::collections::{HashMap, VecDeque};

use super::*;
use crate::attr::Attr;
use crate::module::NewOp;
use crate::types::{DType, Dim};

// ---- helpers ----

fn f64t(shape: &[usize], data: &[f64]) -> Tensor {
    Tensor::from_f64(DType::F64, shape.to_vec(), data.to_vec())
}

fn i64t(shape: &[usize], data: &[i64]) -> Tensor {
    Tensor::from_i64(DType::I64, shape.to_vec(), data.to_vec())
}

fn boolt(shape: &[usize], data: &[i64]) -> Tensor {
    Tensor::from_i64(DType::Bool, shape.to_vec(), data.to_vec())
}

/// Deterministic, irregular values in about [-2.5, 3], different per `seed`.
fn pattern(shape: &[usize], seed: usize) -> Tensor {
    let n: usize = shape.iter().product();
    let data: Vec<f64> = (0..n)
        .map(|i| ((i * 37 + seed * 11 + 5) % 23) as f64 / 4.0 - 2.5)
        .collect();
    f64t(shape, &data)
}

/// 0, 1, 2, ... as f64.
fn iota(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    f64t(shape, &(0..n).map(|i| i as f64).collect::<Vec<_>>())
}

fn attrs(list: &[(&str, Attr)]) -> Attrs {
    list.iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

fn ints(v: &[i64]) -> Attr {
    Attr::Ints(v.to_vec())
}

fn ty(dtype: DType, shape: &[usize]) -> TensorType {
    TensorType::of(dtype, &shape.iter().map(|&d| d as u64).collect::<Vec<_>>())
}

fn eval_with(
    kind: OpKind,
    a: &Attrs,
    inputs: &[&Tensor],
    out: &[TensorType],
    precision: Precision,
) -> Vec<Tensor> {
    eval_op(kind, a, inputs, out, &InterpOptions { precision }).unwrap_or_else(|e| panic!("{e}"))
}

/// Evaluate a one-result op whose result has `dtype` and `shape`.
fn eval1(kind: OpKind, a: &Attrs, inputs: &[&Tensor], dtype: DType, shape: &[usize]) -> Tensor {
    let t = eval_with(kind, a, inputs, &[ty(dtype, shape)], Precision::Typed).remove(0);
    assert_eq!(t.shape, shape, "{kind} result shape");
    t
}

fn eval_err(kind: OpKind, a: &Attrs, inputs: &[&Tensor], dtype: DType, shape: &[usize]) -> String {
    match eval_op(
        kind,
        a,
        inputs,
        &[ty(dtype, shape)],
        &InterpOptions::default(),
    ) {
        Ok(_) => panic!("{kind} should have failed"),
        Err(e) => e.to_string(),
    }
}

#[track_caller]
fn assert_close(t: &Tensor, want: &[f64], tol: f64) {
    let got = t.as_f64().expect("float result");
    assert_eq!(got.len(), want.len(), "element count");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= tol * (1.0 + w.abs());
        assert!(ok, "element {i}: got {g}, want {w} (all: {got:?})");
    }
}

#[track_caller]
fn assert_ints(t: &Tensor, want: &[i64]) {
    assert_eq!(t.as_i64().expect("integer result"), want);
}

/// Row-major offset of a multi-index.
fn off(shape: &[usize], idx: &[usize]) -> usize {
    idx.iter().zip(shape).fold(0, |acc, (&i, &d)| acc * d + i)
}

/// Every multi-index of a shape in row-major order.
fn all_indices(shape: &[usize]) -> Vec<Vec<usize>> {
    let mut out = vec![vec![]];
    for &d in shape {
        out = out
            .into_iter()
            .flat_map(|p: Vec<usize>| {
                (0..d).map(move |i| {
                    let mut q = p.clone();
                    q.push(i);
                    q
                })
            })
            .collect();
    }
    out
}

fn vals(t: &Tensor) -> &[f64] {
    t.as_f64().unwrap()
}

// ---- unary ----

#[test]
#[allow(clippy::excessive_precision)] // reference digits kept as computed
fn unary_math() {
    let xs = [-2.0, -0.5, 0.0, 0.5, 3.0];
    let x = f64t(&[5], &xs);
    let run = |kind, a: &Attrs| eval1(kind, a, &[&x], DType::F64, &[5]);
    let none = Attrs::new();
    let each = |f: &dyn Fn(f64) -> f64| xs.iter().map(|&v| f(v)).collect::<Vec<_>>();
    assert_close(&run(OpKind::Relu, &none), &[0.0, 0.0, 0.0, 0.5, 3.0], 0.0);
    assert_close(
        &run(OpKind::LeakyRelu, &attrs(&[("alpha", Attr::Float(0.1))])),
        &[-0.2, -0.05, 0.0, 0.5, 3.0],
        1e-15,
    );
    assert_close(
        &run(OpKind::LeakyRelu, &none),
        &[-0.02, -0.005, 0.0, 0.5, 3.0],
        1e-15,
    );
    assert_close(
        &run(OpKind::Elu, &attrs(&[("alpha", Attr::Float(2.0))])),
        &[
            2.0 * ((-2.0f64).exp() - 1.0),
            2.0 * ((-0.5f64).exp() - 1.0),
            0.0,
            0.5,
            3.0,
        ],
        1e-15,
    );
    let (alpha, gamma) = (1.6732632423543772, 1.0507009873554805);
    assert_close(
        &run(OpKind::Selu, &none),
        &each(&|v| {
            if v > 0.0 {
                gamma * v
            } else {
                gamma * (alpha * v.exp() - alpha)
            }
        }),
        1e-15,
    );
    assert_close(
        &run(OpKind::Sigmoid, &none),
        &each(&|v| 1.0 / (1.0 + (-v).exp())),
        1e-15,
    );
    assert_close(
        &run(OpKind::HardSigmoid, &none),
        &[0.1, 0.4, 0.5, 0.6, 1.0],
        1e-15,
    );
    assert_close(&run(OpKind::Tanh, &none), &each(&f64::tanh), 0.0);
    // 40-digit references: x/2 · (1 + erf(x/√2)).
    let gelu = [
        -0.045500263896358414401,
        -0.15426876936299344818,
        0.0,
        0.34573123063700655182,
        2.9959503059051097164,
    ];
    assert_close(&run(OpKind::Gelu, &none), &gelu, 1e-15);
    assert_close(
        &run(
            OpKind::Gelu,
            &attrs(&[("approximate", Attr::Str("none".into()))]),
        ),
        &gelu,
        1e-15,
    );
    let k = (2.0 / std::f64::consts::PI).sqrt();
    assert_close(
        &run(
            OpKind::Gelu,
            &attrs(&[("approximate", Attr::Str("tanh".into()))]),
        ),
        &each(&|v| 0.5 * v * (1.0 + (k * (v + 0.044715 * v.powi(3))).tanh())),
        1e-15,
    );
    assert_close(
        &run(OpKind::Erf, &none),
        &[
            -0.99532226501895273416,
            -0.52049987781304653768,
            0.0,
            0.52049987781304653768,
            0.99997790950300141456,
        ],
        1e-15,
    );
    assert_close(&run(OpKind::Exp, &none), &each(&f64::exp), 0.0);
    assert_close(&run(OpKind::Abs, &none), &[2.0, 0.5, 0.0, 0.5, 3.0], 0.0);
    assert_close(&run(OpKind::Neg, &none), &[2.0, 0.5, 0.0, -0.5, -3.0], 0.0);
    assert_close(&run(OpKind::Sign, &none), &[-1.0, -1.0, 0.0, 1.0, 1.0], 0.0);
    assert_close(
        &run(OpKind::Softsign, &none),
        &[-2.0 / 3.0, -1.0 / 3.0, 0.0, 1.0 / 3.0, 0.75],
        1e-15,
    );
    assert_close(&run(OpKind::Sin, &none), &each(&f64::sin), 0.0);
    assert_close(&run(OpKind::Cos, &none), &each(&f64::cos), 0.0);
    assert_close(
        &run(
            OpKind::Shrink,
            &attrs(&[("bias", Attr::Float(0.5)), ("lambd", Attr::Float(1.0))]),
        ),
        &[-1.5, 0.0, 0.0, 0.0, 2.5],
        0.0,
    );
    assert_close(
        &run(OpKind::Shrink, &none),
        &[-2.0, 0.0, 0.0, 0.0, 3.0],
        0.0,
    );
    assert_close(
        &run(
            OpKind::Clip,
            &attrs(&[("min", Attr::Float(-1.0)), ("max", Attr::Float(1.0))]),
        ),
        &[-1.0, -0.5, 0.0, 0.5, 1.0],
        0.0,
    );
    assert_close(
        &run(OpKind::Clip, &attrs(&[("min", Attr::Float(0.2))])),
        &[0.2, 0.2, 0.2, 0.5, 3.0],
        0.0,
    );
    assert_close(&run(OpKind::Identity, &none), &xs, 0.0);

    let p = f64t(&[4], &[0.25, 1.0, 4.0, 10.0]);
    let runp = |kind| eval1(kind, &none, &[&p], DType::F64, &[4]);
    assert_close(
        &runp(OpKind::Log),
        &[-(4.0f64.ln()), 0.0, 4.0f64.ln(), 10.0f64.ln()],
        1e-15,
    );
    assert_close(&runp(OpKind::Sqrt), &[0.5, 1.0, 2.0, 10.0f64.sqrt()], 0.0);
    assert_close(&runp(OpKind::Reciprocal), &[4.0, 1.0, 0.25, 0.1], 0.0);

    let r = f64t(&[5], &[-1.5, -0.5, 0.5, 1.5, 2.0]);
    assert_close(
        &eval1(OpKind::Floor, &none, &[&r], DType::F64, &[5]),
        &[-2.0, -1.0, 0.0, 1.0, 2.0],
        0.0,
    );
    assert_close(
        &eval1(OpKind::Ceil, &none, &[&r], DType::F64, &[5]),
        &[-1.0, -0.0, 1.0, 2.0, 2.0],
        0.0,
    );
}

#[test]
#[allow(clippy::excessive_precision)]
fn softplus_and_sigmoid_are_stable() {
    let x = f64t(&[6], &[-1000.0, -40.0, 0.0, 2.0, 40.0, 1000.0]);
    let sp = eval1(OpKind::Softplus, &Attrs::new(), &[&x], DType::F64, &[6]);
    let want = [
        0.0,
        4.2483542552915611285e-18,
        2f64.ln(),
        (1.0 + 2f64.exp()).ln(),
        40.0,
        1000.0,
    ];
    assert_close(&sp, &want, 1e-15);
    let sg = eval1(OpKind::Sigmoid, &Attrs::new(), &[&x], DType::F64, &[6]);
    assert!(vals(&sg).iter().all(|v| v.is_finite()));
    assert_eq!(vals(&sg)[0], 0.0);
    assert_eq!(vals(&sg)[5], 1.0);
    assert!((vals(&sg)[1] - (-40f64).exp()).abs() < 1e-30);
}

#[test]
fn integer_unary_and_clip() {
    let x = i64t(&[5], &[-7, -1, 0, 2, 9]);
    let none = Attrs::new();
    assert_ints(
        &eval1(OpKind::Relu, &none, &[&x], DType::I64, &[5]),
        &[0, 0, 0, 2, 9],
    );
    assert_ints(
        &eval1(OpKind::Abs, &none, &[&x], DType::I64, &[5]),
        &[7, 1, 0, 2, 9],
    );
    assert_ints(
        &eval1(OpKind::Neg, &none, &[&x], DType::I64, &[5]),
        &[7, 1, 0, -2, -9],
    );
    assert_ints(
        &eval1(OpKind::Sign, &none, &[&x], DType::I64, &[5]),
        &[-1, -1, 0, 1, 1],
    );
    let clip = attrs(&[("min", Attr::Float(-1.5)), ("max", Attr::Float(4.0))]);
    assert_ints(
        &eval1(OpKind::Clip, &clip, &[&x], DType::I64, &[5]),
        &[-1, -1, 0, 2, 4],
    );
    assert!(eval_err(OpKind::Exp, &none, &[&x], DType::I64, &[5]).contains("float"));
    let b = boolt(&[3], &[1, 0, 1]);
    assert_ints(
        &eval1(OpKind::Not, &none, &[&b], DType::Bool, &[3]),
        &[0, 1, 0],
    );
}

#[test]
fn cast_between_dtypes() {
    let x = Tensor::from_f64(DType::F32, vec![6], vec![-2.7, -0.5, 0.0, 0.5, 2.7, 300.0]);
    let to = |d: DType| attrs(&[("to", Attr::DType(d))]);
    assert_ints(
        &eval1(OpKind::Cast, &to(DType::I32), &[&x], DType::I32, &[6]),
        &[-2, 0, 0, 0, 2, 300],
    );
    // 300 wraps to 44 in i8, as a C cast of the truncated value would.
    assert_ints(
        &eval1(OpKind::Cast, &to(DType::I8), &[&x], DType::I8, &[6]),
        &[-2, 0, 0, 0, 2, 44],
    );
    assert_ints(
        &eval1(OpKind::Cast, &to(DType::Bool), &[&x], DType::Bool, &[6]),
        &[1, 1, 0, 1, 1, 1],
    );
    let b = boolt(&[2], &[1, 0]);
    assert_close(
        &eval1(OpKind::Cast, &to(DType::F32), &[&b], DType::F32, &[2]),
        &[1.0, 0.0],
        0.0,
    );
    let i = i64t(&[3], &[-1, 257, 0]);
    assert_ints(
        &eval1(OpKind::Cast, &to(DType::I8), &[&i], DType::I8, &[3]),
        &[-1, 1, 0],
    );
    assert_ints(
        &eval1(OpKind::Cast, &to(DType::Bool), &[&i], DType::Bool, &[3]),
        &[1, 1, 0],
    );
    assert_close(
        &eval1(OpKind::Cast, &to(DType::F64), &[&i], DType::F64, &[3]),
        &[-1.0, 257.0, 0.0],
        0.0,
    );
    // Rounded to the target in Typed precision, untouched in F64 precision.
    let d = f64t(&[1], &[0.1]);
    let typed = eval_with(
        OpKind::Cast,
        &to(DType::F16),
        &[&d],
        &[ty(DType::F16, &[1])],
        Precision::Typed,
    );
    assert_eq!(vals(&typed[0]), &[half::f16::from_f64(0.1).to_f64()]);
    let wide = eval_with(
        OpKind::Cast,
        &to(DType::F16),
        &[&d],
        &[ty(DType::F16, &[1])],
        Precision::F64,
    );
    assert_eq!(vals(&wide[0]), &[0.1]);
    // The declared result type must agree with `to`.
    assert!(eval_err(OpKind::Cast, &to(DType::I32), &[&x], DType::I64, &[6]).contains("declares"));
}

#[test]
fn dropout_is_identity_in_inference() {
    let x = pattern(&[2, 3], 1);
    let outs = eval_with(
        OpKind::Dropout,
        &attrs(&[("ratio", Attr::Float(0.3))]),
        &[&x],
        &[ty(DType::F64, &[2, 3]), ty(DType::Bool, &[2, 3])],
        Precision::Typed,
    );
    assert_eq!(outs[0], x);
    assert_ints(&outs[1], &[1; 6]);
    // Training needs the key operand (see grad_tests for the training form).
    let e = eval_err(
        OpKind::Dropout,
        &attrs(&[("training", Attr::Int(1))]),
        &[&x],
        DType::F64,
        &[2, 3],
    );
    assert!(e.contains("needs its key operand"), "{e}");
}

#[test]
fn typed_precision_rounds_each_result() {
    let a = Tensor::from_f32(vec![1], vec![0.1]);
    let b = Tensor::from_f32(vec![1], vec![0.2]);
    let exact = (0.1f32 as f64) + (0.2f32 as f64);
    let typed = eval_with(
        OpKind::Add,
        &Attrs::new(),
        &[&a, &b],
        &[ty(DType::F32, &[1])],
        Precision::Typed,
    );
    assert_eq!(vals(&typed[0]), &[exact as f32 as f64]);
    let wide = eval_with(
        OpKind::Add,
        &Attrs::new(),
        &[&a, &b],
        &[ty(DType::F32, &[1])],
        Precision::F64,
    );
    assert_eq!(vals(&wide[0]), &[exact]);
    let e = Tensor::from_f32(vec![1], vec![1.0]);
    let typed = eval_with(
        OpKind::Exp,
        &Attrs::new(),
        &[&e],
        &[ty(DType::F32, &[1])],
        Precision::Typed,
    );
    assert_eq!(vals(&typed[0]), &[std::f64::consts::E as f32 as f64]);
    let bf = Tensor::from_f64(DType::BF16, vec![1], vec![1.0]);
    let third = Tensor::from_f64(DType::BF16, vec![1], vec![3.0]);
    let q = eval_with(
        OpKind::Div,
        &Attrs::new(),
        &[&bf, &third],
        &[ty(DType::BF16, &[1])],
        Precision::Typed,
    );
    assert_eq!(vals(&q[0]), &[half::bf16::from_f64(1.0 / 3.0).to_f64()]);
}

// ---- binary ----

#[test]
fn binary_broadcasting() {
    // a[i, 0, k] = 10 i + k over [2, 1, 3]; b[j, 0] = 100 j + 1 over [4, 1]; result [2, 4, 3].
    let a = f64t(&[2, 1, 3], &[0.0, 1.0, 2.0, 10.0, 11.0, 12.0]);
    let b = f64t(&[4, 1], &[1.0, 101.0, 201.0, 301.0]);
    let expect = |f: &dyn Fn(f64, f64) -> f64| {
        let mut v = vec![];
        for i in 0..2 {
            for j in 0..4 {
                for k in 0..3 {
                    v.push(f((10 * i + k) as f64, (100 * j + 1) as f64));
                }
            }
        }
        v
    };
    let none = Attrs::new();
    let run = |kind| eval1(kind, &none, &[&a, &b], DType::F64, &[2, 4, 3]);
    assert_close(&run(OpKind::Add), &expect(&|p, q| p + q), 0.0);
    assert_close(&run(OpKind::Sub), &expect(&|p, q| p - q), 0.0);
    assert_close(&run(OpKind::Mul), &expect(&|p, q| p * q), 0.0);
    assert_close(&run(OpKind::Div), &expect(&|p, q| p / q), 0.0);
    assert_close(&run(OpKind::Max), &expect(&f64::max), 0.0);
    assert_close(&run(OpKind::Min), &expect(&f64::min), 0.0);
    // Scalar operands broadcast too.
    let s = f64t(&[], &[2.0]);
    assert_close(
        &eval1(OpKind::Mul, &none, &[&s, &a], DType::F64, &[2, 1, 3]),
        &[0.0, 2.0, 4.0, 20.0, 22.0, 24.0],
        0.0,
    );
    // Incompatible shapes are an error, not a panic.
    let c = f64t(&[3, 2], &[0.0; 6]);
    assert!(eval_err(OpKind::Add, &none, &[&a, &c], DType::F64, &[2, 3, 2]).contains("broadcast"));
    // Mixed dtypes are an error.
    let i = i64t(&[1], &[1]);
    assert!(
        eval_err(OpKind::Add, &none, &[&a, &i], DType::F64, &[2, 1, 3]).contains("element types")
    );
}

#[test]
fn max_min_propagate_nan() {
    let a = f64t(&[3], &[1.0, f64::NAN, 3.0]);
    let b = f64t(&[1], &[2.0]);
    let none = Attrs::new();
    assert_close(
        &eval1(OpKind::Max, &none, &[&a, &b], DType::F64, &[3]),
        &[2.0, f64::NAN, 3.0],
        0.0,
    );
    assert_close(
        &eval1(OpKind::Min, &none, &[&a, &b], DType::F64, &[3]),
        &[1.0, f64::NAN, 2.0],
        0.0,
    );
}

#[test]
fn integer_arithmetic() {
    let none = Attrs::new();
    let a = i64t(&[4], &[7, -7, 7, -7]);
    let b = i64t(&[4], &[2, 2, -2, -2]);
    assert_ints(
        &eval1(OpKind::Div, &none, &[&a, &b], DType::I64, &[4]),
        &[3, -3, -3, 3],
    );
    let z = i64t(&[1], &[0]);
    assert!(eval_err(OpKind::Div, &none, &[&a, &z], DType::I64, &[4]).contains("division by zero"));
    let c = Tensor::from_i64(DType::I8, vec![2], vec![100, -100]);
    assert_ints(
        &eval1(OpKind::Add, &none, &[&c, &c], DType::I8, &[2]),
        &[-56, 56],
    );
    assert_ints(
        &eval1(OpKind::Max, &none, &[&a, &b], DType::I64, &[4]),
        &[7, 2, 7, -2],
    );
}

#[test]
fn pow_mixed_types() {
    let none = Attrs::new();
    let a = f64t(&[3], &[2.0, 4.0, 9.0]);
    let h = f64t(&[], &[0.5]);
    assert_close(
        &eval1(OpKind::Pow, &none, &[&a, &h], DType::F64, &[3]),
        &[2f64.sqrt(), 2.0, 3.0],
        1e-15,
    );
    let e = i64t(&[1], &[3]);
    assert_close(
        &eval1(OpKind::Pow, &none, &[&a, &e], DType::F64, &[3]),
        &[8.0, 64.0, 729.0],
        0.0,
    );
    let ib = i64t(&[4], &[2, -3, 5, 2]);
    let ie = i64t(&[4], &[3, 3, 0, -1]);
    assert_ints(
        &eval1(OpKind::Pow, &none, &[&ib, &ie], DType::I64, &[4]),
        &[8, -27, 1, 0],
    );
    let zero = i64t(&[1], &[0]);
    let neg = i64t(&[1], &[-1]);
    assert!(
        eval_err(OpKind::Pow, &none, &[&zero, &neg], DType::I64, &[1]).contains("negative power")
    );
}

#[test]
fn mod_floored_and_truncated() {
    use crate::attr::Attr;
    let floored = Attrs::new();
    let trunc = Attrs::new().with("fmod", Attr::Int(1));
    let a = f64t(&[5], &[5.5, -5.5, 5.5, -5.5, 0.0]);
    let b = f64t(&[5], &[2.0, 2.0, -2.0, -2.0, -3.0]);
    let y = eval1(OpKind::Mod, &floored, &[&a, &b], DType::F64, &[5]);
    assert_close(&y, &[1.5, 0.5, -0.5, -1.5, 0.0], 0.0);
    // A zero takes the divisor's sign.
    assert!(y.to_f64_vec()[4].is_sign_negative());
    assert_close(
        &eval1(OpKind::Mod, &trunc, &[&a, &b], DType::F64, &[5]),
        &[1.5, -1.5, 1.5, -1.5, 0.0],
        0.0,
    );
    let inf = f64t(&[2], &[f64::INFINITY, f64::NEG_INFINITY]);
    let x = f64t(&[2], &[3.0, 3.0]);
    let y = eval1(OpKind::Mod, &floored, &[&x, &inf], DType::F64, &[2]);
    assert_eq!(y.to_f64_vec(), vec![3.0, f64::NEG_INFINITY]);
    let ia = i64t(&[5], &[7, -7, 7, -7, 4]);
    let ib = i64t(&[5], &[3, 3, -3, -3, 0]);
    assert_ints(
        &eval1(OpKind::Mod, &floored, &[&ia, &ib], DType::I64, &[5]),
        &[1, 2, -2, -1, 0],
    );
    assert_ints(
        &eval1(OpKind::Mod, &trunc, &[&ia, &ib], DType::I64, &[5]),
        &[1, -1, 1, -1, 0],
    );
}

#[test]
fn prelu_broadcasts_slope_per_channel() {
    let x = pattern(&[1, 3, 2, 2], 2);
    let slope = f64t(&[3, 1, 1], &[0.1, 0.2, 0.3]);
    let y = eval1(
        OpKind::PRelu,
        &Attrs::new(),
        &[&x, &slope],
        DType::F64,
        &[1, 3, 2, 2],
    );
    let want: Vec<f64> = vals(&x)
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            if v < 0.0 {
                [0.1, 0.2, 0.3][i / 4] * v
            } else {
                v
            }
        })
        .collect();
    assert_close(&y, &want, 0.0);
    let big = f64t(&[2, 3, 1, 1], &[0.0; 6]);
    assert!(eval_err(
        OpKind::PRelu,
        &Attrs::new(),
        &[&x, &big],
        DType::F64,
        &[2, 3, 2, 2]
    )
    .contains("slope"));
}

#[test]
fn comparisons_and_logic() {
    let none = Attrs::new();
    let a = f64t(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, f64::NAN]);
    let b = f64t(&[3], &[2.0, 2.0, 5.0]);
    let run = |kind| eval1(kind, &none, &[&a, &b], DType::Bool, &[2, 3]);
    assert_ints(&run(OpKind::Equal), &[0, 1, 0, 0, 0, 0]);
    assert_ints(&run(OpKind::Less), &[1, 0, 1, 0, 0, 0]);
    assert_ints(&run(OpKind::Greater), &[0, 0, 0, 1, 1, 0]);
    assert_ints(&run(OpKind::LessEqual), &[1, 1, 1, 0, 0, 0]);
    assert_ints(&run(OpKind::GreaterEqual), &[0, 1, 0, 1, 1, 0]);
    let i = i64t(&[3], &[1, 5, 9]);
    let j = i64t(&[1], &[5]);
    assert_ints(
        &eval1(OpKind::Less, &none, &[&i, &j], DType::Bool, &[3]),
        &[1, 0, 0],
    );
    let p = boolt(&[2, 1], &[1, 0]);
    let q = boolt(&[1, 3], &[1, 0, 1]);
    assert_ints(
        &eval1(OpKind::And, &none, &[&p, &q], DType::Bool, &[2, 3]),
        &[1, 0, 1, 0, 0, 0],
    );
    assert_ints(
        &eval1(OpKind::Or, &none, &[&p, &q], DType::Bool, &[2, 3]),
        &[1, 1, 1, 1, 0, 1],
    );
    assert!(eval_err(OpKind::And, &none, &[&a, &b], DType::Bool, &[2, 3]).contains("bool"));
}

#[test]
fn where_broadcasts_three_ways() {
    let c = boolt(&[3, 1], &[1, 0, 1]);
    let x = f64t(&[1, 4], &[1.0, 2.0, 3.0, 4.0]);
    let y = f64t(&[], &[-1.0]);
    let r = eval1(
        OpKind::Where,
        &Attrs::new(),
        &[&c, &x, &y],
        DType::F64,
        &[3, 4],
    );
    assert_close(
        &r,
        &[
            1.0, 2.0, 3.0, 4.0, -1.0, -1.0, -1.0, -1.0, 1.0, 2.0, 3.0, 4.0,
        ],
        0.0,
    );
    let xi = i64t(&[3, 1], &[7, 8, 9]);
    let yi = i64t(&[2], &[0, 1]);
    let r = eval1(
        OpKind::Where,
        &Attrs::new(),
        &[&c, &xi, &yi],
        DType::I64,
        &[3, 2],
    );
    assert_ints(&r, &[7, 7, 0, 1, 9, 9]);
}

// ---- matrix products ----

#[test]
fn matmul_batch_broadcasting() {
    let a = pattern(&[2, 1, 3, 4], 1);
    let b = pattern(&[3, 4, 5], 2);
    let r = eval1(
        OpKind::MatMul,
        &Attrs::new(),
        &[&a, &b],
        DType::F64,
        &[2, 3, 3, 5],
    );
    let (av, bv) = (vals(&a), vals(&b));
    let mut want = vec![];
    for p in 0..2 {
        for q in 0..3 {
            for i in 0..3 {
                for j in 0..5 {
                    let s: f64 = (0..4)
                        .map(|k| {
                            av[off(&[2, 1, 3, 4], &[p, 0, i, k])] * bv[off(&[3, 4, 5], &[q, k, j])]
                        })
                        .sum();
                    want.push(s);
                }
            }
        }
    }
    assert_close(&r, &want, 1e-14);
}

#[test]
fn matmul_vector_promotion() {
    let none = Attrs::new();
    let v = f64t(&[4], &[1.0, 2.0, 3.0, 4.0]);
    let m = iota(&[4, 5]);
    // [4] x [4, 5] -> [5]: column sums weighted by v.
    let want: Vec<f64> = (0..5)
        .map(|j| (0..4).map(|k| (k + 1) as f64 * (5 * k + j) as f64).sum())
        .collect();
    assert_close(
        &eval1(OpKind::MatMul, &none, &[&v, &m], DType::F64, &[5]),
        &want,
        0.0,
    );
    // [2, 3, 4] x [4] -> [2, 3].
    let t = iota(&[2, 3, 4]);
    let want: Vec<f64> = (0..6)
        .map(|r| (0..4).map(|k| (4 * r + k) as f64 * (k + 1) as f64).sum())
        .collect();
    assert_close(
        &eval1(OpKind::MatMul, &none, &[&t, &v], DType::F64, &[2, 3]),
        &want,
        0.0,
    );
    // [4] x [4] -> scalar.
    assert_close(
        &eval1(OpKind::MatMul, &none, &[&v, &v], DType::F64, &[]),
        &[30.0],
        0.0,
    );
    let ia = i64t(&[2, 2], &[1, 2, 3, 4]);
    assert_ints(
        &eval1(OpKind::MatMul, &none, &[&ia, &ia], DType::I64, &[2, 2]),
        &[7, 10, 15, 22],
    );
    let bad = f64t(&[3, 5], &[0.0; 15]);
    assert!(
        eval_err(OpKind::MatMul, &none, &[&t, &bad], DType::F64, &[2, 3, 5])
            .contains("contraction")
    );
}

#[test]
fn gemm_transposes_and_bias() {
    let (m, k, n) = (3, 4, 5);
    // Logical operands A' [m, k], B' [k, n].
    let a_l = |i: usize, p: usize| (i * 7 + p * 3) as f64 * 0.25 - 2.0;
    let b_l = |p: usize, j: usize| (p * 5 + j * 2) as f64 * 0.5 - 3.0;
    let c = f64t(&[5], &[1.0, -1.0, 2.0, 0.5, 3.0]);
    for ta in [0, 1] {
        for tb in [0, 1] {
            let a = if ta == 1 {
                f64t(
                    &[k, m],
                    &(0..k * m).map(|x| a_l(x % m, x / m)).collect::<Vec<_>>(),
                )
            } else {
                f64t(
                    &[m, k],
                    &(0..m * k).map(|x| a_l(x / k, x % k)).collect::<Vec<_>>(),
                )
            };
            let b = if tb == 1 {
                f64t(
                    &[n, k],
                    &(0..n * k).map(|x| b_l(x % k, x / k)).collect::<Vec<_>>(),
                )
            } else {
                f64t(
                    &[k, n],
                    &(0..k * n).map(|x| b_l(x / n, x % n)).collect::<Vec<_>>(),
                )
            };
            let at = attrs(&[
                ("trans_a", Attr::Int(ta)),
                ("trans_b", Attr::Int(tb)),
                ("alpha", Attr::Float(0.5)),
                ("beta", Attr::Float(2.0)),
            ]);
            let r = eval1(OpKind::Gemm, &at, &[&a, &b, &c], DType::F64, &[m, n]);
            let want: Vec<f64> = (0..m * n)
                .map(|x| {
                    let (i, j) = (x / n, x % n);
                    0.5 * (0..k).map(|p| a_l(i, p) * b_l(p, j)).sum::<f64>() + 2.0 * vals(&c)[j]
                })
                .collect();
            assert_close(&r, &want, 1e-14);
            // Without C.
            let r = eval1(OpKind::Gemm, &at, &[&a, &b], DType::F64, &[m, n]);
            let want: Vec<f64> = (0..m * n)
                .map(|x| 0.5 * (0..k).map(|p| a_l(x / n, p) * b_l(p, x % n)).sum::<f64>())
                .collect();
            assert_close(&r, &want, 1e-14);
        }
    }
    // C as a column [m, 1], default alpha/beta.
    let a = f64t(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let col = f64t(&[2, 1], &[10.0, 20.0]);
    let r = eval1(
        OpKind::Gemm,
        &Attrs::new(),
        &[&a, &a, &col],
        DType::F64,
        &[2, 2],
    );
    assert_close(&r, &[17.0, 20.0, 35.0, 42.0], 0.0);
    let bad = f64t(&[3], &[0.0; 3]);
    assert!(eval_err(
        OpKind::Gemm,
        &Attrs::new(),
        &[&a, &a, &bad],
        DType::F64,
        &[2, 2]
    )
    .contains("broadcast"));
}

// ---- convolution ----

/// Direct transcription of ONNX Conv: every output element sums over its window, skipping
/// taps that fall in the padding.
fn naive_conv(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    strides: &[usize],
    pads: &[usize],
    dil: &[usize],
    group: usize,
) -> (Vec<usize>, Vec<f64>) {
    let nsp = x.shape.len() - 2;
    let (c, m) = (x.shape[1], w.shape[0]);
    let (cg, mg) = (c / group, m / group);
    let ks = &w.shape[2..];
    let mut shape = vec![x.shape[0], m];
    for i in 0..nsp {
        shape.push(
            (x.shape[2 + i] + pads[i] + pads[nsp + i] - dil[i] * (ks[i] - 1) - 1) / strides[i] + 1,
        );
    }
    let mut out = vec![];
    for idx in all_indices(&shape) {
        let (b, oc) = (idx[0], idx[1]);
        let g = oc / mg;
        let mut s = bias.map_or(0.0, |t| vals(t)[oc]);
        for ci in 0..cg {
            for kidx in all_indices(ks) {
                let mut pos = vec![b, g * cg + ci];
                let mut inside = true;
                for i in 0..nsp {
                    let p = (idx[2 + i] * strides[i] + kidx[i] * dil[i]) as i64 - pads[i] as i64;
                    inside &= p >= 0 && p < x.shape[2 + i] as i64;
                    pos.push(p.max(0) as usize);
                }
                if inside {
                    let mut wpos = vec![oc, ci];
                    wpos.extend(&kidx);
                    s += vals(x)[off(&x.shape, &pos)] * vals(w)[off(&w.shape, &wpos)];
                }
            }
        }
        out.push(s);
    }
    (shape, out)
}

fn conv_attrs(strides: &[i64], pads: &[i64], dil: &[i64], group: i64) -> Attrs {
    attrs(&[
        ("strides", ints(strides)),
        ("pads", ints(pads)),
        ("dilations", ints(dil)),
        ("group", Attr::Int(group)),
    ])
}

#[test]
fn conv_by_hand() {
    let x = f64t(
        &[1, 1, 3, 3],
        &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0],
    );
    // y = x[i, j] - x[i+1, j+1]
    let w = f64t(&[1, 1, 2, 2], &[1.0, 0.0, 0.0, -1.0]);
    let r = eval1(
        OpKind::Conv,
        &Attrs::new(),
        &[&x, &w],
        DType::F64,
        &[1, 1, 2, 2],
    );
    assert_close(&r, &[-4.0; 4], 0.0);
    // Stride 2, pad 1: windows start at -1 and 1 in each dimension.
    let r = eval1(
        OpKind::Conv,
        &conv_attrs(&[2, 2], &[1, 1, 1, 1], &[1, 1], 1),
        &[&x, &w],
        DType::F64,
        &[1, 1, 2, 2],
    );
    assert_close(&r, &[-1.0, -3.0, -7.0, -4.0], 0.0);
}

#[test]
fn conv_grouped_strided_padded() {
    // The 1×3×5×5 case: depthwise-style groups = 3 with two filters per group, stride 2, pad 1.
    let x = pattern(&[1, 3, 5, 5], 1);
    let w = pattern(&[6, 1, 3, 3], 2);
    let b = pattern(&[6], 3);
    let at = conv_attrs(&[2, 2], &[1, 1, 1, 1], &[1, 1], 3);
    let r = eval1(OpKind::Conv, &at, &[&x, &w, &b], DType::F64, &[1, 6, 3, 3]);
    let (shape, want) = naive_conv(&x, &w, Some(&b), &[2, 2], &[1, 1, 1, 1], &[1, 1], 3);
    assert_eq!(shape, [1, 6, 3, 3]);
    assert_close(&r, &want, 1e-13);

    // group 1, batch 2, asymmetric pads, stride and dilation differing per dimension.
    let x = pattern(&[2, 3, 5, 6], 4);
    let w = pattern(&[2, 3, 3, 2], 5);
    let (shape, want) = naive_conv(&x, &w, None, &[2, 1], &[1, 0, 0, 2], &[1, 2], 1);
    let r = eval1(
        OpKind::Conv,
        &conv_attrs(&[2, 1], &[1, 0, 0, 2], &[1, 2], 1),
        &[&x, &w],
        DType::F64,
        &shape,
    );
    assert_close(&r, &want, 1e-13);

    // 1×1 kernels (whole planes at once), batch 2, with bias.
    let x = pattern(&[2, 5, 4, 3], 8);
    let w = pattern(&[3, 5, 1, 1], 9);
    let b = pattern(&[3], 10);
    let (shape, want) = naive_conv(&x, &w, Some(&b), &[1, 1], &[0, 0, 0, 0], &[1, 1], 1);
    let r = eval1(
        OpKind::Conv,
        &Attrs::new(),
        &[&x, &w, &b],
        DType::F64,
        &shape,
    );
    assert_close(&r, &want, 1e-13);

    // Depthwise: group = C = M.
    let x = pattern(&[1, 4, 6, 6], 6);
    let w = pattern(&[4, 1, 3, 3], 7);
    let (shape, want) = naive_conv(&x, &w, None, &[1, 1], &[1, 1, 1, 1], &[1, 1], 4);
    let r = eval1(
        OpKind::Conv,
        &conv_attrs(&[1, 1], &[1, 1, 1, 1], &[1, 1], 4),
        &[&x, &w],
        DType::F64,
        &shape,
    );
    assert_close(&r, &want, 1e-13);
}

#[test]
fn conv_1d_and_3d() {
    let x = pattern(&[1, 2, 7], 8);
    let w = pattern(&[3, 2, 3], 9);
    let b = pattern(&[3], 10);
    let (shape, want) = naive_conv(&x, &w, Some(&b), &[1], &[2, 1], &[2], 1);
    assert_eq!(shape, [1, 3, 6]);
    let r = eval1(
        OpKind::Conv,
        &conv_attrs(&[1], &[2, 1], &[2], 1),
        &[&x, &w, &b],
        DType::F64,
        &shape,
    );
    assert_close(&r, &want, 1e-13);

    let x = pattern(&[1, 2, 4, 4, 3], 11);
    let w = pattern(&[2, 1, 2, 2, 2], 12);
    let (shape, want) = naive_conv(&x, &w, None, &[1, 2, 1], &[1, 1, 1, 1, 1, 1], &[1, 1, 1], 2);
    let at = conv_attrs(&[1, 2, 1], &[1, 1, 1, 1, 1, 1], &[1, 1, 1], 2);
    let r = eval1(OpKind::Conv, &at, &[&x, &w], DType::F64, &shape);
    assert_close(&r, &want, 1e-13);
}

#[test]
fn conv_errors() {
    let x = pattern(&[1, 3, 2, 2], 1);
    let w = pattern(&[2, 3, 3, 3], 2);
    assert!(eval_err(
        OpKind::Conv,
        &Attrs::new(),
        &[&x, &w],
        DType::F64,
        &[1, 2, 1, 1]
    )
    .contains("does not fit"));
    let w = pattern(&[2, 2, 1, 1], 2);
    assert!(eval_err(
        OpKind::Conv,
        &Attrs::new(),
        &[&x, &w],
        DType::F64,
        &[1, 2, 2, 2]
    )
    .contains("input channels"));
    let w = pattern(&[2, 3, 1, 1], 2);
    let b = pattern(&[3], 2);
    assert!(eval_err(
        OpKind::Conv,
        &Attrs::new(),
        &[&x, &w, &b],
        DType::F64,
        &[1, 2, 2, 2]
    )
    .contains("bias"));
}

/// Direct transcription of ConvTranspose as a scatter: input position i with tap k adds
/// into output position i·stride + k·dilation - pad_begin.
#[allow(clippy::too_many_arguments)]
fn naive_conv_transpose(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    strides: &[usize],
    pads: &[usize],
    dil: &[usize],
    out_pad: &[usize],
    group: usize,
) -> (Vec<usize>, Vec<f64>) {
    let nsp = x.shape.len() - 2;
    let c = x.shape[1];
    let (cg, mg) = (c / group, w.shape[1]);
    let m = mg * group;
    let ks = &w.shape[2..];
    let mut shape = vec![x.shape[0], m];
    for i in 0..nsp {
        shape.push(
            strides[i] * (x.shape[2 + i] - 1) + out_pad[i] + (ks[i] - 1) * dil[i] + 1
                - pads[i]
                - pads[nsp + i],
        );
    }
    let mut out = vec![0.0; shape.iter().product()];
    for idx in all_indices(&shape) {
        out[off(&shape, &idx)] = bias.map_or(0.0, |t| vals(t)[idx[1]]);
    }
    for xi in all_indices(&x.shape) {
        let (b, ic) = (xi[0], xi[1]);
        let g = ic / cg;
        for mo in 0..mg {
            for kidx in all_indices(ks) {
                let mut pos = vec![b, g * mg + mo];
                let mut inside = true;
                for i in 0..nsp {
                    let p = (xi[2 + i] * strides[i] + kidx[i] * dil[i]) as i64 - pads[i] as i64;
                    inside &= p >= 0 && p < shape[2 + i] as i64;
                    pos.push(p.max(0) as usize);
                }
                if inside {
                    let mut wpos = vec![ic, mo];
                    wpos.extend(&kidx);
                    out[off(&shape, &pos)] +=
                        vals(x)[off(&x.shape, &xi)] * vals(w)[off(&w.shape, &wpos)];
                }
            }
        }
    }
    (shape, out)
}

#[test]
fn conv_transpose_by_hand() {
    let x = f64t(&[1, 1, 3], &[1.0, 2.0, 3.0]);
    let w = f64t(&[1, 1, 3], &[1.0, 1.0, 1.0]);
    let s2 = attrs(&[("strides", ints(&[2]))]);
    let r = eval1(
        OpKind::ConvTranspose,
        &s2,
        &[&x, &w],
        DType::F64,
        &[1, 1, 7],
    );
    assert_close(&r, &[1.0, 1.0, 3.0, 2.0, 5.0, 3.0, 3.0], 0.0);
    let padded = attrs(&[("strides", ints(&[2])), ("pads", ints(&[1, 1]))]);
    let r = eval1(
        OpKind::ConvTranspose,
        &padded,
        &[&x, &w],
        DType::F64,
        &[1, 1, 5],
    );
    assert_close(&r, &[1.0, 3.0, 2.0, 5.0, 3.0], 0.0);
    let extra = attrs(&[("strides", ints(&[2])), ("output_padding", ints(&[1]))]);
    let r = eval1(
        OpKind::ConvTranspose,
        &extra,
        &[&x, &w],
        DType::F64,
        &[1, 1, 8],
    );
    assert_close(&r, &[1.0, 1.0, 3.0, 2.0, 5.0, 3.0, 3.0, 0.0], 0.0);
}

#[test]
fn conv_transpose_grouped_2d() {
    let x = pattern(&[1, 4, 3, 3], 1);
    let w = pattern(&[4, 3, 3, 3], 2);
    let b = pattern(&[6], 3);
    let (shape, want) = naive_conv_transpose(
        &x,
        &w,
        Some(&b),
        &[2, 2],
        &[1, 1, 0, 0],
        &[1, 2],
        &[1, 0],
        2,
    );
    // (3-1)·2 + 1 + 2 + 1 - 1 = 7 rows; (3-1)·2 + 0 + 2·2 + 1 - 1 = 8 columns.
    assert_eq!(shape, [1, 6, 7, 8]);
    let at = attrs(&[
        ("strides", ints(&[2, 2])),
        ("pads", ints(&[1, 1, 0, 0])),
        ("dilations", ints(&[1, 2])),
        ("output_padding", ints(&[1, 0])),
        ("group", Attr::Int(2)),
    ]);
    let r = eval1(
        OpKind::ConvTranspose,
        &at,
        &[&x, &w, &b],
        DType::F64,
        &shape,
    );
    assert_close(&r, &want, 1e-13);

    let x = pattern(&[2, 2, 3, 2, 2], 4);
    let w = pattern(&[2, 2, 2, 3, 2], 5);
    let (shape, want) = naive_conv_transpose(
        &x,
        &w,
        None,
        &[1, 2, 3],
        &[0, 1, 0, 1, 0, 1],
        &[1, 1, 1],
        &[0, 1, 2],
        1,
    );
    let at = attrs(&[
        ("strides", ints(&[1, 2, 3])),
        ("pads", ints(&[0, 1, 0, 1, 0, 1])),
        ("output_padding", ints(&[0, 1, 2])),
    ]);
    let r = eval1(OpKind::ConvTranspose, &at, &[&x, &w], DType::F64, &shape);
    assert_close(&r, &want, 1e-13);
}

// ---- pooling ----

#[test]
fn max_pool_by_hand() {
    let x = f64t(
        &[1, 1, 4, 4],
        &(1..=16).map(|v| v as f64).collect::<Vec<_>>(),
    );
    // ceil_mode: windows at rows/cols 0..3 and 2..4 (clipped at the edge).
    let at = attrs(&[
        ("kernel_shape", ints(&[3, 3])),
        ("strides", ints(&[2, 2])),
        ("ceil_mode", Attr::Int(1)),
    ]);
    assert_close(
        &eval1(OpKind::MaxPool, &at, &[&x], DType::F64, &[1, 1, 2, 2]),
        &[11.0, 12.0, 15.0, 16.0],
        0.0,
    );
    let at = attrs(&[("kernel_shape", ints(&[3, 3])), ("strides", ints(&[2, 2]))]);
    assert_close(
        &eval1(OpKind::MaxPool, &at, &[&x], DType::F64, &[1, 1, 1, 1]),
        &[11.0],
        0.0,
    );
    // Dilation 2: the window picks (i, j), (i, j+2), (i+2, j), (i+2, j+2).
    let at = attrs(&[
        ("kernel_shape", ints(&[2, 2])),
        ("dilations", ints(&[2, 2])),
    ]);
    assert_close(
        &eval1(OpKind::MaxPool, &at, &[&x], DType::F64, &[1, 1, 2, 2]),
        &[11.0, 12.0, 15.0, 16.0],
        0.0,
    );
    // Padding never wins, even against negative values.
    let neg = f64t(
        &[1, 1, 3, 3],
        &(1..=9).map(|v| -(v as f64)).collect::<Vec<_>>(),
    );
    let at = attrs(&[
        ("kernel_shape", ints(&[3, 3])),
        ("pads", ints(&[1, 1, 1, 1])),
    ]);
    let r = eval1(OpKind::MaxPool, &at, &[&neg], DType::F64, &[1, 1, 3, 3]);
    assert_close(
        &r,
        &[-1.0, -1.0, -2.0, -1.0, -1.0, -2.0, -4.0, -4.0, -5.0],
        0.0,
    );
    // A ceil_mode window that would start past the input is dropped.
    let two = f64t(&[1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let at = attrs(&[
        ("kernel_shape", ints(&[1, 1])),
        ("strides", ints(&[2, 2])),
        ("ceil_mode", Attr::Int(1)),
    ]);
    assert_close(
        &eval1(OpKind::MaxPool, &at, &[&two], DType::F64, &[1, 1, 1, 1]),
        &[1.0],
        0.0,
    );
}

#[test]
fn avg_pool_padding_rules() {
    let x = f64t(
        &[1, 1, 3, 3],
        &(1..=9).map(|v| v as f64).collect::<Vec<_>>(),
    );
    let base = [
        ("kernel_shape", ints(&[3, 3])),
        ("pads", ints(&[1, 1, 1, 1])),
    ];
    let r = eval1(
        OpKind::AvgPool,
        &attrs(&base),
        &[&x],
        DType::F64,
        &[1, 1, 3, 3],
    );
    // Divisor = cells inside the input: 4 at corners, 6 on edges, 9 in the middle.
    let want = [
        12.0 / 4.0,
        21.0 / 6.0,
        16.0 / 4.0,
        27.0 / 6.0,
        5.0,
        33.0 / 6.0,
        24.0 / 4.0,
        39.0 / 6.0,
        28.0 / 4.0,
    ];
    assert_close(&r, &want, 1e-15);
    let mut incl = base.to_vec();
    incl.push(("count_include_pad", Attr::Int(1)));
    let r = eval1(
        OpKind::AvgPool,
        &attrs(&incl),
        &[&x],
        DType::F64,
        &[1, 1, 3, 3],
    );
    let want = [12.0, 21.0, 16.0, 27.0, 45.0, 33.0, 24.0, 39.0, 28.0].map(|s| s / 9.0);
    assert_close(&r, &want, 1e-15);

    // 1-D, kernel 3, stride 2, pads [1, 0], ceil_mode: windows [-1, 2), [1, 4), [3, 6);
    // cell 5 lies beyond the padded input [-1, 5) and never counts.
    let x = f64t(&[1, 1, 5], &[1.0, 2.0, 3.0, 4.0, 5.0]);
    let mk = |include: i64| {
        attrs(&[
            ("kernel_shape", ints(&[3])),
            ("strides", ints(&[2])),
            ("pads", ints(&[1, 0])),
            ("ceil_mode", Attr::Int(1)),
            ("count_include_pad", Attr::Int(include)),
        ])
    };
    assert_close(
        &eval1(OpKind::AvgPool, &mk(1), &[&x], DType::F64, &[1, 1, 3]),
        &[1.0, 3.0, 4.5],
        1e-15,
    );
    assert_close(
        &eval1(OpKind::AvgPool, &mk(0), &[&x], DType::F64, &[1, 1, 3]),
        &[1.5, 3.0, 4.5],
        1e-15,
    );
}

/// Direct transcription of max/avg pooling for the generic comparison.
#[allow(clippy::too_many_arguments)]
fn naive_pool(
    x: &Tensor,
    max: bool,
    k: &[usize],
    s: &[usize],
    pads: &[usize],
    d: &[usize],
    out_sp: &[usize],
    include_pad: bool,
) -> Vec<f64> {
    let nsp = k.len();
    let mut shape = x.shape[..2].to_vec();
    shape.extend(out_sp);
    let mut out = vec![];
    for idx in all_indices(&shape) {
        let (mut best, mut sum, mut n_in, mut n_pad) = (f64::NEG_INFINITY, 0.0, 0, 0);
        for t in all_indices(k) {
            let mut pos = idx[..2].to_vec();
            let (mut inside, mut in_padded) = (true, true);
            for i in 0..nsp {
                let p = (idx[2 + i] * s[i] + t[i] * d[i]) as i64 - pads[i] as i64;
                inside &= p >= 0 && p < x.shape[2 + i] as i64;
                in_padded &= p >= -(pads[i] as i64) && p < (x.shape[2 + i] + pads[nsp + i]) as i64;
                pos.push(p.max(0) as usize);
            }
            n_pad += in_padded as usize;
            if inside {
                let v = vals(x)[off(&x.shape, &pos)];
                best = best.max(v);
                sum += v;
                n_in += 1;
            }
        }
        out.push(if max {
            best
        } else {
            sum / if include_pad { n_pad } else { n_in } as f64
        });
    }
    out
}

#[test]
fn pools_match_direct_definition() {
    let x = pattern(&[2, 2, 6, 7], 3);
    // kernel [3, 2], strides [2, 3], pads [1, 0, 1, 1]; padded sizes 8 and 8.
    // floor: (8-3)/2+1 = 3, (8-2)/3+1 = 3; ceil: 4 (start 6 < 6+1) and 3.
    for (ceil, out_sp) in [(0, [3, 3]), (1, [4, 3])] {
        for include in [0, 1] {
            let at = attrs(&[
                ("kernel_shape", ints(&[3, 2])),
                ("strides", ints(&[2, 3])),
                ("pads", ints(&[1, 0, 1, 1])),
                ("ceil_mode", Attr::Int(ceil)),
                ("count_include_pad", Attr::Int(include)),
            ]);
            let shape = [2, 2, out_sp[0], out_sp[1]];
            let want = naive_pool(
                &x,
                false,
                &[3, 2],
                &[2, 3],
                &[1, 0, 1, 1],
                &[1, 1],
                &out_sp,
                include == 1,
            );
            assert_close(
                &eval1(OpKind::AvgPool, &at, &[&x], DType::F64, &shape),
                &want,
                1e-14,
            );
            let want = naive_pool(
                &x,
                true,
                &[3, 2],
                &[2, 3],
                &[1, 0, 1, 1],
                &[1, 1],
                &out_sp,
                false,
            );
            assert_close(
                &eval1(OpKind::MaxPool, &at, &[&x], DType::F64, &shape),
                &want,
                0.0,
            );
        }
    }
    // 3-D max pool with dilations: spans 3, 3, 2 over padded sizes 5, 7, 4 -> 3, 5, 3.
    let x = pattern(&[1, 2, 4, 5, 3], 5);
    let at = attrs(&[
        ("kernel_shape", ints(&[2, 2, 2])),
        ("dilations", ints(&[2, 2, 1])),
        ("pads", ints(&[1, 1, 1, 0, 1, 0])),
    ]);
    let want = naive_pool(
        &x,
        true,
        &[2, 2, 2],
        &[1, 1, 1],
        &[1, 1, 1, 0, 1, 0],
        &[2, 2, 1],
        &[3, 5, 3],
        false,
    );
    assert_close(
        &eval1(OpKind::MaxPool, &at, &[&x], DType::F64, &[1, 2, 3, 5, 3]),
        &want,
        0.0,
    );
}

#[test]
fn global_pools() {
    let x = f64t(
        &[1, 2, 2, 3],
        &[
            1.0, 2.0, 3.0, 4.0, 5.0, 6.0, -1.0, -2.0, -3.0, -4.0, -5.0, -7.0,
        ],
    );
    let none = Attrs::new();
    assert_close(
        &eval1(
            OpKind::GlobalAvgPool,
            &none,
            &[&x],
            DType::F64,
            &[1, 2, 1, 1],
        ),
        &[3.5, -22.0 / 6.0],
        1e-15,
    );
    assert_close(
        &eval1(
            OpKind::GlobalMaxPool,
            &none,
            &[&x],
            DType::F64,
            &[1, 2, 1, 1],
        ),
        &[6.0, -1.0],
        0.0,
    );
}

// ---- normalisation ----

#[test]
fn batch_and_instance_norm() {
    let x = pattern(&[2, 3, 2], 1);
    let scale = f64t(&[3], &[1.0, 2.0, 0.5]);
    let bias = f64t(&[3], &[0.0, -1.0, 3.0]);
    let mean = f64t(&[3], &[0.5, -0.25, 1.0]);
    let var = f64t(&[3], &[1.0, 4.0, 0.25]);
    let at = attrs(&[("epsilon", Attr::Float(1e-3))]);
    let r = eval1(
        OpKind::BatchNorm,
        &at,
        &[&x, &scale, &bias, &mean, &var],
        DType::F64,
        &[2, 3, 2],
    );
    let want: Vec<f64> = vals(&x)
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let c = (i / 2) % 3;
            (v - vals(&mean)[c]) / (vals(&var)[c] + 1e-3).sqrt() * vals(&scale)[c] + vals(&bias)[c]
        })
        .collect();
    assert_close(&r, &want, 1e-15);

    let r = eval1(
        OpKind::InstanceNorm,
        &Attrs::new(),
        &[&x, &scale, &bias],
        DType::F64,
        &[2, 3, 2],
    );
    // Each (n, c) row has two elements a, b: mean (a+b)/2, variance ((a-b)/2)².
    let xv = vals(&x);
    let mut want = vec![];
    for row in 0..6 {
        let (a, b) = (xv[2 * row], xv[2 * row + 1]);
        let (m, v) = ((a + b) / 2.0, ((a - b) / 2.0).powi(2));
        let c = row % 3;
        for e in [a, b] {
            want.push((e - m) / (v + 1e-5).sqrt() * vals(&scale)[c] + vals(&bias)[c]);
        }
    }
    assert_close(&r, &want, 1e-14);
    let short = f64t(&[2], &[1.0, 1.0]);
    let e = eval_err(
        OpKind::BatchNorm,
        &at,
        &[&x, &short, &bias, &mean, &var],
        DType::F64,
        &[2, 3, 2],
    );
    assert!(e.contains("scale must have shape [3]"), "{e}");
}

#[test]
fn layer_norm_over_trailing_axes() {
    let x = pattern(&[2, 3, 4], 2);
    let scale = pattern(&[3, 4], 3);
    let bias = f64t(&[4], &[0.5, -0.5, 1.0, 0.0]);
    let at = attrs(&[("axis", Attr::Int(1)), ("epsilon", Attr::Float(1e-2))]);
    let outs = eval_with(
        OpKind::LayerNorm,
        &at,
        &[&x, &scale, &bias],
        &[
            ty(DType::F64, &[2, 3, 4]),
            ty(DType::F64, &[2, 1, 1]),
            ty(DType::F64, &[2, 1, 1]),
        ],
        Precision::Typed,
    );
    let xv = vals(&x);
    let (mut want, mut means, mut invs) = (vec![], vec![], vec![]);
    for b in 0..2 {
        let row = &xv[12 * b..12 * b + 12];
        let m = row.iter().sum::<f64>() / 12.0;
        let v = row.iter().map(|a| (a - m).powi(2)).sum::<f64>() / 12.0;
        let inv = 1.0 / (v + 1e-2).sqrt();
        for (j, &a) in row.iter().enumerate() {
            want.push((a - m) * inv * vals(&scale)[j] + vals(&bias)[j % 4]);
        }
        means.push(m);
        invs.push(inv);
    }
    assert_close(&outs[0], &want, 1e-14);
    assert_close(&outs[1], &means, 1e-15);
    assert_close(&outs[2], &invs, 1e-15);

    // Default axis -1, no bias.
    let s4 = f64t(&[4], &[1.0, 2.0, 3.0, 4.0]);
    let r = eval1(
        OpKind::LayerNorm,
        &Attrs::new(),
        &[&x, &s4],
        DType::F64,
        &[2, 3, 4],
    );
    let mut want = vec![];
    for row in xv.chunks(4) {
        let m = row.iter().sum::<f64>() / 4.0;
        let v = row.iter().map(|a| (a - m).powi(2)).sum::<f64>() / 4.0;
        for (j, &a) in row.iter().enumerate() {
            want.push((a - m) / (v + 1e-5).sqrt() * (j + 1) as f64);
        }
    }
    assert_close(&r, &want, 1e-14);
}

#[test]
fn lrn_channel_windows() {
    // x [1, 5, 1, 2]; channel c, position p holds c + 1 + 10 p.
    let xv: Vec<f64> = (0..5)
        .flat_map(|c| [(c + 1) as f64, (c + 11) as f64])
        .collect();
    let x = f64t(&[1, 5, 1, 2], &xv);
    let at = |size: i64| {
        attrs(&[
            ("size", Attr::Int(size)),
            ("alpha", Attr::Float(0.3)),
            ("beta", Attr::Float(0.75)),
            ("bias", Attr::Float(2.0)),
        ])
    };
    let expect = |lo: i64, hi: i64, size: f64| {
        let mut want = vec![];
        for c in 0..5i64 {
            for p in 0..2 {
                let sq: f64 = (c - lo..=c + hi)
                    .filter(|&cc| (0..5).contains(&cc))
                    .map(|cc| xv[(cc * 2 + p) as usize].powi(2))
                    .sum();
                want.push(xv[(c * 2 + p) as usize] / (2.0 + 0.3 / size * sq).powf(0.75));
            }
        }
        want
    };
    // size 3: channels c-1..=c+1; size 2: c..=c+1 (floor((2-1)/2) = 0 before, ceil = 1 after).
    assert_close(
        &eval1(OpKind::Lrn, &at(3), &[&x], DType::F64, &[1, 5, 1, 2]),
        &expect(1, 1, 3.0),
        1e-15,
    );
    assert_close(
        &eval1(OpKind::Lrn, &at(2), &[&x], DType::F64, &[1, 5, 1, 2]),
        &expect(0, 1, 2.0),
        1e-15,
    );
}

#[test]
fn softmax_on_middle_axis() {
    // Large offsets would overflow exp without the max shift.
    let x = f64t(
        &[2, 3, 4],
        &(0..24)
            .map(|i| 1000.0 + ((i * 7) % 5) as f64)
            .collect::<Vec<_>>(),
    );
    let at = attrs(&[("axis", Attr::Int(1))]);
    let r = eval1(OpKind::Softmax, &at, &[&x], DType::F64, &[2, 3, 4]);
    let lr = eval1(OpKind::LogSoftmax, &at, &[&x], DType::F64, &[2, 3, 4]);
    let xv = vals(&x);
    let (mut want, mut want_log) = (vec![0.0; 24], vec![0.0; 24]);
    for a in 0..2 {
        for c in 0..4 {
            let at = |j: usize| a * 12 + j * 4 + c;
            // Shift by 1000 by hand: e^(x - 1000) is small and exact enough.
            let z: f64 = (0..3).map(|j| (xv[at(j)] - 1000.0).exp()).sum();
            for j in 0..3 {
                want[at(j)] = (xv[at(j)] - 1000.0).exp() / z;
                want_log[at(j)] = (xv[at(j)] - 1000.0) - z.ln();
            }
        }
    }
    assert_close(&r, &want, 1e-15);
    assert_close(&lr, &want_log, 1e-15);
    let sums: Vec<f64> = (0..8)
        .map(|k| (0..3).map(|j| vals(&r)[(k / 4) * 12 + j * 4 + k % 4]).sum())
        .collect();
    assert_close(&f64t(&[8], &sums), &[1.0; 8], 1e-15);
    // Default axis is the last one.
    let r = eval1(
        OpKind::Softmax,
        &Attrs::new(),
        &[&x],
        DType::F64,
        &[2, 3, 4],
    );
    let row = &vals(&r)[0..4];
    let z: f64 = xv[0..4].iter().map(|v| (v - 1000.0).exp()).sum();
    assert_close(
        &f64t(&[4], row),
        &xv[0..4]
            .iter()
            .map(|v| (v - 1000.0).exp() / z)
            .collect::<Vec<_>>(),
        1e-15,
    );
}

// ---- reductions ----

#[test]
fn reductions() {
    let x = iota(&[2, 3, 4]);
    let xv = vals(&x);
    let at =
        |axes: &[i64], keep: i64| attrs(&[("axes", ints(axes)), ("keepdims", Attr::Int(keep))]);
    // Sum over axes 0 and 2: for each middle index j, Σ_a Σ_c (12 a + 4 j + c).
    let want: Vec<f64> = (0..3)
        .map(|j| {
            (0..2)
                .flat_map(|a| (0..4).map(move |c| (12 * a + 4 * j + c) as f64))
                .sum()
        })
        .collect();
    assert_close(
        &eval1(
            OpKind::ReduceSum,
            &at(&[0, 2], 1),
            &[&x],
            DType::F64,
            &[1, 3, 1],
        ),
        &want,
        0.0,
    );
    assert_close(
        &eval1(OpKind::ReduceSum, &at(&[0, -1], 0), &[&x], DType::F64, &[3]),
        &want,
        0.0,
    );
    let means: Vec<f64> = xv.chunks(4).map(|r| r.iter().sum::<f64>() / 4.0).collect();
    assert_close(
        &eval1(
            OpKind::ReduceMean,
            &at(&[-1], 1),
            &[&x],
            DType::F64,
            &[2, 3, 1],
        ),
        &means,
        0.0,
    );
    assert_close(
        &eval1(
            OpKind::ReduceMax,
            &at(&[], 1),
            &[&x],
            DType::F64,
            &[1, 1, 1],
        ),
        &[23.0],
        0.0,
    );
    assert_close(
        &eval1(
            OpKind::ReduceMin,
            &Attrs::new(),
            &[&x],
            DType::F64,
            &[1, 1, 1],
        ),
        &[0.0],
        0.0,
    );
    assert_close(
        &eval1(OpKind::ReduceMax, &at(&[1], 0), &[&x], DType::F64, &[2, 4]),
        &[8.0, 9.0, 10.0, 11.0, 20.0, 21.0, 22.0, 23.0],
        0.0,
    );
    let i = i64t(&[2, 2], &[1, -5, 7, 2]);
    assert_ints(
        &eval1(OpKind::ReduceSum, &at(&[1], 0), &[&i], DType::I64, &[2]),
        &[-4, 9],
    );
    assert_ints(
        &eval1(OpKind::ReduceMin, &at(&[0], 0), &[&i], DType::I64, &[2]),
        &[1, -5],
    );
    assert!(eval_err(
        OpKind::ReduceSum,
        &at(&[0, 0], 0),
        &[&x],
        DType::F64,
        &[3, 4]
    )
    .contains("twice"));
    assert!(
        eval_err(OpKind::ReduceSum, &at(&[3], 0), &[&x], DType::F64, &[2, 3])
            .contains("out of range")
    );
}

// ---- data movement ----

#[test]
fn reshape_transpose_flatten() {
    let x = iota(&[2, 3, 4]);
    let none = Attrs::new();
    let r = eval1(
        OpKind::Reshape,
        &attrs(&[("shape", ints(&[4, -1]))]),
        &[&x],
        DType::F64,
        &[4, 6],
    );
    assert_eq!(vals(&r), vals(&x));
    assert!(eval_err(
        OpKind::Reshape,
        &attrs(&[("shape", ints(&[5, -1]))]),
        &[&x],
        DType::F64,
        &[5, 5]
    )
    .contains("cannot reshape"));
    assert!(eval_err(
        OpKind::Reshape,
        &attrs(&[("shape", ints(&[-1, -1]))]),
        &[&x],
        DType::F64,
        &[4, 6]
    )
    .contains("-1"));

    let r = eval1(
        OpKind::Transpose,
        &attrs(&[("perm", ints(&[2, 0, 1]))]),
        &[&x],
        DType::F64,
        &[4, 2, 3],
    );
    let want: Vec<f64> = all_indices(&[4, 2, 3])
        .iter()
        .map(|i| (12 * i[1] + 4 * i[2] + i[0]) as f64)
        .collect();
    assert_close(&r, &want, 0.0);
    let r = eval1(OpKind::Transpose, &none, &[&x], DType::F64, &[4, 3, 2]);
    let want: Vec<f64> = all_indices(&[4, 3, 2])
        .iter()
        .map(|i| (12 * i[2] + 4 * i[1] + i[0]) as f64)
        .collect();
    assert_close(&r, &want, 0.0);
    assert!(eval_err(
        OpKind::Transpose,
        &attrs(&[("perm", ints(&[0, 0, 1]))]),
        &[&x],
        DType::F64,
        &[2, 2, 3]
    )
    .contains("twice"));

    assert_eq!(
        eval1(
            OpKind::Flatten,
            &attrs(&[("axis", Attr::Int(2))]),
            &[&x],
            DType::F64,
            &[6, 4]
        )
        .shape,
        [6, 4]
    );
    assert_eq!(
        eval1(
            OpKind::Flatten,
            &attrs(&[("axis", Attr::Int(0))]),
            &[&x],
            DType::F64,
            &[1, 24]
        )
        .shape,
        [1, 24]
    );
    assert_eq!(
        eval1(
            OpKind::Flatten,
            &attrs(&[("axis", Attr::Int(-1))]),
            &[&x],
            DType::F64,
            &[6, 4]
        )
        .shape,
        [6, 4]
    );
    assert_eq!(
        eval1(OpKind::Flatten, &none, &[&x], DType::F64, &[2, 12]).shape,
        [2, 12]
    );
}

#[test]
fn concat_and_split() {
    let a = iota(&[2, 1, 3]);
    let b = f64t(
        &[2, 2, 3],
        &(0..12).map(|i| 100.0 + i as f64).collect::<Vec<_>>(),
    );
    let r = eval1(
        OpKind::Concat,
        &attrs(&[("axis", Attr::Int(-2))]),
        &[&a, &b],
        DType::F64,
        &[2, 3, 3],
    );
    let want = [
        0.0, 1.0, 2.0, 100.0, 101.0, 102.0, 103.0, 104.0, 105.0, //
        3.0, 4.0, 5.0, 106.0, 107.0, 108.0, 109.0, 110.0, 111.0,
    ];
    assert_close(&r, &want, 0.0);
    let bad = iota(&[2, 2, 2]);
    assert!(eval_err(
        OpKind::Concat,
        &attrs(&[("axis", Attr::Int(1))]),
        &[&a, &bad],
        DType::F64,
        &[2, 3, 3]
    )
    .contains("does not match"));
    let i = i64t(&[1, 2], &[1, 2]);
    let j = i64t(&[2, 2], &[3, 4, 5, 6]);
    assert_ints(
        &eval1(
            OpKind::Concat,
            &attrs(&[("axis", Attr::Int(0))]),
            &[&i, &j],
            DType::I64,
            &[3, 2],
        ),
        &[1, 2, 3, 4, 5, 6],
    );

    let parts = eval_with(
        OpKind::Split,
        &attrs(&[("axis", Attr::Int(1)), ("split", ints(&[1, 2]))]),
        &[&r],
        &[ty(DType::F64, &[2, 1, 3]), ty(DType::F64, &[2, 2, 3])],
        Precision::Typed,
    );
    assert_eq!(parts[0], a);
    assert_eq!(parts[1], b);
    let e = eval_op(
        OpKind::Split,
        &attrs(&[("axis", Attr::Int(1)), ("split", ints(&[1, 1]))]),
        &[&r],
        &[ty(DType::F64, &[2, 1, 3]), ty(DType::F64, &[2, 1, 3])],
        &InterpOptions::default(),
    );
    assert!(e.unwrap_err().to_string().contains("do not add up"));
}

#[test]
fn slice_clamping_and_negative_steps() {
    let x = iota(&[3, 4]);
    let at = |starts: &[i64], ends: &[i64], axes: &[i64], steps: &[i64]| {
        attrs(&[
            ("starts", ints(starts)),
            ("ends", ints(ends)),
            ("axes", ints(axes)),
            ("steps", ints(steps)),
        ])
    };
    // Rows 2, 1, 0 (INT64_MIN end means "through the start"); columns 3, 1.
    let r = eval1(
        OpKind::Slice,
        &at(&[-1, 3], &[i64::MIN, 0], &[0, 1], &[-1, -2]),
        &[&x],
        DType::F64,
        &[3, 2],
    );
    assert_close(&r, &[11.0, 9.0, 7.0, 5.0, 3.0, 1.0], 0.0);
    // Columns 1.. with an INT64_MAX end, axis given negatively, default steps.
    let a = attrs(&[
        ("starts", ints(&[1])),
        ("ends", ints(&[i64::MAX])),
        ("axes", ints(&[-1])),
    ]);
    let r = eval1(OpKind::Slice, &a, &[&x], DType::F64, &[3, 3]);
    assert_close(&r, &[1.0, 2.0, 3.0, 5.0, 6.0, 7.0, 9.0, 10.0, 11.0], 0.0);
    // Out-of-range starts/ends clamp; default axes are 0..
    let a = attrs(&[("starts", ints(&[-100, 1])), ("ends", ints(&[100, 3]))]);
    let r = eval1(OpKind::Slice, &a, &[&x], DType::F64, &[3, 2]);
    assert_close(&r, &[1.0, 2.0, 5.0, 6.0, 9.0, 10.0], 0.0);
    // Negative step from past the end clamps to the last element; stride 2 backwards.
    let r = eval1(
        OpKind::Slice,
        &at(&[10], &[-10], &[1], &[-3]),
        &[&x],
        DType::F64,
        &[3, 2],
    );
    assert_close(&r, &[3.0, 0.0, 7.0, 4.0, 11.0, 8.0], 0.0);
    // Empty result when start is past end.
    let r = eval1(
        OpKind::Slice,
        &at(&[2], &[1], &[0], &[1]),
        &[&x],
        DType::F64,
        &[0, 4],
    );
    assert!(vals(&r).is_empty());
    assert!(eval_err(
        OpKind::Slice,
        &at(&[0], &[1], &[0], &[0]),
        &[&x],
        DType::F64,
        &[1, 4]
    )
    .contains("step"));
}

#[test]
fn gather_with_negative_indices() {
    let x = iota(&[3, 4]);
    let idx = i64t(&[2, 2], &[-1, 0, 2, -3]);
    let r = eval1(
        OpKind::Gather,
        &attrs(&[("axis", Attr::Int(1))]),
        &[&x, &idx],
        DType::F64,
        &[3, 2, 2],
    );
    // Columns 3, 0, 2, 1 of each row.
    let want: Vec<f64> = (0..3)
        .flat_map(|row| [3, 0, 2, 1].map(|c| (4 * row + c) as f64))
        .collect();
    assert_close(&r, &want, 0.0);
    let rows = i64t(&[2], &[-1, 1]);
    let r = eval1(
        OpKind::Gather,
        &Attrs::new(),
        &[&x, &rows],
        DType::F64,
        &[2, 4],
    );
    assert_close(&r, &[8.0, 9.0, 10.0, 11.0, 4.0, 5.0, 6.0, 7.0], 0.0);
    // A scalar index drops the axis.
    let one = Tensor::from_i64(DType::I32, vec![], vec![2]);
    let r = eval1(OpKind::Gather, &Attrs::new(), &[&x, &one], DType::F64, &[4]);
    assert_close(&r, &[8.0, 9.0, 10.0, 11.0], 0.0);
    let bad = i64t(&[1], &[3]);
    let e = eval_err(
        OpKind::Gather,
        &Attrs::new(),
        &[&x, &bad],
        DType::F64,
        &[1, 4],
    );
    assert_eq!(
        e,
        "\"pp.gather\": index 3 out of range for axis 0 of size 3"
    );
    let bad = i64t(&[1], &[-4]);
    assert!(eval_err(
        OpKind::Gather,
        &Attrs::new(),
        &[&x, &bad],
        DType::F64,
        &[1, 4]
    )
    .contains("index -4"));
    let fidx = f64t(&[1], &[0.0]);
    assert!(eval_err(
        OpKind::Gather,
        &Attrs::new(),
        &[&x, &fidx],
        DType::F64,
        &[1, 4]
    )
    .contains("integer"));
}

#[test]
fn expand_and_tile() {
    let x = f64t(&[3, 1], &[1.0, 2.0, 3.0]);
    let r = eval1(
        OpKind::Expand,
        &attrs(&[("shape", ints(&[2, 1, 4]))]),
        &[&x],
        DType::F64,
        &[2, 3, 4],
    );
    let want: Vec<f64> = all_indices(&[2, 3, 4])
        .iter()
        .map(|i| (i[1] + 1) as f64)
        .collect();
    assert_close(&r, &want, 0.0);
    assert!(eval_err(
        OpKind::Expand,
        &attrs(&[("shape", ints(&[2, 1]))]),
        &[&x],
        DType::F64,
        &[3, 1]
    )
    .contains("broadcast"));
    let y = f64t(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let r = eval1(
        OpKind::Tile,
        &attrs(&[("repeats", ints(&[2, 2]))]),
        &[&y],
        DType::F64,
        &[4, 6],
    );
    let want: Vec<f64> = all_indices(&[4, 6])
        .iter()
        .map(|i| (3 * (i[0] % 2) + i[1] % 3 + 1) as f64)
        .collect();
    assert_close(&r, &want, 0.0);
}

#[test]
fn pad_modes() {
    let x = f64t(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let at = |mode: &str, pads: &[i64]| {
        attrs(&[
            ("pads", ints(pads)),
            ("mode", Attr::Str(mode.into())),
            ("value", Attr::Float(9.0)),
        ])
    };
    // numpy reflect: rows [r1, r0, r1, r0], columns [3, 2, 1, 2, 3, 2, 1].
    let r = eval1(
        OpKind::Pad,
        &at("reflect", &[1, 2, 1, 2]),
        &[&x],
        DType::F64,
        &[4, 7],
    );
    let row = |r: [f64; 3]| [r[2], r[1], r[0], r[1], r[2], r[1], r[0]];
    let (r0, r1) = (row([1.0, 2.0, 3.0]), row([4.0, 5.0, 6.0]));
    assert_close(&r, &[r1, r0, r1, r0].concat(), 0.0);
    let r = eval1(
        OpKind::Pad,
        &at("edge", &[1, 2, 1, 2]),
        &[&x],
        DType::F64,
        &[4, 7],
    );
    let row = |r: [f64; 3]| [r[0], r[0], r[0], r[1], r[2], r[2], r[2]];
    let (r0, r1) = (row([1.0, 2.0, 3.0]), row([4.0, 5.0, 6.0]));
    assert_close(&r, &[r0, r0, r1, r1].concat(), 0.0);
    let r = eval1(
        OpKind::Pad,
        &at("constant", &[0, 1, 1, 0]),
        &[&x],
        DType::F64,
        &[3, 4],
    );
    assert_close(
        &r,
        &[9.0, 1.0, 2.0, 3.0, 9.0, 4.0, 5.0, 6.0, 9.0, 9.0, 9.0, 9.0],
        0.0,
    );
    // Negative pads crop.
    let r = eval1(
        OpKind::Pad,
        &attrs(&[("pads", ints(&[0, -1, 0, 1]))]),
        &[&x],
        DType::F64,
        &[2, 3],
    );
    assert_close(&r, &[2.0, 3.0, 0.0, 5.0, 6.0, 0.0], 0.0);
    let i = i64t(&[2], &[5, 6]);
    assert_ints(
        &eval1(
            OpKind::Pad,
            &at("constant", &[1, 0]),
            &[&i],
            DType::I64,
            &[3],
        ),
        &[9, 5, 6],
    );
    assert!(eval_err(
        OpKind::Pad,
        &at("wrap", &[1, 0, 0, 0]),
        &[&x],
        DType::F64,
        &[3, 3]
    )
    .contains("mode"));
}

#[test]
fn squeeze_unsqueeze() {
    let x = iota(&[1, 3, 1, 2]);
    assert_eq!(
        eval1(OpKind::Squeeze, &Attrs::new(), &[&x], DType::F64, &[3, 2]).shape,
        [3, 2]
    );
    assert_eq!(
        eval1(
            OpKind::Squeeze,
            &attrs(&[("axes", ints(&[-2]))]),
            &[&x],
            DType::F64,
            &[1, 3, 2]
        )
        .shape,
        [1, 3, 2]
    );
    assert!(eval_err(
        OpKind::Squeeze,
        &attrs(&[("axes", ints(&[1]))]),
        &[&x],
        DType::F64,
        &[1, 1, 2]
    )
    .contains("cannot squeeze"));
    let y = iota(&[3, 2]);
    let r = eval1(
        OpKind::Unsqueeze,
        &attrs(&[("axes", ints(&[0, -1]))]),
        &[&y],
        DType::F64,
        &[1, 3, 2, 1],
    );
    assert_eq!(vals(&r), vals(&y));
    assert_eq!(
        eval1(
            OpKind::Unsqueeze,
            &attrs(&[("axes", ints(&[1]))]),
            &[&y],
            DType::F64,
            &[3, 1, 2]
        )
        .shape,
        [3, 1, 2]
    );
}

#[test]
fn constant_casts_to_result_type() {
    let value = i64t(&[2], &[3, -4]);
    let r = eval1(
        OpKind::Constant,
        &attrs(&[("value", Attr::Tensor(value.clone()))]),
        &[],
        DType::F32,
        &[2],
    );
    assert_eq!(r.dtype, DType::F32);
    assert_close(&r, &[3.0, -4.0], 0.0);
    let r = eval1(
        OpKind::Constant,
        &attrs(&[("value", Attr::Tensor(value))]),
        &[],
        DType::I64,
        &[2],
    );
    assert_ints(&r, &[3, -4]);
    assert!(eval_err(OpKind::Constant, &Attrs::new(), &[], DType::F32, &[2]).contains("`value`"));
}

// ---- checks at the op boundary ----

#[test]
fn declared_types_are_checked() {
    let x = iota(&[2, 3]);
    let none = Attrs::new();
    let e = eval_err(OpKind::Relu, &none, &[&x], DType::F64, &[3, 2]);
    assert_eq!(e, "\"pp.relu\": the result is a tensor of type tensor<2x3xf64>, but the op declares tensor<3x2xf64>");
    assert!(eval_err(OpKind::Relu, &none, &[&x], DType::F32, &[2, 3])
        .contains("declares tensor<2x3xf32>"));
    // A `?` dimension admits any size.
    let batch = TensorType::new(DType::F64, vec![Dim::Batch, Dim::Known(3)]);
    assert!(eval_op(
        OpKind::Relu,
        &none,
        &[&x],
        &[batch],
        &InterpOptions::default()
    )
    .is_ok());
    assert!(eval_err(OpKind::Add, &none, &[&x], DType::F64, &[2, 3])
        .contains("expected 2 operands, got 1"));
    let e = eval_err(
        OpKind::Send,
        &attrs(&[("peer", Attr::Int(1)), ("channel", Attr::Int(0))]),
        &[&x],
        DType::F64,
        &[2, 3],
    );
    assert!(e.contains("pp.send"), "{e}");
    let e = eval_op(
        OpKind::Recv,
        &none,
        &[],
        &[ty(DType::F64, &[2])],
        &InterpOptions::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("communicator"), "{e}");
    let malformed = Tensor {
        dtype: DType::F32,
        shape: vec![2],
        data: TensorData::Int(vec![1, 2]),
    };
    assert!(eval_err(OpKind::Relu, &none, &[&malformed], DType::F32, &[2]).contains("malformed"));
}

/// Every op kind other than send/recv runs through eval_op on some input without panicking.
#[test]
fn every_kind_is_handled() {
    let x = pattern(&[1, 2, 3, 3], 1);
    for &kind in OpKind::ALL {
        if matches!(kind, OpKind::Send | OpKind::Recv) {
            continue;
        }
        let inputs: Vec<&Tensor> = match kind.arity() {
            crate::ops::Arity::Exact(n)
            | crate::ops::Arity::Range(n, _)
            | crate::ops::Arity::AtLeast(n) => {
                vec![&x; n]
            }
        };
        // Wrong attributes or dtypes may make it fail; it must fail with an error.
        let _ = eval_op(
            kind,
            &Attrs::new(),
            &inputs,
            &[ty(DType::F64, &[1, 2, 3, 3])],
            &InterpOptions::default(),
        );
    }
}

// ---- whole functions ----

/// Queues keyed by channel; records every send.
#[derive(Default)]
struct Mailbox {
    queues: HashMap<i64, VecDeque<Tensor>>,
    log: Vec<String>,
}

impl Comm for Mailbox {
    fn send(&mut self, peer: u32, channel: i64, t: Tensor) -> Result<(), CommError> {
        self.log
            .push(format!("send to {peer} on {channel}: {:?}", t.shape));
        self.queues.entry(channel).or_default().push_back(t);
        Ok(())
    }

    fn recv(&mut self, peer: u32, channel: i64, ty: &TensorType) -> Result<Tensor, CommError> {
        self.log
            .push(format!("recv from {peer} on {channel}: {ty}"));
        self.queues
            .get_mut(&channel)
            .and_then(|q| q.pop_front())
            .ok_or_else(|| CommError::Transport {
                peer,
                channel,
                message: format!("nothing on channel {channel}"),
            })
    }
}

fn f32_ty(dims: Vec<Dim>) -> TensorType {
    TensorType::new(DType::F32, dims)
}

/// Stage 0: `h = matmul(x, w)`, `r = relu(h)`, send r; returns h.
/// Stage 1: receives r, `y = r + b`, returns (sum of y, y * y, y).
fn two_stage_module() -> Module {
    let mut m = Module::new();
    let batch = || vec![Dim::Batch, Dim::Known(2)];
    let mut f0 = Function::new("stage0");
    let x = f0.add_arg("x", f32_ty(vec![Dim::Batch, Dim::Known(3)]), ArgKind::Input);
    let w = f0.add_arg(
        "w",
        f32_ty(vec![Dim::Known(3), Dim::Known(2)]),
        ArgKind::Param,
    );
    let h = f0.push(
        NewOp::new(OpKind::MatMul, vec![x, w], vec![f32_ty(batch())]).names(vec!["h".into()]),
    );
    let r = f0.push(NewOp::new(OpKind::Relu, vec![h], vec![f32_ty(batch())]));
    f0.push_op(
        NewOp::new(OpKind::Send, vec![r], vec![])
            .attrs(attrs(&[("peer", Attr::Int(1)), ("channel", Attr::Int(7))]))
            .stage(0),
    );
    f0.set_results(vec![h]);

    let mut f1 = Function::new("stage1");
    let b = f1.add_arg("b", f32_ty(vec![Dim::Known(2)]), ArgKind::Param);
    let r = f1.push(
        NewOp::new(OpKind::Recv, vec![], vec![f32_ty(batch())])
            .attrs(attrs(&[("peer", Attr::Int(0)), ("channel", Attr::Int(7))])),
    );
    let y = f1.push(NewOp::new(OpKind::Add, vec![r, b], vec![f32_ty(batch())]));
    let s = f1.push(
        NewOp::new(OpKind::ReduceSum, vec![y], vec![f32_ty(vec![])])
            .attrs(attrs(&[("keepdims", Attr::Int(0))])),
    );
    let sq = f1.push(NewOp::new(OpKind::Mul, vec![y, y], vec![f32_ty(batch())]));
    f1.set_results(vec![s, sq, y]);

    m.functions = vec![f0, f1];
    m.weights.insert(
        "w".into(),
        Tensor::from_f32(vec![3, 2], vec![1.0, -1.0, 0.5, 2.0, -2.0, 0.0]),
    );
    m.weights
        .insert("b".into(), Tensor::from_f32(vec![2], vec![0.25, -0.5]));
    m
}

#[test]
fn run_two_stages_through_a_comm() {
    let m = two_stage_module();
    let (f0, f1) = (&m.functions[0], &m.functions[1]);
    let mut inputs = HashMap::new();
    inputs.insert(
        "x".to_string(),
        Tensor::from_f32(vec![2, 3], vec![1.0, 2.0, 3.0, -1.0, 0.0, 1.0]),
    );
    let args = bind_args(&m, f0, &inputs).unwrap();
    let mut mail = Mailbox::default();
    let opts = InterpOptions::default();
    let out0 = run_function(f0, args, &opts, Some(&mut mail)).unwrap();
    // h = x · w: row 0 = [1 + 1 - 6, -1 + 4 + 0] = [-4, 3]; row 1 = [-1 - 2, 1 + 0] = [-3, 1].
    assert_eq!(out0.len(), 1);
    assert_eq!(out0[0].shape, [2, 2]);
    assert_close(&out0[0], &[-4.0, 3.0, -3.0, 1.0], 0.0);

    let args = bind_args(&m, f1, &HashMap::new()).unwrap();
    let out1 = run_function(f1, args, &opts, Some(&mut mail)).unwrap();
    // r = relu(h) = [0, 3, 0, 1]; y = r + b = [0.25, 2.5, 0.25, 0.5].
    assert_close(&out1[2], &[0.25, 2.5, 0.25, 0.5], 0.0);
    assert_close(&out1[1], &[0.0625, 6.25, 0.0625, 0.25], 0.0);
    assert_eq!(out1[0].shape, Vec::<usize>::new());
    assert_close(&out1[0], &[3.5], 0.0);
    assert_eq!(
        mail.log,
        [
            "send to 1 on 7: [2, 2]",
            "recv from 0 on 7: tensor<?x2xf32>"
        ]
    );

    // Without a communicator, send is an error naming the op.
    let args = bind_args(&m, f0, &inputs).unwrap();
    let e = run_function(f0, args, &opts, None).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("\"pp.send\": needs a communicator"),
        "{e}"
    );
    // A recv with nothing to receive reports the transport's message.
    let args = bind_args(&m, f1, &HashMap::new()).unwrap();
    let e = run_function(f1, args, &opts, Some(&mut mail)).unwrap_err();
    assert!(e.to_string().contains("nothing on channel 7"), "{e}");
}

/// A communicator whose transport was stopped because another device failed.
struct Stopped;

impl Comm for Stopped {
    fn send(&mut self, peer: u32, _channel: i64, _t: Tensor) -> Result<(), CommError> {
        Err(CommError::Aborted {
            peer,
            reason: "device 0 failed".into(),
        })
    }

    fn recv(&mut self, peer: u32, _channel: i64, _ty: &TensorType) -> Result<Tensor, CommError> {
        Err(CommError::Aborted {
            peer,
            reason: "device 0 failed".into(),
        })
    }
}

#[test]
fn a_comm_failure_keeps_its_variant() {
    let m = two_stage_module();
    let f1 = &m.functions[1];
    let args = bind_args(&m, f1, &HashMap::new()).unwrap();
    let e = run_function(f1, args, &InterpOptions::default(), Some(&mut Stopped)).unwrap_err();
    match &e {
        InterpError::Comm {
            kind: OpKind::Recv,
            peer: 0,
            channel: 7,
            source,
            ..
        } => assert!(source.is_aborted()),
        other => panic!("{other:?}"),
    }
    assert!(e.comm_error().is_some_and(CommError::is_aborted));
    assert!(
        e.to_string().ends_with(
            ": recv from stage 0 on channel 7 failed: stopped because another device failed: device 0 failed"
        ),
        "{e}"
    );
}

#[test]
fn arguments_are_bound_and_checked() {
    let m = two_stage_module();
    let f0 = &m.functions[0];
    let e = bind_args(&m, f0, &HashMap::new()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "function @stage0: missing input `x` (argument 0)"
    );
    let mut no_weights = m.clone();
    no_weights.weights.clear();
    let mut inputs = HashMap::new();
    inputs.insert("x".to_string(), Tensor::from_f32(vec![4, 3], vec![0.0; 12]));
    let e = bind_args(&no_weights, f0, &inputs).unwrap_err();
    assert_eq!(
        e.to_string(),
        "function @stage0: the module has no weight `w` for param argument 1"
    );

    let opts = InterpOptions::default();
    // The `?` batch dimension accepts a batch of 4; a wrong feature size or dtype does not.
    let args = bind_args(&m, f0, &inputs).unwrap();
    assert_eq!(
        run_function(f0, args, &opts, Some(&mut Mailbox::default())).unwrap()[0].shape,
        [4, 2]
    );
    let wrong = vec![
        Tensor::from_f32(vec![4, 2], vec![0.0; 8]),
        m.weights["w"].clone(),
    ];
    let e = run_function(f0, wrong, &opts, None).unwrap_err();
    assert_eq!(e.to_string(), "function @stage0: argument 0 %x must be tensor<?x3xf32>, got a tensor of type tensor<4x2xf32>");
    let wrong = vec![f64t(&[1, 3], &[0.0; 3]), m.weights["w"].clone()];
    assert!(matches!(
        run_function(f0, wrong, &opts, None),
        Err(InterpError::ArgType { index: 0, .. })
    ));
    let e = run_function(f0, vec![], &opts, None).unwrap_err();
    assert_eq!(
        e.to_string(),
        "function @stage0: expected 2 arguments, got 0"
    );
}

#[test]
fn op_errors_name_the_op_value_and_location() {
    let mut f = Function::new("embed");
    let table = f.add_arg(
        "table",
        f32_ty(vec![Dim::Known(64), Dim::Known(4)]),
        ArgKind::Param,
    );
    let ids = f.add_arg("ids", TensorType::of(DType::I64, &[3]), ArgKind::Input);
    let rows = f.push(
        NewOp::new(
            OpKind::Gather,
            vec![table, ids],
            vec![f32_ty(vec![Dim::Known(3), Dim::Known(4)])],
        )
        .names(vec!["5".into()])
        .loc("embed"),
    );
    f.set_results(vec![rows]);
    let t = Tensor::from_f32(vec![64, 4], (0..256).map(|i| i as f32).collect());
    let good = run_function(
        &f,
        vec![t.clone(), i64t(&[3], &[0, -1, 63])],
        &InterpOptions::default(),
        None,
    )
    .unwrap();
    assert_close(
        &good[0],
        &[
            0.0, 1.0, 2.0, 3.0, 252.0, 253.0, 254.0, 255.0, 252.0, 253.0, 254.0, 255.0,
        ],
        0.0,
    );
    let e = run_function(
        &f,
        vec![t, i64t(&[3], &[1, 70, 2])],
        &InterpOptions::default(),
        None,
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "\"pp.gather\" %5 (loc \"embed\"): index 70 out of range for axis 0 of size 64"
    );
    assert!(matches!(
        e,
        InterpError::Op {
            kind: OpKind::Gather,
            ..
        }
    ));
}

#[test]
fn values_used_twice_and_returned_twice() {
    let t = TensorType::of(DType::F64, &[3]);
    let mut f = Function::new("f");
    let x = f.add_arg("x", t.clone(), ArgKind::Input);
    let _unused = f.add_arg("unused", t.clone(), ArgKind::Input);
    let d = f.push(NewOp::new(OpKind::Add, vec![x, x], vec![t.clone()]));
    let e = f.push(NewOp::new(OpKind::Mul, vec![d, x], vec![t.clone()]));
    // A dead op still runs (and its result is dropped at once).
    let _dead = f.push(NewOp::new(OpKind::Neg, vec![e], vec![t.clone()]));
    let c = f.push(
        NewOp::new(OpKind::Constant, vec![], vec![t.clone()]).attrs(attrs(&[(
            "value",
            Attr::Tensor(f64t(&[3], &[1.0, 1.0, 1.0])),
        )])),
    );
    let g = f.push(NewOp::new(OpKind::Sub, vec![e, c], vec![t]));
    f.set_results(vec![g, x, g, d]);
    let out = run_function(
        &f,
        vec![f64t(&[3], &[1.0, 2.0, 3.0]), f64t(&[3], &[0.0; 3])],
        &InterpOptions::default(),
        None,
    )
    .unwrap();
    assert_close(&out[0], &[1.0, 7.0, 17.0], 0.0);
    assert_close(&out[1], &[1.0, 2.0, 3.0], 0.0);
    assert_eq!(out[0], out[2]);
    assert_close(&out[3], &[2.0, 4.0, 6.0], 0.0);
}

#[test]
fn precision_mode_flows_through_run_function() {
    let t = TensorType::of(DType::F32, &[1]);
    let mut f = Function::new("f");
    let x = f.add_arg("x", t.clone(), ArgKind::Input);
    let third = f.push(
        NewOp::new(OpKind::Constant, vec![], vec![t.clone()])
            .attrs(attrs(&[("value", Attr::Tensor(f64t(&[1], &[1.0 / 3.0])))])),
    );
    let y = f.push(NewOp::new(OpKind::Mul, vec![x, third], vec![t]));
    f.set_results(vec![y]);
    let x = Tensor::from_f32(vec![1], vec![3.0]);
    let typed = run_function(&f, vec![x.clone()], &InterpOptions::default(), None).unwrap();
    assert_eq!(
        vals(&typed[0]),
        &[(3.0 * ((1.0f64 / 3.0) as f32 as f64)) as f32 as f64]
    );
    let wide = run_function(
        &f,
        vec![x],
        &InterpOptions {
            precision: Precision::F64,
        },
        None,
    )
    .unwrap();
    assert_eq!(vals(&wide[0]), &[3.0 * (1.0 / 3.0)]);
}

#[test]
fn results_larger_than_memory_are_refused() {
    // 8e12 elements (64 TB as f64): refused before anything is allocated.
    let x = f64t(&[1, 1], &[1.0]);
    let a = attrs(&[("shape", ints(&[2_000_000, 4_000_000]))]);
    let e = eval_err(
        OpKind::Expand,
        &a,
        &[&x],
        DType::F64,
        &[2_000_000, 4_000_000],
    );
    assert!(
        e.contains(
            "its result tensor<2000000x4000000xf64> needs 64.0 TB (64000000000000 bytes) but only"
        ),
        "{e}"
    );
}

#[test]
fn temporaries_measured_by_the_interpreter_match_the_static_count() {
    // a, b and c are live together while c is made (3 × 24 bytes); d is a result.
    let src = r#"
module {
  func @f(%x: tensor<2x3xf32>) -> (tensor<2x3xf32>, tensor<2x3xf32>) {
    %a = "pp.relu"(%x) : (tensor<2x3xf32>) -> tensor<2x3xf32>
    %b = "pp.exp"(%a) : (tensor<2x3xf32>) -> tensor<2x3xf32>
    %c = "pp.add"(%a, %b) : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
    %d = "pp.mul"(%c, %c) : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
    %e = "pp.neg"(%d) : (tensor<2x3xf32>) -> tensor<2x3xf32>
    %big = "pp.tile"(%e) {repeats = [4, 4]} : (tensor<2x3xf32>) -> tensor<8x12xf32>
    %s = "pp.reduce_sum"(%big) {axes = [0], keepdims = 1} : (tensor<8x12xf32>) -> tensor<1x12xf32>
    %t = "pp.slice"(%s) {starts = [0, 0], ends = [1, 6], axes = [0, 1]} : (tensor<1x12xf32>) -> tensor<1x6xf32>
    %u = "pp.reshape"(%t) {shape = [2, 3]} : (tensor<1x6xf32>) -> tensor<2x3xf32>
    return %d, %u : tensor<2x3xf32>, tensor<2x3xf32>
  }
}
"#;
    let m = crate::text::parse_module(src).unwrap();
    let f = m.function("f").unwrap();
    let x = Tensor::from_f32(vec![2, 3], vec![1.0, -2.0, 3.0, -4.0, 5.0, 0.5]);
    let (out, stats) =
        run_function_stats(f, vec![Cow::Owned(x)], &InterpOptions::default(), None).unwrap();
    assert_eq!(out.len(), 2);
    // e (24) with big (384) while big is made, then big with s (48): the larger.
    assert_eq!(stats.peak_temporary_bytes, 384 + 48);
    assert_eq!(crate::memory::peak_temporary_bytes(f), 384 + 48);
}
