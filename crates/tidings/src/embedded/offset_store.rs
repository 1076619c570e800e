//! The committed-position store of one durable subscription (R-LOG-3).
//!
//! `<data_dir>/consumers/<stream>/<name>.offset` holds one line, `tidings-offset 1 <N>\n`,
//! where `N` is the next offset to consume (everything below it finished). It is replaced
//! atomically: write `<name>.offset.tmp`, fsync it, rename over the old file, fsync the
//! directory. A crash leaves either the old or the new file, never a mix; a stale `.tmp` is
//! ignored and overwritten. Every file operation goes through the broker's
//! [`Storage`](tidings_log::Storage), so fault injection reaches it.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tidings_log::Storage;
use tidings_log::storage::OpenMode;

use crate::durable::StreamError;

const MAGIC: &str = "tidings-offset 1 ";

#[derive(Debug)]
pub(crate) struct OffsetStore {
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    path: PathBuf,
    tmp: PathBuf,
}

/// fsync a directory so creations and renames in it are durable.
pub(crate) fn sync_dir(storage: &dyn Storage, dir: &Path) -> Result<(), StreamError> {
    storage.sync_dir(dir).map_err(|e| StreamError::io(dir, e))
}

/// Create `dir` and its parents, then fsync it and its parent (so the names are durable).
pub(crate) fn ensure_dir(storage: &dyn Storage, dir: &Path) -> Result<(), StreamError> {
    storage
        .create_dir_all(dir)
        .map_err(|e| StreamError::io(dir, e))?;
    sync_dir(storage, dir)?;
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        sync_dir(storage, parent)?;
    }
    Ok(())
}

/// Longest offset file read (the real ones are one short line).
const MAX_OFFSET_FILE: u64 = 4096;

/// Read a whole small file; `None` when it does not exist, `Some(Err(len))` when it is
/// longer than [`MAX_OFFSET_FILE`] (never read into memory).
fn read_all(storage: &dyn Storage, path: &Path) -> io::Result<Option<Result<Vec<u8>, u64>>> {
    read_small(storage, path, MAX_OFFSET_FILE)
}

/// Read a whole file of at most `max` bytes; `None` when it does not exist, `Some(Err(len))`
/// when it is longer (never read into memory).
pub(crate) fn read_small(
    storage: &dyn Storage,
    path: &Path,
    max: u64,
) -> io::Result<Option<Result<Vec<u8>, u64>>> {
    let file = match storage.open(path, OpenMode::Read) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let len = file.len()?;
    if len > max {
        return Ok(Some(Err(len)));
    }
    let mut buf = vec![0; len as usize];
    let mut at = 0;
    while at < buf.len() {
        match file.read_at(&mut buf[at..], at as u64)? {
            0 => break,
            n => at += n,
        }
    }
    buf.truncate(at);
    Ok(Some(Ok(buf)))
}

/// Parse the contents of an offset file: exactly `tidings-offset 1 <N>\n`, `N` decimal.
pub(crate) fn parse(bytes: &[u8]) -> Result<u64, &'static str> {
    let text = std::str::from_utf8(bytes).map_err(|_| "not UTF-8")?;
    let rest = text
        .strip_prefix(MAGIC)
        .ok_or("missing `tidings-offset 1` header")?;
    let digits = rest.strip_suffix('\n').ok_or("missing final newline")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err("offset is not a decimal number");
    }
    digits
        .parse::<u64>()
        .map_err(|_| "offset does not fit in 64 bits")
}

/// Durably replace `path` (in `dir`) with `bytes`: write `tmp`, fsync it, rename it over
/// `path`, fsync `dir`. A crash leaves the old or the new file, never a mix.
pub(crate) fn replace_file(
    storage: &dyn Storage,
    dir: &Path,
    (path, tmp): (&Path, &Path),
    bytes: &[u8],
) -> Result<(), StreamError> {
    let tmp_err = |e| StreamError::io(tmp, e);
    let f = storage.create(tmp).map_err(tmp_err)?;
    let mut at = 0;
    while at < bytes.len() {
        match f.write_at(&bytes[at..], at as u64).map_err(tmp_err)? {
            0 => return Err(tmp_err(io::ErrorKind::WriteZero.into())),
            n => at += n,
        }
    }
    f.sync_data().map_err(tmp_err)?;
    drop(f);
    storage
        .rename(tmp, path)
        .map_err(|e| StreamError::io(path, e))?;
    sync_dir(storage, dir)
}

impl OffsetStore {
    pub(crate) fn new(storage: Arc<dyn Storage>, dir: &Path, name: &str) -> Self {
        Self {
            storage,
            dir: dir.to_path_buf(),
            path: dir.join(format!("{name}.offset")),
            tmp: dir.join(format!("{name}.offset.tmp")),
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The committed position, `None` when nothing was ever committed.
    pub(crate) fn load(&self) -> Result<Option<u64>, StreamError> {
        let Some(bytes) =
            read_all(&*self.storage, &self.path).map_err(|e| StreamError::io(&self.path, e))?
        else {
            return Ok(None);
        };
        let bad = |reason: String| StreamError::BadOffsetFile {
            path: self.path.clone(),
            reason,
        };
        let bytes = bytes.map_err(|len| bad(format!("{len} bytes long, not one short line")))?;
        parse(&bytes)
            .map(Some)
            .map_err(|reason| bad(reason.to_owned()))
    }

    /// Durably replace the committed position with `offset`.
    pub(crate) fn store(&self, offset: u64) -> Result<(), StreamError> {
        let line = format!("{MAGIC}{offset}\n");
        replace_file(
            &*self.storage,
            &self.dir,
            (&self.path, &self.tmp),
            line.as_bytes(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_load_and_foreign_file() {
        let dir = tempfile::tempdir().unwrap();
        let s = OffsetStore::new(Arc::new(tidings_log::FsStorage), dir.path(), "billing");
        assert_eq!(s.load().unwrap(), None);
        s.store(42).unwrap();
        assert_eq!(s.load().unwrap(), Some(42));
        s.store(7).unwrap();
        assert_eq!(s.load().unwrap(), Some(7));
        // R-LIM-2: a foreign file is a typed error naming the path.
        std::fs::write(s.path(), "hello").unwrap();
        let e = s.load().unwrap_err();
        assert!(
            matches!(&e, StreamError::BadOffsetFile { path, .. } if path == s.path()),
            "{e:?}"
        );
        assert_eq!(e.kind(), crate::StreamErrorKind::Corrupt);
    }

    #[test]
    fn parse_is_strict() {
        assert_eq!(parse(b"tidings-offset 1 40\n"), Ok(40));
        // R-LIM-2: anything but the exact shape is a typed error.
        for bad in [
            &b"tidings-offset 1 +40\n"[..],
            b"tidings-offset 1 \n",
            b"tidings-offset 1 40",
            b"tidings-offset 1 99999999999999999999\n",
            b"tidings-offset 2 40\n",
            b"\xff",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    fn cases() -> u32 {
        if std::env::var_os("TIDINGS_LONG").is_some() {
            200_000
        } else {
            512
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(cases()))]

        /// R-LIM-2: arbitrary offset-file bytes parse or fail with a typed error, never panic.
        #[test]
        fn arbitrary_offset_files_never_panic(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40),
            tail in "[0-9+\\- \n]{0,24}",
        ) {
            let _ = parse(&bytes);
            let _ = parse(format!("{MAGIC}{tail}").as_bytes());
        }

        /// Every position written reads back.
        #[test]
        fn written_positions_parse_back(n in proptest::prelude::any::<u64>()) {
            proptest::prop_assert_eq!(parse(format!("{MAGIC}{n}\n").as_bytes()), Ok(n));
        }
    }
}
