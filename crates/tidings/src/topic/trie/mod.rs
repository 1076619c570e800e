//! [`TopicTrie`]: many patterns, one topic, all matches (R-RT-1).
//!
//! The pieces, one file each: `node.rs` (the arena's nodes and edge keys), `canonical.rs`
//! (equivalent patterns made one trie path), `entries.rs` (id-sorted entry lists and their
//! merge), `walk.rs` (the NFA walk over live nodes) and `memo.rs` (that walk through the
//! per-thread DFA of `topic/dfa.rs`).

use std::collections::HashMap;
use std::fmt;

use foldhash::fast::RandomState;

use super::dfa::{self, NO_WORD};
use super::{MAX_WORDS, Pattern, Topic};

mod canonical;
mod entries;
mod memo;
mod node;
mod walk;

#[cfg(test)]
mod tests;

use canonical::{Seg, canonical};
use entries::{Entries, Lists, report, sorted_insert, sorted_remove};
use node::{NONE, Node, ROOT, bloom_bit, edge_key};

/// A router from subscription [`Pattern`]s to values, answering "which subscriptions match this
/// topic?" with AMQP 0-9-1 topic-exchange semantics (R-RT-1).
///
/// Each entry is keyed by `(pattern, id)`; `id` is the caller's identifier (for example a
/// subscription id) and `V` whatever the caller routes to.
///
/// # Cost
///
/// * Literal patterns (no wildcard) live in a hash map keyed by the whole topic: matching them is
///   one hash lookup, whatever their number.
/// * Wildcard patterns live in a trie over words. Matching looks each topic word up once in a
///   table of the words used by wildcard patterns, then walks the trie keeping the set of live
///   nodes (an NFA simulation with duplicate states merged), one integer-keyed edge lookup per
///   live node and word. So the cost grows with the topic's depth and the number of matching
///   patterns, never with the number of patterns. When no wildcard pattern is stored the walk
///   is skipped.
/// * The walk is memoised per thread: each set of live nodes seen becomes a state of a lazily
///   built DFA, and each step taken a transition `(state, word) → state`. A step already taken
///   on this thread since the trie last changed costs one word-id lookup and one transition
///   lookup, whatever the number of live nodes. Any insert or remove of a wildcard pattern
///   bumps the trie's epoch, which empties the memo before its next use, so answers are always
///   those of the walk on the trie as it is. The memo also remembers whole topics (up to 8,192
///   per trie and thread) and the state they end in: a topic matched again on this thread since
///   the trie last changed costs one lookup of the topic, whatever its number of words. The
///   memo is bounded (a few MiB per thread at the very worst, two tries per thread); when full,
///   matching walks the steps it does not know, and forgets some topics to take new ones. A
///   full memo that answers few topics whole (topics too many and too varied for it) is
///   emptied and left unused for a while, so such topics pay the walk alone, not the walk plus
///   lookups that miss.
/// * Matching reuses two per-thread buffers for the live nodes (they grow to the largest live
///   set seen on the thread, and a match nested in a callback gets fresh ones), and allocates
///   only when more than 8 distinct patterns' entry lists must be merged.
///
/// # Equivalent patterns
///
/// Patterns are stored in a canonical form: inside a run of consecutive wildcards, the `*`s come
/// first and repeated `#`s collapse into one (`#.#` → `#`, `#.*` → `*.#`, `#.*.#` → `*.#`).
/// These rewrites never change which topics match, but they make equivalent patterns the same
/// key: `insert(#.#, 7, ..)` then `insert(#, 7, ..)` replaces the first value, and
/// `remove(#, 7)` removes it.
///
/// # Order
///
/// [`for_each_match`](Self::for_each_match) reports matches in **ascending id** order, each id
/// once, which makes routing deterministic for a given set of entries.
///
/// # Capacity
///
/// Trie nodes are numbered with `u32`; more than about four billion nodes (far beyond any
/// memory this would fit in) panics.
pub struct TopicTrie<V> {
    /// Literal patterns: full topic → entries sorted by id.
    literal: HashMap<Box<str>, Entries<V>, RandomState>,
    /// Words used by wildcard-trie edges → (word id, number of edges using it).
    words: HashMap<Box<str>, (u32, u32), RandomState>,
    /// Word ids released by `words`, for reuse.
    free_words: Vec<u32>,
    /// Next never-used word id.
    next_word: u32,
    /// Literal-word edges of the trie: `edge_key(parent, word id)` → child node.
    edges: HashMap<u64, u32, RandomState>,
    /// Trie nodes; index 0 is the root. Freed nodes are reset and listed in `free_nodes`.
    nodes: Vec<Node<V>>,
    free_nodes: Vec<u32>,
    /// Number of entries in the trie (wildcard patterns).
    wild_len: usize,
    /// Number of entries in `literal`.
    literal_len: usize,
    /// This trie's identity for the per-thread walk memo (unique in the process).
    uid: u64,
    /// Bumped by every change of the wildcard side: memoised steps of other epochs are void.
    epoch: u64,
}

impl<V> Default for TopicTrie<V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<V> fmt::Debug for TopicTrie<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TopicTrie")
            .field("literal_entries", &self.literal_len)
            .field("wildcard_entries", &self.wild_len)
            .field("trie_nodes", &(self.nodes.len() - self.free_nodes.len()))
            .finish_non_exhaustive()
    }
}

impl<V> TopicTrie<V> {
    /// An empty router.
    #[must_use]
    pub fn new() -> Self {
        Self {
            literal: HashMap::default(),
            words: HashMap::default(),
            free_words: Vec::new(),
            next_word: 0,
            edges: HashMap::default(),
            nodes: vec![Node::new(false)],
            free_nodes: Vec::new(),
            wild_len: 0,
            literal_len: 0,
            uid: dfa::next_uid(),
            epoch: 0,
        }
    }

    /// Number of `(pattern, id)` entries (equivalent patterns count once per id).
    #[must_use]
    pub fn len(&self) -> usize {
        self.literal_len + self.wild_len
    }

    /// True when there are no entries.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Removes every entry.
    pub fn clear(&mut self) {
        *self = Self::new();
    }

    fn alloc_node(&mut self, is_hash: bool) -> u32 {
        if let Some(i) = self.free_nodes.pop() {
            self.nodes[i as usize] = Node::new(is_hash);
            i
        } else {
            let i = u32::try_from(self.nodes.len()).expect("more than u32::MAX trie nodes");
            self.nodes.push(Node::new(is_hash));
            i
        }
    }

    /// The id of `word`, interned if new; counts one more edge using it.
    fn intern(&mut self, word: &str) -> u32 {
        if let Some(slot) = self.words.get_mut(word) {
            slot.1 += 1;
            return slot.0;
        }
        let id = self.free_words.pop().unwrap_or_else(|| {
            let id = self.next_word;
            // `NO_WORD` (u32::MAX) is never a real word's id.
            self.next_word = self
                .next_word
                .checked_add(1)
                .filter(|&n| n < NO_WORD)
                .expect("more than u32::MAX - 1 words");
            id
        });
        self.words.insert(word.into(), (id, 1));
        id
    }

    fn release_word(&mut self, word: &str) {
        if let Some(slot) = self.words.get_mut(word) {
            slot.1 -= 1;
            if slot.1 == 0 {
                let id = slot.0;
                self.words.remove(word);
                self.free_words.push(id);
            }
        }
    }

    /// The child of `node` along `seg`, if it exists.
    #[inline]
    fn step(&self, node: u32, seg: Seg<'_>) -> Option<u32> {
        let n = &self.nodes[node as usize];
        let child = match seg {
            Seg::Star => n.star,
            Seg::Hash => n.hash,
            Seg::Word(w) => {
                let &(word, _) = self.words.get(w)?;
                *self.edges.get(&edge_key(node, word))?
            }
        };
        (child != NONE).then_some(child)
    }

    /// The node a canonical pattern ends at, if it exists.
    fn find(&self, segs: &[Seg<'_>]) -> Option<u32> {
        segs.iter()
            .try_fold(ROOT, |node, &seg| self.step(node, seg))
    }

    /// Stores `value` for `(pattern, id)`. If that key (up to pattern equivalence, see the type
    /// docs) was already present its value is replaced and the old one returned.
    pub fn insert(&mut self, pattern: &Pattern, id: u64, value: V) -> Option<V> {
        if pattern.is_literal() {
            let list = match self.literal.get_mut(pattern.as_str()) {
                Some(list) => list,
                None => self.literal.entry(pattern.as_str().into()).or_default(),
            };
            let old = sorted_insert(list, id, value);
            if old.is_none() {
                self.literal_len += 1;
            }
            return old;
        }
        // Nodes, edges, word ids or entry lists may change: void the memoised walk.
        self.epoch = self.epoch.wrapping_add(1);
        let (segs, n) = canonical(pattern);
        let mut node = ROOT;
        for &seg in &segs[..n] {
            if let Some(child) = self.step(node, seg) {
                node = child;
                continue;
            }
            let child = self.alloc_node(seg == Seg::Hash);
            match seg {
                Seg::Star => self.nodes[node as usize].star = child,
                Seg::Hash => self.nodes[node as usize].hash = child,
                Seg::Word(w) => {
                    let word = self.intern(w);
                    self.edges.insert(edge_key(node, word), child);
                    let parent = &mut self.nodes[node as usize];
                    parent.children += 1;
                    parent.bloom |= bloom_bit(word);
                }
            }
            node = child;
        }
        let old = sorted_insert(&mut self.nodes[node as usize].entries, id, value);
        if old.is_none() {
            self.wild_len += 1;
        }
        old
    }

    /// Removes `(pattern, id)` and returns its value, pruning nodes left empty. `None` when absent.
    pub fn remove(&mut self, pattern: &Pattern, id: u64) -> Option<V> {
        if pattern.is_literal() {
            let list = self.literal.get_mut(pattern.as_str())?;
            let old = sorted_remove(list, id)?;
            if list.is_empty() {
                self.literal.remove(pattern.as_str());
            }
            self.literal_len -= 1;
            return Some(old);
        }
        let (segs, n) = canonical(pattern);
        let segs = &segs[..n];
        // path[i] is the node reached after segs[..i].
        let mut path = [ROOT; MAX_WORDS + 1];
        for (i, &seg) in segs.iter().enumerate() {
            path[i + 1] = self.step(path[i], seg)?;
        }
        let old = sorted_remove(&mut self.nodes[path[n] as usize].entries, id)?;
        self.wild_len -= 1;
        // Entry lists, and below nodes, edges and word ids change: void the memoised walk.
        // (Memoised steps would stay right until the next insert, which reuses freed ids and
        // bumps the epoch itself; voiding here keeps the argument to "same epoch, same trie".)
        self.epoch = self.epoch.wrapping_add(1);
        // Prune from the end while nodes are empty.
        for i in (0..n).rev() {
            let (parent, child) = (path[i], path[i + 1]);
            if !self.nodes[child as usize].is_empty() {
                break;
            }
            match segs[i] {
                Seg::Star => self.nodes[parent as usize].star = NONE,
                Seg::Hash => self.nodes[parent as usize].hash = NONE,
                Seg::Word(w) => {
                    if let Some(&(word, _)) = self.words.get(w) {
                        self.edges.remove(&edge_key(parent, word));
                    }
                    self.release_word(w);
                    self.nodes[parent as usize].children -= 1;
                }
            }
            self.nodes[child as usize] = Node::new(false);
            self.free_nodes.push(child);
        }
        if self.wild_len == 0 {
            // Everything is empty again: drop the arena's and tables' memory too.
            self.nodes.truncate(1);
            self.free_nodes.clear();
            self.free_words.clear();
            self.next_word = 0;
        }
        Some(old)
    }

    /// The value stored for `(pattern, id)`, if any (up to pattern equivalence).
    #[must_use]
    pub fn get(&self, pattern: &Pattern, id: u64) -> Option<&V> {
        let list = if pattern.is_literal() {
            self.literal.get(pattern.as_str())?
        } else {
            let (segs, n) = canonical(pattern);
            &self.nodes[self.find(&segs[..n])? as usize].entries
        };
        let i = list.binary_search_by_key(&id, |e| e.0).ok()?;
        Some(&list[i].1)
    }

    /// The value with the lowest id stored under `pattern` (up to pattern equivalence), if
    /// any: what a caller holding many values per pattern can share between them.
    #[must_use]
    pub fn first(&self, pattern: &Pattern) -> Option<&V> {
        let list = if pattern.is_literal() {
            self.literal.get(pattern.as_str())?
        } else {
            let (segs, n) = canonical(pattern);
            &self.nodes[self.find(&segs[..n])? as usize].entries
        };
        list.first().map(|(_, v)| v)
    }

    /// Mutable access to the value stored for `(pattern, id)`, if any.
    pub fn get_mut(&mut self, pattern: &Pattern, id: u64) -> Option<&mut V> {
        let list = if pattern.is_literal() {
            self.literal.get_mut(pattern.as_str())?
        } else {
            let (segs, n) = canonical(pattern);
            let node = self.find(&segs[..n])?;
            &mut self.nodes[node as usize].entries
        };
        let i = list.binary_search_by_key(&id, |e| e.0).ok()?;
        Some(&mut list[i].1)
    }

    /// Calls `f(id, value)` once for every id with a pattern matching `topic`, in ascending id
    /// order.
    ///
    /// If the same id was inserted under several non-equivalent patterns that all match, `f` is
    /// still called once for it, with the value of one of them (the literal pattern's if any,
    /// otherwise a deterministic choice).
    pub fn for_each_match(&self, topic: &Topic, mut f: impl FnMut(u64, &V)) {
        let literal = if self.literal_len == 0 {
            None
        } else {
            self.literal.get(topic.as_str()).map(Entries::as_slice)
        };
        if self.wild_len == 0 {
            for (id, v) in literal.into_iter().flatten() {
                f(*id, v);
            }
            return;
        }

        let mut lists: Lists<'_, V> = Lists::new();
        if let Some(l) = literal {
            lists.push(l);
        }
        let mut bufs = None;
        let memoised = dfa::with(self.uid, self.epoch, |d| {
            self.walk_memoised(d, topic, &mut bufs, &mut lists);
        });
        if memoised.is_none() {
            let (a, b) = bufs.get_or_insert_with(walk::take_buffers);
            self.start_set(a);
            self.walk_from(a, b, topic.words(), &mut lists);
        }
        // Hand the buffers back before running callbacks (which may match again).
        if let Some(bufs) = bufs {
            walk::return_buffers(bufs);
        }
        report(&mut lists, f);
    }

    /// Whether any pattern matches `topic`.
    #[must_use]
    pub fn matches_any(&self, topic: &Topic) -> bool {
        let mut any = false;
        self.for_each_match(topic, |_, _| any = true);
        any
    }
}
