//! What the topology tests (plain and over TLS) share: a closed policy, waiting for
//! replication, and polling checks until the store answers again.

use std::time::{Duration, Instant};

use sluice::{Error, FailureMode, LimitSpec, Limiter, Policy, Store, StoreError};
use sluice_testkit::RedisServer;

/// One fixed window of `max` an hour, closed: a store failure is an error, so the test sees
/// exactly when Redis answers again.
pub(crate) fn policy(max: u64) -> Policy {
    Policy::from_specs("api", vec![LimitSpec::fixed_window(max, 3_600_000)])
        .unwrap()
        .with_failure_mode(FailureMode::Closed)
}

/// Polls until every replica's replication offset reached the primary's (the writes so far
/// are on the replicas). `WAIT` cannot do it here: it waits for its own connection's writes,
/// and the store wrote through another one.
pub(crate) fn wait_replicated(primary: &RedisServer, replicas: &[&RedisServer]) {
    let offset = |s: &RedisServer, field: &str| -> u64 {
        s.info_field("replication", field)
            .unwrap()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let target = offset(primary, "master_repl_offset");
    assert!(target > 0, "the primary has written nothing");
    sluice_testkit::wait_until(Duration::from_secs(10), "replicas to catch up", || {
        Ok(replicas
            .iter()
            .all(|r| offset(r, "slave_repl_offset") >= target))
    })
    .unwrap();
}

/// Polls `check` every 5 ms until it succeeds, each failure transient and passed to
/// `failed`; returns its result, how long it took and how many checks failed meanwhile.
pub(crate) async fn until_ok<S: Store>(
    limiter: &Limiter<S>,
    key: &str,
    limit: Duration,
    failed: impl Fn(&StoreError),
) -> (sluice::Decision, Duration, u32) {
    let started = Instant::now();
    let mut failures = 0;
    loop {
        match limiter.check("api", key, 1).await {
            Ok(d) => return (d, started.elapsed(), failures),
            Err(Error::Store(e)) => {
                assert!(e.is_transient(), "{e}");
                failed(&e);
                failures += 1;
            }
            Err(e) => panic!("{e}"),
        }
        assert!(
            started.elapsed() < limit,
            "checks did not succeed within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
