//! ONNX's loss ops (`SoftmaxCrossEntropyLoss`, `NegativeLogLikelihoodLoss`), decomposed into
//! ppir ops so autodiff, the cost model and codegen need nothing new: the class axis (ONNX's
//! axis 1) moves last, `label_logit` picks each position's score at its label, and class
//! weights, `ignore_index` and the reduction are elementwise ops and sums. The plain mean
//! (no weights, no `log_prob`) is the fused `softmax_cross_entropy`, whose mean over no
//! counted position is 0 where ONNX's reference divides 0 by 0.

use ppir::ops::attrs::{
    CastAttrs, CrossEntropyAttrs, GatherAttrs, LabelLogitAttrs, ReduceAttrs, SoftmaxAttrs,
    TransposeAttrs,
};
use ppir::ops::OpAttrs;
use ppir::{Attrs, Dim, OpKind};

use super::super::attrs::NodeAttrs;
use super::super::import::{invalid, scalar, Importer, Val, R};
use super::super::proto::NodeProto;
use super::OrInvalid;

impl Importer<'_> {
    /// `SoftmaxCrossEntropyLoss` (`softmax` true; results: loss, [log_prob]) and
    /// `NegativeLogLikelihoodLoss` (result: loss). Scores are `[N, C, d..]`, labels
    /// `[N, d..]`, the optional weights `[C]`.
    pub(in crate::onnx) fn lower_loss(
        &mut self,
        node: &NodeProto,
        a: &NodeAttrs,
        softmax: bool,
    ) -> R<Vec<Val>> {
        use OpKind as K;
        let x = self.req(node, 0)?;
        let labels = self.req(node, 1)?;
        let weight = self.input(node, 2)?;
        let reduction = a.string_or("reduction", "mean").inv()?;
        if !matches!(reduction.as_str(), "none" | "sum" | "mean") {
            invalid!("reduction must be \"none\", \"sum\" or \"mean\", got {reduction:?}");
        }
        let ignore = a.int("ignore_index").inv()?;
        let (xt, lt) = (self.ty(&x)?, self.ty(&labels)?);
        if !xt.dtype.is_float() {
            invalid!("the scores must be a float tensor, got {}", xt.dtype);
        }
        let rank = xt.rank();
        if rank < 2 {
            invalid!("the scores must be [N, C, d..] (rank at least 2), got rank {rank}");
        }
        if lt.dtype.is_float() || lt.rank() + 1 != rank {
            invalid!(
                "the labels must be integers of rank {} ([N, d..]), got {lt}",
                rank - 1
            );
        }
        let wants_log_prob = softmax && node.output.get(1).is_some_and(|o| !o.is_empty());
        // The class axis last: [N, d.., C].
        let to_last: Vec<i64> = std::iter::once(0)
            .chain(2..rank as i64)
            .chain(std::iter::once(1))
            .collect();
        let last = if rank == 2 {
            x
        } else {
            let attrs = TransposeAttrs {
                perm: Some(to_last),
            };
            self.op(K::Transpose, attrs.to_attrs(), &[x])?
        };
        if softmax && reduction == "mean" && weight.is_none() && !wants_log_prob {
            // The fused loss (with its own gradient rule): the mean over counted positions.
            let attrs = CrossEntropyAttrs {
                ignore_index: ignore,
            };
            return Ok(vec![self.op(
                K::SoftmaxCrossEntropy,
                attrs.to_attrs(),
                &[last, labels],
            )?]);
        }
        let log_prob = if softmax {
            let attrs = SoftmaxAttrs { axis: -1 }.to_attrs();
            self.op(K::LogSoftmax, attrs, &[last])?
        } else {
            last
        };
        let picked = self.op(
            K::LabelLogit,
            LabelLogitAttrs { offset: 0 }.to_attrs(),
            &[log_prob.clone(), labels.clone()],
        )?;
        let zero = Val::konst(scalar(xt.dtype, 0.0));
        // Positions whose label is `ignore_index` count neither in the sum nor in the mean.
        let valid = match ignore {
            Some(ii) => {
                let ii = Val::konst(scalar(lt.dtype, ii as f64));
                let eq = self.op(K::Equal, Attrs::new(), &[labels.clone(), ii])?;
                Some(self.op(K::Not, Attrs::new(), &[eq])?)
            }
            None => None,
        };
        // Each position's class weight; labels are clamped into the classes as ONNX's
        // reference does (`mode="clip"`), so an ignored label reads some class (masked below).
        let position_weight = match weight {
            Some(w) => {
                let classes = match self.dims_of(&w)?.first() {
                    Some(Dim::Known(c)) if *c > 0 => *c as f64,
                    _ => invalid!("the weights must be [C] with C known and positive"),
                };
                let hi = Val::konst(scalar(lt.dtype, classes - 1.0));
                let lo = Val::konst(scalar(lt.dtype, 0.0));
                let idx = self.op(K::Min, Attrs::new(), &[labels, hi])?;
                let idx = self.op(K::Max, Attrs::new(), &[idx, lo])?;
                let g = GatherAttrs { axis: 0 }.to_attrs();
                Some(self.op(K::Gather, g, &[w, idx])?)
            }
            None => None,
        };
        let mut loss = self.op(K::Neg, Attrs::new(), &[picked])?;
        if let Some(w) = &position_weight {
            loss = self.op(K::Mul, Attrs::new(), &[loss, w.clone()])?;
        }
        if let Some(v) = &valid {
            loss = self.op(K::Where, Attrs::new(), &[v.clone(), loss, zero.clone()])?;
        }
        let all = |keepdims| {
            ReduceAttrs {
                axes: vec![],
                keepdims,
            }
            .to_attrs()
        };
        let loss = match reduction.as_str() {
            "none" => loss,
            "sum" => self.op(K::ReduceSum, all(false), &[loss])?,
            _ => {
                // ONNX: the sum of the losses over the sum of the counted positions' weights.
                let count = match (position_weight, &valid) {
                    (Some(w), Some(v)) => {
                        Some(self.op(K::Where, Attrs::new(), &[v.clone(), w, zero])?)
                    }
                    (Some(w), None) => Some(w),
                    (None, Some(v)) => {
                        let c = CastAttrs { to: xt.dtype }.to_attrs();
                        Some(self.op(K::Cast, c, std::slice::from_ref(v))?)
                    }
                    (None, None) => None,
                };
                match count {
                    Some(c) => {
                        let total = self.op(K::ReduceSum, all(false), &[loss])?;
                        let c = self.op(K::ReduceSum, all(false), &[c])?;
                        self.op(K::Div, Attrs::new(), &[total, c])?
                    }
                    None => self.op(K::ReduceMean, all(false), &[loss])?,
                }
            }
        };
        if !wants_log_prob {
            return Ok(vec![loss]);
        }
        let log_prob = if rank == 2 {
            log_prob
        } else {
            // Back to [N, C, d..].
            let back: Vec<i64> = std::iter::once(0)
                .chain(std::iter::once(rank as i64 - 1))
                .chain(1..rank as i64 - 1)
                .collect();
            let attrs = TransposeAttrs { perm: Some(back) };
            self.op(K::Transpose, attrs.to_attrs(), &[log_prob])?
        };
        Ok(vec![loss, log_prob])
    }
}
