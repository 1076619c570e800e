//! Where a cursor's consumer stands in its stream — committed, position, end — as a
//! snapshot the cursor's accessors read without a round trip (issue 35).
//!
//! # Why a snapshot
//! [`BackendCursor::state`](tidings::durable::BackendCursor::state) answers every accessor
//! of a durable subscription (`state`, `error`, `committed`, `lag`, the broker's snapshot).
//! Reading the consumer's info there made an accessor wait on the network: two round trips
//! (confirming unconfirmed acknowledgements, then the info) — 4–4.5 s on a half-open
//! connection with a 2 s request timeout. So the accessor only reads what is here, and the
//! cursor's own network work keeps it fresh:
//! - opening the cursor reads it (the consumer's info from its creation, the stream's end);
//! - [`commit`](tidings::durable::BackendCursor::commit) and
//!   [`seek`](tidings::durable::BackendCursor::seek) store what they read;
//! - [`refresh`](tidings::durable::BackendCursor::refresh), which the feeder calls at the
//!   end of a step under the manual driver (whose caller looks at the state before any
//!   background task could run), reads it when something changed since the last read;
//! - a refresh task on the backend's runtime ([`run`](super::refresh::run)) reads it again [`AFTER_CHANGE`] after
//!   this process changed something (a finish, an append, a publish seen on the stream's
//!   subjects, a redrive) and otherwise every [`IDLE_REFRESH`] (what other processes sharing
//!   the durable, or the server's retention, did), confirming this cursor's acknowledgements
//!   first so the ack floor counts them.
//!
//! # How stale
//! While the server answers, the snapshot is at most [`AFTER_CHANGE`] plus one read (a
//! request timeout at worst) behind a change this process made or saw published, and at
//! most [`IDLE_REFRESH`] plus one read behind anything else. While it does not answer, the
//! snapshot keeps the last values read (no error is made of that: the client reconnects by
//! itself, and the cursor's fetch error says when fetching stopped).
//!
//! No lock is held across a read: the task reads, then stores under a short lock. A read
//! begun before a seek is not stored after it (the seek's epoch).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tidings::StreamError;

use super::records::bounds;
use crate::classify::seam;
use crate::client::durable::Durable;
use crate::connection::connect::JetStream;

/// How soon after a change the snapshot is read again.
pub(crate) const AFTER_CHANGE: Duration = Duration::from_millis(200);

/// How often the snapshot is read again when this process changed nothing.
pub(crate) const IDLE_REFRESH: Duration = Duration::from_secs(1);

/// Where a consumer stands in its stream, from the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Positions {
    /// Every offset below it is finished (acknowledged or terminated).
    pub(crate) committed: u64,
    /// The next offset the server would hand out.
    pub(crate) position: u64,
    /// One past the stream's last offset.
    pub(crate) end: u64,
    /// The consumer's deliveries so far, to anyone (its last delivery sequence).
    pub(crate) deliveries: u64,
}

impl Positions {
    pub(crate) fn new(info: &async_nats::jetstream::consumer::Info, end: u64) -> Self {
        let floor = info.ack_floor.stream_sequence + 1;
        let delivered = info.delivered.stream_sequence + 1;
        let (committed, position) = match (info.num_ack_pending, info.num_pending) {
            // Nothing out, nothing left that the filter takes: the whole stream is done
            // for this consumer (the server keeps a filtered consumer's floor at the last
            // message it delivered).
            (0, 0) => (end.max(floor), end.max(delivered)),
            // Nothing out: everything delivered is finished.
            (0, _) => (floor.max(delivered), delivered),
            _ => (floor, delivered),
        };
        Self {
            committed,
            position,
            end,
            deliveries: info.delivered.consumer_sequence,
        }
    }

    /// Reads them: the consumer's info and the stream's end, at once (one round trip).
    pub(crate) async fn read(
        durable: &Durable,
        js: &JetStream,
        stream: &str,
    ) -> Result<Self, StreamError> {
        let (info, bounds) = tokio::join!(durable.info(), bounds(js, stream));
        let (_, end) = bounds?;
        let info = info.map_err(|e| seam("reading the durable consumer's state", e))?;
        Ok(Self::new(&info, end))
    }
}

/// The last positions read (see the [module docs](self)), with the change count taken
/// when that read began: a change since makes the snapshot *dirty*.
#[derive(Debug, Default)]
pub(crate) struct Snapshot {
    last: Mutex<Option<(u64, Positions)>>,
    /// Bumped by a seek: a read begun before is not stored.
    epoch: AtomicU64,
    /// Bumped by every change this process makes or sees (see the module docs).
    changes: AtomicU64,
}

/// Taken when a read begins, handed back with what it read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ticket {
    epoch: u64,
    changes: u64,
}

impl Snapshot {
    /// The last positions read, if any. Never waits on anything but a short lock.
    pub(crate) fn get(&self) -> Option<Positions> {
        self.lock().map(|(_, p)| p)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(u64, Positions)>> {
        self.last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A read begins now: take the ticket before choosing what to read.
    pub(crate) fn begin(&self) -> Ticket {
        Ticket {
            epoch: self.epoch.load(Ordering::Acquire),
            changes: self.changes.load(Ordering::Acquire),
        }
    }

    /// A seek replaces the consumer: reads begun before are void. Returns the ticket of a
    /// read beginning now.
    pub(crate) fn next_epoch(&self) -> Ticket {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.begin()
    }

    /// Keeps `positions`, read under `ticket`, unless a seek came since or a read begun
    /// later is stored already.
    pub(crate) fn store(&self, ticket: Ticket, positions: Positions) {
        let mut last = self.lock();
        if self.epoch.load(Ordering::Acquire) != ticket.epoch
            || last.is_some_and(|(changes, _)| changes > ticket.changes)
        {
            return;
        }
        *last = Some((ticket.changes, positions));
    }

    /// Something changed: read again within [`AFTER_CHANGE`] (or at the feeder's next
    /// step under the manual driver).
    pub(crate) fn changed(&self) {
        self.changes.fetch_add(1, Ordering::AcqRel);
    }

    /// Whether something changed since the read the snapshot holds began (or nothing was
    /// read yet).
    pub(crate) fn dirty(&self) -> bool {
        let now = self.changes.load(Ordering::Acquire);
        self.lock().is_none_or(|(changes, _)| changes < now)
    }
}
