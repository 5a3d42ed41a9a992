//! The MPI transport under a real `mpirun` (feature `mpi`; needs Open MPI's `mpirun` on
//! the PATH: Debian's `openmpi-bin`). Each test runs the `mpi_pingpong` binary:
//!
//! ```text
//! mpirun --oversubscribe --allow-run-as-root --bind-to none -np N mpi_pingpong MODE
//! ```
#![cfg(feature = "mpi")]

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    took: Duration,
}

/// Run `mpi_pingpong MODE` on `np` ranks; kill mpirun after `deadline`.
fn mpirun(np: usize, mode: &str, deadline: Duration) -> Run {
    let start = Instant::now();
    let mut child = Command::new("mpirun")
        .args([
            "--oversubscribe",
            "--allow-run-as-root",
            "--bind-to",
            "none",
        ])
        .args(["-np", &np.to_string()])
        .arg(env!("CARGO_BIN_EXE_mpi_pingpong"))
        .arg(mode)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot run mpirun (install openmpi-bin: scripts/setup.sh)");
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for mpirun") {
            break Some(status);
        }
        if start.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = start.elapsed();
    let stdout = out.join().unwrap();
    let stderr = err.join().unwrap();
    let Some(status) = status else {
        panic!(
            "mpirun {mode} still running after {deadline:?}\nstdout:\n{stdout}\nstderr:\n{stderr}"
        );
    };
    Run {
        code: status.code(),
        stdout,
        stderr,
        took,
    }
}

fn assert_ok(np: usize, mode: &str) {
    let r = mpirun(np, mode, Duration::from_secs(120));
    assert_eq!(
        r.code,
        Some(0),
        "mpirun -np {np} {mode} failed\nstdout:\n{}\nstderr:\n{}",
        r.stdout,
        r.stderr
    );
    for rank in 0..np {
        assert!(
            r.stdout.contains(&format!("rank {rank} ok")),
            "rank {rank} did not finish\nstdout:\n{}",
            r.stdout
        );
    }
}

#[test]
fn two_ranks_exchange_tensors_out_of_order() {
    assert_ok(2, "pingpong");
}

#[test]
fn three_ranks_in_a_ring() {
    assert_ok(3, "pingpong");
}

#[test]
fn tags_sharing_one_mpi_tag_are_told_apart() {
    assert_ok(2, "pingpong-collide");
}

/// The last rank fails while rank 0 waits (60 s timeout): the job must end, non-zero,
/// within 10 s.
fn assert_failure_stops_the_job(mode: &str, says: &str) {
    let r = mpirun(2, mode, Duration::from_secs(30));
    assert!(
        r.code != Some(0),
        "mpirun {mode} succeeded\nstderr:\n{}",
        r.stderr
    );
    assert!(
        r.took < Duration::from_secs(10),
        "mpirun {mode} took {:?}\nstderr:\n{}",
        r.took,
        r.stderr
    );
    assert!(
        r.stderr.contains(says),
        "mpirun {mode}: stderr lacks {says:?}:\n{}",
        r.stderr
    );
    assert!(
        !r.stderr.contains("the receive ended"),
        "rank 0's receive returned instead of the job being stopped:\n{}",
        r.stderr
    );
}

#[test]
fn abort_stops_every_rank() {
    assert_failure_stops_the_job("fail-abort", "aborts the run: rank failed on purpose");
}

#[test]
fn a_rank_exiting_without_finalising_stops_the_job() {
    assert_failure_stops_the_job("fail-exit", "exits without finalising MPI");
}

#[test]
fn a_panicking_rank_stops_the_job() {
    assert_failure_stops_the_job("fail-panic", "the rank panicked");
}

#[test]
fn a_rank_dropping_its_endpoint_stops_the_job() {
    assert_failure_stops_the_job("fail-return", "stopped without finishing");
}
