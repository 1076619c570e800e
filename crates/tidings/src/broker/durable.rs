//! The broker's durable surface: choosing the backend (`BrokerBuilder::data_dir`,
//! `storage`, `durable_backend`), streams, durable subscriptions and durable dedup stores.
//!
//! The work is done in `crate::durable` (registry, feeder, handles) and in the backend;
//! this file wires a durable subscription to the broker: it creates the (unrouted)
//! subscription and injects the narrow [`FeedSink`] through which the feeder offers
//! messages and holds delayed ones.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, Weak};

use tidings_log::Storage;

use crate::clock::Now;
use crate::dedup::DedupStore;
use crate::durable::feeder::{CursorFeeder, FeedSink, Held, OnDue};
use crate::durable::{
    CursorSpec, CursorWaker, DurableBackend, DurableSpec, DurableSubscription, Stream,
    StreamConfig, StreamError, check_name,
};
use crate::error::SubscribeError;
use crate::into_handler::AnyHandler;
use crate::message::Message;
use crate::options::{Concurrency, SubscribeOptions};
use crate::scheduler::Target;
use crate::subscription::shell::{FeedOffer, SubscriptionShell};
use crate::topic::Pattern;

use super::{Broker, BrokerBuilder, BrokerInner};

/// Where a broker keeps its durable streams (fields of `BrokerBuilder`).
#[derive(Default)]
pub(crate) struct DurableChoice {
    pub(crate) data_dir: Option<PathBuf>,
    /// `None` = the real file system.
    pub(crate) storage: Option<Arc<dyn Storage>>,
    pub(crate) backend: Option<Arc<dyn DurableBackend>>,
}

impl BrokerBuilder {
    /// Keep durable streams in the embedded log in this directory: streams in
    /// `streams/<name>/`, durable subscription state in `consumers/<stream>/`, durable dedup
    /// stores in `dedup/<name>/`. Required by [`Broker::create_stream`] unless a
    /// [`durable_backend`](Self::durable_backend) is given. One broker per directory at a
    /// time.
    pub fn data_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.durable.data_dir = Some(dir.into());
        self
    }

    /// The storage the embedded log's streams, committed offsets, durable DLQs and dedup
    /// stores are read and written through; the real file system by default. Give a
    /// [`SimStorage`](tidings_log::testing::SimStorage) to inject I/O faults and power cuts
    /// in tests (the data directory is then a path inside it).
    pub fn storage(mut self, storage: Arc<dyn Storage>) -> Self {
        self.durable.storage = Some(storage);
        self
    }

    /// Keep durable streams in `backend` (NATS JetStream, say, or an
    /// [`EmbeddedBackend`](crate::embedded::EmbeddedBackend) built by hand) instead of the
    /// embedded log of [`data_dir`](Self::data_dir). Building fails when both are given.
    pub fn durable_backend(mut self, backend: Arc<dyn DurableBackend>) -> Self {
        self.durable.backend = Some(backend);
        self
    }
}

impl DurableChoice {
    /// The backend the broker will hold, and the data directory it reports.
    pub(crate) fn build(self) -> Result<Chosen, crate::error::ConfigError> {
        match (self.backend, self.data_dir) {
            (Some(_), Some(dir)) => Err(crate::error::ConfigError::invalid(
                "data_dir",
                dir.display().to_string(),
                "either data_dir (the embedded log) or durable_backend, not both",
            )),
            (Some(b), None) => Ok((Some(b), None)),
            (None, Some(dir)) => {
                let storage = self
                    .storage
                    .unwrap_or_else(|| Arc::new(tidings_log::FsStorage));
                let backend = crate::embedded::EmbeddedBackend::with_storage(&dir, storage);
                Ok((Some(Arc::new(backend)), Some(dir)))
            }
            (None, None) => Ok((None, None)),
        }
    }
}

/// The backend a broker holds (`None`: streams are refused with `NoDataDir`), and the data
/// directory it reports.
pub(crate) type Chosen = (Option<Arc<dyn DurableBackend>>, Option<PathBuf>);

/// The feeder's handle on its subscription and the broker (never a strong reference to
/// the broker: a feeder must not keep it alive).
struct SubscriptionSink {
    sub: Weak<SubscriptionShell>,
    broker: Weak<BrokerInner>,
}

impl FeedSink for SubscriptionSink {
    fn offer(&self, message: &Arc<Message>) -> FeedOffer {
        let Some(sub) = self.sub.upgrade() else {
            return FeedOffer::Closed;
        };
        sub.offer_from_stream(message)
    }

    fn hold(&self, message: &Arc<Message>, on_due: OnDue) -> Held {
        let (Some(broker), Some(sub)) = (self.broker.upgrade(), self.sub.upgrade()) else {
            return Held::Closed;
        };
        let Some(due) = broker.due_time(message, &Now::new(broker.clock.as_ref())) else {
            return Held::NotDelayed;
        };
        if broker.schedule_for(due, message.clone(), Target::Only(sub.id, on_due)) {
            Held::Waiting
        } else {
            Held::Closed
        }
    }
}

impl Broker {
    /// The data directory, if the broker keeps its streams in the embedded log.
    #[must_use]
    pub fn data_dir(&self) -> Option<&Path> {
        self.inner
            .durables
            .data_dir
            .as_deref()
            .or_else(|| self.embedded_backend().map(|b| b.data_dir()))
    }

    /// The embedded log backend, if the broker keeps its streams there (built by
    /// [`BrokerBuilder::data_dir`], or an [`EmbeddedBackend`](crate::embedded::EmbeddedBackend)
    /// given to [`BrokerBuilder::durable_backend`]): where the embedded log's own details
    /// are (stream directories, recovery reports, retention passes).
    #[must_use]
    pub fn embedded_backend(&self) -> Option<&crate::embedded::EmbeddedBackend> {
        let backend: &dyn std::any::Any = &**self.inner.durables.backend().ok()?;
        backend.downcast_ref()
    }

    /// The name of the durable backend (`"embedded-log"`, `"jetstream"`), if there is one.
    #[must_use]
    pub fn durable_backend_name(&self) -> Option<&'static str> {
        self.inner.durables.backend().ok().map(|b| b.name())
    }

    /// Create — or, after a restart, reopen and recover — the stream `config.name`
    /// (R-LOG-1, R-LOG-2); in the embedded log, in `<data_dir>/streams/<name>/`. From now
    /// on every published message whose topic matches one of its patterns is appended to
    /// it before publish returns. On the embedded log,
    /// [`EmbeddedBackend::recovery`](crate::embedded::EmbeddedBackend::recovery) tells what
    /// opening found.
    ///
    /// An existing stream is opened only with the patterns and retention it has: never
    /// changed implicitly (R-LOG-5).
    ///
    /// # Errors
    /// No data dir or backend, bad name or pattern, the name already open in this broker,
    /// the stream exists with other patterns or retention
    /// ([`StreamError::ConfigMismatch`]), a setting the backend cannot honour
    /// ([`StreamError::Unsupported`]), or the backend could not open it (a corrupt or
    /// foreign file is reported with its path, R-LIM-2). Match on
    /// [`StreamError::kind`].
    pub fn create_stream(&self, config: StreamConfig) -> Result<Stream, StreamError> {
        if self.is_closed() {
            return Err(StreamError::Closed);
        }
        self.inner
            .durables
            .create_stream(config, &self.inner.clock, &*self.inner.executor)
    }

    /// Open (or create, or reopen after a restart) the durable dedup store `name` (R-DEL-5
    /// "durable with the log"); in the embedded log, in `<data_dir>/dedup/<name>/`, through
    /// the broker's storage. It remembers at least the most recent `capacity` processed
    /// ids, across restarts; wrap a handler with
    /// [`Deduplicating::with_store`](crate::Deduplicating::with_store).
    ///
    /// # Errors
    /// No data dir or backend, a bad name (it becomes a directory name), a backend without
    /// dedup stores ([`StreamError::Unsupported`]), the store already open (its log is
    /// locked while a handle lives), or a corrupt or foreign file (R-LIM-2).
    pub fn durable_dedup_store(
        &self,
        name: &str,
        capacity: usize,
    ) -> Result<Arc<dyn DedupStore>, StreamError> {
        let backend = self.inner.durables.backend()?;
        check_name("dedup store", name)?;
        backend.dedup_store(name, capacity)
    }

    /// The open stream called `name`.
    #[must_use]
    pub fn stream(&self, name: &str) -> Option<Stream> {
        let inner = self.inner.durables.stream(name)?;
        Some(Stream { inner })
    }

    /// Names of the open streams, sorted.
    #[must_use]
    pub fn streams(&self) -> Vec<String> {
        self.inner.durables.streams.read().keys().cloned().collect()
    }

    /// The body of `subscribe(spec, ..)` (src/broker/subscribe.rs): open the cursor, create
    /// the unrouted subscription with `handler` (sync or async: one core runs both,
    /// R-EXE-3), and start the feeder between them.
    pub(super) fn subscribe_spec(
        &self,
        spec: DurableSpec,
        options: SubscribeOptions,
        handler: AnyHandler,
    ) -> Result<DurableSubscription, StreamError> {
        let (name, stream) = (spec.name.as_str(), spec.stream.as_str());
        let (filter, start) = (spec.filter_pattern(), spec.start);
        let durables = &self.inner.durables;
        durables.backend()?;
        if self.is_closed() || durables.is_closed() {
            return Err(StreamError::Closed);
        }
        check_name("durable subscription", name)?;
        let s = durables
            .stream(stream)
            .ok_or_else(|| StreamError::UnknownStream(stream.to_owned()))?;
        let filter_pattern = Pattern::new(filter).map_err(|error| StreamError::InvalidPattern {
            pattern: filter.to_owned(),
            error,
        })?;
        let options = handler.options(options).map_err(SubscribeError::from)?;
        options.validate().map_err(SubscribeError::from)?;
        // Before the cursor opens: a handler the driver cannot run changes nothing.
        self.inner.can_run(&handler)?;
        // Not the registry's lock: opening the cursor may wait on the network (issue 33:
        // a stalled server froze every durable call on the broker for 7 s).
        let reservation = durables.reserve(stream, name)?;
        let window = options.capacity;
        // The cursor wakes a feeder that exists only once the cursor is open.
        let wake_target: Arc<OnceLock<Weak<CursorFeeder>>> = Arc::new(OnceLock::new());
        let target = wake_target.clone();
        let waker = CursorWaker::new(move || {
            if let Some(f) = target.get().and_then(Weak::upgrade) {
                f.wake();
            }
        });
        // Per-key order asked for: a backend shared by processes splits the keys (R-DIST-6).
        let keyed = matches!(
            options.concurrency,
            Concurrency::PerKey { .. } | Concurrency::Lanes(_)
        );
        let cursor = s.backend.open_cursor(
            CursorSpec::new(name, &filter_pattern, start, window, waker).keyed(keyed),
        )?;
        let gate = cursor.start_gate();
        let mut options = options;
        options
            .name
            .get_or_insert_with(|| format!("durable:{stream}/{name}"));
        let sub = match self
            .inner
            .subscribe_with(filter, options, handler.kind, false)
        {
            Ok(sub) => sub,
            Err(e) => {
                cursor.close(); // releases the name; nothing new was committed
                return Err(e.into());
            }
        };
        let sink = Arc::new(SubscriptionSink {
            sub: Arc::downgrade(&sub.shared),
            broker: Arc::downgrade(&self.inner),
        });
        let feeder = CursorFeeder::new(
            name,
            stream,
            sub.shared.id,
            cursor,
            sink,
            window,
            self.inner.clock.clone(),
        );
        let _ = wake_target.set(Arc::downgrade(&feeder)); // a new cell: not set before
        let hook = feeder.clone();
        sub.shared
            .set_on_finished(Arc::new(move |items| hook.on_finished(items)), gate);
        // The driver runs the feeder (R-EXE-4): its own thread, a pool unit, a tokio task,
        // or `run_until_idle` in the caller's thread. Its steps stay idle until the handle
        // is in place, so every completion knows where its blocking I/O belongs.
        let handle = match self.inner.executor.start_service(feeder.clone()) {
            Ok(h) => h,
            Err(e) => {
                feeder.shutdown();
                return Err(e.into());
            }
        };
        feeder.started(handle);
        if let Err(e) = reservation.fulfil(&feeder) {
            feeder.shutdown();
            return Err(e);
        }
        Ok(DurableSubscription {
            sub,
            feeder,
            registry: Arc::downgrade(&self.inner.durables),
        })
    }
}
