//! Hostile and extreme input at the API: durations that overflow a deadline, names that
//! cannot become thread names, unpublishable dead-letter topics, oversized correlation ids,
//! inconsistent configuration. Typed errors or "never", no panics (R-LIM-1); and expiry
//! checked before retries (R-TIME-1).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tidings::*;
use tidings_testkit::helpers::{Recorder, manual, text};

const MS: Duration = Duration::from_millis(1);

/// Fails every message whose payload is "bad"; records the others.
fn failing_bad(
    rec: &Recorder,
) -> impl Fn(&Message) -> Result<(), HandlerError> + Send + Sync + 'static {
    let ok = rec.handler();
    move |m: &Message| {
        if m.payload().as_ref() == b"bad" {
            Err(HandlerError::retry("bad payload"))
        } else {
            ok(m)
        }
    }
}

fn config_setting(err: &SubscribeError) -> Option<&'static str> {
    match err {
        SubscribeError::InvalidOptions(ConfigError::Invalid { setting, .. }) => Some(setting),
        _ => None,
    }
}

#[test]
fn duration_max_ttl_means_never_expires() {
    let (broker, clock) = manual();
    let rec = Recorder::default();
    let sub = broker
        .subscribe(
            "t",
            SubscribeOptions::new().ttl(Duration::MAX),
            rec.handler(),
        )
        .unwrap();
    broker
        .publish(Message::to("t").payload("own").ttl(Duration::MAX))
        .unwrap(); // R-LIM-1: no overflow panic
    broker.publish(Message::to("t").payload("default")).unwrap();
    clock.advance(Duration::from_secs(100 * 365 * 24 * 3600));
    broker.run_until_idle();
    assert_eq!(rec.take(), vec!["own", "default"]); // R-LIM-1: a far expiry is "never"
    let s = sub.stats();
    assert_eq!(s.dead_lettered.expired, 0);
    assert!(s.is_conserved()); // R-DEL-6
}

#[test]
fn duration_max_delay_is_refused_with_a_typed_error() {
    let (broker, _clock) = manual();
    let err = broker
        .publish(Message::to("t").payload("x").delay(Duration::MAX))
        .unwrap_err();
    // R-LIM-1: refused (such a message could never be delivered), not a panic.
    assert!(
        matches!(err, PublishError::DelayTooLong { delay } if delay == Duration::MAX),
        "{err:?}"
    );
    assert_eq!(broker.scheduled(), 0);
    // A long but representable delay is still scheduled.
    let r = broker
        .publish(Message::to("t").delay(Duration::from_secs(10 * 365 * 24 * 3600)))
        .unwrap();
    assert!(r.scheduled);
}

/// A retry wait whose deadline is not representable would never come due: the message
/// is dead-lettered at once, and the subscription goes on.
fn overflowing_retry_is_dead_lettered(retry: Retry) {
    let (broker, _clock) = manual();
    let rec = Recorder::default();
    let sub = broker
        .subscribe("t", SubscribeOptions::new().retry(retry), failing_bad(&rec))
        .unwrap();
    broker.publish(Message::to("t").payload("bad")).unwrap();
    broker.publish(Message::to("t").payload("good")).unwrap();
    broker.run_until_idle(); // R-LIM-1: no panic
    assert_eq!(rec.take(), vec!["good"]);
    let dlq = sub.dead_letters();
    assert_eq!(dlq.len(), 1);
    assert!(matches!(
        &dlq[0].reason,
        DeadLetterReason::RetriesExhausted { attempts: 1, .. }
    ));
    let s = sub.stats();
    assert_eq!((s.in_flight, s.queued), (0, 0));
    assert!(s.is_conserved()); // R-DEL-6
}

#[test]
fn retry_fixed_duration_max_does_not_panic() {
    overflowing_retry_is_dead_lettered(Retry::fixed(Duration::MAX, 3)); // R-LIM-1
}

#[test]
fn retry_exponential_duration_max_does_not_panic() {
    // "cannot convert float seconds to Duration" before: the float wait overflowed.
    overflowing_retry_is_dead_lettered(
        Retry::exponential(Duration::MAX, 1.0).max_delay(Duration::MAX), // R-LIM-1
    );
}

#[test]
fn retry_exponential_growth_saturates_at_max() {
    let (broker, clock) = manual();
    let attempts = Arc::new(AtomicU32::new(0));
    let a = attempts.clone();
    let sub = broker
        .subscribe(
            "t",
            SubscribeOptions::new().retry(
                Retry::exponential(Duration::from_secs(1), 1e300)
                    .max_delay(Duration::from_secs(60))
                    .max_attempts(4),
            ),
            move |_m: &Message| {
                a.fetch_add(1, Ordering::SeqCst);
                Err::<(), _>(HandlerError::retry("no"))
            },
        )
        .unwrap();
    broker.publish(Message::to("t")).unwrap();
    let waits = tidings_testkit::helpers::drive(&broker, &clock);
    // R-LIM-1: a multiplier that overflows f64 is capped at max, never a panic.
    assert_eq!(
        waits,
        vec![
            Duration::from_secs(1),
            Duration::from_secs(60),
            Duration::from_secs(60)
        ]
    );
    assert_eq!(attempts.load(Ordering::SeqCst), 4);
    assert!(sub.stats().is_conserved()); // R-DEL-6
}

#[test]
fn subscription_names_are_validated_under_the_thread_driver() {
    let broker = Broker::new(); // thread driver
    let named = |name: &str| SubscribeOptions::new().name(name.to_owned());
    let ok = |_m: &Message| Ok::<(), HandlerError>(());
    for bad in ["a\0b", "", "line\nbreak", &"n".repeat(201)] {
        let err = broker.subscribe("t", named(bad), ok).unwrap_err();
        assert_eq!(config_setting(&err), Some("name"), "{bad:?}: {err}"); // R-LIM-1
    }
    let sub = broker.subscribe("t", named("billing-eu.1"), ok).unwrap();
    assert_eq!(sub.name(), "billing-eu.1");
    let report = broker.close(Duration::from_secs(10));
    assert!(report.is_clean());
}

#[test]
fn dead_letter_topic_is_validated_at_subscribe() {
    let (broker, _clock) = manual();
    let with_topic =
        |t: &str| SubscribeOptions::new().dead_letter(DeadLetterOptions::new().topic(t.to_owned()));
    let ok = |_m: &Message| Ok::<(), HandlerError>(());
    for bad in ["not a topic", "dlq.#", "", "dlq.*", "a..b"] {
        let err = broker.subscribe("t", with_topic(bad), ok).unwrap_err();
        assert_eq!(
            config_setting(&err),
            Some("dead_letter.topic"),
            "{bad:?}: {err}"
        ); // R-LIM-1
    }
    assert!(broker.subscribe("t", with_topic("dlq.orders"), ok).is_ok());
}

#[test]
fn correlation_id_is_under_a_limit() {
    let (broker, _clock) = manual();
    let huge = "c".repeat(16 << 20);
    let err = broker
        .publish(Message::to("t").correlation_id(huge))
        .unwrap_err();
    // R-LIM-1: a typed error naming the limit and its value.
    assert!(
        matches!(err, PublishError::CorrelationIdTooLarge { limit: 1024, .. }),
        "{err:?}"
    );
    assert!(
        broker
            .publish(Message::to("t").correlation_id("c".repeat(1024)))
            .is_ok()
    );
}

#[test]
fn max_attempts_on_none_or_custom_is_a_configuration_error() {
    struct Never;
    impl RetryPolicy for Never {
        fn retry_after(&self, _: u32, _: &HandlerError, _: &Message) -> Option<Duration> {
            None
        }
    }
    let (broker, _clock) = manual();
    let ok = |_m: &Message| Ok::<(), HandlerError>(());
    for retry in [
        Retry::None.max_attempts(3),
        Retry::custom(Never).max_attempts(3),
    ] {
        let err = broker
            .subscribe("t", SubscribeOptions::new().retry(retry), ok)
            .unwrap_err();
        assert_eq!(config_setting(&err), Some("retry.max_attempts"), "{err}"); // R-LIM-1
    }
}

#[test]
fn pool_with_zero_workers_is_refused() {
    let err = Broker::builder()
        .driver(Driver::Pool { workers: 0 })
        .build()
        .unwrap_err();
    // R-LIM-1: no magic value; Driver::pool() sizes the pool instead.
    assert!(matches!(
        err,
        ConfigError::Invalid {
            setting: "driver.pool.workers",
            ..
        }
    ));
}

// R-TIME-1: a message whose TTL passes during retry backoff is not retried.
fn ttl_is_checked_before_every_retry(concurrency: Concurrency) {
    let (broker, clock) = manual();
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let sub = broker
        .subscribe(
            "t",
            SubscribeOptions::new()
                .retry(Retry::fixed(100 * MS, 5))
                .concurrency(concurrency),
            move |_m: &Message| {
                c.fetch_add(1, Ordering::SeqCst);
                Err::<(), _>(HandlerError::retry("down"))
            },
        )
        .unwrap();
    broker
        .publish(Message::to("t").payload("short").ttl(150 * MS))
        .unwrap();
    broker.run_until_idle(); // attempt 1 at t=0
    clock.advance(100 * MS);
    broker.run_until_idle(); // attempt 2 at t=100
    clock.advance(100 * MS); // t=200: expired while waiting to retry
    broker.run_until_idle();
    assert_eq!(calls.load(Ordering::SeqCst), 2); // R-TIME-1: no attempt after expiry
    let dlq: Vec<_> = sub
        .dead_letters()
        .iter()
        .map(|d| (text(&d.message), d.reason.clone(), d.attempts))
        .collect();
    assert_eq!(
        dlq,
        vec![("short".to_owned(), DeadLetterReason::Expired, 2)] // R-TIME-1
    );
    let s = sub.stats();
    assert_eq!((s.dead_lettered.expired, s.in_flight), (1, 0));
    assert!(s.is_conserved()); // R-DEL-6
}

#[test]
fn ttl_is_checked_before_every_retry_serial() {
    ttl_is_checked_before_every_retry(Concurrency::Serial);
}

#[test]
fn ttl_is_checked_before_every_retry_per_key() {
    ttl_is_checked_before_every_retry(Concurrency::PerKey { max_in_flight: 2 });
}
