//! `autodiff`: reverse-mode differentiation of a forward function into a training function.
//!
//! [`build_gradient_function`] reads `@main` (or another function) and adds `@grad`, which
//! computes the loss of one micro-batch and the gradient of every parameter:
//!
//! ```text
//! func @grad(<main's arguments>, %labels, %rng) -> (loss, grad.<param>.., new.<state>..)
//! ```
//!
//! - Arguments: `@main`'s, in order (inputs, params, states), then `labels` (an input) when
//!   a loss is appended — cross-entropy: `i64` shaped like the logits without the class
//!   axis; mse: the output's type — then `rng` (an input, `tensor<2xi64>` = step,
//!   micro-batch) when the model has dropout and training mode is on.
//! - Loss ([`LossKind`]): `output` is the model's scalar output; `cross-entropy` appends
//!   `softmax_cross_entropy` over the last axis of the first output (the mean over every
//!   other position); `mse` appends `reduce_mean((y - labels)²)`; `auto` picks `output`
//!   for a single scalar output and `cross-entropy` otherwise.
//! - Results, named: `loss`, then `grad.<param>` for every `param` argument in order (a
//!   zero constant when the loss does not depend on it), then `new.<state>` for each state
//!   training mode updates: batch-norm running statistics,
//!   `new = momentum·old + (1 - momentum)·batch_stat` (ONNX's `momentum` attribute,
//!   default 0.9; the running variance takes the unbiased batch variance, as PyTorch does).
//! - Phases: the forward copy and the loss are `fwd`. A gradient op is `bwd_input` ("B")
//!   if the gradient of some activation depends on it, else `bwd_weight` ("W"): W ops only
//!   feed other W ops and `grad.*` results, so a zero-bubble schedule can delay them. An
//!   activation is a value computed from the data (an `input` argument: model inputs,
//!   labels, the key); a value computed from parameters alone (a transposed or reshaped
//!   weight) is weight-side, and the gradient work for it is W. Backward ops read the
//!   forward values they need directly (saved activations are explicit) and carry the
//!   stage and `loc` of the forward op they differentiate; the sum of the gradient
//!   contributions of a value with several users carries the stage of its producer, so
//!   on a partitioned program every gradient flows back along a forward edge.
//! - Training mode ([`AutodiffOptions::train_mode`]): `dropout` becomes
//!   `dropout(x, %rng) {training = 1, seed = s}` with a seed unique per op (an existing
//!   unique `seed` attribute is kept), and `batch_norm` normalises with batch statistics.
//!   Without it dropout is the identity and batch norm uses the running statistics, which
//!   its gradient treats as constants.
//!
//! Only values that depend on a parameter get gradients, and only ops on a path from a
//! parameter to the loss are differentiated. `layer_norm`, `instance_norm`, `lrn` and
//! training-mode `batch_norm` are decomposed into primitive ops while copying the forward
//! function (see `lower.rs`); every other differentiable op has a rule (`rules.rs`).
//! The function must have static shapes (run `bind-batch` first).
//!
//! As a pass: `autodiff{loss=auto|cross-entropy|mse|output,function=main,train=1|0}`.

mod emit;
mod lower;
mod rules;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap, HashSet};

use ppir::ops::attrs::{BatchNormAttrs, DropoutAttrs, ReduceAttrs, ShapeAttrs};
use ppir::ops::OpAttrs;
use ppir::{
    ArgKind, Attrs, DType, Dim, Function, Module, OpId, OpKind, Phase, TensorType, ValueId,
};

use crate::registry::PassOptions;
use crate::{Pass, PassError};
use emit::{Emitter, Name, Names};
use rules::{vjp, FwdOp};

pub use ppir::ops::GradSupport;

const PASS: &str = "autodiff";

type Res<T> = Result<T, PassError>;

/// A failure that is the input's fault (unsupported model feature, bad options).
fn unsupported(message: impl Into<String>) -> PassError {
    PassError::failed(PASS, message)
}

/// The typed attribute view `T` of an op's attributes; a malformed attribute makes the op
/// unsupported.
fn view<T: ppir::ops::OpAttrs>(a: &Attrs) -> Res<T> {
    T::of(a).map_err(|e| unsupported(e.to_string()))
}

/// A failure that is autodiff's fault.
fn internal(message: impl Into<String>) -> PassError {
    PassError::failed(PASS, format!("internal error: {}", message.into()))
}

/// Which loss the training function minimises.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LossKind {
    /// `Output` for a single scalar output, else `CrossEntropy`.
    Auto,
    /// Softmax cross-entropy of the first output over its last axis against integer
    /// labels, averaged over all other positions.
    CrossEntropy,
    /// Mean squared error of the first output against float targets.
    Mse,
    /// The model's (first) output, which must be a scalar.
    Output,
}

impl LossKind {
    pub fn name(self) -> &'static str {
        match self {
            LossKind::Auto => "auto",
            LossKind::CrossEntropy => "cross-entropy",
            LossKind::Mse => "mse",
            LossKind::Output => "output",
        }
    }

    pub fn from_name(s: &str) -> Option<LossKind> {
        [
            LossKind::Auto,
            LossKind::CrossEntropy,
            LossKind::Mse,
            LossKind::Output,
        ]
        .into_iter()
        .find(|k| k.name() == s)
    }
}

/// What [`build_gradient_function`] differentiates, and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AutodiffOptions {
    /// The forward function (default `main`).
    pub function: String,
    pub loss: LossKind,
    /// Dropout draws masks and batch norm uses batch statistics (default true).
    pub train_mode: bool,
}

impl Default for AutodiffOptions {
    fn default() -> Self {
        AutodiffOptions {
            function: "main".into(),
            loss: LossKind::Auto,
            train_mode: true,
        }
    }
}

/// What [`build_gradient_function`] built.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainingInfo {
    /// The name of the new function: `grad`.
    pub function: String,
    /// The loss actually used (`Auto` resolved).
    pub loss_kind: LossKind,
    /// The type of the `labels` argument, if a loss was appended.
    pub labels: Option<TensorType>,
    /// Parameter names in argument order; result `1 + i` is `grad.<params[i]>`.
    pub params: Vec<String>,
    /// States updated by training, in argument order; result `1 + params.len() + i` is
    /// `new.<updated_states[i]>`.
    pub updated_states: Vec<String>,
    /// Whether `@grad` takes the `rng` argument (`tensor<2xi64>`: step, micro-batch).
    pub needs_rng_key: bool,
}

/// The name of the function autodiff adds.
pub const GRAD_FUNCTION: &str = "grad";

/// Add `@grad` to `m` (replacing an existing one), built from `opts.function`; see the
/// module documentation for its contract. The module is verified afterwards.
pub fn build_gradient_function(
    m: &mut Module,
    opts: &AutodiffOptions,
) -> Result<TrainingInfo, PassError> {
    let main = m
        .function(&opts.function)
        .ok_or_else(|| unsupported(format!("the module has no function @{}", opts.function)))?;
    ppir::verify::verify_function(m, main).map_err(|errors| PassError::Verify {
        context: format!("autodiff: @{} does not verify", opts.function),
        errors,
    })?;
    check_input(main)?;
    let (g, info) = Builder::new(main, opts)?.build()?;
    m.functions.retain(|f| f.name != GRAD_FUNCTION);
    m.functions.push(g);
    ppir::verify::verify_module(m).map_err(|errors| PassError::Verify {
        context: "autodiff produced IR that does not verify".into(),
        errors,
    })?;
    Ok(info)
}

/// Static shapes, no communication, at least one result.
fn check_input(f: &Function) -> Res<()> {
    for &(v, _) in f.args() {
        let ty = f.ty(v);
        if !ty.is_static() {
            return Err(unsupported(format!(
                "@{}: argument %{} has type {ty}; autodiff needs static shapes, bind the batch first (bind-batch{{size=N}})",
                f.name,
                f.value(v).name
            )));
        }
    }
    for &op in f.ops() {
        let data = f.op(op);
        if data.kind.class() == ppir::ops::OpClass::Comm {
            return Err(unsupported(format!(
                "@{}: autodiff runs before pipeline partitioning; found \"{}\"",
                f.name, data.kind
            )));
        }
        for &r in data.results() {
            if !f.ty(r).is_static() {
                return Err(unsupported(format!(
                    "@{}: %{} has type {}; autodiff needs static shapes, bind the batch first",
                    f.name,
                    f.value(r).name,
                    f.ty(r)
                )));
            }
        }
    }
    if f.results().is_empty() {
        return Err(unsupported(format!(
            "@{} returns nothing to differentiate",
            f.name
        )));
    }
    Ok(())
}

/// Whether a type is a scalar: rank 0, or every dim 1.
fn is_scalar(t: &TensorType) -> bool {
    t.dims.iter().all(|&d| d == Dim::Known(1))
}

/// Resolve `Auto` and check the first output against the loss.
fn resolve_loss(f: &Function, kind: LossKind) -> Res<(LossKind, Option<TensorType>)> {
    let y = f.results()[0];
    let ty = f.ty(y).clone();
    let kind = match kind {
        LossKind::Auto if f.results().len() == 1 && is_scalar(&ty) => LossKind::Output,
        LossKind::Auto => LossKind::CrossEntropy,
        k => k,
    };
    let name = &f.value(y).name;
    if !ty.dtype.is_float() {
        return Err(unsupported(format!(
            "the loss needs a float output, but %{name} is {ty}"
        )));
    }
    let labels = match kind {
        LossKind::Output => {
            if !is_scalar(&ty) {
                return Err(unsupported(format!(
                    "loss `output` needs a scalar output, but %{name} is {ty}"
                )));
            }
            None
        }
        LossKind::CrossEntropy => {
            if ty.rank() == 0 {
                return Err(unsupported(format!(
                    "loss `cross-entropy` needs logits with a class axis, but %{name} is {ty}"
                )));
            }
            Some(TensorType::new(
                DType::I64,
                ty.dims[..ty.rank() - 1].to_vec(),
            ))
        }
        LossKind::Mse => Some(ty),
        LossKind::Auto => unreachable!("resolved above"),
    };
    Ok((kind, labels))
}

/// Seeds for the dropout ops of `f`: an existing `seed` is kept if no other dropout has
/// it; the others get the smallest unused numbers, in body order. (Whether the source gave
/// a seed matters here, which the typed view's default 0 would hide, so `seed` is read
/// by name.)
fn dropout_seeds(f: &Function) -> HashMap<OpId, i64> {
    let drops: Vec<OpId> = f
        .ops()
        .iter()
        .copied()
        .filter(|&o| f.op(o).kind == OpKind::Dropout)
        .collect();
    let mut count: HashMap<i64, usize> = HashMap::new();
    for &o in &drops {
        if let Ok(Some(s)) = f.op(o).attrs.int("seed") {
            *count.entry(s).or_default() += 1;
        }
    }
    let mut seeds = HashMap::new();
    let mut used: HashSet<i64> = count
        .iter()
        .filter(|(_, &n)| n == 1)
        .map(|(&s, _)| s)
        .collect();
    let mut next = 0i64;
    for &o in &drops {
        match f.op(o).attrs.int("seed") {
            Ok(Some(s)) if count[&s] == 1 => {
                seeds.insert(o, s);
            }
            _ => {
                while used.contains(&next) {
                    next += 1;
                }
                used.insert(next);
                seeds.insert(o, next);
            }
        }
    }
    seeds
}

/// The state of one build.
struct Builder<'m> {
    main: &'m Function,
    opts: &'m AutodiffOptions,
    loss_kind: LossKind,
    labels_ty: Option<TensorType>,
    needs_rng: bool,
    g: Function,
    names: Names,
    /// main value → @grad value.
    map: HashMap<ValueId, ValueId>,
}

impl<'m> Builder<'m> {
    fn new(main: &'m Function, opts: &'m AutodiffOptions) -> Res<Self> {
        let (loss_kind, labels_ty) = resolve_loss(main, opts.loss)?;
        let needs_rng = opts.train_mode
            && main
                .ops()
                .iter()
                .any(|&o| main.op(o).kind == OpKind::Dropout);
        Ok(Builder {
            main,
            opts,
            loss_kind,
            labels_ty,
            needs_rng,
            g: Function::new(GRAD_FUNCTION),
            names: Names::default(),
            map: HashMap::new(),
        })
    }

    fn build(mut self) -> Res<(Function, TrainingInfo)> {
        let main = self.main;
        // Names: arguments keep theirs (weights and inputs are bound by name); the
        // contract's names are reserved; other forward values yield to them.
        let mut reserved: Vec<String> = vec!["loss".into()];
        if self.labels_ty.is_some() {
            reserved.push("labels".into());
        }
        if self.needs_rng {
            reserved.push("rng".into());
        }
        for &(v, kind) in main.args() {
            let name = &main.value(v).name;
            match kind {
                ArgKind::Param => reserved.push(format!("grad.{name}")),
                ArgKind::State => reserved.push(format!("new.{name}")),
                ArgKind::Input => {}
            }
        }
        for &(v, _) in main.args() {
            let name = &main.value(v).name;
            if reserved.contains(name) {
                return Err(unsupported(format!(
                    "argument %{name} of @{} clashes with a name of the training function's contract",
                    main.name
                )));
            }
            self.names.claim(name);
        }
        for r in &reserved {
            self.names.reserve(r);
        }

        // Arguments.
        for &(v, kind) in main.args() {
            let nv = self
                .g
                .add_arg(main.value(v).name.clone(), main.ty(v).clone(), kind);
            self.map.insert(v, nv);
        }
        let labels = match &self.labels_ty {
            Some(t) => {
                let name = self.names.take("labels");
                Some(self.g.add_arg(name, t.clone(), ArgKind::Input))
            }
            None => None,
        };
        let rng = if self.needs_rng {
            let name = self.names.take("rng");
            Some(
                self.g
                    .add_arg(name, TensorType::of(DType::I64, &[2]), ArgKind::Input),
            )
        } else {
            None
        };

        // Forward.
        let (fwd_ops, loss, state_updates) = self.forward(labels, rng)?;

        // Backward.
        let mut names = std::mem::take(&mut self.names);
        let mut em = Emitter::new(&mut self.g, &mut names, Phase::BwdInput);
        let mut grads = Gradients::new(&fwd_ops, &*em.f, loss);
        if grads.active(loss) {
            em.at(None, Some("loss".into()));
            let seed = em.scalar_like(loss, 1.0)?;
            grads.push(loss, seed);
        }
        for &op in fwd_ops.iter().rev() {
            grads.differentiate(&mut em, op)?;
        }
        // Parameter gradients.
        let mut results = vec![loss];
        let mut params = vec![];
        let mut claimed: HashSet<ValueId> = HashSet::new();
        for (i, &(v, kind)) in main.args().iter().enumerate() {
            if kind != ArgKind::Param {
                continue;
            }
            let pv = em.f.arg_values().nth(i).expect("arguments copied");
            let name = main.value(v).name.clone();
            let rname = format!("grad.{name}");
            em.at(None, None);
            let g = match grads.finalize(&mut em, pv)? {
                Some(g) => g,
                None => {
                    let t = em.ty(pv).clone();
                    em.zeros(&t)?
                }
            };
            let renamable =
                em.f.producer(g)
                    .is_some_and(|p| em.f.op(p).phase != Some(Phase::Fwd))
                    && !grads.value_grads.iter().any(|&(_, vg)| vg == g)
                    && !claimed.contains(&g);
            let g = if renamable {
                let n = em.names.take(&rname);
                em.f.rename_value(g, n);
                g
            } else {
                em.op_as(Name::Reserved(&rname), OpKind::Identity, &[g], Attrs::new())?
            };
            claimed.insert(g);
            results.push(g);
            params.push(name);
        }
        let bwd_ops = std::mem::take(&mut em.emitted);
        let value_grads = std::mem::take(&mut grads.value_grads);
        drop(em);
        self.names = names;

        // States.
        let mut updated_states = vec![];
        for (name, v) in state_updates.into_values() {
            updated_states.push(name);
            results.push(v);
        }
        self.g.set_results(results);

        remove_dead(&mut self.g);
        tag_phases(&mut self.g, &bwd_ops, &value_grads);

        let info = TrainingInfo {
            function: GRAD_FUNCTION.into(),
            loss_kind: self.loss_kind,
            labels: self.labels_ty.clone(),
            params,
            updated_states,
            needs_rng_key: self.needs_rng,
        };
        Ok((self.g, info))
    }

    /// Copy the forward ops (applying training mode and decompositions) and append the
    /// loss. Returns the forward ops in order, the loss value, and the state updates by
    /// argument index (name, new value).
    #[allow(clippy::type_complexity)]
    fn forward(
        &mut self,
        labels: Option<ValueId>,
        rng: Option<ValueId>,
    ) -> Res<(Vec<OpId>, ValueId, BTreeMap<usize, (String, ValueId)>)> {
        let main = self.main;
        let train = self.opts.train_mode;
        let seeds = dropout_seeds(main);
        let state_index: HashMap<ValueId, usize> = main
            .args()
            .iter()
            .enumerate()
            .filter(|(_, (_, k))| *k == ArgKind::State)
            .map(|(i, &(v, _))| (v, i))
            .collect();
        let mut updates: BTreeMap<usize, (String, ValueId)> = BTreeMap::new();
        let mut names = std::mem::take(&mut self.names);
        let mut em = Emitter::new(&mut self.g, &mut names, Phase::Fwd);
        for &op in main.ops() {
            let data = main.op(op);
            em.at(data.stage, data.loc.clone());
            let operands: Vec<ValueId> = data.operands().iter().map(|v| self.map[v]).collect();
            let rnames: Vec<&str> = data
                .results()
                .iter()
                .map(|&r| main.value(r).name.as_str())
                .collect();
            let like: Vec<Name> = rnames.iter().map(|n| Name::Like(n)).collect();
            let types: Vec<TensorType> =
                data.results().iter().map(|&r| main.ty(r).clone()).collect();
            let new_results: Vec<ValueId> = match data.kind {
                OpKind::Dropout => {
                    let d: DropoutAttrs = view(&data.attrs)?;
                    let (attrs, ops) = match rng {
                        Some(key) => {
                            let seed = seeds[&op];
                            let train = DropoutAttrs {
                                training: true,
                                seed,
                                ..d
                            };
                            (train, vec![operands[0], key])
                        }
                        None => (
                            DropoutAttrs {
                                training: false,
                                ..d
                            },
                            vec![operands[0]],
                        ),
                    };
                    em.op_typed(OpKind::Dropout, &ops, attrs.to_attrs(), types, &like)?
                }
                OpKind::BatchNorm if train => {
                    let (y, stats) =
                        lower::batch_norm_train(&mut em, &operands, &data.attrs, like[0])?;
                    let momentum = view::<BatchNormAttrs>(&data.attrs)?.momentum;
                    for (k, stat) in [(3, stats.mean), (4, stats.var_unbiased)] {
                        let old = data.operands()[k];
                        let Some(&ai) = state_index.get(&old) else {
                            continue;
                        };
                        let sname = main.value(old).name.clone();
                        if updates.contains_key(&ai) {
                            return Err(unsupported(format!(
                                "state %{sname} is the running statistic of two batch_norm ops"
                            )));
                        }
                        let old_v = self.map[&old];
                        let a = em.scale(old_v, momentum)?;
                        let stat = em.cast(stat, em.dtype(old_v))?;
                        let b = em.scale(stat, 1.0 - momentum)?;
                        let rname = format!("new.{sname}");
                        let new =
                            em.op_as(Name::Reserved(&rname), OpKind::Add, &[a, b], Attrs::new())?;
                        updates.insert(ai, (sname, new));
                    }
                    vec![y]
                }
                OpKind::LayerNorm => lower::layer_norm(&mut em, &operands, &data.attrs, &like)?,
                OpKind::InstanceNorm => {
                    vec![lower::instance_norm(
                        &mut em,
                        &operands,
                        &data.attrs,
                        like[0],
                    )?]
                }
                OpKind::Lrn => vec![lower::lrn(&mut em, &operands, &data.attrs, like[0])?],
                kind => em.op_typed(kind, &operands, data.attrs.clone(), types, &like)?,
            };
            if new_results.len() != data.results().len() {
                return Err(internal(format!(
                    "copying \"{}\" gave {} results instead of {}",
                    data.kind,
                    new_results.len(),
                    data.results().len()
                )));
            }
            for (&r, nv) in data.results().iter().zip(new_results) {
                self.map.insert(r, nv);
            }
        }

        // The loss.
        em.at(None, Some("loss".into()));
        let y = self.map[&main.results()[0]];
        let loss = emit_loss(&mut em, self.loss_kind, y, labels, Name::Reserved("loss"))?;
        let fwd_ops = std::mem::take(&mut em.emitted);
        drop(em);
        self.names = names;
        Ok((fwd_ops, loss, updates))
    }
}

/// Append the loss `kind` of the model output `y` (against `labels`) with `em`.
fn emit_loss(
    em: &mut Emitter,
    kind: LossKind,
    y: ValueId,
    labels: Option<ValueId>,
    loss: Name<'_>,
) -> Res<ValueId> {
    let need_labels =
        || labels.ok_or_else(|| internal(format!("loss {} needs labels", kind.name())));
    match kind {
        LossKind::Output => {
            if em.rank(y) == 0 {
                em.op_as(loss, OpKind::Identity, &[y], Attrs::new())
            } else {
                let scalar = ShapeAttrs { shape: vec![] };
                em.op_as(loss, OpKind::Reshape, &[y], scalar.to_attrs())
            }
        }
        LossKind::CrossEntropy => em.op_as(
            loss,
            OpKind::SoftmaxCrossEntropy,
            &[y, need_labels()?],
            Attrs::new(),
        ),
        LossKind::Mse => {
            let d = em.sub(y, need_labels()?)?;
            let sq = em.mul(d, d)?;
            let rank = em.rank(sq);
            if rank == 0 {
                em.op_as(loss, OpKind::Identity, &[sq], Attrs::new())
            } else {
                let mean = ReduceAttrs {
                    axes: (0..rank as i64).collect(),
                    keepdims: false,
                };
                em.op_as(loss, OpKind::ReduceMean, &[sq], mean.to_attrs())
            }
        }
        LossKind::Auto => Err(internal("the loss kind is not resolved")),
    }
}

/// What [`append_loss`] did.
#[derive(Clone, Debug, PartialEq)]
pub struct AppendedLoss {
    /// The loss appended (`Auto` resolved).
    pub kind: LossKind,
    /// The `labels` argument added, if the loss has labels.
    pub labels: Option<TensorType>,
}

/// Make `@function` compute its own training loss: the loss `kind` of its first result is
/// appended (against a new input argument `labels` where the loss has labels) and becomes
/// the function's only result; ops that only fed the other results are removed. The
/// gradient function is then built with [`LossKind::Output`]. This lets rewrites before
/// autodiff see the loss (a cross-entropy split along the vocabulary with its LM head).
pub fn append_loss(
    m: &mut Module,
    function: &str,
    kind: LossKind,
) -> Result<AppendedLoss, PassError> {
    let f = m
        .function_mut(function)
        .ok_or_else(|| unsupported(format!("the module has no function @{function}")))?;
    check_input(f)?;
    let (kind, labels_ty) = resolve_loss(f, kind)?;
    let mut names = Names::default();
    for i in 0..f.num_values() {
        names.claim(&f.value(ValueId(i as u32)).name);
    }
    if labels_ty.is_some() && names.is_taken("labels") {
        return Err(unsupported(format!(
            "@{function} already has a value named %labels, the name of the loss's labels"
        )));
    }
    let y = f.results()[0];
    let labels = labels_ty
        .as_ref()
        .map(|t| f.add_arg(names.claim("labels"), t.clone(), ArgKind::Input));
    let mut em = Emitter::new(f, &mut names, Phase::Fwd);
    em.at(None, Some("loss".into()));
    let loss = emit_loss(&mut em, kind, y, labels, Name::Like("loss"))?;
    let emitted = std::mem::take(&mut em.emitted);
    for op in emitted {
        f.op_mut(op).phase = None;
    }
    f.set_results(vec![loss]);
    remove_dead(f);
    Ok(AppendedLoss {
        kind,
        labels: labels_ty,
    })
}

/// Gradient bookkeeping of the reverse sweep.
struct Gradients {
    /// Values that depend on a parameter (through differentiable operands).
    dep: Vec<bool>,
    /// Values the loss depends on (through differentiable operands).
    needed: Vec<bool>,
    /// Pending gradient contributions per value.
    pending: HashMap<ValueId, Vec<ValueId>>,
    /// The summed gradient of each value, once final.
    done: HashMap<ValueId, ValueId>,
    /// (value, final gradient) for every value other than a parameter.
    value_grads: Vec<(ValueId, ValueId)>,
    params: HashSet<ValueId>,
}

impl Gradients {
    fn new(fwd_ops: &[OpId], f: &Function, loss: ValueId) -> Self {
        let n = f.num_values();
        let mut dep = vec![false; n];
        let params: HashSet<ValueId> = f
            .args()
            .iter()
            .filter(|(_, k)| *k == ArgKind::Param)
            .map(|&(v, _)| v)
            .collect();
        for &p in &params {
            dep[p.index()] = f.ty(p).dtype.is_float();
        }
        for &op in fwd_ops {
            let d = f.op(op);
            let flows = d
                .operands()
                .iter()
                .enumerate()
                .any(|(i, v)| dep[v.index()] && d.kind.differentiable_operand(i));
            if flows {
                for &r in d.results() {
                    dep[r.index()] = f.ty(r).dtype.is_float();
                }
            }
        }
        let mut needed = vec![false; n];
        needed[loss.index()] = true;
        for &op in fwd_ops.iter().rev() {
            let d = f.op(op);
            if d.results().iter().any(|r| needed[r.index()]) {
                for (i, v) in d.operands().iter().enumerate() {
                    if dep[v.index()] && d.kind.differentiable_operand(i) {
                        needed[v.index()] = true;
                    }
                }
            }
        }
        Gradients {
            dep,
            needed,
            pending: HashMap::new(),
            done: HashMap::new(),
            value_grads: vec![],
            params,
        }
    }

    fn active(&self, v: ValueId) -> bool {
        let i = v.index();
        i < self.dep.len() && self.dep[i] && self.needed[i]
    }

    fn push(&mut self, v: ValueId, g: ValueId) {
        self.pending.entry(v).or_default().push(g);
    }

    /// Sum the contributions to `v` (now that every user has been differentiated).
    fn finalize(&mut self, em: &mut Emitter, v: ValueId) -> Res<Option<ValueId>> {
        if let Some(&g) = self.done.get(&v) {
            return Ok(Some(g));
        }
        let Some(parts) = self.pending.remove(&v) else {
            return Ok(None);
        };
        // The sum of the contributions belongs to the stage that produced `v` (its
        // consumers may sit on other stages: each sends its part back to the producer).
        let saved = (em.stage, em.loc.clone());
        if parts.len() > 1 {
            if let Some(p) = em.f.producer(v) {
                em.stage = em.f.op(p).stage;
                em.loc = em.f.op(p).loc.clone();
            }
        }
        // A one-hot contribution (`label_logit_grad`) adds into the sum of the others: one
        // pass over the logits instead of writing the one-hot gradient and adding it (the
        // unfused op is left dead and removed).
        let mut parts = parts;
        let onehot = (parts.len() > 1)
            .then(|| {
                parts.iter().position(|&p| {
                    em.f.producer(p).is_some_and(|o| {
                        let d = em.f.op(o);
                        d.kind == OpKind::LabelLogitGrad && d.operands().len() == 2
                    })
                })
            })
            .flatten()
            .map(|i| parts.remove(i));
        let mut sum = parts[0];
        for &p in &parts[1..] {
            sum = em.add(sum, p)?;
        }
        if let Some(o) = onehot.and_then(|p| em.f.producer(p)) {
            let d = em.f.op(o);
            let (dy, labels, attrs) = (d.operands()[0], d.operands()[1], d.attrs.clone());
            sum = em.op(OpKind::LabelLogitGrad, &[dy, labels, sum], attrs)?;
        }
        (em.stage, em.loc) = saved;
        self.done.insert(v, sum);
        if !self.params.contains(&v) {
            self.value_grads.push((v, sum));
        }
        Ok(Some(sum))
    }

    /// Apply the rule of forward op `op`, if a gradient reaches it and flows on.
    fn differentiate(&mut self, em: &mut Emitter, op: OpId) -> Res<()> {
        let data = em.f.op(op);
        let fwd = FwdOp {
            kind: data.kind,
            attrs: data.attrs.clone(),
            operands: data.operands().to_vec(),
            results: data.results().to_vec(),
        };
        let (stage, loc) = (data.stage, data.loc.clone());
        let wants: Vec<bool> = fwd
            .operands
            .iter()
            .enumerate()
            .map(|(i, &v)| self.active(v) && fwd.kind.differentiable_operand(i))
            .collect();
        if !wants.iter().any(|&w| w) {
            return Ok(());
        }
        em.at(stage, loc);
        let mut dys = Vec::with_capacity(fwd.results.len());
        for &r in &fwd.results {
            dys.push(if self.active(r) {
                self.finalize(em, r)?
            } else {
                None
            });
        }
        if dys.iter().all(|d| d.is_none()) {
            return Ok(());
        }
        let contributions = vjp(em, &fwd, &dys, &wants).map_err(|e| match e {
            PassError::Failed { pass, message } => {
                let at = match &em.loc {
                    Some(l) => format!(" (loc {l:?})"),
                    None => String::new(),
                };
                PassError::Failed {
                    pass,
                    message: format!("\"{}\"{at}: {message}", fwd.kind),
                }
            }
            e => e,
        })?;
        for (i, c) in contributions.into_iter().enumerate() {
            let Some(c) = c else { continue };
            if !wants[i] {
                continue;
            }
            let v = fwd.operands[i];
            if em.ty(c) != em.ty(v) {
                return Err(internal(format!(
                    "the gradient rule of \"{}\" gave operand {i} a gradient of type {} for a value of type {}",
                    fwd.kind,
                    em.ty(c),
                    em.ty(v)
                )));
            }
            self.push(v, c);
        }
        Ok(())
    }
}

/// Remove side-effect-free ops whose results are unused (one reverse sweep suffices:
/// removing an op only frees values defined before it).
fn remove_dead(f: &mut Function) {
    for op in f.ops().to_vec().into_iter().rev() {
        let data = f.op(op);
        if !data.kind.has_side_effect() && data.results().iter().all(|&r| f.users(r).is_empty()) {
            f.remove_op(op);
        }
    }
}

/// Which values depend on an `input` argument (data: model inputs, labels, the rng key),
/// through any operand. The others are functions of parameters, states and constants.
fn data_dependent(f: &Function) -> Vec<bool> {
    let mut dep = vec![false; f.num_values()];
    for &(v, kind) in f.args() {
        dep[v.index()] = kind == ArgKind::Input;
    }
    for &op in f.ops() {
        let d = f.op(op);
        if d.operands().iter().any(|v| dep[v.index()]) {
            for &r in d.results() {
                dep[r.index()] = true;
            }
        }
    }
    dep
}

/// Backward ops that the gradient of some activation depends on are `bwd_input`; the rest
/// `bwd_weight`. An activation is a value computed from the data (an `input` argument);
/// values computed from parameters alone (a transposed or reshaped weight) are weight-side,
/// so their gradients are W work too.
fn tag_phases(f: &mut Function, bwd_ops: &[OpId], value_grads: &[(ValueId, ValueId)]) {
    let data = data_dependent(f);
    let bwd: HashSet<OpId> = bwd_ops
        .iter()
        .copied()
        .filter(|&o| !f.op(o).is_removed())
        .collect();
    let mut input_side: HashSet<OpId> = HashSet::new();
    let mut stack: Vec<OpId> = value_grads
        .iter()
        .filter(|(v, _)| data[v.index()])
        .filter_map(|&(_, g)| f.producer(g))
        .filter(|o| bwd.contains(o))
        .collect();
    while let Some(o) = stack.pop() {
        if !input_side.insert(o) {
            continue;
        }
        for &v in f.op(o).operands() {
            if let Some(p) = f.producer(v) {
                if bwd.contains(&p) && !input_side.contains(&p) {
                    stack.push(p);
                }
            }
        }
    }
    for &o in &bwd {
        f.op_mut(o).phase = Some(if input_side.contains(&o) {
            Phase::BwdInput
        } else {
            Phase::BwdWeight
        });
    }
}

/// The `autodiff` pass: [`build_gradient_function`] with options from the pass spec.
#[derive(Clone, Debug, Default)]
pub struct AutodiffPass {
    pub options: AutodiffOptions,
}

impl AutodiffPass {
    /// `autodiff{loss=auto|cross-entropy|mse|output,function=main,train=1|0}`.
    pub fn from_options(o: &PassOptions) -> Result<Self, PassError> {
        o.expect_only(PASS, &["loss", "function", "train"])?;
        let mut options = AutodiffOptions::default();
        if let Some(l) = o.get("loss") {
            options.loss = LossKind::from_name(l).ok_or_else(|| {
                PassError::Usage(format!(
                    "pass `autodiff`: option `loss` must be auto, cross-entropy, mse or output, got `{l}`"
                ))
            })?;
        }
        if let Some(f) = o.get("function") {
            options.function = f.to_string();
        }
        if let Some(t) = o.get("train") {
            options.train_mode = match t {
                "1" | "true" => true,
                "0" | "false" => false,
                _ => {
                    return Err(PassError::Usage(format!(
                        "pass `autodiff`: option `train` must be 1 or 0, got `{t}`"
                    )))
                }
            };
        }
        Ok(AutodiffPass { options })
    }
}

impl Pass for AutodiffPass {
    fn name(&self) -> &'static str {
        PASS
    }

    fn run(&self, module: &mut Module) -> Result<(), PassError> {
        build_gradient_function(module, &self.options).map(|_| ())
    }
}
