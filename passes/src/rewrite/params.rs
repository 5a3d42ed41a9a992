//! Splitting parameters that are only read in pieces.
//!
//! After a split, a weight is read through slices (the columns of an LM head's weight,
//! one slice per piece). Kept as one parameter, the weight would live on every device that
//! runs a piece; so a parameter whose every use is a unit-step slice along one axis, the
//! slices together covering that axis exactly once, becomes one parameter per slice
//! (`w.part0`, `w.part1`, ...), with its initial value cut the same way. [`WeightSplit`]
//! records how to put the trained pieces back together (a concat along the axis), which
//! checkpoints' users and `--save-onnx` need.

use std::collections::{BTreeMap, HashMap};

use ppir::ops::attrs::SliceAttrs;
use ppir::ops::OpAttrs;
use ppir::{ArgKind, Function, Module, NewOp, OpKind, Tensor, ValueId};

/// One parameter replaced by its pieces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WeightSplit {
    pub original: String,
    pub axis: usize,
    /// Piece names, in order along the axis.
    pub pieces: Vec<String>,
}

/// Why parameters could not be split, or pieces joined.
#[derive(Debug, thiserror::Error)]
pub enum SplitParamsError {
    #[error("no function @{0}")]
    NoFunction(String),
    #[error("weight `{0}` has no initial value")]
    NoInitialValue(String),
    #[error("weight `{name}`: {source}")]
    Shape {
        name: String,
        #[source]
        source: ppir::shape::ShapeError,
    },
    #[error("weight `{name}`: {source}")]
    Interp {
        name: String,
        #[source]
        source: Box<ppir::interp::InterpError>,
    },
}

/// One piece of a parameter: `[start, end)` along the axis, and the slices reading it.
type Piece = (u64, u64, Vec<ValueId>);

/// The pieces of `p` if it qualifies: (axis, pieces in order).
fn pieces_of(f: &Function, p: ValueId) -> Option<(usize, Vec<Piece>)> {
    let ty = f.ty(p);
    let shape = ty.static_shape()?;
    let rank = shape.len() as i64;
    let mut axis = None;
    let mut ranges: BTreeMap<(u64, u64), Vec<ValueId>> = BTreeMap::new();
    for u in f.users(p) {
        let ppir::Use::Operand(op, 0) = *u else {
            return None;
        };
        let d = f.op(op);
        if d.kind != OpKind::Slice {
            return None;
        }
        let s = SliceAttrs::of(&d.attrs).ok()?;
        let axes = s.axes.clone().unwrap_or_else(|| vec![0]);
        if axes.len() != 1 || s.starts.len() != 1 || s.ends.len() != 1 {
            return None;
        }
        if s.steps
            .as_ref()
            .is_some_and(|st| st.iter().any(|&v| v != 1))
        {
            return None;
        }
        let a = if axes[0] < 0 { axes[0] + rank } else { axes[0] };
        if a < 0 || a >= rank || axis.is_some_and(|x| x != a as usize) {
            return None;
        }
        axis = Some(a as usize);
        let n = shape[a as usize];
        let (st, en) = (s.starts[0], s.ends[0]);
        if st < 0 || en < 0 || st as u64 >= n || en as u64 > n || st >= en {
            return None;
        }
        ranges
            .entry((st as u64, en as u64))
            .or_default()
            .push(d.results()[0]);
    }
    let axis = axis?;
    // An exact cover of [0, n), at least two pieces.
    let mut at = 0;
    for &(s, e) in ranges.keys() {
        if s != at {
            return None;
        }
        at = e;
    }
    if at != shape[axis] || ranges.len() < 2 {
        return None;
    }
    Some((
        axis,
        ranges.into_iter().map(|((s, e), v)| (s, e, v)).collect(),
    ))
}

/// Cut `t` (weight `name`) to `[start, end)` along `axis`.
fn cut(
    name: &str,
    t: &Tensor,
    axis: usize,
    start: u64,
    end: u64,
) -> Result<Tensor, SplitParamsError> {
    let attrs = SliceAttrs {
        starts: vec![start as i64],
        ends: vec![end as i64],
        axes: Some(vec![axis as i64]),
        steps: None,
    }
    .to_attrs();
    eval(name, OpKind::Slice, &attrs, &[t])
}

/// Split every qualifying parameter of `function` (see the module documentation). The
/// function is rebuilt with the pieces as arguments in place of the original; the module's
/// weights get the pieces' initial values.
pub fn split_params(m: &mut Module, function: &str) -> Result<Vec<WeightSplit>, SplitParamsError> {
    let f = m
        .function(function)
        .ok_or_else(|| SplitParamsError::NoFunction(function.to_string()))?;
    let mut plans = HashMap::new();
    for &(v, kind) in f.args() {
        if kind == ArgKind::Param {
            if let Some(p) = pieces_of(f, v) {
                plans.insert(v, p);
            }
        }
    }
    if plans.is_empty() {
        return Ok(vec![]);
    }
    let mut out = Function::new(f.name.clone());
    out.attrs = f.attrs.clone();
    let mut map: HashMap<ValueId, ValueId> = HashMap::new();
    let mut splits = vec![];
    let mut new_weights = vec![];
    let taken: std::collections::HashSet<String> = (0..f.num_values())
        .map(|i| f.value(ValueId(i as u32)).name.clone())
        .collect();
    for &(v, kind) in f.args() {
        let name = f.value(v).name.clone();
        let Some((axis, pieces)) = plans.get(&v) else {
            map.insert(v, out.add_arg(name, f.ty(v).clone(), kind));
            continue;
        };
        let init = m
            .weights
            .get(&name)
            .ok_or_else(|| SplitParamsError::NoInitialValue(name.clone()))?;
        let mut names = vec![];
        for (i, (s, e, results)) in pieces.iter().enumerate() {
            let mut piece = format!("{name}.part{i}");
            while taken.contains(&piece) {
                piece.push('_');
            }
            let ty = f.ty(results[0]).clone();
            let arg = out.add_arg(piece.clone(), ty, kind);
            for r in results {
                map.insert(*r, arg);
            }
            let value = cut(&name, init, *axis, *s, *e)?;
            new_weights.push((piece.clone(), value));
            names.push(piece);
        }
        splits.push(WeightSplit {
            original: name,
            axis: *axis,
            pieces: names,
        });
    }
    for &op in f.ops() {
        let d = f.op(op);
        // The slices of split parameters are now arguments.
        if d.kind == OpKind::Slice && plans.contains_key(&d.operands()[0]) {
            continue;
        }
        let mut new = NewOp::new(
            d.kind,
            d.operands().iter().map(|v| map[v]).collect(),
            d.results().iter().map(|&r| f.ty(r).clone()).collect(),
        )
        .attrs(d.attrs.clone())
        .names(
            d.results()
                .iter()
                .map(|&r| f.value(r).name.clone())
                .collect(),
        );
        new.stage = d.stage;
        new.phase = d.phase;
        new.loc = d.loc.clone();
        let id = out.push_op(new);
        for (&old, &newv) in d.results().iter().zip(out.op(id).results()) {
            map.insert(old, newv);
        }
    }
    out.set_results(f.results().iter().map(|v| map[v]).collect());
    for s in &splits {
        m.weights.remove(&s.original);
    }
    m.weights.extend(new_weights);
    if let Some(slot) = m.function_mut(function) {
        *slot = out;
    }
    Ok(splits)
}

/// Put trained pieces back together: for every split, the concat of its pieces along the
/// axis replaces them in `weights` under the original name (pieces missing: left as is).
pub fn join_pieces(
    weights: &mut BTreeMap<String, Tensor>,
    splits: &[WeightSplit],
) -> Result<(), SplitParamsError> {
    for s in splits {
        let parts: Option<Vec<&Tensor>> = s.pieces.iter().map(|p| weights.get(p)).collect();
        let Some(parts) = parts else { continue };
        let attrs = ppir::ops::attrs::ConcatAttrs {
            axis: s.axis as i64,
        }
        .to_attrs();
        let joined = eval(&s.original, OpKind::Concat, &attrs, &parts)?;
        for p in &s.pieces {
            weights.remove(p);
        }
        weights.insert(s.original.clone(), joined);
    }
    Ok(())
}

/// `kind` applied to `inputs` by the interpreter, for weight `name`.
fn eval(
    name: &str,
    kind: OpKind,
    attrs: &ppir::Attrs,
    inputs: &[&Tensor],
) -> Result<Tensor, SplitParamsError> {
    let types: Vec<_> = inputs.iter().map(|t| t.tensor_type()).collect();
    let ty = ppir::shape::infer(kind, attrs, &types).map_err(|source| SplitParamsError::Shape {
        name: name.to_string(),
        source,
    })?;
    let mut out =
        ppir::interp::eval_op(kind, attrs, inputs, &ty, &Default::default()).map_err(|source| {
            SplitParamsError::Interp {
                name: name.to_string(),
                source: Box::new(source),
            }
        })?;
    Ok(out.remove(0))
}
