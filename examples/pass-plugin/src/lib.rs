//! An example ppcc pass plugin, `libppcc_example_plugin.so`, with two passes:
//!
//! - `op-stats{function=NAME,sort=flops|bytes|count|name,output=FILE}`: a per-op-kind table
//!   of op counts, FLOPs and bytes moved (ppcc's cost model), per function, written to stderr
//!   (or to FILE); the module is returned unchanged. Where does the work of a model sit?
//! - `fold-neutral`: `x + 0`, `0 + x`, `x - 0`, `x * 1`, `1 * x`, `x / 1` and `x ^ 1`
//!   become `x` when the constant is a splat and the result has `x`'s exact type (so no
//!   broadcast is lost). `x + 0` ignores the sign of zero (`-0 + 0` is `+0`), as `nsz`
//!   fast-math does; ONNX exporters leave such ops behind (bias-free layers, scale 1).
//!
//! Build with `cargo build -p ppcc-example-plugin` (or `cargo build --release`), then
//! `ppcc-opt model.ppir --load-pass-plugin target/debug/libppcc_example_plugin.so --pass op-stats`.
//! Everything plugin-specific is the [`ppcc_plugin::declare_plugin!`] at the end: the passes
//! themselves are plain functions over [`ppir::Module`].

use std::collections::BTreeMap;
use std::fmt::Write as _;

use ppcc_plugin::{Options, OptionsError};
use ppir::{Function, Module, OpKind, Tensor, TensorData, ValueId};

/// Why a pass of this plugin refused its input.
#[derive(Debug, thiserror::Error)]
pub enum ExampleError {
    #[error(transparent)]
    Options(#[from] OptionsError),
    #[error("no function @{0} in the module")]
    NoFunction(String),
    #[error("option `sort`: expected flops, bytes, count or name, got `{0}`")]
    BadSort(String),
    #[error("cannot write the report to {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
}

/// One row of the op-stats table.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KindStats {
    pub count: usize,
    pub flops: f64,
    pub bytes: f64,
    /// Ops the cost model could not cost (symbolic `?` dimensions).
    pub uncosted: usize,
}

/// Per op kind (`pp.matmul`, ...), the totals of one function.
pub fn function_stats(f: &Function) -> BTreeMap<String, KindStats> {
    let mut rows: BTreeMap<String, KindStats> = BTreeMap::new();
    for &op in f.ops() {
        let row = rows.entry(f.op(op).kind.to_string()).or_default();
        row.count += 1;
        match ppcc_passes::cost::op_cost(f, op) {
            Ok(c) => {
                row.flops += c.flops;
                row.bytes += c.bytes();
            }
            Err(_) => row.uncosted += 1,
        }
    }
    rows
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SortBy {
    Flops,
    Bytes,
    Count,
    Name,
}

/// The op-stats report of `f` as a table.
fn report(f: &Function, sort: SortBy) -> String {
    let rows = function_stats(f);
    let mut rows: Vec<(String, KindStats)> = rows.into_iter().collect();
    // Largest first; ties (and `name`) by kind, so the table is deterministic.
    rows.sort_by(|(an, a), (bn, b)| {
        let key = |s: &KindStats| match sort {
            SortBy::Flops => s.flops,
            SortBy::Bytes => s.bytes,
            SortBy::Count => s.count as f64,
            SortBy::Name => 0.0,
        };
        key(b).total_cmp(&key(a)).then_with(|| an.cmp(bn))
    });
    let total = rows.iter().fold(KindStats::default(), |mut t, (_, s)| {
        t.count += s.count;
        t.flops += s.flops;
        t.bytes += s.bytes;
        t.uncosted += s.uncosted;
        t
    });
    let mut out = format!("op-stats @{}: {} ops\n", f.name, total.count);
    let _ = writeln!(
        out,
        "  {:<28} {:>8} {:>16} {:>16}",
        "op", "count", "flops", "bytes"
    );
    let line = |out: &mut String, name: &str, s: &KindStats| {
        let _ = writeln!(
            out,
            "  {:<28} {:>8} {:>16.0} {:>16.0}",
            name, s.count, s.flops, s.bytes
        );
    };
    for (name, s) in &rows {
        line(&mut out, name, s);
    }
    line(&mut out, "total", &total);
    if total.uncosted > 0 {
        let _ = writeln!(
            out,
            "  ({} ops not costed: symbolic dimensions; bind-batch first)",
            total.uncosted
        );
    }
    out
}

/// `op-stats`: report, return the module unchanged.
pub fn op_stats(module: Module, options: &str) -> Result<Module, ExampleError> {
    let options = Options::parse(options)?;
    options.expect_only(&["function", "sort", "output"])?;
    let sort = match options.get("sort").unwrap_or("flops") {
        "flops" => SortBy::Flops,
        "bytes" => SortBy::Bytes,
        "count" => SortBy::Count,
        "name" => SortBy::Name,
        other => return Err(ExampleError::BadSort(other.to_string())),
    };
    let functions: Vec<&Function> = match options.get("function") {
        Some(name) => vec![module
            .function(name)
            .ok_or_else(|| ExampleError::NoFunction(name.to_string()))?],
        None => module.functions.iter().collect(),
    };
    let text: String = functions.iter().map(|f| report(f, sort)).collect();
    match options.get("output") {
        Some(path) => std::fs::write(path, text).map_err(|source| ExampleError::Write {
            path: path.to_string(),
            source,
        })?,
        None => eprint!("{text}"),
    }
    Ok(module)
}

/// The splat value of `v` if a `pp.constant` with all elements equal produces it.
fn splat(f: &Function, v: ValueId) -> Option<f64> {
    let op = f.op(f.producer(v)?);
    if op.kind != OpKind::Constant {
        return None;
    }
    let t: &Tensor = ppir::ops::attrs::ConstantAttrs::value_ref(&op.attrs).ok()?;
    let first = match &t.data {
        TensorData::Float(d) => *d.first()?,
        TensorData::Int(d) => *d.first()? as f64,
    };
    let all = match &t.data {
        TensorData::Float(d) => d.iter().all(|&x| x == first),
        TensorData::Int(d) => d.iter().all(|&x| x as f64 == first),
    };
    all.then_some(first)
}

/// `fold-neutral` on one function; returns how many ops it removed.
pub fn fold_neutral_function(f: &mut Function) -> usize {
    let mut removed = 0;
    for op in f.ops().to_vec() {
        let data = f.op(op);
        if data.is_removed() || data.operands().len() != 2 || data.results().len() != 1 {
            continue;
        }
        let (a, b, y) = (data.operands()[0], data.operands()[1], data.results()[0]);
        let is = |v: ValueId, n: f64| splat(f, v) == Some(n);
        let kept = match data.kind {
            OpKind::Add if is(b, 0.0) => Some(a),
            OpKind::Add if is(a, 0.0) => Some(b),
            OpKind::Sub if is(b, 0.0) => Some(a),
            OpKind::Mul if is(b, 1.0) => Some(a),
            OpKind::Mul if is(a, 1.0) => Some(b),
            OpKind::Div | OpKind::Pow if is(b, 1.0) => Some(a),
            _ => None,
        };
        // A broadcasting op (x: [3], 0: [2,3]) or a type-changing one is real work.
        let Some(x) = kept.filter(|&x| f.ty(x) == f.ty(y)) else {
            continue;
        };
        let constant = if x == a { b } else { a };
        f.replace_all_uses(y, x);
        f.remove_op(op);
        removed += 1;
        if let Some(c) = f.producer(constant) {
            if f.users(constant).is_empty() {
                f.remove_op(c);
            }
        }
    }
    removed
}

/// `fold-neutral`: see the crate docs.
pub fn fold_neutral(mut module: Module, options: &str) -> Result<Module, ExampleError> {
    Options::parse(options)?.expect_only(&[])?;
    for f in &mut module.functions {
        fold_neutral_function(f);
    }
    Ok(module)
}

ppcc_plugin::declare_plugin! {
    name: "example",
    version: env!("CARGO_PKG_VERSION"),
    passes: [
        {
            name: "op-stats",
            description: "print per-op-kind counts, FLOPs and bytes of each function to stderr; the module is unchanged: op-stats{function=NAME,sort=flops|bytes|count|name,output=FILE}",
            run: op_stats,
        },
        {
            name: "fold-neutral",
            description: "x+0, 0+x, x-0, x*1, 1*x, x/1, x^1 become x (splat constants, same result type)",
            run: fold_neutral,
        },
    ],
}

#[cfg(test)]
mod tests {
    use super::*;
    use ppir::text::parse_module;

    const MODEL: &str = r#"module {
  func @main(%x: tensor<2x3xf32>, %w: tensor<3x4xf32>) -> (tensor<2x4xf32>, tensor<2x3xf32>) {
    %one = "pp.constant"() {value = dense<[1.0]> : tensor<f32>} : () -> tensor<f32>
    %zero = "pp.constant"() {value = dense<[0.0, 0.0, 0.0]> : tensor<3xf32>} : () -> tensor<3xf32>
    %big = "pp.constant"() {value = dense<[0.0, 0.0, 0.0, 0.0]> : tensor<4x1x1xf32>} : () -> tensor<4x1x1xf32>
    %a = "pp.mul"(%x, %one) : (tensor<2x3xf32>, tensor<f32>) -> tensor<2x3xf32>
    %b = "pp.add"(%zero, %a) : (tensor<3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
    %c = "pp.add"(%b, %big) : (tensor<2x3xf32>, tensor<4x1x1xf32>) -> tensor<4x2x3xf32>
    %y = "pp.matmul"(%b, %w) : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32>
    %z = "pp.sub"(%one, %x) : (tensor<f32>, tensor<2x3xf32>) -> tensor<2x3xf32>
    return %y, %z : tensor<2x4xf32>, tensor<2x3xf32>
  }
}
"#;

    #[test]
    fn fold_neutral_forwards_only_same_type_neutral_ops() {
        let mut m = parse_module(MODEL).unwrap();
        let f = m.function_mut("main").unwrap();
        // mul x,1 and add 0,a go; add b,big broadcasts (dead, but not ours to remove);
        // sub 1,x is not neutral.
        assert_eq!(fold_neutral_function(f), 2);
        let kinds: Vec<OpKind> = f.ops().iter().map(|&o| f.op(o).kind).collect();
        assert_eq!(
            kinds,
            [
                OpKind::Constant,
                OpKind::Constant,
                OpKind::Add,
                OpKind::MatMul,
                OpKind::Sub
            ]
        );
        let mm = f.ops()[3];
        assert_eq!(f.op(mm).operands()[0], f.arg_values().next().unwrap());
        ppir::verify::verify_module(&m).unwrap();
    }

    #[test]
    fn op_stats_counts_flops_and_bytes() {
        let m = parse_module(MODEL).unwrap();
        let rows = function_stats(m.function("main").unwrap());
        let mm = &rows["pp.matmul"];
        assert_eq!(mm.count, 1);
        assert_eq!(mm.flops, 2.0 * 2.0 * 3.0 * 4.0);
        assert_eq!(mm.bytes, 4.0 * (6.0 + 12.0 + 8.0));
        assert_eq!(rows["pp.constant"].count, 3);
        assert_eq!(rows["pp.add"].count, 2);
        let text = report(m.function("main").unwrap(), SortBy::Flops);
        assert!(text.starts_with("op-stats @main: 8 ops\n"), "{text}");
        let e = op_stats(m.clone(), "function=nope")
            .unwrap_err()
            .to_string();
        assert_eq!(e, "no function @nope in the module");
        let e = op_stats(m, "sort=size").unwrap_err().to_string();
        assert!(e.contains("expected flops"), "{e}");
    }
}
