//! `recompute`: trade compute for memory in a partitioned training program.
//!
//! Without recomputation every forward value a stage's backward reads is stashed from the
//! micro-batch's `F` until its `W`: a stage keeps that much for every micro-batch in
//! flight. This pass lets the backward make some of those values again from values that
//! are kept: the forward ops that produce them are duplicated into `bwd_input` (or
//! `bwd_weight` when only weight-gradient ops need them), and the backward reads the
//! copies, so the originals are no longer stashed.
//!
//! **The choice, per stage**, is an extraction problem on an egg e-graph (the rewriter's
//! [`PpNode`] language). Every value the choice may touch is an e-class; a value a forward
//! op of the stage produces holds two equivalent e-nodes, the rewrite
//! `stash(v) ≡ op(operands)`: a leaf that loads it from the stash (cost: its bytes, in
//! the memory budget) and the op applied to its operands' classes (cost: the op's time).
//! Values the stage cannot make (function arguments are free; values received from other
//! stages must be stashed) have only the leaf. A choice of one e-node per class reachable
//! from the values the backward reads, each class counted once (a DAG cost), is a
//! recomputation plan. `--recompute`:
//!
//! - `all`: recompute everything the stage can, so the stash is only what the stage
//!   cannot make itself (its received values);
//! - `auto` with a byte budget per stage: the least extra time whose activation memory
//!   (micro-batches in flight × stash + the recomputed values, live during one backward)
//!   fits,
//!   exact by an ILP over the e-graph ([`crate::rewrite::ilp::extract_with`], `microlp`,
//!   with a time limit) warm-started by a greedy "best bytes per second first" heuristic,
//!   which alone decides on large stages;
//! - `off`: nothing.
//!
//! Dropout recomputes the same mask: its mask is a function of the `rng` input and the
//! op's `seed`, which the copy keeps. Ops with side effects (send/recv) never recompute;
//! run this before `insert-send-recv`.
//!
//! As a pass: `recompute{mode=all|auto|off,budget=BYTES,inflight=N,grad=grad,profile=h100,ilp-time-limit-ms=1000}`
//! (`budget` per stage, for `inflight` micro-batches (default 1); `auto` needs it).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use egg::Id;
use ppir::{Function, Module, NewOp, OpId, Phase, Use, ValueDef, ValueId};

use crate::cost::{op_cost, op_time_in, DeviceProfile};
use crate::registry::PassOptions;
use crate::rewrite::egraph::{PpAnalysis, PpEGraph, PpNode};
use crate::rewrite::ilp::{extract_with, IlpProblem};
use crate::split::{assign_stages, is_source_op};
use crate::{Pass, PassError};

const PASS: &str = "recompute";

fn fail(message: impl Into<String>) -> PassError {
    PassError::failed(PASS, message)
}

/// Which activations the backward makes again instead of keeping.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RecomputeMode {
    /// Keep every activation the backward reads.
    Off,
    /// Only what the memory limit needs, least extra time first.
    #[default]
    Auto,
    /// Everything a stage can make again from what it received.
    All,
}

impl RecomputeMode {
    pub fn name(self) -> &'static str {
        match self {
            RecomputeMode::Off => "off",
            RecomputeMode::Auto => "auto",
            RecomputeMode::All => "all",
        }
    }

    pub fn from_name(s: &str) -> Option<Self> {
        match s {
            "off" => Some(RecomputeMode::Off),
            "auto" => Some(RecomputeMode::Auto),
            "all" => Some(RecomputeMode::All),
            _ => None,
        }
    }
}

/// One stage's recomputation problem.
#[derive(Clone, Debug)]
pub struct StageProblem {
    pub stage: u32,
    /// Forward values (of any stage) the stage's backward ops read: the stash without
    /// recomputation, in the order the backward first reads them.
    pub roots: Vec<ValueId>,
    /// The forward ops of this stage that can be recomputed, with their time (seconds).
    pub time: HashMap<OpId, f64>,
    /// The stage's backward ops, with their position in the function body.
    pub bwd: HashMap<OpId, usize>,
    /// The stage's temporaries without recomputation: the most bytes live at once of
    /// values its ops make that only its own function of the same phase reads (each from
    /// its op to its last reader), over the forward, input-gradient and weight-gradient
    /// functions, as [`ppir::memory::peak_temporary_bytes`] counts them on the stage's
    /// functions (the gradient of an LM head's logits is as large as the logits).
    pub working: f64,
}

/// A stage's recomputation plan and what it costs and saves, per micro-batch.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StageChoice {
    pub stage: u32,
    /// Forward ops to duplicate into the backward, in body order.
    pub ops: Vec<OpId>,
    /// Bytes stashed without recomputation.
    pub stash_bytes_off: f64,
    /// Bytes stashed with this plan.
    pub stash_bytes: f64,
    /// The most bytes of recomputed values live at once while the backward of one
    /// micro-batch runs.
    pub recomputed_bytes: f64,
    /// Extra seconds of backward.
    pub extra_time: f64,
    /// Extra floating-point operations.
    pub extra_flops: f64,
    /// Whether the plan is proven the least extra time for the budget (ILP optimal), or
    /// needs no search (`all`, nothing to recompute).
    pub exact: bool,
    /// Whether the budget was met (`all` may still be over it).
    pub fits: bool,
}

/// A stage's memory budget for activations: `inflight · stash + recomputed ≤ bytes`, where
/// `stash` is what one micro-batch keeps from its forward until its backward,
/// `inflight` how many micro-batches the schedule keeps at once, and `recomputed` what the
/// backward of one micro-batch makes again (all of it counted as live at once).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Budget {
    pub bytes: f64,
    pub inflight: f64,
}

impl Budget {
    /// No limit.
    pub const NONE: Budget = Budget {
        bytes: f64::INFINITY,
        inflight: 1.0,
    };

    /// The activation memory of a choice under this budget's micro-batches in flight.
    pub fn memory(&self, stash: f64, recomputed: f64) -> f64 {
        self.inflight * stash + recomputed
    }

    fn fits(&self, stash: f64, recomputed: f64) -> bool {
        self.memory(stash, recomputed) <= self.bytes * (1.0 + 1e-9)
    }
}

fn bytes(g: &Function, v: ValueId) -> f64 {
    g.ty(v).size_bytes().unwrap_or(0) as f64
}

/// A sum that is +0 when empty (`Sum for f64` starts at -0).
fn total(xs: impl Iterator<Item = f64>) -> f64 {
    xs.fold(0.0, |a, b| a + b)
}

/// A value stage `p`'s backward has without a stash: an argument, or a constant of
/// another stage (which `insert-send-recv` makes again where it is read; a constant of
/// the stage itself is stashed unless recomputed, at no cost).
fn is_free(g: &Function, p: &StageProblem, v: ValueId) -> bool {
    match g.value(v).def {
        ValueDef::Arg(_) => true,
        ValueDef::Op(q, _) => is_source_op(g, q) && !p.time.contains_key(&q),
    }
}

fn is_fwd(g: &Function, op: OpId) -> bool {
    matches!(g.op(op).phase, None | Some(Phase::Fwd))
}

fn is_bwd(g: &Function, op: OpId) -> bool {
    matches!(
        g.op(op).phase,
        Some(Phase::BwdInput) | Some(Phase::BwdWeight)
    )
}

/// The recomputation problem of every stage of `g` (a training function whose ops carry
/// stages and phases), by stage.
pub fn analyze(g: &Function, profile: &DeviceProfile) -> Result<Vec<StageProblem>, PassError> {
    let (stage_of, _) = assign_stages(g)?;
    let mut problems: BTreeMap<u32, StageProblem> = BTreeMap::new();
    let mut seen: HashSet<(u32, ValueId)> = HashSet::new();
    for (i, &op) in g.ops().iter().enumerate() {
        let s = stage_of[op.index()];
        let p = problems.entry(s).or_insert_with(|| StageProblem {
            stage: s,
            roots: vec![],
            time: HashMap::new(),
            bwd: HashMap::new(),
            working: 0.0,
        });
        let d = g.op(op);
        if is_fwd(g, op) {
            if !d.kind.has_side_effect() {
                let t = op_time_in(g, op, profile).map_err(|e| fail(e.to_string()))?;
                p.time.insert(op, t);
            }
            continue;
        }
        if !is_bwd(g, op) {
            continue;
        }
        p.bwd.insert(op, i);
        for &v in d.operands() {
            if let ValueDef::Op(q, _) = g.value(v).def {
                if is_fwd(g, q)
                    && (stage_of[q.index()] == s || !is_source_op(g, q))
                    && seen.insert((s, v))
                {
                    p.roots.push(v);
                }
            }
        }
    }
    for (s, w) in working_peaks(g, &stage_of) {
        if let Some(p) = problems.get_mut(&s) {
            p.working = w;
        }
    }
    Ok(problems.into_values().collect())
}

/// Which of a stage's functions an op goes to: forward, input or weight gradient.
fn function_of(g: &Function, op: OpId) -> u8 {
    match g.op(op).phase {
        Some(Phase::BwdInput) => 1,
        Some(Phase::BwdWeight) => 2,
        _ => 0,
    }
}

/// Per stage, the most bytes of temporaries live at once in one of its functions (the
/// ops of one stage and phase, in body order): values made there and read only there,
/// each from its op to its last reader. A value read by another stage or phase leaves
/// the function (stashed or sent) and is not a temporary.
fn working_peaks(g: &Function, stage_of: &[u32]) -> BTreeMap<u32, f64> {
    let group = |op: OpId| (stage_of[op.index()], function_of(g, op));
    let mut temp = vec![0.0f64; g.num_values()];
    let mut remaining = vec![0usize; g.num_values()];
    for &op in g.ops() {
        for &v in g.op(op).results() {
            let local = g.users(v).iter().all(|u| match u {
                Use::Operand(user, _) => group(*user) == group(op),
                Use::Return(_) => false,
            });
            if local {
                temp[v.index()] = bytes(g, v);
                remaining[v.index()] = g.users(v).len();
            }
        }
    }
    let mut live: HashMap<(u32, u8), f64> = HashMap::new();
    let mut peak: BTreeMap<u32, f64> = BTreeMap::new();
    for &op in g.ops() {
        let key = group(op);
        let d = g.op(op);
        let made = total(d.results().iter().map(|&v| temp[v.index()]));
        let now = live.entry(key).or_insert(0.0);
        let p = peak.entry(key.0).or_insert(0.0);
        *p = p.max(*now + made);
        *now += total(
            d.results()
                .iter()
                .filter(|&&v| remaining[v.index()] > 0)
                .map(|&v| temp[v.index()]),
        );
        for &v in d.operands() {
            let left = &mut remaining[v.index()];
            if *left == 1 {
                *now = (*now - temp[v.index()]).max(0.0);
            }
            *left = left.saturating_sub(1);
        }
    }
    peak
}

/// Where a stage's values come from under a set of recomputed ops.
struct Needs {
    /// Values stashed (kept), in first-need order.
    kept: Vec<ValueId>,
    /// Recomputed ops that are needed.
    ops: HashSet<OpId>,
}

/// The values the backward of `p` needs kept, and the recomputed ops it needs, when the
/// ops in `rec` are recomputed.
fn needs(g: &Function, p: &StageProblem, rec: &HashSet<OpId>) -> Needs {
    let mut kept = vec![];
    let mut ops = HashSet::new();
    let mut seen = HashSet::new();
    let mut stack: Vec<ValueId> = p.roots.iter().rev().copied().collect();
    while let Some(v) = stack.pop() {
        if !seen.insert(v) {
            continue;
        }
        if is_free(g, p, v) {
            continue;
        }
        match g.value(v).def {
            ValueDef::Arg(_) => {}
            ValueDef::Op(q, _) if rec.contains(&q) => {
                if ops.insert(q) {
                    stack.extend(g.op(q).operands().iter().rev());
                }
            }
            ValueDef::Op(..) => kept.push(v),
        }
    }
    Needs { kept, ops }
}

/// The figures of recomputing the ops in `rec` (those the backward needs).
pub fn evaluate(g: &Function, p: &StageProblem, rec: &HashSet<OpId>) -> StageChoice {
    summarize(g, p, rec, Budget::NONE, false)
}

/// The most bytes of recomputed values live at once during the backward of one
/// micro-batch, with each copy placed right before its first reader (as [`apply`] does)
/// and freed after its last: keeping a layer's input makes that layer's values live only
/// while its own backward runs.
fn transient(g: &Function, p: &StageProblem, ops: &HashSet<OpId>) -> f64 {
    // A copy sits right before its first reader, after the copies it reads (in body
    // order): its place is (reader's position, its own body index); a backward op's is
    // (position, ∞). A copy lives from its place to its last reader's.
    let body: HashMap<OpId, usize> = g.ops().iter().enumerate().map(|(i, &o)| (o, i)).collect();
    let mut order: Vec<OpId> = ops.iter().copied().collect();
    order.sort_by_key(|o| std::cmp::Reverse(body.get(o).copied().unwrap_or(0)));
    let mut place: HashMap<OpId, (usize, usize)> = HashMap::new();
    let mut events: Vec<((usize, usize), u8, f64)> = vec![];
    for q in order {
        let mut readers: Vec<(usize, usize)> = vec![];
        for &r in g.op(q).results() {
            for u in g.users(r) {
                let Use::Operand(user, _) = u else { continue };
                if ops.contains(user) {
                    if let Some(&(at, _)) = place.get(user) {
                        readers.push((at, body.get(user).copied().unwrap_or(0)));
                    }
                } else if let Some(&at) = p.bwd.get(user) {
                    readers.push((at, usize::MAX));
                }
            }
        }
        let (Some(first), Some(last)) = (
            readers.iter().map(|r| r.0).min(),
            readers.iter().copied().max(),
        ) else {
            continue;
        };
        let at = (first, body.get(&q).copied().unwrap_or(0));
        place.insert(q, at);
        let b = total(g.op(q).results().iter().map(|&v| bytes(g, v)));
        events.push((at, 0, b));
        events.push((last, 1, -b));
    }
    // At one place, what is made there is live together with what ends there.
    events.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut live, mut peak) = (0.0f64, 0.0f64);
    for (_, _, b) in events {
        live += b;
        peak = peak.max(live);
    }
    peak
}

/// The choice's figures for a set of recomputed ops.
fn summarize(
    g: &Function,
    p: &StageProblem,
    rec: &HashSet<OpId>,
    budget: Budget,
    exact: bool,
) -> StageChoice {
    let n = needs(g, p, rec);
    let off = needs(g, p, &HashSet::new());
    let mut ops: Vec<OpId> = n.ops.iter().copied().collect();
    let pos: HashMap<OpId, usize> = g.ops().iter().enumerate().map(|(i, &o)| (o, i)).collect();
    ops.sort_by_key(|o| pos.get(o).copied().unwrap_or(usize::MAX));
    let stash_bytes = total(n.kept.iter().map(|&v| bytes(g, v)));
    let recomputed_bytes = transient(g, p, &n.ops);
    StageChoice {
        stage: p.stage,
        stash_bytes_off: total(off.kept.iter().map(|&v| bytes(g, v))),
        stash_bytes,
        recomputed_bytes,
        extra_time: total(ops.iter().map(|o| p.time.get(o).copied().unwrap_or(0.0))),
        extra_flops: total(ops.iter().map(|&o| op_cost(g, o).map_or(0.0, |c| c.flops))),
        ops,
        exact,
        fits: budget.fits(stash_bytes, recomputed_bytes),
    }
}

/// Everything the stage can recompute (`all`), less the ops whose recomputation would
/// keep more than it saves (a reduction of a received tensor: keeping the small result
/// beats keeping the large operand), the last ones first.
pub fn choose_all(g: &Function, p: &StageProblem) -> StageChoice {
    let mut rec: HashSet<OpId> = needs(g, p, &p.time.keys().copied().collect()).ops;
    let stash =
        |rec: &HashSet<OpId>| -> f64 { needs(g, p, rec).kept.iter().map(|&v| bytes(g, v)).sum() };
    let mut current = stash(&rec);
    let pos: HashMap<OpId, usize> = g.ops().iter().enumerate().map(|(i, &o)| (o, i)).collect();
    let mut order: Vec<OpId> = rec.iter().copied().collect();
    order.sort_by_key(|o| std::cmp::Reverse(pos.get(o).copied().unwrap_or(0)));
    for o in order {
        if !rec.remove(&o) {
            continue;
        }
        let s = stash(&rec);
        if s < current {
            current = s;
            rec = needs(g, p, &rec).ops;
        } else {
            rec.insert(o);
        }
    }
    summarize(g, p, &rec, Budget::NONE, true)
}

/// The least extra time whose activation memory fits `budget`. When nothing fits, the
/// least memory found (`fits` false). The ILP runs when the stage is small enough and
/// `ilp_limit` is not zero.
pub fn choose_within(
    g: &Function,
    p: &StageProblem,
    budget: Budget,
    ilp_limit: Duration,
) -> StageChoice {
    let none = HashSet::new();
    let off = summarize(g, p, &none, budget, true);
    if off.fits {
        return off;
    }
    let mut found = vec![
        summarize(g, p, &greedy(g, p, budget), budget, false),
        summarize(g, p, &checkpoints(g, p, budget), budget, false),
    ];
    let all = choose_all(g, p);
    found.push(summarize(
        g,
        p,
        &all.ops.iter().copied().collect(),
        budget,
        false,
    ));
    if !ilp_limit.is_zero() {
        let warm = found
            .iter()
            .filter(|c| c.fits)
            .min_by(|a, b| a.extra_time.total_cmp(&b.extra_time))
            .map(|c| c.ops.iter().copied().collect())
            .unwrap_or_default();
        if let Some((rec, optimal)) = ilp(g, p, budget, &warm, ilp_limit) {
            found.push(summarize(g, p, &rec, budget, optimal));
        }
    }
    let fitting = found.iter().filter(|c| c.fits).min_by(|a, b| {
        a.extra_time
            .total_cmp(&b.extra_time)
            .then(b.exact.cmp(&a.exact))
    });
    match fitting {
        Some(c) => c.clone(),
        None => found
            .into_iter()
            .min_by(|a, b| {
                let m = |c: &StageChoice| budget.memory(c.stash_bytes, c.recomputed_bytes);
                m(a).total_cmp(&m(b))
            })
            .unwrap_or(off),
    }
}

/// Greedy: while the memory is over the budget, recompute the candidate that saves the
/// most bytes per second of extra time — one kept value's producer (its operands then
/// kept), or that producer with the chain of producers back to kept or free values — then
/// drop recomputed ops the budget does not need, the most expensive first.
fn greedy(g: &Function, p: &StageProblem, budget: Budget) -> HashSet<OpId> {
    let mut rec: HashSet<OpId> = HashSet::new();
    let time = |o: &OpId| p.time.get(o).copied().unwrap_or(0.0);
    let memory = |rec: &HashSet<OpId>| memory_of(g, p, budget, rec);
    loop {
        let n = needs(g, p, &rec);
        let kept: HashSet<ValueId> = n.kept.iter().copied().collect();
        if memory(&rec) <= budget.bytes {
            break;
        }
        let mut best: Option<(f64, f64, Vec<OpId>)> = None;
        for &v in &n.kept {
            let ValueDef::Op(q, _) = g.value(v).def else {
                continue;
            };
            if !p.time.contains_key(&q) {
                continue;
            }
            for chain in [false, true] {
                let set = candidate(g, p, q, &kept, &rec, chain);
                // Bytes saved: kept results of the set, minus operands newly kept, times
                // the micro-batches in flight; minus the set's results, made again.
                let produced: HashSet<ValueId> = set
                    .iter()
                    .flat_map(|&o| g.op(o).results().iter().copied())
                    .collect();
                let saved = total(
                    produced
                        .iter()
                        .filter(|v| kept.contains(v))
                        .map(|&v| bytes(g, v)),
                );
                let mut added = 0.0;
                let mut new_kept = HashSet::new();
                for &o in &set {
                    for &u in g.op(o).operands() {
                        let free = is_free(g, p, u);
                        let made = produced.contains(&u)
                            || matches!(g.value(u).def, ValueDef::Op(r, _) if rec.contains(&r));
                        if !free && !made && !kept.contains(&u) && new_kept.insert(u) {
                            added += bytes(g, u);
                        }
                    }
                }
                let transient = total(produced.iter().map(|&v| bytes(g, v)));
                let gain = budget.inflight * (saved - added) - transient;
                if gain <= 0.0 {
                    continue;
                }
                let t = total(set.iter().map(time));
                let score = gain / t.max(1e-15);
                if best
                    .as_ref()
                    .is_none_or(|(s, b, _)| score > *s || (score == *s && gain > *b))
                {
                    best = Some((score, gain, set));
                }
            }
        }
        match best {
            Some((_, _, set)) => rec.extend(set),
            None => return needs(g, p, &rec).ops,
        }
    }
    // Drop what the budget does not need, the most expensive first.
    let mut order: Vec<OpId> = rec.iter().copied().collect();
    order.sort_by(|a, b| time(b).total_cmp(&time(a)).then(a.cmp(b)));
    for o in order {
        rec.remove(&o);
        if memory(&rec) > budget.bytes {
            rec.insert(o);
        }
    }
    needs(g, p, &rec).ops
}

/// The activation memory of recomputing `rec` under `budget`'s micro-batches in flight.
fn memory_of(g: &Function, p: &StageProblem, budget: Budget, rec: &HashSet<OpId>) -> f64 {
    let n = needs(g, p, rec);
    let stash = total(n.kept.iter().map(|&v| bytes(g, v)));
    budget.memory(stash, transient(g, p, &n.ops))
}

/// Checkpointing from `all`: recomputing everything makes a whole stage's activations
/// live at once in the backward; keeping some values that several ops read (the residual
/// stream between layers, a normalised input) splits that into segments, each live only
/// while its own backward runs. Keep, one at a time, the value that lowers the memory
/// most, while the memory is over the budget; then stop recomputing what the budget does
/// not need, the most expensive first.
fn checkpoints(g: &Function, p: &StageProblem, budget: Budget) -> HashSet<OpId> {
    let mut rec: HashSet<OpId> = choose_all(g, p).ops.into_iter().collect();
    let mut current = memory_of(g, p, budget, &rec);
    let fan_out = |q: OpId| -> bool { g.op(q).results().iter().any(|&r| g.users(r).len() >= 2) };
    for _ in 0..256 {
        if current <= budget.bytes {
            break;
        }
        let mut cands: Vec<OpId> = rec.iter().copied().filter(|&q| fan_out(q)).collect();
        cands.sort();
        let mut best: Option<(f64, OpId)> = None;
        for q in cands {
            let mut r2 = rec.clone();
            r2.remove(&q);
            let m = memory_of(g, p, budget, &r2);
            if best.is_none_or(|(b, _)| m < b) {
                best = Some((m, q));
            }
        }
        match best {
            Some((m, q)) if m < current => {
                rec.remove(&q);
                rec = needs(g, p, &rec).ops;
                current = m;
            }
            _ => break,
        }
    }
    let time = |o: &OpId| p.time.get(o).copied().unwrap_or(0.0);
    let mut order: Vec<OpId> = rec.iter().copied().collect();
    order.sort_by(|a, b| time(b).total_cmp(&time(a)).then(a.cmp(b)));
    for o in order {
        if rec.remove(&o) && memory_of(g, p, budget, &rec) > budget.bytes {
            rec.insert(o);
        }
    }
    needs(g, p, &rec).ops
}

/// The ops recomputing `q` adds: `q` alone, or with `chain` also the producers of its
/// operands that are neither kept, free nor already recomputed (recursively).
fn candidate(
    g: &Function,
    p: &StageProblem,
    q: OpId,
    kept: &HashSet<ValueId>,
    rec: &HashSet<OpId>,
    chain: bool,
) -> Vec<OpId> {
    let mut set = vec![q];
    if !chain {
        return set;
    }
    let mut seen: HashSet<OpId> = HashSet::from([q]);
    let mut i = 0;
    while i < set.len() {
        let o = set[i];
        i += 1;
        for &u in g.op(o).operands() {
            if kept.contains(&u) {
                continue;
            }
            if let ValueDef::Op(r, _) = g.value(u).def {
                if !rec.contains(&r) && p.time.contains_key(&r) && seen.insert(r) {
                    set.push(r);
                }
            }
        }
    }
    set
}

/// Stages larger than this (e-classes) are left to the greedy choice.
const ILP_MAX_CLASSES: usize = 600;

/// The exact choice: the e-graph described in the module docs, extracted by the ILP
/// with the stash bytes as the budgeted cost. Returns the recomputed ops and whether the
/// solver proved them optimal.
fn ilp(
    g: &Function,
    p: &StageProblem,
    budget: Budget,
    warm: &HashSet<OpId>,
    limit: Duration,
) -> Option<(HashSet<OpId>, bool)> {
    // Every value the choice can touch: what `all` reaches.
    let all: HashSet<OpId> = p.time.keys().copied().collect();
    let mut values: Vec<ValueId> = vec![];
    let mut ops: Vec<OpId> = vec![];
    {
        let mut seen = HashSet::new();
        let mut listed = HashSet::new();
        let mut stack: Vec<ValueId> = p.roots.clone();
        while let Some(v) = stack.pop() {
            if !seen.insert(v) {
                continue;
            }
            values.push(v);
            if is_free(g, p, v) {
                continue;
            }
            if let ValueDef::Op(q, _) = g.value(v).def {
                if all.contains(&q) && listed.insert(q) {
                    ops.push(q);
                    stack.extend(g.op(q).operands().iter().copied());
                }
            }
        }
    }
    if values.len() + ops.len() > ILP_MAX_CLASSES {
        return None;
    }
    // Leaves: argument i of the analysis is the stash (or argument) slot of values[i].
    let types = values.iter().map(|&v| g.ty(v).clone()).collect();
    let mut eg = PpEGraph::new(PpAnalysis::new(types));
    let slot: HashMap<ValueId, usize> = values.iter().enumerate().map(|(i, &v)| (v, i)).collect();
    let mut class: HashMap<ValueId, Id> = HashMap::new();
    for (i, &v) in values.iter().enumerate() {
        class.insert(v, eg.add(PpNode::Arg(i as u32)));
    }
    // Ops in dependency order (operands' classes first).
    let pos: HashMap<OpId, usize> = g.ops().iter().enumerate().map(|(i, &o)| (o, i)).collect();
    ops.sort_by_key(|o| pos.get(o).copied().unwrap_or(usize::MAX));
    let mut op_class: HashMap<Id, OpId> = HashMap::new();
    let mut op_node: HashMap<OpId, PpNode> = HashMap::new();
    for &q in &ops {
        let d = g.op(q);
        let attrs = eg.analysis.intern(&d.attrs);
        let args: Vec<Id> = d.operands().iter().map(|u| class[u]).collect();
        let node = PpNode::Op {
            kind: d.kind,
            attrs,
            args,
        };
        let id = eg.add(node.clone());
        op_node.insert(q, node);
        if d.results().len() == 1 {
            eg.union(class[&d.results()[0]], id);
        } else {
            for (i, &r) in d.results().iter().enumerate() {
                if let Some(&c) = class.get(&r) {
                    let rid = eg.add(PpNode::Result(i as u32, [id]));
                    eg.union(c, rid);
                }
            }
        }
        op_class.insert(id, q);
    }
    eg.rebuild();
    let op_class: HashMap<Id, Vec<OpId>> =
        op_class
            .into_iter()
            .fold(HashMap::new(), |mut m: HashMap<Id, Vec<OpId>>, (c, q)| {
                m.entry(eg.find(c)).or_default().push(q);
                m
            });
    let free: Vec<bool> = values.iter().map(|&v| is_free(g, p, v)).collect();
    // In nanoseconds and KiB: the solver's tolerances are absolute.
    let cost = |c: Id, n: &PpNode| -> f64 {
        match n {
            PpNode::Op { .. } => op_class.get(&eg.find(c)).map_or(0.0, |qs| {
                1e9 * qs
                    .iter()
                    .map(|q| p.time.get(q).copied().unwrap_or(0.0))
                    .sum::<f64>()
            }),
            _ => 0.0,
        }
    };
    // A stashed value counts once per micro-batch in flight; a recomputed op's results
    // once (while the backward runs).
    let weight = |c: Id, n: &PpNode| -> f64 {
        match n {
            PpNode::Arg(i) if !free[*i as usize] => {
                budget.inflight * bytes(g, values[*i as usize]) / 1024.0
            }
            PpNode::Op { .. } => op_class.get(&eg.find(c)).map_or(0.0, |qs| {
                total(
                    qs.iter()
                        .flat_map(|&q| g.op(q).results())
                        .map(|&v| bytes(g, v)),
                ) / 1024.0
            }),
            _ => 0.0,
        }
    };
    let allowed = |_: Id, _: &PpNode| true;
    // Warm start: the greedy plan.
    let mut start: HashMap<Id, PpNode> = HashMap::new();
    for &v in &values {
        let c = eg.find(class[&v]);
        let node = match g.value(v).def {
            ValueDef::Op(q, i) if warm.contains(&q) => {
                let opn = op_node[&q].clone();
                if g.op(q).results().len() == 1 {
                    opn
                } else {
                    start.insert(eg.find(eg.lookup(opn.clone())?), opn.clone());
                    PpNode::Result(i as u32, [eg.find(eg.lookup(opn)?)])
                }
            }
            _ => PpNode::Arg(slot[&v] as u32),
        };
        start.entry(c).or_insert(node);
    }
    let roots: Vec<Id> = p.roots.iter().map(|v| eg.find(class[v])).collect();
    let problem = IlpProblem {
        allowed: &allowed,
        cost: &cost,
        budget: Some((&weight, budget.bytes / 1024.0)),
    };
    let choice = extract_with(&eg, &roots, &problem, &start, limit)?;
    let mut rec = HashSet::new();
    for (c, n) in &choice.nodes {
        if matches!(n, PpNode::Op { .. }) {
            if let Some(qs) = op_class.get(&eg.find(*c)) {
                rec.extend(qs.iter().copied());
            }
        }
    }
    Some((needs(g, p, &rec).ops, choice.optimal))
}

/// Duplicate each stage's chosen ops into its backward and point the backward at the
/// copies. A copy goes to `bwd_input` when an input-gradient op (or an input-gradient
/// copy) reads it, else to `bwd_weight`; it is placed right before its first reader.
pub fn apply(g: &mut Function, choices: &[StageChoice]) -> Result<usize, PassError> {
    let (stage_of, _) = assign_stages(g)?;
    // An untagged program stays untagged (it is one stage).
    let tagged = g.ops().iter().any(|&o| g.op(o).stage.is_some());
    let mut copies = 0;
    let mut names: HashSet<String> = (0..g.num_values())
        .map(|i| g.value(ValueId(i as u32)).name.clone())
        .collect();
    let mut order: Vec<OpId> = g.ops().to_vec();
    for c in choices {
        if c.ops.is_empty() {
            continue;
        }
        let s = c.stage;
        let rec: HashSet<OpId> = c.ops.iter().copied().collect();
        // Phase of each copy: from its readers, the last op first.
        let mut phase: HashMap<OpId, Phase> = HashMap::new();
        for &q in c.ops.iter().rev() {
            let mut ph = None;
            for &r in g.op(q).results() {
                for u in g.users(r) {
                    let Use::Operand(user, _) = u else { continue };
                    let p = if rec.contains(user) {
                        phase.get(user).copied()
                    } else if is_bwd(g, *user) && stage_of.get(user.index()) == Some(&s) {
                        g.op(*user).phase
                    } else {
                        None
                    };
                    ph = match (ph, p) {
                        (Some(Phase::BwdInput), _) | (_, Some(Phase::BwdInput)) => {
                            Some(Phase::BwdInput)
                        }
                        (a, b) => a.or(b),
                    };
                }
            }
            phase.insert(q, ph.unwrap_or(Phase::BwdWeight));
        }
        // The copies, in body order (operands before users).
        let mut copy_of: HashMap<ValueId, ValueId> = HashMap::new();
        let mut new_ops: Vec<(OpId, OpId)> = vec![];
        for &q in &c.ops {
            let d = g.op(q).clone();
            let operands: Vec<ValueId> = d
                .operands()
                .iter()
                .map(|u| copy_of.get(u).copied().unwrap_or(*u))
                .collect();
            let types: Vec<_> = d.results().iter().map(|&r| g.ty(r).clone()).collect();
            let result_names: Vec<String> = d
                .results()
                .iter()
                .map(|&r| {
                    let base = format!("{}.rc", g.value(r).name);
                    let mut n = base.clone();
                    let mut k = 1;
                    while !names.insert(n.clone()) {
                        n = format!("{base}{k}");
                        k += 1;
                    }
                    n
                })
                .collect();
            let mut new = NewOp::new(d.kind, operands, types)
                .attrs(d.attrs.clone())
                .names(result_names)
                .phase(phase[&q]);
            if tagged {
                new = new.stage(s);
            }
            if let Some(l) = &d.loc {
                new = new.loc(l.clone());
            }
            let id = g.push_op(new);
            for (&old, &newv) in d.results().iter().zip(g.op(id).results()) {
                copy_of.insert(old, newv);
            }
            new_ops.push((q, id));
            copies += 1;
        }
        // Backward readers on this stage read the copies.
        let readers: Vec<OpId> = order
            .iter()
            .copied()
            .filter(|&o| is_bwd(g, o) && stage_of.get(o.index()) == Some(&s))
            .collect();
        for o in readers {
            let operands = g.op(o).operands().to_vec();
            for (i, u) in operands.iter().enumerate() {
                if let Some(&nv) = copy_of.get(u) {
                    g.set_operand(o, i, nv);
                }
            }
        }
        // Layout: each copy right before its first reader (copies in body order).
        let copy_ops: HashSet<OpId> = new_ops.iter().map(|&(_, n)| n).collect();
        let mut placed: HashSet<OpId> = HashSet::new();
        let mut out = Vec::with_capacity(order.len() + new_ops.len());
        for &o in &order {
            if !copy_ops.contains(&o) {
                place_before(g, o, &copy_ops, &mut placed, &mut out);
            }
            out.push(o);
        }
        order = out;
    }
    // Copies no original op reads stay at the end (none should).
    let listed: HashSet<OpId> = order.iter().copied().collect();
    for &o in g.ops() {
        if !listed.contains(&o) {
            order.push(o);
        }
    }
    g.set_layout(order);
    Ok(copies)
}

/// [`apply`] a plan made on another copy of the same training function: per stage, the
/// (first) result names of the ops to recompute.
pub fn apply_named(g: &mut Function, chosen: &[(u32, Vec<String>)]) -> Result<usize, PassError> {
    let pos: HashMap<OpId, usize> = g.ops().iter().enumerate().map(|(i, &o)| (o, i)).collect();
    let mut choices = vec![];
    for (stage, names) in chosen {
        let mut ops = vec![];
        for n in names {
            let op = g
                .find_value(n)
                .and_then(|v| g.producer(v))
                .ok_or_else(|| {
                    fail(format!(
                        "@{}: no op makes %{n}, which the plan recomputes on stage {stage} (the training program differs from the planned one)",
                        g.name
                    ))
                })?;
            ops.push(op);
        }
        ops.sort_by_key(|o| pos.get(o).copied().unwrap_or(usize::MAX));
        choices.push(StageChoice {
            stage: *stage,
            ops,
            ..Default::default()
        });
    }
    apply(g, &choices)
}

/// Put the copies `o` reads (and theirs, recursively) into `out` before `o`.
fn place_before(
    g: &Function,
    o: OpId,
    copies: &HashSet<OpId>,
    placed: &mut HashSet<OpId>,
    out: &mut Vec<OpId>,
) {
    let mut stack: Vec<(OpId, bool)> = g
        .op(o)
        .operands()
        .iter()
        .rev()
        .filter_map(|&u| g.producer(u))
        .filter(|q| copies.contains(q) && !placed.contains(q))
        .map(|q| (q, false))
        .collect();
    while let Some((q, expanded)) = stack.pop() {
        if placed.contains(&q) {
            continue;
        }
        if expanded {
            placed.insert(q);
            out.push(q);
            continue;
        }
        stack.push((q, true));
        for &u in g.op(q).operands().iter().rev() {
            if let Some(r) = g.producer(u) {
                if copies.contains(&r) && !placed.contains(&r) {
                    stack.push((r, false));
                }
            }
        }
    }
}

/// Choose per stage (`budgets` by stage for `auto`; a stage without one keeps
/// everything) and apply to `g`.
pub fn recompute_function(
    g: &mut Function,
    mode: RecomputeMode,
    budgets: &BTreeMap<u32, Budget>,
    profile: &DeviceProfile,
    ilp_limit: Duration,
) -> Result<Vec<StageChoice>, PassError> {
    if mode == RecomputeMode::Off {
        return Ok(vec![]);
    }
    let problems = analyze(g, profile)?;
    let choices: Vec<StageChoice> = problems
        .iter()
        .map(|p| match mode {
            RecomputeMode::All => choose_all(g, p),
            _ => choose_within(
                g,
                p,
                budgets.get(&p.stage).copied().unwrap_or(Budget::NONE),
                ilp_limit,
            ),
        })
        .collect();
    apply(g, &choices)?;
    Ok(choices)
}

/// The `recompute` pass (see the module docs).
pub struct RecomputePass {
    pub grad: String,
    pub mode: RecomputeMode,
    /// Per stage, for `auto`.
    pub budget: Option<Budget>,
    pub profile: DeviceProfile,
    pub ilp_limit: Duration,
}

impl RecomputePass {
    pub fn from_options(o: &PassOptions) -> Result<Self, PassError> {
        o.expect_only(
            PASS,
            &[
                "mode",
                "budget",
                "inflight",
                "grad",
                "profile",
                "ilp-time-limit-ms",
            ],
        )?;
        let mode = match o.get("mode") {
            None => RecomputeMode::All,
            Some(m) => RecomputeMode::from_name(m).ok_or_else(|| {
                PassError::Usage(format!(
                    "pass `{PASS}`: mode must be off, auto or all, not `{m}`"
                ))
            })?,
        };
        let inflight = o.u64(PASS, "inflight")?.unwrap_or(1).max(1) as f64;
        let budget = match o.get("budget") {
            None => None,
            Some(b) => Some(Budget {
                bytes: crate::partition::parse_bytes(b)
                    .map_err(|e| PassError::Usage(format!("pass `{PASS}`: budget: {e}")))?,
                inflight,
            }),
        };
        if mode == RecomputeMode::Auto && budget.is_none() {
            return Err(PassError::Usage(format!(
                "pass `{PASS}`: mode=auto needs budget=BYTES (activation memory per stage: inflight × stash + recomputed)"
            )));
        }
        let profile = DeviceProfile::builtin(o.get("profile").unwrap_or("h100"))
            .map_err(|e| PassError::Usage(format!("pass `{PASS}`: {e}")))?;
        let ms = o.u64(PASS, "ilp-time-limit-ms")?.unwrap_or(1000);
        Ok(RecomputePass {
            grad: o.get("grad").unwrap_or("grad").to_string(),
            mode,
            budget,
            profile,
            ilp_limit: Duration::from_millis(ms),
        })
    }
}

impl Pass for RecomputePass {
    fn name(&self) -> &'static str {
        PASS
    }

    fn run(&self, m: &mut Module) -> Result<(), PassError> {
        let f = m
            .function_mut(&self.grad)
            .ok_or_else(|| fail(format!("the module has no @{}", self.grad)))?;
        let problems = analyze(f, &self.profile)?;
        let budgets: BTreeMap<u32, Budget> = problems
            .iter()
            .map(|p| (p.stage, self.budget.unwrap_or(Budget::NONE)))
            .collect();
        recompute_function(f, self.mode, &budgets, &self.profile, self.ilp_limit)?;
        Ok(())
    }
}
