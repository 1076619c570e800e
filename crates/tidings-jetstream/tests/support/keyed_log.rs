//! The shared handler log of keyed-group tests across processes (R-DIST-6, R-DIST-8), and
//! its checker: every handler start, success and failure is one line, one `write(2)` on
//! one `O_APPEND` file all processes share, so the kernel orders them all, without clocks.
//! Lines are `S|D|F <process> k<key>:<seq>`.
//!
//! The checker reads the log with marks of what happened to a process at a line (killed,
//! stopped or cut off, back) and reports, per key: overlaps (two handlers of one key
//! running at once), starts before every earlier message of the key succeeded, first
//! starts out of publish order, stale starts (a process that was away starting a message
//! of a key a later message of which already succeeded), and messages never handled.
//!
//! The same checker as `tests/keyed_group.rs`'s, with one mark more ([`Mark::CutOff`]: a
//! process partitioned from the server runs on, so it gets no grace).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use tidings_testkit::child;

/// Handler calls each worker runs at once (`Concurrency::PerKey { max_in_flight }`): the
/// grace a resumed process gets (starts its gate admitted before it stopped).
pub const SLOTS: usize = 16;

/// One line of the shared log.
#[derive(Debug, Clone)]
pub struct Line {
    /// `S` start, `D` success, `F` failure.
    pub kind: char,
    /// The process.
    pub who: String,
    /// The key (`k<n>`).
    pub key: String,
    /// The message's sequence number within its key.
    pub seq: u32,
}

/// The complete lines of the shared log at `path`.
pub fn read_log(path: &Path) -> Vec<Line> {
    child::complete_lines(path)
        .iter()
        .map(|l| {
            let mut words = l.split(' ');
            let kind = words.next().and_then(|w| w.chars().next()).expect("kind");
            let who = words.next().expect("who").to_owned();
            let (key, seq) = words
                .next()
                .and_then(|w| w.split_once(':'))
                .expect("key:seq");
            Line {
                kind,
                who,
                key: key.to_owned(),
                seq: seq.parse().expect("seq"),
            }
        })
        .collect()
}

/// How many successes (`D` lines) the log holds.
pub fn successes(path: &Path) -> usize {
    child::complete_lines(path)
        .iter()
        .filter(|l| l.starts_with('D'))
        .count()
}

/// Something that happened to a process, at a line of the log.
#[derive(Debug, Clone)]
pub enum Mark {
    /// It was SIGKILLed: its running handlers never end.
    Killed(String),
    /// It was stopped: a handler it was running then may still end after the resume (the
    /// documented overlap).
    Paused(String),
    /// It was resumed: from here on it must start nothing stale.
    Resumed(String),
    /// It was cut off from the server (it runs on): from here on it must start nothing
    /// stale, with no grace — nothing stopped it mid-admission.
    CutOff(String),
}

/// What the log showed.
#[derive(Debug, Default)]
pub struct Verdict {
    pub overlaps: Vec<String>,
    pub early_starts: Vec<String>,
    pub first_start_order: Vec<String>,
    pub stale_after_resume: Vec<String>,
    pub missing: Vec<String>,
    pub duplicates: usize,
    pub excused: usize,
    pub excused_starts: usize,
}

impl Verdict {
    /// No violation of any kind.
    pub fn clean(&self) -> bool {
        self.overlaps.is_empty()
            && self.early_starts.is_empty()
            && self.first_start_order.is_empty()
            && self.stale_after_resume.is_empty()
            && self.missing.is_empty()
    }
}

/// Checks the log (see the module docs); `marks` are (line index, mark).
pub fn check(lines: &[Line], marks: &[(usize, Mark)], keys: u32, per_key: u32) -> Verdict {
    let mut v = Verdict::default();
    // Per key: the running handler (who, seq), the succeeded seqs, the highest succeeded.
    let mut running: HashMap<&str, (String, u32, usize)> = HashMap::new();
    let mut done: HashMap<&str, BTreeSet<u32>> = HashMap::new();
    let mut first_started: HashMap<&str, u32> = HashMap::new();
    let mut succeeded: HashMap<(&str, u32), u32> = HashMap::new();
    let mut resumed: BTreeSet<String> = BTreeSet::new();
    let mut excused: BTreeSet<(String, String, u32)> = BTreeSet::new();
    let mut grace: Option<(String, usize)> = None;
    let mut marks = marks.iter().peekable();
    for (i, l) in lines.iter().enumerate() {
        while let Some((at, mark)) = marks.next_if(|(at, _)| *at <= i) {
            let _ = at;
            match mark {
                Mark::Killed(who) | Mark::Paused(who) => {
                    // Its running handlers: never ending (killed) or ending late (paused,
                    // the documented overlap).
                    running.retain(|key, (w, seq, _)| {
                        if w == who {
                            excused.insert((w.clone(), (*key).to_owned(), *seq));
                            false
                        } else {
                            true
                        }
                    });
                }
                Mark::Resumed(who) => {
                    resumed.insert(who.clone());
                    grace = Some((who.clone(), SLOTS));
                }
                Mark::CutOff(who) => {
                    resumed.insert(who.clone());
                }
            }
        }
        let key = l.key.as_str();
        // A start the resumed process's gate admitted before it stopped (the documented
        // overlap): one per dispatcher slot at most, so among its first `SLOTS` starts
        // after the resume.
        if let Some((who, left)) = &mut grace
            && *who == l.who
            && l.kind == 'S'
        {
            *left -= 1;
            if *left == 0 {
                grace = None;
            }
            let stale = running.contains_key(key)
                || done
                    .get(key)
                    .is_some_and(|d| d.range(l.seq..).next().is_some());
            if stale {
                excused.insert((l.who.clone(), key.to_owned(), l.seq));
                v.excused_starts += 1;
                continue;
            }
        }
        match l.kind {
            'S' => {
                if let Some((w, seq, since)) = running.get(key) {
                    v.overlaps.push(format!(
                        "line {i}: {} starts {key}:{} while {w} runs {key}:{seq} (started at \
                         line {since})",
                        l.who, l.seq
                    ));
                }
                running.insert(key, (l.who.clone(), l.seq, i));
                let ok = done.get(key);
                let missing_before = (0..l.seq).find(|m| !ok.is_some_and(|d| d.contains(m)));
                if let Some(m) = missing_before {
                    v.early_starts.push(format!(
                        "line {i}: {} starts {key}:{} before {key}:{m} succeeded",
                        l.who, l.seq
                    ));
                }
                match first_started.get(key) {
                    None if l.seq != 0 => v
                        .first_start_order
                        .push(format!("line {i}: the first start of {key} is {}", l.seq)),
                    None => {
                        first_started.insert(key, 0);
                    }
                    Some(highest) if l.seq > *highest => {
                        if l.seq != highest + 1 {
                            v.first_start_order.push(format!(
                                "line {i}: {key}:{} first started after {key}:{highest}",
                                l.seq
                            ));
                        }
                        first_started.insert(key, l.seq);
                    }
                    Some(_) => {}
                }
                if resumed.contains(&l.who)
                    && ok.is_some_and(|d| d.range(l.seq + 1..).next().is_some())
                {
                    v.stale_after_resume.push(format!(
                        "line {i}: resumed {} starts {key}:{} after a later one succeeded",
                        l.who, l.seq
                    ));
                }
            }
            'D' | 'F' => {
                let ends_running = running
                    .get(key)
                    .is_some_and(|(w, seq, _)| *w == l.who && *seq == l.seq);
                if ends_running {
                    running.remove(key);
                } else if excused.contains(&(l.who.clone(), key.to_owned(), l.seq)) {
                    v.excused += 1;
                }
                if l.kind == 'D' {
                    done.entry(key).or_default().insert(l.seq);
                    *succeeded.entry((key, l.seq)).or_insert(0) += 1;
                }
            }
            other => panic!("unknown line kind {other}"),
        }
    }
    for key in 0..keys {
        for seq in 0..per_key {
            let k = format!("k{key}");
            match succeeded.get(&(k.as_str(), seq)) {
                None => v.missing.push(format!("{k}:{seq}")),
                Some(n) => v.duplicates += (*n as usize).saturating_sub(1),
            }
        }
    }
    v
}

/// Which process started each key's messages in `lines`, as counts of keys per process
/// (a key counted for the process that started most of its messages there).
pub fn spread(lines: &[Line]) -> BTreeMap<String, usize> {
    let mut per_key: HashMap<&str, HashMap<&str, usize>> = HashMap::new();
    for l in lines.iter().filter(|l| l.kind == 'S') {
        *per_key
            .entry(&l.key)
            .or_default()
            .entry(&l.who)
            .or_insert(0) += 1;
    }
    let mut out = BTreeMap::new();
    for starts in per_key.values() {
        if let Some((who, _)) = starts.iter().max_by_key(|(w, n)| (**n, **w)) {
            *out.entry((*who).to_owned()).or_insert(0) += 1;
        }
    }
    out
}

/// Prints the verdict's counts and the first violations of each kind.
pub fn report(
    name: &str,
    v: &Verdict,
    before: &BTreeMap<String, usize>,
    after: &BTreeMap<String, usize>,
) {
    eprintln!(
        "{name}: {} overlaps, {} early starts, {} first-start order violations, {} stale \
         starts after a resume, {} missing; {} duplicates, {} excused late ends, {} excused \
         starts admitted before a stop; keys before {before:?}, after {after:?}",
        v.overlaps.len(),
        v.early_starts.len(),
        v.first_start_order.len(),
        v.stale_after_resume.len(),
        v.missing.len(),
        v.duplicates,
        v.excused,
        v.excused_starts,
    );
    for what in [
        &v.overlaps,
        &v.early_starts,
        &v.first_start_order,
        &v.stale_after_resume,
        &v.missing,
    ] {
        for line in what.iter().take(5) {
            eprintln!("  {line}");
        }
    }
}
