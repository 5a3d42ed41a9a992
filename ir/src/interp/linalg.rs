//! Matrix products: `matmul` (numpy semantics) and `gemm` (ONNX Gemm).

use super::util::{
    broadcast_shapes, fail, float_tensor, floats, for_each_broadcast, int_tensor, same_dtype,
    OpResult,
};
use crate::ops::attrs::GemmAttrs;
use crate::tensor::{Tensor, TensorData};

/// Element types the matrix kernel runs on; integers wrap on overflow.
pub(super) trait Scalar: Copy {
    const ZERO: Self;
    fn mul_add_to(self, a: Self, b: Self) -> Self;
    fn plus(self, a: Self) -> Self;
}

impl Scalar for f64 {
    const ZERO: f64 = 0.0;
    #[inline(always)]
    fn mul_add_to(self, a: f64, b: f64) -> f64 {
        self + a * b
    }
    #[inline(always)]
    fn plus(self, a: f64) -> f64 {
        self + a
    }
}

impl Scalar for i64 {
    const ZERO: i64 = 0;
    #[inline(always)]
    fn mul_add_to(self, a: i64, b: i64) -> i64 {
        self.wrapping_add(a.wrapping_mul(b))
    }
    #[inline(always)]
    fn plus(self, a: i64) -> i64 {
        self.wrapping_add(a)
    }
}

/// A strided view of an `rows × cols` matrix: element `(r, c)` is at `r * rs + c * cs`.
#[derive(Clone, Copy)]
pub(super) struct MatView<'a, T> {
    pub data: &'a [T],
    pub rs: usize,
    pub cs: usize,
}

/// `out (m×n) += a (m×k) · b (k×n)`. Loop order i-k-j when b's rows are contiguous (the
/// innermost loop then streams a row of b and a row of out); otherwise (b transposed)
/// i-j-k dot products, whose innermost loop streams a column of b.
pub(super) fn matmul_into<T: Scalar>(
    a: MatView<'_, T>,
    b: MatView<'_, T>,
    m: usize,
    k: usize,
    n: usize,
    out: &mut [T],
) {
    if b.cs == 1 || b.rs != 1 {
        for i in 0..m {
            let out_row = &mut out[i * n..(i + 1) * n];
            for p in 0..k {
                let av = a.data[i * a.rs + p * a.cs];
                if b.cs == 1 {
                    let b_row = &b.data[p * b.rs..p * b.rs + n];
                    for (o, &bv) in out_row.iter_mut().zip(b_row) {
                        *o = o.mul_add_to(av, bv);
                    }
                } else {
                    for (j, o) in out_row.iter_mut().enumerate() {
                        *o = o.mul_add_to(av, b.data[p * b.rs + j * b.cs]);
                    }
                }
            }
        }
    } else {
        for i in 0..m {
            for j in 0..n {
                let b_col = &b.data[j * b.cs..j * b.cs + k];
                let mut acc = T::ZERO;
                if a.cs == 1 {
                    let a_row = &a.data[i * a.rs..i * a.rs + k];
                    for (&av, &bv) in a_row.iter().zip(b_col) {
                        acc = acc.mul_add_to(av, bv);
                    }
                } else {
                    for (p, &bv) in b_col.iter().enumerate() {
                        acc = acc.mul_add_to(a.data[i * a.rs + p * a.cs], bv);
                    }
                }
                out[i * n + j] = out[i * n + j].plus(acc);
            }
        }
    }
}

/// numpy `matmul`: 1-D operands are promoted (and the added dimension dropped again),
/// leading dimensions broadcast.
pub(super) fn matmul(a: &Tensor, b: &Tensor) -> OpResult<Tensor> {
    same_dtype(a, b)?;
    if a.shape.is_empty() || b.shape.is_empty() {
        fail!(
            "matmul operands must have rank ≥ 1, got shapes {:?} and {:?}",
            a.shape,
            b.shape
        );
    }
    let a_shape: Vec<usize> = if a.shape.len() == 1 {
        vec![1, a.shape[0]]
    } else {
        a.shape.clone()
    };
    let b_shape: Vec<usize> = if b.shape.len() == 1 {
        vec![b.shape[0], 1]
    } else {
        b.shape.clone()
    };
    let (ra, rb) = (a_shape.len(), b_shape.len());
    let (m, k) = (a_shape[ra - 2], a_shape[ra - 1]);
    let (k2, n) = (b_shape[rb - 2], b_shape[rb - 1]);
    if k != k2 {
        fail!(
            "matmul contraction sizes differ: shapes {:?} and {:?}",
            a.shape,
            b.shape
        );
    }
    let batch = broadcast_shapes(&[&a_shape[..ra - 2], &b_shape[..rb - 2]])?;
    let mut shape = batch.clone();
    if a.shape.len() > 1 {
        shape.push(m);
    }
    if b.shape.len() > 1 {
        shape.push(n);
    }
    let nb: usize = batch.iter().product();
    match (&a.data, &b.data) {
        (TensorData::Float(x), TensorData::Float(y)) if a.dtype.is_float() => {
            let out = batched(x, y, &a_shape, &b_shape, &batch, nb, m, k, n);
            Ok(float_tensor(a.dtype, shape, out))
        }
        (TensorData::Int(x), TensorData::Int(y)) if a.dtype.is_int() => {
            let out = batched(x, y, &a_shape, &b_shape, &batch, nb, m, k, n);
            Ok(int_tensor(a.dtype, shape, out))
        }
        _ => fail!("matmul needs numeric operands, got {}", a.dtype),
    }
}

#[allow(clippy::too_many_arguments)]
fn batched<T: Scalar>(
    x: &[T],
    y: &[T],
    a_shape: &[usize],
    b_shape: &[usize],
    batch: &[usize],
    nb: usize,
    m: usize,
    k: usize,
    n: usize,
) -> Vec<T> {
    let mut out = vec![T::ZERO; nb * m * n];
    let (ra, rb) = (a_shape.len(), b_shape.len());
    let mut bi = 0;
    for_each_broadcast(
        batch,
        [&a_shape[..ra - 2], &b_shape[..rb - 2]],
        |[ia, ib]| {
            let av = MatView {
                data: &x[ia * m * k..(ia + 1) * m * k],
                rs: k,
                cs: 1,
            };
            let bv = MatView {
                data: &y[ib * k * n..(ib + 1) * k * n],
                rs: n,
                cs: 1,
            };
            matmul_into(av, bv, m, k, n, &mut out[bi * m * n..(bi + 1) * m * n]);
            bi += 1;
        },
    );
    out
}

/// ONNX Gemm: `alpha · op(A) · op(B) + beta · C`, `op` transposing when `trans_a`/`trans_b`
/// is set, C broadcast to the result (unidirectionally).
pub(super) fn gemm(attrs: &GemmAttrs, inputs: &[&Tensor]) -> OpResult<Tensor> {
    let (a, b) = (inputs[0], inputs[1]);
    same_dtype(a, b)?;
    let x = floats(a, "A")?;
    let y = floats(b, "B")?;
    if a.shape.len() != 2 || b.shape.len() != 2 {
        fail!(
            "gemm operands must be 2-D, got shapes {:?} and {:?}",
            a.shape,
            b.shape
        );
    }
    let GemmAttrs {
        alpha,
        beta,
        trans_a,
        trans_b,
    } = *attrs;
    let (m, k) = if trans_a {
        (a.shape[1], a.shape[0])
    } else {
        (a.shape[0], a.shape[1])
    };
    let (k2, n) = if trans_b {
        (b.shape[1], b.shape[0])
    } else {
        (b.shape[0], b.shape[1])
    };
    if k != k2 {
        fail!(
            "gemm contraction sizes differ: A {:?} (trans_a = {}) and B {:?} (trans_b = {})",
            a.shape,
            trans_a as i64,
            b.shape,
            trans_b as i64
        );
    }
    let av = if trans_a {
        MatView {
            data: x,
            rs: 1,
            cs: m,
        }
    } else {
        MatView {
            data: x,
            rs: k,
            cs: 1,
        }
    };
    let bv = if trans_b {
        MatView {
            data: y,
            rs: 1,
            cs: k,
        }
    } else {
        MatView {
            data: y,
            rs: n,
            cs: 1,
        }
    };
    let mut out = vec![0.0; m * n];
    matmul_into(av, bv, m, k, n, &mut out);
    for o in out.iter_mut() {
        *o *= alpha;
    }
    if let Some(c) = inputs.get(2) {
        same_dtype(a, c)?;
        let cv = floats(c, "C")?;
        let shape = [m, n];
        if broadcast_shapes(&[&c.shape, &shape])? != shape {
            fail!(
                "gemm: C of shape {:?} does not broadcast to the result [{m}, {n}]",
                c.shape
            );
        }
        let mut i = 0;
        for_each_broadcast(&shape, [&c.shape], |[j]| {
            out[i] += beta * cv[j];
            i += 1;
        });
    }
    Ok(float_tensor(a.dtype, vec![m, n], out))
}
