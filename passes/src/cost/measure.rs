//! Op times measured with the reference interpreter (profiles with `measure_ops`).
//!
//! Each distinct op (kind, attributes, operand and result types) is run on synthetic
//! inputs — floats 0.5, integers 0 (valid indices, non-zero-free divisors stay floats) — a
//! few times, and the fastest run is its time; results are cached per thread for the
//! process. An op that cannot run on such inputs falls back to the roofline.

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use ppir::interp::{eval_op, InterpOptions};
use ppir::{Function, OpId, Tensor, TensorType};

use super::function::{compute_dtype, op_cost};
use super::profile::{op_time, DeviceProfile};

thread_local! {
    static CACHE: RefCell<HashMap<String, Option<f64>>> = RefCell::new(HashMap::new());
}

fn synthetic(ty: &TensorType) -> Option<Tensor> {
    let shape: Vec<usize> = ty.static_shape()?.iter().map(|&d| d as usize).collect();
    // An op on an 8e12-element tensor is timed by the roofline, not allocated.
    let n = ppir::size::checked_num_elements(&shape)?;
    ppir::size::check_memory((n as u64).saturating_mul(8), String::new).ok()?;
    Some(if ty.dtype.is_float() {
        Tensor::from_f64(ty.dtype, shape, vec![0.5; n])
    } else {
        Tensor::from_i64(ty.dtype, shape, vec![0; n])
    })
}

/// The fastest of a few interpreter runs of op `op` of `f`, in seconds; `None` if it
/// cannot run on synthetic inputs (or is communication).
pub fn measured_op_time(f: &Function, op: OpId) -> Option<f64> {
    let d = f.op(op);
    if d.kind.has_side_effect() {
        return None;
    }
    let operand_types: Vec<&TensorType> = d.operands().iter().map(|&v| f.ty(v)).collect();
    let result_types: Vec<TensorType> = d.results().iter().map(|&v| f.ty(v).clone()).collect();
    let key = format!("{}{:?}{operand_types:?}{result_types:?}", d.kind, d.attrs);
    if let Some(t) = CACHE.with(|c| c.borrow().get(&key).copied()) {
        return t;
    }
    let inputs: Option<Vec<Tensor>> = operand_types.iter().map(|t| synthetic(t)).collect();
    let t = inputs.and_then(|inputs| {
        let refs: Vec<&Tensor> = inputs.iter().collect();
        let opts = InterpOptions::default();
        let run = || eval_op(d.kind, &d.attrs, &refs, &result_types, &opts).ok();
        // Warm up (and check it runs), then the best of a few runs within ~5 ms.
        run()?;
        let start = Instant::now();
        let mut best = f64::INFINITY;
        let mut runs = 0;
        while runs < 3 || (runs < 20 && start.elapsed() < Duration::from_millis(5)) {
            let t0 = Instant::now();
            std::hint::black_box(run());
            best = best.min(t0.elapsed().as_secs_f64());
            runs += 1;
        }
        Some(best)
    });
    CACHE.with(|c| c.borrow_mut().insert(key, t));
    t
}

/// Seconds op `op` of `f` takes on `profile`: measured with the interpreter when the
/// profile says so (plus its per-op overhead), else the roofline [`op_time`].
pub fn op_time_in(
    f: &Function,
    op: OpId,
    profile: &DeviceProfile,
) -> Result<f64, super::CostError> {
    if profile.measure_ops {
        if let Some(t) = measured_op_time(f, op) {
            return Ok(t + profile.op_overhead);
        }
    }
    let c = op_cost(f, op)?;
    Ok(op_time(&c, compute_dtype(f, op), profile))
}

/// Time every op of `f` as it runs in sequence with the interpreter on synthetic inputs
/// (floats 0.5, integers 0), the median of `runs` passes per op: the op times of a real
/// step, with its data flow and cache behaviour (the median rather than the fastest, so a
/// noisy machine's lucky moments do not make every op look fast). Ops that fail to run
/// (and everything after them that needs their results) are left out.
pub fn measure_function_ops(f: &Function, runs: usize) -> HashMap<OpId, f64> {
    let mut all: HashMap<OpId, Vec<f64>> = HashMap::new();
    let opts = InterpOptions::default();
    for _ in 0..runs.max(1) {
        let mut env: HashMap<ppir::ValueId, Tensor> = HashMap::new();
        for &(v, _) in f.args() {
            if let Some(t) = synthetic(f.ty(v)) {
                env.insert(v, t);
            }
        }
        for &op in f.ops() {
            let d = f.op(op);
            if d.kind.has_side_effect() {
                continue;
            }
            let Some(inputs) = d
                .operands()
                .iter()
                .map(|v| env.get(v))
                .collect::<Option<Vec<&Tensor>>>()
            else {
                continue;
            };
            let types: Vec<TensorType> = d.results().iter().map(|&r| f.ty(r).clone()).collect();
            let t0 = Instant::now();
            let out = eval_op(d.kind, &d.attrs, &inputs, &types, &opts);
            let t = t0.elapsed().as_secs_f64();
            let Ok(out) = out else {
                continue;
            };
            all.entry(op).or_default().push(t);
            for (&r, v) in d.results().iter().zip(out) {
                env.insert(r, v);
            }
        }
    }
    all.into_iter()
        .map(|(op, mut ts)| {
            ts.sort_by(f64::total_cmp);
            (op, ts[ts.len() / 2])
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ppir::{ArgKind, DType, NewOp, OpKind};

    /// Issue 12, item 5: timing an op on an 8e12-element operand aborted allocating its
    /// synthetic input; it now falls back to the roofline (no measurement).
    #[test]
    fn ops_on_tensors_larger_than_memory_are_not_measured() {
        let big = TensorType::of(DType::F32, &[2_000_000, 4_000_000]);
        let mut f = Function::new("main");
        let x = f.add_arg("x", big.clone(), ArgKind::Input);
        let y = f.push(NewOp::new(OpKind::Relu, vec![x], vec![big]));
        f.set_results(vec![y]);
        let op = f.ops()[0];
        if ppir::size::available_memory().is_some() {
            assert_eq!(measured_op_time(&f, op), None);
        }
    }
}
