//! Elementwise ops → one `linalg.generic` with all-parallel iterators.
//!
//! Operands broadcast with ppir's (numpy) rules: a size-1 operand dimension against a larger
//! result dimension indexes with the constant 0, missing leading dimensions are dropped
//! from the map. The body is built from an [`Expr`] tree over the generic's block
//! arguments, so fusing a chain of elementwise ops (see [`super::fuse`]) means building one
//! bigger tree: every node yields a value of its own dtype, exactly what the op computes
//! on its own.
//!
//! # Matching the interpreter
//!
//! The interpreter computes every float op in f64 and rounds the result to the dtype once.
//! Here:
//!
//! - f64 ops compute in f64 with the same formulas (and the same libm), so they agree to
//!   the last bit or nearly;
//! - f16 and bf16 ops extend their operands to f64, compute in f64 with the interpreter's
//!   formulas and round to the dtype exactly as the interpreter's `half` conversions do
//!   (which is not always a single correct rounding: see `F16Rounding`; bf16 truncates
//!   the mantissa to 20 bits before rounding), so results are bit-exact but for libm's
//!   last f64 bit. The f64 → bf16 step is integer ops (LLVM needs a runtime routine for
//!   it that the system's libgcc may lack);
//! - f32 ops compute in f32 (attribute constants rounded to f32): `+ - * /`, `sqrt`, the
//!   comparisons, `max`/`min`/`clip` and `cast` are exact, transcendental functions are
//!   libm's f32 versions (within a few ulp); where an f64 attribute is a threshold
//!   (`shrink`) it is replaced by the f32 bound that selects the same elements. `pow`
//!   with an exponent of another dtype computes in f64.
//! - integers wrap to their width; `div` truncates toward zero (`MIN / -1` wraps to `MIN`);
//!   a zero divisor (an interpreter error) gives 0 rather than a trap, as does integer
//!   `0 ^ negative`. float → int casts truncate and saturate to i64 (NaN → 0) before
//!   wrapping to the target width, as Rust's `as` does in the interpreter.
//! - `expm1` and `log1p` are computed with Kahan's compensated formulas (the `math`
//!   dialect's LLVM lowering expands them naively, losing the small values).
//! - training-mode `dropout` reproduces [`ppir::interp::dropout_keep`]'s splitmix64 hash
//!   bit for bit: the per-call part (seed, step, micro-batch) is computed once before the
//!   loop, the per-element part from the flat (row-major) index given by `linalg.index`.

use std::collections::HashMap;

use ppir::ops::attrs::{
    CastAttrs, ClipAttrs, DropoutAttrs, EluAttrs, GeluAttrs, HardSigmoidAttrs, LeakyReluAttrs,
    ModAttrs, SeluAttrs, ShrinkAttrs,
};
use ppir::ops::OpAttrs;
use ppir::{Attrs, DType, OpId, OpKind, ValueId};

use super::{elem_type, int_literal, mathfn, Body, Emitter, Iter, LowerError, OpView, Operand};

/// A scalar computation inside an elementwise `linalg.generic` body, every node in one
/// dtype (a convenience for other op families: see [`generic_elementwise`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Scalar {
    /// The i-th input block argument.
    Arg(usize),
    Const(f64),
    Unary(OpKind, Box<Scalar>),
    Binary(OpKind, Box<Scalar>, Box<Scalar>),
}

/// The indexing map of an operand of `shape` broadcast to `out` (numpy rules). `shape`
/// must broadcast to `out` (see [`broadcasts_to`]).
pub fn broadcast_map(shape: &[u64], out: &[u64]) -> Vec<String> {
    let lead = out.len().saturating_sub(shape.len());
    shape
        .iter()
        .enumerate()
        .map(|(j, &d)| {
            let o = out.get(lead + j).copied().unwrap_or(d);
            if d == 1 && o != 1 {
                "0".to_string()
            } else {
                format!("d{}", lead + j)
            }
        })
        .collect()
}

/// Whether `shape` broadcasts (unidirectionally) to `out`.
pub fn broadcasts_to(shape: &[u64], out: &[u64]) -> bool {
    shape.len() <= out.len()
        && shape
            .iter()
            .rev()
            .zip(out.iter().rev())
            .all(|(&s, &o)| s == o || s == 1)
}

/// The numpy broadcast of several shapes, or `None`.
pub fn broadcast_shapes(shapes: &[&[u64]]) -> Option<Vec<u64>> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1u64; rank];
    for s in shapes {
        let lead = rank - s.len();
        for (j, &d) in s.iter().enumerate() {
            let o = &mut out[lead + j];
            if *o == 1 {
                *o = d;
            } else if d != 1 && d != *o {
                return None;
            }
        }
    }
    Some(out)
}

/// Emit `body` (every argument and node of dtype `d`) into `b`; returns the SSA name of
/// its value (of dtype `d`), or the first op kind that cannot be computed in `d`.
pub fn emit_scalar(e: &Scalar, b: &mut Body, d: DType) -> Result<String, OpKind> {
    let expr = scalar_expr(e, d)?;
    let mut g = Gen::new(std::mem::take(b), &[]);
    let r = g.emit(&expr);
    *b = g.b;
    Ok(r)
}

/// One elementwise generic computing `body` over `inputs` (name, shape; all of dtype `d`)
/// into `out_shape` (dtype `d`).
pub fn generic_elementwise(
    e: &mut Emitter,
    inputs: &[(String, Vec<u64>)],
    out_shape: &[u64],
    d: DType,
    body: &Scalar,
) -> Result<String, OpKind> {
    let expr = scalar_expr(body, d)?;
    if let Some(m) = max_arg(body) {
        if m >= inputs.len() {
            return Err(OpKind::Identity);
        }
    }
    if inputs.iter().any(|(_, s)| !broadcasts_to(s, out_shape)) {
        return Err(OpKind::Identity);
    }
    let leaves: Vec<Leaf> = inputs
        .iter()
        .map(|(n, s)| Leaf {
            name: n.clone(),
            shape: s.clone(),
            dtype: d,
        })
        .collect();
    Ok(emit_generic(e, &leaves, out_shape, d, &expr, false).remove(0))
}

fn max_arg(e: &Scalar) -> Option<usize> {
    match e {
        Scalar::Arg(i) => Some(*i),
        Scalar::Const(_) => None,
        Scalar::Unary(_, x) => max_arg(x),
        Scalar::Binary(_, x, y) => max_arg(x).max(max_arg(y)),
    }
}

/// A [`Scalar`] as an [`Expr`] with every node in `d` (default attributes).
fn scalar_expr(e: &Scalar, d: DType) -> Result<Expr, OpKind> {
    Ok(match e {
        Scalar::Arg(i) => Expr::Arg(*i),
        Scalar::Const(c) => Expr::Const(d, *c),
        Scalar::Unary(k, x) => {
            let op = ElemOp::defaults(*k).ok_or(*k)?;
            check_types(*k, &[d], d).map_err(|_| *k)?;
            if k.class() != ppir::ops::OpClass::Unary || matches!(k, OpKind::Dropout) {
                return Err(*k);
            }
            Expr::Op(Box::new(Node {
                op,
                dtype: d,
                in_dtypes: vec![d],
                args: vec![scalar_expr(x, d)?],
            }))
        }
        Scalar::Binary(k, x, y) => {
            if !matches!(
                k,
                OpKind::Add
                    | OpKind::Sub
                    | OpKind::Mul
                    | OpKind::Div
                    | OpKind::Pow
                    | OpKind::Max
                    | OpKind::Min
                    | OpKind::PRelu
                    | OpKind::And
                    | OpKind::Or
            ) {
                return Err(*k);
            }
            check_types(*k, &[d, d], d).map_err(|_| *k)?;
            Expr::Op(Box::new(Node {
                op: ElemOp::Plain(*k),
                dtype: d,
                in_dtypes: vec![d, d],
                args: vec![scalar_expr(x, d)?, scalar_expr(y, d)?],
            }))
        }
    })
}

/// A scalar expression over the inputs of one elementwise generic.
#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    /// The i-th input block argument (of the leaf's dtype).
    Arg(usize),
    /// A literal of a dtype.
    Const(DType, f64),
    /// One elementwise op over sub-expressions.
    Op(Box<Node>),
}

/// One elementwise op inside an [`Expr`]: what it computes, its result dtype, its
/// operands and their dtypes.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub op: ElemOp,
    pub dtype: DType,
    pub in_dtypes: Vec<DType>,
    pub args: Vec<Expr>,
}

/// An elementwise op with its attributes resolved.
#[derive(Clone, Debug, PartialEq)]
pub enum ElemOp {
    /// An op whose kind says everything (no attributes, or inference-mode `dropout` as
    /// `identity`).
    Plain(OpKind),
    LeakyRelu {
        alpha: f64,
    },
    Elu {
        alpha: f64,
    },
    Selu {
        alpha: f64,
        gamma: f64,
    },
    HardSigmoid {
        alpha: f64,
        beta: f64,
    },
    Gelu {
        tanh: bool,
    },
    Shrink {
        bias: f64,
        lambd: f64,
    },
    Clip {
        min: f64,
        max: f64,
    },
    /// `mod`: truncated (`fmod`) or floored remainder.
    Mod {
        fmod: bool,
    },
    /// Conversion from the operand's dtype to the node's.
    Cast,
    /// Training-mode dropout. `stream` is the i64 SSA name (function level) of the per-call
    /// hash plus the golden-ratio constant, ready to be xor-ed with the element index.
    Dropout {
        ratio: f64,
        stream: String,
    },
}

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
const MIX1: u64 = 0xBF58_476D_1CE4_E5B9;
const MIX2: u64 = 0x94D0_49BB_1331_11EB;

impl ElemOp {
    /// The op of `kind` with default attributes (`None` for `cast`, which needs `to`).
    pub fn defaults(kind: OpKind) -> Option<ElemOp> {
        match kind {
            OpKind::Cast => None,
            OpKind::Dropout => Some(ElemOp::Plain(OpKind::Identity)),
            k if k.is_elementwise() => ElemOp::with_attrs(k, &Attrs::new()).ok(),
            _ => None,
        }
    }

    /// The op of `kind` (elementwise, other than `cast` and `dropout`) with its attributes
    /// read through the op's typed view; the error says what is wrong with them.
    fn with_attrs(kind: OpKind, attrs: &Attrs) -> Result<ElemOp, ElemError> {
        use OpKind::*;
        fn of<A: OpAttrs>(attrs: &Attrs) -> Result<A, ElemError> {
            Ok(A::of(attrs)?)
        }
        Ok(match kind {
            LeakyRelu => ElemOp::LeakyRelu {
                alpha: of::<LeakyReluAttrs>(attrs)?.alpha,
            },
            Elu => ElemOp::Elu {
                alpha: of::<EluAttrs>(attrs)?.alpha,
            },
            Selu => {
                let SeluAttrs { alpha, gamma } = of(attrs)?;
                ElemOp::Selu { alpha, gamma }
            }
            HardSigmoid => {
                let HardSigmoidAttrs { alpha, beta } = of(attrs)?;
                ElemOp::HardSigmoid { alpha, beta }
            }
            Gelu => match of::<GeluAttrs>(attrs)?.approximate.as_str() {
                "none" => ElemOp::Gelu { tanh: false },
                "tanh" => ElemOp::Gelu { tanh: true },
                other => {
                    return Err(ElemError::GeluApproximate {
                        got: other.to_string(),
                    })
                }
            },
            Shrink => {
                let ShrinkAttrs { bias, lambd } = of(attrs)?;
                ElemOp::Shrink { bias, lambd }
            }
            Clip => {
                let ClipAttrs { min, max } = of(attrs)?;
                ElemOp::Clip { min, max }
            }
            Mod => ElemOp::Mod {
                fmod: of::<ModAttrs>(attrs)?.fmod,
            },
            k => ElemOp::Plain(k),
        })
    }
}

/// Why an elementwise op cannot be lowered: its attributes, or operand and result
/// element types the interpreter does not define it for (the caller adds the op).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub(crate) enum ElemError {
    #[error(transparent)]
    Attr(#[from] ppir::attr::AttrError),
    #[error("gelu: `approximate` must be \"none\" or \"tanh\", got \"{got}\"")]
    GeluApproximate { got: String },
    #[error("{0} is not elementwise")]
    NotElementwise(OpKind),
    #[error("expected {arity} elementwise operands, got {got}")]
    Arity { arity: usize, got: usize },
    #[error("the result must be {want}, but the op declares {got}")]
    Result { want: DType, got: DType },
    #[error("operand element types differ: {0} and {1}")]
    Differ(DType, DType),
    /// The condition of `where`, or the operand of `not`, is not `i1`.
    #[error("the {what} of {kind} must be i1, got {got}")]
    NotBool {
        what: &'static str,
        kind: OpKind,
        got: DType,
    },
    #[error("{kind} needs {what}, got {}", .got.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(" and "))]
    Operands {
        kind: OpKind,
        /// `a numeric operand`, `numeric operands`, `a float operand`, `i1 operands`.
        what: &'static str,
        got: Vec<DType>,
    },
}

fn is_num(d: DType) -> bool {
    d.is_float() || d.is_int()
}

/// Whether the interpreter defines `kind` for operands `ins` and result `out` (dtypes);
/// the reason when it does not.
fn check_types(kind: OpKind, ins: &[DType], out: DType) -> Result<(), ElemError> {
    use OpKind::*;
    let arity = match kind.class() {
        ppir::ops::OpClass::Unary => 1,
        ppir::ops::OpClass::Binary | ppir::ops::OpClass::Compare => 2,
        ppir::ops::OpClass::Ternary => 3,
        _ => return Err(ElemError::NotElementwise(kind)),
    };
    if ins.len() != arity {
        return Err(ElemError::Arity {
            arity,
            got: ins.len(),
        });
    }
    let a = ins[0];
    let want = |r: DType| {
        if out == r {
            Ok(())
        } else {
            Err(ElemError::Result { want: r, got: out })
        }
    };
    let same = || {
        if ins[0] == ins[1] {
            Ok(())
        } else {
            Err(ElemError::Differ(ins[0], ins[1]))
        }
    };
    let operands = |what: &'static str, got: &[DType]| ElemError::Operands {
        kind,
        what,
        got: got.to_vec(),
    };
    match kind {
        Identity | Dropout => want(a),
        Cast => Ok(()),
        Not => {
            if a != DType::Bool {
                return Err(ElemError::NotBool {
                    what: "operand",
                    kind,
                    got: a,
                });
            }
            want(DType::Bool)
        }
        Relu | Abs | Neg | Sign | Clip => {
            if !is_num(a) {
                return Err(operands("a numeric operand", &[a]));
            }
            want(a)
        }
        LeakyRelu | Elu | Selu | Sigmoid | HardSigmoid | Tanh | Gelu | Erf | Exp | Log | Sqrt
        | Reciprocal | Softplus | Softsign | Floor | Ceil | Sin | Cos | Shrink => {
            if !a.is_float() {
                return Err(operands("a float operand", &[a]));
            }
            want(a)
        }
        Add | Sub | Mul | Div | Max | Min | PRelu | Mod => {
            same()?;
            if !is_num(a) {
                return Err(operands("numeric operands", &[a]));
            }
            want(a)
        }
        Pow => {
            if !is_num(a) || !is_num(ins[1]) {
                return Err(operands("numeric operands", &[a, ins[1]]));
            }
            want(a)
        }
        Equal | Less | Greater | LessEqual | GreaterEqual => {
            same()?;
            want(DType::Bool)
        }
        And | Or => {
            if a != DType::Bool || ins[1] != DType::Bool {
                return Err(operands("i1 operands", &[a, ins[1]]));
            }
            want(DType::Bool)
        }
        Where => {
            if a != DType::Bool {
                return Err(ElemError::NotBool {
                    what: "condition",
                    kind,
                    got: a,
                });
            }
            if ins[1] != ins[2] {
                return Err(ElemError::Differ(ins[1], ins[2]));
            }
            want(ins[1])
        }
        _ => Err(ElemError::NotElementwise(kind)),
    }
}

/// How many leading operands of an op of `kind` are elementwise (broadcast) operands: all
/// but `dropout`'s key.
pub fn elementwise_operands(kind: OpKind, n: usize) -> usize {
    if kind == OpKind::Dropout {
        n.min(1)
    } else {
        n
    }
}

/// The [`OpView`] of op `id` of the function being emitted.
pub fn op_view<'a>(e: &Emitter<'a>, id: OpId) -> Result<OpView<'a>, LowerError> {
    let f = e.f;
    let op = f.op(id);
    let mut view = OpView {
        f,
        id,
        op,
        kind: op.kind,
        in_shapes: Vec::new(),
        in_dtypes: Vec::new(),
        out_shapes: Vec::new(),
        out_dtypes: Vec::new(),
    };
    for &v in op.operands() {
        view.in_shapes.push(e.shape(v)?);
        view.in_dtypes.push(e.dtype(v));
    }
    for &v in op.results() {
        view.out_shapes.push(e.shape(v)?);
        view.out_dtypes.push(e.dtype(v));
    }
    Ok(view)
}

/// Build the [`Node`] of elementwise op `op` over `args` (one per elementwise operand):
/// checks dtypes, shapes and attributes as the interpreter would, and emits the per-call
/// part of a training-mode dropout's hash at the current position.
pub fn node_for(e: &mut Emitter, op: &OpView, args: Vec<Expr>) -> Result<Node, LowerError> {
    use OpKind::*;
    let kind = op.kind;
    let n_el = elementwise_operands(kind, op.in_dtypes.len());
    if !kind.is_elementwise() || !kind.arity().accepts(op.in_dtypes.len()) {
        return Err(op.invalid(format!(
            "expected {} operands, got {}",
            kind.arity(),
            op.in_dtypes.len()
        )));
    }
    if args.len() != n_el {
        return Err(op.invalid("internal: operand count of the expression"));
    }
    let n_res = op.out_dtypes.len();
    let res_ok = if kind == Dropout {
        n_res == 1 || n_res == 2
    } else {
        n_res == 1
    };
    if !res_ok {
        return Err(op.invalid(format!("{n_res} results declared")));
    }
    let in_dtypes = op.in_dtypes[..n_el].to_vec();
    let out = op.out_dtypes[0];
    check_types(kind, &in_dtypes, out).map_err(|e| op.invalid(e.to_string()))?;
    // Shapes: the result is the broadcast of the operands (prelu: x's shape).
    let shapes: Vec<&[u64]> = op.in_shapes[..n_el].iter().map(|s| s.as_slice()).collect();
    let out_shape = &op.out_shapes[0];
    let expect = if kind == PRelu {
        broadcasts_to(shapes[1], shapes[0]).then(|| shapes[0].to_vec())
    } else {
        broadcast_shapes(&shapes)
    };
    match expect {
        Some(s) if &s == out_shape => {}
        Some(s) => {
            return Err(op.invalid(format!(
                "the result shape is {s:?}, but the op declares {out_shape:?}"
            )))
        }
        None => return Err(op.invalid(format!("operand shapes {shapes:?} do not broadcast"))),
    }
    let elem = match kind {
        Cast => {
            let to = op.attrs::<CastAttrs>()?.to;
            if to != out {
                return Err(op.invalid(format!(
                    "the result must be {to}, but the op declares {out}"
                )));
            }
            ElemOp::Cast
        }
        Dropout => dropout_op(e, op)?,
        k => ElemOp::with_attrs(k, &op.op.attrs).map_err(|e| op.invalid(e.to_string()))?,
    };
    Ok(Node {
        op: elem,
        dtype: out,
        in_dtypes,
        args,
    })
}

/// `dropout`: `identity` in inference; in training, checks the ratio and the key and
/// emits the per-call part of the hash.
fn dropout_op(e: &mut Emitter, op: &OpView) -> Result<ElemOp, LowerError> {
    let DropoutAttrs {
        ratio,
        training,
        seed,
    } = op.attrs()?;
    if op.out_dtypes.len() == 2
        && (op.out_dtypes[1] != DType::Bool || op.out_shapes[1] != op.in_shapes[0])
    {
        return Err(op.invalid("the mask result must be i1 of x's shape"));
    }
    if !training {
        return Ok(ElemOp::Plain(OpKind::Identity));
    }
    if !(0.0..1.0).contains(&ratio) {
        return Err(op.invalid(format!("`ratio` must be in [0, 1), got {ratio}")));
    }
    if !op.in_dtypes[0].is_float() {
        return Err(op.invalid(format!(
            "training-mode dropout needs a float operand, got {}",
            op.in_dtypes[0]
        )));
    }
    let Some(&key) = op.op.operands().get(1) else {
        return Err(op.invalid(
            "training-mode dropout needs its key operand (tensor<2xi64>: step, micro-batch)",
        ));
    };
    let kshape = &op.in_shapes[1];
    let kd = op.in_dtypes[1];
    if !kd.is_int() || kshape.iter().product::<u64>() != 2 {
        return Err(op.invalid(format!(
            "the dropout key must be tensor<2xi64> (step, micro-batch), got {}",
            super::tensor_type(kshape, kd)
        )));
    }
    // The two elements of the key, as i64.
    let kname = e.name(key);
    let kty = super::tensor_type(kshape, kd);
    let mut parts = Vec::new();
    for flat in 0..2u64 {
        let mut idx = vec![0u64; kshape.len()];
        let mut rest = flat;
        for (j, &s) in kshape.iter().enumerate().rev() {
            idx[j] = rest % s;
            rest /= s;
        }
        let names: Vec<String> = idx
            .iter()
            .map(|&i| e.op(format!("arith.constant {i} : index")))
            .collect();
        let v = e.op(format!(
            "tensor.extract {kname}[{}] : {kty}",
            names.join(", ")
        ));
        let v = if kd == DType::I64 {
            v
        } else {
            e.op(format!("arith.extsi {v} : {} to i64", elem_type(kd)))
        };
        parts.push(v);
    }
    // h = mix(seed ^ G) is a compile-time constant; then two mixing rounds with the key.
    let h1 = ppir::interp::rng::mix64(seed as u64 ^ GOLDEN);
    let c = |e: &mut Emitter, v: u64| e.op(format!("arith.constant {} : i64", v as i64));
    let start = c(e, h1.wrapping_add(GOLDEN));
    let x = e.op(format!("arith.xori {start}, {} : i64", parts[0]));
    let h2 = emit_mix(&mut |s: String| e.op(s), &x);
    let g = c(e, GOLDEN);
    let y = e.op(format!("arith.addi {h2}, {g} : i64"));
    let y = e.op(format!("arith.xori {y}, {} : i64", parts[1]));
    let h3 = emit_mix(&mut |s: String| e.op(s), &y);
    let stream = e.op(format!("arith.addi {h3}, {g} : i64"));
    Ok(ElemOp::Dropout { ratio, stream })
}

/// The splitmix64 finaliser on i64 `z`, each line through `op`.
fn emit_mix(op: &mut dyn FnMut(String) -> String, z: &str) -> String {
    let s30 = op("arith.constant 30 : i64".into());
    let s27 = op("arith.constant 27 : i64".into());
    let s31 = op("arith.constant 31 : i64".into());
    let m1 = op(format!("arith.constant {} : i64", MIX1 as i64));
    let m2 = op(format!("arith.constant {} : i64", MIX2 as i64));
    let a = op(format!("arith.shrui {z}, {s30} : i64"));
    let a = op(format!("arith.xori {z}, {a} : i64"));
    let a = op(format!("arith.muli {a}, {m1} : i64"));
    let b = op(format!("arith.shrui {a}, {s27} : i64"));
    let b = op(format!("arith.xori {a}, {b} : i64"));
    let b = op(format!("arith.muli {b}, {m2} : i64"));
    let c = op(format!("arith.shrui {b}, {s31} : i64"));
    op(format!("arith.xori {b}, {c} : i64"))
}

/// `arith.constant` of an integer or bool (`true`/`false` take no type suffix).
fn int_constant(d: DType, x: i64) -> String {
    if d == DType::Bool {
        format!("arith.constant {}", int_literal(d, x))
    } else {
        format!("arith.constant {} : {}", int_literal(d, x), elem_type(d))
    }
}

/// A tensor of `shape` filled with `true`.
fn all_true(e: &mut Emitter, shape: &[u64]) -> String {
    let c = e.op(int_constant(DType::Bool, 1));
    let empty = e.empty(shape, DType::Bool);
    let ty = super::tensor_type(shape, DType::Bool);
    e.op(format!(
        "linalg.fill ins({c} : i1) outs({empty} : {ty}) -> {ty}"
    ))
}

/// An input of a generic: a value's SSA name, shape and dtype.
#[derive(Clone, Debug)]
pub struct Leaf {
    pub name: String,
    pub shape: Vec<u64>,
    pub dtype: DType,
}

/// Emit one all-parallel generic over `out_shape` computing `expr` from `leaves` (each
/// broadcast to `out_shape`); the result has dtype `d`. With `mask`, a second result
/// (i1) is the keep mask of the root node, a training-mode dropout (all true for any
/// other root).
pub fn emit_generic(
    e: &mut Emitter,
    leaves: &[Leaf],
    out_shape: &[u64],
    d: DType,
    expr: &Expr,
    mask: bool,
) -> Vec<String> {
    let mut g = Gen::new(Body::default(), out_shape);
    let mut yields = Vec::new();
    match expr {
        Expr::Op(n) if mask => {
            let (y, keep) = g.node(n);
            yields.push(y);
            yields.push(keep.unwrap_or_else(|| g.ci(DType::Bool, 1)));
        }
        _ => yields.push(g.emit(expr)),
    }
    let ins: Vec<Operand> = leaves
        .iter()
        .map(|l| {
            Operand::new(
                l.name.clone(),
                &l.shape,
                l.dtype,
                broadcast_map(&l.shape, out_shape),
            )
        })
        .collect();
    let mut outs = vec![Operand::identity(e.empty(out_shape, d), out_shape, d)];
    if mask {
        let m = e.empty(out_shape, DType::Bool);
        outs.push(Operand::identity(m, out_shape, DType::Bool));
    }
    let rank = out_shape.len();
    e.generic(
        rank,
        &vec![Iter::Parallel; rank],
        &ins,
        &outs,
        &g.b,
        &yields,
    )
}

/// `src` (of `shape`) converted elementwise from dtype `from` to `to` as the interpreter's
/// `cast` converts (f64 → f16/bf16 rounds as [`F16Rounding`] says).
pub fn convert(e: &mut Emitter, src: &str, shape: &[u64], from: DType, to: DType) -> String {
    if from == to {
        return src.to_string();
    }
    let expr = Expr::Op(Box::new(Node {
        op: ElemOp::Cast,
        dtype: to,
        in_dtypes: vec![from],
        args: vec![Expr::Arg(0)],
    }));
    let leaf = Leaf {
        name: src.to_string(),
        shape: shape.to_vec(),
        dtype: from,
    };
    emit_generic(e, &[leaf], shape, to, &expr, false).remove(0)
}

/// Round the f64 body value `v` to float dtype `d` as the interpreter does (bf16 with
/// integer ops, no `__truncdfbf2` call; see [`F16Rounding`] for f16).
pub fn round_f64_in(b: &mut Body, v: &str, d: DType) -> String {
    let mut g = Gen::new(std::mem::take(b), &[]);
    let r = g.round_f64(v, d);
    *b = g.b;
    r
}

/// Lower one elementwise op on its own.
pub fn lower(e: &mut Emitter, op: &OpView) -> Result<Vec<String>, LowerError> {
    lower_root(e, op, &|_| None)
}

/// Lower elementwise op `op`, computing inside its generic every producer op that
/// `inlined` returns for an elementwise operand (recursively: their operands may be
/// inlined too). Inlined producers must have `op`'s result shape and a single use.
pub fn lower_root(
    e: &mut Emitter,
    op: &OpView,
    inlined: &dyn Fn(ValueId) -> Option<OpId>,
) -> Result<Vec<String>, LowerError> {
    let mut leaves = Leaves::default();
    let root = build(e, op, inlined, &mut leaves, 0)?;
    let out_shape = op.out_shapes[0].clone();
    for l in &leaves.list {
        if !broadcasts_to(&l.shape, &out_shape) {
            return Err(op.invalid(format!(
                "operand shape {:?} does not broadcast to {out_shape:?}",
                l.shape
            )));
        }
    }
    // A dropout's mask result: the root's keep mask in training, else all true.
    let mask = op.out_dtypes.len() == 2;
    let keep_mask = mask
        && matches!(&root, Expr::Op(n) if matches!(n.op, ElemOp::Dropout { .. }))
        && op.kind == OpKind::Dropout
        && op.attrs::<DropoutAttrs>()?.training;
    if keep_mask {
        return Ok(emit_generic(
            e,
            &leaves.list,
            &out_shape,
            op.out_dtypes[0],
            &root,
            true,
        ));
    }
    // A pass-through (identity, same-dtype cast, inference dropout) of an input of the
    // result's shape emits nothing.
    let y = match root {
        Expr::Arg(i) if leaves.list[i].shape == out_shape => leaves.list[i].name.clone(),
        _ => emit_generic(e, &leaves.list, &out_shape, op.out_dtypes[0], &root, false).remove(0),
    };
    let mut r = vec![y];
    if mask {
        r.push(all_true(e, &out_shape));
    }
    Ok(r)
}

#[derive(Default)]
struct Leaves {
    list: Vec<Leaf>,
    index: HashMap<ValueId, usize>,
}

/// The expression of `op` over its (recursively inlined) operands; pass-through ops
/// (identity, same-dtype cast, inference dropout) are their operand's expression.
fn build(
    e: &mut Emitter,
    op: &OpView,
    inlined: &dyn Fn(ValueId) -> Option<OpId>,
    leaves: &mut Leaves,
    depth: usize,
) -> Result<Expr, LowerError> {
    if depth > 10_000 {
        return Err(op.unsupported(" (fused expression too deep)"));
    }
    let n_el = elementwise_operands(op.kind, op.op.operands().len());
    let mut args = Vec::with_capacity(n_el);
    for (j, &v) in op.op.operands()[..n_el].iter().enumerate() {
        if let Some(p) = inlined(v) {
            let pv = op_view(e, p)?;
            if pv.out_shapes.len() != 1 || pv.out_shapes[0] != op.out_shapes[0] {
                return Err(pv.invalid("internal: an inlined producer of another shape"));
            }
            args.push(build(e, &pv, inlined, leaves, depth + 1)?);
        } else {
            let i = match leaves.index.get(&v) {
                Some(&i) => i,
                None => {
                    leaves.list.push(Leaf {
                        name: e.name(v),
                        shape: op.in_shapes[j].clone(),
                        dtype: op.in_dtypes[j],
                    });
                    leaves.index.insert(v, leaves.list.len() - 1);
                    leaves.list.len() - 1
                }
            };
            args.push(Expr::Arg(i));
        }
    }
    let mut node = node_for(e, op, args)?;
    let passthrough = match &node.op {
        ElemOp::Plain(OpKind::Identity) => true,
        ElemOp::Cast => node.in_dtypes[0] == node.dtype,
        _ => false,
    };
    if passthrough {
        return Ok(node.args.swap_remove(0));
    }
    Ok(Expr::Op(Box::new(node)))
}

fn is_half(d: DType) -> bool {
    matches!(d, DType::F16 | DType::BF16)
}

/// The dtype a float op of dtype `d` computes in.
fn compute(d: DType) -> DType {
    if is_half(d) {
        DType::F64
    } else {
        d
    }
}

/// The smallest f32 ≥ `x` (as f64): `a < x` ⇔ `a < f32_ceil(x)` for every f32 `a`.
fn f32_ceil(x: f64) -> f64 {
    let t = x as f32;
    if (t as f64) < x {
        t.next_up() as f64
    } else {
        t as f64
    }
}

/// The largest f32 ≤ `x` (as f64): `a > x` ⇔ `a > f32_floor(x)` for every f32 `a`.
fn f32_floor(x: f64) -> f64 {
    let t = x as f32;
    if (t as f64) > x {
        t.next_down() as f64
    } else {
        t as f64
    }
}

/// How the interpreter rounds an f64 to f16: `half::f16::from_f64`, which depends on the
/// CPU it runs on. With F16C (every x86-64-v3 machine) it rounds to f32 first, then to
/// f16 (two roundings to nearest even); on other x86 machines it truncates the mantissa
/// to its high 20 bits, then rounds to nearest even; on aarch64 the hardware rounds once.
/// Generated code runs on the machine it is compiled for (host CPU features), so it
/// follows that machine's behaviour. (bf16 always takes the truncating path:
/// `half::bf16::from_f64`.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum F16Rounding {
    ViaF32,
    DropLowWord,
    #[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
    Once,
}

impl F16Rounding {
    fn host() -> F16Rounding {
        #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
        {
            if std::arch::is_x86_feature_detected!("f16c") {
                F16Rounding::ViaF32
            } else {
                F16Rounding::DropLowWord
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            F16Rounding::Once
        }
        #[cfg(not(any(target_arch = "x86", target_arch = "x86_64", target_arch = "aarch64")))]
        {
            F16Rounding::DropLowWord
        }
    }
}

/// Builds a generic's body from an [`Expr`].
struct Gen<'a> {
    b: Body,
    /// The loop (result) shape, for the flat element index.
    shape: &'a [u64],
    flat: Option<String>,
}

impl<'a> Gen<'a> {
    fn new(b: Body, shape: &'a [u64]) -> Self {
        Gen {
            b,
            shape,
            flat: None,
        }
    }

    fn op(&mut self, s: impl AsRef<str>) -> String {
        self.b.op(s)
    }

    /// A float or integer constant of `d` (integers from an f64: |x| < 2^53).
    fn cst(&mut self, d: DType, x: f64) -> String {
        if d == DType::Bool {
            return self.ci(d, (x != 0.0) as i64);
        }
        self.b.constant(d, x)
    }

    /// `eˣ` in float type `c` (f32: inline and vectorisable, see [`mathfn`]).
    fn exp(&mut self, x: &str, c: DType) -> String {
        match c {
            DType::F32 => mathfn::exp_f32(&mut self.b, x),
            _ => self.op(format!("math.exp {x} : {}", elem_type(c))),
        }
    }

    /// `erf(x)` in float type `c`.
    fn erf(&mut self, x: &str, c: DType) -> String {
        match c {
            DType::F32 => mathfn::erf_f32(&mut self.b, x),
            _ => self.op(format!("math.erf {x} : {}", elem_type(c))),
        }
    }

    /// `tanh(x)` in float type `c`.
    fn tanh(&mut self, x: &str, c: DType) -> String {
        match c {
            DType::F32 => mathfn::tanh_f32(&mut self.b, x),
            _ => self.op(format!("math.tanh {x} : {}", elem_type(c))),
        }
    }

    /// An integer (or bool) constant of `d`.
    fn ci(&mut self, d: DType, x: i64) -> String {
        self.op(int_constant(d, x))
    }

    fn emit(&mut self, x: &Expr) -> String {
        match x {
            Expr::Arg(i) => format!("%in{i}"),
            Expr::Const(d, c) => self.cst(*d, *c),
            Expr::Op(n) => self.node(n).0,
        }
    }

    /// Extend a value of float dtype `d` to its compute type.
    fn load(&mut self, v: &str, d: DType) -> String {
        if is_half(d) {
            self.op(format!("arith.extf {v} : {} to f64", elem_type(d)))
        } else {
            v.to_string()
        }
    }

    /// Round an f64 to float dtype `d` as the interpreter does (see [`F16Rounding`]).
    fn round_f64(&mut self, v: &str, d: DType) -> String {
        match d {
            DType::F64 => v.to_string(),
            DType::F32 => self.op(format!("arith.truncf {v} : f64 to f32")),
            DType::BF16 => {
                let y = self.drop_low_word(v);
                self.f64_to_bf16(&y)
            }
            _ => match F16Rounding::host() {
                F16Rounding::ViaF32 => {
                    let f = self.op(format!("arith.truncf {v} : f64 to f32"));
                    self.op(format!("arith.truncf {f} : f32 to f16"))
                }
                F16Rounding::DropLowWord => {
                    let y = self.drop_low_word(v);
                    self.op(format!("arith.truncf {y} : f64 to f16"))
                }
                F16Rounding::Once => self.op(format!("arith.truncf {v} : f64 to f16")),
            },
        }
    }

    /// `x` with the low 32 bits of its mantissa cleared (truncation toward zero to 20
    /// mantissa bits), NaN kept NaN.
    fn drop_low_word(&mut self, x: &str) -> String {
        let bits = self.op(format!("arith.bitcast {x} : f64 to i64"));
        let m = self.ci(DType::I64, -(1i64 << 32));
        let hi = self.op(format!("arith.andi {bits}, {m} : i64"));
        let y = self.op(format!("arith.bitcast {hi} : i64 to f64"));
        let nan = self.cmpf("uno", x, x, "f64");
        self.sel(&nan, x, &y, "f64")
    }

    /// Round a compute-type value back to dtype `d`.
    fn store(&mut self, v: &str, d: DType) -> String {
        if is_half(d) {
            self.round_f64(v, d)
        } else {
            v.to_string()
        }
    }

    /// f64 → bf16 rounding to nearest even (once), with integer ops: round to f32 by
    /// "round to odd" (truncate, then set the last bit if inexact), which keeps enough bits
    /// for the second rounding to bf16 to be exact.
    fn f64_to_bf16(&mut self, x: &str) -> String {
        let f = self.op(format!("arith.truncf {x} : f64 to f32"));
        let bits = self.op(format!("arith.bitcast {f} : f32 to i32"));
        let back = self.op(format!("arith.extf {f} : f32 to f64"));
        let ax = self.op(format!("math.absf {x} : f64"));
        let ab = self.op(format!("math.absf {back} : f64"));
        let over = self.op(format!("arith.cmpf ogt, {ab}, {ax} : f64"));
        let one = self.ci(DType::I32, 1);
        let dec = self.op(format!("arith.subi {bits}, {one} : i32"));
        let t = self.op(format!("arith.select {over}, {dec}, {bits} : i32"));
        let inexact = self.op(format!("arith.cmpf une, {back}, {x} : f64"));
        let odd = self.op(format!("arith.ori {t}, {one} : i32"));
        let r = self.op(format!("arith.select {inexact}, {odd}, {t} : i32"));
        let s16 = self.ci(DType::I32, 16);
        let hi = self.op(format!("arith.shrui {r}, {s16} : i32"));
        let lsb = self.op(format!("arith.andi {hi}, {one} : i32"));
        let half = self.ci(DType::I32, 0x7FFF);
        let bias = self.op(format!("arith.addi {lsb}, {half} : i32"));
        let sum = self.op(format!("arith.addi {r}, {bias} : i32"));
        let top = self.op(format!("arith.shrui {sum}, {s16} : i32"));
        let h = self.op(format!("arith.trunci {top} : i32 to i16"));
        let nan = self.op(format!("arith.cmpf uno, {x}, {x} : f64"));
        let qnan = self.op("arith.constant 32704 : i16");
        let h = self.op(format!("arith.select {nan}, {qnan}, {h} : i16"));
        self.op(format!("arith.bitcast {h} : i16 to bf16"))
    }

    /// f64 → i64 as Rust's `as` (truncate toward zero, saturate, NaN → 0).
    fn f64_to_i64_sat(&mut self, v: &str) -> String {
        let big = self.cst(DType::F64, 9_223_372_036_854_775_808.0);
        let nbig = self.cst(DType::F64, -9_223_372_036_854_775_808.0);
        let ge = self.op(format!("arith.cmpf oge, {v}, {big} : f64"));
        let lt = self.op(format!("arith.cmpf olt, {v}, {nbig} : f64"));
        let nan = self.op(format!("arith.cmpf uno, {v}, {v} : f64"));
        let i = self.op(format!("arith.fptosi {v} : f64 to i64"));
        let max = self.ci(DType::I64, i64::MAX);
        let min = self.ci(DType::I64, i64::MIN);
        let zero = self.ci(DType::I64, 0);
        let r = self.op(format!("arith.select {ge}, {max}, {i} : i64"));
        let r = self.op(format!("arith.select {lt}, {min}, {r} : i64"));
        self.op(format!("arith.select {nan}, {zero}, {r} : i64"))
    }

    /// An integer (not bool) of dtype `from` converted to integer dtype `to`, wrapping.
    fn int_resize(&mut self, v: &str, from: DType, to: DType) -> String {
        let (a, b) = (from.size_bytes(), to.size_bytes());
        if a == b {
            v.to_string()
        } else if a < b {
            self.op(format!(
                "arith.extsi {v} : {} to {}",
                elem_type(from),
                elem_type(to)
            ))
        } else {
            self.op(format!(
                "arith.trunci {v} : {} to {}",
                elem_type(from),
                elem_type(to)
            ))
        }
    }

    /// The row-major flat index of the current element, as i64.
    fn flat_index(&mut self) -> String {
        if let Some(f) = &self.flat {
            return f.clone();
        }
        let shape = self.shape.to_vec();
        let mut acc: Option<String> = None;
        for (i, &s) in shape.iter().enumerate() {
            let ix = self.op(format!("linalg.index {i} : index"));
            let ix = self.op(format!("arith.index_cast {ix} : index to i64"));
            acc = Some(match acc {
                None => ix,
                Some(a) => {
                    let c = self.ci(DType::I64, s as i64);
                    let m = self.op(format!("arith.muli {a}, {c} : i64"));
                    self.op(format!("arith.addi {m}, {ix} : i64"))
                }
            });
        }
        let r = acc.unwrap_or_else(|| self.ci(DType::I64, 0));
        self.flat = Some(r.clone());
        r
    }

    /// `expm1(x)` in float type `t` (Kahan: `(u - 1) · x / log u` with `u = e^x`).
    fn expm1(&mut self, x: &str, c: DType) -> String {
        let t = elem_type(c);
        let u = self.exp(x, c);
        let one = self.cst(c, 1.0);
        let m1 = self.cst(c, -1.0);
        let inf = self.cst(c, f64::INFINITY);
        let um1 = self.op(format!("arith.subf {u}, {one} : {t}"));
        let lg = self.op(format!("math.log {u} : {t}"));
        let p = self.op(format!("arith.mulf {um1}, {x} : {t}"));
        let q = self.op(format!("arith.divf {p}, {lg} : {t}"));
        let is1 = self.op(format!("arith.cmpf oeq, {u}, {one} : {t}"));
        let ism1 = self.op(format!("arith.cmpf oeq, {um1}, {m1} : {t}"));
        let isinf = self.op(format!("arith.cmpf oeq, {u}, {inf} : {t}"));
        let r = self.op(format!("arith.select {isinf}, {u}, {q} : {t}"));
        let r = self.op(format!("arith.select {ism1}, {m1}, {r} : {t}"));
        self.op(format!("arith.select {is1}, {x}, {r} : {t}"))
    }

    /// `log1p(x)` for finite `x ≥ 0` (Goldberg: `x · log u / (u - 1)` with `u = 1 + x`).
    fn log1p(&mut self, x: &str, c: DType) -> String {
        let t = elem_type(c);
        let one = self.cst(c, 1.0);
        let u = self.op(format!("arith.addf {one}, {x} : {t}"));
        let lg = self.op(format!("math.log {u} : {t}"));
        let um1 = self.op(format!("arith.subf {u}, {one} : {t}"));
        let p = self.op(format!("arith.mulf {lg}, {x} : {t}"));
        let q = self.op(format!("arith.divf {p}, {um1} : {t}"));
        let is1 = self.op(format!("arith.cmpf oeq, {u}, {one} : {t}"));
        self.op(format!("arith.select {is1}, {x}, {q} : {t}"))
    }

    /// `cond ? a : b` in type `t`.
    /// A signed integer divisor `q` made safe for `arith.divsi`/`remsi`: 1 where it is 0
    /// or -1 (division by zero, or overflow on the minimum), which the caller then fixes up.
    fn divisor_guard(&mut self, q: &str, d: DType, t: &str) -> DivisorGuard {
        let z = self.ci(d, 0);
        let one = self.ci(d, 1);
        let m1 = self.ci(d, -1);
        let q0 = self.op(format!("arith.cmpi eq, {q}, {z} : {t}"));
        let qm1 = self.op(format!("arith.cmpi eq, {q}, {m1} : {t}"));
        let bad = self.op(format!("arith.ori {q0}, {qm1} : i1"));
        let safe = self.sel(&bad, &one, q, t);
        DivisorGuard {
            z,
            q0,
            qm1,
            bad,
            safe,
        }
    }

    fn sel(&mut self, cond: &str, a: &str, b: &str, t: &str) -> String {
        self.op(format!("arith.select {cond}, {a}, {b} : {t}"))
    }

    fn cmpf(&mut self, pred: &str, a: &str, b: &str, t: &str) -> String {
        self.op(format!("arith.cmpf {pred}, {a}, {b} : {t}"))
    }

    /// Emit node `n`; returns its value (of `n.dtype`) and, for a training dropout, the
    /// keep mask (i1).
    fn node(&mut self, n: &Node) -> (String, Option<String>) {
        let vals: Vec<String> = n.args.iter().map(|a| self.emit(a)).collect();
        let d = n.dtype;
        let ins = &n.in_dtypes;
        use OpKind::*;
        let v = match &n.op {
            ElemOp::Plain(Identity) => vals[0].clone(),
            ElemOp::Cast => self.cast(&vals[0], ins[0], d),
            ElemOp::Dropout { ratio, stream } => {
                return self.dropout(&vals[0], d, *ratio, stream);
            }
            ElemOp::Plain(Not) => {
                let t = self.ci(DType::Bool, 1);
                self.op(format!("arith.xori {}, {t} : i1", vals[0]))
            }
            ElemOp::Plain(k @ (Equal | Less | Greater | LessEqual | GreaterEqual)) => {
                self.compare(*k, &vals[0], &vals[1], ins[0])
            }
            ElemOp::Plain(k @ (And | Or)) => {
                let o = if *k == And { "arith.andi" } else { "arith.ori" };
                self.op(format!("{o} {}, {} : i1", vals[0], vals[1]))
            }
            ElemOp::Plain(Where) => {
                let t = elem_type(d);
                self.sel(&vals[0], &vals[1], &vals[2], t)
            }
            ElemOp::Plain(Pow) => self.pow(&vals[0], ins[0], &vals[1], ins[1]),
            op if d.is_float() => {
                let c = compute(d);
                let xs: Vec<String> = vals
                    .iter()
                    .zip(ins)
                    .map(|(v, &t)| self.load(v, t))
                    .collect();
                let r = self.float_op(op, &xs, c);
                self.store(&r, d)
            }
            op => self.int_op(op, &vals, d),
        };
        (v, None)
    }

    fn compare(&mut self, k: OpKind, a: &str, b: &str, d: DType) -> String {
        use OpKind::*;
        if d.is_float() {
            let a = self.load(a, d);
            let b = self.load(b, d);
            let t = elem_type(compute(d));
            let p = match k {
                Equal => "oeq",
                Less => "olt",
                Greater => "ogt",
                LessEqual => "ole",
                _ => "oge",
            };
            self.cmpf(p, &a, &b, t)
        } else {
            // bool compares as 0 < 1: unsigned predicates.
            let u = d == DType::Bool;
            let p = match (k, u) {
                (Equal, _) => "eq",
                (Less, false) => "slt",
                (Greater, false) => "sgt",
                (LessEqual, false) => "sle",
                (_, false) => "sge",
                (Less, true) => "ult",
                (Greater, true) => "ugt",
                (LessEqual, true) => "ule",
                (_, true) => "uge",
            };
            self.op(format!("arith.cmpi {p}, {a}, {b} : {}", elem_type(d)))
        }
    }

    /// Conversion from `from` to `to` as the interpreter's `cast`.
    fn cast(&mut self, v: &str, from: DType, to: DType) -> String {
        if from == to {
            return v.to_string();
        }
        let fty = elem_type(from);
        let tty = elem_type(to);
        match (from.is_float(), to.is_float()) {
            (true, true) => {
                if from == DType::F32 && to == DType::F64 || is_half(from) && !is_half(to) {
                    // Exact widening.
                    self.op(format!("arith.extf {v} : {fty} to {tty}"))
                } else {
                    let x = self.widen(v, from);
                    self.round_f64(&x, to)
                }
            }
            (true, false) if to == DType::Bool => {
                let x = self.load(v, from);
                let c = compute(from);
                let z = self.cst(c, 0.0);
                self.cmpf("une", &x, &z, elem_type(c))
            }
            (true, false) => {
                let x = self.widen(v, from);
                let i = self.f64_to_i64_sat(&x);
                self.int_resize(&i, DType::I64, to)
            }
            (false, true) => {
                let x = if from == DType::Bool {
                    self.op(format!("arith.uitofp {v} : i1 to f64"))
                } else {
                    self.op(format!("arith.sitofp {v} : {fty} to f64"))
                };
                self.round_f64(&x, to)
            }
            (false, false) => {
                if to == DType::Bool {
                    let z = self.ci(from, 0);
                    self.op(format!("arith.cmpi ne, {v}, {z} : {fty}"))
                } else if from == DType::Bool {
                    self.op(format!("arith.extui {v} : i1 to {tty}"))
                } else {
                    self.int_resize(v, from, to)
                }
            }
        }
    }

    fn dropout(&mut self, x: &str, d: DType, ratio: f64, stream: &str) -> (String, Option<String>) {
        let idx = self.flat_index();
        let z = self.op(format!("arith.xori {stream}, {idx} : i64"));
        let b = &mut self.b;
        let h = emit_mix(&mut |s: String| b.op(s), &z);
        let s11 = self.ci(DType::I64, 11);
        let top = self.op(format!("arith.shrui {h}, {s11} : i64"));
        let uf = self.op(format!("arith.uitofp {top} : i64 to f64"));
        let scale53 = self.cst(DType::F64, 1.0 / (1u64 << 53) as f64);
        let u = self.op(format!("arith.mulf {uf}, {scale53} : f64"));
        let r = self.cst(DType::F64, ratio);
        let keep = self.cmpf("oge", &u, &r, "f64");
        let x64 = self.widen(x, d);
        let scale = self.cst(DType::F64, 1.0 / (1.0 - ratio));
        let y = self.op(format!("arith.mulf {x64}, {scale} : f64"));
        let z = self.cst(DType::F64, 0.0);
        let y = self.sel(&keep, &y, &z, "f64");
        let y = self.round_f64(&y, d);
        (y, Some(keep))
    }

    /// Any float dtype extended to f64.
    fn widen(&mut self, v: &str, d: DType) -> String {
        if d == DType::F64 {
            v.to_string()
        } else {
            self.op(format!("arith.extf {v} : {} to f64", elem_type(d)))
        }
    }

    /// `pow`: the result has the base's dtype; the exponent may have any numeric dtype.
    fn pow(&mut self, a: &str, ad: DType, b: &str, bd: DType) -> String {
        if ad.is_float() {
            if ad == bd && !is_half(ad) {
                let t = elem_type(ad);
                return self.op(format!("math.powf {a}, {b} : {t}"));
            }
            // p.powf(q as f64) in f64, rounded once.
            let x = self.widen(a, ad);
            let y = if bd.is_float() {
                self.widen(b, bd)
            } else {
                self.op(format!("arith.sitofp {b} : {} to f64", elem_type(bd)))
            };
            let r = self.op(format!("math.powf {x}, {y} : f64"));
            return self.round_f64(&r, ad);
        }
        if bd.is_float() {
            // (p as f64).powf(q).trunc() as i64, wrapped to the base's width.
            let x = self.op(format!("arith.sitofp {a} : {} to f64", elem_type(ad)));
            let y = self.widen(b, bd);
            let r = self.op(format!("math.powf {x}, {y} : f64"));
            let i = self.f64_to_i64_sat(&r);
            return self.int_resize(&i, DType::I64, ad);
        }
        // Integer power by squaring (wrapping in the base's width); negative exponents
        // truncate 1 / b^-e toward zero.
        let t = elem_type(ad);
        let e = self.int_resize(b, bd, DType::I64);
        let one = self.ci(ad, 1);
        let zero = self.ci(ad, 0);
        let m1 = self.ci(ad, -1);
        let z64 = self.ci(DType::I64, 0);
        let one64 = self.ci(DType::I64, 1);
        // Names unique within the body: the position of the loop in it.
        let u = self.b.lines.len();
        let (acc, bb, ee) = (format!("%pw{u}a"), format!("%pw{u}b"), format!("%pw{u}e"));
        let (acc2, bb2, ee2) = (format!("%pw{u}c"), format!("%pw{u}d"), format!("%pw{u}f"));
        let res = format!("%pw{u}r");
        let p = |s: &str| format!("%pw{u}{s}");
        self.b.raw(format!(
            "{res}:3 = scf.while ({acc} = {one}, {bb} = {a}, {ee} = {e}) : ({t}, {t}, i64) -> ({t}, {t}, i64) {{"
        ));
        self.b
            .raw(format!("  {} = arith.cmpi sgt, {ee}, {z64} : i64", p("go")));
        self.b.raw(format!(
            "  scf.condition({}) {acc}, {bb}, {ee} : {t}, {t}, i64",
            p("go")
        ));
        self.b.raw("} do {".to_string());
        self.b
            .raw(format!("^bb0({acc2}: {t}, {bb2}: {t}, {ee2}: i64):"));
        self.b
            .raw(format!("  {} = arith.andi {ee2}, {one64} : i64", p("bit")));
        self.b.raw(format!(
            "  {} = arith.cmpi ne, {}, {z64} : i64",
            p("odd"),
            p("bit")
        ));
        self.b
            .raw(format!("  {} = arith.muli {acc2}, {bb2} : {t}", p("m")));
        self.b.raw(format!(
            "  {} = arith.select {}, {}, {acc2} : {t}",
            p("n"),
            p("odd"),
            p("m")
        ));
        self.b
            .raw(format!("  {} = arith.muli {bb2}, {bb2} : {t}", p("sq")));
        self.b
            .raw(format!("  {} = arith.shrui {ee2}, {one64} : i64", p("h")));
        self.b.raw(format!(
            "  scf.yield {}, {}, {} : {t}, {t}, i64",
            p("n"),
            p("sq"),
            p("h")
        ));
        self.b.raw("}".to_string());
        let pos = format!("{res}#0");
        // Negative exponent: 1 → 1, -1 → ±1 by parity, else 0 (0 is the interpreter's error).
        let neg = self.op(format!("arith.cmpi slt, {e}, {z64} : i64"));
        let bit = self.op(format!("arith.andi {e}, {one64} : i64"));
        let odd = self.op(format!("arith.cmpi ne, {bit}, {z64} : i64"));
        let pm = self.sel(&odd, &m1, &one, t);
        let is1 = self.op(format!("arith.cmpi eq, {a}, {one} : {t}"));
        let ism1 = self.op(format!("arith.cmpi eq, {a}, {m1} : {t}"));
        let r = self.sel(&ism1, &pm, &zero, t);
        let r = self.sel(&is1, &one, &r, t);
        self.sel(&neg, &r, &pos, t)
    }

    /// A float op in compute type `c` over operands `x` (already in `c`).
    fn float_op(&mut self, op: &ElemOp, x: &[String], c: DType) -> String {
        use OpKind::*;
        let t = elem_type(c);
        let a = x[0].as_str();
        let f32c = c == DType::F32;
        match op {
            ElemOp::Plain(k) => match k {
                Relu => {
                    let z = self.cst(c, 0.0);
                    let lt = self.cmpf("olt", a, &z, t);
                    self.sel(&lt, &z, a, t)
                }
                Sigmoid => {
                    // a ≥ 0: 1 / (1 + e^-a); else e^a / (1 + e^a).
                    let ab = self.op(format!("math.absf {a} : {t}"));
                    let n = self.op(format!("arith.negf {ab} : {t}"));
                    let e = self.exp(&n, c);
                    let one = self.cst(c, 1.0);
                    let den = self.op(format!("arith.addf {one}, {e} : {t}"));
                    let z = self.cst(c, 0.0);
                    let ge = self.cmpf("oge", a, &z, t);
                    let num = self.sel(&ge, &one, &e, t);
                    self.op(format!("arith.divf {num}, {den} : {t}"))
                }
                Tanh => self.tanh(a, c),
                Erf => self.erf(a, c),
                Exp => self.exp(a, c),
                Log => self.op(format!("math.log {a} : {t}")),
                Sqrt => self.op(format!("math.sqrt {a} : {t}")),
                Abs => self.op(format!("math.absf {a} : {t}")),
                Neg => self.op(format!("arith.negf {a} : {t}")),
                Floor => self.op(format!("math.floor {a} : {t}")),
                Ceil => self.op(format!("math.ceil {a} : {t}")),
                Sin => self.op(format!("math.sin {a} : {t}")),
                Cos => self.op(format!("math.cos {a} : {t}")),
                Sign => {
                    let z = self.cst(c, 0.0);
                    let one = self.cst(c, 1.0);
                    let m1 = self.cst(c, -1.0);
                    let gt = self.cmpf("ogt", a, &z, t);
                    let lt = self.cmpf("olt", a, &z, t);
                    let r = self.sel(&lt, &m1, a, t);
                    self.sel(&gt, &one, &r, t)
                }
                Reciprocal => {
                    let one = self.cst(c, 1.0);
                    self.op(format!("arith.divf {one}, {a} : {t}"))
                }
                Softplus => {
                    // NaN stays; else max(a, 0) + log1p(e^-|a|).
                    let ab = self.op(format!("math.absf {a} : {t}"));
                    let n = self.op(format!("arith.negf {ab} : {t}"));
                    let e = self.exp(&n, c);
                    let l = self.log1p(&e, c);
                    let z = self.cst(c, 0.0);
                    let m = self.op(format!("arith.maximumf {a}, {z} : {t}"));
                    let s = self.op(format!("arith.addf {m}, {l} : {t}"));
                    let nan = self.cmpf("uno", a, a, t);
                    self.sel(&nan, a, &s, t)
                }
                Softsign => {
                    let ab = self.op(format!("math.absf {a} : {t}"));
                    let one = self.cst(c, 1.0);
                    let den = self.op(format!("arith.addf {one}, {ab} : {t}"));
                    self.op(format!("arith.divf {a}, {den} : {t}"))
                }
                Add => self.op(format!("arith.addf {a}, {} : {t}", x[1])),
                Sub => self.op(format!("arith.subf {a}, {} : {t}", x[1])),
                Mul => self.op(format!("arith.mulf {a}, {} : {t}", x[1])),
                Div => self.op(format!("arith.divf {a}, {} : {t}", x[1])),
                Max => self.op(format!("arith.maximumf {a}, {} : {t}", x[1])),
                Min => self.op(format!("arith.minimumf {a}, {} : {t}", x[1])),
                PRelu => {
                    let z = self.cst(c, 0.0);
                    let lt = self.cmpf("olt", a, &z, t);
                    let m = self.op(format!("arith.mulf {}, {a} : {t}", x[1]));
                    self.sel(&lt, &m, a, t)
                }
                // Every other plain kind is handled before (identity, not, compare, ...)
                // or refused by `check_types`.
                _ => a.to_string(),
            },
            ElemOp::LeakyRelu { alpha } => {
                let z = self.cst(c, 0.0);
                let al = self.cst(c, *alpha);
                let lt = self.cmpf("olt", a, &z, t);
                let m = self.op(format!("arith.mulf {al}, {a} : {t}"));
                self.sel(&lt, &m, a, t)
            }
            ElemOp::Elu { alpha } => {
                let z = self.cst(c, 0.0);
                let al = self.cst(c, *alpha);
                let lt = self.cmpf("olt", a, &z, t);
                let em = self.expm1(a, c);
                let m = self.op(format!("arith.mulf {al}, {em} : {t}"));
                self.sel(&lt, &m, a, t)
            }
            ElemOp::Selu { alpha, gamma } => {
                let z = self.cst(c, 0.0);
                let g = self.cst(c, *gamma);
                let ga = self.cst(c, gamma * alpha);
                let gt = self.cmpf("ogt", a, &z, t);
                let p = self.op(format!("arith.mulf {g}, {a} : {t}"));
                let em = self.expm1(a, c);
                let n = self.op(format!("arith.mulf {ga}, {em} : {t}"));
                self.sel(&gt, &p, &n, t)
            }
            ElemOp::HardSigmoid { alpha, beta } => {
                let al = self.cst(c, *alpha);
                let be = self.cst(c, *beta);
                let m = self.op(format!("arith.mulf {al}, {a} : {t}"));
                let v = self.op(format!("arith.addf {m}, {be} : {t}"));
                self.clamp(&v, 0.0, 1.0, c)
            }
            ElemOp::Gelu { tanh: false } => {
                let h = self.cst(c, 0.5);
                let k = self.cst(c, std::f64::consts::FRAC_1_SQRT_2);
                let one = self.cst(c, 1.0);
                let ha = self.op(format!("arith.mulf {h}, {a} : {t}"));
                let s = self.op(format!("arith.mulf {a}, {k} : {t}"));
                let e = self.erf(&s, c);
                let o = self.op(format!("arith.addf {one}, {e} : {t}"));
                self.op(format!("arith.mulf {ha}, {o} : {t}"))
            }
            ElemOp::Gelu { tanh: true } => {
                let h = self.cst(c, 0.5);
                let k = self.cst(c, (2.0 / std::f64::consts::PI).sqrt());
                let q = self.cst(c, 0.044715);
                let one = self.cst(c, 1.0);
                let c1 = self.op(format!("arith.mulf {q}, {a} : {t}"));
                let c2 = self.op(format!("arith.mulf {c1}, {a} : {t}"));
                let c3 = self.op(format!("arith.mulf {c2}, {a} : {t}"));
                let inner = self.op(format!("arith.addf {a}, {c3} : {t}"));
                let ki = self.op(format!("arith.mulf {k}, {inner} : {t}"));
                let th = self.tanh(&ki, c);
                let ha = self.op(format!("arith.mulf {h}, {a} : {t}"));
                let o = self.op(format!("arith.addf {one}, {th} : {t}"));
                self.op(format!("arith.mulf {ha}, {o} : {t}"))
            }
            ElemOp::Shrink { bias, lambd } => {
                // a < -lambd: a + bias; a > lambd: a - bias; else 0.
                let (lo, hi) = if f32c {
                    (f32_ceil(-lambd), f32_floor(*lambd))
                } else {
                    (-lambd, *lambd)
                };
                let lo = self.cst(c, lo);
                let hi = self.cst(c, hi);
                let bi = self.cst(c, *bias);
                let z = self.cst(c, 0.0);
                let lt = self.cmpf("olt", a, &lo, t);
                let gt = self.cmpf("ogt", a, &hi, t);
                let p = self.op(format!("arith.addf {a}, {bi} : {t}"));
                let m = self.op(format!("arith.subf {a}, {bi} : {t}"));
                let r = self.sel(&gt, &m, &z, t);
                self.sel(&lt, &p, &r, t)
            }
            ElemOp::Clip { min, max } => self.clamp(a, *min, *max, c),
            ElemOp::Mod { fmod } => {
                let r = self.fmod(a, &x[1], c);
                if *fmod {
                    return r;
                }
                // Floored: a zero takes b's sign; a remainder of the other sign than b
                // moves by b (numpy's `mod`).
                let b = x[1].as_str();
                let z = self.cst(c, 0.0);
                let signed_zero = self.op(format!("math.copysign {z}, {b} : {t}"));
                let is_zero = self.cmpf("oeq", &r, &z, t);
                let r_neg = self.cmpf("olt", &r, &z, t);
                let b_neg = self.cmpf("olt", b, &z, t);
                let differ = self.op(format!("arith.xori {r_neg}, {b_neg} : i1"));
                let moved = self.op(format!("arith.addf {r}, {b} : {t}"));
                let r = self.sel(&differ, &moved, &r, t);
                self.sel(&is_zero, &signed_zero, &r, t)
            }
            // Cast and dropout are handled by `node`.
            ElemOp::Cast | ElemOp::Dropout { .. } => a.to_string(),
        }
    }

    /// C's `fmod(a, b)` in float type `c`, exactly, without `arith.remf` (the CUDA target
    /// has no lowering for it): `t` doubles from `|b|` to the largest `|b|·2^k ≤ |a|`,
    /// then halves back to `|b|`, taking `t` off the remainder `r` wherever `t ≤ r`; each
    /// subtraction is exact (`t ≤ r < 2t`, Sterbenz). NaN for a NaN operand, an infinite
    /// `a` or a zero `b`; `a` for an infinite `b`; the result has `a`'s sign.
    fn fmod(&mut self, a: &str, b: &str, c: DType) -> String {
        let t = elem_type(c);
        let ax = self.op(format!("math.absf {a} : {t}"));
        let ay = self.op(format!("math.absf {b} : {t}"));
        let zero = self.cst(c, 0.0);
        let one = self.cst(c, 1.0);
        let half = self.cst(c, 0.5);
        let inf = self.cst(c, f64::INFINITY);
        let nan = self.cst(c, f64::NAN);
        let unordered = self.cmpf("uno", a, b, t);
        let x_inf = self.cmpf("oeq", &ax, &inf, t);
        let y_zero = self.cmpf("oeq", &ay, &zero, t);
        let y_inf = self.cmpf("oeq", &ay, &inf, t);
        let bad = self.op(format!("arith.ori {unordered}, {x_inf} : i1"));
        let bad = self.op(format!("arith.ori {bad}, {y_zero} : i1"));
        let skip = self.op(format!("arith.ori {bad}, {y_inf} : i1"));
        // The loops run on finite operands (0 mod 1 where the result is a special case).
        let r0 = self.sel(&skip, &zero, &ax, t);
        let y = self.sel(&skip, &one, &ay, t);
        let b = &mut self.b;
        let (top, tw, c1, tv, d1, d2) = (
            b.fresh(),
            b.fresh(),
            b.fresh(),
            b.fresh(),
            b.fresh(),
            b.fresh(),
        );
        b.raw(format!("{top} = scf.while ({tw} = {y}) : ({t}) -> {t} {{"));
        b.raw(format!("  {d1} = arith.addf {tw}, {tw} : {t}"));
        b.raw(format!("  {c1} = arith.cmpf ole, {d1}, {r0} : {t}"));
        b.raw(format!("  scf.condition({c1}) {tw} : {t}"));
        b.raw("} do {");
        b.raw(format!("^bb0({tv}: {t}):"));
        b.raw(format!("  {d2} = arith.addf {tv}, {tv} : {t}"));
        b.raw(format!("  scf.yield {d2} : {t}"));
        b.raw("}");
        let (res, rw, tw2, c2, rv, tv2, ge, sub, rn, th) = (
            b.fresh(),
            b.fresh(),
            b.fresh(),
            b.fresh(),
            b.fresh(),
            b.fresh(),
            b.fresh(),
            b.fresh(),
            b.fresh(),
            b.fresh(),
        );
        b.raw(format!(
            "{res}:2 = scf.while ({rw} = {r0}, {tw2} = {top}) : ({t}, {t}) -> ({t}, {t}) {{"
        ));
        b.raw(format!("  {c2} = arith.cmpf oge, {tw2}, {y} : {t}"));
        b.raw(format!("  scf.condition({c2}) {rw}, {tw2} : {t}, {t}"));
        b.raw("} do {");
        b.raw(format!("^bb0({rv}: {t}, {tv2}: {t}):"));
        b.raw(format!("  {ge} = arith.cmpf oge, {rv}, {tv2} : {t}"));
        b.raw(format!("  {sub} = arith.subf {rv}, {tv2} : {t}"));
        b.raw(format!("  {rn} = arith.select {ge}, {sub}, {rv} : {t}"));
        b.raw(format!("  {th} = arith.mulf {tv2}, {half} : {t}"));
        b.raw(format!("  scf.yield {rn}, {th} : {t}, {t}"));
        b.raw("}");
        let signed = self.op(format!("math.copysign {res}#0, {a} : {t}"));
        let r = self.sel(&y_inf, a, &signed, t);
        self.sel(&bad, &nan, &r, t)
    }

    /// `min(max(a, lo), hi)` as numpy's clip (NaN stays, `lo > hi` gives `hi`); bounds
    /// rounded to `c` (exact: rounding is monotonic).
    fn clamp(&mut self, a: &str, lo: f64, hi: f64, c: DType) -> String {
        let t = elem_type(c);
        let mut v = a.to_string();
        if !(lo.is_nan() || lo == f64::NEG_INFINITY) {
            let l = self.cst(c, lo);
            let lt = self.cmpf("olt", &v, &l, t);
            v = self.sel(&lt, &l, &v, t);
        }
        if !(hi.is_nan() || hi == f64::INFINITY) {
            let h = self.cst(c, hi);
            let gt = self.cmpf("ogt", &v, &h, t);
            v = self.sel(&gt, &h, &v, t);
        }
        v
    }

    /// An integer op (operands and result of integer dtype `d`).
    fn int_op(&mut self, op: &ElemOp, x: &[String], d: DType) -> String {
        use OpKind::*;
        let t = elem_type(d);
        let a = x[0].as_str();
        match op {
            ElemOp::Plain(k) => match k {
                Relu => {
                    let z = self.ci(d, 0);
                    self.op(format!("arith.maxsi {a}, {z} : {t}"))
                }
                Abs => {
                    let z = self.ci(d, 0);
                    let n = self.op(format!("arith.subi {z}, {a} : {t}"));
                    let lt = self.op(format!("arith.cmpi slt, {a}, {z} : {t}"));
                    self.sel(&lt, &n, a, t)
                }
                Neg => {
                    let z = self.ci(d, 0);
                    self.op(format!("arith.subi {z}, {a} : {t}"))
                }
                Sign => {
                    let z = self.ci(d, 0);
                    let one = self.ci(d, 1);
                    let m1 = self.ci(d, -1);
                    let gt = self.op(format!("arith.cmpi sgt, {a}, {z} : {t}"));
                    let lt = self.op(format!("arith.cmpi slt, {a}, {z} : {t}"));
                    let r = self.sel(&lt, &m1, &z, t);
                    self.sel(&gt, &one, &r, t)
                }
                Add => self.op(format!("arith.addi {a}, {} : {t}", x[1])),
                Sub => self.op(format!("arith.subi {a}, {} : {t}", x[1])),
                Mul => self.op(format!("arith.muli {a}, {} : {t}", x[1])),
                Div => {
                    // Truncating; q = 0 → 0 (an interpreter error), q = -1 → wrapping -p.
                    let q = x[1].as_str();
                    let DivisorGuard {
                        z, q0, qm1, safe, ..
                    } = self.divisor_guard(q, d, t);
                    let dv = self.op(format!("arith.divsi {a}, {safe} : {t}"));
                    let n = self.op(format!("arith.subi {z}, {a} : {t}"));
                    let r = self.sel(&qm1, &n, &dv, t);
                    self.sel(&q0, &z, &r, t)
                }
                Max => self.op(format!("arith.maxsi {a}, {} : {t}", x[1])),
                Min => self.op(format!("arith.minsi {a}, {} : {t}", x[1])),
                PRelu => {
                    let z = self.ci(d, 0);
                    let lt = self.op(format!("arith.cmpi slt, {a}, {z} : {t}"));
                    let m = self.op(format!("arith.muli {}, {a} : {t}", x[1]));
                    self.sel(&lt, &m, a, t)
                }
                _ => a.to_string(),
            },
            ElemOp::Clip { min, max } => {
                // The interpreter: clamp (a as f64) to [ceil(min), floor(max)]; the
                // element itself where unchanged, else the bound as i64 (saturating).
                let (lo, hi) = (min.ceil(), max.floor());
                let skip_lo = lo.is_nan() || lo == f64::NEG_INFINITY;
                let skip_hi = hi.is_nan() || hi == f64::INFINITY;
                if skip_lo && skip_hi {
                    return a.to_string();
                }
                let af = self.op(format!("arith.sitofp {a} : {t} to f64"));
                let cl = self.clamp(&af, lo, hi, DType::F64);
                let same = self.cmpf("oeq", &cl, &af, "f64");
                let ci = self.f64_to_i64_sat(&cl);
                let ci = self.int_resize(&ci, DType::I64, d);
                self.sel(&same, a, &ci, t)
            }
            ElemOp::Mod { fmod } => {
                // Truncated remainder; b = 0 → 0 (as the interpreter), b = -1 → 0 (remsi
                // would overflow on the minimum).
                let q = x[1].as_str();
                let DivisorGuard { z, bad, safe, .. } = self.divisor_guard(q, d, t);
                let r = self.op(format!("arith.remsi {a}, {safe} : {t}"));
                let r = self.sel(&bad, &z, &r, t);
                if *fmod {
                    return r;
                }
                // Floored: a non-zero remainder of the other sign than b moves by b.
                let r_neg = self.op(format!("arith.cmpi slt, {r}, {z} : {t}"));
                let q_neg = self.op(format!("arith.cmpi slt, {q}, {z} : {t}"));
                let nz = self.op(format!("arith.cmpi ne, {r}, {z} : {t}"));
                let differ = self.op(format!("arith.xori {r_neg}, {q_neg} : i1"));
                let fix = self.op(format!("arith.andi {differ}, {nz} : i1"));
                let moved = self.op(format!("arith.addi {r}, {q} : {t}"));
                self.sel(&fix, &moved, &r, t)
            }
            _ => a.to_string(),
        }
    }
}

/// [`Gen::divisor_guard`]'s values: zero, `q == 0`, `q == -1`, either, and the divisor to use.
struct DivisorGuard {
    z: String,
    q0: String,
    qm1: String,
    bad: String,
    safe: String,
}
