//! `ppcc run DIR`: the run command line. The pipeline is [`ppcc_driver::run`]; this parses
//! the options and prints.
//!
//! Standard output: `step <k> loss <value>` per step, exactly as `ppcc train` prints it
//! (the same model, batch, micro-batches and seed give the same numbers). Standard error:
//! a progress bar on a terminal, then measured against predicted time per step and memory
//! per device.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use ppcc_driver::run::{RunEvent, RunOptions, Transport};
use ppcc_driver::target::Target;

use crate::program::step_bar;
use crate::train_cmd::step_line;

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
weights and optimizer state) atomically and then points D/latest at it; a checkpoint
directory reused by another run is safe (a checkpoint of the same step is replaced only
after the new one is in place and `latest` points at it). `--keep-checkpoints N` then
removes all but the N most recent (default: keep every one). `--resume D` continues from
D/latest with the same data and losses as an uninterrupted run; it refuses a checkpoint
that lacks a weight or optimizer state of the plan, has one the plan does not, or has one
of another shape or type.

Data: integer inputs that index something (token ids into an embedding table, class
labels of a cross-entropy) are checked before the run: a value outside the table or the
classes is refused with the input, row, position and value, on every target.

A step whose loss is NaN or infinite stops the run with an error (exit status 1) before
any checkpoint of that step is written; `--allow-nonfinite-loss` continues instead.

CUDA plans (`--target cuda`), environment: PPCC_GPU_PROFILE=1 adds each GPU's 20 slowest
kernels (launches, time waited for them); PPCC_GPU_CACHE=off gives freed GPU memory back
to the driver at once instead of reusing it; PPCC_CUBLAS_LIB and PPCC_NCCL_LIB name the
cuBLAS and NCCL libraries when the loader cannot find them.

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
    #[arg(long, value_enum, default_value_t = Transport::Local)]
    pub transport: Transport,
    /// Move the tensors that stages send each other over NCCL, GPU to GPU (a plan compiled
    /// with --target cuda; one GPU per device). --transport still says threads or MPI
    /// processes, and carries NCCL's set-up, the message headers and the gradient
    /// all-reduces. The library is loaded at run time: libnccl.so.2, or PPCC_NCCL_LIB.
    #[arg(long)]
    pub nccl: bool,
    /// Test hook: frame the tensors as --nccl does, over memory (threads only).
    #[arg(long, hide = true, conflicts_with = "nccl")]
    pub test_link: bool,
    /// Write a Chrome/Perfetto trace of what ran (one lane per device).
    #[arg(long, value_name = "FILE.json")]
    pub trace: Option<PathBuf>,
    /// Where to write checkpoints.
    #[arg(long, value_name = "D")]
    pub checkpoint_dir: Option<PathBuf>,
    /// Write a checkpoint every K steps (needs --checkpoint-dir).
    #[arg(long, value_name = "K")]
    pub checkpoint_every: Option<u64>,
    /// After each checkpoint, remove all but the N most recent in --checkpoint-dir
    /// (default: keep all).
    #[arg(long, value_name = "N", requires = "checkpoint_dir")]
    pub keep_checkpoints: Option<u64>,
    /// Continue from the latest checkpoint in D.
    #[arg(long, value_name = "D")]
    pub resume: Option<PathBuf>,
    /// Keep training after a step whose loss is NaN or infinite (default: stop with an
    /// error at the first one).
    #[arg(long)]
    pub allow_nonfinite_loss: bool,
    /// After training, write the model with the trained initializers.
    #[arg(long, value_name = "OUT.onnx")]
    pub save_onnx: Option<PathBuf>,
    /// After training, write the trained parameters as .npz, keyed by the model's names
    /// for them: `arg<i>` for a StableHLO module (what `--params` reads and JAX's
    /// function takes, in order), initializer names for ONNX.
    #[arg(long, value_name = "OUT.npz")]
    pub save_params: Option<PathBuf>,
    /// Longest a device waits for a tensor from another before it reports which one
    /// (seconds, > 0).
    #[arg(long, value_name = "SECONDS", default_value_t = 120.0)]
    pub recv_timeout: f64,
    /// Run the stages as the native modules the compile generated (`cpu`, the default
    /// when the plan has them) or on the reference interpreter (`interp`).
    #[arg(long, value_enum, value_name = "TARGET")]
    pub target: Option<Target>,
    /// Test hook: make stage S panic at step K (`S:K`), or stall for T seconds
    /// (`S:K:stall=T`); in data-parallel replica R only (`:replica=R`, default 0).
    #[arg(long, value_name = "S:K", hide = true)]
    pub inject_fault: Option<String>,
}

pub fn run(a: RunArgs) -> Result<ExitCode> {
    let options = RunOptions {
        dir: a.dir,
        steps: a.steps,
        data: a.data,
        seed: a.seed,
        transport: a.transport,
        nccl: a.nccl,
        test_link: a.test_link,
        trace: a.trace,
        checkpoint_dir: a.checkpoint_dir,
        checkpoint_every: a.checkpoint_every,
        keep_checkpoints: a.keep_checkpoints,
        resume: a.resume,
        allow_nonfinite_loss: a.allow_nonfinite_loss,
        save_onnx: a.save_onnx,
        save_params: a.save_params,
        recv_timeout: a.recv_timeout,
        target: a.target,
        inject_fault: a.inject_fault,
    };
    let mut bar = indicatif::ProgressBar::hidden();
    let result = ppcc_driver::run::run(&options, &mut |e| match e {
        RunEvent::Started { steps, progress } => bar = step_bar(steps, progress),
        RunEvent::Step { step, loss } => {
            bar.suspend(|| println!("{}", step_line(step, loss)));
            bar.set_message(format!("loss {loss:.4}"));
            bar.inc(1);
        }
        RunEvent::Note(n) => {
            if bar.is_finished() || bar.is_hidden() {
                eprintln!("{n}");
            } else {
                bar.finish_and_clear();
                eprintln!("{n}");
            }
        }
    });
    bar.finish_and_clear();
    result?;
    Ok(ExitCode::SUCCESS)
}
