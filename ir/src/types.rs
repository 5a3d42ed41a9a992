//! Element types, dimensions and tensor types.
//!
//! A tensor type is a dtype and a list of dimensions. A dimension is either a known size or
//! the symbolic batch dimension `?`, which a frontend leaves open and `bind_batch` fixes at
//! compile time. Textual form: `tensor<?x784xf32>`, `tensor<f32>` for a scalar.

use std::fmt;

use crate::size::SizeError;

/// Element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F64,
    F16,
    BF16,
    I64,
    I32,
    I8,
    Bool,
}

impl DType {
    pub const ALL: [DType; 8] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I64,
        DType::I32,
        DType::I8,
        DType::Bool,
    ];

    /// The spelling used in the textual IR (`f32`, `i64`, `i1` for bool as in MLIR).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::I8 => "i8",
            DType::Bool => "i1",
        }
    }

    pub fn from_name(s: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == s)
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }

    pub fn is_int(self) -> bool {
        matches!(self, DType::I64 | DType::I32 | DType::I8)
    }

    /// Size of one element in bytes (bool takes a byte).
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I8 | DType::Bool => 1,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One dimension of a tensor type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dim {
    /// A size known at compile time.
    Known(u64),
    /// The symbolic batch dimension, printed `?`; bound by `--batch` before codegen.
    Batch,
}

impl Dim {
    pub fn known(self) -> Option<u64> {
        match self {
            Dim::Known(n) => Some(n),
            Dim::Batch => None,
        }
    }

    /// Whether two dimensions may describe the same size (`?` agrees with anything).
    pub fn compatible(self, other: Dim) -> bool {
        match (self, other) {
            (Dim::Known(a), Dim::Known(b)) => a == b,
            _ => true,
        }
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Known(n) => write!(f, "{n}"),
            Dim::Batch => f.write_str("?"),
        }
    }
}

impl From<u64> for Dim {
    fn from(n: u64) -> Self {
        Dim::Known(n)
    }
}

/// A ranked tensor type: `tensor<2x?x3xf32>`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub dtype: DType,
    pub dims: Vec<Dim>,
}

impl TensorType {
    pub fn new(dtype: DType, dims: Vec<Dim>) -> Self {
        TensorType { dtype, dims }
    }

    /// A fully static type from a shape.
    pub fn of(dtype: DType, shape: &[u64]) -> Self {
        TensorType {
            dtype,
            dims: shape.iter().map(|&n| Dim::Known(n)).collect(),
        }
    }

    pub fn scalar(dtype: DType) -> Self {
        TensorType {
            dtype,
            dims: vec![],
        }
    }

    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// The static shape, or `None` if a dimension is still symbolic.
    pub fn static_shape(&self) -> Option<Vec<u64>> {
        self.dims.iter().map(|d| d.known()).collect()
    }

    pub fn is_static(&self) -> bool {
        self.dims.iter().all(|d| d.known().is_some())
    }

    /// Number of elements, if static. Exact for a representable type (every type of a
    /// verified module, see [`crate::size`]); saturates at `u64::MAX` otherwise.
    pub fn num_elements(&self) -> Option<u64> {
        self.static_shape()
            .map(|s| s.iter().fold(1u64, |a, &d| a.saturating_mul(d)))
    }

    /// Size in bytes, if static (saturating like [`TensorType::num_elements`]).
    pub fn size_bytes(&self) -> Option<u64> {
        self.num_elements()
            .map(|n| n.saturating_mul(self.dtype.size_bytes() as u64))
    }

    /// Whether the type's size is representable ([`crate::size`]): the product of its known
    /// non-zero dimensions times the element size fits in `i64` (the batch dimension `?`
    /// counts as 1 here; [`crate::shape::bind_batch`] checks the bound type again).
    pub fn check_size(&self) -> Result<(), SizeError> {
        let known: Vec<u64> = self.dims.iter().map(|d| d.known().unwrap_or(1)).collect();
        crate::size::num_elements_u64(&known, self.dtype.size_bytes())
            .map(|_| ())
            .map_err(|_| SizeError::Overflow {
                shape: self.to_string(),
                elem_bytes: self.dtype.size_bytes() as u64,
            })
    }

    /// Same dtype, same rank, and every pair of dimensions compatible.
    pub fn compatible(&self, other: &TensorType) -> bool {
        self.dtype == other.dtype
            && self.dims.len() == other.dims.len()
            && self
                .dims
                .iter()
                .zip(&other.dims)
                .all(|(a, b)| a.compatible(*b))
    }

    /// Replace the symbolic batch dimension by `n`.
    pub fn bind_batch(&self, n: u64) -> TensorType {
        TensorType {
            dtype: self.dtype,
            dims: self
                .dims
                .iter()
                .map(|d| match d {
                    Dim::Batch => Dim::Known(n),
                    k => *k,
                })
                .collect(),
        }
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("tensor<")?;
        for d in &self.dims {
            write!(f, "{d}x")?;
        }
        write!(f, "{}>", self.dtype)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display() {
        let t = TensorType::new(DType::F32, vec![Dim::Batch, Dim::Known(784)]);
        assert_eq!(t.to_string(), "tensor<?x784xf32>");
        assert_eq!(TensorType::scalar(DType::Bool).to_string(), "tensor<i1>");
        assert_eq!(t.bind_batch(8).to_string(), "tensor<8x784xf32>");
    }

    #[test]
    fn compatibility() {
        let a = TensorType::new(DType::F32, vec![Dim::Batch, Dim::Known(3)]);
        assert!(a.compatible(&TensorType::of(DType::F32, &[5, 3])));
        assert!(!a.compatible(&TensorType::of(DType::F32, &[5, 4])));
        assert!(!a.compatible(&TensorType::of(DType::F64, &[5, 3])));
    }

    #[test]
    fn oversized_types() {
        // 2^31 * 2^31 * 4 elements wrap to 0 in unchecked u64 arithmetic.
        let t = TensorType::of(DType::F32, &[1 << 31, 1 << 31, 4]);
        let e = t.check_size().unwrap_err();
        assert!(
            e.to_string()
                .contains("tensor<2147483648x2147483648x4xf32>"),
            "{e}"
        );
        assert_eq!(t.num_elements(), Some(u64::MAX));
        let b = TensorType::new(DType::F64, vec![Dim::Batch, Dim::Known(1 << 61)]);
        assert!(b.check_size().is_err());
        assert!(TensorType::of(DType::F32, &[0, 1 << 40])
            .check_size()
            .is_ok());
    }
}
