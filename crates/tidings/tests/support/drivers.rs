//! The threaded drivers a concurrency test runs under, by name (included with
//! `#[path = "support/drivers.rs"] mod drivers;`).

use tidings::Driver;

/// Thread, a 2-worker pool and (with the `tokio` feature) tokio on a shared 2-worker runtime:
/// the drivers where publishers and dispatchers really run at once.
pub fn threaded() -> Vec<(&'static str, Driver)> {
    #[allow(unused_mut)] // tokio is a feature
    let mut d = vec![
        ("thread", Driver::Thread),
        ("pool", Driver::Pool { workers: 2 }),
    ];
    #[cfg(feature = "tokio")]
    d.push(("tokio", Driver::Tokio(runtime().handle().clone())));
    d
}

/// A runtime shared by the tests of one file (sync handlers block a worker while gated: two
/// workers).
#[cfg(feature = "tokio")]
fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime")
    })
}
