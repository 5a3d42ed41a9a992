//! The rewrite rules. Each is an egg rewrite whose searcher and applier are Rust code (the
//! conditions are about shapes and attributes, which egg's pattern syntax cannot state):
//!
//! - **split rules** add, for an op chosen for splitting (its source location is a target
//!   with a piece count K), K independent pieces and the op that combines them:
//!   `split-matmul-n` / `-m` / `-k` (columns, rows, the contraction with a sum) and the same
//!   three for `gemm` (transposes and the bias `c` handled);
//! - **propagation rules** move a split through what follows, so that the pieces stay
//!   independent: elementwise ops distribute over a `concat` (`relu(concat(a, b)) =
//!   concat(relu(a), relu(b))`, a broadcast operand sliced to match), so do layer norms,
//!   softmaxes and reductions that work across other axes than the concat's, a slice that reads
//!   exactly one piece of a concat is that piece, and a matmul whose operand is a concat
//!   along its contraction or row axis becomes a sum or a concat of smaller matmuls;
//! - **`split-cross-entropy`**: a softmax cross-entropy of logits concatenated along the
//!   classes becomes per-piece log-sum-exps and label logits merged exactly (so an LM head
//!   split along the vocabulary never gathers the whole logits).
//!
//! Every rule only adds e-nodes whose types check (the analysis's shape inference); which
//! variant ends up in the function is the extractor's choice.

use std::sync::Arc;

use egg::{Id, Rewrite, SearchMatches, Searcher, Subst, Symbol, Var};
use ppir::ops::attrs::{
    CastAttrs, ConcatAttrs, ConstantAttrs, CrossEntropyAttrs, GatherAttrs, GemmAttrs,
    LabelLogitAttrs, LayerNormAttrs, ReduceAttrs, ShapeAttrs, SliceAttrs, SoftmaxAttrs,
    TransposeAttrs,
};
use ppir::ops::OpAttrs;
use ppir::{Attrs, OpKind, Tensor, TensorType};

use super::egraph::{PpAnalysis, PpEGraph, PpNode};

/// A split chosen for an op, and the variants the rules built for it.
#[derive(Clone, Debug)]
pub struct Variant {
    /// The e-class of the op being split.
    pub class: Id,
    /// The node that combines the pieces (a concat or the last add).
    pub root: PpNode,
    /// `matmul along N in 4 pieces`.
    pub what: String,
    pub pieces: usize,
    pub axis: Axis,
}

/// An op to split: its source location, the number of pieces and, optionally, the axis
/// (otherwise the cheapest axis is chosen).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitTarget {
    pub loc: String,
    pub pieces: usize,
    pub axis: Option<Axis>,
}

/// What the rules need besides the e-graph: the split targets, each with the e-class of
/// the op it names.
#[derive(Debug, Default)]
pub struct Targets {
    pub split: Vec<(SplitTarget, Id)>,
}

/// One rule: for a node of a class, the classes equal to it (added to the e-graph).
pub trait Rule: Send + Sync {
    fn name(&self) -> &'static str;
    /// The new e-classes equal to `class` (which holds `node`).
    fn apply(&self, eg: &mut PpEGraph, ctx: &RuleCtx, class: Id, node: &PpNode) -> Vec<Id>;
    /// A cheap test before [`Rule::apply`].
    fn matches(&self, eg: &PpEGraph, node: &PpNode) -> bool;
}

/// Shared state of a rewrite run.
#[derive(Debug, Default)]
pub struct RuleCtx {
    pub targets: Targets,
    pub variants: std::sync::Mutex<Vec<Variant>>,
    /// Forms a propagation rule found that must be extracted whenever their class is
    /// (a form that the tree-cost extractor would misjudge because its pieces are shared):
    /// the class, its node, and what the form is, for the report.
    pub forced: std::sync::Mutex<Vec<(Id, PpNode, String)>>,
}

/// The K of a split target for `class` along `axis`, if any.
fn target(eg: &PpEGraph, ctx: &RuleCtx, class: Id, axis: Axis) -> Option<usize> {
    let class = eg.find(class);
    ctx.targets
        .split
        .iter()
        .find(|(t, c)| eg.find(*c) == class && t.axis.is_none_or(|a| a == axis))
        .map(|(t, _)| t.pieces)
}

// ---- building e-nodes ----

/// Add `kind(args)` with `attrs` if it type-checks; its class gets `loc`.
pub(super) fn add_op(
    eg: &mut PpEGraph,
    kind: OpKind,
    attrs: &Attrs,
    args: Vec<Id>,
    loc: Option<&str>,
) -> Option<Id> {
    add_op_node(eg, kind, attrs, args, loc).map(|(id, _)| id)
}

/// [`add_op`], also returning the e-node added.
fn add_op_node(
    eg: &mut PpEGraph,
    kind: OpKind,
    attrs: &Attrs,
    args: Vec<Id>,
    loc: Option<&str>,
) -> Option<(Id, PpNode)> {
    let types: Option<Vec<TensorType>> = args.iter().map(|&a| eg[a].data.ty().cloned()).collect();
    let results = ppir::shape::infer(kind, attrs, &types?).ok()?;
    if results.len() != 1 {
        return None;
    }
    let attrs = eg.analysis.intern(attrs);
    let node = PpNode::Op { kind, attrs, args };
    let id = eg.add(node.clone());
    if eg[id].data.loc.is_none() {
        eg[id].data.loc = loc.map(str::to_string);
    }
    Some((id, node))
}

fn slice(eg: &mut PpEGraph, x: Id, axis: usize, start: u64, end: u64, loc: &str) -> Option<Id> {
    let a = SliceAttrs {
        starts: vec![start as i64],
        ends: vec![end as i64],
        axes: Some(vec![axis as i64]),
        steps: None,
    };
    add_op(eg, OpKind::Slice, &a.to_attrs(), vec![x], Some(loc))
}

fn concat(eg: &mut PpEGraph, parts: Vec<Id>, axis: usize, loc: Option<&str>) -> Option<Id> {
    concat_node(eg, parts, axis, loc).map(|(id, _)| id)
}

fn concat_node(
    eg: &mut PpEGraph,
    parts: Vec<Id>,
    axis: usize,
    loc: Option<&str>,
) -> Option<(Id, PpNode)> {
    let a = ConcatAttrs { axis: axis as i64 };
    add_op_node(eg, OpKind::Concat, &a.to_attrs(), parts, loc)
}

fn sum(eg: &mut PpEGraph, parts: Vec<Id>, loc: Option<&str>) -> Option<Id> {
    sum_node(eg, parts, loc).map(|(id, _)| id)
}

/// The sum of `parts` (a chain of adds) and its last add.
fn sum_node(eg: &mut PpEGraph, parts: Vec<Id>, loc: Option<&str>) -> Option<(Id, PpNode)> {
    let mut acc = None;
    let mut id = parts[0];
    for &p in &parts[1..] {
        let (next, node) = add_op_node(eg, OpKind::Add, &Attrs::new(), vec![id, p], loc)?;
        id = next;
        acc = Some((next, node));
    }
    acc
}

/// `[start, end)` of each of `k` near-equal pieces of `n` (the first `n % k` one larger).
pub fn pieces(n: u64, k: usize) -> Vec<(u64, u64)> {
    let k = k as u64;
    let (q, r) = (n / k, n % k);
    let mut out = vec![];
    let mut start = 0;
    for i in 0..k {
        let len = q + u64::from(i < r);
        out.push((start, start + len));
        start += len;
    }
    out
}

fn static_dim(t: &TensorType, axis: usize) -> Option<u64> {
    t.dims.get(axis)?.known()
}

fn ty(eg: &PpEGraph, id: Id) -> Option<TensorType> {
    eg[id].data.ty().cloned()
}

/// Whether `node` is an op of kind `kind`.
fn is_op(node: &PpNode, kind: OpKind) -> bool {
    matches!(node, PpNode::Op { kind: k, .. } if *k == kind)
}

/// `f` applied to every part, concatenated along `axis`; `None` if any part fails.
fn concat_of_each(
    eg: &mut PpEGraph,
    parts: &[Id],
    axis: usize,
    loc: Option<&str>,
    mut f: impl FnMut(&mut PpEGraph, Id) -> Option<Id>,
) -> Option<Id> {
    let pieces: Option<Vec<Id>> = parts.iter().map(|&p| f(eg, p)).collect();
    concat(eg, pieces?, axis, loc)
}

fn op_parts(node: &PpNode) -> Option<(OpKind, super::egraph::AttrId, &[Id])> {
    match node {
        PpNode::Op { kind, attrs, args } => Some((*kind, *attrs, args)),
        _ => None,
    }
}

fn record(ctx: &RuleCtx, class: Id, root: PpNode, axis: Axis, what: String, pieces: usize) {
    let mut v = ctx.variants.lock().unwrap_or_else(|e| e.into_inner());
    if !v.iter().any(|x| x.class == class && x.root == root) {
        v.push(Variant {
            class,
            root,
            what,
            pieces,
            axis,
        });
    }
}

// ---- split rules ----

/// Which dimension a split cuts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Axis {
    /// Rows of the result (`M`).
    M,
    /// Columns of the result (`N`).
    N,
    /// The contraction (`K`): the pieces are summed.
    K,
    /// The rows of a gathered table (`V`, the vocabulary of an embedding): each piece
    /// gathers the ids in its rows, zeros elsewhere, and the pieces are summed.
    V,
    /// The heads of a batched matmul (`H`: the batch axis right before the two matrix
    /// axes, `[B, H, S, D]`): each piece multiplies its heads.
    H,
}

impl Axis {
    /// `m`, `n` or `k`.
    pub fn from_name(s: &str) -> Option<Axis> {
        match s {
            "m" | "M" => Some(Axis::M),
            "n" | "N" => Some(Axis::N),
            "k" | "K" => Some(Axis::K),
            "v" | "V" => Some(Axis::V),
            "h" | "H" => Some(Axis::H),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Axis::M => "M",
            Axis::N => "N",
            Axis::K => "K",
            Axis::V => "V",
            Axis::H => "H",
        }
    }
}

/// A `matmul` (numpy semantics) or `gemm` (transposes and the bias follow the cut) split
/// into K pieces along one axis.
pub struct SplitContraction {
    pub kind: OpKind,
    pub axis: Axis,
}

impl Rule for SplitContraction {
    fn name(&self) -> &'static str {
        match (self.kind, self.axis) {
            (OpKind::Gemm, Axis::M) => "split-gemm-m",
            (OpKind::Gemm, Axis::N) => "split-gemm-n",
            (OpKind::Gemm, Axis::K) => "split-gemm-k",
            (_, Axis::M) => "split-matmul-m",
            (_, Axis::N) => "split-matmul-n",
            (_, Axis::K) => "split-matmul-k",
            (_, Axis::V) => "split-matmul-v",
            (OpKind::Gemm, Axis::H) => "split-gemm-h",
            (_, Axis::H) => "split-matmul-h",
        }
    }

    fn matches(&self, _: &PpEGraph, node: &PpNode) -> bool {
        matches!(node, PpNode::Op { kind, .. } if *kind == self.kind)
    }

    fn apply(&self, eg: &mut PpEGraph, ctx: &RuleCtx, class: Id, node: &PpNode) -> Vec<Id> {
        let Some(k) = target(eg, ctx, class, self.axis) else {
            return vec![];
        };
        let Some((_, attrs, args)) = op_parts(node) else {
            return vec![];
        };
        let loc = eg[class].data.loc.clone().unwrap_or_default();
        let out = match self.kind {
            OpKind::Gemm => match GemmAttrs::of(eg.analysis.attrs(attrs)) {
                Ok(g) => split_gemm(eg, self.axis, &g, args.to_vec(), k, &loc),
                Err(_) => None,
            },
            _ => split_matmul(eg, self.axis, args[0], args[1], k, &loc),
        };
        if let Some((_, root)) = &out {
            let what = format!(
                "{} along {} in {k} pieces",
                self.kind.name(),
                self.axis.name()
            );
            record(ctx, class, root.clone(), self.axis, what, k);
        }
        out.into_iter().map(|(id, _)| id).collect()
    }
}

/// The pieces of `matmul(a, b)` along `axis`, combined; `None` if that axis cannot be cut
/// `k` ways (too small, symbolic, or absent).
fn split_matmul(
    eg: &mut PpEGraph,
    axis: Axis,
    a: Id,
    b: Id,
    k: usize,
    loc: &str,
) -> Option<(Id, PpNode)> {
    let (ta, tb) = (ty(eg, a)?, ty(eg, b)?);
    let (ra, rb) = (ta.rank(), tb.rank());
    if ra == 0 || rb == 0 || k < 2 {
        return None;
    }
    let mm = |eg: &mut PpEGraph, x: Id, y: Id, i: usize| {
        add_op(
            eg,
            OpKind::MatMul,
            &Attrs::new(),
            vec![x, y],
            Some(&format!("{loc}/{}{i}", axis.name().to_lowercase())),
        )
    };
    let result_rank = ppir::shape::infer(OpKind::MatMul, &Attrs::new(), &[ta.clone(), tb.clone()])
        .ok()?[0]
        .rank();
    match axis {
        Axis::V => None,
        Axis::H => {
            // The heads axis of the result, and of each operand where it has one (aligned
            // to the right; an operand of extent 1 there broadcasts and is not cut).
            if ra < 2 || rb < 2 || result_rank < 3 {
                return None;
            }
            let r_axis = result_rank - 3;
            let tr = ppir::shape::infer(OpKind::MatMul, &Attrs::new(), &[ta.clone(), tb.clone()])
                .ok()?
                .remove(0);
            let n = static_dim(&tr, r_axis)?;
            if n < k as u64 {
                return None;
            }
            let cut = |eg: &mut PpEGraph, x: Id, t: &TensorType, s: u64, e: u64| -> Option<Id> {
                match (r_axis + t.rank()).checked_sub(result_rank) {
                    None => Some(x),
                    Some(ax) => match static_dim(t, ax)? {
                        1 => Some(x),
                        d if d == n => slice(eg, x, ax, s, e, loc),
                        _ => None,
                    },
                }
            };
            let mut parts = vec![];
            for (i, (s, e)) in pieces(n, k).into_iter().enumerate() {
                let ai = cut(eg, a, &ta, s, e)?;
                let bi = cut(eg, b, &tb, s, e)?;
                parts.push(mm(eg, ai, bi, i)?);
            }
            concat_node(eg, parts, r_axis, Some(loc))
        }
        Axis::N => {
            if rb < 2 {
                return None;
            }
            let n = static_dim(&tb, rb - 1)?;
            if n < k as u64 {
                return None;
            }
            let mut parts = vec![];
            for (i, (s, e)) in pieces(n, k).into_iter().enumerate() {
                let bi = slice(eg, b, rb - 1, s, e, loc)?;
                parts.push(mm(eg, a, bi, i)?);
            }
            concat_node(eg, parts, result_rank - 1, Some(loc))
        }
        Axis::M => {
            if ra < 2 {
                return None;
            }
            let m = static_dim(&ta, ra - 2)?;
            if m < k as u64 {
                return None;
            }
            let out_axis = if rb >= 2 {
                result_rank - 2
            } else {
                result_rank - 1
            };
            let mut parts = vec![];
            for (i, (s, e)) in pieces(m, k).into_iter().enumerate() {
                let ai = slice(eg, a, ra - 2, s, e, loc)?;
                parts.push(mm(eg, ai, b, i)?);
            }
            concat_node(eg, parts, out_axis, Some(loc))
        }
        Axis::K => {
            let kd = static_dim(&ta, ra - 1)?;
            if kd < k as u64 {
                return None;
            }
            let b_axis = rb.saturating_sub(2);
            let mut parts = vec![];
            for (i, (s, e)) in pieces(kd, k).into_iter().enumerate() {
                let ai = slice(eg, a, ra - 1, s, e, loc)?;
                let bi = slice(eg, b, b_axis, s, e, loc)?;
                parts.push(mm(eg, ai, bi, i)?);
            }
            sum_node(eg, parts, Some(loc))
        }
    }
}

fn split_gemm(
    eg: &mut PpEGraph,
    axis: Axis,
    g: &GemmAttrs,
    args: Vec<Id>,
    k: usize,
    loc: &str,
) -> Option<(Id, PpNode)> {
    let (a, b, c) = (args[0], args[1], args.get(2).copied());
    let (ta, tb) = (ty(eg, a)?, ty(eg, b)?);
    if ta.rank() != 2 || tb.rank() != 2 || k < 2 {
        return None;
    }
    let (m_axis, ka_axis) = if g.trans_a { (1, 0) } else { (0, 1) };
    let (kb_axis, n_axis) = if g.trans_b { (1, 0) } else { (0, 1) };
    let tc = match c {
        Some(c) => Some(ty(eg, c)?),
        None => None,
    };
    let piece_loc = |i: usize| format!("{loc}/{}{i}", axis.name().to_lowercase());
    let gemm = |eg: &mut PpEGraph, args: Vec<Id>, attrs: &GemmAttrs, i: usize| {
        add_op(
            eg,
            OpKind::Gemm,
            &attrs.to_attrs(),
            args,
            Some(&piece_loc(i)),
        )
    };
    // The bias piece for result rows/columns [s, e) along result axis `r` (0 rows, 1
    // columns): sliced where c has the full extent there, kept where it broadcasts.
    let c_piece = |eg: &mut PpEGraph, r: usize, full: u64, s: u64, e: u64| -> Option<Option<Id>> {
        let (Some(c), Some(tc)) = (c, tc.as_ref()) else {
            return Some(None);
        };
        // Align c's dims to the right of [M, N].
        let rank = tc.rank();
        if rank > 2 {
            return None;
        }
        let c_axis = (r + rank).checked_sub(2);
        match c_axis {
            Some(ax) if static_dim(tc, ax) == Some(full) && full != 1 => {
                Some(Some(slice(eg, c, ax, s, e, loc)?))
            }
            Some(ax) if static_dim(tc, ax) == Some(1) => Some(Some(c)),
            None => Some(Some(c)),
            _ => None,
        }
    };
    match axis {
        Axis::V | Axis::H => None,
        Axis::N | Axis::M => {
            let (operand, op_axis, r) = if axis == Axis::N {
                (b, n_axis, 1)
            } else {
                (a, m_axis, 0)
            };
            let t = if axis == Axis::N { &tb } else { &ta };
            let full = static_dim(t, op_axis)?;
            if full < k as u64 {
                return None;
            }
            let mut parts = vec![];
            for (i, (s, e)) in pieces(full, k).into_iter().enumerate() {
                let x = slice(eg, operand, op_axis, s, e, loc)?;
                let mut args = if axis == Axis::N {
                    vec![a, x]
                } else {
                    vec![x, b]
                };
                if let Some(ci) = c_piece(eg, r, full, s, e)? {
                    args.push(ci);
                }
                parts.push(gemm(eg, args, g, i)?);
            }
            concat_node(eg, parts, r, Some(loc))
        }
        Axis::K => {
            let kd = static_dim(&ta, ka_axis)?;
            if kd < k as u64 {
                return None;
            }
            let mut parts = vec![];
            for (i, (s, e)) in pieces(kd, k).into_iter().enumerate() {
                let ai = slice(eg, a, ka_axis, s, e, loc)?;
                let bi = slice(eg, b, kb_axis, s, e, loc)?;
                let mut args = vec![ai, bi];
                let mut gi = g.clone();
                match c {
                    Some(c) if i == 0 => args.push(c),
                    _ => gi.beta = 0.0,
                }
                parts.push(gemm(eg, args, &gi, i)?);
            }
            sum_node(eg, parts, Some(loc))
        }
    }
}

// ---- propagation rules ----

/// The parts and axis of a concat node.
fn concat_parts(eg: &PpEGraph, id: Id) -> Vec<(Vec<Id>, usize)> {
    eg[id]
        .nodes
        .iter()
        .filter_map(|n| match n {
            PpNode::Op {
                kind: OpKind::Concat,
                attrs,
                args,
            } if args.len() >= 2 => {
                let rank = eg[id].data.ty()?.rank() as i64;
                let axis = ConcatAttrs::of(eg.analysis.attrs(*attrs)).ok()?.axis;
                let axis = if axis < 0 { axis + rank } else { axis };
                Some((args.clone(), axis as usize))
            }
            _ => None,
        })
        .collect()
}

/// Extents of each part along `axis`.
fn extents(eg: &PpEGraph, parts: &[Id], axis: usize) -> Option<Vec<(u64, u64)>> {
    let mut out = vec![];
    let mut start = 0;
    for &p in parts {
        let n = static_dim(eg[p].data.ty()?, axis)?;
        out.push((start, start + n));
        start += n;
    }
    Some(out)
}

/// Elementwise ops distribute over a concat operand: each piece computes its part, the
/// other operands sliced to the piece where they have the full extent on the concat axis
/// (kept where they broadcast).
pub struct DistributeElementwise;

impl Rule for DistributeElementwise {
    fn name(&self) -> &'static str {
        "distribute-elementwise"
    }

    fn matches(&self, _: &PpEGraph, node: &PpNode) -> bool {
        matches!(node, PpNode::Op { kind, .. } if kind.is_elementwise() && *kind != OpKind::Dropout)
    }

    fn apply(&self, eg: &mut PpEGraph, _: &RuleCtx, class: Id, node: &PpNode) -> Vec<Id> {
        let Some((kind, attrs_id, args)) = op_parts(node) else {
            return vec![];
        };
        let Some(out_ty) = ty(eg, class) else {
            return vec![];
        };
        let attrs = eg.analysis.attrs(attrs_id).clone();
        let loc = eg[class].data.loc.clone();
        let mut out = vec![];
        for (pos, &arg) in args.iter().enumerate() {
            for (parts, axis) in concat_parts(eg, arg) {
                let Some(arg_ty) = ty(eg, arg) else { continue };
                // The concat's axis in the result (operands align to the right).
                let r_axis = axis + out_ty.rank() - arg_ty.rank();
                // The result must not be broadcast along the axis by another operand.
                if static_dim(&out_ty, r_axis) != static_dim(&arg_ty, axis) {
                    continue;
                }
                let Some(ext) = extents(eg, &parts, axis) else {
                    continue;
                };
                let full = ext.last().map_or(0, |e| e.1);
                let mut pieces = vec![];
                let mut ok = true;
                for (i, &(s, e)) in ext.iter().enumerate() {
                    let mut piece_args = vec![];
                    for (j, &other) in args.iter().enumerate() {
                        if j == pos {
                            piece_args.push(parts[i]);
                            continue;
                        }
                        let Some(t) = ty(eg, other) else {
                            ok = false;
                            break;
                        };
                        // `other`'s axis aligned with r_axis, if it has one.
                        let o_axis = (r_axis + t.rank()).checked_sub(out_ty.rank());
                        match o_axis.map(|a| (a, static_dim(&t, a))) {
                            None | Some((_, Some(1))) => piece_args.push(other),
                            Some((a, Some(n))) if n == full => {
                                match slice(eg, other, a, s, e, loc.as_deref().unwrap_or("")) {
                                    Some(x) => piece_args.push(x),
                                    None => ok = false,
                                }
                            }
                            _ => ok = false,
                        }
                        if !ok {
                            break;
                        }
                    }
                    if !ok {
                        break;
                    }
                    match add_op(eg, kind, &attrs, piece_args, loc.as_deref()) {
                        Some(p) => pieces.push(p),
                        None => {
                            ok = false;
                            break;
                        }
                    }
                }
                if ok {
                    if let Some(c) = concat(eg, pieces, r_axis, loc.as_deref()) {
                        out.push(c);
                    }
                }
            }
        }
        out
    }
}

/// Row-wise ops distribute over a concat along an axis they do not work across: a layer
/// norm over the last axes, a softmax over another axis, a reduction over other axes.
pub struct DistributeRowwise;

impl DistributeRowwise {
    /// The concat axis in the result, if `kind` with `attrs` on rank-`rank` operands keeps
    /// axis `a` independent.
    fn result_axis(kind: OpKind, attrs: &Attrs, rank: usize, a: usize) -> Option<usize> {
        let norm = |x: i64| if x < 0 { x + rank as i64 } else { x };
        match kind {
            OpKind::LayerNorm => {
                let axis = norm(LayerNormAttrs::of(attrs).ok()?.axis);
                ((a as i64) < axis).then_some(a)
            }
            OpKind::Softmax | OpKind::LogSoftmax => {
                let axis = norm(SoftmaxAttrs::of(attrs).ok()?.axis);
                (a as i64 != axis).then_some(a)
            }
            OpKind::ReduceSum | OpKind::ReduceMean | OpKind::ReduceMax | OpKind::ReduceMin => {
                let r = ReduceAttrs::of(attrs).ok()?;
                if r.axes.is_empty() {
                    return None;
                }
                let axes: Vec<i64> = r.axes.iter().map(|&x| norm(x)).collect();
                if axes.contains(&(a as i64)) {
                    return None;
                }
                if r.keepdims {
                    Some(a)
                } else {
                    Some(a - axes.iter().filter(|&&x| x < a as i64).count())
                }
            }
            _ => None,
        }
    }
}

impl Rule for DistributeRowwise {
    fn name(&self) -> &'static str {
        "distribute-rowwise"
    }

    fn matches(&self, _: &PpEGraph, node: &PpNode) -> bool {
        matches!(
            node,
            PpNode::Op {
                kind: OpKind::LayerNorm
                    | OpKind::Softmax
                    | OpKind::LogSoftmax
                    | OpKind::ReduceSum
                    | OpKind::ReduceMean
                    | OpKind::ReduceMax
                    | OpKind::ReduceMin,
                ..
            }
        )
    }

    fn apply(&self, eg: &mut PpEGraph, _: &RuleCtx, class: Id, node: &PpNode) -> Vec<Id> {
        let Some((kind, attrs_id, args)) = op_parts(node) else {
            return vec![];
        };
        let attrs = eg.analysis.attrs(attrs_id).clone();
        let loc = eg[class].data.loc.clone();
        let x = args[0];
        let Some(rank) = ty(eg, x).map(|t| t.rank()) else {
            return vec![];
        };
        let mut out = vec![];
        for (parts, axis) in concat_parts(eg, x) {
            let Some(r_axis) = Self::result_axis(kind, &attrs, rank, axis) else {
                continue;
            };
            out.extend(concat_of_each(
                eg,
                &parts,
                r_axis,
                loc.as_deref(),
                |eg, p| {
                    let mut piece_args = args.to_vec();
                    piece_args[0] = p;
                    add_op(eg, kind, &attrs, piece_args, loc.as_deref())
                },
            ));
        }
        out
    }
}

/// A unit-step slice along a concat's axis that reads exactly one part is that part.
pub struct SliceOfConcat;

impl Rule for SliceOfConcat {
    fn name(&self) -> &'static str {
        "slice-of-concat"
    }

    fn matches(&self, _: &PpEGraph, node: &PpNode) -> bool {
        is_op(node, OpKind::Slice)
    }

    fn apply(&self, eg: &mut PpEGraph, _: &RuleCtx, _class: Id, node: &PpNode) -> Vec<Id> {
        let Some((_, attrs, args)) = op_parts(node) else {
            return vec![];
        };
        let Ok(s) = SliceAttrs::of(eg.analysis.attrs(attrs)) else {
            return vec![];
        };
        let x = args[0];
        let Some(tx) = ty(eg, x) else { return vec![] };
        let rank = tx.rank() as i64;
        let axes = s
            .axes
            .clone()
            .unwrap_or_else(|| (0..s.starts.len() as i64).collect());
        if axes.len() != 1
            || s.steps
                .as_ref()
                .is_some_and(|st| st.iter().any(|&v| v != 1))
        {
            return vec![];
        }
        let axis = if axes[0] < 0 { axes[0] + rank } else { axes[0] } as usize;
        let mut out = vec![];
        for (parts, c_axis) in concat_parts(eg, x) {
            if c_axis != axis {
                continue;
            }
            let Some(ext) = extents(eg, &parts, axis) else {
                continue;
            };
            for (i, &(st, en)) in ext.iter().enumerate() {
                if s.starts[0] == st as i64 && s.ends[0] == en as i64 {
                    out.push(parts[i]);
                }
            }
        }
        out
    }
}

/// `matmul(concat(a_i), b)`: a concat along a's contraction axis is a sum of matmuls with
/// b's matching rows; along a's row axis, a concat of matmuls.
pub struct MatMulOfConcat;

impl Rule for MatMulOfConcat {
    fn name(&self) -> &'static str {
        "matmul-of-concat"
    }

    fn matches(&self, _: &PpEGraph, node: &PpNode) -> bool {
        is_op(node, OpKind::MatMul)
    }

    fn apply(&self, eg: &mut PpEGraph, ctx: &RuleCtx, class: Id, node: &PpNode) -> Vec<Id> {
        let Some((_, _, args)) = op_parts(node) else {
            return vec![];
        };
        let (a, b) = (args[0], args[1]);
        let (Some(ta), Some(tb), Some(tr)) = (ty(eg, a), ty(eg, b), ty(eg, class)) else {
            return vec![];
        };
        let loc = eg[class].data.loc.clone().unwrap_or_default();
        let (ra, rb) = (ta.rank(), tb.rank());
        if ra < 2 || rb < 2 {
            return vec![];
        }
        let mut out = vec![];
        for (parts, axis) in concat_parts(eg, a) {
            let Some(ext) = extents(eg, &parts, axis) else {
                continue;
            };
            let mut built = vec![];
            let mut ok = true;
            if axis == ra - 1 {
                for (i, &(s, e)) in ext.iter().enumerate() {
                    let bi = slice(eg, b, rb - 2, s, e, &loc);
                    match bi.and_then(|bi| {
                        add_op(
                            eg,
                            OpKind::MatMul,
                            &Attrs::new(),
                            vec![parts[i], bi],
                            Some(&loc),
                        )
                    }) {
                        Some(p) => built.push(p),
                        None => ok = false,
                    }
                }
                if ok {
                    out.extend(sum(eg, built, Some(&loc)));
                }
            } else if axis == ra - 2 {
                for &p in &parts {
                    match add_op(eg, OpKind::MatMul, &Attrs::new(), vec![p, b], Some(&loc)) {
                        Some(x) => built.push(x),
                        None => ok = false,
                    }
                }
                if ok {
                    out.extend(concat(eg, built, tr.rank() - 2, Some(&loc)));
                }
            } else {
                // A batch axis (heads): the other operand is cut the same way where it
                // has the full extent there, kept where it broadcasts.
                let built = Self::batch(eg, &parts, &ext, axis, ra, b, &tb, &tr, false, &loc);
                out.extend(Self::recorded(eg, ctx, class, built, parts.len()));
            }
        }
        for (parts, axis) in concat_parts(eg, b) {
            if axis + 2 >= rb {
                continue;
            }
            let Some(ext) = extents(eg, &parts, axis) else {
                continue;
            };
            let built = Self::batch(eg, &parts, &ext, axis, rb, a, &ta, &tr, true, &loc);
            out.extend(Self::recorded(eg, ctx, class, built, parts.len()));
        }
        out
    }
}

impl MatMulOfConcat {
    /// A heads split that reached a matmul which is itself a split target along its heads
    /// in as many pieces (`--split qk=2:h,av=2:h`) is a variant of that target: the pieces
    /// then flow from one target to the other without being joined in between.
    fn recorded(
        eg: &PpEGraph,
        ctx: &RuleCtx,
        class: Id,
        built: Option<(Id, PpNode)>,
        k: usize,
    ) -> Option<Id> {
        let (id, root) = built?;
        if target(eg, ctx, class, Axis::H) == Some(k) {
            let what = format!("matmul along H in {k} pieces (its operand's heads)");
            record(ctx, class, root, Axis::H, what, k);
        }
        Some(id)
    }

    /// `matmul` of an operand concatenated along batch axis `axis` (of its rank `rank`)
    /// with `other`: per part, `other` cut to the part where it has the full extent on the
    /// aligned axis (kept where it broadcasts), concatenated along the result's axis.
    #[allow(clippy::too_many_arguments)]
    fn batch(
        eg: &mut PpEGraph,
        parts: &[Id],
        ext: &[(u64, u64)],
        axis: usize,
        rank: usize,
        other: Id,
        other_ty: &TensorType,
        result: &TensorType,
        concat_is_b: bool,
        loc: &str,
    ) -> Option<(Id, PpNode)> {
        let r_axis = axis + result.rank() - rank;
        let full = ext.last()?.1;
        if static_dim(result, r_axis)? != full {
            return None;
        }
        let o_axis = (r_axis + other_ty.rank()).checked_sub(result.rank());
        let mut built = vec![];
        for (i, &(s, e)) in ext.iter().enumerate() {
            let o = match o_axis.map(|ax| (ax, static_dim(other_ty, ax))) {
                None | Some((_, Some(1))) => other,
                Some((ax, Some(d))) if d == full && ax + 2 < other_ty.rank() => {
                    slice(eg, other, ax, s, e, loc)?
                }
                _ => return None,
            };
            let args = if concat_is_b {
                vec![o, parts[i]]
            } else {
                vec![parts[i], o]
            };
            built.push(add_op(eg, OpKind::MatMul, &Attrs::new(), args, Some(loc))?);
        }
        concat_node(eg, built, r_axis, Some(loc))
    }
}

/// A transpose of a concat is the concat of the transposed parts, along where the concat's
/// axis goes.
pub struct TransposeOfConcat;

impl Rule for TransposeOfConcat {
    fn name(&self) -> &'static str {
        "transpose-of-concat"
    }

    fn matches(&self, _: &PpEGraph, node: &PpNode) -> bool {
        is_op(node, OpKind::Transpose)
    }

    fn apply(&self, eg: &mut PpEGraph, _: &RuleCtx, class: Id, node: &PpNode) -> Vec<Id> {
        let Some((_, attrs_id, args)) = op_parts(node) else {
            return vec![];
        };
        let attrs = eg.analysis.attrs(attrs_id).clone();
        let Some(rank) = ty(eg, args[0]).map(|t| t.rank()) else {
            return vec![];
        };
        let perm: Vec<usize> = match TransposeAttrs::of(&attrs).ok().and_then(|t| t.perm) {
            Some(p) => p
                .iter()
                .map(|&x| if x < 0 { x + rank as i64 } else { x } as usize)
                .collect(),
            None => (0..rank).rev().collect(),
        };
        let loc = eg[class].data.loc.clone();
        let mut out = vec![];
        for (parts, axis) in concat_parts(eg, args[0]) {
            let Some(r_axis) = perm.iter().position(|&p| p == axis) else {
                continue;
            };
            out.extend(concat_of_each(
                eg,
                &parts,
                r_axis,
                loc.as_deref(),
                |eg, p| add_op(eg, OpKind::Transpose, &attrs, vec![p], loc.as_deref()),
            ));
        }
        out
    }
}

/// A reshape that keeps the axes before a concat's axis and the product of the axes after
/// it (merging heads into the model width, `[B, S, H, D] -> [B, S, H·D]`, or splitting them
/// back) is the concat of the reshaped parts.
pub struct ReshapeOfConcat;

impl Rule for ReshapeOfConcat {
    fn name(&self) -> &'static str {
        "reshape-of-concat"
    }

    fn matches(&self, _: &PpEGraph, node: &PpNode) -> bool {
        is_op(node, OpKind::Reshape)
    }

    fn apply(&self, eg: &mut PpEGraph, _: &RuleCtx, class: Id, node: &PpNode) -> Vec<Id> {
        let Some((_, _, args)) = op_parts(node) else {
            return vec![];
        };
        let (Some(tin), Some(tout)) = (ty(eg, args[0]), ty(eg, class)) else {
            return vec![];
        };
        let (Some(sin), Some(sout)) = (tin.static_shape(), tout.static_shape()) else {
            return vec![];
        };
        let loc = eg[class].data.loc.clone();
        let mut out = vec![];
        for (parts, axis) in concat_parts(eg, args[0]) {
            if sout.len() <= axis || sin[..axis] != sout[..axis] {
                continue;
            }
            let after_in: u64 = sin[axis + 1..].iter().product();
            let after_out: u64 = sout[axis + 1..].iter().product();
            let Some(ext) = extents(eg, &parts, axis) else {
                continue;
            };
            let mut pieces = vec![];
            for (&p, &(s, e)) in parts.iter().zip(&ext) {
                let n = (e - s) * after_in;
                if after_out == 0 || !n.is_multiple_of(after_out) {
                    pieces.clear();
                    break;
                }
                let mut shape: Vec<i64> = sout.iter().map(|&d| d as i64).collect();
                shape[axis] = (n / after_out) as i64;
                let a = ShapeAttrs { shape }.to_attrs();
                match add_op(eg, OpKind::Reshape, &a, vec![p], loc.as_deref()) {
                    Some(x) => pieces.push(x),
                    None => {
                        pieces.clear();
                        break;
                    }
                }
            }
            if pieces.len() == parts.len() {
                out.extend(concat(eg, pieces, axis, loc.as_deref()));
            }
        }
        out
    }
}

/// A softmax cross-entropy of logits concatenated along the class axis is computed from
/// the pieces, so that no device needs the whole logits: each piece gives its log-sum-exp
/// (`reduce_log_sum_exp` over its classes) and the logit at the label if the label is one
/// of its classes (`label_logit` with the piece's first class as `offset`); the merge is
/// `lse = log-sum-exp of the pieces' log-sum-exps`, `loss = mean(lse - Σ picked)` over the
/// positions (with `ignore_index`, over those not ignored, 0 if none). The form is forced
/// wherever the loss is extracted: its pieces are shared between the two per-piece ops,
/// which the tree cost would count twice.
pub struct SplitCrossEntropy;

impl SplitCrossEntropy {
    fn merge(
        eg: &mut PpEGraph,
        parts: &[Id],
        labels: Id,
        ignore: Option<i64>,
        loc: &str,
    ) -> Option<(Id, PpNode)> {
        let rank = ty(eg, parts[0])?.rank();
        let last = rank.checked_sub(1)?;
        let ext = extents(eg, parts, last)?;
        let keep = ReduceAttrs {
            axes: vec![-1],
            keepdims: true,
        }
        .to_attrs();
        let mut lses = vec![];
        let mut picks = vec![];
        for (&p, &(start, _)) in parts.iter().zip(&ext) {
            lses.push(add_op(
                eg,
                OpKind::ReduceLogSumExp,
                &keep,
                vec![p],
                Some(loc),
            )?);
            let a = LabelLogitAttrs {
                offset: start as i64,
            };
            picks.push(add_op(
                eg,
                OpKind::LabelLogit,
                &a.to_attrs(),
                vec![p, labels],
                Some(loc),
            )?);
        }
        let lses = concat(eg, lses, last, Some(loc))?;
        let drop = ReduceAttrs {
            axes: vec![-1],
            keepdims: false,
        }
        .to_attrs();
        let lse = add_op(eg, OpKind::ReduceLogSumExp, &drop, vec![lses], Some(loc))?;
        let picked = if picks.len() == 1 {
            picks[0]
        } else {
            sum(eg, picks, Some(loc))?
        };
        let l = add_op(eg, OpKind::Sub, &Attrs::new(), vec![lse, picked], Some(loc))?;
        let all = ReduceAttrs {
            axes: vec![],
            keepdims: false,
        }
        .to_attrs();
        let Some(c) = ignore else {
            return add_op_node(eg, OpKind::ReduceMean, &all, vec![l], Some(loc));
        };
        let fdt = ty(eg, l)?.dtype;
        let ldt = ty(eg, labels)?.dtype;
        let constant = |eg: &mut PpEGraph, t: Tensor| {
            add_op(
                eg,
                OpKind::Constant,
                &ConstantAttrs { value: t }.to_attrs(),
                vec![],
                Some(loc),
            )
        };
        let ci = constant(eg, Tensor::from_i64(ldt, vec![], vec![c]))?;
        let eq = add_op(
            eg,
            OpKind::Equal,
            &Attrs::new(),
            vec![labels, ci],
            Some(loc),
        )?;
        let valid = add_op(eg, OpKind::Not, &Attrs::new(), vec![eq], Some(loc))?;
        let m = add_op(
            eg,
            OpKind::Cast,
            &CastAttrs { to: fdt }.to_attrs(),
            vec![valid],
            Some(loc),
        )?;
        let lm = add_op(eg, OpKind::Mul, &Attrs::new(), vec![l, m], Some(loc))?;
        let num = add_op(eg, OpKind::ReduceSum, &all, vec![lm], Some(loc))?;
        let cnt = add_op(eg, OpKind::ReduceSum, &all, vec![m], Some(loc))?;
        let one = constant(eg, Tensor::scalar_f64(fdt, 1.0))?;
        let den = add_op(eg, OpKind::Max, &Attrs::new(), vec![cnt, one], Some(loc))?;
        add_op_node(eg, OpKind::Div, &Attrs::new(), vec![num, den], Some(loc))
    }
}

impl Rule for SplitCrossEntropy {
    fn name(&self) -> &'static str {
        "split-cross-entropy"
    }

    fn matches(&self, _: &PpEGraph, node: &PpNode) -> bool {
        is_op(node, OpKind::SoftmaxCrossEntropy)
    }

    fn apply(&self, eg: &mut PpEGraph, ctx: &RuleCtx, class: Id, node: &PpNode) -> Vec<Id> {
        let Some((_, attrs_id, args)) = op_parts(node) else {
            return vec![];
        };
        let Ok(ce) = CrossEntropyAttrs::of(eg.analysis.attrs(attrs_id)) else {
            return vec![];
        };
        let (logits, labels) = (args[0], args[1]);
        let Some(rank) = ty(eg, logits).map(|t| t.rank()) else {
            return vec![];
        };
        let loc = eg[class].data.loc.clone().unwrap_or_else(|| "loss".into());
        let mut out = vec![];
        for (parts, axis) in concat_parts(eg, logits) {
            if axis + 1 != rank {
                continue;
            }
            let Some((id, root)) = Self::merge(eg, &parts, labels, ce.ignore_index, &loc) else {
                continue;
            };
            let mut forced = ctx.forced.lock().unwrap_or_else(|e| e.into_inner());
            if !forced.iter().any(|(c, n, _)| *c == class && *n == root) {
                forced.push((
                    class,
                    root,
                    format!(
                        "softmax_cross_entropy along the classes in {} pieces (log-sum-exp merge)",
                        parts.len()
                    ),
                ));
            }
            out.push(id);
        }
        out
    }
}

/// `split-gather-v`: a gather from a table split along its gathered axis (an embedding
/// along the vocabulary). Piece `i` holds the rows `s_i..e_i`; it gathers `ids - s_i` where
/// that is in range (negative ids wrap first, as `gather` does) and gives zeros elsewhere,
/// so the sum of the pieces is the gather, exactly.
pub struct SplitGather;

impl SplitGather {
    fn pieces(eg: &mut PpEGraph, node: &PpNode, k: usize, loc: &str) -> Option<(Id, PpNode)> {
        let (_, attrs_id, args) = op_parts(node)?;
        let attrs = eg.analysis.attrs(attrs_id).clone();
        let (data, ids) = (args[0], args[1]);
        let (dt, it) = (ty(eg, data)?, ty(eg, ids)?);
        let axis = GatherAttrs::of(&attrs).ok()?.axis;
        let axis = if axis < 0 {
            axis + dt.rank() as i64
        } else {
            axis
        } as usize;
        let n = static_dim(&dt, axis)?;
        if (n as usize) < k || k < 2 {
            return None;
        }
        let out_ty = {
            let mut dims = dt.dims[..axis].to_vec();
            dims.extend(it.dims.iter().copied());
            dims.extend(dt.dims[axis + 1..].iter().copied());
            TensorType::new(dt.dtype, dims)
        };
        let int = |eg: &mut PpEGraph, x: i64| {
            let t = Tensor::from_i64(it.dtype, vec![], vec![x]);
            add_op(
                eg,
                OpKind::Constant,
                &ConstantAttrs { value: t }.to_attrs(),
                vec![],
                Some(loc),
            )
        };
        let none = Attrs::new();
        // Negative ids wrap: id + n where id < 0.
        let zero = int(eg, 0)?;
        let neg = add_op(eg, OpKind::Less, &none, vec![ids, zero], Some(loc))?;
        let nc = int(eg, n as i64)?;
        let wrapped = add_op(eg, OpKind::Add, &none, vec![ids, nc], Some(loc))?;
        let ids = add_op(eg, OpKind::Where, &none, vec![neg, wrapped, ids], Some(loc))?;
        // The mask, shaped to broadcast against the result (trailing dims of 1).
        let mut mask_shape: Vec<i64> = it.static_shape()?.iter().map(|&d| d as i64).collect();
        mask_shape.extend(std::iter::repeat_n(1, dt.rank() - axis - 1));
        let fzero = add_op(
            eg,
            OpKind::Constant,
            &ConstantAttrs {
                value: Tensor::scalar_f64(dt.dtype, 0.0),
            }
            .to_attrs(),
            vec![],
            Some(loc),
        )?;
        let mut parts = vec![];
        for (i, (s, e)) in pieces(n, k).into_iter().enumerate() {
            let piece_loc = format!("{loc}/v{i}");
            let table = slice(eg, data, axis, s, e, loc)?;
            let local = if s == 0 {
                ids
            } else {
                let sc = int(eg, s as i64)?;
                add_op(eg, OpKind::Sub, &none, vec![ids, sc], Some(loc))?
            };
            let ge = add_op(
                eg,
                OpKind::GreaterEqual,
                &none,
                vec![local, zero],
                Some(loc),
            )?;
            let len = int(eg, (e - s) as i64)?;
            let lt = add_op(eg, OpKind::Less, &none, vec![local, len], Some(loc))?;
            let inside = add_op(eg, OpKind::And, &none, vec![ge, lt], Some(loc))?;
            let safe = add_op(
                eg,
                OpKind::Where,
                &none,
                vec![inside, local, zero],
                Some(loc),
            )?;
            let g = add_op(
                eg,
                OpKind::Gather,
                &attrs,
                vec![table, safe],
                Some(&piece_loc),
            )?;
            let shape = ShapeAttrs {
                shape: mask_shape.clone(),
            };
            let m = add_op(
                eg,
                OpKind::Reshape,
                &shape.to_attrs(),
                vec![inside],
                Some(loc),
            )?;
            let y = add_op(
                eg,
                OpKind::Where,
                &none,
                vec![m, g, fzero],
                Some(&piece_loc),
            )?;
            if ty(eg, y)? != out_ty {
                return None;
            }
            parts.push(y);
        }
        sum_node(eg, parts, Some(loc))
    }
}

impl Rule for SplitGather {
    fn name(&self) -> &'static str {
        "split-gather-v"
    }

    fn matches(&self, _: &PpEGraph, node: &PpNode) -> bool {
        is_op(node, OpKind::Gather)
    }

    fn apply(&self, eg: &mut PpEGraph, ctx: &RuleCtx, class: Id, node: &PpNode) -> Vec<Id> {
        let Some(k) = target(eg, ctx, class, Axis::V) else {
            return vec![];
        };
        let loc = eg[class].data.loc.clone().unwrap_or_default();
        let Some((id, root)) = Self::pieces(eg, node, k, &loc) else {
            return vec![];
        };
        let what = format!("gather along the table's rows (V) in {k} pieces");
        record(ctx, class, root, Axis::V, what, k);
        vec![id]
    }
}

/// The split rules.
pub fn split_rules() -> Vec<Arc<dyn Rule>> {
    let mut out: Vec<Arc<dyn Rule>> = vec![];
    for kind in [OpKind::MatMul, OpKind::Gemm] {
        for axis in [Axis::N, Axis::M, Axis::K] {
            out.push(Arc::new(SplitContraction { kind, axis }));
        }
    }
    out.push(Arc::new(SplitContraction {
        kind: OpKind::MatMul,
        axis: Axis::H,
    }));
    out.push(Arc::new(SplitGather));
    out
}

/// Every rule, split rules first.
pub fn all_rules() -> Vec<Arc<dyn Rule>> {
    let mut r = split_rules();
    r.push(Arc::new(DistributeElementwise));
    r.push(Arc::new(DistributeRowwise));
    r.push(Arc::new(SliceOfConcat));
    r.push(Arc::new(MatMulOfConcat));
    r.push(Arc::new(TransposeOfConcat));
    r.push(Arc::new(ReshapeOfConcat));
    r.push(Arc::new(SplitCrossEntropy));
    r
}

// ---- egg adaptors ----

/// Matches every class with a node the rule's [`Rule::matches`] accepts.
struct RuleSearcher(Arc<dyn Rule>);

impl Searcher<PpNode, PpAnalysis> for RuleSearcher {
    fn search_eclass_with_limit(
        &self,
        egraph: &PpEGraph,
        eclass: Id,
        limit: usize,
    ) -> Option<SearchMatches<'_, PpNode>> {
        if limit == 0
            || !egraph[eclass]
                .nodes
                .iter()
                .any(|n| self.0.matches(egraph, n))
        {
            return None;
        }
        Some(SearchMatches {
            eclass,
            substs: vec![Subst::default()],
            ast: None,
        })
    }

    fn vars(&self) -> Vec<Var> {
        vec![]
    }
}

/// Applies the rule to every matching node of the class.
struct RuleApplier(Arc<dyn Rule>, Arc<RuleCtx>);

impl egg::Applier<PpNode, PpAnalysis> for RuleApplier {
    fn apply_one(
        &self,
        egraph: &mut PpEGraph,
        eclass: Id,
        _subst: &Subst,
        _ast: Option<&egg::PatternAst<PpNode>>,
        _rule: Symbol,
    ) -> Vec<Id> {
        let nodes: Vec<PpNode> = egraph[eclass]
            .nodes
            .iter()
            .filter(|n| self.0.matches(egraph, n))
            .cloned()
            .collect();
        // egg leaves the union to the applier (as its pattern applier does).
        let mut out = vec![];
        for n in nodes {
            for id in self.0.apply(egraph, &self.1, eclass, &n) {
                if egraph.union(id, eclass) {
                    out.push(id);
                }
            }
        }
        out
    }
}

/// The rules as egg rewrites sharing `ctx`.
pub fn rewrites(
    rules: &[Arc<dyn Rule>],
    ctx: &Arc<RuleCtx>,
) -> Result<Vec<Rewrite<PpNode, PpAnalysis>>, String> {
    rules
        .iter()
        .map(|r| {
            Rewrite::new(
                r.name(),
                RuleSearcher(r.clone()),
                RuleApplier(r.clone(), ctx.clone()),
            )
        })
        .collect()
}
