//! The async PostgreSQL recipe on a durable JetStream subscription (R-DEL-7, R-EXE-3): an
//! async ledger handler, [`Transactional::postgres_async`], adds each payment to its
//! account in the transaction that records the payment's id, and is subscribed to a
//! JetStream stream through `Broker::subscribe(DurableSpec, ..)` on a broker whose tokio
//! driver awaits it. Then the subscription is moved back to the start of the stream, as if
//! the process had crashed between its commits and its acknowledgements: every payment is
//! delivered again, every redelivery is skipped, and every balance is still the sum of the
//! distinct payments.
//!
//! ```text
//! cargo run -p tidings-sql --features postgres --example postgres_async_jetstream
//! ```
//!
//! It starts a throwaway nats-server and PostgreSQL cluster (`tidings-testkit`: nats-server
//! from `TIDINGS_NATS_SERVER` or installed; PostgreSQL from Debian's package, see
//! `.ci/postgres.sh`), finishes in seconds, and exits non-zero when a check fails.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tidings::{
    Broker, Driver, DurableSpec, HandlerError, Message, StartAt, StreamConfig, SubscribeOptions,
};
use tidings_jetstream::{ConnectOptions, JetStreamBackend};
use tidings_sql::{AsyncPgTx, Transactional};
use tidings_testkit::nats::{NatsServer, NatsServerOptions};
use tidings_testkit::postgres::PostgresServer;

const PATIENCE: Duration = Duration::from_secs(60);

/// The handler: one UPDATE, in the transaction tidings opened and will commit together
/// with the payment's id. Awaiting the database blocks no thread.
async fn add_payment(tx: AsyncPgTx, message: Arc<Message>) -> Result<(), HandlerError> {
    let text = std::str::from_utf8(message.payload())?;
    let (account, amount) = text
        .split_once(':')
        .ok_or_else(|| HandlerError::reject(format!("not a payment: {text:?}")))?;
    let amount: i64 = amount.parse()?;
    let changed = tx
        .execute(
            "UPDATE accounts SET balance = balance + $1 WHERE id = $2",
            &[amount.into(), account.into()],
        )
        .await?;
    if changed != 1 {
        return Err(HandlerError::reject(format!("no account {account:?}")));
    }
    Ok(())
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) -> Result<(), String> {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        if Instant::now() >= deadline {
            return Err(format!("not within {PATIENCE:?}: {what}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let started = Instant::now();
    let nats = NatsServer::start(NatsServerOptions::new())?;
    let pg = PostgresServer::start()?;
    let db = pg.conn_string();

    // The accounts (the example's own look into the database).
    let mut check = postgres::Client::connect(&db, postgres::NoTls)?;
    check.batch_execute(
        "CREATE TABLE accounts (id text PRIMARY KEY, balance bigint NOT NULL);
         INSERT INTO accounts VALUES ('alice', 0), ('bob', 0);",
    )?;

    // A broker on JetStream whose tokio driver awaits async handlers.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let backend = JetStreamBackend::builder()
        .ack_wait(Duration::from_secs(5))
        .connect(ConnectOptions::new(nats.url()).name("postgres-async-jetstream"))?;
    let broker = Broker::builder()
        .driver(Driver::Tokio(rt.handle().clone()))
        .durable_backend(Arc::new(backend))
        .build()?;
    broker.create_stream(StreamConfig::new("payments", ["payments.#"]))?;

    let payments = [
        ("alice", 10),
        ("bob", 20),
        ("alice", 5),
        ("bob", 1),
        ("alice", 7),
        ("bob", 3),
        ("alice", 100),
        ("bob", 40),
        ("alice", 2),
        ("bob", 9),
    ];
    for (account, amount) in payments {
        broker.publish(
            Message::to(format!("payments.{account}")).payload(format!("{account}:{amount}")),
        )?;
    }

    // Consumer "ledger" (whose ids these are): the durable subscription's name.
    let ledger = rt.block_on(Transactional::postgres_async(
        &db,
        "processed_messages",
        "ledger",
        add_payment,
    ))?;
    let sub = broker.subscribe(
        DurableSpec::new("payments").name("ledger"),
        SubscribeOptions::default(),
        ledger.clone(),
    )?;
    let n = payments.len() as u64;
    wait_for("every payment committed", || ledger.stats().committed == n)?;
    let end = broker
        .stream("payments")
        .ok_or("the payments stream is open")?
        .end_offset();
    wait_for("every payment acknowledged", || sub.committed() >= end)?;

    // As after a crash between the commits and the acknowledgements: everything again.
    sub.seek(StartAt::Earliest)?;
    wait_for("every redelivery skipped", || ledger.stats().skipped == n)?;

    let mut want: BTreeMap<String, i64> = BTreeMap::new();
    for (account, amount) in payments {
        *want.entry(account.to_owned()).or_default() += amount;
    }
    let got: BTreeMap<String, i64> = check
        .query("SELECT id, balance FROM accounts", &[])?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let stats = ledger.stats();
    println!(
        "balances {got:?}; committed {}, skipped {} (redeliveries), rolled back {}, failed {}",
        stats.committed, stats.skipped, stats.rolled_back, stats.failed
    );
    if got != want || stats.committed != n || stats.rolled_back + stats.failed != 0 {
        return Err(format!("expected balances {want:?}, each payment committed once").into());
    }
    drop(sub);
    broker.close(Duration::from_secs(10));
    println!("done in {:.1?}", started.elapsed());
    Ok(())
}
