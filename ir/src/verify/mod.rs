//! The verifier: checks that a [`Module`] is well formed, and reports every problem it finds
//! with the function, the op (its kind and first result, or its position in the body), the
//! op's source location and what is wrong:
//!
//! ```text
//! @main: %3 = "pp.matmul" (loc "fc1/MatMul"): inner dimensions differ: 784 vs 512
//! ```
//!
//! Checked: operand and result counts, type sizes ([`crate::size`]), attribute kinds ([`crate::OpKind::attr_spec`]), declared
//! result types against [`crate::shape::infer`], SSA order (operands and returned values
//! defined earlier, never by a removed op), unique value and function names, weights
//! against `param`/`state` arguments, and `send`/`recv` pairing across the module. It never
//! panics on a module built through the public API, however broken. Errors come in module
//! order: by function, then arguments, body position, and the return.

mod comm;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fmt;

use crate::module::{ArgKind, Function, Module, OpId, ValueDef, ValueId};
use crate::ops::attrs::{CommAttrs, SplitAttrs};
use crate::ops::{OpAttrs, OpKind};
use crate::shape;
use crate::types::Dim;

pub use crate::ops::{check_attrs, AttrIssue, AttrKind, AttrSpec};

/// What kind of problem a [`VerifyError`] reports; one message shape per kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum VerifyErrorKind {
    /// The body lists an op id that does not exist, a removed op, or an op twice.
    Layout,
    /// Wrong number of operands for the op kind.
    OperandCount,
    /// Wrong number of results for the op kind (split: one per size; send: none).
    ResultCount,
    /// An attribute holds the wrong kind of value (also the function attribute `stage`).
    AttributeKind,
    /// A required attribute is absent.
    MissingAttribute,
    /// Shape inference rejects the operands or attributes.
    Shape,
    /// A declared result type disagrees with the inferred one.
    ResultType,
    /// An argument or result type whose element count or byte size overflows
    /// ([`crate::size`]).
    TooLarge,
    /// An operand or returned value is defined later in the body (or by the op itself).
    UseBeforeDef,
    /// An operand or returned value is a result of a removed op.
    RemovedValue,
    /// An operand or returned value is defined by an op that is not in the body.
    UndefinedValue,
    /// Two values of a function share a name.
    DuplicateValueName,
    /// A value has an empty name.
    EmptyValueName,
    /// Two functions share a name.
    DuplicateFunction,
    /// A `param`/`state` argument's type has the batch dimension `?`.
    SymbolicWeight,
    /// A `param`/`state` argument's type differs from the module weight of that name.
    WeightType,
    /// Two functions declare the same weight with different types.
    WeightConflict,
    /// A send/recv has neither an op stage nor a function `stage` attribute.
    MissingStage,
    /// A stage number (`peer`, or the function `stage`) is negative.
    InvalidStage,
    /// A send/recv whose peer is its own stage.
    SelfComm,
    /// A send that no recv receives.
    UnmatchedSend,
    /// A recv that no send feeds.
    UnmatchedRecv,
    /// A second send for the same (from, to, channel).
    DuplicateSend,
    /// A second recv for the same (from, to, channel).
    DuplicateRecv,
    /// A recv's result type differs from its send's operand type.
    CommTypeMismatch,
    /// An `all_reduce` whose stage is not among its `stages`, or that disagrees (stages,
    /// replicas, type) with another `all_reduce` of its channel.
    CollectiveMismatch,
    /// A stage listed by an `all_reduce` (and present in the module) runs no `all_reduce`
    /// on that channel, or runs two.
    UnmatchedCollective,
}

/// One verifier finding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifyError {
    pub kind: VerifyErrorKind,
    /// The function, if the problem is inside one.
    pub function: Option<String>,
    /// The op: `%3 = "pp.matmul"`, or `op #4 "pp.send"` when it has no result.
    pub op: Option<String>,
    /// The op's source location.
    pub loc: Option<String>,
    pub message: String,
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(func) = &self.function {
            write!(f, "@{func}: ")?;
        }
        if let Some(op) = &self.op {
            write!(f, "{op}{}: ", shape::loc_suffix(self.loc.as_deref()))?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for VerifyError {}

/// `%3 = "pp.matmul"` for an op with results (its first result names it), `op #4 "pp.send"`
/// (its position in the body) for one without.
pub fn describe_op(f: &Function, op: OpId) -> String {
    let data = f.op(op);
    match data.results().first() {
        Some(&v) => format!("%{} = \"{}\"", f.value(v).name, data.kind),
        None => {
            let pos = f.ops().iter().position(|&o| o == op).unwrap_or(op.index());
            format!("op #{pos} \"{}\"", data.kind)
        }
    }
}

/// Check the whole module: every function, function names, weights shared between
/// functions, and send/recv pairing across functions.
pub fn verify_module(m: &Module) -> Result<(), Vec<VerifyError>> {
    let mut sink = Sink::default();
    let mut first_def: HashMap<&str, usize> = HashMap::new();
    for (fi, f) in m.functions.iter().enumerate() {
        if let Some(&first) = first_def.get(f.name.as_str()) {
            sink.function(
                fi,
                f,
                VerifyErrorKind::DuplicateFunction,
                format!(
                    "function @{} is already defined (function {first} of the module)",
                    f.name
                ),
            );
        } else {
            first_def.insert(&f.name, fi);
        }
    }
    let mut endpoints = vec![];
    for (fi, f) in m.functions.iter().enumerate() {
        FnCheck::new(m, f, fi, &mut sink).run(&mut endpoints);
    }
    weight_agreement(m, &mut sink);
    comm::pair(m, &endpoints, &mut sink);
    comm::reductions(m, &endpoints, &mut sink);
    comm::shards(m, &endpoints, &mut sink);
    sink.finish()
}

/// Check one function: everything [`verify_module`] checks that does not involve other
/// functions (so neither function-name clashes, weights shared between functions, nor
/// send/recv pairing). `f` need not belong to `m`; `m` provides the weights.
pub fn verify_function(m: &Module, f: &Function) -> Result<(), Vec<VerifyError>> {
    let mut sink = Sink::default();
    FnCheck::new(m, f, 0, &mut sink).run(&mut vec![]);
    sink.finish()
}

// ---- collecting errors in module order ----

/// (function index, section: 0 function, 1 arguments, 2 body, 3 return; position).
type SortKey = (usize, u8, usize);

#[derive(Default)]
struct Sink {
    errors: Vec<(SortKey, VerifyError)>,
}

impl Sink {
    fn push(&mut self, key: SortKey, error: VerifyError) {
        self.errors.push((key, error));
    }

    /// An error about function `f` as a whole.
    fn function(&mut self, fi: usize, f: &Function, kind: VerifyErrorKind, message: String) {
        self.at(fi, 0, 0, f, kind, message);
    }

    fn at(
        &mut self,
        fi: usize,
        section: u8,
        pos: usize,
        f: &Function,
        kind: VerifyErrorKind,
        message: String,
    ) {
        let error = VerifyError {
            kind,
            function: Some(f.name.clone()),
            op: None,
            loc: None,
            message,
        };
        self.push((fi, section, pos), error);
    }

    /// An error about op `op` at body position `pos` of function `f`.
    fn op(
        &mut self,
        fi: usize,
        pos: usize,
        f: &Function,
        op: OpId,
        kind: VerifyErrorKind,
        message: String,
    ) {
        let error = VerifyError {
            kind,
            function: Some(f.name.clone()),
            op: Some(describe_op(f, op)),
            loc: f.op(op).loc.clone(),
            message,
        };
        self.push((fi, 2, pos), error);
    }

    fn finish(mut self) -> Result<(), Vec<VerifyError>> {
        if self.errors.is_empty() {
            return Ok(());
        }
        self.errors.sort_by_key(|(k, _)| *k); // stable: same place keeps check order
        Err(self.errors.into_iter().map(|(_, e)| e).collect())
    }
}

/// A send or recv with a resolved stage, for pairing.
struct Endpoint {
    fi: usize,
    pos: usize,
    op: OpId,
    is_send: bool,
    /// Sending stage.
    from: i64,
    /// Receiving stage.
    to: i64,
    channel: i64,
    /// The send's operand type or the recv's result type.
    ty: Option<crate::types::TensorType>,
    /// An `all_reduce` (`from` = `to` = its stage): its `stages` and `replicas`.
    collective: Option<(Vec<i64>, bool)>,
}

// ---- one function ----

struct FnCheck<'a> {
    m: &'a Module,
    f: &'a Function,
    fi: usize,
    sink: &'a mut Sink,
    /// Body position of each op slot (first occurrence), if it is a live op in the body.
    pos_of: Vec<Option<usize>>,
    /// Whether each value is defined at the current point of the walk.
    defined: Vec<bool>,
    /// First definition of each value name, described for messages.
    names: HashMap<&'a str, String>,
}

impl<'a> FnCheck<'a> {
    fn new(m: &'a Module, f: &'a Function, fi: usize, sink: &'a mut Sink) -> Self {
        FnCheck {
            m,
            f,
            fi,
            sink,
            pos_of: vec![None; f.num_op_slots()],
            defined: vec![false; f.num_values()],
            names: HashMap::new(),
        }
    }

    fn run(mut self, endpoints: &mut Vec<Endpoint>) {
        let fn_stage = self.function_stage();
        self.args();
        let body = self.layout();
        for (pos, op) in body {
            self.op(pos, op, fn_stage, endpoints);
        }
        self.returns();
    }

    /// The function's `stage` attribute, if present and valid.
    fn function_stage(&mut self) -> Option<i64> {
        let f = self.f;
        match f.attrs.int("stage") {
            Ok(Some(s)) if s >= 0 => Some(s),
            Ok(Some(s)) => {
                let msg =
                    format!("function attribute 'stage' must be a stage number >= 0, found {s}");
                self.sink
                    .function(self.fi, f, VerifyErrorKind::InvalidStage, msg);
                None
            }
            Ok(None) => None,
            Err(e) => {
                self.sink.function(
                    self.fi,
                    f,
                    VerifyErrorKind::AttributeKind,
                    format!("function {e}"),
                );
                None
            }
        }
    }

    /// Record a value's name; report an empty or repeated one.
    fn name(&mut self, v: ValueId, what: String, report: &mut Vec<(VerifyErrorKind, String)>) {
        let f = self.f;
        let name = f.value(v).name.as_str();
        if name.is_empty() {
            report.push((
                VerifyErrorKind::EmptyValueName,
                format!("{what} has an empty name"),
            ));
        } else if let Some(first) = self.names.get(name) {
            report.push((
                VerifyErrorKind::DuplicateValueName,
                format!("value %{name} is already defined by {first}"),
            ));
        } else {
            self.names.insert(name, what);
        }
    }

    fn args(&mut self) {
        let f = self.f;
        for (ai, &(v, kind)) in f.args().iter().enumerate() {
            self.defined[v.index()] = true;
            let mut report = vec![];
            self.name(v, format!("argument {ai}"), &mut report);
            let ty = f.ty(v);
            let name = &f.value(v).name;
            if let Err(e) = ty.check_size() {
                report.push((VerifyErrorKind::TooLarge, format!("argument %{name}: {e}")));
            }
            if kind != ArgKind::Input {
                let k = kind.name();
                if ty.dims.contains(&Dim::Batch) {
                    report.push((
                        VerifyErrorKind::SymbolicWeight,
                        format!("{k} %{name} has type {ty}; weights cannot have the batch dimension `?`"),
                    ));
                } else if let Some(w) = self.m.weights.get(name) {
                    let wt = w.tensor_type();
                    if &wt != ty {
                        report.push((
                            VerifyErrorKind::WeightType,
                            format!("{k} %{name} has type {ty} but the module weight \"{name}\" is {wt}"),
                        ));
                    }
                }
            }
            for (kind, msg) in report {
                self.sink.at(self.fi, 1, ai, f, kind, msg);
            }
        }
    }

    /// Check the body list; returns the live ops with their positions.
    fn layout(&mut self) -> Vec<(usize, OpId)> {
        let f = self.f;
        let mut body = vec![];
        for (pos, &op) in f.ops().iter().enumerate() {
            let msg = if op.index() >= f.num_op_slots() {
                format!(
                    "body entry #{pos} refers to op {}, which does not exist",
                    op.index()
                )
            } else if f.op(op).is_removed() {
                format!("body entry #{pos} is a removed {} op", f.op(op).kind)
            } else if let Some(first) = self.pos_of[op.index()] {
                format!("body entry #{pos} repeats the op at entry #{first}")
            } else {
                self.pos_of[op.index()] = Some(pos);
                body.push((pos, op));
                continue;
            };
            self.sink
                .at(self.fi, 2, pos, f, VerifyErrorKind::Layout, msg);
        }
        body
    }

    /// Why `v` (used at body position `pos`) is not available, if it is not.
    fn undefined(&self, v: ValueId, pos: usize) -> Option<(VerifyErrorKind, &'static str)> {
        if self.defined[v.index()] {
            return None;
        }
        Some(match self.f.value(v).def {
            ValueDef::Op(p, _) if self.f.op(p).is_removed() => {
                (VerifyErrorKind::RemovedValue, "is a result of a removed op")
            }
            ValueDef::Op(p, _) if self.pos_of[p.index()].is_some_and(|d| d >= pos) => (
                VerifyErrorKind::UseBeforeDef,
                "is used before its definition",
            ),
            _ => (
                VerifyErrorKind::UndefinedValue,
                "is defined by an op that is not in the body",
            ),
        })
    }

    fn op(&mut self, pos: usize, op: OpId, fn_stage: Option<i64>, endpoints: &mut Vec<Endpoint>) {
        let (f, fi) = (self.f, self.fi);
        let data = f.op(op);
        let mut report: Vec<(VerifyErrorKind, String)> = vec![];

        // SSA: operands defined earlier.
        for (i, &v) in data.operands().iter().enumerate() {
            if let Some((kind, why)) = self.undefined(v, pos) {
                report.push((kind, format!("operand {i} (%{}) {why}", f.value(v).name)));
            }
        }

        // Counts.
        let n_operands = data.operands().len();
        let arity_ok = data.kind.arity().accepts(n_operands);
        if !arity_ok {
            report.push((
                VerifyErrorKind::OperandCount,
                shape::arity_message(data.kind.arity(), n_operands),
            ));
        }
        let n_results = data.results().len();
        let expected_results = match data.kind {
            OpKind::Send => Some(0),
            OpKind::Split => SplitAttrs::of(&data.attrs).ok().map(|a| a.split.len()),
            _ => Some(1),
        };
        let results_ok = expected_results.is_none_or(|e| e == n_results);
        if let Some(e) = expected_results.filter(|&e| e != n_results) {
            let msg = match data.kind {
                OpKind::Send => format!("send has no results, found {n_results}"),
                OpKind::Split => {
                    format!("expects {e} results (one per 'split' entry), found {n_results}")
                }
                _ => format!("expects 1 result, found {n_results}"),
            };
            report.push((VerifyErrorKind::ResultCount, msg));
        }

        // Attributes.
        let issues = check_attrs(data.kind.attr_spec(), &data.attrs);
        for issue in &issues {
            let kind = match issue {
                AttrIssue::WrongKind(_) => VerifyErrorKind::AttributeKind,
                AttrIssue::Missing(_) => VerifyErrorKind::MissingAttribute,
            };
            report.push((kind, issue.to_string()));
        }

        // Types, when the op is well-formed enough to infer them.
        if arity_ok && issues.is_empty() && data.kind != OpKind::Recv {
            let operand_types: Vec<_> = data.operands().iter().map(|&v| f.ty(v).clone()).collect();
            match shape::infer(data.kind, &data.attrs, &operand_types) {
                Err(e) => report.push((VerifyErrorKind::Shape, e.0)),
                Ok(types) if results_ok && types.len() == n_results => {
                    for (i, (&v, inferred)) in data.results().iter().zip(&types).enumerate() {
                        let declared = f.ty(v);
                        if !declared.compatible(inferred) {
                            let name = &f.value(v).name;
                            report.push((
                                VerifyErrorKind::ResultType,
                                format!("result {i} (%{name}) is declared {declared} but inferred {inferred}"),
                            ));
                        }
                    }
                }
                Ok(_) => {}
            }
        }

        // Declared result types are representable (a recv's is not inferred).
        for (i, &v) in data.results().iter().enumerate() {
            if let Err(e) = f.ty(v).check_size() {
                let name = &f.value(v).name;
                report.push((
                    VerifyErrorKind::TooLarge,
                    format!("result {i} (%{name}): {e}"),
                ));
            }
        }

        // Results become defined; names are unique.
        for &v in data.results() {
            self.defined[v.index()] = true;
            self.name(v, format!("op #{pos} \"{}\"", data.kind), &mut report);
        }

        if matches!(data.kind, OpKind::Send | OpKind::Recv) {
            if let Some(e) = self.endpoint(pos, op, fn_stage, &mut report) {
                endpoints.push(e);
            }
        }
        if data.kind == OpKind::AllReduce {
            if let Some(e) = self.reduction(pos, op, fn_stage, &mut report) {
                endpoints.push(e);
            }
        }

        for (kind, msg) in report {
            self.sink.op(fi, pos, f, op, kind, msg);
        }
    }

    /// Resolve an all_reduce's stage; report a stage that is not among its participants.
    fn reduction(
        &self,
        pos: usize,
        op: OpId,
        fn_stage: Option<i64>,
        report: &mut Vec<(VerifyErrorKind, String)>,
    ) -> Option<Endpoint> {
        let data = self.f.op(op);
        let a = crate::ops::attrs::AllReduceAttrs::of(&data.attrs).ok()?;
        let Some(stage) = data.stage.map(i64::from).or(fn_stage) else {
            report.push((
                VerifyErrorKind::MissingStage,
                "all_reduce needs a stage: set the op's stage or the function attribute 'stage'"
                    .into(),
            ));
            return None;
        };
        if !a.stages.contains(&stage) {
            report.push((
                VerifyErrorKind::CollectiveMismatch,
                format!(
                    "all_reduce on stage {stage} lists stages {:?}, which do not include its own",
                    a.stages
                ),
            ));
            return None;
        }
        Some(Endpoint {
            fi: self.fi,
            pos,
            op,
            is_send: false,
            from: stage,
            to: stage,
            channel: a.channel,
            ty: data.operands().first().map(|&v| self.f.ty(v).clone()),
            collective: Some((a.stages, a.replicas)),
        })
    }

    /// Resolve a send/recv's stages; report what prevents pairing it.
    fn endpoint(
        &self,
        pos: usize,
        op: OpId,
        fn_stage: Option<i64>,
        report: &mut Vec<(VerifyErrorKind, String)>,
    ) -> Option<Endpoint> {
        let data = self.f.op(op);
        let is_send = data.kind == OpKind::Send;
        let what = if is_send { "send" } else { "recv" };
        // Missing or mistyped peer/channel are already reported as attribute errors.
        let CommAttrs { peer, channel } = CommAttrs::of(&data.attrs).ok()?;
        if peer < 0 {
            report.push((
                VerifyErrorKind::InvalidStage,
                format!("'peer' must be a stage number >= 0, found {peer}"),
            ));
            return None;
        }
        let Some(stage) = data.stage.map(i64::from).or(fn_stage) else {
            report.push((
                VerifyErrorKind::MissingStage,
                format!(
                    "{what} needs a stage: set the op's stage or the function attribute 'stage'"
                ),
            ));
            return None;
        };
        if stage == peer {
            let msg = if is_send {
                format!("send to its own stage {stage}")
            } else {
                format!("recv from its own stage {stage}")
            };
            report.push((VerifyErrorKind::SelfComm, msg));
            return None;
        }
        let (from, to) = if is_send {
            (stage, peer)
        } else {
            (peer, stage)
        };
        let v = if is_send {
            data.operands().first()
        } else {
            data.results().first()
        };
        Some(Endpoint {
            fi: self.fi,
            pos,
            op,
            is_send,
            from,
            to,
            channel,
            ty: v.map(|&v| self.f.ty(v).clone()),
            collective: None,
        })
    }

    fn returns(&mut self) {
        let f = self.f;
        let end = usize::MAX;
        for (i, &v) in f.results().iter().enumerate() {
            if let Some((kind, why)) = self.undefined(v, end) {
                let msg = format!("returned value {i} (%{}) {why}", f.value(v).name);
                self.sink.at(self.fi, 3, i, f, kind, msg);
            }
        }
    }
}

/// Functions that declare the same weight (by argument name) must agree on its type. Only
/// checked for names without a module weight: those are compared with the weight itself.
fn weight_agreement(m: &Module, sink: &mut Sink) {
    let mut seen: HashMap<&str, (&str, &crate::types::TensorType)> = HashMap::new();
    for (fi, f) in m.functions.iter().enumerate() {
        for (ai, &(v, kind)) in f.args().iter().enumerate() {
            let name = f.value(v).name.as_str();
            if kind == ArgKind::Input || m.weights.contains_key(name) {
                continue;
            }
            let ty = f.ty(v);
            match seen.get(name) {
                Some(&(other, first)) if first != ty => {
                    let msg = format!(
                        "{} %{name} has type {ty} but @{other} declares it as {first}",
                        kind.name()
                    );
                    sink.at(fi, 1, ai, f, VerifyErrorKind::WeightConflict, msg);
                }
                Some(_) => {}
                None => {
                    seen.insert(name, (&f.name, ty));
                }
            }
        }
    }
}
