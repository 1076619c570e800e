//! Records the client library cannot read, and how a subscription gets past them
//! (issue 34; R-SEC-2, R-DEL-6).
//!
//! # The problem
//! Any client may write any bytes into a stream's subject namespace. Most malformed records
//! reach tidings as deliveries and fail to *decode* (a `tidings-*` header that does not
//! parse, a subject that is not a topic): those are dead-lettered `Rejected` by the puller
//! and the cursor like any record that is not a tidings message. But some header blocks
//! never reach tidings at all: async-nats parses every received message's header block on
//! its connection task, and on one it refuses — not UTF-8, a line without a colon (a lone
//! LF inside a value makes one), a header name it refuses (a control byte), a version line
//! other than `NATS/1.0` — it drops the whole connection and reconnects. The delivery is
//! lost with it, the server hands it out again after the ack wait, and the same happens
//! again, forever: nothing in the batch behind it is handled, nothing is dead-lettered, no
//! error shows. (A lone CR in a value panicked the connection task up to async-nats 0.51,
//! killing the connection for good; 0.52 reads it as a space.)
//!
//! # The design: isolate, then read it another way
//! * **Isolate.** Deliveries and the cursors' wake-up subscriptions come over a second
//!   connection of their own (`JetStream::receiving`), so such a record costs that
//!   connection a reconnect, never the publishes, DLQ writes and requests of the main one.
//!   The client reconnects it by itself: the connection goes on.
//! * **Detect.** A pull during which the receiving connection was re-established
//!   (`JetStream::connects` changed) may have met such a record; so may a pull that ended
//!   with an error.
//! * **Find and read it another way.** The consumer's unfinished range — above its ack
//!   floor, up to the last stream sequence it delivered — is read record by record through
//!   the stream's message-get API (`$JS.API.STREAM.MSG.GET`), whose answer is JSON with the
//!   header block in base64: it never goes through the client's header parser. Each header
//!   block is checked with the same rules the client applies ([`unreadable`]); one it
//!   would refuse, on a subject this consumer takes, is dead-lettered `Rejected` with the
//!   reason (the DLQ entry carries the payload, not the header block), and only then
//!   terminated by its acknowledgement subject, which names the stream sequence.
//!   Sequences found readable are not read again (the screen's watermark), so each
//!   record is read at most once per consumer; at most [`SCREEN_BATCH`] per pull.
//!
//! Why not something simpler: an upgrade fixes only the CR panic (0.52 refuses the other
//! shapes exactly as 0.51 did); a fork of the client's parser is a maintenance burden no
//! user asked for; a consumer cannot be moved past one record without deleting it (which
//! drops every other delivery of every process sharing it); and deleting the record from
//! the stream would take it from other consumers too.
//!
//! # What remains
//! * A record costs the receiving connection one reconnect per process that is handed it
//!   (and one per process whose wake-up subscription sees it published): what else was in
//!   flight on that connection — deliveries of other subscriptions, acknowledgements — is
//!   handed out again after the ack wait (at-least-once, nothing lost).
//! * The rules of [`unreadable`] are the client's as of async-nats 0.52; a later version
//!   that refuses more must be mirrored there (tests/poison.rs names each shape).
//! * The DLQ, handler-start counts and dedup stores are read through the message-get API
//!   too (JSON, parsed in the calling task): a foreign record there refuses a DLQ listing
//!   as `Corrupt` (see `classify`), reads as no handler start counted, or as an id not
//!   seen; it never costs a connection. A `NatsTransport`'s subscriptions and a keyed
//!   group's lease bucket (direct get: answers are messages) still receive on the main
//!   connection: a header block the client refuses there costs it a reconnect
//!   (docs/backends.md, "Foreign records on JetStream").

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use crate::connection::connect::JetStream;

/// Most records one screen reads (one request each); the rest wait for the next.
pub(crate) const SCREEN_BATCH: u64 = 1024;

/// Why the client library would refuse `block` (a record's header block as stored), by
/// the rules its connection task applies to a received message (async-nats 0.52,
/// `connection.rs`, `HMSG`); `None` when it reads it. Bounded: one pass over the block.
pub(crate) fn unreadable(block: &[u8]) -> Option<&'static str> {
    if block.is_empty() {
        return None;
    }
    let Ok(text) = std::str::from_utf8(block) else {
        return Some("its header block is not UTF-8");
    };
    let mut lines = text.lines().peekable();
    let Some(version) = lines.next() else {
        return Some("its header block has no version line");
    };
    // What follows `NATS/1.0` (a status) is not checked: the server hands a stored record
    // out without it (nats-server 2.15.1; tests/poison.rs shows such a record handled).
    if !version.starts_with("NATS/1.0") {
        return Some("its header version line is not NATS/1.0");
    }
    while let Some(line) = lines.next() {
        if line.is_empty() {
            continue;
        }
        let Some((name, _)) = line.split_once(':') else {
            return Some("a header line has no colon (a lone LF in a value makes one)");
        };
        if name.parse::<async_nats::header::HeaderName>().is_err() {
            return Some("a header name has a byte a header name cannot have");
        }
        // A value continues on lines that begin with whitespace.
        while lines
            .next_if(|s| s.starts_with(char::is_whitespace))
            .is_some()
        {}
    }
    None
}

/// A record read through the stream's message-get API.
#[derive(Debug)]
pub(crate) struct RawRecord {
    pub(crate) subject: String,
    pub(crate) header: Vec<u8>,
    pub(crate) payload: Bytes,
    pub(crate) stored: SystemTime,
}

/// The JetStream API error code for "no message found".
const NO_MESSAGE_FOUND: u64 = 10037;

/// Reads record `seq` of the JetStream stream `stream` through the message-get API (JSON,
/// never the client's header parser); `Ok(None)` when there is none (deleted, purged).
///
/// # Errors
/// The request failed or timed out, or the answer is not what the API answers.
pub(crate) async fn read(
    js: &JetStream,
    stream: &str,
    seq: u64,
) -> Result<Option<RawRecord>, String> {
    let subject = format!("$JS.API.STREAM.MSG.GET.{stream}");
    let asked = Bytes::from(format!("{{\"seq\":{seq}}}"));
    let answer = tokio::time::timeout(js.request_timeout, js.client.request(subject, asked))
        .await
        .map_err(|_| format!("no answer within {:?}", js.request_timeout))?
        .map_err(|e| e.to_string())?;
    let v: serde_json::Value =
        serde_json::from_slice(&answer.payload).map_err(|e| format!("answer: {e}"))?;
    if let Some(error) = v.get("error") {
        if error.get("err_code").and_then(serde_json::Value::as_u64) == Some(NO_MESSAGE_FOUND) {
            return Ok(None);
        }
        return Err(format!("the server refused: {error}"));
    }
    let m = v.get("message").ok_or("answer without a message")?;
    let field = |name: &str| -> Result<Vec<u8>, String> {
        m.get(name)
            .and_then(serde_json::Value::as_str)
            .map_or(Ok(Vec::new()), |s| {
                base64(s).ok_or_else(|| format!("answer: {name} is not base64"))
            })
    };
    let subject = m
        .get("subject")
        .and_then(serde_json::Value::as_str)
        .ok_or("answer without a subject")?
        .to_owned();
    let stored = m
        .get("time")
        .and_then(serde_json::Value::as_str)
        .and_then(|t| {
            time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok()
        })
        .map_or(UNIX_EPOCH, |t| {
            let nanos = u64::try_from(t.unix_timestamp_nanos()).unwrap_or(0);
            UNIX_EPOCH + Duration::from_nanos(nanos)
        });
    Ok(Some(RawRecord {
        subject,
        header: field("hdrs")?,
        payload: Bytes::from(field("data")?),
        stored,
    }))
}

/// Terminates the delivery of stream sequence `seq` by the consumer `consumer` of
/// `stream` through its acknowledgement subject (`$JS.ACK.<stream>.<consumer>.<delivered>
/// .<stream seq>.<consumer seq>.<time>.<pending>`: the server finds the delivery by its
/// stream sequence), waiting for the server's answer, which it gives only when the record
/// was pending for the consumer.
///
/// # Errors
/// No answer within the request timeout (not pending, or the server away).
pub(crate) async fn terminate(
    js: &JetStream,
    stream: &str,
    consumer: &str,
    seq: u64,
    why: &str,
) -> Result<(), String> {
    let subject = format!("$JS.ACK.{stream}.{consumer}.1.{seq}.1.0.0");
    let body = Bytes::from(format!("+TERM {why}"));
    tokio::time::timeout(js.request_timeout, js.client.request(subject, body))
        .await
        .map_err(|_| format!("no answer within {:?}", js.request_timeout))?
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Whether the NATS subject `subject` matches the NATS filter `filter` (`*` one token,
/// `>` the rest).
pub(crate) fn subject_matches(filter: &str, subject: &str) -> bool {
    let mut subject = subject.split('.');
    for f in filter.split('.') {
        match (f, subject.next()) {
            (">", Some(_)) => return true,
            ("*", Some(_)) => {}
            (f, Some(s)) if f == s => {}
            _ => return false,
        }
    }
    subject.next().is_none()
}

/// Standard base64 with optional padding (what the message-get API answers); `None` on a
/// byte outside the alphabet.
fn base64(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() / 4 * 3 + 2);
    let (mut acc, mut bits) = (0u32, 0u32);
    for b in s.bytes() {
        let v = match b {
            b'A'..=b'Z' => b - b'A',
            b'a'..=b'z' => b - b'a' + 26,
            b'0'..=b'9' => b - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' => break,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push(u8::try_from((acc >> bits) & 0xff).unwrap_or(0));
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Write};
    use tidings_testkit::nats::{NatsServer, NatsServerOptions};

    /// Generous bound for waits on the server (never asserted as a speed).
    const PATIENCE: Duration = Duration::from_secs(30);

    /// Publishes `header` and `payload` to `subject` through a plain TCP connection speaking
    /// the NATS protocol: bytes no client library would send.
    fn publish_raw(url: &str, subject: &str, header: &[u8], payload: &[u8]) {
        let mut tcp = std::net::TcpStream::connect(url.trim_start_matches("nats://"))
            .expect("raw TCP connection");
        tcp.set_read_timeout(Some(PATIENCE)).expect("read timeout");
        let mut frame = format!(
            "CONNECT {{\"headers\":true,\"verbose\":false}}\r\nHPUB {subject} {} {}\r\n",
            header.len(),
            header.len() + payload.len()
        )
        .into_bytes();
        frame.extend_from_slice(header);
        frame.extend_from_slice(payload);
        frame.extend_from_slice(b"\r\nPING\r\n");
        tcp.write_all(&frame).expect("write");
        let mut input = BufReader::new(tcp);
        let mut line = String::new();
        while line.trim_end() != "PONG" {
            line.clear();
            input.read_line(&mut line).expect("read");
            assert!(!line.is_empty() && !line.starts_with("-ERR"), "{line}");
        }
    }

    // R-SEC-2: a header block the client cannot parse costs the connection it arrives on a
    // reconnect, and only that one: the receiving connection takes it, the main one is
    // untouched; the record reads back through the message-get API and is recognised.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unreadable_record_costs_only_the_receiving_connection() {
        let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
            return;
        };
        let main = crate::connection::connect::ConnectOptions::new(server.url())
            .connect()
            .await
            .expect("connects");
        main.context
            .create_stream(async_nats::jetstream::stream::Config {
                name: "RAW".into(),
                subjects: vec!["raw.>".into()],
                ..Default::default()
            })
            .await
            .expect("stream");
        let receiving = main.receiving().await.expect("the receiving connection");
        let mut sub = receiving
            .client
            .subscribe("raw.>")
            .await
            .expect("subscribes");
        // A round trip on the same connection, so the server has the subscription before
        // the record is published over another connection (a flush only writes it out:
        // under load the server took the record first, delivered it to nobody, and the
        // test waited for a reconnect that had no reason to happen).
        receiving
            .client
            .request("$JS.API.INFO", "".into())
            .await
            .expect("the server answers on the receiving connection");
        assert_eq!((main.connects(), receiving.connects()), (1, 1));
        publish_raw(
            &server.url(),
            "raw.x",
            b"NATS/1.0\r\nno-colon\r\n\r\n",
            b"p",
        );
        let deadline = std::time::Instant::now() + PATIENCE;
        while receiving.connects() < 2 {
            let stats = receiving.client.statistics();
            assert!(
                std::time::Instant::now() < deadline,
                "the receiving connection did not reconnect within {PATIENCE:?} of the record \
                 (connection state {:?}; it received {} messages, {} bytes; main connection: \
                 {} connects)",
                receiving.client.connection_state(),
                stats.in_messages.load(std::sync::atomic::Ordering::Relaxed),
                stats.in_bytes.load(std::sync::atomic::Ordering::Relaxed),
                main.connects(),
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(main.connects(), 1, "the main connection never dropped");
        let record = loop {
            if let Some(record) = read(&main, "RAW", 1).await.expect("reads") {
                break record;
            }
            assert!(std::time::Instant::now() < deadline, "stored");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(record.subject, "raw.x");
        assert_eq!(&record.payload[..], b"p");
        assert!(record.stored > UNIX_EPOCH);
        assert!(unreadable(&record.header).is_some(), "{record:?}");
        assert!(read(&main, "RAW", 2).await.expect("reads").is_none());
        // The receiving connection goes on.
        receiving
            .client
            .publish("raw.y", "clean".into())
            .await
            .expect("publish");
        let got = tokio::time::timeout(PATIENCE, futures_util::StreamExt::next(&mut sub))
            .await
            .expect("a clean message after the reconnect")
            .expect("the subscription lives");
        assert_eq!(got.subject.as_str(), "raw.y");
    }

    // R-SEC-2: the shapes issue 34 found, each refused with a reason, and what the client
    // reads is read.
    #[test]
    fn what_the_client_refuses_is_recognised() {
        for block in [
            &b"NATS/1.0\r\nx: \xff\r\n\r\n"[..],
            b"NATS/1.0\r\nx\xff: v\r\n\r\n",
            b"NATS/1.0\r\nno-colon\r\n\r\n",
            b"NATS/1.0\r\nx: a\nb\r\n\r\n",
            b"NATS/1.0\r\nx\x01y: v\r\n\r\n",
            b"NATS/2.0\r\nx: v\r\n\r\n",
            b"HTTP/1.1\r\n\r\n",
        ] {
            assert!(
                unreadable(block).is_some(),
                "{:?}",
                String::from_utf8_lossy(block)
            );
        }
        for block in [
            &b""[..],
            b"NATS/1.0\r\n\r\n",
            b"NATS/1.0\r\ntidings-key: \xe2\x9c\x93a\r\n\r\n",
            b"NATS/1.0\r\nx: a\rb\r\n\r\n",
            b"NATS/1.0\r\nx: a\r\n  continued\r\n\r\n",
            b"NATS/1.0 404 No Messages\r\n\r\n",
        ] {
            assert_eq!(
                unreadable(block),
                None,
                "{:?}",
                String::from_utf8_lossy(block)
            );
        }
    }

    #[test]
    fn base64_decodes_what_the_api_answers() {
        assert_eq!(
            base64("TkFUUy8xLjANCg0K").as_deref(),
            Some(&b"NATS/1.0\r\n\r\n"[..])
        );
        assert_eq!(base64("YQ==").as_deref(), Some(&b"a"[..]));
        assert_eq!(base64("YWI=").as_deref(), Some(&b"ab"[..]));
        assert_eq!(base64("").as_deref(), Some(&b""[..]));
        assert_eq!(base64("a b"), None);
    }

    #[test]
    fn subjects_match_filters_as_nats_does() {
        assert!(subject_matches("a.>", "a.b.c"));
        assert!(!subject_matches("a.>", "a"));
        assert!(subject_matches("a.*.c", "a.b.c"));
        assert!(!subject_matches("a.*", "a.b.c"));
        assert!(subject_matches("a", "a"));
        assert!(!subject_matches("a", "a.b"));
    }
}
