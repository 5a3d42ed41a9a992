//! Batch rebinding: give a StableHLO module (static shapes, exported at one batch) another
//! batch, when that is safe.
//!
//! `@main` is flattened first (calls inlined, so every op instance has its own types).
//! Then every dimension of every value is a slot in a union-find: an op unifies the slots
//! that must have the same size (an elementwise op its operands' and result's dims, a
//! `dot_general` its batch and free dims with the result's, a `reshape` a dim it keeps
//! whole...) and marks the slots whose size it fixes (a reduction over it, a reshape that
//! merges it with another dim, an `iota` along it, a non-splat constant...). Dim 0 of
//! every data input is the batch. If no slot of the batch's class is fixed, every slot of
//! the class gets the new size, and the attributes that spell that size (a full slice's
//! limit, a slice size, a splat constant's type) with it; otherwise the error names the
//! first op that fixes the batch, with its location.

use std::collections::{BTreeMap, HashMap};

use ppir::Tensor;

use super::lower::{int_list, Func};
use super::parse::{hash_fields, normalize, AVal, Block, Op, TType};
use super::{ErrorKind, Pos, StableHloError};

type R<T> = Result<T, StableHloError>;

/// How deep `func.call`s may nest while flattening.
const MAX_INLINE_DEPTH: usize = 32;

/// Why a slot's size cannot change.
#[derive(Clone)]
struct Fixed {
    pos: Pos,
    op: String,
    why: String,
}

#[derive(Default)]
struct Slots {
    parent: Vec<usize>,
    fixed: BTreeMap<usize, Fixed>,
}

impl Slots {
    fn new_slot(&mut self) -> usize {
        self.parent.push(self.parent.len());
        self.parent.len() - 1
    }
    fn find(&mut self, mut s: usize) -> usize {
        while self.parent[s] != s {
            self.parent[s] = self.parent[self.parent[s]];
            s = self.parent[s];
        }
        s
    }
    fn union(&mut self, a: usize, b: usize) {
        let (ra, rb) = (self.find(a), self.find(b));
        if ra != rb {
            self.parent[ra.max(rb)] = ra.min(rb);
        }
    }
    fn fix(&mut self, s: usize, op: &Op, why: impl Into<String>) {
        self.fixed.entry(s).or_insert_with(|| Fixed {
            pos: op.pos,
            op: op.name.clone(),
            why: why.into(),
        });
    }
}

/// `main` with calls inlined and the batch of its data inputs (dim 0 of the arguments not
/// in `params`) rebound to `batch` rows. `Ok(None)` when the module already has that batch.
pub(super) fn rebind(
    main: &Func,
    funcs: &HashMap<String, Func>,
    params: &BTreeMap<String, Tensor>,
    batch: u64,
) -> R<Option<Func>> {
    let at = |op: &str, msg: String| StableHloError::at(ErrorKind::Unsupported, main.pos, op, msg);
    let is_data = |i: usize| !params.contains_key(&format!("arg{i}"));
    let mut exported: Option<u64> = None;
    for (i, (_, t)) in main.body.args.iter().enumerate() {
        if !is_data(i) {
            continue;
        }
        let Some(&d0) = t.dims.first() else {
            return Err(at(
                "func.func",
                format!("data input arg{i} is a scalar; the batch is dim 0 of every data input"),
            ));
        };
        match exported {
            None => exported = Some(d0),
            Some(b) if b != d0 => {
                return Err(at(
                    "func.func",
                    format!("the data inputs disagree on the batch (dim 0): {b} vs {d0} (arg{i})"),
                ))
            }
            Some(_) => {}
        }
    }
    let Some(exported) = exported else {
        return Err(at(
            "func.func",
            "@main has no data inputs, so it has no batch to rebind".into(),
        ));
    };
    if exported == batch {
        return Ok(None);
    }
    if exported < 2 {
        return Err(at(
            "func.func",
            format!("the module was exported with a batch of {exported} row; ppcc rebinds the batch of modules exported with at least 2 rows (a dim of size 1 is ambiguous)"),
        ));
    }
    if batch == 0 {
        return Err(at("func.func", "the batch must be at least 1 row".into()));
    }

    // Flatten.
    let mut flat = vec![];
    let mut counter = 0usize;
    let mut ret = None;
    flatten(
        &main.body,
        funcs,
        0,
        HashMap::new(),
        None,
        &mut counter,
        &mut flat,
        &mut ret,
    )?;

    // Types of values, and a slot per dim.
    let mut slots = Slots::default();
    let mut vals: HashMap<String, (TType, Vec<usize>)> = HashMap::new();
    let batch_slot = slots.new_slot();
    let mut arg_slots = vec![];
    for (i, (name, t)) in main.body.args.iter().enumerate() {
        let s: Vec<usize> = t.dims.iter().map(|_| slots.new_slot()).collect();
        if is_data(i) {
            slots.union(batch_slot, s[0]);
        } else {
            for &x in &s {
                slots.fixed.entry(x).or_insert_with(|| Fixed {
                    pos: main.pos,
                    op: "func.func".into(),
                    why: format!("parameter arg{i} has a dim that is the batch of the data inputs; parameters do not scale with the batch"),
                });
            }
        }
        arg_slots.push(s.clone());
        vals.insert(name.clone(), (t.clone(), s));
    }
    for op in &flat {
        if op.results.len() != op.result_types.len() && op.name != "func.return" {
            return Err(StableHloError::at(
                ErrorKind::Unsupported,
                op.pos,
                &op.name,
                "the op's result types are not spelled out, so its batch cannot be rebound",
            ));
        }
        let mut xs: Vec<(TType, Vec<usize>)> = vec![];
        for o in &op.operands {
            match vals.get(o) {
                Some(v) => xs.push(v.clone()),
                None => {
                    return Err(StableHloError::at(
                        ErrorKind::Invalid,
                        op.pos,
                        &op.name,
                        format!("unknown value %{o}"),
                    ))
                }
            }
        }
        let rs: Vec<(TType, Vec<usize>)> = op
            .result_types
            .iter()
            .map(|t| (t.clone(), t.dims.iter().map(|_| slots.new_slot()).collect()))
            .collect();
        constrain(&mut slots, op, &xs, &rs)?;
        for (name, r) in op.results.iter().zip(rs) {
            vals.insert(name.clone(), r);
        }
    }

    // The batch's class must be free.
    let root = slots.find(batch_slot);
    let fixed: Vec<(usize, Fixed)> = slots.fixed.iter().map(|(&s, f)| (s, f.clone())).collect();
    for (s, f) in fixed {
        if slots.find(s) == root {
            return Err(StableHloError::at(
                ErrorKind::Unsupported,
                f.pos,
                &f.op,
                format!(
                    "this op fixes the batch ({exported} rows in the export): it {}; so the batch cannot be rebound to {batch} rows",
                    f.why
                ),
            ));
        }
    }

    // Rewrite the types and the attributes that spell the batch.
    let mut is_batch = |s: usize| slots.find(s) == root;
    let new_type = |t: &TType, s: &[usize], is_batch: &mut dyn FnMut(usize) -> bool| TType {
        dims: t
            .dims
            .iter()
            .zip(s)
            .map(|(&d, &x)| if is_batch(x) { batch } else { d })
            .collect(),
        elem: t.elem.clone(),
    };
    let mut vals2: HashMap<String, TType> = HashMap::new();
    for (name, (t, s)) in &vals {
        vals2.insert(name.clone(), new_type(t, s, &mut is_batch));
    }
    let mut body = Block {
        args: vec![],
        ops: vec![],
    };
    for (name, _) in &main.body.args {
        let t = vals2.get(name).cloned().unwrap_or_default();
        body.args.push((name.clone(), t));
    }
    for mut op in flat {
        let operand_slots: Vec<Vec<usize>> = op
            .operands
            .iter()
            .map(|o| vals.get(o).map(|v| v.1.clone()).unwrap_or_default())
            .collect();
        if op.operand_types.len() == op.operands.len() {
            op.operand_types = op
                .operands
                .iter()
                .map(|o| vals2.get(o).cloned().unwrap_or_default())
                .collect();
        }
        if op.result_types.len() == op.results.len() {
            op.result_types = op
                .results
                .iter()
                .map(|r| vals2.get(r).cloned().unwrap_or_default())
                .collect();
        }
        let first_batch: Vec<bool> = operand_slots
            .first()
            .map(|s| s.iter().map(|&x| is_batch(x)).collect())
            .unwrap_or_default();
        let set_at = |v: &mut Vec<i64>, flags: &[bool]| {
            for (x, &b) in v.iter_mut().zip(flags) {
                if b {
                    *x = batch as i64;
                }
            }
        };
        match op.name.as_str() {
            "stablehlo.constant" => {
                if let (Some(t), Some((_, AVal::Dense { ty, .. }))) = (
                    op.result_types.first().cloned(),
                    op.attrs.iter_mut().find(|(k, _)| k == "value"),
                ) {
                    *ty = t;
                }
            }
            "stablehlo.slice" => {
                op.attrs.retain(|(k, _)| k != "slice");
                if let Some(mut v) = op.attr("limit_indices").and_then(int_list) {
                    set_at(&mut v, &first_batch);
                    set_attr(&mut op, "limit_indices", v);
                }
            }
            "stablehlo.dynamic_slice" => {
                if let Some(mut v) = op.attr("slice_sizes").and_then(int_list) {
                    set_at(&mut v, &first_batch);
                    set_attr(&mut op, "slice_sizes", v);
                }
            }
            "stablehlo.gather" => {
                if let Some(mut v) = op.attr("slice_sizes").and_then(int_list) {
                    set_at(&mut v, &first_batch);
                    set_attr(&mut op, "slice_sizes", v);
                }
            }
            _ => {}
        }
        body.ops.push(op);
    }
    if let Some(r) = ret {
        body.ops.push(r);
    }
    let result_types = match body.ops.last() {
        Some(r) if r.name == "func.return" => r
            .operands
            .iter()
            .map(|o| vals2.get(o).cloned().unwrap_or_default())
            .collect(),
        _ => main.result_types.clone(),
    };
    Ok(Some(Func {
        name: main.name.clone(),
        pos: main.pos,
        body,
        result_types,
    }))
}

fn set_attr(op: &mut Op, name: &str, v: Vec<i64>) {
    match op.attrs.iter_mut().find(|(k, _)| k == name) {
        Some(slot) => slot.1 = AVal::Ints(v),
        None => op.attrs.push((name.to_string(), AVal::Ints(v))),
    }
}

/// Append `block`'s ops to `out` with calls inlined. `subst` renames operands (a callee's
/// arguments are the call's operands); with `tag`, the names the block defines get the
/// suffix `@tag` (no SSA name contains `@`), unique per inlined call. The block's return,
/// its operands renamed, goes to `ret`.
#[allow(clippy::too_many_arguments)]
fn flatten(
    block: &Block,
    funcs: &HashMap<String, Func>,
    depth: usize,
    mut subst: HashMap<String, String>,
    tag: Option<usize>,
    counter: &mut usize,
    out: &mut Vec<Op>,
    ret: &mut Option<Op>,
) -> R<()> {
    for op in &block.ops {
        let mut op = op.clone();
        normalize(&mut op);
        for o in op.operands.iter_mut() {
            if let Some(n) = subst.get(o) {
                *o = n.clone();
            }
        }
        if op.name == "func.return" || op.name == "stablehlo.return" {
            *ret = Some(op);
            return Ok(());
        }
        if op.name != "func.call" {
            if let Some(t) = tag {
                for r in op.results.iter_mut() {
                    let new = format!("{r}@{t}");
                    subst.insert(r.clone(), new.clone());
                    *r = new;
                }
            }
            out.push(op);
            continue;
        }
        let err = |kind, msg: String| Err(StableHloError::at(kind, op.pos, &op.name, msg));
        let callee = match op.attr("callee") {
            Some(AVal::Sym(s)) => s.clone(),
            _ => return err(ErrorKind::Invalid, "missing the callee".into()),
        };
        let Some(f) = funcs.get(&callee) else {
            return err(ErrorKind::Invalid, format!("no function @{callee}"));
        };
        if depth >= MAX_INLINE_DEPTH {
            return err(
                ErrorKind::Unsupported,
                format!("calls nest deeper than {MAX_INLINE_DEPTH} (recursion?)"),
            );
        }
        if f.body.args.len() != op.operands.len() {
            return err(
                ErrorKind::Invalid,
                format!(
                    "@{callee} takes {} arguments, the call passes {}",
                    f.body.args.len(),
                    op.operands.len()
                ),
            );
        }
        *counter += 1;
        let inner: HashMap<String, String> = f
            .body
            .args
            .iter()
            .map(|(n, _)| n.clone())
            .zip(op.operands.iter().cloned())
            .collect();
        let mut callee_ret = None;
        flatten(
            &f.body,
            funcs,
            depth + 1,
            inner,
            Some(*counter),
            counter,
            out,
            &mut callee_ret,
        )?;
        let Some(r) = callee_ret else {
            return Err(StableHloError::at(
                ErrorKind::Invalid,
                f.pos,
                "func.func",
                format!("@{callee} does not end with a return"),
            ));
        };
        if r.operands.len() != op.results.len() {
            return err(
                ErrorKind::Invalid,
                format!(
                    "@{callee} returns {} values, the call names {}",
                    r.operands.len(),
                    op.results.len()
                ),
            );
        }
        for (res, v) in op.results.iter().zip(&r.operands) {
            subst.insert(res.clone(), v.clone());
        }
    }
    Err(StableHloError::missing_return())
}

/// Unify `slots` of sizes `a` and `b` when both are that size (a size-1 dim broadcasting
/// to another size is not unified).
fn same(slots: &mut Slots, a: (&TType, &[usize], usize), b: (&TType, &[usize], usize)) {
    if let (Some(&sa), Some(&sb), Some(&da), Some(&db)) = (
        a.1.get(a.2),
        b.1.get(b.2),
        a.0.dims.get(a.2),
        b.0.dims.get(b.2),
    ) {
        if da == db {
            slots.union(sa, sb);
        }
    }
}

fn ints(op: &Op, name: &str) -> Vec<i64> {
    op.attr(name).and_then(int_list).unwrap_or_default()
}

fn usizes(v: &[i64]) -> Vec<usize> {
    v.iter().filter_map(|&x| usize::try_from(x).ok()).collect()
}

/// The constraints of one op: unify the dims that must keep one size, fix the dims whose
/// size the op spells out or mixes.
fn constrain(
    slots: &mut Slots,
    op: &Op,
    xs: &[(TType, Vec<usize>)],
    rs: &[(TType, Vec<usize>)],
) -> R<()> {
    let fix_all = |slots: &mut Slots, why: &str| {
        for (_, s) in xs.iter().chain(rs) {
            for &x in s {
                slots.fix(x, op, why);
            }
        }
    };
    let x0 = xs.first();
    let r0 = rs.first();
    match op.name.as_str() {
        "stablehlo.add"
        | "stablehlo.subtract"
        | "stablehlo.multiply"
        | "stablehlo.divide"
        | "stablehlo.maximum"
        | "stablehlo.minimum"
        | "stablehlo.power"
        | "stablehlo.remainder"
        | "stablehlo.and"
        | "stablehlo.or"
        | "stablehlo.xor"
        | "stablehlo.not"
        | "stablehlo.negate"
        | "stablehlo.exponential"
        | "stablehlo.log"
        | "stablehlo.tanh"
        | "stablehlo.logistic"
        | "stablehlo.sqrt"
        | "stablehlo.rsqrt"
        | "stablehlo.abs"
        | "stablehlo.sign"
        | "stablehlo.floor"
        | "stablehlo.ceil"
        | "stablehlo.sine"
        | "stablehlo.cosine"
        | "chlo.erf"
        | "stablehlo.erf"
        | "chlo.erfc"
        | "stablehlo.select"
        | "stablehlo.clamp"
        | "stablehlo.compare"
        | "stablehlo.convert"
        | "stablehlo.exponential_minus_one"
        | "stablehlo.log_plus_one"
        | "stablehlo.is_finite"
        | "stablehlo.round_nearest_even"
        | "stablehlo.round_nearest_afz" => {
            let Some(r) = r0 else { return Ok(()) };
            for x in xs {
                if x.1.len() == r.1.len() {
                    for d in 0..r.1.len() {
                        same(slots, (&x.0, &x.1, d), (&r.0, &r.1, d));
                    }
                }
            }
        }
        "stablehlo.constant" => {
            let splat = match op.attr("value") {
                Some(AVal::Dense { raw, .. }) => {
                    let t = raw.trim();
                    !(t.starts_with('[') || t.starts_with('"'))
                }
                _ => false,
            };
            if !splat {
                fix_all(slots, "is a constant of that shape (not a splat)");
            }
        }
        "stablehlo.iota" => {
            if let (Some(r), Some(&d)) = (r0, ints(op, "iota_dimension").first()) {
                if let Some(&s) = r.1.get(d as usize) {
                    slots.fix(s, op, "counts along that dim (iota)");
                }
            }
        }
        "stablehlo.broadcast_in_dim" => {
            if let (Some(x), Some(r)) = (x0, r0) {
                for (i, &d) in usizes(&ints(op, "broadcast_dimensions")).iter().enumerate() {
                    same(slots, (&x.0, &x.1, i), (&r.0, &r.1, d));
                }
            }
        }
        "stablehlo.reshape" => {
            if let (Some(x), Some(r)) = (x0, r0) {
                reshape_groups(slots, op, x, r);
            }
        }
        "stablehlo.transpose" => {
            if let (Some(x), Some(r)) = (x0, r0) {
                for (k, &p) in usizes(&ints(op, "permutation")).iter().enumerate() {
                    same(slots, (&x.0, &x.1, p), (&r.0, &r.1, k));
                }
            }
        }
        "stablehlo.slice" => {
            if let (Some(x), Some(r)) = (x0, r0) {
                let (st, li) = (ints(op, "start_indices"), ints(op, "limit_indices"));
                let strides = ints(op, "strides");
                for d in 0..x.1.len() {
                    let full = st.get(d) == Some(&0)
                        && li.get(d).copied() == x.0.dims.get(d).map(|&n| n as i64)
                        && strides.get(d).is_none_or(|&s| s == 1);
                    if full {
                        same(slots, (&x.0, &x.1, d), (&r.0, &r.1, d));
                    } else {
                        slots.fix(x.1[d], op, format!("slices dim {d}"));
                        if let Some(&s) = r.1.get(d) {
                            slots.fix(s, op, format!("slices dim {d}"));
                        }
                    }
                }
            }
        }
        "stablehlo.dynamic_slice" => {
            if let (Some(x), Some(r)) = (x0, r0) {
                let sizes = ints(op, "slice_sizes");
                for d in 0..x.1.len() {
                    if sizes.get(d).copied() == x.0.dims.get(d).map(|&n| n as i64) {
                        same(slots, (&x.0, &x.1, d), (&r.0, &r.1, d));
                    } else {
                        slots.fix(x.1[d], op, format!("slices dim {d}"));
                        if let Some(&s) = r.1.get(d) {
                            slots.fix(s, op, format!("slices dim {d}"));
                        }
                    }
                }
            }
        }
        "stablehlo.dynamic_update_slice" => {
            if let (Some(x), Some(r), Some(u)) = (x0, r0, xs.get(1)) {
                for d in 0..x.1.len() {
                    same(slots, (&x.0, &x.1, d), (&r.0, &r.1, d));
                    if u.0.dims.get(d) == x.0.dims.get(d) {
                        same(slots, (&x.0, &x.1, d), (&u.0, &u.1, d));
                    } else {
                        slots.fix(x.1[d], op, format!("updates part of dim {d}"));
                        if let Some(&s) = u.1.get(d) {
                            slots.fix(s, op, format!("updates part of dim {d}"));
                        }
                    }
                }
            }
        }
        "stablehlo.concatenate" => {
            if let Some(r) = r0 {
                let axis = ints(op, "dimension").first().copied().unwrap_or(0) as usize;
                for x in xs {
                    for d in 0..r.1.len().min(x.1.len()) {
                        if d == axis {
                            slots.fix(x.1[d], op, format!("concatenates along dim {d}"));
                            slots.fix(r.1[d], op, format!("concatenates along dim {d}"));
                        } else {
                            same(slots, (&x.0, &x.1, d), (&r.0, &r.1, d));
                        }
                    }
                }
            }
        }
        "stablehlo.pad" => {
            if let (Some(x), Some(r)) = (x0, r0) {
                let (lo, hi) = (ints(op, "edge_padding_low"), ints(op, "edge_padding_high"));
                let inner = ints(op, "interior_padding");
                for d in 0..x.1.len() {
                    let none = [&lo, &hi, &inner]
                        .iter()
                        .all(|v| v.get(d).is_none_or(|&p| p == 0));
                    if none {
                        same(slots, (&x.0, &x.1, d), (&r.0, &r.1, d));
                    } else {
                        slots.fix(x.1[d], op, format!("pads dim {d}"));
                        if let Some(&s) = r.1.get(d) {
                            slots.fix(s, op, format!("pads dim {d}"));
                        }
                    }
                }
            }
        }
        "stablehlo.dot_general" => {
            if let (Some(a), Some(b), Some(r)) = (x0, xs.get(1), r0) {
                let lb = usizes(&ints(op, "lhs_batching_dimensions"));
                let rb = usizes(&ints(op, "rhs_batching_dimensions"));
                let lc = usizes(&ints(op, "lhs_contracting_dimensions"));
                let rc = usizes(&ints(op, "rhs_contracting_dimensions"));
                let mut k = 0;
                for (&i, &j) in lb.iter().zip(&rb) {
                    same(slots, (&a.0, &a.1, i), (&r.0, &r.1, k));
                    same(slots, (&b.0, &b.1, j), (&r.0, &r.1, k));
                    k += 1;
                }
                for i in (0..a.1.len()).filter(|i| !lb.contains(i) && !lc.contains(i)) {
                    same(slots, (&a.0, &a.1, i), (&r.0, &r.1, k));
                    k += 1;
                }
                for j in (0..b.1.len()).filter(|j| !rb.contains(j) && !rc.contains(j)) {
                    same(slots, (&b.0, &b.1, j), (&r.0, &r.1, k));
                    k += 1;
                }
                for (&i, &j) in lc.iter().zip(&rc) {
                    same(slots, (&a.0, &a.1, i), (&b.0, &b.1, j));
                    if let Some(&s) = a.1.get(i) {
                        slots.fix(s, op, format!("contracts (sums over) lhs dim {i}"));
                    }
                }
            }
        }
        "stablehlo.reduce" => {
            let n = xs.len() / 2;
            let dims = usizes(&ints(op, "dimensions"));
            for (i, x) in xs[..n].iter().enumerate() {
                let mut k = 0;
                for d in 0..x.1.len() {
                    if dims.contains(&d) {
                        slots.fix(x.1[d], op, format!("reduces over dim {d}"));
                    } else {
                        if let Some(r) = rs.get(i) {
                            same(slots, (&x.0, &x.1, d), (&r.0, &r.1, k));
                        }
                        k += 1;
                    }
                }
                if let Some(first) = xs.first() {
                    for d in 0..x.1.len().min(first.1.len()) {
                        same(slots, (&x.0, &x.1, d), (&first.0, &first.1, d));
                    }
                }
            }
        }
        "stablehlo.reduce_window" => {
            let n = xs.len() / 2;
            let win = ints(op, "window_dimensions");
            let strides = ints(op, "window_strides");
            let base = ints(op, "base_dilations");
            let wdil = ints(op, "window_dilations");
            let padded: Vec<bool> = match op.attr("padding") {
                Some(AVal::List(rows)) => rows
                    .iter()
                    .map(|r| int_list(r).is_some_and(|p| p.iter().any(|&x| x != 0)))
                    .collect(),
                Some(AVal::Dense { raw, .. }) => {
                    // `dense<0>` pads nothing; anything else is checked per dim below.
                    let zero = raw.trim() == "0";
                    vec![!zero; xs.first().map_or(0, |x| x.1.len())]
                }
                _ => vec![],
            };
            for (i, x) in xs[..n].iter().enumerate() {
                for d in 0..x.1.len() {
                    let one = |v: &Vec<i64>| v.get(d).is_none_or(|&w| w == 1);
                    let plain = win.get(d) == Some(&1)
                        && one(&strides)
                        && one(&base)
                        && one(&wdil)
                        && !padded.get(d).copied().unwrap_or(false);
                    if plain {
                        if let Some(r) = rs.get(i) {
                            same(slots, (&x.0, &x.1, d), (&r.0, &r.1, d));
                        }
                    } else {
                        slots.fix(x.1[d], op, format!("pools over dim {d}"));
                    }
                }
            }
        }
        "stablehlo.convolution" => {
            let layout = match op.attr("dimension_numbers") {
                Some(AVal::Hash { body, .. }) => body.replace(' ', ""),
                _ => String::new(),
            };
            let batch_group = matches!(op.attr("batch_group_count"), Some(AVal::Int(g)) if *g != 1);
            let parts: Vec<&str> = layout
                .split(['x', '-', '>'])
                .filter(|s| !s.is_empty())
                .collect();
            let pos_of = |part: Option<&&str>, c: &str| {
                part.and_then(|p| p.trim_matches(['[', ']']).split(',').position(|t| t == c))
            };
            let lb = pos_of(parts.first(), "b");
            let ob = pos_of(parts.get(2), "b");
            if let (Some(x), Some(r), Some(lb), Some(ob), false) = (x0, r0, lb, ob, batch_group) {
                same(slots, (&x.0, &x.1, lb), (&r.0, &r.1, ob));
                for (d, &s) in x.1.iter().enumerate() {
                    if d != lb {
                        slots.fix(
                            s,
                            op,
                            format!("convolves over dim {d} (feature or spatial)"),
                        );
                    }
                }
                for (d, &s) in r.1.iter().enumerate() {
                    if d != ob {
                        slots.fix(
                            s,
                            op,
                            format!("computes dim {d} (feature or spatial) of its result"),
                        );
                    }
                }
                if let Some(w) = xs.get(1) {
                    for &s in &w.1 {
                        slots.fix(s, op, "has it in the kernel");
                    }
                }
            } else {
                fix_all(slots, "is a convolution whose batch dim ppcc cannot place");
            }
        }
        "stablehlo.gather" => gather(slots, op, xs, rs),
        "func.return" => {}
        _ => fix_all(
            slots,
            "is an op whose treatment of the batch ppcc does not know",
        ),
    }
    Ok(())
}

fn gather(slots: &mut Slots, op: &Op, xs: &[(TType, Vec<usize>)], rs: &[(TType, Vec<usize>)]) {
    let (Some(x), Some(idx), Some(r)) = (xs.first(), xs.get(1), rs.first()) else {
        return;
    };
    let dn = match op.attr("dimension_numbers") {
        Some(AVal::Hash { body, .. }) => hash_fields(body),
        _ => vec![],
    };
    let field = |k: &str| -> Vec<usize> {
        dn.iter()
            .find(|(n, _)| n == k)
            .and_then(|(_, v)| int_list(v))
            .map(|v| usizes(&v))
            .unwrap_or_default()
    };
    let offset = field("offset_dims");
    let collapsed = field("collapsed_slice_dims");
    let obatch = field("operand_batching_dims");
    let ibatch = field("start_indices_batching_dims");
    let ivd = field("index_vector_dim")
        .first()
        .copied()
        .unwrap_or(idx.1.len());
    let sizes = ints(op, "slice_sizes");
    // Result dims not in offset_dims are the indices' dims (but the index vector's).
    let idx_dims: Vec<usize> = (0..idx.1.len()).filter(|&d| d != ivd).collect();
    let res_batch: Vec<usize> = (0..r.1.len()).filter(|d| !offset.contains(d)).collect();
    for (&i, &o) in idx_dims.iter().zip(&res_batch) {
        same(slots, (&idx.0, &idx.1, i), (&r.0, &r.1, o));
    }
    if let Some(&s) = idx.1.get(ivd) {
        slots.fix(s, op, "holds the index vector");
    }
    let kept: Vec<usize> = (0..x.1.len())
        .filter(|d| !collapsed.contains(d) && !obatch.contains(d))
        .collect();
    for (&d, &o) in kept.iter().zip(&offset) {
        if sizes.get(d).copied() == x.0.dims.get(d).map(|&n| n as i64) {
            same(slots, (&x.0, &x.1, d), (&r.0, &r.1, o));
        } else {
            slots.fix(x.1[d], op, format!("gathers slices of dim {d}"));
            if let Some(&s) = r.1.get(o) {
                slots.fix(s, op, format!("gathers slices of operand dim {d}"));
            }
        }
    }
    for &d in &collapsed {
        if let Some(&s) = x.1.get(d) {
            slots.fix(s, op, format!("indexes into operand dim {d}"));
        }
    }
    for (&d, &i) in obatch.iter().zip(&ibatch) {
        same(slots, (&x.0, &x.1, d), (&idx.0, &idx.1, i));
    }
}

/// A reshape keeps a dim when it maps one input dim to one output dim of the same size;
/// the dims of a group that merges or splits (other than size-1 dims) are fixed.
fn reshape_groups(slots: &mut Slots, op: &Op, x: &(TType, Vec<usize>), r: &(TType, Vec<usize>)) {
    let a: Vec<usize> = (0..x.0.dims.len()).filter(|&d| x.0.dims[d] != 1).collect();
    let b: Vec<usize> = (0..r.0.dims.len()).filter(|&d| r.0.dims[d] != 1).collect();
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        let (mut ga, mut gb) = (vec![a[i]], vec![b[j]]);
        let (mut pa, mut pb) = (x.0.dims[a[i]], r.0.dims[b[j]]);
        i += 1;
        j += 1;
        while pa != pb {
            if pa < pb && i < a.len() {
                pa = pa.saturating_mul(x.0.dims[a[i]]);
                ga.push(a[i]);
                i += 1;
            } else if pb < pa && j < b.len() {
                pb = pb.saturating_mul(r.0.dims[b[j]]);
                gb.push(b[j]);
                j += 1;
            } else {
                break;
            }
        }
        if ga.len() == 1 && gb.len() == 1 {
            slots.union(x.1[ga[0]], r.1[gb[0]]);
        } else {
            for &d in &ga {
                slots.fix(
                    x.1[d],
                    op,
                    format!(
                        "merges or splits dim {d} with others (a reshape to {:?})",
                        r.0.dims
                    ),
                );
            }
            for &d in &gb {
                slots.fix(r.1[d], op, "makes this dim from several (a reshape)");
            }
        }
    }
    for &d in &a[i.min(a.len())..] {
        slots.fix(x.1[d], op, format!("reshapes dim {d}"));
    }
    for &d in &b[j.min(b.len())..] {
        slots.fix(r.1[d], op, "reshapes this dim");
    }
}
