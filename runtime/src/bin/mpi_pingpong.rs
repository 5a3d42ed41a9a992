//! Self-test of the MPI transport; run under `mpirun` (tests/mpi.rs does):
//!
//! ```text
//! mpirun --oversubscribe --allow-run-as-root --bind-to none -np 2 mpi_pingpong MODE
//! ```
//!
//! Modes:
//! - `pingpong`: both ranks send each other tensors of several dtypes, shapes, steps and
//!   micro-batches (1 MiB ones among them) before receiving any, then receive them in the
//!   reverse order and check every value exactly; then a receive timeout, a type
//!   mismatch and a barrier. Prints `rank R ok` per rank. Any number of ranks (a ring).
//! - `pingpong-collide`: the same with every message under one MPI tag.
//! - `fail-abort` / `fail-exit` / `fail-panic` / `fail-return`: the last rank fails
//!   mid-run (calls `abort`, exits without finalising MPI, panics, or drops its endpoint
//!   without `finish` and returns an error) while the others wait in a receive with a
//!   60 s timeout; `mpirun` must end, non-zero, within seconds.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use ppcc_runtime::transport::mpi::MpiTransport;
use ppcc_runtime::transport::{Tag, Transport, TransportError};
use ppir::{DType, Tensor, TensorType};

const LONG: Duration = Duration::from_secs(60);

fn tag(from: usize, to: usize, channel: i64, micro_batch: u32, step: u64) -> Tag {
    Tag {
        from: from as u32,
        to: to as u32,
        channel,
        micro_batch,
        step,
    }
}

/// The tensor `sender` sends on (`channel`, `mb`, `step`): deterministic values.
fn payload(sender: usize, channel: i64, mb: u32, step: u64) -> Tensor {
    let base = (sender * 1_000_000 + step as usize * 100_000 + mb as usize * 1000) as f64;
    let floats = |n: usize| -> Vec<f64> { (0..n).map(|i| (base + i as f64) * 0.1).collect() };
    let ints = |n: usize| -> Vec<i64> { (0..n).map(|i| base as i64 * 7 - i as i64).collect() };
    match channel {
        10 => Tensor::from_f64(DType::F32, vec![2, 3], floats(6)),
        11 => Tensor::from_i64(DType::I64, vec![5], ints(5)),
        12 => Tensor::from_f64(DType::F32, vec![], floats(1)),
        13 => Tensor::from_f64(DType::BF16, vec![4], floats(4)),
        14 => Tensor::from_i64(DType::Bool, vec![3], vec![1, 0, (mb % 2) as i64]),
        15 => Tensor::from_f64(DType::F64, vec![2, 2], floats(4)),
        16 => Tensor::from_i64(DType::I32, vec![1, 3], ints(3)),
        17 => Tensor::from_i64(DType::I8, vec![4], vec![-128, 127, mb as i64, -1]),
        18 => Tensor::from_f64(DType::F16, vec![3], floats(3)),
        // 1 MiB: sent by rendezvous, not eagerly.
        19 => Tensor::from_f64(DType::F32, vec![256, 1024], floats(256 * 1024)),
        _ => unreachable!(),
    }
}

/// (channel, micro-batch, step) of every message each rank sends its successor.
fn messages() -> Vec<(i64, u32, u64)> {
    let mut v = Vec::new();
    for step in 0..2u64 {
        for mb in 0..4u32 {
            for channel in 10..=18 {
                v.push((channel, mb, step));
            }
            if mb < 2 {
                v.push((19, mb, step));
            }
        }
    }
    v
}

fn fail(t: &mut MpiTransport, message: String) -> ! {
    t.abort(&message);
    unreachable!("abort returned")
}

/// A check of the self-test that failed.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error("needs at least 2 ranks, got {0}")]
    TooFewRanks(usize),
    #[error("send: {0}")]
    Send(TransportError),
    #[error("recv: {0}")]
    Recv(TransportError),
    #[error("barrier: {0}")]
    Barrier(TransportError),
    #[error("sending took {0:?}: sends block")]
    SlowSends(Duration),
    #[error("channel {channel} micro-batch {mb} step {step}: received {got:?}, expected {want:?}")]
    Values {
        channel: i64,
        mb: u32,
        step: u64,
        got: Vec<f64>,
        want: Vec<f64>,
    },
    #[error("timeout: tag {tag}, waited {waited:?}, took {took:?}")]
    Timeout {
        tag: Tag,
        waited: Duration,
        took: Duration,
    },
    #[error("the timeout does not name the channel: {0}")]
    TimeoutText(String),
    #[error("expected a timeout, got {0}")]
    NoTimeout(String),
    #[error("expected a type mismatch, got {0}")]
    NoMismatch(String),
    #[error("rank 0 left the barrier after {0:?}, before the last rank entered it")]
    EarlyBarrier(Duration),
    #[error("{0} sends still pending after the barriers")]
    Pending(usize),
}

fn pingpong(t: &mut MpiTransport) -> Result<(), Failure> {
    let (rank, size) = (t.rank(), t.size());
    if size < 2 {
        return Err(Failure::TooFewRanks(size));
    }
    let next = (rank + 1) % size;
    let prev = (rank + size - 1) % size;
    let started = Instant::now();
    // Everything is sent before anything is received: a send that waited for its
    // receiver would deadlock here (the 1 MiB messages go by rendezvous).
    for (channel, mb, step) in messages() {
        t.send(
            next,
            tag(rank, next, channel, mb, step),
            payload(rank, channel, mb, step),
        )
        .map_err(Failure::Send)?;
    }
    let sent = started.elapsed();
    if sent > Duration::from_secs(5) {
        return Err(Failure::SlowSends(sent));
    }
    // Received in the reverse order of sending.
    for (channel, mb, step) in messages().into_iter().rev() {
        let want = payload(prev, channel, mb, step);
        let got = t
            .recv(
                prev,
                tag(prev, rank, channel, mb, step),
                &want.tensor_type(),
                Duration::from_secs(30),
            )
            .map_err(Failure::Recv)?;
        if got != want {
            return Err(Failure::Values {
                channel,
                mb,
                step,
                got: got.to_f64_vec()[..got.num_elements().min(8)].to_vec(),
                want: want.to_f64_vec()[..want.num_elements().min(8)].to_vec(),
            });
        }
    }

    // Nothing is sent on channel 99: the receive times out, naming the tag.
    let missing = tag(prev, rank, 99, 0, 0);
    let ty = TensorType::of(DType::F32, &[2]);
    let before = Instant::now();
    match t.recv(prev, missing, &ty, Duration::from_millis(300)) {
        Err(TransportError::Timeout { tag, waited }) => {
            let took = before.elapsed();
            if tag != missing
                || waited < Duration::from_millis(300)
                || took > Duration::from_secs(3)
            {
                return Err(Failure::Timeout { tag, waited, took });
            }
            let text = TransportError::Timeout { tag, waited }.to_string();
            if !text.contains("channel 99") {
                return Err(Failure::TimeoutText(text));
            }
        }
        other => return Err(Failure::NoTimeout(format!("{other:?}"))),
    }

    // A message of the wrong shape is refused.
    t.send(
        next,
        tag(rank, next, 50, 0, 0),
        Tensor::from_f32(vec![2], vec![1.0, 2.0]),
    )
    .map_err(Failure::Send)?;
    match t.recv(
        prev,
        tag(prev, rank, 50, 0, 0),
        &TensorType::of(DType::F32, &[3]),
        Duration::from_secs(30),
    ) {
        Err(TransportError::Failed(m)) if m.contains("expected") => {}
        other => return Err(Failure::NoMismatch(format!("{other:?}"))),
    }

    // The barrier waits for the slowest rank (the last sleeps 300 ms first).
    if rank == size - 1 {
        std::thread::sleep(Duration::from_millis(300));
    }
    let before = Instant::now();
    t.barrier().map_err(Failure::Barrier)?;
    let waited = before.elapsed();
    if rank == 0 && waited < Duration::from_millis(200) {
        return Err(Failure::EarlyBarrier(waited));
    }
    t.barrier().map_err(Failure::Barrier)?;
    let pending = t.pending_sends();
    if pending != 0 {
        return Err(Failure::Pending(pending));
    }
    println!(
        "rank {rank} ok: {} messages each way, {:.3} s",
        messages().len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The last rank fails after the first message; the others wait for a second one.
fn failing(mut t: MpiTransport, how: &str) -> ExitCode {
    let (rank, size) = (t.rank(), t.size());
    let last = size - 1;
    let ty = TensorType::of(DType::F32, &[1]);
    if rank == last {
        for to in 0..last {
            t.send(
                to,
                tag(last, to, 1, 0, 0),
                Tensor::from_f32(vec![1], vec![1.0]),
            )
            .expect("send");
        }
        std::thread::sleep(Duration::from_millis(300));
        match how {
            "fail-abort" => t.abort("rank failed on purpose"),
            "fail-exit" => {
                eprintln!("rank {rank} exits without finalising MPI");
                std::process::exit(3)
            }
            "fail-panic" => panic!("rank {rank} panics on purpose"),
            _ => {
                eprintln!("rank {rank} returns an error");
                drop(t);
                return ExitCode::from(3);
            }
        }
        unreachable!()
    }
    t.recv(last, tag(last, rank, 1, 0, 0), &ty, LONG)
        .expect("the first message");
    eprintln!("rank {rank} waits for a message that never comes");
    let r = t.recv(last, tag(last, rank, 2, 0, 0), &ty, LONG);
    eprintln!("rank {rank}: the receive ended: {r:?}");
    ExitCode::from(4)
}

fn main() -> ExitCode {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "pingpong".into());
    let mut t = match MpiTransport::init() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("mpi_pingpong: {e}");
            return ExitCode::FAILURE;
        }
    };
    match mode.as_str() {
        "pingpong" | "pingpong-collide" => {
            if mode == "pingpong-collide" {
                t = t.with_tag_bound(1);
            }
            if let Err(e) = pingpong(&mut t) {
                let rank = t.rank();
                fail(&mut t, format!("rank {rank}: {e}"));
            }
            match t.finish() {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("mpi_pingpong: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        m if m.starts_with("fail-") => failing(t, m),
        m => {
            eprintln!("mpi_pingpong: unknown mode {m}");
            let _ = t.finish();
            ExitCode::FAILURE
        }
    }
}
