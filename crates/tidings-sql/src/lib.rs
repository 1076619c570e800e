//! # tidings-sql
//!
//! The idempotent consumer of the seed, done with a database transaction (R-DEL-7):
//! [`Transactional`] wraps a handler closure that receives an **open transaction**;
//! tidings records the message id in a processed-messages table **in that transaction**,
//! under a unique constraint, and commits it together with the handler's own writes. A
//! redelivered message finds its id there and is skipped (acknowledged without running
//! the handler). Delivery stays at-least-once; the handler's database effects happen
//! exactly once.
//!
//! ```no_run
//! # #[cfg(feature = "sqlite")] {
//! use tidings::{AnyHandler, Broker, Message, SubscribeOptions};
//! use tidings_sql::Transactional;
//!
//! let ledger = Transactional::sqlite("ledger.db", "processed_messages", |tx, msg: &Message| {
//!     let amount: i64 = std::str::from_utf8(msg.payload())?.parse()?;
//!     tx.execute(
//!         "UPDATE accounts SET balance = balance + ?1 WHERE id = 'alice'",
//!         &[amount.into()],
//!     )?;
//!     Ok(())
//! })?;
//! let broker = Broker::builder().build()?;
//! // Sync here; with the `tokio` feature it is also an async handler, so say which.
//! let _sub = broker.subscribe("payments.#", SubscribeOptions::default(), AnyHandler::from_sync(ledger))?;
//! # }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Ordering
//! Per delivery, on one connection, in this order:
//! 1. `BEGIN` (SQLite: `BEGIN IMMEDIATE`, which takes the write lock at once);
//! 2. `INSERT INTO <table> (message_id, processed_at) VALUES (<id>, <now>) ON CONFLICT
//!    (message_id) DO NOTHING`;
//! 3. if that inserted no row, the id is recorded already: `ROLLBACK`, and the delivery is
//!    acknowledged and counted as a skip ([`TransactionalStats::skipped`]); the handler
//!    does not run;
//! 4. otherwise the handler runs with the transaction ([`SqliteTx`], [`PgTx`],
//!    [`AsyncPgTx`]);
//! 5. handler `Ok` → `COMMIT` → acknowledged; handler error or panic → `ROLLBACK` → the
//!    error goes to the subscription, which retries (R-DEL-1).
//!
//! Recording the id first means two deliveries of one id racing on two connections (two
//! processes, or lanes) serialise on the unique key: the second waits for the first to
//! commit (then skips) or roll back (then runs).
//!
//! # Atomicity
//! The id and every statement the handler runs through its transaction are committed
//! together or not at all. A crash (SIGKILL, power cut) before `COMMIT` completes leaves
//! neither; the message is redelivered (the subscription had not acknowledged it) and
//! runs again. A crash after `COMMIT` and before the acknowledgement leaves both; the
//! redelivery is skipped. `tests/kill_*.rs` prove it with 50 SIGKILLs per database.
//!
//! # Failure
//! Nothing here acknowledges a message whose effects were not committed:
//! * an unreachable or closed database, a failed `BEGIN`, insert or `COMMIT` →
//!   [`DeliveryError`] (kept in [`Transactional::last_failure`]), handed to the dispatcher
//!   as a **retryable** [`HandlerError`]; the connection is dropped and opened again on the
//!   next delivery. A `COMMIT` whose outcome is unknown is retried like the others: if it
//!   did commit, the retry is a skip.
//! * a handler error is rolled back and passed on unchanged (a
//!   [`HandlerError::reject`] still skips the retries); a panic is caught, rolled back and
//!   becomes a retryable error.
//! * PostgreSQL aborts a transaction at its first failed statement. A handler that
//!   swallows such an error and returns `Ok` gets [`DeliveryError::Aborted`]: rolled back,
//!   retried.
//! * at start, the table is created if absent; a table (or view) of that name with
//!   another shape is refused with [`OpenError::TableShape`], naming it and what is wrong;
//!   a table name that is not a plain identifier is refused ([`TableName`]).
//!
//! # Where it stops
//! * Only writes made **through the transaction handed to the handler**, in **the same
//!   database** as the processed-messages table, are exactly-once. An e-mail sent, an
//!   HTTP call made or a message published from the handler happens again on a retry;
//!   publish with ids derived from the input ([`tidings::MessageId::derived`]) so a
//!   durable stream drops the repeats.
//! * The handler must not end the transaction itself (`COMMIT`, `ROLLBACK` statements):
//!   what it writes afterwards would not be atomic with the id.
//! * Ids are remembered as long as they stay in the table. Pruning (below) reopens the
//!   window: a redelivery of a message older than the pruning horizon runs again.
//! * Ids are compared exactly: a publisher that republishes the same business event with
//!   a new id gets it processed twice. Let publishers choose ids
//!   ([`tidings::MessageBuilder::id`]).
//! * One connection per handler: deliveries through one `Transactional` run one at a
//!   time, also with keyed lanes. Build one per lane, or per process, to go parallel;
//!   the unique key keeps them correct.
//!
//! # Bounded growth
//! The table grows by one row per processed message. Delete old rows with
//! `prune_before(cutoff)` ([`Transactional::<Sqlite, _>::prune_before`] and the
//! PostgreSQL equivalents), e.g. daily with a cutoff a comfortable margin beyond the
//! longest time a message can still be redelivered (the stream's retention, the longest
//! retry schedule, the longest outage you plan for). A redelivery of a message whose id
//! was pruned runs its effects again.
//!
//! # Drivers
//! The SQLite and blocking PostgreSQL handlers implement [`tidings::Handler`] (for the
//! thread, pool and manual drivers, and durable subscriptions). Under the tokio driver use
//! [`Transactional::postgres_async`] (feature `postgres`, an async client), or subscribe
//! the SQLite / blocking PostgreSQL handler with `subscribe_async` (features `tokio` /
//! `postgres`): it then runs on tokio's blocking pool, never on a runtime worker.
//!
//! # Features
//! Each item that needs one says so on its page.
//! - `sqlite` (default): [`Transactional::sqlite`], [`Sqlite`], [`SqliteTx`]; pulls in
//!   `rusqlite` with SQLite **bundled** (its C source is compiled into your build: a C
//!   compiler is needed, no system library is).
//! - `postgres`: PostgreSQL through rust-postgres, blocking ([`Transactional::postgres`],
//!   [`PgTx`]) and async ([`Transactional::postgres_async`], [`AsyncPgTx`]); pulls in
//!   `postgres`, `tokio-postgres`, `tokio` (rt, sync), `futures-util`, `bytes`, and turns
//!   on `tidings/tokio`.
//! - `tokio`: the SQLite handler as an async handler, run on tokio's blocking pool; pulls
//!   in `tokio` (rt, sync) and turns on `tidings/tokio`.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use tidings::HandlerError;

mod error;
#[cfg(feature = "postgres")]
mod pg;
#[cfg(feature = "sqlite")]
mod sqlite;
mod table;
mod value;

pub use error::{
    ColumnError, DbError, DeliveryError, OpenError, PruneError, QueryError, TableNameError,
};
#[cfg(feature = "postgres")]
pub use pg::{AsyncPgTx, DEFAULT_CONNECT_TIMEOUT, PgTx, Postgres, PostgresAsync};
#[cfg(feature = "sqlite")]
pub use sqlite::{BUSY_TIMEOUT, Sqlite, SqliteTx};
pub use table::{MAX_TABLE_NAME_LEN, TableName};
pub use value::{Row, Value};

/// A handler that runs in a database transaction recording the message id (R-DEL-7).
///
/// `D` is the database ([`Sqlite`], [`Postgres`], [`PostgresAsync`]); `F` the user's
/// closure. Build one with [`Transactional::sqlite`], [`Transactional::postgres`] or
/// [`Transactional::postgres_async`]; subscribe it like any handler. The contract
/// (ordering, atomicity, failure, where it stops) is in the [crate docs](crate).
///
/// Cloning is cheap and shares the connection and the counters.
pub struct Transactional<D, F> {
    inner: Arc<Inner<D, F>>,
}

impl<D, F> Clone for Transactional<D, F> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

pub(crate) struct Inner<D, F> {
    pub(crate) db: D,
    pub(crate) table: TableName,
    pub(crate) handler: F,
    counters: Counters,
}

#[derive(Default)]
struct Counters {
    committed: AtomicU64,
    skipped: AtomicU64,
    rolled_back: AtomicU64,
    failed: AtomicU64,
    last: Mutex<Option<DeliveryError>>,
}

/// What a [`Transactional`] handler did so far (since it was built; shared by clones).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TransactionalStats {
    /// Deliveries whose transaction committed (the id recorded with the handler's writes).
    pub committed: u64,
    /// Deliveries skipped because the id was recorded already (duplicates, acknowledged).
    pub skipped: u64,
    /// Deliveries rolled back because the handler failed or panicked (or swallowed a
    /// failed statement on PostgreSQL).
    pub rolled_back: u64,
    /// Deliveries that failed in the database (unavailable, begin, record, commit).
    pub failed: u64,
}

/// How a delivery ended when it ended well.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    Committed,
    Skipped,
}

impl<D, F> Transactional<D, F> {
    pub(crate) fn from_parts(db: D, table: TableName, handler: F) -> Self {
        Self {
            inner: Arc::new(Inner {
                db,
                table,
                handler,
                counters: Counters::default(),
            }),
        }
    }

    /// The counters: committed, skipped (duplicates), rolled back, failed.
    #[must_use]
    pub fn stats(&self) -> TransactionalStats {
        let c = &self.inner.counters;
        TransactionalStats {
            committed: c.committed.load(Ordering::Relaxed),
            skipped: c.skipped.load(Ordering::Relaxed),
            rolled_back: c.rolled_back.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
        }
    }

    /// The last delivery that was not acknowledged, and why.
    #[must_use]
    pub fn last_failure(&self) -> Option<DeliveryError> {
        self.inner.counters.last.lock().clone()
    }

    /// The processed-messages table.
    #[must_use]
    pub fn table(&self) -> &TableName {
        &self.inner.table
    }
}

impl<D, F> fmt::Debug for Transactional<D, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transactional")
            .field("database", &std::any::type_name::<D>())
            .field("table", &self.inner.table)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl<D, F> Inner<D, F> {
    /// Counts the outcome and turns it into what the dispatcher acts on.
    pub(crate) fn finish(&self, r: Result<Settled, DeliveryError>) -> Result<(), HandlerError> {
        let c = &self.counters;
        match r {
            Ok(Settled::Committed) => {
                c.committed.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Ok(Settled::Skipped) => {
                c.skipped.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                let counter = if e.is_database() {
                    &c.failed
                } else {
                    &c.rolled_back
                };
                counter.fetch_add(1, Ordering::Relaxed);
                *c.last.lock() = Some(e.clone());
                Err(e.into_handler_error())
            }
        }
    }
}

/// Milliseconds since the UNIX epoch (0 before it), for `processed_at`.
pub(crate) fn millis(at: SystemTime) -> i64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The text of a caught panic.
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned())
}

/// The insert that records an id; `p1`, `p2` are the placeholders.
pub(crate) fn insert_sql(table: &TableName, p1: &str, p2: &str) -> String {
    format!(
        "INSERT INTO {} (message_id, processed_at) VALUES ({p1}, {p2}) \
         ON CONFLICT (message_id) DO NOTHING",
        table.quoted()
    )
}

/// The delete that prunes ids recorded before a cutoff.
pub(crate) fn prune_sql(table: &TableName, p1: &str) -> String {
    format!("DELETE FROM {} WHERE processed_at < {p1}", table.quoted())
}

/// Runs a blocking delivery on tokio's blocking pool (the async face of a blocking
/// handler).
#[cfg(any(feature = "tokio", feature = "postgres"))]
pub(crate) fn on_blocking_pool<D, F>(
    inner: Arc<Inner<D, F>>,
    message: Arc<tidings::Message>,
    deliver: fn(&Inner<D, F>, &tidings::Message) -> Result<Settled, DeliveryError>,
) -> tidings::HandlerFuture<'static>
where
    D: Send + Sync + 'static,
    F: Send + Sync + 'static,
{
    Box::pin(async move {
        let task = tokio::task::spawn_blocking(move || {
            let r = deliver(&inner, &message);
            inner.finish(r)
        });
        match task.await {
            Ok(r) => r,
            Err(e) => Err(HandlerError::retry(format!(
                "tidings-sql: the delivery on the blocking pool did not finish: {e}"
            ))),
        }
    })
}
