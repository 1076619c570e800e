//! Publish with ack, one in flight: `tidings-jetstream`'s `append` against raw `async-nats`
//! doing the same work (same subject, same `Nats-Msg-Id` header, same payload, awaited ack),
//! on one local `nats-server` with `sync_interval: always` started by the testkit launcher.
//! Then durable consume + ack: each side drains what it published through its own durable
//! pull consumer, batches of 100, each delivery acknowledged with a confirmed ack.
//!
//! ```text
//! cargo run --release -p tidings-jetstream --example publish_bench -- [messages-per-round] [rounds]
//! ```
//!
//! Rounds alternate between the two so drift in the machine's load hits both alike; the
//! report gives each side's median round and the ratio tidings/raw.

use std::time::Instant;

use async_nats::HeaderMap;
use futures_util::StreamExt;
use tidings::{MessageId, Pattern, Topic};
use tidings_jetstream::{ConnectOptions, ConsumerSpec, Record, StreamSpec};
use tidings_testkit::nats::{NatsServer, NatsServerOptions};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut args = std::env::args().skip(1);
    let per_round: u128 = args.next().map_or(Ok(2_000), |s| s.parse())?;
    let rounds: usize = args.next().map_or(Ok(5), |s| s.parse())?;
    let server = NatsServer::start(NatsServerOptions::new())?;

    let js = ConnectOptions::new(server.url()).connect().await?;
    js.ensure_stream(&StreamSpec::new("bench", [Pattern::new("bench.#")?]))
        .await?;
    let raw = async_nats::jetstream::new(async_nats::connect(server.url()).await?);
    let payload = vec![7u8; 128];
    let topic = Topic::new("bench.tidings")?;

    let mut next_id: u128 = 1;
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let started = Instant::now();
        for _ in 0..per_round {
            let record =
                Record::new(MessageId::from_u128(next_id), topic.clone()).payload(payload.clone());
            next_id += 1;
            js.append(&record).await?;
        }
        ours.push(per_round as f64 / started.elapsed().as_secs_f64());

        let started = Instant::now();
        for _ in 0..per_round {
            let mut headers = HeaderMap::new();
            headers.insert(
                async_nats::header::NATS_MESSAGE_ID,
                MessageId::from_u128(next_id).to_string().as_str(),
            );
            next_id += 1;
            raw.publish_with_headers("bench.raw", headers, payload.clone().into())
                .await?
                .await?;
        }
        theirs.push(per_round as f64 / started.elapsed().as_secs_f64());
        eprintln!(
            "round {round}: tidings-jetstream {:.0} msg/s, raw async-nats {:.0} msg/s",
            ours[round], theirs[round]
        );
    }
    let (ours, theirs) = (median(ours), median(theirs));
    println!(
        "publish with ack, 1 in flight, {per_round} x {rounds} rounds, 128 B, fsync always: \
         tidings-jetstream {ours:.0} msg/s, raw async-nats {theirs:.0} msg/s, ratio {:.2}",
        ours / theirs
    );

    let total = per_round as usize * rounds;
    let durable = js
        .durable(ConsumerSpec::new(
            "bench",
            "ours",
            Pattern::new("bench.tidings")?,
        ))
        .await?;
    let started = Instant::now();
    let mut consumed = 0;
    while consumed < total {
        let fetched = durable
            .fetch(100, std::time::Duration::from_secs(5))
            .await?;
        if fetched.deliveries.is_empty() {
            return Err("tidings-jetstream consumer ran dry".into());
        }
        for d in fetched.deliveries {
            d.ack().await?;
            consumed += 1;
        }
    }
    let ours = total as f64 / started.elapsed().as_secs_f64();

    let raw_consumer: async_nats::jetstream::consumer::PullConsumer = raw
        .create_consumer_on_stream(
            async_nats::jetstream::consumer::pull::Config {
                durable_name: Some("raw".into()),
                filter_subject: "bench.raw".into(),
                ack_policy: async_nats::jetstream::consumer::AckPolicy::Explicit,
                ..Default::default()
            },
            "bench",
        )
        .await?;
    let started = Instant::now();
    let mut consumed = 0;
    while consumed < total {
        let mut batch = raw_consumer
            .batch()
            .max_messages(100)
            .expires(std::time::Duration::from_secs(5))
            .messages()
            .await?;
        while let Some(message) = batch.next().await {
            message?.double_ack().await?;
            consumed += 1;
        }
    }
    let theirs = total as f64 / started.elapsed().as_secs_f64();
    println!(
        "durable consume + confirmed ack, batches of 100, {total} messages: \
         tidings-jetstream {ours:.0} msg/s, raw async-nats {theirs:.0} msg/s, ratio {:.2}",
        ours / theirs
    );
    drop(server);
    Ok(())
}
