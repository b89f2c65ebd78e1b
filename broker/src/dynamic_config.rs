//! The dynamic broker configs that take effect live: the replication throttle rates
//! (`leader.replication.throttled.rate`, `follower.replication.throttled.rate`).
//!
//! AlterConfigs on a BROKER resource stores them in `/config/brokers/<id>` or
//! `/config/brokers/<default>` ([`crate::handler::broker_configs`]), through whichever
//! broker took the request. Every broker keeps a data watch on both nodes (watches are
//! one-shot, so each event re-reads both and re-arms them; a lost session fires them
//! too) and sets its throttles from what it read: its own value wins over the default,
//! and a key set in neither means no throttle.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use fjord_coord::{paths, Store};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::handler::broker_configs::{self, DEFAULT_RESOURCE};
use crate::replication::throttle::{ReplicationThrottles, Side, FOLLOWER_RATE, LEADER_RATE, UNLIMITED};

/// How long the watcher waits before retrying a store read that failed.
const RETRY: Duration = Duration::from_secs(1);

/// The leader's and the follower's rate from this broker's dynamic configs (`own`) and
/// the cluster default's.
pub(crate) fn throttle_rates(own: &BTreeMap<String, String>, default: &BTreeMap<String, String>) -> (u64, u64) {
    let rate = |key: &str| {
        own.get(key)
            .or_else(|| default.get(key))
            // Stored values were checked on the way in (a non-negative long); anything
            // else was written around the broker and throttles nothing.
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(UNLIMITED)
    };
    (rate(LEADER_RATE), rate(FOLLOWER_RATE))
}

/// Spawns the watcher; it stops when `shutdown` fires.
pub(crate) fn spawn_watcher(
    tracker: &TaskTracker,
    store: Store,
    broker_id: i32,
    throttles: Arc<ReplicationThrottles>,
    shutdown: &CancellationToken,
) {
    let shutdown = shutdown.clone();
    tracker.spawn(async move {
        let (own_node, default_node) = (broker_id.to_string(), DEFAULT_RESOURCE.to_owned());
        loop {
            let armed = async {
                // Arm both watches first, then read, so no change falls in between.
                let (_, own_watch) = store.watch_data(&paths::broker_config(&own_node)).await?;
                let (_, default_watch) = store.watch_data(&paths::broker_config(&default_node)).await?;
                let (own, _) = broker_configs::read(&*store, &own_node).await?;
                let (default, _) = broker_configs::read(&*store, &default_node).await?;
                Ok::<_, crate::Error>((own, default, own_watch, default_watch))
            };
            match armed.await {
                Ok((own, default, own_watch, default_watch)) => {
                    let (leader, follower) = throttle_rates(&own, &default);
                    throttles.set_rate(Side::Leader, leader);
                    throttles.set_rate(Side::Follower, follower);
                    tokio::select! {
                        _ = own_watch => {}
                        _ = default_watch => {}
                        () = shutdown.cancelled() => return,
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the dynamic broker configs; retrying");
                    tokio::select! {
                        () = tokio::time::sleep(RETRY) => {}
                        () = shutdown.cancelled() => return,
                    }
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn a_brokers_own_rate_wins_over_the_default_and_none_means_unthrottled() {
        assert_eq!(throttle_rates(&map(&[]), &map(&[])), (UNLIMITED, UNLIMITED));
        let default = map(&[(LEADER_RATE, "1000"), (FOLLOWER_RATE, "2000")]);
        assert_eq!(throttle_rates(&map(&[]), &default), (1000, 2000));
        assert_eq!(throttle_rates(&map(&[(FOLLOWER_RATE, "5")]), &default), (1000, 5));
        assert_eq!(throttle_rates(&map(&[(LEADER_RATE, "oops")]), &map(&[])), (UNLIMITED, UNLIMITED));
    }
}
