//! `fjord dev` and `fjord broker`: build the broker config (defaults, then the TOML
//! file, then `FJORD_*` environment variables, then flags), bind, and run until Ctrl-C
//! or SIGTERM, which shut the broker down cleanly (logs flushed, checkpoints written).

use std::path::PathBuf;

use anyhow::Context;
use fjord_broker::BrokerConfig;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// `fjord dev`.
#[derive(clap::Args)]
pub(crate) struct DevArgs {
    /// Where data lives.
    #[arg(long, default_value = "./fjord-data")]
    data_dir: PathBuf,
}

/// `fjord broker`.
#[derive(clap::Args)]
pub(crate) struct BrokerArgs {
    /// TOML config file with Kafka's key names (`broker.id`, `listeners`, `log.dirs`, ...).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Broker id (`broker.id`).
    #[arg(long, value_name = "N", required_unless_present = "config")]
    id: Option<i32>,
    /// Address to listen on (`listeners`).
    #[arg(long, value_name = "HOST:PORT", required_unless_present = "config")]
    listen: Option<String>,
    /// Address clients are told to connect to (`advertised.listeners`).
    #[arg(long, value_name = "HOST:PORT")]
    advertise: Option<String>,
    /// Log directory (`log.dirs`).
    #[arg(long, value_name = "DIR", required_unless_present = "config")]
    data_dir: Option<PathBuf>,
    /// ZooKeeper connect string (`zookeeper.connect`); without it, the embedded metadata store.
    #[arg(long, value_name = "CONNECT")]
    zookeeper: Option<String>,
}

pub(crate) async fn dev(args: DevArgs) -> anyhow::Result<()> {
    let mut config = BrokerConfig::default();
    config.apply_env(std::env::vars())?;
    config.set("log.dirs", &path_text(&args.data_dir)?)?;
    let listener = bind(&config).await?;
    let address = listener.local_addr()?;
    println!("fjord dev");
    println!("  Kafka broker   {address}   (try: kcat -b {address} -L)");
    println!("  data           {}", config.log_dir.display());
    println!("  metadata store embedded, in {}", config.log_dir.join(fjord_broker::server::METADATA_DIR).display());
    println!("Ctrl-C stops everything cleanly.");
    serve(config, listener).await
}

pub(crate) async fn broker(args: BrokerArgs) -> anyhow::Result<()> {
    let mut config = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            BrokerConfig::from_toml(&text).with_context(|| format!("in {}", path.display()))?
        }
        None => BrokerConfig::default(),
    };
    config.apply_env(std::env::vars())?;
    if let Some(id) = args.id {
        config.set("broker.id", &id.to_string())?;
    }
    if let Some(listen) = &args.listen {
        config.set("listeners", listen)?;
    }
    if let Some(advertise) = &args.advertise {
        config.set("advertised.listeners", advertise)?;
    }
    if let Some(dir) = &args.data_dir {
        config.set("log.dirs", &path_text(dir)?)?;
    }
    if let Some(connect) = &args.zookeeper {
        config.set("zookeeper.connect", connect)?;
    }
    let listener = bind(&config).await?;
    serve(config, listener).await
}

fn path_text(path: &std::path::Path) -> anyhow::Result<String> {
    path.to_str().map(str::to_owned).with_context(|| format!("{} is not valid UTF-8", path.display()))
}

async fn bind(config: &BrokerConfig) -> anyhow::Result<TcpListener> {
    config.validate()?;
    TcpListener::bind(config.listeners).await.with_context(|| format!("binding {}", config.listeners))
}

/// Runs the broker; the first Ctrl-C or SIGTERM starts a clean shutdown.
async fn serve(config: BrokerConfig, listener: TcpListener) -> anyhow::Result<()> {
    let shutdown = CancellationToken::new();
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let on_signal = shutdown.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => tracing::info!("Ctrl-C: shutting down"),
            _ = terminate.recv() => tracing::info!("SIGTERM: shutting down"),
        }
        on_signal.cancel();
    });
    fjord_broker::run(config, listener, shutdown).await?;
    Ok(())
}
