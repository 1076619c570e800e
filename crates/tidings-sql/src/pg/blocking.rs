//! The blocking PostgreSQL handler (the `postgres` crate: rust-postgres's blocking client).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::SystemTime;

use parking_lot::Mutex;
use postgres::NoTls;
use tidings::{Handler, HandlerError, Message};

use super::{
    COLUMNS_SQL, FENCE_SHAPE, KIND_SQL, SHAPE, check_columns, check_kind, create_sql, parse_config,
    refs, rows, statements, table_error,
};
use crate::consumer::ConsumerName;
use crate::error::{DbError, DeliveryError, OpenError, PruneError, QueryError};
use crate::table::{ExpectedShape, TableName};
use crate::value::{Row, Value};
use crate::{Inner, Settled, StoredFence, Transactional, millis, panic_text};

/// The PostgreSQL database of a blocking [`Transactional`] handler: one connection,
/// opened again after it was lost.
///
/// Its calls block the calling thread: use it with the thread, pool or manual driver, or
/// subscribe it as an async handler (`AnyHandler::from_async`) under the tokio driver,
/// which runs it on tokio's
/// blocking pool. Never call it on a runtime worker directly (the blocking client would
/// panic there).
///
/// # Connection
/// A connection string, in libpq's `key=value` form or as a `postgresql://` URL
/// (`host=127.0.0.1 port=5432 user=app dbname=app`). Without a `connect_timeout`, one of
/// [`DEFAULT_CONNECT_TIMEOUT`](crate::DEFAULT_CONNECT_TIMEOUT) is used, so an unreachable
/// server fails a delivery instead of hanging it. TLS is not offered yet (`NoTls`): use a
/// local socket or a trusted network.
///
/// # The table
/// `CREATE TABLE IF NOT EXISTS "<table>" (message_id text PRIMARY KEY, processed_at
/// bigint NOT NULL)` in the connection's current schema; `processed_at` is milliseconds
/// since the UNIX epoch (the consumer's clock).
///
/// # Aborted transactions
/// PostgreSQL aborts a transaction at its first failed statement; every later statement
/// fails too. This crate remembers it: later statements through the same transaction get
/// [`QueryError::Aborted`], and a handler that returns `Ok` anyway gets
/// [`DeliveryError::Aborted`] (rolled back, retried).
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub struct Postgres {
    config: postgres::Config,
    client: Mutex<Option<postgres::Client>>,
    insert: String,
    prune: String,
    fence: String,
}

/// The open transaction a blocking PostgreSQL handler runs in.
///
/// Statements use PostgreSQL's SQL and placeholders (`$1`, `$2`, ...). Everything run
/// through it commits with the message id, or not at all. Do not run `COMMIT`,
/// `ROLLBACK` or `BEGIN` through it.
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub struct PgTx<'a> {
    tx: postgres::Transaction<'a>,
    failed: bool,
}

impl std::fmt::Debug for PgTx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgTx")
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl PgTx<'_> {
    fn check(&self) -> Result<(), QueryError> {
        if self.failed {
            Err(QueryError::Aborted)
        } else {
            Ok(())
        }
    }
    fn fail(&mut self, e: postgres::Error) -> QueryError {
        self.failed = true;
        QueryError::Database {
            source: DbError::new(e),
        }
    }

    /// Run one statement; the number of rows it changed.
    ///
    /// # Errors
    /// [`QueryError::Database`] when PostgreSQL refuses or fails it (the transaction is
    /// then aborted); [`QueryError::Aborted`] after an earlier failure.
    pub fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64, QueryError> {
        self.check()?;
        let p = super::params(params);
        let r = self.tx.execute(sql, &refs(&p));
        r.map_err(|e| self.fail(e))
    }

    /// Run statements without parameters, separated by `;` (DDL, for instance).
    ///
    /// # Errors
    /// As [`execute`](Self::execute).
    pub fn execute_batch(&mut self, sql: &str) -> Result<(), QueryError> {
        self.check()?;
        let r = self.tx.batch_execute(sql);
        r.map_err(|e| self.fail(e))
    }

    /// Run a query; every row it returns.
    ///
    /// # Errors
    /// As [`execute`](Self::execute), and [`QueryError::UnsupportedType`] for a column
    /// type [`Value`] does not cover.
    pub fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Row>, QueryError> {
        self.check()?;
        let p = super::params(params);
        let r = self.tx.query(sql, &refs(&p));
        let pg = r.map_err(|e| self.fail(e))?;
        rows(&pg)
    }

    /// Run a query; its first row, if any.
    ///
    /// # Errors
    /// As [`query`](Self::query).
    pub fn query_opt(&mut self, sql: &str, params: &[Value]) -> Result<Option<Row>, QueryError> {
        Ok(self.query(sql, params)?.into_iter().next())
    }
}

fn connect(config: &postgres::Config) -> Result<postgres::Client, DbError> {
    config.connect(NoTls).map_err(DbError::new)
}

fn ensure_table(
    client: &mut postgres::Client,
    table: &TableName,
    shape: &ExpectedShape,
    consumer: Option<&ConsumerName>,
) -> Result<(), OpenError> {
    let kind = client
        .query_opt(KIND_SQL, &[&table.as_str()])
        .map_err(|e| table_error(table, e))?
        .map(|r| r.try_get::<_, String>(0))
        .transpose()
        .map_err(|e| table_error(table, e))?;
    if !check_kind(table, shape, kind.as_deref())? {
        // Two processes creating it at once may collide in the catalog: try twice.
        let create = create_sql(table, shape);
        if let Err(e) = client.batch_execute(&create) {
            client
                .batch_execute(&create)
                .map_err(|_| table_error(table, e))?;
        }
    }
    let columns = client
        .query(COLUMNS_SQL, &[&table.as_str()])
        .map_err(|e| table_error(table, e))?;
    check_columns(table, shape, consumer, &columns)
}

#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
impl<F> Transactional<Postgres, F>
where
    F: Fn(&mut PgTx<'_>, &Message) -> Result<(), HandlerError> + Send + Sync + 'static,
{
    /// A blocking handler running `handler` in a transaction of the PostgreSQL database
    /// `conn` names (a connection string, see [`Postgres`]), recording the ids of
    /// `consumer` in `table` and its lease terms in `<table>_fence` (both created if
    /// absent, in the current schema).
    ///
    /// Blocks while it connects; do not call it on a tokio runtime worker (use
    /// `spawn_blocking`, or [`Transactional::postgres_async`]).
    ///
    /// # Errors
    /// [`OpenError::InvalidTableName`], [`OpenError::InvalidConsumerName`],
    /// [`OpenError::InvalidConfig`], [`OpenError::Unavailable`] (cannot connect),
    /// [`OpenError::UnattributedTable`] (a table of the shape before ids belonged to a
    /// consumer; nothing is changed, the error holds the migration),
    /// [`OpenError::TableShape`] (a table or view of either name with another shape;
    /// nothing is changed), [`OpenError::Table`].
    pub fn postgres(
        conn: &str,
        table: &str,
        consumer: &str,
        handler: F,
    ) -> Result<Self, OpenError> {
        let (table, consumer) = crate::names(table, consumer)?;
        let config = postgres::Config::from(parse_config(conn)?);
        let mut client = connect(&config).map_err(|source| OpenError::Unavailable { source })?;
        ensure_table(&mut client, &table, &SHAPE, Some(&consumer))?;
        ensure_table(&mut client, &table.fence(), &FENCE_SHAPE, None)?;
        let [insert, prune, fence] = statements(&table);
        let db = Postgres {
            config,
            client: Mutex::new(Some(client)),
            insert,
            prune,
            fence,
        };
        Ok(Self::from_parts(db, table, consumer, handler))
    }

    /// Delete this consumer's ids recorded before `cutoff`; how many were deleted. Other
    /// consumers' ids in the table are left alone.
    ///
    /// A redelivery of a message whose id was deleted runs its effects again: choose the
    /// cutoff beyond the longest time a message can still be redelivered.
    ///
    /// # Errors
    /// [`PruneError::Unavailable`], [`PruneError::Database`].
    pub fn prune_before(&self, cutoff: SystemTime) -> Result<u64, PruneError> {
        let inner = &self.inner;
        let mut slot = inner.db.client.lock();
        if slot.as_ref().is_none_or(postgres::Client::is_closed) {
            *slot = Some(
                connect(&inner.db.config).map_err(|source| PruneError::Unavailable { source })?,
            );
        }
        let Some(client) = slot.as_mut() else {
            return Err(PruneError::Unavailable {
                source: DbError::msg("no connection"),
            });
        };
        match client.execute(
            &inner.db.prune,
            &[&inner.consumer.as_str(), &millis(cutoff)],
        ) {
            Ok(n) => Ok(n),
            Err(e) => {
                *slot = None;
                Err(PruneError::Database {
                    table: inner.table.to_string(),
                    source: DbError::new(e),
                })
            }
        }
    }
}

impl<F> Inner<Postgres, F>
where
    F: Fn(&mut PgTx<'_>, &Message) -> Result<(), HandlerError> + Send + Sync + 'static,
{
    pub(crate) fn deliver(&self, message: &Message) -> Result<Settled, DeliveryError> {
        let mut slot = self.db.client.lock();
        if slot.as_ref().is_none_or(postgres::Client::is_closed) {
            *slot = None;
            *slot = Some(
                connect(&self.db.config).map_err(|source| DeliveryError::Unavailable { source })?,
            );
        }
        let Some(client) = slot.as_mut() else {
            return Err(DeliveryError::Unavailable {
                source: DbError::msg("no connection"),
            });
        };
        let mut broken = false;
        let result = self.run(client, message, &mut broken);
        if broken || matches!(&result, Err(e) if e.is_database()) {
            // Dropping the connection ends whatever transaction it had open.
            *slot = None;
        }
        result
    }

    fn run(
        &self,
        client: &mut postgres::Client,
        message: &Message,
        broken: &mut bool,
    ) -> Result<Settled, DeliveryError> {
        let fence = StoredFence::of(message)?;
        let mut tx = client.transaction().map_err(|e| DeliveryError::Begin {
            source: DbError::new(e),
        })?;
        let consumer = self.consumer.as_str();
        if let Some(fence) = fence {
            // Locks the partition's row until the end of this transaction.
            let recorded: i64 = tx
                .query_one(&self.db.fence, &[&consumer, &fence.partition, &fence.term])
                .and_then(|row| row.try_get(0))
                .map_err(|e| DeliveryError::Record {
                    table: self.table.fence().to_string(),
                    source: DbError::new(e),
                })?;
            if let Err(fenced) = fence.check(recorded) {
                *broken |= tx.rollback().is_err();
                return Err(fenced);
            }
        }
        let id = message.id().to_string();
        let inserted = tx
            .execute(
                &self.db.insert,
                &[&consumer, &id, &millis(SystemTime::now())],
            )
            .map_err(|e| DeliveryError::Record {
                table: self.table.to_string(),
                source: DbError::new(e),
            })?;
        if inserted == 0 {
            *broken |= tx.rollback().is_err();
            return Ok(Settled::Skipped);
        }
        let mut ptx = PgTx { tx, failed: false };
        let result = catch_unwind(AssertUnwindSafe(|| (self.handler)(&mut ptx, message)));
        let PgTx { tx, failed } = ptx;
        match result {
            Ok(Ok(())) if !failed => {
                tx.commit().map_err(|e| DeliveryError::Commit {
                    source: DbError::new(e),
                })?;
                Ok(Settled::Committed)
            }
            Ok(Ok(())) => {
                *broken |= tx.rollback().is_err();
                Err(DeliveryError::Aborted)
            }
            Ok(Err(error)) => {
                *broken |= tx.rollback().is_err();
                Err(DeliveryError::Handler { error })
            }
            Err(payload) => {
                *broken |= tx.rollback().is_err();
                Err(DeliveryError::Panicked {
                    message: panic_text(payload.as_ref()),
                })
            }
        }
    }
}

#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
impl<F> Handler for Transactional<Postgres, F>
where
    F: Fn(&mut PgTx<'_>, &Message) -> Result<(), HandlerError> + Send + Sync + 'static,
{
    fn handle(&self, message: &Message) -> Result<(), HandlerError> {
        let r = self.inner.deliver(message);
        self.inner.finish(r)
    }
}

/// Under the tokio driver (`subscribe(.., AnyHandler::from_async(h))`): the same delivery
/// on tokio's blocking pool.
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
impl<F> tidings::AsyncHandler for Transactional<Postgres, F>
where
    F: Fn(&mut PgTx<'_>, &Message) -> Result<(), HandlerError> + Send + Sync + 'static,
{
    fn handle<'a>(&'a self, message: std::sync::Arc<Message>) -> tidings::HandlerFuture<'a> {
        crate::on_blocking_pool(self.inner.clone(), message, Inner::<Postgres, F>::deliver)
    }
}
