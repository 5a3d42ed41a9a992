//! A weight read on several stages (a GPT whose LM head reads the token embedding, as
//! GPT-2's does): every stage that reads it holds a copy, computes its part of the
//! gradient, and the parts are summed by an explicit `all_reduce` in each holder's
//! `optim` before the same update. Pipelines over 2–4 stages (1F1B, ZB-H1, and ZB-V,
//! whose first and last stage share a device) train with the losses of `ppcc train`, on
//! the interpreter and in native code, and `--save-onnx` writes the weight once.

mod pipeline_common;

use std::path::PathBuf;
use std::process::Command;

use pipeline_common::{close, compile, losses, output, ppcc, python, tied_gpt};

fn tmp(name: &str) -> PathBuf {
    pipeline_common::tmp("ppcc-tied-test", name)
}

const TRAIN: [&str; 6] = ["--batch", "8", "--microbatches", "4", "--split", "off"];

#[test]
fn tied_embedding_trains_across_stages_like_one_stage() {
    let dir = tmp("models");
    let model = tied_gpt(&dir);
    let want = ppcc(&[
        "train",
        &model,
        "--batch",
        "8",
        "--microbatches",
        "4",
        "--steps",
        "6",
        "--target",
        "interp",
    ]);
    assert!(want.ok, "{}", want.stderr);
    let want = losses(&want.stdout);
    assert_eq!(want.len(), 6);
    assert!(want[5] < want[0], "the loss falls: {want:?}");
    for (stages, schedule, holders) in [
        ("2", "1f1b", vec![0, 1]),
        ("3", "zb-h1", vec![0, 2]),
        ("2", "zb-v", vec![0, 3]),
    ] {
        let out = dir.join(format!("p{stages}-{schedule}"));
        let mut extra = vec!["--stages", stages, "--schedule", schedule];
        extra.extend_from_slice(&TRAIN);
        compile(&model, &out, &extra);
        let plan: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("plan.json")).unwrap()).unwrap();
        let c = &plan["collectives"];
        assert_eq!(c.as_array().map(Vec::len), Some(1), "{c}");
        assert_eq!(c[0]["param"], "wte.weight");
        assert_eq!(c[0]["stages"], serde_json::json!(holders));
        assert_eq!(c[0]["replicas"], false);
        for s in &holders {
            let text = std::fs::read_to_string(out.join(format!("stage{s}/stage.ppir"))).unwrap();
            assert!(
                text.contains("%grad.wte.weight.sum = \"pp.all_reduce\"(%grad.wte.weight)"),
                "stage {s} sums the shared gradient"
            );
        }
        for target in ["interp", "cpu"] {
            let got = ppcc(&[
                "run",
                out.to_str().unwrap(),
                "--steps",
                "6",
                "--target",
                target,
            ]);
            assert!(
                got.ok,
                "{stages} stages {schedule} {target}: {}",
                got.stderr
            );
            close(
                &losses(&got.stdout),
                &want,
                &format!("{stages} stages, {schedule}, {target}"),
            );
        }
    }
}

#[test]
fn saved_model_keeps_one_shared_weight_equal_to_one_stage_training() {
    let dir = tmp("save");
    let model = tied_gpt(&dir);
    let one = dir.join("one.onnx");
    let t = ppcc(&[
        "train",
        &model,
        "--batch",
        "8",
        "--microbatches",
        "4",
        "--steps",
        "3",
        "--target",
        "interp",
        "--save-onnx",
        one.to_str().unwrap(),
    ]);
    assert!(t.ok, "{}", t.stderr);
    let out = dir.join("plan");
    let mut extra = vec!["--stages", "2"];
    extra.extend_from_slice(&TRAIN);
    compile(&model, &out, &extra);
    let two = dir.join("two.onnx");
    let r = ppcc(&[
        "run",
        out.to_str().unwrap(),
        "--steps",
        "3",
        "--save-onnx",
        two.to_str().unwrap(),
    ]);
    assert!(r.ok, "{}", r.stderr);
    // Both copies were updated alike: the stage files agree, and the saved model (one
    // initializer, as in the input) equals the one-stage run's.
    let script = r#"
import sys, onnx, numpy as np
from onnx import numpy_helper
def inits(p):
    m = onnx.load(p)
    names = [i.name for i in m.graph.initializer]
    assert names.count("wte.weight") == 1, names
    assert "lm_head.weight" not in names, names
    return {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
a, b = inits(sys.argv[1]), inits(sys.argv[2])
assert a.keys() == b.keys()
for k in a:
    d = np.max(np.abs(a[k] - b[k])) if a[k].size else 0.0
    assert d <= 1e-5 * max(1.0, float(np.max(np.abs(a[k])))), (k, d)
print("ok", len(a))
"#;
    let mut c = Command::new(python());
    c.args(["-c", script, one.to_str().unwrap(), two.to_str().unwrap()]);
    let o = output(c);
    assert!(o.ok, "{}{}", o.stdout, o.stderr);
    assert!(o.stdout.starts_with("ok"), "{}", o.stdout);
}
