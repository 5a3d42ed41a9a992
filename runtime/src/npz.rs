//! `.npz` archives (numpy's `savez`): a zip of `NAME.npy` files, read with `zip` and our own `.npy` header check and decoder (every allocation fallible), written with `npyz`.
//!
//! Element types: f32, f64, i64, i32, i8, bool (and f16 read as f16). Arrays are written
//! uncompressed, as `numpy.savez` does; reading accepts stored and deflated entries.

use std::fs::File;
use std::io::{Cursor, Read, Write};
use std::path::Path;

use npyz::WriterBuilder;
use ppir::{DType, Tensor, TensorData};

/// Why an `.npz` cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum NpzError {
    /// The archive or an array in it is not what ppcc reads, explained.
    #[error("{0}")]
    Invalid(String),
    /// What was being read or written when `source` failed.
    #[error("{context}")]
    Context {
        context: String,
        #[source]
        source: Box<NpzError>,
    },
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Zip(#[from] zip::result::ZipError),
    #[error(transparent)]
    Size(#[from] ppir::size::SizeError),
    #[error(transparent)]
    Npyz(#[from] npyz::DTypeError),
}

type Result<T, E = NpzError> = std::result::Result<T, E>;

macro_rules! bail {
    ($($t:tt)*) => {
        return Err(NpzError::Invalid(format!($($t)*)))
    };
}

/// `anyhow`-style context for this module's errors.
trait Context<T> {
    fn with_context<C: std::fmt::Display>(self, f: impl FnOnce() -> C) -> Result<T>;
}

impl<T, E: Into<NpzError>> Context<T> for Result<T, E> {
    fn with_context<C: std::fmt::Display>(self, f: impl FnOnce() -> C) -> Result<T> {
        self.map_err(|e| NpzError::Context {
            context: f().to_string(),
            source: Box::new(e.into()),
        })
    }
}

impl<T> Context<T> for Option<T> {
    fn with_context<C: std::fmt::Display>(self, f: impl FnOnce() -> C) -> Result<T> {
        self.ok_or_else(|| NpzError::Invalid(f().to_string()))
    }
}

/// numpy writes headers of a few hundred bytes and refuses to read ones over 10,000 by
/// default; a 4 GB header length is an attack, not an array.
const MAX_HEADER_BYTES: usize = 1 << 16;

/// The parts of an `.npy` header ppcc needs, parsed before any data is read.
struct NpyHead {
    shape: Vec<usize>,
    /// The dtype string without its byte-order mark (`f4`, `i8`, `b1`...).
    key: String,
    /// Element size in bytes, in the file.
    elem_bytes: usize,
    /// Column-major data (`fortran_order: True`).
    fortran: bool,
}

/// Read and check the header of array `name`: its shape's element count and byte size
/// must be representable (a shape `(2**62, 4)` wraps to 0 elements in unchecked
/// arithmetic) and its dtype one ppcc reads.
fn read_head(name: &str, r: &mut impl Read) -> Result<NpyHead> {
    let mut raw = vec![0u8; 8];
    r.read_exact(&mut raw)
        .with_context(|| format!("array `{name}` is not a valid .npy: it ends in its header"))?;
    if &raw[..6] != b"\x93NUMPY" {
        bail!("array `{name}` is not a valid .npy (no \\x93NUMPY magic)");
    }
    let len_bytes = match raw[6] {
        1 => 2,
        2 | 3 => 4,
        v => bail!("array `{name}`: unsupported .npy version {v}.{}", raw[7]),
    };
    let mut len = [0u8; 4];
    r.read_exact(&mut len[..len_bytes])
        .with_context(|| format!("array `{name}` is not a valid .npy: it ends in its header"))?;
    raw.extend_from_slice(&len[..len_bytes]);
    let header_len = u32::from_le_bytes(len) as usize;
    if header_len > MAX_HEADER_BYTES {
        bail!("array `{name}`: its .npy header claims {header_len} bytes (at most {MAX_HEADER_BYTES})");
    }
    let start = raw.len();
    raw.resize(start + header_len, 0);
    r.read_exact(&mut raw[start..])
        .with_context(|| format!("array `{name}` is not a valid .npy: it ends in its header"))?;
    let text = std::str::from_utf8(&raw[start..])
        .ok()
        .and_then(|t| t.trim_end().parse::<py_literal::Value>().ok());
    let Some(py_literal::Value::Dict(entries)) = text else {
        bail!("array `{name}` is not a valid .npy: its header is not a Python dict");
    };
    let get = |key: &str| {
        entries
            .iter()
            .find(|(k, _)| matches!(k, py_literal::Value::String(s) if s == key))
            .map(|(_, v)| v)
    };
    let shape = match get("shape") {
        Some(py_literal::Value::Tuple(dims) | py_literal::Value::List(dims)) => dims
            .iter()
            .map(|d| match d {
                py_literal::Value::Integer(i) => i.to_string().parse::<usize>().ok(),
                _ => None,
            })
            .collect::<Option<Vec<usize>>>(),
        _ => None,
    };
    let Some(shape) = shape else {
        bail!("array `{name}`: the .npy header's shape is not a tuple of sizes");
    };
    let type_str = match get("descr") {
        Some(py_literal::Value::String(t)) => t.clone(),
        Some(other) => bail!("array `{name}`: structured dtype {other} is unsupported"),
        None => bail!("array `{name}` is not a valid .npy: its header has no descr"),
    };
    if type_str.starts_with('>') {
        bail!("array `{name}`: big-endian dtype {type_str} is unsupported");
    }
    let key = type_str.trim_start_matches(['<', '|', '=']).to_string();
    let elem_bytes = match key.as_str() {
        "f8" | "i8" => 8,
        "f4" | "i4" => 4,
        "f2" => 2,
        "i1" | "b1" => 1,
        _ => bail!("array `{name}`: dtype {type_str} is unsupported (use f32, f64, f16, i64, i32, i8 or bool)"),
    };
    if ppir::size::checked_size_bytes(&shape, elem_bytes).is_none() {
        bail!("array `{name}`: shape {shape:?} is too large: its size overflows 64-bit arithmetic");
    }
    let fortran = match get("fortran_order") {
        Some(py_literal::Value::Boolean(b)) => *b,
        None => false,
        Some(other) => {
            bail!("array `{name}`: the .npy header's fortran_order is {other}, not a bool")
        }
    };
    Ok(NpyHead {
        shape,
        key,
        elem_bytes,
        fortran,
    })
}

/// Read array `name` from `r` (an `.npy` stream): the header, then exactly the data bytes
/// its shape declares. Whatever follows is never read, so a compressed entry that inflates
/// to far more than its header declares (a deflate bomb) costs nothing.
fn read_array(name: &str, mut r: impl Read) -> Result<Tensor> {
    let head = read_head(name, &mut r)?;
    let n = ppir::size::checked_num_elements(&head.shape).unwrap_or(usize::MAX);
    let data_bytes = n * head.elem_bytes;
    // The file's bytes, the decoded elements, then the tensor (8 bytes an element).
    let needed = (data_bytes as u64)
        .saturating_mul(2)
        .saturating_add((n as u64).saturating_mul(8));
    ppir::size::check_memory(needed, || {
        format!(
            "array `{name}` (shape {:?}, dtype {})",
            head.shape, head.key
        )
    })?;
    let mut data = Vec::new();
    data.try_reserve_exact(data_bytes).map_err(|_| {
        NpzError::Invalid(format!(
            "array `{name}` (shape {:?}): cannot allocate {} for its data",
            head.shape,
            ppir::size::Bytes(data_bytes as u64)
        ))
    })?;
    r.take(data_bytes as u64)
        .read_to_end(&mut data)
        .with_context(|| format!("reading the data of array `{name}`"))?;
    if data.len() != data_bytes {
        bail!(
            "array `{name}`: {} bytes of data for shape {:?} of {}-byte elements ({data_bytes} bytes)",
            data.len(),
            head.shape,
            head.elem_bytes
        );
    }
    // Decoded here rather than by npyz so that every allocation is fallible (an array that
    // does not fit is an error, not an abort).
    let (dtype, data) = decode(name, &head.key, &data, n)?;
    if data.len() != n {
        bail!(
            "array `{name}`: {} elements for shape {:?}",
            data.len(),
            head.shape
        );
    }
    let mut t = Tensor {
        dtype,
        shape: head.shape,
        data,
    };
    if head.fortran && t.shape.len() > 1 {
        t = from_fortran(name, t)?;
    }
    Ok(t)
}

/// A vector of exactly `n` elements from `items`, allocated fallibly.
fn collect_exact<T>(name: &str, n: usize, items: impl Iterator<Item = T>) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| {
        NpzError::Invalid(format!(
            "array `{name}`: cannot allocate {} for its {n} elements",
            ppir::size::Bytes((n as u64).saturating_mul(8))
        ))
    })?;
    v.extend(items);
    Ok(v)
}

/// Little-endian `.npy` data of dtype `key` (checked by [`read_head`]) as a tensor's data.
fn decode(name: &str, key: &str, bytes: &[u8], n: usize) -> Result<(DType, TensorData)> {
    fn le<const N: usize>(c: &[u8]) -> [u8; N] {
        let mut a = [0u8; N];
        a.copy_from_slice(c);
        a
    }
    let float = |w: usize, f: &dyn Fn(&[u8]) -> f64| {
        collect_exact(name, n, bytes.chunks_exact(w).map(f)).map(TensorData::Float)
    };
    let int = |w: usize, f: &dyn Fn(&[u8]) -> i64| {
        collect_exact(name, n, bytes.chunks_exact(w).map(f)).map(TensorData::Int)
    };
    Ok(match key {
        "f4" => (DType::F32, float(4, &|c| f32::from_le_bytes(le(c)) as f64)?),
        "f8" => (DType::F64, float(8, &|c| f64::from_le_bytes(le(c)))?),
        "f2" => (
            DType::F16,
            float(2, &|c| {
                half::f16::from_bits(u16::from_le_bytes(le(c))).to_f64()
            })?,
        ),
        "i8" => (DType::I64, int(8, &|c| i64::from_le_bytes(le(c)))?),
        "i4" => (DType::I32, int(4, &|c| i32::from_le_bytes(le(c)) as i64)?),
        "i1" => (DType::I8, int(1, &|c| c[0] as i8 as i64)?),
        "b1" => (DType::Bool, int(1, &|c| i64::from(c[0] != 0))?),
        other => bail!("array `{name}`: dtype {other} is unsupported"),
    })
}

/// Reorder a column-major tensor to row-major.
fn from_fortran(name: &str, t: Tensor) -> Result<Tensor> {
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
        TensorData::Float(v) => {
            TensorData::Float(collect_exact(name, n, (0..n).map(|i| v[src(i)]))?)
        }
        TensorData::Int(v) => TensorData::Int(collect_exact(name, n, (0..n).map(|i| v[src(i)]))?),
    };
    Ok(Tensor {
        dtype: t.dtype,
        shape,
        data,
    })
}

/// Read every array of an `.npz` file, in archive order.
pub fn read_npz(path: &Path) -> Result<Vec<(String, Tensor)>> {
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    read_npz_from(file, path)
}

/// Read every array of an `.npz` archive already in memory (bytes checked against a
/// recorded hash: what is parsed is what was checked); `path` names it in errors.
pub fn read_npz_bytes(bytes: &[u8], path: &Path) -> Result<Vec<(String, Tensor)>> {
    read_npz_from(Cursor::new(bytes), path)
}

fn read_npz_from(r: impl Read + std::io::Seek, path: &Path) -> Result<Vec<(String, Tensor)>> {
    let mut zip = zip::ZipArchive::new(r)
        .with_context(|| format!("{} is not an .npz (zip) archive", path.display()))?;
    let mut out = vec![];
    for i in 0..zip.len() {
        let mut entry = zip.by_index(i)?;
        let Some(name) = entry.name().strip_suffix(".npy").map(str::to_string) else {
            continue;
        };
        // The entry's declared sizes may lie; read_array reads what the header declares.
        let t = read_array(&name, std::io::BufReader::new(&mut entry))
            .with_context(|| format!("reading {}", path.display()))?;
        out.push((name, t));
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

    /// The error and its causes, as `ppcc` prints them.
    fn chain(e: &dyn std::error::Error) -> String {
        let mut s = e.to_string();
        let mut cur = e.source();
        while let Some(c) = cur {
            s.push_str(&format!(": {c}"));
            cur = c.source();
        }
        s
    }

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

    /// An `.npy` header (version 1) declaring `shape` of dtype `descr`, without data.
    pub(crate) fn npy_header(descr: &str, shape: &str) -> Vec<u8> {
        let mut text =
            format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
        while (10 + text.len() + 1) % 64 != 0 {
            text.push(' ');
        }
        text.push('\n');
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend_from_slice(&(text.len() as u16).to_le_bytes());
        out.extend_from_slice(text.as_bytes());
        out
    }

    /// An `.npz` with one entry `x.npy`: `header`, then `zeros` zero bytes, deflated.
    pub(crate) fn write_entry(path: &Path, header: &[u8], zeros: usize) {
        let mut zip = zip::ZipWriter::new(File::create(path).unwrap());
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated)
            .large_file(zeros > u32::MAX as usize / 2);
        zip.start_file("x.npy", options).unwrap();
        zip.write_all(header).unwrap();
        let chunk = vec![0u8; 1 << 20];
        let mut left = zeros;
        while left > 0 {
            let k = left.min(chunk.len());
            zip.write_all(&chunk[..k]).unwrap();
            left -= k;
        }
        zip.finish().unwrap();
    }

    fn scratch(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("ppcc-npz-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Issue 12, item 2: a shape whose element count wraps to 0 ((2^62, 4), and 2^31 x
    /// 2^31 x 4) with no data was accepted as an empty array.
    #[test]
    fn overflowing_shapes_are_refused() {
        let dir = scratch("overflow");
        let path = dir.join("big.npz");
        for shape in ["(4611686018427387904, 4)", "(2147483648, 2147483648, 4)"] {
            write_entry(&path, &npy_header("<f4", shape), 0);
            let e = chain(&read_npz(&path).unwrap_err());
            assert!(
                e.contains("array `x`: shape [") && e.contains("is too large"),
                "{e}"
            );
        }
        // A size numpy cannot write either, and a header past any real one.
        write_entry(&path, &npy_header("<f4", "(99999999999999999999999,)"), 0);
        let e = chain(&read_npz(&path).unwrap_err());
        assert!(e.contains("shape is not a tuple of sizes"), "{e}");
        let mut huge = b"\x93NUMPY\x02\x00".to_vec();
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        write_entry(&path, &huge, 0);
        let e = chain(&read_npz(&path).unwrap_err());
        assert!(e.contains("header claims 4294967295 bytes"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }

    /// Issue 12, item 5: a deflate bomb. With a header declaring 2^40 f32 elements, the old
    /// reader inflated the whole entry and then aborted allocating 4 TB; now the header is
    /// checked against available memory before any data is read.
    #[test]
    fn deflate_bombs_are_bounded_by_the_header() {
        let dir = scratch("bomb");
        let path = dir.join("bomb.npz");
        write_entry(&path, &npy_header("<f4", "(1099511627776,)"), 64 << 20);
        let e = chain(&read_npz(&path).unwrap_err());
        if ppir::size::available_memory().is_some() {
            assert!(
                e.contains("array `x` (shape [1099511627776], dtype f4) needs"),
                "{e}"
            );
        }
        // A small header: only its 2 kB of data are read out of 64 MB of zeros.
        write_entry(&path, &npy_header("<f4", "(8, 64)"), 64 << 20);
        let back = read_npz(&path).unwrap();
        assert_eq!(back[0].1.shape, vec![8, 64]);
        // Data that ends early is an error naming the array.
        write_entry(&path, &npy_header("<f4", "(8, 64)"), 100);
        let e = chain(&read_npz(&path).unwrap_err());
        assert!(
            e.contains("array `x`: 100 bytes of data for shape [8, 64]"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn fortran_order_is_reordered() {
        let t = Tensor::from_i64(DType::I64, vec![2, 3], vec![0, 3, 1, 4, 2, 5]);
        assert_eq!(
            from_fortran("t", t).unwrap().as_i64().unwrap(),
            &[0, 1, 2, 3, 4, 5]
        );
    }
}
