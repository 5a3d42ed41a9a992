//! `csv`: torch-style CSV schedules (`ppcc_passes::schedule::csv::from_csv`, which runs the
//! validator), then the simulator on what they accept — as `ppcc simulate --schedule
//! FILE.csv` and `ppcc MODEL --schedule FILE.csv` use them. Each input is read over several
//! layouts (chains, interleaved, V, a DAG).
//!
//! Format-aware mutations work on cells: drop, duplicate, move, or rewrite one (stage,
//! kind, micro-batch), add or drop rows and empty cells.

use ppcc_passes::schedule::csv::{from_csv, to_csv};
use ppcc_passes::schedule::{builtin, builtin_on, insert_communication, Layout};
use ppcc_passes::simulate::{simulate, CostTable};

use super::plan::mutate_action;
use super::{Env, Target, Verdict};
use crate::rng::Rng;

pub struct Csv;

fn layouts() -> Vec<Layout> {
    vec![
        Layout::chain(1),
        Layout::chain(2),
        Layout::chain(4),
        Layout::Interleaved {
            ranks: 2,
            chunks: 2,
        },
        Layout::VShape { ranks: 2 },
        Layout::Dag {
            ranks: 3,
            rank_of: vec![0, 1, 2],
            edges: vec![(0, 2), (1, 2)],
        },
    ]
}

impl Target for Csv {
    fn name(&self) -> &'static str {
        "csv"
    }
    fn describe(&self) -> &'static str {
        "CSV schedules (ppcc_passes::schedule::csv::from_csv + validate + simulate)"
    }
    fn ext(&self) -> &'static str {
        "csv"
    }

    fn seeds(&self, env: &Env) -> anyhow::Result<Vec<Vec<u8>>> {
        let mut out = vec![];
        for name in ["gpipe", "1f1b", "zb-h1", "zb-h2"] {
            for (ranks, mbs) in [(1, 1), (2, 4), (4, 8)] {
                let s = builtin(name, ranks, mbs, 1)?;
                out.push(to_csv(&s).into_bytes());
                out.push(to_csv(&insert_communication(&s)).into_bytes());
            }
        }
        out.push(to_csv(&builtin("interleaved-1f1b", 2, 4, 2)?).into_bytes());
        out.push(to_csv(&builtin("zb-v", 2, 4, 1)?).into_bytes());
        if let Some(dag) = layouts().pop() {
            out.push(to_csv(&builtin_on("1f1b", &dag, 3, 1)?).into_bytes());
        }
        for d in &env.plan_dirs {
            if let Ok(b) = std::fs::read(d.join("schedule.csv")) {
                out.push(b);
            }
        }
        Ok(out)
    }

    fn mutate_structured(
        &self,
        rng: &mut Rng,
        input: &[u8],
        corpus: &[Vec<u8>],
    ) -> Option<Vec<u8>> {
        let text = std::str::from_utf8(input).ok()?;
        let mut rows: Vec<Vec<String>> = text
            .lines()
            .map(|l| l.split(',').map(String::from).collect())
            .collect();
        if rows.is_empty() {
            rows.push(vec![]);
        }
        let r = rng.below(rows.len());
        let row_len = rows[r].len();
        match rng.below(10) {
            0..=3 if row_len > 0 => {
                let c = rng.below(row_len);
                rows[r][c] = mutate_action(rng, &rows[r][c]);
            }
            4 if row_len > 0 => {
                rows[r].remove(rng.below(row_len));
            }
            5 if row_len > 0 => {
                let c = rng.below(row_len);
                let cell = rows[r][c].clone();
                let at = rng.below(row_len + 1);
                rows[r].insert(at, cell);
            }
            6 if row_len > 1 => {
                let (a, b) = (rng.below(row_len), rng.below(row_len));
                rows[r].swap(a, b);
            }
            7 => {
                // Move a cell to another row (another rank).
                let r2 = rng.below(rows.len());
                if row_len > 0 {
                    let cell = rows[r].remove(rng.below(row_len));
                    let at = rng.below(rows[r2].len() + 1);
                    rows[r2].insert(at, cell);
                }
            }
            8 => match rng.below(4) {
                0 => {
                    rows.remove(r);
                }
                1 => {
                    let row = rows[r].clone();
                    rows.insert(r, row);
                }
                2 => rows[r].insert(rng.below(row_len + 1), String::new()),
                _ => rows.push(vec![]),
            },
            _ => {
                // A row from another schedule.
                let other = match corpus.is_empty() {
                    true => String::new(),
                    false => String::from_utf8_lossy(rng.pick(corpus).as_slice()).into_owned(),
                };
                let lines: Vec<&str> = other.lines().collect();
                if !lines.is_empty() {
                    rows[r] = rng.pick(&lines).split(',').map(String::from).collect();
                }
            }
        }
        let mut out = String::new();
        for row in rows {
            out.push_str(&row.join(","));
            out.push('\n');
        }
        Some(out.into_bytes())
    }

    fn run(&self, _env: &Env, input: &[u8]) -> Verdict {
        let text = match std::str::from_utf8(input) {
            Ok(t) => t,
            Err(e) => return Verdict::Rejected(format!("not UTF-8: {e}")),
        };
        let mut verdict = Verdict::Rejected(String::new());
        let mut errors = vec![];
        for layout in layouts() {
            match from_csv(text, layout) {
                Ok(s) => {
                    let costs = CostTable::uniform(s.num_virtual_stages(), 1.0, 1.0, 1.0, 0.5);
                    if let Err(e) = simulate(&s, &costs) {
                        errors.push(format!("simulate: {e}"));
                    } else {
                        verdict = Verdict::Accepted;
                    }
                }
                Err(e) => errors.push(e.to_string()),
            }
        }
        match verdict {
            Verdict::Accepted => Verdict::Accepted,
            _ => Verdict::Rejected(errors.join("; ")),
        }
    }
}
