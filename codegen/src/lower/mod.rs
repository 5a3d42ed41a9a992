//! Lowering of ppir [`Function`]s (static shapes) to MLIR text in the `func`, `linalg`,
//! `tensor`, `arith`, `math`, `bufferization`, `memref` and `llvm` dialects.
//!
//! One submodule per op family, each a function `lower(e, op) -> Result<Vec<String>>`
//! returning the SSA names of the op's results:
//!
//! | module | ops |
//! | --- | --- |
//! | [`elementwise`] | unary, binary, comparisons, logical, `where`, `cast`, `clip`, `dropout`, ... (one `linalg.generic` each, numpy broadcasting in the indexing maps) |
//! | [`contraction`] | `matmul`, `gemm`, `conv`, `conv_transpose`, `conv_grad_weight` |
//! | [`pool`] | `max_pool`, `avg_pool`, `global_*_pool` and their gradients |
//! | [`norm`] | `batch_norm`, `instance_norm`, `layer_norm`, `lrn`, `softmax`, `log_softmax`, `softmax_cross_entropy[_grad]` |
//! | [`reduce`] | `reduce_sum`, `reduce_mean`, `reduce_max`, `reduce_min` |
//! | [`movement`] | reshapes, `transpose`, `concat`, `split`, `slice[_grad]`, `gather[_grad]`, `expand`, `pad`, `tile`, `constant` |
//! | [`comm`] | `send`, `recv` (calls into the runtime through the context pointer) |
//!
//! # The ABI of a lowered function
//!
//! `func.func @<name>(%ctx: !llvm.ptr, %arg0: tensor<..>, ...) -> (tensor<..>, ...)` with
//! `llvm.emit_c_interface`; the arguments are marked `bufferization.writable = false` so
//! bufferization never writes into the caller's buffers. After the CPU pipeline
//! ([`crate::compile`]) results become caller-allocated out-parameters, and
//! [`crate::compile`] adds `void ppcc_call_<name>(void *ctx, void **descriptors)` (`<name>`
//! is [`ppir::abi::mangle`]d: `stage0.fwd` → `stage0_2efwd`) taking one
//! pointer per input then per output, each to a ranked memref descriptor
//! `{T *allocated, T *aligned, i64 offset, i64 sizes[r], i64 strides[r]}` of a dense
//! row-major buffer. `ctx` points at [`CTX_LAYOUT`]: the runtime's send, receive and all-reduce
//! callbacks (see [`comm`]).

use std::fmt::Write as _;

use ppir::ops::{OpAttrs, OpClass};
use ppir::{DType, Function, OpData, OpId, OpKind, ValueId};

pub mod comm;
pub mod contraction;
pub mod elementwise;
pub mod fuse;
pub mod mathfn;
pub mod movement;
pub mod norm;
pub mod pool;
pub mod reduce;

/// The suffix of an outlined op function's support-library version (CPU): `@main__op3` in
/// `linalg`, `@main__op3__lib` calling `ppcc_sgemm`. See [`crate::compile::use_library_routines`].
pub const LIBRARY_SUFFIX: &str = "__lib";

/// What the context pointer passed to every entry points at (C layout):
/// `struct { int32_t (*send)(void *ctx, int64_t peer, int64_t channel, void *data);
///           int32_t (*recv)(void *ctx, int64_t peer, int64_t channel, void *data); }`
/// followed by whatever the runtime keeps there. `data` is the first element of a dense
/// row-major buffer of the op's type.
pub const CTX_LAYOUT: &str = "!llvm.struct<(ptr, ptr, ptr)>";

#[derive(Debug, thiserror::Error)]
pub enum LowerError {
    #[error("function `{function}`: op `{op}` ({value}{loc}) is not lowered to MLIR yet{detail}")]
    Unsupported {
        function: String,
        op: String,
        value: String,
        loc: String,
        detail: String,
    },
    #[error("function `{function}`: value `%{value}` has type {ty}; codegen needs {need}")]
    Type {
        function: String,
        value: String,
        ty: String,
        need: String,
    },
    #[error("function `{function}`: op `{op}` ({value}{loc}): {message}")]
    Invalid {
        function: String,
        op: String,
        value: String,
        loc: String,
        message: String,
    },
}

/// The static signature of a lowered function: input and output types in order. After
/// bufferization the entry takes one descriptor pointer per input, then one per output.
#[derive(Clone, Debug, PartialEq)]
pub struct Signature {
    pub name: String,
    pub inputs: Vec<(DType, Vec<u64>)>,
    pub outputs: Vec<(DType, Vec<u64>)>,
}

impl Signature {
    /// A one-line spelling (`f32[4,8] i64[4] -> f32[]`, [`ppir::abi::signature_text`])
    /// compiled into the module as `ppcc_sig_<name>`, so a loader can check that a `.so`
    /// matches the IR it was given.
    pub fn text(&self) -> String {
        ppir::abi::signature_text(
            self.inputs.iter().map(|(d, s)| (*d, s.as_slice())),
            self.outputs.iter().map(|(d, s)| (*d, s.as_slice())),
        )
    }

    /// The MLIR function's name: [`ppir::abi::mangle`] of the ppir name.
    pub fn symbol(&self) -> String {
        ppir::abi::mangle(&self.name)
    }
}

/// Lower one function to a complete MLIR module (text).
pub fn lower_function(f: &Function) -> Result<(String, Signature), LowerError> {
    lower_functions(&[f]).map(|(t, mut s)| (t, s.remove(0)))
}

/// How to lower.
#[derive(Clone, Copy, Debug)]
pub struct LowerOptions {
    /// Time every outlined op call: `ppcc_prof_begin`/`ppcc_prof_end` (`support.c`) around
    /// it add its nanoseconds to a per-op-id counter that `ppcc_prof_take` reads (the
    /// runtime's `NativeModule::take_op_profile`). Ops fused into another op count as
    /// part of it; reshapes, constants and send/recv are not timed.
    pub profile_ops: bool,
    /// Hand matrix products, softmax rows and layer-norm rows to the support library
    /// (`support.c`) through raw pointers, where it is faster than the loops linalg
    /// leaves. `false` keeps every op in `linalg` on tensors: what the CUDA target needs
    /// (its kernels are those loops), and how the CPU can run the same loops.
    pub library_calls: bool,
    /// With `library_calls`: library versions for matrix products only, in the form the
    /// CUDA target hands to the GPU's BLAS (`--gpu-gemm cublas`): any C0 is first broadcast
    /// into the result by a `linalg.generic` on its buffer (a kernel on the GPU) and the
    /// GEMM accumulates into it in place (C0 = C), so the library call takes device buffers
    /// and nothing else; softmax and layer norm stay in `linalg`, and constants are built
    /// as without the library (kernels cannot read the module's globals). The calls still
    /// name `ppcc_sgemm`/`ppcc_dgemm`: the CUDA pipeline renames them to the GPU's
    /// (`ppcc_gpu_sgemm`/`ppcc_gpu_dgemm`, [`crate::compile`]), and a CPU build of the
    /// same code runs them with the support library, which is how the tests check this
    /// form without a GPU.
    pub gpu_gemm: bool,
}

impl Default for LowerOptions {
    fn default() -> Self {
        LowerOptions {
            profile_ops: false,
            library_calls: true,
            gpu_gemm: false,
        }
    }
}

/// Lower several functions into one MLIR module (one stage's `fwd`, `bwd_input`, ...).
pub fn lower_functions(fs: &[&Function]) -> Result<(String, Vec<Signature>), LowerError> {
    lower_functions_with(fs, &LowerOptions::default())
}

/// [`lower_functions`] with options.
pub fn lower_functions_with(
    fs: &[&Function],
    opts: &LowerOptions,
) -> Result<(String, Vec<Signature>), LowerError> {
    let mut bodies = String::new();
    let mut decls: Vec<String> = Vec::new();
    let mut sigs = Vec::new();
    for f in fs {
        let (body, sig, ds) = lower_func_op(f, opts)?;
        bodies.push_str(&body);
        for d in ds {
            if !decls.contains(&d) {
                decls.push(d);
            }
        }
        sigs.push(sig);
    }
    let mut text = String::from("module {\n");
    for d in &decls {
        text.push_str("  ");
        text.push_str(d);
        text.push_str(" loc(\"ppcc runtime support\")\n");
    }
    text.push_str(&bodies);
    text.push_str("}\n");
    Ok((text, sigs))
}

/// The MLIR element type of a dtype (`i1` for bool).
pub fn elem_type(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::F64 => "f64",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::I64 => "i64",
        DType::I32 => "i32",
        DType::I8 => "i8",
        DType::Bool => "i1",
    }
}

/// `tensor<2x3xf32>`, `tensor<f32>` for a scalar.
pub fn tensor_type(shape: &[u64], d: DType) -> String {
    let mut s = String::from("tensor<");
    for x in shape {
        write!(s, "{x}x").unwrap();
    }
    s.push_str(elem_type(d));
    s.push('>');
    s
}

/// `memref<2x3xf32>`.
pub fn memref_type(shape: &[u64], d: DType) -> String {
    let mut s = String::from("memref<");
    for x in shape {
        write!(s, "{x}x").unwrap();
    }
    s.push_str(elem_type(d));
    s.push('>');
    s
}

/// An MLIR literal of `x` in dtype `d` (floats always with an exponent, or as raw bits for
/// non-finite values; integers as integers, bool as `true`/`false`).
pub fn literal(d: DType, x: f64) -> String {
    match d {
        DType::F32 => {
            let v = x as f32;
            if v.is_finite() {
                format!("{v:.9e}")
            } else {
                format!("0x{:08X}", v.to_bits())
            }
        }
        DType::F64 => {
            if x.is_finite() {
                format!("{x:.17e}")
            } else {
                format!("0x{:016X}", x.to_bits())
            }
        }
        DType::F16 => format!("0x{:04X}", half::f16::from_f64(x).to_bits()),
        DType::BF16 => format!("0x{:04X}", half::bf16::from_f64(x).to_bits()),
        DType::Bool => (if x != 0.0 { "true" } else { "false" }).to_string(),
        DType::I64 | DType::I32 | DType::I8 => format!("{}", x as i64),
    }
}

/// `arith.constant <x> : <type>` (for bool `arith.constant true`: MLIR's parser refuses an
/// explicit `: i1` after a bool literal).
pub fn scalar_constant(d: DType, x: f64) -> String {
    match d {
        DType::Bool => format!("arith.constant {}", literal(d, x)),
        _ => format!("arith.constant {} : {}", literal(d, x), elem_type(d)),
    }
}

/// An MLIR literal for an integer value in dtype `d`.
pub fn int_literal(d: DType, x: i64) -> String {
    match d {
        DType::Bool => (if x != 0 { "true" } else { "false" }).to_string(),
        d if d.is_float() => literal(d, x as f64),
        _ => x.to_string(),
    }
}

/// The body of a `linalg.generic` (or any region): fresh names and lines.
///
/// Block arguments are `%in0, %in1, ...` for the inputs and `%out0, ...` for the outputs.
#[derive(Default)]
pub struct Body {
    pub lines: Vec<String>,
    counter: usize,
}

impl Body {
    /// Emit `%bN = <rhs>` and return `%bN`.
    pub fn op(&mut self, rhs: impl AsRef<str>) -> String {
        self.counter += 1;
        let r = format!("%b{}", self.counter);
        self.lines.push(format!("{r} = {}", rhs.as_ref()));
        r
    }

    /// A constant of dtype `d`.
    pub fn constant(&mut self, d: DType, x: f64) -> String {
        self.op(format!(
            "arith.constant {} : {}",
            literal(d, x),
            elem_type(d)
        ))
    }

    /// A fresh `%bN` name for a value that a [`Body::raw`] line defines (a region's
    /// block argument, a multi-result op).
    pub fn fresh(&mut self) -> String {
        self.counter += 1;
        format!("%b{}", self.counter)
    }

    /// A line with no result.
    pub fn raw(&mut self, line: impl Into<String>) {
        self.lines.push(line.into());
    }
}

/// One operand or result of a `linalg.generic`: SSA name, tensor shape and dtype, and the
/// indexing map's results over the loop dimensions `d0..` (e.g. `["d0", "0", "d2"]`).
#[derive(Clone, Debug)]
pub struct Operand {
    pub name: String,
    pub shape: Vec<u64>,
    pub dtype: DType,
    pub map: Vec<String>,
}

impl Operand {
    pub fn new(name: impl Into<String>, shape: &[u64], dtype: DType, map: Vec<String>) -> Self {
        Operand {
            name: name.into(),
            shape: shape.to_vec(),
            dtype,
            map,
        }
    }

    /// An operand indexed by the identity map over `shape.len()` loops.
    pub fn identity(name: impl Into<String>, shape: &[u64], dtype: DType) -> Self {
        let map = (0..shape.len()).map(|i| format!("d{i}")).collect();
        Operand::new(name, shape, dtype, map)
    }
}

/// Loop iterator kinds of a `linalg.generic`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Iter {
    Parallel,
    Reduction,
}

/// Emits the body of one `func.func`.
pub struct Emitter<'f> {
    pub f: &'f Function,
    /// SSA name of each ppir value once defined.
    names: Vec<Option<String>>,
    pub out: String,
    tmp: usize,
    /// Outlined op functions by their text (after the name): equal ops share one.
    outlined: std::collections::HashMap<String, String>,
    /// Module-level declarations the body refers to (`llvm.func @ppcc_sgemm(..)`), each once.
    decls: Vec<String>,
    /// Time outlined op calls ([`LowerOptions::profile_ops`]).
    profile_ops: bool,
    /// [`LowerOptions::library_calls`].
    pub library_calls: bool,
    /// [`LowerOptions::gpu_gemm`].
    pub gpu_gemm: bool,
    /// Whether the code is for the CUDA target's kernels (or those loops run on the CPU,
    /// `--gpu-loops-on-cpu`): then loops are ordered for the GPU's mapping (reductions,
    /// [`reduce::reduction`]; `gather_grad`). `false` for the CPU target, whose own loop
    /// order suits its caches.
    pub loops_for_gpu: bool,
    /// The MLIR location (`loc("node")`, [`mlir_loc`]) of the op being lowered, appended to
    /// every line that ends an operation, so that MLIR's diagnostics name the ONNX node.
    loc: Option<String>,
}

/// The MLIR location of `op` in `f`: its source location (the ONNX node name, which
/// autodiff and the stage split carry over to the ops they derive), else the function and
/// its first result (`stage0.optim: %new.w`) for ops that no node produced.
pub fn mlir_loc(f: &Function, op: &OpData) -> String {
    let name = match (&op.loc, op.results().first()) {
        (Some(l), _) => l.clone(),
        (None, Some(&r)) => format!("{}: %{}", f.name, f.value(r).name),
        (None, None) => f.name.clone(),
    };
    format!("loc({})", mlir_string(&name))
}

/// The location of the code emitted for op `root`: [`mlir_loc`], or, when the op computes
/// others too (elementwise producers fused into its generic, the matrix product its bias
/// add absorbed), `loc(fused["producer", ..., "root"])` of every distinct node among them.
fn fused_loc(f: &Function, root: OpId, absorbed: Option<OpId>, plan: &fuse::Plan) -> String {
    fn walk(f: &Function, op: OpId, plan: &fuse::Plan, out: &mut Vec<OpId>) {
        for &v in f.op(op).operands() {
            if let Some(p) = plan.inlined_producer(f, v) {
                if !out.contains(&p) {
                    walk(f, p, plan, out);
                    out.push(p);
                }
            }
        }
    }
    let mut ops = Vec::new();
    if let Some(mm) = absorbed {
        walk(f, mm, plan, &mut ops);
        ops.push(mm);
    }
    walk(f, root, plan, &mut ops);
    ops.push(root);
    let mut names: Vec<String> = Vec::new();
    for id in ops {
        let l = mlir_loc(f, f.op(id));
        if !names.contains(&l) {
            names.push(l);
        }
    }
    match names.len() {
        0 | 1 => mlir_loc(f, f.op(root)),
        _ => {
            let inner: Vec<&str> = names
                .iter()
                .map(|l| {
                    l.strip_prefix("loc(")
                        .and_then(|x| x.strip_suffix(')'))
                        .unwrap_or(l)
                })
                .collect();
            format!("loc(fused[{}])", inner.join(", "))
        }
    }
}

/// `s` as an MLIR string literal: quotes and backslashes escaped, other control characters
/// as `\XX` hex escapes.
pub fn mlir_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                write!(out, "\\{:02X}", c as u32).unwrap();
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Whether a line of emitted MLIR is the last line of an operation (so a trailing
/// location may follow it): not a line that opens a region (`... {`, `} else {`,
/// `} do {`) or a block label (`^bb0(...):`).
fn ends_op(line: &str) -> bool {
    let t = line.trim_end();
    !(t.is_empty() || t.ends_with('{') || t.ends_with(':') || t.trim_start().starts_with('^'))
}

impl<'f> Emitter<'f> {
    pub fn new(f: &'f Function) -> Self {
        Emitter {
            f,
            names: vec![None; f.num_values()],
            out: String::new(),
            tmp: 0,
            outlined: Default::default(),
            decls: Vec::new(),
            profile_ops: false,
            library_calls: true,
            gpu_gemm: false,
            loops_for_gpu: false,
            loc: None,
        }
    }

    /// Declare a symbol at module level (an external function the body calls); repeated
    /// declarations are emitted once.
    pub fn declare(&mut self, decl: impl Into<String>) {
        let d = decl.into();
        if !self.decls.contains(&d) {
            self.decls.push(d);
        }
    }

    pub fn fresh(&mut self) -> String {
        self.tmp += 1;
        format!("%t{}", self.tmp)
    }

    /// Whether the op is being lowered for the CPU's support library (softmax and
    /// layer-norm rows, constants as globals): [`LowerOptions::library_calls`] without
    /// [`LowerOptions::gpu_gemm`].
    pub fn cpu_library(&self) -> bool {
        self.library_calls && !self.gpu_gemm
    }

    /// Emit one line of the function body.
    pub fn line(&mut self, s: impl AsRef<str>) {
        let s = s.as_ref();
        self.out.push_str("    ");
        self.out.push_str(s);
        if let Some(loc) = self.loc.as_deref().filter(|_| ends_op(s)) {
            self.out.push(' ');
            self.out.push_str(loc);
        }
        self.out.push('\n');
    }

    /// Emit `%tN = <rhs>` and return `%tN`.
    pub fn op(&mut self, rhs: impl AsRef<str>) -> String {
        let r = self.fresh();
        self.line(format!("{r} = {}", rhs.as_ref()));
        r
    }

    /// The SSA name of `v`; a value used before its definition (IR that did not verify)
    /// gets a name MLIR rejects with a diagnostic, rather than a panic here.
    pub fn name(&self, v: ValueId) -> String {
        self.names
            .get(v.index())
            .cloned()
            .flatten()
            .unwrap_or_else(|| format!("%undefined_{}", v.index()))
    }

    /// Whether `v` has a name here (inside an outlined op function only its parameters do).
    pub fn has_name(&self, v: ValueId) -> bool {
        self.names.get(v.index()).is_some_and(Option::is_some)
    }

    pub fn set_name(&mut self, v: ValueId, name: String) {
        if let Some(slot) = self.names.get_mut(v.index()) {
            *slot = Some(name);
        }
    }

    /// The static shape of `v` (an error for `?` dimensions).
    pub fn shape(&self, v: ValueId) -> Result<Vec<u64>, LowerError> {
        let ty = self.f.ty(v);
        ty.static_shape().ok_or_else(|| LowerError::Type {
            function: self.f.name.clone(),
            value: self.f.value(v).name.clone(),
            ty: ty.to_string(),
            need: "static shapes (bind the batch first)".into(),
        })
    }

    pub fn dtype(&self, v: ValueId) -> DType {
        self.f.ty(v).dtype
    }

    /// `tensor.empty()` of `shape` and `d`.
    pub fn empty(&mut self, shape: &[u64], d: DType) -> String {
        self.op(format!("tensor.empty() : {}", tensor_type(shape, d)))
    }

    /// A scalar `arith.constant` outside any region.
    pub fn scalar(&mut self, d: DType, x: f64) -> String {
        self.op(format!(
            "arith.constant {} : {}",
            literal(d, x),
            elem_type(d)
        ))
    }

    /// `tensor.empty` + `linalg.fill` with `x`.
    pub fn filled(&mut self, shape: &[u64], d: DType, x: f64) -> String {
        let ty = tensor_type(shape, d);
        let c = self.scalar(d, x);
        let empty = self.empty(shape, d);
        self.op(format!(
            "linalg.fill ins({c} : {}) outs({empty} : {ty}) -> {ty}",
            elem_type(d)
        ))
    }

    /// A constant tensor from a `dense<...>` literal. Without the support library (the
    /// CUDA target) kernels cannot read the module's globals, where `arith.constant`
    /// tensors end up: a splat is filled (in a kernel) and any other constant is copied by
    /// the host code into a fresh buffer, which kernels can read.
    pub fn constant_tensor(&mut self, lit: &str, shape: &[u64], d: DType) -> String {
        let ty = tensor_type(shape, d);
        if self.cpu_library() {
            return self.op(format!("arith.constant {lit} : {ty}"));
        }
        let splat = lit
            .strip_prefix("dense<")
            .and_then(|s| s.strip_suffix('>'))
            .filter(|s| !s.starts_with('['));
        if let Some(v) = splat {
            let c = match d {
                DType::Bool => self.op(format!("arith.constant {v}")),
                _ => self.op(format!("arith.constant {v} : {}", elem_type(d))),
            };
            let empty = self.empty(shape, d);
            return self.op(format!(
                "linalg.fill ins({c} : {}) outs({empty} : {ty}) -> {ty}",
                elem_type(d)
            ));
        }
        let c = self.op(format!("arith.constant {lit} : {ty}"));
        // A fresh allocation (never merged with another by `cse`, unlike `tensor.empty`)
        // that bufferization fills with a copy of the global.
        self.op(format!("bufferization.alloc_tensor() copy({c}) : {ty}"))
    }

    pub fn zeros(&mut self, shape: &[u64], d: DType) -> String {
        self.filled(shape, d, 0.0)
    }

    /// One `linalg.generic` over `loops` loop dimensions. `outputs` are the init tensors
    /// (their names are the `outs`), `body` computes the yielded values (one per output)
    /// from `%in<i>` / `%out<j>`. Returns the result names.
    pub fn generic(
        &mut self,
        loops: usize,
        iters: &[Iter],
        inputs: &[Operand],
        outputs: &[Operand],
        body: &Body,
        yields: &[String],
    ) -> Vec<String> {
        let dims: Vec<String> = (0..loops).map(|i| format!("d{i}")).collect();
        let domain = format!("({})", dims.join(", "));
        let maps: Vec<String> = inputs
            .iter()
            .chain(outputs)
            .map(|o| format!("affine_map<{domain} -> ({})>", o.map.join(", ")))
            .collect();
        let iters: Vec<&str> = iters
            .iter()
            .map(|i| match i {
                Iter::Parallel => "\"parallel\"",
                Iter::Reduction => "\"reduction\"",
            })
            .collect();
        let list = |ops: &[Operand]| {
            let names: Vec<&str> = ops.iter().map(|o| o.name.as_str()).collect();
            let tys: Vec<String> = ops.iter().map(|o| tensor_type(&o.shape, o.dtype)).collect();
            (names.join(", "), tys.join(", "))
        };
        let (in_names, in_tys) = list(inputs);
        let (out_names, out_tys) = list(outputs);
        let r = self.fresh();
        let lhs = if outputs.len() == 1 {
            r.clone()
        } else {
            format!("{r}:{}", outputs.len())
        };
        let ins = if inputs.is_empty() {
            String::new()
        } else {
            format!(" ins({in_names} : {in_tys})")
        };
        self.line(format!(
            "{lhs} = linalg.generic {{indexing_maps = [{}], iterator_types = [{}]}}{ins} outs({out_names} : {out_tys}) {{",
            maps.join(", "),
            iters.join(", "),
        ));
        let mut args: Vec<String> = inputs
            .iter()
            .enumerate()
            .map(|(i, o)| format!("%in{i}: {}", elem_type(o.dtype)))
            .collect();
        args.extend(
            outputs
                .iter()
                .enumerate()
                .map(|(j, o)| format!("%out{j}: {}", elem_type(o.dtype))),
        );
        self.out
            .push_str(&format!("    ^bb0({}):\n", args.join(", ")));
        for l in &body.lines {
            self.line(format!("  {l}"));
        }
        let ytys: Vec<&str> = outputs.iter().map(|o| elem_type(o.dtype)).collect();
        self.line(format!(
            "  linalg.yield {} : {}",
            yields.join(", "),
            ytys.join(", ")
        ));
        let rtys: Vec<String> = outputs
            .iter()
            .map(|o| tensor_type(&o.shape, o.dtype))
            .collect();
        if rtys.len() == 1 {
            self.line(format!("}} -> {}", rtys[0]));
            vec![r]
        } else {
            self.line(format!("}} -> ({})", rtys.join(", ")));
            (0..outputs.len()).map(|j| format!("{r}#{j}")).collect()
        }
    }

    /// Reinterpret `src` (row-major) with another static shape of the same size, through
    /// `tensor.collapse_shape` to 1-D and `tensor.expand_shape`.
    pub fn reshape(&mut self, src: &str, from: &[u64], to: &[u64], d: DType) -> String {
        if from == to {
            return src.to_string();
        }
        let n: u64 = from.iter().product();
        // Collapse to rank 1 (or 0 when the target is a scalar).
        let flat = if from.len() == 1 && !to.is_empty() {
            src.to_string()
        } else if from.is_empty() {
            self.op(format!(
                "tensor.expand_shape {src} [] output_shape [1] : {} into {}",
                tensor_type(from, d),
                tensor_type(&[1], d)
            ))
        } else if to.is_empty() {
            self.op(format!(
                "tensor.collapse_shape {src} [] : {} into {}",
                tensor_type(from, d),
                tensor_type(&[], d)
            ))
        } else {
            let all: Vec<String> = (0..from.len()).map(|i| i.to_string()).collect();
            self.op(format!(
                "tensor.collapse_shape {src} [[{}]] : {} into {}",
                all.join(", "),
                tensor_type(from, d),
                tensor_type(&[n], d)
            ))
        };
        if to.len() <= 1 {
            return flat;
        }
        let all: Vec<String> = (0..to.len()).map(|i| i.to_string()).collect();
        let sizes: Vec<String> = to.iter().map(|x| x.to_string()).collect();
        self.op(format!(
            "tensor.expand_shape {flat} [[{}]] output_shape [{}] : {} into {}",
            all.join(", "),
            sizes.join(", "),
            tensor_type(&[n], d),
            tensor_type(to, d)
        ))
    }
}

/// An op being lowered, with its operand and result types at hand and error builders that
/// name the function, op, value and source location.
pub struct OpView<'a> {
    pub f: &'a Function,
    pub id: OpId,
    pub op: &'a OpData,
    pub kind: OpKind,
    /// Operand shapes and dtypes.
    pub in_shapes: Vec<Vec<u64>>,
    pub in_dtypes: Vec<DType>,
    /// Result shapes and dtypes.
    pub out_shapes: Vec<Vec<u64>>,
    pub out_dtypes: Vec<DType>,
}

impl<'a> OpView<'a> {
    fn value_text(&self) -> String {
        self.op
            .results()
            .first()
            .map(|&r| format!("%{}", self.f.value(r).name))
            .unwrap_or_else(|| "no result".into())
    }

    fn loc_text(&self) -> String {
        self.op
            .loc
            .as_ref()
            .map(|l| format!(", loc \"{l}\""))
            .unwrap_or_default()
    }

    /// "not lowered yet" with `detail` appended (start it with a space or leave empty).
    pub fn unsupported(&self, detail: impl Into<String>) -> LowerError {
        LowerError::Unsupported {
            function: self.f.name.clone(),
            op: self.kind.to_string(),
            value: self.value_text(),
            loc: self.loc_text(),
            detail: detail.into(),
        }
    }

    /// The op is malformed (bad attribute, impossible shapes).
    pub fn invalid(&self, message: impl Into<String>) -> LowerError {
        LowerError::Invalid {
            function: self.f.name.clone(),
            op: self.kind.to_string(),
            value: self.value_text(),
            loc: self.loc_text(),
            message: message.into(),
        }
    }

    pub fn attr_err(&self, e: ppir::attr::AttrError) -> LowerError {
        self.invalid(e.to_string())
    }

    /// The op's attributes through its typed view (`let a: GemmAttrs = op.attrs()?`), with
    /// the declared defaults applied.
    pub fn attrs<A: OpAttrs>(&self) -> Result<A, LowerError> {
        A::of(&self.op.attrs).map_err(|e| self.attr_err(e))
    }

    /// Normalise a possibly negative axis against `rank`.
    pub fn axis(&self, a: i64, rank: usize) -> Result<usize, LowerError> {
        let n = if a < 0 { a + rank as i64 } else { a };
        if n < 0 || n >= rank as i64 {
            return Err(self.invalid(format!("axis {a} out of range for rank {rank}")));
        }
        Ok(n as usize)
    }
}

/// The `func.func` text, its signature and the module-level declarations it needs.
fn lower_func_op(
    f: &Function,
    opts: &LowerOptions,
) -> Result<(String, Signature, Vec<String>), LowerError> {
    let mut e = Emitter::new(f);
    e.profile_ops = opts.profile_ops;
    e.library_calls = opts.library_calls;
    e.gpu_gemm = opts.gpu_gemm;
    e.loops_for_gpu = !opts.library_calls || opts.gpu_gemm;
    let mut params = vec!["%ctx: !llvm.ptr".to_string()];
    let mut inputs = Vec::new();
    for (i, v) in f.arg_values().enumerate() {
        let s = e.shape(v)?;
        let d = e.dtype(v);
        params.push(format!(
            "%arg{i}: {} {{bufferization.writable = false}}",
            tensor_type(&s, d)
        ));
        e.set_name(v, format!("%arg{i}"));
        inputs.push((d, s));
    }
    let mut outputs = Vec::new();
    for &v in f.results() {
        outputs.push((e.dtype(v), e.shape(v)?));
    }
    let res_tys: Vec<String> = outputs.iter().map(|(d, s)| tensor_type(s, *d)).collect();

    // Chains of elementwise ops become one generic each (see `fuse`).
    let plan = fuse::Plan::new(&e);
    let mut outlined = String::new();
    for &op_id in f.ops() {
        if plan.is_inlined(op_id) || plan.is_absorbed(op_id) {
            // Computed inside its consumer's generic, or by its bias add's GEMM.
            continue;
        }
        let op = f.op(op_id);
        let bias_mm = plan.bias_matmul(op_id);
        e.loc = Some(fused_loc(f, op_id, bias_mm, &plan));
        let view = elementwise::op_view(&e, op_id)?;
        let lower_here = |e: &mut Emitter| {
            if let Some(mm) = bias_mm {
                contraction::matmul_plus_bias(e, &view, mm, &|v| plan.inlined_producer(f, v))
            } else if op.kind.is_elementwise() {
                elementwise::lower_root(e, &view, &|v| plan.inlined_producer(f, v))
            } else {
                lower_op(e, &view)
            }
        };
        let names = if outline(op.kind) && !op.results().is_empty() {
            let mut leaves = leaf_operands(f, op_id, &plan);
            if let Some(mm) = bias_mm {
                // The GEMM reads the product's operands (and transposes' sources) and the
                // bias, not the product.
                let product = f.op(mm).results()[0];
                leaves.retain(|&v| v != product);
                for v in leaf_operands(f, mm, &plan) {
                    if !leaves.contains(&v) {
                        leaves.push(v);
                    }
                }
            }
            outline_op(&mut e, op_id, &leaves, &mut outlined, lower_here)?
        } else {
            lower_here(&mut e)?
        };
        if names.len() != op.results().len() {
            return Err(view.invalid(format!(
                "lowering produced {} values for {} results",
                names.len(),
                op.results().len()
            )));
        }
        for (&r, n) in op.results().iter().zip(names) {
            e.set_name(r, n);
        }
    }
    // The function's own ops (result copies, `return`) carry its name.
    let fn_loc = format!("loc({})", mlir_string(&f.name));
    e.loc = Some(fn_loc.clone());
    let ret: Vec<String> = f.results().iter().map(|&v| e.name(v)).collect();
    // (Values returned twice, or made equal by `cse`, get copies before bufferization:
    // `crate::results`.)
    if ret.is_empty() {
        e.line("return");
    } else {
        e.line(format!(
            "return {} : {}",
            ret.join(", "),
            res_tys.join(", ")
        ));
    }
    let text = format!(
        "  func.func @{}({}) -> ({}) attributes {{llvm.emit_c_interface}} {{\n{}  }} {fn_loc}\n",
        ppir::abi::mangle(&f.name),
        params.join(", "),
        res_tys.join(", "),
        e.out
    );
    Ok((
        text + &outlined,
        Signature {
            name: f.name.clone(),
            inputs,
            outputs,
        },
        e.decls,
    ))
}

/// Whether an op's code goes into a function of its own. Every op with loops does: LLVM's
/// optimiser scales badly with the size of one function (a DenseNet in one function takes
/// minutes at O3), and one call per op costs nothing next to its loops. Communication
/// (which needs the context), constants and pure reshapes stay inline.
fn outline(kind: OpKind) -> bool {
    use OpKind::*;
    !matches!(
        kind,
        Send | Recv
            | AllReduce
            | ReduceScatter
            | Shard
            | AllGather
            | Constant
            | Reshape
            | Flatten
            | Squeeze
            | Unsqueeze
            | Identity
    )
}

/// The values an op (with the elementwise producers fused into it) reads: its operands,
/// looking through inlined producers, each once, in order of first use.
fn leaf_operands(f: &Function, op: OpId, plan: &fuse::Plan) -> Vec<ValueId> {
    fn walk(f: &Function, op: OpId, plan: &fuse::Plan, out: &mut Vec<ValueId>) {
        for &v in f.op(op).operands() {
            match plan.inlined_producer(f, v) {
                Some(p) => walk(f, p, plan, out),
                None if !out.contains(&v) => out.push(v),
                None => {}
            }
        }
    }
    let mut out = Vec::new();
    walk(f, op, plan, &mut out);
    // A matrix product reads a transposed operand's source through the GEMM's transpose
    // flag (`contraction::gemm_operand`): pass the source too.
    if matches!(f.op(op).kind, OpKind::MatMul | OpKind::Gemm) {
        for &v in f.op(op).operands() {
            if let Some(p) = f.producer(v) {
                let p = f.op(p);
                if p.kind == OpKind::Transpose && p.operands().len() == 1 {
                    let x = p.operands()[0];
                    if !out.contains(&x) {
                        out.push(x);
                    }
                }
            }
        }
    }
    out
}

/// Emit the op as `func.func private @<fn>__op<k>(leaves...) -> (results...)` (appended to
/// `outlined`, never inlined by LLVM) and a `func.call` to it here; returns the call's
/// result names.
fn outline_op(
    e: &mut Emitter,
    op_id: OpId,
    leaves: &[ValueId],
    outlined: &mut String,
    lower_here: impl Fn(&mut Emitter) -> Result<Vec<String>, LowerError>,
) -> Result<Vec<String>, LowerError> {
    let f = e.f;
    let op = f.op(op_id);
    let mut arg_tys = Vec::new();
    let mut params = Vec::new();
    let mut args = Vec::new();
    // Inside the function only its parameters have names (it is isolated from above).
    let mut inner = vec![None; e.names.len()];
    for (i, &v) in leaves.iter().enumerate() {
        let ty = tensor_type(&e.shape(v)?, e.dtype(v));
        params.push(format!("%p{i}: {ty}"));
        args.push(e.name(v));
        arg_tys.push(ty);
        inner[v.index()] = Some(format!("%p{i}"));
    }
    let mut res_tys = Vec::new();
    for &r in op.results() {
        let shape = e.shape(r)?;
        res_tys.push(tensor_type(&shape, e.dtype(r)));
    }
    // Temporaries are numbered from scratch in each outlined function, so ops with equal
    // types and attributes get equal text and share one function.
    let lower_body = |e: &mut Emitter, library_calls: bool| {
        let outer = std::mem::take(&mut e.out);
        let outer_tmp = std::mem::replace(&mut e.tmp, 0);
        let outer_lib = std::mem::replace(&mut e.library_calls, library_calls);
        let names = std::mem::replace(&mut e.names, inner.clone());
        let result = lower_here(e);
        let body = std::mem::replace(&mut e.out, outer);
        e.tmp = outer_tmp;
        e.library_calls = outer_lib;
        e.names = names;
        result.map(|n| (body, n))
    };
    // Every target gets the op in `linalg` (the function `@<fn>__op<k>`). Where the CPU
    // has a support-library routine for it (matrix products, convolution, softmax and
    // layer-norm rows: `llvm.call @ppcc_...`), that version is written beside it as
    // `@<fn>__op<k>__lib` with the same signature, and the CPU pipeline points the calls
    // at it after bufferization ([`crate::compile::use_library_routines`]).
    let (body, names) = lower_body(e, false)?;
    let library = if e.library_calls {
        let (lib_body, lib_names) = lower_body(e, true)?;
        (lib_body.contains("llvm.call @ppcc_") && lib_body != body).then_some((lib_body, lib_names))
    } else {
        None
    };
    // The function's code is looked up by its text without the op's location: equal ops
    // of different nodes share one function, which carries the first one's location.
    let def = |body: &str, names: &[String], loc: &str| {
        format!(
            "({}) -> ({}) attributes {{passthrough = [\"noinline\"]}} {{\n{body}    return {} : {}{loc}\n  }}{loc}\n",
            params.join(", "),
            res_tys.join(", "),
            names.join(", "),
            res_tys.join(", "),
        )
    };
    let texts = |body: &str, names: &[String]| match &e.loc {
        Some(loc) => {
            let suffix = format!(" {loc}");
            (
                def(&body.replace(&suffix, ""), names, ""),
                def(body, names, &suffix),
            )
        }
        None => (def(body, names, ""), def(body, names, "")),
    };
    let (mut key, text) = texts(&body, &names);
    let lib = library.map(|(b, n)| texts(&b, &n));
    if let Some((lib_key, _)) = &lib {
        key.push_str(lib_key);
    }
    let callee = match e.outlined.get(&key) {
        Some(c) => c.clone(),
        None => {
            let c = format!("{}__op{}", ppir::abi::mangle(&f.name), op_id.index());
            *outlined += &format!("  func.func private @{c}{text}");
            if let Some((_, lib_text)) = &lib {
                *outlined += &format!("  func.func private @{c}{LIBRARY_SUFFIX}{lib_text}");
            }
            e.outlined.insert(key, c.clone());
            c
        }
    };
    let t0 = e.profile_ops.then(|| {
        e.declare("llvm.func @ppcc_prof_begin() -> i64");
        e.declare("llvm.func @ppcc_prof_end(i64, i64)");
        e.op("llvm.call @ppcc_prof_begin() : () -> i64")
    });
    let r = e.fresh();
    let n = res_tys.len();
    let lhs = if n == 1 {
        r.clone()
    } else {
        format!("{r}:{n}")
    };
    e.line(format!(
        "{lhs} = func.call @{callee}({}) : ({}) -> ({})",
        args.join(", "),
        arg_tys.join(", "),
        res_tys.join(", ")
    ));
    if let Some(t0) = t0 {
        let id = e.op(format!("arith.constant {} : i64", op_id.index()));
        e.line(format!(
            "llvm.call @ppcc_prof_end({t0}, {id}) : (i64, i64) -> ()"
        ));
    }
    Ok(if n == 1 {
        vec![r]
    } else {
        (0..n).map(|j| format!("{r}#{j}")).collect()
    })
}

/// Lower one op; returns the SSA names of its results.
fn lower_op(e: &mut Emitter, op: &OpView) -> Result<Vec<String>, LowerError> {
    use OpKind::*;
    match op.kind {
        Send | Recv => comm::lower(e, op),
        AllReduce | ReduceScatter | Shard | AllGather => comm::lower_collective(e, op),
        MatMul | Gemm | Conv | ConvTranspose | ConvGradWeight => contraction::lower(e, op),
        MaxPool | AvgPool | GlobalAvgPool | GlobalMaxPool | MaxPoolGrad | AvgPoolGrad => {
            pool::lower(e, op)
        }
        BatchNorm
        | InstanceNorm
        | LayerNorm
        | Lrn
        | Softmax
        | LogSoftmax
        | SoftmaxCrossEntropy
        | SoftmaxCrossEntropyGrad
        | LabelLogit
        | LabelLogitGrad
        | LogSumExpGrad => norm::lower(e, op),
        ReduceSum | ReduceMean | ReduceMax | ReduceMin | ReduceLogSumExp => reduce::lower(e, op),
        k if k.is_elementwise() => elementwise::lower(e, op),
        k if matches!(k.class(), OpClass::DataMovement | OpClass::Constant) => {
            movement::lower(e, op)
        }
        _ => Err(op.unsupported("")),
    }
}
