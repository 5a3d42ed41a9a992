//! External tensor data: read from files next to the model, and nothing else.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use ppcc_frontends::onnx::proto::{data_location, data_type, StringStringEntryProto, TensorProto};
use ppcc_frontends::onnx::{import_onnx, import_onnx_file, ImportOptions, OnnxError};
use prost::Message;

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A fresh folder under the system temp dir.
fn scratch() -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "ppcc-ext-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A model `y = x + w` whose `w` ([3] f32) is external with the given keys.
fn model_with_external(entries: &[(&str, &str)]) -> Vec<u8> {
    let w = TensorProto {
        dims: vec![3],
        data_type: data_type::FLOAT,
        name: "w".into(),
        data_location: data_location::EXTERNAL,
        external_data: entries
            .iter()
            .map(|(k, v)| StringStringEntryProto {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        ..Default::default()
    };
    let mut p = Model::new(13)
        .input(f32_info("x", &[3]))
        .node(node("Add", &["x", "w"], &["y"], vec![]))
        .output(out_info("y", data_type::FLOAT))
        .proto();
    p.graph.as_mut().unwrap().initializer.push(w);
    p.encode_to_vec()
}

fn write_model(dir: &Path, entries: &[(&str, &str)]) -> PathBuf {
    let path = dir.join("model.onnx");
    std::fs::write(&path, model_with_external(entries)).unwrap();
    path
}

fn import_err(path: &Path) -> String {
    let e = import_onnx_file(path, &ImportOptions::default()).expect_err("import should fail");
    assert!(
        matches!(
            e,
            OnnxError::ExternalData { .. } | OnnxError::ExternalLocation { .. }
        ),
        "{e}"
    );
    e.to_string()
}

#[test]
fn reads_a_file_next_to_the_model() {
    let d = scratch();
    std::fs::write(d.join("weights.bin"), f32_bytes(&[1.0, 2.0, 3.0])).unwrap();
    let m = import_onnx_file(
        write_model(&d, &[("location", "weights.bin")]),
        &ImportOptions::default(),
    )
    .unwrap();
    assert_eq!(m.weights["w"].as_f64().unwrap(), &[1.0, 2.0, 3.0]);
    let out = run(&m, vec![ppir::Tensor::from_f32(vec![3], vec![1.0; 3])]);
    assert_eq!(f32s(&out[0]), vec![2.0, 3.0, 4.0]);
}

#[test]
fn offset_and_length_select_a_range_in_a_subfolder() {
    let d = scratch();
    std::fs::create_dir(d.join("data")).unwrap();
    let mut bytes = vec![0xAB; 8];
    bytes.extend(f32_bytes(&[4.0, 5.0, 6.0]));
    bytes.extend([0xCD; 5]);
    std::fs::write(d.join("data/all.bin"), bytes).unwrap();
    let path = write_model(
        &d,
        &[
            ("location", "./data/all.bin"),
            ("offset", "8"),
            ("length", "12"),
        ],
    );
    let m = import_onnx_file(&path, &ImportOptions::default()).unwrap();
    assert_eq!(m.weights["w"].as_f64().unwrap(), &[4.0, 5.0, 6.0]);
    // From bytes, the folder comes from the options.
    let bytes = std::fs::read(&path).unwrap();
    let opts = ImportOptions {
        model_dir: Some(d.clone()),
        ..Default::default()
    };
    assert!(import_onnx(&bytes, &opts).is_ok());
    let e = import_onnx(&bytes, &ImportOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("import_onnx_file") && e.contains("model_dir"),
        "{e}"
    );
}

#[test]
fn refuses_absolute_paths() {
    let d = scratch();
    let target = d.join("weights.bin");
    std::fs::write(&target, f32_bytes(&[1.0, 2.0, 3.0])).unwrap();
    let abs = target.to_string_lossy().into_owned();
    let e = import_err(&write_model(&d, &[("location", &abs)]));
    assert!(e.contains("absolute path"), "{e}");
    let e = import_err(&write_model(&d, &[("location", "C:\\weights.bin")]));
    assert!(e.contains("absolute path"), "{e}");
}

#[test]
fn refuses_parent_components() {
    let d = scratch();
    std::fs::create_dir(d.join("model")).unwrap();
    std::fs::write(d.join("secret.bin"), f32_bytes(&[1.0, 2.0, 3.0])).unwrap();
    for loc in ["../secret.bin", "sub/../../secret.bin", "..\\secret.bin"] {
        let e = import_err(&write_model(&d.join("model"), &[("location", loc)]));
        assert!(e.contains("`..`"), "{loc}: {e}");
    }
}

#[cfg(unix)]
#[test]
fn refuses_symlinks_that_leave_the_folder() {
    let outside = scratch();
    std::fs::write(outside.join("secret.bin"), f32_bytes(&[1.0, 2.0, 3.0])).unwrap();
    let d = scratch();
    std::os::unix::fs::symlink(outside.join("secret.bin"), d.join("link.bin")).unwrap();
    let e = import_err(&write_model(&d, &[("location", "link.bin")]));
    assert!(e.contains("outside the model's folder"), "{e}");
    // A linked folder that leaves is refused too.
    std::os::unix::fs::symlink(&outside, d.join("dir")).unwrap();
    let e = import_err(&write_model(&d, &[("location", "dir/secret.bin")]));
    assert!(e.contains("outside the model's folder"), "{e}");
    // A link that stays inside is fine.
    std::fs::write(d.join("real.bin"), f32_bytes(&[7.0, 8.0, 9.0])).unwrap();
    std::os::unix::fs::symlink(d.join("real.bin"), d.join("inside.bin")).unwrap();
    let m = import_onnx_file(
        write_model(&d, &[("location", "inside.bin")]),
        &ImportOptions::default(),
    )
    .unwrap();
    assert_eq!(m.weights["w"].as_f64().unwrap(), &[7.0, 8.0, 9.0]);
}

#[test]
fn refuses_ranges_past_the_end_and_wrong_sizes() {
    let d = scratch();
    std::fs::write(d.join("w.bin"), f32_bytes(&[1.0, 2.0, 3.0])).unwrap();
    let e = import_err(&write_model(
        &d,
        &[("location", "w.bin"), ("length", "1000000000000")],
    ));
    assert!(e.contains("past the end"), "{e}");
    let e = import_err(&write_model(&d, &[("location", "w.bin"), ("offset", "13")]));
    assert!(e.contains("past the end"), "{e}");
    let e = import_err(&write_model(&d, &[("location", "w.bin"), ("offset", "4")]));
    assert!(e.contains("does not match"), "{e}");
    let e = import_err(&write_model(&d, &[("location", "w.bin"), ("offset", "-4")]));
    assert!(e.contains("not a non-negative integer"), "{e}");
    let e = import_err(&write_model(&d, &[("location", "missing.bin")]));
    assert!(e.contains("cannot open"), "{e}");
    let e = import_err(&write_model(&d, &[("offset", "0")]));
    assert!(e.contains("no `location`"), "{e}");
    std::fs::create_dir(d.join("adir")).unwrap();
    let e = import_err(&write_model(&d, &[("location", "adir")]));
    assert!(e.contains("not a regular file"), "{e}");
}
