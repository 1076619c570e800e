//! What a subscription reads from its options and never changes, held once for many.
//!
//! A subscription's core consults its capacity, overflow policy, retry policy, delivery
//! mode, TTL and dead-letter settings on every offer and completion, and the snapshot shows
//! their [`OptionsSummary`] (R-OPS-1). None of it changes after subscribe, and applications
//! typically create many subscriptions with the same options, so [`Settings::shared`]
//! hands out one [`Arc`] for subscriptions created one after another (on one thread) with
//! equal options instead of a copy each: an idle subscription then pays a pointer for them
//! rather than ~400 bytes (the memory of an idle subscription is budgeted).

use std::cell::RefCell;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::{Concurrency, DeliveryMode, OptionsSummary, Overflow, SubscribeOptions};
use crate::rate_limit::RateLimit;
use crate::retry::Retry;

/// A subscription's fixed settings (see the module docs).
pub(crate) struct Settings {
    /// Queue capacity (≥ 1).
    pub(crate) capacity: usize,
    pub(crate) overflow: Overflow,
    pub(crate) retry: Retry,
    pub(crate) delivery: DeliveryMode,
    pub(crate) concurrency: Concurrency,
    pub(crate) ttl: Option<Duration>,
    /// Dead-letter entries kept.
    pub(crate) dlq_capacity: usize,
    /// The dead-letter topic, if any.
    pub(crate) dlq_topic: Option<Arc<str>>,
    /// Keep `Shutdown` dead letters.
    pub(crate) keep_shutdown: bool,
    /// At most so many handler starts in any window of one period (R-PAT-2).
    pub(crate) rate_limit: Option<RateLimit>,
    /// The options in words, for the snapshot.
    pub(crate) summary: OptionsSummary,
}

std::thread_local! {
    /// The settings this thread built last: reused while the next subscribe's options are
    /// equal. A `Weak`, so it keeps no subscription's settings alive (only their
    /// allocation's header, until the next different options replace it).
    static LAST: RefCell<Weak<Settings>> = const { RefCell::new(Weak::new()) };
}

impl Settings {
    /// The settings for `options`: those of the previous subscribe on this thread when
    /// they are equal and still in use, else new ones.
    pub(crate) fn shared(options: &SubscribeOptions) -> Arc<Settings> {
        LAST.with(|last| {
            let mut last = last.borrow_mut();
            if let Some(s) = last.upgrade()
                && s.fits(options)
            {
                return s;
            }
            let s = Arc::new(Settings::of(options));
            *last = Arc::downgrade(&s);
            s
        })
    }

    fn of(o: &SubscribeOptions) -> Self {
        Self {
            capacity: o.capacity,
            overflow: o.overflow,
            retry: o.retry.clone(),
            delivery: o.delivery,
            concurrency: o.concurrency,
            ttl: o.ttl,
            dlq_capacity: o.dead_letter.capacity,
            dlq_topic: o.dead_letter.topic.as_deref().map(Arc::from),
            keep_shutdown: o.dead_letter.keep_shutdown,
            rate_limit: o.rate_limit,
            summary: OptionsSummary::of(o),
        }
    }

    /// True when `o` would build settings equal to these (the name, the predicate and the
    /// header filter are per subscription; only whether a filter is set is part of them).
    fn fits(&self, o: &SubscribeOptions) -> bool {
        self.capacity == o.capacity
            && self.overflow == o.overflow
            && self.retry.same_as(&o.retry)
            && self.delivery == o.delivery
            && self.concurrency == o.concurrency
            && self.ttl == o.ttl
            && self.dlq_capacity == o.dead_letter.capacity
            && self.dlq_topic.as_deref() == o.dead_letter.topic.as_deref()
            && self.keep_shutdown == o.dead_letter.keep_shutdown
            && self.rate_limit == o.rate_limit
            && self.summary.filtered == (o.predicate.is_some() || o.header_filter.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::Predicate;

    #[test]
    fn equal_options_share_one_copy_and_different_ones_do_not() {
        let opts = SubscribeOptions::new().name("a");
        let a = Settings::shared(&opts);
        // The name is per subscription: not part of the shared settings.
        let b = Settings::shared(&opts.clone().name("b"));
        assert!(Arc::ptr_eq(&a, &b));
        let bigger = Settings::shared(&opts.clone().capacity(7));
        assert!(!Arc::ptr_eq(&a, &bigger));
        assert_eq!(bigger.capacity, 7);
        assert_eq!(bigger.summary.capacity, 7);
        let filtered =
            Settings::shared(&opts.clone().capacity(7).predicate(Predicate::new(|_| true)));
        assert!(!Arc::ptr_eq(&bigger, &filtered));
        assert!(filtered.summary.filtered);
        let retry = Settings::shared(
            &opts
                .capacity(7)
                .predicate(Predicate::new(|_| true))
                .retry(Retry::None),
        );
        assert!(!Arc::ptr_eq(&filtered, &retry));
        assert_eq!(retry.summary.retry, "none");
    }

    #[test]
    fn settings_no_longer_in_use_are_not_reused() {
        let opts = SubscribeOptions::new().capacity(3);
        let first = Settings::shared(&opts);
        let weak = Arc::downgrade(&first);
        drop(first);
        assert!(weak.upgrade().is_none());
        let again = Settings::shared(&opts);
        assert_eq!(again.capacity, 3);
        assert_eq!(again.summary.capacity, 3);
    }
}
