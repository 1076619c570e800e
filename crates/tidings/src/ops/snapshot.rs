//! One call that shows everything about a running broker (R-OPS-1, R-BP-3).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::broker::Broker;
use crate::durable::Stream;
use crate::durable::feeder::CursorFeeder;
use crate::message::{Priority, millis_since_epoch};
pub use crate::options::OptionsSummary;
use crate::stats::SubscriptionStats;
use crate::subscription::handle::SubscriptionId;
use crate::subscription::shell::SubscriptionShell;

/// Everything about a broker at one moment (R-OPS-1).
///
/// Each subscription's figures are read under that subscription's lock, so they are
/// consistent per subscription (R-DEL-6 holds within each entry at a quiescent point);
/// different subscriptions are read one after the other.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct BrokerSnapshot {
    /// The broker clock's wall time when the snapshot was taken, in ms since the Unix epoch.
    pub taken_at_ms: u64,
    /// The driver: `thread`, `pool`, `tokio` or `manual`.
    pub driver: String,
    /// True once close has begun.
    pub closed: bool,
    /// Delayed messages waiting in the scheduler.
    pub scheduled: u64,
    /// Every live subscription, by ascending id.
    pub subscriptions: Vec<SubscriptionSnapshot>,
    /// Every open stream, by name.
    pub streams: Vec<StreamSnapshot>,
}

impl BrokerSnapshot {
    /// The subscription with this numeric id, if it is in the snapshot.
    #[must_use]
    pub fn subscription(&self, id: u64) -> Option<&SubscriptionSnapshot> {
        self.subscriptions.iter().find(|s| s.id == id)
    }

    /// The first subscription with this name, if any.
    #[must_use]
    pub fn subscription_named(&self, name: &str) -> Option<&SubscriptionSnapshot> {
        self.subscriptions.iter().find(|s| s.name == name)
    }
}

/// Buffered (push, fed by the topic router) or durable (a cursor over a stream).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum SubscriptionKind {
    /// Fed by publish through the topic router into its bounded queue.
    Buffered,
    /// Fed from a stream by its cursor.
    Durable,
}

/// One subscription (R-OPS-1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SubscriptionSnapshot {
    /// Its numeric id ([`SubscriptionId::get`]).
    pub id: u64,
    /// Its name (the id's display form unless one was given).
    pub name: String,
    /// The pattern it subscribed with (a durable subscription's filter).
    pub pattern: String,
    /// Buffered or durable.
    pub kind: SubscriptionKind,
    /// What it was configured with.
    pub options: OptionsSummary,
    /// Its counters (R-DEL-6).
    pub counters: Counters,
    /// Messages queued, by priority level, lowest first (`low`, `normal`, `high`, `urgent`);
    /// they add up to `counters.queued`.
    pub depth_by_priority: Vec<u64>,
    /// How long the oldest queued message has waited, in ms (none when the queue is empty).
    pub oldest_age_ms: Option<u64>,
    /// Its in-memory dead-letter queue.
    pub dead_letters: DeadLetterSummary,
    /// Stream, position, committed offset and lag, for a durable subscription.
    pub durable: Option<DurableSnapshot>,
}

/// A subscription's counters (the figures of [`SubscriptionStats`], R-DEL-6), with the
/// dead-lettered and refused counts by reason name.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Counters {
    /// Messages offered.
    pub offered: u64,
    /// Offers that entered the queue.
    pub accepted: u64,
    /// Offers refused, by reason: `filtered`, `overflow`, `closed`.
    pub refused: BTreeMap<String, u64>,
    /// Handler successes.
    pub delivered: u64,
    /// Accepted messages that left without success, by reason: `retries_exhausted`,
    /// `rejected`, `expired`, `dropped_oldest`, `shutdown`.
    pub dead_lettered: BTreeMap<String, u64>,
    /// Messages queued now.
    pub queued: u64,
    /// Messages taken and not finished (running or waiting to retry).
    pub in_flight: u64,
    /// Handler calls (first attempts and retries).
    pub attempts: u64,
    /// Handler calls that failed.
    pub failures: u64,
    /// Failed handler calls that were followed by (or are waiting for) another attempt:
    /// `failures - retries_exhausted - rejected`.
    pub redelivered: u64,
    /// Publishers blocked under `Overflow::Block` now.
    pub blocked_publishers: u64,
    /// Messages handed back to their cursor unstarted (a keyed group's key moved away:
    /// [`SubscriptionStats::released`]).
    #[serde(default)]
    pub released: u64,
}

impl Counters {
    /// Sum of the refused counts.
    #[must_use]
    pub fn refused_total(&self) -> u64 {
        self.refused.values().sum()
    }
    /// Sum of the dead-lettered counts.
    #[must_use]
    pub fn dead_lettered_total(&self) -> u64 {
        self.dead_lettered.values().sum()
    }

    pub(crate) fn of(s: &SubscriptionStats) -> Self {
        let refused = BTreeMap::from([
            ("filtered".to_owned(), s.refused.filtered),
            ("overflow".to_owned(), s.refused.overflow),
            ("closed".to_owned(), s.refused.closed),
        ]);
        let d = &s.dead_lettered;
        let dead_lettered = BTreeMap::from([
            ("retries_exhausted".to_owned(), d.retries_exhausted),
            ("rejected".to_owned(), d.rejected),
            ("expired".to_owned(), d.expired),
            ("dropped_oldest".to_owned(), d.dropped_oldest),
            ("shutdown".to_owned(), d.shutdown),
        ]);
        Self {
            offered: s.offered,
            accepted: s.accepted,
            refused,
            delivered: s.delivered,
            dead_lettered,
            queued: s.queued,
            in_flight: s.in_flight,
            attempts: s.attempts,
            failures: s.failures,
            redelivered: s.failures.saturating_sub(d.retries_exhausted + d.rejected),
            blocked_publishers: s.blocked_publishers,
            released: s.released,
        }
    }
}

/// A dead-letter queue's size (R-OPS-1).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DeadLetterSummary {
    /// Entries in it now.
    pub len: u64,
    /// Entries now in it, by [`DeadLetterReason::name`](crate::DeadLetterReason::name).
    pub by_reason: BTreeMap<String, u64>,
    /// Entries evicted because it was full.
    pub evicted: u64,
}

/// The durable side of a durable subscription (R-OPS-1, R-BP-3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DurableSnapshot {
    /// Its durable name.
    pub name: String,
    /// The stream it reads.
    pub stream: String,
    /// The next offset its reader will read.
    pub position: u64,
    /// The committed position: every offset below it is finished, durably.
    pub committed: u64,
    /// `stream end offset - committed`.
    pub lag: u64,
    /// Messages offered and not yet finished.
    pub outstanding: u64,
    /// Offsets skipped because retention removed them before they were read.
    pub skipped: u64,
    /// Records skipped because they could not be read (damaged on disk, R-LIM-2).
    #[serde(default)]
    pub unreadable: u64,
    /// Why its reader halted, if it did.
    pub error: Option<String>,
    /// Entries in its durable dead-letter store (drained and redriven ones left out).
    pub dead_letter_log_len: u64,
}

/// One open stream (R-OPS-1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StreamSnapshot {
    /// Its name.
    pub name: String,
    /// The patterns it captures.
    pub patterns: Vec<String>,
    /// The earliest retained offset.
    pub start_offset: u64,
    /// One past the last readable record.
    pub end_offset: u64,
    /// Records retained: `end_offset - start_offset`.
    pub records: u64,
    /// Bytes stored (the embedded log: its segment files on disk; 0 where the backend
    /// does not say).
    pub bytes: u64,
    /// Number of segment files (0 where the backend has none).
    pub segments: u64,
    /// Retention: largest total size kept, in bytes.
    pub retention_max_bytes: Option<u64>,
    /// Retention: oldest age kept, in ms.
    pub retention_max_age_ms: Option<u64>,
    /// When an append counts as stored: the embedded log's fsync policy (`always`,
    /// `interval(100ms)`, `never`); empty where the backend does not say.
    pub fsync: String,
    /// Where it is stored: the embedded log's directory, or the backend's own location.
    pub dir: String,
}

/// The name the snapshot gives a driver.
impl Broker {
    /// Everything about this broker now, in one call (R-OPS-1): every live subscription
    /// (kind, pattern, options, counters, depth by priority, in-flight, oldest age, DLQ by
    /// reason; stream, position, committed offset and lag for durable ones) and every open
    /// stream (offsets, bytes, segments, retention). Serializable with `serde`.
    ///
    /// Takes each subscription's lock briefly, one at a time; never blocks publishers for
    /// longer than one `stats()` call does. Stream sizes are read from the directory.
    #[must_use]
    pub fn snapshot(&self) -> BrokerSnapshot {
        let inner = &self.inner;
        let durables: HashMap<SubscriptionId, Arc<CursorFeeder>> = inner
            .durables
            .live_feeders()
            .into_iter()
            .map(|f| (f.sub_id, f))
            .collect();
        let mut subs = inner.user_subscriptions();
        subs.sort_by_key(|s| s.id);
        let subscriptions = subs
            .iter()
            .map(|s| subscription_snapshot(s, durables.get(&s.id)))
            .collect();
        let streams = inner
            .durables
            .streams
            .read()
            .values()
            .map(|s| stream_snapshot(&Stream { inner: s.clone() }))
            .collect();
        BrokerSnapshot {
            taken_at_ms: millis_since_epoch(inner.clock.wall()),
            driver: inner.driver_name.to_owned(),
            closed: self.is_closed(),
            scheduled: self.scheduled() as u64,
            subscriptions,
            streams,
        }
    }
}

fn subscription_snapshot(
    s: &SubscriptionShell,
    durable: Option<&Arc<CursorFeeder>>,
) -> SubscriptionSnapshot {
    let stats = s.stats();
    let depth = s.depth_by_priority();
    let by_reason = s.with_dead_letters(|dlq| {
        let mut by_reason = BTreeMap::new();
        for e in dlq.iter() {
            *by_reason.entry(e.reason.name().to_owned()).or_insert(0) += 1;
        }
        by_reason
    });
    debug_assert_eq!(depth.len(), Priority::LEVELS);
    SubscriptionSnapshot {
        id: s.id.get(),
        name: s.name.to_string(),
        pattern: s.pattern.as_str().to_owned(),
        kind: if durable.is_some() {
            SubscriptionKind::Durable
        } else {
            SubscriptionKind::Buffered
        },
        options: s.settings.summary.clone(),
        counters: Counters::of(&stats),
        depth_by_priority: depth.to_vec(),
        oldest_age_ms: stats.oldest_age.map(|a| a.as_millis() as u64),
        dead_letters: DeadLetterSummary {
            len: stats.dlq_len,
            by_reason,
            evicted: stats.dlq_evicted,
        },
        durable: durable.map(|d| durable_snapshot(d)),
    }
}

fn durable_snapshot(d: &CursorFeeder) -> DurableSnapshot {
    let st = d.cursor.state();
    // The backend keeps the DLQ: one replay of it (a failure shows as 0, the cursor's
    // error says why when it matters).
    let dead_letters = d.cursor.dead_letters().map_or(0, |e| e.len() as u64);
    DurableSnapshot {
        name: d.name.clone(),
        stream: d.stream.clone(),
        position: st.position,
        committed: st.committed,
        lag: st.lag,
        outstanding: st.outstanding as u64,
        skipped: st.skipped,
        unreadable: st.unreadable,
        error: st.error,
        dead_letter_log_len: dead_letters,
    }
}

fn stream_snapshot(s: &Stream) -> StreamSnapshot {
    let (start, end) = (s.start_offset(), s.end_offset());
    let retention = s.config().retention_policy();
    let storage = s.storage_info();
    StreamSnapshot {
        name: s.name().to_owned(),
        patterns: s.patterns().iter().map(|p| p.as_str().to_owned()).collect(),
        start_offset: start,
        end_offset: end,
        records: end.saturating_sub(start),
        bytes: storage.bytes,
        segments: storage.segments,
        retention_max_bytes: retention.max_bytes,
        retention_max_age_ms: retention.max_age.map(|a| a.as_millis() as u64),
        fsync: storage.durability,
        dir: storage.location,
    }
}
