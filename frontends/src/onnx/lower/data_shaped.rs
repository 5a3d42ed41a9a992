//! ONNX ops whose result shape depends on data, and `Det`:
//!
//! - `Compress`: the condition must be known at import time (it decides the result's
//!   shape); the kept positions become a `gather` with constant indices, so the data
//!   itself may be computed at run time (and is differentiable).
//! - `Unique`: every output's shape depends on the values, so the input must be known at
//!   import time and the op is evaluated then (numpy's `unique` semantics: sorted or in
//!   order of first occurrence, over elements or over slices along `axis`).
//! - `Det`: the determinant of the last two (square, static) axes, by Laplace expansion
//!   over column subsets (`n·2ⁿ` products, each subset's minor computed once), so it is
//!   made of `mul`/`add`/`sub` and differentiable.

use std::cmp::Ordering;
use std::collections::HashMap;

use ppir::ops::attrs::{GatherAttrs, ShapeAttrs, SplitAttrs, SqueezeAttrs};
use ppir::ops::OpAttrs;
use ppir::{DType, Dim, OpKind, Tensor, TensorData};

use super::super::attrs::NodeAttrs;
use super::super::import::{invalid, unsupported, Importer, Val, R};
use super::super::proto::NodeProto;
use super::attention::known;
use super::{norm_axis, OrInvalid};

/// The largest matrix `Det` expands (`n·2ⁿ` products).
const DET_MAX_N: usize = 10;

/// The total order numpy's `unique` sorts by (NaNs last).
fn cmp_f64(a: f64, b: f64) -> Ordering {
    a.partial_cmp(&b)
        .unwrap_or_else(|| a.is_nan().cmp(&b.is_nan()))
}

impl Importer<'_> {
    pub(super) fn lower_compress(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Val> {
        let x = self.req(node, 0)?;
        let Some(cond) =
            self.static_input(node, 1, "the condition (the result's shape depends on it)")?
        else {
            invalid!("input 1 (condition) is missing")
        };
        if cond.shape.len() > 1 {
            invalid!("the condition must be 1-D, it has shape {:?}", cond.shape);
        }
        let dims = self.dims_of(&x)?;
        let (x, axis) = match a.int("axis").inv()? {
            Some(ax) => (x, norm_axis(ax, dims.len())?),
            None => {
                let attrs = ShapeAttrs { shape: vec![-1] };
                (self.op(OpKind::Reshape, attrs.to_attrs(), &[x])?, 0)
            }
        };
        let len = known(self.dims_of(&x)?[axis], "the compressed axis")?;
        let keep: Vec<i64> = cond
            .to_f64_vec()
            .iter()
            .enumerate()
            .filter(|(_, &c)| c != 0.0)
            .map(|(i, _)| i as i64)
            .collect();
        if let Some(&last) = keep.last() {
            if last as usize >= len {
                invalid!("the condition selects position {last}, past the axis' {len} elements");
            }
        }
        let idx = Val::konst(Tensor::from_i64(DType::I64, vec![keep.len()], keep));
        let attrs = GatherAttrs { axis: axis as i64 };
        self.op(OpKind::Gather, attrs.to_attrs(), &[x, idx])
    }

    pub(super) fn lower_unique(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Vec<Val>> {
        let Some(x) = self.static_input(
            node,
            0,
            "the input (every result's shape depends on its values)",
        )?
        else {
            invalid!("input 0 is missing")
        };
        let sorted = a.int_or("sorted", 1).inv()? != 0;
        let rank = x.shape.len();
        // The input as `outer × n × inner` with the unique items along n.
        let (axis, n) = match a.int("axis").inv()? {
            Some(ax) => {
                let ax = norm_axis(ax, rank)?;
                (Some(ax), x.shape[ax])
            }
            None => (None, x.num_elements()),
        };
        let (outer, inner) = match axis {
            Some(ax) => (
                x.shape[..ax].iter().product::<usize>(),
                x.shape[ax + 1..].iter().product::<usize>(),
            ),
            None => (1, 1),
        };
        let vals = x.to_f64_vec();
        let ints = match &x.data {
            TensorData::Int(v) => Some(v.clone()),
            TensorData::Float(_) => None,
        };
        // Item i: its elements in (outer, inner) order.
        let item = |i: usize| -> Vec<(f64, i64)> {
            let mut out = Vec::with_capacity(outer * inner);
            for o in 0..outer {
                for k in 0..inner {
                    let p = (o * n + i) * inner + k;
                    out.push((vals[p], ints.as_ref().map_or(0, |v| v[p])));
                }
            }
            out
        };
        let cmp_items = |p: &[(f64, i64)], q: &[(f64, i64)]| -> Ordering {
            for (a, b) in p.iter().zip(q) {
                let o = if ints.is_some() {
                    a.1.cmp(&b.1)
                } else {
                    cmp_f64(a.0, b.0)
                };
                if o != Ordering::Equal {
                    return o;
                }
            }
            Ordering::Equal
        };
        let items: Vec<Vec<(f64, i64)>> = (0..n).map(item).collect();
        // Distinct items in order of first occurrence, with their counts.
        let mut first: Vec<usize> = vec![];
        let mut inverse_first = vec![0usize; n];
        let mut counts: Vec<i64> = vec![];
        let mut seen: HashMap<Vec<u64>, usize> = HashMap::new();
        for (i, it) in items.iter().enumerate() {
            let key: Vec<u64> = it
                .iter()
                .map(|&(f, k)| match ints {
                    Some(_) => k as u64,
                    None if f == 0.0 => 0, // -0 and 0 are one value
                    None => f.to_bits(),
                })
                .collect();
            let slot = *seen.entry(key).or_insert_with(|| {
                first.push(i);
                counts.push(0);
                first.len() - 1
            });
            counts[slot] += 1;
            inverse_first[i] = slot;
        }
        // Output order: sorted by value, or first occurrence.
        let mut order: Vec<usize> = (0..first.len()).collect();
        if sorted {
            order.sort_by(|&p, &q| cmp_items(&items[first[p]], &items[first[q]]));
        }
        let mut rank_of = vec![0usize; first.len()];
        for (r, &slot) in order.iter().enumerate() {
            rank_of[slot] = r;
        }
        let m = order.len();
        let mut y_vals = vec![0.0; outer * m * inner];
        let mut y_ints = vec![0i64; outer * m * inner];
        for (r, &slot) in order.iter().enumerate() {
            let it = &items[first[slot]];
            for o in 0..outer {
                for k in 0..inner {
                    let (f, i) = it[o * inner + k];
                    y_vals[(o * m + r) * inner + k] = f;
                    y_ints[(o * m + r) * inner + k] = i;
                }
            }
        }
        let y_shape = match axis {
            Some(ax) => {
                let mut s = x.shape.clone();
                s[ax] = m;
                s
            }
            None => vec![m],
        };
        let y = if ints.is_some() {
            Tensor::from_i64(x.dtype, y_shape, y_ints)
        } else {
            Tensor::from_f64(x.dtype, y_shape, y_vals)
        };
        let i64s = |v: Vec<i64>| Val::konst(Tensor::from_i64(DType::I64, vec![v.len()], v));
        let indices: Vec<i64> = order.iter().map(|&s| first[s] as i64).collect();
        let inverse: Vec<i64> = inverse_first.iter().map(|&s| rank_of[s] as i64).collect();
        let counts: Vec<i64> = order.iter().map(|&s| counts[s]).collect();
        Ok(vec![
            Val::konst(y),
            i64s(indices),
            i64s(inverse),
            i64s(counts),
        ])
    }

    pub(super) fn lower_det(&mut self, node: &NodeProto) -> R<Val> {
        use OpKind as K;
        let x = self.req(node, 0)?;
        let t = self.ty(&x)?;
        let r = t.rank();
        if r < 2 || !t.dtype.is_float() {
            invalid!("the input must be a float tensor of rank at least 2, not {t}");
        }
        let n = known(t.dims[r - 1], "the matrix size")?;
        if known(t.dims[r - 2], "the matrix size")? != n {
            invalid!("the matrices must be square, not {t}");
        }
        if n == 0 {
            unsupported!("0×0 matrices");
        }
        if n > DET_MAX_N {
            unsupported!("matrices larger than {DET_MAX_N}×{DET_MAX_N}");
        }
        // The elements x[.., i, j] as [..] values.
        let mut flat: Vec<i64> = t.dims[..r - 2]
            .iter()
            .map(|d| match d {
                Dim::Known(v) => *v as i64,
                Dim::Batch => -1,
            })
            .collect();
        flat.push((n * n) as i64);
        let xf = self.op(K::Reshape, ShapeAttrs { shape: flat }.to_attrs(), &[x])?;
        let pieces = if n == 1 {
            vec![xf]
        } else {
            let attrs = SplitAttrs {
                axis: -1,
                split: vec![1; n * n],
            };
            self.op_n(K::Split, attrs.to_attrs(), &[xf], n * n)?
        };
        let squeeze = SqueezeAttrs { axes: vec![-1] };
        let el = pieces
            .into_iter()
            .map(|p| self.op(K::Squeeze, squeeze.to_attrs(), &[p]))
            .collect::<R<Vec<_>>>()?;
        // minor[S]: the determinant of rows 0..|S| and the columns in bit set S.
        let mut minor: HashMap<usize, Val> = HashMap::new();
        for (j, e) in el.iter().take(n).enumerate() {
            minor.insert(1 << j, e.clone());
        }
        for size in 2..=n {
            let row = size - 1;
            for set in 0usize..(1 << n) {
                if set.count_ones() as usize != size {
                    continue;
                }
                let mut acc: Option<Val> = None;
                for (pos, j) in (0..n).filter(|j| set & (1 << j) != 0).enumerate() {
                    let rest = &minor[&(set & !(1 << j))];
                    let term = self.binop(K::Mul, el[row * n + j].clone(), rest.clone())?;
                    let plus = (row + pos) % 2 == 0;
                    acc = Some(match acc {
                        None if plus => term,
                        None => self.un(K::Neg, term)?,
                        Some(s) => self.binop(if plus { K::Add } else { K::Sub }, s, term)?,
                    });
                }
                if let Some(v) = acc {
                    minor.insert(set, v);
                }
            }
        }
        match minor.remove(&((1 << n) - 1)) {
            Some(d) => Ok(d),
            None => invalid!("no determinant computed"),
        }
    }
}
