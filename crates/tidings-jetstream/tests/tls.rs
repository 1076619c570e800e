//! TLS against a real `nats-server` (R-SEC-1): the right CA connects, mutual TLS with a
//! client certificate connects, and every way a TLS connection can fail is reported as
//! `ConnectError::Tls` with its cause — never as an unreachable server. The certificates
//! are made for each test (a CA, a server certificate for 127.0.0.1, a client certificate)
//! and the servers it starts are stopped when it ends.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use tidings_jetstream::{ConnectError, ConnectOptions};
use tidings_testkit::nats::{NatsServer, NatsServerOptions, TlsFiles};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A certificate authority that issues the server's and the client's certificates.
struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pem: PathBuf,
}

fn new_ca(dir: &Path, name: &str) -> Ca {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let key = KeyPair::generate().expect("CA key");
    let cert = params.self_signed(&key).expect("CA certificate");
    let pem = dir.join(format!("{name}.pem"));
    std::fs::write(&pem, cert.pem()).expect("write CA");
    Ca {
        issuer: Issuer::new(params, key),
        pem,
    }
}

/// A leaf certificate for `usage`, issued by `ca`; returns its (cert, key) PEM files.
fn issue(dir: &Path, ca: &Ca, name: &str, usage: ExtendedKeyUsagePurpose) -> (PathBuf, PathBuf) {
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
        .expect("leaf params");
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![usage];
    params.use_authority_key_identifier_extension = true;
    let key = KeyPair::generate().expect("leaf key");
    let cert = params
        .signed_by(&key, &ca.issuer)
        .expect("leaf certificate");
    let (cert_path, key_path) = (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}-key.pem")),
    );
    std::fs::write(&cert_path, cert.pem()).expect("write cert");
    std::fs::write(&key_path, key.serialize_pem()).expect("write key");
    (cert_path, key_path)
}

fn options(server: &NatsServer) -> ConnectOptions {
    ConnectOptions::new(server.url()).connect_timeout(CONNECT_TIMEOUT)
}

async fn expect_tls_error(label: &str, options: ConnectOptions) {
    let err = options.connect().await.expect_err(label);
    // R-SEC-1: a TLS failure is named as one, with its cause.
    assert!(matches!(err, ConnectError::Tls { .. }), "{label}: {err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_tls_right_ca_connects_and_every_failure_is_a_tls_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = new_ca(dir.path(), "tidings-test-ca");
    let other_ca = new_ca(dir.path(), "some-other-ca");
    let (cert, key) = issue(
        dir.path(),
        &ca,
        "server",
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let Some(server) = NatsServer::for_test(NatsServerOptions::new().tls(TlsFiles::new(cert, key)))
    else {
        return;
    };

    // R-SEC-1: the right CA connects.
    let js = options(&server)
        .tls_root_certificates(&ca.pem)
        .require_tls(true)
        .connect()
        .await
        .expect("the right CA connects");
    assert!(js.is_connected());

    expect_tls_error(
        "unknown issuer",
        options(&server).tls_root_certificates(&other_ca.pem),
    )
    .await;
    expect_tls_error("no CA given", options(&server).require_tls(true)).await;
    expect_tls_error("a plain client against a TLS-only server", options(&server)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_needs_the_client_certificate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = new_ca(dir.path(), "tidings-test-ca");
    let (cert, key) = issue(
        dir.path(),
        &ca,
        "server",
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let (client_cert, client_key) = issue(
        dir.path(),
        &ca,
        "client",
        ExtendedKeyUsagePurpose::ClientAuth,
    );
    let tls = TlsFiles::new(cert, key).verify_clients(&ca.pem);
    let Some(server) = NatsServer::for_test(NatsServerOptions::new().tls(tls)) else {
        return;
    };

    // R-SEC-1: with the certificate, mutual TLS connects.
    let js = options(&server)
        .tls_root_certificates(&ca.pem)
        .tls_client_certificate(&client_cert, &client_key)
        .connect()
        .await
        .expect("mutual TLS with a client certificate connects");
    assert!(js.is_connected());

    expect_tls_error(
        "mutual TLS without a client certificate",
        options(&server).tls_root_certificates(&ca.pem),
    )
    .await;
}
