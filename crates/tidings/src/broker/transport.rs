//! The broker's side of the transport seam (src/transport): the builder option, the
//! publish hook (send instead of route), the subscribe hook (each buffered subscription's
//! own transport subscription, re-checked with tidings' matcher, offered without waiting),
//! and closing.
//!
//! Without a transport none of this runs: publish routes in-process, as before, at the
//! cost of one `Option` test.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::clock::{Now, deadline_after};
use crate::durable::DurableBackend;
use crate::error::{ConfigError, PublishError, SubscribeError};
use crate::message::Message;
use crate::report::PublishReport;
use crate::request::{Inbox, RequestError};
use crate::route_cache::Targets;
use crate::scheduler::Target;
use crate::subscription::shell::{SubscriptionShell, without_waiting};
use crate::transport::{Deliver, Delivered, Received, Transport, TransportSubscription};

use super::{BrokerBuilder, BrokerInner};

/// How often the manual driver looks for a reply that travels over a transport.
const REPLY_POLL: Duration = Duration::from_millis(1);

/// A broker's transport, and whether durable appends already reach its subscribers.
pub(crate) struct Attached {
    pub(crate) transport: Arc<dyn Transport>,
    /// The broker's durable backend publishes its appends on the transport's connection
    /// ([`carries_appends`]), decided at build.
    pub(crate) carries_appends: bool,
}

impl BrokerBuilder {
    /// Carry buffered publishes and subscriptions over `transport` (NATS core, say) instead
    /// of in-process routing: `publish` sends every message through it, and every buffered
    /// subscription receives through its own transport subscription into its own bounded
    /// queue and dispatcher. Durable subscriptions are unaffected. See
    /// [`crate::transport`] for what changes: at-most-once across the network,
    /// `Overflow::Block` does not block, the publish report counts nobody as accepted.
    ///
    /// With a durable backend whose appends the transport already carries (JetStream and the
    /// NATS transport built from one connection: [`Transport::connection`] equals
    /// [`DurableBackend::appends_published_on`]), a message appended to a stream is not sent
    /// again. [`build`](Self::build) refuses a transport and a backend that each name a
    /// connection, and not the same one.
    ///
    /// [`DurableBackend::appends_published_on`]: crate::durable::DurableBackend::appends_published_on
    pub fn transport(mut self, transport: Arc<dyn Transport>) -> Self {
        self.transport = Some(transport);
        self
    }
}

/// Whether `backend`'s appends already reach `transport`'s subscribers: both were built from
/// one connection.
///
/// # Errors
/// [`ConfigError::Invalid`] when both name a connection and not the same one: an append
/// would reach another server's subscribers and not this one's, or this server's twice.
pub(super) fn carries_appends(
    transport: &dyn Transport,
    backend: Option<&dyn DurableBackend>,
) -> Result<bool, ConfigError> {
    match (
        transport.connection(),
        backend.and_then(|b| b.appends_published_on()),
    ) {
        (Some(sends), Some(appends)) if sends == appends => Ok(true),
        (Some(_), Some(_)) => Err(ConfigError::invalid(
            "transport",
            "a connection other than the durable backend's".to_owned(),
            "the durable backend's own connection: build both from one connection",
        )),
        _ => Ok(false),
    }
}

impl BrokerInner {
    /// Where an undelayed (or due) message goes: the router, or the transport. `appended`:
    /// the message is already in a durable stream; `targets`: its route, when the publish
    /// already looked it up; `now`: the publish's clock reading.
    pub(super) fn dispatch(
        &self,
        message: &Arc<Message>,
        appended: bool,
        targets: Option<Targets>,
        now: &Now<'_>,
    ) -> Result<PublishReport, PublishError> {
        let Some(attached) = &self.transport else {
            return Ok(self.route(message, targets, now));
        };
        if self.transport_publishes(appended) {
            attached
                .transport
                .publish(message)
                .map_err(PublishError::Transport)?;
        }
        Ok(PublishReport {
            id: message.id(),
            accepted: 0,
            refused: Vec::new(),
            // A delayed message travels now; each receiving broker holds it until due.
            scheduled: message.deliver_at().is_some(),
            streams: Vec::new(),
            duplicate_in: Vec::new(),
        })
    }

    /// Whether a publish goes out on the transport: there is one, and it does not already
    /// carry the message (`appended` to a stream on the transport's own connection).
    pub(super) fn transport_publishes(&self, appended: bool) -> bool {
        self.transport
            .as_ref()
            .is_some_and(|attached| !(appended && attached.carries_appends))
    }

    /// Whether buffered subscriptions receive through a transport.
    pub(super) fn has_transport(&self) -> bool {
        self.transport.is_some()
    }

    /// Open `shared`'s own transport subscription (after it is registered and started);
    /// `replies`: it is the reply inbox
    /// ([`Transport::subscribe_replies`](crate::transport::Transport::subscribe_replies)).
    /// On failure the subscription is removed and closed again.
    pub(super) fn open_remote(
        &self,
        shared: &Arc<SubscriptionShell>,
        replies: bool,
    ) -> Result<(), SubscribeError> {
        let Some(attached) = &self.transport else {
            return Ok(());
        };
        let deliver = self.deliver_to(shared);
        let opened = if replies {
            attached
                .transport
                .subscribe_replies(&shared.pattern, deliver)
        } else {
            attached.transport.subscribe(&shared.pattern, deliver)
        };
        match opened {
            Ok(remote) => {
                let mut reg = self.registry.write();
                let live =
                    reg.all.contains_key(&shared.id) || reg.internal.contains_key(&shared.id);
                if live {
                    reg.remote.insert(shared.id, remote);
                } else {
                    // Unsubscribed or closed meanwhile.
                    drop(reg);
                    remote.close();
                }
                Ok(())
            }
            Err(e) => {
                {
                    let mut reg = self.registry.write();
                    reg.all.remove(&shared.id);
                    reg.internal.remove(&shared.id);
                }
                drop(shared.close());
                Err(SubscribeError::Transport(e))
            }
        }
    }

    /// The callback a transport subscription hands received messages to: re-check the
    /// pattern with tidings' matcher (the transport may receive a superset), hold a
    /// delayed message until due (R-TIME-2), offer without ever waiting (a remote
    /// publisher cannot be made to wait: `Block` refuses when full, counted).
    fn deliver_to(&self, shared: &Arc<SubscriptionShell>) -> Deliver {
        let sub = Arc::downgrade(shared);
        let broker = self.weak.clone();
        let pattern = shared.pattern.clone();
        Deliver::new(move |received: Received| {
            let Some(sub) = sub.upgrade() else {
                return Delivered::Closed;
            };
            let mut message = match received {
                Received::Message(message) => message,
                Received::NoResponders { reply_to } => {
                    if let Some(broker) = broker.upgrade()
                        && let Some(inbox) = broker.inbox.get()
                    {
                        inbox.no_responders(reply_to.as_str());
                    }
                    return Delivered::Offered;
                }
            };
            if !pattern.matches(message.topic()) {
                return Delivered::NotMatching;
            }
            // An offset names a place in a stream this subscription does not read.
            message.log_offset = None;
            let message = Arc::new(message);
            if message.deliver_at().is_some()
                && let Some(broker) = broker.upgrade()
                && let Some(due) = broker.due_time(&message, &Now::new(broker.clock.as_ref()))
            {
                let later = Arc::downgrade(&sub);
                let offer = Box::new(move |m: &Arc<Message>| {
                    if let Some(s) = later.upgrade() {
                        let _ = s.offer(m);
                    }
                });
                // False only when the broker closed: the message is dropped, as on close.
                let _ = broker.schedule_for(due, message, Target::Only(sub.id, offer));
                return Delivered::Offered;
            }
            // Refusals are counted (and dead-lettered) by the subscription itself.
            let _ = without_waiting(|| sub.offer(&message));
            Delivered::Offered
        })
    }

    /// The nonce naming the reply inbox. In-process it only has to differ from other
    /// topics of this broker; over a transport it must differ from every other broker's
    /// (requests are numbered from `r0` everywhere), and the id's low half is only this
    /// broker's message count: a random 64 bits (std's per-process random hash keys)
    /// mixed with the id.
    pub(super) fn inbox_nonce(&self) -> u64 {
        let id = self.ids.next(self.clock.wall()).as_u128();
        if !self.has_transport() {
            return id as u64;
        }
        let mut hasher = RandomState::new().build_hasher();
        hasher.write_u128(id);
        hasher.finish()
    }

    /// The reply-to topic of request `id`: the inbox itself in-process, one topic per
    /// request under it over a transport (src/request.rs).
    pub(super) fn reply_topic(&self, inbox: &Inbox, id: &str) -> String {
        if self.has_transport() {
            inbox.reply_topic(id)
        } else {
            inbox.topic.clone()
        }
    }

    /// The pattern of the inbox subscription (see [`BrokerInner::reply_topic`]).
    pub(super) fn inbox_pattern(&self, inbox: &Inbox) -> String {
        if self.has_transport() {
            inbox.transport_pattern()
        } else {
            inbox.topic.clone()
        }
    }

    /// Manual driver: deliver until the outcome of request `id` is known. In-process the
    /// reply exists once `run_until_idle` returns; over a transport it arrives later, from
    /// the network, so this delivers again until it does or `timeout` passed in real time
    /// (the manual clock would never get there).
    pub(super) fn run_until_reply(
        &self,
        inbox: &Inbox,
        id: &str,
        timeout: Duration,
    ) -> Option<Result<Arc<Message>, RequestError>> {
        let deadline = deadline_after(Instant::now(), timeout);
        loop {
            self.run_until_idle();
            let outcome = inbox.try_take(id);
            if outcome.is_some() || !self.has_transport() || inbox.is_closed() {
                return outcome;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return None;
            }
            std::thread::sleep(REPLY_POLL);
        }
    }

    /// Stop receiving for every subscription (close, first step).
    pub(super) fn close_remotes(&self) {
        let remotes = std::mem::take(&mut self.registry.write().remote);
        for remote in remotes.into_values() {
            remote.close();
        }
    }

    /// Release the transport (close, last step).
    pub(super) fn close_transport(&self) {
        if let Some(attached) = &self.transport {
            attached.transport.close();
        }
    }

    /// Stop receiving for one subscription (unsubscribe).
    pub(super) fn close_remote(&self, remote: Option<Box<dyn TransportSubscription>>) {
        if let Some(remote) = remote {
            remote.close();
        }
    }
}
