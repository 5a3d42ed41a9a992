//! Reading a compiled plan (`DIR/plan.json`).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

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

impl PlanSpec {
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
                dir: dir.join(str_of(s, "dir")?),
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
            target: v
                .get("target")
                .and_then(Value::as_str)
                .unwrap_or("interp")
                .to_string(),
        })
    }
}
