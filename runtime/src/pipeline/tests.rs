//! The worker's failure handling: an abort is recognised by its error variant.

use std::path::PathBuf;
use std::sync::Arc;

use super::*;
use ppir::interp::InterpError;

/// Stage 0 sends its input `x` to stage 1 on channel 0; stage 1 receives it as its loss.
const STAGES: &str = r#"
module {
  func @s0.fwd(%x: tensor<1x2xf32>) -> () attributes {stage = 0} {
    "pp.send"(%x) {channel = 0, peer = 1} : (tensor<1x2xf32>) -> ()
    return
  }
  func @s0.none() -> () attributes {stage = 0} {
    return
  }
  func @s1.fwd() -> (tensor<1x2xf32>) attributes {stage = 1} {
    %loss = "pp.recv"() {channel = 0, peer = 0} : () -> tensor<1x2xf32>
    return %loss : tensor<1x2xf32>
  }
  func @s1.none() -> () attributes {stage = 1} {
    return
  }
}
"#;

fn spec(stage: u32) -> StageSpec {
    StageSpec {
        stage,
        device: stage as usize,
        fwd: format!("s{stage}.fwd"),
        bwd_input: format!("s{stage}.none"),
        bwd_weight: format!("s{stage}.none"),
        optim: None,
        dir: PathBuf::new(),
        predicted_seconds: 0.0,
    }
}

fn config(fault: Option<Fault>) -> RunConfig {
    RunConfig {
        microbatches: 1,
        micro_rows: 1,
        rank_of: vec![0, 1],
        recv_timeout: Duration::from_secs(30),
        channel_values: HashMap::from([(0, "x".to_string())]),
        fault,
        collectives: vec![],
        replica: 0,
        replicas: 1,
        devices: 2,
    }
}

/// The device of `stage`, running its executable (the interpreter by default).
fn worker(stage: u32, exec: Option<Box<dyn StageExecutable>>, fault: Option<Fault>) -> RankWorker {
    let exec = exec.unwrap_or_else(|| {
        Box::new(InterpretedStage::new(
            ppir::text::parse_module(STAGES).unwrap(),
            InterpOptions::default(),
        ))
    });
    RankWorker {
        rank: stage as usize,
        stages: vec![StageWorker::new(spec(stage), exec, BTreeMap::new()).unwrap()],
        actions: vec![Action::new(ActionKind::Forward, stage as usize, 0, 0)],
        config: config(fault),
        link: None,
    }
}

fn batch() -> Batch {
    Batch::from([(
        "x".to_string(),
        Tensor::from_f32(vec![1, 2], vec![1.5, -2.0]),
    )])
}

#[test]
fn two_devices_run_a_step() {
    let net = LocalNet::new(2);
    let mut workers = vec![worker(0, None, None), worker(1, None, None)];
    let reports = run_local(&mut workers, &net, 0, Arc::new(batch())).unwrap();
    assert_eq!(reports.len(), 2);
    assert_eq!(step_loss(&reports), Some(1.5));
}

#[test]
fn an_aborted_receive_is_reported_as_aborted() {
    let net = LocalNet::new(2);
    net.abort("device 0 failed: boom");
    let mut w = worker(1, None, None);
    let e = w.step(0, &batch(), &mut net.endpoint(1)).unwrap_err();
    assert!(e.aborted(), "{e}");
    match e.error.as_ref() {
        PipelineError::Aborted { peer, reason } => {
            assert_eq!((*peer, reason.as_str()), (0, "device 0 failed: boom"))
        }
        other => panic!("not an abort: {other:?}"),
    }
    assert_eq!(
        e.to_string(),
        "stage 1, step 0, micro-batch 0, @s1.fwd: stopped because another device failed: device 0 failed: boom"
    );
}

/// An executable whose every call fails with `error`.
struct Failing(PipelineError);

impl StageExecutable for Failing {
    fn signature(&self, _function: &str) -> Option<Signature> {
        Some((vec![], vec![]))
    }

    fn call(
        &mut self,
        _function: &str,
        _args: Vec<ArgValue<'_>>,
        _keep: &[bool],
        _comm: &mut dyn Comm,
    ) -> Result<Vec<Value>, PipelineError> {
        Err(self.0.clone())
    }
}

#[test]
fn only_the_variant_makes_an_abort() {
    let net = LocalNet::new(2);
    // A failure whose text reads like an abort is still this device's own failure.
    let own = PipelineError::Interp(InterpError::Function {
        function: "s1.fwd".into(),
        message: "stopped because another device failed: not really".into(),
    });
    let mut w = worker(1, Some(Box::new(Failing(own))), None);
    let e = w.step(0, &batch(), &mut net.endpoint(1)).unwrap_err();
    assert!(!e.aborted(), "{e}");
    assert!(matches!(*e.error, PipelineError::Interp(_)), "{e:?}");

    // An aborted receive inside an executable's error (here a native module's) is one,
    // whatever the message says around it.
    let native = PipelineError::Native(NativeError::Callback {
        function: "s1.fwd".into(),
        source: crate::native::CallbackError::Comm(CommError::Aborted {
            peer: 0,
            reason: "device 0 failed".into(),
        }),
    });
    let mut w = worker(1, Some(Box::new(Failing(native))), None);
    let e = w.step(0, &batch(), &mut net.endpoint(1)).unwrap_err();
    assert!(e.aborted(), "{e}");
    assert!(
        matches!(*e.error, PipelineError::Aborted { peer: 0, .. }),
        "{e:?}"
    );
}

#[test]
fn the_failing_device_is_reported_not_the_aborted_one() {
    let net = LocalNet::new(2);
    let fault = Fault {
        stage: 0,
        step: 0,
        stall: None,
        replica: 0,
    };
    let mut workers = vec![worker(0, None, Some(fault)), worker(1, None, Some(fault))];
    let e = run_local(&mut workers, &net, 0, Arc::new(batch())).unwrap_err();
    assert_eq!(e.rank, 0, "{e}");
    assert!(!e.aborted(), "{e}");
    assert!(
        matches!(e.error.as_ref(), PipelineError::Panicked { rank: 0, message } if message.contains("injected fault")),
        "{e:?}"
    );
    assert!(e.abandoned.is_empty(), "{e:?}");
    // The other device stopped because of it.
    assert!(net
        .aborted()
        .is_some_and(|r| r.starts_with("device 0 failed: ")));
}

/// A gradient all-reduce starts right after the last weight-gradient action of its stages
/// on the device (so it overlaps what follows), and at the end when they have none here.
#[test]
fn collectives_start_after_their_stages_last_weight_gradient() {
    let mut w = worker(0, None, None);
    w.actions = vec![
        Action::new(ActionKind::Forward, 0, 0, 0),
        Action::new(ActionKind::Forward, 0, 1, 0),
        Action::new(ActionKind::BackwardInput, 0, 0, 0),
        Action::new(ActionKind::BackwardWeight, 0, 0, 0),
        Action::new(ActionKind::BackwardInput, 0, 1, 0),
        Action::new(ActionKind::BackwardWeight, 0, 1, 0),
        Action::new(ActionKind::Forward, 0, 2, 0),
    ];
    let c = |channel, stages: Vec<u32>| CollectiveSpec {
        channel,
        param: format!("p{channel}"),
        stages,
        replicas: true,
        reduce_scatter: false,
    };
    // Stage 1 is not on this device: its collective is not this device's.
    w.config.collectives = vec![c(9, vec![0]), c(4, vec![0, 1]), c(5, vec![1])];
    let plan: Vec<(i64, usize)> = w
        .collective_plan()
        .into_iter()
        .map(|(c, ready)| (c.channel, ready))
        .collect();
    assert_eq!(plan, vec![(4, 5), (9, 5)]);
    // Without weight-gradient actions (a forward-only device), at the end.
    w.actions.retain(|a| a.kind == ActionKind::Forward);
    assert_eq!(w.collective_plan()[0].1, usize::MAX);
}
