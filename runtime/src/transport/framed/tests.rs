//! The framing over an in-process byte link that behaves as NCCL's point-to-point does:
//! ordered per (sender, receiver), no tags, sends that never wait.

use std::sync::Arc;
use std::thread;

use super::*;
use crate::transport::local::LocalNet;

/// A memory link that can drop the last byte of every payload it sends.
struct ChannelLink {
    inner: MemoryLink,
    truncate: bool,
    /// Send nothing at all (a peer that died between its header and its payload).
    swallow: bool,
}

impl ChannelLink {
    fn pair(pipes: &Arc<Pipes>, a: usize, b: usize) -> (ChannelLink, ChannelLink) {
        let link = |me: usize, other: usize| ChannelLink {
            inner: MemoryLink::new(me, &[other], &[other], pipes.clone()),
            truncate: false,
            swallow: false,
        };
        (link(a, b), link(b, a))
    }
}

impl Link for ChannelLink {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn sends_to(&self, rank: usize) -> bool {
        self.inner.sends_to(rank)
    }

    fn receives_from(&self, rank: usize) -> bool {
        self.inner.receives_from(rank)
    }

    fn send(&mut self, to: usize, bytes: &[u8]) -> Result<(), TransportError> {
        if self.swallow {
            return Ok(());
        }
        let n = bytes.len() - usize::from(self.truncate && !bytes.is_empty());
        self.inner.send(to, &bytes[..n])
    }

    fn recv(
        &mut self,
        from: usize,
        len: usize,
        deadline: Instant,
        stopped: &dyn Fn() -> Option<String>,
    ) -> Result<Option<Box<dyn Held>>, TransportError> {
        self.inner.recv(from, len, deadline, stopped)
    }

    fn abort(&mut self) {}
}

fn tag(channel: i64, mb: u32) -> Tag {
    Tag {
        from: 0,
        to: 1,
        channel,
        micro_batch: mb,
        step: 0,
    }
}

fn ty(t: &Tensor) -> TensorType {
    t.tensor_type()
}

const LONG: Duration = Duration::from_secs(10);

#[test]
fn messages_arrive_in_any_order_with_their_dtype_and_shape() {
    let net = LocalNet::new(2);
    let pipes = Arc::new(Pipes::default());
    let (mut l0, mut l1) = ChannelLink::pair(&pipes, 0, 1);
    let a = Tensor::from_f32(vec![2, 3], vec![1.0, -2.5, 3.25, 0.0, 1e-3, 7.0]);
    let b = Tensor::from_i64(DType::I64, vec![4], vec![1, -2, 1 << 40, 0]);
    let c = Tensor::from_f64(DType::BF16, vec![1, 1, 2], vec![0.5, -8.0]);
    let d = Tensor::from_i64(DType::Bool, vec![], vec![1]);
    let sent = vec![
        (tag(1, 0), a),
        (tag(2, 0), b),
        (tag(1, 1), c),
        (tag(3, 0), d),
    ];
    let to_send = sent.clone();
    let n0 = net.clone();
    let sender = thread::spawn(move || {
        let mut ep = n0.endpoint(0);
        let mut state = FramedState::default();
        let mut f = Framed {
            inner: &mut ep,
            link: &mut l0,
            state: &mut state,
        };
        for (tag, t) in to_send {
            f.send(1, tag, t).unwrap();
        }
    });
    let mut ep = net.endpoint(1);
    let mut state = FramedState::default();
    let mut f = Framed {
        inner: &mut ep,
        link: &mut l1,
        state: &mut state,
    };
    // Last sent first: the three before it wait in the state.
    for i in [3, 0, 2, 1] {
        let (tag, want) = &sent[i];
        let got = f.recv(0, *tag, &ty(want), LONG).unwrap();
        assert_eq!(&got, want, "message {i}");
        if i == 3 {
            assert_eq!(f.state.early(), 3);
        }
    }
    assert_eq!(state.early(), 0);
    let t = state.traffic();
    assert_eq!((t.received, t.sent), (4, 0));
    let bytes: usize = sent
        .iter()
        .map(|(_, t)| crate::native::tensor_bytes(t).len())
        .sum();
    assert_eq!(t.received_bytes, bytes as u64);
    sender.join().unwrap();
}

#[test]
fn early_messages_outlive_the_step_that_read_them() {
    // One framing state, a fresh endpoint per step (as the threaded driver makes them).
    let net = LocalNet::new(2);
    let pipes = Arc::new(Pipes::default());
    let (mut l0, mut l1) = ChannelLink::pair(&pipes, 0, 1);
    let (mut s0, mut s1) = (FramedState::default(), FramedState::default());
    let x = Tensor::from_f32(vec![2], vec![1.0, 2.0]);
    let y = Tensor::from_f32(vec![3], vec![3.0, 4.0, 5.0]);
    {
        let mut ep = net.endpoint(0);
        let mut f = Framed {
            inner: &mut ep,
            link: &mut l0,
            state: &mut s0,
        };
        f.send(1, tag(5, 0), x.clone()).unwrap();
        f.send(1, tag(6, 0), y.clone()).unwrap();
    }
    {
        let mut ep = net.endpoint(1);
        let mut f = Framed {
            inner: &mut ep,
            link: &mut l1,
            state: &mut s1,
        };
        assert_eq!(f.recv(0, tag(6, 0), &ty(&y), LONG).unwrap(), y);
    }
    let mut ep = net.endpoint(1);
    let mut f = Framed {
        inner: &mut ep,
        link: &mut l1,
        state: &mut s1,
    };
    assert_eq!(f.recv(0, tag(5, 0), &ty(&x), LONG).unwrap(), x);
    // The numbering goes on: a second round of messages lines up too.
    let mut ep0 = net.endpoint(0);
    let mut f0 = Framed {
        inner: &mut ep0,
        link: &mut l0,
        state: &mut s0,
    };
    f0.send(1, tag(5, 1), y.clone()).unwrap();
    assert_eq!(f.recv(0, tag(5, 1), &ty(&y), LONG).unwrap(), y);
}

#[test]
fn peers_off_the_link_use_the_inner_transport() {
    let net = LocalNet::new(3);
    let pipes = Arc::new(Pipes::default());
    let (mut l0, _l1) = ChannelLink::pair(&pipes, 0, 1);
    let mut ep = net.endpoint(0);
    let mut state = FramedState::default();
    let mut f = Framed {
        inner: &mut ep,
        link: &mut l0,
        state: &mut state,
    };
    let t = Tensor::from_f32(vec![1], vec![9.0]);
    let to2 = Tag { to: 2, ..tag(1, 0) };
    f.send(2, to2, t.clone()).unwrap();
    assert!(
        pipes.queues.lock().unwrap().values().all(|q| q.is_empty()),
        "nothing on the link"
    );
    let mut ep2 = net.endpoint(2);
    assert_eq!(ep2.recv(0, to2, &ty(&t), LONG).unwrap(), t);
}

#[test]
fn a_receive_times_out_naming_its_tag_and_stops_on_abort() {
    let net = LocalNet::new(2);
    let pipes = Arc::new(Pipes::default());
    let (_l0, mut l1) = ChannelLink::pair(&pipes, 0, 1);
    let mut ep = net.endpoint(1);
    let mut state = FramedState::default();
    let mut f = Framed {
        inner: &mut ep,
        link: &mut l1,
        state: &mut state,
    };
    let t = Tensor::from_f32(vec![1], vec![0.0]);
    let e = f
        .recv(0, tag(4, 2), &ty(&t), Duration::from_millis(50))
        .unwrap_err();
    match e {
        TransportError::Timeout { tag: got, waited } => {
            assert_eq!(got, tag(4, 2));
            assert!(waited >= Duration::from_millis(50));
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    let n0 = net.clone();
    let aborter = thread::spawn(move || {
        thread::sleep(Duration::from_millis(50));
        n0.endpoint(0).abort("device 0 failed: test");
    });
    let e = f.recv(0, tag(4, 2), &ty(&t), LONG).unwrap_err();
    aborter.join().unwrap();
    assert!(
        matches!(&e, TransportError::Aborted(m) if m.contains("device 0 failed")),
        "{e:?}"
    );
}

#[test]
fn a_payload_of_the_wrong_length_or_type_is_an_error_naming_the_message() {
    let net = LocalNet::new(2);
    let pipes = Arc::new(Pipes::default());
    let (mut l0, mut l1) = ChannelLink::pair(&pipes, 0, 1);
    l0.truncate = true;
    let mut ep0 = net.endpoint(0);
    let mut s0 = FramedState::default();
    let t = Tensor::from_f32(vec![2], vec![1.0, 2.0]);
    Framed {
        inner: &mut ep0,
        link: &mut l0,
        state: &mut s0,
    }
    .send(1, tag(7, 3), t.clone())
    .unwrap();
    let mut ep1 = net.endpoint(1);
    let mut s1 = FramedState::default();
    let mut f = Framed {
        inner: &mut ep1,
        link: &mut l1,
        state: &mut s1,
    };
    let e = f.recv(0, tag(7, 3), &ty(&t), LONG).unwrap_err().to_string();
    assert!(e.contains("channel 7") && e.contains("7 bytes"), "{e}");
    // A well-formed message of another type than the receiver's.
    l0.truncate = false;
    Framed {
        inner: &mut ep0,
        link: &mut l0,
        state: &mut s0,
    }
    .send(1, tag(8, 0), t.clone())
    .unwrap();
    let want = TensorType::of(DType::F32, &[3]);
    let e = f.recv(0, tag(8, 0), &want, LONG).unwrap_err().to_string();
    assert!(e.contains("channel 8") && e.contains("expected"), "{e}");
}

#[test]
fn headers_round_trip_and_refuse_what_they_cannot_hold() {
    let t = Tensor::from_f64(DType::F16, vec![1, 2, 3], vec![0.0; 6]);
    let tg = Tag {
        from: 3,
        to: 4,
        channel: 12,
        micro_batch: 7,
        step: 1 << 40,
    };
    let h = encode_header(&tg, t.dtype, &t.shape).unwrap();
    assert_eq!(decode_header(&h), Some((tg, DType::F16, vec![1, 2, 3])));
    let deep = Tensor::from_f64(DType::F32, vec![1; MAX_DIMS + 1], vec![0.0]);
    let e = encode_header(&tg, deep.dtype, &deep.shape)
        .unwrap_err()
        .to_string();
    assert!(e.contains("dimensions"), "{e}");
    let mut bad = h.clone();
    if let ppir::TensorData::Int(v) = &mut bad.data {
        v[5] = 99;
    }
    assert_eq!(decode_header(&bad), None);
}

#[test]
fn bytes_in_and_out_in_any_order_as_stage_functions_pass_them() {
    let net = LocalNet::new(2);
    let pipes = Arc::new(Pipes::default());
    let (mut l0, mut l1) = ChannelLink::pair(&pipes, 0, 1);
    let (mut s0, mut s1) = (FramedState::default(), FramedState::default());
    let a = Tensor::from_f32(vec![2, 2], vec![1.5, -2.0, 0.25, 8.0]);
    let b = Tensor::from_i64(DType::I32, vec![3], vec![7, -1, 0]);
    let mut ep0 = net.endpoint(0);
    let mut f0 = Framed {
        inner: &mut ep0,
        link: &mut l0,
        state: &mut s0,
    };
    for (i, t) in [&a, &b].into_iter().enumerate() {
        let bytes = crate::native::tensor_bytes(t);
        f0.send_bytes(1, tag(i as i64, 0), t.dtype, &t.shape, &bytes)
            .unwrap();
    }
    let mut ep1 = net.endpoint(1);
    let mut f1 = Framed {
        inner: &mut ep1,
        link: &mut l1,
        state: &mut s1,
    };
    for (i, t) in [(1, &b), (0, &a)] {
        let mut out = vec![0u8; crate::native::tensor_bytes(t).len()];
        f1.recv_bytes(0, tag(i, 0), &t.tensor_type(), LONG, &mut out)
            .unwrap();
        assert_eq!(out, crate::native::tensor_bytes(t), "message {i}");
    }
    // A message of another shape than the receiving buffer's is refused, naming it.
    let bytes = crate::native::tensor_bytes(&a);
    f0.send_bytes(1, tag(9, 0), a.dtype, &a.shape, &bytes)
        .unwrap();
    let want = TensorType::of(DType::F32, &[4, 1]);
    let mut out = vec![0u8; 16];
    let e = f1
        .recv_bytes(0, tag(9, 0), &want, LONG, &mut out)
        .unwrap_err()
        .to_string();
    assert!(e.contains("channel 9") && e.contains("expected"), "{e}");
}

#[test]
fn a_payload_that_never_comes_stops_on_abort_not_at_the_timeout() {
    let net = LocalNet::new(2);
    let pipes = Arc::new(Pipes::default());
    let (mut l0, mut l1) = ChannelLink::pair(&pipes, 0, 1);
    l0.swallow = true;
    let t = Tensor::from_f32(vec![1], vec![1.0]);
    let mut ep0 = net.endpoint(0);
    let mut s0 = FramedState::default();
    Framed {
        inner: &mut ep0,
        link: &mut l0,
        state: &mut s0,
    }
    .send(1, tag(3, 0), t.clone())
    .unwrap();
    let n0 = net.clone();
    let aborter = thread::spawn(move || {
        thread::sleep(Duration::from_millis(100));
        n0.endpoint(0).abort("device 0 failed: test");
    });
    let mut ep1 = net.endpoint(1);
    let mut s1 = FramedState::default();
    let start = Instant::now();
    let e = Framed {
        inner: &mut ep1,
        link: &mut l1,
        state: &mut s1,
    }
    .recv(0, tag(3, 0), &ty(&t), LONG)
    .unwrap_err();
    aborter.join().unwrap();
    assert!(
        matches!(&e, TransportError::Aborted(m) if m.contains("device 0 failed")),
        "{e:?}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
}
