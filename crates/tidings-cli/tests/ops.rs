//! The offline data-dir tools of the `tidings` binary (R-OPS-5): a data directory built by a
//! real broker (a stream, a durable subscription, dead letters), then the real binary lists,
//! shows, prints JSON, seeks, redrives and purges, and refuses to write while a live broker
//! holds the directory. Manual driver and clock: no sleeps.

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;

use serde_json::Value;
use std::sync::Mutex;
use tidings::embedded::Fsync;
use tidings::{
    Broker, Driver, DurableSpec, HandlerError, ManualClock, Message, StreamConfig, SubscribeOptions,
};

fn tidings(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tidings"))
        .args(args)
        .arg("--data-dir")
        .arg(dir)
        .output()
        .expect("the tidings binary runs")
}

/// Run, expect exit 0, return stdout.
fn ok(dir: &Path, args: &[&str]) -> String {
    let out = tidings(dir, args);
    assert!(
        out.status.success(),
        "tidings {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// Run with `--json`, expect exit 0, parse stdout.
fn json(dir: &Path, args: &[&str]) -> Value {
    let mut args = args.to_vec();
    args.push("--json");
    let text = ok(dir, &args);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {text}"))
}

fn broker(dir: &Path) -> Broker {
    Broker::builder()
        .data_dir(dir)
        .driver(Driver::Manual)
        .clock(ManualClock::new())
        .build()
        .unwrap()
}

fn orders(b: &Broker) {
    b.create_stream(StreamConfig::new("orders", ["orders.#"]))
        .unwrap();
}

/// Payloads a durable handler saw.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<String>>>);

impl Seen {
    fn push(&self, m: &Message) {
        self.0
            .lock()
            .unwrap()
            .push(String::from_utf8_lossy(m.payload()).into_owned());
    }
    fn get(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

/// A data dir with stream `orders` (10 records) and durable `billing`, which rejected the
/// three `bad-*` orders (at offsets 2, 5, 7) into its durable DLQ. Everything is closed.
fn build(dir: &Path) {
    let b = broker(dir);
    orders(&b);
    let seen = Seen::default();
    let s = seen.clone();
    let d = b
        .subscribe(
            DurableSpec::new("orders").name("billing"),
            SubscribeOptions::default(),
            move |m: &Message| {
                if m.payload().starts_with(b"bad") {
                    return Err(HandlerError::reject("unknown customer"));
                }
                s.push(m);
                Ok(())
            },
        )
        .unwrap();
    for i in 0..10 {
        let payload = if [2, 5, 7].contains(&i) {
            format!("bad-{i}")
        } else {
            format!("order-{i}")
        };
        b.publish(
            Message::to("orders.created")
                .key(format!("customer-{i}"))
                .header("region", "eu")
                .payload(payload),
        )
        .unwrap();
    }
    b.run_until_idle();
    assert_eq!(seen.get().len(), 7);
    assert_eq!(d.durable_dead_letters().unwrap().len(), 3);
    assert_eq!(d.committed(), 10);
    drop(d);
    b.close(std::time::Duration::from_secs(5));
}

fn entries(v: &Value) -> Vec<u64> {
    v["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| e["entry"].as_u64().expect("entry id"))
        .collect()
}

#[test]
fn list_show_json_seek_redrive_purge_and_refuse_while_locked() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    build(dir);

    // Lists and tables.
    let table = ok(dir, &["stream", "ls"]);
    assert!(table.starts_with("STREAM"), "{table}"); // R-OPS-5
    assert!(table.contains("orders"), "{table}"); // R-OPS-5
    let streams = json(dir, &["stream", "ls"]);
    let s = &streams["streams"][0];
    assert_eq!(s["name"], "orders"); // R-OPS-5
    assert_eq!(
        (s["start_offset"].as_u64(), s["end_offset"].as_u64()),
        (Some(0), Some(10))
    ); // R-OPS-5
    assert_eq!(
        (s["records"].as_u64(), s["consumers"].as_u64()),
        (Some(10), Some(1))
    ); // R-OPS-5
    assert_eq!(s["locked"], false); // R-OPS-5
    assert!(ok(dir, &["stream", "info", "orders"]).contains("records      10")); // R-OPS-5

    let consumers = ok(dir, &["consumer", "ls", "orders"]);
    assert!(
        consumers.contains("billing") && consumers.contains("rejected=3"),
        "{consumers}"
    ); // R-OPS-5
    let c = json(dir, &["consumer", "info", "orders", "billing"]);
    assert_eq!(c["committed"], 10); // R-OPS-5
    assert_eq!(c["lag"], 0); // R-OPS-5
    assert_eq!(c["dead_letters"], 3); // R-OPS-5
    assert_eq!(c["dead_letters_by_reason"]["rejected"], 3); // R-OPS-5
    assert_eq!(c["active"], false); // R-OPS-5

    let dl = json(dir, &["dlq", "ls"]);
    assert_eq!(dl["consumers"][0]["name"], "billing"); // R-OPS-5
    let show = json(dir, &["dlq", "show", "orders", "billing"]);
    assert_eq!(show["total"], 3); // R-OPS-5
    let list = show["entries"].as_array().unwrap();
    let offsets: Vec<_> = list.iter().map(|e| e["stream_offset"].as_u64()).collect();
    assert_eq!(offsets, [Some(2), Some(5), Some(7)]); // R-OPS-5
    let first = &list[0];
    assert_eq!(first["payload_preview"], "bad-2"); // R-OPS-5
    assert_eq!(first["topic"], "orders.created"); // R-OPS-5
    assert_eq!(first["key"], "customer-2"); // R-OPS-5
    assert_eq!(first["reason_kind"], "rejected"); // R-OPS-5
    assert!(
        first["reason"]
            .as_str()
            .unwrap()
            .contains("unknown customer")
    ); // R-OPS-5
    // The user's headers (the `otel` feature, on under --all-features, adds `traceparent`).
    let headers: Vec<_> = first["headers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h[0] != "traceparent")
        .cloned()
        .collect();
    assert_eq!(headers, [serde_json::json!(["region", "eu"])]); // R-OPS-5
    let ids = entries(&show);
    let human = ok(dir, &["dlq", "show", "orders", "billing"]);
    assert!(
        human.contains("3 dead letter(s)") && human.contains("unknown customer"),
        "{human}"
    ); // R-OPS-5

    // A live broker holds the stream: reads run, writes are refused and change nothing.
    {
        let live = broker(dir);
        orders(&live);
        let s = json(dir, &["stream", "info", "orders"]);
        assert_eq!(s["locked"], true); // R-OPS-5
        assert_eq!(json(dir, &["dlq", "show", "orders", "billing"])["total"], 3); // R-OPS-5
        for args in [
            &["dlq", "redrive", "orders", "billing", "--all"][..],
            &["dlq", "purge", "orders", "billing", "--all"],
            &["consumer", "seek", "orders", "billing", "--earliest"],
        ] {
            let out = tidings(dir, args);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {err}"); // R-OPS-5
            assert!(
                err.contains("locked") && err.contains("LOCK"),
                "{args:?}: {err}"
            ); // R-OPS-5
        }
        live.close(std::time::Duration::from_secs(5));
    }
    assert_eq!(json(dir, &["dlq", "show", "orders", "billing"])["total"], 3); // R-OPS-5
    assert_eq!(
        json(dir, &["consumer", "info", "orders", "billing"])["committed"],
        10
    ); // R-OPS-5

    // Unknown entries and names: typed refusals, nothing changes.
    let out = tidings(
        dir,
        &["dlq", "redrive", "orders", "billing", "--entry", "999"],
    );
    assert_eq!(out.status.code(), Some(2)); // R-OPS-5
    let out = tidings(dir, &["dlq", "show", "orders", "nobody"]);
    assert_eq!(out.status.code(), Some(2)); // R-OPS-5
    let out = tidings(dir, &["stream", "info", "../etc"]);
    assert_eq!(out.status.code(), Some(2)); // R-OPS-5

    // Redrive one entry, purge one, redrive the rest.
    let first_id = ids[0].to_string();
    let r = json(
        dir,
        &["dlq", "redrive", "orders", "billing", "--entry", &first_id],
    );
    assert_eq!(r["entries"], serde_json::json!([ids[0]])); // R-OPS-5
    assert_eq!(r["stream_offsets"], serde_json::json!([10])); // R-OPS-5
    assert_eq!(r["remaining"], 2); // R-OPS-5
    let p = json(
        dir,
        &[
            "dlq",
            "purge",
            "orders",
            "billing",
            "--entry",
            &ids[1].to_string(),
        ],
    );
    assert_eq!(
        (p["entries"].clone(), p["remaining"].clone()),
        (serde_json::json!([ids[1]]), 1.into())
    ); // R-OPS-5
    let out = tidings(dir, &["dlq", "redrive", "orders", "billing", "--all"]);
    assert!(out.status.success());
    let progress = String::from_utf8_lossy(&out.stderr);
    assert!(
        progress.contains("redrive orders/billing: 1/1"),
        "plain progress lines off a terminal: {progress}"
    );
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains("redrove 1 dead letter(s) to stream offsets 11..=11")
    );
    assert_eq!(json(dir, &["dlq", "show", "orders", "billing"])["total"], 0); // R-OPS-5
    let s = json(dir, &["stream", "info", "orders"]);
    assert_eq!(s["end_offset"], 12); // R-OPS-5
    let c = json(dir, &["consumer", "info", "orders", "billing"]);
    assert_eq!(
        (c["lag"].as_u64(), c["dead_letters"].as_u64()),
        (Some(2), Some(0))
    ); // R-OPS-5

    // The reopened broker delivers the redriven messages (not the purged one), and its own
    // view of the durable DLQ agrees that it is empty.
    let b = broker(dir);
    orders(&b);
    let seen = Seen::default();
    let s2 = seen.clone();
    let d = b
        .subscribe(
            DurableSpec::new("orders").name("billing"),
            SubscribeOptions::default(),
            move |m: &Message| {
                s2.push(m);
                Ok(())
            },
        )
        .unwrap();
    b.run_until_idle();
    assert_eq!(seen.get(), ["bad-2", "bad-7"]); // R-OPS-5
    assert_eq!(d.committed(), 12); // R-OPS-5
    assert!(d.durable_dead_letters().unwrap().is_empty()); // R-OPS-5
    drop(d);
    b.close(std::time::Duration::from_secs(5));

    // Seek: to an offset, by time, to the ends; outside the stream is refused.
    let out = json(
        dir,
        &["consumer", "seek", "orders", "billing", "--offset", "3"],
    );
    assert_eq!(
        (out["previous"].as_u64(), out["committed"].as_u64()),
        (Some(12), Some(3))
    ); // R-OPS-5
    assert_eq!(
        json(dir, &["consumer", "info", "orders", "billing"])["lag"],
        9
    ); // R-OPS-5
    let out = json(
        dir,
        &["consumer", "seek", "orders", "billing", "--earliest"],
    );
    assert_eq!(out["committed"], 0); // R-OPS-5
    let out = json(
        dir,
        &[
            "consumer",
            "seek",
            "orders",
            "billing",
            "--time",
            "2999-01-01T00:00:00Z",
        ],
    );
    assert_eq!(out["committed"], 12); // R-OPS-5
    let out = json(
        dir,
        &["consumer", "seek", "orders", "billing", "--time", "0"],
    );
    assert_eq!(out["committed"], 0); // R-OPS-5
    let out = json(dir, &["consumer", "seek", "orders", "billing", "--latest"]);
    assert_eq!(out["committed"], 12); // R-OPS-5
    let out = tidings(
        dir,
        &["consumer", "seek", "orders", "billing", "--offset", "99"],
    );
    assert!(!out.status.success()); // R-OPS-5
    assert!(String::from_utf8_lossy(&out.stderr).contains("beyond the end"));
    assert_eq!(
        json(dir, &["consumer", "info", "orders", "billing"])["committed"],
        12
    ); // R-OPS-5
}

#[test]
fn missing_data_dir_and_empty_dir() {
    let tmp = tempfile::tempdir().unwrap();
    // R-OPS-5: an empty directory has no streams; a missing one is a usage error.
    assert!(ok(tmp.path(), &["stream", "ls"]).contains("no streams"));
    assert_eq!(
        json(tmp.path(), &["dlq", "ls"])["consumers"],
        serde_json::json!([])
    );
    let out = tidings(&tmp.path().join("nope"), &["stream", "ls"]);
    assert_eq!(out.status.code(), Some(2)); // R-OPS-5
    let out = Command::new(env!("CARGO_BIN_EXE_tidings"))
        .args(["dlq", "ls"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2)); // R-OPS-5
    assert!(String::from_utf8_lossy(&out.stderr).contains("--data-dir"));
}

#[test]
fn redrive_a_thousand_in_batches_with_progress_lines() {
    // R-OPS-5: a redrive larger than one batch (256) appends every entry exactly once, in
    // order, reports plain progress lines off a terminal, and the broker delivers them all.
    const N: usize = 1000;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    {
        // Fast: no fsync (the embedded log's own setting).
        let backend = tidings::embedded::EmbeddedBackend::new(dir)
            .stream_defaults(tidings::embedded::EmbeddedStreamOptions::new().fsync(Fsync::Never));
        let b = Broker::builder()
            .durable_backend(std::sync::Arc::new(backend))
            .driver(Driver::Manual)
            .clock(ManualClock::new())
            .build()
            .unwrap();
        b.create_stream(StreamConfig::new("orders", ["orders.#"]))
            .unwrap();
        let d = b
            .subscribe(
                DurableSpec::new("orders").name("billing"),
                SubscribeOptions::default(),
                |_: &Message| Err(HandlerError::reject("closed for the day")),
            )
            .unwrap();
        for i in 0..N {
            b.publish(Message::to("orders.created").payload(format!("order-{i}")))
                .unwrap();
            if i % 100 == 99 {
                b.run_until_idle();
            }
        }
        b.run_until_idle();
        assert_eq!(d.durable_dead_letters().unwrap().len(), N);
        drop(d);
        b.close(std::time::Duration::from_secs(5));
    }
    let out = tidings(
        dir,
        &["dlq", "redrive", "orders", "billing", "--all", "--json"],
    );
    assert!(out.status.success());
    let progress = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        progress.lines().collect::<Vec<_>>(),
        [
            "redrive orders/billing: 256/1000",
            "redrive orders/billing: 512/1000",
            "redrive orders/billing: 768/1000",
            "redrive orders/billing: 1000/1000",
        ]
    );
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    let offsets: Vec<u64> = r["stream_offsets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_u64().unwrap())
        .collect();
    assert_eq!(offsets, (N as u64..2 * N as u64).collect::<Vec<_>>()); // R-OPS-5
    assert_eq!(r["remaining"], 0); // R-OPS-5

    let b = broker(dir);
    orders(&b);
    let seen = Seen::default();
    let s = seen.clone();
    let d = b
        .subscribe(
            DurableSpec::new("orders").name("billing"),
            SubscribeOptions::default(),
            move |m: &Message| {
                s.push(m);
                Ok(())
            },
        )
        .unwrap();
    b.run_until_idle();
    let expected: Vec<String> = (0..N).map(|i| format!("order-{i}")).collect();
    assert_eq!(seen.get(), expected); // R-OPS-5: each redriven once, in DLQ order
    assert_eq!(d.committed(), 2 * N as u64);
    drop(d);
    b.close(std::time::Duration::from_secs(5));
}
