//! A lower bound on the iteration time of any schedule on a chain layout (one stage per
//! rank, interleaved chunks or the V) within a peak memory, from the pipeline's fill: rank
//! `r` can run nothing before the first micro-batch's forwards reach its first stage, and
//! nothing but forwards until the first input gradient comes back down to its last stage
//! (no `I` of its stages can run before, so no `W` either and no stash is freed). So in
//! that time it is busy at most with the forwards whose activations fit its stash budget
//! (the peak less its weights, gradients and optimizer state), and
//!
//! `makespan ≥ work(r) + first_input(r) − min(forwards that fit, first_input(r) − start(r))`.
//!
//! The bound holds for every order of the actions (it reads only the layout, the costs and
//! the memory); `M · Σ(F+I+W) / P` ignores the fill, which on deep pipelines is most of the
//! gap between it and any schedule. At unit costs on the V with `2p` chunk activations it is
//! ZB-V's `6m + p − 1` exactly (tested).

use super::CostTable;
use crate::schedule::Layout;

/// The fill bound of one rank (seconds, or the cost table's unit).
#[derive(Clone, Debug, PartialEq)]
pub struct RankFillBound {
    pub rank: usize,
    /// Total `F + I + W` of the rank's stages over the micro-batches.
    pub work: f64,
    /// Earliest start of its first forward.
    pub start: f64,
    /// Earliest start of its first input gradient.
    pub first_input: f64,
    /// Most forward time it can run before that within its stash budget.
    pub forwards_before: f64,
    /// `work + first_input − forwards_before`.
    pub bound: f64,
}

/// The fill bound of every rank of `layout` (a chain: interleaved chunks, the V, or a stage
/// DAG that is a chain; `None` for other DAGs or a cost table of another size) for `m` micro-batches within a peak
/// memory of `peak` bytes per device.
pub fn fill_bound(
    layout: &Layout,
    costs: &CostTable,
    m: usize,
    peak: f64,
) -> Option<Vec<RankFillBound>> {
    let nv = layout.num_virtual_stages();
    // A stage DAG only when it is the chain 0 → 1 → … (as the graph partition of a
    // sequential model gives).
    if let Layout::Dag { edges, .. } = layout {
        let mut e = edges.clone();
        e.sort_unstable();
        e.dedup();
        if e.len() + 1 != nv
            || e.iter()
                .enumerate()
                .any(|(i, &(a, b))| (a, b) != (i, i + 1))
        {
            return None;
        }
    }
    if costs.stages.len() != nv || nv == 0 {
        return None;
    }
    let rank_of: Vec<usize> = (0..nv).map(|s| layout.rank_of(s)).collect();
    let link = |a: usize, b: usize| {
        if rank_of[a] != rank_of[b] {
            costs.comm_between(a, b)
        } else {
            0.0
        }
    };
    let c = &costs.stages;
    // Forward of the first micro-batch reaching stage s; all forwards done at the loss.
    let mut reach = vec![0.0f64; nv];
    for s in 1..nv {
        reach[s] = reach[s - 1] + c[s - 1].forward + link(s - 1, s);
    }
    let loss = reach[nv - 1] + c[nv - 1].forward;
    // First input gradient able to start on stage s.
    let mut grad = vec![0.0f64; nv];
    grad[nv - 1] = loss;
    for s in (0..nv - 1).rev() {
        grad[s] = grad[s + 1] + c[s + 1].backward_input + link(s + 1, s);
    }
    let ranks = layout.num_ranks();
    let mut out = Vec::with_capacity(ranks);
    for r in 0..ranks {
        let stages: Vec<usize> = (0..nv).filter(|&s| rank_of[s] == r).collect();
        let (Some(&first), Some(&last)) = (stages.first(), stages.last()) else {
            continue;
        };
        let work: f64 = stages
            .iter()
            .map(|&s| c[s].forward + c[s].backward_input + c[s].backward_weight)
            .sum::<f64>()
            * m as f64;
        let fixed: f64 = stages
            .iter()
            .map(|&s| c[s].weight_memory * (1.0 + costs.optimizer_state_factor))
            .sum();
        let start = reach[first];
        let first_input = grad[last];
        let room = (peak - fixed).max(0.0);
        let forwards = forward_capacity(&stages, costs, m as f64, room);
        let forwards_before = forwards.min(first_input - start);
        out.push(RankFillBound {
            rank: r,
            work,
            start,
            first_input,
            forwards_before,
            bound: work + first_input - forwards_before,
        });
    }
    Some(out)
}

/// The most forward time a rank with `stages` (in chain order) can run holding at most
/// `room` stash bytes and `m` micro-batches, as a linear program (an upper bound on whole
/// forwards): a later stage of the rank runs a micro-batch's forward only after the earlier
/// one did (its input comes through it), so the counts fall along the chain, `n₁ ≥ n₂ ≥ …`.
/// With `dⱼ = nⱼ − nⱼ₊₁` the forwards are bundles `j` (one more forward on each of the first
/// `j` stages) under two constraints, bytes and micro-batches: an optimum uses at most two
/// bundles, so every single bundle and every pair is tried.
fn forward_capacity(stages: &[usize], costs: &CostTable, m: f64, room: f64) -> f64 {
    let mut bundles = vec![];
    let (mut f, mut a) = (0.0, 0.0);
    for &s in stages {
        f += costs.stages[s].forward;
        a += costs.stages[s].activation_memory;
        bundles.push((f, a));
    }
    let mut best = 0.0f64;
    for &(f, a) in &bundles {
        let d = if a > 0.0 { (room / a).min(m) } else { m };
        best = best.max(d * f);
    }
    for (i, &(f1, a1)) in bundles.iter().enumerate() {
        for &(f2, a2) in &bundles[i + 1..] {
            // d₁ + d₂ = m and d₁·a₁ + d₂·a₂ = room.
            if (a1 - a2).abs() < f64::EPSILON * a1.abs().max(a2.abs()).max(1.0) {
                continue;
            }
            let d2 = (room - m * a1) / (a2 - a1);
            let d1 = m - d2;
            if d1 >= 0.0 && d2 >= 0.0 {
                best = best.max(d1 * f1 + d2 * f2);
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{insert_communication, one_f_one_b, zb_v};
    use crate::simulate::simulate;

    fn largest(b: &[RankFillBound]) -> f64 {
        b.iter().map(|x| x.bound).fold(0.0, f64::max)
    }

    /// Unit costs, one unit of stash per chunk activation: on the V with `2p` activations
    /// the bound is ZB-V's `6m + p − 1` (ZB-V is optimal there); on a chain with `p`, it is
    /// `3m + p − 1` (rank `p−1` starts `p−1` late), below 1F1B's `3m + 3(p−1)`.
    #[test]
    fn fill_bound_at_unit_costs() {
        for (p, m) in [(2, 4), (4, 8), (4, 16), (8, 32)] {
            let c = CostTable::uniform(2 * p, 1.0, 1.0, 1.0, 0.0);
            let b = fill_bound(&Layout::VShape { ranks: p }, &c, m, 2.0 * p as f64).unwrap();
            assert_eq!(largest(&b), (6 * m + p - 1) as f64);
            let zbv = simulate(&insert_communication(&zb_v(p, m)), &c).unwrap();
            assert_eq!(zbv.makespan, largest(&b));
            let c = CostTable::uniform(p, 1.0, 1.0, 1.0, 0.0);
            let b = fill_bound(&Layout::chain(p), &c, m, p as f64).unwrap();
            assert_eq!(largest(&b), (3 * m + p - 1) as f64);
            let f = simulate(&insert_communication(&one_f_one_b(p, m)), &c).unwrap();
            assert!(f.makespan >= largest(&b));
        }
    }

    /// With less stash than the first input gradient's round trip needs, the bound grows
    /// by the forward time that does not fit; no simulated schedule beats it.
    #[test]
    fn fill_bound_holds_for_unequal_costs_and_tight_memory() {
        let (p, m) = (8, 32);
        let mut c = CostTable::uniform(2 * p, 1.0, 1.7, 0.7, 0.05);
        for (s, st) in c.stages.iter_mut().enumerate() {
            st.forward *= 1.0 + 0.1 * (s % 3) as f64;
            st.activation_memory = 1.0 + 0.5 * (s % 2) as f64;
        }
        let layout = Layout::VShape { ranks: p };
        let zbv = simulate(&insert_communication(&zb_v(p, m)), &c).unwrap();
        let peak = zbv.peak_memory.iter().copied().fold(0.0, f64::max);
        let b = fill_bound(&layout, &c, m, peak).unwrap();
        assert!(zbv.makespan >= largest(&b) - 1e-9);
        let tight = fill_bound(&layout, &c, m, peak / 2.0).unwrap();
        assert!(largest(&tight) > largest(&b));
        // The plain bound M·Σ/P is below both.
        let total: f64 = c
            .stages
            .iter()
            .map(|s| s.forward + s.backward_input + s.backward_weight)
            .sum();
        assert!(m as f64 * total / p as f64 <= largest(&b));
        // A DAG: only when it is a chain.
        let dag = |edges: Vec<(usize, usize)>| Layout::Dag {
            ranks: 3,
            rank_of: vec![0, 1, 2],
            edges,
        };
        let c3 = CostTable::uniform(3, 1.0, 1.0, 1.0, 0.0);
        assert_eq!(
            fill_bound(&dag(vec![(1, 2), (0, 1)]), &c3, 4, 3.0),
            fill_bound(&Layout::chain(3), &c3, 4, 3.0)
        );
        assert!(fill_bound(&dag(vec![(0, 1), (0, 2)]), &c3, 4, 3.0).is_none());
    }
}
