//! The client layer against a real `nats-server` (started by the testkit launcher, which
//! installs a missing binary; skipped, with a notice, only under `TIDINGS_SKIP_NATS=1`).
//! Every server a test starts is stopped when the test ends.

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::time::{Duration, Instant};

use super::consumer::ConsumerSpec;
use super::delivery::Delivery;
use super::durable::Durable;
use super::stream_spec::{Record, StreamSpec};
use crate::connection::connect::{ConnectOptions, JetStream, MIN_SERVER_VERSION};
use crate::error::{
    AppendError, ConnectError, ConsumerError, FetchError, InfoError, StreamSpecError,
};
use tidings::{MessageId, Pattern, StartAt, Topic};
use tidings_testkit::nats::{NatsServer, NatsServerOptions};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Generous bound for waits on the server (never asserted as a speed).
const PATIENCE: Duration = Duration::from_secs(30);

fn options(server: &NatsServer) -> ConnectOptions {
    let options = ConnectOptions::new(server.url())
        .connect_timeout(CONNECT_TIMEOUT)
        .request_timeout(REQUEST_TIMEOUT)
        .name("tidings-jetstream-tests");
    match server.token() {
        Some(token) => options.token(token),
        None => options,
    }
}

async fn connect(server: &NatsServer) -> JetStream {
    options(server).connect().await.expect("connects")
}

fn pattern(s: &str) -> Pattern {
    Pattern::new(s).expect("valid pattern")
}

fn record(n: u128, topic: &str) -> Record {
    Record::new(
        MessageId::from_u128(n),
        Topic::new(topic).expect("valid topic"),
    )
    .payload(format!("payload {n}"))
}

/// Fetches until `want` deliveries came or nothing more comes; acks each.
async fn drain(durable: &Durable, want: usize) -> Vec<(String, u64, Option<MessageId>)> {
    let deadline = Instant::now() + PATIENCE;
    let mut out = Vec::new();
    while out.len() < want && Instant::now() < deadline {
        let fetched = durable
            .fetch(100, Duration::from_millis(300))
            .await
            .expect("fetch");
        if fetched.deliveries.is_empty() && fetched.skipped == 0 {
            break;
        }
        for d in fetched.deliveries {
            out.push((d.topic().to_owned(), d.sequence(), d.message_id()));
            d.ack().await.expect("ack");
        }
    }
    out
}

async fn fetch_one(durable: &Durable) -> Delivery {
    let mut fetched = durable.fetch(1, PATIENCE).await.expect("fetch");
    assert_eq!(
        fetched.deliveries.len(),
        1,
        "one delivery within {PATIENCE:?}"
    );
    fetched.deliveries.remove(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_auth_right_token_connects_wrong_token_fails_fast() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new().token("rightToken1")) else {
        return;
    };
    let js = connect(&server).await;
    assert!(js.server_version() >= MIN_SERVER_VERSION);
    assert!(js.is_connected());

    for (label, options) in [
        ("wrong token", options(&server).token("wrongToken2")),
        (
            "no token",
            ConnectOptions::new(server.url()).connect_timeout(CONNECT_TIMEOUT),
        ),
    ] {
        let started = Instant::now();
        let err = options.connect().await.expect_err(label);
        // Issue test 7: a typed error, not a hang (bound = the stated connect timeout).
        assert!(
            matches!(err, ConnectError::AuthenticationFailed { .. }),
            "{label}: {err:?}"
        );
        assert!(
            started.elapsed() <= CONNECT_TIMEOUT + REQUEST_TIMEOUT,
            "{label}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_or_silent_server_is_a_typed_error_within_the_timeout() {
    // Nothing listens on a port we just released.
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let started = Instant::now();
    let err = ConnectOptions::new(format!("nats://127.0.0.1:{port}"))
        .connect_timeout(CONNECT_TIMEOUT)
        .connect()
        .await
        .expect_err("nothing listens");
    // R-DIST-5: a typed error within the stated timeout.
    assert!(
        matches!(
            err,
            ConnectError::Unreachable { .. } | ConnectError::TimedOut { .. }
        ),
        "{err:?}"
    );
    assert!(started.elapsed() <= CONNECT_TIMEOUT + Duration::from_secs(1));

    // A listener that accepts and never speaks: the connect timeout bounds the wait.
    let silent = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("nats://{}", silent.local_addr().expect("addr"));
    let started = Instant::now();
    let err = ConnectOptions::new(url)
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .await
        .expect_err("silent server");
    // R-DIST-5
    assert!(matches!(err, ConnectError::TimedOut { .. }), "{err:?}");
    assert!(started.elapsed() <= Duration::from_secs(5));
    drop(silent);

    let err = ConnectOptions::new("nats://127.0.0.1:1")
        .credentials_file("/nonexistent/tidings.creds")
        .connect()
        .await
        .expect_err("missing creds file");
    assert!(matches!(err, ConnectError::Credentials { .. }), "{err:?}");

    let err = ConnectOptions::new("nats://exa mple:1")
        .connect()
        .await
        .expect_err("bad url");
    assert!(matches!(err, ConnectError::InvalidUrl { .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wildcards_through_jetstream_are_amqp_exact() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let js = connect(&server).await;
    // JetStream refuses a stream capturing every subject (`#`), so the stream captures the
    // three first words the table uses; the consumers' patterns are free.
    let err = js
        .ensure_stream(&StreamSpec::new("everything", [pattern("#")]))
        .await
        .expect_err("capture-all refused");
    assert!(
        matches!(err, StreamSpecError::CapturesEverything { .. }),
        "{err:?}"
    );
    js.ensure_stream(&StreamSpec::new(
        "topics",
        [pattern("a.#"), pattern("b.#"), pattern("x.#")],
    ))
    .await
    .expect("stream");
    let table = [
        "a", "a.b", "a.b.c", "a.x.b", "a.b.b", "b", "x.a.b", "x", "x.y.z", "a.a",
    ];
    for (i, topic) in table.iter().enumerate() {
        js.append(&record(i as u128 + 1, topic))
            .await
            .expect("append");
    }
    let expected: &[(&str, &[&str])] = &[
        // `#` matches zero words: `a.#` includes `a` itself.
        ("a.#", &["a", "a.b", "a.b.c", "a.x.b", "a.b.b", "a.a"]),
        // `#` in the middle: zero (`a.b`) or more (`a.x.b`, `a.b.b`) words.
        ("a.#.b", &["a.b", "a.x.b", "a.b.b"]),
        ("#.b", &["a.b", "a.x.b", "a.b.b", "b", "x.a.b"]),
        ("#", &table),
        ("a.*", &["a.b", "a.a"]),
        ("*.b.#", &["a.b", "a.b.c", "a.b.b"]),
        (
            "#.a.#",
            &["a", "a.b", "a.b.c", "a.x.b", "a.b.b", "x.a.b", "a.a"],
        ),
        ("x.#.z", &["x.y.z"]),
        ("*", &["a", "b", "x"]),
    ];
    for (i, (p, want)) in expected.iter().enumerate() {
        let durable = js
            .durable(ConsumerSpec::new("topics", format!("w{i}"), pattern(p)))
            .await
            .expect("consumer");
        let got: BTreeSet<String> = drain(&durable, want.len())
            .await
            .into_iter()
            .map(|(t, _, _)| t)
            .collect();
        let want: BTreeSet<String> = want.iter().map(|s| (*s).to_owned()).collect();
        // R-RT-1: RabbitMQ-exact semantics through the superset filter + re-check.
        assert_eq!(got, want, "pattern {p}");
        let reference: BTreeSet<String> = table
            .iter()
            .filter(|t| pattern(p).matches(&Topic::new(t).expect("topic")))
            .map(|s| (*s).to_owned())
            .collect();
        assert_eq!(got, reference, "pattern {p} against Pattern::matches");
        if *p == "a.#.b" {
            // `a.>` lets a.b.c and a.a through; the re-check skips them, counted.
            assert_eq!(durable.skipped(), 2, "R-RT-1 skipped counted");
        }
        let info = durable.info().await.expect("info");
        assert_eq!(
            (info.num_pending, info.num_ack_pending as u64),
            (0, 0),
            "pattern {p}: all finished"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_message_id_is_stored_once() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let js = connect(&server).await;
    js.ensure_stream(&StreamSpec::new("orders", [pattern("orders.#")]))
        .await
        .expect("stream");
    let first = js
        .append(&record(42, "orders.created"))
        .await
        .expect("append");
    let again = js
        .append(&record(42, "orders.created"))
        .await
        .expect("append");
    let other = js
        .append(&record(43, "orders.created"))
        .await
        .expect("append");
    // R-DIST-1: dedup by message id.
    assert!(!first.duplicate);
    assert!(again.duplicate);
    assert_eq!(again.sequence, first.sequence);
    assert_eq!(other.sequence, first.sequence + 1);
    let state = js
        .ensure_stream(&StreamSpec::new("orders", [pattern("orders.#")]))
        .await
        .expect("stream");
    assert_eq!(state.messages, 2, "R-DIST-1: stored once");

    let durable = js
        .durable(ConsumerSpec::new("orders", "billing", pattern("orders.*")))
        .await
        .expect("consumer");
    let d = fetch_one(&durable).await;
    assert_eq!(d.message_id(), Some(MessageId::from_u128(42)));
    assert_eq!(d.payload(), b"payload 42");
    assert_eq!(d.delivered(), 1);
    d.ack().await.expect("ack");

    let err = js
        .append(&record(1, "nobody.captures"))
        .await
        .expect_err("no stream");
    assert!(matches!(err, AppendError::NoStream { .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_at_sequence_time_latest_and_seek() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let js = connect(&server).await;
    js.ensure_stream(&StreamSpec::new("log", [pattern("log.#")]))
        .await
        .expect("stream");
    for n in 1..=5 {
        let appended = js.append(&record(n, "log.line")).await.expect("append");
        assert_eq!(
            u128::from(appended.sequence),
            n,
            "offsets are sequences from 1"
        );
    }
    let seqs = |v: Vec<(String, u64, Option<MessageId>)>| -> Vec<u64> {
        v.into_iter().map(|(_, s, _)| s).collect()
    };

    let all = js
        .durable(ConsumerSpec::new("log", "all", pattern("log.#")))
        .await
        .expect("consumer");
    let mut published = Vec::new();
    for _ in 0..5 {
        let d = fetch_one(&all).await;
        published.push((d.sequence(), d.published()));
        d.ack().await.expect("ack");
    }
    assert_eq!(
        published.iter().map(|p| p.0).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5]
    );

    let by_offset = js
        .durable(ConsumerSpec::new("log", "from3", pattern("log.#")).start(StartAt::Offset(3)))
        .await
        .expect("consumer");
    // R-LOG-4 on JetStream: start by sequence.
    assert_eq!(seqs(drain(&by_offset, 3).await), [3, 4, 5]);

    let by_time = js
        .durable(
            ConsumerSpec::new("log", "fromtime", pattern("log.#"))
                .start(StartAt::Time(published[3].1)),
        )
        .await
        .expect("consumer");
    // R-LOG-4 on JetStream: start by (server store) time, first record at or after it.
    assert_eq!(seqs(drain(&by_time, 2).await), [4, 5]);

    let latest = js
        .durable(ConsumerSpec::new("log", "latest", pattern("log.#")).start(StartAt::Latest))
        .await
        .expect("consumer");
    assert!(
        latest
            .fetch(10, Duration::ZERO)
            .await
            .expect("fetch")
            .deliveries
            .is_empty()
    );
    js.append(&record(6, "log.line")).await.expect("append");
    // R-LOG-4: Latest delivers only what is appended after.
    assert_eq!(seqs(drain(&latest, 1).await), [6]);

    // What the backend's seek does: JetStream cannot move a consumer, so it is deleted
    // and created again at the new start.
    assert!(js.delete_consumer("log", "latest").await.expect("delete"));
    let latest = js
        .durable(ConsumerSpec::new("log", "latest", pattern("log.#")).start(StartAt::Offset(2)))
        .await
        .expect("recreated");
    // R-LOG-4: seek moves the cursor back.
    assert_eq!(seqs(drain(&latest, 5).await), [2, 3, 4, 5, 6]);

    // Reopening an existing durable resumes where it was; its start is ignored.
    let reopened = js
        .durable(ConsumerSpec::new("log", "from3", pattern("log.#")).start(StartAt::Earliest))
        .await
        .expect("reopen");
    js.append(&record(7, "log.line")).await.expect("append");
    // R-LOG-3 on JetStream: it had consumed 3..=5, so it resumes at 6, not at the earliest.
    assert_eq!(seqs(drain(&reopened, 2).await), [6, 7]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nak_redelivers_term_does_not_and_max_deliver_bounds() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let js = connect(&server).await;
    js.ensure_stream(&StreamSpec::new("jobs", [pattern("jobs.*")]))
        .await
        .expect("stream");
    js.append(&record(1, "jobs.a")).await.expect("append");
    js.append(&record(2, "jobs.b")).await.expect("append");
    let durable = js
        .durable(ConsumerSpec::new("jobs", "worker", pattern("jobs.*")).max_deliver(2))
        .await
        .expect("consumer");

    let first = fetch_one(&durable).await;
    assert_eq!(first.sequence(), 1);
    first.in_progress().await.expect("in progress");
    first.nak(None).await.expect("nak");
    let again = fetch_one(&durable).await;
    // R-DIST-1: explicit ack; a nak redelivers, counting the attempt.
    assert_eq!((again.sequence(), again.delivered()), (1, 2));
    again.nak(None).await.expect("nak");
    // max_deliver = 2: sequence 1 is not delivered a third time.
    let next = fetch_one(&durable).await;
    assert_eq!(
        next.sequence(),
        2,
        "R-DIST-1: max_deliver bounds redelivery"
    );
    next.term().await.expect("term");
    assert!(
        durable
            .fetch(10, Duration::from_millis(300))
            .await
            .expect("fetch")
            .deliveries
            .is_empty(),
        "a terminated delivery is not redelivered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_settings_are_read_back_and_a_dropped_field_is_refused() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let js = connect(&server).await;
    js.ensure_stream(&StreamSpec::new("ev", [pattern("ev.#")]))
        .await
        .expect("stream");
    let spec = ConsumerSpec::new("ev", "audit", pattern("ev.#"))
        .max_deliver(4)
        .backoff([Duration::from_millis(100), Duration::from_millis(400)])
        .inactive_threshold(Duration::from_secs(3600));
    let durable = js.durable(spec.clone()).await.expect("consumer");
    let answered = durable.settings().clone();
    assert_eq!(answered.filter_subjects, ["ev", "ev.>"]);
    assert_eq!(answered.max_deliver, 4);
    assert_eq!(answered.inactive_threshold, Duration::from_secs(3600));
    // R-DIST-4: a current server keeps every setting.
    spec.settings()
        .verify(&answered)
        .expect("2.15 keeps the settings");

    // No old server is available here: take the real server's answer and remove the field
    // the way 2.9 drops it (it ignores `filter_subjects` and reports none).
    let mut as_old_server = answered.clone();
    as_old_server.filter_subjects.clear();
    let err = spec
        .settings()
        .verify(&as_old_server)
        .expect_err("dropped field");
    // R-DIST-4: refused with a typed error naming the field.
    assert!(
        matches!(
            err,
            ConsumerError::ConfigDropped {
                field: "filter_subjects",
                ..
            }
        ),
        "{err:?}"
    );
    let mut no_backoff = answered;
    no_backoff.backoff.clear();
    // R-DIST-4
    assert!(matches!(
        spec.settings().verify(&no_backoff),
        Err(ConsumerError::ConfigDropped {
            field: "backoff",
            ..
        })
    ));

    let err = js
        .durable(ConsumerSpec::new("missing", "x", pattern("ev.#")))
        .await
        .expect_err("no such stream");
    assert!(
        matches!(err, ConsumerError::StreamNotFound { .. }),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_appends_survive_a_server_restart() {
    let Some(mut server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let js = connect(&server).await;
    js.ensure_stream(&StreamSpec::new("pay", [pattern("pay.#")]))
        .await
        .expect("stream");
    const N: u128 = 200;
    for n in 1..=N {
        js.append(&record(n, "pay.in")).await.expect("append");
    }

    server.kill().expect("kill -9 the server");
    let started = Instant::now();
    let err = js
        .append(&record(N + 1, "pay.in"))
        .await
        .expect_err("server is down");
    // R-DIST-5: publishing while the server is down is a typed error within the timeout.
    assert!(matches!(err, AppendError::TimedOut { .. }), "{err:?}");
    assert!(started.elapsed() <= 2 * REQUEST_TIMEOUT + Duration::from_secs(1));

    server.restart().expect("restart on the same store dir");
    let deadline = Instant::now() + PATIENCE;
    while !js.is_connected() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(js.is_connected(), "the client reconnects by itself");

    let durable = js
        .durable(ConsumerSpec::new("pay", "ledger", pattern("pay.#")))
        .await
        .expect("consumer after restart");
    let got = drain(&durable, N as usize).await;
    let ids: Vec<u128> = got
        .iter()
        .map(|(_, _, id)| id.expect("id").as_u128())
        .collect();
    // R-DIST-5: every acknowledged append is still there, in order, after a kill -9.
    assert_eq!(ids, (1..=N).collect::<Vec<_>>());
    // The append that timed out may still have been sent after the reconnect (the client
    // buffers while disconnected): retrying it with the same id stores it at most once.
    let retried = js
        .append(&record(N + 1, "pay.in"))
        .await
        .expect("retry after restart");
    assert_eq!(retried.sequence, N as u64 + 1);
    let after = js
        .append(&record(N + 2, "pay.in"))
        .await
        .expect("append after restart");
    // R-DIST-5 / R-DIST-1: exactly one copy of the retried record.
    assert_eq!(after.sequence, N as u64 + 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_consumer_is_removed_by_its_inactivity_threshold() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let js = connect(&server).await;
    js.ensure_stream(&StreamSpec::new("tmp", [pattern("tmp.#")]))
        .await
        .expect("stream");
    js.append(&record(1, "tmp.x")).await.expect("append");
    let durable = js
        .durable(
            ConsumerSpec::new("tmp", "abandoned", pattern("tmp.#"))
                .inactive_threshold(Duration::from_secs(1)),
        )
        .await
        .expect("consumer");
    // Nobody fetches: the server deletes it (bounded wait; the threshold is the server's).
    let deadline = Instant::now() + PATIENCE;
    let gone = loop {
        match durable.info().await {
            Err(InfoError::ConsumerGone { .. }) => break true,
            Ok(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => {
                eprintln!("last answer: {other:?}");
                break false;
            }
        }
    };
    assert!(
        gone,
        "an abandoned durable consumer does not leak on the server"
    );
    let err = durable
        .fetch(1, Duration::from_millis(100))
        .await
        .expect_err("consumer is gone");
    assert!(matches!(err, FetchError::ConsumerGone { .. }), "{err:?}");
    // Opening it again creates it anew.
    let again = js
        .durable(ConsumerSpec::new("tmp", "abandoned", pattern("tmp.#")))
        .await
        .expect("recreated");
    assert_eq!(drain(&again, 1).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_connections_share_one_durable_and_unacked_work_moves_over() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let (first, second) = (connect(&server).await, connect(&server).await);
    first
        .ensure_stream(&StreamSpec::new("work", [pattern("work.#")]))
        .await
        .expect("stream");
    const N: u128 = 300;
    for n in 1..=N {
        first.append(&record(n, "work.item")).await.expect("append");
    }
    let spec =
        ConsumerSpec::new("work", "crew", pattern("work.#")).ack_wait(Duration::from_secs(3));
    let a = first.durable(spec.clone()).await.expect("consumer a");
    let b = second.durable(spec).await.expect("consumer b");

    // Both pull concurrently; each handles (acks) what it got.
    async fn work(durable: &Durable, stop_after: Option<usize>) -> Vec<u64> {
        let mut seen = Vec::new();
        let deadline = Instant::now() + PATIENCE;
        while Instant::now() < deadline {
            let fetched = durable
                .fetch(10, Duration::from_millis(500))
                .await
                .expect("fetch");
            if fetched.deliveries.is_empty() {
                break;
            }
            for d in fetched.deliveries {
                if stop_after.is_some_and(|n| seen.len() >= n) {
                    // "Dies": never finishes what it holds.
                    return seen;
                }
                seen.push(d.sequence());
                d.ack().await.expect("ack");
            }
        }
        seen
    }
    let (got_a, got_b) = tokio::join!(work(&a, Some(50)), work(&b, None));
    // b stopped when nothing came for 500 ms; what a held unacked comes back after the
    // ack wait: b picks it up (bounded wait until every record was handled).
    let handled = |late: &[u64]| got_a.len() + got_b.len() + late.len();
    let mut got_b_late = Vec::new();
    let deadline = Instant::now() + PATIENCE;
    while handled(&got_b_late) < N as usize && Instant::now() < deadline {
        got_b_late.extend(work(&b, None).await);
    }
    let mut all: Vec<u64> = got_a
        .iter()
        .chain(&got_b)
        .chain(&got_b_late)
        .copied()
        .collect();
    all.sort_unstable();
    let before = all.len();
    all.dedup();
    // R-DIST-3 (single process, two connections): each record handled once absent
    // failures, and the unacknowledged ones of the "dead" member reach the other.
    assert_eq!(before, all.len(), "no record acknowledged twice");
    assert_eq!(all, (1..=N as u64).collect::<Vec<_>>(), "none lost");
    assert!(
        !got_a.is_empty() && !got_b.is_empty(),
        "both members got work"
    );
}

/// R-DIST-6 (the lease bucket's read, `kv_last`): the last entry of every key in one
/// request — delete and purge markers marked, revisions as a compare-and-set needs them
/// (the same as a get of each key) — and no consumer left on the bucket's stream; an empty
/// bucket is an empty listing. A bucket without direct get, and more keys than one batch
/// answers, are `Unsupported` (the caller lists the old way).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_entry_of_every_key_is_read_without_a_consumer() {
    use super::kv_last::{LastError, MAX_KEYS, last_per_key};
    use async_nats::jetstream::{kv, stream};
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let js = connect(&server).await;
    let bucket = |name: &str| kv::Config {
        bucket: name.to_owned(),
        history: 1,
        max_age: Duration::from_secs(600),
        ..Default::default()
    };
    let store = js
        .context
        .create_key_value(bucket("lease"))
        .await
        .expect("bucket");
    assert_eq!(last_per_key(&js, &store).await, Ok(Vec::new()));

    store.put("m.a", "".into()).await.expect("put");
    store.put("m.b", "".into()).await.expect("put");
    store.purge("m.b").await.expect("purge");
    let p0 = store.create("p.0", "a".into()).await.expect("create");
    store
        .update("p.0", "free".into(), p0)
        .await
        .expect("update");
    store.put("p.1", "b".into()).await.expect("put");
    store.delete("p.1").await.expect("delete");
    let listed = last_per_key(&js, &store).await.expect("listing");
    let keys: BTreeSet<&str> = listed.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(keys, BTreeSet::from(["m.a", "m.b", "p.0", "p.1"]));
    for e in &listed {
        let got = store.entry(&e.key).await.expect("entry").expect("present");
        assert_eq!(
            (e.revision, e.put, &e.value),
            (
                got.revision,
                got.operation == kv::Operation::Put,
                &got.value
            ),
            "{}",
            e.key
        );
    }
    let put: BTreeSet<&str> = listed
        .iter()
        .filter(|e| e.put)
        .map(|e| e.key.as_str())
        .collect();
    assert_eq!(put, BTreeSet::from(["m.a", "p.0"]));
    let mut s = js.context.get_stream("KV_lease").await.expect("stream");
    assert_eq!(s.info().await.expect("info").state.consumer_count, 0);

    // A bucket made without direct get.
    js.context
        .create_stream(stream::Config {
            name: "KV_plain".to_owned(),
            subjects: vec!["$KV.plain.>".to_owned()],
            max_messages_per_subject: 1,
            allow_direct: false,
            ..Default::default()
        })
        .await
        .expect("stream");
    let plain = js.context.get_key_value("plain").await.expect("bucket");
    plain.put("m.a", "".into()).await.expect("put");
    assert_eq!(last_per_key(&js, &plain).await, Err(LastError::Unsupported));

    // One key more than a batch answers.
    let many = js
        .context
        .create_key_value(bucket("many"))
        .await
        .expect("bucket");
    let acks = futures_util::future::join_all(
        (0..=MAX_KEYS).map(|k| many.put(format!("m.{k}"), "".into())),
    )
    .await;
    assert!(acks.iter().all(Result::is_ok));
    assert_eq!(last_per_key(&js, &many).await, Err(LastError::Unsupported));
    // Exactly a batch: every message of one key removed from the stream.
    js.context
        .get_stream("KV_many")
        .await
        .expect("stream")
        .purge()
        .filter("$KV.many.m.0")
        .await
        .expect("purge");
    let listed = last_per_key(&js, &many).await.expect("listing");
    assert_eq!(listed.len(), MAX_KEYS);
}
