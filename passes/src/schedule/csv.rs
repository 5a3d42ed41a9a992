//! torch.distributed.pipelining's CSV action format: one row per rank, one action per cell
//! (`{stage}{code}{micro}`: `0F1` forward, `1I0` input gradient, `2W3` weight gradient,
//! `1B2` fused backward, `0SEND_F1`, `1RECV_B2`, …; ppcc adds `3OPT`); an empty cell is an
//! idle slot. Stage numbers are virtual stages of the [`Layout`] given on import.

use super::{parse_action, validate, Action, ActionKind, Layout, Schedule, ScheduleError};
use ppir::schedule::ActionParseError;

/// The schedule as CSV, one line per rank, no header, no idle cells: every action,
/// transfers and ppcc's `OPT` included (torch's `compute_comms` form, plus `OPT`).
pub fn to_csv(schedule: &Schedule) -> String {
    to_csv_as(schedule, CsvFormat::ComputeComms)
}

/// Which actions a CSV file lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CsvFormat {
    /// Compute actions only (`F`, `I`, `W`, `B`): torch's default `compute_only` form,
    /// which its loader reads as it is; the transfers follow from the stage layout.
    ComputeOnly,
    /// Every action, `SEND_*`/`RECV_*` (torch's `compute_comms`) and ppcc's `OPT` included.
    ComputeComms,
}

/// The schedule as CSV in `format`. A stage DAG, which torch's layouts cannot express,
/// starts with a `#` comment line giving its edges and stage-to-rank map (ppcc's reader
/// skips `#` lines).
pub fn to_csv_as(schedule: &Schedule, format: CsvFormat) -> String {
    let mut out = String::new();
    if let Layout::Dag { rank_of, edges, .. } = &schedule.layout {
        // A chain with stage s on rank s is torch's plain layout: no comment.
        let chain = rank_of.iter().enumerate().all(|(s, &r)| s == r)
            && edges.len() + 1 == rank_of.len()
            && edges
                .iter()
                .enumerate()
                .all(|(i, &(a, b))| a == i && b == i + 1);
        if chain {
            return to_rows(schedule, format, out);
        }
        let e: Vec<String> = edges.iter().map(|(a, b)| format!("{a}->{b}")).collect();
        out.push_str(&format!(
            "# ppcc stage DAG (not a torch layout): stage ranks {rank_of:?}, edges [{}]\n",
            e.join(", ")
        ));
    }
    to_rows(schedule, format, out)
}

/// `out` followed by one CSV row per rank.
fn to_rows(schedule: &Schedule, format: CsvFormat, mut out: String) -> String {
    for list in &schedule.per_rank {
        let cells: Vec<String> = list
            .iter()
            .filter(|a| {
                format == CsvFormat::ComputeComms
                    || matches!(
                        a.kind,
                        ActionKind::Forward
                            | ActionKind::BackwardInput
                            | ActionKind::BackwardWeight
                            | ActionKind::FullBackward
                    )
            })
            .map(|a| a.to_string())
            .collect();
        out.push_str(&cells.join(","));
        out.push('\n');
    }
    out
}

/// Why a CSV cell names no action of the layout.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CellError {
    #[error(transparent)]
    Parse(#[from] ActionParseError),
    #[error("stage {stage} does not exist (the layout has {stages} stages)")]
    NoStage { stage: usize, stages: usize },
}

fn parse_cell(cell: &str, layout: &Layout) -> Result<Action, CellError> {
    let (kind, stage, micro_batch) = parse_action(cell)?;
    if stage >= layout.num_virtual_stages() {
        return Err(CellError::NoStage {
            stage,
            stages: layout.num_virtual_stages(),
        });
    }
    Ok(Action::new(
        kind,
        stage,
        micro_batch,
        layout.chunk_of(stage),
    ))
}

/// Read a CSV schedule over `layout`, then [`validate`] it; errors name the row and column
/// (both from 1) and the cell's text. The number of micro-batches is one more than the
/// largest micro-batch number.
pub fn from_csv(text: &str, layout: Layout) -> Result<Schedule, ScheduleError> {
    let mut schedule = Schedule::empty(layout.clone(), 0);
    let mut columns: Vec<Vec<(usize, String)>> = vec![];
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .collect();
    if rows.len() != layout.num_ranks() {
        return Err(ScheduleError::Invalid(format!(
            "the CSV has {} rows, one per rank was expected ({} ranks)",
            rows.len(),
            layout.num_ranks()
        )));
    }
    let mut max_micro = None;
    for (row, line) in rows.iter().enumerate() {
        let mut cols = vec![];
        for (col, cell) in line.split(',').enumerate() {
            let cell = cell.trim();
            if cell.is_empty() {
                continue;
            }
            let a = parse_cell(cell, &layout).map_err(|source| ScheduleError::CsvCell {
                row: row + 1,
                col: col + 1,
                cell: cell.to_string(),
                source,
            })?;
            if layout.rank_of(a.stage) != row {
                return Err(ScheduleError::Csv {
                    row: row + 1,
                    col: col + 1,
                    cell: cell.to_string(),
                    message: format!(
                        "stage {} runs on rank {}, this row is rank {row}",
                        a.stage,
                        layout.rank_of(a.stage)
                    ),
                });
            }
            if a.kind != ActionKind::OptimizerStep {
                max_micro = max_micro.max(Some(a.micro_batch));
            }
            schedule.per_rank[row].push(a);
            cols.push((col + 1, cell.to_string()));
        }
        columns.push(cols);
    }
    schedule.num_microbatches = max_micro.map_or(0, |m| m + 1);
    let at = |rank: usize, position: usize, message: String| {
        let (col, cell) = columns[rank][position].clone();
        ScheduleError::Csv {
            row: rank + 1,
            col,
            cell,
            message,
        }
    };
    match validate(&schedule) {
        Ok(()) => Ok(schedule),
        Err(ScheduleError::Action {
            rank,
            position,
            message,
        }) => Err(at(rank, position, message)),
        Err(ScheduleError::Deadlock(blocked)) => {
            let b = &blocked[0];
            let all = ScheduleError::Deadlock(blocked.clone()).to_string();
            Err(at(b.rank, b.position, all))
        }
        Err(e) => Err(e),
    }
}
