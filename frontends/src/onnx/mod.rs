//! ONNX import: a `.onnx` file (protobuf `ModelProto`) into a [`ppir::Module`] with one
//! function `main`.
//!
//! - Graph inputs that are not initializers become `Input` arguments, in graph order.
//! - Float initializers become `Param` arguments (`State` for batch-norm running
//!   statistics) whose initial values are in [`Module::weights`](ppir::Module), named after the
//!   initializer (sanitised to `[A-Za-z0-9_.$/-]` and made unique); only initializers some
//!   op uses become arguments.
//! - Non-float initializers and `Constant` nodes are constants: shape computations on them
//!   are folded at import time, and they become `constant` ops where a run-time op uses them.
//! - Graph outputs are the function's results, in order.
//! - Every op carries `loc` = the ONNX node name (`OpType_index` for unnamed nodes); result
//!   types come from [`ppir::shape::infer`].
//!
//! A symbolic (or unknown, or negative) first dimension of an input is the symbolic batch
//! size `?` unless [`ImportOptions::batch`] binds it; any other symbolic dimension must be
//! given with [`ImportOptions::input_shapes`].
//!
//! ```
//! use ppcc_frontends::onnx::{import_onnx, ImportOptions};
//! // Bytes that are not a model give an error, never a panic.
//! assert!(import_onnx(b"\xff\xff\xff", &ImportOptions::default()).is_err());
//! ```

pub mod attrs;
pub mod conform;
mod error;
mod external;
mod import;
mod lower;
pub mod proto;
pub mod tensor;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use ppir::{Module, Tensor};
use prost::Message;

pub use error::OnnxError;
pub use external::{resolve_location, LocationError};
pub use import::{import_model, model_opset, Imported};
pub use lower::{
    refused_version, supported_ops_list, NewVersion, MAX_OPSET, MIN_OPSET, SUPPORTED_OPS,
    VERSIONS_AFTER_25,
};

/// How to import a model.
#[derive(Clone, Debug, Default)]
pub struct ImportOptions {
    /// Bind a symbolic first (batch) dimension of the inputs to this size.
    pub batch: Option<u64>,
    /// Full static shapes of inputs, by ONNX input name (needed for symbolic dimensions
    /// other than the first).
    pub input_shapes: HashMap<String, Vec<u64>>,
    /// The folder that external tensor data is read from (set by [`import_onnx_file`]).
    pub model_dir: Option<PathBuf>,
    /// Inputs whose values are known at import time, by ONNX name: they become constants
    /// (and are folded), not arguments. For inputs that only feed static attributes,
    /// e.g. the target shape of an `Expand`.
    pub input_values: HashMap<String, Tensor>,
}

/// Decode the protobuf of a model.
pub fn decode_model(bytes: &[u8]) -> Result<proto::ModelProto, OnnxError> {
    Ok(proto::ModelProto::decode(bytes)?)
}

/// Import a model from its bytes. External data is read from `opts.model_dir`.
pub fn import_onnx(bytes: &[u8], opts: &ImportOptions) -> Result<Module, OnnxError> {
    Ok(import_model(&decode_model(bytes)?, opts)?.module)
}

/// Import a model file; external data is read from the file's folder.
pub fn import_onnx_file(path: impl AsRef<Path>, opts: &ImportOptions) -> Result<Module, OnnxError> {
    Ok(import_onnx_file_full(path, opts)?.module)
}

/// Like [`import_onnx_file`], also returning how inputs and outputs map to ONNX names.
pub fn import_onnx_file_full(
    path: impl AsRef<Path>,
    opts: &ImportOptions,
) -> Result<Imported, OnnxError> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|error| OnnxError::Io {
        path: path.to_path_buf(),
        error,
    })?;
    let mut opts = opts.clone();
    if opts.model_dir.is_none() {
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        opts.model_dir = Some(dir.to_path_buf());
    }
    import_model(&decode_model(&bytes)?, &opts)
}
