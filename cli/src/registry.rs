//! `fjord registry`: the Avro schema registry (Confluent Schema Registry REST API) alone, on
//! ZooKeeper (`--zookeeper`) or on an embedded metadata store in `--data-dir`.

use std::path::PathBuf;

use anyhow::Context;
use fjord_schema_registry::RegistryConfig;
use tokio::net::TcpListener;

/// Flags of `fjord registry`.
#[derive(clap::Args)]
pub(crate) struct RegistryArgs {
    /// ZooKeeper connect string, `host:port[,host:port...][/chroot]` (chroot `/fjord` by
    /// default), as Kafka's `zookeeper.connect`. Several registries on one ZooKeeper serve
    /// the same schemas. Without it, the embedded metadata store under --data-dir is used.
    #[arg(long, env = "FJORD_ZOOKEEPER_CONNECT")]
    zookeeper: Option<String>,
    /// Address to serve the REST API on.
    #[arg(long, env = "FJORD_REGISTRY_LISTEN", default_value = "127.0.0.1:8081")]
    listen: String,
    /// Directory of the embedded metadata store (only without --zookeeper).
    #[arg(long, env = "FJORD_REGISTRY_DATA_DIR", default_value = "./fjord-registry-data")]
    data_dir: PathBuf,
    /// Security properties file (`key=value` lines, Confluent Schema Registry's names):
    /// TLS (`ssl.keystore.location`, `ssl.truststore.location`, `ssl.client.auth`),
    /// `authentication.method=BASIC`, `authentication.realm`, `authorizer.enable`,
    /// `super.users` (users and ACLs are the brokers', in the same metadata store).
    #[arg(long, value_name = "FILE", env = "FJORD_REGISTRY_CONFIG")]
    config: Option<PathBuf>,
}

/// Runs the registry until Ctrl-C or SIGTERM.
pub(crate) async fn registry(args: RegistryArgs) -> anyhow::Result<()> {
    let mut config = RegistryConfig::default();
    if let Some(path) = &args.config {
        let context = || format!("--config {}", path.display());
        let text = std::fs::read_to_string(path).with_context(context)?;
        for (key, value) in fjord_client::parse_properties(&text).with_context(context)? {
            config.set(&key, &value).with_context(context)?;
        }
    }
    let store = fjord_coord::open(args.zookeeper.as_deref(), &args.data_dir).await?;
    let listener = TcpListener::bind(&args.listen).await?;
    let backing = match &args.zookeeper {
        Some(connect) => format!("ZooKeeper {connect}"),
        None => format!("embedded metadata store in {}", args.data_dir.display()),
    };
    let scheme = if config.security.tls_enabled() { "https" } else { "http" };
    println!("schema registry: {scheme}://{} ({backing})", listener.local_addr()?);
    let shutdown = crate::server::shutdown_on_signal()?;
    fjord_schema_registry::run(config, store, listener, shutdown).await?;
    Ok(())
}
