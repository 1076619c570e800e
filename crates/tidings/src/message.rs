//! The immutable message (R-CORE-4).
//!
//! A [`Message`] is built once by [`Broker::publish`](crate::Broker::publish), stamped with
//! a unique, time-ordered [`MessageId`] and a timestamp, wrapped in an `Arc`, and that same
//! instance reaches every subscription: nothing is copied per subscriber.

use std::fmt;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use bytes::Bytes;

use crate::clock::{Now, SystemClock, deadline_after, wall_after};
use crate::error::PublishError;
use crate::fence::Fence;
use crate::filter::HeaderLookup;
use crate::limits::Limits;
use crate::topic::Topic;
use crate::topic_name::TopicName;

/// A unique, time-ordered message id.
///
/// Layout (128 bits, most significant first): 48 bits of milliseconds since the UNIX epoch,
/// 16 bits of random per-generator nonce, 64 bits of a sequence from a random start. Ids
/// from one broker compare in the order they were assigned; ids from different processes compare by time
/// first.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MessageId(u128);

impl MessageId {
    /// A fresh id, unique across processes and ordered by time, as `publish` would assign:
    /// pick it once before publishing with [`MessageBuilder::id`], so a retry reuses it.
    #[must_use]
    #[allow(clippy::new_without_default)] // a fresh id is not a default value
    pub fn new() -> Self {
        process_ids().next(SystemTime::now())
    }
    /// The raw 128-bit value.
    #[must_use]
    pub fn as_u128(self) -> u128 {
        self.0
    }
    /// Rebuild an id from its raw value (for ids read back from a log).
    #[must_use]
    pub fn from_u128(raw: u128) -> Self {
        Self(raw)
    }
    /// Milliseconds since the UNIX epoch encoded in the id.
    #[must_use]
    pub fn timestamp_ms(self) -> u64 {
        (self.0 >> 80) as u64
    }

    /// The id of output number `n` caused by the message with this id: the same inputs give
    /// the same id in every process and after every restart, and different `(self, n)` give
    /// different ids (but for a 2^-80 chance). Keeps this id's milliseconds, so derived ids
    /// still sort by time.
    ///
    /// This is what makes a pipeline's outputs idempotent: a handler that publishes its
    /// outputs with derived ids ([`MessageBuilder::caused_by`]) and is run again for a
    /// redelivered input publishes the same ids again, which a stream's duplicate window
    /// drops (R-DEL-7).
    ///
    /// ```
    /// # use tidings::MessageId;
    /// let input = MessageId::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
    /// assert_eq!(input.derived(0), input.derived(0));
    /// assert_ne!(input.derived(0), input.derived(1));
    /// assert_eq!(input.derived(7).timestamp_ms(), input.timestamp_ms());
    /// ```
    #[must_use]
    pub fn derived(self, n: u32) -> MessageId {
        // A fixed mix (not the standard library's randomly keyed hasher): the result must
        // be the same in every process. Two rounds of a 64-bit finaliser over the parent's
        // halves and `n` fill the 80 bits below the milliseconds.
        let hi = (self.0 >> 64) as u64;
        let lo = self.0 as u64;
        let a = mix64(lo ^ mix64(hi ^ u64::from(n).rotate_left(32)));
        let b = mix64(a ^ hi ^ 0x9e37_79b9_7f4a_7c15);
        let low80 = (u128::from(b & 0xffff) << 64) | u128::from(a);
        MessageId((self.0 & !((1u128 << 80) - 1)) | low80)
    }
}

/// The SplitMix64 finaliser: a fixed bijection on 64 bits with good avalanche.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // By hand: every message a transport or a JetStream stream carries writes its id,
        // and the formatter's zero-padded 128-bit hex costs several times this loop. The
        // same text as `{:032x}` (the test `id_text_is_32_lower_hex_digits`).
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut text = [0u8; 32];
        for (i, digit) in text.iter_mut().enumerate() {
            *digit = DIGITS[((self.0 >> (124 - 4 * i)) & 0xf) as usize];
        }
        f.write_str(std::str::from_utf8(&text).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MessageId({self})")
    }
}

/// Assigns ids. One per broker; cheap and lock-free.
#[derive(Debug)]
pub(crate) struct IdGenerator {
    nonce: u16,
    seq: AtomicU64,
}

impl IdGenerator {
    pub(crate) fn new() -> Self {
        // Ids must not collide across processes: a JetStream stream deduplicates by id
        // (`Nats-Msg-Id`), so two processes minting one id would lose a message silently.
        // The nonce and the sequence's start are random (the standard library's per-process
        // OS-seeded hash keys, mixed with the time and the process id); two generators then
        // collide only if their nonces match and their sequences overlap, about
        // n / 2^79 for n ids each. The start leaves the top bit clear so the sequence never
        // wraps in practice (2^63 ids), keeping one generator's ids in order.
        use std::hash::{BuildHasher, Hasher};
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(now.as_nanos());
        h.write_u32(std::process::id());
        h.write_usize(&h as *const _ as usize);
        let first = h.finish();
        h.write_u64(first);
        let second = h.finish();
        Self {
            nonce: first as u16,
            seq: AtomicU64::new(second >> 1),
        }
    }

    pub(crate) fn next(&self, wall: SystemTime) -> MessageId {
        self.next_at_millis(millis_since_epoch(wall))
    }

    /// The next id, stamped with the publish's own clock reading. Its milliseconds come
    /// from the queue stamp `now` converts once for the whole publish, instead of a
    /// second conversion of the same wall time (`SystemTime::duration_since` and a
    /// 128-bit division, every publish).
    pub(crate) fn next_at(&self, now: &Now<'_>) -> MessageId {
        self.next_at_millis(now.stamp().epoch_millis())
    }

    fn next_at_millis(&self, ms: u64) -> MessageId {
        let ms = ms & ((1 << 48) - 1);
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        MessageId((u128::from(ms) << 80) | (u128::from(self.nonce) << 64) | u128::from(seq))
    }
}

/// The generator for ids made without a broker ([`MessageId::new`], detached messages).
fn process_ids() -> &'static IdGenerator {
    static IDS: OnceLock<IdGenerator> = OnceLock::new();
    IDS.get_or_init(IdGenerator::new)
}

pub(crate) fn millis_since_epoch(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Delivery priority. Higher is delivered first; equal priorities in publish order (R-ORD-1).
///
/// Four levels, so queues are an array of FIFOs and push/pop are O(1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Priority {
    /// Delivered after everything else.
    Low = 0,
    /// The default.
    #[default]
    Normal = 1,
    /// Ahead of normal traffic.
    High = 2,
    /// Ahead of everything.
    Urgent = 3,
}

impl Priority {
    /// Number of priority levels.
    pub const LEVELS: usize = 4;
    /// The level as an index, `0` = lowest.
    #[must_use]
    pub fn index(self) -> usize {
        self as usize
    }
}

/// Message headers: ordered `name → value` string pairs. Lookups return the first match.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Headers(Vec<(String, String)>);

impl Headers {
    /// No headers.
    #[must_use]
    pub fn new() -> Self {
        Self(Vec::new())
    }
    /// The first value for `name`.
    #[must_use]
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
    /// Append a header.
    pub fn insert(&mut self, name: impl Into<String>, value: impl Into<String>) {
        self.0.push((name.into(), value.into()));
    }
    /// Set `name` to `value`: every earlier value of `name` is removed (a codec's
    /// content type, src/codec.rs).
    pub(crate) fn set(&mut self, name: &str, value: String) {
        self.0.retain(|(k, _)| k != name);
        self.0.push((name.to_owned(), value));
    }
    /// Number of headers.
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.len()
    }
    /// True when there are no headers.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// All headers in insertion order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
    /// Total bytes of names and values (what the header limit counts).
    #[must_use]
    pub fn byte_len(&self) -> usize {
        self.0.iter().map(|(k, v)| k.len() + v.len()).sum()
    }
}

impl HeaderLookup for Headers {
    fn header(&self, name: &str) -> Option<&str> {
        self.get(name)
    }
}

/// An immutable, published message. Handlers receive `&Message`.
#[derive(Clone, Debug)]
pub struct Message {
    pub(crate) id: MessageId,
    pub(crate) topic: Topic,
    pub(crate) payload: Bytes,
    pub(crate) headers: Headers,
    pub(crate) key: Option<Bytes>,
    pub(crate) priority: Priority,
    pub(crate) timestamp: SystemTime,
    pub(crate) expires_at: Option<SystemTime>,
    pub(crate) deliver_at: Option<SystemTime>,
    pub(crate) reply_to: Option<Topic>,
    pub(crate) correlation_id: Option<String>,
    /// Offset in the stream this instance was read from (durable subscriptions only).
    pub(crate) log_offset: Option<u64>,
    /// The keyed-group partition and lease term this delivery was handed out under
    /// (R-DIST-8); `None` outside keyed consumer groups. Boxed: one pointer (8 bytes with
    /// its niche) keeps every message within the pool's per-message bound, and only
    /// deliveries of keyed groups pay for it.
    pub(crate) fence: Option<Box<Fence>>,
}

impl Message {
    /// Drops every part that may own user memory (payload, key, headers, reply topic,
    /// correlation id), for a message whose allocation is kept for reuse (src/message_pool.rs).
    pub(crate) fn release_user_memory(&mut self) {
        self.payload = Bytes::new();
        self.key = None;
        self.headers = Headers::new();
        self.reply_to = None;
        self.correlation_id = None;
    }

    /// Start building a message for `topic`: a string (checked at publish) or a [`Topic`]
    /// (checked already). See [`TopicName`] for every form accepted.
    ///
    /// To publish without an allocation for the topic, pass a [`Topic`] (or `&Topic`) you
    /// validated once, or a string of at most 22 bytes; a longer string is copied to the heap
    /// for each message ([`TopicName`], "Publishing without an allocation").
    pub fn to(topic: impl Into<TopicName>) -> MessageBuilder {
        MessageBuilder::new(topic)
    }
    /// Unique, time-ordered id assigned at publish.
    #[must_use]
    pub fn id(&self) -> MessageId {
        self.id
    }
    /// The topic it was published to.
    #[must_use]
    pub fn topic(&self) -> &Topic {
        &self.topic
    }
    /// The payload bytes (shared, not copied).
    #[must_use]
    pub fn payload(&self) -> &Bytes {
        &self.payload
    }
    /// The headers.
    #[must_use]
    pub fn headers(&self) -> &Headers {
        &self.headers
    }
    /// The first value of header `name`.
    #[must_use]
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name)
    }
    /// The ordering key, if any (keyed lanes, per-key concurrency).
    #[must_use]
    pub fn key(&self) -> Option<&[u8]> {
        self.key.as_deref()
    }
    /// Delivery priority.
    #[must_use]
    pub fn priority(&self) -> Priority {
        self.priority
    }
    /// Wall-clock time of publish.
    #[must_use]
    pub fn timestamp(&self) -> SystemTime {
        self.timestamp
    }
    /// When the message expires, if it carries a TTL.
    #[must_use]
    pub fn expires_at(&self) -> Option<SystemTime> {
        self.expires_at
    }
    /// When the message was scheduled for delivery, if it was delayed.
    #[must_use]
    pub fn deliver_at(&self) -> Option<SystemTime> {
        self.deliver_at
    }
    /// Topic a reply should be published to (request-reply).
    #[must_use]
    pub fn reply_to(&self) -> Option<&Topic> {
        self.reply_to.as_ref()
    }
    /// Correlation id linking a reply to its request.
    #[must_use]
    pub fn correlation_id(&self) -> Option<&str> {
        self.correlation_id.as_deref()
    }
    /// The stream offset this message was read from, when it was delivered by a durable
    /// subscription (R-LOG-3); `None` for messages delivered straight from `publish`.
    #[must_use]
    pub fn offset(&self) -> Option<u64> {
        self.log_offset
    }
    /// The partition and owner's term this delivery was handed out under, on keyed
    /// consumer groups (R-DIST-8); `None` elsewhere. An effect that must not commit after
    /// the key moved to another process checks it inside its own transaction (see
    /// [`Fence`]).
    #[must_use]
    pub fn fence(&self) -> Option<Fence> {
        self.fence.as_deref().copied()
    }
    /// Start a reply to this message: addressed to its `reply_to` topic with its correlation
    /// id. `None` when the message asked for no reply.
    pub fn reply(&self) -> Option<MessageBuilder> {
        let to = self.reply_to.as_ref()?;
        let mut b = MessageBuilder::new(to);
        b.correlation_id = self.correlation_id.clone();
        Some(b)
    }
    /// True when `now` is at or past the expiry (its own, or `default_ttl` after publish).
    /// A default TTL so long that its expiry is not representable never expires (R-LIM-1).
    pub(crate) fn is_expired(&self, now: SystemTime, default_ttl: Option<Duration>) -> bool {
        let expiry = self
            .expires_at
            .or_else(|| default_ttl.and_then(|ttl| wall_after(self.timestamp, ttl)));
        expiry.is_some_and(|at| now >= at)
    }
}

impl HeaderLookup for Message {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name)
    }
}

/// Builds a [`Message`]; [`Broker::publish`](crate::Broker::publish) validates and stamps it.
#[derive(Clone, Debug)]
#[must_use = "a message builder does nothing until it is published"]
pub struct MessageBuilder {
    pub(crate) topic: TopicName,
    pub(crate) payload: Bytes,
    pub(crate) headers: Headers,
    pub(crate) key: Option<Bytes>,
    pub(crate) priority: Priority,
    pub(crate) ttl: Option<Duration>,
    pub(crate) expires_at: Option<SystemTime>,
    pub(crate) delay: Option<Duration>,
    pub(crate) deliver_at: Option<SystemTime>,
    pub(crate) reply_to: Option<String>,
    pub(crate) correlation_id: Option<String>,
    pub(crate) id: Option<MessageId>,
}

impl MessageBuilder {
    /// A builder for `topic` with an empty payload: a string (checked at publish) or a
    /// [`Topic`] (checked already); see [`Message::to`].
    pub fn new(topic: impl Into<TopicName>) -> Self {
        Self {
            topic: topic.into(),
            payload: Bytes::new(),
            headers: Headers::new(),
            key: None,
            priority: Priority::Normal,
            ttl: None,
            expires_at: None,
            delay: None,
            deliver_at: None,
            reply_to: None,
            correlation_id: None,
            id: None,
        }
    }
    /// The payload. `Bytes`, `Vec<u8>`, `String` and `&'static` slices convert without copying.
    pub fn payload(mut self, payload: impl Into<Bytes>) -> Self {
        self.payload = payload.into();
        self
    }
    /// Add a header.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name, value);
        self
    }
    /// The ordering key (copied once into shared bytes).
    pub fn key(mut self, key: impl AsRef<[u8]>) -> Self {
        self.key = Some(Bytes::copy_from_slice(key.as_ref()));
        self
    }
    /// Delivery priority.
    pub fn priority(mut self, priority: Priority) -> Self {
        self.priority = priority;
        self
    }
    /// Time to live, counted from publish (R-TIME-1). A TTL so long that the expiry is
    /// not representable (`Duration::MAX`) means the message never expires.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }
    /// Absolute expiry (R-TIME-1). Wins over `ttl` when both are set.
    pub fn expires_at(mut self, at: SystemTime) -> Self {
        self.expires_at = Some(at);
        self
    }
    /// Deliver after `delay` (R-TIME-2). A zero delay is immediate. A delay so long that
    /// its delivery time is not representable (`Duration::MAX`) is refused at publish with
    /// [`PublishError::DelayTooLong`]: such a message could never be delivered.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self
    }
    /// Deliver at a wall-clock time (R-TIME-2). A time in the past is immediate.
    pub fn deliver_at(mut self, at: SystemTime) -> Self {
        self.deliver_at = Some(at);
        self
    }
    /// Topic replies should go to.
    pub fn reply_to(mut self, topic: impl Into<String>) -> Self {
        self.reply_to = Some(topic.into());
        self
    }
    /// Correlation id for request-reply, at most
    /// [`Limits::max_correlation_id_bytes`] bytes (checked at publish).
    pub fn correlation_id(mut self, id: impl Into<String>) -> Self {
        self.correlation_id = Some(id.into());
        self
    }
    /// Publish with this id instead of a fresh one: the caller's idempotency key.
    ///
    /// A publish that failed or timed out may have been stored anyway (the store's answer
    /// was lost). Retrying it with the **same id** is safe on a durable stream: an id
    /// already stored within the stream's duplicate window is not stored again (JetStream:
    /// `Nats-Msg-Id`, default window 2 minutes). The recipe: pick the id once
    /// ([`MessageId::new`], or [`MessageId::from_u128`] of your own key), then retry
    /// `publish` with that id until it succeeds.
    ///
    /// ```
    /// # use tidings::*;
    /// # let broker = Broker::new();
    /// let id = MessageId::new();
    /// let publish = || broker.publish(Message::to("orders.created").id(id).payload("42"));
    /// let report = publish().or_else(|_| publish())?; // a retry reuses the id
    /// # let _ = report;
    /// # Ok::<(), PublishError>(())
    /// ```
    ///
    /// Buffered subscriptions receive every publish, retries included: the window is the
    /// stream's. Ids must be unique per message: two different messages with one id on a
    /// stream lose the second one.
    pub fn id(mut self, id: MessageId) -> Self {
        self.id = Some(id);
        self
    }
    /// Publish as output number `n` of handling `input`: the id is
    /// `input.id().derived(n)` ([`MessageId::derived`]), the same every time the input is
    /// handled, so when the input is redelivered (a crash before its acknowledgement) and
    /// handled again, its outputs are dropped as duplicates by the output stream's
    /// duplicate window — each output exists once (R-DEL-7).
    pub fn caused_by(self, input: &Message, n: u32) -> Self {
        self.id(input.id().derived(n))
    }
}

impl MessageBuilder {
    /// Validate and stamp the message as [`Broker::publish`](crate::Broker::publish) would,
    /// without a broker: for unit-testing a handler.
    ///
    /// The id and timestamp come from the system clock; the default [`Limits`] apply; the
    /// topic, reply-to and every limit are checked exactly as at publish.
    ///
    /// ```
    /// # use tidings::*;
    /// fn handler(m: &Message) -> Result<(), HandlerError> {
    ///     if m.payload().is_empty() { Err(HandlerError::reject("empty")) } else { Ok(()) }
    /// }
    /// let m = Message::to("orders.created").payload("42").build_detached()?;
    /// assert_eq!(handler(&m), Ok(()));
    /// assert!(Message::to("not a topic").build_detached().is_err());
    /// # Ok::<(), PublishError>(())
    /// ```
    ///
    /// # Errors
    /// The same as `publish` for a bad message: invalid topic or reply-to, a limit
    /// exceeded, a delay too long.
    pub fn build_detached(self) -> Result<Message, PublishError> {
        self.build(
            None,
            &Limits::default(),
            &Now::new(&SystemClock),
            process_ids(),
        )
    }

    /// Validate against `limits` and stamp with `now` (R-LIM-1): what publish does before
    /// routing. `checked`: the builder's topic, already validated (publish takes it from
    /// the route cache), shared instead of checked and allocated again.
    pub(crate) fn build(
        self,
        checked: Option<Topic>,
        limits: &Limits,
        now: &Now<'_>,
        ids: &IdGenerator,
    ) -> Result<Message, PublishError> {
        let mut b = self;
        let stamp = b.stamp(checked, limits, now, ids)?;
        Ok(b.take_message(stamp))
    }

    /// Every check and every stamp of [`build`](Self::build), made before any part of the
    /// builder moves, so that what is left — writing the message — cannot fail. Publish
    /// then writes it straight into a recycled allocation ([`write_into`](Self::write_into))
    /// instead of building it on the stack and copying it there (~230 bytes, twice).
    ///
    /// The monotonic time is read only for a delay, to refuse one whose deadline is not
    /// representable.
    pub(crate) fn stamp(
        &self,
        checked: Option<Topic>,
        limits: &Limits,
        now: &Now<'_>,
        ids: &IdGenerator,
    ) -> Result<Stamp, PublishError> {
        let b = self;
        check_limits(
            limits,
            &b.payload,
            &b.headers,
            b.key.as_deref(),
            b.correlation_id.as_deref(),
        )?;
        debug_assert!(
            checked
                .as_ref()
                .is_none_or(|t| t.as_str() == b.topic.as_str())
        );
        let topic = match checked {
            Some(topic) => topic,
            None => b.topic.to_topic().map_err(PublishError::InvalidTopic)?,
        };
        let reply_to = b
            .reply_to
            .as_deref()
            .map(Topic::new)
            .transpose()
            .map_err(PublishError::InvalidReplyTo)?;
        let wall = now.wall();
        // A TTL past the representable range never expires.
        let expires_at = b
            .expires_at
            .or_else(|| b.ttl.and_then(|ttl| wall_after(wall, ttl)));
        let deliver_at = match (b.deliver_at, b.delay) {
            (Some(at), _) => Some(at),
            (None, Some(delay)) => {
                let at = wall_after(wall, delay)
                    .filter(|_| deadline_after(now.mono(), delay).is_some())
                    .ok_or(PublishError::DelayTooLong { delay })?;
                Some(at)
            }
            (None, None) => None,
        };
        Ok(Stamp {
            id: match b.id {
                Some(id) => id,
                None => ids.next_at(now),
            },
            topic,
            reply_to,
            timestamp: wall,
            expires_at,
            deliver_at,
        })
    }

    /// The message `stamp` completes, as a new value. Takes the builder's parts and leaves
    /// it empty (publish borrows its builder, so it is never copied whole).
    pub(crate) fn take_message(&mut self, stamp: Stamp) -> Message {
        Message {
            id: stamp.id,
            topic: stamp.topic,
            payload: std::mem::take(&mut self.payload),
            headers: std::mem::take(&mut self.headers),
            key: self.key.take(),
            priority: self.priority,
            timestamp: stamp.timestamp,
            expires_at: stamp.expires_at,
            deliver_at: stamp.deliver_at,
            reply_to: stamp.reply_to,
            correlation_id: self.correlation_id.take(),
            log_offset: None,
            fence: None,
        }
    }

    /// Write the message `stamp` completes into `slot`, a recycled allocation, field by
    /// field, taking the builder's parts as [`take_message`](Self::take_message) does:
    /// every field is overwritten (the destructuring names them all, so a new field cannot
    /// be forgotten), and what the slot held is dropped.
    #[inline]
    pub(crate) fn write_into(&mut self, stamp: Stamp, slot: &mut Message) {
        let Message {
            id,
            topic,
            payload,
            headers,
            key,
            priority,
            timestamp,
            expires_at,
            deliver_at,
            reply_to,
            correlation_id,
            log_offset,
            fence,
        } = slot;
        *id = stamp.id;
        *topic = stamp.topic;
        *payload = std::mem::take(&mut self.payload);
        *headers = std::mem::take(&mut self.headers);
        *key = self.key.take();
        *priority = self.priority;
        *timestamp = stamp.timestamp;
        *expires_at = stamp.expires_at;
        *deliver_at = stamp.deliver_at;
        *reply_to = stamp.reply_to;
        *correlation_id = self.correlation_id.take();
        *log_offset = None;
        *fence = None;
    }
}

/// What publish resolves and stamps on a message (see [`MessageBuilder::stamp`]).
pub(crate) struct Stamp {
    id: MessageId,
    topic: Topic,
    reply_to: Option<Topic>,
    timestamp: SystemTime,
    expires_at: Option<SystemTime>,
    deliver_at: Option<SystemTime>,
}

/// Refuse what exceeds `limits` (R-LIM-1): the checks publish and [`Message::from_parts`]
/// share.
fn check_limits(
    limits: &Limits,
    payload: &Bytes,
    headers: &Headers,
    key: Option<&[u8]>,
    correlation_id: Option<&str>,
) -> Result<(), PublishError> {
    if payload.len() > limits.max_payload_bytes {
        return Err(PublishError::PayloadTooLarge {
            size: payload.len(),
            limit: limits.max_payload_bytes,
        });
    }
    if headers.len() > limits.max_headers {
        return Err(PublishError::TooManyHeaders {
            count: headers.len(),
            limit: limits.max_headers,
        });
    }
    let header_bytes = headers.byte_len();
    if header_bytes > limits.max_header_bytes {
        return Err(PublishError::HeadersTooLarge {
            size: header_bytes,
            limit: limits.max_header_bytes,
        });
    }
    if let Some(k) = key
        && k.len() > limits.max_key_bytes
    {
        return Err(PublishError::KeyTooLarge {
            size: k.len(),
            limit: limits.max_key_bytes,
        });
    }
    if let Some(c) = correlation_id
        && c.len() > limits.max_correlation_id_bytes
    {
        return Err(PublishError::CorrelationIdTooLarge {
            size: c.len(),
            limit: limits.max_correlation_id_bytes,
        });
    }
    Ok(())
}

/// Every field of a [`Message`], taken apart so a durable backend can carry it elsewhere
/// (a remote server's headers, say) and rebuild the same message on receipt with
/// [`Message::from_parts`].
///
/// ```
/// # use tidings::*;
/// let m = Message::to("orders.created").payload("42").key("k").build_detached()?;
/// let parts = m.to_parts();
/// let back = Message::from_parts(parts, &Limits::default())?;
/// assert_eq!((back.id(), back.topic(), back.key()), (m.id(), m.topic(), m.key()));
/// # Ok::<(), PublishError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MessageParts {
    /// The unique id assigned at publish.
    pub id: MessageId,
    /// The topic it was published to.
    pub topic: Topic,
    /// The payload.
    pub payload: Bytes,
    /// The headers, in order.
    pub headers: Headers,
    /// The ordering key.
    pub key: Option<Bytes>,
    /// Delivery priority.
    pub priority: Priority,
    /// Wall-clock time of publish.
    pub timestamp: SystemTime,
    /// Absolute expiry (R-TIME-1): the TTL, resolved at publish.
    pub expires_at: Option<SystemTime>,
    /// Not delivered before this time (R-TIME-2): the delay, resolved at publish.
    pub deliver_at: Option<SystemTime>,
    /// Where a reply should go.
    pub reply_to: Option<Topic>,
    /// Links a reply to its request.
    pub correlation_id: Option<String>,
    /// The stream offset it was read from, if it was.
    pub offset: Option<u64>,
}

impl MessageParts {
    /// Parts of a message `id` on `topic` stamped `timestamp`, with an empty payload and
    /// every optional field unset.
    #[must_use]
    pub fn new(id: MessageId, topic: Topic, timestamp: SystemTime) -> Self {
        Self {
            id,
            topic,
            payload: Bytes::new(),
            headers: Headers::new(),
            key: None,
            priority: Priority::Normal,
            timestamp,
            expires_at: None,
            deliver_at: None,
            reply_to: None,
            correlation_id: None,
            offset: None,
        }
    }
}

impl Message {
    /// Every field of this message (the payload and key are shared, not copied).
    #[must_use]
    pub fn to_parts(&self) -> MessageParts {
        MessageParts {
            id: self.id,
            topic: self.topic.clone(),
            payload: self.payload.clone(),
            headers: self.headers.clone(),
            key: self.key.clone(),
            priority: self.priority,
            timestamp: self.timestamp,
            expires_at: self.expires_at,
            deliver_at: self.deliver_at,
            reply_to: self.reply_to.clone(),
            correlation_id: self.correlation_id.clone(),
            offset: self.log_offset,
        }
    }

    /// Rebuild a message from its parts, checking them against `limits` as publish would
    /// (the topics are valid by construction). The id, timestamp, expiry and delivery time
    /// are kept as given: the message is the one published, not a new one.
    ///
    /// # Errors
    /// A part exceeds `limits` ([`PublishError::PayloadTooLarge`],
    /// [`PublishError::TooManyHeaders`], [`PublishError::HeadersTooLarge`],
    /// [`PublishError::KeyTooLarge`], [`PublishError::CorrelationIdTooLarge`]).
    pub fn from_parts(parts: MessageParts, limits: &Limits) -> Result<Message, PublishError> {
        check_limits(
            limits,
            &parts.payload,
            &parts.headers,
            parts.key.as_deref(),
            parts.correlation_id.as_deref(),
        )?;
        Ok(Message {
            id: parts.id,
            topic: parts.topic,
            payload: parts.payload,
            headers: parts.headers,
            key: parts.key,
            priority: parts.priority,
            timestamp: parts.timestamp,
            expires_at: parts.expires_at,
            deliver_at: parts.deliver_at,
            reply_to: parts.reply_to,
            correlation_id: parts.correlation_id,
            log_offset: parts.offset,
            fence: None,
        })
    }
}

impl From<&str> for MessageBuilder {
    fn from(topic: &str) -> Self {
        MessageBuilder::new(topic)
    }
}

#[cfg(test)]
mod parts_tests {
    use super::*;

    #[test]
    fn parts_round_trip_every_field() {
        let m = Message::to("a.b")
            .payload("p")
            .header("h", "v")
            .key("k")
            .priority(Priority::High)
            .ttl(Duration::from_secs(60))
            .delay(Duration::from_secs(5))
            .reply_to("r.s")
            .correlation_id("c")
            .build_detached()
            .expect("valid");
        let mut parts = m.to_parts();
        parts.offset = Some(7);
        let back = Message::from_parts(parts.clone(), &Limits::default()).expect("within limits");
        let mut again = back.to_parts();
        assert_eq!(again.offset, Some(7));
        again.offset = None;
        parts.offset = None;
        assert_eq!(again, parts);
    }

    #[test]
    fn parts_over_the_limits_are_refused() {
        // R-LIM-1: a rebuilt message is held to the same limits as a published one.
        let mut parts = MessageParts::new(
            MessageId::from_u128(1),
            Topic::new("a").expect("valid"),
            SystemTime::UNIX_EPOCH,
        );
        parts.key = Some(Bytes::from(vec![0u8; 2048]));
        assert!(matches!(
            Message::from_parts(parts.clone(), &Limits::default()),
            Err(PublishError::KeyTooLarge { size: 2048, .. })
        ));
        parts.key = None;
        parts.correlation_id = Some("x".repeat(2048));
        assert!(matches!(
            Message::from_parts(parts, &Limits::default()),
            Err(PublishError::CorrelationIdTooLarge { .. })
        ));
    }
}

#[cfg(test)]
mod id_tests {
    use super::*;
    use std::collections::HashSet;

    /// The id's text is what `{:032x}` writes, for the edges and for every nibble place.
    #[test]
    fn id_text_is_32_lower_hex_digits() {
        let mut ids = vec![0, 1, u128::MAX, u128::MAX - 1, 0xabc << 64];
        ids.extend((0..128).map(|bit| 1u128 << bit));
        ids.extend(
            (0..32).map(|i| 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210_u128.rotate_left(4 * i)),
        );
        for id in ids {
            assert_eq!(MessageId::from_u128(id).to_string(), format!("{id:032x}"));
        }
    }

    /// Brokers made in the same instant (as two processes started together would be) mint
    /// no common id: a JetStream stream would drop the second as a duplicate (R-DEL-6).
    #[test]
    fn generators_made_together_never_share_an_id() {
        let wall = SystemTime::now();
        let gens: Vec<IdGenerator> = (0..64).map(|_| IdGenerator::new()).collect();
        let mut seen = HashSet::new();
        for g in &gens {
            for _ in 0..1_000 {
                assert!(seen.insert(g.next(wall)), "an id was minted twice");
            }
        }
        let nonces: HashSet<u16> = gens.iter().map(|g| g.nonce).collect();
        assert!(nonces.len() > 32, "nonces are not spread: {}", nonces.len());
    }

    /// One generator's ids increase in the order they were assigned.
    #[test]
    fn one_generator_mints_increasing_ids() {
        let g = IdGenerator::new();
        let wall = SystemTime::now();
        let ids: Vec<MessageId> = (0..1_000).map(|_| g.next(wall)).collect();
        assert!(ids.is_sorted());
    }
}
