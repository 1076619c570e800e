//! One error type per operation: starting ([`OpenError`]), a delivery ([`DeliveryError`]),
//! a statement in the handler's transaction ([`QueryError`]), reading a column
//! ([`ColumnError`]), pruning ([`PruneError`]), a table name ([`TableNameError`]) and a
//! consumer name ([`ConsumerNameError`]).
//!
//! The database driver's own errors are kept as the `source` (a boxed
//! `std::error::Error`), so no driver type is part of this crate's API; their text is in
//! `Display`.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;

use tidings::HandlerError;

/// A database driver's error, shared (so the errors holding it are `Clone`).
#[derive(Clone)]
pub struct DbError(Arc<dyn StdError + Send + Sync>);

impl DbError {
    pub(crate) fn new(e: impl StdError + Send + Sync + 'static) -> Self {
        Self(Arc::new(e))
    }
    pub(crate) fn msg(text: impl Into<String>) -> Self {
        #[derive(Debug)]
        struct Text(String);
        impl fmt::Display for Text {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
        impl StdError for Text {}
        Self(Arc::new(Text(text.into())))
    }
    /// The driver's error, to inspect (`downcast_ref`) or print its chain.
    #[must_use]
    pub fn inner(&self) -> &(dyn StdError + Send + Sync + 'static) {
        &*self.0
    }
}

impl fmt::Debug for DbError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for DbError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)?;
        // The driver's own chain (e.g. "db error" → the server's message).
        let mut source = self.0.source();
        while let Some(s) = source {
            write!(f, ": {s}")?;
            source = s.source();
        }
        Ok(())
    }
}

impl StdError for DbError {}

/// Why a table name was refused (see [`TableName`](crate::TableName)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TableNameError {
    /// The name is empty.
    #[error("the table name is empty")]
    Empty,
    /// The name is longer than the limit.
    #[error("the table name is {len} bytes long; at most {max} are allowed")]
    TooLong {
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The first character is not an ASCII letter or `_`.
    #[error("a table name starts with an ASCII letter or `_`, not {found:?}")]
    BadStart {
        /// The first character.
        found: char,
    },
    /// A character other than an ASCII letter, digit or `_`.
    #[error("a table name holds only ASCII letters, digits and `_`; found {found:?} at byte {at}")]
    BadChar {
        /// The character.
        found: char,
        /// Its byte offset.
        at: usize,
    },
    /// The name starts with a prefix the database reserves.
    #[error("table names starting with `{prefix}` are reserved by the database")]
    Reserved {
        /// The reserved prefix.
        prefix: &'static str,
    },
}

/// Why a consumer name was refused (see [`ConsumerName`](crate::ConsumerName)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumerNameError {
    /// The name is empty.
    #[error("the consumer name is empty")]
    Empty,
    /// The name is longer than the limit.
    #[error("the consumer name is {len} bytes long; at most {max} are allowed")]
    TooLong {
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The name holds a control character.
    #[error("a consumer name holds no control characters; found {found:?} at byte {at}")]
    Control {
        /// The character.
        found: char,
        /// Its byte offset.
        at: usize,
    },
}

/// Why a [`Transactional`](crate::Transactional) handler could not be built (at start).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The processed-messages table name is not a plain identifier.
    #[error("invalid processed-messages table name {name:?}: {error}")]
    InvalidTableName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        error: TableNameError,
    },
    /// The consumer name is empty, too long or holds a control character.
    #[error("invalid consumer name {name:?}: {error}")]
    InvalidConsumerName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        error: ConsumerNameError,
    },
    /// The processed-messages table has the shape of tidings-sql before ids belonged to a
    /// consumer: `message_id` alone is the primary key. Its rows cannot be attributed to
    /// a consumer from the table itself (several consumers may have recorded into it), so
    /// nothing was changed. `fix` is the SQL that migrates it, in one transaction,
    /// attributing every row to `consumer`: right when only that consumer recorded into
    /// the table. When several did, run its `INSERT` once per consumer (each then keeps
    /// treating every old id as processed, as before) — see the crate docs.
    #[error(
        "the processed-messages table `{table}` keys ids by message id alone (the shape \
         before ids belonged to a consumer); its rows cannot be attributed to a consumer \
         automatically, so nothing was changed. If only consumer `{consumer}` recorded \
         into it, migrate it with: {fix}"
    )]
    UnattributedTable {
        /// The table.
        table: String,
        /// The consumer this handler was built for.
        consumer: String,
        /// The migration, for this database, attributing every row to `consumer`.
        fix: String,
    },
    /// The connection settings could not be read (a PostgreSQL connection string).
    #[error("invalid connection settings: {source}")]
    InvalidConfig {
        /// The parser's error.
        source: DbError,
    },
    /// The database could not be opened or reached.
    #[error("the database is unavailable: {source}")]
    Unavailable {
        /// The driver's error.
        source: DbError,
    },
    /// Creating or inspecting the processed-messages table failed.
    #[error("could not create or inspect the processed-messages table `{table}`: {source}")]
    Table {
        /// The table.
        table: String,
        /// The driver's error.
        source: DbError,
    },
    /// A table (or view) of that name exists with another shape; nothing was changed.
    #[error(
        "the processed-messages table `{table}` exists with another shape: {problem}; \
         {expected} — choose another table name or migrate that table"
    )]
    TableShape {
        /// The table.
        table: String,
        /// What is wrong with it.
        problem: String,
        /// The shape expected, in this database's spelling.
        expected: String,
    },
}

/// Why one delivery was not acknowledged. Every variant leaves the message unacknowledged
/// and the message id unrecorded (or its recording undone), so the subscription retries it
/// (R-DEL-1); only [`DeliveryError::Handler`] with a rejecting error skips the retries.
///
/// [`Transactional::last_failure`](crate::Transactional::last_failure) keeps the last one;
/// the dispatcher sees it as a retryable [`HandlerError`] whose text is this `Display`.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum DeliveryError {
    /// No connection: opening or reconnecting failed, or the connection was lost.
    #[error("tidings-sql: the database is unavailable: {source}")]
    Unavailable {
        /// The driver's error.
        source: DbError,
    },
    /// `BEGIN` failed.
    #[error("tidings-sql: could not begin a transaction: {source}")]
    Begin {
        /// The driver's error.
        source: DbError,
    },
    /// Inserting the message id into the processed-messages table failed (not because it
    /// was there: that is a skip), or recording the delivery's term in the fence table
    /// failed; `table` says which.
    #[error("tidings-sql: could not record the delivery in `{table}`: {source}")]
    Record {
        /// The processed-messages table or its fence table.
        table: String,
        /// The driver's error.
        source: DbError,
    },
    /// The delivery's fence ([`tidings::Fence`]) is stale: a greater lease term of its
    /// partition is recorded for this consumer, so a newer owner has committed there
    /// (R-DIST-8). Rolled back before the handler ran; nothing was committed. Handed to
    /// the dispatcher as retryable: a stale owner's keyed group refuses the retry at its
    /// start gate and the partition's new owner delivers the message; a process that owns
    /// the partition again retries it under its new term.
    #[error(
        "tidings-sql: fenced: this delivery's partition {partition} term {term} is stale; \
         term {recorded} is recorded, so a newer owner committed; nothing was committed"
    )]
    Fenced {
        /// The delivery's key partition.
        partition: u32,
        /// The delivery's lease term.
        term: u64,
        /// The greater term recorded for the partition.
        recorded: u64,
    },
    /// The delivery's lease term does not fit the fence table's signed 64-bit column.
    /// Nothing was begun.
    #[error(
        "tidings-sql: the lease term {term} of partition {partition} exceeds {}",
        i64::MAX
    )]
    TermOutOfRange {
        /// The delivery's key partition.
        partition: u32,
        /// The delivery's lease term.
        term: u64,
    },
    /// The handler returned an error; the transaction was rolled back.
    #[error("{error}")]
    Handler {
        /// The handler's error, passed on as it is (retryable or rejecting).
        error: HandlerError,
    },
    /// The handler panicked; the transaction was rolled back.
    #[error("tidings-sql: the handler panicked: {message}")]
    Panicked {
        /// The panic's text.
        message: String,
    },
    /// The handler returned `Ok` after one of its statements failed; PostgreSQL had
    /// aborted the transaction, so nothing could be committed. Rolled back.
    #[error(
        "tidings-sql: a statement failed in the handler's transaction, which the database \
         aborted; the handler returned Ok, but nothing was committed"
    )]
    Aborted,
    /// `COMMIT` failed. The outcome may be unknown (a connection lost during commit): the
    /// retry finds the id recorded and skips it if the commit did happen.
    #[error("tidings-sql: commit failed: {source}")]
    Commit {
        /// The driver's error.
        source: DbError,
    },
}

impl DeliveryError {
    /// True when the database, not the handler, failed (unavailable, begin, record,
    /// commit).
    #[must_use]
    pub fn is_database(&self) -> bool {
        matches!(
            self,
            Self::Unavailable { .. }
                | Self::Begin { .. }
                | Self::Record { .. }
                | Self::Commit { .. }
        )
    }
}

impl DeliveryError {
    /// True when the delivery was refused as a stale owner's ([`DeliveryError::Fenced`]).
    #[must_use]
    pub fn is_fenced(&self) -> bool {
        matches!(self, Self::Fenced { .. })
    }

    /// What the dispatcher gets: the handler's own error as it is, anything else as a
    /// retryable [`HandlerError`] with this error's text (a fenced delivery's starts with
    /// `tidings-sql: fenced:`). (The blanket
    /// `From<std::error::Error>` of `HandlerError` would make every error retryable,
    /// a rejecting handler error included.)
    #[must_use]
    pub fn into_handler_error(self) -> HandlerError {
        match self {
            DeliveryError::Handler { error } => error,
            other => HandlerError::retry(other.to_string()),
        }
    }
}

/// Why a statement run through the handler's transaction failed.
///
/// Converts into a retryable [`HandlerError`] with `?`.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum QueryError {
    /// The database refused or failed the statement.
    #[error("statement failed: {source}")]
    Database {
        /// The driver's error.
        source: DbError,
    },
    /// An earlier statement failed and PostgreSQL aborted the transaction: every later
    /// statement is refused until it ends, and it will be rolled back.
    #[error("an earlier statement failed; the transaction is aborted")]
    Aborted,
    /// The transaction is over (a handle kept after the handler returned).
    #[error("the transaction has ended")]
    Finished,
    /// A value in the result has a type this crate does not convert.
    #[error(
        "column {column} has type {type_name}, which tidings-sql does not convert; cast it \
         in the query (e.g. to text)"
    )]
    UnsupportedType {
        /// The column's name.
        column: String,
        /// The database's type name.
        type_name: String,
    },
}

/// Why a column of a [`Row`](crate::Row) could not be read as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ColumnError {
    /// The row has fewer columns.
    #[error("no column {index}: the row has {len}")]
    OutOfRange {
        /// The index asked for.
        index: usize,
        /// The number of columns.
        len: usize,
    },
    /// The value has another type (or is NULL).
    #[error("column {index} holds {found}, not {wanted}")]
    WrongType {
        /// The index asked for.
        index: usize,
        /// The type asked for.
        wanted: &'static str,
        /// The value's type.
        found: &'static str,
    },
}

/// Why pruning the processed-messages table failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum PruneError {
    /// No connection.
    #[error("the database is unavailable: {source}")]
    Unavailable {
        /// The driver's error.
        source: DbError,
    },
    /// The `DELETE` failed.
    #[error("pruning `{table}` failed: {source}")]
    Database {
        /// The table.
        table: String,
        /// The driver's error.
        source: DbError,
    },
}
