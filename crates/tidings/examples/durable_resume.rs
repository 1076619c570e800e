//! A durable stream, a crash, and resuming at the committed position.
//!
//! 1. A broker with a data directory creates the stream `orders` and publishes 10 orders
//!    (each synced before `publish` returns, `Fsync::Always`).
//! 2. A child process (this same program) subscribes the durable name `billing`, commits
//!    its position every 4 messages, and **aborts** in the middle of message 6: no close,
//!    no flush — what `kill -9` or a power cut would leave.
//! 3. A new broker resumes `billing` at the last committed position: the messages after it
//!    are delivered again (at-least-once), nothing before it is, and none is lost.
//!
//! ```text
//! cargo run -p tidings --example durable_resume
//! ```

use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tidings::embedded::{EmbeddedBackend, EmbeddedStreamOptions};
use tidings::{
    Broker, DurableSpec, HandlerError, Message, StartAt, Stream, StreamConfig, SubscribeOptions,
};

const ORDERS: u64 = 10;
const CRASH_AT: u64 = 6;

fn open(dir: &Path) -> Result<(Broker, Stream), Box<dyn std::error::Error>> {
    // The embedded log's own settings (here: commit the position every 4 messages) live
    // with its backend; `BrokerBuilder::data_dir(dir)` gives the defaults.
    let backend =
        EmbeddedBackend::new(dir).stream_defaults(EmbeddedStreamOptions::new().commit_every(4));
    let broker = Broker::builder()
        .durable_backend(Arc::new(backend))
        .build()?;
    let stream = broker.create_stream(StreamConfig::new("orders", ["orders.#"]))?;
    Ok((broker, stream))
}

/// The child: handle orders until message `CRASH_AT`, then abort the process.
fn crashing_consumer(dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let (broker, _stream) = open(dir)?;
    let _billing = broker.subscribe(
        DurableSpec::new("orders")
            .name("billing")
            .filter("orders.#"),
        SubscribeOptions::default(),
        |m: &Message| {
            let offset = m.offset().unwrap_or_default();
            if offset == CRASH_AT {
                println!("  [child] crashing while handling offset {offset}");
                std::process::abort();
            }
            println!("  [child] billed offset {offset}");
            Ok::<(), HandlerError>(())
        },
    )?;
    // The handler aborts the process; never reached unless something is wrong.
    std::thread::sleep(Duration::from_secs(30));
    Err("the child should have crashed".into())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if let [_, flag, dir] = args.as_slice()
        && flag == "--crashing-consumer"
    {
        return crashing_consumer(Path::new(dir));
    }

    let tmp = tempfile::tempdir()?;
    let dir = tmp.path();
    println!("data dir {}", dir.display());

    // 1. Publish.
    {
        let (broker, stream) = open(dir)?;
        for i in 0..ORDERS {
            broker.publish(
                Message::to("orders.created")
                    .key(format!("customer-{i}"))
                    .payload(format!("order-{i}")),
            )?;
        }
        println!(
            "published {} orders, stream offsets {}..{}",
            ORDERS,
            stream.start_offset(),
            stream.end_offset()
        );
        assert!(broker.close(Duration::from_secs(5)).is_clean());
    }

    // 2. Crash.
    let status = Command::new(std::env::current_exe()?)
        .arg("--crashing-consumer")
        .arg(dir)
        .status()?;
    println!("child exited: {status}");
    assert!(!status.success(), "the child must crash");

    let committed = std::fs::read_to_string(dir.join("consumers/orders/billing.offset"))?;
    println!("committed position on disk: {}", committed.trim());

    // 3. Resume.
    let (broker, _stream) = open(dir)?;
    let seen: Arc<Mutex<Vec<u64>>> = Arc::default();
    let s = seen.clone();
    let billing = broker.subscribe(
        DurableSpec::new("orders")
            .name("billing")
            .filter("orders.#")
            .start(StartAt::Earliest), // ignored: a committed position exists
        SubscribeOptions::default(),
        move |m: &Message| {
            let offset = m.offset().unwrap_or_default();
            println!("  billed offset {offset} after the restart");
            s.lock().expect("not poisoned").push(offset);
            Ok::<(), HandlerError>(())
        },
    )?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while billing.committed() < ORDERS {
        assert!(Instant::now() < deadline, "resume did not finish in 20 s");
        std::thread::sleep(Duration::from_millis(10));
    }
    let seen = seen.lock().unwrap().clone();
    let resumed_at = seen[0];
    println!(
        "resumed at offset {resumed_at}; committed now {}, lag {}",
        billing.committed(),
        billing.lag()
    );
    // At-least-once: resumption starts at or before the crash, and covers the rest in order.
    assert!(resumed_at <= CRASH_AT);
    assert_eq!(seen, (resumed_at..ORDERS).collect::<Vec<_>>());
    drop(billing);
    assert!(broker.close(Duration::from_secs(5)).is_clean());
    Ok(())
}
