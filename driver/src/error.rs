//! The driver's error: one enum, with the libraries' errors as variants and, where the
//! driver adds what it was doing, a [`DriverError::Context`] that keeps the cause as its
//! source (the CLI prints the chain once).

use std::fmt::Display;

/// Why a compile or a run failed.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// An option or an input the pipeline cannot use, with what to do instead.
    #[error("{0}")]
    Invalid(String),
    /// What the driver was doing when `source` failed.
    #[error("{context}")]
    Context {
        context: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    /// `--dump-after` or a pass insertion named a point the pipeline does not have.
    #[error("unknown pipeline point `{name}`; the points are: {}", crate::compile::Point::ALL.map(|p| p.name()).join(", "))]
    UnknownPoint { name: String },
    /// A pass inserted at a pipeline point failed or left a module that does not verify.
    #[error("pass `{pass}` inserted after `{point}`")]
    InsertedPass {
        pass: String,
        point: &'static str,
        #[source]
        source: ppcc_passes::PassError,
    },
    /// A module of the pipeline does not verify (an internal error, or an inserted pass).
    #[error("{what} does not verify:{}", errors.iter().take(10).map(|e| format!("\n  {e}")).collect::<String>())]
    Verify {
        what: String,
        errors: Vec<ppir::verify::VerifyError>,
    },
    #[error(transparent)]
    Pass(#[from] ppcc_passes::PassError),
    #[error(transparent)]
    Cost(#[from] ppcc_passes::cost::CostError),
    #[error(transparent)]
    Schedule(#[from] ppcc_passes::schedule::ScheduleError),
    /// A `.pps` schedule file that does not compile: `path:line:col: what`.
    #[error("{}:{error}", path.display())]
    Pps {
        path: std::path::PathBuf,
        error: ppcc_passes::schedule::pps::PpsError,
    },
    #[error(transparent)]
    Onnx(#[from] ppcc_frontends::onnx::OnnxError),
    #[error(transparent)]
    StableHlo(#[from] ppcc_frontends::stablehlo::StableHloError),
    #[error(transparent)]
    Codegen(#[from] ppcc_codegen::CodegenError),
    #[error(transparent)]
    Plan(#[from] ppcc_runtime::pipeline::PlanSpecError),
    #[error(transparent)]
    Integrity(#[from] ppcc_runtime::integrity::IntegrityError),
    #[error(transparent)]
    Npz(#[from] ppcc_runtime::npz::NpzError),
    #[error(transparent)]
    Native(#[from] ppcc_runtime::native::NativeError),
    #[error(transparent)]
    Runtime(#[from] ppcc_runtime::RuntimeError),
    #[error(transparent)]
    Transport(#[from] ppcc_runtime::transport::TransportError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

pub type Result<T, E = DriverError> = std::result::Result<T, E>;

/// `return Err(DriverError::Invalid(format!(...)))`.
macro_rules! bail {
    ($($t:tt)*) => {
        return Err($crate::error::DriverError::Invalid(format!($($t)*)))
    };
}
pub(crate) use bail;

/// `DriverError::Invalid(format!(...))`.
macro_rules! invalid {
    ($($t:tt)*) => {
        $crate::error::DriverError::Invalid(format!($($t)*))
    };
}
pub(crate) use invalid;

/// What the driver was doing, added to a failure (kept as the cause).
pub trait Context<T> {
    fn context<C: Display>(self, c: C) -> Result<T>;
    fn with_context<C: Display>(self, f: impl FnOnce() -> C) -> Result<T>;
}

impl<T, E: std::error::Error + Send + Sync + 'static> Context<T> for std::result::Result<T, E> {
    fn context<C: Display>(self, c: C) -> Result<T> {
        self.map_err(|e| DriverError::Context {
            context: c.to_string(),
            source: Box::new(e),
        })
    }
    fn with_context<C: Display>(self, f: impl FnOnce() -> C) -> Result<T> {
        self.map_err(|e| DriverError::Context {
            context: f().to_string(),
            source: Box::new(e),
        })
    }
}

impl<T> Context<T> for Option<T> {
    fn context<C: Display>(self, c: C) -> Result<T> {
        self.ok_or_else(|| DriverError::Invalid(c.to_string()))
    }
    fn with_context<C: Display>(self, f: impl FnOnce() -> C) -> Result<T> {
        self.ok_or_else(|| DriverError::Invalid(f().to_string()))
    }
}
