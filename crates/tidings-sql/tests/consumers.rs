//! R-DEL-7 (amended): the recorded ids belong to one consumer. Two durable subscriptions
//! (different names, one embedded stream) each record in the same processed-messages
//! table; each applies every message once. A table of the shape before (ids alone) is
//! refused by name with its migration, on SQLite and (feature `postgres`) PostgreSQL.

use std::path::Path;
use std::time::{Duration, Instant};

use tidings::{
    Broker, DurableSpec, Handler, HandlerError, Message, MessageId, StreamConfig, SubscribeOptions,
};
use tidings_sql::{ConsumerNameError, OpenError, SqliteTx, Transactional};

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
            .subscribe(
                durable("billing"),
                SubscribeOptions::default(),
                tidings::AnyHandler::from_sync(billing.clone()),
            )
            .unwrap(),
        broker
            .subscribe(
                durable("audit"),
                SubscribeOptions::default(),
                tidings::AnyHandler::from_sync(audit.clone()),
            )
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

fn order(id: MessageId) -> Message {
    Message::to("orders.new")
        .id(id)
        .payload("order")
        .build_detached()
        .unwrap()
}

/// Every (consumer, message id) recorded in the SQLite table, sorted.
fn sqlite_rows(db: &Path) -> Vec<(String, String)> {
    let conn = rusqlite::Connection::open(db).unwrap();
    let mut stmt = conn
        .prepare(&format!(
            "SELECT consumer, message_id FROM {TABLE} ORDER BY 1, 2"
        ))
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

// R-DEL-7: a table of the old shape (message ids alone) is refused by name, nothing
// changed, with the migration; after running it, the old ids are the named consumer's.
#[test]
fn an_unattributed_sqlite_table_is_refused_with_its_migration() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("effects.db");
    let old = MessageId::new();
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute_batch(&format!(
        "CREATE TABLE counters (name TEXT PRIMARY KEY, n INTEGER NOT NULL);
         INSERT INTO counters VALUES ('billing', 0), ('audit', 0);
         CREATE TABLE {TABLE} (message_id TEXT NOT NULL PRIMARY KEY, \
         processed_at INTEGER NOT NULL) WITHOUT ROWID;
         INSERT INTO {TABLE} VALUES ('{old}', 1);"
    ))
    .unwrap();
    let billing = |tx: &mut SqliteTx<'_>, _m: &Message| count(tx, "billing");
    let e = Transactional::sqlite(&db, TABLE, "billing", billing).unwrap_err();
    let OpenError::UnattributedTable {
        table,
        consumer,
        fix,
    } = &e
    else {
        panic!("{e:?}")
    };
    assert_eq!((table.as_str(), consumer.as_str()), (TABLE, "billing"));
    let text = e.to_string();
    assert!(text.contains(&format!("`{TABLE}`")), "{text}");
    assert!(text.contains(fix.as_str()), "{text}");
    eprintln!("{text}");
    // Nothing changed: the old table as it was, no fence table.
    let n: i64 = conn
        .query_row(&format!("SELECT count(*) FROM {TABLE}"), [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 1);
    let fence: i64 = conn
        .query_row(
            &format!("SELECT count(*) FROM sqlite_master WHERE name = '{TABLE}_fence'"),
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(fence, 0);

    // The fix, as given.
    conn.execute_batch(fix).unwrap();
    let billing = Transactional::sqlite(&db, TABLE, "billing", billing).unwrap();
    let audit =
        Transactional::sqlite(&db, TABLE, "audit", |tx, _m: &Message| count(tx, "audit")).unwrap();
    // The old id is billing's: a redelivery skips there, and audit applies it.
    assert_eq!(billing.handle(&order(old)), Ok(()));
    assert_eq!(audit.handle(&order(old)), Ok(()));
    assert_eq!((billing.stats().skipped, audit.stats().committed), (1, 1));
    assert_eq!((counter(&db, "billing"), counter(&db, "audit")), (0, 1));
    assert_eq!(
        sqlite_rows(&db),
        vec![
            ("audit".to_owned(), old.to_string()),
            ("billing".to_owned(), old.to_string())
        ]
    );
}

// R-DEL-7: bad consumer names are refused with a typed error, before anything is opened;
// a fence table name taken by another table is refused by name.
#[test]
fn bad_consumer_names_and_a_taken_fence_table_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("effects.db");
    let h = |_tx: &mut SqliteTx<'_>, _m: &Message| Ok(());
    for (name, want) in [
        ("", ConsumerNameError::Empty),
        (
            &"c".repeat(129)[..],
            ConsumerNameError::TooLong { len: 129, max: 128 },
        ),
        ("a\tb", ConsumerNameError::Control { found: '\t', at: 1 }),
    ] {
        match Transactional::sqlite(&db, TABLE, name, h) {
            Err(OpenError::InvalidConsumerName { name: n, error }) => {
                assert_eq!((n.as_str(), error), (name, want));
            }
            other => panic!("{name:?}: {other:?}"),
        }
    }
    assert!(!db.exists(), "nothing was opened");
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch("CREATE TABLE ids_fence (x TEXT)")
        .unwrap();
    let e = Transactional::sqlite(&db, "ids", "billing", h).unwrap_err();
    assert!(
        matches!(&e, OpenError::TableShape { table, .. } if table == "ids_fence"),
        "{e:?}"
    );
}

#[cfg(feature = "postgres")]
mod postgres {
    use tidings_testkit::postgres::PostgresServer;

    use super::*;

    // R-DEL-7: the old shape on PostgreSQL: refused by name with the migration, which
    // attributes the old ids to the named consumer.
    #[test]
    fn an_unattributed_postgres_table_is_refused_with_its_migration() {
        let Some(server) = PostgresServer::for_test() else {
            return;
        };
        let conn = server.conn_string();
        let mut client = ::postgres::Client::connect(&conn, ::postgres::NoTls).unwrap();
        let old = MessageId::new();
        client
            .batch_execute(&format!(
                "CREATE TABLE effects (consumer text NOT NULL, id text NOT NULL);
                 CREATE TABLE {TABLE} (message_id text PRIMARY KEY, processed_at bigint NOT NULL);
                 INSERT INTO {TABLE} VALUES ('{old}', 1);"
            ))
            .unwrap();
        let effect = |tx: &mut tidings_sql::PgTx<'_>, m: &Message| {
            tx.execute(
                "INSERT INTO effects VALUES ('billing', $1)",
                &[m.id().to_string().into()],
            )?;
            Ok(())
        };
        let e = Transactional::postgres(&conn, TABLE, "billing", effect).unwrap_err();
        let OpenError::UnattributedTable { table, fix, .. } = &e else {
            panic!("{e:?}")
        };
        assert_eq!(table, TABLE);
        eprintln!("{e}");
        let fence = client
            .query_one("SELECT to_regclass($1)::text", &[&format!("{TABLE}_fence")])
            .unwrap()
            .get::<_, Option<String>>(0);
        assert_eq!(fence, None, "nothing changed");
        // The async constructor refuses the same way.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let e = rt
            .block_on(Transactional::postgres_async(
                &conn,
                TABLE,
                "billing",
                |_tx, _m| async { Ok(()) },
            ))
            .unwrap_err();
        assert!(matches!(e, OpenError::UnattributedTable { .. }), "{e:?}");

        client.batch_execute(fix).unwrap();
        let billing = Transactional::postgres(&conn, TABLE, "billing", effect).unwrap();
        assert_eq!(billing.handle(&order(old)), Ok(()));
        assert_eq!(billing.stats().skipped, 1, "the old id is billing's");
        let fresh = MessageId::new();
        assert_eq!(billing.handle(&order(fresh)), Ok(()));
        let rows: Vec<(String, String)> = client
            .query(
                &format!("SELECT consumer, message_id FROM {TABLE} ORDER BY message_id"),
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let mut want = vec![
            ("billing".to_owned(), fresh.to_string()),
            ("billing".to_owned(), old.to_string()),
        ];
        want.sort();
        assert_eq!(rows, want);
    }
}
