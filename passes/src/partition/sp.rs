//! Series-parallel decomposition of a node graph.
//!
//! A set of nodes (in topological order) is decomposed as:
//! - **parallel** if it falls apart into several weakly connected pieces (edges inside the
//!   set only): the branches of an Inception block, the towers of a two-tower model;
//! - **series** at every position of the order where all edges crossing it leave one node
//!   or all enter one node, counting edges from outside the set as leaving one virtual
//!   source and edges to outside as entering one virtual sink (so a cut never separates a
//!   branch from the input it reads);
//! - otherwise (not series-parallel, e.g. a branch that reads the middle of another) the
//!   set is linearised: a series of its nodes in topological order, so every graph still
//!   gets a valid plan.

use std::collections::HashMap;

use petgraph::unionfind::UnionFind;

use super::graph::NodeGraph;

/// A series-parallel tree over node ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sp {
    Leaf(usize),
    Series(Vec<Sp>),
    Parallel(Vec<Sp>),
}

impl Sp {
    /// The nodes under this tree, in topological order of the tree walk.
    pub fn leaves(&self, out: &mut Vec<usize>) {
        match self {
            Sp::Leaf(n) => out.push(*n),
            Sp::Series(c) | Sp::Parallel(c) => c.iter().for_each(|x| x.leaves(out)),
        }
    }

    fn series(mut parts: Vec<Sp>) -> Sp {
        if parts.len() == 1 {
            if let Some(only) = parts.pop() {
                return only;
            }
        }
        let mut flat = vec![];
        for p in parts {
            match p {
                Sp::Series(c) => flat.extend(c),
                other => flat.push(other),
            }
        }
        Sp::Series(flat)
    }

    fn parallel(mut parts: Vec<Sp>) -> Sp {
        if parts.len() == 1 {
            if let Some(only) = parts.pop() {
                return only;
            }
        }
        let mut flat = vec![];
        for p in parts {
            match p {
                Sp::Parallel(c) => flat.extend(c),
                other => flat.push(other),
            }
        }
        Sp::Parallel(flat)
    }
}

const VSOURCE: usize = usize::MAX;
const VSINK: usize = usize::MAX - 1;

/// Decompose `nodes` (ascending node ids = a topological order).
pub fn decompose(g: &NodeGraph, nodes: &[usize]) -> Sp {
    if nodes.len() == 1 {
        return Sp::Leaf(nodes[0]);
    }
    let index: HashMap<usize, usize> = nodes.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    // Weakly connected components inside the set.
    let mut parts = UnionFind::<usize>::new(nodes.len());
    for (i, &n) in nodes.iter().enumerate() {
        for s in &g.succs[n] {
            if let Some(&j) = index.get(s) {
                parts.union(i, j);
            }
        }
    }
    let mut comps: Vec<Vec<usize>> = vec![];
    let mut comp_of: HashMap<usize, usize> = HashMap::new();
    for (i, &n) in nodes.iter().enumerate() {
        let r = parts.find_mut(i);
        let c = *comp_of.entry(r).or_insert_with(|| {
            comps.push(vec![]);
            comps.len() - 1
        });
        comps[c].push(n);
    }
    if comps.len() > 1 {
        return Sp::parallel(comps.iter().map(|c| decompose(g, c)).collect());
    }

    // Series cuts by a sweep over the order.
    let ext_in = |n: usize| g.is_source[n] || g.preds[n].iter().any(|p| !index.contains_key(p));
    let ext_out = |n: usize| g.is_sink[n] || g.succs[n].iter().any(|s| !index.contains_key(s));
    let mut src: HashMap<usize, usize> = HashMap::new();
    let mut dst: HashMap<usize, usize> = HashMap::new();
    fn add(m: &mut HashMap<usize, usize>, k: usize) {
        *m.entry(k).or_insert(0) += 1;
    }
    fn remove(m: &mut HashMap<usize, usize>, k: usize) {
        if let Some(c) = m.get_mut(&k) {
            *c -= 1;
            if *c == 0 {
                m.remove(&k);
            }
        }
    }
    for &n in nodes {
        if ext_in(n) {
            add(&mut src, VSOURCE);
            add(&mut dst, n);
        }
    }
    let mut cuts = vec![];
    for (i, &n) in nodes.iter().enumerate() {
        // Move node i to the left side.
        if ext_in(n) {
            remove(&mut src, VSOURCE);
            remove(&mut dst, n);
        }
        for p in &g.preds[n] {
            if index.contains_key(p) {
                remove(&mut src, *p);
                remove(&mut dst, n);
            }
        }
        for s in &g.succs[n] {
            if index.contains_key(s) {
                add(&mut src, n);
                add(&mut dst, *s);
            }
        }
        if ext_out(n) {
            add(&mut src, n);
            add(&mut dst, VSINK);
        }
        if i + 1 < nodes.len() && !src.is_empty() && (src.len() == 1 || dst.len() == 1) {
            cuts.push(i + 1);
        }
    }
    if cuts.is_empty() {
        return Sp::Series(nodes.iter().map(|&n| Sp::Leaf(n)).collect());
    }
    let mut parts = vec![];
    let mut start = 0;
    for c in cuts.into_iter().chain(std::iter::once(nodes.len())) {
        parts.push(decompose(g, &nodes[start..c]));
        start = c;
    }
    Sp::series(parts)
}
