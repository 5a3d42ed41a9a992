//! Tests of `lower::pool` (see common.rs for the harness).

use ppcc_codegen::lower_function;
use ppir::interp::{run_function, InterpOptions};
use ppir::{DType, Module, Tensor};

use crate::common::*;

/// A module with one function `@f` applying `"pp.<op>"` with `attrs` to arguments of the
/// given types; the result type is inferred (declared with `?` dims of `rank`).
fn one_op(op: &str, attrs: &str, args: &[&str], rank: usize, dtype: &str) -> Module {
    let params: Vec<String> = args
        .iter()
        .enumerate()
        .map(|(i, t)| format!("%a{i}: tensor<{t}>"))
        .collect();
    let names: Vec<String> = (0..args.len()).map(|i| format!("%a{i}")).collect();
    let tys: Vec<String> = args.iter().map(|t| format!("tensor<{t}>")).collect();
    let res = format!("tensor<{}{dtype}>", "?x".repeat(rank));
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

fn shape_of(t: &str) -> (Vec<usize>, DType) {
    let mut parts: Vec<&str> = t.split('x').collect();
    let d = match parts.pop().unwrap() {
        "f32" => DType::F32,
        "f64" => DType::F64,
        other => panic!("dtype {other}"),
    };
    (parts.iter().map(|p| p.parse().unwrap()).collect(), d)
}

/// Small integers as floats: windows with ties.
fn with_ties(t: &str, seed: u64) -> Tensor {
    let (shape, d) = shape_of(t);
    let u = uniform(d, &shape, seed, 0.0, 3.0);
    let v = u.as_f64().unwrap().iter().map(|x| x.floor()).collect();
    Tensor::from_f64(d, shape, v)
}

/// Check one op on random inputs.
fn check_op(op: &str, attrs: &str, args: &[&str], rank: usize) {
    let dtype = args[0].rsplit('x').next().unwrap();
    let m = one_op(op, attrs, args, rank, dtype);
    let inputs = random_inputs(&m.functions[0], 5);
    check_with(&m, "f", inputs, 1e-5);
}

/// `check_with` for inputs holding NaN (whose "inputs unchanged" comparison cannot hold,
/// NaN differing from itself).
fn check_nan_inputs(m: &Module, inputs: Vec<Tensor>) {
    let f = &m.functions[0];
    let expected = run_function(f, inputs.clone(), &InterpOptions::default(), None)
        .unwrap_or_else(|e| panic!("interpreter: {e}"));
    let (nm, dir) = compile(m);
    let args: Vec<&Tensor> = inputs.iter().collect();
    let got = nm
        .call(&f.name, &args, None)
        .unwrap_or_else(|e| panic!("native call: {e}"));
    assert_eq!(got.len(), expected.len());
    for (i, (g, w)) in got.iter().zip(&expected).enumerate() {
        assert_close(g, w, 1e-5, &format!("result {i}"));
    }
    cleanup(dir);
}

fn check_inputs(op: &str, attrs: &str, args: &[&str], rank: usize, inputs: Vec<Tensor>) {
    let dtype = args[0].rsplit('x').next().unwrap();
    let m = one_op(op, attrs, args, rank, dtype);
    check_nan_inputs(&m, inputs);
}

// ---- max_pool / avg_pool ----

#[test]
fn max_pool_2d() {
    check_op(
        "max_pool",
        "kernel_shape = [2, 2], strides = [2, 2]",
        &["2x3x8x8xf32"],
        4,
    );
    check_op(
        "max_pool",
        "kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1]",
        &["2x3x9x8xf32"],
        4,
    );
    check_op(
        "max_pool",
        "kernel_shape = [3, 2], strides = [1, 2], pads = [2, 0, 1, 1], dilations = [2, 3]",
        &["1x2x9x10xf32"],
        4,
    );
}

#[test]
fn max_pool_ceil_mode() {
    check_op(
        "max_pool",
        "kernel_shape = [3, 3], strides = [2, 2], ceil_mode = 1",
        &["1x8x10x10xf32"],
        4,
    );
    // The last window would start in the end padding: dropped.
    check_op(
        "max_pool",
        "kernel_shape = [2, 2], strides = [2, 2], pads = [1, 1, 1, 1], ceil_mode = 1",
        &["1x2x5x6xf32"],
        4,
    );
    check_op(
        "max_pool",
        "kernel_shape = [3], strides = [3], pads = [1, 2], dilations = [2], ceil_mode = 1",
        &["2x2x11xf32"],
        3,
    );
}

#[test]
fn max_pool_padding_never_wins() {
    // All-negative inputs: a zero from the padding would win otherwise; -inf inputs
    // stay -inf; windows of padding only (pads ≥ kernel) give -inf.
    let (shape, d) = shape_of("1x2x4x5xf32");
    let mut x = uniform(d, &shape, 3, -5.0, -1.0);
    if let ppir::TensorData::Float(v) = &mut x.data {
        v[0] = f64::NEG_INFINITY;
        v[1] = f64::NEG_INFINITY;
        v[5] = f64::NEG_INFINITY;
        v[6] = f64::NEG_INFINITY;
        v[7] = f64::NAN;
    }
    check_inputs(
        "max_pool",
        "kernel_shape = [2, 2], pads = [1, 1, 1, 1]",
        &["1x2x4x5xf32"],
        4,
        vec![x.clone()],
    );
    check_inputs(
        "max_pool",
        "kernel_shape = [2, 2], strides = [2, 2], pads = [3, 2, 2, 3]",
        &["1x2x4x5xf32"],
        4,
        vec![x],
    );
}

#[test]
fn max_pool_1d_3d_f64() {
    check_op(
        "max_pool",
        "kernel_shape = [4], strides = [3], pads = [1, 2]",
        &["2x3x14xf32"],
        3,
    );
    check_op(
        "max_pool",
        "kernel_shape = [2, 3, 2], strides = [2, 1, 2], pads = [0, 1, 1, 1, 1, 0]",
        &["1x2x5x4x6xf32"],
        5,
    );
    check_op(
        "max_pool",
        "kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1], ceil_mode = 1",
        &["2x2x8x7xf64"],
        4,
    );
}

#[test]
fn avg_pool_2d() {
    check_op(
        "avg_pool",
        "kernel_shape = [2, 2], strides = [2, 2]",
        &["2x3x8x8xf32"],
        4,
    );
    check_op(
        "avg_pool",
        "kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1]",
        &["2x3x9x8xf32"],
        4,
    );
    check_op(
        "avg_pool",
        "kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1], count_include_pad = 1",
        &["2x3x9x8xf32"],
        4,
    );
    check_op(
        "avg_pool",
        "kernel_shape = [3, 2], strides = [1, 2], pads = [2, 0, 1, 1], dilations = [2, 3], count_include_pad = 1",
        &["1x2x9x10xf32"],
        4,
    );
}

#[test]
fn avg_pool_ceil_mode_divisors() {
    // Windows running off the end: their cells beyond the padding never count, with or
    // without count_include_pad.
    for inc in [0, 1] {
        check_op(
            "avg_pool",
            &format!(
                "kernel_shape = [3, 3], strides = [2, 2], ceil_mode = 1, count_include_pad = {inc}"
            ),
            &["1x2x10x9xf32"],
            4,
        );
        check_op(
            "avg_pool",
            &format!("kernel_shape = [3, 2], strides = [2, 3], pads = [1, 0, 1, 1], ceil_mode = 1, count_include_pad = {inc}"),
            &["2x2x8x9xf32"],
            4,
        );
        check_op(
            "avg_pool",
            &format!("kernel_shape = [3], strides = [3], pads = [1, 2], dilations = [2], ceil_mode = 1, count_include_pad = {inc}"),
            &["2x2x11xf32"],
            3,
        );
    }
}

#[test]
fn avg_pool_all_padding_window() {
    // pads ≥ kernel: a window of padding only averages 0/0 = NaN without
    // count_include_pad, 0 with it, as the interpreter.
    for inc in [0, 1] {
        check_op(
            "avg_pool",
            &format!("kernel_shape = [2, 2], strides = [2, 2], pads = [2, 0, 3, 2], count_include_pad = {inc}"),
            &["1x2x4x5xf32"],
            4,
        );
    }
}

#[test]
fn avg_pool_1d_3d_f64() {
    check_op(
        "avg_pool",
        "kernel_shape = [4], strides = [3], pads = [1, 2], count_include_pad = 1",
        &["2x3x14xf32"],
        3,
    );
    check_op(
        "avg_pool",
        "kernel_shape = [2, 3, 2], strides = [2, 1, 2], pads = [0, 1, 1, 1, 1, 0]",
        &["1x2x5x4x6xf32"],
        5,
    );
    check_op(
        "avg_pool",
        "kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1], ceil_mode = 1",
        &["2x2x8x7xf64"],
        4,
    );
}

// ---- global pools ----

#[test]
fn global_pools() {
    for op in ["global_avg_pool", "global_max_pool"] {
        check_op(op, "", &["2x3x5x7xf32"], 4);
        check_op(op, "", &["3x4x9xf32"], 3);
        check_op(op, "", &["2x2x3x4x5xf32"], 5);
        check_op(op, "", &["2x3x4x5xf64"], 4);
    }
    let mut x = input(&[1, 2, 3, 3], 4);
    if let ppir::TensorData::Float(v) = &mut x.data {
        v[4] = f64::NAN;
    }
    check_inputs("global_max_pool", "", &["1x2x3x3xf32"], 4, vec![x]);
}

// ---- gradients ----

/// dy for a pool of `x_ty` with `attrs`: the forward op's result type.
fn pooled(op: &str, attrs: &str, x_ty: &str) -> String {
    let rank = x_ty.split('x').count() - 1;
    let dtype = x_ty.rsplit('x').next().unwrap();
    let m = one_op(op, attrs, &[x_ty], rank, dtype);
    let f = &m.functions[0];
    let ty = f.ty(f.results()[0]);
    let dims: Vec<String> = ty
        .static_shape()
        .unwrap()
        .iter()
        .map(|d| d.to_string())
        .collect();
    format!("{}x{dtype}", dims.join("x"))
}

fn check_max_grad(attrs: &str, x_ty: &str, ties: bool) {
    let dy_ty = pooled("max_pool", attrs, x_ty);
    let rank = x_ty.split('x').count() - 1;
    let m = one_op(
        "max_pool_grad",
        attrs,
        &[x_ty, &dy_ty],
        rank,
        x_ty.rsplit('x').next().unwrap(),
    );
    let mut inputs = random_inputs(&m.functions[0], 11);
    if ties {
        inputs[0] = with_ties(x_ty, 13);
    }
    check_with(&m, "f", inputs, 1e-5);
}

#[test]
fn max_pool_grad_routes_to_first_maximum() {
    for ties in [false, true] {
        check_max_grad(
            "kernel_shape = [2, 2], strides = [2, 2]",
            "2x3x8x8xf32",
            ties,
        );
        // Overlapping windows accumulate.
        check_max_grad(
            "kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1]",
            "2x3x9x8xf32",
            ties,
        );
        check_max_grad(
            "kernel_shape = [3, 2], strides = [1, 2], pads = [2, 0, 1, 1], dilations = [2, 3]",
            "1x2x9x10xf32",
            ties,
        );
        check_max_grad(
            "kernel_shape = [3, 3], strides = [2, 2], ceil_mode = 1, pads = [0, 1, 1, 0]",
            "1x2x10x9xf32",
            ties,
        );
    }
}

#[test]
fn max_pool_grad_1d_3d_f64() {
    check_max_grad(
        "kernel_shape = [4], strides = [3], pads = [1, 2], ceil_mode = 1",
        "2x3x14xf32",
        true,
    );
    check_max_grad(
        "kernel_shape = [2, 3, 2], strides = [2, 1, 2], pads = [0, 1, 1, 1, 1, 0]",
        "1x2x5x4x6xf32",
        true,
    );
    check_max_grad(
        "kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1]",
        "2x2x8x7xf64",
        true,
    );
}

#[test]
fn max_pool_grad_nan_inf_and_padding_windows() {
    let attrs = "kernel_shape = [2, 2], strides = [1, 2], pads = [2, 1, 1, 2]";
    let x_ty = "1x2x4x5xf32";
    let dy_ty = pooled("max_pool", attrs, x_ty);
    let m = one_op("max_pool_grad", attrs, &[x_ty, &dy_ty], 4, "f32");
    let mut inputs = random_inputs(&m.functions[0], 2);
    let mut x = with_ties(x_ty, 3);
    if let ppir::TensorData::Float(v) = &mut x.data {
        // A NaN wins its windows (the first NaN where there are two); -inf inputs still
        // beat the padding.
        v[2] = f64::NAN;
        v[8] = f64::NAN;
        v[12] = f64::NAN;
        v[20..30].fill(f64::NEG_INFINITY);
    }
    inputs[0] = x;
    check_nan_inputs(&m, inputs);
}

fn check_avg_grad(attrs: &str, x_ty: &str) {
    let dy_ty = pooled("avg_pool", attrs, x_ty);
    let (shape, _) = shape_of(x_ty);
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let attrs = format!("{attrs}, input_shape = [{}]", dims.join(", "));
    let rank = shape.len();
    check_op("avg_pool_grad", &attrs, &[&dy_ty], rank);
}

#[test]
fn avg_pool_grad_2d() {
    check_avg_grad("kernel_shape = [2, 2], strides = [2, 2]", "2x3x8x8xf32");
    check_avg_grad(
        "kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1]",
        "2x3x9x8xf32",
    );
    check_avg_grad(
        "kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1], count_include_pad = 1",
        "2x3x9x8xf32",
    );
    check_avg_grad(
        "kernel_shape = [3, 2], strides = [1, 2], pads = [2, 0, 1, 1], dilations = [2, 3]",
        "1x2x9x10xf32",
    );
    for inc in [0, 1] {
        check_avg_grad(
            &format!("kernel_shape = [3, 2], strides = [2, 3], pads = [1, 0, 1, 1], ceil_mode = 1, count_include_pad = {inc}"),
            "2x2x8x9xf32",
        );
    }
}

#[test]
fn avg_pool_grad_1d_3d_f64() {
    check_avg_grad(
        "kernel_shape = [3], strides = [3], pads = [1, 2], dilations = [2], ceil_mode = 1",
        "2x2x11xf32",
    );
    check_avg_grad(
        "kernel_shape = [2, 3, 2], strides = [2, 1, 2], pads = [0, 1, 1, 1, 1, 0], count_include_pad = 1",
        "1x2x5x4x6xf32",
    );
    check_avg_grad(
        "kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1], ceil_mode = 1",
        "2x2x8x7xf64",
    );
}

#[test]
fn pool_chain() {
    // Forward pools feeding each other and their gradients in one function.
    let src = r#"
module {
  func @chain(%x: tensor<2x3x8x8xf32>, %dy: tensor<2x3x4x4xf32>) -> (tensor<2x3x8x8xf32>, tensor<2x3x8x8xf32>, tensor<2x3x1x1xf32>) {
    %m = "pp.max_pool"(%x) {kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1]} : (tensor<2x3x8x8xf32>) -> tensor<2x3x4x4xf32>
    %a = "pp.avg_pool"(%m) {kernel_shape = [2, 2], pads = [1, 1, 0, 0]} : (tensor<2x3x4x4xf32>) -> tensor<2x3x4x4xf32>
    %g = "pp.global_avg_pool"(%a) : (tensor<2x3x4x4xf32>) -> tensor<2x3x1x1xf32>
    %s = "pp.mul"(%dy, %a) : (tensor<2x3x4x4xf32>, tensor<2x3x4x4xf32>) -> tensor<2x3x4x4xf32>
    %dx = "pp.max_pool_grad"(%x, %s) {kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1]} : (tensor<2x3x8x8xf32>, tensor<2x3x4x4xf32>) -> tensor<2x3x8x8xf32>
    %da = "pp.avg_pool_grad"(%s) {kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1], input_shape = [2, 3, 8, 8]} : (tensor<2x3x4x4xf32>) -> tensor<2x3x8x8xf32>
    return %dx, %da, %g : tensor<2x3x8x8xf32>, tensor<2x3x8x8xf32>, tensor<2x3x1x1xf32>
  }
}
"#;
    check(src, None);
}

#[test]
fn pools_refuse_half_precision() {
    let m = one_op(
        "max_pool",
        "kernel_shape = [2, 2]",
        &["1x2x4x4xf16"],
        4,
        "f16",
    );
    let err = lower_function(&m.functions[0])
        .expect_err("refused")
        .to_string();
    assert!(err.contains("not lowered") && err.contains("f16"), "{err}");
    let m = one_op("global_avg_pool", "", &["1x2x4x4xbf16"], 4, "bf16");
    let err = lower_function(&m.functions[0])
        .expect_err("refused")
        .to_string();
    assert!(err.contains("bf16"), "{err}");
}
