//! Record types and the record codec (see the [record layout](crate#record-layout)).
//!
//! Encoding writes straight into the caller's buffer: no allocation per field. Decoding checks
//! the length, the CRC-32C and the whole body structure before anything is trusted, and slices
//! key, header values and payload out of the read buffer without copying.

use std::fmt;
use std::ops::Range;

use bytes::Bytes;

use crate::config::MAX_RECORD_BYTES;
use crate::excerpt::Excerpt;

/// Bytes before the body: `u32` body length and `u32` CRC-32C.
pub(crate) const FRAME_PREFIX: usize = 8;
/// Smallest body: offset, timestamp, flags, header count.
pub(crate) const MIN_BODY: usize = 8 + 8 + 1 + 4;
/// Smallest whole frame.
pub(crate) const MIN_FRAME: usize = FRAME_PREFIX + MIN_BODY;
/// Longest header name.
pub const MAX_HEADER_NAME: usize = u16::MAX as usize;

const FLAG_KEY: u8 = 1;

/// A record to append. The log assigns its offset.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Record {
    /// Milliseconds since the UNIX epoch, chosen by the caller. Timestamps need not be monotonic;
    /// see [`Log::offset_for_time`](crate::Log::offset_for_time).
    pub timestamp_ms: u64,
    /// Optional key.
    pub key: Option<Bytes>,
    /// Headers, in order; names are UTF-8 of at most 65,535 bytes.
    pub headers: Vec<(String, Bytes)>,
    /// The payload.
    pub payload: Bytes,
}

impl Record {
    /// A record with this timestamp and payload, no key, no headers.
    pub fn new(timestamp_ms: u64, payload: impl Into<Bytes>) -> Self {
        Self {
            timestamp_ms,
            key: None,
            headers: Vec::new(),
            payload: payload.into(),
        }
    }

    /// Sets the key.
    #[must_use]
    pub fn with_key(mut self, key: impl Into<Bytes>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Adds a header.
    #[must_use]
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<Bytes>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Size of the encoded frame on disk, prefix included.
    pub fn encoded_len(&self) -> u64 {
        let mut n = (FRAME_PREFIX + MIN_BODY) as u64 + self.payload.len() as u64;
        if let Some(k) = &self.key {
            n += 4 + k.len() as u64;
        }
        for (name, value) in &self.headers {
            n += 2 + name.len() as u64 + 4 + value.len() as u64;
        }
        n
    }
}

/// A record read back from the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRecord {
    /// The offset the log assigned.
    pub offset: u64,
    /// Timestamp given at append.
    pub timestamp_ms: u64,
    /// Key given at append.
    pub key: Option<Bytes>,
    /// Headers given at append.
    pub headers: Vec<(String, Bytes)>,
    /// Payload given at append.
    pub payload: Bytes,
}

impl StoredRecord {
    /// The record as it was appended (without its offset).
    pub fn to_record(&self) -> Record {
        Record {
            timestamp_ms: self.timestamp_ms,
            key: self.key.clone(),
            headers: self.headers.clone(),
            payload: self.payload.clone(),
        }
    }
}

/// One line: offset, timestamp, key, headers and a short payload preview (each an
/// [`Excerpt`]: bounded, whatever the record holds).
impl fmt::Display for StoredRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "offset={} ts={}", self.offset, self.timestamp_ms)?;
        if let Some(k) = &self.key {
            write!(f, " key={}", Excerpt::of(k))?;
        }
        for (name, value) in &self.headers {
            write!(f, " {}={}", Excerpt::of(name), Excerpt::of(value))?;
        }
        write!(
            f,
            " payload[{}]={}",
            self.payload.len(),
            Excerpt::of(&self.payload)
        )
    }
}

/// Appends the frame of `record` with `offset` to `buf`. The caller has checked
/// [`Record::encoded_len`] against the limits. (Tests; the writer batches the CRCs.)
#[cfg(test)]
pub(crate) fn encode_into(buf: &mut Vec<u8>, offset: u64, record: &Record) {
    let start = buf.len();
    encode_without_crc(buf, offset, record);
    fill_crcs(&mut buf[start..]);
}

/// [`encode_into`] with the CRC field left zero: the writer fills the CRCs of all the frames in
/// its buffer with [`fill_crcs`] just before handing it to the storage, three frames at a time
/// (see [`crate::crc`]); nothing reads the buffer before that.
pub(crate) fn encode_without_crc(buf: &mut Vec<u8>, offset: u64, record: &Record) {
    let total = record.encoded_len() as usize;
    buf.reserve(total);
    let body_len = (total - FRAME_PREFIX) as u32;
    // Prefix and fixed fields in one copy: length, CRC (zero for now), offset, timestamp, flags.
    let mut head = [0u8; FRAME_PREFIX + 17];
    head[..4].copy_from_slice(&body_len.to_le_bytes());
    head[8..16].copy_from_slice(&offset.to_le_bytes());
    head[16..24].copy_from_slice(&record.timestamp_ms.to_le_bytes());
    head[24] = if record.key.is_some() { FLAG_KEY } else { 0 };
    buf.extend_from_slice(&head);
    if let Some(k) = &record.key {
        buf.extend_from_slice(&(k.len() as u32).to_le_bytes());
        buf.extend_from_slice(k);
    }
    buf.extend_from_slice(&(record.headers.len() as u32).to_le_bytes());
    for (name, value) in &record.headers {
        buf.extend_from_slice(&(name.len() as u16).to_le_bytes());
        buf.extend_from_slice(name.as_bytes());
        buf.extend_from_slice(&(value.len() as u32).to_le_bytes());
        buf.extend_from_slice(value);
    }
    buf.extend_from_slice(&record.payload);
}

/// Computes and stores the CRC of every frame in `frames`, which holds whole frames back to
/// back as written by [`encode_without_crc`] (their length prefixes are trusted: this process
/// wrote them). Three frames at a time, so that the three CRC chains overlap.
pub(crate) fn fill_crcs(frames: &mut [u8]) {
    let len_at = |frames: &[u8], at: usize| FRAME_PREFIX + u32_at(frames, at) as usize;
    let mut at = 0;
    while at < frames.len() {
        let mut starts = [(0usize, 0usize); 3];
        let mut n = 0;
        let mut next = at;
        while n < 3 && next < frames.len() {
            let len = len_at(frames, next);
            starts[n] = (next, len);
            next += len;
            n += 1;
        }
        let view = &*frames;
        let part = |i: usize| -> ([u8; 4], &[u8]) {
            if i >= n {
                return ([0; 4], &[]);
            }
            let (a, len) = starts[i];
            let mut len_bytes = [0; 4];
            len_bytes.copy_from_slice(&view[a..a + 4]);
            (len_bytes, &view[a + FRAME_PREFIX..a + len])
        };
        let crcs = crate::crc::frame_crc3([part(0), part(1), part(2)]);
        for (i, crc) in crcs.iter().enumerate().take(n) {
            let a = starts[i].0;
            frames[a + 4..a + 8].copy_from_slice(&crc.to_le_bytes());
        }
        at = next;
    }
}

fn frame_crc(len_bytes: &[u8], body: &[u8]) -> u32 {
    let mut len = [0; 4];
    len.copy_from_slice(&len_bytes[..4]);
    crate::crc::frame_crc(len, body)
}

/// Result of looking at the bytes where a frame should start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Frame {
    /// A complete, checksummed, well-formed frame.
    Good {
        /// Frame length, prefix included.
        len: usize,
        /// Offset stored in the record.
        offset: u64,
        /// Timestamp stored in the record.
        timestamp_ms: u64,
    },
    /// Not enough bytes: at least `need` bytes are needed in total (a lower bound when the length
    /// prefix itself is incomplete).
    Incomplete {
        /// Bytes needed from the frame start.
        need: usize,
    },
    /// The bytes cannot be a frame.
    Bad(&'static str),
}

/// Checks the frame starting at `buf[0]`.
pub(crate) fn check_frame(buf: &[u8]) -> Frame {
    check_frame_inner(buf, false)
}

/// [`check_frame`] for a frame whose checksum the caller has just verified (the reader checks
/// three frames' checksums together): every other check still runs.
pub(crate) fn check_frame_crc_verified(buf: &[u8]) -> Frame {
    check_frame_inner(buf, true)
}

/// The length of the frame at `buf[0]` if its length prefix is in range and the whole frame is
/// in `buf` (nothing else is checked).
pub(crate) fn complete_frame_len(buf: &[u8]) -> Option<usize> {
    let prefix = buf.get(..FRAME_PREFIX)?;
    let body_len = u32_at(prefix, 0) as usize;
    if !(MIN_BODY..=MAX_RECORD_BYTES as usize).contains(&body_len) {
        return None;
    }
    let len = FRAME_PREFIX + body_len;
    (len <= buf.len()).then_some(len)
}

fn check_frame_inner(buf: &[u8], crc_verified: bool) -> Frame {
    let Some(prefix) = buf.get(..FRAME_PREFIX) else {
        return Frame::Incomplete { need: FRAME_PREFIX };
    };
    let body_len = u32_at(prefix, 0) as usize;
    if body_len < MIN_BODY {
        return Frame::Bad("record length below the minimum");
    }
    if body_len > MAX_RECORD_BYTES as usize {
        return Frame::Bad("record length above the format limit");
    }
    let len = FRAME_PREFIX + body_len;
    let Some(body) = buf.get(FRAME_PREFIX..len) else {
        return Frame::Incomplete { need: len };
    };
    if !crc_verified && frame_crc(&prefix[..4], body) != u32_at(prefix, 4) {
        return Frame::Bad("checksum mismatch");
    }
    if let Err(reason) = walk(body, |_, _| {}) {
        return Frame::Bad(reason);
    }
    Frame::Good {
        len,
        offset: u64_at(body, 0),
        timestamp_ms: u64_at(body, 8),
    }
}

/// Decodes a frame already accepted by [`check_frame`], slicing out of `frame` without copying.
pub(crate) fn decode(frame: &Bytes) -> Result<StoredRecord, &'static str> {
    decode_at(frame, 0, frame.len())
}

/// Decodes the frame at `buf[at..at + len]` (already accepted by [`check_frame`]); key, header
/// values and payload are slices of `buf` itself (one reference count each, no copy).
pub(crate) fn decode_at(buf: &Bytes, at: usize, len: usize) -> Result<StoredRecord, &'static str> {
    let mut one = Vec::with_capacity(1);
    decode_into(buf, at, len, &mut one)?;
    one.pop().ok_or("malformed record body")
}

/// [`decode_at`], pushing the record onto `out`.
///
/// Inlined, and building the common shape (no key, no headers) right in the push: a record
/// returned through a `Result` was stored 8 bytes at a time and loaded back 16 at a time by
/// each move, and those loads stalled on store forwarding (the reader's largest cost after
/// the checksum).
#[inline]
pub(crate) fn decode_into(
    buf: &Bytes,
    at: usize,
    len: usize,
    out: &mut Vec<StoredRecord>,
) -> Result<(), &'static str> {
    let end = at
        .checked_add(len)
        .filter(|&e| e <= buf.len())
        .ok_or("malformed record body")?;
    let start = (at + FRAME_PREFIX).min(end);
    let body = &buf[start..end];
    if body.len() >= MIN_BODY && body[16] == 0 && u32_at(body, 17) == 0 {
        // No key, no headers (the common shape): the walk below would find exactly this, and
        // the rest of the body is the payload.
        out.push(StoredRecord {
            offset: u64_at(body, 0),
            timestamp_ms: u64_at(body, 8),
            key: None,
            headers: Vec::new(),
            payload: buf.slice(start + MIN_BODY..end),
        });
        return Ok(());
    }
    out.push(decode_walked(buf, start, end)?);
    Ok(())
}

/// [`decode_into`] for a body with a key or headers, `buf[start..end]`.
#[inline(never)]
fn decode_walked(buf: &Bytes, start: usize, end: usize) -> Result<StoredRecord, &'static str> {
    let body = &buf[start..end];
    let part = |r: Range<usize>| buf.slice(start + r.start..start + r.end);
    let mut headers = Vec::new();
    let mut bad_name = false;
    let layout = walk(body, |name, value| match std::str::from_utf8(&body[name]) {
        Ok(n) => headers.push((n.to_owned(), part(value))),
        Err(_) => bad_name = true,
    })?;
    if bad_name {
        return Err("header name is not UTF-8");
    }
    Ok(StoredRecord {
        offset: u64_at(body, 0),
        timestamp_ms: u64_at(body, 8),
        key: layout.key.map(part),
        headers,
        payload: part(layout.payload),
    })
}

pub(crate) struct Layout {
    pub(crate) key: Option<Range<usize>>,
    pub(crate) payload: Range<usize>,
}

/// Walks a body, checking every length against the body size; calls `on_header(name, value)`.
pub(crate) fn walk(
    body: &[u8],
    mut on_header: impl FnMut(Range<usize>, Range<usize>),
) -> Result<Layout, &'static str> {
    const MALFORMED: &str = "malformed record body";
    if body.len() < MIN_BODY {
        return Err(MALFORMED);
    }
    let flags = body[16];
    if flags & !FLAG_KEY != 0 {
        return Err("unknown record flags");
    }
    let mut at = 17;
    let take = |at: &mut usize, n: usize| -> Result<Range<usize>, &'static str> {
        let end = at
            .checked_add(n)
            .filter(|&e| e <= body.len())
            .ok_or(MALFORMED)?;
        let r = *at..end;
        *at = end;
        Ok(r)
    };
    let key = if flags & FLAG_KEY != 0 {
        let r = take(&mut at, 4)?;
        let n = u32_at(&body[r], 0) as usize;
        Some(take(&mut at, n)?)
    } else {
        None
    };
    let r = take(&mut at, 4)?;
    let count = u32_at(&body[r], 0);
    for _ in 0..count {
        let r = take(&mut at, 2)?;
        let n = u16::from_le_bytes([body[r.start], body[r.start + 1]]) as usize;
        let name = take(&mut at, n)?;
        if std::str::from_utf8(&body[name.clone()]).is_err() {
            return Err("header name is not UTF-8");
        }
        let r = take(&mut at, 4)?;
        let n = u32_at(&body[r], 0) as usize;
        let value = take(&mut at, n)?;
        on_header(name, value);
    }
    Ok(Layout {
        key,
        payload: at..body.len(),
    })
}

/// Checks the structure of a body of `body_len` bytes (at least [`MIN_BODY`]) that is not held in
/// memory, exactly as [`check_frame`] does for one that is: `read(at, buf)` fills `buf` from body
/// byte `at`. Reads only the fixed fields and header names (at most [`MAX_HEADER_NAME`] bytes at
/// a time), skipping key, values and payload, so memory stays bounded whatever the record size.
pub(crate) fn check_body_streaming(
    body_len: usize,
    read: &mut dyn FnMut(usize, &mut [u8]) -> std::io::Result<()>,
) -> std::io::Result<Result<(), &'static str>> {
    const MALFORMED: &str = "malformed record body";
    if body_len < MIN_BODY {
        return Ok(Err(MALFORMED));
    }
    let mut flags = [0u8; 1];
    read(16, &mut flags)?;
    if flags[0] & !FLAG_KEY != 0 {
        return Ok(Err("unknown record flags"));
    }
    let mut at = 17usize;
    // Advances over `n` bytes if they fit in the body.
    let skip = |at: &mut usize, n: usize| -> Result<usize, &'static str> {
        let start = *at;
        *at = at
            .checked_add(n)
            .filter(|&e| e <= body_len)
            .ok_or(MALFORMED)?;
        Ok(start)
    };
    let mut word = [0u8; 4];
    if flags[0] & FLAG_KEY != 0 {
        let Ok(w) = skip(&mut at, 4) else {
            return Ok(Err(MALFORMED));
        };
        read(w, &mut word)?;
        if skip(&mut at, u32::from_le_bytes(word) as usize).is_err() {
            return Ok(Err(MALFORMED));
        }
    }
    let Ok(w) = skip(&mut at, 4) else {
        return Ok(Err(MALFORMED));
    };
    read(w, &mut word)?;
    let count = u32::from_le_bytes(word);
    let mut name = Vec::new();
    for _ in 0..count {
        let mut half = [0u8; 2];
        let Ok(h) = skip(&mut at, 2) else {
            return Ok(Err(MALFORMED));
        };
        read(h, &mut half)?;
        let n = u16::from_le_bytes(half) as usize;
        let Ok(start) = skip(&mut at, n) else {
            return Ok(Err(MALFORMED));
        };
        name.resize(n, 0);
        read(start, &mut name)?;
        if std::str::from_utf8(&name).is_err() {
            return Ok(Err("header name is not UTF-8"));
        }
        let Ok(w) = skip(&mut at, 4) else {
            return Ok(Err(MALFORMED));
        };
        read(w, &mut word)?;
        if skip(&mut at, u32::from_le_bytes(word) as usize).is_err() {
            return Ok(Err(MALFORMED));
        }
    }
    Ok(Ok(()))
}

/// CRC-32C of a frame whose length prefix says `body_len`, from the CRC-32C of its body alone
/// (`body_crc`): lets a scan test "is this a valid record if its length were `body_len`" without
/// rereading the body.
pub(crate) fn frame_crc_with_len(body_len: u32, body_crc: u32, body_bytes: usize) -> u32 {
    crc32c::crc32c_combine(
        crc32c::crc32c(&body_len.to_le_bytes()),
        body_crc,
        body_bytes,
    )
}

/// The offset stored in a complete frame (at least [`MIN_FRAME`] bytes long).
pub(crate) fn stored_offset(frame: &[u8]) -> u64 {
    u64_at(frame, FRAME_PREFIX)
}

pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Record {
        Record::new(42, "hello")
            .with_key("k")
            .with_header("h1", "v1")
            .with_header("", "")
    }

    #[test]
    fn roundtrip_and_length() {
        let r = sample();
        let mut buf = Vec::new();
        encode_into(&mut buf, 7, &r);
        assert_eq!(buf.len() as u64, r.encoded_len());
        let Frame::Good {
            len,
            offset,
            timestamp_ms,
        } = check_frame(&buf)
        else {
            panic!("frame not accepted")
        };
        assert_eq!((len, offset, timestamp_ms), (buf.len(), 7, 42));
        let got = decode(&Bytes::from(buf)).unwrap();
        assert_eq!(got.offset, 7);
        assert_eq!(got.to_record(), r);
        // The CRC-32C variant of the format (docs/design.md): the standard check value.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
        let plain = Record::new(1, Bytes::new());
        assert_eq!(plain.encoded_len() as usize, MIN_FRAME);
    }

    #[test]
    fn every_bit_flip_and_truncation_is_detected() {
        let mut buf = Vec::new();
        encode_into(&mut buf, 3, &sample());
        for i in 0..buf.len() * 8 {
            let mut b = buf.clone();
            b[i / 8] ^= 1 << (i % 8);
            assert!(
                !matches!(check_frame(&b), Frame::Good { .. }),
                "flip {i} accepted"
            );
        }
        for cut in 0..buf.len() {
            assert!(
                matches!(check_frame(&buf[..cut]), Frame::Incomplete { .. }),
                "cut {cut}"
            );
        }
        assert!(matches!(check_frame(&[0; 64]), Frame::Bad(_)));
    }

    #[test]
    fn crcs_filled_in_batches_equal_per_frame_encoding() {
        // Frames encoded one by one (CRC each) and encoded without CRC then filled together
        // (three at a time, with a remainder of one and two) are byte-identical.
        for count in 1..=7u64 {
            let (mut one_by_one, mut batched) = (Vec::new(), Vec::new());
            for o in 0..count {
                let r = Record::new(o, vec![o as u8; (o as usize * 37) % 300]).with_key("k");
                encode_into(&mut one_by_one, o, &r);
                encode_without_crc(&mut batched, o, &r);
            }
            assert_ne!(one_by_one, batched);
            fill_crcs(&mut batched);
            assert_eq!(one_by_one, batched, "{count} frames");
        }
        let mut frame = Vec::new();
        encode_into(&mut frame, 0, &sample());
        assert!(matches!(check_frame(&frame), Frame::Good { .. }));
    }

    #[test]
    fn display_is_one_line() {
        let mut buf = Vec::new();
        encode_into(&mut buf, 9, &sample());
        let s = decode(&Bytes::from(buf)).unwrap().to_string();
        assert_eq!(
            s,
            "offset=9 ts=42 key=\"k\" \"h1\"=\"v1\" \"\"=\"\" payload[5]=\"hello\""
        );
    }
}
