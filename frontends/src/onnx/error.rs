//! What can go wrong while importing an ONNX model. Every message names the place (node,
//! input, tensor, file) and what was expected.

use std::path::PathBuf;

use super::attrs::NodeAttrError;
use super::external::LocationError;
use super::lower::{supported_ops_list, MAX_OPSET, MIN_OPSET};
use super::tensor::TensorDataError;

#[derive(Debug, thiserror::Error)]
pub enum OnnxError {
    /// The bytes are not a protobuf `ModelProto`. (The cause is part of the message, not
    /// an error `source`, so `{:#}` chains do not print it twice.)
    #[error("not a valid ONNX model: {0}")]
    Decode(prost::DecodeError),

    #[error("cannot read {}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },

    /// The model decodes but breaks a rule of the ONNX spec (missing graph, undefined value...).
    #[error("invalid model: {0}")]
    Invalid(String),

    #[error("model imports opset {opset} of the default ONNX domain; ppcc supports opsets {MIN_OPSET} to {MAX_OPSET}")]
    UnsupportedOpset { opset: i64 },

    /// An op type ppcc does not map.
    #[error(
        "node {node:?} ({}, opset {opset}): unsupported op; ppcc supports opsets {MIN_OPSET} to {MAX_OPSET} of the default domain and these ops: {}",
        qualified(domain, op_type), supported_ops_list()
    )]
    UnsupportedOp {
        node: String,
        op_type: String,
        domain: String,
        opset: i64,
    },

    /// An op whose version at the model's opset ppcc does not implement (it changed after
    /// opset 25; see `VERSIONS_AFTER_25`): refused rather than read with older semantics.
    #[error("node {node:?} ({op_type}, opset {opset}): unsupported op version: {op_type} version {version} (opsets {version} and later) is not implemented")]
    UnsupportedOpVersion {
        node: String,
        op_type: String,
        /// The op's version in effect at `opset`.
        version: i64,
        opset: i64,
    },

    /// A supported op used in a way ppcc does not map (an attribute value, a non-constant
    /// input that must be static, a sequence type...).
    #[error("node {node:?} ({op_type}, opset {opset}): unsupported: {message}")]
    Unsupported {
        node: String,
        op_type: String,
        opset: i64,
        message: String,
    },

    /// A graph input that a node needs at import time (a shape, scales, axes...) and that
    /// is computed at run time; importing with its value given
    /// (`ImportOptions::input_values`) folds it.
    #[error("node {node:?} ({op_type}, opset {opset}): unsupported: {message}")]
    InputValueNeeded {
        node: String,
        op_type: String,
        opset: i64,
        /// The graph input's name.
        input: String,
        message: String,
    },

    /// A node attribute of the wrong kind (or unreadable).
    #[error("node {node:?} ({op_type}, opset {opset}): {source}")]
    Attribute {
        node: String,
        op_type: String,
        opset: i64,
        source: NodeAttrError,
    },

    /// A node that breaks its op's rules (wrong input count, inconsistent shapes...).
    #[error("node {node:?} ({op_type}, opset {opset}): {message}")]
    Node {
        node: String,
        op_type: String,
        opset: i64,
        message: String,
    },

    /// A value with two writers (two nodes, a node and a graph input or initializer, two
    /// initializers, an input listed twice): ONNX graphs assign every value once, and
    /// onnxruntime refuses such models.
    #[error("invalid model: value `{value}` is assigned twice, by {first} and by {second}; ONNX graphs assign each value once")]
    Reassigned {
        value: String,
        /// `the graph input`, `an initializer`, `node "fc1" (Gemm)`.
        first: String,
        second: String,
    },

    /// A graph input that also has an initializer (its default value) of another type.
    #[error("invalid model: graph input `{name}` is declared {declared} but its initializer is {initializer}")]
    InitializerType {
        name: String,
        declared: String,
        initializer: String,
    },

    /// A graph input whose shape is not fully known.
    #[error("input `{input}`: {message}")]
    InputShape { input: String, message: String },

    /// A graph input or output ppcc cannot represent (sequence, map, string...).
    #[error("{what} `{name}`: unsupported: {message}")]
    UnsupportedValue {
        what: &'static str,
        name: String,
        message: String,
    },

    /// An initializer or constant tensor that cannot be decoded.
    #[error("tensor `{tensor}`: {message}")]
    Tensor { tensor: String, message: String },

    /// An initializer or constant tensor whose data does not fit its shape and type.
    #[error("tensor `{tensor}`: {source}")]
    TensorData {
        tensor: String,
        source: TensorDataError,
    },

    #[error("external data of tensor `{tensor}`: {message}")]
    ExternalData { tensor: String, message: String },

    /// The `location` of a tensor's external data names no file inside the model's folder.
    #[error("external data of tensor `{tensor}`: {source}")]
    ExternalLocation {
        tensor: String,
        source: LocationError,
    },
}

fn qualified(domain: &str, op_type: &str) -> String {
    if domain.is_empty() || domain == "ai.onnx" {
        op_type.to_string()
    } else {
        format!("{domain}.{op_type}")
    }
}

impl OnnxError {
    /// Whether the model is valid but uses something ppcc does not support (as opposed to a
    /// broken model or an I/O failure). `ppcc conform` reports these as `unsupported`.
    pub fn is_unsupported(&self) -> bool {
        matches!(
            self,
            OnnxError::UnsupportedOpset { .. }
                | OnnxError::UnsupportedOp { .. }
                | OnnxError::UnsupportedOpVersion { .. }
                | OnnxError::Unsupported { .. }
                | OnnxError::InputValueNeeded { .. }
                | OnnxError::UnsupportedValue { .. }
        )
    }

    /// The graph input whose value the import needs, if that is what went wrong.
    pub fn input_value_needed(&self) -> Option<&str> {
        match self {
            OnnxError::InputValueNeeded { input, .. } => Some(input),
            _ => None,
        }
    }

    /// A one-line reason without the long list of supported ops (for tables).
    pub fn short(&self) -> String {
        match self {
            OnnxError::UnsupportedOp {
                node,
                op_type,
                domain,
                opset,
            } => {
                format!(
                    "node {node:?} ({}, opset {opset}): unsupported op",
                    qualified(domain, op_type)
                )
            }
            e => e.to_string(),
        }
    }
}

impl From<prost::DecodeError> for OnnxError {
    fn from(e: prost::DecodeError) -> Self {
        OnnxError::Decode(e)
    }
}
