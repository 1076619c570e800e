//! R-SEC-2 fuzz target for a JetStream record as a tidings message: its subject, payload
//! and headers, as any NATS client may have published them, through the codec's one-pass
//! header lookup and `decode` (what the puller, the transport and the DLQ reader call).
//! The engine is `tidings-fuzz` (README, "Fuzzing"); `fuzz_jetstream_record` runs for
//! `TIDINGS_FUZZ_SECS` over the kept corpus `fuzz/corpus/jetstream_record/` and its
//! mutations, and fails on a panic, a hang or an allocation beyond the stated bound.
//!
//! Input fields: `[subject, stream sequence, store time (ns), payload, name, value, …]`.
//! A header name or value the NATS header types refuse (they could not arrive over the
//! wire) is left out, as the client library would.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::HeaderMap;
use async_nats::header::{HeaderName, HeaderValue};
use bytes::Bytes;
use tidings::{Limits, Message, Priority};
use tidings_fuzz::fields::{int, join};
use tidings_fuzz::{Fields, Outcome, Target};

use crate::codec::{self, Stored, TidingsHeaders};

/// Measures allocations of the fuzz worker thread (test builds only; see `tidings-fuzz`).
#[global_allocator]
static FUZZ_ALLOC: tidings_fuzz::TrackingAlloc = tidings_fuzz::TrackingAlloc;

/// Every header the codec reads.
const NAMES: &[&str] = &[
    "tidings-id",
    "tidings-ts",
    "tidings-exp",
    "tidings-at",
    "tidings-key",
    "tidings-prio",
    "tidings-reply",
    "tidings-corr",
    "tidings-h",
    "tidings-to",
];

struct Record {
    subject: String,
    sequence: u64,
    published: SystemTime,
    payload: Bytes,
    headers: HeaderMap,
}

fn record_from(data: &[u8]) -> Record {
    let mut f = Fields::new(data);
    let subject = String::from_utf8_lossy(f.next_or_empty()).into_owned();
    let sequence = int(f.next_or_empty());
    let published = UNIX_EPOCH + Duration::from_nanos(int(f.next_or_empty()));
    let payload = Bytes::copy_from_slice(f.next_or_empty());
    let mut headers = HeaderMap::new();
    while let Some(name) = f.next() {
        let value = f.next_or_empty();
        let (Ok(name), Ok(value)) = (std::str::from_utf8(name), std::str::from_utf8(value)) else {
            continue;
        };
        if let (Ok(n), Ok(v)) = (name.parse::<HeaderName>(), value.parse::<HeaderValue>()) {
            headers.append(n, v);
        }
    }
    Record {
        subject,
        sequence,
        published,
        payload,
        headers,
    }
}

fn input_of(subject: &str, sequence: u64, published_ns: u64, m: &Message) -> Vec<u8> {
    let map = codec::encode(m);
    let mut parts: Vec<Vec<u8>> = vec![
        subject.as_bytes().to_vec(),
        sequence.to_le_bytes().to_vec(),
        published_ns.to_le_bytes().to_vec(),
        m.payload().to_vec(),
    ];
    for (name, values) in map.iter() {
        for v in values {
            parts.push(name.to_string().into_bytes());
            parts.push(v.as_str().as_bytes().to_vec());
        }
    }
    join(parts)
}

fn decode(r: &Record, headers: &HeaderMap) -> Result<Message, codec::DecodeError> {
    let found = TidingsHeaders::of(Some(headers));
    let header = |n: &str| found.get(n);
    let stored = Stored {
        subject: &r.subject,
        payload: r.payload.clone(),
        sequence: r.sequence,
        published: r.published,
        header: &header,
    };
    codec::decode(&stored, &Limits::default())
}

#[test]
fn fuzz_jetstream_record() {
    // R-SEC-2
    let full = Message::to("orders.created")
        .payload("{\"order\":1}")
        .header("a", "1")
        .header("x y%&=", "é\r\n")
        .key([0u8, b'k', 255])
        .priority(Priority::Urgent)
        .ttl(Duration::from_secs(60))
        .delay(Duration::from_secs(5))
        .reply_to("inbox.r")
        .correlation_id("c 1\n")
        .build_detached()
        .expect("a valid message");
    let bare = Message::to("a").build_detached().expect("a valid message");
    let mut seeds = vec![
        input_of("orders.created", 1, 1_765_000_000_000_000_000, &full),
        input_of("a", 2, 0, &bare),
    ];
    // A record from another NATS client: no tidings headers at all.
    seeds.push(join([
        &b"events.raw"[..],
        &7u64.to_le_bytes(),
        &[],
        b"hello",
        b"Nats-Msg-Id",
        b"x",
    ]));
    Target::new("jetstream_record", "-p tidings-jetstream --lib")
        .seeds(seeds)
        .dictionary(
            NAMES
                .iter()
                .copied()
                .chain(["%", "%2", "%zz", "&", "=", "ff"]),
        )
        // Header values are copied once into the message; the round trip encodes and
        // decodes once more.
        .alloc_bound(|len| 16384 + 24 * len)
        .run(|data| {
            let r = record_from(data);
            // The one-pass lookup answers as the map does.
            let found = TidingsHeaders::of(Some(&r.headers));
            for n in NAMES {
                assert_eq!(found.get(n), codec::lookup(&r.headers, n), "lookup of {n}");
            }
            match decode(&r, &r.headers) {
                Ok(m) => {
                    assert_eq!(m.offset(), Some(r.sequence));
                    // Round trip: re-encoded, it decodes to the same message.
                    let again =
                        decode(&r, &codec::encode(&m)).expect("a re-encoded message decodes");
                    assert_eq!(again.to_parts(), m.to_parts(), "round trip");
                    Outcome::of(("ok", m.headers().len().min(2), m.key().is_some()))
                }
                // The reason names the header and why, sometimes with the value: keep the
                // header and the first words.
                Err(e) => Outcome::of((
                    e.header,
                    e.reason.split(' ').take(3).collect::<Vec<_>>().join(" "),
                )),
            }
        });
}
