//! Background writeback of the active segment under [`Fsync::Never`] and [`Fsync::Interval`].
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
//! [`Fsync::Never`]: crate::Fsync::Never
//! [`Fsync::Interval`]: crate::Fsync::Interval
//! [`Log::durable_offset`]: crate::Log::durable_offset

use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

use crate::config::LogConfig;
use crate::log::Shared;
use crate::segment::Segment;

/// Largest writeback step: the most a roll's sync has to write when the disk keeps up.
const MAX_STEP: u64 = 8 << 20;

/// Bytes handed to the storage between two writeback requests: an eighth of a segment, at most
/// [`MAX_STEP`]. Proportional, so that small segments (the fault-injection tests) exercise the
/// background syncs too.
pub(crate) fn threshold(config: &LogConfig) -> u64 {
    (config.segment_bytes / 8).clamp(1, MAX_STEP)
}

/// The request slot shared by the writer (which fills it) and the thread (which empties it).
#[derive(Debug, Default)]
pub(crate) struct Requests {
    slot: Mutex<Slot>,
    cv: Condvar,
}

#[derive(Debug, Default)]
struct Slot {
    /// The segment to sync and the offset below which every record is in it or before it.
    job: Option<(Arc<Segment>, u64)>,
    stop: bool,
}

impl Requests {
    /// Asks for a sync of `seg` covering the records below `end`; replaces a request not yet
    /// started (the newer one covers it). Never blocks on I/O.
    pub(crate) fn request(&self, seg: &Arc<Segment>, end: u64) {
        let mut slot = self.slot.lock();
        slot.job = Some((seg.clone(), end));
        self.cv.notify_one();
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

    /// Stops the thread after the sync it is running, if any, and joins it. A request not yet
    /// started is dropped: close performs its own flush or sync.
    pub(crate) fn stop(&mut self) {
        let reqs = &self.sh.writeback;
        reqs.slot.lock().stop = true;
        reqs.cv.notify_all();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn run(sh: &Shared) {
    let reqs = &sh.writeback;
    loop {
        let (seg, end) = {
            let mut slot = reqs.slot.lock();
            loop {
                if slot.stop {
                    return;
                }
                if let Some(job) = slot.job.take() {
                    break job;
                }
                reqs.cv.wait(&mut slot);
            }
        };
        if sh.commit.is_poisoned() {
            continue;
        }
        match seg.file.sync_data() {
            Ok(()) => sh.commit.mark_durable(sh, end),
            Err(e) => {
                let _ = sh.commit.poison_with(&seg.path, e);
            }
        }
    }
}
