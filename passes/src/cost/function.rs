//! Costs of whole functions: per op, per training phase, and the bytes of parameters and
//! persistent state.

use ppir::{ArgKind, DType, Function, OpId, Phase};

use super::op::{cost, OpCost, OpCostError};
use super::profile::DeviceProfile;
use super::CostError;

/// One value per training phase, plus one for ops without a phase tag.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PerPhase<T> {
    /// Forward ("F").
    pub fwd: T,
    /// Gradient with respect to activations ("B").
    pub bwd_input: T,
    /// Gradient with respect to parameters ("W").
    pub bwd_weight: T,
    /// Optimizer step.
    pub optim: T,
    /// Ops with no `phase`.
    pub untagged: T,
}

impl<T> PerPhase<T> {
    /// The entry for a phase tag (`None`: untagged).
    pub fn get(&self, phase: Option<Phase>) -> &T {
        match phase {
            Some(Phase::Fwd) => &self.fwd,
            Some(Phase::BwdInput) => &self.bwd_input,
            Some(Phase::BwdWeight) => &self.bwd_weight,
            Some(Phase::Optim) => &self.optim,
            None => &self.untagged,
        }
    }

    pub fn get_mut(&mut self, phase: Option<Phase>) -> &mut T {
        match phase {
            Some(Phase::Fwd) => &mut self.fwd,
            Some(Phase::BwdInput) => &mut self.bwd_input,
            Some(Phase::BwdWeight) => &mut self.bwd_weight,
            Some(Phase::Optim) => &mut self.optim,
            None => &mut self.untagged,
        }
    }

    /// The entries in the order fwd, bwd_input, bwd_weight, optim, untagged.
    pub fn entries(&self) -> [(Option<Phase>, &T); 5] {
        [
            (Some(Phase::Fwd), &self.fwd),
            (Some(Phase::BwdInput), &self.bwd_input),
            (Some(Phase::BwdWeight), &self.bwd_weight),
            (Some(Phase::Optim), &self.optim),
            (None, &self.untagged),
        ]
    }
}

/// Work per phase.
pub type PhaseCosts = PerPhase<OpCost>;

/// Predicted seconds per phase on one device.
pub type PhaseTimes = PerPhase<f64>;

impl PerPhase<OpCost> {
    /// The sum over all phases.
    pub fn total(&self) -> OpCost {
        self.entries().into_iter().map(|(_, c)| *c).sum()
    }
}

impl PerPhase<f64> {
    /// The sum over all phases.
    pub fn total(&self) -> f64 {
        self.entries().into_iter().map(|(_, t)| *t).sum()
    }
}

/// How an op is named in errors: kind, result name and source location.
fn describe(f: &Function, op: OpId) -> String {
    let data = f.op(op);
    let mut s = format!("@{}: \"{}\"", f.name, data.kind);
    if let Some(&r) = data.results().first() {
        s.push_str(&format!(" (%{})", f.value(r).name));
    }
    if let Some(loc) = &data.loc {
        s.push_str(&format!(" at {loc:?}"));
    }
    s
}

/// The cost of op `op` of `f`.
pub fn op_cost(f: &Function, op: OpId) -> Result<OpCost, CostError> {
    let data = f.op(op);
    let xs: Vec<_> = data.operands().iter().map(|&v| f.ty(v)).collect();
    let ys: Vec<_> = data.results().iter().map(|&v| f.ty(v)).collect();
    cost(data.kind, &data.attrs, &xs, &ys).map_err(|source| CostError::Invalid {
        what: describe(f, op),
        source,
    })
}

/// The cost of every live op of `f`, in body order (for partitioners).
pub fn op_costs(f: &Function) -> Result<Vec<(OpId, OpCost)>, CostError> {
    f.ops()
        .iter()
        .map(|&op| Ok((op, op_cost(f, op)?)))
        .collect()
}

/// The work of `f` summed per phase tag.
pub fn function_costs(f: &Function) -> Result<PhaseCosts, CostError> {
    let mut out = PhaseCosts::default();
    for &op in f.ops() {
        *out.get_mut(f.op(op).phase) += op_cost(f, op)?;
    }
    Ok(out)
}

/// The dtype an op computes in: that of its first floating-point operand, else of its
/// first result, else of its first operand (`f32` for an op with neither).
pub fn compute_dtype(f: &Function, op: OpId) -> DType {
    let data = f.op(op);
    let operands = data.operands().iter().map(|&v| f.ty(v).dtype);
    operands
        .clone()
        .find(|d| d.is_float())
        .or_else(|| data.results().first().map(|&v| f.ty(v).dtype))
        .or_else(|| operands.clone().next())
        .unwrap_or(DType::F32)
}

/// Predicted time of `f` per phase on `profile`: the sum of each op's roofline time
/// ([`op_time`], in the op's [`compute_dtype`]); communication ops count only their
/// overhead and memory traffic here, link time is [`super::comm_time`]'s.
pub fn function_times(f: &Function, profile: &DeviceProfile) -> Result<PhaseTimes, CostError> {
    let mut out = PhaseTimes::default();
    for &op in f.ops() {
        *out.get_mut(f.op(op).phase) += super::op_time_in(f, op, profile)?;
    }
    Ok(out)
}

/// The roofline time of every live op of `f` on `profile`, in body order (for
/// partitioners that balance time rather than FLOPs).
pub fn op_times(f: &Function, profile: &DeviceProfile) -> Result<Vec<(OpId, f64)>, CostError> {
    f.ops()
        .iter()
        .map(|&op| Ok((op, super::op_time_in(f, op, profile)?)))
        .collect()
}

fn arg_bytes(f: &Function, kind: ArgKind) -> Result<u64, CostError> {
    let mut total = 0;
    for &(v, k) in f.args() {
        if k != kind {
            continue;
        }
        let ty = f.ty(v);
        total += ty.size_bytes().ok_or_else(|| CostError::Invalid {
            what: format!("@{}: argument %{}", f.name, f.value(v).name),
            source: OpCostError::Symbolic { ty: ty.clone() },
        })?;
    }
    Ok(total)
}

/// Bytes of the trainable weights (`param` arguments) of `f`.
pub fn param_bytes(f: &Function) -> Result<u64, CostError> {
    arg_bytes(f, ArgKind::Param)
}

/// Bytes of the persistent non-trained state (`state` arguments: running statistics,
/// optimizer state) of `f`.
pub fn state_bytes(f: &Function) -> Result<u64, CostError> {
    arg_bytes(f, ArgKind::State)
}
