//! cuBLAS for the matrix products of CUDA modules compiled with `--gpu-gemm cublas`.
//!
//! - The module's host code calls `ppcc_gpu_sgemm`/`ppcc_gpu_dgemm` (`gpu_shim.c`) with the
//!   support library's row-major contract (`ppcc_support.h`), restricted to what the
//!   lowering emits for the GPU: C0 is null or the result itself (the lowering broadcast it
//!   into the result with a kernel first), and every pointer is device (managed) memory.
//! - cuBLAS is column-major. A row-major `m × n` matrix with row stride `ld` is the
//!   column-major `n × m` matrix with the same leading dimension, its transpose; so the
//!   row-major `C = op(A)·op(B)` is computed as the column-major `Cᵀ = op(B)ᵀ·op(A)ᵀ`:
//!   operands swapped, the same transpose flags, `m` and `n` swapped ([`plan`]).
//! - The library is loaded on first use (`PPCC_CUBLAS_LIB`, else `libcublas.so.13`,
//!   `libcublas.so.12`, `libcublas.so`): ppcc builds and runs CPU plans, and CUDA plans
//!   with generated GEMM kernels, without it. Only the functions used are bound.
//! - One handle per device, on the device's stream (the stream the kernels run on, so a
//!   GEMM follows the kernels before it); a call returns once its product is complete, as
//!   kernel launches do.
//! - Math mode: cuBLAS's default, which does not use TF32 for `float` products, so results
//!   agree with the CPU's to rounding.
//!
//! What has run where: the row-major → column-major mapping is tested on the CPU against a
//! column-major reference (the tests below); the library binding against the real cuBLAS
//! only by hand; no GEMM has yet run on a GPU through this file (see BENCHMARKS.md).

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

type Status = c_int;
/// `cublasHandle_t`.
pub(crate) type Handle = *mut c_void;

const OP_N: c_int = 0;
const OP_T: c_int = 1;

type Gemm<T> = unsafe extern "C" fn(
    Handle,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    *const T,
    *const T,
    c_int,
    *const T,
    c_int,
    *const T,
    *mut T,
    c_int,
) -> Status;

type GemmBatched<T> = unsafe extern "C" fn(
    Handle,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    *const T,
    *const T,
    c_int,
    i64,
    *const T,
    c_int,
    i64,
    *const T,
    *mut T,
    c_int,
    i64,
    c_int,
) -> Status;

/// The functions used, from the loaded library.
struct Cublas {
    _lib: libloading::Library,
    path: String,
    create: unsafe extern "C" fn(*mut Handle) -> Status,
    set_stream: unsafe extern "C" fn(Handle, *mut c_void) -> Status,
    sgemm: Gemm<f32>,
    dgemm: Gemm<f64>,
    sgemm_batched: GemmBatched<f32>,
    dgemm_batched: GemmBatched<f64>,
    get_property: unsafe extern "C" fn(c_int, *mut c_int) -> Status,
    /// `cublasGetStatusString` (cuBLAS 11.4 and later).
    status_string: Option<unsafe extern "C" fn(Status) -> *const c_char>,
}

fn load() -> Result<Cublas, String> {
    let (lib, path) = super::load_library(
        "PPCC_CUBLAS_LIB",
        &["libcublas.so.13", "libcublas.so.12", "libcublas.so"],
    )
    .map_err(|tried| {
        format!(
            "this plan computes matrix products with cuBLAS (compiled with --gpu-gemm cublas), and cuBLAS cannot be loaded (tried {tried}): install it (the CUDA toolkit's libcublas, or the nvidia-cublas-cu12 wheel) or set PPCC_CUBLAS_LIB to its path, or compile the model again with --gpu-gemm kernels"
        )
    })?;
    macro_rules! sym {
        ($name:literal) => {
            // SAFETY: the symbol has the signature of cuBLAS's header (cublas_api.h, v2
            // API), which the field it goes into spells out.
            *unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                .map_err(|e| format!("{path}: no {} ({e})", $name))?
        };
    }
    Ok(Cublas {
        create: sym!("cublasCreate_v2"),
        set_stream: sym!("cublasSetStream_v2"),
        sgemm: sym!("cublasSgemm_v2"),
        dgemm: sym!("cublasDgemm_v2"),
        sgemm_batched: sym!("cublasSgemmStridedBatched"),
        dgemm_batched: sym!("cublasDgemmStridedBatched"),
        get_property: sym!("cublasGetProperty"),
        // SAFETY: as above; optional (older libraries lack it).
        status_string: unsafe { lib.get(b"cublasGetStatusString\0") }
            .ok()
            .map(|s| *s),
        path,
        _lib: lib,
    })
}

fn cublas() -> Result<&'static Cublas, String> {
    static LIB: OnceLock<Result<Cublas, String>> = OnceLock::new();
    LIB.get_or_init(load).as_ref().map_err(Clone::clone)
}

/// cuBLAS's version and the file it was loaded from (`12.4.5 (libcublas.so.12)`), or why
/// it cannot be loaded.
pub fn version() -> Result<String, String> {
    let l = cublas()?;
    let mut v = [0 as c_int; 3];
    for (i, x) in v.iter_mut().enumerate() {
        // SAFETY: MAJOR_VERSION = 0, MINOR_VERSION = 1, PATCH_LEVEL = 2; writes one int.
        unsafe { (l.get_property)(i as c_int, x) };
    }
    Ok(format!("{}.{}.{} ({})", v[0], v[1], v[2], l.path))
}

fn describe(l: &Cublas, s: Status) -> String {
    let name = match s {
        1 => "CUBLAS_STATUS_NOT_INITIALIZED",
        3 => "CUBLAS_STATUS_ALLOC_FAILED",
        7 => "CUBLAS_STATUS_INVALID_VALUE",
        8 => "CUBLAS_STATUS_ARCH_MISMATCH",
        11 => "CUBLAS_STATUS_MAPPING_ERROR",
        13 => "CUBLAS_STATUS_EXECUTION_FAILED",
        14 => "CUBLAS_STATUS_INTERNAL_ERROR",
        15 => "CUBLAS_STATUS_NOT_SUPPORTED",
        16 => "CUBLAS_STATUS_LICENSE_ERROR",
        _ => "",
    };
    // SAFETY: cuBLAS returns a static NUL-terminated string (or null).
    let text = l
        .status_string
        .map(|f| unsafe { f(s) })
        .filter(|p| !p.is_null())
        .map(|p| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned());
    match (name, text) {
        ("", Some(t)) => format!("{t} (status {s})"),
        ("", None) => format!("status {s}"),
        (n, _) => n.to_string(),
    }
}

/// A handle on the current context whose work goes to `stream`.
pub(crate) fn create_handle(stream: *mut c_void) -> Result<usize, String> {
    let l = cublas()?;
    let mut h: Handle = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the caller made the device's context current.
    let s = unsafe { (l.create)(&mut h) };
    if s != 0 {
        return Err(format!("cublasCreate: {}", describe(l, s)));
    }
    // SAFETY: `h` was just created, `stream` belongs to the current context.
    let s = unsafe { (l.set_stream)(h, stream) };
    if s != 0 {
        return Err(format!("cublasSetStream: {}", describe(l, s)));
    }
    Ok(h as usize)
}

/// A row-major product as the module asks for it (`ppcc_support.h`'s `ppcc_sgemm`
/// arguments without the pointers): `C = alpha·op(A)·op(B) [+ beta·C]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowMajor {
    /// Bit 0: A is stored transposed (`k × m`); bit 1: B is (`n × k`).
    pub flags: i64,
    pub m: i64,
    pub n: i64,
    pub k: i64,
    pub lda: i64,
    pub ldb: i64,
    pub ldc: i64,
    /// Whether C0 is the result itself (accumulate), with its strides.
    pub c0: Option<(i64, i64)>,
    /// Products in the batch (1: one product), and the element strides between the
    /// operands of consecutive ones (A, B, C; 0 repeats one matrix).
    pub count: i64,
    pub strides: [i64; 3],
}

/// The column-major call that computes a [`RowMajor`] product: `C' = op(A')·op(B') +
/// beta'·C'` with `A'` = the row-major B, `B'` = the row-major A, `C'` = C.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ColMajor {
    pub op_a: c_int,
    pub op_b: c_int,
    pub m: c_int,
    pub n: c_int,
    pub k: c_int,
    /// Leading dimensions of `A'` (the row-major B), `B'` (the row-major A) and C.
    pub lda: c_int,
    pub ldb: c_int,
    pub ldc: c_int,
    /// Whether `beta` applies (else C is overwritten: beta' = 0).
    pub accumulate: bool,
    /// Products, and the strides of `A'`, `B'` and C between them.
    pub count: c_int,
    pub stride_a: i64,
    pub stride_b: i64,
    pub stride_c: i64,
}

/// The cuBLAS call for `r`, `None` when the result has no elements, or why the module's
/// arguments are not a product this contract allows.
pub(crate) fn plan(r: &RowMajor) -> Result<Option<ColMajor>, String> {
    let int = |what: &str, x: i64| {
        c_int::try_from(x)
            .ok()
            .filter(|&v| v >= 0)
            .ok_or_else(|| format!("{what} = {x} is outside cuBLAS's 32-bit range"))
    };
    let (m, n, k) = (int("m", r.m)?, int("n", r.n)?, int("k", r.k)?);
    let (ta, tb) = (r.flags & 1 != 0, r.flags & 2 != 0);
    let (lda, ldb, ldc) = (int("lda", r.lda)?, int("ldb", r.ldb)?, int("ldc", r.ldc)?);
    // Row strides the stored matrices need (cuBLAS checks the same, column-major).
    let need = [
        ("lda", lda, if ta { m } else { k }),
        ("ldb", ldb, if tb { k } else { n }),
        ("ldc", ldc, n),
    ];
    for (what, ld, min) in need {
        if ld < min {
            return Err(format!(
                "{what} = {ld} is less than the {min} columns of its matrix (m {m}, n {n}, k {k}, flags {})",
                r.flags
            ));
        }
    }
    if let Some((rs, cs)) = r.c0 {
        if rs != r.ldc || cs != 1 {
            return Err(format!(
                "C0 in place with strides ({rs}, {cs}) instead of the result's ({}, 1)",
                r.ldc
            ));
        }
    }
    let count = int("batch count", r.count)?;
    if let Some(&s) = r.strides.iter().find(|&&s| s < 0) {
        return Err(format!("a negative batch stride {s}"));
    }
    if m == 0 || n == 0 || count == 0 {
        return Ok(None);
    }
    Ok(Some(ColMajor {
        op_a: if tb { OP_T } else { OP_N },
        op_b: if ta { OP_T } else { OP_N },
        m: n,
        n: m,
        k,
        // A matrix with no columns (k = 0) has any row stride; cuBLAS wants at least 1.
        lda: ldb.max(1),
        ldb: lda.max(1),
        ldc,
        accumulate: r.c0.is_some(),
        count,
        stride_a: r.strides[1],
        stride_b: r.strides[0],
        stride_c: r.strides[2],
    }))
}

/// The element types cuBLAS multiplies here.
pub(crate) trait Element: Copy {
    fn from_f64(x: f64) -> Self;
    /// The library's GEMM and strided-batched GEMM for this type, and its letter.
    fn gemm() -> Result<(Gemm<Self>, GemmBatched<Self>, char), String>;
}

impl Element for f32 {
    fn from_f64(x: f64) -> Self {
        x as f32
    }
    fn gemm() -> Result<(Gemm<f32>, GemmBatched<f32>, char), String> {
        let l = cublas()?;
        Ok((l.sgemm, l.sgemm_batched, 'S'))
    }
}

impl Element for f64 {
    fn from_f64(x: f64) -> Self {
        x
    }
    fn gemm() -> Result<(Gemm<f64>, GemmBatched<f64>, char), String> {
        let l = cublas()?;
        Ok((l.dgemm, l.dgemm_batched, 'D'))
    }
}

/// Run the product `r` with cuBLAS handle `h` (on the current context): `c = alpha·op(a)·
/// op(b) [+ beta·c]`. Queued on the handle's stream; the caller waits for it.
///
/// # Safety
/// `a`, `b` and `c` must address device memory of the sizes `r` describes, `h` must come
/// from [`create_handle`] in the current context.
pub(crate) unsafe fn gemm<T: Element>(
    h: usize,
    r: &RowMajor,
    alpha: f64,
    a: *const T,
    b: *const T,
    beta: f64,
    c: *mut T,
) -> Result<(), String> {
    let Some(p) = plan(r)? else {
        return Ok(());
    };
    let (one, batched, letter) = T::gemm()?;
    let al = T::from_f64(alpha);
    let be = T::from_f64(if p.accumulate { beta } else { 0.0 });
    let h = h as Handle;
    // SAFETY: the caller's contract; alpha and beta are host values (the default pointer
    // mode) that live across the call.
    let s = unsafe {
        if p.count == 1 {
            one(
                h, p.op_a, p.op_b, p.m, p.n, p.k, &al, b, p.lda, a, p.ldb, &be, c, p.ldc,
            )
        } else {
            batched(
                h, p.op_a, p.op_b, p.m, p.n, p.k, &al, b, p.lda, p.stride_a, a, p.ldb, p.stride_b,
                &be, c, p.ldc, p.stride_c, p.count,
            )
        }
    };
    if s != 0 {
        let l = cublas()?;
        return Err(format!(
            "cublas{letter}gemm{} ({}×{}×{}, flags {}{}): {}",
            if p.count == 1 { "" } else { "StridedBatched" },
            r.m,
            r.n,
            r.k,
            r.flags,
            if p.count == 1 {
                String::new()
            } else {
                format!(", {} products", p.count)
            },
            describe(l, s)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What cuBLAS computes for a [`ColMajor`] call (the BLAS definition, column-major;
    /// for a batch, each product on the operands' slices at its strides).
    fn reference(p: &ColMajor, alpha: f64, a: &[f64], b: &[f64], beta: f64, c: &mut [f64]) {
        for i in 0..p.count as usize {
            let off = |s: i64| i * s as usize;
            let (a, b) = (&a[off(p.stride_a)..], &b[off(p.stride_b)..]);
            one_product(p, alpha, a, b, beta, &mut c[off(p.stride_c)..]);
        }
    }

    fn one_product(p: &ColMajor, alpha: f64, a: &[f64], b: &[f64], beta: f64, c: &mut [f64]) {
        let (m, n, k) = (p.m as usize, p.n as usize, p.k as usize);
        let (lda, ldb, ldc) = (p.lda as usize, p.ldb as usize, p.ldc as usize);
        let at = |i: usize, l: usize| {
            if p.op_a == OP_N {
                a[i + l * lda]
            } else {
                a[l + i * lda]
            }
        };
        let bt = |l: usize, j: usize| {
            if p.op_b == OP_N {
                b[l + j * ldb]
            } else {
                b[j + l * ldb]
            }
        };
        let beta = if p.accumulate { beta } else { 0.0 };
        for j in 0..n {
            for i in 0..m {
                let s: f64 = (0..k).map(|l| at(i, l) * bt(l, j)).sum();
                let old = if beta == 0.0 { 0.0 } else { c[i + j * ldc] };
                c[i + j * ldc] = alpha * s + beta * old;
            }
        }
    }

    fn values(seed: u64, n: usize) -> Vec<f64> {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % 2001) as f64 / 1000.0 - 1.0
            })
            .collect()
    }

    /// Every transpose combination, padded row strides, accumulate or not, and the
    /// degenerate sizes: the column-major call computes the row-major definition.
    #[test]
    fn the_column_major_call_computes_the_row_major_product() {
        let mut cases = 0;
        for &(m, n, k) in &[
            (3, 5, 4),
            (1, 7, 2),
            (6, 1, 3),
            (4, 4, 1),
            (2, 3, 0),
            (5, 2, 9),
        ] {
            for flags in 0..4i64 {
                for pad in [0usize, 2] {
                    for accumulate in [false, true] {
                        let (ta, tb) = (flags & 1 != 0, flags & 2 != 0);
                        let lda = if ta { m } else { k } + pad;
                        let ldb = if tb { k } else { n } + pad;
                        let ldc = n + pad;
                        let a = values(1 + cases, (if ta { k } else { m }) * lda);
                        let b = values(2 + cases, (if tb { n } else { k }) * ldb);
                        let c0 = values(3 + cases, m * ldc);
                        let (alpha, beta) = (0.75, if accumulate { -1.5 } else { 0.0 });
                        let r = RowMajor {
                            flags,
                            m: m as i64,
                            n: n as i64,
                            k: k as i64,
                            lda: lda as i64,
                            ldb: ldb as i64,
                            ldc: ldc as i64,
                            c0: accumulate.then_some((ldc as i64, 1)),
                            count: 1,
                            strides: [0; 3],
                        };
                        let p = plan(&r).unwrap().unwrap();
                        let mut c = c0.clone();
                        // A' is the row-major B, B' the row-major A.
                        reference(&p, alpha, &b, &a, beta, &mut c);
                        for i in 0..m {
                            for j in 0..n {
                                let s: f64 = (0..k)
                                    .map(|l| {
                                        let x = if ta { a[l * lda + i] } else { a[i * lda + l] };
                                        let y = if tb { b[j * ldb + l] } else { b[l * ldb + j] };
                                        x * y
                                    })
                                    .sum();
                                let want = alpha * s + beta * c0[i * ldc + j];
                                let got = c[i * ldc + j];
                                assert!(
                                    (got - want).abs() < 1e-12,
                                    "{m}x{n}x{k} flags {flags} pad {pad} acc {accumulate}: ({i},{j}) {got} vs {want}"
                                );
                            }
                        }
                        // The padding of C is not written.
                        for i in 0..m {
                            for j in n..ldc {
                                assert_eq!(c[i * ldc + j], c0[i * ldc + j]);
                            }
                        }
                        cases += 1;
                    }
                }
            }
        }
        assert_eq!(cases, 96);
    }

    /// A batch at its strides, one operand repeated (stride 0), accumulating into C: each
    /// product equals the row-major definition on its slices.
    #[test]
    fn a_strided_batch_computes_each_product() {
        let (m, n, k, count) = (3usize, 4usize, 5usize, 3usize);
        for flags in 0..4i64 {
            for accumulate in [false, true] {
                let (ta, tb) = (flags & 1 != 0, flags & 2 != 0);
                let (lda, ldb, ldc) = (if ta { m } else { k }, if tb { k } else { n }, n);
                let (sa, sb, sc) = (m * k, 0, m * n);
                let a = values(7 + flags as u64, count * sa);
                let b = values(11 + flags as u64, k * n);
                let c0 = values(13, count * sc);
                let r = RowMajor {
                    flags,
                    m: m as i64,
                    n: n as i64,
                    k: k as i64,
                    lda: lda as i64,
                    ldb: ldb as i64,
                    ldc: ldc as i64,
                    c0: accumulate.then_some((ldc as i64, 1)),
                    count: count as i64,
                    strides: [sa as i64, sb as i64, sc as i64],
                };
                let p = plan(&r).unwrap().unwrap();
                let mut c = c0.clone();
                reference(&p, 1.0, &b, &a, 1.0, &mut c);
                for x in 0..count {
                    for i in 0..m {
                        for j in 0..n {
                            let s: f64 = (0..k)
                                .map(|l| {
                                    let ai = if ta { l * lda + i } else { i * lda + l };
                                    let bi = if tb { j * ldb + l } else { l * ldb + j };
                                    a[x * sa + ai] * b[bi]
                                })
                                .sum();
                            let at = x * sc + i * ldc + j;
                            let want = s + if accumulate { c0[at] } else { 0.0 };
                            assert!((c[at] - want).abs() < 1e-12, "flags {flags} batch {x}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn arguments_outside_the_contract_are_refused_with_what_is_wrong() {
        let r = RowMajor {
            flags: 0,
            m: 4,
            n: 3,
            k: 2,
            lda: 2,
            ldb: 3,
            ldc: 3,
            c0: None,
            count: 1,
            strides: [0; 3],
        };
        assert!(plan(&r).unwrap().is_some());
        let e = plan(&RowMajor {
            count: 2,
            strides: [6, -1, 12],
            ..r
        })
        .unwrap_err();
        assert!(e.contains("negative batch stride -1"), "{e}");
        assert_eq!(plan(&RowMajor { count: 0, ..r }).unwrap(), None);
        let e = plan(&RowMajor { lda: 1, ..r }).unwrap_err();
        assert!(e.contains("lda = 1") && e.contains("2 columns"), "{e}");
        let e = plan(&RowMajor { m: 1 << 31, ..r }).unwrap_err();
        assert!(e.contains("32-bit"), "{e}");
        let e = plan(&RowMajor {
            c0: Some((0, 1)),
            ..r
        })
        .unwrap_err();
        assert!(e.contains("C0 in place"), "{e}");
        assert_eq!(
            plan(&RowMajor {
                n: 0,
                ldb: 1,
                ldc: 1,
                ..r
            })
            .unwrap(),
            None
        );
    }

    #[test]
    fn a_missing_library_is_named_with_what_to_do() {
        if std::env::var_os("PPCC_CUBLAS_LIB").is_some() || load().is_ok() {
            return; // cuBLAS is installed here
        }
        let e = load().err().unwrap_or_default();
        assert!(
            e.contains("libcublas.so.12")
                && e.contains("PPCC_CUBLAS_LIB")
                && e.contains("--gpu-gemm kernels"),
            "{e}"
        );
    }
}
