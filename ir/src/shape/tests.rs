use super::*;
use crate::attr::Attr;
use crate::module::{ArgKind, NewOp};

/// `"2x?x3xf32"` → tensor type; `"f32"` is a scalar.
fn ty(s: &str) -> TensorType {
    let parts: Vec<&str> = s.split('x').collect();
    let (dtype, dims) = parts.split_last().unwrap();
    let dims = dims
        .iter()
        .map(|d| {
            if *d == "?" {
                Dim::Batch
            } else {
                Dim::Known(d.parse().unwrap())
            }
        })
        .collect();
    TensorType::new(DType::from_name(dtype).unwrap(), dims)
}

fn ints(v: &[i64]) -> Attr {
    Attr::Ints(v.to_vec())
}

fn run(kind: OpKind, attrs: &Attrs, ops: &[&str]) -> Result<Vec<TensorType>, ShapeError> {
    let ops: Vec<TensorType> = ops.iter().map(|s| ty(s)).collect();
    infer(kind, attrs, &ops)
}

/// The single result, as `tensor<...>` text.
fn ok(kind: OpKind, attrs: Attrs, ops: &[&str]) -> String {
    match run(kind, &attrs, ops) {
        Ok(r) => {
            assert_eq!(r.len(), 1, "{kind}: {r:?}");
            r[0].to_string()
        }
        Err(e) => panic!("{kind} {ops:?}: unexpected error: {e}"),
    }
}

fn err(kind: OpKind, attrs: Attrs, ops: &[&str]) -> String {
    match run(kind, &attrs, ops) {
        Ok(r) => panic!("{kind} {ops:?}: expected an error, got {r:?}"),
        Err(e) => e.0,
    }
}

fn a() -> Attrs {
    Attrs::new()
}

use OpKind::*;

#[test]
fn arity() {
    assert_eq!(
        err(Relu, a(), &["2xf32", "2xf32"]),
        "expects 1 operand, found 2"
    );
    assert_eq!(
        err(Gemm, a(), &["2x2xf32"]),
        "expects 2 to 3 operands, found 1"
    );
    assert_eq!(
        err(Concat, a().with("axis", Attr::Int(0)), &[]),
        "expects at least 1 operand, found 0"
    );
    assert_eq!(
        err(Constant, a(), &["2xf32"]),
        "expects 0 operands, found 1"
    );
}

#[test]
fn unary() {
    assert_eq!(ok(Relu, a(), &["?x3xf32"]), "tensor<?x3xf32>");
    assert_eq!(ok(Relu, a(), &["4xi32"]), "tensor<4xi32>");
    assert_eq!(
        err(Exp, a(), &["2xi64"]),
        "operand 0 must have a float element type, got tensor<2xi64>"
    );
    assert_eq!(
        err(Abs, a(), &["2xi1"]),
        "operand 0 must have a numeric (not i1) element type, got tensor<2xi1>"
    );
    assert_eq!(ok(Not, a(), &["2xi1"]), "tensor<2xi1>");
    assert_eq!(
        err(Not, a(), &["2xf32"]),
        "operand 0 must have the i1 element type, got tensor<2xf32>"
    );
    assert_eq!(ok(Identity, a(), &["i1"]), "tensor<i1>");
    assert_eq!(
        ok(Cast, a().with("to", Attr::DType(DType::I64)), &["?x3xf32"]),
        "tensor<?x3xi64>"
    );
    assert_eq!(
        err(Cast, a(), &["3xf32"]),
        "attribute `to`: expected an element type, found nothing (it is required)"
    );
    assert_eq!(
        err(Cast, a().with("to", Attr::Int(3)), &["3xf32"]),
        "attribute `to`: expected an element type, found integer"
    );
    assert_eq!(
        ok(
            Gelu,
            a().with("approximate", Attr::Str("tanh".into())),
            &["3xbf16"]
        ),
        "tensor<3xbf16>"
    );
    assert_eq!(
        err(
            Gelu,
            a().with("approximate", Attr::Str("fast".into())),
            &["3xf32"]
        ),
        "'approximate' must be \"none\" or \"tanh\", found \"fast\""
    );
    assert_eq!(
        ok(Dropout, a().with("ratio", Attr::Float(0.1)), &["2x2xf16"]),
        "tensor<2x2xf16>"
    );
    assert_eq!(
        err(Dropout, a().with("ratio", Attr::Float(1.5)), &["2xf32"]),
        "'ratio' must be in [0, 1), found 1.5"
    );
}

#[test]
fn broadcasting() {
    assert_eq!(ok(Add, a(), &["2x3xf32", "3xf32"]), "tensor<2x3xf32>");
    assert_eq!(ok(Mul, a(), &["?x1x4xf32", "3x1xf32"]), "tensor<?x3x4xf32>");
    assert_eq!(ok(Sub, a(), &["?xf32", "?xf32"]), "tensor<?xf32>");
    assert_eq!(ok(Div, a(), &["?x4xf32", "1x4xf32"]), "tensor<?x4xf32>");
    assert_eq!(ok(Div, a(), &["?x4xf32", "5x4xf32"]), "tensor<5x4xf32>");
    assert_eq!(ok(Max, a(), &["f64", "2x0xf64"]), "tensor<2x0xf64>");
    assert_eq!(
        err(Add, a(), &["2x3xf32", "4xf32"]),
        "cannot broadcast tensor<2x3xf32> with tensor<4xf32>"
    );
    assert_eq!(
        err(Add, a(), &["3x?xf32", "4x1xf32"]),
        "cannot broadcast tensor<3x?xf32> with tensor<4x1xf32>"
    );
    assert_eq!(
        err(Add, a(), &["3xf32", "3xf64"]),
        "operand 1 has element type f64 but operand 0 has f32"
    );
    assert_eq!(ok(Pow, a(), &["2x3xf32", "i64"]), "tensor<2x3xf32>");
    assert_eq!(
        broadcast_shapes(&ty("?x1xf32").dims, &ty("1x5xf32").dims).unwrap(),
        vec![Dim::Batch, Dim::Known(5)]
    );
}

#[test]
fn comparisons_and_logic() {
    assert_eq!(ok(Less, a(), &["?x3xf32", "3xf32"]), "tensor<?x3xi1>");
    assert_eq!(ok(Equal, a(), &["2xi1", "2xi1"]), "tensor<2xi1>");
    assert_eq!(
        err(Greater, a(), &["2xi1", "2xi1"]),
        "operand 0 must have a numeric (not i1) element type, got tensor<2xi1>"
    );
    assert_eq!(ok(And, a(), &["2x1xi1", "3xi1"]), "tensor<2x3xi1>");
    assert_eq!(
        err(Or, a(), &["2xi1", "2xf32"]),
        "operand 1 must have the i1 element type, got tensor<2xf32>"
    );
}

#[test]
fn where_and_prelu() {
    assert_eq!(
        ok(Where, a(), &["?x1x1xi1", "3x1xf32", "4xf32"]),
        "tensor<?x3x4xf32>"
    );
    assert_eq!(
        err(Where, a(), &["2xf32", "2xf32", "2xf32"]),
        "operand 0 must have the i1 element type, got tensor<2xf32>"
    );
    assert_eq!(
        err(Where, a(), &["2xi1", "2xf32", "2xf64"]),
        "operand 2 has element type f64 but operand 1 has f32"
    );
    assert_eq!(
        err(Where, a(), &["2xi1", "3xf32", "1xf32"]),
        "cannot broadcast tensor<2xi1>, tensor<3xf32> and tensor<1xf32>"
    );
    assert_eq!(
        ok(PRelu, a(), &["?x3x8x8xf32", "3x1x1xf32"]),
        "tensor<?x3x8x8xf32>"
    );
    assert_eq!(ok(PRelu, a(), &["?x3xf32", "1xf32"]), "tensor<?x3xf32>");
    assert_eq!(
        err(PRelu, a(), &["2x3xf32", "2x1x3xf32"]),
        "slope tensor<2x1x3xf32> does not broadcast to the input tensor<2x3xf32>"
    );
    assert_eq!(
        err(PRelu, a(), &["2x3xf32", "4xf32"]),
        "slope tensor<4xf32> does not broadcast to the input tensor<2x3xf32>"
    );
}

#[test]
fn matmul() {
    assert_eq!(
        ok(MatMul, a(), &["?x784xf32", "784x10xf32"]),
        "tensor<?x10xf32>"
    );
    assert_eq!(ok(MatMul, a(), &["3xf32", "3xf32"]), "tensor<f32>");
    assert_eq!(ok(MatMul, a(), &["3xf32", "2x3x4xf32"]), "tensor<2x4xf32>");
    assert_eq!(ok(MatMul, a(), &["2x3x4xf32", "4xf32"]), "tensor<2x3xf32>");
    assert_eq!(
        ok(MatMul, a(), &["2x1x3x4xf32", "5x4x6xf32"]),
        "tensor<2x5x3x6xf32>"
    );
    assert_eq!(
        ok(MatMul, a(), &["?x8x16xf32", "16x?xf32"]),
        "tensor<?x8x?xf32>"
    );
    assert_eq!(
        err(MatMul, a(), &["8x784xf32", "512x10xf32"]),
        "inner dimensions differ: 784 vs 512"
    );
    assert_eq!(
        err(MatMul, a(), &["2x3x4xf32", "5x4x6xf32"]),
        "batch dimensions [2] of tensor<2x3x4xf32> and [5] of tensor<5x4x6xf32> do not broadcast"
    );
    assert_eq!(
        err(MatMul, a(), &["f32", "3xf32"]),
        "matmul operands must have rank >= 1, got tensor<f32> and tensor<3xf32>"
    );
    assert_eq!(
        err(MatMul, a(), &["2x3xf32", "3x2xf16"]),
        "operand 1 has element type f16 but operand 0 has f32"
    );
}

#[test]
fn gemm() {
    let t = |ta, tb| {
        a().with("trans_a", Attr::Int(ta))
            .with("trans_b", Attr::Int(tb))
    };
    assert_eq!(
        ok(Gemm, a(), &["?x784xf32", "784x10xf32", "10xf32"]),
        "tensor<?x10xf32>"
    );
    assert_eq!(
        ok(Gemm, t(1, 1), &["784x8xf32", "10x784xf32"]),
        "tensor<8x10xf32>"
    );
    assert_eq!(
        ok(Gemm, t(0, 1), &["8x784xf32", "10x784xf32", "1x10xf32"]),
        "tensor<8x10xf32>"
    );
    assert_eq!(
        err(Gemm, t(0, 1), &["8x784xf32", "784x10xf32"]),
        "inner dimensions differ: 784 vs 10"
    );
    assert_eq!(
        err(Gemm, a(), &["8x4xf32", "4x10xf32", "8x1x10xf32"]),
        "operand 2 tensor<8x1x10xf32> does not broadcast to the result shape [8, 10]"
    );
    assert_eq!(
        err(Gemm, a(), &["4xf32", "4x10xf32"]),
        "operand 0 of gemm must be 2-D, got tensor<4xf32>"
    );
    assert_eq!(
        err(Gemm, t(2, 0), &["4x4xf32", "4x4xf32"]),
        "'trans_a' must be 0 or 1, found 2"
    );
}

#[test]
fn conv() {
    let attrs = |s: &[i64], p: &[i64]| a().with("strides", ints(s)).with("pads", ints(p));
    // ResNet stem.
    assert_eq!(
        ok(
            Conv,
            attrs(&[2, 2], &[3, 3, 3, 3]),
            &["?x3x224x224xf32", "64x3x7x7xf32", "64xf32"]
        ),
        "tensor<?x64x112x112xf32>"
    );
    // Asymmetric pads, non-square input.
    assert_eq!(
        ok(
            Conv,
            attrs(&[1, 2], &[0, 1, 2, 0]),
            &["1x3x10x9xf32", "8x3x3x3xf32"]
        ),
        "tensor<1x8x10x4xf32>"
    );
    // Depthwise.
    let dw = attrs(&[1, 1], &[1, 1, 1, 1]).with("group", Attr::Int(32));
    assert_eq!(
        ok(Conv, dw, &["2x32x16x16xf32", "32x1x3x3xf32"]),
        "tensor<2x32x16x16xf32>"
    );
    // 1-D and 3-D with dilations.
    assert_eq!(
        ok(
            Conv,
            a().with("dilations", ints(&[2])),
            &["4x2x20xf32", "6x2x5xf32"]
        ),
        "tensor<4x6x12xf32>"
    );
    let d3 = a()
        .with("dilations", ints(&[1, 2, 3]))
        .with("strides", ints(&[1, 1, 2]));
    assert_eq!(
        ok(Conv, d3, &["1x4x8x9x10xf64", "2x4x3x3x3xf64"]),
        "tensor<1x2x6x5x2xf64>"
    );
    assert_eq!(
        err(Conv, a(), &["1x6x8x8xf32", "4x3x3x3xf32"]),
        "input has 6 channels but weight dim 1 (3) x group (1) is 3"
    );
    assert_eq!(
        err(
            Conv,
            a().with("group", Attr::Int(2)),
            &["1x6x8x8xf32", "5x3x3x3xf32"]
        ),
        "5 output channels are not divisible by group 2"
    );
    assert_eq!(
        err(Conv, a(), &["1x3x8x8xf32", "4x3x3x3xf32", "5xf32"]),
        "bias tensor<5xf32> must be [4], one entry per output channel"
    );
    assert_eq!(
        err(
            Conv,
            a().with("strides", ints(&[1, 1, 1])),
            &["1x3x8x8xf32", "4x3x3x3xf32"]
        ),
        "'strides' has 3 entries but the input has 2 spatial dims (expected 2)"
    );
    assert_eq!(
        err(Conv, a(), &["1x3x2x8xf32", "4x3x3x3xf32"]),
        "spatial dim 0: padded input size 2 is smaller than the dilated kernel size 3"
    );
    assert_eq!(
        err(Conv, a(), &["1x3x8xf32", "4x3x3x3xf32"]),
        "weight tensor<4x3x3x3xf32> has rank 4 but the input tensor<1x3x8xf32> has rank 3"
    );
    assert_eq!(err(Conv, a(), &["3x8xf32", "4x3x3xf32"]), "operand 0 of conv must be [N, C, spatial..] with at least one spatial dim, got tensor<3x8xf32>");
    assert_eq!(
        err(
            Conv,
            a().with("strides", ints(&[0, 1])),
            &["1x3x8x8xf32", "4x3x3x3xf32"]
        ),
        "'strides' entry 0 is 0; it must be >= 1"
    );
    assert_eq!(
        err(Conv, a(), &["1x3x8x8xi32", "4x3x3x3xi32"]),
        "operand 0 must have a float element type, got tensor<1x3x8x8xi32>"
    );
    // A `?` spatial dim survives a size-preserving window only.
    assert_eq!(
        ok(Conv, attrs(&[1], &[1, 1]), &["1x3x?xf32", "4x3x3xf32"]),
        "tensor<1x4x?xf32>"
    );
    assert_eq!(
        err(Conv, a(), &["1x3x?xf32", "4x3x3xf32"]),
        "spatial dim 0 needs a known size, but it is the batch dimension `?`"
    );
}

#[test]
fn conv_transpose() {
    let up = a()
        .with("strides", ints(&[2, 2]))
        .with("pads", ints(&[1, 1, 1, 1]))
        .with("output_padding", ints(&[1, 1]));
    assert_eq!(
        ok(
            ConvTranspose,
            up.clone(),
            &["?x16x5x5xf32", "16x8x3x3xf32", "8xf32"]
        ),
        "tensor<?x8x10x10xf32>"
    );
    let grouped = up.with("group", Attr::Int(2));
    assert_eq!(
        ok(
            ConvTranspose,
            grouped,
            &["1x16x5x5xf32", "16x8x3x3xf32", "16xf32"]
        ),
        "tensor<1x16x10x10xf32>"
    );
    assert_eq!(
        ok(ConvTranspose, a(), &["1x4x7xf32", "4x2x3xf32"]),
        "tensor<1x2x9xf32>"
    );
    let dil = a()
        .with("dilations", ints(&[2]))
        .with("strides", ints(&[3]));
    assert_eq!(
        ok(ConvTranspose, dil, &["1x4x7xf32", "4x2x3xf32"]),
        "tensor<1x2x23xf32>"
    );
    assert_eq!(
        err(ConvTranspose, a(), &["1x4x7xf32", "3x2x3xf32"]),
        "input has 4 channels but weight dim 0 is 3"
    );
    assert_eq!(
        err(ConvTranspose, a(), &["1x4x7xf32", "4x2x3xf32", "4xf32"]),
        "bias tensor<4xf32> must be [2], one entry per output channel"
    );
    let crop = a().with("pads", ints(&[3, 3]));
    assert_eq!(
        err(ConvTranspose, crop, &["1x4x2xf32", "4x2x3xf32"]),
        "spatial dim 0: output size would be -2"
    );
}

#[test]
fn pools() {
    let mp = |k: &[i64], s: &[i64], p: &[i64]| {
        a().with("kernel_shape", ints(k))
            .with("strides", ints(s))
            .with("pads", ints(p))
    };
    assert_eq!(
        ok(
            MaxPool,
            mp(&[3, 3], &[2, 2], &[1, 1, 1, 1]),
            &["?x64x112x112xf32"]
        ),
        "tensor<?x64x56x56xf32>"
    );
    assert_eq!(
        ok(MaxPool, mp(&[3], &[2], &[0, 0]), &["1x1x6xf32"]),
        "tensor<1x1x2xf32>"
    );
    let ceil = |m: Attrs| m.with("ceil_mode", Attr::Int(1));
    assert_eq!(
        ok(MaxPool, ceil(mp(&[3], &[2], &[0, 0])), &["1x1x6xf32"]),
        "tensor<1x1x3xf32>"
    );
    // The last window would start in the right padding only: dropped.
    assert_eq!(
        ok(MaxPool, ceil(mp(&[1], &[2], &[0, 1])), &["1x1x3xf32"]),
        "tensor<1x1x2xf32>"
    );
    let dil = mp(&[2, 2], &[1, 1], &[0, 0, 0, 0]).with("dilations", ints(&[2, 3]));
    assert_eq!(ok(MaxPool, dil, &["1x2x5x7xf32"]), "tensor<1x2x3x4xf32>");
    assert_eq!(
        ok(
            AvgPool,
            mp(&[2, 2, 2], &[2, 2, 2], &[0, 0, 0, 0, 0, 0]),
            &["1x2x4x6x8xf16"]
        ),
        "tensor<1x2x2x3x4xf16>"
    );
    assert_eq!(
        err(MaxPool, a(), &["1x1x6xf32"]),
        "attribute `kernel_shape`: expected an integer list, found nothing (it is required)"
    );
    assert_eq!(
        err(MaxPool, mp(&[3, 3], &[1], &[0, 0]), &["1x1x6xf32"]),
        "'kernel_shape' has 2 entries but the input has 1 spatial dims"
    );
    assert_eq!(
        err(AvgPool, mp(&[2], &[1], &[0, 0]), &["1x1x6xi32"]),
        "operand 0 must have a float element type, got tensor<1x1x6xi32>"
    );
    assert_eq!(
        ok(GlobalAvgPool, a(), &["?x512x7x7xf32"]),
        "tensor<?x512x1x1xf32>"
    );
    assert_eq!(
        ok(GlobalMaxPool, a(), &["2x3x4x5x6xf32"]),
        "tensor<2x3x1x1x1xf32>"
    );
    assert_eq!(
        err(GlobalAvgPool, a(), &["2x3xf32"]),
        "operand 0 ([N, C, spatial..]) must have rank >= 3, got tensor<2x3xf32>"
    );
}

#[test]
fn normalisation() {
    assert_eq!(
        ok(
            BatchNorm,
            a(),
            &["?x64x8x8xf32", "64xf32", "64xf32", "64xf32", "64xf32"]
        ),
        "tensor<?x64x8x8xf32>"
    );
    assert_eq!(
        err(
            BatchNorm,
            a(),
            &["?x64x8x8xf32", "64xf32", "32xf32", "64xf32", "64xf32"]
        ),
        "operand 2 (bias) must be [64], one entry per channel of the input, got tensor<32xf32>"
    );
    assert_eq!(
        ok(InstanceNorm, a(), &["2x3x5xf32", "3xf32", "3xf32"]),
        "tensor<2x3x5xf32>"
    );
    assert_eq!(
        err(InstanceNorm, a(), &["2x3x5xf32", "3x1xf32", "3xf32"]),
        "operand 1 (scale) must be [3], one entry per channel of the input, got tensor<3x1xf32>"
    );
    assert_eq!(
        ok(LayerNorm, a(), &["?x16x32xf32", "32xf32", "32xf32"]),
        "tensor<?x16x32xf32>"
    );
    assert_eq!(
        ok(
            LayerNorm,
            a().with("axis", Attr::Int(1)),
            &["?x16x32xf32", "16x32xf32"]
        ),
        "tensor<?x16x32xf32>"
    );
    assert_eq!(
        err(
            LayerNorm,
            a().with("axis", Attr::Int(-1)),
            &["?x16x32xf32", "16x32xf32"]
        ),
        "operand 1 (scale) tensor<16x32xf32> does not broadcast to the normalised shape [32]"
    );
    assert_eq!(
        ok(Lrn, a().with("size", Attr::Int(5)), &["1x96x55x55xf32"]),
        "tensor<1x96x55x55xf32>"
    );
    assert_eq!(
        err(Lrn, a(), &["1x96x55x55xf32"]),
        "attribute `size`: expected an integer, found nothing (it is required)"
    );
    assert_eq!(ok(Softmax, a(), &["?x10xf32"]), "tensor<?x10xf32>");
    assert_eq!(
        ok(LogSoftmax, a().with("axis", Attr::Int(-2)), &["?x10xf32"]),
        "tensor<?x10xf32>"
    );
    assert_eq!(
        err(Softmax, a().with("axis", Attr::Int(2)), &["?x10xf32"]),
        "'axis' = 2 is out of range for rank 2 (valid: -2 to 1)"
    );
}

#[test]
fn reductions() {
    let r = |axes: &[i64], keep: i64| {
        a().with("axes", ints(axes))
            .with("keepdims", Attr::Int(keep))
    };
    assert_eq!(
        ok(ReduceMean, r(&[2, 3], 1), &["?x64x7x7xf32"]),
        "tensor<?x64x1x1xf32>"
    );
    assert_eq!(
        ok(ReduceSum, r(&[-1, 1], 0), &["?x3x4x5xf32"]),
        "tensor<?x4xf32>"
    );
    assert_eq!(ok(ReduceMax, a(), &["2x3xi32"]), "tensor<1x1xi32>");
    assert_eq!(ok(ReduceMin, r(&[], 0), &["2x3xf32"]), "tensor<f32>");
    assert_eq!(
        err(ReduceSum, r(&[1, -1], 1), &["2x3xf32"]),
        "'axes' = [1, -1] names axis 1 twice"
    );
    assert_eq!(
        err(ReduceSum, r(&[2], 1), &["2x3xf32"]),
        "'axes' entry 0 = 2 is out of range for rank 2 (valid: -2 to 1)"
    );
}

#[test]
fn reshape() {
    let s = |v: &[i64]| a().with("shape", ints(v));
    assert_eq!(ok(Reshape, s(&[-1, 4]), &["2x3x4xf32"]), "tensor<6x4xf32>");
    assert_eq!(
        ok(Reshape, s(&[3, -1, 2]), &["2x3x4xf32"]),
        "tensor<3x4x2xf32>"
    );
    assert_eq!(
        ok(Reshape, s(&[-1, 12]), &["?x3x4xf32"]),
        "tensor<?x12xf32>"
    );
    assert_eq!(
        ok(Reshape, s(&[8, 784]), &["?x28x28xf32"]),
        "tensor<8x784xf32>"
    );
    assert_eq!(
        err(Reshape, s(&[4, 2]), &["2x3xf32"]),
        "cannot reshape tensor<2x3xf32> (6 elements) to [4, 2] (8 elements)"
    );
    assert_eq!(
        err(Reshape, s(&[4, -1]), &["2x3xf32"]),
        "cannot reshape tensor<2x3xf32> (6 elements) to [4, -1]: 6 is not a multiple of 4"
    );
    assert_eq!(
        err(Reshape, s(&[3, 5]), &["?x784xf32"]),
        "cannot reshape tensor<?x784xf32> to [3, 5]: 15 elements is not a multiple of 784"
    );
    assert_eq!(
        err(Reshape, s(&[-1, -1]), &["2x3xf32"]),
        "'shape' = [-1, -1] has more than one -1"
    );
    assert_eq!(
        err(Reshape, s(&[0, 3]), &["2x3xf32"]),
        "'shape' entry 0 is 0; a frontend must resolve ONNX's copy-this-dim 0"
    );
    assert_eq!(
        err(Reshape, s(&[-2, 3]), &["2x3xf32"]),
        "'shape' entry 0 is -2; sizes must be positive or -1"
    );
    assert_eq!(
        err(Reshape, a(), &["2x3xf32"]),
        "attribute `shape`: expected an integer list, found nothing (it is required)"
    );
}

#[test]
fn transpose() {
    assert_eq!(ok(Transpose, a(), &["2x?x4xf32"]), "tensor<4x?x2xf32>");
    assert_eq!(
        ok(
            Transpose,
            a().with("perm", ints(&[0, 2, 1])),
            &["2x3x4xf32"]
        ),
        "tensor<2x4x3xf32>"
    );
    assert_eq!(
        ok(
            Transpose,
            a().with("perm", ints(&[-1, 0, 1])),
            &["2x3x4xf32"]
        ),
        "tensor<4x2x3xf32>"
    );
    assert_eq!(
        err(
            Transpose,
            a().with("perm", ints(&[0, 1, 2, 3])),
            &["2x3x4xf32"]
        ),
        "operand 0 has 3 dims but 'perm' has 4 entries"
    );
    assert_eq!(
        err(
            Transpose,
            a().with("perm", ints(&[0, 0, 1])),
            &["2x3x4xf32"]
        ),
        "'perm' = [0, 0, 1] names axis 0 twice"
    );
}

#[test]
fn concat() {
    let ax = |v| a().with("axis", Attr::Int(v));
    assert_eq!(
        ok(Concat, ax(1), &["?x3xf32", "?x5xf32", "1x2xf32"]),
        "tensor<1x10xf32>"
    );
    assert_eq!(
        ok(Concat, ax(-1), &["?x3xf32", "?x5xf32"]),
        "tensor<?x8xf32>"
    );
    assert_eq!(ok(Concat, ax(0), &["?x3xf32"]), "tensor<?x3xf32>");
    assert_eq!(
        ok(Concat, ax(0), &["2x3xf32", "4x3xf32"]),
        "tensor<6x3xf32>"
    );
    assert_eq!(
        err(Concat, ax(0), &["?x3xf32", "?x3xf32"]),
        "concat along dim 0 (operand 0) needs a known size, but it is the batch dimension `?`"
    );
    assert_eq!(
        err(Concat, ax(1), &["2x3xf32", "4x3xf32"]),
        "operand 1 dim 0 is 4 but operand 0 has 2"
    );
    assert_eq!(
        err(Concat, ax(0), &["2x3xf32", "3xf32"]),
        "operand 1 has rank 1 but operand 0 has rank 2"
    );
    assert_eq!(
        err(Concat, ax(0), &["2xf32", "3xi64"]),
        "operand 1 has element type i64 but operand 0 has f32"
    );
    assert_eq!(
        err(Concat, a(), &["2xf32"]),
        "attribute `axis`: expected an integer, found nothing (it is required)"
    );
}

#[test]
fn split() {
    let sp = |axis, s: &[i64]| a().with("axis", Attr::Int(axis)).with("split", ints(s));
    let r = run(Split, &sp(1, &[2, 4, 0]), &["?x6xf32"]).unwrap();
    let r: Vec<String> = r.iter().map(|t| t.to_string()).collect();
    assert_eq!(r, ["tensor<?x2xf32>", "tensor<?x4xf32>", "tensor<?x0xf32>"]);
    assert_eq!(
        err(Split, sp(1, &[2, 3]), &["?x6xf32"]),
        "'split' sizes [2, 3] sum to 5 but dim 1 of tensor<?x6xf32> has size 6"
    );
    assert_eq!(
        err(Split, sp(0, &[4, 4]), &["?x6xf32"]),
        "split along dim 0 needs a known size, but it is the batch dimension `?`"
    );
    assert_eq!(
        err(Split, sp(0, &[]), &["6xf32"]),
        "'split' must have at least one entry"
    );
    assert_eq!(
        err(Split, sp(0, &[7, -1]), &["6xf32"]),
        "'split' entry 1 is -1; sizes must be >= 0"
    );
}

#[test]
fn slice() {
    let sl = |starts: &[i64], ends: &[i64], axes: Option<&[i64]>, steps: Option<&[i64]>| {
        let mut m = a().with("starts", ints(starts)).with("ends", ints(ends));
        if let Some(x) = axes {
            m = m.with("axes", ints(x));
        }
        if let Some(x) = steps {
            m = m.with("steps", ints(x));
        }
        m
    };
    let (max, min) = (i64::MAX, i64::MIN);
    assert_eq!(
        ok(Slice, sl(&[1, -5], &[max, -1], None, None), &["10x20xf32"]),
        "tensor<9x4xf32>"
    );
    assert_eq!(
        ok(
            Slice,
            sl(&[-1], &[min], Some(&[0]), Some(&[-1])),
            &["10xf32"]
        ),
        "tensor<10xf32>"
    );
    assert_eq!(
        ok(Slice, sl(&[8], &[1], None, Some(&[-2])), &["10xf32"]),
        "tensor<4xf32>"
    );
    assert_eq!(
        ok(Slice, sl(&[100], &[200], None, None), &["10xf32"]),
        "tensor<0xf32>"
    );
    assert_eq!(
        ok(Slice, sl(&[-100], &[3], None, None), &["10xf32"]),
        "tensor<3xf32>"
    );
    assert_eq!(
        ok(
            Slice,
            sl(&[0], &[max], Some(&[-1]), Some(&[3])),
            &["4x10xf32"]
        ),
        "tensor<4x4xf32>"
    );
    assert_eq!(
        ok(Slice, sl(&[5], &[2], None, None), &["10xf32"]),
        "tensor<0xf32>"
    );
    assert_eq!(
        ok(Slice, sl(&[max], &[min], None, Some(&[-3])), &["10xf32"]),
        "tensor<4xf32>"
    );
    assert_eq!(
        ok(
            Slice,
            sl(&[0, 1], &[max, 3], Some(&[0, 1]), None),
            &["?x5xf32"]
        ),
        "tensor<?x2xf32>"
    );
    assert_eq!(
        ok(Slice, sl(&[-1], &[min], None, Some(&[-1])), &["?x5xf32"]),
        "tensor<?x5xf32>"
    );
    assert_eq!(
        err(Slice, sl(&[0], &[4], None, None), &["?x5xf32"]),
        "slicing dim 0 with [0:4:1] needs a known size, but it is the batch dimension `?`"
    );
    assert_eq!(
        err(Slice, sl(&[0], &[4], None, Some(&[0])), &["5xf32"]),
        "'steps' entry 0 is 0"
    );
    assert_eq!(
        err(Slice, sl(&[0], &[4, 5], None, None), &["5xf32"]),
        "'starts' has 1 entries but 'ends' has 2"
    );
    assert_eq!(
        err(
            Slice,
            sl(&[0, 0], &[1, 1], Some(&[1, -1]), None),
            &["5x5xf32"]
        ),
        "'axes' = [1, -1] names axis 1 twice"
    );
}

#[test]
fn gather() {
    let ax = |v| a().with("axis", Attr::Int(v));
    assert_eq!(
        ok(Gather, ax(1), &["5x4x3xf32", "2x7xi64"]),
        "tensor<5x2x7x3xf32>"
    );
    assert_eq!(ok(Gather, ax(-1), &["?x4x3xf32", "i32"]), "tensor<?x4xf32>");
    assert_eq!(
        ok(Gather, a(), &["1000x64xf32", "?x16xi64"]),
        "tensor<?x16x64xf32>"
    );
    assert_eq!(
        err(Gather, a(), &["5xf32", "2xf32"]),
        "operand 1 must have an integer element type, got tensor<2xf32>"
    );
    assert_eq!(
        err(Gather, ax(3), &["5x4x3xf32", "2xi64"]),
        "'axis' = 3 is out of range for rank 3 (valid: -3 to 2)"
    );
}

#[test]
fn expand_pad_tile() {
    let sh = |v: &[i64]| a().with("shape", ints(v));
    assert_eq!(
        ok(Expand, sh(&[2, 1, 6]), &["3x1xf32"]),
        "tensor<2x3x6xf32>"
    );
    assert_eq!(ok(Expand, sh(&[1, 5]), &["?x1xf32"]), "tensor<?x5xf32>");
    assert_eq!(ok(Expand, sh(&[3]), &["2x1xf32"]), "tensor<2x3xf32>");
    assert_eq!(
        err(Expand, sh(&[4]), &["3xf32"]),
        "cannot broadcast tensor<3xf32> with shape [4]"
    );

    let pd = |v: &[i64]| a().with("pads", ints(v));
    assert_eq!(
        ok(Pad, pd(&[0, 0, 1, 2, 0, 0, 1, 0]), &["?x3x4x4xf32"]),
        "tensor<?x3x6x6xf32>"
    );
    assert_eq!(
        ok(Pad, pd(&[0, -1, 0, -1]), &["3x4xf32"]),
        "tensor<3x2xf32>"
    );
    assert_eq!(
        err(Pad, pd(&[0, -3, 0, -2]), &["3x4xf32"]),
        "padding dim 1 (size 4) by -3 and -2 gives a negative size -1"
    );
    assert_eq!(
        err(Pad, pd(&[0, 0]), &["3x4xf32"]),
        "operand 0 has 2 dims but 'pads' has 2 entries (expected 4)"
    );
    assert_eq!(
        err(Pad, pd(&[1, 0]), &["?xf32"]),
        "padding dim 0 by 1 and 0 needs a known size, but it is the batch dimension `?`"
    );
    assert_eq!(
        err(
            Pad,
            pd(&[0, 0]).with("mode", Attr::Str("wrap".into())),
            &["3xf32"]
        ),
        "'mode' must be \"constant\", \"reflect\" or \"edge\", found \"wrap\""
    );

    let rp = |v: &[i64]| a().with("repeats", ints(v));
    assert_eq!(ok(Tile, rp(&[1, 3]), &["?x4xf32"]), "tensor<?x12xf32>");
    assert_eq!(ok(Tile, rp(&[2, 0]), &["3x4xf32"]), "tensor<6x0xf32>");
    assert_eq!(
        err(Tile, rp(&[2]), &["3x4xf32"]),
        "operand 0 has 2 dims but 'repeats' has 1 entries"
    );
    assert_eq!(
        err(Tile, rp(&[2, 1]), &["?x4xf32"]),
        "tiling dim 0 by 2 needs a known size, but it is the batch dimension `?`"
    );
}

#[test]
fn squeeze_unsqueeze_flatten() {
    let ax = |v: &[i64]| a().with("axes", ints(v));
    assert_eq!(ok(Squeeze, a(), &["?x1x3x1xf32"]), "tensor<?x3xf32>");
    assert_eq!(
        ok(Squeeze, ax(&[-1]), &["?x1x3x1xf32"]),
        "tensor<?x1x3xf32>"
    );
    assert_eq!(
        err(Squeeze, ax(&[2]), &["?x1x3x1xf32"]),
        "cannot squeeze dim 2 of tensor<?x1x3x1xf32>: its size is 3, not 1"
    );
    assert_eq!(
        err(Squeeze, ax(&[0]), &["?x1xf32"]),
        "squeezing dim 0 needs a known size, but it is the batch dimension `?`"
    );
    assert_eq!(
        ok(Unsqueeze, ax(&[0, -1]), &["3x4xf32"]),
        "tensor<1x3x4x1xf32>"
    );
    assert_eq!(
        ok(Unsqueeze, ax(&[1, 3]), &["?x4xf32"]),
        "tensor<?x1x4x1xf32>"
    );
    assert_eq!(ok(Unsqueeze, ax(&[0]), &["f32"]), "tensor<1xf32>");
    assert_eq!(
        err(Unsqueeze, ax(&[4]), &["3x4xf32"]),
        "'axes' entry 0 = 4 is out of range for rank 3 (valid: -3 to 2)"
    );
    assert_eq!(
        err(Unsqueeze, a(), &["3x4xf32"]),
        "attribute `axes`: expected an integer list, found nothing (it is required)"
    );

    let fl = |v| a().with("axis", Attr::Int(v));
    assert_eq!(ok(Flatten, a(), &["?x3x4xf32"]), "tensor<?x12xf32>");
    assert_eq!(ok(Flatten, fl(0), &["2x3x4xf32"]), "tensor<1x24xf32>");
    assert_eq!(ok(Flatten, fl(3), &["2x3x4xf32"]), "tensor<24x1xf32>");
    assert_eq!(ok(Flatten, fl(-1), &["2x3x4xf32"]), "tensor<6x4xf32>");
    assert_eq!(
        err(Flatten, fl(2), &["?x3x4xf32"]),
        "flattening [?, 3] of tensor<?x3x4xf32> multiplies the batch dimension `?` by other sizes; this needs a known batch size"
    );
    assert_eq!(
        err(Flatten, fl(4), &["2x3x4xf32"]),
        "'axis' = 4 is out of range for rank 3 (valid: -3 to 3)"
    );
}

#[test]
fn constant_and_comm() {
    let value = crate::tensor::Tensor::from_i64(DType::I64, vec![2, 2], vec![1, 2, 3, 4]);
    assert_eq!(
        ok(Constant, a().with("value", Attr::Tensor(value)), &[]),
        "tensor<2x2xi64>"
    );
    assert_eq!(
        err(Constant, a(), &[]),
        "attribute `value`: expected a tensor, found nothing (it is required)"
    );
    assert_eq!(run(Send, &a(), &["?x3xf32"]).unwrap(), vec![]);
    assert!(err(Recv, a(), &[]).contains("given by its result annotation"));
}

/// Every kind, odd operands and odd attributes: errors are fine, panics are not.
#[test]
fn never_panics() {
    let shapes = [
        "f32",
        "0xf32",
        "?xf32",
        "1x1x1xf32",
        "?x3x5x5xf32",
        "2x3x4xi64",
        "2x?x1x?xi1",
        "3x0x2x2x2xf64",
    ];
    let attr_sets: Vec<Attrs> = vec![
        a(),
        a().with("axis", Attr::Int(-7))
            .with("axes", ints(&[5, -9]))
            .with("perm", ints(&[2, 1])),
        a().with("shape", ints(&[-1, 3]))
            .with("split", ints(&[1, 1]))
            .with("kernel_shape", ints(&[1, 1])),
        a().with("pads", ints(&[i64::MAX, i64::MIN, 0, 0]))
            .with("strides", ints(&[i64::MAX])),
        a().with("starts", ints(&[i64::MIN]))
            .with("ends", ints(&[i64::MAX]))
            .with("steps", ints(&[i64::MIN])),
        a().with("repeats", ints(&[i64::MAX, 2, 3]))
            .with("dilations", ints(&[0, 0]))
            .with("group", Attr::Int(0)),
        a().with("axis", Attr::Str("x".into()))
            .with("shape", Attr::Float(1.0))
            .with("to", Attr::DType(DType::I8)),
    ];
    for &kind in OpKind::ALL {
        for attrs in &attr_sets {
            for n in 0..4 {
                for start in 0..shapes.len() {
                    let ops: Vec<&str> = (0..n)
                        .map(|i| shapes[(start + i * 3) % shapes.len()])
                        .collect();
                    let _ = run(kind, attrs, &ops);
                }
            }
        }
    }
}

// ---- whole functions ----

fn mlp(x_ty: &str) -> Function {
    let mut f = Function::new("main");
    let x = f.add_arg("x", ty(x_ty), ArgKind::Input);
    let w = f.add_arg("w", ty("784x10xf32"), ArgKind::Param);
    let b = f.add_arg("b", ty("10xf32"), ArgKind::Param);
    let h = f
        .push(NewOp::new(OpKind::MatMul, vec![x, w], vec![ty("?x10xf32")]).names(vec!["h".into()]));
    let y =
        f.push(NewOp::new(OpKind::Add, vec![h, b], vec![ty("?x10xf32")]).names(vec!["y".into()]));
    let z = f.push(NewOp::new(OpKind::Relu, vec![y], vec![ty("?x10xf32")]).names(vec!["z".into()]));
    f.set_results(vec![z]);
    f
}

#[test]
fn infer_function_propagates_a_new_argument_type() {
    let mut f = mlp("?x784xf32");
    let x = f.find_value("x").unwrap();
    f.set_type(x, ty("8x784xf32"));
    infer_function(&mut f).unwrap();
    assert_eq!(f.result_types(), vec![ty("8x10xf32")]);
    assert_eq!(f.ty(f.find_value("h").unwrap()), &ty("8x10xf32"));

    f.set_type(x, ty("8x512xf32"));
    let e = infer_function(&mut f).unwrap_err();
    assert_eq!(
        e.to_string(),
        "%h = \"pp.matmul\": inner dimensions differ: 512 vs 784"
    );
    assert_eq!(e.error.0, "inner dimensions differ: 512 vs 784");
}

#[test]
fn infer_function_keeps_recv_types_and_names_the_location() {
    let mut f = Function::new("stage1");
    let r = f.push(
        NewOp::new(OpKind::Recv, vec![], vec![ty("?x4xf32")])
            .attrs(a().with("peer", Attr::Int(0)).with("channel", Attr::Int(0))),
    );
    let w = f.add_arg("w", ty("5x4xf32"), ArgKind::Param);
    let y = f.push(NewOp::new(OpKind::MatMul, vec![r, w], vec![ty("?x4xf32")]).loc("fc2/MatMul"));
    f.set_results(vec![y]);
    let e = infer_function(&mut f).unwrap_err();
    assert_eq!(
        e.to_string(),
        "%1 = \"pp.matmul\" (loc \"fc2/MatMul\"): inner dimensions differ: 4 vs 5"
    );
    assert_eq!(e.loc.as_deref(), Some("fc2/MatMul"));
    assert_eq!(f.ty(r), &ty("?x4xf32"));
}

#[test]
fn bind_batch_binds_arguments_and_recvs() {
    let mut m = Module::new();
    m.functions.push(mlp("?x784xf32"));
    let mut g = Function::new("g");
    let r = g.push(
        NewOp::new(OpKind::Recv, vec![], vec![ty("?x10xf32")])
            .attrs(a().with("peer", Attr::Int(0)).with("channel", Attr::Int(0))),
    );
    let s = g.push(NewOp::new(OpKind::Softmax, vec![r], vec![ty("?x10xf32")]));
    g.set_results(vec![s]);
    m.functions.push(g);
    bind_batch(&mut m, 16).unwrap();
    assert_eq!(m.functions[0].result_types(), vec![ty("16x10xf32")]);
    assert_eq!(
        m.functions[0].ty(m.functions[0].find_value("x").unwrap()),
        &ty("16x784xf32")
    );
    assert_eq!(m.functions[1].result_types(), vec![ty("16x10xf32")]);
    assert_eq!(
        bind_batch(&mut m, 0).unwrap_err(),
        BindBatchError::ZeroBatch
    );

    let mut m = Module::new();
    let mut f = Function::new("f");
    let x = f.add_arg("x", ty("?x6xf32"), ArgKind::Input);
    let attrs = a().with("axis", Attr::Int(0)).with("split", ints(&[4, 4]));
    let op = f.push_op(
        NewOp::new(OpKind::Split, vec![x], vec![ty("?x6xf32"), ty("?x6xf32")])
            .names(vec!["p".into()])
            .attrs(attrs),
    );
    let _ = op;
    m.functions.push(f);
    assert_eq!(
        bind_batch(&mut m, 4).unwrap_err().to_string(),
        "@f: %p = \"pp.split\": 'split' sizes [4, 4] sum to 8 but dim 0 of tensor<4x6xf32> has size 4"
    );
}

#[test]
fn results_too_large_to_count() {
    // 2^32 x 2^32 elements: the count wraps to 0 in u64 arithmetic.
    let big = Attrs::new().with("shape", ints(&[1 << 32, 1 << 32]));
    let e = run(OpKind::Expand, &big, &["1x1xf32"]).unwrap_err();
    assert!(
        e.0.starts_with("the result is too large: shape tensor<4294967296x4294967296xf32>"),
        "{e}"
    );
    let reps = Attrs::new().with("repeats", ints(&[1 << 31, 1 << 31]));
    assert!(run(OpKind::Tile, &reps, &["4x4xf32"]).is_err());
    // Representable but huge is the memory check's business, not shape inference's.
    let huge = Attrs::new().with("shape", ints(&[2_000_000, 4_000_000]));
    assert_eq!(
        ok(OpKind::Expand, huge, &["1x1xf32"]),
        "tensor<2000000x4000000xf32>"
    );
}

#[test]
fn bind_batch_refuses_an_overflowing_argument() {
    let mut f = Function::new("main");
    let x = f.add_arg("x", ty("?x1152921504606846976xf32"), ArgKind::Input);
    let y = f.push(NewOp::new(
        OpKind::Relu,
        vec![x],
        vec![ty("?x1152921504606846976xf32")],
    ));
    f.set_results(vec![y]);
    let mut m = Module::new();
    m.functions.push(f);
    let e = bind_batch(&mut m, 4).unwrap_err();
    assert!(matches!(e, BindBatchError::Size { .. }), "{e}");
    assert!(
        e.to_string()
            .starts_with("@main: argument %x: shape tensor<4x1152921504606846976xf32>"),
        "{e}"
    );
}
