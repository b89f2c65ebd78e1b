//! `fjord transactions list|describe|find-hanging|abort`: the transaction coordinators'
//! view of each transactional id (ListTransactions, DescribeTransactions), and the
//! transactions open in partitions that no coordinator will end (Kafka's
//! `kafka-transactions.sh find-hanging` and `abort`, KIP-664).

use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use fjord_client::{TopicPartition, TransactionAdmin};

use super::ConnectArgs;

#[derive(Args, Debug)]
pub(crate) struct TransactionsArgs {
    #[command(flatten)]
    connect: ConnectArgs,
    #[command(subcommand)]
    action: Action,
}

#[derive(Subcommand, Debug)]
enum Action {
    /// Transactional ids with their producer id, state and coordinator, one per line.
    List,
    /// State, producer id and epoch, timeout, start time and partitions of one id.
    Describe {
        /// The transactional id.
        transactional_id: String,
    },
    /// Transactions open in a partition that no coordinator holds it in, with their
    /// producer idle longer than the longest transaction timeout: no marker will end
    /// them, and read_committed consumers of the partition wait at them. One per line.
    FindHanging {
        /// Only these topics (repeatable); every topic by default.
        #[arg(long = "topic")]
        topics: Vec<String>,
        /// The brokers' `transaction.max.timeout.ms`.
        #[arg(long, default_value_t = 900_000)]
        max_transaction_timeout_ms: u64,
    },
    /// Aborts the transaction open in a partition from `--start-offset` (as
    /// `find-hanging` prints it): an ABORT marker for its producer, written by the leader.
    Abort {
        /// The topic.
        #[arg(long)]
        topic: String,
        /// The partition.
        #[arg(long)]
        partition: i32,
        /// Where the transaction starts in the partition.
        #[arg(long)]
        start_offset: i64,
    },
}

pub(crate) async fn run(args: TransactionsArgs) -> anyhow::Result<()> {
    let admin = TransactionAdmin::connect(args.connect.client()?).await?;
    match args.action {
        Action::List => {
            println!("TRANSACTIONAL-ID\tPRODUCER-ID\tSTATE\tCOORDINATOR");
            for t in admin.list_transactions().await? {
                println!("{}\t{}\t{}\t{}", t.transactional_id, t.producer_id, t.state, t.coordinator);
            }
        }
        Action::Describe { transactional_id } => {
            let t = admin
                .describe_transaction(&transactional_id)
                .await
                .with_context(|| format!("cannot describe transactional id {transactional_id}"))?;
            println!(
                "transactional id {}  state {}  producer id {}  epoch {}  timeout ms {}  started ms {}",
                t.transactional_id, t.state, t.producer_id, t.producer_epoch, t.timeout_ms, t.start_time_ms
            );
            for tp in &t.partitions {
                println!("{}\t{}", tp.topic, tp.partition);
            }
        }
        Action::FindHanging { topics, max_transaction_timeout_ms } => {
            println!("TOPIC\tPARTITION\tPRODUCER-ID\tPRODUCER-EPOCH\tCOORDINATOR-EPOCH\tSTART-OFFSET\tLAST-TIMESTAMP");
            for h in admin.find_hanging(&topics, Duration::from_millis(max_transaction_timeout_ms)).await? {
                let p = &h.producer;
                println!(
                    "{}\t{}\t{}\t{}\t{}\t{}\t{}",
                    h.partition.topic,
                    h.partition.partition,
                    p.producer_id,
                    p.producer_epoch,
                    p.coordinator_epoch,
                    p.current_txn_start_offset,
                    p.last_timestamp
                );
            }
        }
        Action::Abort { topic, partition, start_offset } => {
            let tp = TopicPartition::new(topic, partition);
            let producers = admin.describe_producers(&tp).await?;
            let p = producers
                .iter()
                .find(|p| p.current_txn_start_offset == start_offset)
                .with_context(|| format!("no transaction open in {tp} starts at offset {start_offset}"))?;
            let epoch = i16::try_from(p.producer_epoch).context("the producer epoch is out of range")?;
            admin
                .abort_transaction(&tp, p.producer_id, epoch, p.coordinator_epoch)
                .await
                .with_context(|| format!("cannot abort the transaction of producer {} in {tp}", p.producer_id))?;
            println!("aborted the transaction of producer {} in {tp} from offset {start_offset}", p.producer_id);
        }
    }
    Ok(())
}
