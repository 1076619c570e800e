//! [`TopicTrie`]: many patterns, one topic, all matches (R-RT-1).

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, Hasher};

use super::dfa::{self, Dfa, NO_WORD, Word};
use super::{HASH, MAX_WORDS, Pattern, STAR, Topic};

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
///   matching walks the steps it does not know, and forgets some topics to take new ones.
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
    literal: HashMap<Box<str>, Vec<(u64, V)>, FastState>,
    /// Words used by wildcard-trie edges → (word id, number of edges using it).
    words: HashMap<Box<str>, (u32, u32), FastState>,
    /// Word ids released by `words`, for reuse.
    free_words: Vec<u32>,
    /// Next never-used word id.
    next_word: u32,
    /// Literal-word edges of the trie: `edge_key(parent, word id)` → child node.
    edges: HashMap<u64, u32, FastState>,
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

/// "No node": the root (0) is never anybody's child.
const NONE: u32 = 0;
const ROOT: u32 = 0;

struct Node<V> {
    /// Entries whose (canonical) pattern ends here, sorted by id.
    entries: Vec<(u64, V)>,
    /// Child through `*`, or `NONE`.
    star: u32,
    /// Child through `#`, or `NONE`.
    hash: u32,
    /// Number of literal-word edges from this node.
    children: u32,
    /// Bit `word_id % 64` is set for every literal-word edge ever added since the node was
    /// created (a superset after removals): lets the walk skip most edge lookups that would miss.
    bloom: u64,
    /// This node was reached through a `#` edge, so it may consume any number of further words.
    is_hash: bool,
}

impl<V> Node<V> {
    fn new(is_hash: bool) -> Self {
        Self {
            entries: Vec::new(),
            star: NONE,
            hash: NONE,
            children: 0,
            bloom: 0,
            is_hash,
        }
    }

    fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.star == NONE && self.hash == NONE && self.children == 0
    }
}

#[inline]
fn bloom_bit(word: u32) -> u64 {
    1 << (word % 64)
}

#[inline]
fn edge_key(parent: u32, word: u32) -> u64 {
    (u64::from(parent) << 32) | u64::from(word)
}

/// A fast seeded hasher for short keys (folded 64×64→128 multiply, as in foldhash). The seed is
/// drawn once per process from std's random source, so colliding keys cannot be precomputed.
#[derive(Clone, Copy)]
pub(crate) struct FastState(u64);

impl Default for FastState {
    fn default() -> Self {
        use std::sync::OnceLock;
        static SEED: OnceLock<u64> = OnceLock::new();
        Self(*SEED.get_or_init(|| std::collections::hash_map::RandomState::new().hash_one(0u64)))
    }
}

impl BuildHasher for FastState {
    type Hasher = FastHasher;

    #[inline]
    fn build_hasher(&self) -> FastHasher {
        FastHasher(self.0)
    }
}

pub(crate) struct FastHasher(u64);

const MUL: u64 = 0x9E37_79B9_7F4A_7C15;
const MUL2: u64 = 0xA076_1D64_78BD_642F;

#[inline]
fn fold_mul(a: u64, b: u64) -> u64 {
    let full = u128::from(a) * u128::from(b);
    (full as u64) ^ ((full >> 64) as u64)
}

impl Hasher for FastHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        // Word-sized reads only (no byte copies into a buffer, which stall store forwarding);
        // short inputs are read as (possibly overlapping) head and tail, as in wyhash/foldhash.
        let len = bytes.len();
        let (a, b) = if len <= 16 {
            if len >= 8 {
                (read_u64(bytes, 0), read_u64(bytes, len - 8))
            } else if len >= 4 {
                (
                    u64::from(read_u32(bytes, 0)),
                    u64::from(read_u32(bytes, len - 4)),
                )
            } else if len > 0 {
                (
                    (u64::from(bytes[0]) << 16) | (u64::from(bytes[len / 2]) << 8),
                    u64::from(bytes[len - 1]),
                )
            } else {
                (0, 0)
            }
        } else {
            let mut h = self.0;
            let mut i = 0;
            while i + 16 < len {
                h = fold_mul(read_u64(bytes, i) ^ h, read_u64(bytes, i + 8) ^ MUL);
                i += 16;
            }
            self.0 = h;
            (read_u64(bytes, len - 16), read_u64(bytes, len - 8))
        };
        self.0 = fold_mul(a ^ self.0, b ^ MUL ^ len as u64);
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.0 = fold_mul(self.0 ^ u64::from(i), MUL);
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.0 = fold_mul(self.0 ^ i, MUL);
    }

    #[inline]
    fn finish(&self) -> u64 {
        fold_mul(self.0, MUL2)
    }
}

#[inline]
fn read_u64(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

#[inline]
fn read_u32(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

/// One step of a canonical pattern.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Seg<'a> {
    Word(&'a str),
    Star,
    Hash,
}

/// Canonical segments of `pattern` (see the type docs): within each run of wildcards, `k` stars
/// then at most one hash. Returns the fixed array and its used length.
fn canonical(pattern: &Pattern) -> ([Seg<'_>; MAX_WORDS], usize) {
    let mut out = [Seg::Star; MAX_WORDS];
    let mut n = 0;
    let mut stars = 0;
    let mut hash = false;
    let mut push = |seg, n: &mut usize| {
        // Validation caps patterns at MAX_WORDS words and canonicalisation never lengthens.
        if let Some(slot) = out.get_mut(*n) {
            *slot = seg;
            *n += 1;
        }
    };
    for w in pattern.words() {
        if w == STAR {
            stars += 1;
        } else if w == HASH {
            hash = true;
        } else {
            for _ in 0..stars {
                push(Seg::Star, &mut n);
            }
            if hash {
                push(Seg::Hash, &mut n);
            }
            stars = 0;
            hash = false;
            push(Seg::Word(w), &mut n);
        }
    }
    for _ in 0..stars {
        push(Seg::Star, &mut n);
    }
    if hash {
        push(Seg::Hash, &mut n);
    }
    (out, n)
}

/// Inserts into a list sorted by id; returns the value replaced.
fn sorted_insert<V>(list: &mut Vec<(u64, V)>, id: u64, value: V) -> Option<V> {
    match list.binary_search_by_key(&id, |e| e.0) {
        Ok(i) => Some(std::mem::replace(&mut list[i].1, value)),
        Err(i) => {
            list.insert(i, (id, value));
            None
        }
    }
}

fn sorted_remove<V>(list: &mut Vec<(u64, V)>, id: u64) -> Option<V> {
    let i = list.binary_search_by_key(&id, |e| e.0).ok()?;
    Some(list.remove(i).1)
}

/// A vector with `N` inline slots before it spills to the heap (no `unsafe`: the inline array
/// is pre-filled with a caller-supplied placeholder).
struct Buf<T: Copy, const N: usize> {
    inline: [T; N],
    len: usize,
    heap: Vec<T>,
}

impl<T: Copy, const N: usize> Buf<T, N> {
    #[inline]
    fn new(fill: T) -> Self {
        Self {
            inline: [fill; N],
            len: 0,
            heap: Vec::new(),
        }
    }

    #[inline]
    fn push(&mut self, x: T) {
        if self.heap.is_empty() && self.len < N {
            self.inline[self.len] = x;
            self.len += 1;
        } else {
            if self.heap.is_empty() {
                self.heap.extend_from_slice(&self.inline[..self.len]);
            }
            self.heap.push(x);
        }
    }

    #[inline]
    fn as_mut_slice(&mut self) -> &mut [T] {
        if self.heap.is_empty() {
            &mut self.inline[..self.len]
        } else {
            &mut self.heap
        }
    }
}

thread_local! {
    /// The two live-node buffers of the match walk, reused across calls on this thread (taken
    /// out for the call, so a nested call from a callback just starts with empty ones).
    static LIVE: std::cell::Cell<(Vec<u32>, Vec<u32>)> = const { std::cell::Cell::new((Vec::new(), Vec::new())) };
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

    /// The live set before the first word: the root, and its `#` child (which may match zero
    /// words). Sorted, as every live set handed to the memo is.
    fn start_set(&self, set: &mut Vec<u32>) {
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
    fn step_set(
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
    fn walk_from<'a>(
        &'a self,
        cur: &mut Vec<u32>,
        next: &mut Vec<u32>,
        words: super::Words<'_>,
        lists: &mut Buf<&'a [(u64, V)], 8>,
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

    /// What the memo stores with a live set: its nodes holding entries, and whether the next
    /// word's id matters (some node has literal children).
    fn describe(&self, set: &[u32]) -> (Box<[u32]>, bool) {
        let finals = set
            .iter()
            .copied()
            .filter(|&i| !self.nodes[i as usize].entries.is_empty())
            .collect();
        let needs_word = set.iter().any(|&i| self.nodes[i as usize].children != 0);
        (finals, needs_word)
    }

    /// The walk through this thread's memo `d` (see the type docs): known steps are one lookup;
    /// an unknown step is walked and remembered; once the memo is full the rest is walked. The
    /// live-set buffers are taken from `bufs` (filled from the per-thread ones on first need:
    /// a topic whose steps are all known needs none).
    fn walk_memoised<'a>(
        &'a self,
        d: &mut Dfa,
        topic: &Topic,
        bufs: &mut Option<(Vec<u32>, Vec<u32>)>,
        lists: &mut Buf<&'a [(u64, V)], 8>,
    ) {
        if let Some(end) = d.topic(topic.as_str()) {
            for &i in d.state(end).finals.iter() {
                lists.push(&self.nodes[i as usize].entries);
            }
            return;
        }
        let mut words = topic.words();
        let start = match d.start() {
            Some(s) => Some(s),
            None => {
                let (a, _) = bufs.get_or_insert_with(|| LIVE.with(std::cell::Cell::take));
                self.start_set(a);
                d.state_for(a, || self.describe(a))
            }
        };
        let Some(mut state) = start else {
            let (a, b) = bufs.get_or_insert_with(|| LIVE.with(std::cell::Cell::take));
            self.start_set(a);
            return self.walk_from(a, b, words, lists);
        };
        while let Some(word) = words.next() {
            if state.is_dead() {
                // Nothing can match any more.
                d.learn_topic(topic, state);
                return;
            }
            let id = || self.words.get(word).map_or(NO_WORD, |&(w, _)| w);
            let key = if state.needs_word() {
                Word::of(word, id)
            } else {
                Word::Id(NO_WORD)
            };
            if let Some(next) = d.step(state, key) {
                state = next;
                continue;
            }
            // A step not taken before: walk it, then remember it.
            let (a, b) = bufs.get_or_insert_with(|| LIVE.with(std::cell::Cell::take));
            self.step_set(&d.state(state).nodes, word, None, b);
            b.sort_unstable();
            match d.state_for(b, || self.describe(b)) {
                Some(next) if d.learn(state, key, next) => state = next,
                _ => {
                    // Full (and possibly emptied): walk the rest from the set just computed.
                    std::mem::swap(a, b);
                    if a.is_empty() {
                        return;
                    }
                    return self.walk_from(a, b, words, lists);
                }
            }
        }
        // Every step was known or learnt: no state id went stale, and the topic may be
        // remembered whole.
        d.learn_topic(topic, state);
        for &i in d.state(state).finals.iter() {
            lists.push(&self.nodes[i as usize].entries);
        }
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
            self.literal.get(topic.as_str()).map(Vec::as_slice)
        };
        if self.wild_len == 0 {
            for (id, v) in literal.into_iter().flatten() {
                f(*id, v);
            }
            return;
        }

        let mut lists: Buf<&[(u64, V)], 8> = Buf::new(&[]);
        if let Some(l) = literal {
            lists.push(l);
        }
        let mut bufs = None;
        let memoised = dfa::with(self.uid, self.epoch, |d| {
            self.walk_memoised(d, topic, &mut bufs, &mut lists);
        });
        if memoised.is_none() {
            let (a, b) = bufs.get_or_insert_with(|| LIVE.with(std::cell::Cell::take));
            self.start_set(a);
            self.walk_from(a, b, topic.words(), &mut lists);
        }
        // Hand the buffers back before running callbacks (which may match again).
        if let Some(bufs) = bufs {
            LIVE.with(|s| s.set(bufs));
        }
        match lists.as_mut_slice() {
            [] => {}
            // The common case: one list, no merge.
            [one] => one.iter().for_each(|(id, v)| f(*id, v)),
            many if many.len() <= 16 => merge(many, f),
            many => {
                let mut all: Vec<(u64, &V)> = many
                    .iter()
                    .flat_map(|l| l.iter().map(|(id, v)| (*id, v)))
                    .collect();
                // Stable: on equal ids the earlier list (literal first) wins, as in `merge`.
                all.sort_by_key(|e| e.0);
                all.dedup_by_key(|e| e.0);
                all.into_iter().for_each(|(id, v)| f(id, v));
            }
        }
    }

    /// Whether any pattern matches `topic`.
    #[must_use]
    pub fn matches_any(&self, topic: &Topic) -> bool {
        let mut any = false;
        self.for_each_match(topic, |_, _| any = true);
        any
    }
}

/// k-way merge of id-sorted lists, reporting each id once (from the first list holding it).
fn merge<V>(lists: &mut [&[(u64, V)]], mut f: impl FnMut(u64, &V)) {
    loop {
        let mut best: Option<(usize, u64)> = None;
        for (i, l) in lists.iter().enumerate() {
            if let Some((id, _)) = l.first()
                && best.is_none_or(|(_, b)| *id < b)
            {
                best = Some((i, *id));
            }
        }
        let Some((i, id)) = best else { return };
        f(id, &lists[i][0].1);
        for l in lists.iter_mut() {
            if l.first().is_some_and(|e| e.0 == id) {
                *l = &l[1..];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{AMQP_CASES, naive};
    use super::*;
    use proptest::prelude::*;

    fn p(s: &str) -> Pattern {
        Pattern::new(s).unwrap()
    }
    fn t(s: &str) -> Topic {
        Topic::new(s).unwrap()
    }
    #[test]
    fn first_is_the_lowest_id_under_a_pattern_or_an_equivalent_one() {
        let mut trie = TopicTrie::new();
        assert_eq!(trie.first(&p("a.b")), None);
        trie.insert(&p("a.b"), 7, "seven");
        trie.insert(&p("a.b"), 3, "three");
        trie.insert(&p("a.*.#"), 5, "five");
        assert_eq!(trie.first(&p("a.b")), Some(&"three"));
        assert_eq!(trie.first(&p("a.*.#")), Some(&"five"));
        assert_eq!(
            trie.first(&p("a.#.*")),
            Some(&"five"),
            "an equivalent pattern"
        );
        assert_eq!(trie.first(&p("a.*")), None);
        assert_eq!(trie.first(&p("a.c")), None);
        trie.remove(&p("a.b"), 3);
        assert_eq!(trie.first(&p("a.b")), Some(&"seven"));
    }

    fn ids<V>(trie: &TopicTrie<V>, topic: &str) -> Vec<u64> {
        let mut out = Vec::new();
        trie.for_each_match(&t(topic), |id, _| out.push(id));
        out
    }

    /// Live trie nodes (root included), to check pruning.
    fn node_count<V>(trie: &TopicTrie<V>) -> usize {
        trie.nodes.len() - trie.free_nodes.len()
    }

    /// Checks internal bookkeeping: edges, word references and child counts agree.
    fn check_invariants<V>(trie: &TopicTrie<V>) {
        let mut refs: HashMap<u32, u32> = HashMap::new();
        let mut kids: HashMap<u32, u32> = HashMap::new();
        for (&key, &child) in &trie.edges {
            *refs.entry(key as u32).or_default() += 1;
            *kids.entry((key >> 32) as u32).or_default() += 1;
            let parent = &trie.nodes[(key >> 32) as usize];
            assert_ne!(
                parent.bloom & bloom_bit(key as u32),
                0,
                "bloom misses an edge"
            );
            assert!(!trie.free_nodes.contains(&child));
        }
        for &(id, count) in trie.words.values() {
            assert_eq!(refs.get(&id).copied().unwrap_or(0), count);
        }
        assert_eq!(refs.len(), trie.words.len());
        for (i, n) in trie.nodes.iter().enumerate() {
            if !trie.free_nodes.contains(&(i as u32)) {
                assert_eq!(kids.get(&(i as u32)).copied().unwrap_or(0), n.children);
                assert!(i == 0 || !n.is_empty(), "empty live node {i}");
            }
        }
        let entries: usize = trie.nodes.iter().map(|n| n.entries.len()).sum();
        assert_eq!(entries, trie.wild_len);
    }

    /// The walk's per-thread buffers are taken for the call: a match run from inside a match
    /// callback on the same thread sees a consistent trie and gives the same answers (R-RT-1).
    #[test]
    fn nested_match_from_a_callback() {
        let mut trie = TopicTrie::new();
        for (i, pat) in ["a.#", "#.c", "a.*.c", "*.b.*", "#"].iter().enumerate() {
            trie.insert(&p(pat), i as u64, ());
        }
        let mut outer = Vec::new();
        trie.for_each_match(&t("a.b.c"), |id, _| {
            assert_eq!(ids(&trie, "x.b.y"), vec![3, 4]); // R-RT-1
            outer.push(id);
        });
        assert_eq!(outer, vec![0, 1, 2, 3, 4]); // R-RT-1
        assert_eq!(ids(&trie, "a.b.c"), outer);
    }

    #[test]
    fn amqp_table_single_pattern_trie() {
        for (i, &(pat, topic, want)) in AMQP_CASES.iter().enumerate() {
            let mut trie = TopicTrie::new();
            trie.insert(&p(pat), i as u64, ());
            let got = ids(&trie, topic);
            assert_eq!(got.len(), usize::from(want), "{pat} vs {topic}: {got:?}"); // R-RT-1
        }
    }

    #[test]
    fn amqp_table_all_patterns_in_one_trie() {
        let mut trie = TopicTrie::new();
        for (i, &(pat, _, _)) in AMQP_CASES.iter().enumerate() {
            assert!(trie.insert(&p(pat), i as u64, i).is_none());
        }
        for &(_, topic, _) in AMQP_CASES {
            let want: Vec<u64> = AMQP_CASES
                .iter()
                .enumerate()
                .filter(|(_, (pat, _, _))| p(pat).matches(&t(topic)))
                .map(|(i, _)| i as u64)
                .collect();
            assert_eq!(ids(&trie, topic), want, "{topic}"); // R-RT-1 (ascending ids, once each)
        }
    }

    #[test]
    fn multi_path_patterns_reported_once() {
        let mut trie = TopicTrie::new();
        for (id, pat) in ["#.#", "#.*.#", "#.a.#", "#.#.#.#", "*.#.*", "#"]
            .iter()
            .enumerate()
        {
            trie.insert(&p(pat), id as u64, ());
        }
        assert_eq!(ids(&trie, "a.a.a.a.a"), [0, 1, 2, 3, 4, 5]); // R-RT-1
        assert_eq!(ids(&trie, "a"), [0, 1, 2, 3, 5]); // R-RT-1
        assert_eq!(ids(&trie, "b"), [0, 1, 3, 5]); // R-RT-1
    }

    #[test]
    fn ascending_id_order_across_literal_and_wildcard() {
        let mut trie = TopicTrie::new();
        trie.insert(&p("a.b"), 5, "lit5");
        trie.insert(&p("a.*"), 3, "star3");
        trie.insert(&p("a.b"), 1, "lit1");
        trie.insert(&p("#"), 4, "hash4");
        trie.insert(&p("a.#"), 2, "ahash2");
        let mut got = Vec::new();
        trie.for_each_match(&t("a.b"), |id, v| got.push((id, *v)));
        assert_eq!(
            got,
            [
                (1, "lit1"),
                (2, "ahash2"),
                (3, "star3"),
                (4, "hash4"),
                (5, "lit5")
            ]
        ); // R-RT-1 (deterministic order)
    }

    #[test]
    fn same_id_under_several_patterns_reported_once() {
        let mut trie = TopicTrie::new();
        trie.insert(&p("a.b"), 1, "lit");
        trie.insert(&p("a.*"), 1, "star");
        trie.insert(&p("#"), 1, "hash");
        assert_eq!(trie.len(), 3);
        let mut got = Vec::new();
        trie.for_each_match(&t("a.b"), |id, v| got.push((id, *v)));
        assert_eq!(got, [(1, "lit")]); // R-RT-1
    }

    #[test]
    fn equivalent_patterns_share_a_key() {
        let mut trie = TopicTrie::new();
        assert_eq!(trie.insert(&p("#.#"), 7, 1), None);
        assert_eq!(trie.insert(&p("#"), 7, 2), Some(1));
        assert_eq!(trie.insert(&p("#.*"), 8, 3), None);
        assert_eq!(trie.get(&p("*.#"), 8), Some(&3));
        assert_eq!(trie.len(), 2);
        assert_eq!(trie.remove(&p("#.#.#"), 7), Some(2));
        assert_eq!(trie.remove(&p("*.#"), 8), Some(3));
        assert!(trie.is_empty());
        assert_eq!(node_count(&trie), 1);
    }

    #[test]
    fn insert_get_remove_prune() {
        let mut trie = TopicTrie::new();
        let pats = ["a.b.c", "a.*.c", "a.#", "#.c", "x", "*"];
        for (i, pat) in pats.iter().enumerate() {
            assert_eq!(trie.insert(&p(pat), i as u64, i), None);
        }
        assert_eq!(trie.len(), pats.len());
        assert_eq!(trie.insert(&p("a.*.c"), 1, 10), Some(1));
        *trie.get_mut(&p("a.#"), 2).unwrap() += 100;
        assert_eq!(trie.get(&p("a.#"), 2), Some(&102));
        assert_eq!(trie.get(&p("a.#"), 99), None);
        assert_eq!(trie.get(&p("q.#"), 2), None);
        assert_eq!(ids(&trie, "a.b.c"), [0, 1, 2, 3]); // R-RT-1
        assert_eq!(trie.remove(&p("a.b.c"), 0), Some(0));
        assert_eq!(trie.remove(&p("a.b.c"), 0), None);
        assert_eq!(trie.remove(&p("a.*.c"), 99), None);
        assert_eq!(trie.remove(&p("zz.*"), 1), None);
        assert_eq!(ids(&trie, "a.b.c"), [1, 2, 3]); // R-RT-1
        for (i, pat) in pats.iter().enumerate().skip(1) {
            assert!(trie.remove(&p(pat), i as u64).is_some());
        }
        assert!(trie.is_empty());
        assert!(trie.literal.is_empty());
        assert_eq!(node_count(&trie), 1); // pruned back to the bare root
        assert!(!trie.matches_any(&t("a.b.c")));
    }

    #[test]
    fn shared_words_are_reference_counted() {
        let mut trie = TopicTrie::new();
        for i in 0..100u64 {
            trie.insert(&p(&format!("w{i}.*.end")), i, i);
            trie.insert(&p(&format!("#.w{i}")), 1000 + i, i);
        }
        check_invariants(&trie);
        assert_eq!(trie.words.len(), 101); // w0..w99 and "end"
        assert_eq!(ids(&trie, "w42.x.end"), [42]); // R-RT-1
        assert_eq!(ids(&trie, "a.b.w42"), [1042]); // R-RT-1
        for i in 0..98u64 {
            assert_eq!(trie.remove(&p(&format!("w{i}.*.end")), i), Some(i));
            check_invariants(&trie);
        }
        assert_eq!(trie.words.len(), 101); // still used by `#.wN`
        assert_eq!(ids(&trie, "w99.x.end"), [99]); // R-RT-1
        assert_eq!(ids(&trie, "w42.x.end"), Vec::<u64>::new()); // R-RT-1
        for i in 0..100u64 {
            assert_eq!(trie.remove(&p(&format!("#.w{i}")), 1000 + i), Some(i));
        }
        check_invariants(&trie);
        assert_eq!(trie.words.len(), 3); // w98, w99, end
        // Freed nodes and word ids are reused.
        let before = trie.nodes.len();
        trie.insert(&p("q.*"), 5, 5);
        assert_eq!(trie.nodes.len(), before);
        check_invariants(&trie);
    }

    #[test]
    fn many_matches_spill_to_heap() {
        // More than 16 distinct matching nodes and more than 32 live states.
        let mut trie = TopicTrie::new();
        let mut id = 0;
        let mut want = Vec::new();
        for a in ["a", "*", "#"] {
            for b in ["a", "*", "#"] {
                for c in ["a", "*", "#"] {
                    for d in ["a", "*", "#"] {
                        let pat = p(&format!("{a}.{b}.{c}.{d}"));
                        trie.insert(&pat, id, ());
                        if pat.matches(&t("a.a.a.a")) {
                            want.push(id);
                        }
                        id += 1;
                    }
                }
            }
        }
        trie.insert(&p("a.a.a.a"), 1000, ());
        want.push(1000);
        assert_eq!(ids(&trie, "a.a.a.a"), want); // R-RT-1
    }

    #[test]
    fn canonical_form() {
        let c = |s: &str| {
            let pat = p(s);
            let (segs, n) = canonical(&pat);
            segs[..n]
                .iter()
                .map(|s| match s {
                    Seg::Word(w) => (*w).to_owned(),
                    Seg::Star => "*".into(),
                    Seg::Hash => "#".into(),
                })
                .collect::<Vec<_>>()
                .join(".")
        };
        assert_eq!(c("#.#"), "#");
        assert_eq!(c("#.*.#"), "*.#");
        assert_eq!(c("#.*"), "*.#");
        assert_eq!(c("a.#.#.b"), "a.#.b");
        assert_eq!(c("*.*"), "*.*");
        assert_eq!(c("#.a.#"), "#.a.#");
        assert_eq!(c("a.#.*.#.*.b.#"), "a.*.*.#.b.#");
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(String, u64),
        Remove(usize),
    }

    fn word() -> impl Strategy<Value = &'static str> {
        prop_oneof![
            3 => Just("a"),
            3 => Just("b"),
            1 => Just("c"),
            3 => Just("*"),
            3 => Just("#"),
        ]
    }

    fn pattern() -> impl Strategy<Value = String> {
        prop::collection::vec(word(), 1..6).prop_map(|w| w.join("."))
    }

    fn topic() -> impl Strategy<Value = String> {
        prop::collection::vec(prop_oneof![Just("a"), Just("b"), Just("c")], 1..7)
            .prop_map(|w| w.join("."))
    }

    /// A word longer than the memo's inline keys (it goes through the word id).
    const LONG: &str = "long-word-longer-than-twenty-four-bytes";

    #[derive(Debug, Clone)]
    enum Step {
        Insert(String, u64),
        Remove(usize),
        Match(String),
    }

    fn memo_word() -> impl Strategy<Value = &'static str> {
        prop_oneof![
            3 => Just("a"),
            3 => Just("b"),
            1 => Just("cccccccccc"),
            1 => Just(LONG),
            3 => Just("*"),
            3 => Just("#"),
        ]
    }

    fn memo_topic() -> impl Strategy<Value = String> {
        prop::collection::vec(
            prop_oneof![
                Just("a"),
                Just("b"),
                Just("cccccccccc"),
                Just(LONG),
                Just("zz")
            ],
            1..7,
        )
        .prop_map(|w| w.join("."))
    }

    fn memo_steps() -> impl Strategy<Value = Vec<Step>> {
        let pattern = prop::collection::vec(memo_word(), 1..6).prop_map(|w| w.join("."));
        prop::collection::vec(
            prop_oneof![
                2 => (pattern, 0u64..10).prop_map(|(p, id)| Step::Insert(p, id)),
                1 => (0usize..64).prop_map(Step::Remove),
                // Few distinct topics, so most matches replay memoised steps.
                4 => prop::sample::select(vec![0usize, 1, 2, 3]).prop_flat_map(|k| {
                    memo_topic().prop_map(move |t| (k, t))
                }).prop_map(|(_, t)| Step::Match(t)),
            ],
            1..60,
        )
    }

    fn canon_text(pat: &str) -> String {
        let pat = p(pat);
        let (segs, n) = canonical(&pat);
        segs[..n]
            .iter()
            .map(|s| match s {
                Seg::Word(w) => (*w).to_owned(),
                Seg::Star => "*".into(),
                Seg::Hash => "#".into(),
            })
            .collect::<Vec<_>>()
            .join(".")
    }

    /// Runs `steps` against a trie and a model, checking every match against the naive
    /// matcher: matches after inserts and removes must never see a stale memoised step.
    fn check_memo(steps: Vec<Step>) -> Result<(), TestCaseError> {
        let mut trie = TopicTrie::new();
        let mut model: Vec<(String, u64)> = Vec::new();
        let mut seen: Vec<String> = Vec::new();
        for step in steps {
            match step {
                Step::Insert(pat, id) => {
                    let key = canon_text(&pat);
                    model.retain(|(q, qid)| !(*qid == id && canon_text(q) == key));
                    trie.insert(&p(&pat), id, ());
                    model.push((pat, id));
                }
                Step::Remove(i) if !model.is_empty() => {
                    let (pat, id) = model.remove(i % model.len());
                    prop_assert!(trie.remove(&p(&pat), id).is_some());
                }
                Step::Remove(_) => {}
                Step::Match(topic) => seen.push(topic),
            }
            // Replay every topic seen so far: memoised steps from before the change meet the
            // trie after it.
            for topic in &seen {
                let tw: Vec<&str> = topic.split('.').collect();
                let mut want: Vec<u64> = model
                    .iter()
                    .filter(|(pat, _)| naive(&pat.split('.').collect::<Vec<_>>(), &tw))
                    .map(|(_, id)| *id)
                    .collect();
                want.sort_unstable();
                want.dedup();
                prop_assert_eq!(ids(&trie, topic), want, "topic {}", topic); // R-RT-1
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

        /// The memoised walk agrees with the naive matcher across inserts and removes (R-RT-1).
        #[test]
        fn memoised_walk_agrees_with_naive_matcher(steps in memo_steps()) {
            dfa::set_limits_for_this_thread(dfa::MAX_STATES, dfa::MAX_TRANSITIONS, dfa::MAX_TOPICS);
            check_memo(steps)?;
        }

        /// The same with a memo so small it is full most of the time: the walk takes over
        /// mid-topic, and the memo is emptied and refilled (R-RT-1).
        #[test]
        fn full_memo_falls_back_to_the_walk(steps in memo_steps()) {
            dfa::set_limits_for_this_thread(3, 4, 2);
            check_memo(steps)?;
        }

        /// Room for every step but only two whole topics: remembered topics are forgotten and
        /// learnt again while the steps stay (R-RT-1).
        #[test]
        fn small_topic_table_agrees_with_naive_matcher(steps in memo_steps()) {
            dfa::set_limits_for_this_thread(dfa::MAX_STATES, dfa::MAX_TRANSITIONS, 2);
            check_memo(steps)?;
        }
    }

    /// The memo never grows past its limits, and answers stay right once it is full.
    #[test]
    fn memo_stays_within_its_limits() {
        dfa::set_limits_for_this_thread(5, 7, 3);
        let mut trie = TopicTrie::new();
        for i in 0..20u64 {
            trie.insert(&p(&format!("w{i}.*.#")), i, ());
        }
        for round in 0..3 {
            for i in 0..20u64 {
                assert_eq!(ids(&trie, &format!("w{i}.x.y")), [i], "round {round}"); // R-RT-1
                let (states, steps, topics) = dfa::with(trie.uid, trie.epoch, |d| d.len()).unwrap();
                assert!(
                    states <= 5 && steps <= 7 && topics <= 3,
                    "{states} states, {steps} steps, {topics} topics"
                );
            }
        }
        dfa::set_limits_for_this_thread(dfa::MAX_STATES, dfa::MAX_TRANSITIONS, dfa::MAX_TOPICS);
    }

    /// A topic matched again is answered from the remembered whole topic, and a change of the
    /// wildcard side (insert or remove) is seen by the next match of that same topic (R-RT-1).
    #[test]
    fn remembered_topics_follow_changes() {
        dfa::set_limits_for_this_thread(dfa::MAX_STATES, dfa::MAX_TRANSITIONS, dfa::MAX_TOPICS);
        let mut trie = TopicTrie::new();
        trie.insert(&p("a.*"), 1, ());
        trie.insert(&p("a.b"), 5, ());
        let remembered = |trie: &TopicTrie<()>| {
            dfa::with(trie.uid, trie.epoch, |d| d.topic("a.b").is_some()).unwrap()
        };
        assert_eq!(ids(&trie, "a.b"), [1, 5]); // R-RT-1
        assert!(remembered(&trie));
        assert_eq!(ids(&trie, "a.b"), [1, 5]); // R-RT-1
        trie.insert(&p("#.b"), 2, ());
        assert!(!remembered(&trie));
        assert_eq!(ids(&trie, "a.b"), [1, 2, 5]); // R-RT-1
        assert_eq!(ids(&trie, "a.b"), [1, 2, 5]); // R-RT-1
        trie.remove(&p("a.*"), 1);
        assert_eq!(ids(&trie, "a.b"), [2, 5]); // R-RT-1
        trie.remove(&p("#.b"), 2);
        assert_eq!(ids(&trie, "a.b"), [5]); // R-RT-1
        // A topic no wildcard pattern can match is remembered too (the dead state).
        trie.insert(&p("q.*"), 3, ());
        assert_eq!(ids(&trie, "a.b"), [5]); // R-RT-1
        assert!(remembered(&trie));
        assert_eq!(ids(&trie, "a.b"), [5]); // R-RT-1
    }

    /// Tries matched alternately on one thread each keep their own memo; more tries than
    /// slots evict one another without mixing answers (R-RT-1).
    #[test]
    fn several_tries_on_one_thread() {
        let tries: Vec<TopicTrie<()>> = (0..dfa::SLOTS + 2)
            .map(|k| {
                let mut trie = TopicTrie::new();
                trie.insert(&p(&format!("t{k}.*")), k as u64, ());
                trie.insert(&p("#.end"), 100, ());
                trie
            })
            .collect();
        for _ in 0..3 {
            for (k, trie) in tries.iter().enumerate() {
                for (j, _) in tries.iter().enumerate() {
                    let want: Vec<u64> = if j == k { vec![k as u64] } else { vec![] };
                    assert_eq!(ids(trie, &format!("t{j}.x")), want); // R-RT-1
                }
                assert_eq!(ids(trie, &format!("t{k}.end")), vec![k as u64, 100]); // R-RT-1
            }
        }
    }

    /// A memo cleared by `clear` (a new identity) or rebuilt after a remove and re-insert that
    /// reuses node and word ids never answers for the old shape (R-RT-1).
    #[test]
    fn reused_ids_do_not_revive_old_steps() {
        let mut trie = TopicTrie::new();
        trie.insert(&p("a.b.#"), 1, ());
        assert_eq!(ids(&trie, "a.b.c"), [1]);
        trie.remove(&p("a.b.#"), 1);
        trie.insert(&p("x.y.#"), 2, ()); // reuses the freed word and node ids
        assert_eq!(ids(&trie, "a.b.c"), Vec::<u64>::new()); // R-RT-1
        assert_eq!(ids(&trie, "x.y.c"), [2]); // R-RT-1
        trie.clear();
        trie.insert(&p("a.*.c"), 3, ());
        assert_eq!(ids(&trie, "x.y.c"), Vec::<u64>::new()); // R-RT-1
        assert_eq!(ids(&trie, "a.b.c"), [3]); // R-RT-1
        assert_eq!(ids(&trie, &format!("a.{LONG}.c")), [3]); // R-RT-1
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

        /// 2,000 cases × 8 topics each = 16,000 (pattern set, topic) checks.
        #[test]
        fn trie_agrees_with_naive_matcher(
            ops in prop::collection::vec(
                prop_oneof![
                    3 => (pattern(), 0u64..12).prop_map(|(p, id)| Op::Insert(p, id)),
                    1 => (0usize..64).prop_map(Op::Remove),
                ],
                1..40,
            ),
            topics in prop::collection::vec(topic(), 8),
        ) {
            let mut trie = TopicTrie::new();
            // Model: (pattern text, id) -> value, with at most one live key per equivalence.
            let mut model: Vec<(String, u64, usize)> = Vec::new();
            for (step, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Insert(pat, id) => {
                        let pp = p(&pat);
                        let key = canonical(&pp);
                        let old = model.iter().position(|(q, qid, _)| {
                            *qid == id && canonical(&p(q)) == key
                        });
                        let got = trie.insert(&pp, id, step);
                        prop_assert_eq!(got, old.map(|i| model[i].2));
                        if let Some(i) = old {
                            model.remove(i);
                        }
                        model.push((pat, id, step));
                    }
                    Op::Remove(i) if !model.is_empty() => {
                        let (pat, id, v) = model.remove(i % model.len());
                        prop_assert_eq!(trie.remove(&p(&pat), id), Some(v));
                        prop_assert_eq!(trie.remove(&p(&pat), id), None);
                    }
                    Op::Remove(_) => {}
                }
                prop_assert_eq!(trie.len(), model.len());
            }
            check_invariants(&trie);
            for topic in &topics {
                let tw: Vec<&str> = topic.split('.').collect();
                let mut want: Vec<u64> = model
                    .iter()
                    .filter(|(pat, _, _)| {
                        let pw: Vec<&str> = pat.split('.').collect();
                        naive(&pw, &tw)
                    })
                    .map(|(_, id, _)| *id)
                    .collect();
                want.sort_unstable();
                want.dedup();
                prop_assert_eq!(ids(&trie, topic), want, "topic {}", topic); // R-RT-1
                for (pat, _, _) in &model {
                    let pw: Vec<&str> = pat.split('.').collect();
                    prop_assert_eq!(p(pat).matches(&t(topic)), naive(&pw, &tw)); // R-RT-1
                }
            }
            // Removing everything prunes the trie back to its root.
            for (pat, id, _) in model.drain(..) {
                prop_assert!(trie.remove(&p(&pat), id).is_some());
            }
            prop_assert!(trie.is_empty());
            prop_assert_eq!(node_count(&trie), 1);
        }
    }
}
