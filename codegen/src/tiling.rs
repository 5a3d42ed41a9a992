//! Thread-block tiles chosen per function for the CUDA target's parallel loops.
//!
//! `scf-parallel-loop-tiling` takes one list of tile sizes, applied to a loop's dimensions
//! in order (1 beyond the list), and `gpu-map-parallel-loops` then maps dimension `i` of
//! the tile loop to block `x`/`y`/`z` and of the loop within a tile to thread `x`/`y`/`z`
//! (`i = 0, 1, 2`; further dimensions run sequentially). One list for every loop suits none:
//! a single `1,256` gives 1-D loops one thread per block, and gives 4-D loops (attention's
//! `[batch, heads, query, key]`) a block of 256 threads along `heads`, of which 4 or 8 work.
//!
//! So the list is chosen per function (each op is its own function, and nearly all of
//! them have loops of one shape) from its largest loop, by [`tiles_for`]: the threads go
//! along the last dimension that the mapping can give them (the last, for loops of up to
//! three dimensions, so that neighbouring threads touch neighbouring elements; the third
//! for longer ones), at least a warp and at most 256 threads (64 along `z`, the most CUDA
//! allows there), and within CUDA's grid limits; then `scf-parallel-loop-tiling` runs on
//! that function alone with that list.

use mlir_sys::{
    mlirAttributeIsAInteger, mlirBlockGetNumArguments, mlirIntegerAttrGetValueInt,
    mlirOpResultGetOwner, mlirOperationGetNumOperands,
    mlirOperationGetOperand, mlirOperationGetRegion, mlirParsePassPipeline,
    mlirPassManagerCreateOnOperation, mlirPassManagerDestroy, mlirPassManagerGetAsOpPassManager,
    mlirPassManagerRunOnOp, mlirRegionGetFirstBlock, mlirValueIsAOpResult, MlirContext,
    MlirOperation, MlirStringRef,
};

use crate::library::{attribute, op_name, str_ref, walk};

/// The pass-list name of this step (see [`crate::gpu::gpu_loops_passes`]).
pub const TILE_LOOPS: &str = "ppcc-tile-parallel-loops";

/// The most threads of a block, and along its `z` dimension (CUDA's limit).
const MAX_THREADS: u64 = 256;
const MAX_THREADS_Z: u64 = 64;
/// The fewest threads a tile gets along its thread dimension (a warp).
const MIN_THREADS: u64 = 32;
/// CUDA's largest grid along `y` and `z`.
const MAX_GRID_YZ: u64 = 65535;

/// The tile list of the loops before this step (the fallback when a choice would leave
/// CUDA's grid limits).
pub const LEGACY_TILES: [u64; 2] = [1, 256];

/// The tile sizes for a parallel loop with these trip counts (`None`: not a constant):
/// all 1 but one dimension `d`, tiled by a power of two between [`MIN_THREADS`] and the
/// threads allowed there. `d` is the last dimension for loops of up to three (the
/// third, `z`, by at most 64), the third for longer ones (the mapping runs dimensions past
/// the third sequentially); when that dimension has fewer than a warp's trip count and an
/// earlier one has more, the latest such one. The grid's `y` and `z` (tile loop dimensions
/// 1 and 2) must stay within 65535, else [`LEGACY_TILES`].
pub fn tiles_for(extents: &[Option<u64>]) -> Vec<u64> {
    let r = extents.len();
    if r == 0 {
        return vec![];
    }
    let cap = |d: usize| if d == 2 { MAX_THREADS_Z } else { MAX_THREADS };
    let big = |d: usize| extents[d].is_none_or(|e| e >= MIN_THREADS);
    let natural = (r - 1).min(2);
    let d = if big(natural) {
        natural
    } else {
        (0..natural).rev().find(|&d| big(d)).unwrap_or(natural)
    };
    let tile = match extents[d] {
        Some(e) => e
            .max(1)
            .next_power_of_two()
            .clamp(MIN_THREADS, cap(d)),
        None => cap(d),
    };
    let mut tiles = vec![1; r];
    tiles[d] = tile;
    let grid_ok = (1..r.min(3)).all(|i| match extents[i] {
        Some(e) => e.div_ceil(tiles[i]) <= MAX_GRID_YZ,
        None => false,
    });
    if grid_ok {
        tiles
    } else {
        LEGACY_TILES.to_vec()
    }
}

/// The constant trip counts of a `scf.parallel` (lower bounds and steps are 0 and 1 where
/// the linalg lowering made it; anything else, or a bound that is not an `arith.constant`,
/// gives `None`).
fn extents(op: MlirOperation) -> Vec<Option<u64>> {
    // SAFETY: `op` is a live `scf.parallel`: its operands are the lower bounds, upper bounds
    // and steps (one each per induction variable, the body block's arguments), then its
    // initial values.
    unsafe {
        let body = mlirRegionGetFirstBlock(mlirOperationGetRegion(op, 0));
        let n = mlirBlockGetNumArguments(body) as isize;
        if mlirOperationGetNumOperands(op) < 3 * n {
            return vec![None; n.max(0) as usize];
        }
        let constant = |i: isize| -> Option<i64> {
            let v = mlirOperationGetOperand(op, i);
            if !mlirValueIsAOpResult(v) {
                return None;
            }
            let def = mlirOpResultGetOwner(v);
            if op_name(def) != "arith.constant" {
                return None;
            }
            let a = attribute(def, "value")?;
            mlirAttributeIsAInteger(a).then(|| mlirIntegerAttrGetValueInt(a))
        };
        (0..n)
            .map(|i| match (constant(i), constant(n + i), constant(2 * n + i)) {
                (Some(0), Some(ub), Some(1)) if ub >= 0 => Some(ub as u64),
                _ => None,
            })
            .collect()
    }
}

/// The function's outermost `scf.parallel` loops' trip counts.
fn function_loops(f: MlirOperation) -> Vec<Vec<Option<u64>>> {
    let mut loops = vec![];
    walk(f, &mut |op| {
        if op_name(op) == "scf.parallel" {
            loops.push(op);
        }
    });
    let mut inner = std::collections::HashSet::new();
    for &l in &loops {
        walk(l, &mut |o| {
            if op_name(o) == "scf.parallel" {
                inner.insert(o.ptr as usize);
            }
        });
    }
    loops
        .into_iter()
        .filter(|l| !inner.contains(&(l.ptr as usize)))
        .map(extents)
        .collect()
}

/// Tile every function's parallel loops of `module` with the tiles [`tiles_for`] gives its
/// largest loop. Returns the diagnostic of a failed run.
pub(crate) fn tile_parallel_loops(
    context: MlirContext,
    module: MlirOperation,
) -> Result<(), String> {
    let mut functions = vec![];
    walk(module, &mut |op| {
        if op_name(op) == "func.func" {
            functions.push(op);
        }
    });
    for f in functions {
        let loops = function_loops(f);
        let Some(largest) = loops.iter().max_by_key(|e| {
            e.iter()
                .map(|x| x.unwrap_or(u64::MAX / 1024).max(1) as u128)
                .product::<u128>()
        }) else {
            continue;
        };
        let tiles = tiles_for(largest);
        let list: Vec<String> = tiles.iter().map(u64::to_string).collect();
        let pipeline = format!(
            "func.func(scf-parallel-loop-tiling{{parallel-loop-tile-sizes={} no-min-max-bounds}})",
            list.join(",")
        );
        run_on(context, f, &pipeline)?;
    }
    Ok(())
}

/// Run `pipeline` (anchored on `func.func`) on function `f`.
fn run_on(context: MlirContext, f: MlirOperation, pipeline: &str) -> Result<(), String> {
    let mut error = String::new();
    unsafe extern "C" fn collect(s: MlirStringRef, user: *mut std::ffi::c_void) {
        // SAFETY: `user` is the `String` below; `s` is valid for the call.
        unsafe {
            let out = &mut *(user as *mut String);
            let bytes = std::slice::from_raw_parts(s.data as *const u8, s.length);
            out.push_str(&String::from_utf8_lossy(bytes));
        }
    }
    // SAFETY: a pass manager on `func.func` in `context`, destroyed before returning; `f`
    // is a live `func.func` of that context.
    unsafe {
        let pm = mlirPassManagerCreateOnOperation(context, str_ref("func.func"));
        let opm = mlirPassManagerGetAsOpPassManager(pm);
        let parsed = mlirParsePassPipeline(
            opm,
            str_ref(pipeline),
            Some(collect),
            &mut error as *mut String as *mut std::ffi::c_void,
        );
        let ok = parsed.value != 0 && mlirPassManagerRunOnOp(pm, f).value != 0;
        mlirPassManagerDestroy(pm);
        if ok {
            Ok(())
        } else {
            Err(format!("{pipeline}: {error}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Block and grid of a tiled loop as `gpu-map-parallel-loops` maps it: tile loop
    /// dimensions 0..3 to blocks x, y, z, the loop within a tile to threads x, y, z.
    fn launch(extents: &[u64], tiles: &[u64]) -> ([u64; 3], [u64; 3]) {
        let mut threads = [1u64; 3];
        let mut grid = [1u64; 3];
        for i in 0..extents.len().min(3) {
            let t = tiles.get(i).copied().unwrap_or(1);
            threads[i] = t;
            grid[i] = extents[i].div_ceil(t);
        }
        (threads, grid)
    }

    #[test]
    fn tiles_stay_within_cuda_limits_and_give_every_block_a_warp() {
        let mut seed = 7u64;
        let mut next = |hi: u64| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            1 + (seed >> 33) % hi
        };
        for _ in 0..20000 {
            let r = next(5) as usize;
            let e: Vec<u64> = (0..r)
                .map(|_| match next(4) {
                    1 => next(8),
                    2 => next(300),
                    3 => next(5000),
                    _ => next(200_000),
                })
                .collect();
            let known: Vec<Option<u64>> = e.iter().map(|&x| Some(x)).collect();
            let tiles = tiles_for(&known);
            let (threads, grid) = launch(&e, &tiles);
            assert!(threads.iter().product::<u64>() <= 1024, "{e:?} {tiles:?}");
            assert!(threads[2] <= 64, "{e:?} {tiles:?}");
            if tiles != LEGACY_TILES {
                assert!(grid[1] <= 65535 && grid[2] <= 65535, "{e:?} {tiles:?}");
                assert_eq!(tiles.len(), r);
                let t: u64 = tiles.iter().product();
                assert!((32..=256).contains(&t) && t.is_power_of_two(), "{e:?} {tiles:?}");
            }
        }
    }

    #[test]
    fn threads_go_along_the_last_dimension_the_mapping_reaches() {
        let s = |v: &[u64]| tiles_for(&v.iter().map(|&x| Some(x)).collect::<Vec<_>>());
        assert_eq!(s(&[100_000]), [256]);
        assert_eq!(s(&[5]), [32]);
        assert_eq!(s(&[64, 1000]), [1, 256]);
        assert_eq!(s(&[64, 48]), [1, 64]);
        assert_eq!(s(&[4, 128, 512]), [1, 1, 64]);
        // Attention scores [batch, heads, query, key]: threads along the queries.
        assert_eq!(s(&[2, 4, 128, 128]), [1, 1, 64, 1]);
        // A last dimension shorter than a warp: threads along an earlier one.
        assert_eq!(s(&[4, 512, 3]), [1, 256, 1]);
        assert_eq!(s(&[1000, 4]), [256, 1]);
        // Unknown trip counts count as large; the grid check then falls back.
        assert_eq!(tiles_for(&[None]), [256]);
        assert_eq!(tiles_for(&[Some(4), None]), LEGACY_TILES);
        assert_eq!(s(&[2, 100_000, 64]), LEGACY_TILES);
    }
}
