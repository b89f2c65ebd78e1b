//! `fjord`: one thin binary over the Fjord libraries. Each subcommand parses its flags
//! and calls a library; nothing here holds logic of its own.
//!
//! # Layout
//! - `server`: `fjord dev` and `fjord broker` (config layering, signals, `fjord_broker::run`).
//! - `registry`: `fjord registry`, the schema registry service.
//! - `gateway`: `fjord gateway`, the HTTP/gRPC front door.
//! - `tools`: `fjord topics`, `produce`, `consume`, `bench` over `fjord_client`.
//! - `audit`: `fjord audit report|watch` over `fjord_audit`.
//! - `mirror`: `fjord mirror` (and `status`) over `fjord_mirror`.
//! - `secure`: `fjord dev --secure` (local CA, users, admin.properties).
//! - `security`: `fjord users` and `fjord acls` over `fjord_auth`'s store.
//! - `logs`: `fjord logs orphans`, the log directories a broker moved aside.
use std::io::IsTerminal;

use clap::{Parser, Subcommand, ValueEnum};
use tracing_subscriber::EnvFilter;

mod audit;
mod gateway;
mod load;
mod logs;
mod mirror;
mod registry;
mod secure;
mod security;
mod server;
mod tools;

#[derive(Parser)]
#[command(name = "fjord", version, about = "Fjord: a partitioned, replicated commit log for event data")]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log lines as text (coloured only on a terminal) or as one JSON object per line.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run Fjord on this machine: a broker on 127.0.0.1:9092, data in ./fjord-data.
    Dev(server::DevArgs),
    /// Run one broker.
    Broker(server::BrokerArgs),
    /// Run the Avro schema registry (Confluent Schema Registry REST API).
    Registry(registry::RegistryArgs),
    /// Run the HTTP and gRPC gateway that publishes events into the brokers.
    Gateway(gateway::GatewayArgs),
    /// Create, list, describe, delete or alter topics.
    Topics(tools::topics::TopicsArgs),
    /// Send stdin lines as records.
    Produce(tools::produce::ProduceArgs),
    /// Print records from a topic.
    Consume(tools::consume::ConsumeArgs),
    /// List and describe consumer groups; reset their committed offsets.
    Groups(tools::groups::GroupsArgs),
    /// List and describe transactional ids (state, producer, open partitions).
    Transactions(tools::transactions::TransactionsArgs),
    /// Describe or alter client quotas (byte rates, request percentage) of users and client ids.
    Quotas(tools::quotas::QuotasArgs),
    /// Move partitions between brokers (Kafka's reassignment JSON), or off a broker.
    Reassign(tools::reassign::ReassignArgs),
    /// Measure producer/consumer throughput and latency.
    Bench(tools::bench::BenchArgs),
    /// Load topics into HDFS or a local directory as hourly Avro files (one job run).
    Load(load::LoadArgs),
    /// Copy topics from online clusters into an analytics cluster (or show a mirror's lag).
    Mirror(mirror::MirrorArgs),
    /// Compare per-tier audit counts per topic and window (report once, or watch live).
    Audit(audit::AuditArgs),
    /// Add, list or delete SCRAM users, directly in the metadata store.
    Users(security::UsersArgs),
    /// Add, list or remove ACLs, directly in the metadata store.
    Acls(security::AclsArgs),
    /// Inspect a broker's data dir offline: list (and delete) orphaned log directories.
    Logs(logs::LogsArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // RUST_LOG picks the levels; info by default.
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt().with_env_filter(filter);
    match cli.log_format {
        // Colour codes only for a person at a terminal, not in a redirected log file
        // (the log goes to stdout); NO_COLOR turns them off there too.
        LogFormat::Text => logs.with_ansi(std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none()).init(),
        LogFormat::Json => logs.json().init(),
    }
    match cli.command {
        Command::Dev(args) => server::dev(args).await,
        Command::Broker(args) => server::broker(args).await,
        Command::Registry(args) => registry::registry(args).await,
        Command::Gateway(args) => gateway::gateway(args).await,
        Command::Topics(args) => tools::run_or_exit(tools::topics::run(args)).await,
        Command::Produce(args) => tools::run_or_exit(tools::produce::run(args)).await,
        Command::Consume(args) => tools::run_or_exit(tools::consume::run(args)).await,
        Command::Groups(args) => tools::run_or_exit(tools::groups::run(args)).await,
        Command::Transactions(args) => tools::run_or_exit(tools::transactions::run(args)).await,
        Command::Quotas(args) => tools::run_or_exit(tools::quotas::run(args)).await,
        Command::Reassign(args) => tools::run_or_exit(tools::reassign::run(args)).await,
        Command::Bench(args) => tools::run_or_exit(tools::bench::run(args)).await,
        Command::Load(args) => tools::run_or_exit(load::load(args)).await,
        Command::Mirror(args) => tools::run_or_exit(mirror::run(args)).await,
        Command::Audit(args) => tools::run_or_exit(audit::run(args)).await,
        Command::Users(args) => tools::run_or_exit(security::users(args)).await,
        Command::Acls(args) => tools::run_or_exit(security::acls(args)).await,
        Command::Logs(args) => logs::run(args),
    }
}
