//! The shared dedup store on JetStream: [`JetStreamDedupStore`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::stream::{
    self as js_stream, DiscardPolicy, LastRawMessageErrorKind, StorageType,
};
use tidings::{DedupStore, MessageId, StreamError};

use super::records::{create_or_find, publish};
use super::shared::Shared;
use crate::classify::seam;
use crate::names::check_name;

/// How long a dedup store remembers an id by default: one day.
pub const DEFAULT_DEDUP_MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// A durable dedup store on JetStream: the ids [`Deduplicating`](tidings::Deduplicating)
/// processed, kept on the server, so every process that opens the same name on the same
/// server or cluster skips the same redeliveries (R-DEL-5 across processes). Open one with
/// [`Broker::durable_dedup_store`](tidings::Broker::durable_dedup_store) (as a
/// `dyn DedupStore`) or [`JetStreamBackend::jetstream_dedup_store`](crate::JetStreamBackend::jetstream_dedup_store)
/// (with its counters).
///
/// # Layout
/// One JetStream stream per store, laid out as a key-value bucket (`nats kv` lists it):
/// store `n` is the bucket `TIDINGS_dedup_<n>` (`n` escaped as stream names are), i.e. the
/// stream `KV_TIDINGS_dedup_<n>` on the subjects `$KV.TIDINGS_dedup_<n>.>`, with one key per
/// recorded id (its 32 hex digits) and at most one message per key. File storage.
///
/// # Bounds
/// The bucket keeps at most `capacity` ids, the oldest discarded first (the server drops
/// them), and forgets an id after the backend's
/// [`dedup_max_age`](crate::JetStreamBackendBuilder::dedup_max_age) (default
/// [`DEFAULT_DEDUP_MAX_AGE`]), so the store never grows without bound. It has
/// [`dedup_replicas`](crate::JetStreamBackendBuilder::dedup_replicas) copies on a cluster.
/// Opening a bucket that exists with another capacity, age, replica count or layout is
/// refused with [`StreamError::ConfigMismatch`]; it is never changed.
///
/// # Failure: at-least-once
/// [`contains`](DedupStore::contains) and [`record`](DedupStore::record) are one round trip
/// each, bounded by the request timeout plus 0.5 s. A server that is away (or that does not
/// answer in time) answers **not seen**: the handler runs, so a duplicate may be handled
/// again but a message is never skipped that was not processed. A record that failed is
/// counted ([`JetStreamDedupStore::failed_records`]), as is a lookup that failed
/// ([`JetStreamDedupStore::failed_lookups`]).
///
/// # Check, then record
/// As with every store, `Deduplicating` checks before and records after the handler: two
/// processes handling the same id at the same moment (a redelivery racing a slow first
/// delivery) may both run it. The store closes the window a crash leaves: a process that
/// recorded an id and died before acknowledging its message makes the next process skip
/// the redelivery.
///
/// # Blocking
/// Every call blocks the calling thread for its round trip (as every call into the backend
/// does), also from inside an async handler.
pub struct JetStreamDedupStore {
    shared: Arc<Shared>,
    name: String,
    bucket: js_stream::Stream,
    subject_prefix: String,
    capacity: usize,
    failed_records: AtomicU64,
    failed_lookups: AtomicU64,
}

impl std::fmt::Debug for JetStreamDedupStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JetStreamDedupStore")
            .field("name", &self.name)
            .field("capacity", &self.capacity)
            .field("failed_records", &self.failed_records())
            .field("failed_lookups", &self.failed_lookups())
            .finish_non_exhaustive()
    }
}

impl JetStreamDedupStore {
    /// Opens (or creates) the store `name` remembering the `capacity` most recent ids.
    pub(crate) fn open(
        shared: Arc<Shared>,
        name: &str,
        capacity: usize,
    ) -> Result<Self, StreamError> {
        check_name("dedup store", name)?;
        let bucket = crate::names::dedup_bucket(name);
        let stream_name = format!("KV_{bucket}");
        let subject_prefix = format!("$KV.{bucket}.");
        let capacity = capacity.max(1);
        let settings = &shared.settings;
        let config = js_stream::Config {
            name: stream_name.clone(),
            subjects: vec![format!("{subject_prefix}>")],
            // Beyond i64 the server's count is unbounded anyway.
            max_messages: i64::try_from(capacity).unwrap_or(i64::MAX),
            max_messages_per_subject: 1,
            max_age: settings.dedup_max_age,
            discard: DiscardPolicy::Old,
            storage: StorageType::File,
            num_replicas: settings.dedup_replicas,
            // What a key-value bucket has, so `nats kv` tools read it as one.
            allow_rollup: true,
            deny_delete: true,
            allow_direct: true,
            ..Default::default()
        };
        let js = shared.js.clone();
        let asked = config.clone();
        let (info, bucket_stream) = shared.call(shared.bound(3), async move {
            let info = create_or_find(&js, asked).await?;
            let stream = js
                .context
                .get_stream(&info.config.name)
                .await
                .map_err(|e| seam(format_args!("dedup store {}", info.config.name), e))?;
            Ok((info, stream))
        })?;
        check_limits(name, &config, &info.config)?;
        Ok(Self {
            shared,
            name: name.to_owned(),
            bucket: bucket_stream,
            subject_prefix,
            capacity,
            failed_records: AtomicU64::new(0),
            failed_lookups: AtomicU64::new(0),
        })
    }

    /// The store's name.
    ///
    /// **Waits:** never.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many ids it remembers at most.
    ///
    /// **Waits:** never.
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Records that failed (server away, no answer in time): those ids may be handled
    /// again when redelivered. (A record the client buffered while disconnected may still
    /// land once it reconnects.)
    ///
    /// **Waits:** never.
    #[must_use]
    pub fn failed_records(&self) -> u64 {
        self.failed_records.load(Ordering::Relaxed)
    }

    /// Lookups that failed and were answered "not seen" (the handler ran).
    ///
    /// **Waits:** never.
    #[must_use]
    pub fn failed_lookups(&self) -> u64 {
        self.failed_lookups.load(Ordering::Relaxed)
    }

    /// Whether `id` is recorded, as the server answers it.
    ///
    /// **Waits:** on the network: one round trip, at most one request timeout plus 0.5 s.
    ///
    /// # Errors
    /// The server is away, did not answer in time, or refused.
    pub fn try_contains(&self, id: MessageId) -> Result<bool, StreamError> {
        let bucket = self.bucket.clone();
        let subject = format!("{}{id}", self.subject_prefix);
        self.shared.call(self.shared.bound(1), async move {
            match bucket.get_last_raw_message_by_subject(&subject).await {
                Ok(_) => Ok(true),
                // Never recorded, or forgotten (age, capacity).
                Err(e) if matches!(e.kind(), LastRawMessageErrorKind::NoMessageFound) => Ok(false),
                Err(e) => Err(seam(format_args!("looking up {subject}"), e)),
            }
        })
    }

    /// Records `id`, waiting for the server's acknowledgement.
    ///
    /// **Waits:** on the network: one round trip (the server's acknowledgement), at most
    /// one request timeout plus 0.5 s.
    ///
    /// # Errors
    /// The server is away, did not answer in time, or refused.
    pub fn try_record(&self, id: MessageId) -> Result<(), StreamError> {
        let js = self.shared.js.clone();
        let subject = format!("{}{id}", self.subject_prefix);
        self.shared.call(self.shared.bound(1), async move {
            publish(&js, subject, HeaderMap::new(), bytes::Bytes::new())
                .await
                .map(|_| ())
        })
    }
}

impl DedupStore for JetStreamDedupStore {
    fn contains(&self, id: MessageId) -> bool {
        self.try_contains(id).unwrap_or_else(|_| {
            // At-least-once: an unanswered lookup lets the handler run.
            self.failed_lookups.fetch_add(1, Ordering::Relaxed);
            false
        })
    }

    fn record(&self, id: MessageId) {
        if self.try_record(id).is_err() {
            self.failed_records.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// An existing bucket must have the limits asked for: a store with another capacity or
/// age would silently forget sooner (or later) than its users expect.
fn check_limits(
    name: &str,
    asked: &js_stream::Config,
    existing: &js_stream::Config,
) -> Result<(), StreamError> {
    let mismatch = |setting: &'static str, existing: String, requested: String| {
        Err(StreamError::ConfigMismatch {
            stream: format!("dedup store {name}"),
            setting,
            existing,
            requested,
        })
    };
    if existing.subjects != asked.subjects
        || existing.max_messages_per_subject != asked.max_messages_per_subject
        || existing.discard != asked.discard
    {
        return mismatch(
            "layout",
            format!(
                "subjects {:?}, {} per key, discard {:?}",
                existing.subjects, existing.max_messages_per_subject, existing.discard
            ),
            format!(
                "subjects {:?}, {} per key, discard {:?}",
                asked.subjects, asked.max_messages_per_subject, asked.discard
            ),
        );
    }
    if existing.max_messages != asked.max_messages {
        return mismatch(
            "capacity",
            existing.max_messages.to_string(),
            asked.max_messages.to_string(),
        );
    }
    if existing.max_age != asked.max_age {
        return mismatch(
            "max age",
            format!("{:?}", existing.max_age),
            format!("{:?}", asked.max_age),
        );
    }
    if existing.num_replicas.max(1) != asked.num_replicas.max(1) {
        return mismatch(
            "replicas",
            existing.num_replicas.max(1).to_string(),
            asked.num_replicas.max(1).to_string(),
        );
    }
    Ok(())
}
