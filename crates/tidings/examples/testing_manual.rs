//! Testing with the manual driver and a manual clock: nothing runs until
//! `run_until_idle`, and time moves only when told, so a retry schedule is asserted exactly
//! — no sleeps, no flakiness.
//!
//! ```text
//! cargo run -p tidings --example testing_manual
//! ```

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tidings::{
    Broker, Clock, DeadLetterReason, Driver, HandlerError, ManualClock, Message, Retry,
    SubscribeOptions,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let clock = ManualClock::new();
    let broker = Broker::builder()
        .driver(Driver::Manual)
        .clock(clock.clone())
        .build()?;

    // Every attempt records the clock's time; the handler always fails.
    let attempts: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let (log, c) = (attempts.clone(), clock.clone());
    let sub = broker.subscribe(
        "payments.charge",
        SubscribeOptions::new()
            .retry(Retry::exponential(Duration::from_millis(100), 2.0).max_attempts(3)),
        move |_: &Message| {
            log.lock().expect("not poisoned").push(c.now());
            Err(HandlerError::retry("card processor unavailable"))
        },
    )?;

    let start = clock.now();
    broker.publish(Message::to("payments.charge").payload("order-42"))?;
    assert!(
        attempts.lock().unwrap().is_empty(),
        "nothing runs before run_until_idle"
    );

    // First attempt now; then jump the clock to each retry's due time.
    broker.run_until_idle();
    while let Some(due) = broker.next_wake() {
        clock.advance_to(due);
        broker.run_until_idle();
    }

    let delays: Vec<Duration> = attempts
        .lock()
        .unwrap()
        .iter()
        .map(|t| t.duration_since(start))
        .collect();
    println!("attempts at {delays:?} after publish");
    assert_eq!(
        delays,
        [
            Duration::ZERO,
            Duration::from_millis(100),
            Duration::from_millis(300)
        ]
    );

    let dead = sub.dead_letters();
    println!(
        "dead letter: {} after {} attempt(s)",
        dead[0].reason, dead[0].attempts
    );
    assert_eq!(dead.len(), 1);
    assert!(matches!(
        &dead[0].reason,
        DeadLetterReason::RetriesExhausted { attempts: 3, .. }
    ));
    let stats = sub.stats();
    assert_eq!((stats.attempts, stats.failures, stats.delivered), (3, 3, 0));
    assert!(stats.is_conserved());
    println!(
        "virtual time used: {:?}; real time: none spent waiting",
        clock.elapsed()
    );
    Ok(())
}
