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

use ppir::{Function, OpId, Use, ValueId};

use super::elementwise::elementwise_operands;
use super::Emitter;

/// Which ops of a function are computed inside a consumer's generic.
#[derive(Debug, Default)]
pub struct Plan {
    /// Indexed by op id: inlined into its single consumer.
    inlined: Vec<bool>,
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
        Plan { inlined }
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
