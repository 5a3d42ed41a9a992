//! Hostile sizes and graphs end to end (issue 12, items 2, 5 and 7): every run below used
//! to end in a signal (SIGSEGV, SIGABRT "memory allocation failed"), a panic, or a silent
//! wrong answer. Each must now exit with status 1 and a message naming what is wrong.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

use ppcc_frontends::onnx::proto::*;
use ppcc_frontends::onnx::tensor::tensor_to_proto;
use ppir::{DType, Tensor};
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

/// The run failed with exit status 1 (not a signal, not a panic's 101); its stderr.
#[track_caller]
fn refused(o: &Output) -> String {
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(
        o.status.code(),
        Some(1),
        "status {:?}, stderr:\n{stderr}",
        o.status
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

fn scratch() -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "ppcc-sizes-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// An `.npy` header (version 1) declaring `shape` (Python tuple syntax) of `descr`.
fn npy_header(descr: &str, shape: &str) -> Vec<u8> {
    let mut text = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + text.len() + 1) % 64 != 0 {
        text.push(' ');
    }
    text.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(text.len() as u16).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
    out
}

/// An `.npz` holding `NAME.npy` = `header` followed by `zeros` zero bytes, deflated.
fn npz_entry(path: &Path, name: &str, header: &[u8], zeros: usize) {
    let mut zip = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    zip.start_file(format!("{name}.npy"), options).unwrap();
    zip.write_all(header).unwrap();
    let chunk = vec![0u8; 1 << 20];
    let mut left = zeros;
    while left > 0 {
        let k = left.min(chunk.len());
        zip.write_all(&chunk[..k]).unwrap();
        left -= k;
    }
    zip.finish().unwrap();
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

fn node(name: &str, op: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
    NodeProto {
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        name: name.into(),
        op_type: op.into(),
        ..Default::default()
    }
}

/// Write a model with input `x` [1, 1] (unless `inputs` says otherwise), output `y`.
fn model(
    path: &Path,
    inputs: Vec<ValueInfoProto>,
    nodes: Vec<NodeProto>,
    initializers: &[(&str, Tensor)],
) {
    let m = ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
        graph: Some(GraphProto {
            node: nodes,
            name: "g".into(),
            initializer: initializers
                .iter()
                .map(|(n, t)| tensor_to_proto(t, n))
                .collect(),
            input: inputs,
            output: vec![ValueInfoProto {
                name: "y".into(),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    std::fs::write(path, m.encode_to_vec()).unwrap();
}

/// One input `x` [1, 1] = 1.0.
fn x11(dir: &Path) -> PathBuf {
    let p = dir.join("x.npz");
    let mut zip = zip::ZipWriter::new(std::fs::File::create(&p).unwrap());
    let options = zip::write::SimpleFileOptions::default();
    zip.start_file("x.npy", options).unwrap();
    zip.write_all(&npy_header("<f4", "(1, 1)")).unwrap();
    zip.write_all(&1.0f32.to_le_bytes()).unwrap();
    zip.finish().unwrap();
    p
}

/// Item 2: a header `(2**62, 4)` with no data: the element count wrapped to 0, then
/// `eval --target cpu` crashed (SIGSEGV), the interpreter wrote an unreadable file and
/// `train` panicked slicing rows.
#[test]
fn npz_shape_that_wraps_to_zero_is_refused() {
    let dir = scratch();
    let npz = dir.join("big.npz");
    npz_entry(
        &npz,
        "x",
        &npy_header("<f4", "(4611686018427387904, 64)"),
        0,
    );
    let out = dir.join("out.npz");
    let want = "array `x`: shape [4611686018427387904, 64] is too large";
    for target in ["cpu", "interp"] {
        let o = ppcc(&[
            "eval",
            "examples/mlp.onnx",
            "--inputs",
            s(&npz),
            "-o",
            s(&out),
            "--target",
            target,
        ]);
        let e = refused(&o);
        assert!(e.contains(want), "--target {target}: {e}");
        assert!(!out.exists(), "--target {target} wrote {}", out.display());
    }
    let o = ppcc(&[
        "train",
        "examples/mlp.onnx",
        "--data",
        s(&npz),
        "--steps",
        "1",
    ]);
    assert!(refused(&o).contains(want));
    std::fs::remove_dir_all(&dir).ok();
}

/// Item 5: a deflate bomb. The header declares 2^40 f32 elements (4 TB) over 64 MB of
/// zeros that compress to about 64 kB; the old reader inflated the entry, then aborted
/// allocating the array. Now the header is checked against available memory first.
#[test]
fn npz_deflate_bomb_is_refused_before_inflating() {
    let dir = scratch();
    let npz = dir.join("bomb.npz");
    npz_entry(&npz, "x", &npy_header("<f4", "(1099511627776,)"), 64 << 20);
    assert!(std::fs::metadata(&npz).unwrap().len() < 1 << 20);
    let o = ppcc(&[
        "eval",
        "examples/mlp.onnx",
        "--inputs",
        s(&npz),
        "-o",
        s(&dir.join("out.npz")),
    ]);
    let e = refused(&o);
    assert!(
        e.contains("array `x` (shape [1099511627776], dtype f4) needs")
            && e.contains("of memory is available"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// Item 5: `train --batch 1000000000` aborted allocating the synthetic batch. Native code
/// refuses when the module is loaded (the argument's buffer), the interpreter when the
/// synthetic batch would be drawn.
#[test]
fn train_with_a_batch_larger_than_memory_is_refused() {
    for (target, want) in [
        (
            "interp",
            "synthetic input `x`: a batch of tensor<1000000000x64xf32> needs 512.0 GB",
        ),
        (
            "cpu",
            "argument %x (tensor<1000000000x64xf32>) needs 256.0 GB",
        ),
    ] {
        let o = ppcc(&[
            "train",
            "examples/mlp.onnx",
            "--batch",
            "1000000000",
            "--steps",
            "1",
            "--target",
            target,
        ]);
        let e = refused(&o);
        assert!(
            e.contains(want) && e.contains("of memory is available"),
            "{target}: {e}"
        );
    }
}

/// Item 5: an Expand to 8e12 elements (and a ConstantOfShape of that size) aborted in
/// the allocator, in the interpreter and in native code.
#[test]
fn expand_to_8e12_elements_is_refused_naming_the_node() {
    let dir = scratch();
    let shape = Tensor::from_i64(DType::I64, vec![2], vec![2_000_000, 4_000_000]);
    let expand = dir.join("expand.onnx");
    model(
        &expand,
        vec![info("x", &[1, 1])],
        vec![node("expand0", "Expand", &["x", "shape"], &["y"])],
        &[("shape", shape.clone())],
    );
    let cos = dir.join("cos.onnx");
    model(
        &cos,
        vec![info("x", &[1, 1])],
        vec![
            node("fill", "ConstantOfShape", &["shape"], &["c"]),
            node("add0", "Add", &["x", "c"], &["y"]),
        ],
        &[("shape", shape)],
    );
    let x = x11(&dir);
    let out = dir.join("out.npz");
    for (m, loc) in [(&expand, "expand0"), (&cos, "fill")] {
        for target in ["interp", "cpu"] {
            let o = ppcc(&[
                "eval",
                s(m),
                "--inputs",
                s(&x),
                "-o",
                s(&out),
                "--target",
                target,
            ]);
            let e = refused(&o);
            assert!(
                e.contains(&format!("(loc \"{loc}\")"))
                    && e.contains("tensor<2000000x4000000xf32>")
                    && e.contains("of memory is available"),
                "{} --target {target}: {e}",
                m.display()
            );
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Item 2: an input declared [2^31, 2^31, 4] has an element count that wraps to 0; it
/// trained to NaN.
#[test]
fn input_whose_size_wraps_is_refused() {
    let dir = scratch();
    let m = dir.join("wrap.onnx");
    model(
        &m,
        vec![info("x", &[1 << 31, 1 << 31, 4])],
        vec![node("relu0", "Relu", &["x"], &["y"])],
        &[],
    );
    let o = ppcc(&["train", s(&m), "--steps", "1"]);
    let e = refused(&o);
    assert!(
        e.contains(
            "input `x`: shape tensor<2147483648x2147483648x4xf32> of 4-byte elements is too large"
        ),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// Item 7: two nodes writing `y` were accepted (the last writer won).
#[test]
fn value_assigned_twice_is_refused() {
    let dir = scratch();
    let m = dir.join("twice.onnx");
    model(
        &m,
        vec![info("x", &[1, 1])],
        vec![
            node("first", "Relu", &["x"], &["y"]),
            node("second", "Neg", &["x"], &["y"]),
        ],
        &[],
    );
    let x = x11(&dir);
    let o = ppcc(&[
        "eval",
        s(&m),
        "--inputs",
        s(&x),
        "-o",
        s(&dir.join("o.npz")),
    ]);
    let e = refused(&o);
    assert!(
        e.contains(
            r#"value `y` is assigned twice, by node "first" (Relu) and by node "second" (Neg)"#
        ),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
