//! Moving tensors between pipeline stages.
//!
//! A [`Transport`] is one device's (rank's) endpoint: it sends a tensor to the rank that
//! hosts another stage and receives what another stage sent. Messages are addressed by a
//! [`Tag`]: the virtual stages at both ends, the `channel` of the `send`/`recv` pair
//! (unique in the program), the micro-batch and the step, so messages that arrive early or
//! out of order are kept until asked for.
//!
//! - [`local::LocalNet`]: every rank a thread of this process; one mailbox per rank
//!   (a mutex-protected map and a condition variable). No setup.
//! - `mpi` (feature `mpi`): one process per rank under `mpirun`, point-to-point MPI.
//!   `mpi::MpiTransport::init()` gives this process's endpoint (see `src/bin/mpi_pingpong.rs`).
//! - [`framed::Framed`]: either of those with the tensors' bytes moved over a [`framed::Link`]
//!   instead — NCCL between GPUs ([`nccl::NcclLink`], `ppcc run --nccl`) — and only small
//!   headers over the transport.
//!
//! Sends never block (the sender's buffer is handed over), so communication overlaps the
//! sender's next compute. A receive waits at most its timeout, and gives up early when
//! another rank has failed ([`Transport::abort`]), naming what it waited for.

pub mod framed;
pub mod local;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod nccl;

use std::time::Duration;

use ppir::{Tensor, TensorType};

/// Identifies one message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tag {
    /// Virtual stage of the sender.
    pub from: u32,
    /// Virtual stage of the receiver.
    pub to: u32,
    /// The `channel` attribute of the send/recv pair.
    pub channel: i64,
    pub micro_batch: u32,
    pub step: u64,
}

impl std::fmt::Display for Tag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "channel {} from stage {} to stage {} (step {}, micro-batch {})",
            self.channel, self.from, self.to, self.step, self.micro_batch
        )
    }
}

/// Why a transfer failed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum TransportError {
    /// Nothing arrived within the timeout.
    #[error("timed out after {:.1} s waiting for {tag}", .waited.as_secs_f64())]
    Timeout { tag: Tag, waited: Duration },
    /// Another rank failed; this one stops.
    #[error("stopped: {0}")]
    Aborted(String),
    /// The message is not what the receiver expects, or the transport itself failed.
    #[error("{0}")]
    Failed(String),
}

/// One rank's endpoint.
pub trait Transport: Send {
    /// This endpoint's rank.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn size(&self) -> usize;
    /// Send `t` to the rank hosting `tag.to` (`to_rank`); does not wait for the receiver.
    fn send(&mut self, to_rank: usize, tag: Tag, t: Tensor) -> Result<(), TransportError>;
    /// Receive the message `tag` from `from_rank`, of type `ty` (static shape), waiting
    /// at most `timeout`.
    fn recv(
        &mut self,
        from_rank: usize,
        tag: Tag,
        ty: &TensorType,
        timeout: Duration,
    ) -> Result<Tensor, TransportError>;
    /// [`Transport::send`] of a tensor given as its dense native bytes (a stage function's
    /// buffer: GPU memory in a CUDA plan). This default decodes them and sends the tensor;
    /// a transport that moves bytes ([`framed::Framed`]) overrides it.
    fn send_bytes(
        &mut self,
        to_rank: usize,
        tag: Tag,
        dtype: ppir::DType,
        shape: &[usize],
        bytes: &[u8],
    ) -> Result<(), TransportError> {
        self.send(to_rank, tag, tensor_of_bytes(&tag, dtype, shape, bytes)?)
    }
    /// [`Transport::recv`] into `out`, the dense native bytes of a tensor of the static type
    /// `ty`. This default receives the tensor and encodes it.
    fn recv_bytes(
        &mut self,
        from_rank: usize,
        tag: Tag,
        ty: &TensorType,
        timeout: Duration,
        out: &mut [u8],
    ) -> Result<(), TransportError> {
        let t = self.recv(from_rank, tag, ty, timeout)?;
        tensor_into(&tag, &t, out)
    }
    /// Why the run stopped, if another rank has aborted it — checked without waiting, by
    /// whoever waits on something else than this transport (a GPU link). This default
    /// knows nothing (an MPI abort ends the processes instead).
    fn aborted(&self) -> Option<String> {
        None
    }
    /// Tell every rank to stop (their pending and later receives fail with
    /// [`TransportError::Aborted`] carrying `reason`).
    fn abort(&mut self, reason: &str);
    /// Wait until every rank has called `barrier` (used around checkpoints).
    fn barrier(&mut self) -> Result<(), TransportError>;
    /// The elementwise sum of `t` over `ranks` (ascending, this rank among them), which all
    /// call it with the same `channel` and `step`: summed in f64 in rank order and rounded
    /// once to the dtype, so every rank gets the same bits. [`Transport::all_reduce_start`]
    /// then [`Transport::all_reduce_finish`].
    fn all_reduce(
        &mut self,
        ranks: &[usize],
        channel: i64,
        step: u64,
        t: Tensor,
        timeout: Duration,
    ) -> Result<Tensor, TransportError> {
        let p = self.all_reduce_start(ranks, channel, step, t)?;
        self.all_reduce_finish(p, timeout)
    }

    /// Start an all-reduce (see [`Transport::all_reduce`]) and return at once, so that the
    /// caller computes while the parts travel. Every rank of a group must start the
    /// group's all-reduces in the same order. This default sends this rank's part to the
    /// first rank over [`Transport::send`] (tags with micro-batch [`COLLECTIVE`] and ranks
    /// for stages); a transport with its own collectives overrides both halves.
    fn all_reduce_start(
        &mut self,
        ranks: &[usize],
        channel: i64,
        step: u64,
        t: Tensor,
    ) -> Result<PendingReduce, TransportError> {
        let me = self.rank();
        if !ranks.contains(&me) {
            return Err(TransportError::Failed(format!(
                "all-reduce on channel {channel}: rank {me} is not one of ranks {ranks:?}"
            )));
        }
        let ty = TensorType::of(
            t.dtype,
            &t.shape.iter().map(|&d| d as u64).collect::<Vec<_>>(),
        );
        let root = ranks[0];
        let mut part = Some(t);
        if me != root {
            if let Some(t) = part.take() {
                self.send(root, collective_tag(channel, step, me, root), t)?;
            }
        }
        Ok(PendingReduce {
            ranks: ranks.to_vec(),
            channel,
            step,
            ty,
            part,
            handle: None,
        })
    }

    /// Wait for an all-reduce this rank started and return the sum.
    fn all_reduce_finish(
        &mut self,
        p: PendingReduce,
        timeout: Duration,
    ) -> Result<Tensor, TransportError> {
        let me = self.rank();
        let (channel, step) = (p.channel, p.step);
        let Some(&root) = p.ranks.first() else {
            return p
                .part
                .ok_or_else(|| TransportError::Failed("an empty all-reduce".into()));
        };
        if me != root {
            return self.recv(
                root,
                collective_tag(channel, step, root, me),
                &p.ty,
                timeout,
            );
        }
        let mut parts = vec![p
            .part
            .ok_or_else(|| TransportError::Failed("the root's part is missing".into()))?];
        for &r in &p.ranks[1..] {
            parts.push(self.recv(r, collective_tag(channel, step, r, root), &p.ty, timeout)?);
        }
        let sum = sum_parts(&parts)
            .map_err(|m| TransportError::Failed(format!("all-reduce on channel {channel}: {m}")))?;
        for &r in &p.ranks[1..] {
            self.send(r, collective_tag(channel, step, root, r), sum.clone())?;
        }
        Ok(sum)
    }

    /// Start a reduce-scatter (ZeRO-1): like [`Transport::all_reduce_start`], but each rank
    /// gets only its shard of the sum (see [`ppir::shard`]: the `i`-th rank of `ranks`
    /// gets shard `i`). This default all-reduces and keeps the shard; a transport with its
    /// own collectives overrides both halves.
    fn reduce_scatter_start(
        &mut self,
        ranks: &[usize],
        channel: i64,
        step: u64,
        t: Tensor,
    ) -> Result<PendingReduce, TransportError> {
        self.all_reduce_start(ranks, channel, step, t)
    }

    /// Wait for a reduce-scatter this rank started and return its shard of the sum.
    fn reduce_scatter_finish(
        &mut self,
        p: PendingReduce,
        timeout: Duration,
    ) -> Result<Tensor, TransportError> {
        let me = self.rank();
        let ranks = p.ranks.clone();
        let index = ranks.iter().position(|&r| r == me).ok_or_else(|| {
            TransportError::Failed(format!(
                "reduce-scatter on channel {}: rank {me} is not one of ranks {ranks:?}",
                p.channel
            ))
        })?;
        let channel = p.channel;
        let sum = self.all_reduce_finish(p, timeout)?;
        ppir::shard::shard_of(&sum, ranks.len(), index).map_err(|m| {
            TransportError::Failed(format!("reduce-scatter on channel {channel}: {m}"))
        })
    }

    /// Every rank's `t` (same type on all), in the order of `ranks` (ascending, this rank
    /// among them), which all call it with the same `channel` and `step`. This default
    /// gathers the parts on the first rank, which sends them all, stacked, to the others.
    fn all_gather(
        &mut self,
        ranks: &[usize],
        channel: i64,
        step: u64,
        t: Tensor,
        timeout: Duration,
    ) -> Result<Vec<Tensor>, TransportError> {
        let me = self.rank();
        let Some(&root) = ranks.first() else {
            return Ok(vec![t]);
        };
        if !ranks.contains(&me) {
            return Err(TransportError::Failed(format!(
                "all-gather on channel {channel}: rank {me} is not one of ranks {ranks:?}"
            )));
        }
        let ty = t.tensor_type();
        let n = ranks.len();
        let mut stacked_dims = vec![n as u64];
        stacked_dims.extend(t.shape.iter().map(|&d| d as u64));
        let stacked_ty = TensorType::of(t.dtype, &stacked_dims);
        if me != root {
            self.send(root, collective_tag(channel, step, me, root), t)?;
            let s = self.recv(
                root,
                collective_tag(channel, step, root, me),
                &stacked_ty,
                timeout,
            )?;
            return Ok(unstack(&s));
        }
        let mut parts = vec![t];
        for &r in &ranks[1..] {
            parts.push(self.recv(r, collective_tag(channel, step, r, root), &ty, timeout)?);
        }
        let stacked = stack(&parts);
        for &r in &ranks[1..] {
            self.send(r, collective_tag(channel, step, root, r), stacked.clone())?;
        }
        Ok(parts)
    }
}

/// An all-reduce started by [`Transport::all_reduce_start`], to be finished by the same
/// transport.
pub struct PendingReduce {
    pub ranks: Vec<usize>,
    pub channel: i64,
    pub step: u64,
    /// The type of the parts and the sum.
    pub ty: TensorType,
    /// This rank's part, while the transport still needs it.
    pub part: Option<Tensor>,
    /// The transport's own state of the operation (an MPI request and its buffers).
    pub handle: Option<Box<dyn std::any::Any + Send>>,
}

/// The tag of a collective's message from rank `from` to rank `to`.
fn collective_tag(channel: i64, step: u64, from: usize, to: usize) -> Tag {
    Tag {
        from: from as u32,
        to: to as u32,
        channel,
        micro_batch: COLLECTIVE,
        step,
    }
}

/// `parts` (same type) stacked along a new first axis.
pub(crate) fn stack(parts: &[Tensor]) -> Tensor {
    use ppir::TensorData;
    let (dtype, shape) = parts
        .first()
        .map_or((ppir::DType::F32, vec![]), |p| (p.dtype, p.shape.clone()));
    let data = match parts.first().map(|p| &p.data) {
        Some(TensorData::Int(_)) => TensorData::Int(
            parts
                .iter()
                .flat_map(|p| match &p.data {
                    TensorData::Int(v) => v.clone(),
                    TensorData::Float(_) => vec![],
                })
                .collect(),
        ),
        _ => TensorData::Float(
            parts
                .iter()
                .flat_map(|p| match &p.data {
                    TensorData::Float(v) => v.clone(),
                    TensorData::Int(_) => vec![],
                })
                .collect(),
        ),
    };
    Tensor {
        dtype,
        shape: std::iter::once(parts.len()).chain(shape).collect(),
        data,
    }
}

/// The tensors stacked along the first axis of `s` (the inverse of [`stack`]).
pub(crate) fn unstack(s: &Tensor) -> Vec<Tensor> {
    use ppir::TensorData;
    let n = s.shape.first().copied().unwrap_or(0);
    let shape = s.shape.get(1..).unwrap_or(&[]).to_vec();
    let k = shape.iter().product::<usize>();
    (0..n)
        .map(|i| {
            let data = match &s.data {
                TensorData::Float(v) => TensorData::Float(v[i * k..(i + 1) * k].to_vec()),
                TensorData::Int(v) => TensorData::Int(v[i * k..(i + 1) * k].to_vec()),
            };
            Tensor {
                dtype: s.dtype,
                shape: shape.clone(),
                data,
            }
        })
        .collect()
}

/// The micro-batch of a collective's messages (no pipeline message has it).
pub const COLLECTIVE: u32 = u32::MAX;

/// The elementwise sum of same-typed tensors, in f64 in order, rounded once to the dtype.
pub fn sum_parts(parts: &[Tensor]) -> Result<Tensor, String> {
    use ppir::TensorData;
    let Some(first) = parts.first() else {
        return Err("nothing to sum".into());
    };
    for p in &parts[1..] {
        if p.dtype != first.dtype || p.shape != first.shape {
            return Err(format!(
                "parts of different types: {} {:?} and {} {:?}",
                first.dtype, first.shape, p.dtype, p.shape
            ));
        }
    }
    let d = first.dtype;
    let mut out = first.clone();
    match &mut out.data {
        TensorData::Float(v) => {
            // f64 sums in order, rounded once to the dtype.
            for p in &parts[1..] {
                for (x, y) in v.iter_mut().zip(p.to_f64_vec()) {
                    *x += y;
                }
            }
            for x in v.iter_mut() {
                *x = ppir::tensor::round_to(d, *x);
            }
        }
        TensorData::Int(v) => {
            // Integers add exactly (wrapping as the dtype's arithmetic does in i64).
            for p in &parts[1..] {
                if let TensorData::Int(w) = &p.data {
                    for (x, &y) in v.iter_mut().zip(w) {
                        *x = x.wrapping_add(y);
                    }
                }
            }
        }
    }
    Ok(out)
}

/// The tensor of `dtype` and `shape` whose dense native bytes are `bytes` (message `tag`).
pub(crate) fn tensor_of_bytes(
    tag: &Tag,
    dtype: ppir::DType,
    shape: &[usize],
    bytes: &[u8],
) -> Result<Tensor, TransportError> {
    crate::native::tensor_from_bytes(bytes, dtype, shape).ok_or_else(|| {
        TransportError::Failed(format!(
            "{tag}: {} bytes do not hold a {dtype} tensor of shape {shape:?}",
            bytes.len()
        ))
    })
}

/// `t`'s dense native bytes written to `out`, which must have their length (message `tag`).
pub(crate) fn tensor_into(tag: &Tag, t: &Tensor, out: &mut [u8]) -> Result<(), TransportError> {
    let b = crate::native::tensor_bytes(t);
    if b.len() != out.len() {
        return Err(TransportError::Failed(format!(
            "{tag}: received {} bytes, the receiving buffer has {}",
            b.len(),
            out.len()
        )));
    }
    out.copy_from_slice(&b);
    Ok(())
}

/// Check that a received tensor has the receiver's dtype, rank and every known dimension.
pub(crate) fn check_type(tag: &Tag, t: &Tensor, ty: &TensorType) -> Result<(), TransportError> {
    check_parts(tag, t.dtype, &t.shape, ty)
}

/// [`check_type`] of a message known by its dtype and shape.
pub(crate) fn check_parts(
    tag: &Tag,
    dtype: ppir::DType,
    shape: &[usize],
    ty: &TensorType,
) -> Result<(), TransportError> {
    let same_dims = shape.len() == ty.dims.len()
        && shape
            .iter()
            .zip(&ty.dims)
            .all(|(&n, d)| d.known().is_none_or(|k| k == n as u64));
    if dtype != ty.dtype || !same_dims {
        return Err(TransportError::Failed(format!(
            "{tag}: received {dtype:?} {shape:?}, expected {ty}"
        )));
    }
    Ok(())
}
