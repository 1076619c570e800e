//! How the suite builds and drives a broker.

use std::time::Duration;

use tidings::{Broker, BrokerBuilder, Driver, ManualClock};

use crate::helpers::wait_until;

/// A way to build brokers and wait for them.
pub trait DriverUnderTest {
    /// A short name for failure messages.
    fn name(&self) -> String;
    /// A builder with this driver (and clock): the durable cases add a data
    /// directory and their own manual clock to it.
    fn builder(&self) -> BrokerBuilder;
    /// A fresh broker.
    ///
    /// # Panics
    /// If the builder's configuration is invalid (a test-setup bug).
    fn broker(&self) -> Broker {
        self.builder().build().expect("valid configuration")
    }
    /// Make progress until `cond` holds; panic naming `what` if it never does.
    fn settle(&self, broker: &Broker, what: &str, cond: &mut dyn FnMut() -> bool);
    /// True when delivery happens only inside `settle` (the manual driver).
    fn is_manual(&self) -> bool {
        false
    }
    /// True when the durable cases subscribe async handlers instead of sync ones
    /// ([`TokioDriver::with_async_handlers`], R-EXE-3). Default: false.
    fn async_handlers(&self) -> bool {
        false
    }
}

/// The manual driver on a manual clock: deterministic, no sleeps.
#[derive(Default)]
pub struct ManualDriver {
    clock: ManualClock,
}

impl DriverUnderTest for ManualDriver {
    fn name(&self) -> String {
        "manual".into()
    }
    fn builder(&self) -> BrokerBuilder {
        Broker::builder()
            .driver(Driver::Manual)
            .clock(self.clock.clone())
    }
    fn settle(&self, broker: &Broker, what: &str, cond: &mut dyn FnMut() -> bool) {
        broker.run_until_idle();
        if !cond() {
            // Deliver, jumping the clock to each next wake-up, until nothing is scheduled.
            broker.settle();
        }
        assert!(cond(), "[manual] never settled: {what}");
    }
    fn is_manual(&self) -> bool {
        true
    }
}

/// A real driver on the system clock; `settle` waits up to 30 s.
pub struct ThreadedDriver {
    driver: Driver,
    label: String,
}

impl ThreadedDriver {
    /// A driver building brokers with `driver`.
    #[must_use]
    pub fn new(label: &str, driver: Driver) -> Self {
        Self {
            driver,
            label: label.into(),
        }
    }
}

impl DriverUnderTest for ThreadedDriver {
    fn name(&self) -> String {
        self.label.clone()
    }
    fn builder(&self) -> BrokerBuilder {
        Broker::builder().driver(self.driver.clone())
    }
    fn settle(&self, _broker: &Broker, what: &str, cond: &mut dyn FnMut() -> bool) {
        wait_until(
            &format!("[{}] {what}", self.label),
            Duration::from_secs(30),
            cond,
        );
    }
}

/// The tokio driver on its own multi-thread runtime (feature `tokio`).
#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
pub struct TokioDriver {
    runtime: tokio::runtime::Runtime,
    /// The durable cases subscribe async handlers (R-EXE-3).
    async_handlers: bool,
}

#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
impl TokioDriver {
    /// A driver with a 2-worker runtime.
    ///
    /// # Panics
    /// If the runtime cannot be built (a test-environment failure).
    #[must_use]
    pub fn new() -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime");
        Self {
            runtime,
            async_handlers: false,
        }
    }

    /// [`TokioDriver::new`], whose durable cases subscribe async handlers (R-EXE-3): the
    /// same functions, each inside an async handler that yields to the runtime first.
    ///
    /// # Panics
    /// If the runtime cannot be built (a test-environment failure).
    #[must_use]
    pub fn with_async_handlers() -> Self {
        Self {
            async_handlers: true,
            ..Self::new()
        }
    }
}

#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
impl Default for TokioDriver {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
impl DriverUnderTest for TokioDriver {
    fn name(&self) -> String {
        if self.async_handlers {
            "tokio-async".into()
        } else {
            "tokio".into()
        }
    }
    fn builder(&self) -> BrokerBuilder {
        Broker::builder().driver(Driver::Tokio(self.runtime.handle().clone()))
    }
    fn settle(&self, broker: &Broker, what: &str, cond: &mut dyn FnMut() -> bool) {
        ThreadedDriver::new(&self.name(), Driver::Thread).settle(broker, what, cond);
    }
    fn async_handlers(&self) -> bool {
        self.async_handlers
    }
}
