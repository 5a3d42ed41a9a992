//! Thread-block tiles and the mapping of loop dimensions to CUDA's blocks and threads,
//! chosen per function and per loop for the CUDA target's parallel loops.
//!
//! MLIR's own steps suit few loops: `scf-parallel-loop-tiling` takes one list of tile sizes
//! for every loop, applied to a loop's dimensions in order, and `gpu-map-parallel-loops`
//! maps dimension `i` of the tile loop to block `x`/`y`/`z` and of the loop within a tile to
//! thread `x`/`y`/`z` (`i = 0, 1, 2`; further dimensions run sequentially). With one list
//! `1,256`, 1-D loops got one thread per block, neighbouring threads of 3-D loops touched
//! elements a row apart, and 4-D loops (attention's `[batch, heads, query, key]`) got
//! blocks of 256 threads along the heads, of which 4 to 16 worked.
//!
//! Here ([`TILE_LOOPS`]):
//! - every loop is tiled with the sizes [`tiles_for`] gives it: 32 to 256 threads (a power
//!   of two) along the last dimension, or along the latest one of at least a warp's trip
//!   count when the last is shorter. `scf-parallel-loop-tiling` runs once on a function
//!   whose loops all get the same list (nearly every function: one op each), and once per
//!   loop where they differ (a convolution's padding, im2col and product; a
//!   normalisation's row and element loops), the loop moved into a function of its own
//!   for the run ([`tile_alone`]);
//! - every tiled loop is then mapped by [`mapping_for`] (written as the loops' `mapping`
//!   attributes, which `gpu-map-parallel-loops` then leaves alone): the threaded dimension
//!   to thread `x` and block `x`, so that neighbouring threads touch neighbouring elements,
//!   the other dimensions with the most tiles to blocks `y` and `z` while they fit CUDA's
//!   65535, the rest run sequentially inside each block.

use mlir_sys::{
    mlirAttributeIsAInteger, mlirAttributeParseGet, mlirBlockGetFirstOperation,
    mlirBlockGetNumArguments, mlirIntegerAttrGetValueInt, mlirOpResultGetOwner,
    mlirOperationGetNextInBlock, mlirOperationGetNumOperands, mlirOperationGetOperand,
    mlirOperationGetRegion, mlirOperationSetAttributeByName, mlirParsePassPipeline,
    mlirPassManagerCreateOnOperation, mlirPassManagerDestroy, mlirPassManagerGetAsOpPassManager,
    mlirPassManagerRunOnOp, mlirRegionGetFirstBlock, mlirValueIsAOpResult, MlirContext,
    MlirOperation, MlirStringRef,
};
use mlir_sys::{
    mlirBlockArgumentGetOwner, mlirBlockGetArgument, mlirBlockGetParentOperation,
    mlirBlockGetTerminator, mlirBlockInsertOwnedOperationAfter, mlirOperationCreateParse,
    mlirOperationDestroy, mlirOperationEqual, mlirOperationGetBlock,
    mlirOperationGetParentOperation, mlirOperationMoveBefore, mlirOperationSetOperand,
    mlirTypePrint, mlirValueEqual, mlirValueGetType, mlirValueReplaceAllUsesOfWith, MlirType,
    MlirValue,
};

use crate::library::{attribute, op_name, str_ref, walk};

/// The pass-list name of this step (see [`crate::gpu::gpu_loops_passes`]).
pub const TILE_LOOPS: &str = "ppcc-tile-parallel-loops";

/// The most threads of a block (of CUDA's 1024, what the kernels use).
pub const MAX_THREADS: u64 = 256;
/// The fewest threads a tile gets along its thread dimension (a warp).
pub const MIN_THREADS: u64 = 32;
/// CUDA's largest grid along `y` and `z`.
pub const MAX_GRID_YZ: u64 = 65535;

/// The tile sizes for a parallel loop with these trip counts (`None`: not a constant): all
/// 1 but one dimension `d`, tiled by a power of two between [`MIN_THREADS`] and
/// [`MAX_THREADS`] (the trip count rounded up). `d` is the last dimension, or the latest
/// with at least a warp's trip count when the last has fewer (unknown counts as large).
pub fn tiles_for(extents: &[Option<u64>]) -> Vec<u64> {
    let r = extents.len();
    if r == 0 {
        return vec![];
    }
    let big = |d: usize| extents[d].is_none_or(|e| e >= MIN_THREADS);
    let d = (0..r).rev().find(|&d| big(d)).unwrap_or(r - 1);
    let tile = match extents[d] {
        Some(e) => e.max(1).next_power_of_two().clamp(MIN_THREADS, MAX_THREADS),
        None => MAX_THREADS,
    };
    let mut tiles = vec![1; r];
    tiles[d] = tile;
    tiles
}

/// Where a loop dimension runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Processor {
    /// Block or thread `x`, `y`, `z` (0, 1, 2).
    Block(u8),
    Thread(u8),
    Sequential,
}

impl Processor {
    fn name(self) -> String {
        let xyz = |i: u8| ["x", "y", "z"][i as usize % 3];
        match self {
            Processor::Block(i) => format!("block_{}", xyz(i)),
            Processor::Thread(i) => format!("thread_{}", xyz(i)),
            Processor::Sequential => "sequential".to_string(),
        }
    }
}

/// The processors of a tiled loop's dimensions: `tiles` are the trip counts of the tile
/// loop (the blocks; `None`: not a constant) and `within` those of the loop within a tile
/// (the threads). The dimension with the most threads goes to thread `x` and block `x`;
/// the other dimensions with more than one tile, most tiles first, to blocks `y` and `z`
/// while they have at most 65535; every other dimension runs sequentially (inside the
/// kernel). Only one dimension of a tile has more than one thread ([`tiles_for`]); any
/// other goes to thread `y`, `z` or runs sequentially in each thread.
pub fn mapping_for(
    tiles: &[Option<u64>],
    within: &[Option<u64>],
) -> (Vec<Processor>, Vec<Processor>) {
    let r = tiles.len();
    let count = |v: &[Option<u64>], i: usize| v.get(i).copied().flatten().unwrap_or(u64::MAX);
    let mut thread_dims: Vec<usize> = (0..within.len())
        .filter(|&i| count(within, i) > 1)
        .collect();
    thread_dims.sort_by_key(|&i| std::cmp::Reverse(count(within, i)));
    let mut inner = vec![Processor::Sequential; within.len()];
    // At most 1024 threads: x takes the first, y and z others while the product allows.
    let mut threads = 1u64;
    for (slot, &i) in thread_dims.iter().enumerate().take(3) {
        let c = count(within, i);
        if threads.saturating_mul(c) > 1024 || (slot == 2 && c > 64) {
            continue;
        }
        threads *= c;
        inner[i] = Processor::Thread(slot as u8);
    }
    let x = thread_dims.first().copied().filter(|&i| i < r);
    let mut outer = vec![Processor::Sequential; r];
    if let Some(i) = x {
        outer[i] = Processor::Block(0);
    }
    let mut rest: Vec<usize> = (0..r)
        .filter(|&i| Some(i) != x && count(tiles, i) > 1 && count(tiles, i) <= MAX_GRID_YZ)
        .collect();
    rest.sort_by_key(|&i| std::cmp::Reverse(count(tiles, i)));
    let first = if x.is_some() { 1 } else { 0 };
    for (b, i) in (first..3).zip(rest) {
        outer[i] = Processor::Block(b);
    }
    (outer, inner)
}

/// The trip counts of a `scf.parallel`'s dimensions (`None` where a bound or step is not
/// an `arith.constant`).
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
            .map(
                |i| match (constant(i), constant(n + i), constant(2 * n + i)) {
                    (Some(lb), Some(ub), Some(step)) if step > 0 => {
                        Some(((ub - lb).max(0) as u64).div_ceil(step as u64))
                    }
                    _ => None,
                },
            )
            .collect()
    }
}

/// The function's outermost `scf.parallel` loops.
fn outermost_loops(f: MlirOperation) -> Vec<MlirOperation> {
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
        .collect()
}

/// The `scf.parallel` directly in `outer`'s body (the loop within a tile), if any.
fn loop_within(outer: MlirOperation) -> Option<MlirOperation> {
    // SAFETY: walking the live body block of a live `scf.parallel`.
    unsafe {
        let body = mlirRegionGetFirstBlock(mlirOperationGetRegion(outer, 0));
        let mut op = mlirBlockGetFirstOperation(body);
        while !op.ptr.is_null() {
            if op_name(op) == "scf.parallel" {
                return Some(op);
            }
            op = mlirOperationGetNextInBlock(op);
        }
    }
    None
}

/// Set the `mapping` attribute of `op` (a `scf.parallel`) to `procs`.
fn set_mapping(context: MlirContext, op: MlirOperation, procs: &[Processor]) -> Result<(), String> {
    let items: Vec<String> = procs
        .iter()
        .map(|p| {
            format!(
                "#gpu.loop_dim_map<processor = {}, map = (d0) -> (d0), bound = (d0) -> (d0)>",
                p.name()
            )
        })
        .collect();
    let text = format!("[{}]", items.join(", "));
    // SAFETY: parsing an attribute in the live context, set on a live operation.
    unsafe {
        let attr = mlirAttributeParseGet(context, str_ref(&text));
        if attr.ptr.is_null() {
            return Err(format!("cannot parse the loop mapping {text}"));
        }
        mlirOperationSetAttributeByName(op, str_ref("mapping"), attr);
    }
    Ok(())
}

/// The `scf-parallel-loop-tiling` step for these tile sizes, with `sccp` after it when
/// `fold`.
fn tiling_pipeline(tiles: &[u64], fold: bool) -> String {
    let list: Vec<String> = tiles.iter().map(u64::to_string).collect();
    format!(
        "func.func(scf-parallel-loop-tiling{{parallel-loop-tile-sizes={} no-min-max-bounds}}{})",
        list.join(","),
        if fold { ",sccp" } else { "" }
    )
}

/// Tile every parallel loop of `module` with the tiles [`tiles_for`] gives it, and map
/// each tiled loop's dimensions by [`mapping_for`]. Returns the diagnostic of a failed
/// step.
///
/// MLIR's tiling step takes one list of sizes per run and applies it to every loop it
/// reaches. A function whose loops all get the same list (nearly every function: one op
/// each) is tiled in one run; in one whose loops differ (a convolution's padding, im2col
/// and product; a normalisation's row loops beside its element loop) each loop is tiled
/// on its own ([`tile_alone`]). `sccp` then folds the tiled loops' steps and bounds into
/// constants for the mapping.
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
        let loops = outermost_loops(f);
        let tiles: Vec<Vec<u64>> = loops.iter().map(|&l| tiles_for(&extents(l))).collect();
        let Some(first) = tiles.first() else {
            continue;
        };
        if tiles.iter().all(|t| t == first) {
            run_on(context, f, &tiling_pipeline(first, true))?;
        } else {
            for (&l, t) in loops.iter().zip(&tiles) {
                tile_alone(context, f, l, t)?;
            }
            run_on(context, f, "func.func(sccp)")?;
        }
        for outer in outermost_loops(f) {
            let inner = loop_within(outer);
            let within = inner.map(extents).unwrap_or_default();
            let (o, i) = mapping_for(&extents(outer), &within);
            set_mapping(context, outer, &o)?;
            if let Some(inner) = inner {
                set_mapping(context, inner, &i)?;
            }
        }
    }
    Ok(())
}

/// Whether `v` is defined inside `op` (a result of an op nested in it, or an argument of
/// a block of its regions).
fn defined_inside(v: MlirValue, op: MlirOperation) -> bool {
    // SAFETY: `v` is a live value; its owner and that owner's ancestors are live.
    unsafe {
        let mut p = if mlirValueIsAOpResult(v) {
            mlirOperationGetParentOperation(mlirOpResultGetOwner(v))
        } else {
            mlirBlockGetParentOperation(mlirBlockArgumentGetOwner(v))
        };
        while !p.ptr.is_null() {
            if mlirOperationEqual(p, op) {
                return true;
            }
            p = mlirOperationGetParentOperation(p);
        }
        false
    }
}

/// An MLIR string callback that appends to the `String` that `user` points at.
unsafe extern "C" fn collect(s: MlirStringRef, user: *mut std::ffi::c_void) {
    // SAFETY: `user` is a live `String` of the caller; `s` is valid for the call.
    unsafe {
        let out = &mut *(user as *mut String);
        let bytes = std::slice::from_raw_parts(s.data as *const u8, s.length);
        out.push_str(&String::from_utf8_lossy(bytes));
    }
}

/// The textual form of a type.
fn type_text(t: MlirType) -> String {
    let mut out = String::new();
    // SAFETY: printing a live type into the `String`.
    unsafe {
        mlirTypePrint(
            t,
            Some(collect),
            &mut out as *mut String as *mut std::ffi::c_void,
        )
    };
    out
}

/// Tile the loop `l` of function `f` by `tiles` and no other: `l` is moved into a
/// function of its own beside `f` (every value it uses from outside becomes an argument),
/// tiled there, and its ops are moved back to where it stood, their uses of the arguments
/// pointed at the values again.
fn tile_alone(
    context: MlirContext,
    f: MlirOperation,
    l: MlirOperation,
    tiles: &[u64],
) -> Result<(), String> {
    // The values `l` and its nested ops use from outside, and where.
    let mut ops = vec![l];
    walk(l, &mut |o| ops.push(o));
    let mut captured: Vec<MlirValue> = vec![];
    let mut uses: Vec<(MlirOperation, isize, usize)> = vec![];
    for &o in &ops {
        // SAFETY: reading the operands of a live operation.
        let n = unsafe { mlirOperationGetNumOperands(o) };
        for i in 0..n {
            // SAFETY: `i` is below the operand count.
            let v = unsafe { mlirOperationGetOperand(o, i) };
            if defined_inside(v, l) {
                continue;
            }
            // SAFETY: comparing live values.
            let j = match captured
                .iter()
                .position(|&c| unsafe { mlirValueEqual(c, v) })
            {
                Some(j) => j,
                None => {
                    captured.push(v);
                    captured.len() - 1
                }
            };
            uses.push((o, i, j));
        }
    }
    // SAFETY: the types of live values.
    let args: Vec<String> = captured
        .iter()
        .enumerate()
        .map(|(j, &v)| format!("%a{j}: {}", type_text(unsafe { mlirValueGetType(v) })))
        .collect();
    let text = format!(
        "func.func private @__ppcc_tile_one_loop({}) {{\n  func.return\n}}",
        args.join(", ")
    );
    // SAFETY: every call below works on live operations, blocks and values of `context`:
    // the new function is inserted after `f` and destroyed at the end, after `l`'s ops
    // (moved into it) have been moved back before `anchor`, the op that followed `l`.
    unsafe {
        let anchor = mlirOperationGetNextInBlock(l);
        if anchor.ptr.is_null() {
            return Err("a parallel loop that is the last operation of its block".into());
        }
        let tmp = mlirOperationCreateParse(context, str_ref(&text), str_ref("ppcc-tiling"));
        if tmp.ptr.is_null() {
            return Err(format!(
                "cannot build the function to tile one loop in:\n{text}"
            ));
        }
        mlirBlockInsertOwnedOperationAfter(mlirOperationGetBlock(f), f, tmp);
        let body = mlirRegionGetFirstBlock(mlirOperationGetRegion(tmp, 0));
        mlirOperationMoveBefore(l, mlirBlockGetTerminator(body));
        for &(o, i, j) in &uses {
            mlirOperationSetOperand(o, i, mlirBlockGetArgument(body, j as isize));
        }
        let tiled = run_on(context, tmp, &tiling_pipeline(tiles, false));
        // Back where `l` stood, in order, whether or not the tiling succeeded.
        let terminator = mlirBlockGetTerminator(body);
        let mut moved = vec![];
        let mut o = mlirBlockGetFirstOperation(body);
        while !o.ptr.is_null() && !mlirOperationEqual(o, terminator) {
            moved.push(o);
            o = mlirOperationGetNextInBlock(o);
        }
        for o in moved {
            mlirOperationMoveBefore(o, anchor);
        }
        for (j, &v) in captured.iter().enumerate() {
            mlirValueReplaceAllUsesOfWith(mlirBlockGetArgument(body, j as isize), v);
        }
        mlirOperationDestroy(tmp);
        tiled
    }
}

/// Run `pipeline` (anchored on `func.func`) on function `f`.
fn run_on(context: MlirContext, f: MlirOperation, pipeline: &str) -> Result<(), String> {
    let mut error = String::new();
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

    /// Block and grid of a loop of trip counts `extents` tiled by `tiles` and mapped by
    /// [`mapping_for`], and the loops each thread runs sequentially.
    fn launch(extents: &[u64], tiles: &[u64]) -> ([u64; 3], [u64; 3]) {
        let outer: Vec<Option<u64>> = extents
            .iter()
            .zip(tiles)
            .map(|(&e, &t)| Some(e.div_ceil(t)))
            .collect();
        let within: Vec<Option<u64>> = tiles.iter().map(|&t| Some(t)).collect();
        let (o, i) = mapping_for(&outer, &within);
        let mut threads = [1u64; 3];
        let mut grid = [1u64; 3];
        for d in 0..extents.len() {
            if let Processor::Block(b) = o[d] {
                assert_eq!(grid[b as usize], 1, "block {b} used twice: {o:?}");
                grid[b as usize] = outer[d].unwrap();
            }
            if let Processor::Thread(t) = i[d] {
                assert_eq!(threads[t as usize], 1, "thread {t} used twice: {i:?}");
                threads[t as usize] = tiles[d];
            }
        }
        // The threaded dimension is thread x and block x.
        let d = (0..tiles.len()).find(|&d| tiles[d] > 1);
        if let Some(d) = d {
            assert_eq!((o[d], i[d]), (Processor::Block(0), Processor::Thread(0)));
        }
        (threads, grid)
    }

    #[test]
    fn tiles_and_mappings_stay_within_cuda_limits_with_a_warp_or_more_per_block() {
        let mut seed = 7u64;
        let mut next = |hi: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
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
            let tiles = tiles_for(&e.iter().map(|&x| Some(x)).collect::<Vec<_>>());
            assert_eq!(tiles.len(), r);
            let t: u64 = tiles.iter().product();
            assert!(
                (32..=256).contains(&t) && t.is_power_of_two(),
                "{e:?} {tiles:?}"
            );
            let (threads, grid) = launch(&e, &tiles);
            assert_eq!(threads.iter().product::<u64>(), t, "{e:?} {tiles:?}");
            assert!(
                grid[1] <= 65535 && grid[2] <= 65535,
                "{e:?} {tiles:?} {grid:?}"
            );
        }
    }

    /// A function whose loops differ (a 1-D loop inside a sequential loop, and a 2-D
    /// one): each is tiled with its own sizes, the values they use from outside (function
    /// arguments, constants, the sequential loop's index) still reach them, and nothing
    /// else is left in the module.
    #[test]
    fn loops_of_one_function_get_their_own_tiles() {
        use melior::ir::operation::OperationLike;
        use melior::ir::Module;
        let (context, _sink) = crate::compile::new_context();
        let text = r#"
func.func @f(%a: memref<64x100xf32>, %b: memref<64xindex>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c10 = arith.constant 10 : index
  %c64 = arith.constant 64 : index
  %c100 = arith.constant 100 : index
  %z = arith.constant 0.0 : f32
  scf.for %k = %c0 to %c10 step %c1 {
    scf.parallel (%i) = (%c0) to (%c64) step (%c1) {
      memref.store %k, %b[%i] : memref<64xindex>
      scf.reduce
    }
  }
  scf.parallel (%i, %j) = (%c0, %c0) to (%c64, %c100) step (%c1, %c1) {
    memref.store %z, %a[%i, %j] : memref<64x100xf32>
    scf.reduce
  }
  return
}
"#;
        let module = Module::parse(&context, text).expect("the test module parses");
        let m = module.as_operation().to_raw();
        tile_parallel_loops(context.to_raw(), m).expect("tiling succeeds");
        assert!(module.as_operation().verify(), "{}", module.as_operation());
        let mut funcs = vec![];
        walk(m, &mut |o| {
            if op_name(o) == "func.func" {
                funcs.push(o);
            }
        });
        assert_eq!(funcs.len(), 1, "{}", module.as_operation());
        let got: Vec<_> = outermost_loops(funcs[0])
            .into_iter()
            .map(|outer| {
                let inner = loop_within(outer).expect("a loop within each tile");
                (extents(outer), extents(inner))
            })
            .collect();
        assert_eq!(
            got,
            [
                (vec![Some(1)], vec![Some(64)]),
                (vec![Some(64), Some(1)], vec![Some(1), Some(128)]),
            ],
            "{}",
            module.as_operation()
        );
    }

    #[test]
    fn threads_go_along_the_last_dimension_with_a_warp_of_work() {
        let s = |v: &[u64]| tiles_for(&v.iter().map(|&x| Some(x)).collect::<Vec<_>>());
        assert_eq!(s(&[100_000]), [256]);
        assert_eq!(s(&[5]), [32]);
        assert_eq!(s(&[64, 1000]), [1, 256]);
        assert_eq!(s(&[64, 48]), [1, 64]);
        assert_eq!(s(&[4, 128, 512]), [1, 1, 256]);
        // Attention scores [batch, heads, query, key]: threads along the keys, blocks
        // along keys (x), queries (y) and heads (z), the batch inside each block.
        assert_eq!(s(&[2, 4, 128, 128]), [1, 1, 1, 128]);
        let (o, i) = mapping_for(
            &[Some(2), Some(4), Some(128), Some(1)],
            &[Some(1), Some(1), Some(1), Some(128)],
        );
        use Processor::*;
        assert_eq!(o, [Sequential, Block(2), Block(1), Block(0)]);
        assert_eq!(i, [Sequential, Sequential, Sequential, Thread(0)]);
        // A last dimension shorter than a warp: threads along an earlier one.
        assert_eq!(s(&[4, 512, 3]), [1, 256, 1]);
        assert_eq!(s(&[1000, 4]), [256, 1]);
        assert_eq!(s(&[3, 4]), [1, 32]);
        // Unknown trip counts count as large; unknown tile counts are never y or z.
        assert_eq!(tiles_for(&[None]), [256]);
        assert_eq!(tiles_for(&[Some(4), None]), [1, 256]);
        let (o, _) = mapping_for(&[None, Some(3)], &[Some(1), Some(256)]);
        assert_eq!(o, [Sequential, Block(0)]);
        // More tiles than a grid's y or z takes: that dimension runs inside the block.
        let (o, _) = mapping_for(&[Some(100_000), Some(2)], &[Some(1), Some(256)]);
        assert_eq!(o, [Sequential, Block(0)]);
    }
}
