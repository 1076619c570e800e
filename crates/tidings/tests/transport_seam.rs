//! The transport seam (src/transport) against an in-memory "network" shared by several
//! brokers, under the manual driver: which messages go out, which subscriptions receive,
//! what is refused, held, counted and closed. NATS itself is tested in
//! `crates/tidings-jetstream/tests/transport.rs`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tidings::durable::{BackendStream, Capabilities, DurableBackend};
use tidings::embedded::EmbeddedBackend;
use tidings::transport::{
    ConnectionId, Deliver, Delivered, Received, Transport, TransportSubscription,
};
use tidings::*;

/// One subscription on the hub: a deliberately coarse filter (its pattern's first word or
/// everything), like a NATS superset, so the broker's re-check is exercised.
struct HubSub {
    prefix: Option<String>,
    deliver: Deliver,
    open: Arc<AtomicBool>,
}

/// The "network": every transport connected to it sees every publish, synchronously.
#[derive(Default)]
struct Hub {
    subs: Mutex<Vec<HubSub>>,
    sent: AtomicUsize,
    not_matching: AtomicUsize,
    down: AtomicBool,
}

impl Hub {
    fn open(&self) -> usize {
        self.subs
            .lock()
            .iter()
            .filter(|s| s.open.load(Ordering::SeqCst))
            .count()
    }

    fn publish(&self, message: &Message) {
        self.sent.fetch_add(1, Ordering::SeqCst);
        let targets: Vec<Deliver> = self
            .subs
            .lock()
            .iter()
            .filter(|s| s.open.load(Ordering::SeqCst))
            .filter(|s| {
                s.prefix
                    .as_deref()
                    .is_none_or(|p| message.topic().as_str().starts_with(p))
            })
            .map(|s| s.deliver.clone())
            .collect();
        if targets.is_empty()
            && let Some(reply_to) = message.reply_to()
        {
            // Nobody listens: tell whoever listens on the reply-to topic (as NATS does).
            let inboxes: Vec<Deliver> = self
                .subs
                .lock()
                .iter()
                .filter(|s| s.prefix.as_deref() == Some("_inbox"))
                .map(|s| s.deliver.clone())
                .collect();
            for d in inboxes {
                d.deliver(Received::NoResponders {
                    reply_to: reply_to.clone(),
                });
            }
        }
        for d in targets {
            if d.deliver(Received::Message(message.clone())) == Delivered::NotMatching {
                self.not_matching.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
}

#[derive(Debug)]
struct Loopback {
    hub: Arc<Hub>,
    connection: Option<ConnectionId>,
    closed: Arc<AtomicBool>,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hub")
    }
}

fn unavailable() -> TransportError {
    TransportError::Unavailable {
        transport: "loopback",
        reason: "down".into(),
    }
}

impl Transport for Loopback {
    fn name(&self) -> &'static str {
        "loopback"
    }

    fn publish(&self, message: &Message) -> Result<(), TransportError> {
        if self.hub.down.load(Ordering::SeqCst) {
            return Err(unavailable());
        }
        self.hub.publish(message);
        Ok(())
    }

    fn subscribe(
        &self,
        pattern: &Pattern,
        deliver: Deliver,
    ) -> Result<Box<dyn TransportSubscription>, TransportError> {
        if self.hub.down.load(Ordering::SeqCst) {
            return Err(unavailable());
        }
        let first = pattern.as_str().split('.').next().unwrap_or("#");
        let prefix = (!matches!(first, "*" | "#")).then(|| first.to_owned());
        let open = Arc::new(AtomicBool::new(true));
        self.hub.subs.lock().push(HubSub {
            prefix,
            deliver,
            open: open.clone(),
        });
        Ok(Box::new(LoopbackSub(open)))
    }

    fn connection(&self) -> Option<ConnectionId> {
        self.connection
    }

    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }
}

struct LoopbackSub(Arc<AtomicBool>);

impl TransportSubscription for LoopbackSub {
    fn close(&self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

fn loopback(hub: &Arc<Hub>) -> Loopback {
    Loopback {
        hub: hub.clone(),
        connection: None,
        closed: Arc::default(),
    }
}

fn manual(transport: Loopback, clock: &ManualClock) -> Broker {
    Broker::builder()
        .driver(Driver::Manual)
        .clock(clock.clone())
        .transport(Arc::new(transport))
        .build()
        .expect("builds")
}

fn ok(_: &Message) -> Result<(), HandlerError> {
    Ok(())
}

#[test]
fn publishes_travel_through_the_transport_and_are_rechecked_on_receipt() {
    let hub = Arc::new(Hub::default());
    let clock = ManualClock::new();
    let a = manual(loopback(&hub), &clock);
    let b = manual(loopback(&hub), &clock);
    let tail = b.subscribe("a.#", SubscribeOptions::default(), ok).unwrap();
    let middle = b
        .subscribe("a.#.b", SubscribeOptions::default(), ok)
        .unwrap();
    let own = a.subscribe("a.*", SubscribeOptions::default(), ok).unwrap();
    assert_eq!(hub.open(), 3, "one transport subscription each");
    for t in ["a", "a.b", "a.x", "a.x.b", "b"] {
        let report = a.publish(Message::to(t)).unwrap();
        // Delivery happens on receipt, elsewhere: nobody is counted at publish.
        assert_eq!(report.accepted, 0);
    }
    a.run_until_idle();
    b.run_until_idle();
    // R-RT-1: the broker re-checks what the coarse transport filter let through.
    assert_eq!(tail.stats().delivered, 4);
    assert_eq!(middle.stats().delivered, 2);
    // The publishing broker's own subscription receives through the transport too.
    assert_eq!(own.stats().delivered, 2);
    // a.#.b saw a and a.x; a.* saw a and a.x.b: skipped, reported, never offered.
    assert_eq!(hub.not_matching.load(Ordering::SeqCst), 4);
    assert_eq!(middle.stats().offered, 2);
    assert_eq!(hub.sent.load(Ordering::SeqCst), 5);
}

#[test]
fn a_full_queue_refuses_at_once_under_every_policy() {
    let hub = Arc::new(Hub::default());
    let clock = ManualClock::new();
    let a = manual(loopback(&hub), &clock);
    let b = manual(loopback(&hub), &clock);
    let blocking = b
        .subscribe(
            "jobs",
            SubscribeOptions::new()
                .capacity(2)
                .overflow(Overflow::Block {
                    timeout: Duration::MAX,
                }),
            ok,
        )
        .unwrap();
    for _ in 0..5 {
        a.publish(Message::to("jobs")).unwrap();
    }
    // R-BP-1: a remote publisher cannot be made to wait: Block refuses as Overflow when
    // full, counted and dead-lettered (this test would hang if the offer waited).
    let stats = blocking.stats();
    assert_eq!(
        (stats.accepted, stats.refused.overflow),
        (2, 3),
        "{stats:?}"
    );
    assert_eq!(blocking.dead_letters().len(), 3);
    b.run_until_idle();
    assert_eq!(blocking.stats().delivered, 2);
    assert!(blocking.stats().is_conserved());
}

#[test]
fn a_delayed_message_travels_now_and_each_receiver_holds_it() {
    let hub = Arc::new(Hub::default());
    let clock = ManualClock::new();
    let a = manual(loopback(&hub), &clock);
    let b = manual(loopback(&hub), &clock);
    let sub = b
        .subscribe("later", SubscribeOptions::default(), ok)
        .unwrap();
    let report = a
        .publish(Message::to("later").delay(Duration::from_secs(10)))
        .unwrap();
    assert!(report.scheduled);
    assert_eq!(hub.sent.load(Ordering::SeqCst), 1);
    assert_eq!(a.scheduled(), 0, "the sender holds nothing");
    // R-TIME-2: the receiver holds it until due.
    b.run_until_idle();
    assert_eq!((b.scheduled(), sub.stats().delivered), (1, 0));
    clock.advance(Duration::from_secs(10));
    b.run_until_idle();
    assert_eq!((b.scheduled(), sub.stats().delivered), (0, 1));
}

#[test]
fn transport_failures_are_typed_errors_and_leave_nothing_behind() {
    let hub = Arc::new(Hub::default());
    let clock = ManualClock::new();
    let a = manual(loopback(&hub), &clock);
    hub.down.store(true, Ordering::SeqCst);
    // R-DIST-5: a typed error, nothing sent.
    let err = a.publish(Message::to("x")).unwrap_err();
    assert!(
        matches!(
            err,
            PublishError::Transport(TransportError::Unavailable {
                transport: "loopback",
                ..
            })
        ),
        "{err:?}"
    );
    let err = a
        .subscribe("x", SubscribeOptions::default(), ok)
        .unwrap_err();
    assert!(matches!(err, SubscribeError::Transport(_)), "{err:?}");
    assert!(a.subscriptions().is_empty());
    let err = a
        .request(Message::to("x"), Duration::from_secs(1))
        .unwrap_err();
    assert!(
        matches!(err, RequestError::Inbox(_) | RequestError::Publish(_)),
        "{err:?}"
    );
    assert_eq!(a.pending_requests(), 0);
    hub.down.store(false, Ordering::SeqCst);
    let _back = a.subscribe("x", SubscribeOptions::default(), ok).unwrap();
    a.publish(Message::to("x")).unwrap();
}

#[test]
fn unsubscribe_and_close_end_the_transport_subscriptions() {
    let hub = Arc::new(Hub::default());
    let clock = ManualClock::new();
    let transport = loopback(&hub);
    let closed = transport.closed.clone();
    let a = manual(transport, &clock);
    let one = a.subscribe("a", SubscribeOptions::default(), ok).unwrap();
    let _two = a.subscribe("b", SubscribeOptions::default(), ok).unwrap();
    assert_eq!(hub.open(), 2);
    a.unsubscribe(one.id()).unwrap();
    assert_eq!(hub.open(), 1);
    assert!(a.close(Duration::from_secs(1)).is_clean());
    assert_eq!(hub.open(), 0);
    assert!(
        closed.load(Ordering::SeqCst),
        "close releases the transport"
    );
}

#[test]
fn request_reply_and_no_responders_over_the_transport() {
    let hub = Arc::new(Hub::default());
    let clock = ManualClock::new();
    let a = manual(loopback(&hub), &clock);
    let b = Broker::builder()
        .transport(Arc::new(loopback(&hub)))
        .build()
        .unwrap();
    let responder = b.downgrade();
    let _echo = b
        .subscribe("svc", SubscribeOptions::default(), move |m: &Message| {
            if let (Some(b), Some(r)) = (responder.upgrade(), m.reply()) {
                b.publish(r.payload(m.payload().clone()))
                    .map_err(|e| HandlerError::retry(e.to_string()))?;
            }
            Ok::<(), HandlerError>(())
        })
        .unwrap();
    // R-PAT-1: out and back through the transport, to the one inbox of `a`.
    let reply = a
        .request(Message::to("svc").payload("hi"), Duration::from_secs(30))
        .unwrap();
    assert_eq!(&reply.payload()[..], b"hi");
    // The transport reports that nobody listens: the request fails at once.
    let err = a
        .request(Message::to("nobody"), Duration::from_secs(30))
        .unwrap_err();
    assert_eq!(err, RequestError::NoResponders);
    assert_eq!(a.pending_requests(), 0);
    let inboxes = hub
        .subs
        .lock()
        .iter()
        .filter(|s| s.prefix.as_deref() == Some("_inbox"))
        .count();
    assert_eq!(inboxes, 1, "one inbox subscription per broker");
    drop(a);
    b.close(Duration::from_secs(5));
}

/// The embedded log, claiming to publish its appends on `connection` (as JetStream does on
/// its NATS connection).
#[derive(Debug)]
struct PublishingLog {
    log: EmbeddedBackend,
    connection: ConnectionId,
}

impl DurableBackend for PublishingLog {
    fn name(&self) -> &'static str {
        self.log.name()
    }
    fn capabilities(&self) -> Capabilities {
        self.log.capabilities()
    }
    fn open_stream(
        &self,
        config: &StreamConfig,
        patterns: &[Pattern],
    ) -> Result<Arc<dyn BackendStream>, StreamError> {
        self.log.open_stream(config, patterns)
    }
    fn appends_published_on(&self) -> Option<ConnectionId> {
        Some(self.connection)
    }
}

#[test]
fn a_message_the_backend_already_carries_is_not_sent_again() {
    for shared in [false, true] {
        let hub = Arc::new(Hub::default());
        let dir = tempfile::tempdir().unwrap();
        let connection = ConnectionId::new();
        let transport = Loopback {
            hub: hub.clone(),
            connection: shared.then_some(connection),
            closed: Arc::default(),
        };
        let a = Broker::builder()
            .driver(Driver::Manual)
            .durable_backend(Arc::new(PublishingLog {
                log: EmbeddedBackend::new(dir.path()),
                connection,
            }))
            .transport(Arc::new(transport))
            .build()
            .unwrap();
        a.create_stream(StreamConfig::new("orders", ["orders.#"]))
            .unwrap();
        let report = a.publish(Message::to("orders.new")).unwrap();
        assert_eq!(report.streams, ["orders"]);
        a.publish(Message::to("other")).unwrap();
        // Captured by a stream whose appends reach the transport: sent once, by the append.
        let want = if shared { 1 } else { 2 };
        assert_eq!(hub.sent.load(Ordering::SeqCst), want, "shared = {shared}");
    }
}

#[test]
fn a_transport_and_a_backend_on_two_connections_are_refused() {
    let hub = Arc::new(Hub::default());
    let dir = tempfile::tempdir().unwrap();
    let transport = Loopback {
        hub: hub.clone(),
        connection: Some(ConnectionId::new()),
        closed: Arc::default(),
    };
    let built = Broker::builder()
        .driver(Driver::Manual)
        .durable_backend(Arc::new(PublishingLog {
            log: EmbeddedBackend::new(dir.path()),
            connection: ConnectionId::new(),
        }))
        .transport(Arc::new(transport))
        .build();
    assert!(
        matches!(
            built,
            Err(ConfigError::Invalid {
                setting: "transport",
                ..
            })
        ),
        "{built:?}"
    );
}

#[test]
fn two_brokers_on_one_transport_never_share_a_reply_inbox() {
    let hub = Arc::new(Hub::default());
    let clock = ManualClock::new();
    let responder = Broker::builder()
        .transport(Arc::new(loopback(&hub)))
        .build()
        .unwrap();
    let w = responder.downgrade();
    let _echo = responder
        .subscribe("svc", SubscribeOptions::default(), move |m: &Message| {
            if let (Some(b), Some(r)) = (w.upgrade(), m.reply()) {
                b.publish(r.payload(m.payload().clone()))
                    .map_err(|e| HandlerError::retry(e.to_string()))?;
            }
            Ok::<(), HandlerError>(())
        })
        .unwrap();
    let a = manual(loopback(&hub), &clock);
    let b = manual(loopback(&hub), &clock);
    for (broker, text) in [(&b, "for b"), (&a, "for a"), (&b, "for b again")] {
        let reply = broker
            .request(Message::to("svc").payload(text), Duration::from_secs(30))
            .unwrap();
        assert_eq!(&reply.payload()[..], text.as_bytes());
    }
    // R-PAT-1: each reply reached only its own requester's inbox; none arrived elsewhere
    // as a late reply (both brokers number their requests from r0).
    assert_eq!((a.late_replies(), b.late_replies()), (0, 0));
    responder.close(Duration::from_secs(5));
}
