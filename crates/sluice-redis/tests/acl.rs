//! An ACL user given in the URL (`redis://user:password@host`): decisions work, and the
//! password never shows: not in the store's name (metric labels, logs), not in errors. A
//! wrong password is a clear error at connect time that names the server.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use sluice::{LimitSpec, Policy, StoreExt};
use sluice_redis::{RedisConfig, RedisStore};
use support::server_with_alice;

const PASSWORD: &str = "acl-s3cret-0123456789";

#[tokio::test]
async fn an_acl_user_in_the_url_works_and_its_password_never_shows() {
    let Some((server, url)) = server_with_alice(PASSWORD) else {
        return;
    };
    let store = RedisStore::connect(RedisConfig::new(url.as_str()))
        .await
        .unwrap();
    assert_eq!(store.name(), format!("redis://127.0.0.1:{}", server.port()));
    let p = Policy::from_specs("api", vec![LimitSpec::fixed_window(2, 60_000)]).unwrap();
    let t0 = 1_700_000_000_000;
    assert!(store.check(&p, "k", 1, t0).await.unwrap().allowed);
    assert!(store.check(&p, "k", 1, t0).await.unwrap().allowed);
    assert!(!store.check(&p, "k", 1, t0).await.unwrap().allowed);
    // It really is alice who is connected.
    let users = server.client_users().unwrap();
    assert!(users.iter().any(|u| u == "alice"), "{users:?}");

    let wrong = format!("redis://alice:not-the-password@127.0.0.1:{}", server.port());
    let e = RedisStore::connect(RedisConfig::new(wrong.as_str()))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        !e.contains("not-the-password") && !e.contains(PASSWORD),
        "{e}"
    );
    assert!(
        e.contains(&format!("127.0.0.1:{}", server.port())),
        "the error names the server: {e}"
    );
    assert!(
        e.to_lowercase().contains("pass") || e.contains("auth"),
        "{e}"
    );
}
