//! The reference interpreter: runs any function of the IR on the CPU, one op at a time.
//!
//! It is the oracle for everything generated later, so it favours the obvious
//! implementation of each op's ONNX meaning (see [`crate::ops`]) over speed; convolution
//! and matrix products still use loop orders that stream contiguous memory, so real models
//! (ResNet-50, VGG-19 at batch 1) stay practical in optimised test builds (about 1 to 3
//! GMAC/s per convolution layer on one core, single-threaded).
//!
//! Values are [`Tensor`]s (floats held as f64, integers and bools as i64). With
//! [`Precision::Typed`] every float result is rounded to its dtype after each op, so an
//! f32 program behaves as f32 elementwise (an op may accumulate in f64 internally); with
//! [`Precision::F64`] nothing is rounded, for finite-difference gradient checks. Integer
//! results always wrap to their width.
//!
//! Entry points: [`eval_op`] (one op), [`run_function`] (a whole body, with a [`Comm`]
//! for `send`/`recv`), [`bind_args`] (arguments from named inputs and module weights).
//!
//! ```
//! use ppir::interp::{run_function, InterpOptions};
//! use ppir::{ArgKind, DType, Function, NewOp, OpKind, Tensor, TensorType};
//!
//! let ty = TensorType::of(DType::F32, &[3]);
//! let mut f = Function::new("main");
//! let x = f.add_arg("x", ty.clone(), ArgKind::Input);
//! let y = f.push(NewOp::new(OpKind::Relu, vec![x], vec![ty]));
//! f.set_results(vec![y]);
//! let x = Tensor::from_f32(vec![3], vec![-1.0, 0.5, 2.0]);
//! let out = run_function(&f, vec![x], &InterpOptions::default(), None).unwrap();
//! assert_eq!(out[0].as_f64().unwrap(), &[0.0, 0.5, 2.0]);
//! ```

mod conv;
mod elementwise;
mod erf;
mod grad;
mod linalg;
mod movement;
mod norm;
mod pool;
mod reduce;
pub mod rng;
pub(crate) mod util;

#[cfg(test)]
mod grad_tests;
#[cfg(test)]
mod tests;

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Write as _;

pub use erf::erf;
pub use rng::{dropout_keep, dropout_uniform};

use crate::attr::Attrs;
use crate::module::{ArgKind, Function, Module, ValueId};
use crate::ops::attrs::*;
use crate::ops::{OpAttrs, OpClass, OpKind};
use crate::tensor::{round_to, wrap_int, Tensor, TensorData};
use crate::types::{DType, TensorType};
use util::{fail, OpFail, OpResult};

/// How float results are rounded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Precision {
    /// Round every float result to its dtype (f32, f16, bf16) after each op.
    #[default]
    Typed,
    /// Never round: every float is an f64 (finite-difference gradient checks).
    F64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InterpOptions {
    pub precision: Precision,
}

/// Moves tensors between pipeline stages for `send` / `recv`.
pub trait Comm {
    fn send(&mut self, peer: u32, channel: i64, t: Tensor) -> Result<(), CommError>;
    /// Receive a tensor of type `ty` (its `?` dimensions are whatever the sender sent).
    fn recv(&mut self, peer: u32, channel: i64, ty: &TensorType) -> Result<Tensor, CommError>;
    /// [`Comm::send`] of a tensor given as the dense native bytes that generated code holds
    /// (`dtype`, `shape`), so a transport can move them without converting them (from GPU
    /// memory to GPU memory, say); `None` when this communicator takes tensors only (the
    /// caller converts and calls `send`).
    fn send_bytes(
        &mut self,
        peer: u32,
        channel: i64,
        dtype: crate::DType,
        shape: &[usize],
        bytes: &[u8],
    ) -> Option<Result<(), CommError>> {
        let _ = (peer, channel, dtype, shape, bytes);
        None
    }
    /// [`Comm::recv`] into `out`, the dense native bytes of a tensor of the static type
    /// `ty`; `None` when this communicator gives tensors only.
    fn recv_bytes(
        &mut self,
        peer: u32,
        channel: i64,
        ty: &TensorType,
        out: &mut [u8],
    ) -> Option<Result<(), CommError>> {
        let _ = (peer, channel, ty, out);
        None
    }
    /// The sum of `t` over the participants of an `all_reduce` op (see
    /// [`AllReduceAttrs`]). The default: a communicator without collectives.
    fn all_reduce(&mut self, op: &AllReduceAttrs, t: Tensor) -> Result<Tensor, CommError> {
        let _ = t;
        Err(CommError::Transport {
            peer: op
                .stages
                .first()
                .and_then(|&s| u32::try_from(s).ok())
                .unwrap_or(0),
            channel: op.channel,
            message: "this communicator runs no collectives (all_reduce)".into(),
        })
    }
    /// ZeRO-1 (see [`ShardAttrs`]): `reduce_scatter` gives this replica's shard of the sum
    /// of `t` over the replicas, `shard` its shard of `t` (no communication), `all_gather`
    /// the whole parameter from every replica's shard `t`. The default: a communicator
    /// without collectives.
    fn sharded(&mut self, kind: OpKind, op: &ShardAttrs, t: Tensor) -> Result<Tensor, CommError> {
        let _ = t;
        Err(CommError::Transport {
            peer: 0,
            channel: op.channel,
            message: format!("this communicator runs no collectives ({kind})"),
        })
    }
}

/// Why a [`Comm`] could not send or receive. `peer` is the stage at the other end.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum CommError {
    /// Another device failed and the transport was stopped: this failure is only its
    /// consequence. `reason` says which device failed and why.
    #[error("stopped because another device failed: {reason}")]
    Aborted { peer: u32, reason: String },
    /// Nothing arrived from `peer` in time. `value` is the IR value the channel carries,
    /// when the communicator knows it.
    #[error(
        "waited {:.1} s for %{} (channel {channel}) from stage {peer}, micro-batch {micro_batch} (stage {peer} has not sent it)",
        .waited.as_secs_f64(),
        .value.as_deref().unwrap_or("?")
    )]
    Timeout {
        peer: u32,
        channel: i64,
        value: Option<String>,
        micro_batch: u32,
        waited: std::time::Duration,
    },
    /// `peer` is not a stage of the run.
    #[error("{} unknown stage {peer}", if *.sending { "send to" } else { "receive from" })]
    UnknownStage { peer: u32, sending: bool },
    /// What arrived is not of the type the receiver expects.
    #[error("received {got} on channel {channel}, expected {expected}")]
    Mismatch {
        peer: u32,
        channel: i64,
        got: String,
        expected: String,
    },
    /// The transport failed otherwise.
    #[error("{message}")]
    Transport {
        peer: u32,
        channel: i64,
        message: String,
    },
}

impl CommError {
    /// Whether the failure is only the consequence of another device's failure.
    pub fn is_aborted(&self) -> bool {
        matches!(self, CommError::Aborted { .. })
    }
}

/// What went wrong, and where.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum InterpError {
    /// An op failed: `"pp.gather" %5 (loc "embed"): index 70 out of range ...`.
    #[error("{}: {message}", describe_op(*kind, value.as_deref(), loc.as_deref()))]
    Op {
        kind: OpKind,
        value: Option<String>,
        loc: Option<String>,
        message: String,
    },
    #[error("function @{function}: expected {expected} arguments, got {got}")]
    ArgCount {
        function: String,
        expected: usize,
        got: usize,
    },
    #[error("function @{function}: argument {index} %{name} must be {expected}, got {got}")]
    ArgType {
        function: String,
        index: usize,
        name: String,
        expected: TensorType,
        got: String,
    },
    #[error("function @{function}: missing input `{name}` (argument {index})")]
    MissingInput {
        function: String,
        name: String,
        index: usize,
    },
    #[error("function @{function}: the module has no weight `{name}` for {kind} argument {index}")]
    MissingWeight {
        function: String,
        name: String,
        kind: &'static str,
        index: usize,
    },
    #[error("function @{function}: {message}")]
    Function { function: String, message: String },
    /// A `send` or `recv` op failed in the communicator.
    #[error(
        "{}: {} stage {peer} on channel {channel} failed: {source}",
        describe_op(*kind, value.as_deref(), loc.as_deref()),
        match kind { OpKind::Send => "send to", OpKind::AllReduce => "all-reduce with", OpKind::ReduceScatter => "reduce-scatter with", OpKind::AllGather => "all-gather with", OpKind::Shard => "shard of", _ => "recv from" }
    )]
    Comm {
        kind: OpKind,
        value: Option<String>,
        loc: Option<String>,
        peer: u32,
        channel: i64,
        source: Box<CommError>,
    },
}

impl InterpError {
    /// The communicator's error, when a `send` or `recv` failed.
    pub fn comm_error(&self) -> Option<&CommError> {
        match self {
            InterpError::Comm { source, .. } => Some(source.as_ref()),
            _ => None,
        }
    }
}

/// `"pp.kind" %value (loc "name")`, leaving out what is unknown.
fn describe_op(kind: OpKind, value: Option<&str>, loc: Option<&str>) -> String {
    let mut s = format!("\"{kind}\"");
    if let Some(v) = value {
        let _ = write!(s, " %{v}");
    }
    if let Some(l) = loc {
        let _ = write!(s, " (loc \"{l}\")");
    }
    s
}

/// Describe a tensor's type for messages (`tensor<2x3xf32>`).
fn tensor_desc(t: &Tensor) -> String {
    t.tensor_type().to_string()
}

/// Whether a tensor has the dtype of `ty` and a shape it admits (`?` accepts any size).
fn fits(t: &Tensor, ty: &TensorType) -> bool {
    let storage_ok = matches!(
        (&t.data, t.dtype.is_float()),
        (TensorData::Float(_), true) | (TensorData::Int(_), false)
    );
    t.dtype == ty.dtype
        && storage_ok
        && t.data.len() == t.num_elements()
        && t.shape.len() == ty.dims.len()
        && t.shape
            .iter()
            .zip(&ty.dims)
            .all(|(&n, d)| d.known().is_none_or(|k| k == n as u64))
}

/// How a tensor that does not fit is described in messages.
fn misfit(t: &Tensor) -> String {
    format!("a tensor of type {}", tensor_desc(t))
}

/// Evaluate one op on concrete operands. `result_types` are the declared result types;
/// result shapes are computed from the operands and checked against them (a `?` dimension
/// admits any size), and result dtypes must match. `send` and `recv` need a [`Comm`] and
/// are only run by [`run_function`].
pub fn eval_op(
    kind: OpKind,
    attrs: &Attrs,
    inputs: &[&Tensor],
    result_types: &[TensorType],
    opts: &InterpOptions,
) -> Result<Vec<Tensor>, InterpError> {
    eval_checked(kind, attrs, inputs, result_types, opts).map_err(|OpFail(message)| {
        InterpError::Op {
            kind,
            value: None,
            loc: None,
            message,
        }
    })
}

fn eval_checked(
    kind: OpKind,
    attrs: &Attrs,
    inputs: &[&Tensor],
    result_types: &[TensorType],
    opts: &InterpOptions,
) -> OpResult<Vec<Tensor>> {
    if !kind.arity().accepts(inputs.len()) {
        fail!("expected {} operands, got {}", kind.arity(), inputs.len());
    }
    for (i, t) in inputs.iter().enumerate() {
        let consistent = t.data.len() == t.num_elements()
            && matches!(
                (&t.data, t.dtype.is_float()),
                (TensorData::Float(_), true) | (TensorData::Int(_), false)
            );
        if !consistent {
            fail!(
                "operand {i} is malformed: {} tensor of shape {:?} with {} elements",
                t.dtype,
                t.shape,
                t.data.len()
            );
        }
    }
    let n = result_types.len();
    let (results_ok, expected) = match kind {
        OpKind::Send => (n == 0, "no results"),
        OpKind::Split => (n >= 1, "one result per split size"),
        OpKind::Dropout => (n == 1 || n == 2, "1 result, or 2 with the mask"),
        OpKind::LayerNorm => (
            n == 1 || n == 3,
            "1 result, or 3 with the mean and inverse std dev",
        ),
        _ => (n == 1, "1 result"),
    };
    if !results_ok {
        fail!("has {expected}, but {n} are declared");
    }
    // Refuse a result larger than the memory left (an expand to 8e12 elements) here, with
    // the op's name, rather than abort in the allocator. Elements are held as 8 bytes.
    for ty in result_types {
        let Some(count) = ty.num_elements() else {
            continue;
        };
        let bytes = count.saturating_mul(8);
        if let Err(e) = crate::size::check_memory(bytes, || format!("its result {ty}")) {
            fail!("{e}");
        }
    }
    let outs = compute(kind, attrs, inputs, result_types)?;
    debug_assert_eq!(outs.len(), n, "{kind} produced the wrong number of results");
    outs.into_iter()
        .zip(result_types)
        .enumerate()
        .map(|(i, (t, ty))| finish(t, ty, i, n, opts))
        .collect()
}

/// Check a computed result against its declared type, then round (floats, `Typed`) or
/// wrap (integers) to the dtype.
fn finish(
    mut t: Tensor,
    ty: &TensorType,
    index: usize,
    n: usize,
    opts: &InterpOptions,
) -> OpResult<Tensor> {
    if !fits(&t, ty) {
        let got = misfit(&t);
        let which = if n == 1 {
            "the result".to_string()
        } else {
            format!("result {index}")
        };
        fail!("{which} is {got}, but the op declares {ty}");
    }
    match &mut t.data {
        TensorData::Float(v) => {
            if opts.precision == Precision::Typed && t.dtype != DType::F64 {
                for x in v.iter_mut() {
                    *x = round_to(t.dtype, *x);
                }
            }
        }
        TensorData::Int(v) => {
            if t.dtype != DType::I64 {
                for x in v.iter_mut() {
                    *x = wrap_int(t.dtype, *x);
                }
            }
        }
    }
    Ok(t)
}

/// Dispatch on the op kind (exhaustive: a new op kind must be given a meaning here).
fn compute(
    kind: OpKind,
    attrs: &Attrs,
    inputs: &[&Tensor],
    result_types: &[TensorType],
) -> OpResult<Vec<Tensor>> {
    use OpKind::*;
    let one = |t: Tensor| Ok(vec![t]);
    match kind {
        Relu | LeakyRelu | Elu | Selu | Sigmoid | HardSigmoid | Tanh | Gelu | Erf | Exp | Log
        | Sqrt | Abs | Neg | Sign | Reciprocal | Softplus | Softsign | Floor | Ceil | Sin | Cos
        | Not | Identity | Shrink | Clip | Cast => elementwise::unary(kind, attrs, inputs[0]),
        Dropout => elementwise::dropout(&DropoutAttrs::of(attrs)?, inputs, result_types),
        Add | Sub | Mul | Div | Pow | Max | Min | PRelu => {
            one(elementwise::binary(kind, inputs[0], inputs[1])?)
        }
        Mod => one(elementwise::modulo(
            ModAttrs::of(attrs)?.fmod,
            inputs[0],
            inputs[1],
        )?),
        Equal | Less | Greater | LessEqual | GreaterEqual => {
            one(elementwise::compare(kind, inputs[0], inputs[1])?)
        }
        And | Or => one(elementwise::logical(kind, inputs[0], inputs[1])?),
        Where => one(elementwise::where_(inputs[0], inputs[1], inputs[2])?),
        MatMul => one(linalg::matmul(inputs[0], inputs[1])?),
        Gemm => one(linalg::gemm(&GemmAttrs::of(attrs)?, inputs)?),
        Conv => one(conv::conv(&ConvAttrs::of(attrs)?, inputs)?),
        ConvTranspose => one(conv::conv_transpose(
            &ConvTransposeAttrs::of(attrs)?,
            inputs,
        )?),
        MaxPool => {
            let a = MaxPoolAttrs::of(attrs)?;
            one(pool::pool(kind, (&a).into(), inputs[0])?)
        }
        AvgPool => {
            let a = AvgPoolAttrs::of(attrs)?;
            one(pool::pool(kind, (&a).into(), inputs[0])?)
        }
        GlobalAvgPool | GlobalMaxPool => one(pool::global_pool(kind, inputs[0])?),
        BatchNorm => one(norm::batch_norm(&BatchNormAttrs::of(attrs)?, inputs)?),
        InstanceNorm => one(norm::instance_norm(&InstanceNormAttrs::of(attrs)?, inputs)?),
        LayerNorm => norm::layer_norm(&LayerNormAttrs::of(attrs)?, inputs, result_types),
        Lrn => one(norm::lrn(&LrnAttrs::of(attrs)?, inputs[0])?),
        Softmax | LogSoftmax => one(norm::softmax(kind, &SoftmaxAttrs::of(attrs)?, inputs[0])?),
        ReduceSum | ReduceMean | ReduceMax | ReduceMin | ReduceLogSumExp => {
            one(reduce::reduce(kind, &ReduceAttrs::of(attrs)?, inputs[0])?)
        }
        Reshape => one(movement::reshape(&ShapeAttrs::of(attrs)?, inputs[0])?),
        Transpose => one(movement::transpose(&TransposeAttrs::of(attrs)?, inputs[0])?),
        Concat => one(movement::concat(&ConcatAttrs::of(attrs)?, inputs)?),
        Split => movement::split(&SplitAttrs::of(attrs)?, inputs[0], result_types.len()),
        Slice => one(movement::slice(&SliceAttrs::of(attrs)?, inputs[0])?),
        Gather => {
            let axis = GatherAttrs::of(attrs)?.axis;
            one(movement::gather(axis, inputs[0], inputs[1])?)
        }
        Expand => one(movement::expand(&ShapeAttrs::of(attrs)?, inputs[0])?),
        Pad => one(movement::pad(&PadAttrs::of(attrs)?, inputs[0])?),
        Tile => one(movement::tile(&TileAttrs::of(attrs)?, inputs[0])?),
        Squeeze => one(movement::squeeze(&SqueezeAttrs::of(attrs)?, inputs[0])?),
        Unsqueeze => one(movement::unsqueeze(&UnsqueezeAttrs::of(attrs)?, inputs[0])?),
        Flatten => one(movement::flatten(&FlattenAttrs::of(attrs)?, inputs[0])?),
        Constant => one(movement::constant(attrs, &result_types[0])?),
        SoftmaxCrossEntropy => {
            let a = CrossEntropyAttrs::of(attrs)?;
            one(grad::softmax_cross_entropy(&a, inputs)?)
        }
        SoftmaxCrossEntropyGrad => {
            let a = CrossEntropyAttrs::of(attrs)?;
            one(grad::softmax_cross_entropy_grad(&a, inputs)?)
        }
        LogSumExpGrad => one(reduce::log_sum_exp_grad(&ReduceAttrs::of(attrs)?, inputs)?),
        LabelLogit => one(grad::label_logit(&LabelLogitAttrs::of(attrs)?, inputs)?),
        LabelLogitGrad => one(grad::label_logit_grad(
            &LabelLogitGradAttrs::of(attrs)?,
            inputs,
        )?),
        MaxPoolGrad => {
            let a = MaxPoolAttrs::of(attrs)?;
            one(grad::max_pool_grad(&a, inputs[0], inputs[1])?)
        }
        AvgPoolGrad => one(grad::avg_pool_grad(
            &AvgPoolGradAttrs::of(attrs)?,
            inputs[0],
        )?),
        ConvGradWeight => {
            let a = ConvGradWeightAttrs::of(attrs)?;
            one(grad::conv_grad_weight(&a, inputs[0], inputs[1])?)
        }
        GatherGrad => {
            let a = GatherGradAttrs::of(attrs)?;
            one(grad::gather_grad(&a, inputs[0], inputs[1])?)
        }
        SliceGrad => one(grad::slice_grad(&SliceGradAttrs::of(attrs)?, inputs[0])?),
        Send | Recv | AllReduce | ReduceScatter | Shard | AllGather => {
            fail!("needs a communicator: run it with run_function and a Comm")
        }
    }
}

/// The `peer` and `channel` attributes of a send/recv.
fn peer_channel(attrs: &Attrs) -> OpResult<(u32, i64)> {
    let CommAttrs { peer, channel } = CommAttrs::of(attrs)?;
    let Ok(peer) = u32::try_from(peer) else {
        fail!("`peer` must be a stage number, got {peer}")
    };
    Ok((peer, channel))
}

/// Run a function body in layout order and return its results.
///
/// Each argument must have the dtype and shape of its declared type (`?` accepts any
/// size). A value is dropped after its last use. `send`/`recv` go through `comm`; running
/// one without a communicator is an error.
pub fn run_function(
    f: &Function,
    args: Vec<Tensor>,
    opts: &InterpOptions,
    comm: Option<&mut dyn Comm>,
) -> Result<Vec<Tensor>, InterpError> {
    run_function_cow(f, args.into_iter().map(Cow::Owned).collect(), opts, comm)
}

/// [`run_function`] with arguments that may be borrowed (weights a caller keeps): a
/// borrowed argument is never copied unless the function returns it.
pub fn run_function_cow(
    f: &Function,
    args: Vec<Cow<'_, Tensor>>,
    opts: &InterpOptions,
    comm: Option<&mut dyn Comm>,
) -> Result<Vec<Tensor>, InterpError> {
    run_function_stats(f, args, opts, comm).map(|(out, _)| out)
}

/// What one run of a function used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunStats {
    /// The most bytes of temporaries live at once: values the function's ops make that
    /// are not among its results (sizes by declared element type, as the memory model
    /// and native code count them), including the results of the op being run. Arguments
    /// and results are the caller's (weights, stash, gradients).
    pub peak_temporary_bytes: u64,
}

/// [`run_function_cow`], also reporting what the run used.
pub fn run_function_stats(
    f: &Function,
    args: Vec<Cow<'_, Tensor>>,
    opts: &InterpOptions,
    mut comm: Option<&mut dyn Comm>,
) -> Result<(Vec<Tensor>, RunStats), InterpError> {
    let function = || f.name.clone();
    if args.len() != f.args().len() {
        return Err(InterpError::ArgCount {
            function: function(),
            expected: f.args().len(),
            got: args.len(),
        });
    }
    let mut values: Vec<Option<Cow<'_, Tensor>>> = vec![None; f.num_values()];
    let mut remaining: Vec<usize> = (0..f.num_values())
        .map(|i| f.users(ValueId(i as u32)).len())
        .collect();
    for (index, (t, &(v, _))) in args.into_iter().zip(f.args()).enumerate() {
        let ty = f.ty(v);
        if !fits(&t, ty) {
            return Err(InterpError::ArgType {
                function: function(),
                index,
                name: f.value(v).name.clone(),
                expected: ty.clone(),
                got: misfit(&t),
            });
        }
        if remaining[v.index()] > 0 {
            values[v.index()] = Some(t);
        }
    }

    // Temporaries: op results that are not function results, by their declared size.
    let temp = crate::memory::temporary_sizes(f);
    let temp_bytes = |v: ValueId| temp[v.index()];
    let (mut live, mut stats) = (0u64, RunStats::default());

    for &op_id in f.ops() {
        let op = f.op(op_id);
        let op_value = || op.results().first().map(|&r| f.value(r).name.clone());
        let op_error = |message: String| InterpError::Op {
            kind: op.kind,
            value: op_value(),
            loc: op.loc.clone(),
            message,
        };
        let comm_error = |peer: u32, channel: i64, source: CommError| InterpError::Comm {
            kind: op.kind,
            value: op_value(),
            loc: op.loc.clone(),
            peer,
            channel,
            source: Box::new(source),
        };
        let result_types: Vec<TensorType> = op.results().iter().map(|&r| f.ty(r).clone()).collect();
        let outs = {
            let mut inputs = Vec::with_capacity(op.operands().len());
            for &v in op.operands() {
                match &values[v.index()] {
                    Some(t) => inputs.push(t.as_ref()),
                    None => {
                        return Err(op_error(format!(
                            "operand %{} has no value here (used before its definition?)",
                            f.value(v).name
                        )))
                    }
                }
            }
            match op.kind.class() {
                OpClass::Comm if op.kind == OpKind::AllReduce => {
                    let a = AllReduceAttrs::of(&op.attrs).map_err(|e| op_error(e.to_string()))?;
                    let peer = a
                        .stages
                        .first()
                        .and_then(|&s| u32::try_from(s).ok())
                        .unwrap_or(0);
                    let Some(comm) = comm.as_deref_mut() else {
                        return Err(op_error(
                            "needs a communicator, and run_function got none".into(),
                        ));
                    };
                    if inputs.len() != 1 || result_types.len() != 1 {
                        return Err(op_error(
                            "all_reduce takes one operand and has one result".into(),
                        ));
                    }
                    let t = comm
                        .all_reduce(&a, inputs[0].clone())
                        .map_err(|e| comm_error(peer, a.channel, e))?;
                    if !fits(&t, &result_types[0]) {
                        return Err(op_error(format!(
                            "the all-reduce gave {}, but the op declares {}",
                            misfit(&t),
                            result_types[0]
                        )));
                    }
                    vec![t]
                }
                OpClass::Comm
                    if matches!(
                        op.kind,
                        OpKind::ReduceScatter | OpKind::Shard | OpKind::AllGather
                    ) =>
                {
                    let a = ShardAttrs::of(&op.attrs).map_err(|e| op_error(e.to_string()))?;
                    let Some(comm) = comm.as_deref_mut() else {
                        return Err(op_error(
                            "needs a communicator, and run_function got none".into(),
                        ));
                    };
                    if inputs.len() != 1 || result_types.len() != 1 {
                        return Err(op_error(format!(
                            "{} takes one operand and has one result",
                            op.kind
                        )));
                    }
                    let t = comm
                        .sharded(op.kind, &a, inputs[0].clone())
                        .map_err(|e| comm_error(0, a.channel, e))?;
                    if !fits(&t, &result_types[0]) {
                        return Err(op_error(format!(
                            "the {} gave {}, but the op declares {}",
                            op.kind,
                            misfit(&t),
                            result_types[0]
                        )));
                    }
                    vec![t]
                }
                OpClass::Comm => {
                    let (peer, channel) =
                        peer_channel(&op.attrs).map_err(|OpFail(m)| op_error(m))?;
                    let Some(comm) = comm.as_deref_mut() else {
                        return Err(op_error(
                            "needs a communicator, and run_function got none".into(),
                        ));
                    };
                    if op.kind == OpKind::Send {
                        if inputs.len() != 1 || !result_types.is_empty() {
                            return Err(op_error(
                                "send takes one operand and has no results".into(),
                            ));
                        }
                        comm.send(peer, channel, inputs[0].clone())
                            .map_err(|e| comm_error(peer, channel, e))?;
                        vec![]
                    } else {
                        if !inputs.is_empty() || result_types.len() != 1 {
                            return Err(op_error(
                                "recv takes no operands and has one result".into(),
                            ));
                        }
                        let ty = &result_types[0];
                        let t = comm
                            .recv(peer, channel, ty)
                            .map_err(|e| comm_error(peer, channel, e))?;
                        if !fits(&t, ty) {
                            return Err(op_error(format!(
                                "received {}, but the op declares {ty}",
                                misfit(&t)
                            )));
                        }
                        vec![t]
                    }
                }
                _ => eval_checked(op.kind, &op.attrs, &inputs, &result_types, opts)
                    .map_err(|OpFail(m)| op_error(m))?,
            }
        };
        let made: u64 = op.results().iter().map(|&r| temp_bytes(r)).sum();
        stats.peak_temporary_bytes = stats.peak_temporary_bytes.max(live + made);
        for (&r, t) in op.results().iter().zip(outs) {
            if remaining[r.index()] > 0 {
                values[r.index()] = Some(Cow::Owned(t));
                live += temp_bytes(r);
            }
        }
        for &v in op.operands() {
            let left = &mut remaining[v.index()];
            if *left == 1 && values[v.index()].is_some() {
                live = live.saturating_sub(temp_bytes(v));
            }
            *left = left.saturating_sub(1);
            if *left == 0 {
                values[v.index()] = None;
            }
        }
    }

    let results = f.results();
    let mut out = Vec::with_capacity(results.len());
    for (i, &r) in results.iter().enumerate() {
        // Move a result out at its last mention in the return list; clone earlier ones.
        let last = !results[i + 1..].contains(&r);
        let t = if last {
            values[r.index()].take()
        } else {
            values[r.index()].clone()
        };
        match t {
            Some(t) => out.push(t.into_owned()),
            None => {
                return Err(InterpError::Function {
                    function: function(),
                    message: format!("returned value %{} was never computed", f.value(r).name),
                })
            }
        }
    }
    Ok((out, stats))
}

/// The arguments of `f` in order: `Input` arguments from `inputs` by name, `Param` and
/// `State` arguments from the module's weights by name.
pub fn bind_args(
    m: &Module,
    f: &Function,
    inputs: &HashMap<String, Tensor>,
) -> Result<Vec<Tensor>, InterpError> {
    f.args()
        .iter()
        .enumerate()
        .map(|(index, &(v, kind))| {
            let name = &f.value(v).name;
            let found = match kind {
                ArgKind::Input => inputs.get(name),
                ArgKind::Param | ArgKind::State => m.weights.get(name),
            };
            match (found, kind) {
                (Some(t), _) => Ok(t.clone()),
                (None, ArgKind::Input) => Err(InterpError::MissingInput {
                    function: f.name.clone(),
                    name: name.clone(),
                    index,
                }),
                (None, _) => Err(InterpError::MissingWeight {
                    function: f.name.clone(),
                    name: name.clone(),
                    kind: kind.name(),
                    index,
                }),
            }
        })
        .collect()
}
