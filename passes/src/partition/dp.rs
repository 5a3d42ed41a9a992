//! Dynamic programming over a series-parallel tree: which pieces become stages and how many
//! devices each parallel branch gets.
//!
//! A plan of a subtree on `k` devices is summarised by `t`, its slowest stage (F + B + W per
//! micro-batch), and `l`, its longest path of stage times plus transfers. A pipeline of M
//! micro-batches then takes about `(M − 1)·t + l` (exact for 1F1B on a chain of equal
//! stages: `(M + p − 1)·t`). For each (subtree, k) the DP keeps the Pareto front of
//! (t, l) — a few points, since neither alone decides the best combination:
//! - a **series** is split into consecutive runs, each run one stage, or one child given
//!   several devices (its own sub-plan); `t` is the max, `l` the sum plus the transfer at
//!   each cut;
//! - a **parallel** block gives each branch its own devices (several branches can share
//!   one stage); `t` and `l` are maxima. It may also be linearised (cut as a chain in
//!   topological order) when that is better;
//! - a stage whose memory (weights, gradients and optimizer state, plus the activations of
//!   the micro-batches in flight) exceeds the limit is never formed.

use std::collections::HashMap;
use std::rc::Rc;

use super::graph::Cost;
use super::sp::Sp;

/// How a stage's memory is estimated and bounded.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MemoryModel {
    /// Bytes per device.
    pub limit: f64,
    /// Micro-batches whose activations a stage keeps at once.
    pub stash: f64,
    /// Optimizer state per parameter byte (1 for SGD momentum, 2 for Adam).
    pub optimizer_state: f64,
}

impl MemoryModel {
    /// Bytes a stage with cost `c` needs: params, their gradients and optimizer state,
    /// states, and the stash.
    pub fn bytes(&self, c: &Cost) -> f64 {
        c.param_bytes * (2.0 + self.optimizer_state) + c.state_bytes + c.act_bytes * self.stash
    }

    pub fn fits(&self, c: &Cost) -> bool {
        self.bytes(c) <= self.limit
    }
}

/// A plan as a tree of choices, flattened into stages at the end. Trees live in the
/// solver's arena ([`TreeId`]); points share subtrees by id.
#[derive(Debug)]
pub enum Tree {
    Empty,
    /// One stage holding these subtrees.
    Stage(Vec<usize>),
    /// One stage holding the children `from..to` of series subtree `series` (a range, not a
    /// copy: the DP builds a tree for every point it keeps).
    Run {
        series: usize,
        from: usize,
        to: usize,
    },
    Join(TreeId, TreeId),
}

/// A tree in [`Solver`]'s arena.
pub type TreeId = u32;

/// A point's tree: in the arena, or still the join that would make it. Most points the DP
/// keeps are pushed off their front again by better ones; their trees are only built
/// (into the arena, which never shrinks) once the front is final and read.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum TreeRef {
    Built(TreeId),
    /// `Join(left, Run { series, from, to })`, or for a parallel subtree, `Join(left,
    /// Stage(branches[from..to]))` with its branches in the order the DP took them.
    JoinRun {
        left: TreeId,
        parent: u32,
        parallel: bool,
        from: u32,
        to: u32,
    },
    /// `Join(left, right)`.
    Join(TreeId, TreeId),
}

impl Default for TreeRef {
    fn default() -> Self {
        TreeRef::Built(0)
    }
}

/// One plan on a Pareto front: slowest stage `t`, longest path `l`, and how it was built.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Point {
    pub t: f64,
    pub l: f64,
    pub tree: TreeRef,
}

const FRONT: usize = 8;

/// A Pareto front of at most [`FRONT`] points, inline (the DP keeps one per (child,
/// stages) pair and reads and writes them in its innermost loop). Stored by field: most
/// insertions are decided by `t` and `l` alone, so those are read side by side.
#[derive(Clone, Copy, Debug, Default)]
struct Front {
    len: usize,
    t: [f64; FRONT],
    l: [f64; FRONT],
    tree: [TreeRef; FRONT],
}

impl Front {
    /// The relative tolerance of dominance.
    const EPS: f64 = 1e-12;

    fn point(&self, i: usize) -> Point {
        Point {
            t: self.t[i],
            l: self.l[i],
            tree: self.tree[i],
        }
    }

    /// The points, in the order they were kept.
    fn points(&self) -> Vec<Point> {
        (0..self.len).map(|i| self.point(i)).collect()
    }

    /// The points, copied out: the first `len` are the front.
    fn point_array(&self) -> [Point; FRONT] {
        std::array::from_fn(|i| self.point(i))
    }

    fn push(&mut self, p: Point) {
        let i = self.len;
        self.t[i] = p.t;
        self.l[i] = p.l;
        self.tree[i] = p.tree;
        self.len += 1;
    }

    fn remove(&mut self, i: usize) {
        self.t.copy_within(i + 1..self.len, i);
        self.l.copy_within(i + 1..self.len, i);
        self.tree.copy_within(i + 1..self.len, i);
        self.len -= 1;
    }

    /// Whether a point of the front makes (`t`, `l`) not worth keeping (up to rounding).
    /// Monotone: it then holds for every point at least as large in both.
    #[inline(always)]
    fn dominates(&self, t: f64, l: f64) -> bool {
        let (te, le) = (t * (1.0 + Self::EPS), l * (1.0 + Self::EPS));
        (0..self.len).any(|i| self.t[i] <= te && self.l[i] <= le)
    }

    /// The least `l` of the points with `t` at most `te` (infinite if none): (`t`, `l`) is
    /// dominated, as [`Front::dominates`] decides, exactly when this is at most
    /// `l · (1 + EPS)`, for `te = t · (1 + EPS)`.
    #[inline(always)]
    fn least_l_within(&self, te: f64) -> f64 {
        let mut least = f64::INFINITY;
        for i in 0..self.len {
            if self.t[i] <= te && self.l[i] < least {
                least = self.l[i];
            }
        }
        least
    }

    /// Insert (`t`, `l`, `tree`), kept to [`FRONT`] points by the scalar objective: past
    /// that, the worst goes (the last one of equal worst, as `max_by` picks). Most
    /// candidates of the DP are dominated, so that is decided first, on `t` and `l` alone;
    /// a candidate that would be the worst of a full front leaves again at once, so it is
    /// never pushed.
    #[inline(always)]
    fn insert(&mut self, t: f64, l: f64, tree: TreeRef, m: f64) {
        if !self.dominates(t, l) {
            self.insert_undominated(t, l, tree, m);
        }
    }

    /// [`Front::insert`] of a point no point of the front dominates (the sequential DP
    /// decides that itself, more cheaply).
    #[inline(always)]
    fn insert_undominated(&mut self, t: f64, l: f64, tree: TreeRef, m: f64) {
        debug_assert!(!self.dominates(t, l));
        let n = self.len;
        let removes_any = (0..n).any(|i| t <= self.t[i] && l <= self.l[i]);
        let new = Point { t, l, tree };
        if !removes_any && n >= FRONT {
            // One over after the push: nothing changes when the new point is the worst (on
            // a tie too: of equal worst, the last one goes, and the new point would be
            // last).
            let obj = |t: f64, l: f64| (m - 1.0) * t + l;
            let mut worst = 0;
            let mut worst_obj = f64::NEG_INFINITY;
            for i in 0..n {
                let o = obj(self.t[i], self.l[i]);
                if i == 0 || o.total_cmp(&worst_obj) != std::cmp::Ordering::Less {
                    worst = i;
                    worst_obj = o;
                }
            }
            if obj(t, l).total_cmp(&worst_obj) == std::cmp::Ordering::Less {
                self.remove(worst);
                self.push(new);
            }
            return;
        }
        if removes_any {
            let mut kept = 0;
            for i in 0..n {
                if !(t <= self.t[i] && l <= self.l[i]) {
                    self.t[kept] = self.t[i];
                    self.l[kept] = self.l[i];
                    self.tree[kept] = self.tree[i];
                    kept += 1;
                }
            }
            self.len = kept;
        }
        // Not full, or one removed: room for the new point.
        self.push(new);
    }
}

/// A series-parallel tree flattened into an arena with per-subtree costs.
pub struct Arena {
    pub kind: Vec<Kind>,
    pub children: Vec<Vec<usize>>,
    pub cost: Vec<Cost>,
    /// Graph nodes under each subtree.
    pub leaves: Vec<Vec<usize>>,
    /// For series: bytes crossing the cut before child i (index 0 unused).
    pub cut_bytes: Vec<Vec<f64>>,
    /// For parallel subtrees: their linearised form.
    pub linear: Vec<Option<usize>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Leaf(usize),
    Series,
    Parallel,
    /// The linearised form of parallel subtree `.0` (a series of its leaves).
    Linear(usize),
}

impl Arena {
    /// Flatten `sp`; `node_cost` per graph node; `crossing(a, b)` = bytes of the distinct
    /// values produced in node set `a` and read in node set `b`.
    pub fn new(
        sp: &Sp,
        node_cost: &[Cost],
        crossing: &dyn Fn(&[usize], &[usize]) -> f64,
    ) -> (Arena, usize) {
        let mut a = Arena {
            kind: vec![],
            children: vec![],
            cost: vec![],
            leaves: vec![],
            cut_bytes: vec![],
            linear: vec![],
        };
        let root = a.add(sp, node_cost, crossing);
        (a, root)
    }

    fn push(&mut self, kind: Kind, children: Vec<usize>, leaves: Vec<usize>, cost: Cost) -> usize {
        self.kind.push(kind);
        self.children.push(children);
        self.leaves.push(leaves);
        self.cost.push(cost);
        self.cut_bytes.push(vec![]);
        self.linear.push(None);
        self.kind.len() - 1
    }

    fn add(
        &mut self,
        sp: &Sp,
        node_cost: &[Cost],
        crossing: &dyn Fn(&[usize], &[usize]) -> f64,
    ) -> usize {
        match sp {
            Sp::Leaf(n) => self.push(Kind::Leaf(*n), vec![], vec![*n], node_cost[*n]),
            Sp::Series(cs) | Sp::Parallel(cs) => {
                let ids: Vec<usize> = cs
                    .iter()
                    .map(|c| self.add(c, node_cost, crossing))
                    .collect();
                let mut leaves = vec![];
                let mut cost = Cost::default();
                for &i in &ids {
                    leaves.extend(self.leaves[i].iter().copied());
                    cost += self.cost[i];
                }
                leaves.sort_unstable();
                let is_series = matches!(sp, Sp::Series(_));
                let kind = if is_series {
                    Kind::Series
                } else {
                    Kind::Parallel
                };
                let id = self.push(kind, ids.clone(), leaves.clone(), cost);
                if is_series {
                    self.cut_bytes[id] = series_cuts(&ids, &self.leaves, crossing);
                } else {
                    // The linearised alternative: a series of the leaves in order.
                    let lin: Vec<usize> = leaves
                        .iter()
                        .map(|&n| self.push(Kind::Leaf(n), vec![], vec![n], node_cost[n]))
                        .collect();
                    let lid = self.push(Kind::Linear(id), lin.clone(), leaves, cost);
                    self.cut_bytes[lid] = series_cuts(&lin, &self.leaves, crossing);
                    self.linear[id] = Some(lid);
                }
                id
            }
        }
    }
}

fn series_cuts(
    ids: &[usize],
    leaves: &[Vec<usize>],
    crossing: &dyn Fn(&[usize], &[usize]) -> f64,
) -> Vec<f64> {
    let mut out = vec![0.0; ids.len()];
    for i in 1..ids.len() {
        let left: Vec<usize> = ids[..i].iter().flat_map(|&c| leaves[c].clone()).collect();
        let right: Vec<usize> = ids[i..].iter().flat_map(|&c| leaves[c].clone()).collect();
        out[i] = crossing(&left, &right);
    }
    out
}

/// The DP.
pub struct Solver<'a> {
    pub arena: &'a Arena,
    pub memory: MemoryModel,
    /// Micro-batches (weights `t` against `l`).
    pub m: f64,
    /// Seconds to move `bytes` between devices.
    pub comm: &'a dyn Fn(f64) -> f64,
    /// Children of the root series before which a stage must start.
    pub pinned: Vec<usize>,
    pub root: usize,
    /// Forbid parallel branches on their own devices (the sequential partitioner).
    pub chain_only: bool,
    /// The most stages any subtree has been asked for: the width of the DP tables.
    kmax: usize,
    memo: HashMap<(usize, usize), Rc<[Point]>>,
    trees: Vec<Tree>,
}

impl<'a> Solver<'a> {
    pub fn new(
        arena: &'a Arena,
        root: usize,
        memory: MemoryModel,
        m: f64,
        comm: &'a dyn Fn(f64) -> f64,
    ) -> Self {
        Solver {
            arena,
            memory,
            m,
            comm,
            pinned: vec![],
            root,
            chain_only: false,
            kmax: 0,
            memo: HashMap::new(),
            trees: vec![Tree::Empty],
        }
    }

    fn tree(&mut self, t: Tree) -> TreeId {
        self.trees.push(t);
        (self.trees.len() - 1) as TreeId
    }

    /// Put a point's tree into the arena.
    fn build(&mut self, r: TreeRef) -> TreeId {
        match r {
            TreeRef::Built(id) => id,
            TreeRef::Join(a, b) => self.tree(Tree::Join(a, b)),
            TreeRef::JoinRun {
                left,
                parent,
                parallel,
                from,
                to,
            } => {
                let (parent, from, to) = (parent as usize, from as usize, to as usize);
                let stage = if parallel {
                    let br = self.branches(parent);
                    self.tree(Tree::Stage(br[from..to].to_vec()))
                } else {
                    self.tree(Tree::Run {
                        series: parent,
                        from,
                        to,
                    })
                };
                self.tree(Tree::Join(left, stage))
            }
        }
    }

    /// Build the trees of a front's points (once it is final: nothing better can come).
    fn build_front(&mut self, f: &mut Front) {
        for i in 0..f.len {
            let id = self.build(f.tree[i]);
            f.tree[i] = TreeRef::Built(id);
        }
    }

    /// The tree of a point of a final front.
    fn built(r: TreeRef) -> TreeId {
        match r {
            TreeRef::Built(id) => id,
            _ => unreachable!("a final front holds built trees"),
        }
    }

    /// The branches of parallel subtree `id`, slowest first (ties keep their order).
    fn branches(&self, id: usize) -> Vec<usize> {
        let a = self.arena;
        let mut br = a.children[id].clone();
        br.sort_by(|&x, &y| a.cost[y].time().total_cmp(&a.cost[x].time()));
        br
    }

    /// The Pareto front of plans of subtree `id` on exactly `k` stages.
    ///
    /// A series or parallel subtree's DP table holds its plans on every number of stages
    /// at once (row `j`: plans on `j` stages), so the table is filled once, as wide as the
    /// most stages any subtree is asked for, and every row is kept: the DP asks a child
    /// for many stage counts. The rows are those a table for each count alone would give
    /// (an entry of row `j` depends only on rows below it, which are filled in the same
    /// order with the same candidates).
    pub fn best(&mut self, id: usize, k: usize) -> Rc<[Point]> {
        self.kmax = self.kmax.max(k);
        if let Some(r) = self.memo.get(&(id, k)) {
            return r.clone();
        }
        let a = self.arena;
        if k == 0 || a.leaves[id].len() < k {
            let r: Rc<[Point]> = Rc::from(vec![]);
            self.memo.insert((id, k), r.clone());
            return r;
        }
        if k == 1 {
            let r: Vec<Point> = if self.memory.fits(&a.cost[id]) {
                let t = a.cost[id].time();
                let tree = TreeRef::Built(self.tree(Tree::Stage(vec![id])));
                vec![Point { t, l: t, tree }]
            } else {
                vec![]
            };
            let r: Rc<[Point]> = r.into();
            self.memo.insert((id, k), r.clone());
            return r;
        }
        let width = self.kmax.min(a.leaves[id].len());
        match a.kind[id] {
            Kind::Leaf(_) => {
                self.memo.insert((id, k), Rc::from(vec![]));
            }
            // The root is asked for one count only: its table skips the entries that
            // cannot reach `k` stages.
            Kind::Series if id == self.root => {
                let mut rows = self.series(id, k, true);
                let row = rows.pop().unwrap_or_default();
                self.memo.insert((id, k), row.into());
            }
            Kind::Series | Kind::Linear(_) => {
                let rows = self.series(id, width, false);
                for (j, row) in rows.into_iter().enumerate().skip(2) {
                    self.memo.insert((id, j), row.into());
                }
            }
            Kind::Parallel => {
                let rows = if self.chain_only {
                    vec![vec![]; width + 1]
                } else {
                    self.parallel(id, width)
                };
                for (j, row) in rows.into_iter().enumerate().skip(2) {
                    let mut front = Front::default();
                    for p in row {
                        front.push(p);
                    }
                    if let Some(lin) = a.linear[id] {
                        for p in self.best(lin, j).iter() {
                            front.insert(p.t, p.l, p.tree, self.m);
                        }
                    }
                    self.memo.insert((id, j), front.points().into());
                }
            }
        }
        self.memo
            .get(&(id, k))
            .cloned()
            .unwrap_or_else(|| Rc::from(vec![]))
    }

    /// The final row of each stage count `0..=k` of series subtree `id`'s table; with
    /// `only_k`, the entries that cannot reach `k` stages stay empty (so only row `k` is
    /// complete).
    fn series(&mut self, id: usize, k: usize, only_k: bool) -> Vec<Vec<Point>> {
        let a = self.arena;
        let ch = &a.children[id];
        let n = ch.len();
        // Leaves from child i to the end (a stage needs at least one).
        let mut rest = vec![0usize; n + 1];
        for i in (0..n).rev() {
            rest[i] = rest[i + 1] + a.leaves[ch[i]].len();
        }
        let short = |i: usize, stages_left: usize| only_k && rest[i] < stages_left;
        let pinned: Vec<bool> = (0..n)
            .map(|i| id == self.root && self.pinned.contains(&i))
            .collect();
        // dp[j·(n+1) + i]: plans of children 0..i on j stages. Stage-major, so the targets
        // of the runs from one entry (children i+1.., one more stage) lie side by side.
        let row = n + 1;
        let mut dp = vec![Front::default(); (k + 1) * row];
        dp[0].push(Point {
            t: 0.0,
            l: 0.0,
            tree: TreeRef::Built(0),
        });
        // The times of the runs of children from i on one stage, up to the first that is
        // cut by a pinned child or does not fit: the same for every stage count, so summed
        // once per i (in the same order, so to the same bits).
        let mut runs: Vec<f64> = Vec::with_capacity(n);
        for i in 0..n {
            if (0..k).all(|j| dp[j * row + i].len == 0) {
                continue;
            }
            runs.clear();
            let mut acc = Cost::default();
            for i2 in i + 1..=n {
                if i2 - 1 > i && pinned[i2 - 1] {
                    break;
                }
                acc += a.cost[ch[i2 - 1]];
                if !self.memory.fits(&acc) {
                    break;
                }
                runs.push(acc.time());
            }
            let cut = if i > 0 {
                2.0 * (self.comm)(a.cut_bytes[id][i])
            } else {
                0.0
            };
            for j in 0..k {
                if dp[j * row + i].len == 0 {
                    continue;
                }
                let mut from = dp[j * row + i];
                self.build_front(&mut from);
                dp[j * row + i] = from;
                let pts = from.point_array();
                let pts = &pts[..from.len];
                // A run of children on one stage.
                let targets = &mut dp[(j + 1) * row + i + 1..(j + 2) * row];
                for (r, (&t, target)) in runs.iter().zip(targets.iter_mut()).enumerate() {
                    let i2 = i + 1 + r;
                    if short(i2, k - j - 1) {
                        break;
                    }
                    // The candidates of points no slower than the run all have slowest stage
                    // `t`: for them the dominance test is against the least `l` among the
                    // target's points within `t` (kept until the target changes).
                    let te = t * (1.0 + Front::EPS);
                    let mut least_l = target.least_l_within(te);
                    for p in pts {
                        let (ct, cl) = (p.t.max(t), p.l + cut + t);
                        let dominated = if p.t <= t {
                            least_l <= cl * (1.0 + Front::EPS)
                        } else {
                            target.dominates(ct, cl)
                        };
                        if dominated {
                            continue;
                        }
                        let tree = TreeRef::JoinRun {
                            left: Self::built(p.tree),
                            parent: id as u32,
                            parallel: false,
                            from: i as u32,
                            to: i2 as u32,
                        };
                        target.insert_undominated(ct, cl, tree, self.m);
                        least_l = target.least_l_within(te);
                    }
                }
                // One child on several stages.
                if !matches!(a.kind[ch[i]], Kind::Leaf(_)) {
                    for j2 in 2..=k - j {
                        if short(i + 1, k - j - j2) {
                            continue;
                        }
                        let sub = self.best(ch[i], j2);
                        let target = &mut dp[(j + j2) * row + i + 1];
                        for p in pts {
                            for s in sub.iter() {
                                target.insert(
                                    p.t.max(s.t),
                                    p.l + cut + s.l,
                                    TreeRef::Join(Self::built(p.tree), Self::built(s.tree)),
                                    self.m,
                                );
                            }
                        }
                    }
                }
            }
        }
        let mut last: Vec<Front> = (0..=k).map(|j| dp[j * row + n]).collect();
        self.final_rows(&mut last)
    }

    /// Build the trees of a table's last row and return it, one front per stage count.
    fn final_rows(&mut self, row: &mut [Front]) -> Vec<Vec<Point>> {
        row.iter_mut()
            .map(|f| {
                self.build_front(f);
                f.points()
            })
            .collect()
    }

    /// The final row of each stage count `0..=k` of parallel subtree `id`'s table.
    fn parallel(&mut self, id: usize, k: usize) -> Vec<Vec<Point>> {
        let a = self.arena;
        let br = self.branches(id);
        let n = br.len();
        let w = k + 1;
        let mut dp = vec![Front::default(); (n + 1) * w];
        dp[0].push(Point {
            t: 0.0,
            l: 0.0,
            tree: TreeRef::Built(0),
        });
        for i in 0..n {
            for j in 0..k {
                if dp[i * w + j].len == 0 {
                    continue;
                }
                let mut from = dp[i * w + j];
                self.build_front(&mut from);
                dp[i * w + j] = from;
                let pts = from.point_array();
                let pts = &pts[..from.len];
                let mut acc = Cost::default();
                for i2 in i + 1..=n {
                    acc += a.cost[br[i2 - 1]];
                    if !self.memory.fits(&acc) {
                        break;
                    }
                    let t = acc.time();
                    let target = &mut dp[i2 * w + j + 1];
                    for p in pts {
                        let tree = TreeRef::JoinRun {
                            left: Self::built(p.tree),
                            parent: id as u32,
                            parallel: true,
                            from: i as u32,
                            to: i2 as u32,
                        };
                        target.insert(p.t.max(t), p.l.max(t), tree, self.m);
                    }
                }
                if !matches!(a.kind[br[i]], Kind::Leaf(_)) {
                    for j2 in 2..=k - j {
                        let sub = self.best(br[i], j2);
                        let target = &mut dp[(i + 1) * w + j + j2];
                        for p in pts {
                            for s in sub.iter() {
                                target.insert(
                                    p.t.max(s.t),
                                    p.l.max(s.l),
                                    TreeRef::Join(Self::built(p.tree), Self::built(s.tree)),
                                    self.m,
                                );
                            }
                        }
                    }
                }
            }
        }
        self.final_rows(&mut dp[n * w..])
    }

    /// The stages of a plan, each as its graph nodes.
    pub fn stages(&self, p: &Point) -> Vec<Vec<usize>> {
        let mut groups: Vec<Vec<usize>> = vec![];
        let mut todo = vec![Self::built(p.tree)];
        // Depth first, left before right: the order the plan's stages were joined in.
        while let Some(id) = todo.pop() {
            match &self.trees[id as usize] {
                Tree::Empty => {}
                Tree::Stage(s) => groups.push(s.clone()),
                Tree::Run { series, from, to } => {
                    groups.push(self.arena.children[*series][*from..*to].to_vec())
                }
                Tree::Join(a, b) => {
                    todo.push(*b);
                    todo.push(*a);
                }
            }
        }
        groups
            .into_iter()
            .map(|g| {
                let mut v: Vec<usize> = g
                    .iter()
                    .flat_map(|&id| self.arena.leaves[id].iter().copied())
                    .collect();
                v.sort_unstable();
                v
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sequential DP decides dominance by `least_l_within`: it must agree with
    /// `dominates` everywhere, ties and near-ties within the tolerance included.
    #[test]
    fn least_l_within_decides_dominance_as_dominates_does() {
        let mut seed: u64 = 0x9e3779b97f4a7c15;
        let mut next = move || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            // Few distinct values, so that ties and near-ties are common.
            let v = (seed >> 33) % 8;
            let nudge = match (seed >> 40) % 3 {
                0 => 1.0,
                1 => 1.0 + 1e-13,
                _ => 1.0 - 1e-13,
            };
            (1.0 + v as f64) * nudge
        };
        for _ in 0..2000 {
            let mut f = Front::default();
            for _ in 0..(next() as usize % (FRONT + 1)) {
                f.insert(next(), next(), TreeRef::default(), 16.0);
            }
            for _ in 0..16 {
                let (t, l) = (next(), next());
                let te = t * (1.0 + Front::EPS);
                let by_least = f.least_l_within(te) <= l * (1.0 + Front::EPS);
                assert_eq!(by_least, f.dominates(t, l), "front {f:?}, point ({t}, {l})");
            }
        }
    }
}
