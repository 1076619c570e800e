//! The nats-server launcher starts, restarts on the same port and store dir, and stops.

use std::io::{BufRead, BufReader};
use std::net::TcpStream;

use tidings_testkit::nats::{NatsServer, NatsServerOptions};

fn info_line(port: u16) -> String {
    let stream = TcpStream::connect(("127.0.0.1", port)).expect("server accepts connections");
    let mut line = String::new();
    BufReader::new(stream)
        .read_line(&mut line)
        .expect("INFO line");
    line
}

#[test]
fn starts_restarts_and_stops_on_drop() {
    let Some(mut server) = NatsServer::for_test(NatsServerOptions::new().token("t0ken")) else {
        return;
    };
    let port = server.port();
    assert!(server.url().starts_with("nats://127.0.0.1:"));
    let info = info_line(port);
    assert!(info.contains("\"jetstream\":true"), "{info}");
    assert!(info.contains("\"auth_required\":true"), "{info}");
    assert!(server.store_dir().is_dir());
    let config = std::fs::read_to_string(server.config_path()).expect("config file");
    assert!(config.contains("sync_interval: always"), "{config}");
    assert!(config.contains("listen: 127.0.0.1:"), "{config}");
    let store = server.store_dir().display().to_string();
    assert!(
        server.log().contains(&store),
        "store dir in use: {}",
        server.log()
    );

    server.kill().expect("kill");
    assert!(!server.is_running());
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
    server.restart().expect("restart on the same port");
    assert_eq!(server.port(), port);
    assert!(info_line(port).contains("\"jetstream\":true"));

    let dir = server.store_dir();
    drop(server);
    assert!(
        TcpStream::connect(("127.0.0.1", port)).is_err(),
        "killed on drop"
    );
    assert!(!dir.exists(), "directory removed on drop");
}

// R-DIST-7: the cluster the failover tests run on: three nodes, each with its own store,
// that elect a JetStream meta leader, survive a node's SIGKILL and take it back.
#[test]
fn a_three_node_cluster_starts_loses_a_node_and_takes_it_back() {
    let Some(mut cluster) = tidings_testkit::nats::NatsCluster::for_test(3) else {
        return;
    };
    assert_eq!(cluster.len(), 3);
    let urls = cluster.urls();
    assert_eq!(urls.len(), 3);
    for i in 0..3 {
        let node = cluster.node(i);
        assert!(node.is_running());
        assert!(info_line(node.port()).contains("\"jetstream\":true"));
        let config = std::fs::read_to_string(node.config_path()).expect("config");
        assert!(config.contains("sync_interval: always"), "{config}");
        assert!(config.contains(&format!("server_name: {}", cluster.name(i))));
        assert!(config.contains("nats-route://127.0.0.1:"), "{config}");
    }
    let stores: Vec<_> = (0..3).map(|i| cluster.node(i).store_dir()).collect();
    assert!(
        stores[0] != stores[1] && stores[1] != stores[2],
        "a store dir each"
    );

    let port = cluster.node(1).port();
    cluster.kill(1).expect("kill node 1");
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
    cluster.restart(1).expect("node 1 rejoins");
    assert!(info_line(port).contains("\"jetstream\":true"));
    drop(cluster);
    for store in stores {
        assert!(!store.exists(), "every node's directory removed on drop");
    }
}

/// The route names node `i` reports (`remote_name` of each route in `/routez`), sorted,
/// one per connection.
fn routes_of(cluster: &tidings_testkit::nats::NatsCluster, i: usize) -> Vec<String> {
    let text = cluster.monitor_text(i, "/routez").unwrap_or_default();
    let routez: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    let mut names: Vec<String> = routez["routes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["remote_name"].as_str().map(str::to_owned))
        .collect();
    names.sort();
    names
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "not within 60 s: {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

// R-DIST-9: a cluster whose node n0 reaches the others only through fault proxies: cutting
// them leaves n0 with no route at all (no route bypasses them) and the others with none to
// n0, while they keep theirs; healing brings n0's routes back.
#[test]
fn a_proxied_node_is_partitioned_by_its_proxies_alone() {
    let Some(cluster) = tidings_testkit::nats::NatsCluster::for_test_with_proxied_node(3, 0) else {
        return;
    };
    assert_eq!(cluster.proxied_node(), Some(0));
    let proxies = cluster.route_proxies();
    assert_eq!(
        proxies.len(),
        3,
        "one in front of n0, one in front of each other"
    );
    wait_for("n0 routed to both others", || {
        let r = routes_of(&cluster, 0);
        r.contains(&"n1".to_owned()) && r.contains(&"n2".to_owned())
    });
    for p in proxies {
        p.cut();
    }
    wait_for("n0 cut off from both others", || {
        routes_of(&cluster, 0).is_empty()
            && (1..3).all(|i| !routes_of(&cluster, i).contains(&"n0".to_owned()))
    });
    // The others still reach each other, directly.
    assert!(routes_of(&cluster, 1).contains(&"n2".to_owned()));
    assert!(routes_of(&cluster, 2).contains(&"n1".to_owned()));
    for p in proxies {
        p.heal();
    }
    wait_for("n0 routed to both others again", || {
        let r = routes_of(&cluster, 0);
        r.contains(&"n1".to_owned()) && r.contains(&"n2".to_owned())
    });
    // Every route of n0 went through them.
    for p in proxies {
        assert!(p.stats().to_server > 0, "{:?}", p.stats());
    }
}
