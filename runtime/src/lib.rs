//! # ppcc-runtime — trains the programs ppcc builds
//!
//! Input: a [`ppir::Module`] holding a training program — `@grad` (forward + backward of
//! one micro-batch), `@accumulate` (gradient sum) and `@optim` (optimizer step), as built
//! by `ppcc_passes::autodiff` and `ppcc_passes::optim` — and its initial weights. This
//! crate only reads the IR; it does not call the compiler.
//!
//! - [`trainer`]: [`Trainer`], the single-device training loop on the reference
//!   interpreter (the path `ppcc train` uses, and the oracle the pipelined runtime is
//!   compared with).
//! - [`integrity`]: the sizes and SHA-256 that plan.json records for the files `ppcc run`
//!   loads, checked before they are read.
//! - [`data`]: where global batches come from: arrays (an `.npz` read by the caller) or
//!   seeded synthetic data.
//!
//! The conventions the trainer relies on are names, so any producer of the functions can
//! drive it: `@grad` takes the model inputs and `labels` by name, `rng` (`[step, micro]`)
//! when present, and weights; it returns `loss`, `grad.<p>` and `new.<state>`.
//! `@accumulate` maps `acc.<p>`, `grad.<p>` to `new.acc.<p>`; `@optim` takes weights and
//! `grad.<p>` and returns `new.<weight>`. Every `new.<w>` result replaces weight `w`.

pub mod data;
pub mod gpu;
pub mod integrity;
pub mod native;
pub mod npz;
pub mod pipeline;
pub mod trainer;
pub mod transport;

pub use data::{ArraySource, Batch, BatchSource, Distribution, InputSpec, SyntheticSource};
pub use trainer::{Call, Executor, Interpreter, StepReport, Trainer, TrainerOptions};

/// What went wrong while training.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The module lacks a function the training loop needs.
    #[error("the training module has no function @{0}")]
    MissingFunction(String),
    /// A function's arguments or results do not follow the training conventions.
    #[error("@{function}: {message}")]
    Signature { function: String, message: String },
    /// The interpreter (or another executor) failed while running a function.
    #[error("step {step}{}: @{function}: {source}", micro_suffix(*.micro))]
    Execution {
        step: u64,
        micro: Option<usize>,
        function: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A batch is missing an array or has the wrong shape.
    #[error("step {step}: {message}")]
    Batch { step: u64, message: String },
    /// A data source cannot provide batches.
    #[error("data: {0}")]
    Data(String),
    /// An array of the data cannot provide a batch's rows.
    #[error("data: array `{name}`: {source}")]
    Array {
        name: String,
        source: data::SliceError,
    },
}

fn micro_suffix(micro: Option<usize>) -> String {
    match micro {
        Some(m) => format!(", micro-batch {m}"),
        None => String::new(),
    }
}
