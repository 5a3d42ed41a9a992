//! Randomized equivalence: every split rule, on random shapes, computes the same values as
//! the original function on the interpreter — forward and gradients (autodiff of both).

use ppir::interp::{run_function, InterpOptions, Precision};
use ppir::{DType, Module, OpKind, Tensor};

use super::rules::{pieces, Axis, SplitTarget};
use super::*;
use crate::autodiff::{build_gradient_function, AutodiffOptions, LossKind};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    fn coin(&mut self) -> bool {
        self.next() & 1 == 1
    }
}

fn random_tensor(rng: &mut Rng, t: &ppir::TensorType) -> Tensor {
    let shape: Vec<usize> = t
        .static_shape()
        .unwrap()
        .iter()
        .map(|&d| d as usize)
        .collect();
    match t.dtype {
        DType::F32 => {
            let n = shape.iter().product();
            Tensor::from_f32(shape, (0..n).map(|_| rng.unit()).collect())
        }
        d => panic!("no random {d:?}"),
    }
}

fn run(m: &Module, name: &str, inputs: &[Tensor]) -> Vec<Tensor> {
    let f = m.function(name).unwrap();
    run_function(
        f,
        inputs.to_vec(),
        &InterpOptions {
            precision: Precision::F64,
        },
        None,
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

fn assert_close(a: &[Tensor], b: &[Tensor], what: &str) {
    assert_close_tol(a, b, 1e-9, what)
}

fn assert_close_tol(a: &[Tensor], b: &[Tensor], tol: f64, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: result count");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(x.shape, y.shape, "{what}: result {i} shape");
        let (xs, ys) = (x.to_f64_vec(), y.to_f64_vec());
        let scale = xs.iter().fold(1.0f64, |m, v| m.max(v.abs()));
        for (j, (p, q)) in xs.iter().zip(&ys).enumerate() {
            assert!(
                (p - q).abs() <= tol * scale,
                "{what}: result {i}[{j}]: {p} vs {q}"
            );
        }
    }
}

/// Rewrite `src`'s @main with `targets`, then check the values and gradients agree.
fn check(src: &str, targets: Vec<SplitTarget>, rng: &mut Rng) -> RewriteReport {
    let m = ppir::text::parse_module(src).unwrap_or_else(|e| panic!("{e}\n{src}"));
    let f = m.function("main").unwrap();
    let opts = RewriteOptions {
        split: targets.clone(),
        ..Default::default()
    };
    let (out, report) =
        rewrite_function(&m, f, &opts).unwrap_or_else(|e| panic!("{e}\n{src}\n{targets:?}"));
    let mut m2 = m.clone();
    *m2.function_mut("main").unwrap() = out;
    // Every target is split: its location now has at least `pieces` contractions.
    for t in &targets {
        let f2 = m2.function("main").unwrap();
        let n = f2
            .ops()
            .iter()
            .filter(|&&o| {
                let d = f2.op(o);
                matches!(d.kind, OpKind::MatMul | OpKind::Gemm)
                    && d.loc.as_deref().is_some_and(|l| l.starts_with(&t.loc))
            })
            .count();
        assert!(n >= t.pieces, "{t:?}: {n} contractions\n{report}");
    }
    let inputs: Vec<Tensor> = f
        .arg_values()
        .map(|v| random_tensor(rng, f.ty(v)))
        .collect();
    let what = format!("{targets:?}");
    assert_close(
        &run(&m, "main", &inputs),
        &run(&m2, "main", &inputs),
        &format!("forward {what}"),
    );
    // Gradients: MSE against random targets.
    check_gradients(&m, &m2, LossKind::Mse, &inputs, rng, 1e-9, &what);
    report
}

/// The gradient functions of `m` and `m2` (autodiff with `loss`) agree within `tol` on
/// `inputs`, plus random values for the arguments autodiff adds (the loss's labels).
fn check_gradients(
    m: &Module,
    m2: &Module,
    loss: LossKind,
    inputs: &[Tensor],
    rng: &mut Rng,
    tol: f64,
    what: &str,
) {
    let ad = AutodiffOptions {
        loss,
        ..Default::default()
    };
    let (mut g1, mut g2) = (m.clone(), m2.clone());
    build_gradient_function(&mut g1, &ad).unwrap_or_else(|e| panic!("{e}"));
    build_gradient_function(&mut g2, &ad).unwrap_or_else(|e| panic!("{e}"));
    let gf = g1.function("grad").unwrap();
    let mut ginputs = inputs.to_vec();
    for v in gf.arg_values().skip(inputs.len()) {
        ginputs.push(random_tensor(rng, gf.ty(v)));
    }
    assert_close_tol(
        &run(&g1, "grad", &ginputs),
        &run(&g2, "grad", &ginputs),
        tol,
        &format!("gradients {what}"),
    );
}

fn dims(d: &[u64]) -> String {
    let mut s = String::from("tensor<");
    for x in d {
        s.push_str(&format!("{x}x"));
    }
    s.push_str("f32>");
    s
}

/// x[..., M, K] @ w[K, N] (+ b[N]) → relu → @ w2[N, P].
fn mlp(batch: &[u64], m: u64, k: u64, n: u64, p: u64) -> String {
    let mut xs = batch.to_vec();
    xs.extend([m, k]);
    let mut hs = batch.to_vec();
    hs.extend([m, n]);
    let mut ys = batch.to_vec();
    ys.extend([m, p]);
    let (tx, th, ty) = (dims(&xs), dims(&hs), dims(&ys));
    let (tw, tb, tw2) = (dims(&[k, n]), dims(&[n]), dims(&[n, p]));
    format!(
        r#"module {{
  func @main(%x: {tx}, %w: {tw} {{param}}, %b: {tb} {{param}}, %w2: {tw2} {{param}}) -> ({ty}) {{
    %h = "pp.matmul"(%x, %w) : ({tx}, {tw}) -> {th} loc("fc1")
    %hb = "pp.add"(%h, %b) : ({th}, {tb}) -> {th} loc("fc1/bias")
    %r = "pp.relu"(%hb) : ({th}) -> {th} loc("relu")
    %y = "pp.matmul"(%r, %w2) : ({th}, {tw2}) -> {ty} loc("fc2")
    return %y : {ty}
  }}
}}"#
    )
}

#[test]
fn matmul_splits_compute_the_same_values_and_gradients() {
    let mut rng = Rng(7);
    for case in 0..24 {
        let batch: Vec<u64> = if case % 3 == 0 { vec![2] } else { vec![] };
        let (m, k, n, p) = (
            rng.range(2, 7),
            rng.range(2, 9),
            rng.range(2, 11),
            rng.range(1, 5),
        );
        let src = mlp(&batch, m, k, n, p);
        let axis = [Axis::M, Axis::N, Axis::K][case % 3];
        let loc = if rng.coin() { "fc1" } else { "fc2" };
        let extent = match (axis, loc) {
            (Axis::M, _) => m,
            (Axis::N, "fc1") => n,
            (Axis::N, _) => p,
            (Axis::K, "fc1") => k,
            (Axis::K, _) | (Axis::V, _) | (Axis::H, _) => n,
        };
        if extent < 2 {
            continue;
        }
        let pieces = rng.range(2, extent.min(4)) as usize;
        check(
            &src,
            vec![SplitTarget {
                loc: loc.into(),
                pieces,
                axis: Some(axis),
            }],
            &mut rng,
        );
    }
}

#[test]
fn two_splits_at_once_and_the_axis_chosen_by_cost() {
    let mut rng = Rng(11);
    let src = mlp(&[], 6, 8, 10, 4);
    let report = check(
        &src,
        vec![
            SplitTarget {
                loc: "fc1".into(),
                pieces: 2,
                axis: None,
            },
            SplitTarget {
                loc: "fc2".into(),
                pieces: 2,
                axis: None,
            },
        ],
        &mut rng,
    );
    assert_eq!(report.splits.len(), 2, "{report}");
}

/// gemm(a, b, c) with every transpose and bias shape, split along each axis.
#[test]
fn gemm_splits_compute_the_same_values_and_gradients() {
    let mut rng = Rng(3);
    for case in 0..36 {
        let (m, k, n) = (rng.range(2, 6), rng.range(2, 7), rng.range(2, 8));
        let (ta, tb) = (rng.coin(), rng.coin());
        let a = if ta { [k, m] } else { [m, k] };
        let b = if tb { [n, k] } else { [k, n] };
        let c: Option<Vec<u64>> = match case % 6 {
            0 => None,
            1 => Some(vec![n]),
            2 => Some(vec![m, n]),
            3 => Some(vec![1, n]),
            4 => Some(vec![m, 1]),
            _ => Some(vec![]),
        };
        let (tx, tw, tr) = (dims(&a), dims(&b), dims(&[m, n]));
        let (c_arg, c_operand, c_ty) = match &c {
            Some(c) => (
                format!(", %c: {} {{param}}", dims(c)),
                ", %c".to_string(),
                format!(", {}", dims(c)),
            ),
            None => (String::new(), String::new(), String::new()),
        };
        let src = format!(
            r#"module {{
  func @main(%a: {tx}, %w: {tw} {{param}}{c_arg}) -> ({tr}) {{
    %y = "pp.gemm"(%a, %w{c_operand}) {{alpha = 0.5, beta = 2.0, trans_a = {}, trans_b = {}}} : ({tx}, {tw}{c_ty}) -> {tr} loc("g")
    %z = "pp.tanh"(%y) : ({tr}) -> {tr} loc("act")
    return %z : {tr}
  }}
}}"#,
            ta as i64, tb as i64
        );
        let axis = [Axis::M, Axis::N, Axis::K][(case / 2) % 3];
        let extent = match axis {
            Axis::M => m,
            Axis::N => n,
            Axis::K | Axis::V | Axis::H => k,
        };
        let pieces = rng.range(2, extent.min(3)) as usize;
        check(
            &src,
            vec![SplitTarget {
                loc: "g".into(),
                pieces,
                axis: Some(axis),
            }],
            &mut rng,
        );
    }
}

#[test]
fn errors_name_the_op() {
    let src = mlp(&[], 2, 3, 4, 1);
    let m = ppir::text::parse_module(&src).unwrap();
    let f = m.function("main").unwrap();
    let err = |split: &str| {
        let opts = RewriteOptions {
            split: parse_split_list(split).unwrap(),
            ..Default::default()
        };
        rewrite_function(&m, f, &opts).unwrap_err().to_string()
    };
    let src2 = src.replace("loc(\"fc2\")", "loc(\"head/MatMul\")");
    let m2 = ppir::text::parse_module(&src2).unwrap();
    let opts = RewriteOptions {
        split: parse_split_list("head:2:m").unwrap(),
        ..Default::default()
    };
    let (_, report) = rewrite_function(&m2, m2.function("main").unwrap(), &opts).unwrap();
    assert_eq!(
        report.splits[0].0, "head/MatMul",
        "a prefix names the one matmul under it"
    );
    assert!(
        err("nope:2").contains("no op is named `nope`"),
        "{}",
        err("nope:2")
    );
    assert!(err("relu:2").contains("`relu` is a pp.relu"));
    assert!(err("fc1:1").contains("at least 2 pieces"));
    // fc2's N is 1: it cannot be cut along N.
    assert!(err("fc2:2:n").contains("cannot be split into 2 pieces"));
    assert!(parse_split_list("fc1").is_err());
    assert!(parse_split_list("fc1:x").is_err());
    assert_eq!(
        parse_split_list("a/b:3:k; c=2").unwrap(),
        vec![
            SplitTarget {
                loc: "a/b".into(),
                pieces: 3,
                axis: Some(Axis::K)
            },
            SplitTarget {
                loc: "c".into(),
                pieces: 2,
                axis: None
            }
        ]
    );
}

#[test]
fn pieces_cover_the_extent() {
    assert_eq!(pieces(10, 3), vec![(0, 4), (4, 7), (7, 10)]);
    assert_eq!(pieces(4, 4), vec![(0, 1), (1, 2), (2, 3), (3, 4)]);
}

/// After a split, the weights read in pieces become one parameter per piece; the function
/// computes the same, and joining the pieces gives back the original weights.
#[test]
fn split_params_makes_pieces_parameters() {
    let mut rng = Rng(5);
    for (target, split_weights) in [
        ("fc1:3:n", vec!["w"]),
        ("fc1:2:k", vec!["w"]),
        ("fc2:2:k", vec!["w2"]),
        ("fc1:2:m", vec![]),
    ] {
        let src = mlp(&[], 4, 6, 9, 3);
        let mut m = ppir::text::parse_module(&src).unwrap();
        let f = m.function("main").unwrap().clone();
        for &(v, kind) in f.args() {
            if kind == ppir::ArgKind::Param {
                m.weights
                    .insert(f.value(v).name.clone(), random_tensor(&mut rng, f.ty(v)));
            }
        }
        let opts = RewriteOptions {
            split: parse_split_list(target).unwrap(),
            ..Default::default()
        };
        let (out, _) = rewrite_function(&m, &f, &opts).unwrap();
        let mut m2 = m.clone();
        *m2.function_mut("main").unwrap() = out;
        let splits = params::split_params(&mut m2, "main").unwrap();
        let originals: Vec<&str> = splits.iter().map(|s| s.original.as_str()).collect();
        assert_eq!(originals, split_weights, "{target}");
        ppir::verify::verify_module(&m2).unwrap_or_else(|e| panic!("{e:?}"));
        let f2 = m2.function("main").unwrap();
        // No slice of a split parameter's pieces is left: every piece is read whole.
        for &o in f2.ops() {
            let d = f2.op(o);
            if d.kind == OpKind::Slice {
                let name = &f2.value(d.operands()[0]).name;
                assert!(
                    !split_weights
                        .iter()
                        .any(|w| name == w || name.starts_with(&format!("{w}.part"))),
                    "{target}: a slice of {name} is left"
                );
            }
        }
        let x = random_tensor(&mut rng, f.ty(f.args()[0].0));
        let inputs: std::collections::HashMap<String, Tensor> = [("x".to_string(), x)].into();
        let a1 = ppir::interp::bind_args(&m, &f, &inputs).unwrap();
        let a2 = ppir::interp::bind_args(&m2, f2, &inputs).unwrap();
        assert_close(
            &run(&m, "main", &a1),
            &run(&m2, "main", &a2),
            &format!("split params {target}"),
        );
        let mut joined = m2.weights.clone();
        params::join_pieces(&mut joined, &splits).unwrap();
        assert_eq!(joined, m.weights, "{target}");
    }
}

/// Layer norm, softmax and reductions distribute over a row split: the e-graph holds the
/// per-piece form of each, and whatever the extractor takes computes the same.
#[test]
fn rowwise_ops_distribute_over_a_row_split() {
    let mut rng = Rng(17);
    for case in 0..8 {
        let (m, k, n) = (rng.range(2, 6), rng.range(2, 6), rng.range(2, 7));
        let keep = case % 2;
        let (th, tw, tv) = (dims(&[m, n]), dims(&[k, n]), dims(&[n]));
        let tx = dims(&[m, k]);
        let tr = if keep == 1 { dims(&[m, 1]) } else { dims(&[m]) };
        let src = format!(
            r#"module {{
  func @main(%x: {tx}, %w: {tw} {{param}}, %s: {tv} {{param}}, %b: {tv} {{param}}) -> ({th}, {tr}) {{
    %h = "pp.matmul"(%x, %w) : ({tx}, {tw}) -> {th} loc("fc")
    %n = "pp.layer_norm"(%h, %s, %b) {{axis = -1, epsilon = 1e-5}} : ({th}, {tv}, {tv}) -> {th} loc("ln")
    %p = "pp.softmax"(%n) {{axis = 1}} : ({th}) -> {th} loc("sm")
    %r = "pp.reduce_max"(%p) {{axes = [1], keepdims = {keep}}} : ({th}) -> {tr} loc("red")
    return %p, %r : {th}, {tr}
  }}
}}"#
        );
        let targets = vec![SplitTarget {
            loc: "fc".into(),
            pieces: 2,
            axis: Some(Axis::M),
        }];
        // The rule fired: each row-wise op's class also holds a concat of pieces.
        let m_ = ppir::text::parse_module(&src).unwrap();
        let f = m_.function("main").unwrap();
        let sat = saturate(
            f,
            &targets,
            &rules::all_rules(),
            &RewriteOptions::default(),
            16,
        )
        .unwrap();
        let eg = &sat.conv.egraph;
        for loc in ["ln", "sm", "red"] {
            let class = eg.find(sat.conv.locs[loc]);
            assert!(
                eg[class].nodes.iter().any(|n| matches!(
                    n,
                    egraph::PpNode::Op {
                        kind: OpKind::Concat,
                        ..
                    }
                )),
                "{loc}: no per-piece form"
            );
        }
        check(&src, targets, &mut rng);
    }
}

/// An LM head (matmul and bias) under a softmax cross-entropy against `labels`.
fn lm_head(batch: &[u64], d: u64, v: u64, ignore: Option<i64>) -> String {
    let mut hs = batch.to_vec();
    hs.push(d);
    let mut ys = batch.to_vec();
    ys.push(v);
    let (th, ty, tl) = (dims(&hs), dims(&ys), dims(batch).replace("f32", "i64"));
    let (tw, tb) = (dims(&[d, v]), dims(&[v]));
    let attrs = ignore.map_or(String::new(), |c| format!(" {{ignore_index = {c}}}"));
    format!(
        r#"module {{
  func @main(%h: {th}, %w: {tw} {{param}}, %b: {tb} {{param}}, %labels: {tl}) -> (tensor<f32>) {{
    %z = "pp.matmul"(%h, %w) : ({th}, {tw}) -> {ty} loc("lm_head")
    %y = "pp.add"(%z, %b) : ({ty}, {tb}) -> {ty} loc("lm_head/bias")
    %loss = "pp.softmax_cross_entropy"(%y, %labels){attrs} : ({ty}, {tl}) -> tensor<f32> loc("loss")
    return %loss : tensor<f32>
  }}
}}"#
    )
}

#[test]
fn cross_entropy_splits_along_the_vocabulary_with_the_lm_head() {
    let mut rng = Rng(13);
    for case in 0..16 {
        let batch: Vec<u64> = if case % 2 == 0 {
            vec![rng.range(1, 3), rng.range(2, 5)]
        } else {
            vec![rng.range(2, 6)]
        };
        let (d, v) = (rng.range(2, 6), rng.range(4, 40));
        let ignore = [None, Some(-100), Some(1)][case % 3];
        let k = rng.range(2, v.min(5)) as usize;
        let src = lm_head(&batch, d, v, ignore);
        let m = ppir::text::parse_module(&src).unwrap_or_else(|e| panic!("{e}\n{src}"));
        let f = m.function("main").unwrap();
        let opts = RewriteOptions {
            split: vec![SplitTarget {
                loc: "lm_head".into(),
                pieces: k,
                axis: Some(Axis::N),
            }],
            ..Default::default()
        };
        let (out, report) = rewrite_function(&m, f, &opts).unwrap_or_else(|e| panic!("{e}"));
        let count = |kind: OpKind| {
            out.ops()
                .iter()
                .filter(|&&o| out.op(o).kind == kind)
                .count()
        };
        assert_eq!(count(OpKind::SoftmaxCrossEntropy), 0, "{report}");
        assert_eq!(count(OpKind::LabelLogit), k, "{report}");
        assert_eq!(
            count(OpKind::Concat),
            1,
            "only the log-sum-exps are joined\n{report}"
        );
        assert!(
            report
                .splits
                .iter()
                .any(|(_, w)| w.contains("log-sum-exp merge")),
            "{report}"
        );
        let mut m2 = m.clone();
        *m2.function_mut("main").unwrap() = out;
        // Inputs: labels in range, some equal to the ignore index.
        let mut inputs = vec![];
        for v_id in f.arg_values() {
            let t = f.ty(v_id);
            if t.dtype == DType::I64 {
                let n: usize = t.static_shape().unwrap().iter().product::<u64>() as usize;
                let labels = (0..n)
                    .map(|_| match ignore {
                        Some(c) if rng.range(0, 3) == 0 => c,
                        _ => rng.range(0, v - 1) as i64,
                    })
                    .collect();
                let shape = t
                    .static_shape()
                    .unwrap()
                    .iter()
                    .map(|&x| x as usize)
                    .collect();
                inputs.push(Tensor::from_i64(DType::I64, shape, labels));
            } else {
                inputs.push(random_tensor(&mut rng, t));
            }
        }
        let what = format!("case {case}: batch {batch:?} d {d} v {v} k {k} ignore {ignore:?}");
        assert_close(
            &run(&m, "main", &inputs),
            &run(&m2, "main", &inputs),
            &format!("loss, {what}"),
        );
        // The merged form's mean divides by an f32 constant 1/count (the fused op divides
        // in f64): one f32 rounding apart.
        check_gradients(&m, &m2, LossKind::Output, &inputs, &mut rng, 2e-7, &what);
    }
}

#[test]
fn appended_cross_entropy_splits_with_the_lm_head() {
    // The driver's path: the model returns logits, the loss is appended to @main.
    let src = r#"module {
  func @main(%h: tensor<2x3x4xf32>, %w: tensor<4x10xf32> {param}) -> (tensor<2x3x10xf32>) {
    %z = "pp.matmul"(%h, %w) : (tensor<2x3x4xf32>, tensor<4x10xf32>) -> tensor<2x3x10xf32> loc("lm_head/MatMul")
    return %z : tensor<2x3x10xf32>
  }
}"#;
    let mut m = ppir::text::parse_module(src).unwrap();
    let appended = crate::autodiff::append_loss(&mut m, "main", LossKind::Auto)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(appended.kind, LossKind::CrossEntropy);
    let f = m.function("main").unwrap();
    assert_eq!(f.results().len(), 1);
    assert!(f.find_value("labels").is_some());
    let opts = RewriteOptions {
        split: vec![SplitTarget {
            loc: "lm_head".into(),
            pieces: 3,
            axis: None,
        }],
        ..Default::default()
    };
    let (out, report) = rewrite_function(&m, f, &opts).unwrap_or_else(|e| panic!("{e}"));
    assert!(report.to_string().contains("log-sum-exp merge"), "{report}");
    // Without an axis, never the batch ("heads" of an unbatched product): its pieces
    // would all read the whole weight.
    assert!(report.splits[0].1.contains("along N"), "{report}");
    assert!(out
        .ops()
        .iter()
        .all(|&o| out.op(o).kind != OpKind::SoftmaxCrossEntropy));
}

#[test]
fn gather_splits_along_the_table_rows() {
    let mut rng = Rng(17);
    for case in 0..12 {
        let (v, d) = (rng.range(3, 30), rng.range(1, 5));
        let ids: Vec<u64> = if case % 2 == 0 {
            vec![rng.range(1, 3), rng.range(1, 5)]
        } else {
            vec![rng.range(1, 6)]
        };
        let k = rng.range(2, v.min(5)) as usize;
        let (tt, ti) = (dims(&[v, d]), dims(&ids).replace("f32", "i64"));
        let mut ys = ids.clone();
        ys.push(d);
        let ty = dims(&ys);
        let src = format!(
            r#"module {{
  func @main(%wte: {tt} {{param}}, %ids: {ti}) -> ({ty}) {{
    %e = "pp.gather"(%wte, %ids) {{axis = 0}} : ({tt}, {ti}) -> {ty} loc("wte/Gather")
    %y = "pp.tanh"(%e) : ({ty}) -> {ty} loc("act")
    return %y : {ty}
  }}
}}"#
        );
        let m = ppir::text::parse_module(&src).unwrap_or_else(|e| panic!("{e}\n{src}"));
        let f = m.function("main").unwrap();
        let opts = RewriteOptions {
            split: vec![SplitTarget {
                loc: "wte".into(),
                pieces: k,
                axis: None,
            }],
            ..Default::default()
        };
        let (out, report) = rewrite_function(&m, f, &opts).unwrap_or_else(|e| panic!("{e}"));
        let gathers = out
            .ops()
            .iter()
            .filter(|&&o| out.op(o).kind == OpKind::Gather)
            .count();
        assert_eq!(gathers, k, "{report}");
        let mut m2 = m.clone();
        *m2.function_mut("main").unwrap() = out;
        // Ids anywhere in -v..v (negative ids wrap).
        let n: usize = ids.iter().product::<u64>() as usize;
        let idv: Vec<i64> = (0..n)
            .map(|_| rng.range(0, 2 * v - 1) as i64 - v as i64)
            .collect();
        let ishape: Vec<usize> = ids.iter().map(|&x| x as usize).collect();
        let inputs = vec![
            random_tensor(&mut rng, f.ty(f.arg_values().next().unwrap())),
            Tensor::from_i64(DType::I64, ishape, idv),
        ];
        let what = format!("case {case}: v {v} d {d} ids {ids:?} k {k}");
        assert_close(
            &run(&m, "main", &inputs),
            &run(&m2, "main", &inputs),
            &format!("forward, {what}"),
        );
        check_gradients(&m, &m2, LossKind::Mse, &inputs, &mut rng, 1e-9, &what);
    }
    // A gather cannot be split along a contraction axis.
    let src = r#"module {
  func @main(%wte: tensor<8x2xf32> {param}, %ids: tensor<3xi64>) -> (tensor<3x2xf32>) {
    %e = "pp.gather"(%wte, %ids) {axis = 0} : (tensor<8x2xf32>, tensor<3xi64>) -> tensor<3x2xf32> loc("emb")
    return %e : tensor<3x2xf32>
  }
}"#;
    let m = ppir::text::parse_module(src).unwrap();
    let opts = RewriteOptions {
        split: vec![SplitTarget {
            loc: "emb".into(),
            pieces: 2,
            axis: Some(Axis::K),
        }],
        ..Default::default()
    };
    let e = rewrite_function(&m, m.function("main").unwrap(), &opts).unwrap_err();
    assert!(e.to_string().contains("cannot be split along K"), "{e}");
}

#[test]
fn ilp_extraction_counts_shared_terms_once() {
    // R = add(A, B), A = exp(P), P = matmul(x, w); B is matmul(x, w2) and (made equal by
    // hand) log(P). Per use (greedy), log(P) costs a whole matmul more than matmul(x, w2);
    // as a DAG, P is paid for A anyway and log(P) is nearly free.
    let src = r#"module {
  func @main(%x: tensor<64x64xf32>, %w: tensor<64x64xf32> {param}, %w2: tensor<64x64xf32> {param}) -> (tensor<64x64xf32>) {
    %p = "pp.matmul"(%x, %w) : (tensor<64x64xf32>, tensor<64x64xf32>) -> tensor<64x64xf32> loc("p")
    %a = "pp.exp"(%p) : (tensor<64x64xf32>) -> tensor<64x64xf32> loc("a")
    %b = "pp.matmul"(%x, %w2) : (tensor<64x64xf32>, tensor<64x64xf32>) -> tensor<64x64xf32> loc("b")
    %r = "pp.add"(%a, %b) : (tensor<64x64xf32>, tensor<64x64xf32>) -> tensor<64x64xf32> loc("r")
    return %r : tensor<64x64xf32>
  }
}"#;
    let m = ppir::text::parse_module(src).unwrap();
    let mut conv = egraph::to_egraph(m.function("main").unwrap()).unwrap();
    let (p, b) = (conv.locs["p"], conv.locs["b"]);
    let log = rules::add_op(
        &mut conv.egraph,
        OpKind::Log,
        &ppir::Attrs::new(),
        vec![p],
        Some("b"),
    )
    .unwrap();
    conv.egraph.union(log, b);
    conv.egraph.rebuild();
    let eg = &conv.egraph;
    let b = eg.find(b);
    let greedy: HashMap<Id, PpNode> = extract(eg, &HashMap::new())
        .into_iter()
        .map(|(id, (_, n))| (id, n))
        .collect();
    assert!(
        matches!(
            &greedy[&b],
            PpNode::Op {
                kind: OpKind::MatMul,
                ..
            }
        ),
        "greedy takes the separate matmul"
    );
    let greedy_cost = ilp::dag_cost(eg, &conv.roots, &|c| greedy.get(&eg.find(c)).cloned());
    let choice = ilp::extract(
        eg,
        &conv.roots,
        &HashMap::new(),
        &greedy,
        std::time::Duration::from_secs(5),
    )
    .expect("the ILP finds a choice");
    assert!(choice.optimal);
    assert!(
        matches!(
            &choice.nodes[&b],
            PpNode::Op {
                kind: OpKind::Log,
                ..
            }
        ),
        "the ILP reuses P"
    );
    assert!(
        choice.cost < greedy_cost,
        "{} vs {greedy_cost}",
        choice.cost
    );
    // The function it gives computes the chosen term and verifies.
    let mut out = ppir::Function::new("main");
    let f = m.function("main").unwrap();
    for (v, kind) in f.args() {
        out.add_arg(f.value(*v).name.clone(), f.ty(*v).clone(), *kind);
    }
    let results =
        egraph::from_egraph(&conv, &mut out, &|id| choice.nodes.get(&id).cloned()).unwrap();
    out.set_results(results);
    assert!(out.ops().iter().any(|&o| out.op(o).kind == OpKind::Log));
    assert_eq!(
        out.ops()
            .iter()
            .filter(|&&o| out.op(o).kind == OpKind::MatMul)
            .count(),
        1
    );
}

/// A self-attention block, `[b, s, h·d]` in and out.
fn attention(b: u64, s: u64, h: u64, d: u64) -> String {
    let w = h * d;
    let (tx, tw) = (dims(&[b, s, w]), dims(&[w, w]));
    let (t4, tk) = (dims(&[b, s, h, d]), dims(&[b, h, d, s]));
    let (tq, ts) = (dims(&[b, h, s, d]), dims(&[b, h, s, s]));
    let tm = dims(&[s, s]);
    format!(
        r#"module {{
  func @main(%x: {tx}, %mask: {tm}, %wq: {tw} {{param}}, %wk: {tw} {{param}}, %wv: {tw} {{param}}, %wo: {tw} {{param}}) -> ({tx}) {{
    %q0 = "pp.matmul"(%x, %wq) : ({tx}, {tw}) -> {tx} loc("q_proj")
    %k0 = "pp.matmul"(%x, %wk) : ({tx}, {tw}) -> {tx} loc("k_proj")
    %v0 = "pp.matmul"(%x, %wv) : ({tx}, {tw}) -> {tx} loc("v_proj")
    %q1 = "pp.reshape"(%q0) {{shape = [{b}, {s}, {h}, {d}]}} : ({tx}) -> {t4} loc("rq")
    %k1 = "pp.reshape"(%k0) {{shape = [{b}, {s}, {h}, {d}]}} : ({tx}) -> {t4} loc("rk")
    %v1 = "pp.reshape"(%v0) {{shape = [{b}, {s}, {h}, {d}]}} : ({tx}) -> {t4} loc("rv")
    %q = "pp.transpose"(%q1) {{perm = [0, 2, 1, 3]}} : ({t4}) -> {tq} loc("tq")
    %k = "pp.transpose"(%k1) {{perm = [0, 2, 3, 1]}} : ({t4}) -> {tk} loc("tk")
    %v = "pp.transpose"(%v1) {{perm = [0, 2, 1, 3]}} : ({t4}) -> {tq} loc("tv")
    %s0 = "pp.matmul"(%q, %k) : ({tq}, {tk}) -> {ts} loc("qk")
    %c = "pp.constant"() {{value = dense<[0.5]> : tensor<f32>}} : () -> tensor<f32> loc("scale")
    %s1 = "pp.mul"(%s0, %c) : ({ts}, tensor<f32>) -> {ts} loc("scaled")
    %s2 = "pp.add"(%s1, %mask) : ({ts}, {tm}) -> {ts} loc("masked")
    %p = "pp.softmax"(%s2) {{axis = -1}} : ({ts}) -> {ts} loc("softmax")
    %o = "pp.matmul"(%p, %v) : ({ts}, {tq}) -> {tq} loc("av")
    %t = "pp.transpose"(%o) {{perm = [0, 2, 1, 3]}} : ({tq}) -> {t4} loc("merge_t")
    %r = "pp.reshape"(%t) {{shape = [{b}, {s}, {w}]}} : ({t4}) -> {tx} loc("merge_r")
    %y = "pp.matmul"(%r, %wo) : ({tx}, {tw}) -> {tx} loc("o_proj")
    return %y : {tx}
  }}
}}"#
    )
}

#[test]
fn attention_splits_along_heads() {
    let mut rng = Rng(19);
    for case in 0..8 {
        let (b, s, h, d) = (
            rng.range(1, 2),
            rng.range(2, 5),
            rng.range(2, 6),
            rng.range(1, 3),
        );
        let k = rng.range(2, h.min(3)) as usize;
        let src = attention(b, s, h, d);
        // Both matmuls of the attention along the heads: the pieces flow from one to the
        // other through the scale, the mask and the softmax without being joined.
        let targets: Vec<SplitTarget> = ["qk", "av"]
            .iter()
            .map(|t| SplitTarget {
                loc: t.to_string(),
                pieces: k,
                axis: Some(Axis::H),
            })
            .collect();
        let report = check(&src, targets.clone(), &mut rng);
        assert!(
            report.splits.iter().all(|(_, w)| w.contains("along H")),
            "{report}"
        );
        let m = ppir::text::parse_module(&src).unwrap();
        let opts = RewriteOptions {
            split: targets,
            ..Default::default()
        };
        let (out, _) = rewrite_function(&m, m.function("main").unwrap(), &opts).unwrap();
        let count = |kind: OpKind| {
            out.ops()
                .iter()
                .filter(|&&o| out.op(o).kind == kind)
                .count()
        };
        assert_eq!(count(OpKind::Softmax), k, "case {case}\n{report}");
        // Joined scores would feed the scale, the mask or the softmax.
        let scores = out.ops().iter().any(|&o| {
            let op = out.op(o);
            op.kind == OpKind::Concat
                && out.users(op.results()[0]).iter().any(|u| match u {
                    ppir::Use::Operand(q, _) => {
                        matches!(out.op(*q).kind, OpKind::Mul | OpKind::Add | OpKind::Softmax)
                    }
                    ppir::Use::Return(_) => false,
                })
        });
        assert!(
            !scores,
            "case {case}: the scores are joined\n{report}\n{}",
            ppir::text::print_function(&out)
        );
    }
}

/// Values with numeric names after a split op (the loss's are `%0`, `%1`, ...): the split's
/// new values get fresh numeric names first, and an original value must not get one of
/// those again (the rewritten function once failed to verify with "value %0 is already
/// defined").
#[test]
fn numeric_names_after_a_split_stay_distinct() {
    let src = mlp(&[], 4, 6, 8, 3)
        .replace("%hb", "%0")
        .replace("%r ", "%1 ")
        .replace("(%r,", "(%1,");
    assert!(src.contains("%1 = \"pp.relu\"(%0)"), "{src}");
    let mut rng = Rng(11);
    for axis in [Axis::M, Axis::N, Axis::K] {
        check(
            &src,
            vec![SplitTarget {
                loc: "fc1".into(),
                pieces: 2,
                axis: Some(axis),
            }],
            &mut rng,
        );
    }
}
