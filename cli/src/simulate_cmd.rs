//! `ppcc simulate`: simulate a built-in, `.pps` or CSV schedule on synthetic uniform stage
//! costs.
//!
//! Standard output: `makespan <t> bubble <fraction>`, then one line per rank,
//! `rank <r> peak_activations <n>` (stashed stage activations, in micro-batches).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use ppcc_passes::schedule::csv::{from_csv, to_csv};
use ppcc_passes::schedule::pps::to_pps;
use ppcc_passes::schedule::{builtin, validate, Layout, BUILTIN_NAMES};
use ppcc_passes::simulate::{simulate, to_svg, to_trace_json, CostTable};

/// How a CSV schedule's virtual stages map to ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LayoutArg {
    /// From the cells, as torch does: the row a stage appears in is its rank (an
    /// interleaved chain or a V).
    Auto,
    /// Virtual stage c·P + r on rank r (`--chunks 1`: a plain chain).
    Interleaved,
    /// Two chunks in a V: stages 0..P down the ranks, P..2P back up (ZB-V).
    V,
}

#[derive(Args)]
pub struct SimulateArgs {
    /// A built-in schedule (gpipe, 1f1b, interleaved-1f1b, zb-h1, zb-h2, zb-v, dualpipe-v),
    /// a schedule program in ppcc's schedule language (FILE.pps, see docs/schedules.md; p =
    /// --stages, m = --microbatches, v = --chunks) or a torch.distributed.pipelining CSV file
    /// (one row per rank, cells like 0F1, 1I0, 2W3, 1B2).
    #[arg(long, value_name = "NAME|FILE.pps|FILE.csv")]
    schedule: String,
    /// Pipeline ranks (devices), P.
    #[arg(long)]
    stages: usize,
    /// Micro-batches per iteration, M (a CSV must use exactly 0..M).
    #[arg(long)]
    microbatches: usize,
    /// Virtual stages (chunks) per rank, V: interleaved-1f1b and CSV files.
    #[arg(long, default_value_t = 1)]
    chunks: usize,
    /// Stage layout of a CSV file (`auto`: inferred from the rows, as torch does).
    #[arg(long, value_enum, default_value_t = LayoutArg::Auto)]
    layout: LayoutArg,
    /// Per virtual stage and micro-batch: F (forward), B (input gradient), W (weight
    /// gradient) times, and comm (time of one cross-rank transfer).
    #[arg(long, default_value = "F=1,B=1,W=1,comm=0")]
    cost: String,
    /// Write a Chrome/Perfetto trace (JSON).
    #[arg(long, value_name = "OUT.json")]
    trace: Option<PathBuf>,
    /// Write an SVG timeline.
    #[arg(long, value_name = "OUT.svg")]
    svg: Option<PathBuf>,
    /// Write the schedule as torch CSV.
    #[arg(long, value_name = "OUT.csv")]
    export_csv: Option<PathBuf>,
    /// Write the schedule in ppcc's schedule language (an explicit listing per rank).
    #[arg(long, value_name = "OUT.pps")]
    export_pps: Option<PathBuf>,
}

/// `F=1,B=2,W=1,comm=0.1` → (F, B, W, comm); keys are case-insensitive, missing ones are 1
/// (comm: 0).
fn parse_cost(text: &str) -> Result<(f64, f64, f64, f64)> {
    let (mut f, mut b, mut w, mut comm) = (1.0, 1.0, 1.0, 0.0);
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Some((key, value)) = item.split_once('=') else {
            bail!("--cost: expected KEY=VALUE, got `{item}`");
        };
        let v: f64 = value
            .trim()
            .parse()
            .ok()
            .filter(|v: &f64| v.is_finite() && *v >= 0.0)
            .with_context(|| format!("--cost: `{value}` is not a non-negative number"))?;
        match key.trim().to_ascii_lowercase().as_str() {
            "f" => f = v,
            "b" => b = v,
            "w" => w = v,
            "comm" => comm = v,
            k => bail!("--cost: unknown key `{k}` (expected F, B, W, comm)"),
        }
    }
    Ok((f, b, w, comm))
}

pub fn simulate_cmd(a: SimulateArgs) -> Result<ExitCode> {
    if a.stages == 0 || a.microbatches == 0 || a.chunks == 0 {
        bail!("--stages, --microbatches and --chunks must be at least 1");
    }
    let (f, b, w, comm) = parse_cost(&a.cost)?;
    let schedule = if BUILTIN_NAMES.contains(&a.schedule.as_str()) {
        if a.chunks > 1 && a.schedule != "interleaved-1f1b" {
            bail!("--chunks applies to interleaved-1f1b only");
        }
        let s = if a.schedule == "zb-v" {
            // ZB-V's weight gradients fill the time its order leaves idle at these costs.
            ppcc_passes::schedule::zb_v_for(
                a.stages,
                a.microbatches,
                &vec![[f, b, w]; 2 * a.stages],
                comm,
            )
        } else {
            builtin(&a.schedule, a.stages, a.microbatches, a.chunks)?
        };
        validate(&s).with_context(|| format!("built-in schedule `{}`", a.schedule))?;
        s
    } else if a.schedule.ends_with(".pps") {
        ppcc_driver::compile::read_pps_file(
            std::path::Path::new(&a.schedule),
            a.stages,
            a.microbatches,
            a.chunks,
        )?
    } else if a.schedule.ends_with(".csv") || std::path::Path::new(&a.schedule).exists() {
        let text = std::fs::read_to_string(&a.schedule)
            .with_context(|| format!("cannot read {}", a.schedule))?;
        let layout = match a.layout {
            LayoutArg::Auto => ppcc_passes::schedule::csv::infer_layout(&text, a.stages)
                .with_context(|| format!("invalid schedule {}", a.schedule))?,
            LayoutArg::Interleaved => Layout::Interleaved {
                ranks: a.stages,
                chunks: a.chunks,
            },
            LayoutArg::V => Layout::VShape { ranks: a.stages },
        };
        let s =
            from_csv(&text, layout).with_context(|| format!("invalid schedule {}", a.schedule))?;
        if s.num_microbatches != a.microbatches {
            bail!(
                "{} uses {} micro-batches, --microbatches says {}",
                a.schedule,
                s.num_microbatches,
                a.microbatches
            );
        }
        s
    } else {
        bail!(
            "unknown schedule `{}` (built-in: {}; or a .pps or .csv file)",
            a.schedule,
            BUILTIN_NAMES.join(", ")
        );
    };
    let costs = CostTable::uniform(schedule.num_virtual_stages(), f, b, w, comm);
    let report = simulate(&schedule, &costs)?;
    println!(
        "makespan {} bubble {:.6}",
        report.makespan, report.bubble_fraction
    );
    for (r, n) in report.peak_stash.iter().enumerate() {
        println!("rank {r} peak_activations {n}");
    }
    if let Some(p) = &a.trace {
        std::fs::write(p, to_trace_json(&report))
            .with_context(|| format!("cannot write {}", p.display()))?;
    }
    if let Some(p) = &a.svg {
        std::fs::write(p, to_svg(&report))
            .with_context(|| format!("cannot write {}", p.display()))?;
    }
    if let Some(p) = &a.export_csv {
        std::fs::write(p, to_csv(&schedule))
            .with_context(|| format!("cannot write {}", p.display()))?;
    }
    if let Some(p) = &a.export_pps {
        std::fs::write(p, to_pps(&schedule))
            .with_context(|| format!("cannot write {}", p.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}
