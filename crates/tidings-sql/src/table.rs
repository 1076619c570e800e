//! The processed-messages table and its fence table: the validated name and the shapes
//! tidings expects.

use std::fmt;

use crate::error::TableNameError;

/// The longest table name accepted: PostgreSQL's identifier limit (63 bytes) less the
/// `_fence` of the table's fence table (see [`Transactional`](crate::Transactional)).
pub const MAX_TABLE_NAME_LEN: usize = 57;

/// A validated SQL identifier naming the processed-messages table.
///
/// # Contract
/// An ASCII letter or `_`, then ASCII letters, digits or `_`; at most
/// [`MAX_TABLE_NAME_LEN`] bytes; not starting with `sqlite_` (reserved by SQLite) or
/// `pg_` (reserved by PostgreSQL). Anything else is refused, so the name can never carry
/// SQL. It is still always written double-quoted, so it is taken exactly as given
/// (PostgreSQL does not fold a quoted name to lower case). It names a table in the
/// connection's current schema (PostgreSQL) or main database (SQLite); schema-qualified
/// names are not accepted.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TableName(String);

impl TableName {
    /// Validate `name`.
    ///
    /// # Errors
    /// [`TableNameError`] says what is wrong with it.
    pub fn new(name: &str) -> Result<Self, TableNameError> {
        let Some(first) = name.chars().next() else {
            return Err(TableNameError::Empty);
        };
        if name.len() > MAX_TABLE_NAME_LEN {
            return Err(TableNameError::TooLong {
                len: name.len(),
                max: MAX_TABLE_NAME_LEN,
            });
        }
        if !(first.is_ascii_alphabetic() || first == '_') {
            return Err(TableNameError::BadStart { found: first });
        }
        if let Some((at, found)) = name
            .char_indices()
            .find(|&(_, c)| !(c.is_ascii_alphanumeric() || c == '_'))
        {
            return Err(TableNameError::BadChar { found, at });
        }
        let lower = name.to_ascii_lowercase();
        for prefix in ["sqlite_", "pg_"] {
            if lower.starts_with(prefix) {
                return Err(TableNameError::Reserved { prefix });
            }
        }
        Ok(Self(name.to_owned()))
    }

    /// The name as given.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name double-quoted, as it is written into SQL.
    #[must_use]
    pub fn quoted(&self) -> String {
        format!("\"{}\"", self.0)
    }

    /// The name of this table's fence table: the name followed by `_fence`.
    #[must_use]
    pub fn fence(&self) -> TableName {
        Self(format!("{}_fence", self.0))
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TableName({:?})", self.0)
    }
}

/// One column of an existing table, as the database describes it.
#[derive(Debug, Clone)]
pub(crate) struct ColumnInfo {
    pub name: String,
    /// The declared type, as the database spells it.
    pub type_name: String,
    /// Whether the column is part of the primary key.
    pub primary_key: bool,
}

/// The columns (name, type in the database's lower-case spelling) and the primary key a
/// table must have.
pub(crate) struct ExpectedShape {
    pub columns: &'static [(&'static str, &'static str)],
    pub primary_key: &'static [&'static str],
}

/// The description of the expected shape, for error messages.
pub(crate) fn expected_text(shape: &ExpectedShape) -> String {
    let columns: Vec<String> = shape
        .columns
        .iter()
        .map(|(name, ty)| format!("{name} {ty} NOT NULL"))
        .collect();
    format!(
        "expected exactly ({}, PRIMARY KEY ({}))",
        columns.join(", "),
        shape.primary_key.join(", ")
    )
}

/// `Ok` when `columns` are `shape`; otherwise what is wrong.
pub(crate) fn check_shape(columns: &[ColumnInfo], shape: &ExpectedShape) -> Result<(), String> {
    let mut problems = Vec::new();
    for (name, ty) in shape.columns {
        match columns.iter().find(|c| c.name == *name) {
            None => problems.push(format!("column {name} is missing")),
            Some(c) => {
                if !c.type_name.eq_ignore_ascii_case(ty) {
                    problems.push(format!(
                        "column {name} has type {}, not {ty}",
                        display_type(&c.type_name)
                    ));
                }
                if c.primary_key != shape.primary_key.contains(name) {
                    problems.push(if c.primary_key {
                        format!("column {name} is part of the primary key")
                    } else {
                        format!("column {name} is not part of the primary key")
                    });
                }
            }
        }
    }
    for c in columns {
        if !shape.columns.iter().any(|(name, _)| c.name == *name) {
            problems.push(format!("unexpected column {}", c.name));
            if c.primary_key {
                problems.push(format!("column {} is part of the primary key", c.name));
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

/// `CREATE TABLE IF NOT EXISTS` of `shape`; `trailer` follows the column list (SQLite:
/// ` WITHOUT ROWID`).
pub(crate) fn create_sql(table: &TableName, shape: &ExpectedShape, trailer: &str) -> String {
    let columns: Vec<String> = shape
        .columns
        .iter()
        .map(|(name, ty)| format!("{name} {ty} NOT NULL"))
        .collect();
    format!(
        "CREATE TABLE IF NOT EXISTS {} ({}, PRIMARY KEY ({})){trailer}",
        table.quoted(),
        columns.join(", "),
        shape.primary_key.join(", ")
    )
}

/// The migration of an unattributed processed-messages table ([`is_unattributed`]) to
/// `shape`, every row attributed to `consumer`, in one transaction: rename it aside,
/// create the new table, copy, drop the old one.
pub(crate) fn migration_sql(
    table: &TableName,
    shape: &ExpectedShape,
    trailer: &str,
    consumer: &crate::ConsumerName,
) -> String {
    // At most 57 + 4 bytes: within PostgreSQL's identifier limit.
    let aside = format!("\"{}_old\"", table.as_str());
    format!(
        "BEGIN; ALTER TABLE {t} RENAME TO {aside}; {create}; \
         INSERT INTO {t} (consumer, message_id, processed_at) \
         SELECT {c}, message_id, processed_at FROM {aside}; DROP TABLE {aside}; COMMIT;",
        t = table.quoted(),
        create = create_sql(table, shape, trailer),
        c = consumer.literal(),
    )
}

/// True for the processed-messages table of tidings-sql before ids belonged to a
/// consumer: exactly `message_id` (the whole primary key) and `processed_at`, of the
/// types `shape` gives them.
pub(crate) fn is_unattributed(columns: &[ColumnInfo], shape: &ExpectedShape) -> bool {
    let has = |name: &str, pk: bool| {
        let ty = shape
            .columns
            .iter()
            .find(|(n, _)| *n == name)
            .map_or("", |(_, t)| *t);
        columns
            .iter()
            .any(|c| c.name == name && c.primary_key == pk && c.type_name.eq_ignore_ascii_case(ty))
    };
    columns.len() == 2 && has("message_id", true) && has("processed_at", false)
}

fn display_type(t: &str) -> &str {
    if t.is_empty() { "(none)" } else { t }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(TableName::new("processed_messages").is_ok());
        assert!(TableName::new("_x1").is_ok());
        assert_eq!(TableName::new(""), Err(TableNameError::Empty));
        assert!(matches!(
            TableName::new("1abc"),
            Err(TableNameError::BadStart { found: '1' })
        ));
        assert!(matches!(
            TableName::new("a; DROP TABLE x"),
            Err(TableNameError::BadChar { found: ';', at: 1 })
        ));
        assert!(matches!(
            TableName::new("a\"b"),
            Err(TableNameError::BadChar { found: '"', .. })
        ));
        assert!(matches!(
            TableName::new(&"a".repeat(58)),
            Err(TableNameError::TooLong { len: 58, max: 57 })
        ));
        assert!(matches!(
            TableName::new("sqlite_master"),
            Err(TableNameError::Reserved { .. })
        ));
        assert!(matches!(
            TableName::new("pg_class"),
            Err(TableNameError::Reserved { .. })
        ));
        assert!(matches!(
            TableName::new("tablé"),
            Err(TableNameError::BadChar { found: 'é', .. })
        ));
    }

    #[test]
    fn shapes() {
        let shape = ExpectedShape {
            columns: &[
                ("consumer", "text"),
                ("message_id", "text"),
                ("processed_at", "bigint"),
            ],
            primary_key: &["consumer", "message_id"],
        };
        let col = |name: &str, t: &str, pk| ColumnInfo {
            name: name.into(),
            type_name: t.into(),
            primary_key: pk,
        };
        let good = [
            col("consumer", "TEXT", true),
            col("message_id", "text", true),
            col("processed_at", "bigint", false),
        ];
        assert!(check_shape(&good, &shape).is_ok());
        assert!(!is_unattributed(&good, &shape));
        let e = check_shape(
            &[col("id", "integer", true), col("payload", "text", false)],
            &shape,
        )
        .unwrap_err();
        assert!(e.contains("message_id is missing"), "{e}");
        assert!(e.contains("unexpected column payload"), "{e}");
        assert!(e.contains("column id is part of the primary key"), "{e}");
        let old = [
            col("message_id", "text", true),
            col("processed_at", "bigint", false),
        ];
        assert!(is_unattributed(&old, &shape));
        assert!(!is_unattributed(
            &[
                col("message_id", "uuid", true),
                col("processed_at", "bigint", false)
            ],
            &shape
        ));
        let e = check_shape(&old, &shape).unwrap_err();
        assert!(e.contains("consumer is missing"), "{e}");
        let e = check_shape(
            &[
                col("consumer", "text", false),
                col("message_id", "integer", true),
                col("processed_at", "bigint", false),
            ],
            &shape,
        )
        .unwrap_err();
        assert!(e.contains("type integer, not text"), "{e}");
        assert!(e.contains("consumer is not part of the primary key"), "{e}");
        assert_eq!(
            expected_text(&shape),
            "expected exactly (consumer text NOT NULL, message_id text NOT NULL, \
             processed_at bigint NOT NULL, PRIMARY KEY (consumer, message_id))"
        );
    }
}
