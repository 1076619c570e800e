//! The async PostgreSQL handler (`tokio-postgres`), for the tokio driver.

use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::SystemTime;

use futures_util::FutureExt;
use tidings::{AsyncHandler, HandlerError, HandlerFuture, Message};
use tokio_postgres::{Client, NoTls};

use super::{
    COLUMNS_SQL, FENCE_SHAPE, KIND_SQL, SHAPE, check_columns, check_kind, create_sql, parse_config,
    refs, rows, statements, table_error,
};
use crate::consumer::ConsumerName;
use crate::error::{DbError, DeliveryError, OpenError, PruneError, QueryError};
use crate::table::{ExpectedShape, TableName};
use crate::value::{Row, Value};
use crate::{Inner, Settled, StoredFence, Transactional, millis, panic_text};

/// The PostgreSQL database of an async [`Transactional`] handler: one connection, whose
/// I/O runs as a task on the tokio runtime that opened it; opened again after it was lost
/// (or after a delivery future was dropped half-way, which may have left a transaction
/// open on it). Connection string, table and aborted transactions as for
/// [`Postgres`](crate::Postgres).
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub struct PostgresAsync {
    config: tokio_postgres::Config,
    slot: tokio::sync::Mutex<Slot>,
    insert: String,
    prune: String,
    fence: String,
}

struct Slot {
    client: Option<Arc<Client>>,
    /// Set while a delivery runs; still set afterwards only if its future was dropped.
    busy: bool,
}

/// The open transaction an async PostgreSQL handler runs in: a cheap handle, `Clone`,
/// `Send`, `'static`, so the handler's future can own it.
///
/// Statements use PostgreSQL's SQL and placeholders (`$1`, `$2`, ...). Everything run
/// through it before the handler's future completes commits with the message id, or not
/// at all. A handle kept after that is dead: its statements fail with
/// [`QueryError::Finished`] and never run outside the transaction. Do not run `COMMIT`,
/// `ROLLBACK` or `BEGIN` through it.
#[derive(Clone)]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub struct AsyncPgTx {
    shared: Arc<TxShared>,
}

struct TxShared {
    client: Arc<Client>,
    /// `true` while the transaction is the handler's; written (under the write lock)
    /// before the commit or rollback, so no statement of this handle runs after.
    open: tokio::sync::RwLock<bool>,
    failed: AtomicBool,
}

impl std::fmt::Debug for AsyncPgTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncPgTx")
            .field("failed", &self.shared.failed.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl AsyncPgTx {
    fn fail(&self, e: tokio_postgres::Error) -> QueryError {
        self.shared.failed.store(true, Ordering::Relaxed);
        QueryError::Database {
            source: DbError::new(e),
        }
    }

    fn usable(&self, open: bool) -> Result<(), QueryError> {
        if !open {
            Err(QueryError::Finished)
        } else if self.shared.failed.load(Ordering::Relaxed) {
            Err(QueryError::Aborted)
        } else {
            Ok(())
        }
    }

    /// Run one statement; the number of rows it changed.
    ///
    /// # Errors
    /// [`QueryError::Database`] when PostgreSQL refuses or fails it (the transaction is
    /// then aborted); [`QueryError::Aborted`] after an earlier failure;
    /// [`QueryError::Finished`] after the handler's future completed.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the statement running; the transaction stays the
    /// handler's until its future completes.
    pub async fn execute(&self, sql: &str, params: &[Value]) -> Result<u64, QueryError> {
        let open = self.shared.open.read().await;
        self.usable(*open)?;
        let p = super::params(params);
        let r = self.shared.client.execute(sql, &refs(&p)).await;
        r.map_err(|e| self.fail(e))
    }

    /// Run statements without parameters, separated by `;` (DDL, for instance).
    ///
    /// # Errors
    /// As [`execute`](Self::execute).
    pub async fn execute_batch(&self, sql: &str) -> Result<(), QueryError> {
        let open = self.shared.open.read().await;
        self.usable(*open)?;
        let r = self.shared.client.batch_execute(sql).await;
        r.map_err(|e| self.fail(e))
    }

    /// Run a query; every row it returns.
    ///
    /// # Errors
    /// As [`execute`](Self::execute), and [`QueryError::UnsupportedType`] for a column
    /// type [`Value`] does not cover.
    pub async fn query(&self, sql: &str, params: &[Value]) -> Result<Vec<Row>, QueryError> {
        let open = self.shared.open.read().await;
        self.usable(*open)?;
        let p = super::params(params);
        let r = self.shared.client.query(sql, &refs(&p)).await;
        rows(&r.map_err(|e| self.fail(e))?)
    }

    /// Run a query; its first row, if any.
    ///
    /// # Errors
    /// As [`query`](Self::query).
    pub async fn query_opt(&self, sql: &str, params: &[Value]) -> Result<Option<Row>, QueryError> {
        Ok(self.query(sql, params).await?.into_iter().next())
    }

    /// Take the transaction back from every handle: whether a statement failed.
    async fn finish(&self) -> bool {
        let mut open = self.shared.open.write().await;
        *open = false;
        self.shared.failed.load(Ordering::Relaxed)
    }
}

async fn connect(config: &tokio_postgres::Config) -> Result<Arc<Client>, DbError> {
    let (client, connection) = config.connect(NoTls).await.map_err(DbError::new)?;
    // The connection's I/O; it ends when the client is dropped or the server goes away.
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(Arc::new(client))
}

async fn ensure_table(
    client: &Client,
    table: &TableName,
    shape: &ExpectedShape,
    consumer: Option<&ConsumerName>,
) -> Result<(), OpenError> {
    let kind = client
        .query_opt(KIND_SQL, &[&table.as_str()])
        .await
        .map_err(|e| table_error(table, e))?
        .map(|r| r.try_get::<_, String>(0))
        .transpose()
        .map_err(|e| table_error(table, e))?;
    if !check_kind(table, shape, kind.as_deref())? {
        // Two processes creating it at once may collide in the catalog: try twice.
        let create = create_sql(table, shape);
        if let Err(e) = client.batch_execute(&create).await {
            client
                .batch_execute(&create)
                .await
                .map_err(|_| table_error(table, e))?;
        }
    }
    let columns = client
        .query(COLUMNS_SQL, &[&table.as_str()])
        .await
        .map_err(|e| table_error(table, e))?;
    check_columns(table, shape, consumer, &columns)
}

#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
impl<F, Fut> Transactional<PostgresAsync, F>
where
    F: Fn(AsyncPgTx, Arc<Message>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    /// An async handler running `handler` in a transaction of the PostgreSQL database
    /// `conn` names (a connection string, see [`Postgres`](crate::Postgres)), recording the
    /// ids of `consumer` in `table` and its lease terms in `<table>_fence` (both created
    /// if absent, in the current schema). Subscribe it with `Broker::subscribe` (to
    /// a pattern or a durable stream) under the tokio driver.
    ///
    /// Must be awaited inside a tokio runtime: the connection's I/O is spawned on it.
    ///
    /// # Errors
    /// [`OpenError::InvalidTableName`], [`OpenError::InvalidConsumerName`],
    /// [`OpenError::InvalidConfig`], [`OpenError::Unavailable`] (cannot connect),
    /// [`OpenError::UnattributedTable`] (a table of the shape before ids belonged to a
    /// consumer; nothing is changed, the error holds the migration),
    /// [`OpenError::TableShape`] (a table or view of either name with another shape;
    /// nothing is changed), [`OpenError::Table`].
    ///
    /// # Cancel safety
    /// Dropping the future before it completes leaves at most the tables created.
    pub async fn postgres_async(
        conn: &str,
        table: &str,
        consumer: &str,
        handler: F,
    ) -> Result<Self, OpenError> {
        let (table, consumer) = crate::names(table, consumer)?;
        let config = parse_config(conn)?;
        let client = connect(&config)
            .await
            .map_err(|source| OpenError::Unavailable { source })?;
        ensure_table(&client, &table, &SHAPE, Some(&consumer)).await?;
        ensure_table(&client, &table.fence(), &FENCE_SHAPE, None).await?;
        let [insert, prune, fence] = statements(&table);
        let db = PostgresAsync {
            config,
            slot: tokio::sync::Mutex::new(Slot {
                client: Some(client),
                busy: false,
            }),
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
    pub async fn prune_before(&self, cutoff: SystemTime) -> Result<u64, PruneError> {
        let inner = &self.inner;
        let mut slot = inner.db.slot.lock().await;
        let client = slot_client(&mut slot, &inner.db.config)
            .await
            .map_err(|source| PruneError::Unavailable { source })?;
        match client
            .execute(
                &inner.db.prune,
                &[&inner.consumer.as_str(), &millis(cutoff)],
            )
            .await
        {
            Ok(n) => Ok(n),
            Err(e) => {
                slot.client = None;
                Err(PruneError::Database {
                    table: inner.table.to_string(),
                    source: DbError::new(e),
                })
            }
        }
    }
}

/// The slot's client, connected anew when there is none, it is closed, or a dropped
/// delivery may have left a transaction open on it.
async fn slot_client(
    slot: &mut Slot,
    config: &tokio_postgres::Config,
) -> Result<Arc<Client>, DbError> {
    if slot.busy || slot.client.as_ref().is_none_or(|c| c.is_closed()) {
        slot.client = None;
        slot.busy = false;
        slot.client = Some(connect(config).await?);
    }
    slot.client
        .clone()
        .ok_or_else(|| DbError::msg("no connection"))
}

impl<F, Fut> Inner<PostgresAsync, F>
where
    F: Fn(AsyncPgTx, Arc<Message>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    async fn deliver(&self, message: Arc<Message>) -> Result<Settled, DeliveryError> {
        let mut slot = self.db.slot.lock().await;
        let client = slot_client(&mut slot, &self.db.config)
            .await
            .map_err(|source| DeliveryError::Unavailable { source })?;
        slot.busy = true;
        let mut broken = false;
        let result = self.run(&client, message, &mut broken).await;
        slot.busy = false;
        if broken || matches!(&result, Err(e) if e.is_database()) {
            // Dropping the connection ends whatever transaction it had open.
            slot.client = None;
        }
        result
    }

    async fn run(
        &self,
        client: &Arc<Client>,
        message: Arc<Message>,
        broken: &mut bool,
    ) -> Result<Settled, DeliveryError> {
        let fence = StoredFence::of(&message)?;
        client
            .batch_execute("BEGIN")
            .await
            .map_err(|e| DeliveryError::Begin {
                source: DbError::new(e),
            })?;
        let consumer = self.consumer.as_str();
        if let Some(fence) = fence {
            // Locks the partition's row until the end of this transaction.
            let recorded: i64 = client
                .query_one(&self.db.fence, &[&consumer, &fence.partition, &fence.term])
                .await
                .and_then(|row| row.try_get(0))
                .map_err(|e| DeliveryError::Record {
                    table: self.table.fence().to_string(),
                    source: DbError::new(e),
                })?;
            if let Err(fenced) = fence.check(recorded) {
                *broken |= client.batch_execute("ROLLBACK").await.is_err();
                return Err(fenced);
            }
        }
        let id = message.id().to_string();
        let inserted = client
            .execute(
                &self.db.insert,
                &[&consumer, &id, &millis(SystemTime::now())],
            )
            .await
            .map_err(|e| DeliveryError::Record {
                table: self.table.to_string(),
                source: DbError::new(e),
            })?;
        if inserted == 0 {
            *broken |= client.batch_execute("ROLLBACK").await.is_err();
            return Ok(Settled::Skipped);
        }
        let tx = AsyncPgTx {
            shared: Arc::new(TxShared {
                client: client.clone(),
                open: tokio::sync::RwLock::new(true),
                failed: AtomicBool::new(false),
            }),
        };
        let started = catch_unwind(AssertUnwindSafe(|| {
            (self.handler)(tx.clone(), message.clone())
        }));
        let result = match started {
            Ok(future) => AssertUnwindSafe(future).catch_unwind().await,
            Err(payload) => Err(payload),
        };
        let failed = tx.finish().await;
        match result {
            Ok(Ok(())) if !failed => {
                client
                    .batch_execute("COMMIT")
                    .await
                    .map_err(|e| DeliveryError::Commit {
                        source: DbError::new(e),
                    })?;
                Ok(Settled::Committed)
            }
            other => {
                *broken |= client.batch_execute("ROLLBACK").await.is_err();
                match other {
                    Ok(Ok(())) => Err(DeliveryError::Aborted),
                    Ok(Err(error)) => Err(DeliveryError::Handler { error }),
                    Err(payload) => Err(DeliveryError::Panicked {
                        message: panic_text(payload.as_ref()),
                    }),
                }
            }
        }
    }
}

#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
impl<F, Fut> AsyncHandler for Transactional<PostgresAsync, F>
where
    F: Fn(AsyncPgTx, Arc<Message>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    fn handle<'a>(&'a self, message: Arc<Message>) -> HandlerFuture<'a> {
        Box::pin(async move {
            let r = self.inner.deliver(message).await;
            self.inner.finish(r)
        })
    }
}
