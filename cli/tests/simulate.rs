//! `ppcc simulate` end to end: closed-form makespans, per-rank peak activations, the
//! trace/SVG/CSV outputs, and errors for unknown schedules and invalid CSV files.

use std::path::PathBuf;
use std::process::Command;

/// Run `ppcc simulate ARGS`: (success, stdout, stderr).
fn simulate(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ppcc"))
        .arg("simulate")
        .args(args)
        .output()
        .expect("ppcc runs");
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ppcc-simulate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn one_f_one_b_prints_makespan_bubble_and_peaks() {
    let (ok, out, err) = simulate(&["--schedule", "1f1b", "--stages", "4", "--microbatches", "8"]);
    assert!(ok, "{err}");
    // (m + p − 1)(F + B + W) = 11 · 3; bubble 1 − 8/11.
    assert_eq!(
        out,
        format!(
            "makespan 33 bubble {:.6}\nrank 0 peak_activations 4\nrank 1 peak_activations 3\nrank 2 peak_activations 2\nrank 3 peak_activations 1\n",
            1.0 - 8.0 / 11.0
        )
    );
}

/// The V schedules at unit costs: `6m + p − 1`, with `2p` (ZB-V) and `2p + 1` (DualPipeV)
/// chunk activations per rank.
#[test]
fn v_schedules_have_their_closed_form_makespans() {
    for (name, peak) in [("zb-v", 8), ("dualpipe-v", 9)] {
        let (ok, out, err) = simulate(&[
            "--schedule",
            name,
            "--stages",
            "4",
            "--microbatches",
            "8",
            "--cost",
            "F=1,B=1,W=1,comm=0",
        ]);
        assert!(ok, "{name}: {err}");
        let mut want = format!("makespan 51 bubble {:.6}\n", 1.0 - 48.0 / 51.0);
        for r in 0..4 {
            want.push_str(&format!("rank {r} peak_activations {peak}\n"));
        }
        assert_eq!(out, want, "{name}");
    }
}

#[test]
fn costs_chunks_and_outputs() {
    let (ok, out, err) = simulate(&[
        "--schedule",
        "zb-h1",
        "--stages",
        "4",
        "--microbatches",
        "8",
        "--cost",
        "F=2,B=3,W=1",
    ]);
    assert!(ok, "{err}");
    // m(F+B+W) + (p−1)(F+B−W) = 48 + 12.
    assert!(out.starts_with("makespan 60 bubble "), "{out}");

    let (trace, svg, csv) = (tmp("t.json"), tmp("t.svg"), tmp("t.csv"));
    let (ok, out, err) = simulate(&[
        "--schedule",
        "interleaved-1f1b",
        "--stages",
        "2",
        "--microbatches",
        "4",
        "--chunks",
        "2",
        "--trace",
        trace.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
        "--export-csv",
        csv.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let first = out.lines().next().unwrap().to_string();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    assert!(json["traceEvents"].as_array().unwrap().len() > 16);
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<svg"));
    // The exported CSV simulates the same.
    let (ok, out2, err) = simulate(&[
        "--schedule",
        csv.to_str().unwrap(),
        "--stages",
        "2",
        "--microbatches",
        "4",
        "--chunks",
        "2",
    ]);
    assert!(ok, "{err}");
    assert_eq!(out2.lines().next().unwrap(), first);
}

#[test]
fn errors_exit_non_zero_with_a_message() {
    let (ok, _, err) = simulate(&["--schedule", "2f2b", "--stages", "2", "--microbatches", "2"]);
    assert!(!ok);
    assert!(
        err.contains("unknown schedule `2f2b`") && err.contains("zb-v"),
        "{err}"
    );

    let bad = tmp("bad.csv");
    std::fs::write(&bad, "0F0,0B0\n1B0,1F0\n").unwrap();
    let (ok, _, err) = simulate(&[
        "--schedule",
        bad.to_str().unwrap(),
        "--stages",
        "2",
        "--microbatches",
        "1",
    ]);
    assert!(!ok);
    assert!(
        err.contains("row 2, column 1 (cell `1B0`)") && err.contains("runs before 1F0"),
        "{err}"
    );

    let (ok, _, err) = simulate(&[
        "--schedule",
        "1f1b",
        "--stages",
        "2",
        "--microbatches",
        "2",
        "--cost",
        "F=x",
    ]);
    assert!(!ok && err.contains("--cost"), "{err}");

    // Issue 12: 10^10 (stage, micro-batch) pairs used to abort allocating; now refused
    // before anything is built.
    let (ok, _, err) = simulate(&[
        "--schedule",
        "1f1b",
        "--stages",
        "100000",
        "--microbatches",
        "100000",
    ]);
    assert!(
        !ok && err.contains("100000 stages × 100000 micro-batches is too large")
            && !err.contains("panicked"),
        "{err}"
    );

    let (ok, out, _) = Command::new(env!("CARGO_BIN_EXE_ppcc"))
        .args(["simulate", "--help"])
        .output()
        .map(|o| (o.status.success(), String::from_utf8(o.stdout).unwrap(), ()))
        .unwrap();
    assert!(
        ok && out.contains("interleaved-1f1b")
            && out.contains("zb-v")
            && out.contains("dualpipe-v"),
        "{out}"
    );
}

fn example_schedule(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/schedules")
        .join(format!("{name}.pps"))
        .display()
        .to_string()
}

/// Every built-in's `.pps` program simulates as the built-in does (unit costs), and writes
/// the same CSV (ZB-V's built-in may move its W's for the costs; at unit costs it keeps its
/// order only when that is no slower, so its CSV is not compared).
#[test]
fn pps_programs_simulate_as_their_builtins() {
    for name in [
        "gpipe",
        "1f1b",
        "interleaved-1f1b",
        "zb-h1",
        "zb-h2",
        "zb-v",
        "dualpipe-v",
    ] {
        for (p, m) in [(2, 4), (4, 8), (3, 9)] {
            let (p, m, v) = (p.to_string(), m.to_string(), "2");
            let file = example_schedule(name);
            let csv_a = tmp(&format!("{name}-{p}-{m}-builtin.csv"));
            let csv_b = tmp(&format!("{name}-{p}-{m}-pps.csv"));
            let pps = tmp(&format!("{name}-{p}-{m}-export.pps"));
            let chunks: &[&str] = if name == "interleaved-1f1b" {
                &["--chunks", v]
            } else {
                &[]
            };
            let run = |schedule: &str, csv: &PathBuf, extra: &[&str]| {
                let mut args = vec![
                    "--schedule",
                    schedule,
                    "--stages",
                    &p,
                    "--microbatches",
                    &m,
                    "--export-csv",
                    csv.to_str().unwrap(),
                ];
                args.extend_from_slice(chunks);
                args.extend_from_slice(extra);
                simulate(&args)
            };
            let (ok, want, err) = run(name, &csv_a, &[]);
            assert!(ok, "{name}: {err}");
            let (ok, got, err) = run(&file, &csv_b, &["--export-pps", pps.to_str().unwrap()]);
            assert!(ok, "{file}: {err}");
            assert_eq!(got, want, "{name} p={p} m={m}");
            if name != "zb-v" {
                assert_eq!(
                    std::fs::read_to_string(&csv_a).unwrap(),
                    std::fs::read_to_string(&csv_b).unwrap(),
                    "{name} p={p} m={m}"
                );
            }
            // The exported listing reads back to the same schedule.
            let csv_c = tmp(&format!("{name}-{p}-{m}-listing.csv"));
            let (ok, again, err) = run(pps.to_str().unwrap(), &csv_c, &[]);
            assert!(ok, "{}: {err}", pps.display());
            assert_eq!(again, got);
            assert_eq!(
                std::fs::read_to_string(&csv_b).unwrap(),
                std::fs::read_to_string(&csv_c).unwrap()
            );
        }
    }
}

#[test]
fn malformed_pps_is_an_error_with_path_line_and_column() {
    let bad = tmp("bad.pps");
    std::fs::write(
        &bad,
        "layout chain\nrank r {\n  for i in 0..m { F(0, i) }\n  B(0, m)\n}\n",
    )
    .unwrap();
    let (ok, out, err) = simulate(&[
        "--schedule",
        bad.to_str().unwrap(),
        "--stages",
        "2",
        "--microbatches",
        "4",
    ]);
    assert!(!ok);
    assert!(out.is_empty(), "{out}");
    let want = format!("{}:4:3: micro-batch 4 is out of range 0..4", bad.display());
    assert!(err.contains(&want), "`{err}` lacks `{want}`");
    // A syntax error.
    std::fs::write(&bad, "layout chain\nrank r {\n  F(0 0)\n}\n").unwrap();
    let (ok, _, err) = simulate(&[
        "--schedule",
        bad.to_str().unwrap(),
        "--stages",
        "2",
        "--microbatches",
        "4",
    ]);
    assert!(!ok);
    let want = format!("{}:3:7: expected `)`, found `0`", bad.display());
    assert!(err.contains(&want), "`{err}` lacks `{want}`");
    // A schedule that deadlocks is reported at an action's statement.
    std::fs::write(
        &bad,
        "layout chain\nrank 0 {\n  for i in 0..m { F(0, i) }\n  for i in 0..m { B(0, i) }\n}\nrank 1 {\n  for i in 0..m { B(0, i) }\n  for i in 0..m { F(0, i) }\n}\n",
    )
    .unwrap();
    let (ok, _, err) = simulate(&[
        "--schedule",
        bad.to_str().unwrap(),
        "--stages",
        "2",
        "--microbatches",
        "4",
    ]);
    assert!(!ok);
    assert!(err.contains(&format!("{}:", bad.display())), "{err}");
    // A missing file.
    let (ok, _, err) = simulate(&[
        "--schedule",
        "nope.pps",
        "--stages",
        "2",
        "--microbatches",
        "4",
    ]);
    assert!(!ok);
    assert!(err.contains("cannot read nope.pps"), "{err}");
}

/// A CSV's layout is inferred from its rows: an exported ZB-V (a V) and interleaved 1F1B
/// (2 chunks) simulate like their built-ins without `--layout` or `--chunks`.
#[test]
fn csv_layout_is_inferred_from_the_rows() {
    for (name, chunks) in [("zb-v", "1"), ("interleaved-1f1b", "2")] {
        let csv = tmp(&format!("{name}-inferred.csv"));
        let (ok, first, err) = simulate(&[
            "--schedule",
            name,
            "--stages",
            "3",
            "--microbatches",
            "6",
            "--chunks",
            chunks,
            "--export-csv",
            csv.to_str().unwrap(),
        ]);
        assert!(ok, "{err}");
        let (ok, again, err) = simulate(&[
            "--schedule",
            csv.to_str().unwrap(),
            "--stages",
            "3",
            "--microbatches",
            "6",
        ]);
        assert!(ok, "{name}: {err}");
        assert_eq!(
            again.lines().next().unwrap(),
            first.lines().next().unwrap(),
            "{name}"
        );
    }
}
