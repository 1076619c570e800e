//! R-LIM-2: arbitrary bytes in any file a stream directory can hold (segments, index and time
//! index files, temporary files, odd names) reach `Log::open`, reads and the tools as typed
//! errors or success, never a panic. `TIDINGS_LONG=1` runs many more cases.

mod common;

use std::path::{Path, PathBuf};

use common::{DIR, fill, sim_open, small_config};
use proptest::prelude::*;
use tidings_log::testing::SimStorage;
use tidings_log::tools::{dump_with_storage, inspect_with_storage, verify_with_storage};

fn cases() -> u32 {
    if std::env::var_os("TIDINGS_LONG").is_some_and(|v| v == "1") {
        5_000
    } else {
        96
    }
}

/// What to do to one file of a healthy log.
#[derive(Debug, Clone)]
enum Damage {
    /// Replace it with these bytes.
    Replace(Vec<u8>),
    /// Overwrite bytes from a position.
    Overwrite(usize, Vec<u8>),
    /// Cut it.
    Cut(usize),
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..300).prop_map(Damage::Replace),
        (any::<usize>(), prop::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(at, b)| Damage::Overwrite(at, b)),
        any::<usize>().prop_map(Damage::Cut),
    ]
}

fn apply(sim: &SimStorage, path: &Path, d: &Damage) {
    let mut b = sim.read_file(path).unwrap_or_default();
    match d {
        Damage::Replace(n) => b = n.clone(),
        Damage::Overwrite(at, n) => {
            let at = at % (b.len() + 1);
            for (i, v) in n.iter().enumerate() {
                match b.get_mut(at + i) {
                    Some(x) => *x = *v,
                    None => b.push(*v),
                }
            }
        }
        Damage::Cut(at) => b.truncate(at % (b.len() + 1)),
    }
    sim.write_file(path, &b);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_file_contents_never_panic(
        records in 0u64..30,
        damages in prop::collection::vec((any::<prop::sample::Index>(), damage()), 1..4),
        extra in proptest::option::of(("[0-9a-z]{0,22}\\.(seg|idx|tix|tmp|x)", prop::collection::vec(any::<u8>(), 0..100))),
        verify_on_open in any::<bool>(),
    ) {
        let sim = SimStorage::new();
        let (log, _) = sim_open(&sim, small_config()).unwrap();
        fill(&log, records);
        drop(log);
        let files: Vec<PathBuf> = sim.snapshot().into_keys().collect();
        for (i, d) in &damages {
            apply(&sim, &files[i.index(files.len())], d);
        }
        if let Some((name, bytes)) = &extra {
            sim.write_file(&Path::new(DIR).join(name), bytes);
        }
        let dir = Path::new(DIR);
        // The tools first: they never modify anything, so they see the damage as it is.
        let _ = verify_with_storage(&sim, dir).map(|r| r.to_string());
        let _ = inspect_with_storage(&sim, dir).map(|r| r.to_string());
        let _ = dump_with_storage(&sim, dir, 0, 1000);
        let cfg = small_config().verify_on_open(verify_on_open);
        match sim_open(&sim, cfg) {
            Ok((log, report)) => {
                let _ = report.to_string();
                let mut next = log.start_offset();
                while let Ok(batch) = log.read(next, 100) {
                    let Some(last) = batch.last() else { break };
                    next = last.offset + 1;
                }
                let _ = log.offset_for_time(0);
                let _ = log.offset_for_time(u64::MAX);
            }
            Err(e) => {
                // A typed error naming what is wrong.
                prop_assert!(!e.to_string().is_empty());
            }
        }
    }
}
