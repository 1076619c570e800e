//! Trace spans for publish and process (R-OPS-3).
//!
//! # Spans
//! [`Broker::publish`](crate::Broker::publish) runs in a `tracing` span named `publish`, and
//! every handler call in one named `process`, both at `INFO` level with target
//! `tidings::trace`. Their fields follow OpenTelemetry's messaging conventions:
//!
//! | field | value |
//! |---|---|
//! | `otel.name` | `publish {topic}` / `process {topic}` |
//! | `otel.kind` | `producer` / `consumer` |
//! | `messaging.system` | `tidings` |
//! | `messaging.operation.type` | `send` / `process` |
//! | `messaging.destination.name` | the topic |
//! | `messaging.message.id` | the message id (32 hex digits; process only, publish records it once stamped) |
//! | `messaging.message.conversation_id` | the correlation id, when there is one |
//! | `messaging.consumer.group.name` | the subscription's name (process only) |
//! | `attempt` | 1 for the first handler call (process only) |
//! | `outcome` | `ok`, `error`, `rejected`, `deferred` or `panic` (process only) |
//!
//! With no subscriber installed (or `INFO` disabled for `tidings::trace`), a span costs one
//! relaxed check of the callsite's interest: no field is formatted, nothing allocates.
//!
//! # W3C trace context (feature `otel`)
//! With the `otel` feature, publish puts a W3C [`TRACEPARENT`] header
//! (`00-{trace id}-{span id}-01`) on every message that does not already carry one, and the
//! `process` span of its handler continues that trace: it records `trace_id`, its own
//! `span_id`, and `parent_span_id` = the publisher's span id. A message published from
//! inside a handler joins the handler's trace. The publish span records `trace_id` and
//! `span_id`. Ids are derived from the (unique) message id, so nothing random is needed,
//! and the header crosses any backend that keeps headers — so a trace continues in
//! another process too. The header counts against the message's header limits; when it
//! would exceed them it is left out.
//!
//! # Limits
//! The ids are tidings' own and travel as span *fields*: tidings does not depend on an
//! OpenTelemetry SDK, so a `tracing-opentelemetry` layer does not link these spans by
//! itself. To join an OpenTelemetry trace, inject the current context into the
//! `traceparent` header when publishing (tidings keeps a header it is given) and, in the
//! handler, extract it from [`Message::header`] and set it as the parent of your span.

use std::cell::RefCell;

use tracing::field::Empty;

use crate::handler::HandlerError;
use crate::message::Message;
use crate::topic_name::TopicName;

/// The W3C trace-context header name.
pub const TRACEPARENT: &str = "traceparent";

/// Length of a version-00 `traceparent` value: `00-` 32 hex `-` 16 hex `-` 2 hex.
const TRACEPARENT_LEN: usize = 55;

/// The `publish {topic}` span (R-OPS-3).
///
/// `topic` is spelled out only when the span is enabled (the macro evaluates its fields
/// then): a hot topic's spelling is otherwise never checked as UTF-8 (src/topic_name.rs).
pub(crate) fn publish_span(topic: &TopicName) -> tracing::Span {
    tracing::info_span!(
        target: "tidings::trace",
        "publish",
        otel.name = %format_args!("publish {}", topic.as_str()),
        otel.kind = "producer",
        messaging.system = "tidings",
        messaging.operation.type = "send",
        messaging.destination.name = topic.as_str(),
        messaging.message.id = Empty,
        messaging.message.conversation_id = Empty,
        trace_id = Empty,
        span_id = Empty,
    )
}

/// Record the stamped id on the publish span.
pub(crate) fn record_published(span: &tracing::Span, message: &Message) {
    if span.is_disabled() {
        return;
    }
    span.record(
        "messaging.message.id",
        tracing::field::display(message.id()),
    );
    if let Some(c) = message.correlation_id() {
        span.record("messaging.message.conversation_id", c);
    }
    #[cfg(feature = "otel")]
    if let Some(tp) = message.header(TRACEPARENT).and_then(TraceParent::parse) {
        span.record("trace_id", tracing::field::display(tp.trace_hex()));
        span.record("span_id", tracing::field::display(tp.span_hex()));
    }
}

/// The `process {topic}` span of one handler call (R-OPS-3).
pub(crate) fn process_span(message: &Message, subscription: &str, attempt: u32) -> tracing::Span {
    let span = tracing::info_span!(
        target: "tidings::trace",
        "process",
        otel.name = %format_args!("process {}", message.topic().as_str()),
        otel.kind = "consumer",
        messaging.system = "tidings",
        messaging.operation.type = "process",
        messaging.destination.name = message.topic().as_str(),
        messaging.message.id = %message.id(),
        messaging.message.conversation_id = message.correlation_id(),
        messaging.consumer.group.name = subscription,
        attempt,
        outcome = Empty,
        trace_id = Empty,
        span_id = Empty,
        parent_span_id = Empty,
    );
    #[cfg(feature = "otel")]
    if !span.is_disabled()
        && let Some(tp) = message.header(TRACEPARENT).and_then(TraceParent::parse)
    {
        let own = TraceParent::child_of(&tp, message, attempt);
        span.record("trace_id", tracing::field::display(tp.trace_hex()));
        span.record("span_id", tracing::field::display(own.span_hex()));
        span.record("parent_span_id", tracing::field::display(tp.span_hex()));
    }
    span
}

/// Run one handler call inside its `process` span, recording the outcome; under `otel`
/// the call also runs with the message's trace as the current one, so what it publishes
/// joins that trace.
pub(crate) fn in_process_span(
    message: &Message,
    subscription: &str,
    attempt: u32,
    call: impl FnOnce() -> Result<(), HandlerError>,
) -> Result<(), HandlerError> {
    let span = process_span(message, subscription, attempt);
    let _entered = span.enter();
    let _context = CurrentTrace::set(CurrentTrace::of(message, attempt));
    let outcome = call();
    if !span.is_disabled() {
        span.record("outcome", outcome_name(&outcome));
    }
    outcome
}

/// The async form of [`in_process_span`] (tokio driver): every poll of `call` runs inside
/// the `process` span and, under `otel`, with the message's trace as the current one; with
/// the `metrics` feature the duration from first poll to completion is recorded.
#[cfg(feature = "tokio")]
pub(crate) async fn in_process_span_async(
    message: &Message,
    subscription: &str,
    metric: &super::ProcessMetric,
    attempt: u32,
    call: impl std::future::Future<Output = Result<(), HandlerError>>,
) -> Result<(), HandlerError> {
    let span = process_span(message, subscription, attempt);
    let trace = CurrentTrace::of(message, attempt);
    let started = super::Started::now();
    let mut call = std::pin::pin!(call);
    let outcome = std::future::poll_fn(|cx| {
        let _entered = span.enter();
        let _context = CurrentTrace::set(trace);
        call.as_mut().poll(cx)
    })
    .await;
    started.record(metric);
    if !span.is_disabled() {
        span.record("outcome", outcome_name(&outcome));
    }
    outcome
}

fn outcome_name(outcome: &Result<(), HandlerError>) -> &'static str {
    match outcome {
        Ok(()) => "ok",
        Err(e) if e.is_deferral() => "deferred",
        Err(e) if e.message().starts_with("handler panicked: ") => "panic",
        Err(e) if !e.is_retryable() => "rejected",
        Err(_) => "error",
    }
}

thread_local! {
    /// The trace a handler running on this thread belongs to (feature `otel`).
    static CURRENT: RefCell<Option<TraceParent>> = const { RefCell::new(None) };
}

/// Restores the previous current trace on drop.
struct CurrentTrace(Option<Option<TraceParent>>);

impl CurrentTrace {
    /// The handler call's own trace context (feature `otel`; none without it, or when the
    /// message carries no valid `traceparent`).
    fn of(message: &Message, attempt: u32) -> Option<TraceParent> {
        if !cfg!(feature = "otel") {
            return None;
        }
        let tp = message.header(TRACEPARENT).and_then(TraceParent::parse)?;
        Some(TraceParent::child_of(&tp, message, attempt))
    }

    /// Make `own` the current trace on this thread until the guard drops.
    fn set(own: Option<TraceParent>) -> Self {
        match own {
            None => Self(None),
            Some(own) => Self(Some(CURRENT.with(|c| c.replace(Some(own))))),
        }
    }
}

impl Drop for CurrentTrace {
    fn drop(&mut self) {
        if let Some(previous) = self.0.take() {
            CURRENT.with(|c| *c.borrow_mut() = previous);
        }
    }
}

/// A parsed W3C `traceparent` (version 00).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TraceParent {
    trace: u128,
    span: u64,
    flags: u8,
}

impl TraceParent {
    /// Parse `00-<32 hex>-<16 hex>-<2 hex>`; all-zero ids are invalid (W3C).
    pub(crate) fn parse(s: &str) -> Option<Self> {
        let mut parts = s.trim().split('-');
        let (version, trace, span, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some()
            || version != "00"
            || trace.len() != 32
            || span.len() != 16
            || flags.len() != 2
        {
            return None;
        }
        let hex = |s: &str| s.bytes().all(|b| b.is_ascii_hexdigit());
        if !(hex(trace) && hex(span) && hex(flags)) {
            return None;
        }
        let tp = Self {
            trace: u128::from_str_radix(trace, 16).ok()?,
            span: u64::from_str_radix(span, 16).ok()?,
            flags: u8::from_str_radix(flags, 16).ok()?,
        };
        (tp.trace != 0 && tp.span != 0).then_some(tp)
    }

    /// The header value, formatted in one allocation (this runs on every publish): into
    /// its exact length, where `format!` would start from a guess and grow three times.
    fn header(&self) -> String {
        use std::fmt::Write;
        let mut value = String::with_capacity(TRACEPARENT_LEN);
        let _ = write!(
            value,
            "00-{:032x}-{:016x}-{:02x}",
            self.trace, self.span, self.flags
        );
        value
    }

    #[cfg_attr(not(feature = "otel"), allow(dead_code))]
    pub(crate) fn trace_hex(&self) -> String {
        format!("{:032x}", self.trace)
    }

    #[cfg_attr(not(feature = "otel"), allow(dead_code))]
    pub(crate) fn span_hex(&self) -> String {
        format!("{:016x}", self.span)
    }

    /// The span id of the handler call `attempt` of `message`, a child of `parent`.
    fn child_of(parent: &Self, message: &Message, attempt: u32) -> Self {
        Self {
            trace: parent.trace,
            span: span_id(message.id().as_u128() ^ u128::from(attempt) << 64 ^ 0x5052),
            flags: parent.flags,
        }
    }
}

/// A non-zero 64-bit span id mixed from `seed` (splitmix64 over both halves).
fn span_id(seed: u128) -> u64 {
    let mix = |mut z: u64| {
        z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let v = mix(seed as u64 ^ mix((seed >> 64) as u64));
    if v == 0 { 1 } else { v }
}

/// Feature `otel`: give `message` a `traceparent` header unless it has one or the header
/// would break `limits`. Without the feature, does nothing. In place: publish calls it on
/// the message it wrote into its allocation.
pub(crate) fn stamp(message: &mut Message, limits: &crate::limits::Limits) {
    #[cfg(feature = "otel")]
    {
        if message.header(TRACEPARENT).is_none() {
            let value = traceparent_for(message.id());
            let fits = message.headers.len() < limits.max_headers
                && message.headers.byte_len() + TRACEPARENT.len() + value.len()
                    <= limits.max_header_bytes;
            if fits {
                message.headers.insert(TRACEPARENT, value);
            }
        }
    }
    #[cfg(not(feature = "otel"))]
    let _ = (message, limits);
}

/// Feature `otel`: the `traceparent` a message stamped with `id` gets at publish, unless
/// it already has one: a child of the handler's trace when published from a handler,
/// otherwise a new trace whose id is the message id.
#[cfg_attr(not(feature = "otel"), allow(dead_code))]
pub(crate) fn traceparent_for(id: crate::message::MessageId) -> String {
    let seed = id.as_u128();
    let tp = CURRENT.with(|c| *c.borrow()).map_or(
        TraceParent {
            trace: if seed == 0 { 1 } else { seed },
            span: span_id(seed),
            flags: 1,
        },
        |current| TraceParent {
            trace: current.trace,
            span: span_id(seed),
            flags: current.flags,
        },
    );
    tp.header()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_parses_and_refuses_bad_input() {
        let tp = TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
            .expect("valid header");
        assert_eq!(tp.trace_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(tp.span_hex(), "00f067aa0ba902b7");
        assert_eq!(
            tp.header(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "00-+bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad}");
        }
    }
}
