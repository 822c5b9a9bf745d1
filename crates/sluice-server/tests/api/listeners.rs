//! The server's own listeners: TLS on HTTP and gRPC (`listen.tls`, with and without client
//! certificates), and a separate admin listener (`listen.admin`) that alone serves the routes
//! that change or reveal state. Certificates come from the test kit (rcgen).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice_server::config::Config;
use sluice_testkit::TlsCerts;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use crate::support;

const RLS_YAML: &str = "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 2}\n";
const TOKEN: &str = "admin-token-0123456789abcdef";

fn tls_config(certs: &TlsCerts, mutual: bool) -> String {
    let (cert, key) = certs.server_files();
    let mut tls = format!(
        "listen:\n  tls:\n    cert_file: {}\n    key_file: {}\n",
        cert.display(),
        key.display()
    );
    if mutual {
        tls += &format!("    client_ca_file: {}\n", certs.ca_file().display());
    }
    format!(
        "{tls}policies:\n  api:\n    limits:\n      - {{ max: 2, per: 1m }}\nrls:\n  config_dir: ratelimit-config\n"
    )
}

fn https_client(certs: &TlsCerts, identity: bool) -> reqwest::Client {
    let ca = reqwest::Certificate::from_pem(&std::fs::read(certs.ca_file()).unwrap()).unwrap();
    let mut builder = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(ca);
    if identity {
        let (cert, key) = certs.client_files();
        let mut pem = std::fs::read(cert).unwrap();
        pem.extend(std::fs::read(key).unwrap());
        builder = builder.identity(reqwest::Identity::from_pem(&pem).unwrap());
    }
    builder.build().unwrap()
}

async fn grpc_over_tls(
    url: &str,
    certs: &TlsCerts,
    identity: bool,
) -> Result<RateLimitServiceClient<tonic::transport::Channel>, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(
            std::fs::read(certs.ca_file()).unwrap(),
        ))
        .domain_name("localhost");
    if identity {
        let (cert, key) = certs.client_files();
        tls = tls.identity(Identity::from_pem(
            std::fs::read(cert).unwrap(),
            std::fs::read(key).unwrap(),
        ));
    }
    let channel = Endpoint::from_shared(url.to_owned())
        .unwrap()
        .tls_config(tls)?
        .connect()
        .await?;
    Ok(RateLimitServiceClient::new(channel))
}

fn envoy_request() -> RateLimitRequest {
    support::rls_request("edge", &[&[("remote_address", "10.0.0.1")]], 0)
}

async fn check(client: &reqwest::Client, url: &str) -> reqwest::Result<reqwest::Response> {
    client
        .post(format!("{url}/v1/check"))
        .json(&json!({"policy": "api", "key": "k"}))
        .send()
        .await
}

/// A server over TLS (asking clients for a certificate when `mutual`), its certificates, and
/// an HTTPS client that trusts it (with a certificate when `mutual`).
async fn tls_server(mutual: bool) -> (TlsCerts, reqwest::Client, support::TestServer) {
    let certs = TlsCerts::generate().unwrap();
    let client = https_client(&certs, mutual);
    let server = support::TestServer::start_tls(
        &tls_config(&certs, mutual),
        &[("ratelimit-config/edge.yaml", RLS_YAML)],
        client.clone(),
    )
    .await;
    (certs, client, server)
}

#[tokio::test]
async fn http_and_grpc_answer_over_tls_and_not_in_plaintext() {
    let (certs, client, server) = tls_server(false).await;
    assert!(server.url.starts_with("https://"), "{}", server.url);

    // A client that connects and never says a word holds its own socket, not the listener.
    let idle = tokio::net::TcpStream::connect(server.url.trim_start_matches("https://"))
        .await
        .unwrap();
    let r = check(&client, &server.url).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Value>().await.unwrap()["remaining"], 1);

    // Plaintext HTTP to the TLS port gets no answer.
    let plain = server.url.replacen("https://", "http://", 1);
    assert!(check(&reqwest::Client::new(), &plain).await.is_err());
    // A client that does not trust the server's CA is refused by its own side.
    let other = TlsCerts::generate().unwrap();
    assert!(
        check(&https_client(&other, false), &server.url)
            .await
            .is_err()
    );

    // gRPC, as Envoy sends it over TLS (h2 by ALPN).
    let mut rls = grpc_over_tls(&server.grpc_url, &certs, false)
        .await
        .unwrap();
    let codes = codes_of(&mut rls, 3).await;
    assert_eq!(
        codes,
        vec![Code::Ok as i32, Code::Ok as i32, Code::OverLimit as i32]
    );
    drop(idle);
    server.stop().await;
}

async fn codes_of(
    rls: &mut RateLimitServiceClient<tonic::transport::Channel>,
    n: usize,
) -> Vec<i32> {
    let mut codes = Vec::with_capacity(n);
    for _ in 0..n {
        let response = rls.should_rate_limit(envoy_request()).await.unwrap();
        codes.push(response.into_inner().overall_code);
    }
    codes
}

#[tokio::test]
async fn mutual_tls_refuses_a_client_without_a_certificate() {
    let (certs, client, server) = tls_server(true).await;
    assert_eq!(
        check(&client, &server.url).await.unwrap().status(),
        StatusCode::OK
    );
    assert!(
        check(&https_client(&certs, false), &server.url)
            .await
            .is_err(),
        "no client certificate, no answer"
    );
    let mut rls = grpc_over_tls(&server.grpc_url, &certs, true).await.unwrap();
    assert_eq!(codes_of(&mut rls, 1).await, vec![Code::Ok as i32]);
    // Without a certificate the handshake fails; tonic may report it at connect or at the
    // first call.
    let refused = match grpc_over_tls(&server.grpc_url, &certs, false).await {
        Err(_) => true,
        Ok(mut rls) => rls.should_rate_limit(envoy_request()).await.is_err(),
    };
    assert!(refused, "gRPC without a client certificate was answered");
    server.stop().await;
}

#[tokio::test]
async fn the_admin_routes_are_served_on_the_admin_listener_only() {
    let config = "listen:\n  admin: 127.0.0.1:0\nadmin:\n  tokens_file: tokens\npolicies:\n  api:\n    limits:\n      - { max: 2, per: 1m }\n";
    let server = support::TestServer::start(config, &[("tokens", TOKEN)]).await;
    let admin = server.admin_url.clone().unwrap();
    let client = reqwest::Client::new();
    let body = json!({"policy": "api", "key": "k"});

    // The public port decides, and refuses the admin routes even with the token.
    assert_eq!(
        check(&client, &server.url).await.unwrap().status(),
        StatusCode::OK
    );
    let public = sluice_server::http::admin_routes().map(|(method, path)| {
        let url = format!("{}{}", server.url, path.replace("{policy}/{key}", "api/k"));
        client.request(method.parse().unwrap(), url).json(&body)
    });
    for request in public {
        let r = support::send(request.bearer_auth(TOKEN)).await;
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
        let e: Value = r.json().await.unwrap();
        assert_eq!(e["error"]["code"], "admin_listener", "{e}");
        assert!(
            e["error"]["message"]
                .as_str()
                .unwrap()
                .contains("admin listener"),
            "{e}"
        );
    }
    for path in ["/healthz", "/readyz", "/openapi.json"] {
        let r = support::send(client.get(format!("{}{path}", server.url))).await;
        assert_eq!(r.status(), StatusCode::OK, "{path}");
    }

    // The admin listener serves them, behind the token.
    let refund = || client.post(format!("{admin}/v1/refund")).json(&body);
    assert_eq!(
        refund().send().await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    let r = support::send(refund().bearer_auth(TOKEN)).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Value>().await.unwrap()["remaining"], 2);
    let r = support::send(
        client
            .get(format!("{admin}/v1/policies"))
            .bearer_auth(TOKEN),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    let r = support::send(client.get(format!("{admin}/metrics"))).await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let r = support::send(client.get(format!("{admin}/metrics")).bearer_auth(TOKEN)).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.text().await.unwrap().contains("sluice_"));
    // One state behind both: the refund gave back the public check's unit, so both ports
    // peek the key as unused (a peek reports what would remain after one more request).
    for url in [&server.url, &admin] {
        let r = support::send(client.post(format!("{url}/v1/peek")).json(&body)).await;
        assert_eq!(r.json::<Value>().await.unwrap()["remaining"], 1, "{url}");
    }
    server.stop().await;
}

#[tokio::test]
async fn listener_settings_that_cannot_work_are_refused_naming_the_field() {
    let certs = TlsCerts::generate().unwrap();
    let (cert, key) = certs.server_files();
    let (client_cert, _) = certs.client_files();
    let tls = |cert: &std::path::Path, key: &std::path::Path| {
        format!(
            "listen:\n  tls:\n    cert_file: {}\n    key_file: {}\n",
            cert.display(),
            key.display()
        )
    };
    let missing = std::path::Path::new("/nonexistent/server.crt");
    let port =
        |other: &str| format!("listen:\n  http: 127.0.0.1:9000\n  {other}: 127.0.0.1:9000\n");
    // Each configuration, and what its error must name.
    let cases: [(String, &[&str]); 6] = [
        (
            tls(missing, &key),
            &["listen.tls.cert_file", "/nonexistent/server.crt"],
        ),
        (
            tls(&key, &key),
            &["listen.tls.cert_file", "no PEM certificate"],
        ),
        (
            tls(&client_cert, &key),
            &["does not go with the certificate"],
        ),
        (tls(&cert, &cert), &["listen.tls.key_file"]),
        (port("admin"), &["listen.admin", "own port"]),
        (port("grpc"), &["own port"]),
    ];
    for (text, words) in cases {
        let e = Config::parse("sluice.yaml", &text).unwrap_err().to_string();
        for word in words {
            assert!(e.contains(word), "{text}: {word} not in {e}");
        }
    }

    // A port already taken is an error naming the listener.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let config = Config::parse(
        "sluice.yaml",
        &format!("listen:\n  http: 127.0.0.1:0\n  grpc: 127.0.0.1:0\n  admin: {addr}\n"),
    )
    .unwrap();
    let e = sluice_server::app::Listeners::bind(&config)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("listen.admin") && e.contains(&addr.to_string()),
        "{e}"
    );
}

/// Over TLS: a client that connects and never starts its handshake is closed after
/// `listen.header_timeout`, one that finishes it and then says nothing after
/// `listen.idle_timeout`, on the HTTP and the gRPC listener alike.
#[tokio::test]
async fn silent_tls_clients_are_closed_before_and_after_the_handshake() {
    use rustls::pki_types::pem::PemObject;
    use tokio::io::AsyncReadExt;
    let certs = TlsCerts::generate().unwrap();
    let config = tls_config(&certs, false).replacen(
        "listen:\n",
        "listen:\n  header_timeout: 300ms\n  idle_timeout: 400ms\n",
        1,
    );
    let server = support::TestServer::start_tls(
        &config,
        &[("ratelimit-config/edge.yaml", RLS_YAML)],
        https_client(&certs, false),
    )
    .await;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_file_iter(certs.ca_file()).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    async fn until_closed<S: tokio::io::AsyncRead + Unpin>(stream: &mut S) {
        let mut buf = [0u8; 256];
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return,
                Ok(Ok(_)) => {}
                Err(_) => panic!("the server kept a silent TLS connection open for 10 s"),
            }
        }
    }
    for (url, alpn) in [
        (&server.url, b"http/1.1".to_vec()),
        (&server.grpc_url, b"h2".to_vec()),
    ] {
        let addr = url.trim_start_matches("https://");
        let started = std::time::Instant::now();
        let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
        until_closed(&mut silent).await;
        assert!(started.elapsed() >= std::time::Duration::from_millis(300));

        let mut client = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots.clone())
        .with_no_client_auth();
        client.alpn_protocols = vec![alpn];
        let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut tls = connector
            .connect("localhost".try_into().unwrap(), tcp)
            .await
            .unwrap();
        let handshaken = std::time::Instant::now();
        until_closed(&mut tls).await;
        assert!(handshaken.elapsed() >= std::time::Duration::from_millis(400));
    }
    let metrics = https_client(&certs, false)
        .get(format!("{}/metrics", server.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for listener in ["http", "grpc"] {
        for timeout in ["handshake", "idle"] {
            let series = format!(
                "sluice_connection_timeouts_total{{listener=\"{listener}\",timeout=\"{timeout}\"}}"
            );
            assert!(metrics.contains(&series), "no {series} in:\n{metrics}");
        }
    }
    server.stop().await;
}
