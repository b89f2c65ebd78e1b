//! Topic-level log settings, with Kafka's names and defaults.

use std::time::Duration;

use crate::{Error, Result};

/// How one partition's log behaves. Built from defaults, then overridden key by key
/// with [`LogConfig::set`] using Kafka's topic config names.
///
/// Kafka's "-1 means forever/never" values are `None` here.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LogConfig {
    /// `segment.bytes`: roll the active segment when an append would make it larger.
    /// Default 1 GiB; at most 2 GiB − 1 because index positions are 32-bit.
    pub segment_bytes: u64,
    /// `segment.ms`: roll when the incoming batch's timestamp is this much newer than
    /// the segment's first batch (Kafka's rule, so it follows record time). Default 7 days.
    pub segment_ms: Option<Duration>,
    /// `segment.index.bytes`: the most bytes an offset or time index may hold; a full
    /// index rolls the segment. Default 10 MiB.
    pub segment_index_bytes: u32,
    /// `index.interval.bytes`: log bytes between two sparse index entries. Default 4096.
    pub index_interval_bytes: u32,
    /// `retention.ms`: delete a sealed segment once its largest timestamp is older.
    /// Default 7 days; `None` (-1) keeps data forever.
    pub retention_ms: Option<Duration>,
    /// `retention.bytes`: delete the oldest sealed segments while the log is larger.
    /// Default `None` (-1): no size limit.
    pub retention_bytes: Option<u64>,
    /// `flush.messages`: fsync after this many records. Default `None`: the OS decides.
    pub flush_messages: Option<u64>,
    /// `flush.ms`: fsync when the last flush is this old (checked by
    /// [`crate::LogManager::flush_due`]). Default `None`.
    pub flush_ms: Option<Duration>,
    /// `max.message.bytes`: the largest batch accepted. Default 1048588 (Kafka's).
    pub max_message_bytes: u32,
    /// `file.delete.delay.ms`: how long deleted segments stay as `.deleted` files so
    /// readers that still hold them can finish. Default 60 s.
    pub file_delete_delay: Duration,
    /// `cleanup.policy`: `delete` (default), `compact` or `compact,delete`. Without
    /// `delete`, `retention.ms` and `retention.bytes` delete nothing.
    pub cleanup_policy: CleanupPolicy,
    /// `delete.retention.ms`: how long a tombstone (a record with a null value) stays
    /// after the cleaner first passed over it. Default 24 h.
    pub delete_retention: Duration,
    /// `min.cleanable.dirty.ratio`: clean when the bytes not yet cleaned are at least
    /// this share of the cleanable bytes. Default 0.5; between 0 and 1.
    pub min_cleanable_dirty_ratio: f64,
    /// `min.compaction.lag.ms`: a segment whose largest timestamp is younger than this
    /// is not cleaned yet. Default 0.
    pub min_compaction_lag: Duration,
    /// `min.insync.replicas`: an acks=all produce needs at least this many replicas in
    /// the ISR. Not used by the log itself; it lives here because it is a topic config
    /// with a broker-wide default, like the rest. Default 1.
    pub min_insync_replicas: u32,
    /// `producer.id.expiration.ms`: forget an idempotent producer after this long
    /// without a batch (by batch timestamp, as Kafka). A broker key, not a topic key,
    /// so [`LogConfig::set`] does not take it; the broker copies it in. Default 1 day.
    pub producer_id_expiration: Duration,
    /// `producer.id.max.per.partition` (Fjord's): how many producer ids one partition
    /// remembers. Past it, the longest idle ones without an open transaction are
    /// forgotten (down to nine tenths of it), as expiry would forget them later. Kafka
    /// bounds them by time alone, and any client can make up producer ids: a batch with
    /// a new one is accepted at sequence 0, so at a few thousand batches a second one
    /// client filled a day's worth of entries, a few hundred bytes each, in every
    /// partition it wrote to. A producer forgotten this way only loses the recognition of
    /// retries of its last batches; its next batch starts its entry again. A broker key,
    /// copied in like `producer.id.expiration.ms`. Default 10 000.
    pub max_producers: usize,
    /// `preallocate`: reserve the active segment's disk blocks ahead of its writes, a
    /// few MiB at a time (`fallocate` with `FALLOC_FL_KEEP_SIZE`, so the file's length
    /// stays the length of its data and recovery and readers see no difference).
    /// Writing into reserved blocks skips the file system's per-write allocation work:
    /// measured on ext4 here, 1 MiB writes went from 6.0 to 9.2 GB/s of CPU time.
    /// Sealing a segment gives back what it did not use. Default true: Kafka's
    /// `preallocate` (default false) sizes the whole segment file up front and cuts it
    /// back on roll; this one reserves a step at a time and never changes the file's
    /// length, so it costs at most a few MiB of disk per partition. Where the file
    /// system cannot reserve, the log writes as without it.
    pub preallocate: bool,
    /// `compression.type`: the codec batches are stored with. `producer` (the default)
    /// keeps each batch as its producer compressed it; a codec makes the leader
    /// recompress every batch written with another one (the broker does it before the
    /// append, as Kafka's leader does).
    pub compression_type: CompressionType,
    /// `message.timestamp.type`: `CreateTime` (the default) keeps the producer's
    /// timestamps; `LogAppendTime` makes the leader stamp each batch with the time it
    /// appends it (max timestamp and the timestamp-type attribute, as Kafka does).
    pub message_timestamp_type: MessageTimestampType,
    /// `message.timestamp.before.max.ms` (KIP-937): with `CreateTime`, how far behind
    /// the leader's clock a producer's timestamp may be; an older record is refused
    /// (INVALID_TIMESTAMP). Default `None`, Kafka's Long.MAX_VALUE: no limit.
    pub message_timestamp_before_max: Option<Duration>,
    /// `message.timestamp.after.max.ms` (KIP-937): with `CreateTime`, how far ahead of
    /// the leader's clock a producer's timestamp may be. Default one hour, Kafka 4.0's
    /// (KIP-1030). Why a limit: time retention deletes a segment once its largest
    /// timestamp is older than `retention.ms`, so one batch stamped years ahead, by a
    /// wrong clock or on purpose, kept its segment and every later one on disk for
    /// those years.
    pub message_timestamp_after_max: Option<Duration>,
    /// `max.compaction.lag.ms`: on a compacted log, the longest a record may stay
    /// uncompacted: its segment rolls by then and is cleaned whatever the dirty ratio.
    /// Default `None` (Kafka's Long.MAX_VALUE): only the dirty ratio triggers cleaning.
    pub max_compaction_lag: Option<Duration>,
    /// The smallest `segment.bytes` a topic (or `log.segment.bytes`) may set: broker key
    /// `log.min.segment.bytes`, not a topic key, so [`LogConfig::set`] does not take it
    /// and clients cannot lower it. Default 1 MiB, Kafka 4.0's floor (KIP-1030; Kafka
    /// allowed 14 bytes before). Why a floor: every segment costs three files (inodes,
    /// a 4 KiB block each), memory for its entry in the segment list (copied on each
    /// roll), the index checks on open, and a descriptor while it is read. With
    /// `segment.bytes=61`, one segment per record, 18,500 records meant 18,500
    /// segments: at 1 MiB the same count holds 18 GiB, and that overhead stays below
    /// 0.1% of the data. At least 61 bytes (one batch header).
    pub min_segment_bytes: u64,
}

// `check` rejects a NaN ratio, so equality is reflexive.
impl Eq for LogConfig {}

/// `cleanup.policy`: what happens to old segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CleanupPolicy {
    /// Delete whole segments by `retention.ms` / `retention.bytes`.
    #[default]
    Delete,
    /// Keep the latest record per key (log compaction); no retention.
    Compact,
    /// Both: compact, and delete old segments by retention.
    CompactDelete,
}

impl CleanupPolicy {
    /// Whether the cleaner compacts this log.
    pub fn compacts(self) -> bool {
        matches!(self, Self::Compact | Self::CompactDelete)
    }

    /// Whether retention deletes old segments.
    pub fn deletes(self) -> bool {
        matches!(self, Self::Delete | Self::CompactDelete)
    }

    /// Kafka's spelling: `delete`, `compact`, `compact,delete`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Delete => "delete",
            Self::Compact => "compact",
            Self::CompactDelete => "compact,delete",
        }
    }

    /// Parses Kafka's list syntax (order and spaces do not matter).
    pub fn parse(value: &str) -> Option<Self> {
        let (mut compact, mut delete) = (false, false);
        for item in value.split(',') {
            match item.trim() {
                "compact" => compact = true,
                "delete" => delete = true,
                _ => return None,
            }
        }
        match (compact, delete) {
            (true, true) => Some(Self::CompactDelete),
            (true, false) => Some(Self::Compact),
            (false, true) => Some(Self::Delete),
            (false, false) => None,
        }
    }
}

/// `compression.type`: what codec the log stores batches with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CompressionType {
    /// As the producer sent them.
    #[default]
    Producer,
    /// Recompressed to no compression.
    Uncompressed,
    /// Recompressed to gzip.
    Gzip,
    /// Recompressed to snappy.
    Snappy,
    /// Recompressed to lz4.
    Lz4,
    /// Recompressed to zstd.
    Zstd,
}

impl CompressionType {
    /// Kafka's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Producer => "producer",
            Self::Uncompressed => "uncompressed",
            Self::Gzip => "gzip",
            Self::Snappy => "snappy",
            Self::Lz4 => "lz4",
            Self::Zstd => "zstd",
        }
    }

    /// Parses Kafka's spelling.
    pub fn parse(value: &str) -> Option<Self> {
        [Self::Producer, Self::Uncompressed, Self::Gzip, Self::Snappy, Self::Lz4, Self::Zstd]
            .into_iter()
            .find(|c| c.as_str() == value.trim())
    }

    /// The codec batches are rewritten to; `None` for `producer` (kept as sent).
    pub fn codec(self) -> Option<fjord_record::Compression> {
        use fjord_record::Compression;
        match self {
            Self::Producer => None,
            Self::Uncompressed => Some(Compression::None),
            Self::Gzip => Some(Compression::Gzip),
            Self::Snappy => Some(Compression::Snappy),
            Self::Lz4 => Some(Compression::Lz4),
            Self::Zstd => Some(Compression::Zstd),
        }
    }
}

/// `message.timestamp.type`: whose clock the stored timestamps are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MessageTimestampType {
    /// The producer's.
    #[default]
    CreateTime,
    /// The leader's, at append.
    LogAppendTime,
}

impl MessageTimestampType {
    /// Kafka's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::CreateTime => "CreateTime",
            Self::LogAppendTime => "LogAppendTime",
        }
    }
}

const DAY: Duration = Duration::from_secs(24 * 3600);
/// Positions in the offset index are u32, and Kafka keeps them below i32::MAX.
const MAX_SEGMENT_BYTES: u64 = i32::MAX as u64;
/// A segment must fit at least one batch header.
const MIN_SEGMENT_BYTES: u64 = fjord_record::BATCH_OVERHEAD as u64;
/// Default of [`LogConfig::min_segment_bytes`] (see there for why).
pub const DEFAULT_MIN_SEGMENT_BYTES: u64 = 1 << 20;

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            segment_bytes: 1 << 30,
            segment_ms: Some(7 * DAY),
            segment_index_bytes: 10 << 20,
            index_interval_bytes: 4096,
            retention_ms: Some(7 * DAY),
            retention_bytes: None,
            flush_messages: None,
            flush_ms: None,
            max_message_bytes: 1_048_588,
            file_delete_delay: Duration::from_secs(60),
            cleanup_policy: CleanupPolicy::Delete,
            delete_retention: DAY,
            min_cleanable_dirty_ratio: 0.5,
            min_compaction_lag: Duration::ZERO,
            min_insync_replicas: 1,
            producer_id_expiration: DAY,
            max_producers: 10_000,
            preallocate: true,
            compression_type: CompressionType::Producer,
            message_timestamp_type: MessageTimestampType::CreateTime,
            message_timestamp_before_max: None,
            message_timestamp_after_max: Some(Duration::from_secs(3600)),
            max_compaction_lag: None,
            min_segment_bytes: DEFAULT_MIN_SEGMENT_BYTES,
        }
    }
}

/// How far the compressed batches of one leader append may expand, as a multiple of
/// `max.message.bytes` (see [`LogConfig::max_decompressed_bytes`]).
///
/// Why 32: the leader decompresses a client's batches once to check their records, so
/// this bounds the memory and CPU one append can cost (32 MiB at the default 1 MiB
/// `max.message.bytes`; a 10 KB zstd batch of zeros could otherwise expand to hundreds
/// of MB). Real producers stay far below it: librdkafka caps a batch at about 1 MB before
/// compression, and the Java client sizes batches by their compressed size, where text
/// and JSON compress 3 to 15 times. A batch beyond it is refused with MESSAGE_TOO_LARGE
/// and a message naming this limit; raising `max.message.bytes` raises it.
pub const DECOMPRESSION_FACTOR: usize = 32;

impl LogConfig {
    /// The most the compressed batches of one leader append may expand to:
    /// [`DECOMPRESSION_FACTOR`] times `max.message.bytes`.
    pub fn max_decompressed_bytes(&self) -> usize {
        (self.max_message_bytes as usize).saturating_mul(DECOMPRESSION_FACTOR)
    }

    /// The Kafka topic config names [`LogConfig::set`] understands.
    pub const KEYS: &'static [&'static str] = &[
        "segment.bytes",
        "segment.ms",
        "segment.index.bytes",
        "index.interval.bytes",
        "retention.ms",
        "retention.bytes",
        "flush.messages",
        "flush.ms",
        "max.message.bytes",
        "file.delete.delay.ms",
        "cleanup.policy",
        "delete.retention.ms",
        "min.cleanable.dirty.ratio",
        "min.compaction.lag.ms",
        "min.insync.replicas",
        "preallocate",
        "compression.type",
        "message.timestamp.type",
        "message.timestamp.before.max.ms",
        "message.timestamp.after.max.ms",
        "max.compaction.lag.ms",
    ];

    /// Kafka topic keys that [`LogConfig::set`] accepts and ignores, with why: they
    /// have no effect in this broker, and refusing them would fail the tools that send
    /// them (older tools and Terraform providers send `message.format.version`). Each
    /// value is still checked as Kafka checks its type.
    pub const IGNORED_KEYS: &'static [(&'static str, &'static str)] = &[
        ("message.format.version", "batches are always stored in the v2 format (Kafka 3.0 deprecated the key)"),
        ("message.downconversion.enable", "old fetch versions get the v2 batches as stored: nothing is down-converted"),
        ("segment.jitter.ms", "segments roll at segment.ms exactly; the jitter only spreads rolls in time"),
    ];

    /// Sets one value by its Kafka topic config name, e.g. `set("retention.ms", "-1")`.
    /// An unknown key or an unparsable or out-of-range value is an
    /// [`Error::InvalidConfig`] and leaves `self` unchanged.
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let bad = |reason| Error::InvalidConfig { key: key.to_owned(), value: value.to_owned(), reason };
        let int = || value.trim().parse::<i64>().map_err(|_| bad("not an integer"));
        // Kafka spells "never" as -1 and, for the flush settings, as Long.MAX_VALUE.
        let optional = |v: i64| -> Result<Option<u64>> {
            match v {
                -1 | i64::MAX => Ok(None),
                v if v < 0 => Err(bad("must be -1 or >= 0")),
                v => Ok(Some(v as u64)),
            }
        };
        let non_negative = |v: i64| u64::try_from(v).map_err(|_| bad("must be >= 0"));
        // Kafka's Long.MAX_VALUE is "no limit"; there is no -1 here.
        let limit = |v: i64| -> Result<Option<Duration>> {
            match v {
                i64::MAX => Ok(None),
                v => Ok(Some(Duration::from_millis(non_negative(v)?))),
            }
        };
        let u32_value = |v: i64| u32::try_from(v).map_err(|_| bad("must be between 0 and 4294967295"));
        let mut next = *self;
        match key {
            "segment.bytes" => next.segment_bytes = non_negative(int()?)?,
            "segment.ms" => next.segment_ms = optional(int()?)?.map(Duration::from_millis),
            "segment.index.bytes" => next.segment_index_bytes = u32_value(int()?)?,
            "index.interval.bytes" => next.index_interval_bytes = u32_value(int()?)?,
            "retention.ms" => next.retention_ms = optional(int()?)?.map(Duration::from_millis),
            "retention.bytes" => next.retention_bytes = optional(int()?)?,
            "flush.messages" => next.flush_messages = optional(int()?)?,
            "flush.ms" => next.flush_ms = optional(int()?)?.map(Duration::from_millis),
            "max.message.bytes" => next.max_message_bytes = u32_value(int()?)?,
            "file.delete.delay.ms" => next.file_delete_delay = Duration::from_millis(non_negative(int()?)?),
            "cleanup.policy" => {
                next.cleanup_policy = CleanupPolicy::parse(value).ok_or(bad("must be delete, compact or compact,delete"))?
            }
            "delete.retention.ms" => next.delete_retention = Duration::from_millis(non_negative(int()?)?),
            "min.cleanable.dirty.ratio" => {
                next.min_cleanable_dirty_ratio = value.trim().parse::<f64>().map_err(|_| bad("not a number"))?
            }
            "min.compaction.lag.ms" => next.min_compaction_lag = Duration::from_millis(non_negative(int()?)?),
            "min.insync.replicas" => next.min_insync_replicas = u32_value(int()?)?,
            "preallocate" => next.preallocate = value.trim().parse::<bool>().map_err(|_| bad("must be true or false"))?,
            "compression.type" => {
                next.compression_type =
                    CompressionType::parse(value).ok_or(bad("must be producer, uncompressed, gzip, snappy, lz4 or zstd"))?
            }
            "message.timestamp.type" => {
                next.message_timestamp_type = match value.trim() {
                    "CreateTime" => MessageTimestampType::CreateTime,
                    "LogAppendTime" => MessageTimestampType::LogAppendTime,
                    _ => return Err(bad("must be CreateTime or LogAppendTime")),
                }
            }
            "message.timestamp.before.max.ms" => next.message_timestamp_before_max = limit(int()?)?,
            "message.timestamp.after.max.ms" => next.message_timestamp_after_max = limit(int()?)?,
            "max.compaction.lag.ms" => {
                next.max_compaction_lag = match int()? {
                    i64::MAX => None,
                    v if v >= 1 => Some(Duration::from_millis(v as u64)),
                    _ => return Err(bad("must be at least 1")),
                }
            }
            "message.downconversion.enable" => {
                value.trim().parse::<bool>().map_err(|_| bad("must be true or false"))?;
            }
            "segment.jitter.ms" => {
                non_negative(int()?)?;
            }
            // The throttled-replica lists are the broker's (its replication throttles read
            // and validate them); the log has no use for them.
            "message.format.version" | "leader.replication.throttled.replicas" | "follower.replication.throttled.replicas" => {}
            _ => return Err(bad("unknown log config")),
        }
        next.check().map_err(bad)?;
        next.check_floor()?;
        *self = next;
        Ok(())
    }

    /// The current values as Kafka config name and string value (for DescribeConfigs).
    pub fn entries(&self) -> Vec<(&'static str, String)> {
        let ms = |d: Option<Duration>| d.map_or("-1".to_owned(), |d| d.as_millis().to_string());
        let opt = |v: Option<u64>| v.map_or("-1".to_owned(), |v| v.to_string());
        // Kafka's Long.MAX_VALUE for "no limit".
        let limit = |d: Option<Duration>| d.map_or(i64::MAX as u128, |d| d.as_millis()).to_string();
        vec![
            ("segment.bytes", self.segment_bytes.to_string()),
            ("segment.ms", ms(self.segment_ms)),
            ("segment.index.bytes", self.segment_index_bytes.to_string()),
            ("index.interval.bytes", self.index_interval_bytes.to_string()),
            ("retention.ms", ms(self.retention_ms)),
            ("retention.bytes", opt(self.retention_bytes)),
            ("flush.messages", opt(self.flush_messages)),
            ("flush.ms", ms(self.flush_ms)),
            ("max.message.bytes", self.max_message_bytes.to_string()),
            ("file.delete.delay.ms", self.file_delete_delay.as_millis().to_string()),
            ("cleanup.policy", self.cleanup_policy.as_str().to_owned()),
            ("delete.retention.ms", self.delete_retention.as_millis().to_string()),
            ("min.cleanable.dirty.ratio", self.min_cleanable_dirty_ratio.to_string()),
            ("min.compaction.lag.ms", self.min_compaction_lag.as_millis().to_string()),
            ("min.insync.replicas", self.min_insync_replicas.to_string()),
            ("preallocate", self.preallocate.to_string()),
            ("compression.type", self.compression_type.as_str().to_owned()),
            ("message.timestamp.type", self.message_timestamp_type.as_str().to_owned()),
            ("message.timestamp.before.max.ms", limit(self.message_timestamp_before_max)),
            ("message.timestamp.after.max.ms", limit(self.message_timestamp_after_max)),
            ("max.compaction.lag.ms", limit(self.max_compaction_lag)),
        ]
    }

    /// The timestamps a leader takes from producers when its clock reads `now_ms`
    /// (inclusive), by `message.timestamp.before.max.ms` and `.after.max.ms`; `None`
    /// when it takes any: with `LogAppendTime` (the leader's clock replaces them) or
    /// neither limit set.
    pub fn accepted_timestamps(&self, now_ms: i64) -> Option<std::ops::RangeInclusive<i64>> {
        if self.message_timestamp_type == MessageTimestampType::LogAppendTime {
            return None;
        }
        let millis = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        match (self.message_timestamp_before_max, self.message_timestamp_after_max) {
            (None, None) => None,
            (before, after) => Some(
                before.map_or(i64::MIN, |d| now_ms.saturating_sub(millis(d)))
                    ..=after.map_or(i64::MAX, |d| now_ms.saturating_add(millis(d))),
            ),
        }
    }

    /// How old the active segment's first batch may get before the segment rolls:
    /// `segment.ms`, or `max.compaction.lag.ms` when that is shorter on a compacted
    /// log (Kafka's rule), so that a record is in a sealed segment, which the cleaner
    /// can clean, by the time its lag runs out.
    pub fn roll_after(&self) -> Option<Duration> {
        match (self.segment_ms, self.max_compaction_lag.filter(|_| self.cleanup_policy.compacts())) {
            (Some(segment), Some(lag)) => Some(segment.min(lag)),
            (segment, lag) => segment.or(lag),
        }
    }

    /// Checks the values against each other and the format's limits.
    pub fn validate(&self) -> Result<()> {
        self.check().map_err(|reason| Error::InvalidConfig {
            key: "log config".to_owned(),
            value: format!("{self:?}"),
            reason,
        })?;
        self.check_floor()
    }

    /// Sets the broker's floor under `segment.bytes` (`log.min.segment.bytes`).
    pub fn set_min_segment_bytes(&mut self, value: &str) -> Result<()> {
        let bad = |reason| Error::InvalidConfig { key: "log.min.segment.bytes".to_owned(), value: value.to_owned(), reason };
        let min: u64 = value.trim().parse().map_err(|_| bad("not a non-negative integer"))?;
        if !(MIN_SEGMENT_BYTES..=MAX_SEGMENT_BYTES).contains(&min) {
            return Err(bad("must be between 61 (one batch header) and 2147483647"));
        }
        self.min_segment_bytes = min;
        Ok(())
    }

    fn check_floor(&self) -> Result<()> {
        if self.segment_bytes < self.min_segment_bytes {
            return Err(Error::SegmentBytesBelowFloor { value: self.segment_bytes, min: self.min_segment_bytes });
        }
        Ok(())
    }

    fn check(&self) -> std::result::Result<(), &'static str> {
        if !(MIN_SEGMENT_BYTES..=MAX_SEGMENT_BYTES).contains(&self.min_segment_bytes) {
            return Err("log.min.segment.bytes must be between 61 and 2147483647");
        }
        if !(MIN_SEGMENT_BYTES..=MAX_SEGMENT_BYTES).contains(&self.segment_bytes) {
            return Err("segment.bytes must be between 61 and 2147483647");
        }
        if self.segment_index_bytes < 64 {
            return Err("segment.index.bytes must be at least 64");
        }
        if self.max_message_bytes as usize <= fjord_record::BATCH_OVERHEAD {
            return Err("max.message.bytes must be larger than a batch header (61)");
        }
        if self.segment_ms == Some(Duration::ZERO) {
            return Err("segment.ms must be positive");
        }
        if self.min_insync_replicas == 0 {
            return Err("min.insync.replicas must be at least 1");
        }
        if self.flush_messages == Some(0) {
            return Err("flush.messages must be positive");
        }
        if !(0.0..=1.0).contains(&self.min_cleanable_dirty_ratio) {
            return Err("min.cleanable.dirty.ratio must be between 0 and 1");
        }
        if self.max_compaction_lag.is_some_and(|max| max < self.min_compaction_lag) {
            return Err("max.compaction.lag.ms must not be less than min.compaction.lag.ms");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_uses_kafka_names_and_minus_one_means_never() {
        let mut c = LogConfig::default();
        c.set("retention.ms", "-1").unwrap();
        c.set("segment.bytes", "1048576").unwrap();
        c.set("flush.messages", "9223372036854775807").unwrap();
        c.set("flush.ms", "1000").unwrap();
        assert_eq!(c.retention_ms, None);
        assert_eq!(c.segment_bytes, 1 << 20);
        assert_eq!(c.flush_messages, None);
        assert_eq!(c.flush_ms, Some(Duration::from_secs(1)));
        c.set("cleanup.policy", "delete, compact").unwrap();
        assert_eq!(c.cleanup_policy, CleanupPolicy::CompactDelete);
        c.set("min.cleanable.dirty.ratio", "0.25").unwrap();
        assert_eq!(c.min_cleanable_dirty_ratio, 0.25);
        c.set("preallocate", "false").unwrap();
        assert!(!c.preallocate);
        for key in LogConfig::KEYS {
            let value = c.entries().into_iter().find(|(k, _)| k == key).unwrap().1;
            let mut d = LogConfig::default();
            d.set(key, &value).unwrap();
        }
    }

    #[test]
    fn timestamp_limits_are_kafkas_and_long_max_means_none() {
        let mut c = LogConfig::default();
        let now = 1_700_000_000_000;
        // Kafka 4.0's defaults: an hour ahead, any time behind.
        assert_eq!(c.accepted_timestamps(now), Some(i64::MIN..=now + 3_600_000));
        c.set("message.timestamp.before.max.ms", "86400000").unwrap();
        c.set("message.timestamp.after.max.ms", "0").unwrap();
        assert_eq!(c.accepted_timestamps(now), Some(now - 86_400_000..=now));
        assert!(c.set("message.timestamp.after.max.ms", "-1").is_err());
        assert_eq!(c.message_timestamp_after_max, Some(Duration::ZERO), "a refused value changes nothing");
        c.set("message.timestamp.before.max.ms", "9223372036854775807").unwrap();
        c.set("message.timestamp.after.max.ms", "9223372036854775807").unwrap();
        assert_eq!(c.accepted_timestamps(now), None);
        let entries = c.entries();
        assert!(entries.contains(&("message.timestamp.after.max.ms", i64::MAX.to_string())), "{entries:?}");
        // The leader's clock replaces producers' timestamps: nothing to check.
        c.set("message.timestamp.after.max.ms", "1000").unwrap();
        c.set("message.timestamp.type", "LogAppendTime").unwrap();
        assert_eq!(c.accepted_timestamps(now), None);
    }

    #[test]
    fn compression_timestamp_type_and_max_compaction_lag() {
        let mut c = LogConfig::default();
        assert_eq!((c.compression_type, c.message_timestamp_type, c.max_compaction_lag), Default::default());
        c.set("compression.type", "zstd").unwrap();
        assert_eq!(c.compression_type.codec(), Some(fjord_record::Compression::Zstd));
        c.set("compression.type", "producer").unwrap();
        assert_eq!(c.compression_type.codec(), None);
        c.set("message.timestamp.type", "LogAppendTime").unwrap();
        assert_eq!(c.message_timestamp_type, MessageTimestampType::LogAppendTime);
        c.set("max.compaction.lag.ms", "60000").unwrap();
        assert_eq!(c.max_compaction_lag, Some(Duration::from_secs(60)));
        // Below min.compaction.lag.ms it would never hold.
        assert!(c.set("min.compaction.lag.ms", "120000").is_err());
        c.set("max.compaction.lag.ms", "9223372036854775807").unwrap();
        assert_eq!(c.max_compaction_lag, None);
        // Accepted and ignored, each value still checked for its type.
        let before = c;
        for (key, _) in LogConfig::IGNORED_KEYS {
            let value = match *key {
                "message.downconversion.enable" => "false",
                "segment.jitter.ms" => "100",
                _ => "*",
            };
            c.set(key, value).unwrap();
        }
        assert_eq!(c, before);
    }

    #[test]
    fn segment_bytes_has_a_floor_that_only_the_broker_lowers() {
        let mut c = LogConfig::default();
        // Case 5 of issue 26: 61 bytes (one batch header) made one segment per record.
        let e = c.set("segment.bytes", "61").unwrap_err();
        assert!(matches!(e, Error::SegmentBytesBelowFloor { value: 61, min: 1_048_576 }), "{e}");
        assert!(
            e.to_string().contains("segment.bytes=61: below the floor of 1048576 bytes (broker key log.min.segment.bytes)"),
            "{e}"
        );
        assert!(c.set("segment.bytes", "1048575").is_err());
        c.set("segment.bytes", "1048576").unwrap();
        // Topic keys cannot lower the floor; the broker key can, down to one batch header.
        assert!(c.set("log.min.segment.bytes", "61").is_err());
        assert!(c.set_min_segment_bytes("60").is_err());
        c.set_min_segment_bytes("4096").unwrap();
        c.set("segment.bytes", "4096").unwrap();
        assert!(matches!(c.set("segment.bytes", "4095"), Err(Error::SegmentBytesBelowFloor { value: 4095, min: 4096 })));
        let direct = LogConfig { segment_bytes: 100, ..LogConfig::default() };
        assert!(matches!(direct.validate(), Err(Error::SegmentBytesBelowFloor { .. })));
    }

    #[test]
    fn bad_keys_and_values_are_typed_errors_and_change_nothing() {
        let mut c = LogConfig::default();
        for (k, v) in [
            ("no.such.key", "1"),
            ("segment.bytes", "abc"),
            ("segment.bytes", "10"),
            ("segment.bytes", "4294967296"),
            ("retention.ms", "-5"),
            ("max.message.bytes", "-1"),
            ("flush.messages", "0"),
            ("cleanup.policy", "compact,shred"),
            ("cleanup.policy", ""),
            ("min.cleanable.dirty.ratio", "1.5"),
            ("min.cleanable.dirty.ratio", "NaN"),
            ("delete.retention.ms", "-1"),
            ("preallocate", "yes"),
            ("compression.type", "brotli"),
            ("compression.type", "ZSTD"),
            ("message.timestamp.type", "createtime"),
            ("message.timestamp.after.max.ms", "-1"),
            ("message.timestamp.after.max.ms", "9223372036854775808"),
            ("message.timestamp.before.max.ms", "an hour"),
            ("max.compaction.lag.ms", "0"),
            ("message.downconversion.enable", "maybe"),
            ("segment.jitter.ms", "-1"),
        ] {
            assert!(matches!(c.set(k, v), Err(Error::InvalidConfig { .. })), "{k}={v}");
        }
        assert_eq!(c, LogConfig::default());
        c.validate().unwrap();
    }
}
