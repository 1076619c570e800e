//! `tidings stream|consumer|dlq …`: offline tools on a broker's data directory (R-OPS-5).
//!
//! A thin layer over [`tidings::embedded::offline`]: argument parsing, tables, `--json`, exit codes.
//! Read commands (`ls`, `info`, `show`) run beside a live broker and show what is on disk;
//! write commands (`seek`, `redrive`, `purge`) refuse with exit code 2 while a broker holds
//! the stream.
//!
//! `--json` prints one JSON document on stdout whose field names are stable:
//!
//! | command | document |
//! |---|---|
//! | `stream ls` | `{"data_dir", "streams": [stream]}` |
//! | `stream info` | stream: `name, dir, start_offset, end_offset, records, bytes, segments, first_timestamp_ms, last_timestamp_ms, locked, consumers, problems` |
//! | `consumer ls` | `{"stream", "consumers": [consumer]}` |
//! | `consumer info` | consumer: `stream, name, committed, stream_start, stream_end, lag, dead_letters, dead_letters_by_reason, active, offset_file` |
//! | `consumer seek` | `{stream, name, previous, committed}` |
//! | `dlq ls` | `{"data_dir", "consumers": [consumer]}` (those with dead letters) |
//! | `dlq show` | `{"stream", "name", "total", "entries": [entry]}`; entry: `entry, stream_offset, message_id, topic, key, priority, timestamp_ms, reason_kind, reason, attempts, headers, payload_len, payload_preview` |
//! | `dlq redrive`, `dlq purge` | `{stream, name, entries, stream_offsets, remaining}` |

use std::num::NonZeroU8;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Args, Subcommand};
use serde::Serialize;
use tidings::StartAt;
use tidings::embedded::offline::{
    ConsumerSummary, DataDir, DeadLetterEntry, InspectError, PurgeError, RedriveError, SeekError,
    Selection, StreamSummary,
};
use time::OffsetDateTime;
use time::format_description::well_known::{Iso8601, Rfc3339, iso8601};

use crate::progress::Progress;
use crate::table::{self, Align, Style};
use crate::{EXIT_PROBLEM, EXIT_USAGE};

/// Options shared by every data-dir command.
#[derive(Debug, Args)]
pub(crate) struct Common {
    /// The broker's data directory (what `Broker::builder().data_dir(..)` was given).
    /// Required.
    #[arg(long, short = 'd', value_name = "DIR", global = true)]
    data_dir: Option<PathBuf>,
    /// Print one JSON document instead of a table.
    #[arg(long, global = true)]
    json: bool,
}

/// `tidings stream …`.
#[derive(Debug, Args)]
pub(crate) struct StreamCommand {
    #[command(flatten)]
    common: Common,
    #[command(subcommand)]
    op: StreamOp,
}

#[derive(Debug, Subcommand)]
enum StreamOp {
    /// List the streams: offsets, records, bytes, consumers, whether a broker holds them.
    #[command(after_help = "Example:\n  tidings stream ls -d /tmp/tidings-demo --json")]
    Ls,
    /// Describe one stream.
    #[command(after_help = "Example:\n  tidings stream info orders -d /tmp/tidings-demo")]
    Info {
        /// The stream name.
        name: String,
    },
}

/// `tidings consumer …`.
#[derive(Debug, Args)]
pub(crate) struct ConsumerCommand {
    #[command(flatten)]
    common: Common,
    #[command(subcommand)]
    op: ConsumerOp,
}

#[derive(Debug, Subcommand)]
enum ConsumerOp {
    /// List the durable subscriptions of a stream: committed offset, lag, dead letters.
    #[command(after_help = "Example:\n  tidings consumer ls orders -d /tmp/tidings-demo")]
    Ls {
        /// The stream name.
        stream: String,
    },
    /// Describe one durable subscription.
    #[command(after_help = "Example:\n  tidings consumer info orders billing -d /tmp/tidings-demo")]
    Info {
        /// The stream name.
        stream: String,
        /// The durable name.
        name: String,
    },
    /// Move the committed position (the broker must be stopped).
    #[command(
        after_help = "Example:\n  tidings consumer seek orders billing --time 2026-12-02T17:00:00Z -d /tmp/tidings-demo"
    )]
    Seek {
        /// The stream name.
        stream: String,
        /// The durable name.
        name: String,
        #[command(flatten)]
        target: SeekTarget,
    },
}

#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
struct SeekTarget {
    /// To this offset.
    #[arg(long, value_name = "N")]
    offset: Option<u64>,
    /// To the first record at or after this time: milliseconds since the UNIX epoch or an
    /// RFC 3339 time such as 2026-12-02T17:00:00Z.
    #[arg(long, value_name = "T")]
    time: Option<String>,
    /// To the earliest retained record.
    #[arg(long)]
    earliest: bool,
    /// To the end of the stream (skip everything not yet consumed).
    #[arg(long)]
    latest: bool,
}

/// `tidings dlq …`.
#[derive(Debug, Args)]
pub(crate) struct DlqCommand {
    #[command(flatten)]
    common: Common,
    #[command(subcommand)]
    op: DlqOp,
}

#[derive(Debug, Subcommand)]
enum DlqOp {
    /// List the durable subscriptions that have dead letters, with counts by reason.
    #[command(after_help = "Example:\n  tidings dlq ls -d /tmp/tidings-demo")]
    Ls {
        /// Only this stream.
        stream: Option<String>,
    },
    /// Show the dead letters of one durable subscription.
    #[command(after_help = "Example:\n  tidings dlq show orders fraud -d /tmp/tidings-demo")]
    Show {
        /// The stream name.
        stream: String,
        /// The durable name.
        name: String,
        /// Only these entry ids (repeatable).
        #[arg(long = "entry", value_name = "ID")]
        entries: Vec<u64>,
        /// Show at most this many entries (oldest first).
        #[arg(long, value_name = "N", default_value_t = 100)]
        limit: usize,
    },
    /// Append dead letters back to the stream, then remove them from the DLQ (loss-safe).
    #[command(
        after_help = "Example:\n  tidings dlq redrive orders fraud --all -d /tmp/tidings-demo"
    )]
    Redrive {
        /// The stream name.
        stream: String,
        /// The durable name.
        name: String,
        #[command(flatten)]
        which: Which,
    },
    /// Remove dead letters without redriving them.
    #[command(
        after_help = "Example:\n  tidings dlq purge orders fraud --entry ID -d /tmp/tidings-demo"
    )]
    Purge {
        /// The stream name.
        stream: String,
        /// The durable name.
        name: String,
        #[command(flatten)]
        which: Which,
    },
}

#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
struct Which {
    /// Every entry.
    #[arg(long)]
    all: bool,
    /// These entry ids (repeatable; see `dlq show`).
    #[arg(long = "entry", value_name = "ID")]
    entries: Vec<u64>,
}

impl Which {
    fn selection(&self) -> Selection {
        if self.all {
            Selection::All
        } else {
            Selection::Entries(self.entries.clone())
        }
    }
}

/// A failed command: its message and exit code.
struct Failure {
    code: u8,
    message: String,
}

impl From<InspectError> for Failure {
    fn from(e: InspectError) -> Self {
        let code = match e {
            InspectError::Unreadable { .. } => EXIT_PROBLEM,
            _ => EXIT_USAGE,
        };
        Failure {
            code,
            message: e.to_string(),
        }
    }
}

fn usage(message: impl Into<String>) -> Failure {
    Failure {
        code: EXIT_USAGE,
        message: message.into(),
    }
}

impl From<SeekError> for Failure {
    fn from(e: SeekError) -> Self {
        match e {
            SeekError::Inspect(e) => e.into(),
            other => usage(other.to_string()),
        }
    }
}

impl From<RedriveError> for Failure {
    fn from(e: RedriveError) -> Self {
        match e {
            RedriveError::Inspect(e) => e.into(),
            RedriveError::Stream(e) => Failure {
                code: EXIT_PROBLEM,
                message: e.to_string(),
            },
            other => usage(other.to_string()),
        }
    }
}

impl From<PurgeError> for Failure {
    fn from(e: PurgeError) -> Self {
        match e {
            PurgeError::Inspect(e) => e.into(),
            PurgeError::Stream(e) => Failure {
                code: EXIT_PROBLEM,
                message: e.to_string(),
            },
            other => usage(other.to_string()),
        }
    }
}

impl Common {
    fn open(&self) -> Result<DataDir, Failure> {
        let path = self
            .data_dir
            .as_ref()
            .ok_or_else(|| usage("--data-dir DIR is required"))?;
        Ok(DataDir::open(path)?)
    }
}

fn finish(what: &str, outcome: Result<(), Failure>) -> ExitCode {
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("tidings {what}: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

fn print_json(value: &impl Serialize) -> Result<(), Failure> {
    let text = serde_json::to_string_pretty(value).map_err(|e| Failure {
        code: EXIT_PROBLEM,
        message: format!("cannot encode JSON: {e}"),
    })?;
    outln!("{text}");
    Ok(())
}

/// Run `tidings stream …`.
pub(crate) fn run_stream(cmd: &StreamCommand) -> ExitCode {
    finish("stream", stream(cmd))
}

fn stream(cmd: &StreamCommand) -> Result<(), Failure> {
    let dir = cmd.common.open()?;
    let json = cmd.common.json;
    match &cmd.op {
        StreamOp::Ls => {
            let streams = dir.streams()?;
            if json {
                #[derive(Serialize)]
                struct Out<'a> {
                    data_dir: &'a Path,
                    streams: &'a [StreamSummary],
                }
                return print_json(&Out {
                    data_dir: dir.path(),
                    streams: &streams,
                });
            }
            if streams.is_empty() {
                outln!("no streams in {}", dir.path().display());
                return Ok(());
            }
            print_streams(&streams);
        }
        StreamOp::Info { name } => {
            let s = dir.stream(name)?;
            if json {
                return print_json(&s);
            }
            outln!("stream       {}", s.name);
            outln!("directory    {}", s.dir.display());
            outln!("offsets      {}..{}", s.start_offset, s.end_offset);
            outln!("records      {}", s.records);
            outln!("bytes        {}", s.bytes);
            outln!("segments     {}", s.segments);
            outln!("first record {}", time_or_dash(s.first_timestamp_ms));
            outln!("last record  {}", time_or_dash(s.last_timestamp_ms));
            outln!("consumers    {}", s.consumers);
            outln!("locked       {}", locked_note(s.locked));
            for p in &s.problems {
                outln!("problem      {p}");
            }
        }
    }
    Ok(())
}

fn locked_note(locked: bool) -> &'static str {
    if locked {
        "yes: a broker has it open (figures are what is on disk now)"
    } else {
        "no"
    }
}

fn print_streams(streams: &[StreamSummary]) {
    let rows = streams
        .iter()
        .map(|s| {
            vec![
                s.name.clone(),
                s.start_offset.to_string(),
                s.end_offset.to_string(),
                s.records.to_string(),
                s.bytes.to_string(),
                s.segments.to_string(),
                s.consumers.to_string(),
                yes_no(s.locked),
                time_or_dash(s.last_timestamp_ms),
            ]
        })
        .collect::<Vec<_>>();
    table(
        &[
            "STREAM",
            "START",
            "END",
            "RECORDS",
            "BYTES",
            "SEGMENTS",
            "CONSUMERS",
            "LOCKED",
            "LAST RECORD",
        ],
        &rows,
    );
}

/// Run `tidings consumer …`.
pub(crate) fn run_consumer(cmd: &ConsumerCommand) -> ExitCode {
    finish("consumer", consumer(cmd))
}

fn consumer(cmd: &ConsumerCommand) -> Result<(), Failure> {
    let dir = cmd.common.open()?;
    let json = cmd.common.json;
    match &cmd.op {
        ConsumerOp::Ls { stream } => {
            let consumers = dir.consumers(stream)?;
            if json {
                #[derive(Serialize)]
                struct Out<'a> {
                    stream: &'a str,
                    consumers: &'a [ConsumerSummary],
                }
                return print_json(&Out {
                    stream,
                    consumers: &consumers,
                });
            }
            if consumers.is_empty() {
                outln!("no durable subscriptions on stream {stream}");
                return Ok(());
            }
            print_consumers(&consumers);
        }
        ConsumerOp::Info { stream, name } => {
            let c = dir.consumer(stream, name)?;
            if json {
                return print_json(&c);
            }
            outln!("consumer     {}/{}", c.stream, c.name);
            outln!(
                "committed    {}",
                c.committed.map_or("-".to_owned(), |o| o.to_string())
            );
            outln!("stream       {}..{}", c.stream_start, c.stream_end);
            outln!("lag          {}", c.lag);
            outln!("dead letters {}", c.dead_letters);
            for (reason, n) in &c.dead_letters_by_reason {
                outln!("  {reason:<20} {n}");
            }
            outln!(
                "active       {}",
                if c.active {
                    "yes: live in a broker (its committed offset may be behind what it handled)"
                } else {
                    "no"
                }
            );
            outln!("offset file  {}", c.offset_file.display());
        }
        ConsumerOp::Seek {
            stream,
            name,
            target,
        } => {
            let at = if let Some(o) = target.offset {
                StartAt::Offset(o)
            } else if let Some(t) = &target.time {
                StartAt::Time(parse_time(t).map_err(usage)?)
            } else if target.earliest {
                StartAt::Earliest
            } else {
                StartAt::Latest
            };
            let out = dir.seek(stream, name, at)?;
            if json {
                return print_json(&out);
            }
            outln!(
                "{}/{}: committed position {} -> {}",
                out.stream,
                out.name,
                out.previous,
                out.committed
            );
        }
    }
    Ok(())
}

fn print_consumers(consumers: &[ConsumerSummary]) {
    let rows = consumers
        .iter()
        .map(|c| {
            vec![
                c.stream.clone(),
                c.name.clone(),
                c.committed.map_or("-".to_owned(), |o| o.to_string()),
                c.stream_end.to_string(),
                c.lag.to_string(),
                c.dead_letters.to_string(),
                reasons(c),
                yes_no(c.active),
            ]
        })
        .collect::<Vec<_>>();
    table(
        &[
            "STREAM",
            "CONSUMER",
            "COMMITTED",
            "END",
            "LAG",
            "DLQ",
            "DLQ BY REASON",
            "ACTIVE",
        ],
        &rows,
    );
}

fn reasons(c: &ConsumerSummary) -> String {
    if c.dead_letters_by_reason.is_empty() {
        return "-".to_owned();
    }
    c.dead_letters_by_reason
        .iter()
        .map(|(r, n)| format!("{r}={n}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Run `tidings dlq …`.
pub(crate) fn run_dlq(cmd: &DlqCommand) -> ExitCode {
    finish("dlq", dlq(cmd))
}

fn dlq(cmd: &DlqCommand) -> Result<(), Failure> {
    let dir = cmd.common.open()?;
    let json = cmd.common.json;
    match &cmd.op {
        DlqOp::Ls { stream } => {
            let streams = match stream {
                Some(s) => {
                    // Validates the name and that the stream exists.
                    dir.consumer_names(s)?;
                    vec![s.clone()]
                }
                None => dir.stream_names()?,
            };
            let mut with_dl = Vec::new();
            for s in &streams {
                with_dl.extend(dir.consumers(s)?.into_iter().filter(|c| c.dead_letters > 0));
            }
            if json {
                #[derive(Serialize)]
                struct Out<'a> {
                    data_dir: &'a Path,
                    consumers: &'a [ConsumerSummary],
                }
                return print_json(&Out {
                    data_dir: dir.path(),
                    consumers: &with_dl,
                });
            }
            if with_dl.is_empty() {
                outln!("no dead letters in {}", dir.path().display());
                return Ok(());
            }
            print_consumers(&with_dl);
        }
        DlqOp::Show {
            stream,
            name,
            entries,
            limit,
        } => {
            let all = dir.dead_letters(stream, name)?;
            let total = all.len();
            let shown: Vec<DeadLetterEntry> = all
                .into_iter()
                .filter(|e| entries.is_empty() || entries.contains(&e.entry))
                .take(*limit)
                .collect();
            if let Some(missing) = entries
                .iter()
                .find(|id| !shown.iter().any(|e| e.entry == **id))
                && shown.len() < *limit
            {
                return Err(usage(format!(
                    "dead-letter entry {missing} of {stream}/{name} does not exist or was removed"
                )));
            }
            if json {
                #[derive(Serialize)]
                struct Out<'a> {
                    stream: &'a str,
                    name: &'a str,
                    total: usize,
                    entries: &'a [DeadLetterEntry],
                }
                return print_json(&Out {
                    stream,
                    name,
                    total,
                    entries: &shown,
                });
            }
            outln!(
                "{stream}/{name}: {total} dead letter(s){}",
                if shown.len() < total {
                    format!(", showing {}", shown.len())
                } else {
                    String::new()
                }
            );
            for e in &shown {
                print_entry(e);
            }
        }
        DlqOp::Redrive {
            stream,
            name,
            which,
        } => {
            let mut progress = Progress::new(format!("redrive {stream}/{name}"));
            let out = dir.redrive(stream, name, &which.selection(), &mut |d, t| {
                progress.update(d, t);
            });
            progress.finish();
            let out = out?;
            if json {
                return print_json(&out);
            }
            match (out.stream_offsets.first(), out.stream_offsets.last()) {
                (Some(first), Some(last)) => outln!(
                    "{stream}/{name}: redrove {} dead letter(s) to stream offsets {first}..={last}; {} left",
                    out.entries.len(),
                    out.remaining
                ),
                _ => outln!(
                    "{stream}/{name}: nothing to redrive; {} left",
                    out.remaining
                ),
            }
        }
        DlqOp::Purge {
            stream,
            name,
            which,
        } => {
            let mut progress = Progress::new(format!("purge {stream}/{name}"));
            let out = dir.purge(stream, name, &which.selection(), &mut |d, t| {
                progress.update(d, t);
            });
            progress.finish();
            let out = out?;
            if json {
                return print_json(&out);
            }
            outln!(
                "{stream}/{name}: purged {} dead letter(s); {} left",
                out.entries.len(),
                out.remaining
            );
        }
    }
    Ok(())
}

fn print_entry(e: &DeadLetterEntry) {
    outln!();
    outln!(
        "entry {}  stream offset {}  {}",
        e.entry,
        e.stream_offset.map_or("-".to_owned(), |o| o.to_string()),
        format_time(e.timestamp_ms)
    );
    outln!("  id        {}", e.message_id);
    outln!("  topic     {}", e.topic);
    if let Some(k) = &e.key {
        outln!("  key       {k}");
    }
    outln!("  priority  {}", e.priority);
    outln!("  reason    {} ({} attempt(s))", e.reason, e.attempts);
    for (k, v) in &e.headers {
        outln!("  header    {k}: {v}");
    }
    outln!(
        "  payload   {} byte(s): {:?}",
        e.payload_len,
        e.payload_preview
    );
}

fn yes_no(b: bool) -> String {
    if b { "yes" } else { "no" }.to_owned()
}

/// Print `rows` under `headers` as a listing (header first, columns padded, all left-aligned).
fn table(headers: &[&str], rows: &[Vec<String>]) {
    let align = vec![Align::Left; headers.len()];
    out!("{}", table::render(Style::LISTING, headers, &align, rows));
}

fn time_or_dash(ms: Option<u64>) -> String {
    ms.map_or("-".to_owned(), format_time)
}

/// RFC 3339 with the milliseconds always shown (`YYYY-MM-DDTHH:MM:SS.mmmZ`): `time`'s `Rfc3339`
/// drops a zero fraction, which would make a column of times ragged.
const MILLIS: iso8601::EncodedConfig = iso8601::Config::DEFAULT
    .set_time_precision(iso8601::TimePrecision::Second {
        decimal_digits: NonZeroU8::new(3),
    })
    .encode();

/// Milliseconds since the epoch as `YYYY-MM-DDTHH:MM:SS.mmmZ` (past the year 9999, which no
/// record's clock gives, as the raw number).
pub(crate) fn format_time(ms: u64) -> String {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&Iso8601::<MILLIS>).ok())
        .unwrap_or_else(|| format!("{ms} ms after the epoch"))
}

/// `--time`: milliseconds since the epoch, or an RFC 3339 time (`2026-12-02T17:00:00Z`,
/// `2026-12-02T18:00:00.5+01:00`), cut to whole milliseconds like the records' timestamps.
pub(crate) fn parse_time(text: &str) -> Result<SystemTime, String> {
    let bad = || {
        format!(
            "--time {}: expected milliseconds since the UNIX epoch or an RFC 3339 time like 2026-12-02T17:00:00Z",
            tidings_log::Excerpt::of(text)
        )
    };
    if let Ok(ms) = text.parse::<u64>() {
        return UNIX_EPOCH
            .checked_add(Duration::from_millis(ms))
            .ok_or_else(bad);
    }
    let t = OffsetDateTime::parse(text, &Rfc3339).map_err(|_| bad())?;
    if t.unix_timestamp() < 0 {
        return Err(bad()); // before the epoch: no record is older
    }
    let t = t.replace_millisecond(t.millisecond()).map_err(|_| bad())?;
    Ok(t.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip() {
        let t = parse_time("2026-12-02T17:00:00.250Z").unwrap();
        let ms = t.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
        assert_eq!(ms, 1_796_230_800_250);
        assert_eq!(format_time(ms), "2026-12-02T17:00:00.250Z");
        assert_eq!(format_time(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            parse_time("1700000000000").unwrap(),
            UNIX_EPOCH + Duration::from_millis(1_700_000_000_000)
        );
        assert_eq!(format_time(951_782_400_000), "2000-02-29T00:00:00.000Z");
        // RFC 3339: an offset, a space for the `T`, more digits than milliseconds (cut).
        let at_250 = UNIX_EPOCH + Duration::from_millis(1_796_230_800_250);
        for same in [
            "2026-12-02T18:00:00.250+01:00",
            "2026-12-02 17:00:00.250Z",
            "2026-12-02T17:00:00.250999Z",
        ] {
            assert_eq!(parse_time(same).unwrap(), at_250, "{same}");
        }
    }

    #[test]
    fn bad_times_are_errors() {
        for bad in [
            "",
            "yesterday",
            "2026-02-30T00:00:00Z",
            "2026-12-02T25:00:00Z",
            "2026-12-02T17:00:00",
            "2026-12-02T17:00:00.x Z",
            "1969-12-31T23:59:59Z",
            "99999999999999999999999",
        ] {
            assert!(parse_time(bad).is_err(), "{bad:?}");
        }
    }
}
