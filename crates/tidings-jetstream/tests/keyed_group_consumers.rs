//! What a keyed group leaves on the server while its lease rounds run (R-DIST-6, R-LIM-3):
//! its own consumers — one per key partition and one for unkeyed records — and nothing
//! more, however many rounds its members make. Real nats-server, several members (one
//! broker and connection each) in this process, the public API only; the server is
//! watched through its JetStream API (stream and consumer names, stream state, direct
//! gets: none of which makes a consumer itself).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use futures_util::StreamExt;
use tidings::{Broker, Concurrency, DurableSpec, Message, MessageBuilder, StreamConfig};
use tidings::{DurableSubscription, SubscribeOptions};
use tidings_jetstream::{ConnectOptions, JetStreamBackend};
use tidings_testkit::nats::{NatsServer, NatsServerOptions};

/// Generous bound on every wait (never asserted as a speed).
const PATIENCE: Duration = Duration::from_secs(120);
/// The lease: a round every quarter of it.
const ACK_WAIT: Duration = Duration::from_secs(2);
const PARTITIONS: u32 = 16;
/// The group's lease bucket's stream (`names.rs`: `TIDINGS_g_<stream>_x<durable>`).
const BUCKET_STREAM: &str = "KV_TIDINGS_g_orders_xkeyed";
/// Rounds every member makes while the server is watched.
const ROUNDS: u64 = 8;

fn broker(url: &str) -> Broker {
    let backend = JetStreamBackend::builder()
        .ack_wait(ACK_WAIT)
        .key_partitions(PARTITIONS)
        .connect(
            ConnectOptions::new(url)
                .connect_timeout(Duration::from_secs(5))
                .request_timeout(Duration::from_secs(5))
                .name("tidings-keyed-group-consumers-test"),
        )
        .expect("connects to the test server");
    Broker::builder()
        .durable_backend(Arc::new(backend))
        .build()
        .expect("valid configuration")
}

/// The server seen from outside, over a client of its own.
struct Observer {
    rt: tokio::runtime::Runtime,
    js: jetstream::Context,
}

impl Observer {
    fn new(url: &str) -> Self {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let js = rt
            .block_on(async { jetstream::new(async_nats::connect(url).await.expect("connects")) });
        Self { rt, js }
    }

    /// Every stream's consumers, by stream.
    fn consumers(&self) -> BTreeMap<String, BTreeSet<String>> {
        self.rt.block_on(async {
            let mut out = BTreeMap::new();
            let names: Vec<String> = self
                .js
                .stream_names()
                .map(|n| n.expect("stream name"))
                .collect()
                .await;
            for name in names {
                let stream = self.js.get_stream(&name).await.expect("stream");
                let consumers = stream
                    .consumer_names()
                    .map(|c| c.expect("consumer name"))
                    .collect()
                    .await;
                out.insert(name, consumers);
            }
            out
        })
    }

    /// Each member's membership entry (`m.<member>`, written once per round): its
    /// revision now.
    fn memberships(&self) -> BTreeMap<String, u64> {
        self.rt.block_on(async {
            let bucket = BUCKET_STREAM.trim_start_matches("KV_");
            let stream = self.js.get_stream(BUCKET_STREAM).await.expect("stream");
            let prefix = format!("$KV.{bucket}.");
            let subjects: Vec<String> = stream
                .info_with_subjects(format!("{prefix}m.>"))
                .await
                .expect("stream info")
                .map(|s| s.expect("subject").0)
                .collect()
                .await;
            let store = self.js.get_key_value(bucket).await.expect("bucket");
            let mut out = BTreeMap::new();
            for subject in subjects {
                let key = subject.trim_start_matches(&prefix);
                if let Some(e) = store.entry(key).await.expect("entry")
                    && e.operation == jetstream::kv::Operation::Put
                {
                    out.insert(key.to_owned(), e.revision);
                }
            }
            out
        })
    }

    /// The members holding a partition (direct gets of `p.<n>`).
    fn holders(&self) -> BTreeSet<String> {
        self.rt.block_on(async {
            let bucket = BUCKET_STREAM.trim_start_matches("KV_");
            let store = self.js.get_key_value(bucket).await.expect("bucket");
            let mut out = BTreeSet::new();
            for p in 0..PARTITIONS {
                if let Some(e) = store.entry(format!("p.{p}")).await.expect("entry")
                    && e.operation == jetstream::kv::Operation::Put
                    && e.value.as_ref() != b"free"
                {
                    out.insert(String::from_utf8_lossy(&e.value).into_owned());
                }
            }
            out
        })
    }

    /// A lease bucket made elsewhere without direct get (as `nats kv add` can make it).
    fn bucket_without_direct_get(&self) {
        self.rt.block_on(async {
            let bucket = BUCKET_STREAM.trim_start_matches("KV_");
            self.js
                .create_stream(jetstream::stream::Config {
                    name: BUCKET_STREAM.to_owned(),
                    subjects: vec![format!("$KV.{bucket}.>")],
                    max_messages_per_subject: 1,
                    max_age: ACK_WAIT,
                    allow_direct: false,
                    allow_rollup: true,
                    deny_delete: true,
                    discard: jetstream::stream::DiscardPolicy::New,
                    ..Default::default()
                })
                .await
                .expect("bucket stream");
        });
    }
}

/// A group of `members` members on `url`, each handling into `handled`; publishes 3
/// messages to each of 16 keys and waits until all are handled.
fn group(
    url: &str,
    members: usize,
    handled: &Arc<AtomicUsize>,
) -> Vec<(Broker, DurableSubscription)> {
    let group: Vec<_> = (0..members)
        .map(|_| {
            let b = broker(url);
            b.create_stream(StreamConfig::new("orders", ["orders.#"]))
                .expect("stream");
            let handled = Arc::clone(handled);
            let sub = b
                .subscribe(
                    DurableSpec::new("orders").name("keyed"),
                    SubscribeOptions::new().concurrency(Concurrency::PerKey { max_in_flight: 4 }),
                    move |_: &Message| {
                        handled.fetch_add(1, Ordering::SeqCst);
                        Ok(())
                    },
                )
                .expect("subscribe");
            (b, sub)
        })
        .collect();
    for seq in 0..3 {
        for key in 0..16 {
            group[0]
                .0
                .publish(
                    MessageBuilder::new("orders.x")
                        .key(format!("k{key}"))
                        .payload(format!("{key}:{seq}")),
                )
                .expect("publish");
        }
    }
    until("every message handled", || {
        handled.load(Ordering::SeqCst) >= 48
    });
    group
}

fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !f() {
        assert!(Instant::now() < deadline, "not within {PATIENCE:?}: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Watches the server until each of `members` members was seen making [`ROUNDS`] more
/// rounds (a new revision of its membership entry; rounds missed between two looks only
/// make the watch longer) and the partitions are spread over more than one member (so the
/// members saw each other): every sample of the server's consumers, by stream, goes to
/// `sample`.
fn watch_rounds(
    observer: &Observer,
    members: usize,
    mut sample: impl FnMut(&BTreeMap<String, BTreeSet<String>>),
) {
    let mut seen: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    until("the lease rounds, spread over the members", || {
        sample(&observer.consumers());
        for (member, revision) in observer.memberships() {
            seen.entry(member).or_default().insert(revision);
        }
        let rounds = seen.values().filter(|r| r.len() as u64 > ROUNDS).count();
        rounds >= members && observer.holders().len() >= 2
    });
}

/// R-DIST-6, R-LIM-3: three members of a keyed group make their lease rounds (each a
/// membership write, a read of the live members and partition entries, and the lease
/// writes) and the server's consumers stay the group's own: one per partition and one
/// for unkeyed records, on the group's stream; none on the lease bucket, nor on the
/// group's DLQ and handler-start streams, at every sample.
/// (Before: each round listed the bucket's keys through an ordered consumer that the
/// server deleted only after its 30 s inactivity threshold: up to 30 on the bucket, 47
/// in all, over the 68 samples of one run of this test; about 120 in the three-member
/// soak.)
#[test]
fn lease_rounds_leave_only_the_groups_own_consumers() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let url = server.url();
    let handled = Arc::new(AtomicUsize::new(0));
    let members = group(&url, 3, &handled);
    let observer = Observer::new(&url);
    let own = PARTITIONS as usize + 1;
    let (mut samples, mut most, mut strays) = (0, 0, Vec::new());
    watch_rounds(&observer, 3, |consumers| {
        samples += 1;
        let total: usize = consumers.values().map(BTreeSet::len).sum();
        most = most.max(total);
        let on_orders = consumers.get("orders").map_or(0, BTreeSet::len);
        if (on_orders, total) != (own, own) && strays.len() < 3 {
            strays.push(consumers.clone());
        }
    });
    println!("{samples} samples over {ROUNDS} rounds of 3 members: at most {most} consumers");
    assert!(
        strays.is_empty(),
        "at most {most} consumers where the group has {own}, over {samples} samples; the first \
         samples with others: {strays:#?}"
    );
    drop(members);
}

/// R-DIST-6: a lease bucket made elsewhere without direct get (its configuration is not
/// changed) is read through a consumer listing as before, and the group still spreads its
/// partitions and handles every message.
#[test]
fn a_bucket_without_direct_get_is_listed_the_old_way() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let url = server.url();
    let observer = Observer::new(&url);
    observer.bucket_without_direct_get();
    let handled = Arc::new(AtomicUsize::new(0));
    let members = group(&url, 2, &handled);
    let mut listed = 0;
    watch_rounds(&observer, 2, |consumers| {
        listed = listed.max(consumers.get(BUCKET_STREAM).map_or(0, BTreeSet::len));
    });
    println!("at most {listed} listing consumers on the bucket");
    // The old way's consumers, each standing until its inactivity threshold.
    assert!(listed > 0, "no listing consumer seen on the bucket");
    drop(members);
}
