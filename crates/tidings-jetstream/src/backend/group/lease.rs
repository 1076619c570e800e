//! A keyed group's leases: who may start the messages of each key partition (R-DIST-6).
//!
//! # The bucket
//! Each group has a key-value bucket of its own, `TIDINGS_g_<stream>_x<durable>`, whose
//! entries live `max_age` = the lease time = the ack wait (file storage, as many replicas
//! as the stream). It holds `m.<member>` for every live member and `p.<n>` naming the
//! member that holds partition `n` (or `free` after a clean hand-over).
//!
//! # A round, every quarter of the lease
//! Each member writes `m.<member>` (so it is live for one more lease), lists the live
//! members, and gives each partition to the live member with the highest rendezvous hash
//! of (member, partition): no membership configuration, and a join or leave moves only
//! the partitions of that member. Then, per partition:
//! - held and still wanted here: renewed by compare-and-set on its revision;
//! - held and wanted elsewhere: handed over cleanly (see `super`), then marked `free`;
//! - not held and wanted here: taken when absent (expired), `free`, or deleted.
//!
//! # Decisions and I/O
//! What a round writes, and what an answer means, is the member's state machine's
//! ([`super::machine`]): this file only carries its [`LeaseOp`]s to the bucket and
//! brings the answers back. The machine is locked only between the calls, never across
//! one.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv;
use futures_util::StreamExt;
use tidings::StreamErrorKind;
use tidings::durable::CursorWaker;

use super::super::shared::backend_error;
use super::machine::{LeaseAnswer, LeaseOp, Now};
use super::state::{State, lock};
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
    pub(crate) store: kv::Store,
    pub(crate) state: Arc<std::sync::Mutex<State>>,
    pub(crate) me: String,
    pub(crate) lease: Duration,
    pub(crate) waker: CursorWaker,
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
        let Some(members) = self.members().await else {
            return false;
        };
        let ops = lock(&self.state).machine.plan(&members, Now::read());
        let mut answered = false;
        for op in ops {
            let sent = Now::read();
            let answer = self.write(op).await;
            answered |= answer != LeaseAnswer::Unanswered;
            lock(&self.state)
                .machine
                .lease_answer(op, sent, answer, Now::read());
        }
        answered
    }

    async fn members(&self) -> Option<Vec<String>> {
        let mut keys = self.store.keys().await.ok()?;
        let mut members = Vec::new();
        while let Some(k) = keys.next().await {
            let k = k.ok()?;
            if let Some(m) = k.strip_prefix("m.") {
                members.push(m.to_owned());
            }
        }
        Some(members)
    }

    /// Carries `op` to the bucket.
    async fn write(&self, op: LeaseOp) -> LeaseAnswer {
        let update = |e: kv::UpdateError| {
            if matches!(e.kind(), kv::UpdateErrorKind::WrongLastRevision) {
                LeaseAnswer::Lost
            } else {
                LeaseAnswer::Unanswered
            }
        };
        match op {
            LeaseOp::Renew { p, revision } => self
                .store
                .update(format!("p.{p}"), self.me.clone().into(), revision)
                .await
                .map_or_else(update, LeaseAnswer::Written),
            LeaseOp::Free { p, revision } => self
                .store
                .update(format!("p.{p}"), FREE.into(), revision)
                .await
                .map_or_else(update, LeaseAnswer::Written),
            LeaseOp::Take { p } => {
                let key = format!("p.{p}");
                match self.store.entry(&key).await {
                    Ok(None) => match self.store.create(&key, self.me.clone().into()).await {
                        Ok(revision) => LeaseAnswer::Written(revision),
                        Err(e) if matches!(e.kind(), kv::CreateErrorKind::AlreadyExists) => {
                            LeaseAnswer::Lost
                        }
                        Err(_) => LeaseAnswer::Unanswered,
                    },
                    // Expired or deleted (absent above, or a delete marker), freed by a clean
                    // hand-over, or this member's own from an earlier term.
                    Ok(Some(e))
                        if e.operation != kv::Operation::Put
                            || e.value.as_ref() == FREE.as_bytes()
                            || e.value.as_ref() == self.me.as_bytes() =>
                    {
                        self.store
                            .update(&key, self.me.clone().into(), e.revision)
                            .await
                            .map_or_else(update, LeaseAnswer::Written)
                    }
                    // Another member holds it: it hands over, or its lease expires.
                    Ok(Some(_)) => LeaseAnswer::Lost,
                    Err(_) => LeaseAnswer::Unanswered,
                }
            }
        }
    }
}

/// Gives up this member's leases and membership at a clean close (its messages were
/// given back first).
pub(crate) async fn leave(store: &kv::Store, me: &str, held: &[(u32, u64)]) {
    for (p, revision) in held {
        let _ = store.update(format!("p.{p}"), FREE.into(), *revision).await;
    }
    let _ = store.purge(format!("m.{me}")).await;
}
