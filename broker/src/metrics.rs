//! Broker metrics in the Prometheus text format, served over HTTP on `metrics.listen`
//! (`fjord broker --metrics ADDR`; off by default, `fjord dev` serves it on 127.0.0.1:9094).
//!
//! - Per partition of this broker's logs: log end and start offsets, size, segments, high
//!   watermark; read from the logs at scrape time.
//! - The log cleaner, per partition it has cleaned: when it last ran, how long it took,
//!   bytes before and after, the ratio of the two, the dirty ratio that triggered it,
//!   records and tombstones removed ([`fjord_log::Log::last_clean`]).
//! - Requests per API, and the error codes answered per API: one per failed partition or
//!   resource, as Kafka's `ErrorsPerSec` counts them; frames that were no request at all
//!   (the connection was closed) count as `malformed`.
//!
//! Why no metrics registry crate: the registry is an array of atomics and one small map,
//! and the exposition is written with `fjord-metrics` (as in the gateway and the mirror);
//! a client crate would bring a registry abstraction for nothing. The HTTP side is
//! `fjord_metrics::endpoint`, shared with the mirror: one `GET /metrics` per connection,
//! so the broker carries no HTTP stack.
//!
//! Security (`metrics.*` keys, see [`fjord_metrics::endpoint`]): with
//! `metrics.ssl.keystore.location` the endpoint speaks only TLS (the same PEM keys as the
//! listeners), and with `metrics.authentication.method=BASIC` a scrape must carry HTTP
//! Basic credentials of a user in the metadata store (or a trusted client certificate),
//! else 401 with `WWW-Authenticate`. Like the gateway's `/metrics`, any authenticated user
//! may scrape.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use fjord_log::{CleanStats, Log, LogDirs};
use fjord_metrics::{escape, family, sample, Kind};
use kafka_protocol::messages::ResponseKind;
use kafka_protocol::ResponseError;

use crate::codec::api_name;
use crate::fetch_response::FetchResponseData;
use crate::group::GroupStats;
use crate::handler::Broker;
use crate::quota::QuotaKind;
use crate::request_memory::RequestMemoryStats;

/// API keys counted one by one; larger (unknown) keys share one counter.
const API_KEYS: usize = 128;

/// The request counters.
pub(crate) struct Metrics {
    /// Requests by API key; the last slot counts keys beyond the table.
    requests: Box<[AtomicU64]>,
    /// (API key, error code) → responses' error count.
    errors: Mutex<BTreeMap<(i16, i16), u64>>,
    /// Frames that closed their connection: not a request, or larger than allowed.
    malformed: AtomicU64,
    /// Connections refused or closed by the broker, by [`ConnectionEvent`].
    connection_events: [AtomicU64; ConnectionEvent::ALL.len()],
    /// Client quota throttles (KIP-219 mutes): how many, and their total ms, by quota.
    throttles: [AtomicU64; QUOTA_KINDS.len()],
    throttle_ms: [AtomicU64; QUOTA_KINDS.len()],
}

/// The client quotas, as the throttle counters label them.
const QUOTA_KINDS: [(QuotaKind, &str); 3] =
    [(QuotaKind::Produce, "produce"), (QuotaKind::Fetch, "fetch"), (QuotaKind::Request, "request")];

/// Why the broker refused or closed a connection (`fjord_broker_connection_events_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConnectionEvent {
    /// Refused at accept: `max.connections` reached.
    MaxConnections,
    /// Refused at accept: `max.connections.per.ip` reached for its address.
    MaxConnectionsPerIp,
    /// Closed after `connections.max.idle.ms` without a request.
    Idle,
    /// The TLS handshake failed or stalled.
    TlsHandshakeFailed,
    /// SASL authentication failed, stalled, or a request came before it.
    AuthenticationFailed,
}

impl ConnectionEvent {
    const ALL: [Self; 5] =
        [Self::MaxConnections, Self::MaxConnectionsPerIp, Self::Idle, Self::TlsHandshakeFailed, Self::AuthenticationFailed];

    fn label(self) -> &'static str {
        match self {
            Self::MaxConnections => "refused_max_connections",
            Self::MaxConnectionsPerIp => "refused_max_connections_per_ip",
            Self::Idle => "closed_idle",
            Self::TlsHandshakeFailed => "tls_handshake_failed",
            Self::AuthenticationFailed => "authentication_failed",
        }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            requests: (0..=API_KEYS).map(|_| AtomicU64::new(0)).collect(),
            errors: Mutex::new(BTreeMap::new()),
            malformed: AtomicU64::new(0),
            connection_events: Default::default(),
            throttles: Default::default(),
            throttle_ms: Default::default(),
        }
    }
}

impl Metrics {
    /// Counts one request of `api_key`.
    pub(crate) fn request(&self, api_key: i16) {
        let slot = usize::try_from(api_key).ok().filter(|&k| k < API_KEYS).unwrap_or(API_KEYS);
        self.requests[slot].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts the non-zero error codes of one response of `api_key`.
    pub(crate) fn errors(&self, api_key: i16, codes: impl IntoIterator<Item = i16>) {
        let mut codes = codes.into_iter().filter(|&c| c != 0).peekable();
        if codes.peek().is_none() {
            return; // the common case takes no lock
        }
        let mut errors = self.errors.lock().unwrap_or_else(|e| e.into_inner());
        for code in codes {
            *errors.entry((api_key, code)).or_default() += 1;
        }
    }

    /// Counts a frame that was not a request.
    pub(crate) fn malformed(&self) {
        self.malformed.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a refused or closed connection.
    pub(crate) fn connection_event(&self, event: ConnectionEvent) {
        self.connection_events[event as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a client throttled (its connection muted) for `throttle` by a `kind` quota.
    pub(crate) fn throttled(&self, kind: QuotaKind, throttle: std::time::Duration) {
        if throttle.is_zero() {
            return;
        }
        let slot = QUOTA_KINDS.iter().position(|(k, _)| *k == kind).expect("invariant: every quota kind is listed");
        self.throttles[slot].fetch_add(1, Ordering::Relaxed);
        self.throttle_ms[slot].fetch_add(throttle.as_millis() as u64, Ordering::Relaxed);
    }

    /// The exposition text: these counters, the group coordinator's figures, then the
    /// logs' gauges.
    fn render(&self, logs: &LogDirs, groups: GroupStats, memory: RequestMemoryStats) -> String {
        let mut out = String::with_capacity(4096);
        family(
            &mut out,
            "fjord_broker_request_memory_bytes",
            Kind::Gauge,
            "Memory of requests held now against queued.max.request.bytes: frames over 64 KiB, and the estimated decoded size of requests of many elements.",
        );
        sample(&mut out, "fjord_broker_request_memory_bytes", "pool=\"frames\"", memory.frames);
        sample(&mut out, "fjord_broker_request_memory_bytes", "pool=\"decoded\"", memory.decoded);
        family(
            &mut out,
            "fjord_broker_request_memory_limit_bytes",
            Kind::Gauge,
            "queued.max.request.bytes, the bound of each pool (0: unbounded).",
        );
        sample(&mut out, "fjord_broker_request_memory_limit_bytes", "", memory.limit);
        family(
            &mut out,
            "fjord_broker_request_memory_waits_total",
            Kind::Counter,
            "Requests that waited for room in queued.max.request.bytes.",
        );
        sample(&mut out, "fjord_broker_request_memory_waits_total", "", memory.waits);
        family(&mut out, "fjord_broker_groups_in_memory", Kind::Gauge, "Consumer groups this broker coordinates held in memory.");
        sample(&mut out, "fjord_broker_groups_in_memory", "", groups.in_memory);
        family(
            &mut out,
            "fjord_broker_groups_active",
            Kind::Gauge,
            "Consumer groups with members, a rebalance or member ids handed out.",
        );
        sample(&mut out, "fjord_broker_groups_active", "", groups.ticked);
        family(
            &mut out,
            "fjord_broker_group_offsets_expired_total",
            Kind::Counter,
            "Committed offsets expired (offsets.retention.minutes).",
        );
        sample(&mut out, "fjord_broker_group_offsets_expired_total", "", groups.offsets_expired);
        family(&mut out, "fjord_broker_requests_total", Kind::Counter, "Requests received, by API.");
        for (key, counter) in self.requests.iter().enumerate() {
            let n = counter.load(Ordering::Relaxed);
            if n > 0 {
                let api = if key == API_KEYS { "unknown".to_owned() } else { api_name(key as i16) };
                sample(&mut out, "fjord_broker_requests_total", &format!("api=\"{api}\""), n);
            }
        }
        family(
            &mut out,
            "fjord_broker_request_errors_total",
            Kind::Counter,
            "Error codes answered, by API and error (one per failed partition or resource).",
        );
        for (&(key, code), n) in self.errors.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let error = ResponseError::try_from_code(code).map(|e| e.to_string()).unwrap_or_default();
            let labels = format!("api=\"{}\",error=\"{}\",code=\"{code}\"", api_name(key), escape(&error));
            sample(&mut out, "fjord_broker_request_errors_total", &labels, n);
        }
        family(
            &mut out,
            "fjord_broker_malformed_requests_total",
            Kind::Counter,
            "Frames that were not a request; each closed its connection.",
        );
        sample(&mut out, "fjord_broker_malformed_requests_total", "", self.malformed.load(Ordering::Relaxed));
        family(
            &mut out,
            "fjord_broker_connection_events_total",
            Kind::Counter,
            "Connections the broker refused (connection limits) or closed (idle, failed TLS handshake or authentication).",
        );
        for event in ConnectionEvent::ALL {
            let n = self.connection_events[event as usize].load(Ordering::Relaxed);
            sample(&mut out, "fjord_broker_connection_events_total", &format!("event=\"{}\"", event.label()), n);
        }
        family(
            &mut out,
            "fjord_broker_quota_throttles_total",
            Kind::Counter,
            "Requests that put a client over a client quota; each muted its connection (KIP-219).",
        );
        for (slot, (_, label)) in QUOTA_KINDS.iter().enumerate() {
            let n = self.throttles[slot].load(Ordering::Relaxed);
            sample(&mut out, "fjord_broker_quota_throttles_total", &format!("quota=\"{label}\""), n);
        }
        family(
            &mut out,
            "fjord_broker_quota_throttle_seconds_total",
            Kind::Counter,
            "Time connections were muted for client quotas.",
        );
        for (slot, (_, label)) in QUOTA_KINDS.iter().enumerate() {
            let seconds = self.throttle_ms[slot].load(Ordering::Relaxed) as f64 / 1000.0;
            sample(&mut out, "fjord_broker_quota_throttle_seconds_total", &format!("quota=\"{label}\""), seconds);
        }

        let mut partitions: Vec<(String, Arc<Log>)> = logs
            .partitions()
            .into_iter()
            .filter_map(|tp| {
                let log = logs.get(&tp)?;
                Some((format!("topic=\"{}\",partition=\"{}\"", escape(&tp.topic), tp.partition), log))
            })
            .collect();
        partitions.sort_by(|a, b| a.0.cmp(&b.0));
        type Gauge = fn(&Log) -> f64;
        let gauges: [(&str, &str, Gauge); 6] = [
            ("fjord_broker_log_end_offset", "Offset the next appended record gets.", |l| l.log_end_offset() as f64),
            ("fjord_broker_log_start_offset", "First offset still in the log.", |l| l.log_start_offset() as f64),
            ("fjord_broker_log_size_bytes", "Bytes of all segments.", |l| l.size_bytes() as f64),
            ("fjord_broker_log_segments", "Segments, the active one included.", |l| l.segment_count() as f64),
            ("fjord_broker_high_watermark", "Offset below which records are committed and visible.", |l| {
                l.high_watermark() as f64
            }),
            (
                "fjord_broker_log_corrupt_batches",
                "Corrupt batches found in the log's segments (reads there answer CORRUPT_MESSAGE).",
                |l| l.corrupt_batches() as f64,
            ),
        ];
        for (name, help, gauge) in gauges {
            family(&mut out, name, Kind::Gauge, help);
            for (labels, log) in &partitions {
                sample(&mut out, name, labels, gauge(log));
            }
        }

        // Kafka's OfflinePartitionsCount, for this broker's replicas: an alert needs one
        // number; the per-partition family says which and why.
        let unhealthy = logs.unhealthy();
        family(
            &mut out,
            "fjord_broker_unhealthy_partitions",
            Kind::Gauge,
            "Replicas here whose log could not be opened (offline) or holds a damaged batch.",
        );
        sample(&mut out, "fjord_broker_unhealthy_partitions", "", unhealthy.len());
        family(
            &mut out,
            "fjord_broker_partition_unhealthy",
            Kind::Gauge,
            "1 per unhealthy replica: state=\"offline\" (not served, KAFKA_STORAGE_ERROR) or \"damaged\" (served up to the damage).",
        );
        for (tp, state) in unhealthy.iter() {
            let state = match state {
                fjord_log::Unhealthy::Offline { .. } => "offline",
                fjord_log::Unhealthy::Damaged { .. } => "damaged",
            };
            let labels = format!("topic=\"{}\",partition=\"{}\",state=\"{state}\"", escape(&tp.topic), tp.partition);
            sample(&mut out, "fjord_broker_partition_unhealthy", &labels, 1);
        }

        let cleaned: Vec<(&String, CleanStats)> =
            partitions.iter().filter_map(|(labels, log)| Some((labels, log.last_clean()?))).collect();
        type Stat = fn(&CleanStats) -> f64;
        let stats: [(&str, &str, Stat); 8] = [
            ("fjord_broker_cleaner_last_run_timestamp_seconds", "When the cleaner last cleaned the log (Unix time).", |s| {
                s.at_ms as f64 / 1000.0
            }),
            ("fjord_broker_cleaner_last_duration_seconds", "How long that clean took, throttling included.", |s| {
                s.elapsed.as_secs_f64()
            }),
            ("fjord_broker_cleaner_last_bytes_before", "Bytes of the segments that clean rewrote.", |s| s.bytes_before as f64),
            ("fjord_broker_cleaner_last_bytes_after", "Bytes of the cleaned segments that replaced them.", |s| {
                s.bytes_after as f64
            }),
            (
                "fjord_broker_cleaner_last_ratio",
                "bytes_after / bytes_before of that clean (1 when nothing was rewritten).",
                |s| {
                    if s.bytes_before == 0 {
                        1.0
                    } else {
                        s.bytes_after as f64 / s.bytes_before as f64
                    }
                },
            ),
            ("fjord_broker_cleaner_last_dirty_ratio", "Dirty share of the cleanable bytes when that clean started.", |s| {
                s.dirty_ratio
            }),
            (
                "fjord_broker_cleaner_last_records_removed",
                "Records that clean dropped (older values of a key, expired tombstones).",
                |s| s.records_read.saturating_sub(s.records_kept) as f64,
            ),
            ("fjord_broker_cleaner_last_tombstones_removed", "Tombstones that clean dropped (past delete.retention.ms).", |s| {
                s.tombstones_removed as f64
            }),
        ];
        for (name, help, stat) in stats {
            family(&mut out, name, Kind::Gauge, help);
            for (labels, s) in &cleaned {
                sample(&mut out, name, labels, stat(s));
            }
        }
        out
    }
}

/// The error codes of a typed response: one per partition, topic, resource or group
/// that failed (top-level codes included).
pub(crate) fn response_errors(body: &ResponseKind) -> Vec<i16> {
    match body {
        ResponseKind::ApiVersions(r) => vec![r.error_code],
        ResponseKind::Produce(r) => r.responses.iter().flat_map(|t| &t.partition_responses).map(|p| p.error_code).collect(),
        ResponseKind::ListOffsets(r) => r.topics.iter().flat_map(|t| &t.partitions).map(|p| p.error_code).collect(),
        ResponseKind::Metadata(r) => {
            r.topics.iter().flat_map(|t| std::iter::once(t.error_code).chain(t.partitions.iter().map(|p| p.error_code))).collect()
        }
        ResponseKind::CreateTopics(r) => r.topics.iter().map(|t| t.error_code).collect(),
        ResponseKind::DeleteTopics(r) => r.responses.iter().map(|t| t.error_code).collect(),
        ResponseKind::DescribeConfigs(r) => r.results.iter().map(|t| t.error_code).collect(),
        ResponseKind::AlterConfigs(r) => r.responses.iter().map(|t| t.error_code).collect(),
        ResponseKind::IncrementalAlterConfigs(r) => r.responses.iter().map(|t| t.error_code).collect(),
        ResponseKind::FindCoordinator(r) => {
            std::iter::once(r.error_code).chain(r.coordinators.iter().map(|c| c.error_code)).collect()
        }
        ResponseKind::JoinGroup(r) => vec![r.error_code],
        ResponseKind::SyncGroup(r) => vec![r.error_code],
        ResponseKind::Heartbeat(r) => vec![r.error_code],
        ResponseKind::LeaveGroup(r) => std::iter::once(r.error_code).chain(r.members.iter().map(|m| m.error_code)).collect(),
        ResponseKind::OffsetCommit(r) => r.topics.iter().flat_map(|t| &t.partitions).map(|p| p.error_code).collect(),
        ResponseKind::ListGroups(r) => vec![r.error_code],
        ResponseKind::DescribeGroups(r) => r.groups.iter().map(|g| g.error_code).collect(),
        ResponseKind::DeleteGroups(r) => r.results.iter().map(|g| g.error_code).collect(),
        ResponseKind::DescribeProducers(r) => r.topics.iter().flat_map(|t| &t.partitions).map(|p| p.error_code).collect(),
        ResponseKind::OffsetDelete(r) => {
            std::iter::once(r.error_code).chain(r.topics.iter().flat_map(|t| &t.partitions).map(|p| p.error_code)).collect()
        }
        ResponseKind::InitProducerId(r) => vec![r.error_code],
        // v0-7 answer in `topics`, v8+ per group in `groups`; the unused layout is empty.
        ResponseKind::OffsetFetch(r) => std::iter::once(r.error_code)
            .chain(r.topics.iter().flat_map(|t| &t.partitions).map(|p| p.error_code))
            .chain(r.groups.iter().flat_map(|g| {
                std::iter::once(g.error_code).chain(g.topics.iter().flat_map(|t| &t.partitions).map(|p| p.error_code))
            }))
            .collect(),
        ResponseKind::ElectLeaders(r) => std::iter::once(r.error_code)
            .chain(r.replica_election_results.iter().flat_map(|t| &t.partition_result).map(|p| p.error_code))
            .collect(),
        ResponseKind::OffsetForLeaderEpoch(r) => r.topics.iter().flat_map(|t| &t.partitions).map(|p| p.error_code).collect(),
        ResponseKind::CreateAcls(r) => r.results.iter().map(|c| c.error_code).collect(),
        ResponseKind::DescribeAcls(r) => vec![r.error_code],
        ResponseKind::DeleteAcls(r) => r.filter_results.iter().map(|f| f.error_code).collect(),
        ResponseKind::DescribeUserScramCredentials(r) => {
            std::iter::once(r.error_code).chain(r.results.iter().map(|u| u.error_code)).collect()
        }
        ResponseKind::AlterUserScramCredentials(r) => r.results.iter().map(|u| u.error_code).collect(),
        ResponseKind::AlterPartitionReassignments(r) => {
            std::iter::once(r.error_code).chain(r.responses.iter().flat_map(|t| &t.partitions).map(|p| p.error_code)).collect()
        }
        ResponseKind::ListPartitionReassignments(r) => vec![r.error_code],
        ResponseKind::DescribeTopicPartitions(r) => {
            r.topics.iter().flat_map(|t| std::iter::once(t.error_code).chain(t.partitions.iter().map(|p| p.error_code))).collect()
        }
        ResponseKind::ListConfigResources(r) => vec![r.error_code],
        ResponseKind::UpdateFeatures(r) => std::iter::once(r.error_code).chain(r.results.iter().map(|f| f.error_code)).collect(),
        ResponseKind::AlterReplicaLogDirs(r) => r.results.iter().flat_map(|t| &t.partitions).map(|p| p.error_code).collect(),
        // APIs without an entry here count requests only.
        _ => Vec::new(),
    }
}

/// The error codes of a fetch response.
pub(crate) fn fetch_errors(data: &FetchResponseData) -> impl Iterator<Item = i16> + '_ {
    std::iter::once(data.error_code).chain(data.topics.iter().flat_map(|t| &t.partitions).map(|p| p.error_code))
}

/// The broker's page for [`fjord_metrics::endpoint`]: `/metrics`, rendered per scrape.
pub(crate) struct BrokerPages(pub(crate) Arc<Broker>);

impl fjord_metrics::endpoint::Pages for BrokerPages {
    fn page(&self, path: &str) -> Option<fjord_metrics::endpoint::Page> {
        (path == "/metrics").then(|| fjord_metrics::endpoint::Page {
            content_type: fjord_metrics::endpoint::PROMETHEUS,
            body: self.0.metrics.render(self.0.topics.logs(), self.0.groups.stats(), self.0.request_memory.stats()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::ApiKey;

    #[test]
    fn counters_render_by_api_and_error() {
        let dir = tempfile::tempdir().unwrap();
        let logs = LogDirs::open(vec![dir.path().to_path_buf()], fjord_log::LogConfig::default()).unwrap();
        let metrics = Metrics::default();
        metrics.request(ApiKey::Produce as i16);
        metrics.request(ApiKey::Produce as i16);
        metrics.request(999);
        metrics.errors(ApiKey::Produce as i16, [0, 10, 10]);
        metrics.malformed();
        metrics.throttled(QuotaKind::Produce, std::time::Duration::from_millis(1500));
        metrics.throttled(QuotaKind::Produce, std::time::Duration::ZERO);
        logs.get_or_create(&fjord_record::TopicPartition::new("t\"x", 0), fjord_log::LogConfig::default()).unwrap();
        let memory = RequestMemoryStats { frames: 3 << 20, decoded: 1 << 20, limit: 512 << 20, waits: 4 };
        let text = metrics.render(&logs, GroupStats { in_memory: 7, ticked: 2, offsets_expired: 11 }, memory);
        assert!(text.contains("fjord_broker_request_memory_bytes{pool=\"frames\"} 3145728\n"), "{text}");
        assert!(text.contains("fjord_broker_request_memory_bytes{pool=\"decoded\"} 1048576\n"), "{text}");
        assert!(text.contains("fjord_broker_request_memory_limit_bytes 536870912\n"), "{text}");
        assert!(text.contains("fjord_broker_request_memory_waits_total 4\n"), "{text}");
        assert!(text.contains("fjord_broker_requests_total{api=\"Produce\"} 2\n"), "{text}");
        assert!(text.contains("fjord_broker_requests_total{api=\"unknown\"} 1\n"), "{text}");
        assert!(
            text.contains("fjord_broker_request_errors_total{api=\"Produce\",error=\"MessageTooLarge\",code=\"10\"} 2\n"),
            "{text}"
        );
        assert!(text.contains("fjord_broker_malformed_requests_total 1\n"), "{text}");
        assert!(text.contains("fjord_broker_groups_in_memory 7\n"), "{text}");
        assert!(text.contains("fjord_broker_groups_active 2\n"), "{text}");
        assert!(text.contains("fjord_broker_group_offsets_expired_total 11\n"), "{text}");
        assert!(text.contains("fjord_broker_quota_throttles_total{quota=\"produce\"} 1\n"), "{text}");
        assert!(text.contains("fjord_broker_quota_throttle_seconds_total{quota=\"produce\"} 1.5\n"), "{text}");
        assert!(text.contains("fjord_broker_quota_throttles_total{quota=\"request\"} 0\n"), "{text}");
        assert!(text.contains("fjord_broker_log_end_offset{topic=\"t\\\"x\",partition=\"0\"} 0\n"), "{text}");
        // Error codes come from every layer of a response.
        use kafka_protocol::messages::{offset_fetch_response as of, produce_response as pr};
        let produce =
            pr::ProduceResponse::default().with_responses(vec![pr::TopicProduceResponse::default().with_partition_responses(
                vec![pr::PartitionProduceResponse::default(), pr::PartitionProduceResponse::default().with_error_code(10)],
            )]);
        assert_eq!(response_errors(&ResponseKind::Produce(produce)), [0, 10]);
        let fetched = of::OffsetFetchResponse::default().with_groups(vec![of::OffsetFetchResponseGroup::default()
            .with_error_code(16)
            .with_topics(vec![
                of::OffsetFetchResponseTopics::default().with_partitions(vec![of::OffsetFetchResponsePartitions::default()])
            ])]);
        assert_eq!(response_errors(&ResponseKind::OffsetFetch(fetched)), [0, 16, 0]);
        // Every sample line belongs to a family declared before it.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap();
            assert!(text.contains(&format!("# TYPE {name} ")), "{line}");
        }
    }
}
