//! An N-stage program equals the 1-stage program: partition the bundled examples (graph,
//! sequential and uniform partitioners, 2–4 stages), build the training program, split it
//! into per-stage functions with send/recv, run the stages one after another with the
//! reference interpreter through an in-memory mailbox (forward in stage order, input
//! gradients in reverse order, then weight gradients and the optimizer), and compare the
//! loss, every gradient and every updated weight with the unsplit `@grad` and `@optim`.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use ppcc_frontends::onnx::{import_onnx_file, ImportOptions};
use ppcc_passes::autodiff::{build_gradient_function, AutodiffOptions, LossKind};
use ppcc_passes::cost::DeviceProfile;
use ppcc_passes::optim::{build_optimizer_function, trainable_params, OptimizerOptions};
use ppcc_passes::partition::{apply, partition, PartitionKind, PartitionOptions};
use ppcc_passes::split::{split_stages, SplitInfo, SplitOptions};
use ppcc_runtime::data::default_specs;
use ppcc_runtime::{BatchSource, Distribution, InputSpec, SyntheticSource};
use ppir::interp::{run_function, Comm, CommError, InterpOptions};
use ppir::{ArgKind, DType, Function, Module, Tensor, TensorType};

fn example(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("examples")
        .join(name)
}

/// Sends go into a mailbox; a receive takes what was sent (so a stage that reads before
/// its producer ran fails the test).
#[derive(Default)]
struct Mailbox {
    stage: u32,
    boxes: HashMap<(u32, u32, i64), Tensor>,
}

impl Comm for Mailbox {
    fn send(&mut self, peer: u32, channel: i64, t: Tensor) -> Result<(), CommError> {
        if self.boxes.insert((self.stage, peer, channel), t).is_some() {
            return Err(CommError::Transport {
                peer,
                channel,
                message: format!("channel {channel} sent twice"),
            });
        }
        Ok(())
    }

    fn recv(&mut self, peer: u32, channel: i64, _ty: &TensorType) -> Result<Tensor, CommError> {
        self.boxes
            .remove(&(peer, self.stage, channel))
            .ok_or_else(|| CommError::Transport {
                peer,
                channel,
                message: format!(
                    "stage {} receives channel {channel} before stage {peer} sent it",
                    self.stage
                ),
            })
    }
}

fn run_named(
    m: &Module,
    f: &Function,
    named: &HashMap<String, Tensor>,
    comm: Option<&mut dyn Comm>,
) -> HashMap<String, Tensor> {
    let args: Vec<Tensor> = f
        .args()
        .iter()
        .map(|&(v, kind)| {
            let n = &f.value(v).name;
            let t = match kind {
                ArgKind::Input => named.get(n),
                _ => named.get(n).or_else(|| m.weights.get(n)),
            };
            t.unwrap_or_else(|| panic!("@{}: no value for argument %{n}", f.name))
                .clone()
        })
        .collect();
    let out = run_function(f, args, &InterpOptions::default(), comm)
        .unwrap_or_else(|e| panic!("@{}: {e}", f.name));
    f.results()
        .iter()
        .map(|&r| f.value(r).name.clone())
        .zip(out)
        .collect()
}

fn assert_close(what: &str, a: &Tensor, b: &Tensor) {
    let (x, y) = (a.to_f64_vec(), b.to_f64_vec());
    assert_eq!(x.len(), y.len(), "{what}: sizes differ");
    for (i, (p, q)) in x.iter().zip(&y).enumerate() {
        let tol = 1e-6 * (1.0 + p.abs().max(q.abs()));
        assert!(
            (p - q).abs() <= tol,
            "{what}[{i}]: split {p} vs unsplit {q}"
        );
    }
}

/// The training program of `model` with `@main` partitioned into `stages`.
fn program(model: &str, loss: LossKind, kind: PartitionKind, stages: usize) -> Option<Module> {
    let mut m = import_onnx_file(example(model), &ImportOptions::default()).unwrap();
    let profile = DeviceProfile::builtin("h100").unwrap();
    let mut opts = PartitionOptions::new(stages, kind, profile);
    opts.microbatches = 4;
    opts.autodiff.loss = loss;
    let parts = match partition(&m, &opts) {
        Ok(p) => p,
        Err(e) => {
            // Too few layers for the uniform partition is a legitimate refusal.
            assert!(
                e.to_string().contains("layers with weights"),
                "{model}: {e}"
            );
            return None;
        }
    };
    let p = &parts[0];
    assert_eq!(p.stages.len(), stages);
    assert!(p.stages.iter().all(|s| !s.ops.is_empty()), "empty stage");
    apply(&mut m, "main", p).unwrap();
    let info = build_gradient_function(
        &mut m,
        &AutodiffOptions {
            loss,
            ..Default::default()
        },
    )
    .unwrap();
    let params = trainable_params(m.function(&info.function).unwrap());
    build_optimizer_function(&mut m, &params, &OptimizerOptions::sgd(0.1, 0.9)).unwrap();
    Some(m)
}

fn data(m: &Module) -> HashMap<String, Tensor> {
    let g = m.function("grad").unwrap();
    let main = m.function("main").unwrap();
    let batch = g.ty(g.args()[0].0).dims[0].known().unwrap();
    let names: Vec<String> = g
        .args()
        .iter()
        .filter(|(_, k)| *k == ArgKind::Input)
        .map(|&(v, _)| g.value(v).name.clone())
        .filter(|n| n != "labels" && n != "rng")
        .collect();
    let mut specs = default_specs(g, &names, batch);
    if let Some(v) = g.find_value("labels") {
        let ty = g.ty(v).clone();
        let dist = if ty.dtype.is_float() {
            Distribution::Normal
        } else {
            let out = main.ty(main.results()[0]);
            let classes = out.dims.last().unwrap().known().unwrap() as i64;
            Distribution::Uniform {
                low: 0,
                high: classes,
            }
        };
        specs.push(InputSpec {
            name: "labels".into(),
            ty,
            dist,
        });
    }
    let mut named: HashMap<String, Tensor> = SyntheticSource::new(specs, 7, true)
        .unwrap()
        .batch(0)
        .unwrap()
        .into_iter()
        .collect();
    named.insert(
        "rng".into(),
        Tensor::from_i64(DType::I64, vec![2], vec![3, 1]),
    );
    named
}

/// Run the split program stage by stage; returns every named result.
fn run_split(
    m: &Module,
    info: &SplitInfo,
    data: &HashMap<String, Tensor>,
) -> BTreeMap<String, Tensor> {
    let mut mailbox = Mailbox::default();
    let mut stash: Vec<HashMap<String, Tensor>> = vec![data.clone(); info.stages.len()];
    let mut out = BTreeMap::new();
    let mut run =
        |s: usize, name: &str, mailbox: &mut Mailbox, stash: &mut Vec<HashMap<String, Tensor>>| {
            mailbox.stage = s as u32;
            let f = m.function(name).unwrap();
            assert_eq!(f.attrs.int("stage").unwrap(), Some(s as i64));
            let res = run_named(m, f, &stash[s], Some(mailbox));
            for (k, v) in res {
                stash[s].insert(k.clone(), v.clone());
                out.insert(k, v);
            }
        };
    let n = info.stages.len();
    for s in 0..n {
        run(s, &info.stages[s].fwd, &mut mailbox, &mut stash);
    }
    for s in (0..n).rev() {
        run(s, &info.stages[s].bwd_input, &mut mailbox, &mut stash);
    }
    for s in 0..n {
        run(s, &info.stages[s].bwd_weight, &mut mailbox, &mut stash);
    }
    assert!(
        mailbox.boxes.is_empty(),
        "unreceived sends: {:?}",
        mailbox.boxes.keys()
    );
    for s in 0..n {
        if let Some(o) = &info.stages[s].optim {
            run(s, o, &mut mailbox, &mut stash);
        }
    }
    out
}

fn check(model: &str, loss: LossKind) {
    for kind in PartitionKind::ALL {
        for stages in [2, 3, 4] {
            let Some(mut m) = program(model, loss, kind, stages) else {
                continue;
            };
            let reference = m.clone();
            let data = data(&m);
            // Unsplit: @grad, then @optim on its gradients.
            let g = reference.function("grad").unwrap();
            let mut want = run_named(&reference, g, &data, None);
            let mut optim_in = data.clone();
            optim_in.extend(want.clone());
            let o = reference.function("optim").unwrap();
            want.extend(run_named(&reference, o, &optim_in, None));

            let info = split_stages(&mut m, &SplitOptions::default()).unwrap();
            if let Err(errors) = ppir::verify::verify_module(&m) {
                panic!("{model} {} {stages}: {errors:?}", kind.name());
            }
            assert!(m.function("grad").is_none() && m.function("optim").is_none());
            assert_eq!(info.stages.len(), stages);
            let got = run_split(&m, &info, &data);
            for (name, t) in &want {
                let g = got
                    .get(name)
                    .unwrap_or_else(|| panic!("{model}: the split program has no result {name}"));
                assert_close(
                    &format!("{model} {} {stages} stages: {name}", kind.name()),
                    g,
                    t,
                );
            }
        }
    }
}

#[test]
fn mlp_split_equals_unsplit() {
    check("mlp.onnx", LossKind::Auto);
}

#[test]
fn two_tower_split_equals_unsplit() {
    check("two_tower.onnx", LossKind::Mse);
}

#[test]
fn gpt_split_equals_unsplit() {
    check("gpt.onnx", LossKind::Auto);
}

#[test]
fn cnn_split_equals_unsplit() {
    check("cnn.onnx", LossKind::Auto);
}
