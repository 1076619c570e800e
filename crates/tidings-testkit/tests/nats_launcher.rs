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
