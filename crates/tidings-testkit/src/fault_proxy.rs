//! A fault proxy for partition tests (R-DIST-9): a TCP proxy on 127.0.0.1 between a client
//! and a server (a client and a `nats-server`, or two cluster nodes) that a test can make
//! delay, blackhole one direction or both, cut, or refuse new connections, and heal.
//!
//! ```no_run
//! use std::time::Duration;
//! use tidings_testkit::fault_proxy::{Direction, FaultProxy};
//! # let server_addr: std::net::SocketAddr = "127.0.0.1:4222".parse().unwrap();
//! let proxy = FaultProxy::start(server_addr).expect("a proxy");
//! // Point the client at `proxy.addr()` instead of the server, then:
//! proxy.blackhole(Direction::Both); // a partition: bytes vanish, connections stay open
//! proxy.heal(); // bytes flow again, on the same connections
//! proxy.cut(); // every connection closed, new ones closed at once
//! proxy.heal();
//! proxy.delay(Duration::from_millis(200)); // every chunk arrives 200 ms late
//! ```
//!
//! # What each fault does
//! - [`delay`](FaultProxy::delay): every chunk read from then on is written to the other
//!   side that long after it was read, in order (latency, not a throughput limit).
//! - [`blackhole`](FaultProxy::blackhole): what travels in that direction is read and
//!   discarded — the sender's kernel sees it acknowledged, the receiver never sees it —
//!   and a close (FIN) in that direction is held back too. Connections stay open: a real
//!   partition, not a reset. New connections are accepted and connected to the target,
//!   so a client's connect attempt hangs until its own timeout. A connection that lost
//!   bytes is closed at the [`heal`](FaultProxy::heal): TCP never delivers a stream with
//!   a hole in it — the endpoints of a real one would have seen it reset after their
//!   retransmissions failed — and a protocol stream that went on past a hole would lose
//!   protocol state silently (a NATS subscription's interest, say), which no network does.
//! - [`stall`](FaultProxy::stall): what travels in that direction is held, unread, until
//!   healed, then delivered intact and in order — TCP over a partitioned link that heals
//!   before the sender gives up retransmitting. The sender's writes block once the
//!   kernel's buffers are full.
//! - [`cut`](FaultProxy::cut): every open connection is shut down (both sides see it
//!   closed), and a new one is accepted and closed at once, until [`heal`](FaultProxy::heal).
//! - [`refuse_new`](FaultProxy::refuse_new): open connections go on; a new one is accepted
//!   and closed at once.
//! - [`heal`](FaultProxy::heal): all of the above undone; connections still open carry
//!   bytes again, except those that lost bytes to a blackhole, which are closed.
//!
//! # Threads and lifecycle
//! One thread accepts; each connection has four (a reader and a writer per direction).
//! Dropping the proxy closes the listener and every connection and joins every thread.
//! [`stats`](FaultProxy::stats) counts bytes forwarded and discarded per direction and
//! connections accepted and refused.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long the proxy waits for the target to accept a connection it forwards.
pub const TARGET_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Which way a fault applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From the client that connected to the proxy towards the target.
    ClientToServer,
    /// From the target back to the client.
    ServerToClient,
    /// Both ways.
    Both,
}

/// What a [`FaultProxy`] has carried so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProxyStats {
    /// Bytes written to the target.
    pub to_server: u64,
    /// Bytes written to clients.
    pub to_client: u64,
    /// Bytes from clients discarded (blackholed).
    pub discarded_to_server: u64,
    /// Bytes from the target discarded (blackholed).
    pub discarded_to_client: u64,
    /// Connections accepted and forwarded.
    pub accepted: u64,
    /// Connections accepted and closed at once (cut, refusing, or the target unreachable).
    pub refused: u64,
    /// Connections open now.
    pub open: u64,
}

/// A loopback TCP proxy with faults a test switches on and off (see the
/// [module docs](self)). Dropping it closes every connection and joins its threads.
#[derive(Debug)]
pub struct FaultProxy {
    shared: Arc<Shared>,
    addr: SocketAddr,
    target: SocketAddr,
    acceptor: Option<JoinHandle<()>>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Faults {
    delay: Duration,
    blackhole_to_server: bool,
    blackhole_to_client: bool,
    stall_to_server: bool,
    stall_to_client: bool,
    cut: bool,
    refuse_new: bool,
}

impl Faults {
    fn blackholed(&self, to_server: bool) -> bool {
        if to_server {
            self.blackhole_to_server
        } else {
            self.blackhole_to_client
        }
    }

    fn stalled(&self, to_server: bool) -> bool {
        if to_server {
            self.stall_to_server
        } else {
            self.stall_to_client
        }
    }
}

/// One forwarded connection: the client's socket and the target's.
#[derive(Debug)]
struct Link {
    client: TcpStream,
    server: TcpStream,
    /// Bytes of this connection were blackholed: it is closed at the heal.
    lost: AtomicBool,
}

impl Link {
    fn shutdown(&self) {
        let _ = self.client.shutdown(Shutdown::Both);
        let _ = self.server.shutdown(Shutdown::Both);
    }
}

#[derive(Debug, Default)]
struct Counters {
    to_server: AtomicU64,
    to_client: AtomicU64,
    discarded_to_server: AtomicU64,
    discarded_to_client: AtomicU64,
    accepted: AtomicU64,
    refused: AtomicU64,
    open: AtomicU64,
}

#[derive(Debug, Default)]
struct Shared {
    faults: Mutex<Faults>,
    /// Signalled at every change of `faults` and at stop: a writer holding a close back
    /// or waiting out a delay looks again.
    changed: Condvar,
    stop: AtomicBool,
    /// Every open connection; the registry `cut` and drop shut down.
    links: Mutex<Vec<Arc<Link>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    counters: Counters,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    fn faults(&self) -> Faults {
        *lock(&self.faults)
    }

    fn set(&self, change: impl FnOnce(&mut Faults)) {
        change(&mut lock(&self.faults));
        self.changed.notify_all();
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    fn spawn(&self, name: &str, f: impl FnOnce() + Send + 'static) {
        let handle = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(f)
            .expect("start a proxy thread");
        let mut threads = lock(&self.threads);
        // Finished threads are reaped as new ones start, so a long test keeps few handles.
        threads.retain(|t| !t.is_finished());
        threads.push(handle);
    }

    /// Shuts down every open connection.
    fn shut_all(&self) {
        for link in lock(&self.links).iter() {
            link.shutdown();
        }
    }

    /// Waits until `due`, or until the proxy stops or is cut (`false` then).
    fn wait_until(&self, due: Instant) -> bool {
        let mut faults = lock(&self.faults);
        loop {
            if self.stopped() || faults.cut {
                return false;
            }
            let now = Instant::now();
            if now >= due {
                return true;
            }
            faults = self
                .changed
                .wait_timeout(faults, due - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Waits while the direction is stalled, unless the proxy stops or is cut.
    fn wait_unstalled(&self, to_server: bool) {
        let mut faults = lock(&self.faults);
        while faults.stalled(to_server) && !faults.cut && !self.stopped() {
            faults = self
                .changed
                .wait(faults)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Waits while the direction is blackholed or stalled (a close is held back like the
    /// bytes), unless the proxy stops or is cut.
    fn wait_unblocked(&self, to_server: bool) {
        let mut faults = lock(&self.faults);
        while (faults.blackholed(to_server) || faults.stalled(to_server))
            && !faults.cut
            && !self.stopped()
        {
            faults = self
                .changed
                .wait(faults)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

impl FaultProxy {
    /// Starts a proxy listening on a free port of 127.0.0.1 that forwards every connection
    /// it accepts to `target`, with no fault.
    ///
    /// # Errors
    /// The listener could not be bound or configured, or its thread not started.
    pub fn start(target: SocketAddr) -> io::Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        let addr = listener.local_addr()?;
        // Polled, so the acceptor sees the stop flag without a connection to wake it.
        listener.set_nonblocking(true)?;
        let shared = Arc::new(Shared::default());
        let accepting = Arc::clone(&shared);
        let acceptor = std::thread::Builder::new()
            .name(format!("fault-proxy-{}", addr.port()))
            .spawn(move || accept_loop(&listener, target, &accepting))?;
        Ok(Self {
            shared,
            addr,
            target,
            acceptor: Some(acceptor),
        })
    }

    /// The address clients connect to (127.0.0.1 and the proxy's port).
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The proxy's port.
    #[must_use]
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `nats://127.0.0.1:<port>`: the URL a NATS client uses to go through the proxy.
    #[must_use]
    pub fn nats_url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port())
    }

    /// Where connections are forwarded.
    #[must_use]
    pub fn target(&self) -> SocketAddr {
        self.target
    }

    /// Holds every chunk read from now on for `delay` before writing it on (zero: none).
    pub fn delay(&self, delay: Duration) {
        self.shared.set(|f| f.delay = delay);
    }

    /// Discards what travels in `direction` (adding to what is already blackholed);
    /// connections stay open.
    pub fn blackhole(&self, direction: Direction) {
        self.shared.set(|f| match direction {
            Direction::ClientToServer => f.blackhole_to_server = true,
            Direction::ServerToClient => f.blackhole_to_client = true,
            Direction::Both => {
                f.blackhole_to_server = true;
                f.blackhole_to_client = true;
            }
        });
    }

    /// Holds what travels in `direction`, unread, until [`heal`](Self::heal) (adding to
    /// what is already stalled); then it is delivered intact, in order.
    pub fn stall(&self, direction: Direction) {
        self.shared.set(|f| match direction {
            Direction::ClientToServer => f.stall_to_server = true,
            Direction::ServerToClient => f.stall_to_client = true,
            Direction::Both => {
                f.stall_to_server = true;
                f.stall_to_client = true;
            }
        });
    }

    /// Closes every open connection and, until [`heal`](Self::heal), every new one at
    /// once.
    pub fn cut(&self) {
        self.shared.set(|f| f.cut = true);
        self.shared.shut_all();
    }

    /// Closes every new connection at once, until [`heal`](Self::heal); open ones go on.
    pub fn refuse_new(&self) {
        self.shared.set(|f| f.refuse_new = true);
    }

    /// Undoes every fault: no delay, nothing blackholed or stalled, new connections
    /// forwarded. A connection that lost bytes to a blackhole is closed (see the
    /// [module docs](self)); the others carry bytes again.
    pub fn heal(&self) {
        self.shared.set(|f| *f = Faults::default());
        for link in lock(&self.shared.links).iter() {
            if link.lost.load(Ordering::Acquire) {
                link.shutdown();
            }
        }
    }

    /// The counts so far.
    #[must_use]
    pub fn stats(&self) -> ProxyStats {
        let c = &self.shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ProxyStats {
            to_server: get(&c.to_server),
            to_client: get(&c.to_client),
            discarded_to_server: get(&c.discarded_to_server),
            discarded_to_client: get(&c.discarded_to_client),
            accepted: get(&c.accepted),
            refused: get(&c.refused),
            open: get(&c.open),
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.set(|_| {});
        self.shared.shut_all();
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        // Link threads may still start pump threads until they see the stop flag.
        loop {
            let Some(t) = lock(&self.shared.threads).pop() else {
                break;
            };
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: &TcpListener, target: SocketAddr, shared: &Arc<Shared>) {
    while !shared.stopped() {
        match listener.accept() {
            Ok((client, _)) => {
                let faults = shared.faults();
                if faults.cut || faults.refuse_new {
                    shared.counters.refused.fetch_add(1, Ordering::Relaxed);
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let linking = Arc::clone(shared);
                shared.spawn("fault-proxy-link", move || link(client, target, &linking));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// Connects `client` to `target` and starts the four pump threads.
fn link(client: TcpStream, target: SocketAddr, shared: &Arc<Shared>) {
    let refuse = |client: &TcpStream| {
        shared.counters.refused.fetch_add(1, Ordering::Relaxed);
        let _ = client.shutdown(Shutdown::Both);
    };
    let Ok(server) = TcpStream::connect_timeout(&target, TARGET_CONNECT_TIMEOUT) else {
        refuse(&client);
        return;
    };
    if client.set_nonblocking(false).is_err() {
        refuse(&client);
        return;
    }
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let clones = (
        client.try_clone(),
        client.try_clone(),
        server.try_clone(),
        server.try_clone(),
    );
    let (Ok(c_read), Ok(c_write), Ok(s_read), Ok(s_write)) = clones else {
        refuse(&client);
        return;
    };
    let link = Arc::new(Link {
        client,
        server,
        lost: AtomicBool::new(false),
    });
    {
        // Registered under the registry's lock, after checking stop and cut under it: a
        // cut or a drop either sees this link or this link sees it.
        let mut links = lock(&shared.links);
        if shared.stopped() || shared.faults().cut {
            drop(links);
            refuse(&link.client);
            return;
        }
        links.push(Arc::clone(&link));
    }
    shared.counters.accepted.fetch_add(1, Ordering::Relaxed);
    shared.counters.open.fetch_add(1, Ordering::Relaxed);
    let finished = Arc::new(AtomicU64::new(0));
    for (from, to, to_server) in [(c_read, s_write, true), (s_read, c_write, false)] {
        let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
        let (reading, read_link) = (Arc::clone(shared), Arc::clone(&link));
        shared.spawn("fault-proxy-read", move || {
            read_side(from, &tx, to_server, &reading, &read_link);
        });
        let (writing, link, finished) =
            (Arc::clone(shared), Arc::clone(&link), Arc::clone(&finished));
        shared.spawn("fault-proxy-write", move || {
            write_side(&to, &rx, to_server, &writing, &link);
            // The second direction to finish closes the connection and unregisters it.
            if finished.fetch_add(1, Ordering::AcqRel) == 1 {
                link.shutdown();
                lock(&writing.links).retain(|l| !Arc::ptr_eq(l, &link));
                writing.counters.open.fetch_sub(1, Ordering::Relaxed);
            }
        });
    }
}

/// Reads chunks and queues them with the time they are due, discarding what is blackholed;
/// returns (dropping the queue) at the end of the stream or an error.
fn read_side(
    mut from: TcpStream,
    queue: &mpsc::Sender<(Instant, Vec<u8>)>,
    to_server: bool,
    shared: &Shared,
    link: &Link,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        // A stalled direction is not read: the sender's kernel buffers fill, as behind a
        // link that carries nothing.
        shared.wait_unstalled(to_server);
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        // A chunk read just before the stall began waits too.
        shared.wait_unstalled(to_server);
        let faults = shared.faults();
        if faults.blackholed(to_server) {
            discard(shared, link, to_server, n);
            continue;
        }
        if queue
            .send((Instant::now() + faults.delay, buf[..n].to_vec()))
            .is_err()
        {
            return;
        }
    }
}

/// Writes queued chunks when due (discarding them when the direction is blackholed by
/// then); at the end of the queue passes the close on, once the direction is not
/// blackholed.
fn write_side(
    mut to: &TcpStream,
    queue: &mpsc::Receiver<(Instant, Vec<u8>)>,
    to_server: bool,
    shared: &Shared,
    link: &Link,
) {
    while let Ok((due, chunk)) = queue.recv() {
        if !shared.wait_until(due) {
            break;
        }
        if shared.faults().blackholed(to_server) {
            discard(shared, link, to_server, chunk.len());
            continue;
        }
        if to.write_all(&chunk).is_err() {
            break;
        }
        let counter = if to_server {
            &shared.counters.to_server
        } else {
            &shared.counters.to_client
        };
        counter.fetch_add(chunk.len() as u64, Ordering::Relaxed);
    }
    shared.wait_unblocked(to_server);
    let _ = to.shutdown(Shutdown::Write);
}

fn discard(shared: &Shared, link: &Link, to_server: bool, n: usize) {
    link.lost.store(true, Ordering::Release);
    let counter = if to_server {
        &shared.counters.discarded_to_server
    } else {
        &shared.counters.discarded_to_client
    };
    counter.fetch_add(n as u64, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on 127.0.0.1: every byte read is written back. Stopped (and its
    /// threads left to end with their connections) when dropped.
    struct Echo {
        addr: SocketAddr,
        received: Arc<AtomicU64>,
        stop: Arc<AtomicBool>,
        acceptor: Option<JoinHandle<()>>,
    }

    impl Echo {
        fn start() -> Self {
            let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
            listener.set_nonblocking(true).expect("nonblocking");
            let addr = listener.local_addr().expect("addr");
            let received = Arc::new(AtomicU64::new(0));
            let stop = Arc::new(AtomicBool::new(false));
            let (r, s) = (Arc::clone(&received), Arc::clone(&stop));
            let acceptor = std::thread::spawn(move || {
                while !s.load(Ordering::Acquire) {
                    match listener.accept() {
                        Ok((mut conn, _)) => {
                            conn.set_nonblocking(false).expect("blocking");
                            let r = Arc::clone(&r);
                            std::thread::spawn(move || {
                                let mut buf = [0u8; 4096];
                                while let Ok(n) = conn.read(&mut buf) {
                                    if n == 0 {
                                        return;
                                    }
                                    r.fetch_add(n as u64, Ordering::Relaxed);
                                    if conn.write_all(&buf[..n]).is_err() {
                                        return;
                                    }
                                }
                            });
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            });
            Self {
                addr,
                received,
                stop,
                acceptor: Some(acceptor),
            }
        }

        fn received(&self) -> u64 {
            self.received.load(Ordering::Relaxed)
        }
    }

    impl Drop for Echo {
        fn drop(&mut self) {
            self.stop.store(true, Ordering::Release);
            if let Some(a) = self.acceptor.take() {
                let _ = a.join();
            }
        }
    }

    const PATIENCE: Duration = Duration::from_secs(10);
    /// How long a read waits before a test concludes nothing came (a blackhole holds
    /// everything, so any wait is a lower bound, never a race).
    const QUIET: Duration = Duration::from_millis(300);

    fn connect(proxy: &FaultProxy) -> TcpStream {
        let s = TcpStream::connect(proxy.addr()).expect("connect to the proxy");
        s.set_read_timeout(Some(PATIENCE)).expect("timeout");
        s
    }

    fn round_trip(s: &mut TcpStream, data: &[u8]) {
        s.write_all(data).expect("write");
        let mut back = vec![0u8; data.len()];
        s.read_exact(&mut back).expect("the echo");
        assert_eq!(back, data);
    }

    fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + PATIENCE;
        while !cond() {
            assert!(Instant::now() < deadline, "not within {PATIENCE:?}: {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// What a read sees within `QUIET`: `Some(n)` bytes (0: closed), `None`: nothing yet.
    fn read_quietly(s: &mut TcpStream) -> Option<usize> {
        s.set_read_timeout(Some(QUIET)).expect("timeout");
        let mut buf = [0u8; 64];
        let got = match s.read(&mut buf) {
            Ok(n) => Some(n),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                None
            }
            Err(_) => Some(0),
        };
        s.set_read_timeout(Some(PATIENCE)).expect("timeout");
        got
    }

    #[test]
    fn forwards_both_ways_and_counts() {
        let echo = Echo::start();
        let proxy = FaultProxy::start(echo.addr).expect("proxy");
        let mut s = connect(&proxy);
        round_trip(&mut s, b"hello");
        round_trip(&mut s, &[7u8; 100_000]);
        wait_for("counted", || proxy.stats().to_client == 100_005);
        let stats = proxy.stats();
        assert_eq!(stats.to_server, 100_005);
        assert_eq!(stats.accepted, 1);
        assert_eq!(stats.open, 1);
        assert_eq!(stats.discarded_to_server + stats.discarded_to_client, 0);
        drop(s);
        wait_for("the connection closed", || proxy.stats().open == 0);
    }

    #[test]
    fn a_blackhole_to_the_server_discards_and_keeps_the_connection_open() {
        let echo = Echo::start();
        let proxy = FaultProxy::start(echo.addr).expect("proxy");
        let mut s = connect(&proxy);
        round_trip(&mut s, b"before");
        proxy.blackhole(Direction::ClientToServer);
        s.write_all(b"lost").expect("the client's write succeeds");
        wait_for("discarded", || proxy.stats().discarded_to_server == 4);
        assert_eq!(read_quietly(&mut s), None, "nothing back, and not closed");
        assert_eq!(echo.received(), 6, "the server never saw it");
        proxy.heal();
        // It lost bytes: closed at the heal; a new one works.
        let mut buf = [0u8; 8];
        assert_eq!(s.read(&mut buf).unwrap_or(0), 0, "closed at the heal");
        round_trip(&mut connect(&proxy), b"after");
    }

    #[test]
    fn a_blackhole_that_lost_nothing_leaves_the_connection_open_at_the_heal() {
        let echo = Echo::start();
        let proxy = FaultProxy::start(echo.addr).expect("proxy");
        let mut s = connect(&proxy);
        round_trip(&mut s, b"before");
        proxy.blackhole(Direction::Both);
        assert_eq!(read_quietly(&mut s), None, "open and quiet");
        proxy.heal();
        round_trip(&mut s, b"after");
        assert_eq!(proxy.stats().accepted, 1, "the same connection");
    }

    #[test]
    fn a_blackhole_to_the_client_lets_the_server_hear_and_the_client_not() {
        let echo = Echo::start();
        let proxy = FaultProxy::start(echo.addr).expect("proxy");
        let mut s = connect(&proxy);
        round_trip(&mut s, b"x");
        proxy.blackhole(Direction::ServerToClient);
        s.write_all(b"half").expect("write");
        wait_for("the server got it", || echo.received() == 5);
        wait_for("its echo discarded", || {
            proxy.stats().discarded_to_client == 4
        });
        assert_eq!(read_quietly(&mut s), None, "half-open: nothing arrives");
        proxy.heal();
        let mut buf = [0u8; 8];
        assert_eq!(
            s.read(&mut buf).unwrap_or(0),
            0,
            "it lost bytes: closed at the heal"
        );
    }

    #[test]
    fn a_blackhole_holds_a_close_back_until_healed() {
        let echo = Echo::start();
        let proxy = FaultProxy::start(echo.addr).expect("proxy");
        let mut s = connect(&proxy);
        round_trip(&mut s, b"x");
        proxy.blackhole(Direction::Both);
        s.shutdown(Shutdown::Write)
            .expect("the client closes its side");
        assert_eq!(
            read_quietly(&mut s),
            None,
            "the server never heard the close"
        );
        proxy.heal();
        // The close reaches the echo server, which closes in turn.
        let mut rest = Vec::new();
        s.read_to_end(&mut rest).expect("closed cleanly");
        assert!(rest.is_empty());
    }

    #[test]
    fn a_stall_holds_bytes_and_delivers_them_intact_when_healed() {
        let echo = Echo::start();
        let proxy = FaultProxy::start(echo.addr).expect("proxy");
        let mut s = connect(&proxy);
        round_trip(&mut s, b"x");
        proxy.stall(Direction::ClientToServer);
        s.write_all(b"held").expect("write");
        assert_eq!(read_quietly(&mut s), None, "nothing passes");
        assert_eq!(echo.received(), 1, "the server saw nothing");
        assert_eq!(proxy.stats().discarded_to_server, 0, "nothing lost");
        proxy.heal();
        let mut back = [0u8; 4];
        s.read_exact(&mut back).expect("delivered after the heal");
        assert_eq!(&back, b"held");
    }

    #[test]
    fn a_cut_closes_everything_until_healed() {
        let echo = Echo::start();
        let proxy = FaultProxy::start(echo.addr).expect("proxy");
        let mut a = connect(&proxy);
        let mut b = connect(&proxy);
        round_trip(&mut a, b"a");
        round_trip(&mut b, b"b");
        proxy.cut();
        for s in [&mut a, &mut b] {
            let mut buf = [0u8; 8];
            let n = s.read(&mut buf).unwrap_or(0);
            assert_eq!(n, 0, "the open connection was closed");
        }
        wait_for("both closed", || proxy.stats().open == 0);
        let mut c = connect(&proxy);
        let mut buf = [0u8; 8];
        assert_eq!(
            c.read(&mut buf).unwrap_or(0),
            0,
            "a new one is closed at once"
        );
        assert!(proxy.stats().refused >= 1);
        proxy.heal();
        let mut d = connect(&proxy);
        round_trip(&mut d, b"again");
    }

    #[test]
    fn refusing_new_connections_keeps_the_open_ones() {
        let echo = Echo::start();
        let proxy = FaultProxy::start(echo.addr).expect("proxy");
        let mut a = connect(&proxy);
        round_trip(&mut a, b"a");
        proxy.refuse_new();
        let mut b = connect(&proxy);
        let mut buf = [0u8; 8];
        assert_eq!(b.read(&mut buf).unwrap_or(0), 0, "refused");
        round_trip(&mut a, b"still");
        proxy.heal();
        round_trip(&mut connect(&proxy), b"new");
    }

    #[test]
    fn a_delay_holds_every_chunk_and_keeps_order() {
        let echo = Echo::start();
        let proxy = FaultProxy::start(echo.addr).expect("proxy");
        let mut s = connect(&proxy);
        let delay = Duration::from_millis(150);
        proxy.delay(delay);
        let started = Instant::now();
        let data: Vec<u8> = (0..=255u8).cycle().take(50_000).collect();
        round_trip(&mut s, &data);
        // Held once each way: a lower bound, which no load can break.
        assert!(started.elapsed() >= delay * 2, "{:?}", started.elapsed());
        proxy.heal();
        round_trip(&mut s, b"fast again");
    }

    #[test]
    fn dropping_the_proxy_closes_connections_and_the_listener() {
        let echo = Echo::start();
        let proxy = FaultProxy::start(echo.addr).expect("proxy");
        let addr = proxy.addr();
        let mut s = connect(&proxy);
        round_trip(&mut s, b"x");
        // A blackholed connection too: drop must not wait for a heal.
        proxy.blackhole(Direction::Both);
        drop(proxy);
        let mut buf = [0u8; 8];
        assert_eq!(s.read(&mut buf).unwrap_or(0), 0, "closed by the drop");
        assert!(
            TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err(),
            "the listener is closed"
        );
    }

    #[test]
    fn an_unreachable_target_closes_the_client() {
        // A port just released: nothing listens there.
        let target = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.local_addr())
            .expect("a free port");
        let proxy = FaultProxy::start(target).expect("proxy");
        let mut s = connect(&proxy);
        let mut buf = [0u8; 8];
        assert_eq!(s.read(&mut buf).unwrap_or(0), 0);
        wait_for("counted", || proxy.stats().refused == 1);
    }
}
