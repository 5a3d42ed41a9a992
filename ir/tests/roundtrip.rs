//! Property tests of the textual form: for random well-formed modules (syntactically; op
//! rules are not respected), printing, parsing and printing again gives the same text, and
//! the parser never panics on damaged input.

use ppir::text::{parse_module, print_module, PrintOptions};
use ppir::{
    ArgKind, Attr, Attrs, DType, Dim, Function, Module, NewOp, OpKind, Phase, Tensor, TensorType,
};
use proptest::prelude::*;

// ---- strategies: plain specs, built into a module afterwards ----

/// A name: usually bare characters, sometimes anything (printed quoted), sometimes empty
/// (the builder then picks a fresh numeric name).
fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => "[A-Za-z0-9_.$/-]{1,8}",
        2 => any::<String>().prop_map(|s| s.chars().take(8).collect()),
        1 => "[ -~]{0,6}",
        1 => Just(String::new()),
    ]
}

fn dtype() -> impl Strategy<Value = DType> {
    prop::sample::select(DType::ALL.to_vec())
}

fn dim() -> impl Strategy<Value = Dim> {
    prop_oneof![
        6 => (0u64..6).prop_map(Dim::Known),
        2 => Just(Dim::Batch),
        1 => any::<u64>().prop_map(Dim::Known),
    ]
}

/// A representable type (the parser refuses one whose size overflows, see `ppir::size`):
/// a huge dimension is kept when it fits, otherwise shifted down until the type does.
fn tensor_type() -> impl Strategy<Value = TensorType> {
    (dtype(), prop::collection::vec(dim(), 0..4)).prop_map(|(d, mut dims)| {
        while TensorType::new(d, dims.clone()).check_size().is_err() {
            for dim in &mut dims {
                if let Dim::Known(n) = dim {
                    *n >>= 8;
                }
            }
        }
        TensorType::new(d, dims)
    })
}

fn float() -> impl Strategy<Value = f64> {
    prop_oneof![
        4 => any::<f64>(),
        2 => (-100i32..100).prop_map(f64::from),
        2 => -1e3f64..1e3,
        1 => any::<f32>().prop_map(f64::from),
        1 => Just(-0.0),
        1 => Just(0.0),
        1 => Just(f64::INFINITY),
        1 => Just(f64::NEG_INFINITY),
        1 => Just(f64::NAN),
        1 => Just(f64::MIN_POSITIVE / 3.0),            // f64 subnormal
        1 => Just(f32::MIN_POSITIVE as f64 / 5.0),     // f32 subnormal
        1 => Just(6.0e-8),                             // f16 subnormal
        1 => Just(65520.0),                            // overflows f16
    ]
}

/// Dense tensors of every dtype: up to 16 elements print as a list, more as hex.
fn tensor() -> impl Strategy<Value = Tensor> {
    let shape = prop_oneof![
        3 => prop::collection::vec(1usize..5, 0..3),
        2 => prop::collection::vec(2usize..6, 2..4),
        1 => prop::collection::vec(0usize..3, 1..3),
    ];
    (dtype(), shape).prop_flat_map(|(d, shape)| {
        let n: usize = shape.iter().product();
        if d.is_float() {
            prop::collection::vec(float(), n)
                .prop_map(move |v| Tensor::from_f64(d, shape.clone(), v))
                .boxed()
        } else {
            prop::collection::vec(any::<i64>(), n)
                .prop_map(move |v| Tensor::from_i64(d, shape.clone(), v))
                .boxed()
        }
    })
}

fn attr() -> impl Strategy<Value = Attr> {
    prop_oneof![
        any::<i64>().prop_map(Attr::Int),
        float().prop_map(Attr::Float),
        any::<String>().prop_map(Attr::Str),
        prop::collection::vec(any::<i64>(), 0..5).prop_map(Attr::Ints),
        prop::collection::vec(float(), 0..5).prop_map(Attr::Floats),
        dtype().prop_map(Attr::DType),
        tensor().prop_map(Attr::Tensor),
    ]
}

/// Attributes, never named `stage` or `phase` (those keys are an op's annotations).
fn attrs() -> impl Strategy<Value = Attrs> {
    let key = prop_oneof![4 => "[a-z_][a-z0-9_.$]{0,7}", 1 => any::<String>()];
    prop::collection::vec((key, attr()), 0..4).prop_map(|entries| {
        entries
            .into_iter()
            .filter(|(k, _)| k != "stage" && k != "phase")
            .collect()
    })
}

#[derive(Clone, Debug)]
struct OpSpec {
    kind: OpKind,
    /// Indices into the values defined so far (taken modulo their count).
    operands: Vec<usize>,
    results: Vec<(String, TensorType)>,
    attrs: Attrs,
    stage: Option<u32>,
    phase: Option<Phase>,
    loc: Option<String>,
    /// Remove the op again if nothing uses its results (leaves a tombstone in the arena).
    remove: bool,
}

fn op_spec() -> impl Strategy<Value = OpSpec> {
    (
        prop::sample::select(OpKind::ALL.to_vec()),
        prop::collection::vec(any::<usize>(), 0..4),
        prop::collection::vec((name(), tensor_type()), 0..4),
        attrs(),
        prop::option::of(any::<u32>()),
        prop::option::of(prop::sample::select(Phase::ALL.to_vec())),
        prop::option::of(any::<String>()),
        prop::bool::weighted(0.1),
    )
        .prop_map(
            |(kind, operands, results, attrs, stage, phase, loc, remove)| OpSpec {
                kind,
                operands,
                results,
                attrs,
                stage,
                phase,
                loc,
                remove,
            },
        )
}

#[derive(Clone, Debug)]
struct FuncSpec {
    name: String,
    attrs: Attrs,
    args: Vec<(String, TensorType, ArgKind)>,
    ops: Vec<OpSpec>,
    results: Vec<usize>,
}

fn func_spec() -> impl Strategy<Value = FuncSpec> {
    let kind = prop::sample::select(vec![ArgKind::Input, ArgKind::Param, ArgKind::State]);
    (
        name(),
        attrs(),
        prop::collection::vec((name(), tensor_type(), kind), 0..4),
        prop::collection::vec(op_spec(), 0..8),
        prop::collection::vec(any::<usize>(), 0..3),
    )
        .prop_map(|(name, attrs, args, ops, results)| FuncSpec {
            name,
            attrs,
            args,
            ops,
            results,
        })
}

#[derive(Clone, Debug)]
struct ModuleSpec {
    name: Option<String>,
    functions: Vec<FuncSpec>,
    weights: Vec<(String, Tensor)>,
}

fn module_spec() -> impl Strategy<Value = ModuleSpec> {
    (
        prop::option::of(name()),
        prop::collection::vec(func_spec(), 0..4),
        prop::collection::vec((name(), tensor()), 0..4),
    )
        .prop_map(|(name, functions, weights)| ModuleSpec {
            name,
            functions,
            weights,
        })
}

/// Make a generated name unique within its scope: the suffix `_<i>` (unique `i`) keeps it
/// apart from every other such name and from the all-digit fresh names; an empty name is
/// left empty so the builder picks a fresh one.
fn unique(name: &str, i: usize) -> String {
    if name.is_empty() {
        String::new()
    } else {
        format!("{name}_{i}")
    }
}

fn build(spec: &ModuleSpec) -> Module {
    let mut m = Module::new();
    m.name = spec.name.clone();
    for (fi, fs) in spec.functions.iter().enumerate() {
        // Function names must be unique in the module; the index suffix makes them so.
        let mut f = Function::new(format!("{}_{fi}", fs.name));
        f.attrs = fs.attrs.clone();
        let mut values = Vec::new();
        let mut n = 0;
        for (name, ty, kind) in &fs.args {
            values.push(f.add_arg(unique(name, n), ty.clone(), *kind));
            n += 1;
        }
        let mut ops = Vec::new();
        for os in &fs.ops {
            let operands = if values.is_empty() {
                vec![]
            } else {
                os.operands
                    .iter()
                    .map(|&i| values[i % values.len()])
                    .collect()
            };
            let mut names = Vec::new();
            for (name, _) in &os.results {
                names.push(unique(name, n));
                n += 1;
            }
            let new = NewOp {
                kind: os.kind,
                operands,
                attrs: os.attrs.clone(),
                result_types: os.results.iter().map(|(_, t)| t.clone()).collect(),
                result_names: names,
                stage: os.stage,
                phase: os.phase,
                loc: os.loc.clone(),
            };
            let id = f.push_op(new);
            values.extend_from_slice(f.op(id).results());
            ops.push((id, os.remove));
        }
        if !values.is_empty() {
            f.set_results(
                fs.results
                    .iter()
                    .map(|&i| values[i % values.len()])
                    .collect(),
            );
        }
        for &(id, remove) in ops.iter().rev() {
            if remove && f.op(id).results().iter().all(|&r| f.users(r).is_empty()) {
                f.remove_op(id);
            }
        }
        m.functions.push(f);
    }
    for (name, t) in &spec.weights {
        m.weights.insert(name.clone(), t.clone());
    }
    m
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    /// print → parse → print is the identity on text.
    #[test]
    fn print_parse_print(spec in module_spec()) {
        let m = build(&spec);
        let text = print_module(&m, &PrintOptions::default());
        let parsed = match parse_module(&text) {
            Ok(p) => p,
            Err(e) => return Err(TestCaseError::fail(format!("{e}\n{text}"))),
        };
        let again = print_module(&parsed, &PrintOptions::default());
        prop_assert_eq!(&text, &again);
        // Content: same functions, names and weights (values are compared through their text,
        // since NaN != NaN).
        prop_assert_eq!(parsed.name, m.name);
        prop_assert_eq!(parsed.functions.len(), m.functions.len());
        for (a, b) in parsed.functions.iter().zip(&m.functions) {
            prop_assert_eq!(&a.name, &b.name);
            prop_assert_eq!(a.args().len(), b.args().len());
            prop_assert_eq!(a.ops().len(), b.ops().len());
            for (&oa, &ob) in a.ops().iter().zip(b.ops()) {
                let (oa, ob) = (a.op(oa), b.op(ob));
                prop_assert_eq!((oa.kind, oa.stage, oa.phase, &oa.loc), (ob.kind, ob.stage, ob.phase, &ob.loc));
                for (&ra, &rb) in oa.results().iter().zip(ob.results()) {
                    prop_assert_eq!(&a.value(ra).name, &b.value(rb).name);
                    prop_assert_eq!(a.ty(ra), b.ty(rb));
                }
            }
        }
        prop_assert_eq!(parsed.weights.keys().collect::<Vec<_>>(), m.weights.keys().collect::<Vec<_>>());
    }

    /// An elided view parses, and keeps exactly the weights that were printed in full.
    #[test]
    fn elided_view_parses(spec in module_spec(), limit in 0usize..20) {
        let m = build(&spec);
        let text = print_module(&m, &PrintOptions { elide_weights_over: Some(limit) });
        let parsed = parse_module(&text).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        let kept: Vec<&String> =
            m.weights.iter().filter(|(_, t)| t.num_elements() <= limit).map(|(k, _)| k).collect();
        prop_assert_eq!(parsed.weights.keys().collect::<Vec<_>>(), kept);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Damaged text (truncated, bytes replaced, inserted or deleted) gives Ok or Err, never a
    /// panic; a truncated module is never accepted.
    #[test]
    fn damaged_text_never_panics(
        spec in module_spec(),
        cut in any::<prop::sample::Index>(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..6),
    ) {
        let text = print_module(&build(&spec), &PrintOptions::default());
        let trimmed = text.trim_end();
        let mut at = cut.index(trimmed.len());
        while !trimmed.is_char_boundary(at) {
            at -= 1;
        }
        prop_assert!(parse_module(&trimmed[..at]).is_err());

        let mut bytes = text.into_bytes();
        for (i, b, how) in edits {
            let at = i.index(bytes.len().max(1));
            match how {
                0 if at < bytes.len() => bytes[at] = b,
                1 if at < bytes.len() => {
                    bytes.remove(at);
                }
                _ => bytes.insert(at.min(bytes.len()), b),
            }
        }
        let _ = parse_module(&String::from_utf8_lossy(&bytes));
    }

    /// Arbitrary strings never make the parser panic.
    #[test]
    fn arbitrary_text_never_panics(s in any::<String>(), t in "[a-z%@\"<>(){}\\[\\],:=x?0-9. \n-]{0,80}") {
        let _ = parse_module(&s);
        let _ = parse_module(&t);
        let _ = parse_module(&format!("module {{ func @f() -> () {{ {t} }} }}"));
        let _ = ppir::text::parse_type(&t);
    }
}
