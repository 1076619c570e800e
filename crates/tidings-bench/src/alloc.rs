//! A counting global allocator: live bytes, measured rather than guessed.
//!
//! Install it in a binary with
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOC: tidings_bench::alloc::CountingAlloc = tidings_bench::alloc::CountingAlloc;
//! ```
//!
//! Counting is off except inside a measurement window ([`Window`]), so the other benchmarks
//! pay one relaxed load per allocation and nothing else. Inside a window, every allocation,
//! reallocation and free adjusts a signed live-bytes counter; the window's result is the net
//! growth, which for "create S idle subscriptions and keep them" is their footprint. It also
//! counts allocation calls (a `realloc` that moves counts as one), for "allocations per
//! message" in steady state.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

static ENABLED: AtomicBool = AtomicBool::new(false);
static SEEN: AtomicBool = AtomicBool::new(false);
static LIVE: AtomicI64 = AtomicI64::new(0);
static CALLS: AtomicU64 = AtomicU64::new(0);

/// Wraps [`System`] and counts live bytes while a [`Window`] is open.
#[derive(Debug, Default, Clone, Copy)]
pub struct CountingAlloc;

impl CountingAlloc {
    /// True when this allocator is the process's global allocator (probed by allocating
    /// inside a window).
    #[must_use]
    pub fn installed() -> bool {
        let w = Window::open();
        let probe = std::hint::black_box(Box::new([0u8; 64]));
        drop(std::hint::black_box(probe));
        let seen = SEEN.load(Ordering::Relaxed);
        drop(w);
        seen
    }
}

#[inline]
fn count(delta: i64) {
    if ENABLED.load(Ordering::Relaxed) {
        SEEN.store(true, Ordering::Relaxed);
        LIVE.fetch_add(delta, Ordering::Relaxed);
    }
}

#[inline]
fn count_call() {
    if ENABLED.load(Ordering::Relaxed) {
        CALLS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every call forwards to `System` with the caller's layout and pointer unchanged;
// the counters never affect the returned memory.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            count(layout.size() as i64);
            count_call();
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            count(layout.size() as i64);
            count_call();
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) };
        count(-(layout.size() as i64));
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            count(new_size as i64 - layout.size() as i64);
            if p != ptr {
                count_call();
            }
        }
        p
    }
}

/// A measurement window: counts live-byte changes from `open` to `net`.
#[derive(Debug)]
pub struct Window {
    start: i64,
    calls: u64,
}

impl Window {
    /// Start counting (windows do not nest).
    #[must_use]
    pub fn open() -> Self {
        SEEN.store(false, Ordering::Relaxed);
        ENABLED.store(true, Ordering::SeqCst);
        Self {
            start: LIVE.load(Ordering::SeqCst),
            calls: CALLS.load(Ordering::SeqCst),
        }
    }
    /// Allocation calls (including moving reallocations) since `open`, on every thread.
    #[must_use]
    pub fn allocations(&self) -> u64 {
        CALLS.load(Ordering::SeqCst) - self.calls
    }
    /// Net bytes allocated and still live since `open`.
    #[must_use]
    pub fn net(&self) -> i64 {
        LIVE.load(Ordering::SeqCst) - self.start
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        ENABLED.store(false, Ordering::SeqCst);
    }
}
