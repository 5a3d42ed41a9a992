//! ONNX ops that move elements along one axis by positions known at import time, per batch
//! item: `TensorScatter` (opset 24: a KV cache written at `write_indices`, `linear` or
//! `circular`) and `ReverseSequence` (the first `sequence_lens[b]` steps reversed). Each
//! batch item is a `slice`, then a `gather` along the axis with constant indices (for
//! `TensorScatter`, from the cache and the update concatenated), and the items are
//! concatenated again. Gradients flow through `gather`.

use ppir::ops::attrs::{ConcatAttrs, GatherAttrs};
use ppir::ops::OpAttrs;
use ppir::{DType, OpKind, Tensor};

use super::super::attrs::NodeAttrs;
use super::super::import::{invalid, Importer, Val, R};
use super::super::proto::NodeProto;
use super::attention::known;
use super::{norm_axis, OrInvalid};

/// The most batch items unrolled at import time.
const MAX_ITEMS: usize = 4096;

impl Importer<'_> {
    /// Item `b` of `x` along `batch_axis` gathered at `idx` along `axis` (of the item).
    fn gather_item(
        &mut self,
        x: Val,
        batch_axis: usize,
        b: usize,
        axis: usize,
        idx: Vec<i64>,
    ) -> R<Val> {
        let item = self.slice_axis(x, batch_axis as i64, b as i64, b as i64 + 1, 1)?;
        let n = idx.len();
        let idx = Val::konst(Tensor::from_i64(DType::I64, vec![n], idx));
        self.op(
            OpKind::Gather,
            GatherAttrs { axis: axis as i64 }.to_attrs(),
            &[item, idx],
        )
    }

    fn concat_items(&mut self, mut items: Vec<Val>, axis: usize) -> R<Val> {
        if items.len() == 1 {
            return Ok(items.remove(0));
        }
        self.op(
            OpKind::Concat,
            ConcatAttrs { axis: axis as i64 }.to_attrs(),
            &items,
        )
    }

    pub(super) fn lower_tensor_scatter(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Val> {
        if self.opset < 24 {
            return Err(self.unsupported_op(node));
        }
        let (past, update) = (self.req(node, 0)?, self.req(node, 1)?);
        let (pt, ut) = (self.ty(&past)?, self.ty(&update)?);
        let rank = pt.rank();
        if rank < 2 || ut.rank() != rank || pt.dtype != ut.dtype {
            invalid!("past_cache and update must have one type and rank ≥ 2, not {pt} and {ut}");
        }
        let axis = norm_axis(a.int_or("axis", -2).inv()?, rank)?;
        if axis == 0 {
            invalid!("axis must not be the batch axis 0");
        }
        let circular = match a.string_or("mode", "linear").inv()?.as_str() {
            "linear" => false,
            "circular" => true,
            m => invalid!("mode must be \"linear\" or \"circular\", not {m:?}"),
        };
        for i in (0..rank).filter(|&i| i != axis) {
            if pt.dims[i] != ut.dims[i] {
                invalid!("past_cache {pt} and update {ut} differ in dimension {i}");
            }
        }
        let batch = known(pt.dims[0], "the batch size")?;
        let cap = known(pt.dims[axis], "the cache length")?;
        let len = known(ut.dims[axis], "the update length")?;
        if len > cap || batch > MAX_ITEMS {
            invalid!("an update of {len} does not fit a cache of {cap} (or the batch of {batch} is too large)");
        }
        let writes = match self.static_ints(node, 2, "write_indices")? {
            Some(w) if w.len() == batch => w,
            Some(w) => invalid!(
                "write_indices has {} entries for a batch of {batch}",
                w.len()
            ),
            None => vec![0; batch],
        };
        let both = self.op(
            OpKind::Concat,
            ConcatAttrs { axis: axis as i64 }.to_attrs(),
            &[past, update],
        )?;
        let mut items = Vec::with_capacity(batch);
        for (b, &w) in writes.iter().enumerate() {
            let mut idx: Vec<i64> = (0..cap as i64).collect();
            for j in 0..len as i64 {
                let mut dest = w + j;
                if circular {
                    dest = dest.rem_euclid(cap as i64);
                }
                if !(0..cap as i64).contains(&dest) {
                    invalid!("write_indices[{b}] = {w} writes past the cache of {cap}");
                }
                idx[dest as usize] = cap as i64 + j;
            }
            items.push(self.gather_item(both.clone(), 0, b, axis, idx)?);
        }
        self.concat_items(items, 0)
    }

    pub(super) fn lower_reverse_sequence(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Val> {
        if self.opset < 10 {
            return Err(self.unsupported_op(node));
        }
        let x = self.req(node, 0)?;
        let xt = self.ty(&x)?;
        let rank = xt.rank();
        if rank < 2 {
            invalid!("the input must have rank at least 2, not {xt}");
        }
        let batch_axis = norm_axis(a.int_or("batch_axis", 1).inv()?, rank)?;
        let time_axis = norm_axis(a.int_or("time_axis", 0).inv()?, rank)?;
        if batch_axis > 1 || time_axis > 1 || batch_axis == time_axis {
            invalid!("batch_axis and time_axis must be 0 and 1 in some order");
        }
        let batch = known(xt.dims[batch_axis], "the batch size")?;
        let steps = known(xt.dims[time_axis], "the sequence length")?;
        if batch > MAX_ITEMS {
            invalid!("a batch of {batch} is too large to unroll");
        }
        let Some(lens) = self.static_ints(node, 1, "sequence_lens")? else {
            invalid!("input 1 (sequence_lens) is missing")
        };
        if lens.len() != batch {
            invalid!(
                "sequence_lens has {} entries for a batch of {batch}",
                lens.len()
            );
        }
        let mut items = Vec::with_capacity(batch);
        for (b, &l) in lens.iter().enumerate() {
            if !(0..=steps as i64).contains(&l) {
                invalid!("sequence_lens[{b}] = {l} is outside 0..={steps}");
            }
            let idx: Vec<i64> = (0..steps as i64)
                .map(|p| if p < l { l - 1 - p } else { p })
                .collect();
            items.push(self.gather_item(x.clone(), batch_axis, b, time_axis, idx)?);
        }
        self.concat_items(items, batch_axis)
    }
}
