//! What a cursor and its background tasks (puller, keep-alive, refresh, acknowledgements)
//! share: the deliveries held, the wake-ups, the positions snapshot.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tidings::Message;
use tidings::durable::CursorWaker;

use super::positions::Snapshot;
use super::strays::Strays;
use crate::client::delivery::Delivery;
use crate::error::JetStreamError;

#[derive(Default)]
pub(crate) struct Inner {
    /// Handed out and not finished, by sequence.
    pub(crate) outstanding: HashMap<u64, Arc<Delivery>>,
    /// Why fetching stopped (a deleted consumer).
    pub(crate) error: Option<JetStreamError>,
    /// The last failed pull or acknowledgement batch (cleared by a successful pull).
    pub(crate) transient: Option<String>,
    /// The sequence after the last one handed out.
    pub(crate) handed: u64,
    /// Pulled and not handed out yet, in the order the server sent them: a returned
    /// message (`true`, decoded already) goes out alone, the others (decoded when handed
    /// out) once no returned one is out.
    pub(crate) buffer: VecDeque<(Arc<Delivery>, Option<Message>, bool)>,
    /// The returned message handed out alone and not finished: its sequence and the
    /// handler starts counted before it.
    pub(crate) alone: Option<(u64, u32)>,
    /// Since when the consumer is missing on the server (a seek elsewhere recreates it).
    pub(crate) gone_since: Option<Instant>,
    /// A keyed group's partition owner collects what is out elsewhere (the last owner's
    /// unfinished deliveries, a late pull's) before handing anything out: pulls only fill
    /// the buffer (see `group::partition`).
    pub(crate) gathering: bool,
    /// A keyed group's partition cursor counts the deliveries out elsewhere.
    pub(crate) strays: Option<Strays>,
    /// When the last pull that was answered was sent.
    pub(crate) pulled: Option<Instant>,
    /// When the last reading of the server's delivery count that `strays` took in was
    /// sent (taken while no pull was in flight).
    pub(crate) counted: Option<Instant>,
}

/// What the cursor and its background tasks share.
pub(crate) struct CursorShared {
    pub(crate) inner: Mutex<Inner>,
    pub(crate) waker: CursorWaker,
    /// Wakes the standing pull (room freed, something published).
    pub(crate) nudge: tokio::sync::Notify,
    pub(crate) name: String,
    pub(crate) skipped_by_filter: AtomicU64,
    pub(crate) keep_alives: AtomicU64,
    pub(crate) closed: AtomicBool,
    /// Background pulls only while this admits (a keyed group's partition lease, active);
    /// unset: always.
    pub(crate) admits: std::sync::OnceLock<Arc<dyn Fn() -> bool + Send + Sync>>,
    /// Keep-alives only while this holds (the lease, active or handing over: running
    /// handlers finish here); unset: always.
    pub(crate) keeps: std::sync::OnceLock<Arc<dyn Fn() -> bool + Send + Sync>>,
    /// Where the consumer stands, as last read: what `state` answers from.
    pub(crate) positions: Snapshot,
    /// One more when a pull begins and when it ends (odd: one is in flight), so a reading
    /// of the server's delivery count can tell that no pull overlapped it.
    pub(crate) pull_epoch: AtomicU64,
}

/// A pull in flight (see [`CursorShared::pull_begins`]): its end moves the pull epoch on.
pub(crate) struct PullInFlight<'a>(&'a CursorShared);

impl Drop for PullInFlight<'_> {
    fn drop(&mut self) {
        self.0.pull_epoch.fetch_add(1, Ordering::AcqRel);
    }
}

impl CursorShared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves plain data: keep going.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Every delivery held: handed out and not finished, or pulled and waiting.
    pub(crate) fn held(&self) -> Vec<Arc<Delivery>> {
        let g = self.lock();
        g.outstanding
            .values()
            .cloned()
            .chain(g.buffer.iter().map(|(d, _, _)| Arc::clone(d)))
            .collect()
    }

    /// Whether the standing pull may pull now (always, unless a lease says otherwise).
    pub(crate) fn admitted(&self) -> bool {
        self.admits.get().is_none_or(|admits| admits())
    }

    /// The server counted `deliveries` of the consumer in a reading sent at `sent`, which
    /// no pull overlapped: a keyed partition cursor counts those beyond what reached it
    /// as out elsewhere (see [`Strays::server_count`]), and gathers if there are any.
    pub(crate) fn server_count(&self, deliveries: u64, sent: Instant) {
        let mut g = self.lock();
        let inner = &mut *g;
        let Some(strays) = &mut inner.strays else {
            return;
        };
        if strays.server_count(deliveries) {
            inner.gathering = true;
        }
        inner.counted = inner.counted.max(Some(sent));
    }

    /// A pull begins: the pull epoch is odd until the returned mark is dropped, after the
    /// pull's last delivery is in the buffer.
    pub(crate) fn pull_begins(&self) -> PullInFlight<'_> {
        self.pull_epoch.fetch_add(1, Ordering::AcqRel);
        PullInFlight(self)
    }

    /// The pull epoch (see [`CursorShared::pull_begins`]).
    pub(crate) fn pull_epoch(&self) -> u64 {
        self.pull_epoch.load(Ordering::Acquire)
    }

    /// Whether the buffer is held back (a keyed partition gathering).
    pub(crate) fn gathering(&self) -> bool {
        self.lock().gathering
    }

    /// Whether keep-alives may be sent now (always, unless a lease says otherwise).
    pub(crate) fn keeps_alive(&self) -> bool {
        self.keeps.get().is_none_or(|keeps| keeps())
    }

    pub(crate) fn note_keep_alive(&self, n: usize) {
        self.keep_alives.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// One more delivery finished here without being handed out (skipped by a filter).
    pub(crate) fn note_skipped(&self) {
        self.skipped_by_filter.fetch_add(1, Ordering::Relaxed);
        self.note_change();
    }

    /// The durable name (a redrive copy's target is compared with it).
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// There may be more on the server (an append through this backend, a publish seen,
    /// the idle tick): wakes the feeder and the standing pull.
    pub(crate) fn wake(&self) {
        if !self.is_closed() {
            self.nudge();
            self.waker.wake();
        }
    }

    /// Something landed in the buffer: wakes the feeder only.
    pub(crate) fn wake_feeder(&self) {
        if !self.is_closed() {
            self.waker.wake();
        }
    }

    /// The positions snapshot (see [`positions`](super::positions)).
    pub(crate) fn positions(&self) -> &Snapshot {
        &self.positions
    }

    /// Something changed on the server that moves the positions (a finish, an append, a
    /// publish seen): the snapshot is read again soon.
    pub(crate) fn note_change(&self) {
        self.positions.changed();
    }

    /// Wakes the standing pull (it looks whether the window has room).
    pub(crate) fn nudge(&self) {
        self.nudge.notify_one();
    }

    /// Until the next [`nudge`](Self::nudge) (one given before counts).
    pub(crate) async fn nudged(&self) {
        self.nudge.notified().await;
    }
}
