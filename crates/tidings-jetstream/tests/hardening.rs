//! The JetStream backend under what a demanding user does (issue 25), against a real
//! `nats-server` (started by the testkit launcher, which installs a missing binary; skipped,
//! with a notice, only under `TIDINGS_SKIP_NATS=1`): a transport sharing the server, a dead
//! letter too large for the server, processes that abort or restart while holding a
//! backlog, a seek made by another process, and records written by a foreign producer.
//!
//! The abort test starts this test binary again with [`ROLE_ENV`] set, so the child runs
//! only [`child_aborting_consumer`]; every server and child is stopped when its test ends.

use std::collections::BTreeSet;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tidings::durable::DurableBackend;
use tidings::{
    Broker, DeadLetterReason, Driver, DurableSpec, HandlerError, Message, Pattern, StartAt,
    StreamConfig, SubscribeOptions,
};
use tidings_jetstream::{ConnectOptions, JetStreamBackend, NatsTransport};
use tidings_testkit::child::{self, ScratchDir, TestChild};
use tidings_testkit::nats::{NatsServer, NatsServerOptions};

/// Generous bound on every wait (never asserted as a speed).
const PATIENCE: Duration = Duration::from_secs(60);

const ROLE_ENV: &str = "TIDINGS_HARDENING_ROLE";
const URL_ENV: &str = "TIDINGS_HARDENING_URL";
const OUT_ENV: &str = "TIDINGS_HARDENING_OUT";
const DIR_ENV: &str = "TIDINGS_HARDENING_DIR";

fn options(url: &str) -> ConnectOptions {
    ConnectOptions::new(url)
        .connect_timeout(Duration::from_secs(5))
        .request_timeout(Duration::from_secs(5))
}

fn backend(url: &str, ack_wait: Duration, max_deliveries: u32) -> JetStreamBackend {
    JetStreamBackend::builder()
        .ack_wait(ack_wait)
        .max_deliveries(max_deliveries)
        .connect(options(url))
        .expect("connects")
}

fn broker(backend: JetStreamBackend) -> Broker {
    Broker::builder()
        .driver(Driver::Thread)
        .durable_backend(Arc::new(backend) as Arc<dyn DurableBackend>)
        .build()
        .expect("valid configuration")
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

type Seen = Arc<Mutex<Vec<String>>>;

fn seen(s: &Seen) -> Vec<String> {
    s.lock().unwrap_or_else(PoisonError::into_inner).clone()
}

/// R-RT-1, R-LOG-5: a stream holds exactly what its patterns match, even when a transport
/// on the same server sends buffered-only topics its NATS subjects would have captured.
#[test]
fn a_transport_on_the_same_server_adds_nothing_to_a_stream() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let transport = NatsTransport::connect(options(&server.url())).expect("connects");
    let b = Broker::builder()
        .driver(Driver::Thread)
        .durable_backend(
            Arc::new(backend(&server.url(), Duration::from_secs(30), 5)) as Arc<dyn DurableBackend>
        )
        .transport(Arc::new(transport))
        .build()
        .expect("valid configuration");
    b.create_stream(StreamConfig::new("w", ["w.#.a"]))
        .expect("stream");
    let got: Seen = Arc::default();
    let g = Arc::clone(&got);
    let sub = b
        .subscribe(
            DurableSpec::new("w").name("all").filter("#"),
            SubscribeOptions::default(),
            move |m: &Message| {
                g.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(m.topic().as_str().to_owned());
                Ok::<(), HandlerError>(())
            },
        )
        .expect("subscribes");
    // Buffered only: no pattern of `w` matches them.
    b.publish(Message::to("w.q").payload("1")).expect("publish");
    b.publish(Message::to("w.a.b").payload("2"))
        .expect("publish");
    // Durable: `w.#.a` matches.
    b.publish(Message::to("w.x.a").payload("3"))
        .expect("publish");
    until("the durable message delivered and nothing left", || {
        seen(&got).contains(&"w.x.a".to_owned()) && sub.lag() == 0
    });
    assert_eq!(
        seen(&got),
        ["w.x.a"],
        "a subscriber got what no pattern matches"
    );
    let pattern = Pattern::new("w.#.a").expect("valid");
    for topic in seen(&got) {
        assert!(pattern.matches(&tidings::Topic::new(&topic).expect("topic")));
    }
    b.close(Duration::from_secs(10));
}

/// R-DEL-4, R-DEL-6: a dead letter larger than the server's `max_payload` (the message fits,
/// the copy with its DLQ metadata does not) is still recorded, and the subscription goes on.
#[test]
fn a_dead_letter_larger_than_max_payload_is_recorded_and_the_subscription_goes_on() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new().max_payload(8192)) else {
        return;
    };
    let b = broker(backend(&server.url(), Duration::from_secs(1), 2));
    b.create_stream(StreamConfig::new("big", ["big.#"]))
        .expect("stream");
    let got: Seen = Arc::default();
    let g = Arc::clone(&got);
    let reason = "x".repeat(600);
    let sub = b
        .subscribe(
            DurableSpec::new("big").name("d").filter("big.#"),
            SubscribeOptions::default(),
            move |m: &Message| {
                let p = text(m);
                if p.starts_with("huge") {
                    return Err(HandlerError::reject(reason.clone()));
                }
                g.lock().unwrap_or_else(PoisonError::into_inner).push(p);
                Ok(())
            },
        )
        .expect("subscribes");
    // Fits with its own headers (about 220 bytes; 170 bytes to spare); its DLQ copy, with
    // the 600-byte reason, does not.
    let huge = format!("huge{}", "h".repeat(7800));
    b.publish(Message::to("big.one").payload(huge.clone()))
        .expect("the message itself fits");
    b.publish(Message::to("big.two").payload("after"))
        .expect("publish");
    until("the message behind the dead letter delivered", || {
        seen(&got) == ["after"]
    });
    until("the dead letter recorded", || {
        sub.durable_dead_letters().expect("reads the DLQ").len() == 1
    });
    let dead = sub.durable_dead_letters().expect("reads the DLQ");
    assert_eq!(text(&dead[0].message), huge, "the dead message, in full");
    assert!(
        matches!(&dead[0].reason, DeadLetterReason::Rejected { error } if error.starts_with("xxx")),
        "{:?}",
        dead[0].reason
    );
    assert_eq!(sub.error(), None);
    b.close(Duration::from_secs(10));
}

/// R-DEL-6, R-DIST-1: closing and reopening a broker with a backlog never dead-letters what
/// no handler started: only a handler start counts toward `max_deliveries`.
///
/// A backlog of 200 messages, fetched ahead at every open as far as the backend lets it
/// (all of it while nothing came back; the backend hands a returned message out alone);
/// each of six rounds (twice `max_deliveries` = 3) handles about three messages slowly and
/// closes without draining, so what was fetched goes back to the server unhandled at every
/// close. When each fetch counted as a delivery, round four dead-lettered the whole rest of
/// the backlog unhandled (issue 25 defect 4).
#[test]
fn graceful_restarts_dead_letter_nothing() {
    const BACKLOG: usize = 200;
    const MAX_DELIVERIES: u32 = 3;
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let url = server.url();
    {
        let b = broker(backend(&url, Duration::from_secs(30), MAX_DELIVERIES));
        b.create_stream(StreamConfig::new("backlog", ["backlog.#"]))
            .expect("stream");
        for i in 0..BACKLOG {
            b.publish(Message::to("backlog.m").payload(format!("{i}")))
                .expect("publish");
        }
        b.close(Duration::from_secs(10));
    }
    let handled: Seen = Arc::default();
    let distinct = |h: &Seen| seen(h).into_iter().collect::<BTreeSet<String>>().len();
    // One open: handles `stop_at` messages (or until nothing is left), then closes without
    // draining. Returns (handled in this round, outstanding at close, dead letters so far).
    let round = |stop_at: Option<usize>| {
        let b = broker(backend(&url, Duration::from_secs(30), MAX_DELIVERIES));
        b.create_stream(StreamConfig::new("backlog", ["backlog.#"]))
            .expect("stream");
        let before = seen(&handled).len();
        let h = Arc::clone(&handled);
        let sub = b
            .subscribe(
                DurableSpec::new("backlog").name("slow").filter("backlog.#"),
                SubscribeOptions::default(),
                move |m: &Message| {
                    std::thread::sleep(Duration::from_millis(50));
                    h.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(text(m));
                    Ok::<(), HandlerError>(())
                },
            )
            .expect("subscribes");
        until("the round's handling or the end of the backlog", || {
            let now = seen(&handled).len() - before;
            let finished = sub.lag() == 0 && sub.outstanding() == 0;
            finished || stop_at.is_some_and(|n| now >= n)
        });
        let outstanding = sub.outstanding();
        let dead = sub.durable_dead_letters().expect("reads the DLQ").len();
        // No drain: what is queued goes back to the server unhandled.
        b.close(Duration::ZERO);
        (seen(&handled).len() - before, outstanding, dead)
    };
    let mut rounds = Vec::new();
    for _ in 0..2 * MAX_DELIVERIES {
        rounds.push(round(Some(3)));
    }
    let last = round(None);
    println!("rounds (handled, outstanding at close, dead letters): {rounds:?}; last {last:?}");
    let dead: Vec<usize> = rounds.iter().chain([&last]).map(|r| r.2).collect();
    assert!(
        dead.iter().all(|&d| d == 0),
        "dead-lettered (handled, outstanding, dead) per round: {rounds:?}, last {last:?}"
    );
    assert_eq!(distinct(&handled), BACKLOG, "every message handled");
}

/// R-DIST-3: a seek made by one process does not stop another process sharing the durable
/// name while a publisher keeps publishing: it rebinds to the consumer the seek created.
#[test]
fn a_seek_elsewhere_does_not_stop_a_process_sharing_the_name() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let url = server.url();
    let open = |got: &Seen| {
        let b = broker(backend(&url, Duration::from_secs(30), 5));
        b.create_stream(StreamConfig::new("live", ["live.#"]))
            .expect("stream");
        let g = Arc::clone(got);
        let sub = b
            .subscribe(
                DurableSpec::new("live").name("shared").filter("live.#"),
                SubscribeOptions::default(),
                move |m: &Message| {
                    g.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(text(m));
                    Ok::<(), HandlerError>(())
                },
            )
            .expect("subscribes");
        (b, sub)
    };
    let (got_a, got_b): (Seen, Seen) = (Arc::default(), Arc::default());
    let (a, sub_a) = open(&got_a);
    let (b, sub_b) = open(&got_b);
    let publisher = broker(backend(&url, Duration::from_secs(30), 5));
    publisher
        .create_stream(StreamConfig::new("live", ["live.#"]))
        .expect("stream");
    let stop = Arc::new(AtomicBool::new(false));
    let published = Arc::new(AtomicU64::new(0));
    let (s, n) = (Arc::clone(&stop), Arc::clone(&published));
    let publishing = std::thread::spawn(move || {
        while !s.load(Ordering::Relaxed) {
            let i = n.fetch_add(1, Ordering::Relaxed);
            publisher
                .publish(Message::to("live.m").payload(format!("{i}")))
                .expect("publish");
            std::thread::sleep(Duration::from_millis(5));
        }
        publisher.close(Duration::from_secs(10));
    });
    until("both processes receive", || {
        !seen(&got_a).is_empty() && !seen(&got_b).is_empty()
    });
    sub_a.seek(StartAt::Latest).expect("seek");
    let after = published.load(Ordering::Relaxed);
    // B goes on receiving what is published after the seek.
    until("the other process receives after the seek", || {
        seen(&got_b)
            .iter()
            .filter(|p| p.parse::<u64>().expect("index") > after + 20)
            .count()
            >= 5
    });
    assert_eq!(sub_b.error(), None);
    assert_eq!(sub_a.error(), None);
    stop.store(true, Ordering::Relaxed);
    publishing.join().expect("publisher");
    a.close(Duration::from_secs(10));
    b.close(Duration::from_secs(10));
}

/// R-DEL-4, R-DIST-1: a record a foreign producer wrote that is not a tidings message is
/// dead-lettered `Rejected` with a reason naming the field; the subscription goes on.
#[test]
fn a_foreign_record_that_does_not_decode_is_dead_lettered_and_skipped() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let url = server.url();
    let b = broker(backend(&url, Duration::from_secs(30), 5));
    b.create_stream(StreamConfig::new("mixed", ["mixed.#"]))
        .expect("stream");
    let got: Seen = Arc::default();
    let g = Arc::clone(&got);
    let sub = b
        .subscribe(
            DurableSpec::new("mixed").name("d").filter("mixed.#"),
            SubscribeOptions::default(),
            move |m: &Message| {
                g.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(text(m));
                Ok::<(), HandlerError>(())
            },
        )
        .expect("subscribes");
    b.publish(Message::to("mixed.a").payload("before"))
        .expect("publish");
    // A foreign producer: a `tidings-ts` header that is not a number.
    let subject = tidings_jetstream::record_subject("mixed", "mixed.a");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let client = async_nats::connect(url.as_str()).await.expect("connects");
        let js = async_nats::jetstream::new(client);
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("tidings-ts", "yesterday");
        js.publish_with_headers(subject, headers, "foreign".into())
            .await
            .expect("publish")
            .await
            .expect("stored");
    });
    b.publish(Message::to("mixed.a").payload("after"))
        .expect("publish");
    until("the message behind the foreign record delivered", || {
        seen(&got) == ["before", "after"]
    });
    let dead = sub.durable_dead_letters().expect("reads the DLQ");
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(text(&dead[0].message), "foreign");
    assert!(
        matches!(&dead[0].reason, DeadLetterReason::Rejected { error } if error.contains("tidings-ts")),
        "{:?}",
        dead[0].reason
    );
    assert_eq!(sub.error(), None);
    assert!(sub.state().skipped_by_filter >= 1, "counted");
    b.close(Duration::from_secs(10));
}

const POISON_STREAM: &str = "poison";
const POISON_DURABLE: &str = "workers";
const INNOCENT: usize = 20;

/// The child role: handles `poison` durably and aborts the process on the message
/// `poison`; notes every other message it handled in its output file, one line each.
#[test]
#[ignore = "entry point of the child processes a_message_that_kills_its_process starts"]
fn child_aborting_consumer() {
    if std::env::var_os(ROLE_ENV).is_none() {
        return;
    }
    let var = |name| std::env::var(name).unwrap_or_else(|_| panic!("{name} is set"));
    let dir = PathBuf::from(var(DIR_ENV));
    let out = Arc::new(Mutex::new(
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(var(OUT_ENV))
            .expect("open the output file"),
    ));
    let b = broker(backend(&var(URL_ENV), Duration::from_secs(2), 3));
    b.create_stream(StreamConfig::new(POISON_STREAM, ["poison.#"]))
        .expect("stream");
    let _sub = b
        .subscribe(
            DurableSpec::new(POISON_STREAM)
                .name(POISON_DURABLE)
                .filter("poison.#"),
            SubscribeOptions::default(),
            move |m: &Message| {
                let p = text(m);
                if p == "poison" {
                    std::process::abort();
                }
                let mut f = out.lock().unwrap_or_else(PoisonError::into_inner);
                f.write_all(format!("{p}\n").as_bytes()).expect("write");
                Ok::<(), HandlerError>(())
            },
        )
        .expect("subscribes");
    let deadline = Instant::now() + PATIENCE * 4;
    while !dir.join("stop").exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    b.close(Duration::from_secs(10));
}

fn handled(path: &Path) -> BTreeSet<String> {
    child::complete_lines(path).into_iter().collect()
}

/// R-DEL-6: a message that aborts every process it reaches is dead-lettered after
/// `max_deliveries` handler starts, and none of the messages fetched behind it is.
#[test]
fn a_message_that_kills_its_process_dead_letters_only_itself() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let url = server.url();
    let scratch = ScratchDir::new("hardening");
    let dir = scratch.path();
    let out = dir.join("handled");
    {
        let b = broker(backend(&url, Duration::from_secs(2), 3));
        b.create_stream(StreamConfig::new(POISON_STREAM, ["poison.#"]))
            .expect("stream");
        b.publish(Message::to("poison.m").payload("poison"))
            .expect("publish");
        for i in 0..INNOCENT {
            b.publish(Message::to("poison.m").payload(format!("ok-{i}")))
                .expect("publish");
        }
        b.close(Duration::from_secs(10));
    }
    let spawn = || {
        TestChild::spawn(
            "child_aborting_consumer",
            [
                (ROLE_ENV, "consumer".to_owned()),
                (URL_ENV, url.clone()),
                (OUT_ENV, out.display().to_string()),
                (DIR_ENV, dir.display().to_string()),
            ],
        )
    };
    // Children abort one after the other until one handles every innocent message (or a
    // bounded number of them tried).
    let deadline = Instant::now() + PATIENCE * 3;
    let mut aborted = 0;
    loop {
        let mut child = spawn();
        let status = loop {
            if let Some(status) = child.exited() {
                break Some(status);
            }
            if handled(&out).len() == INNOCENT || Instant::now() > deadline {
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        match status {
            Some(status) => {
                assert!(!status.success(), "a child exited on its own");
                aborted += 1;
                assert!(aborted <= 10, "the poison message kept killing processes");
            }
            None => {
                fs::write(dir.join("stop"), b"").expect("stop file");
                child.wait_success(PATIENCE);
                break;
            }
        }
    }
    // The DLQ, read through the same durable name once no child runs.
    let b = broker(backend(&url, Duration::from_secs(2), 3));
    b.create_stream(StreamConfig::new(POISON_STREAM, ["poison.#"]))
        .expect("stream");
    let sub = b
        .subscribe(
            DurableSpec::new(POISON_STREAM)
                .name(POISON_DURABLE)
                .filter("poison.#"),
            SubscribeOptions::default(),
            |_: &Message| Ok::<(), HandlerError>(()),
        )
        .expect("subscribes");
    let dead: Vec<String> = sub
        .durable_dead_letters()
        .expect("reads the DLQ")
        .iter()
        .map(|d| text(&d.message))
        .collect();
    b.close(Duration::from_secs(10));
    let innocent = handled(&out).len();
    assert_eq!(
        dead,
        ["poison"],
        "only the message that killed its processes"
    );
    assert!(
        aborted >= 2,
        "the poison message was retried ({aborted} aborts)"
    );
    assert_eq!(innocent, INNOCENT, "every innocent message handled");
}
