//! `ppcc MODEL.onnx -o DIR`: compile a model into a pipeline plan.
//!
//! Import → bind the micro-batch → plan (cost model, partition, schedule, simulation; the
//! sequential partition as a baseline) → stage tags on `@main` → training program
//! (`@grad`, `@optim`) → per-stage functions joined by send/recv (`insert-send-recv`) →
//! verify → write DIR:
//!
//! ```text
//! DIR/plan.json            the plan: stages, devices, stage DAG edges and channels, schedule,
//!                          predicted time/bubble/memory, the sequential baseline, training options
//! DIR/stage<i>/stage.ppir  stage i's functions (fwd, bwd_input, bwd_weight, optim)
//! DIR/stage<i>/params.npz  initial values of stage i's params and states
//! DIR/schedule.csv         the schedule in torch.distributed.pipelining's CSV format
//! DIR/timeline.svg         the predicted timeline (one lane per device)
//! DIR/trace.json           the predicted timeline as a Chrome/Perfetto trace
//! ```

use crate::target::Target;
use ppcc_codegen::{build_module, BuildOptions};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use ppcc_passes::cost::{host_profile_cached, DeviceProfile};
use ppcc_passes::optim::OptimizerKind;
use ppcc_passes::partition::{apply, human_bytes, parse_bytes, PartitionKind};
use ppcc_passes::planner::{plan, Plan, PlannerOptions, ScheduleSpec};
use ppcc_passes::schedule::csv::{from_csv, to_csv};
use ppcc_passes::schedule::{Layout, BUILTIN_NAMES};
use ppcc_passes::simulate::{simulate, to_svg_seconds, to_trace_json_seconds};
use ppcc_passes::split::{split_stages, SplitInfo, SplitOptions};
use ppcc_runtime::integrity::FileRecord;
use ppcc_runtime::pipeline::PlanSpec;
use ppir::{ArgKind, Module, Phase};
use serde_json::{json, Value};

use crate::npz::write_npz;
use crate::program::{build_training, check, prepare, ProgramArgs};
use ppcc_runtime::data::default_specs;
use ppcc_runtime::{Distribution, InputSpec};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PartitionArg {
    /// `graph` when the schedule runs one stage per device, else `sequential`.
    Auto,
    /// GraphPipe: a stage DAG; parallel branches run on different devices at once.
    Graph,
    /// PipeDream: the best chain of stages (dynamic programming over a topological order).
    Sequential,
    /// Equal numbers of layers with weights per stage.
    Uniform,
}

/// How a CSV schedule's virtual stages map to devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CsvLayoutArg {
    /// Virtual stage c·P + r on device r (`--chunks 1`: a plain chain).
    Interleaved,
    /// Two chunks in a V (ZB-V).
    V,
}

/// Compile a model into a pipeline-parallel training plan.
#[derive(Args, Debug)]
#[command(after_help = "\
Writes DIR/plan.json (stages, devices, the stage DAG with bytes per edge, send/recv
channels, the schedule, predicted iteration time, bubble and memory per device, and the
same predictions for the sequential partition as a baseline), DIR/stage<i>/stage.ppir
(stage i's fwd, bwd_input, bwd_weight and optim functions with explicit send/recv),
DIR/stage<i>/params.npz (initial weights), DIR/schedule.csv, DIR/timeline.svg and
DIR/trace.json; prints a short table.

Examples:
  ppcc examples/two_tower.onnx -o build/ --stages 3 --microbatches 4 --loss mse
  ppcc examples/gpt.onnx -o build/ --stages 2 --microbatches 1 --schedule zb-h1
  ppcc model.onnx -o build/ --stages 4 --microbatches 8 --schedule interleaved-1f1b --chunks 2
  ppcc model.onnx -o build/ --stages 4 --schedule my_schedule.csv --partition sequential
  ppcc model.onnx -o build/ --stages 4 --stage-layout block3/Add,block6/Add,block9/Add")]
pub struct CompileArgs {
    /// The ONNX model (float initializers are the trained parameters).
    #[arg(required = true, value_name = "MODEL.onnx")]
    pub model: Option<PathBuf>,
    /// Output directory (created; existing plan files in it are replaced). An existing
    /// directory must be empty or an earlier build directory (it has ppcc's plan.json).
    #[arg(short, long, value_name = "DIR", required = true)]
    pub output: Option<PathBuf>,
    /// Write into an existing directory that is neither empty nor a ppcc build directory.
    #[arg(long)]
    pub force: bool,
    /// Devices (pipeline ranks), P.
    #[arg(long, value_name = "P", default_value_t = 2)]
    pub stages: usize,
    /// Micro-batches per step, M (must divide the global batch). Default: the largest
    /// divisor of the global batch up to 2·P.
    #[arg(long, value_name = "M")]
    pub microbatches: Option<u64>,
    /// A built-in schedule (gpipe, 1f1b, interleaved-1f1b, zb-h1, zb-h2, zb-v) or a torch
    /// CSV file (one row per device, cells like 0F1, 1I0, 2W3, 1B2).
    #[arg(long, value_name = "NAME|FILE.csv", default_value = "1f1b")]
    pub schedule: String,
    /// The partitioner.
    #[arg(long, value_enum, default_value_t = PartitionArg::Auto)]
    pub partition: PartitionArg,
    /// Stages per device for interleaved-1f1b (V).
    #[arg(long, value_name = "V")]
    pub chunks: Option<usize>,
    /// Stage layout of a CSV schedule.
    #[arg(long, value_enum, default_value_t = CsvLayoutArg::Interleaved)]
    pub csv_layout: CsvLayoutArg,
    /// Device profile for the cost model: h100, a100, host (measured here once, cached)
    /// or a profile JSON file.
    #[arg(long, value_name = "NAME|FILE.json", default_value = "h100")]
    pub device_profile: String,
    /// Memory per device (bytes; suffixes K, M, G, KiB, MiB, GiB). Default: the profile's.
    #[arg(long, value_name = "BYTES")]
    pub memory_limit: Option<String>,
    /// Comma-separated ONNX node names (or value names) that must start a stage; the
    /// partitioner balances the rest.
    #[arg(long, value_name = "NAME,NAME")]
    pub stage_layout: Option<String>,
    /// Write only the plan (plan.json, schedule.csv, timeline.svg, trace.json), not the
    /// per-stage programs: for exploring plans quickly.
    #[arg(long)]
    pub plan_only: bool,
    /// Generate native code for each stage (`cpu`: DIR/stage<i>/module.so through MLIR and
    /// LLVM) or run the stages on the reference interpreter (`interp`).
    #[arg(long, value_enum, default_value_t = Target::Cpu)]
    pub target: Target,
    /// The GPU architecture of `--target cuda` (sm_80 for A100, sm_89 for L4, sm_90 for
    /// H100/H200): the PTX is written for it and runs on it and on newer GPUs.
    #[arg(long, value_name = "sm_NN", default_value = "sm_90")]
    pub cuda_arch: String,
    /// Write every intermediate form of the generated code: DIR/stage<i>/mlir/NN-<pass>.mlir
    /// after each pass of the MLIR pipeline, module.llvm.mlir and module.ll.
    #[arg(long)]
    pub keep_mlir: bool,
    #[command(flatten)]
    pub program: ProgramArgs,
}

fn load_profile(spec: &str) -> Result<DeviceProfile> {
    Ok(match spec {
        "host" => host_profile_cached(false)?,
        name if !name.ends_with(".json") => DeviceProfile::builtin(name)?,
        path => DeviceProfile::from_file(path)?,
    })
}

/// The default number of micro-batches: the largest divisor of `global` up to `2·p`.
fn default_microbatches(global: Option<u64>, p: usize) -> u64 {
    let cap = (2 * p).max(1) as u64;
    match global {
        Some(n) if n > 0 => (1..=cap.min(n)).rev().find(|d| n % d == 0).unwrap_or(1),
        _ => cap,
    }
}

pub fn compile(a: CompileArgs) -> Result<ExitCode> {
    let started = Instant::now();
    let model = a.model.clone().context("give the model to compile")?;
    let output = a
        .output
        .clone()
        .context("give the output directory with -o DIR")?;
    if a.stages == 0 {
        bail!("--stages must be at least 1");
    }
    check_output_dir(&output, a.force)?;
    let profile = load_profile(&a.device_profile)?;
    let memory_limit = a
        .memory_limit
        .as_deref()
        .map(|m| parse_bytes(m).map_err(|e| anyhow::anyhow!("--memory-limit: {e}")))
        .transpose()?;

    // The model's global batch decides the default number of micro-batches.
    let model_global = match a.program.batch {
        Some(b) => Some(b),
        None => {
            let imported = ppcc_frontends::onnx::import_onnx_file_full(
                &model,
                &ppcc_frontends::onnx::ImportOptions::default(),
            )
            .with_context(|| format!("importing {}", model.display()))?;
            crate::program::model_batch(&imported.module)?
        }
    };
    // The default number of micro-batches falls back to one when the model bakes its
    // batch size into a constant (each micro-batch then has the model's batch).
    let (microbatches, prepared) = match a.microbatches {
        Some(m) => (m, prepare(&model, &a.program, m)?),
        None => {
            let m = default_microbatches(model_global, a.stages);
            match prepare(&model, &a.program, m) {
                Ok(p) => (m, p),
                Err(e) if m > 1 => match prepare(&model, &a.program, 1) {
                    Ok(p) => {
                        eprintln!(
                            "note: using 1 micro-batch per step: {m} micro-batches do not fit the model ({e:#}); give --microbatches and --batch to choose"
                        );
                        (1, p)
                    }
                    Err(_) => return Err(e),
                },
                Err(e) => return Err(e),
            }
        }
    };

    // Schedule.
    let is_builtin = BUILTIN_NAMES.contains(&a.schedule.as_str());
    let chunks = a.chunks.unwrap_or(if a.schedule == "interleaved-1f1b" {
        2
    } else {
        1
    });
    if chunks == 0 {
        bail!("--chunks must be at least 1");
    }
    if a.chunks.is_some() && is_builtin && a.schedule != "interleaved-1f1b" && chunks != 1 {
        bail!("--chunks applies to interleaved-1f1b (and CSV schedules) only");
    }
    let spec = if is_builtin {
        ScheduleSpec::Builtin(a.schedule.clone())
    } else if a.schedule.ends_with(".csv") || Path::new(&a.schedule).exists() {
        let text = std::fs::read_to_string(&a.schedule)
            .with_context(|| format!("cannot read {}", a.schedule))?;
        let layout = match a.csv_layout {
            CsvLayoutArg::Interleaved => Layout::Interleaved {
                ranks: a.stages,
                chunks,
            },
            CsvLayoutArg::V => Layout::VShape { ranks: a.stages },
        };
        let s =
            from_csv(&text, layout).with_context(|| format!("invalid schedule {}", a.schedule))?;
        if s.num_microbatches as u64 != microbatches {
            bail!(
                "{} uses {} micro-batches, --microbatches is {microbatches}",
                a.schedule,
                s.num_microbatches
            );
        }
        ScheduleSpec::Custom(s)
    } else {
        bail!(
            "unknown schedule `{}` (built-in: {}; or a .csv file)",
            a.schedule,
            BUILTIN_NAMES.join(", ")
        );
    };
    let one_stage_per_device = matches!(&spec, ScheduleSpec::Builtin(n) if n != "zb-v" && !(n == "interleaved-1f1b" && chunks > 1));
    let kind = match a.partition {
        PartitionArg::Auto if one_stage_per_device => PartitionKind::Graph,
        PartitionArg::Auto => PartitionKind::Sequential,
        PartitionArg::Graph => PartitionKind::Graph,
        PartitionArg::Sequential => PartitionKind::Sequential,
        PartitionArg::Uniform => PartitionKind::Uniform,
    };

    let bar = spinner();
    bar.set_message("importing");
    let mut module = prepared.module;
    let optimizer = a.program.optimizer(microbatches)?;
    let optimizer_state = match optimizer.kind {
        OptimizerKind::Sgd if optimizer.momentum != 0.0 => 1.0,
        OptimizerKind::Sgd => 0.0,
        OptimizerKind::AdamW => 2.0,
    };
    let pinned: Vec<String> = a
        .stage_layout
        .as_deref()
        .map(|s| {
            s.split(',')
                .map(str::trim)
                .filter(|x| !x.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    let options = PlannerOptions {
        function: "main".into(),
        ranks: a.stages,
        microbatches: microbatches as usize,
        schedule: spec.clone(),
        chunks,
        partition: kind,
        profile: profile.clone(),
        memory_limit,
        pinned: pinned.clone(),
        autodiff: a.program.autodiff(),
        optimizer_state,
        op_timer: (a.target == Target::Cpu && profile.measure_ops).then(|| {
            // Partition by what the generated code takes, not the interpreter.
            // The plan and its sequential baseline cost the same training step: remember
            // the last answer (by the function's text).
            let weights = module.weights.clone();
            let memo: std::sync::Mutex<Option<(String, Option<OpTimes>)>> = Default::default();
            ppcc_passes::partition::OpTimer(std::sync::Arc::new(move |g: &ppir::Function| {
                let key = ppir::text::print_function(g);
                let mut memo = memo.lock().unwrap_or_else(|p| p.into_inner());
                if let Some((k, v)) = memo.as_ref() {
                    if *k == key {
                        return v.clone();
                    }
                }
                let v = crate::target::native_op_times(g, &weights)
                    .map_err(|e| {
                        eprintln!(
                            "note: timing ops with the interpreter instead of native code: {e:#}"
                        )
                    })
                    .ok();
                *memo = Some((key, v.clone()));
                v
            }))
        }),
    };
    bar.set_message(format!("planning ({} partition)", kind.name()));
    let plan_started = Instant::now();
    let mut best = plan(&module, &options)?;
    let plan_seconds = plan_started.elapsed().as_secs_f64();
    bar.set_message("planning the sequential baseline");
    let baseline = if kind == PartitionKind::Sequential {
        Ok(best.clone())
    } else {
        plan(
            &module,
            &PlannerOptions {
                partition: PartitionKind::Sequential,
                pinned: vec![],
                ..options.clone()
            },
        )
    };

    std::fs::create_dir_all(&output)
        .with_context(|| format!("cannot create {}", output.display()))?;
    let mut native_times: Option<Vec<[f64; 4]>> = None;
    let program = if a.plan_only {
        None
    } else {
        bar.set_message("building the training program");
        apply(&mut module, "main", &best.partition)?;
        let training = build_training(&mut module, &a.program, microbatches)?;
        let data = data_specs(&module, prepared.first_output.as_ref(), prepared.micro)?;
        bar.set_message("inserting send/recv");
        let split = split_stages(&mut module, &SplitOptions::default())?;
        check(&module, "the per-stage program")?;
        if split.stages.len() != best.partition.stages.len() {
            bail!(
                "the plan has {} stages but only {} of them do training work: the others hold only ops the loss does not depend on (outputs other than the first); use --stages {}",
                best.partition.stages.len(),
                split.stages.len(),
                split.stages.len()
            );
        }
        bar.set_message("writing");
        let mut stage_modules = vec![];
        for st in &split.stages {
            stage_modules.push(write_stage(&module, st, &output)?);
        }
        let cuda = match a.target {
            Target::Cuda => Some(ppcc_codegen::CudaOptions::new(&a.cuda_arch)?),
            _ => None,
        };
        if a.target.is_native() {
            let mut built_so = Vec::new();
            for (st, sm) in split.stages.iter().zip(&stage_modules) {
                bar.set_message(format!("generating code for stage {}", st.stage));
                let dir = output.join(format!("stage{}", st.stage));
                let built = build_module(
                    sm,
                    &[],
                    &dir,
                    &format!("stage {}", st.stage),
                    &BuildOptions {
                        keep_mlir: a.keep_mlir,
                        profile_ops: false,
                        cuda: cuda.clone(),
                        ..Default::default()
                    },
                )?;
                built_so.push(built.so);
            }
            if profile.name == "host" && cuda.is_none() {
                // All stages at once, one thread each, as `ppcc run` runs them: what a
                // function takes while the other cores work too (shared caches, memory
                // bandwidth, clock) is what the pipeline sees.
                bar.set_message("timing the stages' code");
                let weights = &module.weights;
                let times: Vec<Result<[f64; 4]>> = std::thread::scope(|scope| {
                    let handles: Vec<_> = split
                        .stages
                        .iter()
                        .zip(&stage_modules)
                        .zip(&built_so)
                        .map(|((st, sm), so)| scope.spawn(move || time_stage(so, sm, st, weights)))
                        .collect();
                    handles
                        .into_iter()
                        .map(|h| {
                            h.join()
                                .unwrap_or_else(|_| Err(anyhow::anyhow!("timing thread panicked")))
                        })
                        .collect()
                });
                native_times = Some(times.into_iter().collect::<Result<Vec<_>>>()?);
            }
        }
        Some((training, split, data))
    };
    // Predicting this machine with its native code: the plan's stage times become the
    // generated functions' measured times (the cost model's op sums chose the partition;
    // its own prediction stays in plan.json as `prediction_cost_model`).
    let model_prediction = native_times.as_ref().map(|_| prediction(&best));
    if let Some(times) = &native_times {
        let mut costs = best.costs.clone();
        for (s, t) in times.iter().enumerate() {
            if let Some(c) = costs.stages.get_mut(s) {
                c.forward = t[0];
                c.backward_input = t[1];
                c.backward_weight = t[2];
            }
        }
        costs.optimizer_step = times.iter().map(|t| t[3]).fold(0.0, f64::max);
        best.report = simulate(&best.schedule, &costs)
            .map_err(|e| anyhow::anyhow!("simulating the schedule with measured times: {e}"))?;
        let work: f64 = times.iter().map(|t| t[0] + t[1] + t[2]).sum();
        best.lower_bound = microbatches as f64 * work / a.stages as f64;
        best.costs = costs;
    }
    let write = |name: &str, text: String| -> Result<()> {
        let p = output.join(name);
        std::fs::write(&p, text).with_context(|| format!("cannot write {}", p.display()))
    };
    write("schedule.csv", to_csv(&best.schedule))?;
    let title = format!(
        "{} · {} · {} partition · {} devices × {microbatches} micro-batches ({})",
        model
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default(),
        spec.name(),
        kind.name(),
        a.stages,
        profile.name
    );
    write("timeline.svg", to_svg_seconds(&best.report, &title))?;
    write("trace.json", to_trace_json_seconds(&best.report))?;
    let mut plan_json = plan_json(&PlanDoc {
        a: &a,
        model: &model,
        microbatches,
        chunks,
        kind,
        profile: &profile,
        memory_limit: memory_limit.unwrap_or(profile.memory_bytes),
        plan: &best,
        baseline: &baseline,
        program: program.as_ref(),
        prepared_global: prepared.global,
        prepared_micro: prepared.micro,
        onnx_name: &prepared.onnx_name,
        weight_sources: &prepared.weight_sources,
        plan_seconds,
        native_times: native_times.as_deref(),
        model_prediction: model_prediction.clone(),
    });
    if let Some((_, split, _)) = &program {
        plan_json["files"] = file_records(&output, split.stages.len(), a.target.is_native())?;
    }
    write(
        "plan.json",
        serde_json::to_string_pretty(&plan_json).context("serializing plan.json")?,
    )?;
    bar.finish_and_clear();
    print_table(
        &model,
        &output,
        &a,
        kind,
        &spec,
        microbatches,
        &best,
        &baseline,
        program.as_ref().map(|p| &p.1),
        model_prediction
            .as_ref()
            .and_then(|v| v["iteration_seconds"].as_f64()),
    );
    let stages = match &program {
        Some((_, split, _)) => format!(
            "{}/stage0..{}/stage.ppir, ",
            output.display(),
            split.stages.len() - 1
        ),
        None => String::new(),
    };
    eprintln!(
        "wrote {0}/plan.json, {stages}{0}/schedule.csv, {0}/timeline.svg ({1:.1} s)",
        output.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(ExitCode::SUCCESS)
}

/// Refuse to write into an existing directory that is neither empty nor an earlier ppcc
/// build directory (`-o /`, `-o ~`): the plan and stage directories would be mixed with
/// other files, and replaced ones lost. `--force` writes anyway.
fn check_output_dir(dir: &Path, force: bool) -> Result<()> {
    let md = match std::fs::metadata(dir) {
        Ok(md) => md,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => bail!("cannot use {} as the output directory: {e}", dir.display()),
    };
    if !md.is_dir() {
        bail!(
            "{} exists and is not a directory; give a new or empty directory with -o",
            dir.display()
        );
    }
    let mut entries =
        std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))?;
    if entries.next().is_none() || force {
        return Ok(());
    }
    let plan = dir.join("plan.json");
    let has_plan = std::fs::read(&plan)
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .is_some_and(|v| v.get("format").and_then(Value::as_str) == Some("ppcc-plan"));
    // A compile that failed before writing plan.json leaves only ppcc's own names.
    let only_ours = || -> Result<bool> {
        for e in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
            let name = e?.file_name();
            let name = name.to_string_lossy();
            let ours = ["schedule.csv", "timeline.svg", "trace.json"].contains(&name.as_ref())
                || name
                    .strip_prefix("stage")
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
            if !ours {
                return Ok(false);
            }
        }
        Ok(true)
    };
    if !has_plan && !only_ours()? {
        bail!(
            "{} is not empty and is not a ppcc build directory (no plan.json written by ppcc): ppcc would write plan.json, schedule.csv, timeline.svg, trace.json and stage*/ among its files, replacing any of those names. Give a new or empty directory with -o, or pass --force to write there anyway",
            dir.display()
        );
    }
    Ok(())
}

/// The size and SHA-256 of every file of the build directory `ppcc run` loads, by path
/// relative to `dir` (plan.json's `files`).
fn file_records(dir: &Path, stages: usize, native: bool) -> Result<Value> {
    let mut files = serde_json::Map::new();
    for s in 0..stages {
        let mut names = vec!["stage.ppir", "params.npz"];
        if native {
            names.push("module.so");
        }
        for name in names {
            let rel = format!("stage{s}/{name}");
            let rec = FileRecord::of_file(&dir.join(&rel))?;
            files.insert(rel, json!({"bytes": rec.bytes, "sha256": rec.sha256}));
        }
    }
    Ok(Value::Object(files))
}

/// The data inputs of `@grad` (model inputs and labels; not `rng`) with their synthetic
/// distributions, per micro-batch.
fn data_specs(
    module: &Module,
    first_output: Option<&ppir::TensorType>,
    micro: u64,
) -> Result<Vec<InputSpec>> {
    let g = module
        .function("grad")
        .context("internal error: no @grad")?;
    // Every data array is cut into micro-batches along axis 0.
    for &(v, k) in g.args() {
        let name = &g.value(v).name;
        if k != ArgKind::Input || name == "rng" {
            continue;
        }
        let rows = g.ty(v).dims.first().and_then(|d| d.known());
        if rows != Some(micro) {
            let what = if name == "labels" {
                "the loss's labels (shaped like the model's output)".to_string()
            } else {
                format!("input %{name}")
            };
            match rows {
                Some(r) => bail!(
                    "{what} have {r} rows per micro-batch but a micro-batch has {micro}: the model does not keep the batch on axis 0 of its output (its batch size is fixed); compile with --batch {r} --microbatches 1"
                ),
                None => bail!(
                    "{what} have no batch axis (type {}): training needs the batch on axis 0 of every input and of the output",
                    g.ty(v)
                ),
            }
        }
    }
    let names: Vec<String> = g
        .args()
        .iter()
        .filter(|(_, k)| *k == ArgKind::Input)
        .map(|&(v, _)| g.value(v).name.clone())
        .filter(|n| n != "rng" && n != "labels")
        .collect();
    let mut specs = default_specs(g, &names, micro);
    if let Some(v) = g.find_value("labels") {
        specs.push(crate::train_cmd::label_spec(g.ty(v), first_output)?);
    }
    Ok(specs)
}

fn spinner() -> indicatif::ProgressBar {
    if std::io::stderr().is_terminal() {
        let pb = indicatif::ProgressBar::new_spinner();
        pb.enable_steady_tick(std::time::Duration::from_millis(120));
        pb
    } else {
        indicatif::ProgressBar::hidden()
    }
}

/// `DIR/stage<i>/stage.ppir` (functions, no weight values) and `params.npz`; returns the
/// stage's module.
fn write_stage(m: &Module, st: &ppcc_passes::split::StageFunctions, dir: &Path) -> Result<Module> {
    let mut names = vec![st.fwd.clone(), st.bwd_input.clone(), st.bwd_weight.clone()];
    names.extend(st.optim.clone());
    let mut sm = Module::new();
    sm.name = m.name.clone();
    let mut weights = std::collections::BTreeMap::new();
    for n in &names {
        let f = m
            .function(n)
            .with_context(|| format!("internal error: no @{n}"))?;
        for &(v, kind) in f.args() {
            if kind == ArgKind::Input {
                continue;
            }
            let name = &f.value(v).name;
            if let Some(t) = m.weights.get(name) {
                weights.insert(name.clone(), t.clone());
            }
        }
        sm.functions.push(f.clone());
    }
    let sdir = dir.join(format!("stage{}", st.stage));
    std::fs::create_dir_all(&sdir).with_context(|| format!("cannot create {}", sdir.display()))?;
    let p = sdir.join("stage.ppir");
    std::fs::write(&p, ppir::text::print_module(&sm, &Default::default()))
        .with_context(|| format!("cannot write {}", p.display()))?;
    let arrays: Vec<(String, ppir::Tensor)> = weights.into_iter().collect();
    let p = sdir.join("params.npz");
    write_npz(&p, &arrays).with_context(|| format!("cannot write {}", p.display()))?;
    // A stale module.so from an earlier compile must not be picked up.
    let _ = std::fs::remove_file(sdir.join("module.so"));
    Ok(sm)
}

type OpTimes = std::collections::HashMap<ppir::OpId, f64>;

struct PlanDoc<'a> {
    a: &'a CompileArgs,
    model: &'a Path,
    microbatches: u64,
    chunks: usize,
    kind: PartitionKind,
    profile: &'a DeviceProfile,
    memory_limit: f64,
    plan: &'a Plan,
    baseline: &'a Result<Plan, ppcc_passes::PassError>,
    program: Option<&'a (crate::program::Training, SplitInfo, Vec<InputSpec>)>,
    prepared_global: u64,
    prepared_micro: u64,
    onnx_name: &'a std::collections::HashMap<String, String>,
    weight_sources: &'a std::collections::BTreeMap<String, String>,
    plan_seconds: f64,
    /// Per stage: measured seconds of the native fwd, bwd_input, bwd_weight, optim.
    native_times: Option<&'a [[f64; 4]]>,
    model_prediction: Option<Value>,
}

fn prediction(p: &Plan) -> Value {
    json!({
        "iteration_seconds": p.report.makespan,
        "bubble_fraction": p.report.bubble_fraction,
        "lower_bound_seconds": p.lower_bound,
        "busy_seconds": p.report.busy,
        "peak_memory_bytes": p.report.peak_memory,
        "peak_stash_microbatches": p.report.peak_stash,
        "stage_graph_is_chain": p.partition.is_chain(),
        "stage_seconds": p.partition.stages.iter().map(|s| s.cost.time()).collect::<Vec<_>>(),
        "edges": p.partition.edges.iter().map(|e| json!({"from": e.from, "to": e.to, "bytes": e.bytes})).collect::<Vec<_>>(),
    })
}

fn plan_json(d: &PlanDoc) -> Value {
    let p = d.plan;
    let layout = &p.layout;
    let stages: Vec<Value> = p
        .partition
        .stages
        .iter()
        .enumerate()
        .map(|(s, st)| {
            let mut v = json!({
                "stage": s,
                "device": layout.rank_of(s),
                "chunk": layout.chunk_of(s),
                "ops": st.ops.len(),
                "first_op": st.first,
                "last_op": st.last,
                "forward_seconds": st.cost.f,
                "backward_input_seconds": st.cost.b,
                "backward_weight_seconds": st.cost.w,
                "activation_bytes_per_microbatch": st.cost.act_bytes,
                "param_bytes": st.cost.param_bytes,
            });
            if let Some(t) = d.native_times.and_then(|t| t.get(s)) {
                v["native_seconds"] = json!({
                    "fwd": t[0], "bwd_input": t[1], "bwd_weight": t[2], "optim": t[3],
                });
            }
            if let Some((_, split, _)) = d.program {
                let sf = &split.stages[s];
                v["functions"] = json!({
                    "fwd": sf.fwd, "bwd_input": sf.bwd_input, "bwd_weight": sf.bwd_weight, "optim": sf.optim,
                });
                v["params"] = json!(sf.params);
                v["dir"] = json!(format!("stage{s}"));
            }
            v
        })
        .collect();
    let mut predicted = prediction(p);
    predicted["stage_times"] = json!(if d.native_times.is_some() {
        "measured-native"
    } else {
        "cost-model"
    });
    let mut doc = json!({
        "format": "ppcc-plan",
        "version": PlanSpec::VERSION,
        "ppcc_version": env!("CARGO_PKG_VERSION"),
        "model": d.model.display().to_string(),
        "devices": d.a.stages,
        "virtual_stages": p.partition.stages.len(),
        "microbatches": d.microbatches,
        "global_batch": d.prepared_global,
        "micro_batch": d.prepared_micro,
        "schedule": {
            "name": d.a.schedule,
            "chunks": d.chunks,
            "file": "schedule.csv",
            "actions": p.schedule.per_rank.iter().map(|r| r.iter().map(|a| a.to_string()).collect::<Vec<_>>()).collect::<Vec<_>>(),
            "layout": match layout {
                Layout::Interleaved { chunks, .. } => json!({"kind": "interleaved", "chunks": chunks}),
                Layout::VShape { .. } => json!({"kind": "v"}),
                Layout::Dag { rank_of, edges, .. } => json!({"kind": "dag", "rank_of": rank_of, "edges": edges}),
            },
        },
        "partition": d.kind.name(),
        "device_profile": d.profile.name,
        "memory_limit_bytes": d.memory_limit,
        "planner_seconds": d.plan_seconds,
        "candidates": p.candidates.iter().map(|(chain, t)| json!({"stage_graph_is_chain": chain, "iteration_seconds": t})).collect::<Vec<_>>(),
        "stages": stages,
        "edges": p.partition.edges.iter().map(|e| [e.from, e.to]).collect::<Vec<_>>(),
        "prediction": predicted,
        "prediction_cost_model": d.model_prediction,
        "baseline": match d.baseline {
            Ok(b) => { let mut v = prediction(b); v["partition"] = json!("sequential"); v }
            Err(e) => json!({"partition": "sequential", "error": e.to_string()}),
        },
        "program": d.program.is_some(),
        "target": d.a.target.name(),
    });
    let Some((training, split, data)) = d.program else {
        return doc;
    };
    doc["channels"] = split
        .channels
        .iter()
        .map(|c| {
            json!({"id": c.id, "from": c.from, "to": c.to, "value": c.value,
                   "phase": c.phase.name(), "bytes": c.bytes})
        })
        .collect();
    let o = &training.optimizer;
    let info = &training.info;
    // The data the training program reads (per micro-batch types) and how synthetic
    // data draws it, in @grad's argument order.
    let grad_inputs: Vec<Value> = data
        .iter()
        .map(|spec| {
            json!({
                "name": spec.name,
                "onnx_name": d.onnx_name.get(&spec.name),
                "type": spec.ty.to_string(),
                "synthetic": match spec.dist {
                    Distribution::Normal => json!("normal"),
                    Distribution::Uniform { low, high } => json!({"uniform": [low, high]}),
                },
            })
        })
        .collect();
    doc["training"] = json!({
            "loss": info.loss_kind.name(),
            "train_mode": !d.a.program.eval_mode,
            "labels": info.labels.as_ref().map(|t| t.to_string()),
            "needs_rng": info.needs_rng_key,
            "inputs": grad_inputs,
            "params": info.params,
            "updated_states": info.updated_states,
            "weight_sources": d.weight_sources,
            "optimizer": {
                "kind": o.kind.name(), "lr": o.lr, "momentum": o.momentum,
                "weight_decay": o.weight_decay, "beta1": o.beta1, "beta2": o.beta2, "eps": o.eps,
                "microbatches": o.microbatches,
            },
    });
    doc["phases"] = json!([
        Phase::Fwd.name(),
        Phase::BwdInput.name(),
        Phase::BwdWeight.name(),
        Phase::Optim.name()
    ]);
    doc
}

fn ms(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.3} s")
    } else if s >= 1e-3 {
        format!("{:.3} ms", s * 1e3)
    } else {
        format!("{:.1} us", s * 1e6)
    }
}

#[allow(clippy::too_many_arguments)]
fn print_table(
    model: &Path,
    output: &Path,
    a: &CompileArgs,
    kind: PartitionKind,
    spec: &ScheduleSpec,
    m: u64,
    p: &Plan,
    baseline: &Result<Plan, ppcc_passes::PassError>,
    split: Option<&SplitInfo>,
    model_makespan: Option<f64>,
) {
    println!(
        "{} -> {}: {} devices, {} stages, {m} micro-batches, schedule {}, {} partition",
        model.display(),
        output.display(),
        a.stages,
        p.partition.stages.len(),
        spec.name(),
        kind.name()
    );
    println!(
        "{:>5} {:>6} {:>5} {:>10} {:>10} {:>10} {:>10} {:>10}  first .. last op",
        "stage", "device", "ops", "F", "B", "W", "params", "stash/mb"
    );
    for (s, st) in p.partition.stages.iter().enumerate() {
        println!(
            "{:>5} {:>6} {:>5} {:>10} {:>10} {:>10} {:>10} {:>10}  {} .. {}",
            s,
            p.layout.rank_of(s),
            st.ops.len(),
            ms(st.cost.f),
            ms(st.cost.b),
            ms(st.cost.w),
            human_bytes(st.cost.param_bytes),
            human_bytes(st.cost.act_bytes),
            st.first,
            st.last
        );
    }
    let edges: Vec<String> = p
        .partition
        .edges
        .iter()
        .map(|e| format!("{}->{} ({})", e.from, e.to, human_bytes(e.bytes)))
        .collect();
    let channels = match split {
        Some(s) => format!("; {} send/recv channels", s.channels.len()),
        None => String::new(),
    };
    println!(
        "stage graph: {}{}{channels}",
        if edges.is_empty() {
            "no edges".to_string()
        } else {
            edges.join(", ")
        },
        if p.partition.is_chain() {
            " (a chain)"
        } else {
            " (a DAG)"
        }
    );
    let peak = p.report.peak_memory.iter().copied().fold(0.0, f64::max);
    println!(
        "predicted: iteration {}, bubble {:.1}%, lower bound {}, peak memory {}",
        ms(p.report.makespan),
        100.0 * p.report.bubble_fraction,
        ms(p.lower_bound),
        human_bytes(peak)
    );
    // The baseline is only planned (cost model): compare it with this plan's cost-model
    // prediction, not with the stage times measured on generated code.
    let mine = model_makespan.unwrap_or(p.report.makespan);
    match baseline {
        Ok(b) if kind != PartitionKind::Sequential => println!(
            "sequential baseline: iteration {}, bubble {:.1}% ({:.2}x {}{})",
            ms(b.report.makespan),
            100.0 * b.report.bubble_fraction,
            if mine > 0.0 {
                b.report.makespan / mine
            } else {
                1.0
            },
            if b.report.makespan >= mine {
                "speed-up of this plan"
            } else {
                "i.e. this plan is slower"
            },
            if model_makespan.is_some() {
                format!(
                    ", both by the cost model, which predicts this plan at {}",
                    ms(mine)
                )
            } else {
                String::new()
            }
        ),
        Ok(_) => {}
        Err(e) => println!("sequential baseline: {e}"),
    }
}

/// Measured seconds of a stage's native F, I, W and optim actions (0 without an optimizer)
/// run as `ppcc run` runs them (`ppcc_runtime::pipeline::time_actions`), the module at `so`
/// generated for `sm`, on the initial weights and synthetic data.
fn time_stage(
    so: &Path,
    sm: &Module,
    st: &ppcc_passes::split::StageFunctions,
    weights: &std::collections::BTreeMap<String, ppir::Tensor>,
) -> Result<[f64; 4]> {
    let native = ppcc_runtime::native::NativeModule::load(so, sm, None)
        .with_context(|| format!("loading stage {}'s module", st.stage))?;
    let mut stage = ppcc_runtime::native::NativeStage::new(sm.clone(), native);
    let mut own = std::collections::HashMap::new();
    for f in &sm.functions {
        for &(v, kind) in f.args() {
            let name = &f.value(v).name;
            if kind != ArgKind::Input {
                if let Some(t) = weights.get(name) {
                    own.insert(name.clone(), t.clone());
                }
            }
        }
    }
    let mut comm = crate::target::NullComm;
    ppcc_runtime::pipeline::time_actions(
        &mut stage,
        [&st.fwd, &st.bwd_input, &st.bwd_weight],
        st.optim.as_deref(),
        &own,
        &crate::target::synthetic,
        &mut comm,
        6,
    )
    .map_err(|e| anyhow::anyhow!("timing stage {}: {e}", st.stage))
}
