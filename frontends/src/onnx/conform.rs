//! The conformance runner: ONNX test-data folders run through the importer and the
//! reference interpreter and compared with their reference outputs.
//!
//! Two layouts are understood, as in the onnx package's backend tests
//! (`onnx/backend/test/runner`):
//!
//! - a folder with `model.onnx` and `test_data_set_*/input_K.pb`, `output_K.pb`
//!   (`TensorProto` files; input K feeds the model's K-th graph input);
//! - the `light/` layout: `NAME.onnx` next to `NAME_output_0.pb`, with no input files. As
//!   the onnx runner does, every graph input that is not an initializer is fed
//!   `arange(n).reshape(shape) / n` as float32, where a dimension without a value counts 1.
//!
//! A folder given to [`discover`] may be one test folder, a `light/`-style folder, or a
//! folder of test folders (one level down).
//!
//! Comparison follows `numpy.testing.assert_allclose` as the onnx runner calls it:
//! `|actual - expected| <= atol + rtol * |expected|` elementwise, NaN equal to NaN, shapes and
//! element types equal. See [`Tolerance::for_dtype`] for the tolerances.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use ppir::interp::{run_function, InterpOptions};
use ppir::ops::attrs::DropoutAttrs;
use ppir::ops::OpAttrs;
use ppir::{ArgKind, DType, Function, Module, Tensor};
use prost::Message;

use super::proto::{DimensionValue, ModelProto, TensorProto, TypeValue};
use super::tensor::{element_count, tensor_from_proto, TensorDataError};
use super::{import_model, ImportOptions, OnnxError};

/// How close an output must be: `|actual - expected| <= atol + rtol * |expected|`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    pub rtol: f64,
    pub atol: f64,
}

impl Tolerance {
    /// The default tolerance per element type. f32/f64: rtol 1e-3, atol 1e-7, the defaults
    /// of the onnx package's model tests (`onnx/backend/test/loader`). f16: rtol 1e-3 and atol
    /// 1e-3 (half an f16 ulp near 1 is 4.9e-4). bf16: rtol 2^-6 (two bf16 ulps, as the onnx
    /// runner uses), atol 1e-3. Integers and bools: exact.
    pub fn for_dtype(dtype: DType) -> Tolerance {
        match dtype {
            DType::F32 | DType::F64 => Tolerance {
                rtol: 1e-3,
                atol: 1e-7,
            },
            DType::F16 => Tolerance {
                rtol: 1e-3,
                atol: 1e-3,
            },
            DType::BF16 => Tolerance {
                rtol: 1.0 / 64.0,
                atol: 1e-3,
            },
            _ => Tolerance {
                rtol: 0.0,
                atol: 0.0,
            },
        }
    }
}

/// Per-model relative tolerances of the onnx package's `light` model tests
/// (`onnx/backend/test/case/model`): DenseNet-121 gets 2e-3, the others the default.
fn light_rtol(model_name: &str) -> Option<f64> {
    (model_name.contains("densenet121")).then_some(2e-3)
}

/// Overrides for [`Tolerance::for_dtype`] on float outputs, and what runs the models.
#[derive(Clone, Default)]
pub struct ConformOptions {
    pub rtol: Option<f64>,
    pub atol: Option<f64>,
    /// Runs the imported model instead of the reference interpreter (native code);
    /// `None`: the interpreter.
    pub executor: Option<Executor>,
}

/// Runs the model's function on its arguments: `(module, function, args)`.
pub type Executor = std::sync::Arc<
    dyn Fn(&Module, &Function, Vec<Tensor>) -> Result<Vec<Tensor>, ExecError> + Send + Sync,
>;

impl fmt::Debug for ConformOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConformOptions")
            .field("rtol", &self.rtol)
            .field("atol", &self.atol)
            .field("executor", &self.executor.as_ref().map(|_| "custom"))
            .finish()
    }
}

/// Why an [`Executor`] could not run a model.
#[derive(Clone, Debug)]
pub enum ExecError {
    /// Something the executor does not support (reported as `unsupported`).
    Unsupported(String),
    /// A real failure (reported as `error`).
    Failed(String),
}

/// Why test cases could not be found, test data not read, or an output does not match.
#[derive(Debug, thiserror::Error)]
pub enum ConformError {
    #[error("cannot read {}: {error}", .dir.display())]
    ReadDir { dir: PathBuf, error: std::io::Error },
    #[error("{} is not a folder", .dir.display())]
    NotAFolder { dir: PathBuf },
    #[error("{} holds no ONNX test cases (model.onnx with test_data_set_*, or NAME.onnx with NAME_output_0.pb)", .dir.display())]
    NoCases { dir: PathBuf },
    /// A `TensorProto` file that cannot be read.
    #[error("cannot read {}: {error}", .path.display())]
    ReadData {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{}: not a TensorProto: {error}", .path.display())]
    DecodeData {
        path: PathBuf,
        error: prost::DecodeError,
    },
    /// A `TensorProto` file that decodes but whose tensor does not; `data_type` is its
    /// ONNX element type.
    #[error("{}: {error}", .path.display())]
    Data {
        path: PathBuf,
        data_type: i32,
        error: Box<OnnxError>,
    },
    /// A `light` model whose inputs cannot be generated.
    #[error("the model has no graph")]
    NoGraph,
    #[error("no input {name}")]
    NoInput { name: String },
    #[error("input `{name}` is not a tensor")]
    NotATensor { name: String },
    #[error("input `{name}`: generated inputs are float32 only, as in the onnx runner")]
    NotFloat32 { name: String },
    #[error(transparent)]
    InputShape(#[from] TensorDataError),
    #[error("input `{name}` of shape {dims:?} is too large")]
    InputTooLarge { name: String, dims: Vec<i64> },
    /// An output of another element type than the reference.
    #[error("element type {actual} but expected {expected}")]
    DType { actual: DType, expected: DType },
    #[error("shape {actual:?} but expected {expected:?}")]
    Shape {
        actual: Vec<usize>,
        expected: Vec<usize>,
    },
    /// `bad` of `total` elements are out of tolerance; the first at flat `index`.
    #[error("{bad} of {total} elements differ (first at flat index {index}: {actual} vs {expected}); max abs err {max_abs:.3e}, max rel err {max_rel:.3e} (rtol {}, atol {})", .tol.rtol, .tol.atol)]
    Differ {
        bad: usize,
        total: usize,
        index: usize,
        actual: f64,
        expected: f64,
        max_abs: f64,
        max_rel: f64,
        tol: Tolerance,
    },
}

impl ConformError {
    /// Test data that is valid but of an element type ppir lacks (strings...).
    fn is_unsupported_data(&self) -> bool {
        matches!(self, ConformError::Data { data_type, .. }
            if super::tensor::dtype_from_onnx(*data_type).is_none())
    }
}

/// One model to run.
#[derive(Clone, Debug)]
pub struct Case {
    /// The test's name: its folder's name, or the model's file stem in the `light` layout.
    pub name: String,
    pub model: PathBuf,
    pub data: CaseData,
}

#[derive(Clone, Debug)]
pub enum CaseData {
    /// `test_data_set_*` folders with `input_K.pb` / `output_K.pb`.
    DataSets(Vec<PathBuf>),
    /// Generated inputs; reference outputs `NAME_output_K.pb`.
    Light(Vec<PathBuf>),
}

fn sorted_entries(dir: &Path) -> Result<Vec<PathBuf>, ConformError> {
    let rd = std::fs::read_dir(dir).map_err(|error| ConformError::ReadDir {
        dir: dir.to_path_buf(),
        error,
    })?;
    let mut v: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
    v.sort();
    Ok(v)
}

/// Files `PREFIX0SUFFIX`, `PREFIX1SUFFIX`, ... in `dir`, in index order, stopping at the
/// first gap.
fn numbered(dir: &Path, prefix: &str, suffix: &str) -> Vec<PathBuf> {
    let mut out = vec![];
    for k in 0.. {
        let p = dir.join(format!("{prefix}{k}{suffix}"));
        if !p.is_file() {
            break;
        }
        out.push(p);
    }
    out
}

fn cases_in(dir: &Path) -> Result<Vec<Case>, ConformError> {
    let model = dir.join("model.onnx");
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| dir.display().to_string());
    if model.is_file() {
        let sets: Vec<PathBuf> = sorted_entries(dir)?
            .into_iter()
            .filter(|p| {
                p.is_dir()
                    && p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("test_data_set"))
            })
            .collect();
        return Ok(vec![Case {
            name,
            model,
            data: CaseData::DataSets(sets),
        }]);
    }
    let mut cases = vec![];
    for p in sorted_entries(dir)? {
        if p.extension().is_some_and(|e| e == "onnx") && p.is_file() {
            let Some(stem) = p.file_stem().map(|s| s.to_string_lossy().into_owned()) else {
                continue;
            };
            let outputs = numbered(dir, &format!("{stem}_output_"), ".pb");
            if !outputs.is_empty() {
                cases.push(Case {
                    name: stem,
                    model: p,
                    data: CaseData::Light(outputs),
                });
            }
        }
    }
    Ok(cases)
}

/// The test cases under `dir`: the folder itself, or its sub-folders one level down.
pub fn discover(dir: &Path) -> Result<Vec<Case>, ConformError> {
    if !dir.is_dir() {
        return Err(ConformError::NotAFolder {
            dir: dir.to_path_buf(),
        });
    }
    let here = cases_in(dir)?;
    if !here.is_empty() {
        return Ok(here);
    }
    let mut cases = vec![];
    for p in sorted_entries(dir)? {
        if p.is_dir() {
            cases.extend(cases_in(&p)?);
        }
    }
    if cases.is_empty() {
        return Err(ConformError::NoCases {
            dir: dir.to_path_buf(),
        });
    }
    Ok(cases)
}

/// How one case went.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Every output within tolerance; the largest errors seen over all float outputs.
    Passed { max_abs: f64, max_rel: f64 },
    /// An output differs (the message names it and the errors).
    Failed(String),
    /// The model uses something ppcc does not support.
    Unsupported(String),
    /// The case could not be run (broken test data, an interpreter error...).
    Error(String),
    /// The process running the case died (`signal 11`) or was stopped (`timed out after
    /// 300 s`); only a runner that isolates cases in child processes reports it.
    Crashed(String),
}

impl Outcome {
    /// The status word of a result row (`passed`, `failed`, `unsupported`, `error`,
    /// `crashed`).
    pub fn status(&self) -> &'static str {
        match self {
            Outcome::Passed { .. } => "passed",
            Outcome::Failed(_) => "failed",
            Outcome::Unsupported(_) => "unsupported",
            Outcome::Error(_) => "error",
            Outcome::Crashed(_) => "crashed",
        }
    }
}

#[derive(Clone, Debug)]
pub struct CaseResult {
    pub name: String,
    pub outcome: Outcome,
    pub seconds: f64,
}

impl fmt::Display for CaseResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = self.seconds;
        match &self.outcome {
            Outcome::Passed { max_abs, max_rel } => write!(
                f,
                "passed       {:<48} max abs err {max_abs:.2e}, max rel err {max_rel:.2e} ({t:.2}s)",
                self.name
            ),
            Outcome::Failed(m) => write!(f, "failed       {:<48} {m} ({t:.2}s)", self.name),
            Outcome::Unsupported(m) => write!(f, "unsupported  {:<48} {m}", self.name),
            Outcome::Error(m) => write!(f, "error        {:<48} {m}", self.name),
            Outcome::Crashed(m) => write!(f, "crashed      {:<48} {m} ({t:.2}s)", self.name),
        }
    }
}

/// Counts over a run; errors count as failures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub passed: usize,
    pub failed: usize,
    pub unsupported: usize,
    pub crashed: usize,
}

impl Summary {
    pub fn add(&mut self, o: &Outcome) {
        match o {
            Outcome::Passed { .. } => self.passed += 1,
            Outcome::Failed(_) | Outcome::Error(_) => self.failed += 1,
            Outcome::Unsupported(_) => self.unsupported += 1,
            Outcome::Crashed(_) => self.crashed += 1,
        }
    }

    pub fn total(&self) -> usize {
        self.passed + self.failed + self.unsupported + self.crashed
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} passed, {} failed, {} unsupported, {} crashed",
            self.passed, self.failed, self.unsupported, self.crashed
        )
    }
}

/// Results per op type, and their total: the table `ppcc conform` ends with.
#[derive(Clone, Debug, Default)]
pub struct OpTable {
    pub rows: std::collections::BTreeMap<String, Summary>,
    pub total: Summary,
}

impl OpTable {
    pub fn add(&mut self, op_type: &str, outcome: &Outcome) {
        self.rows
            .entry(op_type.to_string())
            .or_default()
            .add(outcome);
        self.total.add(outcome);
    }
}

impl fmt::Display for OpTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let w = self
            .rows
            .keys()
            .map(String::len)
            .chain([7])
            .max()
            .unwrap_or(7);
        writeln!(
            f,
            "{:<w$}  {:>6}  {:>6}  {:>11}  {:>7}",
            "op type", "passed", "failed", "unsupported", "crashed"
        )?;
        let row = |f: &mut fmt::Formatter<'_>, name: &str, s: &Summary| {
            writeln!(
                f,
                "{name:<w$}  {:>6}  {:>6}  {:>11}  {:>7}",
                s.passed, s.failed, s.unsupported, s.crashed
            )
        };
        for (name, s) in &self.rows {
            row(f, name, s)?;
        }
        row(f, "total", &self.total)
    }
}

/// What a case exercises, for tables: its op type and the opset of the default domain it
/// imports (`None`: none, or the model does not decode).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaseInfo {
    pub op_type: String,
    pub opset: Option<i64>,
}

/// The [`CaseInfo`] of each case. The op type is that of the model's only node (not
/// counting `Constant`s). A model of several nodes takes the op type of the case it
/// expands (`test_sce_mean_expanded`, the op's function body, is `test_sce_mean`'s
/// `SoftmaxCrossEntropyLoss`), else the longest op type of the single-node cases, or of
/// the ops ppcc maps, that its name starts with (`test_reduce_log_sum_exp_...`:
/// `ReduceLogSumExp`, underscores and case ignored); anything else, such as a whole
/// network, is `(model)`.
pub fn case_infos(cases: &[Case]) -> Vec<CaseInfo> {
    let decoded: Vec<Option<ModelProto>> = cases
        .iter()
        .map(|c| {
            std::fs::read(&c.model)
                .ok()
                .and_then(|b| super::decode_model(&b).ok())
        })
        .collect();
    let single = |m: &ModelProto| -> Option<String> {
        let g = m.graph.as_ref()?;
        let mut ops = g.node.iter().filter(|n| n.op_type != "Constant");
        match (ops.next(), ops.next()) {
            (Some(n), None) => Some(n.op_type.clone()),
            (None, None) => g.node.first().map(|n| n.op_type.clone()),
            _ => None,
        }
    };
    let by_name: HashMap<&str, String> = cases
        .iter()
        .zip(&decoded)
        .filter_map(|(c, m)| Some((c.name.as_str(), single(m.as_ref()?)?)))
        .collect();
    let squash = |s: &str| s.replace('_', "").to_ascii_lowercase();
    let mut known: Vec<(String, String)> = decoded
        .iter()
        .flatten()
        .filter_map(single)
        .chain(super::lower::SUPPORTED_OPS.iter().map(|s| s.to_string()))
        .map(|op| (squash(&op), op))
        .collect();
    known.sort();
    known.dedup();
    cases
        .iter()
        .zip(&decoded)
        .map(|(case, m)| {
            let opset = m.as_ref().and_then(|m| {
                m.opset_import
                    .iter()
                    .filter(|o| o.domain.is_empty() || o.domain == "ai.onnx")
                    .map(|o| o.version)
                    .max()
            });
            let expands = case
                .name
                .find("_expanded")
                .and_then(|at| by_name.get(&case.name[..at]).cloned());
            let op_type = m.as_ref().and_then(single).or(expands).or_else(|| {
                let name = squash(case.name.strip_prefix("test_").unwrap_or(&case.name));
                known
                    .iter()
                    .filter(|(k, _)| name.starts_with(k.as_str()))
                    .max_by_key(|(k, _)| k.len())
                    .map(|(_, op)| op.clone())
            });
            CaseInfo {
                op_type: op_type.unwrap_or_else(|| "(model)".into()),
                opset,
            }
        })
        .collect()
}

/// Read a `TensorProto` file.
pub fn read_tensor_pb(path: &Path) -> Result<Tensor, ConformError> {
    let bytes = std::fs::read(path).map_err(|error| ConformError::ReadData {
        path: path.to_path_buf(),
        error,
    })?;
    let tp = TensorProto::decode(bytes.as_slice()).map_err(|error| ConformError::DecodeData {
        path: path.to_path_buf(),
        error,
    })?;
    tensor_from_proto(&tp, path.parent()).map_err(|error| ConformError::Data {
        path: path.to_path_buf(),
        data_type: tp.data_type,
        error: Box::new(error),
    })
}

/// The outcome for unreadable test data: the model's own unsupported feature when it has
/// one (more telling than the data's element type), else the data's problem.
fn data_outcome(model: &ModelProto, e: ConformError) -> Outcome {
    if !e.is_unsupported_data() {
        return Outcome::Error(e.to_string());
    }
    match import_model(model, &ImportOptions::default()) {
        Err(ie) if ie.is_unsupported() => Outcome::Unsupported(ie.short()),
        _ => Outcome::Unsupported(e.to_string()),
    }
}

/// The generated input of the onnx runner for a `light` model input: `arange(n) / n` as
/// float32, a dimension without a value counting 1.
fn dummy_input(model: &ModelProto, name: &str) -> Result<Tensor, ConformError> {
    let name_ = || name.to_string();
    let graph = model.graph.as_ref().ok_or(ConformError::NoGraph)?;
    let vi = graph
        .input
        .iter()
        .find(|v| v.name == name)
        .ok_or_else(|| ConformError::NoInput { name: name_() })?;
    let Some(Some(TypeValue::TensorType(tt))) = vi.r#type.as_ref().map(|t| t.value.clone()) else {
        return Err(ConformError::NotATensor { name: name_() });
    };
    if tt.elem_type != super::proto::data_type::FLOAT {
        return Err(ConformError::NotFloat32 { name: name_() });
    }
    let dims: Vec<i64> = tt
        .shape
        .map(|s| {
            s.dim
                .iter()
                .map(|d| match d.value {
                    Some(DimensionValue::DimValue(v)) if v >= 0 => v,
                    _ => 1,
                })
                .collect()
        })
        .unwrap_or_default();
    let n = element_count(&dims)?;
    if n > 1 << 28 {
        return Err(ConformError::InputTooLarge {
            name: name_(),
            dims,
        });
    }
    let data: Vec<f32> = (0..n).map(|i| (i as f64 / n as f64) as f32).collect();
    Ok(Tensor::from_f32(
        dims.iter().map(|&d| d as usize).collect(),
        data,
    ))
}

/// Largest absolute and relative errors, and whether `actual` is within `tol` of `expected`.
pub fn compare(
    actual: &Tensor,
    expected: &Tensor,
    tol: Tolerance,
) -> Result<(f64, f64), ConformError> {
    if actual.dtype != expected.dtype {
        return Err(ConformError::DType {
            actual: actual.dtype,
            expected: expected.dtype,
        });
    }
    if actual.shape != expected.shape {
        return Err(ConformError::Shape {
            actual: actual.shape.clone(),
            expected: expected.shape.clone(),
        });
    }
    let (a, e) = (actual.to_f64_vec(), expected.to_f64_vec());
    let (mut max_abs, mut max_rel, mut bad, mut first_bad) = (0.0f64, 0.0f64, 0usize, None);
    for (i, (&x, &y)) in a.iter().zip(&e).enumerate() {
        let ok = if x.is_nan() || y.is_nan() {
            x.is_nan() && y.is_nan()
        } else if x == y {
            true
        } else {
            let d = (x - y).abs();
            max_abs = max_abs.max(d);
            if y != 0.0 {
                max_rel = max_rel.max(d / y.abs());
            }
            d <= tol.atol + tol.rtol * y.abs()
        };
        if !ok {
            bad += 1;
            first_bad.get_or_insert((i, x, y));
        }
    }
    match first_bad {
        None => Ok((max_abs, max_rel)),
        Some((index, actual, expected)) => Err(ConformError::Differ {
            bad,
            total: a.len(),
            index,
            actual,
            expected,
            max_abs,
            max_rel,
            tol,
        }),
    }
}

fn classify(e: &OnnxError) -> Outcome {
    if e.is_unsupported() {
        Outcome::Unsupported(e.short())
    } else {
        Outcome::Error(e.short())
    }
}

/// Run one case (never panics: a panic inside is reported as an error).
pub fn run_case(case: &Case, opts: &ConformOptions) -> CaseResult {
    let start = Instant::now();
    let outcome =
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_case_inner(case, opts)))
        {
            Ok(o) => o,
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "unknown panic".into());
                Outcome::Error(format!("panicked: {msg}"))
            }
        };
    CaseResult {
        name: case.name.clone(),
        outcome,
        seconds: start.elapsed().as_secs_f64(),
    }
}

fn run_case_inner(case: &Case, opts: &ConformOptions) -> Outcome {
    let bytes = match std::fs::read(&case.model) {
        Ok(b) => b,
        Err(e) => return Outcome::Error(format!("cannot read {}: {e}", case.model.display())),
    };
    let mut model = match super::decode_model(&bytes) {
        Ok(m) => m,
        Err(e) => return Outcome::Error(e.to_string()),
    };
    let Some(graph) = model.graph.as_ref() else {
        return Outcome::Error("the model has no graph".into());
    };
    let init_names: std::collections::HashSet<String> =
        graph.initializer.iter().map(|t| t.name.clone()).collect();
    // Test data of sequences, optionals and maps are no TensorProto files: say what the
    // model needs rather than why the file does not read as a tensor.
    let non_tensor = graph
        .input
        .iter()
        .map(|v| ("input", v))
        .chain(graph.output.iter().map(|v| ("output", v)))
        .find_map(|(role, v)| {
            let kind = match v.r#type.as_ref().and_then(|t| t.value.as_ref()) {
                None | Some(TypeValue::TensorType(_)) => return None,
                Some(TypeValue::SequenceType(_)) => "a sequence",
                Some(TypeValue::OptionalType(_)) => "an optional",
                Some(TypeValue::MapType(_)) => "a map",
                Some(_) => "not a dense tensor",
            };
            Some(format!("graph {role} `{}` is {kind}", v.name))
        });
    if let Some(what) = non_tensor {
        return match import_model(&model, &ImportOptions::default()) {
            Err(e) if e.is_unsupported() => Outcome::Unsupported(e.short()),
            _ => Outcome::Unsupported(format!("{what}; ppcc runs tensors only")),
        };
    }
    let model_name = case.name.clone();

    // (inputs by ONNX name, expected outputs) per data set.
    let mut sets: Vec<(HashMap<String, Tensor>, Vec<Tensor>)> = vec![];
    let mut overridden = vec![];
    match &case.data {
        CaseData::Light(outputs) => {
            let mut inputs = HashMap::new();
            for vi in &graph.input {
                if init_names.contains(&vi.name) {
                    continue;
                }
                match dummy_input(&model, &vi.name) {
                    Ok(t) => {
                        inputs.insert(vi.name.clone(), t);
                    }
                    Err(e) => return Outcome::Unsupported(e.to_string()),
                }
            }
            let expected = match outputs
                .iter()
                .map(|p| read_tensor_pb(p))
                .collect::<Result<Vec<_>, _>>()
            {
                Ok(v) => v,
                Err(e) => return data_outcome(&model, e),
            };
            sets.push((inputs, expected));
        }
        CaseData::DataSets(dirs) => {
            if dirs.is_empty() {
                return Outcome::Error("no test_data_set_* folders".into());
            }
            for d in dirs {
                let mut inputs = HashMap::new();
                for (k, p) in numbered(d, "input_", ".pb").iter().enumerate() {
                    let Some(vi) = graph.input.get(k) else {
                        return Outcome::Error(format!("{} has no graph input {k}", d.display()));
                    };
                    match read_tensor_pb(p) {
                        Ok(t) => {
                            if init_names.contains(&vi.name) {
                                overridden.push(vi.name.clone());
                            }
                            inputs.insert(vi.name.clone(), t);
                        }
                        Err(e) => return data_outcome(&model, e),
                    }
                }
                let expected = match numbered(d, "output_", ".pb")
                    .iter()
                    .map(|p| read_tensor_pb(p))
                    .collect::<Result<Vec<_>, _>>()
                {
                    Ok(v) => v,
                    Err(e) => return data_outcome(&model, e),
                };
                sets.push((inputs, expected));
            }
        }
    }
    // Test data that feeds an initializer overrides it (ONNX IR < 4 semantics).
    if !overridden.is_empty() {
        if let Some(g) = model.graph.as_mut() {
            g.initializer.retain(|t| !overridden.contains(&t.name));
        }
    }

    let mut worst = (0.0f64, 0.0f64);
    for (inputs, expected) in &sets {
        let mut iopts = ImportOptions {
            model_dir: case.model.parent().map(Path::to_path_buf),
            ..Default::default()
        };
        for (name, t) in inputs {
            iopts
                .input_shapes
                .insert(name.clone(), t.shape.iter().map(|&d| d as u64).collect());
        }
        let imported = match import_model(&model, &iopts) {
            Ok(m) => m,
            Err(first) => {
                // Inputs that only feed shapes or parameters (an Expand target, a Range's
                // bounds, a training Dropout's ratio...) can be folded when their values are
                // known, as they are here: integer tensors and float scalars first.
                let ints: HashMap<String, Tensor> = inputs
                    .iter()
                    .filter(|(_, t)| !t.dtype.is_float() || t.num_elements() == 1)
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                if !first.is_unsupported()
                    || (ints.is_empty() && first.input_value_needed().is_none())
                {
                    return classify(&first);
                }
                iopts.input_values = ints;
                // Then, one at a time, any other input a node needs at import time (a
                // Resize's float scales or roi) and only that input.
                let mut attempt = import_model(&model, &iopts);
                while let Err(e) = &attempt {
                    let Some(name) = e.input_value_needed() else {
                        break;
                    };
                    let Some(t) = inputs.get(name) else {
                        break;
                    };
                    if iopts.input_values.contains_key(name) {
                        break;
                    }
                    iopts.input_values.insert(name.to_string(), t.clone());
                    attempt = import_model(&model, &iopts);
                }
                match attempt {
                    Ok(m) => m,
                    Err(_) => return classify(&first),
                }
            }
        };
        let f = &imported.module.functions[0];
        // A dropout in training mode draws its mask from ppcc's own counter-based
        // generator (keyed by step and micro-batch, so that pipeline stages and
        // recomputation agree), which cannot reproduce the reference's numpy mask.
        let training_dropout = f.ops().iter().any(|&o| {
            let op = f.op(o);
            op.kind == ppir::OpKind::Dropout
                && DropoutAttrs::of(&op.attrs).is_ok_and(|a| a.training && a.ratio > 0.0)
        });
        if training_dropout {
            return Outcome::Unsupported(
                "training-mode Dropout: ppcc draws its own mask (keyed by step and micro-batch), not numpy's".into(),
            );
        }
        let mut args = Vec::with_capacity(f.args().len());
        let mut next_input = imported.inputs.iter();
        for &(v, kind) in f.args() {
            match kind {
                ArgKind::Input => {
                    let Some(name) = next_input.next() else {
                        return Outcome::Error("argument mismatch".into());
                    };
                    match inputs.get(name) {
                        Some(t) => args.push(t.clone()),
                        None => return Outcome::Error(format!("no test data for input `{name}`")),
                    }
                }
                ArgKind::Param | ArgKind::State => {
                    let name = &f.value(v).name;
                    match imported.module.weights.get(name) {
                        Some(t) => args.push(t.clone()),
                        None => return Outcome::Error(format!("no weight `{name}`")),
                    }
                }
            }
        }
        let outs = match &opts.executor {
            None => match run_function(f, args, &InterpOptions::default(), None) {
                Ok(o) => o,
                Err(e) => return Outcome::Error(format!("interpreter: {e}")),
            },
            Some(exec) => match exec(&imported.module, f, args) {
                Ok(o) => o,
                Err(ExecError::Unsupported(m)) => return Outcome::Unsupported(m),
                Err(ExecError::Failed(m)) => return Outcome::Error(m),
            },
        };
        if outs.len() < expected.len() {
            return Outcome::Error(format!(
                "{} outputs, {} expected",
                outs.len(),
                expected.len()
            ));
        }
        for (k, (got, want)) in outs.iter().zip(expected).enumerate() {
            let mut tol = Tolerance::for_dtype(want.dtype);
            if want.dtype.is_float() {
                if let Some(r) =
                    light_rtol(&model_name).filter(|_| matches!(case.data, CaseData::Light(_)))
                {
                    tol.rtol = r;
                }
                tol.rtol = opts.rtol.unwrap_or(tol.rtol);
                tol.atol = opts.atol.unwrap_or(tol.atol);
            }
            match compare(got, want, tol) {
                Ok((a, r)) => worst = (worst.0.max(a), worst.1.max(r)),
                Err(e) => {
                    let name = imported.outputs.get(k).map(String::as_str).unwrap_or("?");
                    return Outcome::Failed(format!("output {k} `{name}`: {e}"));
                }
            }
        }
    }
    Outcome::Passed {
        max_abs: worst.0,
        max_rel: worst.1,
    }
}

/// Discover and run every case under each of `dirs`, calling `report` after each case.
pub fn run_dirs(
    dirs: &[PathBuf],
    opts: &ConformOptions,
    mut report: impl FnMut(&CaseResult),
) -> Result<(Vec<CaseResult>, Summary), ConformError> {
    let mut results = vec![];
    let mut summary = Summary::default();
    for d in dirs {
        for case in discover(d)? {
            let r = run_case(&case, opts);
            summary.add(&r.outcome);
            report(&r);
            results.push(r);
        }
    }
    Ok((results, summary))
}
