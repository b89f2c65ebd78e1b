//! `fjord dev --secure`: the same services as `fjord dev`, but with nothing plaintext.
//! Under `<data dir>/secure/` it keeps a local CA and a server certificate for localhost /
//! 127.0.0.1 / ::1 (`ca.pem`, `server-keystore.pem`), three SCRAM users with random
//! passwords (`admin`, the super user; `broker`, the broker's own identity for its
//! inter-broker connections and the audit's broker tier; `gateway`, the gateway's identity
//! towards the broker), and `admin.properties`, a Kafka client properties file for the
//! admin that `fjord --command-config`, `kcat -F` and any Kafka client take as is.
//!
//! The files are made on the first run and reused by later ones, so a client's
//! `admin.properties` keeps working across restarts; a missing file is made again (a new
//! CA invalidates the old `ca.pem`, a new password is written into the store). The CA's
//! private key is never written: a certificate is only ever signed right after the CA is
//! made, so nothing on disk can mint another one.
//!
//! The broker's one listener is SASL_SSL (SCRAM-SHA-256/512, PLAIN over TLS), the
//! authorizer is on with no ACLs (only the super users may do anything until ACLs are
//! added) and the metrics endpoint serves HTTPS with Basic. The schema registry and the
//! gateway serve HTTPS (and gRPC over TLS) with the same certificate, HTTP Basic checked
//! against the same users, and the same ACLs. The gateway talks to the broker as
//! `gateway`, which is not a super user: its ACLs ([`gateway_acls`]) allow what its calls
//! need and nothing else, and it checks its own callers' ACLs before it acts for them. It
//! reaches the registry over HTTPS as `gateway` too (Basic, trusting the same CA), so
//! Avro records are validated against the registry's schemas as without `--secure`.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use fjord_auth::{ScramCredential, ScramMechanism};
use fjord_broker::BrokerConfig;

/// Kafka's minimum (and default) SCRAM iteration count.
const SCRAM_ITERATIONS: u32 = 4096;
/// The admin's and the broker's user names.
pub(crate) const ADMIN_USER: &str = "admin";
const BROKER_USER: &str = "broker";
const GATEWAY_USER: &str = "gateway";
/// How long the generated certificates are valid.
const VALIDITY_YEARS: i32 = 2;

/// The files and passwords of `<data dir>/secure/`.
pub(crate) struct SecureFiles {
    pub(crate) ca: PathBuf,
    pub(crate) keystore: PathBuf,
    pub(crate) admin_properties: PathBuf,
    admin_password: String,
    broker_password: String,
    gateway_password: String,
}

impl SecureFiles {
    /// Reads `<data_dir>/secure/`, making what is missing (`admin.properties` is written
    /// by [`SecureFiles::write_admin_properties`] once the address is bound).
    pub(crate) fn prepare(data_dir: &Path) -> anyhow::Result<Self> {
        let dir = data_dir.join("secure");
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .with_context(|| format!("creating {}", dir.display()))?;
        let ca = dir.join("ca.pem");
        let keystore = dir.join("server-keystore.pem");
        if !(ca.exists() && keystore.exists()) {
            let (ca_pem, keystore_pem) = make_certificates()?;
            // The keystore first: a run interrupted in between finds no ca.pem and makes both again.
            write_private(&keystore, &keystore_pem)?;
            std::fs::write(&ca, ca_pem).with_context(|| format!("writing {}", ca.display()))?;
        }
        let admin_properties = dir.join("admin.properties");
        let admin_password = match read_setting(&admin_properties, "sasl.password")? {
            Some(password) => password,
            None => random_password(),
        };
        let broker_password = internal_password(&dir, BROKER_USER, "inter-broker connections, the audit's broker tier")?;
        let gateway_password = internal_password(&dir, GATEWAY_USER, "the gateway's connections to the broker")?;
        Ok(Self { ca, keystore, admin_properties, admin_password, broker_password, gateway_password })
    }

    /// Writes `admin.properties` for the broker at `bootstrap`; rewritten each run, as the
    /// address may have moved (FJORD_LISTENERS).
    pub(crate) fn write_admin_properties(&self, bootstrap: &str) -> anyhow::Result<()> {
        let text = format!(
            "# fjord dev --secure: the super user. Use with fjord --command-config, kcat -F or any Kafka client.\n\
             bootstrap.servers={bootstrap}\nsecurity.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-256\n\
             sasl.username={ADMIN_USER}\nsasl.password={}\nssl.ca.location={}\n",
            self.admin_password,
            self.ca.display()
        );
        write_private(&self.admin_properties, text.as_bytes())
    }

    /// The broker settings of the secure mode: one SASL_SSL listener, which is also the
    /// inter-broker one, the authorizer on with the admin and the broker as super users
    /// (the gateway has ACLs: [`SecureFiles::write_users`]).
    pub(crate) fn configure(&self, config: &mut BrokerConfig, address: &str) -> anyhow::Result<()> {
        for (key, value) in [
            ("listeners", format!("SASL_SSL://{address}")),
            ("inter.broker.listener.name", "SASL_SSL".into()),
            ("ssl.keystore.type", "PEM".into()),
            ("ssl.keystore.location", utf8(&self.keystore)?),
            ("ssl.truststore.location", utf8(&self.ca)?),
            ("sasl.enabled.mechanisms", "SCRAM-SHA-256,SCRAM-SHA-512,PLAIN".into()),
            ("sasl.mechanism.inter.broker.protocol", "SCRAM-SHA-256".into()),
            ("inter.broker.sasl.username", BROKER_USER.into()),
            ("inter.broker.sasl.password", self.broker_password.clone()),
            ("authorizer.enable", "true".into()),
            ("super.users", format!("User:{ADMIN_USER};User:{BROKER_USER}")),
            ("allow.everyone.if.no.acl.found", "false".into()),
            // The metrics endpoint: HTTPS with the same certificate, Basic with the same users.
            ("metrics.ssl.keystore.location", utf8(&self.keystore)?),
            ("metrics.authentication.method", "BASIC".into()),
        ] {
            config.set(key, &value).with_context(|| format!("--secure sets {key}"))?;
        }
        Ok(())
    }

    /// The registry's and the gateway's HTTP security: HTTPS with the server certificate,
    /// Basic against the same users, the ACLs on with the admin as super user.
    pub(crate) fn http_security(&self) -> anyhow::Result<Vec<(&'static str, String)>> {
        Ok(vec![
            ("ssl.keystore.location", utf8(&self.keystore)?),
            ("authentication.method", "BASIC".into()),
            ("authorizer.enable", "true".into()),
            ("super.users", format!("User:{ADMIN_USER}")),
            ("allow.everyone.if.no.acl.found", "false".into()),
        ])
    }

    /// The gateway's own broker identity (its `client.*` keys).
    pub(crate) fn gateway_client(&self) -> anyhow::Result<Vec<(&'static str, String)>> {
        Ok(vec![
            ("client.security.protocol", "SASL_SSL".into()),
            ("client.sasl.mechanism", "SCRAM-SHA-256".into()),
            ("client.sasl.username", GATEWAY_USER.into()),
            ("client.sasl.password", self.gateway_password.clone()),
            ("client.ssl.ca.location", utf8(&self.ca)?),
        ])
    }

    /// The gateway's registry client: the CA, and Basic as `gateway` (schemas by id are
    /// open to every authenticated user).
    pub(crate) fn gateway_registry(&self) -> anyhow::Result<Vec<(&'static str, String)>> {
        Ok(vec![
            ("schema.registry.ssl.ca.location", utf8(&self.ca)?),
            ("schema.registry.basic.auth.user.info", format!("{GATEWAY_USER}:{}", self.gateway_password)),
        ])
    }

    /// Writes the users' SCRAM credentials (both mechanisms) into the
    /// store, replacing older ones, so the passwords on disk are the ones that work, and
    /// the gateway's ACLs ([`gateway_acls`]; ACLs already there are kept).
    pub(crate) async fn write_users(&self, store: &dyn fjord_coord::MetadataStore) -> anyhow::Result<()> {
        let users =
            [(ADMIN_USER, &self.admin_password), (BROKER_USER, &self.broker_password), (GATEWAY_USER, &self.gateway_password)];
        for (user, password) in users {
            for mechanism in [ScramMechanism::Sha256, ScramMechanism::Sha512] {
                let credential = ScramCredential::generate(mechanism, password, SCRAM_ITERATIONS)?;
                fjord_auth::store::set_credential(store, user, mechanism, &credential)
                    .await
                    .with_context(|| format!("storing the credential of {user}"))?;
            }
        }
        fjord_auth::store::create_acls(store, &gateway_acls()?).await.context("storing the gateway's ACLs")
    }
}

/// What the gateway's broker identity may do: exactly what its calls need.
/// - Publishing for its callers into any topic they may write (the gateway checks their
///   Write first): Write and Describe (Metadata) on every topic; its producers are
///   idempotent (InitProducerId): IdempotentWrite on the cluster; atomic publishes use
///   one transactional producer: Write and Describe on transactional ids `fjord-gateway-*`.
/// - Stateless pulls (assigned partitions, no group) and its topic listing and
///   descriptions: Read and Describe (Fetch, ListOffsets, Metadata) on every topic. No
///   group ACL: it joins no group.
/// - `_gateway_idempotency` (its key store) and `_audit` (its audit tier): it creates them
///   when missing (Create), then writes and reads them through the grants above.
/// - Never Kafka's internal topics (every `__` name: `__consumer_offsets`,
///   `__transaction_state`) nor the other tools' (`_mirror_gaps`, `_schemas`): denies,
///   which win over the `*` allows.
///
/// Nothing else: no Create elsewhere (a publish to a missing topic is refused, not
/// auto-created), no Delete, Alter or config changes, no ACL or user management.
fn gateway_acls() -> anyhow::Result<Vec<fjord_auth::AclBinding>> {
    use fjord_auth::acl::CLUSTER_NAME;
    use fjord_auth::{
        AccessControlEntry, AclBinding, Operation, PatternType, Permission, Principal, ResourcePattern, ResourceType,
    };
    use Operation::{All, Create, Describe, IdempotentWrite, Read, Write};
    use PatternType::{Literal, Prefixed};
    use Permission::{Allow, Deny};
    use ResourceType::{Cluster, Topic, TransactionalId};
    let grants = [
        (Topic, "*", Literal, Write, Allow),
        (Topic, "*", Literal, Read, Allow),
        (Topic, "*", Literal, Describe, Allow),
        (Topic, fjord_gateway::IDEMPOTENCY_TOPIC, Literal, Create, Allow),
        (Topic, fjord_audit::AUDIT_TOPIC, Literal, Create, Allow),
        (Cluster, CLUSTER_NAME, Literal, IdempotentWrite, Allow),
        // Atomic publishes: one transactional producer, transactional.id fjord-gateway-<host>.
        (TransactionalId, "fjord-gateway-", Prefixed, Write, Allow),
        (TransactionalId, "fjord-gateway-", Prefixed, Describe, Allow),
        // Kafka's internal topics and the other tools' own: a deny wins over the allows.
        (Topic, "__", Prefixed, All, Deny),
        (Topic, fjord_audit::GAPS_TOPIC, Literal, All, Deny),
        (Topic, "_schemas", Literal, All, Deny),
    ];
    grants
        .into_iter()
        .map(|(resource_type, name, pattern_type, operation, permission)| {
            Ok(AclBinding {
                pattern: ResourcePattern::new(resource_type, name, pattern_type)?,
                entry: AccessControlEntry::new(Principal::user(GATEWAY_USER), "*", operation, permission)?,
            })
        })
        .collect()
}

fn utf8(path: &Path) -> anyhow::Result<String> {
    path.to_str().map(str::to_owned).with_context(|| format!("{} is not valid UTF-8", path.display()))
}

/// The password of the internal user `user` from `<dir>/<user>.properties`, made (and the
/// file written) when missing.
fn internal_password(dir: &Path, user: &str, what: &str) -> anyhow::Result<String> {
    let file = dir.join(format!("{user}.properties"));
    if let Some(password) = read_setting(&file, "sasl.password")? {
        return Ok(password);
    }
    let password = random_password();
    let text = format!("# The identity of {what}.\nsasl.username={user}\nsasl.password={password}\n");
    write_private(&file, text.as_bytes())?;
    Ok(password)
}

/// A CA and a server certificate signed by it, as (`ca.pem`, key + certificate PEM).
fn make_certificates() -> anyhow::Result<(String, Vec<u8>)> {
    use rcgen::{
        BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
    };
    let now = SystemTime::now().duration_since(UNIX_EPOCH).context("the clock is before 1970")?;
    // Whole years around now: a day's error in the year does not matter at this width.
    let year = 1970 + (now.as_secs() / 31_556_952) as i32;
    let (not_before, not_after) = (rcgen::date_time_ymd(year - 1, 1, 1), rcgen::date_time_ymd(year + VALIDITY_YEARS, 1, 1));

    let ca_key = KeyPair::generate().context("generating the CA key")?;
    let mut ca_params = CertificateParams::default();
    ca_params.distinguished_name = DistinguishedName::new();
    ca_params.distinguished_name.push(DnType::CommonName, "fjord dev --secure local CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    (ca_params.not_before, ca_params.not_after) = (not_before, not_after);
    let ca = ca_params.self_signed(&ca_key).context("signing the CA certificate")?;

    let server_key = KeyPair::generate().context("generating the server key")?;
    let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned(), "::1".to_owned()];
    let mut params = CertificateParams::new(names).context("the server certificate's names")?;
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, "localhost");
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    // Client auth too: the broker presents it when it connects to itself (the audit).
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    (params.not_before, params.not_after) = (not_before, not_after);
    let server = params.signed_by(&server_key, &ca, &ca_key).context("signing the server certificate")?;
    let keystore = format!("{}{}", server_key.serialize_pem(), server.pem());
    Ok((ca.pem(), keystore.into_bytes()))
}

/// 32 random bytes as 64 hex digits: nothing a properties file or a shell would mangle.
fn random_password() -> String {
    let mut bytes = [0u8; 32];
    rand::fill(&mut bytes[..]);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `key`'s value in the properties file at `path`; `None` when the file is missing.
fn read_setting(path: &Path, key: &str) -> anyhow::Result<Option<String>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let pairs = fjord_client::parse_properties(&text).with_context(|| format!("in {}", path.display()))?;
    match pairs.into_iter().find(|(k, _)| k == key) {
        Some((_, value)) if !value.is_empty() => Ok(Some(value)),
        _ => bail!("{} has no {key}: delete the file to have a new one made", path.display()),
    }
}

/// Writes `bytes` to `path` readable by this user only (a temporary file renamed over it).
fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    let context = || format!("writing {}", path.display());
    let _ = std::fs::remove_file(&tmp);
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp).with_context(context)?;
    file.write_all(bytes).with_context(context)?;
    file.sync_all().with_context(context)?;
    std::fs::rename(&tmp, path).with_context(context)
}
