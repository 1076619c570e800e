//! A tiny HTTP/1.1 client over `std::net` (no client dependency) and a scripted broker.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tidings::{
    Broker, Driver, DurableSpec, DurableSubscription, HandlerError, ManualClock, Message, Retry,
    StreamConfig, SubscribeOptions, Subscription,
};
use tidings_admin::{AdminConfig, AdminServer};

pub const TOKEN: &str = "s3cret-token";

/// One answer: status code, body text.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: String,
    pub body: String,
}

impl Answer {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }
    /// The `error` code of a JSON error answer.
    pub fn error(&self) -> String {
        self.json()["error"].as_str().unwrap_or("").to_owned()
    }
}

/// Send one request (`Connection: close`) and read the whole answer. `auth` is the full
/// `Authorization` header value.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    auth: Option<&str>,
    body: Option<&str>,
) -> Answer {
    let mut s = TcpStream::connect(addr).expect("connect to the admin server");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let body = body.unwrap_or("");
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !body.is_empty() {
        req.push_str("Content-Type: application/json\r\n");
    }
    if let Some(a) = auth {
        req.push_str(&format!("Authorization: {a}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    parse_answer(&raw)
}

/// Send `bytes` as they are (any request, well-formed or not) on a new connection and read
/// the answer until the server closes it. The server may close before it read everything
/// (a refused head, a body over the limit): a failed write is not an error, the answer is.
pub fn raw_request(addr: SocketAddr, bytes: &[u8]) -> Answer {
    let mut s = TcpStream::connect(addr).expect("connect to the admin server");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let _ = s.write_all(bytes);
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            // A reset after the answer (unread request bytes left in the server's buffer).
            Err(e) if !raw.is_empty() && e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("reading the answer: {e}"),
        }
    }
    parse_answer(&raw)
}

fn parse_answer(raw: &[u8]) -> Answer {
    let text = String::from_utf8_lossy(raw).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("a status code");
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let body = if chunked {
        dechunk(rest)
    } else {
        rest.to_owned()
    };
    Answer {
        status,
        headers: head.to_owned(),
        body,
    }
}

fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, tail) = rest.split_once("\r\n").expect("chunk size");
        let n = usize::from_str_radix(size.trim(), 16).expect("hex chunk size");
        if n == 0 {
            return out;
        }
        out.push_str(&tail[..n]);
        rest = &tail[n + 2..];
    }
}

pub fn get(addr: SocketAddr, path: &str) -> Answer {
    request(addr, "GET", path, None, None)
}

/// POST with the right bearer token.
pub fn post(addr: SocketAddr, path: &str, body: &str) -> Answer {
    request(
        addr,
        "POST",
        path,
        Some(&format!("Bearer {TOKEN}")),
        Some(body),
    )
}

/// A manual-driver broker with a stream and three subscriptions, and its admin server.
///
/// `billing` (`orders.*`, capacity 500, fixed retry 1 s × 2) rejects what it gets while
/// `failing` is set; `audit` (`orders.#`) takes everything; `ship` is durable over the
/// `orders` stream.
pub struct World {
    pub broker: Broker,
    pub clock: ManualClock,
    pub failing: Arc<AtomicBool>,
    pub delivered: Arc<std::sync::Mutex<Vec<String>>>,
    pub billing: Subscription,
    pub audit: Subscription,
    pub ship: DurableSubscription,
    pub server: AdminServer,
    pub _dir: tempfile::TempDir,
}

impl World {
    pub fn start(config: AdminConfig) -> World {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new();
        let broker = Broker::builder()
            .driver(Driver::Manual)
            .clock(clock.clone())
            .data_dir(dir.path())
            .build()
            .unwrap();
        broker
            .create_stream(StreamConfig::new("orders", ["orders.#"]))
            .unwrap();
        let failing = Arc::new(AtomicBool::new(true));
        let delivered = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (f, d) = (failing.clone(), delivered.clone());
        let billing = broker
            .subscribe(
                "orders.*",
                SubscribeOptions::new()
                    .name("billing")
                    .capacity(500)
                    .retry(Retry::fixed(Duration::from_secs(1), 2)),
                move |m: &Message| {
                    if f.load(Ordering::SeqCst) {
                        return Err(HandlerError::reject("card declined"));
                    }
                    d.lock().unwrap().push(m.id().to_string());
                    Ok(())
                },
            )
            .unwrap();
        let audit = broker
            .subscribe(
                "orders.#",
                SubscribeOptions::new().name("audit"),
                |_: &Message| Ok::<(), HandlerError>(()),
            )
            .unwrap();
        let ship = broker
            .subscribe(
                DurableSpec::new("orders")
                    .name("ship")
                    .filter("orders.created"),
                SubscribeOptions::default(),
                |_: &Message| Ok::<(), HandlerError>(()),
            )
            .unwrap();
        let server = AdminServer::start(
            broker.clone(),
            config.bind(SocketAddr::from(([127, 0, 0, 1], 0))),
        )
        .unwrap();
        World {
            broker,
            clock,
            failing,
            delivered,
            billing,
            audit,
            ship,
            server,
            _dir: dir,
        }
    }

    /// Publish `n` orders (payload `order-<i>`, header `customer`) and run to idle: with
    /// `failing` set, each lands in billing's DLQ as `rejected`.
    pub fn orders(&self, n: usize) {
        for i in 0..n {
            self.broker
                .publish(
                    Message::to("orders.created")
                        .payload(format!("order-{i}"))
                        .header("customer", format!("c-{i}")),
                )
                .unwrap();
        }
        self.broker.run_until_idle();
    }

    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    pub fn billing_path(&self, tail: &str) -> String {
        format!("/api/subscriptions/{}/{tail}", self.billing.id().get())
    }
}
