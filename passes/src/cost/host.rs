//! The `host` profile: measured on this machine by a short micro-benchmark and cached.
//!
//! What is measured, and why:
//!
//! - `peak_flops.f32`: a simple cache-blocked f32 matmul written in Rust, single-threaded.
//!   It measures the interpreter-class kernel, i.e. what our reference runtime achieves on
//!   one core, not the machine's theoretical peak: the roofline needs the peak of the code
//!   that executes. Other dtypes fall back to it.
//! - `memory_bandwidth`: a STREAM-style triad `a = b + s·c` over arrays larger than a
//!   typical last-level cache (2 reads + 1 write per element).
//! - `link_latency` / `link_bandwidth`: the local transport's path between two stage
//!   threads: half the round trip of a small message over a `std::sync::mpsc` channel, and
//!   a copy into a fresh buffer that is sent and read on the other side.
//! - `memory_bytes`: `MemTotal` from `/proc/meminfo` (0 where unknown);
//!   `op_overhead`: a fixed 1 µs for the interpreter's per-op dispatch.
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

use serde_json::{Map, Value};

use super::profile::DeviceProfile;
use super::CostError;

/// Per-op dispatch overhead charged to the host profile (interpreter-class runtime).
const HOST_OP_OVERHEAD: f64 = 1e-6;

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
    let mut m = Map::new();
    m.insert("hostname".into(), hostname.into());
    m.insert("cpu_model".into(), cpu.into());
    m.insert("profile".into(), profile.to_value());
    let text = serde_json::to_string_pretty(&Value::Object(m)).expect("JSON prints");
    // Best effort: a read-only home must not stop compilation.
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let _ = std::fs::write(path, text);
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
        && v.get("cpu_model").and_then(Value::as_str) == Some(cpu);
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
    let (triad_len, triad_budget) = if quick {
        (1 << 16, Duration::from_millis(5))
    } else {
        (1 << 23, Duration::from_millis(400))
    };
    let (pings, copy_len, copies) = if quick {
        (50, 1 << 16, 4)
    } else {
        (2000, 1 << 22, 16)
    };
    let flops = gemm_flops(gemm_n, gemm_budget);
    let bandwidth = triad_bandwidth(triad_len, triad_budget);
    let (latency, link_bw) = channel_link(pings, copy_len, copies);
    let (hostname, cpu) = host_key();
    DeviceProfile {
        name: "host".into(),
        description: format!("{cpu} on {hostname}"),
        source: format!(
            "measured by ppcc ({}): single-thread blocked f32 matmul n={gemm_n}, triad over {triad_len} f32, mpsc channel ping-pong and {copy_len}-f32 copies",
            if quick { "quick" } else { "full" }
        ),
        peak_flops: BTreeMap::from([("f32".to_string(), flops)]),
        memory_bandwidth: bandwidth,
        memory_bytes: mem_total().unwrap_or(0.0),
        link_bandwidth: link_bw,
        link_latency: latency,
        op_overhead: HOST_OP_OVERHEAD,
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

/// `c = a · b` for n×n row-major matrices, cache-blocked, i-k-j order in each block so
/// the inner loop is a contiguous axpy the compiler vectorises.
pub(super) fn matmul_blocked(a: &[f32], b: &[f32], c: &mut [f32], n: usize) {
    const BLOCK: usize = 64;
    c.fill(0.0);
    for ii in (0..n).step_by(BLOCK) {
        let i_end = (ii + BLOCK).min(n);
        for kk in (0..n).step_by(BLOCK) {
            let k_end = (kk + BLOCK).min(n);
            for jj in (0..n).step_by(BLOCK) {
                let j_end = (jj + BLOCK).min(n);
                for i in ii..i_end {
                    let c_row = &mut c[i * n + jj..i * n + j_end];
                    for k in kk..k_end {
                        let aik = a[i * n + k];
                        let b_row = &b[k * n + jj..k * n + j_end];
                        for (cv, bv) in c_row.iter_mut().zip(b_row) {
                            *cv += aik * bv;
                        }
                    }
                }
            }
        }
    }
}

fn gemm_flops(n: usize, budget: Duration) -> f64 {
    let a: Vec<f32> = (0..n * n).map(|i| (i % 7) as f32 * 0.25).collect();
    let b: Vec<f32> = (0..n * n).map(|i| (i % 5) as f32 * 0.5).collect();
    let mut c = vec![0.0f32; n * n];
    let work = 2.0 * (n as f64).powi(3);
    best_rate(work, budget, || {
        matmul_blocked(black_box(&a), black_box(&b), &mut c, n);
        black_box(&c);
    })
}

fn triad_bandwidth(len: usize, budget: Duration) -> f64 {
    let b = vec![1.0f32; len];
    let c = vec![2.0f32; len];
    let mut a = vec![0.0f32; len];
    let s = black_box(3.0f32);
    let bytes = 3.0 * 4.0 * len as f64;
    best_rate(bytes, budget, || {
        for ((x, y), z) in a.iter_mut().zip(black_box(&b)).zip(black_box(&c)) {
            *x = y + s * z;
        }
        black_box(&a);
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocked_matmul_is_a_matmul() {
        // n not a multiple of the block, so edge blocks are exercised.
        let n = 70;
        let a: Vec<f32> = (0..n * n).map(|i| ((i * 7) % 11) as f32 - 5.0).collect();
        let b: Vec<f32> = (0..n * n).map(|i| ((i * 3) % 13) as f32 - 6.0).collect();
        let mut c = vec![0.0; n * n];
        matmul_blocked(&a, &b, &mut c, n);
        for i in 0..n {
            for j in 0..n {
                let want: f32 = (0..n).map(|k| a[i * n + k] * b[k * n + j]).sum();
                assert_eq!(c[i * n + j], want, "c[{i}][{j}]");
            }
        }
    }
}
