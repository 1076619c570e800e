//! Publish with ack, one in flight: `tidings-jetstream`'s `append` against raw `async-nats`
//! doing the same work (same subject, same `Nats-Msg-Id` header, same payload, awaited ack),
//! on one local `nats-server` with `sync_interval: always` started by the testkit launcher.
//!
//! ```text
//! cargo run --release -p tidings-jetstream --example publish_bench -- [messages-per-round] [rounds]
//! ```
//!
//! Rounds alternate between the two so drift in the machine's load hits both alike; the
//! report gives each side's median round and the ratio tidings/raw.

use std::time::Instant;

use async_nats::HeaderMap;
use tidings::{MessageId, Pattern, Topic};
use tidings_jetstream::{ConnectOptions, Record, StreamSpec};
use tidings_testkit::nats::{NatsServer, NatsServerOptions};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
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
    drop(server);
    Ok(())
}
