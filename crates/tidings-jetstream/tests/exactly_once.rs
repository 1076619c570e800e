//! R-DEL-7 on JetStream: a stream-to-stream pipeline is exactly-once in its effects across
//! SIGKILLs of the consuming process *and* of the server.
//!
//! A child process (this test binary re-executed with [`URL_ENV`] set, running only
//! [`pipeline_child`]) publishes the inputs `0..total` to the stream `in` with ids of its
//! own, retrying a failed publish with the same id (the retry recipe: the server's duplicate
//! window drops a retry whose first attempt was stored), and runs the durable subscription
//! `pipe` on `in`, whose handler publishes two outputs per input to `out` with ids derived
//! from the input's. The child notes its acknowledged position (`pipe`'s committed offset:
//! one past the consumer's ack floor) in `committed.log`, one `write` per line.
//!
//! The parent kills, at random moments, 20 times: the child, the server (restarted after a
//! while, the child still running), or both. After every kill: no id is twice in `out`, and
//! every acknowledged input has both its outputs there. At the end a last child drains the
//! pipeline: `in` holds every input once, `out` every expected output once.
//!
//! The server is found like every other JetStream test (`TIDINGS_NATS_SERVER`, or installed
//! by the launcher; skipped with a notice only under `TIDINGS_SKIP_NATS=1`).
//! `TIDINGS_LONG=1`: 60 kills and more inputs.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tidings::{
    Broker, DurableSpec, HandlerError, Message, MessageId, Retry, StreamConfig, SubscribeOptions,
};
use tidings_jetstream::{ConnectOptions, JetStreamBackend};
use tidings_testkit::child::{self, TestChild};
use tidings_testkit::nats::{NatsServer, NatsServerOptions};

const URL_ENV: &str = "TIDINGS_EO_JS_URL";
const DIR_ENV: &str = "TIDINGS_EO_JS_DIR";
const TOTAL_ENV: &str = "TIDINGS_EO_JS_TOTAL";
const FINISH_ENV: &str = "TIDINGS_EO_JS_FINISH";
const OUTPUTS_PER_INPUT: u32 = 2;
/// Short, so what a killed child held comes back soon; keep-alives cover slow handlers.
const ACK_WAIT: Duration = Duration::from_secs(4);
/// Generous bound on every wait (never asserted as a speed).
const PATIENCE: Duration = Duration::from_secs(180);

fn input_id(i: u64) -> MessageId {
    MessageId::from_u128(0x0198_7654_3210_7000_9000_0000_0000_0000 | u128::from(i))
}

fn open(url: &str) -> Result<Broker, String> {
    let backend = JetStreamBackend::builder()
        .ack_wait(ACK_WAIT)
        .connect(
            ConnectOptions::new(url)
                .connect_timeout(Duration::from_secs(5))
                .request_timeout(Duration::from_secs(3))
                .name("tidings-exactly-once-test"),
        )
        .map_err(|e| e.to_string())?;
    let broker = Broker::builder()
        .durable_backend(Arc::new(backend))
        .build()
        .map_err(|e| e.to_string())?;
    for (name, pattern) in [("in", "in.#"), ("out", "out.#")] {
        broker
            .create_stream(StreamConfig::new(name, [pattern]))
            .map_err(|e| e.to_string())?;
    }
    Ok(broker)
}

fn append_line(file: &std::fs::File, line: &str) {
    // One write per line: a line written before a SIGKILL survives it.
    let _ = (&*file).write_all(format!("{line}\n").as_bytes());
}

#[test]
#[ignore = "entry point of the child processes the kill loop starts"]
fn pipeline_child() {
    let Some(url) = std::env::var_os(URL_ENV) else {
        return;
    };
    let url = url.to_string_lossy().into_owned();
    let dir = PathBuf::from(std::env::var_os(DIR_ENV).expect("dir"));
    let total: u64 = std::env::var(TOTAL_ENV)
        .expect("total")
        .parse()
        .expect("a number");
    let finish = std::env::var_os(FINISH_ENV).is_some();
    // The server may be down (the parent kills it too): try until it answers.
    let deadline = Instant::now() + PATIENCE;
    let broker = loop {
        match open(&url) {
            Ok(b) => break b,
            Err(e) => {
                assert!(Instant::now() < deadline, "no server: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    };
    let log = |name: &str| {
        Arc::new(
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join(name))
                .expect("log file"),
        )
    };
    let (dropped, committed_log) = (log("dropped.log"), log("committed.log"));
    let weak = broker.downgrade();
    let noted = Arc::clone(&dropped);
    let options = SubscribeOptions::new().retry(
        Retry::exponential(Duration::from_millis(20), 2.0)
            .max_delay(Duration::from_millis(500))
            .max_attempts(10_000),
    );
    let pipe = Arc::new(
        broker
            .subscribe(
                DurableSpec::new("in").name("pipe"),
                options,
                move |input: &Message| {
                    let broker = weak.upgrade().ok_or(HandlerError::retry("closing"))?;
                    for n in 0..OUTPUTS_PER_INPUT {
                        let report = broker
                            .publish(
                                Message::to(format!("out.{n}"))
                                    .caused_by(input, n)
                                    .payload(input.payload().clone()),
                            )
                            .map_err(|e| HandlerError::retry(e.to_string()))?;
                        if report.is_duplicate() {
                            append_line(&noted, "output");
                        }
                    }
                    Ok(())
                },
            )
            .expect("subscribe"),
    );
    // Note the acknowledged position as it moves.
    let stop = Arc::new(AtomicBool::new(false));
    let reporter = {
        let (pipe_state, stop) = (Arc::clone(&pipe), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut last = 0;
            while !stop.load(Ordering::Relaxed) {
                let c = pipe_state.committed();
                if c > last {
                    append_line(&committed_log, &c.to_string());
                    last = c;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let input = broker.stream("in").expect("in");
    let first = input.start_offset();
    // Resume one early (its publish may have been stored with its answer lost).
    let mut i = (input.end_offset() - first).saturating_sub(1);
    while i < total {
        let publish = broker.publish(
            Message::to("in.work")
                .id(input_id(i))
                .payload(i.to_string()),
        );
        match publish {
            Ok(report) => {
                if report.is_duplicate() {
                    append_line(&dropped, "input");
                }
                i += 1;
            }
            // The server is away: retry with the same id.
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
    let end = first + total;
    let deadline = Instant::now() + PATIENCE;
    while Instant::now() < deadline && !(finish && pipe.committed() >= end) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(pipe.committed() >= end, "the pipeline did not drain");
    stop.store(true, Ordering::Relaxed);
    reporter.join().expect("the reporter");
    drop(pipe);
    broker.close(Duration::from_secs(10));
}

/// A pipeline child: this test binary again, running only `pipeline_child`.
fn spawn_child(url: &str, dir: &Path, total: u64, finish: bool) -> TestChild {
    let mut envs = vec![
        (URL_ENV, url.to_owned()),
        (DIR_ENV, dir.display().to_string()),
        (TOTAL_ENV, total.to_string()),
    ];
    if finish {
        envs.push((FINISH_ENV, "1".to_owned()));
    }
    TestChild::spawn("pipeline_child", envs)
}

/// A small deterministic generator (xorshift*).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

fn read_all(broker: &Broker, stream: &str) -> Vec<Message> {
    let s = broker.stream(stream).expect("open");
    let mut out = Vec::new();
    let mut from = s.start_offset();
    while from < s.end_offset() {
        let chunk = s.read(from, 512).expect("read");
        let Some(last) = chunk.last().and_then(Message::offset) else {
            break;
        };
        from = last + 1;
        out.extend(chunk);
    }
    out
}

struct Check {
    inputs: u64,
    outputs: u64,
    acknowledged: u64,
}

/// Panics on an output stored twice, an input stored twice or out of order, or an
/// acknowledged input without its outputs.
fn check(url: &str, dir: &Path, cycle: usize) -> Check {
    // Whole lines only: a child killed in the middle of its write leaves a partial last line.
    let acknowledged_below = child::complete_lines(&dir.join("committed.log"))
        .iter()
        .filter_map(|l| l.parse::<u64>().ok())
        .max()
        .unwrap_or(0);
    let broker = open(url).expect("the parent connects");
    let inputs = read_all(&broker, "in");
    let outputs = read_all(&broker, "out");
    broker.close(Duration::from_secs(10));
    let mut seen: HashMap<MessageId, usize> = HashMap::new();
    for o in &outputs {
        *seen.entry(o.id()).or_default() += 1;
    }
    let twice = seen.values().filter(|&&n| n > 1).count();
    assert_eq!(
        twice, 0,
        "cycle {cycle}: R-DEL-7: {twice} output(s) stored twice"
    );
    for (i, input) in inputs.iter().enumerate() {
        assert_eq!(
            input.id(),
            input_id(i as u64),
            "cycle {cycle}: input {i} stored out of order or twice"
        );
    }
    let acknowledged: Vec<&Message> = inputs
        .iter()
        .filter(|m| m.offset().is_some_and(|o| o < acknowledged_below))
        .collect();
    let missing = acknowledged
        .iter()
        .flat_map(|i| (0..OUTPUTS_PER_INPUT).map(|n| i.id().derived(n)))
        .filter(|id| !seen.contains_key(id))
        .count();
    assert_eq!(
        missing, 0,
        "cycle {cycle}: R-DEL-7: acknowledged inputs lack {missing} output(s)"
    );
    Check {
        inputs: inputs.len() as u64,
        outputs: outputs.len() as u64,
        acknowledged: acknowledged.len() as u64,
    }
}

// R-DEL-7: 20 kills at random moments — of the consumer, of the server, of both — and each
// output exists once; every acknowledged input produced its outputs.
#[test]
fn a_pipeline_on_jetstream_survives_process_and_server_kills_with_each_output_once() {
    let Some(mut server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let url = server.url();
    let long = std::env::var_os("TIDINGS_LONG").is_some();
    let (cycles, total) = if long { (60, 5_000) } else { (20, 600) };
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let mut rng = Rng(0x2707_0e0e_5eed_1234);
    let started = Instant::now();
    let (mut child_kills, mut server_kills) = (0, 0);
    for cycle in 0..cycles {
        let mut child = spawn_child(&url, dir, total, false);
        std::thread::sleep(Duration::from_millis(100 + rng.below(900)));
        match cycle % 3 {
            // The server dies under a running child, comes back, then the child dies.
            1 => {
                server.kill().expect("SIGKILL the server");
                server_kills += 1;
                std::thread::sleep(Duration::from_millis(50 + rng.below(500)));
                server.restart().expect("restart the server");
                std::thread::sleep(Duration::from_millis(100 + rng.below(900)));
                child.kill();
                child_kills += 1;
            }
            // Both at once.
            2 => {
                child.kill();
                server.kill().expect("SIGKILL the server");
                (child_kills, server_kills) = (child_kills + 1, server_kills + 1);
                server.restart().expect("restart the server");
            }
            _ => {
                child.kill();
                child_kills += 1;
            }
        }
        check(&url, dir, cycle);
    }
    let mut child = spawn_child(&url, dir, total, true);
    child.wait_success(PATIENCE);
    let end = check(&url, dir, cycles);
    let dropped = child::complete_lines(&dir.join("dropped.log"));
    let dropped_outputs = dropped.iter().filter(|l| *l == "output").count();
    let dropped_inputs = dropped.iter().filter(|l| *l == "input").count();
    println!(
        "R-DEL-7 jetstream: cycles {cycles} ({child_kills} consumer kills, {server_kills} \
         server kills), inputs {}, outputs {}, acknowledged {}, duplicates 0, missing 0; \
         retried publishes dropped by the window: {dropped_outputs} output(s), \
         {dropped_inputs} input(s); {:.1?}",
        end.inputs,
        end.outputs,
        end.acknowledged,
        started.elapsed()
    );
    assert_eq!(end.inputs, total);
    assert_eq!(end.acknowledged, total);
    assert_eq!(end.outputs, total * u64::from(OUTPUTS_PER_INPUT));
}
