//! Discrete-event simulation of a [`Schedule`] with per-stage costs.
//!
//! Each rank runs its list in order; an action starts when its rank is free and its
//! dependencies are done, plus the link time for data from another rank
//! ([`CostTable::comm_between`]: the edge's [`CostTable::edge_comm`] entry, else
//! [`CostTable::comm_time`]; activations and their gradients pay the same). Sends and
//! receives take no rank time (the link time is on the edge). The costs come from the
//! cost model ([`CostTable`] is the interface it fills) or from [`CostTable::uniform`].
//!
//! Memory: a micro-batch's activations on a stage are stashed from its `F` until its `W` (or
//! fused `B`) finishes — the input-gradient `B` frees part of them in practice, which this
//! model ignores (it over-estimates ZB schedules' stash between `B` and `W`).
//!
//! [`fill_bound`]: a lower bound on any schedule's iteration time on a chain layout within
//! a peak memory, from the pipeline's fill.

mod bound;
mod render;

pub use bound::{fill_bound, RankFillBound};
pub use render::{to_svg, to_svg_seconds, to_trace_json, to_trace_json_seconds};

use std::collections::BTreeMap;

use crate::schedule::validate::{execute, ScheduleError};
use crate::schedule::{Action, ActionKind, Schedule};

/// Costs of one virtual stage.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StageCosts {
    /// Time of `F` for one micro-batch.
    pub forward: f64,
    /// Time of the input-gradient backward (`I`); a fused `B` takes `I + W`.
    pub backward_input: f64,
    /// Time of the weight-gradient backward (`W`).
    pub backward_weight: f64,
    /// Bytes stashed per micro-batch from `F` until `W`.
    pub activation_memory: f64,
    /// Bytes of the stage's parameters.
    pub weight_memory: f64,
    /// Bytes live only while the stage's backward of one micro-batch runs, on top of the
    /// stash (activations recomputed there).
    pub transient_memory: f64,
}

/// What the simulator needs to know about time and memory.
#[derive(Clone, Debug, PartialEq)]
pub struct CostTable {
    /// One entry per virtual stage.
    pub stages: Vec<StageCosts>,
    /// Latency + bytes / bandwidth of one cross-rank transfer over an edge not in
    /// `edge_comm`.
    pub comm_time: f64,
    /// Time of one cross-rank transfer over the forward edge (producer, consumer) of virtual
    /// stages, and of the gradient going back over it.
    pub edge_comm: BTreeMap<(usize, usize), f64>,
    /// Optimizer state as a multiple of the weights (2 for Adam's two moments).
    pub optimizer_state_factor: f64,
    /// Time of one stage's optimizer step.
    pub optimizer_step: f64,
}

impl CostTable {
    /// Every stage costs `forward`, `backward_input`, `backward_weight`; one unit of memory
    /// per stashed micro-batch, no weights.
    pub fn uniform(
        num_virtual_stages: usize,
        forward: f64,
        backward_input: f64,
        backward_weight: f64,
        comm_time: f64,
    ) -> Self {
        CostTable {
            stages: vec![
                StageCosts {
                    forward,
                    backward_input,
                    backward_weight,
                    activation_memory: 1.0,
                    weight_memory: 0.0,
                    transient_memory: 0.0,
                };
                num_virtual_stages
            ],
            comm_time,
            edge_comm: BTreeMap::new(),
            optimizer_state_factor: 2.0,
            optimizer_step: 0.0,
        }
    }

    /// Time of a transfer between virtual stages `a` and `b`, in either direction: the
    /// `edge_comm` entry of `(a, b)` or else `(b, a)`, else `comm_time`.
    pub fn comm_between(&self, a: usize, b: usize) -> f64 {
        self.edge_comm
            .get(&(a, b))
            .or_else(|| self.edge_comm.get(&(b, a)))
            .copied()
            .unwrap_or(self.comm_time)
    }

    /// Time of `action` (communication takes no rank time).
    pub fn duration(&self, a: &Action) -> f64 {
        let c = &self.stages[a.stage];
        match a.kind {
            ActionKind::Forward => c.forward,
            ActionKind::BackwardInput => c.backward_input,
            ActionKind::BackwardWeight => c.backward_weight,
            ActionKind::FullBackward => c.backward_input + c.backward_weight,
            ActionKind::OptimizerStep => self.optimizer_step,
            _ => 0.0,
        }
    }
}

/// One executed action.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Event {
    pub rank: usize,
    pub action: Action,
    pub start: f64,
    pub end: f64,
}

/// What a simulation predicts.
#[derive(Clone, Debug, PartialEq)]
pub struct SimReport {
    /// Iteration time: the last action's end.
    pub makespan: f64,
    /// `1 − Σ busy / (ranks · makespan)`.
    pub bubble_fraction: f64,
    /// Compute time per rank.
    pub busy: Vec<f64>,
    /// Peak number of stashed (stage, micro-batch) activations per rank.
    pub peak_stash: Vec<usize>,
    /// Peak stashed bytes per rank.
    pub peak_stash_bytes: Vec<f64>,
    /// Weights + optimizer state + peak stash, per rank.
    pub peak_memory: Vec<f64>,
    /// From the first action to the one that ends last, each deciding the next one's start.
    pub critical_path: Vec<Event>,
    /// Every action, per rank in execution order.
    pub events: Vec<Vec<Event>>,
}

/// Simulate `schedule` (which should have passed [`crate::schedule::validate`]; a deadlock
/// or a duplicate action is reported anyway).
pub fn simulate(schedule: &Schedule, costs: &CostTable) -> Result<SimReport, ScheduleError> {
    let nv = schedule.num_virtual_stages();
    if costs.stages.len() != nv {
        return Err(ScheduleError::Invalid(format!(
            "the cost table has {} stages, the schedule {nv}",
            costs.stages.len()
        )));
    }
    let timing = execute(schedule, &|a| costs.duration(a), &|from, to| {
        costs.comm_between(from, to)
    })?;
    let p = schedule.per_rank.len();
    let events: Vec<Vec<Event>> = (0..p)
        .map(|r| {
            schedule.per_rank[r]
                .iter()
                .zip(&timing[r])
                .map(|(a, t)| Event {
                    rank: r,
                    action: *a,
                    start: t.0,
                    end: t.1,
                })
                .collect()
        })
        .collect();
    let makespan = events
        .iter()
        .flatten()
        .map(|e| e.end)
        .fold(0.0f64, f64::max);
    let busy: Vec<f64> = events
        .iter()
        .map(|l| l.iter().map(|e| e.end - e.start).sum())
        .collect();
    let bubble_fraction = if makespan > 0.0 {
        1.0 - busy.iter().sum::<f64>() / (p as f64 * makespan)
    } else {
        0.0
    };
    let mut peak_stash = vec![0; p];
    let mut peak_stash_bytes = vec![0.0; p];
    let mut peak_memory = vec![0.0; p];
    for r in 0..p {
        // A rank runs one action at a time, so its stash over time is the running sum over
        // its list.
        let (mut n, mut bytes) = (0usize, 0.0f64);
        for a in &schedule.per_rank[r] {
            let act = costs.stages[a.stage].activation_memory;
            if matches!(
                a.kind,
                ActionKind::BackwardInput | ActionKind::BackwardWeight | ActionKind::FullBackward
            ) {
                let during = bytes + costs.stages[a.stage].transient_memory;
                peak_stash_bytes[r] = f64::max(peak_stash_bytes[r], during);
            }
            match a.kind {
                ActionKind::Forward => {
                    n += 1;
                    bytes += act;
                }
                ActionKind::BackwardWeight | ActionKind::FullBackward => {
                    n = n.saturating_sub(1);
                    bytes -= act;
                }
                _ => {}
            }
            peak_stash[r] = peak_stash[r].max(n);
            peak_stash_bytes[r] = f64::max(peak_stash_bytes[r], bytes);
        }
        let weights: f64 = (0..nv)
            .filter(|&s| schedule.layout.rank_of(s) == r)
            .map(|s| costs.stages[s].weight_memory)
            .sum();
        peak_memory[r] = weights * (1.0 + costs.optimizer_state_factor) + peak_stash_bytes[r];
    }
    let mut critical_path = vec![];
    let last = (0..p)
        .filter_map(|r| timing[r].len().checked_sub(1).map(|i| (r, i)))
        .max_by(|a, b| timing[a.0][a.1].1.total_cmp(&timing[b.0][b.1].1));
    let mut at = last;
    while let Some((r, i)) = at {
        critical_path.push(events[r][i]);
        at = timing[r][i].2;
    }
    critical_path.reverse();
    Ok(SimReport {
        makespan,
        bubble_fraction,
        busy,
        peak_stash,
        peak_stash_bytes,
        peak_memory,
        critical_path,
        events,
    })
}
