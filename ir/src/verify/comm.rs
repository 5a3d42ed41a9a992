//! Send/recv pairing across the module: every send (stage s, peer p, channel c) needs
//! exactly one recv on stage p from peer s on channel c, receiving the type that was sent.

use std::collections::BTreeMap;

use super::{describe_op, Endpoint, Sink, VerifyErrorKind};
use crate::module::Module;

/// Sends and recvs of one (from, to, channel) link, as indices into the endpoint list.
#[derive(Default)]
struct Link {
    sends: Vec<usize>,
    recvs: Vec<usize>,
}

pub(super) fn pair(m: &Module, endpoints: &[Endpoint], sink: &mut Sink) {
    let mut links: BTreeMap<(i64, i64, i64), Link> = BTreeMap::new();
    for (i, e) in endpoints.iter().enumerate() {
        if e.collective.is_some() {
            continue;
        }
        let link = links.entry((e.from, e.to, e.channel)).or_default();
        if e.is_send {
            link.sends.push(i);
        } else {
            link.recvs.push(i);
        }
    }
    // `@f: op #2 "pp.send"`, naming another endpoint in a message.
    let name = |i: usize| {
        let e = &endpoints[i];
        let f = &m.functions[e.fi];
        format!("@{}: {}", f.name, describe_op(f, e.op))
    };
    for (i, e) in endpoints.iter().enumerate() {
        if e.collective.is_some() {
            continue;
        }
        let f = &m.functions[e.fi];
        let link = &links[&(e.from, e.to, e.channel)];
        let (from, to, c) = (e.from, e.to, e.channel);
        let mut report =
            |kind: VerifyErrorKind, msg: String| sink.op(e.fi, e.pos, f, e.op, kind, msg);
        if e.is_send {
            let first = link.sends[0];
            if first != i {
                let msg = format!("duplicate send from stage {from} to stage {to} on channel {c}; the first is {}", name(first));
                report(VerifyErrorKind::DuplicateSend, msg);
            } else if link.recvs.is_empty() {
                let msg = format!(
                    "unmatched send: no recv on stage {to} from stage {from} on channel {c}"
                );
                report(VerifyErrorKind::UnmatchedSend, msg);
            }
        } else {
            let first = link.recvs[0];
            if first != i {
                let msg = format!("duplicate recv on stage {to} from stage {from} on channel {c}; the first is {}", name(first));
                report(VerifyErrorKind::DuplicateRecv, msg);
            } else if let Some(&s) = link.sends.first() {
                if let (Some(sent), Some(got)) = (&endpoints[s].ty, &e.ty) {
                    if sent != got {
                        let msg = format!(
                            "recv type {got} differs from the sent type {sent} ({})",
                            name(s)
                        );
                        report(VerifyErrorKind::CommTypeMismatch, msg);
                    }
                }
            } else {
                let msg = format!(
                    "unmatched recv: no send from stage {from} to stage {to} on channel {c}"
                );
                report(VerifyErrorKind::UnmatchedRecv, msg);
            }
        }
    }
}

/// `all_reduce` ops of one channel agree on their participants and type, and each stage of
/// the module that they list runs exactly one of them (a module of one stage's functions
/// names the others without holding them).
pub(super) fn reductions(m: &Module, endpoints: &[Endpoint], sink: &mut Sink) {
    let mut by_channel: BTreeMap<i64, Vec<usize>> = BTreeMap::new();
    for (i, e) in endpoints.iter().enumerate() {
        if e.collective.is_some() {
            by_channel.entry(e.channel).or_default().push(i);
        }
    }
    let module_stages: std::collections::BTreeSet<i64> = m
        .functions
        .iter()
        .filter_map(|f| f.attrs.int("stage").ok().flatten())
        .collect();
    let name = |i: usize| {
        let e = &endpoints[i];
        let f = &m.functions[e.fi];
        format!("@{}: {}", f.name, describe_op(f, e.op))
    };
    for (c, list) in by_channel {
        let first = list[0];
        let (stages, replicas) = endpoints[first].collective.clone().unwrap_or_default();
        let mut seen: BTreeMap<i64, usize> = BTreeMap::new();
        for &i in &list {
            let e = &endpoints[i];
            let f = &m.functions[e.fi];
            let mut report =
                |kind: VerifyErrorKind, msg: String| sink.op(e.fi, e.pos, f, e.op, kind, msg);
            if i != first {
                let (s, r) = e.collective.clone().unwrap_or_default();
                if s != stages || r != replicas || e.ty != endpoints[first].ty {
                    report(
                        VerifyErrorKind::CollectiveMismatch,
                        format!(
                            "all_reduce on channel {c} differs from {} (stages, replicas or type)",
                            name(first)
                        ),
                    );
                }
            }
            if let Some(&other) = seen.get(&e.from) {
                report(
                    VerifyErrorKind::UnmatchedCollective,
                    format!(
                        "a second all_reduce on channel {c} on stage {}; the first is {}",
                        e.from,
                        name(other)
                    ),
                );
            } else {
                seen.insert(e.from, i);
            }
        }
        for s in stages.iter().filter(|s| module_stages.contains(s)) {
            if !seen.contains_key(s) {
                let e = &endpoints[first];
                let f = &m.functions[e.fi];
                sink.op(
                    e.fi,
                    e.pos,
                    f,
                    e.op,
                    VerifyErrorKind::UnmatchedCollective,
                    format!(
                        "all_reduce on channel {c} lists stage {s}, which runs no all_reduce on it"
                    ),
                );
            }
        }
    }
}

/// The ZeRO-1 ops (`reduce_scatter`, `shard`, `all_gather`) of one channel are one kind,
/// over the same replicas, shape and dtype (every replica of the stage runs the same
/// program), and one stage runs at most one op of a channel. Channels are their own: an
/// `all_reduce` or a send/recv on the channel of a sharded op is refused too.
pub(super) fn shards(m: &Module, endpoints: &[Endpoint], sink: &mut Sink) {
    use crate::ops::attrs::ShardAttrs;
    use crate::ops::{OpAttrs, OpKind};
    // channel → (function index, op, kind, attrs, stage)
    type Seen = (usize, crate::module::OpId, OpKind, ShardAttrs, Option<i64>);
    let mut first: BTreeMap<i64, Seen> = BTreeMap::new();
    let mut on_stage: BTreeMap<(i64, Option<i64>), String> = BTreeMap::new();
    let others: std::collections::BTreeSet<i64> = endpoints.iter().map(|e| e.channel).collect();
    for (fi, f) in m.functions.iter().enumerate() {
        let fn_stage = f.attrs.int("stage").ok().flatten();
        for (pos, &op) in f.ops().iter().enumerate() {
            // A dangling op or value is the function check's to report.
            if op.index() >= f.num_op_slots() {
                continue;
            }
            let data = f.op(op);
            if data.results().iter().any(|v| v.index() >= f.num_values()) {
                continue;
            }
            if !matches!(
                data.kind,
                OpKind::ReduceScatter | OpKind::Shard | OpKind::AllGather
            ) {
                continue;
            }
            // A malformed attribute is reported by the op's own check.
            let Ok(a) = ShardAttrs::of(&data.attrs) else {
                continue;
            };
            let stage = data.stage.map(i64::from).or(fn_stage);
            let here = format!("@{}: {}", f.name, describe_op(f, op));
            let c = a.channel;
            let mut report =
                |msg: String| sink.op(fi, pos, f, op, VerifyErrorKind::CollectiveMismatch, msg);
            if others.contains(&c) {
                report(format!(
                    "{} on channel {c}, which a send, recv or all_reduce also uses",
                    data.kind
                ));
            }
            match first.get(&c) {
                None => {
                    first.insert(c, (fi, op, data.kind, a.clone(), stage));
                }
                Some((ffi, fop, kind, fa, _)) => {
                    if *kind != data.kind || fa != &a {
                        let other = &m.functions[*ffi];
                        report(format!(
                            "{} on channel {c} differs from @{}: {} (kind, replicas or shape)",
                            data.kind,
                            other.name,
                            describe_op(other, *fop)
                        ));
                    }
                }
            }
            if let Some(prev) = on_stage.get(&(c, stage)) {
                report(format!(
                    "a second {} on channel {c} on this stage; the first is {prev}",
                    data.kind
                ));
            } else {
                on_stage.insert((c, stage), here);
            }
        }
    }
}
