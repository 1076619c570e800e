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
//! An entry is computed and inserted only while the broker's registry lock is held for
//! reading ([`RouteCache::get_or_compute`]), and every change of the router empties the
//! cache ([`RouteCache::invalidate`]) while holding that lock for writing, before releasing
//! it. So an entry in the cache was always computed from the router as it is now: a change
//! cannot fall between an entry's computation and its insertion, and empties everything
//! computed before it. That is why a lookup ([`RouteCache::get`]) needs only the cache's own
//! lock, not the registry's: a publish that starts after a subscribe or unsubscribe returned
//! finds the cache emptied by it (its shard's lock orders the two) and computes the route
//! again. The emptied entries are returned to the caller, who drops them after releasing
//! the registry lock, so that a removed subscription is not kept alive by stale entries.
//!
//! # Shards
//! The cache is split into [`SHARDS`] shards, and each thread that publishes reads and fills
//! one of them (assigned round-robin at its first publish). Every shard holds its own copy of
//! an entry, in allocations of its own: a lookup takes the shard's read lock and clones the
//! entry's topic and targets, three atomic writes, which with one shared cache would go to
//! the same three cache lines from every publisher thread. A change empties every shard.
//!
//! # Size
//! At most [`MAX_ROUTES`] topics are cached per shard; inserting into a full shard first
//! evicts an arbitrary quarter of it (hash order), so a changing set of hot topics keeps
//! being cached. A topic published from several threads is held once per shard they use (at
//! most [`SHARDS`] times), and a route to n subscriptions takes 8·n bytes per copy: a topic
//! that reaches 1,000,000 subscriptions from 8 publisher threads holds 64 MB of routes (8 MB
//! per shard).

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;
use parking_lot::RwLock;

use crate::subscription::shell::SubscriptionShell;
use crate::topic::Topic;
use foldhash::fast::RandomState as FastState;

/// Most topics cached at once in one shard.
pub(crate) const MAX_ROUTES: usize = 1024;

/// Shards of the cache: publisher threads beyond this many share them.
pub(crate) const SHARDS: usize = 8;

/// The subscriptions one topic matched, in ascending id order.
pub(crate) type Targets = Arc<[Arc<SubscriptionShell>]>;

/// A cached route.
struct Entry {
    /// The topic, validated when it was first published.
    topic: Topic,
    targets: Targets,
}

/// A hot topic's validated name and its subscriptions (see [`RouteCache::get`]).
pub(crate) struct Route {
    pub(crate) topic: Topic,
    pub(crate) targets: Targets,
}

/// Keyed by the topic's bytes: a publisher's spelling is looked up before anything checks
/// that it is UTF-8 (src/topic_name.rs), and a hit proves it is.
type Routes = HashMap<Box<[u8]>, Entry, FastState>;

/// What [`RouteCache::invalidate`] took out, to be dropped outside the registry lock.
pub(crate) struct Evicted {
    _routes: Vec<Routes>,
}

/// Topic → matched subscriptions, emptied by every change of the router. See the module
/// docs.
#[derive(Default)]
pub(crate) struct RouteCache {
    shards: [CachePadded<RwLock<Routes>>; SHARDS],
}

/// The shard this thread reads and fills.
fn thread_shard() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    std::thread_local! {
        static SHARD: Cell<Option<usize>> = const { Cell::new(None) };
    }
    SHARD
        .try_with(|shard| {
            shard.get().unwrap_or_else(|| {
                let i = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
                shard.set(Some(i));
                i
            })
        })
        // A publish from a thread-local destructor: any shard will do.
        .unwrap_or(0)
}

impl RouteCache {
    /// The router changed: empty the cache. Call with the registry's exclusive lock held,
    /// and drop the result after releasing it.
    #[must_use = "drop the evicted routes after releasing the registry lock"]
    pub(crate) fn invalidate(&self) -> Evicted {
        Evicted {
            _routes: self
                .shards
                .iter()
                .map(|shard| std::mem::take(&mut *shard.write()))
                .collect(),
        }
    }

    /// This thread's shard.
    fn shard(&self) -> &RwLock<Routes> {
        &self.shards[thread_shard()]
    }

    /// The cached route of the topic spelled `name`. Needs no other lock (see the module
    /// docs). A hit means `name` is a valid topic (it was checked when the entry was made)
    /// and these are the subscriptions it matches now.
    pub(crate) fn get(&self, name: &[u8]) -> Option<Route> {
        let map = self.shard().read();
        let e = map.get(name)?;
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
        let shard = self.shard();
        if let Some(e) = shard.read().get(topic.as_str().as_bytes()) {
            return e.targets.clone();
        }
        let targets: Targets = compute().into();
        let mut map = shard.write();
        if map.len() >= MAX_ROUTES && !map.contains_key(topic.as_str().as_bytes()) {
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
            topic.as_str().as_bytes().into(),
            Entry {
                topic: topic.clone(),
                targets: targets.clone(),
            },
        );
        targets
    }

    /// Number of topics cached in this thread's shard.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shard().read().len()
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
        let cache = RouteCache::default();
        let mut computed = 0;
        assert!(cache.get(b"a.b").is_none(), "nothing cached yet");
        for _ in 0..3 {
            cache.get_or_compute(&topic("a.b"), || {
                computed += 1;
                Vec::new()
            });
        }
        assert_eq!(computed, 1, "a repeated topic is computed once");
        let hit = cache.get(b"a.b").expect("cached");
        assert_eq!(hit.topic.as_str(), "a.b");
        drop(cache.invalidate());
        assert_eq!(cache.len(), 0);
        assert!(cache.get(b"a.b").is_none(), "a change empties the cache");
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

    /// Threads fill shards of their own, and a change empties all of them: a route cached
    /// by any thread before the change is found by none after it.
    #[test]
    fn a_change_empties_every_threads_shard() {
        let cache = RouteCache::default();
        let threads = 2 * SHARDS;
        let filled = std::sync::Barrier::new(threads + 1);
        let changed = std::sync::Barrier::new(threads + 1);
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    cache.get_or_compute(&topic("a.b"), Vec::new);
                    assert!(cache.get(b"a.b").is_some(), "cached in this thread's shard");
                    filled.wait();
                    changed.wait();
                    assert!(cache.get(b"a.b").is_none(), "emptied by the change");
                });
            }
            filled.wait();
            let evicted = cache.invalidate();
            assert!(evicted._routes.iter().any(|r| !r.is_empty()));
            changed.wait();
        });
    }
}
