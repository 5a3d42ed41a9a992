//! The compile and run pipelines in-process: points, dumps, inserted passes, errors, and a
//! short training run of the build directory.

use std::cell::RefCell;
use std::path::PathBuf;

use ppcc_driver::compile::{CompileOptions, Compiler, Event, Point, STEPS};
use ppcc_driver::run::{RunEvent, RunOptions};
use ppcc_driver::target::Target;
use ppcc_driver::DriverError;
use ppcc_passes::PassError;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ppcc-driver-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// mlp.onnx on 2 devices, 2 micro-batches, on the interpreter (no code generation).
fn options(out: &std::path::Path) -> CompileOptions {
    let mut o = CompileOptions::new(repo().join("examples/mlp.onnx"), out);
    o.stages = 2;
    o.microbatches = Some(2);
    o.target = Target::Interp;
    o
}

#[test]
fn points_are_named_and_ordered() {
    let names: Vec<&str> = Point::ALL.iter().map(|p| p.name()).collect();
    assert_eq!(
        names,
        [
            "import",
            "rewrite",
            "partition",
            "training-program",
            "split"
        ]
    );
    for w in Point::ALL.windows(2) {
        assert!(w[0].number() < w[1].number());
    }
    assert_eq!("split".parse::<Point>().unwrap(), Point::Split);
    let e = "codegen".parse::<Point>().unwrap_err();
    assert!(matches!(e, DriverError::UnknownPoint { .. }));
    let msg = e.to_string();
    assert!(
        msg.contains("`codegen`")
            && msg.contains("import, rewrite, partition, training-program, split"),
        "{msg}"
    );
    assert!(STEPS
        .iter()
        .any(|s| s.name == "codegen" && s.point.is_none()));
}

#[test]
fn the_pipeline_prints_with_inserted_passes() {
    let mut c = Compiler::new(options(&tmp("print")));
    c.insert_fn(Point::Partition, "count-ops", |_| Ok(()));
    let text = c.print_pipeline();
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with("import") && lines[0].contains("[point]"),
        "{text}"
    );
    let partition = lines
        .iter()
        .position(|l| l.starts_with("partition"))
        .unwrap();
    assert_eq!(lines[partition + 1], "  + pass count-ops", "{text}");
    // --target interp generates no code; --plan-only stops after the plan.
    assert!(!text.contains("codegen"), "{text}");
    let mut o = options(&tmp("print"));
    o.plan_only = true;
    let text = Compiler::new(o).print_pipeline();
    assert!(
        !text.lines().any(|l| l.starts_with("split")) && text.contains("write-plan"),
        "{text}"
    );
}

#[test]
fn compile_dumps_runs_inserted_passes_and_trains() {
    let out = tmp("compile");
    let dumps = tmp("compile-dumps");
    let seen = RefCell::new(vec![]);
    let events = RefCell::new(vec![]);
    let mut c = Compiler::new(options(&out));
    c.dump_after(Point::Import)
        .dump_after(Point::Split)
        .dump_dir(&dumps);
    c.insert_fn(Point::TrainingProgram, "record", |m| {
        seen.borrow_mut()
            .extend(m.functions.iter().map(|f| f.name.clone()));
        Ok(())
    });
    c.insert_pass(Point::Import, Box::new(ppcc_passes::VerifyPass));
    c.on_event(|e| events.borrow_mut().push(e));
    let compiled = c.run().expect("compiles");
    assert_eq!(compiled.plan.partition.stages.len(), 2);
    assert!(
        seen.borrow().iter().any(|f| f == "grad"),
        "{:?}",
        seen.borrow()
    );
    assert!(events
        .borrow()
        .iter()
        .any(|e| matches!(e, Event::Progress(_))));
    let import =
        std::fs::read_to_string(dumps.join(format!("{}-import.ppir", Point::Import.number())))
            .expect("import dump");
    assert!(
        import.contains("func @main") && !import.contains("pp.send"),
        "{import}"
    );
    let split =
        std::fs::read_to_string(dumps.join(format!("{}-split.ppir", Point::Split.number())))
            .expect("split dump");
    assert!(
        split.contains("pp.send") && split.contains("pp.recv"),
        "{split}"
    );
    ppir::text::parse_module(&split).expect("a dump parses back");

    // The plan on disk is the typed one returned.
    let text = std::fs::read_to_string(out.join("plan.json")).unwrap();
    let doc = ppcc_plan::Plan::from_json(&text).unwrap();
    assert_eq!(doc, compiled.plan_doc);
    assert_eq!(doc.version, ppcc_plan::VERSION);

    // Two steps of training on the build directory.
    let mut o = RunOptions::new(&out);
    o.steps = 2;
    let mut losses = vec![];
    ppcc_driver::run::run(&o, &mut |e| {
        if let RunEvent::Step { loss, .. } = e {
            losses.push(loss)
        }
    })
    .expect("runs");
    assert_eq!(losses.len(), 2);
    assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
    let _ = std::fs::remove_dir_all(&out);
    let _ = std::fs::remove_dir_all(&dumps);
}

#[test]
fn dumps_without_a_directory_are_events() {
    let out = tmp("events");
    let mut o = options(&out);
    o.plan_only = true;
    let dumps = RefCell::new(vec![]);
    let mut c = Compiler::new(o);
    c.dump_after(Point::Partition);
    c.on_event(|e| {
        if let Event::Dump { point, text } = e {
            dumps.borrow_mut().push((point, text))
        }
    });
    c.run().expect("compiles");
    let dumps = dumps.into_inner();
    assert_eq!(dumps.len(), 1);
    assert_eq!(dumps[0].0, Point::Partition);
    assert!(dumps[0].1.contains("stage = 1"), "{}", dumps[0].1);
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_failing_or_breaking_inserted_pass_is_named() {
    let out = tmp("failing");
    let mut c = Compiler::new(options(&out));
    c.insert_fn(Point::Import, "boom", |_| {
        Err(PassError::failed("boom", "nothing to do"))
    });
    let e = c.run().err().expect("fails");
    let msg = ppcc_driver::error_chain(&e);
    assert!(
        matches!(&e, DriverError::InsertedPass { pass, point: "import", .. } if pass == "boom"),
        "{msg}"
    );
    assert!(msg.contains("pass `boom` inserted after `import`"), "{msg}");

    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn option_errors_are_typed() {
    let mut o = options(&tmp("bad"));
    o.schedule = "no-such-schedule".into();
    let e = Compiler::new(o).run().err().expect("fails");
    assert!(matches!(e, DriverError::Invalid(_)));
    assert!(
        e.to_string()
            .contains("unknown schedule `no-such-schedule`"),
        "{e}"
    );
    let e = ppcc_driver::run::run(&RunOptions::new("/nonexistent-ppcc-dir"), &mut |_| {})
        .expect_err("fails");
    assert!(ppcc_driver::error_chain(&e).contains("plan.json"), "{e}");
}

/// `ppcc train` as a library call: the steps come as events, the loss falls on the
/// repeated synthetic batch, a bad option is an error value, and the model written back
/// has the trained weights (training it again starts from the lower loss).
#[test]
fn train_is_a_library_call() {
    use ppcc_driver::train::{train, TrainEvent, TrainOptions};
    let mut o = TrainOptions::new(repo().join("examples/mlp.onnx"));
    o.steps = 4;
    o.microbatches = 2;
    o.target = Target::Interp;
    let saved = tmp("train").with_extension("onnx");
    o.save_onnx = Some(saved.clone());
    let mut losses = vec![];
    let mut notes = vec![];
    train(&o, &mut |e| match e {
        TrainEvent::Step { loss, .. } => losses.push(loss),
        TrainEvent::Note(n) => notes.push(n),
        TrainEvent::Started { steps } => assert_eq!(steps, 4),
    })
    .unwrap();
    assert_eq!(losses.len(), 4);
    assert!(losses[3] < losses[0], "{losses:?}");
    assert!(notes.iter().any(|n| n.starts_with("wrote ")), "{notes:?}");

    let mut again = TrainOptions::new(&saved);
    again.steps = 1;
    again.microbatches = 2;
    again.target = Target::Interp;
    let mut first = None;
    train(&again, &mut |e| {
        if let TrainEvent::Step { loss, .. } = e {
            first = Some(loss);
        }
    })
    .unwrap();
    assert!(first.unwrap() < losses[0], "{first:?} vs {losses:?}");
    let _ = std::fs::remove_file(&saved);

    o.microbatches = 0;
    let e = train(&o, &mut |_| {}).unwrap_err();
    assert!(matches!(e, DriverError::Invalid(_)), "{e}");
}
