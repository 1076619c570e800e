//! Connecting: credentials, TLS, timeouts, and the server capability check (R-DIST-4).
//!
//! # Failure
//! [`ConnectOptions::connect`] never hangs: the connection (TCP, TLS, authentication) either
//! succeeds or fails with a [`ConnectError`] within the connect timeout (default
//! [`DEFAULT_CONNECT_TIMEOUT`]); the JetStream check that follows is one request bounded by
//! the request timeout (default [`DEFAULT_REQUEST_TIMEOUT`]). A server older than
//! [`MIN_SERVER_VERSION`] is refused: older servers silently ignore `filter_subjects` and
//! would deliver every subject of the stream.
//!
//! # Clusters (R-DIST-7)
//! Give the client every node's URL ([`ConnectOptions::server`],
//! [`ConnectOptions::servers`]): [`connect`](ConnectOptions::connect) succeeds when any of
//! them answers within the connect timeout (each attempt gets an equal share of it), and
//! when the node it is connected to dies the client moves to another one by itself. The
//! servers are tried in random order (spreading clients over the cluster) unless
//! [`ConnectOptions::keep_server_order`] is set. The client also learns the other nodes
//! from the cluster itself, but only the URLs given here are known before the first
//! connection.
//!
//! # After connecting
//! The client reconnects by itself when the connection drops (to the same server or, given
//! several, to any); while no server is reachable, operations fail with their
//! `TimedOut`/`Unavailable` errors after the request timeout.
//!
//! # A connection that went silent
//! A connection can stay open while nothing comes back: a half-open TCP connection (the
//! server-to-client direction lost, a middlebox that dropped its state, a peer that froze).
//! The socket reports nothing, so the client notices by its pings: whenever nothing has
//! arrived from the server for one [ping interval](ConnectOptions::ping_interval) it sends
//! a PING, and when the third interval passes with two of them unanswered and still nothing
//! received it drops the connection and reconnects (async-nats 0.52 allows two outstanding
//! pings). So a silent connection is reported down ([`JetStream::is_connected`],
//! [`NatsConnection::is_connected`](crate::NatsConnection::is_connected)) at most **three
//! ping intervals** after the last byte the server sent — 15 s with the default
//! [`DEFAULT_PING_INTERVAL`] — and the client then reconnects by itself. Calls made
//! meanwhile are bounded by their own timeouts, as ever. An idle healthy connection costs one
//! PING and PONG per interval; a busy one none (anything received counts).
//!
//! # A second connection for what others wrote (issue 34)
//! Bytes another producer wrote reach a client only as messages it receives: deliveries of
//! durable consumers, the cursors' wake-up subscriptions, a `NatsTransport`'s
//! subscriptions and the lease bucket's entries a keyed group reads. A header block the client
//! library cannot parse (not UTF-8, a line without a colon, a lone LF, a version other than
//! `NATS/1.0`, ...) makes it drop and re-establish the connection it arrived on, and
//! everything in flight on that connection with it. So those go over a connection of their
//! own, opened with the same options on first use ([`JetStream::receiving`]): a foreign
//! record can cost that connection a reconnect (what it carried comes back after the ack
//! wait), never the publishes, DLQ writes and stream requests of the first one.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;

pub use super::version::{MIN_SERVER_VERSION, ServerVersion};
use crate::error::ConnectError;

/// Default bound on establishing the connection (TCP, TLS, authentication).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Default bound on each JetStream request and on waiting for a publish acknowledgement.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Default [`ConnectOptions::ping_interval`]: a silent connection is noticed within three
/// of them, 15 s.
pub const DEFAULT_PING_INTERVAL: Duration = Duration::from_secs(5);

/// The shortest ping interval taken (a shorter one is raised to it).
pub const MIN_PING_INTERVAL: Duration = Duration::from_millis(100);

/// Checks a server's reported version against [`MIN_SERVER_VERSION`].
///
/// **Waits:** never.
///
/// # Errors
///
/// [`ConnectError::ServerTooOld`] naming the feature that needs the newer server, also when
/// the version cannot be parsed.
pub fn check_server_version(reported: &str) -> Result<ServerVersion, ConnectError> {
    match ServerVersion::parse(reported) {
        Some(v) if v >= MIN_SERVER_VERSION => Ok(v),
        _ => Err(ConnectError::ServerTooOld {
            version: reported.to_owned(),
            required: MIN_SERVER_VERSION,
            feature: "filter_subjects (several subject filters per consumer)",
        }),
    }
}

#[derive(Clone, Default)]
enum Auth {
    #[default]
    None,
    Token(String),
    UserPassword(String, String),
    NkeySeed(String),
    CredentialsFile(PathBuf),
}

/// How to connect to a NATS server with JetStream: addresses, credentials, TLS and
/// timeouts.
///
/// ```no_run
/// # async fn demo() -> Result<(), tidings_jetstream::ConnectError> {
/// use std::time::Duration;
/// let js = tidings_jetstream::ConnectOptions::new("nats://127.0.0.1:4222")
///     .token("s3cret")
///     .connect_timeout(Duration::from_secs(2))
///     .name("billing")
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
///
/// A cluster: every node's URL, so the client fails over between them (R-DIST-7).
///
/// ```no_run
/// # async fn demo() -> Result<(), tidings_jetstream::ConnectError> {
/// let js = tidings_jetstream::ConnectOptions::servers([
///     "nats://10.0.0.1:4222",
///     "nats://10.0.0.2:4222",
///     "nats://10.0.0.3:4222",
/// ])
/// .connect()
/// .await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
#[must_use]
pub struct ConnectOptions {
    urls: Vec<String>,
    keep_server_order: bool,
    auth: Auth,
    root_certificates: Vec<PathBuf>,
    client_certificate: Option<(PathBuf, PathBuf)>,
    require_tls: bool,
    connect_timeout: Duration,
    request_timeout: Duration,
    ping_interval: Duration,
    name: Option<String>,
    /// This is the receiving connection of another one (see the module docs).
    receiving: bool,
}

impl fmt::Debug for ConnectOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Credentials are not printed.
        let auth = match &self.auth {
            Auth::None => "none",
            Auth::Token(_) => "token",
            Auth::UserPassword(..) => "user/password",
            Auth::NkeySeed(_) => "nkey",
            Auth::CredentialsFile(_) => "credentials file",
        };
        f.debug_struct("ConnectOptions")
            .field("urls", &self.urls)
            .field("keep_server_order", &self.keep_server_order)
            .field("auth", &auth)
            .field("require_tls", &self.require_tls)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("ping_interval", &self.ping_interval)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl ConnectOptions {
    /// Options for the server at `url` (`nats://host:port`, `tls://host:port`, or
    /// `host:port`), without credentials or TLS requirements, with the default timeouts.
    ///
    /// **Waits:** never.
    pub fn new(url: impl Into<String>) -> Self {
        Self::servers([url])
    }

    /// Options for a cluster whose nodes are at `urls` (each as for [`new`](Self::new)):
    /// the client connects to any of them and fails over between them. An empty list fails
    /// at [`connect`](Self::connect) with [`ConnectError::InvalidUrl`].
    ///
    /// **Waits:** never.
    pub fn servers<I, S>(urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            urls: urls.into_iter().map(Into::into).collect(),
            keep_server_order: false,
            auth: Auth::None,
            root_certificates: Vec::new(),
            client_certificate: None,
            require_tls: false,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            ping_interval: DEFAULT_PING_INTERVAL,
            name: None,
            receiving: false,
        }
    }

    /// Adds another server (a node of the same cluster) the client may connect and fail
    /// over to.
    ///
    /// **Waits:** never.
    pub fn server(mut self, url: impl Into<String>) -> Self {
        self.urls.push(url.into());
        self
    }

    /// The server URLs given, in order.
    ///
    /// **Waits:** never.
    #[must_use]
    pub fn server_urls(&self) -> &[String] {
        &self.urls
    }

    /// Tries the servers in the order given — at connect and at every reconnect — instead
    /// of in random order (default `false`): the first one that answers is used, so a
    /// process can prefer a node of its own.
    ///
    /// **Waits:** never.
    pub fn keep_server_order(mut self, keep: bool) -> Self {
        self.keep_server_order = keep;
        self
    }

    /// Authenticates with a token (replaces other credentials).
    ///
    /// **Waits:** never.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.auth = Auth::Token(token.into());
        self
    }

    /// Authenticates with a user name and password (replaces other credentials).
    ///
    /// **Waits:** never.
    pub fn user_password(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.auth = Auth::UserPassword(user.into(), password.into());
        self
    }

    /// Authenticates with an nkey seed (`SU...`; replaces other credentials).
    ///
    /// **Waits:** never.
    pub fn nkey_seed(mut self, seed: impl Into<String>) -> Self {
        self.auth = Auth::NkeySeed(seed.into());
        self
    }

    /// Authenticates with a `.creds` file (JWT and nkey seed; replaces other credentials).
    /// The file is read at [`connect`](Self::connect).
    ///
    /// **Waits:** never (the file is read by `connect`).
    pub fn credentials_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.auth = Auth::CredentialsFile(path.into());
        self
    }

    /// Trusts the CA certificates in this PEM file (may be called several times).
    ///
    /// **Waits:** never.
    pub fn tls_root_certificates(mut self, path: impl Into<PathBuf>) -> Self {
        self.root_certificates.push(path.into());
        self
    }

    /// Presents this client certificate and key (PEM files) for mutual TLS.
    ///
    /// **Waits:** never.
    pub fn tls_client_certificate(
        mut self,
        cert: impl Into<PathBuf>,
        key: impl Into<PathBuf>,
    ) -> Self {
        self.client_certificate = Some((cert.into(), key.into()));
        self
    }

    /// Refuses to connect without TLS.
    ///
    /// **Waits:** never.
    pub fn require_tls(mut self, required: bool) -> Self {
        self.require_tls = required;
        self
    }

    /// Bounds establishing the connection (default [`DEFAULT_CONNECT_TIMEOUT`]); with
    /// several servers, each attempt gets an equal share of it.
    ///
    /// **Waits:** never.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Bounds each JetStream request and publish acknowledgement (default
    /// [`DEFAULT_REQUEST_TIMEOUT`]).
    ///
    /// **Waits:** never.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// How long the connection may stay silent before the client pings the server (default
    /// [`DEFAULT_PING_INTERVAL`], at least [`MIN_PING_INTERVAL`]). A connection on which
    /// nothing arrives from the server — half-open, or a server that froze — is dropped, and
    /// reported down by `is_connected`, at most three intervals after the last byte the
    /// server sent (the client pings after one silent interval and gives up at the third
    /// with two pings unanswered); it then reconnects by itself. Shorter notices sooner and
    /// costs one PING and PONG per interval on an idle connection; a server stalled for
    /// longer than three intervals (a long pause) costs a reconnect.
    ///
    /// **Waits:** never.
    pub fn ping_interval(mut self, interval: Duration) -> Self {
        self.ping_interval = interval.max(MIN_PING_INTERVAL);
        self
    }

    /// The connection's name, as the server's monitoring shows it.
    ///
    /// **Waits:** never.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Connects, checks the server's version ([`MIN_SERVER_VERSION`]) and that JetStream is
    /// available to this account.
    ///
    /// Returns within the connect timeout plus one request timeout. Given several servers,
    /// it succeeds when any of them answers.
    ///
    /// **Waits:** (the future) on the network and on reading a credentials file: at most
    /// the connect timeout plus one request timeout.
    ///
    /// # Errors
    ///
    /// A [`ConnectError`]: bad address (or none), no server reachable, timeout, refused
    /// credentials, TLS failure, unreadable credentials file, a server too old, or no
    /// JetStream. An error naming a URL names every URL given, comma-separated.
    pub async fn connect(self) -> Result<JetStream, ConnectError> {
        let receiving = if self.receiving {
            Receiving::Itself
        } else {
            let mut options = self.clone();
            options.receiving = true;
            options.name = Some(match &self.name {
                Some(name) => format!("{name} (deliveries)"),
                None => "tidings deliveries".to_owned(),
            });
            Receiving::Separate(Arc::new((options, tokio::sync::OnceCell::new())))
        };
        let url = self.urls.join(", ");
        if self.urls.is_empty() {
            return Err(ConnectError::InvalidUrl {
                url,
                detail: "no server URL given".to_owned(),
            });
        }
        let servers = self
            .urls
            .iter()
            .map(|u| {
                u.parse::<async_nats::ServerAddr>()
                    .map_err(|e: std::io::Error| ConnectError::InvalidUrl {
                        url: u.clone(),
                        detail: e.to_string(),
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let attempts = u32::try_from(servers.len()).unwrap_or(u32::MAX);
        let mut options = match &self.auth {
            Auth::None => async_nats::ConnectOptions::new(),
            Auth::Token(t) => async_nats::ConnectOptions::with_token(t.clone()),
            Auth::UserPassword(u, p) => {
                async_nats::ConnectOptions::with_user_and_password(u.clone(), p.clone())
            }
            Auth::NkeySeed(s) => async_nats::ConnectOptions::with_nkey(s.clone()),
            Auth::CredentialsFile(path) => {
                async_nats::ConnectOptions::with_credentials_file(path.clone())
                    .await
                    .map_err(|e| ConnectError::Credentials {
                        path: path.clone(),
                        detail: e.to_string(),
                    })?
            }
        };
        for ca in &self.root_certificates {
            options = options.add_root_certificates(ca.clone());
        }
        if let Some((cert, key)) = &self.client_certificate {
            options = options.add_client_certificate(cert.clone(), key.clone());
        }
        options = options
            .require_tls(self.require_tls)
            .connection_timeout(self.connect_timeout / attempts)
            .request_timeout(Some(self.request_timeout))
            .ping_interval(self.ping_interval);
        if self.keep_server_order {
            options = options.retain_servers_order();
        }
        if let Some(name) = &self.name {
            options = options.name(name);
        }
        let client =
            match tokio::time::timeout(self.connect_timeout, options.connect(servers)).await {
                Err(_elapsed) => {
                    return Err(ConnectError::TimedOut {
                        url,
                        after: self.connect_timeout,
                    });
                }
                Ok(Err(e)) => return Err(map_connect_error(&url, self.connect_timeout, &e)),
                Ok(Ok(client)) => client,
            };
        let info = client.server_info();
        let version = check_server_version(&info.version)?;
        if !info.jetstream {
            return Err(ConnectError::JetStreamUnavailable {
                detail: format!("server {} runs without JetStream", info.version),
            });
        }
        let context = jetstream::ContextBuilder::new()
            .timeout(self.request_timeout)
            .ack_timeout(self.request_timeout)
            .build(client.clone());
        context.query_account().await.map_err(|e| match e.kind() {
            jetstream::context::AccountErrorKind::TimedOut => ConnectError::TimedOut {
                url: url.clone(),
                after: self.request_timeout,
            },
            _ => ConnectError::JetStreamUnavailable {
                detail: e.to_string(),
            },
        })?;
        Ok(JetStream {
            client,
            context,
            version,
            max_payload: info.max_payload,
            request_timeout: self.request_timeout,
            receiving,
        })
    }
}

fn map_connect_error(url: &str, after: Duration, e: &async_nats::ConnectError) -> ConnectError {
    use async_nats::ConnectErrorKind as K;
    let detail = e.to_string();
    match e.kind() {
        K::ServerParse | K::Dns => ConnectError::InvalidUrl {
            url: url.to_owned(),
            detail,
        },
        K::Authentication | K::AuthorizationViolation => {
            ConnectError::AuthenticationFailed { detail }
        }
        K::TimedOut => ConnectError::TimedOut {
            url: url.to_owned(),
            after,
        },
        K::Tls => ConnectError::Tls { detail },
        // A failed handshake (unknown issuer, no client certificate where the server wants
        // one, a TLS-only server met by a client without the CA) arrives as an I/O error
        // around a rustls error: the kind says I/O, the source says TLS.
        _ if tls_in_chain(e) => ConnectError::Tls { detail },
        _ => ConnectError::Unreachable {
            url: url.to_owned(),
            detail,
        },
    }
}

/// True when `e` or any error in its source chain is a rustls error, on its own or inside an
/// I/O error (how tokio-rustls reports a failed handshake or a TLS alert).
fn tls_in_chain(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(err) = next {
        if err.is::<async_nats::rustls::Error>() {
            return true;
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && io
                .get_ref()
                .is_some_and(|inner| inner.is::<async_nats::rustls::Error>())
        {
            return true;
        }
        next = err.source();
    }
    false
}

/// A connection to a NATS server with JetStream: streams, appends, durable consumers.
///
/// Cheap to clone (clones share the connection). The connection closes when the last clone
/// is dropped.
#[derive(Clone)]
pub struct JetStream {
    pub(crate) client: async_nats::Client,
    pub(crate) context: jetstream::Context,
    version: ServerVersion,
    /// The server's maximum payload (headers included), from its INFO at connect.
    pub(crate) max_payload: usize,
    pub(crate) request_timeout: Duration,
    receiving: Receiving,
}

/// Where [`JetStream::receiving`] is.
#[derive(Clone)]
enum Receiving {
    /// A connection of its own, opened on first use with these options.
    Separate(Arc<(ConnectOptions, tokio::sync::OnceCell<JetStream>)>),
    /// This is the receiving connection.
    Itself,
}

impl fmt::Debug for JetStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JetStream")
            .field("server_version", &self.version)
            .finish_non_exhaustive()
    }
}

impl JetStream {
    /// The version the server reported at connect (at least [`MIN_SERVER_VERSION`]).
    ///
    /// **Waits:** never.
    #[must_use]
    pub fn server_version(&self) -> ServerVersion {
        self.version
    }

    /// The bound on each request and publish acknowledgement.
    ///
    /// **Waits:** never.
    #[must_use]
    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// Whether the client is connected right now (it reconnects by itself after a loss).
    /// A connection that went silent (half-open) counts as connected until the client's
    /// pings notice it: at most three ping intervals after the last byte the server sent
    /// (see the [module docs](self#a-connection-that-went-silent)). Never waits.
    #[must_use]
    pub fn is_connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }

    /// The connection over which messages others wrote are received (durable consumers'
    /// deliveries, wake-up subscriptions, transport subscriptions, lease reads): a second one, opened with the same options on
    /// the first call and shared by every clone after (see the module docs).
    ///
    /// # Errors
    /// What [`ConnectOptions::connect`] reports when the first call cannot open it (a
    /// later call tries again).
    ///
    /// # Cancel safety
    /// Cancel safe: a cancelled first call leaves the connection to the next one.
    pub(crate) async fn receiving(&self) -> Result<Self, ConnectError> {
        match &self.receiving {
            Receiving::Itself => Ok(self.clone()),
            Receiving::Separate(second) => {
                let (options, cell) = &**second;
                cell.get_or_try_init(|| options.clone().connect())
                    .await
                    .cloned()
            }
        }
    }

    /// How many times the connection was established (1 after connecting): a change
    /// says it dropped and came back in between.
    pub(crate) fn connects(&self) -> u64 {
        self.client
            .statistics()
            .connects
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_and_compare() {
        let v = |s| ServerVersion::parse(s).expect("parses");
        assert_eq!(v("2.15.1").to_string(), "2.15.1");
        assert_eq!(
            v("v2.10.3"),
            ServerVersion {
                major: 2,
                minor: 10,
                patch: 3
            }
        );
        assert_eq!(v("2.11.0-beta.2").minor, 11);
        assert_eq!(v("2.10").patch, 0);
        assert!(ServerVersion::parse("banana").is_none());
        assert!(ServerVersion::parse("2").is_none());
    }

    #[test]
    fn too_old_servers_are_refused() {
        // R-DIST-4: Debian's 2.9.10 drops filter_subjects silently, so it is refused.
        let err = check_server_version("2.9.10").expect_err("2.9 is too old");
        assert!(
            matches!(&err, ConnectError::ServerTooOld { version, required, .. }
                if version == "2.9.10" && *required == MIN_SERVER_VERSION),
            "{err:?}"
        );
        assert!(
            matches!(&err, ConnectError::ServerTooOld { feature, .. } if feature.starts_with("filter_subjects")),
            "{err:?}"
        );
        assert_eq!(err.kind(), tidings::StreamErrorKind::Unsupported);
        // R-DIST-4: an unparseable version is refused, not trusted.
        assert!(check_server_version("garbage").is_err());
        assert!(check_server_version("2.10.0").is_ok());
        // A pre-release of 2.10 has filter_subjects: accepted (SemVer would order it below
        // 2.10.0 and refuse it).
        assert!(check_server_version("2.10.0-beta.1").is_ok());
        assert!(check_server_version("v2.10.3").is_ok());
        assert!(check_server_version("2.15.1").is_ok());
    }
}
