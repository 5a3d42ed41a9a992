//! Payloads over a byte link, headers over a transport: how send/recv between GPUs goes
//! over NCCL ([`super::nccl::NcclLink`]) while the addressing, the fault handling and the
//! collectives stay with the local or MPI transport.
//!
//! A [`Link`] moves bytes between two ranks in order (NCCL's point-to-point operations
//! match in the order they were posted, and carry no tag). [`Framed`] gives it the
//! [`Transport`] contract: each message's bytes go over the link, and a small header (the
//! message's [`Tag`], dtype and shape) goes over the inner transport, numbered per
//! sender and receiver. A receive reads the headers from its peer in that order, takes
//! each payload off the link as its header arrives, and keeps the ones that came before
//! the one it waits for ([`FramedState`], kept across steps). So messages may be received
//! in any order, as on the other transports, and a receive still waits at most its timeout
//! and stops when another rank aborts (the inner transport's headers carry both).
//!
//! Peers the link does not reach (a data-parallel replica on another node, say) and every
//! collective stay on the inner transport.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use ppir::{DType, Tensor, TensorType};

use super::{
    check_parts, check_type, tensor_into, tensor_of_bytes, PendingReduce, Tag, Transport,
    TransportError,
};

/// An ordered byte pipe to some peers.
pub trait Link: Send {
    /// What the link is, for messages (`NCCL (libnccl.so.2) on GPU 0 of rank 1`).
    fn describe(&self) -> String;
    /// Whether messages to `rank` go over the link.
    fn sends_to(&self, rank: usize) -> bool;
    /// Whether messages from `rank` come over the link.
    fn receives_from(&self, rank: usize) -> bool;
    /// Queue a copy of `bytes` for `to` and return without waiting for the receiver;
    /// messages to one peer arrive in the order sent. `bytes` may be a stage function's
    /// buffer (GPU memory in a CUDA plan): the link copies it before it returns.
    fn send(&mut self, to: usize, bytes: &[u8]) -> Result<(), TransportError>;
    /// The next message from `from`, which has `len` bytes, held by the link (on the GPU,
    /// for NCCL) until copied out; `None` when `deadline` passes first (the link is
    /// unusable after that). While it waits it asks `stopped` now and then, and gives up
    /// with [`TransportError::Aborted`] once that says why the run stopped.
    fn recv(
        &mut self,
        from: usize,
        len: usize,
        deadline: Instant,
        stopped: &dyn Fn() -> Option<String>,
    ) -> Result<Option<Box<dyn Held>>, TransportError>;
    /// Give up every transfer in flight (a rank failed).
    fn abort(&mut self);
}

/// A message a [`Link`] received, where the link keeps it.
pub trait Held: Send {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copy it into `out` (of its length): a stage function's buffer, GPU memory in a CUDA
    /// plan.
    fn copy_to(&self, out: &mut [u8]) -> Result<(), TransportError>;
    /// Its bytes in host memory.
    fn to_vec(&self) -> Result<Vec<u8>, TransportError>;
}

impl Held for Vec<u8> {
    fn len(&self) -> usize {
        Vec::len(self)
    }

    fn copy_to(&self, out: &mut [u8]) -> Result<(), TransportError> {
        if out.len() != self.len() {
            return Err(TransportError::Failed(format!(
                "{} bytes received for a buffer of {}",
                self.len(),
                out.len()
            )));
        }
        out.copy_from_slice(self);
        Ok(())
    }

    fn to_vec(&self) -> Result<Vec<u8>, TransportError> {
        Ok(self.clone())
    }
}

/// A received message: its type and bytes.
struct Message {
    dtype: DType,
    shape: Vec<usize>,
    bytes: Box<dyn Held>,
}

/// A rank's bookkeeping of its framed messages, kept across steps.
#[derive(Default)]
pub struct FramedState {
    /// Headers sent to each rank, and read from each rank.
    sent: HashMap<usize, u64>,
    read: HashMap<usize, u64>,
    /// Messages that arrived before they were asked for, by sender and tag.
    early: HashMap<(usize, Tag), Message>,
    traffic: Traffic,
}

/// Messages and bytes that went over a rank's link.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    pub sent: u64,
    pub sent_bytes: u64,
    pub received: u64,
    pub received_bytes: u64,
}

impl FramedState {
    /// Messages received and not yet asked for.
    pub fn early(&self) -> usize {
        self.early.len()
    }

    /// What went over the link so far.
    pub fn traffic(&self) -> Traffic {
        self.traffic
    }
}

/// [`Transport`] over `inner` with payloads on `link` (see the module comment).
pub struct Framed<'a> {
    pub inner: &'a mut dyn Transport,
    pub link: &'a mut dyn Link,
    pub state: &'a mut FramedState,
}

/// The header: tag (5), dtype, rank, dims.
const HEADER: usize = 16;
const MAX_DIMS: usize = HEADER - 7;
/// The inner transport's channel for headers (no program has it: channels count up from 0).
const HEADER_CHANNEL: i64 = i64::MIN + 1;

fn header_type() -> TensorType {
    TensorType::of(DType::I64, &[HEADER as u64])
}

fn header_tag(from: usize, to: usize, seq: u64) -> Tag {
    Tag {
        from: from as u32,
        to: to as u32,
        channel: HEADER_CHANNEL,
        micro_batch: 0,
        step: seq,
    }
}

fn encode_header(tag: &Tag, dtype: DType, shape: &[usize]) -> Result<Tensor, TransportError> {
    if shape.len() > MAX_DIMS {
        return Err(TransportError::Failed(format!(
            "{tag}: a tensor of {} dimensions; the GPU link's header holds at most {MAX_DIMS}",
            shape.len()
        )));
    }
    let code = DType::ALL.iter().position(|&d| d == dtype).unwrap_or(0);
    let mut h = vec![
        tag.from as i64,
        tag.to as i64,
        tag.channel,
        tag.micro_batch as i64,
        tag.step as i64,
        code as i64,
        shape.len() as i64,
    ];
    h.extend(shape.iter().map(|&d| d as i64));
    h.resize(HEADER, 0);
    Ok(Tensor::from_i64(DType::I64, vec![HEADER], h))
}

/// (tag, dtype, shape) of a header.
fn decode_header(h: &Tensor) -> Option<(Tag, DType, Vec<usize>)> {
    let v = h.as_i64()?;
    if v.len() != HEADER {
        return None;
    }
    let n = usize::try_from(v[6]).ok().filter(|&n| n <= MAX_DIMS)?;
    let tag = Tag {
        from: u32::try_from(v[0]).ok()?,
        to: u32::try_from(v[1]).ok()?,
        channel: v[2],
        micro_batch: u32::try_from(v[3]).ok()?,
        step: v[4] as u64,
    };
    let dtype = *DType::ALL.get(usize::try_from(v[5]).ok()?)?;
    let shape = v[7..7 + n]
        .iter()
        .map(|&d| usize::try_from(d).ok())
        .collect::<Option<Vec<_>>>()?;
    Some((tag, dtype, shape))
}

impl Framed<'_> {
    /// The message `tag` from `from_rank`: kept from before, or read off the link after the
    /// ones that came first (see the module comment).
    fn message(
        &mut self,
        from_rank: usize,
        tag: Tag,
        timeout: Duration,
    ) -> Result<Message, TransportError> {
        if let Some(m) = self.state.early.remove(&(from_rank, tag)) {
            return Ok(m);
        }
        let me = self.inner.rank();
        let start = Instant::now();
        let deadline = start + timeout;
        let timed_out = || TransportError::Timeout {
            tag,
            waited: start.elapsed(),
        };
        loop {
            let seq = *self.state.read.get(&from_rank).unwrap_or(&0);
            let left = deadline.saturating_duration_since(Instant::now());
            let h = match self.inner.recv(
                from_rank,
                header_tag(from_rank, me, seq),
                &header_type(),
                left,
            ) {
                Ok(h) => h,
                Err(TransportError::Timeout { .. }) => return Err(timed_out()),
                Err(e) => return Err(e),
            };
            *self.state.read.entry(from_rank).or_insert(0) += 1;
            let (got, dtype, shape) = decode_header(&h).ok_or_else(|| {
                TransportError::Failed(format!(
                    "waiting for {tag}: rank {from_rank} sent a malformed header (message {seq})"
                ))
            })?;
            let len = shape
                .iter()
                .try_fold(dtype.size_bytes(), |a, &d| a.checked_mul(d))
                .ok_or_else(|| {
                    TransportError::Failed(format!("{got}: a shape of {shape:?} is too large"))
                })?;
            let inner = &*self.inner;
            let stopped = || inner.aborted();
            let Some(bytes) = self.link.recv(from_rank, len, deadline, &stopped)? else {
                return Err(timed_out());
            };
            if bytes.len() != len {
                return Err(TransportError::Failed(format!(
                    "{got}: {} bytes came over {}, {len} expected",
                    bytes.len(),
                    self.link.describe()
                )));
            }
            self.state.traffic.received += 1;
            self.state.traffic.received_bytes += len as u64;
            let m = Message {
                dtype,
                shape,
                bytes,
            };
            if got == tag {
                return Ok(m);
            }
            self.state.early.insert((from_rank, got), m);
        }
    }
}

impl Transport for Framed<'_> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    fn size(&self) -> usize {
        self.inner.size()
    }

    fn send(&mut self, to_rank: usize, tag: Tag, t: Tensor) -> Result<(), TransportError> {
        if !self.link.sends_to(to_rank) {
            return self.inner.send(to_rank, tag, t);
        }
        let bytes = crate::native::tensor_bytes(&t);
        self.send_bytes(to_rank, tag, t.dtype, &t.shape, &bytes)
    }

    fn send_bytes(
        &mut self,
        to_rank: usize,
        tag: Tag,
        dtype: DType,
        shape: &[usize],
        bytes: &[u8],
    ) -> Result<(), TransportError> {
        if !self.link.sends_to(to_rank) {
            let t = tensor_of_bytes(&tag, dtype, shape, bytes)?;
            return self.inner.send(to_rank, tag, t);
        }
        let header = encode_header(&tag, dtype, shape)?;
        self.link.send(to_rank, bytes)?;
        self.state.traffic.sent += 1;
        self.state.traffic.sent_bytes += bytes.len() as u64;
        let me = self.inner.rank();
        let seq = self.state.sent.entry(to_rank).or_insert(0);
        let h = header_tag(me, to_rank, *seq);
        *seq += 1;
        self.inner.send(to_rank, h, header)
    }

    fn recv(
        &mut self,
        from_rank: usize,
        tag: Tag,
        ty: &TensorType,
        timeout: Duration,
    ) -> Result<Tensor, TransportError> {
        if !self.link.receives_from(from_rank) {
            return self.inner.recv(from_rank, tag, ty, timeout);
        }
        let m = self.message(from_rank, tag, timeout)?;
        let t = tensor_of_bytes(&tag, m.dtype, &m.shape, &m.bytes.to_vec()?)?;
        check_type(&tag, &t, ty)?;
        Ok(t)
    }

    fn recv_bytes(
        &mut self,
        from_rank: usize,
        tag: Tag,
        ty: &TensorType,
        timeout: Duration,
        out: &mut [u8],
    ) -> Result<(), TransportError> {
        if !self.link.receives_from(from_rank) {
            let t = self.inner.recv(from_rank, tag, ty, timeout)?;
            return tensor_into(&tag, &t, out);
        }
        let m = self.message(from_rank, tag, timeout)?;
        check_parts(&tag, m.dtype, &m.shape, ty)?;
        if m.bytes.len() != out.len() {
            return Err(TransportError::Failed(format!(
                "{tag}: received {} bytes, the receiving buffer has {}",
                m.bytes.len(),
                out.len()
            )));
        }
        m.bytes
            .copy_to(out)
            .map_err(|e| TransportError::Failed(format!("{tag}: {e}")))
    }

    fn aborted(&self) -> Option<String> {
        self.inner.aborted()
    }

    fn abort(&mut self, reason: &str) {
        self.link.abort();
        self.inner.abort(reason);
    }

    fn barrier(&mut self) -> Result<(), TransportError> {
        self.inner.barrier()
    }

    fn all_reduce_start(
        &mut self,
        ranks: &[usize],
        channel: i64,
        step: u64,
        t: Tensor,
    ) -> Result<PendingReduce, TransportError> {
        self.inner.all_reduce_start(ranks, channel, step, t)
    }

    fn all_reduce_finish(
        &mut self,
        p: PendingReduce,
        timeout: Duration,
    ) -> Result<Tensor, TransportError> {
        self.inner.all_reduce_finish(p, timeout)
    }

    fn reduce_scatter_start(
        &mut self,
        ranks: &[usize],
        channel: i64,
        step: u64,
        t: Tensor,
    ) -> Result<PendingReduce, TransportError> {
        self.inner.reduce_scatter_start(ranks, channel, step, t)
    }

    fn reduce_scatter_finish(
        &mut self,
        p: PendingReduce,
        timeout: Duration,
    ) -> Result<Tensor, TransportError> {
        self.inner.reduce_scatter_finish(p, timeout)
    }

    fn all_gather(
        &mut self,
        ranks: &[usize],
        channel: i64,
        step: u64,
        t: Tensor,
        timeout: Duration,
    ) -> Result<Vec<Tensor>, TransportError> {
        self.inner.all_gather(ranks, channel, step, t, timeout)
    }
}

/// A [`Link`] through memory shared by the threads of one process: what the framing is
/// tested with, and what `ppcc run --test-link` runs a plan over to check it on machines
/// without GPUs. Ordered per (sender, receiver), no tags, sends that never wait, as
/// NCCL's point-to-point operations.
pub struct MemoryLink {
    me: usize,
    to: std::collections::HashSet<usize>,
    from: std::collections::HashSet<usize>,
    pipes: std::sync::Arc<Pipes>,
}

/// The bytes in flight from each sender to each receiver.
type Queues = HashMap<(usize, usize), std::collections::VecDeque<Vec<u8>>>;

/// The queues of a set of [`MemoryLink`]s.
#[derive(Default)]
pub struct Pipes {
    queues: std::sync::Mutex<Queues>,
    arrived: std::sync::Condvar,
}

impl MemoryLink {
    /// Rank `me`'s link to `to` and from `from`, over `pipes`.
    pub fn new(me: usize, to: &[usize], from: &[usize], pipes: std::sync::Arc<Pipes>) -> Self {
        MemoryLink {
            me,
            to: to.iter().copied().collect(),
            from: from.iter().copied().collect(),
            pipes,
        }
    }
}

impl Link for MemoryLink {
    fn describe(&self) -> String {
        format!("the in-memory link of rank {}", self.me)
    }

    fn sends_to(&self, rank: usize) -> bool {
        self.to.contains(&rank)
    }

    fn receives_from(&self, rank: usize) -> bool {
        self.from.contains(&rank)
    }

    fn send(&mut self, to: usize, bytes: &[u8]) -> Result<(), TransportError> {
        let mut q = self
            .pipes
            .queues
            .lock()
            .map_err(|_| TransportError::Failed("the in-memory link is poisoned".into()))?;
        q.entry((self.me, to))
            .or_default()
            .push_back(bytes.to_vec());
        self.pipes.arrived.notify_all();
        Ok(())
    }

    fn recv(
        &mut self,
        from: usize,
        _len: usize,
        deadline: Instant,
        stopped: &dyn Fn() -> Option<String>,
    ) -> Result<Option<Box<dyn Held>>, TransportError> {
        let poisoned = |_| TransportError::Failed("the in-memory link is poisoned".into());
        let mut q = self.pipes.queues.lock().map_err(poisoned)?;
        loop {
            if let Some(b) = q.get_mut(&(from, self.me)).and_then(|v| v.pop_front()) {
                return Ok(Some(Box::new(b)));
            }
            if let Some(reason) = stopped() {
                return Err(TransportError::Aborted(reason));
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            let slice = (deadline - now).min(Duration::from_millis(50));
            q = self
                .pipes
                .arrived
                .wait_timeout(q, slice)
                .map_err(|_| TransportError::Failed("the in-memory link is poisoned".into()))?
                .0;
        }
    }

    fn abort(&mut self) {}
}

#[cfg(test)]
mod tests;
