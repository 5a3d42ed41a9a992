//! Concrete tensor values: weights, constants, interpreter inputs and outputs.
//!
//! Floating-point elements are held as `f64` whatever the dtype and rounded to the dtype's
//! precision by whoever produces them (see [`round_to`]); integers and bools as `i64`
//! (bool is 0/1). One storage type keeps the interpreter short and obviously right.

use crate::types::{DType, TensorType};

#[derive(Clone, Debug, PartialEq)]
pub enum TensorData {
    Float(Vec<f64>),
    Int(Vec<i64>),
}

impl TensorData {
    pub fn len(&self) -> usize {
        match self {
            TensorData::Float(v) => v.len(),
            TensorData::Int(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A dense row-major tensor with a static shape.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub data: TensorData,
}

/// Round `x` to the nearest value representable in `dtype` (floats only; identity for f64).
pub fn round_to(dtype: DType, x: f64) -> f64 {
    match dtype {
        DType::F32 => x as f32 as f64,
        DType::F16 => half::f16::from_f64(x).to_f64(),
        DType::BF16 => half::bf16::from_f64(x).to_f64(),
        _ => x,
    }
}

/// Wrap an integer to the range of `dtype` (two's complement, as a C cast would).
pub fn wrap_int(dtype: DType, x: i64) -> i64 {
    match dtype {
        DType::I32 => x as i32 as i64,
        DType::I8 => x as i8 as i64,
        DType::Bool => (x != 0) as i64,
        _ => x,
    }
}

impl Tensor {
    /// A float tensor; values are rounded to `dtype`. Panics if sizes disagree or dtype
    /// is not a float type (programming error, not user input).
    pub fn from_f64(dtype: DType, shape: Vec<usize>, data: Vec<f64>) -> Tensor {
        assert!(
            dtype.is_float(),
            "from_f64 needs a float dtype, got {dtype}"
        );
        assert_eq!(
            crate::size::checked_num_elements(&shape),
            Some(data.len()),
            "shape/data size mismatch"
        );
        let data = data.into_iter().map(|x| round_to(dtype, x)).collect();
        Tensor {
            dtype,
            shape,
            data: TensorData::Float(data),
        }
    }

    pub fn from_f32(shape: Vec<usize>, data: Vec<f32>) -> Tensor {
        Tensor::from_f64(
            DType::F32,
            shape,
            data.into_iter().map(|x| x as f64).collect(),
        )
    }

    /// An integer or bool tensor; values are wrapped to `dtype`.
    pub fn from_i64(dtype: DType, shape: Vec<usize>, data: Vec<i64>) -> Tensor {
        assert!(
            !dtype.is_float(),
            "from_i64 needs an integer/bool dtype, got {dtype}"
        );
        assert_eq!(
            crate::size::checked_num_elements(&shape),
            Some(data.len()),
            "shape/data size mismatch"
        );
        let data = data.into_iter().map(|x| wrap_int(dtype, x)).collect();
        Tensor {
            dtype,
            shape,
            data: TensorData::Int(data),
        }
    }

    pub fn zeros(dtype: DType, shape: Vec<usize>) -> Tensor {
        let n = shape.iter().product();
        if dtype.is_float() {
            Tensor {
                dtype,
                shape,
                data: TensorData::Float(vec![0.0; n]),
            }
        } else {
            Tensor {
                dtype,
                shape,
                data: TensorData::Int(vec![0; n]),
            }
        }
    }

    pub fn scalar_f64(dtype: DType, x: f64) -> Tensor {
        Tensor::from_f64(dtype, vec![], vec![x])
    }

    /// The element count of the shape (saturating: a shape that overflows cannot match
    /// its data, which is how consistency checks catch it).
    pub fn num_elements(&self) -> usize {
        self.shape.iter().fold(1usize, |a, &d| a.saturating_mul(d))
    }

    pub fn tensor_type(&self) -> TensorType {
        TensorType::of(
            self.dtype,
            &self.shape.iter().map(|&d| d as u64).collect::<Vec<_>>(),
        )
    }

    /// Elements as f64 (integers converted).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        match &self.data {
            TensorData::Float(v) => v.clone(),
            TensorData::Int(v) => v.iter().map(|&x| x as f64).collect(),
        }
    }

    /// Elements as i64 (floats truncated toward zero).
    pub fn to_i64_vec(&self) -> Vec<i64> {
        match &self.data {
            TensorData::Float(v) => v.iter().map(|&x| x as i64).collect(),
            TensorData::Int(v) => v.clone(),
        }
    }

    pub fn as_f64(&self) -> Option<&[f64]> {
        match &self.data {
            TensorData::Float(v) => Some(v),
            TensorData::Int(_) => None,
        }
    }

    pub fn as_i64(&self) -> Option<&[i64]> {
        match &self.data {
            TensorData::Int(v) => Some(v),
            TensorData::Float(_) => None,
        }
    }

    /// Row-major strides in elements.
    pub fn strides(&self) -> Vec<usize> {
        strides_of(&self.shape)
    }
}

/// Row-major strides of a shape, in elements.
pub fn strides_of(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding() {
        let t = Tensor::from_f64(DType::F32, vec![1], vec![0.1]);
        assert_eq!(t.as_f64().unwrap()[0], 0.1f32 as f64);
        assert_eq!(round_to(DType::BF16, 1.0 + 1.0 / 512.0), 1.0);
        assert_eq!(wrap_int(DType::I8, 200), -56);
        assert_eq!(strides_of(&[2, 3, 4]), vec![12, 4, 1]);
    }
}
