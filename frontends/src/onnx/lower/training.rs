//! The optimizers of ONNX's `ai.onnx.preview.training` domain (`Adagrad`, `Adam`,
//! `Momentum`), each one elementwise update per optimized tensor, decomposed into ppir ops
//! following the operator docs:
//!
//! ```text
//! Adagrad:  r = R / (1 + T·decay_factor);  g = norm_coefficient·X + G
//!           H' = H + g²;  X' = X - r·g / (sqrt(H') + epsilon)
//! Momentum: g = norm_coefficient·X + G;  V' = alpha·V + (T > 0 ? beta : 1)·g
//!           X' = X - R·V' (standard),  X' = X - R·(g + alpha·V') (nesterov)
//! Adam:     g = norm_coefficient·X + G;  V' = alpha·V + (1 - alpha)·g
//!           H' = beta·H + (1 - beta)·g²;  r = T > 0 ? R·sqrt(1 - beta^T) / (1 - alpha^T) : R
//!           X' = (1 - norm_coefficient_post)·(X - r·V' / (sqrt(H') + epsilon))
//! ```
//!
//! The inputs are `R` (learning rate), `T` (update count), then the n tensors of each
//! group (X.., G.., and V.. and/or H..); the outputs are the n new tensors of each group
//! after the first two. `T` may be computed at run time: the `T > 0` choices are `where`s.

use ppir::{Attrs, DType, OpKind};

use super::super::attrs::NodeAttrs;
use super::super::import::{invalid, Importer, Val, R};
use super::super::proto::NodeProto;
use super::OrInvalid;

use OpKind as K;

impl Importer<'_> {
    /// The optimizer node's operands: R and T as float scalars of `dtype` (the optimized
    /// tensors' type), and the `groups` groups of n tensors.
    fn optimizer_inputs(
        &mut self,
        node: &NodeProto,
        groups: usize,
    ) -> R<(Val, Val, Vec<Vec<Val>>, DType)> {
        let total = node.input.len();
        if total < 2 + groups || !(total - 2).is_multiple_of(groups) {
            invalid!(
                "has {total} inputs; it needs R, T and {groups} groups of the same number of tensors"
            );
        }
        let n = (total - 2) / groups;
        let tensors = (2..total)
            .map(|i| self.req(node, i))
            .collect::<R<Vec<_>>>()?;
        let dtype = self.ty(&tensors[0])?.dtype;
        if !dtype.is_float() {
            invalid!("the optimized tensors must be float, not {dtype}");
        }
        for (i, v) in tensors.iter().enumerate() {
            let t = self.ty(v)?;
            if t.dtype != dtype {
                invalid!("input {} is {}, input 2 is {dtype}", i + 2, t.dtype);
            }
        }
        let scalar = |this: &mut Self, i: usize, what: &str| -> R<Val> {
            let v = this.req(node, i)?;
            let t = this.ty(&v)?;
            if t.static_shape()
                .is_none_or(|s| s.iter().product::<u64>() != 1)
            {
                invalid!("{what} (input {i}) must be a scalar, it is {t}");
            }
            let v = this.cast_to(v, dtype)?;
            this.reshape_to(v, &[])
        };
        let r = scalar(self, 0, "the learning rate R")?;
        let t = scalar(self, 1, "the update count T")?;
        let groups = tensors.chunks(n).map(<[Val]>::to_vec).collect();
        Ok((r, t, groups, dtype))
    }

    /// `c·x` (`x` itself when `c` is 1, nothing to add when 0 is handled by the caller).
    fn scaled(&mut self, x: Val, c: f64) -> R<Val> {
        if c == 1.0 {
            return Ok(x);
        }
        self.with_scalar(K::Mul, x, c)
    }

    /// `norm_coefficient·X + G`.
    fn regularized(&mut self, x: &Val, g: Val, norm: f64) -> R<Val> {
        if norm == 0.0 {
            return Ok(g);
        }
        let nx = self.scaled(x.clone(), norm)?;
        self.binop(K::Add, nx, g)
    }

    /// `T > 0` as an i1 scalar.
    fn positive(&mut self, t: &Val, dtype: DType) -> R<Val> {
        let zero = self.cst(dtype, 0.0);
        self.binop(K::Greater, t.clone(), zero)
    }

    pub(super) fn lower_training_op(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Vec<Val>> {
        match node.op_type.as_str() {
            "Adagrad" => self.lower_adagrad(node, a),
            "Momentum" => self.lower_momentum(node, a),
            "Adam" => self.lower_adam(node, a),
            _ => Err(self.unsupported_op(node)),
        }
    }

    fn lower_adagrad(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Vec<Val>> {
        let decay = a.float_or("decay_factor", 0.0).inv()?;
        let epsilon = a.float_or("epsilon", 1e-6).inv()?;
        let norm = a.float_or("norm_coefficient", 0.0).inv()?;
        let (r, t, groups, _) = self.optimizer_inputs(node, 3)?;
        // r = R / (1 + T·decay_factor)
        let td = self.scaled(t, decay)?;
        let denom = self.with_scalar(K::Add, td, 1.0)?;
        let r = self.binop(K::Div, r, denom)?;
        let (mut xs, mut hs) = (vec![], vec![]);
        for ((x, g), h) in groups[0].iter().zip(&groups[1]).zip(&groups[2]) {
            let g = self.regularized(x, g.clone(), norm)?;
            let g2 = self.binop(K::Mul, g.clone(), g.clone())?;
            let h_new = self.binop(K::Add, h.clone(), g2)?;
            let root = self.un(K::Sqrt, h_new.clone())?;
            let adaptive = self.with_scalar(K::Add, root, epsilon)?;
            let step = self.binop(K::Mul, r.clone(), g)?;
            let step = self.binop(K::Div, step, adaptive)?;
            xs.push(self.binop(K::Sub, x.clone(), step)?);
            hs.push(h_new);
        }
        xs.extend(hs);
        Ok(xs)
    }

    fn lower_momentum(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Vec<Val>> {
        let (Some(alpha), Some(beta), Some(norm)) = (
            a.float("alpha").inv()?,
            a.float("beta").inv()?,
            a.float("norm_coefficient").inv()?,
        ) else {
            invalid!("attributes `alpha`, `beta` and `norm_coefficient` are required")
        };
        let Some(mode) = a.string("mode").inv()? else {
            invalid!("attribute `mode` is required")
        };
        let nesterov = match mode.as_str() {
            "standard" => false,
            "nesterov" => true,
            m => invalid!("mode must be \"standard\" or \"nesterov\", not {m:?}"),
        };
        let (r, t, groups, dtype) = self.optimizer_inputs(node, 3)?;
        // The gradient's coefficient is 1 at the first update (T = 0).
        let first = self.positive(&t, dtype)?;
        let (b, one) = (self.cst(dtype, beta), self.cst(dtype, 1.0));
        let beta_t = self.op(K::Where, Attrs::new(), &[first, b, one])?;
        let (mut xs, mut vs) = (vec![], vec![]);
        for ((x, g), v) in groups[0].iter().zip(&groups[1]).zip(&groups[2]) {
            let g = self.regularized(x, g.clone(), norm)?;
            let av = self.scaled(v.clone(), alpha)?;
            let bg = self.binop(K::Mul, beta_t.clone(), g.clone())?;
            let v_new = self.binop(K::Add, av, bg)?;
            let dir = if nesterov {
                let av_new = self.scaled(v_new.clone(), alpha)?;
                self.binop(K::Add, g, av_new)?
            } else {
                v_new.clone()
            };
            let step = self.binop(K::Mul, r.clone(), dir)?;
            xs.push(self.binop(K::Sub, x.clone(), step)?);
            vs.push(v_new);
        }
        xs.extend(vs);
        Ok(xs)
    }

    fn lower_adam(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Vec<Val>> {
        let alpha = a.float_or("alpha", 0.9).inv()?;
        let beta = a.float_or("beta", 0.999).inv()?;
        let epsilon = a.float_or("epsilon", 1e-6).inv()?;
        let norm = a.float_or("norm_coefficient", 0.0).inv()?;
        let norm_post = a.float_or("norm_coefficient_post", 0.0).inv()?;
        let (r, t, groups, dtype) = self.optimizer_inputs(node, 4)?;
        // r·sqrt(1 - beta^T) / (1 - alpha^T) once T > 0 (bias correction), else r.
        let first = self.positive(&t, dtype)?;
        let (ca, cb) = (self.cst(dtype, alpha), self.cst(dtype, beta));
        let at = self.binop(K::Pow, ca, t.clone())?;
        let bt = self.binop(K::Pow, cb, t)?;
        let one = self.cst(dtype, 1.0);
        let one_bt = self.binop(K::Sub, one.clone(), bt)?;
        let root = self.un(K::Sqrt, one_bt)?;
        let one_at = self.binop(K::Sub, one, at)?;
        let corrected = self.binop(K::Mul, r.clone(), root)?;
        let corrected = self.binop(K::Div, corrected, one_at)?;
        let r = self.op(K::Where, Attrs::new(), &[first, corrected, r])?;
        let (mut xs, mut vs, mut hs) = (vec![], vec![], vec![]);
        for (((x, g), v), h) in groups[0]
            .iter()
            .zip(&groups[1])
            .zip(&groups[2])
            .zip(&groups[3])
        {
            let g = self.regularized(x, g.clone(), norm)?;
            let av = self.scaled(v.clone(), alpha)?;
            let ag = self.scaled(g.clone(), 1.0 - alpha)?;
            let v_new = self.binop(K::Add, av, ag)?;
            let bh = self.scaled(h.clone(), beta)?;
            let g2 = self.binop(K::Mul, g.clone(), g)?;
            let bg2 = self.scaled(g2, 1.0 - beta)?;
            let h_new = self.binop(K::Add, bh, bg2)?;
            let root = self.un(K::Sqrt, h_new.clone())?;
            let denom = self.with_scalar(K::Add, root, epsilon)?;
            let ratio = self.binop(K::Div, v_new.clone(), denom)?;
            let step = self.binop(K::Mul, r.clone(), ratio)?;
            let x_new = self.binop(K::Sub, x.clone(), step)?;
            xs.push(self.scaled(x_new, 1.0 - norm_post)?);
            vs.push(v_new);
            hs.push(h_new);
        }
        xs.extend(vs);
        xs.extend(hs);
        Ok(xs)
    }
}
