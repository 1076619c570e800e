//! The committed-position store of one durable subscription (R-LOG-3).
//!
//! `<data_dir>/consumers/<stream>/<name>.offset` holds one line, `tidings-offset 1 <N>\n`,
//! where `N` is the next offset to consume (everything below it finished). It is replaced
//! atomically: write `<name>.offset.tmp`, fsync it, rename over the old file, fsync the
//! directory. A crash leaves either the old or the new file, never a mix; a stale `.tmp` is
//! ignored and overwritten.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use super::error::StreamError;

const MAGIC: &str = "tidings-offset 1 ";

#[derive(Debug)]
pub(crate) struct OffsetStore {
    dir: PathBuf,
    path: PathBuf,
    tmp: PathBuf,
}

/// fsync a directory so creations and renames in it are durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), StreamError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| StreamError::io(dir, e))
}

/// `create_dir_all`, then fsync the new directory and its parent.
pub(crate) fn ensure_dir(dir: &Path) -> Result<(), StreamError> {
    if dir.is_dir() {
        return Ok(());
    }
    fs::create_dir_all(dir).map_err(|e| StreamError::io(dir, e))?;
    sync_dir(dir)?;
    if let Some(parent) = dir.parent() {
        sync_dir(parent)?;
    }
    Ok(())
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

impl OffsetStore {
    pub(crate) fn new(dir: &Path, name: &str) -> Self {
        Self {
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
        let bytes = match fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(StreamError::io(&self.path, e)),
        };
        parse(&bytes)
            .map(Some)
            .map_err(|reason| StreamError::BadOffsetFile {
                path: self.path.clone(),
                reason: reason.to_owned(),
            })
    }

    /// Durably replace the committed position with `offset`.
    pub(crate) fn store(&self, offset: u64) -> Result<(), StreamError> {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&self.tmp)
            .map_err(|e| StreamError::io(&self.tmp, e))?;
        f.write_all(format!("{MAGIC}{offset}\n").as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(|e| StreamError::io(&self.tmp, e))?;
        drop(f);
        fs::rename(&self.tmp, &self.path).map_err(|e| StreamError::io(&self.path, e))?;
        sync_dir(&self.dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_load_and_foreign_file() {
        let dir = tempfile::tempdir().unwrap();
        let s = OffsetStore::new(dir.path(), "billing");
        assert_eq!(s.load().unwrap(), None);
        s.store(42).unwrap();
        assert_eq!(s.load().unwrap(), Some(42));
        s.store(7).unwrap();
        assert_eq!(s.load().unwrap(), Some(7));
        // R-LIM-2: a foreign file is a typed error naming the path.
        fs::write(s.path(), "hello").unwrap();
        let e = s.load().unwrap_err().to_string();
        assert!(e.contains("billing.offset"), "{e}");
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
