//! Property test: random append / read / time lookup / sync / reopen / power-cut sequences agree
//! with a `Vec` model (R-LOG-1, R-LOG-4; power cuts under `Always`: R-LOG-2).

mod common;

use common::sim_open;
use proptest::prelude::*;
use tidings_log::testing::{CrashMode, SimStorage};
use tidings_log::{Fsync, LogConfig, Record};

#[derive(Debug, Clone)]
enum Op {
    Append(Vec<(u64, usize, bool)>),
    Read(usize, usize),
    Time(u64),
    Sync,
    Reopen,
    PowerCut,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => prop::collection::vec((0u64..200, 0usize..300, any::<bool>()), 1..5).prop_map(Op::Append),
        3 => (0usize..1000, 0usize..20).prop_map(|(a, b)| Op::Read(a, b)),
        2 => (0u64..220).prop_map(Op::Time),
        1 => Just(Op::Sync),
        1 => Just(Op::Reopen),
        1 => Just(Op::PowerCut),
    ]
}

fn make(ts: u64, len: usize, key: bool, n: usize) -> Record {
    let mut r = Record::new(ts, vec![(n % 251) as u8; len]).with_header("n", n.to_string());
    if key {
        r = r.with_key(format!("k{n}"));
    }
    r
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn log_agrees_with_vec_model(
        ops in prop::collection::vec(op(), 1..40),
        segment_bytes in 128u64..2048,
        interval in 1u32..512,
        always in any::<bool>(),
        buffer in prop_oneof![Just(0usize), Just(100), Just(1 << 16)],
    ) {
        let cfg = LogConfig::new().segment_bytes(segment_bytes).index_interval_bytes(interval).fsync(if always { Fsync::Always } else { Fsync::Never }).write_buffer_bytes(buffer);
        let sim = SimStorage::new();
        let mut log = sim_open(&sim, cfg.clone()).unwrap().0;
        let mut model: Vec<Record> = Vec::new();
        for op in ops {
            match op {
                Op::Append(recs) => {
                    let recs: Vec<Record> = recs.iter().enumerate().map(|(i, &(t, l, k))| make(t, l, k, model.len() + i)).collect();
                    if recs.len() == 1 {
                        prop_assert_eq!(log.append(&recs[0]).unwrap(), model.len() as u64);
                    } else {
                        let r = log.append_batch(&recs).unwrap();
                        prop_assert_eq!(r, model.len() as u64..(model.len() + recs.len()) as u64);
                    }
                    model.extend(recs);
                }
                Op::Read(from, max) => {
                    let from = from % (model.len() + 1);
                    let got = log.read(from as u64, max).unwrap();
                    let want = &model[from..(from + max).min(model.len())];
                    prop_assert_eq!(got.len(), want.len());
                    for (i, (g, w)) in got.iter().zip(want).enumerate() {
                        prop_assert_eq!(g.offset, (from + i) as u64);
                        prop_assert_eq!(&g.to_record(), w);
                    }
                }
                Op::Time(t) => {
                    let want = model.iter().position(|r| r.timestamp_ms >= t).unwrap_or(model.len());
                    prop_assert_eq!(log.offset_for_time(t).unwrap(), want as u64);
                }
                Op::Sync => {
                    log.sync().unwrap();
                    prop_assert_eq!(log.durable_offset(), model.len() as u64);
                }
                Op::Reopen => {
                    drop(log);
                    log = sim_open(&sim, cfg.clone()).unwrap().0;
                }
                Op::PowerCut => {
                    if !always {
                        log.sync().unwrap();
                    }
                    sim.power_cut(CrashMode::RandomPrefix { seed: model.len() as u64 });
                    drop(log);
                    log = sim_open(&sim, cfg.clone()).unwrap().0;
                }
            }
            prop_assert_eq!(log.end_offset(), model.len() as u64);
            prop_assert_eq!(log.start_offset(), 0);
        }
    }
}
