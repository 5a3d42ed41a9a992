//! The cost of one op: FLOPs and bytes from its kind, attributes and static types.
//!
//! Counting rules (one multiply-add is 2 FLOPs):
//!
//! - Bytes: `bytes_read` is the sum of the operand sizes, `bytes_written` and
//!   `output_bytes` the sum of the result sizes (element sizes from
//!   [`DType::size_bytes`]). Views (`reshape`, `squeeze`, `flatten`, ...) are counted as
//!   copies, an upper bound for code that may make them free; a `slice` reads only its
//!   window (what it writes). `send` reads its tensor and
//!   writes nothing; `recv` writes its tensor (the link time is [`super::comm_time`]'s).
//! - Contractions: `matmul` 2·K·|y| (= 2·M·N·K·batch); `gemm` 2·M·N·K, plus M·N for
//!   `alpha` ≠ 1, plus M·N for adding `c` (and M·N more for `beta` ≠ 1; nothing when
//!   `beta` = 0); `conv` 2·|y|·(C/g)·Πk (= 2·N·M·(C/g)·Πk·Πout), `conv_transpose`
//!   2·|x|·(M/g)·Πk, `conv_grad_weight` 2·N·Πout·|dw|, each plus |y| for a bias.
//! - Elementwise: per result element, 1 FLOP for arithmetic, comparisons, logic, `div`,
//!   `sqrt`, `reciprocal`, casts; [`TRANSCENDENTAL_FLOPS`] for `exp log erf tanh sin cos
//!   pow`; composites add their parts (`sigmoid` = exp + add + div, `gelu` = erf + 4,
//!   tanh-`gelu` = tanh + 7, `softplus` = exp + log + add, ...). `identity` and inference
//!   `dropout` are 0 (copies).
//! - Reductions: one FLOP per input element (`reduce_mean` adds one division per output;
//!   `reduce_log_sum_exp` is exp + 3 per input element — max, subtract, sum — plus a log
//!   per output).
//! - Pools: |y|·Πk for `max_pool`, |y|·(Πk + 1) for `avg_pool`, |x| (+|y|) for the global
//!   forms; `max_pool_grad` |dy|·(Πk + 1) (re-find the maximum, accumulate),
//!   `avg_pool_grad` |dy|·(Πk + 1).
//! - Normalisations, per element of x: `softmax` exp + 4 (max, subtract, sum, divide),
//!   `log_softmax` exp + 4 plus a log per row, `softmax_cross_entropy` as `log_softmax` plus
//!   2 per row, its gradient exp + 6; `batch_norm` (inference form) 3 plus 3 per channel;
//!   `layer_norm` / `instance_norm` 8 (mean 1, variance 3, normalise 4; 7 without bias)
//!   plus sqrt + 2 per normalised group; `lrn` 2·size + pow + 3. `label_logit` is 2 per
//!   result (a range check and a select) and reads only the labels and one logit per row;
//!   `label_logit_grad` 1 per element it writes (2 with a base to add to);
//!   `log_sum_exp_grad` exp + 2 per element of x.
//! - Data movement, constants, `send`/`recv`, `slice_grad`: 0 FLOPs; `gather_grad` one add
//!   per element of dy.

use std::ops::{Add, AddAssign};

use ppir::ops::attrs::{
    AvgPoolAttrs, AvgPoolGradAttrs, DropoutAttrs, GeluAttrs, GemmAttrs, LayerNormAttrs, LrnAttrs,
    MaxPoolAttrs, SoftmaxAttrs,
};
use ppir::ops::OpAttrs;
use ppir::{Attrs, OpKind, TensorType};

use super::CostError;

/// FLOPs charged per element for a transcendental function (`exp`, `log`, `erf`, `tanh`,
/// `sin`, `cos`, `pow`): a rough stand-in for the short polynomial or special-function
/// unit sequence these compile to. Division and square root count 1, as is conventional.
pub const TRANSCENDENTAL_FLOPS: f64 = 4.0;

const T: f64 = TRANSCENDENTAL_FLOPS;

/// The work of one op (or a sum of ops).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct OpCost {
    /// Floating-point (or integer) operations.
    pub flops: f64,
    /// Bytes of all operands.
    pub bytes_read: f64,
    /// Bytes of all results.
    pub bytes_written: f64,
    /// Bytes the op's results occupy (what a stage keeps if a result is stashed).
    pub output_bytes: f64,
}

impl OpCost {
    /// Bytes moved to and from memory: read plus written.
    pub fn bytes(&self) -> f64 {
        self.bytes_read + self.bytes_written
    }

    /// FLOPs per byte moved (0 for an op that moves nothing).
    pub fn arithmetic_intensity(&self) -> f64 {
        let b = self.bytes();
        if b > 0.0 {
            self.flops / b
        } else {
            0.0
        }
    }
}

impl Add for OpCost {
    type Output = OpCost;
    fn add(mut self, rhs: OpCost) -> OpCost {
        self += rhs;
        self
    }
}

impl AddAssign for OpCost {
    fn add_assign(&mut self, rhs: OpCost) {
        self.flops += rhs.flops;
        self.bytes_read += rhs.bytes_read;
        self.bytes_written += rhs.bytes_written;
        self.output_bytes += rhs.output_bytes;
    }
}

impl std::iter::Sum for OpCost {
    fn sum<I: Iterator<Item = OpCost>>(iter: I) -> OpCost {
        iter.fold(OpCost::default(), |a, b| a + b)
    }
}

/// Why the cost of an op is undefined (the caller adds which op).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum OpCostError {
    #[error("type {ty} has a symbolic dimension; bind the batch first (bind-batch{{size=N}})")]
    Symbolic { ty: TensorType },
    #[error(transparent)]
    Attr(#[from] ppir::attr::AttrError),
    #[error("expected an operand {index}, found {count} operand(s)")]
    MissingOperand { index: usize, count: usize },
    #[error("expected a result {index}, found {count} result(s)")]
    MissingResult { index: usize, count: usize },
    /// `what` names the operand or result (`a`, `w`, `dw`).
    #[error("{what} has rank {rank}, expected more than {index}")]
    Rank {
        what: &'static str,
        rank: usize,
        index: usize,
    },
    #[error("matmul of a scalar")]
    ScalarMatMul,
    #[error("axis {axis} out of range for rank {rank}")]
    Axis { axis: i64, rank: usize },
}

type Res<T> = Result<T, OpCostError>;

fn shape(ty: &TensorType) -> Res<Vec<u64>> {
    ty.static_shape()
        .ok_or_else(|| OpCostError::Symbolic { ty: ty.clone() })
}

/// Product of dimensions, in f64 so huge shapes cannot overflow.
fn volume(dims: &[u64]) -> f64 {
    dims.iter().map(|&d| d as f64).product()
}

fn numel(ty: &TensorType) -> Res<f64> {
    Ok(volume(&shape(ty)?))
}

fn bytes(ty: &TensorType) -> Res<f64> {
    Ok(numel(ty)? * ty.dtype.size_bytes() as f64)
}

/// The typed attribute view `T` of `attrs`.
fn view<T: OpAttrs>(attrs: &Attrs) -> Res<T> {
    Ok(T::of(attrs)?)
}

/// Operand `i`, or an error naming how many the op has.
fn operand<'a>(tys: &[&'a TensorType], i: usize) -> Res<&'a TensorType> {
    tys.get(i).copied().ok_or(OpCostError::MissingOperand {
        index: i,
        count: tys.len(),
    })
}

fn result<'a>(tys: &[&'a TensorType], i: usize) -> Res<&'a TensorType> {
    tys.get(i).copied().ok_or(OpCostError::MissingResult {
        index: i,
        count: tys.len(),
    })
}

/// Dimension `i` of a shape, or an error naming the rank.
fn dim(s: &[u64], i: usize, what: &'static str) -> Res<u64> {
    s.get(i).copied().ok_or(OpCostError::Rank {
        what,
        rank: s.len(),
        index: i,
    })
}

/// Π kernel_shape of a pool.
fn kernel_volume(kernel_shape: &[i64]) -> f64 {
    kernel_shape.iter().map(|&d| d.max(0) as f64).product()
}

/// FLOPs of an op from its kind, attributes and types. The match is exhaustive on
/// purpose: a new op kind does not compile until it has a cost rule.
fn flops(kind: OpKind, attrs: &Attrs, xs: &[&TensorType], ys: &[&TensorType]) -> Res<f64> {
    use OpKind::*;
    let y_numel = |i: usize| -> Res<f64> { numel(result(ys, i)?) };
    let x_numel = |i: usize| -> Res<f64> { numel(operand(xs, i)?) };
    // Elementwise: per-element FLOPs times the number of result elements.
    let per_y = |per: f64| -> Res<f64> { Ok(per * y_numel(0)?) };
    let bias = |i: usize| -> Res<f64> {
        if xs.len() > i {
            y_numel(0)
        } else {
            Ok(0.0)
        }
    };
    Ok(match kind {
        // unary elementwise
        Identity => 0.0,
        Relu | Abs | Neg | Sign | Floor | Ceil | Not | Sqrt | Reciprocal | Cast => per_y(1.0)?,
        LeakyRelu | Shrink | Clip => per_y(2.0)?,
        HardSigmoid | Softsign => per_y(3.0)?,
        Exp | Log | Erf | Tanh | Sin | Cos => per_y(T)?,
        Sigmoid | Elu => per_y(T + 2.0)?,
        Selu => per_y(T + 3.0)?,
        Softplus => per_y(2.0 * T + 1.0)?,
        Gelu => match view::<GeluAttrs>(attrs)?.approximate.as_str() {
            "tanh" => per_y(T + 7.0)?,
            _ => per_y(T + 4.0)?,
        },
        // Training dropout draws a mask (hash + compare) and scales: ~4; otherwise a copy.
        Dropout => {
            if view::<DropoutAttrs>(attrs)?.training {
                per_y(4.0)?
            } else {
                0.0
            }
        }
        // binary, comparison, ternary elementwise
        Add | Sub | Mul | Div | Max | Min | Equal | Less | Greater | LessEqual | GreaterEqual
        | And | Or | Where => per_y(1.0)?,
        Pow => per_y(T)?,
        PRelu => per_y(2.0)?,
        // A remainder is a division, a truncation and a multiply-subtract; floored: + fix-up.
        Mod => per_y(4.0)?,
        // contractions
        MatMul => {
            let a = shape(operand(xs, 0)?)?;
            let k = *a.last().ok_or(OpCostError::ScalarMatMul)?;
            2.0 * k as f64 * y_numel(0)?
        }
        Gemm => {
            let a = shape(operand(xs, 0)?)?;
            let GemmAttrs {
                alpha,
                beta,
                trans_a,
                ..
            } = view(attrs)?;
            let k = if trans_a {
                dim(&a, 0, "a")?
            } else {
                dim(&a, 1, "a")?
            } as f64;
            let mn = y_numel(0)?;
            let mut f = 2.0 * k * mn;
            if alpha != 1.0 {
                f += mn;
            }
            if xs.len() > 2 && beta != 0.0 {
                f += if beta != 1.0 { 2.0 * mn } else { mn };
            }
            f
        }
        Conv => {
            // |w| / M = (C/g)·Πk multiply-adds per output element.
            let w = shape(operand(xs, 1)?)?;
            let m = dim(&w, 0, "w")?.max(1) as f64;
            2.0 * y_numel(0)? * (x_numel(1)? / m) + bias(2)?
        }
        ConvTranspose => {
            // Every input element meets |w| / C = (M/g)·Πk weights.
            let w = shape(operand(xs, 1)?)?;
            let c = dim(&w, 0, "w")?.max(1) as f64;
            2.0 * x_numel(0)? * (x_numel(1)? / c) + bias(2)?
        }
        ConvGradWeight => {
            // dw[M, C/g, k..]: each element sums N·Πout products, and N·Πout = |dy| / M.
            let dw = shape(result(ys, 0)?)?;
            let m = dim(&dw, 0, "dw")?.max(1) as f64;
            2.0 * (x_numel(1)? / m) * y_numel(0)?
        }
        // pools
        MaxPool => y_numel(0)? * kernel_volume(&view::<MaxPoolAttrs>(attrs)?.kernel_shape),
        AvgPool => {
            let k = kernel_volume(&view::<AvgPoolAttrs>(attrs)?.kernel_shape);
            y_numel(0)? * (k + 1.0)
        }
        GlobalMaxPool => x_numel(0)?,
        GlobalAvgPool => x_numel(0)? + y_numel(0)?,
        MaxPoolGrad => {
            let k = kernel_volume(&view::<MaxPoolAttrs>(attrs)?.kernel_shape);
            x_numel(1)? * (k + 1.0)
        }
        AvgPoolGrad => {
            let k = kernel_volume(&view::<AvgPoolGradAttrs>(attrs)?.kernel_shape);
            x_numel(0)? * (k + 1.0)
        }
        // normalisations
        Softmax => (T + 4.0) * x_numel(0)?,
        LogSoftmax => {
            let axis = view::<SoftmaxAttrs>(attrs)?.axis;
            (T + 4.0) * x_numel(0)? + T * rows(operand(xs, 0)?, axis)?
        }
        SoftmaxCrossEntropy => (T + 4.0) * x_numel(0)? + (T + 2.0) * rows(operand(xs, 0)?, -1)?,
        SoftmaxCrossEntropyGrad => (T + 6.0) * x_numel(0)?,
        LabelLogit => 2.0 * y_numel(0)?,
        LabelLogitGrad => y_numel(0)? * if xs.len() > 2 { 2.0 } else { 1.0 },
        LogSumExpGrad => (T + 2.0) * y_numel(0)?,
        BatchNorm => {
            let x = shape(operand(xs, 0)?)?;
            let c = x.get(1).copied().unwrap_or(1) as f64;
            3.0 * x_numel(0)? + 3.0 * c
        }
        InstanceNorm => {
            let x = shape(operand(xs, 0)?)?;
            let groups = volume(&x[..x.len().min(2)]);
            8.0 * x_numel(0)? + 3.0 * groups
        }
        LayerNorm => {
            let x = shape(operand(xs, 0)?)?;
            let axis = view::<LayerNormAttrs>(attrs)?.axis;
            let a = norm_axis(axis, x.len(), true)?;
            let groups = volume(&x[..a]);
            let per = if xs.len() > 2 { 8.0 } else { 7.0 };
            per * x_numel(0)? + 3.0 * groups
        }
        Lrn => {
            let size = view::<LrnAttrs>(attrs)?.size;
            (2.0 * size.max(0) as f64 + T + 3.0) * x_numel(0)?
        }
        // reductions
        ReduceSum | ReduceMax | ReduceMin => x_numel(0)?,
        ReduceMean => x_numel(0)? + y_numel(0)?,
        ReduceLogSumExp => (T + 3.0) * x_numel(0)? + T * y_numel(0)?,
        // data movement
        Reshape | Transpose | Concat | Split | Slice | Gather | Expand | Pad | Tile | Squeeze
        | Unsqueeze | Flatten | SliceGrad | Constant => 0.0,
        GatherGrad => x_numel(1)?,
        // communication: the link time is comm_time's
        Send | Recv => 0.0,
        // the sum of the arriving parts
        AllReduce => per_y(1.0)?,
        // a shard's sum arrives (reduce_scatter); copies of a shard or of the parameter
        ReduceScatter | Shard | AllGather => per_y(1.0)?,
    })
}

/// `axis` (negative counts from the end) as an index below `rank` (or equal to it when
/// `inclusive`).
fn norm_axis(axis: i64, rank: usize, inclusive: bool) -> Res<usize> {
    let a = if axis < 0 { axis + rank as i64 } else { axis };
    let limit = if inclusive {
        rank as i64
    } else {
        rank as i64 - 1
    };
    if a < 0 || a > limit {
        return Err(OpCostError::Axis { axis, rank });
    }
    Ok(a as usize)
}

/// Number of rows of a softmax-like op over `axis`: |x| / x[axis] (1 for a scalar).
fn rows(x: &TensorType, axis: i64) -> Res<f64> {
    let s = shape(x)?;
    if s.is_empty() {
        return Ok(1.0);
    }
    let a = norm_axis(axis, s.len(), false)?;
    Ok(volume(&s) / s[a].max(1) as f64)
}

/// The cost of an op of `kind` with `attrs`, operand types `operands` and result types
/// `results` (all static). See the module documentation for the counting rules.
pub fn op_cost_of(
    kind: OpKind,
    attrs: &Attrs,
    operands: &[&TensorType],
    results: &[&TensorType],
) -> Result<OpCost, CostError> {
    cost(kind, attrs, operands, results).map_err(|source| CostError::Invalid {
        what: kind.to_string(),
        source,
    })
}

/// [`op_cost_of`] with an error that does not name the op (the caller adds it).
pub(super) fn cost(
    kind: OpKind,
    attrs: &Attrs,
    operands: &[&TensorType],
    results: &[&TensorType],
) -> Res<OpCost> {
    let bytes_written = results.iter().map(|t| bytes(t)).sum::<Res<f64>>()?;
    let bytes_read = if kind == OpKind::LabelLogit {
        // The labels and the one logit of each row.
        bytes(operand(operands, 1)?)? + bytes_written
    } else if kind == OpKind::Slice {
        // The window it copies.
        bytes_written
    } else {
        operands.iter().map(|t| bytes(t)).sum::<Res<f64>>()?
    };
    Ok(OpCost {
        flops: flops(kind, attrs, operands, results)?,
        bytes_read,
        bytes_written,
        output_bytes: bytes_written,
    })
}
