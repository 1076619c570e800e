//! [`TopicTrie`]: many patterns, one topic, all matches (R-RT-1).

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, Hasher};

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
/// * Wildcard patterns live in a trie over words. Matching walks it word by word keeping the set
///   of live nodes (an NFA simulation with duplicate states merged), so the cost grows with the
///   topic's depth and the number of matching patterns, never with the number of patterns.
///   When no wildcard pattern is stored the walk is skipped.
/// * Matching does not allocate unless more than 16 trie nodes are live at once or more than
///   16 distinct patterns match (then one reusable buffer per call).
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
pub struct TopicTrie<V> {
    /// Literal patterns: full topic → entries sorted by id.
    literal: HashMap<Box<str>, Vec<(u64, V)>, FastState>,
    /// Root of the wildcard-pattern trie.
    root: Node<V>,
    /// Number of entries in the trie (wildcard patterns).
    wild_len: usize,
    /// Number of entries in `literal`.
    literal_len: usize,
    /// Next node serial (deterministic tie-break when deduplicating many live nodes).
    next_serial: u64,
}

/// Children of a node reached through literal words: a small vector while fan-out is small
/// (a compare is cheaper than hashing), a hash map beyond [`SMALL_FANOUT`].
enum Children<V> {
    Small(Vec<(Box<str>, Node<V>)>),
    Map(HashMap<Box<str>, Node<V>, FastState>),
}

const SMALL_FANOUT: usize = 8;

struct Node<V> {
    serial: u64,
    /// This node was reached through a `#` edge, so it may consume any number of further words.
    is_hash: bool,
    /// Entries whose (canonical) pattern ends here, sorted by id.
    entries: Vec<(u64, V)>,
    children: Children<V>,
    star: Option<Box<Node<V>>>,
    hash: Option<Box<Node<V>>>,
}

impl<V> Node<V> {
    fn new(serial: u64, is_hash: bool) -> Self {
        Self {
            serial,
            is_hash,
            entries: Vec::new(),
            children: Children::Small(Vec::new()),
            star: None,
            hash: None,
        }
    }

    fn is_empty(&self) -> bool {
        self.entries.is_empty()
            && self.star.is_none()
            && self.hash.is_none()
            && match &self.children {
                Children::Small(v) => v.is_empty(),
                Children::Map(m) => m.is_empty(),
            }
    }

    #[inline]
    fn child(&self, word: &str) -> Option<&Node<V>> {
        match &self.children {
            Children::Small(v) => v.iter().find(|(k, _)| &**k == word).map(|(_, n)| n),
            Children::Map(m) => m.get(word),
        }
    }

    fn child_mut(&mut self, word: &str) -> Option<&mut Node<V>> {
        match &mut self.children {
            Children::Small(v) => v.iter_mut().find(|(k, _)| &**k == word).map(|(_, n)| n),
            Children::Map(m) => m.get_mut(word),
        }
    }

    fn child_or_insert(&mut self, word: &str, serial: &mut u64) -> &mut Node<V> {
        if let Children::Small(v) = &mut self.children
            && v.len() >= SMALL_FANOUT
            && !v.iter().any(|(k, _)| &**k == word)
        {
            let map: HashMap<_, _, FastState> = std::mem::take(v).into_iter().collect();
            self.children = Children::Map(map);
        }
        match &mut self.children {
            Children::Small(v) => {
                let pos = match v.iter().position(|(k, _)| &**k == word) {
                    Some(pos) => pos,
                    None => {
                        v.push((word.into(), Node::new(bump(serial), false)));
                        v.len() - 1
                    }
                };
                &mut v[pos].1
            }
            Children::Map(m) => m
                .entry(word.into())
                .or_insert_with(|| Node::new(bump(serial), false)),
        }
    }

    fn remove_child(&mut self, word: &str) {
        match &mut self.children {
            Children::Small(v) => v.retain(|(k, _)| &**k != word),
            Children::Map(m) => {
                m.remove(word);
                if m.len() <= SMALL_FANOUT / 2 {
                    let v = std::mem::take(m).into_iter().collect();
                    self.children = Children::Small(v);
                }
            }
        }
    }
}

/// A fast seeded hasher for short strings (folded 64×64→128 multiply, as in foldhash). The seed
/// is drawn per process from std's random source, so colliding keys cannot be precomputed.
#[derive(Clone, Copy)]
struct FastState(u64);

impl Default for FastState {
    fn default() -> Self {
        use std::sync::OnceLock;
        static SEED: OnceLock<u64> = OnceLock::new();
        Self(*SEED.get_or_init(|| std::collections::hash_map::RandomState::new().hash_one(0u64) | 1))
    }
}

impl BuildHasher for FastState {
    type Hasher = FastHasher;

    #[inline]
    fn build_hasher(&self) -> FastHasher {
        FastHasher(self.0)
    }
}

struct FastHasher(u64);

const MUL: u64 = 0x9E37_79B9_7F4A_7C15;

#[inline]
fn fold_mul(a: u64, b: u64) -> u64 {
    let full = u128::from(a) * u128::from(b);
    (full as u64) ^ ((full >> 64) as u64)
}

impl Hasher for FastHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            self.0 = fold_mul(self.0 ^ u64::from_le_bytes(b), MUL);
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut b = [0u8; 8];
            b[..rest.len()].copy_from_slice(rest);
            self.0 = fold_mul(self.0 ^ u64::from_le_bytes(b), MUL ^ rest.len() as u64);
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.0 = fold_mul(self.0 ^ u64::from(i), MUL);
    }

    #[inline]
    fn finish(&self) -> u64 {
        fold_mul(self.0, MUL.rotate_left(17))
    }
}

fn bump(serial: &mut u64) -> u64 {
    *serial += 1;
    *serial
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
    fn as_slice(&self) -> &[T] {
        if self.heap.is_empty() {
            &self.inline[..self.len]
        } else {
            &self.heap
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

    fn clear(&mut self) {
        self.len = 0;
        self.heap.clear();
    }
}

/// The live node set of the match walk, deduplicated.
struct States<'t, V> {
    buf: Buf<&'t Node<V>, 16>,
    /// Set when pushes skipped the linear duplicate check (large sets); fixed by `finish`.
    dirty: bool,
}

impl<'t, V> States<'t, V> {
    const LINEAR: usize = 32;

    fn new(fill: &'t Node<V>) -> Self {
        Self {
            buf: Buf::new(fill),
            dirty: false,
        }
    }

    /// Adds `node` and, since `#` may match zero words, the `#` node below it.
    #[inline]
    fn add(&mut self, mut node: &'t Node<V>) {
        loop {
            let s = self.buf.as_slice();
            if s.len() <= Self::LINEAR {
                if !s.iter().any(|n| std::ptr::eq(*n, node)) {
                    self.buf.push(node);
                }
            } else {
                self.dirty = true;
                self.buf.push(node);
            }
            match &node.hash {
                Some(h) => node = h,
                None => break,
            }
        }
    }

    fn finish(&mut self) {
        if self.dirty {
            self.dirty = false;
            // Only reached once the set spilled to the heap (LINEAR >= inline capacity).
            let v = &mut self.buf.heap;
            v.sort_unstable_by_key(|n| n.serial);
            v.dedup_by_key(|n| n.serial);
        }
    }
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
            .finish_non_exhaustive()
    }
}

impl<V> TopicTrie<V> {
    /// An empty router.
    #[must_use]
    pub fn new() -> Self {
        Self {
            literal: HashMap::default(),
            root: Node::new(0, false),
            wild_len: 0,
            literal_len: 0,
            next_serial: 0,
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
            old
        } else {
            let (segs, n) = canonical(pattern);
            let mut node = &mut self.root;
            for seg in &segs[..n] {
                node = match *seg {
                    Seg::Word(w) => node.child_or_insert(w, &mut self.next_serial),
                    Seg::Star => node.star.get_or_insert_with(|| {
                        Box::new(Node::new(bump(&mut self.next_serial), false))
                    }),
                    Seg::Hash => node.hash.get_or_insert_with(|| {
                        Box::new(Node::new(bump(&mut self.next_serial), true))
                    }),
                };
            }
            let old = sorted_insert(&mut node.entries, id, value);
            if old.is_none() {
                self.wild_len += 1;
            }
            old
        }
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
            Some(old)
        } else {
            let (segs, n) = canonical(pattern);
            let old = remove_rec(&mut self.root, &segs[..n], id)?;
            self.wild_len -= 1;
            Some(old)
        }
    }

    /// The value stored for `(pattern, id)`, if any (up to pattern equivalence).
    #[must_use]
    pub fn get(&self, pattern: &Pattern, id: u64) -> Option<&V> {
        let list = if pattern.is_literal() {
            self.literal.get(pattern.as_str())?
        } else {
            let (segs, n) = canonical(pattern);
            let mut node = &self.root;
            for seg in &segs[..n] {
                node = match *seg {
                    Seg::Word(w) => node.child(w)?,
                    Seg::Star => node.star.as_deref()?,
                    Seg::Hash => node.hash.as_deref()?,
                };
            }
            &node.entries
        };
        let i = list.binary_search_by_key(&id, |e| e.0).ok()?;
        Some(&list[i].1)
    }

    /// Mutable access to the value stored for `(pattern, id)`, if any.
    pub fn get_mut(&mut self, pattern: &Pattern, id: u64) -> Option<&mut V> {
        let list = if pattern.is_literal() {
            self.literal.get_mut(pattern.as_str())?
        } else {
            let (segs, n) = canonical(pattern);
            let mut node = &mut self.root;
            for seg in &segs[..n] {
                node = match *seg {
                    Seg::Word(w) => node.child_mut(w)?,
                    Seg::Star => node.star.as_deref_mut()?,
                    Seg::Hash => node.hash.as_deref_mut()?,
                };
            }
            &mut node.entries
        };
        let i = list.binary_search_by_key(&id, |e| e.0).ok()?;
        Some(&mut list[i].1)
    }

    /// Removes every entry.
    pub fn clear(&mut self) {
        *self = Self::new();
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
            self.literal.get(topic.as_str())
        };
        if self.wild_len == 0 {
            for (id, v) in literal.into_iter().flatten() {
                f(*id, v);
            }
            return;
        }

        // Walk the wildcard trie.
        let mut cur = States::new(&self.root);
        let mut next = States::new(&self.root);
        cur.add(&self.root);
        for word in topic.words() {
            next.buf.clear();
            for &node in cur.buf.as_slice() {
                if node.is_hash {
                    next.add(node);
                }
                if let Some(c) = node.child(word) {
                    next.add(c);
                }
                if let Some(s) = &node.star {
                    next.add(s);
                }
            }
            next.finish();
            std::mem::swap(&mut cur, &mut next);
            if cur.buf.as_slice().is_empty() {
                break;
            }
        }

        // Merge the sorted entry lists of the literal match and every final node.
        let mut lists: Buf<&[(u64, V)], 16> = Buf::new(&[]);
        if let Some(l) = literal {
            lists.push(l);
        }
        for node in cur.buf.as_slice() {
            if !node.entries.is_empty() {
                lists.push(&node.entries);
            }
        }
        match lists.as_mut_slice() {
            [] => {}
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

fn remove_rec<V>(node: &mut Node<V>, segs: &[Seg<'_>], id: u64) -> Option<V> {
    let Some((seg, rest)) = segs.split_first() else {
        return sorted_remove(&mut node.entries, id);
    };
    match *seg {
        Seg::Word(w) => {
            let child = node.child_mut(w)?;
            let old = remove_rec(child, rest, id)?;
            if child.is_empty() {
                node.remove_child(w);
            }
            Some(old)
        }
        Seg::Star => {
            let child = node.star.as_deref_mut()?;
            let old = remove_rec(child, rest, id)?;
            if child.is_empty() {
                node.star = None;
            }
            Some(old)
        }
        Seg::Hash => {
            let child = node.hash.as_deref_mut()?;
            let old = remove_rec(child, rest, id)?;
            if child.is_empty() {
                node.hash = None;
            }
            Some(old)
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
    fn ids<V>(trie: &TopicTrie<V>, topic: &str) -> Vec<u64> {
        let mut out = Vec::new();
        trie.for_each_match(&t(topic), |id, _| out.push(id));
        out
    }

    /// Counts nodes, to check pruning.
    fn node_count<V>(n: &Node<V>) -> usize {
        let kids: usize = match &n.children {
            Children::Small(v) => v.iter().map(|(_, c)| node_count(c)).sum(),
            Children::Map(m) => m.values().map(node_count).sum(),
        };
        1 + kids + n.star.as_deref().map_or(0, node_count) + n.hash.as_deref().map_or(0, node_count)
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
        assert_eq!(node_count(&trie.root), 1);
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
        assert_eq!(node_count(&trie.root), 1); // pruned back to the bare root
        assert!(!trie.matches_any(&t("a.b.c")));
    }

    #[test]
    fn wide_fanout_switches_to_map_and_back() {
        let mut trie = TopicTrie::new();
        for i in 0..100u64 {
            trie.insert(&p(&format!("w{i}.*")), i, i);
        }
        assert!(matches!(trie.root.children, Children::Map(_)));
        assert_eq!(ids(&trie, "w42.x"), [42]); // R-RT-1
        for i in 0..98u64 {
            assert_eq!(trie.remove(&p(&format!("w{i}.*")), i), Some(i));
        }
        assert!(matches!(trie.root.children, Children::Small(_)));
        assert_eq!(ids(&trie, "w99.x"), [99]); // R-RT-1
        assert_eq!(ids(&trie, "w42.x"), Vec::<u64>::new()); // R-RT-1
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
            prop_assert_eq!(node_count(&trie.root), 1);
        }
    }
}
