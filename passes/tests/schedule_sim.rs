//! Schedules and the simulator against closed forms, the validator's messages, the CSV
//! round trip and the trace/SVG writers.

use ppcc_passes::schedule::csv::{from_csv, to_csv};
use ppcc_passes::schedule::{
    builtin, dag_1f1b, insert_communication, interleaved_1f1b, one_f_one_b, validate, zb_h1, zb_h2,
    zb_v, Action, ActionKind, Layout, Schedule, ScheduleError, BUILTIN_NAMES,
};
use ppcc_passes::simulate::{simulate, to_svg, to_trace_json, CostTable, SimReport};

const EPS: f64 = 1e-9;

fn run(s: &Schedule, f: f64, b: f64, w: f64, comm: f64) -> SimReport {
    validate(s).unwrap_or_else(|e| panic!("invalid schedule: {e}"));
    simulate(
        s,
        &CostTable::uniform(s.num_virtual_stages(), f, b, w, comm),
    )
    .unwrap()
}

/// (F, B, W) cost triples: unit and non-unit.
const COSTS: &[(f64, f64, f64)] = &[
    (1.0, 1.0, 1.0),
    (1.0, 2.0, 1.0),
    (2.0, 3.0, 0.5),
    (1.5, 1.0, 1.5),
];
const SHAPES: &[(usize, usize)] = &[
    (1, 1),
    (1, 4),
    (2, 2),
    (2, 5),
    (4, 4),
    (4, 8),
    (4, 13),
    (8, 16),
];

#[test]
fn gpipe_and_1f1b_makespan_is_m_plus_p_minus_1_times_f_b_w() {
    for &(p, m) in SHAPES {
        for &(f, b, w) in COSTS {
            let want = (m + p - 1) as f64 * (f + b + w);
            for name in ["gpipe", "1f1b"] {
                let r = run(&builtin(name, p, m, 1).unwrap(), f, b, w, 0.0);
                assert!(
                    (r.makespan - want).abs() < EPS,
                    "{name} p={p} m={m} F={f} B={b} W={w}: {} != {want}",
                    r.makespan
                );
                let busy = m as f64 * (f + b + w);
                let bubble = 1.0 - busy / r.makespan;
                assert!((r.bubble_fraction - bubble).abs() < EPS);
            }
        }
    }
}

#[test]
fn one_f_one_b_peak_stash_is_min_p_minus_r_m() {
    for &(p, m) in SHAPES {
        let r = run(&one_f_one_b(p, m), 1.0, 1.0, 1.0, 0.0);
        let want: Vec<usize> = (0..p).map(|r| (p - r).min(m)).collect();
        assert_eq!(r.peak_stash, want, "p={p} m={m}");
    }
    // GPipe stashes every micro-batch.
    let r = run(&builtin("gpipe", 4, 6, 1).unwrap(), 1.0, 1.0, 1.0, 0.0);
    assert_eq!(r.peak_stash, vec![6; 4]);
}

#[test]
fn zb_h1_makespan() {
    // Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024), Table 2: ZB-H1's bubble is
    // (p−1)(T_F + T_B − T_W), so the makespan is m(F+B+W) + (p−1)(F+B−W). That holds when
    // T_W ≤ T_F (else rank 0, which has only p forwards to run before its first B arrives,
    // idles (p−1)B) and T_W ≤ T_B (else the last rank, idle (p−1)F before its first
    // forward, ends later); we test the costs where it holds.
    for &(p, m) in SHAPES {
        if m < p {
            continue;
        }
        for &(f, b, w) in COSTS.iter().filter(|c| c.2 <= c.0 && c.2 <= c.1) {
            let r = run(&zb_h1(p, m), f, b, w, 0.0);
            let want = m as f64 * (f + b + w) + (p - 1) as f64 * (f + b - w);
            assert!(
                (r.makespan - want).abs() < EPS,
                "zb-h1 p={p} m={m} F={f} B={b} W={w}: {} != {want}",
                r.makespan
            );
            assert!(r.peak_stash.iter().all(|&n| n <= p), "{:?}", r.peak_stash);
        }
    }
}

/// Idle time of each rank between its first action's start and its last action's end.
fn inner_bubble(r: &SimReport) -> Vec<f64> {
    r.events
        .iter()
        .zip(&r.busy)
        .map(|(l, busy)| l.last().unwrap().end - l[0].start - busy)
        .collect()
}

#[test]
fn zb_h2_bubble() {
    // Same paper, Table 2: ZB-H2's bubble is (p−1)(T_F + T_B − 2T_W), zero when
    // T_F = T_B = T_W, given enough micro-batches (m ≥ 2p−1 fills the warm-up). The paper
    // drops the optimizer's synchronisation (§4, post-validation), so ranks start and end
    // at different times (the parallelogram of its Figure 3); the bubble is each rank's idle
    // time between its first and its last action, and the makespan m(F+B+W) + (p−1)F.
    for &(p, m) in SHAPES {
        if m < 2 * p - 1 {
            continue;
        }
        for &(f, b, w) in COSTS {
            let r = run(&zb_h2(p, m), f, b, w, 0.0);
            // Rank 0 carries the largest bubble; W > (F+B)/2 leaves none.
            let want = ((p - 1) as f64 * (f + b - 2.0 * w)).max(0.0);
            let got = inner_bubble(&r);
            assert!(
                (got[0] - want).abs() < EPS && got.iter().all(|&g| g <= want + EPS),
                "zb-h2 p={p} m={m} F={f} B={b} W={w}: {got:?}, want {want} on rank 0"
            );
        }
        let r = run(&zb_h2(p, m), 1.0, 1.0, 1.0, 0.0);
        assert!(
            inner_bubble(&r).iter().all(|b| b.abs() < EPS),
            "p={p} m={m}: {:?}",
            inner_bubble(&r)
        );
        assert!((r.makespan - (3 * m + p - 1) as f64).abs() < EPS);
        assert_eq!(r.peak_stash, vec![2 * p - 1; p]);
    }
}

#[test]
fn interleaved_bubble_is_divided_by_v() {
    for &(p, m, v) in &[
        (2, 4, 2),
        (4, 8, 2),
        (4, 8, 4),
        (4, 12, 3),
        (2, 6, 3),
        (8, 16, 2),
        (4, 4, 2),
    ] {
        for &(f, b, w) in COSTS {
            // The model's per-micro-batch work on a rank is F+B+W; each of v chunks does 1/v.
            let vf = v as f64;
            let s = interleaved_1f1b(p, m, v).unwrap();
            let r = run(&s, f / vf, b / vf, w / vf, 0.0);
            let want = m as f64 * (f + b + w) + (p - 1) as f64 * (f + b + w) / vf;
            assert!(
                (r.makespan - want).abs() < 1e-6,
                "interleaved p={p} m={m} v={v} F={f} B={b} W={w}: {} != {want}",
                r.makespan
            );
        }
    }
    assert!(interleaved_1f1b(4, 6, 2)
        .unwrap_err()
        .to_string()
        .contains("multiple of the number of stages (4)"));
}

#[test]
fn zb_v_is_valid_and_beats_1f1b() {
    for &(p, m) in &[(2, 4), (4, 8), (4, 12), (8, 16)] {
        let s = zb_v(p, m);
        assert_eq!(s.num_chunks, 2);
        let r = run(&s, 0.5, 0.5, 0.5, 0.0);
        let base = run(&one_f_one_b(p, m), 1.0, 1.0, 1.0, 0.0);
        assert!(
            r.makespan < base.makespan,
            "p={p} m={m}: {} vs {}",
            r.makespan,
            base.makespan
        );
    }
}

/// Per rank and kind, the (stage, micro-batch) pairs of `s`, sorted (the actions a rank
/// runs, whatever their order).
fn action_sets(s: &Schedule) -> Vec<Vec<(ActionKind, usize, usize)>> {
    s.per_rank
        .iter()
        .map(|l| {
            let mut v: Vec<_> = l.iter().map(|a| (a.kind, a.stage, a.micro_batch)).collect();
            v.sort_by_key(|&(k, st, mb)| (k.code(), st, mb));
            v
        })
        .collect()
}

/// ZB-V's closed-form properties (Qi et al.): every dependency respected (the validator),
/// at most 2p chunk activations per rank (1F1B's first rank keeps p stage activations,
/// each two chunks), and with F = I = W and no link time, for M ≥ 2p, a makespan of
/// exactly 6M + p − 1: rank r idles r units before its first forward and p − 1 − r after
/// its last input gradient, nothing in between.
#[test]
fn zb_v_closed_form_properties() {
    for p in 1..=8usize {
        for m in [1, 2, p, 2 * p, 2 * p + 1, 3 * p + 1, 8 * p] {
            let s = zb_v(p, m);
            let r = run(&s, 1.0, 1.0, 1.0, 0.0);
            assert!(
                r.peak_stash.iter().all(|&n| n <= 2 * p),
                "p={p} m={m}: peak stash {:?} over 2p",
                r.peak_stash
            );
            let work = 6.0 * m as f64;
            if m >= 2 * p {
                let want = work + p as f64 - 1.0;
                assert!(
                    (r.makespan - want).abs() < EPS,
                    "p={p} m={m}: makespan {} != 6m + p - 1 = {want}",
                    r.makespan
                );
                assert_eq!(r.peak_stash, vec![2 * p; p], "p={p} m={m}");
                // Every rank is busy from its first forward to its last action but one
                // stretch: rank r starts at r.
                for (rank, events) in r.events.iter().enumerate() {
                    assert!((events[0].start - rank as f64).abs() < EPS);
                }
            } else {
                assert!(r.makespan <= work + 4.0 * p as f64 + 2.0 + EPS);
            }
        }
        let m = 64 * p;
        let r = run(&zb_v(p, m), 1.0, 1.0, 1.0, 0.0);
        assert!(
            r.bubble_fraction < 0.02,
            "p={p} m={m}: bubble {}",
            r.bubble_fraction
        );
    }
}

/// DualPipeV's closed-form properties: valid, the same actions as ZB-V (every rank runs F,
/// I and W of both its chunks for every micro-batch), with F = I = W and no link time a
/// makespan of exactly 6M + p − 1 for M ≥ 2p, and 2p + 1 chunk activations per rank — one
/// more than ZB-V, the forward that overlaps a backward in the steady state.
#[test]
fn dualpipe_v_closed_form_properties() {
    use ppcc_passes::schedule::dualpipe_v;
    for p in 1..=8usize {
        for m in [1, 2, p, 2 * p - 1, 2 * p, 2 * p + 3, 5 * p] {
            let s = dualpipe_v(p, m);
            assert_eq!(s.layout, Layout::VShape { ranks: p });
            assert_eq!(action_sets(&s), action_sets(&zb_v(p, m)), "p={p} m={m}");
            let r = run(&s, 1.0, 1.0, 1.0, 0.0);
            if m >= 2 * p {
                let want = 6.0 * m as f64 + p as f64 - 1.0;
                assert!(
                    (r.makespan - want).abs() < EPS,
                    "p={p} m={m}: makespan {} != {want}",
                    r.makespan
                );
                assert_eq!(r.peak_stash, vec![2 * p + 1; p], "p={p} m={m}");
            } else {
                assert!(r.peak_stash.iter().all(|&n| n <= 2 * p + 1));
            }
            // The steady state alternates overlapped pairs: a forward of one chunk right
            // before a backward of the other chunk, of different micro-batches.
            if m >= 2 * p + 3 {
                let list = &s.per_rank[0];
                let pairs = list
                    .windows(2)
                    .filter(|w| {
                        w[0].kind == ActionKind::Forward
                            && w[1].kind == ActionKind::BackwardInput
                            && w[0].chunk != w[1].chunk
                            && w[0].micro_batch != w[1].micro_batch
                    })
                    .count();
                assert!(pairs >= 2 * (m - 2 * p + 1), "p={p} m={m}: {pairs} pairs");
            }
        }
    }
}

/// With real costs ZB-V's weight gradients fill what the order leaves idle: never slower
/// than the unit-cost order, never above 2p chunk activations.
#[test]
fn zb_v_for_fills_idle_time_with_weight_gradients() {
    use ppcc_passes::schedule::{fill_weight_gradients, zb_v_for};
    for &(p, m) in &[(2, 4), (4, 8), (4, 16), (8, 32)] {
        for &(f, b, w, c) in &[
            (1.0, 1.7, 0.7, 0.05),
            (1.0, 2.0, 1.0, 0.0),
            (2.0, 3.0, 0.5, 0.1),
        ] {
            let costs = CostTable::uniform(2 * p, f, b, w, c);
            let base = simulate(&zb_v(p, m), &costs).unwrap();
            let s = zb_v_for(p, m, &vec![[f, b, w]; 2 * p], c);
            validate(&s).unwrap();
            let r = simulate(&s, &costs).unwrap();
            assert!(r.makespan <= base.makespan + EPS);
            assert!(r.peak_stash.iter().all(|&n| n <= 2 * p));
            assert_eq!(action_sets(&s), action_sets(&zb_v(p, m)));
            // The filled order keeps every rank's forwards and input gradients in place.
            let filled = fill_weight_gradients(&zb_v(p, m), &costs, 2 * p).unwrap();
            for (a, b) in filled.per_rank.iter().zip(&zb_v(p, m).per_rank) {
                let keep = |l: &Vec<Action>| -> Vec<Action> {
                    l.iter()
                        .filter(|x| x.kind != ActionKind::BackwardWeight)
                        .copied()
                        .collect()
                };
                assert_eq!(keep(a), keep(b));
            }
        }
    }
}

/// With measured costs (here the ratios of a GPT block on an H100: I ≈ 1.7 F, W ≈ 0.7 F,
/// a small link time), the cost-aware order keeps the bubble small and memory at 1F1B's.
#[test]
fn zb_v_for_costs_keeps_the_bubble_small() {
    use ppcc_passes::schedule::zb_v_for;
    for &(p, m) in &[(4, 16), (8, 32), (16, 64)] {
        for &(f, b, w, c) in &[
            (446.0, 770.0, 298.0, 15.0),
            (1.0, 2.0, 1.0, 0.0),
            (2.0, 3.0, 0.5, 0.1),
            (1.5, 1.0, 1.5, 0.0),
        ] {
            let s = zb_v_for(p, m, &vec![[f, b, w]; 2 * p], c);
            validate(&s).unwrap_or_else(|e| panic!("p={p} m={m}: {e}"));
            let r = simulate(&s, &CostTable::uniform(2 * p, f, b, w, c)).unwrap();
            assert!(
                r.peak_stash.iter().all(|&n| n <= 2 * p),
                "{:?}",
                r.peak_stash
            );
            let one = simulate(
                &one_f_one_b(p, m),
                &CostTable::uniform(p, 2.0 * f, 2.0 * b, 2.0 * w, c),
            )
            .unwrap();
            // A W much shorter than F has little to fill bubbles with; compare where it can.
            assert!(
                2.0 * w < f || r.makespan < one.makespan,
                "p={p} m={m} F={f} B={b} W={w}: zb-v {} vs 1f1b {}",
                r.makespan,
                one.makespan
            );
            let work = m as f64 * 2.0 * (f + b + w);
            eprintln!(
                "zb-v p={p} m={m} F={f} I={b} W={w} c={c}: {:.3} of the bound, 1f1b {:.3}",
                work / r.makespan,
                work / one.makespan
            );
        }
    }
}

/// The cost-aware ZB-V builder at F = I = W and no link time is the construction's
/// closed form again (6m + p − 1, 2p chunk activations), and at any size and cost it
/// builds a valid schedule of ZB-V's actions within its cap.
#[test]
fn zb_v_greedy_closed_form_and_validity() {
    use ppcc_passes::schedule::{even_costs, zb_v_greedy};
    for p in 1..=8usize {
        for m in [1, 2, p, 2 * p, 2 * p + 1, 3 * p + 1, 8 * p] {
            for (fill_b, fill_f) in [(true, true), (false, false), (true, false)] {
                let unit = CostTable::uniform(2 * p, 1.0, 1.0, 1.0, 0.0);
                let s = zb_v_greedy(p, m, &unit, 2 * p, fill_b, fill_f)
                    .unwrap_or_else(|| panic!("p={p} m={m}: stuck at unit costs"));
                assert_eq!(action_sets(&s), action_sets(&zb_v(p, m)), "p={p} m={m}");
                let r = run(&s, 1.0, 1.0, 1.0, 0.0);
                assert!(r.peak_stash.iter().all(|&n| n <= 2 * p), "p={p} m={m}");
                if m >= 2 * p {
                    let want = 6.0 * m as f64 + p as f64 - 1.0;
                    assert!(
                        (r.makespan - want).abs() < EPS,
                        "p={p} m={m}: makespan {} != 6m + p - 1 = {want}",
                        r.makespan
                    );
                }
                for &(f, b, w) in COSTS {
                    for cap in [2 * p, 2 * p + 3] {
                        let costs = CostTable::uniform(2 * p, f, b, w, 0.05);
                        let s = zb_v_greedy(p, m, &even_costs(&costs), cap, fill_b, fill_f)
                            .unwrap_or_else(|| panic!("p={p} m={m} {f} {b} {w}: stuck"));
                        validate(&insert_communication(&s))
                            .unwrap_or_else(|e| panic!("p={p} m={m}: {e}"));
                        let r = simulate(&s, &costs).unwrap();
                        assert!(r.peak_stash.iter().all(|&n| n <= cap), "p={p} m={m}");
                        assert_eq!(action_sets(&s), action_sets(&zb_v(p, m)));
                    }
                }
            }
        }
    }
}

/// At uneven per-stage costs (a pseudo-random spread of ±30% around a transformer block's
/// ratios) the measured ZB-V is valid, within 2p chunk activations, and never slower than
/// the construction with its weight gradients filled in.
#[test]
fn zb_v_measured_never_loses_to_the_construction() {
    use ppcc_passes::schedule::{fill_weight_gradients, zb_v_measured};
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        0.7 + 0.6 * (seed % 10_000) as f64 / 10_000.0
    };
    for &(p, m) in &[(2, 3), (4, 8), (4, 13), (8, 16), (8, 40), (16, 64)] {
        let mut costs = CostTable::uniform(2 * p, 1.0, 1.0, 1.0, 0.01);
        for c in &mut costs.stages {
            c.forward = 0.43 * next();
            c.backward_input = 0.75 * next();
            c.backward_weight = 0.28 * next();
        }
        let s = zb_v_measured(p, m, &costs, 2 * p);
        validate(&insert_communication(&s)).unwrap_or_else(|e| panic!("p={p} m={m}: {e}"));
        assert_eq!(action_sets(&s), action_sets(&zb_v(p, m)));
        let r = simulate(&s, &costs).unwrap();
        let base = zb_v(p, m);
        let plain = simulate(&base, &costs).unwrap();
        // No more bytes than the construction or its filled form on any rank; with equal
        // activations that is no more chunk activations than the construction's largest
        // count (fewer than 2p when m < 2p).
        let filled = fill_weight_gradients(&base, &costs, 2 * p).unwrap_or(base.clone());
        let filled_r = simulate(&filled, &costs).unwrap();
        let chosen_filled = r.events == filled_r.events;
        let most = plain.peak_stash.iter().copied().max().unwrap_or(0);
        for (rank, &n) in r.peak_stash.iter().enumerate() {
            assert!(
                n <= most || chosen_filled,
                "p={p} m={m} rank {rank}: {n} > {most}"
            );
        }
        let peak = |r: &SimReport| r.peak_memory.iter().copied().fold(0.0, f64::max);
        assert!(peak(&r) <= peak(&plain).max(peak(&filled_r)) * (1.0 + 1e-9));
        let floor = plain.makespan.min(filled_r.makespan);
        assert!(
            r.makespan <= floor + EPS,
            "p={p} m={m}: {} > {floor}",
            r.makespan
        );
    }
}

#[test]
fn comm_time_delays_cross_rank_edges() {
    let s = one_f_one_b(4, 8);
    let r = run(&s, 1.0, 1.0, 1.0, 0.5);
    // The first forward reaches the last rank after 3 links, the last backward comes back.
    assert!(r.makespan >= 11.0 * 3.0 + 6.0 * 0.5 - EPS);
    let with_comm = insert_communication(&s);
    validate(&with_comm).unwrap();
    let r2 = simulate(&with_comm, &CostTable::uniform(4, 1.0, 1.0, 1.0, 0.5)).unwrap();
    assert!((r.makespan - r2.makespan).abs() < EPS);
    assert_eq!(r.busy, r2.busy);
    // Rank 0 sends activations and receives gradients; the last rank the other way round.
    let k0: Vec<ActionKind> = with_comm.per_rank[0].iter().map(|a| a.kind).collect();
    assert_eq!(&k0[..2], &[ActionKind::Forward, ActionKind::SendF]);
    assert!(k0.contains(&ActionKind::RecvB) && !k0.contains(&ActionKind::RecvF));
    assert_eq!(with_comm.per_rank[3][0].kind, ActionKind::RecvF);
}

#[test]
fn edge_comm_prices_each_edge() {
    // Two stages, 1F1B, one micro-batch: the activation and its gradient each cross the
    // edge once.
    let s = one_f_one_b(2, 1);
    let base = run(&s, 1.0, 1.0, 1.0, 0.0);
    let mut costs = CostTable::uniform(2, 1.0, 1.0, 1.0, 0.0);
    costs.edge_comm.insert((0, 1), 5.0);
    assert_eq!(costs.comm_between(0, 1), 5.0);
    assert_eq!(costs.comm_between(1, 0), 5.0);
    assert_eq!(costs.comm_between(1, 2), 0.0);
    let r = simulate(&s, &costs).unwrap();
    assert!(
        (r.makespan - (base.makespan + 2.0 * 5.0)).abs() < EPS,
        "{} vs {}",
        r.makespan,
        base.makespan
    );
    // With sends and receives the link time is on the same edges.
    let r2 = simulate(&insert_communication(&s), &costs).unwrap();
    assert!((r2.makespan - r.makespan).abs() < EPS);
    // A DAG where only the slow branch pays: 0 → {1, 2} → 3, edge (0, 2) costs 3 and the
    // rest the default 0.5; same-rank dependencies never pay.
    let s = dag_1f1b(4, &[(0, 1), (0, 2), (1, 3), (2, 3)], 1).unwrap();
    let mut costs = CostTable::uniform(4, 1.0, 1.0, 1.0, 0.5);
    costs.edge_comm.insert((0, 2), 3.0);
    let r = simulate(&s, &costs).unwrap();
    // F: 0 [0,1], 2 [4,5], 3 [5.5,6.5]; B: 3 [6.5,8.5], 2 [9,11], 0 [14,16].
    assert!((r.makespan - 16.0).abs() < EPS, "{}", r.makespan);
}

#[test]
fn dag_1f1b_on_two_branches() {
    // 0 → {1, 2} → 3: two parallel branches.
    let s = dag_1f1b(4, &[(0, 1), (0, 2), (1, 3), (2, 3)], 6).unwrap();
    let r = run(&s, 1.0, 1.0, 1.0, 0.0);
    // Depth 3 DAG: like a 3-stage chain, (m + 3 − 1)·3.
    assert!((r.makespan - 24.0).abs() < EPS, "{}", r.makespan);
    assert_eq!(r.peak_stash, vec![3, 2, 2, 1]);
    let s = insert_communication(&s);
    validate(&s).unwrap();
    // Uneven branches and a skip edge.
    let s = dag_1f1b(5, &[(0, 1), (1, 2), (2, 4), (0, 3), (3, 4), (0, 4)], 5).unwrap();
    run(&s, 1.0, 2.0, 0.5, 0.1);
    assert!(dag_1f1b(2, &[(0, 1), (1, 0)], 2)
        .unwrap_err()
        .to_string()
        .contains("cycle"));
}

fn layout_of(s: &Schedule) -> Layout {
    s.layout.clone()
}

#[test]
fn csv_round_trip_for_every_builtin() {
    for &name in BUILTIN_NAMES {
        for &(p, m, v) in &[(2, 4, 2), (4, 8, 2), (3, 6, 1), (1, 3, 1)] {
            let s = builtin(name, p, m, v).unwrap();
            validate(&s).unwrap_or_else(|e| panic!("{name} p={p} m={m} v={v}: {e}"));
            let text = to_csv(&s);
            let back = from_csv(&text, layout_of(&s)).unwrap();
            assert_eq!(back, s, "{name} p={p} m={m}");
            let with_comm = insert_communication(&s);
            let back = from_csv(&to_csv(&with_comm), layout_of(&s)).unwrap();
            assert_eq!(back, with_comm, "{name} with communication");
        }
    }
    // Idle slots (empty cells) are allowed.
    let s = from_csv("0F0,,0B0\n,1F0,1B0\n", Layout::chain(2)).unwrap();
    assert_eq!(s.per_rank[1].len(), 2);
    assert_eq!(s.num_microbatches, 1);
}

#[test]
fn csv_rejects_bad_cells_and_dependency_errors() {
    let e = from_csv("0F0,0X0\n1F0,1B0\n", Layout::chain(2)).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("row 1, column 2 (cell `0X0`): unknown action `X0`"),
        "{e}"
    );
    let e = from_csv("0F0,F\n1F0,1B0\n", Layout::chain(2)).unwrap_err();
    assert!(
        e.to_string().starts_with("row 1, column 2 (cell `F`)"),
        "{e}"
    );
    let e = from_csv("0F0,0B\n1F0,1B0\n", Layout::chain(2)).unwrap_err();
    assert!(
        e.to_string().contains("expected a micro-batch number"),
        "{e}"
    );
    // Stage 1's backward before its forward, on the same rank.
    let e = from_csv("0F0,0B0\n1B0,1F0\n", Layout::chain(2)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "row 2, column 1 (cell `1B0`): 1B0 (backward of micro-batch 0 on stage 1) runs before 1F0 on which it depends"
    );
    // Wrong rank for a stage.
    let e = from_csv("0F0,1F0\n0B0,1B0\n", Layout::chain(2)).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("row 1, column 2 (cell `1F0`): stage 1 runs on rank 1"),
        "{e}"
    );
    // Cross-rank deadlock: rank 0 waits for 1B0 before running 0F1, rank 1 waits for 0F1
    // before running 1B0.
    let e = from_csv("0F0,0B0,0F1,0B1\n1F0,1F1,1B0,1B1\n", Layout::chain(2)).unwrap_err();
    assert!(
        e.to_string().starts_with("row 1, column 2 (cell `0B0`): deadlock: rank 0, position 1: 0B0 (backward of micro-batch 0 on stage 0) waits for 1B0; rank 1, position 1: 1F1 (forward of micro-batch 1 on stage 1) waits for 0F1"),
        "{e}"
    );
}

#[test]
fn validator_names_the_first_offending_action() {
    // Missing action.
    let mut s = one_f_one_b(3, 4);
    s.per_rank[1].retain(|a| !(a.kind == ActionKind::FullBackward && a.micro_batch == 2));
    assert_eq!(
        validate(&s).unwrap_err().to_string(),
        "rank 1: missing 1I2 or 1B2 (backward of micro-batch 2 on stage 1)"
    );
    // Wrong order on one rank (ZB-V: stages 1 and 2 share rank 1).
    let mut s = zb_v(2, 2);
    let list = &mut s.per_rank[1];
    let i = list
        .iter()
        .position(|a| *a == Action::new(ActionKind::BackwardInput, 2, 0, 1))
        .unwrap();
    let j = list
        .iter()
        .position(|a| *a == Action::new(ActionKind::BackwardInput, 1, 0, 0))
        .unwrap();
    list.swap(i, j);
    let e = validate(&s).unwrap_err();
    assert!(matches!(e, ScheduleError::Action { rank: 1, .. }), "{e}");
    assert!(
        e.to_string().ends_with("1I0 (input-gradient backward of micro-batch 0 on stage 1) runs before 2I0 on which it depends"),
        "{e}"
    );
    // Crossed order over ranks: a deadlock (interleaved: stages 1 and 3 share rank 1).
    let mut s = interleaved_1f1b(2, 4, 2).unwrap();
    let list = &mut s.per_rank[1];
    let i = list
        .iter()
        .position(|a| *a == Action::new(ActionKind::FullBackward, 3, 0, 1))
        .unwrap();
    let j = list
        .iter()
        .position(|a| *a == Action::new(ActionKind::FullBackward, 1, 0, 0))
        .unwrap();
    list.swap(i, j);
    let e = validate(&s).unwrap_err();
    assert!(matches!(e, ScheduleError::Deadlock(_)), "{e}");
    assert!(
        e.to_string().contains(
            "rank 1, position 3: 1B0 (backward of micro-batch 0 on stage 1) waits for 2B0"
        ),
        "{e}"
    );
    // Duplicate action.
    let mut s = one_f_one_b(2, 2);
    let a = s.per_rank[0][0];
    s.per_rank[0].push(a);
    assert!(validate(&s)
        .unwrap_err()
        .to_string()
        .contains("repeats the action at rank 0, position 0"));
    // Deadlock across ranks (1F1B's rank 1 does all backwards first).
    let mut s = one_f_one_b(2, 3);
    s.per_rank[0].sort_by_key(|a| (a.kind != ActionKind::FullBackward, a.micro_batch));
    let e = validate(&s).unwrap_err();
    assert!(e.to_string().starts_with("rank 0, position 0: 0B0"), "{e}");
}

#[test]
fn trace_and_svg() {
    let s = zb_h1(3, 4);
    let r = run(&s, 1.0, 1.0, 1.0, 0.0);
    let json: serde_json::Value = serde_json::from_str(&to_trace_json(&r)).unwrap();
    let events = json["traceEvents"].as_array().unwrap();
    let x: Vec<_> = events.iter().filter(|e| e["ph"] == "X").collect();
    assert_eq!(x.len(), 3 * 4 * 3);
    assert!(x
        .iter()
        .any(|e| e["name"] == "F3 s1" && e["tid"] == 1 && e["pid"] == 0));
    let svg = to_svg(&r);
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains("W weight grad") && svg.contains("rank 2"));
    // The critical path ends at the makespan and chains back to time 0.
    let cp = &r.critical_path;
    assert_eq!(cp.first().unwrap().start, 0.0);
    assert!((cp.last().unwrap().end - r.makespan).abs() < EPS);
}

/// A schedule that could never fit in memory is refused before it is built (it used to
/// abort allocating), on a chain and on a layout.
#[test]
fn schedules_too_large_for_memory_are_refused() {
    for e in [
        builtin("1f1b", 100_000, 100_000, 1).unwrap_err(),
        builtin("interleaved-1f1b", 1 << 20, 1 << 20, 4).unwrap_err(),
        ppcc_passes::schedule::builtin_on("gpipe", &Layout::chain(100_000), 100_000, 1)
            .unwrap_err(),
    ] {
        assert!(e.to_string().contains("is too large"), "{e}");
    }
    assert!(builtin("1f1b", 4, 8, 1).is_ok());
}

/// Ranks held to bytes instead of a count: at uneven activation sizes (chunk-0 stages
/// stash twice what chunk-1 stages do, plus a spread) every rank stays within its own
/// allowance, the schedule is valid and has ZB-V's actions; at equal sizes it is the
/// count-capped build.
#[test]
fn zb_v_greedy_by_bytes_stays_within_each_rank_allowance() {
    use ppcc_passes::schedule::v_greedy::zb_v_greedy_bytes;
    use ppcc_passes::schedule::{even_costs, zb_v_greedy};
    for &(p, m) in &[(2, 5), (4, 8), (4, 16), (8, 32), (16, 64)] {
        let mut costs = CostTable::uniform(2 * p, 0.43, 0.75, 0.28, 0.01);
        let act: Vec<f64> = (0..2 * p)
            .map(|s| {
                if s < p {
                    2.0 + (s % 3) as f64 * 0.25
                } else {
                    1.0
                }
            })
            .collect();
        for (c, &a) in costs.stages.iter_mut().zip(&act) {
            c.activation_memory = a;
        }
        let even = even_costs(&costs);
        let counts = vec![2 * m; p];
        let mut built = 0;
        // What the construction stashes at most, and a quarter more.
        let most = simulate(&zb_v(p, m), &costs)
            .unwrap()
            .peak_stash_bytes
            .into_iter()
            .fold(0.0, f64::max);
        for budget in [most, 1.25 * most] {
            let allowance = vec![budget; p];
            for (fill_b, fill_f) in [(true, true), (false, false)] {
                let Some(s) = zb_v_greedy_bytes(
                    p,
                    m,
                    &even,
                    &counts,
                    Some((&act, &allowance)),
                    fill_b,
                    fill_f,
                ) else {
                    continue;
                };
                validate(&insert_communication(&s)).unwrap_or_else(|e| panic!("p={p} m={m}: {e}"));
                assert_eq!(action_sets(&s), action_sets(&zb_v(p, m)), "p={p} m={m}");
                let r = simulate(&s, &costs).unwrap();
                for (rank, (&b, &a)) in r.peak_stash_bytes.iter().zip(&allowance).enumerate() {
                    assert!(b <= a + 1e-9, "p={p} m={m} rank {rank}: {b} > {a}");
                }
                built += 1;
            }
        }
        assert!(built >= 2, "p={p} m={m}: only {built} builds completed");
        // Equal sizes: the byte allowance of 2p activations is the count cap of 2p.
        let unit = CostTable::uniform(2 * p, 0.43, 0.75, 0.28, 0.01);
        let ones = vec![1.0; 2 * p];
        let two_p = vec![2.0 * p as f64; p];
        let by_bytes = zb_v_greedy_bytes(
            p,
            m,
            &even_costs(&unit),
            &counts,
            Some((&ones, &two_p)),
            true,
            true,
        );
        let by_count = zb_v_greedy(p, m, &even_costs(&unit), 2 * p, true, true);
        assert_eq!(by_bytes, by_count, "p={p} m={m}");
    }
}

/// Under a memory limit below the construction's peak, the measured ZB-V is built to fit
/// it (each rank's stash held to what the limit leaves it) instead of returning the
/// construction over the limit.
#[test]
fn zb_v_measured_fits_a_limit_below_the_construction() {
    use ppcc_passes::schedule::zb_v_measured_within;
    for &(p, m) in &[(4, 16), (8, 32)] {
        let mut costs = CostTable::uniform(2 * p, 0.43, 0.75, 0.28, 0.01);
        for (s, c) in costs.stages.iter_mut().enumerate() {
            c.activation_memory = if s < p { 2.0 } else { 1.0 };
        }
        let peak = |r: &SimReport| r.peak_memory.iter().copied().fold(0.0, f64::max);
        let construction = peak(&simulate(&zb_v(p, m), &costs).unwrap());
        let limit = construction - 1.5;
        let s = zb_v_measured_within(p, m, &costs, 2 * p, limit);
        validate(&insert_communication(&s)).unwrap_or_else(|e| panic!("p={p} m={m}: {e}"));
        assert_eq!(action_sets(&s), action_sets(&zb_v(p, m)));
        let r = simulate(&s, &costs).unwrap();
        assert!(
            peak(&r) <= limit,
            "p={p} m={m}: peak {} over the limit {limit} (construction {construction})",
            peak(&r)
        );
    }
}

/// The search's runners-up: at most `keep`, all within the limit, fastest first, distinct
/// orders, the first being what `search` chooses; when nothing fits, only the schedule
/// closest to the limit.
#[test]
fn search_ranked_keeps_the_fastest_that_fit() {
    use ppcc_passes::schedule::search::{evaluate, search, search_ranked};
    use ppcc_passes::schedule::Layout;
    let p = 4;
    let m = 12;
    let mut costs = CostTable::uniform(p, 1.0, 1.6, 0.6, 0.02);
    for (s, c) in costs.stages.iter_mut().enumerate() {
        c.forward *= 1.0 + 0.1 * s as f64;
    }
    let layout = Layout::chain(p);
    for limit in [f64::INFINITY, 6.0, 4.0, 1.5] {
        let (ranked, trials) = search_ranked(&layout, m, &costs, limit, 3);
        assert!(!trials.is_empty());
        let (chosen, name, _) = search(&layout, m, &costs, limit).unwrap();
        assert_eq!(
            (&ranked[0].0, &ranked[0].1),
            (&chosen, &name),
            "limit {limit}"
        );
        let runs: Vec<(f64, f64)> = ranked
            .iter()
            .map(|(s, _)| evaluate(s, &costs).unwrap())
            .collect();
        if runs[0].1 <= limit {
            assert!(ranked.len() <= 3);
            assert!(runs.iter().all(|r| r.1 <= limit), "limit {limit}: {runs:?}");
            assert!(
                runs.windows(2).all(|w| w[0].0 <= w[1].0),
                "limit {limit}: {runs:?}"
            );
        } else {
            assert_eq!(ranked.len(), 1, "limit {limit}");
        }
        for (i, a) in ranked.iter().enumerate() {
            assert!(ranked[i + 1..].iter().all(|b| b.0.per_rank != a.0.per_rank));
        }
    }
}

/// Forwards run in the wait for an input gradient (the `fill_fwd` builds among the
/// variants): at a transformer block's costs and a few more chunk activations than 2p, the
/// V's bottom ranks no longer idle until their first input gradient comes back, so the
/// fastest variant beats every build without it; every variant stays valid and within
/// its cap.
#[test]
fn zb_v_variants_fill_the_wait_for_an_input_gradient_with_forwards() {
    use ppcc_passes::schedule::v_greedy::zb_v_greedy_variants;
    use ppcc_passes::schedule::zb_v_greedy;
    for &(p, m) in &[(8, 32), (16, 64)] {
        let costs = CostTable::uniform(2 * p, 0.43, 0.75, 0.27, 0.005);
        let cap = 2 * p + 8;
        let time = |s: &Schedule| simulate(&insert_communication(s), &costs).unwrap();
        let without = [(true, true), (true, false), (false, true), (false, false)]
            .into_iter()
            .filter_map(|(b, f)| zb_v_greedy(p, m, &costs, cap, b, f))
            .map(|s| time(&s).makespan)
            .fold(f64::INFINITY, f64::min);
        let variants = zb_v_greedy_variants(p, m, &costs, &vec![cap; p], None, true);
        let mut fastest = f64::INFINITY;
        for s in &variants {
            validate(&insert_communication(s)).unwrap_or_else(|e| panic!("p={p}: {e}"));
            assert_eq!(action_sets(s), action_sets(&zb_v(p, m)), "p={p}");
            let r = time(s);
            assert!(
                r.peak_stash.iter().all(|&n| n <= cap),
                "p={p}: {:?}",
                r.peak_stash
            );
            fastest = fastest.min(r.makespan);
        }
        eprintln!("p={p} m={m} cap {cap}: {without:.3} without, {fastest:.3} with forwards");
        assert!(fastest < 0.99 * without, "p={p}: {fastest} vs {without}");
    }
}

/// `search_ranked_over` hands over, after the schedules that fit, the fastest that need at
/// most the factor more memory (for the planner to fit by recomputation).
#[test]
fn search_ranked_over_adds_the_fastest_near_the_limit() {
    use ppcc_passes::schedule::search::{evaluate, search_ranked, search_ranked_over};
    use ppcc_passes::schedule::Layout;
    let p = 4;
    let m = 12;
    let costs = CostTable::uniform(p, 1.0, 1.6, 0.6, 0.02);
    let layout = Layout::chain(p);
    // Between 1F1B's peak and GPipe's: the zero-bubble schedules that stash more do not fit.
    let limit = 6.0;
    let (fit, _) = search_ranked(&layout, m, &costs, limit, 3);
    let (all, _) = search_ranked_over(&layout, m, &costs, limit, 3, 2, 1.5);
    assert_eq!(&all[..fit.len()], &fit[..]);
    let over: Vec<(f64, f64)> = all[fit.len()..]
        .iter()
        .map(|(s, _)| evaluate(s, &costs).unwrap())
        .collect();
    assert!(!over.is_empty() && over.len() <= 2, "{over:?}");
    let best_fit = evaluate(&fit[0].0, &costs).unwrap();
    for r in &over {
        assert!(r.1 > limit && r.1 <= 1.5 * limit, "{r:?}");
        assert!(r.0 < best_fit.0, "{r:?} vs {best_fit:?}");
    }
    assert!(over.windows(2).all(|w| w[0].0 <= w[1].0), "{over:?}");
}
