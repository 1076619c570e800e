//! The second part of `tidings demo`: a durable stream survives a crash.
//!
//! A stream captures `orders.#` with `Fsync::Always`; a durable subscription `billing`
//! bills orders from it. Mid-stream the broker is dropped (the "crash") with one order in
//! the handler and more unread; the demo's own broker, on the same data directory, then
//! reopens the stream (recovery report), `billing` resumes at its committed offset, and a new durable
//! subscription `audit` replays from a point in time; a third, `fraud`, dead-letters every
//! tenth order into its durable DLQ (for `tidings dlq show|redrive|purge` on the data dir).
//! Every count printed is exact. The stream and the three durable subscriptions stay open
//! on the demo's broker until it closes, so `tidings demo --admin` shows them.
//!
//! The stream lives in a data directory (the embedded log) or, with `tidings demo --nats
//! URL`, on a NATS server (JetStream). The scenario and its checks are the same; what differs
//! is printed: offsets start at 1 on JetStream, the reopened stream has no local recovery
//! report, and the run's stream (and its subscriptions' dead-letter streams) are deleted from
//! the server at the end, under a name unique to the run so nothing of the server's own is
//! touched.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use tidings::{
    Broker, DurableSpec, DurableSubscription, HandlerError, Message, StartAt, StreamConfig,
    SubscribeOptions,
};
use tidings_jetstream::{ConnectOptions, JetStreamBackend};

use crate::demo::{DemoResult, lock, wait_until};

/// Orders published to the stream.
const ORDERS: u32 = 50;
/// Orders published before the replay point in time.
const BEFORE_MARK: u32 = 25;
/// Orders billed in the first run before the crash.
const BILLED_BEFORE_CRASH: u32 = 30;

/// Billed orders with the stream offset each came from.
type Billed = Arc<std::sync::Mutex<Vec<(u32, u64)>>>;

/// A billing handler; with `stall_at`, it holds order `stall_at` until `release` is set and
/// then fails it, so it waits to retry when the broker is dropped: abandoned at close, not
/// finished, not committed.
fn billing(
    billed: &Billed,
    stall_at: Option<(u32, Arc<AtomicBool>)>,
) -> impl Fn(&Message) -> Result<(), HandlerError> + Send + Sync + 'static {
    let billed = billed.clone();
    move |m: &Message| {
        let n: u32 = String::from_utf8_lossy(m.payload())
            .parse()
            .map_err(|_| HandlerError::reject("not an order number"))?;
        if let Some((at, release)) = &stall_at
            && n == *at
        {
            while !release.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(1));
            }
            return Err(HandlerError::retry("interrupted by the crash"));
        }
        lock(&billed).push((n, m.offset().unwrap_or(u64::MAX)));
        Ok(())
    }
}

/// Where the demo's durable stream lives.
#[derive(Debug, Clone)]
pub(crate) enum Place {
    /// The embedded log in this data directory.
    DataDir(PathBuf),
    /// JetStream on the NATS server at `url`; `run` makes the stream's name and topics
    /// unique to this run.
    Nats {
        /// The server, e.g. `nats://127.0.0.1:4222`.
        url: String,
        /// A name unique to this run.
        run: String,
    },
}

/// How long a message a dropped broker held stays with it on JetStream before it is
/// delivered again: short, so run 2 gets order 31 back within the demo's patience.
const NATS_ACK_WAIT: Duration = Duration::from_secs(3);

impl Place {
    /// JetStream on the server at `url`, with names unique to this run.
    pub(crate) fn nats(url: &str) -> Self {
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() % 1_000_000_000_000);
        Self::Nats {
            url: url.to_owned(),
            run: format!("tidings-demo-{}-{nanos}", std::process::id()),
        }
    }

    fn stream(&self) -> String {
        match self {
            Self::DataDir(_) => "orders".to_owned(),
            Self::Nats { run, .. } => run.clone(),
        }
    }

    /// The first word(s) of every order topic.
    fn topic_root(&self) -> String {
        match self {
            Self::DataDir(_) => "orders".to_owned(),
            Self::Nats { run, .. } => format!("{run}.orders"),
        }
    }

    /// The offset of the first message in a fresh stream.
    fn first_offset(&self) -> u64 {
        match self {
            Self::DataDir(_) => 0,
            Self::Nats { .. } => 1,
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::DataDir(dir) => format!("data dir {}", dir.display()),
            Self::Nats { url, run } => format!("JetStream at {url}, stream {run}"),
        }
    }

    /// A broker (thread driver, system clock) that keeps its streams here, with the
    /// JetStream connection it uses, if any.
    pub(crate) fn broker(&self) -> DemoResult<(Broker, Option<Arc<JetStreamBackend>>)> {
        let mut builder = Broker::builder();
        let mut backend = None;
        match self {
            Self::DataDir(dir) => builder = builder.data_dir(dir),
            Self::Nats { url, .. } => {
                let b = Arc::new(
                    JetStreamBackend::builder()
                        .ack_wait(NATS_ACK_WAIT)
                        .connect(ConnectOptions::new(url.as_str()))?,
                );
                builder = builder.durable_backend(b.clone());
                backend = Some(b);
            }
        }
        Ok((builder.build()?, backend))
    }

    /// Open (or reopen) the demo's stream on `broker` (the embedded log syncs every append
    /// by default: `Fsync::Always`).
    fn open_stream(&self, broker: &Broker) -> DemoResult<tidings::Stream> {
        Ok(broker.create_stream(StreamConfig::new(
            self.stream(),
            [format!("{}.#", self.topic_root())],
        ))?)
    }

    fn subscribe(
        &self,
        broker: &Broker,
        name: &str,
        start: StartAt,
        handler: impl tidings::Handler,
    ) -> DemoResult<DurableSubscription> {
        let options = SubscribeOptions::new()
            .name(name.to_owned())
            .retry(tidings::Retry::fixed(Duration::from_secs(60), 3));
        Ok(broker.subscribe(
            DurableSpec::new(self.stream())
                .name(name)
                .filter(format!("{}.#", self.topic_root()))
                .start(start),
            options,
            handler,
        )?)
    }
}

/// What the durable part leaves open on the demo's broker, and its checks.
pub(crate) struct Durable {
    /// The checks of the durable part.
    pub(crate) checks: Vec<(String, bool)>,
    /// `billing`, `audit` and `fraud`, kept until the broker closes.
    subscriptions: Vec<DurableSubscription>,
    /// The run's stream name, and the server to delete it from (JetStream only).
    stream: String,
    backend: Option<Arc<JetStreamBackend>>,
}

impl Durable {
    /// Drop the durable subscriptions (before the broker closes).
    pub(crate) fn unsubscribe(&mut self) {
        self.subscriptions.clear();
    }

    /// After the broker closed: delete the run's stream (and its subscriptions' dead-letter
    /// streams) from the server, on JetStream.
    pub(crate) fn clean_up(self) {
        let Some(backend) = self.backend else {
            return;
        };
        let stream_name = self.stream;
        // The run's stream and its dead-letter streams: nothing else on the server.
        match backend.delete_stream(&stream_name) {
            Ok(_) => {
                outln!("  deleted stream {stream_name} and its dead-letter streams from the server")
            }
            Err(e) => outln!("  could not delete stream {stream_name} from the server: {e}"),
        }
    }
}

/// Run the durable part of the demo at `place` (a data dir is created if missing): run 1
/// on a broker of its own that crashes, run 2 on `broker` (the demo's, built by
/// [`Place::broker`] with `backend`), where the stream and the durable subscriptions stay.
pub(crate) fn scenario(
    place: &Place,
    broker: &Broker,
    backend: Option<Arc<JetStreamBackend>>,
) -> DemoResult<Durable> {
    outln!(
        "\ndurable stream: crash, resume, replay ({})",
        place.describe()
    );
    let stream_name = place.stream();
    let root = place.topic_root();

    // Run 1: publish, bill 30, crash with order 31 in the handler.
    let (run1, _) = place.broker()?;
    place.open_stream(&run1)?;
    let first: Billed = Arc::default();
    let release = Arc::new(AtomicBool::new(false));
    let sub = place.subscribe(
        &run1,
        "billing",
        StartAt::Earliest,
        billing(&first, Some((BILLED_BEFORE_CRASH + 1, release.clone()))),
    )?;
    let mut mark = SystemTime::now();
    for n in 1..=ORDERS {
        if n == BEFORE_MARK + 1 {
            // Timestamps are in milliseconds: step past the ones already written.
            std::thread::sleep(Duration::from_millis(5));
            mark = SystemTime::now();
            std::thread::sleep(Duration::from_millis(5));
        }
        let report =
            run1.publish(Message::to(format!("{root}.{}", n % 3)).payload(n.to_string()))?;
        if report.streams != [stream_name.as_str()] {
            return Err(format!("order {n} was not captured by the stream: {report:?}").into());
        }
    }
    let stalled = wait_until(|| {
        lock(&first).len() == BILLED_BEFORE_CRASH as usize && sub.stats().in_flight == 1
    });
    outln!(
        "  run 1: published {ORDERS} orders (fsync always); billing billed {} and holds order {} when the broker is dropped",
        lock(&first).len(),
        BILLED_BEFORE_CRASH + 1
    );
    release.store(true, Ordering::Release);
    drop(sub);
    drop(run1);

    // Run 2, on the demo's broker: reopen, resume, replay.
    let stream = place.open_stream(broker)?;
    match place {
        Place::DataDir(_) => {
            let recovery = broker
                .embedded_backend()
                .and_then(|b| b.recovery(stream.name()))
                .unwrap_or_default();
            outln!(
                "  run 2: reopened the stream: {} segment(s), offsets {}..{}, torn tail cut: {}",
                recovery.segments,
                recovery.start_offset,
                recovery.end_offset,
                if recovery.truncated.is_some() {
                    "yes"
                } else {
                    "no"
                }
            );
        }
        Place::Nats { .. } => outln!(
            "  run 2: reopened the stream on the server: offsets {}..{} (JetStream sequences start at 1)",
            stream.start_offset(),
            stream.end_offset()
        ),
    }
    let second: Billed = Arc::default();
    let sub = place.subscribe(broker, "billing", StartAt::Earliest, billing(&second, None))?;
    let caught_up = wait_until(|| sub.lag() == 0 && sub.outstanding() == 0);
    // The first offset delivered after the restart is where billing resumed.
    let resumed_at = lock(&second)
        .first()
        .map_or(u64::MAX, |&(_, offset)| offset);
    outln!(
        "  billing resumed at offset {resumed_at} (its committed position) and billed {} more; lag now {}",
        lock(&second).len(),
        sub.lag()
    );
    let replayed: Billed = Arc::default();
    let audit = place.subscribe(
        broker,
        "audit",
        StartAt::Time(mark),
        billing(&replayed, None),
    )?;
    let replay_done = wait_until(|| audit.lag() == 0 && audit.outstanding() == 0);
    let replay: Vec<u32> = lock(&replayed).iter().map(|&(n, _)| n).collect();
    outln!(
        "  audit replayed from the time mark between orders {BEFORE_MARK} and {}: {} orders ({}..={})",
        BEFORE_MARK + 1,
        replay.len(),
        replay.first().copied().unwrap_or(0),
        replay.last().copied().unwrap_or(0),
    );
    // A third durable subscription rejects every tenth order: its durable DLQ keeps them
    // on disk for `tidings dlq show|redrive|purge`.
    let fraud = place.subscribe(broker, "fraud", StartAt::Earliest, |m: &Message| {
        if m.payload().ends_with(b"0") {
            return Err(HandlerError::reject("flagged for manual review"));
        }
        Ok(())
    })?;
    let fraud_done = wait_until(|| fraud.lag() == 0 && fraud.outstanding() == 0);
    let flagged = fraud.durable_dead_letters()?.len();
    outln!("  fraud flagged {flagged} orders into its durable dead-letter queue");
    let subscriptions = vec![sub, audit, fraud];

    let first = lock(&first).clone();
    let second = lock(&second).clone();
    let all: BTreeSet<u32> = first.iter().chain(&second).map(|&(n, _)| n).collect();
    let duplicates = first.len() + second.len() - all.len();
    outln!(
        "  across the crash: {} distinct orders billed, {duplicates} billed twice",
        all.len()
    );
    // Order n is at offset n - 1 in the embedded log and at n on JetStream.
    let resume_offset = u64::from(BILLED_BEFORE_CRASH) + place.first_offset();
    let checks = vec![
        (
            format!("durable: run 1 billed {BILLED_BEFORE_CRASH} then crashed mid-stream"),
            stalled,
        ),
        (
            format!(
                "durable: after the restart billing resumed at offset {resume_offset}, order {} (R-LOG-3)",
                BILLED_BEFORE_CRASH + 1
            ),
            resumed_at == resume_offset && caught_up,
        ),
        (
            format!("durable: all {ORDERS} orders billed, none twice (commit at close)"),
            all == (1..=ORDERS).collect() && duplicates == 0,
        ),
        (
            format!(
                "durable: replay by time delivered exactly orders {}..={ORDERS} (R-LOG-4)",
                BEFORE_MARK + 1
            ),
            replay_done && replay == (BEFORE_MARK + 1..=ORDERS).collect::<Vec<_>>(),
        ),
        (
            format!(
                "durable: fraud dead-lettered exactly the {} orders divisible by 10 (R-DEL-4)",
                ORDERS / 10
            ),
            fraud_done && flagged == (ORDERS / 10) as usize,
        ),
    ];
    Ok(Durable {
        checks,
        subscriptions,
        stream: stream_name,
        backend,
    })
}

/// A fresh directory for the demo's stream under the system temp dir.
pub(crate) fn fresh_dir() -> PathBuf {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    std::env::temp_dir().join(format!("tidings-demo-{}-{nanos}", std::process::id()))
}
