//! The transactional idempotent consumer on PostgreSQL (R-DEL-7): blocking and async, its
//! failures (R-DEL-1) and its bad input, against a real server the testkit starts (a
//! throwaway cluster on 127.0.0.1). `TIDINGS_SKIP_POSTGRES=1` skips with a notice.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime};

use tidings::{
    AnyHandler, Broker, Driver, Handler, HandlerError, Message, MessageId, Retry, SubscribeOptions,
};
use tidings_sql::{AsyncPgTx, DeliveryError, OpenError, PgTx, QueryError, Transactional, Value};
use tidings_testkit::postgres::PostgresServer;

const TABLE: &str = "processed_messages";

fn client(server: &PostgresServer) -> postgres::Client {
    postgres::Client::connect(&server.conn_string(), postgres::NoTls).unwrap()
}

fn create_accounts(server: &PostgresServer) {
    client(server)
        .batch_execute(
            "CREATE TABLE accounts (id text PRIMARY KEY, balance bigint NOT NULL);
             INSERT INTO accounts VALUES ('alice', 0), ('bob', 0);",
        )
        .unwrap();
}

fn balance(server: &PostgresServer, account: &str) -> i64 {
    client(server)
        .query_one("SELECT balance FROM accounts WHERE id = $1", &[&account])
        .unwrap()
        .get(0)
}

fn recorded(server: &PostgresServer, table: &str) -> Vec<String> {
    client(server)
        .query(
            &format!("SELECT message_id FROM {table} ORDER BY message_id"),
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

fn payment(account: &str, amount: i64) -> Message {
    Message::to(format!("payments.{account}"))
        .payload(format!("{account}:{amount}"))
        .build_detached()
        .unwrap()
}

fn parse(m: &Message) -> Result<(String, i64), HandlerError> {
    let text = std::str::from_utf8(m.payload())?;
    let (account, amount) = text.split_once(':').unwrap_or(("?", "0"));
    Ok((account.to_owned(), amount.parse()?))
}

fn add(tx: &mut PgTx<'_>, m: &Message) -> Result<(), HandlerError> {
    let (account, amount) = parse(m)?;
    tx.execute(
        "UPDATE accounts SET balance = balance + $1 WHERE id = $2",
        &[amount.into(), account.into()],
    )?;
    Ok(())
}

fn republish(m: &Message) -> tidings::MessageBuilder {
    Message::to(m.topic().as_str())
        .id(m.id())
        .payload(m.payload().clone())
}

fn retrying(attempts: u32) -> SubscribeOptions {
    SubscribeOptions::new().retry(Retry::fixed(Duration::ZERO, attempts))
}

// R-DEL-7, R-DEL-1: the blocking handler.
#[test]
fn blocking_handler_commits_once_and_rolls_back_failures() {
    let Some(server) = PostgresServer::for_test() else {
        return;
    };
    create_accounts(&server);
    let conn = server.conn_string();

    // Commit, then skip the redelivery.
    let ledger = Transactional::postgres(&conn, TABLE, "ledger", add).unwrap();
    let m = payment("alice", 30);
    assert_eq!(ledger.handle(&m), Ok(()));
    assert_eq!(ledger.handle(&m), Ok(()));
    assert_eq!(balance(&server, "alice"), 30);
    assert_eq!(recorded(&server, TABLE), vec![m.id().to_string()]);
    let s = ledger.stats();
    assert_eq!((s.committed, s.skipped), (1, 1));
    // Another handler on the same table (another process) skips it too.
    let other = Transactional::postgres(&conn, TABLE, "ledger", add).unwrap();
    assert_eq!(other.handle(&m), Ok(()));
    assert_eq!(other.stats().skipped, 1);

    // R-DEL-1: an error, then a panic, each rolled back; the third attempt commits.
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let flaky = Transactional::postgres(&conn, TABLE, "ledger", move |tx, m: &Message| {
        add(tx, m)?;
        match c.fetch_add(1, Ordering::SeqCst) {
            0 => Err(HandlerError::retry("not yet")),
            1 => panic!("boom"),
            _ => Ok(()),
        }
    })
    .unwrap();
    let broker = Broker::builder().driver(Driver::Manual).build().unwrap();
    let sub = broker
        .subscribe(
            "payments.#",
            retrying(5),
            AnyHandler::from_sync(flaky.clone()),
        )
        .unwrap();
    let m2 = payment("bob", 4);
    broker.publish(republish(&m2)).unwrap();
    broker.run_until_idle();
    assert_eq!(sub.stats().delivered, 1);
    assert_eq!(sub.stats().failures, 2);
    assert_eq!(
        balance(&server, "bob"),
        4,
        "the failed attempts left nothing"
    );
    assert_eq!(recorded(&server, TABLE).len(), 2);
    assert_eq!(flaky.stats().rolled_back, 2);
    assert!(matches!(
        flaky.last_failure(),
        Some(DeliveryError::Panicked { message }) if message == "boom"
    ));

    // A failed statement aborts the transaction: swallowing it and returning Ok does
    // not commit (and is not acknowledged).
    let swallow = Transactional::postgres(&conn, TABLE, "ledger", |tx, m: &Message| {
        add(tx, m)?;
        let e = tx
            .execute("INSERT INTO nowhere VALUES (1)", &[])
            .unwrap_err();
        assert!(e.to_string().contains("nowhere"), "{e}");
        assert!(matches!(
            tx.execute("SELECT 1", &[]),
            Err(QueryError::Aborted)
        ));
        Ok(())
    })
    .unwrap();
    let m3 = payment("alice", 1000);
    let e = swallow.handle(&m3).unwrap_err();
    assert!(e.is_retryable());
    assert!(matches!(
        swallow.last_failure(),
        Some(DeliveryError::Aborted)
    ));
    assert_eq!(balance(&server, "alice"), 30);
    assert_eq!(recorded(&server, TABLE).len(), 2);

    // Rows and values.
    let query = Transactional::postgres(&conn, TABLE, "ledger", |tx, _m: &Message| {
        let row = tx
            .query_opt(
                "SELECT id, balance, NULL::int4, 1.5::float8, '\\x0102'::bytea, true, \
                 42::int4, now() FROM accounts WHERE id = $1",
                &["bob".into()],
            )
            .map(|_| ());
        assert!(
            matches!(row, Err(QueryError::UnsupportedType { ref column, .. }) if column == "now"),
            "{row:?}"
        );
        Ok(())
    })
    .unwrap();
    // That handler returned Ok after a refused result: it is not a failed statement.
    query.handle(&payment("bob", 0)).unwrap();
    let values = Transactional::postgres(&conn, TABLE, "ledger", |tx, _m: &Message| {
        let row = tx
            .query_opt(
                "SELECT id, balance, NULL::int4, 1.5::float8, '\\x0102'::bytea, true, \
                 $2::int4 FROM accounts WHERE id = $1",
                &["bob".into(), 42.into()],
            )?
            .expect("a row");
        assert_eq!(
            row.values(),
            &[
                Value::Text("bob".into()),
                Value::Integer(4),
                Value::Null,
                Value::Real(1.5),
                Value::Blob(vec![1, 2]),
                Value::Bool(true),
                Value::Integer(42),
            ]
        );
        // A parameter of the wrong type is a statement error, not a panic.
        assert!(tx.execute("SELECT $1::int4", &["x".into()]).is_err());
        Ok(())
    })
    .unwrap();
    let e = values.handle(&payment("bob", 0)).unwrap_err();
    assert!(
        matches!(values.last_failure(), Some(DeliveryError::Aborted)),
        "{e:?}"
    );

    // Where it stops: pruning forgets ids.
    let n = ledger
        .prune_before(SystemTime::now() + Duration::from_secs(1))
        .unwrap();
    assert!(n >= 2, "{n}");
    ledger.handle(&m).unwrap();
    assert_eq!(
        balance(&server, "alice"),
        60,
        "a pruned id is processed again"
    );
}

// R-DEL-7: bad input at start.
#[test]
fn bad_input_is_refused_at_start() {
    let Some(server) = PostgresServer::for_test() else {
        return;
    };
    let conn = server.conn_string();
    client(&server)
        .batch_execute(
            "CREATE TABLE seen (id serial PRIMARY KEY, payload text);
             INSERT INTO seen (payload) VALUES ('keep me');
             CREATE TABLE typed (message_id uuid PRIMARY KEY, processed_at bigint NOT NULL);
             CREATE VIEW done AS SELECT 'x'::text AS message_id, 0::bigint AS processed_at;",
        )
        .unwrap();
    let e = Transactional::postgres(&conn, "seen", "ledger", add).unwrap_err();
    assert!(
        matches!(&e, OpenError::TableShape { table, .. } if table == "seen"),
        "{e:?}"
    );
    let text = e.to_string();
    assert!(text.contains("`seen`"), "{text}");
    assert!(text.contains("column message_id is missing"), "{text}");
    let kept: String = client(&server)
        .query_one("SELECT payload FROM seen", &[])
        .unwrap()
        .get(0);
    assert_eq!(kept, "keep me");
    let e = Transactional::postgres(&conn, "typed", "ledger", add).unwrap_err();
    assert!(
        e.to_string().contains("message_id has type uuid, not text"),
        "{e}"
    );
    let e = Transactional::postgres(&conn, "done", "ledger", add).unwrap_err();
    assert!(e.to_string().contains("it is a view, not a table"), "{e}");

    assert!(matches!(
        Transactional::postgres(&conn, "x; DROP TABLE seen", "ledger", add),
        Err(OpenError::InvalidTableName { .. })
    ));
    assert!(matches!(
        Transactional::postgres("host=127.0.0.1 port=notaport", TABLE, "ledger", add),
        Err(OpenError::InvalidConfig { .. })
    ));
    // A port nobody listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let e = Transactional::postgres(
        &format!("host=127.0.0.1 port={port} user=tidings connect_timeout=2"),
        TABLE,
        "ledger",
        add,
    )
    .unwrap_err();
    assert!(matches!(e, OpenError::Unavailable { .. }), "{e:?}");
    // The async constructor refuses the same way.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let e = rt
        .block_on(Transactional::postgres_async(
            &conn, "seen", "ledger", async_add,
        ))
        .unwrap_err();
    assert!(matches!(e, OpenError::TableShape { .. }), "{e:?}");
}

async fn async_add(tx: AsyncPgTx, m: Arc<Message>) -> Result<(), HandlerError> {
    let (account, amount) = parse(&m)?;
    tx.execute(
        "UPDATE accounts SET balance = balance + $1 WHERE id = $2",
        &[amount.into(), account.into()],
    )
    .await?;
    Ok(())
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

// R-DEL-7, R-DEL-1, R-EXE-3: the async handler under the tokio driver.
#[test]
fn async_handler_under_the_tokio_driver() {
    let Some(server) = PostgresServer::for_test() else {
        return;
    };
    create_accounts(&server);
    let conn = server.conn_string();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let broker = Broker::builder()
        .driver(Driver::Tokio(rt.handle().clone()))
        .build()
        .unwrap();
    let ledger = rt
        .block_on(Transactional::postgres_async(
            &conn, TABLE, "ledger", async_add,
        ))
        .unwrap();
    let _sub = broker
        .subscribe("payments.#", SubscribeOptions::default(), ledger.clone())
        .unwrap();
    let ids: Vec<MessageId> = (0..20).map(|_| MessageId::new()).collect();
    for id in ids.iter().chain(&ids[..5]) {
        broker
            .publish(Message::to("payments.bob").id(*id).payload("bob:2"))
            .unwrap();
    }
    wait_until("25 deliveries", || {
        let s = ledger.stats();
        s.committed + s.skipped == 25
    });
    assert_eq!(ledger.stats().committed, 20);
    assert_eq!(ledger.stats().skipped, 5);
    assert_eq!(balance(&server, "bob"), 40);

    // R-DEL-1: an error, then a panic inside the future, each rolled back; a handle kept
    // past the handler's end is dead.
    let calls = Arc::new(AtomicU32::new(0));
    let kept: Arc<std::sync::Mutex<Option<AsyncPgTx>>> = Arc::default();
    let (c, k) = (calls.clone(), kept.clone());
    let flaky = rt
        .block_on(Transactional::postgres_async(
            &conn,
            "processed_flaky",
            "ledger",
            move |tx: AsyncPgTx, m: Arc<Message>| {
                let n = c.fetch_add(1, Ordering::SeqCst);
                *k.lock().unwrap() = Some(tx.clone());
                async move {
                    async_add(tx, m).await?;
                    match n {
                        0 => Err(HandlerError::retry("not yet")),
                        1 => panic!("async boom"),
                        _ => Ok(()),
                    }
                }
            },
        ))
        .unwrap();
    let sub = broker
        .subscribe("retry.#", retrying(5), flaky.clone())
        .unwrap();
    broker
        .publish(Message::to("retry.alice").payload("alice:5"))
        .unwrap();
    wait_until("the third attempt", || flaky.stats().committed == 1);
    assert_eq!(flaky.stats().rolled_back, 2);
    assert_eq!(sub.stats().failures, 2);
    assert_eq!(balance(&server, "alice"), 5);
    assert_eq!(recorded(&server, "processed_flaky").len(), 1);
    let stale = kept.lock().unwrap().take().unwrap();
    let r = rt.block_on(stale.execute("UPDATE accounts SET balance = 0", &[]));
    assert!(matches!(r, Err(QueryError::Finished)), "{r:?}");
    assert_eq!(balance(&server, "alice"), 5);
    broker.close(Duration::from_secs(5));
}

// R-DEL-1, R-DEL-7: the server goes away under running handlers (blocking and async):
// typed, retryable errors, never an acknowledgement; after it is back, the retry commits.
#[test]
fn a_stopped_server_is_retried_never_acknowledged() {
    let Some(mut server) = PostgresServer::for_test() else {
        return;
    };
    create_accounts(&server);
    let conn = server.conn_string();
    let ledger = Transactional::postgres(&conn, TABLE, "ledger", add).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let async_ledger = rt
        .block_on(Transactional::postgres_async(
            &conn,
            "processed_async",
            "ledger",
            async_add,
        ))
        .unwrap();
    server.stop().unwrap();

    let m = payment("alice", 9);
    let e = ledger.handle(&m).unwrap_err();
    assert!(e.is_retryable(), "{e:?}");
    let failure = ledger.last_failure().unwrap();
    assert!(failure.is_database(), "{failure:?}");
    // Again: reconnecting fails too, as `Unavailable`.
    ledger.handle(&m).unwrap_err();
    assert!(
        matches!(
            ledger.last_failure(),
            Some(DeliveryError::Unavailable { .. })
        ),
        "{:?}",
        ledger.last_failure()
    );
    let am = Arc::new(payment("bob", 3));
    let e = rt
        .block_on(tidings::AsyncHandler::handle(&async_ledger, am.clone()))
        .unwrap_err();
    assert!(e.is_retryable(), "{e:?}");
    assert!(async_ledger.last_failure().unwrap().is_database());

    // Through a subscription: retried, dead-lettered, never delivered.
    let broker = Broker::builder().driver(Driver::Manual).build().unwrap();
    let sub = broker
        .subscribe(
            "payments.#",
            retrying(2),
            AnyHandler::from_sync(ledger.clone()),
        )
        .unwrap();
    broker.publish(republish(&m)).unwrap();
    broker.run_until_idle();
    assert_eq!(sub.stats().delivered, 0, "never acknowledged");
    assert_eq!(sub.stats().dead_lettered.retries_exhausted, 1);

    // The server is back: the re-driven message commits, once.
    server.restart().unwrap();
    assert_eq!(sub.redrive(|_| true).accepted, 1);
    broker.run_until_idle();
    assert_eq!(sub.stats().delivered, 1);
    assert_eq!(balance(&server, "alice"), 9);
    assert_eq!(recorded(&server, TABLE), vec![m.id().to_string()]);
    rt.block_on(tidings::AsyncHandler::handle(&async_ledger, am))
        .unwrap();
    assert_eq!(balance(&server, "bob"), 3);
    assert_eq!(async_ledger.stats().committed, 1);
}

// R-EXE-3, R-DEL-7, R-LOG-3: the async PostgreSQL recipe on a durable subscription (the
// embedded log, the tokio driver), where redelivery happens and the recipe is what stops
// it from applying an effect twice: every payment of a replay (a seek to the earliest) is
// skipped, the balance is unchanged, and after a restart the subscription resumes at its
// commit and applies only the new payment.
#[test]
fn async_handler_on_a_durable_subscription_applies_each_payment_once() {
    let Some(server) = PostgresServer::for_test() else {
        return;
    };
    create_accounts(&server);
    let conn = server.conn_string();
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let start = || {
        let broker = Broker::builder()
            .driver(Driver::Tokio(rt.handle().clone()))
            .data_dir(dir.path())
            .build()
            .unwrap();
        broker
            .create_stream(tidings::StreamConfig::new("payments", ["payments.#"]))
            .unwrap();
        broker
    };
    let ledger = rt
        .block_on(Transactional::postgres_async(
            &conn, TABLE, "ledger", async_add,
        ))
        .unwrap();
    let spec = || tidings::DurableSpec::new("payments").name("ledger");
    let broker = start();
    for _ in 0..10 {
        broker
            .publish(Message::to("payments.bob").payload("bob:2"))
            .unwrap();
    }
    let sub = broker
        .subscribe(spec(), SubscribeOptions::default(), ledger.clone())
        .unwrap();
    wait_until("ten payments committed", || {
        ledger.stats().committed == 10 && sub.committed() == 10
    });
    assert_eq!(balance(&server, "bob"), 20);
    // A replay redelivers all ten: each is skipped, none applied twice (R-DEL-7).
    assert_eq!(sub.seek(tidings::StartAt::Earliest).unwrap(), 0);
    wait_until("the replay skipped", || {
        ledger.stats().skipped == 10 && sub.committed() == 10
    });
    assert_eq!(balance(&server, "bob"), 20);
    assert_eq!(recorded(&server, TABLE).len(), 10);
    drop(sub);
    assert!(broker.close(Duration::from_secs(10)).is_clean());
    drop(broker);

    // A restart resumes at the commit (R-LOG-3): only the new payment is applied.
    let broker = start();
    broker
        .publish(Message::to("payments.bob").payload("bob:5"))
        .unwrap();
    let sub = broker
        .subscribe(spec(), SubscribeOptions::default(), ledger.clone())
        .unwrap();
    wait_until("the new payment committed", || {
        ledger.stats().committed == 11 && sub.committed() == 11
    });
    assert_eq!(ledger.stats().skipped, 10);
    assert_eq!(balance(&server, "bob"), 25);
    assert!(sub.stats().is_conserved());
    drop(sub);
    assert!(broker.close(Duration::from_secs(10)).is_clean());
}
