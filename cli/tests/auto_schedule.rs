//! `--schedule auto` end to end: on the bundled MLP, two-tower model and GPT at 2 and 4
//! devices, its plan is never predicted slower than the best built-in schedule's under the
//! same memory limit, it stays within a limit set just above 1F1B's peak, it says what it
//! tried, and the chosen schedule trains with the losses of one device.

mod pipeline_common;

use std::path::{Path, PathBuf};

use pipeline_common::{close, losses, ppcc};

const BUILTINS: &[&str] = &[
    "gpipe",
    "1f1b",
    "interleaved-1f1b",
    "zb-h1",
    "zb-h2",
    "zb-v",
    "dualpipe-v",
];

fn tmp(name: &str) -> PathBuf {
    pipeline_common::tmp("ppcc-auto-test", name)
}

/// (iteration seconds, largest peak memory bytes, schedule name) of a `--plan-only` plan.
fn plan(model: &str, dir: &Path, args: &[&str]) -> Option<(f64, f64, String)> {
    let mut all = vec![model, "-o", dir.to_str().unwrap(), "--plan-only"];
    all.extend_from_slice(args);
    let out = ppcc(&all);
    if !out.ok {
        return None;
    }
    let text = std::fs::read_to_string(dir.join("plan.json")).expect("plan.json is written");
    let doc: serde_json::Value = serde_json::from_str(&text).expect("plan.json parses");
    let pred = &doc["prediction"];
    let it = pred["iteration_seconds"]
        .as_f64()
        .expect("iteration_seconds");
    let peak = pred["peak_memory_bytes"]
        .as_array()
        .expect("peak_memory_bytes")
        .iter()
        .filter_map(|x| x.as_f64())
        .fold(0.0, f64::max);
    let name = doc["schedule"]["name"].as_str().unwrap_or("").to_string();
    let _ = std::fs::remove_dir_all(dir);
    Some((it, peak, name))
}

fn never_worse(model: &str, opts: &[&str]) {
    for stages in ["2", "4"] {
        let mut base = vec!["--stages", stages, "--device-profile", "h100"];
        base.extend_from_slice(opts);
        let tag = format!(
            "{}-{stages}",
            Path::new(model).file_stem().unwrap().to_string_lossy()
        );
        let run = |schedule: &str, limit: Option<&str>| {
            let mut a = base.clone();
            a.extend_from_slice(&["--schedule", schedule]);
            if let Some(l) = limit {
                a.extend_from_slice(&["--memory-limit", l]);
            }
            plan(model, &tmp(&format!("{tag}-{schedule}")), &a)
        };
        let one = run("1f1b", None).expect("1f1b plans");
        // The profile's limit, and one 5% above 1F1B's peak.
        let tight = format!("{}", (one.1 * 1.05).ceil() as u64);
        for limit in [None, Some(tight.as_str())] {
            let cap = limit.map_or(f64::INFINITY, |l| l.parse::<f64>().unwrap());
            let auto = run("auto", limit).unwrap_or_else(|| panic!("{tag}: auto plans"));
            assert!(auto.2.starts_with("auto: "), "{tag}: {}", auto.2);
            assert!(
                auto.1 <= cap,
                "{tag}: auto's peak {} is over the limit {cap}",
                auto.1
            );
            for s in BUILTINS {
                // A built-in that cannot run here (too few layers, micro-batches not a
                // multiple of the devices) or does not fit is no rival.
                let Some(b) = run(s, limit) else { continue };
                if b.1 > cap {
                    continue;
                }
                assert!(
                    auto.0 <= b.0 * (1.0 + 1e-9),
                    "{tag} limit {limit:?}: auto ({}) predicts {} s, {s} {} s",
                    auto.2,
                    auto.0,
                    b.0
                );
            }
        }
    }
}

#[test]
fn auto_is_never_worse_than_a_builtin_mlp() {
    never_worse("examples/mlp.onnx", &["--microbatches", "4"]);
}

#[test]
fn auto_is_never_worse_than_a_builtin_two_tower() {
    never_worse(
        "examples/two_tower.onnx",
        &["--microbatches", "4", "--loss", "mse"],
    );
}

#[test]
fn auto_is_never_worse_than_a_builtin_gpt() {
    never_worse("examples/gpt.onnx", &["--microbatches", "1"]);
}

/// The chosen schedule validates and trains: `ppcc run` prints `ppcc train`'s losses.
#[test]
fn auto_schedule_trains_like_one_device() {
    for (model, opts) in [
        ("examples/mlp.onnx", vec!["--microbatches", "4"]),
        (
            "examples/two_tower.onnx",
            vec!["--microbatches", "4", "--loss", "mse"],
        ),
    ] {
        let mut targs = vec!["train", model, "--steps", "5", "--target", "interp"];
        targs.extend_from_slice(&opts);
        let reference = ppcc(&targs);
        assert!(reference.ok, "{}", reference.stderr);
        let want = losses(&reference.stdout);
        let dir = tmp(&format!(
            "run-{}",
            Path::new(model).file_stem().unwrap().to_string_lossy()
        ));
        let mut cargs = vec!["--stages", "2", "--schedule", "auto", "--target", "interp"];
        cargs.extend_from_slice(&opts);
        let mut all = vec![model, "-o", dir.to_str().unwrap()];
        all.extend_from_slice(&cargs);
        let out = ppcc(&all);
        assert!(out.ok, "{}", out.stderr);
        assert!(
            out.stderr.contains("schedule search:") && out.stderr.contains("chose "),
            "auto says what it tried and chose:\n{}",
            out.stderr
        );
        let run = ppcc(&["run", dir.to_str().unwrap(), "--steps", "5"]);
        assert!(run.ok, "{model}: {}", run.stderr);
        close(&losses(&run.stdout), &want, &format!("{model} auto"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A schedule the order search changed (`+reordered`) trains like one device: the GPT at 4
/// devices, where `auto` chooses interleaved 1F1B with its actions reordered.
#[test]
fn a_reordered_schedule_trains_like_one_device() {
    let model = "examples/gpt.onnx";
    let opts = ["--batch", "16", "--microbatches", "4", "--target", "interp"];
    let mut targs = vec!["train", model, "--steps", "3"];
    targs.extend_from_slice(&opts);
    let reference = ppcc(&targs);
    assert!(reference.ok, "{}", reference.stderr);
    let want = losses(&reference.stdout);
    let dir = tmp("run-reordered");
    let mut all = vec![
        model,
        "-o",
        dir.to_str().unwrap(),
        "--stages",
        "4",
        "--schedule",
        "auto",
    ];
    all.extend_from_slice(&opts);
    let out = ppcc(&all);
    assert!(out.ok, "{}", out.stderr);
    let chose = out
        .stderr
        .lines()
        .find(|l| l.starts_with("chose "))
        .unwrap_or_default();
    assert!(chose.contains("+reordered"), "{chose}");
    let run = ppcc(&["run", dir.to_str().unwrap(), "--steps", "3"]);
    assert!(run.ok, "{}", run.stderr);
    close(&losses(&run.stdout), &want, "gpt auto +reordered");
    let _ = std::fs::remove_dir_all(&dir);
}
