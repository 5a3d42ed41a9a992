//! Tests of `lower::elementwise` (see common.rs for the harness): every elementwise op on
//! every dtype the interpreter accepts for it, attributes and edge values (NaN, ±inf, -0,
//! integer extremes), numpy broadcasting, training-mode dropout's mask bit for bit, and
//! the error paths.

use ppcc_codegen::lower_function;
use ppir::interp::{run_function, InterpOptions};
use ppir::{DType, Module, Tensor, TensorData};

use crate::common::*;

/// Whether two tensors are identical bit for bit (NaN included).
fn same_bits(a: &Tensor, b: &Tensor) -> bool {
    a.dtype == b.dtype
        && a.shape == b.shape
        && match (&a.data, &b.data) {
            (TensorData::Float(x), TensorData::Float(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits())
            }
            (TensorData::Int(x), TensorData::Int(y)) => x == y,
            _ => false,
        }
}

/// `common::check_with` on the module's first function, except that the inputs are
/// checked unchanged bit for bit: the shared harness compares them with `==`, which an
/// input holding NaN never satisfies.
fn check_module(m: &Module, inputs: Vec<Tensor>) {
    let f = &m.functions[0];
    let expected = run_function(f, inputs.clone(), &InterpOptions::default(), None)
        .unwrap_or_else(|e| panic!("interpreter: {e}"));
    let (nm, dir) = compile(m);
    let kept = inputs.clone();
    let args: Vec<&Tensor> = inputs.iter().collect();
    let got = nm
        .call(&f.name, &args, None)
        .unwrap_or_else(|e| panic!("native call: {e}"));
    assert_eq!(got.len(), expected.len());
    for (i, (g, w)) in got.iter().zip(&expected).enumerate() {
        assert_close(g, w, 1e-5, &format!("@{} result {i}", f.name));
    }
    for (a, b) in inputs.iter().zip(&kept) {
        assert!(same_bits(a, b), "an input was written");
    }
    cleanup(dir);
}

/// Parse and verify `src`, check its first function on `inputs` (or random ones).
fn check_src(src: &str, inputs: Option<Vec<Tensor>>) {
    let m = parse(src);
    let inputs = inputs.unwrap_or_else(|| random_inputs(&m.functions[0], 7));
    check_module(&m, inputs);
}

/// As [`check_src`] without the verifier, for what the interpreter runs but the verifier
/// refuses (dropout's mask result, ordering bools, inference dropout of integers).
fn check_unverified(src: &str, inputs: Option<Vec<Tensor>>) {
    let m = parse_stage(src);
    let inputs = inputs.unwrap_or_else(|| random_inputs(&m.functions[0], 7));
    check_module(&m, inputs);
}

/// One function applying each `(op, attrs)` to `%x` (type `ty`), returning every result
/// (result dtype `rty`, or `ty`'s when `None`).
fn unary_module(ty: &str, ops: &[(&str, &str, Option<&str>)]) -> String {
    let mut body = String::new();
    let mut rets = Vec::new();
    let mut rtys = Vec::new();
    for (i, (op, attrs, rty)) in ops.iter().enumerate() {
        let rty = rty.map_or(ty.to_string(), |r| r.to_string());
        let attrs = if attrs.is_empty() {
            String::new()
        } else {
            format!(" {{{attrs}}}")
        };
        body.push_str(&format!(
            "    %r{i} = \"pp.{op}\"(%x){attrs} : ({ty}) -> {rty}\n"
        ));
        rets.push(format!("%r{i}"));
        rtys.push(rty);
    }
    format!(
        "module {{\n  func @f(%x: {ty}) -> ({}) {{\n{body}    return {} : {}\n  }}\n}}\n",
        rtys.join(", "),
        rets.join(", "),
        rtys.join(", ")
    )
}

/// One function applying each binary `op` to `%a`, `%b`.
fn binary_module(aty: &str, bty: &str, rty: &str, ops: &[&str]) -> String {
    let mut body = String::new();
    let mut rets = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        body.push_str(&format!(
            "    %r{i} = \"pp.{op}\"(%a, %b) : ({aty}, {bty}) -> {rty}\n"
        ));
        rets.push(format!("%r{i}"));
    }
    let rtys = vec![rty; ops.len()].join(", ");
    format!(
        "module {{\n  func @f(%a: {aty}, %b: {bty}) -> ({rtys}) {{\n{body}    return {} : {rtys}\n  }}\n}}\n",
        rets.join(", ")
    )
}

/// Floats in [lo, hi) with special values (NaN, ±inf, ±0, tiny, huge) in the first slots.
fn floats_with_specials(d: DType, shape: &[usize], seed: u64, lo: f64, hi: f64) -> Tensor {
    let t = uniform(d, shape, seed, lo, hi);
    let mut v = t.as_f64().unwrap().to_vec();
    let specials = [
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        0.0,
        -0.0,
        1e-6,
        -1e-6,
        30.0,
        -30.0,
        1.0,
        -1.0,
        0.5,
        -0.5,
    ];
    for (i, s) in specials.iter().enumerate() {
        if i < v.len() {
            v[i] = *s;
        }
    }
    Tensor::from_f64(d, shape.to_vec(), v)
}

const FLOAT_UNARY: &[(&str, &str, Option<&str>)] = &[
    ("relu", "", None),
    ("sigmoid", "", None),
    ("tanh", "", None),
    ("gelu", "", None),
    ("gelu", "approximate = \"tanh\"", None),
    ("erf", "", None),
    ("exp", "", None),
    ("log", "", None),
    ("sqrt", "", None),
    ("abs", "", None),
    ("neg", "", None),
    ("sign", "", None),
    ("reciprocal", "", None),
    ("softplus", "", None),
    ("softsign", "", None),
    ("floor", "", None),
    ("ceil", "", None),
    ("sin", "", None),
    ("cos", "", None),
    ("identity", "", None),
    ("leaky_relu", "", None),
    ("leaky_relu", "alpha = 0.3", None),
    ("elu", "", None),
    ("elu", "alpha = 0.7", None),
    ("selu", "", None),
    ("selu", "alpha = 1.5, gamma = 2.0", None),
    ("hard_sigmoid", "", None),
    ("hard_sigmoid", "alpha = 0.3, beta = 0.4", None),
    ("shrink", "", None),
    ("shrink", "bias = 0.1, lambd = 0.3", None),
    ("clip", "", None),
    ("clip", "min = -0.5", None),
    ("clip", "max = 0.25", None),
    ("clip", "min = -1.1, max = 1.3", None),
    ("clip", "min = 1, max = -1", None),
    ("dropout", "ratio = 0.3", None),
];

fn check_float_unary(d: DType, name: &str, seed: u64) {
    let ty = format!("tensor<5x13x{name}>");
    let src = unary_module(&ty, FLOAT_UNARY);
    let x = floats_with_specials(d, &[5, 13], seed, -4.0, 4.0);
    check_src(&src, Some(vec![x]));
}

#[test]
fn float_unary_f32() {
    check_float_unary(DType::F32, "f32", 1);
}

#[test]
fn float_unary_f64() {
    check_float_unary(DType::F64, "f64", 2);
}

#[test]
fn float_unary_f16() {
    check_float_unary(DType::F16, "f16", 3);
}

#[test]
fn float_unary_bf16() {
    check_float_unary(DType::BF16, "bf16", 4);
}

#[test]
fn float_unary_wide_range() {
    // Large and tiny magnitudes: overflow of exp, expm1 and log1p precision, sigmoid tails.
    let ops: Vec<(&str, &str, Option<&str>)> = FLOAT_UNARY
        .iter()
        .copied()
        .filter(|(op, _, _)| !matches!(*op, "sin" | "cos"))
        .collect();
    for (d, name) in [(DType::F32, "f32"), (DType::F64, "f64")] {
        let src = unary_module(&format!("tensor<64x{name}>"), &ops);
        let v: Vec<f64> = (0..64)
            .map(|i| {
                let m = 10f64.powi(i % 16 - 9) * (1.0 + i as f64 / 7.0);
                if i % 2 == 0 {
                    m
                } else {
                    -m
                }
            })
            .collect();
        check_src(&src, Some(vec![Tensor::from_f64(d, vec![64], v)]));
    }
}

#[test]
fn shrink_thresholds_at_the_f32_rounding_of_lambd() {
    // 0.1 is not an f32: ±0.1f lies just outside [-0.1, 0.1] in f64, where the
    // interpreter compares.
    let src = unary_module(
        "tensor<6xf32>",
        &[
            ("shrink", "bias = 0.25, lambd = 0.1", None),
            ("shrink", "lambd = 0.5", None),
        ],
    );
    let x = Tensor::from_f64(
        DType::F32,
        vec![6],
        vec![0.1, -0.1, 0.5, -0.5, 0.099_999_99, -0.100_000_01],
    );
    check_src(&src, Some(vec![x]));
}

const INT_UNARY: &[(&str, &str, Option<&str>)] = &[
    ("relu", "", None),
    ("abs", "", None),
    ("neg", "", None),
    ("sign", "", None),
    ("identity", "", None),
    ("clip", "", None),
    ("clip", "min = -3", None),
    ("clip", "min = -2.5, max = 3.7", None),
    ("clip", "max = 1.5", None),
    ("clip", "min = 5, max = -5", None),
    ("clip", "min = -1e30, max = 1e30", None),
    ("dropout", "", None),
];

#[test]
fn int_unary() {
    for (d, name, lo, hi) in [
        (DType::I64, "i64", i64::MIN, i64::MAX),
        (DType::I32, "i32", i32::MIN as i64, i32::MAX as i64),
        (DType::I8, "i8", -128, 127),
    ] {
        let src = unary_module(&format!("tensor<4x6x{name}>"), INT_UNARY);
        let mut v: Vec<i64> = ints(d, &[24], 9, -9, 9).as_i64().unwrap().to_vec();
        v[0] = lo;
        v[1] = hi;
        v[2] = lo + 1;
        v[3] = 0;
        // Inference dropout of integers: the interpreter's identity, the verifier's error.
        check_unverified(&src, Some(vec![Tensor::from_i64(d, vec![4, 6], v)]));
    }
}

#[test]
fn int_clip_with_bounds_beyond_the_width() {
    // lo > hi with an i32 bound out of range: the interpreter wraps the bound.
    let src = unary_module(
        "tensor<5xi32>",
        &[
            ("clip", "min = 20000000000, max = 10000000000", None),
            ("clip", "min = -1e10", None),
        ],
    );
    let x = Tensor::from_i64(DType::I32, vec![5], vec![-7, 0, 7, i32::MIN as i64, 1]);
    check_src(&src, Some(vec![x]));
}

#[test]
fn bool_unary() {
    let src = unary_module(
        "tensor<3x4xi1>",
        &[
            ("not", "", None),
            ("identity", "", None),
            ("dropout", "", None),
        ],
    );
    check_unverified(&src, None);
}

const ARITH: &[&str] = &["add", "sub", "mul", "div", "max", "min", "pow"];

#[test]
fn float_binary_broadcasting() {
    for (d, name) in [
        (DType::F32, "f32"),
        (DType::F64, "f64"),
        (DType::F16, "f16"),
        (DType::BF16, "bf16"),
    ] {
        let src = binary_module(
            &format!("tensor<2x1x5x{name}>"),
            &format!("tensor<3x1x{name}>"),
            &format!("tensor<2x3x5x{name}>"),
            ARITH,
        );
        let a = floats_with_specials(d, &[2, 1, 5], 11, -3.0, 3.0);
        let b = floats_with_specials(d, &[3, 1], 12, -3.0, 3.0);
        check_src(&src, Some(vec![a, b]));
        // Positive bases for pow, same shapes.
        let src = binary_module(
            &format!("tensor<4x7x{name}>"),
            &format!("tensor<4x7x{name}>"),
            &format!("tensor<4x7x{name}>"),
            ARITH,
        );
        let a = uniform(d, &[4, 7], 13, 0.1, 4.0);
        let b = uniform(d, &[4, 7], 14, -3.0, 3.0);
        check_src(&src, Some(vec![a, b]));
    }
}

#[test]
fn prelu_broadcasts_the_slope() {
    for (slope, sshape) in [
        ("tensor<3x1x1xf32>", vec![3, 1, 1]),
        ("tensor<4xf32>", vec![4]),
    ] {
        let src = format!(
            "module {{\n  func @f(%x: tensor<2x3x5x4xf32>, %s: {slope}) -> (tensor<2x3x5x4xf32>) {{\n    %y = \"pp.prelu\"(%x, %s) : (tensor<2x3x5x4xf32>, {slope}) -> tensor<2x3x5x4xf32>\n    return %y : tensor<2x3x5x4xf32>\n  }}\n}}\n"
        );
        let x = floats_with_specials(DType::F32, &[2, 3, 5, 4], 21, -2.0, 2.0);
        let s = uniform(DType::F32, &sshape, 22, 0.0, 0.5);
        check_src(&src, Some(vec![x, s]));
    }
    let src = binary_module(
        "tensor<6xi32>",
        "tensor<1xi32>",
        "tensor<6xi32>",
        &["prelu"],
    );
    let x = Tensor::from_i64(DType::I32, vec![6], vec![-5, 3, 0, -1, i32::MIN as i64, 9]);
    let s = Tensor::from_i64(DType::I32, vec![1], vec![3]);
    check_src(&src, Some(vec![x, s]));
}

#[test]
fn int_binary() {
    for (d, name, lo, hi) in [
        (DType::I64, "i64", i64::MIN, i64::MAX),
        (DType::I32, "i32", i32::MIN as i64, i32::MAX as i64),
        (DType::I8, "i8", -128, 127),
    ] {
        let ty = format!("tensor<3x8x{name}>");
        let src = binary_module(
            &ty,
            &format!("tensor<8x{name}>"),
            &ty,
            &["add", "sub", "mul", "div", "max", "min", "prelu"],
        );
        let mut a = ints(d, &[24], 31, -50, 50).as_i64().unwrap().to_vec();
        a[0] = lo;
        a[1] = hi;
        a[8] = lo;
        a[9] = lo + 1;
        // No zero divisors (an interpreter error); -1 against MIN wraps.
        let b = vec![-1, 1, 7, -3, 2, -9, 4, 5];
        check_src(
            &src,
            Some(vec![
                Tensor::from_i64(d, vec![3, 8], a),
                Tensor::from_i64(d, vec![8], b),
            ]),
        );
    }
}

/// `pp.mod` floored (`%y0`) and truncated (`%y1`) of `%a`, `%b` (types `aty`, `bty`).
fn mod_module(aty: &str, bty: &str, rty: &str) -> String {
    format!(
        "module {{\n  func @f(%a: {aty}, %b: {bty}) -> ({rty}, {rty}) {{\n    %y0 = \"pp.mod\"(%a, %b) : ({aty}, {bty}) -> {rty}\n    %y1 = \"pp.mod\"(%a, %b) {{fmod = 1}} : ({aty}, {bty}) -> {rty}\n    return %y0, %y1 : {rty}, {rty}\n  }}\n}}\n"
    )
}

#[test]
fn mod_floored_and_truncated() {
    for (d, name) in [
        (DType::F32, "f32"),
        (DType::F64, "f64"),
        (DType::F16, "f16"),
        (DType::BF16, "bf16"),
    ] {
        let src = mod_module(
            &format!("tensor<2x1x9x{name}>"),
            &format!("tensor<3x1x{name}>"),
            &format!("tensor<2x3x9x{name}>"),
        );
        // NaN, ±inf and ±0 on both sides (zero divisors give NaN).
        let a = floats_with_specials(d, &[2, 1, 9], 41, -7.0, 7.0);
        let b = floats_with_specials(d, &[3, 1], 42, -3.0, 3.0);
        check_src(&src, Some(vec![a, b]));
    }
    for (d, name, lo) in [
        (DType::I64, "i64", i64::MIN),
        (DType::I32, "i32", i32::MIN as i64),
        (DType::I8, "i8", -128),
    ] {
        let ty = format!("tensor<3x8x{name}>");
        let src = mod_module(&ty, &format!("tensor<8x{name}>"), &ty);
        let mut a = ints(d, &[24], 43, -50, 50).as_i64().unwrap().to_vec();
        a[0] = lo;
        a[8] = lo;
        // A zero divisor gives 0; -1 against the minimum does not trap.
        let b = vec![-1, 0, 7, -3, 2, -9, 4, 5];
        check_src(
            &src,
            Some(vec![
                Tensor::from_i64(d, vec![3, 8], a),
                Tensor::from_i64(d, vec![8], b),
            ]),
        );
    }
}

#[test]
fn int_pow() {
    for (d, name) in [(DType::I64, "i64"), (DType::I32, "i32"), (DType::I8, "i8")] {
        let ty = format!("tensor<12x{name}>");
        let src = binary_module(&ty, &ty, &ty, &["pow"]);
        let a = vec![2, 3, -3, 1, -1, -1, 2, 7, -2, 5, 1, 0];
        let e = vec![10, 5, 3, -7, -3, -4, -2, 40, 63, 0, 1000000007, 3];
        check_src(
            &src,
            Some(vec![
                Tensor::from_i64(d, vec![12], a),
                Tensor::from_i64(d, vec![12], e),
            ]),
        );
    }
}

#[test]
fn pow_with_an_exponent_of_another_dtype() {
    let base_f = uniform(DType::F32, &[2, 5], 41, 0.5, 3.0);
    let cases: Vec<(&str, &str, Tensor, Tensor)> = vec![
        (
            "tensor<2x5xf32>",
            "tensor<5xi64>",
            Tensor::from_f64(
                DType::F32,
                vec![2, 5],
                vec![-2.0, -1.5, 0.0, 1.0, 2.5, -1.0, 3.0, -0.5, 2.0, -3.0],
            ),
            Tensor::from_i64(DType::I64, vec![5], vec![3, 2, -1, 16_777_217, -2]),
        ),
        (
            "tensor<2x5xf32>",
            "tensor<2x5xf64>",
            base_f.clone(),
            uniform(DType::F64, &[2, 5], 42, -2.0, 2.0),
        ),
        (
            "tensor<2x5xf16>",
            "tensor<5xi32>",
            uniform(DType::F16, &[2, 5], 43, -2.0, 2.0),
            Tensor::from_i64(DType::I32, vec![5], vec![0, 1, 2, 3, -2]),
        ),
        (
            "tensor<2x5xi32>",
            "tensor<2x5xf32>",
            Tensor::from_i64(
                DType::I32,
                vec![2, 5],
                vec![2, 3, 10, -4, 7, 0, 1, 100, 5, 9],
            ),
            Tensor::from_f64(
                DType::F32,
                vec![2, 5],
                vec![0.5, 2.0, 12.0, 3.0, -1.0, 2.0, 1e9, 6.0, f64::NAN, 1.5],
            ),
        ),
        (
            "tensor<2x5xi64>",
            "tensor<2x5xi8>",
            Tensor::from_i64(
                DType::I64,
                vec![2, 5],
                vec![2, 3, 10, -4, 7, 1, -1, 100, 5, 9],
            ),
            Tensor::from_i64(
                DType::I8,
                vec![2, 5],
                vec![62, 3, 18, 5, 2, -5, -5, 9, 27, 0],
            ),
        ),
    ];
    for (aty, bty, a, b) in cases {
        let src = binary_module(aty, bty, aty, &["pow"]);
        check_src(&src, Some(vec![a, b]));
    }
}

const CMP: &[&str] = &["equal", "less", "greater", "less_equal", "greater_equal"];

#[test]
fn comparisons() {
    for (d, name) in [
        (DType::F32, "f32"),
        (DType::F64, "f64"),
        (DType::F16, "f16"),
        (DType::BF16, "bf16"),
        (DType::I64, "i64"),
        (DType::I32, "i32"),
        (DType::I8, "i8"),
        (DType::Bool, "i1"),
    ] {
        // The verifier orders bools only for equality (parse_stage skips it); the
        // interpreter orders them as 0 < 1.
        let src = binary_module(
            &format!("tensor<3x1x{name}>"),
            &format!("tensor<4x{name}>"),
            "tensor<3x4xi1>",
            CMP,
        );
        let (a, b) = if d.is_float() {
            // Values on a coarse grid so that equal elements occur; NaN compares false.
            let g = |seed, n| {
                let t = ints(DType::I64, &[n], seed, -2, 3);
                let mut v: Vec<f64> = t.as_i64().unwrap().iter().map(|&x| x as f64).collect();
                v[0] = f64::NAN;
                v
            };
            (
                Tensor::from_f64(d, vec![3, 1], g(51, 3)),
                Tensor::from_f64(d, vec![4], g(52, 4)),
            )
        } else if d == DType::Bool {
            (
                Tensor::from_i64(d, vec![3, 1], vec![0, 1, 1]),
                Tensor::from_i64(d, vec![4], vec![1, 0, 1, 0]),
            )
        } else {
            (ints(d, &[3, 1], 53, -2, 3), ints(d, &[4], 54, -2, 3))
        };
        check_unverified(&src, Some(vec![a, b]));
    }
}

#[test]
fn logical_and_where() {
    let src = r#"
module {
  func @f(%p: tensor<2x1x4xi1>, %q: tensor<3x1xi1>, %x: tensor<3x4xf32>, %y: tensor<4xf32>, %i: tensor<1x4xi64>, %j: tensor<2x1x1xi64>, %h: tensor<4xf16>) -> (tensor<2x3x4xi1>, tensor<2x3x4xi1>, tensor<2x1x4xi1>, tensor<2x3x4xf32>, tensor<2x3x4xi64>, tensor<2x3x4xi1>, tensor<2x1x4xf16>) {
    %a = "pp.and"(%p, %q) : (tensor<2x1x4xi1>, tensor<3x1xi1>) -> tensor<2x3x4xi1>
    %o = "pp.or"(%p, %q) : (tensor<2x1x4xi1>, tensor<3x1xi1>) -> tensor<2x3x4xi1>
    %n = "pp.not"(%p) : (tensor<2x1x4xi1>) -> tensor<2x1x4xi1>
    %w = "pp.where"(%q, %x, %y) : (tensor<3x1xi1>, tensor<3x4xf32>, tensor<4xf32>) -> tensor<3x4xf32>
    %w2 = "pp.where"(%p, %w, %y) : (tensor<2x1x4xi1>, tensor<3x4xf32>, tensor<4xf32>) -> tensor<2x3x4xf32>
    %wi = "pp.where"(%a, %i, %j) : (tensor<2x3x4xi1>, tensor<1x4xi64>, tensor<2x1x1xi64>) -> tensor<2x3x4xi64>
    %wb = "pp.where"(%q, %a, %p) : (tensor<3x1xi1>, tensor<2x3x4xi1>, tensor<2x1x4xi1>) -> tensor<2x3x4xi1>
    %wh = "pp.where"(%p, %h, %h) : (tensor<2x1x4xi1>, tensor<4xf16>, tensor<4xf16>) -> tensor<2x1x4xf16>
    return %a, %o, %n, %w2, %wi, %wb, %wh : tensor<2x3x4xi1>, tensor<2x3x4xi1>, tensor<2x1x4xi1>, tensor<2x3x4xf32>, tensor<2x3x4xi64>, tensor<2x3x4xi1>, tensor<2x1x4xf16>
  }
}
"#;
    check_src(src, None);
    check_src(src, Some(random_inputs(&parse(src).functions[0], 3)));
}

const DTYPES: &[(DType, &str)] = &[
    (DType::F32, "f32"),
    (DType::F64, "f64"),
    (DType::F16, "f16"),
    (DType::BF16, "bf16"),
    (DType::I64, "i64"),
    (DType::I32, "i32"),
    (DType::I8, "i8"),
    (DType::Bool, "i1"),
];

/// Values that exercise every conversion: rounding ties, saturation, wrapping, NaN.
fn cast_source(d: DType) -> Tensor {
    let n = 48;
    if d.is_float() {
        let mut v = vec![
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            0.0,
            -0.0,
            2.5,
            -2.5,
            0.7,
            -0.7,
            3e9,
            -3e9,
            1e20,
            -1e20,
            65504.0,
            65520.0,
            1.0 / 3.0,
            300.0,
            -129.9,
            1e-40,
            3.4e38,
            9.3e18,
            -9.3e18,
            1.0009765625,
            1.00048828125,
        ];
        // Random values with many mantissa bits (rounding to narrower floats).
        let r = uniform(DType::F64, &[n - v.len()], 61, -1000.0, 1000.0);
        v.extend(r.as_f64().unwrap());
        Tensor::from_f64(d, vec![n], v)
    } else if d == DType::Bool {
        ints(DType::Bool, &[n], 62, 0, 2)
    } else {
        let mut v: Vec<i64> = vec![
            0,
            1,
            -1,
            127,
            128,
            -129,
            255,
            256,
            65535,
            2_147_483_647,
            2_147_483_648,
            -2_147_483_649,
            i64::MAX,
            i64::MIN,
            9_007_199_254_740_993,
            16_777_217,
            -16_777_217,
            4097,
            2049,
            33_554_435,
        ];
        let r = ints(DType::I64, &[n - v.len()], 63, -100_000, 100_000);
        v.extend(r.as_i64().unwrap());
        let v = v
            .into_iter()
            .map(|x| match d {
                DType::I32 => x as i32 as i64,
                DType::I8 => x as i8 as i64,
                _ => x,
            })
            .collect();
        Tensor::from_i64(d, vec![n], v)
    }
}

#[test]
fn cast_every_pair_of_dtypes() {
    for &(from, fname) in DTYPES {
        let ops: Vec<(String, Option<String>)> = DTYPES
            .iter()
            .map(|&(_, tname)| (format!("to = {tname}"), Some(format!("tensor<48x{tname}>"))))
            .collect();
        let ops_ref: Vec<(&str, &str, Option<&str>)> = ops
            .iter()
            .map(|(a, r)| ("cast", a.as_str(), r.as_deref()))
            .collect();
        let src = unary_module(&format!("tensor<48x{fname}>"), &ops_ref);
        check_src(&src, Some(vec![cast_source(from)]));
    }
}

#[test]
fn f64_to_narrow_floats_rounds_like_the_interpreter() {
    // Values just above, at and below the halfway points between neighbouring f16, bf16
    // and f32 values, the excess in the low or the high word of the f64 mantissa. The
    // interpreter's `half` conversions are not single roundings (f16 goes through f32 on
    // F16C machines, bf16 drops the low 32 mantissa bits first): codegen must agree.
    let mut v = Vec::new();
    for k in 0..40u64 {
        let base = 1.0 + k as f64 / 64.0;
        for ulp in [2f64.powi(-10), 2f64.powi(-7), 2f64.powi(-23)] {
            let half = base + ulp / 2.0;
            v.push(half + 2f64.powi(-40));
            v.push(half - 2f64.powi(-40));
            v.push(half);
            v.push(-(half + 2f64.powi(-45)));
            v.push(half + 2f64.powi(-19));
            v.push(half - 2f64.powi(-30));
        }
    }
    let n = v.len();
    let src = unary_module(
        &format!("tensor<{n}xf64>"),
        &[
            ("cast", "to = f16", Some(&format!("tensor<{n}xf16>"))),
            ("cast", "to = bf16", Some(&format!("tensor<{n}xbf16>"))),
            ("cast", "to = f32", Some(&format!("tensor<{n}xf32>"))),
        ],
    );
    check_src(&src, Some(vec![Tensor::from_f64(DType::F64, vec![n], v)]));
}

fn dropout_module(ty: &str, attrs: &str, mask: bool) -> String {
    let mty = ty
        .rsplit_once('x')
        .map_or("tensor<i1>".to_string(), |(s, _)| format!("{s}xi1>"));
    let (rty, rets, res) = if mask {
        (
            format!("{ty}, {mty}"),
            "%y, %m".to_string(),
            format!("%y, %m = \"pp.dropout\"(%x, %k) {{{attrs}}} : ({ty}, tensor<2xi64>) -> ({ty}, {mty})"),
        )
    } else {
        (
            ty.to_string(),
            "%y".to_string(),
            format!("%y = \"pp.dropout\"(%x, %k) {{{attrs}}} : ({ty}, tensor<2xi64>) -> {ty}"),
        )
    };
    format!(
        "module {{\n  func @f(%x: {ty}, %k: tensor<2xi64>) -> ({rty}) {{\n    {res}\n    return {rets} : {rty}\n  }}\n}}\n"
    )
}

#[test]
fn dropout_training_reproduces_the_mask() {
    let keys: [[i64; 2]; 4] = [[0, 0], [3, 1], [-5, 7], [i64::MAX, i64::MIN]];
    for (i, key) in keys.iter().enumerate() {
        for (ratio, seed) in [(0.5, 0i64), (0.1, 7), (0.9, -1), (0.0, 3)] {
            let attrs = format!("ratio = {ratio:?}, seed = {seed}, training = 1");
            let src = dropout_module("tensor<4x5x6xf32>", &attrs, false);
            let x = uniform(DType::F32, &[4, 5, 6], i as u64, -2.0, 2.0);
            let k = Tensor::from_i64(DType::I64, vec![2], key.to_vec());
            check_src(&src, Some(vec![x, k]));
        }
    }
}

#[test]
fn dropout_training_mask_result_and_dtypes() {
    for (ty, d, shape) in [
        ("tensor<3x7xf64>", DType::F64, vec![3, 7]),
        ("tensor<33xf16>", DType::F16, vec![33]),
        ("tensor<2x2x9xbf16>", DType::BF16, vec![2, 2, 9]),
        ("tensor<f32>", DType::F32, vec![]),
    ] {
        for mask in [false, true] {
            let src = dropout_module(ty, "ratio = 0.25, seed = 11, training = 1", mask);
            let x = uniform(d, &shape, 5, -2.0, 2.0);
            let k = Tensor::from_i64(DType::I64, vec![2], vec![17, 2]);
            // The verifier wants one result; the interpreter (and codegen) allow the mask.
            check_unverified(&src, Some(vec![x, k]));
        }
    }
    // Inference with a mask: identity and all-true.
    let src = dropout_module("tensor<3x4xf32>", "ratio = 0.25", true);
    let x = input(&[3, 4], 1);
    let k = Tensor::from_i64(DType::I64, vec![2], vec![1, 2]);
    check_unverified(&src, Some(vec![x, k]));
}

#[test]
fn scalars_and_empty_tensors() {
    let src = r#"
module {
  func @f(%a: tensor<f32>, %b: tensor<3xf32>, %e: tensor<0x3xf32>, %i: tensor<i32>) -> (tensor<3xf32>, tensor<f32>, tensor<0x3xf32>, tensor<i32>, tensor<i1>) {
    %s = "pp.add"(%a, %b) : (tensor<f32>, tensor<3xf32>) -> tensor<3xf32>
    %t = "pp.tanh"(%a) : (tensor<f32>) -> tensor<f32>
    %m = "pp.mul"(%e, %b) : (tensor<0x3xf32>, tensor<3xf32>) -> tensor<0x3xf32>
    %n = "pp.neg"(%i) : (tensor<i32>) -> tensor<i32>
    %c = "pp.less"(%a, %t) : (tensor<f32>, tensor<f32>) -> tensor<i1>
    return %s, %t, %m, %n, %c : tensor<3xf32>, tensor<f32>, tensor<0x3xf32>, tensor<i32>, tensor<i1>
  }
}
"#;
    check_src(src, None);
}

#[test]
fn ops_the_interpreter_rejects_are_errors_not_panics() {
    // The verifier admits erf and shrink on integers; the interpreter does not define them.
    for (op, ty) in [
        ("erf", "tensor<4xi32>"),
        ("shrink", "tensor<4xi64>"),
        ("sigmoid", "tensor<4xi32>"),
        ("relu", "tensor<4xi1>"),
    ] {
        let src = format!(
            "module {{\n  func @f(%x: {ty}) -> ({ty}) {{\n    %y = \"pp.{op}\"(%x) : ({ty}) -> {ty}\n    return %y : {ty}\n  }}\n}}\n"
        );
        let m = parse_stage(&src);
        let err = lower_function(&m.functions[0]).expect_err(op);
        assert!(err.to_string().contains(&format!("pp.{op}")), "{err}");
    }
    // Training dropout without a key, a bad ratio, and a mismatched result type.
    for src in [
        "module {\n  func @f(%x: tensor<4xf32>) -> (tensor<4xf32>) {\n    %y = \"pp.dropout\"(%x) {training = 1} : (tensor<4xf32>) -> tensor<4xf32>\n    return %y : tensor<4xf32>\n  }\n}\n",
        "module {\n  func @f(%x: tensor<4xf32>, %k: tensor<2xi64>) -> (tensor<4xf32>) {\n    %y = \"pp.dropout\"(%x, %k) {training = 1, ratio = 1.0} : (tensor<4xf32>, tensor<2xi64>) -> tensor<4xf32>\n    return %y : tensor<4xf32>\n  }\n}\n",
        "module {\n  func @f(%x: tensor<4xf32>) -> (tensor<4xf64>) {\n    %y = \"pp.add\"(%x, %x) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf64>\n    return %y : tensor<4xf64>\n  }\n}\n",
        "module {\n  func @f(%x: tensor<4xf32>) -> (tensor<2x4xf32>) {\n    %y = \"pp.exp\"(%x) : (tensor<4xf32>) -> tensor<2x4xf32>\n    return %y : tensor<2x4xf32>\n  }\n}\n",
        "module {\n  func @f(%x: tensor<4xf32>, %z: tensor<3xf32>) -> (tensor<4xf32>) {\n    %y = \"pp.add\"(%x, %z) : (tensor<4xf32>, tensor<3xf32>) -> tensor<4xf32>\n    return %y : tensor<4xf32>\n  }\n}\n",
    ] {
        let m = parse_stage(src);
        assert!(lower_function(&m.functions[0]).is_err(), "{src}");
    }
}

// ---------------------------------------------------------------------------------------
// Fusion of elementwise chains (lower::fuse).

/// The lowered MLIR of the module's first function.
fn lowered(src: &str) -> String {
    let m = parse_stage(src);
    lower_function(&m.functions[0])
        .unwrap_or_else(|e| panic!("lower: {e}"))
        .0
}

fn count(hay: &str, needle: &str) -> usize {
    hay.matches(needle).count()
}

const CHAIN: &str = r#"
module {
  func @f(%x: tensor<4x8xf32>, %w: tensor<8xf32>, %b: tensor<4x1xf32>, %c: tensor<f32>) -> (tensor<4x8xf32>) {
    %m = "pp.mul"(%x, %w) : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
    %a = "pp.add"(%m, %b) : (tensor<4x8xf32>, tensor<4x1xf32>) -> tensor<4x8xf32>
    %t = "pp.tanh"(%a) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %u = "pp.mul"(%t, %x) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %s = "pp.sub"(%u, %c) : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
    return %s : tensor<4x8xf32>
  }
}
"#;

#[test]
fn a_chain_becomes_one_generic() {
    let mlir = lowered(CHAIN);
    assert_eq!(count(&mlir, "linalg.generic"), 1, "{mlir}");
    // tanh is inline arithmetic for f32 (ending in one copysign), not a libm call.
    assert_eq!(count(&mlir, "math.tanh"), 0, "{mlir}");
    assert_eq!(count(&mlir, "math.copysign"), 1, "{mlir}");
    // Four distinct inputs (x read once although used twice) and their broadcast maps.
    for needle in [
        "ins(%p0, %p1, %p2, %p3 :",
        "affine_map<(d0, d1) -> (d1)>",
        "affine_map<(d0, d1) -> (d0, 0)>",
        "affine_map<(d0, d1) -> ()>",
    ] {
        assert!(mlir.contains(needle), "missing `{needle}` in\n{mlir}");
    }
    check_src(CHAIN, None);
}

#[test]
fn a_value_with_two_uses_is_computed_once() {
    // %t feeds two ops: it is materialised (add+tanh fused), and exp/neg fuse into the
    // final add; %q is used twice by one op (mul(q, q)), so it stays a tensor too.
    let src = r#"
module {
  func @f(%x: tensor<3x5xf32>, %b: tensor<5xf32>) -> (tensor<3x5xf32>, tensor<3x5xf32>) {
    %a = "pp.add"(%x, %b) : (tensor<3x5xf32>, tensor<5xf32>) -> tensor<3x5xf32>
    %t = "pp.tanh"(%a) : (tensor<3x5xf32>) -> tensor<3x5xf32>
    %p = "pp.exp"(%t) : (tensor<3x5xf32>) -> tensor<3x5xf32>
    %n = "pp.neg"(%t) : (tensor<3x5xf32>) -> tensor<3x5xf32>
    %r = "pp.add"(%p, %n) : (tensor<3x5xf32>, tensor<3x5xf32>) -> tensor<3x5xf32>
    %q = "pp.sigmoid"(%x) : (tensor<3x5xf32>) -> tensor<3x5xf32>
    %qq = "pp.mul"(%q, %q) : (tensor<3x5xf32>, tensor<3x5xf32>) -> tensor<3x5xf32>
    return %r, %qq : tensor<3x5xf32>, tensor<3x5xf32>
  }
}
"#;
    let mlir = lowered(src);
    assert_eq!(count(&mlir, "linalg.generic"), 4, "{mlir}");
    assert_eq!(count(&mlir, "math.copysign"), 1, "{mlir}");
    check_src(src, None);
}

#[test]
fn results_and_broadcast_producers_are_not_inlined() {
    // %e is returned; %s (shape 5) feeds a 3x5 op: inlining it would compute it 3 times.
    let src = r#"
module {
  func @f(%x: tensor<3x5xf32>, %v: tensor<5xf32>) -> (tensor<3x5xf32>, tensor<3x5xf32>) {
    %e = "pp.exp"(%x) : (tensor<3x5xf32>) -> tensor<3x5xf32>
    %n = "pp.neg"(%e) : (tensor<3x5xf32>) -> tensor<3x5xf32>
    %s = "pp.sin"(%v) : (tensor<5xf32>) -> tensor<5xf32>
    %y = "pp.add"(%n, %s) : (tensor<3x5xf32>, tensor<5xf32>) -> tensor<3x5xf32>
    return %e, %y : tensor<3x5xf32>, tensor<3x5xf32>
  }
}
"#;
    let mlir = lowered(src);
    // exp, sin, and neg+add.
    assert_eq!(count(&mlir, "linalg.generic"), 3, "{mlir}");
    check_src(src, None);
}

#[test]
fn broadcasting_inputs_inside_a_fused_tree() {
    let src = r#"
module {
  func @f(%u: tensor<3x1xf32>, %v: tensor<1x5xf32>, %w: tensor<5xf32>, %z: tensor<2x3x5xf32>) -> (tensor<3x5xf32>, tensor<2x3x5xf32>) {
    %a = "pp.sub"(%u, %v) : (tensor<3x1xf32>, tensor<1x5xf32>) -> tensor<3x5xf32>
    %b = "pp.mul"(%a, %w) : (tensor<3x5xf32>, tensor<5xf32>) -> tensor<3x5xf32>
    %c = "pp.max"(%b, %u) : (tensor<3x5xf32>, tensor<3x1xf32>) -> tensor<3x5xf32>
    %g = "pp.gelu"(%z) : (tensor<2x3x5xf32>) -> tensor<2x3x5xf32>
    %h = "pp.prelu"(%g, %w) : (tensor<2x3x5xf32>, tensor<5xf32>) -> tensor<2x3x5xf32>
    %hc = "pp.less"(%z, %w) : (tensor<2x3x5xf32>, tensor<5xf32>) -> tensor<2x3x5xi1>
    %k = "pp.where"(%hc, %h, %w) : (tensor<2x3x5xi1>, tensor<2x3x5xf32>, tensor<5xf32>) -> tensor<2x3x5xf32>
    return %c, %k : tensor<3x5xf32>, tensor<2x3x5xf32>
  }
}
"#;
    let mlir = lowered(src);
    assert_eq!(count(&mlir, "linalg.generic"), 2, "{mlir}");
    for needle in [
        "affine_map<(d0, d1) -> (d0, 0)>",
        "affine_map<(d0, d1) -> (0, d1)>",
        "affine_map<(d0, d1) -> (d1)>",
        "affine_map<(d0, d1, d2) -> (d2)>",
    ] {
        assert!(mlir.contains(needle), "missing `{needle}` in\n{mlir}");
    }
    check_src(src, None);
}

#[test]
fn fused_nodes_round_to_their_own_dtype() {
    // f16 and bf16 chains must round after every op, as the interpreter does; a chain
    // through cast, compare and where mixes dtypes; integers wrap at every step.
    for (d, name) in [
        (DType::F16, "f16"),
        (DType::BF16, "bf16"),
        (DType::F32, "f32"),
    ] {
        let src = format!(
            r#"
module {{
  func @f(%x: tensor<6x7x{name}>, %y: tensor<7x{name}>, %i: tensor<6x7xi32>) -> (tensor<6x7x{name}>, tensor<6x7xi8>) {{
    %a = "pp.mul"(%x, %y) : (tensor<6x7x{name}>, tensor<7x{name}>) -> tensor<6x7x{name}>
    %b = "pp.add"(%a, %x) : (tensor<6x7x{name}>, tensor<6x7x{name}>) -> tensor<6x7x{name}>
    %c = "pp.div"(%b, %y) : (tensor<6x7x{name}>, tensor<7x{name}>) -> tensor<6x7x{name}>
    %e = "pp.elu"(%c) : (tensor<6x7x{name}>) -> tensor<6x7x{name}>
    %f = "pp.cast"(%i) {{to = {name}}} : (tensor<6x7xi32>) -> tensor<6x7x{name}>
    %g = "pp.less"(%e, %f) : (tensor<6x7x{name}>, tensor<6x7x{name}>) -> tensor<6x7xi1>
    %h = "pp.where"(%g, %e, %x) : (tensor<6x7xi1>, tensor<6x7x{name}>, tensor<6x7x{name}>) -> tensor<6x7x{name}>
    %j = "pp.mul"(%i, %i) : (tensor<6x7xi32>, tensor<6x7xi32>) -> tensor<6x7xi32>
    %k = "pp.add"(%j, %i) : (tensor<6x7xi32>, tensor<6x7xi32>) -> tensor<6x7xi32>
    %l = "pp.cast"(%k) {{to = i8}} : (tensor<6x7xi32>) -> tensor<6x7xi8>
    %n = "pp.neg"(%l) : (tensor<6x7xi8>) -> tensor<6x7xi8>
    return %h, %n : tensor<6x7x{name}>, tensor<6x7xi8>
  }}
}}
"#
        );
        let mlir = lowered(&src);
        // %e has two uses (less, where): [mul add div elu], [cast less where], [mul add cast neg].
        assert_eq!(count(&mlir, "linalg.generic"), 3, "{mlir}");
        let x = uniform(d, &[6, 7], 71, -3.0, 3.0);
        let y = uniform(d, &[7], 72, 0.5, 3.0);
        let i = ints(DType::I32, &[6, 7], 73, -70_000, 70_000);
        check_src(&src, Some(vec![x, y, i]));
    }
}

#[test]
fn training_dropout_inside_a_fused_chain() {
    let src = r#"
module {
  func @f(%x: tensor<4x9xf32>, %b: tensor<9xf32>, %k: tensor<2xi64>) -> (tensor<4x9xf32>, tensor<4x9xf32>, tensor<4x9xi1>) {
    %a = "pp.add"(%x, %b) : (tensor<4x9xf32>, tensor<9xf32>) -> tensor<4x9xf32>
    %r = "pp.relu"(%a) : (tensor<4x9xf32>) -> tensor<4x9xf32>
    %d = "pp.dropout"(%r, %k) {ratio = 0.4, seed = 5, training = 1} : (tensor<4x9xf32>, tensor<2xi64>) -> tensor<4x9xf32>
    %s = "pp.mul"(%d, %b) : (tensor<4x9xf32>, tensor<9xf32>) -> tensor<4x9xf32>
    %e = "pp.exp"(%x) : (tensor<4x9xf32>) -> tensor<4x9xf32>
    %d2, %m = "pp.dropout"(%e, %k) {ratio = 0.5, seed = 6, training = 1} : (tensor<4x9xf32>, tensor<2xi64>) -> (tensor<4x9xf32>, tensor<4x9xi1>)
    return %s, %d2, %m : tensor<4x9xf32>, tensor<4x9xf32>, tensor<4x9xi1>
  }
}
"#;
    let mlir = lowered(src);
    // add+relu+dropout+mul, and exp+dropout with its mask.
    assert_eq!(count(&mlir, "linalg.generic"), 2, "{mlir}");
    for key in [[3i64, 0], [-9, 12345]] {
        let x = input(&[4, 9], 81);
        let b = input(&[9], 82);
        let k = Tensor::from_i64(DType::I64, vec![2], key.to_vec());
        check_unverified(src, Some(vec![x, b, k]));
    }
}

#[test]
fn unfused_ops_lower_as_before() {
    // Nothing fuses here: one generic per op, identity and same-dtype cast emit nothing.
    let src = r#"
module {
  func @f(%x: tensor<3x4xf32>, %y: tensor<4xf32>) -> (tensor<3x4xf32>, tensor<4xf32>, tensor<3x4xf32>, tensor<4xf32>) {
    %e = "pp.exp"(%x) : (tensor<3x4xf32>) -> tensor<3x4xf32>
    %s = "pp.sqrt"(%y) : (tensor<4xf32>) -> tensor<4xf32>
    %a = "pp.add"(%e, %s) : (tensor<3x4xf32>, tensor<4xf32>) -> tensor<3x4xf32>
    %i = "pp.identity"(%y) : (tensor<4xf32>) -> tensor<4xf32>
    %c = "pp.cast"(%i) {to = f32} : (tensor<4xf32>) -> tensor<4xf32>
    return %e, %s, %a, %c : tensor<3x4xf32>, tensor<4xf32>, tensor<3x4xf32>, tensor<4xf32>
  }
}
"#;
    let mlir = lowered(src);
    assert_eq!(count(&mlir, "linalg.generic"), 3, "{mlir}");
    check_src(src, None);
}

#[test]
fn an_inference_mask_over_an_inlined_training_dropout_is_all_true() {
    let src = r#"
module {
  func @f(%x: tensor<5x6xf32>, %k: tensor<2xi64>) -> (tensor<5x6xf32>, tensor<5x6xi1>) {
    %d = "pp.dropout"(%x, %k) {ratio = 0.5, seed = 1, training = 1} : (tensor<5x6xf32>, tensor<2xi64>) -> tensor<5x6xf32>
    %y, %m = "pp.dropout"(%d) {ratio = 0.5} : (tensor<5x6xf32>) -> (tensor<5x6xf32>, tensor<5x6xi1>)
    return %y, %m : tensor<5x6xf32>, tensor<5x6xi1>
  }
}
"#;
    let k = Tensor::from_i64(DType::I64, vec![2], vec![4, 1]);
    check_unverified(src, Some(vec![input(&[5, 6], 91), k]));
}

/// The inline f32 exp / erf / tanh (`lower::mathfn`) against the interpreter's f64 libm
/// rounded to f32, on a dense sweep through every branch and clamp of the approximations:
/// within 4 ulp (relative 2.4e-7) where the result is a normal f32, within the smallest
/// subnormal below that, exact at ±0, ±∞ and NaN.
#[test]
fn inline_f32_exp_erf_tanh_are_within_a_few_ulp() {
    let mut v: Vec<f64> = (0..=24_000)
        .map(|i| -120.0 + 240.0 * i as f64 / 24_000.0)
        .collect();
    // Near 0 and around the erf/tanh branch points, where a slip would show most.
    v.extend((0..2000).map(|i| (i as f64 - 1000.0) * 1e-3));
    v.extend((1..40).map(|i| 10f64.powi(-i)));
    v.extend((1..40).map(|i| -(10f64.powi(-i))));
    v.extend([
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.7,
        4.0,
        9.01,
        88.72,
        88.73,
        -87.33,
        -87.34,
        -103.9,
        -104.1,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        f32::MAX as f64,
        f32::MIN_POSITIVE as f64,
    ]);
    let v: Vec<f64> = v.into_iter().map(|x| x as f32 as f64).collect();
    let n = v.len();
    let ty = format!("tensor<{n}xf32>");
    let ops = [("exp", "", None), ("erf", "", None), ("tanh", "", None)];
    let m = parse(&unary_module(&ty, &ops));
    let x = Tensor::from_f64(DType::F32, vec![n], v.clone());
    let want = run_function(
        &m.functions[0],
        vec![x.clone()],
        &InterpOptions::default(),
        None,
    )
    .expect("interpreter");
    let (nm, dir) = compile(&m);
    let got = nm.call("f", &[&x], None).expect("native call");
    for (k, (op, _, _)) in ops.iter().enumerate() {
        let (TensorData::Float(g), TensorData::Float(w)) = (&got[k].data, &want[k].data) else {
            panic!("float results");
        };
        for j in 0..n {
            let (g, w) = (g[j], w[j]);
            let ok = if w.is_nan() {
                g.is_nan()
            } else if w == 0.0 || w.is_infinite() {
                g == w && g.is_sign_negative() == w.is_sign_negative()
            } else if w.abs() < f32::MIN_POSITIVE as f64 {
                (g - w).abs() <= 1.5e-45
            } else {
                (g - w).abs() <= 4.0 * f32::EPSILON as f64 / 2.0 * w.abs()
            };
            assert!(ok, "{op}({}) = {g}, want {w}", v[j]);
        }
    }
    cleanup(dir);
}
