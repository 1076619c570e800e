//! Typed payloads (R-PAT-3): the JSON codec end to end on the manual driver (exact DLQ
//! contents), hostile payloads, the embedded log (durable, restart), the tokio driver, and
//! composition with `Deduplicating`. Run with `--features serde` (CI: `--all-features`).
#![cfg(feature = "serde")]

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tidings::{
    Broker, CONTENT_TYPE_HEADER, DeadLetterReason, DecodeErrorKind, DedupStore, Deduplicating,
    Driver, DurableSpec, HandlerError, JSON_CONTENT_TYPE, Json, ManualClock, Message, MessageId,
    Retry, StartAt, StreamConfig, SubscribeOptions, Typed, json_handler,
};
use tidings_testkit::helpers::manual;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Order {
    id: u64,
    item: String,
    cents: u32,
}

fn order(id: u64) -> Order {
    Order {
        id,
        item: format!("item-{id}"),
        cents: 1250,
    }
}

/// Retried generously: a decode failure must still be dead-lettered after one attempt.
fn retrying() -> SubscribeOptions {
    SubscribeOptions::new().retry(Retry::fixed(Duration::from_millis(10), 5))
}

type Got = Arc<Mutex<Vec<Order>>>;

/// The text a rejected payload's dead letter carries: our prefix, then serde_json's own.
fn json_error_text<T: serde::de::DeserializeOwned>(payload: &[u8]) -> String {
    let e = serde_json::from_slice::<T>(payload)
        .err()
        .expect("a bad payload");
    format!("cannot decode the application/json payload: {e}")
}

// R-PAT-3: publish typed, handle typed; the content type travels in a header.
#[test]
fn typed_round_trip_on_the_manual_driver() {
    let (broker, _clock) = manual();
    let got: Got = Arc::default();
    let g = got.clone();
    let sub = broker
        .subscribe(
            "orders.*",
            retrying(),
            json_handler(move |o: Order, m: &Message| {
                assert_eq!(m.header(CONTENT_TYPE_HEADER), Some(JSON_CONTENT_TYPE));
                g.lock().push(o);
                Ok(())
            }),
        )
        .unwrap();
    for id in 0..3 {
        let report = broker
            .publish(Message::to("orders.created").json(&order(id)).unwrap())
            .unwrap();
        assert_eq!(report.accepted, 1);
    }
    broker.run_until_idle();
    assert_eq!(*got.lock(), vec![order(0), order(1), order(2)]); // R-PAT-3, R-ORD-1
    assert_eq!(sub.stats().delivered, 3);
    assert!(sub.dead_letters().is_empty());
}

// R-PAT-3 + R-DEL-1: every hostile payload is dead-lettered `Rejected` after exactly one
// attempt with the decoder's error as its last error; the handler never sees it, nothing
// panics, nothing is retried, and the subscription goes on.
#[test]
fn undecodable_payloads_are_rejected_with_the_decoders_error() {
    let (broker, clock) = manual();
    let got: Got = Arc::default();
    let g = got.clone();
    let sub = broker
        .subscribe(
            "orders.*",
            retrying(),
            json_handler(move |o: Order, _: &Message| {
                g.lock().push(o);
                Ok(())
            }),
        )
        .unwrap();
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let deep_in_field = format!(
        "{{\"id\":1,\"item\":\"x\",\"cents\":1,\"extra\":{}1{}}}",
        "[".repeat(50_000),
        "]".repeat(50_000)
    );
    let hostile: Vec<(&str, Vec<u8>, DecodeErrorKind)> = vec![
        ("empty", vec![], DecodeErrorKind::Truncated),
        (
            "truncated",
            br#"{"id":1,"item":"sock"#.to_vec(),
            DecodeErrorKind::Truncated,
        ),
        ("not json", b"hello".to_vec(), DecodeErrorKind::Syntax),
        (
            "wrong shape",
            br#"{"id":"one","item":"sock","cents":1}"#.to_vec(),
            DecodeErrorKind::Data,
        ),
        (
            "missing field",
            br#"{"id":1,"item":"sock"}"#.to_vec(),
            DecodeErrorKind::Data,
        ),
        ("an array", b"[1,2,3]".to_vec(), DecodeErrorKind::Data),
        (
            "u64 overflow",
            br#"{"id":18446744073709551616,"item":"x","cents":1}"#.to_vec(),
            DecodeErrorKind::Data,
        ),
        (
            "u32 overflow",
            br#"{"id":1,"item":"x","cents":4294967296}"#.to_vec(),
            DecodeErrorKind::Data,
        ),
        (
            "huge float",
            br#"{"id":1e400,"item":"x","cents":1}"#.to_vec(),
            DecodeErrorKind::Syntax,
        ),
        (
            "huge digits",
            format!(
                "{{\"id\":{},\"item\":\"x\",\"cents\":1}}",
                "9".repeat(10_000)
            )
            .into_bytes(),
            DecodeErrorKind::Syntax,
        ),
        // A struct also deserializes from a sequence: the first element is the wrong type.
        ("deeply nested", deep.into_bytes(), DecodeErrorKind::Data),
        (
            "not utf-8",
            b"{\"id\":1,\"item\":\"\xff\xfe\",\"cents\":1}".to_vec(),
            DecodeErrorKind::Syntax,
        ),
        (
            "trailing garbage",
            br#"{"id":1,"item":"x","cents":1} tail"#.to_vec(),
            DecodeErrorKind::Syntax,
        ),
    ];
    for (name, payload, kind) in &hostile {
        // The decoder's classification, as `Message::json` reports it.
        let m = Message::to("orders.created")
            .header(CONTENT_TYPE_HEADER, JSON_CONTENT_TYPE)
            .payload(payload.clone())
            .build_detached()
            .unwrap();
        let e = m.json::<Order>().unwrap_err();
        assert_eq!(e.kind(), *kind, "{name}: {e}");
        assert_eq!(e.to_string(), json_error_text::<Order>(payload), "{name}");
        assert!(std::error::Error::source(&e).is_some(), "{name}");
        broker
            .publish(
                Message::to("orders.created")
                    .header(CONTENT_TYPE_HEADER, JSON_CONTENT_TYPE)
                    .payload(payload.clone()),
            )
            .unwrap();
    }
    broker
        .publish(Message::to("orders.created").json(&order(9)).unwrap())
        .unwrap();
    // Deep nesting inside an unknown field is skipped without recursing (no limit, no
    // overflow): that order is valid.
    broker
        .publish(Message::to("orders.created").payload(deep_in_field))
        .unwrap();
    assert!(broker.run_until_idle() > 0);
    // No retry was scheduled: moving time changes nothing (R-DEL-1: Rejected is final).
    assert_eq!(broker.next_wake(), None);
    clock.advance(Duration::from_secs(60));
    broker.run_until_idle();

    let mut skipped_deep = order(1);
    (skipped_deep.item, skipped_deep.cents) = ("x".into(), 1);
    assert_eq!(*got.lock(), vec![order(9), skipped_deep]); // the subscription went on
    let dead = sub.dead_letters();
    assert_eq!(dead.len(), hostile.len());
    for (d, (name, payload, _)) in dead.iter().zip(&hostile) {
        assert_eq!(d.attempts, 1, "{name}"); // R-PAT-3: never retried
        assert_eq!(d.message.payload().as_ref(), payload.as_slice(), "{name}");
        assert_eq!(
            d.reason,
            DeadLetterReason::Rejected {
                error: json_error_text::<Order>(payload)
            },
            "{name}"
        );
    }
    let stats = sub.stats();
    assert_eq!(stats.delivered, 2);
    assert_eq!(stats.attempts, hostile.len() as u64 + 2);
}

// R-PAT-3 + R-LIM-1: input nested deeper than serde_json's recursion limit (128) is a
// decode error, not a stack overflow, for a type that really recurses: a JSON value, and
// a recursive type of the user's own.
#[test]
fn nesting_past_the_recursion_limit_is_an_error_not_a_stack_overflow() {
    #[derive(Debug, Deserialize)]
    #[allow(dead_code)] // read by Debug only
    struct Tree {
        children: Vec<Tree>,
    }
    let (broker, _clock) = manual();
    let values = broker
        .subscribe(
            "deep",
            retrying(),
            json_handler(|_: serde_json::Value, _: &Message| Ok(())),
        )
        .unwrap();
    let trees = broker
        .subscribe(
            "deep",
            retrying(),
            json_handler(|_: Tree, _: &Message| Ok(())),
        )
        .unwrap();
    let arrays = format!("{}{}", "[".repeat(1_000_000), "]".repeat(1_000_000));
    let tree = format!(
        "{}{}",
        "{\"children\":[".repeat(100_000),
        "]}".repeat(100_000)
    );
    let shallow = format!("{}{}", "{\"children\":[".repeat(50), "]}".repeat(50));
    for payload in [&arrays, &tree, &shallow] {
        broker
            .publish(Message::to("deep").payload(payload.clone()))
            .unwrap();
    }
    broker.run_until_idle();
    let e = Message::to("deep")
        .payload(arrays.clone())
        .build_detached()
        .unwrap()
        .json::<serde_json::Value>()
        .unwrap_err();
    assert_eq!(e.kind(), DecodeErrorKind::Syntax);
    assert_eq!(e.message(), "recursion limit exceeded");
    // Values: the two deep ones rejected, the shallow one (100 levels: 50 objects, 50 arrays) delivered.
    assert_eq!(values.stats().delivered, 1);
    let dead = values.dead_letters();
    assert_eq!(dead.len(), 2);
    for d in &dead {
        assert_eq!(d.attempts, 1);
        assert!(
            d.last_error().unwrap().contains("recursion limit exceeded"),
            "{:?}",
            d.last_error()
        );
    }
    // The user's recursive type: the tree is too deep, the sequence is the wrong shape.
    assert_eq!(trees.stats().delivered, 1);
    let dead = trees.dead_letters();
    assert_eq!(dead.len(), 2);
    assert_eq!(
        dead[0].last_error(),
        Some(json_error_text::<Tree>(arrays.as_bytes()).as_str())
    );
    assert!(
        dead[1]
            .last_error()
            .unwrap()
            .contains("recursion limit exceeded"),
        "{:?}",
        dead[1].last_error()
    );
}

// R-PAT-3: a `content-type` of another format is rejected without decoding, naming both
// types; a `+json` type or parameters are accepted; no header at all is decoded anyway.
#[test]
fn content_type_mismatch_is_rejected_naming_both_types() {
    let (broker, _clock) = manual();
    let got: Got = Arc::default();
    let g = got.clone();
    let sub = broker
        .subscribe(
            "orders.*",
            retrying(),
            json_handler(move |o: Order, _: &Message| {
                g.lock().push(o);
                Ok(())
            }),
        )
        .unwrap();
    let valid = serde_json::to_vec(&order(1)).unwrap();
    let publish = |ct: Option<&str>| {
        let mut b = Message::to("orders.created").payload(valid.clone());
        if let Some(ct) = ct {
            b = b.header(CONTENT_TYPE_HEADER, ct);
        }
        broker.publish(b).unwrap();
    };
    publish(Some("text/plain")); // a valid JSON body that says it is not JSON
    publish(Some("application/vnd.shop.order+json; v=1"));
    publish(Some("Application/JSON;charset=utf-8"));
    publish(None);
    broker.run_until_idle();
    assert_eq!(*got.lock(), vec![order(1), order(1), order(1)]);
    let dead = sub.dead_letters();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].attempts, 1);
    assert_eq!(
        dead[0].last_error(),
        Some(
            "cannot decode the application/json payload: the message's content-type is \
             \"text/plain\", not \"application/json\""
        )
    );
    let e = dead[0].message.json::<Order>().unwrap_err();
    assert_eq!(e.kind(), DecodeErrorKind::ContentType);
    assert_eq!(e.found_content_type(), Some("text/plain"));
    assert_eq!(e.codec_content_type(), JSON_CONTENT_TYPE);
}

// R-PAT-3: `json()` sets the header once, replacing an earlier content type, and the
// header name is not a reserved one (publish accepts it).
#[test]
fn json_builder_sets_one_content_type() {
    let m = Message::to("t")
        .header("content-type", "text/plain")
        .header("x-other", "1")
        .json(&order(1))
        .unwrap()
        .build_detached()
        .unwrap();
    let content_types: Vec<_> = m
        .headers()
        .iter()
        .filter(|(k, _)| *k == CONTENT_TYPE_HEADER)
        .collect();
    assert_eq!(content_types, vec![("content-type", "application/json")]);
    assert_eq!(m.header("x-other"), Some("1"));
    assert_eq!(m.json::<Order>().unwrap(), order(1));
    let (broker, _clock) = manual();
    assert!(
        broker
            .publish(Message::to("t").json(&order(1)).unwrap())
            .is_ok()
    );
}

// R-PAT-3 + R-DEL-1: an error the typed handler returns is retried as usual (only decode
// failures are final), and a panic in it is caught.
#[test]
fn handler_errors_after_decoding_follow_the_retry_policy() {
    let (broker, _clock) = manual();
    let sub = broker
        .subscribe(
            "orders.*",
            retrying(),
            json_handler(|o: Order, _: &Message| {
                if o.id == 1 {
                    panic!("order 1 panics");
                }
                Err(HandlerError::retry(format!("order {} failed", o.id)))
            }),
        )
        .unwrap();
    broker
        .publish(Message::to("orders.a").json(&order(0)).unwrap())
        .unwrap();
    broker
        .publish(Message::to("orders.b").json(&order(1)).unwrap())
        .unwrap();
    broker.settle();
    let dead = sub.dead_letters();
    assert_eq!(dead.len(), 2);
    assert_eq!(
        dead[0].reason,
        DeadLetterReason::RetriesExhausted {
            attempts: 5,
            last_error: "order 0 failed".into()
        }
    );
    assert_eq!(dead[1].attempts, 5);
    assert!(dead[1].last_error().unwrap().contains("order 1 panics"));
}

// R-PAT-3 + R-DEL-5: the typed adaptor composes with `Deduplicating`: a redelivered id is
// skipped before decoding; a rejected (undecodable) message is not recorded.
#[test]
fn typed_composes_with_deduplicating() {
    let (broker, _clock) = manual();
    let got: Got = Arc::default();
    let g = got.clone();
    let handler = Arc::new(Deduplicating::new(json_handler(
        move |o: Order, _: &Message| {
            g.lock().push(o);
        },
    )));
    let sub = broker
        .subscribe("orders.*", retrying(), handler.clone())
        .unwrap();
    let id = MessageId::new();
    for _ in 0..3 {
        broker
            .publish(Message::to("orders.a").id(id).json(&order(4)).unwrap())
            .unwrap();
    }
    let bad = MessageId::new();
    broker
        .publish(Message::to("orders.a").id(bad).payload("{"))
        .unwrap();
    broker.run_until_idle();
    assert_eq!(*got.lock(), vec![order(4)]);
    assert_eq!(handler.skipped(), 2);
    assert!(!handler.store().contains(bad));
    assert_eq!(sub.dead_letters().len(), 1);
}

// R-PAT-3 + R-EXE-3: `Typed` with a codec spelled out behaves like `json_handler`.
#[test]
fn typed_new_with_json_is_json_handler() {
    let (broker, _clock) = manual();
    let sub = broker
        .subscribe(
            "t",
            SubscribeOptions::default(),
            Typed::new(Json, |v: Vec<u32>, _: &Message| {
                assert_eq!(v, [1, 2]);
            }),
        )
        .unwrap();
    broker
        .publish(Message::to("t").json(&[1u32, 2]).unwrap())
        .unwrap();
    broker.publish(Message::to("t").payload("[-1]")).unwrap();
    broker.run_until_idle();
    assert_eq!(sub.stats().delivered, 1);
    assert!(matches!(
        sub.dead_letters()[0].reason,
        DeadLetterReason::Rejected { .. }
    ));
}

/// A broker on `dir` with the manual driver and clock.
fn durable_broker(dir: &std::path::Path, clock: &ManualClock) -> Broker {
    Broker::builder()
        .data_dir(dir)
        .clock(clock.clone())
        .driver(Driver::Manual)
        .build()
        .unwrap()
}

// R-PAT-3 + R-LOG-3: on the embedded log, typed payloads and their content type survive
// the log and a restart; an undecodable record is dead-lettered `Rejected` in the durable
// DLQ with the decoder's error and committed past, so the restart does not see it again.
#[test]
fn durable_json_on_the_embedded_log_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let got: Got = Arc::default();
    let spec = || DurableSpec::new("orders").name("billing");
    {
        let broker = durable_broker(dir.path(), &clock);
        broker
            .create_stream(StreamConfig::new("orders", ["orders.#"]))
            .unwrap();
        let g = got.clone();
        let sub = broker
            .subscribe(
                spec(),
                retrying(),
                json_handler(move |o: Order, m: &Message| {
                    assert_eq!(m.header(CONTENT_TYPE_HEADER), Some(JSON_CONTENT_TYPE));
                    g.lock().push(o);
                    Ok(())
                }),
            )
            .unwrap();
        broker
            .publish(Message::to("orders.created").json(&order(1)).unwrap())
            .unwrap();
        broker
            .publish(
                Message::to("orders.created")
                    .header(CONTENT_TYPE_HEADER, JSON_CONTENT_TYPE)
                    .payload("[1,"),
            )
            .unwrap();
        broker
            .publish(Message::to("orders.created").json(&order(2)).unwrap())
            .unwrap();
        broker.settle();
        assert_eq!(*got.lock(), vec![order(1), order(2)]);
        let dead = sub.durable_dead_letters().unwrap();
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].attempts, 1);
        assert_eq!(dead[0].message.offset(), Some(1));
        assert_eq!(
            dead[0].reason,
            DeadLetterReason::Rejected {
                error: json_error_text::<Order>(b"[1,")
            }
        );
        // The content type was stored with the record (R-PAT-3: it travels).
        assert_eq!(
            dead[0].message.header(CONTENT_TYPE_HEADER),
            Some(JSON_CONTENT_TYPE)
        );
        assert_eq!(sub.committed(), 3);
        assert!(broker.close(Duration::from_secs(1)).is_clean());
    }
    got.lock().clear();
    {
        let broker = durable_broker(dir.path(), &clock);
        broker
            .create_stream(StreamConfig::new("orders", ["orders.#"]))
            .unwrap();
        broker
            .publish(Message::to("orders.created").json(&order(3)).unwrap())
            .unwrap();
        let g = got.clone();
        let resumed = broker
            .subscribe(
                spec(),
                retrying(),
                json_handler(move |o: Order, _: &Message| {
                    g.lock().push(o);
                    Ok(())
                }),
            )
            .unwrap();
        // A second reader from the start decodes the stored records again, header and all.
        let replayed: Got = Arc::default();
        let r = replayed.clone();
        let _replay = broker
            .subscribe(
                spec().name("audit").start(StartAt::Earliest),
                SubscribeOptions::new().retry(Retry::None),
                json_handler(move |o: Order, _: &Message| {
                    r.lock().push(o);
                }),
            )
            .unwrap();
        broker.settle();
        // R-LOG-3: resumed after the committed position; the poison record is not redelivered.
        assert_eq!(*got.lock(), vec![order(3)]);
        assert_eq!(resumed.durable_dead_letters().unwrap().len(), 1);
        assert_eq!(*replayed.lock(), vec![order(1), order(2), order(3)]);
        assert!(broker.close(Duration::from_secs(1)).is_clean());
    }
}

// R-PAT-3 + R-EXE-3: the async form on a live tokio driver: typed delivery, and a bad
// payload dead-lettered `Rejected` without the handler being called.
#[cfg(feature = "tokio")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_json_on_the_tokio_driver() {
    let broker = Broker::builder()
        .driver(Driver::Tokio(tokio::runtime::Handle::current()))
        .build()
        .unwrap();
    let got: Got = Arc::default();
    let g = got.clone();
    let sub = broker
        .subscribe(
            "orders.*",
            retrying(),
            json_handler(move |o: Order, m: Arc<Message>| {
                let g = g.clone();
                async move {
                    assert_eq!(m.header(CONTENT_TYPE_HEADER), Some(JSON_CONTENT_TYPE));
                    tokio::task::yield_now().await;
                    g.lock().push(o);
                    Ok(())
                }
            }),
        )
        .unwrap();
    broker
        .publish_async(Message::to("orders.a").json(&order(1)).unwrap())
        .await
        .unwrap();
    broker
        .publish_async(Message::to("orders.a").payload(&b"\xff"[..]))
        .await
        .unwrap();
    broker
        .publish_async(Message::to("orders.a").json(&order(2)).unwrap())
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while sub.stats().delivered + sub.stats().dlq_len < 3 {
        assert!(std::time::Instant::now() < deadline, "not delivered");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(*got.lock(), vec![order(1), order(2)]);
    let dead = sub.dead_letters();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].attempts, 1);
    assert_eq!(
        dead[0].reason,
        DeadLetterReason::Rejected {
            error: json_error_text::<Order>(b"\xff")
        }
    );
    assert!(broker.close_async(Duration::from_secs(5)).await.is_clean());
}

// R-PAT-3: the new public types can cross threads (errors into `Box<dyn Error + Send +
// Sync>`, handlers into any driver).
#[test]
fn public_types_are_send_and_sync() {
    fn send_sync<T: Send + Sync + 'static>() {}
    send_sync::<tidings::DecodeError>();
    send_sync::<tidings::EncodeError>();
    send_sync::<Json>();
    send_sync::<Typed<Json, Order, fn(Order, &Message)>>();
    // `Typed` is Send + Sync whatever `T` is: it never holds one.
    send_sync::<Typed<Json, std::rc::Rc<u8>, fn(std::rc::Rc<u8>, &Message)>>();
    #[cfg(feature = "tokio")]
    send_sync::<tidings::Timeout<fn(Arc<Message>) -> tidings::HandlerFuture<'static>>>();
}
