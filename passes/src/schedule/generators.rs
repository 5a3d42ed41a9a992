//! Built-in schedules. Each returns compute actions only (`F`, `I`/`B`, `W`);
//! [`insert_communication`] adds the sends and receives for cross-rank edges.
//!
//! GPipe, 1F1B, ZB-H1 and ZB-H2 are built per stage from a warm-up count (and, for the
//! zero-bubble ones, a count of deferred `W`s), so they run on any layout with one stage
//! per rank: a chain, or a stage DAG ([`builtin_on`]) where the height `h(s)` (longest
//! path from `s` to a sink) takes the place of the chain's `p−r−1`.

use std::collections::VecDeque;

use petgraph::algo::toposort;
use petgraph::graph::DiGraph;

use super::{Action, ActionKind, Layout, Schedule, ScheduleError};
use crate::simulate::{simulate, CostTable};

use ActionKind::{BackwardInput as Bi, BackwardWeight as Bw, Forward as Fw, FullBackward as Bf};

/// Names accepted by [`builtin`].
pub const BUILTIN_NAMES: &[&str] = &[
    "gpipe",
    "1f1b",
    "interleaved-1f1b",
    "zb-h1",
    "zb-h2",
    "zb-v",
    "dualpipe-v",
];

/// A built-in schedule by name (`chunks` is used by `interleaved-1f1b` only; `zb-v` and
/// `dualpipe-v` use two chunks per rank, the V layout).
pub fn builtin(
    name: &str,
    ranks: usize,
    microbatches: usize,
    chunks: usize,
) -> Result<Schedule, ScheduleError> {
    if ranks == 0 || microbatches == 0 {
        return Err(ScheduleError::Invalid(
            "a schedule needs at least one stage and one micro-batch".into(),
        ));
    }
    check_size(ranks.saturating_mul(chunks.max(1)), microbatches)?;
    Ok(match name {
        "gpipe" => gpipe(ranks, microbatches),
        "1f1b" => one_f_one_b(ranks, microbatches),
        "interleaved-1f1b" => interleaved_1f1b(ranks, microbatches, chunks)?,
        "zb-h1" => zb_h1(ranks, microbatches),
        "zb-h2" => zb_h2(ranks, microbatches),
        "zb-v" => zb_v(ranks, microbatches),
        "dualpipe-v" => dualpipe_v(ranks, microbatches),
        _ => return Err(unknown(name)),
    })
}

/// Bytes a schedule, its communication and its simulation take per (stage, micro-batch)
/// pair (measured: 1.3–2.1 KB for 1F1B and ZB-V at 100 stages × 1000 micro-batches).
const BYTES_PER_PAIR: u64 = 2048;

/// Refuse a schedule of `stages` × `microbatches` that could not be held in memory (a
/// typo such as `--microbatches 100000 --stages 100000` asks for 10^10 pairs), before
/// any of it is built.
pub(crate) fn check_size(stages: usize, microbatches: usize) -> Result<(), ScheduleError> {
    let too_big = |why: String| {
        ScheduleError::Invalid(format!(
            "a schedule of {stages} stages × {microbatches} micro-batches is too large: {why}"
        ))
    };
    let pairs = (stages as u64)
        .checked_mul(microbatches as u64)
        .ok_or_else(|| too_big("the number of actions overflows".into()))?;
    ppir::size::check_memory(pairs.saturating_mul(BYTES_PER_PAIR), || {
        format!("a schedule of {stages} stages × {microbatches} micro-batches")
    })
    .map_err(|e| too_big(e.to_string()))
}

fn unknown(name: &str) -> ScheduleError {
    ScheduleError::Invalid(format!(
        "unknown schedule `{name}` (known: {})",
        BUILTIN_NAMES.join(", ")
    ))
}

/// A built-in schedule by name over a given `layout`. On a chain, an interleaved chain or a
/// V it is [`builtin`]'s schedule, and the layout must be the one that schedule uses
/// (`interleaved-1f1b`: [`Layout::Interleaved`] with `chunks` chunks; `zb-v`:
/// [`Layout::VShape`]; the others: a plain chain). On a [`Layout::Dag`] with one stage per
/// rank (`rank_of[s] = s`), with `h(s)` the longest path from `s` to a sink and `H` the
/// largest: `gpipe`; `1f1b` ([`dag_1f1b`]: `h(s)` warm-up forwards); `zb-h1` (`h(s)+1`
/// warm-up forwards, `H−h(s)` deferred `W`s); `zb-h2` (`2(h(s)+1)−1` warm-up forwards,
/// `2(H−h(s))` deferred `W`s) — on a chain DAG exactly the chain schedules.
/// `interleaved-1f1b` and `zb-v` need a chain.
pub fn builtin_on(
    name: &str,
    layout: &Layout,
    microbatches: usize,
    chunks: usize,
) -> Result<Schedule, ScheduleError> {
    if !BUILTIN_NAMES.contains(&name) {
        return Err(unknown(name));
    }
    if layout.num_ranks() == 0 || microbatches == 0 {
        return Err(ScheduleError::Invalid(
            "a schedule needs at least one stage and one micro-batch".into(),
        ));
    }
    check_size(layout.num_virtual_stages(), microbatches)?;
    let mismatch = |needs: &str| {
        ScheduleError::Invalid(format!(
            "schedule `{name}` needs {needs}, the layout is {}",
            describe_layout(layout)
        ))
    };
    match (name, layout) {
        ("interleaved-1f1b" | "zb-v" | "dualpipe-v", Layout::Dag { .. }) => Err(ScheduleError::Invalid(format!(
            "schedule `{name}` needs a chain of stages, the layout is {} (use a sequential partition)",
            describe_layout(layout)
        ))),
        ("interleaved-1f1b", Layout::Interleaved { ranks, chunks: v }) => {
            if *v != chunks {
                return Err(mismatch(&format!(
                    "an interleaved chain of {chunks} chunk(s) per rank"
                )));
            }
            builtin(name, *ranks, microbatches, chunks)
        }
        ("interleaved-1f1b", _) => Err(mismatch(&format!(
            "an interleaved chain of {chunks} chunk(s) per rank"
        ))),
        ("zb-v" | "dualpipe-v", Layout::VShape { ranks }) => {
            builtin(name, *ranks, microbatches, chunks)
        }
        ("zb-v" | "dualpipe-v", _) => Err(mismatch("a V-shaped layout (two chunks per rank)")),
        (_, Layout::Interleaved { ranks, chunks: 1 }) => {
            builtin(name, *ranks, microbatches, chunks)
        }
        (_, Layout::Dag { .. }) => {
            let h = stage_heights(layout)?;
            let (layout, m) = (layout.clone(), microbatches);
            Ok(match name {
                "gpipe" => gpipe_on(layout, m),
                "1f1b" => one_f_one_b_on(layout, m, |s| h[s]),
                "zb-h1" => zb_h1_on(layout, m, &h),
                _ => zb_h2_on(layout, m, &h),
            })
        }
        _ => Err(mismatch("a chain of stages (one chunk per rank)")),
    }
}

fn describe_layout(layout: &Layout) -> String {
    match layout {
        Layout::Interleaved { ranks, chunks: 1 } => format!("a chain of {ranks} stage(s)"),
        Layout::Interleaved { ranks, chunks } => {
            format!("an interleaved chain of {ranks} rank(s) × {chunks} chunks")
        }
        Layout::VShape { ranks } => format!("a V over {ranks} rank(s)"),
        Layout::Dag { rank_of, .. } => format!("a DAG of {} stage(s)", rank_of.len()),
    }
}

/// The height of every stage of a layout with one stage per rank (a plain chain: `p−s−1`;
/// a DAG: the longest path from `s` to a sink), after checking the layout has that shape and,
/// for a DAG, that its edges are between distinct existing stages and form no cycle.
pub(crate) fn stage_heights(layout: &Layout) -> Result<Vec<usize>, ScheduleError> {
    let (ranks, rank_of, edges) = match layout {
        Layout::Interleaved { ranks, chunks: 1 } => return Ok(chain_heights(*ranks)),
        Layout::Dag {
            ranks,
            rank_of,
            edges,
        } => (*ranks, rank_of, edges),
        _ => {
            return Err(ScheduleError::Invalid(format!(
                "this schedule needs one stage per rank, the layout is {}",
                describe_layout(layout)
            )))
        }
    };
    let n = rank_of.len();
    if ranks != n || rank_of.iter().enumerate().any(|(s, &r)| r != s) {
        return Err(ScheduleError::Invalid(format!(
            "DAG schedules need one stage per rank (stage s on rank s); the layout puts {n} stage(s) on ranks {rank_of:?} of {ranks}"
        )));
    }
    if let Some(e) = edges.iter().find(|e| e.0 >= n || e.1 >= n || e.0 == e.1) {
        return Err(ScheduleError::Invalid(format!(
            "stage edge {} -> {} is not between two distinct stages of 0..{n}",
            e.0, e.1
        )));
    }
    let mut g = DiGraph::<(), ()>::with_capacity(n, edges.len());
    for _ in 0..n {
        g.add_node(());
    }
    g.extend_with_edges(edges.iter().map(|&(a, b)| (a as u32, b as u32)));
    let order = toposort(&g, None)
        .map_err(|_| ScheduleError::Invalid("the stage graph has a cycle".to_string()))?;
    // Longest path to a sink: a stage's successors come after it in the order.
    let mut height = vec![0usize; n];
    for x in order.into_iter().rev() {
        height[x.index()] = g
            .neighbors(x)
            .map(|y| height[y.index()] + 1)
            .max()
            .unwrap_or(0);
    }
    Ok(height)
}

/// A chain's heights: `p−s−1`.
fn chain_heights(ranks: usize) -> Vec<usize> {
    (0..ranks).rev().collect()
}

/// GPipe: all forwards, then all (fused) backwards, in micro-batch order.
pub fn gpipe(ranks: usize, microbatches: usize) -> Schedule {
    gpipe_on(Layout::chain(ranks), microbatches)
}

/// GPipe on a layout with one stage per rank.
fn gpipe_on(layout: Layout, microbatches: usize) -> Schedule {
    let mut s = Schedule::empty(layout, microbatches);
    for x in 0..s.num_virtual_stages() {
        for m in 0..microbatches {
            s.push(Fw, x, m);
        }
        for m in 0..microbatches {
            s.push(Bf, x, m);
        }
    }
    s
}

/// 1F1B (PipeDream-flush): rank `r` runs `p−r−1` warm-up forwards, then alternates one
/// forward and one fused backward, then drains the remaining backwards.
pub fn one_f_one_b(ranks: usize, microbatches: usize) -> Schedule {
    let h = chain_heights(ranks);
    one_f_one_b_on(Layout::chain(ranks), microbatches, |r| h[r])
}

/// 1F1B on a layout with one stage per rank, stage `s` running `warmup(s)` warm-up forwards.
fn one_f_one_b_on(
    layout: Layout,
    microbatches: usize,
    warmup: impl Fn(usize) -> usize,
) -> Schedule {
    let mut s = Schedule::empty(layout, microbatches);
    for x in 0..s.num_virtual_stages() {
        let warmup = warmup(x).min(microbatches);
        for m in 0..warmup {
            s.push(Fw, x, m);
        }
        for i in 0..microbatches - warmup {
            s.push(Fw, x, warmup + i);
            s.push(Bf, x, i);
        }
        for m in microbatches - warmup..microbatches {
            s.push(Bf, x, m);
        }
    }
    s
}

/// Megatron-LM's interleaved 1F1B with `chunks` virtual stages per rank (virtual stage
/// `c·p + r` on rank `r`). Like Megatron, it needs `microbatches % ranks == 0`.
pub fn interleaved_1f1b(
    ranks: usize,
    microbatches: usize,
    chunks: usize,
) -> Result<Schedule, ScheduleError> {
    if chunks == 0 {
        return Err(ScheduleError::Invalid("--chunks must be at least 1".into()));
    }
    if chunks > 1 && !microbatches.is_multiple_of(ranks) {
        return Err(ScheduleError::Invalid(format!(
            "interleaved 1F1B needs the number of micro-batches ({microbatches}) to be a multiple of the number of stages ({ranks})"
        )));
    }
    let (p, v, m) = (ranks, chunks, microbatches);
    let mut s = Schedule::empty(Layout::Interleaved { ranks, chunks }, microbatches);
    let total = m * v;
    // The k-th forward (backward) of a rank: groups of p micro-batches sweep the chunks in
    // order (backward: in reverse order).
    let mb = |k: usize| (k / (p * v)) * p + k % p;
    let fwd_chunk = |k: usize| (k / p) % v;
    let bwd_chunk = |k: usize| v - 1 - (k / p) % v;
    for r in 0..p {
        let warmup = if m == p && v > 1 {
            total
        } else {
            ((p - r - 1) * 2 + (v - 1) * p).min(total)
        };
        let warmup = if v == 1 { (p - r - 1).min(m) } else { warmup };
        for k in 0..warmup {
            s.push(Fw, fwd_chunk(k) * p + r, mb(k));
        }
        for i in 0..total - warmup {
            let k = warmup + i;
            s.push(Fw, fwd_chunk(k) * p + r, mb(k));
            s.push(Bf, bwd_chunk(i) * p + r, mb(i));
        }
        for k in total - warmup..total {
            s.push(Bf, bwd_chunk(k) * p + r, mb(k));
        }
    }
    Ok(s)
}

/// The zero-bubble schedules on a layout with one stage per rank (a chain or a DAG): stage
/// `s` runs `warmup(s)` forwards, then for each micro-batch a `B`, a `W` once more than
/// `lag(s)` weight gradients wait, and the next `F`; then drains the deferred `W`s, which
/// fill the tail bubble while gradients still travel down.
///
/// On a DAG of heights `h`, neither this nor 1F1B can deadlock when `warmup(s) − h(s)` does
/// not decrease as `h(s)` grows (1F1B: 0, ZB-H1: 1, ZB-H2: `h(s)+1`): along a chain of
/// blocked actions, each waiting for a producer's `F` or a consumer's `B`, the potential
/// `k − h(s)` of a blocked `F` of micro-batch `k` and `j + warmup(s) − h(s)` of a blocked
/// `B` of micro-batch `j` never grows, and drops at every step but `B`-to-`B` ones, which
/// go strictly down the DAG, so the chain cannot close.
pub(crate) fn zb_on(
    layout: Layout,
    microbatches: usize,
    warmup: impl Fn(usize) -> usize,
    lag: impl Fn(usize) -> usize,
) -> Schedule {
    let mut s = Schedule::empty(layout, microbatches);
    for x in 0..s.num_virtual_stages() {
        let w = warmup(x).min(microbatches);
        for m in 0..w {
            s.push(Fw, x, m);
        }
        let mut next_f = w;
        let mut next_w = 0;
        for b in 0..microbatches {
            s.push(Bi, x, b);
            if b + 1 - next_w > lag(x) {
                s.push(Bw, x, next_w);
                next_w += 1;
            }
            if next_f < microbatches {
                s.push(Fw, x, next_f);
                next_f += 1;
            }
        }
        for m in next_w..microbatches {
            s.push(Bw, x, m);
        }
    }
    s
}

/// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, §3.1): 1F1B's warm-up,
/// B and W split, and rank `r` defers `r` weight gradients to the tail, so every rank's peak
/// stash is `p` micro-batches, as 1F1B's rank 0.
pub fn zb_h1(ranks: usize, microbatches: usize) -> Schedule {
    zb_h1_on(Layout::chain(ranks), microbatches, &chain_heights(ranks))
}

/// ZB-H1 over stages of heights `h`: `h(s)+1` warm-up forwards, `H−h(s)` deferred `W`s.
fn zb_h1_on(layout: Layout, microbatches: usize, h: &[usize]) -> Schedule {
    let top = h.iter().copied().max().unwrap_or(0);
    zb_on(layout, microbatches, |s| h[s] + 1, |s| top - h[s])
}

/// ZB-H2 (same paper, §3.1): more warm-up forwards (`2(p−r)−1` on rank `r`) fill the
/// start-up bubble and rank `r` defers `2r` weight gradients to fill the tail, so each rank
/// runs without a gap from its first action to its last (the paper's parallelogram, which
/// lets ranks end at different times); peak stash `2p−1` micro-batches on every rank.
pub fn zb_h2(ranks: usize, microbatches: usize) -> Schedule {
    zb_h2_on(Layout::chain(ranks), microbatches, &chain_heights(ranks))
}

/// ZB-H2 over stages of heights `h`: `2(h(s)+1)−1` warm-up forwards, `2(H−h(s))` deferred
/// `W`s.
fn zb_h2_on(layout: Layout, microbatches: usize, h: &[usize]) -> Schedule {
    let top = h.iter().copied().max().unwrap_or(0);
    zb_on(
        layout,
        microbatches,
        |s| 2 * (h[s] + 1) - 1,
        |s| 2 * (top - h[s]),
    )
}

/// One rank's program on the V layout (chunk 0 = stage `r`, chunk 1 = stage `2p−1−r`):
/// it hands out each (kind, chunk)'s micro-batches in order and drops those `≥ m`.
///
/// The V schedules below are written for as many micro-batches as their steady state
/// needs and then cut to `m`: every kept action's inputs are kept actions that came
/// earlier in the uncut schedule's timing, so the cut schedule is as deadlock-free as the
/// uncut one and holds no more activations.
struct VRank {
    p: usize,
    m: usize,
    r: usize,
    /// Next micro-batch of (F, I, W) × chunk.
    next: [[usize; 2]; 3],
    out: Vec<Action>,
}

impl VRank {
    fn new(p: usize, m: usize, r: usize) -> Self {
        VRank {
            p,
            m,
            r,
            next: [[0; 2]; 3],
            out: vec![],
        }
    }

    fn stage(&self, chunk: usize) -> usize {
        if chunk == 0 {
            self.r
        } else {
            2 * self.p - 1 - self.r
        }
    }

    /// The next `kind` of `chunk`, `None` once its micro-batches are used up.
    fn take(&mut self, kind: ActionKind, chunk: usize) -> Option<Action> {
        let k = match kind {
            Fw => 0,
            Bi => 1,
            _ => 2,
        };
        let mb = self.next[k][chunk];
        self.next[k][chunk] += 1;
        (mb < self.m).then(|| Action::new(kind, self.stage(chunk), mb, chunk))
    }

    fn emit(&mut self, kind: ActionKind, chunk: usize) {
        if let Some(a) = self.take(kind, chunk) {
            self.out.push(a);
        }
    }

    fn inputs_done(&self) -> bool {
        self.next[1][0] >= self.m && self.next[1][1] >= self.m
    }
}

/// ZB-V (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, §6; the V-ZB of
/// "Pipeline Parallelism with Controllable Memory", NeurIPS 2024), built from its
/// construction at `F = I = W` (one unit per chunk). Rank `r` runs:
/// 1. `2(p−r)−1` chunk-0 forwards — the time until the first chunk-1 forward comes back
///    up the V to it;
/// 2. `r` pairs (chunk-1 F, chunk-0 F) — until the first input gradient reaches it;
/// 3. `p−r` triples (chunk-1 F, I, W) — the gradient travels on down the V;
/// 4. the steady state: (F, I, W) of chunk 0, then of chunk 1, each rank `2` units behind
///    the one below it;
/// 5. after its last forward, its remaining input gradients first and then its weight
///    gradients (the `W`s fill the drain of the V).
///
/// Closed-form properties (tested): at most `2p` chunk activations per rank (`p` stages:
/// 1F1B's first rank), and with unit costs and no link time, for `m ≥ 2p`, makespan
/// `6m + p − 1` — only rank `r`'s `r` units before its first forward and `p−1−r` at the
/// end are idle.
pub fn zb_v(ranks: usize, microbatches: usize) -> Schedule {
    let (p, m) = (ranks, microbatches);
    let mut s = Schedule::empty(Layout::VShape { ranks }, m);
    for r in 0..p {
        let mut v = VRank::new(p, m, r);
        for _ in 0..2 * (p - r) - 1 {
            v.emit(Fw, 0);
        }
        for _ in 0..r {
            v.emit(Fw, 1);
            v.emit(Fw, 0);
        }
        for _ in 0..p - r {
            v.emit(Fw, 1);
            v.emit(Bi, 1);
            v.emit(Bw, 1);
        }
        while !v.inputs_done() {
            for c in [0, 1] {
                v.emit(Fw, c);
                v.emit(Bi, c);
                v.emit(Bw, c);
            }
        }
        let mut list = v.out;
        if let Some(last_f) = list.iter().rposition(|a| a.kind == Fw) {
            // Stable: input gradients keep their order, weight gradients theirs.
            let tail = list.split_off(last_f + 1);
            let (ws, others): (Vec<Action>, Vec<Action>) =
                tail.into_iter().partition(|a| a.kind == Bw);
            list.extend(others);
            list.extend(ws);
        }
        s.per_rank[r] = list;
    }
    s
}

/// ZB-V for given costs: `costs[s]` = (F, I, W) of virtual stage `s`, `comm` the link time.
///
/// The fastest of [`zb_v`]'s order (its weight gradients moved into the time the costs
/// leave idle when that is faster) and the cost-aware builds of
/// [`super::v_greedy::zb_v_measured`], all within `2p` chunk activations per rank.
pub fn zb_v_for(ranks: usize, microbatches: usize, costs: &[[f64; 3]], comm: f64) -> Schedule {
    if costs.len() != 2 * ranks {
        return zb_v(ranks, microbatches);
    }
    let mut table = CostTable::uniform(2 * ranks, 1.0, 1.0, 1.0, comm);
    for (c, &[f, i, w]) in table.stages.iter_mut().zip(costs) {
        c.forward = f;
        c.backward_input = i;
        c.backward_weight = w;
    }
    super::v_greedy::zb_v_measured(ranks, microbatches, &table, 2 * ranks)
}

/// `s` or, when it simulates faster under `costs`, `s` with its weight gradients moved
/// into idle time ([`fill_weight_gradients`] with at most `cap` stashed micro-batches per
/// rank).
pub(crate) fn better_with_filled_w(s: Schedule, costs: &CostTable, cap: usize) -> Schedule {
    let Some(filled) = fill_weight_gradients(&s, costs, cap) else {
        return s;
    };
    match (simulate(&s, costs), simulate(&filled, costs)) {
        (Ok(a), Ok(b)) if b.makespan < a.makespan * (1.0 - 1e-12) => filled,
        _ => s,
    }
}

/// Keep every rank's order of `F`, `I` and `B` and place its `W`s (in their order) by
/// running the ranks in time with `costs`: whichever of a rank's next `F`/`I`/`B` and
/// next `W` can start first runs (the `F`/`I`/`B` on a tie), and a forward that would
/// stash more than `cap` micro-batches (or `cap` if the schedule already needs more)
/// waits for a `W`. The ranks' forward and input-gradient orders are the schedule's, so
/// it stays deadlock-free; `None` if it cannot be completed all the same (an input that
/// never comes).
pub fn fill_weight_gradients(s: &Schedule, costs: &CostTable, cap: usize) -> Option<Schedule> {
    let layout = &s.layout;
    let (nv, m) = (layout.num_virtual_stages(), s.num_microbatches);
    if costs.stages.len() != nv {
        return None;
    }
    let p = s.per_rank.len();
    let compute: Vec<Vec<Action>> = s
        .per_rank
        .iter()
        .map(|l| l.iter().filter(|a| a.kind.is_compute()).copied().collect())
        .collect();
    let main: Vec<Vec<Action>> = compute
        .iter()
        .map(|l| l.iter().filter(|a| a.kind != Bw).copied().collect())
        .collect();
    let ws: Vec<Vec<Action>> = compute
        .iter()
        .map(|l| l.iter().filter(|a| a.kind == Bw).copied().collect())
        .collect();
    // The schedule's own peak stash per rank, so a schedule above `cap` is never refused.
    let cap: Vec<usize> = compute
        .iter()
        .map(|l| {
            let (mut n, mut peak) = (0usize, 0usize);
            for a in l {
                match a.kind {
                    Fw => n += 1,
                    Bw | Bf => n = n.saturating_sub(1),
                    _ => {}
                }
                peak = peak.max(n);
            }
            peak.max(cap)
        })
        .collect();
    let at = |x: usize, k: usize| x * m + k;
    let mut f_end = vec![f64::NAN; nv * m];
    let mut b_end = vec![f64::NAN; nv * m];
    let preds: Vec<Vec<usize>> = (0..nv).map(|x| layout.preds(x)).collect();
    let succs: Vec<Vec<usize>> = (0..nv).map(|x| layout.succs(x)).collect();
    let link = |from: usize, to: usize| {
        if layout.rank_of(from) != layout.rank_of(to) {
            costs.comm_between(from, to)
        } else {
            0.0
        }
    };
    // When `a` could start on an idle rank (`None`: an input is not scheduled yet).
    let ready = |a: &Action, f_end: &[f64], b_end: &[f64]| -> Option<f64> {
        if a.micro_batch >= m || a.stage >= nv {
            return None;
        }
        let mut t = 0.0f64;
        let mut need = |end: f64, from: usize| {
            if end.is_nan() {
                return false;
            }
            t = t.max(end + link(from, a.stage));
            true
        };
        let ok = match a.kind {
            Fw => preds[a.stage]
                .iter()
                .all(|&q| need(f_end[at(q, a.micro_batch)], q)),
            Bi | Bf => {
                need(f_end[at(a.stage, a.micro_batch)], a.stage)
                    && succs[a.stage]
                        .iter()
                        .all(|&q| need(b_end[at(q, a.micro_batch)], q))
            }
            Bw => need(b_end[at(a.stage, a.micro_batch)], a.stage),
            _ => true,
        };
        ok.then_some(t)
    };
    let (mut pos, mut wpos) = (vec![0usize; p], vec![0usize; p]);
    let mut free = vec![0.0f64; p];
    let mut stash = vec![0usize; p];
    let mut out = s.clone();
    out.per_rank = vec![vec![]; p];
    let total: usize = compute.iter().map(Vec::len).sum();
    for _ in 0..total {
        // (start, is a W, rank) of the earliest action any rank can start.
        let mut best: Option<(f64, bool, usize)> = None;
        for r in 0..p {
            let mut consider = |start: f64, is_w: bool| {
                let start = start.max(free[r]);
                let earlier = best.is_none_or(|(t, w, _)| start < t || (start == t && !is_w && w));
                if earlier {
                    best = Some((start, is_w, r));
                }
            };
            if let Some(a) = main[r].get(pos[r]) {
                let blocked = a.kind == Fw && stash[r] >= cap[r];
                if !blocked {
                    if let Some(t) = ready(a, &f_end, &b_end) {
                        consider(t, false);
                    }
                }
            }
            if let Some(a) = ws[r].get(wpos[r]) {
                if let Some(t) = ready(a, &f_end, &b_end) {
                    consider(t, true);
                }
            }
        }
        let (start, is_w, r) = best?;
        let a = if is_w {
            wpos[r] += 1;
            ws[r][wpos[r] - 1]
        } else {
            pos[r] += 1;
            main[r][pos[r] - 1]
        };
        let end = start + costs.duration(&a);
        match a.kind {
            Fw => {
                f_end[at(a.stage, a.micro_batch)] = end;
                stash[r] += 1;
            }
            Bi => b_end[at(a.stage, a.micro_batch)] = end,
            Bf => {
                b_end[at(a.stage, a.micro_batch)] = end;
                stash[r] = stash[r].saturating_sub(1);
            }
            _ => stash[r] = stash[r].saturating_sub(1),
        }
        free[r] = end;
        out.per_rank[r].push(a);
    }
    Some(out)
}

/// DualPipeV (DeepSeek-AI, "DualPipe", 2025: the V-shaped, one-copy-of-the-weights form of
/// DualPipe): the V layout of [`zb_v`] whose steady state runs overlapped pairs — the
/// forward of one micro-batch beside the backward of another, on the two chunks of a rank
/// — so one pair's communication can hide behind the other's compute. Rank `r`:
/// 1. `2(p−r−1)` chunk-0 forwards;
/// 2. `r+1` pairs (chunk-0 F, chunk-1 F);
/// 3. `p−r−1` times: chunk-1 backward (I, W), chunk-1 F;
/// 4. the steady state, `m−2p+r+1` times: overlapped (chunk-0 F, chunk-1 B), overlapped
///    (chunk-1 F, chunk-0 B);
/// 5. `p−r−1` times: chunk-1 B, overlapped (chunk-1 F, chunk-0 B);
/// 6. `r+1` times: chunk-1 I, chunk-0 I — their `W`s deferred;
/// 7. `p−r−1` times: a deferred `W`, chunk-0 I (its `W` deferred);
/// 8. the deferred `W`s.
///
/// An overlapped pair is its forward followed by its backward (`I` then `W`) in the list:
/// ppcc's runtime runs a rank's actions one after another, and so does the simulator.
/// Closed-form properties (tested): with unit costs and no link time, for `m ≥ 2p`,
/// makespan `6m + p − 1` and `2p + 1` chunk activations per rank at most. Fewer than `2p`
/// micro-batches: the schedule for `2p`, cut to `m`.
pub fn dualpipe_v(ranks: usize, microbatches: usize) -> Schedule {
    let (p, m) = (ranks, microbatches);
    let mut s = Schedule::empty(Layout::VShape { ranks }, m);
    let full = m.max(2 * p);
    for r in 0..p {
        let mut v = VRank::new(p, m, r);
        let mut deferred = VecDeque::new();
        let backward = |v: &mut VRank, c: usize, deferred: Option<&mut VecDeque<Action>>| {
            v.emit(Bi, c);
            match (v.take(Bw, c), deferred) {
                (Some(w), Some(d)) => d.push_back(w),
                (Some(w), None) => v.out.push(w),
                (None, _) => {}
            }
        };
        for _ in 0..2 * (p - r - 1) {
            v.emit(Fw, 0);
        }
        for _ in 0..r + 1 {
            v.emit(Fw, 0);
            v.emit(Fw, 1);
        }
        for _ in 0..p - r - 1 {
            backward(&mut v, 1, None);
            v.emit(Fw, 1);
        }
        for _ in 0..full + r + 1 - 2 * p {
            v.emit(Fw, 0);
            backward(&mut v, 1, None);
            v.emit(Fw, 1);
            backward(&mut v, 0, None);
        }
        for _ in 0..p - r - 1 {
            backward(&mut v, 1, None);
            v.emit(Fw, 1);
            backward(&mut v, 0, None);
        }
        for _ in 0..r + 1 {
            backward(&mut v, 1, Some(&mut deferred));
            backward(&mut v, 0, Some(&mut deferred));
        }
        for _ in 0..p - r - 1 {
            if let Some(w) = deferred.pop_front() {
                v.out.push(w);
            }
            backward(&mut v, 0, Some(&mut deferred));
        }
        v.out.extend(deferred);
        s.per_rank[r] = v.out;
    }
    s
}

/// A DAG-aware 1F1B for graph pipelines: one stage per rank (`rank_of[s] = s`), stage `s`
/// runs `h(s)` warm-up forwards where `h(s)` is the longest path from `s` to a sink, then
/// alternates forward and fused backward. Since `h(producer) ≥ h(consumer) + 1` on every
/// edge, a producer has always run the forwards its consumers wait for: no deadlock.
pub fn dag_1f1b(
    num_stages: usize,
    edges: &[(usize, usize)],
    microbatches: usize,
) -> Result<Schedule, ScheduleError> {
    let layout = Layout::Dag {
        ranks: num_stages,
        rank_of: (0..num_stages).collect(),
        edges: edges.to_vec(),
    };
    let heights = stage_heights(&layout)?;
    Ok(one_f_one_b_on(layout, microbatches, |s| heights[s]))
}

/// Add communication: `SEND_F` right after the forward of a stage with a consumer on another
/// rank, `RECV_F` right before the forward of a stage with a producer on another rank, and
/// the same for backward (`SEND_B` after the `I`/`B` of a stage with a producer elsewhere,
/// `RECV_B` before the `I`/`B` of a stage with a consumer elsewhere). Existing communication
/// actions are dropped first, so the function is idempotent.
pub fn insert_communication(schedule: &Schedule) -> Schedule {
    let layout = &schedule.layout;
    let cross = |x: usize, others: Vec<usize>| {
        others
            .into_iter()
            .any(|q| layout.rank_of(q) != layout.rank_of(x))
    };
    let mut out = schedule.clone();
    for (rank, actions) in schedule.per_rank.iter().enumerate() {
        let mut list = vec![];
        for a in actions.iter().filter(|a| a.kind.is_compute()) {
            let with = |kind| Action::new(kind, a.stage, a.micro_batch, a.chunk);
            match a.kind {
                Fw => {
                    if cross(a.stage, layout.preds(a.stage)) {
                        list.push(with(ActionKind::RecvF));
                    }
                    list.push(*a);
                    if cross(a.stage, layout.succs(a.stage)) {
                        list.push(with(ActionKind::SendF));
                    }
                }
                Bi | Bf => {
                    if cross(a.stage, layout.succs(a.stage)) {
                        list.push(with(ActionKind::RecvB));
                    }
                    list.push(*a);
                    if cross(a.stage, layout.preds(a.stage)) {
                        list.push(with(ActionKind::SendB));
                    }
                }
                _ => list.push(*a),
            }
        }
        out.per_rank[rank] = list;
    }
    out
}
