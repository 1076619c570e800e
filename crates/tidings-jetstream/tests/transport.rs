//! Buffered subscriptions and request-reply over NATS core (`NatsTransport`), between two
//! brokers with two connections on one real `nats-server` (started by the testkit launcher;
//! a missing binary is installed; skipped, with a notice, only under `TIDINGS_SKIP_NATS=1`).

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tidings::{
    Broker, Driver, HandlerError, Message, Overflow, PublishError, RequestError, StreamConfig,
    SubscribeOptions, TransportError,
};
use tidings_jetstream::{ConnectOptions, JetStreamBackend, NatsConnection, NatsTransport};
use tidings_testkit::driver::{DriverUnderTest, ThreadedDriver};
use tidings_testkit::nats::{NatsServer, NatsServerOptions};
use tidings_testkit::suite;

/// Generous bound for waits on the server and the dispatchers (never asserted as a speed).
const PATIENCE: Duration = Duration::from_secs(30);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

fn options(server: &NatsServer) -> ConnectOptions {
    ConnectOptions::new(server.url())
        .connect_timeout(Duration::from_secs(2))
        .request_timeout(REQUEST_TIMEOUT)
}

/// A broker whose buffered publishes and subscriptions go through its own connection.
fn broker(server: &NatsServer) -> (Broker, NatsTransport) {
    let transport = NatsTransport::connect(options(server)).expect("connects");
    let broker = Broker::builder()
        .transport(Arc::new(transport.clone()))
        .build()
        .expect("builds");
    (broker, transport)
}

/// Polls `done` until it holds or `PATIENCE` passes; false on timeout.
fn eventually(mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + PATIENCE;
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    done()
}

type Seen = Arc<Mutex<Vec<Message>>>;

/// A handler recording every message it gets.
fn recorder() -> (
    Seen,
    impl Fn(&Message) -> Result<(), HandlerError> + Send + Sync + 'static,
) {
    let seen: Seen = Arc::default();
    let s = Arc::clone(&seen);
    (seen, move |m: &Message| {
        s.lock().expect("not poisoned").push(m.clone());
        Ok(())
    })
}

fn topics(seen: &Seen) -> Vec<String> {
    let mut t: Vec<String> = seen
        .lock()
        .expect("not poisoned")
        .iter()
        .map(|m| m.topic().as_str().to_owned())
        .collect();
    t.sort();
    t
}

#[test]
fn a_publish_on_one_broker_reaches_a_buffered_subscription_on_another() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let (a, _) = broker(&server);
    let (b, _) = broker(&server);
    let (seen_b, handler_b) = recorder();
    let (seen_a, handler_a) = recorder();
    let sub_b = b
        .subscribe("orders.*", SubscribeOptions::default(), handler_b)
        .expect("subscribes");
    let sub_a = a
        .subscribe("orders.*", SubscribeOptions::default(), handler_a)
        .expect("subscribes");
    for i in 0..20 {
        let report = a
            .publish(
                Message::to("orders.created")
                    .payload(format!("o{i}"))
                    .header("h", "v")
                    .header("odd name", "a&b=c")
                    .key("order-7")
                    .ttl(Duration::from_secs(600)),
            )
            .expect("publishes");
        // With a transport, delivery happens on receipt: nobody is counted at publish.
        assert_eq!(report.accepted, 0);
    }
    // R-DIST-1: the other broker's subscription gets them, in publish order (R-ORD-2), and
    // so does the publishing broker's own subscription (its messages go out and back).
    assert!(
        eventually(|| sub_b.stats().delivered == 20),
        "{:?}",
        sub_b.stats()
    );
    assert!(
        eventually(|| sub_a.stats().delivered == 20),
        "{:?}",
        sub_a.stats()
    );
    let got = seen_b.lock().expect("not poisoned").clone();
    let payloads: Vec<String> = got
        .iter()
        .map(|m| String::from_utf8(m.payload().to_vec()).expect("utf-8"))
        .collect();
    let want: Vec<String> = (0..20).map(|i| format!("o{i}")).collect();
    assert_eq!(payloads, want);
    let first = &got[0];
    let mine = &seen_a.lock().expect("not poisoned")[0];
    // R-CORE-4: every field travels: id, timestamp, headers in order, key, expiry.
    assert_eq!(first.to_parts(), mine.to_parts());
    assert_eq!(first.header("odd name"), Some("a&b=c"));
    assert_eq!(first.key(), Some(&b"order-7"[..]));
    assert!(first.expires_at().is_some());
    assert_eq!(first.offset(), None);
    assert!(a.close(Duration::from_secs(5)).is_clean());
    assert!(b.close(Duration::from_secs(5)).is_clean());
}

#[test]
fn amqp_wildcards_hold_over_nats_subjects() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let (a, _) = broker(&server);
    let (b, transport_b) = broker(&server);
    let (tail, h1) = recorder();
    let (middle, h2) = recorder();
    let (one, h3) = recorder();
    let _s1 = b
        .subscribe("a.#", SubscribeOptions::default(), h1)
        .expect("subscribes");
    let s2 = b
        .subscribe("a.#.b", SubscribeOptions::default(), h2)
        .expect("subscribes");
    let _s3 = b
        .subscribe("a.*", SubscribeOptions::default(), h3)
        .expect("subscribes");
    let published = ["a", "a.b", "a.x", "a.x.b", "a.x.y.b", "a.x.c", "b", "b.a"];
    for t in published {
        a.publish(Message::to(t)).expect("publishes");
    }
    // The last publish seen by every subscription that matches it.
    a.publish(Message::to("a.end.b")).expect("publishes");
    assert!(eventually(|| {
        topics(&tail).contains(&"a.end.b".to_owned())
            && topics(&middle).contains(&"a.end.b".to_owned())
    }));
    assert!(b.wait_idle(PATIENCE));
    // R-RT-1: `#` matches zero words (`a.#` gets `a`, `a.#.b` gets `a.b`) and may stand in
    // the middle of a pattern, as in RabbitMQ.
    assert_eq!(
        topics(&tail),
        ["a", "a.b", "a.end.b", "a.x", "a.x.b", "a.x.c", "a.x.y.b"]
    );
    assert_eq!(topics(&middle), ["a.b", "a.end.b", "a.x.b", "a.x.y.b"]);
    assert_eq!(topics(&one), ["a.b", "a.x"]);
    // `a.#.b` listens on the NATS superset `a.>`: what it does not match is skipped and
    // counted (a.x, a.x.c), never offered.
    assert_eq!(
        transport_b.stats().not_matching,
        2,
        "{:?}",
        transport_b.stats()
    );
    assert_eq!(s2.stats().offered, 4);
}

#[test]
fn a_full_queue_applies_its_overflow_policy_without_blocking_the_network() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let (a, _) = broker(&server);
    let (b, _) = broker(&server);
    for overflow in [
        Overflow::Reject,
        // A remote publisher cannot be made to wait: Block refuses at once when full.
        Overflow::Block {
            timeout: Duration::from_secs(3600),
        },
    ] {
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let release_rx = Mutex::new(release_rx);
        let (started_tx, started_rx) = mpsc::channel::<()>();
        let started_tx = Mutex::new(started_tx);
        let sub = b
            .subscribe(
                "jobs.run",
                SubscribeOptions::new().capacity(1).overflow(overflow),
                move |_: &Message| {
                    let _ = started_tx.lock().expect("not poisoned").send(());
                    let _ = release_rx
                        .lock()
                        .expect("not poisoned")
                        .recv_timeout(PATIENCE);
                    Ok::<(), HandlerError>(())
                },
            )
            .expect("subscribes");
        a.publish(Message::to("jobs.run")).expect("publishes");
        started_rx
            .recv_timeout(PATIENCE)
            .expect("the handler starts");
        // The handler holds one message: one more fits in the queue, four are refused.
        for _ in 0..5 {
            a.publish(Message::to("jobs.run")).expect("publishes");
        }
        // R-BP-1: every refusal is counted and dead-lettered while the handler still
        // holds the first message (so nothing waited for room).
        assert!(eventually(|| sub.stats().offered == 6), "{:?}", sub.stats());
        let stats = sub.stats();
        assert_eq!(stats.accepted, 2, "{overflow:?} {stats:?}");
        assert_eq!(stats.refused.overflow, 4, "{overflow:?} {stats:?}");
        assert_eq!(sub.dead_letters().len(), 4, "{overflow:?}");
        for _ in 0..2 {
            release_tx.send(()).expect("the handler listens");
        }
        assert!(
            eventually(|| sub.stats().delivered == 2),
            "{:?}",
            sub.stats()
        );
        assert!(sub.stats().is_conserved(), "{:?}", sub.stats());
        drop(sub);
    }
}

#[test]
fn publishing_while_the_server_is_down_fails_typed_and_subscriptions_resume() {
    let Some(mut server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let (a, transport_a) = broker(&server);
    let (b, _) = broker(&server);
    let (seen, handler) = recorder();
    let sub = b
        .subscribe("events.#", SubscribeOptions::default(), handler)
        .expect("subscribes");
    a.publish(Message::to("events.before")).expect("publishes");
    assert!(eventually(|| sub.stats().delivered == 1));

    server.kill().expect("the server stops");
    // R-DIST-5: once the client has seen the connection drop, publish fails at once with a
    // typed error (before that, a publish is handed to the client and lost: at-most-once).
    assert!(eventually(|| !transport_a.is_connected()));
    let err = a
        .publish(Message::to("events.during"))
        .expect_err("the server is down");
    assert!(
        matches!(
            err,
            PublishError::Transport(TransportError::Unavailable {
                transport: "nats",
                ..
            })
        ),
        "{err:?}"
    );
    // A subscription cannot be opened either, and says why.
    let refused = a.subscribe("x", SubscribeOptions::default(), |_: &Message| {
        Ok::<(), HandlerError>(())
    });
    assert!(
        matches!(refused, Err(tidings::SubscribeError::Transport(_))),
        "{refused:?}"
    );
    assert!(a.subscriptions().is_empty());

    server.restart().expect("the server starts again");
    // The subscription resumes once both clients have reconnected: publish until one
    // arrives (what was sent before the resubscription is lost, as NATS core loses it).
    assert!(eventually(|| {
        let _ = a.publish(Message::to("events.after"));
        topics(&seen).contains(&"events.after".to_owned())
    }));
    assert!(!topics(&seen).contains(&"events.during".to_owned()));
}

#[test]
fn request_reply_across_brokers_and_timeout() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let (a, _) = broker(&server);
    let (b, _) = broker(&server);
    let responder = b.downgrade();
    let _echo = b
        .subscribe(
            "svc.echo",
            SubscribeOptions::default(),
            move |m: &Message| {
                let (Some(broker), Some(reply)) = (responder.upgrade(), m.reply()) else {
                    return Ok::<(), HandlerError>(());
                };
                broker
                    .publish(reply.payload(m.payload().clone()))
                    .map_err(|e| HandlerError::retry(e.to_string()))?;
                Ok(())
            },
        )
        .expect("subscribes");
    // R-PAT-1: the request goes out over NATS with the broker's one reply inbox as its
    // reply subject; the reply comes back over NATS to it.
    for i in 0..5 {
        let reply = a
            .request(
                Message::to("svc.echo").payload(format!("ping {i}")),
                PATIENCE,
            )
            .expect("a reply");
        assert_eq!(&reply.payload()[..], format!("ping {i}").as_bytes());
    }
    assert_eq!(a.pending_requests(), 0);
    // Nobody subscribes to this topic anywhere: the server says so, and the request fails
    // at once rather than at its timeout.
    let err = a
        .request(Message::to("svc.nobody"), PATIENCE)
        .expect_err("no reply");
    assert_eq!(err, RequestError::NoResponders);
    // A subscriber that never answers: the request times out and leaves nothing behind.
    let _mute = b
        .subscribe("svc.mute", SubscribeOptions::default(), |_: &Message| {
            Ok::<(), HandlerError>(())
        })
        .expect("subscribes");
    let err = a
        .request(Message::to("svc.mute"), Duration::from_millis(300))
        .expect_err("no reply");
    assert_eq!(err, RequestError::Timeout);
    assert_eq!(a.pending_requests(), 0);

    // Under the manual driver the requester delivers until the reply has come back.
    let transport = NatsTransport::connect(options(&server)).expect("connects");
    let manual = Broker::builder()
        .driver(Driver::Manual)
        .transport(Arc::new(transport))
        .build()
        .expect("builds");
    let reply = manual
        .request(Message::to("svc.echo").payload("manual"), PATIENCE)
        .expect("a reply");
    assert_eq!(&reply.payload()[..], b"manual");
    assert_eq!(
        manual.request(Message::to("svc.nobody"), PATIENCE).err(),
        Some(RequestError::NoResponders)
    );
}

#[test]
fn a_message_appended_to_a_jetstream_stream_is_sent_once() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    // Broker A keeps streams on JetStream and sends buffered publishes over NATS core,
    // both built from one connection.
    let conn = NatsConnection::connect(options(&server)).expect("connects");
    let a = Broker::builder()
        .durable_backend(Arc::new(JetStreamBackend::new(&conn)))
        .transport(Arc::new(NatsTransport::new(&conn)))
        .build()
        .expect("builds");
    a.create_stream(StreamConfig::new("orders", ["orders.#"]))
        .expect("stream");
    let (b, _) = broker(&server);
    let (seen, handler) = recorder();
    let sub = b
        .subscribe("#", SubscribeOptions::default(), handler)
        .expect("subscribes");
    for i in 0..10 {
        let report = a.publish(Message::to("orders.new").payload(format!("{i}")));
        assert_eq!(report.expect("publishes").streams, ["orders"]);
        assert!(
            a.publish(Message::to("other.new"))
                .expect("publishes")
                .streams
                .is_empty()
        );
    }
    // The last message of each path: the append's connection and the transport's each
    // deliver in order, so once both have arrived every earlier copy has too.
    a.publish(Message::to("orders.end")).expect("publishes");
    a.publish(Message::to("other.end")).expect("publishes");
    assert!(eventually(|| {
        let t = topics(&seen);
        t.contains(&"orders.end".to_owned()) && t.contains(&"other.end".to_owned())
    }));
    assert!(b.wait_idle(PATIENCE));
    // The append lives in the stream's own subjects and the core publish carries the
    // message to core subscribers: they see it once, not twice (R-DIST-2).
    let t = topics(&seen);
    assert_eq!(t.iter().filter(|t| *t == "orders.new").count(), 10, "{t:?}");
    assert_eq!(t.iter().filter(|t| *t == "other.new").count(), 10, "{t:?}");
    assert_eq!(sub.stats().delivered, 22);
}

#[test]
fn a_backend_and_a_transport_on_two_connections_still_send_each_message_once() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    // Two connections: the backend's appends live in the streams' own subjects, which no
    // core subscription covers, so the backend reports no connection its appends reach and
    // the transport sends every message itself — once, whichever connections are used
    // (R-DIST-2).
    let backend = JetStreamBackend::connect(options(&server)).expect("connects");
    let transport = NatsTransport::connect(options(&server)).expect("connects");
    let a = Broker::builder()
        .durable_backend(Arc::new(backend))
        .transport(Arc::new(transport))
        .build()
        .expect("builds");
    a.create_stream(StreamConfig::new("orders", ["orders.#"]))
        .expect("stream");
    let (b, _) = broker(&server);
    let (seen, handler) = recorder();
    let _sub = b
        .subscribe("orders.#", SubscribeOptions::default(), handler)
        .expect("subscribes");
    for i in 0..10 {
        a.publish(Message::to("orders.new").payload(format!("{i}")))
            .expect("publishes");
    }
    a.publish(Message::to("orders.end")).expect("publishes");
    assert!(eventually(
        || topics(&seen).contains(&"orders.end".to_owned())
    ));
    assert!(b.wait_idle(PATIENCE));
    let t = topics(&seen);
    assert_eq!(t.iter().filter(|t| *t == "orders.new").count(), 10, "{t:?}");
}

/// The in-memory suite's brokers, each with its own NATS transport on one server.
struct OverNats {
    server: NatsServer,
}

impl DriverUnderTest for OverNats {
    fn name(&self) -> String {
        "nats-transport".into()
    }
    fn builder(&self) -> tidings::BrokerBuilder {
        let transport = NatsTransport::connect(options(&self.server)).expect("connects");
        Broker::builder()
            .driver(Driver::Thread)
            .transport(Arc::new(transport))
    }
    fn settle(&self, broker: &Broker, what: &str, cond: &mut dyn FnMut() -> bool) {
        ThreadedDriver::new("nats-transport", Driver::Thread).settle(broker, what, cond);
    }
}

/// Suite cases that assert what a broker with a transport does differently, and what.
const DIFFERS: &[(&str, &str)] = &[(
    "fan_out_order_and_exclusivity",
    "asserts PublishReport::accepted, which counts nobody over a transport (delivery \
     happens on receipt, elsewhere)",
)];

#[test]
fn the_in_memory_suite_runs_over_the_transport() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let backend = OverNats { server };
    let mut unexpected = Vec::new();
    for (name, case) in suite::ALL {
        let passed =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| case(&backend))).is_ok();
        match (passed, DIFFERS.iter().find(|(n, _)| n == name)) {
            (true, None) | (false, Some(_)) => {}
            (true, Some((_, why))) => {
                unexpected.push(format!("{name} passes: drop it from DIFFERS ({why})"));
            }
            (false, None) => unexpected.push(format!("{name} fails over the transport")),
        }
    }
    // R-DIST-2: the same handlers and options behave the same over NATS core.
    assert!(unexpected.is_empty(), "{unexpected:#?}");
}

#[test]
fn fan_out_keeps_each_publishers_order_and_one_handler_call_at_a_time() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let (a, _) = broker(&server);
    let (b, _) = broker(&server);
    let (publishers, each) = (3u32, 200u32);
    let total = (publishers * each) as usize;
    type Log = Arc<Mutex<Vec<(u32, u32)>>>;
    let mut subs = Vec::new();
    for _ in 0..3 {
        let log: Log = Arc::default();
        let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let overlap = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (l, r, o) = (Arc::clone(&log), Arc::clone(&running), Arc::clone(&overlap));
        let sub = b
            .subscribe(
                "fan.out",
                SubscribeOptions::new().capacity(total),
                move |m: &Message| {
                    use std::sync::atomic::Ordering::SeqCst;
                    if r.fetch_add(1, SeqCst) > 0 {
                        o.store(true, SeqCst);
                    }
                    let text = String::from_utf8_lossy(m.payload()).into_owned();
                    let (p, i) = text.split_once(':').expect("p:i");
                    l.lock()
                        .expect("not poisoned")
                        .push((p.parse().expect("p"), i.parse().expect("i")));
                    std::thread::yield_now();
                    r.fetch_sub(1, SeqCst);
                    Ok::<(), HandlerError>(())
                },
            )
            .expect("subscribes");
        subs.push((sub, log, overlap));
    }
    std::thread::scope(|s| {
        for p in 0..publishers {
            let a = a.clone();
            s.spawn(move || {
                for i in 0..each {
                    a.publish(Message::to("fan.out").payload(format!("{p}:{i}")))
                        .expect("publishes");
                }
            });
        }
    });
    for (sub, log, overlap) in &subs {
        assert!(
            eventually(|| sub.stats().delivered == total as u64),
            "{:?}",
            sub.stats()
        );
        let mut next = [0u32; 3];
        for &(p, i) in log.lock().expect("not poisoned").iter() {
            // R-ORD-2: each publisher's messages in its order, across the network.
            assert_eq!(i, next[p as usize], "publisher {p}");
            next[p as usize] += 1;
        }
        // R-CORE-3: one handler call at a time per subscription.
        assert!(!overlap.load(std::sync::atomic::Ordering::SeqCst));
        assert!(sub.stats().is_conserved()); // R-DEL-6
    }
    assert!(b.close(Duration::from_secs(5)).is_clean());
}

#[test]
fn the_transport_can_be_shared_between_threads() {
    fn shared<T: Send + Sync + 'static>() {}
    shared::<NatsTransport>();
    shared::<tidings_jetstream::NatsTransportBuilder>();
    shared::<tidings_jetstream::TransportStats>();
}
