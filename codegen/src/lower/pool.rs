//! Pooling: `max_pool`, `avg_pool`, `global_avg_pool`, `global_max_pool`, `max_pool_grad`,
//! `avg_pool_grad`. Not lowered yet.

use super::{Emitter, LowerError, OpView};

pub fn lower(_e: &mut Emitter, op: &OpView) -> Result<Vec<String>, LowerError> {
    Err(op.unsupported(""))
}
