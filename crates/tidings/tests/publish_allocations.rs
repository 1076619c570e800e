//! Heap allocations per published-and-delivered message on a cached route (issue 28:
//! target 0), counted by a global allocator on the test's own thread. The manual driver
//! publishes and delivers on that thread, so the counts are exact and the same every run.
//!
//! What they pin: a topic given as a `Topic` (or a short string, held inside the builder)
//! costs no allocation, and a queue that fills and drains again reuses its messages'
//! allocations (the message pool keeps as many as the queue holds).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use bytes::Bytes;
use tidings::{Broker, Driver, HandlerError, Message, MessageBuilder, SubscribeOptions, Topic};

/// Counts allocation calls made by the thread that opened a [`count`] window.
struct Counting;

std::thread_local! {
    /// Allocations counted on this thread, `None` outside a window. Const-initialised and
    /// without a destructor, so reading it never allocates.
    static CALLS: Cell<Option<u64>> = const { Cell::new(None) };
}

fn note_call() {
    let _ = CALLS.try_with(|c| {
        if let Some(n) = c.get() {
            c.set(Some(n + 1));
        }
    });
}

// SAFETY: every call forwards to `System` with the caller's layout and pointer unchanged;
// the counter never affects the memory returned. (A global allocator can only be written
// as an `unsafe impl`; this one exists to count.)
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_call();
        // SAFETY: the same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_call();
        // SAFETY: the same contract as ours.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_call();
        // SAFETY: the same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Allocations `f` made on this thread.
fn count(f: impl FnOnce()) -> u64 {
    CALLS.with(|c| c.set(Some(0)));
    f();
    CALLS.with(|c| c.replace(None)).unwrap_or(0)
}

/// Messages per round; the queue holds them all, as the manual driver delivers only in
/// `run_until_idle`.
const N: usize = 2_000;

/// A manual broker with one subscription to `topic` whose queue holds a whole round.
fn broker_for(topic: &str) -> (Broker, tidings::Subscription) {
    let broker = Broker::builder()
        .driver(Driver::Manual)
        .build()
        .expect("broker");
    let sub = broker
        .subscribe(topic, SubscribeOptions::new().capacity(N), |_: &Message| {
            Ok::<(), HandlerError>(())
        })
        .expect("subscribe");
    (broker, sub)
}

/// Publish a round of `N` built by `make` and deliver it; the allocations it made.
fn round(broker: &Broker, make: &dyn Fn() -> MessageBuilder) -> u64 {
    count(|| {
        for _ in 0..N {
            let report = broker.publish(make()).expect("publish");
            assert_eq!(report.accepted, 1);
        }
        broker.run_until_idle();
    })
}

/// What one `run_until_idle` allocates however many messages it delivers (its list of
/// live subscriptions, once per pass): not per message.
const PER_DRIVE: u64 = 4;

/// With feature `otel` every message carries a `traceparent` header of its own (R-OPS-3):
/// its value, its name and the headers' vector, each allocated once per message. Without
/// it, nothing is allocated per message.
const TRACE_HEADER: u64 = if cfg!(feature = "otel") { 3 } else { 0 };

/// Allocations a round of `N` may make: the trace header's, and one drive's.
const ALLOWED: u64 = N as u64 * TRACE_HEADER + PER_DRIVE;

/// Warm up (route cache, message pool, queue storage: a subscription's ingress keeps two
/// buffers, one filled while the other drains, so two rounds grow both), then count two
/// rounds.
fn steady(broker: &Broker, make: &dyn Fn() -> MessageBuilder) -> [u64; 2] {
    round(broker, make);
    round(broker, make);
    [round(broker, make), round(broker, make)]
}

/// One test, run in order: the message pool is shared by the whole process, and a test
/// running beside this one would take its recycled messages.
#[test]
fn a_cached_route_publishes_and_delivers_without_an_allocation_per_message() {
    // A topic checked once, by reference and by value: none, whatever its length.
    let topic = Topic::new("orders.eu.created.with-a-long-name").expect("valid");
    let (broker, sub) = broker_for(topic.as_str());
    let payload = Bytes::from_static(b"0123456789abcdef");
    let by_ref = steady(&broker, &|| Message::to(&topic).payload(payload.clone()));
    let by_value = steady(&broker, &|| {
        Message::to(topic.clone()).payload(payload.clone())
    });
    for (how, counts) in [("&Topic", by_ref), ("Topic", by_value)] {
        assert!(
            counts.iter().all(|&n| n <= ALLOWED),
            "allocations per round of {N}, {how}: {counts:?}"
        );
    }
    assert_eq!(sub.stats().delivered, 8 * N as u64);
    broker.close(std::time::Duration::from_secs(5));

    // A short string is held inside the builder: none either.
    let (broker, sub) = broker_for("orders.created");
    let counts = steady(&broker, &|| {
        Message::to("orders.created").payload(Bytes::from_static(b"p"))
    });
    assert!(
        counts.iter().all(|&n| n <= ALLOWED),
        "allocations per round of {N}, a 14-byte &str: {counts:?}"
    );
    assert_eq!(sub.stats().delivered, 4 * N as u64);
    broker.close(std::time::Duration::from_secs(5));

    // A string over 22 bytes is copied once per message, and nothing else is allocated.
    let name = topic.as_str();
    let (broker, sub) = broker_for(name);
    let counts = steady(&broker, &|| Message::to(name));
    assert!(
        counts
            .iter()
            .all(|&n| n >= N as u64 * (1 + TRACE_HEADER) && n <= N as u64 + ALLOWED),
        "one allocation per message, the topic's copy: {counts:?} for {N}"
    );
    assert_eq!(sub.stats().delivered, 4 * N as u64);
    broker.close(std::time::Duration::from_secs(5));
}
