//! `ppcc conform`: ONNX test-data folders against their reference outputs.
//!
//! Cases run in child processes of this same binary (`ppcc conform --worker`), so native
//! code that crashes (a segmentation fault in a generated module, an abort inside MLIR) or
//! hangs costs that case, reported `crashed`, not the run. The parent hands case indices
//! to up to `--jobs` workers over their stdin; a worker answers one protocol line per case
//! on stdout. A worker that dies is replaced and the run goes on with the next case.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitCode, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ppcc_codegen::{build_module, BuildOptions, CodegenError, LowerError};
use ppcc_driver::target::{ScratchDir, Target};
use ppcc_frontends::onnx::conform::{
    case_infos, discover, run_case, Case, CaseResult, ConformOptions, ExecError, Executor, OpTable,
    Outcome, Summary,
};
use ppcc_runtime::native::NativeModule;
use ppir::{Function, Module};
use serde_json::json;

/// Run ONNX test-data folders against their reference outputs.
///
/// Each DIR is a test folder (`model.onnx` with `test_data_set_*/input_K.pb` and
/// `output_K.pb`), a folder in the onnx package's `light/` layout (`NAME.onnx` with
/// `NAME_output_0.pb`; inputs are generated as the onnx runner does:
/// `arange(n).reshape(shape) / n` in float32), or a folder of test folders.
///
/// Prints one row per model — `passed` (with the largest errors), `failed` (which output,
/// how far off), `unsupported` (the op or feature), `error` (why it could not run) or
/// `crashed` (the process running it died or timed out) — then a table per op type and
/// the line `N passed, N failed, N unsupported, N crashed` (errors count as failed).
/// Exits non-zero if any model failed or crashed.
///
/// Tolerances (`|actual - expected| <= atol + rtol * |expected|`, per output dtype, as
/// numpy.testing.assert_allclose in the onnx backend tests): f32/f64 rtol 1e-3, atol 1e-7
/// (light DenseNet-121: rtol 2e-3, as in onnx); f16 rtol 1e-3, atol 1e-3; bf16 rtol 2^-6,
/// atol 1e-3; integers and bools exact.
#[derive(clap::Args)]
#[command(after_help = "\
Layouts: DIR/model.onnx with DIR/test_data_set_*/input_K.pb and output_K.pb (TensorProto
files); or the onnx package's light/ layout, NAME.onnx with NAME_output_0.pb, whose inputs
are generated as the onnx runner does (arange(n).reshape(shape) / n, float32). A DIR may
also hold test folders one level down.

Output: one row per model, `passed` (largest errors), `failed` (which output, how far
off), `unsupported` (the op or feature), `error` (why it could not run) or `crashed`
(the process running the case died by a signal or ran past --case-timeout); then a table
of results per op type with a total row, and last the line
`N passed, N failed, N unsupported, N crashed` (errors count as failed). Exit status 1
if any failed or crashed. Cases run in child processes of ppcc (--jobs of them at once),
so a crash costs only its case; rows come in case order whatever --jobs is.

Tolerances, per output element type, |actual - expected| <= atol + rtol * |expected| as
numpy.testing.assert_allclose in the onnx backend tests:
  f32, f64   rtol 1e-3, atol 1e-7   (light DenseNet-121: rtol 2e-3, as in onnx)
  f16        rtol 1e-3, atol 1e-3
  bf16       rtol 2^-6, atol 1e-3
  integers, bool: exact
--rtol/--atol override them for float outputs.

Examples:
  ppcc conform $(python -c 'import onnx,os;print(os.path.dirname(onnx.__file__))')/backend/test/data/light
  ppcc conform data/pytorch-converted data/pytorch-operator data/simple
  ppcc conform --target cpu --jobs 2 node/
  ppcc conform my_test_dir --rtol 1e-4")]
pub struct ConformArgs {
    /// Test folders (or folders of test folders).
    #[arg(required = true, value_name = "DIR")]
    dirs: Vec<PathBuf>,
    /// Relative tolerance for float outputs (overrides the per-dtype default).
    #[arg(long)]
    rtol: Option<f64>,
    /// Absolute tolerance for float outputs (overrides the per-dtype default).
    #[arg(long)]
    atol: Option<f64>,
    /// Run the models on the reference interpreter or as native code (each model is
    /// compiled through MLIR to a temporary module.so; ops codegen does not lower yet count
    /// as `unsupported`).
    #[arg(long, value_enum, default_value_t = Target::Interp)]
    target: Target,
    /// How many cases run at once, each in a child process. Default: the number of CPUs.
    #[arg(long, short = 'j', value_name = "N")]
    jobs: Option<usize>,
    /// A case still running after this many seconds is stopped and reported `crashed`.
    #[arg(long, value_name = "SECONDS", default_value_t = 300)]
    case_timeout: u64,
    /// Run as a child of `ppcc conform`: read case indices on stdin, answer on stdout.
    #[arg(long, hide = true)]
    worker: bool,
    /// Test hook: with --target cpu, run each model as the loops --target cuda turns into
    /// kernels (tiled and mapped as for the GPU), on the CPU.
    #[arg(long, hide = true)]
    gpu_loops_on_cpu: bool,
}

/// Marks a worker's answer on stdout (anything else there is passed on to stderr).
const ANSWER: &str = "@@ppcc-conform ";

/// Every case under the DIRs, in the order both parent and workers number them.
fn cases_of(dirs: &[PathBuf]) -> Result<Vec<Case>> {
    let mut cases = vec![];
    for d in dirs {
        cases.extend(discover(d)?);
    }
    Ok(cases)
}

pub fn conform(a: ConformArgs) -> Result<ExitCode> {
    if a.gpu_loops_on_cpu && a.target != Target::Cpu {
        bail!("--gpu-loops-on-cpu runs the CUDA target's loops as CPU code: it needs --target cpu");
    }
    let cases = cases_of(&a.dirs)?;
    if a.worker {
        return worker(&a, &cases);
    }
    if cases.is_empty() {
        bail!("no test cases found");
    }
    // A worker that dies before reading its next index must not take the parent down
    // through SIGPIPE; a closed stdout then ends the run with an error instead.
    ppcc_driver::ignore_sigpipe();
    let mut out = std::io::stdout().lock();
    let infos = case_infos(&cases);
    let mut table = OpTable::default();
    let mut pool = Pool::new(&a, cases.len())?;
    let mut done: BTreeMap<usize, CaseResult> = BTreeMap::new();
    let mut next_to_print = 0;
    for (k, r) in pool.run(&cases)? {
        done.insert(k, r);
        while let Some(r) = done.remove(&next_to_print) {
            writeln!(out, "{r}")?;
            table.add(&infos[next_to_print].op_type, &r.outcome);
            next_to_print += 1;
        }
    }
    if next_to_print != cases.len() {
        bail!(
            "internal error: {} of {} cases reported",
            next_to_print,
            cases.len()
        );
    }
    let summary: Summary = table.total;
    write!(out, "\n{table}{summary}\n")?;
    out.flush()?;
    Ok(if summary.failed > 0 || summary.crashed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// The child's side: run the cases whose indices arrive on stdin, one answer line each.
fn worker(a: &ConformArgs, cases: &[Case]) -> Result<ExitCode> {
    // A crash ends the worker by its signal, which the parent names in the case's row.
    ppcc_driver::crash::uninstall();
    let opts = ConformOptions {
        rtol: a.rtol,
        atol: a.atol,
        executor: executor(a.target, a.gpu_loops_on_cpu),
    };
    // The isolation's own test (cli/tests/onnx_cli.rs) crashes a worker on purpose.
    let abort_on = std::env::var("PPCC_CONFORM_TEST_ABORT_ON").ok();
    let stdout = std::io::stdout();
    for line in std::io::stdin().lock().lines() {
        let line = line.context("reading case indices")?;
        let k: usize = line
            .trim()
            .parse()
            .with_context(|| format!("bad case index {line:?}"))?;
        let case = cases
            .get(k)
            .with_context(|| format!("case index {k} out of range"))?;
        if abort_on.as_deref() == Some(case.name.as_str()) {
            std::process::abort();
        }
        let r = run_case(case, &opts);
        let (max_abs, max_rel, message) = match &r.outcome {
            Outcome::Passed { max_abs, max_rel } => (*max_abs, *max_rel, String::new()),
            Outcome::Failed(m)
            | Outcome::Unsupported(m)
            | Outcome::Error(m)
            | Outcome::Crashed(m) => (0.0, 0.0, m.clone()),
        };
        let answer = json!({
            "index": k,
            "status": r.outcome.status(),
            "message": message,
            "max_abs": max_abs,
            "max_rel": max_rel,
            "seconds": r.seconds,
        });
        let mut out = stdout.lock();
        writeln!(out, "{ANSWER}{answer}")?;
        out.flush()?;
    }
    Ok(ExitCode::SUCCESS)
}

/// A worker's answer back into a result; `None` if the line is not one.
fn parse_answer(line: &str, name: &str) -> Option<(usize, CaseResult)> {
    let v: serde_json::Value = serde_json::from_str(line.strip_prefix(ANSWER)?).ok()?;
    let k = usize::try_from(v["index"].as_u64()?).ok()?;
    let message = v["message"].as_str()?.to_string();
    let outcome = match v["status"].as_str()? {
        "passed" => Outcome::Passed {
            max_abs: v["max_abs"].as_f64()?,
            max_rel: v["max_rel"].as_f64()?,
        },
        "failed" => Outcome::Failed(message),
        "unsupported" => Outcome::Unsupported(message),
        "error" => Outcome::Error(message),
        "crashed" => Outcome::Crashed(message),
        _ => return None,
    };
    Some((
        k,
        CaseResult {
            name: name.to_string(),
            outcome,
            seconds: v["seconds"].as_f64()?,
        },
    ))
}

/// Runs models as native code for `target`; `None` for the interpreter.
fn executor(target: Target, gpu_loops_on_cpu: bool) -> Option<Executor> {
    match target {
        Target::Interp => None,
        target @ (Target::Cpu | Target::Cuda) => Some(std::sync::Arc::new(
            move |m: &Module, f: &Function, args: Vec<ppir::Tensor>| {
                let scratch =
                    ScratchDir::new("conform").map_err(|e| ExecError::Failed(e.to_string()))?;
                let built = build_module(
                    m,
                    &[&f.name],
                    &scratch.0,
                    "the model",
                    &BuildOptions {
                        cuda: target.cuda(),
                        cuda_loops_on_cpu: gpu_loops_on_cpu.then(Default::default),
                        ..Default::default()
                    },
                )
                .map_err(|e| match e {
                    CodegenError::Lower { ref source, .. }
                        if matches!(**source, LowerError::Unsupported { .. }) =>
                    {
                        ExecError::Unsupported(format!("codegen: {source}"))
                    }
                    e => ExecError::Failed(format!(
                        "{e}: {}",
                        std::error::Error::source(&e)
                            .map(|s| s.to_string())
                            .unwrap_or_default()
                    )),
                })?;
                let native = NativeModule::load(&built.so, m, Some(&[&f.name]))
                    .map_err(|e| ExecError::Failed(e.to_string()))?;
                let refs: Vec<&ppir::Tensor> = args.iter().collect();
                native
                    .call(&f.name, &refs, None)
                    .map_err(|e| ExecError::Failed(e.to_string()))
            },
        )),
    }
}

/// What a worker's reader thread reports: a line from worker `serial`, or its stdout's end.
enum Event {
    Line(u64, String),
    Closed(u64),
}

struct Worker {
    serial: u64,
    child: Child,
    stdin: ChildStdin,
    /// The case it runs and since when.
    busy: Option<(usize, Instant)>,
    /// Killed by the parent for running past the case timeout.
    timed_out: bool,
}

/// Child processes that run cases, replaced when one dies.
struct Pool {
    command: Vec<String>,
    jobs: usize,
    timeout: Duration,
    workers: Vec<Worker>,
    serial: u64,
    tx: mpsc::Sender<Event>,
    rx: mpsc::Receiver<Event>,
}

impl Pool {
    fn new(a: &ConformArgs, cases: usize) -> Result<Pool> {
        let mut command = vec![
            "conform".to_string(),
            "--worker".into(),
            "--target".into(),
            a.target.name().into(),
        ];
        if a.gpu_loops_on_cpu {
            command.push("--gpu-loops-on-cpu".into());
        }
        if let Some(r) = a.rtol {
            command.extend(["--rtol".into(), r.to_string()]);
        }
        if let Some(t) = a.atol {
            command.extend(["--atol".into(), t.to_string()]);
        }
        command.push("--".into());
        command.extend(a.dirs.iter().map(|d| d.display().to_string()));
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let (tx, rx) = mpsc::channel();
        Ok(Pool {
            command,
            jobs: a.jobs.unwrap_or(cpus).clamp(1, cases.max(1)),
            timeout: Duration::from_secs(a.case_timeout.max(1)),
            workers: vec![],
            serial: 0,
            tx,
            rx,
        })
    }

    fn spawn(&mut self) -> Result<Worker> {
        let exe = std::env::current_exe().context("cannot find the ppcc binary to run cases")?;
        let mut child = Command::new(&exe)
            .args(&self.command)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("cannot start {} conform --worker", exe.display()))?;
        self.serial += 1;
        let serial = self.serial;
        let stdout = child.stdout.take().context("worker stdout")?;
        let stdin = child.stdin.take().context("worker stdin")?;
        let tx = self.tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(Event::Line(serial, line)).is_err() {
                    return;
                }
            }
            let _ = tx.send(Event::Closed(serial));
        });
        Ok(Worker {
            serial,
            child,
            stdin,
            busy: None,
            timed_out: false,
        })
    }

    /// Run every case; results come back in the order they finish.
    fn run(&mut self, cases: &[Case]) -> Result<Vec<(usize, CaseResult)>> {
        let mut results = Vec::with_capacity(cases.len());
        let mut next = 0;
        while results.len() < cases.len() {
            // Give idle workers (starting them as needed) the next cases.
            while next < cases.len() {
                let idle = self.workers.iter().position(|w| w.busy.is_none());
                let i = match idle {
                    Some(i) => i,
                    None if self.workers.len() < self.jobs => {
                        let w = self.spawn()?;
                        self.workers.push(w);
                        self.workers.len() - 1
                    }
                    None => break,
                };
                let w = &mut self.workers[i];
                w.busy = Some((next, Instant::now()));
                // A worker that died already shows up as Closed below.
                let _ = writeln!(w.stdin, "{next}").and_then(|_| w.stdin.flush());
                next += 1;
            }
            match self.rx.recv_timeout(Duration::from_millis(500)) {
                Ok(Event::Line(serial, line)) => {
                    let Some(w) = self.workers.iter_mut().find(|w| w.serial == serial) else {
                        continue;
                    };
                    let Some((k, _)) = w.busy else {
                        eprintln!("{line}");
                        continue;
                    };
                    match parse_answer(&line, &cases[k].name) {
                        Some((j, r)) if j == k => {
                            w.busy = None;
                            results.push((k, r));
                        }
                        Some((j, _)) => bail!("a worker answered case {j} while running {k}"),
                        // Output of the case itself (a native module's prints): not ours.
                        None => eprintln!("{line}"),
                    }
                }
                Ok(Event::Closed(serial)) => {
                    let Some(i) = self.workers.iter().position(|w| w.serial == serial) else {
                        continue;
                    };
                    let mut w = self.workers.swap_remove(i);
                    drop(w.stdin);
                    let status = w.child.wait().context("waiting for a worker")?;
                    if let Some((k, t0)) = w.busy {
                        let why = if w.timed_out {
                            format!("timed out after {} s", self.timeout.as_secs())
                        } else {
                            died(status)
                        };
                        results.push((
                            k,
                            CaseResult {
                                name: cases[k].name.clone(),
                                outcome: Outcome::Crashed(why),
                                seconds: t0.elapsed().as_secs_f64(),
                            },
                        ));
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    for w in &mut self.workers {
                        if let Some((_, t0)) = w.busy {
                            if t0.elapsed() > self.timeout && !w.timed_out {
                                w.timed_out = true;
                                let _ = w.child.kill();
                            }
                        }
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => bail!("lost every worker"),
            }
        }
        // Closing stdin ends the workers.
        for w in self.workers.drain(..) {
            let Worker {
                mut child, stdin, ..
            } = w;
            drop(stdin);
            let _ = child.wait();
        }
        Ok(results)
    }
}

/// How a worker ended: `signal 11 (SIGSEGV)`, or its exit status.
fn died(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match status.signal() {
        Some(n) => {
            let name = match n {
                4 => " (SIGILL)",
                6 => " (SIGABRT)",
                7 => " (SIGBUS)",
                8 => " (SIGFPE)",
                9 => " (SIGKILL)",
                11 => " (SIGSEGV)",
                _ => "",
            };
            format!("signal {n}{name}")
        }
        None => match status.code() {
            Some(c) => format!("the process exited with status {c} in the case"),
            None => "the process ended in the case".into(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_round_trip() {
        let line = format!(
            "{ANSWER}{}",
            json!({"index": 3, "status": "failed", "message": "output 0 `y`: off\nby 1",
                   "max_abs": 0.0, "max_rel": 0.0, "seconds": 0.25})
        );
        let (k, r) = parse_answer(&line, "test_x").unwrap();
        assert_eq!(k, 3);
        assert_eq!(r.outcome, Outcome::Failed("output 0 `y`: off\nby 1".into()));
        assert!(parse_answer("hello", "test_x").is_none());
    }

    #[test]
    fn a_signal_is_named() {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(died(ExitStatus::from_raw(11)), "signal 11 (SIGSEGV)");
        assert_eq!(
            died(ExitStatus::from_raw(1 << 8)),
            "the process exited with status 1 in the case"
        );
    }
}
