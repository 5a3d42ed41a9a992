//! Built-in schedules. Each returns compute actions only (`F`, `I`/`B`, `W`);
//! [`insert_communication`] adds the sends and receives for cross-rank edges.
//!
//! GPipe, 1F1B, ZB-H1 and ZB-H2 are built per stage from a warm-up count (and, for the
//! zero-bubble ones, a count of deferred `W`s), so they run on any layout with one stage
//! per rank: a chain, or a stage DAG ([`builtin_on`]) where the height `h(s)` (longest
//! path from `s` to a sink) takes the place of the chain's `p−r−1`.

use std::collections::{HashMap, VecDeque};

use petgraph::algo::toposort;
use petgraph::graph::DiGraph;

use super::{Action, ActionKind, Layout, Schedule, ScheduleError};

use ActionKind::{BackwardInput as Bi, BackwardWeight as Bw, Forward as Fw, FullBackward as Bf};

/// Names accepted by [`builtin`].
pub const BUILTIN_NAMES: &[&str] = &[
    "gpipe",
    "1f1b",
    "interleaved-1f1b",
    "zb-h1",
    "zb-h2",
    "zb-v",
];

/// A built-in schedule by name (`chunks` is used by `interleaved-1f1b` only).
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
        _ => return Err(unknown(name)),
    })
}

/// Bytes a schedule, its communication and its simulation take per (stage, micro-batch)
/// pair (measured: 1.3–2.1 KB for 1F1B and ZB-V at 100 stages × 1000 micro-batches).
const BYTES_PER_PAIR: u64 = 2048;

/// Refuse a schedule of `stages` × `microbatches` that could not be held in memory (a
/// typo such as `--microbatches 100000 --stages 100000` asks for 10^10 pairs), before
/// any of it is built.
fn check_size(stages: usize, microbatches: usize) -> Result<(), ScheduleError> {
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
        ("interleaved-1f1b" | "zb-v", Layout::Dag { .. }) => Err(ScheduleError::Invalid(format!(
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
        ("zb-v", Layout::VShape { ranks }) => builtin(name, *ranks, microbatches, chunks),
        ("zb-v", _) => Err(mismatch("a V-shaped layout (two chunks per rank)")),
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
fn stage_heights(layout: &Layout) -> Result<Vec<usize>, ScheduleError> {
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
fn zb_on(
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

/// ZB-V (Qi et al., "Pipeline Parallelism with Controllable Memory", 2024): two chunks per
/// rank in a V shape, built by greedy list scheduling at unit costs: a ready `B` first
/// (later stage first), then a ready `F` while the rank stashes fewer than `2p` chunk
/// activations (later stage first), then a pending `W`.
pub fn zb_v(ranks: usize, microbatches: usize) -> Schedule {
    let layout = Layout::VShape { ranks };
    greedy_unit(layout, microbatches, 2 * ranks)
}

fn greedy_unit(layout: Layout, microbatches: usize, stash_limit: usize) -> Schedule {
    let p = layout.num_ranks();
    let nv = layout.num_virtual_stages();
    let mut s = Schedule::empty(layout.clone(), microbatches);
    // Finish times (unit durations) by (kind class, stage, micro).
    let mut f_done: HashMap<(usize, usize), usize> = HashMap::new();
    let mut b_done: HashMap<(usize, usize), usize> = HashMap::new();
    let mut next_f = vec![0usize; nv];
    let mut next_b = vec![0usize; nv];
    let mut pending_w: Vec<VecDeque<(usize, usize)>> = vec![VecDeque::new(); p];
    let mut stash = vec![0usize; p];
    let mut left = nv * microbatches * 3;
    let stages_of: Vec<Vec<usize>> = (0..p)
        .map(|r| {
            let mut v: Vec<usize> = (0..nv).filter(|&x| layout.rank_of(x) == r).collect();
            v.reverse();
            v
        })
        .collect();
    let mut t = 0usize;
    let mut idle_steps = 0;
    while left > 0 && idle_steps < 4 * nv + 4 {
        let mut progressed = false;
        let mut finished = vec![];
        for r in 0..p {
            let ready_f = |x: usize, m: usize| {
                layout
                    .preds(x)
                    .iter()
                    .all(|&q| f_done.get(&(q, m)).is_some_and(|&e| e <= t))
            };
            let ready_b = |x: usize, m: usize| {
                f_done.get(&(x, m)).is_some_and(|&e| e <= t)
                    && layout
                        .succs(x)
                        .iter()
                        .all(|&q| b_done.get(&(q, m)).is_some_and(|&e| e <= t))
            };
            let pick_b = stages_of[r]
                .iter()
                .copied()
                .find(|&x| next_b[x] < microbatches && ready_b(x, next_b[x]));
            let pick_f = if stash[r] < stash_limit {
                stages_of[r]
                    .iter()
                    .copied()
                    .find(|&x| next_f[x] < microbatches && ready_f(x, next_f[x]))
            } else {
                None
            };
            if let Some(x) = pick_b {
                let m = next_b[x];
                next_b[x] += 1;
                s.push(Bi, x, m);
                finished.push((1, x, m));
                pending_w[r].push_back((x, m));
            } else if let Some(x) = pick_f {
                let m = next_f[x];
                next_f[x] += 1;
                stash[r] += 1;
                s.push(Fw, x, m);
                finished.push((0, x, m));
            } else if let Some((x, m)) = pending_w[r].pop_front() {
                stash[r] -= 1;
                s.push(Bw, x, m);
            } else {
                continue;
            }
            left -= 1;
            progressed = true;
        }
        for (class, x, m) in finished {
            if class == 0 {
                f_done.insert((x, m), t + 1);
            } else {
                b_done.insert((x, m), t + 1);
            }
        }
        idle_steps = if progressed { 0 } else { idle_steps + 1 };
        t += 1;
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
