//! The audit record: what one tier on one host counted for one topic and window since its
//! previous publish. Encoded as one JSON object per Kafka record value on `_audit`
//! (keyed by the counted topic), so any Kafka tool can read it.

use serde::{Deserialize, Serialize};

/// The monitoring topic the counters publish to and the report reads.
pub const AUDIT_TOPIC: &str = "_audit";

/// The tier the brokers count their appends under (`audit.enable` in the broker config).
pub const BROKER_TIER: &str = "broker";

/// The tier of events a producing tier took in for a topic but set aside in a dead-letter
/// topic (the gateway's `?on_invalid=dead_letter`): counted under the topic they were
/// meant for, so its report shows what came in (producing + dead-lettered) and still
/// balances, since the dead letters were never meant to reach its downstream tiers. They
/// are counted again, as ordinary events, under the dead-letter topic.
pub const DEAD_LETTER_TIER: &str = "dead_letter";

/// What the report appends to the tier of a read_committed consumer's counts
/// ([`AuditRecord::isolation`]), so they stand apart from read_uncommitted consumers of
/// the same tier, which also count aborted transactions' records.
pub const READ_COMMITTED_SUFFIX: &str = " (read_committed)";

/// Default window length: 10 minutes of event creation time.
pub const DEFAULT_WINDOW_MS: i64 = 10 * 60 * 1000;

/// Header holding an event's creation time, ms since the epoch as decimal text (stamped
/// by the gateway, which re-exports this constant as `fjord_gateway::CREATED_HEADER`).
pub const CREATED_HEADER: &str = "fjord.created_ms";

/// Header of a dead letter (a record a tier set aside in a dead-letter topic: the
/// gateway's invalid lines, the mirror's records the target refused) saying why.
pub const DEAD_LETTER_REASON_HEADER: &str = "fjord.dlq.reason";

/// Header of a dead letter naming the topic the record was meant for (the gateway's) or
/// came from (the mirror's source topic).
pub const DEAD_LETTER_TOPIC_HEADER: &str = "fjord.dlq.topic";

/// Topic where tiers record data they know is lost (today: the mirror's retention gaps),
/// one [`GapRecord`] per JSON value; the report lists them next to the counts.
pub const GAPS_TOPIC: &str = "_mirror_gaps";

/// Whether the audit counts `topic`: not the audit's own topics, the schema registry's
/// `_schemas`, nor Kafka's internal `__` topics (`__consumer_offsets`, ...).
pub fn audited_topic(topic: &str) -> bool {
    !matches!(topic, AUDIT_TOPIC | GAPS_TOPIC | "_schemas") && !topic.starts_with("__")
}

/// A range of offsets of a source partition that retention deleted before the mirror
/// copied it. The events' creation times are gone with them, so the report cannot place
/// the loss in a window; it lists the gap and the mirror tier falls short in some window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GapRecord {
    /// Source cluster alias.
    pub source: String,
    /// Source topic.
    pub topic: String,
    /// Source partition.
    pub partition: i32,
    /// First lost offset.
    pub first_offset: i64,
    /// Last lost offset (inclusive).
    pub last_offset: i64,
    /// `last_offset - first_offset + 1`.
    pub records: i64,
    /// When the gap was found (ms since the epoch).
    pub detected_ms: i64,
}

/// One audit record. Counts are deltas: the events of `topic` whose creation time falls in
/// `[window_start_ms, window_start_ms + window_ms)` that `tier` on `host` handled since its
/// previous record for that window. The report sums them, counting each `id` once, so a
/// publish repeated after a lost acknowledgement is harmless.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// Unique per publish: `host/tier/instance/sequence`.
    pub id: String,
    /// The pipeline stage: `producer`, `gateway`, `mirror`, `loader`, `consumer`, ...
    pub tier: String,
    /// The host that counted.
    pub host: String,
    /// Datacenter or cluster the tier runs in (e.g. `online`, `analytics`).
    pub cluster: String,
    /// The counted topic.
    pub topic: String,
    /// Window start, ms since the epoch, a multiple of `window_ms`.
    pub window_start_ms: i64,
    /// Window length in ms.
    pub window_ms: i64,
    /// Events counted in this window since the previous record.
    pub count: u64,
    /// When the record was published (ms since the epoch), for people reading `_audit`.
    pub published_ms: i64,
    /// `read_committed` when the counts are a read_committed consumer's: records of
    /// aborted transactions are not among them, so they compare with producers that
    /// count only committed transactions. Absent otherwise (and in older records).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<String>,
}

impl AuditRecord {
    /// Decodes a record value; `None` for anything that is not a well-formed record
    /// (bad JSON, missing fields, a window start that is not on a window boundary).
    pub fn decode(value: &[u8]) -> Option<Self> {
        let r: Self = serde_json::from_slice(value).ok()?;
        let sane = r.window_ms > 0
            && r.window_start_ms.rem_euclid(r.window_ms) == 0
            && !r.id.is_empty()
            && !r.tier.is_empty()
            && !r.topic.is_empty();
        sane.then_some(r)
    }

    /// The tier the report counts this record under: the tier, with
    /// [`READ_COMMITTED_SUFFIX`] for a read_committed consumer's counts.
    pub fn report_tier(&self) -> String {
        match self.isolation.as_deref() {
            Some("read_committed") => format!("{}{READ_COMMITTED_SUFFIX}", self.tier),
            _ => self.tier.clone(),
        }
    }

    /// The JSON encoding.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("an audit record always serializes")
    }
}

/// Start of the window holding `ms`.
pub fn window_start(ms: i64, window_ms: i64) -> i64 {
    ms - ms.rem_euclid(window_ms)
}

/// An event's creation time: the `fjord.created_ms` header when present and numeric,
/// else the record timestamp.
pub fn created_ms<'a>(headers: impl IntoIterator<Item = (&'a str, Option<&'a [u8]>)>, timestamp: i64) -> i64 {
    headers
        .into_iter()
        .find(|(k, _)| *k == CREATED_HEADER)
        .and_then(|(_, v)| std::str::from_utf8(v?).ok()?.trim().parse().ok())
        .unwrap_or(timestamp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_refuses_malformed_records() {
        let good = AuditRecord {
            id: "h/gateway/1/0".into(),
            tier: "gateway".into(),
            host: "h".into(),
            cluster: "online".into(),
            topic: "t".into(),
            window_start_ms: 600_000,
            window_ms: 600_000,
            count: 3,
            published_ms: 1,
            isolation: None,
        };
        assert_eq!(AuditRecord::decode(&good.encode()), Some(good.clone()));
        assert_eq!(AuditRecord::decode(b"not json"), None);
        assert_eq!(AuditRecord::decode(b"{\"tier\":\"x\"}"), None);
        let off_boundary = AuditRecord { window_start_ms: 5, ..good.clone() };
        assert_eq!(AuditRecord::decode(&off_boundary.encode()), None);
        let zero = AuditRecord { window_ms: 0, ..good };
        assert_eq!(AuditRecord::decode(&zero.encode()), None);
    }

    #[test]
    fn a_read_committed_consumers_counts_are_their_own_tier_and_older_records_still_decode() {
        let plain = AuditRecord {
            id: "h/consumer/1/0".into(),
            tier: "consumer".into(),
            host: "h".into(),
            cluster: "online".into(),
            topic: "t".into(),
            window_start_ms: 0,
            window_ms: 1000,
            count: 3,
            published_ms: 1,
            isolation: None,
        };
        // Without an isolation the JSON is what older tiers wrote, and their records decode.
        assert!(!String::from_utf8(plain.encode()).unwrap().contains("isolation"));
        assert_eq!(plain.report_tier(), "consumer");
        let committed = AuditRecord { isolation: Some("read_committed".into()), ..plain.clone() };
        assert_eq!(AuditRecord::decode(&committed.encode()), Some(committed.clone()));
        assert_eq!(committed.report_tier(), "consumer (read_committed)");
        // Anything else names no tier of its own.
        for other in ["read_uncommitted", "", "READ_COMMITTED", &"x".repeat(10_000)] {
            assert_eq!(AuditRecord { isolation: Some(other.into()), ..plain.clone() }.report_tier(), "consumer");
        }
        let bad_type = String::from_utf8(plain.encode()).unwrap().replace("\"count\"", "\"isolation\":7,\"count\"");
        assert_eq!(AuditRecord::decode(bad_type.as_bytes()), None, "{bad_type}");
    }

    #[test]
    fn creation_time_prefers_the_header() {
        assert_eq!(created_ms([(CREATED_HEADER, Some(&b"1234"[..]))], 9), 1234);
        assert_eq!(created_ms([("other", Some(&b"1234"[..]))], 9), 9);
        assert_eq!(created_ms([(CREATED_HEADER, Some(&b"x"[..]))], 9), 9);
        assert_eq!(created_ms([(CREATED_HEADER, None)], 9), 9);
        assert_eq!(window_start(1_234_567, 600_000), 1_200_000);
        assert_eq!(window_start(-1, 600_000), -600_000);
    }
}
