//! Structured inputs from flat bytes, and back.
//!
//! The engine mutates bytes; a decoder may take a structure (a record with headers, an
//! argument list). A target reads its structure from the bytes with [`Fields`] (and
//! [`int`]), and writes its seeds with [`join`], the exact inverse, so a seed made from a
//! real encoding reads back as that encoding and every mutation of it is still mostly
//! well-formed. The length prefixes are themselves mutated (the engine's integer
//! mutations), which splits, merges and cuts fields.

/// Length-prefixed fields: `u16` little-endian length, then that many bytes. A length beyond
/// the end takes what is left; a lone trailing byte is one field of that byte.
#[derive(Debug, Clone)]
pub struct Fields<'a>(&'a [u8]);

impl<'a> Fields<'a> {
    /// The fields of `data`.
    #[must_use]
    pub fn new(data: &'a [u8]) -> Self {
        Self(data)
    }

    /// The next field, or an empty one when the input is used up.
    pub fn next_or_empty(&mut self) -> &'a [u8] {
        self.next().unwrap_or(&[])
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        match self.0 {
            [] => None,
            [_] => {
                let one = self.0;
                self.0 = &[];
                Some(one)
            }
            [a, b, rest @ ..] => {
                let n = usize::from(u16::from_le_bytes([*a, *b])).min(rest.len());
                let (field, tail) = rest.split_at(n);
                self.0 = tail;
                Some(field)
            }
        }
    }
}

/// The bytes whose [`Fields`] are `fields` (each at most `u16::MAX` bytes; longer ones are
/// cut).
#[must_use]
pub fn join<T: AsRef<[u8]>>(fields: impl IntoIterator<Item = T>) -> Vec<u8> {
    let mut out = Vec::new();
    for f in fields {
        let f = f.as_ref();
        let f = &f[..f.len().min(usize::from(u16::MAX))];
        out.extend_from_slice(&(f.len() as u16).to_le_bytes());
        out.extend_from_slice(f);
    }
    out
}

/// A little-endian integer of up to 8 bytes (more are ignored, fewer zero-extended): how a
/// target reads a number out of a field.
#[must_use]
pub fn int(field: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    let n = field.len().min(8);
    a[..n].copy_from_slice(&field[..n]);
    u64::from_le_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_then_fields_gives_the_fields_back() {
        let parts: [&[u8]; 4] = [b"", b"name", &[0, 1, 2], b"x"];
        let joined = join(parts);
        let got: Vec<&[u8]> = Fields::new(&joined).collect();
        assert_eq!(got, parts);
        // A lying length takes the rest; a lone byte is a field.
        assert_eq!(
            Fields::new(&[9, 0, 1, 2]).collect::<Vec<_>>(),
            [&[1u8, 2][..]]
        );
        assert_eq!(Fields::new(&[7]).collect::<Vec<_>>(), [&[7u8][..]]);
        assert_eq!(int(&[1, 1]), 257);
        assert_eq!(int(&[0xff; 12]), u64::MAX);
    }
}
