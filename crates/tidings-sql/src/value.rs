//! Parameters and results: [`Value`] and [`Row`], the same for every database.

use std::sync::Arc;

use crate::error::ColumnError;

/// A statement parameter or a result value.
///
/// # Mapping
/// | `Value`    | SQLite  | PostgreSQL (parameter may bind to)              |
/// |------------|---------|-------------------------------------------------|
/// | `Null`     | NULL    | NULL of any type                                |
/// | `Integer`  | INTEGER | `int2`, `int4`, `int8` (range-checked), `oid`   |
/// | `Real`     | REAL    | `float4`, `float8`                              |
/// | `Text`     | TEXT    | `text`, `varchar`, `bpchar`, `name`, untyped    |
/// | `Blob`     | BLOB    | `bytea`                                         |
/// | `Bool`     | INTEGER 0/1 | `bool`                                      |
///
/// Results come back the same way (SQLite never returns `Bool`). A PostgreSQL result
/// column of another type (numeric, timestamp, json, ...) is refused with
/// [`QueryError::UnsupportedType`](crate::QueryError::UnsupportedType): cast it in the
/// query (`amount::text`, `extract(epoch from t)::int8`).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Value {
    /// SQL NULL.
    Null,
    /// A 64-bit integer.
    Integer(i64),
    /// A double.
    Real(f64),
    /// UTF-8 text.
    Text(String),
    /// Bytes.
    Blob(Vec<u8>),
    /// A boolean.
    Bool(bool),
}

impl Value {
    pub(crate) fn type_name(&self) -> &'static str {
        match self {
            Value::Null => "NULL",
            Value::Integer(_) => "an integer",
            Value::Real(_) => "a real",
            Value::Text(_) => "text",
            Value::Blob(_) => "a blob",
            Value::Bool(_) => "a bool",
        }
    }
}

macro_rules! from_int {
    ($($t:ty),*) => {$(
        impl From<$t> for Value {
            fn from(v: $t) -> Self {
                Value::Integer(i64::from(v))
            }
        }
    )*};
}
from_int!(i8, i16, i32, i64, u8, u16, u32);

impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Value::Real(v)
    }
}
impl From<f32> for Value {
    fn from(v: f32) -> Self {
        Value::Real(f64::from(v))
    }
}
impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::Bool(v)
    }
}
impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Text(v.to_owned())
    }
}
impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::Text(v)
    }
}
impl From<&String> for Value {
    fn from(v: &String) -> Self {
        Value::Text(v.clone())
    }
}
impl From<Vec<u8>> for Value {
    fn from(v: Vec<u8>) -> Self {
        Value::Blob(v)
    }
}
impl From<&[u8]> for Value {
    fn from(v: &[u8]) -> Self {
        Value::Blob(v.to_vec())
    }
}
impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Self {
        v.map_or(Value::Null, Into::into)
    }
}

/// One result row: its values, in column order, and the column names.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    columns: Arc<[String]>,
    values: Vec<Value>,
}

impl Row {
    pub(crate) fn new(columns: Arc<[String]>, values: Vec<Value>) -> Self {
        Self { columns, values }
    }
    /// The values, in column order.
    #[must_use]
    pub fn values(&self) -> &[Value] {
        &self.values
    }
    /// The column names, in order.
    #[must_use]
    pub fn columns(&self) -> &[String] {
        &self.columns
    }
    /// The number of columns.
    #[must_use]
    pub fn len(&self) -> usize {
        self.values.len()
    }
    /// True for a row without columns.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
    /// The value of column `index`, if there is one.
    #[must_use]
    pub fn get(&self, index: usize) -> Option<&Value> {
        self.values.get(index)
    }

    fn at(&self, index: usize) -> Result<&Value, ColumnError> {
        self.values.get(index).ok_or(ColumnError::OutOfRange {
            index,
            len: self.values.len(),
        })
    }
    fn wrong(index: usize, wanted: &'static str, v: &Value) -> ColumnError {
        ColumnError::WrongType {
            index,
            wanted,
            found: v.type_name(),
        }
    }

    /// Column `index` as an integer (a `Bool` reads as 0/1).
    ///
    /// # Errors
    /// No such column, or another type (NULL included).
    pub fn integer(&self, index: usize) -> Result<i64, ColumnError> {
        match self.at(index)? {
            Value::Integer(v) => Ok(*v),
            Value::Bool(b) => Ok(i64::from(*b)),
            v => Err(Self::wrong(index, "an integer", v)),
        }
    }
    /// Column `index` as a real (an integer converts).
    ///
    /// # Errors
    /// No such column, or another type (NULL included).
    #[allow(clippy::cast_precision_loss)] // documented: an integer converts
    pub fn real(&self, index: usize) -> Result<f64, ColumnError> {
        match self.at(index)? {
            Value::Real(v) => Ok(*v),
            Value::Integer(v) => Ok(*v as f64),
            v => Err(Self::wrong(index, "a real", v)),
        }
    }
    /// Column `index` as text.
    ///
    /// # Errors
    /// No such column, or another type (NULL included).
    pub fn text(&self, index: usize) -> Result<&str, ColumnError> {
        match self.at(index)? {
            Value::Text(v) => Ok(v),
            v => Err(Self::wrong(index, "text", v)),
        }
    }
    /// Column `index` as bytes.
    ///
    /// # Errors
    /// No such column, or another type (NULL included).
    pub fn blob(&self, index: usize) -> Result<&[u8], ColumnError> {
        match self.at(index)? {
            Value::Blob(v) => Ok(v),
            v => Err(Self::wrong(index, "a blob", v)),
        }
    }
    /// Column `index` as a bool (an integer reads as `!= 0`).
    ///
    /// # Errors
    /// No such column, or another type (NULL included).
    pub fn bool(&self, index: usize) -> Result<bool, ColumnError> {
        match self.at(index)? {
            Value::Bool(v) => Ok(*v),
            Value::Integer(v) => Ok(*v != 0),
            v => Err(Self::wrong(index, "a bool", v)),
        }
    }
    /// True when column `index` is NULL.
    ///
    /// # Errors
    /// No such column.
    pub fn is_null(&self, index: usize) -> Result<bool, ColumnError> {
        Ok(matches!(self.at(index)?, Value::Null))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accessors() {
        let row = Row::new(
            vec!["a".to_owned(), "b".to_owned(), "c".to_owned()].into(),
            vec![Value::from(7), Value::from("x"), Value::from(None::<i64>)],
        );
        assert_eq!(row.integer(0), Ok(7));
        assert_eq!(row.text(1), Ok("x"));
        assert_eq!(row.is_null(2), Ok(true));
        assert_eq!(
            row.integer(1),
            Err(ColumnError::WrongType {
                index: 1,
                wanted: "an integer",
                found: "text"
            })
        );
        assert_eq!(
            row.text(3),
            Err(ColumnError::OutOfRange { index: 3, len: 3 })
        );
        assert_eq!(row.columns()[2], "c");
    }
}
