//! The graph partitioners work on: the forward function's ops, grouped into nodes, with the
//! forward, input-gradient and weight-gradient time of each, its stashed activations and
//! its weights.

use std::collections::{BTreeMap, HashMap};

use ppir::{ArgKind, Function, Module, Phase, Use, ValueDef, ValueId};

use crate::autodiff::{build_gradient_function, AutodiffOptions};
use crate::cost::{measure_function_ops, op_time_in, DeviceProfile};
use crate::split::is_source_op;
use crate::PassError;

use super::fail;

/// Time and memory of a piece of the model, per micro-batch.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Cost {
    /// Forward seconds.
    pub f: f64,
    /// Input-gradient seconds.
    pub b: f64,
    /// Weight-gradient seconds.
    pub w: f64,
    /// Bytes kept from the forward for the backward.
    pub act_bytes: f64,
    /// Bytes of parameters.
    pub param_bytes: f64,
    /// Bytes of non-trained state (running statistics).
    pub state_bytes: f64,
}

impl Cost {
    /// F + B + W.
    pub fn time(&self) -> f64 {
        self.f + self.b + self.w
    }
}

impl std::ops::AddAssign for Cost {
    fn add_assign(&mut self, o: Cost) {
        self.f += o.f;
        self.b += o.b;
        self.w += o.w;
        self.act_bytes += o.act_bytes;
        self.param_bytes += o.param_bytes;
        self.state_bytes += o.state_bytes;
    }
}

impl std::ops::Add for Cost {
    type Output = Cost;
    fn add(mut self, o: Cost) -> Cost {
        self += o;
        self
    }
}

/// Costs of every op of the forward function `main` (by position in `main.ops()`), from
/// the training program autodiff builds for it: each `@grad` op is charged to the forward
/// op it came from (autodiff carries the op's `stage`, which this sets to the op's position
/// on a copy of the module).
pub fn attribute_costs(
    m: &Module,
    main: &str,
    ad: &AutodiffOptions,
    profile: &DeviceProfile,
    timer: Option<&super::OpTimer>,
) -> Result<Vec<Cost>, PassError> {
    let mut copy = m.clone_without_weights();
    let f = copy
        .function_mut(main)
        .ok_or_else(|| fail(format!("the module has no @{main}")))?;
    let order: Vec<_> = f.ops().to_vec();
    for (i, &op) in order.iter().enumerate() {
        f.op_mut(op).stage = Some(i as u32);
    }
    let n = order.len();
    let main_f = f.clone();
    let mut opts = ad.clone();
    opts.function = main.to_string();
    let info = build_gradient_function(&mut copy, &opts)?;
    let g = copy
        .function(&info.function)
        .ok_or_else(|| fail("autodiff made no gradient function"))?;
    let origin = origins(g);
    // On a measuring profile, time the whole training step op by op: on the target's own
    // code when there is a timer for it (its times are the ops' whole cost), else with the
    // interpreter (plus its per-op dispatch overhead).
    let native = if profile.measure_ops {
        timer.and_then(|t| (t.0)(g))
    } else {
        None
    };
    let overhead = if native.is_some() {
        0.0
    } else {
        profile.op_overhead
    };
    let measured = match native {
        Some(m) => m,
        None if profile.measure_ops => measure_function_ops(g, 3),
        None => Default::default(),
    };
    let mut costs = vec![Cost::default(); n];
    for &op in g.ops() {
        let Some(o) = origin[op.index()] else {
            continue;
        };
        let o = (o as usize).min(n.saturating_sub(1));
        let t = match measured.get(&op) {
            Some(&t) => t + overhead,
            None => op_time_in(g, op, profile).map_err(|e| fail(e.to_string()))?,
        };
        let data = g.op(op);
        match data.phase {
            Some(Phase::BwdInput) => costs[o].b += t,
            Some(Phase::BwdWeight) => costs[o].w += t,
            _ => costs[o].f += t,
        }
        if matches!(data.phase, None | Some(Phase::Fwd)) {
            for &r in data.results() {
                let saved = g.users(r).iter().any(|u| match u {
                    Use::Operand(q, _) => matches!(
                        g.op(*q).phase,
                        Some(Phase::BwdInput) | Some(Phase::BwdWeight)
                    ),
                    Use::Return(_) => false,
                });
                if saved {
                    costs[o].act_bytes += g.ty(r).size_bytes().unwrap_or(0) as f64;
                }
            }
        }
    }
    // Weights: charged to the first op that reads them.
    for &(v, kind) in main_f.args() {
        if kind == ArgKind::Input {
            continue;
        }
        let first = main_f
            .users(v)
            .iter()
            .filter_map(|u| match u {
                Use::Operand(op, _) => order.iter().position(|o| o == op),
                Use::Return(_) => None,
            })
            .min();
        if let Some(i) = first {
            let bytes = main_f.ty(v).size_bytes().unwrap_or(0) as f64;
            if kind == ArgKind::Param {
                costs[i].param_bytes += bytes;
            } else {
                costs[i].state_bytes += bytes;
            }
        }
    }
    Ok(costs)
}

/// The forward op each `@grad` op came from (its `stage` tag); untagged ops (the loss,
/// gradient sums of params) take their first tagged operand's, else their first tagged
/// user's.
fn origins(g: &Function) -> Vec<Option<u32>> {
    let mut o: Vec<Option<u32>> = vec![None; g.num_op_slots()];
    for &op in g.ops() {
        o[op.index()] = g.op(op).stage;
    }
    for &op in g.ops() {
        if o[op.index()].is_none() {
            o[op.index()] = g
                .op(op)
                .operands()
                .iter()
                .find_map(|&v| match g.value(v).def {
                    ValueDef::Op(q, _) => o[q.index()],
                    ValueDef::Arg(_) => None,
                });
        }
    }
    for &op in g.ops().iter().rev() {
        if o[op.index()].is_none() {
            o[op.index()] = g.op(op).results().iter().find_map(|&r| {
                g.users(r).iter().find_map(|u| match u {
                    Use::Operand(q, _) => o[q.index()],
                    Use::Return(_) => None,
                })
            });
        }
    }
    o
}

/// A group of forward ops that always go to the same stage.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// Positions in the forward function's op list, ascending.
    pub ops: Vec<usize>,
    pub cost: Cost,
    /// The first op's location (ONNX node name), for messages.
    pub name: String,
}

/// A data edge between nodes: one value read by one node.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Edge {
    pub from: usize,
    pub to: usize,
    /// The value (of the forward function).
    pub value: ValueId,
    pub bytes: f64,
}

/// Nodes in a topological order, and the edges between them.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeGraph {
    pub nodes: Vec<Node>,
    pub edges: Vec<Edge>,
    pub preds: Vec<Vec<usize>>,
    pub succs: Vec<Vec<usize>>,
    /// Node of each forward op (by position).
    pub node_of_op: Vec<usize>,
    /// Nodes that read a model input (or nothing) and nodes whose value the function returns.
    pub is_source: Vec<bool>,
    pub is_sink: Vec<bool>,
}

/// An activation at least this large is never cut right before an op that reduces it
/// [`REDUCTION_RATIO`]-fold or more (see [`build_node_graph`]).
const LARGE_ACTIVATION: u64 = 1 << 20;
const REDUCTION_RATIO: u64 = 16;

/// Group the ops of `f` into nodes.
///
/// - An op that reads no activation (a constant, a transposed or reshaped weight) joins the
///   earliest op that consumes its value through activations, so weights and what is
///   computed from them stay with their layer. Constants make no edges: every stage that
///   reads one makes its own copy.
/// - An op that reduces an activation of at least 1 MiB 16-fold or more joins the node of
///   the op that produced it (when its other activation operands are there too): a cut
///   before it would send and stash the large tensor.
/// - `pinned` ops (positions) start a node: a cut may fall right before them.
/// - Chains (a node whose only successor has it as only predecessor) merge while their
///   time stays below `max_chain_time`, so the partitioners see tens to hundreds of nodes,
///   not thousands of small ops.
pub fn build_node_graph(
    f: &Function,
    costs: &[Cost],
    pinned: &[usize],
    max_chain_time: f64,
) -> NodeGraph {
    let ops = f.ops();
    let n = ops.len();
    let pos: HashMap<_, _> = ops.iter().enumerate().map(|(i, &op)| (op, i)).collect();
    // Activations: values computed from an input argument.
    let mut act: HashMap<ValueId, bool> = HashMap::new();
    for &(v, k) in f.args() {
        act.insert(v, k == ArgKind::Input);
    }
    let mut is_act_op = vec![false; n];
    for (i, &op) in ops.iter().enumerate() {
        let a = f.op(op).operands().iter().any(|v| act[v]);
        is_act_op[i] = a;
        for &r in f.op(op).results() {
            act.insert(r, a);
        }
    }
    let users_of = |i: usize| -> Vec<usize> {
        let mut u: Vec<usize> = f
            .op(ops[i])
            .results()
            .iter()
            .flat_map(|&r| f.users(r).iter())
            .filter_map(|u| match u {
                Use::Operand(q, _) => Some(pos[q]),
                Use::Return(_) => None,
            })
            .collect();
        u.sort_unstable();
        u.dedup();
        u
    };
    // Earliest activation consumer of each weight-side op.
    let mut home: Vec<usize> = (0..n).collect();
    for i in (0..n).rev() {
        if is_act_op[i] {
            continue;
        }
        let h = users_of(i)
            .into_iter()
            .map(|u| if is_act_op[u] { u } else { home[u] })
            .min();
        if let Some(h) = h {
            home[i] = h;
        }
    }
    // A reduction of a large activation to a small result (a log-sum-exp of an LM head
    // piece, a pooled feature map) stays with the op that made the activation: a cut there
    // would send, and stash on both sides, the large tensor instead of the small one.
    for i in 0..n {
        if !is_act_op[i] {
            continue;
        }
        let d = f.op(ops[i]);
        let out_bytes: u64 = d
            .results()
            .iter()
            .map(|&r| f.ty(r).size_bytes().unwrap_or(u64::MAX))
            .sum();
        let big = d
            .operands()
            .iter()
            .filter_map(|&v| match f.value(v).def {
                ValueDef::Op(q, _) if is_act_op[pos[&q]] => {
                    Some((f.ty(v).size_bytes().unwrap_or(0), pos[&q]))
                }
                _ => None,
            })
            .max();
        let Some((in_bytes, q)) = big else { continue };
        if in_bytes < LARGE_ACTIVATION || out_bytes.saturating_mul(REDUCTION_RATIO) > in_bytes {
            continue;
        }
        let (from, to) = (home[i], home[q]);
        // Every other activation operand must already be in the producer's node.
        let others_there = d.operands().iter().all(|&v| match f.value(v).def {
            ValueDef::Op(p, _) => !is_act_op[pos[&p]] || home[pos[&p]] == to,
            ValueDef::Arg(_) => true,
        });
        if others_there && from != to {
            for h in home.iter_mut() {
                if *h == from {
                    *h = to;
                }
            }
        }
    }
    // Initial nodes: one per home.
    let mut node_of_home: BTreeMap<usize, usize> = BTreeMap::new();
    for &h in &home {
        node_of_home.entry(h).or_insert(0);
    }
    for (idx, (_, v)) in node_of_home.iter_mut().enumerate() {
        *v = idx;
    }
    let mut node_of_op: Vec<usize> = home.iter().map(|h| node_of_home[h]).collect();
    let count = node_of_home.len();

    // Chain merging: node groups as ranges of initial nodes.
    let edges_between = |node_of_op: &Vec<usize>| {
        let mut preds: Vec<Vec<usize>> = vec![vec![]; count];
        let mut succs: Vec<Vec<usize>> = vec![vec![]; count];
        for (i, &op) in ops.iter().enumerate() {
            for v in f.op(op).operands() {
                if let ValueDef::Op(q, _) = f.value(*v).def {
                    let (a, b) = (node_of_op[pos[&q]], node_of_op[i]);
                    if a != b && !is_source_op(f, q) {
                        succs[a].push(b);
                        preds[b].push(a);
                    }
                }
            }
        }
        for l in preds.iter_mut().chain(succs.iter_mut()) {
            l.sort_unstable();
            l.dedup();
        }
        (preds, succs)
    };
    let (preds0, succs0) = edges_between(&node_of_op);
    let mut node_cost = vec![Cost::default(); count];
    for (i, c) in costs.iter().enumerate().take(n) {
        node_cost[node_of_op[i]] += *c;
    }
    let pinned_nodes: Vec<bool> = {
        let mut p = vec![false; count];
        for &i in pinned {
            if i < n {
                p[node_of_op[i]] = true;
            }
        }
        p
    };
    // Union consecutive chain links (initial nodes are numbered topologically).
    let mut group: Vec<usize> = (0..count).collect();
    let mut group_cost: Vec<Cost> = node_cost.clone();
    for b in 0..count {
        if preds0[b].len() != 1 || pinned_nodes[b] {
            continue;
        }
        let a = preds0[b][0];
        if succs0[a].len() != 1 {
            continue;
        }
        let ga = group[a];
        if (group_cost[ga] + node_cost[b]).time() > max_chain_time {
            continue;
        }
        group[b] = ga;
        let c = node_cost[b];
        group_cost[ga] += c;
    }
    // Renumber groups in order.
    let mut renum: BTreeMap<usize, usize> = BTreeMap::new();
    for &g in &group {
        let len = renum.len();
        renum.entry(g).or_insert(len);
    }
    for x in node_of_op.iter_mut() {
        *x = renum[&group[*x]];
    }
    let count = renum.len();
    let mut nodes: Vec<Node> = (0..count)
        .map(|_| Node {
            ops: vec![],
            cost: Cost::default(),
            name: String::new(),
        })
        .collect();
    for (i, c) in costs.iter().enumerate().take(n) {
        let nd = &mut nodes[node_of_op[i]];
        nd.ops.push(i);
        nd.cost += *c;
    }
    for nd in &mut nodes {
        let first = nd
            .ops
            .iter()
            .find(|&&i| is_act_op[i])
            .or(nd.ops.first())
            .copied();
        nd.name = match first {
            Some(i) => {
                let d = f.op(ops[i]);
                d.loc.clone().unwrap_or_else(|| {
                    d.results()
                        .first()
                        .map(|&r| format!("%{}", f.value(r).name))
                        .unwrap_or_else(|| d.kind.to_string())
                })
            }
            None => String::new(),
        };
    }
    // Edges per (value, consumer node).
    let mut edges = vec![];
    let mut seen = std::collections::HashSet::new();
    for (i, &op) in ops.iter().enumerate() {
        for &v in f.op(op).operands() {
            if let ValueDef::Op(q, _) = f.value(v).def {
                let (a, b) = (node_of_op[pos[&q]], node_of_op[i]);
                if a != b && !is_source_op(f, q) && seen.insert((v, b)) {
                    edges.push(Edge {
                        from: a,
                        to: b,
                        value: v,
                        bytes: f.ty(v).size_bytes().unwrap_or(0) as f64,
                    });
                }
            }
        }
    }
    let mut preds: Vec<Vec<usize>> = vec![vec![]; count];
    let mut succs: Vec<Vec<usize>> = vec![vec![]; count];
    for e in &edges {
        preds[e.to].push(e.from);
        succs[e.from].push(e.to);
    }
    for l in preds.iter_mut().chain(succs.iter_mut()) {
        l.sort_unstable();
        l.dedup();
    }
    let mut is_source = vec![false; count];
    let mut is_sink = vec![false; count];
    for (i, &op) in ops.iter().enumerate() {
        let nd = node_of_op[i];
        if f.op(op)
            .operands()
            .iter()
            .any(|&v| matches!(f.value(v).def, ValueDef::Arg(a) if f.args()[a].1 == ArgKind::Input))
        {
            is_source[nd] = true;
        }
        if f.op(op)
            .results()
            .iter()
            .any(|&r| f.users(r).iter().any(|u| matches!(u, Use::Return(_))))
        {
            is_sink[nd] = true;
        }
    }
    for i in 0..count {
        if preds[i].is_empty() {
            is_source[i] = true;
        }
        if succs[i].is_empty() {
            is_sink[i] = true;
        }
    }
    NodeGraph {
        nodes,
        edges,
        preds,
        succs,
        node_of_op,
        is_source,
        is_sink,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node_graph(src: &str) -> (Function, NodeGraph) {
        let m = ppir::text::parse_module(src).unwrap_or_else(|e| panic!("{e}"));
        let f = m.functions[0].clone();
        let costs = vec![Cost::default(); f.ops().len()];
        // No chain merging (every chain link costs more than -1 s).
        let g = build_node_graph(&f, &costs, &[], -1.0);
        (f, g)
    }

    #[test]
    fn a_large_activation_is_not_cut_before_its_reduction() {
        // A 4 MiB logits piece reduced to 4 KiB rows: the log-sum-exp and the label logit
        // join the matmul's node; the small tensors after them may be cut.
        let (f, g) = node_graph(
            r#"module {
  func @main(%h: tensor<1024x64xf32>, %w: tensor<64x1024xf32> {param}, %labels: tensor<1024xi64>) -> (tensor<1024xf32>) {
    %z = "pp.matmul"(%h, %w) : (tensor<1024x64xf32>, tensor<64x1024xf32>) -> tensor<1024x1024xf32> loc("head")
    %l = "pp.reduce_log_sum_exp"(%z) {axes = [-1], keepdims = 0} : (tensor<1024x1024xf32>) -> tensor<1024xf32> loc("lse")
    %p = "pp.label_logit"(%z, %labels) : (tensor<1024x1024xf32>, tensor<1024xi64>) -> tensor<1024xf32> loc("pick")
    %d = "pp.sub"(%l, %p) : (tensor<1024xf32>, tensor<1024xf32>) -> tensor<1024xf32> loc("d")
    return %d : tensor<1024xf32>
  }
}"#,
        );
        let node = |loc: &str| {
            let i = f
                .ops()
                .iter()
                .position(|&o| f.op(o).loc.as_deref() == Some(loc))
                .unwrap();
            g.node_of_op[i]
        };
        assert_eq!(node("lse"), node("head"));
        assert_eq!(node("pick"), node("head"));
        assert_ne!(
            node("d"),
            node("head"),
            "a small result is still a cut point"
        );
        // Small activations keep their own nodes.
        let (f, g) = node_graph(
            r#"module {
  func @main(%h: tensor<4x8xf32>) -> (tensor<4xf32>) {
    %r = "pp.relu"(%h) : (tensor<4x8xf32>) -> tensor<4x8xf32> loc("relu")
    %s = "pp.reduce_sum"(%r) {axes = [1], keepdims = 0} : (tensor<4x8xf32>) -> tensor<4xf32> loc("sum")
    return %s : tensor<4xf32>
  }
}"#,
        );
        let i = |loc: &str| {
            f.ops()
                .iter()
                .position(|&o| f.op(o).loc.as_deref() == Some(loc))
                .unwrap()
        };
        assert_ne!(g.node_of_op[i("relu")], g.node_of_op[i("sum")]);
    }
}
