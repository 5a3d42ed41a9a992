//! Gradient accumulation: for a mean loss, the sum of `@grad` over M equal micro-batches,
//! divided by M, is the gradient of the whole batch (and the mean of the micro-batch losses
//! its loss). Checked on an MLP with cross-entropy, run in f32 by the interpreter, to a
//! relative error of 1e-5.

mod common;

use std::collections::HashMap;

use common::{rel_error, Rng};
use ppcc_passes::autodiff::{build_gradient_function, AutodiffOptions, LossKind};
use ppir::interp::{bind_args, run_function, InterpOptions};
use ppir::{ArgKind, DType, Module, Tensor};

const MLP: &str = r#"
module @mlp {
  func @main(%x: tensor<?x6xf32>, %w1: tensor<6x8xf32> {param}, %b1: tensor<8xf32> {param}, %w2: tensor<8x5xf32> {param}, %b2: tensor<5xf32> {param}) -> (tensor<?x5xf32>) {
    %h = "pp.gemm"(%x, %w1, %b1) : (tensor<?x6xf32>, tensor<6x8xf32>, tensor<8xf32>) -> tensor<?x8xf32> loc("fc1")
    %a = "pp.tanh"(%h) : (tensor<?x8xf32>) -> tensor<?x8xf32> loc("act")
    %l = "pp.matmul"(%a, %w2) : (tensor<?x8xf32>, tensor<8x5xf32>) -> tensor<?x5xf32> loc("fc2")
    %y = "pp.add"(%l, %b2) : (tensor<?x5xf32>, tensor<5xf32>) -> tensor<?x5xf32> loc("fc2/bias")
    return %y : tensor<?x5xf32>
  }
}
"#;

/// The MLP bound to `batch` rows, with `@grad` built (cross-entropy).
fn training_module(batch: u64, weights: &HashMap<String, Tensor>) -> Module {
    let mut m = ppir::text::parse_module(MLP).unwrap();
    ppir::shape::bind_batch(&mut m, batch).unwrap();
    m.weights = weights
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let opts = AutodiffOptions {
        loss: LossKind::CrossEntropy,
        ..AutodiffOptions::default()
    };
    build_gradient_function(&mut m, &opts).unwrap();
    m
}

fn run_grad(m: &Module, x: Tensor, labels: Tensor) -> Vec<Tensor> {
    let g = m.function("grad").unwrap();
    let mut inputs = HashMap::new();
    inputs.insert("x".to_string(), x);
    inputs.insert("labels".to_string(), labels);
    let args = bind_args(m, g, &inputs).unwrap();
    run_function(g, args, &InterpOptions::default(), None).unwrap()
}

#[test]
fn micro_batch_gradients_sum_to_the_batch_gradient() {
    let (batch, micro) = (12usize, 4usize);
    let rows = batch / micro;
    let mut rng = Rng::new(11);
    let mut weights = HashMap::new();
    let parsed = ppir::text::parse_module(MLP).unwrap();
    let main = parsed.function("main").unwrap();
    for &(v, kind) in main.args() {
        if kind != ArgKind::Param {
            continue;
        }
        let shape: Vec<usize> = main
            .ty(v)
            .static_shape()
            .unwrap()
            .iter()
            .map(|&d| d as usize)
            .collect();
        let n = shape.iter().product();
        let data = (0..n).map(|_| rng.uniform(-0.7, 0.7)).collect();
        weights.insert(
            main.value(v).name.clone(),
            Tensor::from_f64(DType::F32, shape, data),
        );
    }
    let x: Vec<f64> = (0..batch * 6).map(|_| rng.uniform(-2.0, 2.0)).collect();
    let labels: Vec<i64> = (0..batch).map(|_| rng.below(5) as i64).collect();

    let full = training_module(batch as u64, &weights);
    let whole = run_grad(
        &full,
        Tensor::from_f64(DType::F32, vec![batch, 6], x.clone()),
        Tensor::from_i64(DType::I64, vec![batch], labels.clone()),
    );

    let part = training_module(rows as u64, &weights);
    let mut sums: Vec<Vec<f64>> = whole.iter().map(|t| vec![0.0; t.num_elements()]).collect();
    for k in 0..micro {
        let xs = x[k * rows * 6..(k + 1) * rows * 6].to_vec();
        let ls = labels[k * rows..(k + 1) * rows].to_vec();
        let outs = run_grad(
            &part,
            Tensor::from_f64(DType::F32, vec![rows, 6], xs),
            Tensor::from_i64(DType::I64, vec![rows], ls),
        );
        for (s, t) in sums.iter_mut().zip(&outs) {
            for (a, b) in s.iter_mut().zip(t.as_f64().unwrap()) {
                *a += b;
            }
        }
    }
    let names = ["loss", "grad.w1", "grad.b1", "grad.w2", "grad.b2"];
    for (i, name) in names.iter().enumerate() {
        let accumulated: Vec<f64> = sums[i].iter().map(|v| v / micro as f64).collect();
        let e = rel_error(&accumulated, whole[i].as_f64().unwrap());
        assert!(
            e <= 1e-5,
            "{name}: relative error {e:e}\n accumulated {accumulated:?}\n whole batch {:?}",
            whole[i].as_f64().unwrap()
        );
    }
}
