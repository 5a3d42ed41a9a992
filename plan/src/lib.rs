//! # ppcc-plan — the build directory's `plan.json`, one schema for writer and reader
//!
//! `ppcc MODEL -o DIR` (the driver) fills a [`Plan`] and writes it with [`Plan::to_json`];
//! `ppcc run DIR` (the runtime) reads it back with [`Plan::from_json`]. Both sides use these
//! types, so a field added to one is added to the other. Reading is strict: a plan of
//! another format [`VERSION`] is refused naming both versions, and an unknown or missing
//! field is refused with its JSON path (`stages[1].functions: missing field `fwd``).
//!
//! What the fields *mean* together (a stage's device exists, actions name stages, files
//! are inside the build directory) is checked by the runtime, which knows what it needs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The value of `format`.
pub const FORMAT: &str = "ppcc-plan";

/// The plan.json format this ppcc writes and reads. 2 added `files` (sizes and hashes of
/// what the runtime loads); 3 made the schema strict (unknown fields are refused).
pub const VERSION: u64 = 3;

/// Why a plan.json cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("plan.json is not valid JSON: {0}")]
    Json(serde_json::Error),
    #[error("plan.json is not a ppcc plan (no \"format\": \"ppcc-plan\")")]
    NotAPlan,
    #[error("plan.json has format version {found}; this ppcc reads version {supported}: run it with the ppcc that compiled it, or compile again")]
    Newer { found: u64, supported: u64 },
    #[error("plan.json has format version {}, an older format than this ppcc reads (version {supported}; version 1 recorded no sizes and hashes of the generated files, so they could not be checked before they are loaded): compile the model again with this ppcc", found.map_or("(none)".to_string(), |n| n.to_string()))]
    Older { found: Option<u64>, supported: u64 },
    /// A field is unknown, missing or of the wrong type; `path` is its JSON path.
    #[error("plan.json: {}{message}", if path.is_empty() || path == "." { String::new() } else { format!("at `{path}`: ") })]
    Schema { path: String, message: String },
}

/// The whole of `DIR/plan.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// Always [`FORMAT`].
    pub format: String,
    /// [`VERSION`].
    pub version: u64,
    /// The ppcc that wrote it.
    pub ppcc_version: String,
    /// The model file it was compiled from (`ppcc run --save-onnx` reads it again).
    pub model: String,
    /// Devices (pipeline ranks).
    pub devices: usize,
    /// Stages (more than devices with interleaved or V schedules).
    pub virtual_stages: usize,
    pub microbatches: u64,
    /// Rows per step and per micro-batch.
    pub global_batch: u64,
    pub micro_batch: u64,
    pub schedule: ScheduleDoc,
    /// The partitioner: `graph`, `sequential` or `uniform`.
    pub partition: String,
    pub device_profile: String,
    #[serde(deserialize_with = "finite_or_null::f64")]
    pub memory_limit_bytes: f64,
    /// Seconds the planner took.
    #[serde(deserialize_with = "finite_or_null::f64")]
    pub planner_seconds: f64,
    /// Every plan the graph partitioner compared.
    pub candidates: Vec<Candidate>,
    pub stages: Vec<StageDoc>,
    /// The stage DAG: (producer, consumer).
    pub edges: Vec<[usize; 2]>,
    pub prediction: Prediction,
    /// With stage times measured on generated code: what the cost model alone predicted.
    pub prediction_cost_model: Option<Prediction>,
    /// The sequential partition planned as a baseline.
    pub baseline: Baseline,
    /// Whether the stage programs were written (false with `--plan-only`).
    pub program: bool,
    /// Where the stage functions run: `cpu` (`stage<i>/module.so`), `cuda` (`module.so`
    /// with PTX kernels, run on GPUs) or `interp`.
    pub target: String,
    /// `cuda` plans: who computes matrix products, `kernels` (generated) or `cublas`
    /// (`--gpu-gemm`). Absent: generated kernels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_gemm: Option<String>,
    /// Every send/recv pair (with a program).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channels: Option<Vec<Channel>>,
    /// The weight-gradient all-reduces of the stages' `optim` functions (a weight shared
    /// across stages, data-parallel replicas), by channel.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub collectives: Vec<Collective>,
    /// Replicas of the pipeline for data parallelism (absent: one). `devices` and the
    /// schedule are per replica; `global_batch` is split evenly across the replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_parallel: Option<DataParallel>,
    /// The training program's data, loss and optimizer (with a program).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub training: Option<Training>,
    /// Ops split into pieces by the rewriter (`--split`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub splits: Vec<SplitDoc>,
    /// `--recompute`: `off`, `auto` or `all` (what each stage recomputes is in
    /// `stages[i].recompute`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recompute: Option<String>,
    /// The phases of a stage's functions, in order (with a program).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phases: Option<Vec<String>>,
    /// Size and SHA-256 of every file `ppcc run` loads, by path relative to the build
    /// directory (`stage0/module.so`) (with a program).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<BTreeMap<String, FileRecord>>,
}

/// `schedule`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleDoc {
    /// A built-in name or the CSV file given.
    pub name: String,
    pub chunks: usize,
    /// The schedule in torch's CSV format, relative to the build directory.
    pub file: String,
    /// Per device, the actions in order (`0F1`, `1B0`, `0W3`).
    pub actions: Vec<Vec<String>>,
    pub layout: LayoutDoc,
}

/// `schedule.layout`: how stages map to devices.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum LayoutDoc {
    /// Stage c·P + r on device r.
    Interleaved { chunks: usize },
    /// Two chunks in a V (ZB-V).
    V,
    /// A stage DAG: stage s on `rank_of[s]`, `edges` (producer, consumer).
    Dag {
        rank_of: Vec<usize>,
        edges: Vec<[usize; 2]>,
    },
}

/// One entry of `candidates`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Candidate {
    pub stage_graph_is_chain: bool,
    #[serde(deserialize_with = "finite_or_null::f64")]
    pub iteration_seconds: f64,
}

/// One entry of `stages`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageDoc {
    pub stage: usize,
    pub device: usize,
    pub chunk: usize,
    /// Ops of `@main` in the stage, and the first and last by name.
    pub ops: usize,
    pub first_op: String,
    pub last_op: String,
    /// Predicted seconds per micro-batch.
    #[serde(deserialize_with = "finite_or_null::f64")]
    pub forward_seconds: f64,
    #[serde(deserialize_with = "finite_or_null::f64")]
    pub backward_input_seconds: f64,
    #[serde(deserialize_with = "finite_or_null::f64")]
    pub backward_weight_seconds: f64,
    #[serde(deserialize_with = "finite_or_null::f64")]
    pub activation_bytes_per_microbatch: f64,
    #[serde(deserialize_with = "finite_or_null::f64")]
    pub param_bytes: f64,
    /// Measured seconds of the generated functions (`--device-profile host`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub native_seconds: Option<NativeSeconds>,
    /// The stage's functions (with a program).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub functions: Option<StageFunctions>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<Vec<String>>,
    /// `stage<i>`, relative to the build directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<String>,
    /// What the stage's backward recomputes instead of stashing (absent: nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recompute: Option<RecomputeDoc>,
    /// The most bytes of temporaries one call of the stage's functions has live at once
    /// (values made and read inside it, by liveness in body order; absent without a
    /// program). `ppcc run` measures the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temporary_bytes: Option<f64>,
}

/// `stages[i].recompute`, per micro-batch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecomputeDoc {
    /// Names (in the training program) of the values made again in the backward.
    pub values: Vec<String>,
    /// Bytes the stage would stash without recomputation (`activation_bytes_per_microbatch`
    /// is what it stashes with it).
    #[serde(deserialize_with = "finite_or_null::f64")]
    pub stash_bytes_without: f64,
    /// Bytes of the recomputed values, live while the backward runs.
    #[serde(deserialize_with = "finite_or_null::f64")]
    pub recomputed_bytes: f64,
    #[serde(deserialize_with = "finite_or_null::f64")]
    pub extra_seconds: f64,
    #[serde(deserialize_with = "finite_or_null::f64")]
    pub extra_flops: f64,
    /// Whether the choice is proven the least extra time for its memory budget.
    pub exact: bool,
}

/// `stages[i].native_seconds`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NativeSeconds {
    #[serde(deserialize_with = "finite_or_null::f64")]
    pub fwd: f64,
    #[serde(deserialize_with = "finite_or_null::f64")]
    pub bwd_input: f64,
    #[serde(deserialize_with = "finite_or_null::f64")]
    pub bwd_weight: f64,
    #[serde(deserialize_with = "finite_or_null::f64")]
    pub optim: f64,
}

/// `stages[i].functions`: names in `stage<i>/stage.ppir`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageFunctions {
    pub fwd: String,
    pub bwd_input: String,
    pub bwd_weight: String,
    /// `null` for a stage without parameters.
    pub optim: Option<String>,
}

/// `prediction`, `prediction_cost_model` and a planned `baseline`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Prediction {
    #[serde(deserialize_with = "finite_or_null::f64")]
    pub iteration_seconds: f64,
    #[serde(deserialize_with = "finite_or_null::f64")]
    pub bubble_fraction: f64,
    #[serde(deserialize_with = "finite_or_null::f64")]
    pub lower_bound_seconds: f64,
    /// Per device.
    #[serde(deserialize_with = "finite_or_null::vec")]
    pub busy_seconds: Vec<f64>,
    #[serde(deserialize_with = "finite_or_null::vec")]
    pub peak_memory_bytes: Vec<f64>,
    pub peak_stash_microbatches: Vec<usize>,
    pub stage_graph_is_chain: bool,
    /// Per stage: F+B+W seconds per micro-batch.
    #[serde(deserialize_with = "finite_or_null::vec")]
    pub stage_seconds: Vec<f64>,
    pub edges: Vec<EdgeBytes>,
    /// `prediction` only: `cost-model` or `measured-native`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage_times: Option<String>,
}

/// A stage DAG edge with the bytes it carries per micro-batch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EdgeBytes {
    pub from: usize,
    pub to: usize,
    #[serde(deserialize_with = "finite_or_null::f64")]
    pub bytes: f64,
}

/// `baseline`: the sequential partition's prediction, or why it could not be planned.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Baseline {
    /// Always `sequential`.
    pub partition: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iteration_seconds: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bubble_fraction: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lower_bound_seconds: Option<f64>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "finite_or_null::opt_vec"
    )]
    pub busy_seconds: Option<Vec<f64>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "finite_or_null::opt_vec"
    )]
    pub peak_memory_bytes: Option<Vec<f64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_stash_microbatches: Option<Vec<usize>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage_graph_is_chain: Option<bool>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "finite_or_null::opt_vec"
    )]
    pub stage_seconds: Option<Vec<f64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edges: Option<Vec<EdgeBytes>>,
}

impl Baseline {
    /// The baseline planned as `p`.
    pub fn planned(p: Prediction) -> Baseline {
        Baseline {
            partition: "sequential".into(),
            error: None,
            iteration_seconds: Some(p.iteration_seconds),
            bubble_fraction: Some(p.bubble_fraction),
            lower_bound_seconds: Some(p.lower_bound_seconds),
            busy_seconds: Some(p.busy_seconds),
            peak_memory_bytes: Some(p.peak_memory_bytes),
            peak_stash_microbatches: Some(p.peak_stash_microbatches),
            stage_graph_is_chain: Some(p.stage_graph_is_chain),
            stage_seconds: Some(p.stage_seconds),
            edges: Some(p.edges),
        }
    }

    /// A baseline the planner could not make.
    pub fn failed(error: String) -> Baseline {
        Baseline {
            partition: "sequential".into(),
            error: Some(error),
            iteration_seconds: None,
            bubble_fraction: None,
            lower_bound_seconds: None,
            busy_seconds: None,
            peak_memory_bytes: None,
            peak_stash_microbatches: None,
            stage_graph_is_chain: None,
            stage_seconds: None,
            edges: None,
        }
    }
}

/// One entry of `channels`: a value sent from stage `from` to stage `to`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Channel {
    pub id: i64,
    pub from: u32,
    pub to: u32,
    /// The IR value it carries.
    pub value: String,
    /// `fwd`, `bwd_input`, ...
    pub phase: String,
    pub bytes: u64,
}

/// `training`.
/// `data_parallel`: `ranks[r][d]` is the worker (MPI rank) of device `d` in replica `r`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataParallel {
    pub replicas: usize,
    pub ranks: Vec<Vec<usize>>,
    /// The predicted time of the gradient all-reduce per step (in `prediction`).
    #[serde(deserialize_with = "finite_or_null::f64")]
    pub allreduce_seconds: f64,
}

/// One entry of `collectives`: stage `s` of `stages` sums `grad.<param>` with an
/// `all_reduce` on `channel` (with `replicas`, in every data-parallel replica too).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Collective {
    pub channel: i64,
    pub param: String,
    pub stages: Vec<u32>,
    pub replicas: bool,
    pub bytes: u64,
    /// ZeRO-1 (`--zero 1`): the gradient is reduce-scattered over the replicas (each
    /// updates its shard of the parameter), and the updated shards are all-gathered on
    /// channel `gather_channel`. Absent: an all-reduce.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reduce_scatter: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gather_channel: Option<i64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Training {
    /// `cross_entropy`, `mse`, `output`.
    pub loss: String,
    pub train_mode: bool,
    /// The labels' type per micro-batch (`tensor<2xi64>`), when the loss takes labels.
    pub labels: Option<String>,
    pub needs_rng: bool,
    /// The data `@grad` reads, in argument order.
    pub inputs: Vec<DataInput>,
    pub params: Vec<String>,
    pub updated_states: Vec<String>,
    /// IR weight name → ONNX initializer.
    pub weight_sources: BTreeMap<String, String>,
    /// Weights that `--split` cut into pieces (each piece its own parameter): IR weight
    /// name → how its trained pieces join back (for `--save-onnx`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub weight_pieces: BTreeMap<String, WeightPieces>,
    pub optimizer: Optimizer,
}

/// One entry of `training.weight_pieces`: the pieces, in order, concatenated along `axis`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeightPieces {
    pub axis: usize,
    pub pieces: Vec<String>,
}

/// One entry of `splits`: an op `--split` cut into pieces.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SplitDoc {
    /// The op's location (its ONNX node name).
    pub node: String,
    /// `matmul along N in 2 pieces`.
    pub what: String,
}

/// One entry of `training.inputs`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataInput {
    /// IR name (`labels`, or a model input).
    pub name: String,
    /// The ONNX input it came from.
    pub onnx_name: Option<String>,
    /// Type per micro-batch, in ppir's syntax (`tensor<2x16xf32>`).
    #[serde(rename = "type")]
    pub ty: String,
    /// How `--data synthetic` draws it.
    pub synthetic: Synthetic,
}

/// How synthetic data draws an input: `"normal"` or `{"uniform": [low, high]}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum Synthetic {
    /// Standard normal floats.
    Normal,
    /// Integers in `[low, high)`.
    Uniform([i64; 2]),
}

/// `training.optimizer`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Optimizer {
    /// `sgd` or `adamw`.
    pub kind: String,
    #[serde(deserialize_with = "finite_or_null::f64")]
    pub lr: f64,
    #[serde(deserialize_with = "finite_or_null::f64")]
    pub momentum: f64,
    #[serde(deserialize_with = "finite_or_null::f64")]
    pub weight_decay: f64,
    #[serde(deserialize_with = "finite_or_null::f64")]
    pub beta1: f64,
    #[serde(deserialize_with = "finite_or_null::f64")]
    pub beta2: f64,
    #[serde(deserialize_with = "finite_or_null::f64")]
    pub eps: f64,
    pub microbatches: u32,
}

/// Size and SHA-256 (lowercase hex) of one file of the build directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileRecord {
    pub bytes: u64,
    pub sha256: String,
}

/// The fields read before the rest, so a plan of another version is refused for its
/// version rather than for the first field that changed.
#[derive(Deserialize)]
struct Header {
    format: Option<serde_json::Value>,
    version: Option<serde_json::Value>,
}

impl Plan {
    /// Parse plan.json's text: the format and version first, then every field strictly.
    pub fn from_json(text: &str) -> Result<Plan, PlanError> {
        let header: Header = serde_json::from_str(text).map_err(PlanError::Json)?;
        Self::check_header(&header)?;
        let de = &mut serde_json::Deserializer::from_str(text);
        let plan: Plan = serde_path_to_error::deserialize(de).map_err(|e| PlanError::Schema {
            path: e.path().to_string(),
            message: e.into_inner().to_string(),
        })?;
        Ok(plan)
    }

    /// [`Plan::from_json`] of a JSON value already parsed.
    pub fn from_value(v: &serde_json::Value) -> Result<Plan, PlanError> {
        let header = Header {
            format: v.get("format").cloned(),
            version: v.get("version").cloned(),
        };
        if !v.is_object() {
            return Err(PlanError::NotAPlan);
        }
        Self::check_header(&header)?;
        serde_path_to_error::deserialize(v).map_err(|e| PlanError::Schema {
            path: e.path().to_string(),
            message: e.into_inner().to_string(),
        })
    }

    fn check_header(h: &Header) -> Result<(), PlanError> {
        if h.format.as_ref().and_then(|f| f.as_str()) != Some(FORMAT) {
            return Err(PlanError::NotAPlan);
        }
        match h.version.as_ref().and_then(|v| v.as_u64()) {
            Some(VERSION) => Ok(()),
            Some(n) if n > VERSION => Err(PlanError::Newer {
                found: n,
                supported: VERSION,
            }),
            found => Err(PlanError::Older {
                found,
                supported: VERSION,
            }),
        }
    }

    /// The plan as pretty-printed JSON.
    pub fn to_json(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string_pretty(self)
    }
}

/// Numbers that may be written as `null`: serde_json writes a NaN or infinite `f64` (an
/// infeasible candidate, an unbounded prediction) as `null`; they read back as NaN.
mod finite_or_null {
    use serde::{Deserialize, Deserializer};

    pub fn f64<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
    }

    pub fn vec<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
        Ok(Vec::<Option<f64>>::deserialize(d)?
            .into_iter()
            .map(|x| x.unwrap_or(f64::NAN))
            .collect())
    }

    pub fn opt_vec<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<f64>>, D::Error> {
        Ok(Option::<Vec<Option<f64>>>::deserialize(d)?
            .map(|v| v.into_iter().map(|x| x.unwrap_or(f64::NAN)).collect()))
    }
}

#[cfg(test)]
mod tests;
