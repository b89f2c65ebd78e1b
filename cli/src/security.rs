//! `fjord users add|list|delete` and `fjord acls add|list|remove`: through a running
//! broker (`--bootstrap`, with `--command-config` for a secured one, as Kafka's
//! `kafka-configs --bootstrap-server` and `kafka-acls --bootstrap-server`: the caller
//! needs Alter, or Describe, on the cluster), or directly on the metadata store, as
//! Kafka's `--zookeeper` tools could: on ZooKeeper (`--zookeeper HOST:PORT[/chroot]`,
//! brokers may be running) or on the embedded store of a stopped broker (`--data-dir`, its
//! log dir), which is how the first admin user of a secured cluster is made. Brokers' ACL
//! watchers pick changes up within a second or two.
//!
//! A password never comes from the command line (it would show in `ps` and shell
//! history): `--password-stdin` reads the first line of stdin, `--password-file` a
//! properties file's `password` (or `sasl.password`). Only the derived SCRAM keys are
//! stored (`fjord_auth::store`).

use std::io::BufRead;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use fjord_auth::acl::{AccessControlEntryFilter, PatternTypeFilter, ResourcePatternFilter, CLUSTER_NAME};
use fjord_auth::scram::{ScramCredential, ScramMechanism, MIN_ITERATIONS};
use fjord_auth::{store, AccessControlEntry, AclBinding, AclBindingFilter, Operation, PatternType, Permission, Principal};
use fjord_auth::{ResourcePattern, ResourceType};
use fjord_client::Admin;
use fjord_coord::Store;

/// Where the users and ACLs are: a broker, or the metadata store.
#[derive(Args, Debug)]
pub(crate) struct StoreArgs {
    /// Go through this broker, HOST:PORT[,HOST:PORT...], instead of the metadata store
    /// (Kafka's --bootstrap-server).
    #[arg(long, visible_alias = "bootstrap-server", global = true)]
    bootstrap: Option<String>,
    /// Kafka client properties file for the broker (`bootstrap.servers`,
    /// `security.protocol`, `sasl.*`, `ssl.*`): goes through the broker it names.
    #[arg(long, global = true, value_name = "FILE")]
    command_config: Option<PathBuf>,
    /// ZooKeeper connect string, `host:port[,host:port...][/chroot]` (chroot `/fjord` by
    /// default), as the brokers' `zookeeper.connect`.
    #[arg(long, env = "FJORD_ZOOKEEPER_CONNECT", global = true)]
    zookeeper: Option<String>,
    /// Without --zookeeper: the log dir of a broker on the embedded store (`fjord dev`'s
    /// `./fjord-data`). The broker must be stopped.
    #[arg(long, default_value = "./fjord-data", global = true)]
    data_dir: PathBuf,
}

/// What a users or acls command works on.
enum Target {
    Broker(Admin),
    Store(Store),
}

impl StoreArgs {
    /// The broker when `--bootstrap` or `--command-config` is given, else the store.
    async fn target(&self) -> anyhow::Result<Target> {
        if self.bootstrap.is_none() && self.command_config.is_none() {
            return Ok(Target::Store(self.open().await?));
        }
        if self.zookeeper.is_some() {
            bail!("--bootstrap goes through a broker, --zookeeper to the store: give one");
        }
        let connect = crate::tools::ConnectArgs {
            bootstrap: self.bootstrap.clone(),
            command_config: self.command_config.clone(),
            connect_timeout_ms: 5000,
        };
        Ok(Target::Broker(Admin::connect(connect.client()?).await?))
    }

    async fn open(&self) -> anyhow::Result<Store> {
        if let Some(connect) = &self.zookeeper {
            return fjord_coord::open(Some(connect), Path::new("")).await.with_context(|| format!("ZooKeeper {connect}"));
        }
        // An existing log dir only: a typo must not create an empty store somewhere else.
        if !self.data_dir.is_dir() {
            bail!("no data directory at {} (use --data-dir, or --zookeeper for a cluster)", self.data_dir.display());
        }
        let dir = self.data_dir.join(fjord_broker::server::METADATA_DIR);
        Ok(fjord_coord::open(None, &dir).await?)
    }
}

#[derive(Args, Debug)]
pub(crate) struct UsersArgs {
    #[command(flatten)]
    store: StoreArgs,
    #[command(subcommand)]
    action: UsersAction,
}

#[derive(Subcommand, Debug)]
enum UsersAction {
    /// Create a user or change its password (SCRAM credentials; PLAIN uses them too).
    #[command(group(clap::ArgGroup::new("password").required(true).args(["password_stdin", "password_file"])))]
    Add {
        /// User name.
        name: String,
        /// SCRAM mechanism(s) to store a credential for.
        #[arg(long = "mechanism", default_value = "SCRAM-SHA-256", value_parser = parse_mechanism)]
        mechanisms: Vec<ScramMechanism>,
        /// PBKDF2 iterations (4096..=16384).
        #[arg(long, default_value_t = MIN_ITERATIONS)]
        iterations: u32,
        /// Read the password from the first line of stdin.
        #[arg(long)]
        password_stdin: bool,
        /// Read the password from this properties file (`password=` or `sasl.password=`).
        #[arg(long)]
        password_file: Option<PathBuf>,
    },
    /// Users with SCRAM credentials: name, mechanism and iterations, one per line.
    List,
    /// Delete a user's credentials (all mechanisms, or only those given).
    Delete {
        /// User name.
        name: String,
        /// Only this mechanism.
        #[arg(long = "mechanism", value_parser = parse_mechanism)]
        mechanisms: Vec<ScramMechanism>,
    },
}

fn parse_mechanism(s: &str) -> Result<ScramMechanism, String> {
    s.parse().map_err(|_| format!("unknown mechanism {s:?} (SCRAM-SHA-256, SCRAM-SHA-512)"))
}

pub(crate) async fn users(args: UsersArgs) -> anyhow::Result<()> {
    let target = args.store.target().await?;
    match args.action {
        UsersAction::Add { name, mechanisms, iterations, password_stdin: _, password_file } => {
            let password = match password_file {
                Some(file) => password_from_file(&file)?,
                None => password_from_stdin()?,
            };
            for mechanism in mechanisms {
                match &target {
                    Target::Broker(admin) => admin.set_scram_password(&name, mechanism, &password, iterations).await?,
                    Target::Store(store) => {
                        let credential = ScramCredential::generate(mechanism, &password, iterations)?;
                        store::set_credential(&**store, &name, mechanism, &credential).await?;
                    }
                }
                println!("{name}\t{mechanism}\t{iterations}");
            }
        }
        UsersAction::List => {
            for (user, credentials) in list_users(&target).await? {
                for (mechanism, iterations) in credentials {
                    println!("{user}\t{mechanism}\t{iterations}");
                }
            }
        }
        UsersAction::Delete { name, mechanisms } => {
            let deleted = match &target {
                Target::Broker(admin) => {
                    let has: Vec<ScramMechanism> = list_users(&target)
                        .await?
                        .into_iter()
                        .filter(|(user, _)| *user == name)
                        .flat_map(|(_, credentials)| credentials.into_iter().map(|(m, _)| m))
                        .filter(|m| mechanisms.is_empty() || mechanisms.contains(m))
                        .collect();
                    for &mechanism in &has {
                        admin.delete_scram_credential(&name, mechanism).await?;
                    }
                    !has.is_empty()
                }
                Target::Store(store) if mechanisms.is_empty() => store::delete_user(&**store, &name).await?,
                Target::Store(store) => {
                    let mut any = false;
                    for mechanism in mechanisms {
                        any |= store::delete_credential(&**store, &name, mechanism).await?;
                    }
                    any
                }
            };
            if !deleted {
                bail!("user {name} has no such credentials");
            }
        }
    }
    Ok(())
}

/// Every user with SCRAM credentials: its mechanisms and iterations.
async fn list_users(target: &Target) -> anyhow::Result<Vec<(String, Vec<(ScramMechanism, u32)>)>> {
    Ok(match target {
        Target::Broker(admin) => admin.describe_scram_users().await?.into_iter().map(|u| (u.name, u.credentials)).collect(),
        Target::Store(store) => store::list_users(&**store)
            .await?
            .into_iter()
            .map(|(user, credentials)| (user, credentials.into_iter().collect()))
            .collect(),
    })
}

fn password_from_stdin() -> anyhow::Result<String> {
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).context("reading the password from stdin")?;
    let password = line.trim_end_matches(['\r', '\n']);
    if password.is_empty() {
        bail!("empty password on stdin");
    }
    Ok(password.to_string())
}

/// `password=` (or Kafka's client key `sasl.password=`) from a properties file.
fn password_from_file(path: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut found = None;
    for (key, value) in fjord_client::parse_properties(&text).with_context(|| path.display().to_string())? {
        match key.as_str() {
            "password" => found = Some(value),
            "sasl.password" if found.is_none() => found = Some(value),
            _ => {}
        }
    }
    match found {
        Some(password) if !password.is_empty() => Ok(password),
        _ => bail!("{} has no password= (or sasl.password=) line", path.display()),
    }
}

#[derive(Args, Debug)]
pub(crate) struct AclsArgs {
    #[command(flatten)]
    store: StoreArgs,
    #[command(subcommand)]
    action: AclsAction,
}

/// The resource an ACL command names.
#[derive(Args, Debug)]
#[group(multiple = false)]
struct ResourceArgs {
    /// A topic (with --prefixed: every topic starting with it; `*`: every topic).
    #[arg(long)]
    topic: Option<String>,
    /// A consumer group.
    #[arg(long)]
    group: Option<String>,
    /// A transactional id.
    #[arg(long)]
    transactional_id: Option<String>,
    /// The cluster.
    #[arg(long)]
    cluster: bool,
    /// A schema registry subject (Describe reads it, Write registers versions, Delete
    /// deletes, Alter sets its compatibility).
    #[arg(long)]
    subject: Option<String>,
}

impl ResourceArgs {
    fn named(&self) -> Option<(ResourceType, String)> {
        match (&self.topic, &self.group, &self.transactional_id, self.cluster) {
            (Some(t), _, _, _) => Some((ResourceType::Topic, t.clone())),
            (_, Some(g), _, _) => Some((ResourceType::Group, g.clone())),
            (_, _, Some(id), _) => Some((ResourceType::TransactionalId, id.clone())),
            (_, _, _, true) => Some((ResourceType::Cluster, CLUSTER_NAME.to_string())),
            _ => self.subject.clone().map(|s| (ResourceType::Subject, s)),
        }
    }
}

#[derive(Subcommand, Debug)]
enum AclsAction {
    /// Allow (or with --deny, deny) principals operations on a resource.
    Add {
        /// `User:NAME` (`User:*` for every user); repeatable.
        #[arg(long = "principal", required = true, value_parser = parse_principal)]
        principals: Vec<Principal>,
        /// Read, Write, Create, Delete, Alter, Describe, ClusterAction, DescribeConfigs,
        /// AlterConfigs, IdempotentWrite or All; repeatable.
        #[arg(long = "operation", required = true, value_parser = parse_operation)]
        operations: Vec<Operation>,
        #[command(flatten)]
        resource: ResourceArgs,
        /// The resource name is a prefix.
        #[arg(long)]
        prefixed: bool,
        /// Deny instead of allow (a deny wins over any allow).
        #[arg(long)]
        deny: bool,
        /// Client IP address the ACL applies to.
        #[arg(long, default_value = "*")]
        host: String,
    },
    /// ACLs, one per line; narrowed to a resource (its exact name, any pattern type, or
    /// with --prefixed the prefix pattern) and/or a principal.
    List {
        #[arg(long, value_parser = parse_principal)]
        principal: Option<Principal>,
        #[command(flatten)]
        resource: ResourceArgs,
        #[arg(long)]
        prefixed: bool,
    },
    /// Remove the ACLs on a resource that match the given principals, operations and
    /// host (all of them when not given); allow ACLs, or deny ACLs with --deny.
    Remove {
        #[arg(long = "principal", value_parser = parse_principal)]
        principals: Vec<Principal>,
        #[arg(long = "operation", value_parser = parse_operation)]
        operations: Vec<Operation>,
        #[command(flatten)]
        resource: ResourceArgs,
        #[arg(long)]
        prefixed: bool,
        #[arg(long)]
        deny: bool,
        #[arg(long)]
        host: Option<String>,
    },
}

fn parse_principal(s: &str) -> Result<Principal, String> {
    s.parse().map_err(|e: fjord_auth::Error| e.to_string())
}

fn parse_operation(s: &str) -> Result<Operation, String> {
    s.parse().map_err(|e: fjord_auth::Error| e.to_string())
}

fn pattern_type(prefixed: bool) -> PatternType {
    if prefixed {
        PatternType::Prefixed
    } else {
        PatternType::Literal
    }
}

pub(crate) async fn acls(args: AclsArgs) -> anyhow::Result<()> {
    let target = args.store.target().await?;
    match args.action {
        AclsAction::Add { principals, operations, resource, prefixed, deny, host } => {
            let (resource_type, name) =
                resource.named().context("name a resource: --topic, --group, --transactional-id or --cluster")?;
            let pattern = ResourcePattern::new(resource_type, name, pattern_type(prefixed))?;
            let permission = if deny { Permission::Deny } else { Permission::Allow };
            let mut bindings = Vec::new();
            for principal in &principals {
                for &operation in &operations {
                    let entry = AccessControlEntry::new(principal.clone(), host.clone(), operation, permission)?;
                    bindings.push(AclBinding { pattern: pattern.clone(), entry });
                }
            }
            match &target {
                Target::Broker(admin) => admin.create_acls(&bindings).await?,
                Target::Store(store) => store::create_acls(&**store, &bindings).await?,
            }
            for binding in bindings {
                println!("{binding}");
            }
        }
        AclsAction::List { principal, resource, prefixed } => {
            let (resource_type, name) = resource.named().unzip();
            let filter = AclBindingFilter {
                pattern: ResourcePatternFilter {
                    resource_type,
                    name,
                    pattern_type: if prefixed { PatternTypeFilter::Prefixed } else { PatternTypeFilter::Any },
                },
                entry: AccessControlEntryFilter { principal, ..Default::default() },
            };
            let bindings = match &target {
                Target::Broker(admin) => admin.describe_acls(&filter).await?,
                Target::Store(store) => {
                    let acls = store::read_acls(&**store).await?;
                    let selected = acls.iter().filter(|(p, _)| filter.pattern.matches(p)).flat_map(|(pattern, entries)| {
                        entries
                            .iter()
                            .filter(|e| filter.entry.matches(e))
                            .map(|entry| AclBinding { pattern: pattern.clone(), entry: entry.clone() })
                    });
                    selected.collect()
                }
            };
            for binding in bindings {
                println!("{binding}");
            }
        }
        AclsAction::Remove { principals, operations, resource, prefixed, deny, host } => {
            let (resource_type, name) =
                resource.named().context("name a resource: --topic, --group, --transactional-id or --cluster")?;
            let permission = Some(if deny { Permission::Deny } else { Permission::Allow });
            let pattern = ResourcePatternFilter {
                resource_type: Some(resource_type),
                name: Some(name),
                pattern_type: if prefixed { PatternTypeFilter::Prefixed } else { PatternTypeFilter::Literal },
            };
            // Every combination of the given principals and operations; a missing list is "any".
            let principals: Vec<Option<Principal>> =
                if principals.is_empty() { vec![None] } else { principals.into_iter().map(Some).collect() };
            let operations: Vec<Option<Operation>> =
                if operations.is_empty() { vec![None] } else { operations.into_iter().map(Some).collect() };
            let filters: Vec<AclBindingFilter> = principals
                .iter()
                .flat_map(|principal| {
                    operations.iter().map(|&operation| AclBindingFilter {
                        pattern: pattern.clone(),
                        entry: AccessControlEntryFilter {
                            principal: principal.clone(),
                            host: host.clone(),
                            operation,
                            permission,
                        },
                    })
                })
                .collect();
            let deleted = match &target {
                Target::Broker(admin) => admin.delete_acls(&filters).await?,
                Target::Store(store) => store::delete_acls(&**store, &filters).await?,
            };
            let count: usize = deleted.iter().map(Vec::len).sum();
            for binding in deleted.into_iter().flatten() {
                println!("removed {binding}");
            }
            if count == 0 {
                bail!("no ACL matched");
            }
        }
    }
    Ok(())
}
