//! Truncated and bit-flipped copies of every model bundled with the onnx package must give
//! an error or a module, never a panic.
//!
//! Needs the onnx package's test data: `PPCC_ONNX_TESTDATA` or `PPCC_PYTHON` (see
//! `common::onnx_testdata`); without either the test fails rather than skipping.

mod common;

use std::path::{Path, PathBuf};

use ppcc_frontends::onnx::{import_onnx, ImportOptions};

/// Every `.onnx` file of the bundled test sets.
fn bundled_models(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    for set in ["light", "pytorch-converted", "pytorch-operator", "simple"] {
        let dir = root.join(set);
        let mut stack = vec![dir.clone()];
        while let Some(d) = stack.pop() {
            for e in
                std::fs::read_dir(&d).unwrap_or_else(|e| panic!("cannot read {}: {e}", d.display()))
            {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.extension().is_some_and(|x| x == "onnx") {
                    out.push(p);
                }
            }
        }
    }
    out.sort();
    out
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// The mutations of one model: (description, bytes).
fn mutations(bytes: &[u8], seed: u64) -> Vec<(String, Vec<u8>)> {
    let n = bytes.len();
    let mut out = vec![];
    let mut cuts: Vec<usize> = (0..n.min(64)).collect();
    cuts.extend((1..32).map(|k| n * k / 32));
    cuts.push(n.saturating_sub(1));
    cuts.sort();
    cuts.dedup();
    for c in cuts {
        out.push((format!("truncated to {c} bytes"), bytes[..c].to_vec()));
    }
    let mut rng = Rng(seed | 1);
    for i in 0..96 {
        let mut b = bytes.to_vec();
        if n == 0 {
            break;
        }
        let flips = 1 + rng.below(4);
        let mut desc = vec![];
        for _ in 0..flips {
            let pos = rng.below(n);
            if i % 4 == 3 {
                // Whole-byte overwrites hit varint lengths and tags harder than single bits.
                b[pos] = [0xFF, 0x00, 0x7F, 0x80][rng.below(4)];
                desc.push(format!("byte {pos} set to {:#x}", b[pos]));
            } else {
                let bit = rng.below(8);
                b[pos] ^= 1 << bit;
                desc.push(format!("bit {bit} of byte {pos} flipped"));
            }
        }
        out.push((desc.join(", "), b));
    }
    out
}

#[test]
fn mutated_bundled_models_never_panic() {
    let root = common::onnx_testdata();
    let models = bundled_models(&root);
    assert!(
        models.len() >= 100,
        "found only {} bundled models under {}",
        models.len(),
        root.display()
    );
    // Keep the panic messages for the report, not on stderr.
    std::panic::set_hook(Box::new(|_| {}));
    let mut panics = vec![];
    let mut imported = 0usize;
    let mut total = 0usize;
    for (k, path) in models.iter().enumerate() {
        let bytes = std::fs::read(path).unwrap();
        for (desc, mutated) in mutations(&bytes, 0x9E37_79B9_7F4A_7C15 ^ k as u64) {
            total += 1;
            for opts in [
                ImportOptions::default(),
                ImportOptions {
                    batch: Some(2),
                    ..Default::default()
                },
            ] {
                let r = std::panic::catch_unwind(|| import_onnx(&mutated, &opts).is_ok());
                match r {
                    Ok(ok) => imported += ok as usize,
                    Err(p) => {
                        let msg = p
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_default();
                        panics.push(format!("{} ({desc}): {msg}", path.display()));
                    }
                }
            }
        }
    }
    let _ = std::panic::take_hook();
    eprintln!(
        "{total} mutated models, {imported} imports succeeded, {} panics",
        panics.len()
    );
    assert!(
        panics.is_empty(),
        "{} panics:\n{}",
        panics.len(),
        panics
            .iter()
            .take(30)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}
