//! Where a panic happened, and panics on threads the engine does not run.
//!
//! The engine catches a target's panic with `catch_unwind`, which gives the message but not
//! the place; a panic hook, installed once and chained to the one before it (so every other
//! test's panics print exactly as they did), keeps the `file:line` of the last panic on each
//! fuzz worker thread (named `fuzz-<target>`). It also counts panics on threads a target
//! names with [`watch`] — a server's own threads, whose panics no `catch_unwind` of ours
//! sees (the admin API's, say).

use std::cell::RefCell;
use std::sync::{Mutex, Once};

static INSTALL: Once = Once::new();

/// Watched thread names, with the panics seen on them: (count, last message and place).
static WATCHED: Mutex<Vec<(String, u64, String)>> = Mutex::new(Vec::new());

thread_local! {
    static LAST: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Installs the chained hook (once per process).
pub(crate) fn install() {
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let place = info
                .location()
                .map(|l| format!("at {}:{}:{}", l.file(), l.line(), l.column()))
                .unwrap_or_default();
            let thread = std::thread::current();
            let name = thread.name().unwrap_or("");
            if name.starts_with("fuzz-") {
                LAST.with(|l| *l.borrow_mut() = Some(place.clone()));
            }
            if let Ok(mut w) = WATCHED.lock()
                && let Some(entry) = w.iter_mut().find(|(n, ..)| name.starts_with(n.as_str()))
            {
                let msg = info
                    .payload()
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| info.payload().downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                entry.1 += 1;
                entry.2 = format!("{msg} {place}");
            }
            previous(info);
        }));
    });
}

/// The place of the last panic on this thread, taken.
pub(crate) fn last_location() -> Option<String> {
    LAST.with(|l| l.borrow_mut().take())
}

/// Panics on threads whose name starts with `prefix`, counted from [`watch`] on.
#[derive(Debug)]
pub struct PanicWatch {
    prefix: String,
}

/// Starts counting panics on threads whose name starts with `thread_prefix`.
pub fn watch(thread_prefix: &str) -> PanicWatch {
    install();
    if let Ok(mut w) = WATCHED.lock()
        && !w.iter().any(|(n, ..)| n == thread_prefix)
    {
        w.push((thread_prefix.to_owned(), 0, String::new()));
    }
    PanicWatch {
        prefix: thread_prefix.to_owned(),
    }
}

impl PanicWatch {
    /// Panics seen so far, and the last one's message and place.
    #[must_use]
    pub fn seen(&self) -> (u64, String) {
        WATCHED
            .lock()
            .ok()
            .and_then(|w| {
                w.iter()
                    .find(|(n, ..)| *n == self.prefix)
                    .map(|(_, c, m)| (*c, m.clone()))
            })
            .unwrap_or_default()
    }
}
