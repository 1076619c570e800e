//! Mutations: how the engine turns one corpus entry into the next input.
//!
//! Each new input is a corpus entry with one to eight of these applied in a row: a bit
//! flipped; a byte set to an interesting value (0, 0xff, 0x7f, 0x80, separators the formats
//! use); bytes inserted or deleted; a block duplicated; a splice with another entry; a
//! truncation; an integer of 1, 2, 4 or 8 bytes (either byte order) nudged by a small delta
//! or set to an extreme — which is how a length field of a binary format is made to lie;
//! and a token from the target's dictionary (header names, HTTP methods, flags) inserted or
//! written over. Every result is cut to the target's maximum input length.

use crate::rng::Rng;

/// Byte values decoders treat specially.
const INTERESTING: &[u8] = &[
    0, 1, 2, 0x7f, 0x80, 0xfe, 0xff, b'%', b'&', b'=', b'.', b'*', b'#', b' ', b'\r', b'\n', b'/',
    b'?', b':', b'-', b'0', b'9', b'a', b'f', b'F', b'{', b'}', b'"', 0xc3, 0xe2,
];

/// Integer values a length or count field is set to.
const EXTREMES: &[u64] = &[
    0,
    1,
    7,
    8,
    15,
    16,
    255,
    256,
    0x7fff,
    0xffff,
    0x1_0000,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    0x4000_0000,
    u64::MAX,
    u64::MAX / 2,
];

/// Applies one to eight mutations to `data` (which starts as a copy of a corpus entry),
/// splicing from `other` when that mutation is drawn; the result is at most `max_len` bytes.
pub fn mutate(
    rng: &mut Rng,
    data: &mut Vec<u8>,
    other: &[u8],
    dictionary: &[&[u8]],
    max_len: usize,
) {
    let rounds = 1 + rng.below(8);
    for _ in 0..rounds {
        one(rng, data, other, dictionary);
    }
    data.truncate(max_len);
}

fn one(rng: &mut Rng, data: &mut Vec<u8>, other: &[u8], dictionary: &[&[u8]]) {
    let len = data.len();
    match rng.below(12) {
        // Flip one bit.
        0 if len > 0 => {
            let at = rng.below(len);
            data[at] ^= 1 << rng.below(8);
        }
        // Overwrite a byte: random or interesting.
        1 if len > 0 => {
            let at = rng.below(len);
            data[at] = if rng.one_in(2) {
                INTERESTING[rng.below(INTERESTING.len())]
            } else {
                rng.byte()
            };
        }
        // Insert a few bytes.
        2 => {
            let at = rng.below(len + 1);
            let n = 1 + rng.below(8);
            let fill = if rng.one_in(2) {
                INTERESTING[rng.below(INTERESTING.len())]
            } else {
                rng.byte()
            };
            data.splice(at..at, std::iter::repeat_n(fill, n));
        }
        // Delete a range.
        3 if len > 0 => {
            let at = rng.below(len);
            let n = 1 + rng.below((len - at).min(32));
            data.drain(at..at + n);
        }
        // Duplicate a block somewhere else.
        4 if len > 0 => {
            let at = rng.below(len);
            let n = 1 + rng.below((len - at).min(64));
            let block = data[at..at + n].to_vec();
            let to = rng.below(len + 1);
            data.splice(to..to, block);
        }
        // Splice: our head, the other entry's tail.
        5 if !other.is_empty() => {
            let cut = rng.below(len + 1);
            let from = rng.below(other.len());
            data.truncate(cut);
            data.extend_from_slice(&other[from..]);
        }
        // Truncate.
        6 if len > 0 => {
            let at = rng.below(len);
            data.truncate(at);
        }
        // Nudge or replace an integer field (a length, a count, an offset).
        7 | 8 if len > 0 => {
            let width = [1usize, 2, 4, 8][rng.below(4)].min(len);
            let at = rng.below(len - width + 1);
            let big_endian = rng.one_in(3);
            let field = &mut data[at..at + width];
            let mut v = read(field, big_endian);
            v = match rng.below(3) {
                0 => v.wrapping_add(1 + rng.below(16) as u64),
                1 => v.wrapping_sub(1 + rng.below(16) as u64),
                _ => EXTREMES[rng.below(EXTREMES.len())],
            };
            write(field, v, big_endian);
        }
        // A dictionary token, inserted or written over.
        9 | 10 if !dictionary.is_empty() => {
            let token = dictionary[rng.below(dictionary.len())];
            let at = rng.below(len + 1);
            if rng.one_in(2) {
                data.splice(at..at, token.iter().copied());
            } else {
                let end = (at + token.len()).min(len);
                data.splice(at..end, token.iter().copied());
            }
        }
        // Replace a range with random bytes.
        _ if len > 0 => {
            let at = rng.below(len);
            let n = 1 + rng.below((len - at).min(16));
            for b in &mut data[at..at + n] {
                *b = rng.byte();
            }
        }
        // An empty input only grows.
        _ => data.push(rng.byte()),
    }
}

fn read(field: &[u8], big_endian: bool) -> u64 {
    let mut v = 0u64;
    for i in 0..field.len() {
        let b = if big_endian {
            field[i]
        } else {
            field[field.len() - 1 - i]
        };
        v = (v << 8) | u64::from(b);
    }
    v
}

fn write(field: &mut [u8], mut v: u64, big_endian: bool) {
    let n = field.len();
    for i in 0..n {
        let at = if big_endian { n - 1 - i } else { i };
        field[at] = v as u8;
        v >>= 8;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutations_respect_the_length_bound_and_change_inputs() {
        let mut rng = Rng::new(3);
        let mut changed = 0;
        for _ in 0..2000 {
            let mut d = b"tidings-id=0123".to_vec();
            mutate(&mut rng, &mut d, b"other entry", &[b"GET "], 20);
            assert!(d.len() <= 20);
            changed += usize::from(d != b"tidings-id=0123");
        }
        // Nearly every draw changes the input (a flip of a flip may restore it).
        assert!(changed > 1900, "{changed}");
    }

    #[test]
    fn integer_fields_round_trip_in_both_byte_orders() {
        for be in [false, true] {
            let mut f = [0u8; 4];
            write(&mut f, 0x0102_0304, be);
            assert_eq!(read(&f, be), 0x0102_0304);
        }
        let mut f = [0u8; 2];
        write(&mut f, 0x0102, false);
        assert_eq!(f, [2, 1]);
    }
}
