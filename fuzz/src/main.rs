//! `ppcc-fuzz`: fuzz ppcc's readers for a bounded time from a fixed seed; exits non-zero if
//! a saved finding still fails or a new one is found.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use ppcc_fuzz::driver::{self, Budget, RunSettings, EXIT_FOUND};
use ppcc_fuzz::targets::{self, Env, Target};

#[derive(Parser)]
#[command(
    name = "ppcc-fuzz",
    about = "Fuzz ppcc's readers (ONNX, npz, plan.json, CSV and .pps schedules) from a fixed seed",
    after_help = "\
Replays every saved finding (FINDINGS/<target>/*) first, then mutates seeds (examples/,
a sample of $PPCC_ONNX_TESTDATA, plans compiled from examples/ with the ppcc binary) for the
time given, each target in supervised worker processes. A panic, a death by signal, an input
slower than --slow-seconds or a hang is saved under FINDINGS/<target>/ with a .txt (message,
seed, command to reproduce). Exit status: 0 if nothing fails, 1 otherwise.

Examples:
  ppcc-fuzz --seconds 120                       every default target, 120 s in all
  PPCC_FUZZ_SECONDS=3600 ppcc-fuzz              an hour
  ppcc-fuzz --targets onnx,npz --seed 7 --seconds 600
  ppcc-fuzz exec --target npz tests/fuzz-findings/npz/panic-0123456789abcdef.npz
  ppcc-fuzz --list"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    run: RunArgs,
    #[command(flatten)]
    env: EnvArgs,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run files through a target once each (to reproduce a finding).
    Exec {
        #[arg(long)]
        target: String,
        files: Vec<PathBuf>,
    },
    /// (internal) The worker loop the supervisor runs.
    #[command(hide = true)]
    Worker {
        #[arg(long)]
        target: String,
        #[arg(long)]
        seed: u64,
        #[arg(long)]
        seconds: f64,
        #[arg(long)]
        iterations: Option<u64>,
        #[arg(long)]
        current: PathBuf,
    },
}

#[derive(Args)]
struct RunArgs {
    /// Seconds of fuzzing in all, split over the targets by weight (replays not counted).
    #[arg(long, env = "PPCC_FUZZ_SECONDS", default_value_t = 120.0)]
    seconds: f64,
    /// The seed (printed; the same seed gives the same inputs in the same order).
    #[arg(long, env = "PPCC_FUZZ_SEED", default_value_t = 12)]
    seed: u64,
    /// Comma-separated targets (default: all but ppcc-eval-cpu); see --list.
    #[arg(long, value_delimiter = ',')]
    targets: Vec<String>,
    /// Stop each target's first worker after N mutated inputs (exactly reproducible runs).
    #[arg(long)]
    iterations: Option<u64>,
    /// List the targets and exit.
    #[arg(long)]
    list: bool,
    /// Address-space limit of each worker (and the ppcc it runs), MiB; 0: none.
    #[arg(long, default_value_t = 4096)]
    memory_limit_mb: u64,
}

/// Settings every process (supervisor, worker, exec) shares.
#[derive(Args, Clone)]
struct EnvArgs {
    /// Where findings are saved and replayed from.
    #[arg(long, global = true, default_value = "tests/fuzz-findings")]
    findings_dir: PathBuf,
    /// The repository root (examples/ are read from it). Default: this crate's parent.
    #[arg(long, global = true)]
    root: Option<PathBuf>,
    /// The ppcc binary. Default: `ppcc` beside this program.
    #[arg(long, global = true, env = "PPCC_BIN")]
    ppcc: Option<PathBuf>,
    /// A compiled plan folder to use as a seed (default: compile examples/ into scratch).
    #[arg(long = "plan-dir", global = true)]
    plan_dirs: Vec<PathBuf>,
    /// How many models of $PPCC_ONNX_TESTDATA to seed with.
    #[arg(long, global = true, default_value_t = 40)]
    onnx_sample: usize,
    /// An input slower than this is a finding.
    #[arg(long, global = true, default_value_t = 5.0)]
    slow_seconds: f64,
    /// A ppcc child running longer than this is killed and reported.
    #[arg(long, global = true, default_value_t = 20.0)]
    child_timeout: f64,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match real_main(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ppcc-fuzz: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn find_target(name: &str) -> Result<Box<dyn Target>> {
    targets::all()
        .into_iter()
        .find(|t| t.name() == name)
        .with_context(|| format!("no target `{name}` (see --list)"))
}

/// A fresh private scratch folder (unpredictable name, mode 0700).
fn scratch_dir() -> Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let base = std::env::temp_dir();
    for i in 0..100u64 {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let name = format!(
            "ppcc-fuzz-{:016x}",
            ppcc_fuzz::rng::mix(nanos ^ u64::from(std::process::id()) ^ i)
        );
        let dir = base.join(name);
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => bail!("cannot create a scratch folder in {}: {e}", base.display()),
        }
    }
    bail!("cannot create a scratch folder in {}", base.display())
}

struct Scratch(PathBuf);
impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn make_env(a: &EnvArgs, scratch: &std::path::Path) -> Result<Env> {
    let root = match &a.root {
        Some(r) => r.clone(),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".."),
    };
    let ppcc = a.ppcc.clone().or_else(|| {
        let p = std::env::current_exe().ok()?.with_file_name("ppcc");
        p.exists().then_some(p)
    });
    // External data that mutated models may point at.
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    std::fs::write(scratch.join(targets::onnx_external_file()), pattern)?;
    Ok(Env {
        root,
        scratch: scratch.to_path_buf(),
        ppcc,
        onnx_testdata: std::env::var_os("PPCC_ONNX_TESTDATA").map(PathBuf::from),
        onnx_sample: a.onnx_sample,
        plan_dirs: a.plan_dirs.clone(),
        child_timeout: Duration::from_secs_f64(a.child_timeout),
    })
}

/// Compile seed plans from examples/ with ppcc (interpreter target: fast, no MLIR).
fn compile_plans(env: &Env) -> Vec<PathBuf> {
    let Some(ppcc) = &env.ppcc else { return vec![] };
    let jobs: &[(&str, &[&str])] = &[
        ("mlp", &["--stages", "2", "--microbatches", "4"]),
        ("two_tower", &["--stages", "3", "--schedule", "zb-h1"]),
        ("gpt", &["--stages", "2", "--schedule", "gpipe"]),
        ("cnn", &["--stages", "2", "--schedule", "zb-v"]),
    ];
    let mut out = vec![];
    for (model, args) in jobs {
        let dir = env.scratch.join(format!("plan-{model}"));
        let status = std::process::Command::new(ppcc)
            .arg(env.root.join("examples").join(format!("{model}.onnx")))
            .arg("-o")
            .arg(&dir)
            .args(["--target", "interp"])
            .args(*args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
        if status.is_ok_and(|s| s.success()) && dir.join("plan.json").exists() {
            out.push(dir);
        } else {
            eprintln!("note: could not compile a seed plan from examples/{model}.onnx");
        }
    }
    out
}

fn real_main(cli: Cli) -> Result<ExitCode> {
    let scratch = Scratch(scratch_dir()?);
    let mut env = make_env(&cli.env, &scratch.0)?;
    let slow = Duration::from_secs_f64(cli.env.slow_seconds);
    match cli.cmd {
        Some(Cmd::Exec { target, files }) => {
            let t = find_target(&target)?;
            if t.needs_ppcc() && env.ppcc.is_none() {
                bail!("target {target} needs the ppcc binary (--ppcc)");
            }
            if env.plan_dirs.is_empty() && matches!(target.as_str(), "plan" | "ppcc-run") {
                env.plan_dirs = compile_plans(&env);
            }
            let found = driver::exec_files(t.as_ref(), &env, &files, slow)?;
            return Ok(if found {
                ExitCode::from(EXIT_FOUND as u8)
            } else {
                ExitCode::SUCCESS
            });
        }
        Some(Cmd::Worker {
            target,
            seed,
            seconds,
            iterations,
            current,
        }) => {
            let t = find_target(&target)?;
            let budget = Budget {
                deadline: Instant::now() + Duration::from_secs_f64(seconds.max(0.0)),
                iterations,
            };
            let found = driver::worker(
                t.as_ref(),
                &env,
                seed,
                budget,
                &current,
                &cli.env.findings_dir,
                slow,
            )?;
            return Ok(if found {
                ExitCode::from(EXIT_FOUND as u8)
            } else {
                ExitCode::SUCCESS
            });
        }
        None => {}
    }
    let a = cli.run;
    let all = targets::all();
    if a.list {
        for t in &all {
            println!(
                "{:<14} {}{}",
                t.name(),
                t.describe(),
                if t.weight() == 0 {
                    " [not default]"
                } else {
                    ""
                }
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    let chosen: Vec<&dyn Target> = if a.targets.is_empty() {
        all.iter()
            .filter(|t| t.weight() > 0)
            .map(|t| t.as_ref())
            .collect()
    } else {
        let mut v = vec![];
        for name in &a.targets {
            v.push(
                all.iter()
                    .find(|t| t.name() == name)
                    .map(|t| t.as_ref())
                    .with_context(|| format!("no target `{name}` (see --list)"))?,
            );
        }
        v
    };
    if chosen.iter().any(|t| t.needs_ppcc()) && env.ppcc.is_none() {
        bail!("the ppcc-* targets need the ppcc binary: build it (cargo build -p ppcc) or pass --ppcc");
    }
    if env.plan_dirs.is_empty() {
        env.plan_dirs = compile_plans(&env);
    }
    let mut env_args = vec![
        "--findings-dir".into(),
        cli.env.findings_dir.display().to_string(),
        "--root".into(),
        env.root.display().to_string(),
        "--onnx-sample".into(),
        cli.env.onnx_sample.to_string(),
        "--slow-seconds".into(),
        cli.env.slow_seconds.to_string(),
        "--child-timeout".into(),
        cli.env.child_timeout.to_string(),
    ];
    if let Some(p) = &env.ppcc {
        env_args.extend(["--ppcc".into(), p.display().to_string()]);
    }
    for d in &env.plan_dirs {
        env_args.extend(["--plan-dir".into(), d.display().to_string()]);
    }
    let settings = RunSettings {
        exe: std::env::current_exe()?,
        env_args,
        findings: cli.env.findings_dir.clone(),
        seed: a.seed,
        slow,
        hang: slow.max(Duration::from_secs_f64(cli.env.child_timeout)) + Duration::from_secs(10),
        memory_limit: (a.memory_limit_mb > 0).then_some(a.memory_limit_mb << 20),
        iterations: a.iterations,
        scratch: scratch.0.clone(),
    };
    let total_weight: u32 = chosen.iter().map(|t| t.weight().max(1)).sum();
    println!(
        "ppcc-fuzz: seed {} ({} s over {} targets; PPCC_FUZZ_SEED/PPCC_FUZZ_SECONDS or --seed/--seconds to change)",
        a.seed,
        a.seconds,
        chosen.len()
    );
    let mut failures = vec![];
    for t in chosen {
        let seconds = a.seconds * f64::from(t.weight().max(1)) / f64::from(total_weight);
        let r = driver::run_target(t, &settings, seconds);
        println!(
            "{:<14} replayed {} saved finding(s), {} still failing; {} new; {}",
            t.name(),
            r.replayed,
            r.still_failing.len(),
            r.new_findings,
            r.stats.join("; ")
        );
        for f in &r.still_failing {
            println!("  still failing: {f}");
        }
        for e in &r.errors {
            println!("  error: {e}");
        }
        if !r.still_failing.is_empty() || r.new_findings > 0 || !r.errors.is_empty() {
            failures.push(t.name());
        }
    }
    if failures.is_empty() {
        println!("ppcc-fuzz: no findings");
        Ok(ExitCode::SUCCESS)
    } else {
        println!(
            "ppcc-fuzz: findings or failures in {} (inputs under {}/)",
            failures.join(", "),
            cli.env.findings_dir.display()
        );
        Ok(ExitCode::from(1))
    }
}
