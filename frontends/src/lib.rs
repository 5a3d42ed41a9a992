//! Frontends: source formats into ppir.
//!
//! - [`onnx`]: ONNX models (`.onnx` protobuf files) into a [`ppir::Module`], and the
//!   conformance runner over ONNX test-data folders ([`onnx::conform`]).
//! - [`stablehlo`]: StableHLO modules (the text JAX prints, pretty or generic form) into a
//!   [`ppir::Module`].

pub mod onnx;
pub mod onnx_export;
pub mod stablehlo;

pub use onnx::{import_onnx, import_onnx_file, ImportOptions, OnnxError};
