//! Times the planner on a textual IR module, as `ppcc MODEL -o DIR --plan-only` plans it
//! (the plan, then the sequential baseline when the partition is not sequential), and
//! prints a digest of each plan so two builds can be compared.
//!
//! ```text
//! ppcc MODEL.onnx -o /tmp/x --batch 64 --microbatches 64 --stages 16 --plan-only \
//!     --dump-after import --dump-dir /tmp/dump
//! cargo run -p ppcc-passes --example plan_bench -- /tmp/dump/1-import.ppir 16 64 1f1b zb-v
//! ```

use std::time::Instant;

use ppcc_passes::cost::DeviceProfile;
use ppcc_passes::partition::PartitionKind;
use ppcc_passes::planner::{plan, Plan, PlannerOptions, ScheduleSpec};

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
    println!("| schedule | partition | plan (s) | baseline (s) | total (s) |");
    println!("| --- | --- | --- | --- | --- |");
    let mut digests = vec![];
    for name in &args[4..] {
        let one_stage_per_device = name != "zb-v" && name != "interleaved-1f1b";
        let kind = if one_stage_per_device {
            PartitionKind::Graph
        } else {
            PartitionKind::Sequential
        };
        let options = PlannerOptions {
            function: "main".into(),
            ranks,
            microbatches,
            schedule: ScheduleSpec::Builtin(name.clone()),
            chunks: if name == "interleaved-1f1b" { 2 } else { 1 },
            partition: kind,
            profile: profile.clone(),
            memory_limit: None,
            pinned: vec![],
            autodiff: Default::default(),
            optimizer_state: 1.0,
            op_timer: None,
            recompute: ppcc_passes::recompute::RecomputeMode::Off,
        };
        let t0 = Instant::now();
        let best = plan(&module, &options).map_err(|e| format!("{name}: {e}"))?;
        let t1 = Instant::now();
        let baseline = if kind == PartitionKind::Sequential {
            None
        } else {
            let o = PlannerOptions {
                partition: PartitionKind::Sequential,
                ..options.clone()
            };
            Some(plan(&module, &o).map_err(|e| format!("{name} baseline: {e}"))?)
        };
        let t2 = Instant::now();
        println!(
            "| {name} | {} | {:.3} | {:.3} | {:.3} |",
            kind.name(),
            (t1 - t0).as_secs_f64(),
            (t2 - t1).as_secs_f64(),
            (t2 - t0).as_secs_f64()
        );
        digests.push(format!("{name}: {}", digest(&best)));
        if let Some(b) = baseline {
            digests.push(format!("{name} baseline: {}", digest(&b)));
        }
    }
    for d in digests {
        eprintln!("{d}");
    }
    Ok(())
}
