//! Serial and keyed-lane dispatch (R-CORE-3, R-ORD-1, R-ORD-3).
//!
//! Each lane is one priority-then-FIFO queue with at most one message in flight; a failing
//! (or deferred) message is parked at the head of its lane until it is due (head-of-line,
//! R-ORD-1).
//! Within one key, publish order wins over priority (R-ORD-5): priority orders messages of
//! different keys and unkeyed ones (see [`PriorityQueue`]).
//! `Serial` is one lane. With `n` lanes a message goes to lane `fnv1a(key) % n`; messages
//! without a key go to lane 0, so order holds per key and lanes run in parallel.
//!
//! # Memory
//! An idle lane is 24 bytes: its queue allocates on the first push, and a parked retry is
//! boxed (a retry is the rare path; an idle subscription holds none). A serial
//! subscription's one lane is inline ([`Slots`]).

use std::time::Instant;

use crate::clock::{EnqueueStamp, Now};
use crate::queue::{PriorityQueue, Queued};

use super::core::{Parked, Take};
use super::slots::Slots;

#[derive(Debug, Default)]
struct Lane {
    queue: PriorityQueue,
    running: bool,
    parked: Option<Box<Parked>>,
}

#[derive(Debug)]
pub(crate) struct Lanes {
    lanes: Slots<Lane>,
}

impl Lanes {
    pub(crate) fn new(n: usize) -> Self {
        Self {
            lanes: Slots::new(n, Lane::default),
        }
    }

    pub(crate) fn lane_of(&self, key: Option<&[u8]>) -> usize {
        match key {
            Some(k) if self.lanes.len() > 1 => (fnv1a(k) % self.lanes.len() as u64) as usize,
            _ => 0,
        }
    }

    /// Enqueue; returns the lane whose dispatcher should be woken.
    pub(crate) fn push(&mut self, item: Queued) -> usize {
        let lane = self.lane_of(item.message.key());
        self.lanes[lane].queue.push(item);
        lane
    }

    pub(crate) fn take(&mut self, worker: usize, now: &Now<'_>) -> Take {
        let lane = &mut self.lanes[worker];
        if lane.running {
            return Take::Empty;
        }
        if let Some(parked) = &lane.parked {
            if parked.due > now.mono() {
                return Take::WakeAt(parked.due);
            }
            lane.running = true;
            return lane.parked.take().map_or(Take::Empty, |p| Take::Retry(*p));
        }
        match lane.queue.pop() {
            Some(q) => {
                lane.running = true;
                Take::Fresh(q)
            }
            None => Take::Empty,
        }
    }

    /// Hold the next message of a single-lane subscription for its dispatcher's batch
    /// (see [`PriorityQueue::hold_plain`]); `None` with several lanes.
    pub(crate) fn hold_plain(&mut self) -> Option<std::sync::Arc<crate::message::Message>> {
        if self.lanes.len() != 1 {
            return None;
        }
        self.lanes[0].queue.hold_plain()
    }

    /// Hold the started first message of a batch ahead of the others.
    pub(crate) fn hold_started(&mut self, message: std::sync::Arc<crate::message::Message>) {
        self.lanes[0].queue.hold_started(message);
    }

    /// Messages held for a batch.
    pub(crate) fn held(&self) -> usize {
        self.lanes[0].queue.held()
    }

    /// Put the newest held message back in place.
    pub(crate) fn unhold_last(&mut self) -> bool {
        self.lanes[0].queue.unhold_last()
    }

    /// The oldest held message, no longer held.
    pub(crate) fn release_held(&mut self) -> Option<Queued> {
        self.lanes[0].queue.release_held()
    }

    pub(crate) fn finish(&mut self, worker: usize, parked: Option<Parked>) {
        let lane = &mut self.lanes[worker];
        lane.running = false;
        lane.parked = parked.map(Box::new);
    }

    /// `DropOldest`: evict from the lane the newcomer goes to, else from the fullest lane.
    pub(crate) fn evict_for(&mut self, key: Option<&[u8]>) -> Option<Queued> {
        let target = self.lane_of(key);
        if !self.lanes[target].queue.is_empty() {
            return self.lanes[target].queue.pop_oldest_lowest();
        }
        self.lanes
            .iter_mut()
            .max_by_key(|l| l.queue.len())
            .and_then(|l| l.queue.pop_oldest_lowest())
    }

    /// Take the waiting retries, and the deferred messages too when `deferred`.
    pub(crate) fn take_parked(&mut self, deferred: bool) -> Vec<Parked> {
        self.lanes
            .iter_mut()
            .filter_map(|l| l.parked.take_if(|p| deferred || !p.deferred).map(|p| *p))
            .collect()
    }

    pub(crate) fn drain_queued(&mut self) -> Vec<Queued> {
        self.lanes
            .iter_mut()
            .flat_map(|l| l.queue.drain())
            .collect()
    }

    pub(crate) fn next_wake(&self) -> Option<Instant> {
        self.lanes
            .iter()
            .filter_map(|l| l.parked.as_ref().map(|p| p.due))
            .min()
    }

    /// Queued messages per priority level, lowest first (R-OPS-1 snapshot).
    pub(crate) fn depth_by_priority(&self, out: &mut [u64; crate::message::Priority::LEVELS]) {
        for lane in self.lanes.iter() {
            lane.queue.depth_by_level(out);
        }
    }

    /// Some lane holds a message of a lower priority than `p`.
    pub(crate) fn has_below(&self, p: crate::message::Priority) -> bool {
        self.lanes.iter().any(|l| l.queue.has_below(p))
    }

    pub(crate) fn oldest_enqueued(&self) -> Option<EnqueueStamp> {
        self.lanes
            .iter()
            .filter_map(|l| l.queue.oldest_enqueued())
            .min()
    }
}

/// FNV-1a: stable across runs and platforms, so a key always lands in the same lane.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}
