//! Durable streams and durable subscriptions (SPEC §8 R-LOG-1..4, R-BP-2, R-BP-3, R-LIM-2).
//!
//! Thread driver, real files in a temp dir, every wait bounded.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;
use tidings::embedded::{EmbeddedBackend, EmbeddedStreamOptions};
use tidings::{
    Broker, Clock, Concurrency, DurableSpec, HandlerError, ManualClock, Message, Priority,
    Retention, Retry, StartAt, StreamConfig, StreamError, StreamErrorKind, SubscribeOptions,
};
use tidings_log::OpenError;

/// The file an open error names.
fn open_error_path(e: &OpenError) -> Option<&std::path::PathBuf> {
    match e {
        OpenError::Io { path, .. }
        | OpenError::Corrupt { path, .. }
        | OpenError::BadHeader { path, .. }
        | OpenError::Locked { path }
        | OpenError::UnsupportedVersion { path, .. }
        | OpenError::UnparseableName { path }
        | OpenError::Gap { path, .. } => Some(path),
        _ => None,
    }
}

const WAIT: Duration = Duration::from_secs(10);

fn wait_until(what: &str, cond: impl FnMut() -> bool) {
    tidings_testkit::helpers::wait_until(what, WAIT, cond);
}

fn broker(dir: &Path) -> Broker {
    Broker::builder().data_dir(dir).build().unwrap()
}

/// A broker on `dir` with a manual clock and the given driver.
fn broker_on(dir: &Path, clock: &ManualClock, driver: tidings::Driver) -> Broker {
    Broker::builder()
        .data_dir(dir)
        .clock(clock.clone())
        .driver(driver)
        .build()
        .unwrap()
}

fn orders(b: &Broker) -> tidings::Stream {
    b.create_stream(StreamConfig::new("orders", ["orders.#"]))
        .unwrap()
}

/// Records the offsets a handler saw, in order.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<u64>>>);

impl Seen {
    fn handler(&self) -> impl Fn(&Message) -> Result<(), HandlerError> + Send + Sync + 'static {
        let seen = self.0.clone();
        move |m: &Message| {
            seen.lock()
                .push(m.offset().expect("durable messages carry their offset"));
            Ok(())
        }
    }
    fn get(&self) -> Vec<u64> {
        self.0.lock().clone()
    }
    fn len(&self) -> usize {
        self.0.lock().len()
    }
}

fn publish_n(b: &Broker, topic: &str, range: std::ops::Range<u64>) {
    for i in range {
        let r = b
            .publish(
                Message::to(topic)
                    .key(format!("k{i}"))
                    .payload(i.to_string()),
            )
            .unwrap();
        assert_eq!(r.streams, ["orders"]);
    }
}

fn offset_file(dir: &Path, stream: &str, name: &str) -> u64 {
    let text = std::fs::read_to_string(
        dir.join("consumers")
            .join(stream)
            .join(format!("{name}.offset")),
    )
    .unwrap();
    text.trim_end().rsplit(' ').next().unwrap().parse().unwrap()
}

#[test]
fn publish_appends_whole_message_to_matching_streams_and_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let b = broker_on(dir.path(), &clock, tidings::Driver::Thread);
    let s = orders(&b);
    b.create_stream(StreamConfig::new("all", ["#"])).unwrap();
    assert!(matches!(
        b.create_stream(StreamConfig::new("all", ["x"])),
        Err(StreamError::AlreadyExists(_))
    ));
    let r = b
        .publish(
            Message::to("orders.created")
                .key("order-42")
                .header("h", "v")
                .priority(Priority::High)
                .ttl(Duration::from_secs(60))
                .reply_to("inbox.a")
                .correlation_id("c-1")
                .payload("p"),
        )
        .unwrap();
    // R-LOG-1 / R-CORE-5: the report names the streams holding the message.
    assert_eq!(r.streams, ["all", "orders"]);
    assert_eq!(
        b.publish(Message::to("users.created")).unwrap().streams,
        ["all"]
    );
    let m = &s.read(0, 10).unwrap()[0];
    // R-CORE-4: every field survives the log.
    assert_eq!(m.id(), r.id);
    assert_eq!(m.topic().as_str(), "orders.created");
    assert_eq!(m.key(), Some(&b"order-42"[..]));
    assert_eq!(m.header("h"), Some("v"));
    assert_eq!(m.priority(), Priority::High);
    assert_eq!(m.timestamp(), clock.wall());
    assert_eq!(m.expires_at(), Some(clock.wall() + Duration::from_secs(60)));
    assert_eq!(m.reply_to().map(|t| t.as_str()), Some("inbox.a"));
    assert_eq!(m.correlation_id(), Some("c-1"));
    assert_eq!(m.payload(), "p");
    assert_eq!(m.offset(), Some(0));
    b.close(Duration::ZERO);
    drop(b);

    // Reopen: same data dir, same name → the existing log, recovered (R-LOG-2).
    let b = broker(dir.path());
    let s = orders(&b);
    let embedded = b
        .embedded_backend()
        .expect("data_dir builds the embedded log");
    assert!(!embedded.recovery("orders").expect("open").created);
    assert_eq!(s.end_offset(), 1);
    // Without a data dir there are no streams.
    let err = Broker::new()
        .create_stream(StreamConfig::new("x", ["#"]))
        .unwrap_err();
    assert!(matches!(err, StreamError::NoDataDir), "{err:?}");
    assert_eq!(err.kind(), StreamErrorKind::Unsupported);
}

#[test]
fn durable_from_earliest_receives_everything_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let b = broker(dir.path());
    let s = orders(&b);
    publish_n(&b, "orders.created", 0..50);
    b.publish(Message::to("orders.cancelled")).unwrap(); // offset 50: filtered out
    let seen = Seen::default();
    let d = b
        .subscribe(
            DurableSpec::new("orders")
                .name("billing")
                .filter("orders.created"),
            SubscribeOptions::new().capacity(8),
            seen.handler(),
        )
        .unwrap();
    publish_n(&b, "orders.created", 51..100);
    wait_until("100 deliveries", || seen.len() == 99);
    let expected: Vec<u64> = (0..100).filter(|o| *o != 50).collect();
    // R-LOG-3: every message, in log order.
    assert_eq!(seen.get(), expected);
    // Committed after the idle flush: everything finished (R-LOG-3), no lag (R-BP-3).
    wait_until("commit", || d.committed() == s.end_offset());
    assert_eq!(d.lag(), 0);
    assert_eq!(offset_file(dir.path(), "orders", "billing"), 100);
    assert_eq!(d.stats().delivered, 99);
    // A second live subscriber with the same name is refused.
    assert!(matches!(
        b.subscribe(
            DurableSpec::new("orders").name("billing"),
            Default::default(),
            seen.handler()
        ),
        Err(StreamError::DurableInUse { .. })
    ));
}

#[test]
fn restart_resumes_from_committed_without_losing_acknowledged_messages() {
    let dir = tempfile::tempdir().unwrap();
    let opts = || {
        SubscribeOptions::new()
            .capacity(32)
            .concurrency(Concurrency::PerKey { max_in_flight: 4 })
            .retry(Retry::fixed(Duration::from_millis(5), 1_000_000))
    };
    let run1 = Seen::default();
    {
        let backend = EmbeddedBackend::new(dir.path())
            .stream_defaults(EmbeddedStreamOptions::new().commit_every(1000));
        let b = Broker::builder()
            .durable_backend(Arc::new(backend))
            .build()
            .unwrap();
        b.create_stream(StreamConfig::new("orders", ["orders.#"]))
            .unwrap();
        publish_n(&b, "orders.created", 0..20);
        let ok = run1.handler();
        let d = b
            .subscribe(
                DurableSpec::new("orders")
                    .name("billing")
                    .filter("orders.*"),
                opts(),
                move |m: &Message| match m.payload().as_ref() {
                    b"5" => Err(HandlerError::reject("bad order")),
                    b"7" => Err(HandlerError::retry("still failing")), // retrying at close
                    _ => ok(m),
                },
            )
            .unwrap();
        wait_until("18 successes, one DLQ entry, a retry", || {
            run1.len() == 18 && d.stats().dlq_len == 1 && d.stats().attempts >= 21
        });
        // The in-memory entry comes first; its append to the durable DLQ log (and fsync)
        // follows on the dispatcher thread.
        wait_until("the durable DLQ entry", || {
            d.durable_dead_letters().is_ok_and(|dl| !dl.is_empty())
        });
        // R-DEL-4 + R-LOG-3: the dead letter is durable before the position passes it.
        let dl = d.durable_dead_letters().unwrap();
        assert_eq!(dl.len(), 1);
        assert_eq!(dl[0].message.offset(), Some(5));
        assert!(
            dl[0].reason.to_string().contains("bad order"),
            "{}",
            dl[0].reason
        );
        // Low watermark: offset 7 is still retrying, so nothing at or above it is committed.
        wait_until("idle commit", || d.committed() == 7);
        let report = b.close(Duration::ZERO);
        assert!(
            report
                .undelivered
                .iter()
                .any(|u| u.message.offset() == Some(7))
        );
    }
    // The position written at close: 7 was abandoned (Shutdown), not committed.
    let committed = offset_file(dir.path(), "orders", "billing");
    assert_eq!(committed, 7);

    let run2 = Seen::default();
    let b = broker(dir.path());
    let s = orders(&b);
    let d = b
        .subscribe(
            DurableSpec::new("orders")
                .name("billing")
                .filter("orders.*")
                .start(StartAt::Latest),
            opts(),
            run2.handler(),
        )
        .unwrap();
    // StartAt is ignored: the committed position wins.
    wait_until("redelivery", || run2.len() == 13);
    wait_until("commit", || d.committed() == s.end_offset());
    let (r1, r2): (BTreeSet<u64>, BTreeSet<u64>) = (
        run1.get().into_iter().collect(),
        run2.get().into_iter().collect(),
    );
    let dlq: BTreeSet<u64> = [5].into();
    // R-LOG-3: no acknowledged-then-lost message: every offset succeeded or is in the DLQ.
    let all: BTreeSet<u64> = r1.union(&r2).chain(dlq.iter()).copied().collect();
    assert_eq!(all, (0..20).collect());
    // Duplicates are exactly the finished-but-uncommitted ones (finished at or above 7).
    let dups: BTreeSet<u64> = r1.intersection(&r2).copied().collect();
    let uncommitted: BTreeSet<u64> = r1.iter().copied().filter(|o| *o >= committed).collect();
    assert_eq!(dups, uncommitted);
    assert_eq!(r2, (7..20).collect());
    // The durable DLQ survived the restart.
    assert_eq!(d.durable_dead_letters().unwrap().len(), 1);
}

#[test]
fn replay_from_offset_time_earliest_latest_and_seek() {
    let dir = tempfile::tempdir().unwrap();
    let b = broker(dir.path());
    orders(&b);
    publish_n(&b, "orders.created", 0..10);
    std::thread::sleep(Duration::from_millis(20));
    let t = SystemTime::now();
    std::thread::sleep(Duration::from_millis(5));
    publish_n(&b, "orders.created", 10..20);
    let sub = |name: &str, at: StartAt| {
        let seen = Seen::default();
        let d = b
            .subscribe(
                DurableSpec::new("orders").name(name).start(at),
                Default::default(),
                seen.handler(),
            )
            .unwrap();
        (seen, d)
    };
    // R-LOG-4: by offset, by time (first record at or after), earliest, latest.
    let (by_offset, _d1) = sub("by-offset", StartAt::Offset(3));
    let (by_time, _d2) = sub("by-time", StartAt::Time(t));
    let (earliest, _d3) = sub("earliest", StartAt::Earliest);
    let (latest, d4) = sub("latest", StartAt::Latest);
    wait_until("replays", || {
        by_offset.len() == 17 && by_time.len() == 10 && earliest.len() == 20
    });
    assert_eq!(by_offset.get(), (3..20).collect::<Vec<_>>());
    assert_eq!(by_time.get(), (10..20).collect::<Vec<_>>());
    assert_eq!(earliest.get(), (0..20).collect::<Vec<_>>());
    std::thread::sleep(Duration::from_millis(50));
    assert!(latest.get().is_empty());
    publish_n(&b, "orders.created", 20..21);
    wait_until("latest", || latest.len() == 1);
    assert_eq!(latest.get(), [20]);
    // seek back: redelivered from there, position committed at once.
    assert_eq!(d4.seek(StartAt::Offset(15)).unwrap(), 15);
    assert_eq!(d4.committed(), 15);
    wait_until("seek replay", || latest.len() == 7);
    assert_eq!(latest.get(), [20, 15, 16, 17, 18, 19, 20]);
    assert!(matches!(
        d4.seek(StartAt::Offset(1000)),
        Err(StreamError::BeyondEnd {
            requested: 1000,
            end: 21
        })
    ));
}

#[test]
fn slow_consumer_only_lags_and_lag_shrinks() {
    let dir = tempfile::tempdir().unwrap();
    let b = broker(dir.path());
    orders(&b);
    publish_n(&b, "orders.created", 0..100);
    let gate = Arc::new(AtomicBool::new(false));
    let g = gate.clone();
    let d = b
        .subscribe(
            DurableSpec::new("orders").name("slow"),
            SubscribeOptions::new().capacity(4),
            move |_: &Message| {
                while !g.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Ok::<(), HandlerError>(())
            },
        )
        .unwrap();
    wait_until("window full", || d.outstanding() == 4);
    std::thread::sleep(Duration::from_millis(30));
    // R-BP-2: bounded window, nothing refused; the consumer only lags (R-BP-3: reported).
    assert_eq!(d.outstanding(), 4);
    assert_eq!(d.position(), 4);
    assert_eq!(d.lag(), 100);
    let st = d.stats();
    assert_eq!(st.refused.overflow, 0);
    assert!(st.queued <= 4);
    gate.store(true, Ordering::Release);
    let mut samples = vec![d.lag()];
    wait_until("caught up", || {
        samples.push(d.lag());
        d.lag() == 0
    });
    assert!(
        samples.windows(2).all(|w| w[1] <= w[0]),
        "lag must only shrink: {samples:?}"
    );
    assert_eq!(d.stats().delivered, 100);
}

#[test]
fn out_of_retention_start_is_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let embedded = EmbeddedBackend::new(dir.path()).stream_defaults(
        EmbeddedStreamOptions::new().segment_bytes(tidings_log::MIN_SEGMENT_BYTES),
    );
    let b = Broker::builder()
        .durable_backend(Arc::new(embedded.clone()))
        .build()
        .unwrap();
    let s = b
        .create_stream(
            StreamConfig::new("orders", ["orders.#"]).retention(Retention::new().max_bytes(1)),
        )
        .unwrap();
    publish_n(&b, "orders.created", 0..10);
    // R-LOG-1: the policy already ran at each segment roll, without being asked ...
    assert!(s.start_offset() > 0);
    // ... and an explicit pass finds nothing more to remove.
    let again = embedded
        .apply_retention("orders", SystemTime::now())
        .unwrap();
    assert!(again.removed.is_empty());
    let earliest = s.start_offset();
    assert!(earliest > 0);
    let seen = Seen::default();
    // R-LOG-4: a start that retention removed is refused with the typed error.
    let err = b
        .subscribe(
            DurableSpec::new("orders")
                .name("late")
                .start(StartAt::Offset(0)),
            Default::default(),
            seen.handler(),
        )
        .unwrap_err();
    assert!(
        matches!(err, StreamError::OutOfRetention { requested: 0, earliest: e } if e == earliest),
        "{err}"
    );
    assert_eq!(err.kind(), StreamErrorKind::OutOfRange);
    let d = b
        .subscribe(
            DurableSpec::new("orders").name("ok"),
            Default::default(),
            seen.handler(),
        )
        .unwrap();
    wait_until("retained records", || seen.len() as u64 == 10 - earliest);
    assert!(matches!(
        d.seek(StartAt::Offset(0)),
        Err(StreamError::OutOfRetention { requested: 0, .. })
    ));
}

#[test]
fn foreign_files_are_reported_with_their_path() {
    // R-LIM-2: a corrupt or foreign file is a clear error naming it; no panic.
    let dir = tempfile::tempdir().unwrap();
    let sdir = dir.path().join("streams").join("orders");
    std::fs::create_dir_all(&sdir).unwrap();
    let seg = sdir.join("00000000000000000000.seg");
    std::fs::write(&seg, b"this is not a tidings segment, it is a text file!!").unwrap();
    let b = broker(dir.path());
    let err = b
        .create_stream(StreamConfig::new("orders", ["orders.#"]))
        .unwrap_err();
    assert!(
        matches!(&err, StreamError::Open { source, .. } if source.downcast_ref::<OpenError>().and_then(open_error_path) == Some(&seg)),
        "{err:?}"
    );
    assert_eq!(err.kind(), StreamErrorKind::Corrupt);

    std::fs::remove_file(&seg).unwrap();
    let bad_name = sdir.join("notes.seg");
    std::fs::write(&bad_name, b"x").unwrap();
    let err = b
        .create_stream(StreamConfig::new("orders", ["orders.#"]))
        .unwrap_err();
    assert!(
        matches!(&err, StreamError::Open { source, .. } if matches!(source.downcast_ref::<OpenError>(), Some(OpenError::UnparseableName { path }) if *path == bad_name)),
        "{err:?}"
    );

    // Other foreign files are ignored and listed in the recovery report.
    std::fs::remove_file(&bad_name).unwrap();
    std::fs::write(sdir.join("README.txt"), b"hello").unwrap();
    b.create_stream(StreamConfig::new("orders", ["orders.#"]))
        .unwrap();
    let recovery = b.embedded_backend().unwrap().recovery("orders").unwrap();
    // Only README.txt: the stream's own META file is not foreign (R-LOG-5).
    assert_eq!(recovery.ignored_files, [sdir.join("README.txt")]);

    // A foreign offset file.
    let cdir = dir.path().join("consumers").join("orders");
    std::fs::create_dir_all(&cdir).unwrap();
    std::fs::write(cdir.join("billing.offset"), b"garbage").unwrap();
    let err = b
        .subscribe(
            DurableSpec::new("orders").name("billing"),
            Default::default(),
            Seen::default().handler(),
        )
        .unwrap_err();
    assert!(
        matches!(&err, StreamError::BadOffsetFile { path, .. } if *path == cdir.join("billing.offset")),
        "{err:?}"
    );
    assert_eq!(err.kind(), StreamErrorKind::Corrupt);

    // Bad names never reach the file system.
    assert!(matches!(
        b.create_stream(StreamConfig::new("../etc", ["#"])),
        Err(StreamError::InvalidName { .. })
    ));
}

#[test]
fn a_second_broker_cannot_open_a_stream_in_use() {
    // R-LOG-2: two brokers on one data dir would interleave appends; the second is refused.
    let dir = tempfile::tempdir().unwrap();
    let first = broker(dir.path());
    let _s = orders(&first);
    let second = broker(dir.path());
    let err = second
        .create_stream(StreamConfig::new("orders", ["orders.#"]))
        .unwrap_err();
    assert!(
        matches!(
            &err,
            StreamError::Open { kind: StreamErrorKind::InUse, source, .. }
                if matches!(source.downcast_ref::<OpenError>(), Some(OpenError::Locked { .. }))
        ),
        "{err}"
    );
    first.close(Duration::ZERO);
    // Once the first broker closed, the stream opens with everything it held.
    assert!(
        second
            .create_stream(StreamConfig::new("orders", ["orders.#"]))
            .is_ok()
    );
}

#[test]
fn delayed_records_wait_for_their_time_and_hold_the_commit() {
    // R-TIME-2 on a durable subscription: the record is in the log at publish, but it is
    // delivered when due; its offset is not committed before, so a restart re-schedules it.
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let open = || {
        let b = broker_on(dir.path(), &clock, tidings::Driver::Thread);
        orders(&b);
        b
    };
    let b = open();
    let r = b
        .publish(
            Message::to("orders.later")
                .delay(Duration::from_secs(60))
                .payload("later"),
        )
        .unwrap();
    assert!(r.scheduled && r.streams == ["orders"]);
    b.publish(Message::to("orders.now").payload("now")).unwrap();
    let seen = Seen::default();
    let d = b
        .subscribe(
            DurableSpec::new("orders").name("bill"),
            Default::default(),
            seen.handler(),
        )
        .unwrap();
    wait_until("the immediate record", || seen.get() == [1]);
    assert_eq!(d.committed(), 0, "offset 0 is still waiting for its time"); // R-LOG-3
    // Restart before it is due: the delayed record is read again and scheduled again.
    drop(d);
    b.close(Duration::ZERO);
    drop(b);
    let b = open();
    let again = Seen::default();
    let d = b
        .subscribe(
            DurableSpec::new("orders").name("bill"),
            Default::default(),
            again.handler(),
        )
        .unwrap();
    // Offset 1 finished but was not committable past 0: the one documented duplicate.
    wait_until("the immediate record again", || again.get() == [1]);
    // Its completion reaches the cursor just after the handler returns.
    wait_until("only the delayed record outstanding", || {
        d.outstanding() == 1
    });
    clock.advance(Duration::from_secs(60));
    wait_until("the delayed record when due", || again.get() == [1, 0]);
    wait_until("the commit passes both", || d.committed() == 2);
    assert!(d.stats().is_conserved()); // R-DEL-6
}

#[test]
fn manual_driver_pumps_durable_subscriptions_in_run_until_idle() {
    // R-EXE-2 with a durable source: no pump thread; run_until_idle reads the stream,
    // delivers, retries on the manual clock, and commits — exactly, without waiting.
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let b = broker_on(dir.path(), &clock, tidings::Driver::Manual);
    orders(&b);
    publish_n(&b, "orders.created", 0..6);
    let seen = Seen::default();
    let failed_once = Arc::new(AtomicBool::new(false));
    let (inner, f) = (seen.handler(), failed_once.clone());
    let d = b
        .subscribe(
            DurableSpec::new("orders").name("bill"),
            SubscribeOptions::new()
                .capacity(4)
                .retry(Retry::fixed(Duration::from_secs(5), 3)),
            move |m: &Message| {
                if m.offset() == Some(2) && !f.swap(true, Ordering::SeqCst) {
                    return Err(HandlerError::retry("first try fails"));
                }
                inner(m)
            },
        )
        .unwrap();
    assert_eq!(d.position(), 0, "nothing is read before run_until_idle");
    b.run_until_idle();
    assert_eq!(seen.get(), [0, 1]); // offset 2 waits 5 s to retry, in place
    assert_eq!(d.committed(), 2);
    clock.advance(Duration::from_secs(5));
    b.run_until_idle();
    assert_eq!(seen.get(), [0, 1, 2, 3, 4, 5]);
    assert_eq!((d.committed(), d.lag()), (6, 0)); // R-LOG-3, R-BP-3
    publish_n(&b, "orders.created", 6..8);
    b.run_until_idle();
    assert_eq!(seen.get(), [0, 1, 2, 3, 4, 5, 6, 7]);
    assert_eq!(d.committed(), 8);
    assert!(d.stats().is_conserved()); // R-DEL-6
}
