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
//!
//! Sends never block (the sender's buffer is handed over), so communication overlaps the
//! sender's next compute. A receive waits at most its timeout, and gives up early when
//! another rank has failed ([`Transport::abort`]), naming what it waited for.

pub mod local;
#[cfg(feature = "mpi")]
pub mod mpi;

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
    /// Tell every rank to stop (their pending and later receives fail with
    /// [`TransportError::Aborted`] carrying `reason`).
    fn abort(&mut self, reason: &str);
    /// Wait until every rank has called `barrier` (used around checkpoints).
    fn barrier(&mut self) -> Result<(), TransportError>;
}

/// Check that a received tensor has the receiver's dtype, rank and every known dimension.
pub(crate) fn check_type(tag: &Tag, t: &Tensor, ty: &TensorType) -> Result<(), TransportError> {
    let same_dims = t.shape.len() == ty.dims.len()
        && t.shape
            .iter()
            .zip(&ty.dims)
            .all(|(&n, d)| d.known().is_none_or(|k| k == n as u64));
    if t.dtype != ty.dtype || !same_dims {
        return Err(TransportError::Failed(format!(
            "{tag}: received {:?} {:?}, expected {ty}",
            t.dtype, t.shape
        )));
    }
    Ok(())
}
