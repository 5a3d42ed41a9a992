//! The training program's options on the command line (`ppcc train` and the compiler);
//! building the program is [`ppcc_driver::program`].

use std::io::IsTerminal;

use clap::{Args, ValueEnum};
use ppcc_driver::program::ProgramOptions;
use ppcc_passes::autodiff::LossKind;
use ppcc_passes::optim::OptimizerKind;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LossArg {
    /// The model's output if it is a single scalar, cross-entropy otherwise.
    Auto,
    /// Softmax cross-entropy over the last axis of the first output, integer labels.
    CrossEntropy,
    /// Mean squared error of the first output against float labels.
    Mse,
    /// The model's (scalar) output is the loss.
    Output,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OptimizerArg {
    /// SGD with momentum and weight decay (PyTorch semantics).
    Sgd,
    /// AdamW (decoupled weight decay, bias correction).
    Adamw,
}

/// Batch, loss and optimizer options shared by `ppcc train` and the compiler.
#[derive(Args, Clone, Debug)]
pub struct ProgramArgs {
    /// Global batch size N (rows per step). Default: the model's static batch size. A
    /// model exported with a static batch trains with other micro-batch sizes unless it
    /// bakes its batch size into a constant (then N/M must equal it).
    #[arg(long, value_name = "N")]
    pub batch: Option<u64>,
    /// The loss to train.
    #[arg(long, value_enum, default_value_t = LossArg::Auto)]
    pub loss: LossArg,
    /// The optimizer.
    #[arg(long, value_enum, default_value_t = OptimizerArg::Sgd)]
    pub optimizer: OptimizerArg,
    /// Learning rate. Default: 0.05 for SGD, 1e-3 for AdamW.
    #[arg(long, value_name = "F")]
    pub lr: Option<f64>,
    /// SGD momentum.
    #[arg(long, value_name = "F", default_value_t = 0.9)]
    pub momentum: f64,
    /// Weight decay (SGD: added to the gradient; AdamW: decoupled). Default: 0 for SGD,
    /// 0.01 for AdamW.
    #[arg(long, value_name = "F")]
    pub weight_decay: Option<f64>,
    /// AdamW β1.
    #[arg(long, value_name = "F", default_value_t = 0.9)]
    pub beta1: f64,
    /// AdamW β2.
    #[arg(long, value_name = "F", default_value_t = 0.999)]
    pub beta2: f64,
    /// AdamW ε.
    #[arg(long, value_name = "F", default_value_t = 1e-8)]
    pub eps: f64,
    /// Train with inference-mode ops: dropout off, batch-norm with running statistics.
    #[arg(long)]
    pub eval_mode: bool,
    /// The trainable arguments of a StableHLO module: an `.npz` keyed `arg<i>` (the
    /// argument's position in `@main`); the other arguments are data inputs.
    #[arg(long, value_name = "P.npz")]
    pub params: Option<std::path::PathBuf>,
}

impl ProgramArgs {
    /// The driver's options.
    pub fn options(&self) -> ProgramOptions {
        ProgramOptions {
            batch: self.batch,
            loss: match self.loss {
                LossArg::Auto => LossKind::Auto,
                LossArg::CrossEntropy => LossKind::CrossEntropy,
                LossArg::Mse => LossKind::Mse,
                LossArg::Output => LossKind::Output,
            },
            optimizer: match self.optimizer {
                OptimizerArg::Sgd => OptimizerKind::Sgd,
                OptimizerArg::Adamw => OptimizerKind::AdamW,
            },
            lr: self.lr,
            momentum: self.momentum,
            weight_decay: self.weight_decay,
            beta1: self.beta1,
            beta2: self.beta2,
            eps: self.eps,
            eval_mode: self.eval_mode,
            params: self.params.clone(),
        }
    }
}

/// A bar of training steps on a terminal (`show`), else a hidden one.
pub fn step_bar(steps: u64, show: bool) -> indicatif::ProgressBar {
    if show && std::io::stderr().is_terminal() {
        let pb = indicatif::ProgressBar::new(steps);
        pb.set_style(
            indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} steps, {elapsed} {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        pb
    } else {
        indicatif::ProgressBar::hidden()
    }
}
