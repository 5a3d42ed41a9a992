//! Checked tensor sizes, and whether a tensor fits in memory.
//!
//! Shapes come from users (ONNX dims, `.npz` headers, textual IR, `--batch`), so every
//! element count and byte size is computed here with checked arithmetic. A shape is
//! *representable* when the product of its non-zero dimensions, times the element size,
//! is at most [`MAX_TENSOR_BYTES`] (`i64::MAX`, the range of memref sizes and offsets in
//! generated code). Zero dimensions are left out of that product on purpose: then every
//! partial product of the shape (strides, rows, the outer and inner extents of an axis) fits
//! too, and code downstream of the verifier may multiply dimensions freely.
//!
//! Fitting in memory is a separate question, asked before large allocations
//! ([`check_memory`]): the interpreter, the runtime's buffers and the `.npz` reader refuse a
//! tensor larger than the memory available instead of aborting in the allocator.

use std::fmt;

/// The largest byte size (and so element count) of a representable tensor.
pub const MAX_TENSOR_BYTES: u64 = i64::MAX as u64;

/// Allocations below this size are not checked against available memory (reading
/// `/proc/meminfo` for every small tensor would cost more than it protects).
pub const MEMORY_CHECK_THRESHOLD: u64 = 64 << 20;

/// A tensor whose size cannot be represented, or does not fit in memory.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    /// The element count or byte size of a shape overflows.
    #[error("shape {shape} of {elem_bytes}-byte elements is too large: its size overflows 64-bit arithmetic (at most {MAX_TENSOR_BYTES} bytes)")]
    Overflow {
        /// The shape as written (`[4611686018427387904, 4]`, or a tensor type).
        shape: String,
        elem_bytes: u64,
    },
    /// A tensor needs more memory than is available.
    #[error("{what} needs {} but only {} of memory is available", Bytes(*needed), Bytes(*available))]
    OutOfMemory {
        what: String,
        needed: u64,
        available: u64,
    },
}

/// A byte count for messages: `32.0 TB (32000000000000 bytes)`.
#[derive(Clone, Copy, Debug)]
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        if n < 1000 {
            return write!(f, "{n} bytes");
        }
        let (scale, unit) = [
            (1e15, "PB"),
            (1e12, "TB"),
            (1e9, "GB"),
            (1e6, "MB"),
            (1e3, "kB"),
        ]
        .into_iter()
        .find(|&(s, _)| n as f64 >= s)
        .unwrap_or((1e3, "kB"));
        write!(f, "{:.1} {unit} ({n} bytes)", n as f64 / scale)
    }
}

/// The element count of `dims` (`None` when a shape is not representable with
/// `elem_bytes`-byte elements, see the module docs).
fn checked_count(dims: impl IntoIterator<Item = u64>, elem_bytes: u64) -> Option<u64> {
    let mut nonzero = 1u64;
    let mut has_zero = false;
    for d in dims {
        if d == 0 {
            has_zero = true;
        } else {
            nonzero = nonzero.checked_mul(d)?;
        }
    }
    if nonzero.checked_mul(elem_bytes.max(1))? > MAX_TENSOR_BYTES {
        return None;
    }
    Some(if has_zero { 0 } else { nonzero })
}

fn overflow(shape: impl fmt::Debug, elem_bytes: u64) -> SizeError {
    SizeError::Overflow {
        shape: format!("{shape:?}"),
        elem_bytes,
    }
}

/// The number of elements of `shape`, or `None` if the shape is not representable (with
/// one-byte elements).
///
/// ```
/// use ppir::size::checked_num_elements;
/// assert_eq!(checked_num_elements(&[2, 3, 4]), Some(24));
/// assert_eq!(checked_num_elements(&[1 << 62, 4]), None);
/// ```
pub fn checked_num_elements(shape: &[usize]) -> Option<usize> {
    checked_count(shape.iter().map(|&d| d as u64), 1).and_then(|n| usize::try_from(n).ok())
}

/// The byte size of `shape` with `elem_bytes`-byte elements, or `None` if it overflows.
pub fn checked_size_bytes(shape: &[usize], elem_bytes: usize) -> Option<usize> {
    let n = checked_count(shape.iter().map(|&d| d as u64), elem_bytes as u64)?;
    usize::try_from(n * elem_bytes as u64).ok()
}

/// [`checked_num_elements`] with an error naming the shape.
pub fn num_elements(shape: &[usize]) -> Result<usize, SizeError> {
    checked_num_elements(shape).ok_or_else(|| overflow(shape, 1))
}

/// [`checked_size_bytes`] with an error naming the shape.
pub fn size_bytes(shape: &[usize], elem_bytes: usize) -> Result<usize, SizeError> {
    checked_size_bytes(shape, elem_bytes).ok_or_else(|| overflow(shape, elem_bytes as u64))
}

/// The element count of `shape` (u64 dimensions, as in ONNX and tensor types), checked
/// for `elem_bytes`-byte elements.
pub fn num_elements_u64(shape: &[u64], elem_bytes: usize) -> Result<u64, SizeError> {
    checked_count(shape.iter().copied(), elem_bytes as u64)
        .ok_or_else(|| overflow(shape, elem_bytes as u64))
}

/// Memory available to this process in bytes: `MemAvailable` in `/proc/meminfo`, capped by
/// a cgroup v2 memory limit; `None` where neither can be read (then nothing is refused up
/// front and allocation failures are left to the allocator).
pub fn available_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("MemAvailable:"))
            .and_then(|rest| rest.trim().strip_suffix("kB"))
            .and_then(|kb| kb.trim().parse::<u64>().ok())
            .map(|kb| kb.saturating_mul(1024))
    });
    // The limit itself, not the room left under it: the cgroup's usage counts page cache
    // that would be reclaimed.
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok()); // "max": no limit
    match (meminfo, cgroup) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Refuse to allocate `bytes` for `what` (described lazily: `the result of "pp.expand"
/// %y (tensor<2000000x4000000xf32>)`) when more than the available memory. Small sizes
/// ([`MEMORY_CHECK_THRESHOLD`]) always pass; so does everything when the available memory
/// is unknown.
pub fn check_memory(bytes: u64, what: impl FnOnce() -> String) -> Result<(), SizeError> {
    if bytes < MEMORY_CHECK_THRESHOLD {
        return Ok(());
    }
    match available_memory() {
        Some(available) if bytes > available => Err(SizeError::OutOfMemory {
            what: what(),
            needed: bytes,
            available,
        }),
        _ => Ok(()),
    }
}

/// Refuse a function one of whose values (an argument or an op result) alone needs more
/// memory than is available, with `bytes_of` giving a static type's size in the caller's
/// representation (native code: the dtype's size; the interpreter: 8 bytes an element).
/// The error names the function, the op (its result and source location) and the type.
pub fn check_function_memory(
    f: &crate::Function,
    bytes_of: impl Fn(&crate::TensorType) -> u64,
) -> Result<(), SizeError> {
    let mut available = None;
    let mut check = |ty: &crate::TensorType, what: &dyn Fn() -> String| {
        let bytes = bytes_of(ty);
        if bytes < MEMORY_CHECK_THRESHOLD {
            return Ok(());
        }
        let Some(avail) = *available.get_or_insert_with(available_memory) else {
            return Ok(());
        };
        if bytes > avail {
            return Err(SizeError::OutOfMemory {
                what: format!("@{}: {} ({ty})", f.name, what()),
                needed: bytes,
                available: avail,
            });
        }
        Ok(())
    };
    for v in f.arg_values() {
        check(f.ty(v), &|| format!("argument %{}", f.value(v).name))?;
    }
    for &op in f.ops() {
        if op.index() >= f.num_op_slots() || f.op(op).is_removed() {
            continue;
        }
        let data = f.op(op);
        for &v in data.results() {
            check(f.ty(v), &|| {
                let loc = data
                    .loc
                    .as_deref()
                    .map(|l| format!(" (loc {l:?})"))
                    .unwrap_or_default();
                format!("%{} = \"{}\"{loc}", f.value(v).name, data.kind)
            })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_bytes() {
        assert_eq!(checked_num_elements(&[]), Some(1));
        assert_eq!(checked_num_elements(&[2, 3, 4]), Some(24));
        assert_eq!(checked_num_elements(&[0, 7]), Some(0));
        assert_eq!(checked_size_bytes(&[2, 3], 8), Some(48));
        assert_eq!(num_elements_u64(&[5, 0, 2], 4), Ok(0));
    }

    #[test]
    fn overflow_is_refused() {
        // 2^62 * 4 wraps to 0 in unchecked arithmetic.
        assert_eq!(checked_num_elements(&[1 << 62, 4]), None);
        // 2^31 * 2^31 * 4 = 2^64 wraps to 0 too.
        assert!(num_elements_u64(&[1 << 31, 1 << 31, 4], 4).is_err());
        // The element count fits but the byte size does not.
        assert_eq!(checked_num_elements(&[1 << 61]), Some(1 << 61));
        assert_eq!(checked_size_bytes(&[1 << 61], 8), None);
        // A zero dimension does not hide an overflowing partial product.
        assert_eq!(checked_num_elements(&[0, 1 << 62, 1 << 62]), None);
        let e = size_bytes(&[1 << 62, 4], 4).unwrap_err();
        assert!(e.to_string().contains("[4611686018427387904, 4]"), "{e}");
    }

    #[test]
    fn memory_check() {
        assert!(check_memory(1 << 20, || unreachable!()).is_ok());
        if let Some(avail) = available_memory() {
            let e = check_memory(avail.saturating_add(1 << 40), || "a tensor".into()).unwrap_err();
            assert!(matches!(e, SizeError::OutOfMemory { .. }));
            assert!(e.to_string().starts_with("a tensor needs "), "{e}");
        }
        assert_eq!(
            Bytes(32_000_000_000_000).to_string(),
            "32.0 TB (32000000000000 bytes)"
        );
    }

    #[test]
    fn function_memory_names_the_op() {
        use crate::{ArgKind, DType, Function, NewOp, OpKind, TensorType};
        let mut f = Function::new("main");
        let x = f.add_arg("x", TensorType::of(DType::F32, &[1, 1]), ArgKind::Input);
        let big = TensorType::of(DType::F32, &[2_000_000, 4_000_000]);
        let y = f.push(NewOp::new(OpKind::Expand, vec![x], vec![big]).loc("expand0"));
        f.set_results(vec![y]);
        let bytes = |t: &TensorType| t.size_bytes().unwrap_or(0);
        match check_function_memory(&f, bytes) {
            Err(e) => assert!(
                e.to_string().contains(
                    "\"pp.expand\" (loc \"expand0\") (tensor<2000000x4000000xf32>) needs 32.0 TB"
                ),
                "{e}"
            ),
            Ok(()) => assert!(available_memory().is_none()),
        }
    }
}
