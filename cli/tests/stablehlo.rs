//! StableHLO modules made by JAX (tests/stablehlo/fixtures, written by
//! tests/stablehlo/gen_fixtures.py), end to end, each in the pretty form JAX prints and in
//! the generic op form:
//!
//! - `ppcc eval` equals JAX's outputs (1e-5 relative; 1e-6 absolute for elements near 0);
//! - `ppcc train` (plain SGD, cross-entropy) equals JAX's own 5-step SGD losses (1e-4
//!   relative), on the interpreter and as native code;
//! - a 2-stage `ppcc MODEL.mlir --params .. -o DIR` + `ppcc run DIR` equals them too;
//! - malformed text, bytecode, an unknown op and mismatched parameters are clear errors
//!   (file, line:column, op) with a non-zero exit, never a panic.

mod pipeline_common;

use std::path::PathBuf;

use pipeline_common::{losses, npz_entries, ppcc, repo, write_npz_entries, Out};

const MODELS: [&str; 3] = ["mlp", "gpt", "cnn"];
const FORMS: [&str; 2] = ["mlir", "generic.mlir"];

fn fx(name: &str) -> String {
    format!("tests/stablehlo/fixtures/{name}")
}

fn tmp(name: &str) -> PathBuf {
    pipeline_common::tmp("ppcc-stablehlo-test", name)
}

/// JAX's SGD losses of a fixture.
fn jax_losses(model: &str) -> Vec<f64> {
    let text = std::fs::read_to_string(repo().join(fx(&format!("{model}.json")))).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["optimizer"]["momentum"].as_f64(), Some(0.0));
    assert_eq!(v["optimizer"]["lr"].as_f64(), Some(0.05));
    v["losses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn assert_close(what: &str, got: &[f64], want: &[f64], rtol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: {got:?} vs {want:?}");
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= rtol * w.abs(),
            "{what}: step {k}: ppcc {g} vs JAX {w}"
        );
    }
}

fn train_args<'a>(model: &'a str, params: &'a str, data: &'a str) -> Vec<&'a str> {
    vec![
        model,
        "--params",
        params,
        "--data",
        data,
        "--loss",
        "cross-entropy",
        "--optimizer",
        "sgd",
        "--momentum",
        "0",
        "--lr",
        "0.05",
    ]
}

#[test]
fn eval_equals_jax_outputs() {
    for m in MODELS {
        for form in FORMS {
            for target in ["interp", "cpu"] {
                let out = tmp(&format!("{m}-{form}-{target}-out.npz"));
                let r = ppcc(&[
                    "eval",
                    &fx(&format!("{m}.{form}")),
                    "--params",
                    &fx(&format!("{m}_params.npz")),
                    "--inputs",
                    &fx(&format!("{m}_io.npz")),
                    "-o",
                    out.to_str().unwrap(),
                    "--reference",
                    &fx(&format!("{m}_io.npz")),
                    "--rtol",
                    "1e-5",
                    "--atol",
                    "1e-6",
                    "--target",
                    target,
                ]);
                assert!(
                    r.ok,
                    "{m}.{form} --target {target}: {}{}",
                    r.stdout, r.stderr
                );
                assert!(
                    r.stdout.contains("output `out0`: matches the reference"),
                    "{}",
                    r.stdout
                );
            }
        }
    }
}

#[test]
fn train_equals_jax_sgd() {
    for m in MODELS {
        let want = jax_losses(m);
        for form in FORMS {
            for target in ["interp", "cpu"] {
                let model = fx(&format!("{m}.{form}"));
                let params = fx(&format!("{m}_params.npz"));
                let data = fx(&format!("{m}_train.npz"));
                let mut args = vec!["train"];
                args.extend(train_args(&model, &params, &data));
                args.extend(["--steps", "5", "--target", target]);
                let r = ppcc(&args);
                assert!(r.ok, "{model} --target {target}: {}", r.stderr);
                assert_close(
                    &format!("{model} --target {target}"),
                    &losses(&r.stdout),
                    &want,
                    1e-4,
                );
            }
        }
    }
}

#[test]
fn two_stage_run_equals_jax_sgd() {
    for m in MODELS {
        let want = jax_losses(m);
        for form in FORMS {
            let model = fx(&format!("{m}.{form}"));
            let params = fx(&format!("{m}_params.npz"));
            let data = fx(&format!("{m}_train.npz"));
            let dir = tmp(&format!("{m}-{form}-2stages"));
            let _ = std::fs::remove_dir_all(&dir);
            let mut args = train_args(&model, &params, &data);
            args.retain(|a| *a != "--data" && *a != data.as_str());
            args.extend([
                "-o",
                dir.to_str().unwrap(),
                "--stages",
                "2",
                "--microbatches",
                "1",
                "--split",
                "off",
            ]);
            let c = ppcc(&args);
            assert!(c.ok, "compiling {model}: {}", c.stderr);
            let plan = std::fs::read_to_string(dir.join("plan.json")).unwrap();
            assert!(plan.contains("\"stages\""), "{plan}");
            assert!(dir.join("stage1").is_dir());
            for target in ["interp", "cpu"] {
                let r = ppcc(&[
                    "run",
                    dir.to_str().unwrap(),
                    "--steps",
                    "5",
                    "--data",
                    &data,
                    "--target",
                    target,
                ]);
                assert!(r.ok, "{model} run --target {target}: {}", r.stderr);
                assert_close(
                    &format!("{model} 2 stages --target {target}"),
                    &losses(&r.stdout),
                    &want,
                    1e-4,
                );
            }
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

fn write(name: &str, bytes: &[u8]) -> String {
    let p = tmp(name);
    std::fs::write(&p, bytes).unwrap();
    p.to_str().unwrap().to_string()
}

/// A failure with a message, not a panic.
fn fails(r: &Out, what: &str) {
    assert!(!r.ok, "{what}: expected an error");
    assert!(!r.stderr.contains("panicked"), "{what}: {}", r.stderr);
}

#[test]
fn broken_modules_are_clear_errors() {
    let params = fx("mlp_params.npz");
    let inputs = fx("mlp_io.npz");
    let good = std::fs::read_to_string(repo().join(fx("mlp.mlir"))).unwrap();

    // Malformed text: cut in the middle of an op.
    let cut = &good[..good.find("stablehlo.add").unwrap() + 16];
    let f = write("cut.mlir", cut.as_bytes());
    let r = ppcc(&[
        "eval",
        &f,
        "--params",
        &params,
        "--inputs",
        &inputs,
        "-o",
        "/dev/null",
    ]);
    fails(&r, "cut text");
    assert!(r.stderr.contains(&format!("{f}:")), "{}", r.stderr);

    // A typo in a type, with its line and column.
    let bad = good.replacen("tensor<8x64xf32>", "tensor<8x64xf32", 1);
    let f = write("typo.mlir", bad.as_bytes());
    let r = ppcc(&[
        "eval",
        &f,
        "--params",
        &params,
        "--inputs",
        &inputs,
        "-o",
        "/dev/null",
    ]);
    fails(&r, "typo");
    assert!(r.stderr.contains(&format!("{f}:2:")), "{}", r.stderr);

    // MLIR bytecode (a portable VHLO artifact).
    let f = write("m.mlirbc", b"ML\xefR\x00\x01\x02junk");
    let r = ppcc(&[
        "eval",
        &f,
        "--params",
        &params,
        "--inputs",
        &inputs,
        "-o",
        "/dev/null",
    ]);
    fails(&r, "bytecode");
    assert!(r.stderr.contains("bytecode"), "{}", r.stderr);
    assert!(r.stderr.contains(".as_text()"), "{}", r.stderr);

    // An unknown op: named, with its location.
    let line = good
        .lines()
        .position(|l| l.contains("stablehlo.add"))
        .unwrap()
        + 1;
    let bad = good.replacen("stablehlo.add", "stablehlo.cbrt", 1);
    let f = write("unknown.mlir", bad.as_bytes());
    let r = ppcc(&["train", &f, "--params", &params, "--steps", "1"]);
    fails(&r, "unknown op");
    assert!(
        r.stderr.contains(&format!("{f}:{line}:")) && r.stderr.contains("`stablehlo.cbrt`"),
        "{}",
        r.stderr
    );

    // Parameters that do not match @main: a wrong key, a wrong shape (the CNN's params
    // for the MLP).
    let wrong = fx("cnn_params.npz");
    let r = ppcc(&["train", &fx("mlp.mlir"), "--params", &wrong, "--steps", "1"]);
    fails(&r, "mismatched params");
    assert!(
        r.stderr.contains("cnn_params.npz") && r.stderr.contains("arg"),
        "{}",
        r.stderr
    );
    // A key that is not `arg<i>` of @main.
    let mut entries = npz_entries(&repo().join(&params));
    entries[0].0 = "w1".into();
    let renamed = tmp("renamed_params.npz");
    write_npz_entries(&renamed, &entries);
    let r = ppcc(&[
        "train",
        &fx("mlp.mlir"),
        "--params",
        renamed.to_str().unwrap(),
        "--steps",
        "1",
    ]);
    fails(&r, "a key that is no argument");
    assert!(
        r.stderr.contains("`w1`") && r.stderr.contains("arg0..arg4"),
        "{}",
        r.stderr
    );

    // --params with an ONNX model.
    let r = ppcc(&[
        "train",
        "examples/mlp.onnx",
        "--params",
        &params,
        "--steps",
        "1",
    ]);
    fails(&r, "--params with ONNX");
    assert!(r.stderr.contains("--params"), "{}", r.stderr);

    // Another batch than the exported one is refused with the reason.
    let r = ppcc(&[
        "train",
        &fx("mlp.mlir"),
        "--params",
        &params,
        "--steps",
        "1",
        "--batch",
        "4",
    ]);
    fails(&r, "other batch");
    assert!(r.stderr.contains("fixed at 8"), "{}", r.stderr);
}
