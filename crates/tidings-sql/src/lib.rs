//! # tidings-sql
//!
//! The idempotent consumer of the seed, done with a database transaction (R-DEL-7):
//! [`Transactional`] wraps a handler closure that receives an **open transaction**;
//! tidings records the message id in a processed-messages table **in that transaction**,
//! under a unique constraint on (consumer, message id), and commits it together with the
//! handler's own writes. A redelivered message finds its id there and is skipped
//! (acknowledged without running the handler). Delivery stays at-least-once; the
//! handler's database effects happen exactly once. On a keyed consumer group, the same
//! transaction refuses a delivery of an owner that lost its partition (fencing, R-DIST-8).
//!
//! ```no_run
//! # #[cfg(feature = "sqlite")] {
//! use tidings::{AnyHandler, Broker, Message, SubscribeOptions};
//! use tidings_sql::Transactional;
//!
//! // Table "processed_messages", consumer "ledger" (whose ids these are).
//! let ledger = Transactional::sqlite(
//!     "ledger.db",
//!     "processed_messages",
//!     "ledger",
//!     |tx, msg: &Message| {
//!         let amount: i64 = std::str::from_utf8(msg.payload())?.parse()?;
//!         tx.execute(
//!             "UPDATE accounts SET balance = balance + ?1 WHERE id = 'alice'",
//!             &[amount.into()],
//!         )?;
//!         Ok(())
//!     },
//! )?;
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
//! 2. only for a delivery carrying a [`tidings::Fence`] (keyed consumer groups): `INSERT
//!    INTO <table>_fence (consumer, key_partition, term) VALUES (<consumer>, <partition>,
//!    <term>) ON CONFLICT (consumer, key_partition) DO UPDATE SET term = greatest(old,
//!    new) RETURNING term`; a returned term greater than the delivery's means a newer
//!    owner of the partition has committed: `ROLLBACK`, [`DeliveryError::Fenced`]
//!    (counted in [`TransactionalStats::fenced`]); the handler does not run (see
//!    [Fencing](#fencing-r-dist-8));
//! 3. `INSERT INTO <table> (consumer, message_id, processed_at) VALUES (<consumer>, <id>,
//!    <now>) ON CONFLICT (consumer, message_id) DO NOTHING`;
//! 4. if that inserted no row, the id is recorded already: `ROLLBACK`, and the delivery is
//!    acknowledged and counted as a skip ([`TransactionalStats::skipped`]); the handler
//!    does not run;
//! 5. otherwise the handler runs with the transaction ([`SqliteTx`], [`PgTx`],
//!    [`AsyncPgTx`]);
//! 6. handler `Ok` → `COMMIT` → acknowledged; handler error or panic → `ROLLBACK` → the
//!    error goes to the subscription, which retries (R-DEL-1).
//!
//! Recording the id first means two deliveries of one id racing on two connections (two
//! processes, or lanes) serialise on the unique key: the second waits for the first to
//! commit (then skips) or roll back (then runs).
//!
//! # Consumers (R-DEL-7)
//! The ids recorded belong to one consumer: every constructor takes a consumer name
//! ([`ConsumerName`]), and the table's key is (consumer, message id). Two consumers
//! recording in one table each apply every message once; one consumer's id never makes
//! another skip. Name the consumer after the effects it applies — the durable
//! subscription's name is the natural choice — and give every process, lane and
//! `Transactional` that applies *the same* effects the same name (a redelivery to any of
//! them is then a skip); handlers applying different effects get different names.
//! Pruning deletes only the handler's own consumer's ids.
//!
//! ## A table from before consumers
//! A processed-messages table of the earlier shape (`message_id` alone as the key) is
//! refused at start with [`OpenError::UnattributedTable`], which names the table and holds
//! the migration SQL for the database at hand; nothing is changed. The table cannot say
//! which consumer recorded which row, so tidings does not guess:
//! * if one consumer recorded into it (the usual case), run the migration as given: in one
//!   transaction it renames the table to `<table>_old`, creates the new table, copies
//!   every row attributed to the named consumer, and drops `<table>_old`;
//! * if several consumers shared it, each row's owner is unknown: run the migration's
//!   `INSERT ... SELECT` once per consumer (before the `DROP`). Every consumer then keeps
//!   treating every old id as processed — exactly what it did before, so no message is
//!   applied twice; a message one consumer skipped because another had recorded it stays
//!   skipped for it (that loss happened before the migration; replay it by hand if it
//!   matters).
//!
//! # Fencing (R-DIST-8)
//! A keyed consumer group hands each delivery out with a [`tidings::Fence`]: its key
//! partition and the owner's lease term, which only grows from owner to owner. Inside the
//! delivery's own transaction, before the handler runs, tidings records the greatest term
//! seen per (consumer, partition) in the fence table `<table>_fence` (created beside the
//! processed-messages table; hence table names of at most [`MAX_TABLE_NAME_LEN`] bytes)
//! and refuses a delivery whose term is lower: rolled back, nothing committed,
//! [`DeliveryError::Fenced`], counted in [`TransactionalStats::fenced`]. On PostgreSQL the
//! upsert locks the partition's fence row until the transaction ends; on SQLite
//! `BEGIN IMMEDIATE` serialises every transaction. So of two owners of one partition,
//! the stale one's transaction either commits **before** the new owner's first commit in
//! that partition (it held the row first; the new owner waited for it) or is refused.
//!
//! What that guarantees, precisely: **once the new owner has committed an effect in a
//! partition, no effect of an older owner of that partition commits** — no second
//! application of a message the new owner applied, none out of key order after the new
//! owner's first commit. What remains:
//! * **Before the new owner's first commit**, a stale owner's running handler (the "one
//!   overlap" a pause or network loss leaves, see docs/design.md) may still commit. Its
//!   effect is then the earlier one of its key; the new owner, which started from the
//!   unacknowledged position, finds its id and skips it. That is at-least-once delivery,
//!   not a double effect.
//! * **Effects outside the database** are not covered. The fence is checked when the
//!   transaction begins and the check holds until it ends, so a stale owner's handler is
//!   never *started* after the new owner's first commit in that partition; but what a
//!   handler does outside its transaction (an e-mail, an HTTP call, a message published)
//!   stays done when its transaction then rolls back or its commit is refused for another
//!   reason, and is done again on the retry, as for any handler (see "Where it stops").
//! * The fence row is raised by a committed transaction only: a new owner's delivery that
//!   is skipped (duplicate) or fails does not raise it.
//! * On PostgreSQL, deliveries of one partition through different connections of one
//!   consumer wait for each other on the fence row (partitions stay parallel).
//! * A fenced delivery is handed to the subscription as **retryable**. In a stale owner,
//!   the keyed group's start gate refuses the retry (its lease is gone: the message is
//!   released to the partition's new owner); a process that owns the partition again
//!   retries it under its new, greater term, which passes. Outside keyed groups there is
//!   no fence and nothing is refused.
//! * Terms are compared per consumer name: the consumer name must not be shared by two
//!   keyed groups. A keyed group deleted and created anew may restart its terms: delete
//!   its rows first (`DELETE FROM <table>_fence WHERE consumer = '<name>'`), or every
//!   delivery is refused as stale.
//!
//! # Atomicity
//! The id and every statement the handler runs through its transaction are committed
//! together or not at all. A crash (SIGKILL, power cut) before `COMMIT` completes leaves
//! neither; the message is redelivered (the subscription had not acknowledged it) and
//! runs again. A crash after `COMMIT` and before the acknowledgement leaves both; the
//! redelivery is skipped. `tests/kill_*.rs` prove it with 50 SIGKILLs per database, and
//! 80 for [`Transactional::postgres_async`] on a durable JetStream subscription.
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
//! * a delivery of a stale owner is rolled back before its handler runs:
//!   [`DeliveryError::Fenced`], retryable (see [Fencing](#fencing-r-dist-8)).
//! * at start, the processed-messages table and its fence table are created if absent; a
//!   table (or view) of either name with another shape is refused with
//!   [`OpenError::TableShape`], naming it and what is wrong; a processed-messages table
//!   of the shape before consumers with [`OpenError::UnattributedTable`] and its
//!   migration; a table name that is not a plain identifier ([`TableName`]) or a bad
//!   consumer name ([`ConsumerName`]) is refused, before anything is opened.
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
//! the SQLite / blocking PostgreSQL handler as an async one,
//! `subscribe(target, options, AnyHandler::from_async(handler))` (features `tokio` /
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

mod consumer;
mod error;
#[cfg(feature = "postgres")]
mod pg;
#[cfg(feature = "sqlite")]
mod sqlite;
mod table;
mod value;

pub use consumer::{ConsumerName, MAX_CONSUMER_NAME_LEN};
pub use error::{
    ColumnError, ConsumerNameError, DbError, DeliveryError, OpenError, PruneError, QueryError,
    TableNameError,
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
    pub(crate) consumer: ConsumerName,
    pub(crate) handler: F,
    counters: Counters,
}

#[derive(Default)]
struct Counters {
    committed: AtomicU64,
    skipped: AtomicU64,
    rolled_back: AtomicU64,
    failed: AtomicU64,
    fenced: AtomicU64,
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
    /// failed statement on PostgreSQL), and deliveries whose lease term was out of range
    /// ([`DeliveryError::TermOutOfRange`]).
    pub rolled_back: u64,
    /// Deliveries that failed in the database (unavailable, begin, record, commit).
    pub failed: u64,
    /// Deliveries refused as a stale owner's (R-DIST-8): a greater lease term of their
    /// partition was recorded; rolled back before the handler ran
    /// ([`DeliveryError::Fenced`]).
    pub fenced: u64,
}

/// How a delivery ended when it ended well.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    Committed,
    Skipped,
}

impl<D, F> Transactional<D, F> {
    pub(crate) fn from_parts(db: D, table: TableName, consumer: ConsumerName, handler: F) -> Self {
        Self {
            inner: Arc::new(Inner {
                db,
                table,
                consumer,
                handler,
                counters: Counters::default(),
            }),
        }
    }

    /// The counters: committed, skipped (duplicates), rolled back, failed, fenced.
    #[must_use]
    pub fn stats(&self) -> TransactionalStats {
        let c = &self.inner.counters;
        TransactionalStats {
            committed: c.committed.load(Ordering::Relaxed),
            skipped: c.skipped.load(Ordering::Relaxed),
            rolled_back: c.rolled_back.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
            fenced: c.fenced.load(Ordering::Relaxed),
        }
    }

    /// The last delivery that was not acknowledged, and why.
    #[must_use]
    pub fn last_failure(&self) -> Option<DeliveryError> {
        self.inner.counters.last.lock().clone()
    }

    /// The processed-messages table (its fence table is [`TableName::fence`]).
    #[must_use]
    pub fn table(&self) -> &TableName {
        &self.inner.table
    }

    /// The consumer whose ids (and lease terms) this handler records.
    #[must_use]
    pub fn consumer(&self) -> &ConsumerName {
        &self.inner.consumer
    }
}

impl<D, F> fmt::Debug for Transactional<D, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transactional")
            .field("database", &std::any::type_name::<D>())
            .field("table", &self.inner.table)
            .field("consumer", &self.inner.consumer)
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
                let counter = if e.is_fenced() {
                    &c.fenced
                } else if e.is_database() {
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

/// Validate a constructor's table and consumer names.
pub(crate) fn names(table: &str, consumer: &str) -> Result<(TableName, ConsumerName), OpenError> {
    let t = TableName::new(table).map_err(|error| OpenError::InvalidTableName {
        name: table.to_owned(),
        error,
    })?;
    let c = ConsumerName::new(consumer).map_err(|error| OpenError::InvalidConsumerName {
        name: consumer.to_owned(),
        error,
    })?;
    Ok((t, c))
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

/// The insert that records a consumer's id; `p` are the placeholders of consumer, id and
/// time.
pub(crate) fn insert_sql(table: &TableName, p: [&str; 3]) -> String {
    format!(
        "INSERT INTO {} (consumer, message_id, processed_at) VALUES ({}, {}, {}) \
         ON CONFLICT (consumer, message_id) DO NOTHING",
        table.quoted(),
        p[0],
        p[1],
        p[2]
    )
}

/// The delete that prunes a consumer's ids recorded before a cutoff; `p` are the
/// placeholders of consumer and cutoff.
pub(crate) fn prune_sql(table: &TableName, p: [&str; 2]) -> String {
    format!(
        "DELETE FROM {} WHERE consumer = {} AND processed_at < {}",
        table.quoted(),
        p[0],
        p[1]
    )
}

/// The upsert that records a delivery's term for (consumer, partition) and returns the
/// greatest term recorded, which is the delivery's own unless a newer owner's is there.
/// On PostgreSQL it locks the row until the transaction ends, so deliveries of one
/// partition serialise on it; on SQLite `BEGIN IMMEDIATE` serialises every delivery.
/// `greatest` is the database's two-argument maximum; `p` the placeholders of consumer,
/// partition and term.
pub(crate) fn fence_sql(table: &TableName, greatest: &str, p: [&str; 3]) -> String {
    let fence = table.fence().quoted();
    format!(
        "INSERT INTO {fence} (consumer, key_partition, term) VALUES ({}, {}, {}) \
         ON CONFLICT (consumer, key_partition) DO UPDATE \
         SET term = {greatest}({fence}.term, excluded.term) RETURNING term",
        p[0], p[1], p[2]
    )
}

/// A delivery's fence as the fence table stores it: partition and term, both `i64`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StoredFence {
    pub fence: tidings::Fence,
    pub partition: i64,
    pub term: i64,
}

impl StoredFence {
    /// The fence of `message`, if it has one.
    ///
    /// # Errors
    /// [`DeliveryError::TermOutOfRange`] for a term beyond `i64::MAX`.
    pub(crate) fn of(message: &tidings::Message) -> Result<Option<Self>, DeliveryError> {
        let Some(fence) = message.fence() else {
            return Ok(None);
        };
        let term = i64::try_from(fence.term()).map_err(|_| DeliveryError::TermOutOfRange {
            partition: fence.partition(),
            term: fence.term(),
        })?;
        Ok(Some(Self {
            fence,
            partition: i64::from(fence.partition()),
            term,
        }))
    }

    /// `Err(Fenced)` when `recorded`, the greatest term the fence table holds after the
    /// upsert, is greater than this delivery's.
    pub(crate) fn check(self, recorded: i64) -> Result<(), DeliveryError> {
        if recorded > self.term {
            Err(DeliveryError::Fenced {
                partition: self.fence.partition(),
                term: self.fence.term(),
                recorded: u64::try_from(recorded).unwrap_or(0),
            })
        } else {
            Ok(())
        }
    }
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
