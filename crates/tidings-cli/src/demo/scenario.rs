//! The scenario, one function per step, each named after what it shows.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tidings::{
    Broker, CloseReport, DeadLetterReason, Deduplicating, Handler, HandlerError, Message, Overflow,
    Predicate, RedriveReport, Retry, SubscribeOptions, Subscription, SubscriptionStats,
};

use super::orders::{
    ChargeOrder, FirstTime, FlakyPlan, Gate, ack_lost, flaky_plan, order_message, order_no, region,
};
use super::report::{close_summary, dlq_table, join_counts, refusal_name, stats_table};
use super::{
    Admin, DRAIN, DemoResult, GATED_CAPACITY, PATIENCE, REMINDER_DELAY, SLOW_WORK, SNAPSHOT_TTL,
    lock, serve_admin, wait_until,
};
use crate::durable_demo;

/// One subscription of the demo and what it is for.
pub(super) struct Row {
    sub: Subscription,
    what: String,
}

/// The demo's seven subscriptions and what their handlers record for the checks.
pub(super) struct Pipeline {
    rows: Vec<Row>,
    /// Holds `gated`'s first message until opened.
    gate: Arc<Gate>,
    /// Runs of the business step per order (the inner handler of `dedup`).
    business_runs: Arc<Mutex<BTreeMap<u32, u32>>>,
    dedup_handler: Arc<Deduplicating<ChargeOrder>>,
    /// When `reminders` received the delayed message.
    reminder_at: Arc<Mutex<Option<Instant>>>,
}

impl Pipeline {
    pub(super) fn subs(&self) -> Vec<&Subscription> {
        self.rows.iter().map(|r| &r.sub).collect()
    }
}

/// Milliseconds since the start of the run, as the timeline's margin.
pub(super) struct Stamp(Instant);

impl Stamp {
    pub(super) fn now(&self) -> String {
        format!("  [{:>5} ms]", self.0.elapsed().as_millis())
    }
}

// ---------------------------------------------------------------------------------------
// The scenario, step by step.

pub(super) fn scenario(
    orders: u32,
    place: &durable_demo::Place,
    admin: Option<&Admin>,
) -> DemoResult<bool> {
    let stamp = Stamp(Instant::now());
    // Thread driver, system clock; its streams in the data dir (or on the server).
    let (broker, backend) = place.broker()?;
    outln!(
        "tidings demo: {orders} orders through an in-process broker (thread driver, system clock)"
    );
    let pipeline = subscribe_one_behaviour_each(&broker, orders)?;
    print_subscriptions(&pipeline.rows);

    outln!("\ntimeline");
    let reminder_published = schedule_delayed_reminders(&broker, &stamp)?;
    let request_ok = request_a_quote(&broker, &stamp);
    publish_orders_past_a_full_queue(&broker, &pipeline, orders, &stamp)?;
    expire_a_snapshot_behind_a_backlog(&broker, &pipeline, &stamp)?;
    let reminder_delay = drain_and_deliver_the_reminder(&pipeline, reminder_published, &stamp)?;
    let redrive = redrive_lost_acks_to_the_deduplicator(&pipeline, &stamp)?;
    // The durable part: its stream and durable subscriptions stay open on this broker.
    let mut durable = durable_demo::scenario(place, &broker, backend)?;
    if let Some(admin) = admin {
        serve_admin(&broker, admin)?;
    }
    durable.unsubscribe();
    let report = close_with_a_drain_deadline(&broker, &stamp);

    explain_deduplication(&pipeline, orders);
    let conserved = print_accounting(&pipeline, &redrive, &report);

    let mut checks = scenario_checks(
        &pipeline,
        orders,
        &Outcome {
            request_ok,
            reminder_delay,
            conserved,
            report: &report,
        },
    );
    checks.extend(std::mem::take(&mut durable.checks));
    durable.clean_up();
    Ok(print_checks(&checks, &stamp))
}

/// Seven subscriptions, each showing one behaviour (see the module docs' table).
pub(super) fn subscribe_one_behaviour_each(broker: &Broker, orders: u32) -> DemoResult<Pipeline> {
    let fast = broker.subscribe(
        "orders.*",
        named("fast"),
        |m: &Message| -> Result<(), HandlerError> {
            order_no(m)?;
            Ok(())
        },
    )?;

    let slow = broker.subscribe(
        "orders.#",
        named("slow").capacity(orders as usize + GATED_CAPACITY),
        |_: &Message| -> Result<(), HandlerError> {
            std::thread::sleep(SLOW_WORK);
            Ok(())
        },
    )?;

    let flaky_seen = FirstTime::default();
    let flaky = broker.subscribe(
        "orders.*",
        named("flaky").retry(Retry::exponential(Duration::from_millis(5), 2.0).max_attempts(3)),
        move |m: &Message| -> Result<(), HandlerError> {
            let n = order_no(m)?;
            match flaky_plan(n) {
                FlakyPlan::Ok => Ok(()),
                FlakyPlan::FailOnce if !flaky_seen.check(m.id()) => Ok(()),
                FlakyPlan::FailOnce => Err(HandlerError::retry(format!(
                    "payment gateway 503 for order {n}, try again"
                ))),
                FlakyPlan::AlwaysFail => Err(HandlerError::retry(format!(
                    "payment gateway timeout for order {n}"
                ))),
                FlakyPlan::Reject => Err(HandlerError::reject(format!(
                    "card permanently declined for order {n}"
                ))),
            }
        },
    )?;

    // The business step, wrapped in Deduplicating (records the id after it succeeds)...
    let business_runs = Arc::new(Mutex::new(BTreeMap::<u32, u32>::new()));
    let dedup_handler = Arc::new(Deduplicating::new(ChargeOrder(business_runs.clone())));
    // ...then an acknowledgement step that fails once for some orders, after the work.
    let inner = dedup_handler.clone();
    let ack_seen = FirstTime::default();
    let dedup = broker.subscribe(
        "orders.*",
        named("dedup")
            .retry(Retry::None)
            .predicate(Predicate::new(|m| m.header("region") == Some("eu"))),
        move |m: &Message| -> Result<(), HandlerError> {
            inner.handle(m)?;
            if ack_lost(order_no(m)?) && ack_seen.check(m.id()) {
                return Err(HandlerError::retry(
                    "ack lost after commit (connection reset)",
                ));
            }
            Ok(())
        },
    )?;

    let gate = Arc::new(Gate::default());
    let holder = gate.clone();
    let gated = broker.subscribe(
        "orders.*",
        named("gated")
            .capacity(GATED_CAPACITY)
            .overflow(Overflow::Reject),
        move |_: &Message| -> Result<(), HandlerError> {
            holder.hold();
            Ok(())
        },
    )?;

    let reminder_at = Arc::new(Mutex::new(None::<Instant>));
    let arrived = reminder_at.clone();
    let reminders = broker.subscribe(
        "reminders.*",
        named("reminders"),
        move |_: &Message| -> Result<(), HandlerError> {
            *lock(&arrived) = Some(Instant::now());
            Ok(())
        },
    )?;

    let weak = broker.downgrade(); // a handler holding a `Broker` would keep it open
    let pricing = broker.subscribe(
        "rpc.*",
        named("pricing"),
        move |m: &Message| -> Result<(), HandlerError> {
            let reply = m
                .reply()
                .ok_or_else(|| HandlerError::reject("request without reply_to"))?;
            let order = m.header("order").unwrap_or("?");
            let broker = weak
                .upgrade()
                .ok_or_else(|| HandlerError::reject("broker is gone"))?;
            broker.publish(reply.payload(format!("quote for order {order}: 12.34 EUR")))?;
            Ok(())
        },
    )?;

    let rows = vec![
        Row {
            sub: fast,
            what: "records every order".into(),
        },
        Row {
            sub: slow,
            what: format!(
                "{} ms per message, capacity {}",
                SLOW_WORK.as_millis(),
                orders as usize + GATED_CAPACITY
            ),
        },
        Row {
            sub: flaky,
            what: "fails some orders; exponential retry 5 ms x2, 3 attempts".into(),
        },
        Row {
            sub: dedup,
            what: "EU orders only (predicate); Deduplicating; no retry".into(),
        },
        Row {
            sub: gated,
            what: format!("capacity {GATED_CAPACITY}, Reject; handler held by a gate"),
        },
        Row {
            sub: reminders,
            what: "delayed messages".into(),
        },
        Row {
            sub: pricing,
            what: "answers requests with Message::reply()".into(),
        },
    ];
    Ok(Pipeline {
        rows,
        gate,
        business_runs,
        dedup_handler,
        reminder_at,
    })
}

pub(super) fn print_subscriptions(rows: &[Row]) {
    outln!("\nsubscriptions");
    for r in rows {
        outln!(
            "  {:<10} {:<12} {}",
            r.sub.name(),
            r.sub.pattern().as_str(),
            r.what
        );
    }
}

/// Delayed delivery: one reminder due during the run, one an hour away (still scheduled at
/// close). Returns when the first was published.
pub(super) fn schedule_delayed_reminders(broker: &Broker, stamp: &Stamp) -> DemoResult<Instant> {
    let published = Instant::now();
    broker.publish(
        Message::to("reminders.payment")
            .header("order", "7")
            .payload("payment for order 7 still open?")
            .delay(REMINDER_DELAY),
    )?;
    broker.publish(
        Message::to("reminders.review")
            .payload("ask for a review")
            .delay(Duration::from_secs(3600)),
    )?;
    outln!(
        "{} scheduled reminders.payment (delay {} ms) and reminders.review (delay 1 h); \
         scheduler holds {}",
        stamp.now(),
        REMINDER_DELAY.as_millis(),
        broker.scheduled()
    );
    Ok(published)
}

/// Request-reply: `pricing` answers through `Message::reply()`. Whether it answered.
pub(super) fn request_a_quote(broker: &Broker, stamp: &Stamp) -> bool {
    let asked = Instant::now();
    let reply = broker.request(
        Message::to("rpc.quote")
            .header("order", "42")
            .payload("quote order 42"),
        Duration::from_secs(1),
    );
    match &reply {
        Ok(r) => {
            outln!(
                "{} request rpc.quote -> reply {:?} (correlation id {}) in {:.2} ms",
                stamp.now(),
                String::from_utf8_lossy(r.payload()),
                r.correlation_id().unwrap_or("-"),
                asked.elapsed().as_secs_f64() * 1e3
            );
            true
        }
        Err(e) => {
            outln!("{} request rpc.quote failed: {e}", stamp.now());
            false
        }
    }
}

/// Backpressure: `gated` holds order 1 in its handler, so its bounded queue fills and refuses
/// the rest as `overflow`.
pub(super) fn publish_orders_past_a_full_queue(
    broker: &Broker,
    pipeline: &Pipeline,
    orders: u32,
    stamp: &Stamp,
) -> DemoResult<()> {
    // Order 1 first, so `gated` is provably holding it before the burst (exact counts).
    let mut accepted = 0usize;
    let mut refused = BTreeMap::<&str, usize>::new();
    let mut tally = |report: tidings::PublishReport| {
        accepted += report.accepted;
        for (_, reason) in &report.refused {
            *refused.entry(refusal_name(*reason)).or_default() += 1;
        }
    };
    tally(broker.publish(order_message(1))?);
    if !pipeline.gate.wait_held(PATIENCE) {
        return Err("the gated subscriber never received order 1".into());
    }
    outln!(
        "{} published order 1; gated holds it in its handler",
        stamp.now()
    );
    for n in 2..=orders {
        tally(broker.publish(order_message(n))?);
    }
    outln!(
        "{} published orders 1..={orders} to orders.{{eu,us,apac}} with keys and headers: \
         {accepted} accepted, refused {}",
        stamp.now(),
        join_counts(refused.iter().map(|(k, v)| (*k, *v as u64)))
    );
    Ok(())
}

/// Expiry: a message with a short TTL queued behind `slow`'s backlog is dead-lettered
/// `expired` instead of handled; then `gated`'s gate opens.
pub(super) fn expire_a_snapshot_behind_a_backlog(
    broker: &Broker,
    pipeline: &Pipeline,
    stamp: &Stamp,
) -> DemoResult<()> {
    let [_, slow, ..] = rows_ref(&pipeline.rows);
    let backlog = slow.stats().queued;
    broker.publish(
        Message::to("orders.audit.snapshot")
            .payload("end-of-batch snapshot")
            .ttl(SNAPSHOT_TTL),
    )?;
    outln!(
        "{} published orders.audit.snapshot with ttl {} ms; only orders.# matches it, and \
         slow has {backlog} queued ahead of it",
        stamp.now(),
        SNAPSHOT_TTL.as_millis()
    );
    pipeline.gate.open();
    outln!(
        "{} gate opened: gated drains the {GATED_CAPACITY} it queued",
        stamp.now()
    );
    Ok(())
}

/// Waits until every subscription is idle and the delayed reminder arrived; returns how long
/// after its publish it did.
pub(super) fn drain_and_deliver_the_reminder(
    pipeline: &Pipeline,
    reminder_published: Instant,
    stamp: &Stamp,
) -> DemoResult<Option<Duration>> {
    let subs = pipeline.subs();
    let reminder_done = || lock(&pipeline.reminder_at).is_some();
    if !wait_until(|| reminder_done() && all_idle(&subs)) {
        return Err("the subscriptions did not finish in time".into());
    }
    let reminder_delay = lock(&pipeline.reminder_at).map(|t| t.duration_since(reminder_published));
    if let Some(d) = reminder_delay {
        outln!(
            "{} reminders.payment was delivered {} ms after publish (asked for {} ms)",
            stamp.now(),
            d.as_millis(),
            REMINDER_DELAY.as_millis()
        );
    }
    outln!("{} every subscription idle", stamp.now());
    Ok(reminder_delay)
}

/// Redrive: `dedup`'s lost acknowledgements go back to it as the same messages, and
/// `Deduplicating` acknowledges them without running the business step again.
pub(super) fn redrive_lost_acks_to_the_deduplicator(
    pipeline: &Pipeline,
    stamp: &Stamp,
) -> DemoResult<RedriveReport> {
    let [_, _, _, dedup, ..] = rows_ref(&pipeline.rows);
    let lost_acks = dedup.dead_letters().len();
    let redrive = dedup.redrive(|d| matches!(d.reason, DeadLetterReason::RetriesExhausted { .. }));
    outln!(
        "{} redrive of dedup's DLQ: {} of {lost_acks} entries re-offered and accepted \
         (the same Arc<Message>, same ids), {} refused",
        stamp.now(),
        redrive.accepted,
        redrive.refused
    );
    if !wait_until(|| all_idle(&pipeline.subs())) {
        return Err("the redriven messages were not delivered in time".into());
    }
    outln!("{} every subscription idle again", stamp.now());
    Ok(redrive)
}

/// Close with a drain deadline: what is left is reported, not lost silently.
pub(super) fn close_with_a_drain_deadline(broker: &Broker, stamp: &Stamp) -> CloseReport {
    let closing = Instant::now();
    let report = broker.close(DRAIN);
    outln!(
        "{} close(drain {} s) returned in {:.1} ms",
        stamp.now(),
        DRAIN.as_secs(),
        closing.elapsed().as_secs_f64() * 1e3
    );
    report
}

/// What `Deduplicating` guards against, with this run's counts.
pub(super) fn explain_deduplication(pipeline: &Pipeline, orders: u32) {
    let runs = lock(&pipeline.business_runs).clone();
    let eu_orders = (1..=orders).filter(|n| region(*n) == "eu").count();
    let expected_lost = (1..=orders).filter(|n| ack_lost(*n)).count();
    outln!("\ndeduplication");
    outln!(
        "  Message ids are assigned at publish, so publishing an order again would be a new \
         id and\n  Deduplicating (keyed by id) would run it again. What it guards against is \
         a redelivery of\n  the same message: here dedup's handler committed {expected_lost} \
         order(s), then lost the ack, so\n  they went to its DLQ (no retry). Redriving them \
         offered the same messages again; the\n  Deduplicating wrapper found their ids \
         recorded and acknowledged without running the\n  business step."
    );
    outln!(
        "  business step ran {} times for {} distinct orders ({} EU orders published); \
         duplicates skipped: {}",
        runs.values().sum::<u32>(),
        runs.len(),
        eu_orders,
        pipeline.dedup_handler.skipped()
    );
}

/// Conservation per subscription (R-DEL-6), the DLQs by reason and the close report. Returns
/// how many subscriptions are conserved.
pub(super) fn print_accounting(
    pipeline: &Pipeline,
    redrive: &RedriveReport,
    report: &CloseReport,
) -> usize {
    let subs = pipeline.subs();
    let stats: Vec<(&Subscription, SubscriptionStats)> =
        subs.iter().map(|s| (*s, s.stats())).collect();
    outln!("\nper-subscription accounting (after close)");
    out!("{}", stats_table(&stats));
    let conserved = stats.iter().filter(|(_, st)| st.is_conserved()).count();
    // R-DEL-6: every message offered to a subscription is accounted for.
    outln!(
        "conservation (R-DEL-6): offered = accepted + refused, accepted = delivered + \
         dead-lettered + queued + in-flight: holds for {conserved} of {} subscriptions",
        stats.len()
    );
    outln!(
        "(not shown: the broker's internal reply-inbox subscription used by request(); \
         there is no handle to it)"
    );

    outln!("\ndead-letter queues (entries kept now, by reason)");
    out!("{}", dlq_table(&subs));
    outln!(
        "(dedup's {} retries_exhausted entries were redriven out of its DLQ; its counters \
         still count them)",
        redrive.accepted
    );

    outln!("\nclose report");
    out!("{}", close_summary(report, &subs));
    conserved
}

/// What the timeline observed, for the checks.
pub(super) struct Outcome<'a> {
    request_ok: bool,
    reminder_delay: Option<Duration>,
    conserved: usize,
    report: &'a CloseReport,
}

/// The in-process part's checks: counts that follow from the order numbers alone.
pub(super) fn scenario_checks(
    pipeline: &Pipeline,
    orders: u32,
    seen: &Outcome<'_>,
) -> Vec<(String, bool)> {
    let [fast, slow, flaky, dedup, gated, reminders, pricing] = rows_ref(&pipeline.rows);
    let runs = lock(&pipeline.business_runs).clone();
    let eu_orders = (1..=orders).filter(|n| region(*n) == "eu").count();
    let expected_lost = (1..=orders).filter(|n| ack_lost(*n)).count();
    let ran_once = runs.values().all(|c| *c == 1);
    let get = |s: &Subscription| s.stats();
    let plans: Vec<FlakyPlan> = (1..=orders).map(flaky_plan).collect();
    let count = |p: FlakyPlan| plans.iter().filter(|x| **x == p).count() as u64;
    let (exhausted, rejected, once) = (
        count(FlakyPlan::AlwaysFail),
        count(FlakyPlan::Reject),
        count(FlakyPlan::FailOnce),
    );
    let n = u64::from(orders);
    let (fs, ss, fl, ds, gs, rs, ps) = (
        get(fast),
        get(slow),
        get(flaky),
        get(dedup),
        get(gated),
        get(reminders),
        get(pricing),
    );
    let gated_in = GATED_CAPACITY as u64 + 1;
    let subs = pipeline.subs();
    let report = seen.report;
    vec![
        (
            format!("fast delivered all {orders} orders"),
            fs.delivered == n,
        ),
        (
            format!("slow delivered {orders} and expired the snapshot (ttl)"),
            ss.delivered == n && ss.dead_lettered.expired == 1,
        ),
        (
            format!(
                "flaky: {exhausted} retries_exhausted, {rejected} rejected, {once} succeeded on retry"
            ),
            fl.dead_lettered.retries_exhausted == exhausted
                && fl.dead_lettered.rejected == rejected
                && fl.delivered == n - exhausted - rejected
                && fl.attempts == n + 2 * exhausted + once,
        ),
        (
            format!(
                "dedup: business step once per EU order, {expected_lost} redriven duplicates skipped"
            ),
            runs.len() == eu_orders
                && ran_once
                && pipeline.dedup_handler.skipped() == expected_lost as u64
                && ds.delivered == eu_orders as u64,
        ),
        (
            format!(
                "gated: {gated_in} accepted, {} refused as overflow",
                n - gated_in
            ),
            gs.accepted == gated_in && gs.refused.overflow == n - gated_in,
        ),
        (
            format!(
                "reminders: delivered after >= {} ms",
                REMINDER_DELAY.as_millis()
            ),
            rs.delivered == 1 && seen.reminder_delay.is_some_and(|d| d >= REMINDER_DELAY),
        ),
        (
            "pricing answered the request".to_owned(),
            seen.request_ok && ps.delivered == 1,
        ),
        (
            "every subscription conserved (R-DEL-6)".to_owned(),
            seen.conserved == subs.len(),
        ),
        (
            "close left only the 1 h reminder undelivered, no handler running".to_owned(),
            report.undelivered.len() == 1
                && report.undelivered[0].subscription.is_none()
                && subs.iter().all(|s| s.stats().in_flight == 0),
        ),
    ]
}

/// Prints the checks; whether all passed.
pub(super) fn print_checks(checks: &[(String, bool)], stamp: &Stamp) -> bool {
    let passed = checks.iter().filter(|(_, ok)| *ok).count();
    outln!("\nchecks");
    for (what, ok) in checks {
        outln!("  [{}] {what}", if *ok { "ok" } else { "FAILED" });
    }
    outln!(
        "{passed} of {} checks passed; wall time {} ms",
        checks.len(),
        stamp.0.elapsed().as_millis()
    );
    passed == checks.len()
}

pub(super) fn named(name: &str) -> SubscribeOptions {
    SubscribeOptions::new().name(name.to_owned())
}

pub(super) fn rows_ref(rows: &[Row]) -> [&Subscription; 7] {
    std::array::from_fn(|i| &rows[i].sub)
}

pub(super) fn all_idle(subs: &[&Subscription]) -> bool {
    subs.iter().all(|s| {
        let st = s.stats();
        st.queued == 0 && st.in_flight == 0
    })
}
