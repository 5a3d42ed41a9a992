//! Appending ops to the function autodiff builds: result types come from shape inference,
//! every op gets the phase, stage and location of the forward op it belongs to, and every
//! value gets an explicit, unique name (numbers, like the printer's fresh names).

use std::collections::{HashMap, HashSet};

use ppir::ops::attrs::{CastAttrs, ConstantAttrs, ReduceAttrs, ShapeAttrs, TransposeAttrs};
use ppir::ops::OpAttrs;
use ppir::{Attrs, DType, Function, NewOp, OpId, OpKind, Phase, Tensor, TensorType, ValueId};

use super::{internal, Res};

/// Unique value names for one function. Reserved names (the contract's `loss`,
/// `grad.<param>`, ...) are kept free until [`Names::take`] hands them out.
#[derive(Default)]
pub(super) struct Names {
    used: HashSet<String>,
    reserved: HashSet<String>,
    next: u64,
}

impl Names {
    pub(super) fn reserve(&mut self, name: &str) {
        self.reserved.insert(name.to_string());
    }

    pub(super) fn is_taken(&self, name: &str) -> bool {
        self.used.contains(name) || self.reserved.contains(name)
    }

    /// `base` if free, else `base.1`, `base.2`, ...
    pub(super) fn claim(&mut self, base: &str) -> String {
        let mut name = base.to_string();
        let mut i = 1;
        while self.is_taken(&name) {
            name = format!("{base}.{i}");
            i += 1;
        }
        self.used.insert(name.clone());
        name
    }

    /// A reserved name, exactly (or a claimed variant if it was not reserved).
    pub(super) fn take(&mut self, name: &str) -> String {
        if self.reserved.remove(name) {
            self.used.insert(name.to_string());
            return name.to_string();
        }
        self.claim(name)
    }

    /// The next free number.
    pub(super) fn fresh(&mut self) -> String {
        loop {
            let name = self.next.to_string();
            self.next += 1;
            if !self.is_taken(&name) {
                self.used.insert(name.clone());
                return name;
            }
        }
    }
}

/// How to name a result: a fresh number, a claimed name (suffixed if taken), or a name
/// reserved for the result.
#[derive(Clone, Copy, Debug)]
pub(super) enum Name<'s> {
    Fresh,
    Like(&'s str),
    Reserved(&'s str),
}

/// Appends ops to `f` in one phase, attributed to one forward op at a time.
pub(super) struct Emitter<'a> {
    pub f: &'a mut Function,
    pub names: &'a mut Names,
    pub phase: Phase,
    pub stage: Option<u32>,
    pub loc: Option<String>,
    /// Every op emitted, in order.
    pub emitted: Vec<OpId>,
    /// Scalar constants of the current forward op, by dtype and bits.
    scalars: HashMap<(DType, u64), ValueId>,
}

impl<'a> Emitter<'a> {
    pub(super) fn new(f: &'a mut Function, names: &'a mut Names, phase: Phase) -> Self {
        Emitter {
            f,
            names,
            phase,
            stage: None,
            loc: None,
            emitted: vec![],
            scalars: HashMap::new(),
        }
    }

    /// Attribute the following ops to a forward op (its stage and location).
    pub(super) fn at(&mut self, stage: Option<u32>, loc: Option<String>) {
        self.stage = stage;
        self.loc = loc;
        self.scalars.clear();
    }

    pub(super) fn ty(&self, v: ValueId) -> &TensorType {
        self.f.ty(v)
    }

    pub(super) fn shape(&self, v: ValueId) -> Vec<u64> {
        self.f.ty(v).static_shape().unwrap_or_default()
    }

    pub(super) fn dtype(&self, v: ValueId) -> DType {
        self.f.ty(v).dtype
    }

    pub(super) fn rank(&self, v: ValueId) -> usize {
        self.f.ty(v).rank()
    }

    /// Append an op whose result types are inferred, naming its results `names`
    /// (fresh numbers where missing).
    pub(super) fn op_named(
        &mut self,
        kind: OpKind,
        operands: &[ValueId],
        attrs: Attrs,
        names: &[Name<'_>],
    ) -> Res<Vec<ValueId>> {
        let types: Vec<TensorType> = operands.iter().map(|&v| self.f.ty(v).clone()).collect();
        let results = ppir::shape::infer(kind, &attrs, &types).map_err(|e| {
            let tys: Vec<String> = types.iter().map(|t| t.to_string()).collect();
            internal(format!(
                "building \"{kind}\" ({}) with {:?}: {e}",
                tys.join(", "),
                attrs
            ))
        })?;
        self.op_typed(kind, operands, attrs, results, names)
    }

    /// Append an op with the given result types.
    pub(super) fn op_typed(
        &mut self,
        kind: OpKind,
        operands: &[ValueId],
        attrs: Attrs,
        types: Vec<TensorType>,
        names: &[Name<'_>],
    ) -> Res<Vec<ValueId>> {
        let names: Vec<String> = (0..types.len())
            .map(|i| match names.get(i).copied().unwrap_or(Name::Fresh) {
                Name::Fresh => self.names.fresh(),
                Name::Like(n) => self.names.claim(n),
                Name::Reserved(n) => self.names.take(n),
            })
            .collect();
        let mut new = NewOp::new(kind, operands.to_vec(), types)
            .attrs(attrs)
            .names(names)
            .phase(self.phase);
        new.stage = self.stage;
        new.loc = self.loc.clone();
        let id = self.f.push_op(new);
        self.emitted.push(id);
        Ok(self.f.op(id).results().to_vec())
    }

    /// Append a one-result op.
    pub(super) fn op(&mut self, kind: OpKind, operands: &[ValueId], attrs: Attrs) -> Res<ValueId> {
        Ok(self.op_named(kind, operands, attrs, &[])?[0])
    }

    /// Append a one-result op with a name.
    pub(super) fn op_as(
        &mut self,
        name: Name<'_>,
        kind: OpKind,
        operands: &[ValueId],
        attrs: Attrs,
    ) -> Res<ValueId> {
        Ok(self.op_named(kind, operands, attrs, &[name])?[0])
    }

    pub(super) fn constant(&mut self, t: Tensor) -> Res<ValueId> {
        self.op(OpKind::Constant, &[], ConstantAttrs { value: t }.to_attrs())
    }

    /// A rank-0 constant, shared within the current forward op.
    pub(super) fn scalar(&mut self, dtype: DType, x: f64) -> Res<ValueId> {
        if let Some(&v) = self.scalars.get(&(dtype, x.to_bits())) {
            return Ok(v);
        }
        let t = if dtype.is_float() {
            Tensor::scalar_f64(dtype, x)
        } else {
            Tensor::from_i64(dtype, vec![], vec![x as i64])
        };
        let v = self.constant(t)?;
        self.scalars.insert((dtype, x.to_bits()), v);
        Ok(v)
    }

    /// A scalar constant of `v`'s dtype.
    pub(super) fn scalar_like(&mut self, v: ValueId, x: f64) -> Res<ValueId> {
        let dtype = self.dtype(v);
        self.scalar(dtype, x)
    }

    // ---- arithmetic ----

    pub(super) fn add(&mut self, a: ValueId, b: ValueId) -> Res<ValueId> {
        self.op(OpKind::Add, &[a, b], Attrs::new())
    }

    pub(super) fn sub(&mut self, a: ValueId, b: ValueId) -> Res<ValueId> {
        self.op(OpKind::Sub, &[a, b], Attrs::new())
    }

    pub(super) fn mul(&mut self, a: ValueId, b: ValueId) -> Res<ValueId> {
        self.op(OpKind::Mul, &[a, b], Attrs::new())
    }

    pub(super) fn div(&mut self, a: ValueId, b: ValueId) -> Res<ValueId> {
        self.op(OpKind::Div, &[a, b], Attrs::new())
    }

    pub(super) fn neg(&mut self, a: ValueId) -> Res<ValueId> {
        self.op(OpKind::Neg, &[a], Attrs::new())
    }

    pub(super) fn unary(&mut self, kind: OpKind, a: ValueId) -> Res<ValueId> {
        self.op(kind, &[a], Attrs::new())
    }

    /// `a · c` for a constant `c`.
    pub(super) fn scale(&mut self, a: ValueId, c: f64) -> Res<ValueId> {
        let s = self.scalar_like(a, c)?;
        self.mul(a, s)
    }

    pub(super) fn where_(&mut self, cond: ValueId, a: ValueId, b: ValueId) -> Res<ValueId> {
        self.op(OpKind::Where, &[cond, a, b], Attrs::new())
    }

    /// `where(cond, a, 0)`.
    pub(super) fn mask(&mut self, cond: ValueId, a: ValueId) -> Res<ValueId> {
        let z = self.scalar_like(a, 0.0)?;
        self.where_(cond, a, z)
    }

    /// `a > c` (or another comparison) against a scalar constant.
    pub(super) fn cmp_scalar(&mut self, kind: OpKind, a: ValueId, c: f64) -> Res<ValueId> {
        let s = self.scalar_like(a, c)?;
        self.op(kind, &[a, s], Attrs::new())
    }

    // ---- shapes ----

    pub(super) fn reshape(&mut self, v: ValueId, shape: &[u64]) -> Res<ValueId> {
        if self.shape(v) == shape && self.rank(v) == shape.len() {
            return Ok(v);
        }
        // In the backward part, a reshape of a backward reshape reads the original (the
        // intermediate is removed as dead code if nothing else uses it).
        if let Some(p) = self.f.producer(v) {
            let d = self.f.op(p);
            let backward = |ph: Option<Phase>| ph.is_some_and(|ph| ph != Phase::Fwd);
            if d.kind == OpKind::Reshape && backward(Some(self.phase)) && backward(d.phase) {
                let src = d.operands()[0];
                return self.reshape(src, shape);
            }
        }
        self.op(OpKind::Reshape, &[v], shape_attrs(shape))
    }

    pub(super) fn expand(&mut self, v: ValueId, shape: &[u64]) -> Res<ValueId> {
        if self.shape(v) == shape && self.rank(v) == shape.len() {
            return Ok(v);
        }
        self.op(OpKind::Expand, &[v], shape_attrs(shape))
    }

    pub(super) fn transpose(&mut self, v: ValueId, perm: &[usize]) -> Res<ValueId> {
        if perm.iter().enumerate().all(|(i, &p)| i == p) {
            return Ok(v);
        }
        let perm = Some(perm.iter().map(|&a| a as i64).collect());
        self.op(OpKind::Transpose, &[v], TransposeAttrs { perm }.to_attrs())
    }

    /// Swap the last two axes.
    pub(super) fn transpose_last2(&mut self, v: ValueId) -> Res<ValueId> {
        let r = self.rank(v);
        let mut perm: Vec<usize> = (0..r).collect();
        perm.swap(r - 2, r - 1);
        self.transpose(v, &perm)
    }

    pub(super) fn reduce(
        &mut self,
        kind: OpKind,
        v: ValueId,
        axes: &[usize],
        keepdims: bool,
    ) -> Res<ValueId> {
        // An empty `axes` means "all" in the IR; say it explicitly so no axis means none.
        if axes.is_empty() {
            return Ok(v);
        }
        let axes = axes.iter().map(|&x| x as i64).collect();
        self.op(kind, &[v], ReduceAttrs { axes, keepdims }.to_attrs())
    }

    pub(super) fn reduce_sum(
        &mut self,
        v: ValueId,
        axes: &[usize],
        keepdims: bool,
    ) -> Res<ValueId> {
        self.reduce(OpKind::ReduceSum, v, axes, keepdims)
    }

    pub(super) fn reduce_mean(
        &mut self,
        v: ValueId,
        axes: &[usize],
        keepdims: bool,
    ) -> Res<ValueId> {
        self.reduce(OpKind::ReduceMean, v, axes, keepdims)
    }

    /// Sum a gradient of a broadcast result back to an operand's shape: reduce over the
    /// leading axes the operand lacks and the axes where it has size 1, then reshape.
    pub(super) fn unbroadcast(&mut self, g: ValueId, target: &TensorType) -> Res<ValueId> {
        let out = self.shape(g);
        let want = target.static_shape().unwrap_or_default();
        if out == want && self.rank(g) == want.len() {
            return Ok(g);
        }
        if want.len() > out.len() {
            return Err(internal(format!(
                "cannot sum a gradient of shape {out:?} to the larger shape {want:?}"
            )));
        }
        let lead = out.len() - want.len();
        let axes: Vec<usize> = (0..out.len())
            .filter(|&i| i < lead || (want[i - lead] == 1 && out[i] != 1))
            .collect();
        // Only leading axes: dropping them gives the operand's shape directly.
        let only_leading = axes.iter().all(|&a| a < lead);
        let s = self.reduce_sum(g, &axes, !only_leading)?;
        self.reshape(s, &want)
    }

    /// Zeros of type `ty`: a scalar constant expanded (no large literal in the module).
    pub(super) fn zeros(&mut self, ty: &TensorType) -> Res<ValueId> {
        let z = self.scalar(ty.dtype, 0.0)?;
        let shape = ty.static_shape().unwrap_or_default();
        if shape.is_empty() {
            return Ok(z);
        }
        self.expand(z, &shape)
    }

    pub(super) fn cast(&mut self, v: ValueId, to: DType) -> Res<ValueId> {
        if self.dtype(v) == to {
            return Ok(v);
        }
        self.op(OpKind::Cast, &[v], CastAttrs { to }.to_attrs())
    }
}

/// The attributes of a `reshape` or `expand` to `shape`.
fn shape_attrs(shape: &[u64]) -> Attrs {
    let shape = shape.iter().map(|&d| d as i64).collect();
    ShapeAttrs { shape }.to_attrs()
}
