//! The runner: a supervisor that, per target, replays the saved findings and then fuzzes in
//! worker processes (so an abort, a segfault or a hang in a reader is caught, recorded and
//! the run goes on), and the worker loop itself.
//!
//! A worker keeps a corpus (the seeds, then every mutated input whose outcome — accepted,
//! or the error message with numbers blanked — is new: error messages stand in for coverage
//! on stable Rust), picks an entry, mutates it, writes it to a "current input" file and runs
//! the target under `catch_unwind`. A panic, a crash verdict or a run slower than
//! `--slow-seconds` is saved under `FINDINGS/<target>/` with a `.txt` beside it (message,
//! seed, command to reproduce); the supervisor saves the current input when a worker dies
//! by a signal or stops making progress.

use std::collections::BTreeSet;
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use crate::rng::{hash_bytes, mix, Rng};
use crate::targets::{mutate, signal_name, summarise_log, tail_lines, Env, Target, Verdict};

/// Exit status of a worker or `exec` that found something (saved, printed).
pub const EXIT_FOUND: i32 = 3;

/// What one execution did.
#[derive(Debug)]
pub enum Outcome {
    Verdict(Verdict),
    Panic(String),
}

static LAST_PANIC: Mutex<Option<String>> = Mutex::new(None);

/// Record panic messages with their location (and print them as one line on stderr).
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(non-string panic payload)".into());
        let loc = info
            .location()
            .map(|l| format!("{}:{}:{}", l.file(), l.line(), l.column()))
            .unwrap_or_default();
        let mut text = format!("panicked at {loc}: {msg}");
        // A panic inside the standard library (an overflow in `product`, an index): say
        // which of ppcc's functions called it.
        if loc.starts_with("/rustc/") || loc.contains("/.cargo/") {
            let bt = std::backtrace::Backtrace::force_capture().to_string();
            if let Some(f) = crate::targets::project_frame(&bt) {
                text.push_str(&format!(" (in {f})"));
            }
        }
        eprintln!("{text}");
        if let Ok(mut p) = LAST_PANIC.lock() {
            *p = Some(text);
        }
    }));
}

/// Run `input` once, catching a panic.
pub fn exec_one(t: &dyn Target, env: &Env, input: &[u8]) -> (Outcome, Duration) {
    let start = Instant::now();
    let r = catch_unwind(AssertUnwindSafe(|| t.run(env, input)));
    let elapsed = start.elapsed();
    match r {
        Ok(v) => (Outcome::Verdict(v), elapsed),
        Err(_) => {
            let msg = LAST_PANIC
                .lock()
                .ok()
                .and_then(|mut p| p.take())
                .unwrap_or_else(|| "panicked (no message)".into());
            (Outcome::Panic(msg), elapsed)
        }
    }
}

/// Whether an outcome is a finding: `(kind, message)`.
pub fn judge(
    outcome: &Outcome,
    elapsed: Duration,
    slow: Duration,
) -> Option<(&'static str, String)> {
    match outcome {
        Outcome::Panic(m) => Some(("panic", m.clone())),
        Outcome::Verdict(Verdict::Crash(m)) => Some(("crash", m.clone())),
        _ if elapsed > slow => Some((
            "slow",
            format!(
                "took {:.1} s (limit {:.1} s)",
                elapsed.as_secs_f64(),
                slow.as_secs_f64()
            ),
        )),
        _ => None,
    }
}

/// A finding's identity across runs: its kind and where it happened (the panic location),
/// or its message with numbers blanked.
pub fn finding_key(kind: &str, message: &str) -> String {
    // The ppcc frame if the message has one, else the panic location, else the message.
    let frame = message
        .rfind("(in ")
        .map(|i| message[i + 4..].trim_end_matches(')').to_string());
    let m = match (frame, message.find("panicked at ")) {
        (Some(f), _) => format!("in {f}"),
        (None, Some(i)) => message[i..]
            .split(": ")
            .next()
            .unwrap_or(message)
            .to_string(),
        (None, None) => normalise(message, 80),
    };
    format!("{kind}: {m}")
}

/// `text` with runs of digits as `#`, cut to `n` characters (a coarse signature).
pub fn normalise(text: &str, n: usize) -> String {
    let mut out = String::new();
    let mut in_digits = false;
    for c in text.chars() {
        if c.is_ascii_digit() {
            if !in_digits {
                out.push('#');
            }
            in_digits = true;
        } else {
            in_digits = false;
            out.push(c);
        }
        if out.len() >= n {
            break;
        }
    }
    out
}

/// Keys of the findings already saved for a target (from their `.txt` files).
pub fn known_keys(dir: &Path) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    for p in crate::targets::files_with_ext(dir, &["txt"], false) {
        if let Ok(text) = std::fs::read_to_string(&p) {
            keys.extend(
                text.lines()
                    .filter_map(|l| l.strip_prefix("key: "))
                    .map(String::from),
            );
        }
    }
    keys
}

/// The saved findings of a target (inputs, not their `.txt`), sorted.
pub fn saved_findings(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.is_file() && p.extension().is_some_and(|x| x != "txt"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Write a finding and its description; returns the input's path.
pub fn save_finding(
    findings: &Path,
    t: &dyn Target,
    kind: &str,
    message: &str,
    input: &[u8],
    seed: u64,
) -> std::io::Result<PathBuf> {
    let dir = findings.join(t.name());
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!("{kind}-{:016x}.{}", hash_bytes(input), t.ext()));
    std::fs::write(&path, input)?;
    let desc = format!(
        "target: {}\nkind: {kind}\nkey: {}\nseed: {seed}\nmessage: {message}\nreproduce: cargo run -p ppcc-fuzz -- exec --target {} {}\n",
        t.name(),
        finding_key(kind, message),
        t.name(),
        path.display()
    );
    std::fs::write(path.with_extension("txt"), desc)?;
    Ok(path)
}

/// When a worker stops.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    pub deadline: Instant,
    pub iterations: Option<u64>,
}

/// The worker loop (runs in a worker process). Returns whether it found anything.
pub fn worker(
    t: &dyn Target,
    env: &Env,
    seed: u64,
    budget: Budget,
    current: &Path,
    findings: &Path,
    slow: Duration,
) -> anyhow::Result<bool> {
    install_panic_hook();
    let mut rng = Rng::derive(seed, t.name());
    let seeds = t.seeds(env)?;
    anyhow::ensure!(!seeds.is_empty(), "target {} has no seeds", t.name());
    let mut keys = known_keys(&findings.join(t.name()));
    let mut corpus: Vec<Vec<u8>> = vec![];
    let mut signatures = BTreeSet::new();
    let mut found = false;
    let (mut execs, mut accepted, mut mutated) = (0u64, 0u64, 0u64);
    let start = Instant::now();
    let mut queue: std::collections::VecDeque<Vec<u8>> = seeds.into_iter().collect();
    loop {
        let from_seed = !queue.is_empty();
        if !from_seed
            && (Instant::now() >= budget.deadline
                || budget.iterations.is_some_and(|n| mutated >= n))
        {
            break;
        }
        let input = match queue.pop_front() {
            Some(s) => s,
            None => {
                mutated += 1;
                let base = rng.pick(&corpus).clone();
                mutate(t, &mut rng, &base, &corpus)
            }
        };
        std::fs::write(current, &input)?;
        let (outcome, elapsed) = exec_one(t, env, &input);
        execs += 1;
        let signature = match &outcome {
            Outcome::Verdict(Verdict::Accepted) => {
                accepted += 1;
                "accepted".to_string()
            }
            Outcome::Verdict(Verdict::Rejected(m)) => normalise(m, 100),
            _ => String::new(),
        };
        if let Some((kind, message)) = judge(&outcome, elapsed, slow) {
            found = true;
            let key = finding_key(kind, &message);
            if keys.insert(key) {
                let path = save_finding(findings, t, kind, &message, &input, seed)?;
                println!(
                    "FINDING {} {kind}: {} -> {message}",
                    t.name(),
                    path.display()
                );
            }
        } else if from_seed
            || (input.len() <= crate::mutate::MAX_LEN
                && corpus.len() < 4096
                && signatures.insert(signature))
        {
            corpus.push(input);
        }
        if from_seed && corpus.is_empty() && queue.is_empty() {
            anyhow::bail!("every seed of target {} is a finding", t.name());
        }
    }
    println!(
        "STATS {} execs={execs} accepted={accepted} corpus={} signatures={} seconds={:.1} seed={seed}",
        t.name(),
        corpus.len(),
        signatures.len(),
        start.elapsed().as_secs_f64()
    );
    Ok(found)
}

/// Settings of the supervisor.
#[derive(Clone, Debug)]
pub struct RunSettings {
    /// This program (workers are `EXE worker ...`).
    pub exe: PathBuf,
    /// Arguments every worker gets (root, ppcc, plan dirs, limits).
    pub env_args: Vec<String>,
    pub findings: PathBuf,
    pub seed: u64,
    pub slow: Duration,
    /// A worker that has not started a new input for this long is killed (a hang).
    pub hang: Duration,
    pub memory_limit: Option<u64>,
    pub iterations: Option<u64>,
    pub scratch: PathBuf,
}

/// What the supervisor saw for one target.
#[derive(Debug, Default)]
pub struct TargetReport {
    pub replayed: usize,
    /// Saved findings that still fail.
    pub still_failing: Vec<String>,
    /// New findings of this run (printed as found).
    pub new_findings: usize,
    pub stats: Vec<String>,
    pub errors: Vec<String>,
}

fn command(s: &RunSettings, args: &[String]) -> Command {
    let mut cmd = Command::new(&s.exe);
    cmd.args(args).args(&s.env_args);
    // Aborts (failed allocations) print a backtrace: the log then names ppcc's caller.
    cmd.env("RUST_BACKTRACE", "1");
    if let Some(limit) = s.memory_limit {
        use std::os::unix::process::CommandExt;
        // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                let lim = libc::rlimit {
                    rlim_cur: limit,
                    rlim_max: limit,
                };
                if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    cmd
}

/// Wait for a child, killing it if `progress` (a file rewritten before each input) goes
/// stale for `hang`. Returns the status, or `None` if it was killed as hung.
fn supervise(
    child: &mut std::process::Child,
    progress: Option<&Path>,
    hang: Duration,
) -> std::io::Result<Option<std::process::ExitStatus>> {
    let started = SystemTime::now();
    loop {
        if let Some(st) = child.try_wait()? {
            return Ok(Some(st));
        }
        let last = progress
            .and_then(|p| std::fs::metadata(p).ok())
            .and_then(|m| m.modified().ok())
            .filter(|m| *m > started)
            .unwrap_or(started);
        if last.elapsed().unwrap_or_default() > hang {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Replay the saved findings of `t`, then fuzz it for `seconds`.
pub fn run_target(t: &dyn Target, s: &RunSettings, seconds: f64) -> TargetReport {
    let mut report = TargetReport::default();
    let dir = s.findings.join(t.name());
    let start = Instant::now();
    for f in saved_findings(&dir) {
        report.replayed += 1;
        let args = vec![
            "exec".into(),
            "--target".into(),
            t.name().into(),
            f.display().to_string(),
        ];
        let log = s.scratch.join("replay.log");
        let status = std::fs::File::create(&log).and_then(|out| {
            let mut cmd = command(s, &args);
            cmd.stdout(out.try_clone()?)
                .stderr(out)
                .stdin(Stdio::null());
            let mut child = cmd.spawn()?;
            supervise(&mut child, None, s.hang)
        });
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let why = match status {
            Ok(Some(st)) if st.success() => continue,
            Ok(Some(st)) => describe_status(st, &text),
            Ok(None) => format!("hang: no result after {:.0} s", s.hang.as_secs_f64()),
            Err(e) => format!("cannot run the replay: {e}"),
        };
        report.still_failing.push(format!("{}: {why}", f.display()));
    }
    let deadline = start + Duration::from_secs_f64(seconds);
    let current = s.scratch.join(format!("current.{}", t.ext()));
    let mut restarts = 0u64;
    while Instant::now() < deadline || (restarts == 0 && s.iterations.is_some()) {
        let seed = if restarts == 0 {
            s.seed
        } else {
            mix(s.seed ^ restarts)
        };
        restarts += 1;
        let left = deadline
            .saturating_duration_since(Instant::now())
            .as_secs_f64();
        let mut args = vec![
            "worker".into(),
            "--target".into(),
            t.name().into(),
            "--seed".into(),
            seed.to_string(),
            "--seconds".into(),
            format!("{left:.3}"),
            "--current".into(),
            current.display().to_string(),
        ];
        if let Some(n) = s.iterations {
            args.extend(["--iterations".into(), n.to_string()]);
        }
        let log = s.scratch.join("worker.log");
        let _ = std::fs::remove_file(&current);
        let status = std::fs::File::create(&log).and_then(|out| {
            let mut cmd = command(s, &args);
            cmd.stdout(out.try_clone()?)
                .stderr(out)
                .stdin(Stdio::null());
            let mut child = cmd.spawn()?;
            supervise(&mut child, Some(&current), s.hang)
        });
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        for line in text.lines() {
            if let Some(st) = line.strip_prefix("STATS ") {
                report.stats.push(st.to_string());
            } else if line.starts_with("FINDING ") {
                report.new_findings += 1;
                println!("{line}");
            }
        }
        let death = match status {
            Ok(Some(st)) if st.success() || st.code() == Some(EXIT_FOUND) => None,
            Ok(Some(st)) if st.code().is_some() => {
                // A worker that could not run (no seeds, bad arguments, a bug in a
                // mutator — readers' panics are caught inside it): stop.
                report
                    .errors
                    .push(format!("worker failed: {}", tail_lines(&text, 5)));
                break;
            }
            Ok(Some(st)) => Some(("crash", describe_status(st, &text))),
            Ok(None) => Some((
                "hang",
                format!("no new input for {:.0} s (killed)", s.hang.as_secs_f64()),
            )),
            Err(e) => {
                report.errors.push(format!("cannot run a worker: {e}"));
                break;
            }
        };
        if let Some((kind, message)) = death {
            let Ok(input) = std::fs::read(&current) else {
                report
                    .errors
                    .push(format!("worker died ({message}) before its first input"));
                break;
            };
            let key = finding_key(kind, &message);
            report.new_findings += 1;
            if known_keys(&dir).contains(&key) {
                println!("FINDING {} {kind} (seen before): {message}", t.name());
            } else {
                match save_finding(&s.findings, t, kind, &message, &input, seed) {
                    Ok(p) => println!("FINDING {} {kind}: {} -> {message}", t.name(), p.display()),
                    Err(e) => report.errors.push(format!("cannot save a finding: {e}")),
                }
            }
            if restarts > 50 {
                report
                    .errors
                    .push("more than 50 worker deaths; giving up".into());
                break;
            }
        } else {
            break;
        }
    }
    report
}

fn describe_status(st: std::process::ExitStatus, log: &str) -> String {
    use std::os::unix::process::ExitStatusExt;
    let tail = summarise_log(
        &log.lines()
            .filter(|l| !l.starts_with("STATS "))
            .collect::<Vec<_>>()
            .join("\n"),
    );
    match st.signal() {
        Some(sig) => format!(
            "killed by signal {sig} ({}); output: {tail}",
            signal_name(sig)
        ),
        None => format!("exit status {}; output: {tail}", st.code().unwrap_or(-1)),
    }
}

/// `exec`: run files through a target once each and print what happened; returns whether
/// any is a finding.
pub fn exec_files(
    t: &dyn Target,
    env: &Env,
    files: &[PathBuf],
    slow: Duration,
) -> anyhow::Result<bool> {
    install_panic_hook();
    let mut found = false;
    for f in files {
        let input =
            std::fs::read(f).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", f.display()))?;
        let (outcome, elapsed) = exec_one(t, env, &input);
        let line = match (judge(&outcome, elapsed, slow), &outcome) {
            (Some((kind, m)), _) => {
                found = true;
                format!("{kind}: {m}")
            }
            (None, Outcome::Verdict(Verdict::Accepted)) => "accepted".into(),
            (None, Outcome::Verdict(Verdict::Rejected(m))) => format!("rejected: {m}"),
            (None, Outcome::Verdict(Verdict::Crash(m)) | Outcome::Panic(m)) => m.clone(),
        };
        println!(
            "{} [{}, {:.2} s]: {line}",
            f.display(),
            t.name(),
            elapsed.as_secs_f64()
        );
        let _ = std::io::stdout().flush();
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// Panics on inputs that contain `!`, rejects the others.
    struct Toy;
    impl Target for Toy {
        fn name(&self) -> &'static str {
            "toy"
        }
        fn describe(&self) -> &'static str {
            "test target"
        }
        fn ext(&self) -> &'static str {
            "bin"
        }
        fn seeds(&self, _env: &Env) -> anyhow::Result<Vec<Vec<u8>>> {
            Ok(vec![b"abc".to_vec()])
        }
        fn mutate_structured(
            &self,
            rng: &mut Rng,
            input: &[u8],
            _c: &[Vec<u8>],
        ) -> Option<Vec<u8>> {
            let mut v = input.to_vec();
            v.push(if rng.one_in(20) { b'!' } else { b'a' });
            Some(v)
        }
        fn run(&self, _env: &Env, input: &[u8]) -> Verdict {
            assert!(!input.contains(&b'!'), "toy reader saw a bang");
            Verdict::Rejected(format!("{} bytes", input.len()))
        }
    }

    fn env(dir: &Path) -> Env {
        Env {
            root: dir.into(),
            scratch: dir.into(),
            ppcc: None,
            onnx_testdata: None,
            onnx_sample: 0,
            plan_dirs: vec![],
            child_timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn a_panic_is_caught_saved_once_and_keyed_by_location() {
        let dir = std::env::temp_dir().join(format!("ppcc-fuzz-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let budget = Budget {
            deadline: Instant::now() + Duration::from_secs(30),
            iterations: Some(400),
        };
        let found = worker(
            &Toy,
            &env(&dir),
            1,
            budget,
            &dir.join("cur"),
            &dir.join("f"),
            Duration::from_secs(5),
        )
        .expect("the worker runs");
        assert!(found);
        let saved = saved_findings(&dir.join("f").join("toy"));
        // Many inputs panic, all at one place: one finding.
        assert_eq!(saved.len(), 1, "{saved:?}");
        let input = std::fs::read(&saved[0]).unwrap();
        assert!(input.contains(&b'!'));
        let desc = std::fs::read_to_string(saved[0].with_extension("txt")).unwrap();
        assert!(desc.contains("toy reader saw a bang"), "{desc}");
        assert!(
            desc.contains("key: panic: panicked at fuzz/src/driver.rs:"),
            "{desc}"
        );
        assert_eq!(
            finding_key(
                "crash",
                "panic: panicked at /rustc/x/accum.rs:1:1: overflow (in ir/src/a.rs:3:4)"
            ),
            "crash: in ir/src/a.rs:3:4"
        );
        // Replaying it reports it again.
        assert!(exec_files(&Toy, &env(&dir), &saved, Duration::from_secs(5)).unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn slow_inputs_are_findings_and_messages_normalise() {
        let ok = Outcome::Verdict(Verdict::Rejected("x".into()));
        assert!(judge(&ok, Duration::from_millis(10), Duration::from_secs(1)).is_none());
        assert_eq!(
            judge(&ok, Duration::from_secs(2), Duration::from_secs(1)).map(|f| f.0),
            Some("slow")
        );
        assert_eq!(
            normalise("shape (123, 4) at 0x1f", 100),
            "shape (#, #) at #x#f"
        );
    }
}
