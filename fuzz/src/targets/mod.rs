//! The fuzz targets: one reader each, its seeds, its format-aware mutations.
//!
//! In-process targets call a reader's library entry point (the driver catches panics);
//! `ppcc-*` targets run the `ppcc` binary on the mutated file and flag a death by signal, a
//! panic, or a run past the time limit. To add a reader, write a [`Target`] and list it in
//! [`all`].

mod csv;
mod npz;
mod onnx;
mod plan;
mod ppcc;
mod pps;
mod stablehlo;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::mutate::mutate_bytes;
use crate::rng::Rng;

/// What one input did.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// The reader accepted it.
    Accepted,
    /// The reader refused it with this error (fine: that is the contract).
    Rejected(String),
    /// A crash found without a panic (a child process killed by a signal, a panic in a
    /// child, a child past its time limit).
    Crash(String),
}

/// What targets may use: paths, a scratch folder, the `ppcc` binary.
#[derive(Clone, Debug)]
pub struct Env {
    /// The repository root (examples/ and the committed seeds are read from it).
    pub root: PathBuf,
    /// A private scratch folder for files the readers read.
    pub scratch: PathBuf,
    /// The `ppcc` binary (for the `ppcc-*` targets and to compile seed plans).
    pub ppcc: Option<PathBuf>,
    /// The onnx package's backend test data (`PPCC_ONNX_TESTDATA`).
    pub onnx_testdata: Option<PathBuf>,
    /// How many of those models to take as seeds.
    pub onnx_sample: usize,
    /// Compiled plan folders (each with plan.json and stage programs) used as seeds and,
    /// for `ppcc-run-plan`, as the folder a mutated plan.json is run in.
    pub plan_dirs: Vec<PathBuf>,
    /// Longest a `ppcc` child may run before it is killed and reported.
    pub child_timeout: Duration,
}

pub trait Target: Send + Sync {
    /// The name on the command line and the findings folder.
    fn name(&self) -> &'static str;
    /// What it reads, for `--list`.
    fn describe(&self) -> &'static str;
    /// Extension of finding files (so they open in the right tool).
    fn ext(&self) -> &'static str;
    /// The initial corpus.
    fn seeds(&self, env: &Env) -> anyhow::Result<Vec<Vec<u8>>>;
    /// A format-aware mutation of `input`, or `None` when `input` does not parse (the
    /// driver then mutates bytes).
    fn mutate_structured(&self, rng: &mut Rng, input: &[u8], corpus: &[Vec<u8>])
        -> Option<Vec<u8>>;
    /// Run the reader on `input`.
    fn run(&self, env: &Env, input: &[u8]) -> Verdict;
    /// Whether it needs `env.ppcc`.
    fn needs_ppcc(&self) -> bool {
        false
    }
    /// Relative share of a time budget split over several targets.
    fn weight(&self) -> u32 {
        2
    }
}

/// Every target, in the order the runner fuzzes them.
pub fn all() -> Vec<Box<dyn Target>> {
    vec![
        Box::new(onnx::Onnx),
        Box::new(npz::Npz),
        Box::new(plan::Plan),
        Box::new(csv::Csv),
        Box::new(pps::Pps),
        Box::new(stablehlo::StableHlo),
        Box::new(ppcc::PpccImport),
        Box::new(ppcc::EVAL_INTERP),
        Box::new(ppcc::TRAIN_INTERP),
        Box::new(ppcc::PpccRunPlan),
        Box::new(ppcc::EVAL_CPU),
    ]
}

/// One mutation of `input`: one to three format-aware mutations (3 in 4, when it parses),
/// sometimes followed by byte-level ones; byte-level only otherwise.
pub fn mutate(t: &dyn Target, rng: &mut Rng, input: &[u8], corpus: &[Vec<u8>]) -> Vec<u8> {
    let mut structured: Option<Vec<u8>> = None;
    if !rng.one_in(4) {
        for _ in 0..1 + rng.below(3) {
            let base = structured.as_deref().unwrap_or(input);
            match t.mutate_structured(rng, base, corpus) {
                Some(o) => structured = Some(o),
                None => break,
            }
        }
    }
    match structured {
        Some(o) if !rng.one_in(6) => o,
        other => {
            let mut data = other.unwrap_or_else(|| input.to_vec());
            mutate_bytes(rng, &mut data, corpus);
            data
        }
    }
}

/// Files under `dir` with one of `exts`, sorted (so seeds are in a stable order).
pub fn files_with_ext(dir: &Path, exts: &[&str], recursive: bool) -> Vec<PathBuf> {
    let mut out = vec![];
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            if recursive {
                out.extend(files_with_ext(&p, exts, true));
            }
        } else if exts
            .iter()
            .any(|x| p.extension().and_then(|s| s.to_str()) == Some(*x))
        {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// Read every file of a list.
pub fn read_all(paths: &[PathBuf]) -> anyhow::Result<Vec<Vec<u8>>> {
    paths
        .iter()
        .map(|p| std::fs::read(p).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", p.display())))
        .collect()
}

/// The exit status of ppcc's crash report (`ppcc_driver::crash::CRASH_EXIT`): ppcc turns a
/// fatal signal into that report ("ppcc: internal error: ...") and this status.
const CRASH_EXIT: i32 = 70;

/// Run a child to completion or `timeout`; a signal, ppcc's crash report (exit 70 and an
/// "internal error:" line), a Rust panic (exit 101 or a "panicked at" line) or the timeout
/// is a crash, any other exit a verdict by status.
pub fn run_child(mut cmd: Command, timeout: Duration) -> Verdict {
    let start = Instant::now();
    let log = tempfile_in(cmd.get_current_dir().map(Path::to_path_buf));
    let stderr = match std::fs::File::create(&log) {
        Ok(f) => f,
        Err(e) => return Verdict::Crash(format!("fuzzer: cannot create {}: {e}", log.display())),
    };
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return Verdict::Crash(format!("fuzzer: cannot start {cmd:?}: {e}")),
    };
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if start.elapsed() > timeout => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Verdict::Crash(format!("fuzzer: waiting for the child: {e}")),
        }
    };
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    let tail = tail_lines(&text, 6);
    let Some(status) = status else {
        return Verdict::Crash(format!(
            "hang: still running after {:.0} s (killed); stderr: {tail}",
            timeout.as_secs_f64()
        ));
    };
    use std::os::unix::process::ExitStatusExt;
    if let Some(sig) = status.signal() {
        return Verdict::Crash(format!(
            "killed by signal {sig} ({}): {}",
            signal_name(sig),
            summarise_log(&text)
        ));
    }
    if status.code() == Some(CRASH_EXIT) && text.contains(": internal error: ") {
        return Verdict::Crash(format!(
            "crash report (exit status {CRASH_EXIT}): {}",
            summarise_log(&text)
        ));
    }
    if text.contains("panicked at") {
        return Verdict::Crash(format!("panic: {}", summarise_log(&text)));
    }
    if status.code() == Some(101) {
        return Verdict::Crash(format!("exit status 101 (a Rust panic); stderr: {tail}"));
    }
    if status.success() {
        Verdict::Accepted
    } else {
        Verdict::Rejected(tail_lines(&text, 2))
    }
}

fn tempfile_in(dir: Option<PathBuf>) -> PathBuf {
    let dir = dir.unwrap_or_else(std::env::temp_dir);
    dir.join(format!("child-{}.stderr", std::process::id()))
}

/// The first stack frame in ppcc's own crates in a backtrace (`ir/src/x.rs:1:2`), skipping
/// the standard library, dependencies and this fuzzer.
pub fn project_frame(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let loc = l.trim().strip_prefix("at ")?;
        let loc = loc.rsplit("../").next().unwrap_or(loc);
        CRATES
            .iter()
            .find_map(|c| loc.find(c).map(|i| loc[i..].to_string()))
    })
}

/// Source folders of ppcc's crates, as they appear in backtraces.
const CRATES: &[&str] = &[
    "ir/src/",
    "cli/src/",
    "runtime/src/",
    "passes/src/",
    "frontends/src/",
    "codegen/src/",
];

/// The line of a crash log that says what happened (a panic, a failed allocation, a stack
/// overflow), with the first ppcc frame of its backtrace; else its last lines.
pub fn summarise_log(text: &str) -> String {
    // The last such line: a worker's log also holds the panics it caught before it died.
    let is_key = |l: &str| {
        (l.contains("panicked at")
            || l.contains("memory allocation of")
            || l.contains("overflowed its stack"))
            && !l.starts_with("FINDING ")
    };
    let lines: Vec<&str> = text.lines().collect();
    // ppcc's crash report, when nothing above it says more.
    let report = |l: &&str| l.contains(": internal error: ");
    let Some(at) = lines
        .iter()
        .rposition(|l| is_key(l))
        .or_else(|| lines.iter().rposition(report))
    else {
        return tail_lines(text, 4);
    };
    let k = lines[at].trim();
    let rest: String = lines
        .get(at + 1)
        .filter(|l| !l.contains("stack backtrace") && !l.contains("note: "))
        .map(|l| format!(" {}", l.trim()))
        .unwrap_or_default();
    // Name ppcc's caller when the failure is inside the standard library or a dependency.
    let foreign = !k.contains("(in ") && !CRATES.iter().any(|c| k.contains(&format!("at {c}")));
    match project_frame(&lines[at..].join("\n")).filter(|_| foreign) {
        Some(f) => format!("{k}{rest} (in {f})"),
        None => format!("{k}{rest}"),
    }
}

pub fn tail_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

pub fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGTERM => "SIGTERM",
        libc::SIGTRAP => "SIGTRAP",
        _ => "signal",
    }
}

/// The external-data file name that mutated ONNX models point at (created in the scratch
/// folder by the runner).
pub fn onnx_external_file() -> &'static str {
    onnx::EXTERNAL_FILE
}

/// An error and its causes joined by `: `, as `ppcc` prints them.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let text = c.to_string();
        if !s.ends_with(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Verdict {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", script]).current_dir(std::env::temp_dir());
        run_child(cmd, Duration::from_secs(20))
    }

    /// ppcc turns fatal signals into a report and exit status 70: still a crash, named by
    /// its report; a death by signal and a plain refusal as before.
    #[test]
    fn a_crash_report_is_a_crash() {
        let v = sh("echo 'ppcc: internal error: a segmentation fault (or a stack overflow) while importing the model.' >&2; echo 'This is a bug' >&2; exit 70");
        match v {
            Verdict::Crash(m) => assert!(
                m.contains("exit status 70") && m.contains("while importing the model"),
                "{m}"
            ),
            other => panic!("not a crash: {other:?}"),
        }
        assert!(matches!(sh("kill -SEGV $$"), Verdict::Crash(m) if m.contains("SIGSEGV")));
        assert!(matches!(
            sh("echo 'error: bad model' >&2; exit 70"),
            Verdict::Rejected(_)
        ));
        assert!(matches!(
            sh("echo 'error: bad model' >&2; exit 1"),
            Verdict::Rejected(_)
        ));
    }
}
