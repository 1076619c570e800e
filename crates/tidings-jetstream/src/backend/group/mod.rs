//! Keyed consumer groups: one durable subscription with per-key order (keyed lanes or
//! per-key concurrency), shared by several processes, keeps per-key order across them
//! (R-DIST-6). The design, its bounds and its failure cases are in `docs/design.md`,
//! "Keyed consumer groups across processes".
//!
//! # Shape
//! A keyed record is stored under its key's partition (`$TIDINGS.k.<stream>.<p>.<topic>`,
//! see [`key_partition`](super::key_partition)). The group has one consumer per partition,
//! `<durable>_k<p>`, pulled only by the member holding the partition's lease
//! ([`lease`]), and the consumer `<durable>` for unkeyed records, which every member pulls
//! (they compete freely, as before). This cursor combines them: it opens a partition's
//! cursor ([`partition`]) when its lease is taken, and closes it when the lease is handed
//! over or lapses.
//!
//! # The start gate
//! The subscription asks [`StartGate::admit`] before every handler attempt. A message of
//! a partition is admitted only while its lease admits starts *and* it is the very
//! allocation the partition's current cursor handed out ([`BackendCursor::fetch_shared`]):
//! a copy fetched under an earlier lease of the same partition, still queued when the
//! partition came back, is stale — the new cursor hands that offset out again, in its
//! place in stream order. Anything else is released (not run, not finished).
//!
//! # Hand-over
//! Clean (another member joined, or this one closes): the lease round marks the partition
//! *handing*; the gate starts nothing more of it and its cursor pulls nothing; once no
//! handler of it runs here (at most half a lease), its held messages are nak'd in stream
//! order and the lease is marked free. Unclean (this member died, stopped or lost the
//! server): the lease expires on the server; the new owner waits for the deliveries to
//! come back ([`partition`]).

pub(crate) mod lease;
pub(crate) mod partition;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_nats::jetstream::kv;
use tidings::durable::{BackendCursor, CursorSpec, CursorWaker, Finished, StartGate};
use tidings::{CursorState, DurableDeadLetter, Message, Pattern, StartAt, StreamError};

use super::cursor::{JsCursor, consumer_spec};
use super::{BACKEND_NAME, Shared, keyed_prefix, subject_prefix};
use crate::classify::seam;
use lease::{Leases, Rounds, Standing};
use partition::PartitionCursor;

/// A message a partition cursor handed out, until it is finished or released.
struct Tracked {
    /// Held so its address is not reused while tracked.
    _message: Arc<Message>,
    partition: u32,
    /// The lease term of the partition cursor that handed it out.
    epoch: u64,
    /// A handler attempt was admitted.
    started: bool,
}

/// What the gate and the cursor share.
struct Track {
    /// By the address of the allocation handed out.
    tracked: HashMap<usize, Tracked>,
    /// Per partition: the lease term its open cursor was opened under (0: none open).
    epochs: Vec<u64>,
}

fn address(m: &Arc<Message>) -> usize {
    Arc::as_ptr(m) as usize
}

/// The group's start gate (see the [module docs](self#the-start-gate)).
struct Gate {
    track: Arc<Mutex<Track>>,
    leases: Arc<Leases>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl StartGate for Gate {
    fn admit(&self, message: &Arc<Message>) -> bool {
        let mut track = lock(&self.track);
        let key = address(message);
        let Some(t) = track.tracked.get(&key) else {
            // Not a partition's: the unkeyed consumer's, which every member shares.
            return true;
        };
        let (p, epoch) = (t.partition, t.epoch);
        if track.epochs[p as usize] == epoch && self.leases.admits(p, epoch) {
            if let Some(t) = track.tracked.get_mut(&key) {
                t.started = true;
            }
            return true;
        }
        track.tracked.remove(&key);
        false
    }
}

/// Distinguishes the members one process runs (several brokers in one test, say).
static MEMBERS: AtomicU64 = AtomicU64::new(0);

/// What opening a partition's cursor needs, kept from the [`CursorSpec`].
struct Opening {
    name: String,
    filter: Pattern,
    start: StartAt,
    window: usize,
    waker: CursorWaker,
    patterns: Vec<Pattern>,
}

/// A keyed group's cursor (see the [module docs](self)).
pub(crate) struct GroupCursor {
    shared: Arc<Shared>,
    /// The stream's JetStream name.
    stream: String,
    opening: Opening,
    partitions: u32,
    unkeyed: JsCursor,
    leases: Arc<Leases>,
    parts: Mutex<Vec<Option<Arc<PartitionCursor>>>>,
    /// Cursors of lapsed leases, by term, until what they handed out is finished or
    /// released.
    retired: Mutex<HashMap<u64, Arc<PartitionCursor>>>,
    /// Per partition: since when it is being handed over.
    handing_since: Mutex<Vec<Option<Instant>>>,
    track: Arc<Mutex<Track>>,
    gate: Arc<Gate>,
    store: kv::Store,
    me: String,
    rounds: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// One reconcile or fetch at a time.
    step: Mutex<()>,
    closed: AtomicBool,
    rotate: AtomicUsize,
    /// The combined positions, read at most every [`POSITIONS_TTL`].
    positions: Mutex<Option<(Instant, u64, CursorState)>>,
    /// The last partition failure, shown in the state.
    error: Mutex<Option<String>>,
}

/// How long the combined positions of the group's consumers answer `state` while this
/// process changed nothing (as each consumer's own cache).
const POSITIONS_TTL: Duration = Duration::from_millis(200);

impl GroupCursor {
    /// Opens the group cursor of `spec.name` on the stream `stream` (JetStream name)
    /// with `partitions` key partitions and `replicas` replicas: its consumers, its
    /// bucket, and the lease rounds.
    pub(crate) fn open(
        shared: Arc<Shared>,
        stream: &str,
        patterns: Vec<Pattern>,
        partitions: u32,
        replicas: usize,
        spec: CursorSpec<'_>,
    ) -> Result<Self, StreamError> {
        let names = crate::names::DurableNames::new(stream, spec.name);
        let settings = shared.settings.clone();
        // Every partition's consumer exists from the start, at the subscription's start:
        // one taken later must not begin where the stream is then.
        let specs: Vec<_> = (0..partitions)
            .map(|p| partition_spec(&shared, stream, &spec, p).start(spec.start))
            .collect();
        let js = shared.js.clone();
        let bucket = names.lease_bucket();
        let lease_time = settings.ack_wait;
        let store = shared.call(shared.bound(4 + partitions), async move {
            let created = futures_util::future::join_all(specs.into_iter().map(|s| {
                let js = js.clone();
                async move { js.durable(s).await }
            }))
            .await;
            for c in created {
                c.map_err(|e| seam("opening a key partition's consumer", e))?;
            }
            lease::open_bucket(&js, &bucket, lease_time, replicas).await
        })?;
        let plain = subject_prefix(stream);
        let unkeyed_spec = consumer_spec(&settings, stream, spec.name, spec.filter)
            .namespaces_of(keyed_prefix(stream), [plain.clone()]);
        let unkeyed = JsCursor::open_as(
            Arc::clone(&shared),
            stream,
            watched(&plain, &patterns),
            patterns.clone(),
            spec.clone(),
            unkeyed_spec,
        )?;
        let me = format!(
            "{}-{:x}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
            MEMBERS.fetch_add(1, Ordering::Relaxed)
        );
        let leases = Leases::new(partitions);
        let track = Arc::new(Mutex::new(Track {
            tracked: HashMap::new(),
            epochs: vec![0; partitions as usize],
        }));
        let rounds = Rounds {
            store: store.clone(),
            leases: Arc::clone(&leases),
            me: me.clone(),
            partitions,
            lease: lease_time,
            waker: spec.waker.clone(),
        };
        // The first round before anything is fetched: a lone member holds every partition
        // from its first fetch on (a manual driver steps the feeder only when told).
        let first = shared.call(shared.bound(2 + 2 * partitions), {
            let rounds = rounds.clone();
            async move {
                rounds.round().await;
                Ok(())
            }
        });
        let task = shared.rt.spawn(rounds.run());
        first?;
        Ok(Self {
            gate: Arc::new(Gate {
                track: Arc::clone(&track),
                leases: Arc::clone(&leases),
            }),
            shared,
            stream: stream.to_owned(),
            opening: Opening {
                name: spec.name.to_owned(),
                filter: spec.filter.clone(),
                start: spec.start,
                window: spec.window,
                waker: spec.waker.clone(),
                patterns,
            },
            partitions,
            unkeyed,
            leases,
            parts: Mutex::new(vec![None; partitions as usize]),
            retired: Mutex::new(HashMap::new()),
            handing_since: Mutex::new(vec![None; partitions as usize]),
            track,
            store,
            me,
            rounds: Mutex::new(Some(task)),
            step: Mutex::new(()),
            closed: AtomicBool::new(false),
            rotate: AtomicUsize::new(0),
            positions: Mutex::new(None),
            error: Mutex::new(None),
        })
    }

    /// What wakes the stream's append path (the unkeyed consumer's watch).
    pub(crate) fn shared_state(&self) -> Arc<super::cursor::CursorShared> {
        self.unkeyed.shared_state()
    }

    fn part(&self, p: u32) -> Option<Arc<PartitionCursor>> {
        lock(&self.parts)[p as usize].clone()
    }

    /// Handlers of partition `p` admitted under its current cursor and not finished.
    fn running(&self, p: u32) -> usize {
        let track = lock(&self.track);
        let epoch = track.epochs[p as usize];
        track
            .tracked
            .values()
            .filter(|t| t.partition == p && t.epoch == epoch && t.started)
            .count()
    }

    /// Brings the partition cursors in line with the leases (under the step lock).
    fn reconcile(&self) {
        for p in 0..self.partitions {
            let (standing, term) = self.leases.standing(p);
            let mut open = self.part(p);
            let open_term = lock(&self.track).epochs[p as usize];
            if let Some(c) = open.as_ref()
                && standing == Standing::Active
                && open_term != term
            {
                // Lapsed and taken again since (a pause): what the old cursor handed out
                // is stale, and what it held is another's or back on the server.
                self.retire(p, c);
                open = None;
            }
            match (standing, open) {
                (Standing::Active, None) => {
                    lock(&self.handing_since)[p as usize] = None;
                    match self.open_partition(p, term) {
                        Ok(c) => {
                            lock(&self.track).epochs[p as usize] = term;
                            lock(&self.parts)[p as usize] = Some(Arc::new(c));
                        }
                        Err(e) => *lock(&self.error) = Some(e.to_string()),
                    }
                }
                (Standing::Handing, Some(c)) => {
                    let since =
                        *lock(&self.handing_since)[p as usize].get_or_insert_with(Instant::now);
                    let waited = since.elapsed() >= self.shared.settings.ack_wait / 2;
                    if self.running(p) == 0 || waited {
                        self.close_partition(p);
                        c.give_back();
                        self.leases.handed_back(p);
                    }
                }
                (Standing::Handing, None) => self.leases.handed_back(p),
                (Standing::None, Some(c)) => self.retire(p, &c),
                _ => {}
            }
        }
        // A retired cursor closes once nothing it handed out is left here.
        let live: std::collections::HashSet<u64> = lock(&self.track)
            .tracked
            .values()
            .map(|t| t.epoch)
            .collect();
        lock(&self.retired).retain(|term, c| {
            let keep = live.contains(term);
            if !keep {
                c.abandon();
            }
            keep
        });
    }

    /// Partition `p`'s lease lapsed: its cursor starts and pulls nothing more, but stays
    /// until what it handed out is finished or released here — a handler that succeeded
    /// just before the lapse is still acknowledged, or its message would come back to the
    /// next owner after later messages of its key ran.
    fn retire(&self, p: u32, c: &Arc<PartitionCursor>) {
        let term = lock(&self.track).epochs[p as usize];
        self.close_partition(p);
        lock(&self.retired).insert(term, Arc::clone(c));
    }

    fn close_partition(&self, p: u32) {
        lock(&self.track).epochs[p as usize] = 0;
        lock(&self.parts)[p as usize] = None;
    }

    fn open_partition(&self, p: u32, term: u64) -> Result<PartitionCursor, StreamError> {
        let o = &self.opening;
        let spec = CursorSpec::new(&o.name, &o.filter, o.start, o.window, o.waker.clone());
        let cspec = partition_spec(&self.shared, &self.stream, &spec, p);
        let prefix = format!("{}{p}.", keyed_prefix(&self.stream));
        let inner = JsCursor::open_as(
            Arc::clone(&self.shared),
            &self.stream,
            watched(&prefix, &o.patterns),
            o.patterns.clone(),
            spec,
            cspec,
        )?;
        let leases = Arc::clone(&self.leases);
        PartitionCursor::new(
            inner,
            self.shared.settings.ack_wait,
            Arc::new(move || leases.admits(p, term)),
        )
    }

    fn combined_positions(&self) -> CursorState {
        let changes = self.shared.changes();
        if let Some((at, seen, s)) = &*lock(&self.positions)
            && *seen == changes
            && at.elapsed() < POSITIONS_TTL
        {
            return s.clone();
        }
        let mut s = self.unkeyed.state();
        for p in 0..self.partitions {
            if let Some(c) = self.part(p) {
                let ps = c.state();
                s.committed = s.committed.min(ps.committed);
                s.position = s.position.min(ps.position);
                s.lag = s.lag.max(ps.lag);
                s.skipped_by_filter += ps.skipped_by_filter;
                if s.error.is_none() {
                    s.error = ps.error;
                }
            }
        }
        *lock(&self.positions) = Some((Instant::now(), changes, s.clone()));
        s
    }
}

/// The consumer of key partition `p`: `<durable>_k<p>`, filtering on the partition's
/// subjects only.
fn partition_spec(
    shared: &Shared,
    stream: &str,
    spec: &CursorSpec<'_>,
    p: u32,
) -> crate::consumer::ConsumerSpec {
    let keyed = keyed_prefix(stream);
    consumer_spec(&shared.settings, stream, spec.name, spec.filter)
        .renamed(crate::names::DurableNames::new(stream, spec.name).partition_consumer(p))
        .namespaces_of(keyed.clone(), [format!("{keyed}{p}.")])
}

/// The subjects under `prefix` a publish to which may give a cursor work.
fn watched(prefix: &str, patterns: &[Pattern]) -> Vec<String> {
    crate::subject::stream_subjects(patterns)
        .into_iter()
        .map(|s| format!("{prefix}{s}"))
        .collect()
}

impl BackendCursor for GroupCursor {
    fn fetch(&self, max: usize) -> Result<Vec<Message>, StreamError> {
        // The feeder fetches through `fetch_shared`; a plain fetch hands out copies the
        // gate cannot track, so it is for the unkeyed records only.
        self.unkeyed.fetch(max)
    }

    fn fetch_shared(&self, max: usize) -> Result<Vec<Arc<Message>>, StreamError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(StreamError::Closed);
        }
        let _step = lock(&self.step);
        self.reconcile();
        let mut out = Vec::new();
        let first = self.rotate.fetch_add(1, Ordering::Relaxed);
        for i in 0..self.partitions as usize {
            if out.len() >= max {
                break;
            }
            let p = u32::try_from((first + i) % self.partitions as usize).unwrap_or(0);
            let epoch = lock(&self.track).epochs[p as usize];
            if !self.leases.admits(p, epoch) {
                continue;
            }
            let Some(c) = self.part(p) else {
                continue;
            };
            match c.fetch(max - out.len()) {
                Ok(messages) => {
                    let mut track = lock(&self.track);
                    for m in messages {
                        let m = Arc::new(m);
                        track.tracked.insert(
                            address(&m),
                            Tracked {
                                _message: Arc::clone(&m),
                                partition: p,
                                epoch,
                                started: false,
                            },
                        );
                        out.push(m);
                    }
                }
                Err(e) => {
                    // Opened again at the next step while the lease holds.
                    *lock(&self.error) = Some(e.to_string());
                    self.retire(p, &c);
                }
            }
        }
        if out.len() < max {
            out.extend(
                self.unkeyed
                    .fetch(max - out.len())?
                    .into_iter()
                    .map(Arc::new),
            );
        }
        Ok(out)
    }

    fn start_gate(&self) -> Option<Arc<dyn StartGate>> {
        Some(Arc::clone(&self.gate) as Arc<dyn StartGate>)
    }

    fn finish(&self, done: &[Finished]) -> Result<(), StreamError> {
        // Not while a reconcile runs: a hand-over that saw these handlers done must not
        // give their messages back (nak) before they are acknowledged here.
        let _step = lock(&self.step);
        let mut by_partition: HashMap<u32, Vec<Finished>> = HashMap::new();
        let mut plain = Vec::new();
        let mut late = Vec::new();
        {
            let mut track = lock(&self.track);
            for f in done {
                match track.tracked.remove(&address(&f.message)) {
                    Some(t) if track.epochs[t.partition as usize] == t.epoch => {
                        by_partition.entry(t.partition).or_default().push(f.clone());
                    }
                    // Handed out under a lease that lapsed since: acknowledged by its retired
                    // cursor (the next owner may run it again: at-least-once).
                    Some(t) => {
                        if let Some(c) = lock(&self.retired).get(&t.epoch).cloned() {
                            late.push((c, f.clone()));
                        }
                    }
                    None => plain.push(f.clone()),
                }
            }
        }
        let mut result = Ok(());
        for (p, items) in by_partition {
            if let Some(c) = self.part(p)
                && let Err(e) = c.finish(&items)
            {
                result = Err(e);
            }
        }
        for (c, f) in late {
            if let Err(e) = c.finish(std::slice::from_ref(&f)) {
                result = Err(e);
            }
        }
        if !plain.is_empty() {
            self.unkeyed.finish(&plain)?;
        }
        if !done.is_empty() {
            // A hand-over may be waiting for the last running handler.
            self.opening.waker.wake();
        }
        result
    }

    fn idle(&self) {
        self.unkeyed.idle();
    }

    fn seek(&self, _at: StartAt) -> Result<u64, StreamError> {
        Err(StreamError::Unsupported {
            feature: "seek on a keyed consumer group (a durable subscription with per-key \
                      order, which spreads its keys over the processes sharing it)",
            backend: BACKEND_NAME,
        })
    }

    fn commit(&self) -> Result<u64, StreamError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(StreamError::Closed);
        }
        let mut committed = self.unkeyed.commit()?;
        for p in 0..self.partitions {
            if let Some(c) = self.part(p) {
                committed = committed.min(c.state().committed);
            }
        }
        Ok(committed)
    }

    fn outstanding(&self) -> usize {
        if !self.closed.load(Ordering::Acquire)
            && let Ok(_step) = self.step.try_lock()
        {
            // While its window is full the feeder asks only this: leases must still be
            // followed then (cheap when nothing changed).
            self.reconcile();
        }
        self.unkeyed.outstanding() + lock(&self.track).tracked.len()
    }

    fn state(&self) -> CursorState {
        if !self.closed.load(Ordering::Acquire)
            && let Ok(_step) = self.step.try_lock()
        {
            self.reconcile();
        }
        let mut s = self.combined_positions();
        let unkeyed = self.unkeyed.state();
        s.outstanding = unkeyed.outstanding + lock(&self.track).tracked.len();
        if s.error.is_none() {
            s.error.clone_from(&lock(&self.error));
        }
        s
    }

    fn dead_letters(&self) -> Result<Vec<DurableDeadLetter>, StreamError> {
        self.unkeyed.dead_letters()
    }

    fn drain_dead_letters(&self) -> Result<Vec<DurableDeadLetter>, StreamError> {
        self.unkeyed.drain_dead_letters()
    }

    fn redrive_dead_letters(
        &self,
        select: &mut dyn FnMut(&DurableDeadLetter) -> bool,
    ) -> Result<usize, StreamError> {
        self.unkeyed.redrive_dead_letters(select)
    }

    fn close(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Some(task) = lock(&self.rounds).take() {
            task.abort();
        }
        let _step = lock(&self.step);
        for p in 0..self.partitions {
            if let Some(c) = self.part(p) {
                let valid = self.leases.standing(p).0 != Standing::None;
                self.close_partition(p);
                if valid {
                    c.give_back();
                } else {
                    c.abandon();
                }
            }
        }
        for (_, c) in lock(&self.retired).drain() {
            c.abandon();
        }
        self.unkeyed.close();
        let held = self.leases.held();
        self.leases.clear();
        let (store, me) = (self.store.clone(), self.me.clone());
        let _ = self.shared.call(self.shared.bound(2), async move {
            lease::leave(&store, &me, &held).await;
            Ok(())
        });
        lock(&self.track).tracked.clear();
    }
}

impl Drop for GroupCursor {
    fn drop(&mut self) {
        self.close();
    }
}
