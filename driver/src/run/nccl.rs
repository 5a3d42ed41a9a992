//! `ppcc run --nccl`: each worker's NCCL link to the ranks its stages exchange tensors
//! with, joined before the first step (see `ppcc_runtime::transport::nccl`); and
//! `--test-link`, the same framing over an in-memory link, which checks everything but
//! NCCL itself on machines without GPUs.

use std::collections::BTreeSet;
use std::time::Duration;

use ppcc_runtime::pipeline::{LinkSlot, PlanSpec, RankWorker};
use ppcc_runtime::transport::framed::{MemoryLink, Pipes};
use ppcc_runtime::transport::nccl::NcclLink;
use ppcc_runtime::transport::Transport;
use ppir::ops::attrs::CommAttrs;
use ppir::ops::OpAttrs;
use ppir::OpKind;

use super::{load_module, Driver};
use crate::error::{bail, invalid, Context, Result};

/// The ranks worker `w` sends to and receives from: the peers of its stages' send and
/// recv ops, in its replica.
fn peers(plan: &PlanSpec, w: &RankWorker) -> Result<(Vec<usize>, Vec<usize>)> {
    let (mut to, mut from) = (BTreeSet::new(), BTreeSet::new());
    for st in &w.stages {
        let s = st.spec.stage as usize;
        let m = load_module(plan, s)?;
        for f in &m.functions {
            for &id in f.ops() {
                let op = f.op(id);
                let set = match op.kind {
                    OpKind::Send => &mut to,
                    OpKind::Recv => &mut from,
                    _ => continue,
                };
                let a = CommAttrs::of(&op.attrs)
                    .map_err(|e| invalid!("stage {s}, @{}: {e}", f.name))?;
                let peer = u32::try_from(a.peer).ok();
                let Some(r) = peer.and_then(|p| w.config.rank(w.config.replica, p)) else {
                    bail!(
                        "stage {s}, @{}: a {} names stage {}, which the plan does not have",
                        f.name,
                        op.kind.name(),
                        a.peer
                    );
                };
                if r != w.rank {
                    set.insert(r);
                }
            }
        }
    }
    Ok((to.into_iter().collect(), from.into_iter().collect()))
}

/// Give every worker (threads only) a [`MemoryLink`] to the ranks its stages exchange
/// tensors with.
pub(super) fn memory_links(plan: &PlanSpec, workers: &mut [RankWorker]) -> Result<()> {
    let pipes = std::sync::Arc::new(Pipes::default());
    for w in workers.iter_mut() {
        let (to, from) = peers(plan, w)?;
        w.link = Some(LinkSlot {
            link: Box::new(MemoryLink::new(w.rank, &to, &from, pipes.clone())),
            state: Default::default(),
        });
    }
    Ok(())
}

/// Join every worker's NCCL link (threads: all at once, as the joins pair them up; MPI:
/// this process's one) and install it.
pub(super) fn connect(
    plan: &PlanSpec,
    driver: &mut Driver,
    workers: &mut [RankWorker],
    timeout: Duration,
) -> Result<()> {
    let mut jobs = vec![];
    for w in workers.iter() {
        let device = w
            .stages
            .iter()
            .find_map(|s| s.exec.gpu_device())
            .with_context(|| {
                format!(
                    "--nccl: device {} runs no CUDA module (the plan must be compiled with --target cuda)",
                    w.rank
                )
            })?;
        let (to, from) = peers(plan, w)?;
        jobs.push((w.rank, device, to, from));
    }
    let links = match driver {
        Driver::Local(net) => {
            // NCCL refuses two ranks of one communicator on one GPU; say it plainly.
            let mut seen = std::collections::BTreeMap::new();
            for (rank, device, _, _) in &jobs {
                if let Some(other) = seen.insert(device.ordinal, *rank) {
                    bail!(
                        "--nccl needs one GPU per device, and devices {other} and {rank} would share GPU {} ({} devices, {} GPUs here): run without --nccl, or on a machine with more GPUs",
                        device.ordinal,
                        jobs.len(),
                        ppcc_runtime::gpu::device_count().unwrap_or(0)
                    );
                }
            }
            let handles: Vec<_> = jobs
                .into_iter()
                .map(|(rank, device, to, from)| {
                    let net = net.clone();
                    std::thread::Builder::new()
                        .name(format!("nccl-setup-{rank}"))
                        .spawn(move || {
                            let mut ep = net.endpoint(rank);
                            let r = NcclLink::connect(device, rank, &to, &from, &mut ep, timeout);
                            if let Err(e) = &r {
                                ep.abort(&format!("device {rank}: NCCL set-up failed: {e}"));
                            }
                            r
                        })
                        .context("--nccl: a set-up thread could not start")
                })
                .collect::<Result<_>>()?;
            let mut links = vec![];
            let mut first_error = None;
            for h in handles {
                match h.join() {
                    Ok(Ok(l)) => links.push(l),
                    Ok(Err(e)) => {
                        first_error.get_or_insert(e.to_string());
                    }
                    Err(_) => {
                        first_error.get_or_insert("an NCCL set-up thread panicked".into());
                    }
                }
            }
            if let Some(e) = first_error {
                bail!("--nccl: {e}");
            }
            links
        }
        #[cfg(feature = "mpi")]
        Driver::Mpi(t) => {
            let mut links = vec![];
            for (rank, device, to, from) in jobs {
                match NcclLink::connect(device, rank, &to, &from, t.as_mut(), timeout) {
                    Ok(l) => links.push(l),
                    Err(e) => {
                        let msg = format!("device {rank}: NCCL set-up failed: {e}");
                        t.abort(&msg);
                        bail!("--nccl: {msg}");
                    }
                }
            }
            links
        }
    };
    for (w, link) in workers.iter_mut().zip(links) {
        w.link = Some(LinkSlot {
            link: Box::new(link),
            state: Default::default(),
        });
    }
    Ok(())
}
