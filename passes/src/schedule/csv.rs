//! torch.distributed.pipelining's CSV action format: one row per rank, one action per cell
//! (`{stage}{code}{micro}`: `0F1` forward, `1I0` input gradient, `2W3` weight gradient,
//! `1B2` fused backward, `0SEND_F1`, `1RECV_B2`, …; ppcc adds `3OPT`); an empty cell is an
//! idle slot. Stage numbers are virtual stages of the [`Layout`] given on import.
//! torch's other cells: `(0F3;3B1)OVERLAP_F_B` (an overlapped pair) becomes its actions
//! in order, `{stage}REDUCE_GRAD` is dropped (ppcc all-reduces a stage's gradients after
//! its last weight gradient by itself), `UNSHARD`/`RESHARD` (FSDP) are refused naming the
//! cell. Lines starting with `#` are comments.

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
    /// torch's FSDP actions inside the pipeline.
    #[error("{kind} (FSDP inside the pipeline: gather or free a sharded stage's weights) has no counterpart in ppcc yet; remove the cell, or export the schedule without FSDP")]
    Fsdp { kind: &'static str },
    #[error(
        "an OVERLAP_F_B cell is `(ACTION;ACTION...)OVERLAP_F_B` with compute actions inside: {0}"
    )]
    Overlap(String),
}

/// The actions of one torch cell: one action; the sub-actions of an overlapped pair
/// `(0F3;3B1)OVERLAP_F_B`, in order (torch runs them one after the other); none for
/// `{stage}REDUCE_GRAD` (ppcc reduces a stage's gradients itself after its last weight
/// gradient). `UNSHARD`/`RESHARD` (FSDP) are refused.
fn parse_cell_actions(cell: &str, layout: &Layout) -> Result<Vec<Action>, CellError> {
    if let Some(inner) = cell
        .strip_suffix("OVERLAP_F_B")
        .and_then(|c| c.strip_prefix('('))
        .and_then(|c| c.strip_suffix(')'))
    {
        let subs: Vec<&str> = inner.split(';').map(str::trim).collect();
        if subs.len() < 2 || subs.iter().any(|s| s.is_empty()) {
            return Err(CellError::Overlap("fewer than two actions".into()));
        }
        let mut out = vec![];
        for s in subs {
            let a = parse_cell(s, layout)?;
            if !matches!(
                a.kind,
                ActionKind::Forward
                    | ActionKind::BackwardInput
                    | ActionKind::BackwardWeight
                    | ActionKind::FullBackward
            ) {
                return Err(CellError::Overlap(format!("`{s}` is not a compute action")));
            }
            out.push(a);
        }
        return Ok(out);
    }
    let digits = cell.bytes().take_while(u8::is_ascii_digit).count();
    let (stage, rest) = cell.split_at(digits);
    let fsdp = match rest {
        "UNSHARD" => Some("UNSHARD"),
        "RESHARD" => Some("RESHARD"),
        _ => None,
    };
    if let Some(kind) = fsdp {
        return Err(CellError::Fsdp { kind });
    }
    if rest == "REDUCE_GRAD" && digits > 0 {
        let stage: usize = stage.parse().map_err(|_| CellError::NoStage {
            stage: usize::MAX,
            stages: layout.num_virtual_stages(),
        })?;
        if stage >= layout.num_virtual_stages() {
            return Err(CellError::NoStage {
                stage,
                stages: layout.num_virtual_stages(),
            });
        }
        return Ok(vec![]);
    }
    Ok(vec![parse_cell(cell, layout)?])
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

/// The layout a CSV file's cells imply, as torch infers it: the row each stage appears in
/// is its rank. Stage `s` on row `s mod ranks` for every stage is an interleaved chain of
/// `stages / ranks` chunks (one chunk: the plain chain); stages `s` and `2·ranks − 1 − s`
/// on row `s` is the V shape. Anything else is an error naming a stage that fits neither.
pub fn infer_layout(text: &str, ranks: usize) -> Result<Layout, ScheduleError> {
    let mut row_of: std::collections::BTreeMap<usize, usize> = Default::default();
    let rows = text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'));
    for (row, line) in rows.enumerate() {
        for cell in line.split(',').map(str::trim).filter(|c| !c.is_empty()) {
            let inner = cell
                .strip_suffix("OVERLAP_F_B")
                .and_then(|c| c.strip_prefix('('))
                .and_then(|c| c.strip_suffix(')'));
            let parts: Vec<&str> = match inner {
                Some(i) => i.split(';').map(str::trim).collect(),
                None => vec![cell],
            };
            for p in parts {
                let digits = p.bytes().take_while(u8::is_ascii_digit).count();
                // Cells without a stage are the reader's to report.
                let Ok(stage) = p[..digits].parse::<usize>() else {
                    continue;
                };
                if let Some(&other) = row_of.get(&stage) {
                    if other != row {
                        return Err(ScheduleError::Invalid(format!(
                            "stage {stage} appears on rows {} and {}: a stage runs on one rank",
                            other + 1,
                            row + 1
                        )));
                    }
                }
                row_of.insert(stage, row);
            }
        }
    }
    let stages = row_of.keys().next_back().map_or(0, |&s| s + 1);
    if ranks == 0 || stages == 0 {
        return Ok(Layout::chain(ranks));
    }
    let interleaved = stages.is_multiple_of(ranks) && row_of.iter().all(|(&s, &r)| r == s % ranks);
    if interleaved {
        return Ok(Layout::Interleaved {
            ranks,
            chunks: stages / ranks,
        });
    }
    let v = Layout::VShape { ranks };
    if stages == 2 * ranks && row_of.iter().all(|(&s, &r)| r == v.rank_of(s)) {
        return Ok(v);
    }
    let (s, r) = row_of
        .iter()
        .find(|(&s, &r)| r != s % ranks)
        .map_or((0, 0), |(&s, &r)| (s, r));
    Err(ScheduleError::Invalid(format!(
        "the CSV's stage-to-rank layout is neither an interleaved chain (stage s on row s mod {ranks}) nor a V (stages s and {} − s on row s): stage {s} is on row {}",
        2 * ranks - 1,
        r + 1
    )))
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
            let actions =
                parse_cell_actions(cell, &layout).map_err(|source| ScheduleError::CsvCell {
                    row: row + 1,
                    col: col + 1,
                    cell: cell.to_string(),
                    source,
                })?;
            for a in actions {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Cells as torch writes them for DualPipeV-style and FSDP schedules.
    #[test]
    fn torch_cells_overlap_reduce_grad_and_fsdp() {
        let v = Layout::VShape { ranks: 2 };
        // 2 ranks, V layout (stages 0,3 on rank 0; 1,2 on rank 1), 2 micro-batches:
        // rank 0 pairs the second forward of stage 0 with stage 3's first backward.
        let text = "0F0,3F0,3B0,(0F1;3F1)OVERLAP_F_B,3B1,0B0,0B1,0REDUCE_GRAD,3REDUCE_GRAD\n\
                    1F0,2F0,1F1,2F1,2B0,1B0,2B1,1B1\n";
        // The pair is two compute actions in order; REDUCE_GRAD cells add nothing.
        let s = from_csv(text, v.clone()).unwrap();
        let rank0: Vec<String> = s.per_rank[0].iter().map(|a| a.to_string()).collect();
        assert_eq!(
            rank0,
            ["0F0", "3F0", "3B0", "0F1", "3F1", "3B1", "0B0", "0B1"]
        );
        assert_eq!(s.num_microbatches, 2);
        // FSDP cells are refused, naming the cell.
        let e = from_csv(&text.replace("0REDUCE_GRAD", "0UNSHARD"), v.clone()).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("0UNSHARD") && msg.contains("no counterpart in ppcc"),
            "{msg}"
        );
        let e = from_csv(&text.replace("3REDUCE_GRAD", "3RESHARD"), v.clone()).unwrap_err();
        assert!(e.to_string().contains("RESHARD"), "{e}");
        // Malformed pairs and unknown stages.
        for bad in [
            "(0F1)OVERLAP_F_B",
            "(0F1;)OVERLAP_F_B",
            "(0F1;3SEND_B1)OVERLAP_F_B",
        ] {
            let e = from_csv(&text.replace("(0F1;3F1)OVERLAP_F_B", bad), v.clone()).unwrap_err();
            assert!(e.to_string().contains("OVERLAP_F_B"), "{bad}: {e}");
        }
        let e = from_csv(&text.replace("3REDUCE_GRAD", "9REDUCE_GRAD"), v.clone()).unwrap_err();
        assert!(e.to_string().contains("stage 9 does not exist"), "{e}");
        // Comment lines are skipped.
        assert_eq!(from_csv(&format!("# a comment\n{text}"), v).unwrap(), s);
    }

    #[test]
    fn compute_only_leaves_out_transfers() {
        let s = crate::schedule::insert_communication(&crate::schedule::one_f_one_b(2, 2));
        let only = to_csv_as(&s, CsvFormat::ComputeOnly);
        assert!(!only.contains("SEND") && !only.contains("RECV"), "{only}");
        assert!(to_csv(&s).contains("0SEND_F0"));
        // Both read back to schedules with the same compute actions.
        let a = from_csv(&only, Layout::chain(2)).unwrap();
        let b = from_csv(&to_csv(&s), Layout::chain(2)).unwrap();
        let compute = |s: &Schedule| -> Vec<Vec<String>> {
            s.per_rank
                .iter()
                .map(|l| {
                    l.iter()
                        .filter(|a| {
                            !a.to_string().contains("SEND") && !a.to_string().contains("RECV")
                        })
                        .map(|a| a.to_string())
                        .collect()
                })
                .collect()
        };
        assert_eq!(compute(&a), compute(&b));
    }

    #[test]
    fn layouts_are_inferred_from_the_rows() {
        use crate::schedule::{interleaved_1f1b, one_f_one_b, zb_v};
        let chain = to_csv(&one_f_one_b(3, 4));
        assert_eq!(infer_layout(&chain, 3).unwrap(), Layout::chain(3));
        let inter = to_csv(&interleaved_1f1b(2, 4, 2).unwrap());
        assert_eq!(
            infer_layout(&inter, 2).unwrap(),
            Layout::Interleaved {
                ranks: 2,
                chunks: 2
            }
        );
        let v = to_csv(&zb_v(2, 4));
        assert_eq!(infer_layout(&v, 2).unwrap(), Layout::VShape { ranks: 2 });
        // Stage 1 on row 1 and stage 2 on row 1 of 3 rows: neither layout.
        let e = infer_layout("0F0\n1F0,2F0\n\n", 3).unwrap_err();
        assert!(e.to_string().contains("stage 2 is on row 2"), "{e}");
        let e = infer_layout("0F0\n0F1\n", 2).unwrap_err();
        assert!(e.to_string().contains("rows 1 and 2"), "{e}");
    }
}
