//! Training through the opset-23 transformer ops (`Attention`, `RMSNormalization`,
//! `RotaryEmbedding`), which the ONNX importer decomposes into ppir ops.
//!
//! The model is `transformer_ops/block.py`'s Llama-style block (grouped-query causal
//! attention with softcap and a boolean mask, rotary embeddings full and partial,
//! interleaved and not, RMS norms), written by the onnx package through `PPCC_PYTHON`.
//! - The block's output equals the onnx reference implementation's (`ppcc conform`,
//!   interpreter and native code).
//! - Every weight's gradient (autodiff of the imported model, run by the interpreter in
//!   f64) matches central finite differences to 1e-6 relative.
//! - `ppcc run` of a 2-stage plan prints the losses of `ppcc train` (interpreter and
//!   native code, 1e-5 relative).

mod pipeline_common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use pipeline_common::{compile, losses, ppcc, repo};
use ppcc_passes::autodiff::{build_gradient_function, AutodiffOptions, LossKind};
use ppir::interp::{bind_args, run_function, InterpOptions, Precision};
use ppir::{DType, Module, Tensor, TensorData};

fn python() -> String {
    std::env::var("PPCC_PYTHON")
        .unwrap_or_else(|_| repo().join(".venv/bin/python").display().to_string())
}

/// The folder with `block.onnx` and `block_loss.onnx`, written once per test process.
fn models() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = pipeline_common::tmp("ppcc-transformer-ops", "models");
        let out = Command::new(python())
            .arg(repo().join("cli/tests/transformer_ops/block.py"))
            .arg(&dir)
            .output()
            .expect("python runs (set PPCC_PYTHON or run scripts/setup.sh --test)");
        assert!(
            out.status.success(),
            "block.py failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        dir
    })
}

#[test]
fn forward_matches_the_reference() {
    let case = models().join("block_case");
    for target in ["interp", "cpu"] {
        let out = ppcc(&["conform", case.to_str().unwrap(), "--target", target]);
        assert!(
            out.ok && out.stdout.contains("1 passed"),
            "--target {target}:\n{}\n{}",
            out.stdout,
            out.stderr
        );
    }
}

fn run(m: &Module, name: &str, inputs: &HashMap<String, Tensor>) -> Vec<Tensor> {
    let f = m.function(name).unwrap();
    let args = bind_args(m, f, inputs).unwrap_or_else(|e| panic!("{e}"));
    let opts = InterpOptions {
        precision: Precision::F64,
    };
    run_function(f, args, &opts, None).unwrap_or_else(|e| panic!("@{name}: {e}"))
}

fn loss_at(m: &Module, inputs: &HashMap<String, Tensor>) -> f64 {
    run(m, "grad", inputs)[0].as_f64().unwrap()[0]
}

fn set(t: &mut Tensor, i: usize, x: f64) {
    match &mut t.data {
        TensorData::Float(v) => v[i] = x,
        TensorData::Int(_) => panic!("not a float tensor"),
    }
}

#[test]
fn gradients_match_finite_differences() {
    let path = models().join("block_loss.onnx");
    let mut m = ppcc_frontends::onnx::import_onnx_file(&path, &Default::default())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let opts = AutodiffOptions {
        loss: LossKind::Output,
        ..AutodiffOptions::default()
    };
    let info = build_gradient_function(&mut m, &opts).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(info.params.len(), 6, "{:?}", info.params);
    // A fixed pseudo-random input.
    let x: Vec<f64> = (0..2 * 6 * 16)
        .map(|i| ((i as f64 * 0.618_034).fract() - 0.5) * 2.0)
        .collect();
    let inputs = HashMap::from([(
        "x".to_string(),
        Tensor::from_f64(DType::F32, vec![2, 6, 16], x),
    )]);
    let outs = run(&m, "grad", &inputs);
    const H: f64 = 1e-4;
    for (k, p) in info.params.iter().enumerate() {
        let analytic = outs[1 + k].as_f64().unwrap().to_vec();
        let original = m.weights[p].clone();
        let n = original.num_elements();
        // Every element of the small weights, every 5th of the projections.
        let stride = if n <= 16 { 1 } else { 5 };
        let (mut worst, mut scale) = (0.0f64, 1e-5f64);
        for i in (0..n).step_by(stride) {
            let x0 = original.as_f64().unwrap()[i];
            let mut at = |x: f64| {
                set(m.weights.get_mut(p).unwrap(), i, x);
                loss_at(&m, &inputs)
            };
            let (p1, m1, p2, m2) = (at(x0 + H), at(x0 - H), at(x0 + 2.0 * H), at(x0 - 2.0 * H));
            set(m.weights.get_mut(p).unwrap(), i, x0);
            let fd = (8.0 * (p1 - m1) - (p2 - m2)) / (12.0 * H);
            worst = worst.max((fd - analytic[i]).abs());
            scale = scale.max(fd.abs()).max(analytic[i].abs());
        }
        let rel = worst / scale;
        eprintln!("grad.{p}: max relative error {rel:.2e}");
        assert!(rel <= 1e-6, "grad.{p}: relative error {rel:e}");
        assert!(
            analytic.iter().any(|g| g.abs() > 1e-3),
            "grad.{p} is (nearly) zero: {analytic:?}"
        );
    }
}

#[test]
fn two_stages_train_like_one_device() {
    let model = models().join("block.onnx");
    let model = model.to_str().unwrap();
    let common = ["--loss", "mse", "--lr", "0.05", "--microbatches", "1"];
    let mut targs = vec!["train", model, "--steps", "8", "--target", "interp"];
    targs.extend_from_slice(&common);
    let reference = ppcc(&targs);
    assert!(reference.ok, "{}", reference.stderr);
    let want = losses(&reference.stdout);
    assert_eq!(want.len(), 8);
    assert!(want[7] < want[0], "the loss does not fall: {want:?}");
    let dir = pipeline_common::tmp("ppcc-transformer-ops", "two-stages");
    let mut cargs = vec!["--stages", "2", "--schedule", "1f1b"];
    cargs.extend_from_slice(&common);
    compile(model, &dir, &cargs);
    for target in ["interp", "cpu"] {
        let out = ppcc(&[
            "run",
            dir.to_str().unwrap(),
            "--steps",
            "8",
            "--target",
            target,
        ]);
        assert!(out.ok, "--target {target}: {}", out.stderr);
        let got = losses(&out.stdout);
        assert_eq!(
            got.len(),
            want.len(),
            "--target {target}: {got:?} vs {want:?}"
        );
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 * w.abs().max(1e-12),
                "--target {target}: step {k}: run {g} vs train {w}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
