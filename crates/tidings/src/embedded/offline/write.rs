//! The writing operations on a data directory: seek, redrive, purge. Each first takes the
//! stream log's lock (refusing while a broker holds it), then the dead-letter log's.

use std::io;
use std::path::{Path, PathBuf};

use tidings_log::{Fsync, Log, LogConfig, OpenError, StoredRecord};

use super::dlq_store::{log_present, mark_removed, redrive_record};
use super::{DataDir, DlqActionOutcome, SeekOutcome, Selection};
use super::{PurgeError, RedriveError, SeekError};
use crate::durable::{StartAt, StreamError};
use crate::embedded::offset_store::OffsetStore;
use crate::embedded::stream::resolve;

/// Records per appended-and-synced redrive batch.
const REDRIVE_BATCH: usize = 256;

/// Map a log open failure of a write operation.
enum Opened {
    Log(Log),
    Locked(PathBuf),
}

fn open_for_write(dir: &Path) -> Result<Opened, StreamError> {
    let config = LogConfig::new().fsync(Fsync::Always);
    match Log::open(dir, config) {
        Ok((log, _)) => Ok(Opened::Log(log)),
        Err(OpenError::Locked { path }) => Ok(Opened::Locked(path)),
        Err(source) => Err(StreamError::open(dir.to_path_buf(), source)),
    }
}

fn close_log(log: &Log) -> Result<(), StreamError> {
    log.close().map_err(|e| {
        StreamError::io(
            log.dir(),
            io::Error::other(format!("closing the log failed: {e}")),
        )
    })
}

impl DataDir {
    /// Move a durable subscription's committed position (R-LOG-4): it resumes there when
    /// a broker next subscribes it. Refuses while a broker has the stream open.
    ///
    /// # Errors
    /// [`SeekError::Locked`]; unknown names; [`StreamError::OutOfRetention`] /
    /// [`StreamError::BeyondEnd`] (inside [`SeekError::Stream`]) for an offset outside the
    /// stream. Nothing changes on error.
    pub fn seek(&self, stream: &str, name: &str, at: StartAt) -> Result<SeekOutcome, SeekError> {
        self.require_consumer(stream, name)?;
        let sdir = self.stream_dir(stream);
        let log = match open_for_write(&sdir).map_err(SeekError::Stream)? {
            Opened::Log(log) => log,
            Opened::Locked(path) => return Err(SeekError::Locked { path }),
        };
        let result = (|| {
            let store = OffsetStore::new(
                std::sync::Arc::new(tidings_log::FsStorage),
                &self.consumer_dir(stream),
                name,
            );
            let previous = store.load()?.unwrap_or(0);
            let target = resolve(&log, &sdir, at)?;
            store.store(target)?;
            Ok(SeekOutcome {
                stream: stream.to_owned(),
                name: name.to_owned(),
                previous,
                committed: target,
            })
        })();
        let closed = close_log(&log);
        let out = result.map_err(SeekError::Stream)?;
        closed.map_err(SeekError::Stream)?;
        Ok(out)
    }

    /// Redrive dead letters back into the stream, loss-safe (see the module docs): each
    /// batch of up to 256 is appended, synced, and only then marked removed.
    /// `progress(done, total)` is called after each batch. Refuses while a broker has the
    /// stream or the subscription open.
    ///
    /// # Errors
    /// [`RedriveError::Locked`]; unknown names or entries (nothing redriven); a failed
    /// append, sync or removal record (the batches before it stay redriven).
    pub fn redrive(
        &self,
        stream: &str,
        name: &str,
        selection: &Selection,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DlqActionOutcome, RedriveError> {
        self.require_consumer(stream, name)?;
        let sdir = self.stream_dir(stream);
        let log = match open_for_write(&sdir).map_err(RedriveError::Stream)? {
            Opened::Log(log) => log,
            Opened::Locked(path) => return Err(RedriveError::Locked { path }),
        };
        let result = self.redrive_into(&log, stream, name, selection, progress);
        let closed = close_log(&log);
        let out = result?;
        closed.map_err(RedriveError::Stream)?;
        Ok(out)
    }

    fn redrive_into(
        &self,
        log: &Log,
        stream: &str,
        name: &str,
        selection: &Selection,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DlqActionOutcome, RedriveError> {
        let dlq_dir = self.dlq_dir(stream, name);
        let mut outcome = DlqActionOutcome {
            stream: stream.to_owned(),
            name: name.to_owned(),
            entries: Vec::new(),
            stream_offsets: Vec::new(),
            remaining: 0,
        };
        let Some(Picked {
            dlq,
            chosen,
            remaining,
        }) = self.select(&dlq_dir, selection).map_err(|e| match e {
            Selected::Locked(path) => RedriveError::Locked { path },
            Selected::Unknown(entry) => RedriveError::UnknownEntry {
                stream: stream.to_owned(),
                name: name.to_owned(),
                entry,
            },
            Selected::Stream(e) => RedriveError::Stream(e),
        })?
        else {
            return Ok(outcome);
        };
        let total = chosen.len() as u64;
        let result = (|| {
            for batch in chosen.chunks(REDRIVE_BATCH) {
                let records: Vec<_> = batch.iter().map(|r| redrive_record(r, name)).collect();
                let range = log
                    .append_batch(&records)
                    .map_err(|source| StreamError::append(log.dir().to_path_buf(), source))?;
                log.sync()
                    .map_err(|source| StreamError::append(log.dir().to_path_buf(), source))?;
                // Durable in the stream: now, and only now, the entries may leave the DLQ.
                let ids: Vec<u64> = batch.iter().map(|r| r.offset).collect();
                mark_removed(&dlq, &ids)?;
                outcome.entries.extend(ids);
                outcome.stream_offsets.extend(range);
                progress(outcome.entries.len() as u64, total);
            }
            Ok::<_, StreamError>(())
        })();
        let closed = close_log(&dlq);
        result.map_err(RedriveError::Stream)?;
        closed.map_err(RedriveError::Stream)?;
        outcome.remaining = remaining;
        Ok(outcome)
    }

    /// Remove dead letters from a durable subscription's dead-letter log without
    /// redriving them. `progress(done, total)` is called once they are removed. Refuses
    /// while a broker has the stream or the subscription open.
    ///
    /// # Errors
    /// [`PurgeError::Locked`]; unknown names or entries; an unreadable log or a failed
    /// write of the removed-entries file. Nothing changes on error.
    pub fn purge(
        &self,
        stream: &str,
        name: &str,
        selection: &Selection,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DlqActionOutcome, PurgeError> {
        self.require_consumer(stream, name)?;
        let sdir = self.stream_dir(stream);
        let log = match open_for_write(&sdir).map_err(PurgeError::Stream)? {
            Opened::Log(log) => log,
            Opened::Locked(path) => return Err(PurgeError::Locked { path }),
        };
        let dlq_dir = self.dlq_dir(stream, name);
        let mut outcome = DlqActionOutcome {
            stream: stream.to_owned(),
            name: name.to_owned(),
            entries: Vec::new(),
            stream_offsets: Vec::new(),
            remaining: 0,
        };
        let result = match self.select(&dlq_dir, selection) {
            Err(Selected::Locked(path)) => Err(PurgeError::Locked { path }),
            Err(Selected::Unknown(entry)) => Err(PurgeError::UnknownEntry {
                stream: stream.to_owned(),
                name: name.to_owned(),
                entry,
            }),
            Err(Selected::Stream(e)) => Err(PurgeError::Stream(e)),
            Ok(None) => Ok(()),
            Ok(Some(Picked {
                dlq,
                chosen,
                remaining,
            })) => {
                let ids: Vec<u64> = chosen.iter().map(|r| r.offset).collect();
                let stored = mark_removed(&dlq, &ids);
                let closed = close_log(&dlq);
                stored.and(closed).map_err(PurgeError::Stream).map(|()| {
                    outcome.entries = ids;
                    outcome.remaining = remaining;
                    progress(chosen.len() as u64, chosen.len() as u64);
                })
            }
        };
        let closed = close_log(&log);
        result?;
        closed.map_err(PurgeError::Stream)?;
        Ok(outcome)
    }

    /// Open the dead-letter log (taking its lock) and pick the selected present entries.
    /// `None` when the subscription has no dead-letter log.
    fn select(&self, dlq_dir: &Path, selection: &Selection) -> Result<Option<Picked>, Selected> {
        if !dlq_dir.is_dir() {
            return match selection {
                Selection::Entries(ids) if !ids.is_empty() => Err(Selected::Unknown(ids[0])),
                _ => Ok(None),
            };
        }
        let dlq = match open_for_write(dlq_dir).map_err(Selected::Stream)? {
            Opened::Log(log) => log,
            Opened::Locked(path) => return Err(Selected::Locked(path)),
        };
        let picked = (|| {
            let present = log_present(&dlq).map_err(Selected::Stream)?;
            let total = present.len() as u64;
            let chosen: Vec<StoredRecord> = match selection {
                Selection::All => present,
                Selection::Entries(ids) => {
                    let mut ids = ids.clone();
                    ids.sort_unstable();
                    ids.dedup();
                    let mut chosen = Vec::with_capacity(ids.len());
                    for id in ids {
                        let i = present
                            .binary_search_by_key(&id, |r| r.offset)
                            .map_err(|_| Selected::Unknown(id))?;
                        chosen.push(present[i].clone());
                    }
                    chosen
                }
            };
            let remaining = total - chosen.len() as u64;
            Ok((chosen, remaining))
        })();
        match picked {
            Ok((chosen, remaining)) => Ok(Some(Picked {
                dlq,
                chosen,
                remaining,
            })),
            Err(e) => {
                let _ = close_log(&dlq);
                Err(e)
            }
        }
    }
}

/// The open dead-letter log, the chosen present records and how many present records are
/// not chosen.
struct Picked {
    dlq: Log,
    chosen: Vec<StoredRecord>,
    remaining: u64,
}

/// Why selecting entries failed (mapped into each operation's error).
enum Selected {
    Locked(PathBuf),
    Unknown(u64),
    Stream(StreamError),
}
