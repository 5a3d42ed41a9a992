//! `stablehlo`: StableHLO text (`ppcc_frontends::stablehlo::import_stablehlo`: the reader of
//! the pretty and generic forms, then the lowering to ppir and the verifier on what it
//! accepts), as `ppcc eval|train|compile MODEL.mlir` use it, and what it accepts once more
//! with the batch rebound (`import_stablehlo_with_batch`, the leading float arguments as
//! parameters). Seeds are the JAX-made fixtures in tests/stablehlo/fixtures (both forms).
//!
//! Format-aware mutations work on lines and tokens: drop, duplicate or swap lines, swap an
//! op name for another one's, change a number, cut a line, splice a line of another seed.

use std::collections::BTreeMap;

use ppcc_frontends::stablehlo::{import_stablehlo, import_stablehlo_with_batch};

use super::{files_with_ext, Env, Target, Verdict};
use crate::rng::Rng;

pub struct StableHlo;

const OPS: &[&str] = &[
    "stablehlo.add",
    "stablehlo.dot_general",
    "stablehlo.broadcast_in_dim",
    "stablehlo.reduce",
    "stablehlo.reshape",
    "stablehlo.transpose",
    "stablehlo.gather",
    "stablehlo.convolution",
    "stablehlo.reduce_window",
    "stablehlo.constant",
    "stablehlo.iota",
    "stablehlo.slice",
    "stablehlo.compare",
    "stablehlo.select",
    "stablehlo.pad",
    "stablehlo.dynamic_slice",
    "stablehlo.dynamic_update_slice",
    "stablehlo.concatenate",
    "call",
    "func.call",
    "return",
];

impl Target for StableHlo {
    fn name(&self) -> &'static str {
        "stablehlo"
    }
    fn describe(&self) -> &'static str {
        "StableHLO text, pretty and generic (ppcc_frontends::stablehlo::import_stablehlo + verify)"
    }
    fn ext(&self) -> &'static str {
        "mlir"
    }

    fn seeds(&self, env: &Env) -> anyhow::Result<Vec<Vec<u8>>> {
        let dir = env.root.join("tests/stablehlo/fixtures");
        let mut out = vec![];
        for p in files_with_ext(&dir, &["mlir"], false) {
            out.push(std::fs::read(&p)?);
        }
        anyhow::ensure!(!out.is_empty(), "no .mlir seeds in {}", dir.display());
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
            return None;
        }
        let i = rng.below(lines.len());
        match rng.below(8) {
            0 => {
                lines.remove(i);
            }
            1 => {
                let l = lines[i].clone();
                lines.insert(rng.below(lines.len() + 1), l);
            }
            2 => {
                let j = rng.below(lines.len());
                lines.swap(i, j);
            }
            3 => {
                // Another op name.
                let from: &str = OPS.iter().find(|o| lines[i].contains(**o))?;
                let to = *rng.pick(OPS);
                lines[i] = lines[i].replacen(from, to, 1);
            }
            4 => {
                // Change one number.
                let bytes = lines[i].as_bytes();
                let digits: Vec<usize> = (0..bytes.len())
                    .filter(|&k| bytes[k].is_ascii_digit())
                    .collect();
                if digits.is_empty() {
                    return None;
                }
                let k = *rng.pick(&digits);
                let repl: [&str; 6] = ["0", "1", "2", "9", "99999999999", "-1"];
                let to = *rng.pick(&repl);
                lines[i].replace_range(k..k + 1, to);
            }
            5 => {
                // Cut a line short.
                let n = lines[i].len();
                let at = rng.below(n + 1);
                if lines[i].is_char_boundary(at) {
                    lines[i].truncate(at);
                }
            }
            _ => {
                // A line of another seed.
                if corpus.is_empty() {
                    return None;
                }
                let other = String::from_utf8_lossy(rng.pick(corpus).as_slice()).into_owned();
                let ol: Vec<&str> = other.lines().collect();
                if !ol.is_empty() {
                    lines.insert(i, rng.pick(&ol).to_string());
                }
            }
        }
        let mut out = lines.join("\n");
        out.push('\n');
        Some(out.into_bytes())
    }

    fn run(&self, _env: &Env, input: &[u8]) -> Verdict {
        match import_stablehlo(input, "fuzz.mlir", &BTreeMap::new()) {
            Ok(imported) => match ppir::verify::verify_module(&imported.module) {
                Ok(()) => rebound(input, &imported.module),
                // The lowering checks every result type against the module's, so what it
                // accepts verifies; a module that does not is a finding.
                Err(errors) => Verdict::Crash(format!(
                    "the imported module does not verify: {}",
                    errors.first().map(|e| e.to_string()).unwrap_or_default()
                )),
            },
            Err(e) => Verdict::Rejected(e.to_string()),
        }
    }
}

/// The largest parameter built to import a module again with its batch rebound.
const MAX_PARAM_ELEMENTS: u64 = 1 << 16;

/// Import `input` again with every argument but the last that is a small float tensor as a
/// parameter (zeros) and the batch rebound to 3 rows: what that accepts must verify.
fn rebound(input: &[u8], plain: &ppir::Module) -> Verdict {
    let Some(main) = plain.function("main") else {
        return Verdict::Accepted;
    };
    let args = main.args();
    let mut params = BTreeMap::new();
    for (i, &(v, _)) in args.iter().enumerate().take(args.len().saturating_sub(1)) {
        let ty = main.ty(v);
        let Some(n) = ty.num_elements().filter(|&n| n <= MAX_PARAM_ELEMENTS) else {
            return Verdict::Accepted;
        };
        if !ty.dtype.is_float() {
            continue;
        }
        let dims: Vec<usize> = ty
            .dims
            .iter()
            .filter_map(|d| d.known())
            .map(|d| d as usize)
            .collect();
        params.insert(
            format!("arg{i}"),
            ppir::Tensor::from_f64(ty.dtype, dims, vec![0.0; n as usize]),
        );
    }
    match import_stablehlo_with_batch(input, "fuzz.mlir", &params, Some(3)) {
        Ok(imported) => match ppir::verify::verify_module(&imported.module) {
            Ok(()) => Verdict::Accepted,
            Err(errors) => Verdict::Crash(format!(
                "the module imported with its batch rebound does not verify: {}",
                errors.first().map(|e| e.to_string()).unwrap_or_default()
            )),
        },
        Err(e) => Verdict::Rejected(e.to_string()),
    }
}
