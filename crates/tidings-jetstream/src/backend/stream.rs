//! One tidings stream as a JetStream stream (file storage).
//!
//! # Ordering and durability
//! [`BackendStream::append`] returns once the server acknowledged the publish (fsynced on
//! a server with `sync_interval: always`); offsets are the stream sequences it assigns, in
//! append order. The message id is the `Nats-Msg-Id`: appending the same message twice
//! within the stream's duplicate window stores it once and returns the first offset.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::SystemTime;

use async_nats::HeaderMap;
use async_nats::jetstream::context::PublishErrorKind;
use tidings::durable::{BackendCursor, BackendStream, CursorSpec};
use tidings::{Message, Pattern, StartAt, StreamError};

use super::codec::{self, Stored};
use super::cursor::{CursorShared, JsCursor};
use super::{Shared, backend_error, check_name, nats_name};
use crate::connect::JetStream;
use crate::stream::StreamSpec;

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

/// First retained and one-past-last sequence of a stream, from the server.
pub(crate) async fn bounds(js: &JetStream, nats: &str) -> Result<(u64, u64), StreamError> {
    let mut stream = js
        .context
        .get_stream(nats)
        .await
        .map_err(|e| backend_error(format!("stream {nats}: {e}")))?;
    let info = stream
        .info()
        .await
        .map_err(|e| backend_error(format!("stream {nats}: {e}")))?;
    Ok(state_bounds(
        info.state.messages,
        info.state.first_sequence,
        info.state.last_sequence,
    ))
}

fn state_bounds(messages: u64, first: u64, last: u64) -> (u64, u64) {
    let end = last + 1;
    if messages == 0 {
        (end, end)
    } else {
        (first.max(1), end)
    }
}

/// Publishes `headers` + `payload` to `subject` and waits for the server's ack; the
/// stored sequence.
pub(crate) async fn publish(
    js: &JetStream,
    subject: String,
    headers: HeaderMap,
    payload: bytes::Bytes,
) -> Result<u64, StreamError> {
    let map = |e: async_nats::jetstream::context::PublishError| match e.kind() {
        PublishErrorKind::StreamNotFound => {
            backend_error(format!("no stream captures subject {subject:?}"))
        }
        PublishErrorKind::TimedOut | PublishErrorKind::BrokenPipe => backend_error(format!(
            "no acknowledgement within {:?} (server away?)",
            js.request_timeout()
        )),
        _ => backend_error(format!("append refused: {e}")),
    };
    let ack = js
        .context
        .publish_with_headers(subject.clone(), headers, payload)
        .await
        .map_err(map)?
        .await
        .map_err(map)?;
    Ok(ack.sequence)
}

/// The headers of `m` plus its `Nats-Msg-Id`.
pub(crate) fn headers_with_id(m: &Message, msg_id: &str) -> HeaderMap {
    let mut h = codec::encode(m);
    h.insert(async_nats::header::NATS_MESSAGE_ID, msg_id);
    h
}

impl JsStream {
    pub(crate) fn open(
        shared: Arc<Shared>,
        name: &str,
        patterns: &[Pattern],
    ) -> Result<Self, StreamError> {
        check_name("stream", name)?;
        if patterns.is_empty() {
            return Err(StreamError::NoPattern(name.to_owned()));
        }
        let nats = nats_name(name);
        let spec = StreamSpec::new(nats.clone(), patterns.iter().cloned());
        let js = shared.js.clone();
        let state = shared.call(shared.bound(1), async move {
            js.ensure_stream(&spec).await.map_err(backend_error)
        })?;
        let (start, end) = state_bounds(state.messages, state.first_sequence, state.last_sequence);
        Ok(Self {
            shared,
            name: name.to_owned(),
            nats,
            start: Arc::new(AtomicU64::new(start)),
            end: Arc::new(AtomicU64::new(end)),
            closed: AtomicBool::new(false),
            subjects: state.subjects,
            cursors: Mutex::new(Vec::new()),
        })
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

    fn append(&self, message: &Message) -> Result<u64, StreamError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(StreamError::Closed);
        }
        let js = self.shared.js.clone();
        let headers = headers_with_id(message, &message.id().to_string());
        let subject = message.topic().as_str().to_owned();
        let payload = message.payload().clone();
        let seq = self.shared.call(self.shared.bound(1), async move {
            publish(&js, subject, headers, payload).await
        })?;
        self.end.fetch_max(seq + 1, Ordering::Relaxed);
        self.shared.changed();
        // The cursors' own watch sees the publish too, later: a manual driver's next step
        // should find it.
        for c in self.lock_cursors().iter().filter_map(Weak::upgrade) {
            c.wake();
        }
        Ok(seq)
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
        let bound = self
            .shared
            .bound(u32::try_from(max.min(64)).unwrap_or(64) + 1);
        self.shared.call(bound, async move {
            read_range(&js, &nats, from, end, max, &limits).await
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
            let (stream, durable) = (self.nats.clone(), nats_name(spec.name));
            let exists = self.shared.call(self.shared.bound(1), async move {
                js.consumer_exists(&stream, &durable)
                    .await
                    .map_err(backend_error)
            })?;
            if !exists {
                let (start, end) = self.refresh()?;
                check_offset(n, start, end)?;
            }
        }
        let cursor = JsCursor::open(
            Arc::clone(&self.shared),
            &self.nats,
            self.subjects.clone(),
            spec,
        )?;
        let mut cursors = self.lock_cursors();
        cursors.retain(|c| c.strong_count() > 0);
        cursors.push(Arc::downgrade(&cursor.shared_state()));
        Ok(Box::new(cursor))
    }

    fn apply_retention(&self, now: SystemTime) -> Result<tidings::RetentionReport, StreamError> {
        let _ = now;
        Err(StreamError::Unsupported {
            feature: "apply_retention (the server applies the stream's limits itself)",
            backend: super::BACKEND_NAME,
        })
    }

    fn close(&self) -> Result<(), StreamError> {
        self.closed.store(true, Ordering::Release);
        Ok(())
    }
}

/// An offset a cursor may start at: retained, and at most the end.
pub(crate) fn check_offset(n: u64, start: u64, end: u64) -> Result<(), StreamError> {
    if n > end {
        return Err(StreamError::BeyondEnd { requested: n, end });
    }
    if n < start {
        return Err(StreamError::OutOfRetention {
            requested: n,
            earliest: start,
        });
    }
    Ok(())
}

/// Up to `max` stored messages from `from` (deleted sequences skipped).
async fn read_range(
    js: &JetStream,
    nats: &str,
    from: u64,
    end: u64,
    max: usize,
    limits: &tidings::Limits,
) -> Result<Vec<Message>, StreamError> {
    let stream = js
        .context
        .get_stream_no_info(nats)
        .await
        .map_err(|e| backend_error(format!("stream {nats}: {e}")))?;
    let mut out = Vec::new();
    let mut seq = from;
    while out.len() < max && seq < end {
        match stream.get_raw_message(seq).await {
            Ok(raw) => {
                let header = |n: &str| codec::lookup(&raw.headers, n);
                let stored = Stored {
                    subject: raw.subject.as_str(),
                    payload: raw.payload.clone(),
                    sequence: raw.sequence,
                    published: SystemTime::from(raw.time),
                    header: &header,
                };
                // A redrive copy reads as the message it copies.
                out.push(codec::decode(&stored, limits).map_err(backend_error)?);
            }
            Err(e) => {
                if !super::dead_letters::is_no_message(&e) {
                    return Err(backend_error(format!("reading {nats} at {seq}: {e}")));
                }
            }
        }
        seq += 1;
    }
    Ok(out)
}
