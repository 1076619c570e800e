//! Request-reply over the broker (R-PAT-1).
//!
//! One reply inbox per broker: a single internal subscription on `_inbox.<nonce>` and a
//! table of outstanding correlation ids. A request publishes with `reply_to` = the inbox
//! and a fresh correlation id, then waits (on the broker's clock) for the reply with that
//! id. A timed-out request removes its entry, so the table never keeps leftovers; a reply
//! arriving after its request gave up is counted in `late_replies` and dropped.
//!
//! # Over a transport
//! With a [transport](crate::transport) the inbox is still one subscription, on
//! `_inbox.<nonce>.*`, and each request's reply-to is `_inbox.<nonce>.<correlation id>`:
//! a transport that learns a request reached nobody (NATS's no-responders status, sent to
//! the reply subject) names the request by its reply-to topic, and the request fails at
//! once with [`RequestError::NoResponders`] instead of timing out.
//!
//! # Closing
//! Broker close closes the inbox: every waiting request wakes at once with
//! [`RequestError::Closed`] (R-CORE-6), and later requests fail with it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use crate::clock::Clock;
use crate::error::PublishError;
use crate::handler::HandlerError;
use crate::message::Message;
use crate::sync::{AtomicBool, AtomicU64, Condvar, Mutex, Ordering, wait_until};

/// Why a request got no reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// No subscription accepted the request (none matched, or all refused it).
    #[error("no subscriber accepted the request")]
    NoResponders,
    /// No reply within the timeout.
    #[error("no reply within the timeout")]
    Timeout,
    /// The request could not be published.
    #[error(transparent)]
    Publish(#[from] PublishError),
    /// The reply inbox could not be created.
    #[error("the reply inbox could not be created: {0}")]
    Inbox(String),
    /// The broker is closed, or closed while the request waited (R-CORE-6).
    #[error("the broker is closed")]
    Closed,
    /// [`Broker::request_async`](crate::Broker::request_async) only: the tokio runtime it
    /// ran on shut down before the reply came; the request may have been published.
    #[error("the async runtime shut down before the reply came")]
    RuntimeShutDown,
}

/// Where one outstanding request is.
enum Slot {
    Waiting,
    Replied(Arc<Message>),
    /// The transport reported that the request reached no subscriber.
    NoResponders,
}

pub(crate) struct Inbox {
    pub(crate) topic: String,
    pending: Mutex<HashMap<String, Slot>>,
    arrived: Condvar,
    next: AtomicU64,
    late: AtomicU64,
    closed: AtomicBool,
}

impl Inbox {
    pub(crate) fn new(nonce: u64) -> Self {
        Self {
            topic: format!("_inbox.{nonce:016x}"),
            pending: Mutex::new(HashMap::new()),
            arrived: Condvar::new(),
            next: AtomicU64::new(0),
            late: AtomicU64::new(0),
            closed: AtomicBool::new(false),
        }
    }

    /// Register a new outstanding request; returns its correlation id.
    pub(crate) fn register(&self) -> String {
        let id = format!("r{}", self.next.fetch_add(1, Ordering::Relaxed));
        self.pending.lock().insert(id.clone(), Slot::Waiting);
        id
    }

    /// The reply-to topic of request `id` over a transport (see the module docs).
    pub(crate) fn reply_topic(&self, id: &str) -> String {
        format!("{}.{id}", self.topic)
    }

    /// The pattern of the inbox subscription over a transport.
    pub(crate) fn transport_pattern(&self) -> String {
        format!("{}.*", self.topic)
    }

    /// The transport says the request whose reply-to is `reply_to` reached nobody.
    pub(crate) fn no_responders(&self, reply_to: &str) {
        let Some(id) = reply_to
            .strip_prefix(self.topic.as_str())
            .and_then(|rest| rest.strip_prefix('.'))
        else {
            return;
        };
        let mut pending = self.pending.lock();
        if let Some(slot @ Slot::Waiting) = pending.get_mut(id) {
            *slot = Slot::NoResponders;
            drop(pending);
            self.arrived.notify_all();
        }
    }

    pub(crate) fn forget(&self, id: &str) {
        self.pending.lock().remove(id);
    }

    /// The inbox subscription's handler body.
    pub(crate) fn accept(&self, reply: &Message) -> Result<(), HandlerError> {
        let Some(id) = reply.correlation_id() else {
            self.late.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        };
        let mut pending = self.pending.lock();
        match pending.get_mut(id) {
            Some(slot @ Slot::Waiting) => {
                *slot = Slot::Replied(Arc::new(reply.clone()));
                drop(pending);
                self.arrived.notify_all();
            }
            _ => {
                self.late.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// The outcome for `id` if it is known (removing the entry): the reply, or
    /// `NoResponders`.
    pub(crate) fn try_take(&self, id: &str) -> Option<Result<Arc<Message>, RequestError>> {
        let mut pending = self.pending.lock();
        match pending.get(id)? {
            Slot::Waiting => None,
            Slot::Replied(_) | Slot::NoResponders => match pending.remove(id) {
                Some(Slot::Replied(reply)) => Some(Ok(reply)),
                _ => Some(Err(RequestError::NoResponders)),
            },
        }
    }

    /// Wait for the reply to `id` until `deadline` on `clock` (`None`: no deadline), or
    /// until the inbox closes; the entry is removed either way.
    pub(crate) fn wait(
        &self,
        id: &str,
        deadline: Option<Instant>,
        clock: &dyn Clock,
    ) -> Result<Arc<Message>, RequestError> {
        let mut pending = self.pending.lock();
        loop {
            match pending.get(id) {
                Some(Slot::Replied(_)) | Some(Slot::NoResponders) => {
                    return match pending.remove(id) {
                        Some(Slot::Replied(reply)) => Ok(reply),
                        _ => Err(RequestError::NoResponders),
                    };
                }
                Some(Slot::Waiting) | None => {}
            }
            if self.closed.load(Ordering::Acquire) {
                pending.remove(id);
                return Err(RequestError::Closed);
            }
            if wait_until(clock, &self.arrived, &mut pending, deadline) {
                pending.remove(id);
                return Err(RequestError::Timeout);
            }
        }
    }

    /// Close: wake every waiting request with `Closed` (broker close, R-CORE-6).
    pub(crate) fn close(&self) {
        let pending = self.pending.lock();
        self.closed.store(true, Ordering::Release);
        drop(pending);
        self.arrived.notify_all();
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Wake waiters (the clock jumped).
    pub(crate) fn wake(&self) {
        drop(self.pending.lock());
        self.arrived.notify_all();
    }

    pub(crate) fn outstanding(&self) -> usize {
        self.pending.lock().len()
    }

    pub(crate) fn late_replies(&self) -> u64 {
        self.late.load(Ordering::Relaxed)
    }
}

#[cfg(all(test, tidings_loom))]
mod loom_models {
    //! The inbox handshake, model-checked (see `subscription/loom_models.rs` to run it).

    use super::*;
    use crate::clock::SystemClock;
    use crate::message::MessageBuilder;
    use crate::subscription::loom_models::check;
    use crate::sync::thread;

    /// A reply racing its request's wait, and close racing both (R-PAT-1, R-CORE-6): the
    /// request with a reply gets it or `Closed`; the one without gets `Closed`; neither
    /// waits for ever, and no entry is left behind.
    ///
    /// Guards against: close setting its flag without the inbox's lock — a request between
    /// its "closed?" check and its wait misses the wake-up.
    #[test]
    fn waiting_requests_get_their_reply_or_closed() {
        check(|| {
            let inbox = Arc::new(Inbox::new(1));
            let answered = inbox.register();
            let unanswered = inbox.register();
            let wait = |id: &String| {
                let (inbox, id) = (inbox.clone(), id.clone());
                thread::spawn(move || inbox.wait(&id, None, &SystemClock))
            };
            let (first, second) = (wait(&answered), wait(&unanswered));
            let reply = MessageBuilder::new("_inbox.r")
                .correlation_id(answered.clone())
                .build_detached()
                .expect("a valid reply");
            inbox.accept(&reply).expect("the inbox accepts replies");
            inbox.close();
            match first.join().expect("the first request returns") {
                Ok(m) => assert_eq!(m.correlation_id(), Some(answered.as_str())),
                Err(e) => assert_eq!(e, RequestError::Closed),
            }
            assert_eq!(
                second.join().expect("the second request returns").err(),
                Some(RequestError::Closed)
            );
            assert_eq!(inbox.outstanding(), 0);
        });
    }
}
