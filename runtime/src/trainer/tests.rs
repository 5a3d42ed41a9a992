//! The training loop on hand-written modules (no autodiff): call order, accumulation and
//! the 1/M scale, state updates, `rng`, and errors.

use std::collections::BTreeMap;

use ppir::{DType, Module, Tensor};

use super::*;
use crate::data::{ArraySource, BatchSource};

/// Linear least squares on `r`-row micro-batches: loss = mean((x·w − y)²),
/// grad.w = (2/r)·xᵀ(x·w − y); SGD with lr 0.1 on the sum of M gradients scaled by 1/M.
fn linear_module(r: usize, m: usize) -> Module {
    let scale = 2.0 / r as f64;
    let inv_m = 1.0 / m as f64;
    let src = format!(
        r#"
module {{
  func @grad(%x: tensor<{r}x2xf64>, %labels: tensor<{r}x1xf64>, %w: tensor<2x1xf64> {{param}}, %count: tensor<f64> {{state}}) -> (tensor<f64>, tensor<2x1xf64>, tensor<f64>) {{
    %p = "pp.matmul"(%x, %w) : (tensor<{r}x2xf64>, tensor<2x1xf64>) -> tensor<{r}x1xf64>
    %d = "pp.sub"(%p, %labels) : (tensor<{r}x1xf64>, tensor<{r}x1xf64>) -> tensor<{r}x1xf64>
    %dd = "pp.mul"(%d, %d) : (tensor<{r}x1xf64>, tensor<{r}x1xf64>) -> tensor<{r}x1xf64>
    %loss = "pp.reduce_mean"(%dd) {{keepdims = 0}} : (tensor<{r}x1xf64>) -> tensor<f64>
    %xt = "pp.transpose"(%x) : (tensor<{r}x2xf64>) -> tensor<2x{r}xf64>
    %g = "pp.matmul"(%xt, %d) : (tensor<2x{r}xf64>, tensor<{r}x1xf64>) -> tensor<2x1xf64>
    %c = "pp.constant"() {{value = dense<[{scale:?}]> : tensor<f64>}} : () -> tensor<f64>
    %grad.w = "pp.mul"(%g, %c) : (tensor<2x1xf64>, tensor<f64>) -> tensor<2x1xf64>
    %one = "pp.constant"() {{value = dense<[1.0]> : tensor<f64>}} : () -> tensor<f64>
    %new.count = "pp.add"(%count, %one) : (tensor<f64>, tensor<f64>) -> tensor<f64>
    return %loss, %grad.w, %new.count : tensor<f64>, tensor<2x1xf64>, tensor<f64>
  }}
  func @accumulate(%acc.w: tensor<2x1xf64>, %grad.w: tensor<2x1xf64>) -> (tensor<2x1xf64>) {{
    %new.acc.w = "pp.add"(%acc.w, %grad.w) : (tensor<2x1xf64>, tensor<2x1xf64>) -> tensor<2x1xf64>
    return %new.acc.w : tensor<2x1xf64>
  }}
  func @optim(%w: tensor<2x1xf64> {{param}}, %grad.w: tensor<2x1xf64>) -> (tensor<2x1xf64>) {{
    %s = "pp.constant"() {{value = dense<[{inv_m:?}]> : tensor<f64>}} : () -> tensor<f64>
    %g = "pp.mul"(%grad.w, %s) : (tensor<2x1xf64>, tensor<f64>) -> tensor<2x1xf64>
    %lr = "pp.constant"() {{value = dense<[0.1]> : tensor<f64>}} : () -> tensor<f64>
    %u = "pp.mul"(%g, %lr) : (tensor<2x1xf64>, tensor<f64>) -> tensor<2x1xf64>
    %new.w = "pp.sub"(%w, %u) : (tensor<2x1xf64>, tensor<2x1xf64>) -> tensor<2x1xf64>
    return %new.w : tensor<2x1xf64>
  }}
  weight @w : tensor<2x1xf64> = dense<[0.5, -0.5]>
  weight @count : tensor<f64> = dense<[0.0]>
}}
"#
    );
    let m = ppir::text::parse_module(&src).unwrap();
    ppir::verify::verify_module(&m).unwrap();
    m
}

/// 16 rows of y = 2·x0 − x1 + noise, as two global batches of 8.
fn linear_data() -> BTreeMap<String, Tensor> {
    let mut xs = vec![];
    let mut ys = vec![];
    for i in 0..16 {
        let (a, b) = ((i as f64 * 0.37).sin(), (i as f64 * 0.91).cos());
        xs.extend([a, b]);
        ys.push(2.0 * a - b + 0.01 * i as f64);
    }
    BTreeMap::from([
        (
            "x".to_string(),
            Tensor::from_f64(DType::F64, vec![16, 2], xs),
        ),
        (
            "labels".to_string(),
            Tensor::from_f64(DType::F64, vec![16, 1], ys),
        ),
    ])
}

fn train(m: usize, steps: u64) -> (Vec<f64>, Trainer) {
    let opts = TrainerOptions {
        microbatches: m,
        ..Default::default()
    };
    let mut t = Trainer::new(linear_module(8 / m, m), opts).unwrap();
    let mut data = ArraySource::new(linear_data(), 8).unwrap();
    let losses = (0..steps)
        .map(|k| t.step(&data.batch(k).unwrap()).unwrap().loss)
        .collect();
    (losses, t)
}

#[test]
fn micro_batches_give_the_full_batch_step() {
    let (l1, t1) = train(1, 5);
    let (l4, t4) = train(4, 5);
    for (a, b) in l1.iter().zip(&l4) {
        assert!((a - b).abs() <= 1e-12 * a.abs(), "{l1:?} vs {l4:?}");
    }
    let (w1, w4) = (&t1.weights()["w"], &t4.weights()["w"]);
    for (a, b) in w1.to_f64_vec().iter().zip(w4.to_f64_vec()) {
        assert!((a - b).abs() <= 1e-12, "{w1:?} vs {w4:?}");
    }
    // The loss falls, and the state was updated once per micro-batch.
    assert!(l1[4] < l1[0], "{l1:?}");
    assert_eq!(t1.weights()["count"].to_f64_vec(), vec![5.0]);
    assert_eq!(t4.weights()["count"].to_f64_vec(), vec![20.0]);
    assert_eq!(t4.step_index(), 5);
    assert_eq!(t4.global_batch(), 8);
}

#[test]
fn first_step_matches_a_hand_computed_update() {
    let (_, t) = train(2, 1);
    let data = linear_data();
    let (x, y) = (data["x"].to_f64_vec(), data["labels"].to_f64_vec());
    let w0 = [0.5, -0.5];
    let mut g = [0.0; 2];
    for i in 0..8 {
        let d = x[2 * i] * w0[0] + x[2 * i + 1] * w0[1] - y[i];
        g[0] += 2.0 / 8.0 * x[2 * i] * d;
        g[1] += 2.0 / 8.0 * x[2 * i + 1] * d;
    }
    let w = t.weights()["w"].to_f64_vec();
    for k in 0..2 {
        assert!((w[k] - (w0[k] - 0.1 * g[k])).abs() < 1e-12, "{w:?}");
    }
}

#[test]
fn calls_come_in_training_order() {
    let mut t = Trainer::new(
        linear_module(2, 4),
        TrainerOptions {
            microbatches: 4,
            ..Default::default()
        },
    )
    .unwrap();
    let batch = ArraySource::new(linear_data(), 8)
        .unwrap()
        .batch(0)
        .unwrap();
    let r = t.step(&batch).unwrap();
    let calls: Vec<String> = r
        .calls
        .iter()
        .map(|c| match c.micro {
            Some(m) => format!("{}[{m}]", c.function),
            None => c.function.clone(),
        })
        .collect();
    assert_eq!(
        calls,
        [
            "grad[0]",
            "grad[1]",
            "accumulate[1]",
            "grad[2]",
            "accumulate[2]",
            "grad[3]",
            "accumulate[3]",
            "optim"
        ]
    );
    assert_eq!(r.micro_losses.len(), 4);
    let mean = r.micro_losses.iter().sum::<f64>() / 4.0;
    assert_eq!(r.loss, mean);
}

#[test]
fn rng_is_step_and_micro_batch() {
    let src = r#"
module {
  func @grad(%x: tensor<1x1xf32>, %rng: tensor<2xi64>, %seen: tensor<2xf32> {state}) -> (tensor<f32>, tensor<2xf32>) {
    %loss = "pp.reduce_sum"(%x) {keepdims = 0} : (tensor<1x1xf32>) -> tensor<f32>
    %new.seen = "pp.cast"(%rng) {to = f32} : (tensor<2xi64>) -> tensor<2xf32>
    return %loss, %new.seen : tensor<f32>, tensor<2xf32>
  }
  func @accumulate() -> () {
    return
  }
  func @optim() -> () {
    return
  }
  weight @seen : tensor<2xf32> = dense<[0.0, 0.0]>
}
"#;
    let m = ppir::text::parse_module(src).unwrap();
    let opts = TrainerOptions {
        microbatches: 3,
        ..Default::default()
    };
    let mut t = Trainer::new(m, opts).unwrap();
    let batch = Batch::from([(
        "x".to_string(),
        Tensor::from_f32(vec![3, 1], vec![1.0, 2.0, 6.0]),
    )]);
    let r = t.step(&batch).unwrap();
    assert_eq!(r.micro_losses, vec![1.0, 2.0, 6.0]);
    assert_eq!(r.loss, 3.0);
    assert_eq!(t.weights()["seen"].to_f64_vec(), vec![0.0, 2.0]);
    t.step(&batch).unwrap();
    assert_eq!(t.weights()["seen"].to_f64_vec(), vec![1.0, 2.0]);
}

#[test]
fn bad_modules_and_batches_are_errors() {
    // M > 1 needs @accumulate.
    let mut m = linear_module(2, 4);
    m.functions.retain(|f| f.name != "accumulate");
    let opts = TrainerOptions {
        microbatches: 4,
        ..Default::default()
    };
    let e = Trainer::new(m.clone(), opts.clone())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("no function @accumulate"), "{e}");
    // ... but M = 1 does not.
    Trainer::new(m, TrainerOptions::default()).unwrap();

    let mut m = linear_module(8, 1);
    m.weights.remove("w");
    let e = Trainer::new(m, TrainerOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("@grad") && e.contains("no weight `w`"), "{e}");

    let mut t = Trainer::new(linear_module(8, 1), TrainerOptions::default()).unwrap();
    let mut batch = ArraySource::new(linear_data(), 8)
        .unwrap()
        .batch(0)
        .unwrap();
    batch.remove("labels");
    let e = t.step(&batch).unwrap_err().to_string();
    assert!(e.contains("no array `labels`"), "{e}");
    let wrong = ArraySource::new(linear_data(), 4)
        .unwrap()
        .batch(0)
        .unwrap();
    let e = t.step(&wrong).unwrap_err().to_string();
    assert!(e.contains("expected 8 rows"), "{e}");
    assert_eq!(t.step_index(), 0);

    // An interpreter failure names the step, micro-batch and function.
    let mut bad = linear_data();
    bad.insert("x".into(), Tensor::from_f32(vec![16, 2], vec![0.0; 32]));
    let batch = ArraySource::new(bad, 8).unwrap().batch(0).unwrap();
    let e = t.step(&batch).unwrap_err().to_string();
    assert!(e.starts_with("step 0, micro-batch 0: @grad:"), "{e}");
}
