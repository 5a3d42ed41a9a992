//! ppir as an e-graph: the [`egg::Language`] of ppir ops, the e-class analysis (result
//! types, source location, cost) and the conversions function → e-graph → function.
//!
//! The language is built on the op table: an e-node is an [`OpKind`] (any op of
//! [`OpKind::ALL`]), an interned attribute dictionary and its operand e-classes, so every op
//! the IR knows can enter the e-graph without a per-op declaration here. Function arguments
//! are leaves; a multi-result op (`split`) is one e-class holding the tuple of its results,
//! and [`PpNode::Result`] projects one of them.

use std::collections::HashMap;
use std::fmt;

use egg::{DidMerge, Id, Language};
use ppir::{Attrs, Function, NewOp, OpKind, TensorType, ValueId};

use crate::cost::op_cost_of;

/// An interned attribute dictionary (see [`PpAnalysis::intern`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AttrId(pub u32);

/// An e-node.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PpNode {
    /// Argument `i` of the function.
    Arg(u32),
    /// An op applied to operand e-classes.
    Op {
        kind: OpKind,
        attrs: AttrId,
        args: Vec<Id>,
    },
    /// Result `i` of a multi-result op.
    Result(u32, [Id; 1]),
}

impl Language for PpNode {
    type Discriminant = (u8, Option<OpKind>, u32);

    fn discriminant(&self) -> Self::Discriminant {
        match self {
            PpNode::Arg(i) => (0, None, *i),
            PpNode::Op { kind, attrs, .. } => (1, Some(*kind), attrs.0),
            PpNode::Result(i, _) => (2, None, *i),
        }
    }

    fn matches(&self, other: &Self) -> bool {
        match (self, other) {
            (PpNode::Arg(a), PpNode::Arg(b)) => a == b,
            (
                PpNode::Op { kind, attrs, args },
                PpNode::Op {
                    kind: k2,
                    attrs: a2,
                    args: args2,
                },
            ) => kind == k2 && attrs == a2 && args.len() == args2.len(),
            (PpNode::Result(a, _), PpNode::Result(b, _)) => a == b,
            _ => false,
        }
    }

    fn children(&self) -> &[Id] {
        match self {
            PpNode::Arg(_) => &[],
            PpNode::Op { args, .. } => args,
            PpNode::Result(_, c) => c,
        }
    }

    fn children_mut(&mut self) -> &mut [Id] {
        match self {
            PpNode::Arg(_) => &mut [],
            PpNode::Op { args, .. } => args,
            PpNode::Result(_, c) => c,
        }
    }
}

impl fmt::Display for PpNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PpNode::Arg(i) => write!(f, "arg{i}"),
            PpNode::Op { kind, attrs, .. } => write!(f, "{}#{}", kind.name(), attrs.0),
            PpNode::Result(i, _) => write!(f, "result{i}"),
        }
    }
}

/// What is known about an e-class.
#[derive(Clone, Debug, Default)]
pub struct ClassData {
    /// The result types: one for a value, all of them for a multi-result op.
    pub types: Vec<TensorType>,
    /// The source location (ONNX node name) of the op that first produced the class.
    pub loc: Option<String>,
    /// Why the class has no valid type (an e-node built on operands it does not fit); such
    /// classes are never extracted.
    pub invalid: Option<String>,
}

impl ClassData {
    /// The single type of a value class.
    pub fn ty(&self) -> Option<&TensorType> {
        match self.types.as_slice() {
            [t] if self.invalid.is_none() => Some(t),
            _ => None,
        }
    }
}

/// The e-class analysis: result types by shape inference, plus the interned attributes and
/// the function's argument types it needs to compute them.
#[derive(Debug, Default)]
pub struct PpAnalysis {
    attrs: Vec<Attrs>,
    index: HashMap<String, AttrId>,
    /// Argument types of the function being rewritten.
    pub args: Vec<TensorType>,
}

/// Attribute dictionaries with tensors larger than this are not deduplicated (their text
/// would cost more than the sharing gains).
const MAX_INTERNED_TENSOR: usize = 64;

impl PpAnalysis {
    pub fn new(args: Vec<TensorType>) -> Self {
        PpAnalysis {
            args,
            ..Default::default()
        }
    }

    /// The id of `attrs`, equal for equal dictionaries (except large tensors).
    pub fn intern(&mut self, attrs: &Attrs) -> AttrId {
        let large = attrs.iter().any(|(_, a)| match a {
            ppir::Attr::Tensor(t) => t.num_elements() > MAX_INTERNED_TENSOR,
            _ => false,
        });
        let id = AttrId(self.attrs.len() as u32);
        if large {
            self.attrs.push(attrs.clone());
            return id;
        }
        let key = format!("{attrs:?}");
        if let Some(&existing) = self.index.get(&key) {
            return existing;
        }
        self.index.insert(key, id);
        self.attrs.push(attrs.clone());
        id
    }

    pub fn attrs(&self, id: AttrId) -> &Attrs {
        &self.attrs[id.0 as usize]
    }
}

/// The e-graph of ppir.
pub type PpEGraph = egg::EGraph<PpNode, PpAnalysis>;

impl egg::Analysis<PpNode> for PpAnalysis {
    type Data = ClassData;

    fn make(egraph: &mut PpEGraph, enode: &PpNode) -> ClassData {
        let mut data = ClassData::default();
        match enode {
            PpNode::Arg(i) => match egraph.analysis.args.get(*i as usize) {
                Some(t) => data.types = vec![t.clone()],
                None => data.invalid = Some(format!("no argument {i}")),
            },
            PpNode::Result(i, [c]) => {
                let child = &egraph[*c].data;
                match child.types.get(*i as usize) {
                    Some(t) if child.invalid.is_none() && child.types.len() > 1 => {
                        data.types = vec![t.clone()]
                    }
                    _ => data.invalid = Some(format!("no result {i}")),
                }
            }
            PpNode::Op { kind, attrs, args } => {
                let mut operands = Vec::with_capacity(args.len());
                for &a in args {
                    match egraph[a].data.ty() {
                        Some(t) => operands.push(t.clone()),
                        None => {
                            data.invalid = Some("an operand has no single valid type".into());
                            return data;
                        }
                    }
                }
                let attrs = egraph.analysis.attrs(*attrs);
                match ppir::shape::infer(*kind, attrs, &operands) {
                    Ok(types) if !types.is_empty() => data.types = types,
                    Ok(_) => data.invalid = Some(format!("{kind} has no result")),
                    Err(e) => data.invalid = Some(format!("{kind}: {e}")),
                }
            }
        }
        data
    }

    fn merge(&mut self, a: &mut ClassData, b: ClassData) -> DidMerge {
        let mut changed_a = false;
        if a.invalid.is_some() && b.invalid.is_none() {
            a.types = b.types.clone();
            a.invalid = None;
            changed_a = true;
        }
        if a.loc.is_none() && b.loc.is_some() {
            a.loc = b.loc.clone();
            changed_a = true;
        }
        DidMerge(changed_a, true)
    }
}

/// A function as an e-graph: the class of each returned value, and for each e-class that
/// holds an original value its name (so the extracted function keeps the names).
pub struct Converted {
    pub egraph: PpEGraph,
    pub roots: Vec<Id>,
    pub names: HashMap<Id, String>,
    /// The e-class of the (first) op with each source location.
    pub locs: HashMap<String, Id>,
}

/// Why a function cannot enter the e-graph.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error("@{function}: {op} has a side effect and cannot be rewritten (run the rewriter before insert-send-recv)")]
    SideEffect { function: String, op: String },
    #[error("@{function}: {op} (loc {loc:?}) does not type-check in the e-graph: {message}")]
    Invalid {
        function: String,
        op: String,
        loc: Option<String>,
        message: String,
    },
    #[error("@{function}: the extracted terms form a cycle")]
    Cycle { function: String },
    #[error("@{function}: no e-node can be extracted for the value {value}")]
    NotExtractable { function: String, value: String },
}

/// Add every op of `f` to a new e-graph.
pub fn to_egraph(f: &Function) -> Result<Converted, ConvertError> {
    let arg_types = f.arg_values().map(|v| f.ty(v).clone()).collect();
    let mut egraph = PpEGraph::new(PpAnalysis::new(arg_types));
    let mut class_of: HashMap<ValueId, Id> = HashMap::new();
    let mut names = HashMap::new();
    let mut locs = HashMap::new();
    for (i, v) in f.arg_values().enumerate() {
        let id = egraph.add(PpNode::Arg(i as u32));
        class_of.insert(v, id);
        names.entry(id).or_insert_with(|| f.value(v).name.clone());
    }
    for &op in f.ops() {
        let data = f.op(op);
        if data.kind.has_side_effect() {
            return Err(ConvertError::SideEffect {
                function: f.name.clone(),
                op: data.kind.to_string(),
            });
        }
        let attrs = egraph.analysis.intern(&data.attrs);
        let args = data.operands().iter().map(|v| class_of[v]).collect();
        let id = egraph.add(PpNode::Op {
            kind: data.kind,
            attrs,
            args,
        });
        if let Some(msg) = &egraph[id].data.invalid {
            return Err(ConvertError::Invalid {
                function: f.name.clone(),
                op: data.kind.to_string(),
                loc: data.loc.clone(),
                message: msg.clone(),
            });
        }
        if egraph[id].data.loc.is_none() {
            egraph[id].data.loc = data.loc.clone();
        }
        if let Some(l) = &data.loc {
            locs.entry(l.clone()).or_insert(id);
        }
        let results = data.results();
        if results.len() == 1 {
            class_of.insert(results[0], id);
            names
                .entry(id)
                .or_insert_with(|| f.value(results[0]).name.clone());
        } else {
            for (i, &r) in results.iter().enumerate() {
                let rid = egraph.add(PpNode::Result(i as u32, [id]));
                egraph[rid].data.loc = data.loc.clone();
                class_of.insert(r, rid);
                names.entry(rid).or_insert_with(|| f.value(r).name.clone());
            }
        }
    }
    egraph.rebuild();
    let roots = f
        .results()
        .iter()
        .map(|v| egraph.find(class_of[v]))
        .collect();
    let names = names
        .into_iter()
        .map(|(id, n)| (egraph.find(id), n))
        .collect();
    let locs = locs
        .into_iter()
        .map(|(l, id)| (l, egraph.find(id)))
        .collect();
    Ok(Converted {
        egraph,
        roots,
        names,
        locs,
    })
}

/// The cost of one e-node for extraction: FLOPs plus bytes moved (weighted as on a device
/// with ~100 FLOP per byte), with symbolic batch dimensions counted as 1.
pub fn node_cost(egraph: &PpEGraph, enode: &PpNode) -> f64 {
    let PpNode::Op { kind, attrs, args } = enode else {
        return 0.0;
    };
    let operands: Vec<TensorType> = args
        .iter()
        .filter_map(|&a| egraph[a].data.ty().map(|t| t.bind_batch(1)))
        .collect();
    let Ok(results) = ppir::shape::infer(*kind, egraph.analysis.attrs(*attrs), &operands) else {
        return f64::INFINITY;
    };
    let o: Vec<&TensorType> = operands.iter().collect();
    let r: Vec<&TensorType> = results.iter().collect();
    match op_cost_of(*kind, egraph.analysis.attrs(*attrs), &o, &r) {
        Ok(c) => c.flops + 100.0 * c.bytes(),
        Err(_) => f64::INFINITY,
    }
}

/// Build the body of `out` (which already has the arguments of the original function)
/// from the e-graph, choosing in every class the node `choose` returns. Values whose class
/// held an original value keep its name.
pub fn from_egraph(
    conv: &Converted,
    out: &mut Function,
    choose: &dyn Fn(Id) -> Option<PpNode>,
) -> Result<Vec<ValueId>, ConvertError> {
    let eg = &conv.egraph;
    let args: Vec<ValueId> = out.arg_values().collect();
    let mut memo: HashMap<Id, Vec<ValueId>> = HashMap::new();
    let mut used_names: std::collections::HashSet<String> = (0..out.num_values())
        .map(|i| out.value(ValueId(i as u32)).name.clone())
        .collect();
    // Iterative post-order walk (deep graphs must not overflow the stack).
    let mut results = vec![];
    let mut visiting = std::collections::HashSet::new();
    for &root in &conv.roots {
        let mut stack = vec![(eg.find(root), false)];
        while let Some((id, expanded)) = stack.pop() {
            if memo.contains_key(&id) {
                continue;
            }
            let node = choose(id).ok_or_else(|| ConvertError::NotExtractable {
                function: out.name.clone(),
                value: conv
                    .names
                    .get(&id)
                    .cloned()
                    .unwrap_or_else(|| format!("of e-class {id}")),
            })?;
            if !expanded {
                if !visiting.insert(id) {
                    return Err(ConvertError::Cycle {
                        function: out.name.clone(),
                    });
                }
                stack.push((id, true));
                // Reversed, so that operands are emitted in order (piece 0 first).
                for &c in node.children().iter().rev() {
                    let c = eg.find(c);
                    if !memo.contains_key(&c) {
                        stack.push((c, false));
                    }
                }
                continue;
            }
            let values = match &node {
                PpNode::Arg(i) => vec![args[*i as usize]],
                PpNode::Result(i, [c]) => vec![memo[&eg.find(*c)][*i as usize]],
                PpNode::Op { kind, attrs, args } => {
                    let operands: Vec<ValueId> =
                        args.iter().map(|&a| memo[&eg.find(a)][0]).collect();
                    let data = &eg[id].data;
                    let mut new = NewOp::new(*kind, operands, data.types.clone())
                        .attrs(eg.analysis.attrs(*attrs).clone());
                    if let Some(loc) = &data.loc {
                        new = new.loc(loc.clone());
                    }
                    if data.types.len() == 1 {
                        if let Some(n) = conv.names.get(&id) {
                            if used_names.insert(n.clone()) {
                                new = new.names(vec![n.clone()]);
                            }
                        }
                    }
                    let op = out.push_op(new);
                    // A fresh name given here (`%0`, ...) must not be handed out again to
                    // an original value that had it (the loss's unnamed values do).
                    for &r in out.op(op).results() {
                        used_names.insert(out.value(r).name.clone());
                    }
                    out.op(op).results().to_vec()
                }
            };
            memo.insert(id, values);
        }
        results.push(memo[&eg.find(root)][0]);
    }
    Ok(results)
}
