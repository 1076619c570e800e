//! A keyed group's leases: who may start the messages of each key partition (R-DIST-6).
//!
//! # The bucket
//! Each group has a key-value bucket of its own, `TIDINGS_g_<stream>_x<durable>`, whose
//! entries live `max_age` = the lease time = the ack wait (file storage, as many replicas
//! as the stream). It holds `m.<member>` for every live member and `p.<n>` naming the
//! member that holds partition `n` (or `free` after a clean hand-over).
//!
//! # A round, every quarter of the lease
//! Each member writes `m.<member>` (so it is live for one more lease), reads the last
//! entry of every key in one Direct Get ([`crate::client::kv_last`]: no consumer made on
//! the server) to learn the live members and the partition entries, and gives each
//! partition to the live member with the highest rendezvous hash of (member, partition):
//! no membership configuration, and a join or leave moves only the partitions of that
//! member. Then, per partition, all partitions' writes at once:
//! - held and still wanted here: renewed by compare-and-set on its revision;
//! - held and wanted elsewhere: handed over cleanly (see `super`), then marked `free`;
//! - not held and wanted here: taken when absent (expired), `free`, or deleted.
//!
//! # Decisions and I/O
//! What a round writes, and what an answer means, is the member's state machine's
//! ([`super::machine`]): this file only carries its [`LeaseOp`]s to the bucket and
//! brings the answers back. The machine is locked only between the calls, never across
//! one.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv;
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tidings::StreamErrorKind;
use tidings::durable::CursorWaker;

use super::super::shared::backend_error;
use super::machine::{LeaseAnswer, LeaseOp, Now};
use super::state::{State, lock};
use crate::client::kv_last::{KvLast, LastError, last_per_key};
use crate::connection::connect::JetStream;

/// The value of a partition entry no member holds (after a clean hand-over).
const FREE: &str = "free";

/// Opens (creating when absent) the group's bucket.
pub(crate) async fn open_bucket(
    js: &JetStream,
    bucket: &str,
    lease: Duration,
    replicas: usize,
) -> Result<kv::Store, tidings::StreamError> {
    let config = kv::Config {
        bucket: bucket.to_owned(),
        history: 1,
        max_age: lease,
        storage: async_nats::jetstream::stream::StorageType::File,
        num_replicas: replicas.max(1),
        ..Default::default()
    };
    match js.context.create_key_value(config).await {
        Ok(store) => Ok(store),
        // Made by another member meanwhile (or before): open it.
        Err(_) => js.context.get_key_value(bucket).await.map_err(|e| {
            backend_error(
                StreamErrorKind::Unavailable,
                format_args!("opening the keyed group's bucket {bucket}: {e}"),
            )
        }),
    }
}

/// The round task of member `me` (see the module docs): runs until aborted.
#[derive(Clone)]
pub(crate) struct Rounds {
    pub(crate) js: JetStream,
    pub(crate) store: kv::Store,
    pub(crate) state: Arc<std::sync::Mutex<State>>,
    pub(crate) me: String,
    pub(crate) lease: Duration,
    pub(crate) waker: CursorWaker,
}

/// What a round read of the bucket: the live members and, when read in the same request,
/// the partition entries.
struct Listing {
    members: Vec<String>,
    /// The last entry of every partition key (`p.<n>`; an absent key is absent), or
    /// `None` when listed through a consumer, which brings keys only: a take then reads
    /// its entry itself.
    parts: Option<HashMap<u32, KvLast>>,
}

/// A partition entry as a take judges it: put or marker, value, revision.
struct Seen {
    put: bool,
    value: bytes::Bytes,
    revision: u64,
}

impl Rounds {
    pub(crate) async fn run(self) {
        let period = self.lease / 4;
        loop {
            if self.round().await {
                self.waker.wake();
            }
            tokio::time::sleep(period).await;
        }
    }

    /// One round; whether a lease write was answered (the cursor may have work).
    pub(crate) async fn round(&self) -> bool {
        let member_key = format!("m.{}", self.me);
        if self
            .store
            .put(&member_key, bytes::Bytes::new())
            .await
            .is_err()
        {
            // Server away: the leases lapse by themselves if this lasts.
            return false;
        }
        let Some(listing) = self.listing().await else {
            return false;
        };
        let ops = lock(&self.state)
            .machine
            .plan(&listing.members, Now::read());
        // The writes of one round go out together (each its own partition, so no two
        // depend on each other), and each answer reaches the machine as it arrives, with
        // the time its own request was sent: a round costs one round trip, not one per
        // partition, and a slow answer delays only its own partition.
        let mut writes: FuturesUnordered<_> = ops
            .into_iter()
            .map(|op| {
                let listing = &listing;
                async move {
                    let sent = Now::read();
                    (op, sent, self.write(op, listing).await)
                }
            })
            .collect();
        let mut answered = false;
        while let Some((op, sent, answer)) = writes.next().await {
            answered |= answer != LeaseAnswer::Unanswered;
            lock(&self.state)
                .machine
                .lease_answer(op, sent, answer, Now::read());
        }
        answered
    }

    /// The live members (a put `m.<member>`; a deleted or purged one has left) and the
    /// partition entries, in one Direct Get that leaves nothing on the server; through a
    /// consumer (the server deletes it after its inactivity threshold) only where that
    /// cannot answer ([`LastError::Unsupported`]).
    async fn listing(&self) -> Option<Listing> {
        match last_per_key(&self.js, &self.store).await {
            Ok(entries) => {
                let mut members = Vec::new();
                let mut parts = HashMap::new();
                for e in entries {
                    if let Some(m) = e.key.strip_prefix("m.") {
                        if e.put {
                            members.push(m.to_owned());
                        }
                    } else if let Some(p) = e.key.strip_prefix("p.").and_then(|p| p.parse().ok()) {
                        parts.insert(p, e);
                    }
                }
                Some(Listing {
                    members,
                    parts: Some(parts),
                })
            }
            Err(LastError::Unanswered) => None,
            Err(LastError::Unsupported) => {
                let listed = async {
                    let mut keys = self.store.keys().await.ok()?;
                    let mut members = Vec::new();
                    while let Some(k) = keys.next().await {
                        let k = k.ok()?;
                        if let Some(m) = k.strip_prefix("m.") {
                            members.push(m.to_owned());
                        }
                    }
                    Some(members)
                };
                // Bounded like every other request of the round.
                let members = tokio::time::timeout(self.js.request_timeout(), listed)
                    .await
                    .ok()??;
                Some(Listing {
                    members,
                    parts: None,
                })
            }
        }
    }

    /// Carries `op` to the bucket.
    async fn write(&self, op: LeaseOp, listing: &Listing) -> LeaseAnswer {
        match op {
            LeaseOp::Renew { p, revision } => self.update(p, self.me.as_str(), revision).await,
            LeaseOp::Free { p, revision } => self.update(p, FREE, revision).await,
            LeaseOp::Take { p } => {
                let seen = match &listing.parts {
                    Some(parts) => parts.get(&p).map(|e| Seen {
                        put: e.put,
                        value: e.value.clone(),
                        revision: e.revision,
                    }),
                    None => match self.store.entry(format!("p.{p}")).await {
                        Ok(e) => e.map(|e| Seen {
                            put: e.operation == kv::Operation::Put,
                            value: e.value,
                            revision: e.revision,
                        }),
                        Err(_) => return LeaseAnswer::Unanswered,
                    },
                };
                self.take(p, seen).await
            }
        }
    }

    /// Takes partition `p`, whose entry was `seen`; a compare-and-set on what was seen, so
    /// an entry changed since loses.
    async fn take(&self, p: u32, seen: Option<Seen>) -> LeaseAnswer {
        match seen {
            None => match self
                .store
                .create(format!("p.{p}"), self.me.clone().into())
                .await
            {
                Ok(revision) => LeaseAnswer::Written(revision),
                Err(e) if matches!(e.kind(), kv::CreateErrorKind::AlreadyExists) => {
                    LeaseAnswer::Lost
                }
                Err(_) => LeaseAnswer::Unanswered,
            },
            // Expired or deleted (absent above, or a delete marker), freed by a clean
            // hand-over, or this member's own from an earlier term.
            Some(e)
                if !e.put
                    || e.value.as_ref() == FREE.as_bytes()
                    || e.value.as_ref() == self.me.as_bytes() =>
            {
                self.update(p, self.me.as_str(), e.revision).await
            }
            // Another member holds it: it hands over, or its lease expires.
            Some(_) => LeaseAnswer::Lost,
        }
    }

    /// Writes `value` to partition `p`'s entry by compare-and-set on `revision`.
    async fn update(&self, p: u32, value: &str, revision: u64) -> LeaseAnswer {
        match self
            .store
            .update(format!("p.{p}"), value.to_owned().into(), revision)
            .await
        {
            Ok(new) => LeaseAnswer::Written(new),
            Err(e) if matches!(e.kind(), kv::UpdateErrorKind::WrongLastRevision) => {
                LeaseAnswer::Lost
            }
            Err(_) => LeaseAnswer::Unanswered,
        }
    }
}

/// Gives up this member's leases and membership at a clean close (its messages were
/// given back first): the partitions freed together, then the membership purged.
pub(crate) async fn leave(store: &kv::Store, me: &str, held: &[(u32, u64)]) {
    futures_util::future::join_all(
        held.iter()
            .map(|(p, revision)| store.update(format!("p.{p}"), FREE.into(), *revision)),
    )
    .await;
    let _ = store.purge(format!("m.{me}")).await;
}
