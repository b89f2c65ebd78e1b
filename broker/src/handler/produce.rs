//! Produce: validate and append record batches as the partition's leader, answer with
//! the base offsets; acks=all answers once the ISR has the batches.
//!
//! An acks=all request is appended at once and its answer handed to the connection's
//! writer as a future that waits for the ISR (see [`Produced::Replicating`]): the
//! connection reads and appends the client's next requests meanwhile, in order, so the
//! followers fetch several requests' batches per round instead of one, and the answers
//! still go out in request order, each once the whole ISR has its batches.
//!
//! What a client sends is checked as Kafka checks it before anything is appended: a
//! control batch (attributes bit 0x20) is the broker's to write and is refused with
//! INVALID_RECORD; every record of every batch must walk, compressed ones included
//! (decompressed once, bounded, by the log's leader validation), else CORRUPT_MESSAGE;
//! on a compacted topic the records without a key are named one by one (KIP-467).
//! Decompression and key scans run on a bounded set of blocking threads, never on the
//! network workers, so a client sending compressed bombs delays only itself.
//!
//! Transactional batches, as Kafka takes them: the request must name its transactional
//! id, with Write on it (else TRANSACTIONAL_ID_AUTHORIZATION_FAILED for the whole
//! request), and hold one producer's batches only (else INVALID_PRODUCER_ID_MAPPING). A
//! batch that would open its producer's transaction in a partition is appended only once
//! the transaction coordinator confirmed the partition is in that transaction (KIP-890,
//! `crate::txn::verify`, under the log's verification guard); else INVALID_TXN_STATE, or
//! NOT_ENOUGH_REPLICAS, which every client retries, while the coordinator cannot answer.
//! Without that check any client could write a batch no marker would ever end, and every
//! read_committed consumer of the partition would stop at it for good.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use fjord_log::{AppendInfo, TxnVerification};
use fjord_record::{BatchHeader, Compression};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::produce_response::{BatchIndexAndErrorMessage, PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{ApiKey, ProduceRequest, ProduceResponse, RequestHeader, ResponseKind};
use kafka_protocol::protocol::StrBytes;
use tokio::sync::Semaphore;

use crate::codec::{self, error_code, patch_length};
use crate::connection::Session;
use crate::handler::{log_error_code, Broker};
use crate::metrics::{response_errors, Metrics};
use crate::observer::AppendTally;
use crate::partition::Partition;
use crate::response::Response;
use fjord_auth::{Operation, Resource};

/// First Produce version whose response carries `error_message` and `record_errors` (KIP-467).
const RECORD_ERRORS_VERSION: i16 = 8;

/// An appended acks=all batch waiting for the ISR: where its answer goes, and what it waits for.
struct AwaitingReplication {
    topic: usize,
    partition: usize,
    replica: Arc<Partition>,
    leader_epoch: i32,
    last_offset: i64,
    min_isr: usize,
}

/// Why a partition's records were not appended, as the response says it.
struct Refusal {
    code: i16,
    /// `error_message` (v8+).
    message: Option<String>,
    /// `record_errors` (v8+): the index of each record that made the batch fail, with why.
    record_errors: Vec<(i32, &'static str)>,
}

/// The producer of a request's transactional batches, under the request's transactional id.
struct TxnProducer {
    transactional_id: String,
    producer_id: i64,
    epoch: i16,
}

impl From<i16> for Refusal {
    fn from(code: i16) -> Self {
        Self { code, message: None, record_errors: Vec::new() }
    }
}

/// What a produce request came to once its batches are appended.
pub(crate) enum Produced {
    /// The answer (acks=1, or acks=all with nothing appended).
    Answered(ProduceResponse),
    /// acks=all: the answer once the ISR has every appended batch, or the request's
    /// timeout passed (each partition that did not make it says why).
    Replicating(Pin<Box<dyn Future<Output = ProduceResponse> + Send>>),
}

impl Broker {
    /// Appends every partition's batches; `None` for acks=0, which has no response.
    /// With acks=all, the answer waits for the ISR to have every batch (or the request
    /// to time out), without holding up the next request on the connection.
    pub(crate) async fn produce(&self, request: ProduceRequest, version: i16, session: &Session) -> Option<Produced> {
        let acks = request.acks;
        let valid_acks = matches!(acks, -1..=1);
        let acks_all = acks == -1;
        let txn = match self.transactional_producer(&request, session) {
            Ok(txn) => txn,
            Err(code) => return self.refuse_produce(request, code),
        };
        let verify = txn.as_ref().filter(|_| self.txns.config.partition_verification);
        let mut verified = match verify {
            Some(producer) if valid_acks => self.verify_appends(producer, &request, session).await,
            _ => Verified::new(),
        };
        let mut responses = Vec::with_capacity(request.topic_data.len());
        let mut awaiting = Vec::new();
        for topic_data in request.topic_data {
            let name = topic_data.name.0.to_string();
            // Kafka: Write on the topic, checked before the topic is looked up or created.
            let allowed = self.authorize(session, Operation::Write, Resource::topic(&name));
            // Kafka: the coordinators' logs take no client writes (a state record
            // written by a client would be loaded as the coordinator's own at its next
            // load): INVALID_TOPIC_EXCEPTION after authorization, as Kafka's append
            // answers, and never created by a Produce.
            let internal = crate::topics::is_internal(&name);
            // Kafka never creates a topic on Produce (only Metadata does). We still do, so
            // that an unsecured dev setup takes a first publish, but under the same rule
            // as Metadata: Write alone never creates a topic, Create is needed too; a
            // missing topic is then UNKNOWN_TOPIC_OR_PARTITION, as in Kafka's Produce.
            let topic = if valid_acks && allowed && !internal {
                match self.topic_or_auto_create(session, &name, true).await {
                    Err(crate::topics::TopicError::Unauthorized) => Err(crate::topics::TopicError::Unknown),
                    topic => topic,
                }
            } else {
                Err(crate::topics::TopicError::Unknown)
            };
            let mut partition_responses = Vec::with_capacity(topic_data.partition_data.len());
            for data in topic_data.partition_data {
                let mut response = PartitionProduceResponse::default().with_index(data.index).with_base_offset(-1);
                let partition = match &topic {
                    _ if !valid_acks => Err(error_code::INVALID_REQUIRED_ACKS),
                    _ if !allowed => Err(error_code::TOPIC_AUTHORIZATION_FAILED),
                    _ if internal => Err(error_code::INVALID_TOPIC_EXCEPTION),
                    Err(e) => Err(e.code()),
                    Ok(topic) => self.replica(topic, data.index),
                };
                let outcome = match (partition, data.records) {
                    (Err(code @ error_code::INVALID_TOPIC_EXCEPTION), _) if internal => Err(Refusal {
                        code,
                        message: Some(format!("Cannot append to internal topic {name}")),
                        record_errors: Vec::new(),
                    }),
                    (Err(code), _) => Err(Refusal::from(code)),
                    (Ok(_), None) => Err(Refusal::from(error_code::CORRUPT_MESSAGE)),
                    (Ok(partition), Some(records)) => {
                        let min_isr = partition.log.config().min_insync_replicas as usize;
                        let verification = verified.remove(&(name.clone(), data.index));
                        let appended = self
                            .append_to(&name, data.index, &partition, records, (acks_all, min_isr), verify, verification)
                            .await;
                        appended.map(|appended| {
                            if acks_all {
                                awaiting.push(AwaitingReplication {
                                    topic: responses.len(),
                                    partition: partition_responses.len(),
                                    replica: partition.clone(),
                                    leader_epoch: appended.leader_epoch,
                                    last_offset: appended.info.last_offset,
                                    min_isr,
                                });
                            }
                            (appended.info, appended.log_start)
                        })
                    }
                };
                response = match outcome {
                    Ok((info, log_start)) => {
                        let response = response.with_base_offset(info.base_offset);
                        if version >= 5 {
                            response.with_log_start_offset(log_start)
                        } else {
                            response
                        }
                    }
                    Err(refusal) if version >= RECORD_ERRORS_VERSION => response
                        .with_error_code(refusal.code)
                        .with_error_message(refusal.message.map(StrBytes::from_string))
                        .with_record_errors(
                            refusal
                                .record_errors
                                .into_iter()
                                .map(|(index, why)| {
                                    BatchIndexAndErrorMessage::default()
                                        .with_batch_index(index)
                                        .with_batch_index_error_message(Some(StrBytes::from_static_str(why)))
                                })
                                .collect(),
                        ),
                    Err(refusal) => response.with_error_code(refusal.code),
                };
                partition_responses.push(response);
            }
            responses
                .push(TopicProduceResponse::default().with_name(topic_data.name).with_partition_responses(partition_responses));
        }
        if !awaiting.is_empty() {
            // Every batch is appended before the first wait, so the followers fetch them
            // all in one round; the waits share the request's timeout, which runs from now.
            let timeout = Duration::from_millis(u64::try_from(request.timeout_ms).unwrap_or(0));
            let deadline = tokio::time::Instant::now() + timeout;
            return Some(Produced::Replicating(Box::pin(async move {
                for wait in awaiting {
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    let replicated =
                        wait.replica.wait_for_replication(wait.leader_epoch, wait.last_offset, wait.min_isr, left).await;
                    if let Err(code) = replicated {
                        let response = &mut responses[wait.topic].partition_responses[wait.partition];
                        response.error_code = code;
                        response.base_offset = -1;
                    }
                }
                ProduceResponse::default().with_responses(responses)
            })));
        }
        let response = ProduceResponse::default().with_responses(responses);
        if acks == 0 {
            // No answer goes out, but what was refused is still counted (the handler
            // counts the answers it sends).
            self.metrics.errors(ApiKey::Produce as i16, response_errors(&ResponseKind::Produce(response)));
            return None;
        }
        Some(Produced::Answered(response))
    }
}

impl Broker {
    /// The producer of the request's transactional batches (`None` without any): the
    /// request must name a transactional id this session may Write
    /// (TRANSACTIONAL_ID_AUTHORIZATION_FAILED, as Kafka) and carry one producer's
    /// transactional batches only (INVALID_PRODUCER_ID_MAPPING).
    fn transactional_producer(&self, request: &ProduceRequest, session: &Session) -> Result<Option<TxnProducer>, i16> {
        let mut producers = request
            .topic_data
            .iter()
            .flat_map(|t| t.partition_data.iter())
            .filter_map(|p| transactional_batch(p.records.as_deref()?));
        let Some((producer_id, epoch)) = producers.next() else { return Ok(None) };
        let id = request.transactional_id.as_ref().map(|id| id.to_string());
        let Some(transactional_id) = id.filter(|id| self.authorize(session, Operation::Write, Resource::transactional_id(id)))
        else {
            return Err(error_code::TRANSACTIONAL_ID_AUTHORIZATION_FAILED);
        };
        if producers.any(|other| other != (producer_id, epoch)) {
            return Err(ResponseError::InvalidProducerIdMapping.code());
        }
        Ok(Some(TxnProducer { transactional_id, producer_id, epoch }))
    }

    /// Every partition of the request refused with `code`, nothing appended.
    fn refuse_produce(&self, request: ProduceRequest, code: i16) -> Option<Produced> {
        let responses = request
            .topic_data
            .into_iter()
            .map(|t| {
                let partitions = t
                    .partition_data
                    .iter()
                    .map(|p| PartitionProduceResponse::default().with_index(p.index).with_base_offset(-1).with_error_code(code))
                    .collect();
                TopicProduceResponse::default().with_name(t.name).with_partition_responses(partitions)
            })
            .collect();
        let response = ProduceResponse::default().with_responses(responses);
        if request.acks == 0 {
            self.metrics.errors(ApiKey::Produce as i16, response_errors(&ResponseKind::Produce(response)));
            return None;
        }
        Some(Produced::Answered(response))
    }

    /// One partition's records appended as its leader, or why not, as the response says
    /// it. When they are `verify`'s transactional batches they go as `verified` says (the
    /// request's verification of the partition), or as the coordinator answers now.
    #[allow(clippy::too_many_arguments)]
    async fn append_to(
        &self,
        topic: &str,
        index: i32,
        partition: &Arc<Partition>,
        records: Bytes,
        (acks_all, min_isr): (bool, usize),
        verify: Option<&TxnProducer>,
        verified: Option<Result<TxnVerification, Refusal>>,
    ) -> Result<Appended, Refusal> {
        // The request's verification found the partition's transactional batches; only a
        // partition it could not look at yet needs its records walked here.
        let verification = match (verified, verify) {
            (Some(verified), _) => verified?,
            (None, Some(producer)) if transactional_batch(&records).is_some() => {
                let parts = [(topic.to_owned(), index, partition.clone())];
                let mut answers = self.verify_for(producer, &parts).await;
                answers.pop().unwrap_or_else(|| Err(Refusal::from(error_code::UNKNOWN_SERVER_ERROR)))?
            }
            (None, _) => TxnVerification::Off,
        };
        let tally = self.config.observer.as_ref().and_then(|observer| observer.tally(topic));
        match append(partition, records, acks_all, min_isr, tally, verification).await {
            Ok(mut appended) => {
                if let Some(tally) = appended.tally.take().filter(|_| !appended.info.duplicate) {
                    tally.appended(topic);
                }
                Ok(appended)
            }
            Err(AppendError::Refused(code)) => Err(Refusal::from(code)),
            Err(AppendError::ControlBatch(message)) => {
                tracing::debug!(topic, partition = index, %message, "produce refused");
                Err(Refusal { code: error_code::INVALID_RECORD, message: Some(message), record_errors: Vec::new() })
            }
            Err(AppendError::Log(e)) => Err(log_refusal(topic, index, &e)),
            Err(AppendError::Task(e)) => {
                tracing::error!(topic, partition = index, error = %e, "append task failed");
                Err(Refusal::from(error_code::UNKNOWN_SERVER_ERROR))
            }
        }
    }

    /// How each partition of the request whose records hold `producer`'s transactional
    /// batches is to take them, by (topic, partition), all asked of the coordinator at
    /// once (one look, or one request to it). Topics the request will refuse (no Write,
    /// internal) are not asked about; a partition this does not know yet (its topic made
    /// by this request) is asked on its own when its turn comes.
    async fn verify_appends(&self, producer: &TxnProducer, request: &ProduceRequest, session: &Session) -> Verified {
        let mut parts = Vec::new();
        for t in &request.topic_data {
            let name = t.name.as_str();
            if crate::topics::is_internal(name) || !self.authorize(session, Operation::Write, Resource::topic(name)) {
                continue;
            }
            let Some(topic) = self.topics.get(name) else { continue };
            for p in &t.partition_data {
                if p.records.as_deref().and_then(transactional_batch).is_none() {
                    continue;
                }
                if let Ok(replica) = self.replica(&topic, p.index) {
                    parts.push((t.name.to_string(), p.index, replica));
                }
            }
        }
        let keys: Vec<(String, i32)> = parts.iter().map(|(t, p, _)| (t.clone(), *p)).collect();
        keys.into_iter().zip(self.verify_for(producer, &parts).await).collect()
    }

    /// How each of `parts` (topic, partition, its replica here) is to take `producer`'s
    /// transactional batches: under a guard the transaction coordinator's confirmation
    /// earned, when they would open the producer's transaction there; else the
    /// verification's refusal, as Kafka words it.
    async fn verify_for(
        &self,
        producer: &TxnProducer,
        parts: &[(String, i32, Arc<Partition>)],
    ) -> Vec<Result<TxnVerification, Refusal>> {
        let mut out: Vec<Option<Result<TxnVerification, Refusal>>> = Vec::with_capacity(parts.len());
        let mut asked = Vec::new();
        for (i, (topic, partition, replica)) in parts.iter().enumerate() {
            match replica.log.start_txn_verification(producer.producer_id) {
                // The transaction is open here already: its marker is the coordinator's to write.
                Ok(None) => out.push(Some(Ok(TxnVerification::Required(None)))),
                Ok(Some(guard)) => {
                    out.push(None);
                    asked.push((i, guard));
                }
                Err(e) => out.push(Some(Err(log_refusal(topic, *partition, &e)))),
            }
        }
        if !asked.is_empty() {
            let partitions: Vec<(&str, i32)> = asked.iter().map(|&(i, _)| (parts[i].0.as_str(), parts[i].1)).collect();
            let answers =
                self.verify_txn_partitions(&producer.transactional_id, producer.producer_id, producer.epoch, &partitions).await;
            for ((i, guard), answer) in asked.into_iter().zip(answers) {
                let (topic, partition, replica) = &parts[i];
                out[i] = Some(match answer {
                    Ok(()) => Ok(TxnVerification::Required(Some(guard))),
                    Err(e) => {
                        replica.log.cancel_txn_verification(producer.producer_id, guard);
                        tracing::debug!(topic, partition, transactional_id = %producer.transactional_id, error = ?e, "transaction not verified");
                        Err(verification_refusal(e))
                    }
                });
            }
        }
        // Every slot is filled: by the look at the log, or by its answer.
        out.into_iter().map(|o| o.unwrap_or_else(|| Err(Refusal::from(error_code::UNKNOWN_SERVER_ERROR)))).collect()
    }
}

/// Verifications of a request's partitions, by (topic, partition).
type Verified = std::collections::HashMap<(String, i32), Result<TxnVerification, Refusal>>;

/// A failed verification as the Produce response says it, in Kafka's words.
fn verification_refusal(e: ResponseError) -> Refusal {
    match e {
        ResponseError::InvalidTxnState => Refusal {
            code: e.code(),
            message: Some("Partition was not added to the transaction".to_owned()),
            record_errors: Vec::new(),
        },
        // Kafka: a retriable answer that older clients may not retry becomes one every
        // client retries without refreshing its metadata.
        ResponseError::ConcurrentTransactions
        | ResponseError::NetworkException
        | ResponseError::CoordinatorLoadInProgress
        | ResponseError::CoordinatorNotAvailable
        | ResponseError::NotCoordinator => Refusal {
            code: error_code::NOT_ENOUGH_REPLICAS,
            message: Some(format!("Unable to verify the partition has been added to the transaction. Underlying error: {e:?}")),
            record_errors: Vec::new(),
        },
        // Producers expect a fenced epoch as INVALID_PRODUCER_EPOCH here, as Kafka answers.
        ResponseError::ProducerFenced => Refusal::from(error_code::INVALID_PRODUCER_EPOCH),
        e => Refusal::from(e.code()),
    }
}

/// The producer id and epoch of the first transactional data batch in `records`.
fn transactional_batch(mut records: &[u8]) -> Option<(i64, i16)> {
    while let Ok(header) = BatchHeader::parse_unchecked(records) {
        if header.is_transactional() && !header.is_control() {
            return Some((header.producer_id, header.producer_epoch));
        }
        records = records.get(header.size()..).unwrap_or_default();
    }
    None
}

/// The refusal for a log error, logged at the level it deserves: a storage failure is
/// the broker's (error, with the partition), a bad batch the client's (debug).
fn log_refusal(topic: &str, partition: i32, e: &fjord_log::Error) -> Refusal {
    let code = log_error_code(e);
    if code == error_code::KAFKA_STORAGE_ERROR {
        tracing::error!(topic, partition, error = %e, "produce failed: storage error");
    } else {
        tracing::debug!(topic, partition, error = %e, "produce refused");
    }
    let record_errors = match e {
        fjord_log::Error::MissingKey { record_indexes, .. } => {
            record_indexes.iter().map(|&i| (i, "a compacted topic refuses a record without a key")).collect()
        }
        fjord_log::Error::TimestampOutOfRange { record_indexes, .. } => record_indexes
            .iter()
            .map(|&i| (i, "timestamp outside message.timestamp.before.max.ms / message.timestamp.after.max.ms"))
            .collect(),
        _ => Vec::new(),
    };
    Refusal { code, message: Some(e.to_string()), record_errors }
}

enum AppendError {
    /// This broker cannot take the batch (not the leader, ISR too small).
    Refused(i16),
    /// A client sent a control batch; says which.
    ControlBatch(String),
    Log(fjord_log::Error),
    Task(tokio::task::JoinError),
}

/// What an append did, in which leader epoch, the log start offset after it, and the
/// observer's tally of its records when it watches the topic.
struct Appended {
    info: AppendInfo,
    leader_epoch: i32,
    log_start: i64,
    tally: Option<Box<dyn AppendTally>>,
}

/// Threads that may decompress or scan keys at once, over all produce requests: half
/// the CPUs (at least one), so such work never takes every core from the network
/// workers; a request waits for a permit without holding a thread.
fn heavy_appends() -> Arc<Semaphore> {
    static PERMITS: OnceLock<Arc<Semaphore>> = OnceLock::new();
    PERMITS
        .get_or_init(|| {
            let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
            Arc::new(Semaphore::new(cpus.div_ceil(2)))
        })
        .clone()
}

/// Most bytes of uncompressed records whose keys a compacted log checks on the async
/// worker: a few records take microseconds to scan, less than the two thread switches of
/// the blocking pool, and small appends are what compacted topics mostly take (an
/// idempotency key's claim and answer, a schema, a changelog row).
const INLINE_KEY_SCAN_BYTES: usize = 16 * 1024;

/// Looks at the batch headers only (no CRC, no records; the log checks those): refuses a
/// control batch, and says whether any batch is compressed.
fn scan_headers(mut records: &[u8]) -> Result<bool, String> {
    let (mut compressed, mut position) = (false, 0);
    while let Ok(header) = BatchHeader::parse_unchecked(records) {
        if header.is_control() {
            return Err(format!(
                "the batch at byte {position} is a control batch (attributes {:#06x}): control records are written by the broker, never by a producer",
                header.attributes
            ));
        }
        compressed |= header.compression() != Compression::None;
        position += header.size();
        records = records.get(header.size()..).unwrap_or_default();
    }
    Ok(compressed)
}

/// Appends `records` as the leader; returns what was appended, in which leader epoch,
/// and the log start offset, with `tally` counting the records when given.
///
/// Without a `flush.messages` policy an append of uncompressed batches to a log that
/// does not compact (or of a few records to one that does, see [`INLINE_KEY_SCAN_BYTES`])
/// is a write into the page cache, which does not block for long: it
/// runs right here, because handing it to the blocking pool costs two thread switches
/// per request, which measured as most of the CPU of an unbatched producer. Appends
/// that may fsync go to the blocking pool; appends that decompress or scan keys go
/// there too, behind [`heavy_appends`].
async fn append(
    partition: &Arc<Partition>,
    records: Bytes,
    acks_all: bool,
    min_isr: usize,
    tally: Option<Box<dyn AppendTally>>,
    verification: TxnVerification,
) -> Result<Appended, AppendError> {
    fn run(
        partition: &Partition,
        records: &[u8],
        acks_all: bool,
        min_isr: usize,
        mut tally: Option<Box<dyn AppendTally>>,
        verification: TxnVerification,
    ) -> Result<Appended, AppendError> {
        let mut count = tally.as_mut().map(|t| move |h: &BatchHeader, r: &fjord_record::RecordFrame<'_>| t.record(h, r));
        let visit = count.as_mut().map(|c| c as fjord_log::RecordVisitor<'_>);
        let (info, leader_epoch) = partition
            .append_as_leader(records, acks_all, min_isr, visit, verification)
            .map_err(AppendError::Refused)?
            .map_err(AppendError::Log)?;
        Ok(Appended { info, leader_epoch, log_start: partition.log.log_start_offset(), tally })
    }
    let compressed = scan_headers(&records).map_err(AppendError::ControlBatch)?;
    let config = partition.log.config();
    let heavy = compressed
        || crate::topic_config::append::rewrites(&config)
        || (config.cleanup_policy.compacts() && records.len() > INLINE_KEY_SCAN_BYTES);
    if !heavy && config.flush_messages.is_none() {
        return run(partition, &records, acks_all, min_isr, tally, verification);
    }
    // The semaphore is never closed. The permit goes with the work: a request dropped
    // meanwhile (its client gone) still holds it until the blocking thread is done.
    let permit = if heavy { heavy_appends().acquire_owned().await.ok() } else { None };
    let partition = partition.clone();
    tokio::task::spawn_blocking(move || {
        let appended = run(&partition, &records, acks_all, min_isr, tally, verification);
        drop(permit);
        appended
    })
    .await
    .map_err(AppendError::Task)?
}

/// Produce v0-v2 carry old message sets (magic 0/1), which this broker does not store.
/// They are still advertised (see [`codec::SUPPORTED_APIS`]), so answer them properly:
/// every partition gets UNSUPPORTED_FOR_MESSAGE_FORMAT, nothing is appended.
pub(crate) fn legacy(header: &RequestHeader, version: i16, mut body: Bytes, metrics: &Metrics) -> Option<Response> {
    let correlation_id = header.correlation_id;
    let Some((acks, topics)) = parse_legacy(&mut body) else {
        metrics.errors(ApiKey::Produce as i16, [error_code::INVALID_REQUEST]);
        return Some(codec::error_response(correlation_id, error_code::INVALID_REQUEST));
    };
    let refused = topics.iter().map(|(_, partitions)| partitions.len()).sum::<usize>();
    metrics.errors(ApiKey::Produce as i16, std::iter::repeat_n(error_code::UNSUPPORTED_FOR_MESSAGE_FORMAT, refused));
    if acks == 0 {
        return None;
    }
    let mut buf = BytesMut::with_capacity(64);
    buf.put_i32(0);
    buf.put_i32(correlation_id);
    buf.put_i32(topics.len() as i32);
    for (name, partitions) in &topics {
        buf.put_i16(name.len() as i16);
        buf.put_slice(name);
        buf.put_i32(partitions.len() as i32);
        for &partition in partitions {
            buf.put_i32(partition);
            buf.put_i16(error_code::UNSUPPORTED_FOR_MESSAGE_FORMAT);
            buf.put_i64(-1); // base offset
            if version >= 2 {
                buf.put_i64(-1); // log append time
            }
        }
    }
    if version >= 1 {
        buf.put_i32(0); // throttle time
    }
    patch_length(&mut buf);
    Some(Response::from(buf.freeze()))
}

/// Topic names with their partition numbers, as a legacy produce request lists them.
type LegacyTopics = Vec<(Bytes, Vec<i32>)>;

/// `acks | timeout | [topic name | [partition | message set]]`, bounds-checked.
fn parse_legacy(body: &mut Bytes) -> Option<(i16, LegacyTopics)> {
    fn take_bytes(body: &mut Bytes, len: usize) -> Option<Bytes> {
        (body.remaining() >= len).then(|| body.split_to(len))
    }
    let acks = body.try_get_i16().ok()?;
    let _timeout = body.try_get_i32().ok()?;
    let topic_count = usize::try_from(body.try_get_i32().ok()?).ok()?;
    let mut topics = Vec::new();
    for _ in 0..topic_count {
        let name_len = usize::try_from(body.try_get_i16().ok()?).ok()?;
        let name = take_bytes(body, name_len)?;
        let partition_count = usize::try_from(body.try_get_i32().ok()?).ok()?;
        let mut partitions = Vec::new();
        for _ in 0..partition_count {
            partitions.push(body.try_get_i32().ok()?);
            let set_len = body.try_get_i32().ok()?;
            if set_len > 0 {
                take_bytes(body, set_len as usize)?;
            }
        }
        topics.push((name, partitions));
    }
    Some((acks, topics))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_produce_is_answered_with_unsupported_format() {
        let mut body = BytesMut::new();
        body.put_i16(1);
        body.put_i32(1000);
        body.put_i32(1);
        body.put_i16(1);
        body.put_slice(b"t");
        body.put_i32(1);
        body.put_i32(0);
        body.put_i32(3);
        body.put_slice(b"abc");
        let header = RequestHeader::default().with_correlation_id(9);
        let response = legacy(&header, 2, body.clone().freeze(), &Metrics::default()).unwrap();
        let bytes = codec::response_bytes(&response);
        let mut expected = BytesMut::new();
        for v in [9i32, 1] {
            expected.put_i32(v);
        }
        expected.put_i16(1);
        expected.put_slice(b"t");
        expected.put_i32(1);
        expected.put_i32(0);
        expected.put_i16(error_code::UNSUPPORTED_FOR_MESSAGE_FORMAT);
        expected.put_i64(-1);
        expected.put_i64(-1);
        expected.put_i32(0);
        assert_eq!(&bytes[4..], &expected[..]);
        assert_eq!(i32::from_be_bytes(bytes[..4].try_into().unwrap()) as usize, expected.len());
        // Truncated: INVALID_REQUEST, never a panic.
        let truncated = legacy(&header, 2, body.freeze().slice(..12), &Metrics::default()).unwrap();
        assert_eq!(&codec::response_bytes(&truncated)[8..], &error_code::INVALID_REQUEST.to_be_bytes());
    }
}
