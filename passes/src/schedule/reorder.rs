//! Local search over the order of each rank's actions, guided by the critical path.
//!
//! A schedule's iteration time in the simulator is the longest path through a graph whose
//! nodes are its compute actions: each action waits for the one before it on its rank and
//! for its data (a forward for its inputs' forwards, an input gradient for its forward and
//! its consumers' input gradients, a weight gradient for its input gradient), data from
//! another rank paying the link time. Sends and receives take no rank time and sit right
//! before and after the actions they serve ([`super::insert_communication`]), so they add
//! nothing to the path. Peak memory depends only on each rank's order (a running sum over
//! its list). [`Orders`] evaluates both for a changed order in time linear in the number of
//! actions, without building a schedule.
//!
//! [`improve`] is the job-shop scheduler's neighbourhood search applied to pipelines: an
//! action on the critical path that started when the action before it on its rank ended,
//! although its data was there earlier, could start earlier if it ran before that action.
//! Each step tries moving such actions up to [`MAX_JUMP`] places earlier on their rank
//! (never past their own data on that rank, nor to where they would wait for it anyway),
//! from the end of the path back, and keeps the first move that shortens the iteration,
//! or keeps it equal and lowers the sum of all actions' end times, with every rank within
//! the memory cap; until no move helps or the evaluations run out. The tie-break matters:
//! a pipeline has many critical paths of equal length, and a move that shortens one of
//! them leaves the iteration as it was until the others are shortened too. Every kept move
//! strictly improves (makespan, Σ ends), so the search cannot cycle. The result has the
//! same actions as its start, in orders that are deadlock-free (a cycle leaves actions
//! unfinished, and that order is rejected).
//!
//! `--schedule auto` runs it last, on the schedule it chose (`+reordered` in its report):
//! on the 48-layer GPT of BENCHMARKS.md at 16 devices it takes the chosen ZB-V from 197.69
//! to 196.63 ms, and within 1.1× 1F1B's memory (recomputation off) from 203.44 to
//! 202.46 ms. It stops at a local optimum: more evaluations, longer jumps or random moves
//! (simulated annealing) found nothing further there.

use std::collections::HashMap;

use super::validate::{deps, Key, Slot};
use super::{Action, ActionKind, Schedule};
use crate::simulate::CostTable;

/// The farthest an action moves earlier on its rank in one step.
pub const MAX_JUMP: usize = 6;

/// A schedule's compute actions as a graph, with per-rank orders that the search changes.
pub struct Orders {
    actions: Vec<Action>,
    rank: Vec<usize>,
    duration: Vec<f64>,
    /// Data predecessors of node `v`: `preds[pred_at[v]..pred_at[v + 1]]`, each with the
    /// link time it pays.
    pred_at: Vec<usize>,
    preds: Vec<(usize, f64)>,
    /// Data successors, the same way.
    succ_at: Vec<usize>,
    succs: Vec<usize>,
    /// Stashed bytes an action adds (`F`) or frees (`W`, `B`); bytes live only while it
    /// runs (a backward's transient memory); whether the peak is taken during it.
    stash: Vec<(f64, f64, bool)>,
    /// Weights and optimizer state per rank.
    fixed: Vec<f64>,
    /// Each rank's actions in order (node ids).
    pub order: Vec<Vec<usize>>,
    layout_schedule: Schedule,
    // Scratch for `evaluate`.
    end: Vec<f64>,
    why: Vec<Option<usize>>,
    waiting: Vec<usize>,
    ready: Vec<usize>,
}

/// The result of one evaluation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Score {
    pub makespan: f64,
    /// Σ over actions of their end (the tie-break: the same iteration with work done
    /// earlier leaves more room for the moves after it).
    pub total_end: f64,
}

impl Score {
    /// A shorter iteration, or the same one (to a relative 1e-12) with a smaller
    /// [`Score::total_end`].
    fn beats(&self, other: &Score) -> bool {
        let tm = 1e-12 * other.makespan.abs();
        let tt = 1e-12 * other.total_end.abs();
        self.makespan < other.makespan - tm
            || (self.makespan <= other.makespan + tm && self.total_end < other.total_end - tt)
    }
}

impl Orders {
    /// The graph of `schedule`'s compute actions (communication and anything else that
    /// takes no rank time is dropped; [`Orders::schedule`] gives compute actions only).
    /// `None` when an action repeats or a dependency is missing.
    pub fn new(schedule: &Schedule, costs: &CostTable) -> Option<Orders> {
        let layout = &schedule.layout;
        let m = schedule.num_microbatches;
        let mut actions = vec![];
        let mut rank = vec![];
        let mut order = vec![vec![]; schedule.per_rank.len()];
        let mut key_of: HashMap<Key, usize> = HashMap::new();
        for (r, list) in schedule.per_rank.iter().enumerate() {
            for a in list.iter().filter(|a| a.kind.is_compute()) {
                let id = actions.len();
                let slots: &[Slot] = match a.kind {
                    ActionKind::Forward => &[Slot::F],
                    ActionKind::BackwardInput => &[Slot::B],
                    ActionKind::BackwardWeight => &[Slot::W],
                    ActionKind::FullBackward => &[Slot::B, Slot::W],
                    _ => &[Slot::Opt],
                };
                for &slot in slots {
                    if key_of.insert((slot, a.stage, a.micro_batch), id).is_some() {
                        return None;
                    }
                }
                actions.push(*a);
                rank.push(r);
                order[r].push(id);
            }
        }
        let n = actions.len();
        let mut pred_at = Vec::with_capacity(n + 1);
        let mut preds = vec![];
        let mut succ_count = vec![0usize; n];
        for a in &actions {
            pred_at.push(preds.len());
            for (key, cross) in deps(layout, m, a) {
                let &u = key_of.get(&key)?;
                let link = if cross {
                    costs.comm_between(key.1, a.stage)
                } else {
                    0.0
                };
                preds.push((u, link));
                succ_count[u] += 1;
            }
        }
        pred_at.push(preds.len());
        let mut succ_at = vec![0usize; n + 1];
        for v in 0..n {
            succ_at[v + 1] = succ_at[v] + succ_count[v];
        }
        let mut fill = succ_at.clone();
        let mut succs = vec![0usize; preds.len()];
        for v in 0..n {
            for &(u, _) in &preds[pred_at[v]..pred_at[v + 1]] {
                succs[fill[u]] = v;
                fill[u] += 1;
            }
        }
        let duration = actions.iter().map(|a| costs.duration(a)).collect();
        let stash = actions
            .iter()
            .map(|a| {
                let c = &costs.stages[a.stage];
                match a.kind {
                    ActionKind::Forward => (c.activation_memory, 0.0, false),
                    ActionKind::BackwardInput => (0.0, c.transient_memory, true),
                    ActionKind::BackwardWeight | ActionKind::FullBackward => {
                        (-c.activation_memory, c.transient_memory, true)
                    }
                    _ => (0.0, 0.0, false),
                }
            })
            .collect();
        let p = schedule.per_rank.len();
        let fixed = (0..p)
            .map(|r| {
                let w: f64 = (0..layout.num_virtual_stages())
                    .filter(|&s| layout.rank_of(s) == r)
                    .map(|s| costs.stages[s].weight_memory)
                    .sum();
                w * (1.0 + costs.optimizer_state_factor)
            })
            .collect();
        let mut layout_schedule = schedule.clone();
        layout_schedule.per_rank = vec![vec![]; p];
        Some(Orders {
            actions,
            rank,
            duration,
            pred_at,
            preds,
            succ_at,
            succs,
            stash,
            fixed,
            order,
            layout_schedule,
            end: vec![0.0; n],
            why: vec![None; n],
            waiting: vec![0; n],
            ready: Vec::with_capacity(n),
        })
    }

    /// The schedule of the current orders (compute actions only).
    pub fn schedule(&self) -> Schedule {
        let mut s = self.layout_schedule.clone();
        s.per_rank = self
            .order
            .iter()
            .map(|l| l.iter().map(|&v| self.actions[v]).collect())
            .collect();
        s
    }

    /// Peak memory of rank `r` for the order `list` (as the simulator counts it).
    pub fn rank_peak(&self, r: usize, list: &[usize]) -> f64 {
        let (mut bytes, mut peak) = (0.0f64, 0.0f64);
        for &v in list {
            let (delta, transient, during) = self.stash[v];
            if during {
                peak = peak.max(bytes + transient);
            }
            bytes += delta;
            peak = peak.max(bytes);
        }
        self.fixed[r] + peak
    }

    /// The largest peak memory over ranks.
    pub fn peak(&self) -> f64 {
        (0..self.order.len())
            .map(|r| self.rank_peak(r, &self.order[r]))
            .fold(0.0, f64::max)
    }

    /// Longest-path times of the current orders; `None` when they deadlock. Leaves each
    /// action's end and the action that decided its start in the scratch arrays.
    pub fn evaluate(&mut self) -> Option<Score> {
        let n = self.actions.len();
        // Position of each node on its rank, to find machine predecessors and successors.
        let mut next = vec![usize::MAX; n];
        let mut prev = vec![usize::MAX; n];
        for list in &self.order {
            for w in list.windows(2) {
                next[w[0]] = w[1];
                prev[w[1]] = w[0];
            }
        }
        self.ready.clear();
        for (v, (waiting, &before)) in self.waiting.iter_mut().zip(&prev).enumerate() {
            *waiting = self.pred_at[v + 1] - self.pred_at[v] + usize::from(before != usize::MAX);
            if *waiting == 0 {
                self.ready.push(v);
            }
        }
        let mut done = 0;
        let mut makespan = 0.0f64;
        while let Some(v) = self.ready.pop() {
            done += 1;
            let (mut start, mut why) = match prev[v] {
                usize::MAX => (0.0, None),
                u => (self.end[u], Some(u)),
            };
            for &(u, link) in &self.preds[self.pred_at[v]..self.pred_at[v + 1]] {
                let t = self.end[u] + link;
                if t > start {
                    start = t;
                    why = Some(u);
                }
            }
            let end = start + self.duration[v];
            self.end[v] = end;
            self.why[v] = why;
            makespan = makespan.max(end);
            for i in self.succ_at[v]..self.succ_at[v + 1] {
                let w = self.succs[i];
                self.waiting[w] -= 1;
                if self.waiting[w] == 0 {
                    self.ready.push(w);
                }
            }
            if next[v] != usize::MAX {
                let w = next[v];
                self.waiting[w] -= 1;
                if self.waiting[w] == 0 {
                    self.ready.push(w);
                }
            }
        }
        if done < n {
            return None;
        }
        Some(Score {
            makespan,
            total_end: self.end.iter().sum(),
        })
    }

    /// The critical path of the last evaluation, from its end back to its start.
    fn critical_path(&self) -> Vec<usize> {
        let Some(mut v) =
            (0..self.actions.len()).max_by(|&a, &b| self.end[a].total_cmp(&self.end[b]))
        else {
            return vec![];
        };
        let mut path = vec![v];
        while let Some(u) = self.why[v] {
            path.push(u);
            v = u;
        }
        path
    }

    /// When `v`'s data is there, by the last evaluation.
    fn data_ready(&self, v: usize) -> f64 {
        self.preds[self.pred_at[v]..self.pred_at[v + 1]]
            .iter()
            .map(|&(u, link)| self.end[u] + link)
            .fold(0.0, f64::max)
    }

    fn is_data_pred(&self, u: usize, v: usize) -> bool {
        self.preds[self.pred_at[v]..self.pred_at[v + 1]]
            .iter()
            .any(|&(x, _)| x == u)
    }
}

/// Improve `schedule`'s per-rank orders by the critical-path local search (module docs)
/// for at most `evaluations` evaluations, each rank's peak memory held to `cap` (or to its
/// own peak in `schedule` where that is higher). Returns the improved compute
/// schedule with its (makespan, peak), or `None` when no move shortened the iteration.
pub fn improve(
    schedule: &Schedule,
    costs: &CostTable,
    cap: f64,
    evaluations: usize,
) -> Option<(Schedule, (f64, f64))> {
    let mut g = Orders::new(schedule, costs)?;
    let start = g.evaluate()?;
    let mut best = start;
    let caps: Vec<f64> = (0..g.order.len())
        .map(|r| cap.max(g.rank_peak(r, &g.order[r])))
        .collect();
    let n = g.actions.len();
    let mut pos = vec![0usize; n];
    let mut left = evaluations;
    'steps: while left > 0 {
        for list in &g.order {
            for (i, &v) in list.iter().enumerate() {
                pos[v] = i;
            }
        }
        // Critical actions that waited for the action before them on their rank although
        // their data was there earlier, from the end of the path back, with the time their
        // data arrived (taken before a move changes the scratch arrays).
        let moves: Vec<(usize, usize, usize, f64)> = g
            .critical_path()
            .into_iter()
            .filter_map(|v| {
                let (r, at) = (g.rank[v], pos[v]);
                let ready = g.data_ready(v);
                let start = g.end[v] - g.duration[v];
                (at > 0 && g.why[v] == Some(g.order[r][at - 1]) && ready < start)
                    .then_some((r, at, v, ready))
            })
            .collect();
        for (r, at, v, ready) in moves {
            let mut tried = 0;
            for jump in 1..=at {
                let u = g.order[r][at - jump];
                if tried == MAX_JUMP || g.is_data_pred(u, v) {
                    break;
                }
                let mut list = g.order[r].clone();
                list.remove(at);
                list.insert(at - jump, v);
                if g.rank_peak(r, &list) <= caps[r] {
                    if left == 0 {
                        break 'steps;
                    }
                    left -= 1;
                    tried += 1;
                    let old = std::mem::replace(&mut g.order[r], list);
                    match g.evaluate() {
                        Some(s) if s.beats(&best) => {
                            best = s;
                            continue 'steps;
                        }
                        _ => g.order[r] = old,
                    }
                }
                // Further back, `v` would start no earlier: `u` started after its data.
                if g.end[u] - g.duration[u] <= ready {
                    break;
                }
            }
        }
        break;
    }
    (best.makespan < start.makespan).then(|| (g.schedule(), (best.makespan, g.peak())))
}
