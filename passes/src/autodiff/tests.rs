//! Unit tests of the training function's contract: arguments, results and names, the
//! B/W phase split, training-mode state updates, seeds, errors and options. The numerical
//! gradient checks live in `passes/tests/autodiff_gradcheck.rs`.

use std::collections::HashMap;

use ppir::interp::{bind_args, run_function, InterpOptions, Precision};
use ppir::{Tensor, Use};

use super::*;

fn parse(src: &str) -> Module {
    ppir::text::parse_module(src).unwrap_or_else(|e| panic!("{e}"))
}

fn build(m: &mut Module, opts: &AutodiffOptions) -> TrainingInfo {
    build_gradient_function(m, opts).unwrap_or_else(|e| panic!("{e}"))
}

fn grad(m: &Module) -> &Function {
    m.function("grad").expect("@grad")
}

/// The op producing the value named `name`.
fn op_named<'f>(f: &'f Function, name: &str) -> &'f ppir::OpData {
    let v = f.find_value(name).unwrap_or_else(|| panic!("no %{name}"));
    f.op(f.producer(v).unwrap())
}

const MLP: &str = r#"
module {
  func @main(%x: tensor<4x3xf32>, %w1: tensor<3x5xf32> {param}, %b1: tensor<5xf32> {param}, %w2: tensor<5x2xf32> {param}) -> (tensor<4x2xf32>) {
    %h = "pp.matmul"(%x, %w1) : (tensor<4x3xf32>, tensor<3x5xf32>) -> tensor<4x5xf32> loc("fc1")
    %hb = "pp.add"(%h, %b1) : (tensor<4x5xf32>, tensor<5xf32>) -> tensor<4x5xf32> loc("fc1/bias")
    %r = "pp.relu"(%hb) : (tensor<4x5xf32>) -> tensor<4x5xf32> loc("relu")
    %y = "pp.matmul"(%r, %w2) : (tensor<4x5xf32>, tensor<5x2xf32>) -> tensor<4x2xf32> loc("fc2")
    return %y : tensor<4x2xf32>
  }
}
"#;

#[test]
fn mlp_contract() {
    let mut m = parse(MLP);
    let before = m.function("main").unwrap().clone();
    let info = build(&mut m, &AutodiffOptions::default());
    assert_eq!(
        info,
        TrainingInfo {
            function: "grad".into(),
            loss_kind: LossKind::CrossEntropy,
            labels: Some(TensorType::of(DType::I64, &[4])),
            params: vec!["w1".into(), "b1".into(), "w2".into()],
            updated_states: vec![],
            needs_rng_key: false,
        }
    );
    assert_eq!(m.function("main").unwrap(), &before, "@main is unchanged");
    let g = grad(&m);
    let args: Vec<(&str, ArgKind)> = g
        .args()
        .iter()
        .map(|&(v, k)| (g.value(v).name.as_str(), k))
        .collect();
    assert_eq!(
        args,
        [
            ("x", ArgKind::Input),
            ("w1", ArgKind::Param),
            ("b1", ArgKind::Param),
            ("w2", ArgKind::Param),
            ("labels", ArgKind::Input)
        ]
    );
    let results: Vec<&str> = g
        .results()
        .iter()
        .map(|&v| g.value(v).name.as_str())
        .collect();
    assert_eq!(results, ["loss", "grad.w1", "grad.b1", "grad.w2"]);
    for (&v, p) in g.results()[1..].iter().zip(&info.params) {
        let pv = g.find_value(p).unwrap();
        assert_eq!(g.ty(v), g.ty(pv), "grad.{p} has the parameter's type");
    }
    // Every op has a phase; forward ops keep their names and locations.
    for &op in g.ops() {
        assert!(g.op(op).phase.is_some(), "{}", ppir::text::print_op(g, op));
    }
    assert_eq!(op_named(g, "h").phase, Some(Phase::Fwd));
    assert_eq!(op_named(g, "h").loc.as_deref(), Some("fc1"));
    assert_eq!(op_named(g, "loss").kind, OpKind::SoftmaxCrossEntropy);
}

/// The weight-gradient matmuls are W; the gradient chain through activations is B; every
/// W op feeds only W ops and `grad.*` results.
#[test]
fn mlp_phases() {
    let mut m = parse(MLP);
    build(&mut m, &AutodiffOptions::default());
    let g = grad(&m);
    // grad.w1 = xᵀ·dh and grad.w2 = rᵀ·dy: W, with their transposes.
    for p in ["grad.w1", "grad.w2"] {
        let op = op_named(g, p);
        assert_eq!(op.kind, OpKind::MatMul, "{p}");
        assert_eq!(op.phase, Some(Phase::BwdWeight), "{p}");
        let t = g.op(g.producer(op.operands()[0]).unwrap());
        assert_eq!(t.kind, OpKind::Transpose);
        assert_eq!(t.phase, Some(Phase::BwdWeight));
    }
    assert_eq!(op_named(g, "grad.b1").phase, Some(Phase::BwdWeight));
    // dr = dy·w2ᵀ, and the relu mask, are B.
    let mut phases: HashMap<OpKind, Vec<Phase>> = HashMap::new();
    for &op in g.ops() {
        let d = g.op(op);
        phases.entry(d.kind).or_default().push(d.phase.unwrap());
    }
    assert_eq!(
        phases[&OpKind::SoftmaxCrossEntropyGrad],
        vec![Phase::BwdInput]
    );
    assert_eq!(phases[&OpKind::Where], vec![Phase::BwdInput]);
    assert_eq!(
        phases[&OpKind::MatMul],
        vec![
            Phase::Fwd,
            Phase::Fwd,
            Phase::BwdInput,
            Phase::BwdWeight,
            Phase::BwdWeight
        ]
    );
    assert_w_feeds_only_w(g);
}

/// Every bwd_weight op's results are used only by bwd_weight ops and `grad.*` results.
fn assert_w_feeds_only_w(g: &Function) {
    let result_names: Vec<&str> = g
        .results()
        .iter()
        .map(|&v| g.value(v).name.as_str())
        .collect();
    for &op in g.ops() {
        if g.op(op).phase != Some(Phase::BwdWeight) {
            continue;
        }
        for &r in g.op(op).results() {
            for u in g.users(r) {
                match *u {
                    Use::Operand(user, _) => assert_eq!(
                        g.op(user).phase,
                        Some(Phase::BwdWeight),
                        "W value %{} feeds {}",
                        g.value(r).name,
                        ppir::text::print_op(g, user)
                    ),
                    Use::Return(i) => assert!(
                        result_names[i].starts_with("grad."),
                        "W value %{} is returned as {}",
                        g.value(r).name,
                        result_names[i]
                    ),
                }
            }
        }
    }
}

const CNN_DROPOUT: &str = r#"
module {
  func @main(%x: tensor<2x2x4x4xf32>, %w: tensor<3x2x3x3xf32> {param}, %s: tensor<3xf32> {param}, %b: tensor<3xf32> {param}, %mean: tensor<3xf32> {state}, %var: tensor<3xf32> {state}, %unused: tensor<7xf32> {param}, %fc: tensor<3x4xf32> {param}) -> (tensor<2x4xf32>) {
    %c = "pp.conv"(%x, %w) {pads = [1, 1, 1, 1]} : (tensor<2x2x4x4xf32>, tensor<3x2x3x3xf32>) -> tensor<2x3x4x4xf32> loc("conv")
    %n = "pp.batch_norm"(%c, %s, %b, %mean, %var) {epsilon = 0.001, momentum = 0.8} : (tensor<2x3x4x4xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>) -> tensor<2x3x4x4xf32> loc("bn")
    %r = "pp.relu"(%n) : (tensor<2x3x4x4xf32>) -> tensor<2x3x4x4xf32>
    %d = "pp.dropout"(%r) {ratio = 0.5, seed = 5} : (tensor<2x3x4x4xf32>) -> tensor<2x3x4x4xf32> loc("drop1")
    %p = "pp.global_avg_pool"(%d) : (tensor<2x3x4x4xf32>) -> tensor<2x3x1x1xf32>
    %f = "pp.flatten"(%p) : (tensor<2x3x1x1xf32>) -> tensor<2x3xf32>
    %e = "pp.dropout"(%f) {ratio = 0.1, seed = 5} : (tensor<2x3xf32>) -> tensor<2x3xf32> loc("drop2")
    %y = "pp.matmul"(%e, %fc) : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32>
    return %y : tensor<2x4xf32>
  }
}
"#;

fn weights(m: &mut Module, seed: u64) {
    let mut s = seed;
    let mut next = || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 11) as f64 / (1u64 << 53) as f64
    };
    let f = m.functions[0].clone();
    for &(v, kind) in f.args() {
        if kind == ArgKind::Input {
            continue;
        }
        let ty = f.ty(v);
        let shape: Vec<usize> = ty
            .static_shape()
            .unwrap()
            .iter()
            .map(|&d| d as usize)
            .collect();
        let n = shape.iter().product();
        let data = (0..n).map(|_| next() + 0.1).collect();
        m.weights.insert(
            f.value(v).name.clone(),
            Tensor::from_f64(ty.dtype, shape, data),
        );
    }
}

#[test]
fn training_mode_dropout_and_batch_norm() {
    let mut m = parse(CNN_DROPOUT);
    weights(&mut m, 3);
    let info = build(&mut m, &AutodiffOptions::default());
    assert!(info.needs_rng_key);
    assert_eq!(info.updated_states, vec!["mean", "var"]);
    let g = grad(&m);
    let last_args: Vec<&str> = g.args()[8..]
        .iter()
        .map(|&(v, _)| g.value(v).name.as_str())
        .collect();
    assert_eq!(last_args, ["labels", "rng"]);
    assert_eq!(
        g.ty(g.find_value("rng").unwrap()).to_string(),
        "tensor<2xi64>"
    );
    let results: Vec<&str> = g
        .results()
        .iter()
        .map(|&v| g.value(v).name.as_str())
        .collect();
    assert_eq!(
        results,
        [
            "loss",
            "grad.w",
            "grad.s",
            "grad.b",
            "grad.unused",
            "grad.fc",
            "new.mean",
            "new.var"
        ]
    );
    // Dropouts: training form with the key, unique seeds (a duplicated 5 is reassigned).
    let seeds: Vec<i64> = ["d", "e"]
        .iter()
        .map(|n| {
            let op = op_named(g, n);
            let d = DropoutAttrs::of(&op.attrs).unwrap();
            assert!(d.training);
            assert_eq!(op.operands()[1], g.find_value("rng").unwrap());
            d.seed
        })
        .collect();
    assert_ne!(seeds[0], seeds[1]);
    // Batch norm is decomposed (no pp.batch_norm left); the unused parameter's gradient is
    // a zero of its type, in W.
    assert!(g.ops().iter().all(|&o| g.op(o).kind != OpKind::BatchNorm));
    let z = op_named(g, "grad.unused");
    assert_eq!(z.phase, Some(Phase::BwdWeight));
    assert_w_feeds_only_w(g);

    // Run it: the running statistics follow momentum 0.8 and the unbiased variance.
    let x: Vec<f64> = (0..64)
        .map(|i| ((i * 37 % 23) as f64) / 7.0 - 1.5)
        .collect();
    let mut inputs = HashMap::new();
    inputs.insert(
        "x".into(),
        Tensor::from_f64(DType::F32, vec![2, 2, 4, 4], x),
    );
    inputs.insert(
        "labels".into(),
        Tensor::from_i64(DType::I64, vec![2], vec![3, 0]),
    );
    inputs.insert(
        "rng".into(),
        Tensor::from_i64(DType::I64, vec![2], vec![0, 0]),
    );
    let opts = InterpOptions {
        precision: Precision::F64,
    };
    let outs = run_function(g, bind_args(&m, g, &inputs).unwrap(), &opts, None).unwrap();
    let main = m.function("main").unwrap();
    // The conv output, computed by @main's conv alone.
    let conv_only = {
        let mut f = main.clone();
        let c = f.find_value("c").unwrap();
        f.set_results(vec![c]);
        run_function(&f, bind_args(&m, &f, &inputs).unwrap(), &opts, None).unwrap()
    };
    let c = conv_only[0].as_f64().unwrap();
    let (old_mean, old_var) = (&m.weights["mean"], &m.weights["var"]);
    for ch in 0..3 {
        let vals: Vec<f64> = (0..2)
            .flat_map(|n| (0..16).map(move |i| (n, i)))
            .map(|(n, i)| c[(n * 3 + ch) * 16 + i])
            .collect();
        let k = vals.len() as f64;
        let mu = vals.iter().sum::<f64>() / k;
        let var = vals.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>() / (k - 1.0);
        let want_mean = 0.8 * old_mean.as_f64().unwrap()[ch] + 0.2 * mu;
        let want_var = 0.8 * old_var.as_f64().unwrap()[ch] + 0.2 * var;
        let got_mean = outs[6].as_f64().unwrap()[ch];
        let got_var = outs[7].as_f64().unwrap()[ch];
        assert!(
            (got_mean - want_mean).abs() < 1e-5,
            "{got_mean} vs {want_mean}"
        );
        assert!((got_var - want_var).abs() < 1e-5, "{got_var} vs {want_var}");
    }
}

#[test]
fn inference_mode_keeps_statistics_and_identity_dropout() {
    let mut m = parse(CNN_DROPOUT);
    let opts = AutodiffOptions {
        train_mode: false,
        ..AutodiffOptions::default()
    };
    let info = build(&mut m, &opts);
    assert!(!info.needs_rng_key);
    assert!(info.updated_states.is_empty());
    let g = grad(&m);
    assert_eq!(g.args().len(), 9, "no rng argument");
    assert_eq!(op_named(g, "n").kind, OpKind::BatchNorm);
    assert!(!DropoutAttrs::of(&op_named(g, "d").attrs).unwrap().training);
    // The statistics are states: no gradient flows to them.
    assert_eq!(g.results().len(), 6);
}

#[test]
fn losses_resolve() {
    let scalar = r#"
module {
  func @main(%w: tensor<3xf32> {param}) -> (tensor<1xf32>) {
    %s = "pp.reduce_sum"(%w) {keepdims = 1} : (tensor<3xf32>) -> tensor<1xf32>
    return %s : tensor<1xf32>
  }
}
"#;
    let mut m = parse(scalar);
    let info = build(&mut m, &AutodiffOptions::default());
    assert_eq!(info.loss_kind, LossKind::Output);
    assert_eq!(info.labels, None);
    let g = grad(&m);
    assert_eq!(g.ty(g.results()[0]).to_string(), "tensor<f32>");

    let mut m = parse(MLP);
    let opts = AutodiffOptions {
        loss: LossKind::Mse,
        ..AutodiffOptions::default()
    };
    let info = build(&mut m, &opts);
    assert_eq!(info.labels, Some(TensorType::of(DType::F32, &[4, 2])));
    assert_eq!(op_named(grad(&m), "loss").kind, OpKind::ReduceMean);

    let mut m = parse(MLP);
    let opts = AutodiffOptions {
        loss: LossKind::Output,
        ..AutodiffOptions::default()
    };
    let e = build_gradient_function(&mut m, &opts)
        .unwrap_err()
        .to_string();
    assert!(e.contains("needs a scalar output"), "{e}");
}

#[test]
fn errors_name_the_problem() {
    let batch = MLP
        .replace("%x: tensor<4x3xf32>", "%x: tensor<?x3xf32>")
        .replace(
            "(tensor<4x3xf32>, tensor<3x5xf32>) -> tensor<4x5xf32>",
            "(tensor<?x3xf32>, tensor<3x5xf32>) -> tensor<?x5xf32>",
        );
    let batch = batch
        .replace("tensor<4x5xf32>", "tensor<?x5xf32>")
        .replace("tensor<4x2xf32>", "tensor<?x2xf32>");
    let mut m = parse(&batch);
    let e = build_gradient_function(&mut m, &AutodiffOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("argument %x") && e.contains("bind-batch"), "{e}");
    let opts = AutodiffOptions {
        function: "nope".into(),
        ..AutodiffOptions::default()
    };
    let e = build_gradient_function(&mut parse(MLP), &opts)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no function @nope"), "{e}");
    // A parameter named like a contract name.
    let clash = MLP.replace("%b1", "%labels");
    let e = build_gradient_function(&mut parse(&clash), &AutodiffOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("%labels") && e.contains("clashes"), "{e}");
}

#[test]
fn rebuilding_replaces_grad() {
    let mut m = parse(MLP);
    build(&mut m, &AutodiffOptions::default());
    let first = grad(&m).clone();
    build(&mut m, &AutodiffOptions::default());
    assert_eq!(m.functions.len(), 2);
    assert_eq!(grad(&m), &first);
}

#[test]
fn pass_options() {
    let r = crate::PassRegistry::builtin();
    assert!(r.create("autodiff").is_ok());
    assert!(r.create("autodiff{loss=mse,function=main,train=0}").is_ok());
    let e = r.create("autodiff{loss=l1}").err().unwrap().to_string();
    assert!(e.contains("cross-entropy"), "{e}");
    let e = r.create("autodiff{train=yes}").err().unwrap().to_string();
    assert!(e.contains("1 or 0"), "{e}");
    let e = r.create("autodiff{lr=1}").err().unwrap().to_string();
    assert!(e.contains("no option `lr`"), "{e}");
    let p = AutodiffPass::from_options(
        &crate::registry::parse_pass_spec("autodiff{loss=output,train=false}")
            .unwrap()
            .1,
    )
    .unwrap();
    assert_eq!(p.options.loss, LossKind::Output);
    assert!(!p.options.train_mode);
}

#[test]
fn support_table_is_consistent() {
    for &k in OpKind::ALL {
        let any = (0..3).any(|i| k.differentiable_operand(i));
        match k.gradient_support() {
            GradSupport::Zero | GradSupport::None => assert!(!any, "{k}"),
            _ => assert!(any, "{k}"),
        }
    }
}
