//! What a connection may hold: `listen.header_timeout`, `listen.body_timeout`,
//! `listen.idle_timeout` and `listen.max_connections`, on the HTTP and gRPC listeners, with
//! raw sockets doing what a slow or idle client does. Timeouts are tiny and set in each
//! test's configuration; every wait is for the server to close the socket (a read returning
//! 0), polled, never slept on.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::support;
use support::TestServer;

const POLICY: &str = "policies:\n  api:\n    limits:\n      - { max: 1000, per: 1m }\n";

/// A server whose `listen` section holds `limits` (e.g. `header_timeout: 300ms`).
async fn start(limits: &[&str]) -> TestServer {
    let mut listen = String::from("listen:\n");
    for l in limits {
        listen += &format!("  {l}\n");
    }
    TestServer::start(&format!("{listen}{POLICY}"), &[]).await
}

fn addr(url: &str) -> &str {
    url.trim_start_matches("http://")
}

/// Reads until the server closes the socket (a read returns 0, or the connection is reset);
/// returns what it sent before. Fails after 10 s.
async fn until_closed(stream: &mut TcpStream) -> Vec<u8> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return out,
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Err(_) => panic!(
                "the server kept the connection open for 10 s; it sent: {}",
                String::from_utf8_lossy(&out)
            ),
        }
    }
}

/// The value of the series `name{labels}` in `/metrics` (0 when absent).
async fn metric(url: &str, series: &str) -> f64 {
    let text = reqwest::get(format!("{url}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

async fn request(stream: &mut TcpStream, path: &str) -> String {
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nhost: sluice\r\n\r\n").as_bytes())
        .await
        .unwrap();
    // One small answer: its head and body come in one read once it is whole.
    let mut answer = Vec::new();
    let mut buf = [0u8; 65536];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let n = tokio::time::timeout_at(deadline, stream.read(&mut buf))
            .await
            .expect("no answer within 10 s")
            .unwrap();
        assert!(n > 0, "closed before answering");
        answer.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&answer).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length: usize = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse().unwrap())
                })
                .unwrap_or(0);
            if body.len() >= length {
                return text;
            }
        }
    }
}

#[tokio::test]
async fn an_idle_http_connection_is_closed_after_the_idle_timeout() {
    let s = start(&["idle_timeout: 300ms", "header_timeout: 1h"]).await;
    // Connected, nothing sent.
    let started = Instant::now();
    let mut quiet = TcpStream::connect(addr(&s.url)).await.unwrap();
    assert!(until_closed(&mut quiet).await.is_empty());
    assert!(started.elapsed() >= Duration::from_millis(300));
    // Between two requests of a keep-alive connection.
    let mut kept = TcpStream::connect(addr(&s.url)).await.unwrap();
    assert!(
        request(&mut kept, "/healthz")
            .await
            .starts_with("HTTP/1.1 200")
    );
    let answered = Instant::now();
    assert!(until_closed(&mut kept).await.is_empty());
    assert!(answered.elapsed() >= Duration::from_millis(300));
    // A client that keeps asking is not idle, however long it stays.
    let mut busy = TcpStream::connect(addr(&s.url)).await.unwrap();
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(900) {
        assert!(
            request(&mut busy, "/healthz")
                .await
                .starts_with("HTTP/1.1 200")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        metric(
            &s.url,
            "sluice_connection_timeouts_total{listener=\"http\",timeout=\"idle\"}"
        )
        .await
            >= 2.0
    );
    s.stop().await;
}

/// A slowloris client: one byte of the request head at a time, never finishing it.
#[tokio::test]
async fn a_slowloris_client_is_closed_after_the_header_timeout() {
    let s = start(&["header_timeout: 500ms", "idle_timeout: 1h"]).await;
    let mut slow = TcpStream::connect(addr(&s.url)).await.unwrap();
    let started = Instant::now();
    let head = b"GET /healthz HTTP/1.1\r\nhost: sluice\r\nx-padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n";
    let mut sent = 0;
    for byte in head {
        if slow.write_all(&[*byte]).await.is_err() {
            break;
        }
        sent += 1;
        // The client's pace (20 bytes a second), not a wait for the server.
        tokio::time::sleep(Duration::from_millis(50)).await;
        if started.elapsed() > Duration::from_secs(3) {
            break;
        }
        // Has the server closed it yet? (A peek that does not wait.)
        let mut probe = [0u8; 1];
        if let Ok(0) = slow.try_read(&mut probe) {
            break;
        }
    }
    let answer = until_closed(&mut slow).await;
    assert!(
        sent < head.len(),
        "the whole head went through: {sent} bytes"
    );
    assert!(started.elapsed() >= Duration::from_millis(500));
    // Whatever hyper says on the way out, it is no answer to the request.
    assert!(!String::from_utf8_lossy(&answer).contains("200 OK"));
    assert!(
        metric(
            &s.url,
            "sluice_connection_timeouts_total{listener=\"http\",timeout=\"header\"}"
        )
        .await
            >= 1.0
    );
    s.stop().await;
}

/// The head arrives whole, the body one byte at a time: `408 request_timeout`, and the
/// connection closes.
#[tokio::test]
async fn a_slow_body_is_refused_after_the_body_timeout() {
    let s = start(&[
        "body_timeout: 500ms",
        "header_timeout: 1h",
        "idle_timeout: 1h",
    ])
    .await;
    let body = br#"{"policy": "api", "key": "slow-body-client", "cost": 1}"#;
    let mut slow = TcpStream::connect(addr(&s.url)).await.unwrap();
    slow.write_all(
        format!(
            "POST /v1/check HTTP/1.1\r\nhost: sluice\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let started = Instant::now();
    for byte in &body[..body.len() - 1] {
        if slow.write_all(&[*byte]).await.is_err() {
            break;
        }
        let mut probe = [0u8; 1];
        if let Ok(n) = slow.try_read(&mut probe) {
            // The server answered (or closed): stop sending; keep what it said.
            let mut answer = probe[..n].to_vec();
            answer.extend(until_closed(&mut slow).await);
            return finish(s, started, answer).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let answer = until_closed(&mut slow).await;
    finish(s, started, answer).await;

    async fn finish(s: TestServer, started: Instant, answer: Vec<u8>) {
        let text = String::from_utf8_lossy(&answer);
        assert!(text.starts_with("HTTP/1.1 408"), "{text}");
        assert!(text.contains("\"code\":\"request_timeout\""), "{text}");
        assert!(text.contains("body_timeout"), "{text}");
        assert!(started.elapsed() >= Duration::from_millis(500));
        // Nothing was decided for the half-sent request.
        let r = reqwest::Client::new()
            .post(format!("{}/v1/peek", s.url))
            .body(r#"{"policy": "api", "key": "slow-body-client"}"#)
            .send()
            .await
            .unwrap();
        let peek: serde_json::Value = r.json().await.unwrap();
        assert_eq!(peek["remaining"], 999, "{peek}");
        assert!(
            metric(
                &s.url,
                "sluice_connection_timeouts_total{listener=\"http\",timeout=\"body\"}"
            )
            .await
                >= 1.0
        );
        s.stop().await;
    }
}

/// gRPC: a client that starts the HTTP/2 preface and stops is closed after the header
/// timeout; one that sends nothing at all, after the idle timeout.
#[tokio::test]
async fn half_an_http2_preface_and_an_idle_grpc_connection_are_closed() {
    let s = start(&["header_timeout: 300ms", "idle_timeout: 1h"]).await;
    let mut half = TcpStream::connect(addr(&s.grpc_url)).await.unwrap();
    let started = Instant::now();
    half.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    until_closed(&mut half).await;
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(
        metric(
            &s.url,
            "sluice_connection_timeouts_total{listener=\"grpc\",timeout=\"header\"}"
        )
        .await
            >= 1.0
    );
    s.stop().await;

    let s = start(&["header_timeout: 1h", "idle_timeout: 300ms"]).await;
    // A real client is served...
    let mut health = tonic_health::pb::health_client::HealthClient::new(s.channel().await);
    health
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap();
    // ...and a silent one is closed.
    let started = Instant::now();
    let mut quiet = TcpStream::connect(addr(&s.grpc_url)).await.unwrap();
    until_closed(&mut quiet).await;
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(
        metric(
            &s.url,
            "sluice_connection_timeouts_total{listener=\"grpc\",timeout=\"idle\"}"
        )
        .await
            >= 1.0
    );
    s.stop().await;
}

/// gRPC: a connection in use is never closed by the idle timeout, however many times longer
/// than it the connection lives (each read moves the deadline), and is closed once silent.
#[tokio::test]
async fn a_busy_grpc_connection_outlives_the_idle_timeout_and_closes_once_silent() {
    let s = start(&["idle_timeout: 500ms"]).await;
    let idle = "sluice_connection_timeouts_total{listener=\"grpc\",timeout=\"idle\"}";
    let mut health = tonic_health::pb::health_client::HealthClient::new(s.channel().await);
    let started = Instant::now();
    let mut calls = 0;
    // One request every 50 ms for four idle timeouts.
    while started.elapsed() < Duration::from_millis(2_000) {
        health
            .check(tonic_health::pb::HealthCheckRequest {
                service: String::new(),
            })
            .await
            .expect("a busy connection is served");
        calls += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(calls >= 10, "{calls} calls in 2 s");
    assert_eq!(
        metric(&s.url, idle).await,
        0.0,
        "a busy gRPC connection was closed as idle"
    );
    // Silent from now: closed after the idle timeout.
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(&s.url, idle).await < 1.0 {
        assert!(
            Instant::now() < deadline,
            "a silent gRPC connection was still open 10 s after its idle timeout of 500 ms"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    s.stop().await;
}

/// With `max_connections` open, a new client waits (the listener stops accepting; the kernel
/// holds it in its backlog) while the open ones are served; the metric says the bound was
/// reached; once one closes, the waiting client is answered.
#[tokio::test]
async fn at_the_connection_bound_new_clients_wait_and_open_ones_are_served() {
    let s = start(&["max_connections: 2"]).await;
    // The readiness poll's connections may still be open: wait for the gauge to settle.
    let mut a = TcpStream::connect(addr(&s.url)).await.unwrap();
    let gauge = "sluice_connections_open{listener=\"http\"}";
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = request(&mut a, "/metrics").await;
        if text
            .lines()
            .find_map(|l| l.strip_prefix(gauge))
            .is_some_and(|v| v.trim() == "1")
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "other connections stay open: {text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut b = TcpStream::connect(addr(&s.url)).await.unwrap();
    assert!(
        request(&mut b, "/healthz")
            .await
            .starts_with("HTTP/1.1 200")
    );
    // The third: connected by the kernel, never accepted while two are open.
    let mut c = TcpStream::connect(addr(&s.url)).await.unwrap();
    c.write_all(b"GET /healthz HTTP/1.1\r\nhost: sluice\r\n\r\n")
        .await
        .unwrap();
    // The open ones are served, and the bound shows in the metrics.
    let text = request(&mut a, "/metrics").await;
    let limited: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("sluice_connections_limited_total{listener=\"http\"}"))
        .map_or(0.0, |v| v.trim().parse().unwrap());
    assert!(limited >= 1.0, "{text}");
    assert!(text.contains(&format!("{gauge} 2")), "{text}");
    assert!(
        request(&mut b, "/healthz")
            .await
            .starts_with("HTTP/1.1 200")
    );
    let mut nothing = [0u8; 64];
    assert!(
        matches!(c.try_read(&mut nothing), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the third client was answered beyond the bound"
    );
    // One closes: the waiting client is accepted and answered.
    drop(b);
    let mut answer = [0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(10), c.read(&mut answer))
        .await
        .expect("the waiting client was never answered")
        .unwrap();
    assert!(answer[..n].starts_with(b"HTTP/1.1 200"));
    assert!(
        request(&mut a, "/healthz")
            .await
            .starts_with("HTTP/1.1 200")
    );
    s.stop().await;
}
