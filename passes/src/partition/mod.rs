//! Partitioners: which pipeline stage each forward op runs on.
//!
//! The input is a forward function with static shapes (`@main` after `bind-batch`). Its
//! ops are costed by building the training program once ([`graph::attribute_costs`]:
//! every forward op's F, B and W time on a device profile, the activations backward keeps,
//! the weights it reads) and grouped into nodes ([`graph::build_node_graph`]: weights stay
//! with their layer, thin chains merge). A partitioner then cuts the nodes into `stages`
//! groups:
//!
//! - [`PartitionKind::Graph`] (GraphPipe): a series-parallel decomposition ([`sp`]) lets
//!   parallel branches get disjoint devices, so the stage graph is a DAG whose longest path
//!   is shorter than a chain's; a dynamic program ([`dp`]) balances stage times under the
//!   memory limit. Regions that are not series-parallel are linearised, and a parallel
//!   block may also be cut as a chain when that is better, so it never loses to
//!   `Sequential` on its own estimate.
//! - [`PartitionKind::Sequential`] (PipeDream): the best chain of consecutive runs of the
//!   topological order, by the same dynamic program.
//! - [`PartitionKind::Uniform`] (what Megatron users do by hand): equal numbers of layers
//!   with weights per stage.
//!
//! Pinned cuts (`pinned`, ONNX node names or value names) force a stage to start at an op;
//! the partitioners balance the rest. Every plan puts each op on exactly one stage, no
//! stage is empty, stages are numbered in a topological order of the stage graph, and the
//! result is deterministic. The estimate of a plan is `(M − 1)·t + l` (slowest stage `t`,
//! longest path `l` of stage times and transfers); the planner re-ranks candidates by
//! simulating the actual schedule.
//!
//! As a pass: `partition{stages=N,kind=graph|sequential|uniform,microbatches=M,profile=h100,loss=auto,pin=NAME;NAME}`
//! (`microbatches` defaults to 2N)
//! sets the `stage` of every op of `@main` (autodiff then carries the stages into `@grad`).

pub mod dp;
pub mod graph;
pub mod sp;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use ppir::{ArgKind, Function, Module, Use, ValueDef};

use crate::autodiff::{AutodiffOptions, LossKind};
use crate::cost::{comm_time, DeviceProfile};
use crate::registry::PassOptions;
use crate::{Pass, PassError};

pub use dp::MemoryModel;
pub use graph::Cost;

const PASS: &str = "partition";

pub(crate) fn fail(message: impl Into<String>) -> PassError {
    PassError::failed(PASS, message)
}

/// Which partitioner.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PartitionKind {
    Graph,
    Sequential,
    Uniform,
}

impl PartitionKind {
    pub const ALL: [PartitionKind; 3] = [
        PartitionKind::Graph,
        PartitionKind::Sequential,
        PartitionKind::Uniform,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PartitionKind::Graph => "graph",
            PartitionKind::Sequential => "sequential",
            PartitionKind::Uniform => "uniform",
        }
    }

    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == s)
    }
}

/// What to partition, and how.
#[derive(Clone, Debug)]
pub struct PartitionOptions {
    /// The forward function (default `main`).
    pub function: String,
    /// Number of stages to make.
    pub stages: usize,
    pub kind: PartitionKind,
    /// Micro-batches per step (weighs the slowest stage against the pipeline depth).
    pub microbatches: usize,
    pub memory: MemoryModel,
    pub profile: DeviceProfile,
    /// Ops (by ONNX node name = `loc`, or result value name) that must start a stage.
    pub pinned: Vec<String>,
    /// How the training program is built (for the backward costs).
    pub autodiff: AutodiffOptions,
    /// How many plans to return at most (best estimate first).
    pub candidates: usize,
    /// Times the training step's ops on the code that will run them (a profile with
    /// `measure_ops` otherwise times them with the interpreter).
    pub op_timer: Option<OpTimer>,
    /// The device of each stage when devices hold several stages (interleaved 1F1B, the V
    /// schedules): the sequential partitioner then also offers its best plan rebalanced so
    /// that the devices, not the stages, carry equal work ([`balance_devices`]).
    pub device_of_stage: Option<Vec<usize>>,
}

/// Measures the ops of a function (a whole training step) as the target runs them:
/// seconds per op for the ops it timed (0 for ops computed inside others), `None` when it
/// cannot run the function (then the profile's own measurement is used).
/// A function's op times (seconds), as an [`OpTimer`] returns them.
pub type OpTimes = std::collections::HashMap<ppir::OpId, f64>;

/// The function an [`OpTimer`] wraps.
pub type OpTimerFn = dyn Fn(&ppir::Function) -> Option<OpTimes> + Send + Sync;

#[derive(Clone)]
pub struct OpTimer(pub std::sync::Arc<OpTimerFn>);

impl std::fmt::Debug for OpTimer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OpTimer")
    }
}

impl PartitionOptions {
    pub fn new(stages: usize, kind: PartitionKind, profile: DeviceProfile) -> Self {
        PartitionOptions {
            function: "main".into(),
            stages,
            kind,
            microbatches: 1,
            memory: MemoryModel {
                limit: profile.memory_bytes,
                stash: stages as f64,
                optimizer_state: 1.0,
            },
            profile,
            pinned: vec![],
            autodiff: AutodiffOptions::default(),
            candidates: 1,
            op_timer: None,
            device_of_stage: None,
        }
    }
}

/// One stage of a plan.
#[derive(Clone, Debug, PartialEq)]
pub struct StagePlan {
    /// Positions of its ops in the forward function.
    pub ops: Vec<usize>,
    pub cost: Cost,
    /// Estimated bytes (see [`MemoryModel::bytes`]).
    pub memory: f64,
    /// Name of its first op (ONNX node name) and last op.
    pub first: String,
    pub last: String,
}

/// A data edge of the stage graph.
#[derive(Clone, Debug, PartialEq)]
pub struct StageEdge {
    pub from: usize,
    pub to: usize,
    /// Bytes of forward activations per micro-batch (the gradients going back are as big).
    pub bytes: f64,
}

/// A partition of the forward function.
#[derive(Clone, Debug, PartialEq)]
pub struct Partition {
    pub kind: PartitionKind,
    /// Stage of each op (by position in the function's op list).
    pub stage_of_op: Vec<u32>,
    pub stages: Vec<StagePlan>,
    pub edges: Vec<StageEdge>,
    /// `(M − 1)·t + l` in seconds.
    pub estimate: f64,
}

impl Partition {
    /// Whether the stages must run one after another: every stage feeds the next
    /// (`s → s+1`), so the stage graph has a single topological order (edges that skip
    /// stages may exist). A graph partition that is not a chain runs some stages side by
    /// side.
    pub fn is_chain(&self) -> bool {
        (1..self.stages.len()).all(|s| self.edges.iter().any(|e| e.from == s - 1 && e.to == s))
    }
}

/// Work that partitioning the same function again can reuse: the ops' costs (from the
/// training program autodiff builds) and the chain dynamic program's plans. Valid for one
/// module, function, profile, autodiff options and op timer — the planner plans a graph
/// partition and then its sequential baseline with one; the stage count, kind, memory
/// model, micro-batches and pinned cuts may differ between calls (they key the plans).
#[derive(Default)]
pub struct PartitionCache {
    costs: Option<Vec<Cost>>,
    chains: Vec<(ChainKey, Vec<ChainPlan>)>,
}

/// A chain plan: its estimate and its stages' nodes.
type ChainPlan = (f64, Vec<Vec<usize>>);

/// Stages, pinned ops, memory model (limit, stash, optimizer state) and micro-batches, as
/// bits.
type ChainKey = (usize, Vec<usize>, [u64; 3], u64);

/// The candidate partitions, best estimate first.
pub fn partition(m: &Module, opts: &PartitionOptions) -> Result<Vec<Partition>, PassError> {
    partition_with(m, opts, &mut PartitionCache::default())
}

/// [`partition`], reusing (and filling) `cache`.
pub fn partition_with(
    m: &Module,
    opts: &PartitionOptions,
    cache: &mut PartitionCache,
) -> Result<Vec<Partition>, PassError> {
    let f = m
        .function(&opts.function)
        .ok_or_else(|| fail(format!("the module has no @{}", opts.function)))?;
    let k = opts.stages;
    if k == 0 {
        return Err(fail("the number of stages must be at least 1"));
    }
    if f.ops().is_empty() {
        return Err(fail(format!("@{} has no ops to partition", f.name)));
    }
    let costs = match &cache.costs {
        Some(c) if c.len() == f.ops().len() => c.clone(),
        _ => {
            let c = graph::attribute_costs(
                m,
                &opts.function,
                &opts.autodiff,
                &opts.profile,
                opts.op_timer.as_ref(),
            )?;
            cache.costs = Some(c.clone());
            c
        }
    };
    let pinned_ops = pinned_positions(f, &opts.pinned)?;
    if opts.kind == PartitionKind::Uniform && !pinned_ops.is_empty() {
        return Err(fail(
            "pinned cuts (--stage-layout) work with the graph and sequential partitioners",
        ));
    }
    let total: f64 = costs.iter().map(|c| c.time()).sum();
    let g = graph::build_node_graph(f, &costs, &pinned_ops, total / (16.0 * k as f64));
    let nn = g.nodes.len();
    if nn < k {
        return Err(fail(format!(
            "@{} has {nn} groups of ops that can go to different stages (after keeping weights with their layers), fewer than the {k} stages asked for",
            f.name
        )));
    }
    let node_cost: Vec<Cost> = g.nodes.iter().map(|n| n.cost).collect();
    let mut pinned_nodes: Vec<usize> = pinned_ops.iter().map(|&i| g.node_of_op[i]).collect();
    pinned_nodes.sort_unstable();
    pinned_nodes.dedup();
    if pinned_nodes.len() >= k && k > 0 {
        return Err(fail(format!(
            "{} pinned cuts make at least {} stages, more than the {k} asked for",
            pinned_nodes.len(),
            pinned_nodes.len() + 1
        )));
    }

    let groups: Vec<Vec<Vec<usize>>> = match opts.kind {
        PartitionKind::Uniform => vec![uniform(&g, k)?],
        PartitionKind::Graph | PartitionKind::Sequential => {
            let mf = opts.microbatches as f64;
            let solve = |memory: MemoryModel, chain: bool| -> Vec<(f64, Vec<Vec<usize>>)> {
                let (root_sp, pins) = root_tree(&g, &pinned_nodes, chain);
                let crossing = |a: &[usize], b: &[usize]| crossing_bytes(&g, a, b);
                let (arena, root) = dp::Arena::new(&root_sp, &node_cost, &crossing);
                let comm = |bytes: f64| comm_time(bytes, &opts.profile);
                let mut solver = dp::Solver::new(&arena, root, memory, mf, &comm);
                solver.pinned = pins;
                solver.chain_only = chain;
                let front = solver.best(root, k);
                // Ties (e.g. one micro-batch, where only the sum counts) go to the better
                // balanced plan.
                front
                    .iter()
                    .map(|p| ((mf - 1.0) * p.t + p.l + 1e-9 * p.t, solver.stages(p)))
                    .collect()
            };
            // The graph partitioner also considers every chain, so it never loses to the
            // sequential one on its estimate.
            // The best few DAG plans are kept too, so the planner can report how the best
            // DAG compares when a chain wins.
            let run = |memory: MemoryModel, cache: &mut PartitionCache| -> Vec<Vec<Vec<usize>>> {
                let key: ChainKey = (
                    k,
                    pinned_ops.clone(),
                    [
                        memory.limit.to_bits(),
                        memory.stash.to_bits(),
                        memory.optimizer_state.to_bits(),
                    ],
                    mf.to_bits(),
                );
                let mut all = match cache.chains.iter().find(|c| c.0 == key) {
                    Some((_, plans)) => plans.clone(),
                    None => {
                        let plans = solve(memory, true);
                        cache.chains.push((key, plans.clone()));
                        plans
                    }
                };
                let mut graph_only = vec![];
                if opts.kind == PartitionKind::Graph {
                    graph_only = solve(memory, false);
                    graph_only.sort_by(|a, b| a.0.total_cmp(&b.0));
                    all.extend(graph_only.iter().cloned());
                }
                all.sort_by(|a, b| a.0.total_cmp(&b.0));
                let mut out: Vec<Vec<Vec<usize>>> = vec![];
                let picked = all
                    .into_iter()
                    .take(opts.candidates.max(1))
                    .chain(graph_only.into_iter().take(3));
                for (_, mut stages) in picked {
                    stages.sort();
                    if !out.contains(&stages) {
                        out.push(stages);
                    }
                }
                out
            };
            let found = run(opts.memory, cache);
            if found.is_empty() {
                let unlimited = MemoryModel {
                    limit: f64::INFINITY,
                    ..opts.memory
                };
                let any = run(unlimited, cache);
                return Err(match any.first() {
                    Some(stages) => over_memory(&g, stages, &opts.memory),
                    None => fail(format!(
                        "no partition of @{} into {k} stages respects the pinned cuts",
                        f.name
                    )),
                });
            }
            found
        }
    };
    let mut out = vec![];
    for stages in &groups {
        let p = materialize(f, &g, stages, opts)?;
        if p.stages.iter().any(|s| s.memory > opts.memory.limit) {
            return Err(over_memory(&g, stages, &opts.memory));
        }
        out.push(p);
    }
    // Devices that hold several stages: the best plan with its boundaries moved until the
    // devices carry equal work ([`balance_devices`]), node by node and op by op (on a
    // graph of single ops, no chains merged).
    if let (Some(dev), PartitionKind::Sequential, true, Some(best)) = (
        &opts.device_of_stage,
        opts.kind,
        pinned_nodes.is_empty(),
        groups.first(),
    ) {
        let fine = graph::build_node_graph(f, &costs, &pinned_ops, 0.0);
        let mut stage_of_op = vec![0usize; f.ops().len()];
        for (s, st) in best.iter().enumerate() {
            for &x in st {
                for &op in &g.nodes[x].ops {
                    stage_of_op[op] = s;
                }
            }
        }
        let mut fine_stages: Vec<Vec<usize>> = vec![vec![]; best.len()];
        for (x, node) in fine.nodes.iter().enumerate() {
            if let Some(&op) = node.ops.first() {
                fine_stages[stage_of_op[op]].push(x);
            }
        }
        for (graph, start) in [(&g, best), (&fine, &fine_stages)] {
            if let Some(stages) = balance_devices(graph, start, dev) {
                let p = materialize(f, graph, &stages, opts)?;
                let new = !out.iter().any(|q| q.stage_of_op == p.stage_of_op);
                if new && p.stages.iter().all(|s| s.memory <= opts.memory.limit) {
                    out.push(p);
                }
            }
        }
    }
    out.sort_by(|a, b| a.estimate.total_cmp(&b.estimate));
    Ok(out)
}

/// Set the `stage` of every op of the partitioned function.
pub fn apply(m: &mut Module, function: &str, p: &Partition) -> Result<(), PassError> {
    let f = m
        .function_mut(function)
        .ok_or_else(|| fail(format!("the module has no @{function}")))?;
    let ops = f.ops().to_vec();
    if ops.len() != p.stage_of_op.len() {
        return Err(fail(format!(
            "the partition has {} ops, @{function} {}",
            p.stage_of_op.len(),
            ops.len()
        )));
    }
    for (op, &s) in ops.iter().zip(&p.stage_of_op) {
        f.op_mut(*op).stage = Some(s);
    }
    Ok(())
}

fn pinned_positions(f: &Function, names: &[String]) -> Result<Vec<usize>, PassError> {
    let mut out = vec![];
    for name in names {
        let pos = f.ops().iter().position(|&op| {
            let d = f.op(op);
            let name = name.strip_prefix('%').unwrap_or(name);
            d.loc.as_deref() == Some(name) || d.results().iter().any(|&r| f.value(r).name == name)
        });
        match pos {
            Some(p) => out.push(p),
            None => {
                let known: Vec<&str> = f
                    .ops()
                    .iter()
                    .filter_map(|&op| f.op(op).loc.as_deref())
                    .take(8)
                    .collect();
                return Err(fail(format!(
                    "no op of @{} is named `{name}` (give ONNX node names, e.g. {}, or result value names)",
                    f.name,
                    known.join(", ")
                )));
            }
        }
    }
    Ok(out)
}

/// The tree the DP runs on: the graph decomposed (or, for a chain, the nodes in order),
/// split at the pinned nodes; returns the root and the root-series children that must
/// start a stage.
fn root_tree(g: &graph::NodeGraph, pinned: &[usize], chain: bool) -> (sp::Sp, Vec<usize>) {
    let n = g.nodes.len();
    let mut bounds: Vec<usize> = pinned.iter().copied().filter(|&p| p > 0).collect();
    bounds.push(n);
    let mut children = vec![];
    let mut pins = vec![];
    let mut start = 0;
    for b in bounds {
        if b <= start {
            continue;
        }
        if start > 0 {
            pins.push(children.len());
        }
        let seg: Vec<usize> = (start..b).collect();
        if chain {
            children.extend(seg.into_iter().map(sp::Sp::Leaf));
        } else {
            match sp::decompose(g, &seg) {
                sp::Sp::Series(cs) => children.extend(cs),
                other => children.push(other),
            }
        }
        start = b;
    }
    if children.len() == 1 && pins.is_empty() {
        if let Some(only) = children.pop() {
            return (only, pins);
        }
    }
    (sp::Sp::Series(children), pins)
}

/// Bytes of the distinct values produced in nodes `a` and read in nodes `b`.
fn crossing_bytes(g: &graph::NodeGraph, a: &[usize], b: &[usize]) -> f64 {
    // Membership by node index, not hashed: the DP asks this for every cut of every series.
    const IN_A: u8 = 1;
    const IN_B: u8 = 2;
    let mut side = vec![0u8; g.nodes.len()];
    for &n in a {
        side[n] |= IN_A;
    }
    for &n in b {
        side[n] |= IN_B;
    }
    let mut seen = HashSet::new();
    g.edges
        .iter()
        .filter(|e| side[e.from] & IN_A != 0 && side[e.to] & IN_B != 0 && seen.insert(e.value))
        .map(|e| e.bytes)
        .sum()
}

/// Equal numbers of layers with weights per stage, in topological order; nodes without
/// weights go with the next layer (the tail with the last stage).
fn uniform(g: &graph::NodeGraph, k: usize) -> Result<Vec<Vec<usize>>, PassError> {
    let n = g.nodes.len();
    let layers: Vec<usize> = (0..n)
        .filter(|&i| g.nodes[i].cost.param_bytes > 0.0)
        .collect();
    let l = layers.len();
    if l < k {
        return Err(fail(format!(
            "the uniform partition needs at least {k} layers with weights, the model has {l}"
        )));
    }
    let mut stage_of = vec![k - 1; n];
    let mut next = l; // index into layers of the next layer at or after node i
    for i in (0..n).rev() {
        if next > 0 && layers[next - 1] >= i {
            next -= 1;
        }
        if next < l {
            stage_of[i] = next * k / l;
        }
    }
    let mut out = vec![vec![]; k];
    for (i, &s) in stage_of.iter().enumerate() {
        out[s].push(i);
    }
    Ok(out)
}

/// A chain partition (every edge within a stage or to the next one) made from `stages` by
/// moving stage boundaries while that lowers the busiest device's work
/// (`device_of_stage[s]` holds stage `s`; ties: the sum of squared device loads). The
/// nodes are laid out stage by stage (in index order, which is topological, within each);
/// a move hands the nodes between a boundary and any point up to the next boundary to the
/// neighbouring stage (so a run of ops that cost nothing, a reshape or a residual add,
/// never blocks it), keeping every stage non-empty and the partition a chain. `None` when
/// `stages` is not a chain or no move helps. The planner simulates the result beside the
/// partitioner's own plans and keeps whichever runs fastest; it calls this on the
/// partitioner's nodes and on a graph of single ops (no chains merged), where a boundary
/// can move by one op.
///
/// Equal work is not always what a V schedule finishes first with (device `d` starts `d`
/// chunk forwards after device 0 and ends about `d` chunk input gradients before it), but
/// giving the V's top devices 1% or 2% more, or laying the devices out afresh from the
/// outside in to exact shares, simulated no faster on the 48-layer GPT of BENCHMARKS.md
/// (issue 18).
fn balance_devices(
    g: &graph::NodeGraph,
    stages: &[Vec<usize>],
    device_of_stage: &[usize],
) -> Option<Vec<Vec<usize>>> {
    let k = stages.len();
    let n = g.nodes.len();
    if k < 2 || device_of_stage.len() != k {
        return None;
    }
    let mut stage_of_node = vec![usize::MAX; n];
    for (s, st) in stages.iter().enumerate() {
        for &x in st {
            if x >= n || stage_of_node[x] != usize::MAX {
                return None;
            }
            stage_of_node[x] = s;
        }
    }
    if stage_of_node.contains(&usize::MAX) || stages.iter().any(|s| s.is_empty()) {
        return None;
    }
    // Stages in chain order: the one that holds the first node comes first, and so on.
    let mut chain_order: Vec<usize> = (0..k).collect();
    chain_order.sort_by_key(|&s| stages[s].iter().min().copied());
    let mut rank_of_stage = vec![0usize; k];
    for (i, &s) in chain_order.iter().enumerate() {
        rank_of_stage[s] = i;
    }
    // The layout: nodes by (stage in chain order, index); bounds[i]..bounds[i + 1] is the
    // i-th stage of the chain.
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&x| (rank_of_stage[stage_of_node[x]], x));
    let mut bounds = vec![0usize; k + 1];
    for (i, &s) in chain_order.iter().enumerate() {
        bounds[i + 1] = bounds[i] + stages[s].len();
    }
    // Stages are numbered in chain order (see [`materialize`]).
    let device = device_of_stage;
    let devices = device.iter().copied().max()? + 1;
    let mut prefix = vec![0.0f64; n + 1];
    for i in 0..n {
        prefix[i + 1] = prefix[i] + g.nodes[order[i]].cost.time();
    }
    let mut stage_at = vec![0usize; n];
    let mut is_chain = |b: &[usize]| -> bool {
        for s in 0..k {
            for &x in &order[b[s]..b[s + 1]] {
                stage_at[x] = s;
            }
        }
        (0..n).all(|u| {
            g.succs[u]
                .iter()
                .all(|&v| stage_at[v] == stage_at[u] || stage_at[v] == stage_at[u] + 1)
        })
    };
    if !is_chain(&bounds) {
        return None;
    }
    let score = |b: &[usize]| -> (f64, f64) {
        let mut load = vec![0.0f64; devices];
        for s in 0..k {
            load[device[s]] += prefix[b[s + 1]] - prefix[b[s]];
        }
        let max = load.iter().copied().fold(0.0, f64::max);
        (max, load.iter().map(|x| x * x).sum())
    };
    let lowers = |sc: (f64, f64), than: (f64, f64)| {
        sc.0 < than.0 * (1.0 - 1e-12) || (sc.0 <= than.0 && sc.1 < than.1 * (1.0 - 1e-12))
    };
    let start = score(&bounds);
    let mut best = start;
    // Each accepted move lowers the score; bounded all the same.
    for _ in 0..4 * n {
        // Scored from the device loads: only the two devices on either side of the moved
        // boundary change.
        let mut load = vec![0.0f64; devices];
        for s in 0..k {
            load[device[s]] += prefix[bounds[s + 1]] - prefix[bounds[s]];
        }
        let mut moves: Vec<(usize, usize, (f64, f64))> = vec![];
        for i in 1..k {
            let (d1, d2) = (device[i - 1], device[i]);
            if d1 == d2 {
                continue;
            }
            let rest = (0..devices)
                .filter(|&d| d != d1 && d != d2)
                .map(|d| load[d])
                .fold(0.0, f64::max);
            for nb in bounds[i - 1] + 1..bounds[i + 1] {
                if nb == bounds[i] {
                    continue;
                }
                // What stage i − 1 gains (negative: loses) and stage i loses.
                let delta = prefix[nb] - prefix[bounds[i]];
                let (l1, l2) = (load[d1] + delta, load[d2] - delta);
                let sc = (
                    rest.max(l1).max(l2),
                    best.1 + 2.0 * delta * (load[d1] - load[d2]) + 2.0 * delta * delta,
                );
                if lowers(sc, best) {
                    moves.push((i, nb, sc));
                }
            }
        }
        // Best first; among equal scores the shortest move; the first that keeps a chain
        // is taken (a move across a long edge, e.g. a residual, may not).
        moves.sort_by(|x, y| {
            (x.2 .0.total_cmp(&y.2 .0))
                .then(x.2 .1.total_cmp(&y.2 .1))
                .then(x.1.abs_diff(bounds[x.0]).cmp(&y.1.abs_diff(bounds[y.0])))
        });
        let found = moves.into_iter().find_map(|(i, nb, _)| {
            let mut c = bounds.clone();
            c[i] = nb;
            is_chain(&c).then_some(c)
        });
        match found {
            Some(c) => {
                bounds = c;
                // Recomputed, so rounding does not build up over the moves.
                best = score(&bounds);
            }
            None => break,
        }
    }
    lowers(best, start).then(|| {
        (0..k)
            .map(|s| {
                let mut st = order[bounds[s]..bounds[s + 1]].to_vec();
                st.sort_unstable();
                st
            })
            .collect()
    })
}

/// Turn node groups into a [`Partition`]: number stages topologically, cost them, find the
/// stage edges.
fn materialize(
    f: &Function,
    g: &graph::NodeGraph,
    groups: &[Vec<usize>],
    opts: &PartitionOptions,
) -> Result<Partition, PassError> {
    let k = groups.len();
    let mut group_of = vec![usize::MAX; g.nodes.len()];
    for (s, grp) in groups.iter().enumerate() {
        for &n in grp {
            group_of[n] = s;
        }
    }
    if let Some(n) = group_of.iter().position(|&s| s == usize::MAX) {
        return Err(fail(format!(
            "internal error: node {} ({}) is on no stage",
            n, g.nodes[n].name
        )));
    }
    // Topological numbering (Kahn, smallest first node first). Hand-written: petgraph's
    // toposort has no tie-break, and stage numbers show in plans, lit tests and outputs.
    let mut succ: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); k];
    let mut indeg = vec![0usize; k];
    for e in &g.edges {
        let (a, b) = (group_of[e.from], group_of[e.to]);
        if a != b && succ[a].insert(b) {
            indeg[b] += 1;
        }
    }
    let first: Vec<usize> = groups
        .iter()
        .map(|grp| grp.iter().copied().min().unwrap_or(usize::MAX))
        .collect();
    let mut ready: BTreeSet<(usize, usize)> = (0..k)
        .filter(|&s| indeg[s] == 0)
        .map(|s| (first[s], s))
        .collect();
    let mut number = vec![usize::MAX; k];
    let mut next = 0;
    while let Some(&(fp, s)) = ready.iter().next() {
        ready.remove(&(fp, s));
        number[s] = next;
        next += 1;
        for &t in &succ[s] {
            indeg[t] -= 1;
            if indeg[t] == 0 {
                ready.insert((first[t], t));
            }
        }
    }
    if next != k {
        return Err(fail("internal error: the stage graph has a cycle"));
    }
    let n_ops = f.ops().len();
    let mut stage_of_op = vec![0u32; n_ops];
    for (i, s) in stage_of_op.iter_mut().enumerate() {
        *s = number[group_of[g.node_of_op[i]]] as u32;
    }
    // A param read on several stages (a tied embedding and LM head) is held by each of
    // them: the copies beyond the first reader's are charged below. States must live on
    // one stage.
    let op_pos: HashMap<_, _> = f.ops().iter().enumerate().map(|(i, &op)| (op, i)).collect();
    let mut shared: Vec<(u32, f64)> = vec![];
    for &(v, kind) in f.args() {
        if kind == ArgKind::Input {
            continue;
        }
        let stages: BTreeSet<u32> = f
            .users(v)
            .iter()
            .filter_map(|u| match u {
                Use::Operand(op, _) => op_pos.get(op).map(|&i| stage_of_op[i]),
                Use::Return(_) => None,
            })
            .collect();
        if stages.len() > 1 && kind == ArgKind::State {
            let list: Vec<String> = stages.iter().map(|s| s.to_string()).collect();
            return Err(fail(format!(
                "state %{} is read by ops on stages {}: a state must live on one stage (pin cuts with --stage-layout so that its users share a stage)",
                f.value(v).name,
                list.join(" and ")
            )));
        }
        let first_reader = f
            .users(v)
            .iter()
            .filter_map(|u| match u {
                Use::Operand(op, _) => op_pos.get(op).copied(),
                Use::Return(_) => None,
            })
            .min()
            .map(|i| stage_of_op[i]);
        let bytes = f.ty(v).size_bytes().unwrap_or(0) as f64;
        for s in stages {
            if Some(s) != first_reader {
                shared.push((s, bytes));
            }
        }
    }
    let mut stages: Vec<StagePlan> = (0..k)
        .map(|_| StagePlan {
            ops: vec![],
            cost: Cost::default(),
            memory: 0.0,
            first: String::new(),
            last: String::new(),
        })
        .collect();
    for (i, &s) in stage_of_op.iter().enumerate() {
        stages[s as usize].ops.push(i);
    }
    let op_name = |i: usize| {
        let d = f.op(f.ops()[i]);
        d.loc.clone().unwrap_or_else(|| {
            d.results()
                .first()
                .map(|&r| format!("%{}", f.value(r).name))
                .unwrap_or_else(|| d.kind.to_string())
        })
    };
    for &(s, bytes) in &shared {
        stages[s as usize].cost.param_bytes += bytes;
    }
    for (s, grp) in groups.iter().enumerate() {
        let st = &mut stages[number[s]];
        for &n in grp {
            st.cost += g.nodes[n].cost;
        }
        st.memory = opts.memory.bytes(&st.cost);
        st.first = st.ops.first().map(|&i| op_name(i)).unwrap_or_default();
        st.last = st.ops.last().map(|&i| op_name(i)).unwrap_or_default();
    }
    // Stage edges with the bytes of distinct values.
    let mut bytes: BTreeMap<(usize, usize), f64> = BTreeMap::new();
    let mut seen = HashSet::new();
    let ops = f.ops();
    let pos: HashMap<_, _> = ops.iter().enumerate().map(|(i, &op)| (op, i)).collect();
    for (i, &op) in ops.iter().enumerate() {
        for &v in f.op(op).operands() {
            if let ValueDef::Op(q, _) = f.value(v).def {
                let from = stage_of_op[pos[&q]] as usize;
                let to = stage_of_op[i] as usize;
                if from != to && !crate::split::is_source_op(f, q) && seen.insert((v, to)) {
                    *bytes.entry((from, to)).or_insert(0.0) +=
                        f.ty(v).size_bytes().unwrap_or(0) as f64;
                }
            }
        }
    }
    let edges: Vec<StageEdge> = bytes
        .into_iter()
        .map(|((from, to), bytes)| StageEdge { from, to, bytes })
        .collect();
    let estimate = estimate(&stages, &edges, opts);
    Ok(Partition {
        kind: opts.kind,
        stage_of_op,
        stages,
        edges,
        estimate,
    })
}

/// `(M − 1)·t + l` for stages numbered topologically.
fn estimate(stages: &[StagePlan], edges: &[StageEdge], opts: &PartitionOptions) -> f64 {
    let t = stages.iter().map(|s| s.cost.time()).fold(0.0, f64::max);
    let mut path = vec![0.0f64; stages.len()];
    for s in 0..stages.len() {
        let arrive = edges
            .iter()
            .filter(|e| e.to == s)
            .map(|e| path[e.from] + 2.0 * comm_time(e.bytes, &opts.profile))
            .fold(0.0, f64::max);
        path[s] = arrive + stages[s].cost.time();
    }
    let l = path.iter().copied().fold(0.0, f64::max);
    (opts.microbatches as f64 - 1.0) * t + l
}

/// `3.2 GiB`, `12.0 KiB`, `512 B`.
pub fn human_bytes(b: f64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b;
    let mut i = 0;
    while v.abs() >= 1024.0 && i + 1 < units.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{v:.0} B")
    } else {
        format!("{v:.1} {}", units[i])
    }
}

/// Why a size (`--memory-limit`) does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ByteSizeError {
    #[error("`{text}` is not a positive size")]
    NotPositive { text: String },
    #[error("unknown unit `{unit}` in `{text}` (K, M, G, T, KiB, MiB, GiB, TiB)")]
    UnknownUnit { unit: String, text: String },
}

/// `16G`, `512MiB`, `1000000` → bytes (K/M/G/T are powers of 1000, KiB/MiB/GiB/TiB of
/// 1024).
pub fn parse_bytes(s: &str) -> Result<f64, ByteSizeError> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .ok()
        .filter(|v: &f64| v.is_finite() && *v > 0.0)
        .ok_or_else(|| ByteSizeError::NotPositive {
            text: s.to_string(),
        })?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "t" | "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => (1u64 << 30) as f64,
        "tib" => (1u64 << 40) as f64,
        u => {
            return Err(ByteSizeError::UnknownUnit {
                unit: u.to_string(),
                text: s.to_string(),
            })
        }
    };
    Ok(n * mult)
}

fn over_memory(g: &graph::NodeGraph, stages: &[Vec<usize>], memory: &MemoryModel) -> PassError {
    let (s, need) = stages
        .iter()
        .enumerate()
        .map(|(s, grp)| {
            let mut c = Cost::default();
            for &n in grp {
                c += g.nodes[n].cost;
            }
            (s, memory.bytes(&c))
        })
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap_or((0, 0.0));
    let name = |grp: &Vec<usize>, last: bool| {
        let n = if last {
            grp.iter().max()
        } else {
            grp.iter().min()
        };
        n.map(|&n| g.nodes[n].name.clone()).unwrap_or_default()
    };
    fail(format!(
        "no plan fits the memory limit: in the best one, the stage with ops `{}` to `{}` needs {}, the limit is {} (over by {}); use more stages, a schedule that keeps fewer micro-batches in flight, or a larger memory limit",
        name(&stages[s], false),
        name(&stages[s], true),
        human_bytes(need),
        human_bytes(memory.limit),
        human_bytes(need - memory.limit)
    ))
}

/// `partition{...}`: partition `@main` and set its ops' `stage`.
pub struct PartitionPass {
    pub options: PartitionOptions,
}

impl PartitionPass {
    pub fn from_options(o: &PassOptions) -> Result<Self, PassError> {
        o.expect_only(
            PASS,
            &[
                "stages",
                "kind",
                "microbatches",
                "profile",
                "loss",
                "pin",
                "function",
                "memory-limit",
            ],
        )?;
        let stages = o.u64(PASS, "stages")?.ok_or_else(|| {
            PassError::Usage("pass `partition` needs an option: partition{stages=N}".into())
        })? as usize;
        let kind = match o.get("kind") {
            None => PartitionKind::Graph,
            Some(k) => PartitionKind::from_name(k).ok_or_else(|| {
                PassError::Usage(format!(
                    "pass `partition`: unknown kind `{k}` (graph, sequential, uniform)"
                ))
            })?,
        };
        let profile = DeviceProfile::builtin(o.get("profile").unwrap_or("h100"))
            .map_err(|e| PassError::Usage(format!("pass `partition`: {e}")))?;
        let mut options = PartitionOptions::new(stages, kind, profile);
        options.microbatches = match o.u64(PASS, "microbatches")? {
            Some(m) => m.max(1) as usize,
            None => 2 * stages.max(1),
        };
        if let Some(l) = o.get("memory-limit") {
            options.memory.limit = parse_bytes(l)
                .map_err(|e| PassError::Usage(format!("pass `partition`: memory-limit: {e}")))?;
        }
        if let Some(f) = o.get("function") {
            options.function = f.to_string();
            options.autodiff.function = f.to_string();
        }
        if let Some(l) = o.get("loss") {
            options.autodiff.loss = LossKind::from_name(l).ok_or_else(|| {
                PassError::Usage(format!(
                    "pass `partition`: unknown loss `{l}` (auto, cross-entropy, mse, output)"
                ))
            })?;
        }
        if let Some(p) = o.get("pin") {
            options.pinned = p
                .split(';')
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect();
        }
        Ok(PartitionPass { options })
    }
}

impl Pass for PartitionPass {
    fn name(&self) -> &'static str {
        PASS
    }

    fn run(&self, module: &mut Module) -> Result<(), PassError> {
        let best = partition(module, &self.options)?
            .into_iter()
            .next()
            .ok_or_else(|| fail("no partition found"))?;
        apply(module, &self.options.function, &best)
    }
}

/// Stage per op of a forward function, from its ops' `stage` tags (for reports on a
/// hand-partitioned module); `None` if some op has no stage.
pub fn stages_of(f: &Function) -> Option<Vec<u32>> {
    f.ops().iter().map(|&op| f.op(op).stage).collect()
}

#[cfg(test)]
mod balance_tests {
    use super::balance_devices;
    use super::graph::{Cost, Node, NodeGraph};

    /// A chain of nodes with the given times (F only).
    fn chain(times: &[f64]) -> NodeGraph {
        let n = times.len();
        NodeGraph {
            nodes: times
                .iter()
                .enumerate()
                .map(|(i, &t)| Node {
                    ops: vec![i],
                    cost: Cost {
                        f: t,
                        ..Cost::default()
                    },
                    name: format!("n{i}"),
                })
                .collect(),
            edges: vec![],
            preds: (0..n)
                .map(|i| if i == 0 { vec![] } else { vec![i - 1] })
                .collect(),
            succs: (0..n)
                .map(|i| if i + 1 < n { vec![i + 1] } else { vec![] })
                .collect(),
            node_of_op: (0..n).collect(),
            is_source: (0..n).map(|i| i == 0).collect(),
            is_sink: (0..n).map(|i| i + 1 == n).collect(),
        }
    }

    fn loads(stages: &[Vec<usize>], times: &[f64], dev: &[usize]) -> Vec<f64> {
        let mut load = vec![0.0; dev.iter().max().unwrap() + 1];
        for (s, nodes) in stages.iter().enumerate() {
            load[dev[s]] += nodes.iter().map(|&i| times[i]).sum::<f64>();
        }
        load
    }

    /// The V pairs stage r with stage 2p−1−r: equal stages can still leave devices unequal
    /// when the chain's nodes differ; moving boundaries evens the devices out.
    #[test]
    fn devices_of_a_v_get_equal_work() {
        // 4 stages on 2 devices as a V: device 0 holds stages 0 and 3, device 1 stages 1, 2.
        let times = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 3.0, 3.0];
        let dev = [0, 1, 1, 0];
        let g = chain(&times);
        // Device 0 runs 1 + 3 = 4, device 1 runs 3 + 5 = 8; 6 and 6 is possible.
        let start = vec![vec![0], vec![1, 2, 3], vec![4, 5, 6], vec![7]];
        let before = loads(&start, &times, &dev);
        let out = balance_devices(&g, &start, &dev).expect("a better balance exists");
        let after = loads(&out, &times, &dev);
        let max = |l: &[f64]| l.iter().copied().fold(0.0, f64::max);
        assert!(max(&after) < max(&before), "{before:?} -> {after:?}");
        assert_eq!(max(&after), 6.0, "{out:?}");
        // Still a chain of consecutive, non-empty runs covering every node once.
        let flat: Vec<usize> = out.iter().flatten().copied().collect();
        assert_eq!(flat, (0..8).collect::<Vec<_>>());
        assert!(out.iter().all(|s| !s.is_empty()));
        // Already balanced: nothing to offer.
        assert_eq!(balance_devices(&g, &out, &dev), None);
        // Not a run of consecutive nodes: not a chain partition this can move.
        let scattered = vec![vec![0, 2], vec![1, 3], vec![4, 5, 6], vec![7]];
        assert_eq!(balance_devices(&g, &scattered, &dev), None);
    }

    /// Ops that cost nothing (a reshape, a residual add) at every boundary: handing one
    /// over changes no load, so a move must reach past them.
    #[test]
    fn a_boundary_moves_past_ops_that_cost_nothing() {
        let times = [1.0, 0.0, 2.0, 1.0, 1.0, 1.0, 0.0, 1.0];
        let dev = [0, 1, 1, 0];
        let g = chain(&times);
        // Handing over the one next node at either of the two boundaries between devices
        // (0 | 1 and 6 | 7) moves nothing.
        let start = vec![vec![0], vec![1, 2, 3], vec![4, 5, 6], vec![7]];
        assert_eq!(loads(&start, &times, &dev), [2.0, 5.0]);
        let out = balance_devices(&g, &start, &dev).expect("3 and 4 is possible");
        let mut after = loads(&out, &times, &dev);
        after.sort_by(f64::total_cmp);
        assert_eq!(after, [3.0, 4.0], "{out:?}");
        let flat: Vec<usize> = out.iter().flatten().copied().collect();
        assert_eq!(flat, (0..8).collect::<Vec<_>>());
    }
}
