//! Subjects, versions, schema ids and compatibility config as znodes in the metadata store.
//!
//! # Layout (under the store's root; ZooKeeper applies the chroot, `/fjord` by default)
//! ```text
//! /schemas/ids/<id>                          {"schema": "<canonical text>"}   written once, never changed or deleted
//! /schemas/fingerprints/<sha256 of text>     {"id": <id>}                    canonical text → id, claimed by create
//! /schemas/id_counter                        "<last id handed out>"          bumped by compare-and-set
//! /schemas/subjects/<subject>                {"compatibilityLevel": ".."} or empty: the subject's own level
//! /schemas/subjects/<subject>/versions/<v>   {"id": <id>, "deleted": bool}   soft delete flips `deleted`
//! /schemas/config                            {"compatibilityLevel": ".."}    the global level
//! ```
//! Subject names are percent-encoded into one path component (anything but `A-Z a-z 0-9 . _ -`,
//! and a bare `.` or `..`), so any subject string maps to a legal, reversible node name.
//!
//! Every multi-node change is ordered so a crash or a lost race leaves nothing visible that
//! points at something missing: a schema is written under its id before the fingerprint
//! that leads to it, and a version node (the only thing that makes a schema part of a
//! subject) is created last, after the compatibility check.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use apache_avro::Schema;
use fjord_coord::{create_all, delete_all, paths, CreateMode, Store};
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;

use crate::compat::{self, CompatibilityLevel};
use crate::schema::{ParsedSchema, SchemaLimits};
use crate::{Error, Result};

const FINGERPRINTS: &str = "/schemas/fingerprints";
const ID_COUNTER: &str = "/schemas/id_counter";
const GLOBAL_CONFIG: &str = "/schemas/config";
/// Retries when another instance wins a race (counter CAS, version number, soft-delete CAS).
const MAX_RACE_RETRIES: usize = 32;

/// A version of a subject, in the API's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionSpec {
    /// The highest live version (`latest` or `-1` in URLs).
    Latest,
    /// A version number, ≥ 1.
    Number(i32),
}

impl VersionSpec {
    /// Parses a URL version: `latest`, `-1`, or 1..=2^31-1; anything else is
    /// [`Error::InvalidVersion`] (REST 42202).
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "latest" | "-1" => Ok(Self::Latest),
            _ => match s.parse::<i32>() {
                Ok(v) if v >= 1 => Ok(Self::Number(v)),
                _ => Err(Error::InvalidVersion(s.to_string())),
            },
        }
    }
}

/// One version of a subject with its schema.
#[derive(Debug, Clone)]
pub struct SubjectVersion {
    /// Subject name.
    pub subject: String,
    /// Version number.
    pub version: i32,
    /// Global schema id.
    pub id: i32,
    /// Canonical schema text.
    pub schema: Arc<StoredSchema>,
    /// Soft-deleted.
    pub deleted: bool,
}

/// A schema as stored under its id, parsed once per instance.
#[derive(Debug)]
pub struct StoredSchema {
    /// Canonical text, as served by the API.
    pub text: String,
    /// Parsed form, for compatibility checks and decoding.
    pub schema: Schema,
}

#[derive(Serialize, Deserialize)]
struct IdDoc {
    schema: String,
}

#[derive(Serialize, Deserialize)]
struct FingerprintDoc {
    id: i32,
}

#[derive(Serialize, Deserialize)]
struct VersionDoc {
    id: i32,
    #[serde(default)]
    deleted: bool,
}

#[derive(Serialize, Deserialize)]
struct ConfigDoc {
    #[serde(rename = "compatibilityLevel")]
    compatibility_level: CompatibilityLevel,
}

/// A version node as read: number, content and the node version for compare-and-set.
struct VersionNode {
    version: i32,
    doc: VersionDoc,
    stat_version: i32,
}

/// The registry's view of the metadata store, with an id → schema cache. Cheap to share:
/// several API instances (or tests) may each hold one on the same [`Store`].
pub struct SchemaStore {
    store: Store,
    default_level: CompatibilityLevel,
    /// Ids never change meaning once written, so entries never go stale.
    by_id: RwLock<HashMap<i32, Arc<StoredSchema>>>,
    /// Bounds on submitted schemas.
    limits: SchemaLimits,
    /// One permit per CPU-heavy task (parse, compatibility check) allowed to run at once.
    cpu: Arc<Semaphore>,
}

/// CPU-heavy tasks at once by default: half the cores, at least one, at most four. The
/// rest stays with the async workers, which in `fjord dev` serve the brokers too.
pub fn default_cpu_tasks() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get() / 2).clamp(1, 4)
}

impl SchemaStore {
    /// A registry over `store`; `default_level` applies until `PUT /config` sets one.
    /// Default [`SchemaLimits`] and [`default_cpu_tasks`].
    pub fn new(store: Store, default_level: CompatibilityLevel) -> Self {
        Self::with_limits(store, default_level, SchemaLimits::default(), default_cpu_tasks())
    }

    /// As [`SchemaStore::new`], with bounds on submitted schemas and on how many CPU-heavy
    /// tasks (at least one) run at once.
    pub fn with_limits(store: Store, default_level: CompatibilityLevel, limits: SchemaLimits, cpu_tasks: usize) -> Self {
        Self { store, default_level, by_id: RwLock::new(HashMap::new()), limits, cpu: Arc::new(Semaphore::new(cpu_tasks.max(1))) }
    }

    /// Runs CPU-heavy `work` (parsing a schema, checking compatibility: seconds for a schema
    /// of megabytes) on tokio's blocking pool, at most `cpu_tasks` at once, so that it never
    /// holds an async worker: in `fjord dev` those serve the brokers and the gateway too, and
    /// two checks on them once stalled a broker's ApiVersions for 6 s. The permit goes with
    /// the task, so a request given up by its client still counts until its work is done.
    async fn off_runtime<T: Send + 'static>(&self, work: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
        let permit = self.cpu.clone().acquire_owned().await.expect("invariant: the CPU semaphore is never closed");
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            work()
        })
        .await
        .map_err(|e| Error::BackgroundTask(e.to_string()))?
    }

    /// Parses a submitted schema under this registry's [`SchemaLimits`], off the async workers.
    pub async fn parse(&self, text: String) -> Result<ParsedSchema> {
        let limits = self.limits;
        self.off_runtime(move || ParsedSchema::parse_with(&text, &limits)).await
    }

    // ---- schemas by id ----------------------------------------------------------------

    /// The schema with global id `id` ([`Error::UnknownId`] if none), from the cache when
    /// this instance has seen it before.
    pub async fn schema_by_id(&self, id: i32) -> Result<Arc<StoredSchema>> {
        if let Some(hit) = self.by_id.read().expect("invariant: cache lock not poisoned").get(&id) {
            return Ok(hit.clone());
        }
        if id < 1 {
            return Err(Error::UnknownId(id));
        }
        let path = paths::schema_id(id);
        let (data, _) = self.store.get(&path).await?.ok_or(Error::UnknownId(id))?;
        let doc: IdDoc = decode(&path, &data)?;
        // Stored schemas are parsed without the limits: one registered before they were
        // enforced must stay servable, and checks against it are bounded on their own.
        let entry = self
            .off_runtime(move || match Schema::parse_str(&doc.schema) {
                Ok(schema) => Ok(Arc::new(StoredSchema { text: doc.schema, schema })),
                Err(e) => Err(Error::Corrupt { path, detail: format!("stored schema does not parse: {e}") }),
            })
            .await?;
        self.by_id.write().expect("invariant: cache lock not poisoned").insert(id, entry.clone());
        Ok(entry)
    }

    /// The id already given to this canonical text, if any.
    async fn id_of(&self, parsed: &ParsedSchema) -> Result<Option<i32>> {
        let path = format!("{FINGERPRINTS}/{}", parsed.fingerprint());
        let Some((data, _)) = self.store.get(&path).await? else { return Ok(None) };
        let doc: FingerprintDoc = decode(&path, &data)?;
        let stored = self.schema_by_id(doc.id).await?;
        if stored.text != parsed.canonical {
            return Err(Error::Corrupt { path, detail: format!("fingerprint names id {} whose schema differs", doc.id) });
        }
        Ok(Some(doc.id))
    }

    /// The id of this canonical text, allocating one if it has none. Safe against other
    /// instances doing the same at once: the fingerprint node is claimed with a create, and
    /// a loser drops its freshly written id node and uses the winner's id.
    async fn get_or_allocate_id(&self, parsed: &ParsedSchema) -> Result<i32> {
        if let Some(id) = self.id_of(parsed).await? {
            return Ok(id);
        }
        let id = self.next_id().await?;
        let id_path = paths::schema_id(id);
        create_all(&*self.store, &id_path, &encode(&IdDoc { schema: parsed.canonical.clone() }), CreateMode::Persistent).await?;
        let fp_path = format!("{FINGERPRINTS}/{}", parsed.fingerprint());
        match create_all(&*self.store, &fp_path, &encode(&FingerprintDoc { id }), CreateMode::Persistent).await {
            Ok(_) => Ok(id),
            Err(fjord_coord::Error::NodeExists { .. }) => {
                // Another instance registered the same schema first: its id wins. Our id node
                // is unreachable (no fingerprint, no version points at it); remove it.
                let winner = self.id_of(parsed).await?.ok_or_else(|| Error::Corrupt {
                    path: fp_path.clone(),
                    detail: "fingerprint vanished after a create race".into(),
                })?;
                match self.store.delete(&id_path, None).await {
                    Ok(()) | Err(fjord_coord::Error::NoNode { .. }) => {}
                    Err(e) => tracing::warn!(%id_path, error = %e, "could not remove an unused schema id node"),
                }
                Ok(winner)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Takes the next id from the counter node by compare-and-set.
    async fn next_id(&self) -> Result<i32> {
        for _ in 0..MAX_RACE_RETRIES {
            let Some((data, stat)) = self.store.get(ID_COUNTER).await? else {
                match create_all(&*self.store, ID_COUNTER, b"0", CreateMode::Persistent).await {
                    Ok(_) | Err(fjord_coord::Error::NodeExists { .. }) => continue,
                    Err(e) => return Err(e.into()),
                }
            };
            let last: i32 = std::str::from_utf8(&data).ok().and_then(|s| s.trim().parse().ok()).ok_or_else(|| {
                Error::Corrupt { path: ID_COUNTER.into(), detail: format!("not a number: {:?}", String::from_utf8_lossy(&data)) }
            })?;
            let next = last.checked_add(1).ok_or(Error::IdsExhausted)?;
            match self.store.set(ID_COUNTER, next.to_string().as_bytes(), Some(stat.version)).await {
                Ok(_) => return Ok(next),
                Err(fjord_coord::Error::BadVersion { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(Error::Contention(ID_COUNTER.into()))
    }

    // ---- subjects and versions --------------------------------------------------------

    /// Subjects with at least one live version (or any version, with `include_deleted`), sorted.
    pub async fn subjects(&self, include_deleted: bool) -> Result<Vec<String>> {
        let names = match self.store.children(paths::SCHEMA_SUBJECTS).await {
            Ok(names) => names,
            Err(fjord_coord::Error::NoNode { .. }) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        let mut out = Vec::new();
        for name in names {
            let subject = decode_subject(&name);
            if self.has_version(&subject, include_deleted).await? {
                out.push(subject);
            }
        }
        out.sort();
        Ok(out)
    }

    /// Whether the subject has a live version (or any, with `include_deleted`). Reads from
    /// the newest version down and stops at the first live one: usually one read.
    async fn has_version(&self, subject: &str, include_deleted: bool) -> Result<bool> {
        for v in self.version_numbers(subject).await?.into_iter().rev() {
            match self.read_version(subject, v).await? {
                Some(node) if include_deleted || !node.doc.deleted => return Ok(true),
                _ => {}
            }
        }
        Ok(false)
    }

    /// Version numbers of a subject, ascending ([`Error::SubjectNotFound`] if none).
    pub async fn versions(&self, subject: &str, include_deleted: bool) -> Result<Vec<i32>> {
        let versions: Vec<i32> = self
            .version_nodes(subject)
            .await?
            .into_iter()
            .filter(|n| include_deleted || !n.doc.deleted)
            .map(|n| n.version)
            .collect();
        if versions.is_empty() {
            return Err(Error::SubjectNotFound(subject.into()));
        }
        Ok(versions)
    }

    /// One version of a subject. `Latest` is the highest live version (with
    /// `include_deleted`, the highest one when none is live). Reads only the nodes it needs:
    /// serving `latest` or a given version is one listing and usually one read, however
    /// many versions the subject has (each read is a round trip to ZooKeeper).
    pub async fn version(&self, subject: &str, spec: VersionSpec, include_deleted: bool) -> Result<SubjectVersion> {
        let numbers = self.version_numbers(subject).await?;
        if let VersionSpec::Number(v) = spec {
            if numbers.contains(&v) {
                if let Some(node) = self.read_version(subject, v).await?.filter(|n| include_deleted || !n.doc.deleted) {
                    return self.subject_version(subject, &node).await;
                }
            }
        }
        // Newest first: the highest live version, else the highest at all (for `deleted`).
        let mut newest_visible = None;
        for &v in numbers.iter().rev() {
            let Some(node) = self.read_version(subject, v).await? else { continue };
            if !node.doc.deleted {
                newest_visible = Some(node);
                break;
            }
            if include_deleted && newest_visible.is_none() {
                newest_visible = Some(node);
            }
        }
        match (spec, newest_visible) {
            (_, None) => Err(Error::SubjectNotFound(subject.into())),
            (VersionSpec::Latest, Some(node)) => self.subject_version(subject, &node).await,
            (VersionSpec::Number(version), Some(_)) => Err(Error::VersionNotFound { subject: subject.into(), version }),
        }
    }

    async fn subject_version(&self, subject: &str, node: &VersionNode) -> Result<SubjectVersion> {
        Ok(SubjectVersion {
            subject: subject.into(),
            version: node.version,
            id: node.doc.id,
            schema: self.schema_by_id(node.doc.id).await?,
            deleted: node.doc.deleted,
        })
    }

    /// Registers `parsed` under `subject` and returns its global id. A schema already live in
    /// the subject returns its id without a new version; otherwise the subject's
    /// compatibility level is enforced ([`Error::Incompatible`]) before anything is written.
    pub async fn register(&self, subject: &str, parsed: &ParsedSchema) -> Result<i32> {
        for _ in 0..MAX_RACE_RETRIES {
            let nodes = self.version_nodes(subject).await?;
            let known_id = self.id_of(parsed).await?;
            if let Some(id) = known_id {
                if nodes.iter().any(|n| !n.doc.deleted && n.doc.id == id) {
                    return Ok(id);
                }
            }
            let level = self.effective_level(subject).await?;
            let messages = self.check_against(level, parsed, &nodes).await?;
            if !messages.is_empty() {
                return Err(Error::Incompatible { subject: subject.into(), level, messages });
            }
            let id = match known_id {
                Some(id) => id,
                None => self.get_or_allocate_id(parsed).await?,
            };
            // Numbers keep growing past soft-deleted versions, as Confluent's do.
            let next = nodes.last().map_or(1, |n| n.version + 1);
            let path = paths::subject_version(&encode_subject(subject), next);
            match create_all(&*self.store, &path, &encode(&VersionDoc { id, deleted: false }), CreateMode::Persistent).await {
                Ok(_) => return Ok(id),
                // Another instance took this version number: re-read and re-check against it.
                Err(fjord_coord::Error::NodeExists { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(Error::Contention(paths::subject(&encode_subject(subject))))
    }

    /// `POST /subjects/{s}`: the version of `subject` whose schema is `parsed`.
    pub async fn lookup(&self, subject: &str, parsed: &ParsedSchema, include_deleted: bool) -> Result<SubjectVersion> {
        let nodes = self.version_nodes(subject).await?;
        if !nodes.iter().any(|n| include_deleted || !n.doc.deleted) {
            return Err(Error::SubjectNotFound(subject.into()));
        }
        let id = self.id_of(parsed).await?.ok_or(Error::SchemaNotFound)?;
        // The newest live match; a soft-deleted one only when asked for.
        let node = nodes
            .iter()
            .rev()
            .find(|n| n.doc.id == id && !n.doc.deleted)
            .or_else(|| nodes.iter().rev().find(|n| n.doc.id == id && include_deleted))
            .ok_or(Error::SchemaNotFound)?;
        self.subject_version(subject, node).await
    }

    /// `POST /compatibility/subjects/{s}/versions[/{v}]`: messages for each failed rule
    /// (empty = compatible). With a version, checks against that version alone under the
    /// subject's level (non-transitively); without, against what the level prescribes.
    pub async fn check_compatibility(
        &self,
        subject: &str,
        parsed: &ParsedSchema,
        spec: Option<VersionSpec>,
    ) -> Result<Vec<String>> {
        let level = self.effective_level(subject).await?;
        match spec {
            None => {
                let nodes = self.version_nodes(subject).await?;
                self.check_against(level, parsed, &nodes).await
            }
            Some(spec) => {
                let old = self.version(subject, spec, false).await?;
                let single = match level {
                    CompatibilityLevel::BackwardTransitive => CompatibilityLevel::Backward,
                    CompatibilityLevel::ForwardTransitive => CompatibilityLevel::Forward,
                    CompatibilityLevel::FullTransitive => CompatibilityLevel::Full,
                    other => other,
                };
                let (new, limits) = (parsed.schema.clone(), self.limits);
                self.off_runtime(move || compat::check(single, &new, &[(old.version, &old.schema.schema)], &limits)).await
            }
        }
    }

    async fn check_against(
        &self,
        level: CompatibilityLevel,
        parsed: &ParsedSchema,
        nodes: &[VersionNode],
    ) -> Result<Vec<String>> {
        if level == CompatibilityLevel::None {
            return Ok(Vec::new());
        }
        let mut live = Vec::new();
        for node in nodes.iter().rev().filter(|n| !n.doc.deleted) {
            live.push((node.version, self.schema_by_id(node.doc.id).await?));
        }
        let (new, limits) = (parsed.schema.clone(), self.limits);
        self.off_runtime(move || {
            let previous: Vec<(i32, &Schema)> = live.iter().map(|(v, s)| (*v, &s.schema)).collect();
            compat::check(level, &new, &previous, &limits)
        })
        .await
    }

    /// `DELETE /subjects/{s}`: soft-deletes every live version (returns them), or with
    /// `permanent` removes a subject whose versions are all soft-deleted (returns those).
    pub async fn delete_subject(&self, subject: &str, permanent: bool) -> Result<Vec<i32>> {
        let nodes = self.version_nodes(subject).await?;
        if nodes.is_empty() {
            return Err(Error::SubjectNotFound(subject.into()));
        }
        if permanent {
            if nodes.iter().any(|n| !n.doc.deleted) {
                return Err(Error::SubjectNotSoftDeleted(subject.into()));
            }
            // Ids stay: data written with them must remain readable.
            delete_all(&*self.store, &paths::subject(&encode_subject(subject))).await?;
            return Ok(nodes.iter().map(|n| n.version).collect());
        }
        let live: Vec<&VersionNode> = nodes.iter().filter(|n| !n.doc.deleted).collect();
        if live.is_empty() {
            return Err(Error::SubjectSoftDeleted(subject.into()));
        }
        for node in &live {
            self.soft_delete(subject, node).await?;
        }
        Ok(live.iter().map(|n| n.version).collect())
    }

    /// `DELETE /subjects/{s}/versions/{v}`: soft delete, or with `permanent` removal of a
    /// soft-deleted version. Returns the version number.
    pub async fn delete_version(&self, subject: &str, spec: VersionSpec, permanent: bool) -> Result<i32> {
        let nodes = self.version_nodes(subject).await?;
        if nodes.is_empty() {
            return Err(Error::SubjectNotFound(subject.into()));
        }
        let node = match spec {
            VersionSpec::Latest => nodes.iter().rev().find(|n| !n.doc.deleted || permanent),
            VersionSpec::Number(v) => nodes.iter().find(|n| n.version == v),
        };
        let not_found = || Error::VersionNotFound {
            subject: subject.into(),
            version: match spec {
                VersionSpec::Number(v) => v,
                VersionSpec::Latest => -1,
            },
        };
        let node = node.ok_or_else(not_found)?;
        match (permanent, node.doc.deleted) {
            (false, false) => self.soft_delete(subject, node).await?,
            (false, true) => return Err(Error::VersionSoftDeleted { subject: subject.into(), version: node.version }),
            (true, false) => return Err(Error::VersionNotSoftDeleted { subject: subject.into(), version: node.version }),
            (true, true) => {
                let path = paths::subject_version(&encode_subject(subject), node.version);
                match self.store.delete(&path, Some(node.stat_version)).await {
                    Ok(()) => {}
                    Err(fjord_coord::Error::NoNode { .. }) => return Err(not_found()),
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(node.version)
    }

    /// Flips `deleted` by compare-and-set; a concurrent change is re-read, and a version
    /// someone else deleted (soft or hard) meanwhile counts as done.
    async fn soft_delete(&self, subject: &str, node: &VersionNode) -> Result<()> {
        let path = paths::subject_version(&encode_subject(subject), node.version);
        let mut stat_version = node.stat_version;
        for _ in 0..MAX_RACE_RETRIES {
            let doc = VersionDoc { id: node.doc.id, deleted: true };
            match self.store.set(&path, &encode(&doc), Some(stat_version)).await {
                Ok(_) | Err(fjord_coord::Error::NoNode { .. }) => return Ok(()),
                Err(fjord_coord::Error::BadVersion { .. }) => match self.store.get(&path).await? {
                    None => return Ok(()),
                    Some((data, stat)) => {
                        let now: VersionDoc = decode(&path, &data)?;
                        if now.deleted {
                            return Ok(());
                        }
                        stat_version = stat.version;
                    }
                },
                Err(e) => return Err(e.into()),
            }
        }
        Err(Error::Contention(path))
    }

    /// `GET /schemas/ids/{id}/versions`: every live (subject, version) using `id`.
    pub async fn subject_versions_of_id(&self, id: i32) -> Result<Vec<(String, i32)>> {
        self.schema_by_id(id).await?;
        let mut out = Vec::new();
        for subject in self.subjects(false).await? {
            for node in self.version_nodes(&subject).await? {
                if node.doc.id == id && !node.doc.deleted {
                    out.push((subject.clone(), node.version));
                }
            }
        }
        Ok(out)
    }

    /// All version nodes of a subject (live and soft-deleted), ascending by version.
    async fn version_nodes(&self, subject: &str) -> Result<Vec<VersionNode>> {
        let mut nodes = Vec::new();
        for version in self.version_numbers(subject).await? {
            // Gone between the listing and the read: deleted concurrently, skip it.
            if let Some(node) = self.read_version(subject, version).await? {
                nodes.push(node);
            }
        }
        Ok(nodes)
    }

    /// The version numbers present (live or soft-deleted), ascending, without reading them.
    async fn version_numbers(&self, subject: &str) -> Result<Vec<i32>> {
        let parent = format!("{}/versions", paths::subject(&encode_subject(subject)));
        let names = match self.store.children(&parent).await {
            Ok(names) => names,
            Err(fjord_coord::Error::NoNode { .. }) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        let mut numbers = names
            .iter()
            .map(|name| {
                name.parse::<i32>().map_err(|_| Error::Corrupt {
                    path: format!("{parent}/{name}"),
                    detail: "version node name is not a number".into(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        numbers.sort_unstable();
        Ok(numbers)
    }

    async fn read_version(&self, subject: &str, version: i32) -> Result<Option<VersionNode>> {
        let path = paths::subject_version(&encode_subject(subject), version);
        let Some((data, stat)) = self.store.get(&path).await? else { return Ok(None) };
        Ok(Some(VersionNode { version, doc: decode(&path, &data)?, stat_version: stat.version }))
    }

    // ---- compatibility config ---------------------------------------------------------

    /// The global level: set by `PUT /config`, else the configured default.
    pub async fn global_level(&self) -> Result<CompatibilityLevel> {
        match self.store.get(GLOBAL_CONFIG).await? {
            Some((data, _)) if !data.is_empty() => Ok(decode::<ConfigDoc>(GLOBAL_CONFIG, &data)?.compatibility_level),
            _ => Ok(self.default_level),
        }
    }

    /// `PUT /config`.
    pub async fn set_global_level(&self, level: CompatibilityLevel) -> Result<()> {
        self.put(GLOBAL_CONFIG, &encode(&ConfigDoc { compatibility_level: level })).await
    }

    /// `DELETE /config`: forget the stored global level (the configured default applies).
    pub async fn reset_global_level(&self) -> Result<()> {
        match self.store.delete(GLOBAL_CONFIG, None).await {
            Ok(()) | Err(fjord_coord::Error::NoNode { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// The subject's own level, if it has one.
    pub async fn subject_level(&self, subject: &str) -> Result<Option<CompatibilityLevel>> {
        let path = paths::subject(&encode_subject(subject));
        match self.store.get(&path).await? {
            Some((data, _)) if !data.is_empty() => Ok(Some(decode::<ConfigDoc>(&path, &data)?.compatibility_level)),
            _ => Ok(None),
        }
    }

    /// `PUT /config/{s}` (allowed before the subject has versions, as in Confluent).
    pub async fn set_subject_level(&self, subject: &str, level: CompatibilityLevel) -> Result<()> {
        self.put(&paths::subject(&encode_subject(subject)), &encode(&ConfigDoc { compatibility_level: level })).await
    }

    /// `DELETE /config/{s}`: removes the subject's level and returns it.
    pub async fn delete_subject_level(&self, subject: &str) -> Result<CompatibilityLevel> {
        let previous = self.subject_level(subject).await?.ok_or_else(|| Error::SubjectConfigNotFound(subject.into()))?;
        let path = paths::subject(&encode_subject(subject));
        match self.store.set(&path, &[], None).await {
            Ok(_) | Err(fjord_coord::Error::NoNode { .. }) => Ok(previous),
            Err(e) => Err(e.into()),
        }
    }

    /// The level enforced for `subject`: its own, else the global one.
    pub async fn effective_level(&self, subject: &str) -> Result<CompatibilityLevel> {
        match self.subject_level(subject).await? {
            Some(level) => Ok(level),
            None => self.global_level().await,
        }
    }

    /// Writes a node's data, creating it (and its parents) if needed.
    async fn put(&self, path: &str, data: &[u8]) -> Result<()> {
        match create_all(&*self.store, path, data, CreateMode::Persistent).await {
            Ok(_) => Ok(()),
            Err(fjord_coord::Error::NodeExists { .. }) => {
                self.store.set(path, data, None).await?;
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }
}

fn encode<T: Serialize>(doc: &T) -> Vec<u8> {
    serde_json::to_vec(doc).expect("invariant: registry documents always serialize")
}

fn decode<T: for<'de> Deserialize<'de>>(path: &str, data: &[u8]) -> Result<T> {
    serde_json::from_slice(data).map_err(|e| Error::Corrupt { path: path.into(), detail: e.to_string() })
}

/// Subject name → one legal node name (see the module docs).
fn encode_subject(subject: &str) -> String {
    let mut out = String::with_capacity(subject.len());
    let whole_dots = subject == "." || subject == ".." || subject.is_empty();
    for b in subject.bytes() {
        if (b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.') && !(whole_dots && b == b'.') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    if out.is_empty() {
        // The empty subject: `%` alone can never come out of encoding anything else.
        out.push('%');
    }
    out
}

/// Inverse of [`encode_subject`]; never fails, so a foreign node name still lists.
fn decode_subject(name: &str) -> String {
    if name == "%" {
        return String::new();
    }
    let hex = |b: u8| (b as char).to_digit(16);
    let bytes = name.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 3 <= bytes.len() {
            if let (Some(hi), Some(lo)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((hi * 16 + lo) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::OnceLock;

    use fjord_coord::{MetadataStore, Stat, Watch};

    /// A store that, the first time someone creates a node under `trigger`, first lets a
    /// competing registry instance register `schema` under `subject` (through the inner
    /// store): a deterministic interleaving of two instances racing.
    struct RaceOnce {
        inner: Store,
        trigger: &'static str,
        armed: AtomicBool,
        competitor: OnceLock<(SchemaStore, String, ParsedSchema)>,
    }

    #[async_trait::async_trait]
    impl MetadataStore for RaceOnce {
        async fn create(&self, path: &str, data: &[u8], mode: CreateMode) -> fjord_coord::Result<String> {
            if path.starts_with(self.trigger) && self.armed.swap(false, Ordering::SeqCst) {
                let (store, subject, schema) = self.competitor.get().expect("competitor set");
                store.register(subject, schema).await.expect("competitor registers");
            }
            self.inner.create(path, data, mode).await
        }
        async fn get(&self, path: &str) -> fjord_coord::Result<Option<(Vec<u8>, Stat)>> {
            self.inner.get(path).await
        }
        async fn exists(&self, path: &str) -> fjord_coord::Result<Option<Stat>> {
            self.inner.exists(path).await
        }
        async fn set(&self, path: &str, data: &[u8], expected_version: Option<i32>) -> fjord_coord::Result<Stat> {
            self.inner.set(path, data, expected_version).await
        }
        async fn delete(&self, path: &str, expected_version: Option<i32>) -> fjord_coord::Result<()> {
            self.inner.delete(path, expected_version).await
        }
        async fn children(&self, path: &str) -> fjord_coord::Result<Vec<String>> {
            self.inner.children(path).await
        }
        async fn watch_data(&self, path: &str) -> fjord_coord::Result<(Option<(Vec<u8>, Stat)>, Watch)> {
            self.inner.watch_data(path).await
        }
        async fn watch_children(&self, path: &str) -> fjord_coord::Result<(Vec<String>, Watch)> {
            self.inner.watch_children(path).await
        }
        fn session_id(&self) -> i64 {
            self.inner.session_id()
        }
    }

    fn racing(trigger: &'static str, subject: &str, competing: &str) -> (tempfile::TempDir, Store, SchemaStore) {
        let dir = tempfile::tempdir().unwrap();
        let inner: Store = Arc::new(fjord_coord::EmbeddedStore::open(dir.path()).unwrap());
        let racing =
            Arc::new(RaceOnce { inner: inner.clone(), trigger, armed: AtomicBool::new(true), competitor: OnceLock::new() });
        let competitor = SchemaStore::new(inner.clone(), CompatibilityLevel::Backward);
        racing.competitor.set((competitor, subject.to_string(), ParsedSchema::parse(competing).unwrap())).ok().unwrap();
        (dir, inner, SchemaStore::new(racing, CompatibilityLevel::Backward))
    }

    const A: &str = r#"{"type":"record","name":"R","fields":[{"name":"a","type":"int"}]}"#;
    const AB: &str = r#"{"type":"record","name":"R","fields":[{"name":"a","type":"int"},{"name":"b","type":"int","default":0}]}"#;

    #[tokio::test]
    async fn losing_the_race_for_a_schema_id_uses_the_winners_id_and_removes_the_orphan() {
        // While we claim the fingerprint, another instance registers the same schema elsewhere.
        let (_dir, inner, ours) = racing(FINGERPRINTS, "theirs", A);
        let id = ours.register("ours", &ParsedSchema::parse(A).unwrap()).await.unwrap();
        assert_eq!(inner.children(paths::SCHEMA_IDS).await.unwrap(), vec![id.to_string()], "orphan id node left behind");
        let theirs = SchemaStore::new(inner, CompatibilityLevel::Backward);
        assert_eq!(theirs.version("theirs", VersionSpec::Latest, false).await.unwrap().id, id);
        assert_eq!(theirs.version("ours", VersionSpec::Latest, false).await.unwrap().id, id);
    }

    #[tokio::test]
    async fn losing_the_race_for_a_version_number_rechecks_and_takes_the_next() {
        // While we create version 1, another instance registers a different schema as version 1.
        let (_dir, inner, ours) = racing(paths::SCHEMA_SUBJECTS, "s", A);
        let id = ours.register("s", &ParsedSchema::parse(AB).unwrap()).await.unwrap();
        let view = SchemaStore::new(inner, CompatibilityLevel::Backward);
        assert_eq!(view.versions("s", false).await.unwrap(), vec![1, 2]);
        assert_eq!(view.version("s", VersionSpec::Number(2), false).await.unwrap().id, id);
        assert_ne!(view.version("s", VersionSpec::Number(1), false).await.unwrap().id, id);
    }

    #[tokio::test]
    async fn a_race_that_makes_the_schema_incompatible_is_a_409_after_the_recheck() {
        // Ours needs a field `c` without default: fine in an empty subject, but the competitor
        // makes {a} version 1 first, and under BACKWARD ours cannot read that.
        let needs_c = r#"{"type":"record","name":"R","fields":[{"name":"a","type":"int"},{"name":"c","type":"int"}]}"#;
        let (_dir, inner, ours) = racing(paths::SCHEMA_SUBJECTS, "s", A);
        let err = ours.register("s", &ParsedSchema::parse(needs_c).unwrap()).await.unwrap_err();
        assert!(matches!(err, Error::Incompatible { .. }), "{err:?}");
        let view = SchemaStore::new(inner.clone(), CompatibilityLevel::Backward);
        assert_eq!(view.versions("s", false).await.unwrap(), vec![1]);
        // The one trace of the lost race: the id we took stays allocated, in no subject. It
        // cannot be taken back, as another instance may already have found it by fingerprint.
        assert_eq!(inner.children(paths::SCHEMA_IDS).await.unwrap().len(), 2);
    }

    #[test]
    fn subject_names_round_trip_through_node_names() {
        for s in ["orders-value", "com.acme.Order", "a/b", "with space", "ünï", ".", "..", "", "%", "50%off", "x%2Fy"] {
            let enc = encode_subject(s);
            fjord_coord::validate_path(&format!("/{enc}")).unwrap_or_else(|e| panic!("{s:?} → {enc:?}: {e}"));
            assert!(!enc.contains('/'));
            assert_eq!(decode_subject(&enc), s, "{s:?} → {enc:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn any_subject_round_trips_through_a_legal_node_name(subject in ".*") {
            let enc = encode_subject(&subject);
            proptest::prop_assert!(fjord_coord::validate_path(&format!("/{enc}")).is_ok(), "{enc:?}");
            proptest::prop_assert_eq!(decode_subject(&enc), subject);
        }
    }

    #[test]
    fn versions_parse_like_confluent() {
        assert_eq!(VersionSpec::parse("latest").unwrap(), VersionSpec::Latest);
        assert_eq!(VersionSpec::parse("-1").unwrap(), VersionSpec::Latest);
        assert_eq!(VersionSpec::parse("3").unwrap(), VersionSpec::Number(3));
        for bad in ["0", "-2", "x", "", "2147483648", "1.0"] {
            assert!(matches!(VersionSpec::parse(bad), Err(Error::InvalidVersion(_))), "{bad}");
        }
    }
}
