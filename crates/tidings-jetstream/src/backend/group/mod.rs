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
//! # One machine, one shell
//! Every decision — leases, hand-over, admission, gathering, where a finish is
//! acknowledged — is the member's sans-IO state machine's ([`machine`]), checked by a
//! deterministic simulation ([`sim`], 10,000 seeds per test run). This file and
//! [`lease`] are the shell: they carry the machine's actions to the server and bring back
//! what happened, and hold no lock across a network call.
//!
//! # The start gate
//! The subscription asks [`StartGate::admit`] before every handler attempt; the machine
//! answers, fail-closed: only a delivery it handed out (the very allocation,
//! [`BackendCursor::fetch_shared`]), of a partition held, active and valid now under the
//! delivery's term — or of the unkeyed consumer — is admitted. Anything else is released
//! (not run, not finished). Every partition delivery carries its [`Fence`] (partition and
//! term, [`Message::fence`]).
//!
//! # Locks
//! `state` (the machine and the allocations it tracks) and `cursors` are each taken alone,
//! never one inside the other and never across a network call; the subscription's lock
//! may be held when the gate takes `state`.

pub(crate) mod lease;
pub(crate) mod machine;
pub(crate) mod partition;
mod rendezvous;
#[cfg(test)]
mod sim;
mod state;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_nats::jetstream::kv;
use tidings::durable::{BackendCursor, CursorSpec, CursorWaker, Finished, StartGate};
use tidings::{CursorState, DurableDeadLetter, Fence, Message, Pattern, StartAt, StreamError};

use super::cursor::{Hold, JsCursor, Role, consumer_spec};
use super::shared::Shared;
use crate::classify::seam;
use crate::names::{BACKEND_NAME, DurableNames, keyed_prefix, subject_prefix};
use lease::Rounds;
use machine::{Action, DeliveryId, Machine, Now, Route, Source};
use partition::PartitionCursor;
use state::{State, lock};

fn address(m: &Arc<Message>) -> DeliveryId {
    Arc::as_ptr(m) as usize
}

/// The group's start gate (see the [module docs](self#the-start-gate)).
struct Gate {
    state: Arc<Mutex<State>>,
}

impl StartGate for Gate {
    fn admit(&self, message: &Arc<Message>) -> bool {
        let id = address(message);
        let mut state = lock(&self.state);
        let admitted = state.machine.admit(id, Now::read());
        if !admitted {
            state.held.remove(&id);
        }
        admitted
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
    state: Arc<Mutex<State>>,
    /// The partition cursors by term: open, and retired until what they handed out is
    /// finished here.
    cursors: Mutex<HashMap<u64, Arc<PartitionCursor>>>,
    gate: Arc<Gate>,
    store: kv::Store,
    me: String,
    rounds: Mutex<Option<tokio::task::JoinHandle<()>>>,
    closed: AtomicBool,
    rotate: AtomicUsize,
    /// The last partition failure, shown in the state.
    error: Mutex<Option<String>>,
}

/// How many partitions one reconcile opens at once (one thread each, for their round trips).
const OPENS_AT_ONCE: usize = 8;

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
        let names = DurableNames::new(stream, spec.name);
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
            // Ensured here, once: the partitions' cursors share it.
            Role::Own,
        )?;
        let me = format!(
            "{}-{:x}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
            MEMBERS.fetch_add(1, Ordering::Relaxed)
        );
        let state = Arc::new(Mutex::new(State {
            machine: Machine::new(me.clone(), partitions, lease_time),
            held: HashMap::new(),
        }));
        let rounds = Rounds {
            js: shared.js.clone(),
            store: store.clone(),
            state: Arc::clone(&state),
            me: me.clone(),
            lease: lease_time,
            waker: spec.waker.clone(),
        };
        // The first round before anything is fetched: a lone member holds every partition
        // from its first fetch on (a manual driver steps the feeder only when told). Only
        // once it answered does the round task start: a member whose first round failed
        // is not left renewing leases nobody pulls.
        shared.call(shared.bound(2 + 2 * partitions), {
            let rounds = rounds.clone();
            async move {
                rounds.round().await;
                Ok(())
            }
        })?;
        let task = shared.rt.spawn(rounds.run());
        let cursor = Self {
            gate: Arc::new(Gate {
                state: Arc::clone(&state),
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
            state,
            cursors: Mutex::new(HashMap::new()),
            store,
            me,
            rounds: Mutex::new(Some(task)),
            closed: AtomicBool::new(false),
            rotate: AtomicUsize::new(0),
            error: Mutex::new(None),
        };
        // The partitions the first round took are opened now: the position a subscriber
        // reads right after subscribing (a manual driver has not stepped yet) covers them.
        cursor.reconcile();
        Ok(cursor)
    }

    /// What wakes the stream's append path (the unkeyed consumer's watch).
    pub(crate) fn shared_state(&self) -> Arc<super::cursor_state::CursorShared> {
        self.unkeyed.shared_state()
    }

    /// Brings the partition cursors in line with the machine.
    fn reconcile(&self) {
        let actions = lock(&self.state).machine.reconcile(Now::read());
        // Every retirement, give-back and abandonment first, in the machine's order: a
        // partition's old cursor is quiet before its next one reads what is unfinished.
        let (opens, rest): (Vec<Action>, Vec<Action>) = actions
            .into_iter()
            .partition(|a| matches!(a, Action::Open { .. }));
        for action in rest {
            self.apply(action);
        }
        // Then the opens, of distinct partitions, side by side: each is three round trips
        // (look up or create the partition's consumer, read what is unfinished), and a
        // member taking all 16 partitions one after the other spent most of a keyed
        // group's start-up waiting on them (`tidings-bench keyed-group/no-op`).
        if opens.len() <= 1 {
            opens.into_iter().for_each(|a| self.apply(a));
            return;
        }
        // A few threads take opens from one queue until it is empty; this thread too, so
        // every open happens even when no thread can be started.
        let queue = Mutex::new(opens);
        let work = || {
            loop {
                let next = lock(&queue).pop();
                let Some(action) = next else { break };
                self.apply(action);
            }
        };
        std::thread::scope(|scope| {
            for _ in 1..lock(&queue).len().min(OPENS_AT_ONCE) {
                let spawned = std::thread::Builder::new()
                    .name("tidings-open".into())
                    .spawn_scoped(scope, work);
                if spawned.is_err() {
                    break;
                }
            }
            work();
        });
    }

    fn apply(&self, action: Action) {
        match action {
            Action::Open { p, term } => self.open_partition(p, term),
            Action::GiveBack { term, .. } => {
                let cursor = lock(&self.cursors).remove(&term);
                if let Some(c) = cursor {
                    c.give_back();
                }
            }
            // Its closures stop its pulls and keep-alives; it stays to acknowledge. A pull in
            // flight is waited out first: the partition's next cursor (this reconcile may
            // open it next) must see in its reading of what is unfinished every delivery
            // this one will ever get.
            Action::Retire { term, .. } => {
                let cursor = lock(&self.cursors).get(&term).cloned();
                if let Some(c) = cursor {
                    c.retire();
                }
            }
            Action::Abandon { term } => {
                let cursor = lock(&self.cursors).remove(&term);
                if let Some(c) = cursor {
                    c.abandon();
                }
            }
        }
    }

    fn failed(&self, what: impl std::fmt::Display) {
        *lock(&self.error) = Some(what.to_string());
    }

    fn open_partition(&self, p: u32, term: u64) {
        let o = &self.opening;
        let spec = CursorSpec::new(&o.name, &o.filter, o.start, o.window, o.waker.clone());
        let cspec = partition_spec(&self.shared, &self.stream, &spec, p);
        let prefix = format!("{}{p}.", keyed_prefix(&self.stream));
        let (pulls, keeps) = (Arc::clone(&self.state), Arc::clone(&self.state));
        let hold = Hold {
            admits: Arc::new(move || lock(&pulls).machine.may_pull(p, Now::read()) == Some(term)),
            keeps: Arc::new(move || lock(&keeps).machine.keeps_alive(p, term, Now::read())),
        };
        let opened = JsCursor::open_as(
            Arc::clone(&self.shared),
            &self.stream,
            watched(&prefix, &o.patterns),
            o.patterns.clone(),
            spec,
            cspec,
            Role::Partition(hold),
        );
        let inner = match opened {
            Ok(inner) => inner,
            Err(e) => {
                self.failed(e);
                lock(&self.state).machine.open_failed(p, term);
                return;
            }
        };
        let cursor = PartitionCursor::new(inner);
        let unfinished = cursor.unfinished();
        {
            let mut cursors = lock(&self.cursors);
            // `close` sets the flag, then drains the map: one of the two sees the other.
            if self.closed.load(Ordering::Acquire) {
                drop(cursors);
                cursor.abandon();
                return;
            }
            cursors.insert(term, Arc::new(cursor));
        }
        lock(&self.state)
            .machine
            .opened(p, term, unfinished, Now::read());
    }

    /// Hands out up to `max` of partition `p`'s messages, if the machine lets it.
    fn fetch_partition(&self, p: u32, max: usize, out: &mut Vec<Arc<Message>>) {
        let Some(term) = lock(&self.state).machine.may_pull(p, Now::read()) else {
            return;
        };
        let Some(c) = lock(&self.cursors).get(&term).cloned() else {
            return;
        };
        let (elsewhere, fresh, pulled) = c.strays();
        let may = {
            let mut state = lock(&self.state);
            if fresh {
                state.machine.strayed(p, term, Now::read());
            }
            state
                .machine
                .may_hand_out(p, term, elsewhere, pulled, Now::read())
        };
        if !may || (c.gathering() && !c.end_gathering()) {
            // Gathering: nudges the standing pull, hands out nothing.
            let _ = c.fetch(max);
            return;
        }
        match c.fetch(max) {
            Ok(messages) => {
                let fence = Fence::new(p, term);
                let mut state = lock(&self.state);
                for mut m in messages {
                    tidings::durable::set_fence(&mut m, fence);
                    let m = Arc::new(m);
                    let id = address(&m);
                    state.machine.handed_out(id, Source::Partition(fence));
                    state.held.insert(id, Arc::clone(&m));
                    out.push(m);
                }
            }
            Err(e) => {
                // A fresh cursor under a new term at the next round.
                self.failed(e);
                lock(&self.state).machine.relinquish(p);
            }
        }
    }

    /// The open partition cursors.
    fn open_cursors(&self) -> Vec<Arc<PartitionCursor>> {
        let open = lock(&self.state).machine.open_cursors();
        let cursors = lock(&self.cursors);
        open.iter()
            .filter_map(|(_, term)| cursors.get(term).cloned())
            .collect()
    }

    /// The positions of every consumer this member reads, combined: each from its
    /// cursor's snapshot, so without a round trip (see `positions`).
    fn combined_positions(&self) -> CursorState {
        let mut s = self.unkeyed.state();
        for c in self.open_cursors() {
            let ps = c.state();
            s.committed = s.committed.min(ps.committed);
            s.position = s.position.min(ps.position);
            s.lag = s.lag.max(ps.lag);
            s.skipped_by_filter += ps.skipped_by_filter;
            if s.error.is_none() {
                s.error = ps.error;
            }
        }
        s
    }

    fn outstanding_keyed(&self) -> usize {
        lock(&self.state).machine.outstanding_keyed()
    }
}

/// The consumer of key partition `p`: `<durable>_k<p>`, filtering on the partition's
/// subjects only.
fn partition_spec(
    shared: &Shared,
    stream: &str,
    spec: &CursorSpec<'_>,
    p: u32,
) -> crate::client::consumer::ConsumerSpec {
    let keyed = keyed_prefix(stream);
    consumer_spec(&shared.settings, stream, spec.name, spec.filter)
        .renamed(DurableNames::new(stream, spec.name).partition_consumer(p))
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
        self.reconcile();
        let mut out = Vec::new();
        let first = self.rotate.fetch_add(1, Ordering::Relaxed);
        for i in 0..self.partitions as usize {
            if out.len() >= max {
                break;
            }
            let p = u32::try_from((first + i) % self.partitions as usize).unwrap_or(0);
            self.fetch_partition(p, max - out.len(), &mut out);
        }
        if out.len() < max {
            let unkeyed = self.unkeyed.fetch(max - out.len())?;
            let mut state = lock(&self.state);
            for m in unkeyed {
                let m = Arc::new(m);
                let id = address(&m);
                state.machine.handed_out(id, Source::Unkeyed);
                state.held.insert(id, Arc::clone(&m));
                out.push(m);
            }
        }
        Ok(out)
    }

    fn start_gate(&self) -> Option<Arc<dyn StartGate>> {
        Some(Arc::clone(&self.gate) as Arc<dyn StartGate>)
    }

    fn finish(&self, done: &[Finished]) -> Result<(), StreamError> {
        let mut by_term: HashMap<u64, Vec<Finished>> = HashMap::new();
        let mut plain = Vec::new();
        {
            let state = lock(&self.state);
            for f in done {
                match state.machine.route(address(&f.message)) {
                    Route::Unkeyed => plain.push(f.clone()),
                    Route::Cursor(term) => by_term.entry(term).or_default().push(f.clone()),
                    // Closed meanwhile: comes back after the ack wait (at-least-once).
                    Route::Nowhere => {}
                }
            }
        }
        // Acknowledged first, then reported finished to the machine: until then the
        // delivery counts as running and no hand-over gives it back (see
        // `Machine::route`). No lock is held meanwhile.
        let mut result = Ok(());
        for (term, items) in by_term {
            let cursor = lock(&self.cursors).get(&term).cloned();
            if let Some(c) = cursor
                && let Err(e) = c.finish(&items)
            {
                result = Err(e);
            }
        }
        if !plain.is_empty()
            && let Err(e) = self.unkeyed.finish(&plain)
        {
            result = Err(e);
        }
        {
            let mut state = lock(&self.state);
            for f in done {
                let id = address(&f.message);
                state.machine.finished(id);
                state.held.remove(&id);
            }
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
        for c in self.open_cursors() {
            committed = committed.min(c.state().committed);
        }
        Ok(committed)
    }

    fn refresh(&self) {
        self.unkeyed.refresh();
        for c in self.open_cursors() {
            c.refresh();
        }
    }

    fn outstanding(&self) -> usize {
        // Local, as the seam promises: no reconcile, no I/O.
        self.unkeyed.outstanding() + self.outstanding_keyed()
    }

    fn state(&self) -> CursorState {
        let mut s = self.combined_positions();
        s.outstanding = self.outstanding();
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
        let (actions, held) = {
            let mut state = lock(&self.state);
            state.held.clear();
            state.machine.close(Now::read())
        };
        for action in actions {
            self.apply(action);
        }
        let rest: Vec<_> = lock(&self.cursors).drain().map(|(_, c)| c).collect();
        for c in rest {
            c.abandon();
        }
        self.unkeyed.close();
        let (store, me) = (self.store.clone(), self.me.clone());
        let _ = self.shared.call(self.shared.bound(2), async move {
            lease::leave(&store, &me, &held).await;
            Ok(())
        });
    }
}

impl Drop for GroupCursor {
    fn drop(&mut self) {
        self.close();
    }
}
