//! `TensorProto` ↔ [`Tensor`]: element types, the typed fields and `raw_data`, and tensors
//! stored in external files (read through [`super::external`]).
//!
//! Every size is checked against the bytes actually present before anything is allocated,
//! so a corrupt or hostile file cannot make the importer allocate more than it read.

use std::path::Path;

use ppir::{DType, Tensor, TensorData};

use super::error::OnnxError;
use super::external;
use super::proto::{data_location, data_type, TensorProto};

/// The IR element type of an ONNX data type, if ppir has one.
pub fn dtype_from_onnx(t: i32) -> Option<DType> {
    Some(match t {
        data_type::FLOAT => DType::F32,
        data_type::DOUBLE => DType::F64,
        data_type::FLOAT16 => DType::F16,
        data_type::BFLOAT16 => DType::BF16,
        data_type::INT64 => DType::I64,
        data_type::INT32 => DType::I32,
        data_type::INT8 => DType::I8,
        data_type::BOOL => DType::Bool,
        _ => return None,
    })
}

/// The ONNX data type of an IR element type.
pub fn dtype_to_onnx(d: DType) -> i32 {
    match d {
        DType::F32 => data_type::FLOAT,
        DType::F64 => data_type::DOUBLE,
        DType::F16 => data_type::FLOAT16,
        DType::BF16 => data_type::BFLOAT16,
        DType::I64 => data_type::INT64,
        DType::I32 => data_type::INT32,
        DType::I8 => data_type::INT8,
        DType::Bool => data_type::BOOL,
    }
}

/// Why a tensor's shape or data cannot be decoded (the caller adds which tensor).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TensorDataError {
    #[error("negative dimension {dim} in shape {dims:?}")]
    NegativeDim { dim: i64, dims: Vec<i64> },
    #[error("shape {dims:?} has too many elements")]
    TooManyElements { dims: Vec<i64> },
    /// `raw` data whose length is not the shape's element count times the element size.
    #[error("shape {shape:?} of {dtype} needs {needed} bytes of data but {present} are present")]
    RawSize {
        shape: Vec<usize>,
        dtype: DType,
        needed: usize,
        present: usize,
    },
}

/// Element count of `dims`, refusing negative dimensions and overflow.
pub fn element_count(dims: &[i64]) -> Result<usize, TensorDataError> {
    let mut n: usize = 1;
    for &d in dims {
        if d < 0 {
            return Err(TensorDataError::NegativeDim {
                dim: d,
                dims: dims.to_vec(),
            });
        }
        n = usize::try_from(d)
            .ok()
            .and_then(|d| n.checked_mul(d))
            .filter(|&n| n <= isize::MAX as usize / 8)
            .ok_or_else(|| TensorDataError::TooManyElements {
                dims: dims.to_vec(),
            })?;
    }
    Ok(n)
}

fn tensor_err(tp: &TensorProto, message: impl Into<String>) -> OnnxError {
    OnnxError::Tensor {
        tensor: tp.name.clone(),
        message: message.into(),
    }
}

/// Decode a tensor. `model_dir` is the folder external data is read from (`None`: the model
/// came from bytes, and external data is an error).
pub fn tensor_from_proto(tp: &TensorProto, model_dir: Option<&Path>) -> Result<Tensor, OnnxError> {
    let dtype = dtype_from_onnx(tp.data_type).ok_or_else(|| {
        let what = if tp.data_type == data_type::STRING {
            " (string tensors are unsupported)"
        } else {
            ""
        };
        tensor_err(
            tp,
            format!(
                "unsupported element type {}{what}",
                data_type::name(tp.data_type)
            ),
        )
    })?;
    if tp.segment.is_some() {
        return Err(tensor_err(tp, "segmented tensors are unsupported"));
    }
    let data_err = |source: TensorDataError| OnnxError::TensorData {
        tensor: tp.name.clone(),
        source,
    };
    let n = element_count(&tp.dims).map_err(data_err)?;
    let shape: Vec<usize> = tp.dims.iter().map(|&d| d as usize).collect();
    let size = dtype.size_bytes();
    if tp.data_location == data_location::EXTERNAL {
        let bytes = external::read_external(tp, model_dir, n.checked_mul(size))?;
        return from_raw(dtype, shape, n, &bytes).map_err(data_err);
    }
    if tp.data_location != data_location::DEFAULT {
        return Err(tensor_err(
            tp,
            format!("unknown data_location {}", tp.data_location),
        ));
    }
    if !tp.raw_data.is_empty() || n == 0 {
        return from_raw(dtype, shape, n, &tp.raw_data).map_err(data_err);
    }
    let count_err = |found: usize, field: &str| {
        tensor_err(
            tp,
            format!(
                "shape {:?} needs {n} elements but {field} holds {found}",
                tp.dims
            ),
        )
    };
    let data = match dtype {
        DType::F32 => {
            if tp.float_data.len() != n {
                return Err(count_err(tp.float_data.len(), "float_data"));
            }
            TensorData::Float(tp.float_data.iter().map(|&x| x as f64).collect())
        }
        DType::F64 => {
            if tp.double_data.len() != n {
                return Err(count_err(tp.double_data.len(), "double_data"));
            }
            TensorData::Float(tp.double_data.clone())
        }
        DType::I64 => {
            if tp.int64_data.len() != n {
                return Err(count_err(tp.int64_data.len(), "int64_data"));
            }
            TensorData::Int(tp.int64_data.clone())
        }
        DType::F16 | DType::BF16 | DType::I32 | DType::I8 | DType::Bool => {
            if tp.int32_data.len() != n {
                return Err(count_err(tp.int32_data.len(), "int32_data"));
            }
            match dtype {
                DType::F16 => TensorData::Float(
                    tp.int32_data
                        .iter()
                        .map(|&b| half::f16::from_bits(b as u16).to_f64())
                        .collect(),
                ),
                DType::BF16 => TensorData::Float(
                    tp.int32_data
                        .iter()
                        .map(|&b| half::bf16::from_bits(b as u16).to_f64())
                        .collect(),
                ),
                DType::I8 => {
                    TensorData::Int(tp.int32_data.iter().map(|&x| x as i8 as i64).collect())
                }
                DType::Bool => {
                    TensorData::Int(tp.int32_data.iter().map(|&x| (x != 0) as i64).collect())
                }
                _ => TensorData::Int(tp.int32_data.iter().map(|&x| x as i64).collect()),
            }
        }
    };
    Ok(Tensor { dtype, shape, data })
}

/// Decode `n` little-endian elements of `dtype` from `raw`.
pub fn from_raw(
    dtype: DType,
    shape: Vec<usize>,
    n: usize,
    raw: &[u8],
) -> Result<Tensor, TensorDataError> {
    let size = dtype.size_bytes();
    if n.checked_mul(size) != Some(raw.len()) {
        return Err(TensorDataError::RawSize {
            shape,
            dtype,
            needed: n.saturating_mul(size),
            present: raw.len(),
        });
    }
    let chunks = raw.chunks_exact(size);
    let data = match dtype {
        DType::F32 => TensorData::Float(
            chunks
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
                .collect(),
        ),
        DType::F64 => TensorData::Float(
            chunks
                .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
                .collect(),
        ),
        DType::F16 => TensorData::Float(
            chunks
                .map(|c| half::f16::from_le_bytes(c.try_into().unwrap()).to_f64())
                .collect(),
        ),
        DType::BF16 => TensorData::Float(
            chunks
                .map(|c| half::bf16::from_le_bytes(c.try_into().unwrap()).to_f64())
                .collect(),
        ),
        DType::I64 => TensorData::Int(
            chunks
                .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                .collect(),
        ),
        DType::I32 => TensorData::Int(
            chunks
                .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64)
                .collect(),
        ),
        DType::I8 => TensorData::Int(raw.iter().map(|&b| b as i8 as i64).collect()),
        DType::Bool => TensorData::Int(raw.iter().map(|&b| (b != 0) as i64).collect()),
    };
    Ok(Tensor { dtype, shape, data })
}

/// Little-endian bytes of a tensor's elements (the `raw_data` encoding).
pub fn to_raw(t: &Tensor) -> Vec<u8> {
    let mut out = Vec::with_capacity(t.num_elements() * t.dtype.size_bytes());
    match &t.data {
        TensorData::Float(v) => {
            for &x in v {
                match t.dtype {
                    DType::F64 => out.extend_from_slice(&x.to_le_bytes()),
                    DType::F16 => out.extend_from_slice(&half::f16::from_f64(x).to_le_bytes()),
                    DType::BF16 => out.extend_from_slice(&half::bf16::from_f64(x).to_le_bytes()),
                    _ => out.extend_from_slice(&(x as f32).to_le_bytes()),
                }
            }
        }
        TensorData::Int(v) => {
            for &x in v {
                match t.dtype {
                    DType::I64 => out.extend_from_slice(&x.to_le_bytes()),
                    DType::I32 => out.extend_from_slice(&(x as i32).to_le_bytes()),
                    _ => out.push(x as u8),
                }
            }
        }
    }
    out
}

/// Encode a tensor as a `TensorProto` with `raw_data` (for writing test data and building
/// models in tests).
pub fn tensor_to_proto(t: &Tensor, name: &str) -> TensorProto {
    TensorProto {
        dims: t.shape.iter().map(|&d| d as i64).collect(),
        data_type: dtype_to_onnx(t.dtype),
        name: name.to_string(),
        raw_data: to_raw(t),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_fields_and_raw_data_agree() {
        let typed = TensorProto {
            dims: vec![2, 2],
            data_type: data_type::FLOAT,
            float_data: vec![1.0, -2.5, 3.0, 0.125],
            ..Default::default()
        };
        let a = tensor_from_proto(&typed, None).unwrap();
        let raw = tensor_to_proto(&a, "x");
        let b = tensor_from_proto(&raw, None).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.shape, vec![2, 2]);
    }

    #[test]
    fn every_dtype_round_trips_through_raw_data() {
        for d in DType::ALL {
            let t = if d.is_float() {
                Tensor::from_f64(d, vec![3], vec![1.5, -2.0, 0.25])
            } else {
                Tensor::from_i64(d, vec![3], vec![1, 0, 1])
            };
            let back = tensor_from_proto(&tensor_to_proto(&t, "t"), None).unwrap();
            assert_eq!(back, t, "{d}");
        }
    }

    #[test]
    fn sizes_are_checked_before_allocating() {
        let huge = TensorProto {
            dims: vec![i64::MAX, 4],
            data_type: data_type::FLOAT,
            ..Default::default()
        };
        assert!(tensor_from_proto(&huge, None).is_err());
        let short = TensorProto {
            dims: vec![1 << 40],
            data_type: data_type::FLOAT,
            raw_data: vec![0; 8],
            ..Default::default()
        };
        let e = tensor_from_proto(&short, None).unwrap_err().to_string();
        assert!(e.contains("bytes"), "{e}");
        let negative = TensorProto {
            dims: vec![-3],
            data_type: data_type::INT64,
            ..Default::default()
        };
        assert!(tensor_from_proto(&negative, None).is_err());
    }

    #[test]
    fn legacy_int32_data_encodings() {
        let f16 = TensorProto {
            dims: vec![2],
            data_type: data_type::FLOAT16,
            int32_data: vec![
                half::f16::from_f32(1.5).to_bits() as i32,
                half::f16::from_f32(-2.0).to_bits() as i32,
            ],
            ..Default::default()
        };
        assert_eq!(
            tensor_from_proto(&f16, None).unwrap().as_f64().unwrap(),
            &[1.5, -2.0]
        );
        let b = TensorProto {
            dims: vec![2],
            data_type: data_type::BOOL,
            int32_data: vec![0, 7],
            ..Default::default()
        };
        assert_eq!(
            tensor_from_proto(&b, None).unwrap().as_i64().unwrap(),
            &[0, 1]
        );
    }
}
