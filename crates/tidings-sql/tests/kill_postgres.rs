//! R-DEL-7 on PostgreSQL (a real server, started by the testkit), with real SIGKILLs: a ledger handler adds each payment to its
//! account inside the transaction that records the payment's id. The consuming process
//! is killed 50 times at random points (while it starts, between the insert and the
//! commit, between the commit and the acknowledgement); the durable stream redelivers
//! what was not acknowledged. At the end every account holds exactly the sum of its
//! distinct payments, and every payment id is recorded once. `TIDINGS_LONG=1`: 300 kills.
//! Without PostgreSQL installed the test installs it (root, apt-get) or fails with the fix;
//! `TIDINGS_SKIP_POSTGRES=1` skips it with a notice.
//!
//! R-DEL-1: a payment whose transaction was cut by a kill is not recorded (checked after
//! every kill whose last payment was in flight) and is delivered again.

mod common;

use std::path::PathBuf;

use common::TABLE;
use common::pg::{PgLedger, create_accounts};
use tidings::{HandlerError, Message};
use tidings_sql::{PgTx, Postgres, Transactional};
use tidings_testkit::postgres::PostgresServer;

type Ledgers = Transactional<Postgres, fn(&mut PgTx<'_>, &Message) -> Result<(), HandlerError>>;

fn add_payment(tx: &mut PgTx<'_>, message: &Message) -> Result<(), HandlerError> {
    let (account, amount) = common::parse(message)?;
    let changed = tx.execute(
        "UPDATE accounts SET balance = balance + $1 WHERE id = $2",
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

fn ledger_handler(conn: &str) -> Ledgers {
    Transactional::postgres(
        conn,
        TABLE,
        common::DURABLE,
        add_payment as fn(&mut PgTx<'_>, &Message) -> _,
    )
    .expect("the ledger handler")
}

#[test]
fn postgres_kill_loop() {
    if std::env::var_os(common::ROLE_ENV).is_some() {
        let dir = PathBuf::from(std::env::var_os(common::DIR_ENV).unwrap());
        let db = std::env::var(common::DB_ENV).unwrap();
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
    let Some(server) = PostgresServer::for_test() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("broker");
    let db = server.conn_string();
    create_accounts(&db);
    let payments = common::payments(messages, 0x5eed);
    common::publish_all(&dir, &payments);
    let ledger = PgLedger(db.clone());
    let report = common::kill_loop(
        "postgres_kill_loop",
        &dir,
        &db,
        &ledger,
        cycles,
        0xdead_beef,
    );

    // Finish the stream in this process, then check.
    common::finish_and_check(
        "postgres",
        &dir,
        &ledger,
        &payments,
        &report,
        ledger_handler(&db),
        |h| h.stats(),
    );
}
