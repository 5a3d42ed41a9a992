//! The verifier. (Being written.)

use crate::module::Module;

#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct VerifyError {
    pub message: String,
}

pub fn verify_module(_m: &Module) -> Result<(), Vec<VerifyError>> {
    todo!("verifier")
}
