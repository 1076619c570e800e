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
pub mod offline;
pub(crate) mod offset_store;
mod stream;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tidings_log::{FsStorage, Log, Storage};

use crate::dedup::DedupStore;
use crate::durable::{BackendStream, Capabilities, DurableBackend, StreamConfig, StreamError};
use crate::topic::Pattern;

pub use dedup_log::DurableDedupStore;
use offset_store::ensure_dir;

/// The backend's name in errors and snapshots.
pub(crate) const NAME: &str = "embedded-log";

/// Durable streams in local `tidings-log` files under one data directory: the default
/// backend, built by [`BrokerBuilder::data_dir`](crate::BrokerBuilder::data_dir) (and
/// [`BrokerBuilder::storage`](crate::BrokerBuilder::storage)).
///
/// One broker per directory at a time: each log holds an advisory lock while open.
///
/// ```
/// # use std::sync::Arc;
/// use tidings::{Broker, StreamConfig, embedded::EmbeddedBackend};
/// let dir = tempfile::tempdir()?;
/// let broker = Broker::builder()
///     .durable_backend(Arc::new(EmbeddedBackend::new(dir.path())))
///     .build()?;
/// broker.create_stream(StreamConfig::new("orders", ["orders.#"]))?;
/// # broker.close(std::time::Duration::from_secs(1));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct EmbeddedBackend {
    data_dir: PathBuf,
    storage: Arc<dyn Storage>,
}

impl EmbeddedBackend {
    /// Streams in `data_dir` on the real file system.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self::with_storage(data_dir, Arc::new(FsStorage))
    }

    /// Streams in `data_dir` read and written through `storage` (a
    /// [`SimStorage`](tidings_log::testing::SimStorage) injects I/O faults and power cuts).
    pub fn with_storage(data_dir: impl Into<PathBuf>, storage: Arc<dyn Storage>) -> Self {
        Self {
            data_dir: data_dir.into(),
            storage,
        }
    }

    /// The data directory.
    #[must_use]
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
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
        let dir = self.data_dir.join("streams").join(&config.name);
        ensure_dir(&*self.storage, &dir)?;
        let opened = Log::open_with_storage(self.storage.clone(), &dir, config.log.clone())
            .map_err(|source| StreamError::Open {
                dir: dir.clone(),
                source,
            })?;
        let consumers = self.data_dir.join("consumers").join(&config.name);
        Ok(stream::EmbeddedStream::new(
            &config.name,
            opened,
            (dir, consumers),
            self.storage.clone(),
            config.commit_every,
        ))
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
