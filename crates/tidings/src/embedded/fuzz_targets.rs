//! R-SEC-2 fuzz targets for the embedded backend's files: a stream record as a message
//! (what a foreign producer may have appended), a durable DLQ record, a consumer's offset
//! file, a stream's `META` file, and a dedup log with the duplicate window rebuilt from a
//! stream. The engine is `tidings-fuzz` (README, "Fuzzing"): each `fuzz_<target>` runs for
//! `TIDINGS_FUZZ_SECS` over the kept corpus `fuzz/corpus/<target>/` and its mutations and
//! fails on a panic, a hang or an allocation beyond the stated bound.
//!
//! The log's own framing has its targets in `tidings-log`; here a record reaches the
//! decoder already framed, as the log hands it over: its fields are read from the input
//! with [`Fields`] — `[offset, timestamp, key, payload, name, value, name, value, …]`, the
//! key field absent unless its first byte is odd.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use tidings_fuzz::fields::{int, join};
use tidings_fuzz::{Fields, Outcome, Target};
use tidings_log::{FsStorage, Fsync, Log, LogConfig, Record, StoredRecord};

use super::codec;
use super::dedup_log::DurableDedupStore;
use super::dlq_record::{self, DlqRecord};
use super::id_window::IdWindow;
use super::offset_store::{OffsetStore, parse};
use super::stream_meta::StreamMeta;
use crate::dedup::DedupStore;
use crate::dlq::DeadLetterReason;
use crate::message::{Headers, Message, MessageId, Priority};
use crate::topic::{Pattern, Topic};

/// Measures allocations of the fuzz worker thread (test builds only; see `tidings-fuzz`).
#[global_allocator]
static FUZZ_ALLOC: tidings_fuzz::TrackingAlloc = tidings_fuzz::TrackingAlloc;

const CARGO: &str = "-p tidings --lib";

/// Header names and tokens the mutator splices in.
const DICTIONARY: &[&str] = &[
    codec::META_HEADER,
    codec::TARGET_HEADER,
    dlq_record::DLQ_HEADER,
    dlq_record::REMOVED_HEADER,
    "tidings-dlq-reason",
    "tidings-dlq-attempts",
    "tidings-dlq-offset",
    "retries_exhausted",
    "orders.created",
];

/// The stored record an input describes (see the module docs).
fn stored_from(data: &[u8]) -> StoredRecord {
    let mut f = Fields::new(data);
    let offset = int(f.next_or_empty());
    let timestamp_ms = int(f.next_or_empty());
    let key = match f.next_or_empty() {
        [k, rest @ ..] if k & 1 == 1 => Some(Bytes::copy_from_slice(rest)),
        _ => None,
    };
    let payload = Bytes::copy_from_slice(f.next_or_empty());
    let mut headers = Vec::new();
    while let Some(name) = f.next() {
        // The log hands over UTF-8 names only (it refuses a frame with any other).
        let name = String::from_utf8_lossy(name).into_owned();
        headers.push((name, Bytes::copy_from_slice(f.next_or_empty())));
    }
    StoredRecord {
        offset,
        timestamp_ms,
        key,
        headers,
        payload,
    }
}

/// The input [`stored_from`] reads as `record` at `offset`.
fn input_of(offset: u64, record: &Record) -> Vec<u8> {
    let key = record
        .key
        .as_ref()
        .map_or_else(Vec::new, |k| [&[1u8][..], k].concat());
    let mut parts = vec![
        offset.to_le_bytes().to_vec(),
        record.timestamp_ms.to_le_bytes().to_vec(),
        key,
        record.payload.to_vec(),
    ];
    for (n, v) in &record.headers {
        parts.push(n.as_bytes().to_vec());
        parts.push(v.to_vec());
    }
    join(parts)
}

fn stored(offset: u64, r: Record) -> StoredRecord {
    StoredRecord {
        offset,
        timestamp_ms: r.timestamp_ms,
        key: r.key,
        headers: r.headers,
        payload: r.payload,
    }
}

/// Messages with every optional field set and unset.
fn sample_messages() -> Vec<Message> {
    let t = SystemTime::UNIX_EPOCH + Duration::from_nanos(1_765_000_000_123_456_789);
    let mut headers = Headers::new();
    headers.insert("a", "1");
    headers.insert(codec::META_HEADER, "a user header of a reserved name");
    headers.insert("é", "");
    let full = Message {
        id: MessageId::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef),
        topic: Topic::new("orders.created").expect("topic"),
        payload: Bytes::from_static(b"{\"order\":1}"),
        headers,
        key: Some(Bytes::from_static(b"customer-7")),
        priority: Priority::Urgent,
        timestamp: t,
        expires_at: Some(t + Duration::from_secs(5)),
        deliver_at: Some(t + Duration::from_secs(1)),
        reply_to: Some(Topic::new("inbox.x").expect("topic")),
        correlation_id: Some("c-1 %&=".into()),
        log_offset: None,
        fence: None,
    };
    let bare = Message {
        id: MessageId::from_u128(1),
        topic: Topic::new("a").expect("topic"),
        payload: Bytes::new(),
        headers: Headers::new(),
        key: None,
        priority: Priority::Normal,
        timestamp: SystemTime::UNIX_EPOCH,
        expires_at: None,
        deliver_at: None,
        reply_to: None,
        correlation_id: None,
        log_offset: None,
        fence: None,
    };
    vec![full, bare]
}

/// A decoded message, field for field (`Message` has no `PartialEq`: its `Debug` shows
/// every field).
fn same(a: &Message, b: &Message) -> bool {
    format!("{a:?}") == format!("{b:?}")
}

/// A stream record as a message: `decode_targeted` (what a subscription reads) and
/// `published_id` (what the duplicate window's rebuild reads).
#[test]
fn fuzz_embedded_record() {
    // R-SEC-2
    let mut seeds = Vec::new();
    for (i, m) in sample_messages().iter().enumerate() {
        seeds.push(input_of(i as u64, &codec::encode(m)));
        seeds.push(input_of(9, &codec::encode_for(m, "billing")));
    }
    Target::new("embedded_record", CARGO)
        .seeds(seeds)
        .dictionary(DICTIONARY)
        // The message's parts are copied out of the record once; the round trip encodes
        // and decodes once more.
        .alloc_bound(|len| 4096 + 12 * len)
        .run(|data| {
            let r = stored_from(data);
            let id = codec::published_id(&r);
            let offset = r.offset;
            match codec::decode_targeted(r.clone()) {
                Ok((m, target)) => {
                    if target.is_none() {
                        assert_eq!(id, Some(m.id.as_u128()), "published_id disagrees");
                    }
                    // Round trip: re-encoded, it decodes to the same message and target.
                    let again = match &target {
                        Some(t) => codec::encode_for(&m, t),
                        None => codec::encode(&m),
                    };
                    let (m2, t2) = codec::decode_targeted(stored(offset, again))
                        .expect("a re-encoded message decodes");
                    assert!(same(&m, &m2), "round trip changed {m:?} into {m2:?}");
                    assert_eq!(target, t2);
                    Outcome::of(("ok", target.is_some(), m.headers.len().min(2)))
                }
                Err(why) => Outcome::of((why, id.is_some())),
            }
        });
}

/// A record of a durable DLQ log: an entry (current and legacy layouts) or a removal.
#[test]
fn fuzz_dlq_record() {
    // R-SEC-2
    let reasons = [
        DeadLetterReason::RetriesExhausted {
            attempts: 3,
            last_error: "timeout: é".into(),
        },
        DeadLetterReason::Rejected {
            error: String::new(),
        },
        DeadLetterReason::Expired,
        DeadLetterReason::Overflow,
        DeadLetterReason::DroppedOldest,
        DeadLetterReason::Shutdown,
    ];
    let mut seeds = Vec::new();
    for (i, reason) in reasons.iter().enumerate() {
        let m = &sample_messages()[i % 2];
        seeds.push(input_of(i as u64, &dlq_record::encode(m, reason, 4, 77)));
    }
    seeds.push(input_of(0, &dlq_record::encode_removal(&[])));
    seeds.push(input_of(1, &dlq_record::encode_removal(&[0, 5, u64::MAX])));
    // The legacy layout: the message record with three trailing text headers.
    let mut legacy = codec::encode(&sample_messages()[0]);
    for (n, v) in [
        (
            "tidings-dlq-reason",
            "retries exhausted after 3 attempts: boom",
        ),
        ("tidings-dlq-attempts", "3"),
        ("tidings-dlq-offset", "12"),
    ] {
        legacy.headers.push((n.to_owned(), Bytes::from(v)));
    }
    seeds.push(input_of(2, &legacy));
    Target::new("dlq_record", CARGO)
        .seeds(seeds)
        .dictionary(DICTIONARY)
        .alloc_bound(|len| 4096 + 12 * len)
        .run(|data| match dlq_record::decode_any(stored_from(data)) {
            Ok(DlqRecord::Entry(m, meta)) => {
                assert_eq!(m.log_offset, Some(meta.offset));
                let again = dlq_record::encode(&m, &meta.reason, meta.attempts, meta.offset);
                match dlq_record::decode_any(stored(0, again)) {
                    Ok(DlqRecord::Entry(m2, meta2)) => {
                        assert!(same(&m, &m2), "round trip changed {m:?} into {m2:?}");
                        assert_eq!(meta, meta2);
                    }
                    other => panic!("a re-encoded DLQ entry decodes as {other:?}"),
                }
                Outcome::of(("entry", format!("{:?}", meta.reason).len() > 10))
            }
            Ok(DlqRecord::Removed(offsets)) => {
                let again = dlq_record::decode_any(stored(0, dlq_record::encode_removal(&offsets)));
                assert!(
                    matches!(&again, Ok(DlqRecord::Removed(o)) if *o == offsets),
                    "removal round trip: {again:?}"
                );
                Outcome::of(("removed", offsets.len().min(2)))
            }
            Err(why) => Outcome::of(why),
        });
}

/// The kind of a `StreamError` (its variant), without paths and numbers.
fn kind(e: &impl std::fmt::Debug) -> String {
    let s = format!("{e:?}");
    s.split(|c: char| !c.is_alphanumeric() && c != '_')
        .next()
        .unwrap_or("")
        .to_owned()
}

/// A consumer's offset file, written into a directory and loaded by `OffsetStore::load`.
#[test]
fn fuzz_offset_file() {
    // R-SEC-2
    let dir = tidings_fuzz::scratch_dir("offset_file");
    let store = OffsetStore::new(Arc::new(FsStorage), &dir, "billing");
    let path = store.path().to_path_buf();
    let seeds = [0u64, 1, 42, u64::MAX].map(|n| {
        store.store(n).expect("store");
        std::fs::read(&path).expect("read back")
    });
    let report = Target::new("offset_file", CARGO)
        .seeds(seeds)
        .dictionary(["tidings-offset", "\n", "\r\n", " ", "18446744073709551616"])
        // One short line is read (a longer file is refused by its length).
        .alloc_bound(|len| 4096 + 4 * len)
        .run(move |data| {
            std::fs::write(&path, data).expect("write the offset file");
            match store.load() {
                Ok(Some(n)) => {
                    assert_eq!(parse(data), Ok(n));
                    store.store(n).expect("store");
                    assert_eq!(store.load().expect("load"), Some(n), "round trip");
                    Outcome::of("ok")
                }
                Ok(None) => panic!("a file that exists loads as no file"),
                // Which check refused it (the error itself names the path).
                Err(e) => Outcome::of((kind(&e), parse(data).err())),
            }
        });
    let _ = std::fs::remove_dir_all(&dir);
    assert!(report.execs > 0);
}

/// A stream's `META` file: decoded, and checked by `check_or_write` as opening the stream
/// does.
#[test]
fn fuzz_stream_meta() {
    // R-SEC-2
    let scratch = tidings_fuzz::scratch_dir("stream_meta");
    let dir = scratch.clone();
    let requested = StreamMeta {
        patterns: vec!["orders.#".into(), "audit.*".into()],
        retention: crate::durable::config::Retention::new()
            .max_bytes(1 << 20)
            .max_age(Duration::from_secs(3600)),
        duplicate_window_ms: Some(120_000),
    };
    let seeds = [
        requested.encode(),
        StreamMeta {
            patterns: vec![],
            retention: crate::durable::config::Retention::default(),
            duplicate_window_ms: None,
        }
        .encode(),
    ];
    let report = Target::new("stream_meta", CARGO)
        .seeds(seeds.map(String::into_bytes))
        .dictionary([
            "pattern ",
            "max_bytes ",
            "max_age_ms ",
            "duplicate_window_ms ",
            "\n",
            "tidings-stream 1\n",
        ])
        .alloc_bound(|len| 8192 + 8 * len)
        .run(move |data| {
            let decoded = StreamMeta::decode(data);
            // Round trip for what the encoder can write: patterns are valid patterns (no
            // control characters). A pattern line that is not one still decodes (a typed
            // `ConfigMismatch` at open, against the valid patterns asked for), but may not
            // come back byte for byte: a last line ending in `\r` keeps it, and re-encoded,
            // that `\r` and the encoder's `\n` make a line end, which drops it.
            if let Ok(meta) = &decoded
                && meta.patterns.iter().all(|p| Pattern::new(p).is_ok())
            {
                let again = StreamMeta::decode(meta.encode().as_bytes());
                assert_eq!(again.as_ref(), Ok(meta), "round trip");
            }
            std::fs::write(dir.join(tidings_log::META_FILE), data).expect("write META");
            let checked =
                super::stream_meta::check_or_write(&FsStorage, &dir, "orders", &requested);
            assert!(
                decoded.is_ok() || checked.is_err(),
                "an undecodable META file was accepted"
            );
            let why = decoded
                .err()
                .and_then(|e| e.split(' ').next().map(str::to_owned));
            Outcome::of((why, checked.map_err(|e| kind(&e))))
        });
    let _ = std::fs::remove_dir_all(&scratch);
    assert!(report.execs > 0);
}

/// A durable dedup store's log and a stream's tail as the duplicate window reads it: the
/// input's records (fields of fields, each read by [`stored_from`]) are appended to a real
/// log, which is then opened by `DurableDedupStore::open` and read by `IdWindow::rebuild`.
#[test]
fn fuzz_dedup_and_id_window() {
    // R-SEC-2
    const WINDOW_ENTRIES: usize = 8;
    let scratch = tidings_fuzz::scratch_dir("dedup_and_id_window");
    let dir = scratch.join("log");
    let id_record = |id: u128| Record::new(0, id.to_le_bytes().to_vec());
    let mut published: Vec<Vec<u8>> = sample_messages()
        .iter()
        .map(|m| input_of(0, &codec::encode(m)))
        .collect();
    published.push(input_of(0, &codec::encode_for(&sample_messages()[0], "x")));
    let ids: Vec<Vec<u8>> = [0u128, 7, u128::MAX]
        .map(|id| input_of(0, &id_record(id)))
        .to_vec();
    let report = Target::new("dedup_and_id_window", CARGO)
        .seeds([join(&ids), join(&published), join([&ids[0], &published[0]])])
        .dictionary(DICTIONARY)
        .max_len(8 << 10)
        .alloc_bound(|len| (2 << 20) + 16 * len)
        .run(move |data| {
            let _ = std::fs::remove_dir_all(&dir);
            let records: Vec<Record> = Fields::new(data)
                .map(|f| stored_from(f).to_record())
                .collect();
            {
                let config = LogConfig::new().fsync(Fsync::Never);
                let (log, _) = Log::open(&dir, config).expect("a new log opens");
                for r in &records {
                    // A record the log refuses (a limit) is not on disk: nothing to decode.
                    let _ = log.append(r);
                }
                log.close().expect("close");
            }
            let dedup = match DurableDedupStore::open(Arc::new(FsStorage), dir.clone(), 64) {
                Ok(store) => {
                    for r in &records {
                        if let Ok(b) = <[u8; 16]>::try_from(&r.payload[..]) {
                            let id = MessageId::from_u128(u128::from_le_bytes(b));
                            assert!(store.contains(id), "a stored id was not replayed");
                        }
                    }
                    "ok".to_owned()
                }
                Err(e) => kind(&e),
            };
            let (log, _) = Log::open(&dir, LogConfig::default()).expect("reopen");
            let window = IdWindow::new(Duration::from_secs(3600), WINDOW_ENTRIES);
            let n = window.rebuild(&log);
            assert!(
                n <= WINDOW_ENTRIES,
                "the window holds {n} ids, over its bound"
            );
            let _ = log.close();
            Outcome::of((dedup, n))
        });
    let _ = std::fs::remove_dir_all(&scratch);
    assert!(report.execs > 0);
}

#[test]
fn stored_from_reads_what_input_of_writes() {
    let rec = codec::encode(&sample_messages()[0]);
    let back = stored_from(&input_of(5, &rec));
    assert_eq!(back, stored(5, rec));
}
