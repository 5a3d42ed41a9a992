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

use pipeline_common::{
    compile, losses, npz_entries, npz_with_ints, ppcc, ppcc_within, write_npz_entries,
};

fn tmp(name: &str) -> PathBuf {
    pipeline_common::tmp("ppcc-run-test", name)
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
    // The interpreter is the reference (`ppcc train`'s default is native code).
    let mut targs = vec!["train", model, "--steps", "10", "--target", "interp"];
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
    for schedule in ["zb-v", "dualpipe-v"] {
        configs.push(vec![
            "--stages",
            "2",
            "--schedule",
            schedule,
            "--partition",
            "sequential",
        ]);
    }
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

/// `--test-link`: the framing that `--nccl` uses (payloads over an ordered byte link,
/// headers over the transport, messages kept until asked for), over memory, trains with
/// exactly the losses of the plain transport: a stage DAG, a V schedule whose neighbours
/// send both ways, and a chain; `--nccl` on a CPU plan is refused.
#[test]
fn framed_links_train_like_the_plain_transport() {
    let cases: [(&str, &[&str]); 3] = [
        (
            "examples/two_tower.onnx",
            &["--stages", "3", "--microbatches", "4", "--loss", "mse"],
        ),
        (
            "examples/mlp.onnx",
            &[
                "--stages",
                "2",
                "--schedule",
                "zb-v",
                "--partition",
                "sequential",
                "--microbatches",
                "4",
            ],
        ),
        (
            "examples/gpt.onnx",
            &["--stages", "3", "--schedule", "1f1b", "--microbatches", "1"],
        ),
    ];
    for (model, opts) in cases {
        let dir = tmp(&format!("framed-{}", opts.join("_")));
        compile(model, &dir, opts);
        let d = dir.to_str().unwrap();
        let plain = ppcc(&["run", d, "--steps", "4"]);
        assert!(plain.ok, "{model} {opts:?}: {}", plain.stderr);
        let framed = ppcc(&["run", d, "--steps", "4", "--test-link"]);
        assert!(framed.ok, "{model} {opts:?} --test-link: {}", framed.stderr);
        let (want, got) = (losses(&plain.stdout), losses(&framed.stdout));
        assert_eq!(want.len(), 4);
        assert_eq!(got, want, "{model} {opts:?}: framed vs plain losses");
        // Every device's tensors went over the link: each sent and received some.
        let lines: Vec<&str> = framed
            .stderr
            .lines()
            .filter(|l| l.starts_with("device ") && l.contains("over the in-memory link"))
            .collect();
        assert_eq!(
            lines.len(),
            opts[1].parse::<usize>().unwrap(),
            "{}",
            framed.stderr
        );
        for l in lines {
            let count = |what: &str| -> u64 {
                let at = l.find(what).unwrap();
                let before = l[..at].trim_end();
                before[before.rfind(' ').unwrap() + 1..].parse().unwrap()
            };
            assert!(
                count(" messages sent") > 0 && count(" received (") > 0,
                "{l}"
            );
        }
        if model.contains("two_tower") {
            // The interpreter passes tensors, not native bytes: the other way in.
            let args = ["run", d, "--steps", "4", "--target", "interp"];
            let plain = ppcc(&args);
            assert!(plain.ok, "{}", plain.stderr);
            let framed = ppcc(&[&args[..], &["--test-link"]].concat());
            assert!(framed.ok, "{}", framed.stderr);
            assert_eq!(losses(&framed.stdout), losses(&plain.stdout), "interp");
        }
        if model.contains("mlp") {
            let out = ppcc(&["run", d, "--steps", "1", "--nccl"]);
            assert!(!out.ok);
            assert!(
                out.stderr.contains("--nccl") && out.stderr.contains("--target cuda"),
                "{}",
                out.stderr
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// `--split`: a plan whose ops are cut into pieces (the LM head along its vocabulary or
/// its contraction, an MLP's layers) trains like the unsplit model on one device, on the
/// interpreter and as native code, and `--save-onnx` writes the original, joined weights.
#[test]
fn split_ops_train_like_the_unsplit_model() {
    for (model, opts, split, stages) in [
        (
            "examples/gpt.onnx",
            ["--microbatches", "1"],
            "lm_head=2",
            "2",
        ),
        (
            "examples/gpt.onnx",
            ["--microbatches", "1"],
            "lm_head=3:k",
            "4",
        ),
        (
            "examples/gpt.onnx",
            ["--microbatches", "1"],
            "wte=2,lm_head=2",
            "3",
        ),
        (
            "examples/gpt.onnx",
            ["--microbatches", "1"],
            "blocks.0.attn/MatMul_qk=2:h,blocks.0.attn/MatMul_av=2:h",
            "2",
        ),
        (
            "examples/mlp.onnx",
            ["--microbatches", "4"],
            "fc1=2:n,fc2=2:k,fc3=2",
            "2",
        ),
    ] {
        let mut targs = vec!["train", model, "--steps", "6", "--target", "interp"];
        targs.extend_from_slice(&opts);
        let reference = ppcc(&targs);
        assert!(reference.ok, "{}", reference.stderr);
        let want = losses(&reference.stdout);
        let dir = tmp(&format!(
            "split-{}-{stages}",
            split.replace([',', ':', '=', '/'], "_")
        ));
        let mut extra = vec!["--stages", stages, "--split", split];
        extra.extend_from_slice(&opts);
        compile(model, &dir, &extra);
        let plan = std::fs::read_to_string(dir.join("plan.json")).unwrap();
        assert!(
            plan.contains("\"splits\""),
            "{split}: plan.json records the splits"
        );
        if split == "lm_head=2" {
            // Split along the vocabulary, the loss goes with the pieces.
            assert!(plan.contains("log-sum-exp merge"), "{split}: {plan}");
        }
        for target in ["interp", "cpu"] {
            let saved = dir.join(format!("trained-{target}.onnx"));
            let out = ppcc(&[
                "run",
                dir.to_str().unwrap(),
                "--steps",
                "6",
                "--target",
                target,
                "--save-onnx",
                saved.to_str().unwrap(),
            ]);
            assert!(out.ok, "{model} {split} --target {target}: {}", out.stderr);
            assert_same(
                &format!("{model} --split {split} --target {target}"),
                &losses(&out.stdout),
                &want,
            );
            // The saved model has the original weights' shapes: it imports and trains.
            let mut again = vec!["train", saved.to_str().unwrap(), "--steps", "1"];
            again.extend_from_slice(&opts);
            let out = ppcc(&again);
            assert!(out.ok, "{model} {split}: the saved model: {}", out.stderr);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    // Errors name the node.
    let dir = tmp("split-bad");
    let out = ppcc(&[
        "examples/mlp.onnx",
        "-o",
        dir.to_str().unwrap(),
        "--split",
        "nope=2",
    ]);
    assert!(!out.ok);
    assert!(
        out.stderr.contains("no op is named `nope`"),
        "{}",
        out.stderr
    );
    assert!(!dir.join("plan.json").exists());
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

/// Issue 12, item 4: a device stuck forever (here: sleeping 100000 s) must not keep the
/// run alive once the others' receive timeouts have fired: the run reports the failure
/// and exits within the receive timeout plus a few seconds.
#[test]
fn a_stuck_device_does_not_hold_the_run() {
    let dir = tmp("stuck");
    compile(
        "examples/gpt.onnx",
        &dir,
        &["--stages", "3", "--microbatches", "1"],
    );
    let out = ppcc_within(
        &[
            "run",
            dir.to_str().unwrap(),
            "--steps",
            "5",
            "--inject-fault",
            "1:2:stall=100000",
            "--recv-timeout",
            "3",
        ],
        Duration::from_secs(60),
    )
    .expect("ppcc run with a stuck device did not exit within 60 s");
    assert!(!out.ok);
    assert!(out.took < Duration::from_secs(3 + 7), "took {:?}", out.took);
    assert_eq!(losses(&out.stdout).len(), 2, "steps 0 and 1 finish");
    assert!(
        out.stderr.contains("waited 3.0 s for %")
            && out
                .stderr
                .contains("device 1 did not stop and was abandoned"),
        "{}",
        out.stderr
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 12, item 3: labels and token ids outside the classes / the vocabulary are refused
/// before the run on both targets (native code used to drop them: with every label out of
/// range the loss printed 0.0), naming the input, row, position and value.
#[test]
fn out_of_range_labels_and_token_ids_are_refused() {
    let dir = tmp("labels-plan");
    compile(
        "examples/mlp.onnx",
        &dir,
        &["--stages", "2", "--microbatches", "4"],
    );
    let data = tmp("labels-data");
    std::fs::create_dir_all(&data).unwrap();
    let bad = data.join("labels10.npz");
    let mlp = pipeline_common::repo().join("examples/mlp_train.npz");
    npz_with_ints(&mlp, &bad, "labels", &[16], &[10; 16]);
    let neg = data.join("negative.npz");
    let mut labels = vec![1i64; 16];
    labels[6] = -1;
    npz_with_ints(&mlp, &neg, "labels", &[16], &labels);
    for target in ["cpu", "interp"] {
        let d = dir.to_str().unwrap();
        let out = ppcc(&[
            "run",
            d,
            "--data",
            bad.to_str().unwrap(),
            "--target",
            target,
        ]);
        assert!(!out.ok, "--target {target}: {}", out.stdout);
        assert!(
            out.stderr
                .contains("`labels` row 0: value 10 is outside [0, 10) (the 10 classes"),
            "--target {target}: {}",
            out.stderr
        );
        let out = ppcc(&[
            "run",
            d,
            "--data",
            neg.to_str().unwrap(),
            "--target",
            target,
        ]);
        assert!(!out.ok, "--target {target}: {}", out.stdout);
        assert!(
            out.stderr.contains("`labels` row 6: value -1 is outside"),
            "--target {target}: {}",
            out.stderr
        );
    }
    // Token ids beyond the embedding table (the GPT example's vocabulary is 64).
    let gdir = tmp("tokens-plan");
    compile(
        "examples/gpt.onnx",
        &gdir,
        &["--stages", "2", "--microbatches", "1"],
    );
    let gpt = pipeline_common::repo().join("examples/gpt_train.npz");
    let mut tokens = vec![3i64; 8 * 16];
    tokens[2 * 16 + 5] = 64;
    let badtok = data.join("tokens.npz");
    npz_with_ints(&gpt, &badtok, "tokens", &[8, 16], &tokens);
    for target in ["cpu", "interp"] {
        let out = ppcc(&[
            "run",
            gdir.to_str().unwrap(),
            "--data",
            badtok.to_str().unwrap(),
            "--target",
            target,
        ]);
        assert!(!out.ok, "--target {target}: {}", out.stdout);
        assert!(
            out.stderr
                .contains("`tokens` row 2, position 5: value 64 is outside [-64, 64)"),
            "--target {target}: {}",
            out.stderr
        );
    }
    for d in [&dir, &gdir, &data] {
        let _ = std::fs::remove_dir_all(d);
    }
}

/// Issue 12, items 6 and 8: plan.json's schedule is checked by the schedule validator
/// before anything runs: a micro-batch that does not exist (which panicked) and a dropped
/// action (which waited out the 120 s receive timeout) fail at once with its message.
#[test]
fn a_broken_schedule_in_plan_json_is_refused_at_once() {
    let dir = tmp("bad-schedule");
    compile(
        "examples/mlp.onnx",
        &dir,
        &["--stages", "2", "--microbatches", "4"],
    );
    let path = dir.join("plan.json");
    let good: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut edits: Vec<(serde_json::Value, &str)> = vec![];
    let mut v = good.clone();
    v["schedule"]["actions"][0][0] = "0F9".into();
    edits.push((v, "0F9: micro-batch 9 does not exist (there are 4)"));
    let mut v = good.clone();
    let row = v["schedule"]["actions"][1].as_array_mut().unwrap();
    let i = row.iter().position(|a| a == "1F0").unwrap();
    row.remove(i);
    edits.push((v, "missing 1F0 (forward of micro-batch 0 on stage 1)"));
    for (plan, want) in edits {
        std::fs::write(&path, serde_json::to_string(&plan).unwrap()).unwrap();
        let out = ppcc_within(
            &["run", dir.to_str().unwrap(), "--steps", "2"],
            Duration::from_secs(60),
        )
        .expect("ppcc run did not end within 60 s");
        assert!(!out.ok);
        assert!(out.took < Duration::from_secs(10), "took {:?}", out.took);
        assert!(
            out.stderr.contains("plan.json: the schedule is not valid")
                && out.stderr.contains(want)
                && !out.stderr.contains("panicked"),
            "{}",
            out.stderr
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 12, item 6: absurd option values are refused with a clear error, not a panic
/// (`inf`) or a silent 1 ms timeout (`nan`, `0`, negative).
#[test]
fn absurd_options_are_refused() {
    let dir = tmp("options");
    compile("examples/mlp.onnx", &dir, &["--stages", "2"]);
    let d = dir.to_str().unwrap();
    for t in ["inf", "nan", "0", "-1", "1e300"] {
        let flag = format!("--recv-timeout={t}");
        let out = ppcc(&["run", d, "--steps", "1", &flag]);
        assert!(!out.ok, "{flag}: {}", out.stdout);
        assert!(
            out.stderr
                .contains("--recv-timeout must be a number of seconds above 0")
                && !out.stderr.contains("panicked"),
            "{flag}: {}",
            out.stderr
        );
    }
    let out = ppcc(&["run", d, "--inject-fault", "1:0:stall=inf"]);
    assert!(
        !out.ok && !out.stderr.contains("panicked"),
        "{}",
        out.stderr
    );
    let out = ppcc(&[
        "run",
        d,
        "--checkpoint-dir",
        "x",
        "--checkpoint-every",
        "1",
        "--keep-checkpoints",
        "0",
    ]);
    assert!(
        !out.ok && out.stderr.contains("--keep-checkpoints must be at least 1"),
        "{}",
        out.stderr
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 12, item 3: a NaN/inf loss stops the run with an error at that step (no
/// checkpoint of it is written) unless `--allow-nonfinite-loss`.
#[test]
fn a_nonfinite_loss_stops_the_run() {
    let dir = tmp("nan-plan");
    let ck = tmp("nan-ckpt");
    compile(
        "examples/mlp.onnx",
        &dir,
        &["--stages", "2", "--microbatches", "4", "--lr", "1e30"],
    );
    let d = dir.to_str().unwrap();
    let c = ck.to_str().unwrap();
    let out = ppcc(&[
        "run",
        d,
        "--steps",
        "5",
        "--checkpoint-dir",
        c,
        "--checkpoint-every",
        "1",
    ]);
    assert!(!out.ok, "{}", out.stdout);
    assert!(
        out.stderr.contains("error: step 1: the loss is NaN")
            && out.stderr.contains("--allow-nonfinite-loss"),
        "{}",
        out.stderr
    );
    assert_eq!(losses(&out.stdout).len(), 2);
    assert_eq!(
        std::fs::read_to_string(ck.join("latest")).unwrap().trim(),
        "1"
    );
    assert!(!ck.join("step-2").exists());
    let out = ppcc(&["run", d, "--steps", "5", "--allow-nonfinite-loss"]);
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(losses(&out.stdout).len(), 5);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&ck);
}

/// Issue 12, item 8: a checkpoint that lacks optimizer state (or a weight), or holds one
/// of another shape, is refused with the names; a reused checkpoint directory replaces a
/// checkpoint of the same step only once `latest` names the new one; `--keep-checkpoints`
/// prunes the oldest.
#[test]
fn checkpoints_are_checked_replaced_safely_and_pruned() {
    let dir = tmp("ck-plan");
    let ck = tmp("ck-dir");
    compile(
        "examples/mlp.onnx",
        &dir,
        &["--stages", "2", "--microbatches", "4"],
    );
    let d = dir.to_str().unwrap();
    let c = ck.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["run", d, "--data", "synthetic-fresh"];
        args.extend_from_slice(extra);
        let out = ppcc(&args);
        assert!(out.ok, "{args:?}: {}", out.stderr);
        losses(&out.stdout)
    };
    let full = run(&["--steps", "6"]);
    // Checkpoints every step, keeping the newest 2.
    run(&[
        "--steps",
        "3",
        "--checkpoint-dir",
        c,
        "--checkpoint-every",
        "1",
        "--keep-checkpoints",
        "2",
    ]);
    let mut names: Vec<String> = std::fs::read_dir(&ck)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("step-"))
        .collect();
    names.sort();
    assert_eq!(names, ["step-2", "step-3"]);
    // What a run killed while writing leaves behind is cleaned up by the next commit.
    std::fs::create_dir_all(ck.join(".step-1.tmp")).unwrap();
    std::fs::write(ck.join(".step-1.tmp").join("stage9.npz"), b"junk").unwrap();
    std::fs::write(ck.join(".latest.tmp-999999"), b"1\n").unwrap();

    // The same directory again: step 3 is rewritten next to the old one, `latest` switches
    // to it, and only then is the old one removed.
    run(&[
        "--steps",
        "3",
        "--checkpoint-dir",
        c,
        "--checkpoint-every",
        "3",
    ]);
    assert_eq!(
        std::fs::read_to_string(ck.join("latest")).unwrap().trim(),
        "3 step-3.1"
    );
    assert!(ck.join("step-3.1").join("stage0.npz").exists());
    assert!(!ck.join("step-3").exists());
    assert!(
        !ck.join(".step-1.tmp").exists(),
        "stale partial checkpoint kept"
    );
    assert!(
        !ck.join(".latest.tmp-999999").exists(),
        "stale latest file kept"
    );
    let rest = run(&["--steps", "3", "--resume", c]);
    assert_eq!(rest, full[3..], "resumed from the replaced checkpoint");

    // A stage file without its momentum (optimizer state) is refused, naming it.
    let stage0 = ck.join("step-3.1").join("stage0.npz");
    let entries: Vec<(String, Vec<u8>)> = npz_entries(&stage0)
        .into_iter()
        .filter(|(n, _)| n != "momentum.fc1.weight")
        .collect();
    assert!(entries.len() >= 2);
    write_npz_entries(&stage0, &entries);
    let out = ppcc(&["run", d, "--steps", "1", "--resume", c]);
    assert!(!out.ok, "{}", out.stdout);
    assert!(
        out.stderr
            .contains("the checkpoint lacks `momentum.fc1.weight` of stage 0"),
        "{}",
        out.stderr
    );
    // One of another shape.
    let mut entries = entries;
    let bias = entries.iter_mut().find(|(n, _)| n == "fc1.bias").unwrap();
    bias.1 = pipeline_common::npy_i64(&[3], &[0, 0, 0]);
    entries.push(("momentum.fc1.weight".into(), {
        let orig = npz_entries(&ck.join("step-2").join("stage0.npz"));
        orig.into_iter()
            .find(|(n, _)| n == "momentum.fc1.weight")
            .unwrap()
            .1
    }));
    write_npz_entries(&stage0, &entries);
    let out = ppcc(&["run", d, "--steps", "1", "--resume", c]);
    assert!(!out.ok, "{}", out.stdout);
    assert!(
        out.stderr
            .contains("`fc1.bias` of stage 0 is i64 [3] in the checkpoint"),
        "{}",
        out.stderr
    );
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&ck);
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
    assert_eq!(plan["version"], 3);
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
        out.stderr.contains(
            "plan.json: `target` is \"gpu\"; expected one of \"cpu\", \"cuda\", \"interp\""
        ),
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

/// The stash each device measured (`device <r> (...): ... stash <N> MiB), ...`), in bytes.
fn measured_stash(stderr: &str) -> Vec<f64> {
    stderr
        .lines()
        .filter(|l| l.starts_with("device ") && l.contains("peak memory"))
        .map(|l| {
            let at = l.find("stash ").expect("a stash figure") + "stash ".len();
            let mib: f64 = l[at..]
                .split(' ')
                .next()
                .and_then(|x| x.parse().ok())
                .unwrap_or_else(|| panic!("no stash in {l:?}"));
            mib * (1u64 << 20) as f64
        })
        .collect()
}

/// A figure printed as `<label><x> MiB` in `line`, in bytes.
fn mib_after(line: &str, label: &str) -> f64 {
    let at = line
        .find(label)
        .unwrap_or_else(|| panic!("no {label:?} in {line:?}"))
        + label.len();
    let mib: f64 = line[at..]
        .split(' ')
        .next()
        .and_then(|x| x.parse().ok())
        .unwrap_or_else(|| panic!("no figure after {label:?} in {line:?}"));
    mib * (1u64 << 20) as f64
}

/// Per device: (measured, predicted) temporaries and (measured, predicted) peak memory.
fn measured_memory(stderr: &str) -> Vec<((f64, f64), (f64, f64))> {
    stderr
        .lines()
        .filter(|l| l.starts_with("device ") && l.contains("peak memory"))
        .map(|l| {
            (
                (
                    mib_after(l, "temporaries "),
                    mib_after(&l[l.find("temporaries ").unwrap()..], "(predicted "),
                ),
                (mib_after(l, "peak memory "), mib_after(l, "), predicted ")),
            )
        })
        .collect()
}

/// The stash plan.json predicts per device (one stage per device): micro-batches in
/// flight × bytes per micro-batch.
fn predicted_stash(dir: &Path) -> Vec<f64> {
    let plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("plan.json")).unwrap()).unwrap();
    let inflight = plan["prediction"]["peak_stash_microbatches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_f64().unwrap())
        .collect::<Vec<_>>();
    plan["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let d = s["device"].as_u64().unwrap() as usize;
            inflight[d] * s["activation_bytes_per_microbatch"].as_f64().unwrap()
        })
        .collect()
}

/// `--recompute all` and `auto` (under a memory limit that needs it) train with the losses
/// of the whole program on one device, on the interpreter and as native code; the stash
/// each device measures is smaller than without recomputation and is what the plan
/// predicts (within 10%).
#[test]
fn recomputation_trains_like_keeping_every_activation() {
    for (model, opts, modes) in [
        (
            "examples/gpt.onnx",
            &["--microbatches", "4", "--batch", "16"][..],
            &["all", "auto"][..],
        ),
        (
            "examples/mlp.onnx",
            &["--microbatches", "4", "--batch", "1024"][..],
            &["all"][..],
        ),
        (
            "examples/two_tower.onnx",
            &[
                "--microbatches",
                "4",
                "--batch",
                "1024",
                "--loss",
                "mse",
                "--optimizer",
                "adamw",
            ][..],
            &["all"][..],
        ),
    ] {
        let mut targs = vec!["train", model, "--steps", "5", "--target", "interp"];
        targs.extend_from_slice(opts);
        let reference = ppcc(&targs);
        assert!(reference.ok, "{}", reference.stderr);
        let want = losses(&reference.stdout);
        let name = Path::new(model)
            .file_stem()
            .unwrap()
            .to_string_lossy()
            .to_string();
        let run = |dir: &Path, target: &str| {
            let out = ppcc(&[
                "run",
                dir.to_str().unwrap(),
                "--steps",
                "5",
                "--target",
                target,
            ]);
            assert!(out.ok, "{model} {dir:?} --target {target}: {}", out.stderr);
            out
        };
        let off = tmp(&format!("recompute-{name}-off"));
        let mut extra = vec!["--stages", "2", "--recompute", "off"];
        extra.extend_from_slice(opts);
        compile(model, &off, &extra);
        let off_out = run(&off, "cpu");
        assert_same(&format!("{model} off"), &losses(&off_out.stdout), &want);
        let off_stash = measured_stash(&off_out.stderr);
        let plan: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(off.join("plan.json")).unwrap()).unwrap();
        let off_peak = plan["prediction"]["peak_memory_bytes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .fold(0.0, f64::max);
        for &mode in modes {
            let dir = tmp(&format!("recompute-{name}-{mode}"));
            let limit = format!("{}", (0.85 * off_peak) as u64);
            let mut extra = vec!["--stages", "2", "--recompute", mode];
            if mode == "auto" {
                extra.extend_from_slice(&["--memory-limit", &limit]);
            }
            extra.extend_from_slice(opts);
            compile(model, &dir, &extra);
            let text = std::fs::read_to_string(dir.join("plan.json")).unwrap();
            assert!(
                text.contains("\"stash_bytes_without\""),
                "{model} {mode}: plan.json records what is recomputed"
            );
            for target in ["interp", "cpu"] {
                let out = run(&dir, target);
                assert_same(
                    &format!("{model} --recompute {mode} --target {target}"),
                    &losses(&out.stdout),
                    &want,
                );
                let stash = measured_stash(&out.stderr);
                assert_eq!(stash.len(), off_stash.len());
                assert!(
                    stash.iter().sum::<f64>() < off_stash.iter().sum::<f64>(),
                    "{model} {mode}: stash {stash:?} vs {off_stash:?} without recomputation"
                );
                let predicted = predicted_stash(&dir);
                for (d, (m, p)) in stash.iter().zip(&predicted).enumerate() {
                    // The measured figure is printed to 0.01 MiB.
                    assert!(
                        (m - p).abs() <= (0.1 * p).max(0.006 * (1u64 << 20) as f64),
                        "{model} {mode} --target {target}: device {d} stashed {m} bytes, predicted {p}"
                    );
                }
                // Temporaries: the interpreter holds exactly the values the plan counts;
                // native code fuses elementwise chains, so it holds at most those.
                let rounding = 0.006 * (1u64 << 20) as f64;
                for (d, ((tm, tp), (pm, pp))) in
                    measured_memory(&out.stderr).into_iter().enumerate()
                {
                    let what = format!("{model} {mode} --target {target}: device {d}");
                    if target == "interp" {
                        assert!(
                            (tm - tp).abs() <= rounding,
                            "{what}: temporaries {tm}, predicted {tp}"
                        );
                    } else {
                        assert!(
                            tm <= tp * 1.1 + rounding,
                            "{what}: temporaries {tm}, predicted {tp}"
                        );
                    }
                    assert!(
                        (pm - pp).abs() <= 0.1 * pp + rounding,
                        "{what}: peak memory {pm}, predicted {pp}"
                    );
                }
            }
            let _ = std::fs::remove_dir_all(&dir);
        }
        let _ = std::fs::remove_dir_all(&off);
    }
}

/// Training-mode dropout under recomputation: the backward makes the dropout again with
/// the same seed and key, so the mask is the one the forward drew. A two-layer network
/// with a dropout after each hidden layer (made here with the onnx package), 2 stages,
/// `--recompute all` against `off`, on native code and the interpreter: the same losses,
/// and less stash.
#[test]
fn recomputed_dropout_draws_the_same_mask() {
    let dir = tmp("dropout-model");
    let _ = std::fs::create_dir_all(&dir);
    let model = dir.join("dropout_mlp.onnx");
    let python = std::env::var("PPCC_PYTHON").unwrap_or_else(|_| {
        pipeline_common::repo()
            .join(".venv/bin/python")
            .display()
            .to_string()
    });
    let script = r#"
import sys, numpy as np, onnx
from onnx import helper, numpy_helper, TensorProto as T
rng = np.random.default_rng(7)
init, nodes, h, width = [], [], "x", 16
for i, w in enumerate([32, 32]):
    init += [numpy_helper.from_array((rng.standard_normal((width, w)) * 0.3).astype(np.float32), f"w{i}"),
             numpy_helper.from_array(np.zeros(w, np.float32), f"b{i}")]
    nodes += [helper.make_node("MatMul", [h, f"w{i}"], [f"m{i}"]),
              helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]),
              helper.make_node("Tanh", [f"a{i}"], [f"t{i}"]),
              helper.make_node("Dropout", [f"t{i}", "ratio", "train"], [f"h{i}"], seed=11 + i)]
    h, width = f"h{i}", w
init += [numpy_helper.from_array((rng.standard_normal((width, 5)) * 0.3).astype(np.float32), "wo"),
         numpy_helper.from_array(np.array(0.25, np.float32), "ratio"),
         numpy_helper.from_array(np.array(True), "train")]
nodes.append(helper.make_node("MatMul", [h, "wo"], ["logits"]))
g = helper.make_graph(nodes, "dropout_mlp",
    [helper.make_tensor_value_info("x", T.FLOAT, ["batch", 16])],
    [helper.make_tensor_value_info("logits", T.FLOAT, ["batch", 5])], init)
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
onnx.save(m, sys.argv[1])
"#;
    let made = std::process::Command::new(&python)
        .args(["-c", script, model.to_str().unwrap()])
        .output()
        .unwrap_or_else(|e| panic!("{python}: {e}"));
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let model = model.to_str().unwrap();
    let opts = ["--stages", "2", "--microbatches", "4", "--batch", "64"];
    let mut stashes = vec![];
    let mut reference: Option<Vec<f64>> = None;
    for mode in ["off", "all"] {
        let out_dir = tmp(&format!("dropout-{mode}"));
        let mut extra = vec!["--recompute", mode];
        extra.extend_from_slice(&opts);
        compile(model, &out_dir, &extra);
        let text = std::fs::read_to_string(out_dir.join("plan.json")).unwrap();
        assert_eq!(
            mode == "all",
            text.contains("\"stash_bytes_without\""),
            "--recompute {mode}: {text}"
        );
        if mode == "all" {
            // What is made again includes a dropout's result (the next layer's weight
            // gradient reads it).
            let plan: serde_json::Value = serde_json::from_str(&text).unwrap();
            let values: Vec<String> = plan["stages"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|s| {
                    s["recompute"]["values"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default()
                })
                .map(|v| v.as_str().unwrap().to_string())
                .collect();
            assert!(
                values.iter().any(|v| v == "h0" || v == "h1"),
                "a dropout is recomputed: {values:?}"
            );
        }
        for target in ["cpu", "interp"] {
            let out = ppcc(&[
                "run",
                out_dir.to_str().unwrap(),
                "--steps",
                "4",
                "--target",
                target,
            ]);
            assert!(
                out.ok,
                "--recompute {mode} --target {target}: {}",
                out.stderr
            );
            let got = losses(&out.stdout);
            match &reference {
                None => reference = Some(got),
                Some(want) => assert_same(
                    &format!("dropout --recompute {mode} --target {target}"),
                    &got,
                    want,
                ),
            }
            if target == "cpu" {
                stashes.push(measured_stash(&out.stderr).iter().sum::<f64>());
            }
        }
        let _ = std::fs::remove_dir_all(&out_dir);
    }
    assert!(
        stashes[1] < stashes[0],
        "recomputation stashes less: {stashes:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
