//! Per-op gradient checks: every differentiable op kind, on random non-trivial shapes
//! (with broadcasting where the op broadcasts), against central finite differences of the
//! loss in f64. Each case is a small `@main` whose float operands are parameters and whose
//! output is `Σ op(..)·R` for a random constant R (loss kind `output`), so the check covers
//! every element of every operand's gradient. Relative error (largest absolute difference
//! over the larger magnitude of the two gradients) must be ≤ 1e-6. Inputs of ops with
//! kinks (relu, abs, clip, pools, max) are drawn away from them.
//!
//! [`every_differentiable_kind_has_a_case`] fails if a kind with a gradient rule (or a
//! decomposition) appears in no case.

mod common;

use std::collections::BTreeSet;

use common::*;
use ppcc_passes::autodiff::{GradSupport, LossKind};
use ppir::{ArgKind, Attr, Attrs, DType, OpKind, Tensor};

use Dist::{Away, Uniform};
use OpKind::*;

type Cases = Vec<(String, Model)>;

/// Finite-difference step (five-point stencil: truncation ~h⁴, rounding ~1e-16/h).
const H: f64 = 1e-4;

fn a() -> Attrs {
    Attrs::new()
}

fn run_cases(cases: Cases) {
    for (name, model) in cases {
        let (_, e) =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| gradcheck(&model, H)))
                .unwrap_or_else(|p| {
                    let msg = p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    panic!("case `{name}`: {msg}")
                });
        eprintln!("{name}: max relative error {e:.2e}");
    }
}

/// One op on parameters drawn from `dists`, its result(s) through the random functional.
fn single(seed: u64, kind: OpKind, attrs: Attrs, shapes: &[(&[usize], Dist)]) -> Model {
    let mut b = ModelBuilder::new(seed);
    let ops: Vec<_> = shapes
        .iter()
        .enumerate()
        .map(|(i, (s, d))| b.param(&format!("p{i}"), s, *d))
        .collect();
    let ys = b.op_n(kind, &ops, attrs);
    b.functional(&ys)
}

// ---- unary ----

fn unary_cases() -> Cases {
    let s: &[usize] = &[3, 4];
    let std = Away(0.05, 1.5);
    let pos = Uniform(0.3, 2.0);
    let list: Vec<(&str, OpKind, Attrs, Dist)> = vec![
        ("relu", Relu, a(), std),
        (
            "leaky_relu",
            LeakyRelu,
            a().with("alpha", Attr::Float(0.1)),
            std,
        ),
        ("elu", Elu, a().with("alpha", Attr::Float(0.7)), std),
        ("selu", Selu, a(), std),
        ("sigmoid", Sigmoid, a(), std),
        (
            "hard_sigmoid",
            HardSigmoid,
            a().with("alpha", Attr::Float(0.3)),
            Away(0.05, 3.0),
        ),
        ("tanh", Tanh, a(), std),
        ("gelu", Gelu, a(), std),
        (
            "gelu_tanh",
            Gelu,
            a().with("approximate", Attr::Str("tanh".into())),
            std,
        ),
        ("erf", Erf, a(), std),
        ("exp", Exp, a(), std),
        ("log", Log, a(), pos),
        ("sqrt", Sqrt, a(), pos),
        ("abs", Abs, a(), std),
        ("neg", Neg, a(), std),
        ("reciprocal", Reciprocal, a(), pos),
        ("softplus", Softplus, a(), Away(0.05, 4.0)),
        ("softsign", Softsign, a(), std),
        ("sin", Sin, a(), std),
        ("cos", Cos, a(), std),
        ("identity", Identity, a(), std),
        (
            "shrink",
            Shrink,
            a().with("bias", Attr::Float(0.2))
                .with("lambd", Attr::Float(0.5)),
            Away(0.05, 2.0),
        ),
        (
            "clip",
            Clip,
            a().with("min", Attr::Float(-0.5))
                .with("max", Attr::Float(0.7)),
            std,
        ),
        (
            "clip_min_only",
            Clip,
            a().with("min", Attr::Float(-0.5)),
            std,
        ),
        (
            "dropout_inference",
            Dropout,
            a().with("ratio", Attr::Float(0.3)),
            std,
        ),
    ];
    let mut cases: Cases = list
        .into_iter()
        .enumerate()
        .map(|(i, (name, kind, attrs, dist))| {
            let mut model = single(i as u64, kind, attrs, &[(s, dist)]);
            // Outside training mode dropout is the identity.
            model.opts.train_mode = name != "dropout_inference";
            (name.to_string(), model)
        })
        .collect();
    // Cast: f64 -> f32 -> f64 (the interpreter does not round in f64 precision).
    let mut b = ModelBuilder::new(40);
    let x = b.param("x", &[2, 3], std);
    let c = b.op(Cast, &[x], a().with("to", Attr::DType(DType::F32)));
    let d = b.op(Cast, &[c], a().with("to", Attr::DType(DType::F64)));
    cases.push(("cast".into(), b.functional(&[d])));
    // Piecewise-constant ops pass no gradient: d/dx (floor(x) + sign(x)·ceil(x) + x²) = 2x.
    let mut b = ModelBuilder::new(41);
    let x = b.param("x", &[5], Away(0.1, 2.0));
    let fl = b.op(Floor, &[x], a());
    let sg = b.op(Sign, &[x], a());
    let ce = b.op(Ceil, &[x], a());
    let sc = b.op(Mul, &[sg, ce], a());
    let x2 = b.op(Mul, &[x, x], a());
    let t = b.op(Add, &[fl, sc], a());
    let y = b.op(Add, &[t, x2], a());
    cases.push(("zero_gradient_ops".into(), b.functional(&[y])));
    cases
}

/// Training-mode dropout: the mask is fixed by (seed, step, micro-batch), so the loss is
/// differentiable in x and the gradient is the same dropout of dy.
fn dropout_train_case() -> Model {
    let mut b = ModelBuilder::new(50);
    let x = b.param("x", &[4, 6], Away(0.05, 1.5));
    let d1 = b.op(Dropout, &[x], a().with("ratio", Attr::Float(0.4)));
    let t = b.op(Tanh, &[d1], a());
    let d2 = b.op(Dropout, &[t], a().with("ratio", Attr::Float(0.25)));
    let mut model = b.functional(&[d2]);
    model.inputs.insert("rng".into(), i64t(&[2], vec![7, 1]));
    model
}

#[test]
fn unary_gradients() {
    let mut cases = unary_cases();
    cases.push(("dropout_train".into(), dropout_train_case()));
    run_cases(cases);
}

// ---- binary, with broadcasting ----

fn binary_cases() -> Cases {
    let shapes: Vec<(&[usize], &[usize])> = vec![
        (&[2, 3, 4], &[2, 3, 4]),
        (&[2, 3, 4], &[3, 1]),
        (&[4], &[2, 3, 4]),
        (&[3, 1], &[1, 4]),
        (&[2, 3], &[]),
    ];
    let mut cases = vec![];
    for (ki, (name, kind)) in [
        ("add", Add),
        ("sub", Sub),
        ("mul", Mul),
        ("div", Div),
        ("pow", Pow),
        ("max", Max),
        ("min", Min),
    ]
    .into_iter()
    .enumerate()
    {
        for (si, &(sa, sb)) in shapes.iter().enumerate() {
            let (da, db) = match kind {
                Div => (Away(0.1, 2.0), Away(0.5, 2.0)),
                Pow => (Uniform(0.5, 2.0), Uniform(-1.5, 1.5)),
                _ => (Uniform(-2.0, 2.0), Uniform(-2.0, 2.0)),
            };
            let seed = (ki * 10 + si) as u64;
            cases.push((
                format!("{name} {sa:?} {sb:?}"),
                single(seed, kind, a(), &[(sa, da), (sb, db)]),
            ));
        }
    }
    // Mod: floored and truncated remainders (kinks where a / b is an integer, which the
    // seeds keep away from the finite-difference steps).
    for (i, fmod) in [0, 1].into_iter().enumerate() {
        for (si, &(sa, sb)) in shapes.iter().enumerate().skip(1) {
            cases.push((
                format!("mod fmod={fmod} {sa:?} {sb:?}"),
                single(
                    (80 + i * 5 + si) as u64,
                    Mod,
                    a().with("fmod", Attr::Int(fmod)),
                    &[(sa, Uniform(-3.0, 3.0)), (sb, Away(0.5, 2.0))],
                ),
            ));
        }
    }
    // PRelu: a per-channel slope broadcast to x.
    cases.push((
        "prelu".into(),
        single(
            90,
            PRelu,
            a(),
            &[
                (&[2, 3, 4, 2], Away(0.05, 2.0)),
                (&[3, 1, 1], Uniform(0.1, 0.5)),
            ],
        ),
    ));
    // Where: the condition is an input (no gradient), x and y broadcast.
    let mut b = ModelBuilder::new(91);
    let cond = b.draw(&[2, 1, 4], Uniform(-1.0, 1.0));
    let cond = b.input("c", cond);
    let zero = b.constant(Tensor::scalar_f64(DType::F64, 0.0));
    let c = b.op(Greater, &[cond, zero], a());
    let x = b.param("x", &[3, 4], Uniform(-1.0, 1.0));
    let y = b.param("y", &[2, 3, 1], Uniform(-1.0, 1.0));
    let w = b.op(Where, &[c, x, y], a());
    cases.push(("where".into(), b.functional(&[w])));
    // The same value on both sides: contributions add up (d(x·x + x)/dx = 2x + 1).
    let mut b = ModelBuilder::new(92);
    let x = b.param("x", &[3, 2], Uniform(-1.0, 1.0));
    let xx = b.op(Mul, &[x, x], a());
    let y = b.op(Add, &[xx, x], a());
    cases.push(("shared operand".into(), b.functional(&[y])));
    cases
}

#[test]
fn binary_gradients() {
    run_cases(binary_cases());
}

// ---- contractions ----

fn contraction_cases() -> Cases {
    let std = Uniform(-1.0, 1.0);
    let mut cases = vec![];
    let mm: Vec<(&[usize], &[usize])> = vec![
        (&[3, 4], &[4, 5]),
        (&[2, 3, 4], &[4, 5]),
        (&[4], &[4, 5]),
        (&[3, 4], &[4]),
        (&[4], &[4]),
        (&[2, 1, 3, 4], &[3, 4, 2]),
        (&[2, 3, 4], &[2, 4, 5]),
        (&[3, 4], &[2, 4, 5]),
    ];
    for (i, (sa, sb)) in mm.into_iter().enumerate() {
        cases.push((
            format!("matmul {sa:?} {sb:?}"),
            single(100 + i as u64, MatMul, a(), &[(sa, std), (sb, std)]),
        ));
    }
    // Gemm: every transposition, alpha/beta, c broadcast or absent.
    let mut seed = 120;
    for ta in [0, 1] {
        for tb in [0, 1] {
            for c in [
                Some(&[5usize][..]),
                Some(&[3, 1][..]),
                Some(&[3, 5][..]),
                None,
            ] {
                let sa: &[usize] = if ta == 1 { &[4, 3] } else { &[3, 4] };
                let sb: &[usize] = if tb == 1 { &[5, 4] } else { &[4, 5] };
                let attrs = a()
                    .with("alpha", Attr::Float(0.7))
                    .with("beta", Attr::Float(1.3))
                    .with("trans_a", Attr::Int(ta))
                    .with("trans_b", Attr::Int(tb));
                let mut shapes = vec![(sa, std), (sb, std)];
                if let Some(c) = c {
                    shapes.push((c, std));
                }
                seed += 1;
                cases.push((
                    format!("gemm ta={ta} tb={tb} c={c:?}"),
                    single(seed, Gemm, attrs, &shapes),
                ));
            }
        }
    }
    // Conv: 1-D grouped and strided (the last input column unread: output_padding),
    // 2-D strided, padded, dilated with bias, 3-D.
    let conv_cases: Vec<(&[usize], &[usize], Attrs, bool)> = vec![
        (
            &[2, 4, 8],
            &[6, 2, 3],
            a().with("group", Attr::Int(2))
                .with("strides", ints(&[2]))
                .with("pads", ints(&[1, 0])),
            true,
        ),
        (
            &[2, 3, 7, 6],
            &[4, 3, 3, 2],
            a().with("strides", ints(&[2, 1]))
                .with("pads", ints(&[1, 0, 2, 1]))
                .with("dilations", ints(&[1, 2])),
            true,
        ),
        (
            &[1, 2, 4, 3, 5],
            &[2, 2, 2, 2, 3],
            a().with("pads", ints(&[1, 0, 1, 0, 1, 0])),
            false,
        ),
    ];
    for (i, (sx, sw, attrs, bias)) in conv_cases.into_iter().enumerate() {
        let mut shapes = vec![(sx, std), (sw, std)];
        let m = [sw[0]];
        if bias {
            shapes.push((&m, std));
        }
        cases.push((
            format!("conv {sx:?} {sw:?}"),
            single(140 + i as u64, Conv, attrs, &shapes),
        ));
    }
    // ConvTranspose: strided with output_padding, grouped, with bias; 1-D dilated.
    let ct: Vec<(&[usize], &[usize], Attrs, bool)> = vec![
        (
            &[2, 4, 3, 3],
            &[4, 1, 3, 2],
            a().with("group", Attr::Int(2))
                .with("strides", ints(&[2, 2]))
                .with("pads", ints(&[1, 0, 1, 1]))
                .with("output_padding", ints(&[1, 0])),
            true,
        ),
        (
            &[1, 3, 5],
            &[3, 2, 3],
            a().with("dilations", ints(&[2]))
                .with("pads", ints(&[1, 1])),
            false,
        ),
    ];
    for (i, (sx, sw, attrs, bias)) in ct.into_iter().enumerate() {
        let m = [sw[1] * attrs.int_or("group", 1).unwrap() as usize];
        let mut shapes = vec![(sx, std), (sw, std)];
        if bias {
            shapes.push((&m, std));
        }
        cases.push((
            format!("conv_transpose {sx:?} {sw:?}"),
            single(150 + i as u64, ConvTranspose, attrs, &shapes),
        ));
    }
    cases
}

#[test]
fn contraction_gradients() {
    run_cases(contraction_cases());
}

// ---- pooling ----

fn pool_cases() -> Cases {
    let std = Uniform(-1.0, 1.0);
    let mut cases = vec![];
    let windows: Vec<(&[usize], Attrs)> = vec![
        (
            &[2, 2, 5, 6],
            a().with("kernel_shape", ints(&[2, 3]))
                .with("strides", ints(&[2, 2]))
                .with("pads", ints(&[1, 0, 0, 1])),
        ),
        (
            &[1, 2, 6, 5],
            a().with("kernel_shape", ints(&[3, 2]))
                .with("strides", ints(&[2, 2]))
                .with("ceil_mode", Attr::Int(1)),
        ),
        (
            &[2, 3, 7],
            a().with("kernel_shape", ints(&[3]))
                .with("pads", ints(&[1, 1]))
                .with("count_include_pad", Attr::Int(1)),
        ),
    ];
    for (i, (shape, attrs)) in windows.into_iter().enumerate() {
        cases.push((
            format!("max_pool {shape:?}"),
            single(200 + i as u64, MaxPool, attrs.clone(), &[(shape, std)]),
        ));
        cases.push((
            format!("avg_pool {shape:?}"),
            single(210 + i as u64, AvgPool, attrs, &[(shape, std)]),
        ));
    }
    cases.push((
        "global_avg_pool".into(),
        single(220, GlobalAvgPool, a(), &[(&[2, 3, 4, 2], std)]),
    ));
    cases.push((
        "global_max_pool".into(),
        single(221, GlobalMaxPool, a(), &[(&[2, 3, 4, 2], std)]),
    ));
    cases
}

#[test]
fn pool_gradients() {
    run_cases(pool_cases());
}

// ---- normalisation ----

fn norm_cases() -> Cases {
    let std = Uniform(-1.0, 1.0);
    let mut cases = vec![];
    // batch_norm, inference mode: the running statistics are states, not differentiated.
    for train in [false, true] {
        let mut b = ModelBuilder::new(300 + train as u64);
        let x = b.param("x", &[4, 3, 2, 2], std);
        let scale = b.param("scale", &[3], Uniform(0.5, 1.5));
        let bias = b.param("bias", &[3], std);
        let mean = b.draw(&[3], std);
        let mean = b.weight("mean", mean, ArgKind::State);
        let var = b.draw(&[3], Uniform(0.5, 1.5));
        let var = b.weight("var", var, ArgKind::State);
        let y = b.op(
            BatchNorm,
            &[x, scale, bias, mean, var],
            a().with("epsilon", Attr::Float(1e-3)),
        );
        let mut model = b.functional(&[y]);
        model.opts.train_mode = train;
        cases.push((format!("batch_norm train={train}"), model));
    }
    // batch_norm on [N, C].
    let mut b = ModelBuilder::new(302);
    let x = b.param("x", &[5, 3], std);
    let scale = b.param("scale", &[3], Uniform(0.5, 1.5));
    let bias = b.param("bias", &[3], std);
    let mean = b.draw(&[3], std);
    let mean = b.weight("mean", mean, ArgKind::State);
    let var = b.draw(&[3], Uniform(0.5, 1.5));
    let var = b.weight("var", var, ArgKind::State);
    let y = b.op(BatchNorm, &[x, scale, bias, mean, var], a());
    cases.push(("batch_norm 2-D train".into(), b.functional(&[y])));

    cases.push((
        "instance_norm".into(),
        single(
            310,
            InstanceNorm,
            a().with("epsilon", Attr::Float(1e-3)),
            &[(&[2, 3, 4, 2], std), (&[3], std), (&[3], std)],
        ),
    ));
    cases.push((
        "layer_norm last axis".into(),
        single(
            311,
            LayerNorm,
            a(),
            &[(&[2, 3, 5], std), (&[5], std), (&[5], std)],
        ),
    ));
    cases.push((
        "layer_norm axis 1, no bias".into(),
        single(
            312,
            LayerNorm,
            a().with("axis", Attr::Int(1)),
            &[(&[2, 3, 4], std), (&[3, 4], std)],
        ),
    ));
    for (i, size) in [3, 4].into_iter().enumerate() {
        cases.push((
            format!("lrn size {size}"),
            single(
                320 + i as u64,
                Lrn,
                a().with("size", Attr::Int(size))
                    .with("alpha", Attr::Float(0.3))
                    .with("beta", Attr::Float(0.75))
                    .with("bias", Attr::Float(1.5)),
                &[(&[2, 5, 2, 3], std)],
            ),
        ));
    }
    cases.push((
        "softmax axis 1".into(),
        single(
            330,
            Softmax,
            a().with("axis", Attr::Int(1)),
            &[(&[2, 3, 4], std)],
        ),
    ));
    cases.push((
        "log_softmax".into(),
        single(331, LogSoftmax, a(), &[(&[2, 3, 4], std)]),
    ));
    cases
}

#[test]
fn norm_gradients() {
    run_cases(norm_cases());
}

// ---- reductions ----

fn reduce_cases() -> Cases {
    let mut cases = vec![];
    for (ki, kind) in [ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceLogSumExp]
        .into_iter()
        .enumerate()
    {
        for (ai, (axes, keep)) in [(vec![1], 0), (vec![], 1), (vec![0, -1], 1)]
            .into_iter()
            .enumerate()
        {
            let attrs = a()
                .with("axes", Attr::Ints(axes.clone()))
                .with("keepdims", Attr::Int(keep));
            cases.push((
                format!("{kind} axes={axes:?} keepdims={keep}"),
                single(
                    400 + (ki * 10 + ai) as u64,
                    kind,
                    attrs,
                    &[(&[3, 4, 2], Uniform(-1.0, 1.0))],
                ),
            ));
        }
    }
    cases
}

#[test]
fn reduce_gradients() {
    run_cases(reduce_cases());
}

// ---- data movement ----

fn movement_cases() -> Cases {
    let std = Uniform(-1.0, 1.0);
    let s: &[usize] = &[2, 3, 4];
    let mut cases: Cases = vec![
        (
            "reshape".into(),
            single(500, Reshape, a().with("shape", ints(&[4, -1])), &[(s, std)]),
        ),
        (
            "flatten".into(),
            single(501, Flatten, a().with("axis", Attr::Int(2)), &[(s, std)]),
        ),
        (
            "transpose".into(),
            single(
                502,
                Transpose,
                a().with("perm", ints(&[2, 0, 1])),
                &[(s, std)],
            ),
        ),
        (
            "transpose default".into(),
            single(503, Transpose, a(), &[(s, std)]),
        ),
        (
            "squeeze".into(),
            single(
                504,
                Squeeze,
                a().with("axes", ints(&[1])),
                &[(&[2, 1, 3], std)],
            ),
        ),
        (
            "unsqueeze".into(),
            single(
                505,
                Unsqueeze,
                a().with("axes", ints(&[0, 3])),
                &[(&[2, 3], std)],
            ),
        ),
        (
            "expand".into(),
            single(
                506,
                Expand,
                a().with("shape", ints(&[2, 3, 4])),
                &[(&[3, 1], std)],
            ),
        ),
        (
            "tile".into(),
            single(
                507,
                Tile,
                a().with("repeats", ints(&[2, 1, 3])),
                &[(&[2, 3, 2], std)],
            ),
        ),
        (
            "pad constant".into(),
            single(
                508,
                Pad,
                a().with("pads", ints(&[1, 0, -1, 2, 0, 1]))
                    .with("value", Attr::Float(1.5)),
                &[(s, std)],
            ),
        ),
        (
            "slice unit steps".into(),
            single(
                509,
                Slice,
                a().with("starts", ints(&[-3, 1]))
                    .with("ends", ints(&[i64::MAX, 3]))
                    .with("axes", ints(&[2, 1])),
                &[(s, std)],
            ),
        ),
        (
            "slice steps".into(),
            single(
                510,
                Slice,
                a().with("starts", ints(&[-1, 0]))
                    .with("ends", ints(&[i64::MIN, 4]))
                    .with("axes", ints(&[1, 2]))
                    .with("steps", ints(&[-2, 3])),
                &[(s, std)],
            ),
        ),
    ];
    // Concat with one operand that is an input (no gradient wanted for it).
    let mut b = ModelBuilder::new(511);
    let p = b.param("p", &[2, 2, 4], std);
    let xin = b.draw(&[2, 1, 4], std);
    let xin = b.input("xin", xin);
    let q = b.param("q", &[2, 3, 4], std);
    let c = b.op(Concat, &[p, xin, q], a().with("axis", Attr::Int(1)));
    cases.push(("concat".into(), b.functional(&[c])));
    // Split: one of three results unused.
    let mut b = ModelBuilder::new(512);
    let x = b.param("x", &[2, 6], std);
    let parts = b.op_n(
        Split,
        &[x],
        a().with("axis", Attr::Int(1))
            .with("split", ints(&[1, 2, 3])),
    );
    cases.push(("split".into(), b.functional(&[parts[0], parts[2]])));
    // Gather along axis 1 with negative and repeated indices (the table is the param).
    let mut b = ModelBuilder::new(513);
    let table = b.param("table", &[3, 5, 2], std);
    let idx = b.input("idx", i64t(&[2, 3], vec![4, -1, 0, 2, 2, -5]));
    let g = b.op(Gather, &[table, idx], a().with("axis", Attr::Int(1)));
    cases.push(("gather".into(), b.functional(&[g])));
    // Its adjoint, a scatter-add (MaxUnpool is one), differentiated in its updates: the
    // gradient is a gather of the incoming gradient.
    let mut b = ModelBuilder::new(514);
    let idx = b.input("idx", i64t(&[2, 3], vec![4, -1, 0, 2, 2, -5]));
    let dy = b.param("dy", &[3, 2, 3, 2], std);
    let g = b.op(
        GatherGrad,
        &[idx, dy],
        a().with("axis", Attr::Int(1))
            .with("data_shape", ints(&[3, 5, 2])),
    );
    cases.push(("gather_grad".into(), b.functional(&[g])));
    cases
}

#[test]
fn movement_gradients() {
    run_cases(movement_cases());
}

// ---- losses and whole models ----

fn loss_cases() -> Cases {
    let std = Uniform(-1.0, 1.0);
    let mut cases = vec![];
    // softmax_cross_entropy inside the model, with ignore_index.
    let mut b = ModelBuilder::new(600);
    let logits = b.param("logits", &[2, 3, 5], std);
    let labels = b.input("lab", i64t(&[2, 3], vec![0, 4, -100, 2, 1, 3]));
    let l = b.op(
        SoftmaxCrossEntropy,
        &[logits, labels],
        a().with("ignore_index", Attr::Int(-100)),
    );
    cases.push((
        "softmax_cross_entropy op".into(),
        b.finish(vec![l], LossKind::Output),
    ));
    // label_logit of a vocabulary piece holding classes 3..7: labels below, in and above.
    let mut b = ModelBuilder::new(603);
    let logits = b.param("logits", &[2, 3, 4], std);
    let labels = b.input("lab", i64t(&[2, 3], vec![0, 3, 5, 6, 7, -100]));
    let p = b.op(
        LabelLogit,
        &[logits, labels],
        a().with("offset", Attr::Int(3)),
    );
    cases.push(("label_logit op".into(), b.functional(&[p])));
    // ONNX SoftmaxCrossEntropyLoss as the importer decomposes it (weights, ignore_index,
    // reduction mean, [N, C, d] scores): class axis last, log_softmax, label_logit, the
    // labels' class weights (labels clamped), ignored positions masked, sum over the counted weights.
    let mut b = ModelBuilder::new(604);
    let scores = b.param("scores", &[2, 4, 3], std);
    let weight = b.param("weight", &[4], Uniform(0.5, 1.5));
    let labels = b.input("lab", i64t(&[2, 3], vec![0, 3, -1, 2, -1, 1]));
    let t = b.op(Transpose, &[scores], a().with("perm", ints(&[0, 2, 1])));
    let lp = b.op(LogSoftmax, &[t], a());
    let picked = b.op(LabelLogit, &[lp, labels], a());
    let ii = b.constant(i64t(&[], vec![-1]));
    let eq = b.op(Equal, &[labels, ii], a());
    let valid = b.op(Not, &[eq], a());
    let (hi, lo) = (
        b.constant(i64t(&[], vec![3])),
        b.constant(i64t(&[], vec![0])),
    );
    let idx = b.op(Min, &[labels, hi], a());
    let idx = b.op(Max, &[idx, lo], a());
    let wpos = b.op(Gather, &[weight, idx], a());
    let nl = b.op(Neg, &[picked], a());
    let l = b.op(Mul, &[nl, wpos], a());
    let zf = b.constant(Tensor::scalar_f64(DType::F64, 0.0));
    let l = b.op(Where, &[valid, l, zf], a());
    let all = || a().with("keepdims", Attr::Int(0));
    let total = b.op(ReduceSum, &[l], all());
    let counted = b.op(Where, &[valid, wpos, zf], a());
    let count = b.op(ReduceSum, &[counted], all());
    let loss = b.op(Div, &[total, count], a());
    cases.push((
        "onnx softmax cross-entropy decomposition".into(),
        b.finish(vec![loss], LossKind::Output),
    ));
    // ONNX CumSum as the importer decomposes it: y += shift(y, k), k = 1, 2, 4, along
    // axis 1 of length 5 (reverse: shifted the other way).
    for reverse in [false, true] {
        let mut b = ModelBuilder::new(605);
        let mut y = b.param("x", &[2, 5, 2], std);
        let mut k = 1;
        while k < 5 {
            let (front, back) = if reverse { (-k, k) } else { (k, -k) };
            let s = b.op(
                Pad,
                &[y],
                a().with("pads", ints(&[0, front, 0, 0, back, 0])),
            );
            y = b.op(Add, &[y, s], a());
            k *= 2;
        }
        cases.push((
            format!("onnx cumsum scan reverse={reverse}"),
            b.functional(&[y]),
        ));
    }
    // Appended cross-entropy over the last axis of a [batch, seq, vocab] output.
    let mut b = ModelBuilder::new(601);
    let x = b.draw(&[2, 3, 4], std);
    let x = b.input("x", x);
    let w = b.param("w", &[4, 5], std);
    let y = b.op(MatMul, &[x, w], a());
    let mut model = b.finish(vec![y], LossKind::CrossEntropy);
    model
        .inputs
        .insert("labels".into(), i64t(&[2, 3], vec![0, 4, 1, 2, 3, 3]));
    cases.push(("cross-entropy loss".into(), model));
    // Appended MSE.
    let mut b = ModelBuilder::new(602);
    let x = b.draw(&[3, 4], std);
    let x = b.input("x", x);
    let w = b.param("w", &[4, 2], std);
    let bias = b.param("bias", &[2], std);
    let y = b.op(MatMul, &[x, w], a());
    let y = b.op(Add, &[y, bias], a());
    let t = b.draw(&[3, 2], std);
    let mut model = b.finish(vec![y], LossKind::Mse);
    model.inputs.insert("labels".into(), t);
    cases.push(("mse loss".into(), model));
    cases
}

#[test]
fn loss_gradients() {
    run_cases(loss_cases());
}

/// A small transformer-style block: embedding gather, layer norm, attention with a causal
/// mask through `where`, GELU MLP, residuals, cross-entropy over [batch, seq, vocab].
fn gpt_block() -> Model {
    let std = Uniform(-0.5, 0.5);
    let (bsz, t, d, v) = (2usize, 3usize, 4usize, 5usize);
    let mut b = ModelBuilder::new(700);
    let tokens = b.input("tokens", i64t(&[bsz, t], vec![1, 4, 0, 3, 3, 2]));
    let emb = b.param("emb", &[v, d], std);
    let ln_s = b.param("ln_s", &[d], Uniform(0.5, 1.5));
    let ln_b = b.param("ln_b", &[d], std);
    let wqkv = b.param("wqkv", &[d, 3 * d], std);
    let w1 = b.param("w1", &[d, 2 * d], std);
    let w2 = b.param("w2", &[2 * d, d], std);
    let head = b.param("head", &[d, v], std);
    let x = b.op(Gather, &[emb, tokens], a());
    let h = b.op(LayerNorm, &[x, ln_s, ln_b], a());
    let qkv = b.op(MatMul, &[h, wqkv], a());
    let parts = b.op_n(
        Split,
        &[qkv],
        a().with("axis", Attr::Int(2))
            .with("split", ints(&[4, 4, 4])),
    );
    let kt = b.op(Transpose, &[parts[1]], a().with("perm", ints(&[0, 2, 1])));
    let s = b.op(MatMul, &[parts[0], kt], a());
    let scale = b.constant(Tensor::scalar_f64(DType::F64, 0.5));
    let s = b.op(Mul, &[s, scale], a());
    let mask: Vec<i64> = (0..t * t).map(|i| ((i % t) <= (i / t)) as i64).collect();
    let mask = b.constant(Tensor::from_i64(DType::Bool, vec![t, t], mask));
    let ninf = b.constant(Tensor::scalar_f64(DType::F64, -1e9));
    let s = b.op(Where, &[mask, s, ninf], a());
    let p = b.op(Softmax, &[s], a());
    let att = b.op(MatMul, &[p, parts[2]], a());
    let x = b.op(Add, &[x, att], a());
    let m = b.op(MatMul, &[x, w1], a());
    let m = b.op(Gelu, &[m], a());
    let m = b.op(MatMul, &[m, w2], a());
    let x = b.op(Add, &[x, m], a());
    let logits = b.op(MatMul, &[x, head], a());
    let mut model = b.finish(vec![logits], LossKind::CrossEntropy);
    model
        .inputs
        .insert("labels".into(), i64t(&[bsz, t], vec![4, 0, 3, 3, 2, 1]));
    model
}

/// A small CNN: conv, batch norm (training), relu, max pool, conv, global average pool,
/// flatten, gemm, cross-entropy.
fn cnn() -> Model {
    let std = Uniform(-0.5, 0.5);
    let mut b = ModelBuilder::new(701);
    let x = b.draw(&[2, 2, 6, 6], std);
    let x = b.input("x", x);
    let w1 = b.param("w1", &[3, 2, 3, 3], std);
    let b1 = b.param("b1", &[3], std);
    let s = b.param("bn_s", &[3], Uniform(0.5, 1.5));
    let bb = b.param("bn_b", &[3], std);
    let mean = b.draw(&[3], std);
    let mean = b.weight("bn_mean", mean, ArgKind::State);
    let var = b.draw(&[3], Uniform(0.5, 1.5));
    let var = b.weight("bn_var", var, ArgKind::State);
    let w2 = b.param("w2", &[4, 3, 2, 2], std);
    let fc = b.param("fc", &[4, 3], std);
    let fcb = b.param("fcb", &[3], std);
    let y = b.op(Conv, &[x, w1, b1], a().with("pads", ints(&[1, 1, 1, 1])));
    let y = b.op(BatchNorm, &[y, s, bb, mean, var], a());
    let y = b.op(Relu, &[y], a());
    let y = b.op(
        MaxPool,
        &[y],
        a().with("kernel_shape", ints(&[2, 2]))
            .with("strides", ints(&[2, 2])),
    );
    let y = b.op(Conv, &[y, w2], a());
    let y = b.op(GlobalAvgPool, &[y], a());
    let y = b.op(Flatten, &[y], a());
    let y = b.op(Gemm, &[y, fc, fcb], a());
    let mut model = b.finish(vec![y], LossKind::CrossEntropy);
    model.inputs.insert("labels".into(), i64t(&[2], vec![2, 0]));
    model
}

#[test]
fn whole_model_gradients() {
    run_cases(vec![
        ("gpt block".into(), gpt_block()),
        ("cnn".into(), cnn()),
    ]);
}

/// Every op kind that autodiff differentiates (a rule or a decomposition) appears in some
/// gradient-check case above.
#[test]
fn every_differentiable_kind_has_a_case() {
    let mut all: Cases = vec![];
    all.extend(unary_cases());
    all.push(("dropout_train".into(), dropout_train_case()));
    all.extend(binary_cases());
    all.extend(contraction_cases());
    all.extend(pool_cases());
    all.extend(norm_cases());
    all.extend(reduce_cases());
    all.extend(movement_cases());
    all.extend(loss_cases());
    let mut covered = BTreeSet::new();
    for (_, model) in &all {
        let f = model.m.function("main").unwrap();
        for &op in f.ops() {
            covered.insert(f.op(op).kind);
        }
    }
    let missing: Vec<OpKind> = OpKind::ALL
        .iter()
        .copied()
        .filter(|&k| {
            matches!(
                k.gradient_support(),
                GradSupport::Rule | GradSupport::Decomposed
            ) && !covered.contains(&k)
        })
        .collect();
    assert!(missing.is_empty(), "no gradient check for {missing:?}");
}
