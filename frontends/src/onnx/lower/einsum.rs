//! ONNX `Einsum`, lowered to ppir's transpose/reshape/slice/reduce_sum/mul/matmul.
//!
//! Each operand first loses its repeated subscripts (a diagonal: the two axes moved last,
//! flattened, and every (n+1)-th element sliced out) and the subscripts no other operand and
//! not the output carry (`reduce_sum`). Operands then combine left to right: subscripts both
//! carry and something later needs are batch axes, the others they share are contracted by
//! one batched `matmul` (`[batch.., M, K] @ [batch.., K, N]`; a `mul` when nothing is
//! contracted). The result is transposed into the output's order.

use std::collections::HashMap;

use ppir::ops::attrs::{ReduceAttrs, ShapeAttrs, SliceAttrs, TransposeAttrs, UnsqueezeAttrs};
use ppir::ops::OpAttrs;
use ppir::{Attrs, Dim, OpKind};

use super::super::attrs::NodeAttrs;
use super::super::import::{invalid, unsupported, Importer, Val, BATCH_NEEDED, R};
use super::super::proto::NodeProto;
use super::OrInvalid;

/// A subscript: a letter (its code), or one of the dimensions an ellipsis stands for
/// ([`ELLIPSIS`] + its position among the broadcast ellipsis dimensions).
type Label = u32;
const ELLIPSIS: Label = 0x1_0000;

/// A parsed equation: each operand's subscripts (ellipses expanded) and the output's.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Equation {
    pub inputs: Vec<Vec<Label>>,
    pub output: Vec<Label>,
}

/// One term's letters and, when it has an ellipsis, where it is among them.
fn parse_term(term: &str) -> Result<(Vec<Label>, Option<usize>), String> {
    let mut letters = vec![];
    let mut ellipsis = None;
    let mut rest = term;
    while let Some(c) = rest.chars().next() {
        if let Some(r) = rest.strip_prefix("...") {
            if ellipsis.is_some() {
                return Err(format!("term {term:?} has two ellipses"));
            }
            ellipsis = Some(letters.len());
            rest = r;
        } else if c.is_ascii_alphabetic() {
            letters.push(c as Label);
            rest = &rest[1..];
        } else {
            return Err(format!("term {term:?} has {c:?}, not a letter or `...`"));
        }
    }
    Ok((letters, ellipsis))
}

/// Parse `equation` for operands of the given ranks (spaces ignored; implicit output: the
/// ellipsis dimensions, then the letters used once, in ASCII order).
pub(super) fn parse_equation(equation: &str, ranks: &[usize]) -> Result<Equation, String> {
    let eq: String = equation.chars().filter(|&c| c != ' ').collect();
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l, Some(r)),
        None => (eq.as_str(), None),
    };
    if rhs.is_some_and(|r| r.contains("->")) {
        return Err("more than one `->`".into());
    }
    let terms: Vec<&str> = lhs.split(',').collect();
    if terms.len() != ranks.len() {
        return Err(format!("{} terms for {} inputs", terms.len(), ranks.len()));
    }
    let mut parsed = Vec::with_capacity(terms.len());
    let mut ell_rank = 0;
    for (term, &rank) in terms.iter().zip(ranks) {
        let (letters, ell) = parse_term(term)?;
        let k = match ell {
            Some(_) if rank >= letters.len() => rank - letters.len(),
            None if rank == letters.len() => 0,
            _ => {
                return Err(format!(
                    "term {term:?} does not fit an input of rank {rank}"
                ))
            }
        };
        ell_rank = ell_rank.max(k);
        parsed.push((letters, ell, k));
    }
    // An operand's ellipsis dimensions align with the last of the broadcast ones.
    let expand = |letters: &[Label], ell: Option<usize>, k: usize| -> Vec<Label> {
        match ell {
            None => letters.to_vec(),
            Some(at) => {
                let mut v = letters[..at].to_vec();
                v.extend((ell_rank - k..ell_rank).map(|i| ELLIPSIS + i as Label));
                v.extend_from_slice(&letters[at..]);
                v
            }
        }
    };
    let inputs: Vec<Vec<Label>> = parsed.iter().map(|(l, e, k)| expand(l, *e, *k)).collect();
    let output = match rhs {
        Some(r) => {
            let (letters, ell) = parse_term(r)?;
            for (i, l) in letters.iter().enumerate() {
                if letters[..i].contains(l) {
                    return Err(format!("the output repeats {}", label_name(*l)));
                }
                if !inputs.iter().any(|t| t.contains(l)) {
                    return Err(format!(
                        "the output has {}, which no input has",
                        label_name(*l)
                    ));
                }
            }
            expand(&letters, ell, ell_rank)
        }
        None => {
            let mut once: Vec<Label> = inputs
                .iter()
                .flatten()
                .copied()
                .filter(|&l| l < ELLIPSIS)
                .collect();
            once.sort_unstable();
            let counts = |l: Label| once.iter().filter(|&&m| m == l).count();
            let mut out: Vec<Label> = (0..ell_rank).map(|i| ELLIPSIS + i as Label).collect();
            let mut letters: Vec<Label> =
                once.iter().copied().filter(|&l| counts(l) == 1).collect();
            letters.dedup();
            out.extend(letters);
            out
        }
    };
    Ok(Equation { inputs, output })
}

/// A subscript for messages: `'i'`, or `ellipsis dimension 0`.
fn label_name(l: Label) -> String {
    if l >= ELLIPSIS {
        format!("ellipsis dimension {}", l - ELLIPSIS)
    } else {
        format!("{:?}", char::from_u32(l).unwrap_or('?'))
    }
}

/// The reshape spec of a group of dimensions: their product, -1 when one is the batch size.
fn group_size(dims: &[Dim]) -> R<i64> {
    let mut n = 1i64;
    let mut batch = false;
    for d in dims {
        match d {
            Dim::Known(k) => {
                n = n
                    .checked_mul(*k as i64)
                    .ok_or_else(|| super::super::import::Fail::Invalid("a size overflows".into()))?
            }
            Dim::Batch if batch => unsupported!("{}", BATCH_NEEDED),
            Dim::Batch => batch = true,
        }
    }
    Ok(if batch { -1 } else { n })
}

impl Importer<'_> {
    pub(super) fn lower_einsum(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Val> {
        let Some(equation) = a.string("equation").inv()? else {
            invalid!("attribute `equation` is required")
        };
        let xs = (0..node.input.len())
            .map(|i| self.req(node, i))
            .collect::<R<Vec<_>>>()?;
        if xs.is_empty() {
            invalid!("needs at least one input");
        }
        let dims = xs.iter().map(|x| self.dims_of(x)).collect::<R<Vec<_>>>()?;
        let ranks: Vec<usize> = dims.iter().map(Vec::len).collect();
        let eq = match parse_equation(&equation, &ranks) {
            Ok(e) => e,
            Err(e) => invalid!("equation {equation:?}: {e}"),
        };
        // Each subscript's size (a 1 broadcasts against another size).
        let mut sizes: HashMap<Label, Dim> = HashMap::new();
        for (labels, ds) in eq.inputs.iter().zip(&dims) {
            for (&l, &d) in labels.iter().zip(ds) {
                match sizes.get(&l) {
                    None | Some(Dim::Known(1)) => {
                        sizes.insert(l, d);
                    }
                    Some(&s) if s == d || d == Dim::Known(1) => {}
                    Some(&s) => invalid!(
                        "equation {equation:?}: subscript {} is {s} in one place and {d} in another",
                        label_name(l)
                    ),
                }
            }
        }
        let n = xs.len();
        let mut terms: Vec<(Val, Vec<Label>)> = Vec::with_capacity(n);
        for (i, (x, labels)) in xs.into_iter().zip(eq.inputs.iter()).enumerate() {
            let (mut x, mut labels) = self.einsum_diagonals(x, labels.clone(), &equation)?;
            // Subscripts nothing else carries are summed here.
            let elsewhere = |l: &Label| {
                eq.output.contains(l)
                    || eq
                        .inputs
                        .iter()
                        .enumerate()
                        .any(|(j, t)| j != i && t.contains(l))
            };
            let lone: Vec<i64> = (0..labels.len())
                .filter(|&k| !elsewhere(&labels[k]))
                .map(|k| k as i64)
                .collect();
            if !lone.is_empty() {
                x = self.einsum_sum(x, &lone)?;
                labels.retain(|l| elsewhere(l));
            }
            terms.push((x, labels));
        }
        let mut it = terms.into_iter();
        let Some((mut acc, mut acc_labels)) = it.next() else {
            invalid!("needs at least one input")
        };
        let rest: Vec<(Val, Vec<Label>)> = it.collect();
        for (k, (b, b_labels)) in rest.iter().enumerate() {
            let mut keep: Vec<Label> = eq.output.clone();
            for (_, later) in &rest[k + 1..] {
                keep.extend(later);
            }
            (acc, acc_labels) =
                self.einsum_pair(acc, &acc_labels, b.clone(), b_labels, &keep, &sizes)?;
        }
        // Anything left that the output lacks is summed (a broadcast ellipsis of size 1).
        let extra: Vec<i64> = (0..acc_labels.len())
            .filter(|&k| !eq.output.contains(&acc_labels[k]))
            .map(|k| k as i64)
            .collect();
        if !extra.is_empty() {
            acc = self.einsum_sum(acc, &extra)?;
            acc_labels.retain(|l| eq.output.contains(l));
        }
        let perm: Vec<usize> = eq
            .output
            .iter()
            .map(|l| acc_labels.iter().position(|m| m == l))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                super::super::import::Fail::Invalid(format!(
                    "equation {equation:?}: internal error, an output subscript was lost"
                ))
            })?;
        self.permute(acc, &perm)
    }

    fn einsum_sum(&mut self, x: Val, axes: &[i64]) -> R<Val> {
        let attrs = ReduceAttrs {
            axes: axes.to_vec(),
            keepdims: false,
        };
        self.op(OpKind::ReduceSum, attrs.to_attrs(), &[x])
    }

    /// Transpose by `perm` (nothing when it is the identity).
    fn permute(&mut self, x: Val, perm: &[usize]) -> R<Val> {
        if perm.iter().enumerate().all(|(i, &p)| i == p) {
            return Ok(x);
        }
        let attrs = TransposeAttrs {
            perm: Some(perm.iter().map(|&p| p as i64).collect()),
        };
        self.op(OpKind::Transpose, attrs.to_attrs(), &[x])
    }

    /// Reshape into groups of the current dimensions (nothing when that changes nothing).
    fn regroup(&mut self, x: Val, groups: &[&[Dim]]) -> R<Val> {
        let dims = self.dims_of(&x)?;
        let shape = groups
            .iter()
            .map(|g| group_size(g))
            .collect::<R<Vec<_>>>()?;
        if shape.iter().filter(|&&s| s == -1).count() > 1 {
            unsupported!("{}", BATCH_NEEDED);
        }
        if dims.len() == groups.len() && groups.iter().all(|g| g.len() == 1) {
            return Ok(x);
        }
        self.op(OpKind::Reshape, ShapeAttrs { shape }.to_attrs(), &[x])
    }

    /// Take diagonals until no subscript repeats.
    fn einsum_diagonals(
        &mut self,
        mut x: Val,
        mut labels: Vec<Label>,
        equation: &str,
    ) -> R<(Val, Vec<Label>)> {
        while let Some((i, j)) = (0..labels.len()).find_map(|i| {
            (i + 1..labels.len())
                .find(|&j| labels[j] == labels[i])
                .map(|j| (i, j))
        }) {
            let dims = self.dims_of(&x)?;
            let (Dim::Known(ni), Dim::Known(nj)) = (dims[i], dims[j]) else {
                unsupported!(
                    "equation {equation:?}: the diagonal over {} needs a static size",
                    label_name(labels[i])
                )
            };
            if ni != nj {
                invalid!(
                    "equation {equation:?}: the diagonal over {} joins sizes {ni} and {nj}",
                    label_name(labels[i])
                );
            }
            let mut perm: Vec<usize> = (0..dims.len()).filter(|&k| k != i && k != j).collect();
            perm.extend([i, j]);
            let t = self.permute(x, &perm)?;
            let others: Vec<Dim> = perm[..perm.len() - 2].iter().map(|&k| dims[k]).collect();
            let square = [Dim::Known(ni), Dim::Known(ni)];
            let mut groups: Vec<&[Dim]> = others.chunks(1).collect();
            groups.push(&square);
            let flat = self.regroup(t, &groups)?;
            let n = ni as i64;
            let attrs = SliceAttrs {
                starts: vec![0],
                ends: vec![n * n],
                axes: Some(vec![-1]),
                steps: Some(vec![n + 1]),
            };
            x = self.op(OpKind::Slice, attrs.to_attrs(), &[flat])?;
            let l = labels[i];
            labels = perm[..perm.len() - 2].iter().map(|&k| labels[k]).collect();
            labels.push(l);
        }
        Ok((x, labels))
    }

    /// Broadcast size-1 axes of `x` to the sizes in `sizes` for the subscripts in `which`.
    fn einsum_broadcast(
        &mut self,
        x: Val,
        labels: &[Label],
        which: &[Label],
        sizes: &HashMap<Label, Dim>,
    ) -> R<Val> {
        let dims = self.dims_of(&x)?;
        let mut shape = vec![1i64; dims.len()];
        let mut any = false;
        for (k, l) in labels.iter().enumerate() {
            if let (Dim::Known(1), Some(Dim::Known(n))) = (dims[k], sizes.get(l)) {
                if *n != 1 && which.contains(l) {
                    shape[k] = *n as i64;
                    any = true;
                }
            }
        }
        if !any {
            return Ok(x);
        }
        self.op(OpKind::Expand, ShapeAttrs { shape }.to_attrs(), &[x])
    }

    /// Combine two operands; `keep`: the subscripts needed after this step.
    fn einsum_pair(
        &mut self,
        a: Val,
        la: &[Label],
        b: Val,
        lb: &[Label],
        keep: &[Label],
        sizes: &HashMap<Label, Dim>,
    ) -> R<(Val, Vec<Label>)> {
        let batch: Vec<Label> = la
            .iter()
            .copied()
            .filter(|l| lb.contains(l) && keep.contains(l))
            .collect();
        let contracted: Vec<Label> = la
            .iter()
            .copied()
            .filter(|l| lb.contains(l) && !keep.contains(l))
            .collect();
        let a_only: Vec<Label> = la.iter().copied().filter(|l| !lb.contains(l)).collect();
        let b_only: Vec<Label> = lb.iter().copied().filter(|l| !la.contains(l)).collect();
        let shared: Vec<Label> = batch.iter().chain(&contracted).copied().collect();
        let a = self.einsum_broadcast(a, la, &shared, sizes)?;
        let b = self.einsum_broadcast(b, lb, &shared, sizes)?;
        let pos = |ls: &[Label], l: &Label| ls.iter().position(|m| m == l).unwrap_or(0);
        let order = |ls: &[Label], groups: &[&[Label]]| -> Vec<usize> {
            groups
                .iter()
                .flat_map(|g| g.iter().map(|l| pos(ls, l)))
                .collect()
        };
        let mut out_labels = batch.clone();
        out_labels.extend(&a_only);
        out_labels.extend(&b_only);
        if contracted.is_empty() {
            // No contraction: an elementwise product, broadcast as [batch, a_only, b_only].
            let at = self.permute(a, &order(la, &[&batch, &a_only]))?;
            let bt = self.permute(b, &order(lb, &[&batch, &b_only]))?;
            let at = if b_only.is_empty() {
                at
            } else {
                let from = (batch.len() + a_only.len()) as i64;
                let axes = (from..from + b_only.len() as i64).collect();
                self.op(OpKind::Unsqueeze, UnsqueezeAttrs { axes }.to_attrs(), &[at])?
            };
            let bt = if a_only.is_empty() {
                bt
            } else {
                let from = batch.len() as i64;
                let axes = (from..from + a_only.len() as i64).collect();
                self.op(OpKind::Unsqueeze, UnsqueezeAttrs { axes }.to_attrs(), &[bt])?
            };
            let y = self.op(OpKind::Mul, Attrs::new(), &[at, bt])?;
            return Ok((y, out_labels));
        }
        let at = self.permute(a, &order(la, &[&batch, &a_only, &contracted]))?;
        let bt = self.permute(b, &order(lb, &[&batch, &contracted, &b_only]))?;
        let (ad, bd) = (self.dims_of(&at)?, self.dims_of(&bt)?);
        let nb = batch.len();
        let (na, nc) = (a_only.len(), contracted.len());
        let mut ga: Vec<&[Dim]> = ad[..nb].chunks(1).collect();
        ga.push(&ad[nb..nb + na]);
        ga.push(&ad[nb + na..]);
        let mut gb: Vec<&[Dim]> = bd[..nb].chunks(1).collect();
        gb.push(&bd[nb..nb + nc]);
        gb.push(&bd[nb + nc..]);
        let am = self.regroup(at, &ga)?;
        let bm = self.regroup(bt, &gb)?;
        let y = self.op(OpKind::MatMul, Attrs::new(), &[am, bm])?;
        let mut out_dims: Vec<Dim> = ad[..nb + na].to_vec();
        out_dims.extend_from_slice(&bd[nb + nc..]);
        let groups: Vec<&[Dim]> = out_dims.chunks(1).collect();
        let y = self.regroup(y, &groups)?;
        Ok((y, out_labels))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(s: &str) -> Vec<Label> {
        s.chars().map(|c| c as Label).collect()
    }

    #[test]
    fn equations_parse() {
        let e = parse_equation("bij, bjk -> bik", &[3, 3]).unwrap();
        assert_eq!(e.inputs, vec![l("bij"), l("bjk")]);
        assert_eq!(e.output, l("bik"));
        // Implicit output: letters used once, in ASCII order (upper case first).
        let e = parse_equation("ba,aC", &[2, 2]).unwrap();
        assert_eq!(e.output, l("Cb"));
        let e = parse_equation("i,i", &[1, 1]).unwrap();
        assert_eq!(e.output, vec![]);
        // Ellipses align right and lead an implicit output.
        let e = parse_equation("...ii,...i", &[4, 2]).unwrap();
        let (e0, e1) = (ELLIPSIS, ELLIPSIS + 1);
        assert_eq!(e.inputs[0], vec![e0, e1, 'i' as Label, 'i' as Label]);
        assert_eq!(e.inputs[1], vec![e1, 'i' as Label]);
        assert_eq!(e.output, vec![e0, e1]);
        let e = parse_equation("->", &[0]).unwrap();
        assert_eq!(e.output, vec![]);
        for (bad, ranks) in [
            ("ij", &[3][..]),
            ("ij,jk", &[2][..]),
            ("ij->ik", &[2][..]),
            ("i.j", &[2][..]),
            ("ij->ii", &[2][..]),
            ("......", &[2][..]),
        ] {
            assert!(parse_equation(bad, ranks).is_err(), "{bad}");
        }
    }
}
