//! CRC-32C of record frames: the `crc32` instruction of SSE 4.2 when the CPU has it (checked
//! once per call, cached by the standard library), three frames at a time on the read path.
//!
//! # Why three at a time
//!
//! The instruction has a latency of three cycles and a throughput of one per cycle: one frame's
//! CRC is a chain of dependent steps (about 35 for a 256-byte payload), so it runs at a third of
//! the instruction's speed. Interleaving the chains of three frames fills the pipeline. A
//! frame's CRC covers its own bytes only (the format does not change), so a reader checks the
//! next three frames of its buffer together.
//!
//! # Unsafe
//!
//! The only `unsafe` in this crate: calling the `sse4.2` functions below, each right after
//! `is_x86_feature_detected!("sse4.2")` returned true. Without the feature (or off x86-64) the
//! portable `crc32c` crate computes the same values.

/// CRC-32C of a frame: its 4-byte length prefix followed by its body (the CRC field between
/// them is not covered).
pub(crate) fn frame_crc(len_bytes: [u8; 4], body: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("sse4.2") {
        // SAFETY: the CPU supports SSE 4.2, checked just above.
        return unsafe { hw::one(u32::from_le_bytes(len_bytes), body) };
    }
    portable(len_bytes, body)
}

/// [`frame_crc`] of three frames at once.
#[inline]
pub(crate) fn frame_crc3(frames: [([u8; 4], &[u8]); 3]) -> [u32; 3] {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("sse4.2") {
        // SAFETY: the CPU supports SSE 4.2, checked just above.
        return unsafe { hw::three(frames) };
    }
    frames.map(|(len, body)| portable(len, body))
}

fn portable(len_bytes: [u8; 4], body: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&len_bytes), body)
}

#[cfg(target_arch = "x86_64")]
mod hw {
    use std::arch::x86_64::{_mm_crc32_u8, _mm_crc32_u32, _mm_crc32_u64};

    #[inline]
    fn word(w: &[u8]) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        u64::from_le_bytes(b)
    }

    /// The state after the length prefix.
    #[inline]
    #[target_feature(enable = "sse4.2")]
    fn start(len: u32) -> u64 {
        u64::from(_mm_crc32_u32(!0, len))
    }

    /// Continues `crc` over `rest` and finishes it.
    #[inline]
    #[target_feature(enable = "sse4.2")]
    fn finish(mut crc: u64, rest: &[u8]) -> u32 {
        let words = rest.chunks_exact(8);
        let tail = words.remainder();
        for w in words {
            crc = _mm_crc32_u64(crc, word(w));
        }
        // The truncation keeps the CRC: `crc32q` leaves the upper half zero.
        let mut c = crc as u32;
        for &b in tail {
            c = _mm_crc32_u8(c, b);
        }
        !c
    }

    #[target_feature(enable = "sse4.2")]
    pub(super) fn one(len: u32, body: &[u8]) -> u32 {
        finish(start(len), body)
    }

    #[target_feature(enable = "sse4.2")]
    pub(super) fn three(frames: [([u8; 4], &[u8]); 3]) -> [u32; 3] {
        let [(l0, b0), (l1, b1), (l2, b2)] = frames;
        let mut c0 = start(u32::from_le_bytes(l0));
        let mut c1 = start(u32::from_le_bytes(l1));
        let mut c2 = start(u32::from_le_bytes(l2));
        // The whole words all three have, interleaved; then each one's rest.
        let common = b0.len().min(b1.len()).min(b2.len()) / 8 * 8;
        let (h0, r0) = b0.split_at(common);
        let (h1, r1) = b1.split_at(common);
        let (h2, r2) = b2.split_at(common);
        for ((w0, w1), w2) in h0
            .chunks_exact(8)
            .zip(h1.chunks_exact(8))
            .zip(h2.chunks_exact(8))
        {
            c0 = _mm_crc32_u64(c0, word(w0));
            c1 = _mm_crc32_u64(c1, word(w1));
            c2 = _mm_crc32_u64(c2, word(w2));
        }
        [finish(c0, r0), finish(c1, r1), finish(c2, r2)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The fast paths compute the format's CRC (the portable crate's), one frame or three
        /// of different lengths at a time.
        #[test]
        fn matches_the_portable_crc(
            len in any::<[u8; 4]>(),
            bodies in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..300), 3),
        ) {
            for b in &bodies {
                prop_assert_eq!(frame_crc(len, b), portable(len, b));
            }
            let got = frame_crc3([(len, &bodies[0]), ([1, 2, 3, 4], &bodies[1]), (len, &bodies[2])]);
            prop_assert_eq!(
                got,
                [portable(len, &bodies[0]), portable([1, 2, 3, 4], &bodies[1]), portable(len, &bodies[2])]
            );
        }
    }

    #[test]
    fn known_value() {
        // CRC-32C("123456789") is the standard check value; split as a 4-byte prefix + body.
        assert_eq!(frame_crc(*b"1234", b"56789"), 0xE306_9283);
        assert_eq!(frame_crc3([(*b"1234", b"56789"); 3]), [0xE306_9283; 3]);
    }
}
