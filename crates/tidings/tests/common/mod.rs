//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tidings::{Broker, Driver, HandlerError, ManualClock, Message};

/// A manual broker on a manual clock.
pub fn manual() -> (Broker, ManualClock) {
    let clock = ManualClock::new();
    let broker = Broker::builder()
        .driver(Driver::Manual)
        .clock(clock.clone())
        .build()
        .unwrap();
    (broker, clock)
}

/// Records payloads (as strings) in delivery order.
#[derive(Clone, Default)]
pub struct Recorder(pub Arc<Mutex<Vec<String>>>);

impl Recorder {
    pub fn handler(&self) -> impl Fn(&Message) -> Result<(), HandlerError> + Send + Sync + 'static {
        let log = self.0.clone();
        move |m: &Message| {
            log.lock().push(text(m));
            Ok(())
        }
    }
    pub fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock())
    }
    pub fn len(&self) -> usize {
        self.0.lock().len()
    }
}

pub fn text(m: &Message) -> String {
    String::from_utf8_lossy(m.payload()).into_owned()
}

/// Poll `cond` until true or `timeout` (generous); panics with `what` on timeout.
pub fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Drive a manual broker to quiescence, jumping the clock to each next wake-up; returns
/// the waits it jumped.
pub fn drive(broker: &Broker, clock: &ManualClock) -> Vec<Duration> {
    let mut waits = Vec::new();
    loop {
        broker.run_until_idle();
        let Some(next) = broker.next_wake() else {
            break;
        };
        let now = tidings::Clock::now(clock);
        waits.push(next.saturating_duration_since(now));
        clock.advance_to(next);
    }
    waits
}
