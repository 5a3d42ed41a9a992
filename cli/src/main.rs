//! `ppcc`: compile a model into a pipeline-parallel training program, and train it.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod npz;
mod onnx_cmds;
mod program;
mod simulate_cmd;
mod train_cmd;

/// ppcc — a pipeline-parallel training compiler.
///
/// ppcc imports a model graph (ONNX), builds its training program, cuts it into pipeline
/// stages and generates one module per device. Subcommands below are what exists today.
#[derive(Parser)]
#[command(name = "ppcc", version, about, long_about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Import an ONNX model and print (or write) its ppir.
    Import(onnx_cmds::ImportArgs),
    /// Run a model's forward pass with the reference interpreter.
    Eval(onnx_cmds::EvalArgs),
    /// Run ONNX test-data folders against their reference outputs.
    Conform(onnx_cmds::ConformArgs),
    /// Train a model on one device with the reference interpreter.
    Train(train_cmd::TrainArgs),
    /// Simulate a pipeline schedule (built-in or torch CSV) on synthetic stage costs.
    Simulate(simulate_cmd::SimulateArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Import(a) => onnx_cmds::import(a),
        Command::Eval(a) => onnx_cmds::eval(a),
        Command::Conform(a) => onnx_cmds::conform(a),
        Command::Train(a) => train_cmd::train(a),
        Command::Simulate(a) => simulate_cmd::simulate_cmd(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
