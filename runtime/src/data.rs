//! Training data: global batches by step number.
//!
//! A [`Batch`] maps input names to tensors whose axis 0 is the global batch. A
//! [`BatchSource`] gives the batch of a step; it is addressed by step number (not an
//! iterator) so a resumed run sees the same data as an uninterrupted one.
//!
//! - [`ArraySource`]: arrays already in memory (the CLI reads them from an `.npz`); step k
//!   takes rows `[(k mod n)·B, (k mod n + 1)·B)` where n = ⌊rows / B⌋ (rows past the last
//!   full batch are never used).
//! - [`SyntheticSource`]: seeded random data for given input types: floats ~ N(0, 1),
//!   integers uniform in a range ([`index_bounds`] finds the range for indices into a
//!   `gather` table). With `repeat`, every step gets the same batch, so the loss of a
//!   working training program falls.

use std::collections::{BTreeMap, HashMap};

use ppir::ops::attrs::{CrossEntropyAttrs, GatherAttrs, GatherGradAttrs};
use ppir::ops::{OpAttrs, OpClass};
use ppir::{ArgKind, Function, OpKind, Tensor, TensorData, TensorType, Use};

use crate::RuntimeError;

/// Named tensors with the global batch on axis 0.
pub type Batch = BTreeMap<String, Tensor>;

/// Gives the global batch of each step.
pub trait BatchSource {
    /// The batch of step `step` (counted from 0).
    fn batch(&mut self, step: u64) -> Result<Batch, RuntimeError>;
}

/// Consecutive global batches from arrays, wrapping around.
#[derive(Clone, Debug)]
pub struct ArraySource {
    arrays: BTreeMap<String, Tensor>,
    batch: usize,
    rows: usize,
}

impl ArraySource {
    /// Arrays with the same number of rows (axis 0), at least `batch` of them.
    pub fn new(
        arrays: impl IntoIterator<Item = (String, Tensor)>,
        batch: usize,
    ) -> Result<Self, RuntimeError> {
        let arrays: BTreeMap<String, Tensor> = arrays.into_iter().collect();
        if batch == 0 {
            return Err(RuntimeError::Data(
                "the batch size must be at least 1".into(),
            ));
        }
        let mut rows: Option<(usize, &str)> = None;
        for (name, t) in &arrays {
            if ppir::size::checked_num_elements(&t.shape) != Some(t.data.len()) {
                return Err(RuntimeError::Data(format!(
                    "array `{name}`: shape {:?} does not match its {} elements",
                    t.shape,
                    t.data.len()
                )));
            }
            let Some(&r) = t.shape.first() else {
                return Err(RuntimeError::Data(format!(
                    "array `{name}` is a scalar; every array needs the batch on axis 0"
                )));
            };
            match rows {
                Some((r0, first)) if r0 != r => {
                    return Err(RuntimeError::Data(format!(
                    "arrays disagree on the number of rows: `{first}` has {r0}, `{name}` has {r}"
                )))
                }
                Some(_) => {}
                None => rows = Some((r, name)),
            }
        }
        let Some((rows, _)) = rows else {
            return Err(RuntimeError::Data("no arrays".into()));
        };
        if rows < batch {
            return Err(RuntimeError::Data(format!(
                "the data has {rows} rows, fewer than one global batch of {batch}"
            )));
        }
        Ok(ArraySource {
            arrays,
            batch,
            rows,
        })
    }

    /// Rows in each array.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Full global batches before the data wraps around.
    pub fn batches(&self) -> usize {
        self.rows / self.batch
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.arrays.keys().map(String::as_str)
    }

    /// Check every row of the arrays that `limits` names ([`check_indices`]; rows are
    /// counted from 0 in the arrays as given).
    pub fn check_indices(&self, limits: &HashMap<String, IndexLimit>) -> Result<(), RuntimeError> {
        for (name, t) in &self.arrays {
            if let Some(l) = limits.get(name) {
                check_indices(name, t, l, 0)?;
            }
        }
        Ok(())
    }
}

impl BatchSource for ArraySource {
    fn batch(&mut self, step: u64) -> Result<Batch, RuntimeError> {
        let k = (step % self.batches() as u64) as usize;
        self.arrays
            .iter()
            .map(|(n, t)| {
                let rows = try_slice_rows(t, k * self.batch, self.batch).map_err(|source| {
                    RuntimeError::Array {
                        name: n.clone(),
                        source,
                    }
                })?;
                Ok((n.clone(), rows))
            })
            .collect()
    }
}

/// Rows `[start, start + count)` of `t` along axis 0 (the caller checks the range).
pub fn slice_rows(t: &Tensor, start: usize, count: usize) -> Tensor {
    let per_row: usize = t.shape[1..].iter().product();
    let (a, b) = (start * per_row, (start + count) * per_row);
    let mut shape = t.shape.clone();
    shape[0] = count;
    let data = match &t.data {
        TensorData::Float(v) => TensorData::Float(v[a..b].to_vec()),
        TensorData::Int(v) => TensorData::Int(v[a..b].to_vec()),
    };
    Tensor {
        dtype: t.dtype,
        shape,
        data,
    }
}

/// Why [`try_slice_rows`] cannot take the rows.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SliceError {
    #[error("a scalar has no rows")]
    Scalar,
    #[error("shape {shape:?} does not match its {elements} elements")]
    Shape { shape: Vec<usize>, elements: usize },
    #[error("rows {start}..{end} are outside its {rows} rows")]
    Rows {
        start: usize,
        end: usize,
        rows: usize,
    },
}

/// [`slice_rows`] for data from outside: fails, without panicking, for a range outside
/// the tensor or a tensor whose data does not match its shape (whose element count may
/// even overflow: an `.npz` header `(2**62, 4)` with no data).
pub fn try_slice_rows(t: &Tensor, start: usize, count: usize) -> Result<Tensor, SliceError> {
    let shape_err = || SliceError::Shape {
        shape: t.shape.clone(),
        elements: t.data.len(),
    };
    let Some(&rows) = t.shape.first() else {
        return Err(SliceError::Scalar);
    };
    let per_row = ppir::size::checked_num_elements(&t.shape[1..]).ok_or_else(shape_err)?;
    if ppir::size::checked_num_elements(&t.shape) != Some(t.data.len()) {
        return Err(shape_err());
    }
    let end = start
        .checked_add(count)
        .filter(|&e| e <= rows)
        .ok_or(SliceError::Rows {
            start,
            end: start.saturating_add(count),
            rows,
        })?;
    // Both fit: end * per_row <= rows * per_row = the element count.
    let (a, b) = (start * per_row, end * per_row);
    let mut shape = t.shape.clone();
    shape[0] = count;
    let data = match &t.data {
        TensorData::Float(v) => TensorData::Float(v[a..b].to_vec()),
        TensorData::Int(v) => TensorData::Int(v[a..b].to_vec()),
    };
    Ok(Tensor {
        dtype: t.dtype,
        shape,
        data,
    })
}

/// How a synthetic input's elements are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Distribution {
    /// Standard normal N(0, 1) (float inputs).
    Normal,
    /// Integers uniform in `[low, high)`.
    Uniform { low: i64, high: i64 },
}

/// One synthetic input: its name, type (with the global batch on axis 0) and distribution.
#[derive(Clone, Debug, PartialEq)]
pub struct InputSpec {
    pub name: String,
    pub ty: TensorType,
    pub dist: Distribution,
}

/// Seeded random batches.
#[derive(Clone, Debug)]
pub struct SyntheticSource {
    specs: Vec<InputSpec>,
    seed: u64,
    repeat: bool,
    cached: Option<Batch>,
}

impl SyntheticSource {
    /// `repeat`: every step gets the batch of step 0. Fails for a non-static type, a type
    /// too large to count or to fit in memory, a normal distribution on an integer type,
    /// or an empty integer range.
    pub fn new(specs: Vec<InputSpec>, seed: u64, repeat: bool) -> Result<Self, RuntimeError> {
        for s in &specs {
            if !s.ty.is_static() {
                return Err(RuntimeError::Data(format!(
                    "synthetic input `{}` needs a static type, got {}",
                    s.name, s.ty
                )));
            }
            s.ty.check_size()
                .and_then(|()| check_batch_memory(s))
                .map_err(|e| RuntimeError::Data(format!("synthetic input `{}`: {e}", s.name)))?;
            match s.dist {
                Distribution::Normal if !s.ty.dtype.is_float() => {
                    return Err(RuntimeError::Data(format!(
                        "synthetic input `{}` has type {}: a normal distribution needs floats",
                        s.name, s.ty
                    )))
                }
                Distribution::Uniform { low, high } if high <= low => {
                    return Err(RuntimeError::Data(format!(
                        "synthetic input `{}`: empty integer range [{low}, {high})",
                        s.name
                    )))
                }
                _ => {}
            }
        }
        Ok(SyntheticSource {
            specs,
            seed,
            repeat,
            cached: None,
        })
    }

    pub fn specs(&self) -> &[InputSpec] {
        &self.specs
    }

    /// Check that every integer input that `limits` names is drawn within its limit.
    pub fn check_indices(&self, limits: &HashMap<String, IndexLimit>) -> Result<(), RuntimeError> {
        for s in &self.specs {
            let (Some(l), Distribution::Uniform { low, high }) = (limits.get(&s.name), s.dist)
            else {
                continue;
            };
            let fits = l.allows(low) && u64::try_from(high).is_ok_and(|h| h <= l.size);
            if !fits {
                return Err(RuntimeError::Data(format!(
                    "synthetic `{}` is drawn from [{low}, {high}), outside {} ({})",
                    s.name,
                    l.describe(),
                    l.what
                )));
            }
        }
        Ok(())
    }

    fn generate(&self, step: u64) -> Result<Batch, RuntimeError> {
        self.specs
            .iter()
            .map(|s| {
                check_batch_memory(s).map_err(|e| {
                    RuntimeError::Data(format!("synthetic input `{}`: {e}", s.name))
                })?;
                let stream = mix(self.seed ^ mix(step.wrapping_add(1)) ^ hash_name(&s.name));
                Ok((s.name.clone(), draw(s, stream)))
            })
            .collect()
    }
}

/// Refuse a synthetic input larger than the memory available (`--batch 1000000000`):
/// ppir tensors hold 8 bytes an element.
fn check_batch_memory(s: &InputSpec) -> Result<(), ppir::SizeError> {
    let bytes = s.ty.num_elements().unwrap_or(0).saturating_mul(8);
    ppir::size::check_memory(bytes, || format!("a batch of {}", s.ty))
}

impl BatchSource for SyntheticSource {
    fn batch(&mut self, step: u64) -> Result<Batch, RuntimeError> {
        if !self.repeat {
            return self.generate(step);
        }
        if self.cached.is_none() {
            self.cached = Some(self.generate(0)?);
        }
        Ok(self.cached.clone().expect("filled above"))
    }
}

/// splitmix64's finaliser: a counter-based generator that never changes with a crate
/// version, so synthetic data is the same on every machine and release.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn hash_name(name: &str) -> u64 {
    // FNV-1a: stable, unlike std's RandomState.
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A uniform float in (0, 1) from 53 random bits.
fn unit(bits: u64) -> f64 {
    ((bits >> 11) as f64 + 0.5) / (1u64 << 53) as f64
}

fn draw(s: &InputSpec, stream: u64) -> Tensor {
    let shape: Vec<usize> =
        s.ty.static_shape()
            .expect("checked in new")
            .into_iter()
            .map(|d| d as usize)
            .collect();
    // Checked in `new`: the type's size is representable.
    let n = ppir::size::checked_num_elements(&shape).unwrap_or(0);
    let bits = |i: usize| mix(stream.wrapping_add(i as u64));
    match s.dist {
        Distribution::Normal => {
            // Box–Muller, one value per pair of uniforms.
            let data = (0..n)
                .map(|i| {
                    let (u1, u2) = (unit(bits(2 * i)), unit(bits(2 * i + 1)));
                    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
                })
                .collect();
            Tensor::from_f64(s.ty.dtype, shape, data)
        }
        Distribution::Uniform { low, high } => {
            let span = (high - low) as u64;
            let data: Vec<i64> = (0..n).map(|i| low + (bits(i) % span) as i64).collect();
            if s.ty.dtype.is_float() {
                Tensor::from_f64(
                    s.ty.dtype,
                    shape,
                    data.into_iter().map(|x| x as f64).collect(),
                )
            } else {
                Tensor::from_i64(s.ty.dtype, shape, data)
            }
        }
    }
}

/// The ops (and operand positions) that integer `Input` argument `arg` of `f` reaches
/// through reshapes, casts and other data movement (every other use ends the walk).
fn index_uses(f: &Function, arg: ppir::ValueId) -> Vec<(&ppir::OpData, usize)> {
    let mut out = vec![];
    let mut work = vec![arg];
    let mut seen = vec![false; f.num_values()];
    while let Some(v) = work.pop() {
        if std::mem::replace(&mut seen[v.index()], true) {
            continue;
        }
        for u in f.users(v) {
            let Use::Operand(op, i) = *u else { continue };
            let data = f.op(op);
            if data.is_removed() {
                continue;
            }
            let passes_through = (data.kind.class() == OpClass::DataMovement
                && data.kind != OpKind::Gather)
                || matches!(data.kind, OpKind::Cast | OpKind::Identity);
            if passes_through {
                work.extend_from_slice(data.results());
            } else {
                out.push((data, i));
            }
        }
    }
    out
}

/// The size of the gathered axis of a `gather` whose indices are operand `i`.
fn gather_size(f: &Function, data: &ppir::OpData, i: usize) -> Option<u64> {
    if data.kind != OpKind::Gather || i != 1 {
        return None;
    }
    let table = f.ty(data.operands()[0]);
    let axis = GatherAttrs::of(&data.attrs).map_or(0, |a| a.axis);
    let rank = table.rank() as i64;
    let axis = if axis < 0 { axis + rank } else { axis };
    usize::try_from(axis)
        .ok()
        .and_then(|a| table.dims.get(a))
        .and_then(|d| d.known())
}

/// For each integer `Input` argument of `f` that is used (possibly through reshapes,
/// casts and other data movement) as the indices of a `gather`, the size of the gathered
/// axis: valid indices are `[0, size)`. Several gathers give the smallest size.
pub fn index_bounds(f: &Function) -> HashMap<String, u64> {
    let mut out = HashMap::new();
    for &(arg, kind) in f.args() {
        if kind != ArgKind::Input || !f.ty(arg).dtype.is_int() {
            continue;
        }
        let bound = index_uses(f, arg)
            .into_iter()
            .filter_map(|(data, i)| gather_size(f, data, i))
            .min();
        if let Some(b) = bound {
            out.insert(f.value(arg).name.clone(), b);
        }
    }
    out
}

/// Which values an integer data input may hold: it indexes something of `size` entries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexLimit {
    /// Valid values are `[0, size)`, or `[-size, size)` with `wraps`.
    pub size: u64,
    /// Negative values count from the end (ONNX `Gather` indices, which both the
    /// interpreter and native code accept); class labels do not.
    pub wraps: bool,
    /// One more accepted value (cross-entropy's `ignore_index`).
    pub ignore: Option<i64>,
    /// What the input indexes, for messages (`the 64 rows of the gather "embed"`).
    pub what: String,
}

impl IndexLimit {
    pub fn allows(&self, v: i64) -> bool {
        let low = if self.wraps {
            -(self.size.min(i64::MAX as u64) as i64)
        } else {
            0
        };
        (v >= low && (v < 0 || (v as u64) < self.size)) || Some(v) == self.ignore
    }

    /// The tighter of two limits on the same input (an ignored value must be accepted by
    /// both).
    fn meet(self, other: IndexLimit) -> IndexLimit {
        let ignore = if self.ignore == other.ignore {
            self.ignore
        } else {
            None
        };
        let wraps = self.wraps && other.wraps;
        let mut tighter = if other.size < self.size { other } else { self };
        tighter.ignore = ignore;
        tighter.wraps = wraps;
        tighter
    }

    fn describe(&self) -> String {
        let range = if self.wraps {
            format!("[-{0}, {0})", self.size)
        } else {
            format!("[0, {})", self.size)
        };
        match self.ignore {
            Some(i) => format!("{range} or {i} (ignored)"),
            None => range,
        }
    }
}

/// For each integer `Input` argument of `f` that indexes something — the indices of a
/// `gather` (token ids into an embedding table; negative ones count from the end, as in
/// ONNX), the labels of a softmax cross-entropy (class ids, or its `ignore_index`), the
/// indices of a `gather_grad` — reached through data movement as in [`index_bounds`]: the
/// values it may hold, exactly those the interpreter accepts. The interpreter refuses
/// others when it meets them; native code does not check, so callers check the data
/// before running ([`check_indices`]).
pub fn index_limits(f: &Function) -> HashMap<String, IndexLimit> {
    let mut out = HashMap::new();
    for &(arg, kind) in f.args() {
        if kind != ArgKind::Input || !f.ty(arg).dtype.is_int() {
            continue;
        }
        let mut limit: Option<IndexLimit> = None;
        for (data, i) in index_uses(f, arg) {
            let at = data
                .loc
                .as_deref()
                .map(|l| format!(" \"{l}\""))
                .unwrap_or_default();
            let found = match data.kind {
                OpKind::Gather => gather_size(f, data, i).map(|n| IndexLimit {
                    size: n,
                    wraps: true,
                    ignore: None,
                    what: format!("the {n} rows of the gather{at}"),
                }),
                OpKind::SoftmaxCrossEntropy | OpKind::SoftmaxCrossEntropyGrad if i == 1 => f
                    .ty(data.operands()[0])
                    .dims
                    .last()
                    .and_then(|d| d.known())
                    .map(|c| IndexLimit {
                        size: c,
                        wraps: false,
                        ignore: CrossEntropyAttrs::of(&data.attrs)
                            .ok()
                            .and_then(|a| a.ignore_index),
                        what: format!("the {c} classes of the cross-entropy{at}"),
                    }),
                OpKind::GatherGrad if i == 0 => {
                    let a = GatherGradAttrs::of(&data.attrs).ok();
                    a.and_then(|a| {
                        let s = a.data_shape;
                        let axis = if a.axis < 0 {
                            a.axis + s.len() as i64
                        } else {
                            a.axis
                        };
                        let n = u64::try_from(*s.get(usize::try_from(axis).ok()?)?).ok()?;
                        Some(IndexLimit {
                            size: n,
                            wraps: true,
                            ignore: None,
                            what: format!("the {n} rows of the gather{at}"),
                        })
                    })
                }
                _ => None,
            };
            if let Some(l) = found {
                limit = Some(match limit {
                    None => l,
                    Some(prev) => prev.meet(l),
                });
            }
        }
        if let Some(l) = limit {
            out.insert(f.value(arg).name.clone(), l);
        }
    }
    out
}

/// [`index_limits`] of several functions (the stages of a plan, the functions of a
/// training program), the tighter limit where two name the same input.
pub fn index_limits_of<'a>(
    functions: impl IntoIterator<Item = &'a Function>,
) -> HashMap<String, IndexLimit> {
    let mut out: HashMap<String, IndexLimit> = HashMap::new();
    for f in functions {
        for (name, l) in index_limits(f) {
            let l = match out.remove(&name) {
                None => l,
                Some(prev) => prev.meet(l),
            };
            out.insert(name, l);
        }
    }
    out
}

/// Check every value of the integer array `name` (rows on axis 0, the first being row
/// `first_row`) against `limit`; the error names the row, the position within the row and
/// the value. Float arrays are not indices and pass.
pub fn check_indices(
    name: &str,
    t: &Tensor,
    limit: &IndexLimit,
    first_row: usize,
) -> Result<(), RuntimeError> {
    let TensorData::Int(values) = &t.data else {
        return Ok(());
    };
    let Some(bad) = values.iter().position(|&v| !limit.allows(v)) else {
        return Ok(());
    };
    let value = values[bad];
    let inner = t.shape.get(1..).unwrap_or(&[]);
    let per_row: usize = inner.iter().product::<usize>().max(1);
    let where_ = if t.shape.is_empty() {
        String::new()
    } else {
        let (row, mut rest) = (bad / per_row, bad % per_row);
        let position = if inner.len() == 1 {
            format!(", position {rest}")
        } else if inner.is_empty() {
            String::new()
        } else {
            let mut idx = vec![0usize; inner.len()];
            for (k, &d) in inner.iter().enumerate().rev() {
                idx[k] = rest % d.max(1);
                rest /= d.max(1);
            }
            format!(", position {idx:?}")
        };
        format!(" row {}{position}", first_row + row)
    };
    Err(RuntimeError::Data(format!(
        "`{name}`{where_}: value {value} is outside {} ({})",
        limit.describe(),
        limit.what
    )))
}

/// A synthetic spec for every `Input` argument of `f` named in `names`, with axis 0
/// bound to `global_batch`: floats ~ N(0, 1); integers feeding a `gather` uniform over the
/// table's rows ([`index_bounds`]); other integers (masks, flags) and bools in {0, 1}.
pub fn default_specs(f: &Function, names: &[String], global_batch: u64) -> Vec<InputSpec> {
    let bounds = index_bounds(f);
    f.args()
        .iter()
        .filter(|(v, k)| *k == ArgKind::Input && names.contains(&f.value(*v).name))
        .map(|&(v, _)| {
            let name = f.value(v).name.clone();
            let ty = with_batch(f.ty(v), global_batch);
            let dist = if ty.dtype.is_float() {
                Distribution::Normal
            } else {
                let high = bounds.get(&name).copied().unwrap_or(2).max(1) as i64;
                Distribution::Uniform { low: 0, high }
            };
            InputSpec { name, ty, dist }
        })
        .collect()
}

/// `ty` with axis 0 set to `n` (a scalar stays a scalar).
pub fn with_batch(ty: &TensorType, n: u64) -> TensorType {
    let mut t = ty.clone();
    if let Some(d) = t.dims.first_mut() {
        *d = ppir::Dim::Known(n);
    }
    t
}

#[cfg(test)]
mod tests;
