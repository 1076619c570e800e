//! Small helpers every tidings test uses: a manual broker, a recorder, a bounded wait, a
//! driver to quiescence, and a max-concurrency tracker.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tidings::{Broker, Clock, Driver, HandlerError, ManualClock, Message};

/// A manual-driver broker on a fresh manual clock.
///
/// # Panics
/// Never with the default configuration.
#[must_use]
pub fn manual() -> (Broker, ManualClock) {
    let clock = ManualClock::new();
    let broker = Broker::builder()
        .driver(Driver::Manual)
        .clock(clock.clone())
        .build()
        .expect("valid configuration");
    (broker, clock)
}

/// The payload as (lossy) UTF-8 text.
#[must_use]
pub fn text(m: &Message) -> String {
    String::from_utf8_lossy(m.payload()).into_owned()
}

/// Records payloads (as text) in delivery order.
#[derive(Clone, Default)]
pub struct Recorder(pub Arc<Mutex<Vec<String>>>);

impl Recorder {
    /// A handler that records into this recorder.
    pub fn handler(&self) -> impl Fn(&Message) -> Result<(), HandlerError> + Send + Sync + 'static {
        let log = self.0.clone();
        move |m: &Message| {
            log.lock().push(text(m));
            Ok(())
        }
    }
    /// Everything recorded so far, clearing it.
    #[must_use]
    pub fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock())
    }
    /// How many payloads are recorded.
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.lock().len()
    }
    /// True when nothing is recorded.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Poll `cond` until true or `timeout` (make it generous); panics naming `what` on timeout.
///
/// # Panics
/// When `cond` is still false after `timeout`.
pub fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Drive a manual broker until nothing is scheduled: deliver, then jump the clock to the
/// next wake-up, again and again. Returns the waits it jumped.
pub fn drive(broker: &Broker, clock: &ManualClock) -> Vec<Duration> {
    let mut waits = Vec::new();
    loop {
        broker.run_until_idle();
        let Some(next) = broker.next_wake() else {
            break;
        };
        waits.push(next.saturating_duration_since(clock.now()));
        clock.advance_to(next);
    }
    waits
}

/// Counts concurrently active handler calls and remembers the maximum (R-CORE-3 checks).
#[derive(Default)]
pub struct Activity {
    active: AtomicUsize,
    max: AtomicUsize,
}

impl Activity {
    /// A handler call starts.
    pub fn enter(&self) {
        let now = self.active.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(now, Ordering::SeqCst);
    }
    /// A handler call ends.
    pub fn exit(&self) {
        self.active.fetch_sub(1, Ordering::SeqCst);
    }
    /// The most calls ever active at once.
    #[must_use]
    pub fn max(&self) -> usize {
        self.max.load(Ordering::SeqCst)
    }
}

/// A subscription to `topic` on `broker` whose handler, on each of its first `rounds - 1`
/// calls, publishes two messages back into its own topic (so with a small capacity the
/// second often finds the queue full), and on a later call unsubscribes itself. Returns the
/// subscription and the number of refusals its publishes were told about.
///
/// The re-entrancy case every driver must survive: publishing into one's own full queue
/// from inside the handler, then leaving from inside it too.
pub fn self_publishing_subscription(
    broker: &Broker,
    topic: &'static str,
    options: tidings::SubscribeOptions,
    rounds: u32,
) -> (tidings::Subscription, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let refused = Arc::new(AtomicUsize::new(0));
    let me: Arc<Mutex<Option<tidings::SubscriptionId>>> = Arc::default();
    let (weak, r, slot) = (broker.downgrade(), refused.clone(), me.clone());
    let sub = broker
        .subscribe(topic, options, move |_m: &Message| {
            let Some(b) = weak.upgrade() else {
                return Ok(());
            };
            if calls.fetch_add(1, Ordering::SeqCst) + 1 < rounds as usize {
                for _ in 0..2 {
                    if let Ok(report) = b.publish(Message::to(topic)) {
                        r.fetch_add(report.refused.len(), Ordering::SeqCst);
                    }
                }
            } else if let Some(id) = *slot.lock() {
                b.unsubscribe(id);
            }
            Ok::<(), HandlerError>(())
        })
        .expect("subscribe");
    *me.lock() = Some(sub.id());
    (sub, refused)
}
