//! `tidings demo`: an order pipeline on the real broker (thread driver, system clock).
//!
//! Seven subscriptions, each showing one behaviour, with counts that do not depend on timing:
//!
//! | name | pattern | shows |
//! |---|---|---|
//! | `fast` | `orders.*` | plain delivery through a one-level wildcard |
//! | `slow` | `orders.#` | a backlog (2 ms per message) and a TTL expiry in it |
//! | `flaky` | `orders.*` | exponential retry, then the DLQ (`retries_exhausted`, `rejected`) |
//! | `dedup` | `orders.*` + predicate | [`Deduplicating`] skipping a redriven message |
//! | `gated` | `orders.*` | a full bounded queue refusing (`overflow`) while its handler is held |
//! | `reminders` | `reminders.*` | delayed delivery |
//! | `pricing` | `rpc.*` | request-reply with [`Message::reply`] |
//!
//! Then a durable stream survives a crash (see [`durable_demo`]): in a data directory, or with
//! `--nats URL` on a NATS server with JetStream. The demo's broker keeps its streams there:
//! after the crash of a broker of its own, the durable part reopens the stream on the demo's
//! broker, where it and its durable subscriptions stay until close (so `--admin` shows them).
//!
//! With `--admin ADDR` the demo broker stays up after the scenario, before it is closed,
//! with the admin dashboard, its JSON API and Prometheus `/metrics` on `ADDR` (R-OPS-4),
//! until Ctrl-C (which ends the process there) or for `--for SECS` (then the run goes on
//! to close and the checks). Only loopback addresses are served unless `--admin-public`.
//!
//! The run ends with a per-subscription table (the R-DEL-6 conservation check per row), a
//! table of DLQ entries by reason, the close report and a list of checks; the exit code is 1
//! when a check fails.

use std::collections::{BTreeMap, HashSet};
use std::error::Error;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use clap::Args;
use tidings::{
    Broker, CloseReport, DeadLetter, DeadLetterReason, Deduplicating, Handler, HandlerError,
    Message, MessageBuilder, MessageId, Overflow, Predicate, Refusal, Retry, SubscribeOptions,
    Subscription, SubscriptionStats,
};

use crate::durable_demo;
use crate::{EXIT_PROBLEM, EXIT_USAGE};

/// Arguments of `tidings demo`.
#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Number of orders to publish.
    #[arg(long, value_name = "N", default_value_t = 200,
          value_parser = clap::value_parser!(u32).range(20..=1000))]
    orders: u32,
    /// Directory for the durable part (default: a fresh one under the temp dir, removed
    /// afterwards).
    #[arg(long, value_name = "DIR", conflicts_with = "nats")]
    data_dir: Option<PathBuf>,
    /// Run the durable part on NATS JetStream at URL (e.g. nats://127.0.0.1:4222; the server
    /// needs JetStream, version 2.10 or later) instead of the embedded log. It creates one
    /// stream named for the run and deletes it at the end.
    #[arg(long, value_name = "URL")]
    nats: Option<String>,
    /// Keep the demo broker alive after the scenario with the admin dashboard, its JSON API
    /// and Prometheus /metrics on ADDR (e.g. 127.0.0.1:8080; port 0 picks a free one),
    /// printing the URL. Stops on Ctrl-C, or after --for. Loopback addresses only, unless
    /// --admin-public is given.
    #[arg(long, value_name = "ADDR")]
    admin: Option<SocketAddr>,
    /// Allow --admin on a non-loopback address: whoever can reach it sees the broker,
    /// message headers and payload previews included.
    #[arg(long, requires = "admin")]
    admin_public: bool,
    /// Enable the dashboard's actions (redrive, purge, seek) for requests carrying
    /// `Authorization: Bearer TOKEN`; without it the admin API is read-only.
    #[arg(long, value_name = "TOKEN", requires = "admin")]
    admin_token: Option<String>,
    /// With --admin: stop serving after SECS seconds, then close the broker and print the
    /// checks (default: serve until Ctrl-C).
    #[arg(long = "for", value_name = "SECS", requires = "admin")]
    for_secs: Option<u64>,
}

/// What `--admin` asked for.
struct Admin {
    addr: SocketAddr,
    token: Option<String>,
    run_for: Option<Duration>,
    prometheus: metrics_exporter_prometheus::PrometheusHandle,
}

/// Check the `--admin` options and install the Prometheus recorder (before the scenario,
/// so the processing-time histogram sees every handler call).
fn admin_of(args: &DemoArgs) -> Result<Option<Admin>, String> {
    let Some(addr) = args.admin else {
        return Ok(None);
    };
    if !addr.ip().is_loopback() && !args.admin_public {
        return Err(format!(
            "--admin {addr} is not a loopback address: the dashboard would be open to the \
             network; add --admin-public to mean it"
        ));
    }
    if args.admin_token.as_deref() == Some("") {
        return Err("--admin-token must not be empty".to_owned());
    }
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| format!("could not install the metrics recorder: {e}"))?;
    Ok(Some(Admin {
        addr,
        token: args.admin_token.clone(),
        run_for: args.for_secs.map(Duration::from_secs),
        prometheus,
    }))
}

/// Serve the admin API on `broker` until `--for` ends (or Ctrl-C ends the process).
fn serve_admin(broker: &Broker, admin: &Admin) -> DemoResult<()> {
    let exporter = broker.clone();
    let prometheus = admin.prometheus.clone();
    let mut config = tidings_admin::AdminConfig::new()
        .bind(admin.addr)
        .metrics(move || {
            let _ = exporter.export_metrics();
            prometheus.run_upkeep();
            prometheus.render()
        });
    if let Some(token) = &admin.token {
        config = config.enable_actions(token.clone());
    }
    let server = tidings_admin::AdminServer::start(broker.clone(), config)?;
    let url = server.url();
    outln!(
        "
admin: the demo broker stays up with its dashboard at {url}"
    );
    outln!("  JSON: {url}api/snapshot   Prometheus: {url}metrics");
    outln!(
        "  actions (redrive, purge, seek): {}",
        if admin.token.is_some() {
            "enabled with the bearer token given"
        } else {
            "off (read-only; --admin-token enables them)"
        }
    );
    match admin.run_for {
        Some(d) => {
            outln!("  serving for {} s", d.as_secs());
            std::thread::sleep(d);
        }
        None => {
            outln!("  press Ctrl-C to stop");
            loop {
                std::thread::park();
            }
        }
    }
    server.shutdown();
    outln!("admin: stopped; closing the demo broker");
    Ok(())
}

/// Queue capacity of `gated`: it accepts one order into its handler plus this many.
const GATED_CAPACITY: usize = 16;
/// Work time per message in `slow`.
const SLOW_WORK: Duration = Duration::from_millis(2);
/// TTL of the audit snapshot sent behind `slow`'s backlog.
const SNAPSHOT_TTL: Duration = Duration::from_millis(5);
/// Delay of the reminder that is delivered during the demo.
const REMINDER_DELAY: Duration = Duration::from_millis(250);
/// Drain deadline given to `close`.
const DRAIN: Duration = Duration::from_secs(2);
/// Longest the demo waits for anything (a safety net; a normal run needs well under 1 s).
const PATIENCE: Duration = Duration::from_secs(10);

/// Run the demo; exit 0 when every check passed.
pub(crate) fn run(args: &DemoArgs) -> ExitCode {
    let admin = match admin_of(args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("tidings demo: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let (place, temporary) = match (&args.nats, &args.data_dir) {
        (Some(url), _) => (durable_demo::Place::nats(url), None),
        (None, Some(d)) => (durable_demo::Place::DataDir(d.clone()), None),
        (None, None) => {
            let dir = durable_demo::fresh_dir();
            (durable_demo::Place::DataDir(dir.clone()), Some(dir))
        }
    };
    let outcome = scenario(args.orders, &place, admin.as_ref());
    match (&place, temporary) {
        (_, Some(dir)) => {
            let _ = std::fs::remove_dir_all(dir);
        }
        (durable_demo::Place::DataDir(dir), None) => outln!(
            "inspect the data dir offline: tidings stream ls -d {0}; tidings dlq show orders fraud -d {0}",
            dir.display()
        ),
        (durable_demo::Place::Nats { .. }, None) => {}
    }
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(EXIT_PROBLEM),
        Err(e) => {
            eprintln!("tidings demo: {e}");
            ExitCode::from(EXIT_PROBLEM)
        }
    }
}

pub(crate) type DemoResult<T> = Result<T, Box<dyn Error>>;

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

// ---------------------------------------------------------------------------------------
// The orders and what each subscriber does with them.

fn region(n: u32) -> &'static str {
    ["eu", "us", "apac"][(n % 3) as usize]
}

fn order_message(n: u32) -> MessageBuilder {
    let customer = format!("customer-{:02}", n % 17);
    let cents = 1_000 + (n * 137) % 9_000;
    let amount = format!("{}.{:02}", cents / 100, cents % 100);
    Message::to(format!("orders.{}", region(n)))
        .key(&customer)
        .header("order", n.to_string())
        .header("region", region(n))
        .header("amount", amount.clone())
        .header("currency", "EUR")
        .payload(format!(
            r#"{{"order":{n},"customer":"{customer}","amount":"{amount}"}}"#
        ))
}

fn order_no(m: &Message) -> Result<u32, HandlerError> {
    m.header("order")
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| HandlerError::reject("no numeric `order` header"))
}

/// What `flaky` does with order `n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FlakyPlan {
    /// Succeeds at once.
    Ok,
    /// Fails the first attempt, succeeds on the retry.
    FailOnce,
    /// Fails every attempt: retried, then dead-lettered `retries_exhausted`.
    AlwaysFail,
    /// A non-retryable error: dead-lettered `rejected` at once.
    Reject,
}

fn flaky_plan(n: u32) -> FlakyPlan {
    if n % 100 == 42 {
        FlakyPlan::Reject
    } else if n % 20 == 7 {
        FlakyPlan::AlwaysFail
    } else if n % 25 == 3 {
        FlakyPlan::FailOnce
    } else {
        FlakyPlan::Ok
    }
}

/// `dedup` only takes EU orders; of those, these lose their acknowledgement once.
fn ack_lost(n: u32) -> bool {
    region(n) == "eu" && n % 10 == 3
}

/// Holds the first message `gated` receives until opened.
#[derive(Default)]
struct Gate {
    /// (a handler is holding, the gate is open)
    state: Mutex<(bool, bool)>,
    changed: Condvar,
}

impl Gate {
    /// Called by the handler: the first call waits until the gate opens (at most `PATIENCE`).
    fn hold(&self) {
        let mut s = lock(&self.state);
        if s.0 {
            return;
        }
        s.0 = true;
        self.changed.notify_all();
        let _unused = self
            .changed
            .wait_timeout_while(s, PATIENCE, |s| !s.1)
            .unwrap_or_else(PoisonError::into_inner);
    }
    fn wait_held(&self, timeout: Duration) -> bool {
        let s = lock(&self.state);
        let (s, _) = self
            .changed
            .wait_timeout_while(s, timeout, |s| !s.0)
            .unwrap_or_else(PoisonError::into_inner);
        s.0
    }
    fn open(&self) {
        lock(&self.state).1 = true;
        self.changed.notify_all();
    }
}

/// Remembers which message ids were seen once (for "fail the first time" behaviours).
#[derive(Default)]
struct FirstTime(Mutex<HashSet<MessageId>>);

impl FirstTime {
    fn check(&self, id: MessageId) -> bool {
        lock(&self.0).insert(id)
    }
}

/// One subscription of the demo and what it is for.
struct Row {
    sub: Subscription,
    what: String,
}

// ---------------------------------------------------------------------------------------
// The scenario.

fn scenario(orders: u32, place: &durable_demo::Place, admin: Option<&Admin>) -> DemoResult<bool> {
    let t0 = Instant::now();
    let stamp = || format!("  [{:>5} ms]", t0.elapsed().as_millis());
    // Thread driver, system clock; its streams in the data dir (or on the server).
    let (broker, backend) = place.broker()?;
    outln!(
        "tidings demo: {orders} orders through an in-process broker (thread driver, system clock)"
    );

    // -- subscriptions ------------------------------------------------------------------
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
        SubscribeOptions {
            capacity: orders as usize + GATED_CAPACITY,
            ..named("slow")
        },
        |_: &Message| -> Result<(), HandlerError> {
            std::thread::sleep(SLOW_WORK);
            Ok(())
        },
    )?;

    let flaky_seen = FirstTime::default();
    let flaky = broker.subscribe(
        "orders.*",
        SubscribeOptions {
            retry: Retry::exponential(Duration::from_millis(5), 2.0).max_attempts(3),
            ..named("flaky")
        },
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
    let runs = business_runs.clone();
    let dedup_handler = Arc::new(Deduplicating::new(
        move |m: &Message| -> Result<(), HandlerError> {
            let n = order_no(m)?;
            *lock(&runs).entry(n).or_default() += 1; // "charge the card, write the ledger"
            Ok(())
        },
    ));
    // ...then an acknowledgement step that fails once for some orders, after the work.
    let inner = dedup_handler.clone();
    let ack_seen = FirstTime::default();
    let dedup = broker.subscribe(
        "orders.*",
        SubscribeOptions {
            retry: Retry::None,
            predicate: Some(Predicate::new(|m| m.header("region") == Some("eu"))),
            ..named("dedup")
        },
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
        SubscribeOptions {
            capacity: GATED_CAPACITY,
            overflow: Overflow::Reject,
            ..named("gated")
        },
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
    outln!("\nsubscriptions");
    for r in &rows {
        outln!(
            "  {:<10} {:<12} {}",
            r.sub.name(),
            r.sub.pattern().as_str(),
            r.what
        );
    }
    let [fast, slow, flaky, dedup, gated, reminders, pricing] = rows_ref(&rows);

    // -- timeline ---------------------------------------------------------------------------
    outln!("\ntimeline");
    let reminder_published = Instant::now();
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
        stamp(),
        REMINDER_DELAY.as_millis(),
        broker.scheduled()
    );

    let asked = Instant::now();
    let reply = broker.request(
        Message::to("rpc.quote")
            .header("order", "42")
            .payload("quote order 42"),
        Duration::from_secs(1),
    );
    let request_ok = match &reply {
        Ok(r) => {
            outln!(
                "{} request rpc.quote -> reply {:?} (correlation id {}) in {:.2} ms",
                stamp(),
                String::from_utf8_lossy(r.payload()),
                r.correlation_id().unwrap_or("-"),
                asked.elapsed().as_secs_f64() * 1e3
            );
            true
        }
        Err(e) => {
            outln!("{} request rpc.quote failed: {e}", stamp());
            false
        }
    };

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
    if !gate.wait_held(PATIENCE) {
        return Err("the gated subscriber never received order 1".into());
    }
    outln!(
        "{} published order 1; gated holds it in its handler",
        stamp()
    );
    for n in 2..=orders {
        tally(broker.publish(order_message(n))?);
    }
    outln!(
        "{} published orders 1..={orders} to orders.{{eu,us,apac}} with keys and headers: \
         {accepted} accepted, refused {}",
        stamp(),
        join_counts(refused.iter().map(|(k, v)| (*k, *v as u64)))
    );

    let backlog = slow.stats().queued;
    broker.publish(
        Message::to("orders.audit.snapshot")
            .payload("end-of-batch snapshot")
            .ttl(SNAPSHOT_TTL),
    )?;
    outln!(
        "{} published orders.audit.snapshot with ttl {} ms; only orders.# matches it, and \
         slow has {backlog} queued ahead of it",
        stamp(),
        SNAPSHOT_TTL.as_millis()
    );
    gate.open();
    outln!(
        "{} gate opened: gated drains the {GATED_CAPACITY} it queued",
        stamp()
    );

    let subs: Vec<&Subscription> = rows.iter().map(|r| &r.sub).collect();
    let reminder_done = || lock(&reminder_at).is_some();
    if !wait_until(|| reminder_done() && all_idle(&subs)) {
        return Err("the subscriptions did not finish in time".into());
    }
    let reminder_delay = lock(&reminder_at).map(|t| t.duration_since(reminder_published));
    if let Some(d) = reminder_delay {
        outln!(
            "{} reminders.payment was delivered {} ms after publish (asked for {} ms)",
            stamp(),
            d.as_millis(),
            REMINDER_DELAY.as_millis()
        );
    }
    outln!("{} every subscription idle", stamp());

    let lost_acks = dedup.dead_letters().len();
    let redrive = dedup.redrive(|d| matches!(d.reason, DeadLetterReason::RetriesExhausted { .. }));
    outln!(
        "{} redrive of dedup's DLQ: {} of {lost_acks} entries re-offered and accepted \
         (the same Arc<Message>, same ids), {} refused",
        stamp(),
        redrive.accepted,
        redrive.refused
    );
    if !wait_until(|| all_idle(&subs)) {
        return Err("the redriven messages were not delivered in time".into());
    }
    outln!("{} every subscription idle again", stamp());
    // The durable part: its stream and durable subscriptions stay open on this broker.
    let mut durable = durable_demo::scenario(place, &broker, backend)?;
    if let Some(admin) = admin {
        serve_admin(&broker, admin)?;
    }

    durable.unsubscribe();
    let closing = Instant::now();
    let report = broker.close(DRAIN);
    outln!(
        "{} close(drain {} s) returned in {:.1} ms",
        stamp(),
        DRAIN.as_secs(),
        closing.elapsed().as_secs_f64() * 1e3
    );

    // -- deduplication ----------------------------------------------------------------------
    let runs = lock(&business_runs).clone();
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
    let ran_once = runs.values().all(|c| *c == 1);
    outln!(
        "  business step ran {} times for {} distinct orders ({} EU orders published); \
         duplicates skipped: {}",
        runs.values().sum::<u32>(),
        runs.len(),
        eu_orders,
        dedup_handler.skipped()
    );

    // -- tables -----------------------------------------------------------------------------
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
    out!("{}", close_summary(&report, &subs));

    // -- checks -----------------------------------------------------------------------------
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
    let mut checks: Vec<(String, bool)> = vec![
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
                && dedup_handler.skipped() == expected_lost as u64
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
            rs.delivered == 1 && reminder_delay.is_some_and(|d| d >= REMINDER_DELAY),
        ),
        (
            "pricing answered the request".to_owned(),
            request_ok && ps.delivered == 1,
        ),
        (
            "every subscription conserved (R-DEL-6)".to_owned(),
            conserved == stats.len(),
        ),
        (
            "close left only the 1 h reminder undelivered, no handler running".to_owned(),
            report.undelivered.len() == 1
                && report.undelivered[0].subscription.is_none()
                && subs.iter().all(|s| s.stats().in_flight == 0),
        ),
    ];
    checks.extend(std::mem::take(&mut durable.checks));
    durable.clean_up();
    let passed = checks.iter().filter(|(_, ok)| *ok).count();
    outln!("\nchecks");
    for (what, ok) in &checks {
        outln!("  [{}] {what}", if *ok { "ok" } else { "FAILED" });
    }
    outln!(
        "{passed} of {} checks passed; wall time {} ms",
        checks.len(),
        t0.elapsed().as_millis()
    );
    Ok(passed == checks.len())
}

fn named(name: &str) -> SubscribeOptions {
    SubscribeOptions {
        name: Some(name.to_owned()),
        ..Default::default()
    }
}

fn rows_ref(rows: &[Row]) -> [&Subscription; 7] {
    std::array::from_fn(|i| &rows[i].sub)
}

fn all_idle(subs: &[&Subscription]) -> bool {
    subs.iter().all(|s| {
        let st = s.stats();
        st.queued == 0 && st.in_flight == 0
    })
}

/// Poll `done` every 2 ms until it holds or `PATIENCE` passes.
pub(crate) fn wait_until(mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn refusal_name(r: Refusal) -> &'static str {
    match r {
        Refusal::Filtered => "filtered",
        Refusal::Overflow => "overflow",
        Refusal::Closed => "closed",
        _ => "other",
    }
}

/// `"0"`, or `"12 (a 10, b 2)"` listing the non-zero counts.
fn join_counts<'a>(counts: impl IntoIterator<Item = (&'a str, u64)>) -> String {
    let parts: Vec<(&str, u64)> = counts.into_iter().filter(|(_, n)| *n > 0).collect();
    let total: u64 = parts.iter().map(|(_, n)| n).sum();
    if parts.is_empty() {
        return "0".to_owned();
    }
    let list: Vec<String> = parts.iter().map(|(k, n)| format!("{k} {n}")).collect();
    format!("{total} ({})", list.join(", "))
}

// ---------------------------------------------------------------------------------------
// Output.

/// A plain text table: text columns left-aligned, the others right-aligned.
fn render(headers: &[&str], left: &[bool], rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = (0..headers.len())
        .map(|c| {
            rows.iter()
                .map(|r| r[c].chars().count())
                .chain([headers[c].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    let mut line = |cells: &[String]| {
        let mut text = String::from(" ");
        for (c, cell) in cells.iter().enumerate() {
            let w = widths[c];
            let _ = if left[c] {
                write!(text, " {cell:<w$} ")
            } else {
                write!(text, " {cell:>w$} ")
            };
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&headers.iter().map(|h| (*h).to_owned()).collect::<Vec<_>>());
    line(&widths.iter().map(|w| "-".repeat(*w)).collect::<Vec<_>>());
    for r in rows {
        line(r);
    }
    out
}

fn stats_table(stats: &[(&Subscription, SubscriptionStats)]) -> String {
    let headers = [
        "subscription",
        "pattern",
        "offered",
        "accepted",
        "refused",
        "delivered",
        "dead-lettered",
        "queued",
        "in-flight",
        "attempts",
        "failures",
        "dlq",
        "conserved",
    ];
    let left = [
        true, true, false, false, true, false, true, false, false, false, false, false, true,
    ];
    let rows: Vec<Vec<String>> = stats
        .iter()
        .map(|(sub, st)| {
            let r = &st.refused;
            let d = &st.dead_lettered;
            vec![
                sub.name().to_owned(),
                sub.pattern().as_str().to_owned(),
                st.offered.to_string(),
                st.accepted.to_string(),
                join_counts([
                    ("filtered", r.filtered),
                    ("overflow", r.overflow),
                    ("closed", r.closed),
                ]),
                st.delivered.to_string(),
                join_counts([
                    ("retries_exhausted", d.retries_exhausted),
                    ("rejected", d.rejected),
                    ("expired", d.expired),
                    ("dropped_oldest", d.dropped_oldest),
                    ("shutdown", d.shutdown),
                ]),
                st.queued.to_string(),
                st.in_flight.to_string(),
                st.attempts.to_string(),
                st.failures.to_string(),
                st.dlq_len.to_string(),
                if st.is_conserved() { "yes" } else { "NO" }.to_owned(),
            ]
        })
        .collect();
    render(&headers, &left, &rows)
}

fn dlq_table(subs: &[&Subscription]) -> String {
    let mut rows = Vec::new();
    for sub in subs {
        let mut by_reason: BTreeMap<&'static str, (usize, Option<DeadLetter>)> = BTreeMap::new();
        for entry in sub.dead_letters() {
            let slot = by_reason.entry(entry.reason.name()).or_default();
            slot.0 += 1;
            let better = slot.1.as_ref().is_none_or(|e| e.last_error().is_none())
                && entry.last_error().is_some();
            if slot.1.is_none() || better {
                slot.1 = Some(entry);
            }
        }
        if by_reason.is_empty() {
            rows.push(vec![
                sub.name().to_owned(),
                "-".into(),
                "0".into(),
                String::new(),
            ]);
        }
        for (reason, (count, example)) in by_reason {
            rows.push(vec![
                sub.name().to_owned(),
                reason.to_owned(),
                count.to_string(),
                example.map(|e| describe(&e)).unwrap_or_default(),
            ]);
        }
    }
    render(
        &["subscription", "reason", "entries", "example (last error)"],
        &[true, true, false, true],
        &rows,
    )
}

fn describe(e: &DeadLetter) -> String {
    let m = &e.message;
    let mut s = m.topic().as_str().to_owned();
    if let Some(n) = m.header("order") {
        let _ = write!(s, " order {n}");
    }
    let _ = write!(s, ", {} attempt(s)", e.attempts);
    if let Some(err) = e.last_error() {
        let _ = write!(s, ": {err}");
    }
    s
}

fn close_summary(report: &CloseReport, subs: &[&Subscription]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "  clean: {}; undelivered: {}; unjoined threads: {}",
        if report.is_clean() { "yes" } else { "no" },
        report.undelivered.len(),
        report.unjoined.len()
    );
    for u in &report.undelivered {
        let whose = match u.subscription {
            None => "still scheduled (delayed); never offered, dropped by close".to_owned(),
            Some(id) => {
                let name = subs
                    .iter()
                    .find(|s| s.id() == id)
                    .map_or_else(|| id.to_string(), |s| s.name().to_owned());
                format!("queued for {name}")
            }
        };
        let _ = writeln!(
            out,
            "  - {} id {}: {whose}",
            u.message.topic().as_str(),
            u.message.id()
        );
    }
    // The stats say whether a handler could really have been running: with nothing in flight
    // anywhere, an unjoined thread was only late to exit after its dispatcher loop ended.
    let idle = subs.iter().all(|s| s.stats().in_flight == 0);
    for t in &report.unjoined {
        if idle {
            let _ = writeln!(
                out,
                "  - thread {t} reported unjoined with nothing in flight: it had left its \
                 dispatch loop but not yet exited when close checked it (it exits on its own)"
            );
        } else {
            let _ = writeln!(out, "  - thread {t} was still running a handler");
        }
    }
    out
}
