//! Times the planner on a textual IR module, as `ppcc MODEL -o DIR --plan-only` plans it
//! (the plan, then the sequential baseline when the partition is not sequential, reusing
//! the plan's partitioner work; under `auto` the baseline searches the chosen layout), and
//! prints a digest of each plan so two builds can be compared.
//!
//! ```text
//! ppcc MODEL.onnx -o /tmp/x --batch 64 --microbatches 64 --stages 16 --plan-only \
//!     --dump-after import --dump-dir /tmp/dump
//! cargo run -p ppcc-passes --example plan_bench -- /tmp/dump/1-import.ppir 16 64 1f1b zb-v
//! ```
//!
//! `auto` plans `--schedule auto`; `--idle` (after the schedules) also prints, per plan,
//! where each rank's idle time lies (before its first action, between actions, after its
//! last) and the busiest rank's work against the mean, to attribute the gap to the lower
//! bound, and the fill bound ([`ppcc_passes::simulate::fill_bound`]) within the plan's
//! own peak memory and within each `--bound-mib=N` given. `--limit=BYTES` plans under that
//! memory limit (`--memory-limit`, with recomputation off); `PLAN_BENCH_TRACE=PREFIX`
//! writes each plan's simulated timeline to `PREFIX.SCHEDULE.json` (Chrome trace format).

use std::time::Instant;

use ppcc_passes::cost::DeviceProfile;
use ppcc_passes::partition::{PartitionCache, PartitionKind};
use ppcc_passes::planner::{plan_with, search_report, Plan, PlannerOptions, ScheduleSpec};
use ppcc_passes::schedule::ActionKind;
use ppcc_passes::simulate::{fill_bound, RankFillBound};

fn digest(p: &Plan) -> String {
    let stages: Vec<String> = p
        .partition
        .stages
        .iter()
        .map(|s| format!("{}..{}", s.first, s.last))
        .collect();
    let mut h: u64 = 0xcbf29ce484222325;
    for list in &p.schedule.per_rank {
        for a in list {
            for b in a.to_string().bytes() {
                h = (h ^ b as u64).wrapping_mul(0x100000001b3);
            }
        }
    }
    format!(
        "makespan {:.9e} bubble {:.9e} lower {:.9e} peak {:?} candidates {:?} schedule-hash {h:016x} stages [{}]",
        p.report.makespan,
        p.report.bubble_fraction,
        p.lower_bound,
        p.report.peak_memory,
        p.candidates,
        stages.join(", ")
    )
}

/// Where each rank's idle time lies, and the other terms between the lower bound and the
/// makespan.
/// CPU seconds this thread has run (Linux `schedstat`; `None` elsewhere): the planner is
/// single-threaded, so this is its CPU time whatever else loads the machine.
fn thread_cpu_seconds() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: f64 = text.split_whitespace().next()?.parse().ok()?;
    Some(ns * 1e-9)
}

const MIB: f64 = (1u64 << 20) as f64;

fn idle_report(name: &str, p: &Plan, limits: &[f64]) -> String {
    use std::fmt::Write;
    let r = &p.report;
    let ms = |x: f64| x * 1e3;
    let ranks = r.events.len();
    let mean = r.busy.iter().sum::<f64>() / ranks as f64;
    let max = r.busy.iter().copied().fold(0.0, f64::max);
    let opt = p.costs.optimizer_step;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{name} ({}): makespan {:.3} ms, lower bound {:.3} ms ({:.3}); busy mean {:.3} max {:.3} ms (bound with the busiest rank {:.3}); optimizer step {:.3} ms; comm (no bytes) {:.4} ms; peak memory {:.1} MiB; optimizer state factor {}",
        p.schedule_name,
        ms(r.makespan),
        ms(p.lower_bound),
        p.lower_bound / r.makespan,
        ms(mean),
        ms(max),
        p.lower_bound / (max + opt).max(1e-30),
        ms(opt),
        ms(p.costs.comm_time),
        r.peak_memory.iter().copied().fold(0.0, f64::max) / MIB,
        p.costs.optimizer_state_factor,
    );
    let own = r.peak_memory.iter().copied().fold(0.0, f64::max);
    for &peak in std::iter::once(&own).chain(limits) {
        let Some(b) = fill_bound(&p.layout, &p.costs, p.schedule.num_microbatches, peak) else {
            continue;
        };
        let worst = b.iter().fold(None::<&RankFillBound>, |a, x| match a {
            Some(y) if y.bound >= x.bound => Some(y),
            _ => Some(x),
        });
        if let Some(w) = worst {
            let _ = writeln!(
                out,
                "fill bound within {:.1} MiB: {:.3} ms, lower bound / it {:.4} (rank {}: work {:.3}, first forward {:.3}, first input gradient {:.3}, forwards before it at most {:.3} ms)",
                peak / MIB,
                ms(w.bound),
                p.lower_bound / w.bound,
                w.rank,
                ms(w.work),
                ms(w.start),
                ms(w.first_input),
                ms(w.forwards_before)
            );
        }
    }
    let _ = writeln!(
        out,
        "| rank | busy (ms) | idle before first (ms) | idle between (ms) | idle after last (ms) | F (ms) | I (ms) | W (ms) | peak stash |"
    );
    let _ = writeln!(out, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (k, evs) in r.events.iter().enumerate() {
        let compute: Vec<_> = evs
            .iter()
            .filter(|e| e.action.kind.is_compute() && e.end > e.start)
            .collect();
        let first = compute.first().map_or(0.0, |e| e.start);
        let last = compute.last().map_or(0.0, |e| e.end);
        let between = (last - first) - r.busy[k];
        let sum = |kind: ActionKind| -> f64 {
            compute
                .iter()
                .filter(|e| e.action.kind == kind)
                .map(|e| e.end - e.start)
                .sum()
        };
        let _ = writeln!(
            out,
            "| {k} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {} |",
            ms(r.busy[k]),
            ms(first),
            ms(between),
            ms(r.makespan - last),
            ms(sum(ActionKind::Forward)),
            ms(sum(ActionKind::BackwardInput)),
            ms(sum(ActionKind::BackwardWeight) + sum(ActionKind::FullBackward)),
            r.peak_stash[k],
        );
    }
    if std::env::var_os("PLAN_BENCH_GAPS").is_some() {
        for (k, evs) in r.events.iter().enumerate() {
            let mut t = 0.0;
            let mut gaps = vec![];
            for e in evs.iter().filter(|e| e.action.kind.is_compute()) {
                if e.start > t + 1e-5 {
                    gaps.push(format!("{:.1}+{:.2}@{}", ms(t), ms(e.start - t), e.action));
                }
                t = e.end;
            }
            let _ = writeln!(out, "gaps rank {k}: {}", gaps.join(" "));
        }
    }
    let _ = writeln!(
        out,
        "| stage | rank | F (ms) | I (ms) | W (ms) | stash per micro-batch (MiB) | weights (MiB) |"
    );
    let _ = writeln!(out, "|---:|---:|---:|---:|---:|---:|---:|");
    for (s, c) in p.costs.stages.iter().enumerate() {
        let _ = writeln!(
            out,
            "| {s} | {} | {:.4} | {:.4} | {:.4} | {:.3} | {:.3} |",
            p.layout.rank_of(s),
            ms(c.forward),
            ms(c.backward_input),
            ms(c.backward_weight),
            c.activation_memory / MIB,
            c.weight_memory / MIB
        );
    }
    let edges: Vec<String> = p
        .costs
        .edge_comm
        .iter()
        .map(|((a, b), t)| format!("{a}->{b} {:.4}", ms(*t)))
        .collect();
    let _ = writeln!(out, "edge transfers (ms): {}", edges.join(", "));
    out
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 5 {
        return Err("usage: plan_bench FILE.ppir STAGES MICROBATCHES SCHEDULE...".into());
    }
    let text =
        std::fs::read_to_string(&args[1]).map_err(|e| format!("cannot read {}: {e}", args[1]))?;
    let module = ppir::text::parse_module(&text).map_err(|e| format!("{}: {e}", args[1]))?;
    let count = |i: usize, what: &str| -> Result<usize, String> {
        args[i]
            .parse()
            .map_err(|_| format!("{what} must be a number, got `{}`", args[i]))
    };
    let ranks = count(2, "STAGES")?;
    let microbatches = count(3, "MICROBATCHES")?;
    let profile = DeviceProfile::builtin("h100").map_err(|e| e.to_string())?;
    let idle = args[4..].iter().any(|a| a == "--idle");
    // Peak memories (MiB) to give the fill bound as well as the plan's own.
    let mut limits = vec![];
    for a in &args[4..] {
        if let Some(v) = a.strip_prefix("--bound-mib=") {
            let v: f64 = v
                .parse()
                .map_err(|_| format!("--bound-mib takes a number, got `{v}`"))?;
            limits.push(v * MIB);
        }
    }
    let mut memory_limit = None;
    for a in &args[4..] {
        if let Some(v) = a.strip_prefix("--limit=") {
            memory_limit = Some(
                v.parse::<f64>()
                    .map_err(|_| format!("--limit takes bytes, got `{v}`"))?,
            );
        }
    }
    let names: Vec<&String> = args[4..].iter().filter(|a| !a.starts_with("--")).collect();
    println!("| schedule | partition | plan (s) | baseline (s) | total (s) | total CPU (s) |");
    println!("| --- | --- | --- | --- | --- | --- |");
    let mut digests = vec![];
    let mut reports = vec![];
    for name in names {
        let one_stage_per_device =
            !matches!(name.as_str(), "zb-v" | "dualpipe-v" | "interleaved-1f1b");
        let kind = if one_stage_per_device {
            PartitionKind::Graph
        } else {
            PartitionKind::Sequential
        };
        let options = PlannerOptions {
            function: "main".into(),
            ranks,
            microbatches,
            schedule: if name == "auto" {
                ScheduleSpec::Auto
            } else {
                ScheduleSpec::Builtin(name.clone())
            },
            chunks: if name == "interleaved-1f1b" { 2 } else { 1 },
            partition: kind,
            profile: profile.clone(),
            memory_limit,
            pinned: vec![],
            autodiff: Default::default(),
            optimizer_state: 1.0,
            op_timer: None,
            recompute: if args.iter().any(|a| a == "--recompute-auto") {
                ppcc_passes::recompute::RecomputeMode::Auto
            } else {
                ppcc_passes::recompute::RecomputeMode::Off
            },
        };
        let c0 = thread_cpu_seconds();
        let t0 = Instant::now();
        let mut cache = PartitionCache::default();
        let best = plan_with(&module, &options, &mut cache).map_err(|e| format!("{name}: {e}"))?;
        let t1 = Instant::now();
        let (kind, baseline_schedule) = if options.schedule == ScheduleSpec::Auto {
            (best.partition.kind, ScheduleSpec::search_for(&best.layout))
        } else {
            (kind, options.schedule.clone())
        };
        let baseline = if kind == PartitionKind::Sequential {
            None
        } else {
            let o = PlannerOptions {
                partition: PartitionKind::Sequential,
                schedule: baseline_schedule,
                ..options.clone()
            };
            Some(plan_with(&module, &o, &mut cache).map_err(|e| format!("{name} baseline: {e}"))?)
        };
        let t2 = Instant::now();
        let cpu = match (c0, thread_cpu_seconds()) {
            (Some(a), Some(b)) => format!("{:.3}", b - a),
            _ => "—".into(),
        };
        println!(
            "| {name} | {} | {:.3} | {:.3} | {:.3} | {cpu} |",
            kind.name(),
            (t1 - t0).as_secs_f64(),
            (t2 - t1).as_secs_f64(),
            (t2 - t0).as_secs_f64()
        );
        digests.push(format!("{name}: {}", digest(&best)));
        if let Ok(path) = std::env::var("PLAN_BENCH_TRACE") {
            let _ = std::fs::write(
                format!("{path}.{name}.json"),
                ppcc_passes::simulate::to_trace_json_seconds(&best.report),
            );
        }
        if idle {
            let mut r = idle_report(name, &best, &limits);
            if !best.search.is_empty() {
                r.push_str(&search_report(&best, profile.memory_bytes));
            }
            reports.push(r);
        }
        if let Some(b) = baseline {
            digests.push(format!("{name} baseline: {}", digest(&b)));
        }
    }
    for d in digests {
        eprintln!("{d}");
    }
    for r in reports {
        println!("\n{r}");
    }
    Ok(())
}
