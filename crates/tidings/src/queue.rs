//! Priority-then-FIFO bounded queue, per-key order first (R-ORD-1, R-ORD-5).
//!
//! # Ordering
//! * Messages without a key: higher priority first, publish order within a level.
//! * Messages with a key: publish order within the key, whatever their priorities
//!   (R-ORD-5). Priority orders *different* keys (and unkeyed messages): a key competes
//!   with the priority and publish sequence of its oldest waiting message, its head.
//!
//! # Cost
//! Unkeyed messages live in one FIFO per priority level with a bitmask of non-empty levels:
//! push and pop are O(1). Keyed messages live in one FIFO per key, and the keys' heads in an
//! ordered map: push is O(1) (O(log k) when a key becomes non-empty), pop and "evict the
//! oldest of the lowest level" are O(log k) for k keys waiting. The capacity is enforced by
//! the subscription core, which owns the overflow policy; this type only orders.
//!
//! # Memory
//! An empty queue that was never pushed to is one null pointer: its levels, key map and
//! head index (~200 bytes before any message) are allocated on the first push and kept,
//! so an idle subscription does not carry them.

use std::borrow::Borrow;
use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::Arc;

use crate::clock::EnqueueStamp;
use crate::message::{Message, Priority};

/// A queued message and when it entered the queue (for oldest-age visibility).
#[derive(Debug, Clone)]
pub(crate) struct Queued {
    pub(crate) message: Arc<Message>,
    /// 8 bytes, from the wall time the publish read anyway: see [`EnqueueStamp`].
    pub(crate) enqueued: EnqueueStamp,
}

/// FNV-1a for the key map: keys are short and hashing is on every push and pop. Flooding
/// one subscription's queue with colliding keys only slows that subscription (R-CORE-1),
/// and its size is bounded by the subscription's capacity.
#[derive(Default)]
pub(crate) struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut hash = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for b in bytes {
            hash ^= u64::from(*b);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        self.0 = hash;
    }
}

/// A map key: the key bytes of a message, held through the shared message so that no key
/// bytes are copied or re-counted per push.
#[derive(Debug)]
struct KeyOf(Arc<Message>);

impl KeyOf {
    fn bytes(&self) -> &[u8] {
        self.0.key().unwrap_or_default()
    }
}

impl PartialEq for KeyOf {
    fn eq(&self, other: &Self) -> bool {
        self.bytes() == other.bytes()
    }
}

impl Eq for KeyOf {}

impl Hash for KeyOf {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.bytes().hash(state);
    }
}

impl Borrow<[u8]> for KeyOf {
    fn borrow(&self) -> &[u8] {
        self.bytes()
    }
}

/// Position of a message in delivery order: (priority, publish sequence).
type Rank = (Reverse<u8>, u64);

#[derive(Debug, Default)]
pub(crate) struct PriorityQueue {
    /// `None` until the first push.
    inner: Option<Box<Inner>>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Unkeyed messages, one FIFO per level, with their sequence numbers.
    levels: [VecDeque<(u64, Queued)>; Priority::LEVELS],
    /// Bit `i` set ⇔ `levels[i]` is non-empty.
    occupied: u8,
    /// Keyed messages, one FIFO per key in publish order. Never holds an empty FIFO.
    keys: HashMap<KeyOf, VecDeque<(u64, Queued)>, BuildHasherDefault<Fnv>>,
    /// Each waiting key by the rank of its head (the head message names the key).
    heads: BTreeMap<Rank, Arc<Message>>,
    seq: u64,
    /// Messages waiting in `levels` and `keys` (not `held`).
    len: usize,
    /// Messages taken out for a dispatcher's batch (see [`PriorityQueue::hold_plain`]),
    /// oldest first, with their sequence numbers so they can go back in place.
    held: VecDeque<(u64, Queued)>,
}

fn rank(seq: u64, q: &Queued) -> Rank {
    (Reverse(q.message.priority() as u8), seq)
}

impl PriorityQueue {
    pub(crate) fn len(&self) -> usize {
        self.inner.as_ref().map_or(0, |q| q.len)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn push(&mut self, item: Queued) {
        self.inner.get_or_insert_default().push(item);
    }

    /// Highest priority first, publish order within a level, per-key order always.
    pub(crate) fn pop(&mut self) -> Option<Queued> {
        self.inner.as_mut()?.pop()
    }

    /// The oldest message of the lowest priority: the one `DropOldest` evicts. For keyed
    /// messages, the head of a key (evicting it keeps the key's order).
    pub(crate) fn pop_oldest_lowest(&mut self) -> Option<Queued> {
        self.inner.as_mut()?.pop_oldest_lowest()
    }

    /// Messages waiting at each priority level, lowest first, keyed ones included
    /// (R-OPS-1 snapshot).
    pub(crate) fn depth_by_level(&self, out: &mut [u64; Priority::LEVELS]) {
        if let Some(q) = &self.inner {
            q.depth_by_level(out);
        }
    }

    /// Enqueue time of the longest-waiting message, whatever its level or key.
    pub(crate) fn oldest_enqueued(&self) -> Option<EnqueueStamp> {
        self.inner.as_ref()?.oldest_enqueued()
    }

    /// Some message waiting here has a lower priority than `p` (keyed ones by their key's
    /// head, which is what competes with other messages).
    pub(crate) fn has_below(&self, p: Priority) -> bool {
        self.inner.as_ref().is_some_and(|q| q.has_below(p))
    }

    /// Take the head out for a dispatcher's batch and hold it (`held`), if nothing could
    /// overtake it or any message after it: no keyed message waits, every waiting message
    /// has the default priority, and the head has no expiry of its own. Returns the message
    /// for the dispatcher; the queue keeps it until [`Self::unhold_last`] or
    /// [`Self::release_held`].
    pub(crate) fn hold_plain(&mut self) -> Option<Arc<Message>> {
        let q = self.inner.as_mut()?;
        let normal = Priority::Normal.index();
        if !q.heads.is_empty() || q.occupied != 1 << normal {
            return None;
        }
        let level = &mut q.levels[normal];
        if level.front()?.1.message.expires_at.is_some() {
            return None;
        }
        let entry = level.pop_front()?;
        if level.is_empty() {
            q.occupied = 0;
        }
        q.len -= 1;
        let message = entry.1.message.clone();
        q.held.push_back(entry);
        Some(message)
    }

    /// Hold a message already started (a batch's first) ahead of the others, so it is
    /// settled like them; it never goes back to the queue (it is oldest: `unhold_last`
    /// takes newer ones first, and only those not started).
    pub(crate) fn hold_started(&mut self, message: Arc<Message>) {
        let item = Queued {
            message,
            enqueued: crate::clock::EnqueueStamp::EPOCH,
        };
        self.inner
            .get_or_insert_default()
            .held
            .push_front((0, item));
    }

    /// Messages held for a batch.
    pub(crate) fn held(&self) -> usize {
        self.inner.as_ref().map_or(0, |q| q.held.len())
    }

    /// Put the newest held message back at the head of its level, in its place (its own
    /// sequence number): false when none is held.
    pub(crate) fn unhold_last(&mut self) -> bool {
        let Some(q) = self.inner.as_mut() else {
            return false;
        };
        let Some(entry) = q.held.pop_back() else {
            return false;
        };
        let level = entry.1.message.priority().index();
        q.levels[level].push_front(entry);
        q.occupied |= 1 << level;
        q.len += 1;
        true
    }

    /// The oldest held message, no longer held.
    pub(crate) fn release_held(&mut self) -> Option<Queued> {
        self.inner.as_mut()?.held.pop_front().map(|(_, q)| q)
    }

    /// Remove everything waiting (not what is held), in delivery order.
    pub(crate) fn drain(&mut self) -> Vec<Queued> {
        self.inner.as_mut().map(|q| q.drain()).unwrap_or_default()
    }
}

impl Inner {
    fn push(&mut self, item: Queued) {
        let seq = self.seq;
        self.seq += 1;
        self.len += 1;
        let Some(key) = item.message.key() else {
            let level = item.message.priority().index();
            self.levels[level].push_back((seq, item));
            self.occupied |= 1 << level;
            return;
        };
        if let Some(fifo) = self.keys.get_mut(key) {
            fifo.push_back((seq, item));
            return;
        }
        self.heads.insert(rank(seq, &item), item.message.clone());
        let map_key = KeyOf(item.message.clone());
        self.keys.insert(map_key, VecDeque::from([(seq, item)]));
    }

    fn pop(&mut self) -> Option<Queued> {
        let unkeyed = (self.occupied != 0).then(|| {
            let level = 7 - self.occupied.leading_zeros() as usize;
            (self.level_rank(level), level)
        });
        let keyed = self.heads.first_key_value().map(|(r, _)| *r);
        match (unkeyed, keyed) {
            (None, None) => None,
            (Some((u, level)), Some(k)) if u < k => self.take_level(level),
            (Some((_, level)), None) => self.take_level(level),
            (_, Some(_)) => {
                let (_, key) = self.heads.pop_first()?;
                self.take_from(key)
            }
        }
    }

    fn pop_oldest_lowest(&mut self) -> Option<Queued> {
        let unkeyed = (self.occupied != 0).then(|| {
            let level = self.occupied.trailing_zeros() as usize;
            (self.level_rank(level), level)
        });
        let keyed = self
            .heads
            .last_key_value()
            .and_then(|(&(prio, _), _)| self.heads.range((prio, 0)..).next().map(|(r, _)| *r));
        // Lowest priority first; among equal priorities the oldest.
        let lower = |a: Rank, b: Rank| (Reverse(a.0), a.1) < (Reverse(b.0), b.1);
        match (unkeyed, keyed) {
            (None, None) => None,
            (Some((u, level)), Some(k)) if lower(u, k) => self.take_level(level),
            (Some((_, level)), None) => self.take_level(level),
            (_, Some(k)) => self.take_key(k),
        }
    }

    fn depth_by_level(&self, out: &mut [u64; Priority::LEVELS]) {
        for (slot, level) in out.iter_mut().zip(&self.levels) {
            *slot += level.len() as u64;
        }
        for fifo in self.keys.values() {
            for (_, q) in fifo {
                out[q.message.priority().index()] += 1;
            }
        }
    }

    fn has_below(&self, p: Priority) -> bool {
        let lower_levels = (1u8 << p.index()) - 1;
        self.occupied & lower_levels != 0
            || self
                .heads
                .last_key_value()
                .is_some_and(|(&(Reverse(prio), _), _)| prio < p as u8)
    }

    fn oldest_enqueued(&self) -> Option<EnqueueStamp> {
        let unkeyed = self
            .levels
            .iter()
            .filter_map(|l| l.front().map(|(_, q)| q.enqueued));
        let keyed = self
            .keys
            .values()
            .filter_map(|f| f.front().map(|(_, q)| q.enqueued));
        unkeyed.chain(keyed).min()
    }

    fn drain(&mut self) -> Vec<Queued> {
        let mut out = Vec::with_capacity(self.len);
        while let Some(q) = self.pop() {
            out.push(q);
        }
        out
    }

    fn level_rank(&self, level: usize) -> Rank {
        let seq = self.levels[level].front().map_or(u64::MAX, |(s, _)| *s);
        (Reverse(level as u8), seq)
    }

    fn take_level(&mut self, level: usize) -> Option<Queued> {
        let (_, item) = self.levels[level].pop_front()?;
        if self.levels[level].is_empty() {
            self.occupied &= !(1 << level);
        }
        self.len -= 1;
        Some(item)
    }

    fn take_key(&mut self, head: Rank) -> Option<Queued> {
        let key = self.heads.remove(&head)?;
        self.take_from(key)
    }

    /// Pop the head of `head`'s key, whose entry in `heads` was just removed.
    fn take_from(&mut self, head: Arc<Message>) -> Option<Queued> {
        let key = head.key().unwrap_or_default();
        let fifo = self.keys.get_mut(key)?;
        let (_, item) = fifo.pop_front()?;
        match fifo.front() {
            Some((seq, next)) => {
                let r = rank(*seq, next);
                let next = next.message.clone();
                self.heads.insert(r, next);
            }
            None => {
                self.keys.remove(key);
            }
        }
        self.len -= 1;
        Some(item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::MessageBuilder;

    fn q(topic_payload: &'static str, key: Option<&str>, p: Priority) -> Queued {
        let mut b = MessageBuilder::new("t").payload(topic_payload).priority(p);
        if let Some(k) = key {
            b = b.key(k);
        }
        Queued {
            message: Arc::new(b.build_detached().unwrap()),
            enqueued: EnqueueStamp::of(std::time::SystemTime::now()),
        }
    }

    fn drain_text(pq: &mut PriorityQueue) -> Vec<String> {
        pq.drain()
            .into_iter()
            .map(|q| String::from_utf8_lossy(q.message.payload()).into_owned())
            .collect()
    }

    // R-ORD-5, R-ORD-1
    #[test]
    fn key_order_wins_priority_orders_keys() {
        let mut pq = PriorityQueue::default();
        pq.push(q("a1", Some("a"), Priority::Low));
        pq.push(q("u1", None, Priority::Low));
        pq.push(q("a2", Some("a"), Priority::Urgent));
        pq.push(q("b1", Some("b"), Priority::High));
        pq.push(q("u2", None, Priority::Urgent));
        pq.push(q("b2", Some("b"), Priority::Low));
        assert_eq!(pq.len(), 6);
        // u2 urgent; b1 high; then the lows by publish order: a1 (seq 0), whose successor
        // a2 is urgent and goes next, then u1 and b2.
        assert_eq!(
            drain_text(&mut pq),
            vec!["u2", "b1", "a1", "a2", "u1", "b2"]
        );
        assert!(pq.is_empty());
    }

    #[derive(Debug, Clone)]
    enum Op {
        Push(Option<u8>, u8),
        Pop,
        Evict,
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            3 => (proptest::option::of(0u8..4), 0u8..4).prop_map(|(k, p)| Op::Push(k, p)),
            2 => Just(Op::Pop),
            1 => Just(Op::Evict),
        ]
    }

    const LEVELS: [Priority; 4] = [
        Priority::Low,
        Priority::Normal,
        Priority::High,
        Priority::Urgent,
    ];

    proptest::proptest! {
        // R-ORD-5, R-ORD-1, R-BP-1: the queue against a reference model: a message is
        // eligible when no older message of its key waits; pop takes the eligible one of
        // highest priority, then oldest; eviction the eligible one of lowest priority,
        // then oldest.
        #[test]
        fn matches_the_reference_model(ops in proptest::collection::vec(op(), 0..200)) {
            let mut pq = PriorityQueue::default();
            // (seq, key, priority)
            let mut model: Vec<(usize, Option<u8>, u8)> = Vec::new();
            for (seq, op) in ops.into_iter().enumerate() {
                let eligible = |m: &Vec<(usize, Option<u8>, u8)>| -> Vec<(usize, u8)> {
                    m.iter()
                        .filter(|(s, k, _)| {
                            k.is_none() || !m.iter().any(|(s2, k2, _)| k2 == k && s2 < s)
                        })
                        .map(|(s, _, p)| (*s, *p))
                        .collect()
                };
                let (got, want) = match op {
                    Op::Push(key, p) => {
                        let payload = seq.to_string();
                        let mut b = MessageBuilder::new("t")
                            .payload(payload)
                            .priority(LEVELS[p as usize]);
                        if let Some(k) = key {
                            b = b.key([k]);
                        }
                        pq.push(Queued {
                            message: Arc::new(b.build_detached().unwrap()),
                            enqueued: EnqueueStamp::of(std::time::SystemTime::now()),
                        });
                        model.push((seq, key, p));
                        (None, None)
                    }
                    Op::Pop => {
                        let want = eligible(&model)
                            .into_iter()
                            .min_by_key(|(s, p)| (Reverse(*p), *s))
                            .map(|(s, _)| s);
                        (pq.pop(), want)
                    }
                    Op::Evict => {
                        let want = eligible(&model)
                            .into_iter()
                            .min_by_key(|(s, p)| (*p, *s))
                            .map(|(s, _)| s);
                        (pq.pop_oldest_lowest(), want)
                    }
                };
                let got = got.map(|q| {
                    String::from_utf8_lossy(q.message.payload()).parse::<usize>().unwrap()
                });
                proptest::prop_assert_eq!(got, want);
                if let Some(s) = want {
                    model.retain(|(s2, _, _)| *s2 != s);
                }
                proptest::prop_assert_eq!(pq.len(), model.len());
            }
        }
    }

    // R-BP-1, R-ORD-5
    #[test]
    fn eviction_takes_oldest_lowest_and_keeps_key_order() {
        let mut pq = PriorityQueue::default();
        pq.push(q("a1", Some("a"), Priority::Normal));
        pq.push(q("u1", None, Priority::Normal));
        pq.push(q("a2", Some("a"), Priority::Low));
        pq.push(q("u2", None, Priority::Low));
        let text =
            |q: Option<Queued>| String::from_utf8_lossy(q.unwrap().message.payload()).into_owned();
        // Lowest level present is Low: u2 (key a's head is a1, normal).
        assert_eq!(text(pq.pop_oldest_lowest()), "u2");
        // Normal: a1 (seq 0) before u1 (seq 1).
        assert_eq!(text(pq.pop_oldest_lowest()), "a1");
        assert_eq!(drain_text(&mut pq), vec!["u1", "a2"]);
    }
}
