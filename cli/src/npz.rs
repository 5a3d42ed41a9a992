//! `.npz` archives (numpy's `savez`): a zip of `NAME.npy` files, read with `npyz` and `zip`.
//!
//! Element types: f32, f64, i64, i32, i8, bool (and f16 read as f16). Arrays are written
//! uncompressed, as `numpy.savez` does; reading accepts stored and deflated entries.

use std::fs::File;
use std::io::{Cursor, Read, Write};
use std::path::Path;

use anyhow::{bail, Context, Result};
use npyz::WriterBuilder;
use ppir::{DType, Tensor, TensorData};

fn to_tensor(name: &str, bytes: &[u8]) -> Result<Tensor> {
    let npy =
        npyz::NpyFile::new(bytes).with_context(|| format!("array `{name}` is not a valid .npy"))?;
    let shape: Vec<usize> = npy.shape().iter().map(|&d| d as usize).collect();
    let fortran = npy.order() == npyz::Order::Fortran;
    let type_str = match npy.dtype() {
        npyz::DType::Plain(t) => t.to_string(),
        other => bail!("array `{name}`: structured dtype {other:?} is unsupported"),
    };
    let n: usize = shape.iter().product();
    let key = type_str.trim_start_matches(['<', '|', '=']);
    if type_str.starts_with('>') {
        bail!("array `{name}`: big-endian dtype {type_str} is unsupported");
    }
    let (dtype, data) = match key {
        "f4" => (DType::F32, TensorData::Float(npy.into_vec::<f32>()?.into_iter().map(f64::from).collect())),
        "f8" => (DType::F64, TensorData::Float(npy.into_vec::<f64>()?)),
        "f2" => {
            let raw = npy.into_vec::<u16>().context("reading f16 data")?;
            (DType::F16, TensorData::Float(raw.into_iter().map(|b| half::f16::from_bits(b).to_f64()).collect()))
        }
        "i8" => (DType::I64, TensorData::Int(npy.into_vec::<i64>()?)),
        "i4" => (DType::I32, TensorData::Int(npy.into_vec::<i32>()?.into_iter().map(i64::from).collect())),
        "i1" => (DType::I8, TensorData::Int(npy.into_vec::<i8>()?.into_iter().map(i64::from).collect())),
        "b1" => (DType::Bool, TensorData::Int(npy.into_vec::<bool>()?.into_iter().map(i64::from).collect())),
        _ => bail!("array `{name}`: dtype {type_str} is unsupported (use f32, f64, f16, i64, i32, i8 or bool)"),
    };
    if data.len() != n {
        bail!(
            "array `{name}`: {} elements for shape {shape:?}",
            data.len()
        );
    }
    let mut t = Tensor { dtype, shape, data };
    if fortran && t.shape.len() > 1 {
        t = from_fortran(t);
    }
    Ok(t)
}

/// Reorder a column-major tensor to row-major.
fn from_fortran(t: Tensor) -> Tensor {
    let shape = t.shape.clone();
    let rank = shape.len();
    let n = t.num_elements();
    let c_strides = ppir::tensor::strides_of(&shape);
    let mut f_strides = vec![1usize; rank];
    for i in 1..rank {
        f_strides[i] = f_strides[i - 1] * shape[i - 1];
    }
    let src = |i: usize| -> usize {
        (0..rank)
            .map(|d| (i / c_strides[d]) % shape[d] * f_strides[d])
            .sum()
    };
    let data = match &t.data {
        TensorData::Float(v) => TensorData::Float((0..n).map(|i| v[src(i)]).collect()),
        TensorData::Int(v) => TensorData::Int((0..n).map(|i| v[src(i)]).collect()),
    };
    Tensor {
        dtype: t.dtype,
        shape,
        data,
    }
}

/// Read every array of an `.npz` file, in archive order.
pub fn read_npz(path: &Path) -> Result<Vec<(String, Tensor)>> {
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut zip = zip::ZipArchive::new(file)
        .with_context(|| format!("{} is not an .npz (zip) archive", path.display()))?;
    let mut out = vec![];
    for i in 0..zip.len() {
        let mut entry = zip.by_index(i)?;
        let Some(name) = entry.name().strip_suffix(".npy").map(str::to_string) else {
            continue;
        };
        let mut bytes = Vec::with_capacity(entry.size().min(1 << 30) as usize);
        entry
            .read_to_end(&mut bytes)
            .with_context(|| format!("reading `{name}` from {}", path.display()))?;
        out.push((name.clone(), to_tensor(&name, &bytes)?));
    }
    Ok(out)
}

fn npy_bytes(t: &Tensor) -> Result<Vec<u8>> {
    let shape: Vec<u64> = t.shape.iter().map(|&d| d as u64).collect();
    let mut buf = Cursor::new(Vec::new());
    macro_rules! write_as {
        ($ty:ty, $iter:expr) => {{
            let mut w = npyz::WriteOptions::<$ty>::new()
                .default_dtype()
                .shape(&shape)
                .writer(&mut buf)
                .begin_nd()?;
            w.extend($iter)?;
            w.finish()?;
        }};
    }
    match (&t.data, t.dtype) {
        (TensorData::Float(v), DType::F64) => write_as!(f64, v.iter().copied()),
        (TensorData::Float(v), _) => write_as!(f32, v.iter().map(|&x| x as f32)),
        (TensorData::Int(v), DType::I64) => write_as!(i64, v.iter().copied()),
        (TensorData::Int(v), DType::I32) => write_as!(i32, v.iter().map(|&x| x as i32)),
        (TensorData::Int(v), DType::I8) => write_as!(i8, v.iter().map(|&x| x as i8)),
        (TensorData::Int(v), _) => write_as!(bool, v.iter().map(|&x| x != 0)),
    }
    Ok(buf.into_inner())
}

/// Write arrays to an `.npz` file (uncompressed, like `numpy.savez`). f16 and bf16 are
/// written as f32 (numpy has no bf16).
pub fn write_npz(path: &Path, arrays: &[(String, Tensor)]) -> Result<()> {
    let file = File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let mut zip = zip::ZipWriter::new(file);
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Stored)
        .large_file(
            arrays
                .iter()
                .any(|(_, t)| t.num_elements() * 8 >= u32::MAX as usize),
        );
    for (name, t) in arrays {
        zip.start_file(format!("{name}.npy"), options)?;
        zip.write_all(&npy_bytes(t)?)?;
    }
    zip.finish()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let dir = std::env::temp_dir().join(format!("ppcc-npz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.npz");
        let arrays = vec![
            (
                "x".to_string(),
                Tensor::from_f32(vec![2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, -6.5]),
            ),
            (
                "ids".to_string(),
                Tensor::from_i64(DType::I64, vec![3], vec![1, -2, 3]),
            ),
            (
                "i".to_string(),
                Tensor::from_i64(DType::I32, vec![1], vec![7]),
            ),
            (
                "d".to_string(),
                Tensor::from_f64(DType::F64, vec![], vec![0.1]),
            ),
            (
                "m".to_string(),
                Tensor::from_i64(DType::Bool, vec![2], vec![1, 0]),
            ),
        ];
        write_npz(&path, &arrays).unwrap();
        let back = read_npz(&path).unwrap();
        assert_eq!(back, arrays);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn fortran_order_is_reordered() {
        let t = Tensor::from_i64(DType::I64, vec![2, 3], vec![0, 3, 1, 4, 2, 5]);
        assert_eq!(from_fortran(t).as_i64().unwrap(), &[0, 1, 2, 3, 4, 5]);
    }
}
