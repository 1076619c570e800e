//! The broker snapshot (R-OPS-1) after a scripted run under the manual driver.

mod support;

use tidings::ops::{BrokerSnapshot, SubscriptionKind};

fn by_name<'a>(s: &'a BrokerSnapshot, name: &str) -> &'a tidings::ops::SubscriptionSnapshot {
    s.subscription_named(name)
        .unwrap_or_else(|| panic!("{name} in snapshot"))
}

#[test]
fn snapshot_shows_subscriptions_durables_and_streams_through_a_scripted_run() {
    let dir = tempfile::tempdir().unwrap();
    let sc = support::scenario::start(dir.path());
    sc.step_queue();

    let s = sc.broker.snapshot();
    assert_eq!(s.driver, "manual"); // R-OPS-1
    assert!(!s.closed);
    let billing = by_name(&s, "billing");
    assert_eq!(billing.id, sc.billing.id().get()); // R-OPS-1
    assert_eq!(billing.pattern, "orders.*");
    assert_eq!(billing.kind, SubscriptionKind::Buffered);
    assert_eq!(billing.options.capacity, 2); // R-OPS-1 options summary
    assert_eq!(billing.options.overflow, "reject");
    assert_eq!(billing.options.retry, "fixed(2 × 1s)");
    assert_eq!(billing.options.concurrency, "serial");
    // Two queued: one High, one Normal (levels low, normal, high, urgent); "late" overflowed.
    assert_eq!(billing.depth_by_priority, [0, 1, 1, 0]); // R-OPS-1 depth by priority
    assert_eq!(billing.counters.queued, 2);
    assert_eq!(billing.counters.offered, 3);
    assert_eq!(billing.counters.refused["overflow"], 1);
    assert_eq!(billing.dead_letters.len, 1); // R-OPS-1 DLQ by reason
    assert_eq!(billing.dead_letters.by_reason["overflow"], 1);
    assert_eq!(billing.durable, None);
    // The durable subscription has not been pumped yet: everything is lag.
    let ship = by_name(&s, "durable:orders/ship");
    assert_eq!(ship.kind, SubscriptionKind::Durable);
    let d = ship.durable.as_ref().expect("durable part");
    assert_eq!((d.stream.as_str(), d.name.as_str()), ("orders", "ship"));
    assert_eq!((d.position, d.committed, d.lag), (0, 0, 3)); // R-OPS-1 position, committed, lag
    // The stream.
    assert_eq!(s.streams.len(), 1);
    let orders = &s.streams[0];
    assert_eq!(orders.name, "orders");
    assert_eq!(orders.patterns, ["orders.#"]);
    assert_eq!(
        (orders.start_offset, orders.end_offset, orders.records),
        (0, 3, 3)
    ); // R-OPS-1
    assert!(orders.segments >= 1 && orders.bytes > 0, "{orders:?}");
    assert_eq!(orders.fsync, "always");

    sc.step_run();
    let s = sc.broker.snapshot();
    let billing = by_name(&s, "billing");
    // "reject" rejected, "ok" delivered, "flaky" failed once and waits to retry.
    assert_eq!(billing.counters.delivered, 1);
    assert_eq!(billing.counters.dead_lettered["rejected"], 1);
    assert_eq!(billing.counters.in_flight, 1); // R-OPS-1 in-flight
    assert_eq!(billing.counters.redelivered, 1);
    assert_eq!(billing.depth_by_priority, [0, 0, 0, 0]);
    assert_eq!(billing.oldest_age_ms, None);
    assert_eq!(billing.dead_letters.by_reason["rejected"], 1);
    let d = by_name(&s, "durable:orders/ship").durable.clone().unwrap();
    assert_eq!((d.position, d.committed, d.lag), (4, 4, 0)); // R-OPS-1 (orders.paid is filtered out)
    assert_eq!(s.streams[0].end_offset, 4);

    sc.step_retry();
    let s = sc.broker.snapshot();
    let billing = by_name(&s, "billing");
    assert_eq!(billing.counters.dead_lettered["retries_exhausted"], 1);
    assert_eq!(billing.counters.in_flight, 0);
    assert_eq!(billing.counters.attempts, 4);
    assert_eq!(billing.counters.failures, 3);
    assert_eq!(billing.dead_letters.len, 3);
    // The snapshot is the handles' own figures (R-OPS-1, R-DEL-6).
    for (handle, snap) in [(&sc.billing, billing), (&sc.audit, by_name(&s, "audit"))] {
        let st = handle.stats();
        assert!(st.is_conserved()); // R-DEL-6
        let c = &snap.counters;
        assert_eq!(
            (
                c.offered,
                c.accepted,
                c.delivered,
                c.queued,
                c.in_flight,
                c.attempts,
                c.failures
            ),
            (
                st.offered,
                st.accepted,
                st.delivered,
                st.queued,
                st.in_flight,
                st.attempts,
                st.failures
            )
        );
        assert_eq!(c.dead_lettered_total(), st.dead_lettered.total());
        assert_eq!(c.refused_total(), st.refused.total());
        assert_eq!(snap.dead_letters.len, st.dlq_len);
    }
    assert_eq!(by_name(&s, "audit").counters.delivered, 4);
    assert_eq!(sc.ship.committed(), 4);

    // It serializes and reads back unchanged (what the admin API returns).
    let json = serde_json::to_string(&s).unwrap();
    let back: BrokerSnapshot = serde_json::from_str(&json).unwrap();
    assert_eq!(back, s);
}

#[test]
fn dead_letter_actions_page_redrive_and_purge_by_subscription_id() {
    let dir = tempfile::tempdir().unwrap();
    let sc = support::scenario::start(dir.path());
    sc.step_queue();
    sc.step_run();
    sc.step_retry();
    let id = sc.billing.id().get();
    let page = sc.broker.dead_letter_page(id, 0, 2).unwrap();
    assert_eq!((page.total, page.entries.len()), (3, 2)); // R-OPS-4 paged
    assert_eq!(page.entries[0].reason, "overflow");
    assert_eq!(page.entries[0].payload_preview, "late");
    assert_eq!(page.entries[1].reason, "rejected");
    assert_eq!(page.entries[1].last_error.as_deref(), Some("cannot bill"));
    let rest = sc.broker.dead_letter_page(id, 2, 10).unwrap();
    assert_eq!(rest.entries.len(), 1);
    assert_eq!(rest.entries[0].attempts, 2);
    assert!(matches!(
        sc.broker
            .dead_letter_page(id, 0, tidings::ops::MAX_PAGE_SIZE + 1),
        Err(tidings::ops::PageError::PageTooLarge { .. })
    ));
    assert!(matches!(
        sc.broker.dead_letter_page(999, 0, 1),
        Err(tidings::ops::PageError::UnknownSubscription(999))
    ));

    // Redrive one entry by id: it leaves the DLQ only as it is re-offered (R-OPS-4).
    let late = page.entries[0].id.clone();
    let late_id = tidings::MessageId::from_u128(u128::from_str_radix(&late, 16).unwrap());
    let sel = tidings::ops::RedriveSelection::Ids(vec![late_id]);
    let out = sc.broker.redrive_dead_letters(id, &sel).unwrap();
    assert_eq!((out.accepted, out.refused, out.missing.len()), (1, 0, 0));
    let again = sc.broker.redrive_dead_letters(id, &sel).unwrap();
    assert_eq!((again.accepted, again.missing), (0, vec![late.clone()])); // gone: nothing redriven twice
    sc.broker.run_until_idle();
    assert_eq!(sc.billing.stats().delivered, 2);
    assert!(sc.billing.stats().is_conserved()); // R-DEL-6
    assert_eq!(sc.broker.purge_dead_letters(id).unwrap(), 2);
    assert_eq!(sc.broker.dead_letter_page(id, 0, 10).unwrap().total, 0);

    // Seek: buffered subscriptions have no position; durable ones move and commit.
    assert!(matches!(
        sc.broker.seek_subscription(id, tidings::StartAt::Earliest),
        Err(tidings::ops::SeekError::NotDurable(_))
    ));
    let ship = sc.ship.id().get();
    assert_eq!(
        sc.broker
            .seek_subscription(ship, tidings::StartAt::Earliest)
            .unwrap(),
        0
    );
    assert_eq!(sc.ship.committed(), 0);
    assert!(matches!(
        sc.broker
            .seek_subscription(ship, tidings::StartAt::Offset(99)),
        Err(tidings::ops::SeekError::Stream(
            tidings::StreamError::BeyondEnd { .. }
        ))
    ));
    sc.broker.run_until_idle();
    assert_eq!(sc.ship.committed(), 4);
}
