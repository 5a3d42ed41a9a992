//! ZB-V for measured costs: the V-shaped zero-bubble schedule built round by round in
//! simulated time, the way the ZB-V authors turn their unit-cost construction into a
//! schedule for real `F`, `I` and `W` times (Qi et al., "Zero Bubble Pipeline
//! Parallelism", ICLR 2024, §6 and its V-schedule heuristic).
//!
//! At `F = I = W` the construction in [`super::generators::zb_v`] has no bubble. With
//! `I ≈ 1.7 F` and `W ≈ 0.6 F` (a transformer block) its fixed order waits: an input
//! gradient travels down the V more slowly than the forwards came up it, and the `W`s sit
//! where unit costs put them. This builder keeps the construction's shape (chunk-0
//! forwards first, as many as fit before the first chunk-1 forward comes back, then each
//! round one input gradient and one forward per rank, `W`s deferred) but decides every
//! choice with the clock:
//! 1. **Warm-up.** Rank `r` runs chunk-0 forwards while they end before its first
//!    chunk-1 forward can start and while `2 + 2r` chunk activations stay free for the
//!    ones to come; then the forwards are evened out so that every rank has run at least
//!    as many as the rank above it, and more chunk-1 forwards than it.
//! 2. **Steady state and drain**, in rounds (`2m` of them at even costs): each rank runs
//!    one input gradient (chunk 0 once the rank below has sent one, else chunk 1), then
//!    one forward (chunk 1 if its input has arrived, else chunk 0); a rank whose inputs
//!    for both are not there yet sits the round out. Before each, deferred `W`s run while one fits
//!    entirely in the wait for that action's input, and one more when the wait would
//!    leave this rank with more idle time than the most idle rank so far (`fill_b` and
//!    `fill_f` say whether chunk-1 input gradients and forwards may take it). With
//!    `fill_fwd`, forwards whose input is there run first in the wait for an input
//!    gradient, as many as end before it arrives and fit the rank's memory: without it, a
//!    rank at the V's bottom that has run its warm-up idles until the first input gradient
//!    comes back, although the rank above keeps sending it forwards.
//! 3. A rank never holds more than `cap` chunk activations, nor (when it is given an
//!    allowance in bytes, [`zb_v_greedy_bytes`]) more stashed bytes than that: a forward
//!    that would exceed either runs a deferred `W` first.
//!
//! The idle time each rank has accrued is the measure. A second pass repeats the build
//! with each rank allowed the idle of the most idle rank of the first pass (so ranks that
//! idle less hold back their `W`s less), for as long as that lowers the worst rank's idle.
//! [`zb_v_measured`] builds the four `fill_b × fill_f` variants at the stages' mean costs
//! ([`even_costs`]) and keeps the one the simulator finds fastest at the real costs, or the
//! construction if none beats it, then the same with every rank held to the bytes of the
//! construction's largest peak instead of a count: on a V the stages' stashes differ
//! (the attention half of a layer keeps less than its MLP half), so one count for all
//! leaves the ranks with smaller activations short of memory they may use, and the V's
//! bottom ranks, which wait longest for their first input gradient, fill that wait with
//! forwards. On the 48-layer GPT of BENCHMARKS.md (16 devices, 64 micro-batches, `h100`)
//! the builder takes ZB-V from 0.906 to 0.927 of the lower bound, and the byte allowance to
//! 0.931, at no more peak memory.

use std::collections::VecDeque;

use super::{Action, ActionKind, Layout, Schedule};
use crate::simulate::{simulate, CostTable};

use ActionKind::{BackwardInput as Bi, BackwardWeight as Bw, Forward as Fw};

/// Kind index: forward, input gradient, weight gradient.
const F: usize = 0;
const I: usize = 1;
const W: usize = 2;

/// The state of one build.
struct Build<'a> {
    p: usize,
    m: usize,
    costs: &'a CostTable,
    /// Chunk activations each rank may hold.
    cap: Vec<usize>,
    /// Next micro-batch of (kind, chunk) per rank.
    done: Vec<[[usize; 2]; 3]>,
    /// End time of (F or I, chunk, rank, micro-batch); NaN until it runs.
    end: Vec<f64>,
    /// When each rank is next free.
    free: Vec<f64>,
    /// Stashed chunk activations per rank.
    stash: Vec<usize>,
    /// Idle time per rank since its first action.
    idle: Vec<f64>,
    /// Weight gradients not yet run, per rank: (chunk, micro-batch).
    pending: Vec<VecDeque<(usize, usize)>>,
    out: Vec<Vec<Action>>,
    /// The idle each rank may accrue (from the previous pass), and its maximum.
    approved: Option<(Vec<f64>, f64)>,
    /// Bytes: each stage's stash per micro-batch and each rank's allowance, when the
    /// ranks are capped by bytes too (the builder's times are averaged, its bytes not).
    bytes: Option<(Vec<f64>, Vec<f64>)>,
    /// Stashed bytes per rank (with `bytes`).
    stash_bytes: Vec<f64>,
    /// Whether forwards may run in the wait for an input gradient.
    fill_fwd: bool,
}

/// The build cannot go on (an input that is not there, the stash over its cap).
struct Stuck;

impl<'a> Build<'a> {
    fn new(p: usize, m: usize, costs: &'a CostTable, cap: Vec<usize>) -> Self {
        Build {
            p,
            m,
            costs,
            cap,
            done: vec![[[0; 2]; 3]; p],
            end: vec![f64::NAN; 2 * 2 * p * m],
            free: vec![0.0; p],
            stash: vec![0; p],
            idle: vec![0.0; p],
            pending: vec![VecDeque::new(); p],
            out: vec![vec![]; p],
            approved: None,
            bytes: None,
            stash_bytes: vec![0.0; p],
            fill_fwd: false,
        }
    }

    /// Bytes one activation of `chunk` on rank `r` stashes (0 without a byte cap).
    fn act_bytes(&self, chunk: usize, r: usize) -> f64 {
        self.bytes
            .as_ref()
            .map_or(0.0, |(act, _)| act[self.stage(chunk, r)])
    }

    /// Whether rank `r` can stash `more` activations (each as large as its larger chunk's)
    /// on top of what it holds: within its count and its bytes.
    fn room(&self, r: usize, more: usize) -> bool {
        let bytes_ok = self.bytes.as_ref().is_none_or(|(_, cap)| {
            let unit = self.act_bytes(0, r).max(self.act_bytes(1, r));
            self.stash_bytes[r] + more as f64 * unit <= cap[r]
        });
        self.stash[r] + more <= self.cap[r] && bytes_ok
    }

    /// Whether the next forward of `chunk` on `r` would go over its count or its bytes.
    fn full(&self, chunk: usize, r: usize) -> bool {
        let over_bytes = self
            .bytes
            .as_ref()
            .is_some_and(|(_, cap)| self.stash_bytes[r] + self.act_bytes(chunk, r) > cap[r]);
        self.stash[r] >= self.cap[r] || over_bytes
    }

    fn stage(&self, chunk: usize, r: usize) -> usize {
        if chunk == 0 {
            r
        } else {
            2 * self.p - 1 - r
        }
    }

    fn at(&self, kind: usize, chunk: usize, r: usize, mb: usize) -> usize {
        ((kind * 2 + chunk) * self.p + r) * self.m + mb
    }

    fn ended(&self, kind: usize, chunk: usize, r: usize, mb: usize) -> Option<f64> {
        let t = self.end[self.at(kind, chunk, r, mb)];
        (!t.is_nan()).then_some(t)
    }

    fn duration(&self, kind: usize, chunk: usize, r: usize) -> f64 {
        let c = &self.costs.stages[self.stage(chunk, r)];
        [c.forward, c.backward_input, c.backward_weight][kind]
    }

    /// The rank another rank's input for (kind, chunk) on `r` comes from, if any.
    fn source(&self, kind: usize, chunk: usize, r: usize) -> Option<usize> {
        match (kind, chunk) {
            (F, 0) | (I, 1) => r.checked_sub(1),
            (F, 1) | (I, 0) => (r + 1 < self.p).then_some(r + 1),
            _ => None,
        }
    }

    /// When the cross-rank input of the next (kind, chunk) on `r` arrives: `None` if it
    /// has none, `Some(None)` if it has not run yet.
    fn arrival(&self, kind: usize, chunk: usize, r: usize) -> Option<Option<f64>> {
        let q = self.source(kind, chunk, r)?;
        let mb = self.done[r][kind][chunk];
        if mb >= self.m {
            return Some(None);
        }
        let comm = self
            .costs
            .comm_between(self.stage(chunk, q), self.stage(chunk, r));
        Some(self.ended(kind, chunk, q, mb).map(|t| t + comm))
    }

    /// Run the next (kind, chunk) on rank `r`.
    fn put(&mut self, kind: usize, chunk: usize, r: usize) -> Result<(), Stuck> {
        let mb = self.done[r][kind][chunk];
        if mb >= self.m {
            return Err(Stuck);
        }
        // Inputs on the same rank: the forward of the other chunk at the V's bottom and
        // the loss's own forward at its top, this stage's forward for a backward, the
        // input gradient for a weight gradient.
        let local = match (kind, chunk) {
            (F, 1) if r + 1 == self.p => Some((F, 0)),
            (I, 1) if r == 0 => Some((F, 1)),
            (I, 0) if r + 1 == self.p => Some((I, 1)),
            (I, c) => Some((F, c)),
            (W, c) => Some((I, c)),
            _ => None,
        };
        if let Some((k, c)) = local {
            if kind != W && self.ended(k, c, r, mb).is_none() {
                return Err(Stuck);
            }
        }
        if kind == I && self.ended(F, chunk, r, mb).is_none() {
            return Err(Stuck);
        }
        let mut start = self.free[r];
        match self.arrival(kind, chunk, r) {
            Some(Some(t)) => start = start.max(t),
            Some(None) => return Err(Stuck),
            None => {}
        }
        match kind {
            F if self.full(chunk, r) => return Err(Stuck),
            F => {
                self.stash[r] += 1;
                self.stash_bytes[r] += self.act_bytes(chunk, r);
            }
            W => {
                self.stash[r] = self.stash[r].saturating_sub(1);
                self.stash_bytes[r] -= self.act_bytes(chunk, r);
            }
            _ => {}
        }
        if self.done[r][F][0] > 0 {
            self.idle[r] += start - self.free[r];
        }
        let end = start + self.duration(kind, chunk, r);
        if kind != W {
            let i = self.at(kind, chunk, r, mb);
            self.end[i] = end;
        }
        if kind == I {
            self.pending[r].push_back((chunk, mb));
        }
        self.free[r] = end;
        self.done[r][kind][chunk] += 1;
        let action = [Fw, Bi, Bw][kind];
        let stage = self.stage(chunk, r);
        self.out[r].push(Action::new(action, stage, mb, chunk));
        Ok(())
    }

    fn put_w(&mut self, r: usize) -> Result<(), Stuck> {
        let (chunk, mb) = self.pending[r].pop_front().ok_or(Stuck)?;
        debug_assert_eq!(self.done[r][W][chunk], mb);
        self.put(W, chunk, r)
    }

    /// The most idle rank so far, or what `r` may still accrue under the previous pass.
    fn allowed_idle(&self, r: usize) -> f64 {
        let most = self.idle.iter().fold(0.0f64, |a, &b| a.max(b));
        match &self.approved {
            Some((per_rank, max)) => most.max(max - per_rank[r]),
            None => most,
        }
    }

    /// Deferred `W`s before the next (kind, chunk) on `r`: those that fit in the wait for
    /// its input, and one more when the wait would exceed the allowed idle (`extra`).
    fn fill(&mut self, kind: usize, chunk: usize, r: usize, extra: bool) -> Result<(), Stuck> {
        let Some(Some(t)) = self.arrival(kind, chunk, r) else {
            return Ok(());
        };
        while let Some(&(c, _)) = self.pending[r].front() {
            if t < self.free[r] + self.duration(W, c, r) {
                break;
            }
            self.put_w(r)?;
        }
        if extra
            && !self.pending[r].is_empty()
            && t - self.free[r] > self.allowed_idle(r) - self.idle[r]
        {
            self.put_w(r)?;
        }
        Ok(())
    }

    /// The chunk of the next forward on `r` whose input is there (chunk 1 first when it
    /// lags chunk 0), if any.
    fn next_forward(&self, r: usize) -> Option<usize> {
        let d = self.done[r][F];
        let order = if d[1] < d[0] { [1, 0] } else { [0, 1] };
        order.into_iter().find(|&c| {
            d[c] < self.m && (c == 0 || d[1] < d[0]) && self.can(F, c, r) && !self.full(c, r)
        })
    }

    /// Forwards that fit entirely in the wait for the input of the next (kind, chunk) on
    /// `r`, while there is room for their stash.
    fn fill_forwards(&mut self, kind: usize, chunk: usize, r: usize) -> Result<(), Stuck> {
        if !self.fill_fwd {
            return Ok(());
        }
        let Some(Some(t)) = self.arrival(kind, chunk, r) else {
            return Ok(());
        };
        while let Some(c) = self.next_forward(r) {
            let ready = match self.arrival(F, c, r) {
                Some(Some(x)) => x,
                Some(None) => break,
                None => 0.0,
            };
            if self.free[r].max(ready) + self.duration(F, c, r) > t {
                break;
            }
            self.put(F, c, r)?;
        }
        Ok(())
    }

    /// Whether the next (kind, chunk) on `r` has its inputs (`W`: always, it is queued).
    fn can(&self, kind: usize, chunk: usize, r: usize) -> bool {
        let mb = self.done[r][kind][chunk];
        if mb >= self.m {
            return false;
        }
        let local = match (kind, chunk) {
            (F, 1) if r + 1 == self.p => Some((F, 0)),
            (I, 0) if r + 1 == self.p => Some((I, 1)),
            (I, c) => Some((F, c)),
            _ => None,
        };
        if let Some((k, c)) = local {
            if self.ended(k, c, r, mb).is_none() {
                return false;
            }
        }
        !matches!(self.arrival(kind, chunk, r), Some(None))
    }

    fn forwards(&self, r: usize) -> usize {
        self.done[r][F][0] + self.done[r][F][1]
    }

    fn warm_up(&mut self) -> Result<(), Stuck> {
        let (p, m) = (self.p, self.m);
        for r in 0..p {
            self.put(F, 0, r)?;
        }
        for r in (0..p).rev() {
            if r + 1 < p {
                let comm = self
                    .costs
                    .comm_between(self.stage(1, r + 1), self.stage(1, r));
                let back = self.ended(F, 1, r + 1, 0).ok_or(Stuck)? + comm;
                while self.room(r, 2 + 2 * r)
                    && self.free[r] + self.duration(F, 0, r) <= back
                    && self.done[r][F][0] < m
                {
                    for q in 0..=r {
                        if self.done[q][F][0] < m {
                            self.put(F, 0, q)?;
                        }
                    }
                }
            }
            self.put(F, 1, r)?;
        }
        let mut chunk = 0;
        for r in 1..p {
            let mut guard = 0;
            while self.forwards(r) < self.forwards(r - 1)
                || (self.done[r][F][1] <= self.done[r - 1][F][1] && self.done[r - 1][F][1] < m)
            {
                guard += 1;
                if guard > 4 * m + 4 {
                    return Err(Stuck);
                }
                for q in (r..p).rev() {
                    if self.done[q][F][chunk] < m {
                        self.put(F, chunk, q)?;
                    }
                }
                chunk = 1 - chunk;
            }
        }
        Ok(())
    }

    fn steady(&mut self, fill_b: bool, fill_f: bool) -> Result<(), Stuck> {
        let (p, m) = (self.p, self.m);
        // `2m` rounds at even costs; more when a rank had to skip one.
        while self
            .done
            .iter()
            .any(|d| d[I][0] < m || d[I][1] < m || d[F][1] < m)
        {
            let mut progress = false;
            // Input gradients: chunk 0 (going back up the V) where the rank below has
            // sent one, ranks from the bottom up; then chunk 1, from the top down.
            let mut up = vec![];
            let mut down = vec![];
            for r in 0..p {
                let d = self.done[r][I];
                if d[1] >= m && d[0] >= m {
                    continue;
                }
                let chunk0 = d[0] < d[1]
                    && (r + 1 == p || d[1] >= m || self.ended(I, 0, r + 1, d[0]).is_some());
                if chunk0 {
                    up.push(r);
                } else {
                    down.push(r);
                }
            }
            let order = up.into_iter().rev().map(|r| (r, 0));
            for (r, chunk) in order.chain(down.into_iter().map(|r| (r, 1))) {
                // At uneven costs the warm-up's counts can leave the chosen input not yet
                // sent: then the other chunk, or nothing this round.
                let Some(chunk) = [chunk, 1 - chunk].into_iter().find(|&c| self.can(I, c, r))
                else {
                    continue;
                };
                self.fill_forwards(I, chunk, r)?;
                self.fill(I, chunk, r, chunk == 0 || fill_b)?;
                self.put(I, chunk, r)?;
                progress = true;
            }
            for r in 0..p {
                let d = self.done[r][F];
                if d[1] >= m {
                    continue;
                }
                let chunk = if d[1] >= d[0] {
                    Some(0)
                } else if r + 1 == p || self.ended(F, 1, r + 1, d[1]).is_some() {
                    Some(1)
                } else if d[0] < m && (r == 0 || self.ended(F, 0, r - 1, d[0]).is_some()) {
                    Some(0)
                } else {
                    None
                };
                let Some(chunk) = chunk.filter(|&c| self.can(F, c, r)) else {
                    continue;
                };
                while self.full(chunk, r) {
                    self.put_w(r)?;
                }
                self.fill(F, chunk, r, fill_f)?;
                self.put(F, chunk, r)?;
                progress = true;
            }
            if !progress {
                return Err(Stuck);
            }
        }
        for r in 0..p {
            while !self.pending[r].is_empty() {
                self.put_w(r)?;
            }
        }
        Ok(())
    }
}

/// One build with `fill_b`/`fill_f`, refined while the worst rank's idle falls; `None` if
/// the build gets stuck (a choice the order cannot satisfy at these costs).
pub fn zb_v_greedy(
    ranks: usize,
    microbatches: usize,
    costs: &CostTable,
    cap: usize,
    fill_b: bool,
    fill_f: bool,
) -> Option<Schedule> {
    zb_v_greedy_caps(
        ranks,
        microbatches,
        costs,
        &vec![cap; ranks],
        fill_b,
        fill_f,
    )
}

/// [`zb_v_greedy`] with a cap of chunk activations per rank (`caps[r]`).
pub fn zb_v_greedy_caps(
    ranks: usize,
    microbatches: usize,
    costs: &CostTable,
    caps: &[usize],
    fill_b: bool,
    fill_f: bool,
) -> Option<Schedule> {
    zb_v_greedy_bytes(ranks, microbatches, costs, caps, None, fill_b, fill_f)
}

/// [`zb_v_greedy_caps`], each rank also held to a number of stashed bytes: `bytes` is
/// (each stage's stash per micro-batch, each rank's allowance); the costs' own
/// `activation_memory` is not used (the builder's costs are averaged).
pub fn zb_v_greedy_bytes(
    ranks: usize,
    microbatches: usize,
    costs: &CostTable,
    caps: &[usize],
    bytes: Option<(&[f64], &[f64])>,
    fill_b: bool,
    fill_f: bool,
) -> Option<Schedule> {
    let flags = Flags {
        fill_b,
        fill_f,
        fill_fwd: false,
    };
    greedy(ranks, microbatches, costs, caps, bytes, flags)
}

/// Which waits a build fills: with deferred `W`s before input gradients (`fill_b`) and
/// before forwards (`fill_f`), and with forwards before input gradients (`fill_fwd`).
#[derive(Clone, Copy)]
struct Flags {
    fill_b: bool,
    fill_f: bool,
    fill_fwd: bool,
}

fn greedy(
    ranks: usize,
    microbatches: usize,
    costs: &CostTable,
    caps: &[usize],
    bytes: Option<(&[f64], &[f64])>,
    flags: Flags,
) -> Option<Schedule> {
    let (p, m) = (ranks, microbatches);
    if p == 0 || m == 0 || costs.stages.len() != 2 * p || caps.len() != p {
        return None;
    }
    if bytes.is_some_and(|(a, c)| a.len() != 2 * p || c.len() != p) {
        return None;
    }
    let run = |approved: Option<(Vec<f64>, f64)>| -> Option<(Vec<Vec<Action>>, Vec<f64>)> {
        let mut b = Build::new(p, m, costs, caps.to_vec());
        b.approved = approved;
        b.bytes = bytes.map(|(a, c)| (a.to_vec(), c.to_vec()));
        b.fill_fwd = flags.fill_fwd;
        b.warm_up().ok()?;
        b.steady(flags.fill_b, flags.fill_f).ok()?;
        let complete = b
            .done
            .iter()
            .all(|d| d.iter().all(|k| k[0] == m && k[1] == m));
        complete.then_some((b.out, b.idle))
    };
    let (mut best, mut idle) = run(None)?;
    let mut worst = idle.iter().fold(0.0f64, |a, &b| a.max(b));
    // Each pass lets every rank idle up to the previous pass's worst rank; at most a few
    // passes (each must lower the worst idle).
    for _ in 0..8 {
        let Some((next, next_idle)) = run(Some((idle.clone(), worst))) else {
            break;
        };
        let next_worst = next_idle.iter().fold(0.0f64, |a, &b| a.max(b));
        if next_worst >= worst {
            break;
        }
        (best, idle, worst) = (next, next_idle, next_worst);
    }
    let mut s = Schedule::empty(Layout::VShape { ranks: p }, m);
    s.per_rank = best;
    Some(s)
}

/// Every stage at the mean `F`, `I` and `W` of `costs`, with its link time. The builder
/// works on these: at uneven per-stage costs its warm-up counts come out uneven and the
/// rounds stall (as the ZB-V authors do, who build from one averaged cost per kind); the
/// simulator then times the order at the real costs.
pub fn even_costs(costs: &CostTable) -> CostTable {
    let n = costs.stages.len().max(1) as f64;
    let mean =
        |f: fn(&crate::simulate::StageCosts) -> f64| costs.stages.iter().map(f).sum::<f64>() / n;
    CostTable::uniform(
        costs.stages.len(),
        mean(|c| c.forward),
        mean(|c| c.backward_input),
        mean(|c| c.backward_weight),
        costs.comm_time,
    )
}

/// ZB-V for these costs: the fastest under the simulator of the construction
/// ([`super::generators::zb_v`], with its `W`s moved into idle time when that is faster),
/// the four [`zb_v_greedy`] variants built at [`even_costs`] within `cap` chunk
/// activations per rank (`2·ranks`: 1F1B's count), and the four again with each rank held
/// to the stash bytes the construction's largest peak leaves it ([`v_stash_allowance`])
/// instead of a count; none with more peak memory than the construction.
pub fn zb_v_measured(ranks: usize, microbatches: usize, costs: &CostTable, cap: usize) -> Schedule {
    zb_v_measured_within(ranks, microbatches, costs, cap, f64::INFINITY)
}

/// [`zb_v_measured`] with the peak memory held to `limit` bytes as well: the builds with
/// a byte allowance then get what the smaller of the construction's peak and the limit
/// leaves each rank, so ZB-V can fit a limit its construction exceeds (the construction
/// is still returned when nothing fits; the planner then reports it over the limit).
pub fn zb_v_measured_within(
    ranks: usize,
    microbatches: usize,
    costs: &CostTable,
    cap: usize,
    limit: f64,
) -> Schedule {
    let base = super::generators::better_with_filled_w(
        super::generators::zb_v(ranks, microbatches),
        costs,
        cap,
    );
    let Ok(base_report) = simulate(&base, costs) else {
        return base;
    };
    // No more memory than the construction: no rank holds more chunk activations than it
    // does there (with fewer micro-batches than `2p`, fewer than `cap`), and no more bytes.
    let budget = base_report
        .peak_memory
        .iter()
        .copied()
        .fold(0.0, f64::max)
        .min(limit);
    let caps: Vec<usize> = match simulate(&super::generators::zb_v(ranks, microbatches), costs) {
        Ok(r) => r.peak_stash.iter().map(|&n| n.min(cap)).collect(),
        Err(_) => return base,
    };
    // The construction stays the answer only while nothing that fits the budget is found.
    let base_fits = base_report
        .peak_memory
        .iter()
        .all(|&b| b <= budget * (1.0 + 1e-9));
    let mut best = (
        if base_fits {
            base_report.makespan
        } else {
            f64::INFINITY
        },
        base,
    );
    let even = even_costs(costs);
    // The same builds with every rank held to the bytes, not the count, of the
    // construction's peak: a rank whose chunks stash less runs more forwards before its
    // first input gradient comes back (the V's bottom ranks wait longest for it).
    let allowance = v_stash_allowance(ranks, costs, budget);
    let act: Vec<f64> = costs.stages.iter().map(|c| c.activation_memory).collect();
    let counts = vec![2 * microbatches; ranks];
    let by_count = zb_v_greedy_variants(ranks, microbatches, &even, &caps, None, false);
    let by_bytes = zb_v_greedy_variants(
        ranks,
        microbatches,
        &even,
        &counts,
        Some((&act, &allowance)),
        false,
    );
    let mut seen: Vec<Vec<Vec<super::Action>>> = vec![];
    for s in by_count.into_iter().chain(by_bytes) {
        if seen.contains(&s.per_rank) {
            continue;
        }
        seen.push(s.per_rank.clone());
        if super::validate(&super::generators::insert_communication(&s)).is_err() {
            continue;
        }
        let Ok(r) = simulate(&s, costs) else {
            continue;
        };
        let peak = r.peak_memory.iter().copied().fold(0.0, f64::max);
        if peak <= budget * (1.0 + 1e-9) && r.makespan < best.0 * (1.0 - 1e-12) {
            best = (r.makespan, s);
        }
    }
    best.1
}

/// The distinct schedules of the four `fill_b × fill_f` builds, and with `forward_fill`
/// the same four with `fill_fwd` (see the module docs; they often come out the same: the
/// flags only matter where a wait is left to fill). `--schedule zb-v` builds without the
/// forward fill: its one schedule is chosen on the partitioner's stash estimate, and the
/// forward fill's extra forwards in flight can exceed a limit in the training program's
/// stash that the estimate keeps (48-layer GPT at 16 devices within 1.1× 1F1B's memory:
/// 207.1 against 203.4 ms); `auto` has its runners-up to fall back on.
pub fn zb_v_greedy_variants(
    ranks: usize,
    microbatches: usize,
    costs: &CostTable,
    caps: &[usize],
    bytes: Option<(&[f64], &[f64])>,
    forward_fill: bool,
) -> Vec<Schedule> {
    let mut out: Vec<Schedule> = vec![];
    let fills: &[bool] = if forward_fill {
        &[false, true]
    } else {
        &[false]
    };
    for &fill_fwd in fills {
        for (fill_b, fill_f) in [(true, true), (true, false), (false, true), (false, false)] {
            let flags = Flags {
                fill_b,
                fill_f,
                fill_fwd,
            };
            if let Some(s) = greedy(ranks, microbatches, costs, caps, bytes, flags) {
                if !out.iter().any(|o| o.per_rank == s.per_rank) {
                    out.push(s);
                }
            }
        }
    }
    out
}

/// The stash bytes each rank of a V may hold within `peak` bytes of memory: what its
/// weights, their gradients and optimizer state, and the larger transient of a backward
/// leave of it (rank `r` holds stages `r` and `2p−1−r`; see [`simulate`]'s peak).
pub fn v_stash_allowance(ranks: usize, costs: &CostTable, peak: f64) -> Vec<f64> {
    (0..ranks)
        .map(|r| {
            let (a, b) = (&costs.stages[r], &costs.stages[2 * ranks - 1 - r]);
            let fixed = (a.weight_memory + b.weight_memory) * (1.0 + costs.optimizer_state_factor)
                + a.transient_memory.max(b.transient_memory);
            peak - fixed
        })
        .collect()
}
