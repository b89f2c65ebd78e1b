//! `fjord transactions list|describe`: the transaction coordinators' view of each
//! transactional id (ListTransactions, DescribeTransactions).

use anyhow::Context;
use clap::{Args, Subcommand};
use fjord_client::TransactionAdmin;

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
    }
    Ok(())
}
