//! ONNX control flow (`If`, `Loop`, `Scan`), unrolled at import time: ppcc compiles static
//! graphs, so a subgraph is lowered once per iteration into the enclosing function (its
//! body sees the names of the enclosing scopes), and the result is plain data flow that
//! autodiff differentiates like any other.
//!
//! - `If` with a condition known at import time lowers the chosen branch only; with a
//!   run-time condition both branches are lowered and each output pair is selected with
//!   `where` (the two branches must then agree on each output's type).
//! - `Loop` needs its trip count and condition known at import time (the condition the
//!   body computes included); its scan outputs are stacked along a new first axis.
//! - `Scan` (opset 8's batched form and opset 9's) runs over the static length of its scan
//!   inputs, reading and writing slices along `scan_input_axes`/`scan_output_axes` in
//!   the given directions.

use ppir::ops::attrs::{ConcatAttrs, ShapeAttrs, SplitAttrs, SqueezeAttrs, UnsqueezeAttrs};
use ppir::ops::OpAttrs;
use ppir::{Attrs, DType, Dim, OpKind, Tensor};

use super::super::attrs::NodeAttrs;
use super::super::import::{invalid, unsupported, Importer, Val, R};
use super::super::proto::{GraphProto, NodeProto};
use super::{norm_axis, OrInvalid, MAX_SEQUENCE};

impl Importer<'_> {
    /// A graph attribute of the node.
    fn subgraph<'n>(&self, a: &NodeAttrs<'n>, name: &str) -> R<&'n GraphProto> {
        match a.graph(name).inv()? {
            Some(g) => Ok(g),
            None => invalid!("attribute `{name}` (a graph) is required"),
        }
    }

    /// `x` with a new axis of size 1 at `axis`.
    pub(super) fn unsqueeze_at(&mut self, x: Val, axis: i64) -> R<Val> {
        let attrs = UnsqueezeAttrs { axes: vec![axis] };
        self.op(OpKind::Unsqueeze, attrs.to_attrs(), &[x])
    }

    /// The per-iteration values `items` stacked along a new axis `axis` (of the result).
    pub(super) fn stack(&mut self, items: Vec<Val>, axis: i64) -> R<Val> {
        let items = items
            .into_iter()
            .map(|v| self.unsqueeze_at(v, axis))
            .collect::<R<Vec<_>>>()?;
        match <[Val; 1]>::try_from(items) {
            Ok([one]) => Ok(one),
            Err(items) => self.op(OpKind::Concat, ConcatAttrs { axis }.to_attrs(), &items),
        }
    }

    /// The slices of `x` along `axis`, each without that axis.
    pub(super) fn unstack(&mut self, x: Val, axis: usize) -> R<Vec<Val>> {
        let dims = self.dims_of(&x)?;
        let n = match dims[axis] {
            Dim::Known(n) => n as usize,
            Dim::Batch => unsupported!(
                "the scanned axis {axis} is the symbolic batch size; fix it with --batch N"
            ),
        };
        let pieces = if n == 1 {
            vec![x]
        } else {
            let attrs = SplitAttrs {
                axis: axis as i64,
                split: vec![1; n],
            };
            self.op_n(OpKind::Split, attrs.to_attrs(), &[x], n)?
        };
        let squeeze = SqueezeAttrs {
            axes: vec![axis as i64],
        };
        pieces
            .into_iter()
            .map(|p| self.op(OpKind::Squeeze, squeeze.to_attrs(), &[p]))
            .collect()
    }

    /// A boolean scalar known at import time: `Some(value)`, or `None` when it is computed
    /// at run time.
    fn static_bool(&self, v: &Val, what: &str) -> R<Option<bool>> {
        let Some(t) = self.static_tensor(v)? else {
            return Ok(None);
        };
        if t.num_elements() != 1 {
            invalid!("{what} must hold one value, it has shape {:?}", t.shape);
        }
        Ok(Some(t.to_f64_vec()[0] != 0.0))
    }

    pub(super) fn lower_if(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Vec<Val>> {
        let then_g = self.subgraph(a, "then_branch")?;
        let else_g = self.subgraph(a, "else_branch")?;
        let cond = self.req(node, 0)?;
        if let Some(c) = self.static_bool(&cond, "the condition")? {
            let outs = self.lower_subgraph(if c { then_g } else { else_g }, &[])?;
            return Ok(outs);
        }
        // A run-time condition: both branches, then `where` per output.
        let ct = self.ty(&cond)?;
        if ct
            .static_shape()
            .is_none_or(|s| s.iter().product::<u64>() != 1)
        {
            invalid!("the condition must hold one value, it is {ct}");
        }
        let cond = if ct.dtype == DType::Bool {
            cond
        } else {
            let zero = self.cst(ct.dtype, 0.0);
            self.binop(OpKind::Equal, cond, zero)
                .and_then(|z| self.un(OpKind::Not, z))?
        };
        let cond = if ct.rank() == 0 {
            cond
        } else {
            let attrs = ShapeAttrs { shape: vec![] };
            self.op(OpKind::Reshape, attrs.to_attrs(), &[cond])?
        };
        let then_outs = self.lower_subgraph(then_g, &[])?;
        let else_outs = self.lower_subgraph(else_g, &[])?;
        if then_outs.len() != else_outs.len() {
            invalid!(
                "the branches give {} and {} outputs",
                then_outs.len(),
                else_outs.len()
            );
        }
        let mut outs = Vec::with_capacity(then_outs.len());
        for (k, (t, e)) in then_outs.into_iter().zip(else_outs).enumerate() {
            if matches!(t, Val::Seq(_)) || matches!(e, Val::Seq(_)) {
                unsupported!(
                    "output {k} is a sequence and the condition is computed at run time (a branch can be chosen at import time only)"
                );
            }
            let (tt, et) = (self.ty(&t)?, self.ty(&e)?);
            if tt != et {
                unsupported!(
                    "the condition is computed at run time and the branches' output {k} differs in type ({tt} and {et}); ppcc selects between the branches, which needs equal types"
                );
            }
            outs.push(self.op(OpKind::Where, Attrs::new(), &[cond.clone(), t, e])?);
        }
        Ok(outs)
    }

    pub(super) fn lower_loop(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Vec<Val>> {
        let body = self.subgraph(a, "body")?;
        let trip = match self.input(node, 0)? {
            None => None,
            Some(m) => match self.static_tensor(&m)? {
                Some(t) if t.num_elements() == 1 => Some(t.to_i64_vec()[0]),
                Some(t) => invalid!(
                    "the trip count must hold one value, it has shape {:?}",
                    t.shape
                ),
                None => {
                    return Err(self.runtime_input_error(
                        node,
                        0,
                        "the trip count (ppcc unrolls loops at import time)",
                    ))
                }
            },
        };
        let mut cond = match self.input(node, 1)? {
            None => true,
            Some(c) => match self.static_bool(&c, "the condition")? {
                Some(c) => c,
                None => {
                    return Err(self.runtime_input_error(
                        node,
                        1,
                        "the loop condition (ppcc unrolls loops at import time)",
                    ))
                }
            },
        };
        let mut carried = (2..node.input.len())
            .map(|i| self.req(node, i))
            .collect::<R<Vec<_>>>()?;
        let n_carried = carried.len();
        if body.input.len() != 2 + n_carried {
            invalid!(
                "the body declares {} inputs; the loop carries {n_carried} values, so it needs {}",
                body.input.len(),
                2 + n_carried
            );
        }
        if body.output.len() < 1 + n_carried {
            invalid!(
                "the body declares {} outputs; it needs at least {} (the condition and the carried values)",
                body.output.len(),
                1 + n_carried
            );
        }
        let n_scan = body.output.len() - 1 - n_carried;
        let limit = match trip {
            Some(m) if m < 0 => 0,
            Some(m) => m as u64,
            None => u64::MAX,
        };
        let mut scans: Vec<Vec<Val>> = vec![vec![]; n_scan];
        let mut i = 0u64;
        while cond && i < limit {
            if i as usize >= MAX_SEQUENCE {
                unsupported!(
                    "the loop runs more than {MAX_SEQUENCE} iterations, too many to unroll at import time"
                );
            }
            let mut inputs = Vec::with_capacity(2 + n_carried);
            inputs.push(Val::konst(Tensor::from_i64(
                DType::I64,
                vec![],
                vec![i as i64],
            )));
            inputs.push(Val::konst(Tensor::from_i64(DType::Bool, vec![], vec![1])));
            inputs.extend(carried.iter().cloned());
            let mut outs = self.lower_subgraph(body, &inputs)?.into_iter();
            let Some(c) = outs.next() else {
                invalid!("the body gives no condition output")
            };
            cond = match self.static_bool(&c, "the body's condition output")? {
                Some(c) => c,
                None => unsupported!(
                    "the body computes the loop condition at run time (iteration {i}); ppcc unrolls loops at import time"
                ),
            };
            carried = outs.by_ref().take(n_carried).collect();
            for (k, v) in outs.enumerate() {
                scans[k].push(v);
            }
            i += 1;
        }
        let mut results = carried;
        for (k, items) in scans.into_iter().enumerate() {
            if items.is_empty() {
                unsupported!(
                    "the loop runs no iteration, so scan output {k} is empty and its element shape unknown"
                );
            }
            if items.iter().any(|v| matches!(v, Val::Seq(_))) {
                unsupported!("scan output {k} is a sequence");
            }
            results.push(self.stack(items, 0)?);
        }
        Ok(results)
    }

    pub(super) fn lower_scan(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Vec<Val>> {
        let body = self.subgraph(a, "body")?;
        let Some(m) = a.int("num_scan_inputs").inv()? else {
            invalid!("attribute `num_scan_inputs` is required")
        };
        if self.opset < 9 {
            return self.lower_scan8(node, a, body, m);
        }
        let inputs = (0..node.input.len())
            .map(|i| self.req(node, i))
            .collect::<R<Vec<_>>>()?;
        if m < 1 || m as usize > inputs.len() {
            invalid!(
                "num_scan_inputs is {m}, the node has {} inputs",
                inputs.len()
            );
        }
        let m = m as usize;
        let n = inputs.len() - m;
        let (states, scan_in) = inputs.split_at(n);
        let k = body
            .output
            .len()
            .checked_sub(n)
            .filter(|_| body.input.len() == n + m);
        let Some(k) = k else {
            invalid!(
                "the body declares {} inputs and {} outputs for {n} state values and {m} scan inputs",
                body.input.len(),
                body.output.len()
            );
        };
        let list = |name: &str, len: usize, default: i64| -> R<Vec<i64>> {
            let v = a.ints(name).inv()?.unwrap_or_else(|| vec![default; len]);
            if v.len() != len {
                invalid!("attribute `{name}` has {} entries, {len} expected", v.len());
            }
            Ok(v)
        };
        let in_dirs = list("scan_input_directions", m, 0)?;
        let out_dirs = list("scan_output_directions", k, 0)?;
        let in_axes = list("scan_input_axes", m, 0)?;
        let out_axes = list("scan_output_axes", k, 0)?;
        // Each scan input as its slices in iteration order.
        let mut slices: Vec<Vec<Val>> = Vec::with_capacity(m);
        let mut steps = None;
        for (j, x) in scan_in.iter().enumerate() {
            let axis = norm_axis(in_axes[j], self.rank_of(x)?)?;
            let mut s = self.unstack(x.clone(), axis)?;
            if in_dirs[j] != 0 {
                s.reverse();
            }
            match steps {
                None => steps = Some(s.len()),
                Some(t) if t != s.len() => invalid!(
                    "scan input {j} has {} steps along axis {axis}, scan input 0 has {t}",
                    s.len()
                ),
                Some(_) => {}
            }
            slices.push(s);
        }
        let steps = steps.unwrap_or(0);
        if steps > MAX_SEQUENCE {
            unsupported!("a scan of {steps} steps is too long to unroll (at most {MAX_SEQUENCE})");
        }
        let (state, outs) = self.run_scan_body(body, states.to_vec(), &slices, steps, k)?;
        let mut results = state;
        for (kk, mut items) in outs.into_iter().enumerate() {
            if items.is_empty() {
                unsupported!("the scan has no steps, so scan output {kk} has an unknown shape");
            }
            if out_dirs[kk] != 0 {
                items.reverse();
            }
            let rank = self.rank_of(&items[0])? + 1;
            let axis = norm_axis(out_axes[kk], rank)? as i64;
            results.push(self.stack(items, axis)?);
        }
        Ok(results)
    }

    /// Run a scan body `steps` times: the state threads through, step `t` reads slice `t`
    /// of each scan input; returns the final state and each scan output's per-step values.
    fn run_scan_body(
        &mut self,
        body: &GraphProto,
        mut state: Vec<Val>,
        slices: &[Vec<Val>],
        steps: usize,
        k: usize,
    ) -> R<(Vec<Val>, Vec<Vec<Val>>)> {
        let n = state.len();
        let mut outs: Vec<Vec<Val>> = vec![Vec::with_capacity(steps); k];
        for t in 0..steps {
            let mut inputs = state.clone();
            inputs.extend(slices.iter().map(|s| s[t].clone()));
            let mut res = self.lower_subgraph(body, &inputs)?.into_iter();
            state = res.by_ref().take(n).collect();
            for (kk, v) in res.enumerate() {
                outs[kk].push(v);
            }
        }
        Ok((state, outs))
    }

    /// Scan-8: every input and output has a batch axis first; the scan axis is 1, the
    /// state values are per batch element, and `directions` reverses scan inputs.
    fn lower_scan8(
        &mut self,
        node: &NodeProto,
        a: &NodeAttrs,
        body: &GraphProto,
        m: i64,
    ) -> R<Vec<Val>> {
        let inputs = (1..node.input.len())
            .map(|i| self.req(node, i))
            .collect::<R<Vec<_>>>()?;
        if m < 1 || m as usize > inputs.len() {
            invalid!(
                "num_scan_inputs is {m}, the node has {} inputs after sequence_lens",
                inputs.len()
            );
        }
        let m = m as usize;
        let n = inputs.len() - m;
        let Some(k) = body
            .output
            .len()
            .checked_sub(n)
            .filter(|_| body.input.len() == n + m)
        else {
            invalid!(
                "the body declares {} inputs and {} outputs for {n} state values and {m} scan inputs",
                body.input.len(),
                body.output.len()
            );
        };
        let dirs = a.ints("directions").inv()?.unwrap_or_else(|| vec![0; m]);
        if dirs.len() != m {
            invalid!(
                "attribute `directions` has {} entries, {m} expected",
                dirs.len()
            );
        }
        let batch = match inputs.first().map(|v| self.dims_of(v)).transpose()? {
            Some(d) if !d.is_empty() => match d[0] {
                Dim::Known(b) => b as usize,
                Dim::Batch => {
                    unsupported!("the batch axis is the symbolic batch size; fix it with --batch N")
                }
            },
            _ => invalid!("the inputs need a batch axis"),
        };
        let mut seq_len = None;
        for x in &inputs[n..] {
            let d = self.dims_of(x)?;
            if d.len() < 2 {
                invalid!("a scan input needs a batch and a sequence axis");
            }
            seq_len = Some(super::attention::known(d[1], "the sequence length")?);
        }
        if let Some(lens) = self.static_input(node, 0, "sequence_lens")? {
            if lens
                .to_i64_vec()
                .iter()
                .any(|&l| Some(l as usize) != seq_len)
            {
                unsupported!(
                    "sequence_lens shorter than the scan inputs' sequence axis (only the full length is supported)"
                );
            }
        }
        // Each input as its per-batch-element slices.
        let per_batch = inputs
            .iter()
            .map(|x| self.unstack(x.clone(), 0))
            .collect::<R<Vec<_>>>()?;
        if per_batch.iter().any(|p| p.len() != batch) {
            invalid!("the inputs disagree on the batch size");
        }
        let mut state_out: Vec<Vec<Val>> = vec![vec![]; n];
        let mut scan_out: Vec<Vec<Val>> = vec![vec![]; k];
        for b in 0..batch {
            let state: Vec<Val> = per_batch[..n].iter().map(|p| p[b].clone()).collect();
            let mut slices = Vec::with_capacity(m);
            for (j, p) in per_batch[n..].iter().enumerate() {
                let mut s = self.unstack(p[b].clone(), 0)?;
                if dirs[j] != 0 {
                    s.reverse();
                }
                slices.push(s);
            }
            let steps = seq_len.unwrap_or(0);
            if steps > MAX_SEQUENCE {
                unsupported!(
                    "a scan of {steps} steps is too long to unroll (at most {MAX_SEQUENCE})"
                );
            }
            let (state, outs) = self.run_scan_body(body, state, &slices, steps, k)?;
            for (i, v) in state.into_iter().enumerate() {
                state_out[i].push(v);
            }
            for (kk, items) in outs.into_iter().enumerate() {
                if items.is_empty() {
                    unsupported!("the scan has no steps, so scan output {kk} has an unknown shape");
                }
                scan_out[kk].push(self.stack(items, 0)?);
            }
        }
        let mut results = Vec::with_capacity(n + k);
        for items in state_out.into_iter().chain(scan_out) {
            results.push(self.stack(items, 0)?);
        }
        Ok(results)
    }
}
