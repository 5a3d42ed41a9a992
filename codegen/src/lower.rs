//! Lowering of a ppir [`Function`] (static shapes, f32) to MLIR text in the `func`, `linalg`,
//! `tensor`, `arith` and `math` dialects.
//!
//! - `matmul` (2-D × 2-D) → `linalg.matmul`, (3-D × 3-D, same batch) → `linalg.batch_matmul`,
//!   both accumulating into a zero-filled `tensor.empty`.
//! - Elementwise ops → `linalg.generic` with all-parallel iterators. Operands broadcast with
//!   ppir's (numpy) rules: a size-1 operand dimension against a larger result dimension
//!   indexes with the constant 0, missing leading dimensions are dropped from the map.
//!   The body is built from a [`Scalar`] expression tree over the generic's block arguments,
//!   so fusing a chain of elementwise ops later means building one bigger tree (with more
//!   inputs) and emitting one generic.
//! - `reduce_sum` / `reduce_mean` → `linalg.generic` with reduction iterators into a
//!   zero-filled accumulator of the non-kept shape; `keepdims` = 1 re-inserts the unit
//!   dimensions with `tensor.expand_shape`; the mean divides in a second generic.
//! - `transpose` → `linalg.transpose`; `reshape` (also `flatten`, `squeeze`, `unsqueeze`,
//!   all of which only change a static shape) → `tensor.collapse_shape` to 1-D then
//!   `tensor.expand_shape`.
//! - `constant` → `arith.constant dense<...>`.
//!
//! Function arguments are marked `bufferization.writable = false` so one-shot
//! bufferization never writes into the caller's input buffers, and the function carries
//! `llvm.emit_c_interface` so LLVM lowering emits a `_mlir_ciface_<name>` wrapper taking
//! memref descriptors by pointer.

use std::fmt::Write as _;

use ppir::{DType, Function, OpKind, Tensor, TensorData, ValueId};

#[derive(Debug, thiserror::Error)]
pub enum LowerError {
    #[error("function `{function}`: op `{op}` ({value}) is not lowered to MLIR yet{detail}")]
    Unsupported {
        function: String,
        op: String,
        value: String,
        detail: String,
    },
    #[error(
        "function `{function}`: value `%{value}` has type {ty}; codegen needs static f32 tensors"
    )]
    Type {
        function: String,
        value: String,
        ty: String,
    },
    #[error("function `{function}`: op `{op}`: {message}")]
    Invalid {
        function: String,
        op: String,
        message: String,
    },
}

/// The static signature of a lowered function: input and output shapes in order (all
/// f32). After bufferization and `buffer-results-to-out-params` the C entry takes one
/// memref descriptor pointer per input, then one per output.
#[derive(Clone, Debug, PartialEq)]
pub struct Signature {
    pub name: String,
    pub inputs: Vec<Vec<u64>>,
    pub outputs: Vec<Vec<u64>>,
}

/// Lower one function to a complete MLIR module (text).
pub fn lower_function(f: &Function) -> Result<(String, Signature), LowerError> {
    let (body, sig) = lower_func_op(f)?;
    Ok((format!("module {{\n{body}}}\n"), sig))
}

/// Lower several functions into one MLIR module (one stage's `fwd`, `bwd_input`, ...).
pub fn lower_functions(fs: &[&Function]) -> Result<(String, Vec<Signature>), LowerError> {
    let mut text = String::from("module {\n");
    let mut sigs = Vec::new();
    for f in fs {
        let (body, sig) = lower_func_op(f)?;
        text.push_str(&body);
        sigs.push(sig);
    }
    text.push_str("}\n");
    Ok((text, sigs))
}

/// `tensor<2x3xf32>`, `tensor<f32>` for a scalar.
pub fn tensor_type(shape: &[u64]) -> String {
    let mut s = String::from("tensor<");
    for d in shape {
        write!(s, "{d}x").unwrap();
    }
    s.push_str("f32>");
    s
}

/// A scalar computation inside an elementwise `linalg.generic` body.
#[derive(Clone, Debug, PartialEq)]
pub enum Scalar {
    /// The i-th input block argument.
    Arg(usize),
    Const(f32),
    Unary(OpKind, Box<Scalar>),
    Binary(OpKind, Box<Scalar>, Box<Scalar>),
}

/// Whether [`Scalar`] can express `kind` (the elementwise ops this lowering supports).
pub fn is_supported_elementwise(kind: OpKind) -> bool {
    use OpKind::*;
    matches!(
        kind,
        Relu | Neg
            | Exp
            | Log
            | Tanh
            | Sqrt
            | Abs
            | Sigmoid
            | Reciprocal
            | Identity
            | Add
            | Sub
            | Mul
            | Div
            | Max
            | Min
            | Pow
    )
}

/// An MLIR float literal for an f32 value (always with a dot, or as raw bits).
fn f32_lit(x: f32) -> String {
    if x.is_finite() {
        format!("{x:.9e}")
    } else {
        format!("0x{:08X}", x.to_bits())
    }
}

fn fn_name_ok(name: &str) -> bool {
    !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

struct Emitter<'f> {
    f: &'f Function,
    /// SSA name of each ppir value once defined.
    names: Vec<Option<String>>,
    out: String,
    tmp: usize,
}

impl<'f> Emitter<'f> {
    fn fresh(&mut self) -> String {
        self.tmp += 1;
        format!("%t{}", self.tmp)
    }

    fn line(&mut self, s: &str) {
        self.out.push_str("    ");
        self.out.push_str(s);
        self.out.push('\n');
    }

    fn shape(&self, v: ValueId) -> Result<Vec<u64>, LowerError> {
        let ty = self.f.ty(v);
        match (ty.dtype, ty.static_shape()) {
            (DType::F32, Some(s)) => Ok(s),
            _ => Err(LowerError::Type {
                function: self.f.name.clone(),
                value: self.f.value(v).name.clone(),
                ty: ty.to_string(),
            }),
        }
    }

    /// The SSA name of `v`; a value used before its definition (IR that did not verify)
    /// gets a name MLIR rejects with a diagnostic, rather than a panic here.
    fn name(&self, v: ValueId) -> String {
        self.names
            .get(v.index())
            .cloned()
            .flatten()
            .unwrap_or_else(|| format!("%undefined_{}", v.index()))
    }

    /// `tensor.empty` + `linalg.fill` with 0.
    fn zeros(&mut self, shape: &[u64]) -> String {
        let ty = tensor_type(shape);
        let zero = self.fresh();
        self.line(&format!("{zero} = arith.constant 0.000000e+00 : f32"));
        let empty = self.fresh();
        self.line(&format!("{empty} = tensor.empty() : {ty}"));
        let filled = self.fresh();
        self.line(&format!(
            "{filled} = linalg.fill ins({zero} : f32) outs({empty} : {ty}) -> {ty}"
        ));
        filled
    }

    /// One elementwise `linalg.generic` over `inputs` (SSA name, shape) computing `body`
    /// into a fresh tensor of `out_shape`.
    fn generic_elementwise(
        &mut self,
        inputs: &[(String, Vec<u64>)],
        out_shape: &[u64],
        body: &Scalar,
    ) -> String {
        let rank = out_shape.len();
        let dims: Vec<String> = (0..rank).map(|i| format!("d{i}")).collect();
        let domain = format!("({})", dims.join(", "));
        let mut maps = Vec::new();
        for (_, s) in inputs {
            let lead = rank - s.len();
            let res: Vec<String> = s
                .iter()
                .enumerate()
                .map(|(j, &d)| {
                    if d == 1 && out_shape[lead + j] != 1 {
                        "0".to_string()
                    } else {
                        dims[lead + j].clone()
                    }
                })
                .collect();
            maps.push(format!("affine_map<{domain} -> ({})>", res.join(", ")));
        }
        maps.push(format!("affine_map<{domain} -> {domain}>"));
        let iters = vec!["\"parallel\""; rank].join(", ");
        let out_ty = tensor_type(out_shape);
        let init = self.fresh();
        self.line(&format!("{init} = tensor.empty() : {out_ty}"));
        let res = self.fresh();
        let ins_names: Vec<&str> = inputs.iter().map(|(n, _)| n.as_str()).collect();
        let ins_tys: Vec<String> = inputs.iter().map(|(_, s)| tensor_type(s)).collect();
        self.line(&format!(
            "{res} = linalg.generic {{indexing_maps = [{}], iterator_types = [{iters}]}} ins({} : {}) outs({init} : {out_ty}) {{",
            maps.join(", "),
            ins_names.join(", "),
            ins_tys.join(", "),
        ));
        let block_args: Vec<String> = (0..inputs.len()).map(|i| format!("%in{i}: f32")).collect();
        self.out.push_str(&format!(
            "    ^bb0({}, %out: f32):\n",
            block_args.join(", ")
        ));
        let mut body_lines = Vec::new();
        let mut counter = 0usize;
        let r = emit_scalar(body, &mut body_lines, &mut counter);
        for l in body_lines {
            self.line(&format!("  {l}"));
        }
        self.line(&format!("  linalg.yield {r} : f32"));
        self.line(&format!("}} -> {out_ty}"));
        res
    }

    fn reshape(&mut self, src: &str, from: &[u64], to: &[u64]) -> String {
        if from == to {
            return src.to_string();
        }
        // Collapse to 1-D (or rank 0) then expand to the target shape.
        let n: u64 = from.iter().product();
        let flat_shape: Vec<u64> = if to.is_empty() { vec![] } else { vec![n] };
        let flat = if from.len() == 1 && !to.is_empty() || from.is_empty() && to.is_empty() {
            src.to_string()
        } else if from.is_empty() {
            // rank 0 → 1-D: expand with an empty reassociation.
            let r = self.fresh();
            self.line(&format!(
                "{r} = tensor.expand_shape {src} [] output_shape [1] : {} into {}",
                tensor_type(from),
                tensor_type(&[1])
            ));
            r
        } else {
            let reassoc = if flat_shape.is_empty() {
                "[]".to_string()
            } else {
                let all: Vec<String> = (0..from.len()).map(|i| i.to_string()).collect();
                format!("[[{}]]", all.join(", "))
            };
            let r = self.fresh();
            self.line(&format!(
                "{r} = tensor.collapse_shape {src} {reassoc} : {} into {}",
                tensor_type(from),
                tensor_type(&flat_shape)
            ));
            r
        };
        if to.is_empty() || to.len() == 1 {
            return flat;
        }
        let all: Vec<String> = (0..to.len()).map(|i| i.to_string()).collect();
        let sizes: Vec<String> = to.iter().map(|d| d.to_string()).collect();
        let r = self.fresh();
        self.line(&format!(
            "{r} = tensor.expand_shape {flat} [[{}]] output_shape [{}] : {} into {}",
            all.join(", "),
            sizes.join(", "),
            tensor_type(&[n]),
            tensor_type(to)
        ));
        r
    }
}

/// Emit the body lines for `e`; returns the SSA name of its value.
fn emit_scalar(e: &Scalar, lines: &mut Vec<String>, counter: &mut usize) -> String {
    let fresh = |counter: &mut usize| {
        *counter += 1;
        format!("%s{counter}")
    };
    match e {
        Scalar::Arg(i) => format!("%in{i}"),
        Scalar::Const(c) => {
            let r = fresh(counter);
            lines.push(format!("{r} = arith.constant {} : f32", f32_lit(*c)));
            r
        }
        Scalar::Unary(kind, x) => {
            let a = emit_scalar(x, lines, counter);
            use OpKind::*;
            match kind {
                Identity => a,
                Relu => {
                    // ppir: `if a < 0 { 0 } else { a }` (NaN stays NaN).
                    let z = emit_scalar(&Scalar::Const(0.0), lines, counter);
                    let c = fresh(counter);
                    lines.push(format!("{c} = arith.cmpf olt, {a}, {z} : f32"));
                    let r = fresh(counter);
                    lines.push(format!("{r} = arith.select {c}, {z}, {a} : f32"));
                    r
                }
                Sigmoid => {
                    let one = emit_scalar(&Scalar::Const(1.0), lines, counter);
                    let n = fresh(counter);
                    lines.push(format!("{n} = arith.negf {a} : f32"));
                    let e = fresh(counter);
                    lines.push(format!("{e} = math.exp {n} : f32"));
                    let d = fresh(counter);
                    lines.push(format!("{d} = arith.addf {one}, {e} : f32"));
                    let r = fresh(counter);
                    lines.push(format!("{r} = arith.divf {one}, {d} : f32"));
                    r
                }
                Reciprocal => {
                    let one = emit_scalar(&Scalar::Const(1.0), lines, counter);
                    let r = fresh(counter);
                    lines.push(format!("{r} = arith.divf {one}, {a} : f32"));
                    r
                }
                _ => {
                    let op = match kind {
                        Neg => "arith.negf",
                        Exp => "math.exp",
                        Log => "math.log",
                        Tanh => "math.tanh",
                        Sqrt => "math.sqrt",
                        Abs => "math.absf",
                        _ => unreachable!("{kind} is not a supported unary op"),
                    };
                    let r = fresh(counter);
                    lines.push(format!("{r} = {op} {a} : f32"));
                    r
                }
            }
        }
        Scalar::Binary(kind, x, y) => {
            let a = emit_scalar(x, lines, counter);
            let b = emit_scalar(y, lines, counter);
            use OpKind::*;
            let op = match kind {
                Add => "arith.addf",
                Sub => "arith.subf",
                Mul => "arith.mulf",
                Div => "arith.divf",
                Max => "arith.maximumf",
                Min => "arith.minimumf",
                Pow => "math.powf",
                _ => unreachable!("{kind} is not a supported binary op"),
            };
            let r = fresh(counter);
            lines.push(format!("{r} = {op} {a}, {b} : f32"));
            r
        }
    }
}

fn norm_axes(axes: &[i64], rank: usize) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    for &a in axes {
        let a = if a < 0 { a + rank as i64 } else { a };
        if a < 0 || a >= rank as i64 {
            return None;
        }
        if !out.contains(&(a as usize)) {
            out.push(a as usize);
        }
    }
    out.sort_unstable();
    Some(out)
}

fn dense_constant(t: &Tensor) -> Option<String> {
    let TensorData::Float(v) = &t.data else {
        return None;
    };
    if t.dtype != DType::F32 {
        return None;
    }
    let shape: Vec<u64> = t.shape.iter().map(|&d| d as u64).collect();
    if !v.is_empty() && v.iter().all(|&x| x.to_bits() == v[0].to_bits()) {
        return Some(format!("dense<{}>", f32_lit(v[0] as f32)));
    }
    // Nested brackets in row-major order.
    fn nest(v: &[f64], shape: &[u64], s: &mut String) {
        if shape.is_empty() {
            s.push_str(&f32_lit(v[0] as f32));
            return;
        }
        let inner: u64 = shape[1..].iter().product();
        s.push('[');
        for i in 0..shape[0] {
            if i > 0 {
                s.push_str(", ");
            }
            let a = (i * inner) as usize;
            nest(&v[a..a + inner as usize], &shape[1..], s);
        }
        s.push(']');
    }
    let mut s = String::from("dense<");
    nest(v, &shape, &mut s);
    s.push('>');
    Some(s)
}

fn lower_func_op(f: &Function) -> Result<(String, Signature), LowerError> {
    let mut e = Emitter {
        f,
        names: vec![None; f.num_values()],
        out: String::new(),
        tmp: 0,
    };
    if !fn_name_ok(&f.name) {
        return Err(LowerError::Invalid {
            function: f.name.clone(),
            op: "func".into(),
            message: "function names must be [A-Za-z0-9_]+ to get a C entry".into(),
        });
    }
    let mut params = Vec::new();
    let mut inputs = Vec::new();
    for (i, v) in f.arg_values().enumerate() {
        let s = e.shape(v)?;
        params.push(format!(
            "%arg{i}: {} {{bufferization.writable = false}}",
            tensor_type(&s)
        ));
        e.names[v.index()] = Some(format!("%arg{i}"));
        inputs.push(s);
    }
    let mut outputs = Vec::new();
    for &v in f.results() {
        outputs.push(e.shape(v)?);
    }
    let res_tys: Vec<String> = outputs.iter().map(|s| tensor_type(s)).collect();

    for &op_id in f.ops() {
        let op = f.op(op_id);
        let kind = op.kind;
        let results = op.results().to_vec();
        let operands = op.operands().to_vec();
        let unsupported = |detail: String| LowerError::Unsupported {
            function: f.name.clone(),
            op: kind.to_string(),
            value: results
                .first()
                .map(|&r| format!("%{}", f.value(r).name))
                .unwrap_or_default(),
            detail,
        };
        let invalid = |message: String| LowerError::Invalid {
            function: f.name.clone(),
            op: kind.to_string(),
            message,
        };
        if results.len() != 1 {
            return Err(unsupported(String::new()));
        }
        let out_shape = e.shape(results[0])?;
        let mut in_shapes = Vec::new();
        for &v in &operands {
            in_shapes.push(e.shape(v)?);
        }
        let attr_err = |err: ppir::attr::AttrError| invalid(err.to_string());
        let res = if is_supported_elementwise(kind) {
            let ins: Vec<(String, Vec<u64>)> = operands
                .iter()
                .zip(&in_shapes)
                .map(|(&v, s)| (e.name(v), s.clone()))
                .collect();
            let body = match ins.len() {
                1 => Scalar::Unary(kind, Box::new(Scalar::Arg(0))),
                2 => Scalar::Binary(kind, Box::new(Scalar::Arg(0)), Box::new(Scalar::Arg(1))),
                n => return Err(invalid(format!("{n} operands"))),
            };
            if kind == OpKind::Identity {
                ins[0].0.clone()
            } else {
                e.generic_elementwise(&ins, &out_shape, &body)
            }
        } else {
            match kind {
                OpKind::MatMul => {
                    let (a, b) = (&in_shapes[0], &in_shapes[1]);
                    let name = match (a.len(), b.len()) {
                        (2, 2) => "linalg.matmul",
                        (3, 3) if a[0] == b[0] => "linalg.batch_matmul",
                        _ => {
                            return Err(unsupported(format!(
                                " (operand shapes {a:?} and {b:?}; only 2-D×2-D and \
                                 equal-batch 3-D×3-D are lowered)"
                            )))
                        }
                    };
                    let acc = e.zeros(&out_shape);
                    let r = e.fresh();
                    let (x, y) = (e.name(operands[0]), e.name(operands[1]));
                    e.line(&format!(
                        "{r} = {name} ins({x}, {y} : {}, {}) outs({acc} : {}) -> {}",
                        tensor_type(a),
                        tensor_type(b),
                        tensor_type(&out_shape),
                        tensor_type(&out_shape)
                    ));
                    r
                }
                OpKind::ReduceSum | OpKind::ReduceMean => {
                    let x = &in_shapes[0];
                    let rank = x.len();
                    let axes = op.attrs.ints_or("axes", vec![]).map_err(attr_err)?;
                    let axes = if axes.is_empty() {
                        (0..rank).collect()
                    } else {
                        norm_axes(&axes, rank)
                            .ok_or_else(|| invalid(format!("axes {axes:?} out of range")))?
                    };
                    let keepdims = op.attrs.int_or("keepdims", 1).map_err(attr_err)? != 0;
                    let reduced: Vec<u64> = (0..rank)
                        .filter(|i| !axes.contains(i))
                        .map(|i| x[i])
                        .collect();
                    let dims: Vec<String> = (0..rank).map(|i| format!("d{i}")).collect();
                    let domain = format!("({})", dims.join(", "));
                    let out_dims: Vec<String> = (0..rank)
                        .filter(|i| !axes.contains(i))
                        .map(|i| dims[i].clone())
                        .collect();
                    let iters: Vec<&str> = (0..rank)
                        .map(|i| {
                            if axes.contains(&i) {
                                "\"reduction\""
                            } else {
                                "\"parallel\""
                            }
                        })
                        .collect();
                    let acc = e.zeros(&reduced);
                    let r = e.fresh();
                    let src = e.name(operands[0]);
                    let red_ty = tensor_type(&reduced);
                    e.line(&format!(
                        "{r} = linalg.generic {{indexing_maps = [affine_map<{domain} -> {domain}>, affine_map<{domain} -> ({})>], iterator_types = [{}]}} ins({src} : {}) outs({acc} : {red_ty}) {{",
                        out_dims.join(", "),
                        iters.join(", "),
                        tensor_type(x),
                    ));
                    e.out.push_str("    ^bb0(%in0: f32, %out: f32):\n");
                    e.line("  %s1 = arith.addf %in0, %out : f32");
                    e.line("  linalg.yield %s1 : f32");
                    e.line(&format!("}} -> {red_ty}"));
                    let mut r = r;
                    if kind == OpKind::ReduceMean {
                        let count: u64 = axes.iter().map(|&a| x[a]).product();
                        r = e.generic_elementwise(
                            &[(r, reduced.clone())],
                            &reduced,
                            &Scalar::Binary(
                                OpKind::Div,
                                Box::new(Scalar::Arg(0)),
                                Box::new(Scalar::Const(count as f32)),
                            ),
                        );
                    }
                    if keepdims {
                        r = e.reshape(&r, &reduced, &out_shape);
                    }
                    r
                }
                OpKind::Transpose => {
                    let x = &in_shapes[0];
                    let rank = x.len();
                    let perm = match op.attrs.ints("perm").map_err(attr_err)? {
                        Some(p) => p,
                        None => (0..rank as i64).rev().collect(),
                    };
                    let perm: Vec<usize> = perm
                        .iter()
                        .map(|&p| if p < 0 { p + rank as i64 } else { p } as usize)
                        .collect();
                    let init = e.fresh();
                    let ty = tensor_type(&out_shape);
                    e.line(&format!("{init} = tensor.empty() : {ty}"));
                    let r = e.fresh();
                    let src = e.name(operands[0]);
                    let p: Vec<String> = perm.iter().map(|p| p.to_string()).collect();
                    e.line(&format!(
                        "{r} = linalg.transpose ins({src} : {}) outs({init} : {ty}) permutation = [{}]",
                        tensor_type(x),
                        p.join(", ")
                    ));
                    r
                }
                OpKind::Reshape | OpKind::Flatten | OpKind::Squeeze | OpKind::Unsqueeze => {
                    let src = e.name(operands[0]);
                    let from = in_shapes[0].clone();
                    let to = out_shape.clone();
                    if from.iter().product::<u64>() != to.iter().product::<u64>() {
                        return Err(invalid(format!("cannot reshape {from:?} to {to:?}")));
                    }
                    e.reshape(&src, &from, &to)
                }
                OpKind::Constant => {
                    let t = op
                        .attrs
                        .tensor("value")
                        .map_err(attr_err)?
                        .ok_or_else(|| invalid("missing `value`".into()))?;
                    let lit = dense_constant(t)
                        .ok_or_else(|| unsupported(format!(" (constant of dtype {})", t.dtype)))?;
                    let r = e.fresh();
                    e.line(&format!(
                        "{r} = arith.constant {lit} : {}",
                        tensor_type(&out_shape)
                    ));
                    r
                }
                _ => return Err(unsupported(String::new())),
            }
        };
        e.names[results[0].index()] = Some(res);
    }
    let ret: Vec<String> = f.results().iter().map(|&v| e.name(v)).collect();
    if ret.is_empty() {
        e.line("return");
    } else {
        e.line(&format!(
            "return {} : {}",
            ret.join(", "),
            res_tys.join(", ")
        ));
    }
    let text = format!(
        "  func.func @{}({}) -> ({}) attributes {{llvm.emit_c_interface}} {{\n{}  }}\n",
        f.name,
        params.join(", "),
        res_tys.join(", "),
        e.out
    );
    Ok((
        text,
        Signature {
            name: f.name.clone(),
            inputs,
            outputs,
        },
    ))
}
