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
