//! NCCL between GPUs: the [`Link`] under [`super::framed::Framed`] for `ppcc run --nccl`.
//!
//! - The library is loaded at run time (`PPCC_NCCL_LIB`, else `libnccl.so.2`, else
//!   `libnccl.so`), so ppcc builds and runs without it; only the dozen functions used here
//!   are bound. (cudarc's NCCL loader looks for `libnccl.so` and CUDA-versioned names, not
//!   the `libnccl.so.2` that NVIDIA's packages and wheels install.)
//! - One two-rank communicator per direction of each pair of ranks that exchange
//!   messages, each with its own stream on both sides. NCCL matches point-to-point
//!   operations in posting order per communicator, and an operation on a stream waits for
//!   the ones before it: with one communicator for both directions, two ranks that both
//!   send before they receive would wait on each other. With one per direction a send only
//!   ever waits for its own receiver.
//! - Set-up: every rank walks its pairs in one global order (sender, receiver); the sender
//!   makes the unique id and sends it over the inner transport, then both join. Each pair's
//!   join waits only for the two, and the order is the same everywhere, so it cannot
//!   deadlock.
//! - A send copies the stage function's buffer (GPU memory: device to device) into a
//!   buffer of its own on the link's copy stream, waits for that copy only, posts
//!   `ncclSend` on the pair's stream and returns; the buffer is freed once the stream has
//!   passed it. A receive posts `ncclRecv` into a new device buffer and polls the stream
//!   until the data is there or its deadline passes (then the communicators are aborted);
//!   the buffer is then copied into the receiving function's buffer, device to device, at
//!   once or, for a message that came before the one asked for, when it is asked for.
//!   Tensors do not cross the host.
//!
//! What has run where: this file has been compiled and its failure paths (no library, no
//! GPU) tested on machines without a GPU; it has not yet run on GPUs (see BENCHMARKS.md).

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use cudarc::driver::sys;
use ppir::{DType, Tensor, TensorType};

use super::framed::{Held, Link};
use super::{Tag, Transport, TransportError};
use crate::gpu::GpuDevice;

type NcclResult = c_int;
type Comm = *mut c_void;
const NCCL_SUCCESS: NcclResult = 0;
const NCCL_IN_PROGRESS: NcclResult = 7;
const NCCL_UINT8: c_int = 1;

/// `ncclUniqueId`: 128 opaque bytes.
#[repr(C)]
#[derive(Clone, Copy)]
struct UniqueId {
    internal: [c_char; 128],
}

/// The functions used, from the loaded library.
struct Nccl {
    _lib: libloading::Library,
    path: String,
    version: c_int,
    get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> NcclResult,
    comm_init_rank: unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int) -> NcclResult,
    send:
        unsafe extern "C" fn(*const c_void, usize, c_int, c_int, Comm, sys::CUstream) -> NcclResult,
    recv: unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, Comm, sys::CUstream) -> NcclResult,
    comm_abort: unsafe extern "C" fn(Comm) -> NcclResult,
    comm_destroy: unsafe extern "C" fn(Comm) -> NcclResult,
    async_error: unsafe extern "C" fn(Comm, *mut NcclResult) -> NcclResult,
    error_string: unsafe extern "C" fn(NcclResult) -> *const c_char,
}

fn load() -> Result<Nccl, String> {
    let (lib, path) =
        crate::gpu::load_library("PPCC_NCCL_LIB", &["libnccl.so.2", "libnccl.so"]).map_err(
            |tried| {
                format!(
                    "--nccl: the NCCL library cannot be loaded (tried {tried}); install NCCL (Debian's libnccl2, or the nvidia-nccl-cu12 wheel) or set PPCC_NCCL_LIB to its path, or run without --nccl"
                )
            },
        )?;
    bind(lib, path)
}

fn bind(lib: libloading::Library, path: String) -> Result<Nccl, String> {
    macro_rules! sym {
        ($name:literal) => {
            // SAFETY: the symbol has the signature of NCCL's header (nccl.h, 2.x), which
            // the field it goes into spells out.
            *unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                .map_err(|e| format!("{path}: no {} ({e})", $name))?
        };
    }
    let get_version: unsafe extern "C" fn(*mut c_int) -> NcclResult = sym!("ncclGetVersion");
    let mut version = 0;
    // SAFETY: writes one int.
    unsafe { get_version(&mut version) };
    Ok(Nccl {
        version,
        get_unique_id: sym!("ncclGetUniqueId"),
        comm_init_rank: sym!("ncclCommInitRank"),
        send: sym!("ncclSend"),
        recv: sym!("ncclRecv"),
        comm_abort: sym!("ncclCommAbort"),
        comm_destroy: sym!("ncclCommDestroy"),
        async_error: sym!("ncclCommGetAsyncError"),
        error_string: sym!("ncclGetErrorString"),
        path,
        _lib: lib,
    })
}

fn nccl() -> Result<&'static Nccl, TransportError> {
    static LIB: OnceLock<Result<Nccl, String>> = OnceLock::new();
    LIB.get_or_init(load)
        .as_ref()
        .map_err(|e| TransportError::Failed(e.clone()))
}

/// NCCL's version as `2.21.5`, or why it cannot be loaded.
pub fn version() -> Result<String, TransportError> {
    let v = nccl()?.version;
    Ok(format!("{}.{}.{}", v / 10000, v / 100 % 100, v % 100))
}

impl Nccl {
    fn check(&self, call: &str, r: NcclResult) -> Result<(), TransportError> {
        if r == NCCL_SUCCESS {
            return Ok(());
        }
        // SAFETY: returns a static string for any result code.
        let p = unsafe { (self.error_string)(r) };
        let text = if p.is_null() {
            format!("error {r}")
        } else {
            // SAFETY: NUL-terminated and static.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        };
        Err(TransportError::Failed(format!("NCCL {call}: {text}")))
    }
}

fn cuda(call: &'static str, r: sys::CUresult) -> Result<(), TransportError> {
    crate::gpu::check(call, r).map_err(|e| TransportError::Failed(e.to_string()))
}

/// One direction of one pair of ranks.
struct Pair {
    comm: Comm,
    stream: sys::CUstream,
}

/// A send whose device buffer the stream has not passed yet.
struct InFlight {
    done: sys::CUevent,
    buffer: sys::CUdeviceptr,
}

/// A received message in a device buffer of the link's GPU.
struct DeviceBytes {
    device: Arc<GpuDevice>,
    buffer: sys::CUdeviceptr,
    len: usize,
}

// SAFETY: a device allocation, used with the device's context current (see `NcclLink`).
unsafe impl Send for DeviceBytes {}

impl Held for DeviceBytes {
    fn len(&self) -> usize {
        self.len
    }

    fn copy_to(&self, out: &mut [u8]) -> Result<(), TransportError> {
        if out.len() != self.len {
            return Err(TransportError::Failed(format!(
                "{} bytes received for a buffer of {}",
                self.len,
                out.len()
            )));
        }
        let _on = self
            .device
            .enter()
            .map_err(|e| TransportError::Failed(e.to_string()))?;
        // SAFETY: `out` is `len` bytes of memory the driver addresses (a CUDA module's
        // managed buffer, or host memory: unified addressing tells which); the buffer has
        // `len` bytes.
        cuda("cuMemcpy", unsafe {
            sys::cuMemcpy(out.as_mut_ptr() as sys::CUdeviceptr, self.buffer, self.len)
        })
    }

    fn to_vec(&self) -> Result<Vec<u8>, TransportError> {
        let mut v = vec![0u8; self.len];
        self.copy_to(&mut v)?;
        Ok(v)
    }
}

impl Drop for DeviceBytes {
    fn drop(&mut self) {
        if let Ok(_on) = self.device.enter() {
            // SAFETY: the receive that wrote it has completed; nothing else holds it.
            unsafe { sys::cuMemFree_v2(self.buffer) };
        }
    }
}

/// This rank's NCCL communicators to the ranks it exchanges messages with.
pub struct NcclLink {
    lib: &'static Nccl,
    device: Arc<GpuDevice>,
    me: usize,
    to: HashMap<usize, Pair>,
    from: HashMap<usize, Pair>,
    /// Where a send's bytes are copied into the link's buffer.
    copy_stream: sys::CUstream,
    in_flight: Vec<InFlight>,
    /// A transfer timed out or a rank failed: the communicators are aborted.
    broken: bool,
}

// SAFETY: the communicators, streams, events and buffers are handles usable from any
// thread with the device's context current (every method enters it); one thread uses the
// link at a time (it is owned by one worker).
unsafe impl Send for NcclLink {}

/// The set-up message carrying a pair's unique id (16 i64s of its 128 bytes).
fn id_tag(from: usize, to: usize) -> Tag {
    Tag {
        from: from as u32,
        to: to as u32,
        channel: i64::MIN + 2,
        micro_batch: 0,
        step: 0,
    }
}

fn id_to_tensor(id: &UniqueId) -> Tensor {
    let bytes: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
    let words = bytes
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
        .collect();
    Tensor::from_i64(DType::I64, vec![16], words)
}

fn id_from_tensor(t: &Tensor) -> Option<UniqueId> {
    let words = t.as_i64().filter(|w| w.len() == 16)?;
    let mut id = UniqueId { internal: [0; 128] };
    for (i, w) in words.iter().enumerate() {
        for (j, b) in w.to_le_bytes().iter().enumerate() {
            id.internal[i * 8 + j] = *b as c_char;
        }
    }
    Some(id)
}

impl NcclLink {
    /// Join the communicators of rank `me` (on `device`) with the ranks it sends to and
    /// receives from, over `inner` for the set-up (see the module comment). Every rank of
    /// the run calls it, with the peers its stages' send/recv ops name.
    pub fn connect(
        device: Arc<GpuDevice>,
        me: usize,
        sends_to: &[usize],
        receives_from: &[usize],
        inner: &mut dyn Transport,
        timeout: Duration,
    ) -> Result<NcclLink, TransportError> {
        let lib = nccl()?;
        let _on = device
            .enter()
            .map_err(|e| TransportError::Failed(e.to_string()))?;
        let mut pairs: Vec<(usize, usize)> = sends_to
            .iter()
            .map(|&b| (me, b))
            .chain(receives_from.iter().map(|&a| (a, me)))
            .filter(|&(a, b)| a != b)
            .collect();
        pairs.sort_unstable();
        pairs.dedup();
        let mut copy_stream = std::ptr::null_mut();
        // SAFETY: creates a stream in the current context (CU_STREAM_NON_BLOCKING).
        cuda("cuStreamCreate", unsafe {
            sys::cuStreamCreate(&mut copy_stream, 1)
        })?;
        let mut link = NcclLink {
            lib,
            device: device.clone(),
            me,
            to: HashMap::new(),
            from: HashMap::new(),
            copy_stream,
            in_flight: vec![],
            broken: false,
        };
        for (a, b) in pairs {
            let (id, index) = if a == me {
                let mut id = UniqueId { internal: [0; 128] };
                // SAFETY: writes one unique id.
                lib.check("ncclGetUniqueId", unsafe { (lib.get_unique_id)(&mut id) })?;
                inner.send(b, id_tag(a, b), id_to_tensor(&id))?;
                (id, 0)
            } else {
                let t = inner.recv(a, id_tag(a, b), &TensorType::of(DType::I64, &[16]), timeout)?;
                let id = id_from_tensor(&t).ok_or_else(|| {
                    TransportError::Failed(format!("rank {a} sent a malformed NCCL unique id"))
                })?;
                (id, 1)
            };
            let mut comm: Comm = std::ptr::null_mut();
            // SAFETY: a two-rank communicator; the peer joins with the same id.
            lib.check("ncclCommInitRank", unsafe {
                (lib.comm_init_rank)(&mut comm, 2, id, index)
            })?;
            let mut stream = std::ptr::null_mut();
            // SAFETY: creates a stream in the current context (CU_STREAM_NON_BLOCKING).
            let made = cuda("cuStreamCreate", unsafe {
                sys::cuStreamCreate(&mut stream, 1)
            });
            if let Err(e) = made {
                // SAFETY: the communicator was just made and is not used.
                unsafe { (lib.comm_destroy)(comm) };
                return Err(e);
            }
            let pair = Pair { comm, stream };
            if a == me {
                link.to.insert(b, pair);
            } else {
                link.from.insert(a, pair);
            }
        }
        Ok(link)
    }

    fn enter(&self) -> Result<crate::gpu::Entered, TransportError> {
        if self.broken {
            return Err(TransportError::Failed(format!(
                "{}: aborted after an earlier failure",
                self.describe()
            )));
        }
        self.device
            .enter()
            .map_err(|e| TransportError::Failed(e.to_string()))
    }

    /// Free the buffers of sends the streams have passed.
    fn reap(&mut self) -> Result<(), TransportError> {
        let mut i = 0;
        while i < self.in_flight.len() {
            // SAFETY: a live event of this context.
            let r = unsafe { sys::cuEventQuery(self.in_flight[i].done) };
            if r == sys::CUresult::CUDA_ERROR_NOT_READY {
                i += 1;
                continue;
            }
            cuda("cuEventQuery", r)?;
            let f = self.in_flight.swap_remove(i);
            // SAFETY: the send that read the buffer has completed.
            unsafe {
                sys::cuEventDestroy_v2(f.done);
                sys::cuMemFree_v2(f.buffer);
            }
        }
        Ok(())
    }

    /// The first asynchronous NCCL error of a communicator, if any.
    fn async_error(&self, comm: Comm) -> Result<(), TransportError> {
        let mut r = NCCL_SUCCESS;
        // SAFETY: a live communicator; writes one result.
        self.lib.check("ncclCommGetAsyncError", unsafe {
            (self.lib.async_error)(comm, &mut r)
        })?;
        if r == NCCL_IN_PROGRESS {
            return Ok(());
        }
        self.lib.check("asynchronous error", r)
    }

    fn abort_all(&mut self) {
        if self.broken {
            return;
        }
        self.broken = true;
        for p in self.to.values().chain(self.from.values()) {
            // SAFETY: a live communicator; aborting makes its operations return.
            unsafe { (self.lib.comm_abort)(p.comm) };
        }
    }
}

impl Link for NcclLink {
    fn describe(&self) -> String {
        format!(
            "NCCL ({}) on GPU {} of rank {}",
            self.lib.path, self.device.ordinal, self.me
        )
    }

    fn sends_to(&self, rank: usize) -> bool {
        self.to.contains_key(&rank)
    }

    fn receives_from(&self, rank: usize) -> bool {
        self.from.contains_key(&rank)
    }

    fn send(&mut self, to: usize, bytes: &[u8]) -> Result<(), TransportError> {
        let _on = self.enter()?;
        self.reap()?;
        let pair = self
            .to
            .get(&to)
            .ok_or_else(|| TransportError::Failed(format!("no NCCL link to rank {to}")))?;
        let (comm, stream, len) = (pair.comm, pair.stream, bytes.len());
        let mut buffer: sys::CUdeviceptr = 0;
        // SAFETY: allocates at least one byte; freed by `reap` or on drop.
        cuda("cuMemAlloc", unsafe {
            sys::cuMemAlloc_v2(&mut buffer, len.max(1))
        })?;
        // The caller's buffer may be freed once this returns: copy it now (on the copy
        // stream, so that the sends queued on the pair's stream do not hold it up).
        // SAFETY: `bytes` is memory the driver addresses (a CUDA module's managed buffer,
        // or host memory), `len` bytes, as is the new buffer.
        let copied = cuda("cuMemcpyAsync", unsafe {
            sys::cuMemcpyAsync(
                buffer,
                bytes.as_ptr() as sys::CUdeviceptr,
                len,
                self.copy_stream,
            )
        })
        .and_then(|()| {
            // SAFETY: a live stream of this context.
            cuda("cuStreamSynchronize", unsafe {
                sys::cuStreamSynchronize(self.copy_stream)
            })
        });
        if let Err(e) = copied {
            // SAFETY: nothing was posted on the buffer.
            unsafe { sys::cuMemFree_v2(buffer) };
            return Err(e);
        }
        let mut done = std::ptr::null_mut();
        let posted = (|| {
            // SAFETY: the buffer holds `len` bytes, on the pair's stream.
            self.lib.check("ncclSend", unsafe {
                (self.lib.send)(buffer as *const c_void, len, NCCL_UINT8, 1, comm, stream)
            })?;
            // SAFETY: makes one event (CU_EVENT_DISABLE_TIMING).
            cuda("cuEventCreate", unsafe { sys::cuEventCreate(&mut done, 2) })?;
            // SAFETY: records it after the send on the pair's stream.
            cuda("cuEventRecord", unsafe { sys::cuEventRecord(done, stream) })
        })();
        if let Err(e) = posted {
            // The buffer may still be read by what was posted: leave it (a failed link is
            // not used again), and stop the pair's other operations.
            self.abort_all();
            return Err(e);
        }
        self.in_flight.push(InFlight { done, buffer });
        Ok(())
    }

    fn recv(
        &mut self,
        from: usize,
        len: usize,
        deadline: Instant,
        stopped: &dyn Fn() -> Option<String>,
    ) -> Result<Option<Box<dyn Held>>, TransportError> {
        let _on = self.enter()?;
        self.reap()?;
        let pair = self
            .from
            .get(&from)
            .ok_or_else(|| TransportError::Failed(format!("no NCCL link from rank {from}")))?;
        let (comm, stream) = (pair.comm, pair.stream);
        let mut buffer: sys::CUdeviceptr = 0;
        // SAFETY: allocates at least one byte, owned by the returned message (or left to a
        // broken link).
        cuda("cuMemAlloc", unsafe {
            sys::cuMemAlloc_v2(&mut buffer, len.max(1))
        })?;
        // SAFETY: the buffer holds `len` bytes; the peer's send on this pair matches.
        if let Err(e) = self.lib.check("ncclRecv", unsafe {
            (self.lib.recv)(buffer as *mut c_void, len, NCCL_UINT8, 0, comm, stream)
        }) {
            self.abort_all();
            return Err(e);
        }
        loop {
            // SAFETY: a live stream of this context.
            let r = unsafe { sys::cuStreamQuery(stream) };
            if r == sys::CUresult::CUDA_SUCCESS {
                break;
            }
            if r != sys::CUresult::CUDA_ERROR_NOT_READY {
                self.abort_all();
                return Err(cuda("cuStreamQuery", r)
                    .err()
                    .unwrap_or_else(|| TransportError::Failed("cuStreamQuery failed".into())));
            }
            if let Err(e) = self.async_error(comm) {
                self.abort_all();
                return Err(e);
            }
            if let Some(reason) = stopped() {
                // Another device failed: its send may never come.
                self.abort_all();
                return Err(TransportError::Aborted(reason));
            }
            if Instant::now() >= deadline {
                // The receive may still write the buffer: it stays allocated.
                self.abort_all();
                return Ok(None);
            }
            std::thread::sleep(Duration::from_micros(20));
        }
        Ok(Some(Box::new(DeviceBytes {
            device: self.device.clone(),
            buffer,
            len,
        })))
    }

    fn abort(&mut self) {
        if self.device.enter().is_ok() {
            self.abort_all();
        }
    }
}

impl Drop for NcclLink {
    fn drop(&mut self) {
        let Ok(_on) = self.device.enter() else {
            return;
        };
        if !self.broken {
            // Sends still in flight are matched by their receivers in a run that ended
            // well; after a failure elsewhere they may never be: wait a little, then abort.
            let deadline = Instant::now() + Duration::from_secs(2);
            let streams: Vec<sys::CUstream> = self
                .to
                .values()
                .chain(self.from.values())
                .map(|p| p.stream)
                .collect();
            for stream in streams {
                loop {
                    // SAFETY: a live stream of this context.
                    let r = unsafe { sys::cuStreamQuery(stream) };
                    if r != sys::CUresult::CUDA_ERROR_NOT_READY {
                        break;
                    }
                    if Instant::now() >= deadline {
                        self.abort_all();
                        break;
                    }
                    std::thread::sleep(Duration::from_micros(100));
                }
            }
            if !self.broken {
                let _ = self.reap();
            }
        }
        for (_, p) in self.to.drain().chain(self.from.drain()) {
            // SAFETY: the communicator and stream are not used after this; a broken link's
            // buffers stay allocated (an aborted operation may still hold them).
            unsafe {
                if self.broken {
                    (self.lib.comm_abort)(p.comm);
                } else {
                    (self.lib.comm_destroy)(p.comm);
                }
                sys::cuStreamDestroy_v2(p.stream);
            }
        }
        // SAFETY: every copy on it was waited for.
        unsafe { sys::cuStreamDestroy_v2(self.copy_stream) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_ids_survive_the_set_up_message() {
        let mut id = UniqueId { internal: [0; 128] };
        for (i, c) in id.internal.iter_mut().enumerate() {
            *c = (i as i32 * 37 - 100) as i8 as c_char;
        }
        let back = id_from_tensor(&id_to_tensor(&id)).unwrap();
        assert_eq!(back.internal, id.internal);
        assert!(id_from_tensor(&Tensor::from_i64(DType::I64, vec![3], vec![0; 3])).is_none());
    }

    #[test]
    fn an_installed_library_binds_every_function() {
        // Where NCCL is installed (PPCC_NCCL_LIB=.../nvidia/nccl/lib/libnccl.so.2 from the
        // nvidia-nccl-cu12 wheel works without a GPU): every symbol resolved, a 2.x version.
        let Ok(v) = version() else {
            return;
        };
        assert!(v.starts_with("2."), "{v}");
        eprintln!("NCCL {v} from {}", nccl().unwrap().path);
    }

    #[test]
    fn a_missing_library_is_named_with_what_to_do() {
        // Only meaningful where NCCL is not installed (this repository's CI).
        let Err(e) = version() else {
            return;
        };
        let m = e.to_string();
        assert!(
            m.contains("libnccl.so.2") && m.contains("PPCC_NCCL_LIB"),
            "{m}"
        );
    }
}
