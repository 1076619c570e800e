//! The processed-messages table: its validated name and the shape tidings expects.

use std::fmt;

use crate::error::TableNameError;

/// The longest table name accepted: PostgreSQL's identifier limit (63 bytes).
pub const MAX_TABLE_NAME_LEN: usize = 63;

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

/// What the two columns must look like in one database's spelling (lower case).
pub(crate) struct ExpectedShape {
    pub id_type: &'static str,
    pub at_type: &'static str,
}

/// The description of the expected shape, for error messages.
pub(crate) fn expected_text(shape: &ExpectedShape) -> String {
    format!(
        "expected exactly (message_id {} PRIMARY KEY, processed_at {} NOT NULL)",
        shape.id_type, shape.at_type
    )
}

/// `Ok` when `columns` are the processed-messages shape; otherwise what is wrong.
pub(crate) fn check_shape(columns: &[ColumnInfo], shape: &ExpectedShape) -> Result<(), String> {
    let mut problems = Vec::new();
    let find = |name: &str| columns.iter().find(|c| c.name == name);
    match find("message_id") {
        None => problems.push("column message_id is missing".to_owned()),
        Some(c) => {
            if !c.type_name.eq_ignore_ascii_case(shape.id_type) {
                problems.push(format!(
                    "column message_id has type {}, not {}",
                    display_type(&c.type_name),
                    shape.id_type
                ));
            }
            if !c.primary_key {
                problems.push("column message_id is not the primary key".to_owned());
            }
        }
    }
    match find("processed_at") {
        None => problems.push("column processed_at is missing".to_owned()),
        Some(c) => {
            if !c.type_name.eq_ignore_ascii_case(shape.at_type) {
                problems.push(format!(
                    "column processed_at has type {}, not {}",
                    display_type(&c.type_name),
                    shape.at_type
                ));
            }
        }
    }
    for c in columns {
        if c.name != "message_id" && c.name != "processed_at" {
            problems.push(format!("unexpected column {}", c.name));
        }
        if c.primary_key && c.name != "message_id" {
            problems.push(format!("column {} is part of the primary key", c.name));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
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
            TableName::new(&"a".repeat(64)),
            Err(TableNameError::TooLong { len: 64, max: 63 })
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
            id_type: "text",
            at_type: "bigint",
        };
        let col = |name: &str, t: &str, pk| ColumnInfo {
            name: name.into(),
            type_name: t.into(),
            primary_key: pk,
        };
        assert!(
            check_shape(
                &[
                    col("message_id", "TEXT", true),
                    col("processed_at", "bigint", false)
                ],
                &shape
            )
            .is_ok()
        );
        let e = check_shape(
            &[col("id", "integer", true), col("payload", "text", false)],
            &shape,
        )
        .unwrap_err();
        assert!(e.contains("message_id is missing"), "{e}");
        assert!(e.contains("unexpected column payload"), "{e}");
        let e = check_shape(
            &[
                col("message_id", "integer", false),
                col("processed_at", "bigint", false),
            ],
            &shape,
        )
        .unwrap_err();
        assert!(e.contains("type integer, not text"), "{e}");
        assert!(e.contains("not the primary key"), "{e}");
    }
}
