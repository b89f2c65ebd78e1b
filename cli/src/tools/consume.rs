//! `fjord consume`: records to stdout, plain (the value) or JSON lines; on its own
//! (every partition, or one, from a given position) or as a member of a consumer group
//! (`--group`), which shares the partitions with the group's other members and resumes
//! from the group's committed offsets.

use std::collections::HashMap;
use std::io::Write;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use fjord_client::{
    Consumer, ConsumerConfig, ConsumerRecord, GroupConfig, GroupConsumer, IsolationLevel, OffsetReset, SeekTo, TopicPartition,
};

use super::{AuditFlag, ConnectArgs};

#[derive(Args, Debug)]
pub(crate) struct ConsumeArgs {
    #[command(flatten)]
    connect: ConnectArgs,
    /// Topic to read.
    #[arg(long)]
    topic: String,
    /// Read only this partition (all partitions when absent).
    #[arg(long, conflicts_with = "group")]
    partition: Option<i32>,
    /// Consume as a member of this consumer group: the group's members share the topic's
    /// partitions, each starts from the group's committed offset, and what was printed is
    /// committed as it goes and at the end (Ctrl-C leaves the group).
    #[arg(long)]
    group: Option<String>,
    /// Where to start: beginning, end, an OFFSET, or a TIMESTAMP (`@MILLIS` since the
    /// epoch, or `YYYY-MM-DDTHH:MM:SS[.mmm]Z`). With --group, beginning or end, for
    /// partitions the group has no committed offset for.
    #[arg(long, default_value = "end", value_parser = parse_start)]
    from: SeekTo,
    /// Stop after this many records (otherwise wait for more forever).
    #[arg(long)]
    max_messages: Option<u64>,
    /// read_committed: only records of committed transactions, up to the last stable
    /// offset; read_uncommitted (Kafka's default): everything.
    #[arg(long, value_enum, default_value_t = Isolation::ReadUncommitted)]
    isolation_level: Isolation,
    /// Output: the value per line, or one JSON object per record.
    #[arg(long, value_enum, default_value_t = Format::Plain)]
    format: Format,
    #[command(flatten)]
    audit: AuditFlag,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    Plain,
    Json,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
#[value(rename_all = "snake_case")]
enum Isolation {
    ReadUncommitted,
    ReadCommitted,
}

/// Where the records come from (one per run: its size does not matter).
#[allow(clippy::large_enum_variant)]
enum Source {
    /// Partitions assigned by hand, positioned by `--from`.
    Assigned(Consumer),
    /// A group member; `printed` holds, per partition, the offset after the last record
    /// printed and not committed yet.
    Group { member: GroupConsumer, printed: HashMap<TopicPartition, i64> },
}

impl Source {
    async fn poll(&mut self) -> anyhow::Result<Vec<ConsumerRecord>> {
        let timeout = Duration::from_secs(1);
        Ok(match self {
            Source::Assigned(consumer) => consumer.poll(timeout).await?,
            Source::Group { member, .. } => member.poll(timeout).await?,
        })
    }

    fn printed(&mut self, record: &ConsumerRecord) {
        if let Source::Group { printed, .. } = self {
            printed.insert(TopicPartition::new(&*record.topic, record.partition), record.offset + 1);
        }
    }

    /// Commits what was printed, so that the next member starts after it, and no
    /// further: a record polled but not printed (past `--max-messages`) is read again.
    /// Only partitions the member still owns: one a rebalance gave to another member is
    /// that member's to commit (its records printed here are read again there).
    async fn commit(&mut self) -> fjord_client::Result<()> {
        let Source::Group { member, printed } = self else { return Ok(()) };
        let owned = member.assignment();
        printed.retain(|tp, _| owned.contains(tp));
        if printed.is_empty() {
            return Ok(());
        }
        let offsets: Vec<(TopicPartition, i64)> = printed.iter().map(|(tp, o)| (tp.clone(), *o)).collect();
        member.commit_offsets_sync(&offsets).await?;
        printed.clear();
        Ok(())
    }

    async fn close(mut self) -> anyhow::Result<()> {
        self.commit().await.context("committing the group's offsets")?;
        if let Source::Group { member, .. } = self {
            member.close().await.context("leaving the group")?;
        }
        Ok(())
    }
}

pub(crate) async fn run(args: ConsumeArgs) -> anyhow::Result<()> {
    let audit = args.audit.start("consumer", &args.connect.client()?);
    let config = ConsumerConfig {
        client: args.connect.client()?,
        auto_offset_reset: OffsetReset::Latest,
        isolation_level: match args.isolation_level {
            Isolation::ReadUncommitted => IsolationLevel::ReadUncommitted,
            Isolation::ReadCommitted => IsolationLevel::ReadCommitted,
        },
        audit: audit.as_ref().map(|a| a.hook()),
        ..ConsumerConfig::default()
    };
    let mut source = match &args.group {
        Some(group) => {
            let auto_offset_reset = match args.from {
                SeekTo::Beginning => OffsetReset::Earliest,
                SeekTo::End => OffsetReset::Latest,
                _ => bail!("with --group, --from is beginning or end (where to start in partitions the group has no offset for)"),
            };
            let config = GroupConfig {
                consumer: ConsumerConfig { auto_offset_reset, ..config },
                // Commits follow what is printed (`Source::commit`), not what is polled.
                enable_auto_commit: false,
                ..GroupConfig::new("", group)
            };
            let member = GroupConsumer::subscribe(config, &[args.topic.as_str()]).await?;
            Source::Group { member, printed: HashMap::new() }
        }
        None => {
            let mut consumer = Consumer::connect(config).await?;
            match args.partition {
                Some(p) => consumer.assign([TopicPartition::new(&args.topic, p)]).await?,
                None => consumer.assign_topic(&args.topic).await?,
            }
            for tp in consumer.assignment() {
                consumer.seek(&tp, args.from)?;
            }
            Source::Assigned(consumer)
        }
    };
    // Ctrl-C ends the loop normally: the audit tier publishes its last counts, a group
    // member commits and leaves.
    let interruptible = audit.is_some() || args.group.is_some();
    let mut seen = 0u64;
    let stdout = std::io::stdout();
    while args.max_messages.is_none_or(|max| seen < max) {
        let records = tokio::select! {
            records = source.poll() => records?,
            _ = tokio::signal::ctrl_c(), if interruptible => break,
        };
        let mut out = stdout.lock();
        for r in records {
            if args.max_messages.is_some_and(|max| seen >= max) {
                break;
            }
            match args.format {
                Format::Plain => {
                    out.write_all(r.value.as_deref().unwrap_or_default())?;
                    out.write_all(b"\n")?;
                }
                Format::Json => writeln!(out, "{}", to_json(&r))?,
            }
            source.printed(&r);
            seen += 1;
        }
        out.flush().context("writing stdout")?;
        drop(out);
        if let Err(e) = source.commit().await {
            // A rebalance under way refuses commits; the next poll rejoins, then they go.
            tracing::warn!(%e, "could not commit the group's offsets; trying again after the next poll");
        }
    }
    source.close().await?;
    if let Some(audit) = audit {
        audit.finish().await?;
    }
    Ok(())
}

fn to_json(r: &ConsumerRecord) -> serde_json::Value {
    let text = |b: &Option<bytes::Bytes>| b.as_ref().map(|b| String::from_utf8_lossy(b).into_owned());
    serde_json::json!({
        "topic": &*r.topic,
        "partition": r.partition,
        "offset": r.offset,
        "timestamp": r.timestamp,
        "key": text(&r.key),
        "value": text(&r.value),
        "headers": r.headers.iter().map(|(k, v)| serde_json::json!({"key": k, "value": text(v)})).collect::<Vec<_>>(),
    })
}

fn parse_start(s: &str) -> Result<SeekTo, String> {
    match s {
        "beginning" | "earliest" => Ok(SeekTo::Beginning),
        "end" | "latest" => Ok(SeekTo::End),
        _ if s.starts_with('@') => s[1..].parse().map(SeekTo::Timestamp).map_err(|_| format!("bad timestamp {s:?}")),
        _ if s.contains('T') => parse_datetime(s).map(SeekTo::Timestamp),
        _ => s
            .parse::<i64>()
            .ok()
            .filter(|&o| o >= 0)
            .map(SeekTo::Offset)
            .ok_or_else(|| format!("expected beginning, end, an offset or a timestamp, got {s:?}")),
    }
}

/// `YYYY-MM-DDTHH:MM:SS[.mmm]Z` (UTC) to milliseconds since the epoch.
fn parse_datetime(s: &str) -> Result<i64, String> {
    let bad = || format!("bad datetime {s:?} (expected YYYY-MM-DDTHH:MM:SS[.mmm]Z)");
    let s2 = s.strip_suffix('Z').ok_or_else(bad)?;
    let (date, time) = s2.split_once('T').ok_or_else(bad)?;
    let d: Vec<i64> = date.split('-').map(|p| p.parse().map_err(|_| bad())).collect::<Result<_, _>>()?;
    let (hms, millis) = time.split_once('.').unwrap_or((time, "0"));
    let t: Vec<i64> = hms.split(':').map(|p| p.parse().map_err(|_| bad())).collect::<Result<_, _>>()?;
    let millis: i64 = format!("{millis:0<3}")[..3].parse().map_err(|_| bad())?;
    let (&[y, m, day], &[hh, mm, ss]) = (&d[..], &t[..]) else { return Err(bad()) };
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) || hh > 23 || mm > 59 || ss > 60 {
        return Err(bad());
    }
    // Days from civil (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Ok(((days * 86_400 + hh * 3600 + mm * 60 + ss) * 1000) + millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_positions_parse() {
        assert_eq!(parse_start("beginning").unwrap(), SeekTo::Beginning);
        assert_eq!(parse_start("end").unwrap(), SeekTo::End);
        assert_eq!(parse_start("42").unwrap(), SeekTo::Offset(42));
        assert_eq!(parse_start("@1700000000000").unwrap(), SeekTo::Timestamp(1_700_000_000_000));
        assert_eq!(parse_start("2023-11-14T22:13:20Z").unwrap(), SeekTo::Timestamp(1_700_000_000_000));
        assert_eq!(parse_start("1970-01-01T00:00:00.5Z").unwrap(), SeekTo::Timestamp(500));
        assert_eq!(parse_start("2000-03-01T00:00:00Z").unwrap(), SeekTo::Timestamp(951_868_800_000));
        for bad in ["-1", "soon", "2023-13-01T00:00:00Z", "2023-11-14T22:13:20", "@x"] {
            assert!(parse_start(bad).is_err(), "{bad}");
        }
    }
}
