//! The idempotent-consumer decorator (R-DEL-5, the Decorator of R-PAT-2).
//!
//! [`Deduplicating`] wraps any handler. A message whose id is already recorded is skipped
//! (acknowledged without calling the inner handler). An id is recorded only **after** the
//! inner handler succeeded, so a failed attempt is retried for real.
//!
//! The check and the record are two steps: two deliveries of the same id that overlap in
//! time (possible only with keyed lanes or per-key concurrency when duplicates carry
//! different keys) may both run. With the default serial dispatcher they cannot.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::handler::{Handler, HandlerError};
use crate::message::{Message, MessageId};

/// Where processed ids are remembered.
pub trait DedupStore: Send + Sync + 'static {
    /// True if `id` was recorded.
    fn contains(&self, id: MessageId) -> bool;
    /// Record `id` as processed.
    fn record(&self, id: MessageId);
}

/// Remembers the most recent `capacity` ids (oldest forgotten first).
#[derive(Debug)]
pub struct InMemoryDedupStore {
    capacity: usize,
    inner: Mutex<(HashSet<MessageId>, VecDeque<MessageId>)>,
}

impl InMemoryDedupStore {
    /// A store remembering up to `capacity` ids (at least 1).
    #[must_use]
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            inner: Mutex::new((HashSet::new(), VecDeque::new())),
        }
    }
    /// Ids remembered now.
    #[must_use]
    pub fn len(&self) -> usize {
        self.inner.lock().1.len()
    }
    /// True when nothing is remembered.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl DedupStore for InMemoryDedupStore {
    fn contains(&self, id: MessageId) -> bool {
        self.inner.lock().0.contains(&id)
    }
    fn record(&self, id: MessageId) {
        let mut guard = self.inner.lock();
        let (set, order) = &mut *guard;
        if !set.insert(id) {
            return;
        }
        order.push_back(id);
        if order.len() > self.capacity
            && let Some(old) = order.pop_front()
        {
            set.remove(&old);
        }
    }
}

/// Wraps a handler so each message id is processed at most once per store (R-DEL-5).
pub struct Deduplicating<H, S: ?Sized = InMemoryDedupStore> {
    inner: H,
    store: Arc<S>,
    skipped: AtomicU64,
}

impl<H> Deduplicating<H, InMemoryDedupStore> {
    /// Wrap `inner` with an in-memory store of the last 100,000 ids.
    pub fn new(inner: H) -> Self {
        Self::with_store(inner, Arc::new(InMemoryDedupStore::new(100_000)))
    }
}

impl<H, S: DedupStore + ?Sized> Deduplicating<H, S> {
    /// Wrap `inner` with a given store (shareable between handlers).
    pub fn with_store(inner: H, store: Arc<S>) -> Self {
        Self {
            inner,
            store,
            skipped: AtomicU64::new(0),
        }
    }
    /// Duplicates skipped so far.
    pub fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }
    /// The store.
    pub fn store(&self) -> &Arc<S> {
        &self.store
    }
}

impl<H: Handler, S: DedupStore + ?Sized> Handler for Deduplicating<H, S> {
    fn handle(&self, message: &Message) -> Result<(), HandlerError> {
        if self.store.contains(message.id()) {
            self.skipped.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        self.inner.handle(message)?;
        self.store.record(message.id());
        Ok(())
    }
}

/// An async handler deduplicates the same way (feature `tokio`): the id is checked before
/// the inner future is created and recorded only after it completed with `Ok` — so with
/// [`Timeout`](crate::Timeout) inside, an attempt that timed out is not recorded.
#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
impl<H: crate::AsyncHandler, S: DedupStore + ?Sized> crate::AsyncHandler for Deduplicating<H, S> {
    fn handle<'a>(&'a self, message: Arc<Message>) -> crate::HandlerFuture<'a> {
        if self.store.contains(message.id()) {
            self.skipped.fetch_add(1, Ordering::Relaxed);
            return Box::pin(std::future::ready(Ok(())));
        }
        let id = message.id();
        let attempt = self.inner.handle(message);
        Box::pin(async move {
            attempt.await?;
            self.store.record(id);
            Ok(())
        })
    }
}

impl<H: Handler> Handler for Arc<H> {
    fn handle(&self, message: &Message) -> Result<(), HandlerError> {
        (**self).handle(message)
    }
}
