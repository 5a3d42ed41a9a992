//! The table a CUDA module takes (`ppcc_gpu_api` in `codegen/src/gpu_shim.c`) against
//! [`GpuApi`]: the shim is compiled here with the C compiler, given a table of recording
//! functions, and each of its entry points is called; every call must reach the entry of
//! its name with its arguments. A layout that differs between the C and the Rust side
//! would call the wrong function (or crash) on a GPU, where nothing else checks it.

use super::*;

static CALLS: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn record(s: String) {
    CALLS.lock().unwrap().push(s);
}

extern "C" fn t_get_function(_image: *const c_void, name: *const std::ffi::c_char) -> *mut c_void {
    // SAFETY: the test passes a NUL-terminated name.
    let n = unsafe { CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned();
    record(format!("get_function {n}"));
    std::ptr::null_mut()
}

#[allow(clippy::too_many_arguments)]
extern "C" fn t_launch(
    _f: *mut c_void,
    gx: i64,
    gy: i64,
    gz: i64,
    bx: i64,
    by: i64,
    bz: i64,
    shared: i32,
    _stream: *mut c_void,
    _params: *mut *mut c_void,
    _extra: *mut *mut c_void,
    n: i64,
) {
    record(format!("launch {gx} {gy} {gz} {bx} {by} {bz} {shared} {n}"));
}

extern "C" fn t_stream_create() -> *mut c_void {
    record("stream_create".into());
    std::ptr::null_mut()
}

extern "C" fn t_stream_destroy(_s: *mut c_void) {
    record("stream_destroy".into());
}

extern "C" fn t_stream_synchronize(_s: *mut c_void) {
    record("stream_synchronize".into());
}

extern "C" fn t_alloc(bytes: u64) -> *mut c_void {
    record(format!("alloc {bytes}"));
    std::ptr::null_mut()
}

extern "C" fn t_free(p: *mut c_void) {
    record(format!("free {}", p as usize));
}

extern "C" fn t_memcpy(_d: *mut c_void, _s: *const c_void, bytes: u64, _st: *mut c_void) {
    record(format!("memcpy {bytes}"));
}

extern "C" fn t_memset32(_d: *mut c_void, v: u32, n: u64, _st: *mut c_void) {
    record(format!("memset32 {v} {n}"));
}

extern "C" fn t_memset16(_d: *mut c_void, v: u16, n: u64, _st: *mut c_void) {
    record(format!("memset16 {v} {n}"));
}

#[allow(clippy::too_many_arguments)]
extern "C" fn t_gemm<T: std::fmt::Display>(
    flags: i64,
    m: i64,
    n: i64,
    k: i64,
    alpha: T,
    a: *const T,
    lda: i64,
    b: *const T,
    ldb: i64,
    beta: T,
    c0: *const T,
    rs: i64,
    cs: i64,
    c: *mut T,
    ldc: i64,
) {
    record(format!(
        "{}gemm {flags} {m} {n} {k} {alpha} {} {lda} {} {ldb} {beta} {} {rs} {cs} {} {ldc}",
        if std::mem::size_of::<T>() == 4 {
            "s"
        } else {
            "d"
        },
        a as usize,
        b as usize,
        c0 as usize,
        c as usize
    ));
}

#[allow(clippy::too_many_arguments)]
extern "C" fn t_gemm_batched<T: std::fmt::Display>(
    flags: i64,
    m: i64,
    n: i64,
    k: i64,
    alpha: T,
    a: *const T,
    lda: i64,
    sa: i64,
    b: *const T,
    ldb: i64,
    sb: i64,
    beta: T,
    c: *mut T,
    ldc: i64,
    sc: i64,
    count: i64,
) {
    record(format!(
        "{}gemm_batched {flags} {m} {n} {k} {alpha} {} {lda} {sa} {} {ldb} {sb} {beta} {} {ldc} {sc} {count}",
        if std::mem::size_of::<T>() == 4 { "s" } else { "d" },
        a as usize,
        b as usize,
        c as usize
    ));
}

fn table(version: u32) -> GpuApi {
    GpuApi {
        version,
        size: std::mem::size_of::<GpuApi>() as u32,
        get_function: t_get_function,
        launch: t_launch,
        stream_create: t_stream_create,
        stream_destroy: t_stream_destroy,
        stream_synchronize: t_stream_synchronize,
        alloc: t_alloc,
        free: t_free,
        memcpy: t_memcpy,
        memset32: t_memset32,
        memset16: t_memset16,
        sgemm: t_gemm::<f32>,
        dgemm: t_gemm::<f64>,
        sgemm_batched: t_gemm_batched::<f32>,
        dgemm_batched: t_gemm_batched::<f64>,
    }
}

#[test]
fn every_shim_entry_reaches_the_runtime_entry_of_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("gpu_shim.c");
    std::fs::write(&src, include_str!("../../../codegen/src/gpu_shim.c")).unwrap();
    let so = dir.path().join("shim.so");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let out = std::process::Command::new(&cc)
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&so)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("running {cc}: {e}"));
    assert!(
        out.status.success(),
        "{cc}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // SAFETY: the shim has no initialisers; its functions have the prototypes below.
    let lib = unsafe { libloading::Library::new(&so) }.unwrap();
    macro_rules! f {
        ($name:literal, $ty:ty) => {
            // SAFETY: the symbol has this C prototype (gpu_shim.c).
            *unsafe { lib.get::<$ty>(concat!($name, "\0").as_bytes()) }.unwrap()
        };
    }
    type Gemm<T> = unsafe extern "C" fn(
        i64,
        i64,
        i64,
        i64,
        T,
        *const T,
        i64,
        *const T,
        i64,
        T,
        *const T,
        i64,
        i64,
        *mut T,
        i64,
    );
    let set_api = f!(
        "ppcc_gpu_set_api",
        unsafe extern "C" fn(*const GpuApi) -> i32
    );
    let version = f!("ppcc_gpu_api_version", unsafe extern "C" fn() -> u32);
    let get_function = f!(
        "mgpuModuleGetFunction",
        unsafe extern "C" fn(*mut c_void, *const std::ffi::c_char) -> *mut c_void
    );
    #[allow(clippy::type_complexity)]
    let launch = f!(
        "mgpuLaunchKernel",
        unsafe extern "C" fn(
            *mut c_void,
            i64,
            i64,
            i64,
            i64,
            i64,
            i64,
            i32,
            *mut c_void,
            *mut *mut c_void,
            *mut *mut c_void,
            i64,
        )
    );
    let stream_create = f!("mgpuStreamCreate", unsafe extern "C" fn() -> *mut c_void);
    let stream_destroy = f!("mgpuStreamDestroy", unsafe extern "C" fn(*mut c_void));
    let stream_sync = f!("mgpuStreamSynchronize", unsafe extern "C" fn(*mut c_void));
    let alloc = f!(
        "mgpuMemAlloc",
        unsafe extern "C" fn(u64, *mut c_void, i8) -> *mut c_void
    );
    let free = f!(
        "mgpuMemFree",
        unsafe extern "C" fn(*mut c_void, *mut c_void)
    );
    let memcpy = f!(
        "mgpuMemcpy",
        unsafe extern "C" fn(*mut c_void, *mut c_void, usize, *mut c_void)
    );
    let memset32 = f!(
        "mgpuMemset32",
        unsafe extern "C" fn(*mut c_void, u32, usize, *mut c_void)
    );
    let memset16 = f!(
        "mgpuMemset16",
        unsafe extern "C" fn(*mut c_void, u16, usize, *mut c_void)
    );
    let tmp_alloc = f!(
        "ppcc_gpu_aligned_alloc",
        unsafe extern "C" fn(usize, usize) -> *mut c_void
    );
    let sgemm = f!("ppcc_gpu_sgemm", Gemm<f32>);
    let dgemm = f!("ppcc_gpu_dgemm", Gemm<f64>);
    type Batched<T> = unsafe extern "C" fn(
        i64,
        i64,
        i64,
        i64,
        T,
        *const T,
        i64,
        i64,
        *const T,
        i64,
        i64,
        T,
        *mut T,
        i64,
        i64,
        i64,
    );
    let sgemm_batched = f!("ppcc_gpu_sgemm_batched", Batched<f32>);
    let dgemm_batched = f!("ppcc_gpu_dgemm_batched", Batched<f64>);

    let old = table(GPU_API_VERSION - 1);
    let good = table(GPU_API_VERSION);
    let p = |x: usize| x as *mut c_void;
    // SAFETY: the table outlives every call below; the recording functions ignore the
    // pointers they are given.
    unsafe {
        assert_eq!(version(), GPU_API_VERSION, "gpu_shim.c's version");
        assert_eq!(set_api(&old), -1, "a table of another version is refused");
        assert_eq!(set_api(&good), 0);
        get_function(p(1), c"kern".as_ptr());
        launch(
            p(1),
            1,
            2,
            3,
            4,
            5,
            6,
            7,
            p(0),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            8,
        );
        stream_create();
        stream_destroy(p(2));
        stream_sync(p(2));
        alloc(100, p(0), 0);
        free(p(48), p(0));
        memcpy(p(8), p(16), 5, p(0));
        memset32(p(8), 7, 3, p(0));
        memset16(p(8), 9, 4, p(0));
        tmp_alloc(64, 200);
        sgemm(
            3,
            4,
            5,
            6,
            1.5,
            p(16) as _,
            7,
            p(32) as _,
            8,
            2.5,
            p(64) as _,
            9,
            10,
            p(64) as _,
            11,
        );
        dgemm(
            1,
            2,
            3,
            4,
            -0.5,
            p(8) as _,
            5,
            p(24) as _,
            6,
            0.25,
            std::ptr::null(),
            0,
            0,
            p(40) as _,
            7,
        );
        sgemm_batched(
            2,
            3,
            4,
            5,
            0.5,
            p(8) as _,
            6,
            7,
            p(16) as _,
            8,
            0,
            1.0,
            p(24) as _,
            9,
            10,
            11,
        );
        dgemm_batched(
            3,
            4,
            5,
            6,
            1.5,
            p(32) as _,
            7,
            8,
            p(40) as _,
            9,
            10,
            0.0,
            p(48) as _,
            11,
            12,
            13,
        );
    }
    let calls = std::mem::take(&mut *CALLS.lock().unwrap());
    assert_eq!(
        calls,
        [
            "get_function kern",
            "launch 1 2 3 4 5 6 7 8",
            "stream_create",
            "stream_destroy",
            "stream_synchronize",
            "alloc 100",
            "free 48",
            "memcpy 5",
            "memset32 7 3",
            "memset16 9 4",
            "alloc 200",
            "sgemm 3 4 5 6 1.5 16 7 32 8 2.5 64 9 10 64 11",
            "dgemm 1 2 3 4 -0.5 8 5 24 6 0.25 0 0 0 40 7",
            "sgemm_batched 2 3 4 5 0.5 8 6 7 16 8 0 1 24 9 10 11",
            "dgemm_batched 3 4 5 6 1.5 32 7 8 40 9 10 0 48 11 12 13",
        ]
    );
}
