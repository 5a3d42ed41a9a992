//! The run pipeline (`ppcc run DIR`): train a compiled plan, every device a worker running
//! its schedule.
//!
//! Load and check `DIR/plan.json` ([`ppcc_plan::Plan`] through
//! [`ppcc_runtime::pipeline::PlanSpec`]) and its schedule, bind the data, build one worker
//! per device (native modules or the interpreter, weights from the plan or a checkpoint),
//! run the steps, write checkpoints, the trace and the trained model. Each step's loss and
//! every remark are reported as [`RunEvent`]s; the caller prints them.

use crate::target::Target;
use ppcc_runtime::native::{NativeModule, NativeStage};
use ppcc_runtime::pipeline::StageExecutable;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{bail, invalid, Context, Result};
use ppcc_runtime::data::{index_limits_of, with_batch, IndexLimit};
use ppcc_runtime::npz::{read_npz, read_npz_bytes, write_npz};
use ppcc_runtime::pipeline::{
    run_local, step_loss, Fault, InterpretedStage, PlanSpec, RankReport, RankWorker, RunConfig,
    StageWorker, Timed,
};
use ppcc_runtime::transport::local::LocalNet;
use ppcc_runtime::{BatchSource, Distribution, InputSpec, SyntheticSource};
use ppir::{Module, Tensor, TensorType};

use crate::data::npz_source;

mod nccl;

/// How devices talk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Transport {
    /// Every device a thread of this process (no setup).
    Local,
    /// One process per device: `mpirun -np P ppcc run DIR --transport mpi`.
    Mpi,
}

/// What to run and how (the options of `ppcc run DIR`).
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// The directory `ppcc MODEL.onnx -o DIR` wrote.
    pub dir: PathBuf,
    pub steps: u64,
    /// `synthetic`, `synthetic-fresh` or an `.npz` file.
    pub data: String,
    /// Seed of synthetic data.
    pub seed: u64,
    pub transport: Transport,
    /// Send/recv payloads between GPUs over NCCL (CUDA plans).
    pub nccl: bool,
    /// Test hook: the framing of `nccl` over an in-memory link (threads only).
    pub test_link: bool,
    /// Write a Chrome/Perfetto trace of what ran.
    pub trace: Option<PathBuf>,
    pub checkpoint_dir: Option<PathBuf>,
    pub checkpoint_every: Option<u64>,
    /// Keep only the N most recent checkpoints.
    pub keep_checkpoints: Option<u64>,
    /// Continue from the latest checkpoint in this directory.
    pub resume: Option<PathBuf>,
    pub allow_nonfinite_loss: bool,
    /// After training, write the model with the trained initializers.
    pub save_onnx: Option<PathBuf>,
    /// After training, write the trained parameters as `.npz`, keyed by the model's names
    /// for them (`arg<i>` for StableHLO, initializer names for ONNX).
    pub save_params: Option<PathBuf>,
    /// Longest a device waits for a tensor from another (seconds, > 0).
    pub recv_timeout: f64,
    /// `None`: native code when the plan has it.
    pub target: Option<Target>,
    /// Test hook: `S:K` (stage S panics at step K) or `S:K:stall=T`.
    pub inject_fault: Option<String>,
}

impl RunOptions {
    /// The command line's defaults for `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        RunOptions {
            dir: dir.into(),
            steps: 10,
            data: "synthetic".into(),
            seed: 0,
            transport: Transport::Local,
            nccl: false,
            test_link: false,
            trace: None,
            checkpoint_dir: None,
            checkpoint_every: None,
            keep_checkpoints: None,
            resume: None,
            allow_nonfinite_loss: false,
            save_onnx: None,
            save_params: None,
            recv_timeout: 120.0,
            target: None,
            inject_fault: None,
        }
    }
}

/// What a run reports while it works.
#[derive(Clone, Debug, PartialEq)]
pub enum RunEvent {
    /// The steps are about to start; `progress`: this process should show their progress
    /// (the leader of a local run).
    Started { steps: u64, progress: bool },
    /// Step `step` ended with `loss` (on the process that has the loss stage).
    Step { step: u64, loss: f64 },
    /// A line for the user (standard error): resuming, what runs, measured against
    /// predicted, files written.
    Note(String),
}

/// Stage weights as loaded from / saved to npz.
type Weights = BTreeMap<String, Tensor>;

fn load_module(plan: &PlanSpec, s: usize) -> Result<Module> {
    // Every file is checked against the size and hash plan.json records before use.
    let path = plan.stages[s].dir.join("stage.ppir");
    let text = String::from_utf8(plan.read_file(&path)?)
        .with_context(|| format!("{} is not UTF-8 text", path.display()))?;
    ppir::text::parse_module(&text).map_err(|e| invalid!("{}:{e}", path.display()))
}

fn load_stage(plan: &PlanSpec, s: usize) -> Result<(Module, Weights)> {
    let module = load_module(plan, s)?;
    let params = plan.stages[s].dir.join("params.npz");
    let bytes = plan.read_file(&params)?;
    let weights: Weights = read_npz_bytes(&bytes, &params)?.into_iter().collect();
    Ok((module, weights))
}

/// What the integer data inputs of every stage index (token ids, class labels), so the
/// data can be checked before anything runs ([`ppcc_runtime::data::index_limits`]).
fn data_limits(plan: &PlanSpec) -> Result<HashMap<String, IndexLimit>> {
    let modules = (0..plan.stages.len())
        .map(|s| load_module(plan, s))
        .collect::<Result<Vec<_>>>()?;
    Ok(index_limits_of(modules.iter().flat_map(|m| &m.functions)))
}

/// Check `plan.json`'s schedule with the compiler's validator before anything runs, so a
/// dropped or misplaced action fails at once with the validator's message instead of a
/// device waiting out its receive timeout.
fn validate_schedule(plan: &PlanSpec) -> Result<()> {
    use ppcc_passes::schedule::{validate, Action, Layout, Schedule};
    use ppcc_plan::LayoutDoc;
    let ranks = plan.devices;
    let bad = |what: &str| invalid!("plan.json: `schedule.layout` {what}");
    let layout = match &plan.doc.schedule.layout {
        LayoutDoc::Dag { rank_of, edges } => {
            for &[a, b] in edges {
                if a >= rank_of.len() || b >= rank_of.len() {
                    return Err(bad(&format!(
                        "has an edge {a} -> {b} between stages the plan does not have"
                    )));
                }
            }
            Layout::Dag {
                ranks,
                rank_of: rank_of.clone(),
                edges: edges.iter().map(|&[a, b]| (a, b)).collect(),
            }
        }
        LayoutDoc::Interleaved { chunks } => Layout::Interleaved {
            ranks,
            chunks: *chunks,
        },
        LayoutDoc::V => Layout::VShape { ranks },
    };
    if layout.num_virtual_stages() != plan.stages.len() {
        return Err(bad(&format!(
            "has {} stages, the plan {}",
            layout.num_virtual_stages(),
            plan.stages.len()
        )));
    }
    for st in &plan.stages {
        let r = layout.rank_of(st.stage as usize);
        if r != st.device {
            return Err(bad(&format!(
                "puts stage {} on device {r}, `stages` on device {}",
                st.stage, st.device
            )));
        }
    }
    let mut schedule = Schedule::empty(layout, plan.microbatches);
    schedule.per_rank = plan
        .actions
        .iter()
        .map(|row| {
            row.iter()
                .map(|a| {
                    let chunk = schedule.layout.chunk_of(a.stage);
                    Action::new(a.kind, a.stage, a.micro_batch, chunk)
                })
                .collect()
        })
        .collect();
    validate(&schedule).context("plan.json: the schedule is not valid")
}

fn data_source(
    a: &RunOptions,
    plan: &PlanSpec,
    specs: &[(String, TensorType, Option<Distribution>)],
    limits: &HashMap<String, IndexLimit>,
) -> Result<Box<dyn BatchSource>> {
    let global = plan.global_batch;
    Ok(match a.data.as_str() {
        "synthetic" | "synthetic-fresh" => {
            let mut list = vec![];
            for (name, ty, dist) in specs {
                let dist = dist.with_context(|| {
                    format!(
                        "the plan does not say how to draw synthetic `{name}`; use --data FILE.npz"
                    )
                })?;
                list.push(InputSpec {
                    name: name.clone(),
                    ty: with_batch(ty, global),
                    dist,
                });
            }
            let source = SyntheticSource::new(list, a.seed, a.data == "synthetic")?;
            source
                .check_indices(limits)
                .context("plan.json's synthetic data")?;
            Box::new(source)
        }
        path => {
            let arrays = read_npz(Path::new(path))?;
            let wanted: Vec<(String, TensorType)> = specs
                .iter()
                .map(|(n, ty, _)| (n.clone(), with_batch(ty, global)))
                .collect();
            let onnx: HashMap<String, String> = plan
                .inputs
                .iter()
                .filter_map(|i| Some((i.name.clone(), i.onnx_name.clone()?)))
                .collect();
            let source = npz_source(path, arrays, &wanted, &onnx, global as usize)?;
            source.check_indices(limits).context(path.to_string())?;
            Box::new(source)
        }
    })
}

/// The data inputs with their synthetic distributions, from plan.json.
fn input_specs(plan: &PlanSpec) -> Vec<(String, TensorType, Option<Distribution>)> {
    plan.inputs
        .iter()
        .map(|i| (i.name.clone(), i.ty.clone(), Some(i.synthetic)))
        .collect()
}

/// The step of a checkpoint directory's name: `step-<k>`, or `step-<k>.<n>` (a checkpoint
/// that replaced another of the same step).
fn checkpoint_step(name: &str) -> Option<u64> {
    let rest = name.strip_prefix("step-")?;
    let (step, copy) = match rest.split_once('.') {
        Some((s, n)) => (s, Some(n)),
        None => (rest, None),
    };
    let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    if !digits(step) || copy.is_some_and(|n| !digits(n)) {
        return None;
    }
    step.parse().ok()
}

/// The checkpoint `d/latest` names: `<k>` (the directory `d/step-<k>`) or `<k> <name>`
/// (the directory `d/<name>`, a checkpoint that replaced another of step k).
fn checkpoint_latest(d: &Path) -> Result<(u64, PathBuf)> {
    let latest = d.join("latest");
    let text = std::fs::read_to_string(&latest).with_context(|| {
        format!(
            "{} has no checkpoint (no {})",
            d.display(),
            latest.display()
        )
    })?;
    let mut words = text.split_whitespace();
    let step: u64 = words
        .next()
        .and_then(|w| w.parse().ok())
        .with_context(|| format!("{}: not a step number", latest.display()))?;
    let name = match words.next() {
        None => format!("step-{step}"),
        Some(n) if checkpoint_step(n) == Some(step) && words.next().is_none() => n.to_string(),
        Some(_) => bail!(
            "{}: expected `<step>` or `<step> step-<step>.<n>`, got {:?}",
            latest.display(),
            text.trim()
        ),
    };
    let dir = d.join(name);
    if !dir.is_dir() {
        bail!(
            "{} names step {step}, but {} does not exist",
            latest.display(),
            dir.display()
        );
    }
    Ok((step, dir))
}

/// Where the stage files of the checkpoint of step `step` are written before it is
/// committed (the same for every process).
fn checkpoint_tmp(d: &Path, step: u64) -> PathBuf {
    d.join(format!(".step-{step}.tmp"))
}

/// The stage file of stage `s` in `replica`: `stage<s>.npz` (replica 0, whose weights
/// every replica shares), `stage<s>.replica<r>.npz` (another replica's own optimizer
/// state shards, with `--zero 1`).
fn stage_file(s: u32, replica: usize) -> String {
    match replica {
        0 => format!("stage{s}.npz"),
        r => format!("stage{s}.replica{r}.npz"),
    }
}

/// Write `stages`' weights as `dir/stage<i>.npz` (see [`stage_file`]).
fn write_stage_files(dir: &Path, stages: &[(u32, usize, &Weights)]) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    for (s, r, w) in stages {
        let arrays: Vec<(String, Tensor)> = w.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        write_npz(&dir.join(stage_file(*s, *r)), &arrays)?;
    }
    Ok(())
}

/// The checkpoint directories in `d`: (step, name), oldest step first.
fn checkpoint_dirs(d: &Path) -> Result<Vec<(u64, String)>> {
    let mut out = vec![];
    for e in std::fs::read_dir(d).with_context(|| format!("cannot list {}", d.display()))? {
        let e = e.with_context(|| format!("cannot list {}", d.display()))?;
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(k) = checkpoint_step(&name) {
            if e.path().is_dir() {
                out.push((k, name));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Move the written checkpoint `tmp` into `d` and point `d/latest` at it, both by rename,
/// so a crash never leaves a half checkpoint behind `latest`. A checkpoint of the same step
/// already there (a reused directory) is not touched until `latest` names the new one:
/// the new one goes to a free name (`step-<k>`, else `step-<k>.<n>`), then `latest`
/// switches, then the old one is removed. With `keep`, all but the `keep` most recent
/// checkpoints (`latest` and those of the steps before it) are removed last.
fn commit_checkpoint(d: &Path, step: u64, tmp: &Path, keep: Option<u64>) -> Result<()> {
    let step_file = tmp.join("step");
    std::fs::write(&step_file, format!("{step}\n"))
        .with_context(|| format!("cannot write {}", step_file.display()))?;
    let name = (0u64..)
        .map(|n| match n {
            0 => format!("step-{step}"),
            n => format!("step-{step}.{n}"),
        })
        .find(|n| !d.join(n).exists())
        .context("no free checkpoint name")?;
    let fin = d.join(&name);
    std::fs::rename(tmp, &fin)
        .with_context(|| format!("cannot move the checkpoint into {}", fin.display()))?;
    let latest_tmp = d.join(format!(".latest.tmp-{}", std::process::id()));
    let text = if name == format!("step-{step}") {
        format!("{step}\n")
    } else {
        format!("{step} {name}\n")
    };
    std::fs::write(&latest_tmp, text)
        .with_context(|| format!("cannot write {}", latest_tmp.display()))?;
    let latest = d.join("latest");
    std::fs::rename(&latest_tmp, &latest)
        .with_context(|| format!("cannot replace {}", latest.display()))?;
    // `latest` names the new checkpoint: older ones of the same step can go.
    let all = checkpoint_dirs(d)?;
    let mut remove: Vec<&String> = all
        .iter()
        .filter(|(k, n)| *k == step && *n != name)
        .map(|(_, n)| n)
        .collect();
    if let Some(keep) = keep {
        // The most recent: `latest`, then the steps before it, newest first; anything of a
        // later step (left by an earlier run in this directory) is not part of this run.
        let older: Vec<&String> = all
            .iter()
            .rev()
            .filter(|(k, _)| *k < step)
            .map(|(_, n)| n)
            .collect();
        let kept = usize::try_from(keep.saturating_sub(1)).unwrap_or(usize::MAX);
        remove.extend(older.into_iter().skip(kept));
        remove.extend(all.iter().filter(|(k, _)| *k > step).map(|(_, n)| n));
    }
    for n in remove {
        let p = d.join(n);
        std::fs::remove_dir_all(&p)
            .with_context(|| format!("cannot remove the old checkpoint {}", p.display()))?;
    }
    remove_stale_partials(d, step);
    Ok(())
}

/// Half-written checkpoints (`.step-<k>.tmp`, k ≤ `step`) and `latest` files
/// (`.latest.tmp-<pid>`) left by a run that was killed while writing: every process of
/// this run has passed the barrier before the commit, so none of them is still in use.
/// Best effort: a leftover that cannot be removed is harmless.
fn remove_stale_partials(d: &Path, step: u64) {
    let Ok(entries) = std::fs::read_dir(d) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let partial_step = name
            .strip_prefix(".step-")
            .and_then(|r| r.strip_suffix(".tmp"))
            .and_then(|k| k.parse::<u64>().ok());
        match partial_step {
            Some(k) if k <= step => {
                let _ = std::fs::remove_dir_all(e.path());
            }
            Some(_) => {}
            None if name.starts_with(".latest.tmp-") => {
                let _ = std::fs::remove_file(e.path());
            }
            None => {}
        }
    }
}

fn fmt_time(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.3} s")
    } else if s >= 1e-3 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{:.1} us", s * 1e6)
    }
}

/// `PPCC_GPU_PROFILE`'s table for one GPU: its kernels by the time waited for them, the
/// 20 slowest, with launches and the mean per launch.
fn kernel_profile(g: &ppcc_runtime::pipeline::GpuMemory) -> String {
    let k = &g.stats.kernels;
    let total: f64 = k.iter().map(|t| t.seconds).sum();
    let mut out = format!(
        "GPU {}: {} kernels, {} launches, {:.3} s waited for (PPCC_GPU_PROFILE; the 20 slowest):",
        g.device,
        k.len(),
        k.iter().map(|t| t.launches).sum::<u64>(),
        total
    );
    for t in k.iter().take(20) {
        out.push_str(&format!(
            "\n  {:>9.3} ms {:>5.1}% {:>8} launches {:>9.1} us each  {}",
            t.seconds * 1e3,
            100.0 * t.seconds / total.max(1e-12),
            t.launches,
            t.seconds * 1e6 / t.launches.max(1) as f64,
            t.name
        ));
    }
    out
}

/// The process's peak resident set (`VmHWM` in /proc/self/status), where the system says.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The most bytes of temporaries the plan predicts for one call of a function of device
/// `r`'s stages (`None` for a plan without the figure).
fn predicted_temporaries(plan: &PlanSpec, r: usize) -> Option<f64> {
    plan.doc
        .stages
        .iter()
        .filter(|s| s.device == r)
        .map(|s| s.temporary_bytes)
        .try_fold(0.0f64, |a, t| t.map(|t| a.max(t)))
}

fn mib(b: f64) -> String {
    format!("{:.2} MiB", b / (1u64 << 20) as f64)
}

/// How the steps are driven: every device as a thread here, or this process's device
/// under MPI.
enum Driver {
    Local(LocalNet),
    #[cfg(feature = "mpi")]
    Mpi(Box<ppcc_runtime::transport::mpi::MpiTransport>),
}

impl Driver {
    /// The devices this process runs.
    fn ranks(&self, devices: usize) -> Vec<usize> {
        match self {
            Driver::Local(_) => (0..devices).collect(),
            #[cfg(feature = "mpi")]
            Driver::Mpi(t) => vec![ppcc_runtime::transport::Transport::rank(t.as_ref())],
        }
    }

    /// This process prints the summary and writes the shared files.
    fn leader(&self) -> bool {
        match self {
            Driver::Local(_) => true,
            #[cfg(feature = "mpi")]
            Driver::Mpi(t) => ppcc_runtime::transport::Transport::rank(t.as_ref()) == 0,
        }
    }

    fn step(
        &mut self,
        workers: &mut Vec<RankWorker>,
        k: u64,
        batch: ppcc_runtime::Batch,
    ) -> Result<Vec<RankReport>> {
        match self {
            Driver::Local(net) => run_local(workers, net, k, std::sync::Arc::new(batch))
                .map_err(|e| invalid!("device {} failed: {e}", e.rank)),
            #[cfg(feature = "mpi")]
            Driver::Mpi(t) => {
                let Some(w) = workers.first_mut() else {
                    bail!("this process runs no device");
                };
                let rank = w.rank;
                // A panic is this device's failure: report it and end the job, as the
                // threads do.
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    w.step(k, &batch, t.as_mut())
                }))
                .unwrap_or_else(|p| {
                    Err(ppcc_runtime::pipeline::WorkerError {
                        rank,
                        stage: w.stages.first().map(|s| s.spec.stage),
                        step: k,
                        micro_batch: None,
                        function: None,
                        error: Box::new(ppcc_runtime::pipeline::PipelineError::Panicked {
                            rank,
                            message: ppcc_runtime::pipeline::panic_message(&*p),
                        }),
                        abandoned: vec![],
                    })
                });
                match r {
                    Ok(r) => Ok(vec![r]),
                    Err(e) => {
                        let msg = format!("device {} failed: {e}", e.rank);
                        ppcc_runtime::transport::Transport::abort(t.as_mut(), &msg);
                        bail!("{msg}")
                    }
                }
            }
        }
    }

    /// End every process of the run (under MPI; threads stop with this one).
    fn abort(&mut self, _reason: &str) {
        match self {
            Driver::Local(_) => {}
            #[cfg(feature = "mpi")]
            Driver::Mpi(t) => ppcc_runtime::transport::Transport::abort(t.as_mut(), _reason),
        }
    }

    fn barrier(&mut self) -> Result<()> {
        match self {
            Driver::Local(_) => Ok(()),
            #[cfg(feature = "mpi")]
            Driver::Mpi(t) => Ok(ppcc_runtime::transport::Transport::barrier(t.as_mut())?),
        }
    }

    fn finish(self) -> Result<()> {
        match self {
            Driver::Local(_) => Ok(()),
            #[cfg(feature = "mpi")]
            Driver::Mpi(t) => Ok(t.finish()?),
        }
    }
}

/// Seconds from an option, refused unless finite, > 0 and at most a billion (what a
/// `Duration` holds, with room).
fn seconds(option: &str, v: f64) -> Result<Duration> {
    if !(v.is_finite() && v > 0.0 && v <= 1e9) {
        bail!("{option} must be a number of seconds above 0 and at most 1e9, got {v:?}");
    }
    Ok(Duration::from_secs_f64(v))
}

fn parse_fault(f: &str) -> Result<Fault> {
    let parts: Vec<&str> = f.split(':').collect();
    let (Some(s), Some(k)) = (parts.first(), parts.get(1)) else {
        bail!("--inject-fault takes S:K, S:K:stall=T, S:K:replica=R or S:K:stall=T:replica=R");
    };
    let mut stall = None;
    let mut replica = 0;
    for x in &parts[2..] {
        if let Some(t) = x.strip_prefix("stall=") {
            let t: f64 = t
                .parse()
                .context("--inject-fault S:K:stall=T: T is a number of seconds")?;
            stall = Some(seconds("--inject-fault's stall", t)?);
        } else if let Some(r) = x.strip_prefix("replica=") {
            replica = r
                .parse()
                .context("--inject-fault S:K:replica=R: R is a replica number")?;
        } else {
            bail!("--inject-fault: `{x}` is neither stall=T nor replica=R");
        }
    }
    Ok(Fault {
        stage: s
            .parse()
            .context("--inject-fault S:K: S is a stage number")?,
        step: k
            .parse()
            .context("--inject-fault S:K: K is a step number")?,
        stall,
        replica,
    })
}

/// The workers of `ranks`, with weights from the plan (or the checkpoint `resume`); `mpi`:
/// this process is one of an MPI job's.
fn build_workers(
    plan: &PlanSpec,
    ranks: &[usize],
    config: &RunConfig,
    resume: Option<&Path>,
    target: Target,
    mpi: bool,
) -> Result<Vec<RankWorker>> {
    // Worker `rank` runs device `rank % devices` of replica `rank / devices`.
    let devices = plan.devices.max(1);
    let mut workers: Vec<RankWorker> = vec![];
    for &rank in ranks {
        let actions = plan
            .actions
            .get(rank % devices)
            .with_context(|| format!("the plan has no actions for device {}", rank % devices))?;
        workers.push(RankWorker {
            rank,
            stages: vec![],
            actions: actions.clone(),
            config: RunConfig {
                replica: rank / devices,
                ..config.clone()
            },
            link: None,
        });
    }
    for (wi, &rank) in ranks.iter().enumerate() {
        // A CUDA plan: each device's stages on one GPU, the device's own (under mpirun, the
        // process's rank on its node).
        let gpu = if mpi { local_gpu_rank() } else { None }.unwrap_or(rank);
        for s in 0..plan.stages.len() {
            if plan.stages[s].device != rank % devices {
                continue;
            }
            let spec = plan.stages[s].clone();
            let (module, mut weights) = load_stage(plan, s)?;
            if let Some(dir) = resume {
                // With ZeRO-1 each replica resumes its own optimizer state shards.
                let replica = if plan.collectives.iter().any(|c| c.reduce_scatter) {
                    rank / devices
                } else {
                    0
                };
                let p = dir.join(stage_file(s as u32, replica));
                let saved: Weights = read_npz(&p)?.into_iter().collect();
                check_checkpoint(&p, s, &weights, &saved)?;
                weights = saved;
            }
            let exec: Box<dyn StageExecutable> = match target {
                Target::Interp => Box::new(InterpretedStage::new(module, Default::default())),
                Target::Cpu | Target::Cuda => {
                    let so = spec.dir.join("module.so");
                    if !so.exists() {
                        bail!(
                        "{} does not exist: the plan was compiled with --target {} (compile again with --target cpu, or run with --target interp)",
                        so.display(),
                        plan.target
                    );
                    }
                    let bytes = plan.read_file(&so).with_context(|| format!("stage {s}"))?;
                    let native = ppcc_runtime::gpu::on_device(gpu, || {
                        NativeModule::load_verified(&so, &bytes, &module, None)
                    })
                    .with_context(|| format!("stage {s}"))?;
                    Box::new(NativeStage::new(module, native))
                }
            };
            let worker = StageWorker::new(spec, exec, weights).map_err(|e| invalid!("{e}"))?;
            workers[wi].stages.push(worker);
        }
    }
    Ok(workers)
}

/// This process's rank among the processes on its node, where the MPI launcher says
/// (Open MPI, MPICH/Hydra, MVAPICH, Slurm).
fn local_gpu_rank() -> Option<usize> {
    [
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "MPI_LOCALRANKID",
        "MV2_COMM_WORLD_LOCAL_RANK",
        "SLURM_LOCALID",
    ]
    .iter()
    .find_map(|v| std::env::var(v).ok()?.parse().ok())
}

/// A checkpoint's stage file must hold exactly the stage's weights and optimizer state,
/// each of the plan's shape and type: one that lacks some would resume with fresh
/// optimizer state (and the training would silently diverge from the interrupted run).
fn check_checkpoint(path: &Path, stage: usize, plan: &Weights, saved: &Weights) -> Result<()> {
    let names = |v: Vec<&String>| {
        v.iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let missing: Vec<&String> = plan.keys().filter(|k| !saved.contains_key(*k)).collect();
    if !missing.is_empty() {
        bail!(
            "{}: the checkpoint lacks {} of stage {stage} (weights or optimizer state of this plan); it was not written for this plan, or is damaged",
            path.display(),
            names(missing)
        );
    }
    let extra: Vec<&String> = saved.keys().filter(|k| !plan.contains_key(*k)).collect();
    if !extra.is_empty() {
        bail!(
            "{}: {} {} not a weight of stage {stage} of this plan",
            path.display(),
            names(extra.clone()),
            if extra.len() > 1 { "are" } else { "is" }
        );
    }
    for (k, want) in plan {
        let got = &saved[k];
        if got.shape != want.shape || got.dtype != want.dtype {
            bail!(
                "{}: `{k}` of stage {stage} is {} {:?} in the checkpoint, {} {:?} in the plan",
                path.display(),
                got.dtype,
                got.shape,
                want.dtype,
                want.shape
            );
        }
    }
    Ok(())
}

/// Stage weights of `workers` as (stage, replica, weights): from replica 0 (the replicas
/// hold the same weights), and with `sharded` (ZeRO-1: each replica holds its own shard of
/// the optimizer state) from every replica.
fn stage_weights(workers: &[RankWorker], sharded: bool) -> Vec<(u32, usize, &Weights)> {
    workers
        .iter()
        .filter(|w| sharded || w.config.replica == 0)
        .flat_map(|w| {
            w.stages
                .iter()
                .map(|s| (s.spec.stage, w.config.replica, &s.weights))
        })
        .collect()
}

/// Train the build directory `a.dir`; every loss and remark goes to `events`.
pub fn run(a: &RunOptions, events: &mut dyn FnMut(RunEvent)) -> Result<()> {
    if a.checkpoint_every.is_some() != a.checkpoint_dir.is_some() {
        bail!("--checkpoint-every K and --checkpoint-dir D go together");
    }
    if a.checkpoint_every == Some(0) {
        bail!("--checkpoint-every must be at least 1");
    }
    if a.keep_checkpoints == Some(0) {
        bail!("--keep-checkpoints must be at least 1 (it keeps the newest N)");
    }
    let recv_timeout = seconds("--recv-timeout", a.recv_timeout)?;
    let fault = a.inject_fault.as_deref().map(parse_fault).transpose()?;
    let plan = PlanSpec::load(&a.dir)?;
    if a.save_onnx.is_some()
        && crate::model::format_of(Path::new(&plan.model)) == crate::model::Format::StableHlo
    {
        bail!(
            "--save-onnx writes an ONNX model's trained weights back; {} was compiled from a StableHLO module: write the trained parameters with --save-params OUT.npz (keyed arg<i>, as --params reads them and as @main takes them)",
            a.dir.display()
        );
    }
    validate_schedule(&plan)?;
    let specs = input_specs(&plan);
    let limits = data_limits(&plan)?;
    let mut source = data_source(a, &plan, &specs, &limits)?;
    let (start_step, resume_dir) = match &a.resume {
        Some(d) => {
            let (k, dir) = checkpoint_latest(d)?;
            (k, Some(dir))
        }
        None => (0, None),
    };
    let config = RunConfig {
        microbatches: plan.microbatches,
        micro_rows: plan.micro_batch as usize,
        rank_of: plan.stages.iter().map(|s| s.device).collect(),
        recv_timeout,
        channel_values: plan.channel_values.clone(),
        fault,
        collectives: plan.collectives.clone(),
        replica: 0,
        replicas: plan.replicas,
        devices: plan.devices,
    };
    // Every device of every replica.
    let workers_total = plan.devices * plan.replicas;
    let mut driver = match a.transport {
        Transport::Local => Driver::Local(LocalNet::new(workers_total)),
        #[cfg(feature = "mpi")]
        Transport::Mpi => {
            let t = ppcc_runtime::transport::mpi::MpiTransport::init()?;
            let size = ppcc_runtime::transport::Transport::size(&t);
            if size != workers_total {
                let msg = if plan.replicas > 1 {
                    format!(
                        "the plan has {} replicas of {} devices ({workers_total} workers) but mpirun started {size} processes: run mpirun -np {workers_total}",
                        plan.replicas, plan.devices
                    )
                } else {
                    format!(
                        "the plan has {} devices but mpirun started {size} processes: run mpirun -np {}",
                        plan.devices, plan.devices
                    )
                };
                let mut t = t;
                ppcc_runtime::transport::Transport::abort(&mut t, &msg);
                bail!("{msg}");
            }
            Driver::Mpi(Box::new(t))
        }
        #[cfg(not(feature = "mpi"))]
        Transport::Mpi => {
            bail!("this ppcc was built without MPI (cargo feature `mpi`); use --transport local")
        }
    };
    let ranks = driver.ranks(workers_total);
    let target = match a.target {
        Some(t) => t,
        None if plan.target == "cpu" => Target::Cpu,
        None if plan.target == "cuda" => Target::Cuda,
        None => Target::Interp,
    };
    if a.nccl && target != Target::Cuda {
        bail!(
            "--nccl moves tensors between GPUs: it needs a plan compiled with --target cuda (this one runs as {})",
            target.name()
        );
    }
    let mut workers = build_workers(
        &plan,
        &ranks,
        &config,
        resume_dir.as_deref(),
        target,
        a.transport == Transport::Mpi,
    )?;
    // A plan whose matrix products are cuBLAS's needs the library before the first step.
    let cublas = match (target, plan.doc.gpu_gemm.as_deref()) {
        (Target::Cuda, Some("cublas")) => {
            Some(ppcc_runtime::gpu::cublas_version().map_err(|e| invalid!("{e}"))?)
        }
        _ => None,
    };
    if a.nccl {
        nccl::connect(&plan, &mut driver, &mut workers, recv_timeout)?;
    } else if a.test_link {
        if a.transport != Transport::Local {
            bail!("--test-link runs with --transport local only");
        }
        nccl::memory_links(&plan, &mut workers)?;
    }
    // ZeRO-1: every replica's optimizer state shards go into checkpoints.
    let sharded = plan.collectives.iter().any(|c| c.reduce_scatter);
    let leader = driver.leader();
    if leader {
        if let Some(d) = &resume_dir {
            events(RunEvent::Note(format!(
                "resuming from {} at step {start_step}",
                d.display()
            )));
        }
        events(RunEvent::Note(format!(
            "running {}: {} stages on {} devices{}, schedule {}, {} micro-batches of {} rows{}, transport {}{}",
            a.dir.display(),
            plan.stages.len(),
            plan.devices,
            if plan.replicas > 1 {
                format!(" × {} data-parallel replicas", plan.replicas)
            } else {
                String::new()
            },
            plan.schedule,
            plan.microbatches,
            plan.micro_batch,
            if plan.replicas > 1 { " per replica" } else { "" },
            match a.transport {
                Transport::Local => "local",
                Transport::Mpi => "mpi",
            },
            if a.nccl {
                ", tensors over NCCL"
            } else if a.test_link {
                ", tensors framed over memory (test hook)"
            } else {
                ""
            }
        )));
        if let Some(v) = &cublas {
            events(RunEvent::Note(format!("matrix products on cuBLAS {v}")));
        }
    }
    events(RunEvent::Started {
        steps: a.steps,
        progress: leader && a.transport == Transport::Local,
    });
    let mut step_times = vec![];
    let mut trace: Vec<(u64, f64, Timed)> = vec![];
    let mut peak_stash = vec![0u64; ranks.len()];
    let mut peak_temporary: Vec<Option<u64>> = vec![None; ranks.len()];
    let mut gpu_memory: Vec<Vec<ppcc_runtime::pipeline::GpuMemory>> = vec![Vec::new(); ranks.len()];
    let mut busy = vec![0.0f64; ranks.len()];
    let run_start = Instant::now();
    let end_step = start_step
        .checked_add(a.steps)
        .with_context(|| format!("--steps {} from step {start_step} is too many", a.steps))?;
    for k in start_step..end_step {
        let batch = source.batch(k)?;
        let t0 = Instant::now();
        let offset = run_start.elapsed().as_secs_f64();
        let reports = driver.step(&mut workers, k, batch)?;
        step_times.push(t0.elapsed().as_secs_f64());
        // Under MPI only the device with the loss stage has it.
        if let Some(loss) = step_loss(&reports) {
            events(RunEvent::Step { step: k, loss });
            if !loss.is_finite() && !a.allow_nonfinite_loss {
                let msg = nonfinite_loss(k, loss);
                // Under MPI the other devices do not know the loss: end the job (before
                // any checkpoint of this step is written).
                driver.abort(&msg);
                bail!("{msg}");
            }
        } else if a.transport == Transport::Local {
            bail!("no stage computed the loss");
        }
        for (i, rep) in reports.iter().enumerate() {
            peak_stash[i] = peak_stash[i].max(rep.peak_stash_bytes);
            if let Some(t) = rep.peak_temporary_bytes {
                peak_temporary[i] = Some(peak_temporary[i].unwrap_or(0).max(t));
            }
            if !rep.gpu_memory.is_empty() {
                gpu_memory[i] = rep.gpu_memory.clone();
            }
            busy[i] += rep
                .actions
                .iter()
                .map(|t| t.end - t.start - t.waiting)
                .sum::<f64>();
            if a.trace.is_some() {
                trace.extend(rep.actions.iter().map(|t| (k, offset, t.clone())));
            }
        }
        if let (Some(d), Some(every)) = (&a.checkpoint_dir, a.checkpoint_every) {
            if (k + 1) % every == 0 {
                let tmp = checkpoint_tmp(d, k + 1);
                write_stage_files(&tmp, &stage_weights(&workers, sharded))?;
                driver.barrier()?;
                if leader {
                    commit_checkpoint(d, k + 1, &tmp, a.keep_checkpoints)?;
                }
                driver.barrier()?;
            }
        }
    }
    // Measured against predicted.
    if !step_times.is_empty() {
        // The first step pays for warming up caches; leave it out when there are more.
        let timed: &[f64] = if step_times.len() > 2 {
            &step_times[1..]
        } else {
            &step_times
        };
        let mean = timed.iter().sum::<f64>() / timed.len() as f64;
        let versus = if plan.device_profile == "host" {
            format!(
                "{:+.1}%",
                100.0 * (mean - plan.predicted_iteration) / plan.predicted_iteration
            )
        } else {
            "a prediction for that device; compile with --device-profile host to predict this machine".into()
        };
        if leader {
            events(RunEvent::Note(format!(
                "time per step: measured {} (mean of {} steps), predicted {} ({} profile: {versus})",
                fmt_time(mean),
                timed.len(),
                fmt_time(plan.predicted_iteration),
                plan.device_profile,
            )));
        }
        let n = step_times.len() as f64;
        for (i, w) in workers.iter().enumerate() {
            let r = w.rank;
            // Weights and states (optimizer moments, running statistics), gradients of the
            // trained params (the functions' `param` arguments), the stash at its peak.
            let (mut weights, mut grads) = (0u64, 0u64);
            for s in &w.stages {
                let trained: std::collections::HashSet<String> = s
                    .spec
                    .functions()
                    .into_iter()
                    .filter_map(|f| s.exec.signature(f))
                    .flat_map(|(args, _)| args)
                    .filter(|(_, kind, _)| *kind == ppir::ArgKind::Param)
                    .map(|(name, _, _)| name)
                    .collect();
                for (name, t) in &s.weights {
                    let b = (t.shape.iter().product::<usize>() * t.dtype.size_bytes()) as u64;
                    weights += b;
                    if trained.contains(name) {
                        grads += b;
                    }
                }
            }
            let temporaries = peak_temporary[i].unwrap_or(0);
            let measured = (weights + grads + peak_stash[i] + temporaries) as f64;
            let stages: Vec<String> = w.stages.iter().map(|s| s.spec.stage.to_string()).collect();
            let temporaries = match peak_temporary[i] {
                Some(t) => format!(
                    ", temporaries {}{}",
                    mib(t as f64),
                    predicted_temporaries(&plan, r % plan.devices.max(1))
                        .map_or(String::new(), |p| format!(" (predicted {})", mib(p)))
                ),
                None => String::new(),
            };
            // Allocations on the GPU (managed memory), counted by the runtime; a GPU that
            // several devices' stages share shows everything on it.
            let gpus: String = gpu_memory[i]
                .iter()
                .map(|g| {
                    let s = &g.stats;
                    format!(
                        ", GPU {} peak allocated {} (held from the driver {}; {} allocations from it, {} reused), {} kernels ({:.3} s waited for), {} cuBLAS products ({:.3} s)",
                        g.device,
                        mib(g.peak_bytes as f64),
                        mib(s.reserved_peak as f64),
                        s.driver_allocations,
                        s.reused,
                        s.launches,
                        s.kernel_seconds,
                        s.gemms,
                        s.gemm_seconds
                    )
                })
                .collect();
            // What went over NCCL (or the test hook's link), so a run shows that it did.
            let link = w.link.as_ref().map_or(String::new(), |s| {
                let t = s.state.traffic();
                format!(
                    "; over {}: {} messages sent ({}), {} received ({})",
                    s.link.describe(),
                    t.sent,
                    mib(t.sent_bytes as f64),
                    t.received,
                    mib(t.received_bytes as f64)
                )
            });
            events(RunEvent::Note(format!(
                "device {r} ({}stage {}): busy {} per step, peak memory {} (weights and optimizer state {}, gradients {}, stash {}{temporaries}){gpus}, predicted {}{link}",
                if plan.replicas > 1 {
                    format!("replica {}, ", w.config.replica)
                } else {
                    String::new()
                },
                stages.join(","),
                fmt_time(busy[i] / n),
                mib(measured),
                mib(weights as f64),
                mib(grads as f64),
                mib(peak_stash[i] as f64),
                plan.predicted_peak_memory
                    .get(r % plan.devices.max(1))
                    .map_or("?".into(), |p| mib(*p))
            )));
        }
        // `PPCC_GPU_PROFILE=1`: where each GPU's time went, kernel by kernel (once per
        // GPU, which several devices' stages may share).
        let mut profiled = std::collections::HashSet::new();
        for g in gpu_memory.iter().flatten() {
            if g.stats.kernels.is_empty() || !profiled.insert(g.device.clone()) {
                continue;
            }
            events(RunEvent::Note(kernel_profile(g)));
        }
        // The whole process: every device's buffers (one device per process under MPI),
        // the loaded code and the runtime itself.
        if let Some(rss) = peak_rss_bytes() {
            let who = match a.transport {
                Transport::Local => "this process (all devices)".to_string(),
                Transport::Mpi => format!("the process of device {}", ranks[0]),
            };
            events(RunEvent::Note(format!(
                "peak resident memory of {who}: {}",
                mib(rss as f64)
            )));
        }
    }
    if let Some(path) = &a.trace {
        if a.transport == Transport::Local {
            std::fs::write(path, trace_json(&trace))
                .with_context(|| format!("cannot write {}", path.display()))?;
        } else {
            // Each process writes its lane; the leader merges them.
            let part = part_path(path, ranks[0]);
            std::fs::write(&part, trace_json(&trace))
                .with_context(|| format!("cannot write {}", part.display()))?;
            driver.barrier()?;
            if leader {
                merge_traces(path, workers_total)?;
            }
        }
        if leader {
            events(RunEvent::Note(format!("wrote {}", path.display())));
        }
    }
    if let Some(out) = a.save_params.as_ref().or(a.save_onnx.as_ref()) {
        let trained: BTreeMap<String, Tensor> = if a.transport == Transport::Local {
            stage_weights(&workers, false)
                .into_iter()
                .flat_map(|(_, _, w)| w.iter())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        } else {
            let parts = out.with_extension("parts");
            write_stage_files(&parts, &stage_weights(&workers, false))?;
            driver.barrier()?;
            let mut all = BTreeMap::new();
            if leader {
                for s in 0..plan.stages.len() {
                    all.extend(read_npz(&parts.join(format!("stage{s}.npz")))?);
                }
                let _ = std::fs::remove_dir_all(&parts);
            }
            all
        };
        if leader {
            if let Some(out) = &a.save_params {
                let named: Vec<(String, Tensor)> =
                    trained_by_source(&plan, &trained)?.into_iter().collect();
                ppcc_runtime::npz::write_npz(out, &named)?;
                events(RunEvent::Note(format!(
                    "wrote {} ({} trained parameters)",
                    out.display(),
                    named.len()
                )));
            }
            if let Some(out) = &a.save_onnx {
                events(RunEvent::Note(save_onnx(&plan, out, &trained)?));
            }
        }
    }
    driver.finish()?;
    Ok(())
}

/// The error of a step whose loss is NaN or infinite.
pub fn nonfinite_loss(step: u64, loss: f64) -> String {
    format!(
        "step {step}: the loss is {loss:?}; stopping (training on would carry it into the weights; no checkpoint of this step was written). Lower the learning rate or check the data; --allow-nonfinite-loss keeps going"
    )
}

/// `FILE.json` → `FILE.rank<r>.json`.
fn part_path(path: &Path, rank: usize) -> PathBuf {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_default();
    path.with_file_name(format!("{stem}.rank{rank}.json"))
}

/// Merge the per-process traces `FILE.rank<r>.json` into `FILE` and remove them.
fn merge_traces(path: &Path, ranks: usize) -> Result<()> {
    let mut events = vec![];
    for r in 0..ranks {
        let part = part_path(path, r);
        let text = std::fs::read_to_string(&part)
            .with_context(|| format!("cannot read {}", part.display()))?;
        let v: serde_json::Value = serde_json::from_str(&text)?;
        if let Some(e) = v["traceEvents"].as_array() {
            events.extend(e.iter().cloned());
        }
        let _ = std::fs::remove_file(&part);
    }
    let doc = serde_json::json!({"traceEvents": events, "displayTimeUnit": "ms"});
    std::fs::write(path, serde_json::to_string(&doc)?)
        .with_context(|| format!("cannot write {}", path.display()))
}

/// The trained weights keyed by the model's names for them (ONNX initializers, StableHLO
/// `arg<i>`), with the pieces `--split` cut joined back.
fn trained_by_source(
    plan: &PlanSpec,
    weights: &BTreeMap<String, Tensor>,
) -> Result<BTreeMap<String, Tensor>> {
    // Weights `--split` cut into pieces are joined back: the saved model has the original
    // weights.
    let mut weights = weights.clone();
    if let Some(t) = &plan.doc.training {
        let splits: Vec<ppcc_passes::rewrite::params::WeightSplit> = t
            .weight_pieces
            .iter()
            .map(|(name, p)| ppcc_passes::rewrite::params::WeightSplit {
                original: name.clone(),
                axis: p.axis,
                pieces: p.pieces.clone(),
            })
            .collect();
        ppcc_passes::rewrite::params::join_pieces(&mut weights, &splits)
            .map_err(|e| invalid!("joining split weights: {e}"))?;
    }
    let trained: BTreeMap<String, Tensor> = weights
        .iter()
        .filter_map(|(k, v)| Some((plan.weight_sources.get(k)?.clone(), v.clone())))
        .collect();
    Ok(trained)
}

/// Write the model with the trained initializers; returns the line to report.
fn save_onnx(plan: &PlanSpec, out: &Path, weights: &BTreeMap<String, Tensor>) -> Result<String> {
    let model = PathBuf::from(&plan.model);
    let bytes = std::fs::read(&model).with_context(|| {
        format!(
            "cannot read the model {} the plan was compiled from",
            model.display()
        )
    })?;
    let trained = trained_by_source(plan, weights)?;
    let (bytes, report) = ppcc_frontends::onnx_export::replace_initializers(&bytes, &trained)?;
    std::fs::write(out, bytes).with_context(|| format!("cannot write {}", out.display()))?;
    Ok(format!(
        "wrote {} ({} initializers updated)",
        out.display(),
        report.replaced.len()
    ))
}

/// Chrome/Perfetto trace of what ran: one lane per device, µs.
fn trace_json(events: &[(u64, f64, Timed)]) -> String {
    let mut out = String::from("{\"traceEvents\":[\n");
    let mut lanes: Vec<usize> = events.iter().map(|e| e.2.rank).collect();
    lanes.sort_unstable();
    lanes.dedup();
    let mut first = true;
    for r in lanes {
        if !first {
            out.push_str(",\n");
        }
        first = false;
        out.push_str(&format!(
            "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":{r},\"args\":{{\"name\":\"device {r}\"}}}}"
        ));
    }
    for (step, offset, t) in events {
        let name = if t.kind == ppcc_runtime::pipeline::ActionKind::OptimizerStep {
            format!("{}OPT", t.stage)
        } else {
            format!("{}{}{}", t.stage, t.kind.code(), t.micro_batch)
        };
        out.push_str(&format!(
            ",\n{{\"name\":\"{name}\",\"ph\":\"X\",\"pid\":0,\"tid\":{},\"ts\":{:.3},\"dur\":{:.3},\"args\":{{\"step\":{step},\"stage\":{},\"micro_batch\":{},\"waiting_us\":{:.3}}}}}",
            t.rank,
            (offset + t.start) * 1e6,
            (t.end - t.start) * 1e6,
            t.stage,
            t.micro_batch,
            t.waiting * 1e6
        ));
    }
    out.push_str("\n],\"displayTimeUnit\":\"ms\"}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ppcc_runtime::gpu::{GpuStats, KernelTime};

    #[test]
    fn the_kernel_table_lists_the_slowest_first_with_shares_and_means() {
        let kernel = |name: &str, launches, seconds| KernelTime {
            name: name.to_string(),
            launches,
            seconds,
        };
        let mut kernels = vec![kernel("slow", 512, 0.003)];
        kernels.extend((0..25).map(|i| kernel(&format!("k{i}"), 1, 0.000_04)));
        let g = ppcc_runtime::pipeline::GpuMemory {
            device: "0 (test GPU)".to_string(),
            peak_bytes: 0,
            stats: GpuStats {
                kernels,
                ..Default::default()
            },
        };
        let table = kernel_profile(&g);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[0],
            "GPU 0 (test GPU): 26 kernels, 537 launches, 0.004 s waited for (PPCC_GPU_PROFILE; the 20 slowest):"
        );
        // 3 ms of 4 ms in all; 512 launches of 5.9 µs.
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            ["3.000", "ms", "75.0%", "512", "launches", "5.9", "us", "each", "slow"]
        );
        assert_eq!(lines.len(), 21, "{table}");
    }
}
