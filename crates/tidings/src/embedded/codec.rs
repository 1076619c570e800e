//! Message ↔ `tidings_log::Record`.
//!
//! # Encoding (version 1)
//!
//! * record `timestamp_ms` = the message timestamp in milliseconds (so the log's time index
//!   answers `StartAt::Time`);
//! * record `key` = the message key;
//! * record `payload` = the message payload (not copied: `Bytes` is shared);
//! * the **first** record header is named `tidings-msg` and holds a little-endian binary
//!   block:
//!
//! | bytes | field |
//! |---|---|
//! | 1 | version = 1 |
//! | 1 | flags: bit0 expiry, bit1 deliver-at, bit2 reply-to, bit3 correlation id |
//! | 1 | priority (0 low ..= 3 urgent) |
//! | 16 | message id `u128` |
//! | 8 | timestamp, nanoseconds since the UNIX epoch `u64` |
//! | 8 | expiry, ns since epoch (if bit0) |
//! | 8 | deliver-at, ns since epoch (if bit1) |
//! | 2 + n | topic: `u16` length, UTF-8 |
//! | 2 + n | reply-to topic (if bit2) |
//! | 4 + n | correlation id (if bit3) |
//!
//! * every following record header is a user header, in order (values UTF-8). A user header
//!   that happens to be called `tidings-msg` is unambiguous: only the first header is read
//!   as the block.
//!
//! # Redrive copies
//!
//! A durable dead letter redriven into its stream
//! ([`DurableSubscription::redrive_durable_dead_letters`](crate::DurableSubscription::redrive_durable_dead_letters))
//! is appended as the same record with one more header in **front**: `tidings-to`, whose
//! value is the name of the durable subscription it is for. Only that subscription
//! delivers it; every other one skips it (finished at once). Readers that decode the
//! message only ([`Stream::read`](crate::Stream::read)) see the message as published.
//!
//! Times before the epoch are stored as 0. Decoding validates the version, lengths, UTF-8
//! and the topic; anything else is a typed decode error, never a panic.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tidings_log::{Record, StoredRecord};

use crate::message::{Headers, Message, MessageId, Priority, millis_since_epoch};
use crate::topic::Topic;

/// Name of the reserved first header carrying the message metadata.
pub const META_HEADER: &str = "tidings-msg";
/// Name of the leading header of a redrive copy: the durable subscription it is for.
pub(crate) const TARGET_HEADER: &str = "tidings-to";
const VERSION: u8 = 1;

fn nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn from_nanos(n: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(n)
}

/// Encode a published message as one log record.
pub(crate) fn encode(m: &Message) -> Record {
    let mut b = Vec::with_capacity(40 + m.topic.as_str().len());
    let mut flags = 0u8;
    if m.expires_at.is_some() {
        flags |= 1;
    }
    if m.deliver_at.is_some() {
        flags |= 2;
    }
    if m.reply_to.is_some() {
        flags |= 4;
    }
    if m.correlation_id.is_some() {
        flags |= 8;
    }
    b.push(VERSION);
    b.push(flags);
    b.push(m.priority as u8);
    b.extend_from_slice(&m.id.as_u128().to_le_bytes());
    b.extend_from_slice(&nanos(m.timestamp).to_le_bytes());
    for t in [m.expires_at, m.deliver_at].into_iter().flatten() {
        b.extend_from_slice(&nanos(t).to_le_bytes());
    }
    // Topics are bounded by `Limits` far below u16::MAX.
    let topic = m.topic.as_str().as_bytes();
    b.extend_from_slice(&(topic.len() as u16).to_le_bytes());
    b.extend_from_slice(topic);
    if let Some(r) = &m.reply_to {
        let r = r.as_str().as_bytes();
        b.extend_from_slice(&(r.len() as u16).to_le_bytes());
        b.extend_from_slice(r);
    }
    if let Some(c) = &m.correlation_id {
        b.extend_from_slice(&(c.len() as u32).to_le_bytes());
        b.extend_from_slice(c.as_bytes());
    }
    let mut headers = Vec::with_capacity(1 + m.headers.len());
    headers.push((META_HEADER.to_owned(), Bytes::from(b)));
    for (k, v) in m.headers.iter() {
        headers.push((k.to_owned(), Bytes::copy_from_slice(v.as_bytes())));
    }
    Record {
        timestamp_ms: millis_since_epoch(m.timestamp),
        key: m.key.clone(),
        headers,
        payload: m.payload.clone(),
    }
}

/// Encode a redrive copy of `m`, delivered by the durable subscription `target` only.
pub(crate) fn encode_for(m: &Message, target: &str) -> Record {
    let mut rec = encode(m);
    rec.headers.insert(
        0,
        (
            TARGET_HEADER.to_owned(),
            Bytes::copy_from_slice(target.as_bytes()),
        ),
    );
    rec
}

/// Decode a stream record: the message, and the durable subscription it is reserved for
/// when it is a redrive copy.
pub(crate) fn decode_targeted(
    mut r: StoredRecord,
) -> Result<(Message, Option<String>), &'static str> {
    let target = match r.headers.first() {
        Some((name, value)) if name == TARGET_HEADER => {
            let t = std::str::from_utf8(value)
                .map_err(|_| "redrive target is not UTF-8")?
                .to_owned();
            r.headers.remove(0);
            Some(t)
        }
        _ => None,
    };
    Ok((decode(r)?, target))
}

/// The message id of a record as published (R-DEL-7: the duplicate window's rebuild at
/// open): `None` for a redrive copy (not a publish) and for a record that does not carry a
/// version-1 metadata block (a foreign producer's). Reads only the block's first bytes.
pub(crate) fn published_id(r: &StoredRecord) -> Option<u128> {
    let (name, meta) = r.headers.first()?;
    if name != META_HEADER {
        return None;
    }
    let mut c = Cursor(meta);
    if c.u8().ok()? != VERSION {
        return None;
    }
    c.take(2).ok()?;
    c.u128().ok()
}

struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], &'static str> {
        if self.0.len() < n {
            return Err("metadata block is truncated");
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, &'static str> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, &'static str> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, &'static str> {
        let mut a = [0; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(a))
    }
    fn u64(&mut self) -> Result<u64, &'static str> {
        let mut a = [0; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    fn u128(&mut self) -> Result<u128, &'static str> {
        let mut a = [0; 16];
        a.copy_from_slice(self.take(16)?);
        Ok(u128::from_le_bytes(a))
    }
    fn str(&mut self, n: usize) -> Result<&'a str, &'static str> {
        std::str::from_utf8(self.take(n)?).map_err(|_| "metadata string is not UTF-8")
    }
}

/// Decode a stored record back into a message carrying its offset (a redrive copy's
/// target header is skipped).
pub(crate) fn decode(r: StoredRecord) -> Result<Message, &'static str> {
    let mut headers = r.headers.into_iter().peekable();
    if headers
        .peek()
        .is_some_and(|(name, _)| name == TARGET_HEADER)
    {
        headers.next();
    }
    let meta = match headers.next() {
        Some((name, value)) if name == META_HEADER => value,
        _ => return Err("first header is not tidings-msg"),
    };
    let mut c = Cursor(&meta);
    if c.u8()? != VERSION {
        return Err("unsupported message encoding version");
    }
    let flags = c.u8()?;
    if flags & !0x0f != 0 {
        return Err("unknown flags");
    }
    let priority = match c.u8()? {
        0 => Priority::Low,
        1 => Priority::Normal,
        2 => Priority::High,
        3 => Priority::Urgent,
        _ => return Err("unknown priority"),
    };
    let id = MessageId::from_u128(c.u128()?);
    let timestamp = from_nanos(c.u64()?);
    let expires_at = if flags & 1 != 0 {
        Some(from_nanos(c.u64()?))
    } else {
        None
    };
    let deliver_at = if flags & 2 != 0 {
        Some(from_nanos(c.u64()?))
    } else {
        None
    };
    let n = c.u16()? as usize;
    let topic = Topic::new(c.str(n)?).map_err(|_| "invalid topic")?;
    let reply_to = if flags & 4 != 0 {
        let n = c.u16()? as usize;
        Some(Topic::new(c.str(n)?).map_err(|_| "invalid reply-to topic")?)
    } else {
        None
    };
    let correlation_id = if flags & 8 != 0 {
        let n = c.u32()? as usize;
        Some(c.str(n)?.to_owned())
    } else {
        None
    };
    if !c.0.is_empty() {
        return Err("trailing bytes in metadata block");
    }
    let mut h = Headers::new();
    for (k, v) in headers {
        let v = String::from_utf8(v.to_vec()).map_err(|_| "header value is not UTF-8")?;
        h.insert(k, v);
    }
    Ok(Message {
        id,
        topic,
        payload: r.payload,
        headers: h,
        key: r.key,
        priority,
        timestamp,
        expires_at,
        deliver_at,
        reply_to,
        correlation_id,
        log_offset: Some(r.offset),
        fence: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::IdGenerator;

    #[test]
    fn round_trip_every_field() {
        let now = SystemTime::now();
        let mut headers = Headers::new();
        headers.insert("a", "1");
        headers.insert(META_HEADER, "user value");
        let m = Message {
            id: IdGenerator::new().next(now),
            topic: Topic::new("orders.created").unwrap(),
            payload: Bytes::from_static(b"payload"),
            headers,
            key: Some(Bytes::from_static(b"k")),
            priority: Priority::Urgent,
            timestamp: now,
            expires_at: Some(now + Duration::from_secs(5)),
            deliver_at: Some(now + Duration::from_secs(1)),
            reply_to: Some(Topic::new("inbox.x").unwrap()),
            correlation_id: Some("c-1".into()),
            log_offset: None,
            fence: None,
        };
        let rec = encode(&m);
        let stored = StoredRecord {
            offset: 7,
            timestamp_ms: rec.timestamp_ms,
            key: rec.key.clone(),
            headers: rec.headers.clone(),
            payload: rec.payload.clone(),
        };
        let d = decode(stored).unwrap();
        assert_eq!(d.id, m.id);
        assert_eq!(d.topic, m.topic);
        assert_eq!(d.payload, m.payload);
        assert_eq!(d.headers, m.headers);
        assert_eq!(d.key, m.key);
        assert_eq!(d.priority, m.priority);
        assert_eq!(d.timestamp, m.timestamp);
        assert_eq!(d.expires_at, m.expires_at);
        assert_eq!(d.deliver_at, m.deliver_at);
        assert_eq!(d.reply_to, m.reply_to);
        assert_eq!(d.correlation_id, m.correlation_id);
        assert_eq!(d.log_offset, Some(7));
    }

    #[test]
    fn foreign_records_are_typed_errors() {
        // R-LIM-2: no panic on records tidings did not write.
        let mut s = StoredRecord {
            offset: 0,
            timestamp_ms: 0,
            key: None,
            headers: vec![],
            payload: Bytes::new(),
        };
        assert!(decode(s.clone()).is_err());
        for bad in [&b""[..], &[1], &[2, 0, 0], &[1, 0, 9], &[1, 0xff, 1]] {
            s.headers = vec![(META_HEADER.into(), Bytes::copy_from_slice(bad))];
            assert!(decode(s.clone()).is_err());
        }
    }

    fn cases() -> u32 {
        if std::env::var_os("TIDINGS_LONG").is_some() {
            200_000
        } else {
            512
        }
    }

    fn valid_block() -> Vec<u8> {
        let m = Message {
            id: IdGenerator::new().next(SystemTime::now()),
            topic: Topic::new("a.b").unwrap(),
            payload: Bytes::new(),
            headers: Headers::new(),
            key: None,
            priority: Priority::High,
            timestamp: SystemTime::now(),
            expires_at: Some(SystemTime::now()),
            deliver_at: None,
            reply_to: Some(Topic::new("r").unwrap()),
            correlation_id: Some("c".into()),
            log_offset: None,
            fence: None,
        };
        encode(&m).headers[0].1.to_vec()
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(cases()))]

        /// R-LIM-2: arbitrary bytes as the metadata block decode or fail with a typed error,
        /// never a panic (also for mutations of a valid block, which reach deeper checks).
        #[test]
        fn arbitrary_records_never_panic(
            block in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..96),
            flips in proptest::collection::vec((0usize..96, proptest::prelude::any::<u8>()), 0..4),
            cut in 0usize..96,
            headers in proptest::collection::vec(
                ("[a-z-]{0,12}", proptest::collection::vec(proptest::prelude::any::<u8>(), 0..16)),
                0..4,
            ),
        ) {
            let mut mutated = valid_block();
            for (at, value) in flips {
                if let Some(b) = mutated.get_mut(at) {
                    *b = value;
                }
            }
            mutated.truncate(cut.max(1));
            for meta in [block, mutated] {
                let mut all = vec![(META_HEADER.to_owned(), Bytes::from(meta))];
                all.extend(headers.iter().map(|(k, v)| (k.clone(), Bytes::from(v.clone()))));
                let _ = decode(StoredRecord {
                    offset: 0,
                    timestamp_ms: 0,
                    key: None,
                    headers: all,
                    payload: Bytes::new(),
                });
            }
        }
    }
}
