//! Starting and stopping the admin server.

use std::fmt;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::sync::Arc;
use std::thread::JoinHandle;

use tidings::Broker;

use crate::wire::JsonErrors;

/// Renders the `/metrics` answer (text).
pub(crate) type MetricsRender = Arc<dyn Fn() -> String + Send + Sync>;

/// How to run the admin server.
#[must_use]
#[derive(Clone)]
pub struct AdminConfig {
    pub(crate) bind: SocketAddr,
    pub(crate) token: Option<String>,
    pub(crate) metrics: Option<MetricsRender>,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for AdminConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminConfig")
            .field("bind", &self.bind)
            .field("actions_enabled", &self.token.is_some())
            .field("metrics", &self.metrics.is_some())
            .finish()
    }
}

impl AdminConfig {
    /// Read-only, on `127.0.0.1:8080`, without `/metrics`.
    pub fn new() -> Self {
        Self {
            bind: SocketAddr::from((Ipv4Addr::LOCALHOST, 8080)),
            token: None,
            metrics: None,
        }
    }

    /// Listen on this address (port 0 picks a free one; see [`AdminServer::addr`]). Binding
    /// to a non-loopback address exposes the broker to the network: enable actions only
    /// with a strong token then.
    pub fn bind(mut self, addr: SocketAddr) -> Self {
        self.bind = addr;
        self
    }

    /// Enable redrive, purge and seek, for requests carrying `Authorization: Bearer
    /// <token>`. Others get 401 and change nothing.
    ///
    /// # Errors
    /// [`StartError::EmptyToken`] at start when the token is empty.
    pub fn enable_actions(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Serve `GET /metrics` with the text `render` returns on each request (for example
    /// `broker.export_metrics()` followed by a Prometheus exporter's `render()`).
    pub fn metrics(mut self, render: impl Fn() -> String + Send + Sync + 'static) -> Self {
        self.metrics = Some(Arc::new(render));
        self
    }
}

/// Why the admin server did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The address could not be bound.
    #[error("could not bind the admin server to {addr}: {reason}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The operating system's reason.
        reason: String,
    },
    /// `enable_actions` was given an empty token.
    #[error("the admin actions token must not be empty")]
    EmptyToken,
    /// The server's thread or runtime could not be started.
    #[error("could not start the admin server: {0}")]
    Runtime(String),
}

/// A running admin server. It serves until dropped (or [`AdminServer::shutdown`]), on a
/// thread of its own with a single-threaded async runtime, so it works the same under
/// every driver, including the manual one.
#[must_use = "dropping the AdminServer stops it"]
pub struct AdminServer {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl AdminServer {
    /// Bind and start serving `broker` per `config`. Returns once the socket is bound.
    ///
    /// The server keeps its `Broker` handle until it stops, so dropping the application's
    /// own handles does not close the broker while the server runs: call
    /// [`Broker::close`](tidings::Broker::close) (the server then shows it closed) or shut
    /// the server down first.
    ///
    /// # Errors
    /// The address could not be bound, an empty token, or no thread could be started.
    pub fn start(broker: Broker, config: AdminConfig) -> Result<Self, StartError> {
        if config.token.as_deref() == Some("") {
            return Err(StartError::EmptyToken);
        }
        let bind_err = |e: std::io::Error| StartError::Bind {
            addr: config.bind,
            reason: e.to_string(),
        };
        let listener = TcpListener::bind(config.bind).map_err(bind_err)?;
        listener.set_nonblocking(true).map_err(bind_err)?;
        let addr = listener.local_addr().map_err(bind_err)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| StartError::Runtime(e.to_string()))?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let app = crate::http::router(broker, config);
        let thread = std::thread::Builder::new()
            .name("tidings-admin".into())
            .spawn(move || {
                runtime.block_on(async move {
                    match tokio::net::TcpListener::from_std(listener) {
                        Ok(l) => serve(l, app, stopped).await,
                        Err(e) => eprintln!("tidings-admin: {e}"),
                    }
                });
            })
            .map_err(|e| StartError::Runtime(e.to_string()))?;
        Ok(Self {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The address it listens on.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The dashboard's URL, `http://<addr>/`.
    #[must_use]
    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// Stop accepting, finish the requests in progress, and join the server thread.
    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

/// Accepts connections until `stopped`, then lets the ones open finish their request
/// (graceful shutdown: a connection still waiting for its request is closed).
///
/// One request per connection (keep-alive off): the connection is wrapped in
/// [`JsonErrors`], which gives the answers the HTTP parser writes itself the admin API's
/// JSON error body, and it looks only at a connection's first answer.
async fn serve(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    stopped: tokio::sync::oneshot::Receiver<()>,
) {
    // Every connection task holds a receiver of `open`; `shutdown` tells them to finish.
    let (open_tx, open_rx) = tokio::sync::watch::channel(());
    let (shutdown_tx, _) = tokio::sync::watch::channel(false);
    tokio::pin!(stopped);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, or a connection reset before it was
                    // accepted: keep serving, without spinning.
                    eprintln!("tidings-admin: accept: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = &mut stopped => break,
        };
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let mut shutdown = shutdown_tx.subscribe();
        let open = open_rx.clone();
        tokio::spawn(async move {
            let io = hyper_util::rt::TokioIo::new(JsonErrors::new(stream));
            let conn = hyper::server::conn::http1::Builder::new()
                .keep_alive(false)
                .serve_connection(io, service);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = shutdown.changed() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
            drop(open);
        });
    }
    drop(listener);
    let _ = shutdown_tx.send(true);
    drop(open_rx);
    open_tx.closed().await;
}

impl fmt::Debug for AdminServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminServer")
            .field("addr", &self.addr)
            .finish()
    }
}
