//! Tests of `lower::contraction` (see common.rs for the harness).

use ppcc_codegen::lower_function;
use ppir::{DType, Module, Tensor};

use crate::common::*;

/// A module with one function `@f` applying `"pp.<op>"` with `attrs` to arguments of the
/// given types (`"2x3xf32"`); the result type is inferred (declared with `?` dims of
/// `rank`, then `ppir::shape::infer_function`).
fn one_op(op: &str, attrs: &str, args: &[&str], rank: usize, dtype: &str) -> Module {
    let params: Vec<String> = args
        .iter()
        .enumerate()
        .map(|(i, t)| format!("%a{i}: tensor<{t}>"))
        .collect();
    let names: Vec<String> = (0..args.len()).map(|i| format!("%a{i}")).collect();
    let tys: Vec<String> = args.iter().map(|t| format!("tensor<{t}>")).collect();
    let mut res = String::from("tensor<");
    for _ in 0..rank {
        res.push_str("?x");
    }
    res.push_str(dtype);
    res.push('>');
    let attrs = if attrs.is_empty() {
        String::new()
    } else {
        format!(" {{{attrs}}}")
    };
    let src = format!(
        "module {{\n  func @f({}) -> ({res}) {{\n    %y = \"pp.{op}\"({}){attrs} : ({}) -> {res}\n    return %y : {res}\n  }}\n}}\n",
        params.join(", "),
        names.join(", "),
        tys.join(", ")
    );
    let mut m = ppir::text::parse_module(&src).unwrap_or_else(|e| panic!("parse: {e}\n{src}"));
    for f in &mut m.functions {
        ppir::shape::infer_function(f).unwrap_or_else(|e| panic!("infer: {e}\n{src}"));
    }
    ppir::verify::verify_module(&m).unwrap_or_else(|e| panic!("verify: {e:?}\n{src}"));
    m
}

/// Check one op on random inputs (f32 unless the types say otherwise).
fn check_op(op: &str, attrs: &str, args: &[&str], rank: usize) {
    let dtype = args[0].rsplit('x').next().unwrap();
    let m = one_op(op, attrs, args, rank, dtype);
    let inputs = random_inputs(&m.functions[0], 3);
    check_with(&m, "f", inputs, 1e-5);
}

/// The lowering error of one op, which must be a refusal (not a panic).
fn refusal(op: &str, attrs: &str, args: &[&str], rank: usize, dtype: &str) -> String {
    let m = one_op(op, attrs, args, rank, dtype);
    lower_function(&m.functions[0])
        .expect_err("lowering refused")
        .to_string()
}

// ---- matmul ----

#[test]
fn matmul_2d_and_batched() {
    check_op("matmul", "", &["5x7xf32", "7x3xf32"], 2);
    check_op("matmul", "", &["4x5x7xf32", "4x7x3xf32"], 3);
    check_op("matmul", "", &["2x3x5x7xf32", "2x3x7x6xf32"], 4);
}

#[test]
fn matmul_vectors() {
    // 1-D operands: promotion, and the added dimension removed again.
    check_op("matmul", "", &["7xf32", "7xf32"], 0);
    check_op("matmul", "", &["7xf32", "7x3xf32"], 1);
    check_op("matmul", "", &["5x7xf32", "7xf32"], 1);
    check_op("matmul", "", &["7xf32", "2x7x3xf32"], 2);
    check_op("matmul", "", &["2x3x5x7xf32", "7xf32"], 3);
}

#[test]
fn matmul_batch_broadcasting() {
    check_op("matmul", "", &["2x1x3x4xf32", "5x4x6xf32"], 4);
    check_op("matmul", "", &["3x4xf32", "2x4x6xf32"], 3);
    check_op("matmul", "", &["2x3x4xf32", "4x6xf32"], 3);
    check_op("matmul", "", &["2x3x4xf32", "1x4x6xf32"], 3);
    check_op("matmul", "", &["1x3x4xf32", "5x4x6xf32"], 3);
    check_op("matmul", "", &["3x1x2x4xf32", "1x5x4x6xf32"], 4);
}

#[test]
fn matmul_uses_named_ops_where_exact() {
    let mm = |args: &[&str], rank| {
        let m = one_op("matmul", "", args, rank, "f32");
        lower_function(&m.functions[0]).unwrap().0
    };
    let t = mm(&["5x7xf32", "7x3xf32"], 2);
    assert!(t.contains("linalg.matmul"), "{t}");
    let t = mm(&["2x3x5x7xf32", "2x3x7x6xf32"], 4);
    assert!(t.contains("linalg.batch_matmul"), "{t}");
    // A batched left operand against one matrix folds into one 2-D product.
    let t = mm(&["2x3x5x7xf32", "7x6xf32"], 4);
    assert!(
        t.contains("linalg.matmul") && !t.contains("linalg.generic"),
        "{t}"
    );
    let t = mm(&["2x1x3x4xf32", "5x4x6xf32"], 4);
    assert!(
        t.contains("linalg.generic") && t.contains("\"reduction\""),
        "{t}"
    );
}

#[test]
fn matmul_f64_and_integers() {
    check_op("matmul", "", &["3x5x7xf64", "7x4xf64"], 3);
    check_op("matmul", "", &["2x1x3x4xf64", "5x4x6xf64"], 4);
    check_op("matmul", "", &["5x7xi64", "7x3xi64"], 2);
    check_op("matmul", "", &["2x5x7xi32", "1x7x3xi32"], 3);
    // i8 wraps as the interpreter's result does.
    let m = one_op("matmul", "", &["4x9xi8", "9x5xi8"], 2, "i8");
    let a = ints(DType::I8, &[4, 9], 1, -100, 100);
    let b = ints(DType::I8, &[9, 5], 2, -100, 100);
    check_with(&m, "f", vec![a, b], 0.0);
}

#[test]
fn matmul_refuses_half_precision() {
    let err = refusal("matmul", "", &["4x8xf16", "8x2xf16"], 2, "f16");
    assert!(err.contains("dtype f16"), "{err}");
}

// ---- gemm ----

#[test]
fn gemm_plain_and_transposed() {
    check_op("gemm", "", &["5x7xf32", "7x3xf32"], 2);
    check_op("gemm", "trans_a = 1", &["7x5xf32", "7x3xf32"], 2);
    check_op("gemm", "trans_b = 1", &["5x7xf32", "3x7xf32"], 2);
    check_op(
        "gemm",
        "alpha = 0.5, trans_a = 1, trans_b = 1",
        &["7x5xf32", "3x7xf32"],
        2,
    );
}

#[test]
fn gemm_with_c() {
    check_op("gemm", "", &["5x7xf32", "7x3xf32", "5x3xf32"], 2);
    check_op(
        "gemm",
        "alpha = 1.5, beta = -0.25",
        &["5x7xf32", "7x3xf32", "3xf32"],
        2,
    );
    check_op("gemm", "beta = 2.0", &["5x7xf32", "7x3xf32", "5x1xf32"], 2);
    check_op("gemm", "beta = 0.0", &["5x7xf32", "7x3xf32", "1x3xf32"], 2);
    check_op(
        "gemm",
        "alpha = 2.0, trans_b = 1",
        &["5x7xf32", "3x7xf32", "f32"],
        2,
    );
    check_op(
        "gemm",
        "alpha = 0.75, beta = 0.5, trans_a = 1",
        &["7x5xf64", "7x3xf64", "5x3xf64"],
        2,
    );
}

// ---- conv ----

#[test]
fn conv_2d() {
    check_op("conv", "", &["2x3x8x7xf32", "4x3x3x3xf32"], 4);
    check_op("conv", "", &["2x3x8x7xf32", "4x3x3x3xf32", "4xf32"], 4);
    check_op(
        "conv",
        "strides = [2, 3], pads = [1, 0, 2, 1]",
        &["2x3x9x10xf32", "4x3x3x2xf32", "4xf32"],
        4,
    );
    check_op(
        "conv",
        "dilations = [2, 1], pads = [2, 1, 0, 3], strides = [1, 2]",
        &["1x2x9x8xf32", "3x2x3x3xf32"],
        4,
    );
    check_op(
        "conv",
        "kernel_shape = [1, 1]",
        &["2x5x4x6xf32", "3x5x1x1xf32"],
        4,
    );
}

#[test]
fn conv_groups_and_depthwise() {
    check_op(
        "conv",
        "group = 2, pads = [1, 1, 1, 1]",
        &["2x4x6x6xf32", "6x2x3x3xf32", "6xf32"],
        4,
    );
    // Depthwise with a channel multiplier of 2, strided.
    check_op(
        "conv",
        "group = 3, strides = [2, 2], pads = [1, 1, 1, 1]",
        &["2x3x7x7xf32", "6x1x3x3xf32"],
        4,
    );
    check_op(
        "conv",
        "group = 4, dilations = [2, 2]",
        &["1x4x8x8xf32", "4x1x2x2xf32", "4xf32"],
        4,
    );
}

#[test]
fn conv_1d_and_3d() {
    check_op(
        "conv",
        "strides = [2], pads = [2, 1], dilations = [2]",
        &["3x4x17xf32", "5x4x3xf32", "5xf32"],
        3,
    );
    check_op(
        "conv",
        "group = 2, pads = [0, 1, 1, 1, 0, 1], strides = [1, 2, 1]",
        &["2x4x5x6x4xf32", "4x2x2x3x2xf32", "4xf32"],
        5,
    );
}

#[test]
fn conv_f64() {
    check_op(
        "conv",
        "pads = [1, 2, 1, 0], strides = [2, 1], group = 2",
        &["2x4x6x5xf64", "4x2x3x3xf64", "4xf64"],
        4,
    );
}

#[test]
fn conv_refuses_half_precision() {
    let err = refusal("conv", "", &["1x2x5x5xf16", "3x2x3x3xf16"], 4, "f16");
    assert!(err.contains("not lowered") && err.contains("f16"), "{err}");
}

// ---- conv_transpose ----

#[test]
fn conv_transpose_2d() {
    check_op("conv_transpose", "", &["2x3x4x5xf32", "3x2x3x3xf32"], 4);
    check_op(
        "conv_transpose",
        "strides = [2, 2]",
        &["2x3x4x5xf32", "3x2x3x3xf32", "2xf32"],
        4,
    );
    check_op(
        "conv_transpose",
        "strides = [2, 3], pads = [1, 0, 2, 1], output_padding = [1, 2]",
        &["1x2x4x3xf32", "2x3x3x4xf32", "3xf32"],
        4,
    );
    check_op(
        "conv_transpose",
        "strides = [3, 2], dilations = [2, 3], pads = [0, 2, 1, 1]",
        &["2x2x3x4xf32", "2x2x2x3xf32"],
        4,
    );
}

#[test]
fn conv_transpose_large_pads_and_groups() {
    // Pads larger than the kernel's reach: the spread input is cut at the start, or
    // (large end pads) at the end.
    check_op(
        "conv_transpose",
        "strides = [2, 2], pads = [0, 1, 3, 4]",
        &["1x2x5x6xf32", "2x3x3x2xf32"],
        4,
    );
    check_op(
        "conv_transpose",
        "strides = [2, 2], pads = [4, 3, 3, 5]",
        &["1x2x6x7xf32", "2x3x2x2xf32"],
        4,
    );
    check_op(
        "conv_transpose",
        "group = 2, strides = [2, 1], pads = [1, 1, 0, 1], output_padding = [1, 0]",
        &["2x4x3x4xf32", "4x3x3x2xf32", "6xf32"],
        4,
    );
    // Depthwise.
    check_op(
        "conv_transpose",
        "group = 3, strides = [2, 2], pads = [1, 1, 1, 1]",
        &["1x3x4x4xf32", "3x1x3x3xf32", "3xf32"],
        4,
    );
}

#[test]
fn conv_transpose_1d_3d_f64() {
    check_op(
        "conv_transpose",
        "strides = [3], pads = [1, 2], dilations = [2], output_padding = [2]",
        &["2x3x5xf32", "3x4x3xf32", "4xf32"],
        3,
    );
    check_op(
        "conv_transpose",
        "strides = [2, 1, 2], pads = [1, 0, 0, 0, 1, 1]",
        &["1x2x3x2x3xf32", "2x2x2x2x3xf32"],
        5,
    );
    check_op(
        "conv_transpose",
        "strides = [2, 2], pads = [1, 0, 0, 1], group = 2",
        &["2x2x3x3xf64", "2x2x3x3xf64", "4xf64"],
        4,
    );
}

// ---- conv_grad_weight ----

#[test]
fn conv_grad_weight_2d() {
    check_op(
        "conv_grad_weight",
        "kernel_shape = [3, 3]",
        &["2x3x6x7xf32", "2x4x4x5xf32"],
        4,
    );
    check_op(
        "conv_grad_weight",
        "kernel_shape = [3, 2], strides = [2, 3], pads = [1, 0, 2, 1], dilations = [1, 2]",
        &["2x3x9x10xf32", "2x4x5x3xf32"],
        4,
    );
    check_op(
        "conv_grad_weight",
        "kernel_shape = [3, 3], group = 2, pads = [1, 1, 1, 1]",
        &["2x4x6x6xf32", "2x6x6x6xf32"],
        4,
    );
}

#[test]
fn conv_grad_weight_1d_3d_f64() {
    check_op(
        "conv_grad_weight",
        "kernel_shape = [3], strides = [2], pads = [2, 1], dilations = [2], group = 2",
        &["3x4x17xf32", "3x6x8xf32"],
        3,
    );
    check_op(
        "conv_grad_weight",
        "kernel_shape = [2, 3, 2], pads = [0, 1, 1, 1, 0, 1], strides = [1, 2, 1]",
        &["2x2x5x6x4xf32", "2x3x5x3x5xf32"],
        5,
    );
    check_op(
        "conv_grad_weight",
        "kernel_shape = [3, 3], strides = [2, 2], group = 3",
        &["2x3x7x7xf64", "2x6x3x3xf64"],
        4,
    );
}

/// conv, then its weight gradient and a transposed convolution of the result, chained in
/// one function (values flow between the lowered ops).
#[test]
fn conv_chain() {
    let src = r#"
module {
  func @chain(%x: tensor<2x3x8x8xf32>, %w: tensor<4x3x3x3xf32>, %b: tensor<4xf32>, %wt: tensor<4x3x2x2xf32>) -> (tensor<2x3x8x8xf32>, tensor<4x3x3x3xf32>) {
    %y = "pp.conv"(%x, %w, %b) {pads = [1, 1, 1, 1], strides = [2, 2]} : (tensor<2x3x8x8xf32>, tensor<4x3x3x3xf32>, tensor<4xf32>) -> tensor<2x4x4x4xf32>
    %r = "pp.relu"(%y) : (tensor<2x4x4x4xf32>) -> tensor<2x4x4x4xf32>
    %dw = "pp.conv_grad_weight"(%x, %r) {kernel_shape = [3, 3], pads = [1, 1, 1, 1], strides = [2, 2]} : (tensor<2x3x8x8xf32>, tensor<2x4x4x4xf32>) -> tensor<4x3x3x3xf32>
    %u = "pp.conv_transpose"(%r, %wt) {strides = [2, 2]} : (tensor<2x4x4x4xf32>, tensor<4x3x2x2xf32>) -> tensor<2x3x8x8xf32>
    return %u, %dw : tensor<2x3x8x8xf32>, tensor<4x3x3x3xf32>
  }
}
"#;
    check(src, None);
}

#[test]
fn conv_inputs_keep_their_values() {
    // check_with asserts inputs are unchanged; use distinct inputs to make that meaningful.
    let m = one_op(
        "conv",
        "pads = [1, 1, 1, 1]",
        &["1x2x4x4xf32", "2x2x3x3xf32"],
        4,
        "f32",
    );
    let x = Tensor::from_f32(vec![1, 2, 4, 4], (0..32).map(|v| v as f32 * 0.25).collect());
    let w = input(&[2, 2, 3, 3], 9);
    check_with(&m, "f", vec![x, w], 1e-5);
}
