//! The broker's async calls outside a tokio runtime and when their runtime shuts down
//! (R-EXE-1): they neither start a thread per call nor wait forever. Run with
//! `--features tokio` (CI: `cargo test --workspace --all-features`).
#![cfg(feature = "tokio")]

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tidings::{
    Broker, DurableSpec, Message, PublishError, RequestError, StreamConfig, SubscribeOptions,
};

/// Poll `fut` once with a waker that does nothing: what an executor other than tokio (or a
/// hand-written `block_on`) does first.
fn poll_once<F: Future>(fut: F) -> Poll<F::Output> {
    pin!(fut)
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
}

fn os_threads() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
}

// R-EXE-1: outside a tokio runtime each async call runs its sync form on the polling thread
// and is ready at the first poll — no thread per call (earlier: one OS thread each), no
// waker that never fires.
#[test]
fn outside_a_runtime_async_calls_complete_in_their_first_poll_on_the_polling_thread() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::builder().data_dir(dir.path()).build().unwrap();
    broker
        .create_stream(StreamConfig::new("orders", ["orders.#"]))
        .unwrap();
    let orders = broker
        .subscribe(
            "orders.#",
            SubscribeOptions::default(),
            |_: &Message| Ok(()),
        )
        .unwrap();
    let threads_before = os_threads();
    for i in 0..200 {
        let Poll::Ready(report) =
            poll_once(broker.publish_async(Message::to("orders.a").payload(i.to_string())))
        else {
            panic!("publish_async outside a runtime was not ready at its first poll");
        };
        let report = report.unwrap();
        assert_eq!((report.accepted, report.streams.len()), (1, 1));
    }
    assert!(
        os_threads() <= threads_before,
        "threads grew from {threads_before} to {} over 200 async publishes",
        os_threads()
    );
    // The appends are there: a durable subscription from the start reads all 200.
    let durable = broker
        .subscribe(
            DurableSpec::new("orders").name("audit"),
            SubscribeOptions::default(),
            |_: &Message| Ok(()),
        )
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while durable.stats().delivered < 200 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(durable.stats().delivered, 200);
    assert_eq!(orders.stats().delivered, 200);

    let Poll::Ready(reply) =
        poll_once(broker.request_async(Message::to("nobody.home"), Duration::from_secs(1)))
    else {
        panic!("request_async outside a runtime was not ready at its first poll");
    };
    assert_eq!(reply.unwrap_err(), RequestError::NoResponders);

    drop(durable);
    let Poll::Ready(report) = poll_once(broker.close_async(Duration::from_secs(5))) else {
        panic!("close_async outside a runtime was not ready at its first poll");
    };
    assert!(report.is_clean(), "{report:?}");
    let Poll::Ready(after) = poll_once(broker.publish_async(Message::to("orders.a"))) else {
        panic!("not ready");
    };
    assert_eq!(after.unwrap_err(), PublishError::Closed);
}

// R-EXE-1: a publish moved onto a runtime that shuts down before running it ends with a
// typed error (it waited forever before).
#[test]
fn a_publish_whose_runtime_shuts_down_ends_with_a_typed_error() {
    let broker = Broker::builder().build().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut publish = Box::pin(broker.publish_async(Message::to("orders.a")));
    {
        // Inside the runtime's context, but nobody drives it: the publish is spawned as a
        // task and waits for it.
        let _inside = runtime.enter();
        let first = publish
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()));
        assert!(
            first.is_pending(),
            "the task cannot have run: nothing drives the runtime"
        );
    }
    drop(runtime);
    let after = publish
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()));
    assert_eq!(after, Poll::Ready(Err(PublishError::RuntimeShutDown)));
    broker.close(Duration::from_secs(5));
}
