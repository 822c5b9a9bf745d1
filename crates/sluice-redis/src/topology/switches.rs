//! Following Sentinel's announcements: each sentinel publishes `+switch-master <master>
//! <old-ip> <old-port> <new-ip> <new-port>` when it has promoted a replica. A store on
//! Sentinel subscribes on every sentinel and switches to the announced primary at once,
//! instead of waiting for the old one to fail a call. That matters most for a forced
//! `SENTINEL FAILOVER`: the old primary stays writable until Sentinel demotes it (about 10 s
//! later), and everything decided there meanwhile is lost (docs/scaling.md).
//!
//! The subscriptions hold only a weak reference to what switches (the store's
//! [`SentinelWatch`](super::sentinel::SentinelWatch), through [`Follower`]) and end with it; a
//! lost subscription is made again with a growing pause (100 ms to 5 s).

use std::sync::Weak;
use std::time::Duration;

use redis::Client;
use tokio_stream::StreamExt;

/// What a `+switch-master` announcement switches: it is told the announced primary's address.
pub(crate) trait Follower: Send + Sync + 'static {
    /// Switches to the primary at `host:port` (once it says it is one).
    fn switch_to(&self, host: &str, port: u16) -> impl Future<Output = ()> + Send;
}

const FIRST_PAUSE: Duration = Duration::from_millis(100);
const LONGEST_PAUSE: Duration = Duration::from_secs(5);

/// Subscribes to `+switch-master` on one sentinel for as long as `store` lives.
pub(crate) async fn follow<F: Follower>(
    store: Weak<F>,
    sentinel: String,
    client: Client,
    master: String,
) {
    let mut pause = FIRST_PAUSE;
    loop {
        if store.strong_count() == 0 {
            return;
        }
        match subscribe(&client).await {
            Ok(mut pubsub) => {
                pause = FIRST_PAUSE;
                let mut messages = pubsub.on_message();
                while let Some(message) = messages.next().await {
                    let Ok(payload) = message.get_payload::<String>() else {
                        continue;
                    };
                    let Some((host, port)) = announced(&payload, &master) else {
                        continue;
                    };
                    let Some(follower) = store.upgrade() else {
                        return;
                    };
                    follower.switch_to(&host, port).await;
                }
                tracing::debug!(%sentinel, "sentinel subscription ended; subscribing again");
            }
            Err(e) => {
                tracing::debug!(%sentinel, error = %e, "cannot subscribe to +switch-master");
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(LONGEST_PAUSE);
    }
}

async fn subscribe(client: &Client) -> redis::RedisResult<redis::aio::PubSub> {
    let mut pubsub = client.get_async_pubsub().await?;
    pubsub.subscribe("+switch-master").await?;
    Ok(pubsub)
}

/// The new primary's address in a `+switch-master` payload, if it is about `master`.
fn announced(payload: &str, master: &str) -> Option<(String, u16)> {
    let mut fields = payload.split(' ');
    if fields.next()? != master {
        return None;
    }
    let (_old_host, _old_port) = (fields.next()?, fields.next()?);
    let host = fields.next()?.to_owned();
    let port = fields.next()?.parse().ok()?;
    Some((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_watched_master_s_announcement_counts() {
        assert_eq!(
            announced("main 127.0.0.1 7001 127.0.0.1 7002", "main"),
            Some(("127.0.0.1".to_owned(), 7002))
        );
        assert_eq!(
            announced("other 127.0.0.1 7001 127.0.0.1 7002", "main"),
            None
        );
        assert_eq!(announced("main 127.0.0.1 7001", "main"), None);
        assert_eq!(announced("main a 1 b port", "main"), None);
    }
}
