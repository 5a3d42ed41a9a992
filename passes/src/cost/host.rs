//! The `host` profile: measured on this machine by a short micro-benchmark and cached.
//!
//! What is measured, and why:
//!
//! - `peak_flops.f32`: the reference interpreter's f32 matmul (`eval_op`), single-threaded:
//!   the code that executes stage functions today, not the machine's theoretical peak —
//!   the roofline needs the peak of the code that runs. Other dtypes fall back to it.
//! - `memory_bandwidth`: the interpreter's elementwise `add` over f32 arrays of 128K
//!   elements (the size of a micro-batch's activations, cache-resident), counted as the
//!   cost model counts it (2 reads + 1 write of 4-byte elements).
//! - `link_latency` / `link_bandwidth`: the local transport's path between two stage
//!   threads: half the round trip of a small message over a `std::sync::mpsc` channel, and
//!   a copy into a fresh buffer that is sent and read on the other side.
//! - `measure_ops`: on, so functions are costed by timing each of their ops with the
//!   interpreter ([`super::op_time_in`]); the roofline numbers above remain for ops that
//!   cannot be timed and for quick estimates.
//! - `memory_bytes`: `MemTotal` from `/proc/meminfo` (0 where unknown);
//!   `op_overhead`: the interpreter's time per op of a function of tiny ops
//!   (`run_function`: dispatch, argument binding, result checks).
//!
//! The full measurement takes well under 2 s; `quick` (for tests) uses small sizes and a
//! few milliseconds. The result is cached as JSON in `$XDG_CACHE_HOME/ppcc/host-profile.json`
//! (or `~/.cache/ppcc/...`), keyed by host name and CPU model: a cache written on another
//! machine is measured again.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ppir::interp::{eval_op, run_function, InterpOptions};
use ppir::{ArgKind, Attrs, DType, Function, NewOp, OpKind, Tensor, TensorType};
use serde_json::{Map, Value};

use super::profile::DeviceProfile;
use super::CostError;

/// What the profile measures; a cache written by another method is measured again.
const METHOD: &str = "interpreter-v2";

/// Where the host profile is cached: `$XDG_CACHE_HOME/ppcc/host-profile.json`, else
/// `$HOME/.cache/ppcc/host-profile.json`; `None` when neither variable is set.
pub fn host_cache_path() -> Option<PathBuf> {
    let base = match std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").filter(|v| !v.is_empty())?).join(".cache"),
    };
    Some(base.join("ppcc").join("host-profile.json"))
}

/// The cache key: (host name, CPU model string).
pub fn host_key() -> (String, String) {
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".into());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name") || l.starts_with("Model"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    (hostname, cpu)
}

/// The host profile from the cache when it was measured on this machine (same host name
/// and CPU model), else measured now and written to the cache. `refresh` measures anew
/// regardless. A cache that cannot be written is not an error (the profile is returned).
pub fn host_profile_cached(refresh: bool) -> Result<DeviceProfile, CostError> {
    match host_cache_path() {
        Some(path) => host_profile_cached_at(&path, refresh, false),
        None => Ok(measure_host(false)),
    }
}

/// [`host_profile_cached`] with the cache file at `path`; `quick` as in [`measure_host`].
pub fn host_profile_cached_at(
    path: &Path,
    refresh: bool,
    quick: bool,
) -> Result<DeviceProfile, CostError> {
    let (hostname, cpu) = host_key();
    if !refresh {
        if let Some(p) = read_cache(path, &hostname, &cpu)? {
            return Ok(p);
        }
    }
    let profile = measure_host(quick);
    // Best effort: a read-only home (or a profile that cannot be cached) must not stop
    // compilation.
    if let Ok(value) = profile.to_value() {
        let mut m = Map::new();
        m.insert("hostname".into(), hostname.into());
        m.insert("cpu_model".into(), cpu.into());
        m.insert("method".into(), METHOD.into());
        m.insert("profile".into(), value);
        if let Ok(text) = serde_json::to_string_pretty(&Value::Object(m)) {
            if let Some(dir) = path.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            let _ = std::fs::write(path, text);
        }
    }
    Ok(profile)
}

/// The cached profile if the file exists and its key matches; a file that does not parse
/// is treated as absent (it is rewritten), a profile in it that does not validate is an
/// error.
fn read_cache(path: &Path, hostname: &str, cpu: &str) -> Result<Option<DeviceProfile>, CostError> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Ok(None);
    };
    let Ok(v) = serde_json::from_str::<Value>(&text) else {
        return Ok(None);
    };
    let key_matches = v.get("hostname").and_then(Value::as_str) == Some(hostname)
        && v.get("cpu_model").and_then(Value::as_str) == Some(cpu)
        && v.get("method").and_then(Value::as_str) == Some(METHOD);
    match v.get("profile") {
        Some(p) if key_matches => Ok(Some(DeviceProfile::from_value(
            p,
            &path.display().to_string(),
        )?)),
        _ => Ok(None),
    }
}

/// Measure this machine (see the module documentation). `quick` uses tiny sizes (a few
/// milliseconds; the numbers are then rough, for tests), otherwise it takes well under 2 s.
pub fn measure_host(quick: bool) -> DeviceProfile {
    let (gemm_n, gemm_budget) = if quick {
        (64, Duration::from_millis(5))
    } else {
        (256, Duration::from_millis(300))
    };
    // Activations of a micro-batch are typically cache-sized: measure there.
    let (triad_len, triad_budget) = if quick {
        (1 << 14, Duration::from_millis(5))
    } else {
        (1 << 17, Duration::from_millis(300))
    };
    let (pings, copy_len, copies) = if quick {
        (50, 1 << 16, 4)
    } else {
        (2000, 1 << 22, 16)
    };
    let flops = gemm_flops(gemm_n, gemm_budget);
    let bandwidth = add_bandwidth(triad_len, triad_budget);
    let overhead = op_overhead(if quick { 20 } else { 2000 });
    let (latency, link_bw) = channel_link(pings, copy_len, copies);
    let (hostname, cpu) = host_key();
    DeviceProfile {
        name: "host".into(),
        description: format!("{cpu} on {hostname}"),
        source: format!(
            "measured by ppcc ({}): the interpreter's f32 matmul n={gemm_n}, add over {triad_len} f32 and per-op overhead; mpsc channel ping-pong and {copy_len}-f32 copies",
            if quick { "quick" } else { "full" }
        ),
        peak_flops: BTreeMap::from([("f32".to_string(), flops)]),
        memory_bandwidth: bandwidth,
        memory_bytes: mem_total().unwrap_or(0.0),
        link_bandwidth: link_bw,
        link_latency: latency,
        op_overhead: overhead,
        measure_ops: true,
    }
}

/// The best rate of `f` over repeated runs within `budget` (at least 3 runs): `work` units
/// per second of the fastest run.
fn best_rate(work: f64, budget: Duration, mut f: impl FnMut()) -> f64 {
    let start = Instant::now();
    let mut best = f64::INFINITY;
    let mut runs = 0;
    while runs < 3 || start.elapsed() < budget {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
        runs += 1;
    }
    // A clock too coarse to see one run: charge it one nanosecond.
    work / best.max(1e-9)
}

fn f32_tensor(n: usize, cols: usize, seed: usize) -> Tensor {
    let data: Vec<f32> = (0..n * cols)
        .map(|i| ((i * 7 + seed) % 13) as f32 * 0.125)
        .collect();
    Tensor::from_f32(vec![n, cols], data)
}

fn gemm_flops(n: usize, budget: Duration) -> f64 {
    let a = f32_tensor(n, n, 1);
    let b = f32_tensor(n, n, 2);
    let ty = TensorType::of(DType::F32, &[n as u64, n as u64]);
    let opts = InterpOptions::default();
    let work = 2.0 * (n as f64).powi(3);
    best_rate(work, budget, || {
        let r = eval_op(
            OpKind::MatMul,
            &Attrs::new(),
            &[&a, &b],
            std::slice::from_ref(&ty),
            &opts,
        );
        black_box(r.ok());
    })
}

fn add_bandwidth(len: usize, budget: Duration) -> f64 {
    let a = f32_tensor(len, 1, 3);
    let b = f32_tensor(len, 1, 4);
    let ty = TensorType::of(DType::F32, &[len as u64, 1]);
    let opts = InterpOptions::default();
    let bytes = 3.0 * 4.0 * len as f64;
    best_rate(bytes, budget, || {
        let r = eval_op(
            OpKind::Add,
            &Attrs::new(),
            &[&a, &b],
            std::slice::from_ref(&ty),
            &opts,
        );
        black_box(r.ok());
    })
}

/// Seconds per op of a function of `n` chained one-element adds, run by `run_function`.
fn op_overhead(n: usize) -> f64 {
    let ty = TensorType::of(DType::F32, &[1]);
    let mut f = Function::new("overhead");
    let x = f.add_arg("x", ty.clone(), ArgKind::Input);
    let mut v = x;
    for _ in 0..n {
        v = f.push(NewOp::new(OpKind::Add, vec![v, x], vec![ty.clone()]));
    }
    f.set_results(vec![v]);
    let arg = Tensor::from_f32(vec![1], vec![1.0]);
    let opts = InterpOptions::default();
    let rate = best_rate(n as f64, Duration::from_millis(50), || {
        black_box(run_function(&f, vec![arg.clone()], &opts, None).ok());
    });
    1.0 / rate
}

/// (one-way latency in seconds, bytes/s) of a thread-to-thread hand-off over channels.
fn channel_link(pings: usize, copy_len: usize, copies: usize) -> (f64, f64) {
    let (to_peer, peer_in) = mpsc::channel::<Vec<f32>>();
    let (peer_out, from_peer) = mpsc::channel::<Vec<f32>>();
    let peer = std::thread::spawn(move || {
        // Echo every message back, after reading it (as a receiving stage would).
        while let Ok(v) = peer_in.recv() {
            black_box(v.iter().fold(0.0f32, |s, x| s + x));
            if peer_out.send(Vec::new()).is_err() {
                break;
            }
        }
    });
    // Latency: empty messages, half the round trip, best of all.
    let mut best = f64::INFINITY;
    for _ in 0..pings {
        let t = Instant::now();
        if to_peer.send(Vec::new()).is_err() || from_peer.recv().is_err() {
            break;
        }
        best = best.min(t.elapsed().as_secs_f64() / 2.0);
    }
    let latency = if best.is_finite() {
        best.max(1e-9)
    } else {
        1e-6
    };
    // Bandwidth: copy a buffer into a fresh one, send it, the peer reads it.
    let src = vec![1.0f32; copy_len];
    let bytes = 4.0 * copy_len as f64;
    let mut best = f64::INFINITY;
    for _ in 0..copies {
        let t = Instant::now();
        if to_peer.send(src.clone()).is_err() || from_peer.recv().is_err() {
            break;
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    drop(to_peer);
    let _ = peer.join();
    let per_byte = (best - 2.0 * latency).max(best / 2.0);
    let bandwidth = if per_byte.is_finite() && per_byte > 0.0 {
        bytes / per_byte
    } else {
        1e9
    };
    (latency, bandwidth)
}

/// `MemTotal` in bytes, from `/proc/meminfo`.
fn mem_total() -> Option<f64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024.0)
}
