//! Memory a function needs beyond its arguments and results.

use crate::module::{Function, ValueDef, ValueId};

/// The most bytes of temporaries live at once when `f` runs in layout order: values its
/// ops make that are not among its results, each live from its op until its last reader,
/// with an op's results counted together with its operands. This is what the reference
/// interpreter measures ([`crate::interp::RunStats`]); native code, which fuses
/// elementwise chains, needs at most this much for the same values.
pub fn peak_temporary_bytes(f: &Function) -> u64 {
    let temp = temporary_sizes(f);
    let mut remaining: Vec<usize> = (0..f.num_values())
        .map(|i| f.users(ValueId(i as u32)).len())
        .collect();
    let (mut live, mut peak) = (0u64, 0u64);
    for &op in f.ops() {
        let d = f.op(op);
        let made: u64 = d.results().iter().map(|&r| temp[r.index()]).sum();
        peak = peak.max(live + made);
        live += d
            .results()
            .iter()
            .filter(|&&r| remaining[r.index()] > 0)
            .map(|&r| temp[r.index()])
            .sum::<u64>();
        for &v in d.operands() {
            let left = &mut remaining[v.index()];
            if *left == 1 {
                live = live.saturating_sub(temp[v.index()]);
            }
            *left = left.saturating_sub(1);
        }
    }
    peak
}

/// Per value of `f` (by index): its size in bytes if it is a temporary (made by an op and
/// not returned), else 0.
pub fn temporary_sizes(f: &Function) -> Vec<u64> {
    let mut sizes: Vec<u64> = (0..f.num_values())
        .map(|i| {
            let v = ValueId(i as u32);
            match f.value(v).def {
                ValueDef::Op(..) => f.ty(v).size_bytes().unwrap_or(0),
                ValueDef::Arg(_) => 0,
            }
        })
        .collect();
    for &r in f.results() {
        sizes[r.index()] = 0;
    }
    sizes
}
