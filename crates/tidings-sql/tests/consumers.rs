//! R-DEL-7 (amended): the recorded ids belong to one consumer. Two durable subscriptions
//! (different names, one embedded stream) each record in the same processed-messages
//! table; each applies every message once.

use std::path::Path;
use std::time::{Duration, Instant};

use tidings::{Broker, DurableSpec, HandlerError, Message, StreamConfig, SubscribeOptions};
use tidings_sql::{SqliteTx, Transactional};

const TABLE: &str = "processed_messages";
const N: i64 = 100;

fn counter(db: &Path, name: &str) -> i64 {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.busy_timeout(Duration::from_secs(10)).unwrap();
    conn.query_row("SELECT n FROM counters WHERE name = ?1", [name], |r| {
        r.get(0)
    })
    .unwrap()
}

fn count(tx: &mut SqliteTx<'_>, name: &str) -> Result<(), HandlerError> {
    tx.execute(
        "UPDATE counters SET n = n + 1 WHERE name = ?1",
        &[name.into()],
    )?;
    Ok(())
}

// R-DEL-7
#[test]
fn two_consumers_on_one_table_each_apply_every_message_once() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("effects.db");
    {
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.execute_batch(
            "CREATE TABLE counters (name TEXT PRIMARY KEY, n INTEGER NOT NULL);
             INSERT INTO counters VALUES ('billing', 0), ('audit', 0);",
        )
        .unwrap();
    }
    let broker = Broker::builder()
        .data_dir(tmp.path().join("broker"))
        .build()
        .unwrap();
    broker
        .create_stream(StreamConfig::new("orders", ["orders.#"]))
        .unwrap();
    for i in 0..N {
        broker
            .publish(Message::to("orders.new").payload(format!("order {i}")))
            .unwrap();
    }
    let billing = Transactional::sqlite(&db, TABLE, "billing", |tx, _m: &Message| {
        count(tx, "billing")
    })
    .unwrap();
    let audit =
        Transactional::sqlite(&db, TABLE, "audit", |tx, _m: &Message| count(tx, "audit")).unwrap();
    let durable = |name: &str| DurableSpec::new("orders").name(name);
    let subs = (
        broker
            .subscribe_durable(
                durable("billing"),
                SubscribeOptions::default(),
                billing.clone(),
            )
            .unwrap(),
        broker
            .subscribe_durable(durable("audit"), SubscribeOptions::default(), audit.clone())
            .unwrap(),
    );
    let settled = |h: &dyn Fn() -> tidings_sql::TransactionalStats| {
        let s = h();
        s.committed + s.skipped
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while settled(&|| billing.stats()) < N as u64 || settled(&|| audit.stats()) < N as u64 {
        assert!(
            Instant::now() < deadline,
            "timed out: {billing:?} {audit:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(subs);
    let got = (counter(&db, "billing"), counter(&db, "audit"));
    eprintln!(
        "billing {} (committed {}, skipped {}), audit {} (committed {}, skipped {})",
        got.0,
        billing.stats().committed,
        billing.stats().skipped,
        got.1,
        audit.stats().committed,
        audit.stats().skipped
    );
    assert_eq!(got, (N, N), "each consumer applies every message once");
    assert_eq!(billing.stats().skipped + audit.stats().skipped, 0);
    broker.close(Duration::from_secs(10));
}
