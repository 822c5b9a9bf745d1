//! TLS towards Redis (`rediss://`), against a real `redis-server` serving TLS with
//! certificates the test kit generates: a CA file, a client certificate the server requires
//! (`--tls-auth-clients yes`), an ACL user over TLS, replicas over TLS; and the failures an
//! operator meets first (a wrong CA, a missing client certificate, a plaintext URL against
//! the TLS port, a missing file), each a clear error at connect time naming the server.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use sluice::{LimitSpec, Policy, StoreExt};
use sluice_redis::{RedisConfig, RedisStore, TlsFiles};
use sluice_testkit::{ServerOptions, TlsCerts};

const PASSWORD: &str = "tls-acl-s3cret-0123456789";

#[tokio::test]
async fn rediss_with_a_ca_a_client_certificate_and_an_acl_user() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let certs = TlsCerts::generate().unwrap();
    let server = ServerOptions::new()
        .tls(&certs, true)
        .args(sluice_testkit::acl_user("alice", PASSWORD, "*"))
        .start()
        .unwrap();
    let tls_port = server.tls_port().unwrap();
    let (cert, key) = certs.client_files();
    let files = TlsFiles::ca(certs.ca_file()).client(&cert, &key);
    let url = format!("rediss://alice:{PASSWORD}@127.0.0.1:{tls_port}");

    // The replica is the same server over TLS: peeks go through it.
    let config = RedisConfig::new(url.as_str())
        .replicas([url.as_str()])
        .tls(files.clone());
    let store = RedisStore::connect(config).await.unwrap();
    assert_eq!(store.name(), format!("rediss://127.0.0.1:{tls_port}"));
    let p = Policy::from_specs("api", vec![LimitSpec::fixed_window(2, 60_000)]).unwrap();
    let t0 = 1_700_000_000_000;
    assert!(store.check(&p, "k", 1, t0).await.unwrap().allowed);
    assert_eq!(store.peek(&p, "k", 1, t0).await.unwrap().remaining(), 0);
    assert!(store.check(&p, "k", 1, t0).await.unwrap().allowed);
    assert!(!store.check(&p, "k", 1, t0).await.unwrap().allowed);
    // Over TLS, as alice.
    let users = server.client_users().unwrap();
    assert!(users.iter().any(|u| u == "alice"), "{users:?}");

    let shown = format!("127.0.0.1:{tls_port}");
    let refused = |config: RedisConfig| async move {
        let e = RedisStore::connect(config).await.unwrap_err().to_string();
        assert!(!e.contains(PASSWORD), "{e}");
        e
    };
    // A CA that did not sign the server's certificate.
    let other = TlsCerts::generate().unwrap();
    let e = refused(
        RedisConfig::new(url.as_str()).tls(TlsFiles::ca(other.ca_file()).client(&cert, &key)),
    )
    .await;
    assert!(e.contains(&shown), "names the server: {e}");
    // No client certificate while the server requires one.
    let e = refused(RedisConfig::new(url.as_str()).tls(TlsFiles::ca(certs.ca_file()))).await;
    assert!(e.contains(&shown), "{e}");
    // A plaintext URL against the TLS port.
    let plain = format!("redis://alice:{PASSWORD}@127.0.0.1:{tls_port}");
    let e =
        refused(RedisConfig::new(plain.as_str()).timeout(std::time::Duration::from_millis(500)))
            .await;
    assert!(
        e.contains(&shown) && e.contains("use a rediss:// URL"),
        "{e}"
    );
    // A certificate file that is not there.
    let e = refused(RedisConfig::new(url.as_str()).tls(TlsFiles::ca("/nonexistent/ca.crt"))).await;
    assert!(
        e.contains("tls.ca_file") && e.contains("/nonexistent/ca.crt"),
        "{e}"
    );
}
