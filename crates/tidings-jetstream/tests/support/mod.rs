//! What the cluster tests share (`tests/cluster.rs`, `tests/cluster_processes.rs`): publishing
//! until the cluster acknowledges, retrying a failed publish with the same message id, and
//! the record of what that saw.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicBool;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tidings::{Broker, Message, MessageId, PublishError};

/// The node URLs with node `first` first, the others after it in order.
pub fn preferring(urls: &[String], first: usize) -> Vec<String> {
    let mut order = vec![urls[first].clone()];
    order.extend(
        urls.iter()
            .enumerate()
            .filter(|(i, _)| *i != first)
            .map(|(_, u)| u.clone()),
    );
    order
}

/// Locks `m`, whether or not a panicking thread held it.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What the publishers saw.
#[derive(Default)]
pub struct Published {
    /// Indexes whose publish returned `Ok`: stored and acknowledged by the cluster.
    pub acknowledged: Mutex<BTreeSet<u64>>,
    /// Publishes that failed (each retried with the same message id until one succeeds),
    /// by the kind of their error.
    pub failures: Mutex<BTreeMap<String, u64>>,
    /// The longest single publish call.
    pub longest: Mutex<Duration>,
    /// Set to make the publishers stop.
    pub stop: AtomicBool,
}

impl Published {
    /// How many publishes were acknowledged.
    pub fn acknowledged(&self) -> usize {
        lock(&self.acknowledged).len()
    }

    /// How many publishes failed (and were retried).
    pub fn failures(&self) -> u64 {
        lock(&self.failures).values().sum()
    }

    /// The longest single publish call.
    pub fn longest(&self) -> Duration {
        *lock(&self.longest)
    }

    /// Publishes `index` to `topic` through `broker` until the cluster acknowledges it,
    /// retrying a failed publish with the same message id (so `Nats-Msg-Id` deduplication
    /// stores it once), noting each call's duration and each failure's kind.
    pub fn publish_until_acknowledged(&self, broker: &Broker, topic: &str, index: u64) {
        let id = MessageId::new();
        loop {
            let started = Instant::now();
            let result = broker.publish(Message::to(topic).id(id).payload(index.to_string()));
            let took = started.elapsed();
            {
                let mut longest = lock(&self.longest);
                *longest = (*longest).max(took);
            }
            match result {
                Ok(_) => break,
                Err(e) => {
                    let kind = match &e {
                        PublishError::Stream { error, .. } => error.kind().to_string(),
                        other => format!("not a stream error: {other:?}"),
                    };
                    *lock(&self.failures).entry(kind).or_insert(0) += 1;
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
        lock(&self.acknowledged).insert(index);
    }
}
