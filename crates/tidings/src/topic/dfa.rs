//! The memo of the trie walk: a lazily built DFA over sets of live trie nodes, kept per thread.
//!
//! The wildcard walk of [`TopicTrie`](super::TopicTrie) is an NFA simulation: after each topic
//! word it holds the *set* of live trie nodes. The step from one set on one word depends only on
//! the trie's shape, so it can be remembered: a DFA state is a live set (sorted node ids), and a
//! transition maps `(state, word)` to the next state. A topic whose steps are all known costs one
//! hash lookup per word, whatever the number of live nodes: words of at most [`SHORT_WORD`] bytes
//! are part of the transition's key (inline, compared as three machine words: no word-table
//! lookup, no pointer to follow); longer words are first turned into the trie's word id.
//!
//! # Validity
//!
//! A cache belongs to one trie (its `uid`, unique in the process) at one `epoch` (bumped by every
//! change of the trie's wildcard side). A cache whose `(uid, epoch)` differs from the trie it is
//! asked about is emptied before use, so a cached step is always one the walk would take on the
//! trie as it is now (node and word ids are only reused after a change, which bumps the epoch).
//!
//! # Size
//!
//! Each thread keeps [`SLOTS`] caches (one per trie it matched against most recently), each with
//! at most [`MAX_STATES`] states, [`MAX_TRANSITIONS`] transitions and [`MAX_TOPICS`] topics (a
//! few MiB at the very worst, the topics' text included: 8,192 × 255 bytes; typically far less,
//! as the caches grow only with the topics actually seen). When a cache is full, matching falls
//! back to the plain walk for the steps it does not know; after [`MAX_TRANSITIONS`] such misses
//! the cache is emptied, so it follows a changing set of hot topics instead of staying stuck on
//! the first ones.
//!
//! # Thrashing
//!
//! When the topics are too many and too varied for the cache (most topics new, each walking
//! into live sets never seen), a full cache costs more than it saves: every word is a lookup
//! into tables far larger than the processor's caches, missing there, and the step is walked
//! anyway. So a full cache keeps score: of the first `transitions / 16` topics it could not
//! answer since it became full, if fewer than half as many were answered whole (every step
//! known), it is thrashing. It is then emptied and left unused for the next
//! `transitions` matches (the plain walk answers them, touching only the trie), after
//! which it learns again from empty and is judged again. Each verdict of thrashing in a row
//! doubles the next pause, up to 16 times the first; a verdict of useful resets it. The answer
//! of a match never depends on any of this, only its cost.
//!
//! # Whole topics
//!
//! Besides its steps, a cache remembers up to [`MAX_TOPICS`] whole topics and the state their
//! last word leads to, so a topic matched again on this thread costs one hash lookup of the
//! topic instead of one per word: the walk's answer depends only on the trie's shape and the
//! topic, and the states named belong to the same cache, so they are emptied together (a new
//! epoch, or a full cache starting over). A full topic table forgets a quarter of itself (hash
//! order) before taking a new topic, so it follows a changing set of hot topics. The topics
//! are kept as [`Topic`] clones (a reference count, not a copy of the text).

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use super::Topic;
use foldhash::fast::RandomState;

/// Caches kept per thread (tries matched on this thread most recently).
pub(super) const SLOTS: usize = 2;
/// Most states per cache.
pub(super) const MAX_STATES: usize = 16 * 1024;
/// Most transitions per cache.
pub(super) const MAX_TRANSITIONS: usize = 64 * 1024;
/// Most whole topics remembered per cache.
pub(super) const MAX_TOPICS: usize = 8 * 1024;

/// The word id used for "a word no wildcard edge uses" (and for "the word does not matter").
pub(super) const NO_WORD: u32 = u32::MAX;

/// Longest word kept inline in a transition's key.
pub(super) const SHORT_WORD: usize = 24;

/// What a step is keyed by, besides the state.
#[derive(Clone, Copy)]
pub(super) enum Word {
    /// A word of at most [`SHORT_WORD`] bytes, zero-padded, and its length (a word is never
    /// empty, so padding cannot make two words equal).
    Short([u64; 3], u8),
    /// A trie word id, or [`NO_WORD`]: for longer words, and for states where the word does not
    /// matter.
    Id(u32),
}

impl Word {
    /// The key for `word`: inline when short enough, else `id()` (called only then).
    #[inline]
    pub(super) fn of(word: &str, id: impl FnOnce() -> u32) -> Self {
        let b = word.as_bytes();
        if b.len() > SHORT_WORD {
            return Word::Id(id());
        }
        let mut buf = [0u8; SHORT_WORD];
        buf[..b.len()].copy_from_slice(b);
        let w = |i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&buf[i * 8..i * 8 + 8]);
            u64::from_le_bytes(x)
        };
        // `b.len() <= SHORT_WORD` fits a u8.
        Word::Short([w(0), w(1), w(2)], b.len() as u8)
    }
}

/// A transition keyed by state and inline short word.
#[derive(Clone, Copy, PartialEq, Eq)]
struct ShortKey {
    state: u32,
    len: u8,
    text: [u64; 3],
}

impl std::hash::Hash for ShortKey {
    #[inline]
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        h.write_u64((u64::from(self.state) << 8) | u64::from(self.len));
        h.write_u64(self.text[0]);
        // Most words fit in 8 bytes: skip the zero padding's rounds.
        if self.len > 8 {
            h.write_u64(self.text[1]);
            h.write_u64(self.text[2]);
        }
    }
}

/// A fresh trie identity.
pub(super) fn next_uid() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A state's id, with the two facts a step needs folded in, so that following known steps
/// touches nothing but the transition table.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct Sid(u32);

const NEEDS_WORD: u32 = 1 << 31;
const DEAD: u32 = 1 << 30;

impl Sid {
    /// Some live node has literal-word children: the next word's identity matters.
    #[inline]
    pub(super) fn needs_word(self) -> bool {
        self.0 & NEEDS_WORD != 0
    }

    /// No live node: nothing can match any more.
    #[inline]
    pub(super) fn is_dead(self) -> bool {
        self.0 & DEAD != 0
    }

    #[inline]
    fn index(self) -> usize {
        (self.0 & !(NEEDS_WORD | DEAD)) as usize
    }
}

/// One DFA state: a set of live trie nodes.
pub(super) struct State {
    /// This state's id.
    id: Sid,
    /// The live nodes, sorted; empty for the dead state.
    pub(super) nodes: Box<[u32]>,
    /// The live nodes that hold entries, sorted: what a topic ending here matches.
    pub(super) finals: Box<[u32]>,
}

/// One trie's memo. See the module docs.
pub(super) struct Dfa {
    uid: u64,
    epoch: u64,
    states: Vec<State>,
    by_set: HashMap<Box<[u32]>, Sid, RandomState>,
    /// Steps on short words.
    short: HashMap<ShortKey, Sid, RandomState>,
    /// Steps on word ids (long words, and "any word").
    transitions: HashMap<u64, Sid, RandomState>,
    /// Whole topics → the state their last word leads to (or the dead state).
    topics: HashMap<Topic, Sid, RandomState>,
    /// Steps that could not be stored because the cache was full, since it was last emptied.
    full_misses: usize,
    /// Since the cache was last found full: topics answered whole without a walk.
    full_answered: usize,
    /// Matches still to walk without the cache, which was found thrashing (see the module
    /// docs).
    bypass: usize,
    /// Length of the next pause, if the cache is found thrashing again.
    bypass_len: usize,
    /// Last use, for choosing which slot to reuse.
    used: u64,
    limits: Limits,
}

#[derive(Clone, Copy)]
struct Limits {
    states: usize,
    transitions: usize,
    topics: usize,
}

impl Limits {
    /// Topics a full cache could not answer before it is judged (thrashing or not).
    fn window(self) -> usize {
        (self.transitions / 16).max(1)
    }

    /// The first pause of a thrashing cache, in matches.
    fn first_bypass(self) -> usize {
        self.transitions.max(1)
    }
}

const DEFAULT_LIMITS: Limits = Limits {
    states: MAX_STATES,
    transitions: MAX_TRANSITIONS,
    topics: MAX_TOPICS,
};

#[inline]
fn key(state: u32, word: u32) -> u64 {
    (u64::from(state) << 32) | u64::from(word)
}

impl Dfa {
    fn new(uid: u64, epoch: u64, limits: Limits) -> Self {
        Self {
            uid,
            epoch,
            states: Vec::new(),
            by_set: HashMap::default(),
            short: HashMap::default(),
            transitions: HashMap::default(),
            topics: HashMap::default(),
            full_misses: 0,
            full_answered: 0,
            bypass: 0,
            bypass_len: limits.first_bypass(),
            used: 0,
            limits,
        }
    }

    fn reset(&mut self, uid: u64, epoch: u64) {
        self.uid = uid;
        self.epoch = epoch;
        self.states.clear();
        self.by_set.clear();
        self.short.clear();
        self.transitions.clear();
        // The remembered topics name states of this cache: they go with them.
        self.topics.clear();
        self.full_misses = 0;
        self.full_answered = 0;
    }

    /// Whether this match should walk without the cache, which was found thrashing (see the
    /// module docs); counts the match against the pause.
    #[inline]
    pub(super) fn bypassing(&mut self) -> bool {
        if self.bypass == 0 {
            return false;
        }
        self.bypass -= 1;
        true
    }

    /// A topic was answered whole by the cache (every step known or learnt, or remembered).
    #[inline]
    pub(super) fn note_answered(&mut self) {
        if self.full_misses > 0 {
            self.full_answered += 1;
        }
    }

    /// The start state, if known: the first state ever added (the walk adds it first).
    #[inline]
    pub(super) fn start(&self) -> Option<Sid> {
        let st = self.states.first()?;
        Some(st.id)
    }

    /// The state with this id.
    #[inline]
    pub(super) fn state(&self, id: Sid) -> &State {
        &self.states[id.index()]
    }

    /// The known step from `state` on `word`.
    #[inline]
    pub(super) fn step(&self, sid: Sid, word: Word) -> Option<Sid> {
        let state = sid.0;
        match word {
            Word::Short(text, len) => self.short.get(&ShortKey { state, len, text }).copied(),
            Word::Id(id) => self.transitions.get(&key(state, id)).copied(),
        }
    }

    /// The state `topic` was walked to, if remembered (see the module docs).
    #[inline]
    pub(super) fn topic(&self, topic: &str) -> Option<Sid> {
        self.topics.get(topic).copied()
    }

    /// Remembers that the walk of `topic` ends in state `sid` (obtained from this cache since
    /// it was last emptied). A full table first forgets a quarter of its topics.
    pub(super) fn learn_topic(&mut self, topic: &Topic, sid: Sid) {
        let limit = self.limits.topics;
        if limit == 0 {
            return;
        }
        if self.topics.len() >= limit {
            let mut forget = limit.div_ceil(4);
            self.topics.retain(|_, _| {
                if forget == 0 {
                    return true;
                }
                forget -= 1;
                false
            });
        }
        self.topics.insert(topic.clone(), sid);
    }

    /// The id of the state for the sorted set `nodes`, adding it (with its finals and whether
    /// it needs the word, computed by `describe`) if new. `None` when the cache is full; the cache may
    /// then have been emptied, so every state id obtained before is stale: walk on without it.
    pub(super) fn state_for(
        &mut self,
        nodes: &[u32],
        describe: impl FnOnce() -> (Box<[u32]>, bool),
    ) -> Option<Sid> {
        if let Some(&id) = self.by_set.get(nodes) {
            return Some(id);
        }
        // Indexes stay below the flag bits (the limit is far lower).
        if self.states.len() >= self.limits.states.min(DEAD as usize) {
            self.note_full();
            return None;
        }
        let (finals, needs_word) = describe();
        let mut id = Sid(u32::try_from(self.states.len()).ok()?);
        if needs_word {
            id.0 |= NEEDS_WORD;
        }
        if nodes.is_empty() {
            id.0 |= DEAD;
        }
        let nodes: Box<[u32]> = nodes.into();
        self.by_set.insert(nodes.clone(), id);
        self.states.push(State { id, nodes, finals });
        Some(id)
    }

    /// Remembers the step `state --word--> next`; false (nothing stored) when full, and then, as
    /// for [`Dfa::state_for`], every state id obtained before is stale.
    pub(super) fn learn(&mut self, sid: Sid, word: Word, next: Sid) -> bool {
        let state = sid.0;
        if self.short.len() + self.transitions.len() >= self.limits.transitions {
            self.note_full();
            return false;
        }
        match word {
            Word::Short(text, len) => self.short.insert(ShortKey { state, len, text }, next),
            Word::Id(id) => self.transitions.insert(key(state, id), next),
        };
        true
    }

    /// A step was not stored for lack of room (the topic is walked from there): judges a
    /// thrashing cache (see the module docs), and after enough of them starts over.
    fn note_full(&mut self) {
        self.full_misses += 1;
        let (uid, epoch) = (self.uid, self.epoch);
        if self.full_misses == self.limits.window() {
            if self.full_answered * 2 < self.full_misses {
                self.reset(uid, epoch);
                self.bypass = self.bypass_len;
                self.bypass_len = (self.bypass_len * 2).min(self.limits.first_bypass() * 16);
                return;
            }
            self.bypass_len = self.limits.first_bypass();
        }
        if self.full_misses >= self.limits.transitions {
            self.reset(uid, epoch);
        }
    }

    /// Number of states, of steps and of remembered topics (for tests).
    #[cfg(test)]
    pub(super) fn len(&self) -> (usize, usize, usize) {
        (
            self.states.len(),
            self.short.len() + self.transitions.len(),
            self.topics.len(),
        )
    }
}

struct Slots {
    dfas: Vec<Dfa>,
    clock: u64,
    limits: Limits,
}

thread_local! {
    static SLOTS_TLS: RefCell<Slots> = const {
        RefCell::new(Slots { dfas: Vec::new(), clock: 0, limits: DEFAULT_LIMITS })
    };
}

/// Runs `f` with this thread's cache for trie `(uid, epoch)` (emptied first if it was built for
/// another epoch). Returns `None` without running `f` when the cache cannot be used (re-entered
/// from inside `f`, or during thread teardown): the caller then walks without it.
pub(super) fn with<R>(uid: u64, epoch: u64, f: impl FnOnce(&mut Dfa) -> R) -> Option<R> {
    SLOTS_TLS
        .try_with(|slots| {
            let mut slots = slots.try_borrow_mut().ok()?;
            let slots = &mut *slots;
            slots.clock += 1;
            let now = slots.clock;
            let i = match slots.dfas.iter().position(|d| d.uid == uid) {
                Some(i) => i,
                None if slots.dfas.len() < SLOTS => {
                    slots.dfas.push(Dfa::new(uid, epoch, slots.limits));
                    slots.dfas.len() - 1
                }
                None => {
                    // Reuse the least recently used slot.
                    let i = (0..slots.dfas.len())
                        .min_by_key(|&i| slots.dfas[i].used)
                        .unwrap_or(0);
                    let dfa = &mut slots.dfas[i];
                    dfa.reset(uid, epoch);
                    // Another trie: its workload has not been judged.
                    dfa.bypass = 0;
                    dfa.bypass_len = dfa.limits.first_bypass();
                    i
                }
            };
            let dfa = &mut slots.dfas[i];
            if dfa.epoch != epoch {
                dfa.reset(uid, epoch);
            }
            dfa.used = now;
            Some(f(dfa))
        })
        .ok()
        .flatten()
}

/// Test hook: this thread's caches get these limits (existing ones are dropped).
#[cfg(test)]
pub(super) fn set_limits_for_this_thread(states: usize, transitions: usize, topics: usize) {
    SLOTS_TLS.with(|s| {
        let mut s = s.borrow_mut();
        s.dfas.clear();
        s.limits = Limits {
            states,
            transitions,
            topics,
        };
    });
}
