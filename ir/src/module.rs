//! Modules, functions, values and ops.
//!
//! A [`Function`] owns two arenas indexed by dense ids ([`ValueId`], [`OpId`]) and a layout
//! (the order of ops in its body), as in Cranelift. Every value records its definition and
//! its uses, so analyses walk producers and users in O(1) and a pass can replace a value's
//! uses without a scan. Removed ops stay in the arena as tombstones and leave the layout.

use std::collections::BTreeMap;
use std::fmt;

use crate::attr::Attrs;
use crate::ops::{OpKind, Phase};
use crate::tensor::Tensor;
use crate::types::TensorType;

/// A value (SSA name) within one function.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(pub u32);

/// An op within one function.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpId(pub u32);

impl ValueId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl OpId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// What a function argument is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ArgKind {
    /// Data fed per call (a model input, labels, a received tensor...).
    Input,
    /// A trainable weight; bound to the module weight of the same name. Printed `{param}`.
    Param,
    /// Persistent but not trained (batch-norm running statistics, optimizer state).
    /// Bound to the module weight of the same name. Printed `{state}`.
    State,
}

impl ArgKind {
    pub fn name(self) -> &'static str {
        match self {
            ArgKind::Input => "input",
            ArgKind::Param => "param",
            ArgKind::State => "state",
        }
    }
}

/// Where a value comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueDef {
    /// The i-th function argument.
    Arg(usize),
    /// The i-th result of an op.
    Op(OpId, usize),
}

/// One use of a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Use {
    /// Operand `index` of an op.
    Operand(OpId, usize),
    /// Entry `index` of the function's `return`.
    Return(usize),
}

#[derive(Clone, Debug, PartialEq)]
pub struct ValueData {
    /// SSA name without the `%`; unique within the function.
    pub name: String,
    pub ty: TensorType,
    pub def: ValueDef,
    uses: Vec<Use>,
}

impl ValueData {
    pub fn uses(&self) -> &[Use] {
        &self.uses
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct OpData {
    pub kind: OpKind,
    operands: Vec<ValueId>,
    results: Vec<ValueId>,
    pub attrs: Attrs,
    /// Pipeline stage (device) this op runs on.
    pub stage: Option<u32>,
    /// Training phase.
    pub phase: Option<Phase>,
    /// Source location (the ONNX node name), for diagnostics.
    pub loc: Option<String>,
    removed: bool,
}

impl OpData {
    pub fn operands(&self) -> &[ValueId] {
        &self.operands
    }

    pub fn results(&self) -> &[ValueId] {
        &self.results
    }

    pub fn is_removed(&self) -> bool {
        self.removed
    }
}

/// What to create: the op's kind, operands, attributes and annotations, and result types.
#[derive(Clone, Debug)]
pub struct NewOp {
    pub kind: OpKind,
    pub operands: Vec<ValueId>,
    pub attrs: Attrs,
    pub result_types: Vec<TensorType>,
    /// Result names; missing or empty entries get fresh numeric names.
    pub result_names: Vec<String>,
    pub stage: Option<u32>,
    pub phase: Option<Phase>,
    pub loc: Option<String>,
}

impl NewOp {
    pub fn new(kind: OpKind, operands: Vec<ValueId>, result_types: Vec<TensorType>) -> Self {
        NewOp {
            kind,
            operands,
            attrs: Attrs::new(),
            result_types,
            result_names: vec![],
            stage: None,
            phase: None,
            loc: None,
        }
    }

    pub fn attrs(mut self, attrs: Attrs) -> Self {
        self.attrs = attrs;
        self
    }

    pub fn names(mut self, names: Vec<String>) -> Self {
        self.result_names = names;
        self
    }

    pub fn loc(mut self, loc: impl Into<String>) -> Self {
        self.loc = Some(loc.into());
        self
    }

    pub fn stage(mut self, stage: u32) -> Self {
        self.stage = Some(stage);
        self
    }

    pub fn phase(mut self, phase: Phase) -> Self {
        self.phase = Some(phase);
        self
    }
}

/// A function: arguments, a body of ops in order, and returned values.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Function {
    pub name: String,
    /// Function attributes, printed `attributes {stage = 1}`.
    pub attrs: Attrs,
    args: Vec<(ValueId, ArgKind)>,
    values: Vec<ValueData>,
    ops: Vec<OpData>,
    layout: Vec<OpId>,
    results: Vec<ValueId>,
    next_name: u64,
}

impl Function {
    pub fn new(name: impl Into<String>) -> Self {
        Function {
            name: name.into(),
            ..Default::default()
        }
    }

    // ---- reading ----

    /// Argument values with their kinds, in order.
    pub fn args(&self) -> &[(ValueId, ArgKind)] {
        &self.args
    }

    pub fn arg_values(&self) -> impl Iterator<Item = ValueId> + '_ {
        self.args.iter().map(|(v, _)| *v)
    }

    /// Returned values, in order.
    pub fn results(&self) -> &[ValueId] {
        &self.results
    }

    /// Result types, in order.
    pub fn result_types(&self) -> Vec<TensorType> {
        self.results
            .iter()
            .map(|&v| self.value(v).ty.clone())
            .collect()
    }

    pub fn value(&self, v: ValueId) -> &ValueData {
        &self.values[v.index()]
    }

    pub fn ty(&self, v: ValueId) -> &TensorType {
        &self.values[v.index()].ty
    }

    pub fn op(&self, id: OpId) -> &OpData {
        &self.ops[id.index()]
    }

    pub fn op_mut(&mut self, id: OpId) -> &mut OpData {
        &mut self.ops[id.index()]
    }

    /// Live ops in body order.
    pub fn ops(&self) -> &[OpId] {
        &self.layout
    }

    pub fn num_values(&self) -> usize {
        self.values.len()
    }

    /// Upper bound on op ids (including removed ops), for dense side tables.
    pub fn num_op_slots(&self) -> usize {
        self.ops.len()
    }

    pub fn users(&self, v: ValueId) -> &[Use] {
        &self.values[v.index()].uses
    }

    /// The op defining `v`, if `v` is not an argument.
    pub fn producer(&self, v: ValueId) -> Option<OpId> {
        match self.values[v.index()].def {
            ValueDef::Op(op, _) => Some(op),
            ValueDef::Arg(_) => None,
        }
    }

    pub fn find_value(&self, name: &str) -> Option<ValueId> {
        self.values
            .iter()
            .position(|v| v.name == name)
            .map(|i| ValueId(i as u32))
    }

    // ---- building ----

    fn fresh_name(&mut self) -> String {
        loop {
            let name = self.next_name.to_string();
            self.next_name += 1;
            if self.find_value(&name).is_none() {
                return name;
            }
        }
    }

    fn new_value(&mut self, name: Option<String>, ty: TensorType, def: ValueDef) -> ValueId {
        let name = match name {
            Some(n) if !n.is_empty() => n,
            _ => self.fresh_name(),
        };
        let id = ValueId(self.values.len() as u32);
        self.values.push(ValueData {
            name,
            ty,
            def,
            uses: vec![],
        });
        id
    }

    /// Append an argument. An empty name gets a fresh numeric one.
    pub fn add_arg(&mut self, name: impl Into<String>, ty: TensorType, kind: ArgKind) -> ValueId {
        let idx = self.args.len();
        let v = self.new_value(Some(name.into()), ty, ValueDef::Arg(idx));
        self.args.push((v, kind));
        v
    }

    pub fn set_arg_kind(&mut self, index: usize, kind: ArgKind) {
        self.args[index].1 = kind;
    }

    fn create_op(&mut self, new: NewOp) -> OpId {
        let id = OpId(self.ops.len() as u32);
        let mut results = Vec::with_capacity(new.result_types.len());
        for (i, ty) in new.result_types.into_iter().enumerate() {
            let name = new.result_names.get(i).cloned();
            results.push(self.new_value(name, ty, ValueDef::Op(id, i)));
        }
        for (i, &v) in new.operands.iter().enumerate() {
            self.values[v.index()].uses.push(Use::Operand(id, i));
        }
        self.ops.push(OpData {
            kind: new.kind,
            operands: new.operands,
            results,
            attrs: new.attrs,
            stage: new.stage,
            phase: new.phase,
            loc: new.loc,
            removed: false,
        });
        id
    }

    /// Append an op at the end of the body.
    pub fn push_op(&mut self, new: NewOp) -> OpId {
        let id = self.create_op(new);
        self.layout.push(id);
        id
    }

    /// Insert an op before `before` in the body.
    pub fn insert_op_before(&mut self, before: OpId, new: NewOp) -> OpId {
        let pos = self
            .layout
            .iter()
            .position(|&o| o == before)
            .unwrap_or(self.layout.len());
        let id = self.create_op(new);
        self.layout.insert(pos, id);
        id
    }

    /// Insert an op after `after` in the body.
    pub fn insert_op_after(&mut self, after: OpId, new: NewOp) -> OpId {
        let pos = self
            .layout
            .iter()
            .position(|&o| o == after)
            .map_or(self.layout.len(), |p| p + 1);
        let id = self.create_op(new);
        self.layout.insert(pos, id);
        id
    }

    /// Append an op and return its single result. Panics if the op has no result.
    pub fn push(&mut self, new: NewOp) -> ValueId {
        let id = self.push_op(new);
        self.ops[id.index()].results[0]
    }

    fn drop_use(&mut self, v: ValueId, u: Use) {
        let uses = &mut self.values[v.index()].uses;
        if let Some(p) = uses.iter().position(|&x| x == u) {
            uses.swap_remove(p);
        }
    }

    /// Replace operand `index` of `op`.
    pub fn set_operand(&mut self, op: OpId, index: usize, v: ValueId) {
        let old = self.ops[op.index()].operands[index];
        self.drop_use(old, Use::Operand(op, index));
        self.ops[op.index()].operands[index] = v;
        self.values[v.index()].uses.push(Use::Operand(op, index));
    }

    /// Set the returned values.
    pub fn set_results(&mut self, results: Vec<ValueId>) {
        for (i, v) in std::mem::take(&mut self.results).into_iter().enumerate() {
            self.drop_use(v, Use::Return(i));
        }
        for (i, &v) in results.iter().enumerate() {
            self.values[v.index()].uses.push(Use::Return(i));
        }
        self.results = results;
    }

    /// Make every use of `old` a use of `new`.
    pub fn replace_all_uses(&mut self, old: ValueId, new: ValueId) {
        if old == new {
            return;
        }
        let uses = std::mem::take(&mut self.values[old.index()].uses);
        for u in &uses {
            match *u {
                Use::Operand(op, i) => self.ops[op.index()].operands[i] = new,
                Use::Return(i) => self.results[i] = new,
            }
        }
        self.values[new.index()].uses.extend(uses);
    }

    /// Remove an op from the body. Its results must be unused by then (the verifier reports
    /// a use of a removed op's result as a use of an undefined value).
    pub fn remove_op(&mut self, op: OpId) {
        if self.ops[op.index()].removed {
            return;
        }
        let operands = self.ops[op.index()].operands.clone();
        for (i, v) in operands.into_iter().enumerate() {
            self.drop_use(v, Use::Operand(op, i));
        }
        self.ops[op.index()].removed = true;
        self.layout.retain(|&o| o != op);
    }

    /// Reorder the body. `order` must be a permutation of the live ops.
    pub fn set_layout(&mut self, order: Vec<OpId>) {
        debug_assert_eq!(order.len(), self.layout.len());
        self.layout = order;
    }

    /// Rename a value (names must stay unique; the verifier checks).
    pub fn rename_value(&mut self, v: ValueId, name: impl Into<String>) {
        self.values[v.index()].name = name.into();
    }

    /// Change a value's type (used by shape inference).
    pub fn set_type(&mut self, v: ValueId, ty: TensorType) {
        self.values[v.index()].ty = ty;
    }
}

/// A module: named functions and the initial values of weights.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Module {
    pub name: Option<String>,
    pub functions: Vec<Function>,
    /// Initial values of `param`/`state` arguments, by argument name.
    pub weights: BTreeMap<String, Tensor>,
}

impl Module {
    pub fn new() -> Self {
        Module::default()
    }

    pub fn function(&self, name: &str) -> Option<&Function> {
        self.functions.iter().find(|f| f.name == name)
    }

    pub fn function_mut(&mut self, name: &str) -> Option<&mut Function> {
        self.functions.iter_mut().find(|f| f.name == name)
    }

    /// A copy of the functions without the weights' values, for analyses that transform
    /// the program (autodiff for costs, the stash model) and never read a weight: copying a
    /// large model's weights costs more than the analysis. The verifier then checks the
    /// weights' types across functions instead of against the values.
    pub fn clone_without_weights(&self) -> Module {
        Module {
            name: self.name.clone(),
            functions: self.functions.clone(),
            weights: BTreeMap::new(),
        }
    }
}

impl fmt::Display for Module {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&crate::text::print_module(
            self,
            &crate::text::PrintOptions::default(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::DType;

    #[test]
    fn uses_are_tracked() {
        let mut f = Function::new("f");
        let t = TensorType::of(DType::F32, &[2]);
        let x = f.add_arg("x", t.clone(), ArgKind::Input);
        let y = f.push(NewOp::new(OpKind::Relu, vec![x], vec![t.clone()]));
        let z = f.push(NewOp::new(OpKind::Add, vec![x, y], vec![t.clone()]));
        f.set_results(vec![z]);
        assert_eq!(f.users(x).len(), 2);
        assert_eq!(f.users(z), &[Use::Return(0)]);
        let n = f.push(NewOp::new(OpKind::Neg, vec![x], vec![t]));
        f.replace_all_uses(y, n);
        assert!(f.users(y).is_empty());
        assert_eq!(f.users(n).len(), 1);
        let relu = f.producer(y).unwrap();
        f.remove_op(relu);
        assert_eq!(f.ops().len(), 2);
        assert_eq!(f.users(x).len(), 2);
        assert_eq!(f.value(y).name, "0");
    }
}
