//! Shape inference. (Being written.)

use crate::attr::Attrs;
use crate::ops::OpKind;
use crate::types::TensorType;

#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct ShapeError(pub String);

pub fn infer(_kind: OpKind, _attrs: &Attrs, _operands: &[TensorType]) -> Result<Vec<TensorType>, ShapeError> {
    todo!("shape inference")
}
