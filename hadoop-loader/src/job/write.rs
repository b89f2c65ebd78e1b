//! Reading the planned partitions and writing their records into files in the run's
//! directory: hourly Avro data files (the record's registered schema, or the envelope
//! schema), rolled past `max_file_bytes`, and a JSON-lines error file per partition for
//! bad records. Each finished file becomes a move of the manifest ([`RunWriter::moves`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use apache_avro::Schema;
use base64::Engine;
use bytes::Bytes;
use fjord_audit::PendingCounts;
use fjord_client::{ClientConfig, Consumer, ConsumerConfig, ConsumerRecord, OffsetReset, SeekTo, TopicPartition};
use fjord_schema_registry::RegistryClient;

use super::{crash, BadRecordPolicy, LoaderConfig, Progress, RunSummary, Step};
use crate::fs::{Destination, FileWriter};
use crate::layout;
use crate::ocf::{self, OcfWriter};
use crate::{Error, Result};

/// Reads every partition of `parts` from its next offset to its end (or until
/// `max_records` in all), handing each record to `writer`, and finishes each partition's
/// files once it reached its end. Counts what was read into `summary` and `progress`, and
/// each record written (not quarantined) into the audit's `pending` counts.
pub(super) async fn read_and_write(
    config: &LoaderConfig,
    client: ClientConfig,
    parts: &mut [PartitionRun],
    writer: &mut RunWriter<'_>,
    mut audit_pending: Option<&mut PendingCounts>,
    progress: &dyn Progress,
    summary: &mut RunSummary,
) -> Result<()> {
    let mut remaining: Vec<usize> = (0..parts.len()).filter(|&i| parts[i].next < parts[i].end).collect();
    progress.start(remaining.len(), remaining.iter().map(|&i| (parts[i].end - parts[i].next) as u64).sum());
    summary.partitions = remaining.len();
    if remaining.is_empty() {
        return Ok(());
    }
    let mut consumer = Consumer::connect(ConsumerConfig {
        client,
        auto_offset_reset: OffsetReset::Earliest,
        fetch_max_wait: Duration::from_millis(100),
        // A bulk reader: large fetches, and room for a producer's whole batch (1 MB in
        // librdkafka) per partition.
        max_partition_fetch_bytes: 8 * 1024 * 1024,
        fetch_max_bytes: 64 * 1024 * 1024,
        ..ConsumerConfig::default()
    })
    .await?;
    assign(&mut consumer, parts, &remaining).await?;
    let index: HashMap<(String, i32), usize> =
        parts.iter().enumerate().map(|(i, p)| ((p.topic.clone(), p.partition), i)).collect();
    let mut taken = 0u64;
    while !remaining.is_empty() {
        // recv, not poll(timeout): a poll timing out in the middle of decoding a fetch
        // response drops it, and with large responses that repeats (fjord-client issue).
        // The idle bound here ends the run, so dropping state on it is harmless.
        let record = match tokio::time::timeout(config.idle_timeout, consumer.recv()).await {
            Ok(record) => record?,
            Err(_) => {
                let p = &parts[remaining[0]];
                return Err(Error::Stalled {
                    topic: p.topic.clone(),
                    partition: p.partition,
                    offset: p.next,
                    end: p.end,
                    idle: config.idle_timeout,
                });
            }
        };
        let Some(&i) = index.get(&(record.topic.to_string(), record.partition)) else { continue };
        let part = &mut parts[i];
        if record.offset < part.next || record.offset >= part.end {
            continue;
        }
        taken += 1;
        let bytes = record.key.as_ref().map_or(0, |k| k.len() as u64) + record.value.as_ref().map_or(0, |v| v.len() as u64);
        let bad_before = part.bad_records;
        writer.take(part, &record).await?;
        if part.bad_records == bad_before {
            if let Some(pending) = audit_pending.as_mut() {
                pending.record_consumed(&record);
            }
        }
        crash(config, Step::Read(taken))?;
        summary.bytes_in += bytes;
        progress.advance(1, bytes);
        let capped = config.max_records.is_some_and(|max| taken >= max);
        if capped {
            // Cap reached: every partition ends where it is now.
            for p in parts.iter_mut() {
                p.end = p.end.min(p.next);
            }
        }
        if parts[i].next < parts[i].end && !capped {
            continue;
        }
        for &j in &remaining {
            if parts[j].next >= parts[j].end {
                writer.finish_partition(&mut parts[j]).await?;
                progress.partition_done();
            }
        }
        // Finished partitions stay assigned (their records are skipped above): a new
        // assignment can take in a response to an old fetch that ran ahead of the
        // position, which would skip records (fjord-client: the seek epoch restarts).
        remaining.retain(|&j| parts[j].next < parts[j].end);
    }
    Ok(())
}

/// Assigns the partitions with records to read, each at its start offset.
async fn assign(consumer: &mut Consumer, parts: &[PartitionRun], which: &[usize]) -> Result<()> {
    consumer.assign(which.iter().map(|&i| TopicPartition::new(parts[i].topic.as_str(), parts[i].partition))).await?;
    for &i in which {
        consumer.seek(&TopicPartition::new(parts[i].topic.as_str(), parts[i].partition), SeekTo::Offset(parts[i].next))?;
    }
    Ok(())
}

/// What a data file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Envelope,
    Registered(i32),
}

struct OpenFile {
    ocf: OcfWriter,
    kind: Kind,
    hour: i64,
    first: i64,
    last: i64,
    tmp: String,
}

struct ErrorFile {
    out: Box<dyn FileWriter>,
    first: i64,
    last: i64,
    tmp: String,
}

/// One partition's progress in a run.
pub(super) struct PartitionRun {
    pub(super) topic: String,
    pub(super) partition: i32,
    /// The next offset to take: where the read started, then past the last record taken.
    pub(super) next: i64,
    /// The offset the read ends before.
    pub(super) end: i64,
    pub(super) records: u64,
    pub(super) bad_records: u64,
    pub(super) max_timestamp: Option<i64>,
    /// `YYYY/MM/DD/HH` → records written into that hour.
    pub(super) counts: BTreeMap<String, u64>,
    file: Option<OpenFile>,
    errors: Option<ErrorFile>,
}

impl PartitionRun {
    pub(super) fn new(topic: &str, partition: i32, next: i64, end: i64) -> Self {
        Self {
            topic: topic.to_string(),
            partition,
            next,
            end,
            records: 0,
            bad_records: 0,
            max_timestamp: None,
            counts: BTreeMap::new(),
            file: None,
            errors: None,
        }
    }
}

/// Turns records into files in the run directory and remembers where they go.
pub(super) struct RunWriter<'a> {
    dest: &'a Destination,
    config: &'a LoaderConfig,
    run_dir: String,
    registry: Option<&'a RegistryClient>,
    /// Schema id → (schema, its JSON for file headers).
    schemas: HashMap<i32, (Arc<Schema>, String)>,
    /// Schema ids the registry has but this loader refuses, with the reason.
    refused: HashMap<i32, String>,
    /// (path in the run dir, final path) of every finished file, both relative to the
    /// destination root: the manifest's moves.
    pub(super) moves: Vec<(String, String)>,
    next_file: u64,
    /// Bytes of the finished files.
    pub(super) bytes_out: u64,
    scratch: Vec<u8>,
}

impl<'a> RunWriter<'a> {
    /// A writer of files under `run_dir`, decoding registered records with `registry`.
    pub(super) fn new(
        dest: &'a Destination,
        config: &'a LoaderConfig,
        run_dir: String,
        registry: Option<&'a RegistryClient>,
    ) -> Self {
        Self {
            dest,
            config,
            run_dir,
            registry,
            schemas: HashMap::new(),
            refused: HashMap::new(),
            moves: Vec::new(),
            next_file: 0,
            bytes_out: 0,
            scratch: Vec::new(),
        }
    }
}

/// Why a record is bad (it goes to the errors directory).
struct Bad(String);

impl RunWriter<'_> {
    fn tmp_name(&mut self, ext: &str) -> String {
        self.next_file += 1;
        format!("{}/files/{:08}.{ext}", self.run_dir, self.next_file)
    }

    /// The kind of file a record goes into and its datum in `self.scratch`.
    async fn encode(&mut self, part: &PartitionRun, r: &ConsumerRecord) -> Result<Result<Kind, Bad>> {
        self.scratch.clear();
        let framed = r
            .value
            .as_deref()
            .filter(|v| v.len() >= fjord_schema_registry::framing::HEADER_LEN && v[0] == fjord_schema_registry::framing::MAGIC);
        let (Some(registry), Some(value)) = (self.registry, framed) else {
            ocf::encode_envelope(
                &mut self.scratch,
                part.partition,
                r.offset,
                r.timestamp,
                r.key.as_deref(),
                r.value.as_deref(),
                &r.headers,
            );
            return Ok(Ok(Kind::Envelope));
        };
        let (id, datum) = fjord_schema_registry::framing::unframe(value).map_err(|e| Error::Registry(Box::new(e)))?;
        if let Some(reason) = self.refused.get(&id) {
            return Ok(Err(Bad(reason.clone())));
        }
        if let std::collections::hash_map::Entry::Vacant(slot) = self.schemas.entry(id) {
            use fjord_schema_registry::Error as E;
            let schema = match registry.schema(id).await {
                Ok(s) => s,
                Err(E::UnknownId(_)) => return Ok(Err(Bad(format!("schema id {id} is not registered")))),
                // A schema the registry holds but this loader will not decode with (one
                // beyond the limits, registered before they were enforced): every record
                // naming it is bad, and the run goes on. Remembered, so it is fetched once.
                Err(e @ (E::SchemaLimit { .. } | E::InvalidSchema(_) | E::UnsupportedSchema(_))) => {
                    let reason = format!("schema id {id} is refused: {e}");
                    self.refused.insert(id, reason.clone());
                    return Ok(Err(Bad(reason)));
                }
                Err(e) => return Err(Error::Registry(Box::new(e))),
            };
            let json =
                serde_json::to_string(&*schema).map_err(|source| Error::CorruptState { path: format!("schema {id}"), source })?;
            slot.insert((schema, json));
        }
        let schema = &self.schemas[&id].0;
        // Bounded: every length, size and count is checked against the bytes left before
        // anything is allocated (a `fixed` of 2^62 once aborted every run here).
        match fjord_schema_registry::datum::decode(schema, None, datum, id, registry.datum_limits()) {
            Ok(_) => {}
            Err(fjord_schema_registry::Error::TrailingBytes { len, .. }) => {
                return Ok(Err(Bad(format!("{len} bytes left after the datum of schema {id}"))))
            }
            Err(e) => return Ok(Err(Bad(format!("does not decode with schema {id}: {e}")))),
        }
        self.scratch.extend_from_slice(datum);
        Ok(Ok(Kind::Registered(id)))
    }

    async fn take(&mut self, part: &mut PartitionRun, r: &ConsumerRecord) -> Result<()> {
        part.next = r.offset + 1;
        match self.encode(part, r).await? {
            Ok(kind) => {
                let hour = layout::hour_of(r.timestamp);
                let roll = part.file.as_ref().is_some_and(|f| {
                    f.kind != kind || f.hour != hour || f.ocf.written + f.ocf.pending() >= self.config.max_file_bytes
                });
                if roll {
                    self.close_file(part).await?;
                }
                if part.file.is_none() {
                    part.file = Some(self.open_file(part, kind, hour, r.offset).await?);
                }
                let file = part.file.as_mut().expect("invariant: opened above");
                file.ocf.append(&self.scratch).await?;
                file.last = r.offset;
                part.records += 1;
                *part.counts.entry(layout::hour_path(r.timestamp)).or_default() += 1;
                part.max_timestamp = Some(part.max_timestamp.map_or(r.timestamp, |m| m.max(r.timestamp)));
            }
            Err(Bad(reason)) => {
                if self.config.on_bad_record == BadRecordPolicy::Fail {
                    return Err(Error::BadRecord {
                        topic: part.topic.clone(),
                        partition: part.partition,
                        offset: r.offset,
                        reason,
                    });
                }
                self.quarantine(part, r, reason).await?;
            }
        }
        Ok(())
    }

    async fn open_file(&mut self, part: &PartitionRun, kind: Kind, hour: i64, first: i64) -> Result<OpenFile> {
        let tmp = self.tmp_name("avro");
        let schema_json = match kind {
            Kind::Envelope => ocf::ENVELOPE_SCHEMA,
            Kind::Registered(id) => self.schemas[&id].1.as_str(),
        };
        let mut meta = vec![("fjord.topic", part.topic.clone()), ("fjord.partition", part.partition.to_string())];
        if let Kind::Registered(id) = kind {
            meta.push(("fjord.schema.id", id.to_string()));
        }
        let out = self.dest.fs.create(&self.dest.path(&tmp)).await?;
        let ocf = OcfWriter::start(out, &tmp, schema_json, self.config.codec, &meta).await?;
        Ok(OpenFile { ocf, kind, hour, first, last: first, tmp })
    }

    async fn close_file(&mut self, part: &mut PartitionRun) -> Result<()> {
        if let Some(f) = part.file.take() {
            self.bytes_out += f.ocf.finish().await?;
            let dir = layout::hour_dir(&part.topic, &layout::hour_path(f.hour));
            self.moves.push((f.tmp, format!("{dir}/{}", layout::data_file_name(&part.topic, part.partition, f.first, f.last))));
        }
        Ok(())
    }

    async fn quarantine(&mut self, part: &mut PartitionRun, r: &ConsumerRecord, reason: String) -> Result<()> {
        if part.errors.is_none() {
            let tmp = self.tmp_name("jsonl");
            let out = self.dest.fs.create(&self.dest.path(&tmp)).await?;
            part.errors = Some(ErrorFile { out, first: r.offset, last: r.offset, tmp });
        }
        let b64 = |b: &Option<Bytes>| b.as_ref().map(|b| base64::engine::general_purpose::STANDARD.encode(b));
        let line = serde_json::json!({
            "topic": part.topic, "partition": part.partition, "offset": r.offset, "timestamp": r.timestamp,
            "reason": reason, "key": b64(&r.key), "value": b64(&r.value),
        });
        let mut bytes = serde_json::to_vec(&line).expect("invariant: JSON values serialize");
        bytes.push(b'\n');
        self.bytes_out += bytes.len() as u64;
        let errors = part.errors.as_mut().expect("invariant: opened above");
        errors.last = r.offset;
        errors.out.write(Bytes::from(bytes)).await?;
        part.bad_records += 1;
        Ok(())
    }

    async fn finish_partition(&mut self, part: &mut PartitionRun) -> Result<()> {
        self.close_file(part).await?;
        if let Some(e) = part.errors.take() {
            e.out.close().await?;
            self.moves.push((e.tmp, layout::error_file(&self.config.job, &part.topic, part.partition, e.first, e.last)));
        }
        Ok(())
    }
}
