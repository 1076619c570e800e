//! `tidings demo`: an order pipeline on the real broker (thread driver, system clock).
//!
//! Seven subscriptions, each showing one behaviour, with counts that do not depend on timing:
//!
//! | name | pattern | shows |
//! |---|---|---|
//! | `fast` | `orders.*` | plain delivery through a one-level wildcard |
//! | `slow` | `orders.#` | a backlog (2 ms per message) and a TTL expiry in it |
//! | `flaky` | `orders.*` | exponential retry, then the DLQ (`retries_exhausted`, `rejected`) |
//! | `dedup` | `orders.*` + predicate | [`Deduplicating`](tidings::Deduplicating) skipping a redriven message |
//! | `gated` | `orders.*` | a full bounded queue refusing (`overflow`) while its handler is held |
//! | `reminders` | `reminders.*` | delayed delivery |
//! | `pricing` | `rpc.*` | request-reply with [`Message::reply`](tidings::Message::reply) |
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
//!
//! The code: `orders.rs` (the orders and what each handler does with them), `scenario.rs` (the
//! steps, one function each, named after what it shows), `report.rs` (the tables after close).

use std::error::Error;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use clap::Args;
use tidings::Broker;

use crate::durable_demo;
use crate::{EXIT_PROBLEM, EXIT_USAGE};

mod orders;
mod report;
mod scenario;

use scenario::scenario;

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
