use super::*;
use crate::attr::{Attr, Attrs};
use crate::module::NewOp;
use crate::tensor::Tensor;
use crate::types::{DType, TensorType};
use VerifyErrorKind as K;

/// `"2x?x3xf32"` → tensor type; `"f32"` is a scalar.
fn ty(s: &str) -> TensorType {
    let parts: Vec<&str> = s.split('x').collect();
    let (dtype, dims) = parts.split_last().unwrap();
    let dims = dims
        .iter()
        .map(|d| {
            if *d == "?" {
                Dim::Batch
            } else {
                Dim::Known(d.parse().unwrap())
            }
        })
        .collect();
    TensorType::new(DType::from_name(dtype).unwrap(), dims)
}

fn op(kind: OpKind, operands: Vec<ValueId>, results: &[&str], name: &str) -> NewOp {
    NewOp::new(kind, operands, results.iter().map(|s| ty(s)).collect())
        .names(vec![name.to_string()])
}

fn comm(peer: i64, channel: i64) -> Attrs {
    Attrs::new()
        .with("peer", Attr::Int(peer))
        .with("channel", Attr::Int(channel))
}

fn module(fs: Vec<Function>) -> Module {
    let mut m = Module::new();
    m.functions = fs;
    m
}

/// The errors as (kind, display) pairs.
fn errors(m: &Module) -> Vec<(VerifyErrorKind, String)> {
    match verify_module(m) {
        Ok(()) => vec![],
        Err(es) => es.iter().map(|e| (e.kind, e.to_string())).collect(),
    }
}

/// Exactly one error: its display.
fn one(m: &Module, kind: VerifyErrorKind) -> String {
    let es = errors(m);
    assert_eq!(es.len(), 1, "expected one {kind:?}, got {es:#?}");
    assert_eq!(es[0].0, kind, "{es:#?}");
    es[0].1.clone()
}

/// x: ?x784 input, w: 784x10 param (with a module weight), relu(x @ w).
fn mlp() -> Module {
    let mut f = Function::new("main");
    let x = f.add_arg("x", ty("?x784xf32"), ArgKind::Input);
    let w = f.add_arg("w", ty("784x10xf32"), ArgKind::Param);
    let h = f.push(op(OpKind::MatMul, vec![x, w], &["?x10xf32"], "h").loc("fc1/MatMul"));
    let y = f.push(op(OpKind::Relu, vec![h], &["?x10xf32"], "y"));
    f.set_results(vec![y]);
    let mut m = module(vec![f]);
    m.weights
        .insert("w".into(), Tensor::zeros(DType::F32, vec![784, 10]));
    m
}

#[test]
fn valid_module() {
    let mut m = mlp();
    let f = &mut m.functions[0];
    let c = f.push(
        NewOp::new(OpKind::Constant, vec![], vec![ty("2xi64")]).attrs(Attrs::new().with(
            "value",
            Attr::Tensor(Tensor::from_i64(DType::I64, vec![2], vec![1, 2])),
        )),
    );
    let y = f.results()[0];
    f.set_results(vec![y, c]);
    assert_eq!(verify_module(&m), Ok(()));
    assert_eq!(verify_function(&m, &m.functions[0]), Ok(()));
}

#[test]
fn display_format() {
    let mut m = mlp();
    let f = &mut m.functions[0];
    let x = f.find_value("x").unwrap();
    f.set_type(x, ty("?x512xf32"));
    let e = one(&m, K::Shape);
    assert_eq!(
        e,
        "@main: %h = \"pp.matmul\" (loc \"fc1/MatMul\"): inner dimensions differ: 512 vs 784"
    );
    let err = &verify_module(&m).unwrap_err()[0];
    assert_eq!(err.function.as_deref(), Some("main"));
    assert_eq!(err.op.as_deref(), Some("%h = \"pp.matmul\""));
    assert_eq!(err.loc.as_deref(), Some("fc1/MatMul"));
    assert_eq!(err.message, "inner dimensions differ: 512 vs 784");
}

#[test]
fn operand_count() {
    let mut m = mlp();
    let f = &mut m.functions[0];
    let x = f.find_value("x").unwrap();
    let r = f.push(op(OpKind::Relu, vec![x, x], &["?x784xf32"], "r"));
    let _ = r;
    assert_eq!(
        one(&m, K::OperandCount),
        "@main: %r = \"pp.relu\": expects 1 operand, found 2"
    );
}

#[test]
fn result_count() {
    let mut f = Function::new("f");
    let x = f.add_arg("x", ty("6xf32"), ArgKind::Input);
    let split = Attrs::new().with("split", Attr::Ints(vec![2, 4]));
    f.push_op(op(OpKind::Split, vec![x], &["2xf32"], "s").attrs(split));
    f.push_op(NewOp::new(OpKind::Relu, vec![x], vec![]));
    f.push_op(
        op(OpKind::Send, vec![x], &["6xf32"], "t")
            .attrs(comm(1, 0))
            .stage(0),
    );
    let es = errors(&module(vec![f]));
    let want = [
        (
            K::ResultCount,
            "@f: %s = \"pp.split\": expects 2 results (one per 'split' entry), found 1",
        ),
        (
            K::ResultCount,
            "@f: op #1 \"pp.relu\": expects 1 result, found 0",
        ),
        (
            K::ResultCount,
            "@f: %t = \"pp.send\": send has no results, found 1",
        ),
        (
            K::UnmatchedSend,
            "@f: %t = \"pp.send\": unmatched send: no recv on stage 1 from stage 0 on channel 0",
        ),
    ];
    let want: Vec<_> = want.iter().map(|(k, s)| (*k, s.to_string())).collect();
    assert_eq!(es, want);
}

#[test]
fn result_type() {
    let mut m = mlp();
    let f = &mut m.functions[0];
    let y = f.find_value("y").unwrap();
    f.set_type(y, ty("?x12xf32"));
    assert_eq!(one(&m, K::ResultType), "@main: %y = \"pp.relu\": result 0 (%y) is declared tensor<?x12xf32> but inferred tensor<?x10xf32>");
    // `?` in a declaration matches anything, and a known size matches an inferred `?`.
    let f = &mut m.functions[0];
    f.set_type(y, ty("8x10xf32"));
    assert_eq!(verify_module(&m), Ok(()));
    let f = &mut m.functions[0];
    f.set_type(y, ty("?x10xf64"));
    assert_eq!(one(&m, K::ResultType), "@main: %y = \"pp.relu\": result 0 (%y) is declared tensor<?x10xf64> but inferred tensor<?x10xf32>");
}

#[test]
fn use_before_def() {
    let mut m = mlp();
    let f = &mut m.functions[0];
    let order: Vec<OpId> = f.ops().iter().rev().copied().collect();
    f.set_layout(order);
    assert_eq!(
        one(&m, K::UseBeforeDef),
        "@main: %y = \"pp.relu\": operand 0 (%h) is used before its definition"
    );
}

#[test]
fn use_of_removed_op() {
    let mut m = mlp();
    let f = &mut m.functions[0];
    let h = f.find_value("h").unwrap();
    f.remove_op(f.producer(h).unwrap());
    assert_eq!(
        one(&m, K::RemovedValue),
        "@main: %y = \"pp.relu\": operand 0 (%h) is a result of a removed op"
    );
    let f = &mut m.functions[0];
    let y = f.find_value("y").unwrap();
    f.remove_op(f.producer(y).unwrap());
    assert_eq!(
        one(&m, K::RemovedValue),
        "@main: returned value 0 (%y) is a result of a removed op"
    );
}

#[test]
fn broken_layout() {
    let mut m = mlp();
    let f = &mut m.functions[0];
    let first = f.ops()[0];
    f.set_layout(vec![first, first]);
    let es = errors(&m);
    assert_eq!(
        es,
        vec![
            (
                K::Layout,
                "@main: body entry #1 repeats the op at entry #0".to_string()
            ),
            (
                K::UndefinedValue,
                "@main: returned value 0 (%y) is defined by an op that is not in the body"
                    .to_string()
            ),
        ]
    );
    let f = &mut m.functions[0];
    f.set_layout(vec![first, OpId(99)]);
    assert_eq!(
        errors(&m)[0],
        (
            K::Layout,
            "@main: body entry #1 refers to op 99, which does not exist".to_string()
        )
    );
    let f = &mut m.functions[0];
    let second = OpId(1);
    f.remove_op(second);
    f.set_layout(vec![first, second]);
    assert_eq!(
        errors(&m)[0],
        (
            K::Layout,
            "@main: body entry #1 is a removed pp.relu op".to_string()
        )
    );
}

#[test]
fn duplicate_names() {
    let mut m = mlp();
    let f = &mut m.functions[0];
    let y = f.find_value("y").unwrap();
    f.rename_value(y, "x");
    assert_eq!(
        one(&m, K::DuplicateValueName),
        "@main: %x = \"pp.relu\": value %x is already defined by argument 0"
    );
    let f = &mut m.functions[0];
    f.rename_value(y, "h");
    assert_eq!(
        one(&m, K::DuplicateValueName),
        "@main: %h = \"pp.relu\": value %h is already defined by op #0 \"pp.matmul\""
    );
    let f = &mut m.functions[0];
    f.rename_value(y, "");
    assert_eq!(
        one(&m, K::EmptyValueName),
        "@main: % = \"pp.relu\": op #1 \"pp.relu\" has an empty name"
    );
    let f = &mut m.functions[0];
    f.rename_value(y, "y");
    let copy = m.functions[0].clone();
    m.functions.push(copy);
    assert_eq!(
        one(&m, K::DuplicateFunction),
        "@main: function @main is already defined (function 0 of the module)"
    );
}

#[test]
fn attributes() {
    let mut m = mlp();
    let f = &mut m.functions[0];
    let y = f.find_value("y").unwrap();
    f.push(
        op(OpKind::Transpose, vec![y], &["10x?xf32"], "t")
            .attrs(Attrs::new().with("perm", Attr::Str("1,0".into()))),
    );
    f.push(op(OpKind::Cast, vec![y], &["?x10xi64"], "c"));
    f.attrs.set("stage", Attr::Str("zero".into()));
    let es = errors(&m);
    let want = [
        (K::AttributeKind, "@main: function attribute `stage`: expected an integer, found string"),
        (K::AttributeKind, "@main: %t = \"pp.transpose\": attribute `perm`: expected an integer list, found string"),
        (K::MissingAttribute, "@main: %c = \"pp.cast\": missing required attribute 'to'"),
    ];
    let want: Vec<_> = want.iter().map(|(k, s)| (*k, s.to_string())).collect();
    assert_eq!(es, want);
}

#[test]
fn weights() {
    let mut m = mlp();
    m.weights
        .insert("w".into(), Tensor::zeros(DType::F32, vec![10, 784]));
    assert_eq!(
        one(&m, K::WeightType),
        "@main: param %w has type tensor<784x10xf32> but the module weight \"w\" is tensor<10x784xf32>"
    );

    let mut f = Function::new("opt");
    f.add_arg("w", ty("784x?xf32"), ArgKind::State);
    let mut m = mlp();
    m.functions.push(f);
    assert_eq!(
        one(&m, K::SymbolicWeight),
        "@opt: state %w has type tensor<784x?xf32>; weights cannot have the batch dimension `?`"
    );

    // Without a module weight, the functions must agree among themselves.
    let mut m = mlp();
    m.weights.clear();
    let mut f = Function::new("opt");
    f.add_arg("w", ty("10x784xf32"), ArgKind::Param);
    m.functions.push(f);
    assert_eq!(
        one(&m, K::WeightConflict),
        "@opt: param %w has type tensor<10x784xf32> but @main declares it as tensor<784x10xf32>"
    );
}

/// Stage 0 computes relu(x) and sends it; stage 1 receives it and returns its softmax.
fn pipeline() -> Module {
    let mut f0 = Function::new("stage0");
    f0.attrs.set("stage", Attr::Int(0));
    let x = f0.add_arg("x", ty("?x10xf32"), ArgKind::Input);
    let h = f0.push(op(OpKind::Relu, vec![x], &["?x10xf32"], "h"));
    f0.push_op(NewOp::new(OpKind::Send, vec![h], vec![]).attrs(comm(1, 7)));
    let mut f1 = Function::new("stage1");
    let r = f1.push(
        op(OpKind::Recv, vec![], &["?x10xf32"], "r")
            .attrs(comm(0, 7))
            .stage(1),
    );
    let y = f1.push(op(OpKind::Softmax, vec![r], &["?x10xf32"], "y"));
    f1.set_results(vec![y]);
    module(vec![f0, f1])
}

#[test]
fn send_recv_pairs_across_functions() {
    assert_eq!(verify_module(&pipeline()), Ok(()));

    // Two links in both directions, stages from op annotations only.
    let mut m = pipeline();
    let f1 = &mut m.functions[1];
    let y = f1.find_value("y").unwrap();
    f1.push_op(
        NewOp::new(OpKind::Send, vec![y], vec![])
            .attrs(comm(0, 8))
            .stage(1),
    );
    let f0 = &mut m.functions[0];
    f0.push_op(
        op(OpKind::Recv, vec![], &["?x10xf32"], "back")
            .attrs(comm(1, 8))
            .stage(0),
    );
    assert_eq!(verify_module(&m), Ok(()));
}

#[test]
fn unmatched_and_mismatched_comm() {
    let mut m = pipeline();
    let f1 = &mut m.functions[1];
    let r = f1.find_value("r").unwrap();
    f1.op_mut(f1.producer(r).unwrap())
        .attrs
        .set("channel", Attr::Int(9));
    assert_eq!(
        errors(&m),
        vec![
            (K::UnmatchedSend, "@stage0: op #1 \"pp.send\": unmatched send: no recv on stage 1 from stage 0 on channel 7".into()),
            (K::UnmatchedRecv, "@stage1: %r = \"pp.recv\": unmatched recv: no send from stage 0 to stage 1 on channel 9".into()),
        ]
    );

    let mut m = pipeline();
    let f1 = &mut m.functions[1];
    let r = f1.find_value("r").unwrap();
    f1.set_type(r, ty("8x10xf32"));
    assert_eq!(
        one(&m, K::CommTypeMismatch),
        "@stage1: %r = \"pp.recv\": recv type tensor<8x10xf32> differs from the sent type tensor<?x10xf32> (@stage0: op #1 \"pp.send\")"
    );
}

#[test]
fn duplicate_comm() {
    let mut m = pipeline();
    let f0 = &mut m.functions[0];
    let h = f0.find_value("h").unwrap();
    f0.push_op(NewOp::new(OpKind::Send, vec![h], vec![]).attrs(comm(1, 7)));
    let f1 = &mut m.functions[1];
    f1.push_op(
        op(OpKind::Recv, vec![], &["?x10xf32"], "r2")
            .attrs(comm(0, 7))
            .stage(1),
    );
    assert_eq!(
        errors(&m),
        vec![
            (
                K::DuplicateSend,
                "@stage0: op #2 \"pp.send\": duplicate send from stage 0 to stage 1 on channel 7; the first is @stage0: op #1 \"pp.send\"".into()
            ),
            (
                K::DuplicateRecv,
                "@stage1: %r2 = \"pp.recv\": duplicate recv on stage 1 from stage 0 on channel 7; the first is @stage1: %r = \"pp.recv\"".into()
            ),
        ]
    );
}

#[test]
fn comm_stage_problems() {
    let mut m = pipeline();
    m.functions[0].attrs.remove("stage");
    assert_eq!(
        errors(&m),
        vec![
            (
                K::MissingStage,
                "@stage0: op #1 \"pp.send\": send needs a stage: set the op's stage or the function attribute 'stage'".into()
            ),
            (K::UnmatchedRecv, "@stage1: %r = \"pp.recv\": unmatched recv: no send from stage 0 to stage 1 on channel 7".into()),
        ]
    );

    let mut m = pipeline();
    let f1 = &mut m.functions[1];
    let r = f1.producer(f1.find_value("r").unwrap()).unwrap();
    f1.op_mut(r).stage = Some(0);
    let es = errors(&m);
    assert_eq!(es[0], (K::UnmatchedSend, "@stage0: op #1 \"pp.send\": unmatched send: no recv on stage 1 from stage 0 on channel 7".into()));
    assert_eq!(
        es[1],
        (
            K::SelfComm,
            "@stage1: %r = \"pp.recv\": recv from its own stage 0".into()
        )
    );

    let mut m = pipeline();
    m.functions[0].attrs.set("stage", Attr::Int(1));
    assert_eq!(
        errors(&m)[0],
        (
            K::SelfComm,
            "@stage0: op #1 \"pp.send\": send to its own stage 1".into()
        )
    );

    let mut m = pipeline();
    m.functions[0].attrs.set("stage", Attr::Int(-1));
    assert_eq!(
        errors(&m)[0],
        (
            K::InvalidStage,
            "@stage0: function attribute 'stage' must be a stage number >= 0, found -1".into()
        )
    );

    let mut m = pipeline();
    let send = m.functions[0].ops()[1];
    m.functions[0].op_mut(send).attrs.set("peer", Attr::Int(-3));
    assert_eq!(
        errors(&m)[0],
        (
            K::InvalidStage,
            "@stage0: op #1 \"pp.send\": 'peer' must be a stage number >= 0, found -3".into()
        )
    );

    let mut m = pipeline();
    m.functions[0].op_mut(send).attrs.remove("channel");
    assert_eq!(
        errors(&m)[0],
        (
            K::MissingAttribute,
            "@stage0: op #1 \"pp.send\": missing required attribute 'channel'".into()
        )
    );
}

#[test]
fn verify_function_skips_cross_function_checks() {
    let m = pipeline();
    let mut lonely = m.clone();
    lonely.functions.remove(1);
    // Alone, stage0's send has no partner: only the module check notices.
    assert_eq!(verify_function(&lonely, &lonely.functions[0]), Ok(()));
    assert_eq!(errors(&lonely)[0].0, K::UnmatchedSend);
}

#[test]
fn errors_come_in_module_order() {
    let mut m = pipeline();
    // A later op error in stage0, an argument error in stage1, an early op error in stage0.
    let f0 = &mut m.functions[0];
    let x = f0.find_value("x").unwrap();
    f0.push(op(OpKind::Exp, vec![x, x], &["?x10xf32"], "late"));
    f0.set_type(f0.find_value("h").unwrap(), ty("?x11xf32"));
    let f1 = &mut m.functions[1];
    f1.add_arg("p", ty("?xf32"), ArgKind::Param);
    let kinds: Vec<_> = errors(&m).into_iter().map(|(k, _)| k).collect();
    // The send's type changed with h: the recv in stage1 reports it, after stage1's arguments.
    assert_eq!(
        kinds,
        [
            K::ResultType,
            K::OperandCount,
            K::SymbolicWeight,
            K::CommTypeMismatch
        ]
    );
}

/// Random edits through the public API never make the verifier panic.
#[test]
fn never_panics_on_broken_modules() {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    let shapes = ["?x4xf32", "4x4xf32", "4xi64", "2x?x4xi1", "f32"];
    for round in 0..300 {
        let mut m = pipeline();
        let f = &mut m.functions[round % 2];
        for _ in 0..6 {
            let vals = f.num_values();
            let kind = OpKind::ALL[next(OpKind::ALL.len())];
            let n_ops = next(4);
            let operands = (0..n_ops).map(|_| ValueId(next(vals) as u32)).collect();
            let results = (0..next(3))
                .map(|_| shapes[next(shapes.len())])
                .collect::<Vec<_>>();
            let mut new = NewOp::new(kind, operands, results.iter().map(|s| ty(s)).collect());
            if next(2) == 0 {
                new = new.attrs(comm(next(3) as i64, 7));
            }
            if next(2) == 0 {
                new = new.stage(next(3) as u32);
            }
            f.push_op(new);
        }
        match next(5) {
            0 => {
                let ops = f.ops().to_vec();
                f.remove_op(ops[next(ops.len())]);
            }
            1 => {
                let mut ops = f.ops().to_vec();
                ops.reverse();
                f.set_layout(ops);
            }
            2 => {
                let v = ValueId(next(f.num_values()) as u32);
                f.rename_value(v, "x");
            }
            3 => {
                let v = ValueId(next(f.num_values()) as u32);
                f.set_results(vec![v, v]);
            }
            _ => {
                // Same length (set_layout asserts that much), but bogus entries.
                let n = f.num_op_slots() as u32;
                let mut ops = vec![OpId(0); f.ops().len()];
                ops[0] = OpId(n + 3);
                f.set_layout(ops);
            }
        }
        let _ = verify_module(&m);
        let _ = verify_function(&m, &m.functions[0]);
    }
}

#[test]
fn oversized_types() {
    // An input of 2^31 x 2^31 x 4 f32 elements: the count wraps to 0 in u64 arithmetic.
    let mut f = Function::new("main");
    let x = f.add_arg("x", ty("2147483648x2147483648x4xf32"), ArgKind::Input);
    let y = f.push(op(
        OpKind::Relu,
        vec![x],
        &["2147483648x2147483648x4xf32"],
        "y",
    ));
    f.set_results(vec![y]);
    let es = errors(&module(vec![f]));
    let kinds: Vec<_> = es.iter().map(|e| e.0).collect();
    assert!(kinds.contains(&K::TooLarge), "{es:#?}");
    assert!(
        es[0]
            .1
            .starts_with("@main: argument %x: shape tensor<2147483648x2147483648x4xf32>"),
        "{es:#?}"
    );
    assert!(
        es.iter()
            .any(|e| e.1.contains("%y = \"pp.relu\": result 0 (%y): shape")),
        "{es:#?}"
    );

    // A recv's declared type is the only one it has.
    let mut f = Function::new("main");
    f.attrs.set("stage", Attr::Int(1));
    let r = f.push(
        NewOp::new(OpKind::Recv, vec![], vec![ty("4611686018427387904x4xf32")])
            .attrs(comm(0, 0))
            .names(vec!["r".into()]),
    );
    f.set_results(vec![r]);
    let msg = verify_function(&Module::new(), &f).unwrap_err()[0].to_string();
    assert!(msg.contains("%r = \"pp.recv\": result 0 (%r): shape tensor<4611686018427387904x4xf32> of 4-byte elements is too large"), "{msg}");
}

/// Two stages' optimizer functions summing `grad.w` with one all_reduce each.
fn reduce_text(a: &str, b: &str) -> String {
    format!(
        r#"module {{
  func @o0(%g: tensor<4xf32>) -> (tensor<4xf32>) attributes {{stage = 0}} {{
    %s = "pp.all_reduce"(%g) {{{a}}} : (tensor<4xf32>) -> tensor<4xf32>
    return %s : tensor<4xf32>
  }}
  func @o1(%g: tensor<4xf32>) -> (tensor<4xf32>) attributes {{stage = 1}} {{
    %s = "pp.all_reduce"(%g) {{{b}}} : (tensor<4xf32>) -> tensor<4xf32>
    return %s : tensor<4xf32>
  }}
}}"#
    )
}

#[test]
fn all_reduce_participants_agree() {
    let ok = "channel = 3, stages = [0, 1]";
    let m = crate::text::parse_module(&reduce_text(ok, ok)).unwrap();
    assert_eq!(errors(&m), vec![]);
    // Stage 1 lists only stage 0, and so misses its own stage.
    let m = crate::text::parse_module(&reduce_text(ok, "channel = 3, stages = [0]")).unwrap();
    assert_eq!(
        errors(&m),
        vec![
            (K::UnmatchedCollective, "@o0: %s = \"pp.all_reduce\": all_reduce on channel 3 lists stage 1, which runs no all_reduce on it".into()),
            (K::CollectiveMismatch, "@o1: %s = \"pp.all_reduce\": all_reduce on stage 1 lists stages [0], which do not include its own".into()),
        ]
    );
    // Same channel, different replicas flag.
    let m = crate::text::parse_module(&reduce_text(
        ok,
        "channel = 3, stages = [0, 1], replicas = 1",
    ))
    .unwrap();
    assert_eq!(
        one(&m, K::CollectiveMismatch),
        "@o1: %s = \"pp.all_reduce\": all_reduce on channel 3 differs from @o0: %s = \"pp.all_reduce\" (stages, replicas or type)"
    );
    // Different channels: each misses the other stage.
    let m = crate::text::parse_module(&reduce_text(ok, "channel = 4, stages = [0, 1]")).unwrap();
    let kinds: Vec<K> = errors(&m).into_iter().map(|e| e.0).collect();
    assert_eq!(kinds, vec![K::UnmatchedCollective, K::UnmatchedCollective]);
}

/// One stage's ZeRO-1 update of a 6-element weight over 4 replicas (shards of 2).
fn shard_text(rs: &str, ag: &str) -> String {
    format!(
        r#"module {{
  func @o0(%w: tensor<2x3xf32>, %g: tensor<2x3xf32>) -> (tensor<2x3xf32>) attributes {{stage = 0}} {{
    %gs = "pp.reduce_scatter"(%g) {{{rs}}} : (tensor<2x3xf32>) -> tensor<2xf32>
    %ws = "pp.shard"(%w) {{channel = 1, replicas = 4, shape = [2, 3]}} : (tensor<2x3xf32>) -> tensor<2xf32>
    %u = "pp.sub"(%ws, %gs) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
    %new.w = "pp.all_gather"(%u) {{{ag}}} : (tensor<2xf32>) -> tensor<2x3xf32>
    return %new.w : tensor<2x3xf32>
  }}
}}"#
    )
}

#[test]
fn sharded_ops_agree_and_have_shard_types() {
    let rs = "channel = 0, replicas = 4, shape = [2, 3]";
    let ag = "channel = 2, replicas = 4, shape = [2, 3]";
    let m = crate::text::parse_module(&shard_text(rs, ag)).unwrap();
    assert_eq!(errors(&m), vec![]);
    // The all-gather reuses the reduce-scatter's channel: one channel, one op per stage.
    let m = crate::text::parse_module(&shard_text(rs, "channel = 0, replicas = 4, shape = [2, 3]"))
        .unwrap();
    let es = errors(&m);
    assert!(
        es.iter().any(|e| e.0 == K::CollectiveMismatch
            && e.1
                .contains("all_gather on channel 0 differs from @o0: %gs = \"pp.reduce_scatter\"")),
        "{es:#?}"
    );
    // A shard of the wrong length for the replicas (3 replicas: shards of 2 too, but the
    // declared shape is another weight's).
    let m = crate::text::parse_module(&shard_text("channel = 0, replicas = 4, shape = [3, 3]", ag))
        .unwrap();
    let es = errors(&m);
    assert!(
        es.iter().any(|e| e.1.contains(
            "the operand is tensor<2x3xf32>, expected tensor<3x3xf32> (a parameter of shape [3, 3] over 4 replicas)"
        )),
        "{es:#?}"
    );
}
