//! Durability: group commit, the poison flag, and the interval flusher thread.
//!
//! # Group commit
//!
//! `sync_to(target)` returns once everything below `target` is durable. The first caller that
//! finds no sync in flight becomes the *leader*: it takes the writer lock just long enough to
//! flush the write buffer and note the next offset `end`, releases it, syncs the active segment
//! (`fdatasync`) and publishes `durable = end` — covering every record written before it started,
//! including those of threads now waiting. Callers whose target is not yet covered wait on a
//! condition variable and re-check; one of them leads the next round. Sealed segments were synced
//! when they were rolled, so syncing the active segment is enough — once it is published: a
//! leader that finds the active segment's [asynchronous seal](crate::writeback#asynchronous-seal)
//! still running waits for it first. Before capturing `end`, a
//! leader yields while other appenders are in the middle of writing (at most 200 µs, not at all
//! for a lone appender) so that their records join the batch.
//!
//! # Poison
//!
//! A failed write or sync sets the poison flag for good (as fjall does): after a failed `fsync`
//! the kernel may have dropped the dirty pages, so retrying could report success for data that
//! is gone. Every later append and sync returns [`AppendError::Poisoned`]; `durable_offset` never
//! advances again. Reopening the log re-reads what is really on disk.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};

use crate::config::Fsync;
use crate::error::AppendError;
use crate::log::Shared;

#[derive(Debug)]
pub(crate) struct Commit {
    syncing: Mutex<bool>,
    cv: Condvar,
    durable: AtomicU64,
    poisoned: AtomicBool,
}

impl Commit {
    pub(crate) fn new(durable: u64) -> Self {
        Self {
            syncing: Mutex::new(false),
            cv: Condvar::new(),
            durable: AtomicU64::new(durable),
            poisoned: AtomicBool::new(false),
        }
    }

    pub(crate) fn durable(&self) -> u64 {
        self.durable.load(Ordering::Acquire)
    }

    pub(crate) fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::Acquire)
    }

    /// Poisons the writer and wakes every waiter; returns the error for the failing caller.
    pub(crate) fn poison_with(&self, path: &Path, source: std::io::Error) -> AppendError {
        self.poisoned.store(true, Ordering::Release);
        let _g = self.syncing.lock();
        self.cv.notify_all();
        AppendError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    /// Records that everything below `end` is durable.
    pub(crate) fn mark_durable(&self, sh: &Shared, end: u64) {
        let _g = self.syncing.lock();
        self.durable.fetch_max(end, Ordering::AcqRel);
        if sh.config.fsync == Fsync::Always {
            sh.visible.fetch_max(end, Ordering::SeqCst);
        }
        self.cv.notify_all();
    }

    /// Returns once everything below `target` is durable (leading a sync if none is in flight).
    pub(crate) fn sync_to(&self, sh: &Shared, target: u64) -> Result<(), AppendError> {
        let mut syncing = self.syncing.lock();
        loop {
            if self.durable() >= target {
                return Ok(());
            }
            if self.is_poisoned() {
                return Err(AppendError::Poisoned);
            }
            if *syncing {
                self.cv.wait(&mut syncing);
                continue;
            }
            *syncing = true;
            let result = MutexGuard::unlocked(&mut syncing, || sync_once(sh));
            *syncing = false;
            if let Ok(end) = result {
                self.durable.fetch_max(end, Ordering::AcqRel);
                if sh.config.fsync == Fsync::Always {
                    sh.visible.fetch_max(end, Ordering::SeqCst);
                }
            }
            self.cv.notify_all();
            result?;
        }
    }
}

/// Longest a sync leader waits for appenders that are mid-write to finish, so their records ride
/// the same sync.
const GROUP_WINDOW: Duration = Duration::from_micros(200);

/// One leader round: let in-flight appenders finish their write (at most [`GROUP_WINDOW`], and
/// not at all when nobody else is appending), flush the buffer under the writer lock, sync
/// outside it.
fn sync_once(sh: &Shared) -> Result<u64, AppendError> {
    if sh.appending.load(Ordering::SeqCst) > 0 {
        let start = Instant::now();
        while sh.appending.load(Ordering::SeqCst) > 0 && start.elapsed() < GROUP_WINDOW {
            std::thread::yield_now();
        }
    }
    let (end, seg) = {
        let mut w = sh.writer.lock();
        w.flush(sh)?;
        (w.next, w.active.clone())
    };
    // Records of a segment whose seal is still running are durable only once it is published.
    crate::writeback::wait_published(sh, &seg)?;
    seg.file
        .sync_data()
        .map_err(|e| sh.commit.poison_with(&seg.path, e))?;
    Ok(end)
}

/// The background thread of [`Fsync::Interval`]: every `every`, syncs whatever was written.
#[derive(Debug)]
pub(crate) struct Flusher {
    stop: Arc<(Mutex<bool>, Condvar)>,
    handle: Option<JoinHandle<()>>,
}

impl Flusher {
    pub(crate) fn spawn(sh: Arc<Shared>, every: Duration) -> std::io::Result<Self> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let stop2 = stop.clone();
        let handle = std::thread::Builder::new()
            .name("tidings-log-flush".into())
            .spawn(move || {
                let (lock, cv) = &*stop2;
                let mut stopped = lock.lock();
                while !*stopped {
                    cv.wait_for(&mut stopped, every);
                    if *stopped {
                        break;
                    }
                    MutexGuard::unlocked(&mut stopped, || {
                        let target = sh.written.load(Ordering::Acquire);
                        if target > sh.commit.durable() && !sh.commit.is_poisoned() {
                            let _ = sh.commit.sync_to(&sh, target);
                        }
                    });
                }
            })?;
        Ok(Self {
            stop,
            handle: Some(handle),
        })
    }

    /// Stops the thread and joins it.
    pub(crate) fn stop(&mut self) {
        let (lock, cv) = &*self.stop;
        *lock.lock() = true;
        cv.notify_all();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
