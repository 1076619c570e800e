//! Background writeback of the active segment, and asynchronous seals, under [`Fsync::Never`]
//! and [`Fsync::Interval`].
//!
//! # Why
//!
//! A roll syncs the old segment on the append path, whatever the policy, so that a sealed
//! segment is always complete on disk (the [recovery rule](crate#recovery-rules) that lets
//! `open` treat a bad record in a sealed segment as corruption, not as a torn tail). Left to
//! itself, that sync finds the whole segment dirty (64 MiB by default) and the append that rolls
//! waits for all of it to reach the disk. This thread syncs the active segment every
//! [`threshold`] bytes handed to the storage, while the writer keeps appending, so that the
//! roll's sync has little left to write.
//!
//! # Why it keeps every guarantee
//!
//! It only adds syncs: a sync never makes a crash leave less on disk, so recovery sees either
//! what it saw before or more of the same prefix. It never touches the writer lock, the write
//! buffer or any file name. A sync that succeeds raises [`Log::durable_offset`] to the records
//! written before it started (they are in that file, or in a sealed segment, synced at its
//! roll). A sync that fails poisons the writer, exactly like a failed group commit: the kernel
//! may have dropped the dirty pages, so no later sync may claim them.
//!
//! # Asynchronous seal
//!
//! Writeback alone still leaves the append that rolls waiting for the old segment's last dirty
//! step, its index files, the new segment's creation and three syncs. Under `Never` and
//! `Interval` the roll hands all of that to this thread instead:
//!
//! 1. The writer (under its lock) flushes the old segment `k`, creates the new segment `k+1`
//!    under a temporary name (`<name>.seg.tmp`, see [`pending_path`]) with its header, not
//!    synced, makes it the active segment (readers see it at once, as after any roll) and queues
//!    the seal. Appends go on into the temporary file.
//! 2. This thread, before any other request and in roll order: `fdatasync` of `k` (then everything below `k`'s
//!    end is durable and is marked so); `k`'s index files (best effort, as before); `fdatasync`
//!    of `k+1` (its header and whatever was appended so far); `rename` to its real name;
//!    `fsync` of the directory. Only then is `k+1` *published*.
//!
//! So the rule recovery relies on — *segment k+1 exists ⇒ segment k is synced*, and a segment
//! file that exists starts with a durable header — holds exactly as with the synchronous roll:
//! the name `k+1.seg` appears only after both syncs. A crash before it leaves `k+1.seg.tmp` and
//! `k` as the last segment. Recovery adopts the temporary file when `k` turns out complete (a
//! process kill: the page cache survives, so nothing but the write buffer is lost) and removes
//! it otherwise (a power cut took part of `k`: then the records after the cut, none of which
//! was reported durable, go with it); see [the recovery rules](crate#recovery-rules).
//!
//! * **Durability.** A sync of an unpublished file proves nothing (its name may not survive):
//!   [`wait_published`] holds every sync that must make `k+1`'s records durable (group commit,
//!   so [`Log::sync`], close and the `Interval` flusher) until the seal is done, and the
//!   writeback below raises the durable offset only for a published segment. `Fsync::Always`
//!   rolls synchronously as before (each of its appends syncs anyway, so the old segment has
//!   nothing dirty left at a roll).
//! * **Back-pressure.** At most [`MAX_PENDING_SEALS`] seals are pending: the roll that would
//!   start one more waits until the oldest is done. The records written meanwhile sit in the
//!   temporary files (the page cache), not in memory: the writer's memory stays bounded by its
//!   write buffer, and the unpublished data by that many segments.
//! * **Failure.** A failed step poisons the writer, like a failed writeback: the next append,
//!   sync or close returns [`AppendError::Poisoned`], and waiters for the seal are woken with it.
//! * **Close.** Stopping this thread finishes the queued seals first (only plain writeback
//!   requests are dropped), so a clean close always leaves every segment published.
//!
//! [`pending_path`]: crate::segment::pending_path
//! [`Log::sync`]: crate::Log::sync
//! [`AppendError::Poisoned`]: crate::AppendError::Poisoned
//! [`Fsync::Never`]: crate::Fsync::Never
//! [`Fsync::Interval`]: crate::Fsync::Interval
//! [`Log::durable_offset`]: crate::Log::durable_offset

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

use crate::config::LogConfig;
use crate::error::AppendError;
use crate::index::SealedInfo;
use crate::log::Shared;
use crate::recovery::write_index_files;
use crate::segment::Segment;

/// How many rolls may wait for their seal at once. The append that would start one more waits
/// for the oldest (back-pressure); the unpublished data is then at most this many segments, in
/// the page cache, not in memory. More than one lets a burst of rolls (small segments, a disk
/// slower than the appender for a moment) go on appending while the seals catch up.
pub(crate) const MAX_PENDING_SEALS: usize = 4;

/// Largest writeback step: the most a roll's sync has to write when the disk keeps up.
const MAX_STEP: u64 = 8 << 20;

/// Bytes handed to the storage between two writeback requests: an eighth of a segment, at most
/// [`MAX_STEP`]. Proportional, so that small segments (the fault-injection tests) exercise the
/// background syncs too.
pub(crate) fn threshold(config: &LogConfig) -> u64 {
    (config.segment_bytes / 8).clamp(1, MAX_STEP)
}

/// The request slots shared by the writer (which fills them) and the thread (which empties
/// them).
#[derive(Debug, Default)]
pub(crate) struct Requests {
    slot: Mutex<Slot>,
    /// Wakes the thread.
    cv: Condvar,
    /// Wakes [`wait_published`] callers when a seal ends (published or failed).
    sealed: Condvar,
}

#[derive(Debug, Default)]
struct Slot {
    /// The segment to sync and the offset below which every record is in it or before it.
    job: Option<(Arc<Segment>, u64)>,
    /// The seals queued by rolls, oldest first, run before any `job`.
    seals: VecDeque<Seal>,
    stop: bool,
    /// The thread has ended: no queued seal will run any more.
    stopped: bool,
}

/// The old segment `k`, complete in its file, and the unpublished `k+1`.
#[derive(Debug)]
struct Seal {
    old: Arc<Segment>,
    new: Arc<Segment>,
    tmp: PathBuf,
}

impl Requests {
    /// Asks for a sync of `seg` covering the records below `end`; replaces a request not yet
    /// started (the newer one covers it). Never blocks on I/O.
    pub(crate) fn request(&self, seg: &Arc<Segment>, end: u64) {
        let mut slot = self.slot.lock();
        slot.job = Some((seg.clone(), end));
        self.cv.notify_one();
    }

    /// Queues the seal of `old` that publishes `new` (written at `tmp`), after those queued
    /// before (each publishes the segment the next one seals). The caller bounds how many are
    /// pending ([`MAX_PENDING_SEALS`]).
    pub(crate) fn seal(&self, old: Arc<Segment>, new: Arc<Segment>, tmp: PathBuf) {
        let mut slot = self.slot.lock();
        debug_assert!(
            slot.seals.len() < MAX_PENDING_SEALS,
            "too many seals pending"
        );
        slot.seals.push_back(Seal { old, new, tmp });
        self.cv.notify_one();
    }
}

/// Returns once `seg` is published (at once for every segment but one whose seal is pending);
/// [`AppendError::Poisoned`] if the seal failed or the writer was poisoned meanwhile.
pub(crate) fn wait_published(sh: &Shared, seg: &Segment) -> Result<(), AppendError> {
    if seg.is_published() {
        return Ok(());
    }
    let reqs = &sh.writeback;
    let mut slot = reqs.slot.lock();
    loop {
        if seg.is_published() {
            return Ok(());
        }
        if sh.commit.is_poisoned() {
            return Err(AppendError::Poisoned);
        }
        if slot.stopped {
            // Unreachable in practice: the thread runs a queued seal before it stops.
            return Err(AppendError::Closed);
        }
        reqs.sealed.wait(&mut slot);
    }
}

/// The thread; stopped and joined by [`Writeback::stop`] (the log's close and drop).
#[derive(Debug)]
pub(crate) struct Writeback {
    sh: Arc<Shared>,
    handle: Option<JoinHandle<()>>,
}

impl Writeback {
    pub(crate) fn spawn(sh: Arc<Shared>) -> std::io::Result<Self> {
        let sh2 = sh.clone();
        let handle = std::thread::Builder::new()
            .name("tidings-log-writeback".into())
            .spawn(move || run(&sh2))?;
        Ok(Self {
            sh,
            handle: Some(handle),
        })
    }

    /// Stops the thread after the sync it is running and the seal queued, if any, and joins it.
    /// A writeback request not yet started is dropped: close performs its own flush or sync.
    pub(crate) fn stop(&mut self) {
        let reqs = &self.sh.writeback;
        reqs.slot.lock().stop = true;
        reqs.cv.notify_all();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

enum Work {
    Seal(Seal),
    Sync(Arc<Segment>, u64),
}

fn run(sh: &Shared) {
    let reqs = &sh.writeback;
    loop {
        let work = {
            let mut slot = reqs.slot.lock();
            loop {
                if let Some(seal) = slot.seals.pop_front() {
                    break Work::Seal(seal);
                }
                if slot.stop {
                    slot.stopped = true;
                    reqs.sealed.notify_all();
                    return;
                }
                if let Some((seg, end)) = slot.job.take() {
                    break Work::Sync(seg, end);
                }
                reqs.cv.wait(&mut slot);
            }
        };
        match work {
            Work::Seal(seal) => {
                // A failure poisoned the writer: the next append or sync reports it.
                let _ = run_seal(sh, &seal);
                // Under the lock, so that a waiter cannot miss the wake-up between its check
                // and its wait.
                let _slot = reqs.slot.lock();
                reqs.sealed.notify_all();
            }
            Work::Sync(seg, end) => {
                if sh.commit.is_poisoned() {
                    continue;
                }
                match seg.file.sync_data() {
                    // Durable only under its real name: an unpublished segment waits for its
                    // seal (queued before this request, so run before it; this is a safeguard).
                    Ok(()) if seg.is_published() => sh.commit.mark_durable(sh, end),
                    Ok(()) => {}
                    Err(e) => {
                        let _ = sh.commit.poison_with(&seg.path, e);
                    }
                }
            }
        }
    }
}

/// The seal's steps (see the [module docs](self)); a failure poisons the writer.
fn run_seal(sh: &Shared, s: &Seal) -> Result<(), AppendError> {
    if sh.commit.is_poisoned() {
        return Err(AppendError::Poisoned);
    }
    let old = &s.old;
    old.file
        .sync_data()
        .map_err(|e| sh.commit.poison_with(&old.path, e))?;
    sh.commit.mark_durable(sh, old.end());
    let info = SealedInfo {
        covered_len: old.size(),
        end: old.end(),
        max_ts: old.max_ts.load(Ordering::Acquire),
    };
    // Best effort: index files are checked on load and rebuilt when missing or bad.
    let _ = write_index_files(&*sh.storage, &sh.dir, old.base, &info, &old.index.read());
    let new = &s.new;
    new.file
        .sync_data()
        .map_err(|e| sh.commit.poison_with(&s.tmp, e))?;
    sh.storage
        .rename(&s.tmp, &new.path)
        .map_err(|e| sh.commit.poison_with(&new.path, e))?;
    sh.storage
        .sync_dir(&sh.dir)
        .map_err(|e| sh.commit.poison_with(&sh.dir, e))?;
    new.published.store(true, Ordering::Release);
    Ok(())
}
