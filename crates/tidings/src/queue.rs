//! Priority-then-FIFO bounded queue (R-ORD-1).
//!
//! One FIFO per priority level and a bitmask of non-empty levels: push, pop and "evict the
//! oldest of the lowest level" are O(1). The capacity is enforced by the subscription core,
//! which owns the overflow policy; this type only orders.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use crate::message::{Message, Priority};

/// A queued message and when it entered the queue (for oldest-age visibility).
#[derive(Debug, Clone)]
pub(crate) struct Queued {
    pub(crate) message: Arc<Message>,
    pub(crate) enqueued: Instant,
}

#[derive(Debug, Default)]
pub(crate) struct PriorityQueue {
    levels: [VecDeque<Queued>; Priority::LEVELS],
    /// Bit `i` set ⇔ `levels[i]` is non-empty.
    occupied: u8,
    len: usize,
}

impl PriorityQueue {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn push(&mut self, item: Queued) {
        let level = item.message.priority().index();
        self.levels[level].push_back(item);
        self.occupied |= 1 << level;
        self.len += 1;
    }

    /// Highest priority first, FIFO within a level.
    pub(crate) fn pop(&mut self) -> Option<Queued> {
        if self.occupied == 0 {
            return None;
        }
        let level = 7 - self.occupied.leading_zeros() as usize;
        self.take_front(level)
    }

    /// The oldest message of the lowest non-empty level: the one `DropOldest` evicts.
    pub(crate) fn pop_oldest_lowest(&mut self) -> Option<Queued> {
        if self.occupied == 0 {
            return None;
        }
        let level = self.occupied.trailing_zeros() as usize;
        self.take_front(level)
    }

    /// Messages waiting at each priority level, lowest first (R-OPS-1 snapshot).
    pub(crate) fn depth_by_level(&self, out: &mut [u64; Priority::LEVELS]) {
        for (slot, level) in out.iter_mut().zip(&self.levels) {
            *slot += level.len() as u64;
        }
    }

    /// Enqueue time of the longest-waiting message, whatever its level.
    pub(crate) fn oldest_enqueued(&self) -> Option<Instant> {
        self.levels
            .iter()
            .filter_map(|l| l.front().map(|q| q.enqueued))
            .min()
    }

    /// Remove everything, in delivery order.
    pub(crate) fn drain(&mut self) -> Vec<Queued> {
        let mut out = Vec::with_capacity(self.len);
        while let Some(q) = self.pop() {
            out.push(q);
        }
        out
    }

    fn take_front(&mut self, level: usize) -> Option<Queued> {
        let item = self.levels[level].pop_front()?;
        if self.levels[level].is_empty() {
            self.occupied &= !(1 << level);
        }
        self.len -= 1;
        Some(item)
    }
}
