//! The keyed group's member as a sans-IO state machine (R-DIST-6, R-DIST-8): every decision
//! of one member — which partitions it holds, when it may pull, start, hand over, give back
//! or retire, and where a finished delivery is acknowledged — and none of its I/O.
//!
//! # Inputs and outputs
//! The shell ([`super::GroupCursor`] and the lease round task) feeds it what happened:
//! the live members and the answers of lease writes ([`Machine::plan`],
//! [`Machine::lease_answer`]), deliveries handed out ([`Machine::handed_out`]), handler
//! starts ([`Machine::admit`]) and finishes ([`Machine::finished`]), and `now` on both
//! clocks. It answers with lease writes ([`LeaseOp`]), cursor actions ([`Action`]) and
//! decisions. It never waits and never does I/O, so one seed drives it through a simulated
//! JetStream and simulated members ([`super::sim`]) on virtual time.
//!
//! # States of one partition
//! ```text
//!            take ok                 lost / lapsed / closed
//!   Free ────────────▶ Active ──────────────────────────────▶ Free (cursor retired)
//!     ▲                 │
//!     │     wanted      ▼
//!     │   elsewhere   Handing ── no handler of it runs here ──▶ HandedBack ── freed ──▶ Free
//!     │                                   (cursor gives back: nak)
//!     └──────────────────────────── lost / lapsed ───────────────────────────────┘
//! ```
//! A member frozen (SIGSTOP, a paused VM) past its lease's validity finds it lapsed on
//! the first reading of either clock after it resumes, before it starts anything: it takes
//! the partition again by a compare-and-set on the server, under a new term (its term is
//! confirmed by the server, or another member has it), and what its old cursor held comes
//! back through the server, in order. A freeze that ends within the validity needs no
//! confirmation: the server cannot have given the partition away yet.
//!
//! # Fencing (R-DIST-8)
//! - A partition's **term** is the bucket revision of the write that took it: assigned by the
//!   server, greater for every later owner. Every delivery carries its partition and term
//!   ([`tidings::Fence`]), so an effect store can refuse a stale owner.
//! - **Admission is fail-closed.** A start is admitted only for a delivery this machine
//!   handed out, whose term is the partition's current term, while the partition is held,
//!   `Active`, its cursor open under that term, and its lease valid *now* on both clocks.
//!   Anything else — unknown, stale, lapsed, handing — is released. (A gathering cursor
//!   hands nothing out, so nothing of a gathering term reaches the gate but what was
//!   handed out before deliveries were found out elsewhere — which precede them.)
//! - **Validity.** A lease written by a request sent at `t` is valid here until
//!   `t + lease − lease/10` on the monotonic clock *and* on the wall clock: the server
//!   cannot expire the entry before `t + lease`, so this member stops starting a tenth of a
//!   lease before another could take the partition. The wall clock catches a freeze that
//!   stops the monotonic one (a paused VM whose clock is stepped on resume).
//! - **A clean hand-over never gives a partition away while a handler of it runs here.**
//!   `Handing` starts and pulls nothing, keeps renewing the lease and keeping the running
//!   deliveries alive, and gives back (nak) only once none runs — however long that takes.
//!   The member that wants the partition waits. (Before: after half an ack wait the
//!   partition was handed back under a running handler, whose late finish was dropped, and
//!   the new owner ran the same key at the same time.)
//! - **Unclean loss** (lease lost or lapsed: a pause, a partition, a dead server): the
//!   cursor is *retired* — it pulls, keeps alive and starts nothing more, and stays only
//!   to acknowledge handlers that were already running when they succeed (a true success
//!   is not redone needlessly). The new owner waits for the old owner's deliveries to come
//!   back before it hands anything out ([`Gather`]) — those unfinished at its open, and
//!   those a late pull of the old owner took after it ([`strays`](super::super::strays)).
//!
//! # Bounds
//! A key moves within `1.25 × lease` of its owner's death or cut; a clean hand-over waits
//! for the longest running handler of the partition; a taken partition hands nothing out
//! for at most `lease + GATHER_SLACK` while the last owner's deliveries come back — plus,
//! when some never came back, one pull and one reading of the server's delivery count
//! after that bound (see [`Machine::may_hand_out`]); a stray found later (a late pull)
//! restarts the wait from its discovery.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant, SystemTime};

use tidings::Fence;

#[cfg(test)]
use super::super::puller::room;
use super::rendezvous::rendezvous;

/// Beyond the lease (the ack wait), how long a new owner waits for the last owner's
/// deliveries.
pub(crate) const GATHER_SLACK: Duration = Duration::from_secs(2);

/// Both clocks, read at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Now {
    pub(crate) mono: Instant,
    pub(crate) wall: SystemTime,
}

impl Now {
    /// The clocks now.
    pub(crate) fn read() -> Self {
        Self {
            mono: Instant::now(),
            wall: SystemTime::now(),
        }
    }
}

/// A delivery handed out, by the identity of its allocation (the shell's choice).
pub(crate) type DeliveryId = usize;

/// Where a delivery came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// The unkeyed consumer, which every member pulls.
    Unkeyed,
    /// Partition `p`'s cursor, opened under `term`.
    Partition(Fence),
}

#[derive(Debug, Clone, Copy)]
struct Tracked {
    source: Source,
    /// A handler attempt was admitted and has not finished.
    started: bool,
}

/// What a held partition may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Pull and start.
    Active,
    /// Wanted by another member: start and pull nothing, wait for the running handlers.
    Handing,
    /// Given back: the next round frees the lease.
    HandedBack,
}

/// Waiting for deliveries out elsewhere to come back: the last owner's unfinished ones
/// after a take, or ones a late pull of another process took since ([`strays`](super::super::strays)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Gather {
    /// When to stop waiting.
    pub(crate) until: Instant,
}

#[derive(Debug, Clone, Copy)]
struct Held {
    /// The revision of the write that took it: the fencing term.
    term: u64,
    /// The entry's latest revision, for the next compare-and-set.
    revision: u64,
    valid_mono: Instant,
    valid_wall: SystemTime,
    phase: Phase,
    gather: Option<Gather>,
}

impl Held {
    fn valid(&self, now: Now) -> bool {
        now.mono < self.valid_mono && now.wall < self.valid_wall
    }
}

/// A lease write the round must make (then report with [`Machine::lease_answer`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseOp {
    /// Renew a held lease by compare-and-set on `revision`.
    Renew { p: u32, revision: u64 },
    /// Take partition `p` if nobody holds it (absent, expired, freed, or this member's).
    Take { p: u32 },
    /// Mark a given-back partition free, by compare-and-set on `revision`.
    Free { p: u32, revision: u64 },
}

/// What the server answered to a [`LeaseOp`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseAnswer {
    /// Written; the entry's new revision.
    Written(u64),
    /// Another member holds it (a failed compare-and-set, or taken).
    Lost,
    /// No answer (server away, timeout): nothing is known.
    Unanswered,
}

/// What the shell must do to a partition's cursor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// Open partition `p`'s cursor under `term`, then report [`Machine::opened`] or
    /// [`Machine::open_failed`].
    Open { p: u32, term: u64 },
    /// Hand-over done here: give what the cursor holds back to the server at once (nak),
    /// close it.
    GiveBack { p: u32, term: u64 },
    /// The lease is gone: the cursor pulls, keeps alive and starts nothing more, and stays
    /// to acknowledge what was running.
    Retire { p: u32, term: u64 },
    /// A retired cursor with nothing left running: close it without telling the server
    /// anything (its deliveries come back after the ack wait).
    Abandon { term: u64 },
}

/// Where a finished delivery is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// The unkeyed consumer.
    Unkeyed,
    /// The partition cursor opened under this term (open or retired).
    Cursor(u64),
    /// Nowhere: the machine does not know it (closed, or never handed out).
    Nowhere,
}

/// One member's state (see the [module docs](self)).
#[derive(Debug)]
pub(crate) struct Machine {
    me: String,
    lease: Duration,
    parts: Vec<Option<Held>>,
    /// Per partition: the term its cursor is open under.
    open: Vec<Option<u64>>,
    /// Terms of retired cursors.
    retired: BTreeSet<u64>,
    tracked: HashMap<DeliveryId, Tracked>,
    closed: bool,
}

impl Machine {
    /// Member `me` of a group of `partitions` partitions whose leases last `lease`.
    pub(crate) fn new(me: impl Into<String>, partitions: u32, lease: Duration) -> Self {
        Self {
            me: me.into(),
            lease,
            parts: vec![None; partitions as usize],
            open: vec![None; partitions as usize],
            retired: BTreeSet::new(),
            tracked: HashMap::new(),
            closed: false,
        }
    }

    /// This member's name.
    #[cfg(test)]
    pub(crate) fn me(&self) -> &str {
        &self.me
    }

    /// How many partitions the group has.
    pub(crate) fn partitions(&self) -> u32 {
        u32::try_from(self.parts.len()).unwrap_or(u32::MAX)
    }

    /// Drops the leases no longer valid at `now`. Called by every input that changes
    /// state.
    fn tick(&mut self, now: Now) {
        for h in &mut self.parts {
            if h.is_some_and(|h| !h.valid(now)) {
                *h = None;
            }
        }
    }

    /// The lease writes of one round, given the live members (this one included or not).
    /// Marks partitions wanted elsewhere as handing over.
    pub(crate) fn plan(&mut self, members: &[String], now: Now) -> Vec<LeaseOp> {
        self.tick(now);
        if self.closed {
            return Vec::new();
        }
        let mut members = members.to_vec();
        if !members.contains(&self.me) {
            members.push(self.me.clone());
        }
        let mut ops = Vec::new();
        for p in 0..self.partitions() {
            let wanted = rendezvous(&members, p) == Some(self.me.as_str());
            match &mut self.parts[p as usize] {
                Some(h) if h.phase == Phase::HandedBack => ops.push(LeaseOp::Free {
                    p,
                    revision: h.revision,
                }),
                Some(h) => {
                    // Never back from handing to active, even when wanted here again: the
                    // gate released what reached it meanwhile, which only the give-back
                    // returns to the server; the partition is taken again afterwards.
                    if !wanted && h.phase == Phase::Active {
                        h.phase = Phase::Handing;
                    }
                    ops.push(LeaseOp::Renew {
                        p,
                        revision: h.revision,
                    });
                }
                None if wanted => ops.push(LeaseOp::Take { p }),
                None => {}
            }
        }
        ops
    }

    /// The server's answer to `op`, whose request was sent at `sent`.
    pub(crate) fn lease_answer(&mut self, op: LeaseOp, sent: Now, answer: LeaseAnswer, now: Now) {
        self.tick(now);
        let valid_mono = sent.mono + self.lease - self.lease / 10;
        let valid_wall = sent.wall + self.lease - self.lease / 10;
        match (op, answer) {
            (_, LeaseAnswer::Unanswered) => {}
            (LeaseOp::Free { p, .. }, _) => self.parts[p as usize] = None,
            (LeaseOp::Renew { p, revision }, LeaseAnswer::Written(new)) => {
                if let Some(h) = &mut self.parts[p as usize]
                    && h.revision == revision
                {
                    h.revision = new;
                    h.valid_mono = valid_mono;
                    h.valid_wall = valid_wall;
                }
            }
            (LeaseOp::Renew { p, revision }, LeaseAnswer::Lost) => {
                if self.parts[p as usize].is_some_and(|h| h.revision == revision) {
                    self.parts[p as usize] = None;
                }
            }
            (LeaseOp::Take { p }, LeaseAnswer::Written(revision)) => {
                if self.closed {
                    return;
                }
                self.parts[p as usize] = Some(Held {
                    term: revision,
                    revision,
                    valid_mono,
                    valid_wall,
                    phase: Phase::Active,
                    gather: None,
                });
            }
            (LeaseOp::Take { .. }, LeaseAnswer::Lost) => {}
        }
        // A stale answer (sent long ago) may already be invalid.
        self.tick(now);
    }

    /// The cursor actions that bring the open cursors in line with the leases.
    pub(crate) fn reconcile(&mut self, now: Now) -> Vec<Action> {
        self.tick(now);
        let mut actions = Vec::new();
        for p in 0..self.partitions() {
            let i = p as usize;
            let held = self.parts[i];
            if let Some(open) = self.open[i]
                && held.is_none_or(|h| h.term != open)
            {
                self.open[i] = None;
                self.retired.insert(open);
                actions.push(Action::Retire { p, term: open });
            }
            let Some(h) = held else { continue };
            match (h.phase, self.open[i]) {
                (Phase::Active, None) if !self.closed => {
                    self.open[i] = Some(h.term);
                    actions.push(Action::Open { p, term: h.term });
                }
                (Phase::Handing, Some(term)) if self.running(p) == 0 => {
                    self.open[i] = None;
                    self.set_phase(p, Phase::HandedBack);
                    actions.push(Action::GiveBack { p, term });
                }
                (Phase::Handing, None) if self.running(p) == 0 => {
                    self.set_phase(p, Phase::HandedBack);
                }
                _ => {}
            }
        }
        if self.retired.is_empty() {
            return actions;
        }
        let live: BTreeSet<u64> = self
            .tracked
            .values()
            .filter_map(|t| match t.source {
                Source::Partition(f) if t.started => Some(f.term()),
                _ => None,
            })
            .collect();
        let done: Vec<u64> = self.retired.difference(&live).copied().collect();
        for term in done {
            self.retired.remove(&term);
            actions.push(Action::Abandon { term });
        }
        actions
    }

    fn set_phase(&mut self, p: u32, phase: Phase) {
        if let Some(h) = &mut self.parts[p as usize] {
            h.phase = phase;
        }
    }

    /// Partition `p`'s cursor opened under `term`, with `unfinished` deliveries of the
    /// last owner out.
    pub(crate) fn opened(&mut self, p: u32, term: u64, unfinished: usize, now: Now) {
        if self.open[p as usize] != Some(term) {
            return;
        }
        if unfinished > 0 {
            self.strayed(p, term, now);
        }
    }

    /// Partition `p`'s cursor of `term` found deliveries out elsewhere (the last owner's
    /// at the open, or a late pull's since): it hands nothing out until they are back or
    /// `lease + GATHER_SLACK` from now passed — by then the server has delivered again
    /// whatever another process took and let lapse.
    pub(crate) fn strayed(&mut self, p: u32, term: u64, now: Now) {
        if let Some(h) = &mut self.parts[p as usize]
            && h.term == term
            && self.open[p as usize] == Some(term)
        {
            h.gather = Some(Gather {
                until: now.mono + self.lease + GATHER_SLACK,
            });
        }
    }

    /// Partition `p`'s cursor could not be opened: tried again at the next reconcile.
    pub(crate) fn open_failed(&mut self, p: u32, term: u64) {
        if self.open[p as usize] == Some(term) {
            self.open[p as usize] = None;
        }
    }

    /// Whether the shell may pull partition `p` now, and under which term.
    pub(crate) fn may_pull(&self, p: u32, now: Now) -> Option<u64> {
        let h = self.parts[p as usize]?;
        let ok = h.phase == Phase::Active
            && h.valid(now)
            && self.open[p as usize] == Some(h.term)
            && !self.closed;
        ok.then_some(h.term)
    }

    /// Whether partition `p`'s cursor of `term` keeps its deliveries alive now: while the
    /// lease is held and valid, also while handing over (running handlers finish here).
    pub(crate) fn keeps_alive(&self, p: u32, term: u64, now: Now) -> bool {
        self.parts[p as usize].is_some_and(|h| h.term == term && h.valid(now))
    }

    /// Whether partition `p`'s cursor of `term` may hand out what it buffered, given how
    /// many deliveries are still out elsewhere (`out`, see
    /// [`strays`](super::super::strays)) and when the cursor's last answered pull was sent
    /// (`pulled`, counted only once a reading of the server's delivery count sent after
    /// it showed nothing more out). Ends the gathering when none is out, or when the
    /// wait's bound passed *and* such a pull was sent after it: by the bound the server
    /// has made ready again whatever another process took and let lapse, only a pull sent
    /// after it can have brought it, and the count after that pull shows that no late pull
    /// took it again. A member that could not pull meanwhile (cut off) keeps waiting.
    /// (Seeds 12014 and 24515 of the simulation handed out a key's next message while
    /// the one before was ready on the server and the member cut off, or taken a second
    /// time by the old owner's late pull.)
    pub(crate) fn may_hand_out(
        &mut self,
        p: u32,
        term: u64,
        out: usize,
        pulled: Option<Instant>,
        now: Now,
    ) -> bool {
        if self.may_pull(p, now) != Some(term) {
            return false;
        }
        let Some(h) = &mut self.parts[p as usize] else {
            return false;
        };
        match h.gather {
            Some(g) if out > 0 && (now.mono < g.until || pulled.is_none_or(|t| t < g.until)) => {
                false
            }
            _ => {
                h.gather = None;
                true
            }
        }
    }

    /// How many messages partition `p`'s cursor of `term` may pull now, with `held`
    /// pulled and not finished, in a window of `window` ([`room`]).
    #[cfg(test)]
    pub(crate) fn pull_room(
        &self,
        p: u32,
        term: u64,
        held: usize,
        window: usize,
        now: Now,
    ) -> usize {
        if self.may_pull(p, now) != Some(term) {
            return 0;
        }
        room(self.gathering(p).is_some(), window, held)
    }

    /// The gathering of partition `p`, if it waits.
    #[cfg(test)]
    pub(crate) fn gathering(&self, p: u32) -> Option<Gather> {
        self.parts[p as usize].and_then(|h| h.gather)
    }

    /// Delivery `id` was handed out to the subscription from `source`: tracked until it is
    /// finished or released, and admitted only as [`Machine::admit`] says.
    pub(crate) fn handed_out(&mut self, id: DeliveryId, source: Source) {
        self.tracked.insert(
            id,
            Tracked {
                source,
                started: false,
            },
        );
    }

    /// The start gate: whether a handler attempt of delivery `id` may start now
    /// (fail-closed, see the [module docs](self#fencing-r-dist-8)). A refused delivery is
    /// forgotten (released: it is not finished, its cursor hands it out again).
    pub(crate) fn admit(&mut self, id: DeliveryId, now: Now) -> bool {
        let admitted = match self.tracked.get(&id).map(|t| t.source) {
            None => false,
            Some(Source::Unkeyed) => !self.closed,
            // Not refused while gathering: what was handed out before deliveries were
            // found out elsewhere precedes them in the stream (see `backend::strays`), and a
            // release here would leave it held by this cursor, never handed out again.
            Some(Source::Partition(f)) => self.may_pull(f.partition(), now) == Some(f.term()),
        };
        if admitted {
            if let Some(t) = self.tracked.get_mut(&id) {
                t.started = true;
            }
        } else {
            self.tracked.remove(&id);
        }
        admitted
    }

    /// Where delivery `id` is acknowledged when it finishes. The shell acknowledges
    /// there first and only then reports [`Machine::finished`]: until then the delivery
    /// counts as running, so no hand-over gives it back (nak) before its acknowledgement
    /// is on its way — with no lock held across the acknowledgement.
    pub(crate) fn route(&self, id: DeliveryId) -> Route {
        match self.tracked.get(&id).map(|t| t.source) {
            None => Route::Nowhere,
            Some(Source::Unkeyed) => Route::Unkeyed,
            Some(Source::Partition(f)) => {
                if self.open[f.partition() as usize] == Some(f.term())
                    || self.retired.contains(&f.term())
                {
                    Route::Cursor(f.term())
                } else {
                    Route::Nowhere
                }
            }
        }
    }

    /// Delivery `id` finished for good (acknowledged at its [`route`](Self::route)).
    pub(crate) fn finished(&mut self, id: DeliveryId) {
        self.tracked.remove(&id);
    }

    /// Drops partition `p`'s lease here, as if it lapsed (its cursor failed): the cursor
    /// retires, and the next round takes the partition again under a new term with a
    /// fresh cursor.
    pub(crate) fn relinquish(&mut self, p: u32) {
        self.parts[p as usize] = None;
    }

    /// The open partition cursors, as (partition, term).
    pub(crate) fn open_cursors(&self) -> Vec<(u32, u64)> {
        self.open
            .iter()
            .enumerate()
            .filter_map(|(p, t)| t.map(|t| (u32::try_from(p).unwrap_or(0), t)))
            .collect()
    }

    /// Handlers of partition `p` admitted here and not finished, under any term: one
    /// admitted under a lease this member lost and took again still runs here, and a
    /// clean hand-over waits for it too.
    pub(crate) fn running(&self, p: u32) -> usize {
        self.tracked
            .values()
            .filter(|t| t.started && matches!(t.source, Source::Partition(f) if f.partition() == p))
            .count()
    }

    /// Partition deliveries handed out and not finished or released.
    pub(crate) fn outstanding_keyed(&self) -> usize {
        self.tracked
            .values()
            .filter(|t| matches!(t.source, Source::Partition(_)))
            .count()
    }

    /// Closing: no more takes, opens or starts; what each open cursor must do (give back
    /// while the lease is valid, else abandon), and the leases to free.
    pub(crate) fn close(&mut self, now: Now) -> (Vec<Action>, Vec<(u32, u64)>) {
        self.tick(now);
        self.closed = true;
        let mut actions = Vec::new();
        for p in 0..self.partitions() {
            if let Some(term) = self.open[p as usize].take() {
                if self.keeps_alive(p, term, now) {
                    actions.push(Action::GiveBack { p, term });
                } else {
                    actions.push(Action::Abandon { term });
                }
            }
        }
        for term in std::mem::take(&mut self.retired) {
            actions.push(Action::Abandon { term });
        }
        let held = self
            .parts
            .iter()
            .enumerate()
            .filter_map(|(p, h)| h.map(|h| (u32::try_from(p).unwrap_or(0), h.revision)))
            .collect();
        self.parts.iter_mut().for_each(|h| *h = None);
        self.tracked.clear();
        (actions, held)
    }

    /// Partition `p`'s phase and term, if held.
    #[cfg(test)]
    pub(crate) fn standing(&self, p: u32) -> Option<(Phase, u64)> {
        self.parts[p as usize].map(|h| (h.phase, h.term))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(3);

    fn at(base: Instant, ms: u64) -> Now {
        Now {
            mono: base + Duration::from_millis(ms),
            wall: SystemTime::UNIX_EPOCH + Duration::from_millis(1_000_000 + ms),
        }
    }

    /// A lone member takes partition 0 under term 7 and opens its cursor.
    fn owner(base: Instant) -> Machine {
        let mut m = Machine::new("a", 1, LEASE);
        let ops = m.plan(&["a".to_owned()], at(base, 0));
        assert_eq!(ops, vec![LeaseOp::Take { p: 0 }]);
        m.lease_answer(ops[0], at(base, 0), LeaseAnswer::Written(7), at(base, 1));
        assert_eq!(
            m.reconcile(at(base, 2)),
            vec![Action::Open { p: 0, term: 7 }]
        );
        m.opened(0, 7, 0, at(base, 3));
        m
    }

    /// R-DIST-8: what the machine did not hand out is refused, and so is a delivery of a
    /// term that is not the partition's current one.
    #[test]
    fn admission_is_fail_closed() {
        let base = Instant::now();
        let mut m = owner(base);
        assert!(!m.admit(1, at(base, 10)), "unknown");
        m.handed_out(2, Source::Partition(Fence::new(0, 6)));
        assert!(!m.admit(2, at(base, 10)), "stale term");
        m.handed_out(3, Source::Partition(Fence::new(0, 7)));
        assert!(m.admit(3, at(base, 10)));
    }

    /// R-DIST-8: a clean hand-over never gives a partition back while a handler of it
    /// runs here, however long it runs (the lease is renewed meanwhile).
    #[test]
    fn a_clean_hand_over_waits_for_the_running_handler() {
        let base = Instant::now();
        let mut m = owner(base);
        m.handed_out(1, Source::Partition(Fence::new(0, 7)));
        assert!(m.admit(1, at(base, 10)));
        // Another member joins and the rendezvous gives it partition 0 (or not: then
        // pick a name that wins).
        let other = (0..100)
            .map(|i| format!("b{i}"))
            .find(|b| rendezvous(&["a".to_owned(), b.clone()], 0) == Some(b.as_str()))
            .expect("some name wins partition 0");
        let members = vec!["a".to_owned(), other];
        let mut t = 20;
        let mut revision = 7;
        for _ in 0..40 {
            // Ten lease times of rounds: renewed, handing, never given back.
            let ops = m.plan(&members, at(base, t));
            assert_eq!(ops, vec![LeaseOp::Renew { p: 0, revision }]);
            revision += 1;
            m.lease_answer(
                ops[0],
                at(base, t),
                LeaseAnswer::Written(revision),
                at(base, t + 1),
            );
            assert_eq!(m.reconcile(at(base, t + 2)), vec![]);
            assert_eq!(m.standing(0), Some((Phase::Handing, 7)));
            t += 750;
        }
        assert_eq!(m.route(1), Route::Cursor(7));
        m.finished(1);
        assert_eq!(
            m.reconcile(at(base, t)),
            vec![Action::GiveBack { p: 0, term: 7 }]
        );
        assert_eq!(
            m.plan(&members, at(base, t + 1)),
            vec![LeaseOp::Free { p: 0, revision }]
        );
    }

    /// R-DIST-8: a lease lapses on whichever clock passes its validity first — the wall
    /// clock catches a frozen VM whose monotonic clock stood still.
    #[test]
    fn a_lease_lapses_on_either_clock() {
        let base = Instant::now();
        let mut m = owner(base);
        m.handed_out(1, Source::Partition(Fence::new(0, 7)));
        let frozen = Now {
            mono: base + Duration::from_millis(100),
            wall: SystemTime::UNIX_EPOCH + Duration::from_millis(1_000_000 + 60_000),
        };
        assert!(!m.admit(1, frozen));
        assert_eq!(
            m.reconcile(frozen),
            vec![
                Action::Retire { p: 0, term: 7 },
                Action::Abandon { term: 7 }
            ]
        );
        assert_eq!(m.standing(0), None, "lapsed");
    }

    /// A renewal answered after its request was sent long ago grants only what its send
    /// time allows; a lost compare-and-set drops the lease.
    #[test]
    fn answers_count_from_when_they_were_sent() {
        let base = Instant::now();
        let mut m = owner(base);
        let op = LeaseOp::Renew { p: 0, revision: 7 };
        // Sent at 0, answered at 2,800: valid until 2,700, so lapsed already.
        m.lease_answer(op, at(base, 0), LeaseAnswer::Written(8), at(base, 2_800));
        assert_eq!(m.standing(0), None);
        let mut m = owner(base);
        m.lease_answer(op, at(base, 10), LeaseAnswer::Lost, at(base, 20));
        assert_eq!(m.standing(0), None);
    }
}
