//! `fjord gateway`: the HTTP and gRPC front door alone, publishing into the brokers at
//! `--bootstrap` (and validating Avro against `--registry` when given).

use std::time::Duration;

use anyhow::Context;
use fjord_gateway::GatewayConfig;
use tokio::net::TcpListener;

/// Flags of `fjord gateway`.
#[derive(clap::Args)]
pub(crate) struct GatewayArgs {
    /// Brokers to publish into, `HOST:PORT[,HOST:PORT...]` (Kafka's bootstrap.servers).
    #[arg(long, env = "FJORD_GATEWAY_BOOTSTRAP")]
    bootstrap: String,
    /// Address of the HTTP API (REST Proxy v2, NDJSON, pull, /metrics, /openapi.json).
    #[arg(long, env = "FJORD_GATEWAY_HTTP", default_value = "127.0.0.1:8082")]
    http: String,
    /// Address of the gRPC API (fjord.v1.Publisher / Subscriber, health, reflection).
    #[arg(long, env = "FJORD_GATEWAY_GRPC", default_value = "127.0.0.1:50051")]
    grpc: String,
    /// Schema registry base URL (`http://HOST:PORT`), needed for the Avro content types.
    #[arg(long, env = "FJORD_GATEWAY_REGISTRY")]
    registry: Option<String>,
    /// Largest HTTP request body in bytes (larger: 413).
    #[arg(long, env = "FJORD_GATEWAY_MAX_BODY_BYTES")]
    max_body_bytes: Option<usize>,
    /// Bytes of events accepted but not yet acknowledged (beyond: 429 with Retry-After).
    #[arg(long, env = "FJORD_GATEWAY_BUFFER_BYTES")]
    buffer_bytes: Option<usize>,
    /// How long the shared producer waits for more events before sending a batch (ms;
    /// default 0: a batch then waits only while two of its partition's are in flight).
    #[arg(long, env = "FJORD_GATEWAY_LINGER_MS")]
    linger_ms: Option<u64>,
    /// Bound on waiting for the brokers before answering 503 (ms).
    #[arg(long, env = "FJORD_GATEWAY_BROKER_TIMEOUT_MS")]
    broker_timeout_ms: Option<u64>,
    /// Publish the gateway tier's audit counts to `_audit` every N seconds (0: off).
    #[arg(long, env = "FJORD_GATEWAY_AUDIT_INTERVAL_SECS", default_value_t = 30)]
    audit_interval_secs: u64,
    /// Cluster (datacenter) name in the audit records.
    #[arg(long, env = "FJORD_GATEWAY_AUDIT_CLUSTER", default_value = "default")]
    audit_cluster: String,
    /// Browser origin allowed to call the HTTP API (CORS), repeatable or comma-separated:
    /// `https://app.example.com`, `http://localhost:*` (any port), `*`. None: CORS off.
    #[arg(long = "cors-origin", env = "FJORD_GATEWAY_CORS_ORIGINS", value_delimiter = ',')]
    cors_origins: Vec<String>,
    /// Per-origin topic allow-list, repeatable: `ORIGIN=TOPIC[;TOPIC...]`, a topic being a
    /// name or a prefix ending in `*` (e.g. `https://shop.example=web-*;beacons`).
    #[arg(long = "cors-topics")]
    cors_topics: Vec<String>,
    /// How long a browser may cache a CORS preflight answer (s).
    #[arg(long, env = "FJORD_GATEWAY_CORS_MAX_AGE_SECS")]
    cors_max_age_secs: Option<u64>,
    /// How long an `Idempotency-Key` holds (s): a repeat within it gets the first answer.
    /// Default 86400 (24 h). Config key `idempotency.window.ms`.
    #[arg(long, env = "FJORD_GATEWAY_IDEMPOTENCY_WINDOW_SECS")]
    idempotency_window_secs: Option<u64>,
    /// Requests per second per client (its principal, or its IP address when anonymous);
    /// over it: 429 with Retry-After, gRPC RESOURCE_EXHAUSTED. 0: unlimited (default).
    /// Config key `limits.requests.per.sec`.
    #[arg(long, env = "FJORD_GATEWAY_LIMIT_REQUESTS_PER_SEC")]
    limit_requests_per_sec: Option<u32>,
    /// Request body bytes per second per client, as sent (compressed bodies count
    /// compressed). 0: unlimited (default). Config key `limits.bytes.per.sec`.
    #[arg(long, env = "FJORD_GATEWAY_LIMIT_BYTES_PER_SEC")]
    limit_bytes_per_sec: Option<u64>,
    /// How much of a second's allowance a client may spend at once (ms; default 1000).
    /// Config key `limits.burst.ms`.
    #[arg(long, env = "FJORD_GATEWAY_LIMIT_BURST_MS")]
    limit_burst_ms: Option<u64>,
    /// Clients tracked at once by the limits (default 100000); past it idle ones are
    /// forgotten first. Config key `limits.max.clients`.
    #[arg(long, env = "FJORD_GATEWAY_LIMIT_MAX_CLIENTS")]
    limit_max_clients: Option<usize>,
    /// Security properties file (`key=value` lines, Confluent REST Proxy's names): TLS
    /// (`ssl.keystore.location`, `ssl.truststore.location`, `ssl.client.auth`),
    /// `authentication.method=BASIC`, `authentication.realm`, `authorizer.enable`,
    /// `super.users`, and the gateway's own broker identity (`client.security.protocol`,
    /// `client.sasl.mechanism`, `client.sasl.username`, `client.sasl.password`,
    /// `client.ssl.ca.location`); also `idempotency.window.ms` and the `limits.*` keys,
    /// which the flags above override.
    #[arg(long, value_name = "FILE", env = "FJORD_GATEWAY_CONFIG")]
    config: Option<std::path::PathBuf>,
    /// ZooKeeper connect string of the cluster's metadata store, where Basic
    /// authentication reads the users and the authorizer the ACLs.
    #[arg(long, env = "FJORD_ZOOKEEPER_CONNECT")]
    zookeeper: Option<String>,
}

impl GatewayArgs {
    fn config(&self) -> anyhow::Result<GatewayConfig> {
        let defaults = GatewayConfig::new(self.bootstrap.clone());
        let mut origin_topics = Vec::new();
        for entry in &self.cors_topics {
            // Split at the last '=': origins hold ':' but never '='.
            let Some((origin, topics)) = entry.rsplit_once('=') else {
                anyhow::bail!("--cors-topics {entry:?}: expected ORIGIN=TOPIC[;TOPIC...]");
            };
            origin_topics.push((origin.to_string(), topics.split(';').map(str::to_string).collect()));
        }
        let cors = fjord_gateway::CorsConfig {
            allowed_origins: self.cors_origins.clone(),
            max_age: self.cors_max_age_secs.map_or(defaults.cors.max_age, Duration::from_secs),
            origin_topics,
            ..defaults.cors.clone()
        };
        let mut config = GatewayConfig {
            cors,
            registry_url: self.registry.clone(),
            max_body_bytes: self.max_body_bytes.unwrap_or(defaults.max_body_bytes),
            buffer_bytes: self.buffer_bytes.unwrap_or(defaults.buffer_bytes),
            linger: self.linger_ms.map_or(defaults.linger, Duration::from_millis),
            broker_timeout: self.broker_timeout_ms.map_or(defaults.broker_timeout, Duration::from_millis),
            audit_interval: (self.audit_interval_secs > 0).then(|| Duration::from_secs(self.audit_interval_secs)),
            audit_cluster: self.audit_cluster.clone(),
            ..defaults
        };
        if let Some(path) = &self.config {
            let context = || format!("--config {}", path.display());
            let text = std::fs::read_to_string(path).with_context(context)?;
            for (key, value) in fjord_client::parse_properties(&text).with_context(context)? {
                config.set(&key, &value).with_context(context)?;
            }
        }
        // Flags win over the file.
        let limits = &mut config.client_limits;
        if let Some(secs) = self.idempotency_window_secs {
            config.idempotency_window = Duration::from_secs(secs);
        }
        limits.requests_per_sec = self.limit_requests_per_sec.unwrap_or(limits.requests_per_sec);
        limits.bytes_per_sec = self.limit_bytes_per_sec.unwrap_or(limits.bytes_per_sec);
        limits.burst = self.limit_burst_ms.map_or(limits.burst, Duration::from_millis);
        limits.max_clients = self.limit_max_clients.unwrap_or(limits.max_clients);
        Ok(config)
    }
}

/// Runs the gateway until Ctrl-C or SIGTERM.
pub(crate) async fn gateway(args: GatewayArgs) -> anyhow::Result<()> {
    let config = args.config()?;
    config.validate()?;
    let store = match &args.zookeeper {
        Some(connect) => Some(
            fjord_coord::open(Some(connect), std::path::Path::new("")).await.with_context(|| format!("ZooKeeper {connect}"))?,
        ),
        None if config.security.needs_store() => {
            anyhow::bail!("authentication.method=BASIC and authorizer.enable read users and ACLs: give --zookeeper")
        }
        None => None,
    };
    let http = TcpListener::bind(&args.http).await?;
    let grpc = TcpListener::bind(&args.grpc).await?;
    let scheme = if config.security.tls_enabled() { "https" } else { "http" };
    println!("gateway HTTP: {scheme}://{} (OpenAPI at /openapi.json)", http.local_addr()?);
    println!("gateway gRPC: {} (fjord.v1.Publisher, fjord.v1.Subscriber, health, reflection)", grpc.local_addr()?);
    println!("publishing into {}", config.bootstrap);
    let shutdown = crate::server::shutdown_on_signal()?;
    fjord_gateway::run_with_store(config, store, http, grpc, shutdown).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: GatewayArgs,
    }

    fn config(args: &[&str]) -> GatewayConfig {
        let cli = Cli::try_parse_from(["fjord-gateway", "--bootstrap", "127.0.0.1:9092"].iter().chain(args)).unwrap();
        cli.args.config().unwrap()
    }

    #[test]
    fn limit_and_idempotency_flags_set_the_config_and_win_over_the_file() {
        let c = config(&[]);
        assert_eq!((c.client_limits.requests_per_sec, c.client_limits.bytes_per_sec), (0, 0));
        assert_eq!(c.idempotency_window, Duration::from_secs(24 * 3600));
        let c = config(&[
            "--limit-requests-per-sec",
            "50",
            "--limit-bytes-per-sec",
            "1000000",
            "--limit-burst-ms",
            "2000",
            "--limit-max-clients",
            "10",
            "--idempotency-window-secs",
            "3600",
        ]);
        assert_eq!((c.client_limits.requests_per_sec, c.client_limits.bytes_per_sec), (50, 1_000_000));
        assert_eq!((c.client_limits.burst, c.client_limits.max_clients), (Duration::from_secs(2), 10));
        assert_eq!(c.idempotency_window, Duration::from_secs(3600));
        c.validate().unwrap();

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("gateway.properties");
        std::fs::write(&file, "limits.requests.per.sec=7\nlimits.bytes.per.sec=99\nidempotency.window.ms=60000\n").unwrap();
        let file = file.to_str().unwrap();
        let c = config(&["--config", file]);
        assert_eq!((c.client_limits.requests_per_sec, c.client_limits.bytes_per_sec), (7, 99));
        assert_eq!(c.idempotency_window, Duration::from_secs(60));
        let c = config(&["--config", file, "--limit-requests-per-sec", "8"]);
        assert_eq!((c.client_limits.requests_per_sec, c.client_limits.bytes_per_sec), (8, 99));
        std::fs::write(dir.path().join("bad.properties"), "limits.requests.per.sec=lots\n").unwrap();
        let bad = Cli::try_parse_from([
            "fjord-gateway",
            "--bootstrap",
            "b:1",
            "--config",
            dir.path().join("bad.properties").to_str().unwrap(),
        ]);
        let e = bad.unwrap().args.config().unwrap_err();
        assert!(format!("{e:#}").contains("limits.requests.per.sec"), "{e:#}");
    }
}
