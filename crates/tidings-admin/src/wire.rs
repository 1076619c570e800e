//! The connection under the HTTP server: the admin API's error body for the answers the
//! HTTP parser writes itself.
//!
//! hyper refuses a request it cannot parse — a bad request line, method, target or header,
//! a bad `Content-Length` or `Transfer-Encoding`, a target over 65,534 bytes (`414`), a head
//! over its buffer or with too many headers (`431`) — with an answer it writes itself: a
//! status line and no body, and the application never sees the request. [`JsonErrors`] sits
//! between hyper and the socket and replaces such an answer with the documented JSON error
//! (`{"error": "<code>", "message": "<text>"}`). It recognises it by its head: an error
//! status and no `Content-Type`. Every answer of the admin API's own has a content type
//! (its errors are JSON, see `http::json_errors`), so none is ever taken for one.
//!
//! The server answers one request per connection (keep-alive off), so the first final
//! answer's head is the only one to look at: `1xx` interim answers (`100 Continue`) pass
//! and the next head is looked at; after the final head, bytes pass through untouched.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A response head longer than this is not hyper's own (it writes a few short headers):
/// passed through unexamined.
const MAX_HEAD: usize = 16 << 10;

/// What the writer is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Collecting the head of the next answer.
    Head,
    /// After a final answer's head that is the application's: everything passes.
    Pass,
    /// hyper's own error answer was replaced: what it writes after its head (nothing, or
    /// an empty body) is dropped.
    Replaced,
}

/// A connection whose parser-written error answers get the JSON error body (see the
/// module's docs). Reads pass through.
#[derive(Debug)]
pub(crate) struct JsonErrors<T> {
    inner: T,
    phase: Phase,
    /// The head being collected.
    head: Vec<u8>,
    /// Bytes accepted from the writer and not yet handed to `inner`.
    out: Vec<u8>,
    /// How much of `out` went to `inner` already.
    sent: usize,
}

impl<T> JsonErrors<T> {
    pub(crate) fn new(inner: T) -> Self {
        Self {
            inner,
            phase: Phase::Head,
            head: Vec::new(),
            out: Vec::new(),
            sent: 0,
        }
    }

    /// Takes in the bytes of the head being collected, deciding what to send once the head
    /// is complete.
    fn take_head(&mut self, buf: &[u8]) {
        self.head.extend_from_slice(buf);
        loop {
            let Some(end) = find(&self.head, b"\r\n\r\n").map(|i| i + 4) else {
                if self.head.len() > MAX_HEAD {
                    self.out.append(&mut self.head);
                    self.phase = Phase::Pass;
                }
                return;
            };
            let rest = self.head.split_off(end);
            let head = std::mem::replace(&mut self.head, rest);
            match status(&head) {
                Some(s) if (100..200).contains(&s) => {
                    // An interim answer: the final one follows.
                    self.out.extend_from_slice(&head);
                }
                Some(s) if s >= 400 && !has_content_type(&head) => {
                    self.out.extend_from_slice(&replacement(s));
                    self.head.clear();
                    self.phase = Phase::Replaced;
                    return;
                }
                _ => {
                    self.out.extend_from_slice(&head);
                    self.out.append(&mut self.head);
                    self.phase = Phase::Pass;
                    return;
                }
            }
        }
    }
}

impl<T: AsyncWrite + Unpin> JsonErrors<T> {
    /// Hands `out` to `inner`; ready once all of it went.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.out.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.out[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.out.clear();
        self.sent = 0;
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for JsonErrors<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for JsonErrors<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_send(cx))?;
        match this.phase {
            Phase::Pass => Pin::new(&mut this.inner).poll_write(cx, buf),
            Phase::Replaced => Poll::Ready(Ok(buf.len())),
            Phase::Head => {
                this.take_head(buf);
                // Accepted; `out` goes at the next write, flush or shutdown (hyper flushes
                // every answer it writes).
                Poll::Ready(Ok(buf.len()))
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_send(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.phase == Phase::Head && !this.head.is_empty() {
            // An unfinished head at the end: send it as it is.
            let rest = std::mem::take(&mut this.head);
            this.out.extend_from_slice(&rest);
            this.phase = Phase::Pass;
        }
        ready!(this.poll_send(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The status code of a response head (`HTTP/1.x NNN ...`).
fn status(head: &[u8]) -> Option<u16> {
    let code = head.strip_prefix(b"HTTP/1.")?.get(2..5)?;
    std::str::from_utf8(code).ok()?.parse().ok()
}

fn has_content_type(head: &[u8]) -> bool {
    head.split(|&b| b == b'\n')
        .skip(1)
        .any(|line| line.len() >= 13 && line[..13].eq_ignore_ascii_case(b"content-type:"))
}

/// The whole answer that replaces hyper's answer of status `status`.
fn replacement(status: u16) -> Vec<u8> {
    let (reason, code, message) = match status {
        414 => (
            "URI Too Long",
            "uri_too_long",
            "the request target is longer than the server reads (65,534 bytes)",
        ),
        431 => (
            "Request Header Fields Too Large",
            "headers_too_large",
            "the request head is larger than the server reads, or has more than 100 headers",
        ),
        400 => (
            "Bad Request",
            "bad_request",
            "the request is not valid HTTP/1.1: its request line, a header, or its \
             Content-Length or Transfer-Encoding",
        ),
        _ => ("Error", "bad_request", "the request could not be read"),
    };
    let body = serde_json::json!({"error": code, "message": message}).to_string();
    format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_heads() {
        assert_eq!(status(b"HTTP/1.1 414 URI Too Long\r\n\r\n"), Some(414));
        assert_eq!(status(b"HTTP/1.0 200 OK\r\n\r\n"), Some(200));
        assert_eq!(status(b"HTTP/2 200\r\n\r\n"), None);
        assert!(has_content_type(
            b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n\r\n"
        ));
        assert!(!has_content_type(
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n"
        ));
    }

    #[test]
    fn replaces_only_a_parser_answer() {
        let mut w = JsonErrors::new(());
        w.take_head(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n");
        assert!(w.out.is_empty(), "an incomplete head is held");
        w.take_head(b"date: x\r\n\r\n");
        assert_eq!(w.phase, Phase::Replaced);
        let text = String::from_utf8(w.out.clone()).unwrap();
        assert!(text.starts_with("HTTP/1.1 431 "), "{text}");
        assert!(text.ends_with(r#"{"error":"headers_too_large","message":"the request head is larger than the server reads, or has more than 100 headers"}"#), "{text}");

        let mut w = JsonErrors::new(());
        let own = b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
        w.take_head(own);
        assert_eq!((w.phase, &w.out[..]), (Phase::Pass, &own[..]));

        let mut w = JsonErrors::new(());
        w.take_head(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 400 Bad Request\r\n\r\n");
        assert_eq!(w.phase, Phase::Replaced);
        assert!(w.out.starts_with(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 400 Bad Request\r\ncontent-type: application/json"));
    }
}
