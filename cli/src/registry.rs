//! `fjord registry`: the Avro schema registry (Confluent Schema Registry REST API) alone, on
//! ZooKeeper (`--zookeeper`) or on an embedded metadata store in `--data-dir`.

use std::path::PathBuf;

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
}

/// Runs the registry until Ctrl-C or SIGTERM.
pub(crate) async fn registry(args: RegistryArgs) -> anyhow::Result<()> {
    let store = fjord_coord::open(args.zookeeper.as_deref(), &args.data_dir).await?;
    let listener = TcpListener::bind(&args.listen).await?;
    let backing = match &args.zookeeper {
        Some(connect) => format!("ZooKeeper {connect}"),
        None => format!("embedded metadata store in {}", args.data_dir.display()),
    };
    println!("schema registry: http://{} ({backing})", listener.local_addr()?);
    let shutdown = crate::server::shutdown_on_signal()?;
    fjord_schema_registry::run(RegistryConfig::default(), store, listener, shutdown).await?;
    Ok(())
}
