//! [`RecordRef`]: a record read by a [`LogReader`](crate::LogReader), borrowed from the reader's
//! read buffer instead of owned (no reference count, no allocation per record).

use std::fmt;

use bytes::Bytes;

use crate::excerpt::Excerpt;
use crate::record::{self, FRAME_PREFIX, MIN_BODY, StoredRecord, u32_at, u64_at};

/// A record borrowed from a [`LogReader`](crate::LogReader)'s read buffer: valid until the
/// reader's next call. Checked exactly as [`Log::read`](crate::Log::read) checks a record
/// (length, CRC-32C, body structure, stored offset) before it is handed out.
///
/// [`RecordRef::to_stored`] copies it into an owned [`StoredRecord`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct RecordRef<'a> {
    /// The offset the log assigned.
    pub offset: u64,
    /// Timestamp given at append.
    pub timestamp_ms: u64,
    /// Key given at append.
    pub key: Option<&'a [u8]>,
    /// Payload given at append.
    pub payload: &'a [u8],
    /// The header entries as stored (`header_count` of them), already checked.
    headers: &'a [u8],
    header_count: u32,
}

impl<'a> RecordRef<'a> {
    /// The headers given at append, in order: `(name, value)`.
    #[must_use]
    pub fn headers(&self) -> Headers<'a> {
        Headers {
            rest: self.headers,
            left: self.header_count,
        }
    }

    /// An owned copy (key, header values and payload copied into fresh buffers).
    #[must_use]
    pub fn to_stored(&self) -> StoredRecord {
        StoredRecord {
            offset: self.offset,
            timestamp_ms: self.timestamp_ms,
            key: self.key.map(Bytes::copy_from_slice),
            headers: self
                .headers()
                .map(|(n, v)| (n.to_owned(), Bytes::copy_from_slice(v)))
                .collect(),
            payload: Bytes::copy_from_slice(self.payload),
        }
    }

    /// Decodes the frame `frame` (exactly one whole frame, its checksum already verified),
    /// checking the whole body structure as [`record::check_frame`] does.
    #[inline]
    pub(crate) fn decode(frame: &'a [u8]) -> Result<Self, &'static str> {
        let body = frame
            .get(FRAME_PREFIX..)
            .filter(|b| b.len() >= MIN_BODY)
            .ok_or("malformed record body")?;
        let (offset, timestamp_ms) = (u64_at(body, 0), u64_at(body, 8));
        if body[16] == 0 && u32_at(body, 17) == 0 {
            // No key, no headers (the common shape): the rest of the body is the payload.
            return Ok(Self {
                offset,
                timestamp_ms,
                key: None,
                payload: &body[MIN_BODY..],
                headers: &[],
                header_count: 0,
            });
        }
        let layout = record::walk(body, |_, _| {})?;
        // `walk` checked every length: the header entries run from after the count to the
        // payload.
        let count_at = layout.key.as_ref().map_or(17, |k| k.end);
        Ok(Self {
            offset,
            timestamp_ms,
            key: layout.key.map(|k| &body[k]),
            payload: &body[layout.payload.clone()],
            headers: &body[count_at + 4..layout.payload.start],
            header_count: u32_at(body, count_at),
        })
    }
}

/// The headers of a [`RecordRef`], in order (see [`RecordRef::headers`]).
#[derive(Debug, Clone)]
pub struct Headers<'a> {
    rest: &'a [u8],
    left: u32,
}

impl<'a> Iterator for Headers<'a> {
    type Item = (&'a str, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        // The entries were checked when the record was decoded (lengths in bounds, names
        // UTF-8); the checks here only keep a malformed slice from panicking.
        self.left = self.left.checked_sub(1)?;
        let rest = self.rest;
        let name_len = usize::from(u16::from_le_bytes([*rest.first()?, *rest.get(1)?]));
        let name = std::str::from_utf8(rest.get(2..2 + name_len)?).ok()?;
        let at = 2 + name_len;
        let value_len = u32_at(rest.get(at..at + 4)?, 0) as usize;
        let value = rest.get(at + 4..at + 4 + value_len)?;
        self.rest = &rest[at + 4 + value_len..];
        Some((name, value))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(self.left as usize))
    }
}

/// One line, as for [`StoredRecord`]: offset, timestamp, key, headers and a short payload
/// preview (each an [`Excerpt`]: bounded, whatever the record holds).
impl fmt::Display for RecordRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "offset={} ts={}", self.offset, self.timestamp_ms)?;
        if let Some(k) = self.key {
            write!(f, " key={}", Excerpt::of(k))?;
        }
        for (name, value) in self.headers() {
            write!(f, " {}={}", Excerpt::of(name), Excerpt::of(value))?;
        }
        write!(
            f,
            " payload[{}]={}",
            self.payload.len(),
            Excerpt::of(self.payload)
        )
    }
}

impl fmt::Debug for RecordRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordRef")
            .field("offset", &self.offset)
            .field("timestamp_ms", &self.timestamp_ms)
            .field("key", &self.key.map(Excerpt::of))
            .field("headers", &self.headers().collect::<Vec<_>>())
            .field("payload", &Excerpt::of(self.payload))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Frame, Record, check_frame, decode, encode_into};

    fn frame(r: &Record) -> Vec<u8> {
        let mut b = Vec::new();
        encode_into(&mut b, 11, r);
        b
    }

    #[test]
    fn borrowed_decode_equals_the_owned_one() {
        let shapes = [
            Record::new(5, "plain"),
            Record::new(6, Bytes::new()),
            Record::new(7, "keyed").with_key("k"),
            Record::new(8, "headers")
                .with_header("h1", "v1")
                .with_header("", "")
                .with_header("h\u{e9}", vec![0; 3]),
            Record::new(9, "both").with_key("").with_header("a", "b"),
        ];
        for r in shapes {
            let f = frame(&r);
            let owned = decode(&Bytes::from(f.clone())).unwrap();
            let borrowed = RecordRef::decode(&f).unwrap();
            assert_eq!(borrowed.to_stored(), owned);
            assert_eq!(borrowed.to_string(), owned.to_string());
            assert_eq!(borrowed.headers().count(), r.headers.len());
        }
    }

    #[test]
    fn a_frame_the_full_check_refuses_is_refused() {
        // Every single-byte change of the body that keeps the frame's checksum verified (the
        // caller's job) but breaks the structure is refused by both decoders alike.
        let f = frame(&Record::new(1, "p").with_key("key").with_header("n", "v"));
        for i in FRAME_PREFIX..f.len() {
            for v in [0u8, 1, 0x7f, 0xff] {
                let mut b = f.clone();
                b[i] = v;
                let len = b.len() as u32 - FRAME_PREFIX as u32;
                b[..4].copy_from_slice(&len.to_le_bytes());
                let crc = crate::crc::frame_crc(len.to_le_bytes(), &b[FRAME_PREFIX..]);
                b[4..8].copy_from_slice(&crc.to_le_bytes());
                let full = matches!(check_frame(&b), Frame::Good { .. });
                assert_eq!(RecordRef::decode(&b).is_ok(), full, "byte {i} = {v}");
            }
        }
    }
}
