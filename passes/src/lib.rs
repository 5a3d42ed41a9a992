//! # ppcc-passes — the passes of the ppcc compiler
//!
//! Every transformation of ppcc is a [`Pass`] over a [`ppir::Module`]: it reads the IR and
//! rewrites it in place. Passes are found by name in a [`PassRegistry`] (so `ppcc-opt
//! --pass NAME` can run any of them alone) and run in order by a [`PassManager`], which
//! verifies the IR after each pass and names the pass that broke it. Passes may also come
//! from shared libraries loaded at run time ([`plugin`]); they implement the same trait.
//!
//! ```
//! use ppcc_passes::{PassManager, PassRegistry};
//! let registry = PassRegistry::builtin();
//! let mut pm = PassManager::new();
//! pm.add(registry.create("canonicalize").unwrap());
//! let mut module = ppir::Module::new();
//! pm.run(&mut module).unwrap();
//! ```

pub mod autodiff;
pub mod canonicalize;
pub mod cost;
pub mod optim;
pub mod partition;
pub mod planner;
pub mod plugin;
pub mod recompute;
mod registry;
pub mod rewrite;
pub mod schedule;
pub mod simulate;
pub mod split;

pub use registry::{PassInfo, PassOptions, PassRegistry};

use ppir::verify::VerifyError;
use ppir::Module;

/// Why a pass (or the pipeline) failed.
#[derive(Debug, thiserror::Error)]
pub enum PassError {
    /// The IR handed to a pass, or produced by it, does not verify.
    #[error("{}", format_verify(.context, .errors))]
    Verify {
        context: String,
        errors: Vec<VerifyError>,
    },
    /// A pass could not do its work on this input.
    #[error("pass `{pass}`: {message}")]
    Failed { pass: String, message: String },
    /// Unknown pass name or bad pass options.
    #[error("{0}")]
    Usage(String),
    /// A plugin could not be loaded, or a plugin's pass failed or returned a bad module.
    #[error(transparent)]
    Plugin(Box<plugin::PluginError>),
}

impl From<plugin::PluginError> for PassError {
    fn from(e: plugin::PluginError) -> Self {
        PassError::Plugin(Box::new(e))
    }
}

fn format_verify(context: &str, errors: &[VerifyError]) -> String {
    let mut s = format!("{context}: {} error(s)", errors.len());
    for e in errors {
        s.push_str("\n  ");
        s.push_str(&e.to_string());
    }
    s
}

impl PassError {
    pub fn failed(pass: &str, message: impl Into<String>) -> Self {
        PassError::Failed {
            pass: pass.to_string(),
            message: message.into(),
        }
    }
}

/// A transformation of a module.
pub trait Pass {
    /// The name the registry and `ppcc-opt --pass` use.
    fn name(&self) -> &'static str;
    /// Run on `module`, rewriting it in place.
    fn run(&self, module: &mut Module) -> Result<(), PassError>;
}

/// Runs passes in order, verifying the IR before the first and after each one.
pub struct PassManager {
    passes: Vec<Box<dyn Pass>>,
    verify_each: bool,
}

impl Default for PassManager {
    fn default() -> Self {
        Self::new()
    }
}

impl PassManager {
    pub fn new() -> Self {
        PassManager {
            passes: vec![],
            verify_each: true,
        }
    }

    /// Whether to run the verifier around every pass (on by default).
    pub fn verify_each(&mut self, on: bool) -> &mut Self {
        self.verify_each = on;
        self
    }

    pub fn add(&mut self, pass: Box<dyn Pass>) -> &mut Self {
        self.passes.push(pass);
        self
    }

    pub fn run(&self, module: &mut Module) -> Result<(), PassError> {
        if self.verify_each {
            verify(module, "input IR does not verify")?;
        }
        for pass in &self.passes {
            pass.run(module)?;
            if self.verify_each {
                verify(
                    module,
                    &format!("IR after pass `{}` does not verify", pass.name()),
                )?;
            }
        }
        Ok(())
    }
}

fn verify(module: &Module, context: &str) -> Result<(), PassError> {
    ppir::verify::verify_module(module).map_err(|errors| PassError::Verify {
        context: context.to_string(),
        errors,
    })
}

/// `verify`: check the module and fail with every verifier error.
pub struct VerifyPass;

impl Pass for VerifyPass {
    fn name(&self) -> &'static str {
        "verify"
    }

    fn run(&self, module: &mut Module) -> Result<(), PassError> {
        verify(module, "verification failed")
    }
}

/// `infer-shapes`: recompute every op's result types from its operands, in body order, so
/// a changed argument type (e.g. a bound batch size) flows through the function.
pub struct InferShapes;

impl Pass for InferShapes {
    fn name(&self) -> &'static str {
        "infer-shapes"
    }

    fn run(&self, module: &mut Module) -> Result<(), PassError> {
        for f in &mut module.functions {
            ppir::shape::infer_function(f)
                .map_err(|e| PassError::failed("infer-shapes", format!("@{}: {e}", f.name)))?;
        }
        Ok(())
    }
}

/// `bind-batch{size=N}`: replace the symbolic batch dimension `?` by N everywhere.
pub struct BindBatch {
    pub size: u64,
}

impl Pass for BindBatch {
    fn name(&self) -> &'static str {
        "bind-batch"
    }

    fn run(&self, module: &mut Module) -> Result<(), PassError> {
        ppir::shape::bind_batch(module, self.size)
            .map_err(|e| PassError::failed("bind-batch", e.to_string()))
    }
}
