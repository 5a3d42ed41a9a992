//! Format-blind mutations of bytes (AFL/libFuzzer's classic set): bit flips, byte and
//! integer overwrites with boundary values, arithmetic, truncation, chunk deletion and
//! duplication, splicing with another corpus entry, and rewriting decimal numbers in text.
//! Targets stack these with their format-aware mutations.

use crate::rng::Rng;

/// Inputs never grow past this (the readers' size limits are tested by crafted inputs).
pub const MAX_LEN: usize = 4 << 20;

/// Boundary values for sizes, dims and counts: zero, ±1, powers of two around the 32- and
/// 64-bit edges, and the extremes.
pub const INTERESTING: &[i64] = &[
    0,
    1,
    -1,
    2,
    3,
    7,
    8,
    16,
    127,
    128,
    255,
    256,
    1024,
    65535,
    65536,
    i32::MAX as i64,
    1 << 31,
    -(1 << 31),
    u32::MAX as i64,
    1 << 32,
    1 << 40,
    1_000_000_000_000,
    1 << 53,
    1 << 62,
    i64::MAX,
    i64::MIN,
    -2,
];

pub fn interesting(rng: &mut Rng) -> i64 {
    *rng.pick(INTERESTING)
}

/// Apply one to four byte-level mutations to `data`.
pub fn mutate_bytes(rng: &mut Rng, data: &mut Vec<u8>, corpus: &[Vec<u8>]) {
    for _ in 0..1 + rng.below(4) {
        mutate_once(rng, data, corpus);
    }
    data.truncate(MAX_LEN);
}

fn mutate_once(rng: &mut Rng, data: &mut Vec<u8>, corpus: &[Vec<u8>]) {
    if data.is_empty() {
        data.extend((0..1 + rng.below(16)).map(|_| rng.next_u64() as u8));
        return;
    }
    let len = data.len();
    let pos = rng.below(len);
    match rng.below(12) {
        0 => data[pos] ^= 1 << rng.below(8),
        1 => data[pos] = rng.next_u64() as u8,
        2 => data[pos] = *rng.pick(&[0u8, 0xff, 0x7f, 0x80, 0x01, b'9', b'-', b'"', b'\n']),
        3 => {
            // An integer of 1, 2, 4 or 8 bytes, either endianness.
            let width = *rng.pick(&[1usize, 2, 4, 8]);
            let v = interesting(rng);
            let bytes = if rng.one_in(2) {
                v.to_le_bytes()
            } else {
                v.to_be_bytes()
            };
            let src = if bytes[0] == 0 && width < 8 && rng.one_in(2) {
                &bytes[8 - width..]
            } else {
                &bytes[..width]
            };
            for (i, b) in src.iter().enumerate() {
                if pos + i < len {
                    data[pos + i] = *b;
                }
            }
        }
        4 => {
            let delta = 1 + rng.below(35) as u8;
            data[pos] = if rng.one_in(2) {
                data[pos].wrapping_add(delta)
            } else {
                data[pos].wrapping_sub(delta)
            };
        }
        5 => data.truncate(rng.below(len)),
        6 => {
            let n = 1 + rng.below((len - pos).min(256));
            data.drain(pos..pos + n);
        }
        7 => {
            let n = 1 + rng.below((len - pos).min(1024));
            let chunk = data[pos..pos + n].to_vec();
            let at = rng.below(len + 1);
            let times = if rng.one_in(8) { 1 + rng.below(16) } else { 1 };
            for _ in 0..times {
                data.splice(at..at, chunk.iter().copied());
            }
        }
        8 => {
            // Splice: our prefix, another entry's suffix.
            if let Some(other) = (!corpus.is_empty()).then(|| rng.pick(corpus)) {
                let from = rng.below(other.len());
                data.truncate(pos);
                data.extend_from_slice(&other[from..]);
            }
        }
        9 => {
            let n = 1 + rng.below(32);
            let bytes: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
            data.splice(pos..pos, bytes);
        }
        10 => rewrite_number(rng, data),
        _ => {
            // A protobuf varint of a boundary value over whatever is here.
            let v = interesting(rng) as u64;
            let enc = varint(v);
            let end = (pos + enc.len()).min(len);
            data.splice(pos..end, enc);
        }
    }
}

/// Replace a run of ASCII digits with a boundary value in decimal (for text inside the
/// input: npy headers, JSON, CSV cells).
pub fn rewrite_number(rng: &mut Rng, data: &mut Vec<u8>) {
    let starts: Vec<usize> = (0..data.len())
        .filter(|&i| data[i].is_ascii_digit() && (i == 0 || !data[i - 1].is_ascii_digit()))
        .collect();
    if starts.is_empty() {
        return;
    }
    let s = *rng.pick(&starts);
    let mut e = s;
    while e < data.len() && data[e].is_ascii_digit() {
        e += 1;
    }
    let text = number_text(rng);
    data.splice(s..e, text.into_bytes());
}

/// A boundary number as text, sometimes past `u64`, negative, or as a float.
pub fn number_text(rng: &mut Rng) -> String {
    match rng.below(8) {
        0 => "18446744073709551616".into(),
        1 => "99999999999999999999999999".into(),
        2 => format!("{}.5", interesting(rng)),
        3 => "1e308".into(),
        _ => interesting(rng).to_string(),
    }
}

pub fn varint(mut v: u64) -> Vec<u8> {
    let mut out = vec![];
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return out;
        }
        out.push(b | 0x80);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutations_are_deterministic_and_change_the_input() {
        let seed = b"{\"a\": [1, 2, 3], \"b\": \"0F12\"}".to_vec();
        let corpus = vec![seed.clone()];
        let run = |s| {
            let mut rng = Rng::new(s);
            (0..50)
                .map(|_| {
                    let mut d = seed.clone();
                    mutate_bytes(&mut rng, &mut d, &corpus);
                    d
                })
                .collect::<Vec<_>>()
        };
        let a = run(1);
        assert_eq!(a, run(1));
        assert_ne!(a, run(2));
        assert!(a.iter().filter(|d| **d != seed).count() > 40);
    }

    #[test]
    fn varint_encodes_like_protobuf() {
        assert_eq!(varint(1), [1]);
        assert_eq!(varint(300), [0xac, 0x02]);
        assert_eq!(varint(u64::MAX).len(), 10);
    }
}
