//! The planner: partition + schedule + simulation, choosing among candidate partitions by
//! the simulated iteration time of the schedule that will actually run.
//!
//! [`plan`] partitions the forward function into as many virtual stages as the schedule
//! needs (P for one stage per device; P·V for interleaved 1F1B; 2P for ZB-V), lays them out
//! (a stage DAG with one stage per device for the graph partitioner, a chain otherwise),
//! builds the schedule on that layout, adds communication, validates it, fills the
//! simulator's [`CostTable`] from the cost model (per-stage F/B/W, per-edge transfer times,
//! weights and stash bytes) and simulates. The best candidate by makespan among those whose
//! peak memory fits the limit wins; when none fits, the error names the device, what fills
//! it (weights, gradients, optimizer state, stash) and what the closest plan needs.
//!
//! Memory per device: weights × (2 + optimizer state), plus micro-batches in flight × each
//! stage's stash (what its backward reads, from the training program `@grad` that
//! autodiff builds for the candidate: [`crate::recompute::analyze`]), plus, while a
//! backward runs, the recomputed values live at once and the temporaries of the stage's
//! functions (values made and read within one of them, by liveness). With [`RecomputeMode::Auto`] the devices over the limit recompute activations
//! (the least extra time within their budget, [`crate::recompute::choose_within`]), and the
//! partitions that fit only thanks to that (weights fit, activations do not) are candidates
//! too, as is, per partition, the fastest schedule of a search up to 1.25× over the limit
//! (candidates are analysed lazily, fastest first); [`RecomputeMode::All`] recomputes
//! everything on every stage. The recomputation time is added to each stage's input-gradient time, and [`Plan::recompute`] lists, by
//! `@grad` value name, what each stage makes again, for the driver to apply
//! ([`crate::recompute::apply_named`]).

use std::rc::Rc;
use std::time::Duration;

use crate::autodiff::{build_gradient_function, AutodiffOptions};
use crate::cost::{comm_time, DeviceProfile};
use crate::partition::{
    apply, human_bytes, partition_with, MemoryModel, Partition, PartitionCache, PartitionKind,
    PartitionOptions,
};
use crate::recompute::{
    analyze, choose_all, choose_within, evaluate, Budget, RecomputeMode, StageChoice,
};
use crate::schedule::reorder::improve;
use crate::schedule::search::{search_ranked_over, Trial};
use crate::schedule::{
    builtin_on, insert_communication, validate, zb_v_measured_within, ActionKind, Layout, Schedule,
};
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
    /// A user schedule (a `.pps` program or a torch CSV); its layout decides the virtual
    /// stages.
    Custom(Schedule),
    /// `--schedule auto`: search the schedules of every layout ([`ScheduleSpec::Search`]
    /// with one stage per device, the V, interleaved chains of 2–4 chunks) and keep the
    /// fastest plan that fits the memory limit; [`Plan::search`] lists what was tried.
    Auto,
    /// Search the schedules of one layout ([`crate::schedule::search`]): `chunks` stages
    /// per device, as a V when `v`.
    Search { chunks: usize, v: bool },
}

impl ScheduleSpec {
    pub fn name(&self) -> String {
        match self {
            ScheduleSpec::Builtin(n) => n.clone(),
            ScheduleSpec::Custom(_) => "custom".into(),
            ScheduleSpec::Auto => "auto".into(),
            ScheduleSpec::Search { v: true, .. } => "auto (V)".into(),
            ScheduleSpec::Search { chunks: 1, .. } => "auto (one stage per device)".into(),
            ScheduleSpec::Search { chunks, .. } => format!("auto (interleaved, {chunks} chunks)"),
        }
    }

    /// The search over `layout`'s shape of layout.
    pub fn search_for(layout: &Layout) -> Self {
        match layout {
            Layout::VShape { .. } => ScheduleSpec::Search { chunks: 2, v: true },
            Layout::Interleaved { chunks, .. } => ScheduleSpec::Search {
                chunks: *chunks,
                v: false,
            },
            Layout::Dag { .. } => ScheduleSpec::Search {
                chunks: 1,
                v: false,
            },
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
    /// Which activations the backward recomputes (see [`crate::recompute`]).
    pub recompute: RecomputeMode,
}

/// What one stage recomputes in the plan, per micro-batch.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StageRecompute {
    pub stage: usize,
    /// The (first) result names, in the training function `@grad`, of the forward ops the
    /// backward makes again, in body order.
    pub values: Vec<String>,
    /// Bytes stashed without recomputation, and with it.
    pub stash_bytes_off: f64,
    pub stash_bytes: f64,
    /// Bytes of the recomputed values (live during the backward).
    pub recomputed_bytes: f64,
    pub extra_seconds: f64,
    pub extra_flops: f64,
    /// Whether the choice is proven the least extra time for its budget.
    pub exact: bool,
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
    /// Per stage, what it recomputes (empty without recomputation).
    pub recompute: Vec<StageRecompute>,
    /// The schedule's name (for a searched schedule, what the search chose).
    pub schedule_name: String,
    /// Under `auto`: every schedule simulated, on every layout and candidate partition.
    pub search: Vec<SearchTrial>,
    /// Under `auto`: the layouts that gave no plan, and why.
    pub search_failures: Vec<String>,
}

/// One schedule the automatic search simulated.
#[derive(Clone, Debug, PartialEq)]
pub struct SearchTrial {
    /// The layout's search ([`ScheduleSpec::name`]).
    pub layout: String,
    /// Which candidate partition of that layout (0: the partitioner's best estimate).
    pub partition: usize,
    pub trial: Trial,
}

/// Micro-batches of activations a stage of `schedule` keeps at most (for the partitioner's
/// memory estimate; the simulation checks the real peak).
fn stash_estimate(schedule: &ScheduleSpec, ranks: usize, m: usize) -> f64 {
    let n = match schedule {
        ScheduleSpec::Builtin(name) => match name.as_str() {
            "gpipe" => m,
            "zb-h2" | "zb-v" | "interleaved-1f1b" => m.min(2 * ranks),
            // 2p + 1 chunk activations, each about half a stage of the others.
            "dualpipe-v" => m.min(2 * ranks + 1),
            _ => m.min(ranks),
        },
        // The schedule's own largest stash on a rank (F adds one, B or W frees one).
        ScheduleSpec::Custom(s) => s
            .per_rank
            .iter()
            .map(|list| {
                let (mut n, mut peak) = (0usize, 0usize);
                for a in list {
                    match a.kind {
                        ActionKind::Forward => n += 1,
                        ActionKind::FullBackward | ActionKind::BackwardWeight => {
                            n = n.saturating_sub(1)
                        }
                        _ => {}
                    }
                    peak = peak.max(n);
                }
                peak
            })
            .max()
            .unwrap_or(m)
            .min(m),
        ScheduleSpec::Auto
        | ScheduleSpec::Search {
            chunks: 1,
            v: false,
        } => m.min(ranks),
        ScheduleSpec::Search { .. } => m.min(2 * ranks),
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
            "zb-v" | "dualpipe-v" => (2 * p, Some(Layout::VShape { ranks: p })),
            _ => (p, None),
        }),
        ScheduleSpec::Search { v: true, .. } => Ok((2 * p, Some(Layout::VShape { ranks: p }))),
        ScheduleSpec::Search { chunks, .. } if *chunks > 1 => Ok((
            p * chunks,
            Some(Layout::Interleaved {
                ranks: p,
                chunks: *chunks,
            }),
        )),
        ScheduleSpec::Search { .. } => Ok((p, None)),
        ScheduleSpec::Auto => Err(fail("internal error: `auto` searches layout by layout")),
    }
}

/// Plan `function` of `m`; see the module docs.
pub fn plan(m: &ppir::Module, o: &PlannerOptions) -> Result<Plan, PassError> {
    plan_with(m, o, &mut PartitionCache::default())
}

/// [`plan`], reusing the partitioner's work in `cache` (see [`PartitionCache`]: the same
/// module and profile; e.g. a plan and its sequential baseline).
pub fn plan_with(
    m: &ppir::Module,
    o: &PlannerOptions,
    cache: &mut PartitionCache,
) -> Result<Plan, PassError> {
    if o.ranks == 0 || o.microbatches == 0 {
        return Err(fail("stages and micro-batches must be at least 1"));
    }
    if o.schedule == ScheduleSpec::Auto {
        return plan_auto(m, o, cache);
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
    popts.device_of_stage = fixed_layout
        .as_ref()
        .filter(|l| l.num_chunks() > 1)
        .map(|l| (0..k).map(|s| l.rank_of(s)).collect());
    popts.op_timer = o.op_timer.clone();
    let explain = |e: PassError| -> PassError {
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
    };
    // With recomputation most of the stash can go: partitions whose weights, gradients
    // and optimizer state fit are candidates too, and recomputation then fits their
    // activations into what is left (or the candidate is dropped).
    let strict = match partition_with(m, &popts, cache) {
        Ok(c) => c,
        Err(_) if o.recompute != RecomputeMode::Off => vec![],
        Err(PassError::Failed { pass, message }) if message.contains("memory limit") => {
            return Err(explain(PassError::Failed {
                pass,
                message: format!(
                    "{message} (--recompute auto makes activations again in the backward instead of keeping them)"
                ),
            }))
        }
        Err(e) => return Err(explain(e)),
    };
    let mut simulated = vec![];
    // Candidates that fit, on the partitioner's estimate or (`true`) analysed with their
    // training program's stash.
    let models = StashModels::default();
    let mut fitting: Vec<(Plan, bool)> = vec![];
    // The candidate that comes closest to the limit, when none fits.
    let mut least_over: Option<Plan> = None;
    let mut least_over_analyzed = false;
    let mut first_error = None;
    let mut seen: Vec<Vec<u32>> = vec![];
    let mut trials: Vec<SearchTrial> = vec![];
    let mut round = 0;
    let mut queue = strict;
    loop {
        if queue.is_empty() {
            // The partitions that fit only with recomputation, when the others do not
            // fit without it.
            let fastest = fitting
                .iter()
                .min_by(|a, b| a.0.report.makespan.total_cmp(&b.0.report.makespan));
            let needed = fastest.is_none_or(|(p, analyzed)| {
                *analyzed || max_peak(&p.report) > ROUGH_MARGIN * limit
            });
            if round > 0 || o.recompute == RecomputeMode::Off || !needed {
                break;
            }
            round += 1;
            let mut relaxed = popts.clone();
            relaxed.memory.stash = 0.0;
            match partition_with(m, &relaxed, cache) {
                Ok(more) => queue = more,
                Err(e) if fitting.is_empty() && least_over.is_none() => return Err(explain(e)),
                Err(_) => break,
            }
            continue;
        }
        let part = queue.remove(0);
        if seen.contains(&part.stage_of_op) {
            continue;
        }
        seen.push(part.stage_of_op.clone());
        let layout = match &fixed_layout {
            Some(l) => l.clone(),
            None if o.partition == PartitionKind::Graph => Layout::Dag {
                ranks: k,
                rank_of: (0..k).collect(),
                edges: part.edges.iter().map(|e| (e.from, e.to)).collect(),
            },
            None => Layout::chain(k),
        };
        let costs0 = cost_table(&part, &o.profile, o.optimizer_state);
        let schedules: Vec<(Schedule, String)> = match &o.schedule {
            // ZB-V's weight gradients fill the time its order leaves idle at these costs.
            ScheduleSpec::Builtin(name)
                if name == "zb-v" && layout == (Layout::VShape { ranks: o.ranks }) =>
            {
                vec![(
                    zb_v_measured_within(o.ranks, o.microbatches, &costs0, 2 * o.ranks, limit),
                    o.schedule.name(),
                )]
            }
            ScheduleSpec::Builtin(name) => vec![(
                builtin_on(name, &layout, o.microbatches, o.chunks)
                    .map_err(|e| fail(e.to_string()))?,
                o.schedule.name(),
            )],
            ScheduleSpec::Custom(s) => vec![(s.clone(), o.schedule.name())],
            // The runners-up too: the chosen one may not fit with its training program's
            // stash after all.
            ScheduleSpec::Search { .. } => {
                // With recomputation allowed, also the fastest schedules that fit only by
                // recomputing (analysed fastest first, like every candidate then).
                let keep_over = if o.recompute == RecomputeMode::Auto {
                    SEARCH_OVER_LIMIT
                } else {
                    0
                };
                let (ranked, tried) = search_ranked_over(
                    &layout,
                    o.microbatches,
                    &costs0,
                    limit,
                    SEARCH_RUNNERS_UP + 1,
                    keep_over,
                    OVER_LIMIT_FACTOR,
                );
                let layout_name = o.schedule.name();
                trials.extend(tried.into_iter().map(|trial| SearchTrial {
                    layout: layout_name.clone(),
                    partition: seen.len() - 1,
                    trial,
                }));
                if ranked.is_empty() {
                    first_error.get_or_insert(format!(
                        "no schedule could be simulated on {}",
                        o.schedule.name()
                    ));
                    continue;
                }
                ranked
            }
            ScheduleSpec::Auto => {
                return Err(fail("internal error: `auto` searches layout by layout"))
            }
        };
        for (runner_up, (schedule, schedule_name)) in schedules.into_iter().enumerate() {
            let part = part.clone();
            let layout = layout.clone();
            let mut costs = costs0.clone();
            let schedule = insert_communication(&schedule);
            if let Err(e) = validate(&schedule) {
                return Err(fail(format!("the schedule is not valid: {e}")));
            }
            // With recomputation: the stash from the training program itself, and what to
            // recompute (without, the partitioner's estimate until a plan is chosen).
            let rough = match simulate(&schedule, &costs) {
                Ok(r) => r,
                Err(e) => {
                    first_error.get_or_insert(e.to_string());
                    continue;
                }
            };
            // Under `--recompute auto` every candidate is analysed only when its turn comes
            // (`fastest_fitting`, fastest first): recomputation only adds time, so the
            // slower candidates behind the first that fits need no analysis at all.
            let lazy = o.recompute == RecomputeMode::Auto;
            let (choices, report, model) = if o.recompute == RecomputeMode::Off || lazy {
                (vec![], rough, None)
            } else {
                let model = models.get(m, o, &part)?;
                let (c, r) = fit(&model, o, &schedule, &mut costs, limit)?;
                (c, r, Some(model))
            };
            // One entry per partition: its first choice.
            if runner_up == 0 {
                simulated.push((part.is_chain(), report.makespan));
            }
            let over = max_peak(&report) - limit;
            let total: f64 = part.stages.iter().map(|s| s.cost.time()).sum();
            let candidate = Plan {
                lower_bound: o.microbatches as f64 * total / o.ranks as f64,
                recompute: model
                    .as_ref()
                    .map_or(vec![], |md| recompute_list(md, &choices)),
                partition: part,
                layout,
                schedule,
                costs,
                report,
                candidates: vec![],
                schedule_name,
                search: vec![],
                search_failures: vec![],
            };
            if over > 0.0 && !lazy {
                let closer = least_over
                    .as_ref()
                    .is_none_or(|b| over < max_peak(&b.report) - limit);
                if closer {
                    least_over_analyzed = model.is_some();
                    least_over = Some(candidate);
                }
                continue;
            }
            fitting.push((candidate, model.is_some()));
        }
    }
    // A plan chosen on the partitioner's estimate: its stash from its training program
    // (and, under `auto`, recomputation if it needs it after all).
    let refine = |p: &mut Plan| -> Result<(), PassError> {
        let model = models.get(m, o, &p.partition)?;
        let (choices, report) = fit(&model, o, &p.schedule, &mut p.costs, limit)?;
        p.report = report;
        p.recompute = recompute_list(&model, &choices);
        Ok(())
    };
    // The fastest candidate that still fits with its training program's stash; one that
    // does not fit after all competes for "closest to the limit".
    let peak_of = |p: &Plan| max_peak(&p.report);
    let mut refined_over: Vec<Plan> = vec![];
    let best = fastest_fitting(
        fitting,
        |p: &Plan| p.report.makespan,
        |p: &mut Plan| {
            refine(p)?;
            Ok::<bool, PassError>(peak_of(p) <= limit)
        },
        |p| refined_over.push(p),
    )?;
    for p in refined_over {
        if least_over.as_ref().is_none_or(|b| peak_of(&p) < peak_of(b)) {
            least_over = Some(p);
            least_over_analyzed = true;
        }
    }
    if !least_over_analyzed {
        if let Some(p) = least_over.as_mut() {
            refine(p)?;
        }
    }
    let Some(mut plan) = best else {
        return Err(match least_over {
            Some(p) => over_limit(m, o, &p, limit),
            None => fail(format!(
                "no candidate could be simulated: {}",
                first_error.unwrap_or_default()
            )),
        });
    };
    plan.candidates = simulated;
    plan.search = trials;
    Ok(plan)
}

/// The fastest of `candidates` that fits: each comes with whether it has been checked
/// already (then it fits); the others are checked by `refine_fits` (the training
/// program's stash, and recomputation where allowed) in order of `makespan`, and those
/// that do not fit after all go to `over`. Refining can only add time (recomputation),
/// never take it away, so the search stops at the first candidate whose unrefined
/// makespan is no shorter than the best refined one. Choosing on the estimate alone and
/// giving up when that one failed left a layout without a plan although a slower
/// candidate fitted.
fn fastest_fitting<T, E>(
    mut candidates: Vec<(T, bool)>,
    makespan: impl Fn(&T) -> f64,
    mut refine_fits: impl FnMut(&mut T) -> Result<bool, E>,
    mut over: impl FnMut(T),
) -> Result<Option<T>, E> {
    candidates.sort_by(|a, b| makespan(&a.0).total_cmp(&makespan(&b.0)));
    let mut best: Option<T> = None;
    for (mut c, checked) in candidates {
        if best
            .as_ref()
            .is_some_and(|b| makespan(&c) >= makespan(b) * (1.0 - 1e-12))
        {
            break;
        }
        if !checked && !refine_fits(&mut c)? {
            over(c);
            continue;
        }
        if best
            .as_ref()
            .is_none_or(|b| makespan(&c) < makespan(b) * (1.0 - 1e-12))
        {
            best = Some(c);
        }
    }
    Ok(best)
}

/// How many schedules besides its choice the search hands the planner per partition, to
/// fall back on when the choice does not fit with its training program's stash.
const SEARCH_RUNNERS_UP: usize = 2;

/// Under `--recompute auto`, how many schedules over the memory limit (by the partitioner's
/// estimate) the search also hands the planner per partition, to fit by recomputation.
const SEARCH_OVER_LIMIT: usize = 1;

/// ... and how far over the limit they may be.
const OVER_LIMIT_FACTOR: f64 = 1.25;

/// The most virtual stages `auto` partitions for an interleaved chain of more than 2 chunks.
pub const AUTO_MAX_STAGES: usize = 16;

/// `--schedule auto`: plan each layout's search ([`ScheduleSpec::Search`]) and keep the
/// fastest plan (all of them fit the memory limit). Layouts with several stages per device
/// use the sequential partitioner (the uniform one when asked for); one stage per device
/// uses `o.partition`.
fn plan_auto(
    m: &ppir::Module,
    o: &PlannerOptions,
    cache: &mut PartitionCache,
) -> Result<Plan, PassError> {
    let p = o.ranks;
    let several = if o.partition == PartitionKind::Uniform {
        PartitionKind::Uniform
    } else {
        PartitionKind::Sequential
    };
    let mut layouts = vec![
        (
            ScheduleSpec::Search {
                chunks: 1,
                v: false,
            },
            o.partition,
            1,
        ),
        (ScheduleSpec::Search { chunks: 2, v: true }, several, 2),
    ];
    // Interleaved chains of 3 and 4 chunks only up to 16 stages: the partitioner's time
    // grows with the cube of the stage count.
    if o.microbatches.is_multiple_of(p) {
        for chunks in (2..=4).filter(|&c| c == 2 || p * c <= AUTO_MAX_STAGES) {
            layouts.push((ScheduleSpec::Search { chunks, v: false }, several, chunks));
        }
    }
    let mut best: Option<Plan> = None;
    let mut trials = vec![];
    let mut failures = vec![];
    for (spec, partition, chunks) in layouts {
        let lo = PlannerOptions {
            schedule: spec.clone(),
            partition,
            chunks,
            ..o.clone()
        };
        match plan_with(m, &lo, cache) {
            Ok(pl) => {
                trials.extend(pl.search.iter().cloned());
                if best
                    .as_ref()
                    .is_none_or(|b| pl.report.makespan < b.report.makespan * (1.0 - 1e-12))
                {
                    best = Some(pl);
                }
            }
            Err(e) => failures.push(format!("{}: {e}", spec.name())),
        }
    }
    let Some(mut plan) = best else {
        return Err(fail(format!(
            "no layout gave a plan: {}",
            failures.join("; ")
        )));
    };
    plan.search = trials;
    plan.search_failures = failures;
    let limit = o.memory_limit.unwrap_or(o.profile.memory_bytes);
    reorder_plan(&mut plan, limit);
    Ok(plan)
}

/// The largest peak memory of any device in `r`.
fn max_peak(r: &SimReport) -> f64 {
    r.peak_memory.iter().copied().fold(0.0, f64::max)
}

/// Evaluations `auto`'s last step, the order search, may spend (about 0.1 ms each for a
/// schedule of 6,000 actions).
pub const REORDER_EVALUATIONS: usize = 6000;

/// `auto`'s last step: the critical-path local search over the chosen schedule's per-rank
/// orders ([`crate::schedule::reorder::improve`]), at the plan's own costs (its training
/// program's stash, and what it recomputes), each rank held to the plan's peak memory, or
/// to `limit` when that is lower. The plan keeps the reordered schedule only when it
/// simulates faster within that memory.
fn reorder_plan(plan: &mut Plan, limit: f64) {
    let cap = max_peak(&plan.report).min(limit);
    let Some((compute, _)) = improve(&plan.schedule, &plan.costs, cap, REORDER_EVALUATIONS) else {
        return;
    };
    let schedule = insert_communication(&compute);
    if validate(&schedule).is_err() {
        return;
    }
    let Ok(report) = simulate(&schedule, &plan.costs) else {
        return;
    };
    if report.makespan >= plan.report.makespan || max_peak(&report) > cap {
        return;
    }
    let layout = ScheduleSpec::search_for(&plan.layout).name();
    let partition = plan
        .search
        .iter()
        .find(|t| t.layout == layout && t.trial.name == plan.schedule_name)
        .map_or(0, |t| t.partition);
    plan.schedule_name = format!("{} +reordered", plan.schedule_name);
    plan.search.push(SearchTrial {
        layout,
        partition,
        trial: Trial {
            name: plan.schedule_name.clone(),
            makespan: report.makespan,
            peak_memory: max_peak(&report),
            fits: true,
        },
    });
    plan.schedule = schedule;
    plan.report = report;
}

/// What `auto` tried and why it chose its plan: per layout and schedule, the best
/// iteration over the candidate partitions and its peak memory, fastest first, and a
/// closing line naming the choice.
pub fn search_report(plan: &Plan, memory_limit: f64) -> String {
    use std::fmt::Write;
    // (layout, schedule) → best trial over the partitions.
    let mut rows: Vec<&SearchTrial> = vec![];
    for t in &plan.search {
        match rows
            .iter_mut()
            .find(|r| r.layout == t.layout && r.trial.name == t.trial.name)
        {
            Some(r) => {
                let better = (t.trial.fits && !r.trial.fits)
                    || (t.trial.fits == r.trial.fits && t.trial.makespan < r.trial.makespan);
                if better {
                    *r = t;
                }
            }
            None => rows.push(t),
        }
    }
    rows.sort_by(|a, b| {
        b.trial
            .fits
            .cmp(&a.trial.fits)
            .then(a.trial.makespan.total_cmp(&b.trial.makespan))
    });
    let lb = plan.lower_bound;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "schedule search: {} schedules simulated ({} distinct), memory limit {}",
        plan.search.len(),
        rows.len(),
        human_bytes(memory_limit)
    );
    let _ = writeln!(
        out,
        "| layout | schedule | iteration (ms) | lower bound / iteration | peak memory (estimate) | fits |"
    );
    let _ = writeln!(out, "|---|---|---:|---:|---:|---|");
    for r in &rows {
        let _ = writeln!(
            out,
            "| {} | {} | {:.3} | {:.3} | {} | {} |",
            r.layout,
            r.trial.name,
            r.trial.makespan * 1e3,
            if r.trial.makespan > 0.0 {
                lb / r.trial.makespan
            } else {
                0.0
            },
            human_bytes(r.trial.peak_memory),
            if r.trial.fits { "yes" } else { "no" }
        );
    }
    for f in &plan.search_failures {
        let _ = writeln!(out, "not planned: {f}");
    }
    let peak = max_peak(&plan.report);
    let faster_over = rows
        .iter()
        .find(|r| !r.trial.fits && r.trial.makespan < plan.report.makespan);
    let _ = write!(
        out,
        "chose {} on {}: the shortest predicted iteration ({:.3} ms, {:.3} of the lower bound) of the schedules that fit (peak {} of {})",
        plan.schedule_name,
        ScheduleSpec::search_for(&plan.layout).name(),
        plan.report.makespan * 1e3,
        if plan.report.makespan > 0.0 { lb / plan.report.makespan } else { 0.0 },
        human_bytes(peak),
        human_bytes(memory_limit),
    );
    if let Some(r) = faster_over {
        let _ = write!(
            out,
            "; {} would take {:.3} ms but needs about {} (the estimate above)",
            r.trial.name,
            r.trial.makespan * 1e3,
            human_bytes(r.trial.peak_memory)
        );
    }
    out
}

/// Under `--recompute auto`, when the fastest candidate's estimated peak is above this
/// share of the limit, the partitions that fit only with recomputation are tried too (the
/// estimate leaves out received values and the functions' temporaries).
const ROUGH_MARGIN: f64 = 0.8;

/// What each stage of a plan recomputes, by `@grad` value name.
fn recompute_list(model: &StashModel, choices: &[StageChoice]) -> Vec<StageRecompute> {
    choices
        .iter()
        .filter(|c| !c.ops.is_empty())
        .map(|c| StageRecompute {
            stage: c.stage as usize,
            values: c
                .ops
                .iter()
                .filter_map(|&op| model.g.op(op).results().first())
                .map(|&v| model.g.value(v).name.clone())
                .collect(),
            stash_bytes_off: c.stash_bytes_off,
            stash_bytes: c.stash_bytes,
            recomputed_bytes: c.recomputed_bytes,
            extra_seconds: c.extra_time,
            extra_flops: c.extra_flops,
            exact: c.exact,
        })
        .collect()
}

/// The training program of a partition and each stage's recomputation problem.
struct StashModel {
    g: ppir::Function,
    problems: Vec<crate::recompute::StageProblem>,
}

/// Stash models by partition (`stage_of_op`): the search's runners-up share their
/// partition, and each would otherwise run autodiff on it again.
#[derive(Default)]
struct StashModels(std::cell::RefCell<Vec<(Vec<u32>, Rc<StashModel>)>>);

impl StashModels {
    fn get(
        &self,
        m: &ppir::Module,
        o: &PlannerOptions,
        part: &Partition,
    ) -> Result<Rc<StashModel>, PassError> {
        if let Some((_, md)) = self.0.borrow().iter().find(|(k, _)| *k == part.stage_of_op) {
            return Ok(md.clone());
        }
        let md = Rc::new(stash_model(m, o, part)?);
        self.0
            .borrow_mut()
            .push((part.stage_of_op.clone(), md.clone()));
        Ok(md)
    }
}

fn stash_model(
    m: &ppir::Module,
    o: &PlannerOptions,
    part: &Partition,
) -> Result<StashModel, PassError> {
    let mut copy = m.clone_without_weights();
    apply(&mut copy, &o.function, part)?;
    let mut ad = o.autodiff.clone();
    ad.function = o.function.clone();
    let info = build_gradient_function(&mut copy, &ad)?;
    let g = copy
        .functions
        .into_iter()
        .find(|f| f.name == info.function)
        .ok_or_else(|| fail("autodiff made no gradient function"))?;
    // Recomputed ops are costed by the model (not measured one by one).
    let profile = DeviceProfile {
        measure_ops: false,
        ..o.profile.clone()
    };
    let problems = analyze(&g, &profile)?;
    Ok(StashModel { g, problems })
}

/// Time the planner gives the exact recomputation choice per stage.
const PLANNER_ILP_LIMIT: Duration = Duration::from_millis(250);

/// Put each stage's stash (and, with recomputation, its recomputed work) into `costs`
/// and simulate. `auto` recomputes only on devices over `limit`: each stage on such a
/// device gets the stash budget `(limit − weights − transient) / in-flight micro-batches`,
/// refined a few times as the transient and the simulated peak move.
fn fit(
    model: &StashModel,
    o: &PlannerOptions,
    schedule: &Schedule,
    costs: &mut CostTable,
    limit: f64,
) -> Result<(Vec<StageChoice>, SimReport), PassError> {
    let g = &model.g;
    let base = costs.clone();
    let working: std::collections::HashMap<u32, f64> = model
        .problems
        .iter()
        .map(|p| (p.stage, p.working))
        .collect();
    let set = |costs: &mut CostTable, choices: &[StageChoice]| {
        for c in choices {
            let i = c.stage as usize;
            if let (Some(st), Some(b)) = (costs.stages.get_mut(i), base.stages.get(i)) {
                st.activation_memory = c.stash_bytes;
                // The recomputed values and the stage's own temporaries (a bound: their
                // peaks need not coincide; the driver counts the stage functions exactly).
                st.transient_memory =
                    c.recomputed_bytes + working.get(&c.stage).copied().unwrap_or(0.0);
                st.backward_input = b.backward_input + c.extra_time;
            }
        }
    };
    let run = |costs: &CostTable| simulate(schedule, costs).map_err(|e| fail(e.to_string()));
    let none = std::collections::HashSet::new();
    let off: Vec<StageChoice> = model
        .problems
        .iter()
        .map(|p| evaluate(g, p, &none))
        .collect();
    let mut choices = match o.recompute {
        RecomputeMode::All => model.problems.iter().map(|p| choose_all(g, p)).collect(),
        _ => off.clone(),
    };
    set(costs, &choices);
    let mut report = run(costs)?;
    if o.recompute != RecomputeMode::Auto {
        return Ok((choices, report));
    }
    // Per device over the limit: its stages share what the weights leave, each for its
    // share of the micro-batches in flight; a round that still ends over the limit
    // tightens the budget by the excess.
    let mut slack = vec![0.0f64; report.peak_memory.len()];
    for round in 0..4 {
        let over: Vec<usize> = (0..report.peak_memory.len())
            .filter(|&r| report.peak_memory[r] > limit)
            .collect();
        if over.is_empty() {
            break;
        }
        let mut changed = false;
        for r in over {
            let weights = report.peak_memory[r] - report.peak_stash_bytes[r];
            let mine: Vec<usize> = (0..model.problems.len())
                .filter(|&i| {
                    let s = model.problems[i].stage as usize;
                    s < costs.stages.len() && schedule.layout.rank_of(s) == r
                })
                .collect();
            if mine.is_empty() {
                continue;
            }
            if round > 0 {
                slack[r] += report.peak_memory[r] - limit;
            }
            let share = mine.len() as f64;
            let peak = mine
                .iter()
                .map(|&i| model.problems[i].working)
                .fold(0.0, f64::max);
            let budget = Budget {
                bytes: ((limit - weights - peak - slack[r]) / share).max(0.0),
                inflight: (report.peak_stash[r].max(1) as f64 / share).max(1.0),
            };
            for i in mine {
                let c = choose_within(g, &model.problems[i], budget, PLANNER_ILP_LIMIT);
                changed |= c.ops != choices[i].ops;
                choices[i] = c;
            }
        }
        set(costs, &choices);
        report = run(costs)?;
        if !changed {
            break;
        }
    }
    Ok((choices, report))
}

/// Why no candidate fits: the device, what fills it, the smallest limit that works for
/// this plan, and (without recomputation) what `--recompute all` would need.
fn over_limit(m: &ppir::Module, o: &PlannerOptions, p: &Plan, limit: f64) -> PassError {
    let Some((r, &peak)) = p
        .report
        .peak_memory
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
    else {
        return fail("the plan has no devices");
    };
    let weights: f64 = (0..p.costs.stages.len())
        .filter(|&s| p.schedule.layout.rank_of(s) == r)
        .map(|s| p.costs.stages[s].weight_memory)
        .sum();
    let transient = (0..p.costs.stages.len())
        .filter(|&s| p.schedule.layout.rank_of(s) == r)
        .map(|s| p.costs.stages[s].transient_memory)
        .fold(0.0, f64::max);
    let stash = (p.report.peak_stash_bytes[r] - transient).max(0.0);
    let mut hint = String::new();
    if o.recompute == RecomputeMode::Off {
        let all = PlannerOptions {
            recompute: RecomputeMode::All,
            memory_limit: Some(f64::INFINITY),
            ..o.clone()
        };
        if let Ok(q) = plan(m, &all) {
            let need = max_peak(&q.report);
            hint = format!(
                "; recomputing activations (--recompute auto) needs {} at least",
                human_bytes(need)
            );
        }
    }
    fail(format!(
        "device {r} needs {} at its peak under this schedule, the memory limit is {} (over by {}): weights {}, gradients {}, optimizer state {}, stashed activations {} ({} in flight), temporaries of a stage function {} (recomputed values included); the plan closest to the limit needs {}{hint}; use more stages, a schedule that keeps fewer micro-batches in flight (1f1b rather than gpipe), or a larger memory limit",
        human_bytes(peak),
        human_bytes(limit),
        human_bytes(peak - limit),
        human_bytes(weights),
        human_bytes(weights),
        human_bytes(weights * (p.costs.optimizer_state_factor - 1.0).max(0.0)),
        human_bytes(stash),
        match p.report.peak_stash[r] {
            1 => "1 micro-batch".to_string(),
            n => format!("{n} micro-batches"),
        },
        human_bytes(transient),
        human_bytes(peak),
    ))
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
            transient_memory: 0.0,
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

#[cfg(test)]
mod tests {
    use super::fastest_fitting;

    /// (makespan, fits once refined, makespan once refined)
    type Cand = (f64, bool, f64);

    fn pick(cands: Vec<(Cand, bool)>) -> (Option<Cand>, Vec<Cand>, usize) {
        let mut over = vec![];
        let mut refined = 0;
        let best = fastest_fitting(
            cands,
            |c: &Cand| c.0,
            |c: &mut Cand| {
                refined += 1;
                c.0 = c.2;
                Ok::<bool, ()>(c.1)
            },
            |c| over.push(c),
        )
        .unwrap();
        (best, over, refined)
    }

    #[test]
    fn the_fastest_that_still_fits_once_refined_is_chosen() {
        // The estimate's best does not fit with its real stash: the next one is taken.
        let (best, over, _) = pick(vec![
            ((1.0, false, 1.0), false),
            ((2.0, true, 2.0), false),
            ((3.0, true, 3.0), false),
        ]);
        assert_eq!(best, Some((2.0, true, 2.0)));
        assert_eq!(over, vec![(1.0, false, 1.0)]);
        // Refinement that adds time (recomputation) lets a later candidate win, and the
        // search stops once no unrefined candidate can beat the best refined one.
        let (best, over, refined) = pick(vec![
            ((1.0, true, 2.5), false),
            ((2.0, true, 2.2), false),
            ((2.4, true, 2.4), false),
            ((9.0, true, 9.0), false),
        ]);
        assert_eq!(best, Some((2.2, true, 2.2)));
        assert!(over.is_empty());
        assert_eq!(
            refined, 2,
            "the candidates at 2.4 and 9.0 are never refined"
        );
        // A checked candidate is taken as it is; none fits: none is chosen.
        let (best, _, refined) = pick(vec![((3.0, false, 3.0), true)]);
        assert_eq!((best, refined), (Some((3.0, false, 3.0)), 0));
        let (best, over, _) = pick(vec![((1.0, false, 1.0), false), ((2.0, false, 2.0), false)]);
        assert_eq!((best, over.len()), (None, 2));
    }
}
