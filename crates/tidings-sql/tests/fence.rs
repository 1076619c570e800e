//! R-DIST-8 in the transactional recipe (R-DEL-7): a delivery carrying a fence (a keyed
//! group's partition and its owner's lease term) is refused inside its own transaction
//! when a greater term of its partition is recorded for the consumer: the handler does
//! not run, nothing commits, the error says "fenced" and is counted. On SQLite and (with
//! the `postgres` feature) PostgreSQL, blocking and async; and two connections racing
//! terms: no stale effect commits after the new owner's first commit.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use tidings::{Fence, Handler, HandlerError, Message};
use tidings_sql::{DeliveryError, SqliteTx, Transactional, TransactionalStats};

const TABLE: &str = "processed_messages";

/// A detached message carrying `fence` (as a keyed group hands it out), or none.
fn message(fence: Option<(u32, u64)>) -> Message {
    let mut m = Message::to("orders.new")
        .payload("order")
        .build_detached()
        .unwrap();
    if let Some((partition, term)) = fence {
        tidings::durable::set_fence(&mut m, Fence::new(partition, term));
    }
    m
}

/// What the scenario needs from one handler under test, whatever the database.
trait Subject {
    fn deliver(&self, m: &Message) -> Result<(), HandlerError>;
    fn stats(&self) -> TransactionalStats;
    fn last_failure(&self) -> Option<DeliveryError>;
}

impl<D, F> Subject for Transactional<D, F>
where
    Transactional<D, F>: Handler,
{
    fn deliver(&self, m: &Message) -> Result<(), HandlerError> {
        self.handle(m)
    }
    fn stats(&self) -> TransactionalStats {
        Transactional::stats(self)
    }
    fn last_failure(&self) -> Option<DeliveryError> {
        Transactional::last_failure(self)
    }
}

/// What the scenario reads back from the database.
trait Tables {
    /// The ids of the messages whose effect committed.
    fn effects(&self) -> Vec<String>;
    /// The ids recorded for `consumer`.
    fn recorded(&self, consumer: &str) -> Vec<String>;
    /// The fence table: (consumer, partition, term), sorted.
    fn fences(&self) -> Vec<(String, i64, i64)>;
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

/// The scenario, for one database: `ledger` and `other` are handlers of consumers
/// "ledger" and "other" on one table, whose handler inserts the message id into
/// `effects` and counts its runs in `runs`.
fn stale_terms_are_refused(
    ledger: &dyn Subject,
    other: &dyn Subject,
    runs: &AtomicU32,
    db: &dyn Tables,
) {
    let id = |m: &Message| m.id().to_string();
    // Term 2 of partition 0 commits.
    let m1 = message(Some((0, 2)));
    assert_eq!(ledger.deliver(&m1), Ok(()));
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // A term-1 delivery of another message of partition 0: refused, handler not run,
    // nothing committed, a retryable error saying "fenced", counted.
    let stale = message(Some((0, 1)));
    let e = ledger.deliver(&stale).unwrap_err();
    assert!(e.is_retryable(), "{e:?}");
    assert!(e.message().starts_with("tidings-sql: fenced:"), "{e:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler did not run");
    match ledger.last_failure() {
        Some(DeliveryError::Fenced {
            partition: 0,
            term: 1,
            recorded: 2,
        }) => {}
        other => panic!("{other:?}"),
    }
    assert!(ledger.last_failure().unwrap().is_fenced());
    assert_eq!(db.effects(), vec![id(&m1)]);
    assert_eq!(db.recorded("ledger"), vec![id(&m1)]);
    let s = ledger.stats();
    assert_eq!(
        (s.committed, s.fenced, s.rolled_back, s.failed),
        (1, 1, 0, 0)
    );
    // Refused again on a retry: terms do not go back.
    ledger.deliver(&stale).unwrap_err();
    assert_eq!(ledger.stats().fenced, 2);

    // The same term passes, a greater one passes and then fences the one before.
    let m2 = message(Some((0, 2)));
    assert_eq!(ledger.deliver(&m2), Ok(()));
    let m3 = message(Some((0, 3)));
    assert_eq!(ledger.deliver(&m3), Ok(()));
    let late = message(Some((0, 2)));
    ledger.deliver(&late).unwrap_err();
    assert!(matches!(
        ledger.last_failure(),
        Some(DeliveryError::Fenced {
            term: 2,
            recorded: 3,
            ..
        })
    ));

    // Other partitions are independent; a message without a fence is not fenced.
    let p1 = message(Some((1, 1)));
    assert_eq!(ledger.deliver(&p1), Ok(()));
    let plain = message(None);
    assert_eq!(ledger.deliver(&plain), Ok(()));
    // Another consumer's terms are its own.
    let o = message(Some((0, 1)));
    assert_eq!(other.deliver(&o), Ok(()));
    assert_eq!(other.stats().fenced, 0);

    // A redelivery of a committed message under its term is still a skip.
    assert_eq!(ledger.deliver(&m3), Ok(()));
    assert_eq!(ledger.stats().skipped, 1);

    // A term beyond the column's range: a typed error, nothing begun.
    let huge = message(Some((0, u64::MAX)));
    ledger.deliver(&huge).unwrap_err();
    assert!(matches!(
        ledger.last_failure(),
        Some(DeliveryError::TermOutOfRange {
            partition: 0,
            term: u64::MAX
        })
    ));

    assert_eq!(
        sorted(db.effects()),
        sorted(vec![id(&m1), id(&m2), id(&m3), id(&p1), id(&plain), id(&o)])
    );
    assert_eq!(
        db.recorded("ledger"),
        sorted(vec![id(&m1), id(&m2), id(&m3), id(&p1), id(&plain)])
    );
    assert_eq!(
        db.fences(),
        vec![
            ("ledger".to_owned(), 0, 3),
            ("ledger".to_owned(), 1, 1),
            ("other".to_owned(), 0, 1),
        ]
    );
    let s = ledger.stats();
    assert_eq!((s.committed, s.skipped, s.fenced), (5, 1, 3));
}

/// How one delivery of the old owner ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Committed,
    Fenced,
    /// Another retryable failure (SQLite's busy timeout under contention).
    Other,
}

/// Sets the flag when dropped: the new owner is done, also when it panicked.
struct Done<'a>(&'a AtomicBool);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Two owners of partition 7 race on two connections: the old one (term 1) delivers
/// until it is fenced, the new one (term 2) joins after the old one's first commits. No
/// term-1 effect may commit after the first term-2 commit: every term-2 transaction
/// counts the term-1 effects it sees (after the fence row, it holds the partition), and
/// each count must equal the final one. The term-1 handler pauses inside its
/// transaction to widen the window a missing lock would leave. A delivery that fails
/// otherwise (a lock wait timing out) is retried, as a subscription would.
fn racing_terms(
    old: &(dyn Subject + Sync),
    new: &(dyn Subject + Sync),
    term1_effects: &dyn Fn() -> i64,
    term2_seen: &dyn Fn() -> Vec<i64>,
) {
    const NEW_MESSAGES: usize = 40;
    let old_committed = AtomicU64::new(0);
    let new_done = AtomicBool::new(false);
    let outcomes = std::thread::scope(|s| {
        let old_thread = s.spawn(|| {
            let mut outcomes = Vec::new();
            let mut fenced = 0;
            // Until fenced five times, or the new owner gave up.
            while fenced < 5 && !(new_done.load(Ordering::SeqCst) && fenced == 0) {
                let outcome = match old.deliver(&message(Some((7, 1)))) {
                    Ok(()) => {
                        old_committed.fetch_add(1, Ordering::SeqCst);
                        Outcome::Committed
                    }
                    Err(_) if old.last_failure().is_some_and(|f| f.is_fenced()) => {
                        fenced += 1;
                        Outcome::Fenced
                    }
                    Err(_) => Outcome::Other,
                };
                outcomes.push(outcome);
                // Outside the transaction: let the other connection in.
                std::thread::sleep(Duration::from_micros(500));
            }
            outcomes
        });
        let new_thread = s.spawn(|| {
            let _done = Done(&new_done);
            while old_committed.load(Ordering::SeqCst) < 5 {
                std::thread::sleep(Duration::from_millis(1));
            }
            for _ in 0..NEW_MESSAGES {
                let m = message(Some((7, 2)));
                let mut attempts = 0;
                while let Err(e) = new.deliver(&m) {
                    attempts += 1;
                    assert!(
                        attempts < 100 && !new.last_failure().is_some_and(|f| f.is_fenced()),
                        "the new owner: {e:?}"
                    );
                }
            }
        });
        new_thread.join().unwrap();
        old_thread.join().unwrap()
    });
    let count = |o: Outcome| outcomes.iter().filter(|x| **x == o).count();
    let committed = count(Outcome::Committed);
    let first_fenced = outcomes
        .iter()
        .position(|o| *o == Outcome::Fenced)
        .expect("the old owner was fenced");
    assert!(
        !outcomes[first_fenced..].contains(&Outcome::Committed),
        "once fenced, the old owner stays fenced: {outcomes:?}"
    );
    let s = old.stats();
    assert_eq!(s.committed as usize, committed);
    assert_eq!(s.fenced as usize, count(Outcome::Fenced));
    assert_eq!(term1_effects(), committed as i64);
    let seen = term2_seen();
    assert_eq!(seen.len(), NEW_MESSAGES);
    assert!(
        seen.iter().all(|n| *n == committed as i64),
        "a term-1 effect committed after a term-2 commit: term-2 transactions saw {seen:?} \
         term-1 effects, {committed} committed in all"
    );
    eprintln!(
        "racing terms: the old owner committed {committed}, was fenced {} times, failed \
         otherwise {} times; the new owner committed {NEW_MESSAGES} (failed {} times)",
        s.fenced,
        count(Outcome::Other),
        new.stats().failed,
    );
}

mod sqlite {
    use std::path::{Path, PathBuf};

    use super::*;

    struct Db(PathBuf);

    fn open(path: &Path) -> rusqlite::Connection {
        let conn = rusqlite::Connection::open(path).unwrap();
        conn.busy_timeout(Duration::from_secs(30)).unwrap();
        conn
    }

    fn strings(conn: &rusqlite::Connection, sql: &str) -> Vec<String> {
        let mut stmt = conn.prepare(sql).unwrap();
        stmt.query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    impl Tables for Db {
        fn effects(&self) -> Vec<String> {
            strings(&open(&self.0), "SELECT id FROM effects ORDER BY seq")
        }
        fn recorded(&self, consumer: &str) -> Vec<String> {
            strings(
                &open(&self.0),
                &format!(
                    "SELECT message_id FROM {TABLE} WHERE consumer = '{consumer}' \
                     ORDER BY message_id"
                ),
            )
        }
        fn fences(&self) -> Vec<(String, i64, i64)> {
            let conn = open(&self.0);
            let mut stmt = conn
                .prepare(&format!(
                    "SELECT consumer, key_partition, term FROM {TABLE}_fence ORDER BY 1, 2"
                ))
                .unwrap();
            stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap()
        }
    }

    fn effect(tx: &mut SqliteTx<'_>, m: &Message) -> Result<(), HandlerError> {
        tx.execute(
            "INSERT INTO effects (id) VALUES (?1)",
            &[m.id().to_string().into()],
        )?;
        Ok(())
    }

    // R-DIST-8, R-DEL-7
    #[test]
    fn stale_terms_are_refused_inside_the_transaction() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("effects.db");
        open(&path)
            .execute_batch("CREATE TABLE effects (seq INTEGER PRIMARY KEY, id TEXT NOT NULL)")
            .unwrap();
        let runs = Arc::new(AtomicU32::new(0));
        let r = runs.clone();
        let ledger = Transactional::sqlite(&path, TABLE, "ledger", move |tx, m: &Message| {
            r.fetch_add(1, Ordering::SeqCst);
            effect(tx, m)
        })
        .unwrap();
        let other = Transactional::sqlite(&path, TABLE, "other", effect).unwrap();
        stale_terms_are_refused(&ledger, &other, &runs, &Db(path));
    }

    // R-DIST-8: two connections (two owners) racing terms serialise on the write lock
    // (`BEGIN IMMEDIATE`).
    #[test]
    fn racing_terms_never_commit_a_stale_effect_after_the_new_owners() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("effects.db");
        open(&path)
            .execute_batch(
                "CREATE TABLE effects (seq INTEGER PRIMARY KEY, term INTEGER NOT NULL, \
                 seen_term1 INTEGER)",
            )
            .unwrap();
        let old = Transactional::sqlite(&path, TABLE, "ledger", |tx, _m: &Message| {
            tx.execute("INSERT INTO effects (term) VALUES (1)", &[])?;
            std::thread::sleep(Duration::from_millis(1));
            Ok(())
        })
        .unwrap();
        let new = Transactional::sqlite(&path, TABLE, "ledger", |tx, _m: &Message| {
            tx.execute(
                "INSERT INTO effects (term, seen_term1) \
                 VALUES (2, (SELECT count(*) FROM effects WHERE term = 1))",
                &[],
            )?;
            Ok(())
        })
        .unwrap();
        let read = |sql: &str| -> Vec<i64> {
            let conn = open(&path);
            let mut stmt = conn.prepare(sql).unwrap();
            stmt.query_map([], |r| r.get(0))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap()
        };
        racing_terms(
            &old,
            &new,
            &|| read("SELECT count(*) FROM effects WHERE term = 1")[0],
            &|| read("SELECT seen_term1 FROM effects WHERE term = 2 ORDER BY seq"),
        );
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use tidings_sql::{AsyncPgTx, PgTx};
    use tidings_testkit::postgres::PostgresServer;

    use super::*;

    struct Db(String);

    fn client(conn: &str) -> ::postgres::Client {
        ::postgres::Client::connect(conn, ::postgres::NoTls).unwrap()
    }

    impl Tables for Db {
        fn effects(&self) -> Vec<String> {
            client(&self.0)
                .query("SELECT id FROM effects ORDER BY seq", &[])
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect()
        }
        fn recorded(&self, consumer: &str) -> Vec<String> {
            client(&self.0)
                .query(
                    &format!(
                        "SELECT message_id FROM {TABLE} WHERE consumer = $1 \
                         ORDER BY message_id"
                    ),
                    &[&consumer],
                )
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect()
        }
        fn fences(&self) -> Vec<(String, i64, i64)> {
            client(&self.0)
                .query(
                    &format!(
                        "SELECT consumer, key_partition, term FROM {TABLE}_fence ORDER BY 1, 2"
                    ),
                    &[],
                )
                .unwrap()
                .iter()
                .map(|r| (r.get(0), r.get(1), r.get(2)))
                .collect()
        }
    }

    fn effect(tx: &mut PgTx<'_>, m: &Message) -> Result<(), HandlerError> {
        tx.execute(
            "INSERT INTO effects (id) VALUES ($1)",
            &[m.id().to_string().into()],
        )?;
        Ok(())
    }

    async fn async_effect(tx: AsyncPgTx, m: Arc<Message>) -> Result<(), HandlerError> {
        tx.execute(
            "INSERT INTO effects (id) VALUES ($1)",
            &[m.id().to_string().into()],
        )
        .await?;
        Ok(())
    }

    // R-DIST-8, R-DEL-7
    #[test]
    fn stale_terms_are_refused_inside_the_transaction() {
        let Some(server) = PostgresServer::for_test() else {
            return;
        };
        let conn = server.conn_string();
        client(&conn)
            .batch_execute("CREATE TABLE effects (seq bigserial PRIMARY KEY, id text NOT NULL)")
            .unwrap();
        let runs = Arc::new(AtomicU32::new(0));
        let r = runs.clone();
        let ledger = Transactional::postgres(&conn, TABLE, "ledger", move |tx, m: &Message| {
            r.fetch_add(1, Ordering::SeqCst);
            effect(tx, m)
        })
        .unwrap();
        let other = Transactional::postgres(&conn, TABLE, "other", effect).unwrap();
        stale_terms_are_refused(&ledger, &other, &runs, &Db(conn.clone()));

        // The async handler: the same fence table, the same refusal.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let async_ledger = rt
            .block_on(Transactional::postgres_async(
                &conn,
                TABLE,
                "ledger",
                async_effect,
            ))
            .unwrap();
        let deliver =
            |m: Message| rt.block_on(tidings::AsyncHandler::handle(&async_ledger, Arc::new(m)));
        let e = deliver(message(Some((0, 2)))).unwrap_err();
        assert!(e.message().starts_with("tidings-sql: fenced:"), "{e:?}");
        assert!(matches!(
            async_ledger.last_failure(),
            Some(DeliveryError::Fenced {
                partition: 0,
                term: 2,
                recorded: 3
            })
        ));
        let fresh = message(Some((0, 4)));
        assert_eq!(deliver(fresh.clone()), Ok(()));
        assert_eq!(
            (async_ledger.stats().committed, async_ledger.stats().fenced),
            (1, 1)
        );
        assert!(Db(conn.clone()).effects().contains(&fresh.id().to_string()));
        assert!(ledger.deliver(&message(Some((0, 3)))).is_err());
    }

    // R-DIST-8: two connections racing terms serialise on the fence row's lock (the
    // upsert's `ON CONFLICT DO UPDATE`).
    #[test]
    fn racing_terms_never_commit_a_stale_effect_after_the_new_owners() {
        let Some(server) = PostgresServer::for_test() else {
            return;
        };
        let conn = server.conn_string();
        client(&conn)
            .batch_execute(
                "CREATE TABLE effects (seq bigserial PRIMARY KEY, term bigint NOT NULL, \
                 seen_term1 bigint)",
            )
            .unwrap();
        let old = Transactional::postgres(&conn, TABLE, "ledger", |tx, _m: &Message| {
            tx.execute("INSERT INTO effects (term) VALUES (1)", &[])?;
            std::thread::sleep(Duration::from_millis(10));
            Ok(())
        })
        .unwrap();
        let new = Transactional::postgres(&conn, TABLE, "ledger", |tx, _m: &Message| {
            tx.execute(
                "INSERT INTO effects (term, seen_term1) \
                 VALUES (2, (SELECT count(*) FROM effects WHERE term = 1))",
                &[],
            )?;
            Ok(())
        })
        .unwrap();
        let read = |sql: &str| -> Vec<i64> {
            client(&conn)
                .query(sql, &[])
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect()
        };
        racing_terms(
            &old,
            &new,
            &|| read("SELECT count(*) FROM effects WHERE term = 1")[0],
            &|| read("SELECT seen_term1 FROM effects WHERE term = 2 ORDER BY seq"),
        );
    }
}
