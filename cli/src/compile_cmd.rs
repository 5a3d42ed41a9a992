//! `ppcc MODEL.onnx -o DIR`: the compile command line. The pipeline is
//! [`ppcc_driver::compile`]; this parses the options, shows progress and prints the
//! summary table.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;
use ppcc_driver::compile::{
    CompileOptions, Compiled, Compiler, CsvFormat, CsvLayout, Event, PartitionChoice, Point,
};
use ppcc_driver::target::Target;
use ppcc_passes::partition::{human_bytes, PartitionKind};
use ppcc_passes::recompute::RecomputeMode;

use crate::program::ProgramArgs;

/// Compile a model into a pipeline-parallel training plan.
#[derive(Args, Debug)]
#[command(after_help = "\
Writes DIR/plan.json (stages, devices, the stage DAG with bytes per edge, send/recv
channels, the schedule, predicted iteration time, bubble and memory per device, and the
same predictions for the sequential partition as a baseline), DIR/stage<i>/stage.ppir
(stage i's fwd, bwd_input, bwd_weight and optim functions with explicit send/recv),
DIR/stage<i>/params.npz (initial weights), DIR/schedule.csv, DIR/schedule.pps, DIR/timeline.svg and
DIR/trace.json; prints a short table.

Examples:
  ppcc examples/two_tower.onnx -o build/ --stages 3 --microbatches 4 --loss mse
  ppcc examples/gpt.onnx -o build/ --stages 2 --microbatches 1 --schedule zb-h1
  ppcc model.onnx -o build/ --stages 4 --microbatches 8 --schedule interleaved-1f1b --chunks 2
  ppcc model.onnx -o build/ --stages 4 --schedule my_schedule.csv --partition sequential
  ppcc model.onnx -o build/ --stages 4 --microbatches 8 --schedule examples/schedules/zb-v.pps
  ppcc model.onnx -o build/ --stages 4 --stage-layout block3/Add,block6/Add,block9/Add
  ppcc model.mlir --params params.npz -o build/ --stages 2 --microbatches 1")]
pub struct CompileArgs {
    /// The model: ONNX (float initializers are the trained parameters), or a StableHLO
    /// module (`.mlir`) with its parameters in `--params`.
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
    /// Data parallelism: D replicas of the P-stage pipeline (P·D workers: `ppcc run` runs
    /// them as threads, or `mpirun -np P·D`). The global batch is split across the
    /// replicas (each runs the schedule on its share) and every weight gradient is summed
    /// over them (an explicit all_reduce in each stage's optimizer) before the update.
    #[arg(long, value_name = "D", default_value_t = 1)]
    pub data_parallel: usize,
    /// ZeRO stage: 0 (default) keeps the whole optimizer state on every replica; 1 shards
    /// it across the data-parallel replicas: each weight gradient is reduce-scattered,
    /// each replica updates its 1/D of the parameter (and holds 1/D of its momentum or
    /// Adam moments), and the updated shards are all-gathered. Weights shared across
    /// stages keep their whole state. No effect with one replica.
    #[arg(long, value_name = "0|1", default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=1))]
    pub zero: u8,
    /// A total device count N instead of --stages and --data-parallel: plan every P × D =
    /// N (P stages, D replicas) and keep the shortest predicted step, printing the
    /// alternatives compared.
    #[arg(long, value_name = "N", conflicts_with = "data_parallel")]
    pub devices: Option<usize>,
    /// Micro-batches per step, M (must divide the global batch). Default: the largest
    /// divisor of the global batch up to 2·P. `auto`: plan every divisor of the global
    /// batch up to 8·P (under the memory limit, with recomputation as --recompute says)
    /// and keep the one with the shortest predicted iteration.
    #[arg(long, value_name = "M|auto", value_parser = parse_microbatches)]
    pub microbatches: Option<Microbatches>,
    /// A built-in schedule (gpipe, 1f1b, interleaved-1f1b, zb-h1, zb-h2, zb-v, dualpipe-v),
    /// `auto` (search the built-ins, their parameters and orderings in the simulator and
    /// keep the fastest within the memory limit; prints what it tried), a program in
    /// ppcc's schedule language (FILE.pps, docs/schedules.md: p = --stages,
    /// m = --microbatches, v = --chunks) or a torch CSV file (one row per device, cells like
    /// 0F1, 1I0, 2W3, 1B2).
    #[arg(
        long,
        value_name = "NAME|auto|FILE.pps|FILE.csv",
        default_value = "1f1b"
    )]
    pub schedule: String,
    /// The partitioner.
    #[arg(long, value_enum, default_value_t = PartitionChoice::Auto)]
    pub partition: PartitionChoice,
    /// Stages per device for interleaved-1f1b (V).
    #[arg(long, value_name = "V")]
    pub chunks: Option<usize>,
    /// Stage layout of a CSV schedule: `auto` infers it from the cells as torch does (the
    /// row a stage appears in is its device: an interleaved chain or a V).
    #[arg(long, value_enum, default_value_t = CsvLayout::Auto)]
    pub csv_layout: CsvLayout,
    /// What DIR/schedule.csv lists: compute actions only (torch.distributed.pipelining's
    /// default `compute_only`, which its loader reads as it is) or with the sends and
    /// receives (`compute_comms`).
    #[arg(long, value_enum, default_value_t = CsvFormat::ComputeOnly)]
    pub csv_format: CsvFormat,
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
    /// Split ops into K independent pieces before partitioning, so that one large op (an
    /// LM head) can be spread over devices. `auto` (the default): the largest matmuls and
    /// gemms (at least half a device's share of the FLOPs) are tried in 2, 4 and 8 pieces
    /// and the plan with the shortest predicted iteration is kept if it is 2% faster; `off`:
    /// no split; or NODE=K or NODE=K:AXIS (AXIS m, n or k: rows, columns or the
    /// contraction; otherwise the cheapest), comma-separated, where NODE is an ONNX node
    /// name or the prefix of the one MatMul/Gemm under it (`lm_head` for `lm_head/MatMul`).
    /// A softmax cross-entropy over an LM head split along the vocabulary is split with it
    /// (log-sum-exp merge). Weights read in pieces become one parameter per piece;
    /// `ppcc run --save-onnx` joins them back.
    #[arg(long, value_name = "auto|off|NODE=K[:AXIS],...")]
    pub split: Option<String>,
    /// Recompute activations in the backward instead of keeping them from the forward,
    /// trading compute for memory. `auto` (the default): only on devices that would
    /// exceed the memory limit, the least extra time that fits first (exact by an ILP on
    /// small stages); `all`: everything a stage can make again from what it received;
    /// `off`: keep every activation the backward reads.
    #[arg(long, value_name = "auto|all|off", default_value = "auto", value_parser = ["auto", "all", "off"])]
    pub recompute: String,
    /// Write only the plan (plan.json, schedule.csv/.pps, timeline.svg, trace.json), not the
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
    /// Who multiplies matrices (and the GEMMs of convolutions) under `--target cuda`:
    /// `cublas` (the default), NVIDIA's cuBLAS, which `ppcc run` loads (PPCC_CUBLAS_LIB,
    /// else libcublas.so.13/.12) and stops naming it when it is missing; `kernels`, kernels
    /// generated like every other op, which need no library. On an H100, cuBLAS trained
    /// 5 of 6 models faster (BENCHMARKS.md).
    #[arg(long, value_name = "kernels|cublas", value_parser = ["kernels", "cublas"])]
    pub gpu_gemm: Option<String>,
    /// Test hook: with --target cpu, make each stage's code from the loops --target cuda
    /// turns into kernels (and its matrix products as --gpu-gemm has them), run on the CPU.
    #[arg(long, hide = true)]
    pub gpu_loops_on_cpu: bool,
    /// Write every intermediate form of the generated code: DIR/stage<i>/mlir/NN-<pass>.mlir
    /// after each pass of the MLIR pipeline, module.llvm.mlir and module.ll.
    #[arg(long)]
    pub keep_mlir: bool,
    /// Print the compile pipeline's steps in order (the points a dump or a pass can
    /// follow are marked `[point]`) and exit.
    #[arg(long)]
    pub print_pipeline: bool,
    /// Print the IR after a pipeline point (import, partition, training-program, split)
    /// to standard error, or into --dump-dir; repeat or separate with commas.
    #[arg(long, value_name = "POINT", value_delimiter = ',')]
    pub dump_after: Vec<String>,
    /// Write the --dump-after dumps to DIR/<n>-<point>.ppir instead of standard error.
    #[arg(long, value_name = "DIR")]
    pub dump_dir: Option<PathBuf>,
    /// Load a pass plugin (a shared library exporting `ppcc_pass_plugin`; see
    /// docs/plugins.md); its passes can then be placed with --plugin-pass. Repeatable.
    #[arg(long, value_name = "LIB.so")]
    pub pass_plugin: Vec<PathBuf>,
    /// Run pass NAME (built in or from a --pass-plugin; `NAME{k=v,...}` with options) on
    /// the module right after pipeline point POINT (see --print-pipeline). Repeatable;
    /// passes at the same point run in the order given.
    #[arg(long, value_name = "NAME@POINT")]
    pub plugin_pass: Vec<String>,
    #[command(flatten)]
    pub program: ProgramArgs,
}

/// `--microbatches`: a count or `auto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Microbatches {
    Count(u64),
    Auto,
}

fn parse_microbatches(s: &str) -> Result<Microbatches, String> {
    if s == "auto" {
        return Ok(Microbatches::Auto);
    }
    s.parse::<u64>()
        .map(Microbatches::Count)
        .map_err(|_| format!("`{s}` is neither a number nor `auto`"))
}

impl CompileArgs {
    fn options(&self) -> Result<CompileOptions> {
        let model = self.model.clone().context("give the model to compile")?;
        let output = self
            .output
            .clone()
            .context("give the output directory with -o DIR")?;
        Ok(CompileOptions {
            model,
            output,
            force: self.force,
            stages: self.stages,
            data_parallel: self.data_parallel,
            zero: self.zero == 1,
            devices: self.devices,
            microbatches: match self.microbatches {
                Some(Microbatches::Count(m)) => Some(m),
                _ => None,
            },
            microbatches_auto: self.microbatches == Some(Microbatches::Auto),
            schedule: self.schedule.clone(),
            partition: self.partition,
            chunks: self.chunks,
            csv_layout: self.csv_layout,
            csv_format: self.csv_format,
            device_profile: self.device_profile.clone(),
            memory_limit: self.memory_limit.clone(),
            stage_layout: self.stage_layout.clone(),
            plan_only: self.plan_only,
            target: self.target,
            cuda_arch: self.cuda_arch.clone(),
            gpu_gemm: self
                .gpu_gemm
                .as_deref()
                .and_then(ppcc_codegen::GpuGemm::parse),
            gpu_loops_on_cpu: self.gpu_loops_on_cpu,
            keep_mlir: self.keep_mlir,
            split: self.split.clone(),
            recompute: RecomputeMode::from_name(&self.recompute)
                .context("--recompute must be auto, all or off")?,
            program: self.program.options(),
        })
    }
}

pub fn compile(a: CompileArgs) -> Result<ExitCode> {
    let mut compiler = Compiler::new(a.options()?);
    for name in &a.dump_after {
        let point: Point = name.trim().parse()?;
        compiler.dump_after(point);
    }
    let mut registry = ppcc_passes::PassRegistry::builtin();
    ppcc_passes::plugin::load_pass_plugins(&mut registry, &a.pass_plugin)?;
    let specs = a
        .plugin_pass
        .iter()
        .map(|s| s.parse::<ppcc_passes::plugin::PassAtPoint>())
        .collect::<Result<Vec<_>, _>>()?;
    // Every point is checked before any pass is built (an unknown point lists the valid
    // ones).
    let points = specs
        .iter()
        .map(|s| s.point.trim().parse::<Point>())
        .collect::<Result<Vec<_>, _>>()?;
    for (placed, point) in ppcc_passes::plugin::passes_at_points(&registry, &specs)?
        .into_iter()
        .zip(points)
    {
        compiler.insert_pass(point, placed.pass);
    }
    if let Some(dir) = &a.dump_dir {
        compiler.dump_dir(dir);
    }
    if a.print_pipeline {
        print!("{}", compiler.print_pipeline());
        return Ok(ExitCode::SUCCESS);
    }
    let bar = spinner();
    let shown = bar.clone();
    compiler.on_event(move |e| match e {
        Event::Progress(m) => shown.set_message(m),
        Event::Note(n) => shown.suspend(|| eprintln!("{n}")),
        Event::Dump { point, text } => shown.suspend(|| {
            eprintln!("// -----// IR Dump After {point} //----- //");
            eprint!("{text}");
        }),
    });
    let result = compiler.run();
    bar.finish_and_clear();
    let c = result?;
    print_table(&c);
    let stages = match &c.split {
        Some(split) => format!(
            "{}/stage0..{}/stage.ppir, ",
            c.output.display(),
            split.stages.len() - 1
        ),
        None => String::new(),
    };
    eprintln!(
        "wrote {0}/plan.json, {stages}{0}/schedule.csv, {0}/schedule.pps, {0}/timeline.svg ({1:.1} s)",
        c.output.display(),
        c.seconds
    );
    Ok(ExitCode::SUCCESS)
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

fn ms(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.3} s")
    } else if s >= 1e-3 {
        format!("{:.3} ms", s * 1e3)
    } else {
        format!("{:.1} us", s * 1e6)
    }
}

fn print_table(c: &Compiled) {
    let (model, output, kind, spec, m, p, baseline, split, model_makespan) = (
        &c.model,
        &c.output,
        c.partition,
        &c.schedule,
        c.microbatches,
        &c.plan,
        &c.baseline,
        c.split.as_ref(),
        c.cost_model_iteration,
    );
    println!(
        "{} -> {}: {} devices, {} stages, {m} micro-batches, schedule {}, {} partition",
        model.display(),
        output.display(),
        c.devices,
        p.partition.stages.len(),
        spec.name(),
        kind.name()
    );
    println!(
        "{:>5} {:>6} {:>5} {:>10} {:>10} {:>10} {:>10} {:>10}  first .. last op",
        "stage", "device", "ops", "F", "B", "W", "params", "stash/mb"
    );
    for (s, st) in p.partition.stages.iter().enumerate() {
        let c = p.costs.stages.get(s);
        println!(
            "{:>5} {:>6} {:>5} {:>10} {:>10} {:>10} {:>10} {:>10}  {} .. {}",
            s,
            p.layout.rank_of(s),
            st.ops.len(),
            ms(st.cost.f),
            ms(c.map_or(st.cost.b, |c| c.backward_input)),
            ms(st.cost.w),
            human_bytes(st.cost.param_bytes),
            human_bytes(c.map_or(st.cost.act_bytes, |c| c.activation_memory)),
            st.first,
            st.last
        );
    }
    for r in &p.recompute {
        println!(
            "recompute: stage {} makes {} values again in its backward: stash {} -> {} per micro-batch, +{} ({:.2} GFLOP){}",
            r.stage,
            r.values.len(),
            human_bytes(r.stash_bytes_off),
            human_bytes(r.stash_bytes),
            ms(r.extra_seconds),
            r.extra_flops / 1e9,
            if r.exact { "" } else { " (heuristic choice)" }
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
