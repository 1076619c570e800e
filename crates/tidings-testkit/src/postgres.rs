//! A throwaway PostgreSQL cluster for tests (tidings-sql's transactional consumer).
//!
//! [`PostgresServer::start`] runs `initdb` into a fresh temporary directory and starts
//! `postgres` on a free port of 127.0.0.1 (never another address), its unix socket in that
//! directory, trust authentication for the superuser [`USER`]. The cluster runs with
//! `fsync=off`: it survives a kill of its processes (the OS keeps what was written), not a
//! power cut of the machine, which no test here makes.
//!
//! # Its own user
//! PostgreSQL refuses to run as root. When the tests run as root (CI does), the directory
//! is given to the `postgres` system user (which the Debian package creates) and `initdb`,
//! `postgres` and `pg_ctl` run as that user (the uid and gid are set in the child before
//! it starts the program; no `su`, `sudo` or `runuser` process in between).
//!
//! # Lifecycle
//! `start` returns once `pg_isready` says the server accepts connections, or fails within
//! [`READY_TIMEOUT`] with the server's log. [`PostgresServer::stop`] stops it in immediate
//! mode (no checkpoint: like a crash, recovery runs at the next start) and
//! [`PostgresServer::restart`] starts it again on the same port and data directory.
//! Dropping the value stops the server, waits for it and removes the directory.
//!
//! # Finding the binaries
//! In this order: the directory named by [`BIN_ENV`], the newest
//! `/usr/lib/postgresql/<version>/bin` (Debian's layout), then `initdb` on `PATH`. When
//! none is there and the tests run as root on a machine with `apt-get`, the Debian package
//! `postgresql` is installed (what `.ci/postgres.sh` does); otherwise
//! [`PostgresServer::for_test`] fails the test with the fix in the message. A test is
//! skipped only on an explicit, printed opt-out: [`SKIP_ENV`]`=1`.

use std::fmt;
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Environment variable naming the directory holding `initdb`, `postgres`, `pg_ctl` and
/// `pg_isready`.
pub const BIN_ENV: &str = "TIDINGS_POSTGRES_BIN";

/// Environment variable that, set to `1`, skips (with a printed notice) every test that
/// needs PostgreSQL, instead of finding or installing it.
pub const SKIP_ENV: &str = "TIDINGS_SKIP_POSTGRES";

/// The superuser the cluster is created with (trust authentication, no password).
pub const USER: &str = "tidings";

/// How long [`PostgresServer::start`] and [`PostgresServer::restart`] wait for the server
/// to accept connections.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The command that installs PostgreSQL by hand (Debian; what `.ci/postgres.sh` runs).
pub const INSTALL_HINT: &str = "apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
     apt-get install -y -qq --no-install-recommends postgresql";

/// Why a server could not be started or stopped.
#[derive(Debug)]
#[non_exhaustive]
pub enum LaunchError {
    /// No PostgreSQL installation was found, and none could be installed here.
    NotInstalled,
    /// Installing the Debian package failed.
    Install {
        /// The step that failed.
        step: &'static str,
        /// What it printed, or why it could not run.
        output: String,
    },
    /// Running as root, but there is no `postgres` system user to run the server as.
    NoPostgresUser,
    /// A file or process operation failed.
    Io {
        /// What was being done.
        what: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A tool (`initdb`, `pg_ctl`, `psql`) failed.
    Tool {
        /// The tool.
        tool: &'static str,
        /// Its exit status.
        status: ExitStatus,
        /// What it printed.
        output: String,
    },
    /// The server exited before it was ready.
    Exited {
        /// Its exit status.
        status: ExitStatus,
        /// The end of its log.
        log: String,
    },
    /// The server did not accept connections within [`READY_TIMEOUT`].
    NotReady {
        /// The end of its log.
        log: String,
    },
}

impl fmt::Display for LaunchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotInstalled => write!(
                f,
                "no PostgreSQL installation (initdb) found: install it with `{INSTALL_HINT}` \
                 (what .ci/postgres.sh does), or set {BIN_ENV} to the directory holding \
                 initdb and postgres; to skip the tests that need it, set {SKIP_ENV}=1"
            ),
            Self::Install { step, output } => write!(
                f,
                "installing PostgreSQL failed at `{step}`: {output}\nFix: install it by hand \
                 with `{INSTALL_HINT}`, or set {BIN_ENV}; to skip the tests that need it, \
                 set {SKIP_ENV}=1"
            ),
            Self::NoPostgresUser => write!(
                f,
                "running as root, but there is no `postgres` user to run PostgreSQL as \
                 (PostgreSQL refuses to run as root): install the Debian package \
                 (`{INSTALL_HINT}`), which creates it, or run the tests as another user"
            ),
            Self::Io { what, source } => write!(f, "{what}: {source}"),
            Self::Tool {
                tool,
                status,
                output,
            } => write!(f, "{tool} failed ({status}):\n{output}"),
            Self::Exited { status, log } => {
                write!(
                    f,
                    "postgres exited before it was ready ({status}); log:\n{log}"
                )
            }
            Self::NotReady { log } => write!(
                f,
                "postgres did not accept connections within {READY_TIMEOUT:?}; log:\n{log}"
            ),
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

/// A running (or stopped, restartable) throwaway PostgreSQL cluster, owned by a test.
///
/// See the [module docs](self). Dropping it stops the server and removes its directory.
pub struct PostgresServer {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    /// The uid and gid the server runs as, when the tests run as root.
    run_as: Option<(u32, u32)>,
    child: Option<Child>,
}

impl fmt::Debug for PostgresServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresServer")
            .field("port", &self.port)
            .field("dir", &self.dir)
            .field("running", &self.child.is_some())
            .finish_non_exhaustive()
    }
}

impl PostgresServer {
    /// Starts a cluster for a test, installing PostgreSQL first when it is missing and
    /// this is possible (root, `apt-get`).
    ///
    /// Returns `None` only after printing a notice when the user opted out with
    /// `TIDINGS_SKIP_POSTGRES=1`: the calling test should return early (skip).
    ///
    /// # Panics
    /// When PostgreSQL is missing and could not be installed (the message says how to fix
    /// it), or when the server fails to start: the test fails with the reason and the
    /// server's log.
    #[must_use]
    pub fn for_test() -> Option<Self> {
        if skip_requested() {
            eprintln!("SKIPPED: {SKIP_ENV}=1 (this test needs PostgreSQL)");
            return None;
        }
        match Self::start() {
            Ok(server) => Some(server),
            Err(e) => panic!("could not start PostgreSQL: {e}"),
        }
    }

    /// Runs `initdb` into a fresh temporary directory and starts `postgres` on a free
    /// loopback port; waits (at most [`READY_TIMEOUT`]) until it accepts connections.
    ///
    /// # Errors
    /// [`LaunchError::NotInstalled`] / [`LaunchError::Install`],
    /// [`LaunchError::NoPostgresUser`], or a step's failure with its output or the log.
    pub fn start() -> Result<Self, LaunchError> {
        let bin = ensure_installed()?;
        let run_as = if running_as_root() {
            Some(postgres_user().ok_or(LaunchError::NoPostgresUser)?)
        } else {
            None
        };
        let dir = unique_dir();
        fs::create_dir_all(&dir).map_err(io(format!("create {}", dir.display())))?;
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
                .map_err(io(format!("chown {} to postgres", dir.display())))?;
        }
        let mut server = Self {
            bin,
            dir,
            port: 0,
            run_as,
            child: None,
        };
        let initdb = server
            .tool("initdb")
            .arg("-D")
            .arg(server.data_dir())
            .args([
                "-U",
                USER,
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ])
            .output()
            .map_err(io("run initdb"))?;
        if !initdb.status.success() {
            return Err(LaunchError::Tool {
                tool: "initdb",
                status: initdb.status,
                output: crate::launch::output_text(&initdb),
            });
        }
        // A port found free may be taken before the server binds it: try a few.
        let mut last = None;
        for _ in 0..3 {
            server.port = free_port()?;
            match server.launch() {
                Ok(()) => return Ok(server),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or(LaunchError::NotInstalled))
    }

    /// A connection string for the `postgres` database as [`USER`], over TCP on
    /// 127.0.0.1: `host=127.0.0.1 port=<port> user=tidings dbname=postgres`.
    #[must_use]
    pub fn conn_string(&self) -> String {
        self.conn_string_for("postgres")
    }

    /// A connection string for database `dbname` (create it first, e.g. with
    /// [`psql`](Self::psql)).
    #[must_use]
    pub fn conn_string_for(&self, dbname: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user={USER} dbname={dbname} connect_timeout=5",
            self.port
        )
    }

    /// The TCP port (kept across [`restart`](Self::restart)).
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The cluster's data directory.
    #[must_use]
    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// The directory holding the unix socket (and the log).
    #[must_use]
    pub fn socket_dir(&self) -> &Path {
        &self.dir
    }

    /// Whether the server was started and not stopped since.
    #[must_use]
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The server's log so far.
    #[must_use]
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    /// Runs `sql` with `psql` against the `postgres` database (stops at the first error);
    /// what it printed, unaligned, tuples only.
    ///
    /// # Errors
    /// [`LaunchError::Tool`] with psql's output when a statement failed.
    pub fn psql(&self, sql: &str) -> Result<String, LaunchError> {
        let out = Command::new(self.bin.join("psql"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", USER])
            .args(["-d", "postgres", "-v", "ON_ERROR_STOP=1", "-At", "-c", sql])
            .stdin(Stdio::null())
            .output()
            .map_err(io("run psql"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(LaunchError::Tool {
                tool: "psql",
                status: out.status,
                output: crate::launch::output_text(&out),
            })
        }
    }

    /// Stops the server in immediate mode (every process ends at once, no checkpoint:
    /// like a crash) and waits for it. Does nothing when it is not running.
    ///
    /// # Errors
    /// [`LaunchError::Io`] when the process cannot be stopped or waited for.
    pub fn stop(&mut self) -> Result<(), LaunchError> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let stopped = self
            .tool("pg_ctl")
            .arg("stop")
            .arg("-D")
            .arg(self.data_dir())
            .args(["-m", "immediate", "-w", "-t", "30"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !stopped {
            match child.kill() {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {}
                Err(e) => return Err(io("kill postgres")(e)),
            }
        }
        child.wait().map_err(io("wait for postgres"))?;
        Ok(())
    }

    /// Stops the server if it runs, then starts it again on the same port and data
    /// directory, and waits until it accepts connections.
    ///
    /// # Errors
    /// As [`stop`](Self::stop), then a start failure with the server's log.
    pub fn restart(&mut self) -> Result<(), LaunchError> {
        self.stop()?;
        self.launch()
    }

    /// A command for one of the cluster's programs, run as the server's user.
    fn tool(&self, name: &str) -> Command {
        let mut cmd = Command::new(self.bin.join(name));
        cmd.current_dir(&self.dir).stdin(Stdio::null());
        if let Some((uid, gid)) = self.run_as {
            cmd.uid(uid).gid(gid);
        }
        cmd
    }

    fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    fn launch(&mut self) -> Result<(), LaunchError> {
        let log_path = self.dir.join("server.log");
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(io(format!("open {}", log_path.display())))?;
        let log_err = log.try_clone().map_err(io("clone log handle"))?;
        let child = self
            .tool("postgres")
            .arg("-D")
            .arg(self.data_dir())
            .args(["-p", &self.port.to_string()])
            .arg("-k")
            .arg(&self.dir)
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", "fsync=off", "-c", "full_page_writes=off"])
            .args(["-c", "shared_buffers=32MB", "-c", "max_connections=60"])
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .map_err(io(format!("spawn {}", self.bin.join("postgres").display())))?;
        self.child = Some(child);
        match self.wait_ready() {
            Ok(()) => Ok(()),
            Err(e) => {
                let _ = self.stop();
                Err(e)
            }
        }
    }

    fn wait_ready(&mut self) -> Result<(), LaunchError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait().map_err(io("poll postgres"))?
            {
                self.child = None;
                return Err(LaunchError::Exited {
                    status,
                    log: self.log_tail(),
                });
            }
            let ready = Command::new(self.bin.join("pg_isready"))
                .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-t", "1"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(LaunchError::NotReady {
                    log: self.log_tail(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        let _ = self.stop();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// True when the user opted out of the tests that need PostgreSQL ([`SKIP_ENV`]`=1`).
#[must_use]
pub fn skip_requested() -> bool {
    std::env::var(SKIP_ENV).is_ok_and(|v| v == "1")
}

/// The directory holding the PostgreSQL programs, if there is one (without installing).
#[must_use]
pub fn find_bin_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os(BIN_ENV).filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(dir));
    }
    let newest = fs::read_dir("/usr/lib/postgresql")
        .ok()
        .and_then(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| {
                    let version: u32 = e.file_name().to_str()?.parse().ok()?;
                    let bin = e.path().join("bin");
                    bin.join("initdb").is_file().then_some((version, bin))
                })
                .max_by_key(|(v, _)| *v)
                .map(|(_, bin)| bin)
        });
    newest.or_else(|| {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .find(|dir| dir.join("initdb").is_file() && dir.join("postgres").is_file())
        })
    })
}

/// The directory holding the PostgreSQL programs: found, or installed now (Debian
/// package `postgresql`, as root with `apt-get`; one install at a time).
///
/// # Errors
/// [`LaunchError::NotInstalled`] when it cannot be installed here,
/// [`LaunchError::Install`] when installing failed.
pub fn ensure_installed() -> Result<PathBuf, LaunchError> {
    if let Some(dir) = find_bin_dir() {
        return Ok(dir);
    }
    if !running_as_root() || !Path::new("/usr/bin/apt-get").is_file() {
        return Err(LaunchError::NotInstalled);
    }
    static IN_PROCESS: Mutex<()> = Mutex::new(());
    let _one_thread = IN_PROCESS.lock().unwrap_or_else(|p| p.into_inner());
    let lock_path = std::env::temp_dir().join("tidings-postgres-install.lock");
    let lock = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| install_error("open the install lock", e.to_string()))?;
    // Released when `lock` is dropped (closed), also if this process dies.
    lock.lock()
        .map_err(|e| install_error("take the install lock", e.to_string()))?;
    if let Some(dir) = find_bin_dir() {
        return Ok(dir);
    }
    eprintln!(
        "tidings-testkit: no PostgreSQL found; installing the Debian package `postgresql` \
         (opt out with {SKIP_ENV}=1)"
    );
    run(
        "apt-get update",
        Command::new("apt-get").args(["update", "-qq"]),
    )?;
    run(
        "apt-get install postgresql",
        Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args([
                "install",
                "-y",
                "-qq",
                "--no-install-recommends",
                "postgresql",
            ]),
    )?;
    find_bin_dir().ok_or_else(|| {
        install_error(
            "find initdb",
            "the package installed, but no /usr/lib/postgresql/<version>/bin/initdb".into(),
        )
    })
}

fn install_error(step: &'static str, output: String) -> LaunchError {
    LaunchError::Install { step, output }
}

/// The real uid is 0 (from `/proc/self/status`; no libc call).
fn running_as_root() -> bool {
    fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|rest| rest.split_whitespace().next().map(|uid| uid == "0"))
            .unwrap_or(false)
    })
}

/// The uid and gid of the `postgres` system user, from `/etc/passwd`.
fn postgres_user() -> Option<(u32, u32)> {
    let passwd = fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        if fields.next()? != "postgres" {
            return None;
        }
        let _password = fields.next()?;
        let uid = fields.next()?.parse().ok()?;
        let gid = fields.next()?.parse().ok()?;
        Some((uid, gid))
    })
}

fn run(step: &'static str, command: &mut Command) -> Result<(), LaunchError> {
    crate::launch::run_step(command).map_err(|output| install_error(step, output))
}

fn free_port() -> Result<u16, LaunchError> {
    crate::launch::free_port().map_err(io("find a free port"))
}

fn unique_dir() -> PathBuf {
    crate::launch::unique_dir("pg")
}
