//! Shape inference: the result types of an op from its operand types and attributes.
//!
//! [`infer`] is the single rule book for every [`OpKind`], following the operand and
//! attribute contract in [`crate::ops`] (ONNX semantics, opset 13+ meanings). The verifier
//! checks declared result types against it, [`infer_function`] re-derives a whole body after
//! an argument type changed, and [`bind_batch`] fixes the symbolic batch dimension.
//!
//! The batch dimension `?` ([`Dim::Batch`]) is one unknown size shared by the whole program.
//! It flows through every rule that maps it to itself (elementwise ops, a reshape's `-1`,
//! a conv's batch axis...). Where a rule would need its actual value — splitting or tiling
//! along it, a padded spatial `?` — inference fails with a message saying so, rather than
//! inventing a size that `bind_batch` would later contradict.
//!
//! `recv` has no operands, so its type is not inferred: its result annotation is the truth,
//! [`infer`] returns an error for it and [`infer_function`] keeps the declared type.

mod contraction;
mod elementwise;
mod grad;
mod movement;
#[cfg(test)]
mod tests;

use std::fmt;

use crate::attr::{AttrError, Attrs};
use crate::module::{Function, Module, OpId};
use crate::ops::attrs::*;
use crate::ops::{Arity, AttrKind, OpKind};
use crate::types::{DType, Dim, TensorType};

pub use elementwise::broadcast_shapes;

/// Why an op's result types cannot be inferred: a sentence naming the offending operand,
/// attribute or dimension, e.g. `inner dimensions differ: 784 vs 512`.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct ShapeError(pub String);

impl ShapeError {
    pub fn new(message: impl Into<String>) -> Self {
        ShapeError(message.into())
    }
}

impl From<AttrError> for ShapeError {
    fn from(e: AttrError) -> Self {
        ShapeError(e.to_string())
    }
}

type Res<T> = Result<T, ShapeError>;

/// `return Err(ShapeError(format!(...)))`.
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err($crate::shape::ShapeError(format!($($arg)*)))
    };
}
pub(crate) use bail;

/// The result types of an op of `kind` with `attrs` applied to operands of types `operands`.
///
/// `send` gives no result; `recv` is an error (its type comes from its annotation).
///
/// ```
/// use ppir::{shape::infer, Attrs, DType, OpKind, TensorType};
/// let a = TensorType::of(DType::F32, &[8, 784]);
/// let b = TensorType::of(DType::F32, &[784, 10]);
/// let out = infer(OpKind::MatMul, &Attrs::new(), &[a, b]).unwrap();
/// assert_eq!(out[0].to_string(), "tensor<8x10xf32>");
/// ```
pub fn infer(
    kind: OpKind,
    attrs: &Attrs,
    operands: &[TensorType],
) -> Result<Vec<TensorType>, ShapeError> {
    let types = infer_rule(kind, attrs, operands)?;
    // An expand, tile, reshape... to more elements than 64-bit sizes can count.
    for (i, t) in types.iter().enumerate() {
        if let Err(e) = t.check_size() {
            match types.len() {
                1 => bail!("the result is too large: {e}"),
                _ => bail!("result {i} is too large: {e}"),
            }
        }
    }
    Ok(types)
}

fn infer_rule(
    kind: OpKind,
    attrs: &Attrs,
    operands: &[TensorType],
) -> Result<Vec<TensorType>, ShapeError> {
    let arity = kind.arity();
    if !arity.accepts(operands.len()) {
        bail!("{}", arity_message(arity, operands.len()));
    }
    check_flags(kind, attrs)?;
    use OpKind::*;
    let ops = operands;
    let one = |t: TensorType| Ok(vec![t]);
    match kind {
        Relu | LeakyRelu | Elu | Selu | Sigmoid | HardSigmoid | Tanh | Gelu | Erf | Exp | Log
        | Sqrt | Abs | Neg | Sign | Reciprocal | Softplus | Softsign | Floor | Ceil | Sin | Cos
        | Not | Identity | Shrink | Clip | Cast => one(elementwise::unary(kind, attrs, &ops[0])?),
        Dropout => one(elementwise::dropout(&DropoutAttrs::of(attrs)?, ops)?),
        Add | Sub | Mul | Div | Pow | Max | Min | PRelu | Mod | Equal | Less | Greater
        | LessEqual | GreaterEqual | And | Or => one(elementwise::binary(kind, &ops[0], &ops[1])?),
        Where => one(elementwise::where_(&ops[0], &ops[1], &ops[2])?),
        MatMul => one(contraction::matmul(&ops[0], &ops[1])?),
        Gemm => one(contraction::gemm(&GemmAttrs::of(attrs)?, ops)?),
        Conv => one(contraction::conv(&ConvAttrs::of(attrs)?, ops)?),
        ConvTranspose => one(contraction::conv_transpose(
            &ConvTransposeAttrs::of(attrs)?,
            ops,
        )?),
        MaxPool => one(contraction::max_pool(&MaxPoolAttrs::of(attrs)?, &ops[0])?),
        AvgPool => one(contraction::avg_pool(&AvgPoolAttrs::of(attrs)?, &ops[0])?),
        GlobalAvgPool | GlobalMaxPool => one(contraction::global_pool(&ops[0])?),
        BatchNorm => one(contraction::batch_norm(ops)?),
        InstanceNorm => one(contraction::instance_norm(ops)?),
        LayerNorm => one(contraction::layer_norm(&LayerNormAttrs::of(attrs)?, ops)?),
        Lrn => one(contraction::lrn(&LrnAttrs::of(attrs)?, &ops[0])?),
        Softmax | LogSoftmax => one(contraction::softmax(&SoftmaxAttrs::of(attrs)?, &ops[0])?),
        ReduceSum | ReduceMean | ReduceMax | ReduceMin | ReduceLogSumExp => {
            one(movement::reduce(kind, &ReduceAttrs::of(attrs)?, &ops[0])?)
        }
        Reshape => one(movement::reshape(&ShapeAttrs::of(attrs)?, &ops[0])?),
        Transpose => one(movement::transpose(&TransposeAttrs::of(attrs)?, &ops[0])?),
        Concat => one(movement::concat(&ConcatAttrs::of(attrs)?, ops)?),
        Split => movement::split(&SplitAttrs::of(attrs)?, &ops[0]),
        Slice => one(movement::slice(&SliceAttrs::of(attrs)?, &ops[0])?),
        Gather => one(movement::gather(
            GatherAttrs::of(attrs)?.axis,
            &ops[0],
            &ops[1],
        )?),
        Expand => one(movement::expand(&ShapeAttrs::of(attrs)?, &ops[0])?),
        Pad => one(movement::pad(&PadAttrs::of(attrs)?, &ops[0])?),
        Tile => one(movement::tile(&TileAttrs::of(attrs)?, &ops[0])?),
        Squeeze => one(movement::squeeze(&SqueezeAttrs::of(attrs)?, &ops[0])?),
        Unsqueeze => one(movement::unsqueeze(&UnsqueezeAttrs::of(attrs)?, &ops[0])?),
        Flatten => one(movement::flatten(&FlattenAttrs::of(attrs)?, &ops[0])?),
        Constant => one(ConstantAttrs::value_ref(attrs)?.tensor_type()),
        SoftmaxCrossEntropy => {
            CrossEntropyAttrs::of(attrs)?;
            one(grad::softmax_cross_entropy(ops)?)
        }
        SoftmaxCrossEntropyGrad => {
            CrossEntropyAttrs::of(attrs)?;
            one(grad::softmax_cross_entropy_grad(ops)?)
        }
        LabelLogit => {
            LabelLogitAttrs::of(attrs)?;
            one(grad::label_logit(ops)?)
        }
        LabelLogitGrad => one(grad::label_logit_grad(
            LabelLogitGradAttrs::of(attrs)?.classes,
            ops,
        )?),
        LogSumExpGrad => one(grad::log_sum_exp_grad(&ReduceAttrs::of(attrs)?, ops)?),
        MaxPoolGrad => one(grad::max_pool_grad(&MaxPoolAttrs::of(attrs)?, ops)?),
        AvgPoolGrad => one(grad::avg_pool_grad(&AvgPoolGradAttrs::of(attrs)?, &ops[0])?),
        ConvGradWeight => one(grad::conv_grad_weight(
            &ConvGradWeightAttrs::of(attrs)?,
            ops,
        )?),
        GatherGrad => one(grad::gather_grad(&GatherGradAttrs::of(attrs)?, ops)?),
        SliceGrad => one(grad::slice_grad(&SliceGradAttrs::of(attrs)?, &ops[0])?),
        Send => Ok(vec![]),
        AllReduce => one(ops[0].clone()),
        ReduceScatter | Shard | AllGather => one(sharded(kind, &ShardAttrs::of(attrs)?, &ops[0])?),
        Recv => {
            bail!("the type of a recv is given by its result annotation; it cannot be inferred")
        }
    }
}

/// `reduce_scatter`/`shard`: the parameter of `a.shape` → its shard (`[S]`, see
/// [`crate::shard`]); `all_gather`: a shard → the parameter.
fn sharded(kind: OpKind, a: &ShardAttrs, x: &TensorType) -> Result<TensorType, ShapeError> {
    if a.replicas < 1 {
        bail!("replicas is {}, expected at least 1", a.replicas);
    }
    if a.shape.iter().any(|&d| d < 0) {
        bail!("shape {:?} has a negative dimension", a.shape);
    }
    let full = TensorType::of(
        x.dtype,
        &a.shape.iter().map(|&d| d as u64).collect::<Vec<_>>(),
    );
    full.check_size()
        .map_err(|e| ShapeError::new(format!("shape {:?}: {e}", a.shape)))?;
    let n = full.num_elements().unwrap_or(0);
    let s = crate::shard::shard_len(n, a.replicas as u64);
    let part = TensorType::of(x.dtype, &[s]);
    let (want, out) = match kind {
        OpKind::AllGather => (&part, full.clone()),
        _ => (&full, part.clone()),
    };
    if x != want {
        bail!(
            "the operand is {x}, expected {want} (a parameter of shape {:?} over {} replicas)",
            a.shape,
            a.replicas
        );
    }
    Ok(out)
}

/// The 0/1 attributes of the op's set must be 0 or 1 (the typed views read any non-zero
/// integer as true; inference holds the IR to the documented values).
fn check_flags(kind: OpKind, attrs: &Attrs) -> Res<()> {
    for spec in kind.attr_spec().iter().filter(|s| s.kind == AttrKind::Bool) {
        match attrs.int(spec.name)? {
            None | Some(0 | 1) => {}
            Some(v) => bail!("'{}' must be 0 or 1, found {v}", spec.name),
        }
    }
    Ok(())
}

/// `expects 2 operands, found 3`.
pub(crate) fn arity_message(arity: Arity, found: usize) -> String {
    let plural = match arity {
        Arity::Exact(1) | Arity::Range(_, 1) | Arity::AtLeast(1) => "",
        _ => "s",
    };
    format!("expects {arity} operand{plural}, found {found}")
}

// ---- whole functions ----

/// An op whose result types could not be (re-)inferred. Displays as
/// `%3 = "pp.matmul" (loc "fc1/MatMul"): inner dimensions differ: 784 vs 512`; the function
/// is left to the caller, who knows it.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{op_desc}{}: {error}", loc_suffix(.loc.as_deref()))]
pub struct InferError {
    pub op: OpId,
    /// `%3 = "pp.matmul"`, or `op #4 "pp.send"` for an op without results.
    pub op_desc: String,
    pub loc: Option<String>,
    pub error: ShapeError,
}

/// ` (loc "fc1/MatMul")`, or nothing.
pub(crate) fn loc_suffix(loc: Option<&str>) -> String {
    match loc {
        Some(l) => format!(" (loc {l:?})"),
        None => String::new(),
    }
}

/// Why [`bind_batch`] failed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum BindBatchError {
    #[error("the batch size must be at least 1")]
    ZeroBatch,
    #[error("@{function}: {error}")]
    Infer { function: String, error: InferError },
    /// An argument is too large once its batch dimension is bound.
    #[error("@{function}: argument %{value}: {error}")]
    Size {
        function: String,
        value: String,
        error: crate::size::SizeError,
    },
}

/// Re-infer the result types of every op of `f` in body order and store them, so that a
/// changed argument type propagates through the body. `recv` keeps its declared type. Stops
/// at the first op whose types cannot be inferred (which is then left as it was).
pub fn infer_function(f: &mut Function) -> Result<(), InferError> {
    let body: Vec<OpId> = f.ops().to_vec();
    for op in body {
        if op.index() >= f.num_op_slots() {
            continue; // a broken layout is the verifier's to report
        }
        let data = f.op(op);
        if data.kind == OpKind::Recv || data.is_removed() {
            continue;
        }
        let operand_types: Vec<TensorType> =
            data.operands().iter().map(|&v| f.ty(v).clone()).collect();
        let fail = |f: &Function, error: ShapeError| InferError {
            op,
            op_desc: crate::verify::describe_op(f, op),
            loc: f.op(op).loc.clone(),
            error,
        };
        let types = match infer(data.kind, &data.attrs, &operand_types) {
            Ok(t) => t,
            Err(e) => return Err(fail(f, e)),
        };
        let results = data.results().to_vec();
        if types.len() != results.len() {
            let e = ShapeError(format!(
                "op has {} results but inference gives {}",
                results.len(),
                types.len()
            ));
            return Err(fail(f, e));
        }
        for (v, ty) in results.into_iter().zip(types) {
            f.set_type(v, ty);
        }
    }
    Ok(())
}

/// Replace the batch dimension `?` by `n` in every argument type (and every `recv`
/// annotation, which inference cannot derive), then re-infer every function.
pub fn bind_batch(m: &mut Module, n: u64) -> Result<(), BindBatchError> {
    if n == 0 {
        return Err(BindBatchError::ZeroBatch);
    }
    for f in &mut m.functions {
        let args: Vec<_> = f.arg_values().collect();
        for v in args {
            let ty = f.ty(v).bind_batch(n);
            if let Err(e) = ty.check_size() {
                return Err(BindBatchError::Size {
                    function: f.name.clone(),
                    value: f.value(v).name.clone(),
                    error: e,
                });
            }
            f.set_type(v, ty);
        }
        let recvs: Vec<_> = f
            .ops()
            .iter()
            .filter(|o| o.index() < f.num_op_slots() && f.op(**o).kind == OpKind::Recv)
            .flat_map(|&o| f.op(o).results().to_vec())
            .collect();
        for v in recvs {
            let ty = f.ty(v).bind_batch(n);
            f.set_type(v, ty);
        }
        infer_function(f).map_err(|error| BindBatchError::Infer {
            function: f.name.clone(),
            error,
        })?;
    }
    Ok(())
}

// ---- helpers shared by the rule files ----

/// Resolve a possibly negative axis against `rank` (valid: `-rank..rank`).
pub(crate) fn norm_axis(axis: i64, rank: usize, what: &str) -> Res<usize> {
    let r = rank as i64;
    if axis < -r || axis >= r {
        if rank == 0 {
            bail!("{what} = {axis} is out of range for a rank-0 operand");
        }
        bail!(
            "{what} = {axis} is out of range for rank {rank} (valid: {} to {})",
            -r,
            r - 1
        );
    }
    Ok(if axis < 0 {
        (axis + r) as usize
    } else {
        axis as usize
    })
}

/// Resolve a list of axes, rejecting repeats.
pub(crate) fn norm_axes(axes: &[i64], rank: usize, name: &str) -> Res<Vec<usize>> {
    let mut out = Vec::with_capacity(axes.len());
    for (i, &a) in axes.iter().enumerate() {
        let n = norm_axis(a, rank, &format!("'{name}' entry {i}"))?;
        if out.contains(&n) {
            bail!("'{name}' = {axes:?} names axis {n} twice");
        }
        out.push(n);
    }
    Ok(out)
}

/// `dim 0 needs a known size, but it is the batch dimension ?` with a leading context.
pub(crate) fn batch_err(context: impl fmt::Display) -> ShapeError {
    ShapeError(format!(
        "{context} needs a known size, but it is the batch dimension `?`"
    ))
}

/// Element type classes for operand checks.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Elem {
    Float,
    /// Anything but i1.
    Numeric,
    Integer,
    Bool,
}

pub(crate) fn check_elem(t: &TensorType, index: usize, elem: Elem) -> Res<()> {
    let (ok, what) = match elem {
        Elem::Float => (t.dtype.is_float(), "a float"),
        Elem::Numeric => (t.dtype != DType::Bool, "a numeric (not i1)"),
        Elem::Integer => (t.dtype.is_int(), "an integer"),
        Elem::Bool => (t.dtype == DType::Bool, "the i1"),
    };
    if !ok {
        bail!("operand {index} must have {what} element type, got {t}");
    }
    Ok(())
}

/// Operand `index` must have the same element type as operand `base`.
pub(crate) fn same_dtype(ops: &[TensorType], base: usize, index: usize) -> Res<()> {
    if ops[index].dtype != ops[base].dtype {
        bail!(
            "operand {index} has element type {} but operand {base} has {}",
            ops[index].dtype,
            ops[base].dtype
        );
    }
    Ok(())
}

pub(crate) fn min_rank(t: &TensorType, index: usize, rank: usize, what: &str) -> Res<()> {
    if t.rank() < rank {
        bail!("operand {index} ({what}) must have rank >= {rank}, got {t}");
    }
    Ok(())
}

/// A computed size as a dim, rejecting negative or absurdly large results.
pub(crate) fn size_dim(v: i128, context: impl fmt::Display) -> Res<Dim> {
    match u64::try_from(v) {
        Ok(n) => Ok(Dim::Known(n)),
        Err(_) if v < 0 => bail!("{context}: the size would be {v}"),
        Err(_) => bail!("{context}: the size {v} is too large"),
    }
}

/// `[2, ?, 3]`, for messages.
pub(crate) fn dims_str(dims: &[Dim]) -> String {
    let parts: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
    format!("[{}]", parts.join(", "))
}
