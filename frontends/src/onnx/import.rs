//! Graph import: ONNX values become IR values, constants or import-time shape vectors.
//!
//! Every ONNX value name maps to a [`Val`]. Values known at import time (non-float
//! initializers, `Constant` nodes, `Shape` of a static tensor and everything computed from
//! them) stay [`Val::Const`] and are folded through [`Importer::op`] with the reference
//! interpreter, so `Reshape`/`Expand`/`Slice`/`Tile`/`Pad` targets become static attributes.
//! They become `constant` ops only where a run-time op consumes them. `ConstantOfShape`
//! results stay a [`Val::Splat`] (one element and a shape) and become `constant` + `expand`,
//! so a 100-million-element filler never sits in the IR.
//!
//! The symbolic batch size is tracked through shape arithmetic by evaluating every
//! shape computation twice, with two different stand-in sizes ([`Val::Sym`]): an element
//! that equals the stand-in in both runs *is* the batch size (a reshape's `-1`), one that is
//! the same in both runs does not depend on it, and anything else needs `--batch`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::rc::Rc;

use ppir::interp::{eval_op, InterpOptions};
use ppir::ops::attrs::{ConstantAttrs, ShapeAttrs};
use ppir::ops::OpAttrs;
use ppir::{
    ArgKind, Attrs, DType, Dim, Function, Module, NewOp, OpKind, Tensor, TensorData, TensorType,
    ValueId,
};

use super::attrs::NodeAttrError;
use super::error::OnnxError;
use super::lower::{maps_other_domain, refused_version, MAX_OPSET, MIN_OPSET, SUPPORTED_OPS};
use super::proto::{
    DimensionValue, GraphProto, ModelProto, SparseTensorProto, TypeProto, TypeTensor, TypeValue,
    ValueInfoProto,
};
use super::tensor::{dtype_from_onnx, element_count, tensor_from_proto, TensorDataError};
use super::ImportOptions;

/// The two stand-in values of the symbolic batch size in import-time shape arithmetic.
/// Odd primes well above any real dimension, and different, so that `Sym` can tell
/// batch-dependent elements apart.
pub(super) const BATCH_A: i64 = 1_000_003;
pub(super) const BATCH_B: i64 = 1_000_033;

/// Results larger than this are not folded at import time (they are computed at run time
/// instead, so the IR does not carry huge dense constants).
pub(super) const FOLD_MAX_ELEMENTS: usize = 1 << 16;

/// The largest constant built at import time from a smaller description (a splat used as a
/// static input, a sparse initializer): larger ones would let a tiny file allocate gigabytes.
pub(super) const MATERIALIZE_MAX_ELEMENTS: usize = 1 << 24;

/// Element count of a static type, `None` if symbolic or overflowing (types come from
/// the model and may be absurd).
pub(super) fn static_elements(t: &TensorType) -> Option<usize> {
    t.dims.iter().try_fold(1usize, |n, d| {
        d.known()
            .and_then(|d| usize::try_from(d).ok())
            .and_then(|d| n.checked_mul(d))
    })
}

/// What an ONNX value name stands for during import.
#[derive(Clone, Debug)]
pub(super) enum Val {
    /// Computed at run time.
    Ir(ValueId),
    /// Known at import time.
    Const(Rc<Tensor>),
    /// Known at import time: every element is `value` (a one-element tensor).
    Splat {
        value: Rc<Tensor>,
        shape: Vec<usize>,
    },
    /// A float initializer: a trainable parameter (its value is known for static inputs).
    Param(usize),
    /// A shape computation that involves the symbolic batch size, evaluated with the batch
    /// size as [`BATCH_A`] and as [`BATCH_B`].
    Sym { a: Rc<Tensor>, b: Rc<Tensor> },
    /// A sequence, unrolled at import time.
    Seq(Vec<Val>),
    /// A value that exists but cannot be used; the string says why.
    Opaque(String),
}

impl Val {
    pub(super) fn konst(t: Tensor) -> Val {
        Val::Const(Rc::new(t))
    }

    /// Known at import time and foldable (parameters are not folded: they are trained).
    pub(super) fn is_foldable(&self) -> bool {
        matches!(self, Val::Const(_) | Val::Splat { .. } | Val::Sym { .. })
    }
}

/// An integer of an import-time shape vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SymInt {
    Known(i64),
    Batch,
}

/// Why a node could not be lowered; the caller adds the node's name, type and opset.
#[derive(Debug)]
pub(super) enum Fail {
    Invalid(String),
    Unsupported(String),
    /// Unsupported unless the value of this graph input is given at import time.
    NeedsValue {
        input: String,
        message: String,
    },
    /// An attribute of the node cannot be read.
    Attr(NodeAttrError),
    Onnx(OnnxError),
}

pub(super) type R<T> = Result<T, Fail>;

impl From<OnnxError> for Fail {
    fn from(e: OnnxError) -> Self {
        Fail::Onnx(e)
    }
}

impl From<NodeAttrError> for Fail {
    fn from(e: NodeAttrError) -> Self {
        Fail::Attr(e)
    }
}

impl From<TensorDataError> for Fail {
    fn from(e: TensorDataError) -> Self {
        Fail::Invalid(e.to_string())
    }
}

macro_rules! invalid {
    ($($arg:tt)*) => { return Err($crate::onnx::import::Fail::Invalid(format!($($arg)*))) };
}
macro_rules! unsupported {
    ($($arg:tt)*) => { return Err($crate::onnx::import::Fail::Unsupported(format!($($arg)*))) };
}
pub(super) use {invalid, unsupported};

pub(super) struct ParamSlot {
    pub onnx_name: String,
    pub tensor: Rc<Tensor>,
    /// The argument, once some op uses the parameter.
    pub arg: Option<(usize, ValueId)>,
}

/// The result of an import: the module and how its inputs and outputs map back to ONNX.
#[derive(Clone, Debug)]
pub struct Imported {
    pub module: Module,
    /// ONNX names of the function's `Input` arguments, in argument order (the IR names may
    /// differ: they are sanitised to `[A-Za-z0-9_.$/-]` and made unique).
    pub inputs: Vec<String>,
    /// ONNX names of the graph outputs, in the order of the function's results.
    pub outputs: Vec<String>,
    /// IR weight name → the ONNX initializer it came from (IR names are sanitised and made
    /// unique, so the two can differ); what `--save-onnx` uses to write weights back.
    pub weight_sources: BTreeMap<String, String>,
    /// The model's opset of the default domain.
    pub opset: i64,
}

pub(super) struct Importer<'a> {
    pub opts: &'a ImportOptions,
    pub opset: i64,
    pub model_dir: Option<&'a Path>,
    pub f: Function,
    weights: BTreeMap<String, Tensor>,
    vals: HashMap<String, Val>,
    /// Outputs a node declares but ppcc does not produce, with the reason.
    unavailable: HashMap<String, String>,
    pub params: Vec<ParamSlot>,
    graph_inputs: HashSet<String>,
    used_names: HashSet<String>,
    const_cache: HashMap<(usize, Option<Vec<usize>>), ValueId>,
    /// Keeps the tensors behind `const_cache` keys alive.
    const_keep: Vec<Rc<Tensor>>,
    /// Where import-time constants came from (by tensor address): the defining node's
    /// location and ONNX value name, used when a constant is materialised as an op.
    origins: HashMap<usize, (String, String, Rc<Tensor>)>,
    /// The node being lowered: its location and the prefix of helper value names.
    pub loc: String,
    name_prefix: String,
    temp_counter: usize,
    node_values: Vec<ValueId>,
    interp: InterpOptions,
    /// How many subgraphs (`If` branches, `Loop`/`Scan` bodies) enclose the node being
    /// lowered; bounded so that a file of nested subgraphs cannot overflow the stack.
    subgraph_depth: usize,
}

/// The deepest nesting of subgraphs ppcc lowers.
const MAX_SUBGRAPH_DEPTH: usize = 32;

/// Characters allowed in a bare IR name.
fn sanitize(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '$' | '/' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() {
        "v".to_string()
    } else {
        s
    }
}

impl<'a> Importer<'a> {
    fn new(opts: &'a ImportOptions, opset: i64, model_dir: Option<&'a Path>) -> Self {
        Importer {
            opts,
            opset,
            model_dir,
            f: Function::new("main"),
            weights: BTreeMap::new(),
            vals: HashMap::new(),
            unavailable: HashMap::new(),
            params: vec![],
            graph_inputs: HashSet::new(),
            used_names: HashSet::new(),
            const_cache: HashMap::new(),
            const_keep: vec![],
            origins: HashMap::new(),
            loc: String::new(),
            name_prefix: String::new(),
            temp_counter: 0,
            node_values: vec![],
            interp: InterpOptions::default(),
            subgraph_depth: 0,
        }
    }

    /// A fresh IR name based on `raw`.
    pub fn unique_name(&mut self, raw: &str) -> String {
        let base = sanitize(raw);
        let mut name = base.clone();
        let mut k = 1;
        while self.used_names.contains(&name) {
            name = format!("{base}_{k}");
            k += 1;
        }
        self.used_names.insert(name.clone());
        name
    }

    fn temp_name(&mut self) -> String {
        self.temp_counter += 1;
        let raw = format!("{}.{}", self.name_prefix, self.temp_counter);
        self.unique_name(&raw)
    }

    // ---- reading values ----

    /// The value of ONNX name `name`.
    pub fn lookup(&self, name: &str) -> R<Val> {
        if let Some(v) = self.vals.get(name) {
            return Ok(v.clone());
        }
        if let Some(why) = self.unavailable.get(name) {
            unsupported!("uses `{name}`, which is not available: {why}");
        }
        invalid!("uses `{name}`, which no earlier node, graph input or initializer defines")
    }

    /// Whether `name` is a graph input (computed at run time).
    pub fn is_graph_input(&self, name: &str) -> bool {
        self.graph_inputs.contains(name)
    }

    /// The type of a tensor value.
    pub fn ty(&self, v: &Val) -> R<TensorType> {
        Ok(match v {
            Val::Ir(id) => self.f.ty(*id).clone(),
            Val::Const(t) => t.tensor_type(),
            Val::Splat { value, shape } => TensorType::of(
                value.dtype,
                &shape.iter().map(|&d| d as u64).collect::<Vec<_>>(),
            ),
            Val::Param(i) => self.params[*i].tensor.tensor_type(),
            Val::Sym { a, .. } => a.tensor_type(),
            Val::Seq(_) => unsupported!("a sequence is used where a tensor is expected"),
            Val::Opaque(why) => unsupported!("{why}"),
        })
    }

    /// The value of `v` if it is known at import time (constants, parameters' initial
    /// values, batch-free shape computations). `Ok(None)`: computed at run time.
    pub fn static_tensor(&self, v: &Val) -> R<Option<Rc<Tensor>>> {
        Ok(match v {
            Val::Const(t) => Some(t.clone()),
            Val::Param(i) => Some(self.params[*i].tensor.clone()),
            Val::Splat { value, shape } => Some(Rc::new(splat_tensor(value, shape)?)),
            Val::Sym { a, b } => {
                if a == b {
                    Some(a.clone())
                } else {
                    unsupported!("{}", BATCH_NEEDED)
                }
            }
            Val::Ir(_) => None,
            Val::Seq(_) => unsupported!("a sequence is used where a tensor is expected"),
            Val::Opaque(why) => unsupported!("{why}"),
        })
    }

    /// The integers of a static shape-like value, where an element may be the batch size.
    pub fn sym_ints(&self, v: &Val) -> R<Option<Vec<SymInt>>> {
        if let Val::Sym { a, b } = v {
            let (a, b) = (a.to_i64_vec(), b.to_i64_vec());
            return a
                .iter()
                .zip(&b)
                .map(|(&x, &y)| match (x, y) {
                    _ if x == y => Ok(SymInt::Known(x)),
                    (BATCH_A, BATCH_B) => Ok(SymInt::Batch),
                    _ => unsupported!("{}", BATCH_NEEDED),
                })
                .collect::<R<Vec<_>>>()
                .map(Some);
        }
        Ok(self
            .static_tensor(v)?
            .map(|t| t.to_i64_vec().into_iter().map(SymInt::Known).collect()))
    }

    // ---- making IR values ----

    /// An IR value for `v`, materialising constants and creating parameter arguments.
    pub fn ir(&mut self, v: &Val) -> R<ValueId> {
        self.ir_as(v, ArgKind::Param)
    }

    /// Like [`Importer::ir`]; a parameter first used here gets argument kind `kind`
    /// (`State` for batch-norm statistics). A later use as anything else makes it `Param`.
    pub fn ir_as(&mut self, v: &Val, kind: ArgKind) -> R<ValueId> {
        match v {
            Val::Ir(id) => Ok(*id),
            Val::Param(i) => {
                let slot = &self.params[*i];
                if let Some((index, id)) = slot.arg {
                    if kind == ArgKind::Param && self.f.args()[index].1 != ArgKind::Param {
                        self.f.set_arg_kind(index, ArgKind::Param);
                    }
                    return Ok(id);
                }
                let onnx_name = slot.onnx_name.clone();
                let tensor = slot.tensor.clone();
                let name = self.unique_name(&onnx_name);
                let index = self.f.args().len();
                let id = self.f.add_arg(name.clone(), tensor.tensor_type(), kind);
                self.weights.insert(name, (*tensor).clone());
                self.params[*i].arg = Some((index, id));
                Ok(id)
            }
            Val::Const(t) => {
                let key = (Rc::as_ptr(t) as usize, None);
                if let Some(&id) = self.const_cache.get(&key) {
                    return Ok(id);
                }
                let origin = self
                    .origins
                    .get(&key.0)
                    .map(|(l, n, _)| (l.clone(), n.clone()));
                let id =
                    self.with_origin(origin, |this, name| this.constant_op((**t).clone(), name))?;
                self.const_keep.push(t.clone());
                self.const_cache.insert(key, id);
                Ok(id)
            }
            Val::Splat { value, shape } => {
                let key = (Rc::as_ptr(value) as usize, Some(shape.clone()));
                if let Some(&id) = self.const_cache.get(&key) {
                    return Ok(id);
                }
                let origin = self
                    .origins
                    .get(&key.0)
                    .map(|(l, n, _)| (l.clone(), n.clone()));
                let scalar = Tensor {
                    dtype: value.dtype,
                    shape: vec![],
                    data: value.data.clone(),
                };
                let id = self.with_origin(origin, |this, name| {
                    if shape.is_empty() {
                        return this.constant_op(scalar, name);
                    }
                    let c =
                        this.constant_op(scalar, name.as_ref().map(|n| format!("{n}.value")))?;
                    let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
                    let attrs = ShapeAttrs { shape: dims }.to_attrs();
                    Ok(
                        this.push_ir_named(OpKind::Expand, attrs, vec![c], name.map(|n| vec![n]))?
                            [0],
                    )
                })?;
                self.const_keep.push(value.clone());
                self.const_cache.insert(key, id);
                Ok(id)
            }
            Val::Sym { a, b } if a == b => self.ir(&Val::Const(a.clone())),
            Val::Sym { .. } => unsupported!("{}", BATCH_NEEDED),
            Val::Seq(_) => unsupported!("a sequence is used where a tensor is expected"),
            Val::Opaque(why) => unsupported!("{why}"),
        }
    }

    /// Run `make` with the location and value name of a constant's origin (the node that
    /// defined it), so a constant materialised later still points at its source.
    fn with_origin<T>(
        &mut self,
        origin: Option<(String, String)>,
        make: impl FnOnce(&mut Self, Option<String>) -> R<T>,
    ) -> R<T> {
        let Some((loc, onnx_name)) = origin else {
            return make(self, None);
        };
        let saved = std::mem::replace(&mut self.loc, loc);
        let name = self.unique_name(&onnx_name);
        let r = make(self, Some(name));
        self.loc = saved;
        r
    }

    fn constant_op(&mut self, t: Tensor, name: Option<String>) -> R<ValueId> {
        let attrs = ConstantAttrs { value: t }.to_attrs();
        Ok(self.push_ir_named(OpKind::Constant, attrs, vec![], name.map(|n| vec![n]))?[0])
    }

    /// Append an IR op (no folding) and return its results.
    pub fn push_ir(
        &mut self,
        kind: OpKind,
        attrs: Attrs,
        operands: Vec<ValueId>,
    ) -> R<Vec<ValueId>> {
        self.push_ir_named(kind, attrs, operands, None)
    }

    /// [`Importer::push_ir`] with given result names (else fresh helper names, renamed
    /// after the ONNX output if the value ends up as one).
    fn push_ir_named(
        &mut self,
        kind: OpKind,
        attrs: Attrs,
        operands: Vec<ValueId>,
        names: Option<Vec<String>>,
    ) -> R<Vec<ValueId>> {
        let types: Vec<TensorType> = operands.iter().map(|&v| self.f.ty(v).clone()).collect();
        let result_types = ppir::shape::infer(kind, &attrs, &types)
            .map_err(|e| Fail::Invalid(format!("{kind}: {e}")))?;
        let named = names.is_some();
        let names = match names {
            Some(n) => n,
            None => (0..result_types.len()).map(|_| self.temp_name()).collect(),
        };
        let op = NewOp::new(kind, operands, result_types)
            .attrs(attrs)
            .names(names)
            .loc(self.loc.clone());
        let id = self.f.push_op(op);
        let results = self.f.op(id).results().to_vec();
        if !named {
            self.node_values.extend(&results);
        }
        Ok(results)
    }

    /// An op with one result, folded at import time when its operands are known.
    pub fn op(&mut self, kind: OpKind, attrs: Attrs, operands: &[Val]) -> R<Val> {
        Ok(self.op_n(kind, attrs, operands, 1)?.remove(0))
    }

    /// An op with `n` results (`split`, `dropout` with its mask), folded when possible.
    pub fn op_n(&mut self, kind: OpKind, attrs: Attrs, operands: &[Val], n: usize) -> R<Vec<Val>> {
        let types = operands.iter().map(|v| self.ty(v)).collect::<R<Vec<_>>>()?;
        let result_types = ppir::shape::infer(kind, &attrs, &types)
            .map_err(|e| Fail::Invalid(format!("{kind}: {e}")))?;
        if result_types.len() < n {
            invalid!("{kind} gives {} results, {n} needed", result_types.len());
        }
        // Folding materialises splat operands; a huge one is left to run time instead.
        let splat_too_big = operands.iter().any(|v| match v {
            Val::Splat { shape, .. } => shape
                .iter()
                .try_fold(1usize, |n, &d| n.checked_mul(d))
                .is_none_or(|n| n > MATERIALIZE_MAX_ELEMENTS),
            _ => false,
        });
        if operands.iter().all(Val::is_foldable) && kind != OpKind::Dropout {
            if let Some(v) = self.fold_splat(kind, &attrs, operands, &result_types)? {
                return Ok(v);
            }
            let small = result_types
                .iter()
                .all(|t| static_elements(t).is_some_and(|n| n <= FOLD_MAX_ELEMENTS));
            if small && !splat_too_big {
                return self.fold(kind, &attrs, operands, &result_types);
            }
            if operands
                .iter()
                .any(|v| matches!(v, Val::Sym { a, b } if a != b))
            {
                unsupported!("{}", BATCH_NEEDED);
            }
        }
        let ids = operands.iter().map(|v| self.ir(v)).collect::<R<Vec<_>>>()?;
        Ok(self
            .push_ir(kind, attrs, ids)?
            .into_iter()
            .map(Val::Ir)
            .collect())
    }

    fn eval(
        &self,
        kind: OpKind,
        attrs: &Attrs,
        inputs: &[&Tensor],
        result_types: &[TensorType],
    ) -> R<Vec<Tensor>> {
        eval_op(kind, attrs, inputs, result_types, &self.interp)
            .map_err(|e| Fail::Invalid(format!("evaluating at import time: {e}")))
    }

    /// Evaluate an op on known operands. With batch-dependent operands, evaluate twice.
    fn fold(
        &mut self,
        kind: OpKind,
        attrs: &Attrs,
        operands: &[Val],
        result_types: &[TensorType],
    ) -> R<Vec<Val>> {
        let mut side_a = Vec::with_capacity(operands.len());
        let mut side_b = Vec::with_capacity(operands.len());
        let mut symbolic = false;
        for v in operands {
            match v {
                Val::Sym { a, b } => {
                    symbolic |= a != b;
                    side_a.push(a.clone());
                    side_b.push(b.clone());
                }
                _ => {
                    let t = self.static_tensor(v)?.expect("foldable values are static");
                    side_a.push(t.clone());
                    side_b.push(t);
                }
            }
        }
        let refs_a: Vec<&Tensor> = side_a.iter().map(|t| &**t).collect();
        let outs_a = self.eval(kind, attrs, &refs_a, result_types)?;
        if !symbolic {
            return Ok(outs_a.into_iter().map(Val::konst).collect());
        }
        // Result shapes may differ between the two runs; re-infer them for the second one.
        let types_b: Vec<TensorType> = side_b.iter().map(|t| t.tensor_type()).collect();
        let result_types_b =
            ppir::shape::infer(kind, attrs, &types_b).map_err(|e| Fail::Invalid(e.to_string()))?;
        let refs_b: Vec<&Tensor> = side_b.iter().map(|t| &**t).collect();
        let outs_b = self.eval(kind, attrs, &refs_b, &result_types_b)?;
        outs_a
            .into_iter()
            .zip(outs_b)
            .map(|(a, b)| {
                if a.shape != b.shape {
                    unsupported!("{}", BATCH_NEEDED);
                }
                Ok(if a == b {
                    Val::konst(a)
                } else {
                    Val::Sym {
                        a: Rc::new(a),
                        b: Rc::new(b),
                    }
                })
            })
            .collect()
    }

    /// Fold ops on splats without materialising them: elementwise ops on one-element
    /// operands, and data movement of a splat (which only changes its shape).
    fn fold_splat(
        &mut self,
        kind: OpKind,
        attrs: &Attrs,
        operands: &[Val],
        result_types: &[TensorType],
    ) -> R<Option<Vec<Val>>> {
        if !operands.iter().any(|v| matches!(v, Val::Splat { .. })) || result_types.len() != 1 {
            return Ok(None);
        }
        let Some(out_shape) = result_types[0].static_shape() else {
            return Ok(None);
        };
        let out_shape: Vec<usize> = out_shape.iter().map(|&d| d as usize).collect();
        let scalar_of = |v: &Val| -> Option<Rc<Tensor>> {
            match v {
                Val::Splat { value, .. } => Some(value.clone()),
                Val::Const(t) if t.num_elements() == 1 => Some(t.clone()),
                _ => None,
            }
        };
        use ppir::ops::OpClass;
        let value = if kind.is_elementwise() {
            let Some(scalars) = operands.iter().map(scalar_of).collect::<Option<Vec<_>>>() else {
                return Ok(None);
            };
            let scalars: Vec<Tensor> = scalars
                .iter()
                .map(|t| Tensor {
                    dtype: t.dtype,
                    shape: vec![],
                    data: t.data.clone(),
                })
                .collect();
            let types: Vec<TensorType> = scalars.iter().map(|t| t.tensor_type()).collect();
            let rt = ppir::shape::infer(kind, attrs, &types)
                .map_err(|e| Fail::Invalid(e.to_string()))?;
            let refs: Vec<&Tensor> = scalars.iter().collect();
            self.eval(kind, attrs, &refs, &rt)?.remove(0)
        } else if kind.class() == OpClass::DataMovement && kind != OpKind::Pad {
            let Some(first) = scalar_of(&operands[0]) else {
                return Ok(None);
            };
            if kind == OpKind::Concat
                && !operands
                    .iter()
                    .all(|v| scalar_of(v).is_some_and(|s| s.data == first.data))
            {
                return Ok(None);
            }
            Tensor {
                dtype: first.dtype,
                shape: vec![],
                data: first.data.clone(),
            }
        } else {
            return Ok(None);
        };
        if value.dtype != result_types[0].dtype {
            return Ok(None);
        }
        Ok(Some(vec![Val::Splat {
            value: Rc::new(value),
            shape: out_shape,
        }]))
    }

    /// Record a node's result under its ONNX name; the IR value it names is renamed after
    /// the ONNX output when this node created it.
    fn define(&mut self, onnx_name: &str, v: Val) {
        let known = match &v {
            Val::Const(t) => Some(t.clone()),
            Val::Splat { value, .. } => Some(value.clone()),
            _ => None,
        };
        if let Some(t) = known {
            let loc = self.loc.clone();
            self.origins
                .entry(Rc::as_ptr(&t) as usize)
                .or_insert_with(|| (loc, onnx_name.to_string(), t));
        }
        if let Val::Ir(id) = v {
            if self.node_values.contains(&id) {
                let name = self.unique_name(onnx_name);
                self.f.rename_value(id, name);
                self.node_values.retain(|&x| x != id);
            }
        }
        self.vals.insert(onnx_name.to_string(), v);
    }

    // ---- the graph ----

    fn add_initializer(&mut self, name: &str, t: Tensor) {
        if t.dtype.is_float() {
            let idx = self.params.len();
            self.params.push(ParamSlot {
                onnx_name: name.to_string(),
                tensor: Rc::new(t),
                arg: None,
            });
            self.vals.insert(name.to_string(), Val::Param(idx));
        } else {
            self.loc = name.to_string();
            self.define(name, Val::konst(t));
        }
    }

    fn input_type(&self, vi: &ValueInfoProto) -> Result<TensorType, OnnxError> {
        let name = &vi.name;
        let unsupported_value = |message: String| OnnxError::UnsupportedValue {
            what: "graph input",
            name: name.clone(),
            message,
        };
        let Some(TypeProto {
            value: Some(value), ..
        }) = &vi.r#type
        else {
            return Err(OnnxError::InputShape {
                input: name.clone(),
                message: "has no type".into(),
            });
        };
        let TypeValue::TensorType(tt) = value else {
            return Err(unsupported_value(format!(
                "{} values are unsupported; ppcc imports tensors only",
                type_kind(value)
            )));
        };
        let dtype = dtype_from_onnx(tt.elem_type).ok_or_else(|| {
            unsupported_value(format!(
                "element type {} is unsupported",
                super::proto::data_type::name(tt.elem_type)
            ))
        })?;
        let given = self.opts.input_shapes.get(name);
        let Some(shape) = &tt.shape else {
            return match given {
                Some(dims) => sized(name, TensorType::of(dtype, dims)),
                None => Err(OnnxError::InputShape {
                    input: name.clone(),
                    message: format!("its shape is not declared; give it with --input-shape {name}=DIMS (e.g. 1x3x224x224)"),
                }),
            };
        };
        if let Some(dims) = given {
            if dims.len() != shape.dim.len() {
                return Err(OnnxError::InputShape {
                    input: name.clone(),
                    message: format!(
                        "--input-shape gives {} dimensions, the model declares {}",
                        dims.len(),
                        shape.dim.len()
                    ),
                });
            }
            for (k, (d, &g)) in shape.dim.iter().zip(dims).enumerate() {
                if let Some(DimensionValue::DimValue(v)) = d.value {
                    if v >= 0 && v as u64 != g {
                        return Err(OnnxError::InputShape {
                            input: name.clone(),
                            message: format!(
                                "--input-shape gives {g} for dimension {k}, the model declares {v}"
                            ),
                        });
                    }
                }
            }
            return sized(name, TensorType::of(dtype, dims));
        }
        let mut dims = Vec::with_capacity(shape.dim.len());
        for (k, d) in shape.dim.iter().enumerate() {
            match &d.value {
                Some(DimensionValue::DimValue(v)) if *v >= 0 => dims.push(Dim::Known(*v as u64)),
                other => {
                    if k == 0 {
                        dims.push(self.opts.batch.map_or(Dim::Batch, Dim::Known));
                    } else {
                        let what = match other {
                            Some(DimensionValue::DimParam(p)) => format!("symbolic ({p:?})"),
                            Some(DimensionValue::DimValue(v)) => format!("{v}"),
                            None => "unknown".to_string(),
                        };
                        let example: Vec<String> = shape
                            .dim
                            .iter()
                            .enumerate()
                            .map(|(i, d)| match d.value {
                                Some(DimensionValue::DimValue(v)) if v >= 0 => v.to_string(),
                                _ if i == 0 => self.opts.batch.unwrap_or(1).to_string(),
                                _ => "N".to_string(),
                            })
                            .collect();
                        return Err(OnnxError::InputShape {
                            input: name.clone(),
                            message: format!(
                                "dimension {k} is {what}; only the first (batch) dimension may stay symbolic. Give the whole shape with --input-shape {name}={}",
                                example.join("x")
                            ),
                        });
                    }
                }
            }
        }
        sized(name, TensorType::new(dtype, dims))
    }

    /// Check a node result against its `value_info` declaration: the element type, the
    /// rank and every dimension both sides know must agree (a symbolic batch dimension
    /// agrees with anything).
    fn check_declared(&self, name: &str, v: &Val, declared: &TypeTensor) -> R<()> {
        let Ok(ty) = self.ty(v) else { return Ok(()) };
        let mismatch = || {
            let dims: Vec<String> = declared
                .shape
                .iter()
                .flat_map(|s| &s.dim)
                .map(|d| match &d.value {
                    Some(DimensionValue::DimValue(v)) => v.to_string(),
                    Some(DimensionValue::DimParam(p)) => p.clone(),
                    None => "?".into(),
                })
                .collect();
            Fail::Invalid(format!(
                "value_info declares `{name}` as {} [{}], but it computes {ty}",
                super::proto::data_type::name(declared.elem_type),
                dims.join(", ")
            ))
        };
        if let Some(d) = dtype_from_onnx(declared.elem_type) {
            if d != ty.dtype {
                return Err(mismatch());
            }
        }
        if let Some(shape) = &declared.shape {
            if shape.dim.len() != ty.rank() {
                return Err(mismatch());
            }
            for (d, have) in shape.dim.iter().zip(&ty.dims) {
                if let (Some(DimensionValue::DimValue(v)), Dim::Known(n)) = (&d.value, have) {
                    if *v >= 0 && *v as u64 != *n {
                        return Err(mismatch());
                    }
                }
            }
        }
        Ok(())
    }

    /// Lower the nodes of a subgraph (an `If` branch, a `Loop` or `Scan` body) into the
    /// function being built, its formal inputs bound to `inputs`, and return its outputs.
    /// Names of the enclosing scopes stay visible; the subgraph's own names are forgotten
    /// afterwards, so a body can be lowered once per unrolled iteration. Its initializers
    /// are constants (a subgraph's tensors are not trained).
    pub(super) fn lower_subgraph(&mut self, g: &GraphProto, inputs: &[Val]) -> R<Vec<Val>> {
        if g.input.len() != inputs.len() {
            invalid!(
                "its subgraph `{}` declares {} inputs, {} are given",
                g.name,
                g.input.len(),
                inputs.len()
            );
        }
        if self.subgraph_depth >= MAX_SUBGRAPH_DEPTH {
            unsupported!("subgraphs nested deeper than {MAX_SUBGRAPH_DEPTH}");
        }
        let saved_vals = self.vals.clone();
        let saved_unavailable = self.unavailable.clone();
        let saved_loc = self.loc.clone();
        let saved_prefix = self.name_prefix.clone();
        let saved_counter = self.temp_counter;
        let saved_node_values = std::mem::take(&mut self.node_values);
        self.subgraph_depth += 1;
        let result = (|| -> R<Vec<Val>> {
            for init in &g.initializer {
                let t = tensor_from_proto(init, self.model_dir)?;
                self.vals.insert(init.name.clone(), Val::konst(t));
            }
            for (vi, v) in g.input.iter().zip(inputs) {
                self.vals.insert(vi.name.clone(), v.clone());
            }
            self.lower_all(g)?;
            g.output.iter().map(|o| self.lookup(&o.name)).collect()
        })();
        self.subgraph_depth -= 1;
        self.vals = saved_vals;
        self.unavailable = saved_unavailable;
        self.loc = saved_loc;
        self.name_prefix = saved_prefix;
        self.temp_counter = saved_counter;
        self.node_values = saved_node_values;
        result
    }

    fn lower_all(&mut self, graph: &GraphProto) -> Result<(), OnnxError> {
        let declared: HashMap<&str, &TypeTensor> = graph
            .value_info
            .iter()
            .filter_map(|vi| match &vi.r#type {
                Some(TypeProto {
                    value: Some(TypeValue::TensorType(tt)),
                    ..
                }) => Some((vi.name.as_str(), tt)),
                _ => None,
            })
            .collect();
        let order = topological_order(graph)?;
        for i in order {
            let node = &graph.node[i];
            self.loc = if node.name.is_empty() {
                format!("{}_{i}", node.op_type)
            } else {
                node.name.clone()
            };
            let first_out = node
                .output
                .iter()
                .find(|o| !o.is_empty())
                .cloned()
                .unwrap_or_else(|| self.loc.clone());
            self.name_prefix = sanitize(&first_out);
            self.temp_counter = 0;
            self.node_values.clear();
            let wrap = |this: &Self, f: Fail| -> OnnxError {
                let (node_name, op_type, opset) =
                    (this.loc.clone(), node.op_type.clone(), this.opset);
                match f {
                    Fail::Onnx(e) => e,
                    Fail::Invalid(message) => OnnxError::Node {
                        node: node_name,
                        op_type,
                        opset,
                        message,
                    },
                    Fail::Unsupported(message) => OnnxError::Unsupported {
                        node: node_name,
                        op_type,
                        opset,
                        message,
                    },
                    Fail::NeedsValue { input, message } => OnnxError::InputValueNeeded {
                        node: node_name,
                        op_type,
                        opset,
                        input,
                        message,
                    },
                    Fail::Attr(source) => OnnxError::Attribute {
                        node: node_name,
                        op_type,
                        opset,
                        source,
                    },
                }
            };
            if !(is_default_domain(&node.domain) || maps_other_domain(&node.domain, &node.op_type))
            {
                return Err(OnnxError::UnsupportedOp {
                    node: self.loc.clone(),
                    op_type: node.op_type.clone(),
                    domain: node.domain.clone(),
                    opset: self.opset,
                });
            }
            let outs = match self.lower_node(node) {
                Ok(outs) => outs,
                Err(f) => return Err(wrap(self, f)),
            };
            for (k, name) in node.output.iter().enumerate() {
                if name.is_empty() {
                    continue;
                }
                match outs.get(k) {
                    Some(v) => {
                        if let Some(tt) = declared.get(name.as_str()) {
                            if let Err(f) = self.check_declared(name, v, tt) {
                                return Err(wrap(self, f));
                            }
                        }
                        self.define(name, v.clone())
                    }
                    None => {
                        self.unavailable.insert(
                            name.clone(),
                            format!(
                                "ppcc does not produce output {k} of node {:?} ({})",
                                self.loc, node.op_type
                            ),
                        );
                    }
                }
            }
        }
        Ok(())
    }
}

/// The message for shape computations that depend on the batch size in a way ppcc cannot
/// keep symbolic.
pub(super) const BATCH_NEEDED: &str =
    "this shape computation depends on the symbolic batch size; fix it with --batch N (or --input-shape)";

fn type_kind(v: &TypeValue) -> &'static str {
    match v {
        TypeValue::TensorType(_) => "tensor",
        TypeValue::SequenceType(_) => "sequence",
        TypeValue::MapType(_) => "map",
        TypeValue::OptionalType(_) => "optional",
        TypeValue::SparseTensorType(_) => "sparse tensor",
        TypeValue::OpaqueType(_) => "opaque",
    }
}

/// A tensor with every element equal to the one element of `value`.
pub(super) fn splat_tensor(value: &Tensor, shape: &[usize]) -> R<Tensor> {
    let n = element_count(&shape.iter().map(|&d| d as i64).collect::<Vec<_>>())?;
    if n > MATERIALIZE_MAX_ELEMENTS {
        unsupported!("a constant of shape {shape:?} is too large to fold at import time");
    }
    let data = match &value.data {
        TensorData::Float(v) => TensorData::Float(vec![v[0]; n]),
        TensorData::Int(v) => TensorData::Int(vec![v[0]; n]),
    };
    Ok(Tensor {
        dtype: value.dtype,
        shape: shape.to_vec(),
        data,
    })
}

/// `ty`, if its size is representable: an input declared `[2^31, 2^31, 4]` has an element
/// count that wraps to 0.
fn sized(input: &str, ty: TensorType) -> Result<TensorType, OnnxError> {
    match ty.check_size() {
        Ok(()) => Ok(ty),
        Err(e) => Err(OnnxError::InputShape {
            input: input.to_string(),
            message: e.to_string(),
        }),
    }
}

/// Refuse a graph that assigns a value twice: two nodes writing one output (or one node
/// listing it twice), a node output that overwrites a graph input or an initializer, an
/// initializer given twice, a graph input listed twice. Importing such a graph would let
/// the last writer win silently; onnxruntime refuses it. A graph input that shares its
/// name with an initializer is allowed (the initializer is its default value; the types
/// are compared in [`check_input_initializer`]).
fn check_single_assignment(graph: &GraphProto) -> Result<(), OnnxError> {
    fn assign<'g>(
        writer: &mut HashMap<&'g str, String>,
        name: &'g str,
        by: String,
    ) -> Result<(), OnnxError> {
        if name.is_empty() {
            return Ok(()); // reported as a missing name where it is read
        }
        if let Some(first) = writer.get(name) {
            return Err(OnnxError::Reassigned {
                value: name.to_string(),
                first: first.clone(),
                second: by,
            });
        }
        writer.insert(name, by);
        Ok(())
    }
    let mut writer: HashMap<&str, String> = HashMap::new();
    for init in &graph.initializer {
        assign(&mut writer, &init.name, "an initializer".into())?;
    }
    for sp in &graph.sparse_initializer {
        if let Some(values) = &sp.values {
            assign(&mut writer, &values.name, "a sparse initializer".into())?;
        }
    }
    let mut inputs = HashSet::new();
    for vi in &graph.input {
        if !vi.name.is_empty() && !inputs.insert(vi.name.as_str()) {
            return Err(OnnxError::Reassigned {
                value: vi.name.clone(),
                first: "a graph input".into(),
                second: "a second graph input of that name".into(),
            });
        }
        // An input with an initializer keeps "an initializer" as its writer.
        writer
            .entry(vi.name.as_str())
            .or_insert_with(|| "the graph input".into());
    }
    for (i, node) in graph.node.iter().enumerate() {
        let who = if node.name.is_empty() {
            format!("node \"{}_{i}\" ({})", node.op_type, node.op_type)
        } else {
            format!("node {:?} ({})", node.name, node.op_type)
        };
        for o in node.output.iter().filter(|o| !o.is_empty()) {
            assign(&mut writer, o, who.clone())?;
        }
    }
    Ok(())
}

/// A graph input that is also an initializer must be declared with the initializer's
/// element type and (where the declaration gives them) dimensions.
fn check_input_initializer(
    vi: &ValueInfoProto,
    data_type: i32,
    dims: &[i64],
) -> Result<(), OnnxError> {
    let Some(TypeProto {
        value: Some(TypeValue::TensorType(tt)),
        ..
    }) = &vi.r#type
    else {
        return Ok(());
    };
    let name = super::proto::data_type::name;
    let declared_dims: Option<Vec<String>> = tt.shape.as_ref().map(|s| {
        s.dim
            .iter()
            .map(|d| match &d.value {
                Some(DimensionValue::DimValue(v)) => v.to_string(),
                Some(DimensionValue::DimParam(p)) => p.clone(),
                None => "?".into(),
            })
            .collect()
    });
    let dims_agree = tt.shape.as_ref().is_none_or(|s| {
        s.dim.len() == dims.len()
            && s.dim.iter().zip(dims).all(|(d, &n)| match d.value {
                Some(DimensionValue::DimValue(v)) => v == n,
                _ => true,
            })
    });
    let types_agree = tt.elem_type == 0 || tt.elem_type == data_type;
    if dims_agree && types_agree {
        return Ok(());
    }
    let shown: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
    Err(OnnxError::InitializerType {
        name: vi.name.clone(),
        declared: match declared_dims {
            Some(d) => format!("{} [{}]", name(tt.elem_type), d.join(", ")),
            None => name(tt.elem_type).to_string(),
        },
        initializer: format!("{} [{}]", name(data_type), shown.join(", ")),
    })
}

/// Node indices in an order where every value is defined before use (the file's order when
/// it already is one, as the spec requires; some exporters do not quite manage).
fn topological_order(graph: &GraphProto) -> Result<Vec<usize>, OnnxError> {
    let mut producer: HashMap<&str, usize> = HashMap::new();
    for (i, n) in graph.node.iter().enumerate() {
        for o in &n.output {
            if !o.is_empty() {
                producer.insert(o.as_str(), i);
            }
        }
    }
    let n = graph.node.len();
    let mut state = vec![0u8; n]; // 0 new, 1 on stack, 2 done
    let mut order = Vec::with_capacity(n);
    for start in 0..n {
        if state[start] != 0 {
            continue;
        }
        // Iterative DFS so that a deep graph cannot overflow the stack.
        let mut stack: Vec<(usize, usize)> = vec![(start, 0)];
        state[start] = 1;
        while let Some(&mut (node, ref mut next)) = stack.last_mut() {
            let inputs = &graph.node[node].input;
            if *next < inputs.len() {
                let inp = inputs[*next].as_str();
                *next += 1;
                if let Some(&p) = producer.get(inp) {
                    match state[p] {
                        0 => {
                            state[p] = 1;
                            stack.push((p, 0));
                        }
                        1 if p != node => {
                            return Err(OnnxError::Invalid(format!(
                                "the graph has a cycle through value `{inp}`"
                            )))
                        }
                        _ => {}
                    }
                }
            } else {
                state[node] = 2;
                order.push(node);
                stack.pop();
            }
        }
    }
    Ok(order)
}

/// Densify a sparse initializer.
fn sparse_to_dense(
    sp: &SparseTensorProto,
    model_dir: Option<&Path>,
) -> Result<(String, Tensor), OnnxError> {
    let values = sp
        .values
        .as_ref()
        .ok_or_else(|| OnnxError::Invalid("sparse initializer without values".into()))?;
    let name = values.name.clone();
    let err = |m: String| OnnxError::Tensor {
        tensor: name.clone(),
        message: m,
    };
    let vals = tensor_from_proto(values, model_dir)?;
    let n = element_count(&sp.dims).map_err(|source| OnnxError::TensorData {
        tensor: name.clone(),
        source,
    })?;
    if n > MATERIALIZE_MAX_ELEMENTS {
        return Err(err(format!(
            "sparse tensor of shape {:?} is too large",
            sp.dims
        )));
    }
    let shape: Vec<usize> = sp.dims.iter().map(|&d| d as usize).collect();
    let nnz = vals.num_elements();
    let idx = match &sp.indices {
        Some(t) => tensor_from_proto(t, model_dir)?.to_i64_vec(),
        None => vec![],
    };
    let strides = ppir::tensor::strides_of(&shape);
    let linear: Vec<usize> = if idx.len() == nnz {
        idx.iter().map(|&i| i as usize).collect()
    } else if idx.len() == nnz * shape.len() && !shape.is_empty() {
        idx.chunks(shape.len())
            .map(|c| {
                c.iter()
                    .zip(&strides)
                    .map(|(&i, &s)| (i as usize).wrapping_mul(s))
                    .fold(0usize, usize::wrapping_add)
            })
            .collect()
    } else {
        return Err(err(format!(
            "{} indices for {nnz} values of shape {:?}",
            idx.len(),
            sp.dims
        )));
    };
    if linear.iter().any(|&i| i >= n) {
        return Err(err("sparse index out of range".into()));
    }
    let mut dense = Tensor::zeros(vals.dtype, shape);
    match (&mut dense.data, &vals.data) {
        (TensorData::Float(d), TensorData::Float(v)) => {
            linear.iter().zip(v).for_each(|(&i, &x)| d[i] = x)
        }
        (TensorData::Int(d), TensorData::Int(v)) => {
            linear.iter().zip(v).for_each(|(&i, &x)| d[i] = x)
        }
        _ => return Err(err("inconsistent sparse values".into())),
    }
    Ok((name, dense))
}

/// The default-domain opset a model imports.
pub fn model_opset(model: &ModelProto) -> Result<i64, OnnxError> {
    let opset = model
        .opset_import
        .iter()
        .filter(|o| o.domain.is_empty() || o.domain == "ai.onnx")
        .map(|o| o.version)
        .max();
    match opset {
        Some(v) if (MIN_OPSET..=MAX_OPSET).contains(&v) => Ok(v),
        Some(v) => Err(OnnxError::UnsupportedOpset { opset: v }),
        // IR version 3 and later must list it; before that opset 1 was implied.
        None if model.ir_version < 3 => Err(OnnxError::UnsupportedOpset { opset: 1 }),
        None => Err(OnnxError::Invalid(
            "the model imports no opset of the default ONNX domain".into(),
        )),
    }
}

fn is_default_domain(domain: &str) -> bool {
    domain.is_empty() || domain == "ai.onnx"
}

/// The opset a model imports for a (non-default) domain; 0 when it imports none.
fn domain_opset(model: &ModelProto, domain: &str) -> i64 {
    model
        .opset_import
        .iter()
        .filter(|o| o.domain == domain)
        .map(|o| o.version)
        .max()
        .unwrap_or(0)
}

/// Refuse the first node, here or in a subgraph (an `If` branch, a `Loop`/`Scan` body), of
/// an op ppcc does not map or of an op version it does not follow.
fn check_ops(
    model: &ModelProto,
    graph: &GraphProto,
    opset: i64,
    depth: usize,
) -> Result<(), OnnxError> {
    if depth > MAX_SUBGRAPH_DEPTH {
        return Err(OnnxError::Invalid(format!(
            "subgraphs are nested deeper than {MAX_SUBGRAPH_DEPTH}"
        )));
    }
    for (i, node) in graph.node.iter().enumerate() {
        let default_domain = is_default_domain(&node.domain);
        let name = || {
            if node.name.is_empty() {
                format!("{}_{i}", node.op_type)
            } else {
                node.name.clone()
            }
        };
        let mapped = if default_domain {
            SUPPORTED_OPS.contains(&node.op_type.as_str())
        } else {
            maps_other_domain(&node.domain, &node.op_type)
        };
        if !mapped {
            return Err(OnnxError::UnsupportedOp {
                node: name(),
                op_type: node.op_type.clone(),
                domain: node.domain.clone(),
                opset: if default_domain {
                    opset
                } else {
                    domain_opset(model, &node.domain)
                },
            });
        }
        if let Some(version) = refused_version(&node.op_type, opset).filter(|_| default_domain) {
            return Err(OnnxError::UnsupportedOpVersion {
                node: name(),
                op_type: node.op_type.clone(),
                version,
                opset,
            });
        }
        for attr in &node.attribute {
            for g in attr.g.iter().map(|g| &**g).chain(&attr.graphs) {
                check_ops(model, g, opset, depth + 1)?;
            }
        }
    }
    Ok(())
}

/// Import a decoded model.
pub fn import_model(model: &ModelProto, opts: &ImportOptions) -> Result<Imported, OnnxError> {
    let graph = model
        .graph
        .as_ref()
        .ok_or_else(|| OnnxError::Invalid("the model has no graph".into()))?;
    let opset = match model_opset(model) {
        Ok(v) => v,
        // A model of other domains only (ai.onnx.ml, training) may import no default opset:
        // its first op is the telling error, reported below with that domain's opset.
        Err(OnnxError::Invalid(_)) if graph.node.iter().any(|n| !is_default_domain(&n.domain)) => 0,
        Err(e) => return Err(e),
    };
    // An op ppcc cannot map (or an op version it does not follow) is the most telling
    // error; report it before anything else.
    check_ops(model, graph, opset, 0)?;
    check_single_assignment(graph)?;
    let model_dir = opts.model_dir.as_deref();
    let mut im = Importer::new(opts, opset, model_dir);

    // ONNX element type and dims of each initializer, by name.
    let mut init_names: HashMap<String, (i32, Vec<i64>)> = HashMap::new();
    for init in &graph.initializer {
        if init.name.is_empty() {
            return Err(OnnxError::Invalid("an initializer has no name".into()));
        }
        let t = tensor_from_proto(init, model_dir)?;
        init_names.insert(init.name.clone(), (init.data_type, init.dims.clone()));
        im.add_initializer(&init.name, t);
    }
    for sp in &graph.sparse_initializer {
        let (name, t) = sparse_to_dense(sp, model_dir)?;
        let data_type = sp.values.as_ref().map_or(0, |v| v.data_type);
        init_names.insert(name.clone(), (data_type, sp.dims.clone()));
        im.add_initializer(&name, t);
    }

    let mut inputs = vec![];
    for vi in &graph.input {
        if let Some((data_type, dims)) = init_names.get(&vi.name) {
            check_input_initializer(vi, *data_type, dims)?;
            continue;
        }
        if vi.name.is_empty() {
            return Err(OnnxError::Invalid("a graph input has no name".into()));
        }
        if let Some(t) = opts.input_values.get(&vi.name) {
            im.loc = vi.name.clone();
            im.define(&vi.name, Val::konst(t.clone()));
            continue;
        }
        let ty = im.input_type(vi)?;
        let name = im.unique_name(&vi.name);
        let id = im.f.add_arg(name, ty, ArgKind::Input);
        im.vals.insert(vi.name.clone(), Val::Ir(id));
        im.graph_inputs.insert(vi.name.clone());
        inputs.push(vi.name.clone());
    }
    for name in opts.input_shapes.keys().chain(opts.input_values.keys()) {
        if !graph.input.iter().any(|vi| &vi.name == name) {
            let known: Vec<&str> = inputs.iter().map(String::as_str).collect();
            return Err(OnnxError::InputShape {
                input: name.clone(),
                message: format!(
                    "the model has no such input (its inputs: {})",
                    known.join(", ")
                ),
            });
        }
    }

    im.lower_all(graph)?;

    let mut results = vec![];
    let mut outputs = vec![];
    for vi in &graph.output {
        im.loc = format!("output {}", vi.name);
        im.name_prefix = sanitize(&vi.name);
        im.node_values.clear();
        let val = im.lookup(&vi.name).and_then(|v| {
            if let Val::Seq(_) = v {
                unsupported!("sequence outputs are unsupported")
            }
            im.ir(&v)
        });
        let id = val.map_err(|f| match f {
            Fail::Onnx(e) => e,
            Fail::Invalid(m) => OnnxError::Invalid(format!("graph output `{}`: {m}", vi.name)),
            Fail::Attr(e) => OnnxError::Invalid(format!("graph output `{}`: {e}", vi.name)),
            Fail::Unsupported(m) | Fail::NeedsValue { message: m, .. } => {
                OnnxError::UnsupportedValue {
                    what: "graph output",
                    name: vi.name.clone(),
                    message: m,
                }
            }
        })?;
        if let Some(TypeProto {
            value: Some(TypeValue::TensorType(tt)),
            ..
        }) = &vi.r#type
        {
            let got = im.f.ty(id).dtype;
            if let Some(want) = dtype_from_onnx(tt.elem_type) {
                if want != got {
                    return Err(OnnxError::Invalid(format!(
                        "graph output `{}` is declared {want} but computes {got}",
                        vi.name
                    )));
                }
            }
        } else if let Some(TypeProto {
            value: Some(other), ..
        }) = &vi.r#type
        {
            return Err(OnnxError::UnsupportedValue {
                what: "graph output",
                name: vi.name.clone(),
                message: format!("{} values are unsupported", type_kind(other)),
            });
        }
        results.push(id);
        outputs.push(vi.name.clone());
    }
    im.f.set_results(results);

    let mut module = Module::new();
    module.name = if graph.name.is_empty() {
        None
    } else {
        Some(sanitize(&graph.name))
    };
    module.functions.push(std::mem::take(&mut im.f));
    module.weights = std::mem::take(&mut im.weights);
    let weight_sources = im
        .params
        .iter()
        .filter_map(|slot| {
            let (index, _) = slot.arg?;
            let ir = module.functions[0]
                .value(module.functions[0].args()[index].0)
                .name
                .clone();
            Some((ir, slot.onnx_name.clone()))
        })
        .collect();
    Ok(Imported {
        module,
        inputs,
        outputs,
        weight_sources,
        opset,
    })
}

/// A one-element tensor of `dtype` holding `x`.
pub(super) fn scalar(dtype: DType, x: f64) -> Tensor {
    if dtype.is_float() {
        Tensor::from_f64(dtype, vec![], vec![x])
    } else {
        Tensor::from_i64(dtype, vec![], vec![x as i64])
    }
}
