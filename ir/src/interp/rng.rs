//! The counter-based random numbers of training-mode `dropout`.
//!
//! A mask element depends only on four integers — the op's `seed` attribute, the training
//! step and micro-batch (the op's `key` operand) and the element's row-major index in x —
//! so every stage, device and code generator draws the same mask for the same
//! (seed, step, micro-batch, op) however the program is partitioned. There is no state.
//!
//! The function, exactly (all arithmetic on `u64`, wrapping; `^` is xor, `>>` logical):
//!
//! ```text
//! G = 0x9E3779B97F4A7C15
//! mix(z) = z ^= z >> 30; z *= 0xBF58476D1CE4E5B9;        (the splitmix64 finaliser)
//!          z ^= z >> 27; z *= 0x94D049BB133111EB;
//!          z ^ (z >> 31)
//! h = mix(seed ^ G)
//! h = mix((h + G) ^ step)
//! h = mix((h + G) ^ micro)
//! h = mix((h + G) ^ index)
//! u = (h >> 11) · 2^-53                                   (uniform in [0, 1), 53 bits)
//! keep = u >= ratio
//! ```
//!
//! where seed, step and micro-batch are the `i64` values reinterpreted as `u64` (two's
//! complement). The first three steps are per op and call, so generated code hoists them
//! and pays one `mix` per element. Kept elements are scaled by `1 / (1 - ratio)`.

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// The splitmix64 finaliser: a bijection on `u64` with full avalanche.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The per-call part of the hash: depends on the op's seed, the step and the micro-batch.
pub fn dropout_stream(seed: i64, step: i64, micro: i64) -> u64 {
    let h = mix64(seed as u64 ^ GOLDEN);
    let h = mix64(h.wrapping_add(GOLDEN) ^ step as u64);
    mix64(h.wrapping_add(GOLDEN) ^ micro as u64)
}

/// The uniform number in `[0, 1)` of element `index` of a stream.
pub fn stream_uniform(stream: u64, index: u64) -> f64 {
    let h = mix64(stream.wrapping_add(GOLDEN) ^ index);
    (h >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// `u(seed, step, micro, index)`, uniform in `[0, 1)`.
pub fn dropout_uniform(seed: i64, step: i64, micro: i64, index: u64) -> f64 {
    stream_uniform(dropout_stream(seed, step, micro), index)
}

/// Whether dropout keeps element `index`: `u(seed, step, micro, index) >= ratio`.
pub fn dropout_keep(seed: i64, step: i64, micro: i64, index: u64, ratio: f64) -> bool {
    dropout_uniform(seed, step, micro, index) >= ratio
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        // splitmix64's published first output for state 0 is mix64(0 + G).
        assert_eq!(mix64(GOLDEN), 0xE220_A839_7B1D_CDAF);
        // Pinned values (computed independently from the formula in the module doc):
        // generated code must reproduce these bits.
        assert_eq!(dropout_uniform(0, 0, 0, 0), 0.1296456182997474);
        assert_eq!(dropout_uniform(7, 3, 1, 42), 0.3663605512291851);
        assert_eq!(dropout_uniform(-1, 5, 2, 1000), 0.9901240553795713);
        assert_eq!(
            mix64(dropout_stream(7, 3, 1).wrapping_add(GOLDEN) ^ 42),
            0x5DC9_CE1A_12E9_FB06
        );
        assert_eq!(dropout_uniform(7, 3, 1, 42), dropout_uniform(7, 3, 1, 42));
        assert_ne!(dropout_uniform(7, 3, 1, 42), dropout_uniform(8, 3, 1, 42));
        assert_ne!(dropout_uniform(7, 3, 1, 42), dropout_uniform(7, 4, 1, 42));
        assert_ne!(dropout_uniform(7, 3, 1, 42), dropout_uniform(7, 3, 2, 42));
        assert_ne!(dropout_uniform(7, 3, 1, 42), dropout_uniform(7, 3, 1, 43));
    }

    #[test]
    fn roughly_uniform() {
        let n = 100_000;
        let mut buckets = [0usize; 10];
        let mut kept = 0;
        for i in 0..n {
            let u = dropout_uniform(1, 2, 3, i);
            buckets[(u * 10.0) as usize] += 1;
            kept += dropout_keep(1, 2, 3, i, 0.3) as usize;
        }
        for b in buckets {
            assert!((9_500..10_500).contains(&b), "{buckets:?}");
        }
        assert!((69_000..71_000).contains(&kept), "{kept}");
    }
}
