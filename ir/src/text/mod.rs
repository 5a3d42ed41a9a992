//! The textual form of ppir: a printer and a separate parser that round-trip exactly.
//! (Being written: see printer.rs / parser.rs.)

use crate::module::Module;

#[derive(Clone, Debug, Default)]
pub struct PrintOptions {
    /// Print weights with more elements than this as `elided` (lossy, for humans).
    pub elide_weights_over: Option<usize>,
}

#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{line}:{col}: {message}")]
pub struct ParseError {
    pub line: usize,
    pub col: usize,
    pub message: String,
}

pub fn print_module(_m: &Module, _opts: &PrintOptions) -> String {
    todo!("printer")
}

pub fn parse_module(_src: &str) -> Result<Module, ParseError> {
    todo!("parser")
}
