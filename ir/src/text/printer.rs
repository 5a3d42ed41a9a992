//! The printer: modules, functions and ops to their canonical text (see the grammar in the
//! parent module). Printing never fails and never panics, even on a module the verifier
//! would reject.

use std::fmt::Write;

use super::{is_name_char, PrintOptions};
use crate::attr::{Attr, Attrs};
use crate::module::{ArgKind, Function, Module, OpId};
use crate::tensor::{Tensor, TensorData};
use crate::types::{DType, TensorType};

/// Tensors with at most this many elements print as a flat list, larger ones as hex.
pub(crate) const MAX_LIST_ELEMENTS: usize = 16;

/// The whole module, ending in a newline.
pub fn print_module(m: &Module, opts: &PrintOptions) -> String {
    let mut out = String::new();
    out.push_str("module");
    if let Some(name) = &m.name {
        out.push(' ');
        write_name(&mut out, '@', name);
    }
    out.push_str(" {\n");
    for f in &m.functions {
        write_function(&mut out, f, "  ");
    }
    for (name, t) in &m.weights {
        out.push_str("  weight ");
        write_name(&mut out, '@', name);
        let _ = write!(out, " : {} = ", t.tensor_type());
        match opts.elide_weights_over {
            Some(n) if t.data.len() > n => out.push_str("elided"),
            _ => write_dense(&mut out, t),
        }
        out.push('\n');
    }
    out.push_str("}\n");
    out
}

/// One function, unindented, ending in a newline.
pub fn print_function(f: &Function) -> String {
    let mut out = String::new();
    write_function(&mut out, f, "");
    out
}

/// One op on one line, without indentation or newline (for diagnostics).
pub fn print_op(f: &Function, op: OpId) -> String {
    let mut out = String::new();
    write_op(&mut out, f, op);
    out
}

fn write_function(out: &mut String, f: &Function, indent: &str) {
    out.push_str(indent);
    out.push_str("func ");
    write_name(out, '@', &f.name);
    out.push('(');
    for (i, &(v, kind)) in f.args().iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        write_name(out, '%', &f.value(v).name);
        let _ = write!(out, ": {}", f.ty(v));
        match kind {
            ArgKind::Input => {}
            ArgKind::Param => out.push_str(" {param}"),
            ArgKind::State => out.push_str(" {state}"),
        }
    }
    out.push_str(") -> (");
    write_types(out, &f.result_types());
    out.push(')');
    if !f.attrs.is_empty() {
        out.push_str(" attributes ");
        write_attr_dict(out, &f.attrs, None, None);
    }
    out.push_str(" {\n");
    for &op in f.ops() {
        let _ = write!(out, "{indent}  ");
        write_op(out, f, op);
        out.push('\n');
    }
    let _ = write!(out, "{indent}  return");
    if !f.results().is_empty() {
        out.push(' ');
        for (i, &v) in f.results().iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            write_name(out, '%', &f.value(v).name);
        }
        out.push_str(" : ");
        write_types(out, &f.result_types());
    }
    let _ = writeln!(out, "\n{indent}}}");
}

fn write_op(out: &mut String, f: &Function, id: OpId) {
    let op = f.op(id);
    for (i, &r) in op.results().iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        write_name(out, '%', &f.value(r).name);
    }
    if !op.results().is_empty() {
        out.push_str(" = ");
    }
    let _ = write!(out, "\"pp.{}\"(", op.kind.name());
    for (i, &v) in op.operands().iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        write_name(out, '%', &f.value(v).name);
    }
    out.push(')');
    if !op.attrs.is_empty() || op.stage.is_some() || op.phase.is_some() {
        out.push(' ');
        write_attr_dict(out, &op.attrs, op.stage, op.phase.map(|p| p.name()));
    }
    out.push_str(" : (");
    let operand_types: Vec<TensorType> = op.operands().iter().map(|&v| f.ty(v).clone()).collect();
    write_types(out, &operand_types);
    out.push_str(") -> ");
    let result_types: Vec<TensorType> = op.results().iter().map(|&v| f.ty(v).clone()).collect();
    if result_types.len() == 1 {
        let _ = write!(out, "{}", result_types[0]);
    } else {
        out.push('(');
        write_types(out, &result_types);
        out.push(')');
    }
    if let Some(loc) = &op.loc {
        out.push_str(" loc(");
        write_string(out, loc);
        out.push(')');
    }
}

fn write_types(out: &mut String, types: &[TensorType]) {
    for (i, t) in types.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let _ = write!(out, "{t}");
    }
}

/// `%name` / `@name`, or the quoted form when the name has other characters or is empty.
fn write_name(out: &mut String, sigil: char, name: &str) {
    out.push(sigil);
    if !name.is_empty() && name.chars().all(is_name_char) {
        out.push_str(name);
    } else {
        write_string(out, name);
    }
}

/// A string literal with `\"`, `\\`, `\n`, `\t` and `\XX` escapes for other control chars.
pub(crate) fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if c.is_ascii_control() => {
                let _ = write!(out, "\\{:02X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn is_bare_key(k: &str) -> bool {
    let mut chars = k.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '.'))
}

/// `{a = 1, b = [2]}`, then `stage` and `phase` when given (an op's annotations).
fn write_attr_dict(out: &mut String, attrs: &Attrs, stage: Option<u32>, phase: Option<&str>) {
    out.push('{');
    let mut first = true;
    let mut sep = |out: &mut String| {
        if !std::mem::take(&mut first) {
            out.push_str(", ");
        }
    };
    for (k, v) in attrs.iter() {
        sep(out);
        if is_bare_key(k) {
            out.push_str(k);
        } else {
            write_string(out, k);
        }
        out.push_str(" = ");
        write_attr(out, v);
    }
    if let Some(s) = stage {
        sep(out);
        let _ = write!(out, "stage = {s}");
    }
    if let Some(p) = phase {
        sep(out);
        let _ = write!(out, "phase = \"{p}\"");
    }
    out.push('}');
}

pub(crate) fn write_attr(out: &mut String, a: &Attr) {
    match a {
        Attr::Int(v) => {
            let _ = write!(out, "{v}");
        }
        Attr::Float(x) => write_f64(out, *x),
        Attr::Str(s) => write_string(out, s),
        Attr::Ints(v) => {
            out.push('[');
            for (i, x) in v.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                let _ = write!(out, "{x}");
            }
            out.push(']');
        }
        Attr::Floats(v) => {
            out.push('[');
            for (i, &x) in v.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_f64(out, x);
            }
            out.push(']');
        }
        Attr::DType(d) => out.push_str(d.name()),
        Attr::Tensor(t) => {
            write_dense(out, t);
            let _ = write!(out, " : {}", t.tensor_type());
        }
    }
}

/// Shortest form that reads back as the same `f64`, always with a `.` or an exponent.
fn write_f64(out: &mut String, x: f64) {
    if x.is_nan() {
        out.push_str("nan");
    } else if x.is_infinite() {
        out.push_str(if x > 0.0 { "inf" } else { "-inf" });
    } else {
        let _ = write!(out, "{x:?}");
    }
}

fn write_f32(out: &mut String, x: f32) {
    if x.is_nan() {
        out.push_str("nan");
    } else if x.is_infinite() {
        out.push_str(if x > 0.0 { "inf" } else { "-inf" });
    } else {
        let _ = write!(out, "{x:?}");
    }
}

/// `dense<[...]>` or `dense<"0x...">`, without the type.
pub(crate) fn write_dense(out: &mut String, t: &Tensor) {
    out.push_str("dense<");
    let n = t.data.len();
    if n <= MAX_LIST_ELEMENTS {
        out.push('[');
        if t.dtype.is_float() {
            for (i, x) in float_elems(t).enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                match t.dtype {
                    DType::F64 => write_f64(out, x),
                    // f16 and bf16 values are exact in f32, whose shortest form re-reads exactly.
                    _ => write_f32(out, x as f32),
                }
            }
        } else {
            for (i, x) in int_elems(t).enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                if t.dtype == DType::Bool {
                    out.push_str(if x != 0 { "true" } else { "false" });
                } else {
                    let _ = write!(out, "{x}");
                }
            }
        }
        out.push(']');
    } else {
        out.push_str("\"0x");
        let mut push = |bytes: &[u8]| {
            for b in bytes {
                let _ = write!(out, "{b:02X}");
            }
        };
        match t.dtype {
            DType::F64 => float_elems(t).for_each(|x| push(&x.to_le_bytes())),
            DType::F32 => float_elems(t).for_each(|x| push(&(x as f32).to_le_bytes())),
            DType::F16 => {
                float_elems(t).for_each(|x| push(&half::f16::from_f64(x).to_bits().to_le_bytes()))
            }
            DType::BF16 => {
                float_elems(t).for_each(|x| push(&half::bf16::from_f64(x).to_bits().to_le_bytes()))
            }
            DType::I64 => int_elems(t).for_each(|x| push(&x.to_le_bytes())),
            DType::I32 => int_elems(t).for_each(|x| push(&(x as i32).to_le_bytes())),
            DType::I8 => int_elems(t).for_each(|x| push(&(x as i8).to_le_bytes())),
            DType::Bool => int_elems(t).for_each(|x| push(&[(x != 0) as u8])),
        }
        out.push('"');
    }
    out.push('>');
}

/// Elements as f64 whatever the storage (storage that disagrees with the dtype is not this
/// module's business to reject).
fn float_elems(t: &Tensor) -> Box<dyn Iterator<Item = f64> + '_> {
    match &t.data {
        TensorData::Float(v) => Box::new(v.iter().copied()),
        TensorData::Int(v) => Box::new(v.iter().map(|&x| x as f64)),
    }
}

fn int_elems(t: &Tensor) -> Box<dyn Iterator<Item = i64> + '_> {
    match &t.data {
        TensorData::Int(v) => Box::new(v.iter().copied()),
        TensorData::Float(v) => Box::new(v.iter().map(|&x| x as i64)),
    }
}
