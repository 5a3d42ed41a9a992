//! Rewriting with e-graphs (the `egg` crate): fine-grained op splitting.
//!
//! A function's ops enter an e-graph ([`egraph`]: the language is ppir's op table itself,
//! with an analysis that types every e-class by shape inference), the [`rules`] add
//! equivalent forms, and extraction builds the function back:
//!
//! 1. **split rules** give an op chosen for splitting (by its source location, e.g. the
//!    ONNX node name: `split=lm_head:4`) K independent pieces and the op that combines them
//!    (`concat` along a cut of the result, a sum along a cut of the contraction, or — for
//!    a `gather` cut along its table's rows, an embedding along the vocabulary — a sum of
//!    per-piece gathers that are zero outside their rows);
//! 2. **propagation rules** carry the pieces through what follows (elementwise ops, layer
//!    norms, softmaxes and reductions across other axes, slices of a concat, matmuls of a
//!    concat), so that later ops can work on the pieces too; `split-cross-entropy` turns a
//!    softmax cross-entropy of logits concatenated along the classes into per-piece
//!    log-sum-exps and label logits with an exact merge, so the LM head and its loss split
//!    together and no device needs the whole logits (the driver appends the loss to
//!    `@main` before rewriting so the rule sees it);
//! 3. **extraction** picks, in every e-class, the node of least cost (FLOPs plus bytes
//!    moved, by the cost model); the class of a split op is forced to its cheapest split
//!    variant with the requested number of pieces and axis (without an axis, a cut of the
//!    weight — N or K — before a cut of the rows, M, whose pieces all read the whole
//!    weight and so tie it to every device that runs one), and a merged cross-entropy is
//!    forced where its loss is extracted. Greedy extraction (per e-class, tree cost) comes
//!    first; then an exact one ([`ilp`]: least DAG cost, shared subterms counted once, on
//!    `microlp` with a time limit, the greedy choice as warm start) replaces it when it is
//!    cheaper. The report says which won.
//!
//! The result is verified and its returned types checked against the original's. Limits:
//! `matmul`, `gemm` and `gather` can be split; a batched matmul also along its heads
//! (`H`), and an attention is split along its heads by naming both of its matmuls
//! (`qk=2:h,av=2:h`: the pieces then flow through the mask and the softmax, and the heads
//! meet after the merge back to the model width), but the q/k/v projections stay whole
//! (their column pieces would need slices propagated backwards);
//! an M cut's pieces all read the whole weight (placed on different stages, each holds a
//! copy, and the copies' gradients are summed like any weight shared across stages, see
//! `split`); functions with
//! `send`/`recv` are refused (the rewriter runs on the forward function, before the
//! training program is built).

pub mod egraph;
pub mod ilp;
pub mod params;
pub mod rules;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use egg::{Id, Language, Runner, StopReason};
use ppir::{Function, Module};

use crate::{Pass, PassError, PassOptions};
use egraph::{from_egraph, node_cost, to_egraph, PpEGraph, PpNode};
use rules::{all_rules, rewrites, Axis, RuleCtx, SplitTarget, Targets};

/// What the rewriter does and within which limits.
#[derive(Clone, Debug)]
pub struct RewriteOptions {
    /// Ops to split.
    pub split: Vec<SplitTarget>,
    /// Saturation rounds at most.
    pub iter_limit: usize,
    /// E-nodes at most.
    pub node_limit: usize,
    /// Wall-clock time at most.
    pub time_limit: Duration,
    /// Time for the exact (ILP) extraction after the greedy one; zero: greedy only.
    pub ilp_time_limit: Duration,
    /// E-graphs with more e-nodes than this are extracted greedily only.
    pub ilp_node_limit: usize,
}

impl Default for RewriteOptions {
    fn default() -> Self {
        RewriteOptions {
            split: vec![],
            iter_limit: 16,
            node_limit: 50_000,
            time_limit: Duration::from_secs(5),
            ilp_time_limit: Duration::from_secs(1),
            ilp_node_limit: 4_000,
        }
    }
}

/// What a rewrite did.
#[derive(Clone, Debug, Default)]
pub struct RewriteReport {
    pub nodes: usize,
    pub classes: usize,
    pub iterations: usize,
    /// Why saturation stopped (`saturated`, `node limit`...).
    pub stop: String,
    pub seconds: f64,
    /// The splits applied: (source location, what).
    pub splits: Vec<(String, String)>,
    pub ops_before: usize,
    pub ops_after: usize,
    /// How the function was extracted: `greedy`, `ilp (optimal)`, `ilp (time limit)`,
    /// with the DAG costs compared.
    pub extraction: String,
}

impl std::fmt::Display for RewriteReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "rewrite: e-graph {} nodes in {} classes after {} iteration(s) ({}), {:.3} s; {} ops -> {}",
            self.nodes,
            self.classes,
            self.iterations,
            self.stop,
            self.seconds,
            self.ops_before,
            self.ops_after
        )?;
        if !self.extraction.is_empty() {
            write!(f, "; extraction: {}", self.extraction)?;
        }
        for (loc, what) in &self.splits {
            write!(f, "\n  split {loc}: {what}")?;
        }
        Ok(())
    }
}

/// Why a rewrite failed.
#[derive(Debug, thiserror::Error)]
pub enum RewriteError {
    #[error(transparent)]
    Convert(#[from] egraph::ConvertError),
    #[error("@{function}: no op is named `{loc}` and no matmul, gemm or gather is under `{loc}/` (ops are named by their ONNX node; such ops here: {examples})")]
    NoSuchOp {
        function: String,
        loc: String,
        examples: String,
    },
    #[error("@{function}: `{loc}` names several ops that could be split ({candidates}); give the whole name")]
    Ambiguous {
        function: String,
        loc: String,
        candidates: String,
    },
    #[error(
        "@{function}: `{loc}` is a {kind}; only pp.matmul, pp.gemm and pp.gather can be split"
    )]
    NotSplittable {
        function: String,
        loc: String,
        kind: String,
    },
    #[error("@{function}: `{loc}` cannot be split into {pieces} pieces (its dimensions are too small or not static)")]
    NoVariant {
        function: String,
        loc: String,
        pieces: usize,
    },
    #[error("@{function}: `{loc}` is a {kind}, which cannot be split along {axis} (matmul: m, n, k or h, the heads of a batched matmul; gemm: m, n or k; gather: v, the table's rows)")]
    WrongAxis {
        function: String,
        loc: String,
        kind: String,
        axis: String,
    },
    #[error("`{loc}`: a split needs at least 2 pieces, got {pieces}")]
    TooFewPieces { loc: String, pieces: usize },
    #[error("@{function}: the rewritten function does not verify: {message}")]
    Invalid { function: String, message: String },
    #[error("rule setup: {0}")]
    Rules(String),
}

/// A function's e-graph after saturation with `rules`, the variants the split rules
/// built, and why saturation stopped.
struct Saturated {
    conv: egraph::Converted,
    variants: Vec<rules::Variant>,
    /// Forms the propagation rules require (class, node, what).
    forced: Vec<(Id, PpNode, String)>,
    stop: String,
    iterations: usize,
}

fn saturate(
    f: &Function,
    targets: &[SplitTarget],
    rules: &[Arc<dyn rules::Rule>],
    opts: &RewriteOptions,
    iter_limit: usize,
) -> Result<Saturated, RewriteError> {
    let mut conv = to_egraph(f)?;
    let mut split = vec![];
    for t in targets {
        let class = conv
            .locs
            .get(&t.loc)
            .ok_or_else(|| RewriteError::NoSuchOp {
                function: f.name.clone(),
                loc: t.loc.clone(),
                examples: "(none)".into(),
            })?;
        split.push((t.clone(), *class));
    }
    let ctx = Arc::new(RuleCtx {
        targets: Targets { split },
        ..Default::default()
    });
    let rws = rewrites(rules, &ctx).map_err(RewriteError::Rules)?;
    let egraph = std::mem::replace(&mut conv.egraph, PpEGraph::new(Default::default()));
    let runner = Runner::default()
        .with_egraph(egraph)
        .with_iter_limit(iter_limit)
        .with_node_limit(opts.node_limit)
        .with_time_limit(opts.time_limit)
        .run(&rws);
    let stop = match &runner.stop_reason {
        Some(StopReason::Saturated) => "saturated".to_string(),
        Some(StopReason::IterationLimit(n)) => format!("iteration limit {n}"),
        Some(StopReason::NodeLimit(n)) => format!("node limit {n}"),
        Some(StopReason::TimeLimit(t)) => format!("time limit {t:.1} s"),
        Some(StopReason::Other(s)) => s.clone(),
        None => "not run".to_string(),
    };
    let iterations = runner.iterations.len();
    conv.egraph = runner.egraph;
    let eg = &conv.egraph;
    conv.roots = conv.roots.iter().map(|&r| eg.find(r)).collect();
    conv.names = conv.names.drain().map(|(id, n)| (eg.find(id), n)).collect();
    conv.locs = conv.locs.drain().map(|(l, id)| (l, eg.find(id))).collect();
    let variants = ctx
        .variants
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let forced = ctx.forced.lock().unwrap_or_else(|e| e.into_inner()).clone();
    Ok(Saturated {
        conv,
        variants,
        forced,
        stop,
        iterations,
    })
}

/// For each target, the variant to use: of the op's own e-class, with the requested
/// number of pieces and axis; without an axis, a cut of the weight (N, K) before a cut of
/// the rows (M: every piece reads the whole weight, which ties it to every device running
/// one), then the least cost.
fn choose_variants<'v>(
    f: &Function,
    sat: &'v Saturated,
    targets: &[SplitTarget],
) -> Result<Vec<&'v rules::Variant>, RewriteError> {
    let eg = &sat.conv.egraph;
    let base = extract(eg, &HashMap::new());
    let mut out = vec![];
    for t in targets {
        let Some(&class) = sat.conv.locs.get(&t.loc) else {
            continue;
        };
        let class = eg.find(class);
        let mut best: Option<(f64, &rules::Variant)> = None;
        // A heads cut is taken only when asked for: on an unbatched product it cuts the
        // batch, whose pieces all read the whole weight (as an M cut's do).
        for v in sat.variants.iter().filter(|v| {
            v.pieces == t.pieces
                && t.axis.map_or(v.axis != Axis::H, |a| a == v.axis)
                && eg.find(v.class) == class
        }) {
            let root = v.root.clone().map_children(|c| eg.find(c));
            let cost = node_cost(eg, &root)
                + root
                    .children()
                    .iter()
                    .map(|c| base.get(c).map_or(f64::INFINITY, |b| b.0))
                    .sum::<f64>();
            let rank = |v: &rules::Variant| u8::from(v.axis == Axis::M);
            let better = best
                .as_ref()
                .is_none_or(|b| (rank(v), cost) < (rank(b.1), b.0));
            if cost.is_finite() && better {
                best = Some((cost, v));
            }
        }
        let Some((_, v)) = best else {
            return Err(RewriteError::NoVariant {
                function: f.name.clone(),
                loc: t.loc.clone(),
                pieces: t.pieces,
            });
        };
        out.push(v);
    }
    Ok(out)
}

/// Rewrite `f` (see the module documentation); returns the new function and a report.
///
/// Two rounds: the split rules alone first, to choose each target's axis (when none is
/// given); then every rule with the axes fixed, so that no form of a split op other than
/// the chosen one is in the e-graph for the extractor to take.
pub fn rewrite_function(
    module: &Module,
    f: &Function,
    opts: &RewriteOptions,
) -> Result<(Function, RewriteReport), RewriteError> {
    let start = Instant::now();
    let mut targets = resolve_targets(f, opts)?;
    if targets.iter().any(|t| t.axis.is_none()) {
        let sat = saturate(f, &targets, &rules::split_rules(), opts, 2)?;
        let chosen: Vec<Axis> = choose_variants(f, &sat, &targets)?
            .iter()
            .map(|v| v.axis)
            .collect();
        for (t, a) in targets.iter_mut().zip(chosen) {
            t.axis = Some(a);
        }
    }
    let sat = saturate(f, &targets, &all_rules(), opts, opts.iter_limit)?;
    let chosen = choose_variants(f, &sat, &targets)?;
    let eg = &sat.conv.egraph;
    let mut forced: HashMap<Id, PpNode> = HashMap::new();
    let mut splits = vec![];
    for (t, v) in targets.iter().zip(&chosen) {
        forced.insert(
            eg.find(v.class),
            v.root.clone().map_children(|c| eg.find(c)),
        );
        splits.push((t.loc.clone(), v.what.clone()));
    }
    for (class, node, what) in &sat.forced {
        let class = eg.find(*class);
        if forced.contains_key(&class) {
            continue;
        }
        let loc = eg[class].data.loc.clone().unwrap_or_default();
        forced.insert(class, node.clone().map_children(|c| eg.find(c)));
        splits.push((loc, what.clone()));
    }
    let conv = &sat.conv;
    let (stop, iterations) = (sat.stop.clone(), sat.iterations);
    let best = extract(eg, &forced);
    let greedy: HashMap<Id, PpNode> = best.iter().map(|(&id, (_, n))| (id, n.clone())).collect();
    let greedy_cost = ilp::dag_cost(eg, &conv.roots, &|c| greedy.get(&eg.find(c)).cloned());
    let mut chosen = greedy;
    let extraction =
        if opts.ilp_time_limit.is_zero() || eg.total_number_of_nodes() > opts.ilp_node_limit {
            format!("greedy, cost {greedy_cost:.3e}")
        } else {
            match ilp::extract(eg, &conv.roots, &forced, &chosen, opts.ilp_time_limit) {
                Some(c) if c.cost < greedy_cost * (1.0 - 1e-9) => {
                    let how = if c.optimal { "optimal" } else { "time limit" };
                    let s = format!(
                        "ilp ({how}), cost {:.3e} (greedy {greedy_cost:.3e})",
                        c.cost
                    );
                    chosen = c.nodes;
                    s
                }
                Some(c) => format!(
                    "greedy, cost {greedy_cost:.3e} (ilp {}: {:.3e})",
                    if c.optimal { "optimal" } else { "time limit" },
                    c.cost
                ),
                None => format!("greedy, cost {greedy_cost:.3e} (ilp found nothing in time)"),
            }
        };
    let mut out = Function::new(f.name.clone());
    out.attrs = f.attrs.clone();
    for (v, kind) in f.args() {
        out.add_arg(f.value(*v).name.clone(), f.ty(*v).clone(), *kind);
    }
    let results = from_egraph(conv, &mut out, &|id| chosen.get(&id).cloned())?;
    out.set_results(results);
    let mut check = module.clone();
    if let Some(slot) = check.functions.iter_mut().find(|g| g.name == f.name) {
        *slot = out.clone();
    }
    let invalid = |message: String| RewriteError::Invalid {
        function: f.name.clone(),
        message,
    };
    ppir::verify::verify_function(&check, &out).map_err(|errs| {
        invalid(
            errs.iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("; "),
        )
    })?;
    if out.result_types() != f.result_types() {
        return Err(invalid("the result types changed".into()));
    }
    let report = RewriteReport {
        nodes: eg.total_number_of_nodes(),
        classes: eg.number_of_classes(),
        iterations,
        stop,
        seconds: start.elapsed().as_secs_f64(),
        splits,
        ops_before: f.ops().len(),
        ops_after: out.ops().len(),
        extraction,
    };
    Ok((out, report))
}

/// Resolve the targets to op locations: a target names an op by its location (the ONNX
/// node name) or, when no op has exactly that location, by the prefix of the one
/// splittable op under it (`lm_head` for `lm_head/MatMul`). Each must be a matmul, gemm
/// or gather (which splits along its table's rows only).
fn resolve_targets(f: &Function, opts: &RewriteOptions) -> Result<Vec<SplitTarget>, RewriteError> {
    let splittable = |o: ppir::OpId| {
        matches!(
            f.op(o).kind,
            ppir::OpKind::MatMul | ppir::OpKind::Gemm | ppir::OpKind::Gather
        )
    };
    let mut out = vec![];
    for t in &opts.split {
        let (loc, k) = (&t.loc, t.pieces);
        if k < 2 {
            return Err(RewriteError::TooFewPieces {
                loc: loc.clone(),
                pieces: k,
            });
        }
        let exact = f
            .ops()
            .iter()
            .copied()
            .find(|&o| f.op(o).loc.as_deref() == Some(loc.as_str()));
        let op = match exact {
            Some(op) => op,
            None => {
                let prefix = format!("{loc}/");
                let under: Vec<ppir::OpId> = f
                    .ops()
                    .iter()
                    .copied()
                    .filter(|&o| {
                        splittable(o)
                            && f.op(o)
                                .loc
                                .as_deref()
                                .is_some_and(|l| l.starts_with(&prefix))
                    })
                    .collect();
                match under.as_slice() {
                    [op] => *op,
                    [] => {
                        let examples: Vec<String> = f
                            .ops()
                            .iter()
                            .filter(|&&o| splittable(o))
                            .filter_map(|&o| f.op(o).loc.clone())
                            .take(4)
                            .map(|l| format!("`{l}`"))
                            .collect();
                        return Err(RewriteError::NoSuchOp {
                            function: f.name.clone(),
                            loc: loc.clone(),
                            examples: if examples.is_empty() {
                                "none has a location".into()
                            } else {
                                examples.join(", ")
                            },
                        });
                    }
                    many => {
                        return Err(RewriteError::Ambiguous {
                            function: f.name.clone(),
                            loc: loc.clone(),
                            candidates: many
                                .iter()
                                .filter_map(|&o| f.op(o).loc.clone())
                                .map(|l| format!("`{l}`"))
                                .collect::<Vec<_>>()
                                .join(", "),
                        })
                    }
                }
            }
        };
        if !splittable(op) {
            return Err(RewriteError::NotSplittable {
                function: f.name.clone(),
                loc: loc.clone(),
                kind: f.op(op).kind.to_string(),
            });
        }
        let gather = f.op(op).kind == ppir::OpKind::Gather;
        let axis = match (gather, t.axis) {
            (true, None | Some(Axis::V)) => Some(Axis::V),
            (false, Some(Axis::V)) | (true, Some(_)) => {
                return Err(RewriteError::WrongAxis {
                    function: f.name.clone(),
                    loc: loc.clone(),
                    kind: f.op(op).kind.to_string(),
                    axis: t.axis.map_or("", |a| a.name()).to_string(),
                })
            }
            (false, Some(Axis::H)) if f.op(op).kind == ppir::OpKind::Gemm => {
                return Err(RewriteError::WrongAxis {
                    function: f.name.clone(),
                    loc: loc.clone(),
                    kind: f.op(op).kind.to_string(),
                    axis: t.axis.map_or("", |a| a.name()).to_string(),
                })
            }
            (false, a) => a,
        };
        out.push(SplitTarget {
            loc: f.op(op).loc.clone().unwrap_or_default(),
            pieces: k,
            axis,
        });
    }
    Ok(out)
}

/// Least-cost node of every e-class (a fixed point over the classes; a class whose nodes
/// all depend on itself gets none). Classes in `forced` may only use the given node.
fn extract(eg: &PpEGraph, forced: &HashMap<Id, PpNode>) -> HashMap<Id, (f64, PpNode)> {
    let mut best: HashMap<Id, (f64, PpNode)> = HashMap::new();
    let node_costs: HashMap<(Id, usize), f64> = eg
        .classes()
        .flat_map(|c| {
            c.nodes
                .iter()
                .enumerate()
                .map(move |(i, n)| ((c.id, i), node_cost(eg, n)))
        })
        .collect();
    loop {
        let mut changed = false;
        for class in eg.classes() {
            if class.data.invalid.is_some() {
                continue;
            }
            for (i, node) in class.nodes.iter().enumerate() {
                if let Some(want) = forced.get(&class.id) {
                    if node != want {
                        continue;
                    }
                }
                let mut cost = node_costs[&(class.id, i)];
                for c in node.children() {
                    match best.get(&eg.find(*c)) {
                        Some(b) => cost += b.0,
                        None => cost = f64::INFINITY,
                    }
                }
                if !cost.is_finite() {
                    continue;
                }
                let better = best.get(&class.id).is_none_or(|b| cost < b.0);
                if better {
                    best.insert(class.id, (cost, node.clone()));
                    changed = true;
                }
            }
        }
        if !changed {
            break;
        }
    }
    best
}

/// The `rewrite` pass: `rewrite{split=LOC:K;LOC:K,function=main,iter-limit=N,
/// node-limit=N,time-limit-ms=N,ilp-time-limit-ms=N,report=1}` (`ilp-time-limit-ms=0`:
/// greedy extraction only).
pub struct RewritePass {
    pub function: String,
    pub options: RewriteOptions,
    pub report: bool,
}

impl RewritePass {
    pub fn from_options(o: &PassOptions) -> Result<Self, PassError> {
        const NAME: &str = "rewrite";
        o.expect_only(
            NAME,
            &[
                "split",
                "function",
                "iter-limit",
                "node-limit",
                "time-limit-ms",
                "ilp-time-limit-ms",
                "report",
            ],
        )?;
        let mut options = RewriteOptions::default();
        if let Some(s) = o.get("split") {
            options.split = parse_split_list(s).map_err(PassError::Usage)?;
        }
        if let Some(n) = o.u64(NAME, "iter-limit")? {
            options.iter_limit = n as usize;
        }
        if let Some(n) = o.u64(NAME, "node-limit")? {
            options.node_limit = n as usize;
        }
        if let Some(n) = o.u64(NAME, "time-limit-ms")? {
            options.time_limit = Duration::from_millis(n);
        }
        if let Some(n) = o.u64(NAME, "ilp-time-limit-ms")? {
            options.ilp_time_limit = Duration::from_millis(n);
        }
        Ok(RewritePass {
            function: o.get("function").unwrap_or("main").to_string(),
            options,
            report: o.u64(NAME, "report")?.unwrap_or(0) != 0,
        })
    }
}

/// `NODE:K[:AXIS];...` (or `NODE=K[:AXIS]`, the CLI's spelling; AXIS is m, n or k) into
/// split targets.
pub fn parse_split_list(s: &str) -> Result<Vec<SplitTarget>, String> {
    let mut out = vec![];
    for item in s.split(';').map(str::trim).filter(|i| !i.is_empty()) {
        let bad = || {
            format!("split target `{item}` is not NODE=K or NODE=K:AXIS (K pieces; AXIS m, n or k for a matmul or gemm, h for a batched matmul's heads, v for a gather; `:` may stand for `=`)")
        };
        let (head, last) = item.rsplit_once([':', '=']).ok_or_else(bad)?;
        let (loc, k, axis) = match Axis::from_name(last) {
            Some(a) => {
                let (loc, k) = head.rsplit_once([':', '=']).ok_or_else(bad)?;
                (loc, k, Some(a))
            }
            None => (head, last, None),
        };
        let pieces: usize = k
            .parse()
            .map_err(|_| format!("split target `{item}`: `{k}` is not a number of pieces"))?;
        out.push(SplitTarget {
            loc: loc.to_string(),
            pieces,
            axis,
        });
    }
    Ok(out)
}

impl Pass for RewritePass {
    fn name(&self) -> &'static str {
        "rewrite"
    }

    fn run(&self, module: &mut Module) -> Result<(), PassError> {
        let f = module.function(&self.function).ok_or_else(|| {
            PassError::failed("rewrite", format!("no function @{}", self.function))
        })?;
        let (out, report) = rewrite_function(module, f, &self.options)
            .map_err(|e| PassError::failed("rewrite", e.to_string()))?;
        if self.report {
            eprintln!("{report}");
        }
        if let Some(slot) = module.function_mut(&self.function) {
            *slot = out;
        }
        Ok(())
    }
}
