//! `--data-parallel D`: D replicas of a P-stage pipeline (P·D workers), each training on
//! its share of the global batch, with every weight gradient summed over the replicas by
//! the `all_reduce` ops of the stages' optimizer functions. 2 stages × 2 replicas train
//! with the losses of one device on the same global batch (threads; interpreter and
//! native code), checkpoints resume the curve, and a replica that fails stops the run.

mod pipeline_common;

use std::path::PathBuf;
use std::time::Duration;

use pipeline_common::{close, compile, losses, ppcc, ppcc_within, tied_gpt};

fn tmp(name: &str) -> PathBuf {
    pipeline_common::tmp("ppcc-dp-test", name)
}

/// `ppcc train` on one device with `opts` for `steps` steps (the interpreter).
fn reference(model: &str, opts: &[&str], steps: &str) -> Vec<f64> {
    let mut args = vec!["train", model, "--steps", steps, "--target", "interp"];
    args.extend_from_slice(opts);
    let out = ppcc(&args);
    assert!(out.ok, "{}", out.stderr);
    losses(&out.stdout)
}

/// Compile `model` for P stages × D replicas with M micro-batches per replica (and the
/// compiler-only options `compile_only`) and check that both targets train like one
/// device running all M·D micro-batches.
#[allow(clippy::too_many_arguments)]
fn check(
    model: &str,
    batch: &str,
    p: &str,
    d: usize,
    m: usize,
    extra: &[&str],
    compile_only: &[&str],
    name: &str,
) {
    let total = (m * d).to_string();
    let mut ref_opts = vec!["--batch", batch, "--microbatches", &total];
    ref_opts.extend_from_slice(extra);
    let want = reference(model, &ref_opts, "5");
    let dir = tmp(name);
    let (d_s, m_s) = (d.to_string(), m.to_string());
    let mut opts = vec![
        "--stages",
        p,
        "--data-parallel",
        &d_s,
        "--microbatches",
        &m_s,
        "--batch",
        batch,
    ];
    opts.extend_from_slice(extra);
    opts.extend_from_slice(compile_only);
    compile(model, &dir, &opts);
    let plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("plan.json")).unwrap()).unwrap();
    assert_eq!(plan["data_parallel"]["replicas"], d);
    let pn: usize = p.parse().unwrap();
    let ranks: Vec<Vec<usize>> = (0..d)
        .map(|r| (0..pn).map(|x| r * pn + x).collect())
        .collect();
    assert_eq!(plan["data_parallel"]["ranks"], serde_json::json!(ranks));
    assert!(plan["data_parallel"]["allreduce_seconds"].as_f64().unwrap() > 0.0);
    // Every trained weight's gradient is summed over the replicas.
    let collectives = plan["collectives"].as_array().unwrap();
    let params = plan["training"]["params"].as_array().unwrap();
    assert_eq!(collectives.len(), params.len());
    assert!(collectives.iter().all(|c| c["replicas"] == true));
    // ZeRO-1: every weight held by one stage is reduce-scattered and all-gathered.
    let zero = compile_only.windows(2).any(|w| w == ["--zero", "1"]);
    for c in collectives {
        let one_stage = c["stages"].as_array().unwrap().len() == 1;
        assert_eq!(c["reduce_scatter"] == true, zero && one_stage, "{c}");
        assert_eq!(c["gather_channel"].is_i64(), zero && one_stage, "{c}");
    }
    if zero {
        let program = std::fs::read_to_string(dir.join("stage0/stage.ppir")).unwrap();
        for op in ["pp.reduce_scatter", "pp.shard", "pp.all_gather"] {
            assert!(program.contains(op), "{op} missing from stage 0");
        }
    }
    for target in ["interp", "cpu"] {
        let got = ppcc(&[
            "run",
            dir.to_str().unwrap(),
            "--steps",
            "5",
            "--target",
            target,
        ]);
        assert!(got.ok, "{name} {target}: {}", got.stderr);
        assert!(
            got.stderr
                .contains(&format!("× {d} data-parallel replicas")),
            "{}",
            got.stderr
        );
        close(&losses(&got.stdout), &want, &format!("{name} {target}"));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn two_stages_two_replicas_equal_one_device() {
    check("examples/gpt.onnx", "16", "2", 2, 2, &[], &[], "gpt");
    check(
        "examples/two_tower.onnx",
        "16",
        "3",
        2,
        2,
        &["--loss", "mse", "--optimizer", "adamw"],
        &[],
        "two-tower",
    );
    check(
        "examples/mlp.onnx",
        "16",
        "2",
        4,
        1,
        &[],
        &["--schedule", "gpipe"],
        "mlp-4x",
    );
}

/// `--zero 1`: optimizer state sharded over the replicas (reduce-scatter, shard update,
/// all-gather) trains exactly like the unsharded run and one device — SGD with momentum
/// and AdamW, 2 and 4 replicas, shards that do not divide the weights evenly.
#[test]
fn zero_one_trains_like_one_device() {
    check(
        "examples/gpt.onnx",
        "16",
        "2",
        2,
        2,
        &["--momentum", "0.9"],
        &["--zero", "1"],
        "gpt-zero",
    );
    check(
        "examples/two_tower.onnx",
        "16",
        "3",
        2,
        2,
        &[
            "--loss",
            "mse",
            "--optimizer",
            "adamw",
            "--weight-decay",
            "0.01",
        ],
        &["--zero", "1"],
        "two-tower-zero",
    );
    // 4 replicas: many weights (biases of 3, 10...) do not split evenly into 4 shards.
    check(
        "examples/mlp.onnx",
        "16",
        "2",
        4,
        1,
        &["--optimizer", "adamw"],
        &["--zero", "1", "--schedule", "gpipe"],
        "mlp-4x-zero",
    );
}

/// A tied weight keeps its all-reduce (over its stages and the replicas) and whole state
/// under `--zero 1`; the other weights are sharded.
#[test]
fn zero_one_with_a_tied_embedding_equals_one_device() {
    let models = tmp("tied-zero-models");
    let model = tied_gpt(&models);
    check(
        &model,
        "8",
        "2",
        2,
        2,
        &["--momentum", "0.9"],
        &["--split", "off", "--zero", "1"],
        "tied-zero",
    );
    let _ = std::fs::remove_dir_all(&models);
}

/// With `--zero 1` the predicted memory per device holds 1/D of the optimizer state, and
/// the stage's optimizer state shards are 1/D of the weights.
#[test]
fn zero_one_predicts_and_holds_less_optimizer_state() {
    let peak = |zero: &str, name: &str| -> f64 {
        let dir = tmp(name);
        compile(
            "examples/two_tower.onnx",
            &dir,
            &[
                "--stages",
                "2",
                "--data-parallel",
                "4",
                "--microbatches",
                "2",
                "--batch",
                "16",
                "--optimizer",
                "adamw",
                "--loss",
                "mse",
                "--zero",
                zero,
            ],
        );
        let plan: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("plan.json")).unwrap()).unwrap();
        let p = plan["prediction"]["peak_memory_bytes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .sum();
        let _ = std::fs::remove_dir_all(&dir);
        p
    };
    let (whole, sharded) = (peak("0", "mem-0"), peak("1", "mem-1"));
    assert!(sharded < whole, "{sharded} vs {whole}");
    // --zero 2/3 are refused by the command line.
    let out = ppcc(&["examples/mlp.onnx", "-o", "/nonexistent", "--zero", "2"]);
    assert!(!out.ok);
    assert!(out.stderr.contains("--zero"), "{}", out.stderr);
}

#[test]
fn tied_embedding_with_replicas_equals_one_device() {
    let models = tmp("tied-models");
    let model = tied_gpt(&models);
    check(
        &model,
        "8",
        "2",
        2,
        2,
        &[],
        &["--split", "off", "--schedule", "zb-v"],
        "tied-zbv",
    );
    let _ = std::fs::remove_dir_all(&models);
}

/// A 2 × 2 GPT (with `extra` compile options) run 4 steps at once, and as 2 steps with a
/// checkpoint plus 2 resumed from it, gives the same curve; the checkpoint holds `files`.
fn checkpoint_resumes(name: &str, extra: &[&str], files: &[&str]) {
    let dir = tmp(name);
    let plan = dir.join("plan");
    let mut opts = vec![
        "--stages",
        "2",
        "--data-parallel",
        "2",
        "--microbatches",
        "1",
        "--batch",
        "8",
    ];
    opts.extend_from_slice(extra);
    compile("examples/gpt.onnx", &plan, &opts);
    let p = plan.to_str().unwrap();
    let whole = ppcc(&["run", p, "--steps", "4", "--target", "interp"]);
    assert!(whole.ok, "{}", whole.stderr);
    let ck = dir.join("ck");
    let first = ppcc(&[
        "run",
        p,
        "--steps",
        "2",
        "--target",
        "interp",
        "--checkpoint-dir",
        ck.to_str().unwrap(),
        "--checkpoint-every",
        "2",
    ]);
    assert!(first.ok, "{}", first.stderr);
    for f in files {
        assert!(ck.join("step-2").join(f).exists(), "{f}");
    }
    let rest = ppcc(&[
        "run",
        p,
        "--steps",
        "2",
        "--target",
        "interp",
        "--resume",
        ck.to_str().unwrap(),
    ]);
    assert!(rest.ok, "{}", rest.stderr);
    let mut curve = losses(&first.stdout);
    curve.extend(losses(&rest.stdout));
    assert_eq!(curve, losses(&whole.stdout));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn replicated_checkpoints_resume_the_curve() {
    checkpoint_resumes("ckpt", &[], &["stage0.npz", "stage1.npz"]);
}

/// Checkpoints of a ZeRO-1 run hold every replica's optimizer state shards and resume
/// the curve.
#[test]
fn zero_one_checkpoints_resume_the_curve() {
    checkpoint_resumes(
        "ckpt-zero",
        &["--optimizer", "adamw", "--zero", "1"],
        &[
            "stage0.npz",
            "stage1.npz",
            "stage0.replica1.npz",
            "stage1.replica1.npz",
        ],
    );
}

#[test]
fn a_failing_replica_stops_every_worker() {
    let dir = tmp("fault");
    compile(
        "examples/gpt.onnx",
        &dir,
        &[
            "--stages",
            "2",
            "--data-parallel",
            "2",
            "--microbatches",
            "2",
            "--batch",
            "16",
        ],
    );
    let out = ppcc_within(
        &[
            "run",
            dir.to_str().unwrap(),
            "--steps",
            "4",
            "--target",
            "interp",
            "--inject-fault",
            "1:1:replica=1",
        ],
        Duration::from_secs(10),
    )
    .expect("the run stops within 10 s");
    assert!(!out.ok);
    assert!(
        out.stderr.contains("device 3 failed") && out.stderr.contains("injected fault"),
        "{}",
        out.stderr
    );
    // A replica count that does not divide the batch is refused before anything is built.
    let bad = ppcc(&[
        "examples/gpt.onnx",
        "-o",
        tmp("bad").to_str().unwrap(),
        "--stages",
        "2",
        "--data-parallel",
        "3",
        "--batch",
        "16",
    ]);
    assert!(!bad.ok);
    assert!(
        bad.stderr
            .contains("--data-parallel 3 must divide the global batch 16"),
        "{}",
        bad.stderr
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn devices_chooses_stages_times_replicas() {
    let dir = tmp("devices");
    let out = ppcc(&[
        "examples/two_tower.onnx",
        "-o",
        dir.to_str().unwrap(),
        "--devices",
        "4",
        "--batch",
        "16",
        "--loss",
        "mse",
        "--plan-only",
    ]);
    assert!(out.ok, "{}", out.stderr);
    let text = format!("{}{}", out.stdout, out.stderr);
    assert!(text.contains("--devices 4: global batch 16"), "{text}");
    // Every split of 4 devices was planned, and one chosen.
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("predicted step"))
        .collect();
    assert_eq!(rows.len(), 3, "{text}");
    for pd in ["4 × 1", "2 × 2", "1 × 4"] {
        assert!(rows.iter().any(|r| r.contains(pd)), "{pd}: {text}");
    }
    let chosen: Vec<&&str> = rows.iter().filter(|r| r.contains("<- chosen")).collect();
    assert_eq!(chosen.len(), 1, "{text}");
    let plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("plan.json")).unwrap()).unwrap();
    let p = plan["devices"].as_u64().unwrap();
    let d = plan["data_parallel"]["replicas"].as_u64().unwrap_or(1);
    assert_eq!(p * d, 4);
    assert!(chosen[0].contains(&format!("{p} × {d}")), "{text}");
    // --devices and --data-parallel exclude each other.
    let both = ppcc(&[
        "examples/gpt.onnx",
        "-o",
        dir.to_str().unwrap(),
        "--devices",
        "4",
        "--data-parallel",
        "2",
    ]);
    assert!(!both.ok);
    let _ = std::fs::remove_dir_all(&dir);
}
