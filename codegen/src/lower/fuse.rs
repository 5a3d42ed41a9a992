//! Fusion of elementwise chains into one `linalg.generic`.
//!
//! An elementwise op is *inlined* into its consumer, computed inside the consumer's
//! generic body instead of materialising a tensor, when
//!
//! - it has one result, used exactly once (one operand slot of one op; not returned),
//! - that use is an elementwise operand of an elementwise op (not `dropout`'s key),
//! - and the consumer's result has the same shape as the inlined op's result.
//!
//! Because every element of the inlined result is then read exactly once, fusion never
//! duplicates work; a value with two or more uses stays a tensor. The op at the top of a
//! fused tree (the *root*) is emitted at its own position with the inlined ops' operands
//! as extra generic inputs, each broadcast to the root's shape (see
//! [`super::elementwise::lower_root`]); inlined ops emit nothing where they stand. Each
//! inlined op still yields a value of its own dtype, rounded as it would be on its own, so
//! fused and unfused code compute the same numbers.

use ppir::{DType, Function, OpId, OpKind, Use, ValueId};

use super::elementwise::elementwise_operands;
use super::Emitter;

/// Which ops of a function are computed inside a consumer's generic, and which float
/// matrix products absorb the bias `add` that follows them.
#[derive(Debug, Default)]
pub struct Plan {
    /// Indexed by op id: inlined into its single consumer.
    inlined: Vec<bool>,
    /// Indexed by op id of an `add`: the `matmul` whose only use it is, computed by the
    /// add as one GEMM with the bias as its `C` (the matmul emits nothing itself).
    bias_of: Vec<Option<OpId>>,
    /// Indexed by op id: a `matmul` computed by its bias `add`.
    absorbed: Vec<bool>,
}

impl Plan {
    /// Decide the fusion of every op of the function `e` emits.
    pub fn new(e: &Emitter) -> Plan {
        let f = e.f;
        let mut inlined = vec![false; f.num_op_slots()];
        for &p in f.ops() {
            let op = f.op(p);
            if !op.kind.is_elementwise() || op.results().len() != 1 {
                continue;
            }
            let v = op.results()[0];
            let &[Use::Operand(c, slot)] = f.users(v) else {
                continue;
            };
            let consumer = f.op(c);
            if consumer.is_removed()
                || !consumer.kind.is_elementwise()
                || slot >= elementwise_operands(consumer.kind, consumer.operands().len())
            {
                continue;
            }
            let Some(&r) = consumer.results().first() else {
                continue;
            };
            match (e.shape(v), e.shape(r)) {
                (Ok(a), Ok(b)) if a == b => {}
                _ => continue,
            }
            if let Some(x) = inlined.get_mut(p.index()) {
                *x = true;
            }
        }
        let mut plan = Plan {
            inlined,
            bias_of: vec![None; f.num_op_slots()],
            absorbed: vec![false; f.num_op_slots()],
        };
        for &a in f.ops() {
            if let Some(mm) = plan.matmul_bias(e, a) {
                plan.bias_of[a.index()] = Some(mm);
                plan.absorbed[mm.index()] = true;
            }
        }
        plan
    }

    /// `Some(matmul)` when op `a` is `add(matmul(x, w), bias)` (either order) that one GEMM
    /// computes with `bias` as its `C`: a float matmul (f32/f64) of an `x` of rank >= 2 by a
    /// matrix `w`, used only by this add; a bias of the same dtype that varies at most
    /// along the last dimension; the add's result of the matmul's shape; and nothing fused
    /// into the add (it stands alone).
    fn matmul_bias(&self, e: &Emitter, a: OpId) -> Option<OpId> {
        let f = e.f;
        let add = f.op(a);
        if add.kind != OpKind::Add
            || add.operands().len() != 2
            || add.results().len() != 1
            || self.is_inlined(a)
        {
            return None;
        }
        let r = add.results()[0];
        let d = e.dtype(r);
        if !matches!(d, DType::F32 | DType::F64) {
            return None;
        }
        let out = e.shape(r).ok()?;
        for j in 0..2 {
            let (v, bias) = (add.operands()[j], add.operands()[1 - j]);
            let Some(mm) = f.producer(v) else { continue };
            let m = f.op(mm);
            if m.kind != OpKind::MatMul
                || m.operands().len() != 2
                || !matches!(f.users(v), [Use::Operand(c, _)] if *c == a)
                || self.inlined_producer(f, bias).is_some()
            {
                continue;
            }
            let (x, w) = (m.operands()[0], m.operands()[1]);
            let (Ok(xs), Ok(ws), Ok(bs), Ok(vs)) =
                (e.shape(x), e.shape(w), e.shape(bias), e.shape(v))
            else {
                continue;
            };
            let same_type = [x, w, bias, v].iter().all(|&u| e.dtype(u) == d);
            let bias_ok = bs.len() <= out.len()
                && bs.iter().rev().skip(1).all(|&s| s == 1)
                && bs.last().is_none_or(|&s| s == 1 || Some(&s) == out.last());
            if same_type && xs.len() >= 2 && ws.len() == 2 && vs == out && bias_ok {
                return Some(mm);
            }
        }
        None
    }

    /// The matmul that the bias add `id` computes, if any.
    pub fn bias_matmul(&self, id: OpId) -> Option<OpId> {
        self.bias_of.get(id.index()).copied().flatten()
    }

    /// Whether matmul `id` is computed by its bias add (and emits nothing itself).
    pub fn is_absorbed(&self, id: OpId) -> bool {
        self.absorbed.get(id.index()).copied().unwrap_or(false)
    }

    /// Whether op `id` is computed inside its consumer (and emits nothing itself).
    pub fn is_inlined(&self, id: OpId) -> bool {
        self.inlined.get(id.index()).copied().unwrap_or(false)
    }

    /// The inlined op producing `v`, if any.
    pub fn inlined_producer(&self, f: &Function, v: ValueId) -> Option<OpId> {
        f.producer(v).filter(|&p| self.is_inlined(p))
    }

    /// How many ops are inlined.
    pub fn count(&self) -> usize {
        self.inlined.iter().filter(|&&x| x).count()
    }
}
