//! Dead-letter queue pages, redrive, purge and seek, addressed by subscription id: what an
//! admin endpoint needs (R-OPS-4, R-DEL-4).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::broker::Broker;
use crate::dlq::{DeadLetter, DeadLetterReason};
use crate::durable::feeder::CursorFeeder;
use crate::durable::{DurableDeadLetter, StartAt, StreamError};
use crate::message::{Message, MessageId, millis_since_epoch};
use crate::subscription::shell::SubscriptionShell;

/// The largest page [`Broker::dead_letter_page`] returns; larger requests are refused.
pub const MAX_PAGE_SIZE: usize = 1000;

/// How many payload bytes a [`DeadLetterEntry`] previews.
pub const PAYLOAD_PREVIEW_BYTES: usize = 256;

/// One dead-letter entry as shown to an operator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DeadLetterEntry {
    /// The message id (32 hex digits): the key for selective redrive.
    pub id: String,
    /// The message's topic.
    pub topic: String,
    /// Its key, lossily decoded as UTF-8.
    pub key: Option<String>,
    /// Its priority (`Low`, `Normal`, `High`, `Urgent`).
    pub priority: String,
    /// Its headers, in order.
    pub headers: Vec<(String, String)>,
    /// Its correlation id.
    pub correlation_id: Option<String>,
    /// The first [`PAYLOAD_PREVIEW_BYTES`] of the payload, lossily decoded as UTF-8.
    pub payload_preview: String,
    /// The payload's full length in bytes.
    pub payload_len: u64,
    /// The reason's stable name, e.g. `retries_exhausted`.
    pub reason: String,
    /// The reason in words, with the last error.
    pub reason_text: String,
    /// Handler attempts made.
    pub attempts: u32,
    /// The last handler error, when there was one.
    pub last_error: Option<String>,
    /// When it was dead-lettered, in ms since the Unix epoch. A durable entry's log does
    /// not keep that time: there it is the publish time (`published_ms`).
    pub at_ms: u64,
    /// When the message was published, in ms since the Unix epoch.
    pub published_ms: u64,
    /// `true` for an entry of a durable subscription's durable dead-letter log (it
    /// survives restarts; redrive appends it to the stream again).
    #[serde(default)]
    pub durable: bool,
    /// A durable entry's offset in its stream when it was dead-lettered.
    #[serde(default)]
    pub stream_offset: Option<u64>,
}

impl DeadLetterEntry {
    fn of(e: &DeadLetter) -> Self {
        Self {
            reason: e.reason.name().to_owned(),
            reason_text: e.reason.to_string(),
            attempts: e.attempts,
            last_error: e.last_error().map(str::to_owned),
            at_ms: millis_since_epoch(e.at),
            ..Self::of_message(&e.message)
        }
    }

    fn of_durable(e: &DurableDeadLetter) -> Self {
        let base = Self::of_message(&e.message);
        Self {
            reason: e.reason.name().to_owned(),
            reason_text: e.reason.to_string(),
            attempts: e.attempts,
            last_error: last_error_of(&e.reason).map(str::to_owned),
            // The durable log does not keep when the entry was written.
            at_ms: base.published_ms,
            durable: true,
            stream_offset: e.message.offset(),
            ..base
        }
    }

    /// The fields that come from the message itself (an in-memory entry's defaults for
    /// the rest).
    fn of_message(m: &Message) -> Self {
        let preview = &m.payload()[..m.payload().len().min(PAYLOAD_PREVIEW_BYTES)];
        Self {
            id: m.id().to_string(),
            topic: m.topic().as_str().to_owned(),
            key: m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
            priority: format!("{:?}", m.priority()),
            headers: m
                .headers()
                .iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            correlation_id: m.correlation_id().map(str::to_owned),
            payload_preview: String::from_utf8_lossy(preview).into_owned(),
            payload_len: m.payload().len() as u64,
            reason: String::new(),
            reason_text: String::new(),
            attempts: 0,
            last_error: None,
            at_ms: 0,
            published_ms: millis_since_epoch(m.timestamp()),
            durable: false,
            stream_offset: None,
        }
    }
}

/// The handler error a reason carries, when it has one.
fn last_error_of(reason: &DeadLetterReason) -> Option<&str> {
    match reason {
        DeadLetterReason::RetriesExhausted { last_error, .. } => Some(last_error),
        DeadLetterReason::Rejected { error } => Some(error),
        _ => None,
    }
}

/// One page of a subscription's dead-letter queue, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DeadLetterPage {
    /// The subscription's id.
    pub subscription: u64,
    /// Entries in the DLQ now.
    pub total: u64,
    /// Index of the first entry of this page.
    pub offset: u64,
    /// The entries.
    pub entries: Vec<DeadLetterEntry>,
    /// Entries now in the DLQ, by reason name.
    pub by_reason: BTreeMap<String, u64>,
}

/// Which dead-letter entries to redrive.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RedriveSelection {
    /// Every entry in the DLQ when the redrive starts.
    All,
    /// The entries of these messages.
    Ids(Vec<MessageId>),
}

/// What a redrive did. For a durable subscription's durable dead-letter log, `accepted`
/// counts the entries appended (and synced) to the stream again; `refused` and `returned`
/// are 0 there.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RedriveOutcome {
    /// Entries re-offered and accepted (they left the DLQ).
    pub accepted: u64,
    /// Entries re-offered and refused because the queue was full: they were dead-lettered
    /// again as `overflow` (a new DLQ entry) where the policy keeps those.
    pub refused: u64,
    /// Entries refused because the subscription is closing: put back into the DLQ unchanged.
    pub returned: u64,
    /// Requested ids that were not in the DLQ (already redriven, purged or evicted).
    pub missing: Vec<String>,
}

/// Why [`Broker::dead_letter_page`] failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PageError {
    /// No live subscription has this id.
    #[error("no live subscription with id {0}")]
    UnknownSubscription(u64),
    /// A page larger than [`MAX_PAGE_SIZE`] was asked for.
    #[error("page size {requested} is larger than the maximum {max}")]
    PageTooLarge {
        /// The size asked for.
        requested: usize,
        /// [`MAX_PAGE_SIZE`].
        max: usize,
    },
    /// The durable dead-letter log of this durable subscription could not be read.
    #[error("durable dead-letter log of subscription {id}: {reason}")]
    DurableLog {
        /// The subscription's id.
        id: u64,
        /// The stream error, in words.
        reason: String,
    },
}

/// Why [`Broker::redrive_dead_letters`] or [`Broker::purge_dead_letters`] failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeadLetterError {
    /// No live subscription has this id.
    #[error("no live subscription with id {0}")]
    UnknownSubscription(u64),
    /// The durable subscription is closing: its durable dead-letter log is not touched.
    #[error("durable subscription {0} is closing")]
    Closed(u64),
    /// The durable dead-letter log of this durable subscription could not be read or
    /// written, or the stream could not take the redriven copies. Entries whose removal
    /// was not recorded stay in the log (loss-safe); a redrive may have moved some first.
    #[error("durable dead-letter log of subscription {id}: {reason}")]
    DurableLog {
        /// The subscription's id.
        id: u64,
        /// The stream error, in words.
        reason: String,
    },
}

impl DeadLetterError {
    fn durable(id: u64, e: &StreamError) -> Self {
        match e {
            StreamError::Closed => Self::Closed(id),
            other => Self::DurableLog {
                id,
                reason: other.to_string(),
            },
        }
    }
}

/// Why a seek failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SeekError {
    /// No live subscription has this id.
    #[error("no live subscription with id {0}")]
    UnknownSubscription(u64),
    /// The subscription is buffered: it has no position to move.
    #[error("subscription {0} is not durable")]
    NotDurable(u64),
    /// The stream refused the position (out of retention, beyond the end) or the position
    /// could not be written; nothing changed.
    #[error(transparent)]
    Stream(#[from] StreamError),
}

impl Broker {
    fn live_subscription(&self, id: u64) -> Option<Arc<SubscriptionShell>> {
        self.inner
            .user_subscriptions()
            .into_iter()
            .find(|s| s.id.get() == id)
    }

    /// The durable cursor feeding `sub`, when it is a durable subscription's.
    fn durable_of(&self, sub: &SubscriptionShell) -> Option<Arc<CursorFeeder>> {
        self.inner
            .durables
            .live_feeders()
            .into_iter()
            .find(|f| f.sub_id == sub.id)
    }

    /// Up to `limit` entries of subscription `id`'s dead-letter queue from index `offset`,
    /// oldest first, with headers, payload preview, reason, attempts, last error and time.
    ///
    /// For a durable subscription this is its durable dead-letter log (R-DEL-4: what
    /// survives a restart, and what [`redrive_dead_letters`](Self::redrive_dead_letters)
    /// and [`purge_dead_letters`](Self::purge_dead_letters) act on there), the entries
    /// marked [`DeadLetterEntry::durable`]. Each call replays that log.
    ///
    /// # Errors
    /// Unknown subscription; `limit` above [`MAX_PAGE_SIZE`]; a durable dead-letter log
    /// that cannot be read.
    pub fn dead_letter_page(
        &self,
        id: u64,
        offset: usize,
        limit: usize,
    ) -> Result<DeadLetterPage, PageError> {
        if limit > MAX_PAGE_SIZE {
            return Err(PageError::PageTooLarge {
                requested: limit,
                max: MAX_PAGE_SIZE,
            });
        }
        let sub = self
            .live_subscription(id)
            .ok_or(PageError::UnknownSubscription(id))?;
        if let Some(durable) = self.durable_of(&sub) {
            let entries = durable
                .cursor
                .dead_letters()
                .map_err(|e| PageError::DurableLog {
                    id,
                    reason: e.to_string(),
                })?;
            let mut by_reason = BTreeMap::new();
            for e in &entries {
                *by_reason.entry(e.reason.name().to_owned()).or_insert(0) += 1;
            }
            return Ok(DeadLetterPage {
                subscription: id,
                total: entries.len() as u64,
                offset: offset as u64,
                entries: entries
                    .iter()
                    .skip(offset)
                    .take(limit)
                    .map(DeadLetterEntry::of_durable)
                    .collect(),
                by_reason,
            });
        }
        sub.with_dead_letters(|dlq| {
            let mut by_reason = BTreeMap::new();
            for e in dlq.iter() {
                *by_reason.entry(e.reason.name().to_owned()).or_insert(0) += 1;
            }
            Ok(DeadLetterPage {
                subscription: id,
                total: dlq.len() as u64,
                offset: offset as u64,
                entries: dlq
                    .iter()
                    .skip(offset)
                    .take(limit)
                    .map(DeadLetterEntry::of)
                    .collect(),
                by_reason,
            })
        })
    }

    /// Re-offer the selected dead-letter entries of subscription `id`, in DLQ order
    /// (R-DEL-4). Loss-safe: each entry is taken out of the DLQ atomically (so two
    /// concurrent redrives never offer one entry twice) and then re-offered; an offer
    /// refused because the queue is full dead-letters it again (`overflow`), one refused
    /// because the subscription is closing puts it back unchanged. Ids not in the DLQ are
    /// listed in [`RedriveOutcome::missing`].
    ///
    /// For a durable subscription the entries of its durable dead-letter log are redriven,
    /// as [`DurableSubscription::redrive_durable_dead_letters`](crate::DurableSubscription::redrive_durable_dead_letters)
    /// does (R-DEL-4, R-OPS-4): appended to the stream again and synced *before* their
    /// removal is recorded, so a crash in between redelivers, never loses; concurrent
    /// redrives are serialised, so an entry is appended once. The in-memory copies of the
    /// redriven messages (the subscription's volatile DLQ) are dropped with them.
    ///
    /// # Errors
    /// Unknown subscription; for a durable one, a closing subscription or a durable log or
    /// stream that cannot be read or written.
    pub fn redrive_dead_letters(
        &self,
        id: u64,
        selection: &RedriveSelection,
    ) -> Result<RedriveOutcome, DeadLetterError> {
        let sub = self
            .live_subscription(id)
            .ok_or(DeadLetterError::UnknownSubscription(id))?;
        let wanted: Option<HashSet<MessageId>> = match selection {
            RedriveSelection::All => None,
            RedriveSelection::Ids(ids) => Some(ids.iter().copied().collect()),
        };
        if let Some(durable) = self.durable_of(&sub) {
            let mut taken = HashSet::new();
            let accepted = durable
                .cursor
                .redrive_dead_letters(&mut |e| {
                    let pick = wanted.as_ref().is_none_or(|w| w.contains(&e.message.id()));
                    if pick {
                        taken.insert(e.message.id());
                    }
                    pick
                })
                .map_err(|e| DeadLetterError::durable(id, &e))?;
            if !taken.is_empty() {
                sub.remove_dead_letters(|e| taken.contains(&e.message.id()));
            }
            let missing = match selection {
                RedriveSelection::Ids(ids) => ids
                    .iter()
                    .filter(|i| !taken.contains(i))
                    .map(ToString::to_string)
                    .collect(),
                RedriveSelection::All => Vec::new(),
            };
            return Ok(RedriveOutcome {
                accepted: accepted as u64,
                missing,
                ..RedriveOutcome::default()
            });
        }
        let done = sub.redrive(|e| wanted.as_ref().is_none_or(|w| w.contains(&e.message.id())));
        let mut outcome = RedriveOutcome {
            accepted: done.accepted as u64,
            refused: done.overflowed as u64,
            returned: done.returned as u64,
            ..RedriveOutcome::default()
        };
        if let RedriveSelection::Ids(ids) = selection {
            let found: HashSet<MessageId> = done.taken.iter().copied().collect();
            outcome.missing = ids
                .iter()
                .filter(|i| !found.contains(i))
                .map(ToString::to_string)
                .collect();
        }
        Ok(outcome)
    }

    /// Remove every entry of subscription `id`'s dead-letter queue; returns how many.
    ///
    /// For a durable subscription its durable dead-letter log is drained, as
    /// [`DurableSubscription::drain_durable_dead_letters`](crate::DurableSubscription::drain_durable_dead_letters)
    /// does (the removal is durable once this returns), and its in-memory DLQ with it; the
    /// count is the durable entries removed.
    ///
    /// # Errors
    /// Unknown subscription; for a durable one, a closing subscription or a durable log that
    /// cannot be read or written (nothing is removed then).
    pub fn purge_dead_letters(&self, id: u64) -> Result<u64, DeadLetterError> {
        let sub = self
            .live_subscription(id)
            .ok_or(DeadLetterError::UnknownSubscription(id))?;
        if let Some(durable) = self.durable_of(&sub) {
            let drained = durable
                .cursor
                .drain_dead_letters()
                .map_err(|e| DeadLetterError::durable(id, &e))?;
            sub.drain_dead_letters();
            return Ok(drained.len() as u64);
        }
        let purged = sub.drain_dead_letters().len();
        Ok(purged as u64)
    }

    /// Move durable subscription `id`'s cursor to `at` and commit it at once (R-LOG-4), as
    /// [`DurableSubscription::seek`](crate::DurableSubscription::seek) does; returns the
    /// new position.
    ///
    /// # Errors
    /// Unknown subscription, a buffered subscription, or a position outside the stream
    /// (nothing changes then).
    pub fn seek_subscription(&self, id: u64, at: StartAt) -> Result<u64, SeekError> {
        let sub = self
            .live_subscription(id)
            .ok_or(SeekError::UnknownSubscription(id))?;
        let durable = self.durable_of(&sub).ok_or(SeekError::NotDurable(id))?;
        let target = durable.seek(at)?;
        Ok(target)
    }
}
