//! The transaction coordinator (Kafka's design, docs/architecture.md): transactional ids,
//! their producer ids and epochs, and the two-phase end of every transaction.
//!
//! # Layout
//! - [`state`]: one transactional id's state machine, pure and unit-tested.
//! - this file: the coordinator's storage and its background work:
//!   - `__transaction_state`, an internal compacted topic (`transaction.state.log.*`,
//!     50 partitions, replication factor min(3, brokers) by default), created on the
//!     first transaction coordinator lookup. A transactional id belongs to partition
//!     `abs(javaHashCode(id)) % partitions`, and its coordinator is that partition's
//!     leader. Each state change is one record (key: the id, value: the state as JSON;
//!     a null value forgets the id) appended with acks=all before it takes effect.
//!   - loading: the first request for a partition this broker leads (or the ticker, after
//!     a leader change or a restart) reads the partition into memory and resumes every
//!     transaction it finds prepared, so what one coordinator prepared another completes.
//!   - completion: a prepared transaction's markers go to each of its partitions' leaders
//!     as WriteTxnMarkers over the inter-broker listener, with its security, as the
//!     replica fetchers connect; for the partitions this broker leads, the same handler is
//!     called directly (acks=all included) instead of over a connection to itself. Its
//!     consumer groups get theirs as a marker on `__consumer_offsets` sent to each group's
//!     coordinator. Only then is the transaction written complete. EndTxn answers once
//!     that is done (or after [`COMPLETION_WAIT`]), not as soon as the transaction is
//!     prepared as Kafka does: a producer that begins its next transaction at once would
//!     otherwise be refused (CONCURRENT_TRANSACTIONS) until the markers land, and
//!     librdkafka then waits its `retry.backoff.ms` (100 ms) before asking again.
//!   - the ticker: aborts transactions past their timeout (fencing their producer) and
//!     forgets ids idle for `transactional.id.expiration.ms`.
//! - `crate::handler::txn`: the APIs (InitProducerId with a transactional id,
//!   AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, DescribeTransactions, ListTransactions).

pub(crate) mod state;
pub(crate) mod verify;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex as SyncMutex};
use std::time::Duration;

use fjord_coord::paths;
use fjord_coord::registry::{read_json, BrokerRegistration};
use fjord_record::{now_ms, BatchBuilder, TopicPartition};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::write_txn_markers_request::{WritableTxnMarker, WritableTxnMarkerTopic};
use kafka_protocol::messages::{ProducerId, TopicName, WriteTxnMarkersRequest, WriteTxnMarkersResponse};
use kafka_protocol::protocol::StrBytes;
use tokio::sync::{mpsc, Mutex, Notify};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::codec::error_code;
use crate::handler::Broker;
use crate::partition::Role;
use crate::periodic::Periodic;
use crate::replication::{Peer, PeerConfig};
use state::TxnMetadata;

/// The internal topic holding every transactional id's state.
pub(crate) const TOPIC: &str = "__transaction_state";
/// The topic consumer groups' transactional offsets are named under in markers: a marker
/// for it goes to the group's coordinator, which applies or drops the producer's pending
/// offsets (Kafka writes the marker into the group's `__consumer_offsets` partition; here
/// committed offsets live in the metadata store, so the name only routes the marker).
pub(crate) const GROUP_MARKER_TOPIC: &str = "__consumer_offsets";
/// FindCoordinator's key type of a transactional id.
pub(crate) const KEY_TYPE_TRANSACTION: i8 = 1;
/// WriteTxnMarkers version the coordinator sends (the first flexible one).
pub(crate) const MARKER_VERSION: i16 = 1;
/// The most bytes of ids in one append of tombstones when the coordinator forgets ids
/// for its limit (an id may be up to 32 KiB; the append stays well under a batch's limit).
const TOMBSTONES_BYTES: usize = 256 * 1024;
/// How long a coordinator waits for a state record to reach the in-sync replicas.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause between rounds of markers that did not all land (no leader, a broker down).
const MARKER_BACKOFF: Duration = Duration::from_millis(100);
/// How often the ticker looks for partitions to load and transactions to time out.
const TICK: Duration = Duration::from_millis(200);
/// How long EndTxn waits for the transaction it prepared to complete before answering
/// anyway (the prepared state is written: the outcome is decided). Markers take
/// milliseconds; longer means a partition without a leader, whose markers wait for one.
pub(crate) const COMPLETION_WAIT: Duration = Duration::from_secs(1);

/// Transaction coordinator settings, under Kafka's names and with its defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnConfig {
    /// `transaction.max.timeout.ms`: the longest transaction timeout a producer may ask for.
    pub max_timeout_ms: i32,
    /// `transactional.id.expiration.ms`: an id with no transaction for this long is forgotten.
    pub id_expiration_ms: i64,
    /// `transaction.state.log.num.partitions`.
    pub log_num_partitions: i32,
    /// `transaction.state.log.replication.factor` (capped at the live brokers when the
    /// topic is created).
    pub log_replication_factor: i16,
    /// `transaction.state.log.min.isr`.
    pub log_min_isr: i32,
    /// `transaction.state.log.segment.bytes`.
    pub log_segment_bytes: i64,
    /// `transaction.abort.timed.out.transaction.cleanup.interval.ms`.
    pub abort_timed_out_interval_ms: u64,
    /// `transaction.remove.expired.transaction.cleanup.interval.ms`.
    pub remove_expired_interval_ms: u64,
    /// `transaction.partition.verification.enable` (KIP-890): a partition leader takes a
    /// transactional batch that opens its producer's transaction there only once the
    /// coordinator confirmed the partition is in the transaction; without it a stray
    /// batch holds the partition's last stable offset back for good.
    pub partition_verification: bool,
    /// `transactional.id.max.per.partition` (Fjord's): how many transactional ids one
    /// partition of `__transaction_state` keeps. Past it a new id makes the coordinator
    /// forget the longest idle ids, down to nine tenths (see
    /// `Broker::make_room_for_txn_id`), so a client making up ids (or one taking a
    /// fresh id per run) cannot grow the coordinator's memory for the week of
    /// `transactional.id.expiration.ms`.
    pub max_ids_per_partition: usize,
}

impl Default for TxnConfig {
    fn default() -> Self {
        Self {
            max_timeout_ms: 900_000,
            id_expiration_ms: 7 * 24 * 3_600_000,
            log_num_partitions: 50,
            log_replication_factor: 3,
            log_min_isr: 2,
            log_segment_bytes: 100 * 1024 * 1024,
            abort_timed_out_interval_ms: 10_000,
            remove_expired_interval_ms: 3_600_000,
            partition_verification: true,
            max_ids_per_partition: 10_000,
        }
    }
}

impl TxnConfig {
    /// The broker config keys [`TxnConfig::set`] takes.
    pub(crate) const KEYS: &'static [&'static str] = &[
        "transaction.max.timeout.ms",
        "transactional.id.expiration.ms",
        "transaction.state.log.num.partitions",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
        "transaction.state.log.segment.bytes",
        "transaction.abort.timed.out.transaction.cleanup.interval.ms",
        "transaction.remove.expired.transaction.cleanup.interval.ms",
        "transaction.partition.verification.enable",
        "transactional.id.max.per.partition",
    ];

    /// Sets one of [`TxnConfig::KEYS`].
    pub(crate) fn set(&mut self, key: &str, value: &str) -> Result<(), &'static str> {
        let number = || value.trim().parse::<i64>().map_err(|_| "not a number");
        let positive = || number().and_then(|n| if n >= 1 { Ok(n) } else { Err("must be at least 1") });
        match key {
            "transaction.max.timeout.ms" => {
                self.max_timeout_ms = i32::try_from(positive()?).map_err(|_| "larger than 2147483647")?
            }
            "transactional.id.expiration.ms" => self.id_expiration_ms = positive()?,
            "transaction.state.log.num.partitions" => {
                self.log_num_partitions = i32::try_from(positive()?).map_err(|_| "larger than 2147483647")?
            }
            "transaction.state.log.replication.factor" => {
                self.log_replication_factor = i16::try_from(positive()?).map_err(|_| "larger than 32767")?
            }
            "transaction.state.log.min.isr" => {
                self.log_min_isr = i32::try_from(positive()?).map_err(|_| "larger than 2147483647")?
            }
            "transaction.state.log.segment.bytes" => self.log_segment_bytes = positive()?,
            "transaction.abort.timed.out.transaction.cleanup.interval.ms" => {
                self.abort_timed_out_interval_ms = positive()? as u64
            }
            "transaction.remove.expired.transaction.cleanup.interval.ms" => self.remove_expired_interval_ms = positive()? as u64,
            "transaction.partition.verification.enable" => {
                self.partition_verification = match value.trim() {
                    "true" => true,
                    "false" => false,
                    _ => return Err("not true or false"),
                }
            }
            "transactional.id.max.per.partition" => {
                self.max_ids_per_partition = usize::try_from(positive()?).map_err(|_| "too large")?
            }
            _ => return Err("not a transaction coordinator key"),
        }
        Ok(())
    }
}

/// Kafka's `Utils.abs(id.hashCode()) % partitions`: Java's String hash over UTF-16 code
/// units, so every Kafka client and tool agrees on an id's partition.
///
/// Example: `"hello"` hashes to 99162322 in Java, so with 50 partitions it is in partition 22.
pub(crate) fn partition_for(transactional_id: &str, partitions: i32) -> i32 {
    let hash = transactional_id.encode_utf16().fold(0i32, |h, unit| h.wrapping_mul(31).wrapping_add(i32::from(unit)));
    // Java's Utils.abs maps MIN_VALUE to 0 rather than overflowing.
    let abs = if hash == i32::MIN { 0 } else { hash.abs() };
    abs % partitions.max(1)
}

/// Connections to other brokers by id, each used by one request at a time (see
/// [`Broker::call_peer`]).
pub(crate) type Peers = SyncMutex<HashMap<i32, Arc<Mutex<Option<Peer>>>>>;

/// One transactional id's slot: `None` once forgotten (or before its first InitProducerId).
pub(crate) type Slot = Arc<Mutex<Option<TxnMetadata>>>;

/// A partition of `__transaction_state` loaded while this broker leads it in `leader_epoch`.
pub(crate) struct Loaded {
    pub(crate) partition: i32,
    pub(crate) leader_epoch: i32,
    ids: SyncMutex<HashMap<String, Slot>>,
    /// Ids forgotten for the limit since the last warning about it, and when that was:
    /// a flood of new ids would repeat the warning at every round.
    forgotten_unlogged: SyncMutex<(usize, i64)>,
}

impl Loaded {
    fn new(partition: i32, leader_epoch: i32, ids: HashMap<String, Slot>) -> Self {
        Self { partition, leader_epoch, ids: SyncMutex::new(ids), forgotten_unlogged: SyncMutex::new((0, 0)) }
    }

    /// How many ids have a slot: those with a state, and a few a request just made.
    fn len(&self) -> usize {
        self.ids.lock().expect("invariant: ids lock is never poisoned").len()
    }

    /// The id's slot, created empty when the id is new.
    pub(crate) fn slot(&self, transactional_id: &str) -> Slot {
        let mut ids = self.ids.lock().expect("invariant: ids lock is never poisoned");
        ids.entry(transactional_id.to_owned()).or_default().clone()
    }

    /// Every id with a slot, with it.
    pub(crate) fn slots(&self) -> Vec<(String, Slot)> {
        let ids = self.ids.lock().expect("invariant: ids lock is never poisoned");
        ids.iter().map(|(id, slot)| (id.clone(), slot.clone())).collect()
    }

    /// The id's slot when it has one: a question about an id (a verification) does not
    /// make one, so asking about made-up ids costs no memory.
    pub(crate) fn existing(&self, transactional_id: &str) -> Option<Slot> {
        self.ids.lock().expect("invariant: ids lock is never poisoned").get(transactional_id).cloned()
    }

    /// Drops the slots of ids that never got a producer (a request named an id that had
    /// none, then failed) and that no request holds: they would pile up otherwise.
    fn drop_unused(&self) {
        let mut ids = self.ids.lock().expect("invariant: ids lock is never poisoned");
        // Under the map's lock nobody can take a slot out of it: a slot only the map
        // holds, and empty, is unused.
        ids.retain(|_, slot| Arc::strong_count(slot) > 1 || slot.try_lock().map_or(true, |m| m.is_some()));
    }

    fn forget(&self, transactional_id: &str) {
        self.ids.lock().expect("invariant: ids lock is never poisoned").remove(transactional_id);
    }
}

/// A completion task's claim on a transactional id (see [`TxnCoordinator::complete_later`]).
struct Claim {
    requests: u64,
    looked: Arc<Notify>,
}

/// The coordinator's own state; the rest (topics, replicas, producer ids) is the broker's.
pub(crate) struct TxnCoordinator {
    pub(crate) config: TxnConfig,
    peer: PeerConfig,
    broker_id: i32,
    /// Loaded partitions of `__transaction_state` by index.
    loaded: SyncMutex<HashMap<i32, Arc<Loaded>>>,
    /// Serialises loading, so a partition is read once per leader epoch.
    loading: Mutex<()>,
    /// One connection per broker markers go to, each used by one sender at a time.
    peers: Peers,
    /// One connection per coordinator this broker asks to verify a transaction
    /// (`txn::verify`), apart from the markers': a marker's answer waits for its ISR (up
    /// to seconds), and produce requests must not wait behind it.
    verify_peers: Peers,
    /// Ids whose completion (markers, then the complete state) is under way, each with
    /// the requests for it so far (a request while one is under way is not a second
    /// task, but makes the one under way look at the id again when it is done) and a
    /// signal of each of its looks ending.
    completing: SyncMutex<HashMap<String, Claim>>,
    /// Prepared transactions to complete, read by the task [`spawn`] starts.
    wake: mpsc::UnboundedSender<(i32, String)>,
    woken: SyncMutex<Option<mpsc::UnboundedReceiver<(i32, String)>>>,
}

impl TxnCoordinator {
    pub(crate) fn new(config: TxnConfig, peer: PeerConfig, broker_id: i32) -> Self {
        let (wake, woken) = mpsc::unbounded_channel();
        Self {
            config,
            peer,
            broker_id,
            loaded: SyncMutex::new(HashMap::new()),
            loading: Mutex::new(()),
            peers: SyncMutex::new(HashMap::new()),
            verify_peers: SyncMutex::new(HashMap::new()),
            completing: SyncMutex::new(HashMap::new()),
            wake,
            woken: SyncMutex::new(Some(woken)),
        }
    }

    /// Asks the completion task to finish the id's prepared transaction: a new task, or,
    /// while one is under way for the id, one more look by it when it is done. Returns
    /// the signal of the task's looks ending.
    pub(crate) fn complete_later(&self, partition: i32, transactional_id: &str) -> Arc<Notify> {
        let mut completing = self.completing.lock().expect("invariant: completing lock is never poisoned");
        if let Some(claim) = completing.get_mut(transactional_id) {
            claim.requests += 1;
            return claim.looked.clone();
        }
        let claim = Claim { requests: 1, looked: Arc::default() };
        let looked = claim.looked.clone();
        if self.wake.send((partition, transactional_id.to_owned())).is_ok() {
            completing.insert(transactional_id.to_owned(), claim);
        }
        // Otherwise the broker is stopping; the next coordinator completes it.
        looked
    }

    /// The completion requests for the id so far (0 when none is under way).
    fn completion_requests(&self, transactional_id: &str) -> u64 {
        let completing = self.completing.lock().expect("invariant: completing lock is never poisoned");
        completing.get(transactional_id).map_or(0, |c| c.requests)
    }

    /// Ends a completion task's look at the id, which it began after `seen` requests:
    /// signals those waiting for it, and ends the task's claim on the id, unless more
    /// requests came meanwhile (`Some(requests)`: the task must look again). A task that
    /// stopped claiming at its own last look could miss the next transaction: its
    /// producer can begin, write and prepare it between that look and the release, and
    /// its request, seeing the claim, would start nothing.
    fn done_completing(&self, transactional_id: &str, seen: u64) -> Option<u64> {
        let mut completing = self.completing.lock().expect("invariant: completing lock is never poisoned");
        let claim = completing.get(transactional_id)?;
        claim.looked.notify_waiters();
        if claim.requests != seen {
            return Some(claim.requests);
        }
        completing.remove(transactional_id);
        None
    }

    /// Every loaded partition.
    pub(crate) fn loaded(&self) -> Vec<Arc<Loaded>> {
        self.loaded.lock().expect("invariant: loaded lock is never poisoned").values().cloned().collect()
    }
}

impl Broker {
    /// The number of partitions of `__transaction_state`: the topic's, else the configured count.
    pub(crate) fn txn_partitions(&self) -> i32 {
        self.topics.get(TOPIC).map_or(self.txns.config.log_num_partitions, |t| t.partition_count())
    }

    /// Creates `__transaction_state` if it does not exist yet (the first transaction
    /// coordinator lookup does, as in Kafka). `Err` is the FindCoordinator answer.
    pub(crate) async fn ensure_txn_topic(&self) -> Result<(), ResponseError> {
        if self.topics.get(TOPIC).is_some() {
            return Ok(());
        }
        let c = &self.txns.config;
        let live = self.topics.view().brokers().len().max(1);
        let replication_factor = c.log_replication_factor.min(i16::try_from(live).unwrap_or(i16::MAX));
        let overrides = BTreeMap::from([
            ("cleanup.policy".to_owned(), "compact".to_owned()),
            ("compression.type".to_owned(), "uncompressed".to_owned()),
            ("segment.bytes".to_owned(), c.log_segment_bytes.to_string()),
            ("min.insync.replicas".to_owned(), c.log_min_isr.min(i32::from(replication_factor)).to_string()),
        ]);
        let layout = crate::topics::Layout::Spread { partitions: c.log_num_partitions, replication_factor };
        match self.topics.create(TOPIC, layout, overrides).await {
            Ok(_) => {
                tracing::info!(partitions = c.log_num_partitions, replication_factor, "created {TOPIC}");
                Ok(())
            }
            Err(crate::topics::TopicError::AlreadyExists) => Ok(()),
            Err(e) => {
                tracing::warn!(error = %e, "could not create {TOPIC}");
                Err(ResponseError::CoordinatorNotAvailable)
            }
        }
    }

    /// The coordinator of `transactional_id`: the leader of its partition, with its
    /// address on `listener`.
    pub(crate) fn locate_txn_coordinator(
        &self,
        transactional_id: &str,
        listener: &str,
    ) -> Result<(i32, String, u16), ResponseError> {
        let tp = TopicPartition::new(TOPIC, partition_for(transactional_id, self.txn_partitions()));
        let leader = self.topics.view().partition_state(&tp).map_or(-1, |s| s.state.leader);
        if leader < 0 {
            return Err(ResponseError::CoordinatorNotAvailable);
        }
        if leader == self.config.broker_id {
            let own = self.listeners.iter().find(|l| l.name == listener);
            return own.map(|l| (leader, l.host.clone(), l.port)).ok_or(ResponseError::CoordinatorNotAvailable);
        }
        let brokers = self.topics.view().brokers();
        let registration = brokers.iter().find(|(id, _)| *id == leader).map(|(_, r)| r);
        match registration.and_then(|r| r.endpoint(listener)) {
            Some((host, port)) => Ok((leader, host.to_owned(), port)),
            None => Err(ResponseError::CoordinatorNotAvailable),
        }
    }

    /// The loaded partition holding `transactional_id` and the id's slot: NOT_COORDINATOR
    /// when this broker does not lead the partition, COORDINATOR_LOAD_IN_PROGRESS when it
    /// could not be read yet.
    pub(crate) async fn txn_slot(&self, transactional_id: &str) -> Result<(Arc<Loaded>, Slot), ResponseError> {
        let loaded = self.txn_loaded_for(transactional_id).await?;
        let slot = loaded.slot(transactional_id);
        Ok((loaded, slot))
    }

    /// The loaded partition holding `transactional_id`, with [`Broker::txn_slot`]'s errors.
    pub(crate) async fn txn_loaded_for(&self, transactional_id: &str) -> Result<Arc<Loaded>, ResponseError> {
        if self.topics.get(TOPIC).is_none() {
            return Err(ResponseError::NotCoordinator);
        }
        self.txn_loaded(partition_for(transactional_id, self.txn_partitions())).await
    }

    /// The partition as loaded in the current leader epoch, reading it if need be.
    pub(crate) async fn txn_loaded(&self, partition: i32) -> Result<Arc<Loaded>, ResponseError> {
        let epoch = self.txn_leader_epoch(partition).ok_or(ResponseError::NotCoordinator)?;
        let current = |txns: &TxnCoordinator| {
            let loaded = txns.loaded.lock().expect("invariant: loaded lock is never poisoned");
            loaded.get(&partition).filter(|l| l.leader_epoch == epoch).cloned()
        };
        if let Some(loaded) = current(&self.txns) {
            return Ok(loaded);
        }
        let _loading = self.txns.loading.lock().await;
        if let Some(loaded) = current(&self.txns) {
            return Ok(loaded);
        }
        let replica = self.replicas.get(&TopicPartition::new(TOPIC, partition)).ok_or(ResponseError::NotCoordinator)?;
        let log = replica.log.clone();
        let read = tokio::task::spawn_blocking(move || read_states(&log)).await;
        let states = match read {
            Ok(Ok(states)) => states,
            Ok(Err(e)) => {
                tracing::error!(partition, error = %e, "could not load {TOPIC}");
                return Err(ResponseError::CoordinatorLoadInProgress);
            }
            Err(e) => {
                tracing::error!(partition, error = %e, "loading {TOPIC} failed");
                return Err(ResponseError::CoordinatorLoadInProgress);
            }
        };
        // Leadership may have moved while reading.
        if self.txn_leader_epoch(partition) != Some(epoch) {
            return Err(ResponseError::NotCoordinator);
        }
        let prepared: Vec<String> =
            states.values().filter(|m| m.state.is_prepared()).map(|m| m.transactional_id.clone()).collect();
        let ids = states.into_iter().map(|(id, m)| (id, Arc::new(Mutex::new(Some(m))))).collect();
        let loaded = Arc::new(Loaded::new(partition, epoch, ids));
        self.txns.loaded.lock().expect("invariant: loaded lock is never poisoned").insert(partition, loaded.clone());
        tracing::info!(partition, leader_epoch = epoch, prepared = prepared.len(), "loaded {TOPIC} partition");
        for id in prepared {
            self.txns.complete_later(partition, &id);
        }
        Ok(loaded)
    }

    /// This broker's leader epoch of the partition, `None` unless it leads it.
    fn txn_leader_epoch(&self, partition: i32) -> Option<i32> {
        let replica = self.replicas.get(&TopicPartition::new(TOPIC, partition))?;
        let state = replica.state();
        (state.role == Role::Leader).then_some(state.leader_epoch)
    }

    /// Appends the id's new state (`None` forgets it) to its partition with acks=all, in
    /// the leader epoch it was loaded in. The caller makes the state current only on `Ok`.
    pub(crate) async fn write_txn_state(
        &self,
        loaded: &Loaded,
        transactional_id: &str,
        metadata: Option<&TxnMetadata>,
    ) -> Result<(), ResponseError> {
        let value = match metadata.map(serde_json::to_vec) {
            None => None,
            Some(Ok(value)) => Some(value),
            Some(Err(e)) => {
                tracing::error!(transactional_id, error = %e, "cannot encode a transaction state");
                return Err(ResponseError::UnknownServerError);
            }
        };
        let mut builder = BatchBuilder::new(now_ms());
        builder.append(now_ms(), Some(transactional_id.as_bytes()), value.as_deref(), &[]);
        self.write_txn_batch(loaded, transactional_id, &builder.build_vec()).await
    }

    /// Forgets `ids` in one append (a tombstone each), as [`Broker::write_txn_state`]
    /// with `None` does for one.
    async fn write_txn_tombstones(&self, loaded: &Loaded, ids: &[&str]) -> Result<(), ResponseError> {
        let now = now_ms();
        let mut builder = BatchBuilder::new(now);
        for id in ids {
            builder.append(now, Some(id.as_bytes()), None, &[]);
        }
        self.write_txn_batch(loaded, ids.first().copied().unwrap_or_default(), &builder.build_vec()).await
    }

    /// Appends `batch` of state records to `loaded`'s partition and waits for its ISR
    /// (`transactional_id` names the first record's id in the logs).
    async fn write_txn_batch(&self, loaded: &Loaded, transactional_id: &str, batch: &[u8]) -> Result<(), ResponseError> {
        let replica = self.replicas.get(&TopicPartition::new(TOPIC, loaded.partition)).ok_or(ResponseError::NotCoordinator)?;
        let min_isr = replica.log.config().min_insync_replicas as usize;
        let appended = {
            if replica.state().leader_epoch != loaded.leader_epoch {
                return Err(ResponseError::NotCoordinator);
            }
            replica.append_as_leader(batch, true, min_isr, None, fjord_log::TxnVerification::Off)
        };
        let (info, epoch) = match appended {
            Ok(Ok(appended)) => appended,
            Err(code) if code == error_code::NOT_LEADER_OR_FOLLOWER => return Err(ResponseError::NotCoordinator),
            Err(code) => {
                tracing::warn!(transactional_id, code, "transaction state not written");
                return Err(ResponseError::CoordinatorNotAvailable);
            }
            Ok(Err(e)) => {
                tracing::error!(transactional_id, error = %e, "transaction state not written");
                return Err(ResponseError::CoordinatorNotAvailable);
            }
        };
        if epoch != loaded.leader_epoch {
            return Err(ResponseError::NotCoordinator);
        }
        match replica.wait_for_replication(epoch, info.last_offset, min_isr, WRITE_TIMEOUT).await {
            Ok(()) => Ok(()),
            Err(code) if code == error_code::NOT_LEADER_OR_FOLLOWER => Err(ResponseError::NotCoordinator),
            Err(code) => {
                tracing::warn!(transactional_id, code, "transaction state not replicated");
                Err(ResponseError::CoordinatorNotAvailable)
            }
        }
    }

    /// Makes room for the state of `new_id`, an id `loaded` has no state for, under
    /// `transactional.id.max.per.partition`: past it the longest idle ids (no transaction
    /// open or being completed) are forgotten, down to nine tenths of the limit, as
    /// `transactional.id.expiration.ms` would forget them later. A forgotten id's
    /// producer is then treated as after its expiry: its next request is
    /// INVALID_PRODUCER_ID_MAPPING, and an InitProducerId gives the id a new producer id.
    /// An id with a transaction under way is never forgotten: when they alone fill the
    /// limit, the new id is refused with THROTTLING_QUOTA_EXCEEDED until some end (each
    /// within its timeout).
    pub(crate) async fn make_room_for_txn_id(&self, loaded: &Loaded, new_id: &str) -> Result<(), ResponseError> {
        let limit = self.txns.config.max_ids_per_partition;
        // The slots count ids a request made and left without a state too: only when they
        // reach the limit are the states looked at.
        if loaded.len() <= limit {
            return Ok(());
        }
        let mut idle = Vec::new();
        let mut busy = 0;
        for (id, slot) in loaded.slots() {
            if id == new_id {
                continue;
            }
            // A slot a request holds is busy with it.
            match slot.try_lock().map(|m| m.as_ref().map(|m| (m.idle(), m.last_update_ms))) {
                Ok(None) => {}
                Ok(Some((true, last_update_ms))) => idle.push((last_update_ms, id, slot)),
                Ok(Some((false, _))) | Err(_) => busy += 1,
            }
        }
        let held = idle.len() + busy;
        if held < limit {
            return Ok(());
        }
        let keep = (limit - limit / 10).min(limit - 1);
        let excess = (held - keep).min(idle.len());
        if excess > 0 {
            idle.select_nth_unstable_by_key(excess - 1, |(last_update_ms, _, _)| *last_update_ms);
            idle.truncate(excess);
            let forgotten = self.forget_txn_ids(loaded, idle).await?;
            let mut unlogged = loaded.forgotten_unlogged.lock().expect("invariant: warning lock is never poisoned");
            unlogged.0 += forgotten;
            let now = now_ms();
            if now.saturating_sub(unlogged.1) >= 60_000 {
                tracing::warn!(
                    partition = loaded.partition,
                    forgotten = unlogged.0,
                    limit,
                    "more transactional ids than transactional.id.max.per.partition: forgot the longest idle (logged at most once a minute)"
                );
                *unlogged = (0, now);
            }
        }
        if held - excess >= limit {
            tracing::warn!(
                transactional_id = new_id,
                partition = loaded.partition,
                limit,
                "a new transactional id refused: every id of its partition has a transaction under way"
            );
            return Err(ResponseError::ThrottlingQuotaExceeded);
        }
        Ok(())
    }

    /// Forgets the `idle` ids (last update, id, slot) that are still idle, with one
    /// tombstone each, written in appends of at most [`TOMBSTONES_BYTES`] of ids.
    /// Returns how many were forgotten.
    async fn forget_txn_ids(&self, loaded: &Loaded, idle: Vec<(i64, String, Slot)>) -> Result<usize, ResponseError> {
        let mut forgotten = 0;
        let mut rest = idle.as_slice();
        while !rest.is_empty() {
            let mut bytes = 0;
            let chunk = rest
                .iter()
                .take_while(|(_, id, _)| {
                    bytes += id.len();
                    bytes <= TOMBSTONES_BYTES
                })
                .count()
                .max(1);
            let (now, later) = rest.split_at(chunk);
            rest = later;
            // Each slot locked for the write, and only while still idle as it was seen: a
            // request that came meanwhile keeps its id.
            let mut guards = Vec::with_capacity(now.len());
            for (last_update_ms, id, slot) in now {
                if let Ok(guard) = slot.try_lock() {
                    if guard.as_ref().is_some_and(|m| m.idle() && m.last_update_ms == *last_update_ms) {
                        guards.push((id.as_str(), guard));
                    }
                }
            }
            if guards.is_empty() {
                continue;
            }
            let ids: Vec<&str> = guards.iter().map(|(id, _)| *id).collect();
            self.write_txn_tombstones(loaded, &ids).await?;
            for (id, mut guard) in guards {
                *guard = None;
                drop(guard);
                loaded.forget(id);
                forgotten += 1;
            }
        }
        Ok(forgotten)
    }

    /// Finishes the id's prepared transaction: markers to every partition and group,
    /// then the complete state. Gives up only when this broker stops coordinating the id
    /// (the next coordinator finishes it) or the transaction is no longer prepared.
    async fn complete_txn(&self, partition: i32, transactional_id: &str, stop: &CancellationToken) {
        loop {
            let Ok(loaded) = self.txn_loaded(partition).await else { return };
            let slot = loaded.slot(transactional_id);
            let Some(prepared) = slot.lock().await.clone().filter(|m| m.state.is_prepared()) else { return };
            if !self.send_markers(&loaded, &prepared, stop).await {
                return;
            }
            let mut current = slot.lock().await;
            if current.as_ref() != Some(&prepared) {
                return;
            }
            let Some(complete) = prepared.complete(now_ms()) else { return };
            match self.write_txn_state(&loaded, transactional_id, Some(&complete)).await {
                Ok(()) => {
                    tracing::debug!(transactional_id, state = complete.state.name(), "transaction completed");
                    *current = Some(complete);
                    return;
                }
                Err(ResponseError::NotCoordinator) => return,
                Err(_) => {}
            }
            drop(current);
            tokio::select! {
                () = tokio::time::sleep(MARKER_BACKOFF) => {}
                () = stop.cancelled() => return,
            }
        }
    }

    /// Sends the transaction's markers until every partition and group took them;
    /// `false` when this broker stopped coordinating the id or the broker is stopping.
    async fn send_markers(&self, loaded: &Loaded, txn: &TxnMetadata, stop: &CancellationToken) -> bool {
        let commit = txn.state == state::TxnState::PrepareCommit;
        let mut pending: Vec<(String, i32)> = txn.partitions.iter().cloned().collect();
        let mut groups: Vec<String> = txn.groups.iter().cloned().collect();
        loop {
            if self.txn_leader_epoch(loaded.partition) != Some(loaded.leader_epoch) {
                return false;
            }
            // Partitions by leader; a deleted topic needs no marker.
            let mut by_broker: BTreeMap<i32, Vec<(String, i32)>> = BTreeMap::new();
            let (mut unreachable, mut unreachable_groups) = (Vec::new(), Vec::new());
            for (topic, p) in pending.drain(..) {
                if self.topics.get(&topic).is_none_or(|t| t.partition_replicas(p).is_none()) {
                    continue;
                }
                let leader = self.topics.view().partition_state(&TopicPartition::new(&topic, p)).map_or(-1, |s| s.state.leader);
                if leader < 0 {
                    unreachable.push((topic, p));
                } else {
                    by_broker.entry(leader).or_default().push((topic, p));
                }
            }
            let mut group_brokers: BTreeMap<i32, Vec<String>> = BTreeMap::new();
            for group in groups.drain(..) {
                match self.groups.coordinator_of(&group).await {
                    Some(broker) => group_brokers.entry(broker).or_default().push(group),
                    None => unreachable_groups.push(group),
                }
            }
            pending.append(&mut unreachable);
            groups.append(&mut unreachable_groups);
            let brokers: BTreeSet<i32> = by_broker.keys().chain(group_brokers.keys()).copied().collect();
            for broker in brokers {
                let partitions = by_broker.remove(&broker).unwrap_or_default();
                let group_list = group_brokers.remove(&broker).unwrap_or_default();
                let (failed, failed_groups) =
                    self.send_markers_to(broker, txn, commit, loaded.leader_epoch, partitions, group_list).await;
                pending.extend(failed);
                groups.extend(failed_groups);
            }
            if pending.is_empty() && groups.is_empty() {
                return true;
            }
            tokio::select! {
                () = tokio::time::sleep(MARKER_BACKOFF) => {}
                () = stop.cancelled() => return false,
            }
        }
    }

    /// One WriteTxnMarkers to `broker`; returns the partitions and groups to retry.
    async fn send_markers_to(
        &self,
        broker: i32,
        txn: &TxnMetadata,
        commit: bool,
        coordinator_epoch: i32,
        partitions: Vec<(String, i32)>,
        groups: Vec<String>,
    ) -> (Vec<(String, i32)>, Vec<String>) {
        let mut topics: BTreeMap<String, Vec<i32>> = BTreeMap::new();
        for (topic, p) in &partitions {
            topics.entry(topic.clone()).or_default().push(*p);
        }
        if !groups.is_empty() {
            // The group coordinator completes every group it holds pending offsets of this
            // producer for; the partition index carries no meaning.
            topics.entry(GROUP_MARKER_TOPIC.to_owned()).or_default().push(0);
        }
        let marker = WritableTxnMarker::default()
            .with_producer_id(ProducerId(txn.producer_id))
            .with_producer_epoch(txn.producer_epoch)
            .with_transaction_result(commit)
            .with_coordinator_epoch(coordinator_epoch)
            .with_topics(
                topics
                    .into_iter()
                    .map(|(name, indexes)| {
                        WritableTxnMarkerTopic::default()
                            .with_name(TopicName(StrBytes::from_string(name)))
                            .with_partition_indexes(indexes)
                    })
                    .collect(),
            );
        let request = WriteTxnMarkersRequest::default().with_markers(vec![marker]);
        let response = if broker == self.config.broker_id {
            // This broker's own partitions and groups: the handler the request would reach,
            // as the inter-broker principal (which may), awaited to its end as an answer is.
            self.append_txn_markers(request, true).await
        } else {
            match self.send_markers_request(broker, &request).await {
                Some(response) => response,
                None => return (partitions, groups),
            }
        };
        let mut failed = Vec::new();
        let mut groups_failed = false;
        let answered = response.markers.iter().find(|m| m.producer_id.0 == txn.producer_id);
        let mut acknowledged: HashSet<(String, i32)> = HashSet::new();
        for topic in answered.iter().flat_map(|m| m.topics.iter()) {
            for p in &topic.partitions {
                let code = p.error_code;
                if topic.name.as_str() == GROUP_MARKER_TOPIC {
                    // Only the group coordinator's own yes applies or drops the offsets.
                    groups_failed |= code != error_code::NONE;
                    continue;
                }
                let done = code == error_code::NONE
                    // The topic or partition is gone: nothing left to mark.
                    || code == error_code::UNKNOWN_TOPIC_OR_PARTITION
                    // A newer epoch already wrote to it: a later marker closed the transaction.
                    || code == error_code::INVALID_PRODUCER_EPOCH;
                if done {
                    acknowledged.insert((topic.name.to_string(), p.partition_index));
                } else {
                    tracing::debug!(broker, topic = %topic.name.as_str(), partition = p.partition_index, code, "marker refused; retrying");
                }
            }
        }
        if !groups.is_empty() && answered.is_none_or(|m| !m.topics.iter().any(|t| t.name.as_str() == GROUP_MARKER_TOPIC)) {
            groups_failed = true;
        }
        for tp in partitions {
            if !acknowledged.contains(&tp) {
                failed.push(tp);
            }
        }
        (failed, if groups_failed { groups } else { Vec::new() })
    }

    /// One WriteTxnMarkers over the inter-broker listener to another broker; `None` when
    /// it was not answered (the caller retries every partition and group of it).
    async fn send_markers_request(&self, broker: i32, request: &WriteTxnMarkersRequest) -> Option<WriteTxnMarkersResponse> {
        let timeout = self.config.replication.socket_timeout;
        match self.call_peer(&self.txns.peers, broker, request, MARKER_VERSION, timeout).await {
            Ok(response) => Some(response),
            Err(e) => {
                tracing::debug!(broker, error = %e, "transaction markers not delivered");
                None
            }
        }
    }

    /// `request` at `version` to `broker` over the inter-broker listener, on its
    /// connection in `peers`: made when missing, used by one request at a time, dropped
    /// after a failure (its stream position is unknown). The error says why there is no
    /// answer.
    pub(crate) async fn call_peer<R: kafka_protocol::protocol::Request>(
        &self,
        peers: &Peers,
        broker: i32,
        request: &R,
        version: i16,
        timeout: Duration,
    ) -> Result<R::Response, String> {
        let connection = peers.lock().expect("invariant: peers lock is never poisoned").entry(broker).or_default().clone();
        let mut connection = connection.lock().await;
        let peer = match connection.as_mut() {
            Some(peer) => peer,
            None => connection.insert(self.connect_peer(broker, timeout).await?),
        };
        let answer = peer.call(request, version, timeout).await.map_err(|e| e.to_string());
        if answer.is_err() {
            *connection = None;
        }
        answer
    }

    async fn connect_peer(&self, broker: i32, timeout: Duration) -> Result<Peer, String> {
        let registration = read_json::<BrokerRegistration>(&*self.topics.store().clone(), &paths::broker(broker))
            .await
            .map_err(|e| e.to_string())?;
        let Some((registration, _)) = registration else { return Err(format!("broker {broker} is not registered")) };
        let listener = &self.txns.peer.listener;
        let (host, port) =
            registration.endpoint(listener).ok_or_else(|| format!("broker {broker} has no listener {listener}"))?;
        let client_id = format!("fjord-txn-coordinator-{}", self.txns.broker_id);
        Peer::connect(host, port, client_id, &self.txns.peer, timeout).await.map_err(|e| e.to_string())
    }

    /// One pass of the ticker: loads partitions this broker leads, drops those it no
    /// longer leads, aborts timed-out transactions (when `abort` is due) and forgets
    /// expired ids (when `expire` is due), and drops unused slots with either.
    async fn txn_tick(&self, abort: bool, expire: bool) {
        if self.topics.get(TOPIC).is_none() {
            return;
        }
        let partitions = self.txn_partitions();
        {
            let mut loaded = self.txns.loaded.lock().expect("invariant: loaded lock is never poisoned");
            loaded.retain(|&p, l| self.txn_leader_epoch(p) == Some(l.leader_epoch));
        }
        for partition in 0..partitions {
            if self.txn_leader_epoch(partition).is_none() {
                continue;
            }
            let Ok(loaded) = self.txn_loaded(partition).await else { continue };
            if !abort && !expire {
                continue;
            }
            loaded.drop_unused();
            for (id, slot) in loaded.slots() {
                let mut current = slot.lock().await;
                let Some(metadata) = current.as_ref() else { continue };
                let now = now_ms();
                if abort {
                    if let Some(target) = metadata.time_out(now) {
                        tracing::info!(transactional_id = %id, timeout_ms = metadata.timeout_ms, "aborting a transaction past its timeout");
                        if self.write_txn_state(&loaded, &id, Some(&target)).await.is_ok() {
                            *current = Some(target);
                            self.txns.complete_later(partition, &id);
                        }
                        continue;
                    }
                }
                if expire
                    && metadata.expired(now, self.txns.config.id_expiration_ms)
                    && self.write_txn_state(&loaded, &id, None).await.is_ok()
                {
                    tracing::info!(transactional_id = %id, "forgot an expired transactional id");
                    *current = None;
                    drop(current);
                    loaded.forget(&id);
                }
            }
        }
    }
}

/// Waits, up to [`COMPLETION_WAIT`], until the transaction prepared in `slot` is no longer
/// prepared, looking again each time its completion task signals `looked`.
pub(crate) async fn completed(slot: &Slot, looked: &Notify) {
    let wait = async {
        loop {
            // Listening before looking: a signal between the two is not missed.
            let signal = looked.notified();
            tokio::pin!(signal);
            signal.as_mut().enable();
            if !slot.lock().await.as_ref().is_some_and(|m| m.state.is_prepared()) {
                return;
            }
            signal.await;
        }
    };
    // Past the wait the answer goes anyway: the prepared state decided the outcome.
    let _ = tokio::time::timeout(COMPLETION_WAIT, wait).await;
}

/// Reads every transactional id's last state from a partition of `__transaction_state`.
fn read_states(log: &fjord_log::Log) -> fjord_log::Result<HashMap<String, TxnMetadata>> {
    const CHUNK: usize = 1 << 20;
    let end = log.log_end_offset();
    let mut offset = log.log_start_offset();
    let mut states = HashMap::new();
    while offset < end {
        let bytes = log.read_bytes(offset, CHUNK, Some(end), true)?;
        let mut next = offset;
        for batch in fjord_record::batch::batches(&bytes) {
            let Ok((header, batch)) = batch else { break };
            next = header.next_offset();
            // Markers and foreign batches carry no states.
            if header.is_control() {
                continue;
            }
            let Ok(body) = fjord_record::compression::records_body(&header, batch, CHUNK * 64) else { continue };
            for record in fjord_record::Records::new(&body, 0) {
                let Ok(record) = record else { break };
                let Some(key) = record.key.and_then(|k| std::str::from_utf8(k).ok()) else { continue };
                match record.value.map(serde_json::from_slice::<TxnMetadata>) {
                    None => {
                        states.remove(key);
                    }
                    Some(Ok(metadata)) => {
                        states.insert(key.to_owned(), metadata);
                    }
                    Some(Err(e)) => {
                        tracing::warn!(transactional_id = key, error = %e, "skipping a transaction state that does not parse")
                    }
                }
            }
        }
        if next <= offset {
            break;
        }
        offset = next;
    }
    Ok(states)
}

/// Starts the coordinator's background work: completing prepared transactions and the
/// ticker (loading, timeouts, expiry). Both stop with `shutdown`.
pub(crate) fn spawn(tracker: &TaskTracker, broker: &Arc<Broker>, shutdown: &CancellationToken) {
    let Some(mut woken) = broker.txns.woken.lock().expect("invariant: woken lock is never poisoned").take() else { return };
    {
        let (broker, shutdown, tasks) = (broker.clone(), shutdown.clone(), tracker.clone());
        tracker.spawn(async move {
            loop {
                let (partition, id) = tokio::select! {
                    Some(next) = woken.recv() => next,
                    () = shutdown.cancelled() => return,
                };
                let (broker, shutdown) = (broker.clone(), shutdown.clone());
                tasks.spawn(async move {
                    let mut seen = broker.txns.completion_requests(&id);
                    loop {
                        broker.complete_txn(partition, &id, &shutdown).await;
                        match broker.txns.done_completing(&id, seen) {
                            Some(requests) if !shutdown.is_cancelled() => seen = requests,
                            _ => break,
                        }
                    }
                });
            }
        });
    }
    let (broker, shutdown) = (broker.clone(), shutdown.clone());
    tracker.spawn(async move {
        let mut periodic = Periodic::new(TICK);
        let config = broker.txns.config.clone();
        let abort_every = Duration::from_millis(config.abort_timed_out_interval_ms);
        let expire_every = Duration::from_millis(config.remove_expired_interval_ms);
        let (mut last_abort, mut last_expire) = (tokio::time::Instant::now(), tokio::time::Instant::now());
        while periodic.tick_until(&shutdown).await {
            let now = tokio::time::Instant::now();
            let abort = now.duration_since(last_abort) >= abort_every;
            let expire = now.duration_since(last_expire) >= expire_every;
            if abort {
                last_abort = now;
            }
            if expire {
                last_expire = now;
            }
            broker.txn_tick(abort, expire).await;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Requests naming ids that never got a producer (AddPartitionsToTxn, EndTxn or
    /// DescribeTransactions with made-up ids) left an empty slot each, for good: memory
    /// any client could grow without bound. The ticker drops those no request holds.
    #[tokio::test]
    async fn empty_slots_no_request_holds_are_dropped() {
        let loaded = Loaded::new(0, 0, HashMap::new());
        for id in ["made-up-1", "made-up-2", "in-use", "held"] {
            loaded.slot(id);
        }
        *loaded.slot("in-use").lock().await = Some(TxnMetadata::with_new_producer_id("in-use", 7, 60_000, 1_000, None));
        let held = loaded.slot("held");
        assert!(loaded.existing("made-up-3").is_none(), "a look makes no slot");
        loaded.drop_unused();
        let mut left: Vec<String> = loaded.slots().into_iter().map(|(id, _)| id).collect();
        left.sort();
        assert_eq!(left, ["held", "in-use"]);
        drop(held);
        loaded.drop_unused();
        assert_eq!(loaded.slots().into_iter().map(|(id, _)| id).collect::<Vec<_>>(), ["in-use"]);
    }

    #[test]
    fn partitions_follow_javas_string_hash() {
        // Java: "hello".hashCode() == 99162322; "polygenelubricants".hashCode() == Integer.MIN_VALUE.
        assert_eq!(partition_for("hello", 50), 99162322 % 50);
        assert_eq!(partition_for("polygenelubricants", 50), 0);
        // Negative hashes are folded: "Aa" is 2112, "zzzzzzzz" overflows to a negative value.
        let h = "zzzzzzzz".encode_utf16().fold(0i32, |h, u| h.wrapping_mul(31).wrapping_add(i32::from(u)));
        assert!(h < 0);
        assert_eq!(partition_for("zzzzzzzz", 50), h.abs() % 50);
        assert_eq!(partition_for("", 50), 0);
        // Outside the BMP, Java hashes the two UTF-16 units.
        assert_eq!(partition_for("\u{1F600}", 1000), ((0xD83Di32 * 31 + 0xDE00) % 1000));
    }

    /// A transaction prepared while the completion of the id's previous one is under way
    /// gets no task of its own; the one under way must see it when it is done. Before,
    /// the second request was dropped, and a producer that prepared its next
    /// transaction in that window waited on CONCURRENT_TRANSACTIONS until it gave up,
    /// with its partitions' last stable offset held back.
    #[test]
    fn a_completion_requested_while_one_is_under_way_makes_it_look_again() {
        let peer = PeerConfig { listener: "PLAINTEXT".into(), tls: None, sasl: None };
        let txns = TxnCoordinator::new(TxnConfig::default(), peer, 0);
        let mut woken = txns.woken.lock().unwrap().take().unwrap();
        txns.complete_later(3, "a");
        assert_eq!(woken.try_recv().ok(), Some((3, "a".to_owned())));
        let seen = txns.completion_requests("a");
        // The next transaction of "a" is prepared while the first is being completed;
        // its EndTxn waits for the task's look to end.
        let looked = txns.complete_later(3, "a");
        assert!(woken.try_recv().is_err(), "one task an id at a time");
        let signal = looked.notified();
        futures::pin_mut!(signal);
        signal.as_mut().enable();
        let again = txns.done_completing("a", seen);
        assert!(again.is_some(), "the task under way must look at the id again");
        assert!(futures::FutureExt::now_or_never(signal).is_some(), "the end of a look is signalled");
        // Nothing more came: the claim ends, and the next request starts a task again.
        assert_eq!(txns.done_completing("a", again.unwrap()), None);
        txns.complete_later(3, "a");
        assert_eq!(woken.try_recv().ok(), Some((3, "a".to_owned())));
        // Other ids are not held up by "a".
        txns.complete_later(4, "b");
        assert_eq!(woken.try_recv().ok(), Some((4, "b".to_owned())));
    }

    #[test]
    fn config_keys_are_kafkas() {
        let mut c = TxnConfig::default();
        assert_eq!(c.set("transaction.max.timeout.ms", "60000"), Ok(()));
        assert_eq!(c.set("transaction.state.log.num.partitions", "3"), Ok(()));
        assert_eq!(c.set("transaction.state.log.replication.factor", "1"), Ok(()));
        assert_eq!(c.set("transactional.id.expiration.ms", "1000"), Ok(()));
        assert_eq!(c.set("transaction.abort.timed.out.transaction.cleanup.interval.ms", "500"), Ok(()));
        assert_eq!((c.max_timeout_ms, c.log_num_partitions, c.log_replication_factor), (60_000, 3, 1));
        assert_eq!(c.set("transaction.state.log.num.partitions", "0"), Err("must be at least 1"));
        assert_eq!(c.set("transaction.max.timeout.ms", "x"), Err("not a number"));
        assert!(c.set("group.min.session.timeout.ms", "1").is_err());
        assert_eq!(c.set("transaction.partition.verification.enable", "false"), Ok(()));
        assert!(!c.partition_verification);
        assert_eq!(c.set("transaction.partition.verification.enable", "1"), Err("not true or false"));
        assert_eq!(c.set("transactional.id.max.per.partition", "500"), Ok(()));
        assert_eq!(c.max_ids_per_partition, 500);
        assert_eq!(c.set("transactional.id.max.per.partition", "0"), Err("must be at least 1"));
        assert_eq!(c.set("transactional.id.max.per.partition", "-3"), Err("must be at least 1"));
        assert!(TxnConfig::KEYS.iter().all(|k| TxnConfig::default().set(k, "1").is_ok() || k.ends_with(".enable")));
    }
}
