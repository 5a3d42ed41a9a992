//! `plan`: `plan.json` as `ppcc run` reads it (`ppcc_runtime::pipeline::PlanSpec`), in-process.
//!
//! Format-aware mutations parse the JSON and change one node of a real plan (written by
//! `ppcc examples/… -o DIR`): delete or duplicate a field or list element, change its type,
//! set a number to a boundary value, rewrite a schedule action (`0F9`, `1SEND_B0`, …).

use std::path::Path;

use ppcc_runtime::pipeline::PlanSpec;
use serde_json::{Map, Number, Value};

use super::{read_all, Env, Target, Verdict};
use crate::mutate::{interesting, number_text};
use crate::rng::Rng;

pub struct Plan;

impl Target for Plan {
    fn name(&self) -> &'static str {
        "plan"
    }
    fn describe(&self) -> &'static str {
        "plan.json (ppcc_plan::Plan, then ppcc_runtime::pipeline::PlanSpec::from_doc)"
    }
    fn ext(&self) -> &'static str {
        "json"
    }

    fn seeds(&self, env: &Env) -> anyhow::Result<Vec<Vec<u8>>> {
        let paths: Vec<_> = env.plan_dirs.iter().map(|d| d.join("plan.json")).collect();
        if paths.is_empty() {
            anyhow::bail!("no compiled plan to start from (the runner compiles examples/*.onnx with the ppcc binary: build it, or pass --ppcc)");
        }
        read_all(&paths)
    }

    fn mutate_structured(
        &self,
        rng: &mut Rng,
        input: &[u8],
        _corpus: &[Vec<u8>],
    ) -> Option<Vec<u8>> {
        let mut v: Value = serde_json::from_slice(input).ok()?;
        mutate_json(rng, &mut v);
        serde_json::to_vec_pretty(&v).ok()
    }

    fn run(&self, env: &Env, input: &[u8]) -> Verdict {
        let v: Value = match serde_json::from_slice(input) {
            Ok(v) => v,
            Err(e) => return Verdict::Rejected(format!("not JSON: {e}")),
        };
        let dir = env
            .plan_dirs
            .first()
            .map_or(Path::new("."), |d| d.as_path());
        match PlanSpec::from_json(&v, dir) {
            Ok(_) => Verdict::Accepted,
            Err(e) => Verdict::Rejected(super::error_chain(&e)),
        }
    }
}

/// Change one node of `v` (chosen uniformly among all nodes).
pub fn mutate_json(rng: &mut Rng, v: &mut Value) {
    let n = count(v);
    let target = rng.below(n);
    let mut seen = 0;
    visit(rng, v, target, &mut seen);
}

fn count(v: &Value) -> usize {
    1 + match v {
        Value::Array(a) => a.iter().map(count).sum(),
        Value::Object(o) => o.values().map(count).sum(),
        _ => 0,
    }
}

fn visit(rng: &mut Rng, v: &mut Value, target: usize, seen: &mut usize) -> bool {
    if *seen == target {
        change(rng, v);
        return true;
    }
    *seen += 1;
    match v {
        Value::Array(a) => {
            for i in 0..a.len() {
                let before = *seen;
                let sub = count(&a[i]);
                if target < before + sub {
                    // Sometimes act on the list itself at this element.
                    if rng.one_in(6) {
                        match rng.below(3) {
                            0 => {
                                a.remove(i);
                            }
                            1 => {
                                let e = a[i].clone();
                                a.insert(i, e);
                            }
                            _ => {
                                let j = rng.below(a.len());
                                a.swap(i, j);
                            }
                        }
                        return true;
                    }
                    return visit(rng, &mut a[i], target, seen);
                }
                *seen += sub;
            }
        }
        Value::Object(o) => {
            let keys: Vec<String> = o.keys().cloned().collect();
            for k in keys {
                let before = *seen;
                let sub = count(&o[&k]);
                if target < before + sub {
                    if rng.one_in(5) {
                        o.remove(&k);
                        return true;
                    }
                    return match o.get_mut(&k) {
                        Some(v) => visit(rng, v, target, seen),
                        None => false,
                    };
                }
                *seen += sub;
            }
        }
        _ => {}
    }
    false
}

fn change(rng: &mut Rng, v: &mut Value) {
    if rng.one_in(5) {
        *v = retyped(rng);
        return;
    }
    match v {
        Value::Number(_) => *v = boundary_number(rng),
        Value::String(s) => *s = mutate_string(rng, s),
        Value::Bool(b) => *b = !*b,
        Value::Null => *v = boundary_number(rng),
        Value::Array(a) => match rng.below(3) {
            0 => a.clear(),
            1 if !a.is_empty() => {
                let e = a[rng.below(a.len())].clone();
                a.push(e);
            }
            _ => a.push(boundary_number(rng)),
        },
        Value::Object(o) => {
            if rng.one_in(2) && !o.is_empty() {
                let keys: Vec<String> = o.keys().cloned().collect();
                o.remove(rng.pick(&keys));
            } else {
                o.insert("fuzz".into(), boundary_number(rng));
            }
        }
    }
}

fn retyped(rng: &mut Rng) -> Value {
    match rng.below(6) {
        0 => Value::Null,
        1 => Value::Bool(rng.one_in(2)),
        2 => Value::String(number_text(rng)),
        3 => Value::Array(vec![]),
        4 => Value::Object(Map::new()),
        _ => boundary_number(rng),
    }
}

fn boundary_number(rng: &mut Rng) -> Value {
    match rng.below(8) {
        0 => Value::Number(Number::from(u64::MAX)),
        1 => Number::from_f64(*rng.pick(&[-0.5, 0.5, 1e308, -1e308, 1e-300, 2.5]))
            .map_or(Value::Null, Value::Number),
        2 => Value::Number(Number::from(rng.below(10) as u64)),
        _ => Value::Number(Number::from(interesting(rng))),
    }
}

/// Strings of a plan: schedule actions, names, types, paths.
fn mutate_string(rng: &mut Rng, s: &str) -> String {
    if ppir::schedule::parse_action(s).is_ok() || rng.one_in(3) {
        return mutate_action(rng, s);
    }
    match rng.below(7) {
        0 => String::new(),
        1 => "../../..".into(),
        2 => "/".into(),
        3 => format!("{s}{s}"),
        4 => rng
            .pick(&[
                "f32[1,2]",
                "f32[?,4]",
                "i64[9223372036854775807,2]",
                "f32[]",
                "bogus",
                "cpu",
                "interp",
                "cuda",
            ])
            .to_string(),
        5 => s.chars().rev().collect(),
        _ => {
            let mut b = s.as_bytes().to_vec();
            crate::mutate::rewrite_number(rng, &mut b);
            String::from_utf8_lossy(&b).into_owned()
        }
    }
}

/// A schedule action (`{stage}{kind}{micro}`) with one part changed.
pub fn mutate_action(rng: &mut Rng, s: &str) -> String {
    const KINDS: &[&str] = &[
        "F", "I", "W", "B", "OPT", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "X", "",
    ];
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let stage = &s[..digits];
    let rest = &s[digits..];
    let kind_len = rest
        .find(|c: char| c.is_ascii_digit())
        .unwrap_or(rest.len());
    let kind = &rest[..kind_len];
    let micro = &rest[kind_len..];
    match rng.below(5) {
        0 => format!("{}{kind}{micro}", number_text(rng)),
        1 => format!("{stage}{}{micro}", rng.pick(KINDS)),
        2 => format!(
            "{stage}{kind}{}",
            if rng.one_in(2) {
                number_text(rng)
            } else {
                rng.below(12).to_string()
            }
        ),
        3 => format!("{stage}{kind}"),
        _ => format!(" {s} "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_mutate_on_char_boundaries() {
        let mut rng = Rng::new(1);
        for s in ["0F1", "1SEND_B12", "é9ü", "", "12", "B"] {
            for _ in 0..50 {
                let _ = mutate_action(&mut rng, s);
            }
        }
        assert_ne!(
            mutate_action(&mut rng, "0F1"),
            mutate_action(&mut rng, "0F1") + "x"
        );
    }
}
