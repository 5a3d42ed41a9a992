//! One process per rank under `mpirun`: point-to-point MPI over `MPI_COMM_WORLD`.
//!
//! A message is one byte buffer: a header (the full [`Tag`], the dtype, the shape) and
//! the elements in the wire dtype (`f32` as 4 bytes, `bf16` as 2, `bool` as 1, ...,
//! little-endian; values are already rounded to their dtype, so the conversion is exact).
//! The MPI tag is a hash of the [`Tag`] below `MPI_TAG_UB`, so MPI's own matching picks
//! the message out of whatever else the source sent; the receiver checks the full tag in
//! the header and keeps a message whose hash collided until it is asked for.
//!
//! Sends are immediate (`MPI_Isend` of a buffer this endpoint owns until the send
//! completes): the caller never waits for the receiver. A background thread tests the
//! outstanding sends while any exist, so large (rendezvous) transfers make progress while
//! the caller computes. All MPI calls, the thread's included, are made under one mutex, so
//! the endpoint needs only `MPI_THREAD_SERIALIZED`.
//!
//! A receive probes (`MPI_Improbe`) with a short backoff until the message arrives or its
//! timeout passes. [`Transport::abort`] prints the reason and calls `MPI_Abort`, which
//! makes `mpirun` kill every rank (so receives never see [`TransportError::Aborted`]: the
//! process is gone first). A successful rank ends with [`MpiTransport::finish`]
//! (completes its sends, finalises MPI); an endpoint dropped without it (an error
//! returned, a panic) aborts the job the same way, and a rank that exits without
//! finalising MPI (`std::process::exit`, a signal) makes `mpirun` stop the others.

use std::collections::HashMap;
use std::os::raw::{c_int, c_void};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mpi::environment::{Threading, Universe};
use mpi::ffi;
use mpi::point_to_point::{MatchedReceiveVec, Source};
use mpi::topology::Communicator;
use ppir::{DType, Tensor, TensorData, TensorType};

use super::{check_type, Tag, Transport, TransportError};

const MAGIC: [u8; 4] = *b"PPT1";
/// Bytes of the header before the dims: magic, tag (from, to, channel, micro-batch,
/// step), dtype, rank.
const FIXED_HEADER: usize = 4 + 4 + 4 + 8 + 4 + 8 + 1 + 4;

/// An `MPI_Isend` in flight and the buffer it reads.
struct PendingSend {
    request: ffi::MPI_Request,
    _buffer: Vec<u8>,
}

/// The state every MPI call is made under.
struct State {
    pending: Vec<PendingSend>,
    /// The progress thread stops when set.
    stop: bool,
}

// SAFETY: `MPI_Request` is an opaque handle (a pointer in Open MPI); MPI allows any thread
// to use it under MPI_THREAD_SERIALIZED, and every use is under the `State` mutex.
unsafe impl Send for State {}

struct Shared {
    state: Mutex<State>,
    /// Signalled when a send is queued or the endpoint shuts down.
    wake: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves MPI usable; carry on.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Test every outstanding send; drop those that completed.
fn test_pending(state: &mut State) -> Result<(), TransportError> {
    let mut err = None;
    state.pending.retain_mut(|p| {
        let mut flag: c_int = 0;
        // SAFETY: the request is a live Isend request; its buffer lives in `p`.
        let rc = unsafe { ffi::MPI_Test(&mut p.request, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
        if rc != 0 {
            err = Some(TransportError::Failed(format!(
                "MPI_Test failed (error {rc})"
            )));
            return true;
        }
        flag == 0
    });
    err.map_or(Ok(()), Err)
}

/// A started collective (`MPI_Iallreduce`, `MPI_Ireduce_scatter_block`,
/// `MPI_Iallgather`): its request and the buffers it reads and writes.
struct MpiReduce {
    request: RequestHandle,
    send: Tensor,
    out: Tensor,
    what: String,
    /// The result is a sum (rounded to the dtype when done).
    sums: bool,
}

/// Which collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    AllReduce,
    ReduceScatter,
    AllGather,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "all-reduce",
            Op::ReduceScatter => "reduce-scatter",
            Op::AllGather => "all-gather",
        }
    }

    fn mpi_name(self) -> &'static str {
        match self {
            Op::AllReduce => "MPI_Iallreduce",
            Op::ReduceScatter => "MPI_Ireduce_scatter_block",
            Op::AllGather => "MPI_Iallgather",
        }
    }
}

/// An MPI request handle (an opaque pointer in Open MPI).
struct RequestHandle(ffi::MPI_Request);

// SAFETY: the request is only tested under the transport's lock (MPI_THREAD_SERIALIZED),
// by whichever thread owns the endpoint.
unsafe impl Send for RequestHandle {}

/// A sub-communicator handle (an opaque pointer in Open MPI).
struct GroupComm(ffi::MPI_Comm);

// SAFETY: the handle is only used under the transport's lock (MPI_THREAD_SERIALIZED), by
// whichever thread owns the endpoint.
unsafe impl Send for GroupComm {}

/// One rank's endpoint: this process, under `mpirun`.
pub struct MpiTransport {
    rank: usize,
    size: usize,
    /// Exclusive upper bound of the MPI tags used (`MPI_TAG_UB + 1`).
    tag_modulus: u64,
    shared: Arc<Shared>,
    progress: Option<JoinHandle<()>>,
    /// Messages received while looking for another tag (hash collisions), by source.
    early: HashMap<(usize, Tag), Tensor>,
    /// A communicator per group of ranks that all-reduces together (made on first use).
    groups: HashMap<Vec<usize>, GroupComm>,
    /// Set by [`MpiTransport::finish`].
    finished: bool,
    /// Dropped last: finalises MPI.
    universe: Universe,
}

impl MpiTransport {
    /// Start collective `op` of `t` over `ranks` on their communicator: floats travel as
    /// f64 (sums rounded once to the dtype at the end), integers as i64.
    fn collective_start(
        &mut self,
        op: Op,
        ranks: &[usize],
        channel: i64,
        step: u64,
        t: Tensor,
    ) -> Result<super::PendingReduce, TransportError> {
        let n = ranks.len().max(1);
        let numel = t.data.len();
        // The result: the sum (all-reduce), this rank's shard (reduce-scatter), or every
        // rank's part stacked (all-gather).
        let (send_len, out_len, out_shape) = match op {
            Op::AllReduce => (numel, numel, t.shape.clone()),
            Op::ReduceScatter => {
                let s = ppir::shard::shard_len(numel as u64, n as u64) as usize;
                (s * n, s, vec![s])
            }
            Op::AllGather => {
                let mut shape = vec![n];
                shape.extend(&t.shape);
                (numel, numel * n, shape)
            }
        };
        let ty = TensorType::of(
            t.dtype,
            &out_shape.iter().map(|&d| d as u64).collect::<Vec<_>>(),
        );
        let pending = |part: Option<Tensor>, handle: Option<Box<dyn std::any::Any + Send>>| {
            super::PendingReduce {
                ranks: ranks.to_vec(),
                channel,
                step,
                ty: ty.clone(),
                part,
                handle,
            }
        };
        if ranks.len() <= 1 {
            let single = match op {
                Op::AllReduce => t,
                Op::ReduceScatter => {
                    ppir::shard::shard_of(&t, 1, 0).map_err(TransportError::Failed)?
                }
                Op::AllGather => Tensor {
                    dtype: t.dtype,
                    shape: out_shape,
                    data: t.data,
                },
            };
            return Ok(pending(Some(single), None));
        }
        let what = format!(
            "the {} on channel {channel} (step {step}) over ranks {ranks:?}",
            op.name()
        );
        if !ranks.contains(&self.rank) {
            return Err(TransportError::Failed(format!(
                "{what}: rank {} is not one of the ranks",
                self.rank
            )));
        }
        let comm = self.group(ranks)?;
        let too_many =
            || TransportError::Failed(format!("{what}: too many elements for one MPI call"));
        let count = c_int::try_from(match op {
            Op::AllReduce => numel,
            Op::ReduceScatter => out_len,
            Op::AllGather => numel,
        })
        .map_err(|_| too_many())?;
        c_int::try_from(send_len.max(out_len)).map_err(|_| too_many())?;
        let (mut send_data, out_data) = match &t.data {
            TensorData::Float(v) => (
                TensorData::Float(v.clone()),
                TensorData::Float(vec![0.0; out_len]),
            ),
            TensorData::Int(v) => (
                TensorData::Int(v.clone()),
                TensorData::Int(vec![0; out_len]),
            ),
        };
        // Reduce-scatter blocks: the padding of the last shard is zeros.
        match &mut send_data {
            TensorData::Float(v) => v.resize(send_len, 0.0),
            TensorData::Int(v) => v.resize(send_len, 0),
        }
        let send = Tensor {
            dtype: t.dtype,
            shape: vec![send_len],
            data: send_data,
        };
        let out = Tensor {
            dtype: t.dtype,
            shape: out_shape,
            data: out_data,
        };
        // Boxed so that the buffers MPI reads and writes never move.
        let mut boxed = Box::new(MpiReduce {
            request: RequestHandle(
                // SAFETY: a null request is a valid initial value; MPI sets it.
                unsafe { ffi::RSMPI_REQUEST_NULL },
            ),
            out,
            send,
            what,
            sums: op != Op::AllGather,
        });
        let _state = self.shared.lock();
        let MpiReduce {
            request,
            send,
            out,
            what,
            ..
        } = &mut *boxed;
        let (a, b, datatype) = match (&send.data, &mut out.data) {
            (TensorData::Float(a), TensorData::Float(b)) => (
                a.as_ptr() as *const c_void,
                b.as_mut_ptr() as *mut c_void,
                // SAFETY: a predefined datatype handle of an initialised MPI.
                unsafe { ffi::RSMPI_DOUBLE },
            ),
            (TensorData::Int(a), TensorData::Int(b)) => (
                a.as_ptr() as *const c_void,
                b.as_mut_ptr() as *mut c_void,
                // SAFETY: as above.
                unsafe { ffi::RSMPI_INT64_T },
            ),
            _ => {
                return Err(TransportError::Failed(format!(
                    "{what}: a malformed tensor"
                )))
            }
        };
        // SAFETY: MPI is initialised; calls are serialised by the lock; the send buffer
        // (`send_len` elements) and the receive buffer (`out_len`) live in the boxed
        // `MpiReduce`, which the pending operation owns until the request completes; the
        // counts match those lengths (`count · n = send_len` for the reduce-scatter,
        // `count · n = out_len` for the all-gather).
        let rc = unsafe {
            match op {
                Op::AllReduce => {
                    ffi::MPI_Iallreduce(a, b, count, datatype, ffi::RSMPI_SUM, comm, &mut request.0)
                }
                Op::ReduceScatter => ffi::MPI_Ireduce_scatter_block(
                    a,
                    b,
                    count,
                    datatype,
                    ffi::RSMPI_SUM,
                    comm,
                    &mut request.0,
                ),
                Op::AllGather => ffi::MPI_Iallgather(
                    a,
                    count,
                    datatype,
                    b,
                    count,
                    datatype,
                    comm,
                    &mut request.0,
                ),
            }
        };
        if rc != 0 {
            return Err(TransportError::Failed(format!(
                "{what}: {} failed (error {rc})",
                op.mpi_name()
            )));
        }
        Ok(pending(None, Some(boxed)))
    }

    /// Poll a started collective like the barrier, so that a dead rank or the timeout
    /// ends the wait; sums are rounded once to the dtype.
    fn collective_finish(
        &mut self,
        p: super::PendingReduce,
        timeout: Duration,
    ) -> Result<Tensor, TransportError> {
        let Some(handle) = p.handle else {
            return p
                .part
                .ok_or_else(|| TransportError::Failed("an empty collective".into()));
        };
        let Ok(mut op) = handle.downcast::<MpiReduce>() else {
            return Err(TransportError::Failed(
                "a collective started by another transport".into(),
            ));
        };
        let start = Instant::now();
        let mut pause = Duration::from_micros(5);
        loop {
            {
                let mut state = self.shared.lock();
                test_pending(&mut state)?;
                let mut flag: c_int = 0;
                // SAFETY: `request` is the live request of `op`.
                let rc = unsafe {
                    ffi::MPI_Test(&mut op.request.0, &mut flag, ffi::RSMPI_STATUS_IGNORE)
                };
                if rc != 0 {
                    return Err(TransportError::Failed(format!(
                        "{}: MPI_Test failed (error {rc})",
                        op.what
                    )));
                }
                if flag != 0 {
                    break;
                }
            }
            if start.elapsed() >= timeout {
                let what = op.what.clone();
                // The request still uses the buffers: keep them alive for the rest of
                // the process (the run ends with this error).
                std::mem::forget(op);
                return Err(TransportError::Failed(format!(
                    "{what}: the other ranks did not join within {:.1} s",
                    timeout.as_secs_f64()
                )));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_micros(500));
        }
        let MpiReduce {
            send,
            mut out,
            sums,
            ..
        } = *op;
        if sums {
            if let TensorData::Float(v) = &mut out.data {
                for x in v.iter_mut() {
                    *x = ppir::tensor::round_to(send.dtype, *x);
                }
            }
        }
        Ok(out)
    }

    /// Initialise MPI (`MPI_THREAD_SERIALIZED`) and take this process's rank and the
    /// number of ranks from `MPI_COMM_WORLD`. Fails if MPI was initialised already.
    pub fn init() -> Result<Self, TransportError> {
        let (universe, provided) = mpi::initialize_with_threading(Threading::Serialized)
            .ok_or_else(|| TransportError::Failed("MPI is already initialised".into()))?;
        if !matches!(provided, Threading::Serialized | Threading::Multiple) {
            return Err(TransportError::Failed(format!(
                "the MPI library provides thread level {provided:?}; the transport needs Serialized"
            )));
        }
        let world = universe.world();
        let rank = world.rank() as usize;
        let size = world.size() as usize;
        let tag_ub = tag_upper_bound()?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                pending: Vec::new(),
                stop: false,
            }),
            wake: Condvar::new(),
        });
        let thread_shared = shared.clone();
        let progress = std::thread::Builder::new()
            .name(format!("mpi-progress-{rank}"))
            .spawn(move || progress_loop(&thread_shared))
            .map_err(|e| TransportError::Failed(format!("cannot start the MPI thread: {e}")))?;
        Ok(MpiTransport {
            rank,
            size,
            tag_modulus: tag_ub as u64 + 1,
            shared,
            progress: Some(progress),
            early: HashMap::new(),
            groups: HashMap::new(),
            finished: false,
            universe,
        })
    }

    /// Use only the MPI tags below `bound` (at least 1; the same on every rank). Tags
    /// that hash alike are told apart by the header, so any bound is correct; a small
    /// one exercises that path (tests).
    pub fn with_tag_bound(mut self, bound: u64) -> Self {
        self.tag_modulus = bound.clamp(1, self.tag_modulus);
        self
    }

    /// The MPI tag a message travels under.
    fn mpi_tag(&self, tag: &Tag) -> c_int {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in tag_bytes(tag) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        (h % self.tag_modulus) as c_int
    }

    /// End a successful run: complete the outstanding sends (waiting for their receivers)
    /// and finalise MPI, which waits until every rank has finished. Every rank must call
    /// it at the end, on the thread that called [`MpiTransport::init`] (MPI wants
    /// `MPI_Finalize` there); dropping the endpoint instead aborts the job (see `Drop`).
    /// A message sent but never received makes this wait forever (a correct run leaves
    /// none).
    pub fn finish(mut self) -> Result<(), TransportError> {
        self.shared.lock().stop = true;
        self.shared.wake.notify_all();
        if let Some(h) = self.progress.take() {
            let _ = h.join();
        }
        let mut result = Ok(());
        let mut state = self.shared.lock();
        for p in &mut state.pending {
            // SAFETY: a live Isend request whose buffer is still owned by `p`.
            let rc = unsafe { ffi::MPI_Wait(&mut p.request, ffi::RSMPI_STATUS_IGNORE) };
            if rc != 0 {
                result = Err(TransportError::Failed(format!(
                    "MPI_Wait failed (error {rc})"
                )));
            }
        }
        state.pending.clear();
        drop(state);
        self.finished = true;
        // Dropping `self` drops the universe: MPI_Finalize.
        result
    }

    /// Sends not yet completed (a finished run leaves none once the receivers have
    /// taken their messages).
    pub fn pending_sends(&self) -> usize {
        self.shared.lock().pending.len()
    }

    /// The communicator of `ranks` (ascending, this rank among them), made with
    /// `MPI_Comm_create_group` the first time: collective over those ranks only, which
    /// reach it in the same order (collectives run in channel order on every rank).
    fn group(&mut self, ranks: &[usize]) -> Result<ffi::MPI_Comm, TransportError> {
        if let Some(c) = self.groups.get(ranks) {
            return Ok(c.0);
        }
        let ints: Vec<c_int> = ranks
            .iter()
            .map(|&r| c_int::try_from(r))
            .collect::<Result<_, _>>()
            .map_err(|_| TransportError::Failed("rank out of range".into()))?;
        let n = c_int::try_from(ints.len())
            .map_err(|_| TransportError::Failed("too many ranks in a group".into()))?;
        let _state = self.shared.lock();
        // SAFETY: MPI is initialised; calls are serialised by the lock; the out-pointers
        // are valid locals. MPI_Comm_create_group is collective over `ranks`, which all
        // call it for this group next (see above).
        let comm = unsafe {
            let mut world_group: ffi::MPI_Group = std::mem::zeroed();
            let rc = ffi::MPI_Comm_group(ffi::RSMPI_COMM_WORLD, &mut world_group);
            if rc != 0 {
                return Err(TransportError::Failed(format!(
                    "MPI_Comm_group failed (error {rc})"
                )));
            }
            let mut group: ffi::MPI_Group = std::mem::zeroed();
            let rc = ffi::MPI_Group_incl(world_group, n, ints.as_ptr(), &mut group);
            if rc != 0 {
                return Err(TransportError::Failed(format!(
                    "MPI_Group_incl failed (error {rc})"
                )));
            }
            let mut comm: ffi::MPI_Comm = ffi::RSMPI_COMM_NULL;
            let rc = ffi::MPI_Comm_create_group(ffi::RSMPI_COMM_WORLD, group, 0, &mut comm);
            ffi::MPI_Group_free(&mut group);
            ffi::MPI_Group_free(&mut world_group);
            if rc != 0 {
                return Err(TransportError::Failed(format!(
                    "MPI_Comm_create_group of ranks {ranks:?} failed (error {rc})"
                )));
            }
            comm
        };
        self.groups.insert(ranks.to_vec(), GroupComm(comm));
        Ok(comm)
    }

    /// One non-blocking look for `tag` from `from_rank`; messages of other tags that
    /// share its MPI tag are kept in `early`.
    fn try_recv(&mut self, from_rank: usize, tag: Tag) -> Result<Option<Tensor>, TransportError> {
        if let Some(t) = self.early.remove(&(from_rank, tag)) {
            return Ok(Some(t));
        }
        let mpi_tag = self.mpi_tag(&tag);
        let mut state = self.shared.lock();
        test_pending(&mut state)?;
        let world = self.universe.world();
        let source = world.process_at_rank(from_rank as c_int);
        while let Some(probed) = source.immediate_matched_probe_with_tag(mpi_tag) {
            let (bytes, _status) = probed.matched_receive_vec::<u8>();
            let (got, t) = decode(&bytes)?;
            if got == tag {
                return Ok(Some(t));
            }
            if self.early.insert((from_rank, got), t).is_some() {
                return Err(TransportError::Failed(format!(
                    "{got} from rank {from_rank} was received twice"
                )));
            }
        }
        Ok(None)
    }
}

fn progress_loop(shared: &Shared) {
    let mut state = shared.lock();
    loop {
        if state.stop {
            return;
        }
        if state.pending.is_empty() {
            state = shared.wake.wait(state).unwrap_or_else(|e| e.into_inner());
            continue;
        }
        if let Err(e) = test_pending(&mut state) {
            eprintln!("ppcc: MPI transport: {e}");
            return;
        }
        drop(state);
        std::thread::sleep(Duration::from_micros(200));
        state = shared.lock();
    }
}

/// `MPI_TAG_UB` of `MPI_COMM_WORLD`.
fn tag_upper_bound() -> Result<c_int, TransportError> {
    let mut value: *mut c_int = std::ptr::null_mut();
    let mut flag: c_int = 0;
    // SAFETY: MPI is initialised; for MPI_TAG_UB the attribute is a pointer to an int
    // owned by MPI, written into `value`.
    let rc = unsafe {
        ffi::MPI_Comm_get_attr(
            ffi::RSMPI_COMM_WORLD,
            ffi::MPI_TAG_UB as c_int,
            &mut value as *mut *mut c_int as *mut c_void,
            &mut flag,
        )
    };
    if rc != 0 || flag == 0 || value.is_null() {
        return Err(TransportError::Failed("cannot read MPI_TAG_UB".into()));
    }
    // SAFETY: checked non-null above; MPI keeps it alive while initialised.
    let ub = unsafe { *value };
    if ub < 32767 {
        return Err(TransportError::Failed(format!(
            "MPI_TAG_UB is {ub}, below the standard's minimum"
        )));
    }
    Ok(ub)
}

impl Drop for MpiTransport {
    /// An endpoint dropped without [`MpiTransport::finish`] belongs to a rank that failed
    /// (an error returned, a panic): it aborts the job, so the other ranks stop at once
    /// instead of waiting out their receive timeouts (MPI_Finalize would wait for them).
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        if std::thread::panicking() {
            self.abort("the rank panicked");
        }
        self.abort("the rank stopped without finishing (it failed)");
    }
}

impl Transport for MpiTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn send(&mut self, to_rank: usize, tag: Tag, t: Tensor) -> Result<(), TransportError> {
        if to_rank >= self.size {
            return Err(TransportError::Failed(format!(
                "{tag}: no rank {to_rank} (of {})",
                self.size
            )));
        }
        let buffer = encode(&tag, &t)?;
        let count = c_int::try_from(buffer.len()).map_err(|_| {
            TransportError::Failed(format!(
                "{tag}: message of {} bytes is larger than one MPI message can be",
                buffer.len()
            ))
        })?;
        let mpi_tag = self.mpi_tag(&tag);
        let mut state = self.shared.lock();
        // SAFETY: a null request is a valid initial value; `MPI_Isend` overwrites it.
        let mut request: ffi::MPI_Request = unsafe { ffi::RSMPI_REQUEST_NULL };
        // SAFETY: `buffer` is moved into the pending list below and not touched until the
        // request completes (the Vec's heap storage does not move).
        let rc = unsafe {
            ffi::MPI_Isend(
                buffer.as_ptr() as *const c_void,
                count,
                ffi::RSMPI_UINT8_T,
                to_rank as c_int,
                mpi_tag,
                ffi::RSMPI_COMM_WORLD,
                &mut request,
            )
        };
        if rc != 0 {
            return Err(TransportError::Failed(format!(
                "{tag}: MPI_Isend to rank {to_rank} failed (error {rc})"
            )));
        }
        state.pending.push(PendingSend {
            request,
            _buffer: buffer,
        });
        let result = test_pending(&mut state);
        let wake = !state.pending.is_empty();
        drop(state);
        if wake {
            self.shared.wake.notify_all();
        }
        result
    }

    fn recv(
        &mut self,
        from_rank: usize,
        tag: Tag,
        ty: &TensorType,
        timeout: Duration,
    ) -> Result<Tensor, TransportError> {
        if from_rank >= self.size {
            return Err(TransportError::Failed(format!(
                "{tag}: no rank {from_rank} (of {})",
                self.size
            )));
        }
        let start = Instant::now();
        let mut pause = Duration::from_micros(5);
        loop {
            if let Some(t) = self.try_recv(from_rank, tag)? {
                check_type(&tag, &t, ty)?;
                return Ok(t);
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return Err(TransportError::Timeout { tag, waited });
            }
            std::thread::sleep(pause.min(timeout - waited));
            pause = (pause * 2).min(Duration::from_micros(500));
        }
    }

    fn abort(&mut self, reason: &str) {
        eprintln!("ppcc: rank {} aborts the run: {reason}", self.rank);
        let _state = self.shared.lock();
        // SAFETY: MPI is initialised; the lock serialises this with the progress thread.
        unsafe {
            ffi::MPI_Abort(ffi::RSMPI_COMM_WORLD, 1);
        }
        // MPI_Abort does not return; if an implementation does, still stop this rank.
        std::process::exit(1);
    }

    /// Start `MPI_Iallreduce` (sum) over the group's communicator: floats in f64 (then
    /// rounded once to the dtype), integers in i64.
    fn all_reduce_start(
        &mut self,
        ranks: &[usize],
        channel: i64,
        step: u64,
        t: Tensor,
    ) -> Result<super::PendingReduce, TransportError> {
        self.collective_start(Op::AllReduce, ranks, channel, step, t)
    }

    /// Poll the started `MPI_Iallreduce` like the barrier, so that a dead rank or the
    /// timeout ends the wait.
    fn all_reduce_finish(
        &mut self,
        p: super::PendingReduce,
        timeout: Duration,
    ) -> Result<Tensor, TransportError> {
        self.collective_finish(p, timeout)
    }

    /// Start `MPI_Ireduce_scatter_block` (sum, blocks of the shard length; see
    /// [`ppir::shard`]) over the group's communicator.
    fn reduce_scatter_start(
        &mut self,
        ranks: &[usize],
        channel: i64,
        step: u64,
        t: Tensor,
    ) -> Result<super::PendingReduce, TransportError> {
        self.collective_start(Op::ReduceScatter, ranks, channel, step, t)
    }

    fn reduce_scatter_finish(
        &mut self,
        p: super::PendingReduce,
        timeout: Duration,
    ) -> Result<Tensor, TransportError> {
        self.collective_finish(p, timeout)
    }

    /// `MPI_Iallgather` over the group's communicator, polled like the barrier.
    fn all_gather(
        &mut self,
        ranks: &[usize],
        channel: i64,
        step: u64,
        t: Tensor,
        timeout: Duration,
    ) -> Result<Vec<Tensor>, TransportError> {
        let p = self.collective_start(Op::AllGather, ranks, channel, step, t)?;
        let stacked = self.collective_finish(p, timeout)?;
        Ok(super::unstack(&stacked))
    }

    fn barrier(&mut self) -> Result<(), TransportError> {
        // SAFETY: a null request is a valid initial value; `MPI_Ibarrier` overwrites it.
        let mut request: ffi::MPI_Request = unsafe { ffi::RSMPI_REQUEST_NULL };
        {
            let _state = self.shared.lock();
            // SAFETY: MPI is initialised; calls are serialised by the lock.
            let rc = unsafe { ffi::MPI_Ibarrier(ffi::RSMPI_COMM_WORLD, &mut request) };
            if rc != 0 {
                return Err(TransportError::Failed(format!(
                    "MPI_Ibarrier failed (error {rc})"
                )));
            }
        }
        let mut pause = Duration::from_micros(5);
        loop {
            {
                let mut state = self.shared.lock();
                test_pending(&mut state)?;
                let mut flag: c_int = 0;
                // SAFETY: `request` is the live Ibarrier request.
                let rc =
                    unsafe { ffi::MPI_Test(&mut request, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
                if rc != 0 {
                    return Err(TransportError::Failed(format!(
                        "MPI_Test of the barrier failed (error {rc})"
                    )));
                }
                if flag != 0 {
                    return Ok(());
                }
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_micros(500));
        }
    }
}

/// The receiver's check: dtype, rank and every known dim as `ty` says.
fn tag_bytes(tag: &Tag) -> impl Iterator<Item = u8> {
    tag.from
        .to_le_bytes()
        .into_iter()
        .chain(tag.to.to_le_bytes())
        .chain(tag.channel.to_le_bytes())
        .chain(tag.micro_batch.to_le_bytes())
        .chain(tag.step.to_le_bytes())
}

fn dtype_code(d: DType) -> u8 {
    DType::ALL.iter().position(|&x| x == d).unwrap_or(0) as u8
}

/// Bytes per element on the wire.
fn wire_size(d: DType) -> usize {
    match d {
        DType::F64 | DType::I64 => 8,
        DType::F32 | DType::I32 => 4,
        DType::F16 | DType::BF16 => 2,
        DType::I8 | DType::Bool => 1,
    }
}

/// The message for `t`: header, then the elements in `t.dtype`.
fn encode(tag: &Tag, t: &Tensor) -> Result<Vec<u8>, TransportError> {
    let n = t.num_elements();
    if t.data.len() != n {
        return Err(TransportError::Failed(format!(
            "{tag}: tensor of shape {:?} holds {} elements",
            t.shape,
            t.data.len()
        )));
    }
    let mut out = Vec::with_capacity(FIXED_HEADER + 8 * t.shape.len() + n * wire_size(t.dtype));
    out.extend_from_slice(&MAGIC);
    out.extend(tag_bytes(tag));
    out.push(dtype_code(t.dtype));
    out.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
    for &d in &t.shape {
        out.extend_from_slice(&(d as u64).to_le_bytes());
    }
    match (&t.data, t.dtype) {
        (TensorData::Float(v), DType::F64) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        (TensorData::Float(v), DType::F32) => {
            v.iter().for_each(|&x| out.extend((x as f32).to_le_bytes()))
        }
        (TensorData::Float(v), DType::F16) => v
            .iter()
            .for_each(|&x| out.extend(half::f16::from_f64(x).to_le_bytes())),
        (TensorData::Float(v), DType::BF16) => v
            .iter()
            .for_each(|&x| out.extend(half::bf16::from_f64(x).to_le_bytes())),
        (TensorData::Int(v), DType::I64) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
        (TensorData::Int(v), DType::I32) => {
            v.iter().for_each(|&x| out.extend((x as i32).to_le_bytes()))
        }
        (TensorData::Int(v), DType::I8) => v.iter().for_each(|&x| out.push(x as i8 as u8)),
        (TensorData::Int(v), DType::Bool) => v.iter().for_each(|&x| out.push((x != 0) as u8)),
        _ => {
            return Err(TransportError::Failed(format!(
                "{tag}: a {} tensor holds {} data",
                t.dtype,
                if t.dtype.is_float() {
                    "integer"
                } else {
                    "float"
                }
            )))
        }
    }
    Ok(out)
}

/// Reads `n` bytes at `*at`.
fn take<'a>(bytes: &'a [u8], at: &mut usize, n: usize) -> Result<&'a [u8], TransportError> {
    let s = bytes
        .get(*at..*at + n)
        .ok_or_else(|| TransportError::Failed("truncated MPI message".into()))?;
    *at += n;
    Ok(s)
}

/// The first `N` bytes of `s` (callers pass exactly `N`; shorter input is zero-padded
/// rather than panicking).
fn arr<const N: usize>(s: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    let n = s.len().min(N);
    a[..n].copy_from_slice(&s[..n]);
    a
}

/// The tag and tensor of a message made by [`encode`].
fn decode(bytes: &[u8]) -> Result<(Tag, Tensor), TransportError> {
    let at = &mut 0;
    if take(bytes, at, 4)? != MAGIC {
        return Err(TransportError::Failed(
            "an MPI message that is not a ppcc tensor".into(),
        ));
    }
    let tag = Tag {
        from: u32::from_le_bytes(arr(take(bytes, at, 4)?)),
        to: u32::from_le_bytes(arr(take(bytes, at, 4)?)),
        channel: i64::from_le_bytes(arr(take(bytes, at, 8)?)),
        micro_batch: u32::from_le_bytes(arr(take(bytes, at, 4)?)),
        step: u64::from_le_bytes(arr(take(bytes, at, 8)?)),
    };
    let code = take(bytes, at, 1)?[0];
    let dtype = *DType::ALL
        .get(code as usize)
        .ok_or_else(|| TransportError::Failed(format!("{tag}: unknown dtype code {code}")))?;
    let rank = u32::from_le_bytes(arr(take(bytes, at, 4)?)) as usize;
    let mut shape = Vec::with_capacity(rank.min(64));
    for _ in 0..rank {
        shape.push(u64::from_le_bytes(arr(take(bytes, at, 8)?)) as usize);
    }
    let w = wire_size(dtype);
    let body = &bytes[*at..];
    // Checked: a shape whose size wraps to 0 must not match an empty body.
    if ppir::size::checked_size_bytes(&shape, w) != Some(body.len()) {
        return Err(TransportError::Failed(format!(
            "{tag}: {} bytes of data for {dtype} {shape:?}",
            body.len()
        )));
    }
    let chunks = body.chunks_exact(w);
    let data = match dtype {
        DType::F64 => TensorData::Float(chunks.map(|c| f64::from_le_bytes(arr(c))).collect()),
        DType::F32 => {
            TensorData::Float(chunks.map(|c| f32::from_le_bytes(arr(c)) as f64).collect())
        }
        DType::F16 => TensorData::Float(
            chunks
                .map(|c| half::f16::from_le_bytes(arr(c)).to_f64())
                .collect(),
        ),
        DType::BF16 => TensorData::Float(
            chunks
                .map(|c| half::bf16::from_le_bytes(arr(c)).to_f64())
                .collect(),
        ),
        DType::I64 => TensorData::Int(chunks.map(|c| i64::from_le_bytes(arr(c))).collect()),
        DType::I32 => TensorData::Int(chunks.map(|c| i32::from_le_bytes(arr(c)) as i64).collect()),
        DType::I8 => TensorData::Int(chunks.map(|c| c[0] as i8 as i64).collect()),
        DType::Bool => TensorData::Int(chunks.map(|c| (c[0] != 0) as i64).collect()),
    };
    Ok((tag, Tensor { dtype, shape, data }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(channel: i64, micro_batch: u32) -> Tag {
        Tag {
            from: 1,
            to: 2,
            channel,
            micro_batch,
            step: 7,
        }
    }

    #[test]
    fn encode_decode_every_dtype() {
        let tensors = vec![
            Tensor::from_f64(
                DType::F32,
                vec![2, 3],
                vec![0.1, -2.5, 1e30, -0.0, 3.0, 1e-40],
            ),
            Tensor::from_f64(DType::F64, vec![3], vec![0.1, f64::MAX, f64::MIN_POSITIVE]),
            Tensor::from_f64(DType::F16, vec![2], vec![0.1, 65504.0]),
            Tensor::from_f64(DType::BF16, vec![1, 2], vec![0.1, -3e38]),
            Tensor::from_i64(DType::I64, vec![3], vec![i64::MIN, -1, i64::MAX]),
            Tensor::from_i64(DType::I32, vec![2], vec![i32::MIN as i64, 5]),
            Tensor::from_i64(DType::I8, vec![3], vec![-128, 0, 127]),
            Tensor::from_i64(DType::Bool, vec![2, 1], vec![1, 0]),
            Tensor::from_f64(DType::F32, vec![], vec![4.5]),
            Tensor::zeros(DType::F32, vec![0, 3]),
        ];
        for (i, t) in tensors.into_iter().enumerate() {
            let bytes = encode(&tag(i as i64, 3), &t).unwrap();
            assert_eq!(
                bytes.len(),
                FIXED_HEADER + 8 * t.shape.len() + t.num_elements() * wire_size(t.dtype)
            );
            let (got_tag, got) = decode(&bytes).unwrap();
            assert_eq!(got_tag, tag(i as i64, 3));
            assert_eq!(got, t);
            // NaN survives too (compared bitwise-insensitively).
        }
        let nan = Tensor::from_f64(DType::F32, vec![1], vec![f64::NAN]);
        let (_, got) = decode(&encode(&tag(0, 0), &nan).unwrap()).unwrap();
        assert!(got.as_f64().unwrap()[0].is_nan());
    }

    #[test]
    fn decode_rejects_bad_messages() {
        let t = Tensor::from_f32(vec![2], vec![1.0, 2.0]);
        let bytes = encode(&tag(1, 0), &t).unwrap();
        assert!(decode(&bytes[..bytes.len() - 1]).is_err());
        assert!(decode(&bytes[..10]).is_err());
        assert!(decode(b"XXXXsomething").is_err());
        let bad = Tensor {
            dtype: DType::F32,
            shape: vec![2],
            data: TensorData::Int(vec![1, 2]),
        };
        assert!(encode(&tag(1, 0), &bad).is_err());
        // A shape of 2^62 x 4 f32 (its byte size wraps to 0) with no data.
        let mut wrapped = encode(&tag(1, 0), &Tensor::from_f32(vec![0, 4], vec![])).unwrap();
        let dims = wrapped.len() - 16;
        wrapped[dims..dims + 8].copy_from_slice(&(1u64 << 62).to_le_bytes());
        let e = decode(&wrapped).unwrap_err().to_string();
        assert!(
            e.contains("0 bytes of data for f32 [4611686018427387904, 4]"),
            "{e}"
        );
    }

    #[test]
    fn type_check() {
        let t = Tensor::from_f32(vec![2, 3], vec![0.0; 6]);
        let tg = tag(1, 0);
        assert!(check_type(&tg, &t, &TensorType::of(DType::F32, &[2, 3])).is_ok());
        assert!(check_type(&tg, &t, &TensorType::of(DType::F32, &[3, 2])).is_err());
        assert!(check_type(&tg, &t, &TensorType::of(DType::F64, &[2, 3])).is_err());
        assert!(check_type(&tg, &t, &TensorType::of(DType::F32, &[6])).is_err());
        let batch = TensorType::new(DType::F32, vec![ppir::Dim::Batch, ppir::Dim::Known(3)]);
        assert!(check_type(&tg, &t, &batch).is_ok());
    }
}
