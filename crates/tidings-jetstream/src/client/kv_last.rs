//! The last entry of every key of a key-value bucket in one request, without a consumer.
//!
//! async-nats lists a bucket's keys (`kv::Store::keys`) through an ordered push consumer
//! made for the one listing, which the server deletes only after its inactivity
//! threshold: a keyed group listing its bucket every lease round kept about 120 such
//! consumers standing with three members (README, "Soak"). This reads the same thing —
//! the last message of each key's subject — with JetStream's batched Direct Get
//! (`multi_last`, nats-server 2.11 and later): one request to
//! `$JS.API.DIRECT.GET.<stream>`, whose answers stream to an inbox, one message per
//! subject (headers `Nats-Subject`, `Nats-Sequence`, and `KV-Operation` on a delete or
//! purge marker), ended by a status `204` (end of batch). Nothing is created on the
//! server.
//!
//! Entries older than the bucket's `max_age` are removed by the server and never answered.
//!
//! [`LastError::Unsupported`] says when the request cannot answer, so the caller lists the
//! old way: a server older than 2.11, a bucket without `allow_direct` (one made elsewhere:
//! its configuration is not changed here, it is not ours to change), or more keys than the
//! server answers in one batch (it refuses above [`MAX_KEYS`]: status `413`).

use async_nats::jetstream::kv;
use bytes::Bytes;
use futures_util::StreamExt;

use crate::connection::connect::JetStream;
use crate::connection::version::ServerVersion;

/// The first server with batched Direct Get (`multi_last`).
const DIRECT_BATCH: ServerVersion = ServerVersion {
    major: 2,
    minor: 11,
    patch: 0,
};

/// Most subjects one `multi_last` request answers (nats-server refuses more with `413`).
pub(crate) const MAX_KEYS: usize = 1024;

/// The last entry of one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KvLast {
    /// The key (the subject without the bucket's prefix).
    pub(crate) key: String,
    /// The entry's value (empty for a delete or purge marker).
    pub(crate) value: Bytes,
    /// The entry's revision (its stream sequence), for a compare-and-set.
    pub(crate) revision: u64,
    /// A put; `false` for a delete or purge marker (the key is gone).
    pub(crate) put: bool,
}

/// Why [`last_per_key`] has no listing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LastError {
    /// This server or bucket cannot answer this way: list through a consumer.
    Unsupported,
    /// No (complete) answer within the request timeout, or the connection is away.
    Unanswered,
}

/// The last entry of every key of `store`, delete and purge markers included (see the
/// module docs). Bounded by the connection's request timeout.
///
/// # Cancel safety
/// Cancel-safe: dropping it unsubscribes the inbox; the server's answers, if any, are
/// dropped.
pub(crate) async fn last_per_key(
    js: &JetStream,
    store: &kv::Store,
) -> Result<Vec<KvLast>, LastError> {
    if js.server_version() < DIRECT_BATCH || !store.stream.cached_info().config.allow_direct {
        return Err(LastError::Unsupported);
    }
    let inbox = js.client.new_inbox();
    let body = serde_json::json!({
        "multi_last": [format!("{}>", store.prefix)],
        "batch": MAX_KEYS,
    })
    .to_string();
    let read = async {
        // On the receiving connection: the answers are records of the bucket, which
        // anyone with publish rights can write (see `connection::connect`, issue 34).
        let rx = js.receiving().await.map_err(|_| LastError::Unanswered)?;
        let mut answers = rx
            .client
            .subscribe(inbox.clone())
            .await
            .map_err(|_| LastError::Unanswered)?;
        rx.client
            .publish_with_reply(
                format!("$JS.API.DIRECT.GET.{}", store.stream_name),
                inbox,
                body.into(),
            )
            .await
            .map_err(|_| LastError::Unanswered)?;
        let mut entries = Vec::new();
        while let Some(m) = answers.next().await {
            match m.status.map(|s| s.as_u16()) {
                None | Some(200) => entries.push(entry(&store.prefix, &m)?),
                // End of batch: complete only when nothing is left pending.
                Some(204) => {
                    return if header(&m, "Nats-Num-Pending").is_none_or(|n| n == "0") {
                        Ok(entries)
                    } else {
                        Err(LastError::Unsupported)
                    };
                }
                // No key at all (every entry expired, or none written yet).
                Some(404) => return Ok(Vec::new()),
                Some(413) => return Err(LastError::Unsupported),
                Some(_) => return Err(LastError::Unanswered),
            }
        }
        Err(LastError::Unanswered)
    };
    tokio::time::timeout(js.request_timeout, read)
        .await
        .unwrap_or(Err(LastError::Unanswered))
}

fn header<'a>(m: &'a async_nats::Message, name: &str) -> Option<&'a str> {
    m.headers.as_ref()?.get(name).map(|v| v.as_str())
}

/// One answer of the batch as an entry; an answer without its subject or sequence is no
/// complete answer.
fn entry(prefix: &str, m: &async_nats::Message) -> Result<KvLast, LastError> {
    let key = header(m, "Nats-Subject")
        .and_then(|s| s.strip_prefix(prefix))
        .ok_or(LastError::Unanswered)?;
    let revision = header(m, "Nats-Sequence")
        .and_then(|s| s.parse().ok())
        .ok_or(LastError::Unanswered)?;
    let put = !matches!(header(m, "KV-Operation"), Some("DEL" | "PURGE"));
    Ok(KvLast {
        key: key.to_owned(),
        value: m.payload.clone(),
        revision,
        put,
    })
}
