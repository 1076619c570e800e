//! The plain walk: an NFA simulation over the trie, holding the set of live nodes after each
//! topic word (each node once), and the per-thread buffers it runs in.

use std::cell::Cell;

use super::super::Words;
use super::TopicTrie;
use super::entries::Lists;
use super::node::{NONE, ROOT, bloom_bit, edge_key};

thread_local! {
    /// The two live-node buffers of the match walk, reused across calls on this thread (taken
    /// out for the call, so a nested call from a callback just starts with empty ones).
    static LIVE: Cell<(Vec<u32>, Vec<u32>)> = const { Cell::new((Vec::new(), Vec::new())) };
}

/// This thread's live-node buffers, taken out for one match (a nested match gets empty ones).
pub(super) fn take_buffers() -> (Vec<u32>, Vec<u32>) {
    LIVE.with(Cell::take)
}

/// Hands the buffers back for the next match on this thread.
pub(super) fn return_buffers(bufs: (Vec<u32>, Vec<u32>)) {
    LIVE.with(|s| s.set(bufs));
}

impl<V> TopicTrie<V> {
    /// The live set before the first word: the root, and its `#` child (which may match zero
    /// words). Sorted, as every live set handed to the memo is.
    pub(super) fn start_set(&self, set: &mut Vec<u32>) {
        set.clear();
        set.push(ROOT);
        let h = self.nodes[ROOT as usize].hash;
        if h != NONE {
            set.push(h); // > ROOT
        }
    }

    /// One step of the walk: the live set after `word` from `cur`, into `next`. `word_id` is
    /// the word's id if already known (`Some(None)`: no edge uses the word); otherwise it is
    /// looked up only if some live node has literal children.
    ///
    /// Why no general duplicate check is needed: the trie is a tree, so a node entered through
    /// a word or `*` edge has one parent, which `cur` holds once; and only nodes reached
    /// through a `#` edge (`is_hash`) stay live across a word. So a node can be added twice
    /// only as the `#` child of a node just entered while it also stays, that is, while it is
    /// in `cur`; that one case is checked, against `cur` (a few nodes). Canonical patterns
    /// never put a `#` right after a `#`, so the closure is one level deep and a `#` node has
    /// no `#` child.
    #[inline]
    pub(super) fn step_set(
        &self,
        cur: &[u32],
        word: &str,
        mut word_id: Option<Option<u32>>,
        next: &mut Vec<u32>,
    ) {
        let nodes = &self.nodes[..];
        next.clear();
        for &id in cur {
            let node = &nodes[id as usize];
            // A `#` node consumes this word and stays.
            if node.is_hash {
                next.push(id);
            }
            if node.children != 0
                && let Some(w) =
                    *word_id.get_or_insert_with(|| self.words.get(word).map(|&(w, _)| w))
                && node.bloom & bloom_bit(w) != 0
                && let Some(&c) = self.edges.get(&edge_key(id, w))
            {
                next.push(c);
            }
            if node.star != NONE {
                next.push(node.star);
            }
        }
        // `#` children of what was just entered (they match zero more words), unless already
        // staying.
        let entered = next.len();
        for i in 0..entered {
            let h = nodes[next[i] as usize].hash;
            if h != NONE && !cur.contains(&h) {
                next.push(h);
            }
        }
    }

    /// The plain walk (an NFA simulation with the live set in `cur`, each node once) over
    /// `words`; pushes the entry lists of the final live nodes, in node order, onto `lists`.
    pub(super) fn walk_from<'a>(
        &'a self,
        cur: &mut Vec<u32>,
        next: &mut Vec<u32>,
        words: Words<'_>,
        lists: &mut Lists<'a, V>,
    ) {
        for word in words {
            self.step_set(cur, word, None, next);
            std::mem::swap(cur, next);
            if cur.is_empty() {
                return;
            }
        }
        // Node order, as the memo's finals, so both report the same value for an id that
        // several matching patterns share.
        cur.sort_unstable();
        for &i in cur.iter() {
            let e = &self.nodes[i as usize].entries;
            if !e.is_empty() {
                lists.push(e);
            }
        }
    }
}
