//! A `nats-server` version and the oldest one this crate accepts (below the error types,
//! which name it).

use std::fmt;

/// The oldest server this crate accepts: 2.10 brought `filter_subjects` (several filters per
/// consumer), which the pattern mapping needs.
pub const MIN_SERVER_VERSION: ServerVersion = ServerVersion {
    major: 2,
    minor: 10,
    patch: 0,
};

/// A `nats-server` version, `major.minor.patch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServerVersion {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
    /// Patch version.
    pub patch: u32,
}

impl ServerVersion {
    /// Parses a version as a server reports it (`2.15.1`, `v2.10.3`, `2.11.0-beta.2`); a
    /// missing patch counts as 0. `None` when the major or minor part is not a number.
    ///
    /// A pre-release or build suffix is ignored: `2.10.0-beta.1` is `2.10.0`.
    ///
    /// **Waits:** never.
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        // Hand-written on purpose, not the `semver` crate, which does something else:
        // * it refuses what servers print: `v2.10.3` (nats-server's own `--version` output
        //   has the `v`) and `2.10` (no patch);
        // * it orders `2.10.0-beta.1` below `2.10.0`, as SemVer says, so a server built
        //   from a 2.10 pre-release — which has `filter_subjects`, the one thing the
        //   version check is for — would be refused as "older than 2.10.0";
        // * it would be a new crate in every user's build for these dozen lines, while
        //   the check needs only (major, minor, patch) compared as numbers.
        let s = s.trim().trim_start_matches('v');
        let mut parts = s.splitn(3, '.');
        let mut number = |required: bool| -> Option<u32> {
            match parts.next() {
                Some(p) => {
                    let digits: String = p.chars().take_while(char::is_ascii_digit).collect();
                    digits.parse().ok()
                }
                None if required => None,
                None => Some(0),
            }
        };
        Some(Self {
            major: number(true)?,
            minor: number(true)?,
            patch: number(false)?,
        })
    }
}

impl fmt::Display for ServerVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}
