//! The publish → dispatch hot path alone, for profilers: `N` messages from `P` publisher
//! threads to `S` subscriptions of one topic on a driver, no baseline, no harness. The
//! instruction counts and profiles quoted in BENCHMARKS.md come from it:
//!
//! ```text
//! cargo build --release -p tidings-bench --example hot_path
//! valgrind --tool=callgrind target/release/examples/hot_path 100000 manual 1
//! perf record -g target/release/examples/hot_path 40000 pool 256
//! ```
//!
//! Arguments (all optional): messages (100000), driver (`manual`, `thread`, `pool`;
//! `manual`), subscriptions (1), publisher threads (1; the manual driver publishes from the
//! calling thread and runs the dispatchers every 512 messages). It prints the delivery rate,
//! which is only indicative: the harness (`tidings-bench`) is where speed is measured.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tidings::{Broker, Driver, Message, Overflow, SubscribeOptions};

fn arg<T: std::str::FromStr>(args: &[String], i: usize, default: T) -> T {
    args.get(i).and_then(|s| s.parse().ok()).unwrap_or(default)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let messages: u64 = arg(&args, 1, 100_000);
    let driver: String = arg(&args, 2, "manual".to_owned());
    let subs: u64 = arg(&args, 3, 1);
    let publishers: u64 = arg(&args, 4, 1u64).max(1);
    let manual = driver == "manual";
    let broker = Broker::builder()
        .driver(match driver.as_str() {
            "pool" => Driver::Pool { workers: 2 },
            "thread" => Driver::Thread,
            _ => Driver::Manual,
        })
        .build()?;
    // One counter per subscription, each on its own cache line, as in the harness.
    let counts: Arc<Vec<crossbeam_utils::CachePadded<AtomicU64>>> =
        Arc::new((0..subs).map(|_| Default::default()).collect());
    let mut keep = Vec::new();
    for i in 0..subs as usize {
        let counts = counts.clone();
        let options = SubscribeOptions::new()
            .capacity(1024)
            .overflow(Overflow::Block {
                timeout: Duration::from_secs(60),
            });
        keep.push(
            broker.subscribe("bench.topic", options, move |_: &Message| {
                counts[i].fetch_add(1, Ordering::Relaxed);
                Ok(())
            })?,
        );
    }
    let payload: &'static [u8] = &[7; 64];
    let per_publisher = messages / publishers;
    let started = Instant::now();
    if manual || publishers == 1 {
        for i in 0..messages {
            broker.publish(Message::to("bench.topic").payload(payload))?;
            if manual && i % 512 == 511 {
                broker.run_until_idle();
            }
        }
        if manual {
            broker.run_until_idle();
        }
    } else {
        std::thread::scope(|s| {
            for _ in 0..publishers {
                let broker = broker.clone();
                s.spawn(move || {
                    for _ in 0..per_publisher {
                        broker
                            .publish(Message::to("bench.topic").payload(payload))
                            .expect("publish");
                    }
                });
            }
        });
    }
    let sent = if manual || publishers == 1 {
        messages
    } else {
        per_publisher * publishers
    };
    let total = || {
        counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum::<u64>()
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while total() < sent * subs {
        if Instant::now() > deadline {
            return Err(format!("only {} of {} delivered", total(), sent * subs).into());
        }
        std::thread::yield_now();
    }
    let elapsed = started.elapsed();
    println!(
        "{} deliveries in {elapsed:?}: {:.0} deliveries/s",
        sent * subs,
        (sent * subs) as f64 / elapsed.as_secs_f64()
    );
    let _report = broker.close(Duration::from_secs(10));
    Ok(())
}
