//! `ppcc run` end to end: compile a bundled example into a multi-stage plan and train it.
//!
//! - For the MLP, the GPT-style decoder and the two-tower model, 2 and 4 stages, under
//!   GPipe, 1F1B and ZB-H1 with the graph partition (and interleaved 1F1B / ZB-V with the
//!   sequential one), 10 steps of `ppcc run` print the losses of `ppcc train` (the split
//!   program computes every value with the same ops in the same order, so they are equal;
//!   the test allows 1e-5 relative).
//! - A device that panics stops the run within 10 s with the stage named; a device that
//!   stalls makes the others report which tensor they waited for.
//! - A run checkpointed at step 5 and resumed continues the uninterrupted loss curve
//!   exactly; `--trace` writes a trace with every action.

mod pipeline_common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use pipeline_common::{compile, ppcc};

fn tmp(name: &str) -> PathBuf {
    pipeline_common::tmp("ppcc-run-test", name)
}

fn losses(stdout: &str) -> Vec<f64> {
    stdout
        .lines()
        .map(|l| {
            let parts: Vec<&str> = l.split(' ').collect();
            assert!(
                parts.len() == 4 && parts[0] == "step" && parts[2] == "loss",
                "unexpected output line {l:?}"
            );
            parts[3].parse().unwrap()
        })
        .collect()
}

fn assert_same(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: {got:?} vs {want:?}");
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 * w.abs().max(1e-12),
            "{what}: step {k}: run {g} vs train {w}"
        );
    }
}

/// `ppcc run` equals `ppcc train` (the interpreter, one device) on `model` for 1, 2 and 4
/// stages and several schedules, with the stages on the interpreter and as native code.
fn matches_train(model: &str, opts: &[&str]) {
    let mut targs = vec!["train", model, "--steps", "10"];
    targs.extend_from_slice(opts);
    let reference = ppcc(&targs);
    assert!(reference.ok, "{}", reference.stderr);
    let want = losses(&reference.stdout);
    assert_eq!(want.len(), 10);
    let mut configs: Vec<Vec<&str>> = vec![vec!["--stages", "1", "--schedule", "gpipe"]];
    for stages in ["2", "4"] {
        for schedule in ["gpipe", "1f1b", "zb-h1"] {
            configs.push(vec!["--stages", stages, "--schedule", schedule]);
        }
    }
    configs.push(vec![
        "--stages",
        "2",
        "--schedule",
        "zb-v",
        "--partition",
        "sequential",
    ]);
    let name = Path::new(model)
        .file_stem()
        .unwrap()
        .to_string_lossy()
        .to_string();
    for cfg in configs {
        let dir = tmp(&format!("{name}-{}", cfg.join("_")));
        let mut extra = cfg.clone();
        extra.extend_from_slice(opts);
        compile(model, &dir, &extra);
        // The same plan on the interpreter and as native stage modules (the default).
        for target in ["interp", "cpu"] {
            let out = ppcc(&[
                "run",
                dir.to_str().unwrap(),
                "--steps",
                "10",
                "--target",
                target,
            ]);
            assert!(out.ok, "{model} {cfg:?} --target {target}: {}", out.stderr);
            assert_same(
                &format!("{model} {cfg:?} --target {target}"),
                &losses(&out.stdout),
                &want,
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn mlp_run_equals_train() {
    matches_train("examples/mlp.onnx", &["--microbatches", "4"]);
}

#[test]
fn two_tower_run_equals_train() {
    matches_train(
        "examples/two_tower.onnx",
        &[
            "--microbatches",
            "4",
            "--loss",
            "mse",
            "--optimizer",
            "adamw",
        ],
    );
}

#[test]
fn gpt_run_equals_train() {
    // The example bakes its batch of 4 rows into a reshape: one micro-batch per step.
    matches_train("examples/gpt.onnx", &["--microbatches", "1"]);
}

#[test]
fn a_failing_device_stops_the_run() {
    let dir = tmp("fault");
    compile(
        "examples/gpt.onnx",
        &dir,
        &["--stages", "3", "--microbatches", "1"],
    );
    let out = ppcc(&[
        "run",
        dir.to_str().unwrap(),
        "--steps",
        "5",
        "--inject-fault",
        "1:2",
    ]);
    assert!(!out.ok);
    assert!(out.took < Duration::from_secs(10), "took {:?}", out.took);
    assert_eq!(losses(&out.stdout).len(), 2, "steps 0 and 1 finish");
    assert!(
        out.stderr
            .contains("error: device 1 failed: stage 1, step 2")
            && out.stderr.contains("injected fault"),
        "{}",
        out.stderr
    );

    // A stalled stage: its consumer reports the tensor it waited for.
    let out = ppcc(&[
        "run",
        dir.to_str().unwrap(),
        "--steps",
        "3",
        "--inject-fault",
        "0:1:stall=3",
        "--recv-timeout",
        "1",
    ]);
    assert!(!out.ok);
    assert!(out.took < Duration::from_secs(10), "took {:?}", out.took);
    // Stage 1 waits for stage 0 and stage 2 for stage 1; whichever gives up first is
    // reported, naming the tensor, the channel and the producer.
    let named = (1..3).any(|s| {
        out.stderr
            .contains(&format!("stage {s}, step 1, micro-batch 0, @stage{s}.fwd"))
            && out.stderr.contains(&format!(
                "from stage {}, micro-batch 0 (stage {} has not sent it)",
                s - 1,
                s - 1
            ))
    });
    assert!(
        named && out.stderr.contains("waited 1.0 s for %"),
        "{}",
        out.stderr
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn resume_continues_the_loss_curve() {
    let dir = tmp("ckpt-plan");
    let ck = tmp("ckpt");
    compile(
        "examples/mlp.onnx",
        &dir,
        &[
            "--stages",
            "2",
            "--microbatches",
            "4",
            "--optimizer",
            "adamw",
        ],
    );
    let d = dir.to_str().unwrap();
    let full = ppcc(&["run", d, "--steps", "10", "--data", "synthetic-fresh"]);
    assert!(full.ok, "{}", full.stderr);
    let first = ppcc(&[
        "run",
        d,
        "--steps",
        "5",
        "--data",
        "synthetic-fresh",
        "--checkpoint-dir",
        ck.to_str().unwrap(),
        "--checkpoint-every",
        "5",
    ]);
    assert!(first.ok, "{}", first.stderr);
    assert_eq!(
        std::fs::read_to_string(ck.join("latest")).unwrap().trim(),
        "5"
    );
    assert!(ck.join("step-5").join("stage0.npz").exists());
    let trace = dir.join("trace-run.json");
    let rest = ppcc(&[
        "run",
        d,
        "--steps",
        "5",
        "--data",
        "synthetic-fresh",
        "--resume",
        ck.to_str().unwrap(),
        "--trace",
        trace.to_str().unwrap(),
    ]);
    assert!(rest.ok, "{}", rest.stderr);
    assert!(rest.stdout.starts_with("step 5 loss "), "{}", rest.stdout);
    let mut joined = losses(&first.stdout);
    joined.extend(losses(&rest.stdout));
    assert_eq!(joined, losses(&full.stdout), "resumed run differs");

    // The trace has every action of the 5 steps: per step 4 F + 4 B per stage, + OPT.
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let events = v["traceEvents"].as_array().unwrap();
    let actions = events.iter().filter(|e| e["ph"] == "X").count();
    assert_eq!(actions, 5 * 2 * (4 + 4 + 1));
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&ck);
}

#[test]
fn plan_only_directories_are_refused() {
    let dir = tmp("plan-only");
    compile("examples/mlp.onnx", &dir, &["--plan-only"]);
    let out = ppcc(&["run", dir.to_str().unwrap()]);
    assert!(!out.ok);
    assert!(out.stderr.contains("--plan-only"), "{}", out.stderr);
    let out = ppcc(&["run", "/nonexistent-dir"]);
    assert!(!out.ok);
    assert!(out.stderr.contains("plan.json"), "{}", out.stderr);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 12, item 8: plan.json records the size and SHA-256 of every file `ppcc run`
/// loads; a truncated `module.so` (which used to crash the run with SIGBUS) or a modified
/// `params.npz` is an error naming the file, before anything runs.
#[test]
fn damaged_build_directories_are_refused_with_the_file_named() {
    let dir = tmp("damaged");
    compile(
        "examples/mlp.onnx",
        &dir,
        &["--stages", "2", "--microbatches", "2"],
    );
    let d = dir.to_str().unwrap();
    let plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("plan.json")).unwrap()).unwrap();
    assert_eq!(plan["version"], 2);
    for s in 0..2 {
        for f in ["module.so", "params.npz", "stage.ppir"] {
            let rec = &plan["files"][format!("stage{s}/{f}")];
            let len = std::fs::metadata(dir.join(format!("stage{s}")).join(f))
                .unwrap()
                .len();
            assert_eq!(rec["bytes"], len, "stage{s}/{f}");
            assert_eq!(rec["sha256"].as_str().unwrap().len(), 64);
        }
    }
    let ok = ppcc(&["run", d, "--steps", "1"]);
    assert!(ok.ok, "{}", ok.stderr);

    let so = dir.join("stage1").join("module.so");
    let original = std::fs::read(&so).unwrap();
    std::fs::write(&so, &original[..original.len() / 2]).unwrap();
    let out = ppcc(&["run", d, "--steps", "1"]);
    assert!(!out.ok && out.stdout.is_empty());
    assert!(
        out.stderr.contains(&format!(
            "{} has {} bytes but plan.json records {}",
            so.display(),
            original.len() / 2,
            original.len()
        )),
        "{}",
        out.stderr
    );
    std::fs::write(&so, &original).unwrap();

    let params = dir.join("stage0").join("params.npz");
    let mut bytes = std::fs::read(&params).unwrap();
    let last = bytes.len() - 100;
    bytes[last] ^= 1;
    std::fs::write(&params, &bytes).unwrap();
    for target in ["cpu", "interp"] {
        let out = ppcc(&["run", d, "--steps", "1", "--target", target]);
        assert!(!out.ok && out.stdout.is_empty());
        assert!(
            out.stderr
                .contains(&format!("{} is not the file ppcc wrote", params.display())),
            "{target}: {}",
            out.stderr
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 12, item 8: plan.json's `target` must be one ppcc knows (it used to fall back to
/// the interpreter silently), and a plan without sizes and hashes (format version 1) is
/// refused with "compile again" rather than run unchecked.
#[test]
fn unknown_targets_and_unchecked_plans_are_refused() {
    let dir = tmp("bad-target");
    compile(
        "examples/mlp.onnx",
        &dir,
        &["--stages", "2", "--microbatches", "2", "--target", "interp"],
    );
    let d = dir.to_str().unwrap();
    let path = dir.join("plan.json");
    let good: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let write = |v: &serde_json::Value| {
        std::fs::write(&path, serde_json::to_string_pretty(v).unwrap()).unwrap()
    };
    let mut v = good.clone();
    v["target"] = "gpu".into();
    write(&v);
    let out = ppcc(&["run", d, "--steps", "1"]);
    assert!(!out.ok);
    assert!(
        out.stderr
            .contains("plan.json: `target` is \"gpu\"; expected one of \"cpu\", \"interp\""),
        "{}",
        out.stderr
    );
    let mut v = good.clone();
    v["version"] = 1.into();
    v.as_object_mut().unwrap().remove("files");
    write(&v);
    let out = ppcc(&["run", d, "--steps", "1"]);
    assert!(!out.ok);
    assert!(
        out.stderr.contains("format version 1") && out.stderr.contains("compile the model again"),
        "{}",
        out.stderr
    );
    // A file the runtime loads that plan.json does not vouch for.
    let mut v = good.clone();
    v["files"]
        .as_object_mut()
        .unwrap()
        .remove("stage1/stage.ppir");
    write(&v);
    let out = ppcc(&["run", d, "--steps", "1"]);
    assert!(!out.ok);
    assert!(
        out.stderr.contains("records no size and hash for") && out.stderr.contains("stage.ppir"),
        "{}",
        out.stderr
    );
    write(&good);
    let out = ppcc(&["run", d, "--steps", "1"]);
    assert!(out.ok, "{}", out.stderr);
    let _ = std::fs::remove_dir_all(&dir);
}
