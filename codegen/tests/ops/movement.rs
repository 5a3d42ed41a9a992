//! Tests of `lower::movement` (see common.rs for the harness): every data-movement op
//! against the interpreter, over every dtype (movement never looks at element values).

use ppcc_codegen::lower_function;
use ppir::{DType, Tensor};

use crate::common::*;

/// Every dtype data movement handles.
const ALL: [&str; 8] = ["f32", "f64", "f16", "bf16", "i64", "i32", "i8", "i1"];

/// A one-op module: `$T` in `body` and `sig` is replaced by each dtype of `dtypes`.
fn each_dtype(src: &str, dtypes: &[&str]) {
    for t in dtypes {
        check(&src.replace("$T", t), None);
    }
}

/// Wrap one op line in a module: `args` and `rets` are `name: type` / `type` lists.
fn module(args: &str, body: &str, rets: &str, results: &str) -> String {
    format!(
        "module {{\n  func @f({args}) -> ({rets}) {{\n    {body}\n    return {results} : {rets}\n  }}\n}}\n"
    )
}

fn idx(d: DType, shape: &[usize], seed: u64, lo: i64, hi: i64) -> Tensor {
    ints(d, shape, seed, lo, hi)
}

// ---- concat / split ----

#[test]
fn concat_axes_and_operand_counts() {
    check(
        &module(
            "%x: tensor<4x8xf32>, %y: tensor<4x3xf32>",
            r#"%z = "pp.concat"(%x, %y) {axis = 1} : (tensor<4x8xf32>, tensor<4x3xf32>) -> tensor<4x11xf32>"#,
            "tensor<4x11xf32>",
            "%z",
        ),
        None,
    );
    check(
        &module(
            "%a: tensor<2x3x4xf32>, %b: tensor<1x3x4xf32>, %c: tensor<3x3x4xf32>",
            r#"%z = "pp.concat"(%a, %b, %c) {axis = 0} : (tensor<2x3x4xf32>, tensor<1x3x4xf32>, tensor<3x3x4xf32>) -> tensor<6x3x4xf32>"#,
            "tensor<6x3x4xf32>",
            "%z",
        ),
        None,
    );
    // Negative axis, a middle axis, a repeated operand.
    check(
        &module(
            "%a: tensor<2x3x4xf32>, %b: tensor<2x5x4xf32>",
            r#"%z = "pp.concat"(%a, %b, %a) {axis = -2} : (tensor<2x3x4xf32>, tensor<2x5x4xf32>, tensor<2x3x4xf32>) -> tensor<2x11x4xf32>"#,
            "tensor<2x11x4xf32>",
            "%z",
        ),
        None,
    );
    // A single operand, and an empty operand among others.
    check(
        &module(
            "%a: tensor<2x3xf32>",
            r#"%z = "pp.concat"(%a) {axis = 1} : (tensor<2x3xf32>) -> tensor<2x3xf32>"#,
            "tensor<2x3xf32>",
            "%z",
        ),
        None,
    );
    check(
        &module(
            "%a: tensor<2x3xf32>, %e: tensor<2x0xf32>, %b: tensor<2x2xf32>",
            r#"%z = "pp.concat"(%a, %e, %b, %e) {axis = -1} : (tensor<2x3xf32>, tensor<2x0xf32>, tensor<2x2xf32>, tensor<2x0xf32>) -> tensor<2x5xf32>"#,
            "tensor<2x5xf32>",
            "%z",
        ),
        None,
    );
    check(
        &module(
            "%a: tensor<3xf32>, %e: tensor<0xf32>",
            r#"%z = "pp.concat"(%e, %a) {axis = 0} : (tensor<0xf32>, tensor<3xf32>) -> tensor<3xf32>"#,
            "tensor<3xf32>",
            "%z",
        ),
        None,
    );
}

#[test]
fn concat_every_dtype() {
    each_dtype(
        &module(
            "%a: tensor<2x3x$T>, %b: tensor<2x1x$T>, %c: tensor<2x4x$T>",
            r#"%z = "pp.concat"(%a, %b, %c) {axis = 1} : (tensor<2x3x$T>, tensor<2x1x$T>, tensor<2x4x$T>) -> tensor<2x8x$T>"#,
            "tensor<2x8x$T>",
            "%z",
        ),
        &ALL,
    );
}

#[test]
fn split_sizes_and_axes() {
    check(
        &module(
            "%x: tensor<2x3x4xf32>",
            r#"%p, %q = "pp.split"(%x) {axis = 2, split = [1, 3]} : (tensor<2x3x4xf32>) -> (tensor<2x3x1xf32>, tensor<2x3x3xf32>)"#,
            "tensor<2x3x1xf32>, tensor<2x3x3xf32>",
            "%p, %q",
        ),
        None,
    );
    check(
        &module(
            "%x: tensor<6x5xf32>",
            r#"%p, %q, %r = "pp.split"(%x) {split = [2, 0, 4]} : (tensor<6x5xf32>) -> (tensor<2x5xf32>, tensor<0x5xf32>, tensor<4x5xf32>)"#,
            "tensor<2x5xf32>, tensor<0x5xf32>, tensor<4x5xf32>",
            "%p, %q, %r",
        ),
        None,
    );
    check(
        &module(
            "%x: tensor<3x7xf32>",
            r#"%p = "pp.split"(%x) {axis = -1, split = [7]} : (tensor<3x7xf32>) -> tensor<3x7xf32>"#,
            "tensor<3x7xf32>",
            "%p",
        ),
        None,
    );
}

/// Zero-size pieces lower to equal `tensor.empty`s that CSE merges into one buffer, which
/// MLIR's `buffer-results-to-out-params` crashed on (a segmentation fault while compiling
/// ONNX's `test_split_zero_size_splits_opset13`/`opset18`); so did one value returned twice.
#[test]
fn split_with_several_zero_size_pieces() {
    check(
        &module(
            "%x: tensor<0xf32>",
            r#"%p, %q, %r = "pp.split"(%x) {split = [0, 0, 0]} : (tensor<0xf32>) -> (tensor<0xf32>, tensor<0xf32>, tensor<0xf32>)"#,
            "tensor<0xf32>, tensor<0xf32>, tensor<0xf32>",
            "%p, %q, %r",
        ),
        None,
    );
    check(
        &module(
            "%x: tensor<2x3xf32>",
            r#"%p, %q, %r = "pp.split"(%x) {axis = 1, split = [0, 3, 0]} : (tensor<2x3xf32>) -> (tensor<2x0xf32>, tensor<2x3xf32>, tensor<2x0xf32>)"#,
            "tensor<2x0xf32>, tensor<2x3xf32>, tensor<2x0xf32>, tensor<2x3xf32>",
            "%p, %q, %r, %q",
        ),
        None,
    );
}

#[test]
fn split_every_dtype() {
    each_dtype(
        &module(
            "%x: tensor<3x7x$T>",
            r#"%p, %q, %r = "pp.split"(%x) {axis = -1, split = [2, 4, 1]} : (tensor<3x7x$T>) -> (tensor<3x2x$T>, tensor<3x4x$T>, tensor<3x1x$T>)"#,
            "tensor<3x2x$T>, tensor<3x4x$T>, tensor<3x1x$T>",
            "%p, %q, %r",
        ),
        &ALL,
    );
}

// ---- slice / slice_grad ----

fn slice_case(in_ty: &str, attrs: &str, out_ty: &str) -> String {
    module(
        &format!("%x: tensor<{in_ty}>"),
        &format!(r#"%y = "pp.slice"(%x) {{{attrs}}} : (tensor<{in_ty}>) -> tensor<{out_ty}>"#),
        &format!("tensor<{out_ty}>"),
        "%y",
    )
}

#[test]
fn slice_steps_clamping_and_negative_axes() {
    for (in_ty, attrs, out_ty) in [
        // Negative step with a clamped start, a huge end, two axes out of order.
        (
            "2x3x4xf32",
            "axes = [2, 1], ends = [-5, 100], starts = [3, 1], steps = [-1, 1]",
            "2x2x4xf32",
        ),
        // Plain window, default axes and steps.
        ("5x6xf32", "starts = [1, 2], ends = [4, 5]", "3x3xf32"),
        // Positive step > 1, negative start.
        (
            "10x4xf32",
            "starts = [-9], ends = [10], steps = [3]",
            "3x4xf32",
        ),
        // Negative step > 1 to INT64_MIN (the whole axis backwards).
        (
            "10x4xf32",
            "starts = [-1], ends = [-9223372036854775808], steps = [-3]",
            "4x4xf32",
        ),
        // INT64_MAX start with a negative step clamps to the last element.
        (
            "7x3xf32",
            "axes = [-2], starts = [9223372036854775807], ends = [1], steps = [-2]",
            "3x3xf32",
        ),
        // Every axis reversed.
        (
            "3x4x5xf32",
            "axes = [0, 1, 2], starts = [-1, -1, -1], ends = [-100, -100, -100], steps = [-1, -1, -1]",
            "3x4x5xf32",
        ),
        // A single element read with a huge step.
        (
            "6x5xf32",
            "axes = [1], starts = [2], ends = [0], steps = [-9223372036854775808]",
            "6x1xf32",
        ),
        (
            "6x5xf32",
            "axes = [0], starts = [4], ends = [6], steps = [9223372036854775807]",
            "1x5xf32",
        ),
        // Empty result (start past end), and an empty input.
        ("6x5xf32", "axes = [1], starts = [3], ends = [1]", "6x0xf32"),
        ("0x5xf32", "axes = [1], starts = [1], ends = [3]", "0x2xf32"),
        // Rank 1, strided backwards from the middle.
        ("17xf32", "starts = [12], ends = [2], steps = [-4]", "3xf32"),
        // Nothing sliced.
        ("3x2xf32", "starts = [], ends = []", "3x2xf32"),
    ] {
        check(&slice_case(in_ty, attrs, out_ty), None);
    }
}

#[test]
fn slice_every_dtype() {
    each_dtype(
        &slice_case(
            "5x6x4x$T",
            "axes = [0, -1, 1], starts = [4, 0, 1], ends = [-6, 4, 6], steps = [-2, 3, 2]",
            "3x3x2x$T",
        ),
        &ALL,
    );
}

fn slice_grad_case(dy_ty: &str, attrs: &str, out_ty: &str) -> String {
    module(
        &format!("%dy: tensor<{dy_ty}>"),
        &format!(
            r#"%dx = "pp.slice_grad"(%dy) {{{attrs}}} : (tensor<{dy_ty}>) -> tensor<{out_ty}>"#
        ),
        &format!("tensor<{out_ty}>"),
        "%dx",
    )
}

#[test]
fn slice_grad_scatters_where_the_slice_read() {
    for (dy_ty, attrs, out_ty) in [
        (
            "4x4xf32",
            "ends = [-9223372036854775808], input_shape = [10, 4], starts = [-1], steps = [-3]",
            "10x4xf32",
        ),
        (
            "2x2x4xf32",
            "axes = [2, 1], ends = [-5, 100], starts = [3, 1], steps = [-1, 1], input_shape = [2, 3, 4]",
            "2x3x4xf32",
        ),
        (
            "3x3xf32",
            "starts = [1, 2], ends = [4, 5], input_shape = [5, 6]",
            "5x6xf32",
        ),
        (
            "3x2x5xf64",
            "axes = [1], starts = [-1], ends = [-100], steps = [-2], input_shape = [3, 4, 5]",
            "3x4x5xf64",
        ),
        // Everything read backwards: dx is dy reversed.
        (
            "4x3xf32",
            "axes = [0], starts = [-1], ends = [-100], steps = [-1], input_shape = [4, 3]",
            "4x3xf32",
        ),
        // Nothing read.
        (
            "0x3xf32",
            "axes = [0], starts = [3], ends = [1], input_shape = [4, 3]",
            "4x3xf32",
        ),
        (
            "2x3xf16",
            "starts = [1], ends = [5], steps = [2], input_shape = [5, 3]",
            "5x3xf16",
        ),
        (
            "2x3xbf16",
            "starts = [1], ends = [5], steps = [2], input_shape = [5, 3]",
            "5x3xbf16",
        ),
    ] {
        check(&slice_grad_case(dy_ty, attrs, out_ty), None);
    }
}

// ---- gather / gather_grad ----

fn gather_case(data: &str, ind: &str, axis: i64, out: &str) -> String {
    module(
        &format!("%d: tensor<{data}>, %i: tensor<{ind}>"),
        &format!(
            r#"%y = "pp.gather"(%d, %i) {{axis = {axis}}} : (tensor<{data}>, tensor<{ind}>) -> tensor<{out}>"#
        ),
        &format!("tensor<{out}>"),
        "%y",
    )
}

#[test]
fn gather_axes_index_ranks_and_negative_indices() {
    // axis 0, 2-D indices with negative values.
    check(
        &gather_case("5x4xf32", "2x3xi64", 0, "2x3x4xf32"),
        Some(vec![input(&[5, 4], 1), idx(DType::I64, &[2, 3], 2, -5, 5)]),
    );
    // A middle axis, i32 indices.
    check(
        &gather_case("2x3x4xf32", "5x6xi32", 1, "2x5x6x4xf32"),
        Some(vec![
            input(&[2, 3, 4], 3),
            idx(DType::I32, &[5, 6], 4, -3, 3),
        ]),
    );
    // The last axis as -1, i8 indices.
    check(
        &gather_case("3x7xf32", "4xi8", -1, "3x4xf32"),
        Some(vec![input(&[3, 7], 5), idx(DType::I8, &[4], 6, -7, 7)]),
    );
    // Rank-0 indices drop the axis; to a scalar result.
    check(
        &gather_case("3x7xf32", "i64", 1, "3xf32"),
        Some(vec![
            input(&[3, 7], 7),
            Tensor::from_i64(DType::I64, vec![], vec![-2]),
        ]),
    );
    check(
        &gather_case("7xf32", "i64", 0, "f32"),
        Some(vec![
            input(&[7], 8),
            Tensor::from_i64(DType::I64, vec![], vec![4]),
        ]),
    );
    // Embedding lookup: repeated rows.
    check(
        &gather_case("50x16xf32", "4x9xi64", 0, "4x9x16xf32"),
        Some(vec![
            input(&[50, 16], 9),
            idx(DType::I64, &[4, 9], 10, 0, 6),
        ]),
    );
    // Empty indices.
    check(
        &gather_case("5x4xf32", "0x2xi64", 1, "5x0x2xf32"),
        Some(vec![
            input(&[5, 4], 11),
            Tensor::from_i64(DType::I64, vec![0, 2], vec![]),
        ]),
    );
}

#[test]
fn gather_every_dtype() {
    for t in ALL {
        let src = gather_case(&format!("4x5x3x{t}"), "2x2xi64", 1, &format!("4x2x2x3x{t}"));
        let m = parse(&src);
        let mut inputs = random_inputs(&m.functions[0], 12);
        inputs[1] = idx(DType::I64, &[2, 2], 13, -5, 5);
        check(&src, Some(inputs));
    }
}

#[test]
fn gather_out_of_range_reads_zeros() {
    // The interpreter reports an error; native code reads zeros (documented choice).
    let src = gather_case("3x2xf32", "4xi64", 0, "4x2xf32");
    let m = parse(&src);
    let (nm, dir) = compile(&m);
    let data = Tensor::from_f32(vec![3, 2], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let ind = Tensor::from_i64(DType::I64, vec![4], vec![2, 3, -4, -3]);
    let got = nm.call("f", &[&data, &ind], None).expect("native call");
    let want = Tensor::from_f32(vec![4, 2], vec![5.0, 6.0, 0.0, 0.0, 0.0, 0.0, 1.0, 2.0]);
    assert_close(&got[0], &want, 0.0, "out-of-range gather");
    cleanup(dir);
}

fn gather_grad_case(ind: &str, dy: &str, axis: i64, data_shape: &str, out: &str) -> String {
    module(
        &format!("%i: tensor<{ind}>, %dy: tensor<{dy}>"),
        &format!(
            r#"%dx = "pp.gather_grad"(%i, %dy) {{axis = {axis}, data_shape = [{data_shape}]}} : (tensor<{ind}>, tensor<{dy}>) -> tensor<{out}>"#
        ),
        &format!("tensor<{out}>"),
        "%dx",
    )
}

#[test]
fn gather_grad_accumulates_repeated_indices() {
    // Embedding gradient: many repeats among 6 rows, negative indices too.
    check(
        &gather_grad_case("4x9xi64", "4x9x16xf32", 0, "6, 16", "6x16xf32"),
        Some(vec![
            idx(DType::I64, &[4, 9], 1, -6, 6),
            input(&[4, 9, 16], 2),
        ]),
    );
    // A middle axis, i32 indices.
    check(
        &gather_grad_case("5x2xi32", "2x5x2x4xf32", 1, "2, 3, 4", "2x3x4xf32"),
        Some(vec![
            idx(DType::I32, &[5, 2], 3, -3, 3),
            input(&[2, 5, 2, 4], 4),
        ]),
    );
    // The last axis, rank-0 indices, f64.
    check(
        &gather_grad_case("i64", "3x4xf64", -1, "3, 4, 5", "3x4x5xf64"),
        Some(vec![
            Tensor::from_i64(DType::I64, vec![], vec![-2]),
            uniform(DType::F64, &[3, 4], 5, -2.0, 2.0),
        ]),
    );
    // i8 indices along the last axis, every index the same.
    check(
        &gather_grad_case("7xi8", "2x7xf32", 1, "2, 3", "2x3xf32"),
        Some(vec![
            Tensor::from_i64(DType::I8, vec![7], vec![1; 7]),
            input(&[2, 7], 6),
        ]),
    );
    // No indices: zeros.
    check(
        &gather_grad_case("0xi64", "0x3xf32", 0, "4, 3", "4x3xf32"),
        Some(vec![
            Tensor::from_i64(DType::I64, vec![0], vec![]),
            input(&[0, 3], 7),
        ]),
    );
}

#[test]
fn gather_grad_half_precision() {
    for t in ["f16", "bf16"] {
        let src = gather_grad_case(
            "3x5xi64",
            &format!("3x5x8x{t}"),
            0,
            "4, 8",
            &format!("4x8x{t}"),
        );
        let d = if t == "f16" { DType::F16 } else { DType::BF16 };
        let m = parse(&src);
        check_with(
            &m,
            "f",
            vec![
                idx(DType::I64, &[3, 5], 8, -4, 4),
                uniform(d, &[3, 5, 8], 9, -2.0, 2.0),
            ],
            // Summed in f32 then rounded once; the interpreter sums in f64.
            1e-2,
        );
    }
}

#[test]
fn gather_grad_out_of_range_is_dropped() {
    let src = gather_grad_case("3xi64", "3x2xf32", 0, "2, 2", "2x2xf32");
    let m = parse(&src);
    let (nm, dir) = compile(&m);
    let ind = Tensor::from_i64(DType::I64, vec![3], vec![1, 7, -1]);
    let dy = Tensor::from_f32(vec![3, 2], vec![1.0, 2.0, 30.0, 40.0, 5.0, 6.0]);
    let got = nm.call("f", &[&ind, &dy], None).expect("native call");
    let want = Tensor::from_f32(vec![2, 2], vec![0.0, 0.0, 6.0, 8.0]);
    assert_close(&got[0], &want, 0.0, "out-of-range gather_grad");
    cleanup(dir);
}

// ---- expand / tile / pad ----

fn unary_case(kind: &str, attrs: &str, in_ty: &str, out_ty: &str) -> String {
    module(
        &format!("%x: tensor<{in_ty}>"),
        &format!(r#"%y = "pp.{kind}"(%x) {{{attrs}}} : (tensor<{in_ty}>) -> tensor<{out_ty}>"#),
        &format!("tensor<{out_ty}>"),
        "%y",
    )
}

#[test]
fn expand_bidirectional_broadcast() {
    for (attrs, in_ty, out_ty) in [
        ("shape = [2, 1, 6]", "3x1xf32", "2x3x6xf32"),
        // `shape` of lower rank than x, with 1s keeping x's sizes.
        ("shape = [3, 1]", "2x3x4xf32", "2x3x4xf32"),
        ("shape = [1, 5]", "4x1xf32", "4x5xf32"),
        // A scalar to a matrix.
        ("shape = [3, 2]", "f32", "3x2xf32"),
        // Size-1 dims on both sides.
        ("shape = [1, 4, 1, 2]", "3x1x5x1xf32", "3x4x5x2xf32"),
        // Only new unit dims: a reshape.
        ("shape = [1, 1, 1]", "2x3xf32", "1x2x3xf32"),
        // To an empty tensor.
        ("shape = [0, 1]", "1x3xf32", "0x3xf32"),
    ] {
        check(&unary_case("expand", attrs, in_ty, out_ty), None);
    }
    each_dtype(
        &unary_case("expand", "shape = [2, 1, 4]", "3x1x$T", "2x3x4x$T"),
        &ALL,
    );
}

#[test]
fn tile_repeats() {
    for (attrs, in_ty, out_ty) in [
        ("repeats = [2, 3]", "2x3xf32", "4x9xf32"),
        ("repeats = [1, 2, 3]", "2x3x4xf32", "2x6x12xf32"),
        ("repeats = [3, 1]", "1x5xf32", "3x5xf32"),
        ("repeats = [4]", "3xf32", "12xf32"),
        ("repeats = [1, 1]", "3x2xf32", "3x2xf32"),
        ("repeats = [2, 0]", "3x2xf32", "6x0xf32"),
        ("repeats = []", "f32", "f32"),
    ] {
        check(&unary_case("tile", attrs, in_ty, out_ty), None);
    }
    each_dtype(
        &unary_case("tile", "repeats = [2, 1, 3]", "2x3x2x$T", "4x3x6x$T"),
        &ALL,
    );
}

#[test]
fn pad_constant_with_value_and_cropping() {
    for (attrs, in_ty, out_ty) in [
        ("pads = [1, 2, 3, 0]", "3x4xf32", "7x6xf32"),
        (
            "pads = [0, 1, 2, 0, 1, -1], value = -1.5",
            "2x3x4xf32",
            "2x5x5xf32",
        ),
        // Cropping only.
        ("pads = [-1, 0, -1, -2]", "4x5xf32", "2x3xf32"),
        // Cropping on one side, padding on the other.
        (
            "pads = [-2, 3, 1, -1], mode = \"constant\", value = 7.0",
            "4x5xf32",
            "3x7xf32",
        ),
        // Everything cropped away but padding remains: only the fill value.
        ("pads = [-3, 2], value = 2.5", "3xf32", "2xf32"),
        // Nothing to pad.
        ("pads = [0, 0, 0, 0]", "3x4xf32", "3x4xf32"),
        ("pads = []", "f32", "f32"),
    ] {
        check(&unary_case("pad", attrs, in_ty, out_ty), None);
    }
}

#[test]
fn pad_reflect_and_edge() {
    for mode in ["reflect", "edge"] {
        for (pads, in_ty, out_ty) in [
            ("[1, 2, 2, 1]", "3x4xf32", "6x7xf32"),
            // Pads wider than the input: reflect wraps several times.
            ("[7, 0, 5, 0]", "3x4xf32", "15x4xf32"),
            ("[0, 9, 0, 6]", "3x2xf32", "3x17xf32"),
            // A size-1 axis repeats its only element.
            ("[2, 3, 1, 1]", "1x3xf32", "4x7xf32"),
            // Crop on one side, pad on the other.
            ("[-1, 2, 3, -2]", "4x5xf32", "6x5xf32"),
            ("[0, 0, 2, 0, 0, 3]", "2x3x4xf32", "2x3x9xf32"),
        ] {
            let attrs = format!("pads = {pads}, mode = \"{mode}\"");
            check(&unary_case("pad", &attrs, in_ty, out_ty), None);
        }
    }
}

#[test]
fn pad_every_dtype_and_mode() {
    for mode in ["constant", "reflect", "edge"] {
        each_dtype(
            &unary_case(
                "pad",
                &format!("pads = [1, 0, 2, 1], mode = \"{mode}\", value = 2.75"),
                "3x4x$T",
                "6x5x$T",
            ),
            &ALL,
        );
    }
    // Integer fill values truncate and wrap as the interpreter's; bool is "!= 0" of that.
    for (t, value) in [
        ("i8", "300.0"),
        ("i32", "-2.9"),
        ("i64", "1e30"),
        ("i1", "0.5"),
        ("i1", "-3.0"),
        ("f16", "70000.0"),
    ] {
        check(
            &unary_case(
                "pad",
                &format!("pads = [1, 1], value = {value}"),
                &format!("3x{t}"),
                &format!("5x{t}"),
            ),
            None,
        );
    }
}

// ---- transpose, reshapes, constant ----

#[test]
fn transpose_and_reshapes_every_dtype() {
    let src = r#"
module {
  func @f(%x: tensor<2x3x4x$T>, %s: tensor<$T>, %u: tensor<1x5x1x$T>) -> (tensor<4x2x3x$T>, tensor<6x4x$T>, tensor<3x1x2x4x$T>, tensor<2x1x$T>, tensor<5x$T>, tensor<1x1x5x1x$T>, tensor<1x$T>, tensor<5x1x1x$T>, tensor<4x3x2x$T>) {
    %t = "pp.transpose"(%x) {perm = [2, 0, 1]} : (tensor<2x3x4x$T>) -> tensor<4x2x3x$T>
    %f = "pp.flatten"(%x) {axis = 2} : (tensor<2x3x4x$T>) -> tensor<6x4x$T>
    %r = "pp.reshape"(%t) {shape = [3, 1, 2, -1]} : (tensor<4x2x3x$T>) -> tensor<3x1x2x4x$T>
    %q = "pp.unsqueeze"(%s) {axes = [0, -1]} : (tensor<$T>) -> tensor<1x1x$T>
    %q2 = "pp.expand"(%q) {shape = [2, 1]} : (tensor<1x1x$T>) -> tensor<2x1x$T>
    %sq = "pp.squeeze"(%u) : (tensor<1x5x1x$T>) -> tensor<5x$T>
    %us = "pp.unsqueeze"(%sq) {axes = [0, 1, -1]} : (tensor<5x$T>) -> tensor<1x1x5x1x$T>
    %fs = "pp.flatten"(%s) {axis = 0} : (tensor<$T>) -> tensor<1x1x$T>
    %fr = "pp.reshape"(%fs) {shape = [1]} : (tensor<1x1x$T>) -> tensor<1x$T>
    %ut = "pp.transpose"(%u) {perm = [1, 2, 0]} : (tensor<1x5x1x$T>) -> tensor<5x1x1x$T>
    %rt = "pp.transpose"(%x) : (tensor<2x3x4x$T>) -> tensor<4x3x2x$T>
    return %t, %f, %r, %q2, %sq, %us, %fr, %ut, %rt : tensor<4x2x3x$T>, tensor<6x4x$T>, tensor<3x1x2x4x$T>, tensor<2x1x$T>, tensor<5x$T>, tensor<1x1x5x1x$T>, tensor<1x$T>, tensor<5x1x1x$T>, tensor<4x3x2x$T>
  }
}
"#;
    each_dtype(src, &ALL);
}

#[test]
fn reshapes_of_empty_tensors() {
    let src = r#"
module {
  func @f(%x: tensor<2x0x3xf32>) -> (tensor<0x6xf32>, tensor<3x0x2xf32>) {
    %r = "pp.reshape"(%x) {shape = [-1, 6]} : (tensor<2x0x3xf32>) -> tensor<0x6xf32>
    %t = "pp.transpose"(%x) {perm = [2, 1, 0]} : (tensor<2x0x3xf32>) -> tensor<3x0x2xf32>
    return %r, %t : tensor<0x6xf32>, tensor<3x0x2xf32>
  }
}
"#;
    check(src, None);
}

fn constant_case(lit: &str, ty: &str) -> String {
    module(
        "",
        &format!(r#"%c = "pp.constant"() {{value = {lit} : tensor<{ty}>}} : () -> tensor<{ty}>"#),
        &format!("tensor<{ty}>"),
        "%c",
    )
}

#[test]
fn constants_of_every_dtype() {
    for (lit, ty) in [
        ("dense<[1.5, -2.0, 3.25, 0.0, 1e-3, -7.0]>", "2x3xf32"),
        (
            "dense<[1.0e-300, -2.5, 3.0, 1.0000000000000002]>",
            "2x2xf64",
        ),
        ("dense<[0.1, 65504.0, -3.0]>", "3xf16"),
        ("dense<[0.1, -3.0e38]>", "2xbf16"),
        (
            "dense<[-9223372036854775808, 9223372036854775807, 0, -1, 5, 6]>",
            "3x2xi64",
        ),
        ("dense<[1, -2, 3, 2147483647]>", "2x2xi32"),
        ("dense<[-128, 127, 0]>", "3x1xi8"),
        ("dense<[true, false, false, true]>", "2x2xi1"),
        // Splats and scalars.
        ("dense<[4.0, 4.0, 4.0]>", "3xf32"),
        ("dense<[true, true]>", "2xi1"),
        ("dense<[2.5]>", "f32"),
        ("dense<[-3]>", "i64"),
        ("dense<[false]>", "i1"),
        ("dense<[-2.0]>", "f64"),
        ("dense<[7]>", "i8"),
        // Non-finite values.
        ("dense<[inf, -inf, 1.0]>", "3xf32"),
        ("dense<[nan, 2.0]>", "2xf64"),
        // Empty.
        ("dense<[]>", "0x3xf32"),
        ("dense<[]>", "2x0xi64"),
    ] {
        check(&constant_case(lit, ty), Some(vec![]));
    }
}

#[test]
fn constants_feed_other_ops() {
    let src = r#"
module {
  func @f(%x: tensor<2x3xi64>) -> (tensor<2x5xi64>, tensor<3x2xi1>) {
    %c = "pp.constant"() {value = dense<[7, -8, 9, 10]> : tensor<2x2xi64>} : () -> tensor<2x2xi64>
    %y = "pp.concat"(%x, %c) {axis = 1} : (tensor<2x3xi64>, tensor<2x2xi64>) -> tensor<2x5xi64>
    %b = "pp.constant"() {value = dense<[true, false, true, true, false, false]> : tensor<2x3xi1>} : () -> tensor<2x3xi1>
    %t = "pp.transpose"(%b) : (tensor<2x3xi1>) -> tensor<3x2xi1>
    return %y, %t : tensor<2x5xi64>, tensor<3x2xi1>
  }
}
"#;
    check(src, None);
}

#[test]
fn bad_attributes_are_errors_not_panics() {
    // Valid text that the verifier would reject, lowered directly: lowering must report,
    // never panic.
    for (kind, attrs, in_ty, out_ty) in [
        (
            "slice",
            "starts = [0], ends = [2], steps = [0]",
            "4xf32",
            "2xf32",
        ),
        ("slice", "starts = [0, 1], ends = [2]", "4xf32", "2xf32"),
        ("tile", "repeats = [2]", "2x3xf32", "4x3xf32"),
        ("pad", "pads = [1, 1], mode = \"wrap\"", "3xf32", "5xf32"),
        ("pad", "pads = [-3, -2]", "3xf32", "0xf32"),
        ("pad", "pads = [1, 1], mode = \"edge\"", "0xf32", "2xf32"),
        ("expand", "shape = [3]", "2xf32", "3xf32"),
        ("split", "split = [1, 1]", "3xf32", "1xf32"),
    ] {
        let src = unary_case(kind, attrs, in_ty, out_ty);
        let m = ppir::text::parse_module(&src).expect("parse");
        let r = lower_function(&m.functions[0]);
        assert!(r.is_err(), "{kind} {{{attrs}}} lowered");
    }
}

#[test]
fn constant_cast_to_the_declared_dtype() {
    // The verifier makes the result type the value's; the interpreter (and the lowering)
    // still cast a value of another dtype as `cast` does. Parsed without verification.
    for (lit, vty, rty) in [
        ("dense<[1.5, -2.7, 300.0, 0.0]>", "4xf32", "4xi8"),
        ("dense<[1.5, -2.7, 0.0, 1e-30]>", "2x2xf32", "2x2xi1"),
        ("dense<[3, -9223372036854775807]>", "2xi64", "2xf32"),
        ("dense<[70000, -1]>", "2xi64", "2xi32"),
        ("dense<[0.1, 2.5]>", "2xf64", "2xf16"),
    ] {
        let src = module(
            "",
            &format!(
                r#"%c = "pp.constant"() {{value = {lit} : tensor<{vty}>}} : () -> tensor<{rty}>"#
            ),
            &format!("tensor<{rty}>"),
            "%c",
        );
        check_with(&parse_stage(&src), "f", vec![], 1e-5);
    }
}

// ---- randomized sweeps against the interpreter ----

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next() % (hi - lo + 1) as u64) as i64
    }
}

fn ints_text(v: &[i64]) -> String {
    format!(
        "[{}]",
        v.iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

fn infer_one(kind: ppir::OpKind, attrs: &ppir::Attrs, x: &str) -> String {
    let ty = ppir::text::parse_type(x).expect("type");
    ppir::shape::infer(kind, attrs, &[ty]).expect("infer")[0].to_string()
}

#[test]
fn slice_and_slice_grad_sweep() {
    use ppir::{Attr, Attrs, OpKind};
    let mut rng = Rng(42);
    let shape = [5i64, 7, 3];
    let x_ty = "tensor<5x7x3xf32>";
    for _ in 0..24 {
        let n = rng.range(1, 3) as usize;
        let mut axes: Vec<i64> = Vec::new();
        while axes.len() < n {
            let a = rng.range(0, 2);
            if !axes.contains(&a) {
                axes.push(a);
            }
        }
        let mut starts = Vec::new();
        let mut ends = Vec::new();
        let mut steps = Vec::new();
        for &a in &axes {
            let d = shape[a as usize];
            let pick = |rng: &mut Rng| match rng.range(0, 9) {
                0 => i64::MAX,
                1 => i64::MIN,
                _ => rng.range(-d - 2, d + 2),
            };
            starts.push(pick(&mut rng));
            ends.push(pick(&mut rng));
            let s = rng.range(1, 3);
            steps.push(if rng.range(0, 1) == 0 { s } else { -s });
        }
        // Negative axes half the time.
        let axes: Vec<i64> = axes
            .iter()
            .map(|&a| if rng.range(0, 1) == 0 { a } else { a - 3 })
            .collect();
        let attrs = Attrs::new()
            .with("starts", Attr::Ints(starts.clone()))
            .with("ends", Attr::Ints(ends.clone()))
            .with("axes", Attr::Ints(axes.clone()))
            .with("steps", Attr::Ints(steps.clone()));
        let y_ty = infer_one(OpKind::Slice, &attrs, x_ty);
        let text = format!(
            "starts = {}, ends = {}, axes = {}, steps = {}",
            ints_text(&starts),
            ints_text(&ends),
            ints_text(&axes),
            ints_text(&steps)
        );
        let src = format!(
            r#"
module {{
  func @f(%x: {x_ty}) -> ({y_ty}, {x_ty}) {{
    %y = "pp.slice"(%x) {{{text}}} : ({x_ty}) -> {y_ty}
    %dx = "pp.slice_grad"(%y) {{{text}, input_shape = [5, 7, 3]}} : ({y_ty}) -> {x_ty}
    return %y, %dx : {y_ty}, {x_ty}
  }}
}}
"#
        );
        check(&src, None);
    }
}

#[test]
fn pad_sweep() {
    use ppir::{Attr, Attrs, OpKind};
    let mut rng = Rng(7);
    let x_ty = "tensor<3x4x2xi32>";
    for mode in ["constant", "reflect", "edge"] {
        for _ in 0..8 {
            let pads: Vec<i64> = (0..6).map(|_| rng.range(-1, 6)).collect();
            let attrs = Attrs::new()
                .with("pads", Attr::Ints(pads.clone()))
                .with("mode", Attr::Str(mode.into()))
                .with("value", Attr::Float(-5.0));
            let y_ty = infer_one(OpKind::Pad, &attrs, x_ty);
            let src = unary_case(
                "pad",
                &format!(
                    "pads = {}, mode = \"{mode}\", value = -5.0",
                    ints_text(&pads)
                ),
                "3x4x2xi32",
                y_ty.trim_start_matches("tensor<").trim_end_matches('>'),
            );
            check(&src, None);
        }
    }
}
