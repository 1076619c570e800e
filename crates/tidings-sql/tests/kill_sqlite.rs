//! R-DEL-7 on SQLite, with real SIGKILLs: a ledger handler adds each payment to its
//! account inside the transaction that records the payment's id. The consuming process
//! is killed 50 times at random points (while it starts, between the insert and the
//! commit, between the commit and the acknowledgement); the durable stream redelivers
//! what was not acknowledged. At the end every account holds exactly the sum of its
//! distinct payments, and every payment id is recorded once. `TIDINGS_LONG=1`: 300 kills.
//!
//! R-DEL-1: a payment whose transaction was cut by a kill is not recorded (checked after
//! every kill whose last payment was in flight) and is delivered again.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use common::{Ledger, TABLE};
use tidings::{HandlerError, Message};
use tidings_sql::{Sqlite, SqliteTx, Transactional};

/// The test's own view of the ledger. It reads while a consumer (a child process, or this
/// process's subscription in `finish_and_check`) writes, so every connection waits for the
/// consumer's write lock ([`common::sqlite_checker`]) instead of failing with `database is
/// locked`.
struct SqliteLedger(PathBuf);

impl Ledger for SqliteLedger {
    fn balances(&self) -> BTreeMap<String, i64> {
        let conn = common::sqlite_checker(&self.0);
        let mut stmt = conn.prepare("SELECT id, balance FROM accounts").unwrap();
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }
    fn processed(&self) -> BTreeSet<String> {
        let conn = common::sqlite_checker(&self.0);
        let mut stmt = conn
            .prepare(&format!("SELECT message_id FROM {TABLE}"))
            .unwrap();
        stmt.query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }
}

fn create_accounts(path: &Path) {
    let conn = common::sqlite_checker(path);
    conn.execute_batch("CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL)")
        .unwrap();
    for i in 0..common::ACCOUNTS {
        conn.execute(
            "INSERT INTO accounts VALUES (?1, 0)",
            [common::account_name(i)],
        )
        .unwrap();
    }
}

type Ledgers = Transactional<Sqlite, fn(&mut SqliteTx<'_>, &Message) -> Result<(), HandlerError>>;

fn add_payment(tx: &mut SqliteTx<'_>, message: &Message) -> Result<(), HandlerError> {
    let (account, amount) = common::parse(message)?;
    let changed = tx.execute(
        "UPDATE accounts SET balance = balance + ?1 WHERE id = ?2",
        &[amount.into(), account.into()],
    )?;
    if changed != 1 {
        return Err(HandlerError::reject("no such account"));
    }
    if std::env::var_os(common::ROLE_ENV).is_some() {
        common::note_in_transaction(message);
    }
    Ok(())
}

fn ledger_handler(db: &Path) -> Ledgers {
    Transactional::sqlite(
        db,
        TABLE,
        common::DURABLE,
        add_payment as fn(&mut SqliteTx<'_>, &Message) -> _,
    )
    .expect("the ledger handler")
}

#[test]
fn sqlite_kill_loop() {
    if std::env::var_os(common::ROLE_ENV).is_some() {
        let dir = PathBuf::from(std::env::var_os(common::DIR_ENV).unwrap());
        let db = PathBuf::from(std::env::var_os(common::DB_ENV).unwrap());
        common::child_loop(&dir, |broker| {
            let handler = ledger_handler(&db);
            let _sub = Box::leak(Box::new(common::subscribe_ledger(broker, handler.clone())));
            Box::new(move || {
                let s = handler.stats();
                (s.committed, s.skipped)
            })
        });
    }
    // R-DEL-7
    let (cycles, messages) = if common::long() {
        (300, 3000)
    } else {
        (50, 500)
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("broker");
    let db = tmp.path().join("ledger.db");
    create_accounts(&db);
    let payments = common::payments(messages, 0x5eed);
    common::publish_all(&dir, &payments);
    let ledger = SqliteLedger(db.clone());
    let report = common::kill_loop(
        "sqlite_kill_loop",
        &dir,
        db.to_str().unwrap(),
        &ledger,
        cycles,
        0xdead_beef,
    );

    // Finish the stream in this process, then check.
    common::finish_and_check(
        "sqlite",
        &dir,
        &ledger,
        &payments,
        &report,
        ledger_handler(&db),
        |h| h.stats(),
    );
}

/// The checker reads while the consumer holds the write lock: it waits for the lock (bounded)
/// rather than failing with `database is locked`. The lock is held longer than rusqlite's
/// default busy timeout (5 s), which the checker used to rely on: then `processed()` here
/// failed, as the kill loop's final wait did on a loaded machine while this process's own
/// subscription committed back to back.
#[test]
fn the_checker_waits_for_the_consumers_write_lock() {
    if std::env::var_os(common::ROLE_ENV).is_some() {
        return; // only the kill loop's child runs with the role set
    }
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("ledger.db");
    create_accounts(&db);
    let writer = rusqlite::Connection::open(&db).unwrap();
    writer
        .execute_batch(&format!(
            "CREATE TABLE {TABLE} (message_id TEXT PRIMARY KEY, processed_at INTEGER NOT NULL);
             BEGIN EXCLUSIVE;
             INSERT INTO {TABLE} VALUES ('m1', 0);"
        ))
        .unwrap();
    let ledger = SqliteLedger(db.clone());
    // The lock is held until the checker has started; it is released, never forced.
    let reader = std::thread::spawn(move || ledger.processed());
    std::thread::sleep(std::time::Duration::from_millis(5_500));
    writer.execute_batch("COMMIT").unwrap();
    let seen = reader.join().expect("the checker did not fail on the lock");
    assert_eq!(seen, BTreeSet::from(["m1".to_owned()]));
}
