//! R-DIST-8 end to end: a keyed consumer group member frozen (SIGSTOP) longer than its
//! lease, in the middle of its handlers, commits nothing stale and starts nothing stale
//! when it is continued. Real nats-server, real SQLite, real OS processes and signals.
//!
//! Two member processes (this test binary again, running only [`member`]) share the
//! durable subscription `ledger` on JetStream with `Concurrency::PerKey`, so the group
//! hands each of them whole key partitions. Their handler applies its effect through
//! [`Transactional::sqlite`] — one row in `effects` (key, sequence number, member,
//! partition, term), in the transaction that records the message id and checks the
//! delivery's fence against `processed_messages_fence`. Every handler start and end is one
//! `O_APPEND` write of one line to a log all processes share, so the kernel orders them:
//! `S <member> k<key>:<seq> <partition> <term>` at the start, `P ...` when the handler
//! parks (below), and `D` (committed or skipped), `X` (refused as fenced) or `F` (another
//! failure) at the end.
//!
//! The scenario, every step waiting for what it needs to see (never for a time):
//! 1. A starts, then B; rounds of one message per key are published until both members
//!    commit in one round (the group has spread the partitions over both).
//! 2. A is told to park every handler it starts (after its `S` line, before its
//!    transaction), and six more rounds are published. A parks as many handlers as it has
//!    slots (one per partition: a partition hands out its next message when the one before
//!    it finished): from then on it can admit nothing, and it holds no database lock.
//! 3. A is stopped (SIGSTOP) with its handlers parked. Its leases lapse, B takes its
//!    partitions under greater terms, gets A's unfinished messages back from the server
//!    and commits them, and goes on.
//! 4. A is continued (SIGCONT) and its parked handlers go on into their transactions:
//!    each is refused as fenced (`X`), since B committed in its partition under a greater
//!    term. Three more rounds are published, and everything is drained.
//!
//! Checked at the end:
//! - per partition, the terms of the committed effects, in commit order, never go down:
//!   no effect of an older owner commits after a newer owner's (R-DIST-8);
//! - A's parked handlers were all refused as fenced after the resume, and counted in its
//!   `TransactionalStats::fenced`;
//! - A starts no handler after the resume under a term lower than one its partition was
//!   already started under (it starts nothing of a partition it no longer owns);
//! - per key, the committed effects are the key's messages in publish order, each once,
//!   none missing (R-DIST-6, R-DEL-7).

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tidings::{
    AnyHandler, Broker, Concurrency, DurableSpec, Handler, HandlerError, Message, MessageBuilder,
    Retry, StreamConfig, SubscribeOptions,
};
use tidings_jetstream::{ConnectOptions, JetStreamBackend, key_partition};
use tidings_sql::{SqliteTx, Transactional};
use tidings_testkit::child::{self, ScratchDir, TestChild};
use tidings_testkit::nats::{NatsServer, NatsServerOptions};

const ROLE_ENV: &str = "TIDINGS_SQL_FENCE_ROLE";
const URL_ENV: &str = "TIDINGS_SQL_FENCE_URL";
const DIR_ENV: &str = "TIDINGS_SQL_FENCE_DIR";
const DB_ENV: &str = "TIDINGS_SQL_FENCE_DB";

const STREAM: &str = "orders";
/// The durable subscription, and the consumer whose ids and terms the members record.
const DURABLE: &str = "ledger";
const TABLE: &str = "processed_messages";
/// The ack wait, which is also the lease.
const ACK_WAIT: Duration = Duration::from_secs(3);
const PARTITIONS: u32 = 16;
/// Keys per partition.
const KEYS_PER_PARTITION: usize = 3;
/// Handlers a member runs at once (`Concurrency::PerKey { max_in_flight }`).
const SLOTS: usize = 4;
/// Rounds (one message per key) published while A parks.
const PARKED_ROUNDS: u32 = 6;
/// Rounds published after A's parked handlers ended.
const AFTER_RESUME_ROUNDS: u32 = 3;
/// At most this many warm-up rounds before both members commit in one.
const MAX_WARM_UP_ROUNDS: u32 = 200;
/// Generous bound on every wait (never asserted as a speed).
const PATIENCE: Duration = Duration::from_secs(120);

fn broker(url: &str) -> Broker {
    let backend = JetStreamBackend::builder()
        .ack_wait(ACK_WAIT)
        .key_partitions(PARTITIONS)
        .connect(
            ConnectOptions::new(url)
                .connect_timeout(Duration::from_secs(5))
                .request_timeout(Duration::from_secs(5))
                .name("tidings-sql-fence-test"),
        )
        .expect("connects to the test server");
    let broker = Broker::builder()
        .durable_backend(Arc::new(backend))
        .build()
        .expect("valid configuration");
    broker
        .create_stream(StreamConfig::new(STREAM, ["orders.#"]))
        .expect("stream");
    broker
}

/// One line, one `write(2)` on an `O_APPEND` file: placed whole, in one total order with
/// every other process's lines.
fn note(log: &File, line: &str) {
    (&*log)
        .write_all(line.as_bytes())
        .expect("one write to the shared log");
}

/// `k<key>:<seq>` → (`k<key>`, seq).
fn parse(what: &str) -> Result<(String, u32), HandlerError> {
    let (key, seq) = what
        .split_once(':')
        .ok_or_else(|| HandlerError::reject(format!("bad payload {what:?}")))?;
    Ok((key.to_owned(), seq.parse()?))
}

/// Whether member `who` parks its handlers: told to (`park-<who>`), not released yet.
fn parks(dir: &Path, who: &str) -> bool {
    dir.join(format!("park-{who}")).exists() && !dir.join(format!("release-{who}")).exists()
}

/// The member process (a no-op outside one): subscribe, handle until `stop` exists, then
/// write the handler's counters to `stats-<who>`.
#[test]
#[ignore = "entry point of the member processes the test in this file starts"]
fn member() {
    let Ok(who) = std::env::var(ROLE_ENV) else {
        return;
    };
    let var = |v: &str| std::env::var(v).unwrap_or_else(|_| panic!("{v} is set"));
    let dir = PathBuf::from(var(DIR_ENV));
    let log = Arc::new(
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("log"))
            .expect("open the shared log"),
    );
    let broker = broker(&var(URL_ENV));
    let me = who.clone();
    let ledger = Transactional::sqlite(
        var(DB_ENV),
        TABLE,
        DURABLE,
        move |tx: &mut SqliteTx<'_>, m: &Message| {
            let (key, seq) = parse(std::str::from_utf8(m.payload())?)?;
            let fence = m
                .fence()
                .ok_or_else(|| HandlerError::reject("a keyed delivery without a fence"))?;
            let term =
                i64::try_from(fence.term()).map_err(|e| HandlerError::reject(e.to_string()))?;
            tx.execute(
                "INSERT INTO effects (key, seq, member, part, term) VALUES (?1, ?2, ?3, ?4, ?5)",
                &[
                    key.into(),
                    seq.into(),
                    me.as_str().into(),
                    fence.partition().into(),
                    term.into(),
                ],
            )?;
            Ok(())
        },
    )
    .expect("the ledger handler");
    let handler = {
        let (ledger, who, dir, log) = (ledger.clone(), who.clone(), dir.clone(), log.clone());
        move |m: &Message| -> Result<(), HandlerError> {
            let what = String::from_utf8_lossy(m.payload()).into_owned();
            let (p, t) = m
                .fence()
                .map_or((u32::MAX, 0), |f| (f.partition(), f.term()));
            note(&log, &format!("S {who} {what} {p} {t}\n"));
            if parks(&dir, &who) {
                note(&log, &format!("P {who} {what}\n"));
                while !dir.join(format!("release-{who}")).exists() {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            let r = Handler::handle(&ledger, m);
            let end = match &r {
                Ok(()) => 'D',
                Err(e) if e.message().starts_with("tidings-sql: fenced:") => 'X',
                Err(_) => 'F',
            };
            note(&log, &format!("{end} {who} {what}\n"));
            r
        }
    };
    let subscription = broker
        .subscribe(
            DurableSpec::new(STREAM).name(DURABLE).filter("orders.#"),
            SubscribeOptions::new()
                .concurrency(Concurrency::PerKey {
                    max_in_flight: SLOTS,
                })
                .retry(Retry::fixed(Duration::from_millis(5), 10_000)),
            AnyHandler::from_sync(handler),
        )
        .expect("subscribe");
    fs::write(dir.join(format!("ready-{who}")), b"").expect("ready file");
    let deadline = Instant::now() + PATIENCE * 3;
    while !dir.join("stop").exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(subscription);
    broker.close(Duration::from_secs(10));
    let s = ledger.stats();
    fs::write(
        dir.join(format!("stats-{who}")),
        format!("{} {} {}", s.committed, s.skipped, s.fenced),
    )
    .expect("stats file");
}

fn spawn(url: &str, dir: &Path, db: &Path, who: &str) -> TestChild {
    TestChild::spawn(
        "member",
        [
            (ROLE_ENV, who.to_owned()),
            (URL_ENV, url.to_owned()),
            (DIR_ENV, dir.display().to_string()),
            (DB_ENV, db.display().to_string()),
        ],
    )
}

/// `KEYS_PER_PARTITION` keys of every partition, with their partitions.
fn keys() -> Vec<(String, u32)> {
    let mut per: BTreeMap<u32, usize> = BTreeMap::new();
    let mut out = Vec::new();
    for i in 0.. {
        if out.len() == PARTITIONS as usize * KEYS_PER_PARTITION {
            break;
        }
        let key = format!("k{i}");
        let p = key_partition(key.as_bytes(), PARTITIONS);
        let n = per.entry(p).or_insert(0);
        if *n < KEYS_PER_PARTITION {
            *n += 1;
            out.push((key, p));
        }
    }
    out
}

fn publish_round(broker: &Broker, keys: &[(String, u32)], seq: u32) {
    for (key, _) in keys {
        broker
            .publish(
                MessageBuilder::new("orders.placed")
                    .key(key.clone())
                    .payload(format!("{key}:{seq}")),
            )
            .expect("publish");
    }
}

/// One committed effect, in commit order.
#[derive(Debug, Clone)]
struct Effect {
    key: String,
    seq: u32,
    member: String,
    part: u32,
    term: i64,
}

fn effects(db: &Path) -> Vec<Effect> {
    let conn = common::sqlite_checker(db);
    let mut stmt = conn
        .prepare("SELECT key, seq, member, part, term FROM effects ORDER BY n")
        .expect("prepare");
    stmt.query_map([], |r| {
        Ok(Effect {
            key: r.get(0)?,
            seq: r.get(1)?,
            member: r.get(2)?,
            part: r.get(3)?,
            term: r.get(4)?,
        })
    })
    .expect("query")
    .collect::<Result<_, _>>()
    .expect("rows")
}

/// One line of the shared log.
#[derive(Debug, Clone)]
struct Line {
    kind: char,
    who: String,
    what: String,
    /// Partition and term, on start lines.
    fence: Option<(u32, u64)>,
}

fn read_log(path: &Path) -> Vec<Line> {
    child::complete_lines(path)
        .iter()
        .map(|l| {
            let w: Vec<&str> = l.split(' ').collect();
            Line {
                kind: w[0].chars().next().expect("kind"),
                who: w[1].to_owned(),
                what: w[2].to_owned(),
                fence: (w.len() == 5).then(|| {
                    (
                        w[3].parse().expect("partition"),
                        w[4].parse().expect("term"),
                    )
                }),
            }
        })
        .collect()
}

/// What `who` has started and not finished, and which of those parked, by message.
fn in_flight(lines: &[Line], who: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut running, mut parked) = (BTreeSet::new(), BTreeSet::new());
    for l in lines.iter().filter(|l| l.who == who) {
        match l.kind {
            'S' => {
                running.insert(l.what.clone());
            }
            'P' => {
                parked.insert(l.what.clone());
            }
            _ => {
                running.remove(&l.what);
                parked.remove(&l.what);
            }
        }
    }
    (running, parked)
}

/// Starts under a term lower than one their partition was already started under (by any
/// member, earlier in the log), from line `from` on, by `who`.
fn stale_starts(lines: &[Line], from: usize, who: Option<&str>) -> Vec<String> {
    let mut highest: HashMap<u32, u64> = HashMap::new();
    let mut stale = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let (Some((p, t)), 'S') = (l.fence, l.kind) else {
            continue;
        };
        let top = highest.entry(p).or_insert(0);
        if i >= from && who.is_none_or(|w| w == l.who) && t < *top {
            stale.push(format!(
                "line {i}: {} starts {} under term {t} of partition {p}, already started \
                 under term {top}",
                l.who, l.what
            ));
        }
        *top = (*top).max(t);
    }
    stale
}

// R-DIST-8, R-DIST-6, R-DEL-7
#[test]
fn a_member_frozen_past_its_lease_commits_nothing_stale_and_starts_nothing_stale() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let started = Instant::now();
    let url = server.url();
    let scratch = ScratchDir::new("sql-fence-keyed-group");
    let dir = scratch.path();
    let db = dir.join("ledger.db");
    let log_path = dir.join("log");
    common::sqlite_checker(&db)
        .execute_batch(
            "CREATE TABLE effects (n INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL, \
             seq INTEGER NOT NULL, member TEXT NOT NULL, part INTEGER NOT NULL, \
             term INTEGER NOT NULL)",
        )
        .expect("the effects table");
    let keys = keys();
    let part_of: HashMap<String, u32> = keys.iter().cloned().collect();
    let publisher = broker(&url);
    // On a timeout: the end of the log and the effects, to see where it stuck.
    let wait = |what: &str, cond: &mut dyn FnMut() -> bool| {
        let deadline = Instant::now() + PATIENCE;
        while !cond() {
            if Instant::now() >= deadline {
                let log = child::complete_lines(&log_path);
                let done = effects(&db);
                let kept = std::env::temp_dir().join("tidings-sql-fence-keyed-group.log");
                let _ = fs::copy(&log_path, &kept);
                eprintln!("the whole log is kept in {}", kept.display());
                panic!(
                    "not within {PATIENCE:?}: {what}\nthe log's last lines:\n{}\n{} effects, \
                     the last: {:?}",
                    log[log.len().saturating_sub(40)..].join("\n"),
                    done.len(),
                    &done[done.len().saturating_sub(10)..]
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    };

    // 1. Both members, and rounds until both commit in one.
    let mut a = spawn(&url, dir, &db, "A");
    wait("A subscribed", &mut || dir.join("ready-A").exists());
    let mut b = spawn(&url, dir, &db, "B");
    wait("B subscribed", &mut || dir.join("ready-B").exists());
    let mut rounds = 0;
    loop {
        publish_round(&publisher, &keys, rounds);
        let round = rounds;
        rounds += 1;
        let mut members = BTreeSet::new();
        wait("a warm-up round committed", &mut || {
            let done: Vec<Effect> = effects(&db)
                .into_iter()
                .filter(|e| e.seq == round)
                .collect();
            members = done.iter().map(|e| e.member.clone()).collect();
            done.len() == keys.len()
        });
        if members.len() == 2 {
            break;
        }
        assert!(
            rounds < MAX_WARM_UP_ROUNDS,
            "B never committed beside A in {rounds} rounds"
        );
    }
    let warm_up_rounds = rounds;

    // 2. A parks every handler it starts; more rounds.
    let park_line = child::complete_lines(&log_path).len();
    fs::write(dir.join("park-A"), b"").expect("park file");
    for _ in 0..PARKED_ROUNDS {
        publish_round(&publisher, &keys, rounds);
        rounds += 1;
    }
    // A can admit nothing more once every handler it runs is parked and either every
    // slot is taken or every partition is blocked in A (a partition hands out its next
    // message only after the one before finished) or B's (started by B since the park:
    // membership is stable, so a partition only moves from A to B before the stop).
    let mut parked = BTreeSet::new();
    wait(
        "A parked a handler in every slot or partition it has",
        &mut || {
            let lines = read_log(&log_path);
            let (running, p) = in_flight(&lines, "A");
            parked = p;
            let blocked: BTreeSet<u32> = lines
                .iter()
                .filter(|l| l.kind == 'S' && l.who == "A" && parked.contains(&l.what))
                .chain(
                    lines[park_line.min(lines.len())..]
                        .iter()
                        .filter(|l| l.kind == 'S' && l.who == "B"),
                )
                .filter_map(|l| l.fence.map(|(p, _)| p))
                .collect();
            !parked.is_empty()
                && running == parked
                && (parked.len() == SLOTS || blocked.len() == PARTITIONS as usize)
        },
    );
    // The start line of each parked handler: its partition and term.
    let lines = read_log(&log_path);
    let fence_of = |what: &str| {
        lines
            .iter()
            .rev()
            .find(|l| l.kind == 'S' && l.who == "A" && l.what == what)
            .and_then(|l| l.fence)
            .expect("a parked handler's start line")
    };

    // 3. A is stopped.
    a.pause(true);
    let stopped = Instant::now();
    wait(
        &format!("B took A's partitions and committed A's parked messages {parked:?}"),
        &mut || {
            let done = effects(&db);
            parked.iter().all(|w| {
                let (key, seq) = parse(w).expect("key:seq");
                let (p, t) = fence_of(w);
                done.iter().any(|e| {
                    e.key == key
                        && e.seq == seq
                        && e.member == "B"
                        && e.part == p
                        && u64::try_from(e.term).is_ok_and(|b| b > t)
                })
            })
        },
    );

    // 4. A goes on: its parked handlers run into their transactions.
    fs::write(dir.join("release-A"), b"").expect("release file");
    let resumed_at = child::complete_lines(&log_path).len();
    a.pause(false);
    let stopped_for = stopped.elapsed();
    wait("A's parked handlers ended", &mut || {
        let lines = read_log(&log_path);
        parked.iter().all(|w| {
            lines[resumed_at..]
                .iter()
                .any(|l| l.who == "A" && &l.what == w && matches!(l.kind, 'D' | 'X' | 'F'))
        })
    });
    // More work, so the resumed A takes partitions back and starts handlers again (under
    // new terms, if the group is right).
    for _ in 0..AFTER_RESUME_ROUNDS {
        publish_round(&publisher, &keys, rounds);
        rounds += 1;
    }
    let total = keys.len() * rounds as usize;
    wait("every message committed", &mut || {
        let done: BTreeSet<(String, u32)> =
            effects(&db).into_iter().map(|e| (e.key, e.seq)).collect();
        done.len() >= total
    });
    fs::write(dir.join("stop"), b"").expect("stop file");
    a.wait_success(PATIENCE);
    b.wait_success(PATIENCE);

    // The checks.
    let lines = read_log(&log_path);
    let done = effects(&db);
    let stats = |who: &str| -> Vec<u64> {
        fs::read_to_string(dir.join(format!("stats-{who}")))
            .expect("stats file")
            .split(' ')
            .map(|n| n.parse().expect("a count"))
            .collect()
    };
    let (a_stats, b_stats) = (stats("A"), stats("B"));
    // A's parked handlers: how each first ended after the resume.
    let parked_ends: Vec<(String, char)> = parked
        .iter()
        .map(|w| {
            let end = lines[resumed_at..]
                .iter()
                .find(|l| l.who == "A" && &l.what == w && matches!(l.kind, 'D' | 'X' | 'F'))
                .map_or('?', |l| l.kind);
            (w.clone(), end)
        })
        .collect();
    // Per partition, terms never going down in commit order.
    let mut top: HashMap<u32, (i64, String)> = HashMap::new();
    let mut stale_commits = Vec::new();
    for (n, e) in done.iter().enumerate() {
        let entry = top.entry(e.part).or_insert((0, String::new()));
        if e.term < entry.0 {
            stale_commits.push(format!(
                "commit {n}: {} committed {}:{} under term {} of partition {} after {} \
                 committed under term {}",
                e.member, e.key, e.seq, e.term, e.part, entry.1, entry.0
            ));
        } else {
            *entry = (e.term, e.member.clone());
        }
    }
    // Per key: the committed sequence numbers, in commit order.
    let mut per_key: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    for e in &done {
        assert_eq!(part_of.get(&e.key), Some(&e.part), "{e:?}");
        per_key.entry(&e.key).or_default().push(e.seq);
    }
    let want: Vec<u32> = (0..rounds).collect();
    let out_of_order: Vec<String> = keys
        .iter()
        .filter(|(k, _)| per_key.get(k.as_str()) != Some(&want))
        .map(|(k, _)| format!("{k}: {:?}", per_key.get(k.as_str())))
        .collect();
    let stale_after_resume = stale_starts(&lines, resumed_at, Some("A"));
    let stale_anywhere = stale_starts(&lines, 0, None);
    let a_after = lines[resumed_at..]
        .iter()
        .filter(|l| l.who == "A" && l.kind == 'S')
        .count();
    eprintln!(
        "frozen member: {} keys over {PARTITIONS} partitions, {rounds} rounds ({warm_up_rounds} \
         warm-up), {} effects; A parked {parked:?}, stopped {stopped_for:.1?} (lease {ACK_WAIT:?}); after the \
         resume A's parked handlers ended {parked_ends:?}, A started {a_after} handlers, \
         {} of them stale; stale starts anywhere: {}; stale commits: {}; keys out of order \
         or incomplete: {}; A committed/skipped/fenced {a_stats:?}, B {b_stats:?}; {:.1?}",
        keys.len(),
        done.len(),
        stale_after_resume.len(),
        stale_anywhere.len(),
        stale_commits.len(),
        out_of_order.len(),
        started.elapsed()
    );
    for v in stale_commits
        .iter()
        .chain(&stale_after_resume)
        .chain(&stale_anywhere)
        .chain(&out_of_order)
        .take(12)
    {
        eprintln!("  {v}");
    }
    // R-DIST-8: no effect of an older owner commits after a newer owner's, in any partition.
    assert!(
        stale_commits.is_empty(),
        "stale commits: {stale_commits:#?}"
    );
    // R-DIST-8: the frozen member's transactions were refused as fenced, and counted.
    assert!(
        parked_ends.iter().all(|(_, end)| *end == 'X'),
        "A's parked handlers after the resume: {parked_ends:?}"
    );
    assert!(
        a_stats[2] >= SLOTS as u64,
        "A counted {} fenced deliveries, want at least {SLOTS}",
        a_stats[2]
    );
    // R-DIST-8: after the resume A starts nothing of a partition it no longer owns.
    assert!(
        stale_after_resume.is_empty(),
        "stale starts after the resume: {stale_after_resume:#?}"
    );
    // R-DIST-6, R-DEL-7: per key, publish order, each once, nothing lost.
    assert!(
        out_of_order.is_empty(),
        "per-key effects: {out_of_order:#?}"
    );
    assert_eq!(done.len(), total, "each effect once");
}
