//! `DurableSpec`, the durable target of `Broker::subscribe`, on the embedded log
//! (R-LOG-3, R-LOG-4): its defaults and the name it requires.
//!
//! Manual driver and clock: `run_until_idle` delivers in the test's thread.

use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;
use tidings::{
    Broker, Driver, DurableSpec, HandlerError, ManualClock, Message, StartAt, StreamConfig,
    StreamError, SubscribeOptions,
};

fn broker(dir: &Path) -> Broker {
    Broker::builder()
        .data_dir(dir)
        .clock(ManualClock::new())
        .driver(Driver::Manual)
        .build()
        .unwrap()
}

/// Records the topics a handler saw, in order.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<String>>>);

impl Seen {
    fn handler(&self) -> impl Fn(&Message) -> Result<(), HandlerError> + Send + Sync + 'static {
        let seen = self.0.clone();
        move |m: &Message| {
            seen.lock().push(m.topic().as_str().to_owned());
            Ok(())
        }
    }
    fn get(&self) -> Vec<String> {
        self.0.lock().clone()
    }
}

/// A stream capturing two patterns, and one message of each published before anyone
/// subscribed, then one more of each.
fn two_pattern_stream(b: &Broker) -> Vec<String> {
    b.create_stream(StreamConfig::new("shop", ["orders.#", "refunds.*"]))
        .unwrap();
    let topics = [
        "orders.created",
        "refunds.issued",
        "orders.eu.paid",
        "refunds.denied",
    ];
    for t in topics {
        assert_eq!(b.publish(Message::to(t)).unwrap().streams, ["shop"]);
    }
    topics.iter().map(|t| (*t).to_owned()).collect()
}

#[test]
fn default_filter_reads_every_message_of_the_stream_from_the_earliest() {
    let dir = tempfile::tempdir().unwrap();
    let b = broker(dir.path());
    let published = two_pattern_stream(&b);
    let seen = Seen::default();
    // Neither a filter nor a start: every message of both patterns, from the first one,
    // although all were published before the subscription existed.
    let d = b
        .subscribe(
            DurableSpec::new("shop").name("audit"),
            SubscribeOptions::default(),
            seen.handler(),
        )
        .unwrap();
    b.run_until_idle();
    // R-LOG-3: the default filter is the whole stream, whichever pattern captured a message;
    // R-LOG-4: the default start is the earliest retained record.
    assert_eq!(seen.get(), published);
    assert_eq!(d.durable_name(), "audit");
    assert_eq!(d.stream(), "shop");
    assert_eq!(d.subscription().pattern().as_str(), "#");
    // The durable name keys the committed position; the subscription's own name (options,
    // snapshot) is derived from it and reached through the accessor, not confused with it.
    assert_eq!(d.subscription().name(), "durable:shop/audit");
    assert_eq!(d.id(), d.subscription().id());
    b.publish(Message::to("refunds.late")).unwrap();
    b.run_until_idle();
    assert_eq!(seen.get().last().map(String::as_str), Some("refunds.late"));
    assert_eq!(d.commit().unwrap(), 5);
    assert_eq!(d.stats().delivered, 5);
}

#[test]
fn explicit_filter_and_start_narrow_the_default() {
    let dir = tempfile::tempdir().unwrap();
    let b = broker(dir.path());
    two_pattern_stream(&b);
    let seen = Seen::default();
    let spec = DurableSpec::new("shop")
        .name("refunds")
        .filter("refunds.*")
        .start(StartAt::Offset(2));
    // A spec is a plain value: it can be kept, printed and reused.
    let again = spec.clone();
    assert!(format!("{spec:?}").contains("refunds.*"));
    let d = b
        .subscribe(spec, SubscribeOptions::default(), seen.handler())
        .unwrap();
    b.run_until_idle();
    // R-LOG-4: from offset 2; R-LOG-3: only the filter's topics.
    assert_eq!(seen.get(), ["refunds.denied"]);
    drop(d);
    // The same name resumes where it committed; the start is ignored then (R-LOG-3).
    b.publish(Message::to("refunds.late")).unwrap();
    let d = b
        .subscribe(again, SubscribeOptions::default(), seen.handler())
        .unwrap();
    b.run_until_idle();
    assert_eq!(seen.get(), ["refunds.denied", "refunds.late"]);
    assert_eq!(d.committed(), 5);
}

#[test]
fn a_missing_or_empty_name_is_refused_as_an_invalid_name() {
    let dir = tempfile::tempdir().unwrap();
    let b = broker(dir.path());
    two_pattern_stream(&b);
    for spec in [DurableSpec::new("shop"), DurableSpec::new("shop").name("")] {
        let err = b
            .subscribe(spec, SubscribeOptions::default(), |_: &Message| Ok(()))
            .unwrap_err();
        // R-LIM-1: a typed error naming what was refused, never a panic.
        assert!(
            matches!(
                &err,
                StreamError::InvalidName { what: "durable subscription", name, .. } if name.is_empty()
            ),
            "{err:?}"
        );
    }
    // The name is checked before the stream: a missing name is reported as such.
    assert!(matches!(
        b.subscribe(
            DurableSpec::new("nowhere"),
            SubscribeOptions::default(),
            |_: &Message| Ok(())
        ),
        Err(StreamError::InvalidName { .. })
    ));
    // A name is all it takes.
    b.subscribe(
        DurableSpec::new("shop").name("ok"),
        SubscribeOptions::default(),
        |_: &Message| Ok(()),
    )
    .unwrap();
}
