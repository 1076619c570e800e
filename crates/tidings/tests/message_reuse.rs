//! Message allocations are recycled once a message is finished (src/message_pool.rs). These
//! tests check what a user could see go wrong if a message were reused too early: a handler,
//! a retry or a dead letter holding a message whose parts belong to another one.

use std::collections::BTreeSet;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use parking_lot::Mutex;
use tidings::*;
use tidings_testkit::helpers::wait_until;

#[path = "support/drivers.rs"]
mod drivers;

const PATIENCE: Duration = Duration::from_secs(60);
const PUBLISHERS: usize = 4;
const PER_PUBLISHER: usize = 2_000;

/// Whether every part of `m` belongs to the message published as `(publisher, i)`; the
/// pair, when they do.
fn parts_agree(m: &Message) -> Result<(usize, usize), String> {
    let payload = String::from_utf8_lossy(m.payload()).into_owned();
    let (p, i) = payload
        .split_once('-')
        .and_then(|(p, i)| Some((p.parse().ok()?, i.parse().ok()?)))
        .ok_or_else(|| format!("payload {payload:?}"))?;
    let key = format!("k{p}");
    let seq = format!("{p}-{i}");
    let ok = m.key() == Some(key.as_bytes())
        && m.header("seq") == Some(seq.as_str())
        && m.correlation_id() == Some(seq.as_str());
    if ok {
        Ok((p, i))
    } else {
        Err(format!(
            "payload {payload:?} with key {:?}, header {:?}, correlation id {:?}",
            m.key(),
            m.header("seq"),
            m.correlation_id()
        ))
    }
}

/// What one subscription saw: every (publisher, i) it was handed, and any message whose
/// parts did not agree.
#[derive(Default)]
struct Seen {
    handled: BTreeSet<(usize, usize)>,
    mixed: Vec<String>,
}

// R-CORE-4, R-DEL-6: four publishers race 8,000 messages, each with its own payload, key,
// header and correlation id, into three subscriptions: one that acknowledges, one that fails
// every 7th message's first attempt (held for a retry while its siblings are finished and
// recycled), and one that rejects every 5th message (kept as a dead letter). Every handler
// call sees a message whose parts all belong to it; every message reaches every
// subscription; every dead letter is the message that was rejected, intact.
#[test]
fn recycled_allocations_never_mix_messages() {
    for (name, driver) in drivers::threaded() {
        let broker = Broker::builder().driver(driver).build().unwrap();
        let options = || {
            SubscribeOptions::new()
                .capacity(256)
                .overflow(Overflow::Block {
                    timeout: Duration::from_secs(60),
                })
                .retry(Retry::fixed(Duration::ZERO, 3))
                .dead_letter(DeadLetterOptions::new().capacity(4 * PUBLISHERS * PER_PUBLISHER))
        };
        let seen: Vec<Arc<Mutex<Seen>>> = (0..3).map(|_| Arc::default()).collect();
        let retried: Arc<Mutex<BTreeSet<(usize, usize)>>> = Arc::default();
        let subs: Vec<Subscription> = (0..3)
            .map(|s| {
                let (seen, retried) = (seen[s].clone(), retried.clone());
                broker
                    .subscribe("reuse.*", options(), move |m: &Message| {
                        let (p, i) = match parts_agree(m) {
                            Ok(pi) => pi,
                            Err(e) => {
                                seen.lock().mixed.push(e);
                                return Ok(());
                            }
                        };
                        seen.lock().handled.insert((p, i));
                        match s {
                            1 if i % 7 == 0 && retried.lock().insert((p, i)) => {
                                Err(HandlerError::retry("once more"))
                            }
                            2 if i % 5 == 0 => Err(HandlerError::reject("kept")),
                            _ => Ok(()),
                        }
                    })
                    .unwrap()
            })
            .collect();

        let start = Arc::new(Barrier::new(PUBLISHERS));
        std::thread::scope(|scope| {
            for p in 0..PUBLISHERS {
                let (broker, start) = (&broker, start.clone());
                scope.spawn(move || {
                    start.wait();
                    for i in 0..PER_PUBLISHER {
                        let seq = format!("{p}-{i}");
                        let r = broker
                            .publish(
                                Message::to(format!("reuse.p{p}"))
                                    .payload(seq.clone())
                                    .key(format!("k{p}"))
                                    .header("seq", seq.clone())
                                    .correlation_id(seq),
                            )
                            .expect("publish");
                        assert_eq!(r.accepted, 3, "{name}: every subscription accepts");
                    }
                });
            }
        });

        let total = PUBLISHERS * PER_PUBLISHER;
        let rejected = PUBLISHERS * PER_PUBLISHER.div_ceil(5);
        wait_until(&format!("{name}: all handled"), PATIENCE, || {
            subs.iter().all(|s| {
                let st = s.stats();
                st.delivered + st.dead_lettered.total() == total as u64
            })
        });
        for (s, seen) in seen.iter().enumerate() {
            let seen = seen.lock();
            assert!(
                seen.mixed.is_empty(),
                "{name}: subscription {s} saw mixed messages: {:?}",
                &seen.mixed[..seen.mixed.len().min(3)]
            );
            assert_eq!(seen.handled.len(), total, "{name}: subscription {s}");
        }
        let letters = subs[2].dead_letters();
        assert_eq!(
            letters.len(),
            rejected,
            "{name}: one dead letter per rejection"
        );
        for d in &letters {
            let (_, i) = parts_agree(&d.message).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(i % 5, 0, "{name}: the dead letter is a rejected message");
        }
        assert_eq!(
            retried.lock().len(),
            PUBLISHERS * PER_PUBLISHER.div_ceil(7),
            "{name}: every 7th message failed once"
        );
        assert!(
            broker.close(Duration::from_secs(10)).is_clean(),
            "{name}: close"
        );
    }
}
