//! The durable-source seam: what durable streams and durable subscriptions need from the
//! place messages are kept (DESIGN.md: "the JetStream backend is a second implementation of
//! the durable source, not a second broker").
//!
//! The broker owns everything a subscription does with a message — queue, dispatcher,
//! retry in place, TTL, filters, lanes, counters, the in-memory DLQ — and the *feeder* that
//! moves messages from a cursor into the subscription's queue, keeping at most `window`
//! outstanding (R-BP-2), holding delayed ones in the scheduler (R-TIME-2), and reporting
//! each message that finished. A backend owns only what must outlive the process:
//!
//! - [`DurableBackend`] opens streams (and, optionally, durable dedup stores);
//! - [`BackendStream`] appends what the broker publishes and opens cursors;
//! - [`BackendCursor`] is one durable subscription's position: it hands out messages,
//!   records the ones that finished (success, filtered, or dead-lettered — made durable in
//!   its dead-letter store *before* the message counts as finished), moves on seek, reports
//!   lag, and keeps the durable DLQ (R-DEL-4).
//!
//! Two implementations exist: the embedded log (the default with
//! [`BrokerBuilder::data_dir`](crate::BrokerBuilder::data_dir)) and NATS JetStream (crate
//! `tidings-jetstream`). The conformance suite in `tidings-testkit` runs the same durable
//! cases against each.
//!
//! # Waiting
//! Each method's docs say, in a line headed **Waits**, whether it may wait on the disk or
//! the network and for how long. Three kinds:
//! - *never*: answered from memory, under short locks that no one holds across I/O —
//!   [`BackendCursor::state`], [`BackendCursor::outstanding`], the names, capabilities and
//!   last-known offsets. An implementation must keep it so: these answer the accessors of
//!   a durable subscription and the broker's snapshot (issue 35);
//! - *bounded I/O*: a file write or read (the embedded log: a few syscalls, plus an fsync
//!   where its fsync policy asks), or a request to a server
//!   (bounded by the backend's own timeouts: JetStream, one request timeout per round trip
//!   plus 0.5 s, as its docs list);
//! - *proportional*: work that grows with what is stored (opening a stream recovers its
//!   files; listing a DLQ reads every entry).
//!
//! # Threads
//! The feeder's calls (fetch, finish, idle) run, under the tokio driver, on the blocking
//! pool, never on a runtime worker; under the manual driver, on the caller of
//! `run_until_idle`. Calls made for a caller run on the caller's thread — an append for
//! a sync `publish`, [`BackendStream::open_cursor`] for a subscribe, a seek, commit or
//! DLQ call, and [`BackendCursor::close`] when a durable subscription is dropped — which is
//! a runtime worker when the caller is async: such a call blocks it for the bounded time
//! its **Waits** line states. A cursor signals "there may be more to fetch" through the
//! [`CursorWaker`] it was opened with; waking is cheap and never blocks, so it may be
//! called from any thread, under any lock.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::{CommitFailed, StartAt, StreamConfig, StreamError};
use crate::dedup::DedupStore;
use crate::dlq::DeadLetterReason;
use crate::message::Message;
use crate::topic::Pattern;
use crate::transport::ConnectionId;

/// What a backend can do, as the broker, its options and the conformance suite need to
/// know it. An option the backend cannot honour is refused when it is asked for, with
/// [`StreamError::Unsupported`] naming the option and the backend (R-DIST-4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Stored messages keep their [`Priority`](crate::Priority).
    pub priority: bool,
    /// [`DurableBackend::dedup_store`] is available (R-DEL-5 "durable").
    pub dedup_store: bool,
    /// Stored messages are stamped with the broker's clock, so a
    /// [`ManualClock`](crate::ManualClock) places them in time and `StartAt::Time` replays
    /// by it. A backend stamping with a server's clock (JetStream) cannot.
    pub manual_time: bool,
    /// The committed position is a low watermark (R-LOG-3): after a restart *every*
    /// offset from it on comes again, those already finished above it included. A backend
    /// that acknowledges each message on its own (JetStream) redelivers only the
    /// unfinished ones.
    pub contiguous_commit: bool,
    /// The offset of the first message appended to an empty stream (0 for the embedded
    /// log; JetStream sequences start at 1).
    pub first_offset: u64,
}

impl Capabilities {
    /// Everything, offsets from 0 (the embedded log).
    #[must_use]
    pub const fn all() -> Self {
        Self {
            priority: true,
            dedup_store: true,
            manual_time: true,
            contiguous_commit: true,
            first_offset: 0,
        }
    }
    /// These capabilities without priority.
    #[must_use]
    pub const fn without_priority(mut self) -> Self {
        self.priority = false;
        self
    }
    /// These capabilities without a durable dedup store.
    #[must_use]
    pub const fn without_dedup_store(mut self) -> Self {
        self.dedup_store = false;
        self
    }
    /// These capabilities without replay on a manual clock.
    #[must_use]
    pub const fn without_manual_time(mut self) -> Self {
        self.manual_time = false;
        self
    }
    /// These capabilities with a commit per message instead of a low watermark.
    #[must_use]
    pub const fn without_contiguous_commit(mut self) -> Self {
        self.contiguous_commit = false;
        self
    }
    /// These capabilities with first offset `first`.
    #[must_use]
    pub const fn first_offset(mut self, first: u64) -> Self {
        self.first_offset = first;
        self
    }
}

/// What a snapshot shows of where a stream is stored (R-OPS-1), in terms every backend
/// can fill; what a backend does not know stays at its default (0, empty).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StorageInfo {
    /// Bytes stored.
    pub bytes: u64,
    /// Storage units (the embedded log's segment files).
    pub segments: u64,
    /// Where it is stored: a directory, or a stream on a server.
    pub location: String,
    /// When an append counts as stored: `always`, `interval(100ms)`, `never` (the
    /// embedded log's fsync policy), or what the server promises.
    pub durability: String,
}

/// Where a broker's durable streams live. One backend serves one broker at a time.
///
/// # Closing
/// [`Broker::close`](crate::Broker::close) closes every cursor, then every stream, then
/// calls [`DurableBackend::close`].
pub trait DurableBackend: Any + Send + Sync + fmt::Debug {
    /// A short name used in errors and snapshots: `"embedded-log"`, `"jetstream"`.
    ///
    /// **Waits:** never.
    fn name(&self) -> &'static str;

    /// What it can do.
    ///
    /// **Waits:** never.
    fn capabilities(&self) -> Capabilities;

    /// Create the stream `config.name` capturing `patterns` (validated by the broker), or
    /// open it again after a restart (or from another process). Every setting of `config`
    /// is honoured or refused; an existing stream is opened only if it has the same
    /// patterns and retention, and is never changed (R-LOG-5).
    ///
    /// **Waits:** on the disk, in proportion to what the stream holds (the embedded log
    /// recovers its files), or on the network (a few round trips, each bounded by the
    /// backend's request timeout).
    ///
    /// # Errors
    /// The backend could not create or open it ([`StreamError::Open`] for a local log,
    /// [`StreamError::Backend`] for a remote one), `config` asks for what it cannot do
    /// ([`StreamError::Unsupported`]), or the stream exists with other settings
    /// ([`StreamError::ConfigMismatch`]).
    fn open_stream(
        &self,
        config: &StreamConfig,
        patterns: &[Pattern],
    ) -> Result<Arc<dyn BackendStream>, StreamError>;

    /// Open (or create, or reopen after a restart) the durable dedup store `name` that
    /// remembers at least the `capacity` most recent ids (R-DEL-5 "durable").
    ///
    /// **Waits:** on the disk (reading the store back, in proportion to its size) or the
    /// network (a few bounded round trips).
    ///
    /// # Errors
    /// [`StreamError::Unsupported`] unless [`Capabilities::dedup_store`]; otherwise what
    /// opening it reported.
    fn dedup_store(&self, name: &str, capacity: usize) -> Result<Arc<dyn DedupStore>, StreamError> {
        let _ = (name, capacity);
        Err(StreamError::Unsupported {
            feature: "durable dedup store",
            backend: self.name(),
        })
    }

    /// The connection on which every append is also published as a plain message (a
    /// JetStream append is a NATS publish on the message's subject), so that a transport
    /// built from the same connection
    /// ([`Transport::connection`](crate::transport::Transport::connection)) already carries it.
    /// Default: `None`, appends are published nowhere else.
    ///
    /// **Waits:** never.
    fn appends_published_on(&self) -> Option<ConnectionId> {
        None
    }

    /// The broker closed: release what the backend holds (connections, locks).
    ///
    /// **Waits:** on releasing them (a flush, a connection's close), bounded by the
    /// backend's timeouts.
    fn close(&self) {}
}

/// What [`BackendStream::append_async`] returns: the append's outcome, later.
pub type AppendFuture = Pin<Box<dyn Future<Output = Result<Appended, StreamError>> + Send>>;

/// One open stream.
///
/// # Ordering
/// Offsets grow by append order; [`BackendStream::append`] returns once the message is
/// stored as durably as the stream's configuration promises.
pub trait BackendStream: Send + Sync + fmt::Debug {
    /// The stream's name.
    ///
    /// **Waits:** never.
    fn name(&self) -> &str;

    /// Store `message` (its topic matched the stream's patterns); returns its offset.
    ///
    /// # Duplicate window (R-DEL-7)
    /// When the stream's [`StreamConfig::duplicate_window_duration`] is not zero and a
    /// message with the same [`Message::id`] was appended within it (also before a
    /// restart), nothing is stored: the result is the earlier copy's offset with
    /// [`Appended::duplicate`] set. A backend judges the window by its own clock and says
    /// which in its docs.
    ///
    /// **Waits:** on the disk (a write, and an fsync where the stream's policy asks) or the
    /// network (one round trip: the server's acknowledgement, bounded by the backend's
    /// request timeout).
    ///
    /// # Errors
    /// Not stored: publish fails with the error and offers the message to nobody.
    fn append(&self, message: &Message) -> Result<Appended, StreamError>;

    /// [`append`](Self::append) as a future that holds no thread while it waits (a
    /// network backend waiting for the server's acknowledgement), or `None` when the
    /// backend has no such path (the embedded log: an append is a write and maybe an fsync,
    /// so [`Broker::publish_async`](crate::Broker::publish_async) runs `append` on the
    /// blocking pool instead). The default is `None`.
    ///
    /// Same contract as `append`, bounded by the backend's own timeouts. The future owns
    /// what it needs (`'static`); it may be polled on any async runtime, so it must not
    /// depend on the caller's (run its I/O on the backend's own, and only await the
    /// answer). Dropping it does not cancel an append already sent: the message may be
    /// stored, as when a caller of `append` gives up.
    ///
    /// **Waits:** never (the returned future waits, holding no thread, as `append` would).
    fn append_async(self: Arc<Self>, message: &Message) -> Option<AppendFuture> {
        let _ = message;
        None
    }

    /// The earliest retained offset, as last known.
    ///
    /// **Waits:** never.
    fn start_offset(&self) -> u64;

    /// One past the last stored offset, as last known.
    ///
    /// **Waits:** never.
    fn end_offset(&self) -> u64;

    /// Up to `max` stored messages from offset `from`, each carrying its
    /// [`Message::offset`]. Reading does not move any cursor.
    ///
    /// **Waits:** on the disk (reading up to `max` records) or the network (bounded round
    /// trips, one per batch of records the server hands back).
    ///
    /// # Errors
    /// [`StreamError::OutOfRetention`], [`StreamError::BeyondEnd`], or a read failure.
    fn read(&self, from: u64, max: usize) -> Result<Vec<Message>, StreamError>;

    /// Open the cursor of durable subscription `spec.name`: at its committed position if it
    /// has one, else at `spec.start`, committed at once.
    ///
    /// **Waits:** on the disk (reading and writing the committed position, the DLQ's files)
    /// or the network (a few bounded round trips: the consumer, the DLQ).
    ///
    /// # Errors
    /// The start is outside the stream, the stored position is unreadable, or the backend
    /// failed.
    fn open_cursor(&self, spec: CursorSpec<'_>) -> Result<Box<dyn BackendCursor>, StreamError>;

    /// How often the broker's retention timer should call
    /// [`apply_retention`](Self::apply_retention) on this stream; `None` (the default):
    /// never — the backend applies the retention itself (a server), or the stream keeps
    /// everything.
    ///
    /// **Waits:** never.
    fn retention_interval(&self) -> Option<Duration> {
        None
    }

    /// Apply the stream's retention now, judging age against `now` (the broker clock's
    /// wall time); called by the broker's retention timer. The default does nothing.
    ///
    /// **Waits:** on the disk (removing whole segments).
    ///
    /// # Errors
    /// Removing failed (logged by the broker, tried again at the next interval).
    fn apply_retention(&self, now: SystemTime) -> Result<(), StreamError> {
        let _ = now;
        Ok(())
    }

    /// Where and how the stream is stored, for snapshots (R-OPS-1). The default is empty.
    ///
    /// **Waits:** never on the network; at most on the file system's metadata (sizes the
    /// embedded log reads from memory or a directory listing).
    fn storage_info(&self) -> StorageInfo {
        StorageInfo::default()
    }

    /// Stop accepting appends and release the stream (its cursors are closed first).
    ///
    /// **Waits:** on flushing what is written (an fsync), bounded; no network.
    ///
    /// # Errors
    /// Flushing or releasing failed (logged by the broker).
    fn close(&self) -> Result<(), StreamError>;
}

/// What [`BackendStream::append`] did with a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Appended {
    /// Where the message is stored: its new offset, or the earlier copy's for a duplicate.
    pub offset: u64,
    /// True when the stream already held a message with this id within its duplicate
    /// window: nothing was stored (R-DEL-7).
    pub duplicate: bool,
}

impl Appended {
    /// Stored now, at `offset`.
    #[must_use]
    pub const fn stored(offset: u64) -> Self {
        Self {
            offset,
            duplicate: false,
        }
    }
    /// Already held at `offset`: nothing stored.
    #[must_use]
    pub const fn duplicate_of(offset: u64) -> Self {
        Self {
            offset,
            duplicate: true,
        }
    }
}

/// What a durable subscription asks of its cursor.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct CursorSpec<'a> {
    /// The durable name: the key of the committed position (valid as a file name).
    pub name: &'a str,
    /// Only messages whose topic matches are handed out; the others are finished by the
    /// cursor itself (counted in [`CursorState::skipped_by_filter`]).
    pub filter: &'a Pattern,
    /// Where a new durable name starts.
    pub start: StartAt,
    /// At most this many messages are outstanding (fetched and not finished); the feeder
    /// never asks for more.
    pub window: usize,
    /// Called when there may be more to fetch (an append, a redelivery, a seek).
    pub waker: CursorWaker,
    /// The subscription keeps per-key order (keyed lanes or per-key concurrency): a
    /// backend shared by several processes may then split the keys between them, each key
    /// handled by one process at a time (R-DIST-6), and hand out a [`StartGate`].
    pub keyed: bool,
}

impl<'a> CursorSpec<'a> {
    /// A spec for `name` reading `filter` from `start`.
    #[must_use]
    pub fn new(
        name: &'a str,
        filter: &'a Pattern,
        start: StartAt,
        window: usize,
        waker: CursorWaker,
    ) -> Self {
        Self {
            name,
            filter,
            start,
            window,
            waker,
            keyed: false,
        }
    }

    /// This spec, keeping per-key order when `keyed` (see [`CursorSpec::keyed`]).
    #[must_use]
    pub fn keyed(mut self, keyed: bool) -> Self {
        self.keyed = keyed;
        self
    }
}

/// A durable subscription's position in its stream.
///
/// # Delivery
/// At-least-once: a message fetched and not reported finished is handed out again after a
/// restart (or, for a shared remote consumer, after its ack deadline).
///
/// # Closing
/// After [`BackendCursor::close`] nothing more is committed; messages finished later are
/// redelivered after a restart.
pub trait BackendCursor: Send + Sync {
    /// Up to `max` next messages for this subscription, each carrying its
    /// [`Message::offset`], without waiting for new ones (`Ok(vec![])`: nothing now; the
    /// waker fires when there may be more). Messages the filter or a targeted redrive
    /// excludes are skipped here.
    ///
    /// **Waits:** on the disk (reading records) or the network (JetStream: none while its
    /// background pull has messages buffered, else one bounded round trip).
    ///
    /// # Errors
    /// The cursor cannot go on (an unreadable record, a poisoned commit, a lost
    /// connection): the feeder stops fetching until a seek, and the error shows in
    /// [`CursorState::error`].
    fn fetch(&self, max: usize) -> Result<Vec<Message>, StreamError>;

    /// [`BackendCursor::fetch`], each message in the allocation the subscription will
    /// queue, hold and hand to the [`StartGate`]: the feeder fetches through this. The
    /// default wraps what `fetch` returned.
    ///
    /// **Waits:** as [`BackendCursor::fetch`].
    ///
    /// # Errors
    /// As [`BackendCursor::fetch`].
    fn fetch_shared(&self, max: usize) -> Result<Vec<Arc<Message>>, StreamError> {
        Ok(self.fetch(max)?.into_iter().map(Arc::new).collect())
    }

    /// The gate asked before every handler attempt of a message this cursor handed out;
    /// `None` (the default): every attempt may start.
    ///
    /// **Waits:** never.
    fn start_gate(&self) -> Option<Arc<dyn StartGate>> {
        None
    }

    /// These messages finished for good. A dead letter is stored in the durable DLQ
    /// before its message counts as finished; one that could not be stored is not
    /// finished (it is redelivered after a restart) and the error is returned.
    ///
    /// **Waits:** for a dead letter, on storing it (a disk write, or two bounded round
    /// trips); otherwise the embedded log may write the position, and JetStream does not
    /// wait (its acknowledgements are queued).
    ///
    /// # Errors
    /// A dead letter or the commit could not be stored.
    fn finish(&self, done: &[Finished]) -> Result<(), StreamError>;

    /// The feeder found nothing to fetch: a moment to store the position if it moved.
    ///
    /// **Waits:** on the disk when it writes the position; no network.
    fn idle(&self) {}

    /// The feeder's driver steps it only when told (the manual driver), so its caller may
    /// look at the state before anything else runs: bring what [`state`](Self::state)
    /// reports up to date now. Called by the feeder at the end of such a step, never by an
    /// accessor. The default does nothing (a backend whose state is always current).
    ///
    /// **Waits:** on the network when the backend keeps a snapshot and something changed
    /// since its last read (JetStream: confirming the queued acknowledgements, then one
    /// round trip, each bounded by the request timeout).
    fn refresh(&self) {}

    /// Move the position (R-LOG-4) and commit it; returns the new position. Clears a
    /// fetch error; a poisoned commit stays poisoned.
    ///
    /// **Waits:** on the disk (writing the position; a time-based start reads the index) or
    /// the network (JetStream: deleting and creating the consumer, a few bounded round
    /// trips).
    ///
    /// # Errors
    /// The target lies outside the stream, or the commit failed.
    fn seek(&self, at: StartAt) -> Result<u64, StreamError>;

    /// Store the position now; returns it.
    ///
    /// **Waits:** on the disk (writing the position) or the network (JetStream: confirming
    /// the queued acknowledgements and reading the ack floor, two bounded round trips).
    ///
    /// # Errors
    /// [`StreamError::Poisoned`] after a failed commit, [`StreamError::Closed`] once closed.
    fn commit(&self) -> Result<u64, StreamError>;

    /// Position, commit, lag, outstanding and halt state, from what the cursor holds.
    ///
    /// **Waits:** never — neither on the network nor on the disk, nor on a lock held across
    /// either. It answers every accessor of a durable subscription (`state`, `error`,
    /// `committed`, `lag`, …) and the broker's snapshot, which must answer while the
    /// backend's server is unreachable. A backend whose positions live elsewhere keeps a
    /// snapshot that its own work (fetches, finishes, commits, a periodic refresh of its
    /// own) updates, never the caller of `state`.
    ///
    /// # How current
    /// `outstanding`, `error`, `poisoned` and the skip counters are exact. `position`,
    /// `committed` and `lag` are as of the backend's last look, and each backend states how
    /// stale they may be: the embedded log's are exact (memory, and the log's visible end);
    /// JetStream's are re-read at most 200 ms after a change this process made or saw
    /// published, and at most 1 s after anything else (another process's acknowledgements,
    /// the server's retention), each plus one round trip, while the server answers — while
    /// it does not, they stay as last read. Under the manual driver the feeder brings them
    /// up to date at the end of each step ([`refresh`](Self::refresh)).
    fn state(&self) -> CursorState;

    /// How many messages this cursor handed out and was not told are finished: the
    /// feeder asks at every step how much room its window has. Answered from what the
    /// cursor itself holds, without a round trip to a remote engine (where
    /// [`state`](Self::state) may need one); always equal to `state().outstanding`. The
    /// default asks [`state`](Self::state): a backend whose state costs more should
    /// answer this itself.
    ///
    /// **Waits:** never.
    fn outstanding(&self) -> usize {
        self.state().outstanding
    }

    /// The entries of the durable DLQ, oldest first (R-DEL-4).
    ///
    /// **Waits:** on the disk or the network, in proportion to the DLQ's entries (one
    /// bounded round trip each on JetStream).
    ///
    /// # Errors
    /// The DLQ could not be read.
    fn dead_letters(&self) -> Result<Vec<DurableDeadLetter>, StreamError>;

    /// Remove every DLQ entry and return them, oldest first; durable once `Ok`.
    ///
    /// **Waits:** as [`BackendCursor::dead_letters`], then one write or round trip for the
    /// removal.
    ///
    /// # Errors
    /// Reading or recording the removal failed (then nothing was removed).
    fn drain_dead_letters(&self) -> Result<Vec<DurableDeadLetter>, StreamError>;

    /// Append the entries `select` picks to the stream again, reserved for this
    /// subscription, *then* remove them from the DLQ (loss-safe); returns how many.
    ///
    /// **Waits:** as [`BackendCursor::dead_letters`], then an append and a removal per
    /// entry picked (disk writes and syncs, or bounded round trips).
    ///
    /// # Errors
    /// Reading, appending or recording failed; entries redriven before the failure left
    /// the DLQ, the others stay.
    fn redrive_dead_letters(
        &self,
        select: &mut dyn FnMut(&DurableDeadLetter) -> bool,
    ) -> Result<usize, StreamError>;

    /// Store the final position and release the name (it can be subscribed again at
    /// once). Idempotent.
    ///
    /// **Waits:** on the disk (writing the position) or the network (JetStream: giving back
    /// what it holds and confirming it, bounded by a few request timeouts).
    fn close(&self);
}

/// Position, commit and lag of one cursor, as [`BackendCursor::state`] reads them from
/// what the cursor holds (see there how current each field is).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CursorState {
    /// The next offset the cursor hands out.
    pub position: u64,
    /// Every offset below it is finished, durably.
    pub committed: u64,
    /// Fetched and not finished.
    pub outstanding: usize,
    /// Stored messages not yet committed (R-BP-3).
    pub lag: u64,
    /// Offsets skipped because retention removed them before they were read.
    pub skipped: u64,
    /// Messages the cursor's filter excluded (finished without delivery).
    pub skipped_by_filter: u64,
    /// Records skipped because they cannot be read: damaged on disk, past the point the
    /// backend can resynchronise (R-LIM-2, R-DEL-6). Each skip is logged with
    /// `tracing::error!` and the last one is described in
    /// [`unreadable_reason`](Self::unreadable_reason).
    pub unreadable: u64,
    /// The last skip of unreadable records: which offsets, which file, which byte, why.
    pub unreadable_reason: Option<String>,
    /// Why fetching stopped, if it did.
    pub error: Option<String>,
    /// The failed commit that poisoned the cursor, if one did.
    pub poisoned: Option<CommitFailed>,
    /// The stored position found at open when it lay beyond the stream's end (clamped).
    pub clamped_from: Option<u64>,
}

/// Wakes the feeder of one durable subscription: there may be more to fetch. Cheap, never
/// blocks; callable from any thread.
#[derive(Clone)]
pub struct CursorWaker(Arc<dyn Fn() + Send + Sync>);

impl CursorWaker {
    /// A waker calling `f`.
    pub fn new(f: impl Fn() + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }
    /// Wake the feeder.
    pub fn wake(&self) {
        (self.0)();
    }
}

impl fmt::Debug for CursorWaker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CursorWaker")
    }
}

// One type from a subscription's finished hook to the cursor: defined by the subscription
// (this module depends on it, never the other way round), part of this seam.
pub use crate::subscription::{Finished, Outcome, StartGate};

/// An entry of a durable subscription's dead-letter store (R-DEL-4).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DurableDeadLetter {
    /// The message (its [`Message::offset`] is its offset in the stream).
    pub message: Message,
    /// Why it was dead-lettered.
    pub reason: DeadLetterReason,
    /// Handler attempts made.
    pub attempts: u32,
}

impl DurableDeadLetter {
    /// An entry for `message`.
    #[must_use]
    pub fn new(message: Message, reason: DeadLetterReason, attempts: u32) -> Self {
        Self {
            message,
            reason,
            attempts,
        }
    }
}
