//! `ppcc run DIR`: train a compiled plan, every device a worker running its schedule.
//!
//! Standard output: `step <k> loss <value>` per step, exactly as `ppcc train` prints it
//! (the same model, batch, micro-batches and seed give the same numbers). Standard error:
//! a progress bar on a terminal, then measured against predicted time per step and memory
//! per device.

use std::collections::{BTreeMap, HashMap};
use std::io::IsTerminal;
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
    /// Test hook: make stage S panic at step K (`S:K`), or stall for T seconds
    /// (`S:K:stall=T`).
    #[arg(long, value_name = "S:K", hide = true)]
    pub inject_fault: Option<String>,
}

/// Stage weights as loaded from / saved to npz.
type Weights = BTreeMap<String, Tensor>;

fn load_stage(plan: &PlanSpec, s: usize) -> Result<(Module, Weights)> {
    let dir = &plan.stages[s].dir;
    let path = dir.join("stage.ppir");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let module =
        ppir::text::parse_module(&text).map_err(|e| anyhow::anyhow!("{}:{e}", path.display()))?;
    let weights: Weights = read_npz(&dir.join("params.npz"))?.into_iter().collect();
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

/// Write every stage's weights to `d/step-<k>/` through a temporary folder and a rename,
/// then point `d/latest` at it (also by rename), so a crash never leaves a half checkpoint.
fn write_checkpoint(d: &Path, step: u64, stages: &[(u32, &Weights)]) -> Result<()> {
    std::fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
    let tmp = d.join(format!(".step-{step}.tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    for (s, w) in stages {
        let arrays: Vec<(String, Tensor)> = w.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        write_npz(&tmp.join(format!("stage{s}.npz")), &arrays)?;
    }
    std::fs::write(tmp.join("step"), format!("{step}\n"))?;
    let fin = d.join(format!("step-{step}"));
    let _ = std::fs::remove_dir_all(&fin);
    std::fs::rename(&tmp, &fin)
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

pub fn run(a: RunArgs) -> Result<ExitCode> {
    if a.transport == TransportArg::Mpi {
        bail!("--transport mpi is not available in this build yet; use --transport local");
    }
    if a.checkpoint_every.is_some() != a.checkpoint_dir.is_some() {
        bail!("--checkpoint-every K and --checkpoint-dir D go together");
    }
    if a.checkpoint_every == Some(0) {
        bail!("--checkpoint-every must be at least 1");
    }
    let fault = a
        .inject_fault
        .as_deref()
        .map(|f| -> Result<Fault> {
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
        })
        .transpose()?;
    let plan = PlanSpec::load(&a.dir).map_err(|e| anyhow::anyhow!(e))?;
    let specs = input_specs(&a.dir, &plan)?;
    let mut source = data_source(&a, &plan, &specs)?;

    // Workers.
    let (mut start_step, resume_dir) = match &a.resume {
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
    let mut workers: Vec<RankWorker> = (0..plan.devices)
        .map(|rank| RankWorker {
            rank,
            stages: vec![],
            actions: plan.actions[rank].clone(),
            config: config.clone(),
        })
        .collect();
    for s in 0..plan.stages.len() {
        let (module, mut weights) = load_stage(&plan, s)?;
        if let Some(dir) = &resume_dir {
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
        let spec = plan.stages[s].clone();
        let device = spec.device;
        let worker = StageWorker::new(
            spec,
            Box::new(InterpretedStage {
                module,
                options: Default::default(),
            }),
            weights,
        )
        .map_err(|e| anyhow::anyhow!(e))?;
        workers[device].stages.push(worker);
    }
    if let Some(d) = &resume_dir {
        eprintln!("resuming from {} at step {start_step}", d.display());
    }

    eprintln!(
        "running {}: {} stages on {} devices, schedule {}, {} micro-batches of {} rows, transport local",
        a.dir.display(),
        plan.stages.len(),
        plan.devices,
        plan.schedule,
        plan.microbatches,
        plan.micro_batch
    );
    let bar = if std::io::stderr().is_terminal() {
        let pb = indicatif::ProgressBar::new(a.steps);
        pb.set_style(
            indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} steps, {elapsed} {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        pb
    } else {
        indicatif::ProgressBar::hidden()
    };
    let net = LocalNet::new(plan.devices);
    let mut step_times = vec![];
    let mut trace: Vec<(u64, f64, Timed)> = vec![];
    let mut peak_stash = vec![0u64; plan.devices];
    let mut busy = vec![0.0f64; plan.devices];
    let run_start = Instant::now();
    for k in start_step..start_step + a.steps {
        let batch = source.batch(k)?;
        let t0 = Instant::now();
        let offset = run_start.elapsed().as_secs_f64();
        let reports: Vec<RankReport> = match run_local(&mut workers, &net, k, &batch) {
            Ok(r) => r,
            Err(e) => {
                bar.finish_and_clear();
                bail!("device {} failed: {e}", e.rank);
            }
        };
        step_times.push(t0.elapsed().as_secs_f64());
        let loss = step_loss(&reports).context("no stage computed the loss")?;
        bar.suspend(|| println!("{}", step_line(k, loss)));
        bar.set_message(format!("loss {loss:.4}"));
        bar.inc(1);
        for (r, rep) in reports.iter().enumerate() {
            peak_stash[r] = peak_stash[r].max(rep.peak_stash_bytes);
            busy[r] += rep
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
                let stages: Vec<(u32, &Weights)> = workers
                    .iter()
                    .flat_map(|w| w.stages.iter().map(|s| (s.spec.stage, &s.weights)))
                    .collect();
                write_checkpoint(d, k + 1, &stages)?;
            }
        }
    }
    bar.finish_and_clear();
    start_step += a.steps;
    let _ = start_step;

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
        eprintln!(
            "time per step: measured {} (mean of {} steps), predicted {} ({} profile: {versus})",
            fmt_time(mean),
            timed.len(),
            fmt_time(plan.predicted_iteration),
            plan.device_profile,
        );
        let n = step_times.len() as f64;
        for (r, w) in workers.iter().enumerate() {
            let weights: u64 = w
                .stages
                .iter()
                .flat_map(|s| s.weights.values())
                .map(|t| (t.shape.iter().product::<usize>() * t.dtype.size_bytes()) as u64)
                .sum();
            // Weights, gradients (as big as the params) and the stash at its peak.
            let measured = 2.0 * weights as f64 + peak_stash[r] as f64;
            let stages: Vec<String> = w.stages.iter().map(|s| s.spec.stage.to_string()).collect();
            eprintln!(
                "device {r} (stage {}): busy {} per step, peak memory {} (weights+grads {}, stash {}), predicted {}",
                stages.join(","),
                fmt_time(busy[r] / n),
                mib(measured),
                mib(2.0 * weights as f64),
                mib(peak_stash[r] as f64),
                plan.predicted_peak_memory.get(r).map_or("?".into(), |p| mib(*p))
            );
        }
    }
    if let Some(path) = &a.trace {
        std::fs::write(path, trace_json(&trace))
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(out) = &a.save_onnx {
        let model = PathBuf::from(&plan.model);
        let bytes = std::fs::read(&model).with_context(|| {
            format!(
                "cannot read the model {} the plan was compiled from",
                model.display()
            )
        })?;
        let trained: BTreeMap<String, Tensor> = workers
            .iter()
            .flat_map(|w| w.stages.iter())
            .flat_map(|s| s.weights.iter())
            .filter_map(|(k, v)| Some((plan.weight_sources.get(k)?.clone(), v.clone())))
            .collect();
        let (bytes, report) = ppcc_frontends::onnx_export::replace_initializers(&bytes, &trained)?;
        std::fs::write(out, bytes).with_context(|| format!("cannot write {}", out.display()))?;
        eprintln!(
            "wrote {} ({} initializers updated)",
            out.display(),
            report.replaced.len()
        );
    }
    Ok(ExitCode::SUCCESS)
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
