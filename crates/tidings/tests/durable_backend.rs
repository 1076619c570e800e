//! The durable-source seam from the outside: a backend plugged in with
//! `BrokerBuilder::durable_backend`, and options a backend cannot honour refused with
//! `StreamError::Unsupported` naming the option and the backend.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tidings::durable::{BackendStream, Capabilities, DurableBackend};
use tidings::embedded::EmbeddedBackend;
use tidings::*;

/// The embedded log with fewer capabilities: no priority, no dedup store.
#[derive(Debug)]
struct Plain(EmbeddedBackend);

impl DurableBackend for Plain {
    fn name(&self) -> &'static str {
        "plain"
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::all().without_priority().without_dedup_store()
    }
    fn open_stream(
        &self,
        config: &StreamConfig,
        patterns: &[Pattern],
    ) -> Result<Arc<dyn BackendStream>, StreamError> {
        self.0.open_stream(config, patterns)
    }
}

fn broker(dir: &Path) -> Broker {
    Broker::builder()
        .driver(Driver::Manual)
        .durable_backend(Arc::new(Plain(EmbeddedBackend::new(dir))))
        .build()
        .unwrap()
}

fn recorder() -> (Arc<Mutex<Vec<String>>>, impl Handler) {
    let got = Arc::new(Mutex::new(Vec::new()));
    let g = got.clone();
    let handler = move |m: &Message| {
        g.lock()
            .unwrap()
            .push(String::from_utf8_lossy(m.payload()).into_owned());
        Ok::<(), HandlerError>(())
    };
    (got, handler)
}

#[test]
fn a_plugged_in_backend_serves_streams_and_durable_subscriptions() {
    let dir = tempfile::tempdir().unwrap();
    let b = broker(dir.path());
    // A backend given by hand: the broker reports no data directory of its own.
    assert_eq!(b.data_dir(), None);
    assert_eq!(b.durable_backend_name(), Some("plain"));
    b.create_stream(StreamConfig::new("orders", ["orders.#"]))
        .unwrap();
    let (got, handler) = recorder();
    let sub = b
        .subscribe(
            DurableSpec::new("orders")
                .name("billing")
                .filter("orders.#"),
            SubscribeOptions::default(),
            handler,
        )
        .unwrap();
    let report = b
        .publish(Message::to("orders.created").payload("a"))
        .unwrap();
    assert_eq!(report.streams, ["orders"]); // R-LOG-1
    b.run_until_idle();
    assert_eq!(*got.lock().unwrap(), ["a"]);
    assert_eq!(sub.committed(), 1); // R-LOG-3
    drop(sub);
    assert!(b.close(Duration::from_secs(5)).is_clean());
}

#[test]
fn priority_is_refused_at_publish_on_a_backend_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let b = broker(dir.path());
    let stream = b
        .create_stream(StreamConfig::new("orders", ["orders.#"]))
        .unwrap();
    let (got, handler) = recorder();
    let _sub = b
        .subscribe("orders.#", SubscribeOptions::default(), handler)
        .unwrap();
    let e = b
        .publish(
            Message::to("orders.created")
                .payload("urgent")
                .priority(Priority::High),
        )
        .unwrap_err();
    // R-DIST-4: the refusal names the option and the backend, typed; nothing was stored
    // or offered.
    match &e {
        PublishError::Stream {
            stream,
            error,
            appended_to,
        } => {
            assert_eq!(stream, "orders");
            assert!(
                matches!(
                    **error,
                    StreamError::Unsupported {
                        feature: "message priority",
                        backend: "plain"
                    }
                ),
                "{error:?}"
            );
            assert_eq!(error.kind(), StreamErrorKind::Unsupported);
            assert!(appended_to.is_empty());
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        e.stream_error().map(StreamError::kind),
        Some(StreamErrorKind::Unsupported)
    );
    assert_eq!(stream.end_offset(), 0);
    b.run_until_idle();
    assert!(got.lock().unwrap().is_empty());
    // A message of normal priority goes through.
    b.publish(Message::to("orders.created").payload("plain"))
        .unwrap();
    b.run_until_idle();
    assert_eq!(*got.lock().unwrap(), ["plain"]);
    assert_eq!(stream.end_offset(), 1);
}

#[test]
fn a_dedup_store_is_refused_on_a_backend_without_one() {
    let dir = tempfile::tempdir().unwrap();
    let b = broker(dir.path());
    let e = b.durable_dedup_store("bill", 10).err().expect("refused");
    assert!(
        matches!(
            e,
            StreamError::Unsupported {
                feature: "durable dedup store",
                backend: "plain"
            }
        ),
        "{e}"
    ); // R-DEL-5
}

#[test]
fn a_data_dir_and_a_backend_together_are_refused_and_none_means_no_streams() {
    let dir = tempfile::tempdir().unwrap();
    let e = Broker::builder()
        .data_dir(dir.path())
        .durable_backend(Arc::new(EmbeddedBackend::new(dir.path())))
        .build()
        .expect_err("refused");
    assert!(
        matches!(
            e,
            ConfigError::Invalid {
                setting: "data_dir",
                ..
            }
        ),
        "{e}"
    ); // R-LIM-1
    let b = Broker::builder().driver(Driver::Manual).build().unwrap();
    assert!(matches!(
        b.create_stream(StreamConfig::new("orders", ["orders.#"])),
        Err(StreamError::NoDataDir)
    ));
    assert_eq!(b.durable_backend_name(), None);
}
