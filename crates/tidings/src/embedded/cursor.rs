//! The embedded cursor of one durable subscription: position, commit rule, durable DLQ
//! (R-LOG-3, R-LOG-4, R-DEL-4, R-BP-3).
//!
//! # Commit rules (R-LOG-3)
//! The committed position is the *low watermark*: the lowest offset handed out and not yet
//! finished (or the position, when nothing is outstanding). A message finishes when its
//! handler succeeded, the subscription's filters excluded it, or it was dead-lettered —
//! for dead letters only after it was appended to the durable DLQ log. Messages abandoned
//! at close never finish, so they are redelivered after a restart. The position is written
//! (temp file, fsync, rename, fsync dir; see `offset_store`) every `commit_every`
//! completions, at the first completion [`COMMIT_AT_LEAST_EVERY`] (1 s) after the last
//! write, when the feeder is idle, on seek and on close. The time bound keeps a crash's
//! redelivery of finished messages short — well inside a stream's duplicate window
//! (R-DEL-7: the outputs a redelivered input publishes again are dropped only within it) —
//! also for slow handlers, which would take long to reach `commit_every`. A failed write **poisons**
//! the cursor ([`CommitFailed`]): after a failed fsync the file's state is unknown, so it
//! is never retried; nothing more is read or committed.
//!
//! # Locks
//! Writing the offset file takes two fsyncs. It runs under the `commit` lock, which keeps
//! the writes in order, and *not* under the `state` lock: the watermark is read under
//! `state`, written, and recorded as committed once the write returned, so fetches and
//! completions go on while the disk works. What was finished meanwhile is committed by the
//! next write. A completion that finds a write under way does not wait for it (the
//! dispatcher's thread must not queue behind the feeder's store): its count stays due and
//! the next completion, idle step or close writes. A seek writes its target the same way.
//! So `state` (every accessor of the subscription) never waits for the disk. Lock order:
//! `commit`, then `state`.
//!
//! A committed position beyond the stream's end (a foreign file, or a stream that lost its
//! tail in a power cut) is clamped to the end at open, committed and logged, never trusted.
//!
//! # Damaged records (R-LIM-2, R-DEL-6)
//! A record that fails its checks on disk costs only itself. The log hands out the records
//! before it (a fetch batch is not all-or-nothing); the fetch that starts at it asks the log
//! for the next readable record ([`Log::next_readable`]) and goes on there. The offsets
//! skipped are counted ([`CursorState::unreadable`]), logged with `tracing::error!` and
//! described ([`CursorState::unreadable_reason`]: offsets, file, byte, check); they finish
//! like filtered records, so the position is committed past them. Where the log finds
//! nothing readable after the damage (the active segment), the cursor halts at exactly that
//! offset: [`CursorState::error`] names the file, byte and offset, and a seek clears it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard};
use tidings_log::{Log, ReadError};

use crate::dlq::DeadLetterReason;
use crate::durable::{
    BackendCursor, CommitFailed, CursorState, CursorWaker, DurableDeadLetter, Finished, Outcome,
    StartAt, StreamError,
};
use crate::message::Message;
use crate::topic::Pattern;

use super::codec;
use super::dlq_record;
use super::offset_store::OffsetStore;
use super::stream::EmbeddedStream;

/// Most records read per fetch.
const BATCH: usize = 256;

#[derive(Debug)]
struct Position {
    /// Next offset `fetch` reads.
    cursor: u64,
    /// Offsets handed out and not yet finished (queued, in flight, waiting to retry).
    pending: BTreeSet<u64>,
    /// Last position written to the offset file.
    committed: u64,
    since_commit: usize,
    /// When `since_commit` was last reset (real time: it bounds what a crash redelivers).
    counting_since: Instant,
    /// Offsets skipped because retention removed them before they were read.
    skipped: u64,
    /// Records the filter excluded.
    skipped_by_filter: u64,
    /// Records skipped because they could not be read (see "Damaged records").
    unreadable: u64,
    /// The last such skip, described.
    unreadable_reason: Option<String>,
    /// Set when fetching halted (unreadable record, failed commit or DLQ append); cleared
    /// by `seek`.
    error: Option<String>,
    /// Set by `close`: from then on nothing is committed or appended to the durable DLQ (a
    /// successor may own the files already); what finishes late is redelivered after a
    /// restart.
    retired: bool,
    /// Set by a failed commit: nothing is committed or read any more (never cleared).
    poisoned: Option<CommitFailed>,
}

impl Position {
    /// Lowest offset not yet finished: everything below it is done.
    fn watermark(&self) -> u64 {
        self.pending.first().copied().unwrap_or(self.cursor)
    }
}

/// Completions are written at the latest at the first one this long after the last write.
pub(crate) const COMMIT_AT_LEAST_EVERY: Duration = Duration::from_secs(1);

/// One durable subscription's position in an embedded stream, with its offset file and
/// durable dead-letter log (`consumers/<stream>/<name>.offset`, `<name>.dlq/`).
pub(crate) struct EmbeddedCursor {
    name: String,
    stream: Arc<EmbeddedStream>,
    filter: Pattern,
    store: OffsetStore,
    dlq: Log,
    state: Mutex<Position>,
    /// Held while the offset file is written (see "Locks"); taken before `state`.
    commit: Mutex<()>,
    commit_every: usize,
    clamped_from: Option<u64>,
    /// Serialises drains and redrives of the durable DLQ (list, hand over, remove).
    dlq_ops: Mutex<()>,
    /// Registered (weakly) with the stream, which wakes the feeder on appends while this
    /// cursor lives.
    waker: Arc<CursorWaker>,
}

/// What opening a cursor found.
pub(crate) struct Opened {
    pub(crate) store: OffsetStore,
    pub(crate) dlq: Log,
    pub(crate) position: u64,
    pub(crate) clamped_from: Option<u64>,
}

impl EmbeddedCursor {
    pub(crate) fn new(
        name: &str,
        stream: Arc<EmbeddedStream>,
        filter: Pattern,
        opened: Opened,
        waker: CursorWaker,
    ) -> Self {
        let waker = Arc::new(waker);
        stream.add_waker(&waker);
        let commit_every = stream.commit_every;
        Self {
            name: name.to_owned(),
            stream,
            filter,
            store: opened.store,
            dlq: opened.dlq,
            state: Mutex::new(Position {
                cursor: opened.position,
                pending: BTreeSet::new(),
                committed: opened.position,
                since_commit: 0,
                counting_since: Instant::now(),
                skipped: 0,
                skipped_by_filter: 0,
                unreadable: 0,
                unreadable_reason: None,
                error: None,
                retired: false,
                poisoned: None,
            }),
            commit: Mutex::new(()),
            commit_every,
            clamped_from: opened.clamped_from,
            dlq_ops: Mutex::new(()),
            waker,
        }
    }

    fn wake(&self) {
        self.waker.wake();
    }

    /// Write the watermark if it moved (never once retired or poisoned); errors are
    /// logged (a failed write poisons the cursor).
    fn flush(&self, commit: MutexGuard<'_, ()>) {
        match self.commit_watermark(&commit) {
            Ok(_) | Err(StreamError::Closed | StreamError::Poisoned(_)) => {}
            Err(e) => tracing::error!("tidings: durable {}: {e}", self.name),
        }
    }

    /// Write the watermark if it moved since the last write; returns the committed
    /// position. The write runs with `state` unlocked (see "Locks"): `commit` keeps it in
    /// order with every other write, and it records as committed only what it wrote.
    fn commit_watermark(&self, _commit: &MutexGuard<'_, ()>) -> Result<u64, StreamError> {
        let position = {
            let mut st = self.state.lock();
            if st.retired {
                return Err(StreamError::Closed);
            }
            if let Some(p) = &st.poisoned {
                return Err(p.clone().into());
            }
            // Completions from now on count towards the next write.
            st.since_commit = 0;
            st.counting_since = Instant::now();
            let wm = st.watermark();
            if wm == st.committed {
                return Ok(wm); // the file holds it already
            }
            wm
        };
        let stored = self.store.store(position);
        let mut st = self.state.lock();
        self.record_commit(&mut st, position, stored)?;
        Ok(position)
    }

    /// Record the outcome of writing `position`: committed, or the cursor poisoned (never
    /// retried: after a failed fsync the file's state is unknown).
    fn record_commit(
        &self,
        st: &mut Position,
        position: u64,
        stored: Result<(), StreamError>,
    ) -> Result<(), StreamError> {
        match stored {
            Ok(()) => {
                st.committed = position;
                Ok(())
            }
            Err(e) => {
                let failed = CommitFailed {
                    path: self.store.path().to_path_buf(),
                    position,
                    reason: e.to_string(),
                };
                st.error = Some(failed.to_string());
                st.poisoned = Some(failed.clone());
                Err(failed.into())
            }
        }
    }

    /// Goes on past the damaged record at `from` that a read reported as `damage`: at the
    /// next readable record, the offsets in between counted (see "Damaged records").
    /// `Ok(false)` when nothing was skipped (a read starting at `from` can go on now: the
    /// damage lay before it, on the way there); `Err` (the cursor halted) when nothing
    /// readable follows the damage.
    fn skip_unreadable(&self, from: u64, damage: &ReadError) -> Result<bool, StreamError> {
        let next = match self.stream.log.next_readable(from) {
            Ok(next) => next,
            Err(e) => {
                let e = self.stream.read_error(e);
                self.halt(&e);
                return Err(e);
            }
        };
        if next <= from {
            return Ok(false);
        }
        let mut st = self.state.lock();
        if st.cursor == from {
            let n = next - from;
            let why = format!("offsets {from}..{next} ({n} record(s)) skipped: {damage}");
            tracing::error!("tidings: durable {}: unreadable {why}", self.name);
            st.unreadable += n;
            st.unreadable_reason = Some(why);
            st.cursor = next;
        }
        Ok(true)
    }

    /// Stop fetching: `e` shows in [`CursorState::error`] until a seek.
    fn halt(&self, e: &StreamError) {
        tracing::error!("tidings: durable {} halted: {e}", self.name);
        self.state.lock().error = Some(e.to_string());
    }

    /// `offset` finished (delivered, dead-lettered durably, or filtered). Every
    /// `commit_every` completions, or at the first one [`COMMIT_AT_LEAST_EVERY`] after the
    /// last write, the watermark is written, unless a write is under way (then the count
    /// stays due: see "Locks").
    fn finish_offset(&self, offset: u64) {
        let due = {
            let mut st = self.state.lock();
            if st.pending.remove(&offset) {
                st.since_commit += 1;
            }
            st.since_commit >= self.commit_every
                || (st.since_commit > 0 && st.counting_since.elapsed() >= COMMIT_AT_LEAST_EVERY)
        };
        if due && let Some(commit) = self.commit.try_lock() {
            self.flush(commit);
        }
    }

    /// The live entries of the durable DLQ with their DLQ offsets, oldest first: the log
    /// replayed, removed entries left out.
    fn dlq_entries(&self) -> Result<Vec<(u64, DurableDeadLetter)>, StreamError> {
        let log = &self.dlq;
        let dir = log.dir().to_path_buf();
        let mut entries = BTreeMap::new();
        let mut from = log.start_offset();
        loop {
            let recs = log
                .read(from, 256)
                .map_err(|source| StreamError::read(dir.clone(), source))?;
            if recs.is_empty() {
                return Ok(entries.into_iter().collect());
            }
            for r in recs {
                let at = r.offset;
                from = at + 1;
                let record = dlq_record::decode_any(r).map_err(|reason| StreamError::Decode {
                    dir: dir.clone(),
                    offset: at,
                    reason,
                })?;
                match record {
                    dlq_record::DlqRecord::Entry(message, meta) => {
                        entries.insert(
                            at,
                            DurableDeadLetter::new(*message, meta.reason, meta.attempts),
                        );
                    }
                    dlq_record::DlqRecord::Removed(gone) => {
                        for g in gone {
                            entries.remove(&g);
                        }
                    }
                }
            }
        }
    }

    /// Durably record that the entries at these DLQ offsets left the DLQ.
    fn remove_dlq(&self, offsets: &[u64]) -> Result<(), StreamError> {
        self.dlq
            .append(&dlq_record::encode_removal(offsets))
            .map(drop)
            .map_err(|source| StreamError::append(self.dlq.dir().to_path_buf(), source))
    }

    fn append_dlq(
        &self,
        message: &Message,
        reason: &DeadLetterReason,
        attempts: u32,
        offset: u64,
    ) -> Result<u64, StreamError> {
        let rec = dlq_record::encode(message, reason, attempts, offset);
        self.dlq
            .append(&rec)
            .map_err(|source| StreamError::append(self.dlq.dir().to_path_buf(), source))
    }

    fn check_open(&self) -> Result<(), StreamError> {
        if self.state.lock().retired {
            return Err(StreamError::Closed);
        }
        Ok(())
    }
}

impl BackendCursor for EmbeddedCursor {
    fn fetch(&self, max: usize) -> Result<Vec<Message>, StreamError> {
        let mut out = Vec::new();
        // The offset a read failed at and `skip_unreadable` said could be read again: a
        // second failure there halts (never a loop).
        let mut retried = None;
        while out.is_empty() {
            let from = {
                let st = self.state.lock();
                if st.retired {
                    return Err(StreamError::Closed);
                }
                if st.error.is_some() {
                    // Halted (the error is in `state()`): nothing until a seek.
                    return Ok(out);
                }
                st.cursor
            };
            let records = match self.stream.log.read(from, max.clamp(1, BATCH)) {
                Ok(r) => r,
                Err(ReadError::OutOfRetention { earliest, .. }) => {
                    // Retention, not memory, is the limit (R-BP-2): skip what is gone,
                    // counted.
                    let mut st = self.state.lock();
                    if st.cursor == from {
                        st.skipped += earliest - from;
                        st.cursor = earliest;
                        tracing::warn!(
                            "tidings: durable {} skipped offsets {from}..{earliest} removed by retention",
                            self.name
                        );
                    }
                    continue;
                }
                Err(ReadError::BeyondEnd { .. }) => return Ok(out),
                Err(e @ ReadError::Corrupt { .. }) if retried != Some(from) => {
                    if !self.skip_unreadable(from, &e)? {
                        retried = Some(from);
                    }
                    continue;
                }
                Err(e) => {
                    let e = self.stream.read_error(e);
                    self.halt(&e);
                    return Err(e);
                }
            };
            if records.is_empty() {
                return Ok(out);
            }
            for rec in records {
                let offset = rec.offset;
                let (message, target) = match codec::decode_targeted(rec) {
                    Ok(decoded) => decoded,
                    Err(reason) => {
                        // Never skip what we cannot read: stop here, say why (R-LIM-2).
                        let e = StreamError::Decode {
                            dir: self.stream.dir.clone(),
                            offset,
                            reason,
                        };
                        self.halt(&e);
                        return if out.is_empty() { Err(e) } else { Ok(out) };
                    }
                };
                let matches = self.filter.matches(message.topic());
                // A redrive copy is for one durable subscription only.
                let for_us = target.as_ref().is_none_or(|t| *t == self.name);
                let mut st = self.state.lock();
                if st.cursor != offset {
                    break; // a seek moved the cursor: read from there.
                }
                st.cursor = offset + 1;
                if !matches {
                    st.skipped_by_filter += 1;
                }
                if matches && for_us {
                    st.pending.insert(offset);
                    out.push(message);
                }
            }
        }
        Ok(out)
    }

    fn finish(&self, done: &[Finished]) -> Result<(), StreamError> {
        let mut first_error = None;
        for f in done {
            let Some(offset) = f.message.offset() else {
                continue;
            };
            if self.state.lock().retired {
                // Finished after close: not committed, redelivered after a restart.
                continue;
            }
            if let Outcome::DeadLettered { reason, attempts } = &f.outcome
                && let Err(e) = self.append_dlq(&f.message, reason, *attempts, offset)
            {
                // Not durable in the DLQ: never commit past it (redelivered after restart).
                tracing::error!("tidings: durable {} DLQ append failed: {e}", self.name);
                self.state.lock().error = Some(e.to_string());
                first_error.get_or_insert(e);
                continue;
            }
            self.finish_offset(offset);
        }
        first_error.map_or(Ok(()), Err)
    }

    fn idle(&self) {
        self.flush(self.commit.lock());
    }

    fn seek(&self, at: StartAt) -> Result<u64, StreamError> {
        let _commit = self.commit.lock();
        let target = self.stream.resolve(at)?;
        {
            let st = self.state.lock();
            if st.retired {
                return Err(StreamError::Closed);
            }
            if let Some(p) = &st.poisoned {
                return Err(p.clone().into());
            }
        }
        // Written with `state` unlocked (see "Locks"): `state()` never waits for the disk.
        // `commit` keeps the cursor from retiring meanwhile; fetches and completions made
        // meanwhile count as made before the seek (it moves the cursor and drops them).
        let stored = self.store.store(target);
        let mut st = self.state.lock();
        self.record_commit(&mut st, target, stored)?;
        st.since_commit = 0;
        st.counting_since = Instant::now();
        st.cursor = target;
        st.pending.clear();
        st.error = None;
        drop(st);
        self.wake();
        Ok(target)
    }

    fn commit(&self) -> Result<u64, StreamError> {
        self.commit_watermark(&self.commit.lock())
    }

    fn state(&self) -> CursorState {
        let st = self.state.lock();
        CursorState {
            position: st.cursor,
            committed: st.committed,
            outstanding: st.pending.len(),
            lag: self.stream.log.end_offset().saturating_sub(st.committed),
            skipped: st.skipped,
            skipped_by_filter: st.skipped_by_filter,
            unreadable: st.unreadable,
            unreadable_reason: st.unreadable_reason.clone(),
            error: st.error.clone(),
            poisoned: st.poisoned.clone(),
            clamped_from: self.clamped_from,
        }
    }

    fn outstanding(&self) -> usize {
        // Without the lag, which reads the log's end.
        self.state.lock().pending.len()
    }

    fn dead_letters(&self) -> Result<Vec<DurableDeadLetter>, StreamError> {
        Ok(self.dlq_entries()?.into_iter().map(|(_, e)| e).collect())
    }

    fn drain_dead_letters(&self) -> Result<Vec<DurableDeadLetter>, StreamError> {
        let _ops = self.dlq_ops.lock();
        self.check_open()?;
        let entries = self.dlq_entries()?;
        let offsets: Vec<u64> = entries.iter().map(|(at, _)| *at).collect();
        if !offsets.is_empty() {
            self.remove_dlq(&offsets)?;
        }
        Ok(entries.into_iter().map(|(_, e)| e).collect())
    }

    fn redrive_dead_letters(
        &self,
        select: &mut dyn FnMut(&DurableDeadLetter) -> bool,
    ) -> Result<usize, StreamError> {
        let _ops = self.dlq_ops.lock();
        self.check_open()?;
        let stream = &self.stream;
        let mut done = Vec::new();
        let mut failure = None;
        for (at, e) in self.dlq_entries()? {
            if !select(&e) {
                continue;
            }
            match stream.append_record(&codec::encode_for(&e.message, &self.name)) {
                Ok(_) => done.push(at),
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        if !done.is_empty() {
            // Synced to the stream before the entries leave the DLQ (loss-safe).
            stream.sync()?;
            self.remove_dlq(&done)?;
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(done.len()),
        }
    }

    fn close(&self) {
        // Held until `retired` is set: no write follows the final one.
        let commit = self.commit.lock();
        if self.state.lock().retired {
            return;
        }
        match self.commit_watermark(&commit) {
            Ok(_) | Err(StreamError::Closed | StreamError::Poisoned(_)) => {}
            Err(e) => tracing::error!("tidings: durable {}: {e}", self.name),
        }
        let mut st = self.state.lock();
        st.retired = true;
        if let Err(e) = self.dlq.close() {
            tracing::error!("tidings: durable {} closing its DLQ log: {e}", self.name);
        }
    }
}
