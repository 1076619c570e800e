//! The embedded durable backend: streams, cursors, durable DLQs and dedup stores kept in
//! `tidings-log` files under one data directory (R-LOG-1 … R-LOG-4, R-DEL-4, R-DEL-5).
//!
//! [`EmbeddedBackend`] implements the durable-source seam
//! ([`crate::durable::DurableBackend`]); it is what
//! [`BrokerBuilder::data_dir`](crate::BrokerBuilder::data_dir) builds. The broker's
//! durable side (`crate::durable`) never sees the files: it talks to this module only
//! through the seam's traits.
//!
//! # Layout
//!
//! | path | content | module |
//! |---|---|---|
//! | `streams/<stream>/` | the stream's log, one record per message | `stream`, `codec` |
//! | `streams/<stream>/META` | its patterns, retention and duplicate window | `stream_meta` |
//! | `consumers/<stream>/<name>.offset` | a durable subscription's committed position | `offset_store` |
//! | `consumers/<stream>/<name>.dlq/` | its durable dead-letter log | `dlq_record` |
//! | `dedup/<name>/` | a durable dedup store | `dedup_log` |
//!
//! `docs/design.md` describes every encoding; [`offline`] reads and edits the directory
//! without a broker.
//!
//! # Storage and faults
//! Every file — stream logs, offset files, DLQ logs, dedup logs — goes through the
//! backend's [`Storage`], so fault injection (`tidings_log::testing::SimStorage`) reaches
//! all of them. A failed commit fsync poisons the cursor instead of being retried.

pub(crate) mod codec;
mod cursor;
mod dedup_log;
pub(crate) mod dlq_record;
#[cfg(all(test, not(tidings_loom)))]
mod fuzz_targets;
mod id_window;
pub mod offline;
pub(crate) mod offset_store;
mod options;
mod stream;
mod stream_meta;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::SystemTime;

use parking_lot::Mutex;
use tidings_log::{FsStorage, Log, RecoveryReport, Retention, RetentionReport, Storage};

use crate::dedup::DedupStore;
use crate::durable::{BackendStream, Capabilities, DurableBackend, StreamConfig, StreamError};
use crate::topic::Pattern;

pub use dedup_log::DurableDedupStore;
use offset_store::ensure_dir;
pub use options::{
    DEFAULT_COMMIT_EVERY, DEFAULT_DUPLICATE_WINDOW_ENTRIES, DEFAULT_RETENTION_INTERVAL,
    EmbeddedStreamOptions,
};

/// The backend's name in errors and snapshots.
pub(crate) const NAME: &str = "embedded-log";

/// Durable streams in local `tidings-log` files under one data directory: the default
/// backend, built by [`BrokerBuilder::data_dir`](crate::BrokerBuilder::data_dir) (and
/// [`BrokerBuilder::storage`](crate::BrokerBuilder::storage)) with the default
/// [`EmbeddedStreamOptions`]; build one by hand to choose them (fsync policy, segment size,
/// commit cadence, retention timer) for every stream or per stream name.
///
/// One broker per directory at a time: each log holds an advisory lock while open.
///
/// # Files
/// What only a local log has is here, not on the backend-neutral
/// [`Stream`](crate::Stream): a stream's directory ([`stream_dir`](Self::stream_dir)), what
/// opening it recovered ([`recovery`](Self::recovery)), a retention pass on demand
/// ([`apply_retention`](Self::apply_retention)) and a durable subscription's offset file
/// ([`offset_file`](Self::offset_file)). Clones share the streams they opened, so keep one
/// to ask; a broker built by `data_dir` lends its own
/// ([`Broker::embedded_backend`](crate::Broker::embedded_backend)).
///
/// ```
/// # use std::sync::Arc;
/// use tidings::{Broker, StreamConfig, embedded::EmbeddedBackend};
/// let dir = tempfile::tempdir()?;
/// let backend = EmbeddedBackend::new(dir.path());
/// let broker = Broker::builder()
///     .durable_backend(Arc::new(backend.clone()))
///     .build()?;
/// broker.create_stream(StreamConfig::new("orders", ["orders.#"]))?;
/// assert!(backend.recovery("orders").is_some_and(|r| r.created));
/// assert_eq!(backend.stream_dir("orders"), dir.path().join("streams").join("orders"));
/// # broker.close(std::time::Duration::from_secs(1));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct EmbeddedBackend {
    data_dir: PathBuf,
    storage: Arc<dyn Storage>,
    defaults: EmbeddedStreamOptions,
    per_stream: BTreeMap<String, EmbeddedStreamOptions>,
    /// The streams this backend (or a clone of it) opened and that are still open.
    open: Arc<Mutex<BTreeMap<String, Weak<stream::EmbeddedStream>>>>,
}

impl EmbeddedBackend {
    /// Streams in `data_dir` on the real file system, with the default options.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self::with_storage(data_dir, Arc::new(FsStorage))
    }

    /// Streams in `data_dir` read and written through `storage` (a
    /// [`SimStorage`](tidings_log::testing::SimStorage) injects I/O faults and power cuts).
    pub fn with_storage(data_dir: impl Into<PathBuf>, storage: Arc<dyn Storage>) -> Self {
        Self {
            data_dir: data_dir.into(),
            storage,
            defaults: EmbeddedStreamOptions::new(),
            per_stream: BTreeMap::new(),
            open: Arc::default(),
        }
    }

    /// The options of every stream without options of its own (default
    /// [`EmbeddedStreamOptions::new`]).
    #[must_use]
    pub fn stream_defaults(mut self, options: EmbeddedStreamOptions) -> Self {
        self.defaults = options;
        self
    }

    /// The options of the stream called `stream`, instead of the defaults.
    #[must_use]
    pub fn stream_options(
        mut self,
        stream: impl Into<String>,
        options: EmbeddedStreamOptions,
    ) -> Self {
        self.per_stream.insert(stream.into(), options);
        self
    }

    /// The data directory.
    #[must_use]
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The options the stream `stream` is (or would be) opened with.
    pub fn options_for(&self, stream: &str) -> &EmbeddedStreamOptions {
        self.per_stream.get(stream).unwrap_or(&self.defaults)
    }

    /// The log directory of the stream `stream`: `<data_dir>/streams/<stream>`.
    #[must_use]
    pub fn stream_dir(&self, stream: &str) -> PathBuf {
        self.data_dir.join("streams").join(stream)
    }

    /// The file holding the committed position of durable subscription `durable` on
    /// `stream`: `<data_dir>/consumers/<stream>/<durable>.offset`.
    #[must_use]
    pub fn offset_file(&self, stream: &str, durable: &str) -> PathBuf {
        self.consumers_dir(stream).join(format!("{durable}.offset"))
    }

    fn consumers_dir(&self, stream: &str) -> PathBuf {
        self.data_dir.join("consumers").join(stream)
    }

    fn open_stream_named(&self, stream: &str) -> Option<Arc<stream::EmbeddedStream>> {
        self.open.lock().get(stream).and_then(Weak::upgrade)
    }

    /// What opening the stream `stream` found and repaired (torn tail, rebuilt indexes,
    /// ignored files), while it is open; `None` when it is not open through this backend.
    #[must_use]
    pub fn recovery(&self, stream: &str) -> Option<RecoveryReport> {
        self.open_stream_named(stream).map(|s| s.recovery().clone())
    }

    /// Remove the open stream `stream`'s old segments per its retention now, judging age
    /// against `now`. The log does this after every segment roll and the broker on a timer
    /// ([`EmbeddedStreamOptions::retention_interval`]); call it to force a pass.
    ///
    /// # Errors
    /// [`StreamError::UnknownStream`] when it is not open through this backend;
    /// [`StreamError::Retention`] when removing failed.
    pub fn apply_retention(
        &self,
        stream: &str,
        now: SystemTime,
    ) -> Result<RetentionReport, StreamError> {
        self.open_stream_named(stream)
            .ok_or_else(|| StreamError::UnknownStream(stream.to_owned()))?
            .retention_pass(now)
    }
}

impl DurableBackend for EmbeddedBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::all()
    }

    fn open_stream(
        &self,
        config: &StreamConfig,
        _patterns: &[Pattern],
    ) -> Result<Arc<dyn BackendStream>, StreamError> {
        if config.replica_count() != 1 {
            // One log on one disk: a second copy would be a promise it cannot keep (R-DIST-4).
            return Err(StreamError::Unsupported {
                feature: "StreamConfig::replicas above 1",
                backend: NAME,
            });
        }
        let options = self.options_for(&config.name).clone();
        if options.log.retention != Retention::default() {
            return Err(StreamError::Unsupported {
                feature: "LogConfig::retention in EmbeddedStreamOptions (retention is \
                          StreamConfig::retention)",
                backend: NAME,
            });
        }
        let mut log_config = options.log.clone();
        log_config.retention = *config.retention_policy();
        let dir = self.stream_dir(&config.name);
        ensure_dir(&*self.storage, &dir)?;
        let opened =
            Log::open_with_storage(self.storage.clone(), &dir, log_config).map_err(|source| {
                StreamError::Open {
                    dir: dir.clone(),
                    source,
                }
            })?;
        // Checked with the log's lock held: no other broker writes META meanwhile.
        if let Err(e) = stream_meta::check_or_write(
            &*self.storage,
            &dir,
            &config.name,
            &stream_meta::StreamMeta::of(config),
        ) {
            let _ = opened.0.close();
            return Err(e);
        }
        let consumers = self.consumers_dir(&config.name);
        let s = stream::EmbeddedStream::new(
            &config.name,
            opened,
            (dir, consumers),
            self.storage.clone(),
            options,
            config.duplicate_window_duration(),
        );
        let mut open = self.open.lock();
        open.retain(|_, w| w.strong_count() > 0);
        open.insert(config.name.clone(), Arc::downgrade(&s));
        Ok(s)
    }

    fn dedup_store(&self, name: &str, capacity: usize) -> Result<Arc<dyn DedupStore>, StreamError> {
        let dir = self.data_dir.join("dedup").join(name);
        ensure_dir(&*self.storage, &dir)?;
        Ok(Arc::new(DurableDedupStore::open(
            self.storage.clone(),
            dir,
            capacity,
        )?))
    }
}
