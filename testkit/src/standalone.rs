//! One broker in this process on the embedded metadata store, as `fjord broker` without
//! `--zookeeper` runs it: the quick fixture of client and CLI tests.

use fjord_broker::BrokerConfig;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// A broker running on the caller's tokio runtime, on `127.0.0.1:<free port>`, with its
/// data in a temp dir. Dropping it starts its shutdown (and deletes the dir).
pub struct StandaloneBroker {
    /// `127.0.0.1:PORT`, the bootstrap address.
    pub addr: String,
    shutdown: CancellationToken,
    _dir: tempfile::TempDir,
}

impl StandaloneBroker {
    /// A broker with the default config.
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_with(|_| {}).await
    }

    /// A broker whose consumer groups form fast (100 ms initial rebalance delay) and accept
    /// 1 s sessions, so tests of group members can kill one and see it leave soon.
    pub async fn start_for_groups() -> anyhow::Result<Self> {
        Self::start_with(|config| {
            config.group.initial_rebalance_delay_ms = 100;
            config.group.min_session_timeout_ms = 1000;
        })
        .await
    }

    /// A broker whose config `configure` adjusts (log dir and listener are set already).
    /// The broker is listening when this returns; a broker that fails panics the task it
    /// runs on, which the test sees as refused connections.
    pub async fn start_with(configure: impl FnOnce(&mut BrokerConfig)) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let mut config = BrokerConfig { log_dir: dir.path().to_path_buf(), listeners: addr.into(), ..BrokerConfig::default() };
        configure(&mut config);
        fjord_audit::BrokerTier::install(&mut config)?;
        let shutdown = CancellationToken::new();
        let token = shutdown.clone();
        tokio::spawn(async move {
            if let Err(e) = fjord_broker::run(config, listener, token).await {
                panic!("broker failed: {e}");
            }
        });
        Ok(Self { addr: addr.to_string(), shutdown, _dir: dir })
    }
}

impl Drop for StandaloneBroker {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}
