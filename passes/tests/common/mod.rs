//! Shared helpers of the autodiff tests: building small f64 models, running `@grad` with
//! the reference interpreter, and central finite differences.

#![allow(dead_code)]

use std::collections::HashMap;

use ppcc_passes::autodiff::{build_gradient_function, AutodiffOptions, LossKind, TrainingInfo};
use ppir::interp::{bind_args, run_function, InterpOptions, Precision};
use ppir::{
    ArgKind, Attr, Attrs, DType, Function, Module, NewOp, OpKind, Tensor, TensorData, TensorType,
    ValueId,
};

/// A small deterministic generator (64-bit LCG, top 53 bits).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// Uniform in [-hi, -lo] ∪ [lo, hi]: away from the kinks at 0.
    pub fn away(&mut self, lo: f64, hi: f64) -> f64 {
        let v = self.uniform(lo, hi);
        if self.unit() < 0.5 {
            -v
        } else {
            v
        }
    }

    pub fn below(&mut self, n: u64) -> u64 {
        (self.unit() * n as f64) as u64 % n.max(1)
    }
}

pub fn f64t(shape: &[usize], data: Vec<f64>) -> Tensor {
    Tensor::from_f64(DType::F64, shape.to_vec(), data)
}

pub fn i64t(shape: &[usize], data: Vec<i64>) -> Tensor {
    Tensor::from_i64(DType::I64, shape.to_vec(), data)
}

pub fn ints(v: &[i64]) -> Attr {
    Attr::Ints(v.to_vec())
}

/// How a test draws the values of a float tensor.
#[derive(Clone, Copy)]
pub enum Dist {
    /// Uniform in [lo, hi].
    Uniform(f64, f64),
    /// |v| uniform in [lo, hi], either sign.
    Away(f64, f64),
}

/// Builds `@main` in f64 with its weights and inputs.
pub struct ModelBuilder {
    pub f: Function,
    pub m: Module,
    pub inputs: HashMap<String, Tensor>,
    pub rng: Rng,
}

impl ModelBuilder {
    pub fn new(seed: u64) -> Self {
        ModelBuilder {
            f: Function::new("main"),
            m: Module::new(),
            inputs: HashMap::new(),
            rng: Rng::new(seed),
        }
    }

    pub fn draw(&mut self, shape: &[usize], dist: Dist) -> Tensor {
        let n: usize = shape.iter().product();
        let data = (0..n)
            .map(|_| match dist {
                Dist::Uniform(lo, hi) => self.rng.uniform(lo, hi),
                Dist::Away(lo, hi) => self.rng.away(lo, hi),
            })
            .collect();
        f64t(shape, data)
    }

    /// A trainable f64 parameter with values drawn from `dist`.
    pub fn param(&mut self, name: &str, shape: &[usize], dist: Dist) -> ValueId {
        let t = self.draw(shape, dist);
        self.weight(name, t, ArgKind::Param)
    }

    pub fn weight(&mut self, name: &str, t: Tensor, kind: ArgKind) -> ValueId {
        let v = self.f.add_arg(name, t.tensor_type(), kind);
        self.m.weights.insert(name.to_string(), t);
        v
    }

    pub fn input(&mut self, name: &str, t: Tensor) -> ValueId {
        let v = self.f.add_arg(name, t.tensor_type(), ArgKind::Input);
        self.inputs.insert(name.to_string(), t);
        v
    }

    pub fn constant(&mut self, t: Tensor) -> ValueId {
        self.op(
            OpKind::Constant,
            &[],
            Attrs::new().with("value", Attr::Tensor(t)),
        )
    }

    pub fn op_n(&mut self, kind: OpKind, operands: &[ValueId], attrs: Attrs) -> Vec<ValueId> {
        let types: Vec<TensorType> = operands.iter().map(|&v| self.f.ty(v).clone()).collect();
        let results = ppir::shape::infer(kind, &attrs, &types)
            .unwrap_or_else(|e| panic!("building {kind} on {types:?}: {e}"));
        let id = self
            .f
            .push_op(NewOp::new(kind, operands.to_vec(), results).attrs(attrs));
        self.f.op(id).results().to_vec()
    }

    pub fn op(&mut self, kind: OpKind, operands: &[ValueId], attrs: Attrs) -> ValueId {
        self.op_n(kind, operands, attrs)[0]
    }

    pub fn shape(&self, v: ValueId) -> Vec<usize> {
        self.f
            .ty(v)
            .static_shape()
            .unwrap()
            .iter()
            .map(|&d| d as usize)
            .collect()
    }

    /// Return `Σ y·R` for a random constant R: a scalar whose gradient reaches every
    /// element of y with a different weight.
    pub fn functional(mut self, ys: &[ValueId]) -> Model {
        let mut total: Option<ValueId> = None;
        for &y in ys {
            let shape = self.shape(y);
            let r = self.draw(&shape, Dist::Uniform(-1.0, 1.0));
            let r = self.constant(r);
            let p = self.op(OpKind::Mul, &[y, r], Attrs::new());
            let rank = shape.len() as i64;
            let s = if rank == 0 {
                p
            } else {
                self.op(
                    OpKind::ReduceSum,
                    &[p],
                    Attrs::new()
                        .with("axes", Attr::Ints((0..rank).collect()))
                        .with("keepdims", Attr::Int(0)),
                )
            };
            total = Some(match total {
                Some(t) => self.op(OpKind::Add, &[t, s], Attrs::new()),
                None => s,
            });
        }
        self.finish(vec![total.expect("at least one output")], LossKind::Output)
    }

    pub fn finish(mut self, results: Vec<ValueId>, loss: LossKind) -> Model {
        self.f.set_results(results);
        self.m.functions.push(self.f);
        ppir::verify::verify_module(&self.m).unwrap_or_else(|e| {
            panic!(
                "test model does not verify: {}\n{}",
                e.iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join("\n"),
                self.m
            )
        });
        Model {
            m: self.m,
            inputs: self.inputs,
            opts: AutodiffOptions {
                loss,
                ..AutodiffOptions::default()
            },
        }
    }
}

/// A model to differentiate: the module, its inputs, and the autodiff options.
pub struct Model {
    pub m: Module,
    pub inputs: HashMap<String, Tensor>,
    pub opts: AutodiffOptions,
}

pub fn f64_opts() -> InterpOptions {
    InterpOptions {
        precision: Precision::F64,
    }
}

/// Run a function of `m` in f64 on `inputs` (weights from the module).
pub fn run(m: &Module, name: &str, inputs: &HashMap<String, Tensor>) -> Vec<Tensor> {
    let f = m.function(name).unwrap();
    let args = bind_args(m, f, inputs).unwrap_or_else(|e| panic!("{e}"));
    run_function(f, args, &f64_opts(), None).unwrap_or_else(|e| panic!("@{name}: {e}"))
}

pub fn data_mut(t: &mut Tensor) -> &mut Vec<f64> {
    match &mut t.data {
        TensorData::Float(v) => v,
        TensorData::Int(_) => panic!("not a float tensor"),
    }
}

/// Largest |a - b| relative to the larger of the two tensors' largest magnitudes (at
/// least 1e-5: finite differences cannot resolve a gradient that is exactly zero, such as
/// a conv bias's under batch norm, better than their rounding error of about 1e-12).
pub fn rel_error(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let scale = a
        .iter()
        .chain(b)
        .fold(0.0f64, |m, &v| m.max(v.abs()))
        .max(1e-5);
    let diff = a
        .iter()
        .zip(b)
        .fold(0.0f64, |m, (&x, &y)| m.max((x - y).abs()));
    if diff == 0.0 {
        0.0
    } else {
        diff / scale
    }
}

/// Build `@grad`, then compare every `grad.<param>` with central finite differences of the
/// `loss` result (in f64, five-point stencil with step `h`). Returns the training info and the largest relative
/// error over the parameters.
pub fn gradcheck(model: &Model, h: f64) -> (TrainingInfo, f64) {
    let mut m = model.m.clone();
    let info = build_gradient_function(&mut m, &model.opts)
        .unwrap_or_else(|e| panic!("autodiff failed: {e}\n{}", model.m));
    let outs = run(&m, "grad", &model.inputs);
    // The training function's loss equals the model's own output where the loss is it
    // (so decompositions compute what the original ops compute).
    let main = model.m.function("main").unwrap();
    let training_differs = main
        .ops()
        .iter()
        .any(|&o| matches!(main.op(o).kind, OpKind::Dropout | OpKind::BatchNorm));
    if info.loss_kind == LossKind::Output && !(model.opts.train_mode && training_differs) {
        let main_out = run(&m, "main", &model.inputs);
        let (a, b) = (outs[0].as_f64().unwrap(), main_out[0].as_f64().unwrap());
        let e = rel_error(a, b);
        assert!(
            e <= 1e-12,
            "@grad's loss {a:?} differs from @main's output {b:?}"
        );
    }
    let mut worst = 0.0f64;
    for (k, p) in info.params.iter().enumerate() {
        let analytic = outs[1 + k].as_f64().unwrap().to_vec();
        let original = m.weights[p].clone();
        let n = original.num_elements();
        let mut fd = Vec::with_capacity(n);
        for i in 0..n {
            let x0 = original.as_f64().unwrap()[i];
            let at = |x: f64, m: &mut Module| {
                data_mut(m.weights.get_mut(p).unwrap())[i] = x;
                run(m, "grad", &model.inputs)[0].as_f64().unwrap()[0]
            };
            // The five-point central stencil: error O(h⁴) instead of O(h²).
            let (p1, m1) = (at(x0 + h, &mut m), at(x0 - h, &mut m));
            let (p2, m2) = (at(x0 + 2.0 * h, &mut m), at(x0 - 2.0 * h, &mut m));
            data_mut(m.weights.get_mut(p).unwrap())[i] = x0;
            fd.push((8.0 * (p1 - m1) - (p2 - m2)) / (12.0 * h));
        }
        m.weights.insert(p.clone(), original);
        let e = rel_error(&analytic, &fd);
        assert!(
            e <= 1e-6,
            "grad.{p}: relative error {e:e}\n analytic {analytic:?}\n finite differences {fd:?}\n{m}"
        );
        worst = worst.max(e);
    }
    (info, worst)
}
