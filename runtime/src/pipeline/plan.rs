//! Reading a compiled plan (`DIR/plan.json`).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use crate::data::Distribution;
use crate::integrity::{is_plain_relative, read_verified, FileRecord, IntegrityError};
use ppcc_plan::{Plan, PlanError, Synthetic};
use ppir::schedule::{parse_action, Action};
use ppir::TensorType;

/// Why `ppcc run` cannot use a build directory's plan.
#[derive(Debug, thiserror::Error)]
pub enum PlanSpecError {
    #[error("cannot read {}: {error} (is {} a directory written by `ppcc MODEL -o DIR`?)", path.display(), dir.display())]
    Read {
        path: PathBuf,
        dir: PathBuf,
        error: std::io::Error,
    },
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("the plan was compiled with --plan-only: it has no stage programs to run; compile again without it")]
    PlanOnly,
    /// The fields do not fit together.
    #[error("plan.json: {0}")]
    Invalid(String),
}

/// One virtual stage of a plan.
#[derive(Clone, Debug, PartialEq)]
pub struct StageSpec {
    pub stage: u32,
    pub device: usize,
    pub fwd: String,
    pub bwd_input: String,
    pub bwd_weight: String,
    pub optim: Option<String>,
    /// `DIR/stage<i>`.
    pub dir: PathBuf,
    /// Predicted F+B+W seconds per micro-batch.
    pub predicted_seconds: f64,
}

impl StageSpec {
    pub fn functions(&self) -> Vec<&str> {
        let mut v = vec![
            self.fwd.as_str(),
            self.bwd_input.as_str(),
            self.bwd_weight.as_str(),
        ];
        v.extend(self.optim.as_deref());
        v
    }
}

/// A data input of the training program.
#[derive(Clone, Debug, PartialEq)]
pub struct DataInput {
    /// IR name (`labels`, or a model input).
    pub name: String,
    /// The ONNX input it came from.
    pub onnx_name: Option<String>,
    /// Type per micro-batch.
    pub ty: TensorType,
    /// How `--data synthetic` draws it.
    pub synthetic: Distribution,
}

/// What `plan.json` says.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanSpec {
    pub dir: PathBuf,
    pub model: String,
    pub devices: usize,
    pub microbatches: usize,
    pub global_batch: u64,
    pub micro_batch: u64,
    pub stages: Vec<StageSpec>,
    /// Actions per device.
    pub actions: Vec<Vec<Action>>,
    pub inputs: Vec<DataInput>,
    pub loss: String,
    pub schedule: String,
    pub partition: String,
    pub device_profile: String,
    /// Predicted seconds per step and peak bytes per device.
    pub predicted_iteration: f64,
    pub predicted_peak_memory: Vec<f64>,
    /// IR weight name → ONNX initializer.
    pub weight_sources: BTreeMap<String, String>,
    /// Value name of each channel.
    pub channel_values: HashMap<i64, String>,
    /// The gradient all-reduces (plan.json's `collectives`).
    pub collectives: Vec<crate::pipeline::CollectiveSpec>,
    /// Data-parallel replicas of the pipeline (1: none); replica r's device d is worker
    /// (rank) `r · devices + d`.
    pub replicas: usize,
    /// Where the stage functions run: `cpu` (each stage's `module.so`) or `interp`.
    pub target: String,
    /// Size and SHA-256 of every generated file the runtime loads, by path relative to
    /// [`PlanSpec::dir`] (`stage0/module.so`); see [`crate::integrity`].
    pub files: BTreeMap<String, FileRecord>,
    /// The whole document.
    pub doc: Plan,
}

/// The values of plan.json's `target`.
pub const PLAN_TARGETS: [&str; 3] = ["cpu", "cuda", "interp"];

impl PlanSpec {
    /// The plan.json format this ppcc writes and reads ([`ppcc_plan::VERSION`]).
    pub const VERSION: u64 = ppcc_plan::VERSION;

    /// The contents of `path` (a file in the build directory) after checking them against
    /// the size and SHA-256 that plan.json records for it.
    pub fn read_file(&self, path: &Path) -> Result<Vec<u8>, IntegrityError> {
        let not_recorded = || IntegrityError::NotRecorded {
            path: path.to_path_buf(),
        };
        let rel = path.strip_prefix(&self.dir).map_err(|_| not_recorded())?;
        let key: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        let record = self.files.get(&key.join("/")).ok_or_else(not_recorded)?;
        read_verified(record, path)
    }

    /// Read `dir/plan.json`.
    pub fn load(dir: &Path) -> Result<PlanSpec, PlanSpecError> {
        let path = dir.join("plan.json");
        let text = std::fs::read_to_string(&path).map_err(|error| PlanSpecError::Read {
            path: path.clone(),
            dir: dir.to_path_buf(),
            error,
        })?;
        Self::from_doc(Plan::from_json(&text)?, dir)
    }

    /// [`PlanSpec::from_doc`] of plan.json's parsed JSON.
    pub fn from_json(v: &serde_json::Value, dir: &Path) -> Result<PlanSpec, PlanSpecError> {
        Self::from_doc(Plan::from_value(v)?, dir)
    }

    /// Check what the plan's fields mean together (stages on devices the plan has,
    /// actions of its stages, files inside the build directory) and keep what `ppcc run`
    /// uses.
    pub fn from_doc(doc: Plan, dir: &Path) -> Result<PlanSpec, PlanSpecError> {
        let invalid = |m: String| Err(PlanSpecError::Invalid(m));
        if !doc.program {
            return Err(PlanSpecError::PlanOnly);
        }
        let devices = doc.devices;
        let mut stages = vec![];
        for (i, s) in doc.stages.iter().enumerate() {
            let missing = |what: &str| PlanSpecError::Invalid(format!("stage {i} has no `{what}`"));
            let f = s.functions.as_ref().ok_or_else(|| missing("functions"))?;
            if s.stage != i {
                return invalid(format!("stage {i} is numbered {}", s.stage));
            }
            let sdir = s.dir.as_deref().ok_or_else(|| missing("dir"))?;
            if !is_plain_relative(sdir) {
                return invalid(format!(
                    "stage {i}'s `dir` {sdir:?} is not a directory inside the build directory"
                ));
            }
            if s.device >= devices {
                return invalid(format!(
                    "stage {i} is on device {}, but the plan has {devices}",
                    s.device
                ));
            }
            let stage = u32::try_from(s.stage)
                .map_err(|_| PlanSpecError::Invalid(format!("stage {i} has too large a number")))?;
            stages.push(StageSpec {
                stage,
                device: s.device,
                fwd: f.fwd.clone(),
                bwd_input: f.bwd_input.clone(),
                bwd_weight: f.bwd_weight.clone(),
                optim: f.optim.clone(),
                dir: dir.join(sdir),
                predicted_seconds: [
                    s.forward_seconds,
                    s.backward_input_seconds,
                    s.backward_weight_seconds,
                ]
                .iter()
                .filter(|x| x.is_finite())
                .sum(),
            });
        }
        if doc.schedule.actions.len() != devices {
            return invalid(format!(
                "the schedule has {} devices, the plan {devices}",
                doc.schedule.actions.len()
            ));
        }
        let mut actions = vec![];
        for (r, row) in doc.schedule.actions.iter().enumerate() {
            let mut list = vec![];
            for text in row {
                let (kind, stage, mb) = parse_action(text)
                    .map_err(|e| PlanSpecError::Invalid(format!("action `{text}`: {e}")))?;
                let a = Action::new(kind, stage, mb, 0);
                match stages.get(a.stage) {
                    Some(s) if s.device == r => {}
                    Some(s) => {
                        return invalid(format!(
                            "action {a} is on device {r} but stage {} is on device {}",
                            a.stage, s.device
                        ))
                    }
                    None => return invalid(format!("action {a} names no stage")),
                }
                list.push(a);
            }
            actions.push(list);
        }
        let training = doc
            .training
            .as_ref()
            .ok_or_else(|| PlanSpecError::Invalid("the plan has no `training`".into()))?;
        let mut inputs = vec![];
        for i in &training.inputs {
            inputs.push(DataInput {
                name: i.name.clone(),
                onnx_name: i.onnx_name.clone(),
                ty: ppir::text::parse_type(&i.ty)
                    .map_err(|e| PlanSpecError::Invalid(format!("input type `{}`: {e}", i.ty)))?,
                synthetic: match i.synthetic {
                    Synthetic::Normal => Distribution::Normal,
                    Synthetic::Uniform([low, high]) => Distribution::Uniform { low, high },
                },
            });
        }
        let channel_values = doc
            .channels
            .iter()
            .flatten()
            .map(|c| (c.id, c.value.clone()))
            .collect();
        let mut collectives = vec![];
        for c in &doc.collectives {
            if let Some(&s) = c.stages.iter().find(|&&s| s as usize >= stages.len()) {
                return invalid(format!(
                    "`collectives`: channel {} names stage {s}, but the plan has {} stages",
                    c.channel,
                    stages.len()
                ));
            }
            collectives.push(crate::pipeline::CollectiveSpec {
                channel: c.channel,
                param: c.param.clone(),
                stages: c.stages.clone(),
                replicas: c.replicas,
                reduce_scatter: c.reduce_scatter,
            });
        }
        let replicas = match &doc.data_parallel {
            None => 1,
            Some(dp) => {
                let expected: Vec<Vec<usize>> = (0..dp.replicas)
                    .map(|r| (0..devices).map(|d| r * devices + d).collect())
                    .collect();
                if dp.replicas == 0 || dp.ranks != expected {
                    return invalid(format!(
                        "`data_parallel`: {} replicas with ranks {:?}; this ppcc places replica r's device d on rank r·{devices} + d",
                        dp.replicas, dp.ranks
                    ));
                }
                if doc.global_batch != doc.micro_batch * doc.microbatches * dp.replicas as u64 {
                    return invalid(format!(
                        "`global_batch` {} is not {} replicas × {} micro-batches × {} rows",
                        doc.global_batch, dp.replicas, doc.microbatches, doc.micro_batch
                    ));
                }
                dp.replicas
            }
        };
        if !PLAN_TARGETS.contains(&doc.target.as_str()) {
            return invalid(format!(
                "`target` is {:?}; expected one of {}",
                doc.target,
                PLAN_TARGETS.map(|t| format!("{t:?}")).join(", ")
            ));
        }
        let Some(recorded) = &doc.files else {
            return invalid("the plan has no `files` (sizes and hashes of the generated files); compile the model again".into());
        };
        let mut files = BTreeMap::new();
        for (rel, rec) in recorded {
            if !is_plain_relative(rel) {
                return invalid(format!(
                    "`files` names {rel:?}, which is not a path inside the build directory"
                ));
            }
            if rec.sha256.len() != 64 || !rec.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                return invalid(format!(
                    "`files.{rel}.sha256` is not a SHA-256 in hex: {:?}",
                    rec.sha256
                ));
            }
            files.insert(
                rel.clone(),
                FileRecord {
                    bytes: rec.bytes,
                    sha256: rec.sha256.to_ascii_lowercase(),
                },
            );
        }
        Ok(PlanSpec {
            dir: dir.to_path_buf(),
            model: doc.model.clone(),
            devices,
            microbatches: usize::try_from(doc.microbatches)
                .map_err(|_| PlanSpecError::Invalid("too many micro-batches".into()))?,
            global_batch: doc.global_batch,
            micro_batch: doc.micro_batch,
            stages,
            actions,
            inputs,
            loss: training.loss.clone(),
            schedule: doc.schedule.name.clone(),
            partition: doc.partition.clone(),
            device_profile: doc.device_profile.clone(),
            predicted_iteration: doc.prediction.iteration_seconds,
            predicted_peak_memory: doc.prediction.peak_memory_bytes.clone(),
            weight_sources: training.weight_sources.clone(),
            channel_values,
            collectives,
            replicas,
            target: doc.target.clone(),
            files,
            doc,
        })
    }
}
