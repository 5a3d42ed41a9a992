//! CUDA devices for the stage modules of `--target cuda`: the GPU runtime ABI that the
//! modules' host code calls (installed into each module as a table of functions, see
//! `codegen/src/gpu_shim.c`), over the CUDA driver API loaded at run time (cudarc with
//! dynamic loading: ppcc builds, and runs CPU plans, on machines without CUDA).
//!
//! - One [`GpuDevice`] per CUDA device, on its primary context, with one stream; a thread
//!   that calls a module's function first makes its device current ([`GpuDevice::enter`]).
//! - Kernel images (PTX) are loaded into the device's context on first use and cached.
//! - Every buffer (the module's temporaries and the runtime's arguments and results) is
//!   managed memory: addressed by kernels and by host code alike, resident on the device
//!   while only kernels touch it. Allocated bytes are counted per device (now and peak).
//!   Freed blocks are kept per size class and handed out again (`BlockCache`).
//! - Matrix products of modules compiled with `--gpu-gemm cublas` run on cuBLAS
//!   (`gpu/cublas.rs`), one handle per device on its stream.
//! - Kernels launched, cuBLAS products and allocations are counted per device
//!   ([`GpuDevice::stats`]).
//! - The ABI's functions return nothing, so a failure is recorded for the calling thread;
//!   later launches of that call are skipped, and the runtime turns the first failure into
//!   the call's error ([`take_error`]).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::{c_void, CStr, CString};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys;

mod cublas;

/// cuBLAS's version and path, or why it cannot be loaded (for plans compiled with
/// `--gpu-gemm cublas`).
pub fn cublas_version() -> Result<String, String> {
    cublas::version()
}

/// Load the first library that opens of `$env` (when set) and `names`: the library and the
/// name it was opened by, or every name tried with why it did not open.
pub(crate) fn load_library(
    env: &str,
    names: &[&str],
) -> Result<(libloading::Library, String), String> {
    let mut tried = vec![];
    let from_env = std::env::var_os(env).map(|p| p.to_string_lossy().into_owned());
    for name in from_env
        .into_iter()
        .chain(names.iter().map(|n| n.to_string()))
    {
        // SAFETY: loading an NVIDIA library runs its initialisers, which only set up its
        // own state.
        match unsafe { libloading::Library::new(&name) } {
            Ok(lib) => return Ok((lib, name)),
            Err(e) => tried.push(format!("{name} ({e})")),
        }
    }
    Err(tried.join(", "))
}

/// What went wrong setting up a CUDA device.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GpuError {
    #[error("this plan runs on CUDA GPUs, and the CUDA driver library (libcuda.so.1) cannot be loaded on this machine: run it on a machine with an NVIDIA GPU and its driver, or compile the model again with --target cpu")]
    NoDriver,
    #[error("this plan runs on CUDA GPUs, and the CUDA driver reports no device{0}")]
    NoDevice(String),
    #[error("CUDA {call}: {message}")]
    Driver { call: &'static str, message: String },
    /// A kernel image the driver could not load (its JIT log), or a kernel not in it.
    #[error("kernel `{kernel}`: {message}")]
    Kernel { kernel: String, message: String },
    /// The runtime's own bookkeeping failed (a poisoned lock after a panic).
    #[error("the GPU runtime's state is unusable after an earlier panic")]
    Poisoned,
}

/// The table a CUDA module takes (`ppcc_gpu_api` in `gpu_shim.c`; same layout).
#[repr(C)]
pub struct GpuApi {
    version: u32,
    size: u32,
    get_function: extern "C" fn(*const c_void, *const std::ffi::c_char) -> *mut c_void,
    #[allow(clippy::type_complexity)]
    launch: extern "C" fn(
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
    ),
    stream_create: extern "C" fn() -> *mut c_void,
    stream_destroy: extern "C" fn(*mut c_void),
    stream_synchronize: extern "C" fn(*mut c_void),
    alloc: extern "C" fn(u64) -> *mut c_void,
    free: extern "C" fn(*mut c_void),
    memcpy: extern "C" fn(*mut c_void, *const c_void, u64, *mut c_void),
    memset32: extern "C" fn(*mut c_void, u32, u64, *mut c_void),
    memset16: extern "C" fn(*mut c_void, u16, u64, *mut c_void),
    sgemm: GemmAbi<f32>,
    dgemm: GemmAbi<f64>,
    sgemm_batched: GemmBatchedAbi<f32>,
    dgemm_batched: GemmBatchedAbi<f64>,
}

/// `ppcc_gpu_sgemm_batched`/`ppcc_gpu_dgemm_batched`: `ppcc_support.h`'s
/// `ppcc_sgemm_batched` arguments.
type GemmBatchedAbi<T> = extern "C" fn(
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

/// `ppcc_gpu_sgemm`/`ppcc_gpu_dgemm`: `ppcc_support.h`'s `ppcc_sgemm` arguments.
type GemmAbi<T> = extern "C" fn(
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

/// The version of [`GpuApi`] (`PPCC_GPU_API_VERSION`).
pub const GPU_API_VERSION: u32 = 2;

/// The table every CUDA module gets.
pub static API: GpuApi = GpuApi {
    version: GPU_API_VERSION,
    size: std::mem::size_of::<GpuApi>() as u32,
    get_function: abi_get_function,
    launch: abi_launch,
    stream_create: abi_stream_create,
    stream_destroy: abi_stream_destroy,
    stream_synchronize: abi_stream_synchronize,
    alloc: abi_alloc,
    free: abi_free,
    memcpy: abi_memcpy,
    memset32: abi_memset32,
    memset16: abi_memset16,
    sgemm: abi_gemm::<f32>,
    dgemm: abi_gemm::<f64>,
    sgemm_batched: abi_gemm_batched::<f32>,
    dgemm_batched: abi_gemm_batched::<f64>,
};

/// The driver, once per process.
struct Driver {
    devices: Vec<OnceLock<Result<Arc<GpuDevice>, GpuError>>>,
}

/// The message of a driver result (`CUDA_ERROR_OUT_OF_MEMORY: out of memory`).
fn describe(r: sys::CUresult) -> String {
    let mut name: *const std::ffi::c_char = std::ptr::null();
    let mut text: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: both calls write a pointer to a static string (or leave it null).
    unsafe {
        sys::cuGetErrorName(r, &mut name);
        sys::cuGetErrorString(r, &mut text);
    }
    let s = |p: *const std::ffi::c_char| {
        if p.is_null() {
            None
        } else {
            // SAFETY: the driver's strings are NUL-terminated and static.
            Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        }
    };
    match (s(name), s(text)) {
        (Some(n), Some(t)) => format!("{n}: {t}"),
        (Some(n), None) => n,
        _ => format!("error {}", r as i32),
    }
}

pub(crate) fn check(call: &'static str, r: sys::CUresult) -> Result<(), GpuError> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(GpuError::Driver {
            call,
            message: describe(r),
        })
    }
}

fn driver() -> Result<&'static Driver, GpuError> {
    static DRIVER: OnceLock<Result<Driver, GpuError>> = OnceLock::new();
    DRIVER
        .get_or_init(|| {
            // SAFETY: only probes for the library (no symbol is called).
            if !unsafe { sys::is_culib_present() } {
                return Err(GpuError::NoDriver);
            }
            // SAFETY: plain driver calls with valid out-pointers.
            unsafe {
                check("cuInit", sys::cuInit(0))?;
                let mut n = 0;
                check("cuDeviceGetCount", sys::cuDeviceGetCount(&mut n))?;
                if n <= 0 {
                    return Err(GpuError::NoDevice(String::new()));
                }
                Ok(Driver {
                    devices: (0..n).map(|_| OnceLock::new()).collect(),
                })
            }
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// The number of CUDA devices, or why there are none.
pub fn device_count() -> Result<usize, GpuError> {
    Ok(driver()?.devices.len())
}

/// Device `ordinal` (its primary context and stream), set up on first use.
pub fn device(ordinal: usize) -> Result<Arc<GpuDevice>, GpuError> {
    let d = driver()?;
    let n = d.devices.len();
    let slot = d.devices.get(ordinal).ok_or_else(|| {
        GpuError::NoDevice(format!(
            " with ordinal {ordinal} (it has {n}: 0..{})",
            n.saturating_sub(1)
        ))
    })?;
    slot.get_or_init(|| GpuDevice::open(ordinal).map(Arc::new))
        .clone()
}

/// The next device in turn (0, 1, ..., wrapping): stage modules loaded in stage order
/// land on devices stage mod count.
pub fn next_device() -> Result<Arc<GpuDevice>, GpuError> {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = device_count()?;
    device(NEXT.fetch_add(1, Ordering::Relaxed) % n)
}

thread_local! {
    /// The device [`on_device`] chose for the modules loaded on this thread.
    static PREFERRED: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Run `f` (which loads stage modules) with the CUDA modules it loads placed on device
/// `ordinal` (modulo the devices there are) rather than the next in turn: a pipeline rank's
/// stages share its GPU.
pub fn on_device<T>(ordinal: usize, f: impl FnOnce() -> T) -> T {
    let before = PREFERRED.with(|p| p.replace(Some(ordinal)));
    let r = f();
    PREFERRED.with(|p| p.set(before));
    r
}

/// The device for a CUDA module being loaded: [`on_device`]'s, else [`next_device`].
pub(crate) fn device_for_module() -> Result<Arc<GpuDevice>, GpuError> {
    match PREFERRED.with(|p| p.get()) {
        Some(o) => device(o % device_count()?),
        None => next_device(),
    }
}

/// One CUDA device as the runtime uses it.
pub struct GpuDevice {
    pub ordinal: usize,
    pub name: String,
    ctx: sys::CUcontext,
    stream: sys::CUstream,
    /// Loaded kernel images by the address of their PTX, and kernels by image and name.
    modules: Mutex<HashMap<usize, sys::CUmodule>>,
    functions: Mutex<HashMap<(usize, CString), usize>>,
    /// Bytes of each live allocation, and the totals.
    sizes: Mutex<HashMap<u64, u64>>,
    allocated: AtomicU64,
    peak: AtomicU64,
    /// The cuBLAS handle on [`GpuDevice::stream`], made on the first product.
    blas: OnceLock<Result<usize, String>>,
    /// Freed blocks kept for reuse ([`BlockCache`]); `None` with `PPCC_GPU_CACHE=off`.
    cache: Option<Mutex<BlockCache>>,
    /// Bytes held from the driver (in use and cached), now and at most.
    reserved: AtomicU64,
    reserved_peak: AtomicU64,
    counters: Counters,
    /// With `PPCC_GPU_PROFILE=1`: launches and seconds waited for, by kernel.
    profile: Option<Mutex<HashMap<usize, (u64, u64)>>>,
}

/// What a device has done since it was opened ([`GpuDevice::stats`]).
#[derive(Default)]
struct Counters {
    launches: AtomicU64,
    kernel_ns: AtomicU64,
    gemms: AtomicU64,
    gemm_ns: AtomicU64,
    driver_allocations: AtomicU64,
    reused: AtomicU64,
}

/// A snapshot of a device's work and allocations.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuStats {
    /// Kernels launched, and seconds the host waited for them (each launch is waited for).
    pub launches: u64,
    pub kernel_seconds: f64,
    /// cuBLAS products (a strided batch counts once), and seconds until each was done.
    pub gemms: u64,
    pub gemm_seconds: f64,
    /// Allocations the driver made, and allocations served from freed blocks.
    pub driver_allocations: u64,
    pub reused: u64,
    /// Bytes held from the driver at most (in use and kept for reuse).
    pub reserved_peak: u64,
    /// With `PPCC_GPU_PROFILE=1`: each kernel's launches and the seconds waited for them,
    /// most time first (empty without).
    pub kernels: Vec<KernelTime>,
}

/// One kernel's launches and the seconds the host waited for them (`PPCC_GPU_PROFILE=1`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KernelTime {
    pub name: String,
    pub launches: u64,
    pub seconds: f64,
}

/// The size class of an allocation of `bytes`: a multiple of 512 up to 1 MiB, above that
/// a multiple of 1/16 of the next power of two (at most 12.5% more than asked). Freed
/// blocks are reused for requests of the same class.
pub(crate) fn size_class(bytes: u64) -> u64 {
    let b = bytes.max(1);
    let step = if b <= 1 << 20 {
        512
    } else {
        (b.next_power_of_two() / 16).max(512)
    };
    b.div_ceil(step) * step
}

/// Freed device blocks by size class, reused last-freed first: every buffer of a step is
/// allocated and freed again each step, and the driver's allocation (`cuMemAllocManaged`),
/// its free (which waits for the device) and the first touch of fresh managed memory by
/// the GPU (page faults) cost far more than a kernel on these sizes. A block is only
/// handed out again after the host code freed it, and the host code frees a buffer after
/// waiting for the kernels that use it (every launch and cuBLAS call is waited for).
#[derive(Default)]
pub(crate) struct BlockCache {
    free: HashMap<u64, Vec<u64>>,
}

impl BlockCache {
    /// A freed block of size class `class`.
    pub(crate) fn take(&mut self, class: u64) -> Option<u64> {
        self.free.get_mut(&class)?.pop()
    }

    /// Keep block `p` of size class `class` for reuse.
    pub(crate) fn put(&mut self, class: u64, p: u64) {
        self.free.entry(class).or_default().push(p);
    }

    /// Every kept block with its class (to give back to the driver), emptying the cache.
    pub(crate) fn drain(&mut self) -> Vec<(u64, u64)> {
        self.free
            .drain()
            .flat_map(|(c, ps)| ps.into_iter().map(move |p| (c, p)))
            .collect()
    }
}

// SAFETY: the context, stream, modules and functions are driver handles, usable from any
// thread once the context is current there (`enter`); the maps are behind mutexes.
unsafe impl Send for GpuDevice {}
unsafe impl Sync for GpuDevice {}

thread_local! {
    /// The device whose module the thread is calling.
    static CURRENT: RefCell<Option<Arc<GpuDevice>>> = const { RefCell::new(None) };
    /// The first failure of the current call.
    static ERROR: RefCell<Option<String>> = const { RefCell::new(None) };
    static FAILED: Cell<bool> = const { Cell::new(false) };
    /// The kernel this thread launched last (`PPCC_GPU_PROFILE`: its wait is its time).
    static LAST_KERNEL: Cell<usize> = const { Cell::new(0) };
}

fn fail(message: String) {
    FAILED.with(|f| f.set(true));
    ERROR.with(|e| {
        let mut e = e.borrow_mut();
        if e.is_none() {
            *e = Some(message);
        }
    });
}

/// The first failure recorded on this thread since the last take.
pub fn take_error() -> Option<String> {
    FAILED.with(|f| f.set(false));
    ERROR.with(|e| e.borrow_mut().take())
}

fn current() -> Option<Arc<GpuDevice>> {
    CURRENT.with(|c| c.borrow().clone())
}

/// Makes a device current on this thread while alive.
pub struct Entered {
    previous: Option<Arc<GpuDevice>>,
}

impl Drop for Entered {
    fn drop(&mut self) {
        let prev = self.previous.take();
        CURRENT.with(|c| *c.borrow_mut() = prev);
    }
}

impl GpuDevice {
    fn open(ordinal: usize) -> Result<GpuDevice, GpuError> {
        // SAFETY: driver calls with valid out-pointers on an initialised driver.
        unsafe {
            let mut dev = 0;
            check("cuDeviceGet", sys::cuDeviceGet(&mut dev, ordinal as i32))?;
            let mut name = [0 as std::ffi::c_char; 256];
            check(
                "cuDeviceGetName",
                sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, dev),
            )?;
            let name = CStr::from_ptr(name.as_ptr()).to_string_lossy().into_owned();
            let mut ctx = std::ptr::null_mut();
            check(
                "cuDevicePrimaryCtxRetain",
                sys::cuDevicePrimaryCtxRetain(&mut ctx, dev),
            )?;
            check("cuCtxSetCurrent", sys::cuCtxSetCurrent(ctx))?;
            let mut stream = std::ptr::null_mut();
            // CU_STREAM_NON_BLOCKING: no implicit synchronisation with the legacy stream.
            check("cuStreamCreate", sys::cuStreamCreate(&mut stream, 1))?;
            Ok(GpuDevice {
                ordinal,
                name,
                ctx,
                stream,
                modules: Mutex::default(),
                functions: Mutex::default(),
                sizes: Mutex::default(),
                allocated: AtomicU64::new(0),
                peak: AtomicU64::new(0),
                blas: OnceLock::new(),
                cache: std::env::var("PPCC_GPU_CACHE")
                    .map_or(true, |v| v != "off" && v != "0")
                    .then(|| Mutex::new(BlockCache::default())),
                reserved: AtomicU64::new(0),
                reserved_peak: AtomicU64::new(0),
                counters: Counters::default(),
                profile: std::env::var("PPCC_GPU_PROFILE")
                    .is_ok_and(|v| !v.is_empty() && v != "0")
                    .then(Mutex::default),
            })
        }
    }

    /// Make this device current on the calling thread (its context for the driver, and the
    /// device the module ABI's functions use) until the guard drops.
    pub fn enter(self: &Arc<Self>) -> Result<Entered, GpuError> {
        // SAFETY: the context is retained for the life of the process.
        check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(self.ctx) })?;
        let previous = CURRENT.with(|c| c.borrow_mut().replace(self.clone()));
        Ok(Entered { previous })
    }

    /// Bytes allocated on the device now and at most so far.
    pub fn memory(&self) -> (u64, u64) {
        (
            self.allocated.load(Ordering::Relaxed),
            self.peak.load(Ordering::Relaxed),
        )
    }

    /// Make the device's context current on this thread for the driver (allocations and
    /// frees happen on whichever thread owns a buffer).
    fn bind(&self) -> Result<(), GpuError> {
        // SAFETY: the context is retained for the life of the process.
        check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(self.ctx) })
    }

    /// What the device has done since it was opened.
    pub fn stats(&self) -> GpuStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        GpuStats {
            launches: get(&c.launches),
            kernel_seconds: get(&c.kernel_ns) as f64 * 1e-9,
            gemms: get(&c.gemms),
            gemm_seconds: get(&c.gemm_ns) as f64 * 1e-9,
            driver_allocations: get(&c.driver_allocations),
            reused: get(&c.reused),
            reserved_peak: get(&self.reserved_peak),
            kernels: self.kernel_times(),
        }
    }

    /// The profile's kernels by name, most time first.
    fn kernel_times(&self) -> Vec<KernelTime> {
        let Some(Ok(profile)) = self.profile.as_ref().map(|p| p.lock()) else {
            return vec![];
        };
        let names: HashMap<usize, String> = self.functions.lock().map_or(HashMap::new(), |fs| {
            fs.iter()
                .map(|((_, name), &f)| (f, name.to_string_lossy().into_owned()))
                .collect()
        });
        let mut out: Vec<KernelTime> = profile
            .iter()
            .map(|(f, &(launches, ns))| KernelTime {
                name: names.get(f).cloned().unwrap_or_else(|| format!("{f:#x}")),
                launches,
                seconds: ns as f64 * 1e-9,
            })
            .collect();
        out.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
        out
    }

    /// Managed memory of `class` bytes from the driver; when it has none left, the blocks
    /// kept for reuse are given back and the allocation is tried once more.
    fn driver_alloc(&self, class: u64) -> Result<sys::CUdeviceptr, GpuError> {
        let once = || {
            let mut p: sys::CUdeviceptr = 0;
            // SAFETY: valid out-pointer; CU_MEM_ATTACH_GLOBAL = 1 (any stream may use it).
            check("cuMemAllocManaged", unsafe {
                sys::cuMemAllocManaged(&mut p, class as usize, 1)
            })
            .map(|()| p)
        };
        let p = match once() {
            Ok(p) => p,
            Err(e) => {
                let kept = match &self.cache {
                    Some(c) => c.lock().map_err(|_| GpuError::Poisoned)?.drain(),
                    None => vec![],
                };
                if kept.is_empty() {
                    return Err(e);
                }
                for (c, p) in kept {
                    self.reserved.fetch_sub(c, Ordering::Relaxed);
                    // SAFETY: a block from cuMemAllocManaged that nothing uses any more.
                    let r = unsafe { sys::cuMemFree_v2(p) };
                    check("cuMemFree", r)?;
                }
                once()?
            }
        };
        self.counters
            .driver_allocations
            .fetch_add(1, Ordering::Relaxed);
        let now = self.reserved.fetch_add(class, Ordering::Relaxed) + class;
        self.reserved_peak.fetch_max(now, Ordering::Relaxed);
        Ok(p)
    }

    /// `bytes` of managed memory (at least one byte is allocated): a freed block of the
    /// same size class when there is one (`BlockCache`), else the driver's.
    pub fn alloc(&self, bytes: u64) -> Result<*mut u8, GpuError> {
        self.bind()?;
        let class = size_class(bytes);
        let reused = match &self.cache {
            Some(c) => c.lock().map_err(|_| GpuError::Poisoned)?.take(class),
            None => None,
        };
        let p = match reused {
            Some(p) => {
                self.counters.reused.fetch_add(1, Ordering::Relaxed);
                Ok(p)
            }
            None => self.driver_alloc(class),
        }
        .map_err(|e| match e {
            GpuError::Driver { call, message } => GpuError::Driver {
                call,
                message: format!(
                    "{message} (allocating {bytes} bytes on device {} `{}`, {} bytes in use)",
                    self.ordinal,
                    self.name,
                    self.allocated.load(Ordering::Relaxed)
                ),
            },
            e => e,
        })?;
        if let Ok(mut s) = self.sizes.lock() {
            s.insert(p, bytes);
        }
        let now = self.allocated.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak.fetch_max(now, Ordering::Relaxed);
        Ok(p as *mut u8)
    }

    /// Free what [`GpuDevice::alloc`] returned: kept for reuse, or given back to the driver
    /// (`PPCC_GPU_CACHE=off`, or a block the device does not know).
    pub fn free(&self, p: *mut u8) {
        if p.is_null() {
            return;
        }
        let bytes = self
            .sizes
            .lock()
            .ok()
            .and_then(|mut s| s.remove(&(p as u64)));
        if let Some(bytes) = bytes {
            self.allocated.fetch_sub(bytes, Ordering::Relaxed);
            if let Some(Ok(mut c)) = self.cache.as_ref().map(|c| c.lock()) {
                c.put(size_class(bytes), p as u64);
                return;
            }
            self.reserved
                .fetch_sub(size_class(bytes), Ordering::Relaxed);
        }
        if let Err(e) = self.bind() {
            fail(e.to_string());
            return;
        }
        // SAFETY: `p` came from cuMemAllocManaged and is freed once.
        let r = unsafe { sys::cuMemFree_v2(p as sys::CUdeviceptr) };
        if let Err(e) = check("cuMemFree", r) {
            fail(e.to_string());
        }
    }

    /// Wait for the device's stream.
    pub fn synchronize(&self) -> Result<(), GpuError> {
        self.bind()?;
        // SAFETY: the stream belongs to this device's context.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(self.stream)
        })
    }

    fn function(&self, image: *const c_void, name: &CStr) -> Result<*mut c_void, GpuError> {
        let key = (image as usize, name.to_owned());
        let kernel = || name.to_string_lossy().into_owned();
        if let Some(&f) = self
            .functions
            .lock()
            .map_err(|_| GpuError::Poisoned)?
            .get(&key)
        {
            return Ok(f as *mut c_void);
        }
        let module = {
            let mut modules = self.modules.lock().map_err(|_| GpuError::Poisoned)?;
            match modules.get(&(image as usize)) {
                Some(&m) => m,
                None => {
                    let m = load_image(image, &kernel())?;
                    modules.insert(image as usize, m);
                    m
                }
            }
        };
        let mut f = std::ptr::null_mut();
        // SAFETY: `module` is loaded in this device's (current) context.
        let r = unsafe { sys::cuModuleGetFunction(&mut f, module, name.as_ptr()) };
        check("cuModuleGetFunction", r).map_err(|e| GpuError::Kernel {
            kernel: kernel(),
            message: e.to_string(),
        })?;
        if let Ok(mut fs) = self.functions.lock() {
            fs.insert(key, f as usize);
        }
        Ok(f as *mut c_void)
    }
}

/// JIT-compile a NUL-terminated PTX image (that holds `kernel`) in the current context; the
/// error holds what the JIT compiler said.
fn load_image(image: *const c_void, kernel: &str) -> Result<sys::CUmodule, GpuError> {
    let mut log = vec![0u8; 8192];
    let mut options = [
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
    ];
    let mut values = [log.as_mut_ptr() as *mut c_void, log.len() as *mut c_void];
    let mut m = std::ptr::null_mut();
    // SAFETY: `image` is the NUL-terminated PTX embedded in a loaded module; the options
    // point at live buffers of the sizes given.
    let r = unsafe {
        sys::cuModuleLoadDataEx(
            &mut m,
            image,
            options.len() as u32,
            options.as_mut_ptr(),
            values.as_mut_ptr(),
        )
    };
    if r == sys::CUresult::CUDA_SUCCESS {
        return Ok(m);
    }
    let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
    let text = String::from_utf8_lossy(&log[..end]);
    Err(GpuError::Kernel {
        kernel: kernel.to_string(),
        message: format!(
            "loading its image (PTX): {}{}",
            describe(r),
            if text.trim().is_empty() {
                String::new()
            } else {
                format!("\n{}", text.trim())
            }
        ),
    })
}

// ---- the module ABI (called from generated host code; never unwinds) ----

fn guarded<T>(default: T, body: impl FnOnce() -> T) -> T {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).unwrap_or_else(|_| {
        fail("a panic in the GPU runtime".to_string());
        default
    })
}

extern "C" fn abi_get_function(image: *const c_void, name: *const std::ffi::c_char) -> *mut c_void {
    guarded(std::ptr::null_mut(), || {
        let Some(d) = current() else {
            fail("loading a kernel outside a call of a CUDA module".into());
            return std::ptr::null_mut();
        };
        if image.is_null() || name.is_null() {
            fail("the module asked for a kernel of a null image or name".into());
            return std::ptr::null_mut();
        }
        // SAFETY: generated code passes a NUL-terminated kernel name.
        let name = unsafe { CStr::from_ptr(name) };
        match d.function(image, name) {
            Ok(f) => f,
            Err(e) => {
                fail(e.to_string());
                std::ptr::null_mut()
            }
        }
    })
}

#[allow(clippy::too_many_arguments)]
extern "C" fn abi_launch(
    function: *mut c_void,
    gx: i64,
    gy: i64,
    gz: i64,
    bx: i64,
    by: i64,
    bz: i64,
    shared: i32,
    stream: *mut c_void,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
    _nparams: i64,
) {
    guarded((), || {
        if FAILED.with(|f| f.get()) || function.is_null() {
            return; // an earlier failure of this call is reported instead
        }
        let dims = [gx, gy, gz, bx, by, bz];
        if dims.iter().any(|&x| x <= 0 || x > u32::MAX as i64) {
            if dims.contains(&0) {
                return; // nothing to do (an empty tensor)
            }
            fail(format!(
                "a kernel launch with grid {gx}×{gy}×{gz} and block {bx}×{by}×{bz}"
            ));
            return;
        }
        let stream = if stream.is_null() {
            match current() {
                Some(d) => d.stream,
                None => std::ptr::null_mut(),
            }
        } else {
            stream as sys::CUstream
        };
        // SAFETY: `function` came from cuModuleGetFunction in this context; params are
        // what the generated code packed for this kernel.
        let r = unsafe {
            sys::cuLaunchKernel(
                function as sys::CUfunction,
                gx as u32,
                gy as u32,
                gz as u32,
                bx as u32,
                by as u32,
                bz as u32,
                shared.max(0) as u32,
                stream,
                params,
                extra,
            )
        };
        if let Err(e) = check("cuLaunchKernel", r) {
            fail(format!(
                "launching a kernel (grid {gx}×{gy}×{gz}, block {bx}×{by}×{bz}): {e}"
            ));
        } else if let Some(d) = current() {
            d.counters.launches.fetch_add(1, Ordering::Relaxed);
            if let Some(Ok(mut p)) = d.profile.as_ref().map(|p| p.lock()) {
                p.entry(function as usize).or_default().0 += 1;
                LAST_KERNEL.with(|k| k.set(function as usize));
            }
        }
    })
}

extern "C" fn abi_stream_create() -> *mut c_void {
    guarded(std::ptr::null_mut(), || match current() {
        Some(d) => d.stream as *mut c_void,
        None => {
            fail("a stream outside a call of a CUDA module".into());
            std::ptr::null_mut()
        }
    })
}

extern "C" fn abi_stream_destroy(_stream: *mut c_void) {}

extern "C" fn abi_stream_synchronize(stream: *mut c_void) {
    guarded((), || {
        if stream.is_null() {
            return;
        }
        let t0 = std::time::Instant::now();
        // SAFETY: the stream is the device's (abi_stream_create).
        let r = unsafe { sys::cuStreamSynchronize(stream as sys::CUstream) };
        if let Some(d) = current() {
            let ns = t0.elapsed().as_nanos() as u64;
            d.counters.kernel_ns.fetch_add(ns, Ordering::Relaxed);
            if let Some(Ok(mut p)) = d.profile.as_ref().map(|p| p.lock()) {
                let last = LAST_KERNEL.with(|k| k.replace(0));
                if last != 0 {
                    p.entry(last).or_default().1 += ns;
                }
            }
        }
        if let Err(e) = check("cuStreamSynchronize", r) {
            fail(format!("running a kernel: {e}"));
        }
    })
}

/// Host memory handed out when a device allocation fails: the generated host code goes on
/// (its kernels are skipped once the call has failed) and the call returns the error,
/// instead of the host code writing through a null pointer.
fn fallback_alloc(bytes: u64) -> *mut c_void {
    // SAFETY: calloc of at least one byte; freed by `abi_free` through `FALLBACK`.
    let p = unsafe { libc_calloc(bytes.max(1) as usize) };
    if !p.is_null() {
        if let Ok(mut f) = FALLBACK.lock() {
            f.push(p as usize);
        }
    }
    p
}

static FALLBACK: Mutex<Vec<usize>> = Mutex::new(Vec::new());

unsafe fn libc_calloc(n: usize) -> *mut c_void {
    extern "C" {
        fn calloc(n: usize, size: usize) -> *mut c_void;
    }
    // SAFETY: plain C allocation.
    unsafe { calloc(n, 1) }
}

unsafe fn libc_free(p: *mut c_void) {
    extern "C" {
        fn free(p: *mut c_void);
    }
    // SAFETY: `p` came from `libc_calloc`.
    unsafe { free(p) }
}

extern "C" fn abi_alloc(bytes: u64) -> *mut c_void {
    let p = guarded(std::ptr::null_mut(), || match current() {
        Some(d) => match d.alloc(bytes) {
            Ok(p) => p as *mut c_void,
            Err(e) => {
                fail(e.to_string());
                std::ptr::null_mut()
            }
        },
        None => {
            fail("an allocation outside a call of a CUDA module".into());
            std::ptr::null_mut()
        }
    });
    if p.is_null() {
        fallback_alloc(bytes)
    } else {
        p
    }
}

extern "C" fn abi_free(p: *mut c_void) {
    guarded((), || {
        if p.is_null() {
            return;
        }
        let was_fallback = FALLBACK.lock().ok().is_some_and(|mut f| {
            match f.iter().position(|&x| x == p as usize) {
                Some(i) => {
                    f.swap_remove(i);
                    true
                }
                None => false,
            }
        });
        if was_fallback {
            // SAFETY: handed out by `fallback_alloc`.
            unsafe { libc_free(p) };
            return;
        }
        if let Some(d) = current() {
            d.free(p as *mut u8);
        }
    })
}

extern "C" fn abi_memcpy(dst: *mut c_void, src: *const c_void, bytes: u64, _stream: *mut c_void) {
    guarded((), || {
        if bytes == 0 {
            return;
        }
        // SAFETY: both pointers address managed (unified) memory of at least `bytes`.
        let r = unsafe {
            sys::cuMemcpy(
                dst as sys::CUdeviceptr,
                src as sys::CUdeviceptr,
                bytes as usize,
            )
        };
        if let Err(e) = check("cuMemcpy", r) {
            fail(e.to_string());
        }
    })
}

extern "C" fn abi_memset32(dst: *mut c_void, value: u32, count: u64, _stream: *mut c_void) {
    guarded((), || {
        // SAFETY: `dst` addresses at least `count` 32-bit words of device memory.
        let r = unsafe { sys::cuMemsetD32_v2(dst as sys::CUdeviceptr, value, count as usize) };
        if let Err(e) = check("cuMemsetD32", r) {
            fail(e.to_string());
        }
    })
}

extern "C" fn abi_memset16(dst: *mut c_void, value: u16, count: u64, _stream: *mut c_void) {
    guarded((), || {
        // SAFETY: `dst` addresses at least `count` 16-bit words of device memory.
        let r = unsafe { sys::cuMemsetD16_v2(dst as sys::CUdeviceptr, value, count as usize) };
        if let Err(e) = check("cuMemsetD16", r) {
            fail(e.to_string());
        }
    })
}

/// A matrix product of the module's host code (`--gpu-gemm cublas`), on cuBLAS: queued on
/// the device's stream after the kernels before it, and complete when this returns.
#[allow(clippy::too_many_arguments)]
extern "C" fn abi_gemm<T: cublas::Element + Into<f64>>(
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
    c0_rs: i64,
    c0_cs: i64,
    c: *mut T,
    ldc: i64,
) {
    guarded((), || {
        if !c0.is_null() && !std::ptr::eq(c0, c) {
            fail("a matrix product whose C0 is not its result (the module was built for another runtime?)".into());
            return;
        }
        let r = cublas::RowMajor {
            flags,
            m,
            n,
            k,
            lda,
            ldb,
            ldc,
            c0: (!c0.is_null()).then_some((c0_rs, c0_cs)),
            count: 1,
            strides: [0; 3],
        };
        if let Err(e) = run_gemm(&r, alpha.into(), a, b, beta.into(), c) {
            fail(e);
        }
    })
}

/// `count` matrix products of the module's host code at strides (`--gpu-gemm cublas`), as
/// one strided-batched cuBLAS call; beta 0 writes C, else adds to it.
#[allow(clippy::too_many_arguments)]
extern "C" fn abi_gemm_batched<T: cublas::Element + Into<f64>>(
    flags: i64,
    m: i64,
    n: i64,
    k: i64,
    alpha: T,
    a: *const T,
    lda: i64,
    stride_a: i64,
    b: *const T,
    ldb: i64,
    stride_b: i64,
    beta: T,
    c: *mut T,
    ldc: i64,
    stride_c: i64,
    count: i64,
) {
    guarded((), || {
        let beta: f64 = beta.into();
        let r = cublas::RowMajor {
            flags,
            m,
            n,
            k,
            lda,
            ldb,
            ldc,
            c0: (beta != 0.0).then_some((ldc, 1)),
            count,
            strides: [stride_a, stride_b, stride_c],
        };
        if let Err(e) = run_gemm(&r, alpha.into(), a, b, beta, c) {
            fail(e);
        }
    })
}

/// Run `r` on the current device's cuBLAS handle (made on first use) and wait for it;
/// nothing when the call has already failed (that failure is reported instead).
fn run_gemm<T: cublas::Element>(
    r: &cublas::RowMajor,
    alpha: f64,
    a: *const T,
    b: *const T,
    beta: f64,
    c: *mut T,
) -> Result<(), String> {
    if FAILED.with(|f| f.get()) {
        return Ok(());
    }
    let d = current().ok_or("a matrix product outside a call of a CUDA module")?;
    let h = d
        .blas
        .get_or_init(|| cublas::create_handle(d.stream as *mut c_void))
        .clone()?;
    let t0 = std::time::Instant::now();
    // SAFETY: the module passes device buffers of the sizes it describes; the handle was
    // made in this device's context, which `enter` made current.
    unsafe { cublas::gemm(h, r, alpha, a, b, beta, c)? };
    // SAFETY: the stream belongs to this device's context.
    let done = check("cuStreamSynchronize", unsafe {
        sys::cuStreamSynchronize(d.stream)
    })
    .map_err(|e| format!("running a matrix product on cuBLAS: {e}"));
    d.counters.gemms.fetch_add(1, Ordering::Relaxed);
    d.counters
        .gemm_ns
        .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
    done
}

/// A buffer of managed memory on one device, freed when dropped.
pub struct DeviceBuffer {
    ptr: *mut u8,
    bytes: usize,
    device: Arc<GpuDevice>,
}

// SAFETY: managed memory is addressable from every thread of the process; the buffer is
// uniquely owned.
unsafe impl Send for DeviceBuffer {}
unsafe impl Sync for DeviceBuffer {}

impl DeviceBuffer {
    /// `bytes` of zeroed managed memory on `device`.
    pub fn zeroed(device: &Arc<GpuDevice>, bytes: usize) -> Result<DeviceBuffer, GpuError> {
        let ptr = device.alloc(bytes as u64)?;
        // SAFETY: `ptr` addresses at least max(bytes, 1) bytes of managed memory, and
        // `alloc` made the device's context current on this thread.
        check("cuMemsetD8", unsafe {
            sys::cuMemsetD8_v2(ptr as sys::CUdeviceptr, 0, bytes.max(1))
        })?;
        Ok(DeviceBuffer {
            ptr,
            bytes,
            device: device.clone(),
        })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    pub fn device(&self) -> &Arc<GpuDevice> {
        &self.device
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        self.device.free(self.ptr);
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod cache_tests {
    use super::*;

    #[test]
    fn size_classes_cover_the_request_with_little_waste() {
        let mut sizes: Vec<u64> = (0..5000u64)
            .chain((1..40).map(|i| i * 1_000_003))
            .chain([1 << 20, (1 << 20) + 1, 3 << 30])
            .collect();
        sizes.sort();
        let mut last = 0;
        for b in sizes {
            let c = size_class(b);
            assert!(c >= b.max(1) && c.is_multiple_of(512), "{b} -> {c}");
            if b > 1 << 20 {
                assert!(c as f64 <= b as f64 * 1.125, "{b} -> {c}");
            } else {
                assert!(c - b.max(1) < 512, "{b} -> {c}");
            }
            assert!(c >= last, "classes grow with the request");
            last = c;
        }
        // Requests of one class share blocks.
        assert_eq!(size_class(1000), size_class(1024));
        assert_ne!(size_class(1024), size_class(1025));
    }

    #[test]
    fn freed_blocks_are_reused_by_their_class_only_and_drained_once() {
        let mut c = BlockCache::default();
        assert_eq!(c.take(512), None);
        c.put(512, 0x1000);
        c.put(512, 0x2000);
        c.put(1024, 0x3000);
        assert_eq!(c.take(512), Some(0x2000), "last freed first");
        assert_eq!(c.take(1536), None);
        let mut all = c.drain();
        all.sort();
        assert_eq!(all, [(512, 0x1000), (1024, 0x3000)]);
        assert_eq!(c.take(512), None);
        assert!(c.drain().is_empty());
    }
}
