//! Reading a compiled plan (`DIR/plan.json`).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use crate::integrity::{is_plain_relative, FileRecord, IntegrityError};
use ppir::schedule::{parse_action, Action};
use ppir::TensorType;
use serde_json::Value;

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
    /// Where the stage functions run: `cpu` (each stage's `module.so`) or `interp`.
    pub target: String,
    /// Size and SHA-256 of every generated file the runtime loads, by path relative to
    /// [`PlanSpec::dir`] (`stage0/module.so`); see [`crate::integrity`].
    pub files: BTreeMap<String, FileRecord>,
}

fn field<'a>(v: &'a Value, path: &str) -> Result<&'a Value, String> {
    let mut cur = v;
    for key in path.split('.') {
        cur = cur
            .get(key)
            .ok_or_else(|| format!("plan.json has no `{path}`"))?;
    }
    Ok(cur)
}

fn str_of(v: &Value, path: &str) -> Result<String, String> {
    field(v, path)?
        .as_str()
        .map(String::from)
        .ok_or_else(|| format!("plan.json: `{path}` is not a string"))
}

fn u64_of(v: &Value, path: &str) -> Result<u64, String> {
    field(v, path)?
        .as_u64()
        .ok_or_else(|| format!("plan.json: `{path}` is not a non-negative integer"))
}

/// The values of plan.json's `target`.
pub const PLAN_TARGETS: [&str; 3] = ["cpu", "cuda", "interp"];

impl PlanSpec {
    /// The plan.json format this ppcc writes and reads: 2 added `files` (sizes and hashes
    /// of what the runtime loads); a plan without them cannot be checked and is refused.
    pub const VERSION: u64 = 2;

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
        record.read_verified(path)
    }

    /// Read `dir/plan.json`.
    pub fn load(dir: &Path) -> Result<PlanSpec, String> {
        let path = dir.join("plan.json");
        let text = std::fs::read_to_string(&path).map_err(|e| {
            format!(
                "cannot read {}: {e} (is {} a directory written by `ppcc MODEL -o DIR`?)",
                path.display(),
                dir.display()
            )
        })?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| format!("{} is not valid JSON: {e}", path.display()))?;
        Self::from_json(&v, dir)
    }

    pub fn from_json(v: &Value, dir: &Path) -> Result<PlanSpec, String> {
        if v.get("format").and_then(Value::as_str) != Some("ppcc-plan") {
            return Err("plan.json is not a ppcc plan (no \"format\": \"ppcc-plan\")".into());
        }
        match v.get("version").and_then(Value::as_u64) {
            Some(Self::VERSION) => {}
            Some(n) if n > Self::VERSION => {
                return Err(format!(
                    "plan.json has format version {n}; this ppcc reads version {}: run it with the ppcc that compiled it, or compile again",
                    Self::VERSION
                ))
            }
            old => {
                return Err(format!(
                    "plan.json has format version {}, which records no sizes and hashes of the generated files, so they cannot be checked before they are loaded: compile the model again with this ppcc (it writes format version {})",
                    old.map_or("(none)".to_string(), |n| n.to_string()),
                    Self::VERSION
                ))
            }
        }
        if v.get("program").and_then(Value::as_bool) == Some(false) {
            return Err(
                "the plan was compiled with --plan-only: it has no stage programs to run; compile again without it"
                    .into(),
            );
        }
        let devices = u64_of(v, "devices")? as usize;
        let stages_v = field(v, "stages")?
            .as_array()
            .ok_or("plan.json: `stages` is not a list")?;
        let mut stages = vec![];
        for (i, s) in stages_v.iter().enumerate() {
            let f = |k: &str| str_of(s, &format!("functions.{k}"));
            let stage = u64_of(s, "stage")? as u32;
            if stage as usize != i {
                return Err(format!("plan.json: stage {i} is numbered {stage}"));
            }
            let device = u64_of(s, "device")? as usize;
            let sdir = str_of(s, "dir")?;
            if !is_plain_relative(&sdir) {
                return Err(format!(
                    "plan.json: stage {i}'s `dir` {sdir:?} is not a directory inside the build directory"
                ));
            }
            if device >= devices {
                return Err(format!(
                    "plan.json: stage {i} is on device {device}, but the plan has {devices}"
                ));
            }
            stages.push(StageSpec {
                stage,
                device,
                fwd: f("fwd")?,
                bwd_input: f("bwd_input")?,
                bwd_weight: f("bwd_weight")?,
                optim: field(s, "functions.optim")
                    .ok()
                    .and_then(Value::as_str)
                    .map(String::from),
                dir: dir.join(&sdir),
                predicted_seconds: [
                    "forward_seconds",
                    "backward_input_seconds",
                    "backward_weight_seconds",
                ]
                .iter()
                .filter_map(|k| s.get(*k).and_then(Value::as_f64))
                .sum(),
            });
        }
        let actions_v = field(v, "schedule.actions")?
            .as_array()
            .ok_or("plan.json: `schedule.actions` is not a list")?;
        if actions_v.len() != devices {
            return Err(format!(
                "plan.json: the schedule has {} devices, the plan {devices}",
                actions_v.len()
            ));
        }
        let mut actions = vec![];
        for (r, row) in actions_v.iter().enumerate() {
            let row = row
                .as_array()
                .ok_or("plan.json: a row of `schedule.actions` is not a list")?;
            let mut list = vec![];
            for cell in row {
                let text = cell
                    .as_str()
                    .ok_or("plan.json: an action is not a string")?;
                let (kind, stage, mb) =
                    parse_action(text).map_err(|e| format!("plan.json: action `{text}`: {e}"))?;
                let a = Action::new(kind, stage, mb, 0);
                match stages.get(a.stage) {
                    Some(s) if s.device == r => {}
                    Some(s) => {
                        return Err(format!(
                            "plan.json: action {a} is on device {r} but stage {} is on device {}",
                            a.stage, s.device
                        ))
                    }
                    None => return Err(format!("plan.json: action {a} names no stage")),
                }
                list.push(a);
            }
            actions.push(list);
        }
        let mut inputs = vec![];
        for i in field(v, "training.inputs")?
            .as_array()
            .ok_or("plan.json: `training.inputs` is not a list")?
        {
            let ty_text = str_of(i, "type")?;
            inputs.push(DataInput {
                name: str_of(i, "name")?,
                onnx_name: i.get("onnx_name").and_then(Value::as_str).map(String::from),
                ty: ppir::text::parse_type(&ty_text)
                    .map_err(|e| format!("plan.json: input type `{ty_text}`: {e}"))?,
            });
        }
        let weight_sources = field(v, "training.weight_sources")
            .ok()
            .and_then(Value::as_object)
            .map(|o| {
                o.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        let channel_values = v
            .get("channels")
            .and_then(Value::as_array)
            .map(|cs| {
                cs.iter()
                    .filter_map(|c| {
                        Some((
                            c.get("id")?.as_i64()?,
                            c.get("value")?.as_str()?.to_string(),
                        ))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let target = str_of(v, "target")?;
        if !PLAN_TARGETS.contains(&target.as_str()) {
            return Err(format!(
                "plan.json: `target` is {target:?}; expected one of {}",
                PLAN_TARGETS.map(|t| format!("{t:?}")).join(", ")
            ));
        }
        let mut files = BTreeMap::new();
        for (rel, rec) in field(v, "files")?
            .as_object()
            .ok_or("plan.json: `files` is not an object")?
        {
            if !is_plain_relative(rel) {
                return Err(format!(
                    "plan.json: `files` names {rel:?}, which is not a path inside the build directory"
                ));
            }
            let bytes = u64_of(rec, "bytes").map_err(|e| format!("{e} (in `files.{rel}`)"))?;
            let sha256 = str_of(rec, "sha256").map_err(|e| format!("{e} (in `files.{rel}`)"))?;
            if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(format!(
                    "plan.json: `files.{rel}.sha256` is not a SHA-256 in hex: {sha256:?}"
                ));
            }
            files.insert(
                rel.clone(),
                FileRecord {
                    bytes,
                    sha256: sha256.to_ascii_lowercase(),
                },
            );
        }
        Ok(PlanSpec {
            dir: dir.to_path_buf(),
            model: str_of(v, "model")?,
            devices,
            microbatches: u64_of(v, "microbatches")? as usize,
            global_batch: u64_of(v, "global_batch")?,
            micro_batch: u64_of(v, "micro_batch")?,
            stages,
            actions,
            inputs,
            loss: str_of(v, "training.loss").unwrap_or_else(|_| "auto".into()),
            schedule: str_of(v, "schedule.name")?,
            partition: str_of(v, "partition").unwrap_or_default(),
            device_profile: str_of(v, "device_profile").unwrap_or_default(),
            predicted_iteration: field(v, "prediction.iteration_seconds")?
                .as_f64()
                .unwrap_or(f64::NAN),
            predicted_peak_memory: field(v, "prediction.peak_memory_bytes")
                .ok()
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_f64).collect())
                .unwrap_or_default(),
            weight_sources,
            channel_values,
            target,
            files,
        })
    }
}
