//! Durable dead-letter record ↔ `tidings_log::Record` (R-DEL-4).
//!
//! # Encoding (version 2)
//!
//! A durable DLQ record is the message's stream record (see [`codec`](super::codec)) with
//! one more header put **in front** of it: `tidings-dlq`, a little-endian binary block
//!
//! | bytes | field |
//! |---|---|
//! | 1 | version = 2 |
//! | 4 | attempts `u32` |
//! | 8 | the message's offset in its stream `u64` |
//! | 1 | reason kind: 0 retries exhausted, 1 rejected, 2 expired, 3 overflow, 4 dropped oldest, 5 shutdown |
//! | 4 | the reason's own attempt count `u32` (retries exhausted; 0 otherwise) |
//! | 4 + n | the reason's error text: `u32` length, UTF-8 (retries exhausted, rejected; empty otherwise) |
//!
//! followed by the `tidings-msg` block and the user headers, in order. The metadata is read
//! from the first header only, by position, so no user header — whatever its name — can
//! change the reason, attempts or offset of an entry. The reason is stored typed, so it
//! reads back as the same [`DeadLetterReason`].
//!
//! **Version 1** blocks (written before the reason was typed) have the same first three
//! fields, then `u32` length + UTF-8 of the reason's display text. They are still read: the
//! text is parsed back into the [`DeadLetterReason`] that displays as it; a text no
//! version of tidings wrote is a typed decode error.
//!
//! # Removals
//!
//! The log is append-only, so draining or redriving entries appends a **removal** record:
//! one header `tidings-dlq-removed` holding the removed entries' DLQ offsets as
//! little-endian `u64`s (no payload). Listing replays the log and leaves removed entries
//! out. A removal is appended only after what it removes was handed over (returned by a
//! drain, or appended — and synced — to the stream by a redrive), so a crash in between
//! keeps the entry (at-least-once), never loses it.
//!
//! # Legacy records
//!
//! Logs written before the binary block hold `tidings-msg` first, the user headers, then
//! three text headers `tidings-dlq-reason`, `tidings-dlq-attempts`, `tidings-dlq-offset`
//! appended **last**. They are still read, positionally from the end (exactly what the old
//! writer produced), so a user header of the same name is kept as user data. A record that
//! is neither shape is a typed decode error.

use bytes::Bytes;
use tidings_log::{Record, StoredRecord};

use crate::dlq::DeadLetterReason;
use crate::message::Message;

use super::codec;

/// Name of the reserved first header of a durable DLQ record.
pub(crate) const DLQ_HEADER: &str = "tidings-dlq";
/// Name of the only header of a removal record.
pub(crate) const REMOVED_HEADER: &str = "tidings-dlq-removed";

/// One record of a durable DLQ log.
#[derive(Debug)]
pub(crate) enum DlqRecord {
    /// A dead letter: the message (carrying its stream offset) and its metadata.
    Entry(Box<Message>, DlqMeta),
    /// These DLQ offsets were drained or redriven.
    Removed(Vec<u64>),
}

/// Encode a removal of the entries at these DLQ offsets.
pub(crate) fn encode_removal(offsets: &[u64]) -> Record {
    let block: Vec<u8> = offsets.iter().flat_map(|o| o.to_le_bytes()).collect();
    Record {
        timestamp_ms: 0,
        key: None,
        headers: vec![(REMOVED_HEADER.to_owned(), Bytes::from(block))],
        payload: Bytes::new(),
    }
}

/// Decode any DLQ record: an entry or a removal.
pub(crate) fn decode_any(r: StoredRecord) -> Result<DlqRecord, &'static str> {
    match r.headers.first() {
        Some((name, block)) if name == REMOVED_HEADER => {
            if r.headers.len() != 1 || block.len() % 8 != 0 {
                return Err("malformed DLQ removal record");
            }
            Ok(DlqRecord::Removed(
                block
                    .chunks_exact(8)
                    .map(|c| {
                        let mut a = [0; 8];
                        a.copy_from_slice(c);
                        u64::from_le_bytes(a)
                    })
                    .collect(),
            ))
        }
        _ => decode(r).map(|(m, meta)| DlqRecord::Entry(Box::new(m), meta)),
    }
}
/// The version this module writes.
const VERSION: u8 = 2;
/// The version whose reason is display text.
const VERSION_TEXT_REASON: u8 = 1;

/// Legacy trailing headers, in the order the old writer appended them.
const LEGACY: [&str; 3] = [
    "tidings-dlq-reason",
    "tidings-dlq-attempts",
    "tidings-dlq-offset",
];

/// What a durable DLQ record says about its message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DlqMeta {
    /// Why the message was dead-lettered.
    pub(crate) reason: DeadLetterReason,
    /// Handler attempts made.
    pub(crate) attempts: u32,
    /// The message's offset in its stream.
    pub(crate) offset: u64,
}

/// Encode a dead-lettered stream message as one DLQ record.
pub(crate) fn encode(
    message: &Message,
    reason: &DeadLetterReason,
    attempts: u32,
    offset: u64,
) -> Record {
    let (kind, reason_attempts, text) = match reason {
        DeadLetterReason::RetriesExhausted {
            attempts,
            last_error,
        } => (0u8, *attempts, last_error.as_str()),
        DeadLetterReason::Rejected { error } => (1, 0, error.as_str()),
        DeadLetterReason::Expired => (2, 0, ""),
        DeadLetterReason::Overflow => (3, 0, ""),
        DeadLetterReason::DroppedOldest => (4, 0, ""),
        DeadLetterReason::Shutdown => (5, 0, ""),
    };
    let mut b = Vec::with_capacity(22 + text.len());
    b.push(VERSION);
    b.extend_from_slice(&attempts.to_le_bytes());
    b.extend_from_slice(&offset.to_le_bytes());
    b.push(kind);
    b.extend_from_slice(&reason_attempts.to_le_bytes());
    // An error text is a handler's: bounded far below u32::MAX in practice; cut at a char
    // boundary if it is not.
    let mut cut = text.len().min(u32::MAX as usize);
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    b.extend_from_slice(&(cut as u32).to_le_bytes());
    b.extend_from_slice(&text.as_bytes()[..cut]);
    let mut rec = codec::encode(message);
    rec.headers
        .insert(0, (DLQ_HEADER.to_owned(), Bytes::from(b)));
    rec
}

fn meta_block(block: &[u8]) -> Result<DlqMeta, &'static str> {
    let take = |at: usize, n: usize| {
        at.checked_add(n)
            .and_then(|end| block.get(at..end))
            .ok_or("DLQ metadata block is truncated")
    };
    let u32_at = |at: usize| -> Result<u32, &'static str> {
        let mut a4 = [0; 4];
        a4.copy_from_slice(take(at, 4)?);
        Ok(u32::from_le_bytes(a4))
    };
    let version = take(0, 1)?[0];
    if version != VERSION && version != VERSION_TEXT_REASON {
        return Err("unsupported DLQ record version");
    }
    let attempts = u32_at(1)?;
    let mut a8 = [0; 8];
    a8.copy_from_slice(take(5, 8)?);
    let offset = u64::from_le_bytes(a8);
    let (reason, end) = if version == VERSION_TEXT_REASON {
        let n = u32_at(13)? as usize;
        let text = std::str::from_utf8(take(17, n)?).map_err(|_| "DLQ reason is not UTF-8")?;
        (parse_reason(text)?, 17 + n)
    } else {
        let kind = take(13, 1)?[0];
        let reason_attempts = u32_at(14)?;
        let n = u32_at(18)? as usize;
        let text = std::str::from_utf8(take(22, n)?).map_err(|_| "DLQ reason is not UTF-8")?;
        let reason = match kind {
            0 => DeadLetterReason::RetriesExhausted {
                attempts: reason_attempts,
                last_error: text.to_owned(),
            },
            1 => DeadLetterReason::Rejected {
                error: text.to_owned(),
            },
            2 => DeadLetterReason::Expired,
            3 => DeadLetterReason::Overflow,
            4 => DeadLetterReason::DroppedOldest,
            5 => DeadLetterReason::Shutdown,
            _ => return Err("unknown DLQ reason kind"),
        };
        (reason, 22 + n)
    };
    if block.len() != end {
        return Err("trailing bytes in DLQ metadata block");
    }
    Ok(DlqMeta {
        reason,
        attempts,
        offset,
    })
}

/// The [`DeadLetterReason`] whose display text is `text` (version 1 and legacy records).
fn parse_reason(text: &str) -> Result<DeadLetterReason, &'static str> {
    const UNKNOWN: &str = "DLQ reason text is not one tidings writes";
    if let Some(rest) = text.strip_prefix("retries exhausted after ") {
        let (n, last_error) = rest.split_once(" attempts: ").ok_or(UNKNOWN)?;
        let attempts = n.parse().map_err(|_| UNKNOWN)?;
        return Ok(DeadLetterReason::RetriesExhausted {
            attempts,
            last_error: last_error.to_owned(),
        });
    }
    if let Some(error) = text.strip_prefix("rejected: ") {
        return Ok(DeadLetterReason::Rejected {
            error: error.to_owned(),
        });
    }
    Ok(match text {
        "expired" => DeadLetterReason::Expired,
        "overflow" => DeadLetterReason::Overflow,
        "dropped_oldest" => DeadLetterReason::DroppedOldest,
        "shutdown" => DeadLetterReason::Shutdown,
        _ => return Err(UNKNOWN),
    })
}

/// Decode a DLQ record: the message (carrying its *stream* offset) and its metadata.
pub(crate) fn decode(mut r: StoredRecord) -> Result<(Message, DlqMeta), &'static str> {
    let meta = match r.headers.first() {
        Some((name, block)) if name == DLQ_HEADER => {
            let meta = meta_block(block)?;
            r.headers.remove(0);
            meta
        }
        Some((name, _)) if name == codec::META_HEADER => legacy(&mut r.headers)?,
        _ => return Err("first header is neither tidings-dlq nor tidings-msg"),
    };
    let mut message = codec::decode(r)?;
    message.log_offset = Some(meta.offset);
    Ok((message, meta))
}

/// Strip and parse the three trailing metadata headers of a legacy record.
fn legacy(headers: &mut Vec<(String, Bytes)>) -> Result<DlqMeta, &'static str> {
    const MISSING: &str = "legacy DLQ record without its trailing metadata headers";
    // The first header is the message block, never metadata.
    if headers.len() < 1 + LEGACY.len() {
        return Err(MISSING);
    }
    let tail = headers.split_off(headers.len() - LEGACY.len());
    if tail
        .iter()
        .zip(LEGACY)
        .any(|((name, _), want)| name != want)
    {
        return Err(MISSING);
    }
    let text = |i: usize| std::str::from_utf8(&tail[i].1).map_err(|_| "DLQ header is not UTF-8");
    Ok(DlqMeta {
        reason: parse_reason(text(0)?)?,
        attempts: text(1)?
            .parse()
            .map_err(|_| "DLQ attempts is not a number")?,
        offset: text(2)?.parse().map_err(|_| "DLQ offset is not a number")?,
    })
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use proptest::prelude::*;

    use super::*;
    use crate::message::{Headers, IdGenerator, Priority};
    use crate::topic::Topic;

    fn message(headers: Headers) -> Message {
        let now = SystemTime::now();
        Message {
            id: IdGenerator::new().next(now),
            topic: Topic::new("orders.created").unwrap(),
            payload: Bytes::from_static(b"p"),
            headers,
            key: None,
            priority: Priority::Normal,
            timestamp: now,
            expires_at: None,
            deliver_at: None,
            reply_to: None,
            correlation_id: None,
            log_offset: Some(9),
            fence: None,
        }
    }

    fn stored(rec: Record) -> StoredRecord {
        StoredRecord {
            offset: 0,
            timestamp_ms: rec.timestamp_ms,
            key: rec.key,
            headers: rec.headers,
            payload: rec.payload,
        }
    }

    #[test]
    fn round_trip_keeps_user_headers_of_reserved_names() {
        let mut h = Headers::new();
        for name in LEGACY.into_iter().chain([DLQ_HEADER, codec::META_HEADER]) {
            h.insert(name, "user");
        }
        let m = message(h.clone());
        let reason = DeadLetterReason::Rejected { error: "no".into() };
        let (d, meta) = decode(stored(encode(&m, &reason, 3, 9))).unwrap();
        // R-DEL-4: the metadata is the writer's; the user's headers are untouched.
        assert_eq!(
            meta,
            DlqMeta {
                reason,
                attempts: 3,
                offset: 9
            }
        );
        assert_eq!(d.headers, h);
        assert_eq!(d.log_offset, Some(9));
    }

    #[test]
    fn every_reason_round_trips_typed() {
        let m = message(Headers::new());
        for reason in [
            DeadLetterReason::RetriesExhausted {
                attempts: 5,
                last_error: "down: again".into(),
            },
            DeadLetterReason::Rejected {
                error: "bad: input".into(),
            },
            DeadLetterReason::Expired,
            DeadLetterReason::Overflow,
            DeadLetterReason::DroppedOldest,
            DeadLetterReason::Shutdown,
        ] {
            let (_, meta) = decode(stored(encode(&m, &reason, 5, 9))).unwrap();
            // R-DEL-4: the durable DLQ keeps the typed reason, not only its text.
            assert_eq!(meta.reason, reason);
        }
    }

    /// A version-1 block as the previous writer produced it: the reason as display text.
    fn version_1(message: &Message, reason: &str, attempts: u32, offset: u64) -> Record {
        let mut b = vec![VERSION_TEXT_REASON];
        b.extend_from_slice(&attempts.to_le_bytes());
        b.extend_from_slice(&offset.to_le_bytes());
        b.extend_from_slice(&(reason.len() as u32).to_le_bytes());
        b.extend_from_slice(reason.as_bytes());
        let mut rec = codec::encode(message);
        rec.headers
            .insert(0, (DLQ_HEADER.to_owned(), Bytes::from(b)));
        rec
    }

    #[test]
    fn version_1_text_reasons_still_decode() {
        let m = message(Headers::new());
        for reason in [
            DeadLetterReason::RetriesExhausted {
                attempts: 3,
                last_error: "down 3".into(),
            },
            DeadLetterReason::Rejected {
                error: "rejected: twice".into(),
            },
            DeadLetterReason::Expired,
            DeadLetterReason::Overflow,
            DeadLetterReason::DroppedOldest,
            DeadLetterReason::Shutdown,
        ] {
            let rec = version_1(&m, &reason.to_string(), 3, 9);
            let (d, meta) = decode(stored(rec)).unwrap();
            // R-DEL-4: files written before the reason was typed read back typed.
            assert_eq!((meta.reason, meta.attempts, meta.offset), (reason, 3, 9));
            assert_eq!(d.log_offset, Some(9));
        }
        // R-LIM-2: a text no tidings version wrote is a typed error, not a guess.
        assert!(decode(stored(version_1(&m, "gremlins", 1, 9))).is_err());
    }

    #[test]
    fn removals_round_trip() {
        match decode_any(stored(encode_removal(&[3, u64::MAX]))).unwrap() {
            DlqRecord::Removed(o) => assert_eq!(o, [3, u64::MAX]),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn legacy_records_are_read_positionally() {
        let mut h = Headers::new();
        h.insert("tidings-dlq-reason", "spoofed");
        let mut rec = codec::encode(&message(h.clone()));
        for (name, value) in LEGACY.into_iter().zip(["expired", "2", "41"]) {
            rec.headers.push((name.into(), Bytes::from(value)));
        }
        let (d, meta) = decode(stored(rec.clone())).unwrap();
        // R-DEL-4: old files stay readable, and their metadata is the writer's.
        assert_eq!(
            (meta.reason, meta.attempts, meta.offset),
            (DeadLetterReason::Expired, 2, 41)
        );
        assert_eq!(d.headers, h);
        // R-LIM-2: a legacy record missing its trailing headers is a typed error.
        rec.headers.pop();
        assert!(decode(stored(rec)).is_err());
    }

    fn cases() -> u32 {
        if std::env::var_os("TIDINGS_LONG").is_some() {
            200_000
        } else {
            512
        }
    }

    fn arb_headers() -> impl Strategy<Value = Vec<(String, Vec<u8>)>> {
        let name = prop_oneof![
            Just(DLQ_HEADER.to_owned()),
            Just(codec::META_HEADER.to_owned()),
            Just(LEGACY[0].to_owned()),
            Just(LEGACY[1].to_owned()),
            Just(LEGACY[2].to_owned()),
            Just(REMOVED_HEADER.to_owned()),
            "[a-z-]{0,12}",
        ];
        prop::collection::vec((name, prop::collection::vec(any::<u8>(), 0..48)), 0..6)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(cases()))]

        /// R-LIM-2: arbitrary DLQ records decode or fail with a typed error, never panic.
        #[test]
        fn arbitrary_dlq_records_never_panic(headers in arb_headers(), valid_meta in any::<bool>()) {
            let mut headers: Vec<(String, Bytes)> =
                headers.into_iter().map(|(k, v)| (k, Bytes::from(v))).collect();
            if valid_meta {
                // Put a real message block second so the fuzzing reaches past the first check.
                let real = codec::encode(&message(Headers::new()));
                headers.insert(0, real.headers[0].clone());
            }
            let _ = decode_any(StoredRecord {
                offset: 0,
                timestamp_ms: 0,
                key: None,
                headers,
                payload: Bytes::new(),
            });
        }

        /// R-LIM-2: arbitrary metadata blocks never panic the block parser.
        #[test]
        fn arbitrary_dlq_blocks_never_panic(block in prop::collection::vec(any::<u8>(), 0..64)) {
            let _ = meta_block(&block);
        }
    }
}
