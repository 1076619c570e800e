//! The public stream API: a second `impl Broker` block (and `BrokerBuilder::data_dir`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tidings_log::{Fsync, Log, LogConfig, Storage};

use crate::broker::{Broker, BrokerBuilder};
use crate::error::SubscribeError;
use crate::handler::Handler;
use crate::options::SubscribeOptions;
use crate::subscription::shared::HandlerKind;
use crate::topic::Pattern;

use super::commit::{OffsetStore, ensure_dir};
use super::config::{StartAt, StreamConfig};
use super::dedup_log::DurableDedupStore;
use super::durable::{Durable, DurableSubscription, Feed, Position};
use super::error::StreamError;
use super::retention::RetentionService;
use super::{Stream, StreamInner, check_name};

impl BrokerBuilder {
    /// Directory for streams (`streams/<name>/`) and durable subscription state
    /// (`consumers/<stream>/`). Required by [`Broker::create_stream`]. One broker per
    /// directory at a time.
    pub fn data_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.data_dir.path = Some(dir.into());
        self
    }

    /// The storage streams, committed offsets and durable DLQs are read and written
    /// through; the real file system by default. Give a
    /// [`SimStorage`](tidings_log::testing::SimStorage) to inject I/O faults and power cuts
    /// in tests (the data directory is then a path inside it).
    pub fn storage(mut self, storage: Arc<dyn Storage>) -> Self {
        self.data_dir.storage = Some(storage);
        self
    }
}

impl Broker {
    /// The data directory, if the broker has one.
    #[must_use]
    pub fn data_dir(&self) -> Option<&Path> {
        self.inner.streams.data_dir.as_deref()
    }

    /// Create — or, after a restart, reopen and recover — the stream `config.name` in
    /// `<data_dir>/streams/<name>/` (R-LOG-1, R-LOG-2). From now on every published message
    /// whose topic matches one of its patterns is appended to it before publish returns.
    /// [`Stream::recovery`] tells what opening found.
    ///
    /// # Errors
    /// No data dir, bad name or pattern, the name already open in this broker, or the log
    /// could not be opened (a corrupt or foreign file is reported with its path, R-LIM-2).
    pub fn create_stream(&self, config: StreamConfig) -> Result<Stream, StreamError> {
        let streams = &self.inner.streams;
        let data = streams.data_dir.as_ref().ok_or(StreamError::NoDataDir)?;
        check_name("stream", &config.name)?;
        if config.patterns.is_empty() {
            return Err(StreamError::NoPattern(config.name));
        }
        let patterns = config
            .patterns
            .iter()
            .map(|p| {
                Pattern::new(p).map_err(|error| StreamError::InvalidPattern {
                    pattern: p.clone(),
                    error,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        // Held across the open: one `Log` per directory, ever.
        let mut map = streams.map.write();
        if self.is_closed() || streams.is_closed() {
            return Err(StreamError::Closed);
        }
        if map.contains_key(&config.name) {
            return Err(StreamError::AlreadyExists(config.name));
        }
        let dir = data.join("streams").join(&config.name);
        ensure_dir(&*streams.storage, &dir)?;
        let retention = &config.log.retention;
        let has_retention = retention.max_bytes.is_some() || retention.max_age.is_some();
        let (log, recovery) = Log::open_with_storage(streams.storage.clone(), &dir, config.log)
            .map_err(|source| StreamError::Open {
                dir: dir.clone(),
                source,
            })?;
        let inner = Arc::new(StreamInner {
            name: config.name.clone(),
            patterns,
            log,
            dir,
            recovery,
            commit_every: config.commit_every,
            retention_interval: has_retention.then_some(config.retention_interval),
            feeders: parking_lot::RwLock::default(),
        });
        if has_retention {
            let service = match streams.retention.get() {
                Some(s) => s.clone(),
                None => {
                    // Run by the driver (the manual one: in `run_until_idle`).
                    let s =
                        RetentionService::start(self.inner.clock.clone(), &*self.inner.executor)?;
                    streams.retention.get_or_init(|| s).clone()
                }
            };
            service.add(inner.clone());
        }
        map.insert(config.name, inner.clone());
        streams.mark_nonempty();
        Ok(Stream { inner })
    }

    /// Open (or create, or reopen after a restart) the durable dedup store `name` in
    /// `<data_dir>/dedup/<name>/`, through the broker's storage (R-DEL-5 "durable with the
    /// log"). It remembers at least the most recent `capacity` processed ids, across
    /// restarts; wrap a handler with
    /// [`Deduplicating::with_store`](crate::Deduplicating::with_store).
    ///
    /// # Errors
    /// No data dir, a bad name (it becomes a directory name), the store already open (its
    /// log is locked while a handle lives), or a corrupt or foreign file (R-LIM-2).
    pub fn durable_dedup_store(
        &self,
        name: &str,
        capacity: usize,
    ) -> Result<Arc<DurableDedupStore>, StreamError> {
        let streams = &self.inner.streams;
        let data = streams.data_dir.as_ref().ok_or(StreamError::NoDataDir)?;
        check_name("dedup store", name)?;
        let dir = data.join("dedup").join(name);
        ensure_dir(&*streams.storage, &dir)?;
        DurableDedupStore::open(streams.storage.clone(), dir, capacity).map(Arc::new)
    }

    /// The open stream called `name`.
    #[must_use]
    pub fn stream(&self, name: &str) -> Option<Stream> {
        let inner = self.inner.streams.map.read().get(name).cloned()?;
        Some(Stream { inner })
    }

    /// Names of the open streams, sorted.
    #[must_use]
    pub fn streams(&self) -> Vec<String> {
        self.inner.streams.map.read().keys().cloned().collect()
    }

    /// Subscribe `handler` durably to the messages of `stream` whose topic matches
    /// `filter` (R-LOG-3, R-LOG-4).
    ///
    /// If `name` has a committed position on this stream (from an earlier run), delivery
    /// resumes there and `start` is ignored (use [`DurableSubscription::seek`] to move it);
    /// otherwise it starts at `start`, and that position is committed at once. A committed
    /// position beyond the stream's end is clamped to the end, committed and logged
    /// ([`DurableSubscription::clamped_from`] reports it). `options`
    /// apply as for [`Broker::subscribe`] (retry, DLQ, TTL, lanes, per-key, filters);
    /// `capacity` is the window of outstanding messages, and `overflow` never triggers
    /// because the reader waits for room.
    ///
    /// # Errors
    /// Unknown stream, bad name/filter/options, the name already active, an offset out of
    /// retention ([`StreamError::OutOfRetention`]) or beyond the end, a foreign offset file.
    pub fn subscribe_durable(
        &self,
        name: &str,
        stream: &str,
        filter: &str,
        start: StartAt,
        options: SubscribeOptions,
        handler: impl Handler,
    ) -> Result<DurableSubscription, StreamError> {
        let streams = &self.inner.streams;
        let data = streams.data_dir.as_ref().ok_or(StreamError::NoDataDir)?;
        if self.is_closed() || streams.is_closed() {
            return Err(StreamError::Closed);
        }
        check_name("durable subscription", name)?;
        let s = streams
            .map
            .read()
            .get(stream)
            .cloned()
            .ok_or_else(|| StreamError::UnknownStream(stream.to_owned()))?;
        let filter_pattern = Pattern::new(filter).map_err(|error| StreamError::InvalidPattern {
            pattern: filter.to_owned(),
            error,
        })?;
        options.validate().map_err(SubscribeError::from)?;
        let key = (stream.to_owned(), name.to_owned());
        let mut durables = streams.durables.lock();
        if durables.get(&key).and_then(|w| w.upgrade()).is_some() {
            return Err(StreamError::DurableInUse {
                stream: stream.to_owned(),
                name: name.to_owned(),
            });
        }
        let cdir = data.join("consumers").join(stream);
        ensure_dir(&*streams.storage, &cdir)?;
        let store = OffsetStore::new(streams.storage.clone(), &cdir, name);
        // A committed position past the end is never trusted (see
        // `DurableSubscription::clamped_from`): new messages would reuse the offsets below it.
        let mut clamped_from = None;
        let position = match store.load()? {
            Some(committed) if committed > s.log.end_offset() => {
                let end = s.log.end_offset();
                tracing::warn!(
                    "tidings: durable {name} on stream {stream}: committed offset {committed} \
                     is beyond the stream's end {end} (foreign offset file, or the stream lost \
                     its tail in a crash); clamped to {end}"
                );
                store.store(end)?;
                clamped_from = Some(committed);
                end
            }
            Some(committed) => committed,
            None => {
                let p = s.resolve(start)?;
                store.store(p)?;
                p
            }
        };
        let dlq_dir = cdir.join(format!("{name}.dlq"));
        ensure_dir(&*streams.storage, &dlq_dir)?;
        let dlq_config = LogConfig {
            fsync: Fsync::Always,
            ..LogConfig::default()
        };
        let (dlq, _) = Log::open_with_storage(streams.storage.clone(), &dlq_dir, dlq_config)
            .map_err(|source| StreamError::Open {
                dir: dlq_dir.clone(),
                source,
            })?;
        let mut options = options;
        options
            .name
            .get_or_insert_with(|| format!("durable:{stream}/{name}"));
        let window = options.capacity;
        let sub = self.inner.subscribe_with(
            filter,
            options,
            HandlerKind::Sync(Arc::new(handler)),
            false,
        )?;
        let durable = Arc::new_cyclic(|me| {
            Durable::new(
                name.to_owned(),
                s.clone(),
                filter_pattern,
                store,
                dlq,
                Position {
                    at: position,
                    clamped_from,
                },
                Feed {
                    sub: Arc::downgrade(&sub.shared),
                    window,
                    broker: Arc::downgrade(&self.inner),
                    me: me.clone(),
                },
            )
        });
        let hook = durable.clone();
        sub.shared
            .set_on_finished(Arc::new(move |items| hook.on_finished(items)));
        // The driver runs the feeder (R-EXE-4): its own thread, a pool unit, a tokio task,
        // or `run_until_idle` in the caller's thread.
        // Its steps wait (idle) until the handle is in place, so every completion knows
        // where its blocking I/O belongs; then the first wake starts it.
        let handle = self.inner.executor.start_feeder(durable.clone())?;
        let _ = durable.feeder.set(handle); // a new durable: not set before
        s.add_feeder(&durable);
        durable.wake_feeder();
        durables.insert(key, Arc::downgrade(&durable));
        Ok(DurableSubscription {
            sub,
            durable,
            stream_name: stream.to_owned(),
            broker: Arc::downgrade(&self.inner),
        })
    }
}
