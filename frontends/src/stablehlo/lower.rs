//! StableHLO ops (from [`super::parse`]) into ppir: one function per op kind, dispatched
//! by name in [`Lowerer::lower_op`]. Calls to private functions are inlined.

use std::collections::{BTreeMap, HashMap};

use ppir::{
    ArgKind, Attr, Attrs, DType, Function, Module, NewOp, OpKind, Tensor, TensorType, ValueId,
};

use super::parse::{hash_fields, normalize, AVal, Block, Op, TType};
use super::{ErrorKind, Pos, StableHloError};
use crate::onnx::Imported;

type R<T> = Result<T, StableHloError>;

/// How deep `func.call`s may nest (recursion is an error, not a stack overflow).
const MAX_INLINE_DEPTH: usize = 32;

/// The largest result of an op on constants that is folded into a constant.
const FOLD_MAX_ELEMENTS: u64 = 1 << 16;

/// The largest tensor built at import time (an `iota`, a splat constant).
const MAX_CONST_ELEMENTS: u64 = 1 << 24;

/// Lower a parsed module; with `batch`, the data inputs' batch (dim 0) is rebound to that
/// many rows first (see [`super::batch`]).
pub(super) fn lower_module(
    top: Vec<Op>,
    params: &BTreeMap<String, Tensor>,
    batch: Option<u64>,
) -> R<Imported> {
    // Functions: top-level, or inside a module.
    let mut funcs: Vec<Op> = vec![];
    for op in top {
        match op.name.as_str() {
            "builtin.module" => {
                for block in op.regions {
                    for inner in block.ops {
                        funcs.push(inner);
                    }
                }
            }
            _ => funcs.push(op),
        }
    }
    let mut by_name: HashMap<String, Func> = HashMap::new();
    for op in funcs {
        if op.name != "func.func" {
            return Err(StableHloError::at(
                ErrorKind::Unsupported,
                op.pos,
                &op.name,
                "expected a function (`func.func`) at the top level of the module",
            ));
        }
        let f = Func::of(op)?;
        by_name.insert(f.name.clone(), f);
    }
    let main = by_name.get("main").ok_or_else(|| StableHloError {
        kind: ErrorKind::Invalid,
        file: String::new(),
        pos: None,
        op: None,
        message: "the module has no function @main".into(),
    })?;
    let rebound = match batch {
        Some(b) => super::batch::rebind(main, &by_name, params, b)?,
        None => None,
    };
    let main = rebound.as_ref().unwrap_or(main);

    let mut l = Lowerer {
        f: Function::new("main"),
        funcs: &by_name,
        consts: HashMap::new(),
        depth: 0,
    };
    let n = main.body.args.len();
    // Parameters must name arguments of @main and match their types.
    for (key, t) in params {
        let idx = key
            .strip_prefix("arg")
            .and_then(|s| s.parse::<usize>().ok())
            .filter(|&i| i < n && key == &format!("arg{i}"));
        let Some(i) = idx else {
            return Err(StableHloError::params(format!(
                "the parameters have an array `{key}`, but @main's arguments are arg0..arg{} (keys are `arg<i>`, the argument's position)",
                n.saturating_sub(1)
            )));
        };
        let want = &main.body.args[i].1;
        let dtype = dtype_of(&want.elem).ok_or_else(|| {
            StableHloError::params(format!(
                "arg{i} has element type {} which ppcc does not support",
                want.elem
            ))
        })?;
        let shape: Vec<u64> = t.shape.iter().map(|&d| d as u64).collect();
        if shape != want.dims || t.dtype != dtype {
            return Err(StableHloError::params(format!(
                "parameter `{key}` is {} {:?}, but @main's argument {i} is {}",
                t.dtype,
                t.shape,
                show_type(want)
            )));
        }
        if !dtype.is_float() {
            return Err(StableHloError::params(format!(
                "parameter `{key}` has element type {dtype}; trainable parameters are floats (give integer arguments as inputs)"
            )));
        }
    }
    let mut env: HashMap<String, ValueId> = HashMap::new();
    let mut inputs = vec![];
    let mut weights = BTreeMap::new();
    let mut weight_sources = BTreeMap::new();
    for (i, (name, ty)) in main.body.args.iter().enumerate() {
        let key = format!("arg{i}");
        let tt = l.tensor_type(ty, main.pos, "func.func")?;
        let kind = if params.contains_key(&key) {
            ArgKind::Param
        } else {
            ArgKind::Input
        };
        let v = l.f.add_arg(key.clone(), tt, kind);
        if let Some(t) = params.get(&key) {
            weights.insert(key.clone(), t.clone());
            weight_sources.insert(key.clone(), key.clone());
        } else {
            inputs.push(key.clone());
        }
        env.insert(name.clone(), v);
    }
    let results = l.lower_block(&main.body, env)?;
    let outputs = (0..results.len()).map(|i| format!("out{i}")).collect();
    l.f.set_results(results);
    // Ops whose results nothing uses (constants left behind by folding, values the
    // module computes and drops).
    loop {
        let dead: Vec<ppir::OpId> =
            l.f.ops()
                .iter()
                .copied()
                .filter(|&o| l.f.op(o).results().iter().all(|&v| l.f.users(v).is_empty()))
                .collect();
        if dead.is_empty() {
            break;
        }
        for o in dead {
            l.f.remove_op(o);
        }
    }
    let mut module = Module::new();
    module.functions.push(l.f);
    module.weights = weights;
    Ok(Imported {
        module,
        inputs,
        outputs,
        weight_sources,
        opset: 0,
    })
}

pub(super) struct Func {
    pub(super) name: String,
    pub(super) pos: Pos,
    pub(super) body: Block,
    pub(super) result_types: Vec<TType>,
}

impl Func {
    fn of(mut op: Op) -> R<Func> {
        let name = match op.attr("sym_name") {
            Some(AVal::Str(s)) => s.clone(),
            _ => {
                return Err(StableHloError::at(
                    ErrorKind::Invalid,
                    op.pos,
                    "func.func",
                    "the function has no name",
                ))
            }
        };
        let (ins, outs) = match op.attr("function_type") {
            Some(AVal::FuncType(i, o)) => (i.clone(), o.clone()),
            _ => (op.operand_types.clone(), op.result_types.clone()),
        };
        if op.regions.len() != 1 {
            return Err(StableHloError::at(
                ErrorKind::Invalid,
                op.pos,
                "func.func",
                format!("@{name} has no body"),
            ));
        }
        let mut body = op.regions.remove(0);
        if body.args.len() != ins.len() {
            return Err(StableHloError::at(
                ErrorKind::Invalid,
                op.pos,
                "func.func",
                format!(
                    "@{name}'s body has {} arguments but its type has {}",
                    body.args.len(),
                    ins.len()
                ),
            ));
        }
        for (a, t) in body.args.iter_mut().zip(&ins) {
            a.1 = t.clone();
        }
        Ok(Func {
            name,
            pos: op.pos,
            body,
            result_types: outs,
        })
    }
}

struct Lowerer<'a> {
    f: Function,
    funcs: &'a HashMap<String, Func>,
    /// Values known at import time (constants, iotas, and what is computed from them by
    /// broadcasts and converts): operands that must be static (pad values, reduction
    /// initial values, dynamic-slice starts).
    consts: HashMap<ValueId, Tensor>,
    depth: usize,
}

pub(super) fn dtype_of(elem: &str) -> Option<DType> {
    Some(match elem {
        "f32" => DType::F32,
        "f64" => DType::F64,
        "f16" => DType::F16,
        "bf16" => DType::BF16,
        "i64" => DType::I64,
        "i32" => DType::I32,
        "i8" => DType::I8,
        "i1" => DType::Bool,
        _ => return None,
    })
}

fn show_type(t: &TType) -> String {
    let mut s = String::from("tensor<");
    for d in &t.dims {
        s.push_str(&format!("{d}x"));
    }
    s.push_str(&t.elem);
    s.push('>');
    s
}

fn show_ppir(t: &TensorType) -> String {
    t.to_string()
}

/// Where an op is: what the lowering reports and records as the op's `loc`.
#[derive(Clone)]
struct Here {
    pos: Pos,
    op: String,
}

impl Here {
    fn unsupported<T>(&self, msg: impl Into<String>) -> R<T> {
        Err(StableHloError::at(
            ErrorKind::Unsupported,
            self.pos,
            &self.op,
            msg,
        ))
    }
    fn invalid<T>(&self, msg: impl Into<String>) -> R<T> {
        Err(StableHloError::at(
            ErrorKind::Invalid,
            self.pos,
            &self.op,
            msg,
        ))
    }
    fn loc(&self) -> String {
        let short = self.op.rsplit('.').next().unwrap_or(&self.op);
        format!("{short}_{}_{}", self.pos.line, self.pos.col)
    }
}

pub(super) fn int_list(v: &AVal) -> Option<Vec<i64>> {
    match v {
        AVal::Ints(v) => Some(v.clone()),
        AVal::List(items) => items
            .iter()
            .map(|x| match x {
                AVal::Int(i) => Some(*i),
                _ => None,
            })
            .collect(),
        AVal::Int(i) => Some(vec![*i]),
        _ => None,
    }
}

impl<'a> Lowerer<'a> {
    fn tensor_type(&self, t: &TType, pos: Pos, op: &str) -> R<TensorType> {
        let Some(dtype) = dtype_of(&t.elem) else {
            return Err(StableHloError::at(
                ErrorKind::Unsupported,
                pos,
                op,
                format!(
                    "element type {} is not supported (f32, f64, f16, bf16, i64, i32, i8, i1)",
                    t.elem
                ),
            ));
        };
        Ok(TensorType::of(dtype, &t.dims))
    }

    fn shape(&self, v: ValueId) -> Vec<u64> {
        self.f
            .ty(v)
            .dims
            .iter()
            .map(|d| d.known().unwrap_or(0))
            .collect()
    }

    /// Add one ppir op; its result type comes from ppir's shape rules.
    fn push(&mut self, h: &Here, kind: OpKind, operands: Vec<ValueId>, attrs: Attrs) -> R<ValueId> {
        let types: Vec<TensorType> = operands.iter().map(|&v| self.f.ty(v).clone()).collect();
        let out = match ppir::shape::infer(kind, &attrs, &types) {
            Ok(t) => t,
            Err(e) => return h.invalid(format!("as ppir `{}`: {e}", kind.name())),
        };
        // Fold ops on constants (masks, broadcast scalars) into constants, as the ONNX
        // importer does: the partitioner then sees no computation that feeds nothing
        // the inputs reach.
        let foldable = kind != OpKind::Constant
            && !operands.is_empty()
            && operands.iter().all(|v| self.consts.contains_key(v))
            && out.len() == 1
            && out[0]
                .num_elements()
                .is_some_and(|n| n <= FOLD_MAX_ELEMENTS);
        if foldable {
            let inputs: Vec<&Tensor> = operands.iter().filter_map(|v| self.consts.get(v)).collect();
            let opts = ppir::interp::InterpOptions::default();
            if let Ok(mut t) = ppir::interp::eval_op(kind, &attrs, &inputs, &out, &opts) {
                if t.len() == 1 {
                    let value = t.remove(0);
                    return self.constant(h, value);
                }
            }
        }
        Ok(self
            .f
            .push(NewOp::new(kind, operands, out).attrs(attrs).loc(h.loc())))
    }

    fn constant(&mut self, h: &Here, t: Tensor) -> R<ValueId> {
        let v = self.push(
            h,
            OpKind::Constant,
            vec![],
            Attrs::new().with("value", Attr::Tensor(t.clone())),
        )?;
        self.consts.insert(v, t);
        Ok(v)
    }

    fn reshape(&mut self, h: &Here, x: ValueId, shape: &[u64]) -> R<ValueId> {
        if self.shape(x) == shape {
            return Ok(x);
        }
        let s: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
        let v = self.push(
            h,
            OpKind::Reshape,
            vec![x],
            Attrs::new().with("shape", Attr::Ints(s)),
        )?;
        if let Some(t) = self.consts.get(&x).cloned() {
            let t = Tensor {
                shape: shape.iter().map(|&d| d as usize).collect(),
                ..t
            };
            self.consts.insert(v, t);
        }
        Ok(v)
    }

    fn transpose(&mut self, h: &Here, x: ValueId, perm: &[usize]) -> R<ValueId> {
        if perm.iter().enumerate().all(|(i, &p)| i == p) {
            return Ok(x);
        }
        let p: Vec<i64> = perm.iter().map(|&d| d as i64).collect();
        self.push(
            h,
            OpKind::Transpose,
            vec![x],
            Attrs::new().with("perm", Attr::Ints(p)),
        )
    }

    /// Lower a block; returns the values of its terminator (`func.return`/`stablehlo.return`).
    fn lower_block(&mut self, block: &Block, mut env: HashMap<String, ValueId>) -> R<Vec<ValueId>> {
        for op in &block.ops {
            let mut op = op.clone();
            normalize(&mut op);
            let h = Here {
                pos: op.pos,
                op: op.name.clone(),
            };
            let mut operands = vec![];
            for name in &op.operands {
                match env.get(name) {
                    Some(&v) => operands.push(v),
                    None => return h.invalid(format!("unknown value %{name}")),
                }
            }
            if op.name == "func.return" || op.name == "stablehlo.return" {
                return Ok(operands);
            }
            let results = self.lower_op(&op, &h, operands)?;
            if results.len() != op.results.len() {
                return h.invalid(format!(
                    "the op has {} results, the text names {}",
                    results.len(),
                    op.results.len()
                ));
            }
            if op.result_types.len() == results.len() {
                for (&v, want) in results.iter().zip(&op.result_types) {
                    let want_t = self.tensor_type(want, op.pos, &op.name)?;
                    if self.f.ty(v) != &want_t {
                        return h.invalid(format!(
                            "the result type is {} but ppcc computes {} (please report this)",
                            show_type(want),
                            show_ppir(self.f.ty(v))
                        ));
                    }
                }
            }
            for (name, v) in op.results.iter().zip(results) {
                env.insert(name.clone(), v);
            }
        }
        Err(StableHloError::missing_return())
    }

    fn attr<'o>(&self, op: &'o Op, h: &Here, name: &str) -> R<&'o AVal> {
        match op.attr(name) {
            Some(v) => Ok(v),
            None => h.invalid(format!("missing attribute `{name}`")),
        }
    }

    fn ints(&self, op: &Op, h: &Here, name: &str) -> R<Vec<i64>> {
        let v = self.attr(op, h, name)?;
        match int_list(v) {
            Some(v) => Ok(v),
            None => h.invalid(format!("attribute `{name}`: expected a list of integers")),
        }
    }

    fn ints_or(&self, op: &Op, h: &Here, name: &str, default: Vec<i64>) -> R<Vec<i64>> {
        match op.attr(name) {
            None => Ok(default),
            Some(_) => self.ints(op, h, name),
        }
    }

    fn axes(&self, op: &Op, h: &Here, name: &str, rank: usize) -> R<Vec<usize>> {
        let v = self.ints(op, h, name)?;
        v.into_iter()
            .map(|a| {
                usize::try_from(a)
                    .ok()
                    .filter(|&a| a < rank)
                    .ok_or_else(|| {
                        StableHloError::at(
                            ErrorKind::Invalid,
                            h.pos,
                            &h.op,
                            format!("`{name}`: dimension {a} is out of range for rank {rank}"),
                        )
                    })
            })
            .collect()
    }

    fn lower_op(&mut self, op: &Op, h: &Here, x: Vec<ValueId>) -> R<Vec<ValueId>> {
        let name = op.name.as_str();
        let want_operands = |n: usize| -> R<()> {
            if x.len() != n {
                return h.invalid(format!("expected {n} operands, found {}", x.len()));
            }
            Ok(())
        };
        let unary = |kind: OpKind| (kind, 1usize);
        let simple = match name {
            "stablehlo.add" => Some((OpKind::Add, 2)),
            "stablehlo.subtract" => Some((OpKind::Sub, 2)),
            "stablehlo.multiply" => Some((OpKind::Mul, 2)),
            "stablehlo.divide" => Some((OpKind::Div, 2)),
            "stablehlo.maximum" => Some((OpKind::Max, 2)),
            "stablehlo.minimum" => Some((OpKind::Min, 2)),
            "stablehlo.power" => Some((OpKind::Pow, 2)),
            "stablehlo.negate" => Some(unary(OpKind::Neg)),
            "stablehlo.exponential" => Some(unary(OpKind::Exp)),
            "stablehlo.log" => Some(unary(OpKind::Log)),
            "stablehlo.tanh" => Some(unary(OpKind::Tanh)),
            "stablehlo.logistic" => Some(unary(OpKind::Sigmoid)),
            "stablehlo.sqrt" => Some(unary(OpKind::Sqrt)),
            "stablehlo.abs" => Some(unary(OpKind::Abs)),
            "stablehlo.sign" => Some(unary(OpKind::Sign)),
            "stablehlo.floor" => Some(unary(OpKind::Floor)),
            "stablehlo.ceil" => Some(unary(OpKind::Ceil)),
            "stablehlo.sine" => Some(unary(OpKind::Sin)),
            "stablehlo.cosine" => Some(unary(OpKind::Cos)),
            "chlo.erf" | "stablehlo.erf" => Some(unary(OpKind::Erf)),
            "stablehlo.select" => Some((OpKind::Where, 3)),
            _ => None,
        };
        if let Some((kind, n)) = simple {
            want_operands(n)?;
            return Ok(vec![self.push(h, kind, x, Attrs::new())?]);
        }
        match name {
            "stablehlo.and" | "stablehlo.or" | "stablehlo.not" => {
                let n = if name == "stablehlo.not" { 1 } else { 2 };
                want_operands(n)?;
                if self.f.ty(x[0]).dtype != DType::Bool {
                    return h.unsupported(
                        "bitwise operations on integers are not supported (only on i1)",
                    );
                }
                let kind = match name {
                    "stablehlo.and" => OpKind::And,
                    "stablehlo.or" => OpKind::Or,
                    _ => OpKind::Not,
                };
                Ok(vec![self.push(h, kind, x, Attrs::new())?])
            }
            "stablehlo.rsqrt" => {
                want_operands(1)?;
                let s = self.push(h, OpKind::Sqrt, x, Attrs::new())?;
                Ok(vec![self.push(
                    h,
                    OpKind::Reciprocal,
                    vec![s],
                    Attrs::new(),
                )?])
            }
            "chlo.erfc" => {
                want_operands(1)?;
                let dtype = self.f.ty(x[0]).dtype;
                let e = self.push(h, OpKind::Erf, x, Attrs::new())?;
                let one = self.constant(h, Tensor::scalar_f64(dtype, 1.0))?;
                Ok(vec![self.push(
                    h,
                    OpKind::Sub,
                    vec![one, e],
                    Attrs::new(),
                )?])
            }
            "stablehlo.remainder" => {
                want_operands(2)?;
                Ok(vec![self.push(
                    h,
                    OpKind::Mod,
                    x,
                    Attrs::new().with("fmod", Attr::Int(1)),
                )?])
            }
            "stablehlo.clamp" => {
                want_operands(3)?;
                let lo = self.push(h, OpKind::Max, vec![x[1], x[0]], Attrs::new())?;
                Ok(vec![self.push(
                    h,
                    OpKind::Min,
                    vec![lo, x[2]],
                    Attrs::new(),
                )?])
            }
            "stablehlo.convert" => {
                want_operands(1)?;
                let [to] = op.result_types.as_slice() else {
                    return h.invalid("expected one result type");
                };
                let to = self.tensor_type(to, h.pos, &h.op)?.dtype;
                if self.f.ty(x[0]).dtype == to {
                    return Ok(x);
                }
                let v = self.push(
                    h,
                    OpKind::Cast,
                    x.clone(),
                    Attrs::new().with("to", Attr::DType(to)),
                )?;
                if let Some(t) = self.consts.get(&x[0]).cloned() {
                    if let Some(c) = convert_tensor(&t, to) {
                        self.consts.insert(v, c);
                    }
                }
                Ok(vec![v])
            }
            "stablehlo.constant" => {
                want_operands(0)?;
                let Some(AVal::Dense { raw, ty }) = op.attr("value") else {
                    return h.unsupported("only `dense<...>` constants are supported");
                };
                let t = self.dense(h, raw, ty)?;
                Ok(vec![self.constant(h, t)?])
            }
            "stablehlo.iota" => {
                want_operands(0)?;
                let [ty] = op.result_types.as_slice() else {
                    return h.invalid("expected one result type");
                };
                let d = self.ints(op, h, "iota_dimension")?;
                let tt = self.tensor_type(ty, h.pos, &h.op)?;
                let dims: Vec<usize> = ty.dims.iter().map(|&d| d as usize).collect();
                let axis = match d.as_slice() {
                    [a] if (*a as usize) < dims.len() && *a >= 0 => *a as usize,
                    _ => return h.invalid("bad `iota_dimension`"),
                };
                let n = self.checked_count(h, &ty.dims)?;
                let inner: usize = dims[axis + 1..].iter().product();
                let vals: Vec<i64> = (0..n).map(|i| ((i / inner) % dims[axis]) as i64).collect();
                let t = if tt.dtype.is_float() {
                    Tensor::from_f64(tt.dtype, dims, vals.iter().map(|&v| v as f64).collect())
                } else {
                    Tensor::from_i64(tt.dtype, dims, vals)
                };
                Ok(vec![self.constant(h, t)?])
            }
            "stablehlo.broadcast_in_dim" => {
                want_operands(1)?;
                let [ty] = op.result_types.as_slice() else {
                    return h.invalid("expected one result type");
                };
                let dims = self.axes(op, h, "broadcast_dimensions", ty.dims.len())?;
                Ok(vec![self.broadcast_in_dim(h, x[0], &dims, &ty.dims)?])
            }
            "stablehlo.reshape" => {
                want_operands(1)?;
                let [ty] = op.result_types.as_slice() else {
                    return h.invalid("expected one result type");
                };
                Ok(vec![self.reshape(h, x[0], &ty.dims)?])
            }
            "stablehlo.transpose" => {
                want_operands(1)?;
                let rank = self.f.ty(x[0]).rank();
                let perm = self.axes(op, h, "permutation", rank)?;
                Ok(vec![self.transpose(h, x[0], &perm)?])
            }
            "stablehlo.slice" => {
                want_operands(1)?;
                let starts = self.ints(op, h, "start_indices")?;
                let ends = self.ints(op, h, "limit_indices")?;
                let rank = self.f.ty(x[0]).rank();
                let steps = self.ints_or(op, h, "strides", vec![1; rank])?;
                self.slice(h, x[0], starts, ends, steps).map(|v| vec![v])
            }
            "stablehlo.dynamic_slice" => {
                if x.is_empty() {
                    return h.invalid("expected operands");
                }
                let shape = self.shape(x[0]);
                let sizes = self.ints(op, h, "slice_sizes")?;
                if x.len() != shape.len() + 1 || sizes.len() != shape.len() {
                    return h.invalid("expected one start index and one size per dimension");
                }
                if sizes
                    .iter()
                    .zip(&shape)
                    .any(|(&k, &n)| k < 0 || k as u64 > n)
                {
                    return h.invalid("a slice size is negative or larger than its dimension");
                }
                // Constant starts are one static slice; starts known only at run time
                // each pick their rows with a `gather` of `clamp(start) + iota(size)`.
                let rank = shape.len();
                let mut starts = vec![0i64; rank];
                let mut ends: Vec<i64> = shape.iter().map(|&n| n as i64).collect();
                let mut dynamic = vec![];
                for (i, &s) in x[1..].iter().enumerate() {
                    // StableHLO clamps the start so the slice stays in bounds.
                    let hi = (shape[i] as i64 - sizes[i]).max(0);
                    match self.consts.get(&s) {
                        Some(t) => {
                            let v = t.to_i64_vec().first().copied().unwrap_or(0);
                            starts[i] = v.clamp(0, hi);
                            ends[i] = starts[i] + sizes[i];
                        }
                        None => dynamic.push(i),
                    }
                }
                let mut v = self.slice(h, x[0], starts, ends, vec![1; rank])?;
                for d in dynamic {
                    let idx = self.run_time_rows(h, x[1 + d], shape[d], sizes[d] as u64)?;
                    v = self.push(
                        h,
                        OpKind::Gather,
                        vec![v, idx],
                        Attrs::new().with("axis", Attr::Int(d as i64)),
                    )?;
                }
                Ok(vec![v])
            }
            "stablehlo.dynamic_update_slice" => {
                if x.len() < 2 {
                    return h.invalid("expected an operand, an update and start indices");
                }
                let shape = self.shape(x[0]);
                let ushape = self.shape(x[1]);
                let rank = shape.len();
                if x.len() != rank + 2 || ushape.len() != rank {
                    return h.invalid(
                        "expected an update of the operand's rank and one start index per dimension",
                    );
                }
                if ushape.iter().zip(&shape).any(|(&k, &n)| k > n) {
                    return h.invalid("the update is larger than the operand");
                }
                self.dynamic_update_slice(h, x[0], x[1], &x[2..])
                    .map(|v| vec![v])
            }
            "stablehlo.concatenate" => {
                if x.is_empty() {
                    return h.invalid("expected operands");
                }
                let d = self.ints(op, h, "dimension")?;
                let [axis] = d.as_slice() else {
                    return h.invalid("`dimension`: expected one integer");
                };
                Ok(vec![self.push(
                    h,
                    OpKind::Concat,
                    x,
                    Attrs::new().with("axis", Attr::Int(*axis)),
                )?])
            }
            "stablehlo.pad" => {
                want_operands(2)?;
                let low = self.ints(op, h, "edge_padding_low")?;
                let high = self.ints(op, h, "edge_padding_high")?;
                let interior = self.ints_or(op, h, "interior_padding", vec![0; low.len()])?;
                let rank = self.shape(x[0]).len();
                if low.len() != rank || high.len() != rank || interior.len() != rank {
                    return h.invalid("expected one low, high and interior padding per dimension");
                }
                if interior.iter().any(|&p| p < 0) {
                    return h.invalid("negative interior padding");
                }
                let Some(value) = self
                    .consts
                    .get(&x[1])
                    .and_then(|t| t.to_f64_vec().first().copied())
                else {
                    return h.unsupported(
                        "a padding value computed at run time is not supported (only constants)",
                    );
                };
                let mut v = x[0];
                for (d, &k) in interior.iter().enumerate() {
                    if k > 0 {
                        v = self.interior_pad(h, v, d, k as u64, value)?;
                    }
                }
                // Negative edge padding cuts: a slice after the (positive) padding.
                let pads: Vec<i64> = low.iter().chain(&high).map(|&p| p.max(0)).collect();
                if pads.iter().any(|&p| p != 0) {
                    let attrs = Attrs::new()
                        .with("pads", Attr::Ints(pads))
                        .with("value", Attr::Float(value));
                    v = self.push(h, OpKind::Pad, vec![v], attrs)?;
                }
                if low.iter().chain(&high).any(|&p| p < 0) {
                    let shape = self.shape(v);
                    let starts: Vec<i64> = low.iter().map(|&p| (-p).max(0)).collect();
                    let ends: Vec<i64> = high
                        .iter()
                        .zip(&shape)
                        .map(|(&p, &n)| n as i64 - (-p).max(0))
                        .collect();
                    if starts.iter().zip(&ends).any(|(s, e)| s > e) {
                        return h.invalid("the negative padding cuts more than the dimension");
                    }
                    v = self.slice(h, v, starts, ends, vec![1; rank])?;
                }
                Ok(vec![v])
            }
            "stablehlo.compare" => {
                want_operands(2)?;
                let dir = match op.attr("comparison_direction") {
                    Some(AVal::Word(w)) => w.clone(),
                    _ => return h.invalid("missing the comparison direction"),
                };
                let kind = match dir.as_str() {
                    "EQ" | "NE" => OpKind::Equal,
                    "LT" => OpKind::Less,
                    "LE" => OpKind::LessEqual,
                    "GT" => OpKind::Greater,
                    "GE" => OpKind::GreaterEqual,
                    other => return h.invalid(format!("unknown comparison direction `{other}`")),
                };
                let v = self.push(h, kind, x, Attrs::new())?;
                if dir == "NE" {
                    return Ok(vec![self.push(h, OpKind::Not, vec![v], Attrs::new())?]);
                }
                Ok(vec![v])
            }
            "stablehlo.dot_general" => {
                want_operands(2)?;
                self.dot_general(op, h, x[0], x[1]).map(|v| vec![v])
            }
            "stablehlo.reduce" => self.reduce(op, h, x),
            "stablehlo.reduce_window" => self.reduce_window(op, h, x),
            "stablehlo.convolution" => {
                want_operands(2)?;
                self.convolution(op, h, x[0], x[1]).map(|v| vec![v])
            }
            "stablehlo.gather" => {
                want_operands(2)?;
                self.gather(op, h, x[0], x[1]).map(|v| vec![v])
            }
            "func.call" => {
                let callee = match op.attr("callee") {
                    Some(AVal::Sym(s)) => s.clone(),
                    _ => return h.invalid("missing the callee"),
                };
                let funcs = self.funcs;
                let Some(f) = funcs.get(&callee) else {
                    return h.invalid(format!("no function @{callee}"));
                };
                if f.body.args.len() != x.len() {
                    return h.invalid(format!(
                        "@{callee} takes {} arguments, the call passes {}",
                        f.body.args.len(),
                        x.len()
                    ));
                }
                if self.depth >= MAX_INLINE_DEPTH {
                    return h.unsupported(format!(
                        "calls nest deeper than {MAX_INLINE_DEPTH} (recursion?)"
                    ));
                }
                let env: HashMap<String, ValueId> =
                    f.body.args.iter().map(|(n, _)| n.clone()).zip(x).collect();
                self.depth += 1;
                let r = self.lower_block(&f.body, env);
                self.depth -= 1;
                let r = r?;
                if r.len() != f.result_types.len() {
                    return Err(StableHloError::at(
                        ErrorKind::Invalid,
                        f.pos,
                        "func.func",
                        format!(
                            "@{callee} returns {} values, its type says {}",
                            r.len(),
                            f.result_types.len()
                        ),
                    ));
                }
                Ok(r)
            }
            _ => h.unsupported("this op is not supported by ppcc's StableHLO importer"),
        }
    }

    /// `k` elements of `value` between neighbours along `axis` (StableHLO's interior
    /// padding): a new size-1 axis after `axis` padded to `1 + k`, merged back into
    /// `axis`, and the trailing `k` cut off. Only reshape, pad and slice, which autodiff
    /// differentiates.
    fn interior_pad(
        &mut self,
        h: &Here,
        x: ValueId,
        axis: usize,
        k: u64,
        value: f64,
    ) -> R<ValueId> {
        let shape = self.shape(x);
        let n = shape[axis];
        if n == 0 {
            return Ok(x);
        }
        let mut split = shape.clone();
        split.insert(axis + 1, 1);
        let v = self.reshape(h, x, &split)?;
        let mut pads = vec![0i64; 2 * split.len()];
        pads[split.len() + axis + 1] = k as i64;
        let attrs = Attrs::new()
            .with("pads", Attr::Ints(pads))
            .with("value", Attr::Float(value));
        let v = self.push(h, OpKind::Pad, vec![v], attrs)?;
        let mut merged = shape.clone();
        merged[axis] = n.checked_mul(k + 1).ok_or_else(|| {
            StableHloError::at(
                ErrorKind::Invalid,
                h.pos,
                &h.op,
                "the padded size overflows",
            )
        })?;
        let v = self.reshape(h, v, &merged)?;
        let rank = shape.len();
        let starts = vec![0i64; rank];
        let mut ends: Vec<i64> = merged.iter().map(|&d| d as i64).collect();
        ends[axis] -= k as i64;
        self.slice(h, v, starts, ends, vec![1; rank])
    }

    /// A rank-0 integer `start` clamped to `0..=n - size`, as a scalar of its dtype.
    fn clamped_start(&mut self, h: &Here, start: ValueId, n: u64, size: u64) -> R<ValueId> {
        let ty = self.f.ty(start).clone();
        if ty.rank() != 0 || ty.dtype.is_float() || ty.dtype == DType::Bool {
            return h.invalid(format!(
                "a start index must be an integer scalar, not {}",
                show_ppir(&ty)
            ));
        }
        let lo = self.constant(h, Tensor::from_i64(ty.dtype, vec![], vec![0]))?;
        let hi = self.constant(
            h,
            Tensor::from_i64(ty.dtype, vec![], vec![n.saturating_sub(size) as i64]),
        )?;
        let s = self.push(h, OpKind::Max, vec![start, lo], Attrs::new())?;
        self.push(h, OpKind::Min, vec![s, hi], Attrs::new())
    }

    /// The rows `clamp(start) + 0..size` of a dim of `n` rows, for a `gather`.
    fn run_time_rows(&mut self, h: &Here, start: ValueId, n: u64, size: u64) -> R<ValueId> {
        let s = self.clamped_start(h, start, n, size)?;
        let dtype = self.f.ty(s).dtype;
        let k = self.checked_count(h, &[size])?;
        let iota = self.constant(h, Tensor::from_i64(dtype, vec![k], (0..k as i64).collect()))?;
        self.push(h, OpKind::Add, vec![iota, s], Attrs::new())
    }

    /// `dynamic_update_slice`: along each dim `d` the result's row `p` takes the update's
    /// row `p - start_d` where that is in `0..k_d` (starts clamped as StableHLO does): the
    /// update is gathered to the operand's shape and selected by the mask of the box.
    fn dynamic_update_slice(
        &mut self,
        h: &Here,
        operand: ValueId,
        update: ValueId,
        starts: &[ValueId],
    ) -> R<ValueId> {
        let shape = self.shape(operand);
        let ushape = self.shape(update);
        let rank = shape.len();
        let mut u = update;
        let mut mask: Option<ValueId> = None;
        for d in 0..rank {
            let (n, k) = (shape[d], ushape[d]);
            if n == k {
                continue;
            }
            let s = self.clamped_start(h, starts[d], n, k)?;
            let dtype = self.f.ty(s).dtype;
            let cnt = self.checked_count(h, &[n])?;
            let pos = self.constant(
                h,
                Tensor::from_i64(dtype, vec![cnt], (0..cnt as i64).collect()),
            )?;
            let j = self.push(h, OpKind::Sub, vec![pos, s], Attrs::new())?;
            let zero = self.constant(h, Tensor::from_i64(dtype, vec![], vec![0]))?;
            let kk = self.constant(h, Tensor::from_i64(dtype, vec![], vec![k as i64]))?;
            let ge = self.push(h, OpKind::GreaterEqual, vec![j, zero], Attrs::new())?;
            let lt = self.push(h, OpKind::Less, vec![j, kk], Attrs::new())?;
            let inside = self.push(h, OpKind::And, vec![ge, lt], Attrs::new())?;
            let mut mshape = vec![1u64; rank];
            mshape[d] = n;
            let inside = self.reshape(h, inside, &mshape)?;
            mask = Some(match mask {
                None => inside,
                Some(m) => self.push(h, OpKind::And, vec![m, inside], Attrs::new())?,
            });
            let km1 = self.constant(
                h,
                Tensor::from_i64(dtype, vec![], vec![k.saturating_sub(1) as i64]),
            )?;
            let jc = self.push(h, OpKind::Max, vec![j, zero], Attrs::new())?;
            let jc = self.push(h, OpKind::Min, vec![jc, km1], Attrs::new())?;
            u = self.push(
                h,
                OpKind::Gather,
                vec![u, jc],
                Attrs::new().with("axis", Attr::Int(d as i64)),
            )?;
        }
        match mask {
            // The update covers the whole operand.
            None => Ok(u),
            Some(m) => self.push(h, OpKind::Where, vec![m, u, operand], Attrs::new()),
        }
    }

    fn checked_count(&self, h: &Here, dims: &[u64]) -> R<usize> {
        let n = dims.iter().try_fold(1u64, |n, &d| n.checked_mul(d));
        match n {
            Some(n) if n <= MAX_CONST_ELEMENTS => Ok(n as usize),
            _ => h.unsupported(format!(
                "a constant of more than {MAX_CONST_ELEMENTS} elements is too large to build at import time"
            )),
        }
    }

    fn slice(
        &mut self,
        h: &Here,
        x: ValueId,
        starts: Vec<i64>,
        ends: Vec<i64>,
        steps: Vec<i64>,
    ) -> R<ValueId> {
        let shape = self.shape(x);
        if starts.len() != shape.len() || ends.len() != shape.len() || steps.len() != shape.len() {
            return h.invalid("expected one start, limit and stride per dimension");
        }
        if starts
            .iter()
            .zip(&ends)
            .zip(&shape)
            .all(|((&s, &e), &d)| s == 0 && e == d as i64)
            && steps.iter().all(|&s| s == 1)
        {
            return Ok(x);
        }
        let axes: Vec<i64> = (0..shape.len() as i64).collect();
        let attrs = Attrs::new()
            .with("starts", Attr::Ints(starts))
            .with("ends", Attr::Ints(ends))
            .with("axes", Attr::Ints(axes))
            .with("steps", Attr::Ints(steps));
        self.push(h, OpKind::Slice, vec![x], attrs)
    }

    fn broadcast_in_dim(
        &mut self,
        h: &Here,
        x: ValueId,
        dims: &[usize],
        out: &[u64],
    ) -> R<ValueId> {
        let shape = self.shape(x);
        if dims.len() != shape.len() {
            return h.invalid(format!(
                "`broadcast_dimensions` has {} entries for an operand of rank {}",
                dims.len(),
                shape.len()
            ));
        }
        // Operand axes in the order of the result axes they map to.
        let mut order: Vec<usize> = (0..dims.len()).collect();
        order.sort_by_key(|&i| dims[i]);
        let x = self.transpose(h, x, &order)?;
        let mut mid = vec![1u64; out.len()];
        for &i in &order {
            let d = shape[i];
            if d != 1 && d != out[dims[i]] {
                return h.invalid(format!(
                    "operand dimension {i} (size {d}) cannot broadcast to size {}",
                    out[dims[i]]
                ));
            }
            mid[dims[i]] = d;
        }
        let r = self.reshape(h, x, &mid)?;
        if mid == out {
            return Ok(r);
        }
        let s: Vec<i64> = out.iter().map(|&d| d as i64).collect();
        let v = self.push(
            h,
            OpKind::Expand,
            vec![r],
            Attrs::new().with("shape", Attr::Ints(s)),
        )?;
        // A splat constant stays known (reduction initial values, pad values).
        if let Some(t) = self.consts.get(&r) {
            if t.num_elements() == 1 {
                if let Ok(n) = self.checked_count(h, out) {
                    let dims: Vec<usize> = out.iter().map(|&d| d as usize).collect();
                    let c = match &t.data {
                        ppir::TensorData::Float(d) => {
                            Tensor::from_f64(t.dtype, dims, vec![d[0]; n])
                        }
                        ppir::TensorData::Int(d) => Tensor::from_i64(t.dtype, dims, vec![d[0]; n]),
                    };
                    self.consts.insert(v, c);
                }
            }
        }
        Ok(v)
    }

    fn dot_general(&mut self, op: &Op, h: &Here, a: ValueId, b: ValueId) -> R<ValueId> {
        let sa = self.shape(a);
        let sb = self.shape(b);
        let lb = self.axes_or_empty(op, h, "lhs_batching_dimensions", sa.len())?;
        let rb = self.axes_or_empty(op, h, "rhs_batching_dimensions", sb.len())?;
        let lc = self.axes_or_empty(op, h, "lhs_contracting_dimensions", sa.len())?;
        let rc = self.axes_or_empty(op, h, "rhs_contracting_dimensions", sb.len())?;
        if lb.len() != rb.len() || lc.len() != rc.len() {
            return h.invalid("the lhs and rhs dimension lists differ in length");
        }
        for (&i, &j) in lb.iter().zip(&rb).chain(lc.iter().zip(&rc)) {
            if sa[i] != sb[j] {
                return h.invalid(format!(
                    "lhs dimension {i} (size {}) and rhs dimension {j} (size {}) differ",
                    sa[i], sb[j]
                ));
            }
        }
        let lf: Vec<usize> = (0..sa.len())
            .filter(|i| !lb.contains(i) && !lc.contains(i))
            .collect();
        let rf: Vec<usize> = (0..sb.len())
            .filter(|i| !rb.contains(i) && !rc.contains(i))
            .collect();
        let prod = |s: &[u64], ax: &[usize]| ax.iter().map(|&i| s[i]).product::<u64>();
        let mut out: Vec<u64> = lb.iter().map(|&i| sa[i]).collect();
        out.extend(lf.iter().map(|&i| sa[i]));
        out.extend(rf.iter().map(|&i| sb[i]));
        // The common case, `x[.., K] @ w[K, N]`: one matmul.
        if !sa.is_empty() && lb.is_empty() && lc == [sa.len() - 1] && sb.len() == 2 && rc == [0] {
            return self.push(h, OpKind::MatMul, vec![a, b], Attrs::new());
        }
        let (bn, m, k, n) = (
            prod(&sa, &lb),
            prod(&sa, &lf),
            prod(&sa, &lc),
            prod(&sb, &rf),
        );
        let mut pa: Vec<usize> = lb.clone();
        pa.extend(&lf);
        pa.extend(&lc);
        let mut pb: Vec<usize> = rb.clone();
        pb.extend(&rc);
        pb.extend(&rf);
        let at = self.transpose(h, a, &pa)?;
        let bt = self.transpose(h, b, &pb)?;
        let (ash, bsh) = if lb.is_empty() {
            (vec![m, k], vec![k, n])
        } else {
            (vec![bn, m, k], vec![bn, k, n])
        };
        let a3 = self.reshape(h, at, &ash)?;
        let b3 = self.reshape(h, bt, &bsh)?;
        let mm = self.push(h, OpKind::MatMul, vec![a3, b3], Attrs::new())?;
        self.reshape(h, mm, &out)
    }

    fn axes_or_empty(&self, op: &Op, h: &Here, name: &str, rank: usize) -> R<Vec<usize>> {
        if op.attr(name).is_none() {
            return Ok(vec![]);
        }
        self.axes(op, h, name, rank)
    }

    /// The single op of a reduction body: `applies OP`, or a region whose one op combines
    /// the two block arguments and is returned.
    fn body_op(&self, op: &Op, h: &Here) -> R<String> {
        if let Some(AVal::Word(w)) = op.attr("applies") {
            return Ok(w.clone());
        }
        let [block] = op.regions.as_slice() else {
            return h.invalid("expected a reduction body");
        };
        let [inner, ret] = block.ops.as_slice() else {
            return h.unsupported(
                "only reduction bodies of one op (add, maximum, minimum) are supported",
            );
        };
        let args: Vec<&String> = block.args.iter().map(|(n, _)| n).collect();
        let uses_args = inner.operands.len() == 2
            && args.len() == 2
            && inner.operands.iter().all(|o| args.contains(&o))
            && ret.operands.len() == 1
            && inner.results.first() == ret.operands.first();
        if !uses_args {
            return h.unsupported("only reduction bodies of one op (add, maximum, minimum) on the two block arguments are supported");
        }
        Ok(inner.name.clone())
    }

    fn reduce(&mut self, op: &Op, h: &Here, x: Vec<ValueId>) -> R<Vec<ValueId>> {
        if x.len() == 4 {
            return self.arg_reduce(op, h, x);
        }
        if x.len() != 2 {
            return h.unsupported("reductions of several operands at once are supported only in the argmax/argmin form (values and indices) that `jnp.argmax`/`jnp.argmin` emit");
        }
        let body = self.body_op(op, h)?;
        let rank = self.f.ty(x[0]).rank();
        let dims = self.axes(op, h, "dimensions", rank)?;
        let dtype = self.f.ty(x[0]).dtype;
        if dtype == DType::Bool && matches!(body.as_str(), "stablehlo.and" | "stablehlo.or") {
            return self
                .bool_reduce(h, &body, x[0], x[1], &dims)
                .map(|v| vec![v]);
        }
        let (kind, combine, identity) = match body.as_str() {
            "stablehlo.add" => (OpKind::ReduceSum, OpKind::Add, 0.0),
            "stablehlo.maximum" => (OpKind::ReduceMax, OpKind::Max, f64::NEG_INFINITY),
            "stablehlo.minimum" => (OpKind::ReduceMin, OpKind::Min, f64::INFINITY),
            other => {
                return h.unsupported(format!(
                    "reductions with `{other}` are not supported (add, maximum, minimum)"
                ))
            }
        };
        if !dtype.is_float() && kind != OpKind::ReduceSum {
            return h.unsupported("integer max/min reductions are not supported");
        }
        let axes: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        let r = if axes.is_empty() {
            x[0]
        } else {
            let attrs = Attrs::new()
                .with("axes", Attr::Ints(axes))
                .with("keepdims", Attr::Int(0));
            self.push(h, kind, vec![x[0]], attrs)?
        };
        let is_identity = self
            .consts
            .get(&x[1])
            .and_then(|t| t.to_f64_vec().first().copied())
            .is_some_and(|v| v == identity);
        if is_identity {
            return Ok(vec![r]);
        }
        Ok(vec![self.push(h, combine, vec![r, x[1]], Attrs::new())?])
    }

    /// `reduce` of (values, indices) with the comparator body `jnp.argmax`/`jnp.argmin`
    /// emit: the body is run on probe values to check that it keeps the larger (smaller)
    /// value and, on ties, the smaller index. Lowered as the max (min) and the smallest
    /// index where the values equal it.
    fn arg_reduce(&mut self, op: &Op, h: &Here, x: Vec<ValueId>) -> R<Vec<ValueId>> {
        let unsupported = "only the argmax/argmin form of a two-operand reduce is supported (the comparator body `jnp.argmax`/`jnp.argmin` emit)";
        let [block] = op.regions.as_slice() else {
            return h.unsupported(unsupported);
        };
        let (vt, it) = (self.f.ty(x[0]).clone(), self.f.ty(x[1]).clone());
        if vt.dims != it.dims || !vt.dtype.is_float() || it.dtype.is_float() {
            return h.unsupported(format!(
                "{unsupported}: expected float values and integer indices of one shape"
            ));
        }
        let kind = match arg_body_kind(block) {
            Some(k) => k,
            None => return h.unsupported(unsupported),
        };
        let identity = if kind == OpKind::ReduceMax {
            f64::NEG_INFINITY
        } else {
            f64::INFINITY
        };
        let init = self
            .consts
            .get(&x[2])
            .and_then(|t| t.to_f64_vec().first().copied());
        if init != Some(identity) {
            return h.unsupported(format!(
                "{unsupported}: the initial value must be {identity}"
            ));
        }
        let rank = vt.rank();
        let dims = self.axes(op, h, "dimensions", rank)?;
        if dims.is_empty() {
            return Ok(vec![x[0], x[1]]);
        }
        let axes: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        let keep = Attrs::new()
            .with("axes", Attr::Ints(axes.clone()))
            .with("keepdims", Attr::Int(1));
        let drop = Attrs::new()
            .with("axes", Attr::Ints(axes))
            .with("keepdims", Attr::Int(0));
        let m = self.push(h, kind, vec![x[0]], keep)?;
        let values = self.push(h, kind, vec![x[0]], drop.clone())?;
        let hit = self.push(h, OpKind::Equal, vec![x[0], m], Attrs::new())?;
        // Indices as f32 (exact below 2^24): the smallest where the value is the extreme.
        let fi = self.push(
            h,
            OpKind::Cast,
            vec![x[1]],
            Attrs::new().with("to", Attr::DType(DType::F32)),
        )?;
        let big = self.constant(h, Tensor::scalar_f64(DType::F32, f32::MAX as f64))?;
        let cand = self.push(h, OpKind::Where, vec![hit, fi, big], Attrs::new())?;
        let first = self.push(h, OpKind::ReduceMin, vec![cand], drop)?;
        let idx = self.push(
            h,
            OpKind::Cast,
            vec![first],
            Attrs::new().with("to", Attr::DType(it.dtype)),
        )?;
        Ok(vec![values, idx])
    }

    /// `reduce` with an `and` (all) or `or` (any) body on i1: a min/max over 0/1 floats.
    fn bool_reduce(
        &mut self,
        h: &Here,
        body: &str,
        x: ValueId,
        init: ValueId,
        dims: &[usize],
    ) -> R<ValueId> {
        let is_and = body == "stablehlo.and";
        let f = self.push(
            h,
            OpKind::Cast,
            vec![x],
            Attrs::new().with("to", Attr::DType(DType::F32)),
        )?;
        let kind = if is_and {
            OpKind::ReduceMin
        } else {
            OpKind::ReduceMax
        };
        let r = if dims.is_empty() {
            f
        } else {
            let axes: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
            let attrs = Attrs::new()
                .with("axes", Attr::Ints(axes))
                .with("keepdims", Attr::Int(0));
            self.push(h, kind, vec![f], attrs)?
        };
        let half = self.constant(h, Tensor::scalar_f64(DType::F32, 0.5))?;
        let b = self.push(h, OpKind::Greater, vec![r, half], Attrs::new())?;
        let combine = if is_and { OpKind::And } else { OpKind::Or };
        self.push(h, combine, vec![b, init], Attrs::new())
    }

    /// Pooling: `reduce_window` over the spatial axes of an NCHW tensor (window 1 on
    /// the first two axes) with a `maximum` body (max pooling) or an `add` body (a sum
    /// pool: average pooling counting the padding, times the window size).
    fn reduce_window(&mut self, op: &Op, h: &Here, x: Vec<ValueId>) -> R<Vec<ValueId>> {
        if x.len() != 2 {
            return h.unsupported("reduce_window of several operands is not supported");
        }
        let body = self.body_op(op, h)?;
        let shape = self.shape(x[0]);
        let rank = shape.len();
        let win = self.ints(op, h, "window_dimensions")?;
        let strides = self.ints_or(op, h, "window_strides", vec![1; rank])?;
        let base = self.ints_or(op, h, "base_dilations", vec![1; rank])?;
        let wdil = self.ints_or(op, h, "window_dilations", vec![1; rank])?;
        let pad = match op.attr("padding") {
            None => vec![0; 2 * rank],
            Some(v) => self.pairs(h, v, rank)?,
        };
        if rank < 3 || win.len() != rank || strides.len() != rank || wdil.len() != rank {
            return h
                .unsupported("only pooling over the spatial axes of an NCHW tensor is supported");
        }
        if win[..2] != [1, 1]
            || strides[..2] != [1, 1]
            || pad[..2] != [0, 0]
            || pad[rank..rank + 2] != [0, 0]
        {
            return h.unsupported("only windows of size 1 on the first two (batch, channel) axes are supported (NCHW pooling)");
        }
        if base.iter().any(|&b| b != 1) {
            return h.unsupported("base dilations are not supported");
        }
        let ks: Vec<i64> = win[2..].to_vec();
        let mut pads: Vec<i64> = pad[2..rank].to_vec();
        pads.extend(&pad[rank + 2..]);
        let attrs = Attrs::new()
            .with("kernel_shape", Attr::Ints(ks.clone()))
            .with("strides", Attr::Ints(strides[2..].to_vec()))
            .with("pads", Attr::Ints(pads))
            .with("dilations", Attr::Ints(wdil[2..].to_vec()));
        let init = self
            .consts
            .get(&x[1])
            .and_then(|t| t.to_f64_vec().first().copied());
        match body.as_str() {
            "stablehlo.maximum" if init == Some(f64::NEG_INFINITY) => {
                Ok(vec![self.push(h, OpKind::MaxPool, vec![x[0]], attrs)?])
            }
            "stablehlo.add" if init == Some(0.0) => {
                if wdil.iter().any(|&d| d != 1) {
                    return h.unsupported("window dilations of a sum pool are not supported");
                }
                let attrs = attrs.with("count_include_pad", Attr::Int(1));
                let avg = self.push(h, OpKind::AvgPool, vec![x[0]], attrs)?;
                let dtype = self.f.ty(x[0]).dtype;
                let n: i64 = ks.iter().product();
                let c = self.constant(h, Tensor::scalar_f64(dtype, n as f64))?;
                Ok(vec![self.push(h, OpKind::Mul, vec![avg, c], Attrs::new())?])
            }
            _ => h.unsupported(format!(
                "only max pooling (`maximum` from -inf) and sum pooling (`add` from 0) windows are supported, not `{body}`"
            )),
        }
    }

    /// `[[lo, hi], ..]` or `dense<..> : tensor<Rx2xi64>` → all lows, then all highs.
    fn pairs(&self, h: &Here, v: &AVal, rank: usize) -> R<Vec<i64>> {
        let flat: Vec<i64> = match v {
            AVal::List(rows) => {
                let mut out = vec![];
                for r in rows {
                    match int_list(r) {
                        Some(p) if p.len() == 2 => out.extend(p),
                        _ => return h.invalid("padding: expected [low, high] pairs"),
                    }
                }
                out
            }
            AVal::Dense { raw, ty } => {
                let t = self.dense(h, raw, ty)?;
                t.to_i64_vec()
            }
            _ => return h.invalid("padding: expected [low, high] pairs"),
        };
        if flat.len() != 2 * rank {
            return h.invalid(format!("padding: expected {rank} [low, high] pairs"));
        }
        let lows = flat.iter().step_by(2).copied();
        let highs = flat.iter().skip(1).step_by(2).copied();
        Ok(lows.chain(highs).collect())
    }

    fn convolution(&mut self, op: &Op, h: &Here, x: ValueId, w: ValueId) -> R<ValueId> {
        let rank = self.f.ty(x).rank();
        let sp = rank.saturating_sub(2);
        let dn = match op.attr("dimension_numbers") {
            Some(AVal::Hash { body, .. }) => body.replace(' ', ""),
            _ => return h.invalid("missing `dimension_numbers`"),
        };
        // Any layout: transposes to NCHW/OIHW around ppir's conv, and back.
        let Some((lhs, rhs, out)) = conv_layouts(&dn, sp) else {
            return h.unsupported(format!(
                "cannot read the convolution layout `{dn}` (expected e.g. `[b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1]` for a rank-{rank} input)"
            ));
        };
        if self.f.ty(w).rank() != rank {
            return h.invalid("the kernel's rank differs from the input's");
        }
        let x = self.transpose(h, x, &lhs)?;
        let w = self.transpose(h, w, &rhs)?;
        let strides = self.ints_or(op, h, "window_strides", vec![1; sp])?;
        let lhs_dil = self.ints_or(op, h, "lhs_dilation", vec![1; sp])?;
        let rhs_dil = self.ints_or(op, h, "rhs_dilation", vec![1; sp])?;
        let pads = match op.attr("padding") {
            None => vec![0; 2 * sp],
            Some(v) => self.pairs(h, v, sp)?,
        };
        if lhs_dil.len() != sp || lhs_dil.iter().any(|&d| d < 1) {
            return h.invalid("bad `lhs_dilation`");
        }
        // Input (lhs) dilation is interior padding of the input with zeros.
        let mut x = x;
        for (i, &d) in lhs_dil.iter().enumerate() {
            if d > 1 {
                x = self.interior_pad(h, x, 2 + i, (d - 1) as u64, 0.0)?;
            }
        }
        if let Some(v) = op.attr("window_reversal") {
            let rev = match v {
                AVal::List(items) => items.iter().any(|i| matches!(i, AVal::Bool(true))),
                AVal::Ints(v) => v.iter().any(|&b| b != 0),
                _ => false,
            };
            if rev {
                return h.unsupported("window reversal is not supported");
            }
        }
        let group = match op.attr("feature_group_count") {
            Some(AVal::Int(g)) => *g,
            _ => 1,
        };
        if let Some(AVal::Int(b)) = op.attr("batch_group_count") {
            if *b != 1 {
                return h.unsupported("batch_group_count other than 1 is not supported");
            }
        }
        // Negative padding cuts the (dilated) input first.
        if pads.iter().any(|&p| p < 0) {
            let shape = self.shape(x);
            let mut starts = vec![0i64; rank];
            let mut ends: Vec<i64> = shape.iter().map(|&n| n as i64).collect();
            for i in 0..sp {
                starts[2 + i] = (-pads[i]).max(0);
                ends[2 + i] -= (-pads[sp + i]).max(0);
                if starts[2 + i] > ends[2 + i] {
                    return h.invalid("the negative padding cuts more than the input");
                }
            }
            x = self.slice(h, x, starts, ends, vec![1; rank])?;
        }
        let pads: Vec<i64> = pads.iter().map(|&p| p.max(0)).collect();
        let attrs = Attrs::new()
            .with("strides", Attr::Ints(strides))
            .with("pads", Attr::Ints(pads))
            .with("dilations", Attr::Ints(rhs_dil))
            .with("group", Attr::Int(group));
        let y = self.push(h, OpKind::Conv, vec![x, w], attrs)?;
        // `out[k]` is the result's dim `k` in NCHW order; move it to the module's layout.
        let mut inv = vec![0usize; rank];
        for (k, &p) in out.iter().enumerate() {
            inv[p] = k;
        }
        self.transpose(h, y, &inv)
    }

    /// The embedding form of `gather`: whole rows of the operand selected along axis 0 by
    /// indices with a trailing index vector of size 1.
    fn gather(&mut self, op: &Op, h: &Here, data: ValueId, idx: ValueId) -> R<ValueId> {
        let dn = match op.attr("dimension_numbers") {
            Some(AVal::Hash { body, .. }) => hash_fields(body),
            _ => return h.invalid("missing `dimension_numbers`"),
        };
        let field = |k: &str| -> Vec<i64> {
            dn.iter()
                .find(|(n, _)| n == k)
                .and_then(|(_, v)| int_list(v))
                .unwrap_or_default()
        };
        let ds = self.shape(data);
        let is = self.shape(idx);
        let ivd = field("index_vector_dim");
        let ivd = ivd.first().copied().unwrap_or(is.len() as i64);
        let sizes = self.ints(op, h, "slice_sizes")?;
        if ds.is_empty() || is.is_empty() {
            return h.unsupported("only the embedding form of gather (whole rows along axis 0, as `table[ids]`) is supported");
        }
        let batch_rank = if ivd as usize == is.len() {
            is.len()
        } else {
            is.len() - 1
        };
        let offset: Vec<i64> = (batch_rank as i64..(batch_rank + ds.len() - 1) as i64).collect();
        let mut full = vec![1i64];
        full.extend(ds.iter().skip(1).map(|&d| d as i64));
        let embedding = field("collapsed_slice_dims") == [0]
            && field("start_index_map") == [0]
            && field("operand_batching_dims").is_empty()
            && (ivd as usize == is.len()
                || (ivd as usize + 1 == is.len() && is.last() == Some(&1)))
            && field("offset_dims") == offset
            && sizes == full;
        if !embedding {
            // take_along_axis: every operand axis but one is a batching axis, the indices
            // pick one element along the remaining axis `a`.
            let r = ds.len();
            let a = field("start_index_map");
            let along = a.len() == 1
                && field("collapsed_slice_dims") == a
                && field("offset_dims").is_empty()
                && ivd as usize + 1 == is.len()
                && is.len() == r + 1
                && is.last() == Some(&1)
                && sizes.iter().all(|&s| s == 1)
                && sizes.len() == r;
            let others: Vec<i64> = (0..r as i64).filter(|&d| Some(&d) != a.first()).collect();
            if along
                && field("operand_batching_dims") == others
                && field("start_indices_batching_dims") == others
            {
                return self.take_along_axis(h, data, idx, a[0] as usize);
            }
            let dims = GatherDims {
                offset: field("offset_dims"),
                collapsed: field("collapsed_slice_dims"),
                start_index_map: field("start_index_map"),
                ivd: ivd as usize,
            };
            if field("operand_batching_dims").is_empty() {
                if let Some(v) = self.gather_whole_slices(h, data, idx, &dims, &sizes)? {
                    return Ok(v);
                }
            }
            return h.unsupported("only gathers of whole slices along the indexed dims (`table[ids]`, `x[:, idx]`, `x[i, j]`, `jnp.take(x, i, axis=k)`) and the take_along_axis form are supported");
        }
        let ids = self.reshape(h, idx, &is[..batch_rank])?;
        self.push(
            h,
            OpKind::Gather,
            vec![data, ids],
            Attrs::new().with("axis", Attr::Int(0)),
        )
    }

    /// A gather that takes whole slices of every dim but the indexed ones (`x[:, idx]`,
    /// `x[i, j]`, `jnp.take(x, i, axis=k)`): the indexed dims moved last and merged, one
    /// ppir `gather` with the linear index of the (clamped) index vectors, and a transpose
    /// to the result's layout. `None` when the gather is not of that form.
    fn gather_whole_slices(
        &mut self,
        h: &Here,
        data: ValueId,
        idx: ValueId,
        g: &GatherDims,
        sizes: &[i64],
    ) -> R<Option<ValueId>> {
        let ds = self.shape(data);
        let is = self.shape(idx);
        let r = ds.len();
        let a: Vec<usize> = g
            .start_index_map
            .iter()
            .filter_map(|&d| usize::try_from(d).ok())
            .collect();
        let mut coll: Vec<usize> = g
            .collapsed
            .iter()
            .filter_map(|&d| usize::try_from(d).ok())
            .collect();
        coll.sort_unstable();
        let mut sorted_a = a.clone();
        sorted_a.sort_unstable();
        sorted_a.dedup();
        let rest: Vec<usize> = (0..r).filter(|d| !coll.contains(d)).collect();
        let offset: Vec<usize> = g
            .offset
            .iter()
            .filter_map(|&d| usize::try_from(d).ok())
            .collect();
        let implicit = g.ivd == is.len();
        let ncomp = if implicit {
            1
        } else {
            is.get(g.ivd).copied().unwrap_or(0) as usize
        };
        let ok = a.len() == g.start_index_map.len()
            && sorted_a.len() == a.len()
            && sorted_a == coll
            && a.iter().all(|&d| d < r)
            && ncomp == a.len()
            && g.ivd <= is.len()
            && sizes.len() == r
            && (0..r).all(|d| sizes[d] == if coll.contains(&d) { 1 } else { ds[d] as i64 })
            && offset.len() == rest.len()
            && offset.windows(2).all(|w| w[0] < w[1]);
        let q: Vec<u64> = (0..is.len())
            .filter(|&d| implicit || d != g.ivd)
            .map(|d| is[d])
            .collect();
        if !ok || offset.iter().any(|&o| o >= rest.len() + q.len()) || a.is_empty() {
            return Ok(None);
        }
        let itype = self.f.ty(idx).dtype;
        if itype.is_float() || itype == DType::Bool {
            return h.invalid("gather indices must be integers");
        }
        // One index tensor of shape q per component, clamped into its dim.
        let mut lin: Option<ValueId> = None;
        for (c, &d) in a.iter().enumerate() {
            let comp = if implicit {
                idx
            } else {
                let mut starts = vec![0i64; is.len()];
                let mut ends: Vec<i64> = is.iter().map(|&n| n as i64).collect();
                starts[g.ivd] = c as i64;
                ends[g.ivd] = c as i64 + 1;
                let s = self.slice(h, idx, starts, ends, vec![1; is.len()])?;
                self.reshape(h, s, &q)?
            };
            let comp = self.clamped_rows(h, comp, ds[d])?;
            lin = Some(match lin {
                None => comp,
                Some(l) => {
                    let n =
                        self.constant(h, Tensor::from_i64(itype, vec![], vec![ds[d] as i64]))?;
                    let l = self.push(h, OpKind::Mul, vec![l, n], Attrs::new())?;
                    self.push(h, OpKind::Add, vec![l, comp], Attrs::new())?
                }
            });
        }
        let Some(lin) = lin else { return Ok(None) };
        // Indexed dims last, in the order of the index vector, merged into one.
        let mut perm = rest.clone();
        perm.extend(&a);
        let t = self.transpose(h, data, &perm)?;
        let mut merged: Vec<u64> = rest.iter().map(|&d| ds[d]).collect();
        let n: u64 = a.iter().map(|&d| ds[d]).product();
        merged.push(n);
        let t = self.reshape(h, t, &merged)?;
        let v = self.push(
            h,
            OpKind::Gather,
            vec![t, lin],
            Attrs::new().with("axis", Attr::Int(rest.len() as i64)),
        )?;
        // Now `rest ++ q`; the result puts `rest` at `offset` and `q` elsewhere, in order.
        let rank = rest.len() + q.len();
        let mut out = vec![0usize; rank];
        let mut next_q = rest.len();
        for (j, o) in out.iter_mut().enumerate() {
            match offset.iter().position(|&p| p == j) {
                Some(k) => *o = k,
                None => {
                    *o = next_q;
                    next_q += 1;
                }
            }
        }
        self.transpose(h, v, &out).map(Some)
    }

    /// Integer indices clamped into `0..n` (StableHLO clamps gather starts).
    fn clamped_rows(&mut self, h: &Here, idx: ValueId, n: u64) -> R<ValueId> {
        let dtype = self.f.ty(idx).dtype;
        let lo = self.constant(h, Tensor::from_i64(dtype, vec![], vec![0]))?;
        let hi = self.constant(
            h,
            Tensor::from_i64(dtype, vec![], vec![n.saturating_sub(1) as i64]),
        )?;
        let v = self.push(h, OpKind::Max, vec![idx, lo], Attrs::new())?;
        self.push(h, OpKind::Min, vec![v, hi], Attrs::new())
    }

    /// `take_along_axis(data, idx, axis)` (idx with a trailing index vector of size 1) as a
    /// one-hot selection: `sum_c where(idx == c, data, 0)` along `axis`, which autodiff
    /// differentiates like any other ops.
    fn take_along_axis(
        &mut self,
        h: &Here,
        data: ValueId,
        idx: ValueId,
        axis: usize,
    ) -> R<ValueId> {
        let ds = self.shape(data);
        let is = self.shape(idx);
        let r = ds.len();
        // Move `axis` last in both.
        let mut perm: Vec<usize> = (0..r).filter(|&d| d != axis).collect();
        perm.push(axis);
        let idx = self.reshape(h, idx, &is[..r])?;
        let d = self.transpose(h, data, &perm)?;
        let i = self.transpose(h, idx, &perm)?;
        let (c, k) = (ds[axis], is[axis]);
        let lead: Vec<u64> = perm[..r - 1].iter().map(|&p| ds[p]).collect();
        let mut ishape = lead.clone();
        ishape.extend([k, 1]);
        let i = self.reshape(h, i, &ishape)?;
        let mut dshape = lead.clone();
        dshape.extend([1, c]);
        let d = self.reshape(h, d, &dshape)?;
        let itype = self.f.ty(idx).dtype;
        let n = self.checked_count(h, &[c])?;
        let mut cshape = vec![1usize; r];
        cshape.push(n);
        let classes = Tensor::from_i64(itype, cshape, (0..n as i64).collect());
        let classes = self.constant(h, classes)?;
        let hit = self.push(h, OpKind::Equal, vec![i, classes], Attrs::new())?;
        let dtype = self.f.ty(data).dtype;
        let zero = self.constant(h, Tensor::scalar_f64(dtype, 0.0))?;
        let picked = self.push(h, OpKind::Where, vec![hit, d, zero], Attrs::new())?;
        let attrs = Attrs::new()
            .with("axes", Attr::Ints(vec![r as i64]))
            .with("keepdims", Attr::Int(0));
        let summed = self.push(h, OpKind::ReduceSum, vec![picked], attrs)?;
        let mut inv = vec![0usize; r];
        for (j, &p) in perm.iter().enumerate() {
            inv[p] = j;
        }
        self.transpose(h, summed, &inv)
    }

    /// A `dense<..>` literal of type `ty`.
    fn dense(&self, h: &Here, raw: &str, ty: &TType) -> R<Tensor> {
        let tt = self.tensor_type(ty, h.pos, &h.op)?;
        let dtype = tt.dtype;
        let n = self.checked_count(h, &ty.dims)?;
        let dims: Vec<usize> = ty.dims.iter().map(|&d| d as usize).collect();
        let raw = raw.trim();
        let mut vals: Vec<f64> = vec![];
        let mut ints: Vec<i64> = vec![];
        if let Some(hex) = raw.strip_prefix("\"0x").and_then(|r| r.strip_suffix('"')) {
            let bytes: Option<Vec<u8>> = (0..hex.len() / 2)
                .map(|i| {
                    hex.get(2 * i..2 * i + 2)
                        .and_then(|b| u8::from_str_radix(b, 16).ok())
                })
                .collect();
            let Some(bytes) = bytes.filter(|_| hex.len() % 2 == 0) else {
                return h.invalid("bad hexadecimal constant");
            };
            let size = match dtype {
                DType::Bool | DType::I8 => 1,
                DType::F16 | DType::BF16 => 2,
                DType::F32 | DType::I32 => 4,
                DType::F64 | DType::I64 => 8,
            };
            if bytes.len() != size && bytes.len() != size * n {
                return h.invalid(format!(
                    "the hexadecimal constant has {} bytes for {n} elements",
                    bytes.len()
                ));
            }
            for c in bytes.chunks(size) {
                let mut b8 = [0u8; 8];
                b8[..size].copy_from_slice(c);
                let u = u64::from_le_bytes(b8);
                if dtype.is_float() {
                    vals.push(bits_to_f64(dtype, u));
                } else {
                    ints.push(match dtype {
                        DType::I8 => u as u8 as i8 as i64,
                        DType::I32 => u as u32 as i32 as i64,
                        DType::Bool => (u != 0) as i64,
                        _ => u as i64,
                    });
                }
            }
        } else {
            for tok in raw.split(|c: char| c == ',' || c == '[' || c == ']' || c.is_whitespace()) {
                if tok.is_empty() {
                    continue;
                }
                let lit = match tok {
                    "true" => Some(1.0),
                    "false" => Some(0.0),
                    t if t.starts_with("0x") || t.starts_with("0X") => {
                        u64::from_str_radix(&t[2..], 16).ok().map(|u| {
                            if dtype.is_float() {
                                bits_to_f64(dtype, u)
                            } else {
                                u as f64
                            }
                        })
                    }
                    t => t.parse::<f64>().ok(),
                };
                let Some(v) = lit else {
                    return h.invalid(format!("bad constant element `{tok}`"));
                };
                if dtype.is_float() {
                    vals.push(v);
                } else {
                    // Integers exactly (an f64 parse would round large ones).
                    ints.push(match tok {
                        "true" => 1,
                        "false" => 0,
                        t => t.parse::<i64>().unwrap_or(v as i64),
                    });
                }
            }
        }
        let len = if dtype.is_float() {
            vals.len()
        } else {
            ints.len()
        };
        if len != 1 && len != n {
            return h.invalid(format!("the constant has {len} elements, its type {n}"));
        }
        Ok(if dtype.is_float() {
            if len == 1 && n != 1 {
                vals = vec![vals[0]; n];
            }
            Tensor::from_f64(dtype, dims, vals)
        } else {
            if len == 1 && n != 1 {
                ints = vec![ints[0]; n];
            }
            Tensor::from_i64(dtype, dims, ints)
        })
    }
}

/// A gather's dimension numbers (without batching dims).
struct GatherDims {
    offset: Vec<i64>,
    collapsed: Vec<i64>,
    start_index_map: Vec<i64>,
    ivd: usize,
}

/// The permutations that take a convolution's operands from the layout `dn`
/// (`[b,0,1,f]x[0,1,i,o]->[b,0,1,f]`, spaces removed) to NCHW/OIHW (`perm[k]` = the
/// layout's dim that becomes dim `k`), and where the result's NCHW dims go (`out[k]` =
/// the layout position of NCHW dim `k`).
fn conv_layouts(dn: &str, sp: usize) -> Option<(Vec<usize>, Vec<usize>, Vec<usize>)> {
    let (l, rest) = dn.split_once('x')?;
    let (r, o) = rest.split_once("->")?;
    let parse = |s: &str, a: &str, b: &str| -> Option<Vec<usize>> {
        let toks: Vec<&str> = s.strip_prefix('[')?.strip_suffix(']')?.split(',').collect();
        if toks.len() != sp + 2 {
            return None;
        }
        let mut want = vec![a.to_string(), b.to_string()];
        want.extend((0..sp).map(|i| i.to_string()));
        let perm: Option<Vec<usize>> = want
            .iter()
            .map(|w| toks.iter().position(|t| t == w))
            .collect();
        perm
    };
    Some((
        parse(l, "b", "f")?,
        parse(r, "o", "i")?,
        parse(o, "b", "f")?,
    ))
}

/// Whether a reduce body over (value, index) pairs, block arguments `(v_a, i_a, v_b, i_b)`,
/// picks the larger value (`ReduceMax`) or the smaller (`ReduceMin`), the smaller index on
/// ties: the body is evaluated on probes.
fn arg_body_kind(block: &Block) -> Option<OpKind> {
    if block.args.len() != 4 {
        return None;
    }
    let probes = [(1.0, 2.0), (2.0, 1.0), (1.0, 1.0), (-3.0, 5.0)];
    let mut max_ok = true;
    let mut min_ok = true;
    for (va, vb) in probes {
        for (ia, ib) in [(0.0, 1.0), (1.0, 0.0), (2.0, 7.0)] {
            let (v, i) = eval_scalar_body(block, &[va, ia, vb, ib])?;
            let pick = |a_wins: bool| if a_wins { (va, ia) } else { (vb, ib) };
            let tie = va == vb;
            let want_max = pick(if tie { ia < ib } else { va > vb });
            let want_min = pick(if tie { ia < ib } else { va < vb });
            max_ok &= (v, i) == want_max;
            min_ok &= (v, i) == want_min;
        }
    }
    match (max_ok, min_ok) {
        (true, false) => Some(OpKind::ReduceMax),
        (false, true) => Some(OpKind::ReduceMin),
        _ => None,
    }
}

/// Run a reduce body of scalar compares, logic, selects, max/min and constants on `args`
/// (booleans as 0/1); `None` for anything else.
fn eval_scalar_body(block: &Block, args: &[f64]) -> Option<(f64, f64)> {
    let mut env: HashMap<String, f64> = HashMap::new();
    for ((n, _), &v) in block.args.iter().zip(args) {
        env.insert(n.clone(), v);
    }
    for op in &block.ops {
        let mut op = op.clone();
        normalize(&mut op);
        let xs: Vec<f64> = op
            .operands
            .iter()
            .map(|o| env.get(o).copied())
            .collect::<Option<_>>()?;
        let b = |c: bool| if c { 1.0 } else { 0.0 };
        let v = match (op.name.as_str(), xs.as_slice()) {
            ("stablehlo.return" | "func.return", [v, i]) => return Some((*v, *i)),
            ("stablehlo.compare", [a, c]) => match op.attr("comparison_direction") {
                Some(AVal::Word(w)) => match w.as_str() {
                    "EQ" => b(a == c),
                    "NE" => b(a != c),
                    "LT" => b(a < c),
                    "LE" => b(a <= c),
                    "GT" => b(a > c),
                    "GE" => b(a >= c),
                    _ => return None,
                },
                _ => return None,
            },
            ("stablehlo.and", [a, c]) => b(*a != 0.0 && *c != 0.0),
            ("stablehlo.or", [a, c]) => b(*a != 0.0 || *c != 0.0),
            ("stablehlo.not", [a]) => b(*a == 0.0),
            ("stablehlo.select", [p, a, c]) => {
                if *p != 0.0 {
                    *a
                } else {
                    *c
                }
            }
            ("stablehlo.maximum", [a, c]) => a.max(*c),
            ("stablehlo.minimum", [a, c]) => a.min(*c),
            _ => return None,
        };
        let [r] = op.results.as_slice() else {
            return None;
        };
        env.insert(r.clone(), v);
    }
    None
}

fn bits_to_f64(dtype: DType, u: u64) -> f64 {
    match dtype {
        DType::F32 => f32::from_bits(u as u32) as f64,
        DType::F64 => f64::from_bits(u),
        DType::F16 => half::f16::from_bits(u as u16).to_f64(),
        DType::BF16 => half::bf16::from_bits(u as u16).to_f64(),
        _ => u as f64,
    }
}

fn convert_tensor(t: &Tensor, to: DType) -> Option<Tensor> {
    let shape = t.shape.clone();
    Some(if to.is_float() {
        Tensor::from_f64(to, shape, t.to_f64_vec())
    } else if t.dtype.is_float() {
        let v: Vec<i64> = t.to_f64_vec().iter().map(|&x| x.trunc() as i64).collect();
        Tensor::from_i64(to, shape, v)
    } else {
        Tensor::from_i64(to, shape, t.to_i64_vec())
    })
}
