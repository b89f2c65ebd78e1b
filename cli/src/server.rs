//! `fjord dev` and `fjord broker`: build the broker config (defaults, then the TOML
//! file, then flags, then `FJORD_*` environment variables, as docs/architecture.md's
//! contract orders them), bind, and run until Ctrl-C
//! or SIGTERM, which shut the broker down cleanly (logs flushed, checkpoints written).
//! `fjord dev` also runs the schema registry and the gateway in the same process, on
//! the broker's metadata store.

use std::net::SocketAddr;
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
    /// Schema registry address (Confluent REST API).
    #[arg(long, env = "FJORD_DEV_REGISTRY", default_value = "127.0.0.1:8081")]
    registry: SocketAddr,
    /// Gateway HTTP address.
    #[arg(long, env = "FJORD_DEV_HTTP", default_value = "127.0.0.1:8082")]
    http: SocketAddr,
    /// Gateway gRPC address.
    #[arg(long, env = "FJORD_DEV_GRPC", default_value = "127.0.0.1:50051")]
    grpc: SocketAddr,
    /// Broker metrics address (Prometheus text at /metrics).
    #[arg(long, env = "FJORD_DEV_METRICS", default_value = "127.0.0.1:9094")]
    metrics: SocketAddr,
    /// Nothing plaintext: a local CA and certificate, an admin user with a random password
    /// and <data-dir>/secure/admin.properties for clients; the broker serves SASL_SSL, the
    /// registry, gateway and broker metrics HTTPS with Basic auth, ACLs on everywhere.
    #[arg(long)]
    secure: bool,
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
    /// Log directory (`log.dirs`; comma-separated for several).
    #[arg(long, value_name = "DIR", required_unless_present = "config")]
    data_dir: Option<PathBuf>,
    /// ZooKeeper connect string (`zookeeper.connect`); without it, the embedded metadata store.
    #[arg(long, value_name = "CONNECT")]
    zookeeper: Option<String>,
    /// Serve the Prometheus metrics at http://ADDR/metrics (`metrics.listen`; off by default).
    #[arg(long, value_name = "HOST:PORT")]
    metrics: Option<String>,
}

pub(crate) async fn dev(args: DevArgs) -> anyhow::Result<()> {
    let mut config = BrokerConfig::default();
    config.set("log.dirs", &path_text(&args.data_dir)?)?;
    config.metrics_listen = Some(args.metrics);
    // The broker tier of the audit, like the gateway's below (FJORD_AUDIT_ENABLE=false
    // turns it off).
    config.audit.enable = true;
    config.audit.interval = std::time::Duration::from_secs(30);
    config.audit.cluster = "dev".into();
    config.apply_env(std::env::vars())?;
    let secure = match args.secure {
        true => {
            std::fs::create_dir_all(&config.log_dir).with_context(|| format!("creating {}", config.log_dir.display()))?;
            let files = crate::secure::SecureFiles::prepare(&config.log_dir)?;
            let address = config.listeners.first().address.to_string();
            files.configure(&mut config, &address)?;
            Some(files)
        }
        false => None,
    };
    // The broker counts through the audit's hook; flushed by the broker at shutdown
    // before it stops accepting.
    fjord_audit::BrokerTier::install(&mut config)?;
    let listeners = bind(&config).await?;
    let address = listeners[0].local_addr()?;
    let bind_at = |addr: SocketAddr, what: &'static str| async move {
        TcpListener::bind(addr).await.with_context(|| format!("binding the {what} to {addr}"))
    };
    let (registry, http, grpc) = (
        bind_at(args.registry, "schema registry").await?,
        bind_at(args.http, "gateway HTTP").await?,
        bind_at(args.grpc, "gateway gRPC").await?,
    );
    std::fs::create_dir_all(&config.log_dir).with_context(|| format!("creating {}", config.log_dir.display()))?;
    let store = fjord_broker::server::open_store(&config).await?;
    let mut registry_config = fjord_schema_registry::RegistryConfig::default();
    let scheme = if secure.is_some() { "https" } else { "http" };
    let registry_url = Some(format!("{scheme}://{}", registry.local_addr()?));
    let mut gateway_security = Vec::new();
    if let Some(files) = &secure {
        files.write_admin_properties(&address.to_string())?;
        files.write_users(&*store).await?;
        for (key, value) in files.http_security()? {
            registry_config.set(key, &value).with_context(|| format!("--secure sets the registry's {key}"))?;
        }
        gateway_security = files.http_security()?;
        gateway_security.extend(files.gateway_client()?);
        gateway_security.extend(files.gateway_registry()?);
        let props = files.admin_properties.display();
        println!("fjord dev --secure: TLS, SASL/Basic and ACLs on every service; nothing plaintext");
        println!("  Kafka broker     {address}   SASL_SSL (SCRAM-SHA-256/512, PLAIN)");
        println!("  admin client     {props}   (user {}, the super user)", crate::secure::ADMIN_USER);
        println!("  CA certificate   {}", files.ca.display());
        println!("  try              fjord topics list --command-config {props}");
        println!("                   kcat -F {props} -L");
    } else {
        println!("fjord dev");
        println!("  Kafka broker     {address}   (try: kcat -b {address} -L)");
    }
    println!("  schema registry  {scheme}://{}", registry.local_addr()?);
    println!("  gateway HTTP     {scheme}://{}", http.local_addr()?);
    println!("  gateway gRPC     {}{}", grpc.local_addr()?, if secure.is_some() { " (TLS)" } else { "" });
    if let Some(metrics) = config.metrics_listen {
        println!("  broker metrics   {scheme}://{metrics}/metrics");
    }
    println!("  data             {}", config.log_dir.display());
    println!("  metadata store   embedded, in {}", config.log_dir.join(fjord_broker::server::METADATA_DIR).display());
    println!("Ctrl-C stops everything cleanly.");

    let shutdown = shutdown_on_signal()?;
    // The gateway tier's audit counts go to `_audit` every 30 s, so `fjord audit report`
    // works against `dev` out of the box.
    let mut gateway_config = fjord_gateway::GatewayConfig {
        registry_url,
        audit_interval: Some(std::time::Duration::from_secs(30)),
        audit_cluster: "dev".into(),
        // Pages a developer serves from this machine (any port) may post from a browser.
        cors: fjord_gateway::CorsConfig::loopback(),
        ..fjord_gateway::GatewayConfig::new(address.to_string())
    };
    for (key, value) in gateway_security {
        gateway_config.set(key, &value).with_context(|| format!("--secure sets the gateway's {key}"))?;
    }
    // Any service failing stops the others: `dev` is one system.
    let stop_all = |result: anyhow::Result<()>, shutdown: &CancellationToken| {
        if result.is_err() {
            shutdown.cancel();
        }
        result
    };
    // The broker stops after the gateway, so the gateway's last flush (buffered events and
    // its final audit counts) still reaches it.
    let broker_shutdown = CancellationToken::new();
    let (broker, registry, gateway) = tokio::join!(
        async {
            stop_all(
                fjord_broker::server::run_listeners(config, store.clone(), listeners, broker_shutdown.clone())
                    .await
                    .map_err(Into::into),
                &shutdown,
            )
        },
        async {
            stop_all(
                fjord_schema_registry::run(registry_config, store.clone(), registry, shutdown.clone()).await.map_err(Into::into),
                &shutdown,
            )
        },
        async {
            let result = stop_all(
                fjord_gateway::run_with_store(gateway_config, Some(store.clone()), http, grpc, shutdown.clone())
                    .await
                    .map_err(Into::into),
                &shutdown,
            );
            broker_shutdown.cancel();
            result
        },
    );
    broker.context("broker")?;
    registry.context("schema registry")?;
    gateway.context("gateway")?;
    Ok(())
}

pub(crate) async fn broker(args: BrokerArgs) -> anyhow::Result<()> {
    let mut config = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            BrokerConfig::from_toml(&text).with_context(|| format!("in {}", path.display()))?
        }
        None => BrokerConfig::default(),
    };
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
    if let Some(metrics) = &args.metrics {
        config.set("metrics.listen", metrics)?;
    }
    config.apply_env(std::env::vars())?;
    let listeners = bind(&config).await?;
    serve(config, listeners).await
}

fn path_text(path: &std::path::Path) -> anyhow::Result<String> {
    path.to_str().map(str::to_owned).with_context(|| format!("{} is not valid UTF-8", path.display()))
}

async fn bind(config: &BrokerConfig) -> anyhow::Result<Vec<TcpListener>> {
    config.validate()?;
    Ok(fjord_broker::server::bind(config).await?)
}

/// Runs the broker until Ctrl-C or SIGTERM.
async fn serve(mut config: BrokerConfig, listeners: Vec<TcpListener>) -> anyhow::Result<()> {
    fjord_audit::BrokerTier::install(&mut config)?;
    std::fs::create_dir_all(&config.log_dir).with_context(|| format!("creating {}", config.log_dir.display()))?;
    let store = fjord_broker::server::open_store(&config).await?;
    fjord_broker::server::run_listeners(config, store, listeners, shutdown_on_signal()?).await?;
    Ok(())
}

/// A token cancelled by the first Ctrl-C or SIGTERM, which starts a clean shutdown.
pub(crate) fn shutdown_on_signal() -> anyhow::Result<CancellationToken> {
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
    Ok(shutdown)
}
