//! Optimizer steps run with the reference interpreter against the formulas written out here.

use std::collections::{BTreeMap, HashMap};

use ppir::interp::{bind_args, run_function, InterpOptions, Precision};
use ppir::{DType, Module, Phase, Tensor, TensorType};

use super::*;

const W0: [f64; 4] = [0.5, -1.25, 2.0, 0.0];
const G0: [f64; 4] = [0.1, 0.2, -0.3, 0.4];

fn f64_opts() -> InterpOptions {
    InterpOptions {
        precision: Precision::F64,
    }
}

/// A module with one f64 parameter `w` [2, 2] and the optimizer functions.
fn module_with(opts: &OptimizerOptions) -> (Module, OptimizerInfo) {
    let mut m = Module::new();
    let ty = TensorType::of(DType::F64, &[2, 2]);
    m.weights.insert(
        "w".into(),
        Tensor::from_f64(DType::F64, vec![2, 2], W0.to_vec()),
    );
    let info = build_optimizer_function(&mut m, &[("w".into(), ty)], opts).unwrap();
    ppir::verify::verify_module(&m).unwrap();
    (m, info)
}

/// One optimizer call with gradient `g`: the module's weights are updated in place.
fn step(m: &mut Module, g: &[f64]) {
    let f = m.function("optim").unwrap();
    let mut inputs = HashMap::new();
    inputs.insert(
        "grad.w".to_string(),
        Tensor::from_f64(DType::F64, vec![2, 2], g.to_vec()),
    );
    let args = bind_args(m, f, &inputs).unwrap();
    let outs = run_function(f, args, &f64_opts(), None).unwrap();
    let names: Vec<String> = f
        .results()
        .iter()
        .map(|&v| f.value(v).name.clone())
        .collect();
    for (name, t) in names.into_iter().zip(outs) {
        let key = name.strip_prefix("new.").expect("results are new.<weight>");
        assert!(m.weights.contains_key(key), "{key}");
        m.weights.insert(key.to_string(), t);
    }
}

fn w(m: &Module, name: &str) -> Vec<f64> {
    m.weights[name].as_f64().unwrap().to_vec()
}

fn assert_close(a: &[f64], b: &[f64]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= 1e-12 * (1.0 + y.abs()), "{a:?} vs {b:?}");
    }
}

#[test]
fn sgd_plain_step() {
    let (mut m, info) = module_with(&OptimizerOptions::sgd(0.1, 0.0));
    assert!(info.states.is_empty());
    step(&mut m, &G0);
    let want: Vec<f64> = W0.iter().zip(G0).map(|(w, g)| w - 0.1 * g).collect();
    assert_close(&w(&m, "w"), &want);
}

#[test]
fn sgd_weight_decay_and_microbatch_scale() {
    let opts = OptimizerOptions {
        weight_decay: 0.01,
        microbatches: 4,
        ..OptimizerOptions::sgd(0.05, 0.0)
    };
    let (mut m, _) = module_with(&opts);
    step(&mut m, &G0);
    let want: Vec<f64> = W0
        .iter()
        .zip(G0)
        .map(|(w, g)| w - 0.05 * (g / 4.0 + 0.01 * w))
        .collect();
    assert_close(&w(&m, "w"), &want);
}

#[test]
fn sgd_momentum_over_three_steps() {
    let opts = OptimizerOptions {
        weight_decay: 1e-4,
        ..OptimizerOptions::sgd(0.05, 0.9)
    };
    let (mut m, info) = module_with(&opts);
    assert_eq!(info.states, vec!["momentum.w".to_string()]);
    assert_eq!(w(&m, "momentum.w"), vec![0.0; 4]);
    let grads = [G0, [0.3, -0.1, 0.0, 0.2], [-0.5, 0.5, 0.25, -0.25]];
    let mut wv = W0.to_vec();
    let mut v = [0.0; 4];
    for g in grads {
        step(&mut m, &g);
        for i in 0..4 {
            v[i] = 0.9 * v[i] + (g[i] + 1e-4 * wv[i]);
            wv[i] -= 0.05 * v[i];
        }
        assert_close(&w(&m, "w"), &wv);
        assert_close(&w(&m, "momentum.w"), &v);
    }
}

#[test]
fn adamw_steps_match_the_formulas() {
    let opts = OptimizerOptions {
        microbatches: 2,
        ..OptimizerOptions::adamw(1e-3)
    };
    let (mut m, info) = module_with(&opts);
    assert_eq!(
        info.states,
        vec![
            "adam.m.w".to_string(),
            "adam.v.w".to_string(),
            "adam.step".to_string()
        ]
    );
    let (lr, b1, b2, eps, wd) = (1e-3, 0.9f64, 0.999f64, 1e-8, 0.01);
    let mut wv = W0.to_vec();
    let (mut mm, mut vv) = ([0.0; 4], [0.0; 4]);
    let grads = [G0, [0.3, -0.1, 0.0, 0.2]];
    for (k, g) in grads.iter().enumerate() {
        step(&mut m, g);
        let t = (k + 1) as i32;
        for i in 0..4 {
            let g = g[i] / 2.0;
            wv[i] *= 1.0 - lr * wd;
            mm[i] = b1 * mm[i] + (1.0 - b1) * g;
            vv[i] = b2 * vv[i] + (1.0 - b2) * g * g;
            let mh = mm[i] / (1.0 - b1.powi(t));
            let vh = vv[i] / (1.0 - b2.powi(t));
            wv[i] -= lr * mh / (vh.sqrt() + eps);
        }
        assert_close(&w(&m, "w"), &wv);
        assert_close(&w(&m, "adam.m.w"), &mm);
        assert_close(&w(&m, "adam.v.w"), &vv);
    }
    // The step count is a float state (f64 here, as the parameter is).
    assert_eq!(m.weights["adam.step"].dtype, DType::F64);
    assert_eq!(m.weights["adam.step"].as_f64().unwrap(), &[2.0]);
}

#[test]
fn accumulate_adds_and_every_op_has_its_phase() {
    let (m, _) = module_with(&OptimizerOptions::adamw(1e-3));
    let acc = m.function("accumulate").unwrap();
    let arg_names: Vec<&str> = acc
        .arg_values()
        .map(|v| acc.value(v).name.as_str())
        .collect();
    assert_eq!(arg_names, ["acc.w", "grad.w"]);
    let a = Tensor::from_f64(DType::F64, vec![2, 2], W0.to_vec());
    let b = Tensor::from_f64(DType::F64, vec![2, 2], G0.to_vec());
    let out = run_function(acc, vec![a, b], &f64_opts(), None).unwrap();
    let want: Vec<f64> = W0.iter().zip(G0).map(|(a, b)| a + b).collect();
    assert_close(out[0].as_f64().unwrap(), &want);
    assert_eq!(acc.value(acc.results()[0]).name, "new.acc.w");
    for (fname, phase) in [("accumulate", Phase::BwdWeight), ("optim", Phase::Optim)] {
        let f = m.function(fname).unwrap();
        for &op in f.ops() {
            assert_eq!(f.op(op).phase, Some(phase), "@{fname}");
        }
    }
}

#[test]
fn f32_params_step_in_f32() {
    let mut m = Module::new();
    let ty = TensorType::of(DType::F32, &[3]);
    m.weights
        .insert("b".into(), Tensor::from_f32(vec![3], vec![1.0, 2.0, 3.0]));
    build_optimizer_function(&mut m, &[("b".into(), ty)], &OptimizerOptions::adamw(0.1)).unwrap();
    ppir::verify::verify_module(&m).unwrap();
    assert_eq!(m.weights["adam.step"].dtype, DType::F32);
    let f = m.function("optim").unwrap();
    let mut inputs = HashMap::new();
    inputs.insert(
        "grad.b".to_string(),
        Tensor::from_f32(vec![3], vec![1.0, -1.0, 0.0]),
    );
    let args = bind_args(&m, f, &inputs).unwrap();
    let outs = run_function(f, args, &InterpOptions::default(), None).unwrap();
    // First AdamW step moves each weight by about lr·sign(g) (after the decay).
    let nb = outs[0].as_f64().unwrap();
    let decay = 1.0 - 0.1 * 0.01;
    assert!((nb[0] - (1.0 * decay - 0.1)).abs() < 1e-6, "{nb:?}");
    assert!((nb[1] - (2.0 * decay + 0.1)).abs() < 1e-6, "{nb:?}");
    assert!((nb[2] - 3.0 * decay).abs() < 1e-6, "{nb:?}");
}

#[test]
fn mixed_dtypes_cast_the_bias_correction() {
    let mut m = Module::new();
    let a = TensorType::of(DType::F32, &[2]);
    let h = TensorType::of(DType::F16, &[2]);
    m.weights
        .insert("a".into(), Tensor::zeros(DType::F32, vec![2]));
    m.weights
        .insert("h".into(), Tensor::zeros(DType::F16, vec![2]));
    build_optimizer_function(
        &mut m,
        &[("a".into(), a), ("h".into(), h)],
        &OptimizerOptions::adamw(1e-3),
    )
    .unwrap();
    ppir::verify::verify_module(&m).unwrap();
    let f = m.function("optim").unwrap();
    let casts = f
        .ops()
        .iter()
        .filter(|&&o| f.op(o).kind == ppir::OpKind::Cast)
        .count();
    assert_eq!(casts, 2);
    assert_eq!(m.weights["adam.m.h"].dtype, DType::F16);
}

#[test]
fn errors_are_values() {
    let mut m = Module::new();
    let int_ty = TensorType::of(DType::I64, &[2]);
    let e = build_optimizer_function(
        &mut m,
        &[("n".into(), int_ty)],
        &OptimizerOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("static float type"), "{e}");
    let bad = OptimizerOptions {
        beta1: 1.0,
        ..OptimizerOptions::adamw(1e-3)
    };
    let e = build_optimizer_function(&mut m, &[], &bad)
        .unwrap_err()
        .to_string();
    assert!(e.contains("beta1"), "{e}");
    // A parameter named like a generated value.
    let ty = TensorType::of(DType::F32, &[1]);
    let e = build_optimizer_function(
        &mut m,
        &[("x".into(), ty.clone()), ("grad.x".into(), ty)],
        &OptimizerOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("used twice"), "{e}");
}

#[test]
fn as_a_pass_from_the_registry() {
    let src = r#"
module {
  func @main(%x: tensor<2xf32>, %w: tensor<2xf32> {param}) -> (tensor<2xf32>) {
    %y = "pp.mul"(%x, %w) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
    return %y : tensor<2xf32>
  }
  weight @w : tensor<2xf32> = dense<[1.0, 2.0]>
}
"#;
    let mut m = ppir::text::parse_module(src).unwrap();
    let r = crate::PassRegistry::builtin();
    let pass = r
        .create("optimizer{kind=sgd,lr=0.5,momentum=0.9,microbatches=2}")
        .unwrap();
    let mut pm = crate::PassManager::new();
    pm.add(pass);
    pm.run(&mut m).unwrap();
    let weights: BTreeMap<_, _> = m.weights.clone();
    assert!(weights.contains_key("momentum.w"));
    let text = ppir::text::print_module(&m, &Default::default());
    assert!(text.contains("func @optim(%w: tensor<2xf32> {param}, %grad.w: tensor<2xf32>, %momentum.w: tensor<2xf32> {state})"), "{text}");
    for bad in [
        "optimizer{kind=rmsprop}",
        "optimizer{lr=fast}",
        "optimizer{microbatches=0}",
        "optimizer{beta2=1.5}",
        "optimizer{nope=1}",
    ] {
        assert!(r.create(bad).is_err(), "{bad}");
    }
}
