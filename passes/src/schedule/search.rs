//! Automatic schedule search (`--schedule auto`): for one partition (its layout and stage
//! costs), every built-in schedule that runs on the layout, with its parameters swept,
//! each also with its weight gradients placed greedily into idle time, and a local search
//! over per-stage warm-up depth and weight-gradient deferral — all simulated, the fastest
//! that fits the memory limit kept.
//!
//! What is tried on each layout:
//! - one stage per device (a chain or a stage DAG): GPipe, 1F1B, ZB-H1, ZB-H2 and the
//!   zero-bubble family between them ([`zb_family`], named `zb (α a)`: `h(s)+1+⌊α·h(s)⌉`
//!   warm-up forwards and `(1+α)(H−h(s))` deferred `W`s, α ∈ {¼, ½, ¾}; α = 0 is ZB-H1,
//!   α = 1 ZB-H2; `h(s)` is the stage's height, `H` the largest), then from
//!   the best of those that fit, hill climbing on each stage's warm-up count and `W`
//!   deferral ([`local_search`]);
//! - the V (two chunks per device): ZB-V and DualPipeV, and ZB-V built at the measured
//!   costs with 2p, 2p+2, 2p+4, 2p+6, 2p+8, 2p+12 and 2p+16 chunk activations per rank (more
//!   in flight lets the V's bottom ranks fill the wait for their first input gradient with
//!   forwards; the memory limit decides) and with each rank's stash
//!   held to the bytes of the construction's peak and of the limit (when that is within
//!   twice the construction's);
//! - an interleaved chain of `v` chunks: interleaved 1F1B.
//!
//! Each of these is also tried with its fused backwards split into `I` then `W` and the
//! `W`s placed greedily where the costs leave a device idle, never stashing more
//! micro-batches on a device than the schedule itself does ([`fill_weight_gradients`]: the
//! greedy zero-bubble heuristic).

use super::generators::{fill_weight_gradients, stage_heights, zb_on};
use super::v_greedy::{even_costs, v_stash_allowance, zb_v_greedy_variants};
use super::{builtin_on, insert_communication, ActionKind, Layout, Schedule};
use crate::simulate::{simulate, CostTable};

/// One schedule the search simulated.
#[derive(Clone, Debug, PartialEq)]
pub struct Trial {
    /// What it is: a built-in name with its parameters, `+fill` when its weight gradients
    /// were placed greedily.
    pub name: String,
    /// Predicted iteration time (seconds, or the cost table's unit).
    pub makespan: f64,
    /// The largest per-device peak memory.
    pub peak_memory: f64,
    /// Whether that peak is within the limit.
    pub fits: bool,
}

/// Per-stage extra warm-up and deferral, with their (makespan, peak).
type Params = (Vec<usize>, Vec<usize>, (f64, f64));

/// Evaluations the local search may spend per partition.
pub const LOCAL_SEARCH_EVALUATIONS: usize = 96;

/// Whether `layout` has one stage per rank (a chain, or a DAG with stage `s` on rank `s`).
fn one_stage_per_rank(layout: &Layout) -> bool {
    match layout {
        Layout::Interleaved { chunks, .. } => *chunks == 1,
        Layout::VShape { .. } => false,
        Layout::Dag { rank_of, ranks, .. } => {
            rank_of.len() == *ranks && rank_of.iter().enumerate().all(|(s, &r)| r == s)
        }
    }
}

/// The zero-bubble schedule with warm-up `h(s)+1+extra[s]` forwards and `lag[s]` deferred
/// weight gradients per stage (`extra` non-decreasing in `h` keeps it deadlock-free, see
/// the zero-bubble generators).
pub fn zb_family(
    layout: &Layout,
    m: usize,
    h: &[usize],
    extra: &[usize],
    lag: &[usize],
) -> Schedule {
    zb_on(layout.clone(), m, |s| h[s] + 1 + extra[s], |s| lag[s])
}

/// `α`'s extra warm-up and deferral per stage: `⌊α·h(s)⌉` and `(H−h(s)) + ⌊α(H−h(s))⌉`.
fn alpha_params(h: &[usize], alpha: f64) -> (Vec<usize>, Vec<usize>) {
    let top = h.iter().copied().max().unwrap_or(0);
    let extra = h
        .iter()
        .map(|&x| (alpha * x as f64).round() as usize)
        .collect();
    let lag = h
        .iter()
        .map(|&x| (top - x) + (alpha * (top - x) as f64).round() as usize)
        .collect();
    (extra, lag)
}

/// `s` with every fused backward split into its input gradient followed by its weight
/// gradient, the weight gradients then placed greedily into idle time at `costs` with no
/// more stashed micro-batches per rank than `s` has; `None` when that cannot be built.
pub fn split_and_fill(s: &Schedule, costs: &CostTable) -> Option<Schedule> {
    let mut split = s.clone();
    for list in &mut split.per_rank {
        let mut out = Vec::with_capacity(list.len() * 2);
        for a in list.iter().filter(|a| a.kind.is_compute()) {
            if a.kind == ActionKind::FullBackward {
                let mut i = *a;
                i.kind = ActionKind::BackwardInput;
                let mut w = *a;
                w.kind = ActionKind::BackwardWeight;
                out.push(i);
                out.push(w);
            } else {
                out.push(*a);
            }
        }
        *list = out;
    }
    fill_weight_gradients(&split, costs, 0)
}

/// The base schedules (compute actions only) to try on `layout`, by name.
pub fn base_schedules(layout: &Layout, m: usize) -> Vec<(String, Schedule)> {
    let mut out = vec![];
    let mut add = |name: String, s: Result<Schedule, super::ScheduleError>| {
        if let Ok(s) = s {
            out.push((name, s));
        }
    };
    match layout {
        Layout::VShape { .. } => {
            for name in ["zb-v", "dualpipe-v"] {
                add(name.into(), builtin_on(name, layout, m, 2));
            }
        }
        Layout::Interleaved { chunks, .. } if *chunks > 1 => {
            add(
                format!("interleaved-1f1b (chunks {chunks})"),
                builtin_on("interleaved-1f1b", layout, m, *chunks),
            );
        }
        _ if one_stage_per_rank(layout) => {
            for name in ["gpipe", "1f1b", "zb-h1", "zb-h2"] {
                add(name.into(), builtin_on(name, layout, m, 1));
            }
            if let Ok(h) = stage_heights(layout) {
                for alpha in [0.25, 0.5, 0.75] {
                    let (extra, lag) = alpha_params(&h, alpha);
                    add(
                        format!("zb (α {alpha})"),
                        Ok(zb_family(layout, m, &h, &extra, &lag)),
                    );
                }
            }
        }
        _ => {}
    }
    out
}

/// Simulate a compute schedule (with its communication): (makespan, largest peak memory).
pub fn evaluate(s: &Schedule, costs: &CostTable) -> Option<(f64, f64)> {
    let r = simulate(&insert_communication(s), costs).ok()?;
    let peak = r.peak_memory.iter().copied().fold(0.0, f64::max);
    Some((r.makespan, peak))
}

/// Whether (makespan, peak) `a` beats `b` under `limit`: fitting beats not fitting; among
/// fitting, the shorter iteration; among not fitting, the smaller peak.
fn better(a: (f64, f64), b: (f64, f64), limit: f64) -> bool {
    match (a.1 <= limit, b.1 <= limit) {
        (true, false) => true,
        (false, true) => false,
        (true, true) => a.0 < b.0 * (1.0 - 1e-12),
        (false, false) => a.1 < b.1,
    }
}

/// Hill climbing from (`extra`, `lag`) on a layout with one stage per rank: each round
/// tries one more or one less warm-up forward and deferred `W` on each stage, and takes
/// the best move that shortens the iteration within `limit`, until none does or
/// `evaluations` run out. Returns the parameters and their (makespan, peak).
pub fn local_search(
    layout: &Layout,
    m: usize,
    costs: &CostTable,
    limit: f64,
    start: (Vec<usize>, Vec<usize>),
    evaluations: usize,
) -> Option<Params> {
    let h = stage_heights(layout).ok()?;
    let n = h.len();
    let (mut extra, mut lag) = start;
    let mut cur = evaluate(&zb_family(layout, m, &h, &extra, &lag), costs)?;
    if cur.1 > limit {
        return None;
    }
    let mut left = evaluations;
    loop {
        let mut best_move: Option<Params> = None;
        for s in 0..n {
            for (which, delta) in [(0, 1isize), (0, -1), (1, 1), (1, -1)] {
                if left == 0 {
                    break;
                }
                let (mut e, mut l) = (extra.clone(), lag.clone());
                let v = if which == 0 { &mut e[s] } else { &mut l[s] };
                let Some(nv) = v.checked_add_signed(delta) else {
                    continue;
                };
                if which == 0 && h[s] + 1 + nv > m {
                    continue;
                }
                if which == 1 && nv > m {
                    continue;
                }
                *v = nv;
                left -= 1;
                let Some(r) = evaluate(&zb_family(layout, m, &h, &e, &l), costs) else {
                    continue;
                };
                let target = best_move.as_ref().map_or(cur, |b| b.2);
                if r.1 <= limit && r.0 < target.0 * (1.0 - 1e-12) {
                    best_move = Some((e, l, r));
                }
            }
        }
        match best_move {
            Some((e, l, r)) => {
                extra = e;
                lag = l;
                cur = r;
            }
            None => return Some((extra, lag, cur)),
        }
        if left == 0 {
            return Some((extra, lag, cur));
        }
    }
}

/// Search the schedules for `layout` at `costs` under `limit` (see the module docs):
/// the chosen compute schedule, its name, and every trial.
pub fn search(
    layout: &Layout,
    m: usize,
    costs: &CostTable,
    limit: f64,
) -> Option<(Schedule, String, Vec<Trial>)> {
    let (mut ranked, trials) = search_ranked(layout, m, costs, limit, 1);
    (!ranked.is_empty()).then(|| {
        let (s, name) = ranked.swap_remove(0);
        (s, name, trials)
    })
}

/// [`search`], keeping the `keep` fastest schedules that fit (best first; only the one
/// closest to the limit when none fits), and every trial. The planner checks the chosen
/// schedule's memory again with its training program's stash, which can exceed the
/// estimate the search used: the runners-up are what it falls back on.
pub fn search_ranked(
    layout: &Layout,
    m: usize,
    costs: &CostTable,
    limit: f64,
    keep: usize,
) -> (Vec<(Schedule, String)>, Vec<Trial>) {
    search_ranked_over(layout, m, costs, limit, keep, 0, 0.0)
}

/// [`search_ranked`], and after the schedules that fit, the `keep_over` fastest of those
/// that do not but need at most `over_factor` × `limit` (for a planner that can fit them
/// by recomputing activations), fastest first.
pub fn search_ranked_over(
    layout: &Layout,
    m: usize,
    costs: &CostTable,
    limit: f64,
    keep: usize,
    keep_over: usize,
    over_factor: f64,
) -> (Vec<(Schedule, String)>, Vec<Trial>) {
    let keep = keep.max(1);
    let mut trials = vec![];
    // Best first by `better`.
    let mut ranked: Vec<(Schedule, String, (f64, f64))> = vec![];
    // Fastest first, over the limit but within `over_factor` of it.
    let mut over: Vec<(Schedule, String, (f64, f64))> = vec![];
    let mut consider = |name: String, s: Schedule, trials: &mut Vec<Trial>| {
        let Some(r) = evaluate(&s, costs) else {
            return;
        };
        trials.push(Trial {
            name: name.clone(),
            makespan: r.0,
            peak_memory: r.1,
            fits: r.1 <= limit,
        });
        let near = r.1 > limit && r.1 <= over_factor * limit && keep_over > 0;
        if near && !over.iter().any(|x| x.0.per_rank == s.per_rank) {
            let at = over.iter().position(|x| r.0 < x.2 .0).unwrap_or(over.len());
            if at < keep_over {
                over.insert(at, (s.clone(), name.clone(), r));
                over.truncate(keep_over);
            }
        }
        if ranked.iter().any(|x| x.0.per_rank == s.per_rank) {
            return;
        }
        let at = ranked
            .iter()
            .position(|x| better(r, x.2, limit))
            .unwrap_or(ranked.len());
        if at < keep {
            ranked.insert(at, (s, name, r));
            ranked.truncate(keep);
        }
    };
    for (name, s) in base_schedules(layout, m) {
        let filled = split_and_fill(&s, costs);
        // The built-in `zb-v` lets each rank fill up to 2p chunk activations.
        let filled_2p = match layout {
            Layout::VShape { ranks } if name == "zb-v" => {
                fill_weight_gradients(&s, costs, 2 * ranks)
            }
            _ => None,
        };
        consider(name.clone(), s, &mut trials);
        if let Some(f) = filled {
            consider(format!("{name} +fill"), f, &mut trials);
        }
        if let Some(f) = filled_2p {
            consider(format!("{name} +fill (2p)"), f, &mut trials);
        }
    }
    // ZB-V built at the measured costs, with 1F1B's count of chunk activations and a few
    // more (the memory limit decides).
    if let Layout::VShape { ranks } = *layout {
        let even = even_costs(costs);
        // The fastest distinct build of the four variants, by the simulator.
        let fastest = |variants: Vec<Schedule>| -> Option<Schedule> {
            variants
                .into_iter()
                .filter_map(|s| evaluate(&s, costs).map(|(t, _)| (t, s)))
                .min_by(|a, b| a.0.total_cmp(&b.0))
                .map(|(_, s)| s)
        };
        for cap in [
            2 * ranks,
            2 * ranks + 2,
            2 * ranks + 4,
            2 * ranks + 6,
            2 * ranks + 8,
            2 * ranks + 12,
            2 * ranks + 16,
        ] {
            let caps = vec![cap; ranks];
            if let Some(s) = fastest(zb_v_greedy_variants(ranks, m, &even, &caps, None, true)) {
                consider(
                    format!("zb-v (measured, {cap} chunk activations)"),
                    s,
                    &mut trials,
                );
            }
        }
        // The same with each rank held to bytes rather than a count of activations: those
        // of the construction's peak (what `--schedule zb-v` allows) and those of the
        // limit. The ranks' stashes differ, so one count for all leaves most ranks below
        // the memory the largest one reaches.
        let construction = builtin_on("zb-v", layout, m, 2)
            .ok()
            .and_then(|s| evaluate(&s, costs))
            .map(|r| r.1);
        let mut peaks: Vec<(&str, f64)> = vec![];
        if let Some(c) = construction.filter(|&c| c <= limit) {
            peaks.push(("the construction's peak", c));
        }
        // The limit only where it is within twice the construction's peak: far above it,
        // a rank could stash micro-batches without end for little time (the counts above
        // already try more memory).
        if construction.is_some_and(|c| limit <= 2.0 * c) {
            peaks.push(("the memory limit", limit));
        }
        let act: Vec<f64> = costs.stages.iter().map(|c| c.activation_memory).collect();
        let counts = vec![2 * m; ranks];
        for (label, peak) in peaks {
            let allowance = v_stash_allowance(ranks, costs, peak);
            let bytes = Some((act.as_slice(), allowance.as_slice()));
            if let Some(s) = fastest(zb_v_greedy_variants(ranks, m, &even, &counts, bytes, true)) {
                consider(
                    format!("zb-v (measured, each rank's stash within {label})"),
                    s,
                    &mut trials,
                );
            }
        }
    }
    // Local search from the best fitting member of the zero-bubble family.
    if one_stage_per_rank(layout) {
        if let Ok(h) = stage_heights(layout) {
            let start = [0.0, 0.25, 0.5, 0.75, 1.0]
                .into_iter()
                .filter_map(|a| {
                    let (e, l) = alpha_params(&h, a);
                    let r = evaluate(&zb_family(layout, m, &h, &e, &l), costs)?;
                    (r.1 <= limit).then_some((a, e, l, r))
                })
                .min_by(|a, b| a.3 .0.total_cmp(&b.3 .0));
            if let Some((alpha, e, l, _)) = start {
                if let Some((e, l, _)) =
                    local_search(layout, m, costs, limit, (e, l), LOCAL_SEARCH_EVALUATIONS)
                {
                    let s = zb_family(layout, m, &h, &e, &l);
                    let name = format!(
                        "zb (local search from α {alpha}: extra warm-up {}, W deferral {})",
                        compact(&e),
                        compact(&l)
                    );
                    let filled = split_and_fill(&s, costs);
                    consider(name.clone(), s, &mut trials);
                    if let Some(f) = filled {
                        consider(format!("{name} +fill"), f, &mut trials);
                    }
                }
            }
        }
    }
    let fits = ranked.first().is_some_and(|x| x.2 .1 <= limit);
    let mut out: Vec<(Schedule, String)> = ranked
        .into_iter()
        .filter(|x| !fits || x.2 .1 <= limit)
        .take(if fits { keep } else { 1 })
        .map(|(s, name, _)| (s, name))
        .collect();
    for (s, name, _) in over {
        if !out.iter().any(|x| x.0.per_rank == s.per_rank) {
            out.push((s, name));
        }
    }
    (out, trials)
}

/// Per-stage counts, short: `a,b,c`.
fn compact(v: &[usize]) -> String {
    v.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(",")
}
