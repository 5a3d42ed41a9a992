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

/// ZB-V (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, §6, and "Pipeline
/// Parallelism with Controllable Memory", 2024) at unit costs (`F = I = W`, no link time);
/// see [`zb_v_for`].
pub fn zb_v(ranks: usize, microbatches: usize) -> Schedule {
    let unit = [1.0, 1.0, 1.0];
    zb_v_for(ranks, microbatches, &vec![unit; 2 * ranks], 0.0)
}

/// ZB-V for given costs: `costs[s]` = (F, I, W) of virtual stage `s`, `comm` the link time.
///
/// The V layout puts chunk 0 (stages `0..p`) down the ranks and chunk 1 (stages `p..2p`)
/// back up, so rank `r` holds stages `r` and `2p−1−r` and the last stage's loss is on rank
/// 0. Like the zero-bubble authors' V scheduler, the order is built by running the ranks
/// in time with these costs (the order then has no bubble the costs would open):
/// - warm-up: forwards of chunk 0, then of chunk 1 as they come back up; rank `r` runs at
///   most `2(p−r)−1` chunk-0 forwards ahead of its chunk-1 forwards (its share of the V
///   before the first chunk-1 forward reaches it at unit costs), so chunk 0 never takes
///   the room chunk 1 needs;
/// - steady state: a ready `I` first (chunk 1 first: it unblocks the longer path), else a
///   ready `F` (chunk 1 first) while the rank stashes fewer than `2p` chunk activations,
///   else a `W` when one waits and either memory blocks the forward or the `W` ends before
///   the next `I`/`F` can start — `W`s fill what would be bubbles;
/// - cool-down: the remaining `W`s.
///
/// Memory: at most `2p` chunk activations per rank (a chunk is half a 1F1B stage), so the
/// same activation memory as 1F1B's first rank (`p` stage activations).
pub fn zb_v_for(ranks: usize, microbatches: usize, costs: &[[f64; 3]], comm: f64) -> Schedule {
    let layout = Layout::VShape { ranks };
    let (p, m) = (ranks, microbatches);
    let mut s = Schedule::empty(layout.clone(), m);
    if p == 0 || m == 0 || costs.len() != 2 * p {
        return s;
    }
    let cap = 2 * p;
    // End times of F and I per (stage, micro-batch); NaN until scheduled.
    let mut f_end = vec![f64::NAN; 2 * p * m];
    let mut b_end = vec![f64::NAN; 2 * p * m];
    let at = |x: usize, k: usize| x * m + k;
    let mut next_f = vec![0usize; 2 * p];
    let mut next_b = vec![0usize; 2 * p];
    let mut pending_w: Vec<VecDeque<usize>> = vec![VecDeque::new(); 2 * p];
    let mut stash = vec![0usize; p];
    let mut free = vec![0.0f64; p];
    let mut left = vec![6 * m; p];
    // Ranks waiting for an input no other rank has scheduled yet (cleared on progress).
    let mut waiting = vec![false; p];
    // Rank r's stages: chunk 1 first (the preferred one).
    let stages = |r: usize| [2 * p - 1 - r, r];
    let lead = |r: usize| 2 * (p - r) - 1;
    // When an input from stage `q` (`NaN` end: not yet scheduled) reaches stage `x`.
    let arrival = |end: f64, q: usize, x: usize| {
        end + if layout.rank_of(q) != layout.rank_of(x) {
            comm
        } else {
            0.0
        }
    };
    loop {
        // The rank that is free first and has work left (ties: the lower rank); when every
        // such rank waits for the others, the first one with a `W` runs it.
        let open = (0..p)
            .filter(|&r| left[r] > 0 && !waiting[r])
            .min_by(|&a, &b| free[a].total_cmp(&free[b]));
        let (r, stuck) = match open {
            Some(r) => (r, false),
            None => match (0..p).find(|&r| left[r] > 0) {
                Some(r) => (r, true),
                None => break,
            },
        };
        let now = free[r];
        let tol = 1e-9 * now.abs().max(1.0);
        // Ready time of the next I and F of each stage (NaN: its input is not scheduled).
        let ready_b = |x: usize| -> Option<f64> {
            let k = next_b[x];
            if k >= m || k >= next_f[x] {
                return None;
            }
            let own = f_end[at(x, k)];
            if x + 1 == 2 * p {
                return Some(own);
            }
            // `f64::max` would drop a NaN (an input not scheduled yet).
            let input = arrival(b_end[at(x + 1, k)], x + 1, x);
            Some(if input.is_nan() {
                input
            } else {
                own.max(input)
            })
        };
        let ready_f = |x: usize| -> Option<f64> {
            let k = next_f[x];
            if k >= m {
                return None;
            }
            if x < p && next_f[x] >= next_f[2 * p - 1 - x] + lead(r) {
                return None;
            }
            Some(if x > 0 {
                arrival(f_end[at(x - 1, k)], x - 1, x)
            } else {
                0.0
            })
        };
        let pick = |ready: &dyn Fn(usize) -> Option<f64>| {
            stages(r)
                .into_iter()
                .find(|&x| ready(x).is_some_and(|t| t <= now + tol))
        };
        let earliest = |ready: &dyn Fn(usize) -> Option<f64>| {
            stages(r)
                .into_iter()
                .filter_map(ready)
                .filter(|t| !t.is_nan())
                .fold(f64::INFINITY, f64::min)
        };
        let memory_full = stash[r] >= cap;
        let b_pick = pick(&ready_b);
        let f_pick = if memory_full { None } else { pick(&ready_f) };
        let w_next = stages(r)
            .into_iter()
            .filter_map(|x| pending_w[x].front().map(|&k| (x, k)))
            .min_by_key(|&(x, k)| (k, std::cmp::Reverse(x)));
        let next_ready = earliest(&ready_b).min(if memory_full {
            f64::INFINITY
        } else {
            earliest(&ready_f)
        });
        let (kind, x, k, dur) = if let Some(x) = b_pick {
            (Bi, x, next_b[x], costs[x][1])
        } else if let Some(x) = f_pick {
            (Fw, x, next_f[x], costs[x][0])
        } else if let Some((x, k)) = w_next.filter(|&(x, _)| {
            memory_full || next_ready.is_infinite() || now + costs[x][2] <= next_ready + tol
        }) {
            (Bw, x, k, costs[x][2])
        } else if next_ready.is_finite() && !stuck {
            free[r] = next_ready;
            continue;
        } else if !stuck {
            // Its inputs are not scheduled yet: let the other ranks run first.
            waiting[r] = true;
            continue;
        } else {
            // No rank can start an `F` or `I`: run a pending `W` if any rank has one.
            match (0..p).find_map(|q| {
                let w = stages(q)
                    .into_iter()
                    .find_map(|x| pending_w[x].front().map(|&k| (x, k)));
                w.map(|w| (q, w))
            }) {
                Some((q, (x, k))) => {
                    let end = free[q] + costs[x][2];
                    pending_w[x].pop_front();
                    stash[q] -= 1;
                    s.push(Bw, x, k);
                    free[q] = end;
                    left[q] -= 1;
                    waiting.iter_mut().for_each(|w| *w = false);
                    continue;
                }
                // A deadlock: the validator reports the schedule as incomplete.
                None => break,
            }
        };
        let start = match kind {
            Fw => ready_f(x).unwrap_or(now).max(now),
            Bi => ready_b(x).unwrap_or(now).max(now),
            _ => now,
        };
        let end = start + dur;
        match kind {
            Fw => {
                f_end[at(x, k)] = end;
                next_f[x] += 1;
                stash[r] += 1;
            }
            Bi => {
                b_end[at(x, k)] = end;
                next_b[x] += 1;
                pending_w[x].push_back(k);
            }
            _ => {
                pending_w[x].pop_front();
                stash[r] -= 1;
            }
        }
        s.push(kind, x, k);
        free[r] = end;
        left[r] -= 1;
        waiting.iter_mut().for_each(|w| *w = false);
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
