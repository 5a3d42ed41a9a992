//! `pps`: ppcc's schedule language (`ppcc_passes::schedule::pps::read_pps`, which runs the
//! validator), then the simulator on what it accepts, as `ppcc simulate --schedule
//! FILE.pps` and `ppcc MODEL --schedule FILE.pps` use it. Each input is compiled for several
//! (ranks, micro-batches, chunks); an accepted schedule must also survive the printer: its
//! `to_pps` listing must read back to the same schedule (a finding otherwise).
//!
//! Seeds: `examples/schedules/*.pps`, the built-ins' listings, compiled plans'
//! `schedule.pps`. Format-aware mutations work on tokens and lines: change a number, swap
//! an action letter or an operator, drop, duplicate or move a line, splice a line from
//! another input.

use ppcc_passes::schedule::pps::{parse, read_pps, to_pps, PpsParams};
use ppcc_passes::schedule::{builtin, insert_communication, BUILTIN_NAMES};
use ppcc_passes::simulate::{simulate, CostTable};

use super::{files_with_ext, read_all, Env, Target, Verdict};
use crate::rng::Rng;

pub struct Pps;

/// (ranks, micro-batches, chunks) each input is compiled for.
const PARAMS: &[(usize, usize, usize)] = &[(1, 1, 1), (2, 4, 1), (3, 5, 1), (4, 8, 2)];

impl Target for Pps {
    fn name(&self) -> &'static str {
        "pps"
    }
    fn describe(&self) -> &'static str {
        "schedule programs (ppcc_passes::schedule::pps::read_pps + validate + simulate + to_pps round trip)"
    }
    fn ext(&self) -> &'static str {
        "pps"
    }

    fn seeds(&self, env: &Env) -> anyhow::Result<Vec<Vec<u8>>> {
        let dir = env.root.join("examples/schedules");
        let mut out = read_all(&files_with_ext(&dir, &["pps"], false))?;
        for name in BUILTIN_NAMES {
            let s = builtin(name, 2, 4, 2)?;
            out.push(to_pps(&s).into_bytes());
            out.push(to_pps(&insert_communication(&s)).into_bytes());
        }
        for d in &env.plan_dirs {
            if let Ok(b) = std::fs::read(d.join("schedule.pps")) {
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
        let mut lines: Vec<String> = text.lines().map(String::from).collect();
        if lines.is_empty() {
            lines.push(String::new());
        }
        let i = rng.below(lines.len());
        match rng.below(8) {
            0..=2 => lines[i] = mutate_tokens(rng, &lines[i]),
            3 => {
                lines.remove(i);
            }
            4 => {
                let l = lines[i].clone();
                lines.insert(rng.below(lines.len() + 1), l);
            }
            5 => {
                let j = rng.below(lines.len());
                lines.swap(i, j);
            }
            6 => {
                // A line from another input.
                if !corpus.is_empty() {
                    let other = String::from_utf8_lossy(rng.pick(corpus).as_slice()).into_owned();
                    let others: Vec<&str> = other.lines().collect();
                    if !others.is_empty() {
                        lines.insert(i, rng.pick(&others).to_string());
                    }
                }
            }
            _ => {
                // Wrap a line in a loop or a guard.
                let wrap =
                    *rng.pick(&["repeat 2 {", "if r == 0 {", "for k in 0..m {", "overlap {"]);
                lines.insert(i, wrap.to_string());
                let end = (i + 2 + rng.below(3)).min(lines.len());
                lines.insert(end, "}".into());
            }
        }
        let mut out = lines.join("\n");
        out.push('\n');
        Some(out.into_bytes())
    }

    fn run(&self, _env: &Env, input: &[u8]) -> Verdict {
        let text = match std::str::from_utf8(input) {
            Ok(t) => t,
            Err(e) => return Verdict::Rejected(format!("not UTF-8: {e}")),
        };
        if let Err(e) = parse(text) {
            return Verdict::Rejected(e.to_string());
        }
        let mut accepted = false;
        let mut errors = vec![];
        for &(p, m, v) in PARAMS {
            let params = PpsParams {
                ranks: Some(p),
                microbatches: Some(m),
                chunks: Some(v),
            };
            let s = match read_pps(text, params) {
                Ok(s) => s,
                Err(e) => {
                    errors.push(e.to_string());
                    continue;
                }
            };
            let listing = to_pps(&s);
            match read_pps(&listing, PpsParams::default()) {
                Ok(back) if back == s => {}
                Ok(_) => {
                    return Verdict::Crash(format!(
                        "p={p} m={m} v={v}: the printed listing reads back to another schedule"
                    ))
                }
                Err(e) => {
                    return Verdict::Crash(format!(
                        "p={p} m={m} v={v}: the printed listing does not read back: {e}"
                    ))
                }
            }
            let costs = CostTable::uniform(s.num_virtual_stages(), 1.0, 1.0, 1.0, 0.5);
            match simulate(&s, &costs) {
                Ok(_) => accepted = true,
                Err(e) => errors.push(format!("simulate: {e}")),
            }
        }
        if accepted {
            Verdict::Accepted
        } else {
            Verdict::Rejected(errors.join("; "))
        }
    }
}

/// Change one token of `line`: a number, an action letter, an operator or a keyword.
fn mutate_tokens(rng: &mut Rng, line: &str) -> String {
    let tokens: Vec<&str> = line
        .split_inclusive(|c: char| !c.is_ascii_alphanumeric() && c != '_')
        .collect();
    if tokens.is_empty() {
        return line.to_string();
    }
    let i = rng.below(tokens.len());
    let tok = tokens[i];
    let (word, rest) = tok.split_at(
        tok.find(|c: char| !c.is_ascii_alphanumeric() && c != '_')
            .unwrap_or(tok.len()),
    );
    let new_word = if let Ok(n) = word.parse::<i64>() {
        match rng.below(5) {
            0 => n.saturating_add(1).to_string(),
            1 => n.saturating_sub(1).to_string(),
            2 => "0".into(),
            3 => "1000000".into(),
            _ => "9223372036854775807".into(),
        }
    } else if ["F", "I", "W", "B", "OPT", "SEND_F", "RECV_B"].contains(&word) {
        rng.pick(&[
            "F", "I", "W", "B", "OPT", "SEND_F", "RECV_F", "SEND_B", "RECV_B",
        ])
        .to_string()
    } else if word.is_empty() {
        String::new()
    } else {
        rng.pick(&[
            "p", "m", "v", "r", "x", "next", "min", "max", "let", "repeat", "while", "defer",
            "flush", "rank", "layout",
        ])
        .to_string()
    };
    let new_rest = if !rest.is_empty() && rng.one_in(3) {
        rng.pick(&[
            "+", "-", "*", "/", "%", "<", "==", "&&", "(", ")", "{", "}", ",", "..",
        ])
        .to_string()
    } else {
        rest.to_string()
    };
    let mut out: String = tokens[..i].concat();
    out.push_str(&new_word);
    out.push_str(&new_rest);
    out.push_str(&tokens[i + 1..].concat());
    out
}
