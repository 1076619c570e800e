//! Caller-chosen and derived message ids (R-CORE-4, R-DEL-7): what a publisher sets is what
//! every subscriber sees, and a derived id is a pure function of its input's id and index.

use std::collections::HashSet;
use std::sync::Arc;

use parking_lot::Mutex;
use tidings::*;
use tidings_testkit::helpers::manual;

// R-CORE-4: a publish with the caller's id carries that id to every subscription (the
// retry recipe of `MessageBuilder::id` depends on it), and a publish without one still
// gets a fresh, unique id.
#[test]
fn a_callers_id_reaches_every_subscriber_unchanged() {
    let (broker, _clock) = manual();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let subs: Vec<_> = (0..2)
        .map(|_| {
            let seen = seen.clone();
            broker
                .subscribe(
                    "orders.*",
                    SubscribeOptions::default(),
                    move |m: &Message| {
                        seen.lock().push(m.id());
                        Ok(())
                    },
                )
                .expect("subscribe")
        })
        .collect();
    let id = MessageId::new();
    broker
        .publish(Message::to("orders.created").id(id).payload("42"))
        .expect("publish");
    broker
        .publish(Message::to("orders.created").payload("43"))
        .expect("publish");
    broker.run_until_idle();
    let seen = seen.lock().clone();
    assert_eq!(seen.len(), 4);
    assert_eq!(seen.iter().filter(|&&s| s == id).count(), 2, "{seen:?}");
    assert!(
        seen.iter().any(|&s| s != id),
        "the other publish got its own id"
    );
    drop(subs);
}

// R-DEL-7: an output's id depends only on its input's id and its index — the same in a
// second handling of a redelivered input — and no two (input, index) pairs share one.
#[test]
fn derived_ids_are_deterministic_and_distinct() {
    let inputs: Vec<MessageId> = (0..200).map(|_| MessageId::new()).collect();
    let mut all = HashSet::new();
    for input in &inputs {
        for n in 0..500 {
            let out = input.derived(n);
            assert_eq!(out, input.derived(n), "deterministic");
            assert_eq!(out.timestamp_ms(), input.timestamp_ms(), "sorts by time");
            assert!(all.insert(out), "{input:?} #{n} collides");
        }
    }
    for input in &inputs {
        assert!(!all.contains(input), "an output never takes its input's id");
    }
    // A fixed value, so a change of the function (which would duplicate every output of a
    // pipeline across an upgrade) fails here.
    let input = MessageId::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
    assert_eq!(
        input.derived(1).as_u128(),
        0x0123_4567_89ab_54b9_73cb_d8e2_5534_cc82,
        "the derivation changed: outputs published before and after would both be kept"
    );
    let built = Message::to("out")
        .caused_by(
            &Message::to("in").id(input).build_detached().expect("input"),
            1,
        )
        .build_detached()
        .expect("output");
    assert_eq!(built.id(), input.derived(1));
}
