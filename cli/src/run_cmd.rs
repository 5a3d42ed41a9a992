//! `ppcc run DIR`: train a compiled plan, every device a worker running its schedule.
//!
//! Standard output: `step <k> loss <value>` per step, exactly as `ppcc train` prints it
//! (the same model, batch, micro-batches and seed give the same numbers). Standard error:
//! a progress bar on a terminal, then measured against predicted time per step and memory
//! per device.

use crate::target::Target;
use ppcc_runtime::native::{NativeModule, NativeStage};
use ppcc_runtime::pipeline::StageExecutable;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use ppcc_runtime::data::with_batch;
use ppcc_runtime::pipeline::{
    run_local, step_loss, Fault, InterpretedStage, PlanSpec, RankReport, RankWorker, RunConfig,
    StageWorker, Timed,
};
use ppcc_runtime::transport::local::LocalNet;
use ppcc_runtime::{BatchSource, Distribution, InputSpec, SyntheticSource};
use ppir::{Module, Tensor, TensorType};

use crate::npz::{read_npz, write_npz};
use crate::program::step_bar;
use crate::train_cmd::{npz_source, step_line};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TransportArg {
    /// Every device a thread of this process (no setup).
    Local,
    /// One process per device: `mpirun -np P ppcc run DIR --transport mpi`.
    Mpi,
}

/// Train a compiled plan (`ppcc MODEL.onnx -o DIR`) with pipelined workers.
#[derive(Args, Debug)]
#[command(after_help = "\
Output: one line per step on standard output, `step <k> loss <value>`, as `ppcc train`
prints it; with the same model, batch, micro-batches, data and seed the losses equal those
of `ppcc train`. Standard error: a progress bar on a terminal, then the measured time per
step and peak memory per device against the plan's predictions (compile with
`--device-profile host` for predictions of this machine).

Data: as `ppcc train` (`--data FILE.npz` with the model's inputs by ONNX name and
`labels`; `synthetic`: one seeded batch repeated; `synthetic-fresh`: a new one per step).

Checkpoints: `--checkpoint-dir D --checkpoint-every K` writes D/step-<k>/ (every stage's
weights and optimizer state) atomically and D/latest; `--resume D` continues from
D/latest with the same data and losses as an uninterrupted run.

Examples:
  ppcc examples/mlp.onnx -o build/ --stages 2 --microbatches 4 && ppcc run build/ --steps 10
  ppcc run build/ --steps 100 --trace run.json --checkpoint-dir ckpt --checkpoint-every 10
  ppcc run build/ --steps 50 --resume ckpt
  mpirun -np 2 ppcc run build/ --transport mpi")]
pub struct RunArgs {
    /// The directory `ppcc MODEL.onnx -o DIR` wrote.
    pub dir: PathBuf,
    /// Training steps to run.
    #[arg(long, default_value_t = 10)]
    pub steps: u64,
    /// Training data: an `.npz`, `synthetic` or `synthetic-fresh`.
    #[arg(long, value_name = "FILE.npz|synthetic", default_value = "synthetic")]
    pub data: String,
    /// Seed of synthetic data.
    #[arg(long, value_name = "S", default_value_t = 0)]
    pub seed: u64,
    /// How devices talk.
    #[arg(long, value_enum, default_value_t = TransportArg::Local)]
    pub transport: TransportArg,
    /// Write a Chrome/Perfetto trace of what ran (one lane per device).
    #[arg(long, value_name = "FILE.json")]
    pub trace: Option<PathBuf>,
    /// Where to write checkpoints.
    #[arg(long, value_name = "D")]
    pub checkpoint_dir: Option<PathBuf>,
    /// Write a checkpoint every K steps (needs --checkpoint-dir).
    #[arg(long, value_name = "K")]
    pub checkpoint_every: Option<u64>,
    /// Continue from the latest checkpoint in D.
    #[arg(long, value_name = "D")]
    pub resume: Option<PathBuf>,
    /// After training, write the model with the trained initializers.
    #[arg(long, value_name = "OUT.onnx")]
    pub save_onnx: Option<PathBuf>,
    /// Longest a device waits for a tensor from another before it reports which one.
    #[arg(long, value_name = "SECONDS", default_value_t = 120.0)]
    pub recv_timeout: f64,
    /// Run the stages as the native modules the compile generated (`cpu`, the default
    /// when the plan has them) or on the reference interpreter (`interp`).
    #[arg(long, value_enum, value_name = "TARGET")]
    pub target: Option<Target>,
    /// Test hook: make stage S panic at step K (`S:K`), or stall for T seconds
    /// (`S:K:stall=T`).
    #[arg(long, value_name = "S:K", hide = true)]
    pub inject_fault: Option<String>,
}

/// Stage weights as loaded from / saved to npz.
type Weights = BTreeMap<String, Tensor>;

fn load_stage(plan: &PlanSpec, s: usize) -> Result<(Module, Weights)> {
    let dir = &plan.stages[s].dir;
    // Every file is checked against the size and hash plan.json records before use.
    let path = dir.join("stage.ppir");
    let text = String::from_utf8(plan.read_file(&path)?)
        .with_context(|| format!("{} is not UTF-8 text", path.display()))?;
    let module =
        ppir::text::parse_module(&text).map_err(|e| anyhow::anyhow!("{}:{e}", path.display()))?;
    let params = dir.join("params.npz");
    plan.read_file(&params)?;
    let weights: Weights = read_npz(&params)?.into_iter().collect();
    Ok((module, weights))
}

fn data_source(
    a: &RunArgs,
    plan: &PlanSpec,
    specs: &[(String, TensorType, Option<Distribution>)],
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
            Box::new(SyntheticSource::new(list, a.seed, a.data == "synthetic")?)
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
            Box::new(npz_source(path, arrays, &wanted, &onnx, global as usize)?)
        }
    })
}

/// Synthetic distributions from plan.json.
fn input_specs(
    dir: &Path,
    plan: &PlanSpec,
) -> Result<Vec<(String, TensorType, Option<Distribution>)>> {
    let text = std::fs::read_to_string(dir.join("plan.json"))?;
    let v: serde_json::Value = serde_json::from_str(&text)?;
    let dists: HashMap<String, Option<Distribution>> = v["training"]["inputs"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|i| {
                    let name = i["name"].as_str()?.to_string();
                    let s = &i["synthetic"];
                    let d = if s.as_str() == Some("normal") {
                        Some(Distribution::Normal)
                    } else {
                        s["uniform"].as_array().and_then(|r| {
                            Some(Distribution::Uniform {
                                low: r.first()?.as_i64()?,
                                high: r.get(1)?.as_i64()?,
                            })
                        })
                    };
                    Some((name, d))
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(plan
        .inputs
        .iter()
        .map(|i| {
            (
                i.name.clone(),
                i.ty.clone(),
                dists.get(&i.name).copied().flatten(),
            )
        })
        .collect())
}

fn checkpoint_latest(d: &Path) -> Result<(u64, PathBuf)> {
    let latest = d.join("latest");
    let text = std::fs::read_to_string(&latest).with_context(|| {
        format!(
            "{} has no checkpoint (no {})",
            d.display(),
            latest.display()
        )
    })?;
    let step: u64 = text
        .trim()
        .parse()
        .with_context(|| format!("{}: not a step number", latest.display()))?;
    Ok((step, d.join(format!("step-{step}"))))
}

/// Where the stage files of the checkpoint of step `step` are written before it is
/// committed (the same for every process).
fn checkpoint_tmp(d: &Path, step: u64) -> PathBuf {
    d.join(format!(".step-{step}.tmp"))
}

/// Write `stages`' weights as `dir/stage<i>.npz`.
fn write_stage_files(dir: &Path, stages: &[(u32, &Weights)]) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    for (s, w) in stages {
        let arrays: Vec<(String, Tensor)> = w.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        write_npz(&dir.join(format!("stage{s}.npz")), &arrays)?;
    }
    Ok(())
}

/// Move the written checkpoint `tmp` to `d/step-<k>/` and point `d/latest` at it, both by
/// rename, so a crash never leaves a half checkpoint behind `latest`.
fn commit_checkpoint(d: &Path, step: u64, tmp: &Path) -> Result<()> {
    std::fs::write(tmp.join("step"), format!("{step}\n"))?;
    let fin = d.join(format!("step-{step}"));
    let _ = std::fs::remove_dir_all(&fin);
    std::fs::rename(tmp, &fin)
        .with_context(|| format!("cannot move the checkpoint into {}", fin.display()))?;
    let latest_tmp = d.join(format!(".latest.tmp-{}", std::process::id()));
    std::fs::write(&latest_tmp, format!("{step}\n"))?;
    std::fs::rename(&latest_tmp, d.join("latest"))?;
    Ok(())
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
        workers: &mut [RankWorker],
        k: u64,
        batch: &ppcc_runtime::Batch,
    ) -> Result<Vec<RankReport>> {
        match self {
            Driver::Local(net) => run_local(workers, net, k, batch)
                .map_err(|e| anyhow::anyhow!("device {} failed: {e}", e.rank)),
            #[cfg(feature = "mpi")]
            Driver::Mpi(t) => {
                let w = &mut workers[0];
                match w.step(k, batch, t.as_mut()) {
                    Ok(r) => Ok(vec![r]),
                    Err(e) => {
                        let msg = format!("device {} failed: {e}", e.rank);
                        ppcc_runtime::transport::Transport::abort(t.as_mut(), &msg);
                        bail!(msg)
                    }
                }
            }
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

fn parse_fault(f: &str) -> Result<Fault> {
    let parts: Vec<&str> = f.split(':').collect();
    let (Some(s), Some(k)) = (parts.first(), parts.get(1)) else {
        bail!("--inject-fault takes S:K or S:K:stall=T");
    };
    let stall = match parts.get(2) {
        None => None,
        Some(x) => Some(Duration::from_secs_f64(
            x.strip_prefix("stall=")
                .context("--inject-fault S:K:stall=T")?
                .parse()?,
        )),
    };
    Ok(Fault {
        stage: s.parse()?,
        step: k.parse()?,
        stall,
    })
}

/// The workers of `ranks`, with weights from the plan (or the checkpoint `resume`).
fn build_workers(
    plan: &PlanSpec,
    ranks: &[usize],
    config: &RunConfig,
    resume: Option<&Path>,
    target: Target,
) -> Result<Vec<RankWorker>> {
    let mut workers: Vec<RankWorker> = ranks
        .iter()
        .map(|&rank| RankWorker {
            rank,
            stages: vec![],
            actions: plan.actions[rank].clone(),
            config: config.clone(),
        })
        .collect();
    for s in 0..plan.stages.len() {
        let spec = plan.stages[s].clone();
        let Some(wi) = ranks.iter().position(|&r| r == spec.device) else {
            continue;
        };
        let (module, mut weights) = load_stage(plan, s)?;
        if let Some(dir) = resume {
            let p = dir.join(format!("stage{s}.npz"));
            let saved: Weights = read_npz(&p)?.into_iter().collect();
            for (k, v) in saved {
                if !weights.contains_key(&k) {
                    bail!(
                        "{}: `{k}` is not a weight of stage {s} of this plan",
                        p.display()
                    );
                }
                weights.insert(k, v);
            }
        }
        let exec: Box<dyn StageExecutable> = match target {
            Target::Interp => Box::new(InterpretedStage {
                module,
                options: Default::default(),
            }),
            Target::Cpu => {
                let so = spec.dir.join("module.so");
                if !so.exists() {
                    bail!(
                        "{} does not exist: the plan was compiled with --target {} (compile again with --target cpu, or run with --target interp)",
                        so.display(),
                        plan.target
                    );
                }
                let bytes = plan.read_file(&so).with_context(|| format!("stage {s}"))?;
                let native = NativeModule::load_verified(&so, &bytes, &module, None)
                    .with_context(|| format!("stage {s}"))?;
                Box::new(NativeStage::new(module, native))
            }
        };
        let worker = StageWorker::new(spec, exec, weights).map_err(|e| anyhow::anyhow!(e))?;
        workers[wi].stages.push(worker);
    }
    Ok(workers)
}

/// Stage weights of `workers` as (stage, weights).
fn stage_weights(workers: &[RankWorker]) -> Vec<(u32, &Weights)> {
    workers
        .iter()
        .flat_map(|w| w.stages.iter().map(|s| (s.spec.stage, &s.weights)))
        .collect()
}

pub fn run(a: RunArgs) -> Result<ExitCode> {
    if a.checkpoint_every.is_some() != a.checkpoint_dir.is_some() {
        bail!("--checkpoint-every K and --checkpoint-dir D go together");
    }
    if a.checkpoint_every == Some(0) {
        bail!("--checkpoint-every must be at least 1");
    }
    let fault = a.inject_fault.as_deref().map(parse_fault).transpose()?;
    let plan = PlanSpec::load(&a.dir).map_err(|e| anyhow::anyhow!(e))?;
    let specs = input_specs(&a.dir, &plan)?;
    let mut source = data_source(&a, &plan, &specs)?;
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
        recv_timeout: Duration::from_secs_f64(a.recv_timeout.max(0.001)),
        channel_values: plan.channel_values.clone(),
        fault,
    };
    let mut driver = match a.transport {
        TransportArg::Local => Driver::Local(LocalNet::new(plan.devices)),
        #[cfg(feature = "mpi")]
        TransportArg::Mpi => {
            let t = ppcc_runtime::transport::mpi::MpiTransport::init()?;
            let size = ppcc_runtime::transport::Transport::size(&t);
            if size != plan.devices {
                let msg = format!(
                    "the plan has {} devices but mpirun started {size} processes: run mpirun -np {}",
                    plan.devices, plan.devices
                );
                let mut t = t;
                ppcc_runtime::transport::Transport::abort(&mut t, &msg);
                bail!(msg);
            }
            Driver::Mpi(Box::new(t))
        }
        #[cfg(not(feature = "mpi"))]
        TransportArg::Mpi => {
            bail!("this ppcc was built without MPI (cargo feature `mpi`); use --transport local")
        }
    };
    let ranks = driver.ranks(plan.devices);
    let target = match a.target {
        Some(t) => t,
        None if plan.target == "cpu" => Target::Cpu,
        None => Target::Interp,
    };
    let mut workers = build_workers(&plan, &ranks, &config, resume_dir.as_deref(), target)?;
    let leader = driver.leader();
    if leader {
        if let Some(d) = &resume_dir {
            eprintln!("resuming from {} at step {start_step}", d.display());
        }
        eprintln!(
            "running {}: {} stages on {} devices, schedule {}, {} micro-batches of {} rows, transport {}",
            a.dir.display(),
            plan.stages.len(),
            plan.devices,
            plan.schedule,
            plan.microbatches,
            plan.micro_batch,
            match a.transport {
                TransportArg::Local => "local",
                TransportArg::Mpi => "mpi",
            }
        );
    }
    let bar = step_bar(a.steps, leader && a.transport == TransportArg::Local);
    let mut step_times = vec![];
    let mut trace: Vec<(u64, f64, Timed)> = vec![];
    let mut peak_stash = vec![0u64; ranks.len()];
    let mut busy = vec![0.0f64; ranks.len()];
    let run_start = Instant::now();
    for k in start_step..start_step + a.steps {
        let batch = source.batch(k)?;
        let t0 = Instant::now();
        let offset = run_start.elapsed().as_secs_f64();
        let reports = match driver.step(&mut workers, k, &batch) {
            Ok(r) => r,
            Err(e) => {
                bar.finish_and_clear();
                return Err(e);
            }
        };
        step_times.push(t0.elapsed().as_secs_f64());
        // Under MPI only the device with the loss stage has it.
        if let Some(loss) = step_loss(&reports) {
            bar.suspend(|| println!("{}", step_line(k, loss)));
            bar.set_message(format!("loss {loss:.4}"));
        } else if a.transport == TransportArg::Local {
            bail!("no stage computed the loss");
        }
        bar.inc(1);
        for (i, rep) in reports.iter().enumerate() {
            peak_stash[i] = peak_stash[i].max(rep.peak_stash_bytes);
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
                write_stage_files(&tmp, &stage_weights(&workers))?;
                driver.barrier()?;
                if leader {
                    commit_checkpoint(d, k + 1, &tmp)?;
                }
                driver.barrier()?;
            }
        }
    }
    bar.finish_and_clear();

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
            eprintln!(
                "time per step: measured {} (mean of {} steps), predicted {} ({} profile: {versus})",
                fmt_time(mean),
                timed.len(),
                fmt_time(plan.predicted_iteration),
                plan.device_profile,
            );
        }
        let n = step_times.len() as f64;
        for (i, w) in workers.iter().enumerate() {
            let r = w.rank;
            let weights: u64 = w
                .stages
                .iter()
                .flat_map(|s| s.weights.values())
                .map(|t| (t.shape.iter().product::<usize>() * t.dtype.size_bytes()) as u64)
                .sum();
            // Weights, gradients (as big as the params) and the stash at its peak.
            let measured = 2.0 * weights as f64 + peak_stash[i] as f64;
            let stages: Vec<String> = w.stages.iter().map(|s| s.spec.stage.to_string()).collect();
            eprintln!(
                "device {r} (stage {}): busy {} per step, peak memory {} (weights+grads {}, stash {}), predicted {}",
                stages.join(","),
                fmt_time(busy[i] / n),
                mib(measured),
                mib(2.0 * weights as f64),
                mib(peak_stash[i] as f64),
                plan.predicted_peak_memory.get(r).map_or("?".into(), |p| mib(*p))
            );
        }
    }
    if let Some(path) = &a.trace {
        if a.transport == TransportArg::Local {
            std::fs::write(path, trace_json(&trace))
                .with_context(|| format!("cannot write {}", path.display()))?;
        } else {
            // Each process writes its lane; the leader merges them.
            let part = part_path(path, ranks[0]);
            std::fs::write(&part, trace_json(&trace))
                .with_context(|| format!("cannot write {}", part.display()))?;
            driver.barrier()?;
            if leader {
                merge_traces(path, plan.devices)?;
            }
        }
        if leader {
            eprintln!("wrote {}", path.display());
        }
    }
    if let Some(out) = &a.save_onnx {
        let trained: BTreeMap<String, Tensor> = if a.transport == TransportArg::Local {
            stage_weights(&workers)
                .into_iter()
                .flat_map(|(_, w)| w.iter())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        } else {
            let parts = out.with_extension("parts");
            write_stage_files(&parts, &stage_weights(&workers))?;
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
            save_onnx(&plan, out, &trained)?;
        }
    }
    driver.finish()?;
    Ok(ExitCode::SUCCESS)
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

fn save_onnx(plan: &PlanSpec, out: &Path, weights: &BTreeMap<String, Tensor>) -> Result<()> {
    let model = PathBuf::from(&plan.model);
    let bytes = std::fs::read(&model).with_context(|| {
        format!(
            "cannot read the model {} the plan was compiled from",
            model.display()
        )
    })?;
    let trained: BTreeMap<String, Tensor> = weights
        .iter()
        .filter_map(|(k, v)| Some((plan.weight_sources.get(k)?.clone(), v.clone())))
        .collect();
    let (bytes, report) = ppcc_frontends::onnx_export::replace_initializers(&bytes, &trained)?;
    std::fs::write(out, bytes).with_context(|| format!("cannot write {}", out.display()))?;
    eprintln!(
        "wrote {} ({} initializers updated)",
        out.display(),
        report.replaced.len()
    );
    Ok(())
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
