use super::*;

/// A small plan with a program, as the driver writes it.
pub(crate) fn sample() -> Plan {
    let prediction = Prediction {
        iteration_seconds: 0.5,
        bubble_fraction: 0.25,
        lower_bound_seconds: 0.4,
        busy_seconds: vec![0.3, 0.3],
        peak_memory_bytes: vec![1e6, 2e6],
        peak_stash_microbatches: vec![2, 1],
        stage_graph_is_chain: true,
        stage_seconds: vec![0.1, 0.1],
        edges: vec![EdgeBytes {
            from: 0,
            to: 1,
            bytes: 64.0,
        }],
        stage_times: Some("cost-model".into()),
    };
    let stage = |s: usize| StageDoc {
        stage: s,
        device: s,
        chunk: 0,
        ops: 3,
        first_op: "a".into(),
        last_op: "b".into(),
        forward_seconds: 0.01,
        backward_input_seconds: 0.02,
        backward_weight_seconds: 0.01,
        activation_bytes_per_microbatch: 128.0,
        param_bytes: 256.0,
        native_seconds: None,
        functions: Some(StageFunctions {
            fwd: format!("s{s}_fwd"),
            bwd_input: format!("s{s}_bwd_input"),
            bwd_weight: format!("s{s}_bwd_weight"),
            optim: None,
        }),
        params: Some(vec![]),
        dir: Some(format!("stage{s}")),
        recompute: (s == 0).then(|| RecomputeDoc {
            values: vec!["h".into()],
            stash_bytes_without: 64.0,
            recomputed_bytes: 32.0,
            extra_seconds: 1e-6,
            extra_flops: 8.0,
            exact: true,
        }),
        temporary_bytes: Some(96.0),
    };
    Plan {
        format: FORMAT.into(),
        version: VERSION,
        ppcc_version: "0.1.0".into(),
        model: "m.onnx".into(),
        devices: 2,
        virtual_stages: 2,
        microbatches: 2,
        global_batch: 4,
        micro_batch: 2,
        schedule: ScheduleDoc {
            name: "1f1b".into(),
            chunks: 1,
            file: "schedule.csv".into(),
            actions: vec![vec!["0F0".into()], vec!["1F0".into()]],
            layout: LayoutDoc::Dag {
                rank_of: vec![0, 1],
                edges: vec![[0, 1]],
            },
        },
        partition: "graph".into(),
        device_profile: "h100".into(),
        memory_limit_bytes: 8e10,
        planner_seconds: 0.01,
        candidates: vec![Candidate {
            stage_graph_is_chain: true,
            iteration_seconds: f64::INFINITY,
        }],
        stages: vec![stage(0), stage(1)],
        edges: vec![[0, 1]],
        prediction: prediction.clone(),
        prediction_cost_model: None,
        baseline: Baseline::planned(Prediction {
            stage_times: None,
            ..prediction
        }),
        program: true,
        target: "cpu".into(),
        gpu_gemm: None,
        recompute: Some("auto".into()),
        channels: Some(vec![Channel {
            id: 0,
            from: 0,
            to: 1,
            value: "h".into(),
            phase: "fwd".into(),
            bytes: 64,
        }]),
        collectives: vec![Collective {
            channel: 1,
            param: "w".into(),
            stages: vec![0, 1],
            replicas: false,
            bytes: 64,
            reduce_scatter: false,
            gather_channel: None,
        }],
        data_parallel: Some(DataParallel {
            replicas: 2,
            ranks: vec![vec![0, 1], vec![2, 3]],
            allreduce_seconds: 1e-3,
        }),
        training: Some(Training {
            loss: "mse".into(),
            train_mode: true,
            labels: Some("tensor<2x1xf32>".into()),
            needs_rng: false,
            inputs: vec![DataInput {
                name: "x".into(),
                onnx_name: Some("input".into()),
                ty: "tensor<2x4xf32>".into(),
                synthetic: Synthetic::Normal,
            }],
            params: vec!["w".into()],
            updated_states: vec![],
            weight_sources: [("w".to_string(), "W".to_string())].into(),
            weight_pieces: Default::default(),
            optimizer: Optimizer {
                kind: "sgd".into(),
                lr: 0.05,
                momentum: 0.9,
                weight_decay: 0.0,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                microbatches: 2,
            },
        }),
        splits: vec![],
        phases: Some(vec!["fwd".into()]),
        files: Some(
            [(
                "stage0/stage.ppir".to_string(),
                FileRecord {
                    bytes: 3,
                    sha256: "0".repeat(64),
                },
            )]
            .into(),
        ),
    }
}

fn sample_value() -> serde_json::Value {
    serde_json::from_str(&sample().to_json().unwrap()).unwrap()
}

fn read(v: &serde_json::Value) -> Result<Plan, PlanError> {
    Plan::from_json(&serde_json::to_string(v).unwrap())
}

#[test]
fn a_plan_round_trips_with_today_s_field_names() {
    let text = sample().to_json().unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["prediction"]["iteration_seconds"], 0.5);
    assert_eq!(v["prediction"]["lower_bound_seconds"], 0.4);
    assert_eq!(v["prediction"]["peak_memory_bytes"][1], 2e6);
    assert_eq!(v["planner_seconds"], 0.01);
    assert_eq!(v["baseline"]["partition"], "sequential");
    assert_eq!(v["baseline"]["iteration_seconds"], 0.5);
    assert_eq!(v["schedule"]["layout"]["kind"], "dag");
    assert_eq!(v["training"]["inputs"][0]["type"], "tensor<2x4xf32>");
    assert_eq!(v["training"]["inputs"][0]["synthetic"], "normal");
    assert_eq!(v["files"]["stage0/stage.ppir"]["bytes"], 3);
    assert_eq!(
        v["stages"][0]["functions"]["optim"],
        serde_json::Value::Null
    );
    // An infinite candidate is written as null and reads back as NaN.
    assert!(v["candidates"][0]["iteration_seconds"].is_null());
    let back = Plan::from_json(&text).unwrap();
    assert!(back.candidates[0].iteration_seconds.is_nan());
    assert_eq!(back.stages, sample().stages);
    assert_eq!(back.training, sample().training);
    assert_eq!(back.files, sample().files);
}

#[test]
fn uniform_synthetic_inputs_and_other_layouts_round_trip() {
    let mut p = sample();
    p.schedule.layout = LayoutDoc::Interleaved { chunks: 2 };
    p.training.as_mut().unwrap().inputs[0].synthetic = Synthetic::Uniform([0, 10]);
    let v: serde_json::Value = serde_json::from_str(&p.to_json().unwrap()).unwrap();
    assert_eq!(
        v["schedule"]["layout"],
        serde_json::json!({"kind": "interleaved", "chunks": 2})
    );
    assert_eq!(
        v["training"]["inputs"][0]["synthetic"],
        serde_json::json!({"uniform": [0, 10]})
    );
    let back = read(&v).unwrap();
    assert_eq!(back.schedule.layout, LayoutDoc::Interleaved { chunks: 2 });
    p.schedule.layout = LayoutDoc::V;
    assert_eq!(
        Plan::from_json(&p.to_json().unwrap())
            .unwrap()
            .schedule
            .layout,
        LayoutDoc::V
    );
}

#[test]
fn older_and_newer_versions_are_refused_naming_both() {
    let mut v = sample_value();
    v["version"] = 2.into();
    let e = read(&v).unwrap_err();
    assert!(matches!(
        e,
        PlanError::Older {
            found: Some(2),
            supported: VERSION
        }
    ));
    let msg = e.to_string();
    assert!(
        msg.contains("format version 2") && msg.contains(&format!("version {VERSION}")),
        "{msg}"
    );
    assert!(msg.contains("compile the model again"), "{msg}");
    v["version"] = (VERSION + 1).into();
    let msg = read(&v).unwrap_err().to_string();
    assert!(
        msg.contains(&format!("format version {}", VERSION + 1))
            && msg.contains(&format!("reads version {VERSION}")),
        "{msg}"
    );
    v.as_object_mut().unwrap().remove("version");
    assert!(matches!(
        read(&v),
        Err(PlanError::Older { found: None, .. })
    ));
    v["format"] = "something-else".into();
    assert!(matches!(read(&v), Err(PlanError::NotAPlan)));
    assert!(matches!(
        Plan::from_json("[1, 2]"),
        Err(PlanError::NotAPlan)
    ));
    assert!(matches!(Plan::from_json("{"), Err(PlanError::Json(_))));
}

#[test]
fn an_unknown_field_is_refused_with_its_path() {
    let mut v = sample_value();
    v["stages"][1]["functions"]["extra"] = 1.into();
    let e = read(&v).unwrap_err();
    let msg = e.to_string();
    match &e {
        PlanError::Schema { path, .. } => assert_eq!(path, "stages[1].functions.extra"),
        other => panic!("{other:?}"),
    }
    assert!(msg.contains("unknown field `extra`"), "{msg}");
    let mut v = sample_value();
    v["surprise"] = true.into();
    let msg = read(&v).unwrap_err().to_string();
    assert!(msg.contains("unknown field `surprise`"), "{msg}");
}

#[test]
fn a_missing_field_is_refused_with_its_path() {
    let mut v = sample_value();
    v["training"]["optimizer"]
        .as_object_mut()
        .unwrap()
        .remove("lr");
    let e = read(&v).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("training.optimizer") && msg.contains("missing field `lr`"),
        "{msg}"
    );
    let mut v = sample_value();
    v.as_object_mut().unwrap().remove("prediction");
    let msg = read(&v).unwrap_err().to_string();
    assert!(msg.contains("missing field `prediction`"), "{msg}");
}

#[test]
fn a_field_of_the_wrong_type_is_refused_with_its_path() {
    let mut v = sample_value();
    v["schedule"]["actions"][1][0] = 7.into();
    let e = read(&v).unwrap_err();
    match &e {
        PlanError::Schema { path, .. } => assert_eq!(path, "schedule.actions[1][0]"),
        other => panic!("{other:?}"),
    }
    assert!(
        Plan::from_value(&v)
            .unwrap_err()
            .to_string()
            .contains("schedule.actions[1][0]"),
        "{e}"
    );
}
