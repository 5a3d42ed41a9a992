//! The vocabulary of pipeline schedules, shared by the compiler (which builds, validates
//! and simulates schedules) and the runtime (which executes them): what one step of a
//! device's instruction stream does, and its text form `{stage}{code}{micro-batch}`
//! (torch.distributed.pipelining's CSV cells: `0F1`, `1I0`, `2W3`, `1B2`, `0SEND_F1`;
//! ppcc adds `3OPT`).

use std::fmt;

/// What an action does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ActionKind {
    /// `F`: forward of one micro-batch through one stage.
    Forward,
    /// `B` in the zero-bubble papers, `I` in torch's CSV: the input-gradient half of backward.
    BackwardInput,
    /// `W`: the weight-gradient half of backward.
    BackwardWeight,
    /// `B` in torch's CSV: input and weight gradient fused (1F1B, GPipe).
    FullBackward,
    SendF,
    RecvF,
    SendB,
    RecvB,
    /// One optimizer step of a stage after all its micro-batches (micro-batch is 0).
    OptimizerStep,
}

impl ActionKind {
    /// The code in torch.distributed.pipelining's action strings (`OPT` is ppcc's own).
    pub fn code(self) -> &'static str {
        match self {
            ActionKind::Forward => "F",
            ActionKind::BackwardInput => "I",
            ActionKind::BackwardWeight => "W",
            ActionKind::FullBackward => "B",
            ActionKind::SendF => "SEND_F",
            ActionKind::RecvF => "RECV_F",
            ActionKind::SendB => "SEND_B",
            ActionKind::RecvB => "RECV_B",
            ActionKind::OptimizerStep => "OPT",
        }
    }

    /// Words for error messages.
    pub fn describe(self) -> &'static str {
        match self {
            ActionKind::Forward => "forward",
            ActionKind::BackwardInput => "input-gradient backward",
            ActionKind::BackwardWeight => "weight-gradient backward",
            ActionKind::FullBackward => "backward",
            ActionKind::SendF => "send of activations",
            ActionKind::RecvF => "receive of activations",
            ActionKind::SendB => "send of gradients",
            ActionKind::RecvB => "receive of gradients",
            ActionKind::OptimizerStep => "optimizer step",
        }
    }

    /// Compute (not communication) actions.
    pub fn is_compute(self) -> bool {
        matches!(
            self,
            ActionKind::Forward
                | ActionKind::BackwardInput
                | ActionKind::BackwardWeight
                | ActionKind::FullBackward
                | ActionKind::OptimizerStep
        )
    }
}

/// One step of one rank's instruction stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Action {
    pub kind: ActionKind,
    /// The virtual stage (what torch's CSV calls the stage index).
    pub stage: usize,
    pub micro_batch: usize,
    /// Which of the rank's chunks (model pieces) `stage` is.
    pub chunk: usize,
}

impl Action {
    pub fn new(kind: ActionKind, stage: usize, micro_batch: usize, chunk: usize) -> Self {
        Action {
            kind,
            stage,
            micro_batch,
            chunk,
        }
    }

    /// `1B3 (backward of micro-batch 3 on stage 1)`.
    pub fn explain(&self) -> String {
        if self.kind == ActionKind::OptimizerStep {
            return format!("{self} (optimizer step of stage {})", self.stage);
        }
        format!(
            "{self} ({} of micro-batch {} on stage {})",
            self.kind.describe(),
            self.micro_batch,
            self.stage
        )
    }
}

/// The torch CSV cell: `{stage}{code}{micro}` (`OPT` has no micro-batch).
impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.kind == ActionKind::OptimizerStep {
            write!(f, "{}{}", self.stage, self.kind.code())
        } else {
            write!(f, "{}{}{}", self.stage, self.kind.code(), self.micro_batch)
        }
    }
}

/// Why a schedule cell does not parse: each variant says what was expected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ActionParseError {
    #[error("expected a stage number, then F, I, W, B, SEND_F, RECV_F, SEND_B, RECV_B or OPT, then a micro-batch number")]
    NoStage,
    #[error("stage number out of range")]
    StageRange,
    /// The text after the stage number is no action code.
    #[error(
        "unknown action `{rest}` (expected F, I, W, B, SEND_F, RECV_F, SEND_B, RECV_B or OPT)"
    )]
    UnknownAction { rest: String },
    #[error("OPT takes no micro-batch number")]
    OptMicroBatch,
    #[error("expected a micro-batch number after `{code}`")]
    NoMicroBatch { code: &'static str },
    #[error("micro-batch number out of range")]
    MicroBatchRange,
}

/// Parse a cell: the action kind, the stage and the micro-batch (0 for `OPT`).
pub fn parse_action(cell: &str) -> Result<(ActionKind, usize, usize), ActionParseError> {
    let cell = cell.trim();
    let digits = cell.chars().take_while(|c| c.is_ascii_digit()).count();
    if digits == 0 {
        return Err(ActionParseError::NoStage);
    }
    let stage: usize = cell[..digits]
        .parse()
        .map_err(|_| ActionParseError::StageRange)?;
    let rest = &cell[digits..];
    let kinds = [
        ("SEND_F", ActionKind::SendF),
        ("RECV_F", ActionKind::RecvF),
        ("SEND_B", ActionKind::SendB),
        ("RECV_B", ActionKind::RecvB),
        ("OPT", ActionKind::OptimizerStep),
        ("F", ActionKind::Forward),
        ("I", ActionKind::BackwardInput),
        ("W", ActionKind::BackwardWeight),
        ("B", ActionKind::FullBackward),
    ];
    let Some(&(code, kind)) = kinds.iter().find(|(c, _)| rest.starts_with(c)) else {
        return Err(ActionParseError::UnknownAction {
            rest: rest.to_string(),
        });
    };
    let micro = &rest[code.len()..];
    let micro_batch = if kind == ActionKind::OptimizerStep {
        if !micro.is_empty() {
            return Err(ActionParseError::OptMicroBatch);
        }
        0
    } else {
        if micro.is_empty() || !micro.chars().all(|c| c.is_ascii_digit()) {
            return Err(ActionParseError::NoMicroBatch { code });
        }
        micro
            .parse()
            .map_err(|_| ActionParseError::MicroBatchRange)?
    };
    Ok((kind, stage, micro_batch))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_round_trip() {
        for cell in ["0F1", "12I0", "2W3", "1B2", "0SEND_F1", "3RECV_B0", "3OPT"] {
            let (kind, stage, mb) = parse_action(cell).unwrap();
            assert_eq!(Action::new(kind, stage, mb, 0).to_string(), cell);
        }
        assert!(parse_action("F1").is_err());
        assert!(parse_action("0X1").is_err());
        assert!(parse_action("0F").is_err());
        assert_eq!(parse_action("0OPT1"), Err(ActionParseError::OptMicroBatch));
    }
}
