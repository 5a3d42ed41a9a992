//! The attributes each op kind understands, with their kinds: the table form of the
//! contract in [`crate::ops`]. Attributes not listed are allowed (passes may annotate ops)
//! and not checked.

use std::fmt;

use crate::attr::{AttrError, Attrs};
use crate::ops::OpKind;

/// The kind of value an attribute holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttrKind {
    Int,
    /// A float; an integer is accepted.
    Float,
    Str,
    Ints,
    Floats,
    DType,
    Tensor,
}

/// One attribute an op kind understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttrSpec {
    pub name: &'static str,
    pub kind: AttrKind,
    pub required: bool,
}

const fn opt(name: &'static str, kind: AttrKind) -> AttrSpec {
    AttrSpec {
        name,
        kind,
        required: false,
    }
}

const fn req(name: &'static str, kind: AttrKind) -> AttrSpec {
    AttrSpec {
        name,
        kind,
        required: true,
    }
}

use AttrKind::{DType as Ty, Float as F, Int as I, Ints as Is, Str as S, Tensor as T};

const NONE: &[AttrSpec] = &[];
const ALPHA: &[AttrSpec] = &[opt("alpha", F)];
const SELU: &[AttrSpec] = &[opt("alpha", F), opt("gamma", F)];
const GELU: &[AttrSpec] = &[opt("approximate", S)];
const HARD_SIGMOID: &[AttrSpec] = &[opt("alpha", F), opt("beta", F)];
const SHRINK: &[AttrSpec] = &[opt("bias", F), opt("lambd", F)];
const CLIP: &[AttrSpec] = &[opt("min", F), opt("max", F)];
const CAST: &[AttrSpec] = &[req("to", Ty)];
const DROPOUT: &[AttrSpec] = &[opt("ratio", F), opt("training", I), opt("seed", I)];
const GEMM: &[AttrSpec] = &[
    opt("alpha", F),
    opt("beta", F),
    opt("trans_a", I),
    opt("trans_b", I),
];
const CONV: &[AttrSpec] = &[
    opt("strides", Is),
    opt("pads", Is),
    opt("dilations", Is),
    opt("group", I),
];
const CONV_T: &[AttrSpec] = &[
    opt("strides", Is),
    opt("pads", Is),
    opt("dilations", Is),
    opt("output_padding", Is),
    opt("group", I),
];
const MAX_POOL: &[AttrSpec] = &[
    req("kernel_shape", Is),
    opt("strides", Is),
    opt("pads", Is),
    opt("dilations", Is),
    opt("ceil_mode", I),
];
const AVG_POOL: &[AttrSpec] = &[
    req("kernel_shape", Is),
    opt("strides", Is),
    opt("pads", Is),
    opt("dilations", Is),
    opt("ceil_mode", I),
    opt("count_include_pad", I),
];
const EPSILON: &[AttrSpec] = &[opt("epsilon", F)];
const BATCH_NORM: &[AttrSpec] = &[opt("epsilon", F), opt("momentum", F)];
const LAYER_NORM: &[AttrSpec] = &[opt("axis", I), opt("epsilon", F)];
const LRN: &[AttrSpec] = &[
    req("size", I),
    opt("alpha", F),
    opt("beta", F),
    opt("bias", F),
];
const AXIS: &[AttrSpec] = &[opt("axis", I)];
const REDUCE: &[AttrSpec] = &[opt("axes", Is), opt("keepdims", I)];
const SHAPE: &[AttrSpec] = &[req("shape", Is)];
const TRANSPOSE: &[AttrSpec] = &[opt("perm", Is)];
const CONCAT: &[AttrSpec] = &[req("axis", I)];
const SPLIT: &[AttrSpec] = &[opt("axis", I), req("split", Is)];
const SLICE: &[AttrSpec] = &[
    req("starts", Is),
    req("ends", Is),
    opt("axes", Is),
    opt("steps", Is),
];
const PAD: &[AttrSpec] = &[req("pads", Is), opt("mode", S), opt("value", F)];
const TILE: &[AttrSpec] = &[req("repeats", Is)];
const SQUEEZE: &[AttrSpec] = &[opt("axes", Is)];
const UNSQUEEZE: &[AttrSpec] = &[req("axes", Is)];
const FLATTEN: &[AttrSpec] = &[opt("axis", I)];
const CONSTANT: &[AttrSpec] = &[req("value", T)];
const CROSS_ENTROPY: &[AttrSpec] = &[opt("ignore_index", I)];
const AVG_POOL_GRAD: &[AttrSpec] = &[
    req("kernel_shape", Is),
    opt("strides", Is),
    opt("pads", Is),
    opt("dilations", Is),
    opt("ceil_mode", I),
    opt("count_include_pad", I),
    req("input_shape", Is),
];
const CONV_GRAD_WEIGHT: &[AttrSpec] = &[
    opt("strides", Is),
    opt("pads", Is),
    opt("dilations", Is),
    opt("group", I),
    req("kernel_shape", Is),
];
const GATHER_GRAD: &[AttrSpec] = &[opt("axis", I), req("data_shape", Is)];
const SLICE_GRAD: &[AttrSpec] = &[
    req("starts", Is),
    req("ends", Is),
    opt("axes", Is),
    opt("steps", Is),
    req("input_shape", Is),
];
const COMM: &[AttrSpec] = &[req("peer", I), req("channel", I)];

/// The attributes `kind` understands.
pub fn attr_schema(kind: OpKind) -> &'static [AttrSpec] {
    use OpKind::*;
    match kind {
        Relu | Sigmoid | Tanh | Erf | Exp | Log | Sqrt | Abs | Neg | Sign | Reciprocal
        | Softplus | Softsign | Floor | Ceil | Sin | Cos | Not | Identity => NONE,
        LeakyRelu | Elu => ALPHA,
        Selu => SELU,
        Gelu => GELU,
        HardSigmoid => HARD_SIGMOID,
        Shrink => SHRINK,
        Clip => CLIP,
        Cast => CAST,
        Dropout => DROPOUT,
        Add | Sub | Mul | Div | Pow | Max | Min | PRelu | Equal | Less | Greater | LessEqual
        | GreaterEqual | And | Or | Where | MatMul => NONE,
        Gemm => GEMM,
        Conv => CONV,
        ConvTranspose => CONV_T,
        MaxPool => MAX_POOL,
        AvgPool => AVG_POOL,
        GlobalAvgPool | GlobalMaxPool => NONE,
        BatchNorm => BATCH_NORM,
        InstanceNorm => EPSILON,
        LayerNorm => LAYER_NORM,
        Lrn => LRN,
        Softmax | LogSoftmax => AXIS,
        ReduceSum | ReduceMean | ReduceMax | ReduceMin => REDUCE,
        Reshape | Expand => SHAPE,
        Transpose => TRANSPOSE,
        Concat => CONCAT,
        Split => SPLIT,
        Slice => SLICE,
        Gather => AXIS,
        Pad => PAD,
        Tile => TILE,
        Squeeze => SQUEEZE,
        Unsqueeze => UNSQUEEZE,
        Flatten => FLATTEN,
        Constant => CONSTANT,
        SoftmaxCrossEntropy | SoftmaxCrossEntropyGrad => CROSS_ENTROPY,
        MaxPoolGrad => MAX_POOL,
        AvgPoolGrad => AVG_POOL_GRAD,
        ConvGradWeight => CONV_GRAD_WEIGHT,
        GatherGrad => GATHER_GRAD,
        SliceGrad => SLICE_GRAD,
        Send | Recv => COMM,
    }
}

/// What is wrong with one attribute.
#[derive(Clone, Debug, PartialEq)]
pub enum AttrIssue {
    /// Present with the wrong kind of value.
    WrongKind(AttrError),
    /// A required attribute is absent.
    Missing(&'static str),
}

impl fmt::Display for AttrIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttrIssue::WrongKind(e) => write!(f, "{e}"),
            AttrIssue::Missing(name) => write!(f, "missing required attribute '{name}'"),
        }
    }
}

/// Check `attrs` against [`attr_schema`]`(kind)`, in schema order.
pub fn check_attrs(kind: OpKind, attrs: &Attrs) -> Vec<AttrIssue> {
    let mut issues = vec![];
    for spec in attr_schema(kind) {
        let present = match spec.kind {
            AttrKind::Int => attrs.int(spec.name).map(|v| v.is_some()),
            AttrKind::Float => attrs.float(spec.name).map(|v| v.is_some()),
            AttrKind::Str => attrs.str(spec.name).map(|v| v.is_some()),
            AttrKind::Ints => attrs.ints(spec.name).map(|v| v.is_some()),
            AttrKind::Floats => attrs.floats(spec.name).map(|v| v.is_some()),
            AttrKind::DType => attrs.dtype(spec.name).map(|v| v.is_some()),
            AttrKind::Tensor => attrs.tensor(spec.name).map(|v| v.is_some()),
        };
        match present {
            Err(e) => issues.push(AttrIssue::WrongKind(e)),
            Ok(false) if spec.required => issues.push(AttrIssue::Missing(spec.name)),
            Ok(_) => {}
        }
    }
    issues
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attr::Attr;

    #[test]
    fn every_kind_has_a_schema_without_repeats() {
        for &k in OpKind::ALL {
            let s = attr_schema(k);
            for (i, a) in s.iter().enumerate() {
                assert!(
                    s[i + 1..].iter().all(|b| b.name != a.name),
                    "{k}: {} twice",
                    a.name
                );
            }
        }
    }

    #[test]
    fn issues() {
        let a = Attrs::new().with("perm", Attr::Str("x".into()));
        let issues = check_attrs(OpKind::Transpose, &a);
        assert_eq!(issues.len(), 1);
        assert_eq!(
            issues[0].to_string(),
            "attribute `perm`: expected an integer list, found string"
        );
        let issues = check_attrs(OpKind::Send, &Attrs::new().with("peer", Attr::Int(1)));
        assert_eq!(issues, vec![AttrIssue::Missing("channel")]);
        // Integers are fine where floats are expected.
        assert!(
            check_attrs(OpKind::LeakyRelu, &Attrs::new().with("alpha", Attr::Int(1))).is_empty()
        );
    }
}
