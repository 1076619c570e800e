//! The allocation bound: a global allocator that measures what one thread allocates while
//! a fuzz input runs.
//!
//! A crate whose fuzz targets check the bound installs it in its test build only:
//!
//! ```ignore
//! #[cfg(test)]
//! #[global_allocator]
//! static FUZZ_ALLOC: tidings_fuzz::TrackingAlloc = tidings_fuzz::TrackingAlloc;
//! ```
//!
//! Measuring is per thread and off by default: the engine turns it on, on its worker thread,
//! around each call of the target; every other thread (other tests of the same binary) pays
//! one thread-local load per allocation and is never counted. While on, it keeps the bytes
//! live on this thread since the start, their peak, and the largest single request. A
//! request larger than [`HARD_CAP`] on a measured thread is refused (the process then
//! aborts with "memory allocation of N bytes failed") rather than granted: such a request
//! is a decoder trusting a length field, and granting it could take the machine's memory
//! down with the test. The run's seed, printed first, replays it.
//!
//! Memory freed on the measured thread that another thread allocated lowers the live count;
//! memory the target hands to another thread is counted where it was allocated. Both are
//! fine for a decoder, which allocates and frees on the calling thread.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The largest single request granted on a measured thread: 1 GiB.
pub const HARD_CAP: usize = 1 << 30;

/// Wraps [`System`]; measures the engine's worker thread while a target runs.
#[derive(Debug, Default, Clone, Copy)]
pub struct TrackingAlloc;

#[derive(Clone, Copy)]
struct State {
    on: bool,
    live: isize,
    peak: usize,
    largest: usize,
}

thread_local! {
    // `const` and `Copy`: no lazy initialisation, no destructor, so reading it inside the
    // allocator never allocates (and works during thread teardown).
    static STATE: Cell<State> = const {
        Cell::new(State { on: false, live: 0, peak: 0, largest: 0 })
    };
}

/// What one measured call allocated on its thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Measured {
    /// Highest live heap bytes (allocated minus freed on this thread) during the call.
    pub peak: usize,
    /// The largest single request.
    pub largest: usize,
}

/// Starts measuring this thread from zero.
pub(crate) fn start() {
    STATE.with(|s| {
        s.set(State {
            on: true,
            live: 0,
            peak: 0,
            largest: 0,
        });
    });
}

/// Stops measuring this thread and returns what was measured since [`start`].
pub(crate) fn stop() -> Measured {
    STATE.with(|s| {
        let st = s.get();
        s.set(State { on: false, ..st });
        Measured {
            peak: st.peak,
            largest: st.largest,
        }
    })
}

/// True when [`TrackingAlloc`] is this process's global allocator (probed by measuring one
/// allocation).
pub(crate) fn installed() -> bool {
    start();
    drop(std::hint::black_box(Box::new([0u8; 64])));
    stop().largest >= 64
}

/// Counts `size` bytes in (`grow`) or out; refuses a measured request beyond the cap.
#[inline]
fn admit(size: usize) -> bool {
    STATE.with(|s| {
        let mut st = s.get();
        if !st.on {
            return true;
        }
        if size > HARD_CAP {
            return false;
        }
        st.live = st.live.saturating_add(size as isize);
        st.peak = st.peak.max(st.live.max(0) as usize);
        st.largest = st.largest.max(size);
        s.set(st);
        true
    })
}

#[inline]
fn release(size: usize) {
    STATE.with(|s| {
        let mut st = s.get();
        if st.on {
            st.live = st.live.saturating_sub(size as isize);
            s.set(st);
        }
    });
}

// SAFETY: every call forwards to `System` with the caller's layout and pointer unchanged, or
// returns null (a permitted allocation failure) without touching memory; the bookkeeping is
// a thread-local `Cell` of plain integers that never allocates, never unwinds and never
// affects the memory returned.
unsafe impl GlobalAlloc for TrackingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !admit(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's contract for `alloc` is `System::alloc`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !admit(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        release(layout.size());
        // SAFETY: `ptr` came from `System` with this layout (every allocation here does).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !admit(new_size) {
            return std::ptr::null_mut();
        }
        // SAFETY: `ptr` came from `System` with `layout`; the caller upholds the rest.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if p.is_null() {
            // The old block is still live: take back what was counted for the new one.
            release(new_size);
        } else {
            release(layout.size());
        }
        p
    }
}
