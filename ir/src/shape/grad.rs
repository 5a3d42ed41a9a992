//! Losses and the gradient helper ops that autodiff emits: `softmax_cross_entropy(_grad)`,
//! `max_pool_grad`, `avg_pool_grad`, `conv_grad_weight`, `gather_grad`, `slice_grad`.
//!
//! Each gradient op's result is the type of the forward operand it differentiates; the
//! incoming gradient `dy` must have the type the forward op would give, which is checked by
//! running the forward rule.

use super::{bail, check_elem, dims_str, min_rank, same_dtype, Elem, Res};
use crate::ops::attrs::{
    AvgPoolAttrs, AvgPoolGradAttrs, ConvAttrs, ConvGradWeightAttrs, GatherGradAttrs, MaxPoolAttrs,
    ReduceAttrs, SliceAttrs, SliceGradAttrs,
};
use crate::ops::OpKind;
use crate::types::{Dim, TensorType};

/// `dy` (operand `index`) must have the dims `expected` (what the forward op gives).
fn check_dy(dy: &TensorType, index: usize, expected: &TensorType) -> Res<()> {
    let ok = dy.rank() == expected.rank()
        && dy
            .dims
            .iter()
            .zip(&expected.dims)
            .all(|(a, b)| a.compatible(*b));
    if !ok {
        bail!(
            "operand {index} (the incoming gradient) is {dy} but the forward op gives {}",
            dims_str(&expected.dims)
        );
    }
    Ok(())
}

/// A shape attribute `name` of non-negative sizes, as a static type of `like`'s dtype.
fn shape_attr(shape: &[i64], name: &str, like: &TensorType) -> Res<TensorType> {
    if let Some((i, s)) = shape.iter().enumerate().find(|(_, &s)| s < 0) {
        bail!("'{name}' entry {i} is {s}; sizes must be >= 0");
    }
    Ok(TensorType::new(
        like.dtype,
        shape.iter().map(|&s| Dim::Known(s as u64)).collect(),
    ))
}

/// logits `[.., C]` and labels `[..]`.
fn logits_labels(ops: &[TensorType]) -> Res<()> {
    let (logits, labels) = (&ops[0], &ops[1]);
    check_elem(logits, 0, Elem::Float)?;
    min_rank(logits, 0, 1, "logits [.., C]")?;
    check_elem(labels, 1, Elem::Integer)?;
    let outer = &logits.dims[..logits.rank() - 1];
    let ok = labels.rank() == outer.len()
        && labels.dims.iter().zip(outer).all(|(a, b)| a.compatible(*b));
    if !ok {
        bail!(
            "labels {labels} must have the shape of the logits without the class axis, {}",
            dims_str(outer)
        );
    }
    Ok(())
}

pub(super) fn softmax_cross_entropy(ops: &[TensorType]) -> Res<TensorType> {
    logits_labels(ops)?;
    Ok(TensorType::scalar(ops[0].dtype))
}

pub(super) fn softmax_cross_entropy_grad(ops: &[TensorType]) -> Res<TensorType> {
    logits_labels(ops)?;
    same_dtype(ops, 0, 2)?;
    if ops[2].rank() != 0 {
        bail!(
            "operand 2 (the loss gradient) must be a scalar, got {}",
            ops[2]
        );
    }
    Ok(ops[0].clone())
}

/// `label_logit`: logits `[.., C]`, labels `[..]` → `[..]`.
pub(super) fn label_logit(ops: &[TensorType]) -> Res<TensorType> {
    logits_labels(ops)?;
    Ok(TensorType::new(
        ops[0].dtype,
        ops[0].dims[..ops[0].rank() - 1].to_vec(),
    ))
}

/// `log_sum_exp_grad`: x, y and dy of the `reduce_log_sum_exp` → x's type.
pub(super) fn log_sum_exp_grad(attrs: &ReduceAttrs, ops: &[TensorType]) -> Res<TensorType> {
    let (x, y, dy) = (&ops[0], &ops[1], &ops[2]);
    check_elem(x, 0, Elem::Float)?;
    same_dtype(ops, 0, 1)?;
    same_dtype(ops, 0, 2)?;
    let want = super::movement::reduce(OpKind::ReduceLogSumExp, attrs, x)?;
    check_dy(y, 1, &want)?;
    check_dy(dy, 2, &want)?;
    Ok(x.clone())
}

/// `label_logit_grad`: dy `[..]`, labels `[..]`, [base] → `[.., classes]`.
pub(super) fn label_logit_grad(classes: i64, ops: &[TensorType]) -> Res<TensorType> {
    let (dy, labels) = (&ops[0], &ops[1]);
    check_elem(dy, 0, Elem::Float)?;
    check_elem(labels, 1, Elem::Integer)?;
    if classes < 0 {
        bail!("'classes' is {classes}; it must be >= 0");
    }
    let ok = labels.rank() == dy.rank()
        && labels
            .dims
            .iter()
            .zip(&dy.dims)
            .all(|(a, b)| a.compatible(*b));
    if !ok {
        bail!("labels {labels} must have the shape of the incoming gradient {dy}");
    }
    let mut dims = dy.dims.clone();
    dims.push(Dim::Known(classes as u64));
    let out = TensorType::new(dy.dtype, dims);
    if let Some(base) = ops.get(2) {
        same_dtype(ops, 0, 2)?;
        check_dy(base, 2, &out)?;
    }
    Ok(out)
}

pub(super) fn max_pool_grad(attrs: &MaxPoolAttrs, ops: &[TensorType]) -> Res<TensorType> {
    let (x, dy) = (&ops[0], &ops[1]);
    check_elem(x, 0, Elem::Float)?;
    same_dtype(ops, 0, 1)?;
    let y = super::contraction::max_pool(attrs, x)?;
    check_dy(dy, 1, &y)?;
    Ok(x.clone())
}

pub(super) fn avg_pool_grad(attrs: &AvgPoolGradAttrs, dy: &TensorType) -> Res<TensorType> {
    check_elem(dy, 0, Elem::Float)?;
    let x = shape_attr(&attrs.input_shape, "input_shape", dy)?;
    let pool = AvgPoolAttrs::of_grad(attrs);
    let y = super::contraction::avg_pool(&pool, &x).map_err(|e| {
        super::ShapeError(format!("'input_shape' = {}: {}", dims_str(&x.dims), e.0))
    })?;
    check_dy(dy, 0, &y)?;
    Ok(x)
}

pub(super) fn conv_grad_weight(attrs: &ConvGradWeightAttrs, ops: &[TensorType]) -> Res<TensorType> {
    let (x, dy) = (&ops[0], &ops[1]);
    check_elem(x, 0, Elem::Float)?;
    same_dtype(ops, 0, 1)?;
    if x.rank() < 3 {
        bail!("operand 0 of conv_grad_weight must be [N, C, spatial..], got {x}");
    }
    let kernel = &attrs.kernel_shape;
    if kernel.len() != x.rank() - 2 {
        bail!(
            "'kernel_shape' has {} entries but the input has {} spatial dims",
            kernel.len(),
            x.rank() - 2
        );
    }
    if let Some((i, k)) = kernel
        .iter()
        .enumerate()
        .find(|(_, &k)| !(1..=i32::MAX as i64).contains(&k))
    {
        bail!("'kernel_shape' entry {i} is {k}; it must be >= 1");
    }
    let group = attrs.group;
    if group < 1 {
        bail!("'group' must be >= 1, found {group}");
    }
    if dy.rank() != x.rank() {
        bail!("operand 1 (the incoming gradient) {dy} must have the rank of the input {x}");
    }
    let (Some(c), Some(m)) = (x.dims[1].known(), dy.dims[1].known()) else {
        bail!("the channel dims of {x} and {dy} must be known");
    };
    if c % group as u64 != 0 {
        bail!("{c} input channels are not divisible by group {group}");
    }
    let mut w = vec![Dim::Known(m), Dim::Known(c / group as u64)];
    w.extend(kernel.iter().map(|&k| Dim::Known(k as u64)));
    let w = TensorType::new(x.dtype, w);
    let y = super::contraction::conv(&ConvAttrs::of_grad(attrs), &[x.clone(), w.clone()])?;
    check_dy(dy, 1, &y)?;
    Ok(w)
}

pub(super) fn gather_grad(attrs: &GatherGradAttrs, ops: &[TensorType]) -> Res<TensorType> {
    let (indices, dy) = (&ops[0], &ops[1]);
    check_elem(indices, 0, Elem::Integer)?;
    check_elem(dy, 1, Elem::Float)?;
    let data = shape_attr(&attrs.data_shape, "data_shape", dy)?;
    let y = super::movement::gather(attrs.axis, &data, indices).map_err(|e| {
        super::ShapeError(format!("'data_shape' = {}: {}", dims_str(&data.dims), e.0))
    })?;
    check_dy(dy, 1, &y)?;
    Ok(data)
}

pub(super) fn slice_grad(attrs: &SliceGradAttrs, dy: &TensorType) -> Res<TensorType> {
    check_elem(dy, 0, Elem::Float)?;
    let x = shape_attr(&attrs.input_shape, "input_shape", dy)?;
    let y = super::movement::slice(&SliceAttrs::of_grad(attrs), &x)?;
    check_dy(dy, 0, &y)?;
    Ok(x)
}

#[cfg(test)]
mod tests {
    use crate::attr::{Attr, Attrs};
    use crate::ops::OpKind::{self, *};
    use crate::shape::infer;
    use crate::text::parse_type;
    use crate::types::TensorType;

    fn t(s: &str) -> TensorType {
        parse_type(&format!("tensor<{s}>")).unwrap()
    }

    fn ints(v: &[i64]) -> Attr {
        Attr::Ints(v.to_vec())
    }

    fn ok(kind: OpKind, attrs: Attrs, ops: &[&str]) -> String {
        let ops: Vec<TensorType> = ops.iter().map(|s| t(s)).collect();
        match infer(kind, &attrs, &ops) {
            Ok(r) => r[0].to_string(),
            Err(e) => panic!("{kind}: {e}"),
        }
    }

    fn err(kind: OpKind, attrs: Attrs, ops: &[&str]) -> String {
        let ops: Vec<TensorType> = ops.iter().map(|s| t(s)).collect();
        match infer(kind, &attrs, &ops) {
            Ok(r) => panic!("{kind}: expected an error, got {r:?}"),
            Err(e) => e.0,
        }
    }

    #[test]
    fn cross_entropy() {
        let a = Attrs::new;
        assert_eq!(
            ok(SoftmaxCrossEntropy, a(), &["?x10xf32", "?xi64"]),
            "tensor<f32>"
        );
        assert_eq!(
            ok(SoftmaxCrossEntropy, a(), &["2x5x10xf64", "2x5xi32"]),
            "tensor<f64>"
        );
        assert!(err(SoftmaxCrossEntropy, a(), &["4x10xf32", "5xi64"])
            .contains("without the class axis"));
        assert!(err(SoftmaxCrossEntropy, a(), &["4x10xf32", "4xf32"]).contains("integer"));
        assert_eq!(
            ok(SoftmaxCrossEntropyGrad, a(), &["4x10xf32", "4xi64", "f32"]),
            "tensor<4x10xf32>"
        );
        assert!(err(
            SoftmaxCrossEntropyGrad,
            a(),
            &["4x10xf32", "4xi64", "1xf32"]
        )
        .contains("scalar"));
    }

    #[test]
    fn pool_grads() {
        let k = Attrs::new().with("kernel_shape", ints(&[2, 2]));
        assert_eq!(
            ok(MaxPoolGrad, k.clone(), &["2x3x4x4xf32", "2x3x3x3xf32"]),
            "tensor<2x3x4x4xf32>"
        );
        assert!(err(MaxPoolGrad, k.clone(), &["2x3x4x4xf32", "2x3x2x2xf32"])
            .contains("the forward op gives [2, 3, 3, 3]"));
        let avg = k.clone().with("input_shape", ints(&[2, 3, 4, 4]));
        assert_eq!(
            ok(AvgPoolGrad, avg.clone(), &["2x3x3x3xf32"]),
            "tensor<2x3x4x4xf32>"
        );
        assert!(err(AvgPoolGrad, k, &["2x3x3x3xf32"]).contains("attribute `input_shape`"));
        assert!(err(AvgPoolGrad, avg, &["2x3x2x3xf32"]).contains("incoming gradient"));
    }

    #[test]
    fn conv_grad_weight() {
        let a = Attrs::new()
            .with("kernel_shape", ints(&[3, 3]))
            .with("pads", ints(&[1, 1, 1, 1]))
            .with("strides", ints(&[2, 2]))
            .with("group", Attr::Int(2));
        assert_eq!(
            ok(ConvGradWeight, a.clone(), &["2x4x8x8xf32", "2x6x4x4xf32"]),
            "tensor<6x2x3x3xf32>"
        );
        assert!(
            err(ConvGradWeight, a.clone(), &["2x4x8x8xf32", "2x6x8x8xf32"])
                .contains("incoming gradient")
        );
        assert!(err(
            ConvGradWeight,
            Attrs::new(),
            &["2x4x8x8xf32", "2x6x8x8xf32"]
        )
        .contains("kernel_shape"));
    }

    #[test]
    fn gather_and_slice_grads() {
        let g = Attrs::new()
            .with("axis", Attr::Int(1))
            .with("data_shape", ints(&[3, 5, 2]));
        assert_eq!(
            ok(GatherGrad, g.clone(), &["4x7xi64", "3x4x7x2xf32"]),
            "tensor<3x5x2xf32>"
        );
        assert!(err(GatherGrad, g, &["4xi64", "3x4x7x2xf32"]).contains("incoming gradient"));
        let s = Attrs::new()
            .with("starts", ints(&[-1]))
            .with("ends", ints(&[i64::MIN]))
            .with("steps", ints(&[-2]))
            .with("input_shape", ints(&[5, 3]));
        assert_eq!(ok(SliceGrad, s.clone(), &["3x3xf32"]), "tensor<5x3xf32>");
        assert!(err(SliceGrad, s, &["2x3xf32"]).contains("incoming gradient"));
    }

    #[test]
    fn dropout_key() {
        let tr = Attrs::new()
            .with("training", Attr::Int(1))
            .with("seed", Attr::Int(3));
        assert_eq!(
            ok(Dropout, tr.clone(), &["?x4xf32", "2xi64"]),
            "tensor<?x4xf32>"
        );
        assert_eq!(ok(Dropout, tr.clone(), &["?x4xf32"]), "tensor<?x4xf32>");
        assert!(err(Dropout, tr.clone(), &["?x4xf32", "3xi64"]).contains("tensor<2xi64>"));
        assert!(err(Dropout, tr, &["?x4xf32", "2xi64", "2xi64"]).contains("expects 1 to 2"));
    }
}
