//! Exact extraction: the choice of one e-node per needed e-class that minimises the total
//! cost of the chosen nodes, each counted once (a DAG cost, where the greedy extractor
//! counts a shared subterm once per use), as an integer linear program solved by `microlp`
//! (through `good_lp`) within a time limit.
//!
//! Variables: `x_n ∈ {0, 1}` per allowed e-node of a class reachable from the roots (a
//! forced class allows only its forced node; invalid classes, and nodes reading them, are
//! not allowed), and a level `t_c ∈ [0, C]` per class. Constraints: each class picks at
//! most one node, a root exactly one; a picked node's child classes pick one; and
//! `t_c ≥ t_d + 1` whenever a node of `c` with child `d` is picked (big-M form), so the
//! choice is acyclic. Objective: `Σ cost(n) · x_n`. The greedy choice is the warm start.
//! [`extract_with`] takes other costs and an optional budget `Σ w(n) · x_n ≤ B` on a
//! second cost (recomputation: extra time, under a bound on the bytes kept).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use egg::{Id, Language};
use good_lp::{
    constraint, microlp, variable, Expression, ProblemVariables, ResolutionError, Solution,
    SolutionStatus, SolverModel, Variable, WithInitialSolution, WithTimeLimit,
};

use super::egraph::{node_cost, PpEGraph, PpNode};

/// What the ILP found.
pub struct IlpChoice {
    /// The node of every class of the chosen term.
    pub nodes: HashMap<Id, PpNode>,
    /// Its DAG cost.
    pub cost: f64,
    /// Whether the solver proved it optimal (else the time limit stopped it).
    pub optimal: bool,
}

/// The DAG cost of a choice: each class reachable from `roots` counted once.
pub fn dag_cost(eg: &PpEGraph, roots: &[Id], choice: &dyn Fn(Id) -> Option<PpNode>) -> f64 {
    dag_cost_by(eg, roots, choice, &|_, n| node_cost(eg, n))
}

/// [`dag_cost`] with another node cost.
pub fn dag_cost_by(
    eg: &PpEGraph,
    roots: &[Id],
    choice: &dyn Fn(Id) -> Option<PpNode>,
    cost: &dyn Fn(Id, &PpNode) -> f64,
) -> f64 {
    let mut seen = HashSet::new();
    let mut stack: Vec<Id> = roots.iter().map(|&r| eg.find(r)).collect();
    let mut total = 0.0;
    while let Some(c) = stack.pop() {
        if !seen.insert(c) {
            continue;
        }
        let Some(n) = choice(c) else {
            return f64::INFINITY;
        };
        total += cost(c, &n);
        stack.extend(n.children().iter().map(|&ch| eg.find(ch)));
    }
    total
}

/// The least-DAG-cost choice for `roots`, `greedy` as the warm start; `None` when the
/// solver fails or finds nothing within `limit`.
pub fn extract(
    eg: &PpEGraph,
    roots: &[Id],
    forced: &HashMap<Id, PpNode>,
    greedy: &HashMap<Id, PpNode>,
    limit: Duration,
) -> Option<IlpChoice> {
    let cost = |_: Id, n: &PpNode| node_cost(eg, n);
    let allowed = |c: Id, n: &PpNode| forced.get(&c).is_none_or(|f| f == n);
    extract_with(
        eg,
        roots,
        &IlpProblem {
            allowed: &allowed,
            cost: &cost,
            budget: None,
        },
        greedy,
        limit,
    )
}

/// A cost of choosing an e-node for an e-class.
pub type NodeCost<'a> = &'a dyn Fn(Id, &PpNode) -> f64;

/// What [`extract_with`] minimises, and under which constraint.
pub struct IlpProblem<'a> {
    /// Whether node `n` may be chosen for class `c` (nodes reading invalid classes and
    /// nodes of infinite cost never are).
    pub allowed: &'a dyn Fn(Id, &PpNode) -> bool,
    /// The objective's cost of choosing `n` for class `c`.
    pub cost: NodeCost<'a>,
    /// A second cost, summed the same way (each chosen class once), that must stay at
    /// most the given bound (e.g. bytes kept in memory).
    pub budget: Option<(NodeCost<'a>, f64)>,
}

/// The least-cost choice for `roots` under `p` (DAG cost: each class counted once),
/// `greedy` as the warm start; `None` when the solver fails or finds nothing within
/// `limit`. The returned cost is `p.cost`'s.
pub fn extract_with(
    eg: &PpEGraph,
    roots: &[Id],
    p: &IlpProblem,
    greedy: &HashMap<Id, PpNode>,
    limit: Duration,
) -> Option<IlpChoice> {
    let roots: Vec<Id> = roots.iter().map(|&r| eg.find(r)).collect();
    // Classes reachable from the roots through allowed nodes.
    let allowed = |c: Id, n: &PpNode| -> bool {
        (p.allowed)(c, n)
            && n.children().iter().all(|&ch| eg[ch].data.invalid.is_none())
            && (p.cost)(c, n).is_finite()
    };
    let mut classes: Vec<Id> = vec![];
    let mut index: HashMap<Id, usize> = HashMap::new();
    let mut stack = roots.clone();
    while let Some(c) = stack.pop() {
        let c = eg.find(c);
        if index.contains_key(&c) || eg[c].data.invalid.is_some() {
            continue;
        }
        index.insert(c, classes.len());
        classes.push(c);
        for n in eg[c].nodes.iter().filter(|n| allowed(c, n)) {
            stack.extend(n.children().iter().map(|&ch| eg.find(ch)));
        }
    }
    let big = classes.len() as f64 + 1.0;
    let mut vars = ProblemVariables::new();
    let mut picks: Vec<Vec<(Variable, PpNode, f64)>> = vec![];
    let mut weights: Vec<Vec<f64>> = vec![];
    let levels: Vec<Variable> = classes
        .iter()
        .map(|_| vars.add(variable().min(0.0).max(big)))
        .collect();
    for &c in &classes {
        let mut v = vec![];
        for n in eg[c].nodes.iter().filter(|n| allowed(c, n)) {
            v.push((vars.add(variable().binary()), n.clone(), (p.cost)(c, n)));
        }
        weights.push(
            v.iter()
                .map(|(_, n, _)| p.budget.as_ref().map_or(0.0, |(w, _)| w(c, n)))
                .collect(),
        );
        picks.push(v);
    }
    let objective: Expression = picks.iter().flatten().map(|(x, _, cost)| *cost * *x).sum();
    let mut model = vars.minimise(objective).using(microlp);
    if let Some((_, bound)) = p.budget {
        let used: Expression = picks
            .iter()
            .zip(&weights)
            .flat_map(|(v, w)| v.iter().zip(w).map(|((x, _, _), w)| *w * *x))
            .sum();
        model = model.with(constraint!(used <= bound));
    }
    for (i, &c) in classes.iter().enumerate() {
        let any: Expression = picks[i].iter().map(|(x, _, _)| *x).sum();
        if roots.contains(&c) {
            model = model.with(constraint!(any == 1.0));
        } else {
            model = model.with(constraint!(any <= 1.0));
        }
        for (x, n, _) in &picks[i] {
            for &ch in n.children() {
                let j = *index.get(&eg.find(ch))?;
                let child: Expression = picks[j].iter().map(|(y, _, _)| *y).sum();
                model = model.with(constraint!(child - *x >= 0.0));
                let (tc, td) = (levels[i], levels[j]);
                model = model.with(constraint!(tc - td - big * *x >= 1.0 - big));
            }
        }
    }
    // Warm start: the greedy choice (levels by depth below each class).
    let mut start: Vec<(Variable, f64)> = vec![];
    let mut depth: HashMap<Id, f64> = HashMap::new();
    fn depth_of(
        eg: &PpEGraph,
        greedy: &HashMap<Id, PpNode>,
        c: Id,
        memo: &mut HashMap<Id, f64>,
        on_path: &mut HashSet<Id>,
    ) -> Option<f64> {
        if let Some(&d) = memo.get(&c) {
            return Some(d);
        }
        if !on_path.insert(c) {
            return None;
        }
        let n = greedy.get(&c)?;
        let mut d: f64 = 0.0;
        for &ch in n.children() {
            d = d.max(depth_of(eg, greedy, eg.find(ch), memo, on_path)? + 1.0);
        }
        on_path.remove(&c);
        memo.insert(c, d);
        Some(d)
    }
    let mut warm = true;
    for &r in &roots {
        warm &= depth_of(eg, greedy, r, &mut depth, &mut HashSet::new()).is_some();
    }
    if warm {
        for (i, &c) in classes.iter().enumerate() {
            let chosen = depth.contains_key(&c).then(|| greedy.get(&c)).flatten();
            for (x, n, _) in &picks[i] {
                start.push((*x, f64::from(u8::from(chosen == Some(n)))));
            }
            start.push((levels[i], depth.get(&c).copied().unwrap_or(0.0)));
        }
        model = model.with_initial_solution(start);
    }
    let solution = match model.with_time_limit(limit.as_secs_f64()).solve() {
        Ok(s) => s,
        Err(ResolutionError::Other(_)) | Err(_) => return None,
    };
    let optimal = matches!(solution.status(), SolutionStatus::Optimal);
    let mut nodes = HashMap::new();
    for (i, &c) in classes.iter().enumerate() {
        if let Some((_, n, _)) = picks[i].iter().find(|(x, _, _)| solution.value(*x) > 0.5) {
            nodes.insert(c, n.clone());
        }
    }
    let cost = dag_cost_by(eg, &roots, &|c| nodes.get(&eg.find(c)).cloned(), p.cost);
    cost.is_finite().then_some(IlpChoice {
        nodes,
        cost,
        optimal,
    })
}
