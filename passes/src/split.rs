//! `insert-send-recv`: split a partitioned training program into per-stage functions joined
//! by explicit `send`/`recv`.
//!
//! Input: `@grad` (autodiff's training function, ops tagged with a `stage` by the partition
//! and a `phase`) and, if present, `@optim` (the optimizer step). Output: for every stage `s`
//! four functions with the function attribute `stage = s`, replacing `@grad` and `@optim`:
//!
//! | function | runs | arguments | results |
//! | --- | --- | --- | --- |
//! | `@stage<s>.fwd` | `F` of one micro-batch | the inputs (`labels`, `rng`, model inputs) and params/states it reads | `@grad` results it computes (`loss`, `new.<state>`), then its stash |
//! | `@stage<s>.bwd_input` | `B` (input gradients) | stashed values, inputs, params | `@grad` results it computes, then its stash |
//! | `@stage<s>.bwd_weight` | `W` (weight gradients) | stashed values, inputs, params | `grad.<p>` for the stage's params |
//! | `@stage<s>.optim` | `OPT` once per step | the stage's params, states and `grad.<p>` | `new.<p>`, `new.<state>` |
//!
//! **Stash contract.** A value an earlier function of the same stage produced is passed by
//! name: it is a result of the producing function and an `input` argument of the consuming
//! one, with the value's name, for the same micro-batch (a `fwd` value can go straight to
//! `bwd_weight`). Names are `@grad`'s, so they are unique within a stage. A fused backward
//! (`B` in 1F1B) runs `bwd_input` then `bwd_weight`.
//!
//! **Communication.** Every use of a value on another stage than its producer's becomes one
//! `send` right after the producing op (`peer` = consumer stage) and one `recv` in the
//! consumer's function of the *producer's* phase (`peer` = producer stage), inserted where
//! it is first needed there; later phases of the consumer read the received value from the
//! stash. Constants (ops without operands) are not sent: the consumer makes its own copy.
//! Each (value, consumer stage) has its own `channel` id, unique in the module; a
//! runtime tells micro-batches apart itself. Forward values define the stage DAG's edges;
//! an input gradient may only flow back along a forward path (checked), and a
//! weight-gradient value never crosses stages (checked). `@optim` is split by ownership:
//! a stage gets the slice of `@optim` that computes the updates of its own params and their
//! states; values tied to no param (Adam's step counter) are computed by every stage.
//!
//! **Stages of untagged ops.** Ops without a `stage` (the appended loss, gradient sums of
//! parameters, zero gradients) take the stage of their first staged operand's producer or
//! of the param they read; if none, of their first staged user; a `grad.<p>` constant takes
//! the stage of `p`. A param or state must be read by one stage only (tied weights across
//! stages are rejected). A program with no stage tags at all becomes stage 0.
//!
//! **ZeRO-1.** With `zero = D` (and `replicas`), each weight held by one stage has its
//! optimizer state sharded over the D replicas: `reduce_scatter` gives the replica its
//! shard of the gradient sum, `shard` its shard of the weight, the update runs on shards
//! (the optimizer's ops are elementwise; anything else is refused), and `all_gather`
//! joins the updated shards into the weight again (see [`shard_update`]).
//!
//! As a pass: `insert-send-recv{grad=grad,optim=optim,replicas=0|1,zero=D}`.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use petgraph::algo::kosaraju_scc;
use petgraph::graph::{DiGraph, NodeIndex};
use petgraph::visit::Dfs;

use ppir::ops::attrs::{AllReduceAttrs, CommAttrs};
use ppir::ops::OpAttrs;
use ppir::{
    ArgKind, Attr, Attrs, Function, Module, NewOp, OpId, OpKind, Phase, Tensor, TensorType, Use,
    ValueDef, ValueId,
};

use crate::registry::PassOptions;
use crate::{Pass, PassError};

const PASS: &str = "insert-send-recv";

/// The phases a stage's per-micro-batch functions cover, in execution order.
pub const STAGE_PHASES: [Phase; 3] = [Phase::Fwd, Phase::BwdInput, Phase::BwdWeight];

/// The name of stage `stage`'s function for `phase`: `stage2.bwd_input`.
pub fn stage_function_name(stage: u32, phase: Phase) -> String {
    format!("stage{stage}.{}", phase.name())
}

/// What to split.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitOptions {
    /// The training function (default `grad`).
    pub grad: String,
    /// The optimizer function (default `optim`; skipped when the module has none).
    pub optim: String,
    /// The pipeline is replicated for data parallelism: every weight gradient is summed
    /// over the replicas (an `all_reduce` with `replicas` before each update).
    pub replicas: bool,
    /// ZeRO-1 over this many replicas (0 or 1: off): the optimizer state of every
    /// parameter held by one stage is sharded across the replicas — its gradient is
    /// reduce-scattered, each replica updates its shard, and the updated shards are
    /// all-gathered (see [`shard_update`]). A weight shared across stages keeps its
    /// all-reduce and whole state.
    pub zero: usize,
}

impl Default for SplitOptions {
    fn default() -> Self {
        SplitOptions {
            grad: "grad".into(),
            optim: "optim".into(),
            replicas: false,
            zero: 0,
        }
    }
}

/// One `all_reduce` of a weight gradient: every stage in `stages` (and with `replicas`,
/// that stage in every replica) runs it with `channel` in its `optim`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Collective {
    pub channel: i64,
    /// The parameter whose gradient (`grad.<param>`) is summed.
    pub param: String,
    /// The stages that hold the parameter (more than one: a weight shared across stages).
    pub stages: Vec<u32>,
    pub replicas: bool,
    pub bytes: u64,
    /// ZeRO-1: `channel` is a `reduce_scatter` over the replicas and the updated shards are
    /// all-gathered on this channel (the parameter's `shard` op uses the one between).
    pub gather_channel: Option<i64>,
}

/// One `send`/`recv` pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Channel {
    pub id: i64,
    pub from: u32,
    pub to: u32,
    /// The value's name in `@grad` (and in both stages' functions).
    pub value: String,
    /// The producer's phase (`fwd`: activations, `bwd_input`: gradients).
    pub phase: Phase,
    /// Bytes per micro-batch.
    pub bytes: u64,
}

/// The functions of one stage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StageFunctions {
    pub stage: u32,
    pub fwd: String,
    pub bwd_input: String,
    pub bwd_weight: String,
    /// `None` when the module had no optimizer function.
    pub optim: Option<String>,
    /// The params (and states) this stage owns, in `@grad`'s argument order.
    pub params: Vec<String>,
}

/// What [`split_stages`] made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitInfo {
    pub stages: Vec<StageFunctions>,
    pub channels: Vec<Channel>,
    /// Forward stage edges (producer, consumer), sorted.
    pub edges: Vec<(u32, u32)>,
    /// The gradient all-reduces, by channel.
    pub collectives: Vec<Collective>,
}

fn fail(message: impl Into<String>) -> PassError {
    PassError::failed(PASS, message)
}

fn phase_index(f: &Function, op: OpId) -> Result<usize, PassError> {
    match f.op(op).phase {
        None | Some(Phase::Fwd) => Ok(0),
        Some(Phase::BwdInput) => Ok(1),
        Some(Phase::BwdWeight) => Ok(2),
        Some(Phase::Optim) => Err(fail(format!(
            "@{}: op \"{}\" (%{}) has phase optim; optimizer ops belong in the optimizer function",
            f.name,
            f.op(op).kind,
            f.op(op)
                .results()
                .first()
                .map(|&r| f.value(r).name.as_str())
                .unwrap_or("")
        ))),
    }
}

/// Stage of every op of `g` (by op slot) and the owner stage of every param/state argument
/// (by argument name). See the module docs for the rules.
pub fn assign_stages(g: &Function) -> Result<(Vec<u32>, BTreeMap<String, u32>), PassError> {
    let n = g.num_op_slots();
    let mut stage: Vec<Option<u32>> = vec![None; n];
    for &op in g.ops() {
        stage[op.index()] = g.op(op).stage;
    }
    if g.ops().iter().all(|&op| stage[op.index()].is_none()) {
        for &op in g.ops() {
            stage[op.index()] = Some(0);
        }
    }
    // Owners of params and states: the stage of their (staged) users.
    let mut owner: HashMap<ValueId, u32> = HashMap::new();
    for &(v, kind) in g.args() {
        if kind == ArgKind::Input {
            continue;
        }
        let mut stages = BTreeSet::new();
        for u in g.users(v) {
            if let Use::Operand(op, _) = u {
                if let Some(s) = stage[op.index()] {
                    stages.insert(s);
                }
            }
        }
        // A weight read on several stages (tied) is owned by the first of them; the
        // others hold copies (see `tied_params`).
        if let Some(&s) = stages.iter().next() {
            owner.insert(v, s);
        }
    }
    // `grad.<p>` results made without operands (zeros) go with `p`.
    for &r in g.results() {
        let name = &g.value(r).name;
        let (Some(p), ValueDef::Op(op, _)) = (name.strip_prefix("grad."), g.value(r).def) else {
            continue;
        };
        if stage[op.index()].is_none() && g.op(op).operands().is_empty() {
            if let Some(s) = g.find_value(p).and_then(|pv| owner.get(&pv)) {
                stage[op.index()] = Some(*s);
            }
        }
    }
    // Forward: from operands.
    for &op in g.ops() {
        if stage[op.index()].is_some() {
            continue;
        }
        let mut found = None;
        for &v in g.op(op).operands() {
            let s = match g.value(v).def {
                ValueDef::Op(q, _) => stage[q.index()],
                ValueDef::Arg(_) => owner.get(&v).copied(),
            };
            if s.is_some() {
                found = s;
                break;
            }
        }
        stage[op.index()] = found;
    }
    // Backward: from users.
    for &op in g.ops().iter().rev() {
        if stage[op.index()].is_some() {
            continue;
        }
        let mut found = None;
        'results: for &r in g.op(op).results() {
            for u in g.users(r) {
                if let Use::Operand(q, _) = u {
                    if let Some(s) = stage[q.index()] {
                        found = Some(s);
                        break 'results;
                    }
                }
            }
        }
        stage[op.index()] = found;
    }
    let stage: Vec<u32> = stage.into_iter().map(|s| s.unwrap_or(0)).collect();
    // Unused params and states live on stage 0.
    let owners = g
        .args()
        .iter()
        .filter(|(_, k)| *k != ArgKind::Input)
        .map(|&(v, _)| (g.value(v).name.clone(), owner.get(&v).copied().unwrap_or(0)))
        .collect();
    Ok((stage, owners))
}

/// An op with no operands and one result (a constant): cheaper to make again on another
/// stage than to send.
pub fn is_source_op(f: &Function, op: OpId) -> bool {
    let d = f.op(op);
    d.operands().is_empty() && d.results().len() == 1 && !d.kind.has_side_effect()
}

/// A param or state read on several stages: each of them holds a copy, computes its part
/// of the gradient, and the parts are summed by an `all_reduce` before the update (which
/// every holder then computes alike).
#[derive(Clone, Debug)]
struct Tied {
    param: String,
    /// The stages that read it, ascending.
    stages: Vec<u32>,
    /// `@grad`'s `grad.<param>` result, when the param is trained.
    root: Option<ValueId>,
    /// The gradient contributions the sum at `root` adds up, in order.
    leaves: Vec<ValueId>,
}

/// The params and states of `g` read on more than one stage, with the sum tree of their
/// gradient: `root` = `grad.<p>`, its internal nodes are `add`s of values of the root's
/// type used only there (autodiff's sum of contributions), collected into `internal`.
fn tied_params(
    g: &Function,
    stage_of: &[u32],
    internal: &mut HashSet<OpId>,
) -> Result<Vec<Tied>, PassError> {
    let mut out = vec![];
    for &(v, kind) in g.args() {
        if kind == ArgKind::Input {
            continue;
        }
        let stages: BTreeSet<u32> = g
            .users(v)
            .iter()
            .filter_map(|u| match u {
                Use::Operand(op, _) => Some(stage_of[op.index()]),
                Use::Return(_) => None,
            })
            .collect();
        if stages.len() < 2 {
            continue;
        }
        let name = g.value(v).name.clone();
        if kind == ArgKind::State {
            let list: Vec<String> = stages.iter().map(|s| s.to_string()).collect();
            return Err(fail(format!(
                "state %{name} is read on stages {}: a state (running statistics) must live on one stage; pin cuts with --stage-layout so that its users share a stage",
                list.join(" and ")
            )));
        }
        let root = g
            .results()
            .iter()
            .copied()
            .find(|&r| g.value(r).name.strip_prefix("grad.") == Some(name.as_str()));
        let mut leaves = vec![];
        if let Some(root) = root {
            let ty = g.ty(root).clone();
            let mut stack = vec![root];
            while let Some(x) = stack.pop() {
                let expand = match g.value(x).def {
                    ValueDef::Op(q, _)
                        if g.op(q).kind == OpKind::Add
                            && (x == root || g.users(x).len() == 1)
                            && g.op(q).operands().iter().all(|&o| *g.ty(o) == ty) =>
                    {
                        Some(q)
                    }
                    _ => None,
                };
                match expand {
                    Some(q) => {
                        internal.insert(q);
                        // Right operand pushed first: leaves come out left to right.
                        stack.extend(g.op(q).operands().iter().rev().copied());
                    }
                    None => leaves.push(x),
                }
            }
            for &l in &leaves {
                let ValueDef::Op(q, _) = g.value(l).def else {
                    continue;
                };
                let sq = stage_of[q.index()];
                if !stages.contains(&sq) {
                    return Err(fail(format!(
                        "a gradient contribution to the shared weight %{name} (%{}) is computed on stage {sq}, which does not read it",
                        g.value(l).name
                    )));
                }
            }
        }
        out.push(Tied {
            param: name,
            stages: stages.into_iter().collect(),
            root,
            leaves,
        });
    }
    Ok(out)
}

/// Builds the per-stage functions.
struct Builder<'g> {
    g: &'g Function,
    stage_of: Vec<u32>,
    funcs: Vec<[Function; 3]>,
    /// Where a value first exists on a stage: (phase, local value).
    avail: HashMap<(ValueId, u32), (usize, ValueId)>,
    /// The local copy of a value in function (stage, phase).
    local: HashMap<(ValueId, u32, usize), ValueId>,
    /// Results: `@grad` results, then the stash, per (stage, phase).
    named: Vec<[Vec<ValueId>; 3]>,
    stash: Vec<[Vec<ValueId>; 3]>,
    stashed: HashSet<(u32, usize, ValueId)>,
    channel_of: HashMap<(ValueId, u32), i64>,
    channels: Vec<Channel>,
}

impl<'g> Builder<'g> {
    fn value_name(&self, v: ValueId) -> String {
        self.g.value(v).name.clone()
    }

    /// The value `v` of `@grad` inside function (s, ph), importing it as needed.
    fn get(&mut self, v: ValueId, s: u32, ph: usize) -> Result<ValueId, PassError> {
        if let Some(&l) = self.local.get(&(v, s, ph)) {
            return Ok(l);
        }
        let name = self.value_name(v);
        let ty = self.g.ty(v).clone();
        let si = s as usize;
        let l = match self.g.value(v).def {
            ValueDef::Arg(i) => {
                let kind = self.g.args()[i].1;
                self.funcs[si][ph].add_arg(name, ty, kind)
            }
            ValueDef::Op(q, _) if self.stage_of[q.index()] != s && is_source_op(self.g, q) => {
                // A constant: made again where it is needed rather than sent.
                let data = self.g.op(q);
                let mut new = NewOp::new(data.kind, vec![], vec![ty])
                    .attrs(data.attrs.clone())
                    .names(vec![name])
                    .phase(STAGE_PHASES[ph]);
                new.loc = data.loc.clone();
                self.funcs[si][ph].push(new)
            }
            ValueDef::Op(q, _) => {
                if !self.avail.contains_key(&(v, s)) {
                    let sq = self.stage_of[q.index()];
                    if sq == s {
                        return Err(fail(format!(
                            "internal error: %{name} is used on stage {s} before it is computed"
                        )));
                    }
                    let pq = phase_index(self.g, q)?;
                    if pq == 2 {
                        return Err(fail(format!(
                            "%{name} is a weight-gradient (bwd_weight) value of stage {sq} used on stage {s}; weight-gradient work must stay on its stage (is a parameter shared across stages?)"
                        )));
                    }
                    let channel = *self.channel_of.get(&(v, s)).ok_or_else(|| {
                        fail(format!(
                            "internal error: no channel for %{name} from stage {sq} to {s}"
                        ))
                    })?;
                    let attrs = CommAttrs {
                        peer: sq as i64,
                        channel,
                    };
                    let mut new = NewOp::new(OpKind::Recv, vec![], vec![ty.clone()])
                        .attrs(attrs.to_attrs())
                        .names(vec![name.clone()])
                        .phase(STAGE_PHASES[pq]);
                    new.loc = self.g.op(q).loc.clone();
                    let r = self.funcs[si][pq].push(new);
                    self.avail.insert((v, s), (pq, r));
                    self.local.insert((v, s, pq), r);
                    if pq == ph {
                        return Ok(r);
                    }
                }
                let (pa, la) = self.avail[&(v, s)];
                if pa > ph {
                    return Err(fail(format!(
                        "%{name} is computed in phase {} of stage {s} but used in the earlier phase {}",
                        STAGE_PHASES[pa].name(),
                        STAGE_PHASES[ph].name()
                    )));
                }
                if pa == ph {
                    return Ok(la);
                }
                // Stash from phase pa to ph.
                if self.stashed.insert((s, pa, la)) {
                    self.stash[si][pa].push(la);
                }
                self.funcs[si][ph].add_arg(name, ty, ArgKind::Input)
            }
        };
        self.local.insert((v, s, ph), l);
        Ok(l)
    }
}

/// Split `opts.grad` (and `opts.optim`) of `m` into per-stage functions; see the module docs.
pub fn split_stages(m: &mut Module, opts: &SplitOptions) -> Result<SplitInfo, PassError> {
    let g = m
        .function(&opts.grad)
        .ok_or_else(|| fail(format!("the module has no @{} to split", opts.grad)))?
        .clone();
    let (stage_of, owners) = assign_stages(&g)?;
    let num_stages = g
        .ops()
        .iter()
        .map(|&op| stage_of[op.index()] + 1)
        .max()
        .unwrap_or(1);
    let mut counts = vec![0usize; num_stages as usize];
    for &op in g.ops() {
        counts[stage_of[op.index()] as usize] += 1;
    }
    if let Some(s) = counts.iter().position(|&c| c == 0) {
        return Err(fail(format!(
            "stage {s} has no ops (stages must be numbered 0 to {} without gaps)",
            num_stages - 1
        )));
    }

    // Weights shared across stages: the `add`s summing their gradient are rebuilt per
    // stage below.
    let mut internal: HashSet<OpId> = HashSet::new();
    let tied = tied_params(&g, &stage_of, &mut internal)?;

    // Stages other than the producer's that read each value.
    let mut consumers: HashMap<ValueId, BTreeSet<u32>> = HashMap::new();
    for &op in g.ops() {
        if internal.contains(&op) {
            continue;
        }
        let s = stage_of[op.index()];
        for &v in g.op(op).operands() {
            if let ValueDef::Op(q, _) = g.value(v).def {
                if stage_of[q.index()] != s && !is_source_op(&g, q) {
                    consumers.entry(v).or_default().insert(s);
                }
            }
        }
    }

    let ns = num_stages as usize;
    let mut b = Builder {
        g: &g,
        stage_of,
        funcs: (0..ns)
            .map(|s| {
                STAGE_PHASES.map(|p| {
                    let mut f = Function::new(stage_function_name(s as u32, p));
                    f.attrs.set("stage", Attr::Int(s as i64));
                    f
                })
            })
            .collect(),
        avail: HashMap::new(),
        local: HashMap::new(),
        named: vec![Default::default(); ns],
        stash: vec![Default::default(); ns],
        stashed: HashSet::new(),
        channel_of: HashMap::new(),
        channels: vec![],
    };

    for &op in g.ops() {
        if internal.contains(&op) {
            continue;
        }
        let s = b.stage_of[op.index()];
        let ph = phase_index(&g, op)?;
        let data = g.op(op);
        let mut operands = Vec::with_capacity(data.operands().len());
        for &v in data.operands() {
            operands.push(b.get(v, s, ph)?);
        }
        let mut new = NewOp::new(
            data.kind,
            operands,
            g.op(op)
                .results()
                .iter()
                .map(|&r| g.ty(r).clone())
                .collect(),
        )
        .attrs(data.attrs.clone())
        .names(
            data.results()
                .iter()
                .map(|&r| g.value(r).name.clone())
                .collect(),
        );
        new.phase = data.phase;
        new.loc = data.loc.clone();
        let id = b.funcs[s as usize][ph].push_op(new);
        let locals: Vec<ValueId> = b.funcs[s as usize][ph].op(id).results().to_vec();
        for (&r, &l) in data.results().iter().zip(&locals) {
            b.avail.insert((r, s), (ph, l));
            b.local.insert((r, s, ph), l);
            let Some(targets) = consumers.get(&r) else {
                continue;
            };
            for &t in targets {
                let channel = b.channels.len() as i64;
                let attrs = CommAttrs {
                    peer: t as i64,
                    channel,
                };
                let mut send = NewOp::new(OpKind::Send, vec![l], vec![])
                    .attrs(attrs.to_attrs())
                    .phase(STAGE_PHASES[ph]);
                send.loc = data.loc.clone();
                b.funcs[s as usize][ph].push_op(send);
                b.channel_of.insert((r, t), channel);
                b.channels.push(Channel {
                    id: channel,
                    from: s,
                    to: t,
                    value: g.value(r).name.clone(),
                    phase: STAGE_PHASES[ph],
                    bytes: g.ty(r).size_bytes().unwrap_or(0),
                });
            }
        }
    }

    // A shared weight's gradient: each holder sums its own contributions in `bwd_weight`
    // (zeros when it has none) and returns the sum as `grad.<p>`.
    let roots: HashSet<ValueId> = tied.iter().filter_map(|t| t.root).collect();
    for t in &tied {
        let Some(root) = t.root else { continue };
        let ty = g.ty(root).clone();
        let gname = format!("grad.{}", t.param);
        for &s in &t.stages {
            let si = s as usize;
            let mine: Vec<ValueId> = t
                .leaves
                .iter()
                .copied()
                .filter(|&l| match g.value(l).def {
                    ValueDef::Op(q, _) => b.stage_of[q.index()] == s,
                    ValueDef::Arg(_) => false,
                })
                .collect();
            let mut locals = vec![];
            for &l in &mine {
                locals.push(b.get(l, s, 2)?);
            }
            let f = &mut b.funcs[si][2];
            // A contribution that autodiff already named `grad.<p>` (the weight's only
            // differentiable use is here) gives its name up to the sum.
            for &l in &locals {
                if f.value(l).name == gname {
                    f.rename_value(l, format!("{gname}.local"));
                }
            }
            let sum = match locals.as_slice() {
                [] => {
                    let zero = Tensor::scalar_f64(ty.dtype, 0.0);
                    let c = f.push(
                        NewOp::new(
                            OpKind::Constant,
                            vec![],
                            vec![TensorType::of(ty.dtype, &[])],
                        )
                        .attrs(Attrs::new().with("value", Attr::Tensor(zero)))
                        .names(vec![format!("{gname}.zero")])
                        .phase(Phase::BwdWeight),
                    );
                    let dims = ty
                        .static_shape()
                        .ok_or_else(|| fail(format!("%{gname} has no static shape")))?;
                    f.push(
                        NewOp::new(OpKind::Expand, vec![c], vec![ty.clone()])
                            .attrs(Attrs::new().with(
                                "shape",
                                Attr::Ints(dims.iter().map(|&d| d as i64).collect()),
                            ))
                            .names(vec![gname.clone()])
                            .phase(Phase::BwdWeight),
                    )
                }
                [one] => f.push(
                    NewOp::new(OpKind::Identity, vec![*one], vec![ty.clone()])
                        .names(vec![gname.clone()])
                        .phase(Phase::BwdWeight),
                ),
                [first, rest @ ..] => {
                    let mut acc = *first;
                    for (i, &x) in rest.iter().enumerate() {
                        let name = if i + 1 == rest.len() {
                            gname.clone()
                        } else {
                            format!("{gname}.part{}", i + 1)
                        };
                        acc = f.push(
                            NewOp::new(OpKind::Add, vec![acc, x], vec![ty.clone()])
                                .names(vec![name])
                                .phase(Phase::BwdWeight),
                        );
                    }
                    acc
                }
            };
            b.named[si][2].push(sum);
        }
    }

    // `@grad`'s results go to the function that computes them.
    for &r in g.results() {
        if roots.contains(&r) {
            continue;
        }
        let ValueDef::Op(q, _) = g.value(r).def else {
            return Err(fail(format!(
                "@{} returns its argument %{}; nothing computes it",
                g.name,
                g.value(r).name
            )));
        };
        let s = b.stage_of[q.index()];
        let (ph, l) = b.avail[&(r, s)];
        let list = &mut b.named[s as usize][ph];
        if !list.contains(&l) {
            list.push(l);
        }
    }
    for s in 0..ns {
        for ph in 0..3 {
            let mut results = b.named[s][ph].clone();
            for &v in &b.stash[s][ph] {
                if !results.contains(&v) {
                    results.push(v);
                }
            }
            b.funcs[s][ph].set_results(results);
        }
    }

    // Forward edges; gradients must go back along them.
    let edges: BTreeSet<(u32, u32)> = b
        .channels
        .iter()
        .filter(|c| c.phase == Phase::Fwd)
        .map(|c| (c.from, c.to))
        .collect();
    let reach = reachability(ns, &edges)?;
    for c in &b.channels {
        if c.phase == Phase::BwdInput && !reach[c.to as usize][c.from as usize] {
            return Err(fail(format!(
                "the gradient %{} flows from stage {} to stage {}, but no forward path leads from stage {} to stage {}: the partition does not match the gradient flow",
                c.value, c.from, c.to, c.to, c.from
            )));
        }
    }

    let mut stages: Vec<StageFunctions> = (0..num_stages)
        .map(|s| StageFunctions {
            stage: s,
            fwd: stage_function_name(s, Phase::Fwd),
            bwd_input: stage_function_name(s, Phase::BwdInput),
            bwd_weight: stage_function_name(s, Phase::BwdWeight),
            optim: None,
            params: owners
                .iter()
                .filter(|(n, &o)| {
                    o == s || tied.iter().any(|t| &t.param == *n && t.stages.contains(&s))
                })
                .map(|(n, _)| n.clone())
                .collect(),
        })
        .collect();
    // Params in argument order.
    let order: HashMap<&str, usize> = g
        .args()
        .iter()
        .enumerate()
        .map(|(i, &(v, _))| (g.value(v).name.as_str(), i))
        .collect();
    for st in &mut stages {
        st.params.sort_by_key(|p| order.get(p.as_str()).copied());
    }

    // The stages holding each param: its owner, or every reader of a shared one.
    let mut holders: BTreeMap<String, Vec<u32>> =
        owners.iter().map(|(n, &o)| (n.clone(), vec![o])).collect();
    for t in &tied {
        holders.insert(t.param.clone(), t.stages.clone());
    }
    let mut collectives = vec![];
    let optim_funcs = match m.function(&opts.optim) {
        Some(o) => {
            let mut fs = split_optimizer(o, &holders, num_stages)?;
            let zero = if opts.replicas { opts.zero } else { 0 };
            let (c, sharded) = insert_all_reduces(
                &mut fs,
                &holders,
                b.channels.len() as i64,
                opts.replicas,
                zero,
            )?;
            collectives = c;
            // Sharded optimizer states start as zero shards.
            for (name, ty) in sharded {
                let start = m.weights.get(&name);
                if start.is_some_and(|t| t.to_f64_vec().iter().any(|&x| x != 0.0)) {
                    return Err(fail(format!(
                        "--zero 1: the optimizer state `{name}` does not start at zero, so its shards would differ per replica"
                    )));
                }
                let shape: Vec<usize> = ty
                    .static_shape()
                    .unwrap_or_default()
                    .iter()
                    .map(|&d| d as usize)
                    .collect();
                m.weights.insert(name, Tensor::zeros(ty.dtype, shape));
            }
            for (st, f) in stages.iter_mut().zip(&fs) {
                st.optim = Some(f.name.clone());
            }
            Some(fs)
        }
        None => None,
    };

    let channels = std::mem::take(&mut b.channels);
    let funcs = std::mem::take(&mut b.funcs);
    m.functions
        .retain(|f| f.name != opts.grad && f.name != opts.optim);
    let mut optim_funcs = optim_funcs.map(|v| v.into_iter());
    for fs in funcs {
        m.functions.extend(fs);
        if let Some(it) = optim_funcs.as_mut() {
            if let Some(f) = it.next() {
                m.functions.push(f);
            }
        }
    }
    Ok(SplitInfo {
        stages,
        channels,
        edges: edges.into_iter().collect(),
        collectives,
    })
}

/// In each stage's optimizer function, sum `grad.<p>` over its holders (a shared weight)
/// and, with `replicas`, over the data-parallel replicas: an `all_reduce` right after the
/// argument, which every use then reads. Channels are numbered from `first_channel` in
/// parameter order, the same on every holder.
/// ZeRO-1's sharded optimizer states: name and shard type.
type ShardedStates = Vec<(String, TensorType)>;

fn insert_all_reduces(
    fs: &mut [Function],
    holders: &BTreeMap<String, Vec<u32>>,
    first_channel: i64,
    replicas: bool,
    zero: usize,
) -> Result<(Vec<Collective>, ShardedStates), PassError> {
    let mut channel_of: BTreeMap<String, i64> = BTreeMap::new();
    let mut collectives: Vec<Collective> = vec![];
    let mut next_channel = first_channel;
    let mut sharded_states = vec![];
    // Parameters in a fixed order (the first function that takes each gradient).
    for f in fs.iter() {
        for &(v, _) in f.args() {
            let Some(p) = f.value(v).name.strip_prefix("grad.") else {
                continue;
            };
            let Some(stages) = holders.get(p) else {
                continue;
            };
            if (stages.len() > 1 || replicas) && !channel_of.contains_key(p) {
                let channel = next_channel;
                // ZeRO-1: reduce_scatter, shard and all_gather get a channel each.
                let shard = zero > 1 && stages.len() == 1;
                next_channel += if shard { 3 } else { 1 };
                channel_of.insert(p.to_string(), channel);
                collectives.push(Collective {
                    channel,
                    param: p.to_string(),
                    stages: stages.clone(),
                    replicas,
                    bytes: f.ty(v).size_bytes().unwrap_or(0),
                    gather_channel: shard.then_some(channel + 2),
                });
            }
        }
    }
    for f in fs.iter_mut() {
        let args: Vec<ValueId> = f.args().iter().map(|&(v, _)| v).collect();
        for v in args {
            let name = f.value(v).name.clone();
            let Some(p) = name.strip_prefix("grad.") else {
                continue;
            };
            let (Some(&channel), Some(stages)) = (channel_of.get(p), holders.get(p)) else {
                continue;
            };
            if zero > 1 && stages.len() == 1 {
                sharded_states.extend(shard_update(f, p, zero, channel)?);
                continue;
            }
            let attrs = AllReduceAttrs {
                channel,
                stages: stages.iter().map(|&s| s as i64).collect(),
                replicas,
            };
            let new = NewOp::new(OpKind::AllReduce, vec![v], vec![f.ty(v).clone()])
                .attrs(attrs.to_attrs())
                .names(vec![format!("{name}.sum")])
                .phase(Phase::Optim);
            let op = match f.ops().first() {
                Some(&first) => f.insert_op_before(first, new),
                None => f.push_op(new),
            };
            let sum = f.op(op).results()[0];
            f.replace_all_uses(v, sum);
            f.set_operand(op, 0, v);
        }
    }
    Ok((collectives, sharded_states))
}

/// ZeRO-1 in one stage's optimizer function, for parameter `p` over `replicas`: the
/// gradient `grad.<p>` becomes this replica's shard of its sum over the replicas
/// (`reduce_scatter`, channel `channel`), the parameter its local shard (`shard`,
/// `channel + 1`), and the states `<name>.<p>` of the parameter's type become shards too:
/// every op that reads a shard must be elementwise (the optimizers are), and computes
/// on shards. The updated parameter `new.<p>` is all-gathered (`all_gather`,
/// `channel + 2`) to the whole parameter again; updated states stay shards. Returns the
/// sharded states and their new types.
fn shard_update(
    f: &mut Function,
    p: &str,
    replicas: usize,
    channel: i64,
) -> Result<Vec<(String, TensorType)>, PassError> {
    let arg = |f: &Function, name: &str| {
        f.args()
            .iter()
            .map(|&(v, _)| v)
            .find(|&v| f.value(v).name == name)
    };
    let grad_name = format!("grad.{p}");
    let (Some(g), Some(w)) = (arg(f, &grad_name), arg(f, p)) else {
        return Err(fail(format!(
            "--zero 1: @{} does not take both `{p}` and `{grad_name}`",
            f.name
        )));
    };
    let full = f.ty(w).clone();
    let Some(dims) = full.static_shape() else {
        return Err(fail(format!(
            "--zero 1: parameter `{p}` has a dynamic shape {full}; sharding needs a static one"
        )));
    };
    let n = full.num_elements().unwrap_or(0);
    let s = ppir::shard::shard_len(n, replicas as u64);
    let part = TensorType::of(full.dtype, &[s]);
    let attrs = |c: i64| {
        ppir::ops::attrs::ShardAttrs {
            channel: c,
            replicas: replicas as i64,
            shape: dims.iter().map(|&d| d as i64).collect(),
        }
        .to_attrs()
    };
    let mut sharded: HashSet<ValueId> = HashSet::new();
    // The gradient's and the parameter's shards, at the top.
    let mut inserted = vec![];
    for (v, kind, c, name) in [
        (
            g,
            OpKind::ReduceScatter,
            channel,
            format!("{grad_name}.shard"),
        ),
        (w, OpKind::Shard, channel + 1, format!("{p}.shard")),
    ] {
        let new = NewOp::new(kind, vec![v], vec![part.clone()])
            .attrs(attrs(c))
            .names(vec![name])
            .phase(Phase::Optim);
        let op = match f.ops().first() {
            Some(&first) => f.insert_op_before(first, new),
            None => f.push_op(new),
        };
        let x = f.op(op).results()[0];
        f.replace_all_uses(v, x);
        f.set_operand(op, 0, v);
        sharded.insert(x);
        inserted.push(op);
    }
    // The parameter's states: `<name>.<p>` of its type, where `p` is the longest parameter
    // name that ends the state's name (`adam.m.x.w` belongs to `x.w`, not to `w`).
    let params: Vec<String> = f
        .args()
        .iter()
        .filter(|&&(_, k)| k == ArgKind::Param)
        .map(|&(v, _)| f.value(v).name.clone())
        .collect();
    let owner = |state: &str| {
        params
            .iter()
            .filter(|q| {
                state.len() > q.len() + 1
                    && state.ends_with(q.as_str())
                    && state.as_bytes()[state.len() - q.len() - 1] == b'.'
            })
            .max_by_key(|q| q.len())
            .cloned()
    };
    let mut states = vec![];
    let args: Vec<(ValueId, ArgKind)> = f.args().to_vec();
    for (v, kind) in args {
        let name = f.value(v).name.clone();
        if kind == ArgKind::State && owner(&name).as_deref() == Some(p) && f.ty(v) == &full {
            f.set_type(v, part.clone());
            sharded.insert(v);
            states.push((name, part.clone()));
        }
    }
    // Every op that reads a shard computes on shards.
    let ops: Vec<OpId> = f.ops().to_vec();
    for op in ops {
        if inserted.contains(&op) {
            continue;
        }
        let data = f.op(op);
        if !data.operands().iter().any(|v| sharded.contains(v)) {
            continue;
        }
        let kind = data.kind;
        let describe = || {
            let r = data.results().first().map(|&r| f.value(r).name.clone());
            format!("{kind} (%{})", r.unwrap_or_default())
        };
        if !kind.is_elementwise() {
            return Err(fail(format!(
                "--zero 1: the update of `{p}` reads its sharded gradient or state in {}, which is not elementwise; ZeRO-1 needs an elementwise optimizer",
                describe()
            )));
        }
        for &v in data.operands() {
            if !sharded.contains(&v) && f.ty(v).num_elements() != Some(1) {
                return Err(fail(format!(
                    "--zero 1: the update of `{p}` combines a shard with %{} ({}) in {}: only scalars can meet a shard",
                    f.value(v).name,
                    f.ty(v),
                    describe()
                )));
            }
        }
        let results: Vec<ValueId> = data.results().to_vec();
        for r in results {
            let dtype = f.ty(r).dtype;
            f.set_type(r, TensorType::of(dtype, &[s]));
            sharded.insert(r);
        }
    }
    // The updated parameter is gathered; updated states stay shards.
    let state_names: HashSet<String> = states.iter().map(|(n, _)| format!("new.{n}")).collect();
    let new_param = format!("new.{p}");
    let mut results = f.results().to_vec();
    for (i, r) in results.clone().into_iter().enumerate() {
        if !sharded.contains(&r) {
            continue;
        }
        let name = f.value(r).name.clone();
        if name == new_param {
            f.rename_value(r, format!("{new_param}.shard"));
            let op = f.push_op(
                NewOp::new(OpKind::AllGather, vec![r], vec![full.clone()])
                    .attrs(attrs(channel + 2))
                    .names(vec![new_param.clone()])
                    .phase(Phase::Optim),
            );
            results[i] = f.op(op).results()[0];
        } else if !state_names.contains(&name) {
            return Err(fail(format!(
                "--zero 1: @{} returns %{name}, computed from a shard of `{p}`, which is neither `{new_param}` nor an updated state of `{p}`",
                f.name
            )));
        }
    }
    f.set_results(results);
    Ok(states)
}

/// `reach[a][b]`: a path of forward edges leads from stage a to stage b (a ≠ b); an error if
/// the edges form a cycle, naming its smallest stage.
fn reachability(n: usize, edges: &BTreeSet<(u32, u32)>) -> Result<Vec<Vec<bool>>, PassError> {
    let mut g = DiGraph::<(), ()>::with_capacity(n, edges.len());
    for _ in 0..n {
        g.add_node(());
    }
    g.extend_with_edges(edges.iter().copied());
    let on_cycle = kosaraju_scc(&g)
        .into_iter()
        .filter(|c| c.len() > 1 || g.contains_edge(c[0], c[0]))
        .flatten()
        .map(|s| s.index())
        .min();
    if let Some(s) = on_cycle {
        return Err(fail(format!(
            "the stages form a cycle through stage {s}: forward values go from stage {s} back to itself; a partition must make the stage graph acyclic"
        )));
    }
    let mut reach = vec![vec![false; n]; n];
    for (a, row) in reach.iter_mut().enumerate() {
        let mut dfs = Dfs::new(&g, NodeIndex::new(a));
        while let Some(b) = dfs.next(&g) {
            row[b.index()] = b.index() != a;
        }
    }
    Ok(reach)
}

/// Split the optimizer function by param ownership.
fn split_optimizer(
    o: &Function,
    holders: &BTreeMap<String, Vec<u32>>,
    num_stages: u32,
) -> Result<Vec<Function>, PassError> {
    // The stages holding an argument: a param/state of @grad, or `grad.<p>`.
    let arg_holders = |name: &str| -> Option<&Vec<u32>> {
        holders
            .get(name)
            .or_else(|| name.strip_prefix("grad.").and_then(|p| holders.get(p)))
    };
    // Per value: the holder sets of the arguments it depends on.
    let mut deps: HashMap<ValueId, BTreeSet<Vec<u32>>> = HashMap::new();
    for &(v, _) in o.args() {
        let mut set = BTreeSet::new();
        if let Some(s) = arg_holders(&o.value(v).name) {
            set.insert(s.clone());
        }
        deps.insert(v, set);
    }
    for &op in o.ops() {
        let mut set = BTreeSet::new();
        for v in o.op(op).operands() {
            set.extend(deps[v].iter().cloned());
        }
        for &r in o.op(op).results() {
            deps.insert(r, set.clone());
        }
    }
    // Each result: the stages that compute it (every stage if it depends on no param).
    let mut result_stages: Vec<BTreeSet<u32>> = vec![];
    for &r in o.results() {
        let groups = &deps[&r];
        if groups.len() > 1 {
            let names: Vec<String> = groups
                .iter()
                .map(|g| {
                    g.iter()
                        .map(|x| x.to_string())
                        .collect::<Vec<_>>()
                        .join("+")
                })
                .collect();
            return Err(fail(format!(
                "@{}: result %{} depends on parameters of stages {}",
                o.name,
                o.value(r).name,
                names.join(" and ")
            )));
        }
        let s: BTreeSet<u32> = match groups.iter().next() {
            Some(g) => g.iter().copied().collect(),
            None => (0..num_stages).collect(),
        };
        result_stages.push(s);
    }
    let mut out = vec![];
    for s in 0..num_stages {
        // Backward slice of this stage's results.
        let mut needed: HashSet<ValueId> = HashSet::new();
        let mut stack: Vec<ValueId> = o
            .results()
            .iter()
            .zip(&result_stages)
            .filter(|(_, st)| st.contains(&s))
            .map(|(&r, _)| r)
            .collect();
        while let Some(v) = stack.pop() {
            if !needed.insert(v) {
                continue;
            }
            if let ValueDef::Op(op, _) = o.value(v).def {
                stack.extend(o.op(op).operands().iter().copied());
            }
        }
        let mut f = Function::new(stage_function_name(s, Phase::Optim));
        f.attrs = o.attrs.clone();
        f.attrs.set("stage", Attr::Int(s as i64));
        let mut map: HashMap<ValueId, ValueId> = HashMap::new();
        for &(v, kind) in o.args() {
            if needed.contains(&v) {
                let nv = f.add_arg(o.value(v).name.clone(), o.ty(v).clone(), kind);
                map.insert(v, nv);
            }
        }
        for &op in o.ops() {
            let data = o.op(op);
            if !data.results().iter().any(|r| needed.contains(r)) {
                continue;
            }
            let mut new = NewOp::new(
                data.kind,
                data.operands().iter().map(|v| map[v]).collect(),
                data.results().iter().map(|&r| o.ty(r).clone()).collect(),
            )
            .attrs(data.attrs.clone())
            .names(
                data.results()
                    .iter()
                    .map(|&r| o.value(r).name.clone())
                    .collect(),
            );
            new.phase = data.phase;
            new.loc = data.loc.clone();
            let id = f.push_op(new);
            for (&r, &l) in data.results().iter().zip(f.op(id).results()) {
                map.insert(r, l);
            }
        }
        let results: Vec<ValueId> = o
            .results()
            .iter()
            .zip(&result_stages)
            .filter(|(_, st)| st.contains(&s))
            .map(|(r, _)| map[r])
            .collect();
        f.set_results(results);
        out.push(f);
    }
    Ok(out)
}

/// `insert-send-recv{grad=grad,optim=optim}`.
pub struct InsertSendRecv {
    pub options: SplitOptions,
}

impl InsertSendRecv {
    pub fn from_options(o: &PassOptions) -> Result<Self, PassError> {
        o.expect_only(PASS, &["grad", "optim", "replicas", "zero"])?;
        let mut options = SplitOptions::default();
        if let Some(r) = o.get("replicas") {
            options.replicas = match r {
                "1" | "true" => true,
                "0" | "false" => false,
                other => {
                    return Err(fail(format!(
                        "option `replicas` is 0 or 1 (sum gradients over data-parallel replicas), got `{other}`"
                    )))
                }
            };
        }
        if let Some(z) = o.get("zero") {
            options.zero = z.parse().map_err(|_| {
                fail(format!(
                    "option `zero` is the number of data-parallel replicas to shard optimizer state over (0: off), got `{z}`"
                ))
            })?;
            if options.zero > 1 && !options.replicas {
                return Err(fail(
                    "option `zero` shards over data-parallel replicas: give `replicas=1` too",
                ));
            }
        }
        if let Some(g) = o.get("grad") {
            options.grad = g.to_string();
        }
        if let Some(g) = o.get("optim") {
            options.optim = g.to_string();
        }
        Ok(InsertSendRecv { options })
    }
}

impl Pass for InsertSendRecv {
    fn name(&self) -> &'static str {
        PASS
    }

    fn run(&self, module: &mut Module) -> Result<(), PassError> {
        split_stages(module, &self.options).map(|_| ())
    }
}
