//! The compile pipeline (`ppcc MODEL.onnx -o DIR`): a model into a build directory.
//!
//! Import → bind the micro-batch → plan (cost model, partition, schedule, simulation; the
//! sequential partition as a baseline) → stage tags on `@main` → training program
//! (`@grad`, `@optim`) → per-stage functions joined by send/recv (`insert-send-recv`) →
//! verify → codegen → write DIR:
//!
//! ```text
//! DIR/plan.json            the plan (ppcc_plan::Plan): stages, devices, stage DAG edges and
//!                          channels, schedule, predicted time/bubble/memory, the sequential
//!                          baseline, training options, sizes and hashes of the stage files
//! DIR/stage<i>/stage.ppir  stage i's functions (fwd, bwd_input, bwd_weight, optim)
//! DIR/stage<i>/params.npz  initial values of stage i's params and states
//! DIR/stage<i>/module.so   stage i's native code (--target cpu)
//! DIR/schedule.csv         the schedule in torch.distributed.pipelining's CSV format
//! DIR/schedule.pps         the schedule in ppcc's schedule language (a listing per device)
//! DIR/timeline.svg         the predicted timeline (one lane per device)
//! DIR/trace.json           the predicted timeline as a Chrome/Perfetto trace
//! ```
//!
//! The steps that leave an IR module behind are named [`Point`]s: a [`Compiler`] can dump
//! the module after any of them ([`Compiler::dump_after`]) and run extra passes there
//! ([`Compiler::insert_pass`], [`Compiler::insert_fn`]), like MLIR's
//! `--mlir-print-ir-after` and pass pipelines. [`Compiler::pipeline`] lists the steps.

use crate::target::Target;
use ppcc_codegen::{build_module, BuildOptions};
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::error::{bail, invalid, Context, DriverError, Result};
use ppcc_passes::cost::{host_profile_cached, DeviceProfile};
use ppcc_passes::optim::OptimizerKind;
use ppcc_passes::partition::{apply, parse_bytes, PartitionCache, PartitionKind};
use ppcc_passes::planner::{plan, plan_with, Plan, PlannerOptions, ScheduleSpec};
pub use ppcc_passes::recompute::RecomputeMode;
use ppcc_passes::schedule::csv::{from_csv, to_csv_as};
use ppcc_passes::schedule::pps::{read_pps, to_pps, PpsParams};
use ppcc_passes::schedule::{Layout, BUILTIN_NAMES};
use ppcc_passes::simulate::{simulate, to_svg_seconds, to_trace_json_seconds};
use ppcc_passes::split::{split_stages, SplitInfo, SplitOptions};
use ppcc_passes::{Pass, PassError};
use ppcc_plan as doc;
use ppcc_runtime::integrity::record_of_file;
use ppir::{ArgKind, Module, Phase};

use crate::program::{build_training, check, prepare, ProgramOptions};
use ppcc_runtime::data::default_specs;
use ppcc_runtime::npz::write_npz;
use ppcc_runtime::{Distribution, InputSpec};

/// Which partitioner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum PartitionChoice {
    /// `graph` when the schedule runs one stage per device, else `sequential`.
    Auto,
    /// GraphPipe: a stage DAG; parallel branches run on different devices at once.
    Graph,
    /// PipeDream: the best chain of stages (dynamic programming over a topological order).
    Sequential,
    /// Equal numbers of layers with weights per stage.
    Uniform,
}

/// What `DIR/schedule.csv` lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum CsvFormat {
    /// Compute actions only (torch.distributed.pipelining's default `compute_only`).
    #[cfg_attr(feature = "clap", value(name = "compute_only"))]
    ComputeOnly,
    /// Compute actions and the sends/receives (`compute_comms`), plus ppcc's `OPT`.
    #[cfg_attr(feature = "clap", value(name = "compute_comms"))]
    ComputeComms,
}

/// How a CSV schedule's virtual stages map to devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum CsvLayout {
    /// From the cells, as torch does: the row a stage appears in is its device (an
    /// interleaved chain or a V; see `ppcc_passes::schedule::csv::infer_layout`).
    Auto,
    /// Virtual stage c·P + r on device r (`--chunks 1`: a plain chain).
    Interleaved,
    /// Two chunks in a V (ZB-V).
    V,
}

/// What to compile and how (the options of `ppcc MODEL -o DIR`).
#[derive(Clone, Debug)]
pub struct CompileOptions {
    /// The ONNX model (float initializers are the trained parameters).
    pub model: PathBuf,
    /// The build directory (created; existing plan files in it are replaced). An existing
    /// directory must be empty or an earlier build directory, unless `force`.
    pub output: PathBuf,
    pub force: bool,
    /// Devices (pipeline ranks), P.
    pub stages: usize,
    /// Data-parallel replicas of the pipeline, D (P·D workers in all).
    pub data_parallel: usize,
    /// ZeRO-1: shard the optimizer state across the replicas (see
    /// [`ppcc_passes::split::SplitOptions::zero`]).
    pub zero: bool,
    /// Choose P × D for this many devices (`stages` and `data_parallel` are then chosen).
    pub devices: Option<usize>,
    /// Micro-batches per step, M. `None`: the largest divisor of the global batch up to 2·P.
    pub microbatches: Option<u64>,
    /// Choose M: plan every divisor of the global batch up to 8·P and keep the shortest
    /// predicted iteration that fits the memory limit (`microbatches` is then ignored).
    pub microbatches_auto: bool,
    /// A built-in schedule or a torch CSV file.
    pub schedule: String,
    pub partition: PartitionChoice,
    /// Stages per device for interleaved-1f1b (V).
    pub chunks: Option<usize>,
    pub csv_layout: CsvLayout,
    /// What `DIR/schedule.csv` lists (compute actions only by default).
    pub csv_format: CsvFormat,
    /// h100, a100, host, or a profile JSON file.
    pub device_profile: String,
    /// Memory per device (bytes; suffixes K, M, G, KiB, MiB, GiB). `None`: the profile's.
    pub memory_limit: Option<String>,
    /// Comma-separated ONNX node names (or value names) that must start a stage.
    pub stage_layout: Option<String>,
    /// Write only the plan, not the per-stage programs.
    pub plan_only: bool,
    pub target: Target,
    /// The GPU architecture of [`Target::Cuda`] (`sm_90`, `sm_80`, ...).
    pub cuda_arch: String,
    /// Who computes matrix products on [`Target::Cuda`]; `None`: generated kernels (given
    /// with another target, refused).
    pub gpu_gemm: Option<ppcc_codegen::GpuGemm>,
    /// Test hook (`--gpu-loops-on-cpu`, with [`Target::Cpu`]): each stage's CPU code is made
    /// from the loops the CUDA target turns into kernels, and its matrix products as
    /// `gpu_gemm` has them, so a whole model trains on the CPU through the CUDA target's
    /// lowering.
    pub gpu_loops_on_cpu: bool,
    /// Keep every intermediate form of the generated code.
    pub keep_mlir: bool,
    /// Ops to split into pieces before partitioning (`NODE=K[:AXIS],...`).
    pub split: Option<String>,
    /// Which activations the backward recomputes instead of stashing.
    pub recompute: RecomputeMode,
    pub program: ProgramOptions,
}

impl CompileOptions {
    /// The command line's defaults for `model` into `output`.
    pub fn new(model: impl Into<PathBuf>, output: impl Into<PathBuf>) -> Self {
        CompileOptions {
            model: model.into(),
            output: output.into(),
            force: false,
            stages: 2,
            data_parallel: 1,
            zero: false,
            devices: None,
            microbatches: None,
            microbatches_auto: false,
            schedule: "1f1b".into(),
            partition: PartitionChoice::Auto,
            chunks: None,
            csv_layout: CsvLayout::Auto,
            csv_format: CsvFormat::ComputeOnly,
            device_profile: "h100".into(),
            memory_limit: None,
            stage_layout: None,
            plan_only: false,
            target: Target::Cpu,
            cuda_arch: "sm_90".into(),
            gpu_gemm: None,
            gpu_loops_on_cpu: false,
            keep_mlir: false,
            split: None,
            recompute: RecomputeMode::Auto,
            program: ProgramOptions::default(),
        }
    }
}

/// A step of the compile pipeline that leaves an IR module behind: a place to dump it
/// (`--dump-after POINT`) or to run extra passes on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Point {
    /// The imported model, its batch bound to the micro-batch size (`@main`).
    Import,
    /// `@main` after the e-graph rewriter (`--split`): split ops and their weights.
    Rewrite,
    /// `@main` with every op tagged with its stage by the chosen partition.
    Partition,
    /// `@grad` (autodiff, loss appended), `@optim` and `@accumulate` added.
    TrainingProgram,
    /// The per-stage functions joined by send/recv, verified.
    Split,
}

impl Point {
    /// Every point, in pipeline order.
    pub const ALL: [Point; 5] = [
        Point::Import,
        Point::Rewrite,
        Point::Partition,
        Point::TrainingProgram,
        Point::Split,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Point::Import => "import",
            Point::Rewrite => "rewrite",
            Point::Partition => "partition",
            Point::TrainingProgram => "training-program",
            Point::Split => "split",
        }
    }

    /// Position in the pipeline's steps, from 1 (the `<n>` of `--dump-dir` file names).
    pub fn number(self) -> usize {
        STEPS
            .iter()
            .position(|s| s.point == Some(self))
            .map_or(0, |i| i + 1)
    }
}

impl std::fmt::Display for Point {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Point {
    type Err = DriverError;

    fn from_str(s: &str) -> Result<Point> {
        Point::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| DriverError::UnknownPoint { name: s.into() })
    }
}

/// One step of the compile pipeline, as [`Compiler::pipeline`] lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    pub name: &'static str,
    pub description: &'static str,
    /// The point after this step, if it leaves a module.
    pub point: Option<Point>,
    /// Skipped with `--plan-only`.
    pub needs_program: bool,
}

/// The steps of the compile pipeline, in order.
pub const STEPS: [Step; 8] = [
    Step {
        name: "import",
        description: "import the ONNX model; bind its batch to the micro-batch size",
        point: Some(Point::Import),
        needs_program: false,
    },
    Step {
        name: "rewrite",
        description: "e-graph rewriting (egg): split the --split ops into pieces, their weights into one parameter per piece",
        point: Some(Point::Rewrite),
        needs_program: false,
    },
    Step {
        name: "partition",
        description: "cost model, partition into stages, schedule, simulation (and the sequential baseline); tag @main's ops with their stage",
        point: Some(Point::Partition),
        needs_program: false,
    },
    Step {
        name: "training-program",
        description: "autodiff (@grad, loss appended), optimizer (@optim, @accumulate)",
        point: Some(Point::TrainingProgram),
        needs_program: true,
    },
    Step {
        name: "split",
        description: "per-stage functions joined by send/recv (insert-send-recv); verify",
        point: Some(Point::Split),
        needs_program: true,
    },
    Step {
        name: "write-stages",
        description: "DIR/stage<i>/stage.ppir and params.npz",
        point: None,
        needs_program: true,
    },
    Step {
        name: "codegen",
        description: "DIR/stage<i>/module.so through MLIR and LLVM (--target cpu; --target cuda adds the PTX kernels); timed with --device-profile host",
        point: None,
        needs_program: true,
    },
    Step {
        name: "write-plan",
        description: "DIR/plan.json, schedule.csv, schedule.pps, timeline.svg, trace.json",
        point: None,
        needs_program: false,
    },
];

/// What a compile reports while it works.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// What it is doing now (for a spinner).
    Progress(String),
    /// A remark for the user (a fallback it chose).
    Note(String),
    /// The module's text after `point` (`dump_after` without a dump directory).
    Dump { point: Point, text: String },
}

/// A closure run as a module pass.
pub type PassFn<'a> = Box<dyn FnMut(&mut Module) -> Result<(), PassError> + 'a>;

/// An extra pass at a point: a registered [`Pass`] or a closure.
enum Inserted<'a> {
    Pass(Box<dyn Pass + 'a>),
    Fn { name: String, f: PassFn<'a> },
}

impl Inserted<'_> {
    fn name(&self) -> &str {
        match self {
            Inserted::Pass(p) => p.name(),
            Inserted::Fn { name, .. } => name,
        }
    }

    fn run(&mut self, m: &mut Module) -> Result<(), PassError> {
        match self {
            Inserted::Pass(p) => p.run(m),
            Inserted::Fn { f, .. } => f(m),
        }
    }
}

/// What a compile produced (for the summary the CLI prints).
pub struct Compiled {
    pub model: PathBuf,
    pub output: PathBuf,
    pub devices: usize,
    pub microbatches: u64,
    pub schedule: ScheduleSpec,
    pub partition: PartitionKind,
    /// The plan, with stage times measured on the generated code when they were.
    pub plan: Plan,
    /// The sequential partition, planned as a baseline.
    pub baseline: Result<Plan, PassError>,
    /// The send/recv split (`None` with `plan_only`).
    pub split: Option<SplitInfo>,
    /// The cost model's iteration time when `plan` has measured stage times.
    pub cost_model_iteration: Option<f64>,
    /// What was written to `output/plan.json`.
    pub plan_doc: doc::Plan,
    pub seconds: f64,
}

/// The compile pipeline for one model, with its dumps and extra passes.
pub struct Compiler<'a> {
    options: CompileOptions,
    inserted: Vec<(Point, Inserted<'a>)>,
    dumps: Vec<Point>,
    dump_dir: Option<PathBuf>,
    events: Box<dyn FnMut(Event) + 'a>,
}

impl<'a> Compiler<'a> {
    pub fn new(options: CompileOptions) -> Self {
        Compiler {
            options,
            inserted: vec![],
            dumps: vec![],
            dump_dir: None,
            events: Box::new(|_| {}),
        }
    }

    pub fn options(&self) -> &CompileOptions {
        &self.options
    }

    /// Run `pass` on the module after `point` (after the passes inserted there before).
    /// The module must verify after it.
    pub fn insert_pass(&mut self, point: Point, pass: Box<dyn Pass + 'a>) -> &mut Self {
        self.inserted.push((point, Inserted::Pass(pass)));
        self
    }

    /// Run the closure `f`, named `name` in errors and listings, on the module after
    /// `point`.
    pub fn insert_fn(
        &mut self,
        point: Point,
        name: impl Into<String>,
        f: impl FnMut(&mut Module) -> Result<(), PassError> + 'a,
    ) -> &mut Self {
        self.inserted.push((
            point,
            Inserted::Fn {
                name: name.into(),
                f: Box::new(f),
            },
        ));
        self
    }

    /// Report the module's text after `point` (and the passes inserted there): as an
    /// [`Event::Dump`], or into the dump directory.
    pub fn dump_after(&mut self, point: Point) -> &mut Self {
        if !self.dumps.contains(&point) {
            self.dumps.push(point);
        }
        self
    }

    /// Write dumps to `dir/<n>-<point>.ppir` instead of reporting them.
    pub fn dump_dir(&mut self, dir: impl Into<PathBuf>) -> &mut Self {
        self.dump_dir = Some(dir.into());
        self
    }

    /// Receive progress, notes and dumps.
    pub fn on_event(&mut self, f: impl FnMut(Event) + 'a) -> &mut Self {
        self.events = Box::new(f);
        self
    }

    /// The steps this compile runs, in order, each with the passes inserted after it.
    pub fn pipeline(&self) -> Vec<(Step, Vec<String>)> {
        STEPS
            .iter()
            .filter(|s| !(self.options.plan_only && s.needs_program))
            .filter(|s| s.name != "codegen" || self.options.target.is_native())
            .map(|s| {
                let passes = self
                    .inserted
                    .iter()
                    .filter(|(p, _)| Some(*p) == s.point)
                    .map(|(_, i)| i.name().to_string())
                    .collect();
                (*s, passes)
            })
            .collect()
    }

    /// [`Compiler::pipeline`] as text: one line per step, `[point]` on the steps a dump or
    /// a pass can follow, inserted passes indented below their point.
    pub fn print_pipeline(&self) -> String {
        let mut out = String::new();
        for (step, passes) in self.pipeline() {
            let mark = if step.point.is_some() { "[point]" } else { "" };
            out.push_str(&format!(
                "{:<17} {:<8}{}\n",
                step.name, mark, step.description
            ));
            for p in passes {
                out.push_str(&format!("  + pass {p}\n"));
            }
        }
        out
    }

    /// Run the pipeline: write the build directory.
    pub fn run(mut self) -> Result<Compiled> {
        if let Some(n) = self.options.devices.take() {
            let (p, d) = choose_devices(&mut self, n)?;
            self.options.stages = p;
            self.options.data_parallel = d;
        }
        if self.options.microbatches_auto {
            let m = choose_microbatches(&mut self)?;
            self.options.microbatches = Some(m);
            self.options.microbatches_auto = false;
        }
        run_pipeline(&mut self)
    }

    fn progress(&mut self, what: impl Into<String>) {
        let what = what.into();
        crate::crash::set_step(&what);
        (self.events)(Event::Progress(what));
    }

    /// The passes inserted at `point`, then the dump of the result.
    fn at_point(&mut self, point: Point, m: &mut Module) -> Result<()> {
        for (p, pass) in self.inserted.iter_mut().filter(|(p, _)| *p == point) {
            let name = pass.name().to_string();
            let _step = crate::crash::StepGuard::new(&format!(
                "running the pass `{name}` inserted after `{}`",
                p.name()
            ));
            pass.run(m).map_err(|source| DriverError::InsertedPass {
                pass: name.clone(),
                point: p.name(),
                source,
            })?;
            ppir::verify::verify_module(m).map_err(|errors| DriverError::InsertedPass {
                pass: name.clone(),
                point: p.name(),
                source: PassError::Verify {
                    context: format!("the module after pass `{name}` does not verify"),
                    errors,
                },
            })?;
        }
        if self.dumps.contains(&point) {
            let text = ppir::text::print_module(m, &Default::default());
            match &self.dump_dir {
                Some(dir) => {
                    std::fs::create_dir_all(dir)
                        .with_context(|| format!("cannot create {}", dir.display()))?;
                    let p = dir.join(format!("{}-{}.ppir", point.number(), point.name()));
                    std::fs::write(&p, text)
                        .with_context(|| format!("cannot write {}", p.display()))?;
                }
                None => (self.events)(Event::Dump { point, text }),
            }
        }
        Ok(())
    }
}

fn load_profile(spec: &str) -> Result<DeviceProfile> {
    Ok(match spec {
        "host" => host_profile_cached(false)?,
        name if !name.ends_with(".json") => DeviceProfile::builtin(name)?,
        path => DeviceProfile::from_file(path)?,
    })
}

/// The default number of micro-batches: the largest divisor of `global` up to `2·p`.
/// `--devices N`: plan (`--plan-only`, in a scratch directory) every P stages × D
/// replicas with P·D = N (D dividing the global batch) and return the (P, D) with the
/// shortest predicted step; say what was compared. Every candidate trains on the same
/// global batch, so the shortest step is the highest throughput.
fn choose_devices(c: &mut Compiler, n: usize) -> Result<(usize, usize)> {
    if n == 0 {
        bail!("--devices must be at least 1");
    }
    let a = c.options.clone();
    let global = match a.program.batch {
        Some(b) => Some(b),
        None => {
            let imported = ppcc_frontends::onnx::import_onnx_file_full(
                &a.model,
                &ppcc_frontends::onnx::ImportOptions::default(),
            )
            .with_context(|| format!("importing {}", a.model.display()))?;
            crate::program::model_batch(&imported.module)?
        }
    };
    let Some(global) = global.filter(|&g| g > 0) else {
        bail!("--devices needs the global batch: give --batch (the model's batch dimension is symbolic)");
    };
    let scratch = std::env::temp_dir().join(format!("ppcc-devices-{}", std::process::id()));
    // (P, D) → the predicted step and peak memory, or why it does not plan.
    type Tried = ((usize, usize), std::result::Result<(f64, f64), String>);
    let mut tried: Vec<Tried> = vec![];
    for d in (1..=n).filter(|d| n.is_multiple_of(*d)) {
        let p = n / d;
        if !global.is_multiple_of(d as u64) {
            tried.push((
                (p, d),
                Err(format!(
                    "{d} replicas do not divide the global batch {global}"
                )),
            ));
            continue;
        }
        c.progress(format!("--devices {n}: planning {p} stages × {d} replicas"));
        let mut o = a.clone();
        o.stages = p;
        o.data_parallel = d;
        o.devices = None;
        o.plan_only = true;
        o.force = true;
        o.output = scratch.join(format!("p{p}d{d}"));
        o.program.batch = Some(global);
        let result = Compiler::new(o).run();
        tried.push((
            (p, d),
            result
                .map(|r| {
                    let peak = r
                        .plan
                        .report
                        .peak_memory
                        .iter()
                        .copied()
                        .fold(0.0, f64::max);
                    (r.plan.report.makespan, peak)
                })
                .map_err(|e| crate::error_chain(&e)),
        ));
    }
    let _ = std::fs::remove_dir_all(&scratch);
    let best = tried
        .iter()
        .filter_map(|(pd, r)| r.as_ref().ok().map(|t| (*pd, t.0)))
        .min_by(|x, y| x.1.total_cmp(&y.1));
    let mut lines = vec![format!(
        "--devices {n}: global batch {global}, stages × replicas compared"
    )];
    for ((p, d), r) in &tried {
        lines.push(match r {
            Ok((t, peak)) => format!(
                "  {p:>3} × {d:<3} predicted step {:.3} ms, {:.0} rows/s, peak memory {:.1} MiB{}",
                t * 1e3,
                global as f64 / t,
                peak / (1u64 << 20) as f64,
                if best.map(|b| b.0) == Some((*p, *d)) {
                    "  <- chosen"
                } else {
                    ""
                }
            ),
            Err(e) => format!(
                "  {p:>3} × {d:<3} does not plan: {}",
                e.lines().next().unwrap_or("")
            ),
        });
    }
    (c.events)(Event::Note(lines.join("\n")));
    match best {
        Some((pd, _)) => Ok(pd),
        None => bail!(
            "--devices {n}: no split into stages × replicas plans:\n{}",
            lines[1..].join("\n")
        ),
    }
}

/// `--microbatches auto`: plan (`--plan-only`, `--split off`, in a scratch directory) with
/// every divisor M of the global batch up to 8·P and return the one with the shortest
/// predicted iteration; say what was compared.
fn choose_microbatches(c: &mut Compiler) -> Result<u64> {
    let a = c.options.clone();
    let global = match a.program.batch {
        Some(b) => Some(b),
        None => {
            let (imported, _) = crate::model::import_model(
                &a.model,
                a.program.params.as_deref(),
                &ppcc_frontends::onnx::ImportOptions::default(),
            )?;
            crate::program::model_batch(&imported.module)?
        }
    };
    let Some(global) = global.filter(|&g| g > 0) else {
        bail!("--microbatches auto needs the global batch: give --batch (the model's batch dimension is symbolic)");
    };
    let cap = (8 * a.stages.max(1)) as u64;
    let scratch = std::env::temp_dir().join(format!("ppcc-microbatches-{}", std::process::id()));
    let mut tried: Vec<(u64, std::result::Result<f64, String>)> = vec![];
    // Each replica's share of the global batch is what its micro-batches divide.
    let replicas = a.data_parallel.max(1) as u64;
    let share = global / replicas;
    for m in (1..=share.min(cap)).filter(|m| share.is_multiple_of(*m)) {
        c.progress(format!(
            "--microbatches auto: planning {m} micro-batches of {} rows",
            share / m
        ));
        let mut o = a.clone();
        o.microbatches = Some(m);
        o.microbatches_auto = false;
        o.plan_only = true;
        o.force = true;
        o.split = Some("off".into());
        o.output = scratch.join(format!("m{m}"));
        o.program.batch = Some(global);
        let result = Compiler::new(o).run();
        tried.push((
            m,
            result
                .map(|r| r.plan.report.makespan)
                .map_err(|e| crate::error_chain(&e)),
        ));
    }
    let _ = std::fs::remove_dir_all(&scratch);
    let best = tried
        .iter()
        .filter_map(|(m, r)| r.as_ref().ok().map(|t| (*m, *t)))
        .min_by(|a, b| a.1.total_cmp(&b.1));
    let mut lines = vec![format!(
        "--microbatches auto: global batch {global} on {} devices",
        a.stages
    )];
    for (m, r) in &tried {
        lines.push(match r {
            Ok(t) => format!(
                "  {m:>4} × {:>5} rows: predicted iteration {:.3} ms{}",
                share / m,
                t * 1e3,
                if best.map(|b| b.0) == Some(*m) {
                    "  <- chosen"
                } else {
                    ""
                }
            ),
            Err(e) => format!(
                "  {m:>4} × {:>5} rows: does not plan: {}",
                share / m,
                e.lines().next().unwrap_or("")
            ),
        });
    }
    (c.events)(Event::Note(lines.join("\n")));
    match best {
        Some((m, _)) => Ok(m),
        None => bail!(
            "--microbatches auto: no number of micro-batches plans for a global batch of {global}:\n{}",
            lines[1..].join("\n")
        ),
    }
}

/// The gradient all-reduce of a data-parallel step on the simulated `report`: (the longest
/// time a device spends all-reducing, the time it adds to the step). Each virtual stage's
/// gradients (its weight bytes) are all-reduced over `n` replicas by a ring — `2(n−1)/n ·
/// bytes / bandwidth + 2(n−1) · latency` — starting when the stage's last weight-gradient
/// action (`W` or `B`) ends, after the device's earlier all-reduces; the device's optimizer
/// step starts when its compute and its all-reduces are both done.
fn data_parallel_step(
    schedule: &ppcc_passes::schedule::Schedule,
    costs: &ppcc_passes::simulate::CostTable,
    report: &ppcc_passes::simulate::SimReport,
    n: f64,
    profile: &ppcc_passes::cost::DeviceProfile,
) -> (f64, f64) {
    use ppcc_passes::schedule::ActionKind;
    let ring = |bytes: f64| {
        2.0 * (n - 1.0) / n * bytes / profile.link_bandwidth
            + 2.0 * (n - 1.0) * profile.link_latency
    };
    let mut longest = 0.0f64;
    let mut end = report.makespan;
    for (r, events) in report.events.iter().enumerate() {
        let is_opt = |k: ActionKind| k == ActionKind::OptimizerStep;
        let mut ready: Vec<(f64, f64)> = (0..costs.stages.len())
            .filter(|&s| schedule.layout.rank_of(s) == r)
            .map(|s| {
                let done = events
                    .iter()
                    .filter(|e| {
                        e.action.stage == s
                            && matches!(
                                e.action.kind,
                                ActionKind::BackwardWeight | ActionKind::FullBackward
                            )
                    })
                    .map(|e| e.end)
                    .fold(0.0, f64::max);
                (done, costs.stages[s].weight_memory)
            })
            .collect();
        ready.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (mut t, mut busy) = (0.0f64, 0.0f64);
        for (done, bytes) in ready {
            t = t.max(done) + ring(bytes);
            busy += ring(bytes);
        }
        longest = longest.max(busy);
        let compute_end = events
            .iter()
            .filter(|e| !is_opt(e.action.kind))
            .map(|e| e.end)
            .fold(0.0, f64::max);
        let optimizer: f64 = events
            .iter()
            .filter(|e| is_opt(e.action.kind))
            .map(|e| e.end - e.start)
            .sum();
        end = end.max(compute_end.max(t) + optimizer);
    }
    (longest, (end - report.makespan).max(0.0))
}

/// The replicas the optimizer state is sharded over: D with `--zero 1`, else 1.
fn zero_shards(a: &CompileOptions) -> usize {
    if a.zero {
        a.data_parallel.max(1)
    } else {
        1
    }
}

fn default_microbatches(global: Option<u64>, p: usize) -> u64 {
    let cap = (2 * p).max(1) as u64;
    match global {
        Some(n) if n > 0 => (1..=cap.min(n)).rev().find(|d| n % d == 0).unwrap_or(1),
        _ => cap,
    }
}

fn run_pipeline(c: &mut Compiler) -> Result<Compiled> {
    let a = c.options.clone();
    let started = Instant::now();
    let model = a.model.clone();
    let output = a.output.clone();
    if a.stages == 0 {
        bail!("--stages must be at least 1");
    }
    let replicas = a.data_parallel as u64;
    if replicas == 0 {
        bail!("--data-parallel must be at least 1");
    }
    // Refused before anything is read or written.
    let cuda = match a.target {
        Target::Cuda => Some(ppcc_codegen::CudaOptions {
            gemm: a.gpu_gemm.unwrap_or_default(),
            ..ppcc_codegen::CudaOptions::new(&a.cuda_arch)
                .map_err(|e| DriverError::Invalid(e.to_string()))?
        }),
        _ => None,
    };
    if a.gpu_loops_on_cpu {
        if a.target != Target::Cpu {
            bail!(
                "--gpu-loops-on-cpu runs the CUDA target's loops as CPU code: it needs --target cpu"
            );
        }
    } else {
        a.target.cuda_with(a.gpu_gemm)?;
    }
    let split_targets = match a.split.as_deref().map(str::trim) {
        None | Some("auto") => SplitChoice::Auto,
        Some("off") | Some("") => SplitChoice::Off,
        Some(s) => {
            let t = ppcc_passes::rewrite::parse_split_list(&s.replace(',', ";"))
                .map_err(|e| invalid!("--split: {e}"))?;
            if t.is_empty() {
                SplitChoice::Off
            } else {
                SplitChoice::Targets(t)
            }
        }
    };
    check_output_dir(&output, a.force)?;
    let profile = load_profile(&a.device_profile)?;
    let memory_limit = a
        .memory_limit
        .as_deref()
        .map(|m| parse_bytes(m).map_err(|e| invalid!("--memory-limit: {e}")))
        .transpose()?;

    // The model's global batch decides the default number of micro-batches.
    let model_global = match a.program.batch {
        Some(b) => Some(b),
        None => {
            let (imported, _) = crate::model::import_model(
                &model,
                a.program.params.as_deref(),
                &ppcc_frontends::onnx::ImportOptions::default(),
            )?;
            crate::program::model_batch(&imported.module)?
        }
    };
    // With D replicas each runs M micro-batches of global / (M·D) rows.
    if let Some(g) = model_global {
        if !g.is_multiple_of(replicas) {
            bail!("--data-parallel {replicas} must divide the global batch {g} (each replica trains on an equal share)");
        }
    }
    // The default number of micro-batches falls back to one when the model bakes its
    // batch size into a constant (each micro-batch then has the model's batch).
    let (microbatches, prepared) = match a.microbatches {
        Some(m) => (m, prepare(&model, &a.program, m * replicas)?),
        None => {
            let m = default_microbatches(model_global.map(|g| g / replicas), a.stages);
            match prepare(&model, &a.program, m * replicas) {
                Ok(p) => (m, p),
                Err(e) if m > 1 => match prepare(&model, &a.program, replicas) {
                    Ok(p) => {
                        (c.events)(Event::Note(format!(
                            "note: using 1 micro-batch per step: {m} micro-batches do not fit the model ({}); give --microbatches and --batch to choose",
                            crate::error_chain(&e)
                        )));
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
    let spec = if a.schedule == "auto" {
        if a.chunks.is_some() {
            bail!("--chunks does not apply to --schedule auto (it tries 1 to 4 chunks per device)");
        }
        ScheduleSpec::Auto
    } else if is_builtin {
        ScheduleSpec::Builtin(a.schedule.clone())
    } else if a.schedule.ends_with(".pps") {
        let s = read_pps_file(
            Path::new(&a.schedule),
            a.stages,
            microbatches as usize,
            chunks,
        )?;
        ScheduleSpec::Custom(s)
    } else if a.schedule.ends_with(".csv") || Path::new(&a.schedule).exists() {
        let text = std::fs::read_to_string(&a.schedule)
            .with_context(|| format!("cannot read {}", a.schedule))?;
        let layout = match a.csv_layout {
            CsvLayout::Auto => ppcc_passes::schedule::csv::infer_layout(&text, a.stages)
                .with_context(|| format!("invalid schedule {}", a.schedule))?,
            CsvLayout::Interleaved => Layout::Interleaved {
                ranks: a.stages,
                chunks,
            },
            CsvLayout::V => Layout::VShape { ranks: a.stages },
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
            "unknown schedule `{}` (built-in: {}; auto; or a .pps or .csv file)",
            a.schedule,
            BUILTIN_NAMES.join(", ")
        );
    };
    // (`auto` partitions its one-stage-per-device layouts like these, its others
    // sequentially.)
    let one_stage_per_device = matches!(&spec, ScheduleSpec::Auto)
        || matches!(&spec, ScheduleSpec::Builtin(n) if n != "zb-v" && n != "dualpipe-v" && !(n == "interleaved-1f1b" && chunks > 1));
    let kind = match a.partition {
        PartitionChoice::Auto if one_stage_per_device => PartitionKind::Graph,
        PartitionChoice::Auto => PartitionKind::Sequential,
        PartitionChoice::Graph => PartitionKind::Graph,
        PartitionChoice::Sequential => PartitionKind::Sequential,
        PartitionChoice::Uniform => PartitionKind::Uniform,
    };

    c.progress("importing");
    let mut module = prepared.module;
    c.at_point(Point::Import, &mut module)?;
    // Notes from the op timer (which runs inside the planner, on its threads).
    let timer_notes: std::sync::Arc<std::sync::Mutex<Vec<String>>> = Default::default();
    let optimizer = a.program.optimizer(microbatches)?;
    let optimizer_state = match optimizer.kind {
        OptimizerKind::Sgd if optimizer.momentum != 0.0 => 1.0,
        OptimizerKind::Sgd => 0.0,
        OptimizerKind::AdamW => 2.0,
    } / zero_shards(&a) as f64;
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
    // Planner options without the op timer (which needs the final weights).
    let base_options = PlannerOptions {
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
        op_timer: None,
        recompute: a.recompute,
    };
    let split_targets = match split_targets {
        SplitChoice::Off => None,
        SplitChoice::Targets(t) => Some(t),
        SplitChoice::Auto => {
            c.progress("choosing ops to split");
            let (targets, notes) = auto_splits(&module, &base_options)?;
            for n in notes {
                (c.events)(Event::Note(n));
            }
            (!targets.is_empty()).then_some(targets)
        }
    };
    // With a rewrite, @main computes its own loss first (so that the rewriter sees it: a
    // cross-entropy splits along the vocabulary with its LM head); autodiff then
    // differentiates that output.
    let mut prog_opts = a.program.clone();
    let mut appended: Option<ppcc_passes::autodiff::AppendedLoss> = None;
    // The model as imported: synthetic data is drawn for it (which ids index which table),
    // so a split model trains on the same data as the whole one.
    let imported_main = split_targets
        .as_ref()
        .and_then(|_| module.function("main").cloned());
    let (weight_pieces, splits) = match &split_targets {
        Some(targets) => {
            c.progress("rewriting");
            let r = rewrite_split(&mut module, targets, prog_opts.loss)?;
            prog_opts.loss = ppcc_passes::autodiff::LossKind::Output;
            appended = Some(r.appended);
            (c.events)(Event::Note(r.report));
            (r.pieces, r.splits)
        }
        None => Default::default(),
    };
    c.at_point(Point::Rewrite, &mut module)?;
    let options = PlannerOptions {
        autodiff: prog_opts.autodiff(),
        op_timer: (a.target == Target::Cpu && profile.measure_ops).then(|| {
            // Partition by what the generated code takes, not the interpreter.
            // The plan and its sequential baseline cost the same training step: remember
            // the last answer (by the function's text).
            let weights = module.weights.clone();
            let notes = timer_notes.clone();
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
                        notes
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(format!(
                                "note: timing ops with the interpreter instead of native code: {}",
                                crate::error_chain(&e)
                            ))
                    })
                    .ok();
                *memo = Some((key, v.clone()));
                v
            }))
        }),
        ..base_options.clone()
    };
    c.progress(format!("planning ({} partition)", kind.name()));
    let plan_started = Instant::now();
    // The baseline reuses the plan's op costs and chain partitions.
    let mut cache = PartitionCache::default();
    let mut best = plan_with(&module, &options, &mut cache)?;
    let plan_seconds = plan_started.elapsed().as_secs_f64();
    // Under `auto`: what it tried and why it chose; the plan's layout decides the
    // chunks, its partition the partitioner, and the baseline searches that layout only.
    let (chunks, kind, baseline_schedule) = if spec == ScheduleSpec::Auto {
        (c.events)(Event::Note(ppcc_passes::planner::search_report(
            &best,
            memory_limit.unwrap_or(profile.memory_bytes),
        )));
        (
            best.layout.num_chunks(),
            best.partition.kind,
            ScheduleSpec::search_for(&best.layout),
        )
    } else {
        (chunks, kind, spec.clone())
    };
    c.progress("planning the sequential baseline");
    let baseline = if kind == PartitionKind::Sequential {
        Ok(best.clone())
    } else {
        plan_with(
            &module,
            &PlannerOptions {
                partition: PartitionKind::Sequential,
                pinned: vec![],
                schedule: baseline_schedule,
                ..options.clone()
            },
            &mut cache,
        )
    };

    let notes: Vec<String> =
        std::mem::take(&mut *timer_notes.lock().unwrap_or_else(|p| p.into_inner()));
    for n in notes {
        (c.events)(Event::Note(n));
    }
    apply(&mut module, "main", &best.partition)?;
    c.at_point(Point::Partition, &mut module)?;

    std::fs::create_dir_all(&output)
        .with_context(|| format!("cannot create {}", output.display()))?;
    let mut native_times: Option<Vec<[f64; 4]>> = None;
    // Per stage: the most bytes of temporaries one call of its functions has live.
    let mut stage_temporaries: Option<Vec<f64>> = None;
    let program = if a.plan_only {
        None
    } else {
        c.progress("building the training program");
        // The optimizer averages over every micro-batch of the step, in all replicas.
        let training = build_training(&mut module, &prog_opts, microbatches * replicas)?;
        if !best.recompute.is_empty() {
            c.progress("recomputing activations");
            let chosen: Vec<(u32, Vec<String>)> = best
                .recompute
                .iter()
                .map(|r| (r.stage as u32, r.values.clone()))
                .collect();
            let g = module
                .function_mut(&training.info.function)
                .context("autodiff returned no gradient function")?;
            ppcc_passes::recompute::apply_named(g, &chosen)
                .context("recomputing the planned activations")?;
            check(&module, "the training program with recomputation")?;
        }
        c.at_point(Point::TrainingProgram, &mut module)?;
        let data = data_specs(
            &module,
            imported_main.as_ref(),
            prepared.first_output.as_ref(),
            prepared.micro,
        )?;
        c.progress("inserting send/recv");
        let split = split_stages(
            &mut module,
            &SplitOptions {
                replicas: replicas > 1,
                zero: zero_shards(&a),
                ..SplitOptions::default()
            },
        )?;
        check(&module, "the per-stage program")?;
        c.at_point(Point::Split, &mut module)?;
        if split.stages.len() != best.partition.stages.len() {
            bail!(
                "the plan has {} stages but only {} of them do training work: the others hold only ops the loss does not depend on (outputs other than the first); use --stages {}",
                best.partition.stages.len(),
                split.stages.len(),
                split.stages.len()
            );
        }
        stage_temporaries = Some(
            split
                .stages
                .iter()
                .map(|st| {
                    [&st.fwd, &st.bwd_input, &st.bwd_weight]
                        .into_iter()
                        .chain(st.optim.as_ref())
                        .filter_map(|name| module.function(name))
                        .map(|f| ppir::memory::peak_temporary_bytes(f) as f64)
                        .fold(0.0, f64::max)
                })
                .collect(),
        );
        c.progress("writing");
        let mut stage_modules = vec![];
        for st in &split.stages {
            stage_modules.push(write_stage(&module, st, &output)?);
        }
        if a.target.is_native() {
            let mut built_so = Vec::new();
            for (st, sm) in split.stages.iter().zip(&stage_modules) {
                c.progress(format!("generating code for stage {}", st.stage));
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
                        cuda_loops_on_cpu: a
                            .gpu_loops_on_cpu
                            .then(|| a.gpu_gemm.unwrap_or_default()),
                    },
                )?;
                built_so.push(built.so);
            }
            if profile.name == "host" && cuda.is_none() {
                // All stages at once, one thread each, as `ppcc run` runs them: what a
                // function takes while the other cores work too (shared caches, memory
                // bandwidth, clock) is what the pipeline sees.
                c.progress("timing the stages' code");
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
                                .unwrap_or_else(|_| Err(invalid!("timing thread panicked")))
                        })
                        .collect()
                });
                native_times = Some(times.into_iter().collect::<Result<Vec<_>>>()?);
            }
        }
        Some((training, split, data))
    };
    // The stages' temporaries counted on their functions replace the planner's bound
    // (recomputed values plus the backward's own temporaries, taken as coinciding).
    if let Some(temps) = &stage_temporaries {
        for (s, &t) in temps.iter().enumerate() {
            if let Some(c) = best.costs.stages.get_mut(s) {
                c.transient_memory = t;
            }
        }
        best.report = simulate(&best.schedule, &best.costs)
            .context("simulating the schedule with the stages' temporaries")?;
    }
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
            .context("simulating the schedule with measured times")?;
        let work: f64 = times.iter().map(|t| t[0] + t[1] + t[2]).sum();
        best.lower_bound = microbatches as f64 * work / a.stages as f64;
        best.costs = costs;
    }
    // Data parallelism: every device all-reduces its stages' weight gradients over the
    // replicas (a ring on the profile's links; with --zero 1 a reduce-scatter and an
    // all-gather, the same bytes), each stage's as soon as its last weight gradient is
    // done — as the runtime does —, one after another on the device's link, while the
    // device computes the rest of its actions; its optimizer step waits for them.
    let mut allreduce_seconds = 0.0;
    if replicas > 1 {
        let (seconds, exposed) = data_parallel_step(
            &best.schedule,
            &best.costs,
            &best.report,
            replicas as f64,
            &profile,
        );
        allreduce_seconds = seconds;
        best.report.makespan += exposed;
        (c.events)(Event::Note(format!(
            "data parallel: {replicas} replicas of the {}-device pipeline ({} workers), {} rows per replica per step; the gradient all-reduce takes {:.3} ms per step on the busiest device ({} profile links), {:.3} ms of it not hidden behind the backward",
            a.stages,
            a.stages * a.data_parallel,
            prepared.global / replicas,
            allreduce_seconds * 1e3,
            profile.name,
            exposed * 1e3,
        )));
    }
    let write = |name: &str, text: String| -> Result<()> {
        let p = output.join(name);
        std::fs::write(&p, text).with_context(|| format!("cannot write {}", p.display()))
    };
    write(
        "schedule.csv",
        to_csv_as(
            &best.schedule,
            match a.csv_format {
                CsvFormat::ComputeOnly => ppcc_passes::schedule::csv::CsvFormat::ComputeOnly,
                CsvFormat::ComputeComms => ppcc_passes::schedule::csv::CsvFormat::ComputeComms,
            },
        ),
    )?;
    write("schedule.pps", to_pps(&best.schedule))?;
    let title = format!(
        "{} · {} · {} partition · {} devices × {microbatches} micro-batches ({})",
        model
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default(),
        if spec == ScheduleSpec::Auto {
            format!("auto: {}", best.schedule_name)
        } else {
            spec.name()
        },
        kind.name(),
        a.stages,
        profile.name
    );
    write("timeline.svg", to_svg_seconds(&best.report, &title))?;
    write("trace.json", to_trace_json_seconds(&best.report))?;
    let mut plan_doc = plan_doc(&PlanDoc {
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
        weight_pieces: &weight_pieces,
        splits: &splits,
        appended: appended.as_ref(),
        plan_seconds,
        native_times: native_times.as_deref(),
        stage_temporaries: stage_temporaries.as_deref(),
        model_prediction: model_prediction.clone(),
    });
    if replicas > 1 {
        plan_doc.data_parallel = Some(doc::DataParallel {
            replicas: a.data_parallel,
            ranks: (0..a.data_parallel)
                .map(|r| (0..a.stages).map(|d| r * a.stages + d).collect())
                .collect(),
            allreduce_seconds,
        });
    }
    if let Some((_, split, _)) = &program {
        plan_doc.files = Some(file_records(
            &output,
            split.stages.len(),
            a.target.is_native(),
        )?);
    }
    write("plan.json", plan_doc.to_json()?)?;
    Ok(Compiled {
        model,
        output,
        devices: a.stages,
        microbatches,
        schedule: spec,
        partition: kind,
        plan: best,
        baseline,
        split: program.map(|p| p.1),
        cost_model_iteration: model_prediction.map(|p| p.iteration_seconds),
        plan_doc,
        seconds: started.elapsed().as_secs_f64(),
    })
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
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .is_some_and(|v| v.get("format").and_then(serde_json::Value::as_str) == Some("ppcc-plan"));
    // A compile that failed before writing plan.json leaves only ppcc's own names.
    let only_ours = || -> Result<bool> {
        for e in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
            let name = e?.file_name();
            let name = name.to_string_lossy();
            let ours = ["schedule.csv", "schedule.pps", "timeline.svg", "trace.json"]
                .contains(&name.as_ref())
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
            "{} is not empty and is not a ppcc build directory (no plan.json written by ppcc): ppcc would write plan.json, schedule.csv, schedule.pps, timeline.svg, trace.json and stage*/ among its files, replacing any of those names. Give a new or empty directory with -o, or pass --force to write there anyway",
            dir.display()
        );
    }
    Ok(())
}

/// The size and SHA-256 of every file of the build directory `ppcc run` loads, by path
/// relative to `dir` (plan.json's `files`).
fn file_records(
    dir: &Path,
    stages: usize,
    native: bool,
) -> Result<std::collections::BTreeMap<String, doc::FileRecord>> {
    let mut files = std::collections::BTreeMap::new();
    for s in 0..stages {
        let mut names = vec!["stage.ppir", "params.npz"];
        if native {
            names.push("module.so");
        }
        for name in names {
            let rel = format!("stage{s}/{name}");
            files.insert(rel.clone(), record_of_file(&dir.join(&rel))?);
        }
    }
    Ok(files)
}

/// The data inputs of `@grad` (model inputs and labels; not `rng`) with their synthetic
/// distributions, per micro-batch.
fn data_specs(
    module: &Module,
    imported_main: Option<&ppir::Function>,
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
    // Index ranges come from the model as imported (a rewrite may route ids through other
    // ops before they reach a gather); the types are the same.
    let mut specs = default_specs(imported_main.unwrap_or(g), &names, micro);
    if let Some(v) = g.find_value("labels") {
        specs.push(crate::data::label_spec(g.ty(v), first_output)?);
    }
    Ok(specs)
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
    a: &'a CompileOptions,
    model: &'a Path,
    microbatches: u64,
    chunks: usize,
    kind: PartitionKind,
    profile: &'a DeviceProfile,
    memory_limit: f64,
    plan: &'a Plan,
    baseline: &'a Result<Plan, PassError>,
    program: Option<&'a (crate::program::Training, SplitInfo, Vec<InputSpec>)>,
    prepared_global: u64,
    prepared_micro: u64,
    onnx_name: &'a std::collections::HashMap<String, String>,
    weight_sources: &'a std::collections::BTreeMap<String, String>,
    weight_pieces: &'a std::collections::BTreeMap<String, doc::WeightPieces>,
    splits: &'a [doc::SplitDoc],
    /// The loss appended to @main before the rewrite, if any (autodiff then saw `output`).
    appended: Option<&'a ppcc_passes::autodiff::AppendedLoss>,
    plan_seconds: f64,
    /// Per stage: measured seconds of the native fwd, bwd_input, bwd_weight, optim.
    native_times: Option<&'a [[f64; 4]]>,
    /// Per stage: the temporaries of its functions (bytes).
    stage_temporaries: Option<&'a [f64]>,
    model_prediction: Option<doc::Prediction>,
}

fn prediction(p: &Plan) -> doc::Prediction {
    doc::Prediction {
        iteration_seconds: p.report.makespan,
        bubble_fraction: p.report.bubble_fraction,
        lower_bound_seconds: p.lower_bound,
        busy_seconds: p.report.busy.clone(),
        peak_memory_bytes: p.report.peak_memory.clone(),
        peak_stash_microbatches: p.report.peak_stash.clone(),
        stage_graph_is_chain: p.partition.is_chain(),
        stage_seconds: p.partition.stages.iter().map(|s| s.cost.time()).collect(),
        edges: p
            .partition
            .edges
            .iter()
            .map(|e| doc::EdgeBytes {
                from: e.from,
                to: e.to,
                bytes: e.bytes,
            })
            .collect(),
        stage_times: None,
    }
}

fn plan_doc(d: &PlanDoc) -> doc::Plan {
    let p = d.plan;
    let layout = &p.layout;
    let stages: Vec<doc::StageDoc> =
        p.partition
            .stages
            .iter()
            .enumerate()
            .map(|(s, st)| {
                let split = d.program.map(|(_, split, _)| &split.stages[s]);
                doc::StageDoc {
                    stage: s,
                    device: layout.rank_of(s),
                    chunk: layout.chunk_of(s),
                    ops: st.ops.len(),
                    first_op: st.first.clone(),
                    last_op: st.last.clone(),
                    forward_seconds: st.cost.f,
                    backward_input_seconds: p
                        .costs
                        .stages
                        .get(s)
                        .map_or(st.cost.b, |c| c.backward_input),
                    backward_weight_seconds: st.cost.w,
                    activation_bytes_per_microbatch: p
                        .costs
                        .stages
                        .get(s)
                        .map_or(st.cost.act_bytes, |c| c.activation_memory),
                    param_bytes: st.cost.param_bytes,
                    native_seconds: d.native_times.and_then(|t| t.get(s)).map(|t| {
                        doc::NativeSeconds {
                            fwd: t[0],
                            bwd_input: t[1],
                            bwd_weight: t[2],
                            optim: t[3],
                        }
                    }),
                    functions: split.map(|sf| doc::StageFunctions {
                        fwd: sf.fwd.clone(),
                        bwd_input: sf.bwd_input.clone(),
                        bwd_weight: sf.bwd_weight.clone(),
                        optim: sf.optim.clone(),
                    }),
                    params: split.map(|sf| sf.params.clone()),
                    dir: split.map(|_| format!("stage{s}")),
                    temporary_bytes: d.stage_temporaries.and_then(|t| t.get(s)).copied(),
                    recompute: p.recompute.iter().find(|r| r.stage == s).map(|r| {
                        doc::RecomputeDoc {
                            values: r.values.clone(),
                            stash_bytes_without: r.stash_bytes_off,
                            recomputed_bytes: r.recomputed_bytes,
                            extra_seconds: r.extra_seconds,
                            extra_flops: r.extra_flops,
                            exact: r.exact,
                        }
                    }),
                }
            })
            .collect();
    let mut predicted = prediction(p);
    predicted.stage_times = Some(
        if d.native_times.is_some() {
            "measured-native"
        } else {
            "cost-model"
        }
        .into(),
    );
    let mut out = doc::Plan {
        format: doc::FORMAT.into(),
        version: doc::VERSION,
        ppcc_version: env!("CARGO_PKG_VERSION").into(),
        model: d.model.display().to_string(),
        devices: d.a.stages,
        virtual_stages: p.partition.stages.len(),
        microbatches: d.microbatches,
        global_batch: d.prepared_global,
        micro_batch: d.prepared_micro,
        schedule: doc::ScheduleDoc {
            name: if d.a.schedule == "auto" {
                format!("auto: {}", p.schedule_name)
            } else {
                d.a.schedule.clone()
            },
            chunks: d.chunks,
            file: "schedule.csv".into(),
            actions: p
                .schedule
                .per_rank
                .iter()
                .map(|r| r.iter().map(|a| a.to_string()).collect())
                .collect(),
            layout: match layout {
                Layout::Interleaved { chunks, .. } => {
                    doc::LayoutDoc::Interleaved { chunks: *chunks }
                }
                Layout::VShape { .. } => doc::LayoutDoc::V,
                Layout::Dag { rank_of, edges, .. } => doc::LayoutDoc::Dag {
                    rank_of: rank_of.clone(),
                    edges: edges.iter().map(|&(a, b)| [a, b]).collect(),
                },
            },
        },
        partition: d.kind.name().into(),
        device_profile: d.profile.name.clone(),
        memory_limit_bytes: d.memory_limit,
        planner_seconds: d.plan_seconds,
        candidates: p
            .candidates
            .iter()
            .map(|&(chain, t)| doc::Candidate {
                stage_graph_is_chain: chain,
                iteration_seconds: t,
            })
            .collect(),
        stages,
        edges: p.partition.edges.iter().map(|e| [e.from, e.to]).collect(),
        prediction: predicted,
        prediction_cost_model: d.model_prediction.clone(),
        baseline: match d.baseline {
            Ok(b) => doc::Baseline::planned(prediction(b)),
            Err(e) => doc::Baseline::failed(e.to_string()),
        },
        program: d.program.is_some(),
        target: d.a.target.name().into(),
        gpu_gemm: (d.a.target == Target::Cuda)
            .then(|| d.a.gpu_gemm.unwrap_or_default().name().to_string()),
        channels: None,
        collectives: vec![],
        data_parallel: None,
        training: None,
        splits: d.splits.to_vec(),
        recompute: Some(d.a.recompute.name().to_string()),
        phases: None,
        files: None,
    };
    let Some((training, split, data)) = d.program else {
        return out;
    };
    out.channels = Some(
        split
            .channels
            .iter()
            .map(|c| doc::Channel {
                id: c.id,
                from: c.from,
                to: c.to,
                value: c.value.clone(),
                phase: c.phase.name().into(),
                bytes: c.bytes,
            })
            .collect(),
    );
    out.collectives = split
        .collectives
        .iter()
        .map(|c| doc::Collective {
            channel: c.channel,
            param: c.param.clone(),
            stages: c.stages.clone(),
            replicas: c.replicas,
            bytes: c.bytes,
            reduce_scatter: c.gather_channel.is_some(),
            gather_channel: c.gather_channel,
        })
        .collect();
    let o = &training.optimizer;
    let info = &training.info;
    // The data the training program reads (per micro-batch types) and how synthetic
    // data draws it, in @grad's argument order.
    let inputs = data
        .iter()
        .map(|spec| doc::DataInput {
            name: spec.name.clone(),
            onnx_name: d.onnx_name.get(&spec.name).cloned(),
            ty: spec.ty.to_string(),
            synthetic: match spec.dist {
                Distribution::Normal => doc::Synthetic::Normal,
                Distribution::Uniform { low, high } => doc::Synthetic::Uniform([low, high]),
            },
        })
        .collect();
    out.training = Some(doc::Training {
        loss: d.appended.map_or(info.loss_kind, |l| l.kind).name().into(),
        train_mode: !d.a.program.eval_mode,
        labels: d
            .appended
            .map_or(info.labels.as_ref(), |l| l.labels.as_ref())
            .map(|t| t.to_string()),
        needs_rng: info.needs_rng_key,
        inputs,
        params: info.params.clone(),
        updated_states: info.updated_states.clone(),
        weight_sources: d.weight_sources.clone(),
        weight_pieces: d.weight_pieces.clone(),
        optimizer: doc::Optimizer {
            kind: o.kind.name().into(),
            lr: o.lr,
            momentum: o.momentum,
            weight_decay: o.weight_decay,
            beta1: o.beta1,
            beta2: o.beta2,
            eps: o.eps,
            microbatches: o.microbatches,
        },
    });
    out.phases = Some(
        [Phase::Fwd, Phase::BwdInput, Phase::BwdWeight, Phase::Optim]
            .map(|p| p.name().to_string())
            .to_vec(),
    );
    out
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
    .map_err(|e| invalid!("timing stage {}: {e}", st.stage))
}

/// What `--split` asks for.
enum SplitChoice {
    Off,
    Auto,
    Targets(Vec<ppcc_passes::rewrite::rules::SplitTarget>),
}

/// Largest contractions considered by `--split auto`, and the piece counts tried.
const AUTO_SPLIT_CANDIDATES: usize = 2;
const AUTO_SPLIT_PIECES: [usize; 3] = [2, 4, 8];
/// A contraction is a candidate when its FLOPs are at least this share of one device's
/// balanced work (total FLOPs / devices).
const AUTO_SPLIT_SHARE: f64 = 0.5;
/// A split is kept only if it makes the predicted iteration at least this much faster.
const AUTO_SPLIT_GAIN: f64 = 0.02;

/// `--split auto`: the matmuls and gemms of `@main` whose FLOPs are at least half a
/// device's balanced share (at most the two largest) are split into 2, 4 or 8 pieces (no
/// more than the devices; the rewriter picks the axis) and the whole plan is made for
/// each; the variant with the shortest predicted iteration is kept if it beats the
/// unsplit plan by 2%. Returns the targets (none to keep the model whole) and notes that
/// say what was compared.
fn auto_splits(
    module: &Module,
    options: &PlannerOptions,
) -> Result<(Vec<ppcc_passes::rewrite::rules::SplitTarget>, Vec<String>)> {
    use ppcc_passes::rewrite::rules::SplitTarget;
    let f = module
        .function("main")
        .ok_or_else(|| invalid!("the imported module has no @main"))?;
    if options.ranks < 2 || !f.ty(f.results()[0]).is_static() {
        return Ok((vec![], vec![]));
    }
    let mut total = 0.0;
    let mut contractions: Vec<(f64, String)> = vec![];
    for &op in f.ops() {
        let d = f.op(op);
        let xs: Vec<&ppir::TensorType> = d.operands().iter().map(|&v| f.ty(v)).collect();
        let ys: Vec<&ppir::TensorType> = d.results().iter().map(|&v| f.ty(v)).collect();
        let Ok(cost) = ppcc_passes::cost::op_cost_of(d.kind, &d.attrs, &xs, &ys) else {
            continue;
        };
        total += cost.flops;
        if matches!(d.kind, ppir::OpKind::MatMul | ppir::OpKind::Gemm) {
            if let Some(loc) = &d.loc {
                contractions.push((cost.flops, loc.clone()));
            }
        }
    }
    let share = AUTO_SPLIT_SHARE * total / options.ranks as f64;
    contractions.retain(|(fl, _)| *fl >= share && *fl > 0.0);
    contractions.sort_by(|a, b| b.0.total_cmp(&a.0));
    contractions.truncate(AUTO_SPLIT_CANDIDATES);
    if contractions.is_empty() {
        return Ok((vec![], vec![]));
    }
    let base = plan(module, options)?.report.makespan;
    let ms = |t: f64| format!("{:.3} ms", t * 1e3);
    let mut notes = vec![];
    let mut best: Option<(f64, SplitTarget)> = None;
    for (flops, loc) in &contractions {
        let mut tried = vec![format!("unsplit {}", ms(base))];
        for k in AUTO_SPLIT_PIECES
            .into_iter()
            .filter(|&k| k <= options.ranks)
        {
            let target = SplitTarget {
                loc: loc.clone(),
                pieces: k,
                axis: None,
            };
            let mut m = module.clone();
            let outcome =
                rewrite_split(&mut m, std::slice::from_ref(&target), options.autodiff.loss)
                    .and_then(|_| {
                        let mut o = options.clone();
                        o.autodiff.loss = ppcc_passes::autodiff::LossKind::Output;
                        Ok(plan(&m, &o)?.report.makespan)
                    });
            match outcome {
                Ok(t) => {
                    tried.push(format!("{k} pieces {}", ms(t)));
                    if best.as_ref().is_none_or(|b| t < b.0) {
                        best = Some((t, target));
                    }
                }
                Err(e) => tried.push(format!("{k} pieces: {}", crate::error_chain(&e))),
            }
        }
        notes.push(format!(
            "split auto: {loc} ({:.0}% of the FLOPs): {}",
            100.0 * flops / total,
            tried.join(", ")
        ));
    }
    match best {
        Some((t, target)) if t < base * (1.0 - AUTO_SPLIT_GAIN) => {
            notes.push(format!(
                "split auto: chose {}={} ({} -> {})",
                target.loc,
                target.pieces,
                ms(base),
                ms(t)
            ));
            Ok((vec![target], notes))
        }
        _ => {
            notes.push(
                "split auto: no split predicts a faster iteration; the ops stay whole".into(),
            );
            Ok((vec![], notes))
        }
    }
}

/// What [`rewrite_split`] did.
struct Rewritten {
    /// Weights read in pieces (for the plan).
    pieces: std::collections::BTreeMap<String, doc::WeightPieces>,
    splits: Vec<doc::SplitDoc>,
    /// The rewriter's report line.
    report: String,
    appended: ppcc_passes::autodiff::AppendedLoss,
}

/// Append the training loss `loss` to `@main` (so the rules see it: a cross-entropy splits
/// with its LM head), split the `--split` ops with the e-graph rewriter and make the
/// weights read in pieces one parameter per piece; returns the pieces (for the plan), the
/// splits, the rewriter's report line and the loss appended (autodiff then differentiates
/// `@main`'s output).
fn rewrite_split(
    module: &mut Module,
    targets: &[ppcc_passes::rewrite::rules::SplitTarget],
    loss: ppcc_passes::autodiff::LossKind,
) -> Result<Rewritten> {
    use ppcc_passes::rewrite::{params::split_params, rewrite_function, RewriteOptions};
    let appended = ppcc_passes::autodiff::append_loss(module, "main", loss)
        .map_err(|e| invalid!("appending the loss to @main: {e}"))?;
    let f = module
        .function("main")
        .ok_or_else(|| invalid!("the imported module has no @main"))?;
    let opts = RewriteOptions {
        split: targets.to_vec(),
        ..Default::default()
    };
    let (out, report) = rewrite_function(module, f, &opts).map_err(|e| invalid!("--split: {e}"))?;
    if let Some(slot) = module.function_mut("main") {
        *slot = out;
    }
    let pieces = split_params(module, "main").map_err(|e| invalid!("--split: {e}"))?;
    let pieces = pieces
        .into_iter()
        .map(|w| {
            (
                w.original,
                doc::WeightPieces {
                    axis: w.axis,
                    pieces: w.pieces,
                },
            )
        })
        .collect();
    let splits = report
        .splits
        .iter()
        .map(|(node, what)| doc::SplitDoc {
            node: node.clone(),
            what: what.clone(),
        })
        .collect();
    Ok(Rewritten {
        pieces,
        splits,
        report: report.to_string(),
        appended,
    })
}

/// A `.pps` schedule for `ranks` devices, `microbatches` micro-batches and `chunks` (`v`);
/// a malformed file is an error naming `path:line:col`.
pub fn read_pps_file(
    path: &Path,
    ranks: usize,
    microbatches: usize,
    chunks: usize,
) -> Result<ppcc_passes::schedule::Schedule> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let params = PpsParams {
        ranks: Some(ranks),
        microbatches: Some(microbatches),
        chunks: Some(chunks),
    };
    read_pps(&text, params).map_err(|error| DriverError::Pps {
        path: path.to_path_buf(),
        error,
    })
}
