//! The schedule language: every built-in schedule's `.pps` program under
//! `examples/schedules/` reproduces its generator exactly (same actions per rank, in order),
//! the printer round-trips, and malformed or hostile files get located errors.

use std::path::PathBuf;

use ppcc_passes::schedule::pps::{parse, read_pps, to_pps, PpsError, PpsErrorKind, PpsParams};
use ppcc_passes::schedule::{
    builtin, builtin_on, insert_communication, Layout, Schedule, BUILTIN_NAMES,
};

fn example(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/schedules")
        .join(format!("{name}.pps"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn params(p: usize, m: usize, v: usize) -> PpsParams {
    PpsParams {
        ranks: Some(p),
        microbatches: Some(m),
        chunks: Some(v),
    }
}

/// Every (p, m, chunks) the test runs a built-in at: p in 1..=8, m in 1..=3p (below p too,
/// which the generators accept), and chunks 1..=4 for interleaved 1F1B (m a multiple of p).
fn cases(name: &str) -> Vec<(usize, usize, usize)> {
    let mut out = vec![];
    for p in 1..=8 {
        for m in 1..=3 * p {
            if name == "interleaved-1f1b" {
                for v in 1..=4 {
                    if v == 1 || m % p == 0 {
                        out.push((p, m, v));
                    }
                }
            } else {
                out.push((p, m, 1));
            }
        }
    }
    // A few larger ones.
    for (p, m) in [(12, 48), (16, 64), (3, 99)] {
        out.push((p, m, if name == "interleaved-1f1b" { 2 } else { 1 }));
    }
    out
}

#[test]
fn every_builtin_has_a_program_that_reproduces_it() {
    for name in BUILTIN_NAMES {
        let text = example(name);
        let prog = parse(&text).unwrap_or_else(|e| panic!("{name}.pps: {e}"));
        assert_eq!(prog.name.as_deref(), Some(*name));
        let mut n = 0;
        for (p, m, v) in cases(name) {
            let want = builtin(name, p, m, v).unwrap_or_else(|e| panic!("{name} {p} {m} {v}: {e}"));
            let got = read_pps(&text, params(p, m, v))
                .unwrap_or_else(|e| panic!("{name}.pps p={p} m={m} v={v}: {e}"));
            assert_eq!(got.layout, want.layout, "{name} p={p} m={m} v={v}");
            for r in 0..p {
                assert_eq!(
                    got.per_rank[r], want.per_rank[r],
                    "{name}.pps p={p} m={m} v={v}, rank {r}"
                );
            }
            assert_eq!(got, want);
            n += 1;
        }
        assert!(n > 100, "{name}: only {n} cases");
    }
}

#[test]
fn interleaved_program_refuses_what_the_generator_refuses() {
    let text = example("interleaved-1f1b");
    assert!(builtin("interleaved-1f1b", 4, 6, 2).is_err());
    let e = read_pps(&text, params(4, 6, 2)).unwrap_err();
    assert!(matches!(e.kind, PpsErrorKind::Require(_)), "{e}");
    assert_eq!(e.line, 7, "{e}");
}

fn round_trip(s: &Schedule) {
    let text = to_pps(s);
    let back = read_pps(&text, PpsParams::default()).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(&back, s, "{text}");
    // The caller's matching values are accepted too.
    let given = PpsParams {
        ranks: Some(s.num_stages),
        microbatches: Some(s.num_microbatches),
        chunks: None,
    };
    assert_eq!(&read_pps(&text, given).unwrap(), s);
}

#[test]
fn printer_round_trips_every_layout() {
    for name in BUILTIN_NAMES {
        for (p, m) in [(1, 1), (2, 3), (4, 8), (5, 10)] {
            let v = if *name == "interleaved-1f1b" && m % p == 0 {
                2
            } else {
                1
            };
            let s = builtin(name, p, m, v).unwrap();
            round_trip(&s);
            round_trip(&insert_communication(&s));
        }
    }
    let dag = Layout::Dag {
        ranks: 4,
        rank_of: vec![0, 1, 2, 3],
        edges: vec![(0, 1), (0, 2), (1, 3), (2, 3)],
    };
    for name in ["gpipe", "1f1b", "zb-h1", "zb-h2"] {
        let s = builtin_on(name, &dag, 6, 1).unwrap();
        round_trip(&s);
        round_trip(&insert_communication(&s));
    }
    // An optimizer step per stage.
    let mut s = builtin("1f1b", 3, 4, 1).unwrap();
    for st in 0..3 {
        s.push(ppcc_passes::schedule::ActionKind::OptimizerStep, st, 0);
    }
    round_trip(&s);
}

#[test]
fn a_pinned_value_that_disagrees_with_the_caller_is_an_error() {
    let text = to_pps(&builtin("1f1b", 2, 4, 1).unwrap());
    let e = read_pps(&text, params(3, 4, 1)).unwrap_err();
    assert_eq!((e.line, e.col), (2, 1), "{e}");
    assert!(e.to_string().contains("2 ranks, --stages gives 3"), "{e}");
}

fn error(text: &str) -> PpsError {
    read_pps(text, params(4, 8, 1)).unwrap_err()
}

#[test]
fn malformed_files_get_line_and_column() {
    let cases: &[(&str, (usize, usize), &str)] = &[
        (
            "layout chain\nrank r {\n  F(0, $)\n}",
            (3, 8),
            "unexpected character `$`",
        ),
        (
            "layout chain\nrank r {\n  F(0, 1\n}",
            (4, 1),
            "expected `)`, found `}`",
        ),
        (
            "layout chain\nrank r {\n  for i in 0..m { F(0, i) }\n",
            (4, 1),
            "expected `}`",
        ),
        ("layout ring\nrank r { }", (1, 8), "expected `chain`"),
        (
            "layout chain\nrank r {\n  F(0, x)\n}",
            (3, 8),
            "unknown name `x`",
        ),
        (
            "layout chain\nrank r {\n  F(0, m)\n}",
            (3, 3),
            "micro-batch 8 is out of range 0..8",
        ),
        (
            "layout chain\nrank r {\n  F(1, 0)\n}",
            (3, 3),
            "chunk of rank 0 1 is out of range 0..1",
        ),
        (
            "layout chain\nrank r {\n  let x = m / (r - r)\n}",
            (3, 13),
            "division by zero",
        ),
        (
            "layout chain\nrank r {\n  p = 3\n}",
            (3, 3),
            "`p` cannot be assigned",
        ),
        (
            "layout chain\nrank r {\n  require r < 2, \"two ranks only\"\n}",
            (3, 3),
            "requirement failed: two ranks only",
        ),
        (
            "layout chain\nrank r {\n  overlap { I(0) F(0) }\n}",
            (3, 13),
            "a forward `F`",
        ),
        (
            "layout chain\nrank r {\n  let x = 9223372036854775807 + 1\n}",
            (3, 31),
            "overflow",
        ),
        (
            "layout chain\nrank r {\n  repeat -1 { }\n}",
            (3, 3),
            "negative",
        ),
        (
            "layout chain\nrank r {\n  g(1)\n}",
            (3, 3),
            "unknown name `g`",
        ),
        (
            "layout chain\ndef g(a) { }\nrank r {\n  g(1, 2)\n}",
            (4, 3),
            "g takes 1 argument(s), 2 given",
        ),
        ("rank r { }", (1, 1), "no `layout` line"),
        ("layout chain\nrank 0 { }", (1, 1), "no program for rank 1"),
        (
            "layout chain\nrank 7 { }\nrank r { }",
            (2, 1),
            "rank 7 is out of range 0..4",
        ),
        (
            "layout chain\nrank r { }\nrank r { }",
            (3, 1),
            "already defined",
        ),
        ("schedule \"x\nlayout chain", (1, 10), "unterminated string"),
        (
            "layout chain\nrank r {\n  F(0, 99999999999999999999)\n}",
            (3, 8),
            "integer literal out of range",
        ),
        (
            "layout chain\nrank r {\n  defer",
            (3, 8),
            "expected an action",
        ),
        (
            "layout chain\nrank r { overlap {",
            (2, 19),
            "expected an action",
        ),
        (
            "layout chain\nrank r { flush 1 x }",
            (2, 18),
            "expected a statement",
        ),
    ];
    for (text, at, message) in cases {
        let e = error(text);
        assert_eq!((e.line, e.col), *at, "{text:?}: {e}");
        assert!(
            e.to_string().contains(message),
            "{text:?}: `{e}` lacks `{message}`"
        );
    }
}

#[test]
fn an_invalid_schedule_is_reported_at_the_action_that_breaks_it() {
    // Rank 1 runs backward before forward of micro-batch 0: the validator's complaint lands
    // on the statement that emitted the bad action (a deadlock, or a dependency error).
    let text = "layout chain\nrank r {\n  for i in 0..m { F(0, i) }\n  for i in 0..m { B(0, i) }\n}\nrank 1 {\n  for i in 0..m { B(0, i) }\n  for i in 0..m { F(0, i) }\n}\n";
    let e = error(text);
    assert!(matches!(e.kind, PpsErrorKind::Schedule(_)), "{e}");
    assert!(e.line == 7 || e.line == 4 || e.line == 3, "{e}");
    // A missing micro-batch.
    let e = error("layout chain\nrank r {\n  for i in 0..m - 1 { F(0, i) }\n  for i in 0..m - 1 { B(0, i) }\n}\n");
    assert!(matches!(e.kind, PpsErrorKind::Schedule(_)), "{e}");
}

#[test]
fn hostile_programs_are_bounded() {
    let e = error("layout chain\nrank r {\n  while 1 { }\n}");
    assert!(matches!(e.kind, PpsErrorKind::TooManySteps), "{e}");
    let e = error("layout chain\nrank r {\n  repeat 1000000000 { F(0, 0) }\n}");
    assert!(matches!(e.kind, PpsErrorKind::TooManyActions(_)), "{e}");
    let e = error("layout chain\ndef f(x) { f(x) }\nrank r {\n  f(1)\n}");
    assert!(matches!(e.kind, PpsErrorKind::TooDeep), "{e}");
    let deep = format!(
        "layout chain\nrank r {{ let x = {}1{} }}",
        "(".repeat(500),
        ")".repeat(500)
    );
    assert!(matches!(error(&deep).kind, PpsErrorKind::TooDeep));
    let deep = format!(
        "layout chain\nrank r {{ {}{} }}",
        "if 1 { ".repeat(500),
        "}".repeat(500)
    );
    assert!(matches!(error(&deep).kind, PpsErrorKind::TooDeep));
    let neg = format!("layout chain\nrank r {{ let x = {}1 }}", "-".repeat(5000));
    assert!(matches!(error(&neg).kind, PpsErrorKind::TooDeep));
    // Too many stages × micro-batches for memory is refused before anything runs.
    let e = read_pps("layout chain\nrank r { }", params(100_000, 100_000_000, 1)).unwrap_err();
    assert!(matches!(e.kind, PpsErrorKind::Schedule(_)), "{e}");
}

#[test]
fn language_features() {
    // Explicit listing per rank, `else if`, assignment ops, `next`, defer and flush.
    let text = "
        ranks 2
        microbatches 3
        layout chain
        rank r {
          let n = 0
          while n < m { F(0) n += 1 }
          if r == 0 { defer B(0) defer B(0) } else if r == 1 { B(0) } else { require 0 }
          flush 1
          if r == 1 { B(0) }
          flush
          B(0)
          require next(B, 0) == 3 + r * 0, \"counters\"
          let k = max(1, 2, min(7, 3)) - (-1) * 2 % 3
          require k == 5 && !(k != 5) || 0, \"arithmetic\"
        }
    ";
    let s = read_pps(text, PpsParams::default()).unwrap();
    assert_eq!(s, builtin("gpipe", 2, 3, 1).unwrap());
}
