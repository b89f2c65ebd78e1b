//! `fjord groups list|describe|reset-offsets`.

use std::collections::BTreeSet;

use anyhow::Context;
use clap::{Args, Subcommand};
use fjord_client::{GroupAdmin, OffsetSpec, TopicPartition};

use super::ConnectArgs;

#[derive(Args, Debug)]
pub(crate) struct GroupsArgs {
    #[command(flatten)]
    connect: ConnectArgs,
    #[command(subcommand)]
    action: Action,
}

#[derive(Subcommand, Debug)]
enum Action {
    /// List groups with their state, one per line.
    List,
    /// Members, owned partitions, committed offset, log end and lag per partition.
    Describe {
        /// Group id.
        group: String,
    },
    /// Move the group's committed offsets of a topic (the group must have no members).
    ResetOffsets {
        /// Group id.
        group: String,
        /// Topic whose partitions are reset.
        #[arg(long)]
        topic: String,
        /// To the log start.
        #[arg(long, group = "to", required = true)]
        to_earliest: bool,
        /// To the log end.
        #[arg(long, group = "to")]
        to_latest: bool,
        /// To this offset in every partition.
        #[arg(long, group = "to")]
        to_offset: Option<i64>,
        /// To the first record at or after this time, ms since the epoch.
        #[arg(long, group = "to")]
        to_datetime: Option<i64>,
    },
}

pub(crate) async fn run(args: GroupsArgs) -> anyhow::Result<()> {
    let admin = GroupAdmin::connect(args.connect.client()?).await?;
    match args.action {
        Action::List => {
            for (group, state) in admin.list_groups().await? {
                println!("{group}\t{state}");
            }
        }
        Action::Describe { group } => describe(&admin, &group).await?,
        Action::ResetOffsets { group, topic, to_earliest: _, to_latest, to_offset, to_datetime } => {
            let offsets = match (to_latest, to_offset, to_datetime) {
                (true, _, _) => admin.topic_offsets(&topic, OffsetSpec::Latest).await?,
                (_, Some(n), _) => {
                    // An offset outside a partition's log is clamped into it, as Kafka's tool does.
                    let start = admin.topic_offsets(&topic, OffsetSpec::Earliest).await?;
                    let end = admin.topic_offsets(&topic, OffsetSpec::Latest).await?;
                    start.into_iter().zip(end).map(|((tp, lo), (_, hi))| (tp, n.clamp(lo, hi))).collect()
                }
                (_, _, Some(ts)) => admin.topic_offsets(&topic, OffsetSpec::Timestamp(ts)).await?,
                _ => admin.topic_offsets(&topic, OffsetSpec::Earliest).await?,
            };
            admin.reset_offsets(&group, &offsets).await.with_context(|| format!("cannot reset offsets of group {group}"))?;
            for (tp, offset) in &offsets {
                println!("{}\t{}\t{offset}", tp.topic, tp.partition);
            }
        }
    }
    Ok(())
}

async fn describe(admin: &GroupAdmin, group: &str) -> anyhow::Result<()> {
    let d = admin.describe_group(group).await?;
    println!("group {}  state {}  protocol {}  members {}", d.group_id, d.state, d.protocol, d.members.len());
    for m in &d.members {
        let owned: Vec<String> = m.assignment.iter().map(|tp| tp.to_string()).collect();
        println!("member {}  client {}  host {}  partitions [{}]", m.member_id, m.client_id, m.client_host, owned.join(","));
    }
    let committed = admin.committed_offsets(group).await?;
    let owners: Vec<(&TopicPartition, &str)> =
        d.members.iter().flat_map(|m| m.assignment.iter().map(move |tp| (tp, m.member_id.as_str()))).collect();
    let partitions: Vec<TopicPartition> = committed
        .keys()
        .cloned()
        .chain(owners.iter().map(|(tp, _)| (*tp).clone()))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let ends = admin.log_end_offsets(&partitions).await?;
    println!("TOPIC\tPARTITION\tCOMMITTED\tLOG-END\tLAG\tOWNER");
    let mut total = 0;
    for (tp, end) in partitions.iter().zip(ends) {
        let owner = owners.iter().find(|(o, _)| *o == tp).map_or("-", |(_, m)| m);
        match committed.get(tp) {
            Some(&c) => {
                let lag = (end - c).max(0);
                total += lag;
                println!("{}\t{}\t{c}\t{end}\t{lag}\t{owner}", tp.topic, tp.partition);
            }
            None => println!("{}\t{}\t-\t{end}\t-\t{owner}", tp.topic, tp.partition),
        }
    }
    println!("total lag {total}");
    Ok(())
}
