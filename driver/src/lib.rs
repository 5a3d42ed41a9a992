//! # ppcc-driver — the compile and run pipelines as a library
//!
//! The `ppcc` binary parses arguments, calls this crate and prints; tools and tests call
//! it directly.
//!
//! - [`compile`]: a model into a build directory ([`compile::Compiler`]), with named
//!   pipeline [`compile::Point`]s to dump the IR after and to insert passes at.
//! - [`run`]: train a build directory with one worker per device ([`run::run`]).
//! - [`program`]: the training program of a model (shared with single-device training).
//! - [`target`]: where model code runs (interpreter or native code through MLIR).
//! - [`data`]: training data bound to the program's inputs.
//! - [`model`]: loading a model file (ONNX, or StableHLO with `--params`).
//!
//! ```no_run
//! use ppcc_driver::compile::{CompileOptions, Compiler, Event, Point};
//! let mut c = Compiler::new(CompileOptions::new("examples/mlp.onnx", "build"));
//! c.dump_after(Point::Split);
//! c.on_event(|e| if let Event::Dump { point, text } = e { eprintln!("{point}:\n{text}") });
//! let compiled = c.run().unwrap();
//! println!("{} stages", compiled.plan.partition.stages.len());
//! ```

pub mod compile;
pub mod crash;
pub mod data;
mod error;
pub mod model;
pub mod program;
pub mod run;
pub mod target;
pub mod train;

pub use error::{Context, DriverError, Result};

/// An error and its causes joined by `: `, leaving out a cause whose text the message
/// before it already ends with (errors that print their source also report it as their
/// cause).
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = String::new();
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        let text = c.to_string();
        if !out.ends_with(&text) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
        cur = c.source();
    }
    out
}

/// A closed pipe on stdout (`ppcc run DIR | head`, `ppcc-opt ... | head`) ends the program
/// quietly, as it ends other Unix tools, instead of a panic in `println!` (Rust ignores
/// SIGPIPE by default). For command-line front ends, first thing in `main`.
pub fn default_sigpipe() {
    set_sigpipe(0); // SIG_DFL
}

/// Writes to a closed pipe fail with `EPIPE` instead of ending the process (Rust's own
/// default, which [`default_sigpipe`] undoes): for a process that writes to pipes it must
/// survive, such as `ppcc conform`'s to its workers, with every write handling the error.
pub fn ignore_sigpipe() {
    set_sigpipe(1); // SIG_IGN
}

fn set_sigpipe(handler: usize) {
    extern "C" {
        fn signal(signum: i32, handler: usize) -> usize;
    }
    const SIGPIPE: i32 = 13;
    // SAFETY: changes the disposition of SIGPIPE only, to SIG_DFL or SIG_IGN.
    unsafe {
        signal(SIGPIPE, handler);
    }
}
