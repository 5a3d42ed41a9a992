//! The schedule validator, and the in-order executor it shares with the simulator.

use std::collections::HashMap;
use std::fmt;

use super::{Action, ActionKind, Layout, Schedule};

/// Why a schedule (or a request for one) is not acceptable.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScheduleError {
    /// Bad parameters or an unknown name.
    #[error("{0}")]
    Invalid(String),
    /// A specific action is wrong.
    #[error("rank {rank}, position {position}: {message}")]
    Action {
        rank: usize,
        position: usize,
        message: String,
    },
    /// A required action is absent.
    #[error("{0}")]
    Missing(String),
    /// No rank can make progress; the first blocked action of each blocked rank.
    #[error("deadlock: {}", format_blocked(.0))]
    Deadlock(Vec<Blocked>),
    /// A CSV cell is malformed, or the action in it is wrong.
    #[error("row {row}, column {col} (cell `{cell}`): {message}")]
    Csv {
        row: usize,
        col: usize,
        cell: String,
        message: String,
    },
    /// A CSV cell that names no action of the layout.
    #[error("row {row}, column {col} (cell `{cell}`): {source}")]
    CsvCell {
        row: usize,
        col: usize,
        cell: String,
        source: super::csv::CellError,
    },
}

/// A rank stuck at `position` on `action`, waiting for `waits_for`.
#[derive(Debug, Clone, PartialEq)]
pub struct Blocked {
    pub rank: usize,
    pub position: usize,
    pub action: Action,
    pub waits_for: Action,
}

impl fmt::Display for Blocked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rank {}, position {}: {} waits for {}",
            self.rank,
            self.position,
            self.action.explain(),
            self.waits_for
        )
    }
}

fn format_blocked(b: &[Blocked]) -> String {
    b.iter()
        .map(|b| b.to_string())
        .collect::<Vec<_>>()
        .join("; ")
}

/// What an action produces, for dependency lookup: a fused backward fills both `B` and `W`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Slot {
    F,
    B,
    W,
    Opt,
    SendF,
    RecvF,
    SendB,
    RecvB,
}

pub(crate) type Key = (Slot, usize, usize);

fn slots(kind: ActionKind) -> &'static [Slot] {
    match kind {
        ActionKind::Forward => &[Slot::F],
        ActionKind::BackwardInput => &[Slot::B],
        ActionKind::BackwardWeight => &[Slot::W],
        ActionKind::FullBackward => &[Slot::B, Slot::W],
        ActionKind::SendF => &[Slot::SendF],
        ActionKind::RecvF => &[Slot::RecvF],
        ActionKind::SendB => &[Slot::SendB],
        ActionKind::RecvB => &[Slot::RecvB],
        ActionKind::OptimizerStep => &[Slot::Opt],
    }
}

/// The actions `a` needs finished before it starts, each with whether the data crosses ranks
/// (and so pays the link time).
pub(crate) fn deps(layout: &Layout, m_total: usize, a: &Action) -> Vec<(Key, bool)> {
    let (s, m) = (a.stage, a.micro_batch);
    let r = layout.rank_of(s);
    let cross = |q: usize| layout.rank_of(q) != r;
    match a.kind {
        ActionKind::Forward => layout
            .preds(s)
            .into_iter()
            .map(|q| ((Slot::F, q, m), cross(q)))
            .collect(),
        ActionKind::BackwardInput | ActionKind::FullBackward => {
            let mut d = vec![((Slot::F, s, m), false)];
            d.extend(
                layout
                    .succs(s)
                    .into_iter()
                    .map(|q| ((Slot::B, q, m), cross(q))),
            );
            d
        }
        ActionKind::BackwardWeight => vec![((Slot::B, s, m), false)],
        ActionKind::OptimizerStep => (0..m_total).map(|i| ((Slot::W, s, i), false)).collect(),
        ActionKind::SendF => vec![((Slot::F, s, m), false)],
        ActionKind::SendB => vec![((Slot::B, s, m), false)],
        ActionKind::RecvF => layout
            .preds(s)
            .into_iter()
            .filter(|&q| cross(q))
            .map(|q| ((Slot::SendF, q, m), true))
            .collect(),
        ActionKind::RecvB => layout
            .succs(s)
            .into_iter()
            .filter(|&q| cross(q))
            .map(|q| ((Slot::SendB, q, m), true))
            .collect(),
    }
}

/// Where each action sits: key → (rank, position).
pub(crate) fn index(schedule: &Schedule) -> Result<HashMap<Key, (usize, usize)>, ScheduleError> {
    let mut pos = HashMap::new();
    for (rank, list) in schedule.per_rank.iter().enumerate() {
        for (i, a) in list.iter().enumerate() {
            for &slot in slots(a.kind) {
                if let Some((r0, p0)) = pos.insert((slot, a.stage, a.micro_batch), (rank, i)) {
                    return Err(ScheduleError::Action {
                        rank,
                        position: i,
                        message: format!(
                            "{} repeats the action at rank {r0}, position {p0}",
                            a.explain()
                        ),
                    });
                }
            }
        }
    }
    Ok(pos)
}

/// Start, end and the action that decided the start (`None`: the rank's start), per rank
/// and position.
pub(crate) type Timing = Vec<Vec<(f64, f64, Option<(usize, usize)>)>>;

/// Run every rank's list in order, each action as soon as its rank is free and its
/// dependencies are done, plus `comm(from, to)` for data from another rank: `from` is the
/// virtual stage of the dependency, `to` that of the waiting action (a gradient goes back
/// over the forward edge `to → from`).
pub(crate) fn execute(
    schedule: &Schedule,
    duration: &dyn Fn(&Action) -> f64,
    comm: &dyn Fn(usize, usize) -> f64,
) -> Result<Timing, ScheduleError> {
    let pos = index(schedule)?;
    let layout = &schedule.layout;
    let p = schedule.per_rank.len();
    let mut timing: Timing = schedule
        .per_rank
        .iter()
        .map(|l| Vec::with_capacity(l.len()))
        .collect();
    let mut clock = vec![0.0f64; p];
    loop {
        let mut progressed = false;
        for r in 0..p {
            while timing[r].len() < schedule.per_rank[r].len() {
                let i = timing[r].len();
                let a = &schedule.per_rank[r][i];
                let mut start = clock[r];
                let mut why = if i > 0 { Some((r, i - 1)) } else { None };
                let mut ready = true;
                for (key, cross) in deps(layout, schedule.num_microbatches, a) {
                    let Some(&(dr, di)) = pos.get(&key) else {
                        continue;
                    };
                    let Some(&(_, end, _)) = timing[dr].get(di) else {
                        ready = false;
                        break;
                    };
                    let t = end + if cross { comm(key.1, a.stage) } else { 0.0 };
                    if t > start {
                        start = t;
                        why = Some((dr, di));
                    }
                }
                if !ready {
                    break;
                }
                let end = start + duration(a);
                timing[r].push((start, end, why));
                clock[r] = end;
                progressed = true;
            }
        }
        if timing
            .iter()
            .zip(&schedule.per_rank)
            .all(|(t, l)| t.len() == l.len())
        {
            return Ok(timing);
        }
        if !progressed {
            let mut blocked = vec![];
            for r in 0..p {
                let i = timing[r].len();
                let Some(a) = schedule.per_rank[r].get(i) else {
                    continue;
                };
                let waits = deps(layout, schedule.num_microbatches, a)
                    .into_iter()
                    .filter_map(|(k, _)| pos.get(&k))
                    .find(|&&(dr, di)| timing[dr].len() <= di)
                    .map(|&(dr, di)| schedule.per_rank[dr][di]);
                blocked.push(Blocked {
                    rank: r,
                    position: i,
                    action: *a,
                    waits_for: waits.unwrap_or(*a),
                });
            }
            return Err(ScheduleError::Deadlock(blocked));
        }
    }
}

/// Check `schedule` before anything runs: every action on its stage's rank and in range,
/// exactly one `F`, one `I`-or-`B` and one `W`-or-`B` per (virtual stage, micro-batch), every
/// dependency present and, on the same rank, earlier, and no deadlock.
pub fn validate(schedule: &Schedule) -> Result<(), ScheduleError> {
    let layout = &schedule.layout;
    let nv = layout.num_virtual_stages();
    let m = schedule.num_microbatches;
    if schedule.per_rank.len() != layout.num_ranks() {
        return Err(ScheduleError::Invalid(format!(
            "the schedule has {} ranks, its layout {}",
            schedule.per_rank.len(),
            layout.num_ranks()
        )));
    }
    for (rank, list) in schedule.per_rank.iter().enumerate() {
        for (i, a) in list.iter().enumerate() {
            let err = |message: String| ScheduleError::Action {
                rank,
                position: i,
                message,
            };
            if a.stage >= nv {
                return Err(err(format!(
                    "{a}: stage {} does not exist (there are {nv})",
                    a.stage
                )));
            }
            if a.kind != ActionKind::OptimizerStep && a.micro_batch >= m {
                return Err(err(format!(
                    "{a}: micro-batch {} does not exist (there are {m})",
                    a.micro_batch
                )));
            }
            if layout.rank_of(a.stage) != rank {
                return Err(err(format!(
                    "{} belongs on rank {}",
                    a.explain(),
                    layout.rank_of(a.stage)
                )));
            }
        }
    }
    let pos = index(schedule)?;
    for s in 0..nv {
        for mb in 0..m {
            for (slot, kind) in [
                (Slot::F, ActionKind::Forward),
                (Slot::B, ActionKind::BackwardInput),
                (Slot::W, ActionKind::BackwardWeight),
            ] {
                if !pos.contains_key(&(slot, s, mb)) {
                    let a = Action::new(kind, s, mb, layout.chunk_of(s));
                    let what = match slot {
                        Slot::F => a.explain(),
                        Slot::B => {
                            format!("{a} or {s}B{mb} (backward of micro-batch {mb} on stage {s})")
                        }
                        _ => format!(
                            "{a} or {s}B{mb} (weight gradient of micro-batch {mb} on stage {s})"
                        ),
                    };
                    return Err(ScheduleError::Missing(format!(
                        "rank {}: missing {what}",
                        layout.rank_of(s)
                    )));
                }
            }
        }
    }
    for (rank, list) in schedule.per_rank.iter().enumerate() {
        for (i, a) in list.iter().enumerate() {
            for (key, _) in deps(layout, m, a) {
                let Some(&(dr, di)) = pos.get(&key) else {
                    return Err(ScheduleError::Action {
                        rank,
                        position: i,
                        message: format!(
                            "{} needs an action the schedule lacks ({:?} of stage {}, micro-batch {})",
                            a.explain(),
                            key.0,
                            key.1,
                            key.2
                        ),
                    });
                };
                if dr == rank && di > i {
                    return Err(ScheduleError::Action {
                        rank,
                        position: i,
                        message: format!(
                            "{} runs before {} on which it depends",
                            a.explain(),
                            schedule.per_rank[dr][di]
                        ),
                    });
                }
            }
        }
    }
    execute(schedule, &|_| 1.0, &|_, _| 0.0).map(|_| ())
}
