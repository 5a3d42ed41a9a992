//! The onnx package's bundled test models through the importer and the reference
//! interpreter (the library, not the `ppcc conform` binary). The expensive test: run it in
//! release mode in CI (`cargo test --release -p ppcc-frontends --test conformance`).
//!
//! Thresholds (issue 3): every `light/` model passes; `pytorch-converted`,
//! `pytorch-operator` and `simple` together pass at least 90%. Tolerances are those of
//! `ppcc_frontends::onnx::conform::Tolerance::for_dtype` (f32: rtol 1e-3, atol 1e-7, as the
//! onnx backend tests). Unsupported models count as not passed; nothing is skipped.

mod common;

use ppcc_frontends::onnx::conform::{run_dirs, ConformOptions, Outcome, Summary};

fn run(sets: &[&str]) -> (Vec<ppcc_frontends::onnx::conform::CaseResult>, Summary) {
    let root = common::onnx_testdata();
    let dirs: Vec<_> = sets.iter().map(|s| root.join(s)).collect();
    run_dirs(&dirs, &ConformOptions::default(), |r| eprintln!("{r}"))
        .expect("test folders are readable")
}

#[test]
fn light_models_all_pass() {
    let (results, summary) = run(&["light"]);
    eprintln!("light: {summary}");
    assert_eq!(results.len(), 9, "expected the 9 light models");
    let failing: Vec<String> = results
        .iter()
        .filter(|r| !matches!(r.outcome, Outcome::Passed { .. }))
        .map(|r| r.to_string())
        .collect();
    assert!(
        failing.is_empty(),
        "light models not passing:\n{}",
        failing.join("\n")
    );
}

#[test]
fn pytorch_and_simple_models_pass_at_least_90_percent() {
    let (results, summary) = run(&["pytorch-converted", "pytorch-operator", "simple"]);
    eprintln!("pytorch-converted + pytorch-operator + simple: {summary}");
    assert!(results.len() >= 130, "found only {} models", results.len());
    let not_passing: Vec<String> = results
        .iter()
        .filter(|r| !matches!(r.outcome, Outcome::Passed { .. }))
        .map(|r| r.to_string())
        .collect();
    // Failures (wrong numbers) are never acceptable; only unsupported features may miss.
    assert_eq!(
        summary.failed,
        0,
        "failing models:\n{}",
        not_passing.join("\n")
    );
    assert!(
        summary.passed * 10 >= summary.total() * 9,
        "{summary}: below 90%; not passing:\n{}",
        not_passing.join("\n")
    );
}
