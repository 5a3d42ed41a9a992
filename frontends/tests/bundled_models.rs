//! Every model bundled with the onnx package (and the repository's examples) imports into
//! a module that verifies, and whose printed form parses back to the same text.
//!
//! Needs the onnx package's test data: `PPCC_ONNX_TESTDATA` or `PPCC_PYTHON`.

mod common;

use std::path::PathBuf;

use ppcc_frontends::onnx::{import_onnx_file, ImportOptions};
use ppir::text::{parse_module, print_module, PrintOptions};

#[test]
fn bundled_models_import_verify_and_round_trip() {
    let root = common::onnx_testdata();
    let mut models: Vec<PathBuf> = vec![];
    for set in ["light", "pytorch-converted", "pytorch-operator", "simple"] {
        for e in std::fs::read_dir(root.join(set)).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                models.push(p.join("model.onnx"));
            } else if p.extension().is_some_and(|x| x == "onnx") {
                models.push(p);
            }
        }
    }
    let examples = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples");
    if let Ok(rd) = std::fs::read_dir(&examples) {
        models.extend(
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "onnx")),
        );
    }
    models.sort();
    let (mut imported, mut unsupported) = (0, vec![]);
    for path in &models {
        let m = match import_onnx_file(path, &ImportOptions::default()) {
            Ok(m) => m,
            Err(e) if e.is_unsupported() => {
                unsupported.push(format!("{}: {}", path.display(), e.short()));
                continue;
            }
            Err(e) => panic!("{}: {e}", path.display()),
        };
        imported += 1;
        if let Err(errors) = ppir::verify::verify_module(&m) {
            panic!(
                "{} does not verify: {:?}",
                path.display(),
                errors.iter().map(|e| e.to_string()).collect::<Vec<_>>()
            );
        }
        let text = print_module(&m, &PrintOptions::default());
        let back = parse_module(&text)
            .unwrap_or_else(|e| panic!("{}: printed IR does not parse: {e}", path.display()));
        assert_eq!(
            print_module(&back, &PrintOptions::default()),
            text,
            "{}",
            path.display()
        );
        assert_eq!(back.weights, m.weights, "{}", path.display());
    }
    eprintln!(
        "{imported} imported; unsupported:\n{}",
        unsupported.join("\n")
    );
    // Expected unsupported without input values: 6 string models, 2 training-domain
    // `Gradient` models, and 4 whose Expand target is a graph input (conform folds those).
    assert!(unsupported.len() <= 12, "{}", unsupported.join("\n"));
    assert!(imported >= 130);
}
