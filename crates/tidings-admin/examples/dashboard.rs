//! A broker with the admin dashboard and Prometheus metrics (R-OPS-2, R-OPS-4).
//!
//! ```text
//! cargo run -p tidings-admin --example dashboard -- [ADDR] [--for SECONDS]
//! open http://127.0.0.1:8080/            # the dashboard
//! curl http://127.0.0.1:8080/metrics     # Prometheus text, equal to the snapshot
//! curl http://127.0.0.1:8080/api/snapshot
//! curl -X POST -H 'Authorization: Bearer demo-token' -d '{"all":true}' \
//!      http://127.0.0.1:8080/api/subscriptions/1/dead-letters/redrive
//! ```
//!
//! It publishes a few orders a second: `billing` rejects every seventh and fails every
//! fifth until its retries run out, so its dead-letter queue fills for you to redrive;
//! `audit` sees everything; `ship` is a durable cursor over the `orders` stream. Actions
//! are enabled with the token `demo-token` (or `$TIDINGS_ADMIN_TOKEN`). Without
//! `--for`, it runs until interrupted.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::PrometheusBuilder;
use tidings::{
    Broker, DurableSpec, HandlerError, Message, Priority, Retry, StreamConfig, SubscribeOptions,
};
use tidings_admin::{AdminConfig, AdminServer};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut addr: SocketAddr = "127.0.0.1:8080".parse()?;
    let mut run_for = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--for" {
            let secs: u64 = args
                .next()
                .ok_or("--for needs a number of seconds")?
                .parse()?;
            run_for = Some(Duration::from_secs(secs));
        } else {
            addr = arg.parse()?;
        }
    }
    let token = std::env::var("TIDINGS_ADMIN_TOKEN").unwrap_or_else(|_| "demo-token".into());

    // The Prometheus recorder receives the histogram on every handler call and the rest
    // from `export_metrics` on every scrape.
    let prometheus = PrometheusBuilder::new().install_recorder()?;

    let data = tempfile::tempdir()?;
    let broker = Broker::builder().data_dir(data.path()).build()?;
    broker.create_stream(StreamConfig::new("orders", ["orders.#"]))?;
    let _billing = broker.subscribe(
        "orders.created",
        SubscribeOptions::new()
            .name("billing")
            .capacity(64)
            .retry(Retry::fixed(Duration::from_millis(20), 3)),
        |m: &Message| {
            let n: u64 = std::str::from_utf8(m.payload())
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            std::thread::sleep(Duration::from_millis(2));
            match n {
                n if n % 7 == 0 => Err(HandlerError::reject("card declined")),
                n if n % 5 == 0 => Err(HandlerError::retry("payment service timed out")),
                _ => Ok(()),
            }
        },
    )?;
    let _audit = broker.subscribe(
        "orders.#",
        SubscribeOptions::new().name("audit"),
        |_: &Message| Ok::<(), HandlerError>(()),
    )?;
    let _ship = broker.subscribe(
        DurableSpec::new("orders")
            .name("ship")
            .filter("orders.paid"),
        SubscribeOptions::default(),
        |_: &Message| Ok::<(), HandlerError>(()),
    )?;

    let exporter = broker.clone();
    let server = AdminServer::start(
        broker.clone(),
        AdminConfig::new()
            .bind(addr)
            .enable_actions(token.clone())
            .metrics(move || {
                let _ = exporter.export_metrics();
                prometheus.run_upkeep();
                prometheus.render()
            }),
    )?;
    println!("dashboard: {}", server.url());
    println!("metrics:   {}metrics", server.url());
    println!("actions:   Authorization: Bearer {token}");

    let started = Instant::now();
    let mut n: u64 = 0;
    while run_for.is_none_or(|d| started.elapsed() < d) {
        n += 1;
        let priority = if n.is_multiple_of(10) {
            Priority::High
        } else {
            Priority::Normal
        };
        broker.publish(
            Message::to("orders.created")
                .payload(n.to_string())
                .header("customer", format!("c-{}", n % 13))
                .priority(priority),
        )?;
        if n.is_multiple_of(3) {
            broker.publish(Message::to("orders.paid").payload(n.to_string()))?;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let snapshot = broker.export_metrics();
    println!(
        "{} subscriptions, {} streams; shutting down",
        snapshot.subscriptions.len(),
        snapshot.streams.len()
    );
    server.shutdown();
    let report = broker.close(Duration::from_secs(5));
    println!("close: {} undelivered", report.undelivered.len());
    Ok(())
}
