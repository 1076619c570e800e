//! SQLite (bundled): [`Transactional::sqlite`].

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;
use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, TransactionBehavior, params_from_iter};
use tidings::{Handler, HandlerError, Message};

use crate::consumer::ConsumerName;
use crate::error::{DbError, DeliveryError, OpenError, PruneError, QueryError};
use crate::table::{
    ColumnInfo, ExpectedShape, TableName, check_shape, create_sql, expected_text, is_unattributed,
    migration_sql,
};
use crate::value::{Row, Value};
use crate::{
    Inner, Settled, StoredFence, Transactional, fence_sql, insert_sql, millis, panic_text,
    prune_sql,
};

/// How long a statement waits for another connection's lock before failing (`BUSY`).
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

const SHAPE: ExpectedShape = ExpectedShape {
    columns: &[
        ("consumer", "text"),
        ("message_id", "text"),
        ("processed_at", "integer"),
    ],
    primary_key: &["consumer", "message_id"],
};

const FENCE_SHAPE: ExpectedShape = ExpectedShape {
    columns: &[
        ("consumer", "text"),
        ("key_partition", "integer"),
        ("term", "integer"),
    ],
    primary_key: &["consumer", "key_partition"],
};

const TRAILER: &str = " WITHOUT ROWID";

/// The SQLite database of a [`Transactional`] handler: a file, one connection.
///
/// The connection waits up to [`BUSY_TIMEOUT`] for another connection's lock. Journal
/// mode and `synchronous` are SQLite's defaults (rollback journal, `FULL`): a committed
/// transaction survives a process kill and a power cut.
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub struct Sqlite {
    path: PathBuf,
    conn: Mutex<Option<Connection>>,
    insert: String,
    prune: String,
    fence: String,
}

/// The open transaction a SQLite handler runs in.
///
/// Statements use SQLite's SQL and placeholders (`?1`, `?2`, ...). Everything run through
/// it commits with the message id, or not at all. Do not run `COMMIT`, `ROLLBACK` or
/// `BEGIN` through it.
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub struct SqliteTx<'a> {
    tx: rusqlite::Transaction<'a>,
}

impl std::fmt::Debug for SqliteTx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteTx").finish_non_exhaustive()
    }
}

struct Param<'a>(&'a Value);

impl rusqlite::ToSql for Param<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match self.0 {
            Value::Null => ValueRef::Null,
            Value::Integer(v) => ValueRef::Integer(*v),
            Value::Real(v) => ValueRef::Real(*v),
            Value::Text(v) => ValueRef::Text(v.as_bytes()),
            Value::Blob(v) => ValueRef::Blob(v),
            Value::Bool(v) => ValueRef::Integer(i64::from(*v)),
        }))
    }
}

fn query_error(e: rusqlite::Error) -> QueryError {
    QueryError::Database {
        source: DbError::new(e),
    }
}

fn to_value(v: ValueRef<'_>) -> Value {
    match v {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::Integer(i),
        ValueRef::Real(r) => Value::Real(r),
        ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) => Value::Blob(b.to_vec()),
    }
}

impl SqliteTx<'_> {
    /// Run one statement; the number of rows it changed.
    ///
    /// # Errors
    /// [`QueryError::Database`] when SQLite refuses or fails it (a statement returning
    /// rows belongs in [`query`](Self::query)).
    pub fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64, QueryError> {
        let n = self
            .tx
            .execute(sql, params_from_iter(params.iter().map(Param)))
            .map_err(query_error)?;
        Ok(n as u64)
    }

    /// Run statements without parameters, separated by `;` (DDL, for instance).
    ///
    /// # Errors
    /// [`QueryError::Database`] at the first that fails.
    pub fn execute_batch(&mut self, sql: &str) -> Result<(), QueryError> {
        self.tx.execute_batch(sql).map_err(query_error)
    }

    /// Run a query; every row it returns.
    ///
    /// # Errors
    /// [`QueryError::Database`] when SQLite refuses or fails it.
    pub fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Row>, QueryError> {
        let mut stmt = self.tx.prepare(sql).map_err(query_error)?;
        let columns: Arc<[String]> = stmt.column_names().map(str::to_owned).collect();
        let mut rows = stmt
            .query(params_from_iter(params.iter().map(Param)))
            .map_err(query_error)?;
        let mut out = Vec::new();
        while let Some(row) = rows.next().map_err(query_error)? {
            let values = (0..columns.len())
                .map(|i| row.get_ref(i).map(to_value))
                .collect::<Result<Vec<_>, _>>()
                .map_err(query_error)?;
            out.push(Row::new(columns.clone(), values));
        }
        Ok(out)
    }

    /// Run a query; its first row, if any.
    ///
    /// # Errors
    /// [`QueryError::Database`] when SQLite refuses or fails it.
    pub fn query_opt(&mut self, sql: &str, params: &[Value]) -> Result<Option<Row>, QueryError> {
        Ok(self.query(sql, params)?.into_iter().next())
    }
}

fn open_connection(path: &Path) -> Result<Connection, DbError> {
    let conn = Connection::open(path).map_err(DbError::new)?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(DbError::new)?;
    Ok(conn)
}

/// Create `table` with `shape` if absent, then check its shape. `consumer` is given for
/// the processed-messages table: an unattributed one is refused with its migration.
fn ensure_table(
    conn: &Connection,
    table: &TableName,
    shape: &ExpectedShape,
    consumer: Option<&ConsumerName>,
) -> Result<(), OpenError> {
    let db = |e: rusqlite::Error| OpenError::Table {
        table: table.to_string(),
        source: DbError::new(e),
    };
    let shape_error = |problem: String| OpenError::TableShape {
        table: table.to_string(),
        problem,
        expected: expected_text(shape),
    };
    let kind: Option<String> = {
        let mut stmt = conn
            .prepare("SELECT type FROM sqlite_master WHERE name = ?1 COLLATE NOCASE")
            .map_err(db)?;
        let mut rows = stmt.query([table.as_str()]).map_err(db)?;
        match rows.next().map_err(db)? {
            Some(row) => Some(row.get(0).map_err(db)?),
            None => None,
        }
    };
    match kind.as_deref() {
        Some("table") => {}
        Some(other) => return Err(shape_error(format!("it is a {other}, not a table"))),
        None => conn
            .execute_batch(&create_sql(table, shape, TRAILER))
            .map_err(db)?,
    }
    let mut stmt = conn
        .prepare(&format!("PRAGMA table_info({})", table.quoted()))
        .map_err(db)?;
    let columns = stmt
        .query_map([], |r| {
            Ok(ColumnInfo {
                name: r.get(1)?,
                type_name: r.get(2)?,
                primary_key: r.get::<_, i64>(5)? > 0,
            })
        })
        .map_err(db)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(db)?;
    if let Some(consumer) = consumer
        && is_unattributed(&columns, shape)
    {
        return Err(OpenError::UnattributedTable {
            table: table.to_string(),
            consumer: consumer.to_string(),
            fix: migration_sql(table, shape, TRAILER, consumer),
        });
    }
    check_shape(&columns, shape).map_err(shape_error)
}

#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
impl<F> Transactional<Sqlite, F>
where
    F: Fn(&mut SqliteTx<'_>, &Message) -> Result<(), HandlerError> + Send + Sync + 'static,
{
    /// A handler running `handler` in a transaction of the SQLite database at `path`
    /// (created if absent), recording the ids of `consumer` in `table` and its lease
    /// terms in `<table>_fence` (both created if absent).
    ///
    /// # Errors
    /// [`OpenError::InvalidTableName`], [`OpenError::InvalidConsumerName`],
    /// [`OpenError::Unavailable`] (the file cannot be opened or created),
    /// [`OpenError::UnattributedTable`] (a table of the shape before ids belonged to a
    /// consumer; nothing is changed, the error holds the migration),
    /// [`OpenError::TableShape`] (a table or view of either name with another shape;
    /// nothing is changed), [`OpenError::Table`].
    pub fn sqlite(
        path: impl AsRef<Path>,
        table: &str,
        consumer: &str,
        handler: F,
    ) -> Result<Self, OpenError> {
        let (table, consumer) = crate::names(table, consumer)?;
        let path = path.as_ref().to_path_buf();
        let conn = open_connection(&path).map_err(|source| OpenError::Unavailable { source })?;
        ensure_table(&conn, &table, &SHAPE, Some(&consumer))?;
        ensure_table(&conn, &table.fence(), &FENCE_SHAPE, None)?;
        let db = Sqlite {
            path,
            conn: Mutex::new(Some(conn)),
            insert: insert_sql(&table, ["?1", "?2", "?3"]),
            prune: prune_sql(&table, ["?1", "?2"]),
            fence: fence_sql(&table, "max", ["?1", "?2", "?3"]),
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
        let mut slot = inner.db.conn.lock();
        if slot.is_none() {
            *slot = Some(
                open_connection(&inner.db.path)
                    .map_err(|source| PruneError::Unavailable { source })?,
            );
        }
        let Some(conn) = slot.as_ref() else {
            return Err(PruneError::Unavailable {
                source: DbError::msg("no connection"),
            });
        };
        match conn.execute(
            &inner.db.prune,
            rusqlite::params![inner.consumer.as_str(), millis(cutoff)],
        ) {
            Ok(n) => Ok(n as u64),
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

impl<F> Inner<Sqlite, F>
where
    F: Fn(&mut SqliteTx<'_>, &Message) -> Result<(), HandlerError> + Send + Sync + 'static,
{
    pub(crate) fn deliver(&self, message: &Message) -> Result<Settled, DeliveryError> {
        let mut slot = self.db.conn.lock();
        if slot.is_none() {
            *slot = Some(
                open_connection(&self.db.path)
                    .map_err(|source| DeliveryError::Unavailable { source })?,
            );
        }
        let Some(conn) = slot.as_mut() else {
            return Err(DeliveryError::Unavailable {
                source: DbError::msg("no connection"),
            });
        };
        let result = self.run(conn, message);
        // A database failure, or a transaction left open by a failed rollback: start
        // again from a fresh connection (closing this one rolls back what is open).
        let left_open = !conn.is_autocommit();
        if left_open || matches!(&result, Err(e) if e.is_database()) {
            *slot = None;
        }
        result
    }

    fn run(&self, conn: &mut Connection, message: &Message) -> Result<Settled, DeliveryError> {
        let fence = StoredFence::of(message)?;
        // IMMEDIATE: the write lock at once, so the term read below stays the greatest
        // until this transaction ends.
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| DeliveryError::Begin {
                source: DbError::new(e),
            })?;
        let consumer = self.consumer.as_str();
        if let Some(fence) = fence {
            let recorded: i64 = tx
                .query_row(
                    &self.db.fence,
                    rusqlite::params![consumer, fence.partition, fence.term],
                    |r| r.get(0),
                )
                .map_err(|e| DeliveryError::Record {
                    table: self.table.fence().to_string(),
                    source: DbError::new(e),
                })?;
            if let Err(fenced) = fence.check(recorded) {
                let _ = tx.rollback();
                return Err(fenced);
            }
        }
        let id = message.id().to_string();
        let inserted = tx
            .execute(
                &self.db.insert,
                rusqlite::params![consumer, id, millis(SystemTime::now())],
            )
            .map_err(|e| DeliveryError::Record {
                table: self.table.to_string(),
                source: DbError::new(e),
            })?;
        if inserted == 0 {
            let _ = tx.rollback();
            return Ok(Settled::Skipped);
        }
        let mut stx = SqliteTx { tx };
        let result = catch_unwind(AssertUnwindSafe(|| (self.handler)(&mut stx, message)));
        let tx = stx.tx;
        match result {
            Ok(Ok(())) => {
                tx.commit().map_err(|e| DeliveryError::Commit {
                    source: DbError::new(e),
                })?;
                Ok(Settled::Committed)
            }
            Ok(Err(error)) => {
                let _ = tx.rollback();
                Err(DeliveryError::Handler { error })
            }
            Err(payload) => {
                let _ = tx.rollback();
                Err(DeliveryError::Panicked {
                    message: panic_text(payload.as_ref()),
                })
            }
        }
    }
}

#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
impl<F> Handler for Transactional<Sqlite, F>
where
    F: Fn(&mut SqliteTx<'_>, &Message) -> Result<(), HandlerError> + Send + Sync + 'static,
{
    fn handle(&self, message: &Message) -> Result<(), HandlerError> {
        let r = self.inner.deliver(message);
        self.inner.finish(r)
    }
}

/// Under the tokio driver (`subscribe(.., AnyHandler::from_async(h))`): the same delivery
/// on tokio's blocking pool, so SQLite's blocking I/O never runs on a runtime worker.
#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(all(feature = "sqlite", feature = "tokio"))))]
impl<F> tidings::AsyncHandler for Transactional<Sqlite, F>
where
    F: Fn(&mut SqliteTx<'_>, &Message) -> Result<(), HandlerError> + Send + Sync + 'static,
{
    fn handle<'a>(&'a self, message: Arc<Message>) -> tidings::HandlerFuture<'a> {
        crate::on_blocking_pool(self.inner.clone(), message, Inner::<Sqlite, F>::deliver)
    }
}
