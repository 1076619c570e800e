//! A JetStream cluster of `nats-server` processes on 127.0.0.1, for failover tests
//! (R-DIST-7).
//!
//! Every node is a [`NatsServer`] with a store dir of its own, `sync_interval: always`, a
//! client port, a cluster (route) port and a monitoring port, all on 127.0.0.1. A node can
//! be SIGKILLed and restarted on its ports and store; the cluster answers which node leads
//! a stream or a consumer, read from each node's monitoring endpoint (`/jsz`), so a test
//! can kill exactly the leader.
//!
//! # Partitions
//! [`NatsCluster::with_proxied_node`] starts a cluster whose node `k` reaches the others,
//! and they it, only through [`FaultProxy`]s ([`NatsCluster::route_proxies`]): one in front
//! of `k`'s route port, which `k` also advertises (so a route the others learn by gossip
//! goes through it too), and one in front of every other node's route port for `k`'s own
//! routes. Blackholing, stalling or cutting all of them partitions `k` from the rest while
//! its clients stay connected to it (R-DIST-9). Node `k` starts last, so no node gossips
//! another's own route port to it, and the cluster checks at start that no route of `k`
//! bypasses the proxies.
//!
//! # Lifecycle
//! [`NatsCluster::start`] returns once every node accepts clients and the JetStream meta
//! group has a leader with every node in it (at most [`CLUSTER_READY_TIMEOUT`]). Dropping
//! the cluster kills every node and removes their directories.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use super::{LaunchError, NatsServer, free_port, install, unique_dir, with_fresh_ports};
use crate::fault_proxy::FaultProxy;

/// How long [`NatsCluster::start`] and [`NatsCluster::restart`] wait for the cluster to
/// have a JetStream meta leader with every node current.
pub const CLUSTER_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The cluster part of one node's configuration.
#[derive(Debug, Clone)]
pub(crate) struct NodeConfig {
    name: String,
    http_port: u16,
    cluster_port: u16,
    routes: Vec<u16>,
    /// The route port other nodes are told to reach this one at, when not its own.
    advertise: Option<u16>,
}

impl NodeConfig {
    pub(crate) fn config_lines(&self) -> String {
        let routes = self
            .routes
            .iter()
            .map(|p| format!("nats-route://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(", ");
        let advertise = self
            .advertise
            .map(|p| format!("  advertise: 127.0.0.1:{p}\n"))
            .unwrap_or_default();
        format!(
            "server_name: {}\nhttp: 127.0.0.1:{}\ncluster {{\n  name: tidings\n  \
             listen: 127.0.0.1:{}\n{advertise}  routes: [{routes}]\n}}\n",
            self.name, self.http_port, self.cluster_port
        )
    }
}

/// A running JetStream cluster owned by a test: three (or n) nodes on 127.0.0.1, each with
/// its own store, that a test can kill and restart one by one and ask which node leads a
/// stream or a consumer. Dropping it kills every node and removes their directories.
#[derive(Debug)]
pub struct NatsCluster {
    nodes: Vec<NatsServer>,
    /// The node whose routes go through `proxies`, if any.
    proxied: Option<usize>,
    /// Dropped after the nodes (fields drop in order): no node outlives its routes' proxy.
    proxies: Vec<FaultProxy>,
}

impl NatsCluster {
    /// Starts an `n`-node cluster for a test (installing the binary when it is missing), or
    /// returns `None` after printing a notice when the user opted out (`TIDINGS_SKIP_NATS=1`).
    ///
    /// # Panics
    /// When no binary can be found or installed, or the cluster does not come up: the test
    /// fails with the reason and the nodes' logs.
    #[must_use]
    pub fn for_test(n: usize) -> Option<Self> {
        if !super::test_needs_server() {
            return None;
        }
        match Self::start(n) {
            Ok(cluster) => Some(cluster),
            Err(e) => panic!("could not start a {n}-node nats-server cluster: {e}"),
        }
    }

    /// As [`for_test`](Self::for_test), with every route of node `node` going through a
    /// [`FaultProxy`] (see [`with_proxied_node`](Self::with_proxied_node)).
    ///
    /// # Panics
    /// As [`for_test`](Self::for_test), or when `node` is not below `n` (with `n` at least
    /// 2: one node has no routes).
    #[must_use]
    pub fn for_test_with_proxied_node(n: usize, node: usize) -> Option<Self> {
        if !super::test_needs_server() {
            return None;
        }
        match Self::with_proxied_node(n, node) {
            Ok(cluster) => Some(cluster),
            Err(e) => panic!("could not start a {n}-node nats-server cluster: {e}"),
        }
    }

    /// Starts `n` nodes (at least 2) whose node `node` reaches the others, and they it,
    /// only through [`FaultProxy`]s, and waits until the cluster is ready.
    ///
    /// One proxy stands in front of `node`'s route port (the others' routes to it, and the
    /// address it advertises, so a route learnt by gossip goes through it too), one in
    /// front of every other node's route port (`node`'s own routes). Applying the same
    /// fault to every one of [`route_proxies`](Self::route_proxies) partitions `node`
    /// from the rest while its clients stay connected to it. `node` starts last, so no
    /// node tells it another's own route port, and the routes are checked at start.
    ///
    /// # Errors
    /// As [`start`](Self::start); a proxy could not be started; a route of `node` bypassed
    /// the proxies ([`LaunchError::NotReady`], with the routes seen).
    ///
    /// # Panics
    /// When `node` is not below `n`.
    pub fn with_proxied_node(n: usize, node: usize) -> Result<Self, LaunchError> {
        let n = n.max(2);
        assert!(node < n, "node {node} of a {n}-node cluster");
        let binary = install::ensure_binary()?;
        with_fresh_ports(|| Self::start_proxied(n, node, &binary))
    }

    /// The proxies every route of the proxied node goes through (see
    /// [`with_proxied_node`](Self::with_proxied_node)); empty for a cluster started
    /// without one. Partition the node by applying the same fault to each.
    #[must_use]
    pub fn route_proxies(&self) -> &[FaultProxy] {
        &self.proxies
    }

    /// The node whose routes go through [`route_proxies`](Self::route_proxies), if any.
    #[must_use]
    pub fn proxied_node(&self) -> Option<usize> {
        self.proxied
    }

    /// Starts `n` nodes (at least 1) and waits until the cluster is ready.
    ///
    /// # Errors
    /// A node failed to start, or the cluster had no meta leader in time (with the logs).
    pub fn start(n: usize) -> Result<Self, LaunchError> {
        let n = n.max(1);
        let binary = install::ensure_binary()?;
        // The nodes of a failed try are stopped when it is dropped.
        with_fresh_ports(|| Self::start_once(n, &binary))
    }

    fn start_once(n: usize, binary: &std::path::Path) -> Result<Self, LaunchError> {
        let ports = Self::pick_ports(n)?;
        let cluster_ports: Vec<u16> = ports.iter().map(|p| p.2).collect();
        let routes = (0..n)
            .map(|i| {
                cluster_ports
                    .iter()
                    .enumerate()
                    .filter(|&(j, _)| j != i)
                    .map(|(_, &p)| p)
                    .collect()
            })
            .collect();
        let mut cluster = Self {
            nodes: Vec::with_capacity(n),
            proxied: None,
            proxies: Vec::new(),
        };
        cluster.launch_nodes(binary, &ports, routes, None)?;
        Ok(cluster)
    }

    /// As [`start_once`](Self::start_once), with node `k`'s routes through proxies: one
    /// in front of `k`'s route port (the others' routes to `k`, and what `k` advertises),
    /// one in front of each other node's route port (`k`'s routes to it).
    fn start_proxied(n: usize, k: usize, binary: &std::path::Path) -> Result<Self, LaunchError> {
        let ports = Self::pick_ports(n)?;
        let proxy = |port: u16| {
            FaultProxy::start(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
                .map_err(super::io("start a route proxy"))
        };
        let mut cluster = Self {
            nodes: Vec::with_capacity(n),
            proxied: Some(k),
            proxies: Vec::with_capacity(n),
        };
        cluster.proxies.push(proxy(ports[k].2)?);
        let into_k = cluster.proxies[0].port();
        let mut from_k = Vec::with_capacity(n - 1);
        for (j, p) in ports.iter().enumerate() {
            if j != k {
                let out = proxy(p.2)?;
                from_k.push(out.port());
                cluster.proxies.push(out);
            }
        }
        let routes = (0..n)
            .map(|i| {
                if i == k {
                    return from_k.clone();
                }
                (0..n)
                    .filter(|&j| j != i)
                    .map(|j| if j == k { into_k } else { ports[j].2 })
                    .collect()
            })
            .collect();
        cluster.launch_nodes(binary, &ports, routes, Some((k, into_k)))?;
        cluster.check_no_bypass(k, &ports)?;
        Ok(cluster)
    }

    /// (client, monitoring, route) ports for `n` nodes.
    fn pick_ports(n: usize) -> Result<Vec<(u16, u16, u16)>, LaunchError> {
        (0..n)
            .map(|_| Ok((free_port()?, free_port()?, free_port()?)))
            .collect()
    }

    /// Starts one node per `ports` entry with its `routes` (node `k` advertising the route
    /// port `advertise.1`, when given) and waits until the cluster is ready.
    fn launch_nodes(
        &mut self,
        binary: &std::path::Path,
        ports: &[(u16, u16, u16)],
        routes: Vec<Vec<u16>>,
        advertise: Option<(usize, u16)>,
    ) -> Result<(), LaunchError> {
        for (i, (&(client, http, route), routes)) in ports.iter().zip(routes).enumerate() {
            let dir = unique_dir();
            std::fs::create_dir_all(dir.join("store"))
                .map_err(super::io(format!("create {}", dir.display())))?;
            self.nodes.push(NatsServer {
                binary: binary.to_path_buf(),
                dir,
                port: client,
                token: None,
                tls: None,
                max_payload: None,
                default_sync: false,
                cluster: Some(NodeConfig {
                    name: node_name(i),
                    http_port: http,
                    cluster_port: route,
                    routes,
                    advertise: advertise.filter(|&(k, _)| k == i).map(|(_, p)| p),
                }),
                child: None,
            });
        }
        // A proxied node starts last: it then connects to nodes that know each other
        // already, and no node tells it another's own route port (a route it would then
        // open straight to that port, learnt by gossip, bypassing the proxies).
        let last = advertise.map(|(k, _)| k);
        let order = (0..self.nodes.len())
            .filter(|&i| Some(i) != last)
            .chain(last);
        for i in order {
            self.nodes[i].launch()?;
        }
        self.wait_ready()
    }

    /// Fails when a route of node `k` runs straight to another node's route port (or one
    /// of theirs straight to `k`'s), not through a proxy: a partition would miss it.
    fn check_no_bypass(&self, k: usize, ports: &[(u16, u16, u16)]) -> Result<(), LaunchError> {
        let direct: Vec<u16> = ports.iter().map(|p| p.2).collect();
        let mut bypass = Vec::new();
        for (i, node) in self.nodes.iter().enumerate() {
            let routez = node.monitor("/routez").unwrap_or_default();
            for route in routez["routes"].as_array().into_iter().flatten() {
                let port = route["port"].as_u64().and_then(|p| u16::try_from(p).ok());
                let remote = route["remote_name"].as_str().unwrap_or_default();
                let crosses = i == k || remote == node_name(k);
                if crosses && port.is_some_and(|p| direct.contains(&p)) {
                    bypass.push(format!("{} -> {route}", node_name(i)));
                }
            }
        }
        if bypass.is_empty() {
            return Ok(());
        }
        Err(LaunchError::NotReady {
            log: format!(
                "routes bypassing the proxies of {}:\n{}",
                node_name(k),
                bypass.join("\n")
            ),
        })
    }

    /// The number of nodes.
    #[must_use]
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Always false: a cluster has at least one node.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Node `i` (0-based). Panics when `i` is out of range, like indexing.
    #[must_use]
    pub fn node(&self, i: usize) -> &NatsServer {
        &self.nodes[i]
    }

    /// Every node's client URL, in node order.
    #[must_use]
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(NatsServer::url).collect()
    }

    /// The server name of node `i` (`n0`, `n1`, …), as the cluster reports leaders.
    #[must_use]
    pub fn name(&self, i: usize) -> String {
        node_name(i)
    }

    /// SIGKILLs node `i` (a crash). Does nothing when it is not running.
    ///
    /// # Errors
    /// The process could not be killed or waited for.
    pub fn kill(&mut self, i: usize) -> Result<(), LaunchError> {
        self.nodes[i].kill()
    }

    /// Starts node `i` again on its ports and store (killing it first if it runs) and waits
    /// until the cluster is ready again.
    ///
    /// # Errors
    /// As [`NatsServer::restart`], or the cluster did not become ready in time.
    pub fn restart(&mut self, i: usize) -> Result<(), LaunchError> {
        self.nodes[i].restart()?;
        self.wait_ready()
    }

    /// The node leading JetStream stream `stream` (its name on the server), as the running
    /// nodes report it; `None` when none reports a leader (an election under way).
    #[must_use]
    pub fn stream_leader(&self, stream: &str) -> Option<usize> {
        self.leader_of(|detail| {
            (detail.get("name")?.as_str()? == stream).then(|| leader_name(detail))?
        })
    }

    /// The node leading consumer `consumer` of stream `stream` (names on the server).
    #[must_use]
    pub fn consumer_leader(&self, stream: &str, consumer: &str) -> Option<usize> {
        self.leader_of(|detail| {
            if detail.get("name")?.as_str()? != stream {
                return None;
            }
            detail
                .get("consumer_detail")?
                .as_array()?
                .iter()
                .find(|c| c.get("name").and_then(|n| n.as_str()) == Some(consumer))
                .and_then(leader_name)
        })
    }

    /// Waits (at most `timeout`) until `stream` has a leader; returns it.
    #[must_use]
    pub fn wait_stream_leader(&self, stream: &str, timeout: Duration) -> Option<usize> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(leader) = self.stream_leader(stream) {
                return Some(leader);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The names of the clients connected to node `i` now (the `name` each gave when it
    /// connected; unnamed clients are left out), read from its monitoring endpoint
    /// (`/connz`). Empty when the node is not running or does not answer. A test uses it to
    /// check which node a client (another process, say) is connected to.
    #[must_use]
    pub fn client_names(&self, i: usize) -> Vec<String> {
        let Some(connz) = self.nodes[i].monitor("/connz?limit=100000") else {
            return Vec::new();
        };
        connz["connections"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["name"].as_str().filter(|n| !n.is_empty()))
            .map(str::to_owned)
            .collect()
    }

    /// The body of `GET path` from node `i`'s monitoring endpoint (`/jsz?consumers=true`,
    /// `/routez`, `/connz?subs=true`, …), for a test to print when something stalls;
    /// `None` when the node is not running or does not answer.
    #[must_use]
    pub fn monitor_text(&self, i: usize, path: &str) -> Option<String> {
        self.nodes[i].monitor(path).map(|v| v.to_string())
    }

    /// Asks every running node about its streams; the first leader `pick` finds.
    fn leader_of(&self, pick: impl Fn(&serde_json::Value) -> Option<String>) -> Option<usize> {
        for node in self.nodes.iter().filter(|n| n.is_running()) {
            let Some(jsz) = node.monitor("/jsz?accounts=true&streams=true&consumers=true") else {
                continue;
            };
            let accounts = jsz.get("account_details").and_then(|a| a.as_array());
            for account in accounts.into_iter().flatten() {
                let streams = account.get("stream_detail").and_then(|s| s.as_array());
                for detail in streams.into_iter().flatten() {
                    if let Some(leader) = pick(detail) {
                        return self.index_of(&leader);
                    }
                }
            }
        }
        None
    }

    fn index_of(&self, name: &str) -> Option<usize> {
        (0..self.nodes.len()).find(|&i| node_name(i) == name)
    }

    /// Until a running node reports a meta leader and every running node is a current peer.
    fn wait_ready(&self) -> Result<(), LaunchError> {
        let deadline = Instant::now() + CLUSTER_READY_TIMEOUT;
        let running = self.nodes.iter().filter(|n| n.is_running()).count();
        loop {
            let ready = self.nodes.iter().filter(|n| n.is_running()).any(|node| {
                node.monitor("/jsz").is_some_and(|jsz| {
                    let meta = &jsz["meta_cluster"];
                    let has_leader = meta["leader"].as_str().is_some_and(|l| !l.is_empty());
                    let current = meta["replicas"].as_array().map_or(0, |r| {
                        r.iter()
                            .filter(|p| p["current"].as_bool() == Some(true))
                            .count()
                    });
                    // The leader lists its followers; a follower lists the others too.
                    has_leader && current + 1 >= running
                })
            });
            if ready {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let log = self
                    .nodes
                    .iter()
                    .enumerate()
                    .map(|(i, n)| format!("--- {}:\n{}", node_name(i), n.log_tail()))
                    .collect::<Vec<_>>()
                    .join("\n");
                return Err(LaunchError::NotReady { log });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl NatsServer {
    /// GET `path` from this node's monitoring port; the JSON body, or `None` when it does
    /// not answer (a killed node, or not a cluster node).
    fn monitor(&self, path: &str) -> Option<serde_json::Value> {
        let port = self.cluster.as_ref()?.http_port;
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        write!(
            stream,
            "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        let mut response = Vec::new();
        stream.take(16 << 20).read_to_end(&mut response).ok()?;
        let body_at = response.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
        serde_json::from_slice(&response[body_at..]).ok()
    }
}

fn node_name(i: usize) -> String {
    format!("n{i}")
}

fn leader_name(detail: &serde_json::Value) -> Option<String> {
    detail["cluster"]["leader"]
        .as_str()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
}
