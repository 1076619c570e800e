//! The in-memory dead-letter queue: loss-safe redrive, forwarding to a dead-letter topic,
//! reserved metadata headers.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tidings::*;
use tidings_testkit::helpers::manual;

fn rejecting(dlq_topic: Option<&str>) -> SubscribeOptions {
    let mut dead_letter = DeadLetterOptions::new();
    if let Some(topic) = dlq_topic {
        dead_letter = dead_letter.topic(topic);
    }
    SubscribeOptions::new()
        .retry(Retry::None)
        .dead_letter(dead_letter)
}

fn collector(broker: &Broker, topic: &str) -> (Subscription, Arc<Mutex<Vec<Arc<Message>>>>) {
    let got: Arc<Mutex<Vec<Arc<Message>>>> = Arc::default();
    let g = got.clone();
    let sub = broker
        .subscribe(topic, SubscribeOptions::default(), move |m: &Message| {
            g.lock().push(Arc::new(m.clone()));
            Ok::<(), HandlerError>(())
        })
        .unwrap();
    (sub, got)
}

// ---------------------------------------------------------------- redrive

// R-DEL-4: redrive on an unsubscribed subscription re-offers nothing, so it removes nothing.
#[test]
fn redrive_after_unsubscribe_keeps_every_entry() {
    let (broker, _clock) = manual();
    let sub = broker
        .subscribe("t", rejecting(None), |_m: &Message| {
            Err::<(), _>(HandlerError::reject("no"))
        })
        .unwrap();
    for _ in 0..3 {
        broker.publish(Message::to("t")).unwrap();
    }
    broker.run_until_idle();
    assert_eq!(sub.dead_letters().len(), 3);
    broker.unsubscribe(sub.id());
    let report = sub.redrive(|_| true);
    assert_eq!((report.accepted, report.refused), (0, 3));
    assert_eq!(sub.dead_letters().len(), 3); // R-DEL-4: nothing lost
    assert!(
        sub.dead_letters()
            .iter()
            .all(|d| matches!(d.reason, DeadLetterReason::Rejected { .. }))
    );
}

// R-DEL-4, R-DEL-6: a redrive into a queue with room for one: one entry accepted and
// removed, the two refused ones stay in the DLQ (as Overflow dead letters), none lost.
#[test]
fn redrive_removes_only_what_was_accepted() {
    let (broker, _clock) = manual();
    let fail = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let f = fail.clone();
    let sub = broker
        .subscribe("t", rejecting(None).capacity(1), move |_m: &Message| {
            if f.load(std::sync::atomic::Ordering::SeqCst) {
                Err(HandlerError::reject("no"))
            } else {
                Ok(())
            }
        })
        .unwrap();
    for _ in 0..3 {
        broker.publish(Message::to("t")).unwrap();
        broker.run_until_idle();
    }
    let ids: Vec<MessageId> = sub.dead_letters().iter().map(|d| d.message.id()).collect();
    assert_eq!(ids.len(), 3);
    let report = sub.redrive(|_| true);
    assert_eq!((report.accepted, report.refused), (1, 2));
    let left: Vec<MessageId> = sub.dead_letters().iter().map(|d| d.message.id()).collect();
    assert_eq!(left, ids[1..].to_vec()); // R-DEL-4: refused entries are still there
    fail.store(false, std::sync::atomic::Ordering::SeqCst);
    broker.run_until_idle();
    let s = sub.stats();
    assert_eq!(s.delivered, 1);
    assert!(s.is_conserved(), "{s:?}"); // R-DEL-6
}

// ---------------------------------------------------------------- forward

// R-DEL-4: a dead letter carrying the maximum number of headers is still forwarded to the
// dead-letter topic: tidings' metadata does not count against the user's header limit.
#[test]
fn a_dead_letter_with_max_headers_is_forwarded() {
    let (broker, _clock) = manual();
    let (_dlq, got) = collector(&broker, "dlq");
    let sub = broker
        .subscribe("t", rejecting(Some("dlq")), |_m: &Message| {
            Err::<(), _>(HandlerError::reject("bad"))
        })
        .unwrap();
    let mut m = Message::to("t").payload("full");
    for i in 0..Limits::default().max_headers {
        m = m.header(format!("h{i}"), "v");
    }
    broker.publish(m).unwrap();
    broker.run_until_idle();
    let got = got.lock();
    assert_eq!(got.len(), 1); // R-DEL-4
    let f = &got[0];
    assert_eq!(f.header(DLQ_REASON_HEADER), Some("rejected: bad"));
    assert_eq!(f.header("tidings-dlq-original-topic"), Some("t"));
    assert_eq!(f.header("h63"), Some("v"));
    assert_eq!(sub.stats().dlq_forward_failures, 0); // R-DEL-6
}

// R-DEL-4, R-DEL-6: a forward that fails (here: the broker closed, so the Shutdown dead
// letters of close cannot be published) is counted, and the entry stays in the DLQ.
#[test]
fn a_failed_forward_is_counted_and_the_entry_kept() {
    let (broker, _clock) = manual();
    let sub = broker
        .subscribe("t", rejecting(Some("dlq")), |_m: &Message| {
            Ok::<(), HandlerError>(())
        })
        .unwrap();
    broker.publish(Message::to("t")).unwrap();
    broker.publish(Message::to("t")).unwrap();
    let report = broker.close(Duration::ZERO);
    assert_eq!(report.undelivered.len(), 2);
    let s = sub.stats();
    assert_eq!(s.dlq_forward_failures, 2); // R-DEL-6
    assert_eq!(sub.dead_letters().len(), 2); // R-DEL-4
}

// ---------------------------------------------------------------- reserved headers

// R-DEL-4: a user cannot set tidings' dead-letter metadata: headers with the reserved
// `tidings-` prefix are refused at publish, so the loop guard cannot be spoofed.
#[test]
fn reserved_headers_are_refused_and_the_forward_happens() {
    let (broker, _clock) = manual();
    let (_dlq, got) = collector(&broker, "dlq");
    let _sub = broker
        .subscribe("t", rejecting(Some("dlq")), |_m: &Message| {
            Err::<(), _>(HandlerError::reject("bad"))
        })
        .unwrap();
    let spoof = broker.publish(Message::to("t").header(DLQ_REASON_HEADER, "forged"));
    assert!(
        matches!(spoof, Err(PublishError::ReservedHeader { ref name }) if name == DLQ_REASON_HEADER),
        "{spoof:?}"
    ); // R-DEL-4
    broker
        .publish(Message::to("t").header("x-dlq-reason", "mine"))
        .unwrap();
    broker.run_until_idle();
    let got = got.lock();
    assert_eq!(got.len(), 1); // R-DEL-4
    assert_eq!(got[0].header("x-dlq-reason"), Some("mine"));
    assert_eq!(got[0].header(DLQ_REASON_HEADER), Some("rejected: bad"));
}

// R-DEL-4: a dead letter of a forwarded dead letter is not forwarded again (no loops).
#[test]
fn forwarded_dead_letters_are_not_forwarded_again() {
    let (broker, _clock) = manual();
    // The dead-letter topic's own subscriber rejects too, forwarding to the same topic.
    let dlq = broker
        .subscribe("dlq", rejecting(Some("dlq")), |_m: &Message| {
            Err::<(), _>(HandlerError::reject("again"))
        })
        .unwrap();
    let _sub = broker
        .subscribe("t", rejecting(Some("dlq")), |_m: &Message| {
            Err::<(), _>(HandlerError::reject("bad"))
        })
        .unwrap();
    broker.publish(Message::to("t")).unwrap();
    assert!(broker.run_until_idle() < 10);
    assert_eq!(
        dlq.stats().delivered + dlq.stats().dead_lettered.rejected,
        1
    ); // R-DEL-4
}
