//! `canonicalize`: constant folding, removal of no-op ops, dead-code elimination.
//!
//! Folding evaluates an op whose operands are all `pp.constant` results with the reference
//! interpreter (so folding means exactly what running means) and replaces it with
//! constants. No-op removal forwards the operand of an op that cannot change its input
//! (identity, inference-mode dropout, a reshape/cast/expand to the same type, ...). Dead
//! code is every op without side effects whose results are unused. The three repeat until
//! nothing changes.

use ppir::interp::{eval_op, InterpOptions};
use ppir::ops::attrs::{ConstantAttrs, DropoutAttrs, TransposeAttrs};
use ppir::ops::OpAttrs;
use ppir::{Function, Module, NewOp, OpId, OpKind, Tensor};

use crate::{Pass, PassError};

/// The canonicalize pass.
#[derive(Clone, Debug)]
pub struct Canonicalize {
    /// Do not fold an op whose results together have more elements than this (folding an
    /// `expand` of a scalar could otherwise bloat the module).
    pub max_fold_elements: usize,
}

impl Default for Canonicalize {
    fn default() -> Self {
        Canonicalize {
            max_fold_elements: 1 << 16,
        }
    }
}

impl Pass for Canonicalize {
    fn name(&self) -> &'static str {
        "canonicalize"
    }

    fn run(&self, module: &mut Module) -> Result<(), PassError> {
        for f in &mut module.functions {
            self.run_function(f);
        }
        Ok(())
    }
}

/// Statistics of one run, for tests and `--verbose` output.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CanonicalizeStats {
    pub folded: usize,
    pub forwarded: usize,
    pub removed_dead: usize,
}

impl Canonicalize {
    /// Canonicalize one function to a fixed point.
    pub fn run_function(&self, f: &mut Function) -> CanonicalizeStats {
        let mut stats = CanonicalizeStats::default();
        loop {
            let before = stats;
            for op in f.ops().to_vec() {
                if f.op(op).is_removed() {
                    continue;
                }
                if self.forward_noop(f, op) {
                    stats.forwarded += 1;
                } else if self.fold(f, op) {
                    stats.folded += 1;
                }
            }
            stats.removed_dead += remove_dead(f);
            if stats == before {
                return stats;
            }
        }
    }

    /// If `op` returns its operand unchanged, point its users at the operand.
    fn forward_noop(&self, f: &mut Function, op: OpId) -> bool {
        let data = f.op(op);
        if data.operands().is_empty() || data.results().len() != 1 {
            return false;
        }
        let (x, y) = (data.operands()[0], data.results()[0]);
        let same_type = f.ty(x) == f.ty(y);
        let noop = match data.kind {
            OpKind::Identity => true,
            OpKind::Dropout => !DropoutAttrs::of(&data.attrs).is_ok_and(|d| d.training),
            OpKind::Reshape
            | OpKind::Flatten
            | OpKind::Squeeze
            | OpKind::Unsqueeze
            | OpKind::Expand
            | OpKind::Cast
            | OpKind::Tile => true,
            OpKind::Concat => data.operands().len() == 1,
            OpKind::Transpose => match TransposeAttrs::of(&data.attrs) {
                Ok(TransposeAttrs { perm: Some(p) }) => {
                    p.iter().enumerate().all(|(i, &a)| a == i as i64)
                }
                _ => false,
            },
            _ => false,
        };
        // Only when the types agree exactly: a reshape that changes the type is real work.
        if !(noop && same_type) || f.users(y).is_empty() {
            return false;
        }
        f.replace_all_uses(y, x);
        true
    }

    /// Evaluate `op` if all its operands are constants; replace its results by constants.
    fn fold(&self, f: &mut Function, op: OpId) -> bool {
        let data = f.op(op);
        if data.kind == OpKind::Constant
            || data.kind.has_side_effect()
            || data.operands().is_empty()
            || data.results().iter().all(|&r| f.users(r).is_empty())
        {
            return false;
        }
        let mut inputs: Vec<&Tensor> = Vec::with_capacity(data.operands().len());
        for &v in data.operands() {
            match constant_value(f, v) {
                Some(t) => inputs.push(t),
                None => return false,
            }
        }
        let types: Vec<_> = data.results().iter().map(|&r| f.ty(r).clone()).collect();
        let total: u64 = match types.iter().map(|t| t.num_elements()).sum::<Option<u64>>() {
            Some(n) => n,
            None => return false,
        };
        if total as usize > self.max_fold_elements {
            return false;
        }
        // An op that fails to evaluate is left alone: running it would fail the same way,
        // and that error belongs to run time with the op's location.
        let Ok(values) = eval_op(
            data.kind,
            &data.attrs,
            &inputs,
            &types,
            &InterpOptions::default(),
        ) else {
            return false;
        };
        let (stage, phase, loc) = (data.stage, data.phase, data.loc.clone());
        let results = data.results().to_vec();
        for ((r, value), ty) in results.into_iter().zip(values).zip(types) {
            let mut new = NewOp::new(OpKind::Constant, vec![], vec![ty])
                .attrs(ConstantAttrs { value }.to_attrs());
            new.stage = stage;
            new.phase = phase;
            new.loc = loc.clone();
            let c = f.insert_op_before(op, new);
            let cv = f.op(c).results()[0];
            f.replace_all_uses(r, cv);
        }
        f.remove_op(op);
        true
    }
}

/// The tensor of a `pp.constant` result.
fn constant_value(f: &Function, v: ppir::ValueId) -> Option<&Tensor> {
    let op = f.op(f.producer(v)?);
    if op.kind != OpKind::Constant {
        return None;
    }
    ConstantAttrs::value_ref(&op.attrs).ok()
}

/// Remove side-effect-free ops whose results are unused; returns how many.
fn remove_dead(f: &mut Function) -> usize {
    let mut removed = 0;
    for op in f.ops().to_vec().into_iter().rev() {
        let data = f.op(op);
        if !data.kind.has_side_effect() && data.results().iter().all(|&r| f.users(r).is_empty()) {
            f.remove_op(op);
            removed += 1;
        }
    }
    removed
}
