//! Pipeline schedules as data.
//!
//! A [`Schedule`] is one ordered list of [`Action`]s per rank (device) over the virtual
//! stages of a [`Layout`]: a chain (1F1B, GPipe), an interleaved chain (`v` chunks per rank,
//! virtual stage `c·p + r` on rank `r`), a V shape (ZB-V: chunk 0 runs down ranks `0..p`,
//! chunk 1 back up `p-1..=0`), or an arbitrary stage DAG with a stage→rank map (GraphPipe).
//!
//! - [`generators`]: the built-in schedules (compute actions only) — [`builtin_on`] also
//!   builds GPipe, 1F1B, ZB-H1 and ZB-H2 on a stage DAG with one stage per rank — and
//!   [`insert_communication`], which adds `SEND_*`/`RECV_*` actions for cross-rank edges.
//! - [`validate()`]: counts, dependency order and deadlock freedom, before anything runs.
//! - [`search`]: the automatic search of `--schedule auto` (built-ins, their parameters,
//!   greedy weight-gradient placement, local search), simulated under a memory limit.
//! - [`v_greedy`]: ZB-V built round by round at measured costs (what `zb-v` plans use).
//! - [`csv`]: torch.distributed.pipelining's CSV action format (`0F1`, `1I0`, `2W3`, `1B2`).
//! - [`pps`]: ppcc's schedule language (`.pps` programs per rank) and its printer.

pub mod csv;
pub mod generators;
pub mod pps;
pub mod reorder;
pub mod search;
pub mod v_greedy;
pub(crate) mod validate;

pub use generators::{
    builtin, builtin_on, dag_1f1b, dualpipe_v, fill_weight_gradients, gpipe, insert_communication,
    interleaved_1f1b, one_f_one_b, zb_h1, zb_h2, zb_v, zb_v_for, BUILTIN_NAMES,
};
pub use ppir::schedule::{parse_action, Action, ActionKind};
pub use v_greedy::{even_costs, zb_v_greedy, zb_v_measured, zb_v_measured_within};
pub use validate::{validate, ScheduleError};

/// Where virtual stages live and how they depend on each other.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Layout {
    /// A chain of `ranks · chunks` virtual stages; virtual stage `c·ranks + r` is chunk `c`
    /// of rank `r` (`chunks = 1`: the plain chain of 1F1B and GPipe).
    Interleaved { ranks: usize, chunks: usize },
    /// A chain of `2·ranks` virtual stages: stage `s < ranks` on rank `s` (chunk 0), stage
    /// `s ≥ ranks` on rank `2·ranks − 1 − s` (chunk 1).
    VShape { ranks: usize },
    /// A stage DAG: `edges` (producer, consumer) between stages, stage `s` on `rank_of[s]`,
    /// chunk = how many lower-numbered stages share its rank.
    Dag {
        ranks: usize,
        rank_of: Vec<usize>,
        edges: Vec<(usize, usize)>,
    },
}

impl Layout {
    pub fn chain(ranks: usize) -> Self {
        Layout::Interleaved { ranks, chunks: 1 }
    }

    pub fn num_ranks(&self) -> usize {
        match self {
            Layout::Interleaved { ranks, .. }
            | Layout::VShape { ranks }
            | Layout::Dag { ranks, .. } => *ranks,
        }
    }

    pub fn num_virtual_stages(&self) -> usize {
        match self {
            Layout::Interleaved { ranks, chunks } => ranks * chunks,
            Layout::VShape { ranks } => 2 * ranks,
            Layout::Dag { rank_of, .. } => rank_of.len(),
        }
    }

    pub fn num_chunks(&self) -> usize {
        match self {
            Layout::Interleaved { chunks, .. } => *chunks,
            Layout::VShape { .. } => 2,
            Layout::Dag { ranks, rank_of, .. } => (0..*ranks)
                .map(|r| rank_of.iter().filter(|&&x| x == r).count())
                .max()
                .unwrap_or(0),
        }
    }

    pub fn rank_of(&self, stage: usize) -> usize {
        match self {
            Layout::Interleaved { ranks, .. } => stage % ranks,
            Layout::VShape { ranks } => {
                if stage < *ranks {
                    stage
                } else {
                    2 * ranks - 1 - stage
                }
            }
            Layout::Dag { rank_of, .. } => rank_of[stage],
        }
    }

    pub fn chunk_of(&self, stage: usize) -> usize {
        match self {
            Layout::Interleaved { ranks, .. } | Layout::VShape { ranks } => stage / ranks,
            Layout::Dag { rank_of, .. } => rank_of[..stage]
                .iter()
                .filter(|&&r| r == rank_of[stage])
                .count(),
        }
    }

    /// Stages whose forward output `stage` consumes.
    pub fn preds(&self, stage: usize) -> Vec<usize> {
        match self {
            Layout::Dag { edges, .. } => {
                edges.iter().filter(|e| e.1 == stage).map(|e| e.0).collect()
            }
            _ => {
                if stage == 0 {
                    vec![]
                } else {
                    vec![stage - 1]
                }
            }
        }
    }

    /// Stages that consume `stage`'s forward output.
    pub fn succs(&self, stage: usize) -> Vec<usize> {
        match self {
            Layout::Dag { edges, .. } => {
                edges.iter().filter(|e| e.0 == stage).map(|e| e.1).collect()
            }
            _ => {
                if stage + 1 < self.num_virtual_stages() {
                    vec![stage + 1]
                } else {
                    vec![]
                }
            }
        }
    }
}

/// Per-rank instruction streams over micro-batches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// Ranks (devices); each runs `num_chunks` virtual stages at most.
    pub num_stages: usize,
    pub num_microbatches: usize,
    /// Virtual stages per rank.
    pub num_chunks: usize,
    pub layout: Layout,
    pub per_rank: Vec<Vec<Action>>,
}

impl Schedule {
    /// An empty schedule (no actions) over `layout`.
    pub fn empty(layout: Layout, num_microbatches: usize) -> Self {
        Schedule {
            num_stages: layout.num_ranks(),
            num_microbatches,
            num_chunks: layout.num_chunks(),
            per_rank: vec![vec![]; layout.num_ranks()],
            layout,
        }
    }

    /// Append `kind` of (`stage`, `micro_batch`) to the stage's rank.
    pub fn push(&mut self, kind: ActionKind, stage: usize, micro_batch: usize) {
        let rank = self.layout.rank_of(stage);
        let chunk = self.layout.chunk_of(stage);
        self.per_rank[rank].push(Action::new(kind, stage, micro_batch, chunk));
    }

    pub fn num_virtual_stages(&self) -> usize {
        self.layout.num_virtual_stages()
    }
}
