//! Publish and process spans, and trace context crossing a publish (R-OPS-3).

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tidings::{Broker, Driver, HandlerError, ManualClock, Message, SubscribeOptions};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// One span as the layer saw it.
#[derive(Debug, Clone, Default)]
struct SpanRec {
    name: String,
    fields: BTreeMap<String, String>,
    /// The `tracing` parent's name, if any.
    parent: Option<String>,
}

#[derive(Default, Clone)]
struct Recorder(Arc<Mutex<Vec<(u64, SpanRec)>>>);

struct FieldVisitor<'a>(&'a mut BTreeMap<String, String>);

impl Visit for FieldVisitor<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

/// The one global subscriber's layer: it hands each span to the [`Recorder`] of the test
/// running on the current thread, if any. (A global subscriber rather than per-test
/// `with_default` ones: scoped dispatchers in parallel tests race on tracing's per-callsite
/// interest cache and can miss spans.)
struct Router;

thread_local! {
    static SINK: std::cell::RefCell<Option<Recorder>> = const { std::cell::RefCell::new(None) };
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for Router {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(sink) = SINK.with(|s| s.borrow().clone()) else {
            return;
        };
        let mut rec = SpanRec {
            name: attrs.metadata().name().to_owned(),
            ..Default::default()
        };
        attrs.record(&mut FieldVisitor(&mut rec.fields));
        rec.parent = ctx
            .span(id)
            .and_then(|s| s.parent())
            .map(|p| p.name().to_owned());
        sink.0.lock().push((id.into_u64(), rec));
    }
    fn on_record(&self, id: &Id, values: &Record<'_>, _ctx: Context<'_, S>) {
        let Some(sink) = SINK.with(|s| s.borrow().clone()) else {
            return;
        };
        let mut all = sink.0.lock();
        if let Some((_, rec)) = all.iter_mut().rev().find(|(i, _)| *i == id.into_u64()) {
            values.record(&mut FieldVisitor(&mut rec.fields));
        }
    }
}

impl Recorder {
    /// Run `f` with the spans created on this thread recorded here.
    fn scope<T>(&self, f: impl FnOnce() -> T) -> T {
        static GLOBAL: std::sync::Once = std::sync::Once::new();
        GLOBAL.call_once(|| {
            tracing::subscriber::set_global_default(tracing_subscriber::registry().with(Router))
                .expect("no other global subscriber in this test binary");
        });
        SINK.with(|s| *s.borrow_mut() = Some(self.clone()));
        let out = f();
        SINK.with(|s| *s.borrow_mut() = None);
        out
    }

    fn named(&self, name: &str) -> Vec<SpanRec> {
        self.0
            .lock()
            .iter()
            .filter(|(_, r)| r.name == name)
            .map(|(_, r)| r.clone())
            .collect()
    }
}

fn manual() -> Broker {
    Broker::builder()
        .driver(Driver::Manual)
        .clock(ManualClock::new())
        .build()
        .unwrap()
}

#[test]
fn publish_and_process_spans_carry_the_messaging_attributes() {
    let rec = Recorder::default();
    rec.scope(|| {
        let b = manual();
        let _s = b
            .subscribe(
                "orders.*",
                SubscribeOptions::new().name("billing"),
                |_: &Message| Err::<(), _>(HandlerError::reject("no")),
            )
            .unwrap();
        let outer = tracing::info_span!("checkout");
        let id = outer.in_scope(|| {
            b.publish(Message::to("orders.created").correlation_id("conv-7"))
                .unwrap()
                .id
        });
        b.run_until_idle();

        let publish = rec.named("publish");
        assert_eq!(publish.len(), 1);
        let p = &publish[0].fields;
        assert_eq!(publish[0].parent.as_deref(), Some("checkout")); // R-OPS-3: runs in the caller's span
        assert_eq!(p["otel.name"], "publish orders.created"); // R-OPS-3
        assert_eq!(p["messaging.system"], "tidings");
        assert_eq!(p["messaging.destination.name"], "orders.created");
        assert_eq!(p["messaging.message.id"], id.to_string());
        assert_eq!(p["messaging.message.conversation_id"], "conv-7");

        let process = rec.named("process");
        assert_eq!(process.len(), 1);
        let f = &process[0].fields;
        assert_eq!(f["otel.name"], "process orders.created"); // R-OPS-3
        assert_eq!(f["messaging.system"], "tidings");
        assert_eq!(f["messaging.destination.name"], "orders.created");
        assert_eq!(f["messaging.message.id"], id.to_string());
        assert_eq!(f["messaging.message.conversation_id"], "conv-7");
        assert_eq!(f["messaging.consumer.group.name"], "billing");
        assert_eq!(f["attempt"], "1");
        assert_eq!(f["outcome"], "rejected"); // R-OPS-3
    });
}

#[cfg(feature = "otel")]
#[test]
fn the_handlers_span_continues_the_publishers_trace() {
    let rec = Recorder::default();
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    rec.scope(|| {
        let b = manual();
        let weak = b.downgrade();
        let seen2 = seen.clone();
        let _s = b
            .subscribe(
                "orders.created",
                SubscribeOptions::default(),
                move |m: &Message| {
                    seen2.lock().push(
                        m.header(tidings::ops::trace::TRACEPARENT)
                            .unwrap_or("")
                            .to_owned(),
                    );
                    // Published from inside the handler: joins the same trace.
                    if let Some(b) = weak.upgrade() {
                        b.publish(Message::to("orders.billed")).unwrap();
                    }
                    Ok::<(), HandlerError>(())
                },
            )
            .unwrap();
        let _sink = b
            .subscribe(
                "orders.billed",
                SubscribeOptions::default(),
                |_: &Message| Ok::<(), HandlerError>(()),
            )
            .unwrap();
        tracing::info_span!("checkout").in_scope(|| {
            b.publish(Message::to("orders.created")).unwrap();
        });
        b.run_until_idle();

        let publish = rec.named("publish");
        let process = rec.named("process");
        assert_eq!((publish.len(), process.len()), (2, 2));
        let (p0, p1) = (&publish[0].fields, &publish[1].fields);
        let (h0, h1) = (&process[0].fields, &process[1].fields);
        // The handler's span has the publish span as its parent, in one trace (R-OPS-3).
        assert_eq!(h0["parent_span_id"], p0["span_id"]); // R-OPS-3
        assert_eq!(h0["trace_id"], p0["trace_id"]); // R-OPS-3
        assert_ne!(h0["span_id"], p0["span_id"]);
        // The W3C header the handler saw is the publisher's context (R-OPS-3).
        let tp = seen.lock()[0].clone();
        assert_eq!(tp, format!("00-{}-{}-01", p0["trace_id"], p0["span_id"])); // R-OPS-3
        // A publish from inside the handler continues the trace, and so on down.
        assert_eq!(publish[1].parent.as_deref(), Some("process"));
        assert_eq!(p1["trace_id"], p0["trace_id"]); // R-OPS-3
        assert_eq!(h1["parent_span_id"], p1["span_id"]);
        assert_eq!(h1["trace_id"], p0["trace_id"]);
    });
}

#[cfg(feature = "otel")]
#[test]
fn a_traceparent_given_by_the_publisher_is_kept() {
    // A message arriving from another process already carries its trace context.
    let b = manual();
    let seen = Arc::new(Mutex::new(None));
    let s2 = seen.clone();
    let _s = b
        .subscribe("t", SubscribeOptions::default(), move |m: &Message| {
            *s2.lock() = m.header("traceparent").map(str::to_owned);
            Ok::<(), HandlerError>(())
        })
        .unwrap();
    let given = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    b.publish(Message::to("t").header("traceparent", given))
        .unwrap();
    b.run_until_idle();
    assert_eq!(seen.lock().as_deref(), Some(given)); // R-OPS-3
}

// An async handler (tokio driver) runs in its `process` span on every poll, across its
// awaits: what it publishes after an await is a child of that span (and, with `otel`,
// continues the trace).
#[cfg(feature = "tokio")]
#[test]
fn async_handlers_run_in_their_process_span_across_awaits() {
    use std::time::{Duration, Instant};
    let rec = Recorder::default();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rec.scope(|| {
        rt.block_on(async {
            let b = Broker::builder()
                .driver(Driver::Tokio(tokio::runtime::Handle::current()))
                .build()
                .unwrap();
            let weak = b.downgrade();
            let _ship = b
                .subscribe(
                    "orders.created",
                    SubscribeOptions::new().name("ship"),
                    move |_m: Arc<Message>| {
                        let weak = weak.clone();
                        async move {
                            tokio::task::yield_now().await;
                            if let Some(b) = weak.upgrade() {
                                b.publish(Message::to("orders.shipped")).unwrap();
                            }
                            Ok::<(), HandlerError>(())
                        }
                    },
                )
                .unwrap();
            let sink = b
                .subscribe(
                    "orders.shipped",
                    SubscribeOptions::default(),
                    |_: &Message| Ok::<(), HandlerError>(()),
                )
                .unwrap();
            b.publish(Message::to("orders.created")).unwrap();
            let deadline = Instant::now() + Duration::from_secs(20);
            while sink.stats().delivered == 0 {
                assert!(
                    Instant::now() < deadline,
                    "the async handler never published"
                );
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            assert!(b.close_async(Duration::from_secs(5)).await.is_clean());
        });
    });
    let process = rec.named("process");
    let ship = process
        .iter()
        .find(|p| {
            p.fields
                .get("messaging.consumer.group.name")
                .map(String::as_str)
                == Some("ship")
        })
        .expect("a process span for the async handler"); // R-OPS-3
    assert_eq!(ship.fields["otel.name"], "process orders.created"); // R-OPS-3
    assert_eq!(ship.fields["outcome"], "ok"); // R-OPS-3
    let publish = rec.named("publish");
    let shipped = publish
        .iter()
        .find(|p| p.fields["messaging.destination.name"] == "orders.shipped")
        .expect("the handler's publish span");
    assert_eq!(shipped.parent.as_deref(), Some("process")); // R-OPS-3: after an await too
    #[cfg(feature = "otel")]
    {
        let created = publish
            .iter()
            .find(|p| p.fields["messaging.destination.name"] == "orders.created")
            .unwrap();
        assert_eq!(ship.fields["parent_span_id"], created.fields["span_id"]); // R-OPS-3
        assert_eq!(shipped.fields["trace_id"], created.fields["trace_id"]); // R-OPS-3
    }
}

// The trace context is stored with the message in a durable stream: a handler reading it
// after a restart (another broker on the same data dir, as another process would) still
// continues the publisher's trace.
#[cfg(feature = "otel")]
#[test]
fn the_trace_survives_a_durable_stream_and_a_restart() {
    use tidings::{DurableSpec, StreamConfig};
    let dir = tempfile::tempdir().unwrap();
    let open = || {
        let b = Broker::builder()
            .driver(Driver::Manual)
            .clock(ManualClock::new())
            .data_dir(dir.path())
            .build()
            .unwrap();
        b.create_stream(StreamConfig::new("orders", ["orders.#"]))
            .unwrap();
        b
    };
    let rec = Recorder::default();
    rec.scope(|| {
        let first = open();
        tracing::info_span!("checkout").in_scope(|| {
            first.publish(Message::to("orders.created")).unwrap();
        });
        assert!(first.close(std::time::Duration::from_secs(5)).is_clean());
        drop(first);
        let second = open();
        let _ship = second
            .subscribe(
                DurableSpec::new("orders").name("ship").filter("orders.#"),
                SubscribeOptions::default(),
                |_: &Message| Ok::<(), HandlerError>(()),
            )
            .unwrap();
        second.run_until_idle();
    });
    let publish = rec.named("publish");
    let process = rec.named("process");
    assert_eq!((publish.len(), process.len()), (1, 1));
    let (p, h) = (&publish[0].fields, &process[0].fields);
    assert_eq!(h["parent_span_id"], p["span_id"]); // R-OPS-3 across a restart
    assert_eq!(h["trace_id"], p["trace_id"]); // R-OPS-3
}
