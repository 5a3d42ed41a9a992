//! ONNX protobuf messages, written by hand from the ONNX IR specification (`onnx.proto`,
//! IR version 10) and decoded with `prost`.
//!
//! Only what the importer reads is modelled with care; every message that can appear inside a
//! model is declared so that decoding walks (and bounds-checks) it, and fields we never read
//! are left out: `prost` skips unknown fields. Field numbers are the ones of the spec.
//! Optional scalars are plain fields (proto3 style, zero when absent) except where presence
//! matters (`TensorShapeProto.Dimension.value`, `TypeProto.value`), which are `oneof`s.

#![allow(missing_docs)]

/// `ModelProto`: the top-level container of an `.onnx` file.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelProto {
    #[prost(int64, tag = "1")]
    pub ir_version: i64,
    #[prost(message, repeated, tag = "8")]
    pub opset_import: Vec<OperatorSetIdProto>,
    #[prost(string, tag = "2")]
    pub producer_name: String,
    #[prost(string, tag = "3")]
    pub producer_version: String,
    #[prost(string, tag = "4")]
    pub domain: String,
    #[prost(int64, tag = "5")]
    pub model_version: i64,
    #[prost(string, tag = "6")]
    pub doc_string: String,
    #[prost(message, optional, tag = "7")]
    pub graph: Option<GraphProto>,
    #[prost(message, repeated, tag = "14")]
    pub metadata_props: Vec<StringStringEntryProto>,
    #[prost(message, repeated, tag = "25")]
    pub functions: Vec<FunctionProto>,
}

/// `OperatorSetIdProto`: one entry of a model's `opset_import`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct OperatorSetIdProto {
    /// `""` and `"ai.onnx"` both name the default operator set.
    #[prost(string, tag = "1")]
    pub domain: String,
    #[prost(int64, tag = "2")]
    pub version: i64,
}

/// `StringStringEntryProto`: a key/value pair (metadata, external-data locations).
#[derive(Clone, PartialEq, prost::Message)]
pub struct StringStringEntryProto {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `TensorAnnotation`: quantization annotations of a graph (decoded, unused).
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorAnnotation {
    #[prost(string, tag = "1")]
    pub tensor_name: String,
    #[prost(message, repeated, tag = "2")]
    pub quant_parameter_tensor_names: Vec<StringStringEntryProto>,
}

/// `GraphProto`: nodes in topological order, initializers, inputs, outputs, value infos.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GraphProto {
    #[prost(message, repeated, tag = "1")]
    pub node: Vec<NodeProto>,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(message, repeated, tag = "5")]
    pub initializer: Vec<TensorProto>,
    #[prost(message, repeated, tag = "15")]
    pub sparse_initializer: Vec<SparseTensorProto>,
    #[prost(string, tag = "10")]
    pub doc_string: String,
    #[prost(message, repeated, tag = "11")]
    pub input: Vec<ValueInfoProto>,
    #[prost(message, repeated, tag = "12")]
    pub output: Vec<ValueInfoProto>,
    #[prost(message, repeated, tag = "13")]
    pub value_info: Vec<ValueInfoProto>,
    #[prost(message, repeated, tag = "14")]
    pub quantization_annotation: Vec<TensorAnnotation>,
    #[prost(message, repeated, tag = "16")]
    pub metadata_props: Vec<StringStringEntryProto>,
}

/// `NodeProto`: one operator application. Empty input names are omitted optional inputs.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeProto {
    #[prost(string, repeated, tag = "1")]
    pub input: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    pub output: Vec<String>,
    #[prost(string, tag = "3")]
    pub name: String,
    #[prost(string, tag = "4")]
    pub op_type: String,
    #[prost(string, tag = "7")]
    pub domain: String,
    #[prost(string, tag = "8")]
    pub overload: String,
    #[prost(message, repeated, tag = "5")]
    pub attribute: Vec<AttributeProto>,
    #[prost(string, tag = "6")]
    pub doc_string: String,
    #[prost(message, repeated, tag = "9")]
    pub metadata_props: Vec<StringStringEntryProto>,
}

/// `AttributeProto.AttributeType` values.
pub mod attribute_type {
    pub const UNDEFINED: i32 = 0;
    pub const FLOAT: i32 = 1;
    pub const INT: i32 = 2;
    pub const STRING: i32 = 3;
    pub const TENSOR: i32 = 4;
    pub const GRAPH: i32 = 5;
    pub const FLOATS: i32 = 6;
    pub const INTS: i32 = 7;
    pub const STRINGS: i32 = 8;
    pub const TENSORS: i32 = 9;
    pub const GRAPHS: i32 = 10;
    pub const SPARSE_TENSOR: i32 = 11;
    pub const SPARSE_TENSORS: i32 = 12;
    pub const TYPE_PROTO: i32 = 13;
    pub const TYPE_PROTOS: i32 = 14;
}

/// `AttributeProto`: a named attribute; `type` says which value field is meant.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AttributeProto {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "21")]
    pub ref_attr_name: String,
    #[prost(string, tag = "13")]
    pub doc_string: String,
    /// One of [`attribute_type`]; 0 in files from before IR version 2 (infer from the fields).
    #[prost(int32, tag = "20")]
    pub r#type: i32,
    #[prost(float, tag = "2")]
    pub f: f32,
    #[prost(int64, tag = "3")]
    pub i: i64,
    #[prost(bytes = "vec", tag = "4")]
    pub s: Vec<u8>,
    #[prost(message, optional, tag = "5")]
    pub t: Option<TensorProto>,
    #[prost(message, optional, boxed, tag = "6")]
    pub g: Option<Box<GraphProto>>,
    #[prost(message, optional, tag = "22")]
    pub sparse_tensor: Option<SparseTensorProto>,
    #[prost(message, optional, tag = "14")]
    pub tp: Option<TypeProto>,
    #[prost(float, repeated, tag = "7")]
    pub floats: Vec<f32>,
    #[prost(int64, repeated, tag = "8")]
    pub ints: Vec<i64>,
    #[prost(bytes = "vec", repeated, tag = "9")]
    pub strings: Vec<Vec<u8>>,
    #[prost(message, repeated, tag = "10")]
    pub tensors: Vec<TensorProto>,
    #[prost(message, repeated, tag = "11")]
    pub graphs: Vec<GraphProto>,
    #[prost(message, repeated, tag = "23")]
    pub sparse_tensors: Vec<SparseTensorProto>,
    #[prost(message, repeated, tag = "15")]
    pub type_protos: Vec<TypeProto>,
}

/// `ValueInfoProto`: a value's name and type (graph inputs, outputs, `value_info`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueInfoProto {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub r#type: Option<TypeProto>,
    #[prost(string, tag = "3")]
    pub doc_string: String,
    #[prost(message, repeated, tag = "4")]
    pub metadata_props: Vec<StringStringEntryProto>,
}

/// `TensorProto.DataType` values.
pub mod data_type {
    pub const UNDEFINED: i32 = 0;
    pub const FLOAT: i32 = 1;
    pub const UINT8: i32 = 2;
    pub const INT8: i32 = 3;
    pub const UINT16: i32 = 4;
    pub const INT16: i32 = 5;
    pub const INT32: i32 = 6;
    pub const INT64: i32 = 7;
    pub const STRING: i32 = 8;
    pub const BOOL: i32 = 9;
    pub const FLOAT16: i32 = 10;
    pub const DOUBLE: i32 = 11;
    pub const UINT32: i32 = 12;
    pub const UINT64: i32 = 13;
    pub const COMPLEX64: i32 = 14;
    pub const COMPLEX128: i32 = 15;
    pub const BFLOAT16: i32 = 16;

    /// The spec's name of a data type, for messages.
    pub fn name(t: i32) -> String {
        let s = match t {
            UNDEFINED => "UNDEFINED",
            FLOAT => "FLOAT",
            UINT8 => "UINT8",
            INT8 => "INT8",
            UINT16 => "UINT16",
            INT16 => "INT16",
            INT32 => "INT32",
            INT64 => "INT64",
            STRING => "STRING",
            BOOL => "BOOL",
            FLOAT16 => "FLOAT16",
            DOUBLE => "DOUBLE",
            UINT32 => "UINT32",
            UINT64 => "UINT64",
            COMPLEX64 => "COMPLEX64",
            COMPLEX128 => "COMPLEX128",
            BFLOAT16 => "BFLOAT16",
            17 => "FLOAT8E4M3FN",
            18 => "FLOAT8E4M3FNUZ",
            19 => "FLOAT8E5M2",
            20 => "FLOAT8E5M2FNUZ",
            21 => "UINT4",
            22 => "INT4",
            23 => "FLOAT4E2M1",
            24 => "FLOAT8E8M0",
            25 => "UINT2",
            26 => "INT2",
            27 => "FLOAT6E2M3",
            28 => "FLOAT6E3M2",
            _ => return format!("data type {t}"),
        };
        s.to_string()
    }
}

/// `TensorProto.DataLocation` values.
pub mod data_location {
    pub const DEFAULT: i32 = 0;
    pub const EXTERNAL: i32 = 1;
}

/// `TensorProto.Segment`: a chunked tensor's element range (unsupported; decoded to refuse).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Segment {
    #[prost(int64, tag = "1")]
    pub begin: i64,
    #[prost(int64, tag = "2")]
    pub end: i64,
}

/// `TensorProto`: a dense tensor value; elements in `raw_data` (little-endian) or in the
/// typed field for its data type, or in an external file.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorProto {
    #[prost(int64, repeated, tag = "1")]
    pub dims: Vec<i64>,
    /// One of [`data_type`].
    #[prost(int32, tag = "2")]
    pub data_type: i32,
    #[prost(message, optional, tag = "3")]
    pub segment: Option<Segment>,
    /// FLOAT and COMPLEX64.
    #[prost(float, repeated, tag = "4")]
    pub float_data: Vec<f32>,
    /// INT32, INT16, INT8, UINT16, UINT8, BOOL, FLOAT16 and BFLOAT16 (as bit patterns).
    #[prost(int32, repeated, tag = "5")]
    pub int32_data: Vec<i32>,
    #[prost(bytes = "vec", repeated, tag = "6")]
    pub string_data: Vec<Vec<u8>>,
    #[prost(int64, repeated, tag = "7")]
    pub int64_data: Vec<i64>,
    #[prost(string, tag = "8")]
    pub name: String,
    #[prost(string, tag = "12")]
    pub doc_string: String,
    #[prost(bytes = "vec", tag = "9")]
    pub raw_data: Vec<u8>,
    /// For `data_location = EXTERNAL`: keys `location`, `offset`, `length`, `checksum`.
    #[prost(message, repeated, tag = "13")]
    pub external_data: Vec<StringStringEntryProto>,
    /// One of [`data_location`].
    #[prost(int32, tag = "14")]
    pub data_location: i32,
    /// DOUBLE and COMPLEX128.
    #[prost(double, repeated, tag = "10")]
    pub double_data: Vec<f64>,
    /// UINT32 and UINT64.
    #[prost(uint64, repeated, tag = "11")]
    pub uint64_data: Vec<u64>,
    #[prost(message, repeated, tag = "16")]
    pub metadata_props: Vec<StringStringEntryProto>,
}

/// `SparseTensorProto`: COO values and indices of a sparse tensor.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SparseTensorProto {
    #[prost(message, optional, tag = "1")]
    pub values: Option<TensorProto>,
    #[prost(message, optional, tag = "2")]
    pub indices: Option<TensorProto>,
    #[prost(int64, repeated, tag = "3")]
    pub dims: Vec<i64>,
}

/// `TensorShapeProto`: a list of dimensions, each a number, a symbol or unknown.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorShapeProto {
    #[prost(message, repeated, tag = "1")]
    pub dim: Vec<Dimension>,
}

/// `TensorShapeProto.Dimension`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Dimension {
    #[prost(oneof = "DimensionValue", tags = "1, 2")]
    pub value: Option<DimensionValue>,
    #[prost(string, tag = "3")]
    pub denotation: String,
}

/// The `value` oneof of a dimension: absent means unknown.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum DimensionValue {
    #[prost(int64, tag = "1")]
    DimValue(i64),
    #[prost(string, tag = "2")]
    DimParam(String),
}

/// `TypeProto`: the type of a value (tensors; sequences, maps and optionals decode but the
/// importer refuses them).
#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeProto {
    #[prost(oneof = "TypeValue", tags = "1, 4, 5, 9, 8, 7")]
    pub value: Option<TypeValue>,
    #[prost(string, tag = "6")]
    pub denotation: String,
}

/// The `value` oneof of a [`TypeProto`].
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum TypeValue {
    #[prost(message, tag = "1")]
    TensorType(TypeTensor),
    #[prost(message, tag = "4")]
    SequenceType(Box<TypeSequence>),
    #[prost(message, tag = "5")]
    MapType(Box<TypeMap>),
    #[prost(message, tag = "9")]
    OptionalType(Box<TypeOptional>),
    #[prost(message, tag = "8")]
    SparseTensorType(TypeSparseTensor),
    #[prost(message, tag = "7")]
    OpaqueType(TypeOpaque),
}

/// `TypeProto.Tensor`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeTensor {
    #[prost(int32, tag = "1")]
    pub elem_type: i32,
    /// Absent: the rank is unknown.
    #[prost(message, optional, tag = "2")]
    pub shape: Option<TensorShapeProto>,
}

/// `TypeProto.Sequence`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeSequence {
    #[prost(message, optional, boxed, tag = "1")]
    pub elem_type: Option<Box<TypeProto>>,
}

/// `TypeProto.Map`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeMap {
    #[prost(int32, tag = "1")]
    pub key_type: i32,
    #[prost(message, optional, boxed, tag = "2")]
    pub value_type: Option<Box<TypeProto>>,
}

/// `TypeProto.Optional`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeOptional {
    #[prost(message, optional, boxed, tag = "1")]
    pub elem_type: Option<Box<TypeProto>>,
}

/// `TypeProto.SparseTensor`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeSparseTensor {
    #[prost(int32, tag = "1")]
    pub elem_type: i32,
    #[prost(message, optional, tag = "2")]
    pub shape: Option<TensorShapeProto>,
}

/// `TypeProto.Opaque`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeOpaque {
    #[prost(string, tag = "1")]
    pub domain: String,
    #[prost(string, tag = "2")]
    pub name: String,
}

/// `FunctionProto`: a model-local function (decoded; calls to it are unsupported).
#[derive(Clone, PartialEq, prost::Message)]
pub struct FunctionProto {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, repeated, tag = "4")]
    pub input: Vec<String>,
    #[prost(string, repeated, tag = "5")]
    pub output: Vec<String>,
    #[prost(string, repeated, tag = "6")]
    pub attribute: Vec<String>,
    #[prost(message, repeated, tag = "11")]
    pub attribute_proto: Vec<AttributeProto>,
    #[prost(message, repeated, tag = "7")]
    pub node: Vec<NodeProto>,
    #[prost(string, tag = "8")]
    pub doc_string: String,
    #[prost(message, repeated, tag = "9")]
    pub opset_import: Vec<OperatorSetIdProto>,
    #[prost(string, tag = "10")]
    pub domain: String,
    #[prost(string, tag = "13")]
    pub overload: String,
    #[prost(message, repeated, tag = "12")]
    pub value_info: Vec<ValueInfoProto>,
    #[prost(message, repeated, tag = "14")]
    pub metadata_props: Vec<StringStringEntryProto>,
}
