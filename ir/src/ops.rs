//! The op set of ppir and the attribute conventions every consumer agrees on.
//!
//! Ops print as `"pp.<name>"`. Attributes listed below are optional unless marked
//! *required*; the default is given after `=`. Axes may be negative (counted from the end)
//! everywhere. Frontends resolve source-format quirks (ONNX `auto_pad`, opset differences,
//! shape-computing inputs) into these attributes, so the IR itself has one meaning per op.
//!
//! | op | operands | attributes |
//! | --- | --- | --- |
//! | unary math: `relu sigmoid tanh erf exp log sqrt abs neg sign reciprocal softplus softsign floor ceil sin cos not identity` | x | — |
//! | `leaky_relu` | x | `alpha` = 0.01 |
//! | `elu` | x | `alpha` = 1.0 |
//! | `selu` | x | `alpha` = 1.6732632423543772, `gamma` = 1.0507009873554805 |
//! | `gelu` | x | `approximate` = `"none"` (erf form) or `"tanh"` |
//! | `hard_sigmoid` | x | `alpha` = 0.2, `beta` = 0.5 |
//! | `shrink` | x | `bias` = 0.0, `lambd` = 0.5 |
//! | `clip` | x | `min` = -inf, `max` = +inf |
//! | `cast` | x | `to` *required* (element type) |
//! | `dropout` | x, [key `tensor<2xi64>` = (step, micro-batch)] | `ratio` = 0.5, `training` = 0, `seed` = 0; identity unless `training` = 1, then `x · mask / (1 - ratio)` with the mask of [`crate::interp::dropout_keep`] (training needs the key) |
//! | binary, numpy broadcasting: `add sub mul div pow max min prelu` | a, b | — |
//! | comparisons → i1: `equal less greater less_equal greater_equal` | a, b | — |
//! | logical on i1: `and or` | a, b | — |
//! | `where` | cond (i1), x, y | — (three-way broadcasting) |
//! | `matmul` | a, b | — (numpy `matmul`: 1-D promotion, batch broadcasting) |
//! | `gemm` | a, b, \[c\] | `alpha` = 1.0, `beta` = 1.0, `trans_a` = 0, `trans_b` = 0 |
//! | `conv` | x `[N,C,spatial..]`, w `[M,C/group,k..]`, [bias `[M]`] | `strides`, `pads` (all begins then all ends), `dilations`, `group` = 1 |
//! | `conv_transpose` | x `[N,C,spatial..]`, w `[C,M/group,k..]`, [bias `[M]`] | `strides`, `pads`, `dilations`, `output_padding`, `group` = 1 |
//! | `max_pool` | x | `kernel_shape` *required*, `strides`, `pads`, `dilations`, `ceil_mode` = 0 |
//! | `avg_pool` | x | `kernel_shape` *required*, `strides`, `pads`, `dilations`, `ceil_mode` = 0, `count_include_pad` = 0 |
//! | `global_avg_pool`, `global_max_pool` | x | — (spatial dims become 1) |
//! | `batch_norm` | x, scale, bias, mean, var | `epsilon` = 1e-5, `momentum` = 0.9 (ONNX's: the running statistics' weight in training, which autodiff's training mode applies; the op itself is the inference form) |
//! | `instance_norm` | x, scale, bias | `epsilon` = 1e-5 |
//! | `layer_norm` | x, scale, \[bias\] | `axis` = -1 (normalise over axis..rank), `epsilon` = 1e-5 |
//! | `lrn` | x | `size` *required*, `alpha` = 1e-4, `beta` = 0.75, `bias` = 1.0 |
//! | `softmax`, `log_softmax` | x | `axis` = -1 (one axis, opset-13 meaning) |
//! | `reduce_sum reduce_mean reduce_max reduce_min` | x | `axes` = [] (all), `keepdims` = 1 |
//! | `reshape` | x | `shape` *required* (static; at most one -1, no 0) |
//! | `transpose` | x | `perm` = reversed axes |
//! | `concat` | x.. (≥1) | `axis` *required* |
//! | `split` | x | `axis` = 0, `split` *required* (sizes; one result each) |
//! | `slice` | x | `starts`, `ends` *required*, `axes` = 0.., `steps` = 1s (ONNX clamping rules) |
//! | `gather` | data, indices (integer) | `axis` = 0 |
//! | `expand` | x | `shape` *required* (bidirectional broadcast, as ONNX Expand) |
//! | `pad` | x | `pads` *required* (all begins then all ends), `mode` = `"constant"`/`"reflect"`/`"edge"`, `value` = 0.0 |
//! | `tile` | x | `repeats` *required* |
//! | `squeeze` | x | `axes` = [] (all size-1 dims) |
//! | `unsqueeze` | x | `axes` *required* (positions in the result) |
//! | `flatten` | x | `axis` = 1 (result is 2-D) |
//! | `constant` | — | `value` *required* (tensor) |
//! | `softmax_cross_entropy` | logits `[.., C]` (float), labels `[..]` (integer, logits' shape without the last axis) | `ignore_index` (labels equal to it count neither in the sum nor in the mean); result: the scalar mean over positions of `-log_softmax(logits)[label]` (0 if every position is ignored) |
//! | `softmax_cross_entropy_grad` | logits, labels, dloss (scalar) | `ignore_index`; result: `(softmax(logits) - onehot(labels)) · dloss / count`, 0 on ignored positions |
//! | `max_pool_grad` | x, dy (the max_pool result's shape) | as `max_pool`; result: dx, each dy routed to the first maximum of its window |
//! | `avg_pool_grad` | dy | as `avg_pool`, plus `input_shape` *required* (x's full shape); result: dx |
//! | `conv_grad_weight` | x, dy (the conv result's shape) | `strides`, `pads`, `dilations`, `group` as `conv`, plus `kernel_shape` *required* (spatial); result: dw `[M, C/group, k..]` |
//! | `gather_grad` | indices (integer), dy | `axis` = 0, `data_shape` *required*; result: `zeros(data_shape)` with dy added at the gathered positions (negative indices wrap) |
//! | `slice_grad` | dy | `starts`, `ends`, `axes`, `steps` as `slice`, plus `input_shape` *required*; result: `zeros(input_shape)` with dy written where the slice read |
//! | `send` | x | `peer` *required* (stage), `channel` *required*; no results |
//! | `recv` | — | `peer` *required* (stage), `channel` *required*; one result |

use std::fmt;

macro_rules! op_kinds {
    ($($variant:ident => $name:literal),* $(,)?) => {
        /// Every op kind of the IR.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum OpKind { $($variant),* }

        impl OpKind {
            pub const ALL: &'static [OpKind] = &[$(OpKind::$variant),*];

            /// The name without the `pp.` prefix.
            pub fn name(self) -> &'static str {
                match self { $(OpKind::$variant => $name),* }
            }

            /// Look up a kind by its name without the `pp.` prefix.
            pub fn from_name(s: &str) -> Option<OpKind> {
                match s { $($name => Some(OpKind::$variant),)* _ => None }
            }
        }
    };
}

op_kinds! {
    // unary elementwise
    Relu => "relu", LeakyRelu => "leaky_relu", Elu => "elu", Selu => "selu",
    Sigmoid => "sigmoid", HardSigmoid => "hard_sigmoid", Tanh => "tanh", Gelu => "gelu",
    Erf => "erf", Exp => "exp", Log => "log", Sqrt => "sqrt", Abs => "abs", Neg => "neg",
    Sign => "sign", Reciprocal => "reciprocal", Softplus => "softplus", Softsign => "softsign",
    Floor => "floor", Ceil => "ceil", Sin => "sin", Cos => "cos", Not => "not",
    Identity => "identity", Shrink => "shrink", Clip => "clip", Cast => "cast",
    Dropout => "dropout",
    // binary elementwise
    Add => "add", Sub => "sub", Mul => "mul", Div => "div", Pow => "pow", Max => "max",
    Min => "min", PRelu => "prelu",
    Equal => "equal", Less => "less", Greater => "greater", LessEqual => "less_equal",
    GreaterEqual => "greater_equal", And => "and", Or => "or",
    Where => "where",
    // contractions
    MatMul => "matmul", Gemm => "gemm", Conv => "conv", ConvTranspose => "conv_transpose",
    // pooling
    MaxPool => "max_pool", AvgPool => "avg_pool", GlobalAvgPool => "global_avg_pool",
    GlobalMaxPool => "global_max_pool",
    // normalisation
    BatchNorm => "batch_norm", InstanceNorm => "instance_norm", LayerNorm => "layer_norm",
    Lrn => "lrn", Softmax => "softmax", LogSoftmax => "log_softmax",
    // reductions
    ReduceSum => "reduce_sum", ReduceMean => "reduce_mean", ReduceMax => "reduce_max",
    ReduceMin => "reduce_min",
    // data movement
    Reshape => "reshape", Transpose => "transpose", Concat => "concat", Split => "split",
    Slice => "slice", Gather => "gather", Expand => "expand", Pad => "pad", Tile => "tile",
    Squeeze => "squeeze", Unsqueeze => "unsqueeze", Flatten => "flatten",
    Constant => "constant",
    // losses and gradient helpers (made by autodiff)
    SoftmaxCrossEntropy => "softmax_cross_entropy",
    SoftmaxCrossEntropyGrad => "softmax_cross_entropy_grad",
    MaxPoolGrad => "max_pool_grad", AvgPoolGrad => "avg_pool_grad",
    ConvGradWeight => "conv_grad_weight", GatherGrad => "gather_grad", SliceGrad => "slice_grad",
    // communication between pipeline stages
    Send => "send", Recv => "recv",
}

/// How many operands an op kind takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arity {
    Exact(usize),
    /// Inclusive range.
    Range(usize, usize),
    AtLeast(usize),
}

impl Arity {
    pub fn accepts(self, n: usize) -> bool {
        match self {
            Arity::Exact(k) => n == k,
            Arity::Range(a, b) => (a..=b).contains(&n),
            Arity::AtLeast(a) => n >= a,
        }
    }
}

impl fmt::Display for Arity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Arity::Exact(k) => write!(f, "{k}"),
            Arity::Range(a, b) => write!(f, "{a} to {b}"),
            Arity::AtLeast(a) => write!(f, "at least {a}"),
        }
    }
}

/// Broad families of ops, used by shape inference, the cost model and codegen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpClass {
    Unary,
    Binary,
    Compare,
    Ternary,
    Contraction,
    Pool,
    Norm,
    Reduce,
    DataMovement,
    Constant,
    Comm,
}

impl OpKind {
    pub fn class(self) -> OpClass {
        use OpKind::*;
        match self {
            Relu | LeakyRelu | Elu | Selu | Sigmoid | HardSigmoid | Tanh | Gelu | Erf | Exp
            | Log | Sqrt | Abs | Neg | Sign | Reciprocal | Softplus | Softsign | Floor | Ceil
            | Sin | Cos | Not | Identity | Shrink | Clip | Cast | Dropout => OpClass::Unary,
            Add | Sub | Mul | Div | Pow | Max | Min | PRelu | And | Or => OpClass::Binary,
            Equal | Less | Greater | LessEqual | GreaterEqual => OpClass::Compare,
            Where => OpClass::Ternary,
            MatMul | Gemm | Conv | ConvTranspose | ConvGradWeight => OpClass::Contraction,
            MaxPool | AvgPool | GlobalAvgPool | GlobalMaxPool | MaxPoolGrad | AvgPoolGrad => {
                OpClass::Pool
            }
            BatchNorm
            | InstanceNorm
            | LayerNorm
            | Lrn
            | Softmax
            | LogSoftmax
            | SoftmaxCrossEntropy
            | SoftmaxCrossEntropyGrad => OpClass::Norm,
            ReduceSum | ReduceMean | ReduceMax | ReduceMin => OpClass::Reduce,
            Reshape | Transpose | Concat | Split | Slice | Gather | Expand | Pad | Tile
            | Squeeze | Unsqueeze | Flatten | GatherGrad | SliceGrad => OpClass::DataMovement,
            Constant => OpClass::Constant,
            Send | Recv => OpClass::Comm,
        }
    }

    /// Number of operands the op accepts.
    pub fn arity(self) -> Arity {
        use OpKind::*;
        match self {
            Dropout => return Arity::Range(1, 2),
            MaxPoolGrad | ConvGradWeight | GatherGrad | SoftmaxCrossEntropy => {
                return Arity::Exact(2)
            }
            SoftmaxCrossEntropyGrad => return Arity::Exact(3),
            _ => {}
        }
        match self.class() {
            OpClass::Unary | OpClass::Pool | OpClass::Reduce => Arity::Exact(1),
            OpClass::Binary | OpClass::Compare => Arity::Exact(2),
            OpClass::Ternary => Arity::Exact(3),
            OpClass::Constant => Arity::Exact(0),
            _ => match self {
                MatMul => Arity::Exact(2),
                Gemm | Conv | ConvTranspose => Arity::Range(2, 3),
                BatchNorm => Arity::Exact(5),
                InstanceNorm => Arity::Exact(3),
                LayerNorm => Arity::Range(2, 3),
                Lrn | Softmax | LogSoftmax => Arity::Exact(1),
                Concat => Arity::AtLeast(1),
                Gather => Arity::Exact(2),
                Send => Arity::Exact(1),
                Recv => Arity::Exact(0),
                _ => Arity::Exact(1),
            },
        }
    }

    /// Whether the op has an effect beyond its results (never removed as dead code).
    pub fn has_side_effect(self) -> bool {
        matches!(self, OpKind::Send | OpKind::Recv)
    }

    /// Whether an op is elementwise (result shape is the broadcast of its operands).
    pub fn is_elementwise(self) -> bool {
        matches!(
            self.class(),
            OpClass::Unary | OpClass::Binary | OpClass::Compare | OpClass::Ternary
        )
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pp.{}", self.name())
    }
}

/// The training phase an op belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// Forward pass ("F").
    Fwd,
    /// Gradient with respect to activations ("B").
    BwdInput,
    /// Gradient with respect to parameters ("W").
    BwdWeight,
    /// Optimizer step.
    Optim,
}

impl Phase {
    pub const ALL: [Phase; 4] = [Phase::Fwd, Phase::BwdInput, Phase::BwdWeight, Phase::Optim];

    pub fn name(self) -> &'static str {
        match self {
            Phase::Fwd => "fwd",
            Phase::BwdInput => "bwd_input",
            Phase::BwdWeight => "bwd_weight",
            Phase::Optim => "optim",
        }
    }

    pub fn from_name(s: &str) -> Option<Phase> {
        Phase::ALL.into_iter().find(|p| p.name() == s)
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for &k in OpKind::ALL {
            assert_eq!(OpKind::from_name(k.name()), Some(k));
        }
        assert_eq!(OpKind::from_name("nope"), None);
        assert_eq!(OpKind::MatMul.to_string(), "pp.matmul");
    }
}
