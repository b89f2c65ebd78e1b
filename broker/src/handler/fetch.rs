//! Fetch: whole batches from the requested offsets, as file regions (sendfile) or copied
//! bytes, from the partition's leader only: up to the high watermark for consumers, up
//! to the log end for followers (replica id >= 0), whose fetch offsets are their log end
//! offsets and move the high watermark. A delayed fetch waits for appends (and high
//! watermark moves) without polling.
//!
//! A fetch that has fewer than `min_bytes` registers a [`Notify`] on every partition it
//! reads, re-reads when any of them is appended to, and gives up at `max_wait_ms` (a
//! tokio timer). Registering before reading means an append between the read and the
//! wait leaves a permit behind instead of being missed.
//!
//! `isolation_level=1` (read_committed) stops a consumer's read at the last stable
//! offset instead of the high watermark and lists the aborted transactions overlapping
//! what it returns (from the segments' `.txnindex`), so the client drops their records;
//! the records themselves go out as they are, by sendfile too. Every answer carries the
//! partition's last stable offset, whatever the isolation level.
//!
//! From v13 a topic is named by its id (KIP-516): an id no topic has is answered
//! UNKNOWN_TOPIC_ID, and so is the nil id. A topic deleted and created again under the
//! same name has a new id, so a consumer still fetching by the old one learns that its
//! topic is gone instead of reading the new topic's records at its old offsets.
//!
//! A replica id is honoured only from a connection that is that broker's: on the
//! inter-broker listener, from an address the broker is registered at (with SASL, the
//! broker's authenticated principal as well). Anyone else's replica Fetch is answered
//! TOPIC_AUTHORIZATION_FAILED, as Kafka answers a replica Fetch without ClusterAction,
//! and moves no follower state: a client could otherwise keep a lagging replica in the
//! ISR by fetching in its name.
//!
//! A follower outside the ISR fetching a partition this broker leads under a throttle
//! (`leader.replication.throttled.*`, see [`crate::replication::throttle`]) gets no
//! records for it while the leader's rate is exceeded (the fetch waits as a delayed
//! fetch would); the bytes sent for throttled partitions are counted against the rate.

use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::messages::FetchRequest;
use tokio::sync::Notify;
use tokio::time::Instant;
use uuid::Uuid;

use crate::codec::error_code;
use crate::connection::Session;
use crate::fetch_response::{FetchResponseData, FetchedRecords, PartitionData, TopicData};
use crate::handler::{log_error_code, Broker};
use crate::partition::Partition;
use crate::replication::throttle::Side;
use fjord_auth::{Operation, Resource};

/// One requested partition, resolved once per fetch.
struct Wanted {
    partition_index: i32,
    /// The partition, or the error code to answer for it.
    partition: Result<Arc<Partition>, i16>,
    fetch_offset: i64,
    partition_max_bytes: usize,
    /// The fetcher's leader epoch (-1: not given, before v9).
    current_leader_epoch: i32,
}

impl Broker {
    pub(crate) async fn fetch(&self, request: FetchRequest, version: i16, session: &mut Session) -> FetchResponseData {
        // Fetch sessions (KIP-227) are not implemented: session 0 means "no session", which
        // every client accepts; an id we never handed out is unknown.
        if request.session_id != 0 {
            return FetchResponseData { error_code: error_code::FETCH_SESSION_ID_NOT_FOUND, ..Default::default() };
        }
        if request.replica_id.0 >= 0 && !self.is_replica(session, request.replica_id.0).await {
            return refused(request, version, error_code::TOPIC_AUTHORIZATION_FAILED);
        }
        // sendfile cannot cross user-space TLS: those connections get copies.
        let zero_copy = self.config.fetch_zero_copy && !session.listener.protocol.tls();
        let replica_fetch = request.replica_id.0 >= 0;
        // Followers copy everything, markers and open transactions included.
        let read_committed = request.isolation_level == 1 && !replica_fetch;
        let by_id = version >= 13;
        let wanted: Vec<(String, Uuid, Vec<Wanted>)> = request
            .topics
            .into_iter()
            .map(|t| {
                let (name, topic, unknown) = if by_id {
                    let topic = self.topics.view().topic_by_id(&t.topic_id);
                    (topic.as_ref().map_or_else(String::new, |t| t.name.clone()), topic, error_code::UNKNOWN_TOPIC_ID)
                } else {
                    let name = t.topic.0.to_string();
                    let topic = self.topics.get(&name);
                    (name, topic, error_code::UNKNOWN_TOPIC_OR_PARTITION)
                };
                let topic_id = if by_id { t.topic_id } else { topic.as_ref().map_or(Uuid::nil(), |t| t.topic_id) };
                // Kafka: Read on the topic (replica fetches were checked above).
                let allowed = replica_fetch || self.authorize(session, Operation::Read, Resource::topic(&name));
                let partitions = t
                    .partitions
                    .into_iter()
                    .map(|p| Wanted {
                        partition_index: p.partition,
                        partition: match &topic {
                            // An id names no topic to authorize against.
                            None if by_id => Err(unknown),
                            _ if !allowed => Err(error_code::TOPIC_AUTHORIZATION_FAILED),
                            Some(topic) => self.replica(topic, p.partition),
                            None => Err(unknown),
                        },
                        fetch_offset: p.fetch_offset,
                        partition_max_bytes: usize::try_from(p.partition_max_bytes).unwrap_or(0),
                        current_leader_epoch: p.current_leader_epoch,
                    })
                    .collect();
                (name, topic_id, partitions)
            })
            .collect();
        // A follower (replica id >= 0) reads up to the log end and reports its log end
        // offset with its fetch offset, once per request.
        let replica = (request.replica_id.0 >= 0).then_some(request.replica_id.0);
        if let Some(replica) = replica {
            for w in wanted.iter().flat_map(|(_, _, partitions)| partitions) {
                if let Ok(partition) = &w.partition {
                    let leo = partition.log.log_end_offset();
                    if partition.check_leader(w.current_leader_epoch).is_ok() && w.fetch_offset <= leo {
                        self.replicas.follower_fetched(partition, replica, w.fetch_offset);
                    }
                }
            }
        }
        let max_bytes = usize::try_from(request.max_bytes).unwrap_or(0);
        let min_bytes = usize::try_from(request.min_bytes).unwrap_or(0);
        let deadline = Instant::now() + Duration::from_millis(u64::try_from(request.max_wait_ms).unwrap_or(0));
        let waiter = Arc::new(Notify::new());
        let data = loop {
            for (_, _, partitions) in &wanted {
                for partition in partitions.iter().filter_map(|w| w.partition.as_ref().ok()) {
                    partition.register_waiter(&waiter);
                }
            }
            let (data, has_error) = self.read_partitions(&wanted, max_bytes, replica, read_committed, zero_copy);
            if has_error || data.records_bytes() >= min_bytes || Instant::now() >= deadline {
                break data;
            }
            // The long poll is waiting, not handling: a request quota does not count it.
            let waiting = Instant::now();
            tokio::select! {
                () = waiter.notified() => session.waited += waiting.elapsed(),
                () = tokio::time::sleep_until(deadline) => {
                    session.waited += waiting.elapsed();
                    break self.read_partitions(&wanted, max_bytes, replica, read_committed, zero_copy).0;
                }
            }
        };
        if replica.is_some() {
            // Kafka counts what it sends for every throttled partition, in the ISR or not.
            let throttles = self.replicas.throttles();
            let throttled: usize = data
                .topics
                .iter()
                .flat_map(|t| t.partitions.iter().map(move |p| (&t.topic, p)))
                .filter(|(topic, p)| throttles.is_throttled(Side::Leader, topic, p.partition_index))
                .map(|(_, p)| p.records.len())
                .sum();
            throttles.record(Side::Leader, throttled as u64);
        }
        data
    }

    /// One pass over the requested partitions; also says whether any partition has an
    /// error (a delayed fetch answers at once then, as Kafka does).
    fn read_partitions(
        &self,
        wanted: &[(String, Uuid, Vec<Wanted>)],
        max_bytes: usize,
        replica: Option<i32>,
        read_committed: bool,
        zero_copy: bool,
    ) -> (FetchResponseData, bool) {
        let mut total = 0usize;
        let mut has_error = false;
        let topics = wanted
            .iter()
            .map(|(name, topic_id, partitions)| TopicData {
                topic: name.clone(),
                topic_id: *topic_id,
                partitions: partitions
                    .iter()
                    .map(|w| {
                        let remaining = max_bytes.saturating_sub(total);
                        let data = self.read_partition(w, remaining, total == 0, replica, read_committed, zero_copy);
                        total += data.records.len();
                        has_error |= data.error_code != error_code::NONE;
                        data
                    })
                    .collect(),
            })
            .collect();
        (FetchResponseData { topics, ..Default::default() }, has_error)
    }

    fn read_partition(
        &self,
        wanted: &Wanted,
        remaining: usize,
        first: bool,
        replica: Option<i32>,
        read_committed: bool,
        zero_copy: bool,
    ) -> PartitionData {
        let mut data = PartitionData {
            partition_index: wanted.partition_index,
            error_code: error_code::NONE,
            high_watermark: -1,
            last_stable_offset: -1,
            log_start_offset: -1,
            aborted_transactions: Vec::new(),
            records: FetchedRecords::Empty,
        };
        let partition = match &wanted.partition {
            Ok(partition) => partition,
            Err(code) => {
                data.error_code = *code;
                return data;
            }
        };
        if let Err(code) = partition.check_leader(wanted.current_leader_epoch) {
            data.error_code = code;
            return data;
        }
        let log = &partition.log;
        // The last stable offset after the high watermark: it is never above it.
        let high_watermark = log.high_watermark();
        let last_stable_offset = log.last_stable_offset().min(high_watermark);
        data.high_watermark = high_watermark;
        data.last_stable_offset = last_stable_offset;
        data.log_start_offset = log.log_start_offset();
        if let Some(replica) = replica {
            let in_sync = partition.state().isr.contains(&replica);
            let tp = &partition.tp;
            if self.replicas.throttles().must_wait(Side::Leader, &tp.topic, tp.partition, in_sync) {
                return data;
            }
        }
        let limit = wanted.partition_max_bytes.min(remaining);
        // Consumers never see above the high watermark (read_committed ones above the last
        // stable offset); followers need everything.
        let upper_bound = match (replica.is_some(), read_committed) {
            (true, _) => None,
            (false, false) => Some(high_watermark),
            (false, true) => Some(last_stable_offset),
        };
        // KIP-74: the first batch of the first non-empty partition is returned whole even
        // when it exceeds the limits, so a consumer can always make progress.
        let records = log.read(wanted.fetch_offset, limit, upper_bound, first).and_then(|slice| {
            if read_committed && !slice.is_empty() {
                // The aborted transactions overlapping the batches returned.
                let aborted = log.aborted_transactions(slice.first_offset.max(wanted.fetch_offset), slice.next_offset)?;
                data.aborted_transactions = aborted.iter().map(|a| (a.producer_id, a.first_offset)).collect();
            }
            if slice.is_empty() {
                Ok(FetchedRecords::Empty)
            } else if zero_copy {
                Ok(FetchedRecords::File { file: slice.file.clone(), position: slice.position, len: slice.len })
            } else {
                let bytes =
                    slice.read_to_vec().map_err(|source| fjord_log::Error::Io { path: log.dir().to_path_buf(), source })?;
                Ok(FetchedRecords::Memory(bytes.into()))
            }
        });
        match records {
            Ok(records) => data.records = records,
            Err(e) => {
                tracing::debug!(tp = %partition.tp, offset = wanted.fetch_offset, error = %e, "fetch refused");
                data.error_code = log_error_code(&e);
            }
        }
        data
    }
}

impl Broker {
    /// Whether the client of `session` is broker `replica`: it came in on the
    /// inter-broker listener, from an address that broker is registered at. Checked once
    /// per connection (a resolution of the registered host), then remembered.
    pub(super) async fn is_replica(&self, session: &mut Session, replica: i32) -> bool {
        if session.replica == Some(replica) {
            return true;
        }
        let listener = self.config.inter_broker_listener();
        let broker_principal = self.config.inter_broker_sasl_username.as_deref().map(fjord_auth::Principal::user);
        let verdict = if session.listener.name != listener {
            Err("not on the inter-broker listener")
        } else if session.listener.protocol.sasl() && broker_principal.as_ref() != Some(&session.principal) {
            Err("not authenticated as the brokers' principal (inter.broker.sasl.username)")
        } else {
            match self.registered_addresses(replica, listener).await {
                Some(addresses) if addresses.contains(&session.peer.ip()) => Ok(()),
                Some(_) => Err("not from an address the broker is registered at"),
                None => Err("no such broker is registered"),
            }
        };
        match verdict {
            Ok(()) => {
                session.replica = Some(replica);
                true
            }
            Err(reason) => {
                tracing::warn!(
                    peer = %session.peer,
                    listener = %session.listener.name,
                    principal = %session.principal,
                    replica,
                    reason,
                    "replica fetch refused"
                );
                false
            }
        }
    }

    /// The addresses broker `id`'s endpoint on `listener` resolves to; the view first,
    /// then the store (a follower may fetch before this broker's view has seen it).
    async fn registered_addresses(&self, id: i32, listener: &str) -> Option<Vec<std::net::IpAddr>> {
        let registration = match self.topics.view().brokers().into_iter().find(|(b, _)| *b == id) {
            Some((_, registration)) => registration,
            None => {
                let path = fjord_coord::paths::broker(id);
                fjord_coord::registry::read_json::<fjord_coord::registry::BrokerRegistration>(&**self.topics.store(), &path)
                    .await
                    .ok()
                    .flatten()?
                    .0
            }
        };
        let (host, port) = registration.endpoint(listener)?;
        let resolved = tokio::net::lookup_host((host, port)).await.ok()?;
        Some(resolved.map(|a| a.ip()).collect())
    }
}

/// Every requested partition answered with `code`, nothing read.
fn refused(request: FetchRequest, version: i16, code: i16) -> FetchResponseData {
    let topics = request
        .topics
        .into_iter()
        .map(|t| TopicData {
            topic: t.topic.0.to_string(),
            // v13+ answers by the id asked for; older versions have none.
            topic_id: if version >= 13 { t.topic_id } else { Uuid::nil() },
            partitions: t
                .partitions
                .into_iter()
                .map(|p| PartitionData {
                    partition_index: p.partition,
                    error_code: code,
                    high_watermark: -1,
                    last_stable_offset: -1,
                    log_start_offset: -1,
                    aborted_transactions: Vec::new(),
                    records: FetchedRecords::Empty,
                })
                .collect(),
        })
        .collect();
    FetchResponseData { topics, ..Default::default() }
}
