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

use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::messages::FetchRequest;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::codec::error_code;
use crate::fetch_response::{FetchResponseData, FetchedRecords, PartitionData, TopicData};
use crate::handler::{log_error_code, Broker};
use crate::partition::Partition;

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
    pub(crate) async fn fetch(&self, request: FetchRequest) -> FetchResponseData {
        // Fetch sessions (KIP-227) are not implemented: session 0 means "no session", which
        // every client accepts; an id we never handed out is unknown.
        if request.session_id != 0 {
            return FetchResponseData { error_code: error_code::FETCH_SESSION_ID_NOT_FOUND, ..Default::default() };
        }
        let wanted: Vec<(String, Vec<Wanted>)> = request
            .topics
            .into_iter()
            .map(|t| {
                let name = t.topic.0.to_string();
                let topic = self.topics.get(&name);
                let partitions = t
                    .partitions
                    .into_iter()
                    .map(|p| Wanted {
                        partition_index: p.partition,
                        partition: match &topic {
                            Some(topic) => self.replica(topic, p.partition),
                            None => Err(error_code::UNKNOWN_TOPIC_OR_PARTITION),
                        },
                        fetch_offset: p.fetch_offset,
                        partition_max_bytes: usize::try_from(p.partition_max_bytes).unwrap_or(0),
                        current_leader_epoch: p.current_leader_epoch,
                    })
                    .collect();
                (name, partitions)
            })
            .collect();
        // A follower (replica id >= 0) reads up to the log end and reports its log end
        // offset with its fetch offset, once per request.
        let replica = (request.replica_id.0 >= 0).then_some(request.replica_id.0);
        if let Some(replica) = replica {
            for w in wanted.iter().flat_map(|(_, partitions)| partitions) {
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
        loop {
            for (_, partitions) in &wanted {
                for partition in partitions.iter().filter_map(|w| w.partition.as_ref().ok()) {
                    partition.register_waiter(&waiter);
                }
            }
            let (data, has_error) = self.read_partitions(&wanted, max_bytes, replica.is_some());
            if has_error || data.records_bytes() >= min_bytes || Instant::now() >= deadline {
                return data;
            }
            tokio::select! {
                () = waiter.notified() => {}
                () = tokio::time::sleep_until(deadline) => {
                    return self.read_partitions(&wanted, max_bytes, replica.is_some()).0;
                }
            }
        }
    }

    /// One pass over the requested partitions; also says whether any partition has an
    /// error (a delayed fetch answers at once then, as Kafka does).
    fn read_partitions(&self, wanted: &[(String, Vec<Wanted>)], max_bytes: usize, replica: bool) -> (FetchResponseData, bool) {
        let mut total = 0usize;
        let mut has_error = false;
        let topics = wanted
            .iter()
            .map(|(name, partitions)| TopicData {
                topic: name.clone(),
                partitions: partitions
                    .iter()
                    .map(|w| {
                        let data = self.read_partition(w, max_bytes.saturating_sub(total), total == 0, replica);
                        total += data.records.len();
                        has_error |= data.error_code != error_code::NONE;
                        data
                    })
                    .collect(),
            })
            .collect();
        (FetchResponseData { topics, ..Default::default() }, has_error)
    }

    fn read_partition(&self, wanted: &Wanted, remaining: usize, first: bool, replica: bool) -> PartitionData {
        let mut data = PartitionData {
            partition_index: wanted.partition_index,
            error_code: error_code::NONE,
            high_watermark: -1,
            last_stable_offset: -1,
            log_start_offset: -1,
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
        let high_watermark = log.high_watermark();
        data.high_watermark = high_watermark;
        data.last_stable_offset = high_watermark; // no transactions: everything is stable
        data.log_start_offset = log.log_start_offset();
        let limit = wanted.partition_max_bytes.min(remaining);
        // Consumers never see above the high watermark; followers need everything.
        let upper_bound = (!replica).then_some(high_watermark);
        // KIP-74: the first batch of the first non-empty partition is returned whole even
        // when it exceeds the limits, so a consumer can always make progress.
        let records = if self.config.fetch_zero_copy {
            log.read(wanted.fetch_offset, limit, upper_bound, first).map(|slice| {
                if slice.is_empty() {
                    FetchedRecords::Empty
                } else {
                    FetchedRecords::File { file: slice.file.clone(), position: slice.position, len: slice.len }
                }
            })
        } else {
            log.read_bytes(wanted.fetch_offset, limit, upper_bound, first).map(|bytes| {
                if bytes.is_empty() {
                    FetchedRecords::Empty
                } else {
                    FetchedRecords::Memory(bytes.into())
                }
            })
        };
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
