//! Per-key ordering with concurrency (R-ORD-4).
//!
//! Messages wait in one FIFO per key. A key is *ready* when it has waiting messages and
//! nothing in flight, waiting to retry or deferred; ready keys are ordered by (priority, arrival) of
//! their head message, so the next dispatched message is the earliest, highest-priority
//! one whose key is free. A retrying (or deferred) key is parked with its due time and
//! blocks only itself; parked messages do not occupy a dispatcher slot while they wait. Within a key,
//! order is strictly publish order (priority never reorders one key's messages).

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Instant;

use bytes::Bytes;

use crate::clock::{EnqueueStamp, Now};
use crate::queue::Queued;

use super::core::{Parked, Take};

type Key = Option<Bytes>;

#[derive(Debug, Default)]
struct KeyQueue {
    pending: VecDeque<(u64, Queued)>,
    busy: bool,
}

#[derive(Debug, Default)]
pub(crate) struct PerKey {
    keys: HashMap<Key, KeyQueue>,
    /// Ready keys by (higher priority first, earlier arrival first) of their head.
    ready: BTreeMap<(Reverse<u8>, u64), Key>,
    parked: Vec<Parked>,
    seq: u64,
}

impl PerKey {
    pub(crate) fn push(&mut self, item: Queued) {
        let key: Key = item.message.key.clone();
        let seq = self.seq;
        self.seq += 1;
        let prio = item.message.priority() as u8;
        let kq = self.keys.entry(key.clone()).or_default();
        kq.pending.push_back((seq, item));
        if !kq.busy && kq.pending.len() == 1 {
            self.ready.insert((Reverse(prio), seq), key);
        }
    }

    pub(crate) fn take(&mut self, now: &Now<'_>) -> Take {
        if self.parked.is_empty() {
            return self.take_ready();
        }
        let now = now.mono();
        if let Some(i) = self
            .parked
            .iter()
            .enumerate()
            .filter(|(_, p)| p.due <= now)
            .min_by_key(|(_, p)| p.due)
            .map(|(i, _)| i)
        {
            return Take::Retry(self.parked.swap_remove(i));
        }
        match self.take_ready() {
            Take::Empty => self.next_wake().map_or(Take::Empty, Take::WakeAt),
            fresh => fresh,
        }
    }

    fn take_ready(&mut self) -> Take {
        if let Some((_, key)) = self.ready.pop_first() {
            let kq = self.keys.get_mut(&key).expect("ready key has a queue");
            let (_, item) = kq.pending.pop_front().expect("ready key has a message");
            kq.busy = true;
            return Take::Fresh(item);
        }
        Take::Empty
    }

    pub(crate) fn finish(&mut self, key: &Key, parked: Option<Parked>) {
        if let Some(p) = parked {
            self.parked.push(p);
            return;
        }
        let Some(kq) = self.keys.get_mut(key) else {
            return;
        };
        kq.busy = false;
        match kq.pending.front() {
            Some((seq, head)) => {
                let prio = head.message.priority() as u8;
                self.ready.insert((Reverse(prio), *seq), key.clone());
            }
            None => {
                self.keys.remove(key);
            }
        }
    }

    /// `DropOldest`: the oldest message of the newcomer's own key, else the oldest overall.
    pub(crate) fn evict_for(&mut self, key: Option<&[u8]>) -> Option<Queued> {
        let own: Key = key.map(Bytes::copy_from_slice);
        let victim_key = if self.keys.get(&own).is_some_and(|k| !k.pending.is_empty()) {
            own
        } else {
            self.keys
                .iter()
                .filter_map(|(k, q)| q.pending.front().map(|(seq, _)| (*seq, k)))
                .min_by_key(|(seq, _)| *seq)
                .map(|(_, k)| k.clone())?
        };
        let kq = self.keys.get_mut(&victim_key)?;
        let (seq, item) = kq.pending.pop_front()?;
        if !kq.busy {
            let prio = item.message.priority() as u8;
            self.ready.remove(&(Reverse(prio), seq));
            if let Some((next_seq, head)) = kq.pending.front() {
                let p = head.message.priority() as u8;
                self.ready
                    .insert((Reverse(p), *next_seq), victim_key.clone());
            } else {
                self.keys.remove(&victim_key);
            }
        }
        Some(item)
    }

    /// Take the waiting retries, and the deferred messages too when `deferred`. Each key
    /// freed this way is ready again if messages wait behind it, so a drain delivers them
    /// (as a lane does once its parked retry is gone).
    pub(crate) fn take_parked(&mut self, deferred: bool) -> Vec<Parked> {
        let (taken, kept) = std::mem::take(&mut self.parked)
            .into_iter()
            .partition(|p| deferred || !p.deferred);
        self.parked = kept;
        for p in &taken {
            self.finish(&p.message.key, None);
        }
        taken
    }

    pub(crate) fn drain_queued(&mut self) -> Vec<Queued> {
        self.ready.clear();
        let mut all: Vec<(u64, Queued)> = self
            .keys
            .drain()
            .flat_map(|(_, kq)| kq.pending.into_iter())
            .collect();
        all.sort_by_key(|(seq, _)| *seq);
        all.into_iter().map(|(_, q)| q).collect()
    }

    pub(crate) fn next_wake(&self) -> Option<Instant> {
        self.parked.iter().map(|p| p.due).min()
    }

    /// Queued messages per priority level, lowest first (R-OPS-1 snapshot).
    pub(crate) fn depth_by_priority(&self, out: &mut [u64; crate::message::Priority::LEVELS]) {
        for k in self.keys.values() {
            for (_, q) in &k.pending {
                out[q.message.priority().index()] += 1;
            }
        }
    }

    pub(crate) fn oldest_enqueued(&self) -> Option<EnqueueStamp> {
        self.keys
            .values()
            .filter_map(|k| k.pending.front().map(|(_, q)| q.enqueued))
            .min()
    }
}
