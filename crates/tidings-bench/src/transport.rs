//! The `transport/` case: buffered subscriptions across brokers over core NATS
//! ([`NatsTransport`]), against raw `async-nats` core publish → subscribe, on one local
//! `nats-server` this module starts (the testkit launcher: 127.0.0.1).
//!
//! * `nats/1to1` — one publishing broker with a transport of its own calls
//!   `Broker::publish` in a loop; one subscribing broker with a transport of its own has one
//!   buffered subscription whose handler counts. The baseline `async-nats-core` is what raw
//!   users write: `Client::publish(..).await` in a loop (no flush per message, one at the
//!   end) on one connection, and a `subscribe` stream on another, counted by a task.
//!
//! The rate of a side is the messages its subscriber handled over the time from the first
//! publish to the last one handled. Both sides are at-most-once (core NATS: a client's
//! subscription channel that is full drops, the server cuts off a slow consumer; tidings'
//! queue refuses when full), so a slice does not only wait for every message: when no new
//! message arrives for [`QUIET`], the rest are counted as lost, reported in the notes for
//! both sides, and the slice's time ends at the last message handled. The slices are sized
//! so that nothing needs to be lost: a slice never holds more messages than the client's
//! subscription channel (65,536) or the tidings subscription's queue (sized to the slice).
//!
//! The sides are paired as in the `jetstream/` cases: each round times each side in
//! slices, in turn (the order rotates), and the median is over rounds.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;

use tidings::{Broker, HandlerError, Message, SubscribeOptions, Subscription};
use tidings_jetstream::{ConnectOptions, NatsTransport};
use tidings_testkit::nats::{NatsServer, NatsServerOptions};

use crate::harness::Tally;
use crate::jetstream::{Side, fill, order};
use crate::{Case, Filter, Plan};

const ONE_TO_ONE: &str = "transport/nats/1to1";
/// The baseline: raw async-nats core publish → subscribe.
const RAW: &str = "async-nats-core";
/// As in the `jetstream/` cases.
const PAYLOAD_BYTES: usize = 128;
/// The subjects of the two sides (distinct, so neither sees the other's messages).
const TIDINGS_TOPIC: &str = "bench.transport.tidings";
const RAW_SUBJECT: &str = "bench.transport.raw";
/// No message for this long: the rest of the slice is lost.
const QUIET: Duration = Duration::from_secs(1);
/// How often a slice's wait looks at the count (the resolution of a lossy slice's end).
const POLL: Duration = Duration::from_millis(2);

pub(crate) fn case_names() -> Vec<String> {
    vec![ONE_TO_ONE.to_owned()]
}

/// `(slices per side and round, messages per slice)`. A slice stays within async-nats'
/// default subscription channel (65,536 messages) so that a subscriber that falls behind
/// is not dropped by its own client.
fn counts(plan: &Plan) -> (usize, u64) {
    if plan.quick { (2, 20_000) } else { (5, 50_000) }
}

pub(crate) fn run(plan: &Plan, filter: &Filter) -> Vec<Case> {
    if !filter.wants(ONE_TO_ONE) {
        return Vec::new();
    }
    let mut case = Case::new(ONE_TO_ONE, "msgs/s", true);
    if let Err(why) = run_case(plan, &mut case) {
        eprintln!("{ONE_TO_ONE} skipped: {why}");
        case.note(format!("skipped: {why}"));
    }
    vec![case]
}

fn run_case(plan: &Plan, case: &mut Case) -> Result<(), String> {
    if NatsServer::binary().is_none() {
        return Err(tidings_testkit::nats::LaunchError::BinaryNotFound.to_string());
    }
    // The transport's connection checks that JetStream is available, so the server has it;
    // nothing here is stored.
    let server = NatsServer::start(NatsServerOptions::new().default_sync())
        .map_err(|e| format!("nats-server did not start: {e}"))?;
    // The raw client's runtime. Two workers, like a small service.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("no tokio runtime: {e}"))?;
    let (slices, n) = counts(plan);
    let capacity = usize::try_from(n).map_err(|e| e.to_string())?;
    let ours = TidingsPair::start(&server.url(), capacity)?;
    let theirs = RawPair::start(&runtime, &server.url())?;

    let mut sides = [Side::new("tidings"), Side::new(RAW)];
    let mut losses = [Losses::default(), Losses::default()];
    'rounds: for round in 0..plan.rounds {
        for slice in 0..slices {
            for side in order(round, slice, 2) {
                let result = if side == 0 {
                    ours.slice(n)
                } else {
                    theirs.slice(&runtime, n)
                };
                let result = result.map(|s| {
                    losses[side].add(&s);
                    (s.handled, s.took)
                });
                if !sides[side].slice(result) {
                    break 'rounds;
                }
            }
        }
        sides.iter_mut().for_each(Side::end_round);
    }
    let outcomes: Vec<_> = sides.into_iter().map(|s| s.outcome).collect();
    fill(case, &outcomes);
    let stats = ours.subscription.stats();
    let (sent, received) = (ours.sent.stats().sent, ours.received.stats().received);
    case.note(format!(
        "tidings lost {} of {} ({} refused by the full queue, {} not received of {sent} sent); \
         {RAW} lost {} of {}",
        losses[0].lost,
        losses[0].published,
        stats.refused.overflow,
        sent.saturating_sub(received),
        losses[1].lost,
        losses[1].published,
    ));
    case.note(format!(
        "{slices} x {n} messages per side and round; tidings: Broker::publish in a loop on \
         one broker, a buffered subscription (capacity {n}) on another, one NatsTransport \
         (connection) each; raw: Client::publish(..).await in a loop and one flush, a \
         subscribe stream on a second connection"
    ));
    case.note(format!(
        "{} rounds, the sides' order rotating; {PAYLOAD_BYTES} B payload; one local \
         nats-server; a slice ends at its last message handled, or {QUIET:?} without one \
         (the rest lost)",
        plan.rounds
    ));
    ours.close();
    drop(theirs);
    drop(runtime);
    drop(server);
    Ok(())
}

/// What one side lost over the whole case.
#[derive(Debug, Default)]
struct Losses {
    published: u64,
    lost: u64,
}

impl Losses {
    fn add(&mut self, slice: &Slice) {
        self.published += slice.handled + slice.lost;
        self.lost += slice.lost;
    }
}

/// One timed slice: messages handled, from the first publish to the last one handled, and
/// the ones that never arrived.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Slice {
    handled: u64,
    took: Duration,
    lost: u64,
}

/// The subscriber's count: each handled message adds one.
struct Arrivals {
    count: AtomicU64,
    tally: Tally,
}

impl Arrivals {
    fn new() -> Self {
        Self {
            count: AtomicU64::new(0),
            tally: Tally::new(),
        }
    }

    #[inline]
    fn hit(&self) {
        let before = self.count.fetch_add(1, Ordering::Relaxed);
        self.tally.hit(before, before + 1);
    }

    /// Times `publish` (which sends `n` messages) and the wait until all `n` were handled,
    /// or until none arrived for `quiet` (the rest are lost; the slice ends at the last
    /// one handled, as the wait saw it every [`POLL`]).
    fn timed(
        &self,
        n: u64,
        quiet: Duration,
        publish: impl FnOnce() -> Result<(), String>,
    ) -> Result<Slice, String> {
        let base = self.count.load(Ordering::SeqCst);
        self.tally.arm(base + n, 1);
        let started = Instant::now();
        publish()?;
        let (mut seen, mut last) = (self.count.load(Ordering::SeqCst), Instant::now());
        loop {
            if self.tally.wait(POLL) {
                return Ok(Slice {
                    handled: n,
                    took: started.elapsed(),
                    lost: 0,
                });
            }
            let now = self.count.load(Ordering::SeqCst);
            if now != seen {
                (seen, last) = (now, Instant::now());
            } else if last.elapsed() >= quiet {
                let handled = (seen - base).min(n);
                return Ok(Slice {
                    handled,
                    took: last.duration_since(started),
                    lost: n - handled,
                });
            }
        }
    }
}

/// Two brokers, each with a [`NatsTransport`] (a connection) of its own: one publishes,
/// the other has the buffered subscription.
struct TidingsPair {
    publisher: Broker,
    subscriber: Broker,
    subscription: Subscription,
    sent: NatsTransport,
    received: NatsTransport,
    arrivals: Arc<Arrivals>,
    payload: Bytes,
}

impl TidingsPair {
    fn start(url: &str, capacity: usize) -> Result<Self, String> {
        let broker = |transport: &NatsTransport| {
            Broker::builder()
                .transport(Arc::new(transport.clone()))
                .build()
                .map_err(|e| e.to_string())
        };
        let connect = || {
            NatsTransport::connect(ConnectOptions::new(url))
                .map_err(|e| format!("NatsTransport: {e}"))
        };
        let (sent, received) = (connect()?, connect()?);
        let (publisher, subscriber) = (broker(&sent)?, broker(&received)?);
        let arrivals = Arc::new(Arrivals::new());
        let a = Arc::clone(&arrivals);
        // Returns once the server has the subscription: a publish after this reaches it.
        let subscription = subscriber
            .subscribe(
                TIDINGS_TOPIC,
                SubscribeOptions::new().capacity(capacity),
                move |m: &Message| -> Result<(), HandlerError> {
                    std::hint::black_box(m);
                    a.hit();
                    Ok(())
                },
            )
            .map_err(|e| e.to_string())?;
        Ok(Self {
            publisher,
            subscriber,
            subscription,
            sent,
            received,
            arrivals,
            payload: Bytes::from(vec![0x5A; PAYLOAD_BYTES]),
        })
    }

    fn slice(&self, n: u64) -> Result<Slice, String> {
        self.arrivals.timed(n, QUIET, || {
            for _ in 0..n {
                self.publisher
                    .publish(Message::to(TIDINGS_TOPIC).payload(self.payload.clone()))
                    .map_err(|e| e.to_string())?;
            }
            Ok(())
        })
    }

    fn close(self) {
        drop(self.subscription);
        self.publisher.close(Duration::from_secs(5));
        self.subscriber.close(Duration::from_secs(5));
    }
}

/// Two raw async-nats connections: one publishes, the other subscribes.
struct RawPair {
    publisher: async_nats::Client,
    /// Keeps the subscriber's connection open.
    _subscriber: async_nats::Client,
    counter: tokio::task::JoinHandle<()>,
    arrivals: Arc<Arrivals>,
    payload: Bytes,
}

impl RawPair {
    fn start(runtime: &tokio::runtime::Runtime, url: &str) -> Result<Self, String> {
        let connect = || {
            runtime
                .block_on(async_nats::connect(url))
                .map_err(|e| format!("async-nats could not connect: {e}"))
        };
        let (publisher, subscriber) = (connect()?, connect()?);
        let mut messages = runtime
            .block_on(subscriber.subscribe(RAW_SUBJECT))
            .map_err(|e| format!("async-nats could not subscribe: {e}"))?;
        // A round trip on the subscriber's connection, so the server has the subscription
        // before the publisher's first message (`flush` only writes the buffer out): a
        // message to an inbox of its own, which the server handles after the subscribe.
        runtime.block_on(async {
            let inbox = subscriber.new_inbox();
            let mut probe = subscriber
                .subscribe(inbox.clone())
                .await
                .map_err(|e| format!("async-nats could not subscribe: {e}"))?;
            subscriber
                .publish(inbox, bytes::Bytes::new())
                .await
                .map_err(|e| format!("async-nats could not publish: {e}"))?;
            probe
                .next()
                .await
                .ok_or_else(|| "the round trip to the server ended".to_owned())
        })?;
        let arrivals = Arc::new(Arrivals::new());
        let a = Arc::clone(&arrivals);
        let counter = runtime.spawn(async move {
            while let Some(m) = messages.next().await {
                std::hint::black_box(&m);
                a.hit();
            }
        });
        Ok(Self {
            publisher,
            _subscriber: subscriber,
            counter,
            arrivals,
            payload: Bytes::from(vec![0x5A; PAYLOAD_BYTES]),
        })
    }

    fn slice(&self, runtime: &tokio::runtime::Runtime, n: u64) -> Result<Slice, String> {
        self.arrivals.timed(n, QUIET, || {
            runtime.block_on(async {
                for _ in 0..n {
                    self.publisher
                        .publish(RAW_SUBJECT, self.payload.clone())
                        .await
                        .map_err(|e| e.to_string())?;
                }
                self.publisher.flush().await.map_err(|e| e.to_string())
            })
        })
    }
}

impl Drop for RawPair {
    fn drop(&mut self) {
        self.counter.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_case_is_listed() {
        assert_eq!(case_names(), [ONE_TO_ONE]);
    }

    #[test]
    fn a_slice_ends_when_every_message_was_handled() {
        let arrivals = Arrivals::new();
        let slice = arrivals
            .timed(5, QUIET, || {
                (0..5).for_each(|_| arrivals.hit());
                Ok(())
            })
            .expect("no failure");
        assert_eq!((slice.handled, slice.lost), (5, 0));
        // Counts run on across slices.
        let slice = arrivals
            .timed(3, QUIET, || {
                (0..3).for_each(|_| arrivals.hit());
                Ok(())
            })
            .expect("no failure");
        assert_eq!((slice.handled, slice.lost), (3, 0));
    }

    #[test]
    fn a_slice_that_stops_short_counts_the_rest_as_lost() {
        let arrivals = Arrivals::new();
        let quiet = Duration::from_millis(50);
        let slice = arrivals
            .timed(10, quiet, || {
                (0..7).for_each(|_| arrivals.hit());
                Ok(())
            })
            .expect("no failure");
        assert_eq!((slice.handled, slice.lost), (7, 3));
        // The slice ends at the last arrival seen, not after the quiet wait.
        assert!(slice.took < quiet, "{slice:?}");
        let mut losses = Losses::default();
        losses.add(&slice);
        assert_eq!((losses.published, losses.lost), (10, 3));
    }

    #[test]
    fn a_failed_publish_fails_the_slice() {
        let arrivals = Arrivals::new();
        let result = arrivals.timed(1, QUIET, || Err("down".into()));
        assert_eq!(result, Err("down".to_owned()));
    }
}
