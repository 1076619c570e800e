//! PostgreSQL through rust-postgres: blocking ([`Transactional::postgres`]) and async
//! ([`Transactional::postgres_async`]).
//!
//! See [`Postgres`] for the connection string, the table and aborted transactions.
//!
//! [`Transactional::postgres`]: crate::Transactional::postgres
//! [`Transactional::postgres_async`]: crate::Transactional::postgres_async

use std::error::Error as StdError;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio_postgres::types::{IsNull, ToSql, Type, to_sql_checked};

use crate::consumer::ConsumerName;
use crate::error::{DbError, OpenError, QueryError};
use crate::table::{
    ColumnInfo, ExpectedShape, TableName, check_shape, expected_text, is_unattributed,
    migration_sql,
};
use crate::value::{Row, Value};

mod blocking;
mod nonblocking;

pub use blocking::{PgTx, Postgres};
pub use nonblocking::{AsyncPgTx, PostgresAsync};

/// The connect timeout used when the connection string sets none.
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The processed-messages table.
pub(crate) const SHAPE: ExpectedShape = ExpectedShape {
    columns: &[
        ("consumer", "text"),
        ("message_id", "text"),
        ("processed_at", "bigint"),
    ],
    primary_key: &["consumer", "message_id"],
};

/// Its fence table.
pub(crate) const FENCE_SHAPE: ExpectedShape = ExpectedShape {
    columns: &[
        ("consumer", "text"),
        ("key_partition", "bigint"),
        ("term", "bigint"),
    ],
    primary_key: &["consumer", "key_partition"],
};

/// The relation kind of `$1` in the current schema (`r` table, `p` partitioned, `v` view...).
pub(crate) const KIND_SQL: &str = "SELECT c.relkind::text FROM pg_class c \
     WHERE c.oid = to_regclass(quote_ident(current_schema()) || '.' || quote_ident($1))";

/// The columns of `$1` in the current schema: name, type, part of the primary key.
pub(crate) const COLUMNS_SQL: &str = "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), \
            COALESCE(a.attnum = ANY(i.indkey), false) \
     FROM pg_attribute a \
     LEFT JOIN pg_index i ON i.indrelid = a.attrelid AND i.indisprimary \
     WHERE a.attrelid = to_regclass(quote_ident(current_schema()) || '.' || quote_ident($1)) \
       AND a.attnum > 0 AND NOT a.attisdropped \
     ORDER BY a.attnum";

pub(crate) fn create_sql(table: &TableName, shape: &ExpectedShape) -> String {
    crate::table::create_sql(table, shape, "")
}

/// The statements of a blocking or async handler: recording an id, pruning, fencing.
pub(crate) fn statements(table: &TableName) -> [String; 3] {
    [
        crate::insert_sql(table, ["$1", "$2", "$3"]),
        crate::prune_sql(table, ["$1", "$2"]),
        crate::fence_sql(table, "GREATEST", ["$1", "$2", "$3"]),
    ]
}

/// Parse a connection string, with the default connect timeout when it sets none.
pub(crate) fn parse_config(conn: &str) -> Result<tokio_postgres::Config, OpenError> {
    let mut config: tokio_postgres::Config =
        conn.parse().map_err(|e| OpenError::InvalidConfig {
            source: DbError::new(e),
        })?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(DEFAULT_CONNECT_TIMEOUT);
    }
    Ok(config)
}

/// `Ok` when the relation kind (if any) is a table; a shape error otherwise.
pub(crate) fn check_kind(
    table: &TableName,
    shape: &ExpectedShape,
    kind: Option<&str>,
) -> Result<bool, OpenError> {
    match kind {
        None => Ok(false),
        Some("r" | "p") => Ok(true),
        Some(other) => {
            let what = match other {
                "v" => "a view",
                "m" => "a materialized view",
                "i" | "I" => "an index",
                "S" => "a sequence",
                "f" => "a foreign table",
                "c" => "a composite type",
                _ => "not a table",
            };
            Err(shape_error(
                table,
                shape,
                format!("it is {what}, not a table"),
            ))
        }
    }
}

fn shape_error(table: &TableName, shape: &ExpectedShape, problem: String) -> OpenError {
    OpenError::TableShape {
        table: table.to_string(),
        problem,
        expected: expected_text(shape),
    }
}

/// Check the columns of `table` against `shape`. `consumer` is given for the
/// processed-messages table: an unattributed one is refused with its migration.
pub(crate) fn check_columns(
    table: &TableName,
    shape: &ExpectedShape,
    consumer: Option<&ConsumerName>,
    rows: &[tokio_postgres::Row],
) -> Result<(), OpenError> {
    let columns = rows
        .iter()
        .map(|r| {
            Ok(ColumnInfo {
                name: r.try_get(0)?,
                type_name: r.try_get(1)?,
                primary_key: r.try_get(2)?,
            })
        })
        .collect::<Result<Vec<_>, tokio_postgres::Error>>()
        .map_err(|e| table_error(table, e))?;
    if let Some(consumer) = consumer
        && is_unattributed(&columns, shape)
    {
        return Err(OpenError::UnattributedTable {
            table: table.to_string(),
            consumer: consumer.to_string(),
            fix: migration_sql(table, shape, "", consumer),
        });
    }
    check_shape(&columns, shape).map_err(|problem| shape_error(table, shape, problem))
}

pub(crate) fn table_error(table: &TableName, e: tokio_postgres::Error) -> OpenError {
    OpenError::Table {
        table: table.to_string(),
        source: DbError::new(e),
    }
}

/// A [`Value`] bound to a PostgreSQL parameter of whatever type the statement declares.
#[derive(Debug)]
pub(crate) struct Param<'a>(pub &'a Value);

type BoxError = Box<dyn StdError + Sync + Send>;

fn mismatch(v: &Value, ty: &Type) -> BoxError {
    format!("cannot bind {} to a parameter of type {ty}", v.type_name()).into()
}

impl ToSql for Param<'_> {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
        let v = self.0;
        match v {
            Value::Null => Ok(IsNull::Yes),
            Value::Integer(i) => {
                if *ty == Type::INT8 {
                    i.to_sql(ty, out)
                } else if *ty == Type::INT4 {
                    i32::try_from(*i)?.to_sql(ty, out)
                } else if *ty == Type::INT2 {
                    i16::try_from(*i)?.to_sql(ty, out)
                } else if *ty == Type::OID {
                    u32::try_from(*i)?.to_sql(ty, out)
                } else {
                    Err(mismatch(v, ty))
                }
            }
            Value::Real(r) => {
                if *ty == Type::FLOAT8 {
                    r.to_sql(ty, out)
                } else if *ty == Type::FLOAT4 {
                    #[allow(clippy::cast_possible_truncation)] // float4 is what the column is
                    (*r as f32).to_sql(ty, out)
                } else {
                    Err(mismatch(v, ty))
                }
            }
            Value::Text(s) => {
                if <&str as ToSql>::accepts(ty) {
                    s.as_str().to_sql(ty, out)
                } else {
                    Err(mismatch(v, ty))
                }
            }
            Value::Blob(b) => {
                if <&[u8] as ToSql>::accepts(ty) {
                    b.as_slice().to_sql(ty, out)
                } else {
                    Err(mismatch(v, ty))
                }
            }
            Value::Bool(b) => {
                if *ty == Type::BOOL {
                    b.to_sql(ty, out)
                } else {
                    Err(mismatch(v, ty))
                }
            }
        }
    }

    fn accepts(_: &Type) -> bool {
        // Checked per value in `to_sql`, against the type the statement declares.
        true
    }

    to_sql_checked!();
}

pub(crate) fn params(values: &[Value]) -> Vec<Param<'_>> {
    values.iter().map(Param).collect()
}

pub(crate) fn refs<'a>(params: &'a [Param<'a>]) -> Vec<&'a (dyn ToSql + Sync)> {
    params.iter().map(|p| p as &(dyn ToSql + Sync)).collect()
}

fn get<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a tokio_postgres::Row,
    i: usize,
) -> Result<Option<T>, QueryError> {
    row.try_get::<_, Option<T>>(i)
        .map_err(|e| QueryError::Database {
            source: DbError::new(e),
        })
}

/// Convert result rows (all with the same columns).
pub(crate) fn rows(pg: &[tokio_postgres::Row]) -> Result<Vec<Row>, QueryError> {
    let Some(first) = pg.first() else {
        return Ok(Vec::new());
    };
    let columns: Arc<[String]> = first
        .columns()
        .iter()
        .map(|c| c.name().to_owned())
        .collect();
    pg.iter()
        .map(|row| {
            let values = row
                .columns()
                .iter()
                .enumerate()
                .map(|(i, col)| {
                    let ty = col.type_();
                    let value = if *ty == Type::BOOL {
                        get::<bool>(row, i)?.map(Value::Bool)
                    } else if *ty == Type::INT2 {
                        get::<i16>(row, i)?.map(|v| Value::Integer(v.into()))
                    } else if *ty == Type::INT4 {
                        get::<i32>(row, i)?.map(|v| Value::Integer(v.into()))
                    } else if *ty == Type::INT8 {
                        get::<i64>(row, i)?.map(Value::Integer)
                    } else if *ty == Type::OID {
                        get::<u32>(row, i)?.map(|v| Value::Integer(v.into()))
                    } else if *ty == Type::FLOAT4 {
                        get::<f32>(row, i)?.map(|v| Value::Real(v.into()))
                    } else if *ty == Type::FLOAT8 {
                        get::<f64>(row, i)?.map(Value::Real)
                    } else if *ty == Type::BYTEA {
                        get::<Vec<u8>>(row, i)?.map(Value::Blob)
                    } else if <String as tokio_postgres::types::FromSql>::accepts(ty) {
                        get::<String>(row, i)?.map(Value::Text)
                    } else {
                        return Err(QueryError::UnsupportedType {
                            column: col.name().to_owned(),
                            type_name: ty.to_string(),
                        });
                    };
                    Ok(value.unwrap_or(Value::Null))
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Row::new(columns.clone(), values))
        })
        .collect()
}
