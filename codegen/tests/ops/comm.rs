//! `send`/`recv` inside a function go through the caller's `Comm`, in program order.

use ppir::interp::{run_function, InterpOptions};
use ppir::Tensor;

use crate::common::*;

const STAGE: &str = r#"
module {
  func @fwd(%x: tensor<2x3xf32>, %k: tensor<2xi64>) -> (tensor<2x3xf32>) attributes {stage = 1} {
    %r = "pp.recv"() {peer = 0, channel = 7} : () -> tensor<2x3xf32>
    %y = "pp.mul"(%x, %r) : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
    "pp.send"(%y) {peer = 2, channel = 8} : (tensor<2x3xf32>) -> ()
    "pp.send"(%k) {peer = 0, channel = 9} : (tensor<2xi64>) -> ()
    %z = "pp.exp"(%y) : (tensor<2x3xf32>) -> tensor<2x3xf32>
    return %z : tensor<2x3xf32>
  }
}
"#;

#[test]
fn send_and_recv_call_the_transport() {
    let m = parse_stage(STAGE);
    let f = &m.functions[0];
    let x = input(&[2, 3], 1);
    let k = Tensor::from_i64(ppir::DType::I64, vec![2], vec![5, -3]);
    let r = input(&[2, 3], 2);

    let mut want = MockComm {
        to_receive: vec![(0, 7, r.clone())],
        ..Default::default()
    };
    let expected = run_function(
        f,
        vec![x.clone(), k.clone()],
        &InterpOptions::default(),
        Some(&mut want),
    )
    .unwrap();

    let (nm, dir) = compile(&m);
    let mut got = MockComm {
        to_receive: vec![(0, 7, r)],
        ..Default::default()
    };
    let out = nm.call("fwd", &[&x, &k], Some(&mut got)).unwrap();
    assert_close(&out[0], &expected[0], 1e-5, "result");
    assert_eq!(got.sent.len(), 2);
    for ((gp, gc, gt), (wp, wc, wt)) in got.sent.iter().zip(&want.sent) {
        assert_eq!((gp, gc), (wp, wc));
        assert_close(gt, wt, 1e-5, "sent tensor");
    }

    // A failing receive is reported, naming the channel; nothing is sent after it.
    let mut empty = MockComm::default();
    let e = nm.call("fwd", &[&x, &k], Some(&mut empty)).unwrap_err();
    assert!(e.to_string().contains("channel 7"), "{e}");
    assert!(empty.sent.is_empty());

    // No transport at all.
    let e = nm.call("fwd", &[&x, &k], None).unwrap_err();
    assert!(e.to_string().contains("no transport"), "{e}");
    cleanup(dir);
}
