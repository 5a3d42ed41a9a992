//! `npz`: ppcc's `.npz` reader (`ppcc_runtime::npz`), in-process, on a file as `ppcc
//! eval`/`train`/`run` read it.
//!
//! Format-aware mutations keep a valid zip and craft the `.npy` inside: huge or negative
//! shapes (`(2^62, 4)` with no data), wrong or exotic dtypes, Fortran order, truncated
//! data, deflated entries, zip headers that lie about sizes, a deflate bomb.

use std::io::{Cursor, Read, Write};
use std::sync::OnceLock;

use super::{files_with_ext, read_all, Env, Target, Verdict};
use crate::mutate::{interesting, number_text};
use crate::rng::Rng;

use ppcc_runtime::npz as reader;

pub struct Npz;

impl Target for Npz {
    fn name(&self) -> &'static str {
        "npz"
    }
    fn describe(&self) -> &'static str {
        "ppcc's .npz reader (ppcc_runtime::npz::read_npz)"
    }
    fn ext(&self) -> &'static str {
        "npz"
    }
    fn weight(&self) -> u32 {
        3
    }

    fn seeds(&self, env: &Env) -> anyhow::Result<Vec<Vec<u8>>> {
        let paths = files_with_ext(&env.root.join("examples"), &["npz"], false);
        if paths.is_empty() {
            anyhow::bail!("no seed .npz files in {}/examples", env.root.display());
        }
        read_all(&paths)
    }

    fn mutate_structured(
        &self,
        rng: &mut Rng,
        input: &[u8],
        corpus: &[Vec<u8>],
    ) -> Option<Vec<u8>> {
        let mut entries = read_entries(input)?;
        if !corpus.is_empty() && rng.one_in(12) {
            // An entry from another archive (another name, dtype, shape).
            if let Some(mut other) = read_entries(rng.pick(corpus).as_slice()) {
                if !other.is_empty() {
                    let i = rng.below(other.len());
                    entries.push(other.swap_remove(i));
                }
            }
        }
        if entries.is_empty() {
            entries.push(("x.npy".into(), npy(b"'<f4'", false, "(1,)", &[0; 4])));
        }
        let i = rng.below(entries.len());
        match rng.below(10) {
            0..=5 => entries[i].1 = mutate_npy(rng, &entries[i].1)?,
            6 => {
                entries[i].0 = rng
                    .pick(&[
                        "x",
                        "x.npy",
                        ".npy",
                        "../x.npy",
                        "a/b.npy",
                        "labels.npy",
                        "tokens.npy",
                    ])
                    .to_string()
            }
            7 => {
                let e = entries[i].clone();
                entries.push(e);
            }
            8 if rng.one_in(20) => {
                // A deflate bomb: a 7 MB entry that inflates to 1 GiB, under a header
                // that declares 4 MiB of f4 data.
                return Some(bomb().to_vec());
            }
            _ => {}
        }
        let deflate = rng.one_in(3);
        let mut zip = write_entries(&entries, deflate)?;
        if rng.one_in(4) {
            lie_about_sizes(rng, &mut zip);
        }
        Some(zip)
    }

    fn run(&self, env: &Env, input: &[u8]) -> Verdict {
        let path = env.scratch.join("input.npz");
        if let Err(e) = std::fs::write(&path, input) {
            return Verdict::Crash(format!("fuzzer: cannot write {}: {e}", path.display()));
        }
        match reader::read_npz(&path) {
            Ok(arrays) => {
                // What the CLI does next with an array: count and walk its elements.
                for (_, t) in &arrays {
                    let _ = t.num_elements();
                }
                Verdict::Accepted
            }
            Err(e) => Verdict::Rejected(crate::targets::error_chain(&e)),
        }
    }
}

/// The (name, bytes) of every entry, or `None` if it is not a readable zip.
pub fn read_entries(input: &[u8]) -> Option<Vec<(String, Vec<u8>)>> {
    let mut z = zip::ZipArchive::new(Cursor::new(input)).ok()?;
    let mut out = vec![];
    for i in 0..z.len().min(64) {
        let mut e = z.by_index(i).ok()?;
        if e.size() > 64 << 20 {
            return None;
        }
        let mut b = vec![];
        e.read_to_end(&mut b).ok()?;
        out.push((e.name().to_string(), b));
    }
    Some(out)
}

pub fn write_entries(entries: &[(String, Vec<u8>)], deflate: bool) -> Option<Vec<u8>> {
    let mut zip = zip::ZipWriter::new(Cursor::new(Vec::new()));
    let method = if deflate {
        zip::CompressionMethod::Deflated
    } else {
        zip::CompressionMethod::Stored
    };
    let options = zip::write::SimpleFileOptions::default().compression_method(method);
    for (name, bytes) in entries {
        zip.start_file(name.as_str(), options).ok()?;
        zip.write_all(bytes).ok()?;
    }
    Some(zip.finish().ok()?.into_inner())
}

/// An `.npy` (version 1) with this header and data.
pub fn npy(descr: &[u8], fortran: bool, shape: &str, data: &[u8]) -> Vec<u8> {
    let mut header = b"{'descr': ".to_vec();
    header.extend_from_slice(descr);
    header.extend_from_slice(b", 'fortran_order': ");
    header.extend_from_slice(if fortran { b"True" } else { b"False" });
    header.extend_from_slice(b", 'shape': ");
    header.extend_from_slice(shape.as_bytes());
    header.extend_from_slice(b", }");
    while !(10 + header.len() + 1).is_multiple_of(64) {
        header.push(b' ');
    }
    header.push(b'\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(data);
    out
}

/// The header fields of an `.npy` (descr text, fortran, shape text) and its data.
fn parse_npy(b: &[u8]) -> Option<(Vec<u8>, bool, String, Vec<u8>)> {
    if b.len() < 10 || &b[..6] != b"\x93NUMPY" || b[6] != 1 {
        return None;
    }
    let hlen = u16::from_le_bytes([b[8], b[9]]) as usize;
    let header = std::str::from_utf8(b.get(10..10 + hlen)?).ok()?;
    let data = b[10 + hlen..].to_vec();
    let descr_at = header.find("'descr': ")? + 9;
    let descr_end = descr_at + header[descr_at..].find(", '")?;
    let fortran = header.contains("'fortran_order': True");
    let shape_at = header.find("'shape': ")? + 9;
    let shape_end = shape_at + header[shape_at..].find(')')? + 1;
    Some((
        header.as_bytes()[descr_at..descr_end].to_vec(),
        fortran,
        header[shape_at..shape_end].to_string(),
        data,
    ))
}

const DESCRS: &[&[u8]] = &[
    b"'<f4'",
    b"'<f8'",
    b"'<f2'",
    b"'<i8'",
    b"'<i4'",
    b"'|i1'",
    b"'|b1'",
    b"'>f4'",
    b"'>i8'",
    b"'<u4'",
    b"'<u8'",
    b"'|u1'",
    b"'<c8'",
    b"'|O'",
    b"'<U8'",
    b"'|S4'",
    b"'<M8[s]'",
    b"'<V8'",
    b"[('a', '<f4'), ('b', '<i8')]",
    b"'<f16'",
    b"'f4'",
    b"'<i0'",
    b"''",
    b"'<f99999999999'",
];

fn mutate_npy(rng: &mut Rng, bytes: &[u8]) -> Option<Vec<u8>> {
    let (mut descr, mut fortran, mut shape, mut data) = parse_npy(bytes)?;
    match rng.below(8) {
        0 | 1 => shape = crafted_shape(rng),
        2 => {
            // One dimension rewritten, the rest kept.
            let nums: Vec<String> = shape
                .trim_matches(|c| c == '(' || c == ')')
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect();
            let mut nums = if nums.is_empty() {
                vec!["1".into()]
            } else {
                nums
            };
            let i = rng.below(nums.len());
            nums[i] = number_text(rng);
            shape = format!("({},)", nums.join(", "));
        }
        3 => descr = rng.pick(DESCRS).to_vec(),
        4 => fortran = !fortran,
        5 => {
            let n = rng.below(data.len() + 1);
            data.truncate(n);
        }
        6 => {
            let extra = 1 + rng.below(64);
            data.extend(std::iter::repeat_n(0xffu8, extra));
        }
        _ => {
            // Fortran order over a crafted shape, with the data the shape claims when small.
            fortran = true;
            shape = crafted_shape(rng);
        }
    }
    Some(npy(&descr, fortran, &shape, &data))
}

fn crafted_shape(rng: &mut Rng) -> String {
    match rng.below(8) {
        0 => format!("({}, 4)", 1u64 << 62),
        1 => format!("({}, {}, 4)", 1u64 << 31, 1u64 << 31),
        2 => "()".into(),
        3 => "(0,)".into(),
        4 => format!("({}, {})", interesting(rng), interesting(rng)),
        5 => format!("({},)", interesting(rng)),
        6 => format!("(1, {}, {})", 1u64 << 32, 1u64 << 32),
        _ => {
            let rank = rng.below(40);
            let dims: Vec<String> = (0..rank).map(|_| (1 + rng.below(3)).to_string()).collect();
            format!("({},)", dims.join(", "))
        }
    }
}

/// Overwrite the compressed or uncompressed size in a local or central zip header.
fn lie_about_sizes(rng: &mut Rng, zip: &mut [u8]) {
    let sigs: &[(&[u8], usize)] = &[(b"PK\x03\x04", 18), (b"PK\x01\x02", 20)];
    let (sig, base) = *rng.pick(sigs);
    let at: Vec<usize> = zip
        .windows(4)
        .enumerate()
        .filter(|(_, w)| *w == sig)
        .map(|(i, _)| i)
        .collect();
    if at.is_empty() {
        return;
    }
    let field = *rng.pick(&at) + base + 4 * rng.below(2);
    let v = *rng.pick(&[0u32, 1, 0x7fff_ffff, u32::MAX, 1 << 31, 16]);
    if field + 4 <= zip.len() {
        zip[field..field + 4].copy_from_slice(&v.to_le_bytes());
    }
}

/// Bytes of data the bomb inflates to (1 GiB): far more than its header declares
/// ([`BOMB_DECLARED`] elements), so a reader that inflates the whole entry, or trusts the
/// zip entry's sizes, pays 1 GiB for a 4 MiB array.
const BOMB_SIZE: u64 = 1 << 30;
const BOMB_DECLARED: u64 = 1 << 20;

/// An `.npz` whose one entry, `x.npy`, is an f4 header for [`BOMB_DECLARED`] elements
/// followed by `BOMB_SIZE` zeros, deflated to ~7 MB (a fixed-Huffman block of (258, distance 1)
/// copies, written by hand: compressing 1 GiB would take seconds). Built once.
fn bomb() -> &'static [u8] {
    static BOMB: OnceLock<Vec<u8>> = OnceLock::new();
    BOMB.get_or_init(|| {
        let head = npy(b"'<f4'", false, &format!("({BOMB_DECLARED},)"), &[]);
        let mut w = BitWriter::default();
        w.bits(0b011, 3); // final block, fixed Huffman (BTYPE=01, LSB first)
        for &b in &head {
            literal(&mut w, b);
        }
        literal(&mut w, 0);
        let copies = (BOMB_SIZE - 1) / 258;
        for _ in 0..copies {
            w.code(0b1100_0101, 8); // length 258 (symbol 285)
            w.code(0, 5); // distance 1
        }
        for _ in 0..(BOMB_SIZE - 1) % 258 {
            literal(&mut w, 0);
        }
        w.code(0, 7); // end of block (symbol 256)
        let deflated = w.finish();
        let mut crc = flate2::Crc::new();
        crc.update(&head);
        let zeros = vec![0u8; 1 << 20];
        let mut left = BOMB_SIZE;
        while left > 0 {
            let n = left.min(zeros.len() as u64) as usize;
            crc.update(&zeros[..n]);
            left -= n as u64;
        }
        raw_zip_entry("x.npy", &deflated, head.len() as u64 + BOMB_SIZE, crc.sum())
    })
}

/// A literal byte in the fixed Huffman code.
fn literal(w: &mut BitWriter, b: u8) {
    if b < 144 {
        w.code(0x30 + u32::from(b), 8);
    } else {
        w.code(0x190 + u32::from(b) - 144, 9);
    }
}

#[derive(Default)]
struct BitWriter {
    out: Vec<u8>,
    acc: u64,
    n: u32,
}

impl BitWriter {
    /// `len` bits of `v`, least significant first (deflate's header fields).
    fn bits(&mut self, v: u32, len: u32) {
        self.acc |= u64::from(v) << self.n;
        self.n += len;
        while self.n >= 8 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.n -= 8;
        }
    }
    /// A Huffman code of `len` bits, most significant first.
    fn code(&mut self, code: u32, len: u32) {
        let rev = code.reverse_bits() >> (32 - len);
        self.bits(rev, len);
    }
    fn finish(mut self) -> Vec<u8> {
        if self.n > 0 {
            self.out.push(self.acc as u8);
        }
        self.out
    }
}

/// A one-entry zip with deflated data, written by hand (so the sizes can be anything).
fn raw_zip_entry(name: &str, deflated: &[u8], size: u64, crc: u32) -> Vec<u8> {
    let size32 = size.min(u32::MAX as u64 - 1) as u32;
    let mut out = vec![];
    let local = |out: &mut Vec<u8>| {
        out.extend_from_slice(b"PK\x03\x04");
        out.extend_from_slice(&20u16.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&8u16.to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(&(deflated.len() as u32).to_le_bytes());
        out.extend_from_slice(&size32.to_le_bytes());
        out.extend_from_slice(&(name.len() as u16).to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(name.as_bytes());
    };
    local(&mut out);
    out.extend_from_slice(deflated);
    let cd_at = out.len();
    out.extend_from_slice(b"PK\x01\x02");
    out.extend_from_slice(&20u16.to_le_bytes());
    out.extend_from_slice(&20u16.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&8u16.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&(deflated.len() as u32).to_le_bytes());
    out.extend_from_slice(&size32.to_le_bytes());
    out.extend_from_slice(&(name.len() as u16).to_le_bytes());
    out.extend_from_slice(&[0; 12]);
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(name.as_bytes());
    let cd_len = out.len() - cd_at;
    out.extend_from_slice(b"PK\x05\x06");
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&(cd_len as u32).to_le_bytes());
    out.extend_from_slice(&(cd_at as u32).to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crafted_npy_round_trips_through_the_parser() {
        let b = npy(b"'<f4'", true, "(2, 3)", &[1, 2]);
        assert_eq!(b.len() % 64, 2);
        let (d, f, s, data) = parse_npy(&b).expect("parses");
        assert_eq!(
            (d.as_slice(), f, s.as_str(), data.as_slice()),
            (&b"'<f4'"[..], true, "(2, 3)", &[1u8, 2][..])
        );
    }

    /// Writes the deflate bomb to `$PPCC_FUZZ_BOMB` (to inspect it: `cargo test -p ppcc-fuzz
    /// write_bomb -- --ignored`).
    #[test]
    #[ignore]
    fn write_bomb() {
        if let Some(p) = std::env::var_os("PPCC_FUZZ_BOMB") {
            std::fs::write(p, bomb()).expect("writable");
        }
    }

    #[test]
    fn hand_written_deflate_inflates() {
        use std::io::Read;
        let mut w = BitWriter::default();
        w.bits(0b011, 3);
        literal(&mut w, b'a');
        literal(&mut w, 200);
        w.code(0b1100_0101, 8);
        w.code(0, 5);
        w.code(0, 7);
        let mut out = vec![];
        flate2::read::DeflateDecoder::new(w.finish().as_slice())
            .read_to_end(&mut out)
            .expect("valid deflate");
        assert_eq!(out.len(), 260);
        assert_eq!(&out[..3], &[b'a', 200, 200]);
    }

    #[test]
    fn mutated_archives_stay_zips() {
        let seed = write_entries(
            &[("x.npy".into(), npy(b"'<f4'", false, "(1,)", &[0; 4]))],
            false,
        )
        .unwrap();
        let mut rng = Rng::new(3);
        let zips = (0..40)
            .filter_map(|_| Npz.mutate_structured(&mut rng, &seed, std::slice::from_ref(&seed)))
            .filter(|z| read_entries(z).is_some())
            .count();
        assert!(zips > 20, "{zips} of 40 mutations are readable zips");
    }
}
