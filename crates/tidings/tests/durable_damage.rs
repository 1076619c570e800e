//! One damaged record in a sealed segment costs only itself (R-LIM-2, R-DEL-6, R-LOG-3).
//!
//! A real data dir: messages published through a broker, the broker closed, one record of a
//! sealed segment damaged on disk (checksum, length, unknown flag, malformed body), the
//! broker opened again and a durable subscription with default options started from the
//! beginning. Every good record before the damage is delivered whatever the fetch batch,
//! the damaged one is skipped to the next readable record, counted and reported with the
//! file and offset, and every good record after it is delivered too. Manual driver: the
//! outcome is exact, nothing is timed.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use tidings::embedded::Fsync;
use tidings::embedded::{EmbeddedBackend, EmbeddedStreamOptions};
use tidings::{
    Broker, Driver, DurableSpec, ManualClock, Message, StartAt, StreamConfig, SubscribeOptions,
};

/// Messages published; with 16 KiB segments they fill several sealed segments.
const MESSAGES: u64 = 1_200;
/// The offset damaged: inside the first (sealed) segment, well before its end.
const DAMAGED: u64 = 40;

fn broker_on(dir: &Path) -> Broker {
    broker_with(
        dir,
        EmbeddedStreamOptions::new()
            .segment_bytes(16 << 10)
            .fsync(Fsync::Never),
    )
}

fn broker_with(dir: &Path, options: EmbeddedStreamOptions) -> Broker {
    let backend = EmbeddedBackend::new(dir).stream_defaults(options);
    Broker::builder()
        .durable_backend(Arc::new(backend))
        .clock(ManualClock::new())
        .driver(Driver::Manual)
        .build()
        .unwrap()
}

fn orders(b: &Broker) -> tidings::Stream {
    b.create_stream(StreamConfig::new("orders", ["orders.#"]))
        .unwrap()
}

fn first_segment(dir: &Path) -> PathBuf {
    dir.join("streams/orders/00000000000000000000.seg")
}

/// `(byte position, frame length)` of every record of a segment file, read by their length
/// prefixes (the file is intact when this runs).
fn frames(seg: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut pos = 32;
    while pos + 8 <= seg.len() {
        let body = u32::from_le_bytes(seg[pos..pos + 4].try_into().unwrap()) as usize;
        out.push((pos, 8 + body));
        pos += 8 + body;
    }
    assert_eq!(pos, seg.len(), "the segment ends with a whole record");
    out
}

/// Recomputes the CRC-32C of the frame at `pos` (length prefix, then body), so that only
/// the structural check can find the damage.
fn fix_crc(seg: &mut [u8], pos: usize, len: usize) {
    let mut crc = crc32c::crc32c(&seg[pos..pos + 4]);
    crc = crc32c::crc32c_append(crc, &seg[pos + 8..pos + len]);
    seg[pos + 4..pos + 8].copy_from_slice(&crc.to_le_bytes());
}

#[derive(Debug, Clone, Copy)]
enum Damage {
    /// One bit of the stored checksum flipped.
    Checksum,
    /// The length prefix claims 5 bytes more than the record has (in range, wrong).
    LengthInRange,
    /// The length prefix is beyond the format's limit.
    LengthOutOfRange,
    /// A flag bit this format does not know, with a checksum that matches.
    UnknownFlag,
    /// A header count that cannot fit in the body, with a checksum that matches.
    MalformedBody,
}

const ALL: [Damage; 5] = [
    Damage::Checksum,
    Damage::LengthInRange,
    Damage::LengthOutOfRange,
    Damage::UnknownFlag,
    Damage::MalformedBody,
];

fn damage(path: &Path, offset: u64, how: Damage) -> u64 {
    let mut seg = std::fs::read(path).unwrap();
    let all = frames(&seg);
    assert!(
        all.len() as u64 > offset + 10,
        "the segment holds records after the damaged one ({} records)",
        all.len()
    );
    let (pos, len) = all[offset as usize];
    assert_eq!(
        u64::from_le_bytes(seg[pos + 8..pos + 16].try_into().unwrap()),
        offset
    );
    match how {
        Damage::Checksum => seg[pos + 5] ^= 0x10,
        Damage::LengthInRange => {
            let body = (len - 8 + 5) as u32;
            seg[pos..pos + 4].copy_from_slice(&body.to_le_bytes());
        }
        Damage::LengthOutOfRange => seg[pos..pos + 4].copy_from_slice(&u32::MAX.to_le_bytes()),
        Damage::UnknownFlag => {
            seg[pos + 8 + 16] |= 0x04;
            fix_crc(&mut seg, pos, len);
        }
        Damage::MalformedBody => {
            // No key in these records: the header count follows the flags byte.
            assert_eq!(seg[pos + 8 + 16], 0);
            seg[pos + 8 + 17..pos + 8 + 21].copy_from_slice(&u32::MAX.to_le_bytes());
            fix_crc(&mut seg, pos, len);
        }
    }
    std::fs::write(path, &seg).unwrap();
    all.len() as u64
}

/// Publishes [`MESSAGES`] messages, closes the broker, damages the record at [`DAMAGED`] in
/// the first (sealed) segment.
fn damaged_data_dir(how: Damage) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let b = broker_on(dir.path());
    let s = orders(&b);
    for i in 0..MESSAGES {
        b.publish(Message::to("orders.created").payload(format!("{i:06}")))
            .unwrap();
    }
    assert_eq!(s.end_offset(), MESSAGES);
    b.close(std::time::Duration::from_secs(5));
    drop(b);
    let in_first = damage(&first_segment(dir.path()), DAMAGED, how);
    assert!(in_first < MESSAGES, "the first segment is sealed");
    dir
}

type Seen = Arc<Mutex<Vec<u64>>>;

/// The offsets a handler saw, and the handler.
fn offsets_seen() -> (Seen, impl Fn(&Message) -> Result<(), tidings::HandlerError>) {
    let seen = Seen::default();
    let s = seen.clone();
    (seen, move |m: &Message| {
        s.lock()
            .push(m.offset().expect("a stream message has an offset"));
        Ok(())
    })
}

#[test]
fn good_records_before_a_damaged_one_are_delivered_with_default_options() {
    for how in ALL {
        let dir = damaged_data_dir(how);
        let b = broker_on(dir.path());
        orders(&b);
        let (seen, handler) = offsets_seen();
        let d = b
            .subscribe(
                DurableSpec::new("orders")
                    .name("audit")
                    .start(StartAt::Earliest),
                SubscribeOptions::default(),
                handler,
            )
            .unwrap();
        b.run_until_idle();
        let seen = seen.lock().clone();
        // R-LIM-2, R-DEL-6: the damage costs only itself. Every good record before it
        // is delivered (the fetch batch is not all-or-nothing) ...
        let before: Vec<u64> = (0..DAMAGED).collect();
        assert_eq!(
            seen.iter()
                .copied()
                .take_while(|&o| o < DAMAGED)
                .collect::<Vec<_>>(),
            before,
            "{how:?}: the good records before the damaged one"
        );
        // ... the damaged one is skipped to the next readable record, and every good
        // record after it is delivered, in order ...
        let expected: Vec<u64> = (0..MESSAGES).filter(|&o| o != DAMAGED).collect();
        assert_eq!(seen, expected, "{how:?}: everything but the damaged record");
        // ... and the skip is counted and says which offset, which file, which byte
        // (R-DEL-6: nothing lost silently).
        let st = d.state();
        assert_eq!(d.unreadable(), 1, "{how:?}");
        let why = st.unreadable_reason.clone().unwrap_or_default();
        assert!(
            why.contains(&format!("offsets {DAMAGED}..{}", DAMAGED + 1))
                && why.contains("00000000000000000000.seg")
                && why.contains(&format!("offset {DAMAGED}")),
            "{how:?}: {why}"
        );
        assert_eq!(st.error, None, "{how:?}: the subscription goes on");
        assert_eq!(d.stats().delivered, MESSAGES - 1, "{how:?}");
        // The position went past it: committed, so a restart does not stop there again.
        assert_eq!(d.commit().unwrap(), MESSAGES, "{how:?}");
        drop(d);
        b.close(std::time::Duration::from_secs(5));
    }
}

#[test]
fn a_damaged_record_with_nothing_readable_after_it_halts_there_naming_file_and_offset() {
    // One active segment, every record on disk before `publish` returns; then the last
    // record rots while the broker runs. Nothing readable follows it: the format cannot
    // resync, so the subscription stops at exactly that offset (R-LIM-2).
    let dir = tempfile::tempdir().unwrap();
    let b = broker_with(
        dir.path(),
        EmbeddedStreamOptions::new().fsync(Fsync::Always),
    );
    orders(&b);
    for i in 0..10 {
        b.publish(Message::to("orders.created").payload(format!("{i:06}")))
            .unwrap();
    }
    let path = first_segment(dir.path());
    let bytes = std::fs::read(&path).unwrap();
    let (pos, _) = frames(&bytes)[9];
    flip_byte(&path, pos + 5);
    let (seen, handler) = offsets_seen();
    let d = b
        .subscribe(
            DurableSpec::new("orders")
                .name("audit")
                .start(StartAt::Earliest),
            SubscribeOptions::default(),
            handler,
        )
        .unwrap();
    b.run_until_idle();
    // Every good record before it is delivered ...
    assert_eq!(*seen.lock(), (0..9).collect::<Vec<u64>>());
    // ... and the halt names the file, the byte and the offset; nothing was skipped.
    let error = d.error().expect("R-LIM-2: halted with a reason");
    assert!(
        error.contains(&path.display().to_string())
            && error.contains("offset 9")
            && error.contains(&format!("byte {pos}")),
        "{error}"
    );
    assert_eq!((d.position(), d.unreadable()), (9, 0));
    assert_eq!(
        d.commit().unwrap(),
        9,
        "R-LOG-3: committed up to the damage, not past it"
    );
    // It stays there (nothing is skipped silently) until the operator moves it.
    for i in 10..12 {
        b.publish(Message::to("orders.created").payload(format!("{i:06}")))
            .unwrap();
    }
    b.run_until_idle();
    assert_eq!(seen.lock().len(), 9);
    assert_eq!(d.seek(StartAt::Offset(10)).unwrap(), 10);
    b.run_until_idle();
    assert_eq!(seen.lock()[9..], [10, 11]);
    assert_eq!(d.error(), None, "a seek clears the halt");
    drop(d);
    b.close(std::time::Duration::from_secs(5));
}

/// Flips one byte of a file in place (the log keeps its handle open).
fn flip_byte(path: &Path, at: usize) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at as u64).unwrap();
    b[0] ^= 0x10;
    f.write_all_at(&b, at as u64).unwrap();
}

#[test]
fn a_damaged_meta_files_long_line_is_quoted_bounded() {
    // R-SEC-2, R-LIM-2: a stream's META file with a 68,953-byte line is refused naming the
    // file; the message quotes at most 64 bytes of the line and says how long it was.
    let dir = tempfile::tempdir().unwrap();
    let b = broker_on(dir.path());
    orders(&b);
    b.close(std::time::Duration::from_secs(5));
    drop(b);
    let meta = dir.path().join("streams/orders/META");
    let mut text = std::fs::read_to_string(&meta).unwrap();
    text.push_str("pattern");
    text.push_str(&"z".repeat(68_953 - "pattern".len()));
    text.push('\n');
    std::fs::write(&meta, text).unwrap();
    let b = broker_on(dir.path());
    let err = b
        .create_stream(StreamConfig::new("orders", ["orders.#"]))
        .unwrap_err();
    let message = err.to_string();
    assert_eq!(err.kind(), tidings::StreamErrorKind::Corrupt, "{message}");
    assert!(message.contains(&meta.display().to_string()), "{message}");
    assert!(message.contains("… (68953 bytes)"), "{message}");
    assert!(message.len() < 400, "{} bytes: {message}", message.len());
}
