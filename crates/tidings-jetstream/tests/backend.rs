//! `JetStreamBackend` through the durable-source seam, against a real `nats-server`
//! (started by the testkit launcher, which installs a missing binary; skipped, with a notice,
//! only under `TIDINGS_SKIP_NATS=1`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tidings::durable::{
    Appended, BackendCursor, BackendStream, CursorSpec, CursorWaker, DurableBackend, Finished,
    Outcome,
};
use tidings::{
    Broker, DeadLetterReason, Driver, Message, Pattern, Priority, Retention, StartAt, StreamConfig,
    StreamError, StreamErrorKind,
};
use tidings_jetstream::{ConnectOptions, JetStreamBackend, JetStreamError};
use tidings_testkit::nats::{NatsServer, NatsServerOptions};

/// Generous bound for waits on the server (never asserted as a speed).
const PATIENCE: Duration = Duration::from_secs(30);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

fn options(server: &NatsServer) -> ConnectOptions {
    ConnectOptions::new(server.url())
        .connect_timeout(Duration::from_secs(2))
        .request_timeout(REQUEST_TIMEOUT)
}

fn backend(server: &NatsServer) -> JetStreamBackend {
    JetStreamBackend::connect(options(server)).expect("connects")
}

fn p(s: &str) -> Pattern {
    Pattern::new(s).expect("valid pattern")
}

fn stream(b: &JetStreamBackend, name: &str, patterns: &[&str]) -> Arc<dyn BackendStream> {
    let ps: Vec<Pattern> = patterns.iter().map(|s| p(s)).collect();
    b.open_stream(&StreamConfig::new(name, patterns.iter().copied()), &ps)
        .expect("stream opens")
}

fn msg(topic: &str, payload: &str) -> Message {
    Message::to(topic)
        .payload(payload.to_owned())
        .build_detached()
        .expect("valid message")
}

struct Opened {
    cursor: Box<dyn BackendCursor>,
    wakes: Arc<AtomicUsize>,
}

fn cursor(
    s: &dyn BackendStream,
    name: &str,
    filter: &str,
    start: StartAt,
    window: usize,
) -> Opened {
    let wakes = Arc::new(AtomicUsize::new(0));
    let w = Arc::clone(&wakes);
    let filter = p(filter);
    let waker = CursorWaker::new(move || {
        w.fetch_add(1, Ordering::Relaxed);
    });
    let cursor = s
        .open_cursor(CursorSpec::new(name, &filter, start, window, waker))
        .expect("cursor opens");
    Opened { cursor, wakes }
}

/// Fetches until `n` messages came (bounded by [`PATIENCE`]).
fn fetch_n(c: &dyn BackendCursor, n: usize) -> Vec<Message> {
    let deadline = Instant::now() + PATIENCE;
    let mut out = Vec::new();
    while out.len() < n {
        assert!(Instant::now() < deadline, "only {} of {n} came", out.len());
        let got = c.fetch(n - out.len()).expect("fetch");
        if got.is_empty() {
            std::thread::sleep(Duration::from_millis(20));
        }
        out.extend(got);
    }
    out
}

/// Nothing more comes within `quiet`.
fn assert_quiet(c: &dyn BackendCursor, quiet: Duration) {
    let end = Instant::now() + quiet;
    while Instant::now() < end {
        let got = c.fetch(10).expect("fetch");
        assert!(got.is_empty(), "unexpected: {:?}", payloads(&got));
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn payloads(ms: &[Message]) -> Vec<String> {
    ms.iter()
        .map(|m| String::from_utf8_lossy(m.payload()).into_owned())
        .collect()
}

fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn finished(m: &Message, outcome: Outcome) -> Finished {
    Finished::new(Arc::new(m.clone()), outcome)
}

#[test]
fn outcomes_dead_letters_with_reasons_and_every_field() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let b = backend(&server);
    // R-DIST-2: the backend says what it cannot do; offsets start at 1.
    let caps = b.capabilities();
    assert!(!caps.priority);
    assert_eq!(caps.first_offset, 1);
    let s = stream(&b, "orders", &["orders.#"]);
    let full = Message::to("orders.created")
        .payload("p")
        .header("h", "v")
        .header("h", "second")
        .key("k-1")
        .ttl(Duration::from_secs(600))
        .delay(Duration::from_millis(1))
        .reply_to("replies.x")
        .correlation_id("c-1")
        .priority(Priority::Normal)
        .build_detached()
        .expect("valid");
    assert_eq!(s.append(&full).expect("append"), Appended::stored(1));
    // Dedup (R-DEL-7): the same message id is stored once (Nats-Msg-Id), and the append
    // says so.
    assert_eq!(
        s.append(&full).expect("append again"),
        Appended::duplicate_of(1)
    );
    for i in 1..5 {
        assert_eq!(
            s.append(&msg("orders.created", &format!("m{i}")))
                .unwrap()
                .offset,
            i + 1
        );
    }
    assert_eq!((s.start_offset(), s.end_offset()), (1, 6));
    assert_eq!(payloads(&s.read(2, 2).expect("read")), ["m1", "m2"]);
    assert!(matches!(s.read(9, 1), Err(StreamError::BeyondEnd { .. })));

    let c = cursor(&*s, "billing", "orders.#", StartAt::Earliest, 16);
    let got = fetch_n(&*c.cursor, 5);
    assert_eq!(payloads(&got), ["p", "m1", "m2", "m3", "m4"]);
    let offsets: Vec<Option<u64>> = got.iter().map(Message::offset).collect();
    assert_eq!(offsets, [Some(1), Some(2), Some(3), Some(4), Some(5)]);
    // R-CORE-4: every field travels.
    let m = &got[0];
    let mut want = full.to_parts();
    want.offset = Some(1);
    assert_eq!(m.to_parts(), want);
    assert_eq!(c.cursor.state().outstanding, 5);

    let rejected = DeadLetterReason::Rejected {
        error: "bad\ninput".into(),
    };
    let exhausted = DeadLetterReason::RetriesExhausted {
        attempts: 3,
        last_error: "boom".into(),
    };
    c.cursor
        .finish(&[
            finished(&got[0], Outcome::Delivered),
            finished(&got[1], Outcome::Filtered),
            finished(
                &got[2],
                Outcome::DeadLettered {
                    reason: rejected.clone(),
                    attempts: 1,
                },
            ),
            finished(
                &got[3],
                Outcome::DeadLettered {
                    reason: exhausted.clone(),
                    attempts: 3,
                },
            ),
            finished(
                &got[4],
                Outcome::DeadLettered {
                    reason: DeadLetterReason::Expired,
                    attempts: 0,
                },
            ),
        ])
        .expect("finish");
    // R-LOG-3: finished (dead-lettered included) is committed.
    until("the commit", || c.cursor.commit().ok() == Some(6));
    let st = c.cursor.state();
    assert_eq!((st.committed, st.lag, st.outstanding), (6, 0, 0));
    // R-DEL-4: the durable DLQ holds them with reasons, attempts and the message.
    let dead = c.cursor.dead_letters().expect("dead letters");
    let got: Vec<(String, DeadLetterReason, u32, Option<u64>)> = dead
        .iter()
        .map(|d| {
            (
                String::from_utf8_lossy(d.message.payload()).into_owned(),
                d.reason.clone(),
                d.attempts,
                d.message.offset(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("m2".to_owned(), rejected, 1, Some(3)),
            ("m3".to_owned(), exhausted, 3, Some(4)),
            ("m4".to_owned(), DeadLetterReason::Expired, 0, Some(5)),
        ]
    );
    // Nothing is redelivered: terminated and acknowledged.
    assert_quiet(&*c.cursor, Duration::from_millis(500));
    // A priority is carried (the broker refuses it on this backend; the codec keeps it).
    let urgent = Message::to("orders.x")
        .priority(Priority::Urgent)
        .build_detached()
        .expect("valid");
    let before = c.wakes.load(Ordering::Relaxed);
    s.append(&urgent).expect("append");
    // An append through the backend wakes the stream's cursors before it returns.
    assert!(c.wakes.load(Ordering::Relaxed) > before, "the waker fired");
    assert_eq!(fetch_n(&*c.cursor, 1)[0].priority(), Priority::Urgent);
    // A publish by another process wakes them too (seen on the subject), and so does the
    // periodic wake.
    let other = backend(&server);
    let s2 = stream(&other, "orders", &["orders.#"]);
    let before = c.wakes.load(Ordering::Relaxed);
    s2.append(&msg("orders.elsewhere", "x")).expect("append");
    until("woken by a publish elsewhere", || {
        c.wakes.load(Ordering::Relaxed) > before
    });
}

#[test]
fn redrive_targets_one_subscription_and_drain_empties() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let b = backend(&server);
    let s = stream(&b, "jobs", &["jobs.#"]);
    for i in 0..4 {
        s.append(&msg("jobs.run", &format!("j{i}")))
            .expect("append");
    }
    let c = cursor(&*s, "worker.a", "jobs.#", StartAt::Earliest, 8);
    let other = cursor(&*s, "worker_b", "jobs.#", StartAt::Earliest, 8);
    let got = fetch_n(&*c.cursor, 4);
    let dead = |m: &Message| {
        finished(
            m,
            Outcome::DeadLettered {
                reason: DeadLetterReason::Rejected { error: "no".into() },
                attempts: 1,
            },
        )
    };
    c.cursor
        .finish(&[
            dead(&got[0]),
            finished(&got[1], Outcome::Delivered),
            dead(&got[2]),
            dead(&got[3]),
        ])
        .expect("finish");
    let theirs = fetch_n(&*other.cursor, 4);
    other
        .cursor
        .finish(
            &theirs
                .iter()
                .map(|m| finished(m, Outcome::Delivered))
                .collect::<Vec<_>>(),
        )
        .expect("finish");
    // R-DEL-4: redrive the chosen entries; they leave the DLQ only once appended.
    let n = c
        .cursor
        .redrive_dead_letters(&mut |d| d.message.payload() != "j3")
        .expect("redrive");
    assert_eq!(n, 2);
    let left = c.cursor.dead_letters().expect("dlq");
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].message.payload(), "j3");
    let again = fetch_n(&*c.cursor, 2);
    assert_eq!(payloads(&again), ["j0", "j2"]);
    assert_eq!(again[0].id(), got[0].id(), "the same message, again");
    assert_eq!(again[0].offset(), Some(5), "appended anew");
    c.cursor
        .finish(
            &again
                .iter()
                .map(|m| finished(m, Outcome::Delivered))
                .collect::<Vec<_>>(),
        )
        .expect("finish");
    // The copies are for worker.a only: worker_b skips them (counted as filtered).
    until("worker_b skips both copies", || {
        let _ = other.cursor.fetch(10).expect("fetch");
        other.cursor.state().skipped_by_filter == 2
    });
    until("both caught up", || {
        c.cursor.state().lag == 0 && other.cursor.state().lag == 0
    });
    // R-DEL-4: drain returns what is left and empties the DLQ durably.
    let drained = c.cursor.drain_dead_letters().expect("drain");
    assert_eq!(
        payloads(&drained.into_iter().map(|d| d.message).collect::<Vec<_>>()),
        ["j3"]
    );
    assert!(c.cursor.dead_letters().expect("dlq").is_empty());
    c.cursor.close();
    let reopened = cursor(&*s, "worker.a", "jobs.#", StartAt::Earliest, 8);
    assert!(reopened.cursor.dead_letters().expect("dlq").is_empty());
    assert_quiet(&*reopened.cursor, Duration::from_millis(300));
}

#[test]
fn seek_lag_and_close_hands_over() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let b = backend(&server);
    let s = stream(&b, "log", &["log.*"]);
    for i in 0..10 {
        s.append(&msg("log.x", &format!("m{i}"))).expect("append");
    }
    let c = cursor(&*s, "reader", "log.*", StartAt::Offset(3), 4);
    // R-LOG-4: a new name starts where asked, committed at once.
    assert_eq!(c.cursor.commit().expect("commit"), 3);
    let got = fetch_n(&*c.cursor, 4);
    assert_eq!(payloads(&got), ["m2", "m3", "m4", "m5"]);
    // R-BP-3: lag counts the unfinished and the not yet fetched.
    assert_eq!(c.cursor.state().lag, 8);
    c.cursor
        .finish(&[finished(&got[0], Outcome::Delivered)])
        .expect("finish");
    until("lag 7", || c.cursor.state().lag == 7);
    // R-LOG-4: seek moves and commits; out of range is a typed error.
    assert_eq!(c.cursor.seek(StartAt::Offset(9)).expect("seek"), 9);
    assert_eq!(payloads(&fetch_n(&*c.cursor, 2)), ["m8", "m9"]);
    assert_eq!(c.cursor.seek(StartAt::Latest).expect("seek"), 11);
    assert!(matches!(
        c.cursor.seek(StartAt::Offset(99)),
        Err(StreamError::BeyondEnd {
            requested: 99,
            end: 11
        })
    ));
    assert_eq!(c.cursor.seek(StartAt::Earliest).expect("seek"), 1);
    let all = fetch_n(&*c.cursor, 4);
    assert_eq!(payloads(&all), ["m0", "m1", "m2", "m3"]);
    // Close hands what was fetched and not finished to the next holder at once.
    c.cursor.close();
    assert!(matches!(c.cursor.fetch(1), Err(StreamError::Closed)));
    // R-DEL-6: each came back unfinished, so each goes out alone, in stream order.
    let next = cursor(&*s, "reader", "log.*", StartAt::Earliest, 16);
    for expected in ["m0", "m1", "m2", "m3"] {
        let one = fetch_n(&*next.cursor, 1);
        assert_eq!(payloads(&one), [expected]);
        assert_quiet(&*next.cursor, Duration::from_millis(200));
        next.cursor
            .finish(&[finished(&one[0], Outcome::Delivered)])
            .expect("finish");
    }
    assert_eq!(
        payloads(&fetch_n(&*next.cursor, 6)),
        ["m4", "m5", "m6", "m7", "m8", "m9"]
    );
}

#[test]
fn keep_alive_holds_a_message_beyond_the_ack_wait() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let ack_wait = Duration::from_secs(1);
    let connect = || {
        JetStreamBackend::builder()
            .ack_wait(ack_wait)
            .connect(options(&server))
            .expect("connects")
    };
    // Two connections sharing one durable: two processes, as far as the server knows.
    let (one, two) = (connect(), connect());
    let s1 = stream(&one, "slow", &["slow"]);
    let s2 = stream(&two, "slow", &["slow"]);
    s1.append(&msg("slow", "long job")).expect("append");
    let a = cursor(&*s1, "shared", "slow", StartAt::Earliest, 1);
    let held = fetch_n(&*a.cursor, 1);
    let b = cursor(&*s2, "shared", "slow", StartAt::Earliest, 1);
    // R-ORD-1: retry in place takes longer than the ack wait; nobody else gets it.
    assert_quiet(&*b.cursor, ack_wait * 4);
    a.cursor
        .finish(&[finished(&held[0], Outcome::Delivered)])
        .expect("finish");
    until("acknowledged", || b.cursor.state().lag == 0);
    assert_quiet(&*b.cursor, Duration::from_millis(300));
}

#[test]
fn rabbitmq_wildcards_through_jetstream() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let b = backend(&server);
    let s = stream(&b, "wild", &["a.#"]);
    for t in ["a", "a.x", "a.x.b", "a.b", "a.b.c", "a.y.z.b"] {
        s.append(&msg(t, t)).expect("append");
    }
    // R-RT-1: `a.#` matches `a` itself (zero words).
    let all = cursor(&*s, "all", "a.#", StartAt::Earliest, 16);
    assert_eq!(
        payloads(&fetch_n(&*all.cursor, 6)),
        ["a", "a.x", "a.x.b", "a.b", "a.b.c", "a.y.z.b"]
    );
    // R-RT-1: `#` in the middle; the server's superset is re-checked client-side.
    let mid = cursor(&*s, "mid", "a.#.b", StartAt::Earliest, 16);
    let got = fetch_n(&*mid.cursor, 3);
    assert_eq!(payloads(&got), ["a.x.b", "a.b", "a.y.z.b"]);
    let done: Vec<Finished> = got
        .iter()
        .map(|m| finished(m, Outcome::Delivered))
        .collect();
    mid.cursor.finish(&done).expect("finish");
    // The two the server's superset let through were skipped and count as filtered; the
    // whole stream is then committed.
    until("the rest skipped", || {
        let st = mid.cursor.state();
        st.skipped_by_filter == 2 && st.lag == 0 && st.committed == 7
    });
    assert_quiet(&*mid.cursor, Duration::from_millis(300));
}

#[test]
fn fetches_that_start_no_handler_do_not_count_and_a_returned_message_goes_out_alone() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let ack_wait = Duration::from_secs(1);
    let b = JetStreamBackend::builder()
        .ack_wait(ack_wait)
        .max_deliveries(2)
        .connect(options(&server))
        .expect("connects");
    let s = stream(&b, "fragile", &["fragile"]);
    s.append(&msg("fragile", "poison")).expect("append");
    // A process that takes the first message and dies without finishing it, twice: a raw
    // consumer on the same durable that never acknowledges.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let client = async_nats::connect(server.url()).await.expect("connects");
        let js = async_nats::jetstream::new(client);
        let raw: async_nats::jetstream::consumer::PullConsumer = js
            .create_consumer_on_stream(
                async_nats::jetstream::consumer::pull::Config {
                    durable_name: Some("worker".to_owned()),
                    filter_subject: tidings_jetstream::record_subject("fragile", "fragile"),
                    ack_wait,
                    ..Default::default()
                },
                "fragile",
            )
            .await
            .expect("consumer");
        for round in 1..=2i64 {
            let deadline = Instant::now() + PATIENCE;
            loop {
                assert!(Instant::now() < deadline, "delivery {round} never came");
                let mut batch = raw
                    .batch()
                    .max_messages(1)
                    .expires(ack_wait * 3)
                    .messages()
                    .await
                    .expect("fetch");
                if let Some(m) = futures_util::StreamExt::next(&mut batch).await {
                    let m = m.expect("a delivery");
                    assert_eq!(m.info().expect("metadata").delivered, round);
                    break;
                }
            }
        }
    });
    s.append(&msg("fragile", "fine")).expect("append");
    // R-DEL-6: the server counts two deliveries, but no handler started: nothing is
    // dead-lettered. The message came back unfinished, so it goes out alone (its start
    // counted durably), and nothing behind it until it is finished.
    let c = cursor(&*s, "worker", "fragile", StartAt::Earliest, 4);
    let deadline = Instant::now() + PATIENCE;
    let mut seen = Vec::new();
    while seen.len() < 2 {
        assert!(Instant::now() < deadline, "only {seen:?} came");
        let got = c.cursor.fetch(4).expect("fetch");
        if got.iter().any(|m| m.payload() == "poison") {
            assert_eq!(
                payloads(&got),
                ["poison"],
                "a returned message goes out alone"
            );
            assert_eq!(c.cursor.state().outstanding, 1, "and nothing else is out");
        }
        for m in &got {
            c.cursor
                .finish(&[finished(m, Outcome::Delivered)])
                .expect("finish");
        }
        seen.extend(payloads(&got));
        std::thread::sleep(Duration::from_millis(20));
    }
    seen.sort();
    assert_eq!(seen, ["fine", "poison"]);
    until("nothing left unacknowledged", || c.cursor.state().lag == 0);
    assert!(c.cursor.dead_letters().expect("dlq").is_empty());
}

#[test]
fn calls_from_inside_a_tokio_runtime_do_not_nest() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    // Made, used and dropped on a current-thread runtime's only thread, and on a worker of a
    // multi-thread one: the backend's own thread does the async work.
    let current = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let url = server.url();
    current.block_on(async {
        let b = JetStreamBackend::connect(
            ConnectOptions::new(url.clone()).request_timeout(REQUEST_TIMEOUT),
        )
        .expect("connects");
        let s = stream(&b, "inside", &["inside"]);
        assert_eq!(s.append(&msg("inside", "x")).expect("append").offset, 1);
        let c = cursor(&*s, "in", "inside", StartAt::Earliest, 1);
        assert_eq!(payloads(&fetch_n(&*c.cursor, 1)), ["x"]);
        drop(c);
        drop(b);
    });
    let multi = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    multi.block_on(async {
        tokio::spawn(async move {
            let b = JetStreamBackend::connect(ConnectOptions::new(url)).expect("connects");
            let s = stream(&b, "inside", &["inside"]);
            assert_eq!(s.append(&msg("inside", "y")).expect("append").offset, 2);
        })
        .await
        .expect("the task did not panic");
    });
}

#[test]
fn server_down_is_a_typed_error_within_the_timeout() {
    let Some(mut server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let timeout = Duration::from_secs(1);
    let b = JetStreamBackend::connect(options(&server).request_timeout(timeout)).expect("connects");
    let s = stream(&b, "gone", &["gone"]);
    s.append(&msg("gone", "before")).expect("append");
    let c = cursor(&*s, "r", "gone", StartAt::Earliest, 4);
    let before = c.cursor.state();
    server.kill().expect("killed");
    // R-BP-3: the state stays readable (the last positions read), not an error; past the
    // cache's 200 ms, so the server is asked and does not answer.
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let during = c.cursor.state();
    assert!(started.elapsed() < timeout * 10);
    assert_eq!(
        (during.committed, during.lag),
        (before.committed, before.lag)
    );
    assert_eq!(during.error, None);
    let started = Instant::now();
    let err = s.append(&msg("gone", "after")).expect_err("server is down");
    // R-DIST-5: a typed error naming the backend, bounded by the stated timeout (one request
    // plus the backend's margin; generous here, never a speed).
    assert!(
        matches!(
            &err,
            StreamError::Backend {
                backend: "jetstream",
                ..
            }
        ),
        "{err:?}"
    );
    // R-DIST-5: of the kind a caller matches on: the server is away, or did not answer.
    assert!(
        matches!(
            err.kind(),
            StreamErrorKind::Unavailable | StreamErrorKind::TimedOut
        ),
        "{err:?}"
    );
    // The backend's own error is the source, with async-nats's error behind it.
    let source = std::error::Error::source(&err).expect("a source");
    let js = source
        .downcast_ref::<JetStreamError>()
        .expect("the JetStream backend's error");
    assert_eq!(js.kind(), err.kind());
    assert!(std::error::Error::source(js).is_some(), "{js:?}");
    assert!(started.elapsed() < timeout * 10, "{:?}", started.elapsed());
    let started = Instant::now();
    let commit = c.cursor.commit().expect_err("server is down");
    assert!(
        matches!(
            commit.kind(),
            StreamErrorKind::Unavailable | StreamErrorKind::TimedOut
        ),
        "{commit:?}"
    );
    assert!(started.elapsed() < timeout * 10);
    // Connecting to nothing is a typed error too, within the connect timeout.
    let dead = format!("nats://127.0.0.1:{}", server.port());
    let err = JetStreamBackend::connect(
        ConnectOptions::new(dead).connect_timeout(Duration::from_millis(500)),
    )
    .expect_err("nothing listens");
    // R-SEC-1: unreachable, not an authentication or TLS failure.
    assert!(
        matches!(
            err.kind(),
            StreamErrorKind::Unavailable | StreamErrorKind::TimedOut
        ),
        "{err:?}"
    );
    // After the server returns, the same backend works again (the client reconnects).
    server.restart().expect("restarted");
    until("appends work again", || {
        s.append(&msg("gone", "back")).is_ok()
    });
    assert!(fetch_n(&*c.cursor, 1).len() == 1);
}

#[test]
fn replay_by_the_servers_store_time() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let b = backend(&server);
    let s = stream(&b, "timed", &["timed"]);
    for i in 0..3 {
        s.append(&msg("timed", &format!("early{i}")))
            .expect("append");
    }
    // The server runs on this host: its store time and this clock agree well within the
    // pauses around `at`.
    std::thread::sleep(Duration::from_millis(200));
    let at = std::time::SystemTime::now();
    std::thread::sleep(Duration::from_millis(200));
    for i in 0..3 {
        s.append(&msg("timed", &format!("late{i}")))
            .expect("append");
    }
    // R-LOG-4: a new name from a time starts at the first record stored at or after it.
    let c = cursor(&*s, "from-time", "timed", StartAt::Time(at), 8);
    assert_eq!(c.cursor.commit().expect("commit"), 4);
    assert_eq!(
        payloads(&fetch_n(&*c.cursor, 3)),
        ["late0", "late1", "late2"]
    );
    // R-LOG-4: seek by time.
    assert_eq!(
        c.cursor
            .seek(StartAt::Time(std::time::SystemTime::UNIX_EPOCH))
            .expect("seek"),
        1
    );
    assert_eq!(c.cursor.seek(StartAt::Time(at)).expect("seek"), 4);
    assert_eq!(
        payloads(&fetch_n(&*c.cursor, 3)),
        ["late0", "late1", "late2"]
    );
}

fn js_broker(server: &NatsServer) -> Broker {
    Broker::builder()
        .driver(Driver::Manual)
        .durable_backend(Arc::new(backend(server)))
        .build()
        .expect("builds")
}

#[test]
fn an_existing_stream_is_never_changed_by_another_process() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    // Two brokers, each with its own connection: two processes sharing the server.
    let a = js_broker(&server);
    let b = js_broker(&server);
    let shared = a
        .create_stream(StreamConfig::new("shared", ["sh.#"]))
        .expect("created");
    let err = b
        .create_stream(StreamConfig::new("shared", ["sh.eu.#"]))
        .expect_err("other patterns");
    // R-LOG-5: refused with a typed error naming both pattern sets, never an update.
    assert!(
        matches!(
            &err,
            StreamError::ConfigMismatch { stream, setting: "patterns", existing, requested }
                if stream == "shared"
                    && *existing == format!("{:?}", ["sh.#"])
                    && *requested == format!("{:?}", ["sh.eu.#"])
        ),
        "{err:?}"
    );
    assert_eq!(err.kind(), StreamErrorKind::ConfigMismatch);
    // The stream still captures what A asked for.
    a.publish(Message::to("sh.us.order").payload("1"))
        .expect("published");
    assert_eq!(shared.read(1, 10).expect("read").len(), 1); // R-LOG-5
    // The same patterns open it from B.
    let again = b
        .create_stream(StreamConfig::new("shared", ["sh.#"]))
        .expect("same patterns");
    assert_eq!(again.end_offset(), 2);
    let report = b
        .publish(Message::to("sh.us.order").payload("2"))
        .expect("published");
    assert_eq!(report.streams, ["shared"]);
    // Another retention is refused the same way.
    let err = b
        .create_stream(
            StreamConfig::new("shared2", ["sh2.#"])
                .retention(Retention::new().max_age(Duration::from_secs(3600))),
        )
        .and_then(|_| a.create_stream(StreamConfig::new("shared2", ["sh2.#"])))
        .expect_err("other retention");
    assert!(
        matches!(
            &err,
            StreamError::ConfigMismatch {
                setting: "retention",
                ..
            }
        ),
        "{err:?}"
    );
    a.close(Duration::from_secs(5));
    b.close(Duration::from_secs(5));
}

#[test]
fn retention_is_set_on_the_server_stream() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let b = backend(&server);
    let config =
        StreamConfig::new("small", ["small.#"]).retention(Retention::new().max_bytes(2_000));
    let s = b
        .open_stream(&config, &[p("small.#")])
        .expect("stream opens");
    for i in 0..40 {
        s.append(&msg("small.x", &format!("{i:0>100}")))
            .expect("append");
    }
    // R-DIST-4: the retention asked for is honoured: the server dropped the oldest records.
    let err = s.read(1, 1).expect_err("the first record is gone");
    assert!(
        matches!(err, StreamError::OutOfRetention { requested: 1, earliest } if earliest > 1),
        "{err:?}"
    );
    assert_eq!(err.kind(), StreamErrorKind::OutOfRange);
}

#[test]
fn a_stream_made_without_recorded_patterns_is_compared_by_its_subjects() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    // Streams made by hand (or by an older build): subjects, no recorded patterns.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let client = async_nats::connect(server.url()).await.expect("connects");
        let context = async_nats::jetstream::new(client);
        // Records on the topics themselves: what builds before the subject namespace made.
        context
            .create_stream(async_nats::jetstream::stream::Config {
                name: "legacy".to_owned(),
                subjects: vec!["legacy".to_owned(), "legacy.>".to_owned()],
                ..Default::default()
            })
            .await
            .expect("made");
        // Made before keyed consumer groups: the unkeyed namespace only.
        context
            .create_stream(async_nats::jetstream::stream::Config {
                name: "unkeyed".to_owned(),
                subjects: vec![
                    tidings_jetstream::record_subject("unkeyed", "unkeyed"),
                    tidings_jetstream::record_subject("unkeyed", "unkeyed.>"),
                ],
                ..Default::default()
            })
            .await
            .expect("made");
        // By hand, with both namespaces (keyed records under any partition).
        context
            .create_stream(async_nats::jetstream::stream::Config {
                name: "manual".to_owned(),
                subjects: vec![
                    tidings_jetstream::record_subject("manual", "manual"),
                    tidings_jetstream::record_subject("manual", "manual.>"),
                    "$TIDINGS.k.manual.*.manual".to_owned(),
                    "$TIDINGS.k.manual.*.manual.>".to_owned(),
                ],
                ..Default::default()
            })
            .await
            .expect("made");
    });
    let b = backend(&server);
    // R-LOG-5, R-RT-1: other patterns, or records on the topics, are refused.
    for patterns in ["other.#", "legacy.#"] {
        let err = b
            .open_stream(&StreamConfig::new("legacy", [patterns]), &[p(patterns)])
            .expect_err("other subjects");
        assert_eq!(err.kind(), StreamErrorKind::ConfigMismatch, "{err:?}");
    }
    // R-LOG-5, R-DIST-6: a stream without the keyed namespace is refused (recreate it).
    let err = b
        .open_stream(
            &StreamConfig::new("unkeyed", ["unkeyed.#"]),
            &[p("unkeyed.#")],
        )
        .expect_err("no keyed namespace");
    assert_eq!(err.kind(), StreamErrorKind::ConfigMismatch, "{err:?}");
    // The same subjects: adopted, and the patterns recorded from now on.
    let s = b
        .open_stream(&StreamConfig::new("manual", ["manual.#"]), &[p("manual.#")])
        .expect("adopted");
    s.append(&msg("manual.a", "x")).expect("append");
}

/// Finishing is plain acknowledgements confirmed once per batch, but `commit` confirms
/// what was sent before reading the ack floor (R-LOG-3, R-BP-3): every message finished
/// before the call counts, at once. `state` never waits on the network (issue 35): its
/// `outstanding` is exact at once, and its `committed` reaches the same floor by the
/// cursor's own refresh (which confirms first), without another call.
#[test]
fn commit_counts_every_finish_made_before_it_and_state_follows() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let b = backend(&server);
    let s = stream(&b, "acks", &["acks.*"]);
    for round in 0..3 {
        let name = format!("reader{round}");
        for i in 0..300 {
            s.append(&msg("acks.x", &format!("m{i}"))).expect("append");
        }
        let end = s.end_offset();
        let c = cursor(&*s, &name, "acks.*", StartAt::Earliest, 512);
        let got = fetch_n(&*c.cursor, 300 * (round + 1));
        let done: Vec<Finished> = got
            .iter()
            .map(|m| finished(m, Outcome::Delivered))
            .collect();
        c.cursor.finish(&done).expect("finish");
        if round == 1 {
            assert_eq!(c.cursor.state().outstanding, 0, "outstanding, at once");
            let started = Instant::now();
            while c.cursor.state().committed != end {
                assert!(
                    started.elapsed() < PATIENCE,
                    "state().committed {} never reached {end}",
                    c.cursor.state().committed
                );
                std::thread::sleep(Duration::from_millis(10));
            }
        } else {
            assert_eq!(c.cursor.commit().expect("commit"), end, "commit");
        }
        c.cursor.close();
    }
}

/// What the standing pull took ahead and no handler started is handed back at close, so
/// the next holder of the name gets it at once, not after the ack wait (R-DIST-3), in
/// stream order, none lost and none twice.
#[test]
fn close_hands_back_what_was_pulled_ahead() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let b = JetStreamBackend::builder()
        .ack_wait(Duration::from_secs(120))
        .connect(options(&server))
        .expect("connects");
    let s = stream(&b, "ahead", &["ahead.*"]);
    for i in 0..100 {
        s.append(&msg("ahead.x", &format!("{i:03}")))
            .expect("append");
    }
    let first = cursor(&*s, "reader", "ahead.*", StartAt::Earliest, 256);
    let got = fetch_n(&*first.cursor, 10);
    let done: Vec<Finished> = got
        .iter()
        .map(|m| finished(m, Outcome::Delivered))
        .collect();
    first.cursor.finish(&done).expect("finish");
    // Room for the standing pull to take the rest ahead (how much it took is not
    // asserted: all of it must come back either way).
    std::thread::sleep(Duration::from_millis(300));
    first.cursor.close();
    let started = Instant::now();
    let next = cursor(&*s, "reader", "ahead.*", StartAt::Earliest, 256);
    let mut seen = Vec::new();
    while seen.len() < 90 {
        assert!(
            started.elapsed() < PATIENCE,
            "only {} of 90 came back within {PATIENCE:?} (the ack wait is 120 s)",
            seen.len()
        );
        let got = next.cursor.fetch(100).expect("fetch");
        if got.is_empty() {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        let done: Vec<Finished> = got
            .iter()
            .map(|m| finished(m, Outcome::Delivered))
            .collect();
        next.cursor.finish(&done).expect("finish");
        seen.extend(payloads(&got));
    }
    let expected: Vec<String> = (10..100).map(|i| format!("{i:03}")).collect();
    assert_eq!(seen, expected);
    assert_quiet(&*next.cursor, Duration::from_millis(300));
}
