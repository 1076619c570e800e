//! The broker's streams and durable subscriptions, around one backend.
//!
//! # Publishing
//! `publish` appends the message once to each stream whose patterns match its topic,
//! *before* offering it to buffered subscriptions; the
//! [`PublishReport::streams`](crate::PublishReport::streams) lists them. An append failure
//! makes publish fail (`PublishError::Stream`) and nothing is offered. A message asking for
//! what a stream's backend cannot keep (a priority other than `Normal` on a backend without
//! priority) is refused the same way, before anything is appended.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use parking_lot::{Mutex, RwLock};

use crate::clock::Clock;
use crate::driver::Executor;
use crate::error::PublishError;
use crate::message::{Message, Priority};
use crate::options::MAX_NAME_LEN;
use crate::topic::Pattern;

use super::feeder::CursorFeeder;
use super::retention::RetentionService;
use super::source::DurableBackend;
use super::stream::{OpenStream, Stream};
use super::{StreamConfig, StreamError};

/// The streams a publish reached, and those of them that already held the message.
pub(crate) type Appends = (Vec<String>, Vec<String>);

/// Book one stream's append `outcome` into `appends` (the streams holding the message, and
/// those that held it already); a failure fails the publish, naming the streams appended
/// to before it.
fn record_append(
    stream: &OpenStream,
    outcome: Result<super::Appended, StreamError>,
    (names, duplicate_in): &mut Appends,
) -> Result<(), PublishError> {
    match outcome {
        Ok(appended) => {
            if appended.duplicate {
                duplicate_in.push(stream.name().to_owned());
            }
            names.push(stream.name().to_owned());
            Ok(())
        }
        Err(e) => Err(PublishError::Stream {
            stream: stream.name().to_owned(),
            error: Arc::new(e),
            appended_to: std::mem::take(names),
        }),
    }
}

/// Checks a stream, durable subscription or dedup store name: 1 to [`MAX_NAME_LEN`] bytes of
/// ASCII letters, digits, `-`, `_` and `.`, not starting with `.` (a backend may make a file
/// name of it). The one rule every backend starts from; a backend with a shorter limit
/// checks that after this.
///
/// # Errors
/// [`StreamError::InvalidName`] naming `what` and the rule broken.
pub fn check_name(what: &'static str, name: &str) -> Result<(), StreamError> {
    let bad = |reason| StreamError::InvalidName {
        what,
        name: name.to_owned(),
        reason,
    };
    // The reason is a `&'static str`: it spells the constant out.
    const _: () = assert!(MAX_NAME_LEN == 200, "update the reason below");
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(bad("must be 1 to 200 bytes"));
    }
    if name.starts_with('.') {
        return Err(bad("must not start with '.'"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
    {
        return Err(bad(
            "only ASCII letters, digits, '-', '_' and '.' are allowed",
        ));
    }
    Ok(())
}

/// The durable names of a broker: those active, and those whose cursor is being opened.
#[derive(Default)]
pub(crate) struct Feeders {
    pub(crate) open: BTreeMap<(String, String), Weak<CursorFeeder>>,
    opening: std::collections::BTreeSet<(String, String)>,
}

/// A durable name reserved by [`Durables::reserve`]; dropped unfulfilled (the open
/// failed), the name is free again.
pub(crate) struct Reservation<'a> {
    registry: &'a Durables,
    key: Option<(String, String)>,
}

impl Reservation<'_> {
    /// The subscription is in place: `feeder` holds the name from now on.
    ///
    /// # Errors
    /// [`StreamError::Closed`]: the broker closed while the cursor opened (its close did
    /// not see this feeder, so the caller shuts it down).
    pub(crate) fn fulfil(mut self, feeder: &Arc<CursorFeeder>) -> Result<(), StreamError> {
        let Some(key) = self.key.take() else {
            return Ok(());
        };
        let mut feeders = self.registry.feeders.lock();
        feeders.opening.remove(&key);
        // Under the lock `close` takes to list the feeders after setting its flag: either
        // it sees this feeder, or this sees its flag.
        if self.registry.is_closed() {
            return Err(StreamError::Closed);
        }
        feeders.open.insert(key, Arc::downgrade(feeder));
        Ok(())
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.registry.feeders.lock().opening.remove(&key);
        }
    }
}

/// The broker's durable side (a field of the broker).
pub(crate) struct Durables {
    /// `None`: built without a data directory or backend.
    backend: Option<Arc<dyn DurableBackend>>,
    /// The data directory, when the embedded backend was built from one.
    pub(crate) data_dir: Option<PathBuf>,
    /// Fast path: false until the first stream is created.
    any: AtomicBool,
    pub(crate) streams: RwLock<BTreeMap<String, Arc<OpenStream>>>,
    /// The durable names in use. Never held across a call into the backend (opening a
    /// cursor may wait on the network): a name being opened is *reserved* instead.
    pub(crate) feeders: Mutex<Feeders>,
    closed: AtomicBool,
    /// Started with the first stream that has a retention policy.
    retention: OnceLock<Arc<RetentionService>>,
}

impl Durables {
    pub(crate) fn new(backend: Option<Arc<dyn DurableBackend>>, data_dir: Option<PathBuf>) -> Self {
        Self {
            backend,
            data_dir,
            any: AtomicBool::new(false),
            streams: RwLock::default(),
            feeders: Mutex::default(),
            closed: AtomicBool::new(false),
            retention: OnceLock::new(),
        }
    }

    /// The backend, or [`StreamError::NoDataDir`].
    pub(crate) fn backend(&self) -> Result<&Arc<dyn DurableBackend>, StreamError> {
        self.backend.as_ref().ok_or(StreamError::NoDataDir)
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// The open stream called `name`.
    pub(crate) fn stream(&self, name: &str) -> Option<Arc<OpenStream>> {
        self.streams.read().get(name).cloned()
    }

    /// Create or reopen a stream (see `Broker::create_stream`). Its retention runs on a
    /// timer on `clock`, started by `executor` with the first stream that has a policy.
    pub(crate) fn create_stream(
        &self,
        config: StreamConfig,
        clock: &Arc<dyn Clock>,
        executor: &dyn Executor,
    ) -> Result<Stream, StreamError> {
        let backend = self.backend()?;
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
        // Held across the open: one open per stream, ever.
        let mut map = self.streams.write();
        if self.is_closed() {
            return Err(StreamError::Closed);
        }
        if map.contains_key(&config.name) {
            return Err(StreamError::AlreadyExists(config.name));
        }
        let opened = backend.open_stream(&config, &patterns)?;
        // The broker's timer runs only for a backend that asks for it (the embedded log).
        let has_retention = opened.retention_interval().is_some();
        let inner = Arc::new(OpenStream {
            backend: opened,
            patterns,
            backend_name: backend.name(),
            keeps_priority: backend.capabilities().priority,
            config,
        });
        if has_retention {
            let service = match self.retention.get() {
                Some(s) => s.clone(),
                None => {
                    // Run by the driver (the manual one: in `run_until_idle`).
                    let s = RetentionService::start(clock.clone(), executor)?;
                    self.retention.get_or_init(|| s).clone()
                }
            };
            service.add(inner.clone());
        }
        map.insert(inner.name().to_owned(), inner.clone());
        self.any.store(true, Ordering::Release);
        Ok(Stream { inner })
    }

    /// Reserves the durable name `name` of `stream` while its cursor opens, without
    /// holding the registry's lock meanwhile: an open on a stalled server delays only the
    /// subscribe that waits for it, never another call on the broker.
    ///
    /// # Errors
    /// [`StreamError::DurableInUse`]: the name is active, or being opened by another call.
    pub(crate) fn reserve(&self, stream: &str, name: &str) -> Result<Reservation<'_>, StreamError> {
        let key = (stream.to_owned(), name.to_owned());
        let mut feeders = self.feeders.lock();
        if feeders.opening.contains(&key)
            || feeders.open.get(&key).and_then(Weak::upgrade).is_some()
        {
            return Err(StreamError::DurableInUse {
                stream: stream.to_owned(),
                name: name.to_owned(),
            });
        }
        feeders.opening.insert(key.clone());
        Ok(Reservation {
            registry: self,
            key: Some(key),
        })
    }

    /// The feeders still alive, in (stream, name) order.
    pub(crate) fn live_feeders(&self) -> Vec<Arc<CursorFeeder>> {
        self.feeders
            .lock()
            .open
            .values()
            .filter_map(Weak::upgrade)
            .collect()
    }

    /// Manual driver: run every feeder in the caller's thread until it has nothing more
    /// to offer now, and the retention that fell due on the manual clock (idle streams
    /// included). Returns the steps that made progress.
    pub(crate) fn run_now(&self) -> usize {
        let mut progress = self.retention.get().map_or(0, |r| r.run_here());
        for f in self.live_feeders() {
            progress += f.run_here();
        }
        progress
    }

    /// Append `message` to every matching stream; the names of those that hold it, and of
    /// those among them that already held it (R-DEL-7: nothing stored there).
    /// Returns at once (no allocation, no lock) when the broker has no stream.
    #[inline]
    pub(crate) fn append(&self, message: &Message) -> Result<Appends, PublishError> {
        // Checked here, inlined into the publish, so a broker without streams pays one load
        // instead of a call that builds and returns an empty result (~90 instructions of a
        // ~1,950-instruction publish, callgrind `hot_path 100000 manual 1`).
        if !self.any.load(Ordering::Acquire) {
            return Ok((Vec::new(), Vec::new()));
        }
        self.append_to_streams(message)
    }

    /// [`Self::append`] once the broker has a stream.
    fn append_to_streams(&self, message: &Message) -> Result<Appends, PublishError> {
        let mut appends = (Vec::new(), Vec::new());
        for s in self.append_targets(message)? {
            let outcome = s.backend.append(message);
            record_append(&s, outcome, &mut appends)?;
        }
        Ok(appends)
    }

    /// [`Self::append`] without holding a thread while a backend waits
    /// ([`BackendStream::append_async`](super::BackendStream::append_async)); a backend
    /// without that path is appended to by `blocking` (the caller's way to run a blocking
    /// call off its async runtime). Streams are appended to one after the other, as by
    /// `append`.
    #[cfg(feature = "tokio")]
    pub(crate) async fn append_async(
        &self,
        message: &Arc<Message>,
        blocking: impl Fn(Arc<dyn super::BackendStream>, Arc<Message>) -> super::AppendFuture,
    ) -> Result<Appends, PublishError> {
        let mut appends = (Vec::new(), Vec::new());
        for s in self.append_targets(message)? {
            let appending = match s.backend.clone().append_async(message) {
                Some(appending) => appending,
                None => blocking(s.backend.clone(), message.clone()),
            };
            record_append(&s, appending.await, &mut appends)?;
        }
        Ok(appends)
    }

    /// The streams `message` is appended to; refused before anything is stored when one
    /// of them cannot keep its priority. Empty at once (no allocation, no lock) when the
    /// broker has no stream.
    fn append_targets(&self, message: &Message) -> Result<Vec<Arc<OpenStream>>, PublishError> {
        if !self.any.load(Ordering::Acquire) {
            return Ok(Vec::new());
        }
        let targets: Vec<Arc<OpenStream>> = self
            .streams
            .read()
            .values()
            .filter(|s| s.patterns.iter().any(|p| p.matches(message.topic())))
            .cloned()
            .collect();
        if message.priority() != Priority::Normal
            && let Some(s) = targets.iter().find(|s| !s.keeps_priority)
        {
            let e = StreamError::Unsupported {
                feature: "message priority",
                backend: s.backend_name,
            };
            return Err(PublishError::Stream {
                stream: s.name().to_owned(),
                error: Arc::new(e),
                appended_to: Vec::new(),
            });
        }
        Ok(targets)
    }

    /// Broker close: stop every feeder, close every cursor (each writes its position;
    /// abandoned messages are not finished, so they stay above it), close every stream,
    /// then the backend.
    pub(crate) fn close(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Some(r) = self.retention.get() {
            r.stop();
        }
        for f in self.live_feeders() {
            f.shutdown();
        }
        let streams = std::mem::take(&mut *self.streams.write());
        self.any.store(false, Ordering::Release);
        for s in streams.values() {
            if let Err(e) = s.backend.close() {
                tracing::error!("tidings: closing stream {}: {e}", s.name());
            }
        }
        if let Some(b) = &self.backend {
            b.close();
        }
    }
}
