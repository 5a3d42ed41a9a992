//! StableHLO import: a module as JAX prints it (`jax.jit(f).lower(*args).as_text()`, the
//! pretty syntax) or in MLIR's generic op form, into a [`ppir::Module`] with one function
//! `main`.
//!
//! - One reader ([`parse`]) takes both forms into one op list; one lowering ([`lower`])
//!   builds ppir from it. Private functions reached through `func.call` are inlined.
//! - `@main`'s arguments are positional: argument `i` is named `arg<i>`. Those given in
//!   the parameters (keyed `arg<i>`, e.g. from `--params P.npz`) become `Param`
//!   arguments with those initial values; the others are `Input`s. Results are named
//!   `out<i>`.
//! - Shapes are static; the exported batch is the model's batch unless
//!   [`import_stablehlo_with_batch`] rebinds it: dim 0 of the data inputs is traced
//!   through the ops, and an op that fixes it (a reduction over it, a reshape that merges
//!   it with another dim, a constant or `iota` shaped by it) is an error naming the op.
//! - Portable artifacts (VHLO bytecode) are refused with a message that says how to
//!   produce text instead.
//!
//! Every error names the file, the line and column, and the op.
//!
//! ```
//! use std::collections::BTreeMap;
//! use ppcc_frontends::stablehlo::import_stablehlo;
//! let text = "func.func @main(%arg0: tensor<2xf32>) -> tensor<2xf32> {
//!   %0 = stablehlo.negate %arg0 : tensor<2xf32>
//!   return %0 : tensor<2xf32>
//! }";
//! let imported = import_stablehlo(text.as_bytes(), "m.mlir", &BTreeMap::new()).unwrap();
//! assert_eq!(imported.inputs, ["arg0"]);
//! // Malformed text is an error with a location, never a panic.
//! let e = import_stablehlo(b"func.func @main(", "m.mlir", &BTreeMap::new()).unwrap_err();
//! assert!(e.to_string().starts_with("m.mlir:1:"));
//! ```

mod batch;
mod lower;
pub mod parse;

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use ppir::Tensor;

use crate::onnx::Imported;

/// A position in the text (1-based).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Pos {
    pub line: u32,
    pub col: u32,
}

impl fmt::Display for Pos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.col)
    }
}

/// What went wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The text does not parse.
    Syntax,
    /// Valid StableHLO that ppcc does not import (an op, or a form of one).
    Unsupported,
    /// The module is inconsistent (an unknown value, a wrong type).
    Invalid,
    /// The parameters do not match `@main`'s signature.
    Params,
    /// A portable artifact (MLIR bytecode).
    Bytecode,
    /// The file cannot be read.
    Io,
}

/// An import error: the file, where, which op, and what.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub struct StableHloError {
    pub kind: ErrorKind,
    pub file: String,
    pub pos: Option<Pos>,
    /// The op, e.g. `stablehlo.custom_call`.
    pub op: Option<String>,
    pub message: String,
}

impl fmt::Display for StableHloError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.file.is_empty() {
            write!(f, "{}:", self.file)?;
        }
        if let Some(p) = self.pos {
            write!(f, "{p}:")?;
        }
        if !self.file.is_empty() || self.pos.is_some() {
            f.write_str(" ")?;
        }
        if let Some(op) = &self.op {
            write!(f, "`{op}`: ")?;
        }
        f.write_str(&self.message)
    }
}

impl StableHloError {
    pub(crate) fn syntax(pos: Pos, message: impl Into<String>) -> Self {
        StableHloError {
            kind: ErrorKind::Syntax,
            file: String::new(),
            pos: Some(pos),
            op: None,
            message: message.into(),
        }
    }

    /// A region whose block has no `return` (the parser accepts it; lowering cannot).
    pub(crate) fn missing_return() -> Self {
        StableHloError {
            kind: ErrorKind::Invalid,
            file: String::new(),
            pos: None,
            op: None,
            message: "a block does not end with a return".into(),
        }
    }

    pub(crate) fn at(kind: ErrorKind, pos: Pos, op: &str, message: impl Into<String>) -> Self {
        StableHloError {
            kind,
            file: String::new(),
            pos: Some(pos),
            op: Some(op.to_string()),
            message: message.into(),
        }
    }

    pub(crate) fn params(message: impl Into<String>) -> Self {
        StableHloError {
            kind: ErrorKind::Params,
            file: String::new(),
            pos: None,
            op: None,
            message: message.into(),
        }
    }

    /// Whether the error is an unsupported op or form (not a broken file).
    pub fn is_unsupported(&self) -> bool {
        self.kind == ErrorKind::Unsupported
    }
}

/// The first bytes of MLIR bytecode (`ML\xefR`): what `jax.export` serializes (VHLO).
pub const BYTECODE_MAGIC: &[u8] = b"ML\xefR";

/// Whether `bytes` look like a StableHLO/MLIR module (text or bytecode) rather than an
/// ONNX protobuf: MLIR bytecode, or text that starts with `module`, `func.func`, `"`
/// (the generic form), `#` (attribute aliases) or a `//` comment.
pub fn looks_like_mlir(bytes: &[u8]) -> bool {
    if bytes.starts_with(BYTECODE_MAGIC) {
        return true;
    }
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(256)]);
    let t = text.trim_start();
    t.starts_with("module")
        || t.starts_with("func.func")
        || t.starts_with("\"builtin.module\"")
        || t.starts_with("\"func.func\"")
        || t.starts_with("#")
        || t.starts_with("//")
}

/// Import a module's bytes; `file` names it in errors; `params` are the trainable
/// arguments of `@main`, keyed `arg<i>`.
pub fn import_stablehlo(
    bytes: &[u8],
    file: &str,
    params: &BTreeMap<String, Tensor>,
) -> Result<Imported, StableHloError> {
    import_stablehlo_with_batch(bytes, file, params, None)
}

/// As [`import_stablehlo`], with the batch (dim 0 of every data input) rebound to `batch`
/// rows when given: the static shapes are re-derived for that batch, or the error names
/// the op that fixes the exported batch and its location.
pub fn import_stablehlo_with_batch(
    bytes: &[u8],
    file: &str,
    params: &BTreeMap<String, Tensor>,
    batch: Option<u64>,
) -> Result<Imported, StableHloError> {
    let with_file = |mut e: StableHloError| {
        e.file = file.to_string();
        e
    };
    if bytes.starts_with(BYTECODE_MAGIC) {
        return Err(with_file(StableHloError {
            kind: ErrorKind::Bytecode,
            file: String::new(),
            pos: None,
            op: None,
            message: "this is MLIR bytecode (a portable VHLO artifact, as `jax.export` serializes), which ppcc does not read; write the StableHLO text instead: `open('m.mlir', 'w').write(jax.jit(f).lower(*args).as_text())`".into(),
        }));
    }
    let text = std::str::from_utf8(bytes).map_err(|e| {
        with_file(StableHloError {
            kind: ErrorKind::Syntax,
            file: String::new(),
            pos: None,
            op: None,
            message: format!("the file is not UTF-8 text ({e}); expected StableHLO text"),
        })
    })?;
    let ops = parse::parse(text).map_err(with_file)?;
    lower::lower_module(ops, params, batch).map_err(with_file)
}

/// Import a module file (see [`import_stablehlo`]).
pub fn import_stablehlo_file(
    path: &Path,
    params: &BTreeMap<String, Tensor>,
) -> Result<Imported, StableHloError> {
    let bytes = std::fs::read(path).map_err(|e| StableHloError {
        kind: ErrorKind::Io,
        file: path.display().to_string(),
        pos: None,
        op: None,
        message: format!("cannot read the file: {e}"),
    })?;
    import_stablehlo(&bytes, &path.display().to_string(), params)
}

#[cfg(test)]
mod tests;
