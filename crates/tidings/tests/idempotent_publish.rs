//! Idempotent publish on the embedded log (R-DEL-7): a message published again with its id
//! within the stream's duplicate window is stored once — also across a restart, the window
//! being rebuilt from the log's tail — and the publish report says which streams already
//! held it. Past the window it is stored again. The window follows the broker's clock: a
//! `ManualClock` steps past it, so every case here is deterministic.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use tidings::embedded::{EmbeddedBackend, EmbeddedStreamOptions};
use tidings::{
    Broker, DEFAULT_DUPLICATE_WINDOW, Driver, DurableSpec, ManualClock, Message, MessageId,
    Retention, StreamConfig, StreamError, StreamErrorKind, SubscribeOptions,
};

const STREAM: &str = "orders";

fn broker_with(dir: &Path, clock: &ManualClock, options: EmbeddedStreamOptions) -> Broker {
    Broker::builder()
        .durable_backend(Arc::new(EmbeddedBackend::new(dir).stream_defaults(options)))
        .clock(clock.clone())
        .driver(Driver::Manual)
        .build()
        .expect("broker")
}

fn broker(dir: &Path, clock: &ManualClock) -> Broker {
    broker_with(dir, clock, EmbeddedStreamOptions::new())
}

fn config() -> StreamConfig {
    StreamConfig::new(STREAM, ["orders.#"])
}

fn publish(b: &Broker, id: MessageId, payload: &str) -> tidings::PublishReport {
    b.publish(
        Message::to("orders.created")
            .id(id)
            .payload(payload.to_owned()),
    )
    .expect("publish")
}

fn payloads(b: &Broker) -> Vec<String> {
    let s = b.stream(STREAM).expect("open");
    s.read(s.start_offset(), 1_000)
        .expect("read")
        .iter()
        .map(|m| String::from_utf8_lossy(m.payload()).into_owned())
        .collect()
}

// R-DEL-7: the retry recipe. A publish retried with its id — in the same process, then
// after a restart — is stored once and reported as a duplicate; after the window it is a
// new message again (documented: the window is the limit of the recipe).
#[test]
fn a_retried_publish_is_stored_once_across_a_restart_and_again_after_the_window() {
    let dir = tempfile::tempdir().unwrap();
    let id = MessageId::new();
    {
        let clock = ManualClock::new();
        let b = broker(dir.path(), &clock);
        b.create_stream(config()).unwrap();
        let first = publish(&b, id, "order 1");
        assert_eq!(first.streams, [STREAM]);
        assert!(!first.is_duplicate());
        clock.advance(Duration::from_secs(30));
        let again = publish(&b, id, "order 1 (retry)");
        assert_eq!(again.streams, [STREAM], "the stream holds it");
        assert_eq!(
            again.duplicate_in,
            [STREAM],
            "R-DEL-7: reported as held already"
        );
        assert_eq!(payloads(&b), ["order 1"]);
        b.close(Duration::from_secs(5));
    }
    // A restart: the window is rebuilt from the log's tail.
    let clock = ManualClock::new();
    let b = broker(dir.path(), &clock);
    b.create_stream(config()).unwrap();
    clock.advance(Duration::from_secs(60));
    assert_eq!(
        publish(&b, id, "order 1 (after restart)").duplicate_in,
        [STREAM]
    );
    assert_eq!(
        payloads(&b),
        ["order 1"],
        "R-DEL-7: stored once across the restart"
    );
    // Past the window (by the broker's clock): a new message.
    clock.advance(DEFAULT_DUPLICATE_WINDOW);
    let late = publish(&b, id, "order 1 (too late)");
    assert!(!late.is_duplicate());
    assert_eq!(payloads(&b), ["order 1", "order 1 (too late)"]);
    // ... and that copy is the one a retry now finds.
    let s = b.stream(STREAM).unwrap();
    assert_eq!(s.end_offset(), 2);
    assert!(publish(&b, id, "order 1 (retry again)").is_duplicate());
    assert_eq!(s.end_offset(), 2);
    b.close(Duration::from_secs(5));
}

// R-DEL-7: buffered subscriptions are not the stream's — they still receive a duplicate
// publish; a durable subscription gets the message once (nothing new was stored).
#[test]
fn buffered_subscribers_still_receive_a_duplicate_durable_ones_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let b = broker(dir.path(), &clock);
    b.create_stream(config()).unwrap();
    let buffered = Arc::new(Mutex::new(0));
    let durable = Arc::new(Mutex::new(0));
    let _plain = {
        let n = buffered.clone();
        b.subscribe(
            "orders.*",
            SubscribeOptions::default(),
            move |_: &Message| {
                *n.lock() += 1;
                Ok(())
            },
        )
        .unwrap()
    };
    let _kept = {
        let n = durable.clone();
        b.subscribe(
            DurableSpec::new(STREAM).name("billing"),
            SubscribeOptions::default(),
            move |_: &Message| {
                *n.lock() += 1;
                Ok(())
            },
        )
        .unwrap()
    };
    let id = MessageId::new();
    let first = publish(&b, id, "x");
    let again = publish(&b, id, "x");
    assert_eq!((first.accepted, again.accepted), (1, 1));
    assert!(again.is_duplicate());
    b.run_until_idle();
    assert_eq!(
        *buffered.lock(),
        2,
        "R-DEL-7: buffered subscribers get both publishes"
    );
    assert_eq!(*durable.lock(), 1, "R-DEL-7: the stream stored one");
    b.close(Duration::from_secs(5));
}

// R-DEL-7: `Duration::ZERO` turns the window off: every append is stored, before and after
// a restart.
#[test]
fn a_zero_window_is_off() {
    let dir = tempfile::tempdir().unwrap();
    let id = MessageId::new();
    let clock = ManualClock::new();
    for round in 0..2 {
        let b = broker(dir.path(), &clock);
        b.create_stream(config().duplicate_window(Duration::ZERO))
            .unwrap();
        for _ in 0..2 {
            assert!(!publish(&b, id, "x").is_duplicate());
        }
        assert_eq!(payloads(&b).len(), 2 * (round + 1));
        b.close(Duration::from_secs(5));
    }
}

// R-DEL-7: `Duration::MAX` does not overflow and is bounded by the entry cap (in memory
// and when rebuilt at open): the most recent ids are kept, older ones are forgotten.
#[test]
fn an_endless_window_is_bounded_by_the_entry_cap() {
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<MessageId> = (0..10).map(|_| MessageId::new()).collect();
    let options = EmbeddedStreamOptions::new().duplicate_window_entries(3);
    let clock = ManualClock::new();
    {
        let b = broker_with(dir.path(), &clock, options.clone());
        b.create_stream(config().duplicate_window(Duration::MAX))
            .unwrap();
        for (i, id) in ids.iter().enumerate() {
            publish(&b, *id, &format!("m{i}"));
        }
        clock.advance(Duration::from_secs(100 * 365 * 86_400));
        assert!(publish(&b, ids[9], "again").is_duplicate(), "kept");
        assert!(publish(&b, ids[7], "again").is_duplicate(), "kept");
        b.close(Duration::from_secs(5));
    }
    let b = broker_with(dir.path(), &clock, options);
    b.create_stream(config().duplicate_window(Duration::MAX))
        .unwrap();
    assert!(publish(&b, ids[8], "again").is_duplicate(), "rebuilt");
    assert!(
        !publish(&b, ids[0], "again").is_duplicate(),
        "pushed out by the cap: stored again (documented)"
    );
    assert_eq!(payloads(&b).len(), 11);
    b.close(Duration::from_secs(5));
}

// R-DEL-7: the rebuild at open reads only what it understands: records written by another
// producer (no tidings metadata, or foreign bytes where it would be) are skipped, the
// stream opens, and the ids around them are still recognised.
#[test]
fn foreign_records_at_the_tail_do_not_stop_the_rebuild() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let (before, after) = (MessageId::new(), MessageId::new());
    let stream_dir = {
        let b = broker(dir.path(), &clock);
        b.create_stream(config()).unwrap();
        publish(&b, before, "before");
        let stream_dir = b.embedded_backend().unwrap().stream_dir(STREAM);
        b.close(Duration::from_secs(5));
        stream_dir
    };
    {
        let (log, _) = tidings_log::Log::open(&stream_dir, tidings_log::LogConfig::default())
            .expect("open the stream's log directly");
        let foreign = |headers: Vec<(String, Bytes)>| tidings_log::Record {
            timestamp_ms: 0,
            key: None,
            headers,
            payload: Bytes::from_static(b"foreign"),
        };
        log.append(&foreign(Vec::new())).unwrap();
        log.append(&foreign(vec![(
            "tidings-msg".to_owned(),
            Bytes::from_static(&[9, 9]),
        )]))
        .unwrap();
        log.append(&foreign(vec![("tidings-msg".to_owned(), Bytes::new())]))
            .unwrap();
        log.append(&foreign(vec![(
            "other".to_owned(),
            Bytes::from_static(&[1; 40]),
        )]))
        .unwrap();
        log.close().unwrap();
    }
    {
        let b = broker(dir.path(), &clock);
        b.create_stream(config()).unwrap();
        publish(&b, after, "after");
        b.close(Duration::from_secs(5));
    }
    let b = broker(dir.path(), &clock);
    let s = b
        .create_stream(config())
        .expect("opens over foreign records");
    let end = s.end_offset();
    assert_eq!(end, 6);
    assert!(publish(&b, before, "x").is_duplicate());
    assert!(publish(&b, after, "x").is_duplicate());
    assert_eq!(s.end_offset(), end);
    b.close(Duration::from_secs(5));
}

// R-DEL-7, R-LOG-5: an existing stream opened with another window is refused, naming both;
// nothing changes.
#[test]
fn another_window_than_the_streams_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let b = broker(dir.path(), &clock);
    b.create_stream(config().duplicate_window(Duration::from_secs(10)))
        .unwrap();
    b.close(Duration::from_secs(5));
    let b = broker(dir.path(), &clock);
    let err = b.create_stream(config()).unwrap_err();
    assert!(
        matches!(
            &err,
            StreamError::ConfigMismatch { setting: "duplicate_window", existing, requested, .. }
                if existing == "10s" && requested == "120s"
        ),
        "{err:?}"
    );
    assert_eq!(err.kind(), StreamErrorKind::ConfigMismatch);
    b.create_stream(config().duplicate_window(Duration::from_secs(10)))
        .expect("the stream's own window opens it");
    b.close(Duration::from_secs(5));
}

// R-DEL-7: the default window is JetStream's: two minutes, or the retention's max_age
// when that is shorter.
#[test]
fn the_default_window_is_two_minutes_or_max_age() {
    assert_eq!(
        config().duplicate_window_duration(),
        Duration::from_secs(120)
    );
    let short = config().retention(Retention::new().max_age(Duration::from_secs(30)));
    assert_eq!(short.duplicate_window_duration(), Duration::from_secs(30));
    assert_eq!(
        short
            .duplicate_window(Duration::from_secs(600))
            .duplicate_window_duration(),
        Duration::from_secs(600),
        "an explicit window is kept"
    );
}
