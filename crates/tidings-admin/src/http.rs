//! Routes, request parsing and JSON errors.

use std::collections::HashMap;
use std::time::{Duration, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::json;
use tidings::ops::{DeadLetterError, MAX_PAGE_SIZE, PageError, RedriveSelection, SeekError};
use tidings::{Broker, MessageId, StartAt, StreamError};
use tidings_log::Excerpt;

use crate::server::{AdminConfig, MetricsRender};

/// The dashboard page, compiled into the binary.
const DASHBOARD: &str = include_str!("dashboard.html");

/// Default dead-letter page size.
const DEFAULT_PAGE: usize = 50;

#[derive(Clone)]
struct App {
    broker: Broker,
    token: Option<String>,
    metrics: Option<MetricsRender>,
}

pub(crate) fn router(broker: Broker, config: AdminConfig) -> Router {
    let app = App {
        broker,
        token: config.token,
        metrics: config.metrics,
    };
    Router::new()
        .route("/", get(dashboard))
        .route("/api/info", get(info))
        .route("/api/snapshot", get(snapshot))
        .route("/api/subscriptions/{id}/dead-letters", get(dead_letters))
        .route(
            "/api/subscriptions/{id}/dead-letters/redrive",
            post(redrive),
        )
        .route("/api/subscriptions/{id}/dead-letters/purge", post(purge))
        .route("/api/subscriptions/{id}/seek", post(seek))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(app)
        .layer(axum::middleware::from_fn(header_limit))
}

/// The most header bytes (names, values and their separators) a request may carry.
const MAX_HEADER_BYTES: usize = 64 * 1024;

/// Refuses a request whose headers exceed [`MAX_HEADER_BYTES`] with the documented `431`
/// body. The parser's own buffer limit (about 400 KB) is not exact — a head that arrives in
/// one read may pass it — so the answer to a large head would depend on how the bytes
/// arrived; this limit does not.
async fn header_limit(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let size: usize = request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum();
    if size > MAX_HEADER_BYTES {
        return ApiError::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers_too_large",
            format!("the request's headers are {size} bytes, more than {MAX_HEADER_BYTES}"),
        )
        .into_response();
    }
    next.run(request).await
}

/// A JSON error answer.
struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    /// An error answer. A message longer than [`MAX_MESSAGE`] (one that quotes a rejection's
    /// text, which may hold what the request sent) is cut, as an [`Excerpt`] (R-SEC-2).
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        let mut message = message.into();
        if message.len() > MAX_MESSAGE {
            message = Excerpt::of(&message).to_string();
        }
        Self {
            status,
            code,
            message,
        }
    }
}

/// Longest error message sent whole.
const MAX_MESSAGE: usize = 256;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut res = (
            self.status,
            axum::Json(json!({"error": self.code, "message": self.message})),
        )
            .into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            res.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
        }
        res
    }
}

impl From<DeadLetterError> for ApiError {
    fn from(e: DeadLetterError) -> Self {
        match e {
            DeadLetterError::UnknownSubscription(_) => {
                ApiError::new(StatusCode::NOT_FOUND, "unknown_subscription", e.to_string())
            }
            DeadLetterError::Closed(_) => {
                ApiError::new(StatusCode::CONFLICT, "closed", e.to_string())
            }
            DeadLetterError::DurableLog { .. } => ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "durable_dlq_failed",
                e.to_string(),
            ),
            other => ApiError::new(StatusCode::BAD_REQUEST, "bad_request", other.to_string()),
        }
    }
}

impl From<PageError> for ApiError {
    fn from(e: PageError) -> Self {
        match e {
            PageError::UnknownSubscription(_) => {
                ApiError::new(StatusCode::NOT_FOUND, "unknown_subscription", e.to_string())
            }
            PageError::PageTooLarge { .. } => {
                ApiError::new(StatusCode::BAD_REQUEST, "page_too_large", e.to_string())
            }
            PageError::DurableLog { .. } => ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "durable_dlq_failed",
                e.to_string(),
            ),
            other => ApiError::new(StatusCode::BAD_REQUEST, "bad_request", other.to_string()),
        }
    }
}

impl From<SeekError> for ApiError {
    fn from(e: SeekError) -> Self {
        match &e {
            SeekError::UnknownSubscription(_) => {
                ApiError::new(StatusCode::NOT_FOUND, "unknown_subscription", e.to_string())
            }
            SeekError::NotDurable(_) => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "not_durable",
                e.to_string(),
            ),
            SeekError::Stream(
                StreamError::OutOfRetention { .. } | StreamError::BeyondEnd { .. },
            ) => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "out_of_range",
                e.to_string(),
            ),
            _ => ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "seek_failed",
                e.to_string(),
            ),
        }
    }
}

type ApiResult = Result<Response, ApiError>;

fn json_ok(value: impl serde::Serialize) -> ApiResult {
    Ok(axum::Json(value).into_response())
}

async fn dashboard() -> impl IntoResponse {
    ([(header::CACHE_CONTROL, "no-store")], Html(DASHBOARD))
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this endpoint does not take that method",
    )
}

/// The path's `{id}` segment, or a JSON error when it cannot be decoded.
type IdPath = Result<Path<String>, PathRejection>;

/// The raw request body, or a JSON error (e.g. 413 beyond axum's 2 MB default limit).
type Body = Result<Bytes, BytesRejection>;

fn path_id(path: IdPath) -> Result<u64, ApiError> {
    let Path(raw) = path.map_err(|e| ApiError::new(e.status(), "bad_request", e.body_text()))?;
    subscription_id(&raw)
}

fn body_bytes(body: Body) -> Result<Bytes, ApiError> {
    body.map_err(|e| {
        let code = if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            "body_too_large"
        } else {
            "bad_request"
        };
        ApiError::new(e.status(), code, e.body_text())
    })
}

async fn info(State(app): State<App>) -> ApiResult {
    json_ok(json!({
        "actions_enabled": app.token.is_some(),
        "metrics": app.metrics.is_some(),
        "version": env!("CARGO_PKG_VERSION"),
    }))
}

async fn snapshot(State(app): State<App>) -> ApiResult {
    json_ok(app.broker.snapshot())
}

async fn metrics(State(app): State<App>) -> ApiResult {
    let Some(render) = app.metrics.clone() else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "metrics are not configured on this server",
        ));
    };
    let text = tokio::task::spawn_blocking(move || render())
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?;
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

/// A subscription id from the path: digits only.
fn subscription_id(raw: &str) -> Result<u64, ApiError> {
    raw.parse::<u64>().map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!(
                "subscription id must be a non-negative integer, got {}",
                Excerpt::of(raw)
            ),
        )
    })
}

fn query_params(raw: Option<String>) -> HashMap<String, String> {
    raw.unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (k.to_owned(), v.to_owned())
        })
        .collect()
}

fn usize_param(
    params: &HashMap<String, String>,
    name: &str,
    default: usize,
) -> Result<usize, ApiError> {
    match params.get(name) {
        None => Ok(default),
        Some(v) => v.parse::<usize>().map_err(|_| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!(
                    "{name} must be a non-negative integer, got {}",
                    Excerpt::of(v)
                ),
            )
        }),
    }
}

async fn dead_letters(State(app): State<App>, id: IdPath, RawQuery(query): RawQuery) -> ApiResult {
    let id = path_id(id)?;
    let params = query_params(query);
    let offset = usize_param(&params, "offset", 0)?;
    let limit = usize_param(&params, "limit", DEFAULT_PAGE)?;
    if limit > MAX_PAGE_SIZE {
        return Err(PageError::PageTooLarge {
            requested: limit,
            max: MAX_PAGE_SIZE,
        }
        .into());
    }
    let broker = app.broker.clone();
    // A durable subscription's page replays its log file: off the async thread.
    let page = tokio::task::spawn_blocking(move || broker.dead_letter_page(id, offset, limit))
        .await
        .map_err(|e| {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
        })??;
    json_ok(page)
}

/// Check that actions are enabled and the request carries the token.
fn authorize(app: &App, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(token) = &app.token else {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "actions_disabled",
            "actions are disabled on this server (read-only)",
        ));
    };
    // RFC 9110: the scheme is case-insensitive.
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim());
    match given {
        Some(g) if constant_time_eq(g.as_bytes(), token.as_bytes()) => Ok(()),
        Some(_) => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "wrong bearer token",
        )),
        None => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "this action needs an `Authorization: Bearer <token>` header",
        )),
    }
}

/// Compare without stopping at the first difference.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn parse_json<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "bad_json", e.to_string()))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RedriveBody {
    #[serde(default)]
    all: bool,
    #[serde(default)]
    ids: Option<Vec<String>>,
}

fn parse_message_id(s: &str) -> Result<MessageId, ApiError> {
    if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("a dead-letter id is 32 hex digits, got {}", Excerpt::of(s)),
        ));
    }
    u128::from_str_radix(s, 16)
        .map(MessageId::from_u128)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "bad_request", e.to_string()))
}

async fn redrive(State(app): State<App>, id: IdPath, headers: HeaderMap, body: Body) -> ApiResult {
    authorize(&app, &headers)?;
    let id = path_id(id)?;
    let body = body_bytes(body)?;
    let body: RedriveBody = parse_json(&body)?;
    let selection = match (body.all, body.ids) {
        (true, None) => RedriveSelection::All,
        (false, Some(ids)) if !ids.is_empty() => RedriveSelection::Ids(
            ids.iter()
                .map(|s| parse_message_id(s))
                .collect::<Result<_, _>>()?,
        ),
        _ => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_request",
                "give either {\"all\": true} or a non-empty {\"ids\": [...]}",
            ));
        }
    };
    let requested = match &selection {
        RedriveSelection::Ids(ids) => ids.len(),
        _ => 0,
    };
    let broker = app.broker.clone();
    // A re-offer may wait under `Overflow::Block`: keep it off the async thread.
    let outcome = tokio::task::spawn_blocking(move || broker.redrive_dead_letters(id, &selection))
        .await
        .map_err(|e| {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
        })??;
    if requested > 0 && outcome.missing.len() == requested {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "gone",
            format!(
                "none of the requested entries is in the dead-letter queue any more: {:?}",
                outcome.missing
            ),
        ));
    }
    json_ok(outcome)
}

async fn purge(State(app): State<App>, id: IdPath, headers: HeaderMap) -> ApiResult {
    authorize(&app, &headers)?;
    let id = path_id(id)?;
    let broker = app.broker.clone();
    // A durable subscription's purge reads and appends to its log: off the async thread.
    let purged = tokio::task::spawn_blocking(move || broker.purge_dead_letters(id))
        .await
        .map_err(|e| {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
        })??;
    json_ok(json!({ "purged": purged }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SeekBody {
    #[serde(default)]
    to: Option<String>,
    #[serde(default)]
    offset: Option<u64>,
    #[serde(default)]
    time_ms: Option<u64>,
}

async fn seek(State(app): State<App>, id: IdPath, headers: HeaderMap, body: Body) -> ApiResult {
    authorize(&app, &headers)?;
    let id = path_id(id)?;
    let body = body_bytes(body)?;
    let body: SeekBody = parse_json(&body)?;
    let at = match (body.to.as_deref(), body.offset, body.time_ms) {
        (Some("earliest"), None, None) => StartAt::Earliest,
        (Some("latest"), None, None) => StartAt::Latest,
        (None, Some(o), None) => StartAt::Offset(o),
        (None, None, Some(t)) => StartAt::Time(UNIX_EPOCH + Duration::from_millis(t)),
        _ => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_request",
                "give exactly one of {\"to\": \"earliest\"|\"latest\"}, {\"offset\": n}, {\"time_ms\": t}",
            ));
        }
    };
    let broker = app.broker.clone();
    let position = tokio::task::spawn_blocking(move || broker.seek_subscription(id, at))
        .await
        .map_err(|e| {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
        })??;
    json_ok(json!({ "position": position }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_comparison_needs_exact_match() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"secret"));
    }

    #[test]
    fn message_ids_must_be_32_hex_digits() {
        assert!(parse_message_id("0000000000000000000000000000002a").is_ok());
        for bad in [
            "",
            "2a",
            "zz000000000000000000000000000000",
            "+0000000000000000000000000000002a",
        ] {
            assert!(parse_message_id(bad).is_err(), "{bad}");
        }
    }
}
