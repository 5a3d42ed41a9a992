//! Normalisations, softmax and the cross-entropy loss. Not lowered yet.

use super::{Emitter, LowerError, OpView};

pub fn lower(_e: &mut Emitter, op: &OpView) -> Result<Vec<String>, LowerError> {
    Err(op.unsupported(""))
}
