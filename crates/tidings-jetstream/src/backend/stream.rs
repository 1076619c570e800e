//! One tidings stream as a JetStream stream (file storage).
//!
//! # Ordering and durability
//! [`BackendStream::append`] returns once the server acknowledged the publish (fsynced on
//! a server with `sync_interval: always`); offsets are the stream sequences it assigns, in
//! append order. The message id is the `Nats-Msg-Id`: appending the same message twice
//! within the stream's duplicate window stores it once and returns the first offset, with
//! [`Appended::duplicate`] set (the PubAck's `duplicate`). The window is the neutral
//! [`StreamConfig::duplicate_window_duration`], judged by the server's clock and kept by it
//! across restarts; zero, one the server cannot express, or one longer than the retention's
//! `max_age` is refused ([`StreamError::Unsupported`]), another window than an existing
//! stream's is [`StreamError::ConfigMismatch`] (R-LOG-5).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use async_nats::HeaderMap;
use async_nats::jetstream::context::{CreateStreamErrorKind, GetStreamErrorKind};
use async_nats::jetstream::{ErrorCode, stream as js_stream};
use tidings::StorageInfo;
use tidings::durable::{AppendFuture, Appended, BackendCursor, BackendStream, CursorSpec};
use tidings::{Message, Pattern, Retention, StartAt, StreamConfig, StreamError, StreamErrorKind};

use super::cursor::JsCursor;
use super::cursor_state::CursorShared;
use super::group::GroupCursor;
use super::keys::key_partition;
use super::records::{
    bounds, check_offset, headers_with_id, is_no_message, publish_acked, state_bounds,
};
use super::shared::Shared;
use crate::classify::{Classify, seam};
use crate::client::stream_spec::{StreamSpec, StreamState, verify_answer};
use crate::codec::{self, Stored};
use crate::connection::connect::JetStream;
use crate::names::{check_name, escape as nats_name, keyed_prefix, subject_prefix};

/// The stream metadata key holding the tidings patterns a stream was created with, one
/// per line.
pub(crate) const PATTERNS_KEY: &str = "tidings.patterns";

/// The stream metadata key holding its number of key partitions (fixed at creation).
pub(crate) const PARTITIONS_KEY: &str = "tidings.key_partitions";

/// A tidings stream on JetStream.
pub(crate) struct JsStream {
    shared: Arc<Shared>,
    name: String,
    nats: String,
    start: Arc<AtomicU64>,
    end: Arc<AtomicU64>,
    closed: AtomicBool,
    /// The subjects the stream captures (what its cursors watch).
    subjects: Vec<String>,
    /// Its patterns (what its cursors re-check a record against).
    patterns: Vec<Pattern>,
    /// The subject namespace of its unkeyed records (`<prefix><topic>`).
    prefix: String,
    /// The subject namespace of its keyed records (`<keyed><partition>.<topic>`).
    keyed: String,
    /// Its key partitions (from its metadata).
    partitions: u32,
    /// Its replicas (a keyed group's bucket gets as many).
    replicas: usize,
    /// Its cursors, woken by an append through this backend.
    cursors: Mutex<Vec<Weak<CursorShared>>>,
}

impl std::fmt::Debug for JsStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsStream")
            .field("name", &self.name)
            .field("jetstream_name", &self.nats)
            .finish_non_exhaustive()
    }
}

impl JsStream {
    /// The subject, headers and payload `message` is stored with. A keyed record goes under
    /// its key's partition: a keyed consumer group hands partitions to processes
    /// (R-DIST-6).
    fn record_of(&self, message: &Message) -> (String, HeaderMap, bytes::Bytes) {
        let headers = headers_with_id(message, &message.id().to_string());
        let subject = match message.key() {
            Some(key) => format!(
                "{}{}.{}",
                self.keyed,
                key_partition(key, self.partitions),
                message.topic().as_str()
            ),
            None => format!("{}{}", self.prefix, message.topic().as_str()),
        };
        (subject, headers, message.payload().clone())
    }

    /// An append the server acknowledged: a new record moves the known end and wakes
    /// this backend's cursors (a manual driver's next step should find it; their own
    /// watch sees it too, later). A duplicate changes nothing.
    fn stored(&self, appended: Appended) -> Appended {
        if appended.duplicate {
            return appended;
        }
        self.end.fetch_max(appended.offset + 1, Ordering::Relaxed);
        for c in self.lock_cursors().iter().filter_map(Weak::upgrade) {
            c.note_change();
            c.wake();
        }
        appended
    }

    /// Opens the stream `config` names, creating it when it does not exist; an existing
    /// one must have the same patterns and retention (R-LOG-5): it is never updated.
    pub(crate) fn open(
        shared: Arc<Shared>,
        config: &StreamConfig,
        patterns: &[Pattern],
    ) -> Result<Self, StreamError> {
        let name = config.name();
        check_name("stream", name)?;
        if patterns.is_empty() {
            return Err(StreamError::NoPattern(name.to_owned()));
        }
        let nats = nats_name(name);
        let prefix = subject_prefix(&nats);
        let js = shared.js.clone();
        let (stream, patterns_owned) = (name.to_owned(), patterns.to_vec());
        let retention = *config.retention_policy();
        let window = duplicate_window(config)?;
        let replicas = config.replica_count();
        let partitions = shared.settings.key_partitions;
        let nats_for_open = nats.clone();
        let state = shared.call(shared.bound(3), async move {
            let limits = Limits {
                retention,
                window,
                replicas,
                partitions,
            };
            open_or_create(&js, &stream, &nats_for_open, &patterns_owned, limits).await
        })?;
        let (start, end) = state_bounds(state.messages, state.first_sequence, state.last_sequence);
        let partitions = stored_partitions(&state.metadata).unwrap_or(partitions);
        let keyed = keyed_prefix(&nats);
        Ok(Self {
            keyed,
            replicas,
            shared,
            name: name.to_owned(),
            nats,
            start: Arc::new(AtomicU64::new(start)),
            end: Arc::new(AtomicU64::new(end)),
            closed: AtomicBool::new(false),
            subjects: state.subjects,
            patterns: patterns.to_vec(),
            prefix,
            partitions,
            cursors: Mutex::new(Vec::new()),
        })
    }

    /// Wake `cursor` on every append through this backend.
    fn watch(&self, cursor: &Arc<CursorShared>) {
        let mut cursors = self.lock_cursors();
        cursors.retain(|c| c.strong_count() > 0);
        cursors.push(Arc::downgrade(cursor));
    }

    fn lock_cursors(&self) -> std::sync::MutexGuard<'_, Vec<Weak<CursorShared>>> {
        self.cursors
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn refresh(&self) -> Result<(u64, u64), StreamError> {
        let js = self.shared.js.clone();
        let nats = self.nats.clone();
        let (start, end) =
            self.shared.call(
                self.shared.bound(2),
                async move { bounds(&js, &nats).await },
            )?;
        self.start.store(start, Ordering::Relaxed);
        self.end.store(end, Ordering::Relaxed);
        Ok((start, end))
    }
}

impl BackendStream for JsStream {
    fn name(&self) -> &str {
        &self.name
    }

    fn append(&self, message: &Message) -> Result<Appended, StreamError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(StreamError::Closed);
        }
        let (subject, headers, payload) = self.record_of(message);
        let js = self.shared.js.clone();
        // On this thread: the runtime thread only does the connection's I/O, and
        // concurrent appends from many threads do not queue behind one another's tasks.
        let appended = self.shared.call_here(self.shared.bound(1), async move {
            publish_acked(&js, subject, headers, payload).await
        })?;
        Ok(self.stored(appended))
    }

    fn append_async(self: Arc<Self>, message: &Message) -> Option<AppendFuture> {
        if self.closed.load(Ordering::Acquire) {
            return Some(Box::pin(std::future::ready(Err(StreamError::Closed))));
        }
        let (subject, headers, payload) = self.record_of(message);
        let js = self.shared.js.clone();
        let acked = self.shared.call_async(self.shared.bound(1), async move {
            publish_acked(&js, subject, headers, payload).await
        });
        Some(Box::pin(async move { Ok(self.stored(acked.await?)) }))
    }

    fn start_offset(&self) -> u64 {
        self.start.load(Ordering::Relaxed)
    }

    fn end_offset(&self) -> u64 {
        self.end.load(Ordering::Relaxed)
    }

    fn read(&self, from: u64, max: usize) -> Result<Vec<Message>, StreamError> {
        let (start, end) = self.refresh()?;
        if from < start {
            return Err(StreamError::OutOfRetention {
                requested: from,
                earliest: start,
            });
        }
        if from > end {
            return Err(StreamError::BeyondEnd {
                requested: from,
                end,
            });
        }
        let js = self.shared.js.clone();
        let nats = self.nats.clone();
        let limits = self.shared.settings.limits;
        let prefix = (self.prefix.clone(), self.keyed.clone());
        let bound = self
            .shared
            .bound(u32::try_from(max.min(64)).unwrap_or(64) + 1);
        self.shared.call(bound, async move {
            read_range(&js, &nats, prefix, from, end, max, &limits).await
        })
    }

    fn open_cursor(&self, spec: CursorSpec<'_>) -> Result<Box<dyn BackendCursor>, StreamError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(StreamError::Closed);
        }
        check_name("durable subscription", spec.name)?;
        if let StartAt::Offset(n) = spec.start
            && n != 0
        {
            // Checked only for a new name: an existing one resumes where it was.
            let js = self.shared.js.clone();
            let (stream, durable) = (
                self.nats.clone(),
                crate::names::DurableNames::new(&self.nats, spec.name)
                    .consumer()
                    .to_owned(),
            );
            let exists = self.shared.call(self.shared.bound(1), async move {
                js.consumer_exists(&stream, &durable)
                    .await
                    .map_err(|e| seam(format_args!("looking up consumer {durable}"), e))
            })?;
            if !exists {
                let (start, end) = self.refresh()?;
                check_offset(n, start, end)?;
            }
        }
        if spec.keyed {
            // Per-key order: a keyed consumer group, whose members split the partitions.
            let cursor = GroupCursor::open(
                Arc::clone(&self.shared),
                &self.nats,
                self.patterns.clone(),
                self.partitions,
                self.replicas,
                spec,
            )?;
            self.watch(&cursor.shared_state());
            return Ok(Box::new(cursor));
        }
        let cursor = JsCursor::open(
            Arc::clone(&self.shared),
            &self.nats,
            self.subjects.clone(),
            self.patterns.clone(),
            spec,
        )?;
        self.watch(&cursor.shared_state());
        Ok(Box::new(cursor))
    }

    fn storage_info(&self) -> StorageInfo {
        let mut info = StorageInfo::default();
        info.location = format!("jetstream stream {}", self.nats);
        info.durability = "server".to_owned();
        info
    }

    fn close(&self) -> Result<(), StreamError> {
        self.closed.store(true, Ordering::Release);
        Ok(())
    }
}

/// The patterns as the stream's metadata keeps them.
fn patterns_text(patterns: &[Pattern]) -> String {
    patterns
        .iter()
        .map(Pattern::as_str)
        .collect::<Vec<_>>()
        .join("\n")
}

/// A pattern list as a sorted set, for comparing.
fn pattern_set(patterns: &str) -> Vec<&str> {
    let mut set: Vec<&str> = patterns.lines().filter(|l| !l.is_empty()).collect();
    set.sort_unstable();
    set.dedup();
    set
}

/// A retention as a stream's limits show it.
fn limits_text(max_age: Duration, max_bytes: i64) -> String {
    let age = if max_age.is_zero() {
        "unlimited".to_owned()
    } else {
        format!("{max_age:?}")
    };
    let bytes = if max_bytes < 0 {
        "unlimited".to_owned()
    } else {
        format!("{max_bytes} bytes")
    };
    format!("{{max_bytes: {bytes}, max_age: {age}}}")
}

/// The stream's duplicate window as JetStream can keep it (R-DEL-7): not zero (the server
/// would put its default in its place), at most what the server's nanosecond count holds,
/// and at most the retention's `max_age` (the server refuses a longer one).
fn duplicate_window(config: &StreamConfig) -> Result<Duration, StreamError> {
    let window = config.duplicate_window_duration();
    let unsupported = |feature| StreamError::Unsupported {
        feature,
        backend: crate::names::BACKEND_NAME,
    };
    if window.is_zero() {
        return Err(unsupported(
            "StreamConfig::duplicate_window(Duration::ZERO): a JetStream stream always keeps \
             a duplicate window",
        ));
    }
    if i64::try_from(window.as_nanos()).is_err() {
        return Err(unsupported(
            "a duplicate window longer than JetStream's limit (i64::MAX nanoseconds)",
        ));
    }
    if let Some(age) = config.retention_policy().max_age
        && !age.is_zero()
        && window > age
    {
        return Err(unsupported(
            "a duplicate window longer than the retention's max_age",
        ));
    }
    Ok(window)
}

/// The settings a stream is created with and an existing one is checked against.
struct Limits {
    retention: Retention,
    window: Duration,
    replicas: usize,
    /// Key partitions of a stream created now.
    partitions: u32,
}

/// The key partitions a stream's metadata records.
fn stored_partitions(metadata: &std::collections::HashMap<String, String>) -> Option<u32> {
    metadata
        .get(PARTITIONS_KEY)
        .and_then(|n| n.parse::<u32>().ok())
        .filter(|n| *n >= 1)
}

/// The subjects a stream capturing `patterns` stores its records on: each subject in the
/// unkeyed namespace and, under any partition, in the keyed one.
fn record_subjects(nats: &str, patterns: &[Pattern]) -> Vec<String> {
    let (prefix, keyed) = (subject_prefix(nats), keyed_prefix(nats));
    crate::subject::stream_subjects(patterns)
        .into_iter()
        .flat_map(|s| [format!("{prefix}{s}"), format!("{keyed}*.{s}")])
        .collect()
}

/// Opens the JetStream stream `nats` for the tidings stream `stream` capturing `patterns`
/// with `limits` (retention, duplicate window, replicas): checks an existing one against them (never
/// updating its settings), or creates it.
async fn open_or_create(
    js: &JetStream,
    stream: &str,
    nats: &str,
    patterns: &[Pattern],
    Limits {
        retention,
        window,
        replicas,
        partitions,
    }: Limits,
) -> Result<StreamState, StreamError> {
    let mut spec = StreamSpec::new(nats.to_owned(), patterns.iter().cloned())
        .duplicate_window(window)
        .replicas(replicas);
    if let Some(age) = retention.max_age {
        spec = spec.max_age(age);
    }
    if let Some(bytes) = retention.max_bytes {
        spec = spec.max_bytes(bytes);
    }
    let mut config = spec
        .prepare()
        .map_err(|e| seam(format_args!("stream {stream}"), e))?;
    // The records live in a subject namespace of the stream's own: nothing published on
    // the topics themselves (a transport on the same server) is ever stored. Keyed records
    // have a second one, by key partition.
    config.subjects = record_subjects(nats, patterns);
    config
        .metadata
        .insert(PATTERNS_KEY.to_owned(), patterns_text(patterns));
    config
        .metadata
        .insert(PARTITIONS_KEY.to_owned(), partitions.to_string());
    match js.context.get_stream(nats).await {
        Ok(mut existing) => {
            let info = existing
                .info()
                .await
                .map_err(|e| seam(format_args!("stream {nats}"), e))?;
            let info = info.clone();
            check_existing(js, stream, &config, info).await
        }
        // Not there, or no answer: on a cluster the server may leave a lookup unanswered
        // while another client creates the stream, so a lookup that timed out goes on to
        // create too (the create of an existing stream is answered at once, and compared).
        Err(e)
            if matches!(e.kind(), GetStreamErrorKind::JetStream(err)
            if err.error_code() == ErrorCode::STREAM_NOT_FOUND)
                || e.class().0 == StreamErrorKind::TimedOut =>
        {
            match js.context.create_stream(config.clone()).await {
                Ok(created) => {
                    let info = created.cached_info();
                    verify_answer(&config, &info.config)
                        .map_err(|e| seam(format_args!("stream {stream}"), e))?;
                    Ok(StreamState::of(info))
                }
                // Another process created it meanwhile: compare with what it made.
                Err(e) => {
                    let raced = matches!(e.kind(),
                        CreateStreamErrorKind::JetStream(err)
                            if err.error_code() == ErrorCode::STREAM_NAME_EXIST);
                    if !raced {
                        return Err(seam(format_args!("creating stream {nats}"), e));
                    }
                    let mut existing = js
                        .context
                        .get_stream(nats)
                        .await
                        .map_err(|e| seam(format_args!("stream {nats}"), e))?;
                    let info = existing
                        .info()
                        .await
                        .map_err(|e| seam(format_args!("stream {nats}"), e))?
                        .clone();
                    check_existing(js, stream, &config, info).await
                }
            }
        }
        Err(e) => Err(seam(format_args!("stream {nats}"), e)),
    }
}

/// An existing stream, checked against the configuration asked for: other patterns or
/// limits are [`StreamError::ConfigMismatch`]. A stream without the patterns in its
/// metadata (an older build, or made by hand) is compared by its subjects and, when they
/// agree, gets the metadata (nothing else of it changes).
async fn check_existing(
    js: &JetStream,
    stream: &str,
    asked: &js_stream::Config,
    info: js_stream::Info,
) -> Result<StreamState, StreamError> {
    let requested = &asked.metadata[PATTERNS_KEY];
    let (mut subjects, mut wanted) = (info.config.subjects.clone(), asked.subjects.clone());
    subjects.sort();
    wanted.sort();
    match info.config.metadata.get(PATTERNS_KEY) {
        Some(stored) if pattern_set(stored) != pattern_set(requested) => {
            return Err(StreamError::ConfigMismatch {
                stream: stream.to_owned(),
                setting: "patterns",
                existing: format!("{:?}", pattern_set(stored)),
                requested: format!("{:?}", pattern_set(requested)),
            });
        }
        Some(_) if subjects != wanted => {
            // Made by a build that stored records on the topics themselves, or one without
            // the keyed namespace (before keyed consumer groups): recreate it.
            return Err(StreamError::ConfigMismatch {
                stream: stream.to_owned(),
                setting: "subjects",
                existing: format!("subjects {subjects:?}"),
                requested: format!(
                    "subjects {wanted:?} (records in the stream's own subject namespaces, \
                     keyed ones by partition)"
                ),
            });
        }
        Some(_) => {}
        None => {
            if subjects != wanted {
                return Err(StreamError::ConfigMismatch {
                    stream: stream.to_owned(),
                    setting: "patterns",
                    existing: format!("subjects {subjects:?}"),
                    requested: format!("{:?} (subjects {wanted:?})", pattern_set(requested)),
                });
            }
        }
    }
    if info.config.max_age != asked.max_age || info.config.max_bytes != asked.max_bytes {
        return Err(StreamError::ConfigMismatch {
            stream: stream.to_owned(),
            setting: "retention",
            existing: limits_text(info.config.max_age, info.config.max_bytes),
            requested: limits_text(asked.max_age, asked.max_bytes),
        });
    }
    if info.config.num_replicas.max(1) != asked.num_replicas.max(1) {
        return Err(StreamError::ConfigMismatch {
            stream: stream.to_owned(),
            setting: "replicas",
            existing: info.config.num_replicas.max(1).to_string(),
            requested: asked.num_replicas.max(1).to_string(),
        });
    }
    if info.config.duplicate_window != asked.duplicate_window {
        return Err(StreamError::ConfigMismatch {
            stream: stream.to_owned(),
            setting: "duplicate_window",
            existing: format!("{:?}", info.config.duplicate_window),
            requested: format!("{:?}", asked.duplicate_window),
        });
    }
    if info.config.metadata.contains_key(PATTERNS_KEY)
        && stored_partitions(&info.config.metadata).is_some()
    {
        return Ok(StreamState::of(&info));
    }
    // Same subjects, no record of the patterns or partitions: adopt the requested ones.
    let mut adopted = info.config.clone();
    adopted
        .metadata
        .entry(PATTERNS_KEY.to_owned())
        .or_insert_with(|| requested.clone());
    if stored_partitions(&adopted.metadata).is_none() {
        adopted.metadata.insert(
            PARTITIONS_KEY.to_owned(),
            asked.metadata[PARTITIONS_KEY].clone(),
        );
    }
    let updated = js
        .context
        .update_stream(adopted)
        .await
        .map_err(|e| seam(format_args!("recording the patterns of stream {stream}"), e))?;
    Ok(StreamState::of(&updated))
}

/// Up to `max` stored messages from `from` (deleted sequences skipped).
async fn read_range(
    js: &JetStream,
    nats: &str,
    (prefix, keyed): (String, String),
    from: u64,
    end: u64,
    max: usize,
    limits: &tidings::Limits,
) -> Result<Vec<Message>, StreamError> {
    let stream = js
        .context
        .get_stream_no_info(nats)
        .await
        .map_err(|e| seam(format_args!("stream {nats}"), e))?;
    let mut out = Vec::new();
    let mut seq = from;
    while out.len() < max && seq < end {
        match stream.get_raw_message(seq).await {
            Ok(raw) => {
                let header = |n: &str| codec::lookup(&raw.headers, n);
                let stored = Stored {
                    subject: crate::names::strip_namespaces(raw.subject.as_str(), &prefix, &keyed),
                    payload: raw.payload.clone(),
                    sequence: raw.sequence,
                    published: SystemTime::from(raw.time),
                    header: &header,
                };
                // A redrive copy reads as the message it copies.
                out.push(
                    codec::decode(&stored, limits)
                        .map_err(|e| seam(format_args!("stream {nats}"), e))?,
                );
            }
            Err(e) => {
                if !is_no_message(&e) {
                    return Err(seam(format_args!("reading {nats} at {seq}"), e));
                }
            }
        }
        seq += 1;
    }
    Ok(out)
}
