//! `ppcc`: compile a model into a pipeline-parallel training program, and train it.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod compile_cmd;
mod conform_cmd;
mod onnx_cmds;
mod program;
mod run_cmd;
mod simulate_cmd;
mod train_cmd;

/// ppcc — a pipeline-parallel training compiler.
///
/// `ppcc MODEL.onnx -o DIR --stages P --microbatches M` compiles a model: it builds the
/// training program (autodiff, loss, optimizer), cuts it into pipeline stages that form a
/// DAG (parallel branches on different devices), inserts send/recv on every cut edge,
/// picks a schedule and predicts its time and memory. The subcommands import, evaluate,
/// train on one device and simulate schedules.
#[derive(Parser)]
#[command(
    name = "ppcc",
    version,
    about,
    long_about,
    propagate_version = true,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    subcommand_value_name = "COMMAND",
    subcommand_help_heading = "Commands"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    compile: compile_cmd::CompileArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Compile a model into a pipeline plan (the same as `ppcc MODEL.onnx -o DIR ...`).
    Compile(Box<compile_cmd::CompileArgs>),
    /// Train a compiled plan with one worker per device, in the schedule's order.
    Run(run_cmd::RunArgs),
    /// Import a model (ONNX or StableHLO) and print (or write) its ppir.
    Import(onnx_cmds::ImportArgs),
    /// Run a model's forward pass with the reference interpreter.
    Eval(onnx_cmds::EvalArgs),
    /// Run ONNX test-data folders against their reference outputs.
    Conform(conform_cmd::ConformArgs),
    /// Train a model on one device with the reference interpreter.
    Train(train_cmd::TrainArgs),
    /// Simulate a pipeline schedule (built-in or torch CSV) on synthetic stage costs.
    Simulate(simulate_cmd::SimulateArgs),
}

/// Keep freed memory in the process instead of returning it to the kernel. Training frees
/// and allocates the same large buffers (activations, gradients, a native module's
/// temporaries) every micro-batch; glibc's defaults serve buffers above its mmap threshold
/// with fresh mappings, so every call page-faults them in again, which measured 2–3× slower
/// stage functions inside a multi-threaded process.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn keep_freed_memory() {
    extern "C" {
        fn mallopt(param: i32, value: i32) -> i32;
    }
    const M_TRIM_THRESHOLD: i32 = -1;
    const M_MMAP_THRESHOLD: i32 = -3;
    // SAFETY: glibc's mallopt, called before any other thread exists; it only changes
    // allocator parameters (returns 0 on a value it refuses, which leaves the default).
    unsafe {
        mallopt(M_MMAP_THRESHOLD, 32 << 20);
        mallopt(M_TRIM_THRESHOLD, 1 << 30);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn keep_freed_memory() {}

fn main() -> ExitCode {
    ppcc_driver::default_sigpipe();
    ppcc_driver::crash::install("ppcc");
    keep_freed_memory();
    let cli = Cli::parse();
    let result = match (cli.command, cli.compile) {
        (Some(c), _) => run(c),
        (None, a) => compile_cmd::compile(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes joined by `: `, leaving out a cause whose text the message
/// before it already ends with (library errors that print their source, such as
/// "cannot read F: No such file", also report it as their cause).
fn error_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.ends_with(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

fn run(command: Command) -> anyhow::Result<ExitCode> {
    // What a crash report says ppcc was doing (`ppcc_driver::crash`); the compiler and
    // `run` name finer steps as they go.
    ppcc_driver::crash::set_step(match &command {
        Command::Compile(_) => "compiling",
        Command::Run(_) => "training (running the stages' generated code)",
        Command::Import(_) => "importing the model",
        Command::Eval(_) => "evaluating the model",
        Command::Conform(_) => "running the conformance suite",
        Command::Train(_) => "training",
        Command::Simulate(_) => "simulating the schedule",
    });
    match command {
        Command::Compile(a) => compile_cmd::compile(*a),
        Command::Run(a) => run_cmd::run(a),
        Command::Import(a) => onnx_cmds::import(a),
        Command::Eval(a) => onnx_cmds::eval(a),
        Command::Conform(a) => conform_cmd::conform(a),
        Command::Train(a) => train_cmd::train(a),
        Command::Simulate(a) => simulate_cmd::simulate_cmd(a),
    }
}

#[cfg(test)]
mod tests {
    use super::error_chain;

    #[test]
    fn a_cause_the_message_already_prints_is_not_repeated() {
        #[derive(Debug, thiserror::Error)]
        #[error("cannot read f.bin: {source}")]
        struct Read {
            source: std::io::Error,
        }
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file");
        let e = anyhow::Error::new(Read { source: io }).context("loading stage 1");
        assert_eq!(
            error_chain(&e),
            "loading stage 1: cannot read f.bin: No such file"
        );
    }
}
