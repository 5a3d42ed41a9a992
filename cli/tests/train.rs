//! `ppcc train` end to end on the bundled examples.
//!
//! - Every fixture in `tests/reference/fixtures/` (5-step loss curves from an independent
//!   JAX implementation, see `tests/reference/jax_reference.py`) is reproduced within 1e-4
//!   relative.
//! - M micro-batches give the losses of one full batch (≤ 1e-5 relative) for the models
//!   without batch-norm whose batch size is not baked into a constant (mlp, two_tower).
//! - On repeated synthetic data the GPT example's loss falls.
//! - `--save-onnx` writes a model that continues the same training, and that onnxruntime
//!   loads (when a Python with onnxruntime is around).

mod pipeline_common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Run `ppcc train ARGS` from the repository root; stdout on success, stderr on failure.
fn train(args: &[&str]) -> Result<String, String> {
    let out = Command::new(env!("CARGO_BIN_EXE_ppcc"))
        .arg("train")
        .args(args)
        .current_dir(repo())
        .output()
        .expect("ppcc runs");
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).unwrap())
    } else {
        Err(String::from_utf8(out.stderr).unwrap())
    }
}

/// The losses of `step <k> loss <value>` lines; every stdout line must be one.
fn losses(stdout: &str) -> Vec<f64> {
    stdout
        .lines()
        .enumerate()
        .map(|(k, line)| {
            let parts: Vec<&str> = line.split(' ').collect();
            assert_eq!(parts.len(), 4, "not a step line: {line:?}");
            assert_eq!((parts[0], parts[2]), ("step", "loss"), "{line:?}");
            assert_eq!(parts[1], k.to_string(), "{line:?}");
            parts[3]
                .parse()
                .unwrap_or_else(|_| panic!("bad loss in {line:?}"))
        })
        .collect()
}

fn run(args: &[&str]) -> Vec<f64> {
    match train(args) {
        Ok(out) => losses(&out),
        Err(e) => panic!("ppcc train {} failed:\n{e}", args.join(" ")),
    }
}

fn max_rel(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / y.abs().max(1e-12))
        .fold(0.0, f64::max)
}

/// The command line that reproduces a fixture.
fn fixture_args(f: &serde_json::Value) -> Vec<String> {
    let s = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let o = &f["optimizer"];
    let mut args: Vec<String> = vec![
        s(&f["onnx"]),
        "--data".into(),
        s(&f["data"]),
        "--steps".into(),
        s(&f["steps"]),
        "--batch".into(),
        s(&f["batch"]),
        "--microbatches".into(),
        s(&f["microbatches"]),
        "--loss".into(),
        s(&f["loss"]),
        "--optimizer".into(),
        s(&o["name"]),
        "--lr".into(),
        s(&o["lr"]),
        "--weight-decay".into(),
        s(&o["weight_decay"]),
    ];
    match o["name"].as_str() {
        Some("sgd") => {
            assert_eq!(o["dampening"].as_f64(), Some(0.0));
            assert_eq!(o["nesterov"].as_bool(), Some(false));
            args.extend(["--momentum".into(), s(&o["momentum"])]);
        }
        Some("adamw") => {
            for k in ["beta1", "beta2", "eps"] {
                args.extend([format!("--{k}"), s(&o[k])]);
            }
        }
        other => panic!("unknown optimizer {other:?}"),
    }
    args
}

#[test]
fn losses_match_the_jax_reference_fixtures() {
    let dir = repo().join("tests/reference/fixtures");
    let mut names: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/reference/fixtures exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    names.sort();
    for model in ["mlp", "gpt", "cnn", "two_tower"] {
        for run in ["sgd", "sgd_wd", "adamw"] {
            let want = dir.join(format!("{model}_{run}.json"));
            assert!(names.contains(&want), "missing fixture {}", want.display());
        }
    }
    let mut report = vec![];
    for path in &names {
        let f: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let args = fixture_args(&f);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut interp_args = args.clone();
        interp_args.extend(["--target", "interp"]);
        let got = run(&interp_args);
        let want: Vec<f64> = f["losses"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        let rel = max_rel(&got, &want);
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        // The same training as native code: against JAX, and against the interpreter.
        let mut cpu_args = args.clone();
        cpu_args.extend(["--target", "cpu"]);
        let native = run(&cpu_args);
        let rel_native = max_rel(&native, &want);
        let rel_interp = max_rel(&native, &got);
        report.push(format!(
            "{name}: max rel {rel:.2e} (native {rel_native:.2e}, native vs interpreter {rel_interp:.2e})"
        ));
        assert!(
            rel_native <= 1e-4 && rel_interp <= 1e-5,
            "{name}: native {native:?} vs reference {want:?} (max rel {rel_native:.2e}) and interpreter {got:?} (max rel {rel_interp:.2e})"
        );
        assert!(
            rel <= 1e-4,
            "{name}: ppcc {got:?} vs reference {want:?} (max rel {rel:.2e})\n  ppcc train {}",
            args.join(" ")
        );
    }
    eprintln!("{}", report.join("\n"));
}

#[test]
fn micro_batches_match_the_full_batch() {
    for (model, loss) in [("mlp", "cross-entropy"), ("two_tower", "mse")] {
        let onnx = format!("examples/{model}.onnx");
        let data = format!("examples/{model}_train.npz");
        for opt in ["sgd", "adamw"] {
            let base = [
                onnx.as_str(),
                "--data",
                &data,
                "--steps",
                "5",
                "--loss",
                loss,
                "--optimizer",
                opt,
                "--target",
                "interp",
            ];
            let one = run(&base);
            for m in ["2", "4"] {
                let mut args = base.to_vec();
                args.extend(["--microbatches", m]);
                let many = run(&args);
                let rel = max_rel(&many, &one);
                assert!(
                    rel <= 1e-5,
                    "{model} {opt} M={m}: {many:?} vs M=1 {one:?} ({rel:.2e})"
                );
            }
        }
    }
}

#[test]
fn gpt_loss_falls_on_repeated_synthetic_data() {
    let l = run(&["examples/gpt.onnx", "--steps", "50", "--data", "synthetic"]);
    assert_eq!(l.len(), 50);
    assert!(l.iter().all(|x| x.is_finite()), "{l:?}");
    // About 5.0 → 0.01 today; half is a wide margin.
    assert!(l[49] < 0.5 * l[0], "{l:?}");
    // The same seed gives the same run; another seed other data.
    let again = run(&["examples/gpt.onnx", "--steps", "3", "--data", "synthetic"]);
    assert_eq!(again, l[..3]);
    let other = run(&[
        "examples/gpt.onnx",
        "--steps",
        "1",
        "--data",
        "synthetic",
        "--seed",
        "1",
    ]);
    assert_ne!(other[0], l[0]);
}

#[test]
fn every_example_trains_on_synthetic_data() {
    for (model, loss) in [
        ("mlp", "auto"),
        ("cnn", "auto"),
        ("two_tower", "mse"),
        ("gpt", "auto"),
    ] {
        let l = run(&[
            &format!("examples/{model}.onnx"),
            "--steps",
            "20",
            "--loss",
            loss,
            "--optimizer",
            "adamw",
            "--lr",
            "0.01",
        ]);
        assert!(l[19] < l[0], "{model}: {l:?}");
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ppcc-train-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn saved_onnx_continues_training() {
    let dir = temp_dir("save");
    let saved = dir.join("mlp_trained.onnx");
    let saved_s = saved.to_str().unwrap();
    // Plain SGD keeps no optimizer state, so 2 + 2 steps equal 4 steps (the data has two
    // batches, so the continued run starts on batch 0 as step 2 does).
    let common = [
        "--data",
        "examples/mlp_train.npz",
        "--momentum",
        "0",
        "--lr",
        "0.1",
    ];
    let mut four = vec!["examples/mlp.onnx", "--steps", "4"];
    four.extend(common);
    let four = run(&four);
    let mut first = vec!["examples/mlp.onnx", "--steps", "2", "--save-onnx", saved_s];
    first.extend(common);
    let first = run(&first);
    let mut second = vec![saved_s, "--steps", "2"];
    second.extend(common);
    let second = run(&second);
    assert_eq!(first, four[..2]);
    assert_eq!(second, four[2..]);

    // onnxruntime loads it and computes the trained model's outputs.
    let python = std::env::var("PPCC_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|_| repo().join(".venv/bin/python"));
    let has_ort = Command::new(&python)
        .args(["-c", "import onnxruntime, numpy"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_ort {
        eprintln!(
            "skipping the onnxruntime check: no onnxruntime at {}",
            python.display()
        );
    } else {
        let script = r#"
import sys, numpy as np, onnxruntime as ort
s = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
x = np.load(sys.argv[2])["x"][:8]
y = s.run(None, {"x": x})[0]
assert y.shape == (8, 10) and np.isfinite(y).all(), y
print("ok")
"#;
        let out = Command::new(&python)
            .args(["-c", script, saved_s])
            .arg(repo().join("examples/mlp_train.npz"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "onnxruntime: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn usage_errors_are_clear() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["examples/mlp.onnx", "--microbatches", "3"],
            "must divide the global batch 8",
        ),
        (&["examples/gpt.onnx", "--batch", "8"], "fixed at 4"),
        (
            &["examples/mlp.onnx", "--data", "examples/gpt_train.npz"],
            "has no array `x`",
        ),
        (
            &[
                "examples/mlp.onnx",
                "--data",
                "examples/mlp_train.npz",
                "--batch",
                "32",
            ],
            "16 rows, fewer than one global batch of 32",
        ),
        (&["examples/mlp.onnx", "--data", "nope.npz"], "nope.npz"),
        (&["examples/two_tower.onnx", "--loss", "output"], "scalar"),
    ];
    for (args, want) in cases {
        let e = train(args).expect_err(&format!("{args:?} should fail"));
        assert!(e.contains(want), "{args:?}: {e}");
        assert!(!e.contains("panicked"), "{args:?}: {e}");
    }
}

#[test]
fn help_documents_the_output_format() {
    let out = Command::new(env!("CARGO_BIN_EXE_ppcc"))
        .args(["train", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    for want in [
        "step <k> loss <value>",
        "--microbatches",
        "synthetic",
        "--save-onnx",
    ] {
        assert!(help.contains(want), "{want}: {help}");
    }
}

/// Issue 12, item 9: `ppcc train` runs native code by default, as `ppcc run` does.
#[test]
fn native_code_is_the_default_target() {
    let out = Command::new(env!("CARGO_BIN_EXE_ppcc"))
        .args(["train", "examples/mlp.onnx", "--steps", "3"])
        .current_dir(repo())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("--target cpu)"), "{stderr}");
}

/// Issue 12, item 3: labels outside the classes are refused before training on both
/// targets, naming the row, the value and the class count (native code used to drop
/// them and report a loss of 0.0).
#[test]
fn out_of_range_labels_are_refused_on_both_targets() {
    let dir = temp_dir("labels");
    let bad = dir.join("labels.npz");
    let mut labels = vec![2i64; 16];
    labels[9] = 10;
    pipeline_common::npz_with_ints(
        &repo().join("examples/mlp_train.npz"),
        &bad,
        "labels",
        &[16],
        &labels,
    );
    for target in ["cpu", "interp"] {
        let e = train(&[
            "examples/mlp.onnx",
            "--data",
            bad.to_str().unwrap(),
            "--steps",
            "2",
            "--target",
            target,
        ])
        .expect_err(target);
        assert!(
            e.contains("`labels` row 9: value 10 is outside [0, 10) (the 10 classes"),
            "--target {target}: {e}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Issue 12, item 3: a NaN/inf loss stops training with an error naming the step, unless
/// `--allow-nonfinite-loss`.
#[test]
fn a_nonfinite_loss_stops_training() {
    for target in ["cpu", "interp"] {
        let args = [
            "examples/mlp.onnx",
            "--steps",
            "4",
            "--lr",
            "1e30",
            "--target",
            target,
        ];
        let e = train(&args).expect_err(target);
        assert!(
            e.contains("error: step 1: the loss is NaN"),
            "--target {target}: {e}"
        );
        let mut go_on = args.to_vec();
        go_on.push("--allow-nonfinite-loss");
        assert_eq!(run(&go_on).len(), 4);
    }
}

/// A model whose loss is its own ONNX `SoftmaxCrossEntropyLoss` node (N-d scores, class
/// weights, `ignore_index`; and the plain mean, which imports as the fused loss) trains
/// with `--loss output`: the loss falls, and both targets agree.
#[test]
fn an_onnx_softmax_cross_entropy_loss_trains() {
    let python = std::env::var("PPCC_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|_| repo().join(".venv/bin/python"));
    let has_onnx = Command::new(&python)
        .args(["-c", "import onnx, numpy"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_onnx {
        eprintln!("skipping: no onnx/numpy at {}", python.display());
        return;
    }
    let dir = temp_dir("sce");
    let script = r#"
import sys, numpy as np, onnx
from onnx import helper as h, numpy_helper as nh, TensorProto as T
out, weighted = sys.argv[1], sys.argv[2] == "1"
rng = np.random.default_rng(0)
w = nh.from_array((rng.normal(size=(4, 3)) * 0.1).astype(np.float32), "W")
inputs = ["scores", "y"]
nodes = [
    h.make_node("MatMul", ["x", "W"], ["logits"]),
    h.make_node("Transpose", ["logits"], ["scores"], perm=[0, 2, 1]),
]
attrs = {"reduction": "mean"}
if weighted:
    wts = nh.from_array(np.array([1.0, 2.0, 0.5], np.float32))
    nodes.append(h.make_node("Constant", [], ["wts"], value=wts))
    inputs.append("wts")
    attrs["ignore_index"] = -1
nodes.append(h.make_node("SoftmaxCrossEntropyLoss", inputs, ["loss"], **attrs))
g = h.make_graph(
    nodes, "sce",
    [h.make_tensor_value_info("x", T.FLOAT, [8, 2, 4]), h.make_tensor_value_info("y", T.INT64, [8, 2])],
    [h.make_tensor_value_info("loss", T.FLOAT, [])], [w])
onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 13)]), out + "/sce.onnx")
x = rng.normal(size=(8, 2, 4)).astype(np.float32)
y = rng.integers(0, 3, size=(8, 2))
if weighted:
    y[0, 1] = -1
    y[3, 0] = -1
np.savez(out + "/sce.npz", x=x, y=y.astype(np.int64))
"#;
    for weighted in ["1", "0"] {
        let o = Command::new(&python)
            .args(["-c", script, dir.to_str().unwrap(), weighted])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let (model, data) = (dir.join("sce.onnx"), dir.join("sce.npz"));
        let args = |target| {
            run(&[
                model.to_str().unwrap(),
                "--data",
                data.to_str().unwrap(),
                "--loss",
                "output",
                "--steps",
                "8",
                "--lr",
                "0.5",
                "--target",
                target,
            ])
        };
        let interp = args("interp");
        assert!(
            interp[7] < interp[0] * 0.9,
            "weighted={weighted}: the loss does not fall: {interp:?}"
        );
        let cpu = args("cpu");
        assert!(
            max_rel(&cpu, &interp) < 1e-4,
            "weighted={weighted}: {cpu:?} vs {interp:?}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}
