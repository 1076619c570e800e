//! The idempotent consumer in a SQLite transaction (R-DEL-7): a ledger handler adds each
//! payment to its account in the same transaction that records the payment's id. The
//! payments come from a durable stream. Then every payment is delivered again (as after a
//! crash between the commit and the acknowledgement): each redelivery is skipped, and
//! every balance is the sum of the distinct payments.
//!
//! Run with `cargo run -p tidings-sql --example sql_transaction`; it finishes in seconds
//! and asserts what it prints.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tidings::{
    AnyHandler, Broker, Driver, DurableSpec, Handler, HandlerError, Message, StreamConfig,
    SubscribeOptions,
};
use tidings_sql::{Sqlite, SqliteTx, Transactional};

type Ledger = Transactional<Sqlite, fn(&mut SqliteTx<'_>, &Message) -> Result<(), HandlerError>>;

/// The handler: one UPDATE, in the transaction tidings opened and will commit.
fn add_payment(tx: &mut SqliteTx<'_>, message: &Message) -> Result<(), HandlerError> {
    let text = std::str::from_utf8(message.payload())?;
    let (account, amount) = text
        .split_once(':')
        .ok_or_else(|| HandlerError::reject(format!("not a payment: {text:?}")))?;
    let amount: i64 = amount.parse()?;
    let changed = tx.execute(
        "UPDATE accounts SET balance = balance + ?1 WHERE id = ?2",
        &[amount.into(), account.into()],
    )?;
    if changed != 1 {
        return Err(HandlerError::reject(format!("no account {account:?}")));
    }
    Ok(())
}

fn ledger(db: &Path) -> Result<Ledger, Box<dyn std::error::Error>> {
    let handler: fn(&mut SqliteTx<'_>, &Message) -> Result<(), HandlerError> = add_payment;
    // Consumer "ledger": whose ids these are. Every process applying these same effects
    // uses this name, so a redelivery to any of them is a skip.
    Ok(Transactional::sqlite(
        db,
        "processed_messages",
        "ledger",
        handler,
    )?)
}

fn broker(dir: &Path) -> Result<Broker, Box<dyn std::error::Error>> {
    let broker = Broker::builder()
        .data_dir(dir)
        .driver(Driver::Manual)
        .build()?;
    broker.create_stream(StreamConfig::new("payments", ["payments.#"]))?;
    Ok(broker)
}

/// Every account's balance, read through a transaction of the same kind (a handler
/// that only reads, run on a message of its own).
fn balances(db: &Path) -> Result<Vec<(String, i64)>, Box<dyn std::error::Error>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let reader = Transactional::sqlite(db, "reads", "reader", move |tx, _m: &Message| {
        let rows = tx.query("SELECT id, balance FROM accounts ORDER BY id", &[])?;
        let mut out = s.lock().map_err(|_| HandlerError::retry("poisoned lock"))?;
        out.clear();
        for r in rows {
            out.push((r.text(0)?.to_owned(), r.integer(1)?));
        }
        Ok(())
    })?;
    reader
        .handle(&Message::to("read").build_detached()?)
        .map_err(|e| e.to_string())?;
    let out = seen.lock().map_err(|_| "poisoned lock")?.clone();
    Ok(out)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let started = Instant::now();
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("broker");
    let db = tmp.path().join("ledger.db");

    // The accounts, through a one-off transaction of the same kind.
    let setup = Transactional::sqlite(&db, "setup", "setup", |tx, _m: &Message| {
        tx.execute_batch(
            "CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL);
             INSERT INTO accounts VALUES ('alice', 0), ('bob', 0);",
        )?;
        Ok(())
    })?;
    setup
        .handle(&Message::to("setup").build_detached()?)
        .map_err(|e| e.to_string())?;

    // Ten payments into the durable stream.
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
    {
        let b = broker(&dir)?;
        for (account, amount) in payments {
            b.publish(
                Message::to(format!("payments.{account}")).payload(format!("{account}:{amount}")),
            )?;
        }
        b.close(Duration::from_secs(5));
    }

    // The consumer: every payment once.
    let first = ledger(&db)?;
    let b = broker(&dir)?;
    let sub = b.subscribe(
        DurableSpec::new("payments").name("ledger"),
        SubscribeOptions::default(),
        AnyHandler::from_sync(first.clone()),
    )?;
    b.run_until_idle();
    drop(sub);
    println!("first delivery: {:?}", first.stats());

    // Every payment delivered again — what a crash between the commit and the
    // acknowledgement does, here as a replay of the stream from its start — to another
    // process of the same consumer ("ledger") on the same database: all skipped, nothing
    // applied twice.
    let second = ledger(&db)?;
    let _replay = b.subscribe(
        DurableSpec::new("payments").name("ledger-replay"),
        SubscribeOptions::default(),
        AnyHandler::from_sync(second.clone()),
    )?;
    b.run_until_idle();
    println!("redelivery: {:?}", second.stats());

    let got = balances(&db)?;
    println!("balances: {got:?}");
    let want = vec![("alice".to_owned(), 124), ("bob".to_owned(), 73)];
    assert_eq!(
        got, want,
        "every balance is the sum of its distinct payments"
    );
    assert_eq!(first.stats().committed, 10);
    assert_eq!(second.stats().committed, 0, "nothing ran twice");
    assert_eq!(second.stats().skipped, 10, "every redelivery was skipped");
    b.close(Duration::from_secs(5));
    println!("ok in {:?}", started.elapsed());
    Ok(())
}
