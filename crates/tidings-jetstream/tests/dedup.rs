//! The shared dedup store on JetStream (R-DEL-5 across processes), against a real
//! `nats-server` (the launcher installs a missing binary; the tests skip, with a notice,
//! only under `TIDINGS_SKIP_NATS=1`).
//!
//! The cross-process tests start this test binary again with [`ROLE_ENV`] set, so a child
//! runs only [`child_deduplicating_consumer`]. The handler's side effect is one unbuffered
//! `O_APPEND` write per message to a file both children share, so the file shows every
//! run of it, in order, across processes and a SIGKILL.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tidings::durable::DurableBackend;
use tidings::{
    Broker, DedupStore, Deduplicating, DurableSpec, HandlerError, InMemoryDedupStore, Message,
    MessageId, StreamConfig, StreamError, StreamErrorKind, SubscribeOptions,
};
use tidings_jetstream::{ConnectOptions, JetStreamBackend};
use tidings_testkit::child::{self, ScratchDir, TestChild, wait_until};
use tidings_testkit::nats::{NatsCluster, NatsServer, NatsServerOptions};

/// Generous bound on every wait (never asserted as a speed).
const PATIENCE: Duration = Duration::from_secs(60);
/// The request timeout: a server that is away answers within it (plus the backend's 0.5 s).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

const ROLE_ENV: &str = "TIDINGS_DEDUP_ROLE";
const URL_ENV: &str = "TIDINGS_DEDUP_URL";
const DIR_ENV: &str = "TIDINGS_DEDUP_DIR";
const STORE_ENV: &str = "TIDINGS_DEDUP_STORE";

fn backend_with(url: &str, ack_wait: Duration, max_age: Option<Duration>) -> JetStreamBackend {
    let mut builder = JetStreamBackend::builder().ack_wait(ack_wait);
    if let Some(age) = max_age {
        builder = builder.dedup_max_age(age);
    }
    builder
        .connect(
            ConnectOptions::new(url)
                .connect_timeout(Duration::from_secs(5))
                .request_timeout(REQUEST_TIMEOUT),
        )
        .expect("connects")
}

fn backend(url: &str) -> JetStreamBackend {
    backend_with(url, Duration::from_secs(30), None)
}

fn ids(n: usize) -> Vec<MessageId> {
    (0..n).map(|_| MessageId::new()).collect()
}

/// R-DEL-5: what one connection records, another (another process, in effect) finds, and
/// the broker's `durable_dedup_store` opens the same store.
#[test]
fn an_id_recorded_through_one_connection_is_seen_through_another() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let a = backend(&server.url())
        .jetstream_dedup_store("bills", 100)
        .expect("opens");
    let b = backend(&server.url())
        .jetstream_dedup_store("bills", 100)
        .expect("opens the same");
    let [x, y]: [MessageId; 2] = ids(2).try_into().expect("two");
    assert!(!a.contains(x) && !b.contains(x));
    a.record(x);
    assert!(a.contains(x), "seen where recorded");
    assert!(b.contains(x), "seen through another connection");
    assert!(!b.contains(y));
    // The same store through the broker, as a `dyn DedupStore`.
    let broker = Broker::builder()
        .durable_backend(Arc::new(backend(&server.url())) as Arc<dyn DurableBackend>)
        .build()
        .expect("valid configuration");
    let c = broker.durable_dedup_store("bills", 100).expect("opens");
    assert!(c.contains(x));
    c.record(y);
    assert!(a.contains(y));
    assert_eq!((a.failed_lookups(), a.failed_records()), (0, 0));
    broker.close(Duration::from_secs(10));
}

/// Each id recorded is found and each id not recorded is not, over a few hundred of each,
/// one round trip per call; the mean time per call is printed (never asserted).
#[test]
fn every_recorded_id_is_found_and_no_other() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let store = backend(&server.url())
        .jetstream_dedup_store("many", 10_000)
        .expect("opens");
    let (recorded, other) = (ids(300), ids(300));
    let started = Instant::now();
    for id in &recorded {
        store.record(*id);
    }
    let per_record = started.elapsed() / 300;
    let started = Instant::now();
    let found = recorded.iter().filter(|id| store.contains(**id)).count();
    let per_lookup = started.elapsed() / 300;
    let wrongly_found = other.iter().filter(|id| store.contains(**id)).count();
    println!("dedup store on one server: record {per_record:?}, contains {per_lookup:?} per call");
    assert_eq!((found, wrongly_found), (300, 0));
    assert_eq!((store.failed_lookups(), store.failed_records()), (0, 0));
}

/// R-DEL-5 "bounded": the store keeps the `capacity` most recent ids, the oldest forgotten
/// first.
#[test]
fn the_oldest_ids_beyond_the_capacity_are_forgotten() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let store = backend(&server.url())
        .jetstream_dedup_store("small", 3)
        .expect("opens");
    assert_eq!(store.capacity(), 3);
    let all = ids(5);
    for id in &all {
        store.record(*id);
    }
    let kept: Vec<bool> = all.iter().map(|id| store.contains(*id)).collect();
    assert_eq!(kept, [false, false, true, true, true]);
    // Recording an id again keeps one copy of it (one message per key).
    store.record(all[4]);
    assert!(store.contains(all[2]), "a repeat record pushes nothing out");
}

/// R-DEL-5 "bounded": an id is forgotten after the store's age.
#[test]
fn an_id_is_forgotten_after_the_max_age() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let store = backend_with(
        &server.url(),
        Duration::from_secs(30),
        Some(Duration::from_secs(1)),
    )
    .jetstream_dedup_store("short", 100)
    .expect("opens");
    let id = MessageId::new();
    store.record(id);
    assert!(store.contains(id), "seen right after it was recorded");
    wait_until("the id is forgotten", PATIENCE, || !store.contains(id));
}

/// A store exists with its limits: opening it with another capacity or age is refused,
/// typed, and changes nothing.
#[test]
fn a_store_with_other_limits_is_a_config_mismatch() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let url = server.url();
    let store = backend(&url)
        .jetstream_dedup_store("limits", 10)
        .expect("opens");
    let id = MessageId::new();
    store.record(id);
    let other_capacity = backend(&url).jetstream_dedup_store("limits", 20);
    assert!(
        matches!(
            &other_capacity,
            Err(StreamError::ConfigMismatch {
                setting: "capacity",
                ..
            })
        ),
        "{other_capacity:?}"
    );
    let other_age = backend_with(&url, Duration::from_secs(30), Some(Duration::from_secs(60)))
        .jetstream_dedup_store("limits", 10);
    assert!(
        matches!(
            &other_age,
            Err(StreamError::ConfigMismatch {
                setting: "max age",
                ..
            })
        ),
        "{other_age:?}"
    );
    let err = backend(&url)
        .jetstream_dedup_store("bad name", 10)
        .expect_err("a space is not a name");
    assert_eq!(err.kind(), StreamErrorKind::InvalidInput, "{err:?}");
    // Nothing changed: the same limits open it, with the id still there.
    let again = backend(&url)
        .jetstream_dedup_store("limits", 10)
        .expect("reopens");
    assert!(again.contains(id));
}

/// At-least-once when the server is away: a lookup answers "not seen" (the handler runs)
/// and a record fails, both counted and both within the request timeout's bound; once
/// the server is back (same store dir) the store works again and kept what it had.
#[test]
fn a_server_away_answers_not_seen_and_counts_failed_records() {
    let Some(mut server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let store = backend(&server.url())
        .jetstream_dedup_store("away", 100)
        .expect("opens");
    let kept = MessageId::new();
    store.record(kept);
    assert!(store.contains(kept));
    server.kill().expect("SIGKILL the server");
    let lost = MessageId::new();
    let bound = REQUEST_TIMEOUT + Duration::from_millis(500) + Duration::from_secs(1);
    let started = Instant::now();
    assert!(!store.contains(kept), "away: not seen, the handler runs");
    store.record(lost);
    let took = started.elapsed();
    assert_eq!(store.failed_lookups(), 1);
    assert_eq!(store.failed_records(), 1);
    assert!(
        took <= bound * 2,
        "two calls took {took:?}, over twice {bound:?}"
    );
    server.restart().expect("restart on its store");
    wait_until("the store answers again", PATIENCE, || {
        store.try_contains(kept).is_ok()
    });
    assert!(store.contains(kept), "what it had survived the restart");
    // The failed record may still land: the client sends what it buffered while
    // disconnected once it reconnects. Harmless either way (its handler did run).
    let _ = store.contains(lost);
}

/// R-DEL-5, R-DIST-7: a store with three replicas on a three-node cluster keeps answering
/// when the node leading it is SIGKILLed, keeps what it had, and takes new records; the
/// same name with another replica count is refused.
#[test]
fn a_replicated_store_survives_the_loss_of_its_leader() {
    let Some(mut cluster) = NatsCluster::for_test(3) else {
        return;
    };
    let urls = cluster.urls();
    let connect = |replicas: usize| {
        JetStreamBackend::builder()
            .dedup_replicas(replicas)
            .connect(
                ConnectOptions::servers(urls.clone())
                    .connect_timeout(Duration::from_secs(5))
                    .request_timeout(REQUEST_TIMEOUT),
            )
            .expect("connects to the cluster")
    };
    let store = connect(3)
        .jetstream_dedup_store("replicated", 100)
        .expect("opens with three replicas");
    let (kept, added) = (MessageId::new(), MessageId::new());
    store.try_record(kept).expect("records");
    let leader = cluster
        .wait_stream_leader("KV_TIDINGS_dedup_replicated", PATIENCE)
        .expect("the bucket has a leader");
    cluster.kill(leader).expect("SIGKILL the bucket's leader");
    wait_until("the store answers again", PATIENCE, || {
        store.try_contains(kept).is_ok()
    });
    assert!(store.contains(kept), "what it had survived its leader");
    wait_until("a new record is acknowledged", PATIENCE, || {
        store.try_record(added).is_ok()
    });
    assert!(store.contains(added));
    cluster.restart(leader).expect("restart the old leader");
    let other = connect(1).jetstream_dedup_store("replicated", 100);
    assert!(
        matches!(
            &other,
            Err(StreamError::ConfigMismatch {
                setting: "replicas",
                ..
            })
        ),
        "{other:?}"
    );
}

/// The child role: a durable subscription on `work` whose handler appends the payload to
/// `side-effects`, wrapped in `Deduplicating` with the store named by [`STORE_ENV`]
/// (`jetstream` or `memory`). With `TIDINGS_DEDUP_ROLE=stall`, the first record is
/// followed by a `recorded` file and a stall: the message was recorded and never
/// acknowledged, until the parent SIGKILLs this process.
#[test]
#[ignore = "entry point of the child processes the cross-process tests start"]
fn child_deduplicating_consumer() {
    let Some(role) = std::env::var_os(ROLE_ENV) else {
        return;
    };
    let stall = role == "stall";
    let var = |name| std::env::var(name).unwrap_or_else(|_| panic!("{name} is set"));
    let dir = PathBuf::from(var(DIR_ENV));
    let backend = backend_with(&var(URL_ENV), Duration::from_secs(2), None);
    let store: Arc<dyn DedupStore> = match var(STORE_ENV).as_str() {
        "jetstream" => backend
            .jetstream_dedup_store("side-effects", 1000)
            .expect("opens the store"),
        _ => Arc::new(InMemoryDedupStore::new(1000)),
    };
    let store: Arc<dyn DedupStore> = Arc::new(StallAfterRecord {
        inner: store,
        stall_in: stall.then(|| dir.clone()),
    });
    let broker = Broker::builder()
        .durable_backend(Arc::new(backend) as Arc<dyn DurableBackend>)
        .build()
        .expect("valid configuration");
    broker
        .create_stream(StreamConfig::new("work", ["work.#"]))
        .expect("stream");
    let out = Mutex::new(
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("side-effects"))
            .expect("open the side-effect file"),
    );
    let handler = Deduplicating::with_store(
        move |m: &Message| {
            let line = format!("{}\n", String::from_utf8_lossy(m.payload()));
            out.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .write_all(line.as_bytes())
                .expect("the side effect");
            Ok::<(), HandlerError>(())
        },
        store,
    );
    let _sub = broker
        .subscribe(
            DurableSpec::new("work").name("workers").filter("work.#"),
            SubscribeOptions::default(),
            handler,
        )
        .expect("subscribes");
    fs::write(dir.join(format!("ready-{}", std::process::id())), b"").expect("ready file");
    let deadline = Instant::now() + PATIENCE;
    while !dir.join("stop").exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    broker.close(Duration::from_secs(10));
}

/// A store that, after its first record, writes `recorded` and stalls forever (when
/// `stall_in` is set): a process that recorded an id and died before acknowledging.
struct StallAfterRecord {
    inner: Arc<dyn DedupStore>,
    stall_in: Option<PathBuf>,
}

impl DedupStore for StallAfterRecord {
    fn contains(&self, id: MessageId) -> bool {
        self.inner.contains(id)
    }
    fn record(&self, id: MessageId) {
        self.inner.record(id);
        if let Some(dir) = &self.stall_in {
            fs::write(dir.join("recorded"), b"").expect("recorded file");
            loop {
                std::thread::park();
            }
        }
    }
}

fn lines(path: &Path) -> Vec<String> {
    child::complete_lines(path)
}

/// Process A handles message 0, records its id and is SIGKILLed before acknowledging it;
/// process B then gets the redelivery (after A's ack wait) and the rest. Returns the side
/// effects in the order they ran.
fn a_dies_after_recording(store: &str) -> Option<Vec<String>> {
    let server = NatsServer::for_test(NatsServerOptions::new())?;
    let url = server.url();
    let dir = ScratchDir::new("dedup");
    {
        let broker = Broker::builder()
            .durable_backend(Arc::new(backend(&url)) as Arc<dyn DurableBackend>)
            .build()
            .expect("valid configuration");
        broker
            .create_stream(StreamConfig::new("work", ["work.#"]))
            .expect("stream");
        for i in 0..3 {
            broker
                .publish(Message::to("work.m").payload(i.to_string()))
                .expect("publish");
        }
        broker.close(Duration::from_secs(10));
    }
    let env = |role: &str| {
        [
            (ROLE_ENV, role.to_owned()),
            (URL_ENV, url.clone()),
            (DIR_ENV, dir.path().display().to_string()),
            (STORE_ENV, store.to_owned()),
        ]
    };
    let mut a = TestChild::spawn("child_deduplicating_consumer", env("stall"));
    wait_until("A recorded message 0", PATIENCE, || {
        dir.path().join("recorded").exists()
    });
    a.kill();
    let effects = dir.path().join("side-effects");
    assert_eq!(lines(&effects), ["0"], "A ran the side effect of 0 only");
    let mut b = TestChild::spawn("child_deduplicating_consumer", env("consume"));
    // B's handler ran for 1 and 2; 0 came back after A's ack wait and was skipped or run.
    wait_until("B handled the rest", PATIENCE, || {
        let seen = lines(&effects);
        seen.contains(&"1".to_owned()) && seen.contains(&"2".to_owned())
    });
    // Redelivery of 0 comes after A's ack wait (2 s): wait until the server has nothing
    // left for the durable.
    wait_until("0 came back to B and was finished", PATIENCE, || {
        server_consumer_done(&url)
    });
    fs::write(dir.path().join("stop"), b"").expect("stop file");
    b.wait_success(PATIENCE);
    Some(lines(&effects))
}

/// Whether the durable `workers` has nothing pending or unacknowledged, as the server
/// reports it through a raw client.
fn server_consumer_done(url: &str) -> bool {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let Ok(client) = async_nats::connect(url).await else {
            return false;
        };
        let js = async_nats::jetstream::new(client);
        let Ok(mut consumer) = js
            .get_consumer_from_stream::<async_nats::jetstream::consumer::pull::Config, _, _>(
                "workers", "work",
            )
            .await
        else {
            return false;
        };
        consumer
            .info()
            .await
            .is_ok_and(|i| i.num_pending == 0 && i.num_ack_pending == 0)
    })
}

/// R-DEL-5 across processes: A records message 0's id and is SIGKILLed before
/// acknowledging it; B receives the redelivery and skips it. The side effect ran once per
/// message.
#[test]
fn a_redelivery_to_another_process_after_a_crash_is_skipped() {
    let Some(effects) = a_dies_after_recording("jetstream") else {
        return;
    };
    let mut sorted = effects.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        ["0", "1", "2"],
        "each side effect once: {effects:?}"
    );
}

/// The same run with an in-memory store in each process: B does not know what A
/// recorded and runs message 0's side effect again. This is what the shared store fixes,
/// and it shows the test above can fail.
#[test]
fn with_a_store_in_each_process_the_redelivery_runs_again() {
    let Some(effects) = a_dies_after_recording("memory") else {
        return;
    };
    let mut sorted = effects.clone();
    sorted.sort();
    assert_eq!(sorted, ["0", "0", "1", "2"], "{effects:?}");
}
