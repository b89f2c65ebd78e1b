//! The production entry point: open the log dir and the metadata store, accept
//! connections, run the periodic log tasks, and shut down cleanly.

use fjord_auth::AclWatcher;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fjord_coord::registry::{to_json, BrokerRegistration};
use fjord_coord::{create_all, paths, CreateMode, MetadataStore, Store};
use fjord_log::{Cleaner, LogDirs};
use fjord_record::now_ms;
use std::net::SocketAddr;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::cluster::ClusterView;
use crate::controller;
use crate::controller::{ControllerConfig, Controllership, RebalanceConfig};
use crate::group::{Endpoint, GroupCoordinator};
use crate::handler::producer_id::ProducerIdManager;
use crate::handler::Broker;
use crate::limits::PartitionLimits;
use crate::listener::{ConnectionLimits, ListenerInfo, SecurityProtocol};
use crate::periodic::Periodic;
use crate::replication::{PeerConfig, PeerSasl, ReplicaManager};
use crate::topics::{TopicSettings, Topics};
use crate::{BrokerConfig, Error, Result};

/// The embedded metadata store's directory inside the log dir. No `-` in the name, so it
/// can never be mistaken for a `<topic>-<partition>` directory.
pub const METADATA_DIR: &str = "__metadata";
/// `meta.properties` in the log dir: which broker and cluster the directory belongs to.
const META_PROPERTIES: &str = "meta.properties";
/// How long a start waits for the controller to hand back offline partitions.
const OWED_LEADERSHIP_WAIT: Duration = Duration::from_secs(15);
/// How long a start waits for a stale registration of its broker id to expire.
const REGISTRATION_WAIT: Duration = Duration::from_secs(30);

/// Runs the broker until `shutdown` is cancelled, then stops accepting, closes the
/// connections, flushes every log and writes the checkpoints. `listener` (already bound)
/// serves the first of `listeners`; the others, if any, are bound here. Tests bind
/// `127.0.0.1:0` and call exactly this.
pub async fn run(config: BrokerConfig, listener: TcpListener, shutdown: CancellationToken) -> Result<()> {
    config.validate()?;
    std::fs::create_dir_all(&config.log_dir).map_err(|source| Error::Io { path: config.log_dir.clone(), source })?;
    let store = open_store(&config).await?;
    run_with_store(config, store, listener, shutdown).await
}

/// Binds every listener of `listeners`, in order (what [`run_listeners`] takes).
pub async fn bind(config: &BrokerConfig) -> Result<Vec<TcpListener>> {
    let mut bound = Vec::with_capacity(config.listeners.len());
    for listener in config.listeners.iter() {
        bound.push(bind_one(listener).await?);
    }
    Ok(bound)
}

async fn bind_one(listener: &crate::ListenerConfig) -> Result<TcpListener> {
    TcpListener::bind(listener.address).await.map_err(|e| Error::InvalidConfig {
        key: "listeners".into(),
        value: format!("{}://{}", listener.name, listener.address),
        reason: format!("cannot listen there: {e}"),
    })
}

/// The metadata store `run` uses: ZooKeeper when `zookeeper.connect` is set, otherwise
/// the embedded store in the log dir. `fjord dev` opens it once and shares it with the
/// schema registry.
pub async fn open_store(config: &BrokerConfig) -> Result<Store> {
    Ok(match &config.zookeeper_connect {
        Some(connect) => Arc::new(fjord_coord::ZooKeeperStore::connect(connect, config.zookeeper_session_timeout).await?),
        None => fjord_coord::open(None, &config.log_dir.join(METADATA_DIR)).await?,
    })
}

/// [`run`] on a metadata store the caller opened (see [`open_store`]).
pub async fn run_with_store(
    config: BrokerConfig,
    store: Store,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<()> {
    config.validate()?;
    // The first listener is the caller's; binding it again here would fail (in use).
    let mut listeners = vec![listener];
    for rest in config.listeners.iter().skip(1) {
        listeners.push(bind_one(rest).await?);
    }
    run_listeners(config, store, listeners, shutdown).await
}

/// [`run_with_store`] on every listener already bound: `listeners[i]` serves the i-th
/// entry of the `listeners` key (see [`bind`]).
pub async fn run_listeners(
    config: BrokerConfig,
    store: Store,
    listeners: Vec<TcpListener>,
    shutdown: CancellationToken,
) -> Result<()> {
    config.validate()?;
    if listeners.len() != config.listeners.len() {
        return Err(Error::InvalidConfig {
            key: "listeners".into(),
            value: format!("{} bound", listeners.len()),
            reason: format!("{} listeners are configured", config.listeners.len()),
        });
    }
    let bound: Vec<SocketAddr> =
        listeners.iter().map(TcpListener::local_addr).collect::<std::io::Result<_>>().map_err(Error::Network)?;
    let plan = config.listener_plan(&bound)?;
    // TLS files are loaded before anything else starts, so a bad file stops the start
    // with a message instead of failing every handshake.
    let tls = match plan.iter().any(|l| l.protocol.tls()) {
        true => Some(crate::tls::server(config.ssl.clone())?),
        false => None,
    };
    let inter_broker = plan
        .iter()
        .find(|l| l.name == config.inter_broker_listener())
        .cloned()
        .expect("invariant: listener_plan checked the inter-broker listener");
    let metrics_listener = match config.metrics_listen {
        Some(addr) => Some(TcpListener::bind(addr).await.map_err(|e| Error::InvalidConfig {
            key: "metrics.listen".into(),
            value: addr.to_string(),
            reason: format!("cannot listen there: {e}"),
        })?),
        None => None,
    };
    // Every log dir carries meta.properties with the same broker and cluster id (Kafka):
    // the first decides when the store has none yet, the others must agree. Of several,
    // one that cannot be read or written is offline (its partitions are not served), as
    // Kafka starts without a failed log dir; another cluster's or broker's is refused.
    let mut cluster_id = None;
    let mut failed_dirs = std::collections::BTreeMap::new();
    let several = !config.other_log_dirs.is_empty();
    for dir in config.log_dirs() {
        let checked = match std::fs::create_dir_all(&dir) {
            Ok(()) => self::cluster_id(&*store, &dir, config.broker_id).await,
            Err(source) => Err(Error::Io { path: dir.clone(), source }),
        };
        match checked {
            Ok(id) => cluster_id = Some(id),
            Err(e @ Error::Io { .. }) if several => {
                tracing::error!(log_dir = %dir.display(), error = %e, "cannot use this log dir's meta.properties: the log dir is offline");
                failed_dirs.insert(dir, e.to_string());
            }
            Err(e) => return Err(e),
        }
    }
    let Some(cluster_id) = cluster_id else {
        return Err(Error::InvalidConfig {
            key: "log.dirs".into(),
            value: config.log_dirs().iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(","),
            reason: "every log dir is offline".into(),
        });
    };
    // Before the logs open: every replica holds descriptors, and the default partition
    // limit follows the open-file limit.
    let open_files = crate::limits::raise_open_file_limit();
    let limits = PartitionLimits::resolve(
        config.max_partitions_per_request,
        config.max_partitions_per_broker,
        open_files,
        config.segment_files_open_max,
    );
    // Before the logs open: opening reads sealed segments through this cache.
    fjord_log::FileCache::global().set_capacity(config.segment_files_open_max);
    let logs = {
        let (dirs, defaults) = (config.log_dirs(), config.log);
        Arc::new(tokio::task::spawn_blocking(move || LogDirs::open_except(dirs, &failed_dirs, defaults)).await??)
    };
    let (host, port) = (inter_broker.host.clone(), i32::from(inter_broker.port));
    let registration = BrokerRegistration {
        host: host.clone(),
        port: inter_broker.port,
        rack: config.broker_rack.clone(),
        endpoints: plan.iter().map(ListenerInfo::endpoint).collect(),
        listener_security_protocol_map: plan.iter().map(|l| (l.name.clone(), l.protocol.name().to_owned())).collect(),
    };
    register(&*store, config.broker_id, &registration).await?;
    // Everything below runs until `stop`, which a controlled shutdown fires only once
    // this broker leads nothing any more.
    let stop = CancellationToken::new();
    let tracker = TaskTracker::new();
    let settings = TopicSettings { log: config.log, unclean_leader_election: config.unclean_leader_election };
    let peer = peer_config(&config, &inter_broker)?;
    let txns = crate::txn::TxnCoordinator::new(config.transaction.clone(), peer.clone(), config.broker_id);
    let replicas = ReplicaManager::new(config.broker_id, store.clone(), config.replication, peer);
    let view = ClusterView::new(store.clone(), settings, logs.clone(), replicas.clone());
    if let Err(e) = view.start(&tracker, &stop).await {
        stop.cancel();
        tracker.close();
        tracker.wait().await;
        deregister(&*store, config.broker_id).await;
        return Err(e);
    }
    let controller_config = ControllerConfig {
        unclean_default: config.unclean_leader_election,
        rebalance: config.auto_leader_rebalance.then_some(RebalanceConfig {
            interval: config.leader_imbalance_check_interval,
            percentage: config.leader_imbalance_per_broker_percentage,
        }),
    };
    let controllership = Arc::new(Controllership::default());
    tracker.spawn(controller::run(store.clone(), config.broker_id, controller_config, controllership.clone(), stop.clone()));
    tracker.spawn(keep_registered(store.clone(), config.broker_id, registration, shutdown.clone()));
    tracker.spawn(crate::replica_health::publish(
        store.clone(),
        config.broker_id,
        logs.clone(),
        replicas.health_changed(),
        stop.clone(),
    ));
    // A broker that was the last in-sync replica of a partition (a single broker
    // restarting, say) gets it back from the controller right after registering; wait
    // for that (bounded), so the first clients find it leading as before the restart.
    let me = config.broker_id;
    if !view.wait_for(OWED_LEADERSHIP_WAIT, |v| v.owed_to(me).is_empty()).await {
        tracing::warn!(partitions = ?view.owed_to(me), "the controller has not made this broker leader of its offline partitions yet");
    }
    let topics = Topics::new(store.clone(), view.clone(), replicas.clone(), settings, limits);
    tracing::info!(
        broker_id = config.broker_id,
        listening = ?bound,
        endpoints = ?registration_endpoints(&plan),
        inter_broker_listener = %inter_broker.name,
        log_dirs = ?config.log_dirs(),
        %cluster_id,
        zookeeper = config.zookeeper_connect.as_deref().unwrap_or("embedded store"),
        rack = config.broker_rack.as_deref().unwrap_or("none"),
        topics = topics.list().len(),
        zero_copy_fetch = config.fetch_zero_copy,
        max_partitions_per_broker = limits.per_broker,
        max_partitions_per_request = limits.per_request,
        "broker started"
    );
    // With authorization on, the first ACL snapshot is in place before the first request.
    let acls = match config.authorizer_enable {
        true => match AclWatcher::start(store.clone(), config.authorizer.clone(), &tracker, stop.clone()).await {
            Ok(watcher) => Some(watcher),
            Err(e) => {
                stop.cancel();
                tracker.close();
                tracker.wait().await;
                deregister(&*store, config.broker_id).await;
                return Err(e.into());
            }
        },
        false => None,
    };
    // Like the ACLs, the stored client quotas are in place before the first request.
    let quotas = Arc::new(crate::quota::ClientQuotas::new(config.quota_window));
    crate::quota::store::start_watcher(quotas.clone(), store.clone(), &tracker, stop.clone()).await;
    let endpoint = Endpoint { broker_id: config.broker_id, listeners: plan.clone() };
    let groups = GroupCoordinator::new(store.clone(), endpoint, config.group.clone());
    // On a cluster, leadership is handed over before this broker stops serving; alone
    // (the embedded store) there is nobody to hand it to.
    let controlled = config.controlled_shutdown && config.zookeeper_connect.is_some();
    let handover = config.controlled_shutdown_timeout;
    let producer_ids = ProducerIdManager::new(store.clone(), config.broker_id);
    if config.audit.enable && config.observer.is_none() {
        // The counting lives above the broker (fjord-audit); a binary that does not wire
        // it must not appear to audit.
        return Err(Error::InvalidConfig {
            key: "audit.enable".into(),
            value: "true".into(),
            reason: "this program runs the broker without the audit's broker tier (fjord_audit::BrokerTier)".into(),
        });
    }
    let observer = config.observer.clone();
    let request_memory = crate::request_memory::RequestMemory::new(config.queued_max_request_bytes);
    let broker = Arc::new(Broker {
        config,
        cluster_id,
        topics,
        replicas,
        groups,
        metrics: Default::default(),
        producer_ids,
        txns,
        controllership,
        listeners: plan.clone(),
        connections: ConnectionLimits::default(),
        request_memory,
        tls,
        acls,
        quotas,
        tasks: tracker.clone(),
        stop: stop.clone(),
    });
    // The observer may talk to this broker like any client (the accept loop below serves
    // it): over a plaintext listener when there is one, else over the inter-broker
    // listener as this broker authenticates to its peers.
    if let Some(observer) = &observer {
        let plaintext = broker.listeners.iter().find(|l| l.protocol == SecurityProtocol::Plaintext);
        let own = plaintext.unwrap_or(&inter_broker);
        let bootstrap = format!("{}:{}", own.host, own.port);
        let client_properties =
            if plaintext.is_some() { Default::default() } else { observer_client_properties(&broker.config, own) };
        observer.serving(&crate::observer::Serving {
            broker_id: broker.config.broker_id,
            host: host.clone(),
            port,
            bootstrap,
            client_properties,
        });
    }
    {
        let (store, view, replicas, shutdown, stop) =
            (store.clone(), view.clone(), broker.replicas.clone(), shutdown.clone(), stop.clone());
        tracker.spawn(async move {
            tokio::select! {
                () = shutdown.cancelled() => {}
                () = stop.cancelled() => return,
            }
            if controlled {
                // The audit's counts so far go out while this broker may still lead
                // `_audit`: the last broker of a cluster takes it offline when it hands over.
                if let Some(observer) = &observer {
                    observer.before_handover().await;
                }
                // A leaving broker follows nobody (as Kafka's controller stops its
                // replicas): were it to keep fetching, the new leaders would take it back
                // into their ISRs just before it exits, and acks=all would then wait
                // replica.lag.time.max.ms for it to be dropped again.
                replicas.shutdown().await;
                controlled_shutdown(&*store, &view, handover).await;
            }
            // The last audit counts go out while connections are still served; in cluster
            // mode after leadership moved away, so no append is counted after the flush
            // (usually nothing is left by then, and nothing is sent).
            if let Some(observer) = &observer {
                observer.stopping().await;
            }
            stop.cancel();
        });
    }

    spawn_periodic_tasks(&tracker, &logs, &broker.config, &stop);
    spawn_dir_failure_watch(&tracker, &logs, &broker.replicas, &stop);
    spawn_follower_log_start_checkpoint(&tracker, &logs, &broker.replicas, &stop);
    spawn_cleaner(&tracker, &logs, &broker.config, &stop);
    crate::topic_config::spawn_watcher(&tracker, &broker, &stop);
    crate::dynamic_config::spawn_watcher(
        &tracker,
        store.clone(),
        broker.config.broker_id,
        broker.replicas.throttles().clone(),
        &stop,
    );
    crate::txn::spawn(&tracker, &broker, &stop);
    if let Some(listener) = metrics_listener {
        tracing::info!(address = %listener.local_addr().map_err(Error::Network)?, "serving metrics at /metrics");
        let pages = Arc::new(crate::metrics::BrokerPages(broker.clone()));
        let security = broker.config.metrics_security.clone();
        fjord_metrics::endpoint::serve(listener, security, Some(store.clone()), pages, &tracker, stop.clone()).await?;
    }
    let accepting = TaskTracker::new();
    for (listener, info) in listeners.into_iter().zip(plan) {
        accepting.spawn(crate::listener::accept(broker.clone(), listener, Arc::new(info), tracker.clone(), stop.clone()));
    }
    accepting.close();
    accepting.wait().await;
    tracker.close();
    // Also waits for a clean in progress: the logs are closed only once no swap is running.
    tracker.wait().await;
    // No fetcher may append while the logs close.
    broker.replicas.shutdown().await;
    {
        let logs = logs.clone();
        tokio::task::spawn_blocking(move || logs.close()).await??;
    }
    // Leave at once rather than when the session expires, so a restart need not wait.
    deregister(&*store, broker.config.broker_id).await;
    tracing::info!("broker stopped: logs flushed and checkpointed");
    Ok(())
}

/// How replica fetchers reach the inter-broker listener: its TLS and SASL as configured.
fn peer_config(config: &BrokerConfig, inter_broker: &ListenerInfo) -> Result<PeerConfig> {
    let mut peer = PeerConfig::plaintext(&inter_broker.name);
    if inter_broker.protocol.tls() {
        peer.tls = Some(Arc::new(crate::tls::client_config(&config.ssl)?));
    }
    if inter_broker.protocol.sasl() {
        let missing = |key: &str| Error::InvalidConfig {
            key: key.into(),
            value: String::new(),
            reason: format!("the inter-broker listener {} authenticates with SASL: brokers need an identity", inter_broker.name),
        };
        let username = config.inter_broker_sasl_username.clone().ok_or_else(|| missing("inter.broker.sasl.username"))?;
        let password = config.inter_broker_sasl_password.clone().ok_or_else(|| missing("inter.broker.sasl.password"))?;
        peer.sasl = Some(PeerSasl { mechanism: config.sasl_inter_broker_mechanism, username, password: password.0 });
    }
    Ok(peer)
}

/// The Kafka client settings that reach `listener` as this broker's replica fetchers
/// do (see [`peer_config`]): its protocol, the truststore as CA, the keystore as client
/// certificate, the inter-broker SASL identity.
fn observer_client_properties(config: &BrokerConfig, listener: &ListenerInfo) -> crate::observer::ClientProperties {
    let mut properties = vec![("security.protocol".to_owned(), listener.protocol.name().to_owned())];
    let mut set = |key: &str, value: Option<String>| {
        if let Some(value) = value {
            properties.push((key.to_owned(), value));
        }
    };
    if listener.protocol.tls() {
        let path = |p: &Option<std::path::PathBuf>| p.as_ref().map(|p| p.to_string_lossy().into_owned());
        set("ssl.ca.location", path(&config.ssl.truststore_location));
        set("ssl.certificate.location", path(&config.ssl.keystore_location));
        set("ssl.key.location", path(&config.ssl.keystore_location));
    }
    if listener.protocol.sasl() {
        set("sasl.mechanism", Some(config.sasl_inter_broker_mechanism.name().to_owned()));
        set("sasl.username", config.inter_broker_sasl_username.clone());
        set("sasl.password", config.inter_broker_sasl_password.as_ref().map(|p| p.0.clone()));
    }
    crate::observer::ClientProperties(properties)
}

/// `NAME://host:port` of each listener, for the start-up log line.
fn registration_endpoints(plan: &[ListenerInfo]) -> Vec<String> {
    plan.iter().map(|l| format!("{} ({})", l.endpoint(), l.protocol)).collect()
}

/// Deletes `/brokers/ids/<id>` (a missing node is fine); false when the metadata store
/// cannot be reached or did not answer within [`DEREGISTER_TIMEOUT`].
async fn deregister(store: &dyn MetadataStore, broker_id: i32) -> bool {
    match tokio::time::timeout(DEREGISTER_TIMEOUT, store.delete(&paths::broker(broker_id), None)).await {
        Ok(Ok(()) | Err(fjord_coord::Error::NoNode { .. })) => true,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "could not remove this broker's registration");
            !e.is_store_unreachable()
        }
        Err(_) => {
            tracing::warn!(timeout = ?DEREGISTER_TIMEOUT, "could not remove this broker's registration: the metadata store did not answer");
            false
        }
    }
}

/// How long a stopping broker waits for the metadata store to remove its registration:
/// a store that cannot be reached held a shutdown ~10 s on this one call (and the node
/// goes with the session anyway).
const DEREGISTER_TIMEOUT: Duration = Duration::from_secs(3);

/// Kafka's controlled shutdown: deregister, so the controller moves this broker's
/// leaderships to other ISR members as for a failure (or marks them offline when there
/// is none), and keep serving until no partition state names this broker leader, at
/// most `timeout`; at once when the metadata store cannot be reached.
async fn controlled_shutdown(store: &dyn MetadataStore, view: &ClusterView, timeout: Duration) {
    let me = view.broker_id();
    let started = tokio::time::Instant::now();
    let leading = view.led_by(me).len();
    tracing::info!(broker_id = me, leading, "controlled shutdown: deregistering and waiting for leadership to move");
    if !deregister(store, me).await {
        // No controller can move anything this broker would see: waiting only held a
        // broker without its ZooKeeper 30 s on SIGTERM. Its leaderships move (or go
        // offline) when its session expires, as after a crash.
        tracing::warn!(
            broker_id = me,
            leading,
            "controlled shutdown: the metadata store cannot be reached; stopping without waiting for leadership to move"
        );
        return;
    }
    if view.wait_for(timeout, |v| v.led_by(me).is_empty()).await {
        tracing::info!(
            broker_id = me,
            leading,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "controlled shutdown: leadership moved"
        );
    } else {
        let left = view.led_by(me);
        tracing::warn!(broker_id = me, still_leading = ?left, ?timeout, "controlled shutdown timed out; stopping anyway");
    }
}

/// Registers again when the registration disappears while the broker runs: after a
/// session expiry ZooKeeper drops it with the session. Stops at `shutdown` (a
/// controlled shutdown deregisters on purpose right after).
async fn keep_registered(store: Store, broker_id: i32, registration: BrokerRegistration, shutdown: CancellationToken) {
    let path = paths::broker(broker_id);
    loop {
        let outcome = match store.watch_data(&path).await {
            Ok((Some((_, stat)), watch)) if stat.ephemeral_owner == store.session_id() => {
                tokio::select! {
                    _ = watch => continue,
                    () = shutdown.cancelled() => return,
                }
            }
            // An older session's node: wait for it to expire.
            Ok((Some(_), watch)) => {
                tokio::select! {
                    _ = watch => continue,
                    () = shutdown.cancelled() => return,
                }
            }
            Ok((None, _)) if shutdown.is_cancelled() => return,
            Ok((None, _)) => match create_all(&*store, &path, &to_json(&registration), CreateMode::Ephemeral).await {
                Ok(_) => {
                    tracing::warn!(broker_id, "registration was lost (session expired?); registered again");
                    continue;
                }
                Err(fjord_coord::Error::NodeExists { .. }) => continue,
                Err(e) => e,
            },
            Err(e) => e,
        };
        tracing::warn!(broker_id, error = %outcome, "keeping the registration failed; retrying");
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(500)) => {}
            () = shutdown.cancelled() => return,
        }
    }
}

/// `/brokers/ids/<id>`, ephemeral: this broker is alive and reachable there.
async fn register(store: &dyn MetadataStore, broker_id: i32, registration: &BrokerRegistration) -> Result<()> {
    let path = paths::broker(broker_id);
    // After a crash, ZooKeeper keeps the previous session's node until that session
    // expires; wait for it (as Kafka does) rather than fail the start.
    let deadline = tokio::time::Instant::now() + REGISTRATION_WAIT;
    loop {
        match create_all(store, &path, &to_json(registration), CreateMode::Ephemeral).await {
            Err(fjord_coord::Error::NodeExists { .. }) if tokio::time::Instant::now() < deadline => {
                tracing::info!(path, "a previous registration of this broker id is still alive; waiting for it to expire");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(fjord_coord::Error::NodeExists { .. }) => {
                return Err(Error::InvalidConfig {
                    key: "broker.id".into(),
                    value: broker_id.to_string(),
                    reason: "another live broker is registered with this id".into(),
                })
            }
            other => return other.map(drop).map_err(Error::from),
        }
    }
}

/// Retention, `flush.ms` and the checkpoint files, each on its own interval, on the
/// blocking pool (the log is synchronous).
fn spawn_periodic_tasks(tracker: &TaskTracker, logs: &Arc<LogDirs>, config: &BrokerConfig, shutdown: &CancellationToken) {
    type Job = fn(&LogDirs) -> Result<(), fjord_log::Error>;
    let jobs: [(&str, Duration, Job); 3] = [
        ("retention", config.retention_check_interval, |logs| {
            let deleted = logs.apply_retention(now_ms())?;
            if deleted > 0 {
                tracing::info!(segments = deleted, "retention deleted segments");
            }
            Ok(())
        }),
        ("flush", config.flush_scheduler_interval, |logs| logs.flush_due(now_ms())),
        ("checkpoint", config.checkpoint_interval, LogDirs::checkpoint),
    ];
    spawn_scrubber(tracker, logs, config.scrub_bytes_per_second, shutdown);
    for (name, every, job) in jobs {
        let (logs, shutdown) = (logs.clone(), shutdown.clone());
        tracker.spawn(async move {
            let mut periodic = Periodic::new(every);
            while periodic.tick_until(&shutdown).await {
                run_log_task(name, &logs, job).await;
            }
        });
    }
}

/// Runs one round of a background log task on the blocking pool (the log is synchronous)
/// and logs how it failed: the loop that runs it carries on, and the next round tries again.
async fn run_log_task(
    task: &'static str,
    logs: &Arc<LogDirs>,
    job: impl FnOnce(&LogDirs) -> Result<(), fjord_log::Error> + Send + 'static,
) {
    let logs = logs.clone();
    match tokio::task::spawn_blocking(move || job(&logs)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!(task, error = %e, "background log task failed"),
        Err(e) => tracing::error!(task, error = %e, "background log task panicked"),
    }
}

/// Writes the checkpoints when a follower moved its log start up to its leader's (a
/// DeleteRecords on the leader): the start must survive a restart, or the follower,
/// once leader, would serve the deleted records again. Moves close together share one
/// write (a notification coalesces).
fn spawn_follower_log_start_checkpoint(
    tracker: &TaskTracker,
    logs: &Arc<LogDirs>,
    replicas: &Arc<ReplicaManager>,
    shutdown: &CancellationToken,
) {
    let (logs, moved, shutdown) = (logs.clone(), replicas.log_start_moved(), shutdown.clone());
    tracker.spawn(async move {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = moved.notified() => {}
            }
            run_log_task("log start offset checkpoint", &logs, LogDirs::checkpoint).await;
        }
    });
}

/// Stops serving the replicas of a log dir that failed (see [`LogDirs::fail`]; the
/// periodic flush and checkpoint find it): every second, each replica whose directory
/// went offline is dropped from the replica manager (it stops leading and following, and
/// clients get KAFKA_STORAGE_ERROR for it), and the health publisher is woken so the
/// controller moves its leadership to another in-sync replica.
fn spawn_dir_failure_watch(
    tracker: &TaskTracker,
    logs: &Arc<LogDirs>,
    replicas: &Arc<ReplicaManager>,
    shutdown: &CancellationToken,
) {
    let (logs, replicas, shutdown) = (logs.clone(), replicas.clone(), shutdown.clone());
    tracker.spawn(async move {
        let mut periodic = Periodic::new(Duration::from_secs(1));
        while periodic.tick_until(&shutdown).await {
            let failed = logs.take_failed();
            if failed.is_empty() {
                continue;
            }
            for tp in &failed {
                replicas.remove(tp);
            }
            tracing::error!(partitions = ?failed, "replicas of a failed log dir are no longer served");
            replicas.health_changed().notify_one();
        }
    });
}

/// The scrubber: every second, CRC-checks that second's share of
/// `log.scrub.bytes.per.second` (see [`LogDirs::scrub`]; off at 0), then refreshes
/// the partitions' health that Metadata, the metrics and the replica fetchers read
/// (damage found by reads as well).
fn spawn_scrubber(tracker: &TaskTracker, logs: &Arc<LogDirs>, bytes_per_second: u64, shutdown: &CancellationToken) {
    let (logs, shutdown) = (logs.clone(), shutdown.clone());
    tracker.spawn(async move {
        let mut periodic = Periodic::new(Duration::from_secs(1));
        while periodic.tick_until(&shutdown).await {
            let scrub = move |logs: &LogDirs| {
                if bytes_per_second > 0 {
                    logs.scrub(bytes_per_second);
                }
                logs.refresh_health();
                Ok(())
            };
            run_log_task("scrub", &logs, scrub).await;
        }
    });
}

/// The log cleaner: every `log.cleaner.backoff.ms`, compacts the logs whose dirty
/// ratio (or expired tombstones) make them due. One [`Cleaner`] per broker, so its
/// offset map is allocated once and its I/O throttle covers every log. A clean blocks
/// (file I/O, throttling sleeps), so it runs on the blocking pool; the task awaits it
/// outside the `select!`, so shutdown waits for a running clean to finish.
fn spawn_cleaner(tracker: &TaskTracker, logs: &Arc<LogDirs>, config: &BrokerConfig, shutdown: &CancellationToken) {
    let config = config.cleaner;
    let (logs, shutdown) = (logs.clone(), shutdown.clone());
    tracker.spawn(async move {
        let mut cleaner = Some(Cleaner::new(config));
        let mut periodic = Periodic::new(config.backoff);
        while periodic.tick_until(&shutdown).await {
            let logs = logs.clone();
            let mut running = cleaner.take().unwrap_or_else(|| Cleaner::new(config));
            let job = tokio::task::spawn_blocking(move || {
                let outcomes: Vec<_> = logs
                    .dirs()
                    .into_iter()
                    .filter_map(|dir| dir.state.ok())
                    .flat_map(|logs| running.clean_due(&logs, now_ms()))
                    .collect();
                (running, outcomes)
            });
            match job.await {
                Ok((running, outcomes)) => {
                    cleaner = Some(running);
                    for (tp, outcome) in outcomes {
                        match outcome {
                            Ok(stats) => tracing::info!(
                                partition = %tp,
                                dirty_ratio = stats.dirty_ratio,
                                first_dirty_before = stats.first_dirty_before,
                                first_dirty_after = stats.first_dirty_after,
                                passes = stats.passes,
                                segments = stats.segments_cleaned,
                                bytes_before = stats.bytes_before,
                                bytes_after = stats.bytes_after,
                                records_read = stats.records_read,
                                records_kept = stats.records_kept,
                                tombstones_removed = stats.tombstones_removed,
                                elapsed_ms = stats.elapsed.as_millis() as u64,
                                "cleaned log"
                            ),
                            // The log is retried next time unless the cleaner marked it
                            // failed.
                            Err(e) => tracing::error!(partition = %tp, error = %e, "cleaning a log failed"),
                        }
                    }
                }
                // The cleaner is lost with the panic; the next round starts a fresh one.
                Err(e) => tracing::error!(error = %e, "log cleaner panicked"),
            }
        }
    });
}

/// The cluster's id, the metadata store's (`/cluster/id`, created by the first broker to
/// start), checked against the log dir's `meta.properties` as Kafka does: a log dir that
/// belongs to another cluster is refused ([`Error::InconsistentClusterId`]), so a broker
/// pointed at the wrong metadata never serves (or mixes in) another cluster's data. A log
/// dir without a cluster id (fresh, or its `cluster.id` line removed) takes the store's.
async fn cluster_id(store: &dyn MetadataStore, dir: &Path, broker_id: i32) -> Result<String> {
    let path = dir.join(META_PROPERTIES);
    let local = read_meta_properties(&path, broker_id)?;
    // A log dir of a store that had no id yet (one made before ids lived in the store)
    // keeps its own, so upgrading a single broker changes nothing.
    let candidate = local.clone().unwrap_or_else(new_cluster_id);
    let cluster = fjord_coord::registry::get_or_create_cluster_id(store, &candidate).await?;
    match local {
        Some(stored) if stored != cluster => Err(Error::InconsistentClusterId { path, stored, cluster }),
        Some(_) => Ok(cluster),
        None => {
            write_meta_properties(&path, broker_id, &cluster)?;
            Ok(cluster)
        }
    }
}

/// Reads `meta.properties` (`broker.id`, `cluster.id`): the cluster id, `None` when the
/// file or its `cluster.id` is missing. A log dir of another broker id is refused.
///
/// Fjord writes a `#crc32c=` comment line (Kafka's readers skip comments) covering the
/// lines after it. A file that fails it, is not text, or has no readable `broker.id` is
/// damaged, not another broker's: it is moved aside (`meta.properties.damaged-<unix ms>`,
/// kept for the operator) with a warning and `None` is returned, so the broker writes a
/// fresh one from its config and the store's cluster id instead of refusing to start. Only
/// an intact file can claim another broker or cluster. A file without the line (Kafka's,
/// or Fjord's before it) is read as before.
fn read_meta_properties(path: &Path, broker_id: i32) -> Result<Option<String>> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(Error::Io { path: path.to_path_buf(), source }),
    };
    let parsed = parse_meta_properties(&bytes);
    let Some((stored_id, cluster_id)) = parsed.as_ref().ok() else {
        let why = parsed.err().unwrap_or_default();
        let aside = path.with_file_name(format!("{META_PROPERTIES}.damaged-{}", now_ms()));
        std::fs::rename(path, &aside).map_err(|source| Error::Io { path: path.to_path_buf(), source })?;
        tracing::warn!(
            path = %path.display(), kept_as = %aside.display(), why,
            "meta.properties is damaged: moved aside; a new one is written from broker.id and the metadata store's cluster id"
        );
        return Ok(None);
    };
    let bad = |reason: String| Error::MetaProperties { path: path.to_path_buf(), reason };
    match *stored_id {
        id if id == broker_id => Ok(cluster_id.clone()),
        id => Err(bad(format!("log dir belongs to broker.id {id}, this broker is {broker_id}"))),
    }
}

/// The comment line carrying the checksum of the lines after it.
const META_CHECKSUM: &str = "#crc32c=";

/// `meta.properties`' broker id and cluster id, or why the file is damaged.
fn parse_meta_properties(bytes: &[u8]) -> std::result::Result<(i32, Option<String>), &'static str> {
    let text = std::str::from_utf8(bytes).map_err(|_| "not UTF-8 text")?;
    if let Some(at) = text.find(&format!("\n{META_CHECKSUM}")).map(|i| i + 1).or(text.starts_with(META_CHECKSUM).then_some(0)) {
        let line_end = text[at..].find('\n').map(|i| at + i + 1).ok_or("the checksum line is cut short")?;
        let stored = text[at + META_CHECKSUM.len()..line_end - 1].trim();
        let stored = u32::from_str_radix(stored, 16).map_err(|_| "bad checksum value")?;
        if fjord_record::batch::crc32c(&text.as_bytes()[line_end..]) != stored {
            return Err("checksum mismatch: the file was damaged after it was written");
        }
    }
    let mut stored_id = None;
    let mut cluster_id = None;
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        match line.split_once('=') {
            Some(("broker.id", v)) => stored_id = v.trim().parse::<i32>().ok(),
            Some(("cluster.id", v)) if !v.trim().is_empty() => cluster_id = Some(v.trim().to_owned()),
            _ => {}
        }
    }
    Ok((stored_id.ok_or("missing or malformed broker.id")?, cluster_id))
}

/// Writes `meta.properties` atomically (a temp file, fsynced, renamed, the dir fsynced),
/// with the checksum line.
fn write_meta_properties(path: &Path, broker_id: i32, cluster_id: &str) -> Result<()> {
    let body = format!("version=0\nbroker.id={broker_id}\ncluster.id={cluster_id}\n");
    let text = format!("#Written by fjord\n{META_CHECKSUM}{:08x}\n{body}", fjord_record::batch::crc32c(body.as_bytes()));
    let tmp = path.with_file_name(format!("{META_PROPERTIES}.tmp"));
    let written = std::fs::File::create(&tmp)
        .and_then(|mut f| std::io::Write::write_all(&mut f, text.as_bytes()).and_then(|()| f.sync_all()))
        .and_then(|()| std::fs::rename(&tmp, path))
        .and_then(|()| path.parent().map_or(Ok(()), |dir| std::fs::File::open(dir).and_then(|d| d.sync_all())));
    written.map_err(|source| Error::Io { path: path.to_path_buf(), source })
}

/// A 22-character URL-safe base64 id of 128 random bits, the shape of Kafka's cluster ids.
/// The randomness comes from std's randomly keyed hasher, seeded per process by the OS.
fn new_cluster_id() -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut bits: u128 = 0;
    for i in 0..2u64 {
        let mut hasher = RandomState::new().build_hasher();
        hasher.write_u64(i);
        hasher.write_u128(SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
        bits = (bits << 64) | u128::from(hasher.finish());
    }
    (0..22).map(|i| ALPHABET[((bits >> (i * 6)) & 63) as usize] as char).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_cluster_id_is_the_stores_and_another_clusters_log_dir_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = fjord_coord::EmbeddedStore::open(&dir.path().join("store")).unwrap();
        let (first, second, third) = (dir.path().join("b1"), dir.path().join("b2"), dir.path().join("b3"));
        for d in [&first, &second, &third] {
            std::fs::create_dir(d).unwrap();
        }
        let cluster = cluster_id(&store, &first, 1).await.unwrap();
        assert_eq!(cluster.len(), 22);
        assert_eq!(cluster_id(&store, &first, 1).await.unwrap(), cluster);
        assert_eq!(cluster_id(&store, &second, 2).await.unwrap(), cluster, "a fresh log dir takes the store's id");
        assert!(std::fs::read_to_string(second.join(META_PROPERTIES)).unwrap().contains(&format!("cluster.id={cluster}")));
        assert!(matches!(cluster_id(&store, &first, 2).await, Err(Error::MetaProperties { .. })), "another broker's dir");
        std::fs::write(third.join(META_PROPERTIES), "version=0\nbroker.id=3\ncluster.id=AnotherClustersId00000\n").unwrap();
        let refused = cluster_id(&store, &third, 3).await.unwrap_err();
        assert!(
            matches!(&refused, Error::InconsistentClusterId { stored, cluster: c, .. } if stored == "AnotherClustersId00000" && *c == cluster)
        );
        let message = refused.to_string();
        assert!(message.contains("AnotherClustersId00000") && message.contains(&cluster), "{message}");
        // Without its cluster.id line the log dir joins the store's cluster.
        std::fs::write(third.join(META_PROPERTIES), "version=0\nbroker.id=3\n").unwrap();
        assert_eq!(cluster_id(&store, &third, 3).await.unwrap(), cluster);
        assert_ne!(new_cluster_id(), new_cluster_id());
    }

    /// A damaged meta.properties (cut short, one digit of the broker id flipped, garbage)
    /// is moved aside and written anew instead of stopping the broker; an intact one of
    /// another broker is still refused.
    #[tokio::test]
    async fn a_damaged_meta_properties_is_kept_aside_and_rebuilt() {
        let dir = tempfile::tempdir().unwrap();
        let store = fjord_coord::EmbeddedStore::open(&dir.path().join("store")).unwrap();
        let log_dir = dir.path().join("b1");
        std::fs::create_dir(&log_dir).unwrap();
        let cluster = cluster_id(&store, &log_dir, 1).await.unwrap();
        let path = log_dir.join(META_PROPERTIES);
        let good = std::fs::read(&path).unwrap();
        assert!(String::from_utf8_lossy(&good).contains("\n#crc32c="), "written with its checksum");
        let flipped = String::from_utf8(good.clone()).unwrap().replace("broker.id=1", "broker.id=3").into_bytes();
        for (kind, bytes) in
            [("truncated", good[..good.len() - 9].to_vec()), ("flipped digit", flipped), ("garbage", b"\xff\x00zz".to_vec())]
        {
            std::fs::write(&path, &bytes).unwrap();
            assert_eq!(cluster_id(&store, &log_dir, 1).await.unwrap(), cluster, "{kind}: starts with the store's id");
            assert_eq!(std::fs::read(&path).unwrap(), good, "{kind}: written anew");
            let aside: Vec<_> = std::fs::read_dir(&log_dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("meta.properties.damaged-"))
                .collect();
            assert_eq!(aside.len(), 1, "{kind}: the damaged file is kept: {aside:?}");
            assert_eq!(std::fs::read(log_dir.join(&aside[0])).unwrap(), bytes, "{kind}");
            std::fs::remove_file(log_dir.join(&aside[0])).unwrap();
        }
        // Intact and another broker's: refused, as before.
        assert!(matches!(cluster_id(&store, &log_dir, 2).await, Err(Error::MetaProperties { .. })));
    }

    #[tokio::test]
    async fn a_store_without_an_id_takes_the_log_dirs() {
        let dir = tempfile::tempdir().unwrap();
        let store = fjord_coord::EmbeddedStore::open(&dir.path().join("store")).unwrap();
        std::fs::write(dir.path().join(META_PROPERTIES), "version=0\nbroker.id=0\ncluster.id=KeptFromBeforeTheStore\n").unwrap();
        assert_eq!(cluster_id(&store, dir.path(), 0).await.unwrap(), "KeptFromBeforeTheStore");
    }
}
