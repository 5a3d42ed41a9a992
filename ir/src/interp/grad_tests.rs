//! Tests of the loss and gradient helper ops and of training-mode dropout. Expected values
//! are worked out by hand; the adjoint checks compare against the *forward* ops (different
//! code): for a linear (or piecewise linear) forward op `f` and its gradient op `g`,
//! `Σ f(x)·dy = Σ x·g(dy)` exactly up to rounding.

use super::*;
use crate::attr::Attr;

fn f64t(shape: &[usize], data: &[f64]) -> Tensor {
    Tensor::from_f64(DType::F64, shape.to_vec(), data.to_vec())
}

fn i64t(shape: &[usize], data: &[i64]) -> Tensor {
    Tensor::from_i64(DType::I64, shape.to_vec(), data.to_vec())
}

/// Attributes as a list, for tables of cases.
type AttrList = Vec<(&'static str, Attr)>;

fn ints(v: &[i64]) -> Attr {
    Attr::Ints(v.to_vec())
}

fn attrs(list: &[(&str, Attr)]) -> Attrs {
    list.iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

fn ty(shape: &[usize]) -> TensorType {
    TensorType::of(
        DType::F64,
        &shape.iter().map(|&d| d as u64).collect::<Vec<_>>(),
    )
}

/// Evaluate a one-result op in f64.
fn eval1(kind: OpKind, a: &Attrs, inputs: &[&Tensor], shape: &[usize]) -> Tensor {
    let opts = InterpOptions {
        precision: Precision::F64,
    };
    eval_op(kind, a, inputs, &[ty(shape)], &opts)
        .unwrap_or_else(|e| panic!("{e}"))
        .remove(0)
}

fn eval_err(kind: OpKind, a: &Attrs, inputs: &[&Tensor], shape: &[usize]) -> String {
    match eval_op(kind, a, inputs, &[ty(shape)], &InterpOptions::default()) {
        Ok(_) => panic!("{kind} should have failed"),
        Err(e) => e.to_string(),
    }
}

#[track_caller]
fn assert_close(t: &Tensor, want: &[f64], tol: f64) {
    let got = t.as_f64().expect("float result");
    assert_eq!(got.len(), want.len(), "element count");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "element {i}: got {g}, want {w} (all: {got:?})"
        );
    }
}

/// Irregular values in about [-2, 2], different per seed (a small LCG).
fn noise(shape: &[usize], seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let data = (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 11) as f64 / (1u64 << 53) as f64) * 4.0 - 2.0
        })
        .collect::<Vec<_>>();
    f64t(shape, &data)
}

fn dot(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.shape, b.shape);
    a.as_f64()
        .unwrap()
        .iter()
        .zip(b.as_f64().unwrap())
        .map(|(x, y)| x * y)
        .sum()
}

#[track_caller]
fn assert_adjoint(lhs: f64, rhs: f64) {
    assert!(
        (lhs - rhs).abs() <= 1e-12 * (1.0 + lhs.abs()),
        "adjoint identity fails: {lhs} vs {rhs}"
    );
}

// ---- softmax cross-entropy ----

#[test]
fn softmax_cross_entropy_by_hand() {
    let logits = f64t(&[2, 3], &[0.0, 0.0, 0.0, 1.0, 2.0, 3.0]);
    let labels = i64t(&[2], &[0, 2]);
    let none = Attrs::new();
    // Row 0: log 3. Row 1: logsumexp([1,2,3]) - 3 = log(1 + e^-1 + e^-2).
    let row0 = 3f64.ln();
    let row1 = (1.0 + (-1f64).exp() + (-2f64).exp()).ln();
    let loss = eval1(OpKind::SoftmaxCrossEntropy, &none, &[&logits, &labels], &[]);
    assert_close(&loss, &[(row0 + row1) / 2.0], 1e-15);

    // ignore_index drops row 0 from the sum and the count.
    let ign = attrs(&[("ignore_index", Attr::Int(0))]);
    let loss = eval1(OpKind::SoftmaxCrossEntropy, &ign, &[&logits, &labels], &[]);
    assert_close(&loss, &[row1], 1e-15);
    let all_ignored = i64t(&[2], &[-100, -100]);
    let ign = attrs(&[("ignore_index", Attr::Int(-100))]);
    let loss = eval1(
        OpKind::SoftmaxCrossEntropy,
        &ign,
        &[&logits, &all_ignored],
        &[],
    );
    assert_close(&loss, &[0.0], 0.0);

    // [batch, seq, vocab]: the mean runs over all four positions.
    let l3 = f64t(&[2, 2, 2], &[0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0]);
    let lab = i64t(&[2, 2], &[0, 1, 0, 1]);
    let loss = eval1(OpKind::SoftmaxCrossEntropy, &none, &[&l3, &lab], &[]);
    let (a, b) = (2f64.ln(), (1.0 + (-1f64).exp()).ln());
    assert_close(&loss, &[(a + a + b + b) / 4.0], 1e-15);

    // Out-of-range labels are errors, negative ones too (unless ignored).
    let bad = i64t(&[2], &[0, 3]);
    let e = eval_err(OpKind::SoftmaxCrossEntropy, &none, &[&logits, &bad], &[]);
    assert!(e.contains("label 3 at position 1 is out of range"), "{e}");
    let bad = i64t(&[2], &[-1, 0]);
    let e = eval_err(OpKind::SoftmaxCrossEntropy, &none, &[&logits, &bad], &[]);
    assert!(e.contains("label -1"), "{e}");
}

#[test]
fn softmax_cross_entropy_grad_by_hand() {
    let logits = f64t(&[2, 3], &[0.0, 0.0, 0.0, 1.0, 2.0, 3.0]);
    let labels = i64t(&[2], &[0, 2]);
    let dloss = f64t(&[], &[2.0]);
    let g = eval1(
        OpKind::SoftmaxCrossEntropyGrad,
        &Attrs::new(),
        &[&logits, &labels, &dloss],
        &[2, 3],
    );
    // dloss / count = 1: softmax minus one-hot per row.
    let z = (1f64).exp() + (2f64).exp() + (3f64).exp();
    let want = [
        1.0 / 3.0 - 1.0,
        1.0 / 3.0,
        1.0 / 3.0,
        (1f64).exp() / z,
        (2f64).exp() / z,
        (3f64).exp() / z - 1.0,
    ];
    assert_close(&g, &want, 1e-15);
    // Ignored rows get 0; the count is 1, so the other row is scaled by 2.
    let ign = attrs(&[("ignore_index", Attr::Int(0))]);
    let g = eval1(
        OpKind::SoftmaxCrossEntropyGrad,
        &ign,
        &[&logits, &labels, &dloss],
        &[2, 3],
    );
    let want2: Vec<f64> = [0.0, 0.0, 0.0]
        .into_iter()
        .chain(want[3..].iter().map(|v| 2.0 * v))
        .collect();
    assert_close(&g, &want2, 1e-15);
}

// ---- pooling ----

#[test]
fn max_pool_grad_by_hand() {
    let x = f64t(
        &[1, 1, 3, 3],
        &[1.0, 5.0, 2.0, 5.0, 3.0, 0.0, 4.0, 4.0, 1.0],
    );
    let dy = f64t(&[1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let at = attrs(&[("kernel_shape", ints(&[2, 2]))]);
    // The windows' first maxima: 5 at (0,1) twice, 5 at (1,0), 4 at (2,1).
    let dx = eval1(OpKind::MaxPoolGrad, &at, &[&x, &dy], &[1, 1, 3, 3]);
    assert_close(&dx, &[0.0, 3.0, 0.0, 3.0, 0.0, 0.0, 0.0, 4.0, 0.0], 0.0);
    // Padding never wins, even against negative values.
    let neg = f64t(&[1, 1, 2, 2], &[-1.0, -2.0, -3.0, -4.0]);
    let at = attrs(&[
        ("kernel_shape", ints(&[2, 2])),
        ("strides", ints(&[2, 2])),
        ("pads", ints(&[1, 1, 1, 1])),
    ]);
    let dx = eval1(OpKind::MaxPoolGrad, &at, &[&neg, &dy], &[1, 1, 2, 2]);
    assert_close(&dx, &[1.0, 2.0, 3.0, 4.0], 0.0);
    // ceil_mode keeps a last, partial window.
    let row = f64t(&[1, 1, 1, 5], &[0.0, 1.0, 2.0, 3.0, 4.0]);
    let at = attrs(&[
        ("kernel_shape", ints(&[1, 2])),
        ("strides", ints(&[1, 2])),
        ("ceil_mode", Attr::Int(1)),
    ]);
    let dy3 = f64t(&[1, 1, 1, 3], &[1.0, 2.0, 3.0]);
    let dx = eval1(OpKind::MaxPoolGrad, &at, &[&row, &dy3], &[1, 1, 1, 5]);
    assert_close(&dx, &[0.0, 1.0, 0.0, 2.0, 3.0], 0.0);
    // Ties go to the first maximum.
    let ties = f64t(&[1, 1, 1, 3], &[2.0, 2.0, 2.0]);
    let at = attrs(&[("kernel_shape", ints(&[1, 3]))]);
    let dy1 = f64t(&[1, 1, 1, 1], &[5.0]);
    let dx = eval1(OpKind::MaxPoolGrad, &at, &[&ties, &dy1], &[1, 1, 1, 3]);
    assert_close(&dx, &[5.0, 0.0, 0.0], 0.0);
    // dy of the wrong shape.
    let e = eval_err(OpKind::MaxPoolGrad, &at, &[&ties, &dy3], &[1, 1, 1, 3]);
    assert!(e.contains("dy must have shape [1, 1, 1, 1]"), "{e}");
}

#[test]
fn avg_pool_grad_by_hand() {
    let at = attrs(&[
        ("kernel_shape", ints(&[2, 2])),
        ("input_shape", ints(&[1, 1, 3, 3])),
    ]);
    let dy = f64t(&[1, 1, 2, 2], &[4.0, 8.0, 12.0, 16.0]);
    let dx = eval1(OpKind::AvgPoolGrad, &at, &[&dy], &[1, 1, 3, 3]);
    assert_close(&dx, &[1.0, 3.0, 2.0, 4.0, 10.0, 6.0, 3.0, 7.0, 4.0], 1e-15);
    // Padding: windows cover 1, 2, 1 real cells; with count_include_pad every divisor is 2.
    let base = [
        ("kernel_shape", ints(&[1, 2])),
        ("pads", ints(&[0, 1, 0, 1])),
        ("input_shape", ints(&[1, 1, 1, 2])),
    ];
    let dy = f64t(&[1, 1, 1, 3], &[1.0, 2.0, 3.0]);
    let dx = eval1(OpKind::AvgPoolGrad, &attrs(&base), &[&dy], &[1, 1, 1, 2]);
    assert_close(&dx, &[2.0, 4.0], 1e-15);
    let mut incl = base.to_vec();
    incl.push(("count_include_pad", Attr::Int(1)));
    let dx = eval1(OpKind::AvgPoolGrad, &attrs(&incl), &[&dy], &[1, 1, 1, 2]);
    assert_close(&dx, &[1.5, 2.5], 1e-15);
}

/// Pool gradients are the adjoints of the forward pools, on strided, padded, dilated and
/// ceil-mode windows in 1 to 3 spatial dims.
#[test]
fn pool_grads_are_adjoints() {
    let cases: Vec<(Vec<usize>, AttrList)> = vec![
        (
            vec![2, 3, 7],
            vec![
                ("kernel_shape", ints(&[3])),
                ("strides", ints(&[2])),
                ("pads", ints(&[1, 2])),
            ],
        ),
        (
            vec![1, 2, 6, 5],
            vec![
                ("kernel_shape", ints(&[3, 2])),
                ("strides", ints(&[2, 2])),
                ("pads", ints(&[1, 0, 1, 1])),
                ("ceil_mode", Attr::Int(1)),
            ],
        ),
        (
            vec![1, 2, 7, 7],
            vec![
                ("kernel_shape", ints(&[2, 3])),
                ("dilations", ints(&[2, 1])),
                ("count_include_pad", Attr::Int(1)),
                ("pads", ints(&[1, 1, 1, 1])),
            ],
        ),
        (
            vec![1, 1, 4, 3, 5],
            vec![
                ("kernel_shape", ints(&[2, 2, 3])),
                ("strides", ints(&[1, 2, 2])),
            ],
        ),
    ];
    for (i, (shape, list)) in cases.into_iter().enumerate() {
        let at = attrs(&list);
        let x = noise(&shape, i as u64);
        for kind in [OpKind::MaxPool, OpKind::AvgPool] {
            let out_ty = crate::shape::infer(kind, &at, &[x.tensor_type()]).unwrap();
            let out_shape: Vec<usize> = out_ty[0]
                .static_shape()
                .unwrap()
                .iter()
                .map(|&d| d as usize)
                .collect();
            let y = eval1(kind, &at, &[&x], &out_shape);
            let dy = noise(&out_shape, 100 + i as u64);
            let dx = if kind == OpKind::MaxPool {
                eval1(OpKind::MaxPoolGrad, &at, &[&x, &dy], &shape)
            } else {
                let mut a = at.clone();
                let s: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
                a.set("input_shape", ints(&s));
                eval1(OpKind::AvgPoolGrad, &a, &[&dy], &shape)
            };
            assert_adjoint(dot(&y, &dy), dot(&x, &dx));
        }
    }
}

// ---- convolution weight gradient ----

#[test]
fn conv_grad_weight_by_hand() {
    let x = f64t(&[1, 1, 3, 3], &(0..9).map(|v| v as f64).collect::<Vec<_>>());
    let at = attrs(&[("kernel_shape", ints(&[2, 2]))]);
    let dy = f64t(&[1, 1, 2, 2], &[1.0, 0.0, 0.0, 0.0]);
    let dw = eval1(OpKind::ConvGradWeight, &at, &[&x, &dy], &[1, 1, 2, 2]);
    assert_close(&dw, &[0.0, 1.0, 3.0, 4.0], 0.0);
    let dy = f64t(&[1, 1, 2, 2], &[1.0, 1.0, 1.0, 1.0]);
    let dw = eval1(OpKind::ConvGradWeight, &at, &[&x, &dy], &[1, 1, 2, 2]);
    assert_close(&dw, &[8.0, 12.0, 20.0, 24.0], 0.0);
}

/// `Σ conv(x, w)·dy = Σ w·dw` (conv without bias is linear in w), with groups, strides,
/// padding and dilation in 1 to 3 spatial dims.
#[test]
fn conv_grad_weight_is_the_adjoint_of_conv() {
    let cases: Vec<(Vec<usize>, Vec<usize>, AttrList)> = vec![
        (
            vec![2, 4, 9],
            vec![6, 2, 3],
            vec![
                ("group", Attr::Int(2)),
                ("strides", ints(&[2])),
                ("pads", ints(&[1, 2])),
            ],
        ),
        (
            vec![2, 3, 6, 7],
            vec![4, 3, 3, 2],
            vec![
                ("strides", ints(&[2, 1])),
                ("pads", ints(&[1, 0, 2, 1])),
                ("dilations", ints(&[1, 2])),
            ],
        ),
        (
            vec![1, 2, 4, 5, 3],
            vec![2, 1, 2, 3, 2],
            vec![("group", Attr::Int(2)), ("pads", ints(&[0, 1, 1, 1, 0, 0]))],
        ),
    ];
    for (i, (xs, ws, list)) in cases.into_iter().enumerate() {
        let at = attrs(&list);
        let x = noise(&xs, i as u64);
        let w = noise(&ws, 50 + i as u64);
        let out = crate::shape::infer(OpKind::Conv, &at, &[x.tensor_type(), w.tensor_type()])
            .unwrap()[0]
            .static_shape()
            .unwrap()
            .iter()
            .map(|&d| d as usize)
            .collect::<Vec<_>>();
        let y = eval1(OpKind::Conv, &at, &[&x, &w], &out);
        let dy = noise(&out, 99 + i as u64);
        let mut ga = at.clone();
        let k: Vec<i64> = ws[2..].iter().map(|&d| d as i64).collect();
        ga.set("kernel_shape", ints(&k));
        let dw = eval1(OpKind::ConvGradWeight, &ga, &[&x, &dy], &ws);
        assert_adjoint(dot(&y, &dy), dot(&w, &dw));
    }
}

// ---- gather and slice ----

#[test]
fn gather_grad_scatter_adds() {
    let idx = i64t(&[2, 2], &[0, -1, 0, 1]);
    let dy = f64t(&[2, 2, 2], &(0..8).map(|v| v as f64).collect::<Vec<_>>());
    let at = attrs(&[("data_shape", ints(&[3, 2]))]);
    let dx = eval1(OpKind::GatherGrad, &at, &[&idx, &dy], &[3, 2]);
    assert_close(&dx, &[4.0, 6.0, 6.0, 7.0, 2.0, 3.0], 0.0);
    // Axis 1, adjoint of gather.
    let data = noise(&[2, 5, 3], 1);
    let idx = i64t(&[4], &[4, -5, 2, 4]);
    let at = attrs(&[("axis", Attr::Int(1)), ("data_shape", ints(&[2, 5, 3]))]);
    let y = eval1(OpKind::Gather, &at, &[&data, &idx], &[2, 4, 3]);
    let dy = noise(&[2, 4, 3], 2);
    let dx = eval1(OpKind::GatherGrad, &at, &[&idx, &dy], &[2, 5, 3]);
    assert_adjoint(dot(&y, &dy), dot(&data, &dx));
    let bad = i64t(&[4], &[5, 0, 0, 0]);
    let e = eval_err(OpKind::GatherGrad, &at, &[&bad, &dy], &[2, 5, 3]);
    assert!(e.contains("index 5 out of range"), "{e}");
}

#[test]
fn slice_grad_scatters() {
    let at = attrs(&[
        ("starts", ints(&[-1])),
        ("ends", ints(&[i64::MIN])),
        ("steps", ints(&[-2])),
        ("input_shape", ints(&[5])),
    ]);
    let dy = f64t(&[3], &[1.0, 2.0, 3.0]);
    let dx = eval1(OpKind::SliceGrad, &at, &[&dy], &[5]);
    assert_close(&dx, &[3.0, 0.0, 2.0, 0.0, 1.0], 0.0);
    let at = attrs(&[
        ("starts", ints(&[1])),
        ("ends", ints(&[3])),
        ("axes", ints(&[1])),
        ("input_shape", ints(&[2, 3])),
    ]);
    let dy = f64t(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let dx = eval1(OpKind::SliceGrad, &at, &[&dy], &[2, 3]);
    assert_close(&dx, &[0.0, 1.0, 2.0, 0.0, 3.0, 4.0], 0.0);
    // Adjoint of slice with mixed steps.
    let x = noise(&[4, 7, 3], 5);
    let at = attrs(&[
        ("starts", ints(&[6, 0, -1])),
        ("ends", ints(&[0, 10, -4])),
        ("axes", ints(&[1, 0, 2])),
        ("steps", ints(&[-3, 2, -1])),
        ("input_shape", ints(&[4, 7, 3])),
    ]);
    let y = eval1(OpKind::Slice, &at, &[&x], &[2, 2, 3]);
    let dy = noise(&[2, 2, 3], 6);
    let dx = eval1(OpKind::SliceGrad, &at, &[&dy], &[4, 7, 3]);
    assert_adjoint(dot(&y, &dy), dot(&x, &dx));
}

// ---- dropout ----

#[test]
fn training_dropout_draws_a_keyed_mask() {
    let n = 4000;
    let x = f64t(&[n], &vec![1.5; n]);
    let key = i64t(&[2], &[3, 1]);
    let at = attrs(&[
        ("training", Attr::Int(1)),
        ("ratio", Attr::Float(0.25)),
        ("seed", Attr::Int(7)),
    ]);
    let opts = InterpOptions {
        precision: Precision::F64,
    };
    let types = [ty(&[n]), TensorType::of(DType::Bool, &[n as u64])];
    let outs = eval_op(OpKind::Dropout, &at, &[&x, &key], &types, &opts).unwrap();
    let (y, mask) = (outs[0].as_f64().unwrap(), outs[1].as_i64().unwrap());
    let mut kept = 0;
    for i in 0..n {
        let keep = dropout_keep(7, 3, 1, i as u64, 0.25);
        assert_eq!(mask[i] != 0, keep, "element {i}");
        assert_eq!(y[i], if keep { 2.0 } else { 0.0 }, "element {i}");
        kept += keep as usize;
    }
    assert!((2850..3150).contains(&kept), "kept {kept} of {n}");
    // The same (seed, step, micro-batch) gives the same mask; another key another one.
    let again = eval1(OpKind::Dropout, &at, &[&x, &key], &[n]);
    assert_eq!(again.as_f64().unwrap(), y);
    let other = eval1(OpKind::Dropout, &at, &[&x, &i64t(&[2], &[3, 2])], &[n]);
    assert_ne!(other.as_f64().unwrap(), y);
    // Inference: identity, with or without a key.
    let inf = attrs(&[("ratio", Attr::Float(0.25))]);
    assert_eq!(eval1(OpKind::Dropout, &inf, &[&x, &key], &[n]), x);
    assert_eq!(eval1(OpKind::Dropout, &inf, &[&x], &[n]), x);
    // ratio 0 keeps everything.
    let zero = attrs(&[("training", Attr::Int(1)), ("ratio", Attr::Float(0.0))]);
    assert_eq!(eval1(OpKind::Dropout, &zero, &[&x, &key], &[n]), x);
    // Training without a key is an error.
    let e = eval_err(OpKind::Dropout, &at, &[&x], &[n]);
    assert!(e.contains("needs its key operand"), "{e}");
}

// ---- the logit at the label, and log-sum-exp: a cross-entropy over vocabulary pieces ----

#[test]
fn label_logit_by_hand() {
    // Two rows of a piece holding classes 2..5.
    let logits = f64t(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let a = attrs(&[("offset", Attr::Int(2))]);
    let labels = i64t(&[2], &[3, 7]);
    let y = eval1(OpKind::LabelLogit, &a, &[&logits, &labels], &[2]);
    assert_close(&y, &[2.0, 0.0], 0.0);
    let labels = i64t(&[2], &[1, 4]);
    let y = eval1(OpKind::LabelLogit, &a, &[&logits, &labels], &[2]);
    assert_close(&y, &[0.0, 6.0], 0.0);
    // The gradient is the adjoint: Σ label_logit(x)·dy = Σ x·grad(dy).
    let dy = f64t(&[2], &[0.5, -2.0]);
    let g = attrs(&[("offset", Attr::Int(2)), ("classes", Attr::Int(3))]);
    let dx = eval1(OpKind::LabelLogitGrad, &g, &[&dy, &labels], &[2, 3]);
    assert_close(&dx, &[0.0, 0.0, 0.0, 0.0, 0.0, -2.0], 0.0);
}

#[test]
fn pieces_merge_to_the_cross_entropy() {
    // log-sum-exp over the pieces' log-sum-exps minus the sum of the pieces' label logits
    // is the cross-entropy of the whole row, for every split of the classes.
    let row = [0.3, -1.2, 2.5, 0.0, 1.1, -0.7];
    let logits = f64t(&[1, 6], &row);
    for label in 0..6i64 {
        let labels = i64t(&[1], &[label]);
        let want = eval1(
            OpKind::SoftmaxCrossEntropy,
            &Attrs::new(),
            &[&logits, &labels],
            &[],
        );
        for cut in 1..6usize {
            let mut lses = vec![];
            let mut picked = 0.0;
            for (lo, hi) in [(0, cut), (cut, 6)] {
                let piece = f64t(&[1, hi - lo], &row[lo..hi]);
                let lse = attrs(&[("axes", ints(&[-1])), ("keepdims", Attr::Int(0))]);
                let l = eval1(OpKind::ReduceLogSumExp, &lse, &[&piece], &[1]);
                lses.push(l.as_f64().unwrap()[0]);
                let a = attrs(&[("offset", Attr::Int(lo as i64))]);
                let p = eval1(OpKind::LabelLogit, &a, &[&piece, &labels], &[1]);
                picked += p.as_f64().unwrap()[0];
            }
            let both = f64t(&[2], &lses);
            let all = attrs(&[("keepdims", Attr::Int(0))]);
            let lse = eval1(OpKind::ReduceLogSumExp, &all, &[&both], &[]);
            assert_close(&want, &[lse.as_f64().unwrap()[0] - picked], 1e-14);
        }
    }
}

#[test]
fn reduce_log_sum_exp_edges() {
    let a = attrs(&[("axes", ints(&[1])), ("keepdims", Attr::Int(0))]);
    let inf = f64::INFINITY;
    let x = f64t(&[3, 2], &[1000.0, 1000.0, -inf, -inf, inf, 0.0]);
    let y = eval1(OpKind::ReduceLogSumExp, &a, &[&x], &[3]);
    let y = y.as_f64().unwrap();
    assert!((y[0] - (1000.0 + 2f64.ln())).abs() < 1e-12, "{y:?}");
    assert_eq!(&y[1..], &[-inf, inf]);
}
