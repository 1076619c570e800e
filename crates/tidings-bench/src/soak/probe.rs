//! What the soak samples: resident memory, threads and open file descriptors of a process
//! (from `/proc/<pid>/status` and `/proc/<pid>/fd`), and the JetStream server's streams,
//! consumers and key-value buckets (from its JetStream API, `$JS.API.INFO` and
//! `$JS.API.STREAM.NAMES`; a bucket is a stream named `KV_<bucket>`).

use std::fs;
use std::time::Duration;

/// One process's footprint.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Footprint {
    /// Resident set size, MiB.
    pub rss_mib: f64,
    pub threads: f64,
    pub fds: f64,
}

impl Footprint {
    /// The footprint of `pid`, `None` when it is gone (or `/proc` is not there).
    pub(crate) fn of(pid: u32) -> Option<Self> {
        let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let field = |name: &str| -> Option<f64> {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        };
        let rss_kib = field("VmRSS:")?;
        let threads = field("Threads:")?;
        let fds = fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as f64;
        Some(Self {
            rss_mib: rss_kib / 1024.0,
            threads,
            fds,
        })
    }

    /// The sum over processes (the children of one role).
    pub(crate) fn sum(all: impl IntoIterator<Item = Self>) -> Self {
        all.into_iter().fold(Self::default(), |a, b| Self {
            rss_mib: a.rss_mib + b.rss_mib,
            threads: a.threads + b.threads,
            fds: a.fds + b.fds,
        })
    }
}

/// The pid of a child of `parent` whose command name is `comm` (the `nats-server` the
/// testkit started for us), if there is one.
pub(crate) fn child_named(parent: u32, comm: &str) -> Option<u32> {
    for entry in fs::read_dir("/proc").ok()?.filter_map(Result::ok) {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // `pid (comm) state ppid ...`; comm may hold spaces and parentheses, so split at
        // the last `)`.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let name = &stat[open + 1..close];
        let ppid = stat[close + 1..]
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse::<u32>().ok());
        if name == comm && ppid == Some(parent) {
            return Some(pid);
        }
    }
    None
}

/// The server-side objects JetStream holds for the account.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct ServerObjects {
    /// Streams that are not key-value buckets.
    pub streams: f64,
    pub consumers: f64,
    /// Key-value buckets (streams named `KV_…`).
    pub buckets: f64,
}

/// Asks a server for its object counts over a client connection of its own.
pub(crate) struct ServerProbe {
    runtime: tokio::runtime::Runtime,
    client: async_nats::Client,
}

const API_TIMEOUT: Duration = Duration::from_secs(5);

impl ServerProbe {
    pub(crate) fn connect(url: &str) -> Result<Self, String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("a runtime for the server probe: {e}"))?;
        let client = runtime
            .block_on(
                async_nats::ConnectOptions::new()
                    .name("tidings-soak-probe")
                    .connect(url),
            )
            .map_err(|e| format!("connecting the server probe to {url}: {e}"))?;
        Ok(Self { runtime, client })
    }

    fn api(&self, subject: &str, body: &'static str) -> Result<serde_json::Value, String> {
        let reply = self
            .runtime
            .block_on(async {
                tokio::time::timeout(
                    API_TIMEOUT,
                    self.client.request(subject.to_owned(), body.into()),
                )
                .await
            })
            .map_err(|_| format!("{subject}: no answer within {API_TIMEOUT:?}"))?
            .map_err(|e| format!("{subject}: {e}"))?;
        let value: serde_json::Value = serde_json::from_slice(&reply.payload)
            .map_err(|e| format!("{subject}: not JSON: {e}"))?;
        if let Some(err) = value.get("error") {
            return Err(format!("{subject}: {err}"));
        }
        Ok(value)
    }

    /// The counts now.
    pub(crate) fn objects(&self) -> Result<ServerObjects, String> {
        let info = self.api("$JS.API.INFO", "")?;
        let count = |v: &serde_json::Value, k: &str| {
            v[k].as_f64()
                .ok_or_else(|| format!("$JS.API.INFO has no `{k}`: {v}"))
        };
        let streams = count(&info, "streams")?;
        let consumers = count(&info, "consumers")?;
        let names = self.api("$JS.API.STREAM.NAMES", "{}")?;
        let buckets = names["streams"].as_array().map_or(0, |a| {
            a.iter()
                .filter(|n| n.as_str().is_some_and(|n| n.starts_with("KV_")))
                .count()
        }) as f64;
        Ok(ServerObjects {
            streams: streams - buckets,
            consumers,
            buckets,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_a_footprint() {
        let me = Footprint::of(std::process::id()).expect("/proc/self");
        assert!(
            me.rss_mib > 0.0 && me.threads >= 1.0 && me.fds >= 3.0,
            "{me:?}"
        );
        assert_eq!(Footprint::of(u32::MAX), None);
        let two = Footprint::sum([me, me]);
        assert_eq!(two.threads, 2.0 * me.threads);
    }
}
