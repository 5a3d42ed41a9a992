//! Recomputation on random partitioned models: the training function computes bit-for-bit
//! the same loss and gradients with `all` and with `auto` at several budgets as without
//! recomputation (the copies are the same ops on the same values), the program still
//! splits into stages, and each stage's stash — the forward function's extra results
//! after `insert-send-recv` — is exactly the bytes the choice predicted, within its
//! budget where the budget can be met.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use common::{i64t, ModelBuilder, Rng};
use ppcc_passes::autodiff::build_gradient_function;
use ppcc_passes::cost::DeviceProfile;
use ppcc_passes::recompute::{
    analyze, choose_all, choose_within, evaluate, recompute_function, Budget, RecomputeMode,
};
use ppcc_passes::split::{split_stages, SplitOptions};
use ppir::{Attr, Attrs, Function, Module, OpKind::*, Tensor, ValueId};

use common::Dist::{Away, Uniform};

fn a() -> Attrs {
    Attrs::new()
}

/// A random transformer-like stack: blocks of MLPs (relu, tanh or gelu), layer norms,
/// softmax gates, training-mode dropout and residual branches, in random widths; ops
/// tagged with `stages` contiguous stages.
fn random_model(seed: u64, stages: u32) -> (Module, HashMap<String, Tensor>) {
    let mut b = ModelBuilder::new(seed);
    let mut rng = Rng::new(seed ^ 0xabcdef);
    let rows = 2 + rng.below(4) as usize;
    let mut width = 3 + rng.below(6) as usize;
    let x0 = b.draw(&[rows, width], Uniform(-1.0, 1.0));
    let mut x = b.input("x", x0);
    let blocks = 3 + rng.below(5);
    for i in 0..blocks {
        match rng.below(5) {
            0 | 1 => {
                let hidden = 2 + rng.below(8) as usize;
                let w1 = b.param(&format!("w{i}a"), &[width, hidden], Away(0.1, 0.8));
                let b1 = b.param(&format!("b{i}a"), &[hidden], Uniform(-0.5, 0.5));
                let h = b.op(MatMul, &[x, w1], a());
                let h = b.op(Add, &[h, b1], a());
                let act = [Relu, Tanh, Gelu][rng.below(3) as usize];
                let h = b.op(act, &[h], a());
                let out = if rng.below(2) == 0 {
                    width
                } else {
                    2 + rng.below(6) as usize
                };
                let w2 = b.param(&format!("w{i}b"), &[hidden, out], Away(0.1, 0.8));
                let y = b.op(MatMul, &[h, w2], a());
                x = if out == width {
                    b.op(Add, &[x, y], a())
                } else {
                    y
                };
                width = out;
            }
            2 => {
                let g = b.param(&format!("ln{i}g"), &[width], Uniform(0.5, 1.5));
                let be = b.param(&format!("ln{i}b"), &[width], Uniform(-0.5, 0.5));
                x = b.op(LayerNorm, &[x, g, be], a());
            }
            3 => {
                let s = b.op(Softmax, &[x], a());
                let w = b.param(&format!("g{i}"), &[width], Away(0.2, 1.0));
                let t = b.op(Mul, &[s, w], a());
                x = b.op(Add, &[x, t], a());
            }
            _ => {
                let d = b.op(
                    Dropout,
                    &[x],
                    a().with("ratio", Attr::Float(0.3))
                        .with("seed", Attr::Int(i as i64 + 1)),
                );
                x = b.op(Tanh, &[d], a());
            }
        }
    }
    let mut model = b.functional(&[x]);
    model.inputs.insert("rng".into(), i64t(&[2], vec![3, 1]));
    // Contiguous stages by op position.
    let f = model.m.function_mut("main").expect("@main");
    let ops: Vec<_> = f.ops().to_vec();
    let n = ops.len() as u32;
    for (i, op) in ops.into_iter().enumerate() {
        f.op_mut(op).stage = Some((i as u32 * stages / n).min(stages - 1));
    }
    build_gradient_function(&mut model.m, &model.opts).unwrap_or_else(|e| panic!("{e}"));
    (model.m, model.inputs)
}

fn run_grad(m: &Module, inputs: &HashMap<String, Tensor>) -> Vec<Tensor> {
    common::run(m, "grad", inputs)
}

/// The stash of each stage after `insert-send-recv`: bytes of its forward function's
/// results other than `loss` and `new.*`.
fn split_stash(m: &Module) -> BTreeMap<u32, f64> {
    let mut m = m.clone();
    let info = split_stages(&mut m, &SplitOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    ppir::verify::verify_module(&m).unwrap_or_else(|e| panic!("{e:?}"));
    info.stages
        .iter()
        .map(|s| {
            let f: &Function = m.function(&s.fwd).expect("fwd");
            let bytes: f64 = f
                .results()
                .iter()
                .filter(|&&v| {
                    let n = &f.value(v).name;
                    n != "loss" && !n.starts_with("new.")
                })
                .map(|&v: &ValueId| f.ty(v).size_bytes().unwrap_or(0) as f64)
                .sum();
            (s.stage, bytes)
        })
        .collect()
}

#[test]
fn recomputation_keeps_values_and_matches_the_predicted_stash() {
    let profile = DeviceProfile::builtin("h100").expect("profile");
    let mut checked = 0;
    for seed in 0..24u64 {
        let stages = 1 + (seed % 3) as u32;
        let (m, inputs) = random_model(seed, stages);
        let want = run_grad(&m, &inputs);
        let g = m.function("grad").expect("@grad");
        let problems = analyze(g, &profile).unwrap_or_else(|e| panic!("{e}"));
        let off_stash = split_stash(&m);
        for p in &problems {
            let all = choose_all(g, p);
            assert!(all.stash_bytes <= all.stash_bytes_off, "seed {seed}");
            assert_eq!(
                off_stash.get(&p.stage).copied().unwrap_or(0.0),
                all.stash_bytes_off,
                "seed {seed}: stage {} stash without recomputation",
                p.stage
            );
        }
        // all, then auto at fractions of each stage's stash.
        let mut runs: Vec<(RecomputeMode, BTreeMap<u32, Budget>)> =
            vec![(RecomputeMode::All, BTreeMap::new())];
        for frac in [0.75, 0.5, 0.25, 0.0] {
            let budgets = problems
                .iter()
                .map(|p| {
                    let inflight = 1.0 + (seed % 3) as f64;
                    let off = choose_all(g, p).stash_bytes_off;
                    (
                        p.stage,
                        Budget {
                            bytes: frac * inflight * off,
                            inflight,
                        },
                    )
                })
                .collect();
            runs.push((RecomputeMode::Auto, budgets));
        }
        for (mode, budgets) in runs {
            let mut m2 = m.clone();
            let f = m2.function_mut("grad").expect("@grad");
            let choices =
                recompute_function(f, mode, &budgets, &profile, Duration::from_millis(300))
                    .unwrap_or_else(|e| panic!("seed {seed} {mode:?}: {e}"));
            ppir::verify::verify_module(&m2).unwrap_or_else(|e| panic!("seed {seed}: {e:?}"));
            let got = run_grad(&m2, &inputs);
            assert_eq!(got.len(), want.len());
            for (i, (x, y)) in got.iter().zip(&want).enumerate() {
                assert_eq!(x, y, "seed {seed} {mode:?} {budgets:?}: result {i} differs");
            }
            let stash = split_stash(&m2);
            for c in &choices {
                assert_eq!(
                    stash.get(&c.stage).copied().unwrap_or(0.0),
                    c.stash_bytes,
                    "seed {seed} {mode:?}: stage {} stash",
                    c.stage
                );
                assert!(c.stash_bytes <= c.stash_bytes_off);
                if let Some(&b) = budgets.get(&c.stage) {
                    // Within the budget, unless nothing fits it.
                    let m = b.memory(c.stash_bytes, c.recomputed_bytes);
                    assert!(
                        m <= b.bytes * (1.0 + 1e-9) || !c.fits,
                        "seed {seed}: stage {} needs {m} over its budget {b:?}",
                        c.stage,
                    );
                }
                if c.ops.is_empty() {
                    assert_eq!(c.extra_time, 0.0);
                }
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 24 * 5);
}

/// On stages small enough to enumerate: the ILP's choice is the least extra time among
/// the subsets of recomputable ops that fit its (conservative) memory model — every
/// recomputed value counted as live at once — and fits the liveness-based model too; no
/// choice is faster than the fastest subset that fits the liveness model; and when
/// nothing fits, no choice claims to.
#[test]
fn the_ilp_choice_is_the_least_extra_time() {
    let profile = DeviceProfile::builtin("h100").expect("profile");
    let (mut compared, mut infeasible, mut inexact) = (0, 0, 0);
    for seed in 100..160u64 {
        let (m, _) = random_model(seed, 2 + (seed % 2) as u32);
        let g = m.function("grad").expect("@grad");
        let made = |c: &ppcc_passes::recompute::StageChoice| -> f64 {
            c.ops
                .iter()
                .flat_map(|&o| g.op(o).results())
                .map(|&v| g.ty(v).size_bytes().unwrap_or(0) as f64)
                .fold(0.0, |a, b| a + b)
        };
        for p in analyze(g, &profile).unwrap_or_else(|e| panic!("{e}")) {
            let mut ops: Vec<_> = p.time.keys().copied().collect();
            ops.sort();
            if ops.is_empty() || ops.len() > 14 {
                continue;
            }
            let off = choose_all(g, &p).stash_bytes_off;
            for (frac, inflight) in [(0.8, 1.0), (0.7, 2.0), (0.6, 4.0)] {
                let budget = Budget {
                    bytes: frac * inflight * off,
                    inflight,
                };
                // The fastest subset under each model.
                let (mut best_live, mut best_sum) = (f64::INFINITY, f64::INFINITY);
                for mask in 0u32..(1 << ops.len()) {
                    let rec: HashSet<_> = (0..ops.len())
                        .filter(|i| mask & (1 << i) != 0)
                        .map(|i| ops[i])
                        .collect();
                    let c = evaluate(g, &p, &rec);
                    if budget.memory(c.stash_bytes, c.recomputed_bytes) <= budget.bytes {
                        best_live = best_live.min(c.extra_time);
                    }
                    if budget.memory(c.stash_bytes, made(&c)) <= budget.bytes {
                        best_sum = best_sum.min(c.extra_time);
                    }
                }
                let exact = choose_within(g, &p, budget, Duration::from_secs(5));
                let greedy = choose_within(g, &p, budget, Duration::ZERO);
                for c in [&exact, &greedy] {
                    let m = budget.memory(c.stash_bytes, c.recomputed_bytes);
                    assert_eq!(c.fits, m <= budget.bytes * (1.0 + 1e-9), "seed {seed}");
                    if c.fits {
                        assert!(c.extra_time >= best_live * (1.0 - 1e-9), "seed {seed}");
                    }
                }
                if best_live.is_infinite() {
                    infeasible += 1;
                    assert!(!exact.fits && !greedy.fits, "seed {seed}");
                    continue;
                }
                if best_sum.is_finite() {
                    assert!(exact.fits, "seed {seed}");
                    assert!(exact.extra_time <= best_sum * (1.0 + 1e-9), "seed {seed}");
                    if exact.exact {
                        compared += 1;
                    } else {
                        inexact += 1;
                    }
                }
            }
        }
    }
    assert!(
        compared >= 10,
        "only {compared} stages compared ({infeasible} infeasible, {inexact} not proven)"
    );
}
