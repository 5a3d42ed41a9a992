//! How ZeRO-1 cuts a parameter across data-parallel replicas (the `reduce_scatter`,
//! `shard` and `all_gather` ops; see [`crate::ops::attrs::ShardAttrs`]).
//!
//! A tensor of `n` elements is read row-major, padded with zeros to `replicas · S`
//! elements where `S = ceil(n / replicas)`, and cut into `replicas` consecutive shards of
//! `S` elements; replica `d` owns shard `d`. Every shard has the same length, so the
//! collectives move equal blocks (`MPI_Reduce_scatter_block`, `MPI_Allgather`).

use crate::{Tensor, TensorData};

/// Elements per shard of a tensor of `numel` elements over `replicas` (at least 1 each).
pub fn shard_len(numel: u64, replicas: u64) -> u64 {
    if replicas == 0 {
        return numel;
    }
    numel.div_ceil(replicas).max(1)
}

/// Shard `index` of `t` over `replicas` (a 1-D tensor of [`shard_len`] elements).
pub fn shard_of(t: &Tensor, replicas: usize, index: usize) -> Result<Tensor, String> {
    if replicas == 0 || index >= replicas {
        return Err(format!(
            "shard {index} of {replicas} replicas does not exist"
        ));
    }
    let n = t.num_elements();
    let s = shard_len(n as u64, replicas as u64) as usize;
    let lo = (index * s).min(n);
    let hi = ((index + 1) * s).min(n);
    let data = match &t.data {
        TensorData::Float(v) => {
            let mut d = v[lo..hi].to_vec();
            d.resize(s, 0.0);
            TensorData::Float(d)
        }
        TensorData::Int(v) => {
            let mut d = v[lo..hi].to_vec();
            d.resize(s, 0);
            TensorData::Int(d)
        }
    };
    Ok(Tensor {
        dtype: t.dtype,
        shape: vec![s],
        data,
    })
}

/// The tensor of `shape` whose shards are `parts` (in replica order): the inverse of
/// [`shard_of`] (the padding is dropped).
pub fn unshard(parts: &[Tensor], shape: &[usize]) -> Result<Tensor, String> {
    let Some(first) = parts.first() else {
        return Err("no shards to join".into());
    };
    let n = crate::size::checked_num_elements(shape)
        .ok_or_else(|| format!("the shape {shape:?} overflows"))?;
    let s = shard_len(n as u64, parts.len() as u64) as usize;
    for (d, p) in parts.iter().enumerate() {
        if p.dtype != first.dtype || p.shape != [s] {
            return Err(format!(
                "shard {d} is {} {:?}, expected {} [{s}] (a tensor of {n} elements over {} replicas)",
                p.dtype,
                p.shape,
                first.dtype,
                parts.len()
            ));
        }
    }
    let data = match &first.data {
        TensorData::Float(_) => {
            let mut v = Vec::with_capacity(s * parts.len());
            for p in parts {
                if let TensorData::Float(x) = &p.data {
                    v.extend_from_slice(x);
                }
            }
            v.truncate(n);
            TensorData::Float(v)
        }
        TensorData::Int(_) => {
            let mut v = Vec::with_capacity(s * parts.len());
            for p in parts {
                if let TensorData::Int(x) = &p.data {
                    v.extend_from_slice(x);
                }
            }
            v.truncate(n);
            TensorData::Int(v)
        }
    };
    Ok(Tensor {
        dtype: first.dtype,
        shape: shape.to_vec(),
        data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    #[test]
    fn shards_join_back_for_every_split() {
        for n in [1usize, 2, 5, 7, 12, 13] {
            for d in 1..=6usize {
                let t = Tensor::from_f64(DType::F32, vec![n], (0..n).map(|i| i as f64).collect());
                let parts: Vec<Tensor> = (0..d).map(|i| shard_of(&t, d, i).unwrap()).collect();
                let s = shard_len(n as u64, d as u64) as usize;
                assert!(parts.iter().all(|p| p.shape == [s]));
                // Shard i starts at element i·s; the padding is zeros.
                for (i, p) in parts.iter().enumerate() {
                    let v = p.to_f64_vec();
                    for (j, &x) in v.iter().enumerate() {
                        let k = i * s + j;
                        assert_eq!(x, if k < n { k as f64 } else { 0.0 });
                    }
                }
                assert_eq!(unshard(&parts, &[n]).unwrap(), t);
            }
        }
        let t = Tensor::from_i64(DType::I64, vec![2, 3], vec![1, 2, 3, 4, 5, 6]);
        let parts: Vec<Tensor> = (0..4).map(|i| shard_of(&t, 4, i).unwrap()).collect();
        assert_eq!(unshard(&parts, &[2, 3]).unwrap(), t);
        assert!(shard_of(&t, 4, 4).is_err());
        // Two shards of 2 cannot be a 2x3 tensor over 2 replicas (shards of 3).
        assert!(unshard(&parts[..2], &[2, 3]).is_err());
    }
}
