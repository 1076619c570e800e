//! Temporary exact-match stand-in until the trie lands.
#![allow(missing_docs, dead_code)]
use std::collections::BTreeMap;
use std::sync::Arc;

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TopicError {
    #[error("empty topic")]
    Empty,
    #[error("wildcard in topic")]
    Wildcard,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Topic(Arc<str>);
impl Topic {
    pub fn new(s: &str) -> Result<Self, TopicError> {
        if s.is_empty() { return Err(TopicError::Empty) }
        if s.contains('*') || s.contains('#') { return Err(TopicError::Wildcard) }
        Ok(Topic(s.into()))
    }
    pub fn as_str(&self) -> &str { &self.0 }
}
impl std::fmt::Display for Topic { fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str(&self.0) } }
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Pattern(Arc<str>);
impl Pattern {
    pub fn new(s: &str) -> Result<Self, TopicError> { if s.is_empty() { return Err(TopicError::Empty) } Ok(Pattern(s.into())) }
    pub fn as_str(&self) -> &str { &self.0 }
}
impl std::fmt::Display for Pattern { fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str(&self.0) } }
pub mod trie {
    use super::*;
    pub struct TopicTrie<V> { map: BTreeMap<(Arc<str>, u64), V> }
    impl<V> Default for TopicTrie<V> { fn default() -> Self { Self { map: BTreeMap::new() } } }
    impl<V> TopicTrie<V> {
        pub fn new() -> Self { Self::default() }
        pub fn insert(&mut self, p: &Pattern, id: u64, v: V) { self.map.insert((p.0.clone(), id), v); }
        pub fn remove(&mut self, p: &Pattern, id: u64) -> Option<V> { self.map.remove(&(p.0.clone(), id)) }
        pub fn for_each_match(&self, t: &Topic, mut f: impl FnMut(u64, &V)) { for ((p, id), v) in &self.map { if **p == *t.0 { f(*id, v) } } }
        pub fn len(&self) -> usize { self.map.len() }
    }
}
