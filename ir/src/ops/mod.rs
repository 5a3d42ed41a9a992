//! The op set of ppir and the attribute conventions every consumer agrees on.
//!
//! Each op is declared once, in the `define_ops!` table below (name, family, arity, typed
//! attribute set, gradient support); its attributes' kinds and defaults are declared once in
//! [`attrs`], whose generated views (`GemmAttrs::of(&op.attrs)?`) every consumer reads. The
//! table here is the reader's summary of that declaration (`ppcc-opt --list-ops` prints the
//! declared one).
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
//! | `mod` (numpy broadcasting) | a, b | `fmod` = 0: `a - floor(a / b) · b` (the sign of b; numpy's `mod`); 1: `a - trunc(a / b) · b` (the sign of a; C's `fmod`); integers: 0 where b = 0 |
//! | comparisons → i1: `equal less greater less_equal greater_equal` | a, b | — |
//! | logical on i1: `and or` | a, b | — |
//! | `where` | cond (i1), x, y | — (three-way broadcasting) |
//! | `matmul` | a, b | — (numpy `matmul`: 1-D promotion, batch broadcasting) |
//! | `gemm` | a, b, \[c\] | `alpha` = 1.0, `beta` = 1.0, `trans_a` = 0, `trans_b` = 0 |
//! | `conv` | x `[N,C,spatial..]`, w `[M,C/group,k..]`, [bias `[M]`] | `strides`, `pads` (all begins then all ends), `dilations`, `group` = 1, `kernel_shape` (w's spatial dims; checked when given) |
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
//! | `reduce_log_sum_exp` | x (float) | as the reductions; result: `m + ln Σ exp(x - m)` with `m` the maximum (0 where it is not finite), so `-inf` for an empty or all `-inf` set |
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
//! | `label_logit` | logits `[.., C]` (float), labels `[..]` (integer, logits' shape without the last axis) | `offset` = 0; result `[..]`: `logits[.., label - offset]` where `0 ≤ label - offset < C`, else 0 (a vocabulary piece's share of the logit at the label) |
//! | `label_logit_grad` | dy `[..]`, labels `[..]`, \[base `[.., classes]`\] | `offset` = 0, `classes` *required*; result `[.., classes]`: dy in the column `label - offset` (where it is in range), 0 elsewhere; plus `base` when given (the sum autodiff would otherwise add) |
//! | `log_sum_exp_grad` | x, y (the `reduce_log_sum_exp` result), dy (y's shape) | as `reduce_log_sum_exp`; result: `exp(x - y) · dy`, y and dy broadcast over the reduced axes |
//! | `max_pool_grad` | x, dy (the max_pool result's shape) | as `max_pool`; result: dx, each dy routed to the first maximum of its window |
//! | `avg_pool_grad` | dy | as `avg_pool`, plus `input_shape` *required* (x's full shape); result: dx |
//! | `conv_grad_weight` | x, dy (the conv result's shape) | `strides`, `pads`, `dilations`, `group` as `conv`, plus `kernel_shape` *required* (spatial); result: dw `[M, C/group, k..]` |
//! | `gather_grad` | indices (integer), dy | `axis` = 0, `data_shape` *required*; result: `zeros(data_shape)` with dy added at the gathered positions (negative indices wrap) |
//! | `slice_grad` | dy | `starts`, `ends`, `axes`, `steps` as `slice`, plus `input_shape` *required*; result: `zeros(input_shape)` with dy written where the slice read |
//! | `send` | x | `peer` *required* (stage), `channel` *required*; no results |
//! | `recv` | — | `peer` *required* (stage), `channel` *required*; one result |

use std::fmt;

pub mod attrs;

pub use attrs::{check_attrs, AttrIssue, AttrKind, AttrSpec, OpAttrs};

/// The one declaration of every op: `Variant = "name", class, arity, attribute set,
/// gradient support [, operands a gradient flows into]`. Everything else about an op is
/// its semantics (shape rule, interpreter kernel, gradient rule, lowering), which match on
/// [`OpKind`] and read attributes through the typed view named here.
macro_rules! define_ops {
    ($(
        $variant:ident = $name:literal, $class:ident, $arity:expr, $attrs:ident, $grad:ident
            $(, dx [$($dx:literal),*])?;
    )*) => {
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

            /// The op's family.
            pub fn class(self) -> OpClass {
                match self { $(OpKind::$variant => OpClass::$class),* }
            }

            /// Number of operands the op accepts.
            pub fn arity(self) -> Arity {
                use Arity::*;
                match self { $(OpKind::$variant => $arity),* }
            }

            /// The attributes the op understands, with kinds and defaults (the verifier's
            /// schema); read them through the typed view named in the op table.
            pub fn attr_spec(self) -> &'static [AttrSpec] {
                match self { $(OpKind::$variant => <attrs::$attrs as OpAttrs>::SPEC),* }
            }

            /// The name of the op's typed attribute view (`GemmAttrs`).
            pub fn attr_set(self) -> &'static str {
                match self { $(OpKind::$variant => stringify!($attrs)),* }
            }

            /// How autodiff treats the op.
            pub fn gradient_support(self) -> GradSupport {
                match self { $(OpKind::$variant => GradSupport::$grad),* }
            }

            /// Whether a gradient can flow into operand `index` (indices, conditions,
            /// labels, keys and batch-norm statistics get none).
            pub fn differentiable_operand(self, index: usize) -> bool {
                if matches!(self.gradient_support(), GradSupport::Zero | GradSupport::None) {
                    return false;
                }
                match self {
                    $($(OpKind::$variant => [$($dx),*].contains(&index),)?)*
                    _ => true,
                }
            }
        }
    };
}

define_ops! {
    // ---- unary elementwise ----
    Relu = "relu", Unary, Exact(1), NoAttrs, Rule;
    LeakyRelu = "leaky_relu", Unary, Exact(1), LeakyReluAttrs, Rule;
    Elu = "elu", Unary, Exact(1), EluAttrs, Rule;
    Selu = "selu", Unary, Exact(1), SeluAttrs, Rule;
    Sigmoid = "sigmoid", Unary, Exact(1), NoAttrs, Rule;
    HardSigmoid = "hard_sigmoid", Unary, Exact(1), HardSigmoidAttrs, Rule;
    Tanh = "tanh", Unary, Exact(1), NoAttrs, Rule;
    Gelu = "gelu", Unary, Exact(1), GeluAttrs, Rule;
    Erf = "erf", Unary, Exact(1), NoAttrs, Rule;
    Exp = "exp", Unary, Exact(1), NoAttrs, Rule;
    Log = "log", Unary, Exact(1), NoAttrs, Rule;
    Sqrt = "sqrt", Unary, Exact(1), NoAttrs, Rule;
    Abs = "abs", Unary, Exact(1), NoAttrs, Rule;
    Neg = "neg", Unary, Exact(1), NoAttrs, Rule;
    Sign = "sign", Unary, Exact(1), NoAttrs, Zero;
    Reciprocal = "reciprocal", Unary, Exact(1), NoAttrs, Rule;
    Softplus = "softplus", Unary, Exact(1), NoAttrs, Rule;
    Softsign = "softsign", Unary, Exact(1), NoAttrs, Rule;
    Floor = "floor", Unary, Exact(1), NoAttrs, Zero;
    Ceil = "ceil", Unary, Exact(1), NoAttrs, Zero;
    Sin = "sin", Unary, Exact(1), NoAttrs, Rule;
    Cos = "cos", Unary, Exact(1), NoAttrs, Rule;
    Not = "not", Unary, Exact(1), NoAttrs, None;
    Identity = "identity", Unary, Exact(1), NoAttrs, Rule;
    Shrink = "shrink", Unary, Exact(1), ShrinkAttrs, Rule;
    Clip = "clip", Unary, Exact(1), ClipAttrs, Rule;
    Cast = "cast", Unary, Exact(1), CastAttrs, Rule;
    Dropout = "dropout", Unary, Range(1, 2), DropoutAttrs, Rule, dx [0];
    // ---- binary elementwise (numpy broadcasting) ----
    Add = "add", Binary, Exact(2), NoAttrs, Rule;
    Sub = "sub", Binary, Exact(2), NoAttrs, Rule;
    Mul = "mul", Binary, Exact(2), NoAttrs, Rule;
    Div = "div", Binary, Exact(2), NoAttrs, Rule;
    Pow = "pow", Binary, Exact(2), NoAttrs, Rule;
    Max = "max", Binary, Exact(2), NoAttrs, Rule;
    Min = "min", Binary, Exact(2), NoAttrs, Rule;
    PRelu = "prelu", Binary, Exact(2), NoAttrs, Rule;
    Mod = "mod", Binary, Exact(2), ModAttrs, Rule;
    Equal = "equal", Compare, Exact(2), NoAttrs, None;
    Less = "less", Compare, Exact(2), NoAttrs, None;
    Greater = "greater", Compare, Exact(2), NoAttrs, None;
    LessEqual = "less_equal", Compare, Exact(2), NoAttrs, None;
    GreaterEqual = "greater_equal", Compare, Exact(2), NoAttrs, None;
    And = "and", Binary, Exact(2), NoAttrs, None;
    Or = "or", Binary, Exact(2), NoAttrs, None;
    Where = "where", Ternary, Exact(3), NoAttrs, Rule, dx [1, 2];
    // ---- contractions ----
    MatMul = "matmul", Contraction, Exact(2), NoAttrs, Rule;
    Gemm = "gemm", Contraction, Range(2, 3), GemmAttrs, Rule;
    Conv = "conv", Contraction, Range(2, 3), ConvAttrs, Rule;
    ConvTranspose = "conv_transpose", Contraction, Range(2, 3), ConvTransposeAttrs, Rule;
    // ---- pooling ----
    MaxPool = "max_pool", Pool, Exact(1), MaxPoolAttrs, Rule;
    AvgPool = "avg_pool", Pool, Exact(1), AvgPoolAttrs, Rule;
    GlobalAvgPool = "global_avg_pool", Pool, Exact(1), NoAttrs, Rule;
    GlobalMaxPool = "global_max_pool", Pool, Exact(1), NoAttrs, Rule;
    // ---- normalisation ----
    BatchNorm = "batch_norm", Norm, Exact(5), BatchNormAttrs, Rule, dx [0, 1, 2];
    InstanceNorm = "instance_norm", Norm, Exact(3), InstanceNormAttrs, Decomposed;
    LayerNorm = "layer_norm", Norm, Range(2, 3), LayerNormAttrs, Decomposed;
    Lrn = "lrn", Norm, Exact(1), LrnAttrs, Decomposed;
    Softmax = "softmax", Norm, Exact(1), SoftmaxAttrs, Rule;
    LogSoftmax = "log_softmax", Norm, Exact(1), SoftmaxAttrs, Rule;
    // ---- reductions ----
    ReduceSum = "reduce_sum", Reduce, Exact(1), ReduceAttrs, Rule;
    ReduceMean = "reduce_mean", Reduce, Exact(1), ReduceAttrs, Rule;
    ReduceMax = "reduce_max", Reduce, Exact(1), ReduceAttrs, Rule;
    ReduceMin = "reduce_min", Reduce, Exact(1), ReduceAttrs, Rule;
    ReduceLogSumExp = "reduce_log_sum_exp", Reduce, Exact(1), ReduceAttrs, Rule;
    // ---- data movement ----
    Reshape = "reshape", DataMovement, Exact(1), ShapeAttrs, Rule;
    Transpose = "transpose", DataMovement, Exact(1), TransposeAttrs, Rule;
    Concat = "concat", DataMovement, AtLeast(1), ConcatAttrs, Rule;
    Split = "split", DataMovement, Exact(1), SplitAttrs, Rule;
    Slice = "slice", DataMovement, Exact(1), SliceAttrs, Rule;
    Gather = "gather", DataMovement, Exact(2), GatherAttrs, Rule, dx [0];
    Expand = "expand", DataMovement, Exact(1), ShapeAttrs, Rule;
    Pad = "pad", DataMovement, Exact(1), PadAttrs, Rule;
    Tile = "tile", DataMovement, Exact(1), TileAttrs, Rule;
    Squeeze = "squeeze", DataMovement, Exact(1), SqueezeAttrs, Rule;
    Unsqueeze = "unsqueeze", DataMovement, Exact(1), UnsqueezeAttrs, Rule;
    Flatten = "flatten", DataMovement, Exact(1), FlattenAttrs, Rule;
    Constant = "constant", Constant, Exact(0), ConstantAttrs, None;
    // ---- losses and gradient helpers (made by autodiff) ----
    SoftmaxCrossEntropy = "softmax_cross_entropy", Norm, Exact(2), CrossEntropyAttrs, Rule, dx [0];
    SoftmaxCrossEntropyGrad = "softmax_cross_entropy_grad", Norm, Exact(3), CrossEntropyAttrs, Unsupported;
    LabelLogit = "label_logit", Norm, Exact(2), LabelLogitAttrs, Rule, dx [0];
    LabelLogitGrad = "label_logit_grad", Norm, Range(2, 3), LabelLogitGradAttrs, Unsupported;
    LogSumExpGrad = "log_sum_exp_grad", Reduce, Exact(3), ReduceAttrs, Unsupported;
    MaxPoolGrad = "max_pool_grad", Pool, Exact(2), MaxPoolAttrs, Unsupported;
    AvgPoolGrad = "avg_pool_grad", Pool, Exact(1), AvgPoolGradAttrs, Unsupported;
    ConvGradWeight = "conv_grad_weight", Contraction, Exact(2), ConvGradWeightAttrs, Unsupported;
    GatherGrad = "gather_grad", DataMovement, Exact(2), GatherGradAttrs, Rule, dx [1];
    SliceGrad = "slice_grad", DataMovement, Exact(1), SliceGradAttrs, Unsupported;
    // ---- communication between pipeline stages ----
    Send = "send", Comm, Exact(1), CommAttrs, None;
    Recv = "recv", Comm, Exact(0), CommAttrs, None;
    AllReduce = "all_reduce", Comm, Exact(1), AllReduceAttrs, None;
    // ---- sharded optimizer state (ZeRO-1) across data-parallel replicas ----
    ReduceScatter = "reduce_scatter", Comm, Exact(1), ShardAttrs, None;
    Shard = "shard", Comm, Exact(1), ShardAttrs, None;
    AllGather = "all_gather", Comm, Exact(1), ShardAttrs, None;
}

/// How autodiff treats an op kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GradSupport {
    /// A vector-Jacobian product rule.
    Rule,
    /// Rewritten into primitive ops before differentiating (layer/instance norm, lrn; and
    /// batch norm in training mode, which otherwise has a rule).
    Decomposed,
    /// Piecewise constant (`sign floor ceil`): the gradient is zero almost everywhere, so
    /// nothing flows through it.
    Zero,
    /// Results are not differentiable: integer/bool results (comparisons, logic), constants
    /// and communication.
    None,
    /// Differentiable, but no rule (second derivatives of the gradient helper ops): an
    /// error if a gradient has to flow through it.
    Unsupported,
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
    /// Whether the op has an effect beyond its results (never removed as dead code).
    pub fn has_side_effect(self) -> bool {
        matches!(self.class(), OpClass::Comm)
    }

    /// Whether an op is elementwise (result shape is the broadcast of its operands).
    pub fn is_elementwise(self) -> bool {
        matches!(
            self.class(),
            OpClass::Unary | OpClass::Binary | OpClass::Compare | OpClass::Ternary
        )
    }
}

/// The op table as text, one op per line: name, family, operands, attributes (kind,
/// `required` or the default) and gradient support — what `ppcc-opt --list-ops` prints.
pub fn table_text() -> String {
    let mut out = String::new();
    for &k in OpKind::ALL {
        let attrs: Vec<String> = k
            .attr_spec()
            .iter()
            .map(|a| {
                let kind = match a.kind {
                    AttrKind::Int => "int",
                    AttrKind::Bool => "bool",
                    AttrKind::Float => "float",
                    AttrKind::Str => "string",
                    AttrKind::Ints => "ints",
                    AttrKind::Floats => "floats",
                    AttrKind::DType => "type",
                    AttrKind::Tensor => "tensor",
                };
                match (a.required, a.default) {
                    (true, _) => format!("{}: {kind} (required)", a.name),
                    (false, Some(d)) => format!("{}: {kind} = {d}", a.name),
                    (false, None) => format!("{}: {kind} (optional)", a.name),
                }
            })
            .collect();
        let grad = match k.gradient_support() {
            GradSupport::Rule => "rule",
            GradSupport::Decomposed => "decomposed",
            GradSupport::Zero => "zero",
            GradSupport::None => "none",
            GradSupport::Unsupported => "unsupported",
        };
        out.push_str(&format!(
            "{:<27} {:<13} {:<10} grad {:<12} {}\n",
            k.name(),
            format!("{:?}", k.class()).to_lowercase(),
            k.arity().to_string(),
            grad,
            if attrs.is_empty() {
                "-".to_string()
            } else {
                attrs.join(", ")
            }
        ));
    }
    out
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

    #[test]
    fn every_kind_has_a_schema_without_repeats() {
        for &k in OpKind::ALL {
            let s = k.attr_spec();
            for (i, a) in s.iter().enumerate() {
                assert!(
                    s[i + 1..].iter().all(|b| b.name != a.name),
                    "{k}: {} twice",
                    a.name
                );
                assert!(!(a.required && a.default.is_some()), "{k}: {}", a.name);
            }
        }
    }

    #[test]
    fn attribute_issues() {
        use crate::attr::{Attr, Attrs};
        let a = Attrs::new().with("perm", Attr::Str("x".into()));
        let issues = check_attrs(OpKind::Transpose.attr_spec(), &a);
        assert_eq!(issues.len(), 1);
        assert_eq!(
            issues[0].to_string(),
            "attribute `perm`: expected an integer list, found string"
        );
        let issues = check_attrs(
            OpKind::Send.attr_spec(),
            &Attrs::new().with("peer", Attr::Int(1)),
        );
        assert_eq!(issues, vec![AttrIssue::Missing("channel")]);
        // Integers are fine where floats are expected.
        let alpha = Attrs::new().with("alpha", Attr::Int(1));
        assert!(check_attrs(OpKind::LeakyRelu.attr_spec(), &alpha).is_empty());
    }

    #[test]
    fn typed_views_apply_defaults_and_round_trip() {
        use super::attrs::*;
        use crate::attr::{Attr, Attrs};
        let g = GemmAttrs::of(&Attrs::new().with("trans_b", Attr::Int(1))).unwrap();
        assert_eq!(
            g,
            GemmAttrs {
                alpha: 1.0,
                beta: 1.0,
                trans_a: false,
                trans_b: true
            }
        );
        assert_eq!(GemmAttrs::of(&g.to_attrs()).unwrap(), g);
        let c = ConvAttrs::of(&Attrs::new()).unwrap();
        assert_eq!((c.strides.as_ref(), c.group), (None, 1));
        assert!(c.to_attrs().get("strides").is_none());
        assert_eq!(GeluAttrs::of(&Attrs::new()).unwrap().approximate, "none");
        assert_eq!(ClipAttrs::of(&Attrs::new()).unwrap().min, f64::NEG_INFINITY);
        let e = CastAttrs::of(&Attrs::new()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "attribute `to`: expected an element type, found nothing (it is required)"
        );
        let e = LayerNormAttrs::of(&Attrs::new().with("epsilon", Attr::Str("x".into())));
        assert_eq!(
            e.unwrap_err().to_string(),
            "attribute `epsilon`: expected a float, found string"
        );
        // The schema says what the view reads.
        let spec = OpKind::LayerNorm.attr_spec();
        assert_eq!(spec[1].name, "epsilon");
        assert_eq!(spec[1].default, Some("1e-5"));
        assert_eq!(OpKind::ReduceMax.attr_set(), "ReduceAttrs");
    }

    #[test]
    fn gradient_operands() {
        assert!(!OpKind::Where.differentiable_operand(0));
        assert!(OpKind::Where.differentiable_operand(2));
        assert!(OpKind::BatchNorm.differentiable_operand(2));
        assert!(!OpKind::BatchNorm.differentiable_operand(3));
        assert!(OpKind::MatMul.differentiable_operand(1));
        assert!(!OpKind::Floor.differentiable_operand(0));
    }
}
