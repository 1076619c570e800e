//! `Broker::publish_async` to a JetStream stream waits for the server's acknowledgement
//! without holding a thread (R-EXE-4): no blocking-pool thread, no runtime worker.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tidings::durable::DurableBackend;
use tidings::{
    Broker, Driver, DurableSpec, HandlerError, Message, Overflow, PublishError, StreamConfig,
    StreamErrorKind, SubscribeOptions,
};
use tidings_jetstream::{ConnectOptions, JetStreamBackend};
use tidings_testkit::nats::{NatsServer, NatsServerOptions};

/// Generous bound for waits (never asserted as a speed).
const PATIENCE: Duration = Duration::from_secs(30);

/// A thread-driven broker on the server `options` names, with the stream `orders`
/// capturing `orders.#`.
fn open(options: ConnectOptions) -> Broker {
    let backend = JetStreamBackend::builder()
        .connect(options)
        .expect("connects");
    let broker = Broker::builder()
        .driver(Driver::Thread)
        .durable_backend(Arc::new(backend) as Arc<dyn DurableBackend>)
        .build()
        .expect("valid configuration");
    broker
        .create_stream(StreamConfig::new("orders", ["orders.#"]))
        .expect("stream");
    broker
}

/// A runtime whose only blocking-pool thread is taken until the returned sender is
/// dropped: a publish that needs a blocking-pool thread waits for it.
fn runtime_with_its_blocking_pool_taken() -> (tokio::runtime::Runtime, std::sync::mpsc::Sender<()>)
{
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let (release, released) = std::sync::mpsc::channel::<()>();
    let (taken, is_taken) = std::sync::mpsc::channel::<()>();
    rt.spawn_blocking(move || {
        let _ = taken.send(());
        let _ = released.recv();
    });
    is_taken
        .recv_timeout(PATIENCE)
        .expect("the blocking thread started");
    (rt, release)
}

// R-EXE-4: the append is awaited on the backend's runtime; the caller's runtime lends no
// thread to it. With the publish run on the blocking pool (as before), every publish
// waits for the taken thread and the timeout below fails the test.
#[test]
fn publish_async_to_a_jetstream_stream_takes_no_blocking_thread() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let broker = open(ConnectOptions::new(server.url()));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let sub = broker
        .subscribe(
            DurableSpec::new("orders").name("reader"),
            SubscribeOptions::default(),
            move |m: &Message| {
                log.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(m.payload()).into_owned());
                Ok::<(), HandlerError>(())
            },
        )
        .expect("subscribes");
    let (rt, release) = runtime_with_its_blocking_pool_taken();
    let published = rt.block_on(async {
        tokio::time::timeout(PATIENCE, async {
            let mut reports = Vec::new();
            for i in 0..50 {
                let report = broker
                    .publish_async(Message::to(format!("orders.{}", i % 3)).payload(i.to_string()))
                    .await
                    .expect("published");
                reports.push(report);
            }
            reports
        })
        .await
    });
    drop(release);
    let reports = published.expect("50 publishes without a blocking-pool thread");
    for r in &reports {
        assert_eq!(r.streams, ["orders"]); // stored in the stream, as by `publish`
        assert!(r.duplicate_in.is_empty());
    }
    let deadline = Instant::now() + PATIENCE;
    while seen.lock().unwrap().len() < 50 {
        assert!(Instant::now() < deadline, "the subscription got all 50");
        std::thread::sleep(Duration::from_millis(20));
    }
    // R-ORD-2: sequential publishes from one task keep their order.
    let expected: Vec<String> = (0..50).map(|i: u32| i.to_string()).collect();
    assert_eq!(*seen.lock().unwrap(), expected);
    drop(sub);
    drop(rt);
    broker.close(Duration::from_secs(10));
}

// A subscription that makes publishers wait (`Overflow::Block`) on the published topic: the
// offers may wait, so they run on the blocking pool — never on a runtime worker, whose
// other tasks keep running while the publish waits for room.
#[test]
fn a_publish_async_that_waits_for_room_leaves_the_runtime_free() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let broker = open(ConnectOptions::new(server.url()));
    let (go, gate) = std::sync::mpsc::channel::<()>();
    let gate = Mutex::new(gate);
    let _slow = broker
        .subscribe(
            "orders.#",
            SubscribeOptions::new()
                .capacity(1)
                .overflow(Overflow::Block {
                    timeout: Duration::from_secs(60),
                }),
            move |_: &Message| {
                let _ = gate.lock().unwrap().recv_timeout(PATIENCE);
                Ok::<(), HandlerError>(())
            },
        )
        .expect("subscribes");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let publisher = broker.clone();
        let publishing = tokio::spawn(async move {
            for i in 0..4 {
                publisher
                    .publish_async(Message::to("orders.a").payload(i.to_string()))
                    .await
                    .expect("published");
            }
        });
        // The one runtime thread still runs other tasks while the publishes wait for the
        // handler to make room.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!publishing.is_finished(), "the publishes wait for room");
        for _ in 0..4 {
            let _ = go.send(());
        }
        tokio::time::timeout(PATIENCE, publishing)
            .await
            .expect("the publishes finish once room is made")
            .expect("no panic");
    });
    broker.close(Duration::from_secs(10));
}

// R-DIST-5, R-LIM-1: the ways an async publish fails are the sync one's, typed, and none
// hangs: a server that is gone (within the request timeout), a payload over the server's
// limit, a closed broker.
#[test]
fn a_publish_async_fails_as_publish_does() {
    let Some(mut server) = NatsServer::for_test(NatsServerOptions::new().max_payload(8192)) else {
        return;
    };
    let broker = open(
        ConnectOptions::new(server.url())
            .connect_timeout(Duration::from_secs(2))
            .request_timeout(Duration::from_secs(2)),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let too_large = broker
            .publish_async(Message::to("orders.big").payload(vec![0u8; 64 * 1024]))
            .await;
        assert!(
            matches!(&too_large, Err(PublishError::Stream { stream, .. }) if stream == "orders"),
            "{too_large:?}"
        );
        broker
            .publish_async(Message::to("orders.small").payload("fits"))
            .await
            .expect("a message that fits is still published");

        server.kill().expect("SIGKILL the server");
        let away = tokio::time::timeout(
            PATIENCE,
            broker.publish_async(Message::to("orders.lost").payload("x")),
        )
        .await
        .expect("bounded by the request timeout, not hanging");
        assert!(
            matches!(&away, Err(PublishError::Stream { stream, error, .. })
                if stream == "orders"
                    && matches!(error.kind(), StreamErrorKind::Unavailable | StreamErrorKind::TimedOut)),
            "{away:?}"
        );

        broker.close_async(Duration::from_secs(5)).await;
        let closed = broker
            .publish_async(Message::to("orders.late").payload("x"))
            .await;
        assert!(matches!(closed, Err(PublishError::Closed)), "{closed:?}");
    });
}
