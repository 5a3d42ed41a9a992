//! Models written by real exporters: `examples/exporters/export.py` builds GPT-2,
//! Llama-style and BERT-style models from Hugging Face `transformers` with random
//! weights and exports each through `torch.onnx.export`'s TorchScript path (`_ts`) and
//! its dynamo path (`_dynamo`); the models, the inputs with onnxruntime's outputs and the
//! training data are committed, so this test needs no torch.
//! - Each model evaluates like onnxruntime (1e-4 relative), on the interpreter and in
//!   native code.
//! - A 2-stage pipeline trains with the losses of `ppcc train` on one device (1e-5
//!   relative). GPT-2 is exported with untied LM-head weights.
//! - GPT-2 with its LM head tied to the token embedding (`gpt2_tied`, one initializer read
//!   by the first and the last layer) evaluates like onnxruntime and trains on one device,
//!   with the same losses from both export paths, and in a 2-stage pipeline (the weight
//!   held by both stages, its gradient parts summed by an all_reduce).

mod pipeline_common;

use pipeline_common::{compile, losses, ppcc, repo};

const MODELS: [&str; 4] = ["gpt2", "llama", "bert", "gpt2_tied"];
const PATHS: [&str; 2] = ["ts", "dynamo"];

fn file(name: &str) -> String {
    repo()
        .join("examples/exporters")
        .join(name)
        .display()
        .to_string()
}

fn eval_like_onnxruntime(model: &str, path: &str) {
    let onnx = file(&format!("{model}_{path}.onnx"));
    let io = file(&format!("{model}_{path}_io.npz"));
    let dir = pipeline_common::tmp("ppcc-exporters", &format!("eval-{model}-{path}"));
    std::fs::create_dir_all(&dir).unwrap();
    let got = dir.join("out.npz").display().to_string();
    for target in ["interp", "cpu"] {
        let out = ppcc(&[
            "eval",
            &onnx,
            "--inputs",
            &io,
            "-o",
            &got,
            "--reference",
            &io,
            "--rtol",
            "1e-4",
            "--target",
            target,
        ]);
        assert!(
            out.ok
                && out
                    .stdout
                    .contains("output `logits`: matches the reference"),
            "{model}_{path} --target {target}:\n{}\n{}",
            out.stdout,
            out.stderr
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `ppcc train` on one device (interpreter): its losses.
fn train_one_device(model: &str, path: &str) -> Vec<f64> {
    let onnx = file(&format!("{model}_{path}.onnx"));
    let data = file(&format!("{model}_train.npz"));
    let mut targs = vec![
        "train", &onnx, "--data", &data, "--steps", "4", "--target", "interp",
    ];
    targs.extend_from_slice(&TRAIN);
    let reference = ppcc(&targs);
    assert!(reference.ok, "{model}_{path}: {}", reference.stderr);
    let want = losses(&reference.stdout);
    assert_eq!(want.len(), 4, "{model}_{path}: {}", reference.stdout);
    assert!(
        want[3] < want[1],
        "{model}_{path}: the loss does not fall: {want:?}"
    );
    want
}

const TRAIN: [&str; 10] = [
    "--loss",
    "cross-entropy",
    "--optimizer",
    "adamw",
    "--lr",
    "0.01",
    "--batch",
    "4",
    "--microbatches",
    "2",
];

/// `ppcc train` on one device (interpreter), then a 2-stage plan run by `ppcc run`
/// (threads, native code): the same losses, and they fall.
fn two_stages_train_like_one_device(model: &str, path: &str) {
    let onnx = file(&format!("{model}_{path}.onnx"));
    let data = file(&format!("{model}_train.npz"));
    let want = train_one_device(model, path);
    let dir = pipeline_common::tmp("ppcc-exporters", &format!("{model}-{path}"));
    let mut cargs = vec!["--stages", "2", "--schedule", "1f1b"];
    cargs.extend_from_slice(&TRAIN);
    compile(&onnx, &dir, &cargs);
    let out = ppcc(&[
        "run",
        dir.to_str().unwrap(),
        "--steps",
        "4",
        "--data",
        &data,
    ]);
    assert!(out.ok, "{model}_{path}: {}", out.stderr);
    let got = losses(&out.stdout);
    assert_eq!(got.len(), want.len(), "{model}_{path}: {got:?} vs {want:?}");
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 * w.abs().max(1e-12),
            "{model}_{path}: step {k}: run {g} vs train {w}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_model_is_committed() {
    for model in MODELS {
        for path in PATHS {
            for f in [
                format!("{model}_{path}.onnx"),
                format!("{model}_{path}_io.npz"),
            ] {
                assert!(std::path::Path::new(&file(&f)).is_file(), "{f} is missing");
            }
        }
        let f = format!("{model}_train.npz");
        assert!(std::path::Path::new(&file(&f)).is_file(), "{f} is missing");
    }
}

#[test]
fn gpt2_ts_evaluates_like_onnxruntime() {
    eval_like_onnxruntime("gpt2", "ts");
}

#[test]
fn gpt2_dynamo_evaluates_like_onnxruntime() {
    eval_like_onnxruntime("gpt2", "dynamo");
}

#[test]
fn llama_ts_evaluates_like_onnxruntime() {
    eval_like_onnxruntime("llama", "ts");
}

#[test]
fn llama_dynamo_evaluates_like_onnxruntime() {
    eval_like_onnxruntime("llama", "dynamo");
}

#[test]
fn bert_ts_evaluates_like_onnxruntime() {
    eval_like_onnxruntime("bert", "ts");
}

#[test]
fn bert_dynamo_evaluates_like_onnxruntime() {
    eval_like_onnxruntime("bert", "dynamo");
}

#[test]
fn gpt2_ts_trains_in_two_stages() {
    two_stages_train_like_one_device("gpt2", "ts");
}

#[test]
fn gpt2_dynamo_trains_in_two_stages() {
    two_stages_train_like_one_device("gpt2", "dynamo");
}

#[test]
fn llama_ts_trains_in_two_stages() {
    two_stages_train_like_one_device("llama", "ts");
}

#[test]
fn llama_dynamo_trains_in_two_stages() {
    two_stages_train_like_one_device("llama", "dynamo");
}

#[test]
fn bert_ts_trains_in_two_stages() {
    two_stages_train_like_one_device("bert", "ts");
}

#[test]
fn bert_dynamo_trains_in_two_stages() {
    two_stages_train_like_one_device("bert", "dynamo");
}

#[test]
fn gpt2_tied_ts_evaluates_like_onnxruntime() {
    eval_like_onnxruntime("gpt2_tied", "ts");
}

#[test]
fn gpt2_tied_dynamo_evaluates_like_onnxruntime() {
    eval_like_onnxruntime("gpt2_tied", "dynamo");
}

/// GPT-2 with its tied LM head over 2 stages: the embedding lives on both (its gradient
/// parts summed by an all_reduce, as plan.json's `collectives` says), and the pipeline trains
/// like one device.
fn tied_two_stages(path: &str) {
    two_stages_train_like_one_device("gpt2_tied", path);
    let onnx = file(&format!("gpt2_tied_{path}.onnx"));
    let dir = pipeline_common::tmp("ppcc-exporters", &format!("gpt2_tied-{path}-plan"));
    let mut cargs = vec!["--stages", "2", "--schedule", "1f1b", "--target", "interp"];
    cargs.extend_from_slice(&TRAIN);
    compile(&onnx, &dir, &cargs);
    let plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("plan.json")).unwrap()).unwrap();
    let c = plan["collectives"].as_array().cloned().unwrap_or_default();
    assert_eq!(c.len(), 1, "{c:?}");
    assert_eq!(c[0]["stages"], serde_json::json!([0, 1]));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn gpt2_tied_ts_trains_in_two_stages() {
    tied_two_stages("ts");
}

#[test]
fn gpt2_tied_dynamo_trains_in_two_stages() {
    tied_two_stages("dynamo");
}

/// Both exports of the tied model hold one embedding weight, and train alike on one device.
#[test]
fn gpt2_tied_trains_on_one_device_from_both_exports() {
    let ts = train_one_device("gpt2_tied", "ts");
    let dynamo = train_one_device("gpt2_tied", "dynamo");
    for (k, (a, b)) in ts.iter().zip(&dynamo).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 * b.abs(),
            "step {k}: TorchScript export {a} vs dynamo export {b}"
        );
    }
}
