//! The broker's subscriptions by id: one pointer per entry.
//!
//! A `BTreeMap<SubscriptionId, Arc<SubscriptionShell>>` stores every id twice — as the key,
//! and in the subscription it points to. Keyed by the subscription itself (ordered by its
//! id), an entry is one pointer and a B-tree node holds half the bytes (what the
//! registry adds to each idle subscription). Lookups by id still work: an entry
//! borrows as its id.

use std::borrow::Borrow;
use std::collections::BTreeSet;
use std::sync::Arc;

use crate::subscription::SubscriptionId;
use crate::subscription::shell::SubscriptionShell;

/// One subscription, ordered and compared by its id only.
struct Entry(Arc<SubscriptionShell>);

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.0.id == other.0.id
    }
}

impl Eq for Entry {}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Entry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.id.cmp(&other.0.id)
    }
}

/// Agrees with the order above: an entry compares as its id does.
impl Borrow<SubscriptionId> for Entry {
    fn borrow(&self) -> &SubscriptionId {
        &self.0.id
    }
}

/// Subscriptions in ascending id order, each once (see the module docs).
#[derive(Default)]
pub(crate) struct ById(BTreeSet<Entry>);

impl ById {
    /// Add `sub`; one with the same id is replaced.
    pub(crate) fn insert(&mut self, sub: Arc<SubscriptionShell>) {
        self.0.replace(Entry(sub));
    }

    /// Remove and return the subscription with this id.
    pub(crate) fn remove(&mut self, id: &SubscriptionId) -> Option<Arc<SubscriptionShell>> {
        self.0.take(id).map(|e| e.0)
    }

    pub(crate) fn contains_key(&self, id: &SubscriptionId) -> bool {
        self.0.contains(id)
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    pub(crate) fn clear(&mut self) {
        self.0.clear();
    }

    /// Ids, ascending.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &SubscriptionId> {
        self.0.iter().map(|e| &e.0.id)
    }

    /// Subscriptions, in ascending id order.
    pub(crate) fn values(&self) -> impl Iterator<Item = &Arc<SubscriptionShell>> {
        self.0.iter().map(|e| &e.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::SubscribeOptions;

    fn sub(id: u64) -> Arc<SubscriptionShell> {
        crate::subscription::shell::detached_with_id(
            SubscriptionId(id),
            &SubscribeOptions::default(),
            |_| Ok(()),
        )
    }

    #[test]
    fn keeps_id_order_and_finds_by_id() {
        let mut m = ById::default();
        for id in [5, 1, 3] {
            m.insert(sub(id));
        }
        assert_eq!(m.len(), 3);
        assert_eq!(m.keys().map(|i| i.0).collect::<Vec<_>>(), [1, 3, 5]);
        assert_eq!(m.values().map(|s| s.id.0).collect::<Vec<_>>(), [1, 3, 5]);
        assert!(m.contains_key(&SubscriptionId(3)));
        let replacement = sub(3);
        m.insert(replacement.clone());
        assert_eq!(m.len(), 3, "same id: replaced, not added");
        let taken = m.remove(&SubscriptionId(3)).expect("present");
        assert!(Arc::ptr_eq(&taken, &replacement));
        assert!(m.remove(&SubscriptionId(3)).is_none());
        assert!(!m.contains_key(&SubscriptionId(3)));
        m.clear();
        assert_eq!(m.len(), 0);
    }
}
