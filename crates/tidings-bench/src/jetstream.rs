//! `jetstream/publish/window=1`, `jetstream/publish/window=1000`, `jetstream/consume`:
//! `tidings-jetstream` against raw `async-nats` doing the same work, on one local
//! `nats-server` that this module starts (the testkit launcher: 127.0.0.1, a fresh store
//! dir, `jetstream { sync_interval: always }`, so every acknowledgement waited for an fsync).
//!
//! * `publish/window=1` — publish with ack, one in flight: tidings `JetStream::append`;
//!   raw `publish_with_headers(..).await?.await?` with the same subject, `Nats-Msg-Id` and
//!   128-byte payload.
//! * `publish/window=1000` — up to 1,000 acknowledgements in flight: tidings `Pipeline`; raw
//!   a queue of `PublishAckFuture`s, the oldest awaited once more than 1,000 are in flight.
//! * `consume` — durable consume + confirmed ack of records stored before the timer starts:
//!   tidings `Durable::fetch` (batches of 100, pattern re-check) and `Delivery::ack`; raw a
//!   durable pull consumer's `batch()` of 100 and `double_ack` per message.
//! * `publish/broker` — what a service sees: `Broker::publish` from one thread to a stream on
//!   the `JetStreamBackend` (it returns once the server acknowledged), against raw
//!   `publish_with_headers(..).await?.await?` to the same stream.
//! * `consume/broker` — a durable subscription on the `JetStreamBackend` handling records
//!   stored before it was opened, from `subscribe_durable` until its handler saw the last
//!   one, against a raw durable pull consumer created and drained (batches of 100,
//!   `double_ack` each) in the same time frame.
//!
//! The load on this machine and its disk comes and goes within a second, and every message
//! waits for an fsync, so the two sides are not timed in separate rounds but **paired**: each
//! round alternates short slices of each side (T R, R T, T R, …) and a side's rate for the
//! round is its messages over the sum of its slices' times. The median is over rounds. Each
//! round uses fresh subjects (and, for `consume`, a fresh durable consumer per side, created
//! and filled before the timer starts and deleted after it stops).
//! Without a `nats-server` binary (see `tidings_testkit::nats`) the cases are emitted with
//! no values and the reason in their notes, and a line on stderr says so.

use std::cell::Cell;
use std::collections::VecDeque;
use std::future::IntoFuture;
use std::num::NonZeroUsize;
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::{AckPolicy, PullConsumer, pull};
use bytes::Bytes;
use futures_util::StreamExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tidings::{
    Broker, DurableSpec, HandlerError, Message, MessageId, Pattern, StreamConfig, SubscribeOptions,
    Topic,
};
use tidings_jetstream::{
    ConnectOptions, ConsumerSpec, Durable, JetStream, JetStreamBackend, Record, StreamSpec,
};
use tidings_testkit::nats::{NatsServer, NatsServerOptions};

use crate::harness::{ContenderRun, Tally};
use crate::{Case, Filter, Plan};

const PUBLISH_ONE: &str = "jetstream/publish/window=1";
const PUBLISH_WINDOW: &str = "jetstream/publish/window=1000";
const CONSUME: &str = "jetstream/consume";
const PUBLISH_BROKER: &str = "jetstream/publish/broker";
const CONSUME_BROKER: &str = "jetstream/consume/broker";
/// The baseline's name in every case.
const RAW: &str = "raw-async-nats";

const PAYLOAD_BYTES: usize = 128;
const WINDOW: usize = 1_000;
const FETCH_BATCH: usize = 100;
/// The stream the `tidings-jetstream` cases append to (it captures `bench.#`).
const STREAM: &str = "bench";
/// The stream of the broker cases (it captures `broker.#`).
const BROKER_STREAM: &str = "broker";
/// Bound on one pull: the records are already stored, so only a stall reaches it.
const PULL_WAIT: Duration = Duration::from_secs(5);

pub(crate) fn case_names() -> Vec<String> {
    vec![
        PUBLISH_ONE.into(),
        PUBLISH_WINDOW.into(),
        CONSUME.into(),
        PUBLISH_BROKER.into(),
        CONSUME_BROKER.into(),
    ]
}

/// Slices per round and messages per slice for each case. With `sync_interval: always` the
/// server fsyncs every message it stores (1,000 to 2,500 a second on this machine's disk,
/// window or not), so these are small: the five cases take about ten seconds in `--quick`
/// and a few minutes in the full run.
struct Counts {
    /// `(slices, messages per slice)` of each case.
    publish_one: (usize, u64),
    /// Slices longer than the window, so most of a slice runs with the window full.
    publish_window: (usize, u64),
    /// Messages per slice are a multiple of [`FETCH_BATCH`], so no pull waits out its expiry
    /// for a short batch.
    consume: (usize, u64),
    publish_broker: (usize, u64),
    /// Messages per side and round (one slice each: a durable subscription drains all).
    consume_broker: u64,
}

impl Counts {
    fn new(plan: &Plan) -> Self {
        let window = WINDOW as u64;
        let batch = FETCH_BATCH as u64;
        if plan.quick {
            Self {
                publish_one: (4, 25),
                publish_window: (1, window + window / 5),
                consume: (2, 2 * batch),
                publish_broker: (4, 25),
                consume_broker: 2 * batch,
            }
        } else {
            Self {
                publish_one: (10, 50),
                publish_window: (4, 2 * window),
                consume: (10, 5 * batch),
                publish_broker: (10, 50),
                consume_broker: 10 * batch,
            }
        }
    }
}

pub(crate) fn run(plan: &Plan, filter: &Filter) -> Vec<Case> {
    let mut cases: Vec<Case> = case_names()
        .into_iter()
        .filter(|n| filter.wants(n))
        .map(|n| Case::new(n, "msgs/s", true))
        .collect();
    if cases.is_empty() {
        return cases;
    }
    let skip = |cases: &mut Vec<Case>, why: String| {
        eprintln!("jetstream cases skipped: {why}");
        for c in cases.iter_mut() {
            c.note(format!("skipped: {why}"));
        }
    };
    if NatsServer::binary().is_none() {
        skip(
            &mut cases,
            format!("{}", tidings_testkit::nats::LaunchError::BinaryNotFound),
        );
        return cases;
    }
    let server = match NatsServer::start(NatsServerOptions::new()) {
        Ok(s) => s,
        Err(e) => {
            skip(&mut cases, format!("nats-server did not start: {e}"));
            return cases;
        }
    };
    // Its own runtime: the shared one has no I/O driver. Two workers, like a small service.
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            skip(&mut cases, format!("no tokio runtime: {e}"));
            return cases;
        }
    };
    let bench = match runtime.block_on(Bench::connect(&server.url())) {
        Ok(b) => b,
        Err(e) => {
            skip(&mut cases, e);
            return cases;
        }
    };
    let c = Counts::new(plan);
    let rounds = plan.rounds;
    let common = format!(
        "{rounds} rounds of alternating slices; {PAYLOAD_BYTES} B payload with Nats-Msg-Id; \
         one local nats-server {} with sync_interval: always (store {}); one connection per side",
        bench.js.server_version(),
        server.store_dir().display()
    );
    for case in &mut cases {
        let (outcomes, what) = match case.name.as_str() {
            PUBLISH_ONE => {
                let (slices, n) = c.publish_one;
                (
                    runtime.block_on(bench.publish(rounds, slices, n, 1)),
                    format!(
                        "{slices} x {n} messages per side and round, one acknowledgement in flight"
                    ),
                )
            }
            PUBLISH_WINDOW => {
                let (slices, n) = c.publish_window;
                (
                    runtime.block_on(bench.publish(rounds, slices, n, WINDOW)),
                    format!(
                        "{slices} x {n} messages per side and round, up to {WINDOW} acknowledgements in flight"
                    ),
                )
            }
            CONSUME => {
                let (slices, n) = c.consume;
                (
                    runtime.block_on(bench.consume(rounds, slices, n)),
                    format!(
                        "{slices} x {n} stored messages per side and round drained by a durable pull \
                         consumer, batches of {FETCH_BATCH}, one confirmed ack awaited per message"
                    ),
                )
            }
            PUBLISH_BROKER => {
                let (slices, n) = c.publish_broker;
                (
                    bench.publish_broker(&runtime, &server.url(), rounds, slices, n),
                    format!(
                        "{slices} x {n} messages per side and round; tidings: Broker::publish on a \
                         JetStreamBackend stream; raw: publish with ack, one in flight"
                    ),
                )
            }
            _ => {
                let n = c.consume_broker;
                (
                    bench.consume_broker(&runtime, &server.url(), rounds, n),
                    format!(
                        "{n} stored messages per side and round; tidings: a new durable subscription \
                         on the JetStreamBackend until its handler saw all; raw: a new durable pull \
                         consumer drained in batches of {FETCH_BATCH}, one confirmed ack per message"
                    ),
                )
            }
        };
        fill(case, &outcomes);
        case.note(what);
        case.note(&common);
    }
    drop(bench);
    drop(runtime);
    drop(server);
    cases
}

fn fill(case: &mut Case, outcomes: &[ContenderRun]) {
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
    if let (Some(ours), Some(raw)) = (case.tidings, case.baselines.get(RAW)) {
        case.note(format!("tidings/raw = {:.2}", ours / raw));
    }
}

/// One side of a paired case: its per-round rates, and the time and messages of the round
/// under way.
struct Side {
    outcome: ContenderRun,
    busy: Duration,
    messages: u64,
}

impl Side {
    fn new(name: &str) -> Self {
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
    fn slice(&mut self, result: Result<(u64, Duration), String>) -> bool {
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

    fn end_round(&mut self) {
        if self.messages > 0 && !self.busy.is_zero() {
            self.outcome
                .samples
                .push(self.messages as f64 / self.busy.as_secs_f64());
        }
        self.busy = Duration::ZERO;
        self.messages = 0;
    }
}

/// Whether tidings goes first in slice `slice` of round `round` (T R, R T, … and each round
/// starts with the other side than the previous one).
fn tidings_first(round: usize, slice: usize) -> bool {
    (round + slice).is_multiple_of(2)
}

/// The two clients on one server, and the ids and subjects they use.
struct Bench {
    js: JetStream,
    raw: async_nats::jetstream::Context,
    payload: Bytes,
    /// Message ids are unique across the whole run, so no append is a duplicate.
    next_id: Cell<u128>,
    /// Subjects are unique per round and side: `bench.<n>`.
    next_subject: Cell<u64>,
}

impl Bench {
    async fn connect(url: &str) -> Result<Self, String> {
        let js = ConnectOptions::new(url)
            .connect()
            .await
            .map_err(|e| format!("tidings-jetstream could not connect: {e}"))?;
        let pattern = Pattern::new("bench.#").map_err(|e| e.to_string())?;
        js.ensure_stream(&StreamSpec::new(STREAM, [pattern]))
            .await
            .map_err(|e| format!("creating the stream: {e}"))?;
        let client = async_nats::connect(url)
            .await
            .map_err(|e| format!("async-nats could not connect: {e}"))?;
        Ok(Self {
            js,
            raw: async_nats::jetstream::new(client),
            payload: Bytes::from(vec![0x5A; PAYLOAD_BYTES]),
            next_id: Cell::new(1),
            next_subject: Cell::new(1),
        })
    }

    fn id(&self) -> MessageId {
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        MessageId::from_u128(id)
    }

    fn subject(&self) -> String {
        let n = self.next_subject.get();
        self.next_subject.set(n + 1);
        format!("bench.{n}")
    }

    fn record(&self, topic: &Topic) -> Record {
        Record::new(self.id(), topic.clone()).payload(self.payload.to_vec())
    }

    fn raw_headers(&self) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            async_nats::header::NATS_MESSAGE_ID,
            self.id().to_string().as_str(),
        );
        headers
    }

    /// Paired rounds of slices of `n` publishes with up to `window` acknowledgements in
    /// flight.
    async fn publish(
        &self,
        rounds: usize,
        slices: usize,
        n: u64,
        window: usize,
    ) -> Vec<ContenderRun> {
        let (mut ours, mut raw) = (Side::new("tidings"), Side::new(RAW));
        'rounds: for round in 0..rounds {
            let topic = match Topic::new(&self.subject()) {
                Ok(t) => t,
                Err(e) => {
                    ours.outcome.error = Some(e.to_string());
                    break;
                }
            };
            let subject = self.subject();
            for slice in 0..slices {
                for tidings in [tidings_first(round, slice), !tidings_first(round, slice)] {
                    let ok = if tidings {
                        ours.slice(self.publish_tidings(&topic, n, window).await)
                    } else {
                        raw.slice(self.publish_raw(&subject, n, window).await)
                    };
                    if !ok {
                        break 'rounds;
                    }
                }
            }
            ours.end_round();
            raw.end_round();
        }
        vec![ours.outcome, raw.outcome]
    }

    async fn publish_tidings(
        &self,
        topic: &Topic,
        n: u64,
        window: usize,
    ) -> Result<(u64, Duration), String> {
        let window = NonZeroUsize::new(window).ok_or("window 0")?;
        let started = Instant::now();
        if window.get() == 1 {
            for _ in 0..n {
                self.js
                    .append(&self.record(topic))
                    .await
                    .map_err(|e| e.to_string())?;
            }
        } else {
            let mut pipeline = self.js.pipeline(window);
            for _ in 0..n {
                pipeline
                    .append(&self.record(topic))
                    .await
                    .map_err(|e| e.to_string())?;
            }
            while let Some(acked) = pipeline.next_acknowledged().await {
                acked.map_err(|e| e.to_string())?;
            }
        }
        Ok((n, started.elapsed()))
    }

    async fn publish_raw(
        &self,
        subject: &str,
        n: u64,
        window: usize,
    ) -> Result<(u64, Duration), String> {
        let started = Instant::now();
        if window == 1 {
            for _ in 0..n {
                self.raw
                    .publish_with_headers(
                        subject.to_owned(),
                        self.raw_headers(),
                        self.payload.clone(),
                    )
                    .await
                    .map_err(|e| e.to_string())?
                    .await
                    .map_err(|e| e.to_string())?;
            }
        } else {
            // What `Pipeline` does: send, then wait for the oldest once more than the window
            // is in flight.
            let mut in_flight = VecDeque::with_capacity(window + 1);
            for _ in 0..n {
                let ack = self
                    .raw
                    .publish_with_headers(
                        subject.to_owned(),
                        self.raw_headers(),
                        self.payload.clone(),
                    )
                    .await
                    .map_err(|e| e.to_string())?;
                in_flight.push_back(ack.into_future());
                if in_flight.len() > window {
                    let oldest = in_flight.pop_front().ok_or("empty queue")?;
                    oldest.await.map_err(|e| e.to_string())?;
                }
            }
            for ack in in_flight {
                ack.await.map_err(|e| e.to_string())?;
            }
        }
        Ok((n, started.elapsed()))
    }

    /// Stores `n` records on a fresh subject (untimed) and returns the subject.
    async fn fill(&self, n: u64) -> Result<String, String> {
        let subject = self.subject();
        let topic = Topic::new(&subject).map_err(|e| e.to_string())?;
        let mut pipeline = self
            .js
            .pipeline(NonZeroUsize::new(WINDOW).ok_or("window 0")?);
        for _ in 0..n {
            pipeline
                .append(&self.record(&topic))
                .await
                .map_err(|e| format!("filling: {e}"))?;
        }
        while let Some(acked) = pipeline.next_acknowledged().await {
            acked.map_err(|e| format!("filling: {e}"))?;
        }
        Ok(subject)
    }

    /// Paired rounds: each side gets `slices * n` stored messages and a fresh durable
    /// consumer (untimed), then drains `n` per slice.
    async fn consume(&self, rounds: usize, slices: usize, n: u64) -> Vec<ContenderRun> {
        let (mut ours, mut raw) = (Side::new("tidings"), Side::new(RAW));
        for round in 0..rounds {
            let consumers = async {
                let total = n * slices as u64;
                let ours = self.tidings_consumer(&self.fill(total).await?).await?;
                let theirs = self.raw_consumer(&self.fill(total).await?).await?;
                Ok::<_, String>((ours, theirs))
            };
            let (durable, consumer) = match consumers.await {
                Ok(c) => c,
                Err(e) => {
                    ours.outcome.error = Some(format!("setting up: {e}"));
                    break;
                }
            };
            let mut ok = true;
            for slice in 0..slices {
                for tidings in [tidings_first(round, slice), !tidings_first(round, slice)] {
                    ok = if tidings {
                        ours.slice(consume_tidings(&durable, n).await)
                    } else {
                        raw.slice(consume_raw(&consumer, n).await)
                    };
                    if !ok {
                        break;
                    }
                }
                if !ok {
                    break;
                }
            }
            // Untimed; a consumer left behind only costs the server a little.
            let _ = durable.delete().await;
            let _ = self
                .raw
                .delete_consumer_from_stream(
                    consumer
                        .cached_info()
                        .config
                        .durable_name
                        .as_deref()
                        .unwrap_or_default(),
                    STREAM,
                )
                .await;
            if !ok {
                break;
            }
            ours.end_round();
            raw.end_round();
        }
        vec![ours.outcome, raw.outcome]
    }

    /// A broker whose durable backend is JetStream on `url`, with the broker cases' stream.
    fn broker(url: &str) -> Result<Broker, String> {
        let backend = JetStreamBackend::connect(ConnectOptions::new(url))
            .map_err(|e| format!("JetStreamBackend: {e}"))?;
        let broker = Broker::builder()
            .durable_backend(Arc::new(backend))
            .build()
            .map_err(|e| e.to_string())?;
        broker
            .create_stream(StreamConfig::new(BROKER_STREAM, ["broker.#"]))
            .map_err(|e| e.to_string())?;
        Ok(broker)
    }

    fn broker_publish(
        &self,
        broker: &Broker,
        topic: &str,
        n: u64,
    ) -> Result<(u64, Duration), String> {
        let started = Instant::now();
        for _ in 0..n {
            broker
                .publish(Message::to(topic).payload(self.payload.clone()))
                .map_err(|e| e.to_string())?;
        }
        Ok((n, started.elapsed()))
    }

    /// Paired rounds of slices: `Broker::publish` against raw publish with ack.
    fn publish_broker(
        &self,
        runtime: &tokio::runtime::Runtime,
        url: &str,
        rounds: usize,
        slices: usize,
        n: u64,
    ) -> Vec<ContenderRun> {
        let (mut ours, mut raw) = (Side::new("tidings"), Side::new(RAW));
        let broker = match Self::broker(url) {
            Ok(b) => b,
            Err(e) => {
                ours.outcome.error = Some(e);
                return vec![ours.outcome, raw.outcome];
            }
        };
        'rounds: for round in 0..rounds {
            let (topic, subject) = (self.broker_subject(), self.broker_subject());
            for slice in 0..slices {
                for tidings in [tidings_first(round, slice), !tidings_first(round, slice)] {
                    let ok = if tidings {
                        ours.slice(self.broker_publish(&broker, &topic, n))
                    } else {
                        raw.slice(runtime.block_on(self.publish_raw(&subject, n, 1)))
                    };
                    if !ok {
                        break 'rounds;
                    }
                }
            }
            ours.end_round();
            raw.end_round();
        }
        broker.close(Duration::from_secs(5));
        vec![ours.outcome, raw.outcome]
    }

    /// Paired rounds: `n` messages stored for each side (untimed), then a new durable
    /// subscription drains its share and a new raw consumer drains the other, in turn.
    fn consume_broker(
        &self,
        runtime: &tokio::runtime::Runtime,
        url: &str,
        rounds: usize,
        n: u64,
    ) -> Vec<ContenderRun> {
        let (mut ours, mut raw) = (Side::new("tidings"), Side::new(RAW));
        let broker = match Self::broker(url) {
            Ok(b) => b,
            Err(e) => {
                ours.outcome.error = Some(e);
                return vec![ours.outcome, raw.outcome];
            }
        };
        for round in 0..rounds {
            let (topic, subject) = (self.broker_subject(), self.broker_subject());
            let filled = self
                .broker_publish(&broker, &topic, n)
                .and_then(|_| self.broker_publish(&broker, &subject, n));
            if let Err(e) = filled {
                ours.outcome.error = Some(format!("filling: {e}"));
                break;
            }
            let mut ok = true;
            for tidings in [tidings_first(round, 0), !tidings_first(round, 0)] {
                ok = if tidings {
                    ours.slice(self.durable_drain(&broker, &topic, n))
                } else {
                    raw.slice(runtime.block_on(async {
                        let started = Instant::now();
                        let consumer = self.raw_consumer_on(BROKER_STREAM, &subject).await?;
                        consume_raw(&consumer, n).await?;
                        Ok((n, started.elapsed()))
                    }))
                };
                if !ok {
                    break;
                }
            }
            if !ok {
                break;
            }
            ours.end_round();
            raw.end_round();
        }
        broker.close(Duration::from_secs(5));
        vec![ours.outcome, raw.outcome]
    }

    /// Opens a durable subscription on `topic` and waits until its handler saw `n` messages.
    fn durable_drain(
        &self,
        broker: &Broker,
        topic: &str,
        n: u64,
    ) -> Result<(u64, Duration), String> {
        let tally = Arc::new(Tally::new());
        tally.arm(n, 1);
        let seen = Arc::new(AtomicU64::new(0));
        let (t, s) = (Arc::clone(&tally), Arc::clone(&seen));
        let started = Instant::now();
        let subscription = broker
            .subscribe_durable(
                DurableSpec::new(BROKER_STREAM)
                    .name(topic.replace('.', "-"))
                    .filter(topic),
                SubscribeOptions::default(),
                move |_: &Message| -> Result<(), HandlerError> {
                    let before = s.fetch_add(1, Ordering::Relaxed);
                    t.hit(before, before + 1);
                    Ok(())
                },
            )
            .map_err(|e| e.to_string())?;
        if !tally.wait(Duration::from_secs(60)) {
            return Err(format!(
                "the durable subscription saw {} of {n} within 60 s",
                seen.load(Ordering::Relaxed)
            ));
        }
        let took = started.elapsed();
        drop(subscription);
        Ok((n, took))
    }

    fn broker_subject(&self) -> String {
        let n = self.next_subject.get();
        self.next_subject.set(n + 1);
        format!("broker.{n}")
    }

    async fn tidings_consumer(&self, subject: &str) -> Result<Durable, String> {
        let pattern = Pattern::new(subject).map_err(|e| e.to_string())?;
        self.js
            .durable(ConsumerSpec::new(
                STREAM,
                subject.replace('.', "-"),
                pattern,
            ))
            .await
            .map_err(|e| e.to_string())
    }

    async fn raw_consumer(&self, subject: &str) -> Result<PullConsumer, String> {
        self.raw_consumer_on(STREAM, subject).await
    }

    async fn raw_consumer_on(&self, stream: &str, subject: &str) -> Result<PullConsumer, String> {
        self.raw
            .create_consumer_on_stream(
                pull::Config {
                    durable_name: Some(subject.replace('.', "-")),
                    filter_subject: subject.to_owned(),
                    ack_policy: AckPolicy::Explicit,
                    ..Default::default()
                },
                stream,
            )
            .await
            .map_err(|e| e.to_string())
    }
}

async fn consume_tidings(durable: &Durable, n: u64) -> Result<(u64, Duration), String> {
    let started = Instant::now();
    let mut consumed = 0;
    while consumed < n {
        let fetched = durable
            .fetch(FETCH_BATCH, PULL_WAIT)
            .await
            .map_err(|e| e.to_string())?;
        if fetched.deliveries.is_empty() {
            return Err(format!("ran dry after {consumed} of {n}"));
        }
        for d in fetched.deliveries {
            d.ack().await.map_err(|e| e.to_string())?;
            consumed += 1;
        }
    }
    Ok((consumed, started.elapsed()))
}

async fn consume_raw(consumer: &PullConsumer, n: u64) -> Result<(u64, Duration), String> {
    let started = Instant::now();
    let mut consumed = 0;
    while consumed < n {
        let mut batch = consumer
            .batch()
            .max_messages(FETCH_BATCH)
            .expires(PULL_WAIT)
            .messages()
            .await
            .map_err(|e| e.to_string())?;
        let before = consumed;
        while let Some(message) = batch.next().await {
            message
                .map_err(|e| e.to_string())?
                .double_ack()
                .await
                .map_err(|e| e.to_string())?;
            consumed += 1;
        }
        if consumed == before {
            return Err(format!("ran dry after {consumed} of {n}"));
        }
    }
    Ok((consumed, started.elapsed()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_alternate_and_rounds_start_with_the_other_side() {
        let order: Vec<bool> = (0..2)
            .flat_map(|round| (0..3).map(move |slice| tidings_first(round, slice)))
            .collect();
        assert_eq!(order, [true, false, true, false, true, false]);
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
