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

/// A plan as a tree of choices, flattened into stages at the end.
#[derive(Debug)]
pub enum Tree {
    Empty,
    /// One stage holding these subtrees.
    Stage(Vec<usize>),
    Join(Rc<Tree>, Rc<Tree>),
}

impl Tree {
    fn stages(&self, out: &mut Vec<Vec<usize>>) {
        match self {
            Tree::Empty => {}
            Tree::Stage(s) => out.push(s.clone()),
            Tree::Join(a, b) => {
                a.stages(out);
                b.stages(out);
            }
        }
    }
}

#[derive(Clone, Debug)]
pub struct Point {
    pub t: f64,
    pub l: f64,
    pub tree: Rc<Tree>,
}

const FRONT: usize = 8;

/// Insert `p` into the Pareto front `front` (kept to [`FRONT`] points by the scalar
/// objective).
fn insert(front: &mut Vec<Point>, p: Point, m: f64) {
    const EPS: f64 = 1e-12;
    if front
        .iter()
        .any(|q| q.t <= p.t * (1.0 + EPS) && q.l <= p.l * (1.0 + EPS))
    {
        return;
    }
    front.retain(|q| !(p.t <= q.t && p.l <= q.l));
    front.push(p);
    if front.len() > FRONT {
        let obj = |q: &Point| (m - 1.0) * q.t + q.l;
        let worst = front
            .iter()
            .enumerate()
            .max_by(|a, b| obj(a.1).total_cmp(&obj(b.1)))
            .map(|(i, _)| i)
            .unwrap_or(0);
        front.remove(worst);
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
    memo: HashMap<(usize, usize), Rc<Vec<Point>>>,
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
            memo: HashMap::new(),
        }
    }

    /// The Pareto front of plans of subtree `id` on exactly `k` stages.
    pub fn best(&mut self, id: usize, k: usize) -> Rc<Vec<Point>> {
        if let Some(r) = self.memo.get(&(id, k)) {
            return r.clone();
        }
        let a = self.arena;
        let r = if k == 0 || a.leaves[id].len() < k {
            vec![]
        } else if k == 1 {
            if self.memory.fits(&a.cost[id]) {
                let t = a.cost[id].time();
                vec![Point {
                    t,
                    l: t,
                    tree: Rc::new(Tree::Stage(vec![id])),
                }]
            } else {
                vec![]
            }
        } else {
            match a.kind[id] {
                Kind::Leaf(_) => vec![],
                Kind::Series | Kind::Linear(_) => self.series(id, k),
                Kind::Parallel => {
                    let mut front = if self.chain_only {
                        vec![]
                    } else {
                        self.parallel(id, k)
                    };
                    if let Some(lin) = a.linear[id] {
                        for p in self.best(lin, k).iter() {
                            insert(&mut front, p.clone(), self.m);
                        }
                    }
                    front
                }
            }
        };
        let r = Rc::new(r);
        self.memo.insert((id, k), r.clone());
        r
    }

    fn series(&mut self, id: usize, k: usize) -> Vec<Point> {
        let a = self.arena;
        let ch = &a.children[id];
        let n = ch.len();
        // Leaves from child i to the end (a stage needs at least one).
        let mut rest = vec![0usize; n + 1];
        for i in (0..n).rev() {
            rest[i] = rest[i + 1] + a.leaves[ch[i]].len();
        }
        let pinned: Vec<bool> = (0..n)
            .map(|i| id == self.root && self.pinned.contains(&i))
            .collect();
        let mut dp: Vec<Vec<Vec<Point>>> = vec![vec![vec![]; k + 1]; n + 1];
        dp[0][0].push(Point {
            t: 0.0,
            l: 0.0,
            tree: Rc::new(Tree::Empty),
        });
        for i in 0..n {
            for j in 0..k {
                if dp[i][j].is_empty() {
                    continue;
                }
                let pts = dp[i][j].clone();
                let cut = if i > 0 {
                    2.0 * (self.comm)(a.cut_bytes[id][i])
                } else {
                    0.0
                };
                // A run of children on one stage.
                let mut acc = Cost::default();
                for i2 in i + 1..=n {
                    if i2 - 1 > i && pinned[i2 - 1] {
                        break;
                    }
                    acc += a.cost[ch[i2 - 1]];
                    if !self.memory.fits(&acc) || rest[i2] < k - j - 1 {
                        break;
                    }
                    let t = acc.time();
                    let stage = Rc::new(Tree::Stage(ch[i..i2].to_vec()));
                    for p in &pts {
                        let q = Point {
                            t: p.t.max(t),
                            l: p.l + cut + t,
                            tree: Rc::new(Tree::Join(p.tree.clone(), stage.clone())),
                        };
                        insert(&mut dp[i2][j + 1], q, self.m);
                    }
                }
                // One child on several stages.
                if !matches!(a.kind[ch[i]], Kind::Leaf(_)) {
                    for j2 in 2..=k - j {
                        if rest[i + 1] < k - j - j2 {
                            continue;
                        }
                        let sub = self.best(ch[i], j2);
                        for p in &pts {
                            for s in sub.iter() {
                                let q = Point {
                                    t: p.t.max(s.t),
                                    l: p.l + cut + s.l,
                                    tree: Rc::new(Tree::Join(p.tree.clone(), s.tree.clone())),
                                };
                                insert(&mut dp[i + 1][j + j2], q, self.m);
                            }
                        }
                    }
                }
            }
        }
        std::mem::take(&mut dp[n][k])
    }

    fn parallel(&mut self, id: usize, k: usize) -> Vec<Point> {
        let a = self.arena;
        let mut br = a.children[id].clone();
        br.sort_by(|&x, &y| a.cost[y].time().total_cmp(&a.cost[x].time()));
        let n = br.len();
        let mut rest = vec![0usize; n + 1];
        for i in (0..n).rev() {
            rest[i] = rest[i + 1] + a.leaves[br[i]].len();
        }
        let mut dp: Vec<Vec<Vec<Point>>> = vec![vec![vec![]; k + 1]; n + 1];
        dp[0][0].push(Point {
            t: 0.0,
            l: 0.0,
            tree: Rc::new(Tree::Empty),
        });
        for i in 0..n {
            for j in 0..k {
                if dp[i][j].is_empty() {
                    continue;
                }
                let pts = dp[i][j].clone();
                let mut acc = Cost::default();
                for i2 in i + 1..=n {
                    acc += a.cost[br[i2 - 1]];
                    if !self.memory.fits(&acc) || rest[i2] < k - j - 1 {
                        break;
                    }
                    let t = acc.time();
                    let stage = Rc::new(Tree::Stage(br[i..i2].to_vec()));
                    for p in &pts {
                        let q = Point {
                            t: p.t.max(t),
                            l: p.l.max(t),
                            tree: Rc::new(Tree::Join(p.tree.clone(), stage.clone())),
                        };
                        insert(&mut dp[i2][j + 1], q, self.m);
                    }
                }
                if !matches!(a.kind[br[i]], Kind::Leaf(_)) {
                    for j2 in 2..=k - j {
                        if rest[i + 1] < k - j - j2 {
                            continue;
                        }
                        let sub = self.best(br[i], j2);
                        for p in &pts {
                            for s in sub.iter() {
                                let q = Point {
                                    t: p.t.max(s.t),
                                    l: p.l.max(s.l),
                                    tree: Rc::new(Tree::Join(p.tree.clone(), s.tree.clone())),
                                };
                                insert(&mut dp[i + 1][j + j2], q, self.m);
                            }
                        }
                    }
                }
            }
        }
        std::mem::take(&mut dp[n][k])
    }

    /// The stages of a plan, each as its graph nodes.
    pub fn stages(&self, p: &Point) -> Vec<Vec<usize>> {
        let mut groups = vec![];
        p.tree.stages(&mut groups);
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
