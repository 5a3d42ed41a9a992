//! The order search (`schedule::reorder`): its evaluator against the simulator, and
//! `improve` keeping schedules valid, within memory and never slower.

use ppcc_passes::schedule::reorder::{improve, Orders};
use ppcc_passes::schedule::search::split_and_fill;
use ppcc_passes::schedule::{
    builtin, dag_1f1b, insert_communication, validate, ActionKind, Schedule,
};
use ppcc_passes::simulate::{simulate, CostTable};

/// Uneven costs: every stage's times, stash and weights differ, and each edge's link time.
fn uneven(s: &Schedule, link: f64) -> CostTable {
    let nv = s.num_virtual_stages();
    let mut costs = CostTable::uniform(nv, 1.0, 1.7, 0.6, link);
    for (i, c) in costs.stages.iter_mut().enumerate() {
        let k = (i * 7 % 5) as f64;
        c.forward = 0.9 + 0.05 * k;
        c.backward_input = 1.6 + 0.09 * k;
        c.backward_weight = 0.5 + 0.03 * ((i * 3 % 4) as f64);
        c.activation_memory = 2.0 + 0.5 * ((i * 5 % 3) as f64);
        c.weight_memory = 1.0 + i as f64 * 0.1;
        c.transient_memory = 0.25 * (i % 2) as f64;
    }
    for e in 0..nv.saturating_sub(1) {
        costs
            .edge_comm
            .insert((e, e + 1), link * (1.0 + (e % 3) as f64));
    }
    costs
}

/// The compute actions of `s` per rank, sorted (what a reorder must keep).
fn action_sets(s: &Schedule) -> Vec<Vec<(u8, usize, usize)>> {
    s.per_rank
        .iter()
        .map(|l| {
            let mut v: Vec<_> = l
                .iter()
                .filter(|a| a.kind.is_compute())
                .map(|a| (a.kind as u8, a.stage, a.micro_batch))
                .collect();
            v.sort();
            v
        })
        .collect()
}

fn schedules() -> Vec<(String, Schedule)> {
    let mut out = vec![];
    for &(p, m) in &[(2, 3), (4, 8), (4, 13), (8, 16)] {
        for name in [
            "1f1b",
            "zb-h1",
            "zb-h2",
            "zb-v",
            "dualpipe-v",
            "interleaved-1f1b",
        ] {
            if let Ok(s) = builtin(name, p, m, 2) {
                out.push((format!("{name} p={p} m={m}"), s));
            }
        }
    }
    // A stage DAG with two branches.
    let s = dag_1f1b(4, &[(0, 1), (0, 2), (1, 3), (2, 3)], 6).unwrap();
    out.push(("dag 1f1b".into(), s));
    out
}

#[test]
fn evaluator_matches_the_simulator() {
    for (name, s) in schedules() {
        for link in [0.0, 0.05] {
            let costs = uneven(&s, link);
            let sim = simulate(&insert_communication(&s), &costs).unwrap();
            let mut g = Orders::new(&s, &costs).unwrap();
            let score = g.evaluate().unwrap();
            assert!(
                (score.makespan - sim.makespan).abs() < 1e-9,
                "{name} link {link}: {} against {}",
                score.makespan,
                sim.makespan
            );
            let peak = sim.peak_memory.iter().copied().fold(0.0, f64::max);
            assert!(
                (g.peak() - peak).abs() < 1e-9,
                "{name}: {} against {peak}",
                g.peak()
            );
            assert_eq!(action_sets(&g.schedule()), action_sets(&s), "{name}");
        }
    }
}

#[test]
fn a_deadlocking_order_is_rejected() {
    let s = builtin("1f1b", 2, 2, 1).unwrap();
    let costs = uneven(&s, 0.0);
    let mut g = Orders::new(&s, &costs).unwrap();
    // Rank 0 runs micro-batch 0's backward before its forward.
    let list = &mut g.order[0];
    let (f, b) = (list[0], list.len() - 1);
    list.swap(0, b);
    assert_ne!(list[0], f);
    assert!(g.evaluate().is_none());
}

#[test]
fn improve_keeps_schedules_valid_within_memory_and_never_slower() {
    let mut improved = 0;
    let mut total = 0;
    for (name, s) in schedules() {
        // Backwards split into I then W, as the search's schedules are.
        let costs = uneven(&s, 0.02);
        let Some(split) = split_and_fill(&s, &costs) else {
            continue;
        };
        let before = simulate(&insert_communication(&split), &costs).unwrap();
        let peak = before.peak_memory.iter().copied().fold(0.0, f64::max);
        total += 1;
        let Some((out, (makespan, out_peak))) = improve(&split, &costs, peak, 2000) else {
            continue;
        };
        improved += 1;
        let with_comm = insert_communication(&out);
        validate(&with_comm).unwrap_or_else(|e| panic!("{name}: {e}"));
        let after = simulate(&with_comm, &costs).unwrap();
        assert!((after.makespan - makespan).abs() < 1e-9, "{name}");
        assert!(after.makespan < before.makespan, "{name}");
        // Every rank within the cap, or its own peak before where that was higher.
        for (r, (&a, &b)) in after
            .peak_memory
            .iter()
            .zip(&before.peak_memory)
            .enumerate()
        {
            assert!(a <= peak.max(b) + 1e-9, "{name} rank {r}: {a} > {peak}");
        }
        assert!(out_peak <= peak + 1e-9, "{name}");
        assert_eq!(action_sets(&out), action_sets(&split), "{name}");
    }
    eprintln!("improved {improved} of {total}");
    // Uneven costs leave the built-ins room on most of these.
    assert!(improved * 2 >= total, "improved {improved} of {total}");
}

#[test]
fn improve_shortens_a_schedule_that_waits_needlessly() {
    // ZB-H1 with every W moved to the end of its rank: the iteration ends with a block of
    // W's on each rank while the bubbles before sit empty. The search must move W's into
    // them, within the memory this order already uses.
    let s = builtin("zb-h1", 4, 8, 1).unwrap();
    let costs = CostTable::uniform(4, 1.0, 2.0, 1.0, 0.0);
    let mut late = s.clone();
    for list in &mut late.per_rank {
        let (w, rest): (Vec<_>, Vec<_>) = list
            .iter()
            .partition(|a| a.kind == ActionKind::BackwardWeight);
        *list = rest.into_iter().chain(w).collect();
    }
    validate(&late).unwrap();
    let before = simulate(&insert_communication(&late), &costs).unwrap();
    let peak = before.peak_memory.iter().copied().fold(0.0, f64::max);
    let (out, (makespan, _)) = improve(&late, &costs, peak, 5000).expect("an improvement");
    assert!(
        makespan < before.makespan - 0.5,
        "{makespan} vs {}",
        before.makespan
    );
    validate(&insert_communication(&out)).unwrap();
}
