//! Helpers shared by the `ppcc run` tests (threads and MPI): run a command from the
//! repository root, compile a plan, fresh temporary folders.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// An empty temporary folder named after the test binary's process and `name`.
pub fn tmp(prefix: &str, name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("{prefix}-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

pub struct Out {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
    pub took: Duration,
}

/// Run `c` from the repository root, timing it.
pub fn output(mut c: Command) -> Out {
    let t0 = Instant::now();
    let out = c
        .current_dir(repo())
        .stdin(Stdio::null())
        .output()
        .expect("the command runs");
    Out {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        took: t0.elapsed(),
    }
}

pub fn ppcc(args: &[&str]) -> Out {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ppcc"));
    c.args(args);
    output(c)
}

/// `ppcc MODEL -o DIR EXTRA...`, which must succeed.
pub fn compile(model: &str, dir: &Path, extra: &[&str]) {
    let mut args = vec![model, "-o", dir.to_str().unwrap()];
    args.extend_from_slice(extra);
    let out = ppcc(&args);
    assert!(out.ok, "ppcc {args:?} failed:\n{}", out.stderr);
}

/// The arrays of an `.npz`, each as its raw `.npy` bytes, by name (without `.npy`).
pub fn npz_entries(path: &Path) -> Vec<(String, Vec<u8>)> {
    use std::io::Read;
    let mut z = zip::ZipArchive::new(std::fs::File::open(path).unwrap()).unwrap();
    let mut out = vec![];
    for i in 0..z.len() {
        let mut f = z.by_index(i).unwrap();
        let name = f.name().trim_end_matches(".npy").to_string();
        let mut bytes = vec![];
        f.read_to_end(&mut bytes).unwrap();
        out.push((name, bytes));
    }
    out
}

/// Write `.npy` entries as an `.npz`.
pub fn write_npz_entries(path: &Path, entries: &[(String, Vec<u8>)]) {
    use std::io::Write;
    let mut z = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
    for (name, bytes) in entries {
        z.start_file(
            format!("{name}.npy"),
            zip::write::SimpleFileOptions::default()
                .compression_method(zip::CompressionMethod::Stored),
        )
        .unwrap();
        z.write_all(bytes).unwrap();
    }
    z.finish().unwrap();
}

/// An `.npy` (version 1.0) of int64 `values` with `shape`.
pub fn npy_i64(shape: &[usize], values: &[i64]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape = if dims.len() == 1 {
        format!("({},)", dims[0])
    } else {
        format!("({})", dims.join(", "))
    };
    let mut header = format!("{{'descr': '<i8', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for v in values {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

/// A copy of the `.npz` `from` at `to` with array `name` replaced by int64 `values` of
/// `shape`.
pub fn npz_with_ints(from: &Path, to: &Path, name: &str, shape: &[usize], values: &[i64]) {
    let mut entries = npz_entries(from);
    let e = entries
        .iter_mut()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("{} has no `{name}`", from.display()));
    e.1 = npy_i64(shape, values);
    write_npz_entries(to, &entries);
}

/// Run `ppcc ARGS`, killing it after `limit` (then `None`: it did not end by itself).
pub fn ppcc_within(args: &[&str], limit: Duration) -> Option<Out> {
    let t0 = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ppcc"))
        .args(args)
        .current_dir(repo())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ppcc starts");
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            return Some(Out {
                ok: status.success(),
                stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
                took: t0.elapsed(),
            });
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The losses of `step <k> loss <value>` lines (what `ppcc run` and `ppcc train` print).
pub fn losses(stdout: &str) -> Vec<f64> {
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

/// The test venv's Python (`PPCC_PYTHON`, else `.venv/bin/python`).
pub fn python() -> String {
    std::env::var("PPCC_PYTHON")
        .unwrap_or_else(|_| repo().join(".venv/bin/python").display().to_string())
}

/// A 2-layer GPT (d 32, vocabulary 64, 8 tokens) with its LM head tied to `wte.weight`,
/// written by `bench/gen_models.py` into `dir`.
pub fn tied_gpt(dir: &Path) -> String {
    let mut c = Command::new(python());
    c.args([
        "bench/gen_models.py",
        "--out",
        dir.to_str().unwrap(),
        "--only",
        "gpt",
        "--layers",
        "2",
        "--d-model",
        "32",
        "--heads",
        "2",
        "--seq",
        "8",
        "--vocab",
        "64",
        "--tie-embeddings",
        "--no-check",
    ]);
    let out = output(c);
    assert!(
        out.ok,
        "gen_models.py failed:\n{}{}",
        out.stdout, out.stderr
    );
    dir.join("gpt24.onnx").display().to_string()
}

/// Each loss within 1e-5 relative of the reference's (`what` names the run).
pub fn close(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: {got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!(
            (g - w).abs() <= 1e-5 * w.abs().max(1e-6),
            "{what}: {got:?} vs {want:?}"
        );
    }
}
