//! The planner: partition + schedule + simulation, choosing among candidate partitions by
//! the simulated iteration time of the schedule that will actually run.
//!
//! [`plan`] partitions the forward function into as many virtual stages as the schedule
//! needs (P for one stage per device; P·V for interleaved 1F1B; 2P for ZB-V), lays them out
//! (a stage DAG with one stage per device for the graph partitioner, a chain otherwise),
//! builds the schedule on that layout, adds communication, validates it, fills the
//! simulator's [`CostTable`] from the cost model (per-stage F/B/W, per-edge transfer times,
//! weights and stash bytes) and simulates. The best candidate by makespan wins; its peak
//! memory per device must fit the limit or the plan fails naming the device and the excess.

use crate::autodiff::AutodiffOptions;
use crate::cost::{comm_time, DeviceProfile};
use crate::partition::{
    human_bytes, partition, MemoryModel, Partition, PartitionKind, PartitionOptions,
};
use crate::schedule::{builtin_on, insert_communication, validate, zb_v_for, Layout, Schedule};
use crate::simulate::{simulate, CostTable, SimReport, StageCosts};
use crate::PassError;

const PASS: &str = "plan";

fn fail(message: impl Into<String>) -> PassError {
    PassError::failed(PASS, message)
}

/// Which schedule to plan for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScheduleSpec {
    /// A built-in schedule by name.
    Builtin(String),
    /// A user schedule (from torch CSV); its layout decides the virtual stages.
    Custom(Schedule),
}

impl ScheduleSpec {
    pub fn name(&self) -> String {
        match self {
            ScheduleSpec::Builtin(n) => n.clone(),
            ScheduleSpec::Custom(_) => "custom".into(),
        }
    }
}

/// What to plan.
#[derive(Clone, Debug)]
pub struct PlannerOptions {
    /// Forward function (default `main`).
    pub function: String,
    /// Devices (pipeline ranks).
    pub ranks: usize,
    pub microbatches: usize,
    pub schedule: ScheduleSpec,
    /// Virtual stages per device for interleaved 1F1B.
    pub chunks: usize,
    pub partition: PartitionKind,
    pub profile: DeviceProfile,
    /// Bytes per device (default: the profile's memory).
    pub memory_limit: Option<f64>,
    pub pinned: Vec<String>,
    pub autodiff: AutodiffOptions,
    /// Optimizer state per parameter byte (1: SGD momentum, 2: Adam).
    pub optimizer_state: f64,
    /// Times ops on the target's code (see [`crate::partition::OpTimer`]).
    pub op_timer: Option<crate::partition::OpTimer>,
}

/// A planned pipeline.
#[derive(Clone, Debug)]
pub struct Plan {
    pub partition: Partition,
    pub layout: Layout,
    /// With communication actions.
    pub schedule: Schedule,
    pub costs: CostTable,
    pub report: SimReport,
    /// Total work / devices: `M · Σ(F+B+W) / P`.
    pub lower_bound: f64,
    /// Every candidate partition simulated: (stage graph is a chain, makespan).
    pub candidates: Vec<(bool, f64)>,
}

/// Micro-batches of activations a stage of `schedule` keeps at most (for the partitioner's
/// memory estimate; the simulation checks the real peak).
fn stash_estimate(schedule: &ScheduleSpec, ranks: usize, m: usize) -> f64 {
    let n = match schedule {
        ScheduleSpec::Builtin(name) => match name.as_str() {
            "gpipe" => m,
            "zb-h2" | "zb-v" | "interleaved-1f1b" => m.min(2 * ranks),
            _ => m.min(ranks),
        },
        ScheduleSpec::Custom(_) => m,
    };
    n.max(1) as f64
}

/// Virtual stages and their layout shape for a schedule on `ranks` devices.
fn shape(o: &PlannerOptions) -> Result<(usize, Option<Layout>), PassError> {
    let p = o.ranks;
    match &o.schedule {
        ScheduleSpec::Custom(s) => {
            if s.layout.num_ranks() != p {
                return Err(fail(format!(
                    "the schedule has {} ranks, --stages is {p}",
                    s.layout.num_ranks()
                )));
            }
            Ok((s.num_virtual_stages(), Some(s.layout.clone())))
        }
        ScheduleSpec::Builtin(name) => Ok(match name.as_str() {
            "interleaved-1f1b" => (
                p * o.chunks,
                Some(Layout::Interleaved {
                    ranks: p,
                    chunks: o.chunks,
                }),
            ),
            "zb-v" => (2 * p, Some(Layout::VShape { ranks: p })),
            _ => (p, None),
        }),
    }
}

/// Plan `function` of `m`; see the module docs.
pub fn plan(m: &ppir::Module, o: &PlannerOptions) -> Result<Plan, PassError> {
    if o.ranks == 0 || o.microbatches == 0 {
        return Err(fail("stages and micro-batches must be at least 1"));
    }
    let (k, fixed_layout) = shape(o)?;
    if o.partition == PartitionKind::Graph && fixed_layout.is_some() {
        return Err(fail(format!(
            "the graph partition places one stage per device; schedule `{}` puts several stages on each device along a chain: use --partition sequential or uniform",
            o.schedule.name()
        )));
    }
    let limit = o.memory_limit.unwrap_or(o.profile.memory_bytes);
    let mut popts = PartitionOptions::new(k, o.partition, o.profile.clone());
    popts.function = o.function.clone();
    popts.microbatches = o.microbatches;
    popts.memory = MemoryModel {
        limit,
        stash: stash_estimate(&o.schedule, o.ranks, o.microbatches),
        optimizer_state: o.optimizer_state,
    };
    popts.pinned = o.pinned.clone();
    popts.autodiff = o.autodiff.clone();
    popts.candidates = 4;
    popts.op_timer = o.op_timer.clone();
    let candidates = partition(m, &popts).map_err(|e| {
        if k == o.ranks {
            return e;
        }
        match e {
            PassError::Failed { pass, message } => PassError::Failed {
                pass,
                message: format!(
                    "{message} (schedule `{}` needs {k} stages: {} devices × {} stages each)",
                    o.schedule.name(),
                    o.ranks,
                    k / o.ranks.max(1)
                ),
            },
            other => other,
        }
    })?;
    let mut simulated = vec![];
    let mut best: Option<Plan> = None;
    let mut first_error = None;
    for part in candidates {
        let layout = match &fixed_layout {
            Some(l) => l.clone(),
            None if o.partition == PartitionKind::Graph => Layout::Dag {
                ranks: k,
                rank_of: (0..k).collect(),
                edges: part.edges.iter().map(|e| (e.from, e.to)).collect(),
            },
            None => Layout::chain(k),
        };
        let costs = cost_table(&part, &o.profile, o.optimizer_state);
        let schedule = match &o.schedule {
            // ZB-V orders its actions by running the ranks with the stage costs.
            ScheduleSpec::Builtin(name)
                if name == "zb-v" && layout == (Layout::VShape { ranks: o.ranks }) =>
            {
                let per_stage: Vec<[f64; 3]> = costs
                    .stages
                    .iter()
                    .map(|c| [c.forward, c.backward_input, c.backward_weight])
                    .collect();
                let comm = (1..k)
                    .map(|s| costs.comm_between(s - 1, s))
                    .fold(0.0, f64::max);
                zb_v_for(o.ranks, o.microbatches, &per_stage, comm)
            }
            ScheduleSpec::Builtin(name) => builtin_on(name, &layout, o.microbatches, o.chunks)
                .map_err(|e| fail(e.to_string()))?,
            ScheduleSpec::Custom(s) => s.clone(),
        };
        let schedule = insert_communication(&schedule);
        if let Err(e) = validate(&schedule) {
            return Err(fail(format!("the schedule is not valid: {e}")));
        }
        let report = match simulate(&schedule, &costs) {
            Ok(r) => r,
            Err(e) => {
                first_error.get_or_insert(e.to_string());
                continue;
            }
        };
        simulated.push((part.is_chain(), report.makespan));
        let better = best
            .as_ref()
            .is_none_or(|b| report.makespan < b.report.makespan * (1.0 - 1e-12));
        if better {
            let total: f64 = part.stages.iter().map(|s| s.cost.time()).sum();
            best = Some(Plan {
                lower_bound: o.microbatches as f64 * total / o.ranks as f64,
                partition: part,
                layout,
                schedule,
                costs,
                report,
                candidates: vec![],
            });
        }
    }
    let mut plan = best.ok_or_else(|| {
        fail(format!(
            "no candidate could be simulated: {}",
            first_error.unwrap_or_default()
        ))
    })?;
    plan.candidates = simulated;
    if let Some((r, &peak)) = plan
        .report
        .peak_memory
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
    {
        if peak > limit {
            return Err(fail(format!(
                "device {r} needs {} at its peak under this schedule, the memory limit is {} (over by {}); use more stages, a schedule that keeps fewer micro-batches in flight (1f1b rather than gpipe), or a larger memory limit",
                human_bytes(peak),
                human_bytes(limit),
                human_bytes(peak - limit)
            )));
        }
    }
    Ok(plan)
}

/// The simulator's costs for a partition.
pub fn cost_table(part: &Partition, profile: &DeviceProfile, optimizer_state: f64) -> CostTable {
    let stages: Vec<StageCosts> = part
        .stages
        .iter()
        .map(|s| StageCosts {
            forward: s.cost.f,
            backward_input: s.cost.b,
            backward_weight: s.cost.w,
            activation_memory: s.cost.act_bytes,
            weight_memory: s.cost.param_bytes,
        })
        .collect();
    // The optimizer reads params, gradients and state and writes params and state.
    let optimizer_step = part
        .stages
        .iter()
        .map(|s| s.cost.param_bytes * (3.0 + 2.0 * optimizer_state) / profile.memory_bandwidth)
        .fold(0.0, f64::max);
    CostTable {
        stages,
        comm_time: comm_time(0.0, profile),
        edge_comm: part
            .edges
            .iter()
            .map(|e| ((e.from, e.to), comm_time(e.bytes, profile)))
            .collect(),
        // Gradients (1×) plus optimizer state.
        optimizer_state_factor: 1.0 + optimizer_state,
        optimizer_step,
    }
}
