//! The dispatcher handles a driver keeps for close, pruned of finished ones.

/// A list of dispatcher handles. Finished ones are dropped only when the list has doubled
/// since the last pruning, so starting a subscription stays amortized O(1) — pruning on
/// every start made 100,000 subscriptions quadratic — while subscribe/unsubscribe churn still
/// cannot grow the list without bound.
pub(crate) struct Handles<T> {
    items: Vec<T>,
    prune_at: usize,
}

impl<T> Default for Handles<T> {
    fn default() -> Self {
        Self {
            items: Vec::new(),
            prune_at: 64,
        }
    }
}

impl<T> Handles<T> {
    /// Add a handle; first prune the finished ones if the list has grown enough.
    pub(crate) fn push(&mut self, item: T, finished: impl Fn(&T) -> bool) {
        if self.items.len() >= self.prune_at {
            self.items.retain(|t| !finished(t));
            self.prune_at = (self.items.len() * 2).max(64);
        }
        self.items.push(item);
    }

    /// Every handle, leaving the list empty.
    pub(crate) fn take(&mut self) -> Vec<T> {
        self.prune_at = 64;
        std::mem::take(&mut self.items)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prunes_only_after_doubling_and_keeps_the_live_ones() {
        let mut h = Handles::default();
        for i in 0..64 {
            h.push(i, |_| true);
        }
        assert_eq!(h.items.len(), 64, "nothing pruned below the threshold");
        h.push(64, |x| x % 2 == 0); // prunes 32 finished (even) ones, then adds
        assert_eq!(h.items.len(), 33);
        assert!(h.items[..32].iter().all(|x| x % 2 == 1));
        assert_eq!(h.take().len(), 33);
        assert!(h.take().is_empty());
    }
}
