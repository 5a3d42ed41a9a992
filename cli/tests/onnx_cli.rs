//! `ppcc import`, `ppcc eval` and `ppcc conform` as a user runs them.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

use ppcc_frontends::onnx::proto::*;
use ppcc_frontends::onnx::tensor::tensor_to_proto;
use ppir::Tensor;
use prost::Message;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn ppcc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ppcc"))
        .args(args)
        .current_dir(repo())
        .output()
        .expect("ppcc runs")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

fn scratch() -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "ppcc-cli-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn info(name: &str, dims: &[i64]) -> ValueInfoProto {
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            value: Some(TypeValue::TensorType(TypeTensor {
                elem_type: data_type::FLOAT,
                shape: Some(TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|&d| Dimension {
                            value: Some(DimensionValue::DimValue(d)),
                            denotation: String::new(),
                        })
                        .collect(),
                }),
            })),
            denotation: String::new(),
        }),
        ..Default::default()
    }
}

/// A test folder: `y = relu(x)` with one data set whose expected output is `expected`.
fn relu_case(dir: &Path, expected: &[f32]) {
    let model = ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 13,
        }],
        graph: Some(GraphProto {
            node: vec![NodeProto {
                input: vec!["x".into()],
                output: vec!["y".into()],
                name: "relu".into(),
                op_type: "Relu".into(),
                ..Default::default()
            }],
            input: vec![info("x", &[3])],
            output: vec![info("y", &[3])],
            ..Default::default()
        }),
        ..Default::default()
    };
    std::fs::create_dir_all(dir.join("test_data_set_0")).unwrap();
    std::fs::write(dir.join("model.onnx"), model.encode_to_vec()).unwrap();
    let x = Tensor::from_f32(vec![3], vec![-1.0, 0.5, 2.0]);
    let y = Tensor::from_f32(vec![3], expected.to_vec());
    std::fs::write(
        dir.join("test_data_set_0/input_0.pb"),
        tensor_to_proto(&x, "x").encode_to_vec(),
    )
    .unwrap();
    std::fs::write(
        dir.join("test_data_set_0/output_0.pb"),
        tensor_to_proto(&y, "y").encode_to_vec(),
    )
    .unwrap();
}

#[test]
fn conform_reports_rows_and_a_summary() {
    let root = scratch();
    relu_case(&root.join("test_good"), &[0.0, 0.5, 2.0]);
    relu_case(&root.join("test_bad"), &[0.0, 0.5, 2.5]);
    let o = ppcc(&["conform", root.to_str().unwrap()]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("passed") && l.contains("test_good")),
        "{out}"
    );
    assert!(
        out.lines().any(|l| l.starts_with("failed")
            && l.contains("test_bad")
            && l.contains("max abs err")),
        "{out}"
    );
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).lines().last(),
        Some("1 passed, 1 failed, 0 unsupported, 0 crashed")
    );
    // The table per op type, with its total.
    let stdout = String::from_utf8_lossy(&o.stdout);
    let table: Vec<Vec<&str>> = stdout
        .lines()
        .skip_while(|l| !l.starts_with("op type"))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        table[1..3],
        [
            vec!["Relu", "1", "1", "0", "0"],
            vec!["total", "1", "1", "0", "0"]
        ],
        "{out}"
    );
    let o = ppcc(&["conform", root.join("test_good").to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("1 passed, 0 failed, 0 unsupported, 0 crashed"));
}

/// A case whose process dies is that case's `crashed` row; the cases after it still run,
/// in order, whatever the number of jobs.
#[test]
fn conform_reports_a_crash_and_goes_on() {
    let root = scratch();
    for name in ["test_a", "test_b", "test_c", "test_d"] {
        relu_case(&root.join(name), &[0.0, 0.5, 2.0]);
    }
    for jobs in ["1", "3"] {
        let o = Command::new(env!("CARGO_BIN_EXE_ppcc"))
            .args(["conform", "--jobs", jobs, root.to_str().unwrap()])
            .env("PPCC_CONFORM_TEST_ABORT_ON", "test_b")
            .output()
            .expect("ppcc runs");
        let out = text(&o);
        assert_eq!(o.status.code(), Some(1), "{out}");
        let rows: Vec<(&str, &str)> = out
            .lines()
            .filter_map(|l| {
                let mut w = l.split_whitespace();
                Some((w.next()?, w.next()?))
            })
            .filter(|(_, n)| n.starts_with("test_"))
            .collect();
        assert_eq!(
            rows,
            [
                ("passed", "test_a"),
                ("crashed", "test_b"),
                ("passed", "test_c"),
                ("passed", "test_d")
            ],
            "{out}"
        );
        assert!(out.contains("signal 6 (SIGABRT)"), "{out}");
        assert!(
            String::from_utf8_lossy(&o.stdout)
                .ends_with("3 passed, 0 failed, 0 unsupported, 1 crashed\n"),
            "{out}"
        );
    }
}

/// The hidden hook runs the CUDA target's loops as CPU code; with another target it
/// would do nothing, so it is refused before any case runs.
#[test]
fn conform_refuses_gpu_loops_on_cpu_without_the_cpu_target() {
    let root = scratch();
    relu_case(&root.join("test_good"), &[0.0, 0.5, 2.0]);
    for target in ["interp", "cuda"] {
        let o = ppcc(&[
            "conform",
            "--target",
            target,
            "--gpu-loops-on-cpu",
            root.to_str().unwrap(),
        ]);
        let out = text(&o);
        assert_eq!(o.status.code(), Some(1), "{out}");
        assert!(out.contains("it needs --target cpu"), "{out}");
        assert!(!out.contains("test_good"), "{out}");
    }
}

#[test]
fn conform_help_states_the_tolerances() {
    let out = text(&ppcc(&["conform", "--help"]));
    assert!(
        out.contains("rtol 1e-3, atol 1e-7")
            && out.contains("N passed, N failed, N unsupported, N crashed"),
        "{out}"
    );
}

#[test]
fn import_writes_ir_that_parses_back() {
    let d = scratch();
    let out = d.join("mlp.ppir");
    let o = ppcc(&["import", "examples/mlp.onnx", "-o", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let module = ppir::text::parse_module(&std::fs::read_to_string(&out).unwrap()).expect("parses");
    ppir::verify::verify_module(&module).expect("verifies");
    assert!(!module.weights.is_empty());
    // Printed to stdout, large weights are elided.
    let o = ppcc(&["import", "examples/mlp.onnx"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("= elided"));
}

/// Every bundled example agrees with onnxruntime's outputs shipped next to it
/// (rtol 1e-4, atol 1e-5: the absolute term only matters for outputs near zero), on the
/// interpreter and as native code.
#[test]
fn every_example_matches_onnxruntime() {
    let d = scratch();
    for (name, target) in ["mlp", "gpt", "two_tower", "cnn"]
        .into_iter()
        .flat_map(|n| [(n, "interp"), (n, "cpu")])
    {
        let out = d.join(format!("{name}-{target}.npz"));
        let io = format!("examples/{name}_io.npz");
        let o = ppcc(&[
            "eval",
            "--target",
            target,
            &format!("examples/{name}.onnx"),
            "--inputs",
            &io,
            "-o",
            out.to_str().unwrap(),
            "--reference",
            &io,
            "--rtol",
            "1e-4",
            "--atol",
            "1e-5",
        ]);
        assert!(o.status.success(), "{name} --target {target}: {}", text(&o));
        assert!(
            text(&o).contains("matches the reference"),
            "{name} --target {target}: {}",
            text(&o)
        );
    }
}

#[test]
fn eval_matches_the_onnxruntime_reference() {
    let d = scratch();
    let out = d.join("out.npz");
    let o = ppcc(&[
        "eval",
        "examples/gpt.onnx",
        "--inputs",
        "examples/gpt_io.npz",
        "-o",
        out.to_str().unwrap(),
        "--reference",
        "examples/gpt_io.npz",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("output `logits`: matches the reference"),
        "{}",
        text(&o)
    );
    assert!(out.is_file());
    // An impossible tolerance fails.
    let o = ppcc(&[
        "eval",
        "examples/gpt.onnx",
        "--inputs",
        "examples/gpt_io.npz",
        "-o",
        out.to_str().unwrap(),
        "--reference",
        "examples/gpt_io.npz",
        "--rtol",
        "0",
        "--atol",
        "0",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
}

/// The onnx package's test data (`PPCC_ONNX_TESTDATA`, else found through `PPCC_PYTHON` or
/// the repository's `.venv`).
fn onnx_testdata() -> PathBuf {
    if let Some(d) = std::env::var_os("PPCC_ONNX_TESTDATA") {
        return PathBuf::from(d);
    }
    let py = std::env::var("PPCC_PYTHON")
        .unwrap_or_else(|_| repo().join(".venv/bin/python").display().to_string());
    let out = Command::new(&py)
        .args([
            "-c",
            "import onnx, os; print(os.path.join(os.path.dirname(onnx.__file__), 'backend', 'test', 'data'))",
        ])
        .output()
        .unwrap_or_else(|e| panic!("{py}: {e} (run scripts/setup.sh --test)"));
    assert!(out.status.success(), "{py} cannot import onnx");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// Every bundled ONNX test model runs as native code and matches its reference outputs,
/// the same set as the interpreter (the 8 left are unsupported by the frontend: the
/// training `Gradient` op and `StringNormalizer`).
#[test]
fn conform_with_native_code_passes_what_the_interpreter_passes() {
    let d = onnx_testdata();
    let sets = ["light", "pytorch-converted", "pytorch-operator", "simple"];
    let mut args = vec!["conform".to_string(), "--target".into(), "cpu".into()];
    args.extend(sets.iter().map(|s| d.join(s).display().to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = ppcc(&args);
    let out = text(&o);
    let summary = out.lines().last().unwrap_or_default().to_string();
    assert!(o.status.success(), "{out}");
    assert!(
        summary.starts_with("141 passed, 0 failed, 8 unsupported"),
        "{out}"
    );
    for line in out.lines().filter(|l| l.starts_with("unsupported")) {
        assert!(
            line.contains("Gradient") || line.contains("StringNormalizer"),
            "a codegen gap: {line}"
        );
    }
}

/// Issue 12, item 3: token ids beyond the embedding table are refused on both targets
/// (native code used to read them silently), naming the input, row, position and value.
#[test]
fn eval_refuses_token_ids_outside_the_vocabulary() {
    use std::io::{Read, Write};
    let dir = scratch();
    let bad = dir.join("tokens.npz");
    // examples/gpt_io.npz with tokens[1][7] = 64 (the vocabulary has 64 entries).
    let mut z =
        zip::ZipArchive::new(std::fs::File::open(repo().join("examples/gpt_io.npz")).unwrap())
            .unwrap();
    let mut tokens = vec![];
    z.by_name("tokens.npy")
        .unwrap()
        .read_to_end(&mut tokens)
        .unwrap();
    let data_start = tokens.len() - 4 * 16 * 8;
    let at = data_start + (16 + 7) * 8;
    tokens[at..at + 8].copy_from_slice(&64i64.to_le_bytes());
    let mut w = zip::ZipWriter::new(std::fs::File::create(&bad).unwrap());
    w.start_file(
        "tokens.npy",
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored),
    )
    .unwrap();
    w.write_all(&tokens).unwrap();
    w.finish().unwrap();
    for target in ["cpu", "interp"] {
        let out = ppcc(&[
            "eval",
            "examples/gpt.onnx",
            "--inputs",
            bad.to_str().unwrap(),
            "-o",
            dir.join("out.npz").to_str().unwrap(),
            "--target",
            target,
        ]);
        assert!(!out.status.success(), "--target {target}");
        assert!(
            text(&out).contains("`tokens` row 1, position 7: value 64 is outside [-64, 64)"),
            "--target {target}: {}",
            text(&out)
        );
        assert!(!dir.join("out.npz").exists());
    }
    let _ = std::fs::remove_dir_all(&dir);
}
