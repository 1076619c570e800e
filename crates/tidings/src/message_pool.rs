//! Recycled message allocations: the publish → dispatch hot path without `malloc` and `free`.
//!
//! # Why
//!
//! Every publish allocates one `Arc<Message>`, and the dispatcher that finishes it last frees
//! it, usually on another thread. With glibc's allocator that free lands in the publisher's
//! arena under its lock, while the publisher, whose per-thread cache those frees never refill,
//! takes the same lock to allocate: the two threads contend on the arena lock for every
//! message (the profile is in BENCHMARKS.md, "Measurements behind design choices").
//!
//! # How
//!
//! Whoever drops what it knows is the last reference of a finished message (the dispatcher
//! after a successful delivery, the publisher at the end of `publish`) hands it to
//! [`recycle`]. If it is indeed the only reference (`Arc::get_mut`: no other strong or weak
//! reference), the parts that may own user memory are dropped at once (payload, key, headers,
//! reply topic, correlation id: a recycled message never keeps a payload alive) and the
//! allocation goes into a per-thread stash, where a publish finds it ([`recycled`]) and
//! writes its next message into it in place. A full stash moves to a small shared pool in one
//! lock; a publisher whose stash is empty takes a whole batch from it in one lock. So the
//! shared lock is taken once per [`BATCH`] messages on each side, not once per message.
//!
//! # Bounds
//!
//! At most [`BATCH`] messages per thread, and in the shared pool at most as many as the
//! largest queue subscribed in this process so far can hold ([`expect_queue`]), at least
//! [`MIN_POOL_BATCHES`] × [`BATCH`] (256) and at most [`MAX_POOL_BATCHES`] × [`BATCH`]
//! (16,384). Each is the size of a `Message` with no payload and its reference counts (256
//! bytes): at most 4 MiB, and with the default capacity of 1,024, 256 KiB, however many
//! messages go through.
//! A message that is not unique when recycled, or that finds the pool full, is simply
//! dropped, as without the pool.
//!
//! Why the queue's capacity: a subscription's queue that fills (a burst, or the manual
//! driver, which delivers only in `run_until_idle`) holds that many messages at once, and
//! they all come back when it drains. A pool smaller than that frees the excess and the next
//! burst allocates it again, one `malloc` per message (the `alloc/publish` bench case: 0.93
//! per message with a 4,096-message queue and a 256-message pool). The allocator would keep
//! that memory for the process after the free anyway (glibc returns only the top of its heap
//! to the system), so keeping it here raises the resident size little, and the limit holds it
//! to one queue's worth, not the sum of every queue.
//!
//! The batches' own vectors circulate too: a thread that takes a full batch leaves its empty
//! vector in the pool, and a thread whose stash fills takes an empty one from there, so
//! moving messages between threads allocates nothing either.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

use crate::message::Message;

/// Messages moved between a thread's stash and the shared pool at a time.
const BATCH: usize = 32;
/// Batches the shared pool may always hold.
const MIN_POOL_BATCHES: usize = 8;
/// Batches the shared pool holds at most, however large the queues.
const MAX_POOL_BATCHES: usize = 512;

/// Batches the shared pool holds at most now: raised by [`expect_queue`], never lowered.
static POOL_BATCHES: AtomicUsize = AtomicUsize::new(MIN_POOL_BATCHES);

/// Recycled messages in full batches, and the empty vectors batches travel in, shared by
/// every thread.
struct Pool {
    full: Vec<Vec<Arc<Message>>>,
    empty: Vec<Vec<Arc<Message>>>,
}

impl Pool {
    /// Keep `batch` in `list` unless it holds `limit` already. Room for `limit` is reserved
    /// at once, so the lists do not grow step by step while messages circulate.
    fn keep(list: &mut Vec<Vec<Arc<Message>>>, batch: Vec<Arc<Message>>, limit: usize) -> bool {
        if list.len() >= limit {
            return false;
        }
        if list.len() == list.capacity() {
            list.reserve_exact(limit - list.len());
        }
        list.push(batch);
        true
    }
}

static POOL: Mutex<Pool> = Mutex::new(Pool {
    full: Vec::new(),
    empty: Vec::new(),
});

std::thread_local! {
    /// This thread's recycled messages: filled by [`recycle`], emptied by [`recycled`].
    static STASH: RefCell<Vec<Arc<Message>>> = const { RefCell::new(Vec::new()) };
}

/// A subscription whose queue holds up to `capacity` messages exists: let the shared pool
/// keep as many (within [`MAX_POOL_BATCHES`]), so a full queue that drains and fills again
/// reuses its messages' allocations instead of freeing and allocating them again.
pub(crate) fn expect_queue(capacity: usize) {
    let batches = capacity.div_ceil(BATCH).min(MAX_POOL_BATCHES);
    POOL_BATCHES.fetch_max(batches, Ordering::Relaxed);
}

/// A recycled allocation for the next message, when this thread's stash (or the shared
/// pool) has one. Only unique messages are stashed and nothing else can see them, so
/// `Arc::get_mut` gives the caller the whole message, to overwrite in place (publish writes
/// it field by field: src/broker/publish.rs).
pub(crate) fn recycled() -> Option<Arc<Message>> {
    STASH
        .try_with(|stash| {
            let mut stash = stash.try_borrow_mut().ok()?;
            if stash.is_empty() {
                let mut pool = POOL.lock();
                let full = pool.full.pop()?;
                // The emptied vector stays in circulation for a thread whose stash fills.
                let empty = std::mem::replace(&mut *stash, full);
                Pool::keep(&mut pool.empty, empty, POOL_BATCHES.load(Ordering::Relaxed));
            }
            stash.pop()
        })
        .ok()
        .flatten()
}

/// `message` in a shared allocation: a recycled one when there is one, else a new one.
#[cfg(test)]
pub(crate) fn allocate(message: Message) -> Arc<Message> {
    match recycled() {
        Some(mut arc) => match Arc::get_mut(&mut arc) {
            Some(slot) => {
                *slot = message;
                arc
            }
            None => Arc::new(message),
        },
        None => Arc::new(message),
    }
}

/// Drops `message`, keeping its allocation for a later publish ([`recycled`]) when this was its last
/// reference.
pub(crate) fn recycle(mut message: Arc<Message>) {
    // A cheap first look: most references dropped in a fan-out are not the last one.
    if Arc::strong_count(&message) != 1 {
        return;
    }
    let Some(m) = Arc::get_mut(&mut message) else {
        return;
    };
    m.release_user_memory();
    let _ = STASH.try_with(|stash| {
        let Ok(mut stash) = stash.try_borrow_mut() else {
            return;
        };
        if stash.capacity() == 0 {
            // A thread's first recycle: its stash's vector, once.
            stash.reserve_exact(BATCH);
        }
        stash.push(message);
        if stash.len() >= BATCH {
            let mut pool = POOL.lock();
            let limit = POOL_BATCHES.load(Ordering::Relaxed);
            if pool.full.len() < limit {
                let empty = pool
                    .empty
                    .pop()
                    .unwrap_or_else(|| Vec::with_capacity(BATCH));
                let full = std::mem::replace(&mut *stash, empty);
                Pool::keep(&mut pool.full, full, limit);
            } else {
                drop(pool);
                // Freed outside the lock; the stash keeps its vector.
                stash.clear();
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use bytes::Bytes;

    use super::*;

    /// A payload that says when it is dropped.
    struct Watched(Arc<AtomicBool>);

    impl AsRef<[u8]> for Watched {
        fn as_ref(&self) -> &[u8] {
            b"watched payload"
        }
    }

    impl Drop for Watched {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    fn message(topic: &str, payload: Bytes) -> Message {
        Message::to(topic)
            .payload(payload)
            .key("k")
            .header("h", "v")
            .correlation_id("c")
            .build_detached()
            .unwrap()
    }

    #[test]
    fn a_recycled_message_lets_its_payload_go_and_its_allocation_is_reused() {
        let dropped = Arc::new(AtomicBool::new(false));
        let first = allocate(message("a.b", Bytes::from_owner(Watched(dropped.clone()))));
        let at = Arc::as_ptr(&first);
        recycle(first);
        assert!(
            dropped.load(Ordering::SeqCst),
            "a recycled message keeps no payload alive"
        );
        let second = allocate(message("c.d", Bytes::from_static(b"second")));
        assert_eq!(Arc::as_ptr(&second), at, "the allocation is reused");
        assert_eq!(second.topic().as_str(), "c.d");
        assert_eq!(second.payload(), &b"second"[..]);
        assert_eq!(second.key(), Some(&b"k"[..]));
        assert_eq!(second.header("h"), Some("v"));
        assert_eq!(second.correlation_id(), Some("c"));
    }

    #[test]
    fn a_message_someone_else_holds_is_left_alone() {
        let dropped = Arc::new(AtomicBool::new(false));
        let first = allocate(message("a.b", Bytes::from_owner(Watched(dropped.clone()))));
        let held = first.clone();
        recycle(first);
        assert!(!dropped.load(Ordering::SeqCst));
        assert_eq!(held.payload(), &b"watched payload"[..]);
        let second = allocate(message("c.d", Bytes::new()));
        assert_ne!(Arc::as_ptr(&second), Arc::as_ptr(&held));
        assert_eq!(held.topic().as_str(), "a.b");
        assert_eq!(held.key(), Some(&b"k"[..]));
        drop(held);
        assert!(dropped.load(Ordering::SeqCst));
    }

    /// The module docs' bound: what the shared pool can hold at most, counted with each
    /// allocation's reference counts.
    #[test]
    fn the_documented_bound_holds() {
        let each = std::mem::size_of::<Message>() + 2 * std::mem::size_of::<usize>();
        assert!(
            each <= 256,
            "{each} bytes per message; update the module docs"
        );
        assert!(MAX_POOL_BATCHES * BATCH * each <= 4 << 20, "at most 4 MiB");
    }

    /// A queue raises what the shared pool keeps to its capacity, within the maximum, and
    /// a smaller queue later never lowers it.
    #[test]
    fn a_large_queue_raises_the_bound_up_to_the_maximum() {
        expect_queue(100 * BATCH);
        assert!(POOL_BATCHES.load(Ordering::Relaxed) >= 100);
        expect_queue(usize::MAX);
        assert_eq!(POOL_BATCHES.load(Ordering::Relaxed), MAX_POOL_BATCHES);
        expect_queue(1);
        assert_eq!(POOL_BATCHES.load(Ordering::Relaxed), MAX_POOL_BATCHES);
    }

    #[test]
    fn what_is_kept_is_bounded() {
        let kept: Vec<_> = (0..(MAX_POOL_BATCHES + 2) * BATCH)
            .map(|_| Arc::new(message("a.b", Bytes::new())))
            .collect();
        for m in kept {
            recycle(m);
        }
        let stash = STASH.with(|s| s.borrow().len());
        assert!(stash < BATCH, "a full stash moves to the shared pool");
        let pool = POOL.lock();
        assert!(pool.full.len() <= POOL_BATCHES.load(Ordering::Relaxed));
        assert!(pool.full.len() <= MAX_POOL_BATCHES);
        assert!(pool.full.iter().all(|b| b.len() == BATCH));
    }
}
