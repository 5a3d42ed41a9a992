//! StableHLO modules made by JAX (tests/stablehlo/fixtures, written by
//! tests/stablehlo/gen_fixtures.py), end to end, each in the pretty form JAX prints and in
//! the generic op form:
//!
//! - `ppcc eval` equals JAX's outputs (1e-5 relative; 1e-6 absolute for elements near 0);
//! - `ppcc train` (plain SGD, cross-entropy) equals JAX's own 5-step SGD losses (1e-4
//!   relative), on the interpreter and as native code;
//! - a 2-stage `ppcc MODEL.mlir --params .. -o DIR` + `ppcc run DIR` equals them too;
//! - at another batch than the exported one (the module's batch rebound), `ppcc eval`
//!   equals JAX's first rows and `ppcc train` equals JAX's SGD run at that batch, and
//!   micro-batches of half the exported batch equal JAX's run at the exported batch;
//! - an op that fixes the batch is named, with its location, when another batch is asked;
//! - malformed text, bytecode, an unknown op and mismatched parameters are clear errors
//!   (file, line:column, op) with a non-zero exit, never a panic.

mod pipeline_common;

use std::path::PathBuf;

use pipeline_common::{losses, npz_entries, ppcc, repo, write_npz_entries, Out};

const MODELS: [&str; 4] = ["mlp", "gpt", "cnn", "ops"];
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

/// `ppcc MODEL --params P -o DIR --stages 2 --microbatches MB --split off` with the batch of
/// `data` (as `train_args` gives it), into a fresh `tmp(name)`; returns the directory.
fn compile_two_stages(model: &str, params: &str, data: &str, name: &str, mb: u32) -> PathBuf {
    let dir = tmp(name);
    let _ = std::fs::remove_dir_all(&dir);
    let mut args = train_args(model, params, data);
    args.retain(|a| *a != "--data" && *a != data);
    let mb = mb.to_string();
    args.extend([
        "-o",
        dir.to_str().unwrap(),
        "--stages",
        "2",
        "--microbatches",
        &mb,
        "--split",
        "off",
    ]);
    let c = ppcc(&args);
    assert!(c.ok, "compiling {model}: {}", c.stderr);
    dir
}

#[test]
fn two_stage_run_equals_jax_sgd() {
    for m in MODELS {
        let want = jax_losses(m);
        for form in FORMS {
            let model = fx(&format!("{m}.{form}"));
            let params = fx(&format!("{m}_params.npz"));
            let data = fx(&format!("{m}_train.npz"));
            let dir = compile_two_stages(&model, &params, &data, &format!("{m}-{form}-2stages"), 1);
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

    // Another batch than the exported one, for a module whose batch a reshape merges
    // with another dim: the error names the op and its location.
    let tied = good.replacen(
        "    return %8 : tensor<8x10xf32>\n  }",
        "    %9 = stablehlo.reshape %8 : (tensor<8x10xf32>) -> tensor<80xf32>\n    %10 = stablehlo.reshape %9 : (tensor<80xf32>) -> tensor<8x10xf32>\n    return %10 : tensor<8x10xf32>\n  }",
        1,
    );
    assert_ne!(tied, good);
    let line = tied.lines().position(|l| l.contains("%9 = ")).unwrap() + 1;
    let f = write("tied.mlir", tied.as_bytes());
    let data = fx("mlp_train.npz");
    let mut args = vec!["train"];
    args.extend(train_args(&f, &params, &data));
    args.extend(["--steps", "1"]);
    // At the exported batch it trains.
    let r = ppcc(&args);
    assert!(r.ok, "{}", r.stderr);
    args.extend(["--batch", "4"]);
    let r = ppcc(&args);
    fails(&r, "a batch a reshape fixes");
    assert!(
        r.stderr
            .contains(&format!("{f}:{line}:5: `stablehlo.reshape`"))
            && r.stderr.contains("merges or splits dim 0")
            && r.stderr.contains("exported with a batch of 8 rows"),
        "{}",
        r.stderr
    );
}

/// JAX's SGD losses at the fixture's other batch: (batch, losses).
fn jax_rebatch(model: &str) -> (u64, Vec<f64>) {
    let text = std::fs::read_to_string(repo().join(fx(&format!("{model}.json")))).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let b = v["rebatch"]["batch"].as_u64().unwrap();
    let l = v["rebatch"]["losses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    (b, l)
}

fn exported_batch(model: &str) -> u64 {
    let text = std::fs::read_to_string(repo().join(fx(&format!("{model}.json")))).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["batch"].as_u64().unwrap()
}

/// The first `rows` rows of a (version 1.0, C-order) `.npy`.
fn npy_rows(npy: &[u8], rows: usize) -> Vec<u8> {
    let hlen = u16::from_le_bytes([npy[8], npy[9]]) as usize;
    let header = std::str::from_utf8(&npy[10..10 + hlen]).unwrap();
    let data = &npy[10 + hlen..];
    let (pre, rest) = header.split_once("'shape': (").unwrap();
    let (shape, post) = rest.split_once(')').unwrap();
    let dims: Vec<usize> = shape
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().parse().unwrap())
        .collect();
    let row_bytes = data.len() / dims[0];
    let mut new_dims = dims.clone();
    new_dims[0] = rows;
    let shape: Vec<String> = new_dims.iter().map(|d| d.to_string()).collect();
    let shape = if shape.len() == 1 {
        format!("{},", shape[0])
    } else {
        shape.join(", ")
    };
    let mut h = format!("{pre}'shape': ({shape}){post}");
    let h_trim = h.trim_end().to_string();
    h = h_trim;
    while (10 + h.len() + 1) % 64 != 0 {
        h.push(' ');
    }
    h.push('\n');
    let mut out = npy[..8].to_vec();
    out.extend((h.len() as u16).to_le_bytes());
    out.extend(h.as_bytes());
    out.extend(&data[..rows * row_bytes]);
    out
}

#[test]
fn eval_at_another_batch_equals_jax_rows() {
    for m in MODELS {
        let (b, _) = jax_rebatch(m);
        // The reference has the exported batch; compare its first rows (the models are
        // row-wise). Another batch smaller than the exported one.
        let b = b.min(exported_batch(m) - 1);
        let io = npz_entries(&repo().join(fx(&format!("{m}_io.npz"))));
        let cut: Vec<(String, Vec<u8>)> = io
            .iter()
            .map(|(k, v)| (k.clone(), npy_rows(v, b as usize)))
            .collect();
        let rows = tmp(&format!("{m}-rows{b}.npz"));
        write_npz_entries(&rows, &cut);
        for form in FORMS {
            let out = tmp(&format!("{m}-{form}-rows-out.npz"));
            let r = ppcc(&[
                "eval",
                &fx(&format!("{m}.{form}")),
                "--params",
                &fx(&format!("{m}_params.npz")),
                "--inputs",
                rows.to_str().unwrap(),
                "--batch",
                &b.to_string(),
                "-o",
                out.to_str().unwrap(),
                "--reference",
                rows.to_str().unwrap(),
                "--rtol",
                "1e-5",
                "--atol",
                "1e-6",
            ]);
            assert!(r.ok, "{m}.{form} --batch {b}: {}{}", r.stdout, r.stderr);
            assert!(
                r.stdout.contains("output `out0`: matches the reference"),
                "{}",
                r.stdout
            );
        }
    }
}

#[test]
fn train_at_another_batch_equals_jax_sgd() {
    for m in MODELS {
        let (b, want) = jax_rebatch(m);
        let exported = exported_batch(m);
        let full = jax_losses(m);
        for form in FORMS {
            let model = fx(&format!("{m}.{form}"));
            let params = fx(&format!("{m}_params.npz"));
            let data = fx(&format!("{m}_train.npz"));
            for target in ["interp", "cpu"] {
                // One micro-batch of another size than the export's.
                let mut args = vec!["train"];
                args.extend(train_args(&model, &params, &data));
                let bs = b.to_string();
                args.extend(["--steps", "5", "--batch", &bs, "--target", target]);
                let r = ppcc(&args);
                assert!(r.ok, "{model} --batch {b} --target {target}: {}", r.stderr);
                assert_close(
                    &format!("{model} --batch {b} --target {target}"),
                    &losses(&r.stdout),
                    &want,
                    1e-4,
                );
            }
            // The exported batch in 2 micro-batches of half the rows: JAX's full-batch run.
            if exported.is_multiple_of(2) {
                let mut args = vec!["train"];
                args.extend(train_args(&model, &params, &data));
                let es = exported.to_string();
                args.extend(["--steps", "5", "--batch", &es, "--microbatches", "2"]);
                let r = ppcc(&args);
                assert!(r.ok, "{model} 2 micro-batches: {}", r.stderr);
                assert_close(
                    &format!("{model} 2 micro-batches"),
                    &losses(&r.stdout),
                    &full,
                    1e-4,
                );
            }
        }
    }
}

#[test]
fn two_stages_with_rebound_micro_batches_equal_jax_sgd() {
    for m in MODELS {
        let exported = exported_batch(m);
        if !exported.is_multiple_of(2) {
            continue;
        }
        let want = jax_losses(m);
        let model = fx(&format!("{m}.mlir"));
        let params = fx(&format!("{m}_params.npz"));
        let data = fx(&format!("{m}_train.npz"));
        let dir = compile_two_stages(&model, &params, &data, &format!("{m}-2stages-2mb"), 2);
        let r = ppcc(&[
            "run",
            dir.to_str().unwrap(),
            "--steps",
            "5",
            "--data",
            &data,
        ]);
        assert!(r.ok, "{model} run: {}", r.stderr);
        assert_close(
            &format!("{model} 2 stages, 2 micro-batches"),
            &losses(&r.stdout),
            &want,
            1e-4,
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn trained_params_are_saved_as_npz_keyed_like_main() {
    for m in ["mlp", "ops"] {
        let want = jax_losses(m);
        let model = fx(&format!("{m}.mlir"));
        let params = fx(&format!("{m}_params.npz"));
        let data = fx(&format!("{m}_train.npz"));
        let keys = |p: &PathBuf| -> Vec<String> {
            let mut k: Vec<String> = npz_entries(p).into_iter().map(|(k, _)| k).collect();
            k.sort();
            k
        };
        let want_keys = keys(&repo().join(&params));
        // Step 4 of JAX's run uses batch 4 mod 2 = 0, which is step 0 of a new run: from
        // the parameters saved after 4 steps, one step has JAX's fifth loss.
        let from_saved = |saved: &PathBuf, what: &str| {
            assert_eq!(keys(saved), want_keys, "{what}");
            let s = saved.to_str().unwrap();
            let mut args = vec!["train"];
            args.extend(train_args(&model, s, &data));
            args.extend(["--steps", "1", "--target", "interp"]);
            let r = ppcc(&args);
            assert!(r.ok, "{what}: {}", r.stderr);
            assert_close(what, &losses(&r.stdout), &want[4..], 1e-4);
        };

        let saved = tmp(&format!("{m}-trained.npz"));
        let _ = std::fs::remove_file(&saved);
        let mut args = vec!["train"];
        args.extend(train_args(&model, &params, &data));
        args.extend([
            "--steps",
            "4",
            "--target",
            "interp",
            "--save-params",
            saved.to_str().unwrap(),
        ]);
        let r = ppcc(&args);
        assert!(r.ok, "{}", r.stderr);
        assert_close(
            &format!("{m} 4 steps"),
            &losses(&r.stdout),
            &want[..4],
            1e-4,
        );
        from_saved(&saved, &format!("{m}: ppcc train --save-params"));

        // --save-onnx has no ONNX model to write back into: the error says what to use.
        let mut args = vec!["train"];
        args.extend(train_args(&model, &params, &data));
        args.extend(["--steps", "1", "--save-onnx", "/dev/null"]);
        let r = ppcc(&args);
        fails(&r, "--save-onnx for StableHLO");
        assert!(r.stderr.contains("--save-params"), "{}", r.stderr);

        // The same after a 2-stage pipeline run.
        let dir = compile_two_stages(
            &model,
            &params,
            &data,
            &format!("{m}-save-params-2stages"),
            1,
        );
        let saved = tmp(&format!("{m}-trained-2stages.npz"));
        let _ = std::fs::remove_file(&saved);
        let d = dir.to_str().unwrap();
        let r = ppcc(&[
            "run",
            d,
            "--steps",
            "4",
            "--data",
            &data,
            "--target",
            "interp",
            "--save-params",
            saved.to_str().unwrap(),
        ]);
        assert!(r.ok, "{}", r.stderr);
        from_saved(&saved, &format!("{m}: ppcc run --save-params"));
        let r = ppcc(&[
            "run",
            d,
            "--steps",
            "1",
            "--data",
            &data,
            "--save-onnx",
            "/dev/null",
        ]);
        fails(&r, "run --save-onnx for StableHLO");
        assert!(r.stderr.contains("--save-params"), "{}", r.stderr);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
