//! Native stage modules: calling the functions of a `module.so` that `ppcc-codegen` built.
//!
//! The ABI (see `ppcc_codegen::lower`, symbol names from [`ppir::abi`]): per function `f`
//! the shared object exports
//! `void ppcc_call_f(void *ctx, void **descriptors)` — one pointer per input, then one per
//! output, each to a ranked memref descriptor `{T *allocated, T *aligned, i64 offset,
//! i64 sizes[r], i64 strides[r]}` of a dense row-major buffer the caller owns — and
//! `const char *ppcc_sig_f(void)`, the types it was compiled for (`f32[4,8] i64[4] ->
//! f32[]`), which [`NativeModule::load`] compares with the IR it is given so a `.so` that
//! does not belong to that IR is refused instead of called with the wrong buffers.
//!
//! `ctx` points at [`Ctx`]: the send and receive callbacks that the generated code calls for
//! `send`/`recv` ops. They forward to the caller's [`Comm`] (the pipeline's transport).
//! A failure there is recorded, later callbacks of the same call do nothing, and the call
//! returns the first failure once the generated code returns.
//!
//! Tensors are converted to the element type's native representation for the call and
//! back (ppir keeps floats as f64, integers and bools as i64).

use std::collections::HashMap;
use std::ffi::{c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use ppir::interp::{Comm, CommError};
use ppir::ops::attrs::CommAttrs;
use ppir::ops::OpAttrs;

use crate::pipeline::{ArgValue, PipelineError, Value};
use ppir::{DType, Function, Module, OpKind, Tensor, TensorData, TensorType};

/// What went wrong loading or calling a native module.
#[derive(Debug, Clone, thiserror::Error)]
pub enum NativeError {
    #[error("loading {path}: {message}")]
    Load { path: PathBuf, message: String },
    #[error("{path}: @{function}: {message}")]
    Mismatch {
        path: PathBuf,
        function: String,
        message: String,
    },
    #[error("@{function}: {message}")]
    Call { function: String, message: String },
    /// A tensor argument of another type than the function takes.
    #[error("@{function}: argument {index} is {got}, the function takes {expected}")]
    Argument {
        function: String,
        index: usize,
        got: String,
        expected: String,
    },
    /// A send or receive of the generated code failed.
    #[error("@{function}: {source}")]
    Callback {
        function: String,
        source: CallbackError,
    },
    /// A CUDA module's buffers or device failed.
    #[error("@{function}: {source}")]
    Gpu {
        function: String,
        source: crate::gpu::GpuError,
    },
    /// A value of the function is too large to count, or to fit in memory: the call would
    /// abort in the allocator (an output buffer) or crash (a failed allocation in the
    /// generated code).
    #[error("{0}")]
    TooLarge(ppir::SizeError),
}

impl NativeError {
    /// The communicator's error, when a send or receive of the call failed there.
    pub fn comm_error(&self) -> Option<&CommError> {
        match self {
            NativeError::Callback {
                source: CallbackError::Comm(e),
                ..
            } => Some(e),
            _ => None,
        }
    }
}

/// Why a send or receive callback of the generated code failed. `peer` and `channel` are
/// the op's attributes as the generated code passes them.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallbackError {
    #[error(transparent)]
    Comm(#[from] CommError),
    /// The function has no send op with these attributes (the code does not match the IR).
    #[error("no send op to stage {peer} on channel {channel}")]
    NoSend { peer: i64, channel: i64 },
    #[error("no recv op from stage {peer} on channel {channel}")]
    NoRecv { peer: i64, channel: i64 },
    #[error("recv of a non-static type")]
    DynamicRecv { peer: i64, channel: i64 },
    #[error("the function {}, but no transport was given", if *.sending { "sends" } else { "receives" })]
    NoTransport { sending: bool },
    #[error(
        "no collective op (all_reduce, reduce_scatter, shard, all_gather) on channel {channel}"
    )]
    NoAllReduce { channel: i64 },
    #[error("panic in a send/recv callback")]
    Panic,
}

type Entry = unsafe extern "C" fn(*mut Ctx, *const *mut c_void);
type SigFn = unsafe extern "C" fn() -> *const std::ffi::c_char;
type Callback = extern "C" fn(*mut Ctx, i64, i64, *mut u8) -> i32;
type ReduceCallback = extern "C" fn(*mut Ctx, i64, *mut u8, *mut u8) -> i32;

/// The static type of one argument or result.
#[derive(Clone, Debug, PartialEq)]
struct Static {
    dtype: DType,
    shape: Vec<usize>,
}

impl Static {
    fn of(ty: &TensorType) -> Option<Static> {
        Some(Static {
            dtype: ty.dtype,
            shape: ty.static_shape()?.into_iter().map(|d| d as usize).collect(),
        })
    }

    fn len(&self) -> usize {
        self.shape.iter().product()
    }

    fn text(&self) -> String {
        let dims: Vec<String> = self.shape.iter().map(|d| d.to_string()).collect();
        format!("{}[{}]", self.dtype.name(), dims.join(","))
    }
}

/// One function of the module.
struct NativeFn {
    entry: Entry,
    inputs: Vec<Static>,
    outputs: Vec<Static>,
    /// (peer, channel) of each send/recv op → the type moved.
    sends: HashMap<(i64, i64), Static>,
    recvs: HashMap<(i64, i64), TensorType>,
    /// channel of each collective op → the op (its attributes and types).
    reductions: HashMap<i64, Collective>,
}

/// A collective op of a function, found by its channel.
enum Collective {
    /// An `all_reduce` and the type summed.
    AllReduce(ppir::ops::attrs::AllReduceAttrs, Static),
    /// A `reduce_scatter`, `shard` or `all_gather`: its kind, attributes, operand and
    /// result types.
    Sharded(OpKind, ppir::ops::attrs::ShardAttrs, Static, Static),
}

/// A loaded `module.so` and the functions of the IR module it was compiled from.
pub struct NativeModule {
    // Keeps the code mapped; the entries point into it.
    _lib: libloading::Library,
    path: PathBuf,
    funcs: HashMap<String, NativeFn>,
    /// The device of a CUDA module (`--target cuda`): its buffers live there and calls
    /// run with it current.
    gpu: Option<std::sync::Arc<crate::gpu::GpuDevice>>,
}

/// The signature text `ppcc-codegen` compiles into `ppcc_sig_<name>`.
fn signature_text(ins: &[Static], outs: &[Static]) -> String {
    let dims = |s: &Static| s.shape.iter().map(|&d| d as u64).collect::<Vec<u64>>();
    let a: Vec<(DType, Vec<u64>)> = ins.iter().map(|s| (s.dtype, dims(s))).collect();
    let b: Vec<(DType, Vec<u64>)> = outs.iter().map(|s| (s.dtype, dims(s))).collect();
    ppir::abi::signature_text(
        a.iter().map(|(d, s)| (*d, s.as_slice())),
        b.iter().map(|(d, s)| (*d, s.as_slice())),
    )
}

impl NativeModule {
    /// Load `so` and bind every function of `module` (or only `only`, when given) to its
    /// entry, checking each compiled signature against the IR.
    pub fn load(so: &Path, module: &Module, only: Option<&[&str]>) -> Result<Self, NativeError> {
        let load_err = |message: String| NativeError::Load {
            path: so.to_path_buf(),
            message,
        };
        // SAFETY: loading runs the library's initialisers; a module.so built by ppcc has
        // none beyond the C runtime's.
        let lib = unsafe { libloading::Library::new(so) }.map_err(|e| load_err(e.to_string()))?;
        Self::bind_all(lib, so, module, only)
    }

    /// Load a module from `bytes`, the contents of `so` already checked against what the
    /// build directory records ([`crate::integrity`]). They are copied to a private
    /// temporary file (mode 0600 in a fresh 0700 directory with an unpredictable name,
    /// removed once loaded) and loaded from there: what runs is exactly what was checked,
    /// and nothing that later truncates or rewrites `so` (a recompile into the same
    /// directory) can pull pages from under the mapping (SIGBUS). Errors name `so`.
    pub fn load_verified(
        so: &Path,
        bytes: &[u8],
        module: &Module,
        only: Option<&[&str]>,
    ) -> Result<Self, NativeError> {
        use std::io::Write;
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let load_err = |message: String| NativeError::Load {
            path: so.to_path_buf(),
            message,
        };
        let tmp = tempfile::Builder::new()
            .prefix("ppcc-load-")
            .permissions(std::fs::Permissions::from_mode(0o700))
            .tempdir()
            .map_err(|e| {
                load_err(format!(
                    "cannot create a private directory in {} to load it from: {e}",
                    std::env::temp_dir().display()
                ))
            })?;
        let copy = tmp.path().join("module.so");
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&copy)
            .and_then(|mut f| f.write_all(bytes))
            .map_err(|e| load_err(format!("cannot copy it to {}: {e}", copy.display())))?;
        // SAFETY: as in `load`; the bytes are those ppcc recorded when it built the module.
        let lib = unsafe { libloading::Library::new(&copy) }.map_err(|e| {
            load_err(format!(
                "{e} (loaded from a private copy in {}; set TMPDIR to a directory that allows executable mappings if it does not)",
                std::env::temp_dir().display()
            ))
        })?;
        // The mapping outlives the file; its unique name is never reused by the loader.
        drop(tmp);
        Self::bind_all(lib, so, module, only)
    }

    fn bind_all(
        lib: libloading::Library,
        so: &Path,
        module: &Module,
        only: Option<&[&str]>,
    ) -> Result<Self, NativeError> {
        let mut funcs = HashMap::new();
        for f in &module.functions {
            if only.is_some_and(|o| !o.contains(&f.name.as_str())) {
                continue;
            }
            let nf = bind(&lib, so, f)?;
            funcs.insert(f.name.clone(), nf);
        }
        let gpu = attach_gpu(&lib, so)?;
        Ok(NativeModule {
            _lib: lib,
            path: so.to_path_buf(),
            funcs,
            gpu,
        })
    }

    /// The CUDA device a CUDA module runs on; `None` for a CPU module.
    pub fn gpu(&self) -> Option<&std::sync::Arc<crate::gpu::GpuDevice>> {
        self.gpu.as_ref()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Seconds spent in each op (by op id, `0..n`) since the last take, for a module built
    /// with `profile_ops` (all zeros without it); the counters restart at zero. `None` when
    /// the library has no profiling support. Not meant for concurrent calls.
    pub fn take_op_profile(&self, n: usize) -> Option<Vec<f64>> {
        type Take = unsafe extern "C" fn(*mut i64, i64);
        // SAFETY: `ppcc_prof_take(int64_t *out, int64_t n)` from support.c writes n values.
        let take = unsafe { self._lib.get::<Take>(b"ppcc_prof_take\0") }.ok()?;
        let mut ns = vec![0i64; n];
        // SAFETY: `ns` has room for n values.
        unsafe { take(ns.as_mut_ptr(), n as i64) };
        Some(ns.into_iter().map(|x| x as f64 * 1e-9).collect())
    }

    /// The most bytes of the generated code's temporaries live at once on this thread
    /// since the last take (the count restarts from what is live now); `None` for a
    /// library without the counting allocator (CUDA modules, older builds).
    pub fn take_temporary_peak(&self) -> Option<u64> {
        if self.gpu.is_some() {
            return None;
        }
        type Take = unsafe extern "C" fn() -> u64;
        // SAFETY: `uint64_t ppcc_tmp_take_peak(void)` from support.c reads and resets
        // thread-local counters.
        let take = unsafe { self._lib.get::<Take>(b"ppcc_tmp_take_peak\0") }.ok()?;
        // SAFETY: no arguments; thread-local state only.
        Some(unsafe { take() })
    }

    pub fn has_function(&self, name: &str) -> bool {
        self.funcs.contains_key(name)
    }

    /// Call `function` with `args` (in the function's argument order); send/recv ops go
    /// through `comm` (an error if the function has some and `comm` is `None`).
    pub fn call<'c>(
        &self,
        function: &str,
        args: &[&Tensor],
        comm: Option<&'c mut (dyn Comm + 'c)>,
    ) -> Result<Vec<Tensor>, NativeError> {
        let args: Vec<Arg> = args.iter().map(|&t| Arg::Tensor(t)).collect();
        self.call_with(function, &args, comm)
    }

    fn function(&self, function: &str) -> Result<&NativeFn, NativeError> {
        self.funcs
            .get(function)
            .ok_or_else(|| call_error(function, "the module has no such function".into()))
    }

    /// Convert `t` once into the native layout of argument `index` of `function`, for
    /// [`NativeModule::call_with`] calls that pass the same value many times (weights).
    pub fn prepare(
        &self,
        function: &str,
        index: usize,
        t: &Tensor,
    ) -> Result<NativeArg, NativeError> {
        let call_err = |message: String| call_error(function, message);
        let f = self.function(function)?;
        let want = f.inputs.get(index).ok_or_else(|| {
            call_err(format!(
                "no argument {index}: the function takes {}",
                f.inputs.len()
            ))
        })?;
        check_arg(function, index, t, want)?;
        Ok(NativeArg {
            buf: Buffer::from_tensor_on(self.gpu.as_ref(), t)
                .map_err(|e| gpu_error(function, e))?,
            ty: want.clone(),
        })
    }

    /// [`NativeModule::call`] with arguments that are tensors or prepared native buffers.
    pub fn call_with<'c>(
        &self,
        function: &str,
        args: &[Arg],
        comm: Option<&'c mut (dyn Comm + 'c)>,
    ) -> Result<Vec<Tensor>, NativeError> {
        Ok(self
            .call_native(function, args, comm)?
            .into_iter()
            .map(|r| r.to_tensor_value())
            .collect())
    }

    /// [`NativeModule::call_with`] returning the results in their native buffers (pass
    /// them back as [`Arg::Native`] without converting them).
    pub fn call_native<'c>(
        &self,
        function: &str,
        args: &[Arg],
        comm: Option<&'c mut (dyn Comm + 'c)>,
    ) -> Result<Vec<NativeArg>, NativeError> {
        let call_err = |message: String| call_error(function, message);
        let f = self.function(function)?;
        if args.len() != f.inputs.len() {
            return Err(call_err(format!(
                "{} arguments given, the function takes {}",
                args.len(),
                f.inputs.len()
            )));
        }
        // Converted tensors (owned here) and the data pointer of every argument.
        let mut owned: Vec<Buffer> = Vec::with_capacity(f.inputs.len());
        let mut in_ptrs: Vec<*mut u8> = Vec::with_capacity(f.inputs.len());
        for (i, (a, want)) in args.iter().zip(&f.inputs).enumerate() {
            match a {
                Arg::Tensor(t) => {
                    check_arg(function, i, t, want)?;
                    // The buffer's heap block does not move when the Vec holding it does.
                    let mut b = Buffer::from_tensor_on(self.gpu.as_ref(), t)
                        .map_err(|e| gpu_error(function, e))?;
                    in_ptrs.push(b.as_mut_ptr());
                    owned.push(b);
                }
                Arg::Native(n) => {
                    if &n.ty != want {
                        return Err(call_err(format!(
                            "argument {i} was prepared as {}, the function takes {}",
                            n.ty.text(),
                            want.text()
                        )));
                    }
                    // The generated code never writes its inputs (they are read-only
                    // buffers to it), so a shared buffer can be passed.
                    in_ptrs.push(n.buf.as_ptr() as *mut u8);
                }
            }
        }
        let mut bufs: Vec<Buffer> = f
            .outputs
            .iter()
            .map(|o| Buffer::zeroed_on(self.gpu.as_ref(), o.dtype, o.len()))
            .collect::<Result<_, _>>()
            .map_err(|e| gpu_error(function, e))?;
        // A CUDA module's kernels and allocations use the device current on this thread.
        let entered = match &self.gpu {
            Some(g) => Some(g.enter().map_err(|e| gpu_error(function, e))?),
            None => None,
        };
        let ptrs_all: Vec<*mut u8> = in_ptrs
            .into_iter()
            .chain(bufs.iter_mut().map(|b| b.as_mut_ptr()))
            .collect();
        let shapes: Vec<&[usize]> = f
            .inputs
            .iter()
            .chain(&f.outputs)
            .map(|s| s.shape.as_slice())
            .collect();
        let mut descs: Vec<Vec<i64>> = ptrs_all
            .iter()
            .zip(&shapes)
            .map(|(&p, s)| descriptor(p, s))
            .collect();
        let ptrs: Vec<*mut c_void> = descs
            .iter_mut()
            .map(|d| d.as_mut_ptr() as *mut c_void)
            .collect();
        let mut state = CallState {
            comm,
            f,
            error: None,
        };
        let mut ctx = Ctx {
            send: send_cb,
            recv: recv_cb,
            all_reduce: all_reduce_cb,
            state: &mut state as *mut CallState as *mut c_void,
        };
        // SAFETY: the entry was compiled for exactly these descriptors (checked at load
        // through `ppcc_sig_*` and above against the argument types); every buffer is
        // alive and of the right size for the duration of the call; outputs are written
        // only through their descriptors.
        unsafe { (f.entry)(&mut ctx, ptrs.as_ptr()) };
        drop(descs);
        drop(owned);
        if let Some(g) = &self.gpu {
            let gpu_error =
                crate::gpu::take_error().or_else(|| g.synchronize().err().map(|e| e.to_string()));
            drop(entered);
            if let Some(e) = gpu_error {
                return Err(call_err(format!(
                    "on CUDA device {} ({}): {e}",
                    g.ordinal, g.name
                )));
            }
        }
        if let Some(source) = state.error {
            return Err(NativeError::Callback {
                function: function.to_string(),
                source,
            });
        }
        Ok(bufs
            .into_iter()
            .zip(&f.outputs)
            .map(|(buf, o)| NativeArg { buf, ty: o.clone() })
            .collect())
    }
}

/// A CUDA module exports `ppcc_gpu_set_api` (`codegen/src/gpu_shim.c`): give it the
/// runtime's GPU table and the next device. A CPU module has no such symbol.
fn attach_gpu(
    lib: &libloading::Library,
    so: &Path,
) -> Result<Option<std::sync::Arc<crate::gpu::GpuDevice>>, NativeError> {
    type SetApi = unsafe extern "C" fn(*const crate::gpu::GpuApi) -> i32;
    // SAFETY: the symbol, when present, has this signature (gpu_shim.c).
    let set: libloading::Symbol<SetApi> = match unsafe { lib.get(b"ppcc_gpu_set_api\0") } {
        Ok(f) => f,
        Err(_) => return Ok(None),
    };
    let load_err = |message: String| NativeError::Load {
        path: so.to_path_buf(),
        message,
    };
    let device = crate::gpu::device_for_module().map_err(|e| load_err(e.to_string()))?;
    // SAFETY: `API` is a static of the layout the shim expects (checked by its version).
    if unsafe { set(&crate::gpu::API) } != 0 {
        return Err(load_err(format!(
            "the module's GPU runtime interface is not version {} (built by another ppcc?)",
            crate::gpu::GPU_API_VERSION
        )));
    }
    Ok(Some(device))
}

fn gpu_error(function: &str, source: crate::gpu::GpuError) -> NativeError {
    NativeError::Gpu {
        function: function.to_string(),
        source,
    }
}

fn call_error(function: &str, message: String) -> NativeError {
    NativeError::Call {
        function: function.to_string(),
        message,
    }
}

/// An argument of [`NativeModule::call_with`].
pub enum Arg<'a> {
    /// Converted for this call.
    Tensor(&'a Tensor),
    /// Converted once by [`NativeModule::prepare`].
    Native(&'a NativeArg),
}

/// A tensor in a function argument's native layout ([`NativeModule::prepare`]), or a result
/// left in its native buffer ([`NativeModule::call_native`]).
pub struct NativeArg {
    buf: Buffer,
    ty: Static,
}

impl NativeArg {
    /// The value as a ppir tensor.
    pub fn to_tensor_value(&self) -> Tensor {
        Buffer::decode(self.buf.bytes(), &self.ty)
    }
}

impl crate::pipeline::DeviceValue for NativeArg {
    fn bytes(&self) -> u64 {
        self.buf.len_bytes() as u64
    }

    fn to_tensor(&self) -> Tensor {
        self.to_tensor_value()
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn add_assign(&mut self, other: &dyn crate::pipeline::DeviceValue) -> bool {
        let Some(o) = other.as_any().downcast_ref::<NativeArg>() else {
            return false;
        };
        if o.ty != self.ty {
            return false;
        }
        let n = self.ty.len();
        // f32 and f64 additions are correctly rounded: the same bits as the host's f64 sum
        // rounded to the dtype. (Half types would round twice through f32: not here.)
        match self.ty.dtype {
            DType::F32 => {
                // SAFETY: both buffers are 64-byte aligned and hold n f32 values.
                let (_, a, _) = unsafe { self.buf.bytes_mut().align_to_mut::<f32>() };
                let (_, b, _) = unsafe { o.buf.bytes().align_to::<f32>() };
                for (x, &y) in a[..n].iter_mut().zip(&b[..n]) {
                    *x += y;
                }
                true
            }
            DType::F64 => {
                // SAFETY: as above, with f64 values.
                let (_, a, _) = unsafe { self.buf.bytes_mut().align_to_mut::<f64>() };
                let (_, b, _) = unsafe { o.buf.bytes().align_to::<f64>() };
                for (x, &y) in a[..n].iter_mut().zip(&b[..n]) {
                    *x += y;
                }
                true
            }
            _ => false,
        }
    }
}

fn check_arg(function: &str, i: usize, t: &Tensor, want: &Static) -> Result<(), NativeError> {
    if t.dtype != want.dtype || t.shape != want.shape {
        return Err(NativeError::Argument {
            function: function.to_string(),
            index: i,
            got: format!("{}{:?}", t.dtype.name(), t.shape),
            expected: want.text(),
        });
    }
    Ok(())
}

fn bind(lib: &libloading::Library, so: &Path, f: &Function) -> Result<NativeFn, NativeError> {
    let mismatch = |message: String| NativeError::Mismatch {
        path: so.to_path_buf(),
        function: f.name.clone(),
        message,
    };
    let stat = |ty: &TensorType| {
        ty.check_size().map_err(NativeError::TooLarge)?;
        Static::of(ty).ok_or_else(|| mismatch(format!("type {ty} is not static")))
    };
    // Every buffer, the caller's and the generated code's, in the dtype's size.
    ppir::size::check_function_memory(f, |t| t.size_bytes().unwrap_or(0))
        .map_err(NativeError::TooLarge)?;
    let inputs = f
        .arg_values()
        .map(|v| stat(f.ty(v)))
        .collect::<Result<Vec<_>, _>>()?;
    let outputs = f
        .results()
        .iter()
        .map(|&v| stat(f.ty(v)))
        .collect::<Result<Vec<_>, _>>()?;
    // SAFETY: symbols are looked up by name and have the ABI's types (checked through
    // the signature text before the entry is ever called).
    let (entry, sig) = unsafe {
        let entry: libloading::Symbol<Entry> = lib
            .get(format!("{}\0", ppir::abi::entry_symbol(&f.name)).as_bytes())
            .map_err(|e| mismatch(format!("no entry: {e}")))?;
        let sig: libloading::Symbol<SigFn> = lib
            .get(format!("{}\0", ppir::abi::signature_symbol(&f.name)).as_bytes())
            .map_err(|e| mismatch(format!("no signature: {e}")))?;
        (*entry, CStr::from_ptr(sig()).to_string_lossy().into_owned())
    };
    let expected = signature_text(&inputs, &outputs);
    if sig != expected {
        return Err(mismatch(format!(
            "compiled for `{sig}`, but the IR has `{expected}` (rebuild the module)"
        )));
    }
    let mut sends = HashMap::new();
    let mut recvs = HashMap::new();
    let mut reductions = HashMap::new();
    for &id in f.ops() {
        let op = f.op(id);
        let key = |op: &ppir::OpData| -> Option<(i64, i64)> {
            let CommAttrs { peer, channel } = CommAttrs::of(&op.attrs).ok()?;
            Some((peer, channel))
        };
        match op.kind {
            OpKind::Send => {
                if let (Some(k), Some(s)) = (key(op), Static::of(f.ty(op.operands()[0]))) {
                    sends.insert(k, s);
                }
            }
            OpKind::Recv => {
                if let Some(k) = key(op) {
                    recvs.insert(k, f.ty(op.results()[0]).clone());
                }
            }
            OpKind::AllReduce => {
                let a = ppir::ops::attrs::AllReduceAttrs::of(&op.attrs).ok();
                if let (Some(a), Some(s)) = (a, Static::of(f.ty(op.operands()[0]))) {
                    reductions.insert(a.channel, Collective::AllReduce(a, s));
                }
            }
            OpKind::ReduceScatter | OpKind::Shard | OpKind::AllGather => {
                let a = ppir::ops::attrs::ShardAttrs::of(&op.attrs).ok();
                let x = Static::of(f.ty(op.operands()[0]));
                let y = Static::of(f.ty(op.results()[0]));
                if let (Some(a), Some(x), Some(y)) = (a, x, y) {
                    reductions.insert(a.channel, Collective::Sharded(op.kind, a, x, y));
                }
            }
            _ => {}
        }
    }
    Ok(NativeFn {
        entry,
        inputs,
        outputs,
        sends,
        recvs,
        reductions,
    })
}

/// `t` in its native byte layout (what a stage function reads), for transports that move
/// bytes.
pub(crate) fn tensor_bytes(t: &Tensor) -> Vec<u8> {
    Buffer::from_tensor(t).bytes().to_vec()
}

/// The tensor of `dtype` and `shape` whose native bytes are `bytes`; `None` when the
/// length does not match.
pub(crate) fn tensor_from_bytes(bytes: &[u8], dtype: DType, shape: &[usize]) -> Option<Tensor> {
    let ty = Static {
        dtype,
        shape: shape.to_vec(),
    };
    (ty.len().checked_mul(dtype.size_bytes())? == bytes.len()).then(|| Buffer::decode(bytes, &ty))
}

/// The context the generated code receives (layout: `ppcc_codegen::lower::CTX_LAYOUT`,
/// followed by our state).
#[repr(C)]
pub struct Ctx {
    send: Callback,
    recv: Callback,
    all_reduce: ReduceCallback,
    state: *mut c_void,
}

struct CallState<'a, 'c> {
    comm: Option<&'c mut (dyn Comm + 'c)>,
    f: &'a NativeFn,
    error: Option<CallbackError>,
}

/// Run `body` on the call's state unless an earlier callback failed; record its error.
fn with_state(
    ctx: *mut Ctx,
    body: impl FnOnce(&mut CallState) -> Result<(), CallbackError>,
) -> i32 {
    // SAFETY: the generated code passes back the `ctx` it was called with, which points at
    // a live `Ctx` whose state is a live `CallState` for the whole call.
    let state = unsafe { &mut *((*ctx).state as *mut CallState) };
    if state.error.is_some() {
        return 1;
    }
    let r =
        catch_unwind(AssertUnwindSafe(|| body(&mut *state))).unwrap_or(Err(CallbackError::Panic));
    match r {
        Ok(()) => 0,
        Err(e) => {
            state.error = Some(e);
            1
        }
    }
}

extern "C" fn send_cb(ctx: *mut Ctx, peer: i64, channel: i64, data: *mut u8) -> i32 {
    with_state(ctx, |s| {
        let ty =
            s.f.sends
                .get(&(peer, channel))
                .ok_or(CallbackError::NoSend { peer, channel })?;
        let comm = s
            .comm
            .as_deref_mut()
            .ok_or(CallbackError::NoTransport { sending: true })?;
        let n = ty.len() * ty.dtype.size_bytes();
        // SAFETY: `data` is the dense buffer of the send's operand, of type `ty` (`n`
        // bytes), which the generated code does not touch during the call.
        let bytes = unsafe { std::slice::from_raw_parts(data as *const u8, n) };
        if let Some(r) = comm.send_bytes(peer as u32, channel, ty.dtype, &ty.shape, bytes) {
            return Ok(r?);
        }
        // SAFETY: as above.
        let t = unsafe { Buffer::read_raw(data, ty) };
        Ok(comm.send(peer as u32, channel, t)?)
    })
}

extern "C" fn recv_cb(ctx: *mut Ctx, peer: i64, channel: i64, data: *mut u8) -> i32 {
    with_state(ctx, |s| {
        let ty =
            s.f.recvs
                .get(&(peer, channel))
                .ok_or(CallbackError::NoRecv { peer, channel })?;
        let want = Static::of(ty).ok_or(CallbackError::DynamicRecv { peer, channel })?;
        let comm = s
            .comm
            .as_deref_mut()
            .ok_or(CallbackError::NoTransport { sending: false })?;
        let n = want.len() * want.dtype.size_bytes();
        {
            // SAFETY: `data` is a fresh buffer of `want`'s size in bytes, which the
            // generated code does not touch during the call.
            let out = unsafe { std::slice::from_raw_parts_mut(data, n) };
            if let Some(r) = comm.recv_bytes(peer as u32, channel, ty, out) {
                return Ok(r?);
            }
        }
        let t = comm.recv(peer as u32, channel, ty)?;
        if t.dtype != want.dtype || t.shape != want.shape {
            return Err(CommError::Mismatch {
                peer: peer as u32,
                channel,
                got: format!("{}{:?}", t.dtype.name(), t.shape),
                expected: want.text(),
            }
            .into());
        }
        let b = Buffer::from_tensor(&t);
        // SAFETY: `data` is a fresh buffer of `want`'s size in bytes.
        unsafe { std::ptr::copy_nonoverlapping(b.bytes().as_ptr(), data, b.len_bytes()) };
        Ok(())
    })
}

extern "C" fn all_reduce_cb(ctx: *mut Ctx, channel: i64, data: *mut u8, out: *mut u8) -> i32 {
    with_state(ctx, |s| {
        let op =
            s.f.reductions
                .get(&channel)
                .ok_or(CallbackError::NoAllReduce { channel })?;
        let comm = s
            .comm
            .as_deref_mut()
            .ok_or(CallbackError::NoTransport { sending: true })?;
        let (r, ty, peer) = match op {
            Collective::AllReduce(a, ty) => {
                // SAFETY: `data` is the dense buffer of the op's operand, of type `ty`.
                let t = unsafe { Buffer::read_raw(data, ty) };
                (
                    comm.all_reduce(a, t)?,
                    ty,
                    a.stages.first().map_or(0, |&s| s as u32),
                )
            }
            Collective::Sharded(kind, a, x, y) => {
                // SAFETY: `data` is the dense buffer of the op's operand, of type `x`.
                let t = unsafe { Buffer::read_raw(data, x) };
                (comm.sharded(*kind, a, t)?, y, 0)
            }
        };
        if r.dtype != ty.dtype || r.shape != ty.shape {
            return Err(CommError::Mismatch {
                peer,
                channel,
                got: format!("{}{:?}", r.dtype.name(), r.shape),
                expected: ty.text(),
            }
            .into());
        }
        let b = Buffer::from_tensor(&r);
        // SAFETY: `out` is a fresh buffer of `ty`'s size in bytes.
        unsafe { std::ptr::copy_nonoverlapping(b.bytes().as_ptr(), out, b.len_bytes()) };
        Ok(())
    })
}

/// A ranked memref descriptor as i64 words: `{allocated, aligned, offset, sizes, strides}`.
fn descriptor(p: *mut u8, shape: &[usize]) -> Vec<i64> {
    let p = p as i64;
    let mut d = vec![p, p, 0];
    d.extend(shape.iter().map(|&s| s as i64));
    let mut strides = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1] as i64;
    }
    d.extend(strides);
    d
}

/// A dense buffer of one element type, 64-byte aligned: host memory for CPU modules,
/// managed memory on the module's device for CUDA modules (the device reads and writes it
/// in place; the host can still address it).
struct Buffer {
    storage: Storage,
    dtype: DType,
    len: usize,
}

enum Storage {
    Host(Vec<Aligned>),
    Device(crate::gpu::DeviceBuffer),
}

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Aligned([u8; 64]);

impl Buffer {
    fn zeroed(dtype: DType, len: usize) -> Buffer {
        let bytes = (len * dtype.size_bytes()).max(1);
        Buffer {
            storage: Storage::Host(vec![Aligned([0; 64]); bytes.div_ceil(64)]),
            dtype,
            len,
        }
    }

    /// [`Buffer::zeroed`] on `gpu` when given (a CUDA module's buffers), else on the host.
    fn zeroed_on(
        gpu: Option<&std::sync::Arc<crate::gpu::GpuDevice>>,
        dtype: DType,
        len: usize,
    ) -> Result<Buffer, crate::gpu::GpuError> {
        let Some(g) = gpu else {
            return Ok(Buffer::zeroed(dtype, len));
        };
        let d = crate::gpu::DeviceBuffer::zeroed(g, len * dtype.size_bytes())?;
        Ok(Buffer {
            storage: Storage::Device(d),
            dtype,
            len,
        })
    }

    fn len_bytes(&self) -> usize {
        self.len * self.dtype.size_bytes()
    }

    fn as_ptr(&self) -> *const u8 {
        match &self.storage {
            Storage::Host(w) => w.as_ptr() as *const u8,
            Storage::Device(d) => d.as_ptr(),
        }
    }

    fn as_mut_ptr(&mut self) -> *mut u8 {
        match &mut self.storage {
            Storage::Host(w) => w.as_mut_ptr() as *mut u8,
            Storage::Device(d) => d.as_ptr(),
        }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: the storage holds at least `len_bytes` initialised bytes (device buffers
        // are zeroed when allocated and addressable from the host).
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len_bytes()) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        let n = self.len_bytes();
        // SAFETY: as `bytes`, uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.as_mut_ptr(), n) }
    }

    fn from_tensor(t: &Tensor) -> Buffer {
        Buffer::from_tensor_on(None, t).unwrap_or_else(|_| Buffer::zeroed(t.dtype, 0))
    }

    /// The tensor in its native layout, on `gpu` when given.
    fn from_tensor_on(
        gpu: Option<&std::sync::Arc<crate::gpu::GpuDevice>>,
        t: &Tensor,
    ) -> Result<Buffer, crate::gpu::GpuError> {
        let mut b = Buffer::zeroed_on(gpu, t.dtype, t.data.len())?;
        let out = b.bytes_mut();
        match (&t.data, t.dtype) {
            (TensorData::Float(v), DType::F32) => {
                // SAFETY: the buffer is 64-byte aligned and any bytes are a valid f32.
                let (_, floats, _) = unsafe { out.align_to_mut::<f32>() };
                for (o, &x) in floats.iter_mut().zip(v) {
                    *o = x as f32;
                }
            }
            (TensorData::Float(v), DType::F64) => {
                for (c, x) in out.chunks_exact_mut(8).zip(v) {
                    c.copy_from_slice(&x.to_ne_bytes());
                }
            }
            (TensorData::Float(v), DType::F16) => {
                for (c, x) in out.chunks_exact_mut(2).zip(v) {
                    c.copy_from_slice(&half::f16::from_f64(*x).to_bits().to_ne_bytes());
                }
            }
            (TensorData::Float(v), DType::BF16) => {
                for (c, x) in out.chunks_exact_mut(2).zip(v) {
                    c.copy_from_slice(&half::bf16::from_f64(*x).to_bits().to_ne_bytes());
                }
            }
            (TensorData::Int(v), DType::I64) => {
                for (c, x) in out.chunks_exact_mut(8).zip(v) {
                    c.copy_from_slice(&x.to_ne_bytes());
                }
            }
            (TensorData::Int(v), DType::I32) => {
                for (c, x) in out.chunks_exact_mut(4).zip(v) {
                    c.copy_from_slice(&(*x as i32).to_ne_bytes());
                }
            }
            (TensorData::Int(v), DType::I8 | DType::Bool) => {
                for (c, x) in out.iter_mut().zip(v) {
                    *c = *x as i8 as u8;
                }
            }
            // A tensor whose storage disagrees with its dtype (not made by ppir): zeros.
            _ => {}
        }
        Ok(b)
    }

    /// # Safety
    /// `data` must point at a dense buffer of `ty`.
    unsafe fn read_raw(data: *const u8, ty: &Static) -> Tensor {
        let n = ty.len() * ty.dtype.size_bytes();
        let bytes = unsafe { std::slice::from_raw_parts(data, n) };
        Self::decode(bytes, ty)
    }

    fn decode(bytes: &[u8], ty: &Static) -> Tensor {
        let shape = ty.shape.clone();
        let data = match ty.dtype {
            DType::F32 => {
                // SAFETY: every bit pattern is a valid f32; `align_to` splits off any
                // unaligned ends, which the byte-wise path below handles.
                let (head, floats, tail) = unsafe { bytes.align_to::<f32>() };
                if head.is_empty() && tail.is_empty() {
                    // A plain widening loop (vectorised), the bulk of every call's results.
                    TensorData::Float(floats.iter().map(|&x| x as f64).collect())
                } else {
                    TensorData::Float(
                        bytes
                            .chunks_exact(4)
                            .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]) as f64)
                            .collect(),
                    )
                }
            }
            DType::F64 => TensorData::Float(
                bytes
                    .chunks_exact(8)
                    .map(|c| f64::from_ne_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            DType::F16 => TensorData::Float(
                bytes
                    .chunks_exact(2)
                    .map(|c| half::f16::from_bits(u16::from_ne_bytes([c[0], c[1]])).to_f64())
                    .collect(),
            ),
            DType::BF16 => TensorData::Float(
                bytes
                    .chunks_exact(2)
                    .map(|c| half::bf16::from_bits(u16::from_ne_bytes([c[0], c[1]])).to_f64())
                    .collect(),
            ),
            DType::I64 => TensorData::Int(
                bytes
                    .chunks_exact(8)
                    .map(|c| i64::from_ne_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            DType::I32 => TensorData::Int(
                bytes
                    .chunks_exact(4)
                    .map(|c| i32::from_ne_bytes(c.try_into().unwrap()) as i64)
                    .collect(),
            ),
            DType::I8 => TensorData::Int(bytes.iter().map(|&b| b as i8 as i64).collect()),
            DType::Bool => TensorData::Int(bytes.iter().map(|&b| (b & 1) as i64).collect()),
        };
        Tensor {
            dtype: ty.dtype,
            shape,
            data,
        }
    }
}

/// A stage's functions as native code, behind the pipeline's [`crate::pipeline::StageExecutable`]. Weight
/// arguments (`param`/`state`) are converted to native buffers once and reused until the
/// pipeline reports new weights (`weights_changed`).
pub struct NativeStage {
    /// The stage's IR (signatures by name; the code is `native`'s).
    pub module: Module,
    pub native: NativeModule,
    prepared: HashMap<(String, usize), NativeArg>,
}

impl NativeStage {
    pub fn new(module: Module, native: NativeModule) -> Self {
        NativeStage {
            module,
            native,
            prepared: HashMap::new(),
        }
    }
}

impl crate::pipeline::StageExecutable for NativeStage {
    fn signature(&self, function: &str) -> Option<crate::pipeline::Signature> {
        let f = self.module.function(function)?;
        Some(crate::pipeline::signature(f))
    }

    fn call(
        &mut self,
        function: &str,
        args: Vec<ArgValue<'_>>,
        keep: &[bool],
        comm: &mut dyn Comm,
    ) -> Result<Vec<Value>, PipelineError> {
        let f = self
            .module
            .function(function)
            .ok_or_else(|| PipelineError::NoFunction {
                function: function.to_string(),
            })?;
        // Weights: converted once and kept (until `weights_changed`).
        for (i, (&(_, kind), a)) in f.args().iter().zip(&args).enumerate() {
            let key = (function.to_string(), i);
            if let (ppir::ArgKind::Param | ppir::ArgKind::State, ArgValue::Host(t)) = (kind, a) {
                if !self.prepared.contains_key(&key) {
                    let p = self.native.prepare(function, i, t.as_ref())?;
                    self.prepared.insert(key, p);
                }
            }
        }
        // Each argument as the module takes it: a kept native buffer (weights, values this
        // module produced) or a tensor to convert (a device value of another executable,
        // not expected, is converted through the host).
        enum In<'x> {
            Native(&'x NativeArg),
            Borrowed(&'x Tensor),
            Owned(Tensor),
        }
        let ins: Vec<In> = args
            .iter()
            .enumerate()
            .map(|(i, a)| {
                if let Some(p) = self.prepared.get(&(function.to_string(), i)) {
                    return In::Native(p);
                }
                match a {
                    ArgValue::Host(t) => In::Borrowed(t.as_ref()),
                    ArgValue::Device(d) => match d.as_any().downcast_ref::<NativeArg>() {
                        Some(n) => In::Native(n),
                        None => In::Owned(d.to_tensor()),
                    },
                }
            })
            .collect();
        let call_args: Vec<Arg> = ins
            .iter()
            .map(|x| match x {
                In::Native(n) => Arg::Native(n),
                In::Borrowed(t) => Arg::Tensor(t),
                In::Owned(t) => Arg::Tensor(t),
            })
            .collect();
        let outs = self.native.call_native(function, &call_args, Some(comm))?;
        Ok(outs
            .into_iter()
            .enumerate()
            .map(|(i, r)| {
                if keep.get(i).copied().unwrap_or(false) {
                    Value::Device(Box::new(r))
                } else {
                    Value::Host(r.to_tensor_value())
                }
            })
            .collect())
    }

    fn weights_changed(&mut self) {
        self.prepared.clear();
    }

    fn take_temporary_peak(&mut self) -> Option<u64> {
        self.native.take_temporary_peak()
    }

    fn gpu_device(&self) -> Option<std::sync::Arc<crate::gpu::GpuDevice>> {
        self.native.gpu().cloned()
    }

    fn gpu_memory(&self) -> Option<crate::pipeline::GpuMemory> {
        let g = self.native.gpu()?;
        Some(crate::pipeline::GpuMemory {
            device: format!("{} ({})", g.ordinal, g.name),
            peak_bytes: g.memory().1,
            stats: g.stats(),
        })
    }
}

/// Native code as the single-device trainer's [`crate::Executor`].
pub struct NativeExecutor {
    pub native: NativeModule,
}

impl crate::Executor for NativeExecutor {
    fn call(
        &mut self,
        _module: &Module,
        function: &Function,
        args: Vec<Tensor>,
    ) -> Result<Vec<Tensor>, Box<dyn std::error::Error + Send + Sync>> {
        let refs: Vec<&Tensor> = args.iter().collect();
        Ok(self.native.call(&function.name, &refs, None)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_round_trip_every_dtype() {
        for d in DType::ALL {
            let t = if d.is_float() {
                Tensor::from_f64(d, vec![2, 3], vec![0.5, -1.25, 3.0, 0.0, 7.5, -0.125])
            } else {
                Tensor::from_i64(d, vec![2, 3], vec![1, 0, -1, 5, 0, 1])
            };
            let ty = Static {
                dtype: d,
                shape: vec![2, 3],
            };
            assert_eq!(
                Buffer::decode(Buffer::from_tensor(&t).bytes(), &ty),
                t,
                "{d}"
            );
        }
    }

    #[test]
    fn descriptor_is_row_major() {
        let d = descriptor(std::ptr::null_mut(), &[2, 3, 4]);
        assert_eq!(&d[2..], &[0, 2, 3, 4, 12, 4, 1]);
    }

    #[test]
    fn missing_library_is_an_error() {
        let m = Module::new();
        let e = NativeModule::load(Path::new("/nonexistent/module.so"), &m, None)
            .err()
            .unwrap();
        assert!(e.to_string().contains("/nonexistent/module.so"), "{e}");
    }
}
