//! `fjord quotas describe|alter`: client quotas (DescribeClientQuotas, AlterClientQuotas),
//! shaped like `kafka-configs --entity-type users|clients`: an entity is a user, a client
//! id, or both, each named or the default.

use std::collections::BTreeMap;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use fjord_client::{Admin, QuotaEntity, QuotaName};

use super::ConnectArgs;

#[derive(Args, Debug)]
pub(crate) struct QuotasArgs {
    #[command(flatten)]
    connect: ConnectArgs,
    #[command(subcommand)]
    action: Action,
}

/// The entity flags of both actions.
#[derive(Args, Debug)]
struct EntityArgs {
    /// A user (the principal's name, e.g. `alice`, or `ANONYMOUS`).
    #[arg(long, conflicts_with = "user_default")]
    user: Option<String>,
    /// The default user quota: every user without one of its own.
    #[arg(long)]
    user_default: bool,
    /// A client id.
    #[arg(long, conflicts_with = "client_default")]
    client_id: Option<String>,
    /// The default client-id quota: every client id without one of its own.
    #[arg(long)]
    client_default: bool,
}

impl EntityArgs {
    fn entity(&self) -> QuotaEntity {
        let name = |named: &Option<String>, default: bool| match (named, default) {
            (Some(name), _) => Some(QuotaName::Named(name.clone())),
            (None, true) => Some(QuotaName::Default),
            (None, false) => None,
        };
        QuotaEntity { user: name(&self.user, self.user_default), client_id: name(&self.client_id, self.client_default) }
    }
}

#[derive(Subcommand, Debug)]
enum Action {
    /// The quotas of one entity, or every stored quota without entity flags.
    Describe {
        #[command(flatten)]
        entity: EntityArgs,
    },
    /// Set or remove quotas of one entity.
    Alter {
        #[command(flatten)]
        entity: EntityArgs,
        /// Quotas to set, `KEY=VALUE[,KEY=VALUE...]`: producer_byte_rate and
        /// consumer_byte_rate (bytes per second), request_percentage (percent of one
        /// request-handling second). Repeatable.
        #[arg(long, visible_alias = "add-config", value_name = "KEY=VALUE,...")]
        add: Vec<String>,
        /// Quotas to remove, `KEY[,KEY...]`. Repeatable.
        #[arg(long, visible_alias = "delete-config", value_name = "KEY,...")]
        delete: Vec<String>,
        /// Shorthand for `--add producer_byte_rate=N`.
        #[arg(long, value_name = "BYTES_PER_S")]
        producer_byte_rate: Option<u64>,
        /// Shorthand for `--add consumer_byte_rate=N`.
        #[arg(long, value_name = "BYTES_PER_S")]
        consumer_byte_rate: Option<u64>,
        /// Shorthand for `--add request_percentage=P`.
        #[arg(long, value_name = "PERCENT")]
        request_percentage: Option<f64>,
        /// Have the broker check the change without storing it.
        #[arg(long)]
        validate_only: bool,
    },
}

/// `a=1,b=2` (repeated flags add up) → key → value.
fn parse_additions(flags: &[String]) -> anyhow::Result<BTreeMap<String, f64>> {
    let mut set = BTreeMap::new();
    for item in flags.iter().flat_map(|f| f.split(',')).map(str::trim).filter(|i| !i.is_empty()) {
        let Some((key, value)) = item.split_once('=') else { bail!("--add takes KEY=VALUE, not {item:?}") };
        let value: f64 = value.trim().parse().with_context(|| format!("the value of {key} is not a number: {value:?}"))?;
        set.insert(key.trim().to_owned(), value);
    }
    Ok(set)
}

/// A value as kafka-configs shows it: the byte rates as whole numbers.
fn show(key: &str, value: f64) -> String {
    if key.ends_with("_byte_rate") {
        format!("{key}={}", value as i64)
    } else {
        format!("{key}={value:?}")
    }
}

pub(crate) async fn run(args: QuotasArgs) -> anyhow::Result<()> {
    let admin = Admin::connect(args.connect.client()?).await?;
    match args.action {
        Action::Describe { entity } => {
            let entity = entity.entity();
            let quotas = admin.describe_client_quotas(&entity).await.context("cannot describe the client quotas")?;
            if quotas.is_empty() && entity != QuotaEntity::default() {
                println!("No quota configs for {entity}");
            }
            for quota in quotas {
                let values: Vec<String> = quota.values.iter().map(|(k, v)| show(k, *v)).collect();
                println!("Quota configs for {} are {}", quota.entity, values.join(", "));
            }
        }
        Action::Alter { entity, add, delete, producer_byte_rate, consumer_byte_rate, request_percentage, validate_only } => {
            let entity = entity.entity();
            if entity == QuotaEntity::default() {
                bail!("name an entity: --user U or --user-default, and/or --client-id C or --client-default");
            }
            let mut set = parse_additions(&add)?;
            let shorthands = [
                ("producer_byte_rate", producer_byte_rate.map(|v| v as f64)),
                ("consumer_byte_rate", consumer_byte_rate.map(|v| v as f64)),
                ("request_percentage", request_percentage),
            ];
            for (key, value) in shorthands {
                if let Some(value) = value {
                    set.insert(key.to_owned(), value);
                }
            }
            let remove: Vec<String> =
                delete.iter().flat_map(|d| d.split(',')).map(|k| k.trim().to_owned()).filter(|k| !k.is_empty()).collect();
            if set.is_empty() && remove.is_empty() {
                bail!("nothing to change: give --add KEY=VALUE or --delete KEY");
            }
            admin.alter_client_quotas(&entity, &set, &remove, validate_only).await?;
            let verb = if validate_only { "Validated" } else { "Completed" };
            println!("{verb} updating quota configs for {entity}.");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn additions_are_kafka_configs_style() {
        let set = parse_additions(&["producer_byte_rate=1024, consumer_byte_rate=2048".into(), "request_percentage=12.5".into()])
            .unwrap();
        assert_eq!(
            set,
            BTreeMap::from([
                ("consumer_byte_rate".into(), 2048.0),
                ("producer_byte_rate".into(), 1024.0),
                ("request_percentage".into(), 12.5)
            ])
        );
        assert!(parse_additions(&["producer_byte_rate".into()]).is_err());
        assert!(parse_additions(&["producer_byte_rate=fast".into()]).is_err());
        assert_eq!(show("producer_byte_rate", 5242880.0), "producer_byte_rate=5242880");
        assert_eq!(show("request_percentage", 50.0), "request_percentage=50.0");
    }
}
