//! Tests of `lower::reduce` (see common.rs for the harness).

use ppcc_codegen::{lower_function, lower_functions_with, LowerOptions};
use ppir::interp::{run_function, InterpOptions};
use ppir::{DType, Tensor};

use crate::common::*;

/// [`check`] for inputs holding NaN: `check_with` compares the inputs after the call with
/// `==`, which NaN never satisfies; here they are compared with [`assert_close`].
pub(crate) fn check_nan_inputs(src: &str, inputs: Vec<Tensor>) {
    let m = parse(src);
    let f = &m.functions[0];
    let want = run_function(f, inputs.clone(), &InterpOptions::default(), None)
        .unwrap_or_else(|e| panic!("interpreter: {e}"));
    let (nm, dir) = compile(&m);
    let args: Vec<&Tensor> = inputs.iter().collect();
    let got = nm
        .call(&f.name, &args, None)
        .unwrap_or_else(|e| panic!("native call: {e}"));
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_close(g, w, 1e-5, &format!("result {i}"));
    }
    for (i, (a, b)) in args.iter().zip(&inputs).enumerate() {
        assert_close(a, b, 0.0, &format!("input {i} after the call"));
    }
    cleanup(dir);
}

/// One function applying every reduction kind with `attrs` to `x: tensor<{shape}x{ty}>`.
fn all_kinds(shape: &str, ty: &str, out: &str, attrs: &str) -> String {
    let x = if shape.is_empty() {
        format!("tensor<{ty}>")
    } else {
        format!("tensor<{shape}x{ty}>")
    };
    let o = if out.is_empty() {
        format!("tensor<{ty}>")
    } else {
        format!("tensor<{out}x{ty}>")
    };
    format!(
        r#"
module {{
  func @f(%x: {x}) -> ({o}, {o}, {o}, {o}) {{
    %s = "pp.reduce_sum"(%x) {attrs} : ({x}) -> {o}
    %m = "pp.reduce_mean"(%x) {attrs} : ({x}) -> {o}
    %a = "pp.reduce_max"(%x) {attrs} : ({x}) -> {o}
    %i = "pp.reduce_min"(%x) {attrs} : ({x}) -> {o}
    return %s, %m, %a, %i : {o}, {o}, {o}, {o}
  }}
}}
"#
    )
}

#[test]
fn f32_axes_and_keepdims() {
    for (out, attrs) in [
        ("3x5", "{axes = [1], keepdims = 0}"),
        ("1x4x1", "{axes = [0, -1]}"),
        ("3x4", "{axes = [-1], keepdims = 0}"),
        ("1x1x1", "{}"),
        ("", "{keepdims = 0}"),
        ("4", "{axes = [2, 0], keepdims = 0}"),
        ("3x1x5", "{axes = [-2], keepdims = 1}"),
        ("", "{axes = [0, 1, 2], keepdims = 0}"),
    ] {
        let src = all_kinds("3x4x5", "f32", out, attrs);
        check(&src, Some(vec![input(&[3, 4, 5], 11)]));
    }
}

#[test]
fn f64_reductions() {
    for (out, attrs) in [
        ("2x7", "{axes = [1], keepdims = 0}"),
        ("1x6x1", "{axes = [0, 2]}"),
    ] {
        let src = all_kinds("2x6x7", "f64", out, attrs);
        let x = uniform(DType::F64, &[2, 6, 7], 3, -1e3, 1e3);
        check(&src, Some(vec![x]));
    }
}

#[test]
fn f16_reductions() {
    let src = all_kinds("3x40", "f16", "3", "{axes = [1], keepdims = 0}");
    check(
        &src,
        Some(vec![uniform(DType::F16, &[3, 40], 6, -30.0, 30.0)]),
    );
}

#[test]
fn bf16_reductions() {
    // Rounded to bf16 with integer ops (no `__truncdfbf2` call), as the interpreter rounds.
    let src = all_kinds("3x40", "bf16", "3", "{axes = [1], keepdims = 0}");
    check(
        &src,
        Some(vec![uniform(DType::BF16, &[3, 40], 7, -30.0, 30.0)]),
    );
}

#[test]
fn long_sums_accumulate_like_the_interpreter() {
    // 2 x 65536 values around 1e4 with cancellation: an f32 accumulator would drift far
    // beyond the tolerance; the lowering accumulates in f64 as the interpreter does.
    let src = all_kinds("2x65536", "f32", "2", "{axes = [1], keepdims = 0}");
    let x = uniform(DType::F32, &[2, 65536], 5, -1e4, 1e4);
    check(&src, Some(vec![x]));
}

#[test]
fn nan_and_infinity() {
    let src = all_kinds("3x4", "f32", "3", "{axes = [1], keepdims = 0}");
    let nan = f32::NAN;
    let inf = f32::INFINITY;
    let x = Tensor::from_f32(
        vec![3, 4],
        vec![
            1.0, nan, -3.0, 2.0, // NaN wins in max and min (and sum, mean)
            -inf, -inf, -inf, -inf, // all -inf: max -inf, sum -inf
            inf, 1.0, -2.0, 0.5, // +inf
        ],
    );
    check_nan_inputs(&src, vec![x]);
}

#[test]
fn scalar_operand() {
    let src = all_kinds("", "f32", "", "{}");
    check(&src, Some(vec![Tensor::from_f32(vec![], vec![-1.25])]));
    let src = all_kinds("", "i32", "", "{}");
    check(
        &src,
        Some(vec![Tensor::from_i64(DType::I32, vec![], vec![-7])]),
    );
}

#[test]
fn integers() {
    for ty in ["i64", "i32"] {
        let d = if ty == "i64" { DType::I64 } else { DType::I32 };
        for (out, attrs) in [
            ("4x5", "{axes = [0], keepdims = 0}"),
            ("3x1x1", "{axes = [-1, 1]}"),
            ("", "{keepdims = 0}"),
        ] {
            let src = all_kinds("3x4x5", ty, out, attrs);
            // Negative values: the mean truncates toward zero.
            check(&src, Some(vec![ints(d, &[3, 4, 5], 9, -50, 50)]));
        }
    }
}

#[test]
fn narrow_integer_sums_wrap_and_means_see_the_full_sum() {
    // i32 values near 2^30: the sum of 8 overflows i32 (the interpreter sums in i64 and
    // wraps the result; the mean divides the unwrapped i64 sum).
    let src = all_kinds("3x8", "i32", "3", "{axes = [1], keepdims = 0}");
    check(
        &src,
        Some(vec![ints(DType::I32, &[3, 8], 4, 1 << 29, 1 << 31)]),
    );
    let src = all_kinds("2x9", "i8", "2x1", "{axes = [-1]}");
    check(&src, Some(vec![ints(DType::I8, &[2, 9], 8, -128, 128)]));
    // i64 extremes: max/min start from the exact i64 bounds.
    let src = all_kinds("2x2", "i64", "2", "{axes = [1], keepdims = 0}");
    let x = Tensor::from_i64(
        DType::I64,
        vec![2, 2],
        vec![i64::MAX, i64::MAX - 1, i64::MIN, i64::MIN + 1],
    );
    check(&src, Some(vec![x]));
}

#[test]
fn empty_reductions() {
    // Sum 0, mean NaN, max -inf, min +inf over a zero-sized axis.
    let src = all_kinds("0x3", "f32", "3", "{axes = [0], keepdims = 0}");
    check(&src, Some(vec![Tensor::from_f32(vec![0, 3], vec![])]));
}

#[test]
fn refused_cases_are_errors_not_code() {
    // Max of integers over nothing is the interpreter's error: refused at compile time.
    let src = r#"
module {
  func @f(%x: tensor<0x3xi64>) -> (tensor<3xi64>) {
    %a = "pp.reduce_max"(%x) {axes = [0], keepdims = 0} : (tensor<0x3xi64>) -> tensor<3xi64>
    return %a : tensor<3xi64>
  }
}
"#;
    let m = parse(src);
    let e = lower_function(&m.functions[0]).unwrap_err().to_string();
    assert!(e.contains("empty"), "{e}");
    // Bool operands are not numbers.
    let src = r#"
module {
  func @f(%x: tensor<2x3xi1>) -> (tensor<2xi1>) {
    %a = "pp.reduce_max"(%x) {axes = [1], keepdims = 0} : (tensor<2x3xi1>) -> tensor<2xi1>
    return %a : tensor<2xi1>
  }
}
"#;
    let m = parse(src);
    assert!(lower_function(&m.functions[0]).is_err());
}

#[test]
fn reductions_are_linalg_reductions() {
    let m = parse(&all_kinds(
        "3x4x5",
        "f32",
        "3x5",
        "{axes = [1], keepdims = 0}",
    ));
    let (mlir, _) = lower_function(&m.functions[0]).unwrap();
    for needle in [
        "\"parallel\", \"reduction\", \"parallel\"",
        "arith.extf",
        "arith.maximumf",
        "arith.minimumf",
    ] {
        assert!(mlir.contains(needle), "missing `{needle}` in\n{mlir}");
    }
    // The GPU's loops: the kept dimensions outer (one kernel, a thread per result), the
    // reduced one inner, the input's map renumbered to match.
    let gpu = LowerOptions {
        library_calls: false,
        ..Default::default()
    };
    let (mlir, _) = lower_functions_with(&[&m.functions[0]], &gpu).unwrap();
    for needle in [
        "affine_map<(d0, d1, d2) -> (d0, d2, d1)>, affine_map<(d0, d1, d2) -> (d0, d1)>",
        "\"parallel\", \"parallel\", \"reduction\"",
    ] {
        assert!(mlir.contains(needle), "missing `{needle}` in\n{mlir}");
    }
    assert!(
        !mlir.contains("\"parallel\", \"reduction\", \"parallel\""),
        "{mlir}"
    );
}
