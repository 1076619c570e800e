//! The `jetstream/` and `jetstream-default/` cases: what a user of tidings on NATS
//! JetStream uses (a [`JetStreamBackend`] behind a [`Broker`], or its cursor through the
//! durable-source seam), against raw `async-nats` used the way its own users use it, on one
//! local `nats-server` this module starts (the testkit launcher: 127.0.0.1, a fresh store
//! dir). The `jetstream/` cases run against a server with `sync_interval: always` (every
//! acknowledged write was fsynced); the `jetstream-default/` cases against one with
//! JetStream's default sync, where the disk does not hide the client's own cost.
//!
//! * `consume` — the backend's cursor through the seam ([`BackendCursor::fetch`] and
//!   [`BackendCursor::finish`] as the feeder calls them, batches of up to 256), opened on
//!   records stored before the timer starts, until it has finished all of them.
//! * `consume/broker` — what a service sees: a new durable subscription on the
//!   [`JetStreamBackend`] (`subscribe` with a `DurableSpec`) until its handler saw the last
//!   stored record.
//! * Both against the same records, read by a raw durable pull consumer created in the
//!   timed slice and drained in batches of 500: `async-nats-plain-ack` acknowledges each
//!   message with a plain `ack()` (how NATS users consume), `async-nats-double-ack` with
//!   `double_ack()` (each acknowledgement confirmed).
//! * `publish/broker` — `Broker::publish` from one thread (it returns once the server
//!   acknowledged the append) against raw `publish_with_headers(..).await?.await?`, one in
//!   flight (`async-nats`), to the same stream.
//! * `publish/broker/publishers=16` — `Broker::publish` from 16 threads at once against raw
//!   publishes with 16 acknowledgements in flight on one connection.
//!
//! The load on this machine and its disk comes and goes within a second, so the sides are
//! not timed in separate runs but **paired**: each round times each side in turn (the
//! order rotates from round to round), a side's rate for the round is its messages over
//! its time, and the median is over rounds. Each round uses fresh subjects and durable
//! names. Without a `nats-server` binary (see `tidings_testkit::nats`) the cases are
//! emitted with no values and the reason in their notes, and a line on stderr says so.

use std::collections::VecDeque;
use std::future::IntoFuture;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::{AckPolicy, PullConsumer, pull};
use bytes::Bytes;
use futures_util::StreamExt;

use tidings::durable::{BackendStream, CursorSpec, CursorWaker, DurableBackend, Finished, Outcome};
use tidings::{
    Broker, DurableSpec, HandlerError, Message, Pattern, StartAt, StreamConfig, SubscribeOptions,
};
use tidings_jetstream::{ConnectOptions, JetStreamBackend, record_subject};
use tidings_testkit::nats::{NatsServer, NatsServerOptions};

use crate::harness::{ContenderRun, Tally};
use crate::{Case, Filter, Plan};

const CONSUME: &str = "consume";
const CONSUME_BROKER: &str = "consume/broker";
const PUBLISH_BROKER: &str = "publish/broker";
const PUBLISH_BROKER_16: &str = "publish/broker/publishers=16";
const PUBLISH_ASYNC_16: &str = "publish/broker/async-tasks=16";
const CASES: [&str; 5] = [
    CONSUME,
    CONSUME_BROKER,
    PUBLISH_BROKER,
    PUBLISH_BROKER_16,
    PUBLISH_ASYNC_16,
];

/// The case prefixes: the server with `sync_interval: always`, and the one with the default.
const ALWAYS: &str = "jetstream/";
const DEFAULT_SYNC: &str = "jetstream-default/";

/// Baselines of the consume cases.
const PLAIN_ACK: &str = "async-nats-plain-ack";
const DOUBLE_ACK: &str = "async-nats-double-ack";
/// Baseline of the publish cases.
const RAW_PUBLISH: &str = "async-nats";

const PAYLOAD_BYTES: usize = 128;
/// Messages per pull of the raw consumers.
const RAW_BATCH: usize = 500;
/// Messages per fetch of the seam case (the feeder's batch).
const SEAM_BATCH: usize = 256;
/// The seam case's window (the default capacity of a subscription).
const SEAM_WINDOW: usize = 1024;
/// Publishers (threads, or acknowledgements in flight) of the concurrent publish case.
const PUBLISHERS: usize = 16;
/// The stream every case uses (it captures `broker.#`).
const STREAM: &str = "broker";
/// Bound on one wait: the records are already stored, so only a stall reaches it.
const STALL: Duration = Duration::from_secs(30);

pub(crate) fn case_names() -> Vec<String> {
    [ALWAYS, DEFAULT_SYNC]
        .iter()
        .flat_map(|prefix| CASES.iter().map(move |c| format!("{prefix}{c}")))
        .collect()
}

/// `n` split into `parts` (at least one) shares: the first `n % parts` get one more.
fn shares(n: u64, parts: usize) -> impl Iterator<Item = u64> {
    let parts = parts.max(1) as u64;
    (0..parts).map(move |i| n / parts + u64::from(i < n % parts))
}

/// Who publishes on the tidings side of a publish case (the raw side keeps as many in
/// flight).
#[derive(Clone, Copy)]
enum Publishers {
    /// Threads calling `Broker::publish`.
    Threads(usize),
    /// Tasks calling `Broker::publish_async`.
    Tasks(usize),
}

/// Messages per side and round (and slices per round where a side is timed in slices).
struct Counts {
    /// Stored records each consumer drains (a multiple of [`RAW_BATCH`], so no raw pull
    /// waits out its expiry for a short batch).
    consume: u64,
    /// `(slices, messages per slice)`.
    publish_one: (usize, u64),
    /// `(slices, messages per slice)`, a multiple of [`PUBLISHERS`].
    publish_many: (usize, u64),
}

impl Counts {
    fn new(plan: &Plan, always: bool) -> Self {
        // With `sync_interval: always` every stored message waits for an fsync (1,000 to
        // 6,000 a second on this machine's disk), so those counts are small.
        match (plan.quick, always) {
            (true, true) => Self {
                consume: 1_000,
                publish_one: (4, 25),
                publish_many: (2, 160),
            },
            (true, false) => Self {
                consume: 2_000,
                publish_one: (4, 100),
                publish_many: (2, 800),
            },
            // Enough records that opening the subscription (a consumer and, for tidings,
            // its DLQ streams, each creation fsynced) does not dominate the rate.
            (false, true) => Self {
                consume: 20_000,
                publish_one: (10, 50),
                publish_many: (6, 800),
            },
            (false, false) => Self {
                consume: 20_000,
                publish_one: (10, 500),
                publish_many: (6, 4_000),
            },
        }
    }
}

pub(crate) fn run(plan: &Plan, filter: &Filter) -> Vec<Case> {
    let mut all = Vec::new();
    for (prefix, always) in [(ALWAYS, true), (DEFAULT_SYNC, false)] {
        let mut cases: Vec<Case> = CASES
            .iter()
            .map(|c| format!("{prefix}{c}"))
            .filter(|n| filter.wants(n))
            .map(|n| Case::new(n, "msgs/s", true))
            .collect();
        if !cases.is_empty() {
            run_on_server(plan, always, prefix, &mut cases);
        }
        all.extend(cases);
    }
    all
}

fn run_on_server(plan: &Plan, always: bool, prefix: &str, cases: &mut [Case]) {
    let skip = |cases: &mut [Case], why: String| {
        eprintln!("{prefix} cases skipped: {why}");
        for c in cases.iter_mut() {
            c.note(format!("skipped: {why}"));
        }
    };
    if NatsServer::binary().is_none() {
        skip(
            cases,
            format!("{}", tidings_testkit::nats::LaunchError::BinaryNotFound),
        );
        return;
    }
    let options = if always {
        NatsServerOptions::new()
    } else {
        NatsServerOptions::new().default_sync()
    };
    let server = match NatsServer::start(options) {
        Ok(s) => s,
        Err(e) => return skip(cases, format!("nats-server did not start: {e}")),
    };
    // The raw client's runtime. Two workers, like a small service.
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return skip(cases, format!("no tokio runtime: {e}")),
    };
    let bench = match Bench::connect(&runtime, &server.url()) {
        Ok(b) => b,
        Err(e) => return skip(cases, e),
    };
    let c = Counts::new(plan, always);
    let rounds = plan.rounds;
    let sync = if always {
        "sync_interval: always"
    } else {
        "the default sync"
    };
    let common = format!(
        "{rounds} rounds, the sides' order rotating; {PAYLOAD_BYTES} B payload; one local \
         nats-server with {sync}; one connection per side"
    );
    for case in cases.iter_mut() {
        let name = case
            .name
            .strip_prefix(prefix)
            .unwrap_or_default()
            .to_owned();
        let (outcomes, what) = match name.as_str() {
            CONSUME => (
                bench.consume(&runtime, rounds, c.consume, Drain::Seam),
                format!(
                    "{n} stored records per round read by each side; tidings: the backend's \
                     cursor through the seam (fetch up to {SEAM_BATCH}, finish each batch); \
                     raw: a new durable pull consumer, batches of {RAW_BATCH}",
                    n = c.consume
                ),
            ),
            CONSUME_BROKER => (
                bench.consume(&runtime, rounds, c.consume, Drain::Broker),
                format!(
                    "{n} stored records per round read by each side; tidings: a new durable \
                     subscription until its handler saw all; raw: a new durable pull \
                     consumer, batches of {RAW_BATCH}",
                    n = c.consume
                ),
            ),
            PUBLISH_BROKER => {
                let (slices, n) = c.publish_one;
                (
                    bench.publish(&runtime, rounds, slices, n, Publishers::Threads(1)),
                    format!(
                        "{slices} x {n} messages per side and round; tidings: Broker::publish \
                         from one thread; raw: publish with ack, one in flight"
                    ),
                )
            }
            PUBLISH_ASYNC_16 => {
                let (slices, n) = c.publish_many;
                (
                    bench.publish(&runtime, rounds, slices, n, Publishers::Tasks(PUBLISHERS)),
                    format!(
                        "{slices} x {n} messages per side and round; tidings: \
                         Broker::publish_async from {PUBLISHERS} tasks on the bench's 2-worker \
                         runtime; raw: publish with ack, {PUBLISHERS} in flight on one \
                         connection"
                    ),
                )
            }
            _ => {
                let (slices, n) = c.publish_many;
                (
                    bench.publish(&runtime, rounds, slices, n, Publishers::Threads(PUBLISHERS)),
                    format!(
                        "{slices} x {n} messages per side and round; tidings: Broker::publish \
                         from {PUBLISHERS} threads; raw: publish with ack, {PUBLISHERS} in \
                         flight on one connection"
                    ),
                )
            }
        };
        fill(case, &outcomes);
        case.note(what);
        case.note(&common);
    }
    bench.broker.close(Duration::from_secs(5));
    drop(bench);
    drop(runtime);
    drop(server);
}

pub(crate) fn fill(case: &mut Case, outcomes: &[ContenderRun]) {
    for o in outcomes {
        match (o.name.as_str(), o.median()) {
            ("tidings", v) => case.tidings = v,
            (name, Some(v)) => {
                case.baselines.insert(name.to_owned(), v);
            }
            (_, None) => {}
        }
        if let Some(e) = &o.error {
            case.note(format!("{} FAILED: {e}", o.name));
        }
    }
    if let Some(ours) = case.tidings {
        let ratios: Vec<String> = case
            .baselines
            .iter()
            .map(|(name, raw)| format!("tidings/{name} = {:.2}", ours / raw))
            .collect();
        if !ratios.is_empty() {
            case.note(ratios.join(", "));
        }
    }
}

/// One side of a paired case: its per-round rates, and the time and messages of the round
/// under way. (The `transport/` cases pair their sides the same way.)
pub(crate) struct Side {
    pub(crate) outcome: ContenderRun,
    busy: Duration,
    messages: u64,
}

impl Side {
    pub(crate) fn new(name: &str) -> Self {
        Self {
            outcome: ContenderRun {
                name: name.to_owned(),
                ..ContenderRun::default()
            },
            busy: Duration::ZERO,
            messages: 0,
        }
    }

    /// Adds one timed slice, or records the failure (the case stops).
    pub(crate) fn slice(&mut self, result: Result<(u64, Duration), String>) -> bool {
        match result {
            Ok((n, took)) => {
                self.messages += n;
                self.busy += took;
                true
            }
            Err(e) => {
                self.outcome.error = Some(e);
                false
            }
        }
    }

    pub(crate) fn end_round(&mut self) {
        if self.messages > 0 && !self.busy.is_zero() {
            self.outcome
                .samples
                .push(self.messages as f64 / self.busy.as_secs_f64());
        }
        self.busy = Duration::ZERO;
        self.messages = 0;
    }
}

/// The order of `sides` sides in slice `slice` of round `round`: rotated by one each time,
/// so no side always goes first.
pub(crate) fn order(round: usize, slice: usize, sides: usize) -> Vec<usize> {
    (0..sides).map(|i| (i + round + slice) % sides).collect()
}

/// How the tidings side of a consume case reads.
#[derive(Debug, Clone, Copy)]
enum Drain {
    /// The backend's cursor through the seam.
    Seam,
    /// A durable subscription on the broker.
    Broker,
}

/// The broker on the JetStream backend, the backend itself, and a raw client, on one server.
struct Bench {
    broker: Broker,
    stream: Arc<dyn BackendStream>,
    raw: async_nats::jetstream::Context,
    payload: Bytes,
    /// Subjects and durable names are unique per round and side: `broker.<n>`.
    next: AtomicU64,
}

impl Bench {
    fn connect(runtime: &tokio::runtime::Runtime, url: &str) -> Result<Self, String> {
        let backend = JetStreamBackend::connect(ConnectOptions::new(url))
            .map_err(|e| format!("JetStreamBackend: {e}"))?;
        let broker = Broker::builder()
            .durable_backend(Arc::new(backend.clone()))
            .build()
            .map_err(|e| e.to_string())?;
        let config = StreamConfig::new(STREAM, ["broker.#"]);
        broker
            .create_stream(config.clone())
            .map_err(|e| e.to_string())?;
        let pattern = Pattern::new("broker.#").map_err(|e| e.to_string())?;
        let stream = backend
            .open_stream(&config, &[pattern])
            .map_err(|e| format!("opening the stream through the seam: {e}"))?;
        let client = runtime
            .block_on(async_nats::connect(url))
            .map_err(|e| format!("async-nats could not connect: {e}"))?;
        // The JetStream context spawns a task of its own.
        let _in_runtime = runtime.enter();
        Ok(Self {
            broker,
            stream,
            raw: async_nats::jetstream::new(client),
            payload: Bytes::from(vec![0x5A; PAYLOAD_BYTES]),
            next: AtomicU64::new(1),
        })
    }

    fn topic(&self) -> String {
        format!("broker.{}", self.next.fetch_add(1, Ordering::Relaxed))
    }

    fn name(&self) -> String {
        format!("d{}", self.next.fetch_add(1, Ordering::Relaxed))
    }

    /// `n` publishes on `topic` through the broker from `threads` threads at once.
    fn broker_publish(
        &self,
        topic: &str,
        n: u64,
        threads: usize,
    ) -> Result<(u64, Duration), String> {
        let started = Instant::now();
        std::thread::scope(|s| {
            let workers: Vec<_> = shares(n, threads)
                .map(|share| {
                    s.spawn(move || {
                        for _ in 0..share {
                            self.broker
                                .publish(Message::to(topic).payload(self.payload.clone()))
                                .map_err(|e| e.to_string())?;
                        }
                        Ok::<_, String>(())
                    })
                })
                .collect();
            for w in workers {
                w.join().map_err(|_| "a publisher panicked".to_owned())??;
            }
            Ok::<_, String>(())
        })?;
        Ok((n, started.elapsed()))
    }

    /// `n` `Broker::publish_async` calls to `topic` from `tasks` tasks of the current
    /// runtime.
    async fn broker_publish_async(
        &self,
        topic: &str,
        n: u64,
        tasks: usize,
    ) -> Result<(u64, Duration), String> {
        let started = Instant::now();
        let mut running = Vec::new();
        for share in shares(n, tasks) {
            let (broker, topic, payload) =
                (self.broker.clone(), topic.to_owned(), self.payload.clone());
            running.push(tokio::spawn(async move {
                for _ in 0..share {
                    broker
                        .publish_async(Message::to(topic.as_str()).payload(payload.clone()))
                        .await
                        .map_err(|e| e.to_string())?;
                }
                Ok::<_, String>(())
            }));
        }
        for task in running {
            task.await
                .map_err(|_| "a publishing task panicked".to_owned())??;
        }
        Ok((n, started.elapsed()))
    }

    /// `n` raw publishes with ack to the stream's subject of `topic`, up to `window` in
    /// flight.
    async fn raw_publish(
        &self,
        topic: &str,
        n: u64,
        window: usize,
    ) -> Result<(u64, Duration), String> {
        let subject = record_subject(STREAM, topic);
        let started = Instant::now();
        let mut in_flight = VecDeque::with_capacity(window + 1);
        for _ in 0..n {
            let mut headers = HeaderMap::new();
            let id = format!("{:032x}", self.next.fetch_add(1, Ordering::Relaxed));
            headers.insert(async_nats::header::NATS_MESSAGE_ID, id.as_str());
            let ack = self
                .raw
                .publish_with_headers(subject.clone(), headers, self.payload.clone())
                .await
                .map_err(|e| e.to_string())?;
            in_flight.push_back(ack.into_future());
            if in_flight.len() >= window {
                let oldest = in_flight.pop_front().ok_or("empty queue")?;
                oldest.await.map_err(|e| e.to_string())?;
            }
        }
        for ack in in_flight {
            ack.await.map_err(|e| e.to_string())?;
        }
        Ok((n, started.elapsed()))
    }

    /// Paired rounds of slices: `Broker::publish` from `publishers` threads against raw
    /// publishes with `publishers` in flight.
    fn publish(
        &self,
        runtime: &tokio::runtime::Runtime,
        rounds: usize,
        slices: usize,
        n: u64,
        publishers: Publishers,
    ) -> Vec<ContenderRun> {
        let mut sides = [Side::new("tidings"), Side::new(RAW_PUBLISH)];
        'rounds: for round in 0..rounds {
            let (ours, theirs) = (self.topic(), self.topic());
            for slice in 0..slices {
                for side in order(round, slice, 2) {
                    let result = match (side, publishers) {
                        (0, Publishers::Threads(threads)) => self.broker_publish(&ours, n, threads),
                        (0, Publishers::Tasks(tasks)) => {
                            runtime.block_on(self.broker_publish_async(&ours, n, tasks))
                        }
                        (_, Publishers::Threads(k) | Publishers::Tasks(k)) => {
                            runtime.block_on(self.raw_publish(&theirs, n, k))
                        }
                    };
                    if !sides[side].slice(result) {
                        break 'rounds;
                    }
                }
            }
            sides.iter_mut().for_each(Side::end_round);
        }
        sides.into_iter().map(|s| s.outcome).collect()
    }

    /// Paired rounds: `n` records stored on a fresh topic (untimed), then read by the
    /// tidings side and by both raw consumers, each with a durable of its own.
    fn consume(
        &self,
        runtime: &tokio::runtime::Runtime,
        rounds: usize,
        n: u64,
        drain: Drain,
    ) -> Vec<ContenderRun> {
        let mut sides = [
            Side::new("tidings"),
            Side::new(PLAIN_ACK),
            Side::new(DOUBLE_ACK),
        ];
        'rounds: for round in 0..rounds {
            let topic = self.topic();
            if let Err(e) = self.broker_publish(&topic, n, PUBLISHERS) {
                sides[0].outcome.error = Some(format!("filling: {e}"));
                break;
            }
            for side in order(round, 0, 3) {
                let result = match (side, drain) {
                    (0, Drain::Seam) => self.seam_drain(&topic, n),
                    (0, Drain::Broker) => self.durable_drain(&topic, n),
                    (s, _) => runtime.block_on(self.raw_drain(&topic, n, s == 1)),
                };
                if !sides[side].slice(result) {
                    break 'rounds;
                }
            }
            sides.iter_mut().for_each(Side::end_round);
        }
        sides.into_iter().map(|s| s.outcome).collect()
    }

    /// Opens a cursor on `topic` through the seam and fetches and finishes `n` records.
    fn seam_drain(&self, topic: &str, n: u64) -> Result<(u64, Duration), String> {
        let (tx, rx) = mpsc::channel::<()>();
        let waker = CursorWaker::new(move || {
            let _ = tx.send(());
        });
        let pattern = Pattern::new(topic).map_err(|e| e.to_string())?;
        let name = self.name();
        let started = Instant::now();
        let cursor = self
            .stream
            .open_cursor(CursorSpec::new(
                &name,
                &pattern,
                StartAt::Earliest,
                SEAM_WINDOW,
                waker,
            ))
            .map_err(|e| e.to_string())?;
        let mut done = 0;
        let mut progress = Instant::now();
        while done < n {
            let fetched = cursor.fetch(SEAM_BATCH).map_err(|e| e.to_string())?;
            if fetched.is_empty() {
                // Woken when there may be more (and once a second regardless).
                let _ = rx.recv_timeout(Duration::from_secs(1));
                while rx.try_recv().is_ok() {}
                if progress.elapsed() > STALL {
                    return Err(format!("the cursor ran dry after {done} of {n}"));
                }
                continue;
            }
            progress = Instant::now();
            let finished: Vec<Finished> = fetched
                .into_iter()
                .map(|m| Finished::new(Arc::new(m), Outcome::Delivered))
                .collect();
            done += finished.len() as u64;
            cursor.finish(&finished).map_err(|e| e.to_string())?;
        }
        let took = started.elapsed();
        cursor.close();
        Ok((done, took))
    }

    /// Opens a durable subscription on `topic` and waits until its handler saw `n` records.
    fn durable_drain(&self, topic: &str, n: u64) -> Result<(u64, Duration), String> {
        let tally = Arc::new(Tally::new());
        tally.arm(n, 1);
        let seen = Arc::new(AtomicU64::new(0));
        let (t, s) = (Arc::clone(&tally), Arc::clone(&seen));
        let started = Instant::now();
        let subscription = self
            .broker
            .subscribe(
                DurableSpec::new(STREAM).name(self.name()).filter(topic),
                SubscribeOptions::default(),
                move |_: &Message| -> Result<(), HandlerError> {
                    let before = s.fetch_add(1, Ordering::Relaxed);
                    t.hit(before, before + 1);
                    Ok(())
                },
            )
            .map_err(|e| e.to_string())?;
        if !tally.wait(STALL) {
            return Err(format!(
                "the durable subscription saw {} of {n} within {STALL:?}",
                seen.load(Ordering::Relaxed)
            ));
        }
        let took = started.elapsed();
        drop(subscription);
        Ok((n, took))
    }

    /// Creates a raw durable pull consumer on `topic`'s records and acknowledges `n` of
    /// them, each with a plain `ack()` or with `double_ack()`.
    async fn raw_drain(&self, topic: &str, n: u64, plain: bool) -> Result<(u64, Duration), String> {
        let started = Instant::now();
        let consumer: PullConsumer = self
            .raw
            .create_consumer_on_stream(
                pull::Config {
                    durable_name: Some(self.name()),
                    filter_subject: record_subject(STREAM, topic),
                    ack_policy: AckPolicy::Explicit,
                    ..Default::default()
                },
                STREAM,
            )
            .await
            .map_err(|e| e.to_string())?;
        let mut consumed = 0;
        while consumed < n {
            let mut batch = consumer
                .batch()
                .max_messages(RAW_BATCH)
                .expires(STALL)
                .messages()
                .await
                .map_err(|e| e.to_string())?;
            let before = consumed;
            while let Some(message) = batch.next().await {
                let message = message.map_err(|e| e.to_string())?;
                if plain {
                    message.ack().await.map_err(|e| e.to_string())?;
                } else {
                    message.double_ack().await.map_err(|e| e.to_string())?;
                }
                consumed += 1;
            }
            if consumed == before {
                return Err(format!("ran dry after {consumed} of {n}"));
            }
        }
        Ok((consumed, started.elapsed()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_side_goes_first_in_turn() {
        let firsts: Vec<usize> = (0..3).map(|round| order(round, 0, 3)[0]).collect();
        assert_eq!(firsts, [0, 1, 2]);
        assert_eq!(order(1, 0, 3), [1, 2, 0]);
        assert_eq!(order(0, 1, 2), [1, 0]);
    }

    #[test]
    fn every_case_runs_on_both_servers() {
        let names = case_names();
        assert_eq!(names.len(), 2 * CASES.len());
        assert!(names.contains(&"jetstream/consume/broker".to_owned()));
        assert!(names.contains(&"jetstream-default/publish/broker/publishers=16".to_owned()));
    }

    #[test]
    fn a_round_rate_is_its_messages_over_its_busy_time() {
        let mut side = Side::new("tidings");
        assert!(side.slice(Ok((100, Duration::from_millis(100)))));
        assert!(side.slice(Ok((300, Duration::from_millis(100)))));
        side.end_round();
        assert!(side.slice(Ok((10, Duration::from_secs(1)))));
        side.end_round();
        assert_eq!(side.outcome.samples, [2_000.0, 10.0]);
        assert!(!side.slice(Err("down".into())));
        assert_eq!(side.outcome.median(), None, "a failed side has no median");
    }
}
