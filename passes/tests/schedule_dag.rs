//! Chain schedules on stage DAGs ([`builtin_on`] over a [`Layout::Dag`] with one stage per
//! rank): on random DAGs they validate, run without deadlock, have the right actions per
//! stage and respect a lower bound; on a chain DAG they are the chain schedules.

use ppcc_passes::schedule::{
    builtin, builtin_on, insert_communication, validate, ActionKind, Layout, Schedule,
};
use ppcc_passes::simulate::{simulate, CostTable, SimReport, StageCosts};

const EPS: f64 = 1e-9;
const DAG_NAMES: &[&str] = &["gpipe", "1f1b", "zb-h1", "zb-h2"];
const MICROBATCHES: &[usize] = &[1, 2, 3, 4, 8];
/// (F, B, W) cost triples: unit and non-unit.
const COSTS: &[(f64, f64, f64)] = &[(1.0, 1.0, 1.0), (1.0, 2.0, 1.0), (2.0, 3.0, 0.5)];

/// SplitMix64: a tiny deterministic generator for the random DAGs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`.
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// A random connected stage DAG on `n` topologically numbered stages (edges go from a lower
/// to a higher number). `single_source`: every stage but 0 has a predecessor; otherwise a
/// random spanning tree oriented by numbering, which may have several sources. Both get
/// extra random edges.
fn random_dag(rng: &mut Rng, n: usize, single_source: bool) -> Vec<(usize, usize)> {
    let mut edges = vec![];
    if single_source {
        for s in 1..n {
            edges.push((rng.below(s), s));
        }
    } else {
        let mut order: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            order.swap(i, rng.below(i + 1));
        }
        for i in 1..n {
            let (a, b) = (order[i], order[rng.below(i)]);
            edges.push((a.min(b), a.max(b)));
        }
    }
    for _ in 0..rng.below(n + 1) {
        let (a, b) = (rng.below(n), rng.below(n));
        if a != b {
            edges.push((a.min(b), a.max(b)));
        }
    }
    edges.sort_unstable();
    edges.dedup();
    edges
}

fn dag(n: usize, edges: Vec<(usize, usize)>) -> Layout {
    Layout::Dag {
        ranks: n,
        rank_of: (0..n).collect(),
        edges,
    }
}

fn is_fused(name: &str) -> bool {
    matches!(name, "gpipe" | "1f1b")
}

/// Random per-stage costs (F, B, W in {0.5, 1, …, 2.5}).
fn random_costs(rng: &mut Rng, n: usize) -> CostTable {
    let mut t = CostTable::uniform(n, 1.0, 1.0, 1.0, 0.0);
    let mut c = || 0.5 * (1 + rng.below(5)) as f64;
    t.stages = (0..n)
        .map(|_| StageCosts {
            forward: c(),
            backward_input: c(),
            backward_weight: c(),
            activation_memory: 1.0,
            weight_memory: 0.0,
            transient_memory: 0.0,
        })
        .collect();
    t
}

/// A lower bound on any schedule's makespan without communication. Stage `s` cannot start
/// before micro-batch 0's forward has run through its ancestors (`A_F(s)`, the longest path
/// of `F` over them), then runs `m(F+B+W)`. With fused backwards its last `B` (and `W`)
/// comes last, and that gradient still has to run back through its ancestors (`A_{B+W}`):
/// `A_F + m(F+B+W) + A_{B+W}`; with split ones only the `B`s must precede the way back:
/// `A_F + m(F+B) + A_B`. With equal stage costs `T = F+B+W`, the fused bound is
/// `(L + m − 1)·T` for `L` stages on the longest path.
fn lower_bound(layout: &Layout, costs: &CostTable, m: usize, fused: bool) -> f64 {
    let n = layout.num_virtual_stages();
    let c = &costs.stages;
    // Longest path over strict ancestors with weight `w` (stages are topologically numbered).
    let ancestors = |w: &dyn Fn(usize) -> f64| {
        let mut a = vec![0.0f64; n];
        for s in 0..n {
            for q in layout.preds(s) {
                a[s] = a[s].max(a[q] + w(q));
            }
        }
        a
    };
    let a_f = ancestors(&|s| c[s].forward);
    let a_b = ancestors(&|s| c[s].backward_input);
    let a_bw = ancestors(&|s| c[s].backward_input + c[s].backward_weight);
    let m = m as f64;
    (0..n)
        .map(|s| {
            let t = c[s].forward + c[s].backward_input + c[s].backward_weight;
            if fused {
                a_f[s] + m * t + a_bw[s]
            } else {
                f64::max(
                    a_f[s] + m * t,
                    a_f[s] + m * (c[s].forward + c[s].backward_input) + a_b[s],
                )
            }
        })
        .fold(0.0, f64::max)
}

/// Every stage runs on its own rank, with `m` forwards and `m` fused backwards (GPipe,
/// 1F1B) or `m` input- and `m` weight-gradient backwards (ZB).
fn check_counts(s: &Schedule, name: &str, m: usize) {
    for (rank, list) in s.per_rank.iter().enumerate() {
        assert!(list.iter().all(|a| a.stage == rank && a.chunk == 0));
        let count = |k: ActionKind| list.iter().filter(|a| a.kind == k).count();
        let (bf, split) = if is_fused(name) { (m, 0) } else { (0, m) };
        assert_eq!(count(ActionKind::Forward), m, "{name} rank {rank}");
        assert_eq!(count(ActionKind::FullBackward), bf, "{name} rank {rank}");
        assert_eq!(
            count(ActionKind::BackwardInput),
            split,
            "{name} rank {rank}"
        );
        assert_eq!(
            count(ActionKind::BackwardWeight),
            split,
            "{name} rank {rank}"
        );
        assert_eq!(list.len(), 2 * m + split, "{name} rank {rank}");
    }
}

fn sim(s: &Schedule, costs: &CostTable) -> SimReport {
    simulate(s, costs).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn dag_schedules_on_random_dags() {
    let mut rng = Rng(0x5eed);
    let mut several_sources = 0;
    for case in 0..300 {
        let n = 2 + rng.below(7);
        let edges = random_dag(&mut rng, n, case % 2 == 0);
        let layout = dag(n, edges.clone());
        if (0..n).filter(|&s| layout.preds(s).is_empty()).count() > 1 {
            several_sources += 1;
        }
        let random = random_costs(&mut rng, n);
        for &name in DAG_NAMES {
            for &m in MICROBATCHES {
                let what = format!("{name} m={m} on {n} stages, edges {edges:?}");
                let s = builtin_on(name, &layout, m, 1).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(s.layout, layout, "{what}");
                validate(&s).unwrap_or_else(|e| panic!("{what}: {e}"));
                validate(&insert_communication(&s)).unwrap_or_else(|e| panic!("{what}: {e}"));
                check_counts(&s, name, m);
                let mut tables: Vec<CostTable> = COSTS
                    .iter()
                    .map(|&(f, b, w)| CostTable::uniform(n, f, b, w, 0.0))
                    .collect();
                tables.push(random.clone());
                for costs in &tables {
                    let r = sim(&s, costs);
                    let lb = lower_bound(&layout, costs, m, is_fused(name));
                    assert!(
                        r.makespan >= lb - EPS,
                        "{what}: makespan {} < lower bound {lb}",
                        r.makespan
                    );
                }
                // Equal stage costs, fused backward: (L + m − 1)·T, L stages on the longest
                // path.
                if is_fused(name) {
                    let mut depth = vec![1usize; n];
                    for x in 0..n {
                        for q in layout.preds(x) {
                            depth[x] = depth[x].max(depth[q] + 1);
                        }
                    }
                    let longest = *depth.iter().max().unwrap();
                    for &(f, b, w) in COSTS {
                        let r = sim(&s, &CostTable::uniform(n, f, b, w, 0.0));
                        let lb = (longest + m - 1) as f64 * (f + b + w);
                        assert!(r.makespan >= lb - EPS, "{what}: {} < {lb}", r.makespan);
                    }
                }
                // Link time only delays.
                let r0 = sim(&s, &CostTable::uniform(n, 1.0, 1.0, 1.0, 0.0));
                let r1 = sim(&s, &CostTable::uniform(n, 1.0, 1.0, 1.0, 0.25));
                assert!(r1.makespan >= r0.makespan - EPS, "{what}");
            }
        }
    }
    assert!(several_sources > 20, "{several_sources}");
}

#[test]
fn dag_schedules_on_a_chain_are_the_chain_schedules() {
    for n in 1..=8 {
        let layout = dag(n, (1..n).map(|s| (s - 1, s)).collect());
        for &name in DAG_NAMES {
            for &m in MICROBATCHES {
                let on_dag = builtin_on(name, &layout, m, 1).unwrap();
                let chain = builtin(name, n, m, 1).unwrap();
                assert_eq!(on_dag.per_rank, chain.per_rank, "{name} n={n} m={m}");
                for &(f, b, w) in COSTS {
                    for comm in [0.0, 0.5] {
                        let a = sim(&on_dag, &CostTable::uniform(n, f, b, w, comm));
                        let c = sim(&chain, &CostTable::uniform(n, f, b, w, comm));
                        assert!(
                            (a.makespan - c.makespan).abs() < EPS,
                            "{name} n={n} m={m} F={f} B={b} W={w} comm={comm}: {} != {}",
                            a.makespan,
                            c.makespan
                        );
                        assert_eq!(a.peak_stash, c.peak_stash);
                    }
                }
            }
        }
    }
}

#[test]
fn builtin_on_chain_layouts_is_builtin() {
    let cases: &[(&str, Layout, usize)] = &[
        ("gpipe", Layout::chain(4), 1),
        ("1f1b", Layout::chain(4), 1),
        ("zb-h1", Layout::chain(3), 1),
        ("zb-h2", Layout::chain(3), 1),
        ("interleaved-1f1b", Layout::chain(4), 1),
        (
            "interleaved-1f1b",
            Layout::Interleaved {
                ranks: 4,
                chunks: 2,
            },
            2,
        ),
        ("zb-v", Layout::VShape { ranks: 4 }, 1),
    ];
    for (name, layout, chunks) in cases {
        let s = builtin_on(name, layout, 8, *chunks).unwrap();
        assert_eq!(
            s,
            builtin(name, layout.num_ranks(), 8, *chunks).unwrap(),
            "{name}"
        );
        assert_eq!(&s.layout, layout);
    }
}

#[test]
fn builtin_on_rejects_layouts_a_schedule_cannot_use() {
    let err = |name: &str, layout: &Layout, chunks: usize| {
        builtin_on(name, layout, 4, chunks).unwrap_err().to_string()
    };
    let diamond = dag(4, vec![(0, 1), (0, 2), (1, 3), (2, 3)]);
    for name in ["interleaved-1f1b", "zb-v"] {
        let e = err(name, &diamond, 2);
        assert!(
            e.contains("needs a chain of stages") && e.contains("sequential partition"),
            "{e}"
        );
    }
    let shared = Layout::Dag {
        ranks: 2,
        rank_of: vec![0, 1, 0],
        edges: vec![(0, 1), (1, 2)],
    };
    let e = err("1f1b", &shared, 1);
    assert!(e.contains("one stage per rank"), "{e}");
    let e = err("zb-h1", &dag(2, vec![(0, 1), (1, 0)]), 1);
    assert!(e.contains("cycle"), "{e}");
    let e = err("gpipe", &dag(2, vec![(0, 2)]), 1);
    assert!(e.contains("not between two distinct stages"), "{e}");
    let v = Layout::VShape { ranks: 2 };
    let e = err("1f1b", &v, 1);
    assert!(
        e.contains("needs a chain of stages (one chunk per rank)"),
        "{e}"
    );
    let e = err("zb-v", &Layout::chain(2), 1);
    assert!(e.contains("needs a V-shaped layout"), "{e}");
    let interleaved = Layout::Interleaved {
        ranks: 2,
        chunks: 2,
    };
    let e = err("interleaved-1f1b", &interleaved, 3);
    assert!(e.contains("3 chunk(s) per rank"), "{e}");
    let e = err("interleaved-1f1b", &v, 2);
    assert!(e.contains("interleaved chain"), "{e}");
    let e = err("zb-h2", &interleaved, 2);
    assert!(e.contains("one chunk per rank"), "{e}");
    assert!(err("nope", &diamond, 1).contains("unknown schedule `nope`"));
    assert!(builtin_on("1f1b", &diamond, 0, 1).is_err());
}
