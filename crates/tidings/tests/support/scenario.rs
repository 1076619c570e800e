//! One scripted run under the manual driver, shared by the snapshot and metrics tests.

use std::path::Path;
use std::time::Duration;

use tidings::{
    Broker, DurableSpec, DurableSubscription, HandlerError, ManualClock, Message, Priority, Retry,
    StreamConfig, SubscribeOptions, Subscription,
};

// The handles keep the subscriptions alive; not every test that shares this reads them.
#[allow(dead_code)]
pub struct Scenario {
    pub broker: Broker,
    pub clock: ManualClock,
    pub billing: Subscription,
    pub audit: Subscription,
    pub ship: DurableSubscription,
}

/// billing: capacity 2, Reject, fixed retry 1 s × 2; payload "reject" is rejected, payload
/// "flaky" always fails (retryable). audit: every order, no retry. ship: durable on the
/// `orders` stream, `orders.created` only.
pub fn start(dir: &Path) -> Scenario {
    let clock = ManualClock::new();
    let broker = Broker::builder()
        .driver(tidings::Driver::Manual)
        .clock(clock.clone())
        .data_dir(dir)
        .build()
        .unwrap();
    broker
        .create_stream(StreamConfig::new("orders", ["orders.#"]))
        .unwrap();
    let billing = broker
        .subscribe(
            "orders.*",
            SubscribeOptions::new()
                .name("billing")
                .capacity(2)
                .retry(Retry::fixed(Duration::from_secs(1), 2)),
            |m: &Message| match m.payload().as_ref() {
                b"reject" => Err(HandlerError::reject("cannot bill")),
                b"flaky" => Err(HandlerError::retry("billing backend down")),
                _ => Ok(()),
            },
        )
        .unwrap();
    let audit = broker
        .subscribe(
            "orders.#",
            SubscribeOptions::new().name("audit").retry(Retry::None),
            |_: &Message| Ok::<(), HandlerError>(()),
        )
        .unwrap();
    let ship = broker
        .subscribe(
            DurableSpec::new("orders")
                .name("ship")
                .filter("orders.created"),
            SubscribeOptions::default(),
            |_: &Message| Ok::<(), HandlerError>(()),
        )
        .unwrap();
    Scenario {
        broker,
        clock,
        billing,
        audit,
        ship,
    }
}

impl Scenario {
    pub fn publish(&self, topic: &str, payload: &'static str, priority: Priority) {
        self.broker
            .publish(Message::to(topic).payload(payload).priority(priority))
            .unwrap();
    }

    /// Step 1: three orders before anything runs; billing's queue (2) overflows once.
    pub fn step_queue(&self) {
        self.publish("orders.created", "reject", Priority::Normal);
        self.publish("orders.created", "ok", Priority::High);
        self.publish("orders.created", "late", Priority::Low);
    }

    /// Step 2: deliver; then a flaky order that fails, waits 1 s, and fails again.
    pub fn step_run(&self) {
        self.broker.run_until_idle();
        self.publish("orders.paid", "flaky", Priority::Normal);
        self.broker.run_until_idle();
    }

    /// Step 3: the retry comes due and gives up.
    pub fn step_retry(&self) {
        self.clock.advance(Duration::from_secs(1));
        self.broker.run_until_idle();
    }
}
