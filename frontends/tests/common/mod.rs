//! Helpers shared by the frontend tests: small ONNX models built with the prost types, and
//! the location of the onnx package's bundled test data.
#![allow(dead_code)]

use std::path::PathBuf;

use ppcc_frontends::onnx::proto::*;
use ppcc_frontends::onnx::tensor::tensor_to_proto;
use ppir::interp::{run_function, InterpOptions};
use ppir::{ArgKind, Module, Tensor};
use prost::Message;

/// A tensor value info: `dims` entries `Ok(n)` are sizes, `Err(name)` symbolic.
pub fn value_info(name: &str, elem_type: i32, dims: &[Result<i64, &str>]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| Dimension {
            value: Some(match d {
                Ok(n) => DimensionValue::DimValue(*n),
                Err(p) => DimensionValue::DimParam(p.to_string()),
            }),
            denotation: String::new(),
        })
        .collect();
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            value: Some(TypeValue::TensorType(TypeTensor {
                elem_type,
                shape: Some(TensorShapeProto { dim }),
            })),
            denotation: String::new(),
        }),
        ..Default::default()
    }
}

/// A float32 input/output with a static shape.
pub fn f32_info(name: &str, dims: &[i64]) -> ValueInfoProto {
    value_info(
        name,
        data_type::FLOAT,
        &dims.iter().map(|&d| Ok(d)).collect::<Vec<_>>(),
    )
}

/// An output whose type is left to inference (only the element type is declared).
pub fn out_info(name: &str, elem_type: i32) -> ValueInfoProto {
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            value: Some(TypeValue::TensorType(TypeTensor {
                elem_type,
                shape: None,
            })),
            denotation: String::new(),
        }),
        ..Default::default()
    }
}

pub fn attr_int(name: &str, i: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::INT,
        i,
        ..Default::default()
    }
}

pub fn attr_float(name: &str, f: f32) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::FLOAT,
        f,
        ..Default::default()
    }
}

pub fn attr_ints(name: &str, ints: &[i64]) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::INTS,
        ints: ints.to_vec(),
        ..Default::default()
    }
}

pub fn attr_str(name: &str, s: &str) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::STRING,
        s: s.as_bytes().to_vec(),
        ..Default::default()
    }
}

pub fn attr_tensor(name: &str, t: &Tensor) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::TENSOR,
        t: Some(tensor_to_proto(t, "")),
        ..Default::default()
    }
}

pub fn attr_graph(name: &str, g: GraphProto) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::GRAPH,
        g: Some(Box::new(g)),
        ..Default::default()
    }
}

/// A subgraph (an `If` branch, a `Loop`/`Scan` body).
pub fn graph(
    nodes: Vec<NodeProto>,
    inputs: Vec<ValueInfoProto>,
    outputs: Vec<ValueInfoProto>,
) -> GraphProto {
    GraphProto {
        node: nodes,
        name: "body".into(),
        input: inputs,
        output: outputs,
        ..Default::default()
    }
}

pub fn node(op: &str, inputs: &[&str], outputs: &[&str], attrs: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        name: format!("{op}_{}", outputs.first().copied().unwrap_or("")),
        op_type: op.into(),
        attribute: attrs,
        ..Default::default()
    }
}

/// A model builder.
pub struct Model {
    pub opset: i64,
    pub inputs: Vec<ValueInfoProto>,
    pub outputs: Vec<ValueInfoProto>,
    pub nodes: Vec<NodeProto>,
    pub initializers: Vec<TensorProto>,
}

impl Model {
    pub fn new(opset: i64) -> Self {
        Model {
            opset,
            inputs: vec![],
            outputs: vec![],
            nodes: vec![],
            initializers: vec![],
        }
    }

    pub fn input(mut self, vi: ValueInfoProto) -> Self {
        self.inputs.push(vi);
        self
    }

    pub fn output(mut self, vi: ValueInfoProto) -> Self {
        self.outputs.push(vi);
        self
    }

    pub fn node(mut self, n: NodeProto) -> Self {
        self.nodes.push(n);
        self
    }

    pub fn init(mut self, name: &str, t: &Tensor) -> Self {
        self.initializers.push(tensor_to_proto(t, name));
        self
    }

    pub fn proto(&self) -> ModelProto {
        ModelProto {
            ir_version: 8,
            opset_import: vec![OperatorSetIdProto {
                domain: String::new(),
                version: self.opset,
            }],
            producer_name: "ppcc-tests".into(),
            graph: Some(GraphProto {
                node: self.nodes.clone(),
                name: "test".into(),
                initializer: self.initializers.clone(),
                input: self.inputs.clone(),
                output: self.outputs.clone(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    pub fn bytes(&self) -> Vec<u8> {
        self.proto().encode_to_vec()
    }
}

/// Run `main` of an imported module on `inputs` (in `Input` argument order).
pub fn run(m: &Module, inputs: Vec<Tensor>) -> Vec<Tensor> {
    let f = &m.functions[0];
    let mut inputs = inputs.into_iter();
    let args: Vec<Tensor> = f
        .args()
        .iter()
        .map(|&(v, kind)| match kind {
            ArgKind::Input => inputs.next().expect("enough inputs"),
            _ => m.weights[&f.value(v).name].clone(),
        })
        .collect();
    run_function(f, args, &InterpOptions::default(), None).expect("interpreter runs")
}

pub fn f32s(t: &Tensor) -> Vec<f32> {
    t.to_f64_vec().into_iter().map(|x| x as f32).collect()
}

pub fn assert_close(got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "lengths differ: {got:?} vs {want:?}");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 + 1e-5 * b.abs(),
            "element {i}: {a} vs {b} ({got:?} vs {want:?})"
        );
    }
}

/// The onnx package's `backend/test/data` folder: `PPCC_ONNX_TESTDATA`, or asked from the
/// Python in `PPCC_PYTHON`. Panics with instructions when neither is set: these tests must
/// not pass silently without their data.
pub fn onnx_testdata() -> PathBuf {
    if let Ok(dir) = std::env::var("PPCC_ONNX_TESTDATA") {
        let p = PathBuf::from(dir);
        assert!(
            p.join("light").is_dir(),
            "PPCC_ONNX_TESTDATA={} has no light/ folder",
            p.display()
        );
        return p;
    }
    if let Ok(py) = std::env::var("PPCC_PYTHON") {
        let out = std::process::Command::new(&py)
            .args(["-c", "import onnx,os;print(os.path.dirname(onnx.__file__))"])
            .output()
            .unwrap_or_else(|e| panic!("PPCC_PYTHON={py} cannot run: {e}"));
        assert!(
            out.status.success(),
            "PPCC_PYTHON={py} cannot import onnx: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let p =
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("backend/test/data");
        assert!(
            p.join("light").is_dir(),
            "{} has no light/ folder",
            p.display()
        );
        return p;
    }
    panic!(
        "the onnx package's test data is needed: set PPCC_ONNX_TESTDATA to .../site-packages/onnx/backend/test/data, \
         or PPCC_PYTHON to a python that can `import onnx` (e.g. PPCC_PYTHON=/tmp/probe-venv/bin/python)"
    )
}
