//! R-DEL-7: a stream-to-stream pipeline is exactly-once in its effects across SIGKILLs.
//!
//! A child process (this test binary re-executed with [`CHILD_ENV`] set, running only
//! [`pipeline_child`]) opens the data directory, publishes the inputs `0..total` to the
//! stream `in` with ids of its own (a restarted child resumes one input early: that publish
//! is dropped by `in`'s duplicate window), and runs the durable subscription `pipe` on `in`,
//! whose handler publishes two outputs per input to the stream `out` with ids derived from
//! the input's (`caused_by(&input, n)`). The parent SIGKILLs it at a random moment, checks
//! the directory, and starts it again, `cycles` times; then a last child runs to the end.
//!
//! After every kill: no id is twice in `out`, and every committed input (below `pipe`'s
//! committed offset) has both its outputs there. At the end: `in` holds every input once,
//! `out` every expected output once. Inputs redelivered after a kill republish outputs
//! already stored: the child notes each one the window dropped in `dropped.log`, one
//! `write` per line (it survives the kill), so the run shows the window at work.
//!
//! CI: 100 cycles (well under a minute); `TIDINGS_LONG=1`: 500 cycles and more inputs.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};

use std::sync::Arc;
use std::time::{Duration, Instant};

use tidings::embedded::offline::DataDir;
use tidings::{
    Broker, DurableSpec, HandlerError, Message, MessageId, Retry, StreamConfig, SubscribeOptions,
};
use tidings_log::testing::TestRng;
use tidings_testkit::child::TestChild;

const CHILD_ENV: &str = "TIDINGS_EO_CHILD_DIR";
const TOTAL_ENV: &str = "TIDINGS_EO_CHILD_TOTAL";
const FINISH_ENV: &str = "TIDINGS_EO_CHILD_FINISH";
const OUTPUTS_PER_INPUT: u32 = 2;
/// Generous bound on every wait (never asserted as a speed).
const PATIENCE: Duration = Duration::from_secs(120);

/// The id of input `i`: fixed, so a restarted producer republishes the same message.
fn input_id(i: u64) -> MessageId {
    MessageId::from_u128(0x0198_7654_3210_7000_8000_0000_0000_0000 | u128::from(i))
}

fn open(dir: &Path) -> Broker {
    let broker = Broker::builder().data_dir(dir).build().expect("broker");
    broker
        .create_stream(StreamConfig::new("in", ["in.#"]))
        .expect("stream in");
    broker
        .create_stream(StreamConfig::new("out", ["out.#"]))
        .expect("stream out");
    broker
}

#[test]
#[ignore = "entry point of the child processes the kill loop starts"]
fn pipeline_child() {
    let Some(dir) = std::env::var_os(CHILD_ENV).map(PathBuf::from) else {
        return;
    };
    let total: u64 = std::env::var(TOTAL_ENV)
        .expect("total")
        .parse()
        .expect("a number");
    let finish = std::env::var_os(FINISH_ENV).is_some();
    let broker = open(&dir);
    let dropped = Arc::new(
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("dropped.log"))
            .expect("dropped.log"),
    );
    let weak = broker.downgrade();
    let noted = Arc::clone(&dropped);
    let options = SubscribeOptions::new().retry(
        Retry::exponential(Duration::from_millis(5), 2.0)
            .max_delay(Duration::from_millis(200))
            .max_attempts(1_000),
    );
    let pipe = broker
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
                        (&*noted)
                            .write_all(b"output\n")
                            .map_err(|e| HandlerError::retry(e.to_string()))?;
                    }
                }
                Ok(())
            },
        )
        .expect("subscribe");
    let input = broker.stream("in").expect("in");
    // Resume one early: the last input may have been stored just before the kill (and its
    // acknowledgement lost with the process); publishing it again stores nothing.
    for i in input.end_offset().saturating_sub(1)..total {
        let report = broker
            .publish(
                Message::to("in.work")
                    .id(input_id(i))
                    .payload(i.to_string()),
            )
            .expect("publish an input");
        if report.is_duplicate() {
            (&*dropped).write_all(b"input\n").expect("dropped.log");
        }
    }
    let deadline = Instant::now() + PATIENCE;
    while Instant::now() < deadline && !(finish && pipe.committed() >= total) {
        std::thread::sleep(Duration::from_millis(5));
        if !finish {
            // Idle until killed (a kill may come later than the work).
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    assert!(pipe.committed() >= total, "the pipeline did not drain");
    drop(pipe);
    assert!(broker.close(Duration::from_secs(10)).is_clean());
}

/// A pipeline child: this test binary again, running only `pipeline_child`.
fn spawn_child(dir: &Path, total: u64, finish: bool) -> TestChild {
    let mut envs = vec![
        (CHILD_ENV, dir.display().to_string()),
        (TOTAL_ENV, total.to_string()),
    ];
    if finish {
        envs.push((FINISH_ENV, "1".to_owned()));
    }
    TestChild::spawn("pipeline_child", envs)
}

/// What the directory holds, checked: panics on an output stored twice or a committed
/// input without its outputs.
struct Check {
    inputs: u64,
    outputs: u64,
    committed: u64,
}

fn read_all(broker: &Broker, stream: &str) -> Vec<Message> {
    let s = broker.stream(stream).expect("open");
    let mut out = Vec::new();
    let mut from = s.start_offset();
    while from < s.end_offset() {
        let chunk = s.read(from, 1_024).expect("read");
        from = chunk.last().and_then(Message::offset).expect("offset") + 1;
        out.extend(chunk);
    }
    out
}

fn check(dir: &Path, cycle: usize) -> Check {
    let committed = DataDir::open(dir)
        .and_then(|d| d.consumer("in", "pipe"))
        .ok()
        .and_then(|c| c.committed)
        .unwrap_or(0);
    let broker = open(dir);
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
    let missing = inputs
        .iter()
        .take(usize::try_from(committed).expect("fits"))
        .flat_map(|i| (0..OUTPUTS_PER_INPUT).map(|n| i.id().derived(n)))
        .filter(|id| !seen.contains_key(id))
        .count();
    assert_eq!(
        missing, 0,
        "cycle {cycle}: R-DEL-7: committed inputs below {committed} lack {missing} output(s)"
    );
    Check {
        inputs: inputs.len() as u64,
        outputs: outputs.len() as u64,
        committed,
    }
}

// R-DEL-7: SIGKILL at random points of a pipeline in -> handler -> out: every output exists
// once, every committed input produced its outputs.
#[test]
fn a_pipeline_killed_at_random_points_stores_each_output_once() {
    let long = std::env::var_os("TIDINGS_LONG").is_some();
    let (cycles, total) = if long { (500, 20_000) } else { (100, 3_000) };
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let mut rng = TestRng::new(0x0e0e_2707);
    let started = Instant::now();
    let mut last = Check {
        inputs: 0,
        outputs: 0,
        committed: 0,
    };
    for cycle in 0..cycles {
        let mut child = spawn_child(dir, total, false);
        // From "still starting" to "deep in the work".
        std::thread::sleep(Duration::from_millis(5 + rng.below(150)));
        child.kill();
        last = check(dir, cycle);
    }
    let mut child = spawn_child(dir, total, true);
    child.wait_success(PATIENCE);
    let end = check(dir, cycles);
    // Whole lines only: a child killed in the middle of its write leaves a partial line.
    let dropped = tidings_testkit::child::complete_lines(&dir.join("dropped.log"));
    let dropped_outputs = dropped.iter().filter(|l| *l == "output").count();
    let dropped_inputs = dropped.iter().filter(|l| *l == "input").count();
    println!(
        "R-DEL-7 embedded log: cycles {cycles}, inputs {}, outputs {}, duplicates 0, \
         missing 0; retried publishes dropped by the window: {dropped_outputs} output(s), \
         {dropped_inputs} input(s); before the last run {} inputs, {} outputs, {} committed; \
         {:.1?}",
        end.inputs,
        end.outputs,
        last.inputs,
        last.outputs,
        last.committed,
        started.elapsed()
    );
    assert_eq!(end.inputs, total);
    assert_eq!(end.committed, total);
    assert_eq!(end.outputs, total * u64::from(OUTPUTS_PER_INPUT));
}
