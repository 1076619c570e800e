//! Records a foreign producer writes with raw protocol bytes (issue 34): whatever their
//! headers or subject, each is handled or dead-lettered with a reason, the subscription and
//! the connection go on, and a damaged record costs only itself (R-SEC-2, R-DEL-6).
//!
//! The records are written through a plain TCP connection speaking the NATS protocol
//! (`CONNECT`, `SUB`, `HPUB` with a reply subject for the stream's acknowledgement), so
//! bytes a client library would refuse to send reach the stream as they are. Each shape runs
//! against a real `nats-server` of its own (started by the testkit launcher; skipped, with a
//! notice, only under `TIDINGS_SKIP_NATS=1`).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tidings::durable::DurableBackend;
use tidings::{
    Broker, DeadLetterReason, Driver, DurableDeadLetter, DurableSpec, HandlerError, Message,
    StreamConfig, SubscribeOptions,
};
use tidings_jetstream::{ConnectOptions, JetStreamBackend};
use tidings_testkit::nats::{NatsServer, NatsServerOptions};

/// Generous bound on every wait (never asserted as a speed).
const PATIENCE: Duration = Duration::from_secs(60);

const STREAM: &str = "foreign";
const TOPIC: &str = "foreign.a";

/// A plain TCP connection speaking the NATS client protocol, for bytes no client library
/// would send.
struct Raw {
    out: TcpStream,
    input: BufReader<TcpStream>,
}

const INBOX: &str = "_INBOX.poison";

impl Raw {
    fn connect(url: &str) -> Self {
        let addr = url.trim_start_matches("nats://");
        let out = TcpStream::connect(addr).expect("raw TCP connection to the server");
        out.set_read_timeout(Some(PATIENCE)).expect("read timeout");
        let input = BufReader::new(out.try_clone().expect("clone the socket"));
        let mut raw = Self { out, input };
        let info = raw.line();
        assert!(info.starts_with("INFO "), "{info}");
        raw.send(
            format!(
                "CONNECT {{\"headers\":true,\"verbose\":false,\"pedantic\":false}}\r\n\
                 SUB {INBOX} 1\r\nPING\r\n"
            )
            .as_bytes(),
        );
        raw.until_pong();
        raw
    }

    fn send(&mut self, bytes: &[u8]) {
        self.out.write_all(bytes).expect("write to the server");
        self.out.flush().expect("flush");
    }

    fn line(&mut self) -> String {
        let mut line = String::new();
        self.input
            .read_line(&mut line)
            .expect("read from the server");
        assert!(!line.is_empty(), "the server closed the raw connection");
        line.trim_end().to_owned()
    }

    fn until_pong(&mut self) {
        loop {
            let line = self.line();
            match line.as_str() {
                "PONG" => return,
                "PING" => self.send(b"PONG\r\n"),
                l if l.starts_with("-ERR") => panic!("the server refused: {l}"),
                _ => {}
            }
        }
    }

    /// Publishes `header` (the whole header block, as it goes on the wire) and `payload`
    /// to `subject`; returns the stream sequence from the stream's acknowledgement.
    fn publish(&mut self, subject: &str, header: &[u8], payload: &[u8]) -> u64 {
        let mut frame = format!(
            "HPUB {subject} {INBOX} {} {}\r\n",
            header.len(),
            header.len() + payload.len()
        )
        .into_bytes();
        frame.extend_from_slice(header);
        frame.extend_from_slice(payload);
        frame.extend_from_slice(b"\r\n");
        self.send(&frame);
        loop {
            let line = self.line();
            if line == "PING" {
                self.send(b"PONG\r\n");
                continue;
            }
            assert!(!line.starts_with("-ERR"), "the server refused: {line}");
            let Some(args) = line.strip_prefix("MSG ") else {
                continue;
            };
            let len: usize = args
                .split_whitespace()
                .last()
                .and_then(|n| n.parse().ok())
                .expect("MSG length");
            let mut body = vec![0; len + 2];
            self.input.read_exact(&mut body).expect("read the ack");
            let ack: serde_json::Value =
                serde_json::from_slice(&body[..len]).expect("the ack is JSON");
            return ack["seq"]
                .as_u64()
                .unwrap_or_else(|| panic!("the stream stored the record: {ack}"));
        }
    }
}

/// What becomes of a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Dead-lettered `Rejected`.
    Rejected,
    /// Handed to the handler (the client library made the header readable).
    Handled,
}

/// One foreign record: its header block and the topic under the stream's subject
/// namespace it is written to.
struct Shape {
    header: &'static [u8],
    topic: &'static str,
    fate: Fate,
}

const fn rejected(header: &'static [u8]) -> Shape {
    Shape {
        header,
        topic: TOPIC,
        fate: Fate::Rejected,
    }
}

fn options(url: &str) -> ConnectOptions {
    ConnectOptions::new(url)
        .connect_timeout(Duration::from_secs(5))
        .request_timeout(Duration::from_secs(5))
}

fn text(m: &Message) -> String {
    String::from_utf8_lossy(m.payload()).into_owned()
}

fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !f() {
        assert!(Instant::now() < deadline, "not within {PATIENCE:?}: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// R-SEC-2, R-DEL-6: the record `shape` describes, written between two tidings messages,
/// is dead-lettered with a reason of kind `Rejected` (or handled), the messages around it
/// are handled, publishing and listing the DLQ work afterwards, and every stored record is
/// accounted for: handled, or dead-lettered and counted.
fn check(shape: &Shape) {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let url = server.url();
    let backend = JetStreamBackend::builder()
        // Short, so that what the server hands out again comes back within the test.
        .ack_wait(Duration::from_secs(2))
        .max_deliveries(5)
        .connect(options(&url))
        .expect("connects");
    let b = Broker::builder()
        .driver(Driver::Thread)
        .durable_backend(Arc::new(backend) as Arc<dyn DurableBackend>)
        .build()
        .expect("valid configuration");
    b.create_stream(StreamConfig::new(STREAM, ["foreign.#"]))
        .expect("stream");
    let got: Arc<Mutex<Vec<String>>> = Arc::default();
    let g = Arc::clone(&got);
    let sub = b
        .subscribe(
            DurableSpec::new(STREAM).name("d").filter("foreign.#"),
            SubscribeOptions::default(),
            move |m: &Message| {
                g.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(text(m));
                Ok::<(), HandlerError>(())
            },
        )
        .expect("subscribes");
    let handled = || got.lock().unwrap_or_else(PoisonError::into_inner).clone();
    b.publish(Message::to(TOPIC).payload("before"))
        .expect("publish");
    let mut raw = Raw::connect(&url);
    let subject = tidings_jetstream::record_subject(STREAM, shape.topic);
    let poison = raw.publish(&subject, shape.header, b"poison");
    b.publish(Message::to(TOPIC).payload("after"))
        .expect("publish after the foreign record");
    let mut want = vec!["before", "after"];
    if shape.fate == Fate::Handled {
        want.insert(1, "poison");
    }
    until("the messages around the foreign record handled", || {
        let mut h = handled();
        h.sort();
        let mut w = want.clone();
        w.sort_unstable();
        h == w
    });
    let mut dead: Vec<DurableDeadLetter> = Vec::new();
    if shape.fate == Fate::Rejected {
        until("the foreign record dead-lettered", || {
            dead = sub.durable_dead_letters().expect("lists the DLQ");
            !dead.is_empty()
        });
        assert_eq!(dead.len(), 1, "{dead:?}");
        assert!(
            matches!(&dead[0].reason, DeadLetterReason::Rejected { error } if !error.is_empty()),
            "dead-lettered with a reason: {:?}",
            dead[0].reason
        );
        assert_eq!(dead[0].message.offset(), Some(poison), "the record itself");
        assert_eq!(text(&dead[0].message), "poison");
    }
    assert_eq!(sub.error(), None, "the subscription goes on");
    // The connection goes on: a publish is stored and handled, the DLQ can be listed.
    b.publish(Message::to(TOPIC).payload("later"))
        .expect("publish after the foreign record was dealt with");
    until("a message published afterwards handled", || {
        handled().iter().any(|p| p == "later")
    });
    let listed = sub
        .durable_dead_letters()
        .expect("lists the DLQ afterwards");
    assert_eq!(listed.len(), dead.len(), "{listed:?}");
    // R-DEL-6: every stored record finished — handled, or dead-lettered and counted.
    until("every stored record finished", || {
        let s = sub.state();
        s.lag == 0 && s.outstanding == 0
    });
    let state = sub.state();
    let stored = 4;
    assert_eq!(
        handled().len() + listed.len(),
        stored,
        "handled {:?}, dead {listed:?}",
        handled()
    );
    assert_eq!(
        state.skipped_by_filter,
        listed.len() as u64,
        "a dead-lettered foreign record is counted"
    );
    assert_eq!(state.error, None);
    b.close(Duration::from_secs(10));
}

/// R-SEC-2: a multi-byte character at an even byte offset of the hex key (the decoder
/// sliced inside it and panicked on the feeder thread).
#[test]
fn a_key_with_a_multibyte_character_is_dead_lettered() {
    check(&rejected("NATS/1.0\r\ntidings-key: ✓a\r\n\r\n".as_bytes()));
}

/// R-SEC-2: a key that is not hex, a multi-byte character on an odd boundary.
#[test]
fn a_key_that_is_not_hex_is_dead_lettered() {
    check(&rejected("NATS/1.0\r\ntidings-key: abé\r\n\r\n".as_bytes()));
}

/// R-SEC-2: a lone CR inside a header value of ours (it panicked the client's connection
/// task: every publish after it failed). The client reads it as a space; the key is then
/// no hex.
#[test]
fn a_lone_cr_in_a_tidings_header_is_dead_lettered() {
    check(&rejected(b"NATS/1.0\r\ntidings-key: 0\r1\r\n\r\n"));
}

/// R-SEC-2: a lone CR inside a header that is not ours: the client reads it as a space
/// and the record is a foreign message like any other.
#[test]
fn a_lone_cr_in_a_foreign_header_is_handled() {
    check(&Shape {
        header: b"NATS/1.0\r\nx-foreign: a\rb\r\n\r\n",
        topic: TOPIC,
        fate: Fate::Handled,
    });
}

/// R-SEC-2: a header value that is not UTF-8.
#[test]
fn a_value_that_is_not_utf8_is_dead_lettered() {
    check(&rejected(b"NATS/1.0\r\nx-foreign: \xff\xfe\r\n\r\n"));
}

/// R-SEC-2: a header name that is not UTF-8.
#[test]
fn a_name_that_is_not_utf8_is_dead_lettered() {
    check(&rejected(b"NATS/1.0\r\nx-\xff: v\r\n\r\n"));
}

/// R-SEC-2: a header line without a colon.
#[test]
fn a_header_line_without_a_colon_is_dead_lettered() {
    check(&rejected(b"NATS/1.0\r\nno-colon-here\r\n\r\n"));
}

/// R-SEC-2: a lone LF inside a header value.
#[test]
fn a_lone_lf_in_a_value_is_dead_lettered() {
    check(&rejected(b"NATS/1.0\r\nx-foreign: a\nb\r\n\r\n"));
}

/// R-SEC-2: a control byte in a header name.
#[test]
fn a_control_byte_in_a_name_is_dead_lettered() {
    check(&rejected(b"NATS/1.0\r\nx\x01y: v\r\n\r\n"));
}

/// R-SEC-2: a version line other than `NATS/1.0`.
#[test]
fn another_header_version_is_dead_lettered() {
    check(&rejected(b"NATS/2.0\r\nx-foreign: v\r\n\r\n"));
}

/// R-DEL-6: a record in the stream's subject namespace whose subject is not a tidings
/// topic is dead-lettered `Rejected`, not acknowledged and only counted.
#[test]
fn a_subject_that_is_not_a_topic_is_dead_lettered() {
    check(&Shape {
        header: b"NATS/1.0\r\nx-foreign: v\r\n\r\n",
        topic: "foreign.#",
        fate: Fate::Rejected,
    });
}

/// A record whose version line carries a status, as a foreign producer may store it.
const fn with_status(header: &'static [u8]) -> Shape {
    Shape {
        header,
        topic: TOPIC,
        fate: Fate::Handled,
    }
}

/// R-SEC-2: a version line with a status the client would take for an error of the pull
/// (the server hands the record out as a plain message: it is handled).
#[test]
fn a_record_with_an_error_status_is_handled() {
    check(&with_status(b"NATS/1.0 503\r\n\r\n"));
}

/// R-SEC-2: a version line with the status that ends a pull (`404 No Messages`): handled,
/// and nothing behind it is lost.
#[test]
fn a_record_with_an_end_of_pull_status_is_handled() {
    check(&with_status(b"NATS/1.0 404 No Messages\r\n\r\n"));
}

/// R-SEC-2: a version line with a status that is not a number.
#[test]
fn a_record_with_a_status_that_is_no_number_is_handled() {
    check(&with_status(b"NATS/1.0 abc def\r\n\r\n"));
}

/// R-SEC-2 (issue 34's leftovers): the DLQ is listed through the stream's message-get API
/// on the main connection, whose JSON answer never meets the client's header parser on
/// the connection: a record a foreign producer wrote into a durable subscription's DLQ
/// subject — a header block the client refuses (not UTF-8), or one it reads (a lone CR)
/// that is no dead letter — makes listing and draining refuse with kind `Corrupt`, never
/// `Unavailable` (which reads as "the server is away, retry"; it did before), and costs
/// nothing else: publishes after it are stored and handled on the same connection, the
/// subscription has no error.
#[test]
fn a_foreign_record_in_the_dlq_is_refused_as_corrupt_and_the_connection_goes_on() {
    for header in [
        &b"NATS/1.0\r\nx-foreign: \xff\xfe\r\n\r\n"[..],
        &b"NATS/1.0\r\nx-foreign: a\rb\r\n\r\n"[..],
    ] {
        let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
            return;
        };
        let url = server.url();
        let backend = JetStreamBackend::builder()
            .connect(options(&url))
            .expect("connects");
        let b = Broker::builder()
            .driver(Driver::Thread)
            .durable_backend(Arc::new(backend) as Arc<dyn DurableBackend>)
            .build()
            .expect("valid configuration");
        b.create_stream(StreamConfig::new(STREAM, ["foreign.#"]))
            .expect("stream");
        let got: Arc<Mutex<Vec<String>>> = Arc::default();
        let g = Arc::clone(&got);
        let sub = b
            .subscribe(
                DurableSpec::new(STREAM).name("d").filter("foreign.#"),
                SubscribeOptions::default(),
                move |m: &Message| {
                    g.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(text(m));
                    Ok::<(), HandlerError>(())
                },
            )
            .expect("subscribes");
        let handled = || got.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let mut raw = Raw::connect(&url);
        // The DLQ of durable `d` on stream `foreign` (docs: "Names").
        let at = raw.publish("$TIDINGS.dlq.foreign.d", header, b"poison");
        for what in ["listing", "draining"] {
            let err = if what == "listing" {
                sub.durable_dead_letters()
                    .expect_err("a foreign DLQ record")
            } else {
                sub.drain_durable_dead_letters()
                    .expect_err("a foreign DLQ record")
            };
            assert_eq!(
                err.kind(),
                tidings::StreamErrorKind::Corrupt,
                "{what} a DLQ holding a foreign record at {at}: {err}"
            );
        }
        // The connection goes on: a publish is stored and handled.
        b.publish(Message::to(TOPIC).payload("after"))
            .expect("publish after listing");
        until("a message published afterwards handled", || {
            handled().iter().any(|p| p == "after")
        });
        assert_eq!(sub.error(), None, "the subscription goes on");
        b.close(Duration::from_secs(10));
    }
}

/// Fetches from `cursor` until a message comes (bounded by [`PATIENCE`]).
fn fetch_one(cursor: &dyn tidings::durable::BackendCursor, what: &str) -> Message {
    let mut got = Vec::new();
    until(what, || {
        got = cursor.fetch(1).expect("fetch");
        !got.is_empty()
    });
    got.remove(0)
}

/// R-SEC-2, R-DEL-6 (issue 34's leftovers): a message that comes back unfinished is handed
/// out only after its handler starts are read and counted on the main connection (the
/// subject `$TIDINGS.start.<stream>.<durable>.<offset>`, docs: "Names"). A foreign record
/// there whose header block the client refuses read as "server away" before, so the
/// message was held back, and everything behind it, retried at every wake, forever. It now
/// reads as no count (the next count written replaces it), and the message is handed out.
#[test]
fn a_foreign_record_on_a_start_count_does_not_hold_back_a_returned_message() {
    use tidings::durable::{CursorSpec, CursorWaker};
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let url = server.url();
    let backend = JetStreamBackend::connect(options(&url)).expect("connects");
    let pattern = tidings::Pattern::new("foreign.#").expect("pattern");
    let stream = backend
        .open_stream(
            &StreamConfig::new(STREAM, ["foreign.#"]),
            std::slice::from_ref(&pattern),
        )
        .expect("stream");
    let offset = stream
        .append(
            &Message::to(TOPIC)
                .payload("returned")
                .build_detached()
                .expect("message"),
        )
        .expect("append")
        .offset;
    let open = || {
        stream
            .open_cursor(CursorSpec::new(
                "d",
                &pattern,
                tidings::StartAt::Earliest,
                16,
                CursorWaker::new(|| {}),
            ))
            .expect("cursor opens")
    };
    // Handed out, never finished: the close gives it back, and it comes back returned.
    let first = open();
    assert_eq!(text(&fetch_one(&*first, "the first delivery")), "returned");
    first.close();
    let mut raw = Raw::connect(&url);
    raw.publish(
        &format!("$TIDINGS.start.{STREAM}.d.{offset}"),
        b"NATS/1.0\r\nx-foreign: \xff\xfe\r\n\r\n",
        b"7",
    );
    let second = open();
    let again = fetch_one(&*second, "the returned message handed out again");
    assert_eq!(
        (text(&again), again.offset()),
        ("returned".to_owned(), Some(offset))
    );
    assert_eq!(second.state().error, None, "the subscription goes on");
    second.close();
}
