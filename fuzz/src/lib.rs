//! ppcc-fuzz: a fixed-seed mutation fuzzer for ppcc's readers that runs on stable Rust and
//! in CI (cargo-fuzz, in `frontends/fuzz`, needs nightly).
//!
//! - [`targets`]: one [`Target`](targets::Target) per reader — ONNX, npz, plan.json, CSV
//!   schedules in-process; `ppcc import`/`eval`/`train`/`run` as child processes.
//! - [`mutate`]: byte-level mutations; targets add format-aware ones.
//! - [`driver`]: replays saved findings, then fuzzes in supervised worker processes.
//! - [`rng`]: the deterministic generator: the same seed, the same inputs.

pub mod driver;
pub mod mutate;
pub mod rng;
pub mod targets;
