//! What the SQLite and PostgreSQL kill loops share: the payments, the durable stream they
//! come from, the child process's protocol and the loop that SIGKILLs it.
//!
//! The child is the test binary run again with [`ROLE_ENV`] set: it opens the broker on the
//! data directory, subscribes the ledger handler durably and processes payments until it
//! is killed. It prints `READY` once subscribed, `IN <id>` when its handler starts a
//! payment (the id is inserted, the transaction not committed), and `STATS <committed>
//! <skipped>` whenever its counters change.
#![allow(dead_code)] // each test binary uses its part

pub mod pg;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tidings::{
    Broker, DurableSpec, DurableSubscription, Handler, Message, MessageId, StreamConfig,
    SubscribeOptions,
};
use tidings_testkit::child::TestChild;

/// Set in the child: the role.
pub const ROLE_ENV: &str = "TIDINGS_SQL_KILL_ROLE";
/// Set in the child: the broker's data directory.
pub const DIR_ENV: &str = "TIDINGS_SQL_KILL_DIR";
/// Set in the child: the database (a path or a connection string).
pub const DB_ENV: &str = "TIDINGS_SQL_KILL_DB";

pub const STREAM: &str = "payments";
pub const DURABLE: &str = "ledger";
pub const TABLE: &str = "processed_messages";
pub const ACCOUNTS: usize = 8;

/// How long a test's own look into a SQLite database waits for another connection's lock.
/// The consumer under test takes the write lock for every transaction (rollback journal:
/// a commit excludes readers while it syncs), and a reader that cannot get its shared lock
/// within its busy timeout fails with `database is locked`. rusqlite's default timeout is
/// 5 s; a consumer committing back to back on a loaded machine starved a checker's retries
/// for longer than that. Long enough for any run of transactions here; bounded, so a lock
/// that is never released fails the test instead of hanging it.
pub const CHECK_BUSY_TIMEOUT: Duration = Duration::from_secs(60);

/// Opens the SQLite database at `path` for a test's checks, waiting up to
/// [`CHECK_BUSY_TIMEOUT`] for the writer's locks.
pub fn sqlite_checker(path: &Path) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(path).expect("open the database to check it");
    conn.busy_timeout(CHECK_BUSY_TIMEOUT)
        .expect("set the checker's busy timeout");
    conn
}

/// `TIDINGS_LONG=1`: the long run.
pub fn long() -> bool {
    std::env::var("TIDINGS_LONG").is_ok_and(|v| v == "1")
}

/// A small deterministic generator (xorshift64*).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

pub fn account_name(i: usize) -> String {
    format!("acct{i}")
}

/// One payment: `<account>:<amount>`.
pub fn parse(message: &Message) -> Result<(String, i64), tidings::HandlerError> {
    let text = std::str::from_utf8(message.payload())?;
    let (account, amount) = text
        .split_once(':')
        .ok_or_else(|| tidings::HandlerError::reject(format!("bad payment {text:?}")))?;
    Ok((account.to_owned(), amount.parse()?))
}

/// `n` payments: account and amount (1..=100), and the id each is published with.
pub fn payments(n: usize, seed: u64) -> Vec<(MessageId, String, i64)> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|_| {
            let account = account_name(rng.below(ACCOUNTS as u64) as usize);
            let amount = 1 + rng.below(100) as i64;
            (MessageId::new(), account, amount)
        })
        .collect()
}

/// What every account must hold: the sum of its distinct payments.
pub fn expected(payments: &[(MessageId, String, i64)]) -> BTreeMap<String, i64> {
    let mut out: BTreeMap<String, i64> = (0..ACCOUNTS).map(|i| (account_name(i), 0)).collect();
    for (_, account, amount) in payments {
        *out.entry(account.clone()).or_default() += amount;
    }
    out
}

/// A broker on the embedded log in `dir`, with the payments stream.
pub fn ledger_broker(dir: &Path) -> Broker {
    let broker = Broker::builder().data_dir(dir).build().expect("broker");
    broker
        .create_stream(StreamConfig::new(STREAM, ["payments.#"]))
        .expect("payments stream");
    broker
}

/// The one place the durable subscription is made (its API is changing on main).
pub fn subscribe_ledger(broker: &Broker, handler: impl Handler) -> DurableSubscription {
    broker
        .subscribe(
            DurableSpec::new(STREAM).name(DURABLE),
            SubscribeOptions::default(),
            handler,
        )
        .expect("durable subscription")
}

/// Publish every payment to the stream (each with its own id), then close the broker.
pub fn publish_all(dir: &Path, payments: &[(MessageId, String, i64)]) {
    let broker = ledger_broker(dir);
    for (id, account, amount) in payments {
        broker
            .publish(
                Message::to(format!("payments.{account}"))
                    .id(*id)
                    .payload(format!("{account}:{amount}")),
            )
            .expect("publish");
    }
    let report = broker.close(Duration::from_secs(10));
    assert!(report.is_clean(), "{report:?}");
}

/// The handler's side of the protocol: `IN <id>`, then a short pause inside the open
/// transaction (so kills land between the insert and the commit).
pub fn note_in_transaction(message: &Message) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "IN {}", message.id());
    let _ = out.flush();
    drop(out);
    std::thread::sleep(Duration::from_micros(
        100 + (message.id().as_u128() % 700) as u64,
    ));
}

/// The child's main loop: subscribe, announce, report counters until killed (bounded).
pub fn child_loop(dir: &Path, subscribe: impl FnOnce(&Broker) -> Box<dyn Fn() -> (u64, u64)>) -> ! {
    let broker = ledger_broker(dir);
    let stats = subscribe(&broker);
    report_until_killed(&*stats)
}

/// The child's side once subscribed (whatever its broker): print `READY`, then `STATS
/// <committed> <skipped>` whenever `stats` changes, until killed (bounded).
pub fn report_until_killed(stats: &dyn Fn() -> (u64, u64)) -> ! {
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "READY");
        let _ = out.flush();
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last = (u64::MAX, u64::MAX);
    while Instant::now() < deadline {
        let now = stats();
        if now != last {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "STATS {} {}", now.0, now.1);
            let _ = out.flush();
            last = now;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    std::process::exit(0);
}

/// Looks into the database after each kill.
pub trait Ledger {
    /// Every account's balance.
    fn balances(&self) -> BTreeMap<String, i64>;
    /// The ids in the processed-messages table.
    fn processed(&self) -> BTreeSet<String>;
}

/// What the kill loop saw.
#[derive(Debug, Default)]
pub struct KillReport {
    pub cycles: usize,
    /// Commits the children reported before they were killed (a lower bound).
    pub committed: u64,
    /// Duplicates the children reported skipping (a lower bound).
    pub skipped: u64,
    /// Kills that landed while a payment's transaction was open: its id was inserted and
    /// the handler had run, and after the kill neither the id nor its effect is there.
    pub killed_in_transaction: u64,
    /// Kills before the child was subscribed (while the broker opened and recovered).
    pub killed_starting: u64,
}

/// `cycles` times: start the child (this test binary, running `test_name` with the
/// child's environment), let it work for a random while, SIGKILL it, and check after each
/// kill that the payment it was in the middle of left no trace.
pub fn kill_loop(
    test_name: &str,
    dir: &Path,
    db: &str,
    ledger: &dyn Ledger,
    cycles: usize,
    seed: u64,
) -> KillReport {
    let dir = dir.display().to_string();
    kill_loop_env(
        test_name,
        &[(DIR_ENV, dir.as_str()), (DB_ENV, db)],
        false,
        ledger,
        cycles,
        seed,
    )
}

/// [`kill_loop`] with the child's environment given whole (besides [`ROLE_ENV`]). With
/// `after_first_payment`, a child that said `READY` is killed at a random point after its
/// first payment started (`IN`), not after `READY`: a child whose first delivery takes a
/// while after it subscribed (a network server) would otherwise mostly die before it.
pub fn kill_loop_env(
    test_name: &str,
    envs: &[(&str, &str)],
    after_first_payment: bool,
    ledger: &dyn Ledger,
    cycles: usize,
    seed: u64,
) -> KillReport {
    let mut rng = Rng::new(seed);
    let exe = std::env::current_exe().expect("test binary");
    let mut report = KillReport {
        cycles,
        ..KillReport::default()
    };
    for cycle in 0..cycles {
        let child = Command::new(&exe)
            .args(["--exact", test_name, "--nocapture", "--test-threads=1"])
            .env(ROLE_ENV, "child")
            .envs(envs.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the child");
        // Killed and reaped on drop, also when the parent panics.
        let mut child = TestChild::adopt(child);
        let stdout = child.take_stdout().expect("stdout");
        let (tx, rx) = mpsc::channel::<String>();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut lines = Vec::new();
        if rng.below(5) == 0 {
            // Kill while it starts: opening the broker, recovering, subscribing.
            std::thread::sleep(Duration::from_micros(rng.below(30_000)));
        } else {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let line = rx
                    .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                    .unwrap_or_else(|e| panic!("cycle {cycle}: the child did not start: {e}"));
                // `READY` comes after the harness's "test name ... ".
                let started = if after_first_payment {
                    line.starts_with("IN ")
                } else {
                    line.ends_with("READY")
                };
                lines.push(line);
                if started {
                    break;
                }
            }
            std::thread::sleep(Duration::from_micros(1_000 + rng.below(80_000)));
        }
        child.kill();
        drop(child);
        reader.join().expect("reader");
        lines.extend(rx.try_iter());
        if !lines.iter().any(|l| l.ends_with("READY")) {
            report.killed_starting += 1;
        }
        let last_in = lines.iter().rev().find_map(|l| l.strip_prefix("IN "));
        // The last counters a child printed are its totals (as far as it got to say).
        if let Some(last) = lines.iter().rev().find_map(|l| l.strip_prefix("STATS ")) {
            let mut parts = last.split(' ').map(|n| n.parse::<u64>().unwrap_or(0));
            report.committed += parts.next().unwrap_or(0);
            report.skipped += parts.next().unwrap_or(0);
        }
        if let Some(id) = last_in
            && !ledger.processed().contains(id)
        {
            report.killed_in_transaction += 1;
        }
    }
    report
}

/// After the loop: every payment processed exactly once. Returns the number of accounts
/// whose balance is wrong (asserted 0 by the caller, after printing).
pub fn mismatches(
    ledger: &dyn Ledger,
    payments: &[(MessageId, String, i64)],
) -> (usize, BTreeMap<String, (i64, i64)>) {
    let want = expected(payments);
    let got = ledger.balances();
    let mut wrong = BTreeMap::new();
    for (account, w) in &want {
        let g = got.get(account).copied().unwrap_or(i64::MIN);
        if g != *w {
            wrong.insert(account.clone(), (g, *w));
        }
    }
    (wrong.len(), wrong)
}

/// Every published id is in the processed table, and nothing else.
pub fn assert_all_recorded(ledger: &dyn Ledger, payments: &[(MessageId, String, i64)]) {
    let want: BTreeSet<String> = payments.iter().map(|(id, ..)| id.to_string()).collect();
    assert_eq!(ledger.processed(), want, "the processed-messages table");
}

/// Wait (bounded) until `done()`.
pub fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// After a kill loop: finishes the stream in this process with `handler` (whose counters
/// `stats` reads), prints the counts under `label`, and checks that every balance equals
/// the sum of its distinct payments, every payment id was recorded once, a kill landed
/// inside a transaction and a redelivery was skipped (R-DEL-7).
pub fn finish_and_check<H: Handler + Clone>(
    label: &str,
    dir: &Path,
    ledger: &dyn Ledger,
    payments: &[(MessageId, String, i64)],
    report: &KillReport,
    handler: H,
    stats: impl Fn(&H) -> tidings_sql::TransactionalStats,
) {
    let broker = ledger_broker(dir);
    let sub = subscribe_ledger(&broker, handler.clone());
    wait_for("every payment", Duration::from_secs(120), || {
        ledger.processed().len() == payments.len()
    });
    drop(sub);
    broker.close(Duration::from_secs(10));
    check_finished(label, ledger, payments, report, stats(&handler));
}

/// After a kill loop and a last run that finished the stream (whose handler's counters are
/// `last`): prints the counts under `label`, and checks that every balance equals the sum
/// of its distinct payments, every payment id was recorded once, a kill landed inside a
/// transaction and a redelivery was skipped (R-DEL-7).
pub fn check_finished(
    label: &str,
    ledger: &dyn Ledger,
    payments: &[(MessageId, String, i64)],
    report: &KillReport,
    last: tidings_sql::TransactionalStats,
) {
    let (wrong, detail) = mismatches(ledger, payments);
    eprintln!(
        "{label} kill loop: {} cycles ({} while starting, {} inside a payment's transaction), \
         {} messages, {} committed and {} duplicates skipped by the children, \
         {} committed and {} duplicates skipped by the last run, {wrong} balance mismatches",
        report.cycles,
        report.killed_starting,
        report.killed_in_transaction,
        payments.len(),
        report.committed,
        report.skipped,
        last.committed,
        last.skipped,
    );
    assert_eq!(wrong, 0, "balances (got, want): {detail:?}");
    assert_all_recorded(ledger, payments);
    assert!(
        report.killed_in_transaction > 0,
        "no kill landed inside a transaction: {report:?}"
    );
    assert!(
        report.skipped + last.skipped > 0,
        "no redelivery was skipped: {report:?}"
    );
}
