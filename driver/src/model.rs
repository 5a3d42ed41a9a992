//! Loading a model file: ONNX, or a StableHLO module (`.mlir`, or text that looks like
//! MLIR) with its trainable arguments from `--params P.npz` (keyed `arg<i>`).

use std::collections::BTreeMap;
use std::path::Path;

use ppcc_frontends::onnx::{import_onnx_file_full, ImportOptions, Imported};
use ppcc_frontends::stablehlo::{import_stablehlo_with_batch, looks_like_mlir};

use crate::error::{bail, Context, Result};

/// The format of a model file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Onnx,
    /// Static shapes: the exported batch is the model's batch.
    StableHlo,
}

/// The format of `path`: `.mlir` files and files that start like MLIR (text or
/// bytecode) are StableHLO, anything else ONNX.
pub fn format_of(path: &Path) -> Format {
    if path
        .extension()
        .is_some_and(|e| e == "mlir" || e == "mlirbc")
    {
        return Format::StableHlo;
    }
    let mut head = [0u8; 256];
    let n = std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read(&mut f, &mut head))
        .unwrap_or(0);
    if looks_like_mlir(&head[..n]) {
        Format::StableHlo
    } else {
        Format::Onnx
    }
}

/// Import `path` (ONNX with `opts`, or StableHLO with the parameters in `params`).
pub fn import_model(
    path: &Path,
    params: Option<&Path>,
    opts: &ImportOptions,
) -> Result<(Imported, Format)> {
    match format_of(path) {
        Format::Onnx => {
            if let Some(p) = params {
                bail!(
                    "--params {} is for StableHLO modules; the ONNX model {} carries its own weights",
                    p.display(),
                    path.display()
                );
            }
            let imported = import_onnx_file_full(path, opts)
                .with_context(|| format!("importing {}", path.display()))?;
            Ok((imported, Format::Onnx))
        }
        // `opts.batch` (`--batch` of `ppcc import`/`eval`) rebinds the module's batch.
        Format::StableHlo => Ok((
            import_stablehlo_model(path, params, opts.batch)?,
            Format::StableHlo,
        )),
    }
}

/// Import the StableHLO module at `path` with the parameters in `params`; with `batch`,
/// the data inputs' batch is rebound to that many rows (an error names the op that fixes
/// the exported batch).
pub fn import_stablehlo_model(
    path: &Path,
    params: Option<&Path>,
    batch: Option<u64>,
) -> Result<Imported> {
    let mut weights = BTreeMap::new();
    if let Some(p) = params {
        for (k, t) in ppcc_runtime::npz::read_npz(p)? {
            weights.insert(k, t);
        }
    }
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let imported =
        import_stablehlo_with_batch(&bytes, &path.display().to_string(), &weights, batch).map_err(
            |e| match params {
                Some(p) if e.kind == ppcc_frontends::stablehlo::ErrorKind::Params => {
                    crate::error::invalid!("{}: {}", p.display(), e.message)
                }
                _ => crate::DriverError::StableHlo(e),
            },
        )?;
    Ok(imported)
}
