//! `onnx`: the ONNX importer as `ppcc import` runs it — decode, import (shape inference
//! included), verify, print — in-process, with and without a bound batch size.
//!
//! Format-aware mutations decode the protobuf, change one thing a hostile model would
//! (dims, attribute values, node inputs/outputs, op types, initializer types and data
//! lengths, external-data entries, value types, opsets) and encode it again.

use std::path::PathBuf;

use ppcc_frontends::onnx::proto::{
    self, AttributeProto, Dimension, DimensionValue, ModelProto, NodeProto, StringStringEntryProto,
    TensorProto, TypeProto, TypeValue,
};
use ppcc_frontends::onnx::{decode_model, import_model, ImportOptions, SUPPORTED_OPS};
use ppir::text::{print_module, PrintOptions};
use prost::Message;

use super::{files_with_ext, read_all, Env, Target, Verdict};
use crate::mutate::interesting;
use crate::rng::Rng;

pub struct Onnx;

/// The external-data file that mutated models may point at (in `Env::scratch`).
pub const EXTERNAL_FILE: &str = "weights.bin";

impl Target for Onnx {
    fn name(&self) -> &'static str {
        "onnx"
    }
    fn describe(&self) -> &'static str {
        "ONNX import + verify + print (ppcc_frontends::onnx::import_model, ppir::verify)"
    }
    fn ext(&self) -> &'static str {
        "onnx"
    }
    fn weight(&self) -> u32 {
        4
    }

    fn seeds(&self, env: &Env) -> anyhow::Result<Vec<Vec<u8>>> {
        let mut paths = files_with_ext(&env.root.join("examples"), &["onnx"], false);
        if paths.is_empty() {
            anyhow::bail!("no seed models in {}/examples", env.root.display());
        }
        if let Some(dir) = &env.onnx_testdata {
            let small: Vec<PathBuf> = files_with_ext(dir, &["onnx"], true)
                .into_iter()
                .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.len() < 200_000))
                .collect();
            // An even sample, in path order, so the seed set is the same on every machine.
            let step = small.len().div_ceil(env.onnx_sample.max(1)).max(1);
            paths.extend(small.into_iter().step_by(step));
        }
        read_all(&paths)
    }

    fn mutate_structured(
        &self,
        rng: &mut Rng,
        input: &[u8],
        corpus: &[Vec<u8>],
    ) -> Option<Vec<u8>> {
        let mut m = decode_model(input).ok()?;
        let donor = (!corpus.is_empty())
            .then(|| decode_model(rng.pick(corpus).as_slice()))
            .and_then(Result::ok);
        mutate_model(rng, &mut m, donor.as_ref());
        Some(m.encode_to_vec())
    }

    fn run(&self, env: &Env, input: &[u8]) -> Verdict {
        let model = match decode_model(input) {
            Ok(m) => m,
            Err(e) => return Verdict::Rejected(e.to_string()),
        };
        let mut verdict = Verdict::Accepted;
        for batch in [None, Some(2)] {
            let opts = ImportOptions {
                batch,
                model_dir: Some(env.scratch.clone()),
                ..Default::default()
            };
            match import_model(&model, &opts) {
                Ok(imported) => {
                    if let Err(errors) = ppir::verify::verify_module(&imported.module) {
                        // `ppcc import` warns and goes on; the error text is still exercised.
                        let text: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
                        verdict =
                            Verdict::Rejected(format!("does not verify: {}", text.join("; ")));
                    }
                    let _ = print_module(
                        &imported.module,
                        &PrintOptions {
                            elide_weights_over: Some(16),
                        },
                    );
                }
                Err(e) => verdict = Verdict::Rejected(e.to_string()),
            }
        }
        verdict
    }
}

fn names(g: &proto::GraphProto) -> Vec<String> {
    let mut v: Vec<String> = g.input.iter().map(|i| i.name.clone()).collect();
    v.extend(g.initializer.iter().map(|t| t.name.clone()));
    for n in &g.node {
        v.extend(n.input.iter().cloned());
        v.extend(n.output.iter().cloned());
    }
    v.push(String::new());
    v.push("no_such_value".into());
    v
}

fn mutate_model(rng: &mut Rng, m: &mut ModelProto, donor: Option<&ModelProto>) {
    if rng.one_in(20) {
        // The opset: missing, ancient, future, absurd.
        match m.opset_import.first_mut() {
            Some(o) if !rng.one_in(4) => {
                o.version = *rng.pick(&[0, 1, 6, 12, 13, 21, 99, -1, i64::MAX])
            }
            _ => m.opset_import.clear(),
        }
        return;
    }
    let Some(g) = m.graph.as_mut() else { return };
    let pool = names(g);
    match rng.below(14) {
        0 | 1 => {
            if let Some(n) = pick_mut(rng, &mut g.node) {
                mutate_attributes(rng, n, donor);
            }
        }
        2 => {
            if let Some(n) = pick_mut(rng, &mut g.node) {
                n.op_type = if rng.one_in(8) {
                    "NoSuchOp".into()
                } else {
                    rng.pick(SUPPORTED_OPS).to_string()
                };
            }
        }
        3 => {
            // Rewire an input: another value, an empty (optional) name, a missing one.
            if let Some(n) = pick_mut(rng, &mut g.node) {
                let name = rng.pick(&pool).clone();
                match rng.below(4) {
                    0 => n.input.push(name),
                    1 => {
                        n.input.pop();
                    }
                    _ if !n.input.is_empty() => {
                        let i = rng.below(n.input.len());
                        n.input[i] = name;
                    }
                    _ => n.input.push(name),
                }
            }
        }
        4 => {
            // Rename an output, often to a name that already exists (a second writer).
            if let Some(n) = pick_mut(rng, &mut g.node) {
                let name = rng.pick(&pool).clone();
                if n.output.is_empty() || rng.one_in(4) {
                    n.output.push(name);
                } else {
                    let i = rng.below(n.output.len());
                    n.output[i] = name;
                }
            }
        }
        5 => {
            // Delete, duplicate or move a node.
            if !g.node.is_empty() {
                let i = rng.below(g.node.len());
                match rng.below(3) {
                    0 => {
                        g.node.remove(i);
                    }
                    1 => {
                        let n = g.node[i].clone();
                        g.node.insert(rng.below(g.node.len() + 1), n);
                    }
                    _ => {
                        let j = rng.below(g.node.len());
                        g.node.swap(i, j);
                    }
                }
            }
        }
        6 | 7 => {
            if let Some(t) = pick_mut(rng, &mut g.initializer) {
                mutate_tensor(rng, t);
            }
        }
        8 => {
            // An initializer given twice, or one shadowing an input or a node output.
            if let Some(t) = g
                .initializer
                .get(rng.below(g.initializer.len().max(1)))
                .cloned()
            {
                let mut t2 = t;
                if rng.one_in(2) {
                    t2.name = rng.pick(&pool).clone();
                }
                if rng.one_in(2) {
                    t2.dims.push(1);
                }
                g.initializer.push(t2);
            }
        }
        9 | 10 => {
            let which = rng.below(3);
            let list = match which {
                0 => &mut g.input,
                1 => &mut g.output,
                _ => &mut g.value_info,
            };
            if let Some(vi) = pick_mut(rng, list) {
                match rng.below(4) {
                    0 => vi.name = rng.pick(&pool).clone(),
                    1 => vi.r#type = None,
                    _ => {
                        if let Some(ty) = vi.r#type.as_mut() {
                            mutate_type(rng, ty);
                        }
                    }
                }
            } else if which == 0 {
                // A graph input with a crafted type.
                let mut vi = proto::ValueInfoProto {
                    name: rng.pick(&pool).clone(),
                    ..Default::default()
                };
                let mut ty = TypeProto::default();
                mutate_type(rng, &mut ty);
                vi.r#type = Some(ty);
                g.input.push(vi);
            }
        }
        11 => {
            // Drop or duplicate a graph input/output/initializer.
            match rng.below(4) {
                0 if !g.output.is_empty() => {
                    g.output.remove(rng.below(g.output.len()));
                }
                1 if !g.input.is_empty() => {
                    let v = g.input[rng.below(g.input.len())].clone();
                    g.input.push(v);
                }
                2 if !g.initializer.is_empty() => {
                    g.initializer.remove(rng.below(g.initializer.len()));
                }
                _ if !g.output.is_empty() => {
                    let v = g.output[rng.below(g.output.len())].clone();
                    g.output.push(v);
                }
                _ => {}
            }
        }
        12 => {
            // A node or initializer from another model (splicing at the graph level).
            if let Some(dg) = donor.and_then(|d| d.graph.as_ref()) {
                if !dg.node.is_empty() && rng.one_in(2) {
                    let n = dg.node[rng.below(dg.node.len())].clone();
                    g.node.insert(rng.below(g.node.len() + 1), n);
                } else if !dg.initializer.is_empty() {
                    g.initializer
                        .push(dg.initializer[rng.below(dg.initializer.len())].clone());
                }
            }
        }
        _ => {
            // A Constant node with a crafted value feeding an existing node.
            let mut t = g
                .initializer
                .first()
                .cloned()
                .unwrap_or_else(|| TensorProto {
                    dims: vec![2],
                    data_type: proto::data_type::INT64,
                    int64_data: vec![1, 2],
                    ..Default::default()
                });
            mutate_tensor(rng, &mut t);
            let out = format!("fuzz_const_{}", rng.below(1000));
            let node = NodeProto {
                op_type: "Constant".into(),
                output: vec![out.clone()],
                attribute: vec![AttributeProto {
                    name: "value".into(),
                    r#type: 4,
                    t: Some(t),
                    ..Default::default()
                }],
                ..Default::default()
            };
            if let Some(n) = pick_mut(rng, &mut g.node) {
                if !n.input.is_empty() {
                    let i = rng.below(n.input.len());
                    n.input[i] = out;
                }
            }
            g.node.insert(0, node);
        }
    }
}

fn pick_mut<'a, T>(rng: &mut Rng, v: &'a mut [T]) -> Option<&'a mut T> {
    if v.is_empty() {
        None
    } else {
        let i = rng.below(v.len());
        Some(&mut v[i])
    }
}

fn mutate_attributes(rng: &mut Rng, n: &mut NodeProto, donor: Option<&ModelProto>) {
    if n.attribute.is_empty() || rng.one_in(5) {
        // Add one: borrowed from another model's node, or a common name with a crafted value.
        let from_donor = donor
            .and_then(|d| d.graph.as_ref())
            .map(|g| {
                g.node
                    .iter()
                    .flat_map(|n| n.attribute.iter())
                    .cloned()
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        let a = if !from_donor.is_empty() && rng.one_in(2) {
            rng.pick(&from_donor).clone()
        } else {
            let name = *rng.pick(&[
                "axis",
                "axes",
                "perm",
                "shape",
                "pads",
                "strides",
                "kernel_shape",
                "dilations",
                "group",
                "keepdims",
                "to",
                "value",
                "alpha",
                "epsilon",
                "transA",
                "transB",
                "split",
                "starts",
                "ends",
                "count_include_pad",
                "ceil_mode",
                "auto_pad",
            ]);
            AttributeProto {
                name: name.into(),
                r#type: 2,
                i: interesting(rng),
                ..Default::default()
            }
        };
        n.attribute.push(a);
        return;
    }
    let i = rng.below(n.attribute.len());
    let a = &mut n.attribute[i];
    match rng.below(9) {
        0 => a.i = interesting(rng),
        1 => {
            if a.ints.is_empty() {
                a.ints.push(interesting(rng));
            } else {
                let j = rng.below(a.ints.len());
                a.ints[j] = interesting(rng);
            }
        }
        2 => match rng.below(3) {
            0 => {
                a.ints.pop();
            }
            1 => a.ints.push(interesting(rng)),
            _ => a.ints = (0..rng.below(70)).map(|_| interesting(rng)).collect(),
        },
        3 => a.f = *rng.pick(&[f32::NAN, f32::INFINITY, -1.0, 0.0, 1e30, -1e-30, f32::MAX]),
        4 => a.r#type = rng.below(16) as i32,
        5 => {
            a.s = rng
                .pick(&[
                    &b""[..],
                    b"SAME_UPPER",
                    b"VALID",
                    b"NOTSET",
                    b"\xff\xfe",
                    b"constant",
                    b"reflect",
                ])
                .to_vec()
        }
        6 => {
            if let Some(t) = a.t.as_mut() {
                mutate_tensor(rng, t);
            } else {
                a.t = Some(TensorProto {
                    dims: vec![interesting(rng)],
                    data_type: proto::data_type::INT64,
                    int64_data: vec![interesting(rng)],
                    ..Default::default()
                });
            }
        }
        7 => {
            n.attribute.remove(i);
        }
        _ => {
            let a = a.clone();
            n.attribute.push(a);
        }
    }
}

fn mutate_tensor(rng: &mut Rng, t: &mut TensorProto) {
    match rng.below(10) {
        0 | 1 => {
            if t.dims.is_empty() || rng.one_in(4) {
                t.dims.push(interesting(rng));
            } else {
                let j = rng.below(t.dims.len());
                t.dims[j] = interesting(rng);
            }
        }
        2 => match rng.below(3) {
            0 => {
                t.dims.pop();
            }
            1 => t.dims.clear(),
            _ => t.dims = vec![1 << 31, 1 << 31, 4],
        },
        3 => t.data_type = rng.below(24) as i32,
        4 => {
            let n = rng.below(t.raw_data.len() + 1);
            t.raw_data.truncate(n);
        }
        5 => {
            let extra = rng.below(64);
            t.raw_data.extend(std::iter::repeat_n(0u8, extra));
        }
        6 => {
            // Data in a typed field as well as (or instead of) raw_data.
            match rng.below(4) {
                0 => t.float_data = vec![1.0; rng.below(8)],
                1 => t.int64_data = vec![interesting(rng); rng.below(8)],
                2 => t.int32_data = vec![-1; rng.below(8)],
                _ => t.double_data = vec![f64::NAN; rng.below(8)],
            }
        }
        7 | 8 => {
            // External data: in or out of the model's folder, any range.
            t.data_location = if rng.one_in(6) {
                rng.below(4) as i32
            } else {
                1
            };
            let location = *rng.pick(&[
                EXTERNAL_FILE,
                EXTERNAL_FILE,
                "../weights.bin",
                "/etc/passwd",
                "",
                "sub/../weights.bin",
                "no_such_file.bin",
                ".",
            ]);
            let mut entries = vec![kv("location", location)];
            if !rng.one_in(3) {
                entries.push(kv("offset", &external_number(rng)));
            }
            if !rng.one_in(3) {
                entries.push(kv("length", &external_number(rng)));
            }
            t.external_data = entries;
            if !rng.one_in(3) {
                t.raw_data.clear();
            }
        }
        _ => {
            t.segment = Some(proto::Segment {
                begin: interesting(rng),
                end: interesting(rng),
            })
        }
    }
}

fn external_number(rng: &mut Rng) -> String {
    match rng.below(6) {
        0 => "-1".into(),
        1 => "abc".into(),
        2 => "18446744073709551615".into(),
        _ => (rng.below(4096) as u64).to_string(),
    }
}

fn kv(key: &str, value: &str) -> StringStringEntryProto {
    StringStringEntryProto {
        key: key.into(),
        value: value.into(),
    }
}

fn mutate_type(rng: &mut Rng, ty: &mut TypeProto) {
    let tt = match ty.value.as_mut() {
        Some(TypeValue::TensorType(tt)) if !rng.one_in(10) => tt,
        _ => {
            ty.value = Some(TypeValue::TensorType(proto::TypeTensor {
                elem_type: 1,
                shape: Some(proto::TensorShapeProto { dim: vec![] }),
            }));
            let Some(TypeValue::TensorType(tt)) = ty.value.as_mut() else {
                return;
            };
            tt
        }
    };
    if rng.one_in(4) {
        tt.elem_type = rng.below(24) as i32;
        return;
    }
    let shape = tt.shape.get_or_insert_with(Default::default);
    match rng.below(5) {
        0 => shape.dim.push(dim_value(interesting(rng))),
        1 => {
            shape.dim.pop();
        }
        2 => {
            shape.dim = vec![dim_value(1 << 31), dim_value(1 << 31), dim_value(4)];
        }
        3 => {
            if let Some(d) = pick_mut(rng, &mut shape.dim) {
                d.value = Some(DimensionValue::DimParam(
                    rng.pick(&["batch", "N", "", "seq"]).to_string(),
                ));
            }
        }
        _ => {
            if let Some(d) = pick_mut(rng, &mut shape.dim) {
                *d = dim_value(interesting(rng));
            }
        }
    }
}

fn dim_value(v: i64) -> Dimension {
    Dimension {
        value: Some(DimensionValue::DimValue(v)),
        denotation: String::new(),
    }
}
