//! `fjord topics create|list|describe|delete|alter|truncate`.

use std::collections::BTreeMap;

use anyhow::Context;
use clap::{Args, Subcommand};
use fjord_client::{Admin, NewTopic};

use super::{parse_key_value, ConnectArgs};

#[derive(Args, Debug)]
pub(crate) struct TopicsArgs {
    #[command(flatten)]
    connect: ConnectArgs,
    #[command(subcommand)]
    action: Action,
}

#[derive(Subcommand, Debug)]
enum Action {
    /// Create a topic.
    Create {
        /// Topic name.
        #[arg(long)]
        topic: String,
        /// Partition count (the broker's num.partitions when absent).
        #[arg(long)]
        partitions: Option<i32>,
        /// Replication factor (the broker's default when absent).
        #[arg(long)]
        replication_factor: Option<i16>,
        /// Topic config override, KEY=VALUE (repeatable).
        #[arg(long = "config", value_parser = parse_key_value)]
        configs: Vec<(String, String)>,
    },
    /// List topics, one per line.
    List,
    /// Show partitions, leaders, replicas, ISR and config overrides; with
    /// --under-replicated or --offline only those partitions, of every topic unless one
    /// is named (Kafka's kafka-topics --describe --under-replicated-partitions /
    /// --unavailable-partitions).
    Describe {
        /// Topic name (required without a filter).
        #[arg(required_unless_present_any = ["under_replicated", "offline"])]
        topic: Option<String>,
        /// Only partitions whose ISR is smaller than their replica set.
        #[arg(long, visible_alias = "under-replicated-partitions", conflicts_with = "offline")]
        under_replicated: bool,
        /// Only partitions without a leader (every replica that could lead is down).
        #[arg(long, visible_alias = "unavailable-partitions")]
        offline: bool,
    },
    /// Delete a topic.
    Delete {
        /// Topic name.
        topic: String,
    },
    /// Change topic config overrides, or raise the partition count.
    Alter {
        /// Topic name.
        topic: String,
        /// KEY=VALUE (repeatable).
        #[arg(long = "config", value_parser = parse_key_value, required_unless_present = "partitions")]
        configs: Vec<(String, String)>,
        /// The new partition count (higher than the current one; new partitions are placed by the broker).
        #[arg(long)]
        partitions: Option<i32>,
    },
    /// Delete the records below an offset (Kafka's DeleteRecords, kafka-delete-records):
    /// the partitions' log start moves up to it; consumers from the beginning start there.
    Truncate {
        /// Topic name.
        topic: String,
        /// The new first offset; -1 for the high watermark (everything committed goes).
        #[arg(long, allow_negative_numbers = true)]
        before: i64,
        /// Only this partition (every partition of the topic when absent).
        #[arg(long)]
        partition: Option<i32>,
    },
}

/// Kafka's name of an error code, as its tools print it: `OFFSET_OUT_OF_RANGE` for
/// kafka-protocol's `OffsetOutOfRange`.
fn kafka_error_name(code: fjord_client::ResponseError) -> String {
    let mut name = String::new();
    for (i, c) in format!("{code:?}").chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            name.push('_');
        }
        name.push(c.to_ascii_uppercase());
    }
    name
}

/// Kafka's KAFKA_STORAGE_ERROR.
const STORAGE_ERROR: i16 = 56;

/// One partition of `fjord topics describe`: offline replicas and the partition's error
/// only when there are any, so a healthy topic reads as before.
fn partition_line(p: &fjord_client::PartitionMetadata) -> String {
    let mut line = format!(
        "  partition {:>3}  leader {:>3}  epoch {:>3}  replicas {:?}  isr {:?}",
        p.partition, p.leader, p.leader_epoch, p.replicas, p.in_sync_replicas
    );
    if !p.offline_replicas.is_empty() {
        line.push_str(&format!("  offline {:?}", p.offline_replicas));
    }
    match p.error_code {
        0 => {}
        STORAGE_ERROR => line.push_str("  error KAFKA_STORAGE_ERROR (log damaged or cannot be opened)"),
        5 => line.push_str("  error LEADER_NOT_AVAILABLE"),
        code => line.push_str(&format!("  error {code}")),
    }
    line
}

/// Kafka's under-replicated partition: fewer in-sync replicas than replicas.
fn is_under_replicated(p: &fjord_client::PartitionMetadata) -> bool {
    p.in_sync_replicas.len() < p.replicas.len()
}

/// Kafka's unavailable partition: no leader to serve it.
fn is_offline(p: &fjord_client::PartitionMetadata) -> bool {
    p.leader < 0
}

pub(crate) async fn run(args: TopicsArgs) -> anyhow::Result<()> {
    let admin = Admin::connect(args.connect.client()?).await?;
    match args.action {
        Action::Create { topic, partitions, replication_factor, configs } => {
            let new = NewTopic {
                name: topic.clone(),
                partitions: partitions.unwrap_or(-1),
                replication_factor: replication_factor.unwrap_or(-1),
                configs: configs.into_iter().collect(),
            };
            admin.create_topics(&[new]).await.with_context(|| format!("cannot create topic {topic}"))?;
            println!("created topic {topic}");
        }
        Action::List => {
            for t in admin.list_topics().await? {
                println!("{}", t.name);
            }
        }
        Action::Describe { topic, under_replicated, offline } if under_replicated || offline => {
            let topics = match topic {
                Some(topic) => vec![admin.describe_topic(&topic).await?],
                None => admin.list_topics().await?,
            };
            let wanted = |p: &fjord_client::PartitionMetadata| match under_replicated {
                true => is_under_replicated(p),
                false => is_offline(p),
            };
            for t in &topics {
                for p in t.partitions.iter().filter(|p| wanted(p)) {
                    println!("{}{}", t.name, partition_line(p));
                }
            }
        }
        Action::Describe { topic, .. } => {
            let topic = topic.context("name a topic")?;
            let t = admin.describe_topic(&topic).await?;
            println!("topic {}  partitions {}", t.name, t.partitions.len());
            for p in &t.partitions {
                println!("{}", partition_line(p));
            }
            if t.partitions.iter().any(|p| p.error_code == STORAGE_ERROR) {
                println!(
                    "  KAFKA_STORAGE_ERROR: the leader's replica is offline: its log could not be opened, or holds a \
                     damaged batch (served up to it). The broker's log names the file and byte; its /metrics has \
                     fjord_broker_partition_unhealthy. With the broker stopped, `fjord logs repair` truncates at the \
                     damage and keeps the rest aside."
                );
            }
            let overrides: Vec<_> = admin.describe_configs(&topic).await?.into_iter().filter(|c| !c.is_default).collect();
            if !overrides.is_empty() {
                println!("  config overrides:");
                for c in overrides {
                    println!("    {}={}", c.name, c.value.as_deref().unwrap_or(""));
                }
            }
        }
        Action::Delete { topic } => {
            admin.delete_topics(std::slice::from_ref(&topic)).await.with_context(|| format!("cannot delete topic {topic}"))?;
            println!("deleted topic {topic}");
        }
        Action::Truncate { topic, before, partition } => {
            let partitions: Vec<i32> = match partition {
                Some(p) => vec![p],
                None => admin.describe_topic(&topic).await?.partitions.iter().map(|p| p.partition).collect(),
            };
            let asks: Vec<(String, i32, i64)> = partitions.iter().map(|&p| (topic.clone(), p, before)).collect();
            let mut failed = 0;
            for (p, result) in partitions.iter().zip(admin.delete_records(&asks).await) {
                match result {
                    Ok(low_watermark) => println!("{topic}-{p}  low watermark {low_watermark}"),
                    Err(e) => {
                        failed += 1;
                        match e.code() {
                            Some(code) => eprintln!("{topic}-{p}  error {}: {code}", kafka_error_name(code)),
                            None => eprintln!("{topic}-{p}  error: {e}"),
                        }
                    }
                }
            }
            if failed > 0 {
                anyhow::bail!("{failed} of {} partitions of {topic} were not truncated", partitions.len());
            }
        }
        Action::Alter { topic, configs, partitions } => {
            if let Some(count) = partitions {
                admin
                    .create_partitions(&topic, count)
                    .await
                    .with_context(|| format!("cannot raise the partition count of {topic} to {count}"))?;
                println!("topic {topic} now has {count} partitions");
            }
            if !configs.is_empty() {
                let configs: BTreeMap<String, String> = configs.into_iter().collect();
                admin.alter_configs(&topic, &configs).await.with_context(|| format!("cannot alter topic {topic}"))?;
                println!("altered topic {topic}");
            }
        }
    }
    Ok(())
}
