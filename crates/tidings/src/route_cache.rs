//! The publish side's route cache: topic → the subscriptions it matched (R-RT-1, R-CORE-2).
//!
//! As in NATS' sublist cache, a topic published again costs one hash lookup and one `Arc`
//! clone instead of a trie walk and one reference-count increment per matching subscription.
//!
//! The entry also keeps the validated [`Topic`] it was computed for, so a publish to a hot
//! topic looks its route up *before* building the message ([`RouteCache::get`]) and shares
//! that topic instead of checking and allocating the string again: the one lookup serves
//! both (1 subscriber, manual driver: see `BrokerInner::publish_builder`).
//!
//! # Validity
//! Every entry is stamped with the router's *generation*, which the broker bumps on every
//! change of the router (subscribe, unsubscribe, close). An entry is used only while its
//! stamp equals the current generation; entries are read and written only while the
//! broker's registry lock is held (shared by publishers, exclusive for changes), so a
//! matching stamp means the entry was computed from the router as it is now. A change also
//! empties the cache ([`RouteCache::invalidate`]) so that a removed subscription is not kept
//! alive by stale entries; the caller drops what it returns after releasing the registry
//! lock.
//!
//! # Size
//! At most [`MAX_ROUTES`] topics are cached; inserting into a full cache first evicts an
//! arbitrary quarter of it (hash order), so a changing set of hot topics keeps being cached.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::RwLock;

use crate::subscription::shell::SubscriptionShell;
use crate::topic::Topic;
use crate::topic::trie::FastState;

/// Most topics cached at once.
pub(crate) const MAX_ROUTES: usize = 1024;

/// The subscriptions one topic matched, in ascending id order.
pub(crate) type Targets = Arc<[Arc<SubscriptionShell>]>;

/// A cached route and the router generation it was computed at.
struct Entry {
    generation: u64,
    /// The topic, validated when it was first published.
    topic: Topic,
    targets: Targets,
}

/// A hot topic's validated name and its subscriptions (see [`RouteCache::get`]).
pub(crate) struct Route {
    pub(crate) topic: Topic,
    pub(crate) targets: Targets,
}

/// What [`RouteCache::invalidate`] took out, to be dropped outside the registry lock.
pub(crate) struct Evicted {
    _routes: HashMap<Box<str>, Entry, FastState>,
}

/// Topic → matched subscriptions, valid for one router generation. See the module docs.
#[derive(Default)]
pub(crate) struct RouteCache {
    generation: u64,
    map: RwLock<HashMap<Box<str>, Entry, FastState>>,
}

impl RouteCache {
    /// The router changed: bump the generation and empty the cache. Needs `&mut` (the
    /// registry's exclusive lock); drop the result after releasing that lock.
    #[must_use = "drop the evicted routes after releasing the registry lock"]
    pub(crate) fn invalidate(&mut self) -> Evicted {
        self.generation = self.generation.wrapping_add(1);
        Evicted {
            _routes: std::mem::take(self.map.get_mut()),
        }
    }

    /// The current generation.
    #[cfg(test)]
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// The cached route of the topic spelled `name`, if it is current. Call with the
    /// registry's shared lock held. A hit means `name` is a valid topic (it was checked
    /// when the entry was made) and these are the subscriptions it matches now.
    pub(crate) fn get(&self, name: &str) -> Option<Route> {
        let map = self.map.read();
        let e = map.get(name).filter(|e| e.generation == self.generation)?;
        Some(Route {
            topic: e.topic.clone(),
            targets: e.targets.clone(),
        })
    }

    /// The cached targets of `topic`, or `compute()`'s, which are cached. Call with the
    /// registry's shared lock held, and `compute` reading the router under that same lock.
    pub(crate) fn get_or_compute(
        &self,
        topic: &Topic,
        compute: impl FnOnce() -> Vec<Arc<SubscriptionShell>>,
    ) -> Targets {
        if let Some(e) = self.map.read().get(topic.as_str())
            && e.generation == self.generation
        {
            return e.targets.clone();
        }
        let targets: Targets = compute().into();
        let mut map = self.map.write();
        if map.len() >= MAX_ROUTES && !map.contains_key(topic.as_str()) {
            let mut drop_n = MAX_ROUTES / 4;
            map.retain(|_, _| {
                if drop_n == 0 {
                    return true;
                }
                drop_n -= 1;
                false
            });
        }
        map.insert(
            topic.as_str().into(),
            Entry {
                generation: self.generation,
                topic: topic.clone(),
                targets: targets.clone(),
            },
        );
        targets
    }

    /// Number of cached topics.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.read().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topic(s: &str) -> Topic {
        Topic::new(s).expect("valid")
    }

    #[test]
    fn hit_miss_invalidate_and_bound() {
        let mut cache = RouteCache::default();
        let mut computed = 0;
        assert!(cache.get("a.b").is_none(), "nothing cached yet");
        for _ in 0..3 {
            cache.get_or_compute(&topic("a.b"), || {
                computed += 1;
                Vec::new()
            });
        }
        assert_eq!(computed, 1, "a repeated topic is computed once");
        let hit = cache.get("a.b").expect("cached");
        assert_eq!(hit.topic.as_str(), "a.b");
        let g = cache.generation();
        drop(cache.invalidate());
        assert_eq!(cache.generation(), g + 1);
        assert_eq!(cache.len(), 0);
        assert!(cache.get("a.b").is_none(), "a change empties the cache");
        cache.get_or_compute(&topic("a.b"), || {
            computed += 1;
            Vec::new()
        });
        assert_eq!(computed, 2, "a change forces a recompute");
        for i in 0..(3 * MAX_ROUTES) {
            cache.get_or_compute(&topic(&format!("t.{i}")), Vec::new);
            assert!(cache.len() <= MAX_ROUTES);
        }
    }
}
