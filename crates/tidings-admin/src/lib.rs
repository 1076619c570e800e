//! # tidings-admin
//!
//! An HTTP admin API and a live dashboard for a running [`tidings::Broker`] (R-OPS-4).
//!
//! # Security
//! The server binds to `127.0.0.1` unless told otherwise, and is **read-only** unless
//! actions are enabled with [`AdminConfig::enable_actions`], which requires a bearer token.
//! An action request without the token, or with a wrong one, gets `401` and changes nothing;
//! with actions disabled, every action gets `403`.
//!
//! # Endpoints
//! | method & path | answer |
//! |---|---|
//! | `GET /` | the dashboard: one self-contained HTML page (no CDN, no build step); `?poll=<ms>` sets how often it polls (100..60000, default 1000) |
//! | `GET /api/info` | `{"actions_enabled": bool, "version": ..}` |
//! | `GET /api/snapshot` | [`tidings::ops::BrokerSnapshot`] |
//! | `GET /api/subscriptions/{id}/dead-letters?offset=0&limit=50` | [`tidings::ops::DeadLetterPage`] (`limit` ≤ 1000) |
//! | `POST /api/subscriptions/{id}/dead-letters/redrive` | body `{"all": true}` or `{"ids": ["<32 hex>", ..]}` → [`tidings::ops::RedriveOutcome`] |
//! | `POST /api/subscriptions/{id}/dead-letters/purge` | `{"purged": n}` |
//! | `POST /api/subscriptions/{id}/seek` | body `{"to": "earliest"}`, `{"to": "latest"}`, `{"offset": n}` or `{"time_ms": t}` → `{"position": n}` |
//! | `GET /metrics` | whatever [`AdminConfig::metrics`] renders (e.g. Prometheus text) |
//!
//! # Dashboard charts
//! The page keeps, per subscription, a ring of the snapshots it polled over the last 5
//! minutes (of the broker's clock, `taken_at_ms`) and draws, in SVG, the per-second rates of
//! `offered` (shown as *published*), `delivered`, `redelivered` and the dead-lettered total,
//! from the counters' differences between polls, and the depth (`queued`) and, for a
//! durable subscription, its lag. A counter that goes down is a reset: no rate is drawn
//! across it. A subscription that is gone loses its ring; a new one starts its own.
//!
//! # Durable subscriptions
//! For the id of a durable subscription, the three dead-letter endpoints act on its
//! **durable** dead-letter log (R-DEL-4), the one that survives restarts: the page lists
//! its entries (`"durable": true`, with `stream_offset`), redrive appends the selected
//! entries to the stream again and syncs it before their removal is recorded, and purge
//! drains the log (the subscription's in-memory copies go with them). A durable log that
//! cannot be read or written gets `durable_dlq_failed` (500); a closing durable
//! subscription gets `closed` (409).
//!
//! # Failure
//! Every bad request gets a 4xx answer with a JSON body `{"error": "<code>", "message":
//! "<text>"}`: `bad_request`/`bad_json`/`page_too_large` (400), `unauthorized` (401),
//! `actions_disabled` (403), `unknown_subscription`/`not_found` (404),
//! `method_not_allowed` (405), `gone` (409: none of the requested dead-letter entries is in
//! the DLQ any more), `body_too_large` (413, beyond 2 MB), `uri_too_long` (414, a target
//! beyond 65,534 bytes), `headers_too_large` (431, headers beyond 64 KiB, or a head the
//! parser cannot buffer, or more than 100 headers), `not_durable`/`out_of_range` (422). A seek whose position cannot be
//! written gets `seek_failed` (500). That holds for requests the HTTP parser refuses before
//! any handler sees them, too (a bad request line, method, target or header, a bad
//! `Content-Length` or `Transfer-Encoding`: `bad_request`, 400). A message quotes what the
//! request sent only bounded (`tidings_log::Excerpt`: at most 64 bytes and the length).
//! Handlers never panic on input.
//!
//! The server answers one request per connection (`connection: close`).
//!
//! # Redrive
//! Loss-safe and race-free: each entry is taken out of the DLQ atomically and then
//! re-offered (see [`tidings::Broker::redrive_dead_letters`]); two concurrent redrives of
//! the same entry re-offer it once, and the loser sees it under `missing`.
#![forbid(unsafe_code)]

mod http;
mod server;
mod wire;

pub use server::{AdminConfig, AdminServer, StartError};
