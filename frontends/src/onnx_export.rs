//! Writing trained weights back into an ONNX model.
//!
//! [`replace_initializers`] takes the bytes of the original `.onnx` file and returns them
//! with the graph's initializers replaced by new values. It edits the protobuf at the wire
//! level: every byte of the model other than the replaced `TensorProto`s is copied as it
//! was, so fields the importer does not model (and would drop if it re-encoded a decoded
//! [`ModelProto`](crate::onnx::proto::ModelProto)) survive. A replaced initializer holds its
//! data inline (`raw_data`), also when the original was stored in an external file.
//!
//! Weights are named as the importer names them (the ONNX name with characters outside
//! `[A-Za-z0-9_.$/-]` replaced by `_`).
//!
//! ```
//! use ppcc_frontends::onnx_export::replace_initializers;
//! // Bytes that are not a model give an error, never a panic.
//! assert!(replace_initializers(b"\x0a\xff", &Default::default()).is_err());
//! ```

use std::collections::{BTreeMap, HashMap};

use ppir::Tensor;
use prost::Message;

use crate::onnx::proto::TensorProto;
use crate::onnx::tensor::{dtype_from_onnx, tensor_to_proto};
use crate::onnx::OnnxError;

/// `ModelProto.graph`.
const MODEL_GRAPH: u64 = 7;
/// `GraphProto.initializer`.
const GRAPH_INITIALIZER: u64 = 5;

/// What [`replace_initializers`] did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ExportReport {
    /// ONNX names of the initializers that got new values.
    pub replaced: Vec<String>,
    /// Weights that matched no initializer.
    pub unused: Vec<String>,
}

/// The model in `model` with each initializer whose ONNX name is a key of `weights`
/// replaced by that tensor. A replacement must have the initializer's element type and
/// shape. Callers map IR weight names back with `Imported::weight_sources`.
pub fn replace_initializers(
    model: &[u8],
    weights: &BTreeMap<String, Tensor>,
) -> Result<(Vec<u8>, ExportReport), OnnxError> {
    let mut report = ExportReport::default();
    let mut claimed: HashMap<String, String> = HashMap::new();
    let mut out = Vec::with_capacity(model.len());
    let mut found_graph = false;
    for field in fields(model)? {
        if field.number == MODEL_GRAPH && field.wire_type == 2 {
            found_graph = true;
            let graph = rewrite_graph(field.payload, weights, &mut claimed, &mut report)?;
            put_varint(&mut out, (MODEL_GRAPH << 3) | 2);
            put_varint(&mut out, graph.len() as u64);
            out.extend_from_slice(&graph);
        } else {
            out.extend_from_slice(field.raw);
        }
    }
    if !found_graph {
        return Err(OnnxError::Invalid("the model has no graph".into()));
    }
    report.unused = weights
        .keys()
        .filter(|k| !claimed.contains_key(*k))
        .cloned()
        .collect();
    Ok((out, report))
}

fn rewrite_graph(
    graph: &[u8],
    weights: &BTreeMap<String, Tensor>,
    claimed: &mut HashMap<String, String>,
    report: &mut ExportReport,
) -> Result<Vec<u8>, OnnxError> {
    let mut out = Vec::with_capacity(graph.len());
    for field in fields(graph)? {
        if field.number != GRAPH_INITIALIZER || field.wire_type != 2 {
            out.extend_from_slice(field.raw);
            continue;
        }
        let old = TensorProto::decode(field.payload)?;
        let key = old.name.clone();
        let Some(t) = weights.get(&key) else {
            out.extend_from_slice(field.raw);
            continue;
        };
        if let Some(other) = claimed.insert(key.clone(), old.name.clone()) {
            return Err(OnnxError::Invalid(format!(
                "two initializers are named `{other}`; ONNX names must be unique",
            )));
        }
        let dims: Vec<i64> = t.shape.iter().map(|&d| d as i64).collect();
        if dtype_from_onnx(old.data_type) != Some(t.dtype) || old.dims != dims {
            return Err(OnnxError::Tensor {
                tensor: old.name.clone(),
                message: format!(
                    "the new value is {} but the initializer has data type {} and shape {:?}",
                    t.tensor_type(),
                    crate::onnx::proto::data_type::name(old.data_type),
                    old.dims
                ),
            });
        }
        let mut new = tensor_to_proto(t, &old.name);
        new.doc_string = old.doc_string;
        new.metadata_props = old.metadata_props;
        let bytes = new.encode_to_vec();
        put_varint(&mut out, (GRAPH_INITIALIZER << 3) | 2);
        put_varint(&mut out, bytes.len() as u64);
        out.extend_from_slice(&bytes);
        report.replaced.push(old.name);
    }
    Ok(out)
}

/// One field of a protobuf message: its bytes as they were (key included) and, for
/// length-delimited fields, the payload.
struct Field<'a> {
    number: u64,
    wire_type: u8,
    raw: &'a [u8],
    payload: &'a [u8],
}

fn bad(message: &str) -> OnnxError {
    OnnxError::Invalid(format!("malformed protobuf: {message}"))
}

fn varint(buf: &[u8], pos: &mut usize) -> Result<u64, OnnxError> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *buf.get(*pos).ok_or_else(|| bad("truncated varint"))?;
        *pos += 1;
        v |= ((b & 0x7f) as u64) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(bad("varint longer than 10 bytes"))
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Split a message into its fields (top level only).
fn fields(buf: &[u8]) -> Result<Vec<Field<'_>>, OnnxError> {
    let mut out = vec![];
    let mut pos = 0;
    while pos < buf.len() {
        let start = pos;
        let key = varint(buf, &mut pos)?;
        let (number, wire_type) = (key >> 3, (key & 7) as u8);
        let mut payload: &[u8] = &[];
        match wire_type {
            0 => {
                varint(buf, &mut pos)?;
            }
            1 => pos += 8,
            5 => pos += 4,
            2 => {
                let len = varint(buf, &mut pos)?;
                let end = usize::try_from(len)
                    .ok()
                    .and_then(|l| pos.checked_add(l))
                    .filter(|&e| e <= buf.len())
                    .ok_or_else(|| bad("length past the end of the message"))?;
                payload = &buf[pos..end];
                pos = end;
            }
            w => return Err(bad(&format!("unsupported wire type {w}"))),
        }
        if pos > buf.len() || number == 0 {
            return Err(bad("truncated field"));
        }
        out.push(Field {
            number,
            wire_type,
            raw: &buf[start..pos],
            payload,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::onnx::proto::{GraphProto, ModelProto, OperatorSetIdProto};
    use crate::onnx::tensor::tensor_from_proto;
    use ppir::DType;

    fn model() -> ModelProto {
        let w = Tensor::from_f32(vec![2], vec![1.0, 2.0]);
        let ids = Tensor::from_i64(DType::I64, vec![1], vec![3]);
        ModelProto {
            ir_version: 8,
            producer_name: "test".into(),
            opset_import: vec![OperatorSetIdProto {
                domain: String::new(),
                version: 17,
            }],
            graph: Some(GraphProto {
                name: "g".into(),
                initializer: vec![tensor_to_proto(&w, "fc:w"), tensor_to_proto(&ids, "ids")],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn replaces_by_onnx_name_and_keeps_the_rest() {
        let bytes = model().encode_to_vec();
        let new_w = Tensor::from_f32(vec![2], vec![-1.0, 0.5]);
        let weights = BTreeMap::from([
            ("fc:w".to_string(), new_w.clone()),
            ("momentum.x".to_string(), new_w.clone()),
        ]);
        let (out, report) = replace_initializers(&bytes, &weights).unwrap();
        assert_eq!(report.replaced, vec!["fc:w".to_string()]);
        assert_eq!(report.unused, vec!["momentum.x".to_string()]);
        let back = ModelProto::decode(out.as_slice()).unwrap();
        let g = back.graph.as_ref().unwrap();
        assert_eq!(tensor_from_proto(&g.initializer[0], None).unwrap(), new_w);
        assert_eq!(g.initializer[1], model().graph.unwrap().initializer[1]);
        assert_eq!(back.producer_name, "test");
        // Nothing to replace: the bytes are unchanged.
        let (same, _) = replace_initializers(&bytes, &BTreeMap::new()).unwrap();
        assert_eq!(same, bytes);
    }

    #[test]
    fn shape_or_type_mismatch_is_an_error() {
        let bytes = model().encode_to_vec();
        let weights =
            BTreeMap::from([("fc:w".to_string(), Tensor::from_f32(vec![3], vec![0.0; 3]))]);
        let e = replace_initializers(&bytes, &weights)
            .unwrap_err()
            .to_string();
        assert!(e.contains("fc:w") && e.contains("shape"), "{e}");
    }
}
