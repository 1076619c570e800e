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
//! # The local lease
//! A lease renewed by a request sent at `t` is valid here until `t + lease − lease/10`:
//! the server cannot expire the entry before `t + lease`, so this process stops starting
//! handlers, pulling and sending keep-alives a tenth of the lease before another member
//! could take the partition. `Instant` is the monotonic clock, which keeps running while
//! the process is stopped (SIGSTOP): a process resumed after a long pause finds its
//! leases lapsed before it does anything else.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_nats::jetstream::kv;
use futures_util::StreamExt;
use tidings::StreamErrorKind;
use tidings::durable::CursorWaker;

use super::super::backend_error;
use crate::connect::JetStream;

/// The value of a partition entry no member holds (after a clean hand-over).
const FREE: &str = "free";

/// One partition's lease as this process holds it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Held {
    /// The entry's revision, for the next compare-and-set.
    revision: u64,
    /// Starts, pulls and keep-alives stop at this instant (see the module docs).
    valid_until: Instant,
    /// Wanted by another member: start nothing more, hand over.
    handing: bool,
    /// The partition's messages were given back (the hand-over's last step here).
    handed_back: bool,
    /// Which taking of the partition this is (renewals keep it): messages fetched under
    /// an earlier one are stale.
    term: u64,
}

/// The leases of one member, shared by the round task and the cursor.
pub(crate) struct Leases {
    parts: Mutex<Vec<Option<Held>>>,
    /// The last term given out.
    terms: std::sync::atomic::AtomicU64,
}

/// What the cursor may do with one partition now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Standing {
    /// Not held here (or lapsed).
    None,
    /// Held: pull and start.
    Active,
    /// Held, wanted elsewhere: start nothing, give the messages back.
    Handing,
}

impl Leases {
    pub(crate) fn new(partitions: u32) -> Arc<Self> {
        Arc::new(Self {
            parts: Mutex::new(vec![None; partitions as usize]),
            terms: std::sync::atomic::AtomicU64::new(0),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Option<Held>>> {
        self.parts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Partition `p`'s standing now, and the term of its lease.
    pub(crate) fn standing(&self, p: u32) -> (Standing, u64) {
        let parts = self.lock();
        match parts.get(p as usize).copied().flatten() {
            Some(h) if Instant::now() < h.valid_until => {
                if h.handing {
                    (Standing::Handing, h.term)
                } else {
                    (Standing::Active, h.term)
                }
            }
            _ => (Standing::None, 0),
        }
    }

    /// Whether a handler may start on partition `p`'s messages fetched under lease term
    /// `term` now (and its cursor pull and send keep-alives).
    pub(crate) fn admits(&self, p: u32, term: u64) -> bool {
        self.standing(p) == (Standing::Active, term)
    }

    /// The cursor gave partition `p`'s messages back: the round marks it free.
    pub(crate) fn handed_back(&self, p: u32) {
        if let Some(Some(h)) = self.lock().get_mut(p as usize) {
            h.handed_back = true;
        }
    }

    /// The partitions held now (lapsed ones included), for a clean close.
    pub(crate) fn held(&self) -> Vec<(u32, u64)> {
        self.lock()
            .iter()
            .enumerate()
            .filter_map(|(p, h)| h.map(|h| (u32::try_from(p).unwrap_or(0), h.revision)))
            .collect()
    }

    /// Forget every lease (closing).
    pub(crate) fn clear(&self) {
        self.lock().iter_mut().for_each(|h| *h = None);
    }
}

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

/// The live member partition `p` belongs to: the highest hash of (member, partition)
/// (FNV-1a-64 of the member, mixed with the partition), ties to the smaller name.
pub(crate) fn rendezvous(members: &[String], p: u32) -> Option<&str> {
    members
        .iter()
        .max_by(|a, b| {
            score(a, p)
                .cmp(&score(b, p))
                .then_with(|| b.as_str().cmp(a.as_str()))
        })
        .map(String::as_str)
}

fn score(member: &str, p: u32) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in member.bytes() {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // SplitMix64's finalizer over (member hash, partition): every bit of both matters.
    let mut z = hash ^ u64::from(p).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The round task of member `me` (see the module docs): runs until aborted.
#[derive(Clone)]
pub(crate) struct Rounds {
    pub(crate) store: kv::Store,
    pub(crate) leases: Arc<Leases>,
    pub(crate) me: String,
    pub(crate) partitions: u32,
    pub(crate) lease: Duration,
    pub(crate) waker: CursorWaker,
}

impl Rounds {
    /// Until the local lease of a request sent at `sent` lapses.
    fn valid_from(&self, sent: Instant) -> Instant {
        sent + self.lease - self.lease / 10
    }

    pub(crate) async fn run(self) {
        let period = self.lease / 4;
        loop {
            let changed = self.round().await;
            if changed {
                self.waker.wake();
            }
            tokio::time::sleep(period).await;
        }
    }

    /// One round; whether a lease changed.
    pub(crate) async fn round(&self) -> bool {
        let member_key = format!("m.{}", self.me);
        if self
            .store
            .put(&member_key, bytes::Bytes::new())
            .await
            .is_err()
        {
            // Server away: the leases lapse by themselves if this lasts.
            return self.drop_lapsed();
        }
        let Some(members) = self.members().await else {
            return self.drop_lapsed();
        };
        let mut changed = self.drop_lapsed();
        for p in 0..self.partitions {
            let wanted_here = rendezvous(&members, p) == Some(self.me.as_str());
            let held = self.leases.lock()[p as usize];
            changed |= match held {
                Some(h) => self.keep(p, h, wanted_here).await,
                None if wanted_here => self.take(p).await,
                None => false,
            };
        }
        changed
    }

    /// Forget leases whose local validity ended; whether any did.
    fn drop_lapsed(&self) -> bool {
        let now = Instant::now();
        let mut changed = false;
        for h in self.leases.lock().iter_mut() {
            if h.is_some_and(|h| now >= h.valid_until) {
                *h = None;
                changed = true;
            }
        }
        changed
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
        if !members.contains(&self.me) {
            members.push(self.me.clone());
        }
        Some(members)
    }

    /// A held lease: renewed, handed over, or lost; whether it changed.
    async fn keep(&self, p: u32, mut h: Held, wanted_here: bool) -> bool {
        let key = format!("p.{p}");
        if h.handed_back {
            // The cursor gave everything back: free it for the member that wants it.
            let _ = self.store.update(&key, FREE.into(), h.revision).await;
            self.leases.lock()[p as usize] = None;
            return true;
        }
        let sent = Instant::now();
        match self
            .store
            .update(&key, self.me.clone().into(), h.revision)
            .await
        {
            Ok(revision) => {
                h.revision = revision;
                h.valid_until = self.valid_from(sent);
                let newly_handing = !wanted_here && !h.handing;
                h.handing |= !wanted_here;
                let mut parts = self.leases.lock();
                // Unless the cursor lapsed it meanwhile.
                if parts[p as usize].is_some() {
                    let handed_back = parts[p as usize].is_some_and(|x| x.handed_back);
                    h.handed_back |= handed_back;
                    parts[p as usize] = Some(h);
                }
                newly_handing
            }
            Err(e) => {
                if matches!(e.kind(), kv::UpdateErrorKind::WrongLastRevision) {
                    // Another member holds it now: this one's lease is gone.
                    self.leases.lock()[p as usize] = None;
                    return true;
                }
                // Server away: kept until it lapses.
                false
            }
        }
    }

    /// Takes partition `p` if nobody holds it; whether it did.
    async fn take(&self, p: u32) -> bool {
        let key = format!("p.{p}");
        let sent = Instant::now();
        let taken = match self.store.entry(&key).await {
            Ok(None) => self.store.create(&key, self.me.clone().into()).await.ok(),
            Ok(Some(e))
                if e.operation != kv::Operation::Put
                    || e.value.as_ref() == FREE.as_bytes()
                    || e.value.as_ref() == self.me.as_bytes() =>
            {
                self.store
                    .update(&key, self.me.clone().into(), e.revision)
                    .await
                    .ok()
            }
            // Another member holds it: it hands over, or its lease expires.
            Ok(Some(_)) | Err(_) => None,
        };
        let Some(revision) = taken else {
            return false;
        };
        let term = self
            .leases
            .terms
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        self.leases.lock()[p as usize] = Some(Held {
            revision,
            valid_until: self.valid_from(sent),
            handing: false,
            handed_back: false,
            term,
        });
        true
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every partition has one owner among the members, and a member joining takes
    /// partitions only from the others (none move between those that stay).
    #[test]
    fn rendezvous_moves_only_what_a_joining_member_takes() {
        let two: Vec<String> = vec!["a".into(), "b".into()];
        let three: Vec<String> = vec!["a".into(), "b".into(), "c".into()];
        let mut taken = 0;
        for p in 0..64 {
            let before = rendezvous(&two, p).expect("an owner");
            let after = rendezvous(&three, p).expect("an owner");
            if after == "c" {
                taken += 1;
            } else {
                assert_eq!(before, after, "partition {p} moved between staying members");
            }
        }
        assert!((10..=40).contains(&taken), "c took {taken} of 64");
        assert_eq!(rendezvous(&[], 0), None);
    }
}
