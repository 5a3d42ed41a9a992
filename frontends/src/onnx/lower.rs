//! ONNX ops → IR ops, one arm per ONNX op type, following the model's opset where the op's
//! meaning changed (legacy broadcasting before opset 7, `Softmax` on coerced 2-D before 13,
//! attributes that became inputs...). Inputs that ppir needs as static attributes
//! (shapes, axes, pads, slice bounds) must be known at import time; everything known at
//! import time is folded by [`Importer::op`].

use std::rc::Rc;

mod attention;
mod select;

use ppir::ops::attrs::{
    AvgPoolAttrs, BatchNormAttrs, CastAttrs, ClipAttrs, ConcatAttrs, ConvAttrs, ConvTransposeAttrs,
    DropoutAttrs, EluAttrs, FlattenAttrs, GatherAttrs, GeluAttrs, GemmAttrs, HardSigmoidAttrs,
    InstanceNormAttrs, LayerNormAttrs, LeakyReluAttrs, LrnAttrs, MaxPoolAttrs, ModAttrs, PadAttrs,
    ReduceAttrs, SeluAttrs, ShapeAttrs, ShrinkAttrs, SliceAttrs, SoftmaxAttrs, SplitAttrs,
    SqueezeAttrs, TileAttrs, TransposeAttrs, UnsqueezeAttrs,
};
use ppir::ops::OpAttrs;
use ppir::{ArgKind, Attrs, DType, Dim, OpKind, Tensor, TensorData, TensorType};

use super::attrs::NodeAttrs;
use super::import::{
    invalid, scalar, static_elements, unsupported, Fail, Importer, SymInt, Val, BATCH_NEEDED, R,
};
use super::proto::NodeProto;
use super::tensor::{dtype_from_onnx, element_count, tensor_from_proto};

mod control;
mod data_shaped;
mod einsum;
mod flex_attention;
mod generate;
mod grid_sample;
mod linear_attention;
mod losses;
mod math;
mod norms;
mod pool_indices;
mod reorder;
mod resize;
mod rnn;
mod scan;
mod signal;
mod training;

/// Oldest opset of the default domain ppcc imports. Opset 6 is what the onnx package's
/// PyTorch-converted test models use; older opsets differ in too many details.
pub const MIN_OPSET: i64 = 6;
/// Newest opset ppcc imports. Opsets 22–25 only widened type constraints of the ops below,
/// except `Attention` (new in 23; `nonpad_kv_seqlen` in 24, sliding windows in 25), which
/// its arm follows per version; the ops that changed in opsets 26–28 are listed in
/// [`VERSIONS_AFTER_25`].
pub const MAX_OPSET: i64 = 28;

/// Whether ppcc follows an op version of opsets 26–28.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NewVersion {
    /// Implemented: the op's arm below follows this version.
    Followed,
    /// Not followed: once the op is in [`SUPPORTED_OPS`], a node of it at this opset or later
    /// is refused ([`super::OnnxError::UnsupportedOpVersion`]) rather than read with its
    /// older semantics; until then it is refused as an op ppcc does not map.
    Refused,
}

/// Default-domain ops that got a new version in opsets 26–28 (from the onnx 1.23.2 schemas,
/// `onnx.defs.get_all_schemas_with_history()`), with that version. Ops new in 26–28
/// (`BitCast`, `CumProd`, `CausalConvWithState`, `LinearAttention`, `SwiGLU`) have no older
/// meaning to mistake and are left out.
pub const VERSIONS_AFTER_25: &[(&str, i64, NewVersion)] = &[
    ("BitShift", 28, NewVersion::Refused),
    // Adds the FLOAT6 types only, which ppcc has no dtype for (refused as any unknown type).
    ("Cast", 28, NewVersion::Followed),
    // Adds types only.
    ("Celu", 28, NewVersion::Followed),
    // Adds bfloat16 only.
    ("Compress", 28, NewVersion::Followed),
    // Adds types only.
    ("DepthToSpace", 28, NewVersion::Followed),
    ("DequantizeLinear", 28, NewVersion::Refused),
    // Adds bfloat16 only.
    ("Einsum", 28, NewVersion::Followed),
    // Defines `fmod = 0` for floats too (floored, as numpy's `mod`), which `pp.mod` computes.
    ("Mod", 28, NewVersion::Followed),
    // Adds types only.
    ("OneHot", 28, NewVersion::Followed),
    ("Optional", 28, NewVersion::Refused),
    ("OptionalGetElement", 28, NewVersion::Refused),
    ("OptionalHasElement", 28, NewVersion::Refused),
    ("QuantizeLinear", 28, NewVersion::Refused),
    // Adds `stash_type` (the precision of float16/bfloat16 ranges) and those two types.
    ("Range", 27, NewVersion::Followed),
    // Drop the integer types; the float semantics are unchanged.
    ("ReduceLogSum", 28, NewVersion::Followed),
    ("ReduceLogSumExp", 28, NewVersion::Followed),
    // Adds bfloat16 only.
    ("ReverseSequence", 28, NewVersion::Followed),
    // Adds `mode` (DCR or CRD), which its arm follows.
    ("SpaceToDepth", 28, NewVersion::Followed),
    // Adds bfloat16 only.
    ("Unique", 28, NewVersion::Followed),
];

/// The version of `op` (default domain) after opset 25 that ppcc refuses at `opset`, if any.
pub fn refused_version(op: &str, opset: i64) -> Option<i64> {
    VERSIONS_AFTER_25
        .iter()
        .find(|&&(o, v, how)| o == op && v <= opset && how == NewVersion::Refused)
        .map(|&(_, v, _)| v)
}

/// The longest sequence ppcc unrolls at import time.
const MAX_SEQUENCE: usize = 4096;

/// The domain of ONNX's training operators (`Adagrad`, `Adam`, `Momentum`).
pub const TRAINING_DOMAIN: &str = "ai.onnx.preview.training";

/// Ops of [`TRAINING_DOMAIN`] ppcc maps.
pub const TRAINING_OPS: &[&str] = &["Adagrad", "Adam", "Momentum"];

/// Whether ppcc maps `op` of the non-default `domain` (the training optimizers and
/// `ai.onnx.preview`'s `FlexAttention`).
pub fn maps_other_domain(domain: &str, op: &str) -> bool {
    (domain == TRAINING_DOMAIN && TRAINING_OPS.contains(&op))
        || (domain == flex_attention::PREVIEW_DOMAIN && op == "FlexAttention")
}

/// ONNX op types ppcc maps (default domain).
pub const SUPPORTED_OPS: &[&str] = &[
    "Abs",
    "Acos",
    "Acosh",
    "Add",
    "AffineGrid",
    "And",
    "ArgMax",
    "ArgMin",
    "Asin",
    "Asinh",
    "Atan",
    "Atanh",
    "Attention",
    "AveragePool",
    "BatchNormalization",
    "BlackmanWindow",
    "Cast",
    "CastLike",
    "CausalConvWithState",
    "Ceil",
    "Celu",
    "CenterCropPad",
    "Clip",
    "Col2Im",
    "Compress",
    "Concat",
    "ConcatFromSequence",
    "Constant",
    "ConstantOfShape",
    "Conv",
    "ConvTranspose",
    "Cos",
    "Cosh",
    "CumProd",
    "CumSum",
    "DFT",
    "DepthToSpace",
    "Det",
    "Div",
    "Dropout",
    "Einsum",
    "Elu",
    "Equal",
    "Erf",
    "Exp",
    "Expand",
    "EyeLike",
    "Flatten",
    "Floor",
    "GRU",
    "Gather",
    "GatherElements",
    "GatherND",
    "Gelu",
    "Gemm",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "Greater",
    "GreaterOrEqual",
    "GridSample",
    "GroupNormalization",
    "HammingWindow",
    "HannWindow",
    "HardSigmoid",
    "HardSwish",
    "Hardmax",
    "Identity",
    "If",
    "InstanceNormalization",
    "IsInf",
    "IsNaN",
    "LRN",
    "LSTM",
    "LayerNormalization",
    "LeakyRelu",
    "Less",
    "LessOrEqual",
    "LinearAttention",
    "Log",
    "LogSoftmax",
    "Loop",
    "LpNormalization",
    "LpPool",
    "MatMul",
    "Max",
    "MaxPool",
    "MaxUnpool",
    "Mean",
    "MeanVarianceNormalization",
    "MelWeightMatrix",
    "Min",
    "Mish",
    "Mod",
    "Mul",
    "Neg",
    "NegativeLogLikelihoodLoss",
    "Not",
    "OneHot",
    "Or",
    "PRelu",
    "Pad",
    "Pow",
    "RMSNormalization",
    "RNN",
    "Range",
    "Reciprocal",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceMax",
    "ReduceMean",
    "ReduceMin",
    "ReduceProd",
    "ReduceSum",
    "ReduceSumSquare",
    "Relu",
    "Reshape",
    "Resize",
    "ReverseSequence",
    "RotaryEmbedding",
    "Round",
    "STFT",
    "Scan",
    "Scatter",
    "ScatterElements",
    "ScatterND",
    "Selu",
    "SequenceAt",
    "SequenceConstruct",
    "SequenceEmpty",
    "SequenceErase",
    "SequenceInsert",
    "SequenceLength",
    "Shape",
    "Shrink",
    "Sigmoid",
    "Sign",
    "Sin",
    "Sinh",
    "Size",
    "Slice",
    "Softmax",
    "SoftmaxCrossEntropyLoss",
    "Softplus",
    "Softsign",
    "SpaceToDepth",
    "Split",
    "SplitToSequence",
    "Sqrt",
    "Squeeze",
    "Sub",
    "Sum",
    "SwiGLU",
    "Swish",
    "Tan",
    "Tanh",
    "TensorScatter",
    "ThresholdedRelu",
    "Tile",
    "TopK",
    "Transpose",
    "Trilu",
    "Unique",
    "Unsqueeze",
    "Upsample",
    "Where",
];

pub fn supported_ops_list() -> String {
    SUPPORTED_OPS.join(", ")
}

trait OrInvalid<T> {
    fn inv(self) -> R<T>;
}

impl<T, E: Into<Fail>> OrInvalid<T> for Result<T, E> {
    fn inv(self) -> R<T> {
        self.map_err(Into::into)
    }
}

/// An attribute set with every attribute at its declared default (sets without required
/// attributes).
fn defaults<A: OpAttrs>() -> R<A> {
    A::of(&Attrs::new()).map_err(|e| Fail::Invalid(e.to_string()))
}

fn usize_dims(t: &TensorType) -> Option<Vec<i64>> {
    t.static_shape()
        .map(|s| s.iter().map(|&d| d as i64).collect())
}

/// Normalise a possibly negative axis against `rank`.
fn norm_axis(axis: i64, rank: usize) -> R<usize> {
    let r = rank as i64;
    if axis < -r || axis >= r {
        invalid!("axis {axis} is out of range for rank {rank}");
    }
    Ok(if axis < 0 {
        (axis + r) as usize
    } else {
        axis as usize
    })
}

/// Explicit `[begins.., ends..]` pads for `auto_pad` = SAME_UPPER / SAME_LOWER.
fn same_pads(
    input: &[i64],
    kernel: &[i64],
    strides: &[i64],
    dilations: &[i64],
    upper: bool,
) -> Vec<i64> {
    let n = input.len();
    let mut pads = vec![0; 2 * n];
    for i in 0..n {
        // Saturating: the sizes come from the model and may be absurd.
        let out = input[i].saturating_add(strides[i] - 1) / strides[i];
        let eff = kernel[i]
            .saturating_sub(1)
            .saturating_mul(dilations[i])
            .saturating_add(1);
        let total = (out - 1)
            .saturating_mul(strides[i])
            .saturating_add(eff)
            .saturating_sub(input[i])
            .max(0);
        let (small, big) = (total / 2, total - total / 2);
        if upper {
            pads[i] = small;
            pads[i + n] = big;
        } else {
            pads[i] = big;
            pads[i + n] = small;
        }
    }
    pads
}

impl Importer<'_> {
    // ---- node inputs ----

    fn input(&self, node: &NodeProto, i: usize) -> R<Option<Val>> {
        match node.input.get(i) {
            Some(name) if !name.is_empty() => self.lookup(name).map(Some),
            _ => Ok(None),
        }
    }

    fn req(&self, node: &NodeProto, i: usize) -> R<Val> {
        match self.input(node, i)? {
            Some(v) => Ok(v),
            None => invalid!("input {i} is missing"),
        }
    }

    fn runtime_input_error(&self, node: &NodeProto, i: usize, what: &str) -> Fail {
        let name = &node.input[i];
        if self.is_graph_input(name) {
            return Fail::NeedsValue {
                input: name.clone(),
                message: format!(
                    "{what} (input {i}) must be known at import time (it is the graph input `{name}`; ppcc can fold it when its value is given at import time)"
                ),
            };
        }
        Fail::Unsupported(format!(
            "{what} (input {i}) must be known at import time (`{name}` is computed at run time)"
        ))
    }

    /// A static input, `None` when omitted.
    fn static_input(&self, node: &NodeProto, i: usize, what: &str) -> R<Option<Rc<Tensor>>> {
        let Some(v) = self.input(node, i)? else {
            return Ok(None);
        };
        match self.static_tensor(&v)? {
            Some(t) => Ok(Some(t)),
            None => Err(self.runtime_input_error(node, i, what)),
        }
    }

    fn static_ints(&self, node: &NodeProto, i: usize, what: &str) -> R<Option<Vec<i64>>> {
        Ok(self.static_input(node, i, what)?.map(|t| t.to_i64_vec()))
    }

    /// A static shape-like input whose elements may be the symbolic batch size.
    fn static_sym_ints(&self, node: &NodeProto, i: usize, what: &str) -> R<Vec<SymInt>> {
        let v = self.req(node, i)?;
        match self.sym_ints(&v)? {
            Some(s) => Ok(s),
            None => Err(self.runtime_input_error(node, i, what)),
        }
    }

    fn static_scalar_f64(&self, node: &NodeProto, i: usize, what: &str) -> R<Option<f64>> {
        let Some(t) = self.static_input(node, i, what)? else {
            return Ok(None);
        };
        if t.num_elements() != 1 {
            invalid!(
                "{what} (input {i}) must hold one value, it has shape {:?}",
                t.shape
            );
        }
        Ok(Some(t.to_f64_vec()[0]))
    }

    /// A sequence input.
    fn seq(&self, node: &NodeProto, i: usize) -> R<Vec<Val>> {
        match self.req(node, i)? {
            Val::Seq(items) => Ok(items),
            _ => invalid!("input {i} must be a sequence"),
        }
    }

    fn dims_of(&self, v: &Val) -> R<Vec<Dim>> {
        Ok(self.ty(v)?.dims)
    }

    fn rank_of(&self, v: &Val) -> R<usize> {
        Ok(self.ty(v)?.rank())
    }

    /// Static spatial sizes of `x` (`[N, C, spatial..]`), for `auto_pad`.
    fn spatial_sizes(&self, x: &Val) -> R<Vec<i64>> {
        let dims = self.dims_of(x)?;
        if dims.len() < 3 {
            invalid!(
                "expects an input of rank at least 3, got rank {}",
                dims.len()
            );
        }
        dims[2..]
            .iter()
            .map(|d| match d {
                Dim::Known(n) => Ok(*n as i64),
                Dim::Batch => unsupported!(
                    "auto_pad needs the spatial size, which is the symbolic batch size here"
                ),
            })
            .collect()
    }

    fn constant_val(&self, t: Tensor) -> Val {
        Val::konst(t)
    }

    // ---- the op table ----

    pub(super) fn lower_node(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let a = NodeAttrs::new(node);
        if let Some(name) = a.any_ref_attr() {
            unsupported!("attribute `{name}` refers to a function attribute");
        }
        if node.domain == TRAINING_DOMAIN {
            return self.lower_training_op(node, &a);
        }
        if node.domain == flex_attention::PREVIEW_DOMAIN && node.op_type == "FlexAttention" {
            return Ok(vec![self.lower_flex_attention(node, &a)?]);
        }
        let op = node.op_type.as_str();
        let opset = self.opset;
        use OpKind as K;
        let unary = |k: OpKind| Some(k);
        let simple_unary = match op {
            "Relu" => unary(K::Relu),
            "Sigmoid" => unary(K::Sigmoid),
            "Tanh" => unary(K::Tanh),
            "Erf" => unary(K::Erf),
            "Exp" => unary(K::Exp),
            "Log" => unary(K::Log),
            "Sqrt" => unary(K::Sqrt),
            "Abs" => unary(K::Abs),
            "Neg" => unary(K::Neg),
            "Sign" => unary(K::Sign),
            "Reciprocal" => unary(K::Reciprocal),
            "Softplus" => unary(K::Softplus),
            "Softsign" => unary(K::Softsign),
            "Floor" => unary(K::Floor),
            "Ceil" => unary(K::Ceil),
            "Sin" => unary(K::Sin),
            "Cos" => unary(K::Cos),
            "Not" => unary(K::Not),
            _ => None,
        };
        if let Some(kind) = simple_unary {
            let x = self.req(node, 0)?;
            return Ok(vec![self.op(kind, Attrs::new(), &[x])?]);
        }
        let binary = match op {
            "Add" => Some(K::Add),
            "Sub" => Some(K::Sub),
            "Mul" => Some(K::Mul),
            "Div" => Some(K::Div),
            "Pow" => Some(K::Pow),
            "Equal" => Some(K::Equal),
            "Less" => Some(K::Less),
            "Greater" => Some(K::Greater),
            "LessOrEqual" => Some(K::LessEqual),
            "GreaterOrEqual" => Some(K::GreaterEqual),
            "And" => Some(K::And),
            "Or" => Some(K::Or),
            _ => None,
        };
        if let Some(kind) = binary {
            return Ok(vec![self.lower_binary(node, &a, kind)?]);
        }
        if let Some(y) = self.lower_math(node, &a)? {
            return Ok(vec![y]);
        }
        let out = match op {
            "Identity" => self.req(node, 0)?,
            "LeakyRelu" => {
                let x = self.req(node, 0)?;
                let alpha = a.float_or("alpha", 0.01).inv()?;
                self.op(K::LeakyRelu, LeakyReluAttrs { alpha }.to_attrs(), &[x])?
            }
            "Elu" => {
                let x = self.req(node, 0)?;
                let alpha = a.float_or("alpha", 1.0).inv()?;
                self.op(K::Elu, EluAttrs { alpha }.to_attrs(), &[x])?
            }
            "Selu" => {
                let x = self.req(node, 0)?;
                // ONNX's defaults (f32 values), not ppir's.
                let attrs = SeluAttrs {
                    alpha: a.float_or("alpha", 1.673_263_192_176_818_8).inv()?,
                    gamma: a.float_or("gamma", 1.050_701_022_148_132_3).inv()?,
                };
                self.op(K::Selu, attrs.to_attrs(), &[x])?
            }
            "HardSigmoid" => {
                let x = self.req(node, 0)?;
                let attrs = HardSigmoidAttrs {
                    alpha: a.float_or("alpha", 0.2).inv()?,
                    beta: a.float_or("beta", 0.5).inv()?,
                };
                self.op(K::HardSigmoid, attrs.to_attrs(), &[x])?
            }
            "HardSwish" => {
                let x = self.req(node, 0)?;
                let attrs = HardSigmoidAttrs {
                    alpha: 1.0 / 6.0,
                    beta: 0.5,
                };
                let hs = self.op(K::HardSigmoid, attrs.to_attrs(), std::slice::from_ref(&x))?;
                self.op(K::Mul, Attrs::new(), &[x, hs])?
            }
            "Mish" => {
                let x = self.req(node, 0)?;
                let sp = self.op(K::Softplus, Attrs::new(), std::slice::from_ref(&x))?;
                let t = self.op(K::Tanh, Attrs::new(), &[sp])?;
                self.op(K::Mul, Attrs::new(), &[x, t])?
            }
            "Shrink" => {
                let x = self.req(node, 0)?;
                let attrs = ShrinkAttrs {
                    bias: a.float_or("bias", 0.0).inv()?,
                    lambd: a.float_or("lambd", 0.5).inv()?,
                };
                self.op(K::Shrink, attrs.to_attrs(), &[x])?
            }
            "Gelu" => {
                let x = self.req(node, 0)?;
                let approx = a.string_or("approximate", "none").inv()?;
                if approx != "none" && approx != "tanh" {
                    invalid!("approximate must be \"none\" or \"tanh\", got {approx:?}");
                }
                let attrs = GeluAttrs {
                    approximate: approx,
                };
                self.op(K::Gelu, attrs.to_attrs(), &[x])?
            }
            "Clip" => self.lower_clip(node, &a)?,
            "Cast" | "CastLike" => {
                let x = self.req(node, 0)?;
                let to = if op == "CastLike" {
                    self.ty(&self.req(node, 1)?)?.dtype
                } else {
                    cast_target(&a)?
                };
                self.op(K::Cast, CastAttrs { to }.to_attrs(), &[x])?
            }
            "Dropout" => return self.lower_dropout(node, &a),
            "Sum" | "Mean" | "Max" | "Min" => self.lower_variadic(node, op)?,
            "PRelu" => {
                let x = self.req(node, 0)?;
                let mut slope = self.req(node, 1)?;
                // Before opset 7 a 1-D slope applies along the channel axis.
                let (xr, st) = (self.rank_of(&x)?, self.ty(&slope)?);
                if opset < 7 && st.rank() == 1 && xr >= 2 && st.dims[0] != Dim::Known(1) {
                    let mut shape = vec![-1i64];
                    shape.extend(std::iter::repeat_n(1, xr - 2));
                    slope = self.op(K::Reshape, ShapeAttrs { shape }.to_attrs(), &[slope])?;
                }
                self.op(K::PRelu, Attrs::new(), &[x, slope])?
            }
            "Where" => {
                let (c, x, y) = (self.req(node, 0)?, self.req(node, 1)?, self.req(node, 2)?);
                self.op(K::Where, Attrs::new(), &[c, x, y])?
            }
            "MatMul" => {
                let (x, y) = (self.req(node, 0)?, self.req(node, 1)?);
                self.op(K::MatMul, Attrs::new(), &[x, y])?
            }
            "Gemm" => {
                let mut operands = vec![self.req(node, 0)?, self.req(node, 1)?];
                if let Some(c) = self.input(node, 2)? {
                    operands.push(c);
                }
                let attrs = GemmAttrs {
                    alpha: a.float_or("alpha", 1.0).inv()?,
                    beta: a.float_or("beta", 1.0).inv()?,
                    trans_a: a.int_or("transA", 0).inv()? != 0,
                    trans_b: a.int_or("transB", 0).inv()? != 0,
                };
                self.op(K::Gemm, attrs.to_attrs(), &operands)?
            }
            "Conv" => self.lower_conv(node, &a)?,
            "ConvTranspose" => self.lower_conv_transpose(node, &a)?,
            "MaxPool" if node.output.get(1).is_some_and(|o| !o.is_empty()) => {
                let y = self.lower_pool(node, &a, K::MaxPool)?;
                let z = self.lower_max_pool_indices(node, &a, y.clone())?;
                return Ok(vec![y, z]);
            }
            "MaxUnpool" => self.lower_max_unpool(node, &a)?,
            "MaxPool" | "AveragePool" => {
                let k = if op == "MaxPool" {
                    K::MaxPool
                } else {
                    K::AvgPool
                };
                self.lower_pool(node, &a, k)?
            }
            "GlobalAveragePool" => {
                let x = self.req(node, 0)?;
                self.op(K::GlobalAvgPool, Attrs::new(), &[x])?
            }
            "GlobalMaxPool" => {
                let x = self.req(node, 0)?;
                self.op(K::GlobalMaxPool, Attrs::new(), &[x])?
            }
            "BatchNormalization" if opset >= 14 && a.int_or("training_mode", 0).inv()? != 0 => {
                return self.lower_batch_norm_training(node, &a)
            }
            "BatchNormalization" => self.lower_batch_norm(node, &a)?,
            "InstanceNormalization" => {
                let (x, s, b) = (self.req(node, 0)?, self.req(node, 1)?, self.req(node, 2)?);
                let epsilon = a.float_or("epsilon", 1e-5).inv()?;
                let attrs = InstanceNormAttrs { epsilon }.to_attrs();
                self.op(K::InstanceNorm, attrs, &[x, s, b])?
            }
            "LayerNormalization" => return self.lower_layer_norm(node, &a),
            "SoftmaxCrossEntropyLoss" => return self.lower_loss(node, &a, true),
            "NegativeLogLikelihoodLoss" => return self.lower_loss(node, &a, false),
            "Einsum" => self.lower_einsum(node, &a)?,
            "ArgMax" | "ArgMin" => self.lower_arg_extreme(node, &a, op == "ArgMax")?,
            "CumSum" => self.lower_cumsum(node, &a, false)?,
            "CumProd" => self.lower_cumsum(node, &a, true)?,
            "LpNormalization" => self.lower_lp_normalization(node, &a)?,
            "MeanVarianceNormalization" => self.lower_mvn(node, &a)?,
            "GroupNormalization" => {
                if opset < 18 {
                    return Err(self.unsupported_op(node));
                }
                self.lower_group_norm(node, &a)?
            }
            "LpPool" => self.lower_lp_pool(node, &a)?,
            "CausalConvWithState" => return self.lower_causal_conv(node, &a),
            "Resize" | "Upsample" => self.lower_resize(node, &a)?,
            "EyeLike" => self.lower_eye_like(node, &a)?,
            "HannWindow" | "HammingWindow" | "BlackmanWindow" => self.lower_window(node, &a)?,
            "AffineGrid" => self.lower_affine_grid(node, &a)?,
            "CenterCropPad" => self.lower_center_crop_pad(node, &a)?,
            "DFT" => self.lower_dft(node, &a)?,
            "STFT" => self.lower_stft(node, &a)?,
            "MelWeightMatrix" => self.lower_mel_weight_matrix(node, &a)?,
            "TensorScatter" => self.lower_tensor_scatter(node, &a)?,
            "ReverseSequence" => self.lower_reverse_sequence(node, &a)?,
            "Col2Im" => self.lower_col2im(node, &a)?,
            "GridSample" => self.lower_grid_sample(node, &a)?,
            "LinearAttention" => return self.lower_linear_attention(node, &a),
            "GatherElements" => self.lower_gather_elements(node, &a)?,
            "GatherND" => self.lower_gather_nd(node, &a)?,
            "RMSNormalization" => self.lower_rms_norm(node, &a)?,
            "RotaryEmbedding" => self.lower_rotary_embedding(node, &a)?,
            "Attention" => return self.lower_attention(node, &a),
            "Hardmax" => self.lower_hardmax(node, &a)?,
            "Mod" => {
                let (x, y) = (self.req(node, 0)?, self.req(node, 1)?);
                let fmod = match a.int_or("fmod", 0).inv()? {
                    0 => false,
                    1 => true,
                    f => invalid!("attribute `fmod` must be 0 or 1, not {f}"),
                };
                self.op(K::Mod, ModAttrs { fmod }.to_attrs(), &[x, y])?
            }
            "OneHot" => self.lower_one_hot(node, &a)?,
            "TopK" => return self.lower_top_k(node, &a),
            "SpaceToDepth" => self.lower_space_depth(node, &a, true)?,
            "DepthToSpace" => self.lower_space_depth(node, &a, false)?,
            "ScatterElements" | "Scatter" => self.lower_scatter_elements(node, &a)?,
            "ScatterND" => self.lower_scatter_nd(node, &a)?,
            "LRN" => {
                let x = self.req(node, 0)?;
                let Some(size) = a.int("size").inv()? else {
                    invalid!("attribute `size` is required")
                };
                let attrs = LrnAttrs {
                    size,
                    alpha: a.float_or("alpha", 1e-4).inv()?,
                    beta: a.float_or("beta", 0.75).inv()?,
                    bias: a.float_or("bias", 1.0).inv()?,
                };
                self.op(K::Lrn, attrs.to_attrs(), &[x])?
            }
            "Softmax" | "LogSoftmax" => {
                let k = if op == "Softmax" {
                    K::Softmax
                } else {
                    K::LogSoftmax
                };
                self.lower_softmax(node, &a, k)?
            }
            "ReduceSum" | "ReduceMean" | "ReduceMax" | "ReduceMin" | "ReduceL1" | "ReduceL2"
            | "ReduceSumSquare" | "ReduceLogSum" | "ReduceLogSumExp" | "ReduceProd" => {
                self.lower_reduce(node, &a, op)?
            }
            "Reshape" => self.lower_reshape(node, &a)?,
            "Flatten" => {
                let x = self.req(node, 0)?;
                let axis = a.int_or("axis", 1).inv()?;
                self.op(K::Flatten, FlattenAttrs { axis }.to_attrs(), &[x])?
            }
            "Transpose" => {
                let x = self.req(node, 0)?;
                let rank = self.rank_of(&x)?;
                let perm = a
                    .ints("perm")
                    .inv()?
                    .unwrap_or_else(|| (0..rank as i64).rev().collect());
                let attrs = TransposeAttrs { perm: Some(perm) };
                self.op(K::Transpose, attrs.to_attrs(), &[x])?
            }
            "Concat" => {
                let Some(axis) = a.int("axis").inv()? else {
                    invalid!("attribute `axis` is required")
                };
                let xs = (0..node.input.len())
                    .map(|i| self.req(node, i))
                    .collect::<R<Vec<_>>>()?;
                if xs.is_empty() {
                    invalid!("needs at least one input");
                }
                self.op(K::Concat, ConcatAttrs { axis }.to_attrs(), &xs)?
            }
            "Split" => return self.lower_split(node, &a),
            "Slice" => self.lower_slice(node, &a)?,
            "Gather" => {
                let (data, idx) = (self.req(node, 0)?, self.req(node, 1)?);
                let axis = a.int_or("axis", 0).inv()?;
                self.op(K::Gather, GatherAttrs { axis }.to_attrs(), &[data, idx])?
            }
            "Expand" => self.lower_expand(node)?,
            "Pad" => self.lower_pad(node, &a)?,
            "Tile" => {
                let x = self.req(node, 0)?;
                let Some(repeats) = self.static_ints(node, 1, "repeats")? else {
                    invalid!("input 1 (repeats) is missing")
                };
                self.op(K::Tile, TileAttrs { repeats }.to_attrs(), &[x])?
            }
            "Squeeze" => {
                let x = self.req(node, 0)?;
                let axes = if opset < 13 {
                    a.ints("axes").inv()?
                } else {
                    self.static_ints(node, 1, "axes")?
                };
                let dims = self.dims_of(&x)?;
                let axes = match axes {
                    Some(ax) => ax,
                    None => (0..dims.len() as i64)
                        .filter(|&i| dims[i as usize] == Dim::Known(1))
                        .collect(),
                };
                self.op(K::Squeeze, SqueezeAttrs { axes }.to_attrs(), &[x])?
            }
            "Unsqueeze" => {
                let x = self.req(node, 0)?;
                let axes = if opset < 13 {
                    a.ints("axes").inv()?
                } else {
                    self.static_ints(node, 1, "axes")?
                };
                let Some(axes) = axes else {
                    invalid!("`axes` is required")
                };
                self.op(K::Unsqueeze, UnsqueezeAttrs { axes }.to_attrs(), &[x])?
            }
            "Constant" => self.lower_constant(&a)?,
            "ConstantOfShape" => {
                let dims = self.static_sym_ints(node, 0, "the shape")?;
                let mut shape = Vec::with_capacity(dims.len());
                for d in dims {
                    match d {
                        SymInt::Known(n) if n >= 0 => shape.push(n as usize),
                        SymInt::Known(n) => invalid!("negative dimension {n}"),
                        SymInt::Batch => unsupported!("{}", BATCH_NEEDED),
                    }
                }
                element_count(&shape.iter().map(|&d| d as i64).collect::<Vec<_>>()).inv()?;
                let value = match a.tensor("value").inv()? {
                    Some(tp) => {
                        let t = tensor_from_proto(tp, self.model_dir)?;
                        if t.num_elements() != 1 {
                            invalid!("`value` must hold one element, it has {}", t.num_elements());
                        }
                        Tensor {
                            dtype: t.dtype,
                            shape: vec![],
                            data: t.data,
                        }
                    }
                    None => scalar(DType::F32, 0.0),
                };
                Val::Splat {
                    value: Rc::new(value),
                    shape,
                }
            }
            "Shape" => {
                let x = self.req(node, 0)?;
                let dims = self.dims_of(&x)?;
                let r = dims.len() as i64;
                let clamp = |v: i64| if v < 0 { (v + r).max(0) } else { v.min(r) };
                let start = clamp(a.int_or("start", 0).inv()?);
                let end = clamp(a.int("end").inv()?.unwrap_or(r));
                let dims = if start < end {
                    &dims[start as usize..end as usize]
                } else {
                    &dims[0..0]
                };
                self.shape_val(dims, vec![dims.len()])
            }
            "Size" => {
                let x = self.req(node, 0)?;
                let dims = self.dims_of(&x)?;
                let size = |b: i64| {
                    dims.iter().try_fold(1i64, |acc, d| {
                        acc.checked_mul(d.known().map_or(b, |n| n as i64))
                    })
                };
                let (Some(ta), Some(tb)) =
                    (size(super::import::BATCH_A), size(super::import::BATCH_B))
                else {
                    invalid!(
                        "the element count of a {}-dimensional tensor overflows",
                        dims.len()
                    )
                };
                let t = |v: i64| Rc::new(Tensor::from_i64(DType::I64, vec![], vec![v]));
                if ta == tb {
                    Val::Const(t(ta))
                } else {
                    Val::Sym { a: t(ta), b: t(tb) }
                }
            }
            "Range" => {
                let what = ["start", "limit", "delta"];
                let mut v = [0.0; 3];
                let mut dtype = DType::I64;
                for (i, w) in what.iter().enumerate() {
                    let t = match self.static_input(node, i, w)? {
                        Some(t) => t,
                        None => invalid!("input {i} ({w}) is missing"),
                    };
                    if t.num_elements() != 1 {
                        invalid!("{w} must be a scalar");
                    }
                    dtype = t.dtype;
                    v[i] = t.to_f64_vec()[0];
                }
                let [start, limit, delta] = v;
                if delta == 0.0 {
                    invalid!("delta is 0");
                }
                let n = ((limit - start) / delta).ceil().max(0.0);
                if n > (1 << 24) as f64 {
                    unsupported!("a range of {n} elements is too large to fold at import time");
                }
                let mut vals: Vec<f64> =
                    (0..n as usize).map(|i| start + i as f64 * delta).collect();
                // Range-27: float16/bfloat16 ranges are computed in `stash_type` (float by
                // default, or double) and rounded back; ppcc folds in double, so a float
                // stash rounds through float first.
                if opset >= 27 && matches!(dtype, DType::F16 | DType::BF16) {
                    match a.int_or("stash_type", 1).inv()? {
                        1 => vals.iter_mut().for_each(|x| *x = *x as f32 as f64),
                        11 => {}
                        t => invalid!("stash_type must be 1 (float) or 11 (double), not {t}"),
                    }
                }
                let t = if dtype.is_float() {
                    Tensor::from_f64(dtype, vec![vals.len()], vals)
                } else {
                    Tensor::from_i64(
                        dtype,
                        vec![vals.len()],
                        vals.iter().map(|&x| x as i64).collect(),
                    )
                };
                self.constant_val(t)
            }
            "Trilu" => {
                let Some(x) = self.static_input(node, 0, "the input")? else {
                    invalid!("input 0 is missing")
                };
                let k = self
                    .static_ints(node, 1, "k")?
                    .and_then(|v| v.first().copied())
                    .unwrap_or(0);
                let upper = a.int_or("upper", 1).inv()? != 0;
                self.constant_val(trilu(&x, k, upper)?)
            }
            // Sequences are lists of values at import time.
            "SequenceEmpty" => Val::Seq(vec![]),
            "SequenceConstruct" => Val::Seq(
                (0..node.input.len())
                    .map(|i| self.req(node, i))
                    .collect::<R<Vec<_>>>()?,
            ),
            "SequenceInsert" => {
                let mut items = self.seq(node, 0)?;
                let x = self.req(node, 1)?;
                let n = items.len() as i64;
                let pos = self
                    .static_ints(node, 2, "position")?
                    .and_then(|v| v.first().copied())
                    .unwrap_or(n);
                if pos < -n || pos > n {
                    invalid!("position {pos} is out of range for a sequence of {n}");
                }
                items.insert(
                    if pos < 0 {
                        (pos + n) as usize
                    } else {
                        pos as usize
                    },
                    x,
                );
                Val::Seq(items)
            }
            "SequenceErase" => {
                let mut items = self.seq(node, 0)?;
                let n = items.len() as i64;
                let pos = self
                    .static_ints(node, 1, "position")?
                    .and_then(|v| v.first().copied())
                    .unwrap_or(-1);
                if pos < -n || pos >= n {
                    invalid!("position {pos} is out of range for a sequence of {n}");
                }
                items.remove(if pos < 0 {
                    (pos + n) as usize
                } else {
                    pos as usize
                });
                Val::Seq(items)
            }
            "SequenceAt" => {
                let items = self.seq(node, 0)?;
                let n = items.len() as i64;
                let Some(pos) = self
                    .static_ints(node, 1, "position")?
                    .and_then(|v| v.first().copied())
                else {
                    invalid!("input 1 (position) is missing")
                };
                if pos < -n || pos >= n {
                    invalid!("position {pos} is out of range for a sequence of {n}");
                }
                items[if pos < 0 {
                    (pos + n) as usize
                } else {
                    pos as usize
                }]
                .clone()
            }
            "SequenceLength" => {
                let n = self.seq(node, 0)?.len() as i64;
                self.constant_val(Tensor::from_i64(DType::I64, vec![], vec![n]))
            }
            "ConcatFromSequence" => {
                let items = self.seq(node, 0)?;
                if items.is_empty() {
                    invalid!("the sequence is empty");
                }
                let Some(axis) = a.int("axis").inv()? else {
                    invalid!("attribute `axis` is required")
                };
                let items = if a.int_or("new_axis", 0).inv()? != 0 {
                    let r = self.rank_of(&items[0])? as i64 + 1;
                    let ax = if axis < 0 { axis + r } else { axis };
                    items
                        .iter()
                        .map(|v| {
                            let attrs = UnsqueezeAttrs { axes: vec![ax] };
                            self.op(K::Unsqueeze, attrs.to_attrs(), std::slice::from_ref(v))
                        })
                        .collect::<R<Vec<_>>>()?
                } else {
                    items
                };
                self.op(K::Concat, ConcatAttrs { axis }.to_attrs(), &items)?
            }
            "SplitToSequence" => self.lower_split_to_sequence(node, &a)?,
            "If" => return self.lower_if(node, &a),
            "Loop" => return self.lower_loop(node, &a),
            "Scan" => return self.lower_scan(node, &a),
            "RNN" | "GRU" | "LSTM" => return self.lower_recurrent(node, &a),
            "Compress" => self.lower_compress(node, &a)?,
            "Unique" => return self.lower_unique(node, &a),
            "Det" => self.lower_det(node)?,
            _ => {
                return Err(Fail::Onnx(super::OnnxError::UnsupportedOp {
                    node: self.loc.clone(),
                    op_type: node.op_type.clone(),
                    domain: node.domain.clone(),
                    opset,
                }))
            }
        };
        Ok(vec![out])
    }

    /// `Shape`'s result: constant, or symbolic when a dimension is the batch size.
    fn shape_val(&self, dims: &[Dim], shape: Vec<usize>) -> Val {
        let with = |b: i64| {
            Rc::new(Tensor::from_i64(
                DType::I64,
                shape.clone(),
                dims.iter()
                    .map(|d| d.known().map_or(b, |n| n as i64))
                    .collect(),
            ))
        };
        if dims.iter().all(|d| d.known().is_some()) {
            Val::Const(with(0))
        } else {
            Val::Sym {
                a: with(super::import::BATCH_A),
                b: with(super::import::BATCH_B),
            }
        }
    }

    fn lower_binary(&mut self, node: &NodeProto, a: &NodeAttrs, kind: OpKind) -> R<Val> {
        let x = self.req(node, 0)?;
        let mut y = self.req(node, 1)?;
        // Before opset 7, `broadcast = 1` with `axis` aligns B's dims at `axis` of A.
        if self.opset < 7 && a.int_or("broadcast", 0).inv()? != 0 {
            if let Some(axis) = a.int("axis").inv()? {
                let (ra, yt) = (self.rank_of(&x)?, self.ty(&y)?);
                let axis = norm_axis(axis, ra.max(1))?;
                let trailing = ra.saturating_sub(axis + yt.rank());
                if trailing > 0 && yt.rank() > 0 {
                    let axes: Vec<i64> = (yt.rank()..yt.rank() + trailing)
                        .map(|i| i as i64)
                        .collect();
                    y = self.op(OpKind::Unsqueeze, UnsqueezeAttrs { axes }.to_attrs(), &[y])?;
                }
            }
        }
        // Pow may raise to an exponent of another type (opset 12+).
        if kind == OpKind::Pow {
            let (dx, dy) = (self.ty(&x)?.dtype, self.ty(&y)?.dtype);
            if dx != dy {
                y = self.op(OpKind::Cast, CastAttrs { to: dx }.to_attrs(), &[y])?;
            }
        }
        self.op(kind, Attrs::new(), &[x, y])
    }

    fn lower_variadic(&mut self, node: &NodeProto, op: &str) -> R<Val> {
        let xs = (0..node.input.len())
            .map(|i| self.req(node, i))
            .collect::<R<Vec<_>>>()?;
        if xs.is_empty() {
            invalid!("needs at least one input");
        }
        let kind = match op {
            "Sum" | "Mean" => OpKind::Add,
            "Max" => OpKind::Max,
            _ => OpKind::Min,
        };
        let mut acc = xs[0].clone();
        for x in &xs[1..] {
            acc = self.op(kind, Attrs::new(), &[acc, x.clone()])?;
        }
        if op == "Mean" && xs.len() > 1 {
            let dtype = self.ty(&acc)?.dtype;
            let n = Val::konst(scalar(dtype, xs.len() as f64));
            acc = self.op(OpKind::Div, Attrs::new(), &[acc, n])?;
        }
        Ok(acc)
    }

    fn lower_clip(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Val> {
        let x = self.req(node, 0)?;
        if self.opset < 11 {
            let attrs = ClipAttrs {
                min: a.float_or("min", f64::NEG_INFINITY).inv()?,
                max: a.float_or("max", f64::INFINITY).inv()?,
            };
            return self.op(OpKind::Clip, attrs.to_attrs(), &[x]);
        }
        // Bounds not given stay unbounded (the declared defaults).
        let mut bounds: ClipAttrs = defaults()?;
        let mut runtime = vec![];
        for (i, name) in [(1, "min"), (2, "max")] {
            let Some(v) = self.input(node, i)? else {
                continue;
            };
            match self.static_tensor(&v)? {
                Some(t) if t.num_elements() == 1 => {
                    let bound = if i == 1 {
                        &mut bounds.min
                    } else {
                        &mut bounds.max
                    };
                    *bound = t.to_f64_vec()[0];
                }
                Some(t) => invalid!("{name} must be a scalar, it has shape {:?}", t.shape),
                None => runtime.push((name, v)),
            }
        }
        let mut y = self.op(OpKind::Clip, bounds.to_attrs(), &[x])?;
        // Bounds computed at run time: max(x, min) then min(.., max).
        for (name, v) in runtime {
            let k = if name == "min" {
                OpKind::Max
            } else {
                OpKind::Min
            };
            y = self.op(k, Attrs::new(), &[y, v])?;
        }
        Ok(y)
    }

    fn lower_dropout(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Vec<Val>> {
        let x = self.req(node, 0)?;
        let (ratio, mut training) = if self.opset < 12 {
            (a.float_or("ratio", 0.5).inv()?, false)
        } else {
            let training = self
                .static_scalar_f64(node, 2, "training_mode")?
                .unwrap_or(0.0)
                != 0.0;
            // Outside training the ratio changes nothing: it may be computed at run time.
            let ratio = match self.input(node, 1)? {
                Some(r) if !training && self.static_tensor(&r)?.is_none() => 0.5,
                _ => self.static_scalar_f64(node, 1, "ratio")?.unwrap_or(0.5),
            };
            if training && !(0.0..1.0).contains(&ratio) {
                invalid!("ratio must be in [0, 1), got {ratio}");
            }
            (ratio, training)
        };
        if ratio == 0.0 {
            // Nothing is dropped, in training or not: the identity with an all-true mask.
            training = false;
        }
        let mut dropout = DropoutAttrs {
            ratio,
            training,
            ..defaults()?
        };
        if training {
            if let Some(seed) = a.int("seed").inv()? {
                dropout.seed = seed;
            }
        }
        let attrs = dropout.to_attrs();
        let wants_mask = node.output.get(1).is_some_and(|o| !o.is_empty());
        if !wants_mask {
            return Ok(vec![self.op(OpKind::Dropout, attrs, &[x])?]);
        }
        if !training {
            // Inference: the mask is all true.
            let y = self.op(OpKind::Dropout, attrs, std::slice::from_ref(&x))?;
            let ty = self.ty(&x)?;
            let mask = match ty.static_shape() {
                Some(s) => Val::Splat {
                    value: Rc::new(Tensor::from_i64(DType::Bool, vec![], vec![1])),
                    shape: s.iter().map(|&d| d as usize).collect(),
                },
                None => Val::Opaque(
                    "the mask of a Dropout on a batch-sized tensor is unsupported".into(),
                ),
            };
            return Ok(vec![y, mask]);
        }
        self.op_n(OpKind::Dropout, attrs, &[x], 2)
    }

    fn conv_common(
        &self,
        a: &NodeAttrs,
        x: &Val,
        kernel: &[i64],
    ) -> R<(Vec<i64>, Vec<i64>, Vec<i64>)> {
        let n = kernel.len();
        let strides = a.ints("strides").inv()?.unwrap_or_else(|| vec![1; n]);
        let dilations = a.ints("dilations").inv()?.unwrap_or_else(|| vec![1; n]);
        if strides.len() != n || dilations.len() != n {
            invalid!("strides/dilations must have {n} entries (one per spatial dimension)");
        }
        if strides.iter().chain(&dilations).any(|&s| s <= 0) {
            invalid!("strides and dilations must be positive");
        }
        let auto_pad = a.string_or("auto_pad", "NOTSET").inv()?;
        let pads = match auto_pad.as_str() {
            "NOTSET" | "" => a.ints("pads").inv()?.unwrap_or_else(|| vec![0; 2 * n]),
            "VALID" => vec![0; 2 * n],
            "SAME_UPPER" | "SAME_LOWER" => {
                let input = self.spatial_sizes(x)?;
                if input.len() != n {
                    invalid!(
                        "kernel has {n} spatial dimensions, the input {}",
                        input.len()
                    );
                }
                same_pads(
                    &input,
                    kernel,
                    &strides,
                    &dilations,
                    auto_pad == "SAME_UPPER",
                )
            }
            other => invalid!("unknown auto_pad {other:?}"),
        };
        if pads.len() != 2 * n {
            invalid!("pads must have {} entries, got {}", 2 * n, pads.len());
        }
        Ok((strides, pads, dilations))
    }

    fn lower_conv(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Val> {
        let (x, w) = (self.req(node, 0)?, self.req(node, 1)?);
        let wt = self.ty(&w)?;
        if wt.rank() < 3 {
            invalid!("weights must have rank at least 3, got {}", wt.rank());
        }
        let kernel = match a.ints("kernel_shape").inv()? {
            Some(k) => k,
            None => match usize_dims(&wt) {
                Some(d) => d[2..].to_vec(),
                None => invalid!("weights have a symbolic shape"),
            },
        };
        let (strides, pads, dilations) = self.conv_common(a, &x, &kernel)?;
        let attrs = ConvAttrs {
            strides: Some(strides),
            pads: Some(pads),
            dilations: Some(dilations),
            group: a.int_or("group", 1).inv()?,
            kernel_shape: None,
        };
        let mut operands = vec![x, w];
        if let Some(b) = self.input(node, 2)? {
            operands.push(b);
        }
        self.op(OpKind::Conv, attrs.to_attrs(), &operands)
    }

    fn lower_conv_transpose(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Val> {
        let (x, w) = (self.req(node, 0)?, self.req(node, 1)?);
        let wt = self.ty(&w)?;
        if wt.rank() < 3 {
            invalid!("weights must have rank at least 3, got {}", wt.rank());
        }
        let kernel = match a.ints("kernel_shape").inv()? {
            Some(k) => k,
            None => match usize_dims(&wt) {
                Some(d) => d[2..].to_vec(),
                None => invalid!("weights have a symbolic shape"),
            },
        };
        let n = kernel.len();
        let strides = a.ints("strides").inv()?.unwrap_or_else(|| vec![1; n]);
        let dilations = a.ints("dilations").inv()?.unwrap_or_else(|| vec![1; n]);
        let mut output_padding = a
            .ints("output_padding")
            .inv()?
            .unwrap_or_else(|| vec![0; n]);
        if strides.len() != n || dilations.len() != n || output_padding.len() != n {
            invalid!("strides/dilations/output_padding must have {n} entries");
        }
        let auto_pad = a.string_or("auto_pad", "NOTSET").inv()?;
        let output_shape = a.ints("output_shape").inv()?;
        let pads = if output_shape.is_some() || auto_pad.starts_with("SAME") {
            let input = self.spatial_sizes(&x)?;
            let target: Vec<i64> = match output_shape {
                Some(s) if s.len() == n => s,
                Some(s) if s.len() == n + 2 => s[2..].to_vec(),
                Some(s) => invalid!("output_shape {s:?} does not match {n} spatial dimensions"),
                None => input.iter().zip(&strides).map(|(i, s)| i * s).collect(),
            };
            let mut pads = vec![0; 2 * n];
            for i in 0..n {
                let full = strides[i]
                    .saturating_mul(input[i] - 1)
                    .saturating_add(output_padding[i])
                    .saturating_add(kernel[i].saturating_sub(1).saturating_mul(dilations[i]))
                    .saturating_add(1);
                // The ONNX spec's total padding. A negative one (a requested size beyond the
                // full output) grows the output at the end, where no input reaches: onnx's
                // reference and onnxruntime give the bias there, as more output_padding does.
                let total = full.saturating_sub(target[i]);
                if total < 0 {
                    output_padding[i] = output_padding[i].saturating_sub(total);
                    continue;
                }
                let (half, rest) = (total / 2, total - total / 2);
                if auto_pad == "SAME_UPPER" {
                    pads[i] = half;
                    pads[i + n] = rest;
                } else {
                    pads[i] = rest;
                    pads[i + n] = half;
                }
            }
            pads
        } else if auto_pad == "VALID" {
            vec![0; 2 * n]
        } else {
            a.ints("pads").inv()?.unwrap_or_else(|| vec![0; 2 * n])
        };
        let attrs = ConvTransposeAttrs {
            strides: Some(strides),
            pads: Some(pads),
            dilations: Some(dilations),
            output_padding: Some(output_padding),
            group: a.int_or("group", 1).inv()?,
        };
        let mut operands = vec![x, w];
        if let Some(b) = self.input(node, 2)? {
            operands.push(b);
        }
        self.op(OpKind::ConvTranspose, attrs.to_attrs(), &operands)
    }

    fn lower_pool(&mut self, node: &NodeProto, a: &NodeAttrs, kind: OpKind) -> R<Val> {
        let x = self.req(node, 0)?;
        let Some(kernel) = a.ints("kernel_shape").inv()? else {
            invalid!("attribute `kernel_shape` is required")
        };
        let (strides, pads, dilations) = self.conv_common(a, &x, &kernel)?;
        let ceil_mode = a.int_or("ceil_mode", 0).inv()? != 0;
        let attrs = if kind == OpKind::MaxPool {
            MaxPoolAttrs {
                kernel_shape: kernel,
                strides: Some(strides),
                pads: Some(pads),
                dilations: Some(dilations),
                ceil_mode,
            }
            .to_attrs()
        } else {
            AvgPoolAttrs {
                kernel_shape: kernel,
                strides: Some(strides),
                pads: Some(pads),
                dilations: Some(dilations),
                ceil_mode,
                count_include_pad: a.int_or("count_include_pad", 0).inv()? != 0,
            }
            .to_attrs()
        };
        self.op(kind, attrs, &[x])
    }

    fn lower_batch_norm(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Val> {
        if self.opset < 7
            && a.int_or("is_test", 0).inv()? == 0
            && node.output.iter().skip(1).any(|o| !o.is_empty())
        {
            unsupported!("training-mode BatchNormalization (is_test = 0 with statistics outputs)");
        }
        let x = self.req(node, 0)?;
        let mut operands = vec![x.clone()];
        for i in 1..5 {
            let v = self.req(node, i)?;
            if self.opset < 9 && a.int_or("spatial", 1).inv()? == 0 && self.rank_of(&v)? != 1 {
                unsupported!("BatchNormalization with spatial = 0 and per-activation statistics");
            }
            operands.push(v);
        }
        // `momentum` only matters when training updates the running statistics.
        let attrs = BatchNormAttrs {
            epsilon: a.float_or("epsilon", 1e-5).inv()?,
            momentum: a.float_or("momentum", 0.9).inv()?,
        }
        .to_attrs();
        if operands.iter().all(Val::is_foldable) {
            return self.op(OpKind::BatchNorm, attrs, &operands);
        }
        // Running statistics (inputs 3 and 4) are state, not trained parameters.
        let mut ids = Vec::with_capacity(5);
        for (i, v) in operands.iter().enumerate() {
            ids.push(self.ir_as(
                v,
                if i >= 3 {
                    ArgKind::State
                } else {
                    ArgKind::Param
                },
            )?);
        }
        Ok(Val::Ir(self.push_ir(OpKind::BatchNorm, attrs, ids)?[0]))
    }

    /// `LayerNormalization`; the optional `Mean` and `InvStdDev` results (over
    /// `axis..rank`, kept as size-1 axes) come from the same decomposition as Y, computed in
    /// float32 for float16/bfloat16 inputs and in the input's type otherwise, and given in
    /// `stash_type`'s type (1: float, 16: bfloat16, the types ONNX allows for them).
    fn lower_layer_norm(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Vec<Val>> {
        use OpKind as K;
        let (x, scale) = (self.req(node, 0)?, self.req(node, 1)?);
        let bias = self.input(node, 2)?;
        let attrs = LayerNormAttrs {
            axis: a.int_or("axis", -1).inv()?,
            epsilon: a.float_or("epsilon", 1e-5).inv()?,
        };
        let wants = |i: usize| node.output.get(i).is_some_and(|o| !o.is_empty());
        if !wants(1) && !wants(2) {
            let mut operands = vec![x, scale];
            operands.extend(bias);
            return Ok(vec![self.op(K::LayerNorm, attrs.to_attrs(), &operands)?]);
        }
        let stash = match a.int_or("stash_type", 1).inv()? {
            1 => DType::F32,
            16 => DType::BF16,
            s => invalid!("stash_type must be 1 (float) or 16 (bfloat16), got {s}"),
        };
        let xt = self.ty(&x)?;
        if !xt.dtype.is_float() {
            invalid!("expects a float tensor, got {}", xt.dtype);
        }
        let rank = xt.rank();
        let axis = norm_axis(attrs.axis, rank.max(1))?;
        let cd = match xt.dtype {
            DType::F16 | DType::BF16 => DType::F32,
            d => d,
        };
        let xs = if cd != xt.dtype {
            self.op(K::Cast, CastAttrs { to: cd }.to_attrs(), &[x])?
        } else {
            x
        };
        let over = ReduceAttrs {
            axes: (axis as i64..rank as i64).collect(),
            keepdims: true,
        };
        let mean = self.op(K::ReduceMean, over.to_attrs(), std::slice::from_ref(&xs))?;
        let d = self.op(K::Sub, Attrs::new(), &[xs, mean.clone()])?;
        let sq = self.op(K::Mul, Attrs::new(), &[d.clone(), d.clone()])?;
        let var = self.op(K::ReduceMean, over.to_attrs(), &[sq])?;
        let eps = Val::konst(scalar(cd, attrs.epsilon));
        let ve = self.op(K::Add, Attrs::new(), &[var, eps])?;
        let sd = self.op(K::Sqrt, Attrs::new(), &[ve])?;
        let inv = self.op(K::Reciprocal, Attrs::new(), &[sd])?;
        let mut y = self.op(K::Mul, Attrs::new(), &[d, inv.clone()])?;
        if cd != xt.dtype {
            y = self.op(K::Cast, CastAttrs { to: xt.dtype }.to_attrs(), &[y])?;
        }
        y = self.op(K::Mul, Attrs::new(), &[y, scale])?;
        if let Some(b) = bias {
            y = self.op(K::Add, Attrs::new(), &[y, b])?;
        }
        let (mean, inv) = if cd == stash {
            (mean, inv)
        } else {
            let to = CastAttrs { to: stash }.to_attrs();
            (
                self.op(K::Cast, to.clone(), &[mean])?,
                self.op(K::Cast, to, &[inv])?,
            )
        };
        Ok(vec![y, mean, inv])
    }

    fn lower_softmax(&mut self, node: &NodeProto, a: &NodeAttrs, kind: OpKind) -> R<Val> {
        let x = self.req(node, 0)?;
        let dims = self.dims_of(&x)?;
        let rank = dims.len();
        if self.opset >= 13 {
            let axis = a.int_or("axis", -1).inv()?;
            return self.op(kind, SoftmaxAttrs { axis }.to_attrs(), &[x]);
        }
        // Before opset 13: the input is coerced to 2-D [d0*..*d(axis-1), d(axis)*..*d(n-1)]
        // and normalised along the second dimension.
        let axis = norm_axis(a.int_or("axis", 1).inv()?, rank.max(1))?;
        if rank == 0 || axis + 1 >= rank {
            return self.op(kind, SoftmaxAttrs { axis: -1 }.to_attrs(), &[x]);
        }
        let group = |ds: &[Dim]| -> R<i64> {
            let batch = ds.iter().filter(|d| **d == Dim::Batch).count();
            match batch {
                0 => ds
                    .iter()
                    .try_fold(1i64, |acc, d| {
                        acc.checked_mul(d.known().unwrap_or(0) as i64)
                    })
                    .ok_or_else(|| Fail::Invalid("the element count overflows".into())),
                1 => Ok(-1),
                _ => unsupported!("{}", BATCH_NEEDED),
            }
        };
        let (outer, inner) = (group(&dims[..axis])?, group(&dims[axis..])?);
        if outer == -1 && inner == -1 {
            unsupported!("{}", BATCH_NEEDED);
        }
        let flat = self.op(
            OpKind::Reshape,
            ShapeAttrs {
                shape: vec![outer, inner],
            }
            .to_attrs(),
            &[x],
        )?;
        let y = self.op(kind, SoftmaxAttrs { axis: 1 }.to_attrs(), &[flat])?;
        let back: Vec<i64> = dims
            .iter()
            .map(|d| d.known().map_or(-1, |n| n as i64))
            .collect();
        if back.iter().filter(|&&d| d == -1).count() > 1 {
            unsupported!("{}", BATCH_NEEDED);
        }
        self.op(OpKind::Reshape, ShapeAttrs { shape: back }.to_attrs(), &[y])
    }

    fn lower_reduce(&mut self, node: &NodeProto, a: &NodeAttrs, op: &str) -> R<Val> {
        let x = self.req(node, 0)?;
        // Version 28 of the log reductions takes float types only (else unchanged).
        if self.opset >= 28 && matches!(op, "ReduceLogSum" | "ReduceLogSumExp") {
            let dtype = self.ty(&x)?.dtype;
            if !dtype.is_float() {
                invalid!("takes a float tensor from opset 28, not {dtype}");
            }
        }
        let axes_are_input = if op == "ReduceSum" {
            self.opset >= 13
        } else {
            self.opset >= 18
        };
        let axes = if axes_are_input {
            self.static_ints(node, 1, "axes")?
        } else {
            a.ints("axes").inv()?
        }
        .unwrap_or_default();
        let keepdims = a.int_or("keepdims", 1).inv()? != 0;
        if axes.is_empty() && axes_are_input && a.int_or("noop_with_empty_axes", 0).inv()? != 0 {
            return Ok(x);
        }
        let reduce = ReduceAttrs { axes, keepdims };
        let attrs = reduce.to_attrs();
        let k = OpKind::ReduceSum;
        Ok(match op {
            "ReduceSum" => self.op(k, attrs, &[x])?,
            "ReduceMean" => self.op(OpKind::ReduceMean, attrs, &[x])?,
            "ReduceMax" => self.op(OpKind::ReduceMax, attrs, &[x])?,
            "ReduceMin" => self.op(OpKind::ReduceMin, attrs, &[x])?,
            "ReduceL1" => {
                let ax = self.op(OpKind::Abs, Attrs::new(), &[x])?;
                self.op(k, attrs, &[ax])?
            }
            "ReduceSumSquare" | "ReduceL2" => {
                let sq = self.op(OpKind::Mul, Attrs::new(), &[x.clone(), x])?;
                let s = self.op(k, attrs, &[sq])?;
                if op == "ReduceL2" {
                    self.op(OpKind::Sqrt, Attrs::new(), &[s])?
                } else {
                    s
                }
            }
            "ReduceLogSum" => {
                let s = self.op(k, attrs, &[x])?;
                self.op(OpKind::Log, Attrs::new(), &[s])?
            }
            "ReduceProd" => self.lower_reduce_prod(x, reduce.axes, reduce.keepdims)?,
            _ => self.op(OpKind::ReduceLogSumExp, attrs, &[x])?,
        })
    }

    fn lower_reshape(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Val> {
        let x = self.req(node, 0)?;
        let spec: Vec<SymInt> = if self.opset < 5 {
            match a.ints("shape").inv()? {
                Some(s) => s.into_iter().map(SymInt::Known).collect(),
                None => invalid!("attribute `shape` is required"),
            }
        } else {
            self.static_sym_ints(node, 1, "the target shape")?
        };
        let allowzero = self.opset >= 14 && a.int_or("allowzero", 0).inv()? != 0;
        let in_dims = self.dims_of(&x)?;
        let shape = resolve_reshape(&in_dims, &spec, allowzero)?;
        if shape.contains(&0) {
            // An empty result (allowzero keeps a 0 in the target): ppir's reshape has no
            // zero sizes, but an empty tensor's value is its shape alone.
            let xt = self.ty(&x)?;
            if static_elements(&xt) != Some(0) || shape.iter().any(|&d| d < 0) {
                invalid!("cannot reshape {xt} into {shape:?}");
            }
            let dims = shape.iter().map(|&d| d as usize).collect();
            return Ok(Val::konst(Tensor::zeros(xt.dtype, dims)));
        }
        self.op(OpKind::Reshape, ShapeAttrs { shape }.to_attrs(), &[x])
    }

    fn lower_expand(&mut self, node: &NodeProto) -> R<Val> {
        let x = self.req(node, 0)?;
        let spec = self.static_sym_ints(node, 1, "the target shape")?;
        let in_dims = self.dims_of(&x)?;
        // A batch-sized target dimension keeps the input's batch dimension (broadcasting 1
        // against it keeps it).
        let offset = spec.len() as i64 - in_dims.len() as i64;
        let mut shape = Vec::with_capacity(spec.len());
        for (i, s) in spec.iter().enumerate() {
            match s {
                SymInt::Known(n) => shape.push(*n),
                SymInt::Batch => {
                    let j = i as i64 - offset;
                    if j >= 0 && in_dims.get(j as usize) == Some(&Dim::Batch) {
                        shape.push(1);
                    } else {
                        unsupported!("{}", BATCH_NEEDED);
                    }
                }
            }
        }
        self.op(OpKind::Expand, ShapeAttrs { shape }.to_attrs(), &[x])
    }

    fn lower_pad(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Val> {
        let x = self.req(node, 0)?;
        let rank = self.rank_of(&x)?;
        let mode = a.string_or("mode", "constant").inv()?;
        if !matches!(mode.as_str(), "constant" | "reflect" | "edge") {
            unsupported!("Pad mode {mode:?} (ppcc supports constant, reflect, edge)");
        }
        let (pads, value) = if self.opset < 11 {
            let Some(p) = a.ints("pads").inv()? else {
                invalid!("attribute `pads` is required")
            };
            (p, a.float_or("value", 0.0).inv()?)
        } else {
            let Some(p) = self.static_ints(node, 1, "pads")? else {
                invalid!("input 1 (pads) is missing")
            };
            let value = self
                .static_scalar_f64(node, 2, "constant_value")?
                .unwrap_or(0.0);
            let p = match self.static_ints(node, 3, "axes")? {
                None => p,
                Some(axes) => {
                    if p.len() != 2 * axes.len() {
                        invalid!("pads has {} entries for {} axes", p.len(), axes.len());
                    }
                    let mut full = vec![0; 2 * rank];
                    for (k, &ax) in axes.iter().enumerate() {
                        let ax = norm_axis(ax, rank)?;
                        full[ax] = p[k];
                        full[ax + rank] = p[k + axes.len()];
                    }
                    full
                }
            };
            (p, value)
        };
        if pads.len() != 2 * rank {
            invalid!("pads has {} entries, the input has rank {rank}", pads.len());
        }
        let attrs = PadAttrs { pads, mode, value };
        self.op(OpKind::Pad, attrs.to_attrs(), &[x])
    }

    fn lower_slice(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Val> {
        let x = self.req(node, 0)?;
        let (starts, ends, axes, steps) = if self.opset < 10 {
            let (Some(s), Some(e)) = (a.ints("starts").inv()?, a.ints("ends").inv()?) else {
                invalid!("attributes `starts` and `ends` are required")
            };
            (s, e, a.ints("axes").inv()?, None)
        } else {
            let Some(s) = self.static_ints(node, 1, "starts")? else {
                invalid!("input 1 (starts) is missing")
            };
            let Some(e) = self.static_ints(node, 2, "ends")? else {
                invalid!("input 2 (ends) is missing")
            };
            (
                s,
                e,
                self.static_ints(node, 3, "axes")?,
                self.static_ints(node, 4, "steps")?,
            )
        };
        let n = starts.len();
        if ends.len() != n
            || axes.as_ref().is_some_and(|v| v.len() != n)
            || steps.as_ref().is_some_and(|v| v.len() != n)
        {
            invalid!("starts, ends, axes and steps must have the same length");
        }
        let attrs = SliceAttrs {
            starts,
            ends,
            axes: Some(axes.unwrap_or_else(|| (0..n as i64).collect())),
            steps: Some(steps.unwrap_or_else(|| vec![1; n])),
        };
        self.op(OpKind::Slice, attrs.to_attrs(), &[x])
    }

    /// Sizes of an equal split of `dim` into `parts` (the last part smaller if uneven).
    fn equal_split(dim: Dim, parts: usize, allow_uneven: bool) -> R<Vec<i64>> {
        let Dim::Known(d) = dim else {
            unsupported!("splitting the symbolic batch dimension")
        };
        if parts == 0 {
            invalid!("split into zero parts");
        }
        let d = d as i64;
        let p = parts as i64;
        if d % p == 0 {
            return Ok(vec![d / p; parts]);
        }
        if !allow_uneven {
            invalid!("dimension of size {d} does not split into {parts} equal parts");
        }
        let chunk = d / p + 1;
        let mut sizes = vec![chunk; parts - 1];
        sizes.push(d.saturating_sub(chunk.saturating_mul(p - 1)));
        if sizes.last().is_some_and(|&s| s < 0) {
            invalid!("dimension of size {d} cannot be split into {parts} parts");
        }
        Ok(sizes)
    }

    fn lower_split(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Vec<Val>> {
        let x = self.req(node, 0)?;
        let dims = self.dims_of(&x)?;
        let axis = a.int_or("axis", 0).inv()?;
        let ax = norm_axis(axis, dims.len())?;
        let n_out = node.output.len();
        let sizes = if self.opset < 13 {
            a.ints("split").inv()?
        } else {
            self.static_ints(node, 1, "split")?
        };
        let sizes = match sizes {
            Some(s) if !s.is_empty() => s,
            _ => {
                if self.opset >= 18 {
                    if let Some(n) = a.int("num_outputs").inv()? {
                        if n != n_out as i64 {
                            invalid!("num_outputs is {n} but the node has {n_out} outputs");
                        }
                    }
                }
                let parts = n_out;
                Self::equal_split(dims[ax], parts, self.opset >= 18)?
            }
        };
        if sizes.len() != n_out {
            invalid!("{} split sizes for {n_out} outputs", sizes.len());
        }
        let attrs = SplitAttrs { axis, split: sizes };
        self.op_n(OpKind::Split, attrs.to_attrs(), &[x], n_out)
    }

    fn lower_split_to_sequence(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Val> {
        let x = self.req(node, 0)?;
        let dims = self.dims_of(&x)?;
        let axis = a.int_or("axis", 0).inv()?;
        let ax = norm_axis(axis, dims.len())?;
        let keepdims = a.int_or("keepdims", 1).inv()?;
        let split = match self.input(node, 1)? {
            None => None,
            Some(v) => match self.static_tensor(&v)? {
                Some(t) => Some(t),
                None => {
                    // Sizes known only at run time: the length is still known from their shape.
                    let ty = self.ty(&v)?;
                    return match ty.dims.as_slice() {
                        [Dim::Known(n)] if *n <= MAX_SEQUENCE as u64 => Ok(Val::Seq(vec![
                            Val::Opaque(
                                "an element of a sequence split by sizes known only at run time".into()
                            );
                            *n as usize
                        ])),
                        _ => Err(self.runtime_input_error(node, 1, "split")),
                    };
                }
            },
        };
        let (sizes, squeeze) = match split {
            None => {
                let Dim::Known(d) = dims[ax] else {
                    unsupported!("splitting the symbolic batch dimension")
                };
                if d > MAX_SEQUENCE as u64 {
                    unsupported!("a sequence of {d} tensors (ppcc unrolls sequences; at most {MAX_SEQUENCE})");
                }
                (vec![1; d as usize], keepdims == 0)
            }
            Some(t) if t.shape.is_empty() => {
                let Dim::Known(d) = dims[ax] else {
                    unsupported!("splitting the symbolic batch dimension")
                };
                let chunk = t.to_i64_vec()[0];
                if chunk <= 0 {
                    invalid!("split size {chunk} must be positive");
                }
                let d = d as i64;
                if d / chunk > MAX_SEQUENCE as i64 {
                    unsupported!(
                        "a sequence of {} tensors (ppcc unrolls sequences; at most {MAX_SEQUENCE})",
                        d / chunk
                    );
                }
                let mut s = vec![chunk; (d / chunk) as usize];
                if d % chunk != 0 {
                    s.push(d % chunk);
                }
                (s, false)
            }
            Some(t) => (t.to_i64_vec(), false),
        };
        if sizes.is_empty() {
            return Ok(Val::Seq(vec![]));
        }
        let n = sizes.len();
        let attrs = SplitAttrs { axis, split: sizes };
        let parts = self.op_n(OpKind::Split, attrs.to_attrs(), &[x], n)?;
        if !squeeze {
            return Ok(Val::Seq(parts));
        }
        let items = parts
            .into_iter()
            .map(|p| {
                let attrs = SqueezeAttrs {
                    axes: vec![ax as i64],
                };
                self.op(OpKind::Squeeze, attrs.to_attrs(), &[p])
            })
            .collect::<R<Vec<_>>>()?;
        Ok(Val::Seq(items))
    }

    fn lower_constant(&mut self, a: &NodeAttrs) -> R<Val> {
        if let Some(tp) = a.tensor("value").inv()? {
            return Ok(Val::konst(tensor_from_proto(tp, self.model_dir)?));
        }
        if let Some(v) = a.float("value_float").inv()? {
            return Ok(Val::konst(Tensor::from_f64(DType::F32, vec![], vec![v])));
        }
        if let Some(v) = a.floats("value_floats").inv()? {
            return Ok(Val::konst(Tensor::from_f64(DType::F32, vec![v.len()], v)));
        }
        if let Some(v) = a.int("value_int").inv()? {
            return Ok(Val::konst(Tensor::from_i64(DType::I64, vec![], vec![v])));
        }
        if let Some(v) = a.ints("value_ints").inv()? {
            return Ok(Val::konst(Tensor::from_i64(DType::I64, vec![v.len()], v)));
        }
        if a.has("sparse_value") {
            unsupported!("sparse Constant values");
        }
        if a.has("value_string") || a.has("value_strings") {
            unsupported!("string constants (ppir has no string type)");
        }
        invalid!("Constant needs one of value, value_float(s), value_int(s)")
    }
}

/// `to` of a Cast: an ONNX data type number (or its name, before opset 6).
fn cast_target(a: &NodeAttrs) -> R<DType> {
    if let Ok(Some(s)) = a.string("to") {
        let t = match s.to_ascii_uppercase().as_str() {
            "FLOAT" => 1,
            "INT8" => 3,
            "INT32" => 6,
            "INT64" => 7,
            "BOOL" => 9,
            "FLOAT16" => 10,
            "DOUBLE" => 11,
            "BFLOAT16" => 16,
            other => unsupported!("Cast to {other}"),
        };
        return Ok(dtype_from_onnx(t).expect("listed above"));
    }
    let Some(to) = a.int("to").inv()? else {
        invalid!("attribute `to` is required")
    };
    match dtype_from_onnx(to as i32) {
        Some(d) => Ok(d),
        None => unsupported!("Cast to {}", super::proto::data_type::name(to as i32)),
    }
}

/// The static `shape` attribute of a reshape from ONNX's target shape: `0` copies the
/// input dimension (unless `allowzero`), at most one `-1` is inferred, and a dimension equal
/// to the batch size becomes the IR's single `-1`.
pub(super) fn resolve_reshape(input: &[Dim], spec: &[SymInt], allowzero: bool) -> R<Vec<i64>> {
    #[derive(Clone, Copy, PartialEq)]
    enum D {
        Known(i64),
        Batch,
        Infer,
    }
    let mut out = Vec::with_capacity(spec.len());
    for (i, s) in spec.iter().enumerate() {
        out.push(match *s {
            SymInt::Batch => D::Batch,
            SymInt::Known(-1) => D::Infer,
            SymInt::Known(0) if !allowzero => match input.get(i) {
                Some(Dim::Known(n)) => D::Known(*n as i64),
                Some(Dim::Batch) => D::Batch,
                None => invalid!(
                    "shape entry {i} is 0 (copy), but the input has rank {}",
                    input.len()
                ),
            },
            SymInt::Known(n) if n >= 0 => D::Known(n),
            SymInt::Known(n) => invalid!("invalid shape entry {n}"),
        });
    }
    if out.iter().filter(|d| **d == D::Infer).count() > 1 {
        invalid!("the target shape has more than one -1");
    }
    let in_batch = input.iter().filter(|d| **d == Dim::Batch).count();
    let out_batch = out.iter().filter(|d| **d == D::Batch).count();
    let overflow = || Fail::Invalid("the element count overflows".into());
    let in_known: i64 = input
        .iter()
        .filter_map(|d| d.known())
        .try_fold(1i64, |a, n| a.checked_mul(n as i64))
        .ok_or_else(overflow)?;
    let out_known: i64 = out
        .iter()
        .filter_map(|d| if let D::Known(n) = d { Some(*n) } else { None })
        .try_fold(1i64, |a, n| a.checked_mul(n))
        .ok_or_else(overflow)?;
    let has_infer = out.contains(&D::Infer);
    if in_batch == out_batch {
        // The batch factors cancel: an inferred -1 is a known size.
        if has_infer {
            if out_known == 0 || in_known % out_known != 0 {
                invalid!("cannot reshape {} elements into {:?}", in_known, spec);
            }
            let inferred = in_known / out_known;
            for d in &mut out {
                if *d == D::Infer {
                    *d = D::Known(inferred);
                }
            }
        }
        if out_batch > 1 {
            unsupported!("{}", BATCH_NEEDED);
        }
    } else if !(in_batch == 1 && out_batch == 0 && has_infer) {
        unsupported!("{}", BATCH_NEEDED);
    }
    Ok(out
        .into_iter()
        .map(|d| match d {
            D::Known(n) => n,
            D::Batch | D::Infer => -1,
        })
        .collect())
}

/// `Trilu` on a constant: keep the upper (or lower) triangle from diagonal `k`.
fn trilu(x: &Tensor, k: i64, upper: bool) -> R<Tensor> {
    if x.shape.len() < 2 {
        invalid!("Trilu needs rank at least 2");
    }
    let (rows, cols) = (x.shape[x.shape.len() - 2], x.shape[x.shape.len() - 1]);
    let keep = |i: usize| {
        let (r, c) = (((i / cols) % rows) as i64, (i % cols) as i64);
        if upper {
            c - r >= k
        } else {
            c - r <= k
        }
    };
    let data = match &x.data {
        TensorData::Float(v) => TensorData::Float(
            v.iter()
                .enumerate()
                .map(|(i, &x)| if keep(i) { x } else { 0.0 })
                .collect(),
        ),
        TensorData::Int(v) => TensorData::Int(
            v.iter()
                .enumerate()
                .map(|(i, &x)| if keep(i) { x } else { 0 })
                .collect(),
        ),
    };
    Ok(Tensor {
        dtype: x.dtype,
        shape: x.shape.clone(),
        data,
    })
}
