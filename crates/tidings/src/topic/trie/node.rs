//! A node of the wildcard trie, and the keys of its literal-word edges.
//!
//! Nodes live in an arena (`TopicTrie::nodes`) and are named by `u32` index; `*` and `#`
//! children are fields of the node, literal-word children are entries of the trie's edge map
//! keyed by [`edge_key`], so a node stays a few words whatever its fan-out.

use super::entries::Entries;

/// "No node": the root (0) is never anybody's child.
pub(super) const NONE: u32 = 0;
/// The root node: index 0 of the arena, never freed.
pub(super) const ROOT: u32 = 0;

/// One trie node: the entries ending here and the wildcard children.
pub(super) struct Node<V> {
    /// Entries whose (canonical) pattern ends here, sorted by id.
    pub(super) entries: Entries<V>,
    /// Child through `*`, or `NONE`.
    pub(super) star: u32,
    /// Child through `#`, or `NONE`.
    pub(super) hash: u32,
    /// Number of literal-word edges from this node.
    pub(super) children: u32,
    /// Bit `word_id % 64` is set for every literal-word edge ever added since the node was
    /// created (a superset after removals): lets the walk skip most edge lookups that would miss.
    pub(super) bloom: u64,
    /// This node was reached through a `#` edge, so it may consume any number of further words.
    pub(super) is_hash: bool,
}

impl<V> Node<V> {
    /// A fresh node (also what a freed arena slot is reset to).
    pub(super) fn new(is_hash: bool) -> Self {
        Self {
            entries: Entries::new(),
            star: NONE,
            hash: NONE,
            children: 0,
            bloom: 0,
            is_hash,
        }
    }

    /// Nothing ends here and nothing hangs below: the node can be pruned.
    pub(super) fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.star == NONE && self.hash == NONE && self.children == 0
    }
}

/// The bit of `Node::bloom` standing for `word`.
#[inline]
pub(super) fn bloom_bit(word: u32) -> u64 {
    1 << (word % 64)
}

/// The key of the literal-word edge from `parent` through `word` in the trie's edge map.
#[inline]
pub(super) fn edge_key(parent: u32, word: u32) -> u64 {
    (u64::from(parent) << 32) | u64::from(word)
}
