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

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 5 {
        eprintln!("usage: plan_bench FILE.ppir STAGES MICROBATCHES SCHEDULE...");
        std::process::exit(2);
    }
    let text = std::fs::read_to_string(&args[1]).expect("read the module");
    let module = ppir::text::parse_module(&text).expect("parse the module");
    let ranks: usize = args[2].parse().expect("stages");
    let microbatches: usize = args[3].parse().expect("micro-batches");
    let profile = DeviceProfile::builtin("h100").expect("h100 profile");
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
        };
        let t0 = Instant::now();
        let best = plan(&module, &options).expect("plan");
        let t1 = Instant::now();
        let baseline = (kind != PartitionKind::Sequential).then(|| {
            plan(
                &module,
                &PlannerOptions {
                    partition: PartitionKind::Sequential,
                    ..options.clone()
                },
            )
            .expect("baseline plan")
        });
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
}
