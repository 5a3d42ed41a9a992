//! Elementwise ONNX ops that ppir has no op for, decomposed into ppir ops (so autodiff, the
//! cost model and both codegen targets need nothing new): `Celu`, `ThresholdedRelu`,
//! `Swish`, `SwiGLU`, `Tan`, `Sinh`, `Cosh`, `Asin`, `Acos`, `Atan`, `Asinh`, `Acosh`,
//! `Atanh`, `IsNaN`, `IsInf`, `Round`.
//!
//! Where a textbook formula loses precision or overflows, the decomposition avoids it:
//! `sinh` uses its Taylor series near 0, `atan` reduces its argument into `|t| ≤ tan(π/16)`
//! before a series, `asinh`/`acosh` never square a large argument. Branches are chosen with
//! `where`, and the branch not taken is kept finite (its operand replaced by a harmless
//! value) so no NaN reaches the gradient.

use ppir::ops::attrs::EluAttrs;
use ppir::ops::OpAttrs;
use ppir::{Attrs, DType, OpKind};

use super::super::attrs::NodeAttrs;
use super::super::import::{invalid, scalar, Fail, Importer, Val, R};
use super::super::proto::NodeProto;
use super::OrInvalid;

use OpKind as K;

impl Importer<'_> {
    /// A scalar constant of element type `dtype`.
    pub(super) fn cst(&self, dtype: DType, v: f64) -> Val {
        Val::konst(scalar(dtype, v))
    }

    pub(super) fn un(&mut self, kind: OpKind, x: Val) -> R<Val> {
        self.op(kind, Attrs::new(), &[x])
    }

    /// `x op c` with `c` a scalar of x's element type.
    pub(super) fn with_scalar(&mut self, kind: OpKind, x: Val, c: f64) -> R<Val> {
        let dt = self.ty(&x)?.dtype;
        let c = self.cst(dt, c);
        self.binop(kind, x, c)
    }

    fn float_input(&self, node: &NodeProto, i: usize) -> R<(Val, DType)> {
        let x = self.req(node, i)?;
        let dt = self.ty(&x)?.dtype;
        if !dt.is_float() {
            invalid!("input {i} must be a float tensor, not {dt}");
        }
        Ok((x, dt))
    }

    /// The ONNX elementwise ops of this module; `None` for any other op type.
    pub(super) fn lower_math(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Option<Val>> {
        let op = node.op_type.as_str();
        let since = match op {
            "Celu" => 12,
            "ThresholdedRelu" => 10,
            "Swish" => 24,
            "SwiGLU" => 28,
            "Tan" | "Asin" | "Acos" | "Atan" => 7,
            "Sinh" | "Cosh" | "Asinh" | "Acosh" | "Atanh" | "IsNaN" => 9,
            "IsInf" => 10,
            "Round" => 11,
            _ => return Ok(None),
        };
        if self.opset < since {
            return Err(self.unsupported_op(node));
        }
        let (x, dt) = self.float_input(node, 0)?;
        // Float attributes are rounded to the input's type first, as the ops' function
        // bodies do (`CastLike`).
        let attr = |name: &str, default: f64| -> R<f64> {
            let v = a.float_or(name, default).inv()?;
            Ok(ppir::Tensor::from_f64(dt, vec![], vec![v]).to_f64_vec()[0])
        };
        let y = match op {
            "Celu" => {
                // max(0, x) + min(0, α(exp(x/α) - 1)) = elu(x/α)·α.
                let alpha = attr("alpha", 1.0)?;
                if alpha == 0.0 {
                    invalid!("attribute `alpha` must not be 0");
                }
                let s = self.with_scalar(K::Div, x, alpha)?;
                let e = self.op(K::Elu, EluAttrs { alpha: 1.0 }.to_attrs(), &[s])?;
                self.with_scalar(K::Mul, e, alpha)?
            }
            "ThresholdedRelu" => {
                let alpha = attr("alpha", 1.0)?;
                let c = self.cst(dt, alpha);
                let keep = self.binop(K::Greater, x.clone(), c)?;
                let zero = self.cst(dt, 0.0);
                self.op(K::Where, Attrs::new(), &[keep, x, zero])?
            }
            "Swish" => {
                let alpha = attr("alpha", 1.0)?;
                self.swish(x, alpha)?
            }
            "SwiGLU" => {
                let alpha = attr("alpha", 1.0)?;
                let b = self.req(node, 1)?;
                let (ta, tb) = (self.ty(&x)?, self.ty(&b)?);
                if ta != tb {
                    invalid!("A and B must have the same type and shape, not {ta} and {tb}");
                }
                let g = self.swish(x, alpha)?;
                self.binop(K::Mul, g, b)?
            }
            "Tan" => {
                let s = self.un(K::Sin, x.clone())?;
                let c = self.un(K::Cos, x)?;
                self.binop(K::Div, s, c)?
            }
            "Sinh" => self.sinh(x)?,
            "Cosh" => {
                // (eˣ + e⁻ˣ)/2 has no cancellation.
                let e = self.un(K::Exp, x.clone())?;
                let nx = self.un(K::Neg, x)?;
                let en = self.un(K::Exp, nx)?;
                let s = self.binop(K::Add, e, en)?;
                self.with_scalar(K::Mul, s, 0.5)?
            }
            "Atan" => self.atan(x)?,
            "Asin" => {
                // atan(x / √((1 - x)(1 + x))); ±1 give ±∞ and so ±π/2.
                let one_m = self.one_minus(x.clone())?;
                let one_p = self.with_scalar(K::Add, x.clone(), 1.0)?;
                let p = self.binop(K::Mul, one_m, one_p)?;
                let r = self.un(K::Sqrt, p)?;
                let t = self.binop(K::Div, x, r)?;
                self.atan(t)?
            }
            "Acos" => {
                // 2·atan(√((1 - x)/(1 + x))): accurate near 1, π at -1.
                let one_m = self.one_minus(x.clone())?;
                let one_p = self.with_scalar(K::Add, x, 1.0)?;
                let q = self.binop(K::Div, one_m, one_p)?;
                let r = self.un(K::Sqrt, q)?;
                let t = self.atan(r)?;
                self.with_scalar(K::Mul, t, 2.0)?
            }
            "Asinh" => {
                // Odd: for t = |x|, ln(t + m·√((t/m)² + (1/m)²)) with m = max(t, 1) so
                // nothing squared overflows; the sign is restored with `where` (not
                // `sign · f(|x|)`, whose gradient at 0 would be 0, not 1).
                let zero = self.cst(dt, 0.0);
                let neg = self.binop(K::Less, x.clone(), zero)?;
                let nx = self.un(K::Neg, x.clone())?;
                let t = self.op(K::Where, Attrs::new(), &[neg.clone(), nx, x])?;
                let one = self.cst(dt, 1.0);
                let m = self.binop(K::Max, t.clone(), one)?;
                let tm = self.binop(K::Div, t.clone(), m.clone())?;
                let tm2 = self.binop(K::Mul, tm.clone(), tm)?;
                let im = self.un(K::Reciprocal, m.clone())?;
                let im2 = self.binop(K::Mul, im.clone(), im)?;
                let s = self.binop(K::Add, tm2, im2)?;
                let r = self.un(K::Sqrt, s)?;
                let h = self.binop(K::Mul, m, r)?;
                let sum = self.binop(K::Add, t, h)?;
                let f = self.un(K::Log, sum)?;
                let nf = self.un(K::Neg, f.clone())?;
                self.op(K::Where, Attrs::new(), &[neg, nf, f])?
            }
            "Acosh" => {
                // ln(x + √(x - 1)·√(x + 1)): no x² to overflow; NaN below 1 as specified.
                let xm = self.with_scalar(K::Sub, x.clone(), 1.0)?;
                let xp = self.with_scalar(K::Add, x.clone(), 1.0)?;
                let a = self.un(K::Sqrt, xm)?;
                let b = self.un(K::Sqrt, xp)?;
                let r = self.binop(K::Mul, a, b)?;
                let s = self.binop(K::Add, x, r)?;
                self.un(K::Log, s)?
            }
            "Atanh" => {
                // ½·ln((1 + x)/(1 - x)).
                let one_p = self.with_scalar(K::Add, x.clone(), 1.0)?;
                let one_m = self.one_minus(x)?;
                let q = self.binop(K::Div, one_p, one_m)?;
                let l = self.un(K::Log, q)?;
                self.with_scalar(K::Mul, l, 0.5)?
            }
            "IsNaN" => {
                let eq = self.binop(K::Equal, x.clone(), x)?;
                self.un(K::Not, eq)?
            }
            "IsInf" => {
                let pos = a.int_or("detect_positive", 1).inv()? != 0;
                let neg = a.int_or("detect_negative", 1).inv()? != 0;
                let mut hits = vec![];
                if pos {
                    let c = self.cst(dt, f64::INFINITY);
                    hits.push(self.binop(K::Equal, x.clone(), c)?);
                }
                if neg {
                    let c = self.cst(dt, f64::NEG_INFINITY);
                    hits.push(self.binop(K::Equal, x.clone(), c)?);
                }
                match (hits.pop(), hits.pop()) {
                    (Some(a), Some(b)) => self.binop(K::Or, a, b)?,
                    (Some(a), None) => a,
                    _ => {
                        // Neither sign detected: all false.
                        let c = self.cst(dt, f64::NAN);
                        self.binop(K::Equal, x, c)?
                    }
                }
            }
            "Round" => self.round_half_even(x, dt)?,
            _ => unreachable!("listed above"),
        };
        Ok(Some(y))
    }

    pub(super) fn unsupported_op(&self, node: &NodeProto) -> Fail {
        Fail::Onnx(super::super::OnnxError::UnsupportedOp {
            node: self.loc.clone(),
            op_type: node.op_type.clone(),
            domain: node.domain.clone(),
            opset: self.opset,
        })
    }

    fn one_minus(&mut self, x: Val) -> R<Val> {
        let dt = self.ty(&x)?.dtype;
        let one = self.cst(dt, 1.0);
        self.binop(K::Sub, one, x)
    }

    /// `x · sigmoid(α·x)`.
    pub(super) fn swish(&mut self, x: Val, alpha: f64) -> R<Val> {
        let ax = if alpha == 1.0 {
            x.clone()
        } else {
            self.with_scalar(K::Mul, x.clone(), alpha)?
        };
        let s = self.un(K::Sigmoid, ax)?;
        self.binop(K::Mul, x, s)
    }

    /// `sinh`: the Taylor series to x¹¹ for |x| < ½ (error < 3e-12 relative), `(eˣ - e⁻ˣ)/2`
    /// elsewhere (no cancellation there).
    fn sinh(&mut self, x: Val) -> R<Val> {
        let dt = self.ty(&x)?.dtype;
        let e = self.un(K::Exp, x.clone())?;
        let nx = self.un(K::Neg, x.clone())?;
        let en = self.un(K::Exp, nx)?;
        let d = self.binop(K::Sub, e, en)?;
        let wide = self.with_scalar(K::Mul, d, 0.5)?;
        // x·(1 + z/3! + z²/5! + ...), z = x², by Horner.
        let z = self.binop(K::Mul, x.clone(), x.clone())?;
        let mut p = self.cst(dt, 1.0 / 39_916_800.0);
        for k in [9u32, 7, 5, 3, 1] {
            let f: f64 = (1..=k).map(f64::from).product();
            let pz = self.binop(K::Mul, p, z.clone())?;
            p = self.with_scalar(K::Add, pz, 1.0 / f)?;
        }
        let series = self.binop(K::Mul, x.clone(), p)?;
        let ax = self.un(K::Abs, x)?;
        let half = self.cst(dt, 0.5);
        let small = self.binop(K::Less, ax, half)?;
        self.op(K::Where, Attrs::new(), &[small, series, wide])
    }

    /// `atan`: for |x| > 1, `sign(x)·π/2 - atan(1/x)`; then two half-angle steps
    /// `t → t / (1 + √(1 + t²))` take |t| ≤ 1 to |t| ≤ tan(π/16) ≈ 0.199, where the series
    /// to t²¹ is exact to 4e-18; the result is 4 times that.
    fn atan(&mut self, x: Val) -> R<Val> {
        let dt = self.ty(&x)?.dtype;
        let ax = self.un(K::Abs, x.clone())?;
        let one = self.cst(dt, 1.0);
        let big = self.binop(K::Greater, ax, one.clone())?;
        // 1/x only where |x| > 1 (elsewhere 1/1), so no 1/0 reaches the gradient.
        let safe = self.op(K::Where, Attrs::new(), &[big.clone(), x.clone(), one])?;
        let inv = self.un(K::Reciprocal, safe)?;
        let mut t = self.op(K::Where, Attrs::new(), &[big.clone(), inv, x.clone()])?;
        for _ in 0..2 {
            let t2 = self.binop(K::Mul, t.clone(), t.clone())?;
            let s = self.with_scalar(K::Add, t2, 1.0)?;
            let r = self.un(K::Sqrt, s)?;
            let d = self.with_scalar(K::Add, r, 1.0)?;
            t = self.binop(K::Div, t, d)?;
        }
        let z = self.binop(K::Mul, t.clone(), t.clone())?;
        // Σ (-1)ᵏ z^k / (2k + 1), k = 0..10, by Horner.
        let coef = |k: i32| (if k % 2 == 0 { 1.0 } else { -1.0 }) / f64::from(2 * k + 1);
        let mut p = self.cst(dt, coef(10));
        for k in (0..10).rev() {
            let pz = self.binop(K::Mul, p, z.clone())?;
            p = self.with_scalar(K::Add, pz, coef(k))?;
        }
        let tp = self.binop(K::Mul, t, p)?;
        let small = self.with_scalar(K::Mul, tp, 4.0)?;
        let sign = self.un(K::Sign, x)?;
        let hp = self.with_scalar(K::Mul, sign, std::f64::consts::FRAC_PI_2)?;
        let large = self.binop(K::Sub, hp, small.clone())?;
        self.op(K::Where, Attrs::new(), &[big, large, small])
    }

    /// Round half to even: `r = floor(x + ½)`, less one where `x + ½` is an odd integer
    /// (a tie rounded up to an odd number). Values of magnitude ≥ 2^(mantissa bits) are
    /// integers already and are kept (adding ½ would round them).
    pub(super) fn round_half_even(&mut self, x: Val, dt: DType) -> R<Val> {
        let limit = match dt {
            DType::F64 => 2f64.powi(52),
            DType::F32 => 2f64.powi(23),
            DType::F16 => 2f64.powi(10),
            _ => 2f64.powi(7),
        };
        let xh = self.with_scalar(K::Add, x.clone(), 0.5)?;
        let r = self.un(K::Floor, xh.clone())?;
        let tie = self.binop(K::Equal, r.clone(), xh)?;
        let m = self.with_scalar(K::Mod, r.clone(), 2.0)?;
        let one = self.cst(dt, 1.0);
        let odd = self.binop(K::Equal, m, one)?;
        let down = self.binop(K::And, tie, odd)?;
        let r1 = self.with_scalar(K::Sub, r.clone(), 1.0)?;
        let rounded = self.op(K::Where, Attrs::new(), &[down, r1, r])?;
        let ax = self.un(K::Abs, x.clone())?;
        let lim = self.cst(dt, limit);
        let whole = self.binop(K::GreaterEqual, ax, lim)?;
        self.op(K::Where, Attrs::new(), &[whole, x, rounded])
    }
}
