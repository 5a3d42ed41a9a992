//! The pipelined training loop: one worker per device runs its list of actions.
//!
//! A compiled plan (`ppcc MODEL -o DIR`) holds, per virtual stage, four functions
//! (`fwd`, `bwd_input`, `bwd_weight`, `optim`; see `ppcc_passes::split`) and, per device,
//! the ordered actions of the schedule (`0F1`, `1I0`, `2W3`, `1B2`, ...). A
//! [`RankWorker`] owns the stages of one device and, for each step:
//!
//! - `F` (stage s, micro-batch m): calls `fwd` with the micro-batch's rows of the data
//!   inputs, `rng = [step, m]`, the stage's weights; `loss` is recorded, `new.<state>`
//!   replaces the state at once (as the single-device trainer does), every other result is
//!   kept in m's stash;
//! - `I` calls `bwd_input`, `W` calls `bwd_weight` (then m's stash is freed), `B` calls
//!   both; `grad.<p>` results are summed over micro-batches in micro-batch order (the
//!   first taken as is, then `acc + g` in the parameter's dtype, exactly as `@accumulate`);
//! - send/recv ops inside the functions go through the [`Transport`] with the tag
//!   (channel, micro-batch, step); the schedule's `SEND_*`/`RECV_*` actions are markers;
//! - after its actions, each stage runs `optim` with the summed gradients (which scales
//!   them by 1/M) and replaces every weight it returns as `new.<w>`.
//!
//! Arguments are bound by name: weights for `param`/`state` arguments; for inputs, first
//! the stash of the same micro-batch, then `rng`, then the data arrays, then (for `optim`)
//! the summed `grad.<p>`. The functions run behind [`StageExecutable`]; the interpreter
//! is [`InterpretedStage`], native modules plug in later.
//!
//! [`run_local`] runs one step with one thread per device over [`LocalNet`]; a failure or
//! panic on any device aborts the others (their receives fail at once) and the step
//! returns the first real cause, naming the stage. It waits for the devices with a
//! deadline, never by joining, so a device stuck forever cannot keep the run alive.

mod plan;
#[cfg(test)]
mod tests;

pub use plan::{DataInput, PlanSpec, PlanSpecError, StageSpec, PLAN_TARGETS};
pub use ppir::schedule::{Action, ActionKind};

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use ppir::interp::{eval_op, run_function_stats, Comm, CommError, InterpError, InterpOptions};
use ppir::{ArgKind, Attrs, DType, Function, Module, OpKind, Tensor, TensorType};

use crate::data::slice_rows;
use crate::native::NativeError;
use crate::transport::local::LocalNet;
use crate::transport::{Tag, Transport, TransportError};
use crate::Batch;

/// An error on one device, with the stage and what it was doing.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "{}{error}{}",
    context(*.stage, *.step, *.micro_batch, .function.as_deref()),
    abandoned_note(.abandoned)
)]
pub struct WorkerError {
    pub rank: usize,
    pub stage: Option<u32>,
    pub step: u64,
    pub micro_batch: Option<u32>,
    pub function: Option<String>,
    pub error: Box<PipelineError>,
    /// Devices that did not stop after this failure and were abandoned (named after the
    /// message).
    pub abandoned: Vec<usize>,
}

impl WorkerError {
    /// The error is only the consequence of another device's failure.
    pub fn aborted(&self) -> bool {
        self.error.is_aborted()
    }
}

/// Why a stage's function, or one device's step, failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PipelineError {
    /// A send or receive stopped because another device failed (the transport was
    /// aborted): this device's failure is only the consequence. `peer` is the stage at the
    /// other end.
    #[error("stopped because another device failed: {reason}")]
    Aborted { peer: u32, reason: String },
    /// The interpreter failed in a function (an op, or a send or receive).
    #[error(transparent)]
    Interp(#[from] InterpError),
    /// A native module failed in a function.
    #[error(transparent)]
    Native(#[from] NativeError),
    #[error("the stage has no function @{function}")]
    NoFunction { function: String },
    /// The plan names a function the stage's module lacks.
    #[error("stage {stage}: no function @{function}")]
    StageFunction { stage: u32, function: String },
    #[error("stage {stage}: @{function} needs the weight `{name}`, which the stage's params do not hold")]
    MissingWeight {
        stage: u32,
        function: String,
        name: String,
    },
    #[error("device {rank} has no stage {stage} for action {action}")]
    NoStage {
        rank: usize,
        stage: u32,
        action: Action,
    },
    #[error("action {action} names micro-batch {micro_batch}, but a step has {microbatches} (0..{microbatches})")]
    MicroBatch {
        action: Action,
        micro_batch: u32,
        microbatches: usize,
    },
    #[error("{count} micro-batch(es) still stashed at the end of the step: the schedule misses their weight-gradient actions")]
    Stashed { count: usize },
    /// A data array whose rows are not the step's micro-batches.
    #[error("array `{name}` has shape {shape:?}; expected {rows} rows ({microbatches} micro-batch(es) of {micro_rows})", rows = .micro_rows * .microbatches)]
    BatchRows {
        name: String,
        shape: Vec<usize>,
        microbatches: usize,
        micro_rows: usize,
    },
    #[error("no value for argument %{name} (not stashed, not a weight, not in the data)")]
    NoValue { name: String },
    /// [`time_actions`] has no value for an argument.
    #[error("@{function}: no value for %{name}")]
    NoTimingValue { function: String, name: String },
    #[error("accumulating grad.{param}: {source}")]
    Accumulate {
        param: String,
        source: Box<InterpError>,
    },
    /// Summing a weight gradient over its holders failed.
    #[error("all-reduce of grad.{param} (channel {channel}): {message}")]
    Collective {
        channel: i64,
        param: String,
        message: String,
    },
    #[error("device {rank} panicked: {message}")]
    Panicked { rank: usize, message: String },
    #[error("cannot start the thread of device {rank}: {message}")]
    Spawn { rank: usize, message: String },
    /// The device did not finish the step long after the others had.
    #[error(
        "still running {:.1} s after the other devices finished the step (--recv-timeout); {}",
        .waited.as_secs_f64(),
        stuck_note(.abandoned)
    )]
    Stuck {
        waited: Duration,
        abandoned: Vec<usize>,
    },
}

impl PipelineError {
    /// The communicator's error under this one, when a send or receive failed.
    pub fn comm_error(&self) -> Option<&CommError> {
        match self {
            PipelineError::Interp(e) => e.comm_error(),
            PipelineError::Native(e) => e.comm_error(),
            _ => None,
        }
    }

    /// Whether this device only stopped because another one failed.
    pub fn is_aborted(&self) -> bool {
        matches!(self, PipelineError::Aborted { .. })
            || self.comm_error().is_some_and(CommError::is_aborted)
    }

    /// [`PipelineError::Aborted`] when a send or receive of the failed call was aborted
    /// (whatever the executable wrapped it in), else the error itself.
    fn classify(self) -> Self {
        match self.comm_error() {
            Some(CommError::Aborted { peer, reason }) => PipelineError::Aborted {
                peer: *peer,
                reason: reason.clone(),
            },
            _ => self,
        }
    }
}

/// `devices 2, 3 did not stop and were abandoned`.
fn stuck_note(stuck: &[usize]) -> String {
    let list: Vec<String> = stuck.iter().map(|r| r.to_string()).collect();
    format!(
        "device{} {} did not stop and {} abandoned",
        if stuck.len() > 1 { "s" } else { "" },
        list.join(", "),
        if stuck.len() > 1 { "were" } else { "was" }
    )
}

/// ` (devices ... abandoned)` after a failure, nothing when no device was abandoned.
fn abandoned_note(stuck: &[usize]) -> String {
    if stuck.is_empty() {
        String::new()
    } else {
        format!(" ({})", stuck_note(stuck))
    }
}

fn context(stage: Option<u32>, step: u64, mb: Option<u32>, function: Option<&str>) -> String {
    let mut s = String::new();
    if let Some(st) = stage {
        s.push_str(&format!("stage {st}, "));
    }
    s.push_str(&format!("step {step}"));
    if let Some(m) = mb {
        s.push_str(&format!(", micro-batch {m}"));
    }
    if let Some(f) = function {
        s.push_str(&format!(", @{f}"));
    }
    s.push_str(": ");
    s
}

/// A function's arguments (name, kind, type) and result names.
pub type Signature = (Vec<(String, ArgKind, TensorType)>, Vec<String>);

/// A value in an executable's own representation (a native module's f32 buffer), kept by
/// the worker between two functions of the same stage so it is not converted to a host
/// [`Tensor`] and back.
pub trait DeviceValue: Send {
    /// Bytes it occupies.
    fn bytes(&self) -> u64;
    /// The value as a host tensor.
    fn to_tensor(&self) -> Tensor;
    fn as_any(&self) -> &dyn std::any::Any;
    /// `self = self + other` in the value's dtype, exactly as the host's `add` rounds it;
    /// `false` (and `self` unchanged) when this representation cannot (the caller then
    /// adds on the host).
    fn add_assign(&mut self, other: &dyn DeviceValue) -> bool;
}

/// A result of a stage function.
pub enum Value {
    Host(Tensor),
    Device(Box<dyn DeviceValue>),
}

impl Value {
    pub fn bytes(&self) -> u64 {
        match self {
            Value::Host(t) => tensor_bytes(t),
            Value::Device(d) => d.bytes(),
        }
    }

    /// A host copy of the value.
    pub fn to_tensor(&self) -> Tensor {
        match self {
            Value::Host(t) => t.clone(),
            Value::Device(d) => d.to_tensor(),
        }
    }

    /// The value as a host tensor (converted if it is a device value).
    pub fn into_tensor(self) -> Tensor {
        match self {
            Value::Host(t) => t,
            Value::Device(d) => d.to_tensor(),
        }
    }

    fn as_arg(&self) -> ArgValue<'_> {
        match self {
            Value::Host(t) => ArgValue::Host(Cow::Borrowed(t)),
            Value::Device(d) => ArgValue::Device(d.as_ref()),
        }
    }
}

/// An argument of a stage function: a host tensor (borrowed when the caller keeps it:
/// weights, stashed values) or a device value the same executable produced.
pub enum ArgValue<'a> {
    Host(Cow<'a, Tensor>),
    Device(&'a dyn DeviceValue),
}

/// Runs the functions of one stage.
pub trait StageExecutable: Send {
    /// The function's signature: (argument name, kind, type) and result names.
    fn signature(&self, function: &str) -> Option<Signature>;
    /// Call `function`; its send/recv ops use `comm`. Result `i` may be returned as a
    /// [`Value::Device`] when `keep[i]` (the caller only passes it back to this stage's
    /// functions); every other result is a [`Value::Host`].
    fn call(
        &mut self,
        function: &str,
        args: Vec<ArgValue<'_>>,
        keep: &[bool],
        comm: &mut dyn Comm,
    ) -> Result<Vec<Value>, PipelineError>;
    /// The caller replaced some of the weights (`param`/`state` arguments) it passes: an
    /// executable that keeps converted copies of them must drop those.
    fn weights_changed(&mut self) {}
    /// The most bytes of temporaries (values made inside a function that are not its
    /// results) live at once during the calls since the last take, on the calling thread;
    /// `None` when the executable does not count them.
    fn take_temporary_peak(&mut self) -> Option<u64> {
        None
    }
    /// The GPU the executable's buffers live on, with the most bytes allocated on it so far
    /// (every stage on that GPU together); `None` for CPU executables.
    fn gpu_memory(&self) -> Option<GpuMemory> {
        None
    }
    /// The GPU the executable runs on; `None` for CPU executables.
    fn gpu_device(&self) -> Option<std::sync::Arc<crate::gpu::GpuDevice>> {
        None
    }
}

/// Memory of one GPU, as [`StageExecutable::gpu_memory`] reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuMemory {
    /// The device's ordinal and name (`0 (NVIDIA H100 80GB HBM3)`).
    pub device: String,
    /// The most bytes allocated on it at once so far.
    pub peak_bytes: u64,
    /// Its work and allocations so far (the whole GPU, whichever stages it runs).
    pub stats: crate::gpu::GpuStats,
}

/// A stage's functions on the reference interpreter.
pub struct InterpretedStage {
    pub module: Module,
    pub options: InterpOptions,
    /// The most bytes of temporaries of one call since the last take.
    pub peak_temporary_bytes: u64,
}

impl InterpretedStage {
    pub fn new(module: Module, options: InterpOptions) -> Self {
        InterpretedStage {
            module,
            options,
            peak_temporary_bytes: 0,
        }
    }
}

impl StageExecutable for InterpretedStage {
    fn signature(&self, function: &str) -> Option<Signature> {
        let f = self.module.function(function)?;
        Some(signature(f))
    }

    fn call(
        &mut self,
        function: &str,
        args: Vec<ArgValue<'_>>,
        _keep: &[bool],
        comm: &mut dyn Comm,
    ) -> Result<Vec<Value>, PipelineError> {
        let f = self
            .module
            .function(function)
            .ok_or_else(|| PipelineError::NoFunction {
                function: function.to_string(),
            })?;
        let args = args
            .into_iter()
            .map(|a| match a {
                ArgValue::Host(t) => t,
                ArgValue::Device(d) => Cow::Owned(d.to_tensor()),
            })
            .collect();
        let (out, stats) = run_function_stats(f, args, &self.options, Some(comm))?;
        self.peak_temporary_bytes = self.peak_temporary_bytes.max(stats.peak_temporary_bytes);
        Ok(out.into_iter().map(Value::Host).collect())
    }

    fn take_temporary_peak(&mut self) -> Option<u64> {
        Some(std::mem::take(&mut self.peak_temporary_bytes))
    }
}

/// Arguments and result names of `f`.
pub fn signature(f: &Function) -> Signature {
    (
        f.args()
            .iter()
            .map(|&(v, k)| (f.value(v).name.clone(), k, f.ty(v).clone()))
            .collect(),
        f.results()
            .iter()
            .map(|&r| f.value(r).name.clone())
            .collect(),
    )
}

/// One executed action, for traces.
#[derive(Clone, Debug, PartialEq)]
pub struct Timed {
    pub rank: usize,
    pub stage: u32,
    pub kind: ActionKind,
    pub micro_batch: u32,
    /// Seconds since the step began.
    pub start: f64,
    pub end: f64,
    /// Seconds of it spent waiting in receives.
    pub waiting: f64,
}

/// What one device did in one step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RankReport {
    /// Losses of the micro-batches whose loss this device computes, in micro-batch order.
    pub losses: Vec<f64>,
    pub actions: Vec<Timed>,
    /// Peak bytes of stashed activations.
    pub peak_stash_bytes: u64,
    /// The most bytes of temporaries one function call of this device's stages had live at
    /// once (`None`: its executables do not count them).
    pub peak_temporary_bytes: Option<u64>,
    /// The GPUs this device's stages run on (CUDA plans; empty on the CPU).
    pub gpu_memory: Vec<GpuMemory>,
}

/// A stage on a device: its functions, weights, stash and gradient sums.
pub struct StageWorker {
    pub spec: StageSpec,
    pub exec: Box<dyn StageExecutable>,
    /// Params and states by name.
    pub weights: BTreeMap<String, Tensor>,
    stash: HashMap<u32, HashMap<String, Value>>,
    grads: BTreeMap<String, Value>,
    /// This step's all-reduced gradients by channel, which the `all_reduce` ops of `optim`
    /// read.
    reduced: HashMap<i64, Tensor>,
}

impl StageWorker {
    pub fn new(
        spec: StageSpec,
        exec: Box<dyn StageExecutable>,
        weights: BTreeMap<String, Tensor>,
    ) -> Result<Self, PipelineError> {
        for f in spec.functions() {
            let (args, _) = exec
                .signature(f)
                .ok_or_else(|| PipelineError::StageFunction {
                    stage: spec.stage,
                    function: f.to_string(),
                })?;
            for (name, kind, _) in args {
                if kind != ArgKind::Input && !weights.contains_key(&name) {
                    return Err(PipelineError::MissingWeight {
                        stage: spec.stage,
                        function: f.to_string(),
                        name,
                    });
                }
            }
        }
        Ok(StageWorker {
            spec,
            exec,
            weights,
            stash: HashMap::new(),
            grads: BTreeMap::new(),
            reduced: HashMap::new(),
        })
    }

    fn stash_bytes(&self) -> u64 {
        self.stash
            .values()
            .flat_map(|m| m.values())
            .map(Value::bytes)
            .sum()
    }
}

fn tensor_bytes(t: &Tensor) -> u64 {
    (t.shape.iter().product::<usize>() * t.dtype.size_bytes()) as u64
}

/// Everything a worker needs to know about the run.
#[derive(Clone, Debug)]
pub struct RunConfig {
    pub microbatches: usize,
    /// Rows per micro-batch.
    pub micro_rows: usize,
    /// Device of each virtual stage.
    pub rank_of: Vec<usize>,
    /// Longest a receive waits.
    pub recv_timeout: Duration,
    /// Value name of each channel (for messages).
    pub channel_values: HashMap<i64, String>,
    /// Test hook: stage `.0` fails at step `.1` (before its first forward).
    pub fault: Option<Fault>,
    /// The gradient all-reduces of the program (plan.json's `collectives`).
    pub collectives: Vec<CollectiveSpec>,
    /// This worker's data-parallel replica, of `replicas`; each replica's devices are
    /// ranks `replica · devices ..` (`devices` = `rank_of`'s devices per pipeline).
    pub replica: usize,
    pub replicas: usize,
    pub devices: usize,
}

impl RunConfig {
    /// The rank that runs `stage` in `replica`.
    pub fn rank(&self, replica: usize, stage: u32) -> Option<usize> {
        self.rank_of
            .get(stage as usize)
            .map(|&r| replica * self.devices + r)
    }
}

/// A collective this device started: its local stages (by index) and the transport's
/// pending operation (`Err`: nothing to exchange, the local sum is the result).
struct Started {
    spec: CollectiveSpec,
    local: Vec<usize>,
    first: u32,
    pending: Result<crate::transport::PendingReduce, Tensor>,
}

/// The error of collective `c` (reported on stage `stage`) with a message.
fn collective_error(
    c: &CollectiveSpec,
    stage: u32,
) -> impl Fn(String) -> (u32, PipelineError) + '_ {
    move |message| {
        (
            stage,
            PipelineError::Collective {
                channel: c.channel,
                param: c.param.clone(),
                message,
            },
        )
    }
}

/// A transport error of a collective: an abort stays recognisable as one.
fn transport_failure(
    e: TransportError,
    stage: u32,
    fail: &impl Fn(String) -> (u32, PipelineError),
) -> (u32, PipelineError) {
    match e {
        TransportError::Aborted(reason) => (
            stage,
            PipelineError::Aborted {
                peer: stage,
                reason,
            },
        ),
        e => fail(e.to_string()),
    }
}

/// The channel of the replicas' loss gather (no program channel is negative).
pub const LOSS_CHANNEL: i64 = -1;

/// One `all_reduce` of a weight gradient (see `ppcc_passes::split`): stage `s` of `stages`
/// runs it in its optimizer function with `channel`; with `replicas`, in every replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CollectiveSpec {
    pub channel: i64,
    pub param: String,
    pub stages: Vec<u32>,
    pub replicas: bool,
    /// ZeRO-1: a `reduce_scatter` over the replicas (each gets its shard of the sum)
    /// instead of an `all_reduce`.
    pub reduce_scatter: bool,
}

/// A failure injected for tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    pub stage: u32,
    pub step: u64,
    /// Stall (sleep for this long, sending nothing) instead of panicking.
    pub stall: Option<Duration>,
    /// The data-parallel replica whose stage fails (0 without replicas).
    pub replica: usize,
}

/// One device: its stages and its actions.
pub struct RankWorker {
    pub rank: usize,
    pub stages: Vec<StageWorker>,
    pub actions: Vec<Action>,
    pub config: RunConfig,
    /// Send/recv payloads to the ranks it reaches go over this link (NCCL between GPUs),
    /// framed by the step's transport ([`crate::transport::framed`]).
    pub link: Option<LinkSlot>,
}

/// A worker's byte link and its framing state, kept across steps.
pub struct LinkSlot {
    pub link: Box<dyn crate::transport::framed::Link>,
    pub state: crate::transport::framed::FramedState,
}

/// `Comm` for one call: send/recv ops of stage `stage`, micro-batch `mb`.
struct CallComm<'a> {
    transport: &'a mut dyn Transport,
    config: &'a RunConfig,
    /// The stage's all-reduced gradients of this step.
    reduced: &'a HashMap<i64, Tensor>,
    stage: u32,
    mb: u32,
    step: u64,
    waiting: Duration,
}

impl CallComm<'_> {
    /// The transport's error as the communicator reports it: an abort (another device
    /// failed) stays recognisable as such.
    fn comm_error(&self, peer: u32, channel: i64, e: TransportError) -> CommError {
        match e {
            TransportError::Timeout { waited, .. } => CommError::Timeout {
                peer,
                channel,
                value: self.config.channel_values.get(&channel).cloned(),
                micro_batch: self.mb,
                waited,
            },
            TransportError::Aborted(reason) => CommError::Aborted { peer, reason },
            TransportError::Failed(message) => CommError::Transport {
                peer,
                channel,
                message,
            },
        }
    }
}

impl CallComm<'_> {
    /// The rank of stage `peer` and the tag of this call's message to it (`sending`) or
    /// from it.
    fn address(&self, peer: u32, channel: i64, sending: bool) -> Result<(usize, Tag), CommError> {
        let rank = self
            .config
            .rank(self.config.replica, peer)
            .ok_or(CommError::UnknownStage { peer, sending })?;
        let (from, to) = if sending {
            (self.stage, peer)
        } else {
            (peer, self.stage)
        };
        let tag = Tag {
            from,
            to,
            channel,
            micro_batch: self.mb,
            step: self.step,
        };
        Ok((rank, tag))
    }
}

impl Comm for CallComm<'_> {
    fn send(&mut self, peer: u32, channel: i64, t: Tensor) -> Result<(), CommError> {
        let (to_rank, tag) = self.address(peer, channel, true)?;
        self.transport
            .send(to_rank, tag, t)
            .map_err(|e| self.comm_error(peer, channel, e))
    }

    fn send_bytes(
        &mut self,
        peer: u32,
        channel: i64,
        dtype: ppir::DType,
        shape: &[usize],
        bytes: &[u8],
    ) -> Option<Result<(), CommError>> {
        let (to_rank, tag) = match self.address(peer, channel, true) {
            Ok(a) => a,
            Err(e) => return Some(Err(e)),
        };
        Some(
            self.transport
                .send_bytes(to_rank, tag, dtype, shape, bytes)
                .map_err(|e| self.comm_error(peer, channel, e)),
        )
    }

    fn recv_bytes(
        &mut self,
        peer: u32,
        channel: i64,
        ty: &TensorType,
        out: &mut [u8],
    ) -> Option<Result<(), CommError>> {
        let (from_rank, tag) = match self.address(peer, channel, false) {
            Ok(a) => a,
            Err(e) => return Some(Err(e)),
        };
        let t0 = Instant::now();
        let r = self
            .transport
            .recv_bytes(from_rank, tag, ty, self.config.recv_timeout, out);
        self.waiting += t0.elapsed();
        Some(r.map_err(|e| self.comm_error(peer, channel, e)))
    }

    fn recv(&mut self, peer: u32, channel: i64, ty: &TensorType) -> Result<Tensor, CommError> {
        let (from_rank, tag) = self.address(peer, channel, false)?;
        let t0 = Instant::now();
        let r = self
            .transport
            .recv(from_rank, tag, ty, self.config.recv_timeout);
        self.waiting += t0.elapsed();
        r.map_err(|e| self.comm_error(peer, channel, e))
    }

    /// The sum the worker computed before the optimizer functions (see
    /// [`RankWorker::reduce_gradients`]).
    fn all_reduce(
        &mut self,
        op: &ppir::ops::attrs::AllReduceAttrs,
        t: Tensor,
    ) -> Result<Tensor, CommError> {
        let peer = op.stages.first().map_or(self.stage, |&s| s as u32);
        let r = self
            .reduced
            .get(&op.channel)
            .ok_or_else(|| CommError::Transport {
                peer,
                channel: op.channel,
                message: format!(
                    "stage {} has no all-reduced value for channel {} (plan.json lists no such collective for it)",
                    self.stage, op.channel
                ),
            })?;
        if r.dtype != t.dtype || r.shape != t.shape {
            return Err(CommError::Mismatch {
                peer,
                channel: op.channel,
                got: format!("{}{:?}", r.dtype, r.shape),
                expected: format!("{}{:?}", t.dtype, t.shape),
            });
        }
        Ok(r.clone())
    }

    /// ZeRO-1: `reduce_scatter` reads this replica's shard of the sum, which the worker
    /// computed before the optimizer functions (like an all-reduce); `shard` cuts this
    /// replica's shard locally; `all_gather` joins every replica's shard (blocking).
    fn sharded(
        &mut self,
        kind: ppir::OpKind,
        op: &ppir::ops::attrs::ShardAttrs,
        t: Tensor,
    ) -> Result<Tensor, CommError> {
        let (replica, replicas) = (self.config.replica, self.config.replicas);
        let failed = |message: String| CommError::Transport {
            peer: self.stage,
            channel: op.channel,
            message,
        };
        if op.replicas != replicas as i64 {
            return Err(failed(format!(
                "the op shards over {} replicas, but the run has {replicas}",
                op.replicas
            )));
        }
        match kind {
            ppir::OpKind::ReduceScatter => {
                let r = self.reduced.get(&op.channel).ok_or_else(|| {
                    failed(format!(
                        "stage {} has no reduce-scattered value for channel {} (plan.json lists no such collective for it)",
                        self.stage, op.channel
                    ))
                })?;
                Ok(r.clone())
            }
            ppir::OpKind::Shard => ppir::shard::shard_of(&t, replicas, replica).map_err(failed),
            _ => {
                let ranks: Vec<usize> = (0..replicas)
                    .filter_map(|r| self.config.rank(r, self.stage))
                    .collect();
                let t0 = Instant::now();
                let parts = self
                    .transport
                    .all_gather(&ranks, op.channel, self.step, t, self.config.recv_timeout)
                    .map_err(|e| self.comm_error(self.stage, op.channel, e))?;
                self.waiting += t0.elapsed();
                let shape: Vec<usize> = op.shape.iter().map(|&d| d as usize).collect();
                ppir::shard::unshard(&parts, &shape).map_err(failed)
            }
        }
    }
}

impl RankWorker {
    /// With replicas: the losses of every replica's micro-batches, in step order, for
    /// replica 0 (which reports them; the others report none). The devices that compute
    /// the loss sum vectors holding their own micro-batches' losses and zeros elsewhere.
    fn gather_losses(
        &mut self,
        step: u64,
        mine: &[f64],
        transport: &mut dyn Transport,
    ) -> Result<Vec<f64>, (u32, PipelineError)> {
        let stage = self
            .stages
            .iter()
            .find(|s| {
                s.exec
                    .signature(&s.spec.fwd)
                    .is_some_and(|(_, results)| results.iter().any(|r| r == "loss"))
            })
            .map_or(0, |s| s.spec.stage);
        let fail = |message: String| {
            (
                stage,
                PipelineError::Collective {
                    channel: LOSS_CHANNEL,
                    param: "loss".into(),
                    message,
                },
            )
        };
        let m = self.config.microbatches;
        let n = m * self.config.replicas;
        if mine.len() != m {
            return Err(fail(format!(
                "this device computed {} losses, expected one per micro-batch ({m})",
                mine.len()
            )));
        }
        let mut all = vec![0.0f64; n];
        all[self.config.replica * m..(self.config.replica + 1) * m].copy_from_slice(mine);
        let ranks: Vec<usize> = (0..self.config.replicas)
            .filter_map(|r| self.config.rank(r, stage))
            .collect();
        let t = Tensor::from_f64(DType::F64, vec![n], all);
        let sum = transport
            .all_reduce(&ranks, LOSS_CHANNEL, step, t, self.config.recv_timeout)
            .map_err(|e| transport_failure(e, stage, &fail))?;
        Ok(if self.config.replica == 0 {
            sum.to_f64_vec()
        } else {
            vec![]
        })
    }

    /// This device's collectives (plan.json's `collectives` that name one of its stages),
    /// in channel order, each with the index of the action after which its gradients are
    /// complete: the last weight-gradient action (`W` or `B`) of its stages here, or
    /// `usize::MAX` (at the end) when they have none.
    fn collective_plan(&self) -> Vec<(CollectiveSpec, usize)> {
        let mut collectives: Vec<CollectiveSpec> = self
            .config
            .collectives
            .iter()
            .filter(|c| self.stages.iter().any(|s| c.stages.contains(&s.spec.stage)))
            .cloned()
            .collect();
        collectives.sort_by_key(|c| c.channel);
        collectives
            .into_iter()
            .map(|c| {
                let ready = self
                    .actions
                    .iter()
                    .enumerate()
                    .filter(|(_, a)| {
                        matches!(
                            a.kind,
                            ActionKind::BackwardWeight | ActionKind::FullBackward
                        ) && c.stages.contains(&(a.stage as u32))
                    })
                    .map(|(i, _)| i)
                    .max()
                    .unwrap_or(usize::MAX);
                (c, ready)
            })
            .collect()
    }

    /// Start the all-reduce of collective `c`: the gradient sums of this device's stages
    /// in it, added here, then summed across devices (and replicas) by the transport.
    fn start_collective(
        &mut self,
        c: &CollectiveSpec,
        step: u64,
        transport: &mut dyn Transport,
    ) -> Result<Started, (u32, PipelineError)> {
        let mut local: Vec<usize> = (0..self.stages.len())
            .filter(|&i| c.stages.contains(&self.stages[i].spec.stage))
            .collect();
        local.sort_by_key(|&i| self.stages[i].spec.stage);
        let first = local.first().map_or(0, |&i| self.stages[i].spec.stage);
        let fail = collective_error(c, first);
        let mut parts = vec![];
        for &i in &local {
            let g = self.stages[i].grads.get(&c.param).ok_or_else(|| {
                fail(format!(
                    "stage {} computed no gradient of `{}` this step",
                    self.stages[i].spec.stage, c.param
                ))
            })?;
            parts.push(g.to_tensor());
        }
        let mine = match parts.len() {
            1 => parts.remove(0),
            _ => crate::transport::sum_parts(&parts).map_err(&fail)?,
        };
        let replicas: Vec<usize> = if c.replicas {
            (0..self.config.replicas).collect()
        } else {
            vec![self.config.replica]
        };
        let mut ranks: Vec<usize> = replicas
            .iter()
            .flat_map(|&r| c.stages.iter().map(move |&s| (r, s)))
            .filter_map(|(r, s)| self.config.rank(r, s))
            .collect();
        ranks.sort_unstable();
        ranks.dedup();
        let pending = if ranks.len() <= 1 {
            Err(mine)
        } else if c.reduce_scatter {
            Ok(transport
                .reduce_scatter_start(&ranks, c.channel, step, mine)
                .map_err(|e| transport_failure(e, first, &fail))?)
        } else {
            Ok(transport
                .all_reduce_start(&ranks, c.channel, step, mine)
                .map_err(|e| transport_failure(e, first, &fail))?)
        };
        Ok(Started {
            spec: c.clone(),
            local,
            first,
            pending,
        })
    }

    /// Wait for a started collective and give each local stage its sum.
    fn finish_collective(
        &mut self,
        s: Started,
        transport: &mut dyn Transport,
    ) -> Result<(), (u32, PipelineError)> {
        let fail = collective_error(&s.spec, s.first);
        let sum = match s.pending {
            Err(local_only) if s.spec.reduce_scatter => {
                ppir::shard::shard_of(&local_only, 1, 0).map_err(&fail)?
            }
            Err(local_only) => local_only,
            Ok(p) if s.spec.reduce_scatter => transport
                .reduce_scatter_finish(p, self.config.recv_timeout)
                .map_err(|e| transport_failure(e, s.first, &fail))?,
            Ok(p) => transport
                .all_reduce_finish(p, self.config.recv_timeout)
                .map_err(|e| transport_failure(e, s.first, &fail))?,
        };
        for &i in &s.local {
            self.stages[i].reduced.insert(s.spec.channel, sum.clone());
        }
        Ok(())
    }

    /// Run this device's actions of step `step` on the global batch `batch`, then the
    /// optimizer step of each of its stages. With a [`LinkSlot`], send/recv payloads to
    /// the ranks the link reaches go over it, framed by `transport`.
    pub fn step(
        &mut self,
        step: u64,
        batch: &Batch,
        transport: &mut dyn Transport,
    ) -> Result<RankReport, WorkerError> {
        let Some(mut slot) = self.link.take() else {
            return self.step_on(step, batch, transport);
        };
        let r = {
            let mut framed = crate::transport::framed::Framed {
                inner: transport,
                link: slot.link.as_mut(),
                state: &mut slot.state,
            };
            self.step_on(step, batch, &mut framed)
        };
        self.link = Some(slot);
        r
    }

    fn step_on(
        &mut self,
        step: u64,
        batch: &Batch,
        transport: &mut dyn Transport,
    ) -> Result<RankReport, WorkerError> {
        let t0 = Instant::now();
        let mut report = RankReport::default();
        let rank = self.rank;
        let err = |stage: Option<u32>,
                   mb: Option<u32>,
                   function: Option<&str>,
                   error: PipelineError| WorkerError {
            rank,
            stage,
            step,
            micro_batch: mb,
            function: function.map(String::from),
            error: Box::new(error),
            abandoned: vec![],
        };
        let actions = self.actions.clone();
        // Gradient all-reduces start as soon as their stages' last weight gradient is done
        // (overlapping the rest of the step), in channel order so that every rank of a
        // group starts them in the same order.
        let collectives = self.collective_plan();
        let mut next_collective = 0;
        let mut started: Vec<Started> = vec![];
        for (ai, a) in actions.iter().enumerate() {
            while let Some((c, ready)) = collectives.get(next_collective) {
                if *ready >= ai {
                    break;
                }
                let s = self
                    .start_collective(c, step, transport)
                    .map_err(|(stage, e)| err(Some(stage), None, None, e))?;
                started.push(s);
                next_collective += 1;
            }
            let (a_stage, a_mb) = (a.stage as u32, a.micro_batch as u32);
            let idx = self
                .stages
                .iter()
                .position(|s| s.spec.stage == a_stage)
                .ok_or_else(|| {
                    err(
                        Some(a_stage),
                        None,
                        None,
                        PipelineError::NoStage {
                            rank,
                            stage: a_stage,
                            action: *a,
                        },
                    )
                })?;
            if a.kind != ActionKind::OptimizerStep && a.micro_batch >= self.config.microbatches {
                return Err(err(
                    Some(a_stage),
                    None,
                    None,
                    PipelineError::MicroBatch {
                        action: *a,
                        micro_batch: a_mb,
                        microbatches: self.config.microbatches,
                    },
                ));
            }
            if let Some(f) = self.config.fault {
                if f.stage == a_stage
                    && f.replica == self.config.replica
                    && f.step == step
                    && a.kind == ActionKind::Forward
                    && a_mb == 0
                {
                    match f.stall {
                        Some(d) => std::thread::sleep(d),
                        None => panic!("injected fault in stage {} at step {step}", f.stage),
                    }
                }
            }
            let functions: Vec<String> = match a.kind {
                ActionKind::Forward => vec![self.stages[idx].spec.fwd.clone()],
                ActionKind::BackwardInput => vec![self.stages[idx].spec.bwd_input.clone()],
                ActionKind::BackwardWeight => vec![self.stages[idx].spec.bwd_weight.clone()],
                ActionKind::FullBackward => vec![
                    self.stages[idx].spec.bwd_input.clone(),
                    self.stages[idx].spec.bwd_weight.clone(),
                ],
                _ => continue,
            };
            let start = t0.elapsed().as_secs_f64();
            let mut waiting = 0.0;
            for f in &functions {
                waiting += self
                    .call(idx, f, a_mb, step, batch, transport, &mut report.losses)
                    .map_err(|m| err(Some(a_stage), Some(a_mb), Some(f), m))?;
            }
            if let Some(t) = self.stages[idx].exec.take_temporary_peak() {
                report.peak_temporary_bytes = Some(report.peak_temporary_bytes.unwrap_or(0).max(t));
            }
            if matches!(
                a.kind,
                ActionKind::BackwardWeight | ActionKind::FullBackward
            ) {
                self.stages[idx].stash.remove(&a_mb);
            }
            let stash: u64 = self.stages.iter().map(|s| s.stash_bytes()).sum();
            report.peak_stash_bytes = report.peak_stash_bytes.max(stash);
            report.actions.push(Timed {
                rank,
                stage: a_stage,
                kind: a.kind,
                micro_batch: a_mb,
                start,
                end: t0.elapsed().as_secs_f64(),
                waiting,
            });
        }
        for idx in 0..self.stages.len() {
            let leftover = self.stages[idx].stash.len();
            if leftover > 0 {
                return Err(err(
                    Some(self.stages[idx].spec.stage),
                    None,
                    None,
                    PipelineError::Stashed { count: leftover },
                ));
            }
        }
        if self.config.replicas > 1 && !report.losses.is_empty() {
            report.losses = self
                .gather_losses(step, &report.losses, transport)
                .map_err(|(stage, e)| err(Some(stage), None, None, e))?;
        }
        for (c, _) in &collectives[next_collective..] {
            let s = self
                .start_collective(c, step, transport)
                .map_err(|(stage, e)| err(Some(stage), None, None, e))?;
            started.push(s);
        }
        for s in started {
            self.finish_collective(s, transport)
                .map_err(|(stage, e)| err(Some(stage), None, None, e))?;
        }
        // Optimizer steps.
        for idx in 0..self.stages.len() {
            let stage = self.stages[idx].spec.stage;
            let Some(f) = self.stages[idx].spec.optim.clone() else {
                continue;
            };
            let start = t0.elapsed().as_secs_f64();
            self.call(idx, &f, 0, step, batch, transport, &mut report.losses)
                .map_err(|m| err(Some(stage), None, Some(&f), m))?;
            if let Some(t) = self.stages[idx].exec.take_temporary_peak() {
                report.peak_temporary_bytes = Some(report.peak_temporary_bytes.unwrap_or(0).max(t));
            }
            self.stages[idx].grads.clear();
            self.stages[idx].reduced.clear();
            report.actions.push(Timed {
                rank,
                stage,
                kind: ActionKind::OptimizerStep,
                micro_batch: 0,
                start,
                end: t0.elapsed().as_secs_f64(),
                waiting: 0.0,
            });
        }
        for st in &self.stages {
            if let Some(g) = st.exec.gpu_memory() {
                match report.gpu_memory.iter_mut().find(|x| x.device == g.device) {
                    Some(x) => {
                        x.peak_bytes = x.peak_bytes.max(g.peak_bytes);
                        x.stats = g.stats;
                    }
                    None => report.gpu_memory.push(g),
                }
            }
        }
        Ok(report)
    }

    /// Call one function; returns the seconds spent waiting in receives.
    #[allow(clippy::too_many_arguments)]
    fn call(
        &mut self,
        idx: usize,
        function: &str,
        mb: u32,
        step: u64,
        batch: &Batch,
        transport: &mut dyn Transport,
        losses: &mut Vec<f64>,
    ) -> Result<f64, PipelineError> {
        let micro_rows = self.config.micro_rows;
        // This replica's micro-batches are rows replica·M .. (replica+1)·M of the step.
        let global_mb = self.config.replica * self.config.microbatches + mb as usize;
        let st = &mut self.stages[idx];
        let (args_sig, results) =
            st.exec
                .signature(function)
                .ok_or_else(|| PipelineError::NoFunction {
                    function: function.to_string(),
                })?;
        let is_optim = st.spec.optim.as_deref() == Some(function);
        let mut args = Vec::with_capacity(args_sig.len());
        for (name, kind, _ty) in &args_sig {
            let t = if *kind != ArgKind::Input {
                st.weights
                    .get(name)
                    .map(|t| ArgValue::Host(Cow::Borrowed(t)))
            } else if let Some(v) = st.stash.get(&mb).and_then(|m| m.get(name)) {
                Some(v.as_arg())
            } else if name == "rng" {
                // The micro-batch's index in the whole step (all replicas), so that a
                // replicated pipeline draws what one device running every micro-batch does.
                Some(ArgValue::Host(Cow::Owned(Tensor::from_i64(
                    DType::I64,
                    vec![2],
                    vec![step as i64, global_mb as i64],
                ))))
            } else if let Some(t) = batch.get(name) {
                let all = self.config.microbatches * self.config.replicas.max(1);
                if t.shape.first().copied() != Some(micro_rows * all) {
                    return Err(PipelineError::BatchRows {
                        name: name.clone(),
                        shape: t.shape.clone(),
                        microbatches: all,
                        micro_rows,
                    });
                }
                Some(ArgValue::Host(Cow::Owned(slice_rows(
                    t,
                    global_mb * micro_rows,
                    micro_rows,
                ))))
            } else if is_optim {
                name.strip_prefix("grad.")
                    .and_then(|p| st.grads.get(p))
                    .map(Value::as_arg)
            } else {
                None
            };
            args.push(t.ok_or_else(|| PipelineError::NoValue { name: name.clone() })?);
        }
        let mut comm = CallComm {
            transport,
            config: &self.config,
            reduced: &st.reduced,
            stage: st.spec.stage,
            mb,
            step,
            waiting: Duration::ZERO,
        };
        // Results that only go back into this stage's functions (its stash) may stay in
        // the executable's representation.
        let keep: Vec<bool> = results
            .iter()
            .map(|name| {
                !is_optim
                    && name != "loss"
                    && !name
                        .strip_prefix("new.")
                        .is_some_and(|w| st.weights.contains_key(w))
            })
            .collect();
        let outs = st
            .exec
            .call(function, args, &keep, &mut comm)
            .map_err(PipelineError::classify)?;
        let waiting = comm.waiting.as_secs_f64();
        let mut weights_changed = false;
        for (name, v) in results.into_iter().zip(outs) {
            if name == "loss" && !is_optim {
                let t = v.into_tensor();
                losses.push(t.to_f64_vec().first().copied().unwrap_or(f64::NAN));
            } else if let Some(w) = name.strip_prefix("new.") {
                if st.weights.contains_key(w) {
                    st.weights.insert(w.to_string(), v.into_tensor());
                    weights_changed = true;
                } else if !is_optim {
                    st.stash.entry(mb).or_default().insert(name, v);
                }
            } else if let (false, Some(p)) = (is_optim, name.strip_prefix("grad.")) {
                let summed = match st.grads.remove(p) {
                    None => v,
                    Some(acc) => {
                        accumulate_value(acc, v).map_err(|source| PipelineError::Accumulate {
                            param: p.to_string(),
                            source: Box::new(source),
                        })?
                    }
                };
                st.grads.insert(p.to_string(), summed);
            } else if !is_optim {
                st.stash.entry(mb).or_default().insert(name, v);
            }
        }
        if weights_changed {
            st.exec.weights_changed();
        }
        Ok(waiting)
    }
}

/// [`accumulate`] for values: in the executable's representation when both are device
/// values it can add, else on the host.
fn accumulate_value(acc: Value, g: Value) -> Result<Value, InterpError> {
    match (acc, g) {
        (Value::Device(mut a), Value::Device(b)) => {
            if a.add_assign(b.as_ref()) {
                Ok(Value::Device(a))
            } else {
                accumulate(a.to_tensor(), &b.to_tensor()).map(Value::Host)
            }
        }
        (a, b) => accumulate(a.into_tensor(), &b.into_tensor()).map(Value::Host),
    }
}

/// `acc + g` in `acc`'s dtype, as the interpreter's `add` computes it (f64 sum rounded once
/// to the dtype), in place for floats of the same shape; any other pair goes through the
/// interpreter's `add`.
fn accumulate(mut acc: Tensor, g: &Tensor) -> Result<Tensor, InterpError> {
    use ppir::TensorData;
    if acc.shape == g.shape && acc.dtype == g.dtype {
        let d = acc.dtype;
        if let (TensorData::Float(a), TensorData::Float(b)) = (&mut acc.data, &g.data) {
            for (x, &y) in a.iter_mut().zip(b) {
                *x = ppir::tensor::round_to(d, *x + y);
            }
            return Ok(acc);
        }
    }
    let ty = TensorType::of(
        acc.dtype,
        &acc.shape.iter().map(|&d| d as u64).collect::<Vec<_>>(),
    );
    let mut out = eval_op(
        OpKind::Add,
        &Attrs::new(),
        &[&acc, g],
        &[ty],
        &InterpOptions::default(),
    )?;
    // `eval_op` returns one tensor per declared result type.
    Ok(out.swap_remove(0))
}

/// How long [`run_local`] waits for the other devices once one has failed: the net is
/// aborted, so they stop at their next send or receive; one that does not within this time
/// (stuck in a computation, or hung) is abandoned so that the failure can be reported.
pub const STOP_GRACE: Duration = Duration::from_secs(2);

/// One step on every device, each a thread, over `net`. Returns the reports by rank, or
/// the root cause of a failure (a panic counts as a failure of its device).
///
/// Each worker moves into its thread for the step and comes back with its result; the
/// caller waits with a deadline instead of joining, so a device that never returns cannot
/// hold the run: once a device has failed the others get [`STOP_GRACE`] to stop, and once
/// a device has finished the others get `recv_timeout` (longer than that, a device that
/// still runs is stuck: the others would have reported it, had they waited for it). An
/// abandoned worker is gone from `workers` (the step's error says which device it was),
/// and its thread is left to end with the process.
pub fn run_local(
    workers: &mut Vec<RankWorker>,
    net: &LocalNet,
    step: u64,
    batch: std::sync::Arc<Batch>,
) -> Result<Vec<RankReport>, WorkerError> {
    use std::sync::mpsc;
    type Done = (usize, RankWorker, Result<RankReport, WorkerError>);
    let n = workers.len();
    let ranks: Vec<(usize, Option<u32>)> = workers
        .iter()
        .map(|w| (w.rank, w.stages.first().map(|s| s.spec.stage)))
        .collect();
    let recv_timeout = workers
        .first()
        .map_or(Duration::from_secs(120), |w| w.config.recv_timeout);
    let (tx, rx) = mpsc::channel::<Done>();
    let mut spawn_error = None;
    for (i, mut w) in workers.drain(..).enumerate() {
        let (thread_net, batch, tx) = (net.clone(), batch.clone(), tx.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("device-{}", w.rank))
            .spawn(move || {
                let net = thread_net;
                let mut ep = net.endpoint(w.rank);
                let rank = w.rank;
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    w.step(step, &batch, &mut ep)
                }));
                let r = match r {
                    Ok(r) => r,
                    Err(p) => Err(WorkerError {
                        rank,
                        stage: w.stages.first().map(|s| s.spec.stage),
                        step,
                        micro_batch: None,
                        function: None,
                        error: Box::new(PipelineError::Panicked {
                            rank,
                            message: panic_message(&*p),
                        }),
                        abandoned: vec![],
                    }),
                };
                if let Err(e) = &r {
                    if !e.aborted() {
                        net.abort(&format!("device {rank} failed: {e}"));
                    }
                }
                // The driver may have stopped waiting (this device was abandoned).
                let _ = tx.send((i, w, r));
            });
        if let Err(e) = spawned {
            net.abort("a device thread could not start");
            spawn_error = Some(WorkerError {
                rank: ranks[i].0,
                stage: ranks[i].1,
                step,
                micro_batch: None,
                function: None,
                error: Box::new(PipelineError::Spawn {
                    rank: ranks[i].0,
                    message: e.to_string(),
                }),
                abandoned: vec![],
            });
            break;
        }
    }
    drop(tx);
    let mut slots: Vec<Option<(RankWorker, Result<RankReport, WorkerError>)>> =
        (0..n).map(|_| None).collect();
    let mut received = 0;
    let mut deadline: Option<Instant> = None;
    let mut failed = spawn_error.is_some();
    if failed {
        deadline = Some(Instant::now() + STOP_GRACE);
    }
    while received < n {
        let got = match deadline {
            None => rx.recv().map_err(|_| ()),
            Some(d) => rx
                .recv_timeout(d.saturating_duration_since(Instant::now()))
                .map_err(|_| ()),
        };
        // Disconnected (every thread done or never started) or past the deadline.
        let Ok((i, w, r)) = got else { break };
        received += 1;
        let now = Instant::now();
        if r.is_err() && !failed {
            failed = true;
            deadline = Some(now + STOP_GRACE);
        } else if deadline.is_none() {
            deadline = Some(now + recv_timeout);
        }
        slots[i] = Some((w, r));
    }
    let stuck: Vec<usize> = slots
        .iter()
        .zip(&ranks)
        .filter(|(s, _)| s.is_none())
        .map(|(_, &(r, _))| r)
        .collect();
    if !stuck.is_empty() {
        // Let a stuck device's pending receives fail, should it ever get there.
        net.abort("the step was abandoned");
    }
    let mut reports = vec![];
    let mut first: Option<WorkerError> = spawn_error;
    for slot in slots.into_iter().flatten() {
        let (w, r) = slot;
        workers.push(w);
        match r {
            Ok(rep) => reports.push(rep),
            Err(e) => {
                let replace = match &first {
                    None => true,
                    Some(f) => f.aborted() && !e.aborted(),
                };
                if replace {
                    first = Some(e);
                }
            }
        }
    }
    match first {
        Some(mut e) => {
            e.abandoned = stuck;
            Err(e)
        }
        None if !stuck.is_empty() => {
            let r = stuck[0];
            let stage = ranks.iter().find(|x| x.0 == r).and_then(|x| x.1);
            Err(WorkerError {
                rank: r,
                stage,
                step,
                micro_batch: None,
                function: None,
                error: Box::new(PipelineError::Stuck {
                    waited: recv_timeout,
                    abandoned: stuck,
                }),
                abandoned: vec![],
            })
        }
        None => Ok(reports),
    }
}

/// The text of a caught panic.
pub fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panic".into())
}

/// The mean loss of a step from the devices' reports (micro-batch order).
pub fn step_loss(reports: &[RankReport]) -> Option<f64> {
    let losses: Vec<f64> = reports
        .iter()
        .flat_map(|r| r.losses.iter().copied())
        .collect();
    if losses.is_empty() {
        None
    } else {
        Some(losses.iter().sum::<f64>() / losses.len() as f64)
    }
}

/// Median seconds of a stage's actions run on their own, the way a [`RankWorker`] runs
/// them — `[F, I, W, optim]`: `fwd` with the stage's `weights` and `data(type)` for its
/// inputs (data arrays, `rng`, received values) and its results stashed; `bwd_input` and
/// `bwd_weight` reading that stash, with the `grad.*` results summed as the worker sums
/// them (W includes the summing); `optim` with the sums. Communication goes to `comm`
/// (for timing: a sink that answers receives with `data`). `rounds` micro-batches are
/// timed after one untimed round; `optim` is timed without replacing any weight.
pub fn time_actions(
    exec: &mut dyn StageExecutable,
    [fwd, bwd_input, bwd_weight]: [&str; 3],
    optim: Option<&str>,
    weights: &HashMap<String, Tensor>,
    data: &dyn Fn(&TensorType) -> Option<Tensor>,
    comm: &mut dyn Comm,
    rounds: usize,
) -> Result<[f64; 4], PipelineError> {
    type Stash = HashMap<String, Value>;
    let call = |exec: &mut dyn StageExecutable,
                function: &str,
                stash: &Stash,
                grads: &HashMap<String, Value>,
                comm: &mut dyn Comm|
     -> Result<(f64, Vec<(String, Value)>), PipelineError> {
        let (args_sig, results) =
            exec.signature(function)
                .ok_or_else(|| PipelineError::NoFunction {
                    function: function.to_string(),
                })?;
        let mut args = Vec::with_capacity(args_sig.len());
        for (name, kind, ty) in &args_sig {
            let t = if *kind != ArgKind::Input {
                weights.get(name).map(|t| ArgValue::Host(Cow::Borrowed(t)))
            } else if let Some(v) = stash.get(name) {
                Some(v.as_arg())
            } else if let Some(v) = name.strip_prefix("grad.").and_then(|p| grads.get(p)) {
                Some(v.as_arg())
            } else {
                data(ty).map(|t| ArgValue::Host(Cow::Owned(t)))
            };
            args.push(t.ok_or_else(|| PipelineError::NoTimingValue {
                function: function.to_string(),
                name: name.clone(),
            })?);
        }
        let keep: Vec<bool> = results
            .iter()
            .map(|n| n != "loss" && !n.starts_with("new."))
            .collect();
        let t0 = Instant::now();
        let outs = exec.call(function, args, &keep, comm)?;
        Ok((
            t0.elapsed().as_secs_f64(),
            results.into_iter().zip(outs).collect(),
        ))
    };
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    let (mut f, mut i, mut w) = (vec![], vec![], vec![]);
    let mut grads: HashMap<String, Value> = HashMap::new();
    for round in 0..=rounds {
        let mut stash = Stash::new();
        let (tf, outs) = call(exec, fwd, &stash, &grads, comm)?;
        for (name, t) in outs {
            if name != "loss" && !name.starts_with("new.") {
                stash.insert(name, t);
            }
        }
        let (ti, outs) = call(exec, bwd_input, &stash, &grads, comm)?;
        for (name, t) in outs {
            stash.insert(name, t);
        }
        let (tw, outs) = call(exec, bwd_weight, &stash, &grads, comm)?;
        let t0 = Instant::now();
        for (name, v) in outs {
            if let Some(p) = name.strip_prefix("grad.") {
                let summed = match grads.remove(p) {
                    None => v,
                    Some(acc) => {
                        accumulate_value(acc, v).map_err(|source| PipelineError::Accumulate {
                            param: p.to_string(),
                            source: Box::new(source),
                        })?
                    }
                };
                grads.insert(p.to_string(), summed);
            }
        }
        let tw = tw + t0.elapsed().as_secs_f64();
        if round > 0 {
            f.push(tf);
            i.push(ti);
            w.push(tw);
        }
    }
    let mut o = vec![];
    if let Some(optim) = optim {
        for _ in 0..3 {
            o.push(call(exec, optim, &Stash::new(), &grads, comm)?.0);
        }
    }
    Ok([median(f), median(i), median(w), median(o)])
}
