//! The transactional idempotent consumer on SQLite (R-DEL-7), its failures (R-DEL-1) and
//! its bad input. Real files in a temporary directory; the manual driver where retries
//! are counted.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime};

use tidings::{
    AnyHandler, Broker, DeadLetterReason, Driver, Handler, HandlerError, Message, MessageId, Retry,
    SubscribeOptions,
};
use tidings_sql::{DeliveryError, OpenError, SqliteTx, TableNameError, Transactional, Value};

const TABLE: &str = "processed_messages";

fn create_accounts(path: &Path) {
    let conn = common::sqlite_checker(path);
    conn.execute_batch(
        "CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL);
         INSERT INTO accounts VALUES ('alice', 0), ('bob', 0);",
    )
    .unwrap();
}

fn balance(path: &Path, account: &str) -> i64 {
    let conn = common::sqlite_checker(path);
    conn.query_row(
        "SELECT balance FROM accounts WHERE id = ?1",
        [account],
        |r| r.get(0),
    )
    .unwrap()
}

fn recorded(path: &Path) -> Vec<String> {
    let conn = common::sqlite_checker(path);
    let mut stmt = conn
        .prepare(&format!(
            "SELECT message_id FROM {TABLE} ORDER BY message_id"
        ))
        .unwrap();
    stmt.query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn payment(account: &str, amount: i64) -> Message {
    Message::to(format!("payments.{account}"))
        .payload(format!("{account}:{amount}"))
        .build_detached()
        .unwrap()
}

fn add(tx: &mut SqliteTx<'_>, message: &Message) -> Result<(), HandlerError> {
    let text = std::str::from_utf8(message.payload())?;
    let (account, amount) = text.split_once(':').unwrap_or(("?", "0"));
    let amount: i64 = amount.parse()?;
    tx.execute(
        "UPDATE accounts SET balance = balance + ?1 WHERE id = ?2",
        &[amount.into(), account.into()],
    )?;
    Ok(())
}

fn manual_broker() -> Broker {
    Broker::builder().driver(Driver::Manual).build().unwrap()
}

fn retrying(attempts: u32) -> SubscribeOptions {
    SubscribeOptions::new().retry(Retry::fixed(Duration::ZERO, attempts))
}

// R-DEL-7
#[test]
fn commits_the_effect_with_the_id_and_skips_the_redelivery() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("ledger.db");
    create_accounts(&db);
    let ledger = Transactional::sqlite(&db, TABLE, "ledger", add).unwrap();
    let m = payment("alice", 30);
    assert_eq!(ledger.handle(&m), Ok(()));
    assert_eq!(balance(&db, "alice"), 30);
    assert_eq!(recorded(&db), vec![m.id().to_string()]);
    // The same message again (a redelivery): acknowledged, no effect, counted.
    assert_eq!(ledger.handle(&m), Ok(()));
    assert_eq!(ledger.handle(&m), Ok(()));
    assert_eq!(balance(&db, "alice"), 30);
    let s = ledger.stats();
    assert_eq!(
        (s.committed, s.skipped, s.rolled_back, s.failed),
        (1, 2, 0, 0)
    );

    // Through a broker: the same id published three times is one effect.
    let broker = manual_broker();
    let sub = broker
        .subscribe(
            "payments.#",
            SubscribeOptions::default(),
            AnyHandler::from_sync(ledger.clone()),
        )
        .unwrap();
    let id = MessageId::new();
    for _ in 0..3 {
        broker
            .publish(Message::to("payments.bob").id(id).payload("bob:5"))
            .unwrap();
    }
    broker.run_until_idle();
    assert_eq!(balance(&db, "bob"), 5);
    assert_eq!(sub.stats().delivered, 3, "duplicates are acknowledged");
    assert_eq!(ledger.stats().skipped, 4);

    // A second handler on the same file (another process, say) skips it too.
    let other = Transactional::sqlite(&db, TABLE, "ledger", add).unwrap();
    assert_eq!(other.handle(&m), Ok(()));
    assert_eq!(other.stats().skipped, 1);
    assert_eq!(balance(&db, "alice"), 30);
}

// R-DEL-1, R-DEL-7
#[test]
fn a_handler_error_rolls_back_and_the_message_is_retried() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("ledger.db");
    create_accounts(&db);
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let ledger = Transactional::sqlite(&db, TABLE, "ledger", move |tx, m: &Message| {
        add(tx, m)?; // the effect is written ...
        if c.fetch_add(1, Ordering::SeqCst) < 2 {
            return Err(HandlerError::retry("downstream not ready")); // ... and undone
        }
        Ok(())
    })
    .unwrap();
    // One failed attempt, directly: nothing written, nothing recorded.
    let m = payment("alice", 7);
    let e = ledger.handle(&m).unwrap_err();
    assert!(e.is_retryable());
    assert_eq!(e.message(), "downstream not ready");
    assert_eq!(balance(&db, "alice"), 0);
    assert!(recorded(&db).is_empty(), "the id is not recorded");
    assert!(matches!(
        ledger.last_failure(),
        Some(DeliveryError::Handler { .. })
    ));

    // Through a subscription: retried until it succeeds, applied once.
    let broker = manual_broker();
    let sub = broker
        .subscribe(
            "payments.#",
            retrying(5),
            AnyHandler::from_sync(ledger.clone()),
        )
        .unwrap();
    broker.publish(m.to_parts_builder()).unwrap();
    broker.run_until_idle();
    let stats = sub.stats();
    assert_eq!(stats.delivered, 1);
    assert_eq!(
        stats.failures, 1,
        "the second failing attempt, then success"
    );
    assert_eq!(balance(&db, "alice"), 7);
    assert_eq!(recorded(&db).len(), 1);
    let s = ledger.stats();
    assert_eq!((s.committed, s.rolled_back), (1, 2));
}

/// A message with the same id, topic and payload, to publish again.
trait Republish {
    fn to_parts_builder(&self) -> tidings::MessageBuilder;
}

impl Republish for Message {
    fn to_parts_builder(&self) -> tidings::MessageBuilder {
        Message::to(self.topic().as_str())
            .id(self.id())
            .payload(self.payload().clone())
    }
}

// R-DEL-1, R-DEL-7
#[test]
fn a_panic_rolls_back_and_the_message_is_retried() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("ledger.db");
    create_accounts(&db);
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let ledger = Transactional::sqlite(&db, TABLE, "ledger", move |tx, m: &Message| {
        add(tx, m)?;
        if c.fetch_add(1, Ordering::SeqCst) == 0 {
            panic!("boom in the ledger");
        }
        Ok(())
    })
    .unwrap();
    let broker = manual_broker();
    let sub = broker
        .subscribe(
            "payments.#",
            retrying(3),
            AnyHandler::from_sync(ledger.clone()),
        )
        .unwrap();
    broker
        .publish(payment("bob", 11).to_parts_builder())
        .unwrap();
    broker.run_until_idle();
    assert_eq!(sub.stats().delivered, 1);
    assert_eq!(sub.stats().failures, 1);
    assert_eq!(balance(&db, "bob"), 11, "the panicked attempt left nothing");
    assert_eq!(recorded(&db).len(), 1);
    assert_eq!(ledger.stats().rolled_back, 1);
    match ledger.last_failure() {
        Some(DeliveryError::Panicked { message }) => assert_eq!(message, "boom in the ledger"),
        other => panic!("{other:?}"),
    }
}

// R-DEL-1
#[test]
fn a_rejecting_handler_dead_letters_without_recording() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("ledger.db");
    create_accounts(&db);
    let ledger = Transactional::sqlite(&db, TABLE, "ledger", |tx, m: &Message| {
        add(tx, m)?;
        Err(HandlerError::reject("account frozen"))
    })
    .unwrap();
    let broker = manual_broker();
    let sub = broker
        .subscribe(
            "payments.#",
            retrying(5),
            AnyHandler::from_sync(ledger.clone()),
        )
        .unwrap();
    broker
        .publish(payment("alice", 3).to_parts_builder())
        .unwrap();
    broker.run_until_idle();
    let dead = sub.dead_letters();
    assert_eq!(dead.len(), 1);
    assert!(
        matches!(&dead[0].reason, DeadLetterReason::Rejected { error } if error == "account frozen")
    );
    assert_eq!(sub.stats().attempts, 1, "not retried");
    assert_eq!(balance(&db, "alice"), 0);
    assert!(recorded(&db).is_empty());
}

// R-DEL-7: bad input at start.
#[test]
fn bad_table_names_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("x.db");
    for (name, check) in [
        (
            "",
            &(|e: &TableNameError| *e == TableNameError::Empty) as &dyn Fn(&_) -> bool,
        ),
        ("x; DROP TABLE accounts", &|e| {
            matches!(e, TableNameError::BadChar { found: ';', .. })
        }),
        ("processed\"messages", &|e| {
            matches!(e, TableNameError::BadChar { found: '"', .. })
        }),
        ("9lives", &|e| matches!(e, TableNameError::BadStart { .. })),
        ("sqlite_master", &|e| {
            matches!(e, TableNameError::Reserved { .. })
        }),
    ] {
        match Transactional::sqlite(&db, name, "ledger", add) {
            Err(OpenError::InvalidTableName { name: n, error }) => {
                assert_eq!(n, name);
                assert!(check(&error), "{name:?}: {error}");
            }
            other => panic!("{name:?}: {other:?}"),
        }
    }
}

// R-DEL-7: a table of that name with another shape is refused, named, and left alone.
#[test]
fn a_table_of_another_shape_is_refused_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("ledger.db");
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute_batch(
        "CREATE TABLE seen (id INTEGER PRIMARY KEY, payload TEXT);
         INSERT INTO seen VALUES (1, 'keep me');
         CREATE TABLE half (message_id TEXT, processed_at INTEGER);
         CREATE VIEW done AS SELECT 'x' AS message_id, 0 AS processed_at;",
    )
    .unwrap();
    let e = Transactional::sqlite(&db, "seen", "ledger", add).unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(&e, OpenError::TableShape { table, .. } if table == "seen"),
        "{e:?}"
    );
    assert!(text.contains("`seen`"), "{text}");
    assert!(text.contains("column message_id is missing"), "{text}");
    assert!(text.contains("unexpected column payload"), "{text}");
    let kept: String = conn
        .query_row("SELECT payload FROM seen", [], |r| r.get(0))
        .unwrap();
    assert_eq!(kept, "keep me");

    let e = Transactional::sqlite(&db, "half", "ledger", add).unwrap_err();
    assert!(
        e.to_string()
            .contains("message_id is not part of the primary key"),
        "{e}"
    );
    let e = Transactional::sqlite(&db, "done", "ledger", add).unwrap_err();
    assert!(e.to_string().contains("it is a view, not a table"), "{e}");
}

// R-DEL-7: an unreachable database at start is a typed error.
#[test]
fn an_unreachable_database_at_start_is_a_typed_error() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("no/such/dir/ledger.db");
    let e = Transactional::sqlite(&db, TABLE, "ledger", add).unwrap_err();
    assert!(matches!(e, OpenError::Unavailable { .. }), "{e:?}");
}

// R-DEL-1, R-DEL-7: a database that breaks under a running handler gives a typed,
// retryable error and never an acknowledgement; once it is back, the retry succeeds.
#[test]
fn a_broken_database_is_retried_never_acknowledged() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("ledger.db");
    create_accounts(&db);
    let ran = Arc::new(AtomicU32::new(0));
    let r = ran.clone();
    let ledger = Transactional::sqlite(&db, TABLE, "ledger", move |tx, m: &Message| {
        r.fetch_add(1, Ordering::SeqCst);
        add(tx, m)
    })
    .unwrap();
    let good = std::fs::read(&db).unwrap();
    // Garbage over the file in place (same inode): SQLite finds it is not a database.
    std::fs::write(&db, vec![0x5a; good.len()]).unwrap();

    let m = payment("alice", 9);
    let e = ledger.handle(&m).unwrap_err();
    assert!(e.is_retryable(), "{e:?}");
    let failure = ledger.last_failure().unwrap();
    assert!(failure.is_database(), "{failure:?}");
    assert_eq!(ran.load(Ordering::SeqCst), 0, "the handler never ran");

    let broker = manual_broker();
    let sub = broker
        .subscribe(
            "payments.#",
            retrying(2),
            AnyHandler::from_sync(ledger.clone()),
        )
        .unwrap();
    broker.publish(m.to_parts_builder()).unwrap();
    broker.run_until_idle();
    let stats = sub.stats();
    assert_eq!(stats.delivered, 0, "never acknowledged");
    assert_eq!(stats.dead_lettered.retries_exhausted, 1);
    assert_eq!(
        ledger.stats().failed,
        1 + stats.attempts,
        "every attempt failed"
    );

    // The database is back: re-drive the dead letter.
    std::fs::write(&db, &good).unwrap();
    let report = sub.redrive(|_| true);
    assert_eq!(report.accepted, 1, "{report:?}");
    broker.run_until_idle();
    assert_eq!(sub.stats().delivered, 1);
    assert_eq!(balance(&db, "alice"), 9);
    assert_eq!(recorded(&db), vec![m.id().to_string()]);
}

// R-DEL-7, where it stops: pruning forgets ids, so a redelivery older than the horizon
// runs again.
#[test]
fn pruning_forgets_old_ids() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("ledger.db");
    create_accounts(&db);
    let ledger = Transactional::sqlite(&db, TABLE, "ledger", add).unwrap();
    // Another consumer's ids in the same table are not this handler's to prune.
    let audit = Transactional::sqlite(&db, TABLE, "audit", |_tx, _m: &Message| Ok(())).unwrap();
    let (a, b) = (payment("alice", 1), payment("alice", 2));
    ledger.handle(&a).unwrap();
    ledger.handle(&b).unwrap();
    audit.handle(&a).unwrap();
    assert_eq!(
        ledger
            .prune_before(SystemTime::now() - Duration::from_secs(3600))
            .unwrap(),
        0
    );
    assert_eq!(
        ledger
            .prune_before(SystemTime::now() + Duration::from_secs(1))
            .unwrap(),
        2
    );
    assert_eq!(recorded(&db), vec![a.id().to_string()], "audit's id stays");
    assert_eq!(
        audit
            .prune_before(SystemTime::now() + Duration::from_secs(1))
            .unwrap(),
        1
    );
    assert!(recorded(&db).is_empty());
    ledger.handle(&a).unwrap();
    assert_eq!(
        balance(&db, "alice"),
        1 + 2 + 1,
        "a pruned id is processed again"
    );
}

// The transaction's query API: rows, types, errors as values.
#[test]
fn queries_in_the_transaction() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("q.db");
    create_accounts(&db);
    let seen = Arc::new(text_cell::Cell::default());
    let s = seen.clone();
    let ledger = Transactional::sqlite(&db, TABLE, "ledger", move |tx, _m: &Message| {
        let rows = tx.query(
            "SELECT id, balance, NULL, 1.5, x'0102' FROM accounts WHERE id = ?1",
            &["bob".into()],
        )?;
        assert_eq!(rows.len(), 1);
        let r = &rows[0];
        assert_eq!(r.text(0)?, "bob");
        assert_eq!(r.integer(1)?, 0);
        assert!(r.is_null(2)?);
        assert_eq!(r.real(3)?, 1.5);
        assert_eq!(r.blob(4)?, &[1, 2]);
        assert!(r.integer(0).is_err());
        assert_eq!(
            tx.query_opt("SELECT 1 WHERE 0", &[])?
                .map(|r| r.values().to_vec()),
            None
        );
        assert_eq!(
            tx.query_opt("SELECT ?1", &[Value::Bool(true)])?
                .map(|r| r.values().to_vec()),
            Some(vec![Value::Integer(1)])
        );
        let err = tx
            .execute("INSERT INTO nowhere VALUES (1)", &[])
            .unwrap_err();
        s.set(err.to_string());
        Ok(())
    })
    .unwrap();
    ledger.handle(&payment("bob", 0)).unwrap();
    assert!(
        seen.get().contains("no such table: nowhere"),
        "{}",
        seen.get()
    );
}

/// A tiny shared string cell for the test above.
mod text_cell {
    use std::sync::Mutex;

    #[derive(Default)]
    pub struct Cell(Mutex<String>);

    impl Cell {
        pub fn set(&self, s: String) {
            *self.0.lock().unwrap() = s;
        }
        pub fn get(&self) -> String {
            self.0.lock().unwrap().clone()
        }
    }
}

// R-EXE-4 and R-DEL-7 under the tokio driver: the SQLite handler subscribed as an async
// handler runs on the blocking pool; duplicates are skipped there too.
#[cfg(feature = "tokio")]
#[test]
fn under_the_tokio_driver() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("ledger.db");
    create_accounts(&db);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let broker = Broker::builder()
        .driver(Driver::Tokio(rt.handle().clone()))
        .build()
        .unwrap();
    let ledger = Transactional::sqlite(&db, TABLE, "ledger", add).unwrap();
    let _sub = broker
        .subscribe(
            "payments.#",
            SubscribeOptions::default(),
            tidings::AnyHandler::from_async(ledger.clone()),
        )
        .unwrap();
    let ids: Vec<MessageId> = (0..20).map(|_| MessageId::new()).collect();
    for id in ids.iter().chain(&ids[..5]) {
        broker
            .publish(Message::to("payments.bob").id(*id).payload("bob:2"))
            .unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while ledger.stats().committed + ledger.stats().skipped < 25 {
        assert!(std::time::Instant::now() < deadline, "{:?}", ledger.stats());
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(ledger.stats().committed, 20);
    assert_eq!(ledger.stats().skipped, 5);
    assert_eq!(balance(&db, "bob"), 40);
    broker.close(Duration::from_secs(5));
}
