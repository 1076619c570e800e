//! Temporary stand-in until the header filter lands.
#![allow(missing_docs, dead_code)]
pub trait HeaderLookup { fn header(&self, name: &str) -> Option<&str>; }
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum HeaderFilter { Equals { name: String, value: String } }
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum FilterError { #[error("bad")] Bad }
impl HeaderFilter {
    pub fn matches(&self, h: &dyn HeaderLookup) -> bool { match self { Self::Equals { name, value } => h.header(name) == Some(value.as_str()) } }
    pub fn validate(&self) -> Result<(), FilterError> { Ok(()) }
}
