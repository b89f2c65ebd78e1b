//! `partition.metadata` (KIP-516): the id of the topic a partition directory's log
//! belongs to, in Kafka's text layout:
//!
//! ```text
//! version: 0
//! topic_id: 8Ut1C5GzQ9qHBCd6zLkDOA
//! ```
//!
//! (22 URL-safe base64 characters without padding, Kafka's `Uuid.toString`; Kafka writes
//! no newline after the id and reads one if present, and so does this module.)
//!
//! Why: a name is not a topic. A topic deleted and created again under the same name
//! while one of its replicas was down must not meet that replica's old log, which holds
//! another topic's records at the same offsets. The broker compares this file with the
//! topic's current id whenever it starts hosting a replica ([`decide`]):
//! - the same id: the log is this topic's;
//! - no file: a log written before topic ids, or a new replica; it is adopted (the id
//!   written), nothing deleted, since data is never deleted because metadata is missing;
//! - another id: the log is a stale replica of a deleted topic; it is moved aside whole
//!   (`<topic>-<p>-orphan-<ms>`, never served, kept for an operator: a store that lost its
//!   ids gives every topic a new one, and that must not cost every log) and the replica
//!   starts empty and fetches from the leader;
//! - a file that does not parse: damage, reported and refused (the partition stays
//!   offline with [`Error::MalformedPartitionMetadata`]), never guessed at.
//!
//! Writes are atomic and durable (temp file, fsync, rename, fsync of the directory), as
//! every checkpoint here.

use std::fs;
use std::path::Path;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;

use crate::{checkpoint, Error, Result};

/// The file's name in a partition directory (Kafka's).
pub const PARTITION_METADATA: &str = "partition.metadata";
/// A topic id: 16 bytes (a UUID), never all zero (Kafka's "no id").
pub type TopicId = [u8; 16];

/// The only version Kafka (and Fjord) writes.
const VERSION: &str = "0";
/// Far more than a well-formed file (37 bytes): a larger one is not read into memory.
const MAX_FILE_BYTES: u64 = 4096;

/// The file's text for `id` (Kafka's `PartitionMetadataFileFormatter.toFile`).
pub fn format(id: &TopicId) -> String {
    format!("version: {VERSION}\ntopic_id: {}", URL_SAFE_NO_PAD.encode(id))
}

/// The id in a file's bytes, or what is wrong with them. Strict as Kafka's reader:
/// exactly the two `key: value` lines (one trailing newline allowed), version 0, and an
/// id of exactly 16 bytes that is not all zero.
pub fn parse(bytes: &[u8]) -> std::result::Result<TopicId, &'static str> {
    let text = std::str::from_utf8(bytes).map_err(|_| "not UTF-8 text")?;
    let text = text.strip_suffix('\n').unwrap_or(text);
    let mut lines = text.split('\n');
    let (Some(version), Some(id), None) = (lines.next(), lines.next(), lines.next()) else {
        return Err("expected exactly two lines, `version: 0` and `topic_id: <id>`");
    };
    match field(version, "version") {
        Some(VERSION) => {}
        Some(_) => return Err("unsupported version (expected 0)"),
        None => return Err("the first line is not `version: <n>`"),
    }
    let id = field(id, "topic_id").ok_or("the second line is not `topic_id: <id>`")?;
    let bytes = URL_SAFE_NO_PAD.decode(id).map_err(|_| "the topic id is not URL-safe base64")?;
    let id: TopicId = bytes.try_into().map_err(|_| "the topic id is not 16 bytes")?;
    if id == [0; 16] {
        return Err("the topic id is the nil id");
    }
    Ok(id)
}

/// `value` of a `key: value` line (Kafka splits on `:` and whitespace).
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let rest = line.strip_prefix(key)?.strip_prefix(':')?;
    let value = rest.trim_start_matches([' ', '\t']);
    (value.len() < rest.len() && !value.is_empty() && !value.contains(char::is_whitespace)).then_some(value)
}

/// The id recorded in `partition_dir`; `Ok(None)` when there is no file (or no
/// directory). A file that does not parse is [`Error::MalformedPartitionMetadata`]; one
/// that cannot be read is [`Error::Io`].
pub fn read(partition_dir: &Path) -> Result<Option<TopicId>> {
    let path = partition_dir.join(PARTITION_METADATA);
    let io = |source| Error::Io { path: path.clone(), source };
    let len = match fs::metadata(&path) {
        Ok(meta) => meta.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(e)),
    };
    if len > MAX_FILE_BYTES {
        return Err(Error::MalformedPartitionMetadata { path, detail: "larger than 4 KiB" });
    }
    let bytes = fs::read(&path).map_err(io)?;
    parse(&bytes).map(Some).map_err(|detail| Error::MalformedPartitionMetadata { path, detail })
}

/// Records `id` in `partition_dir` (which must exist), atomically and durably.
pub fn write(partition_dir: &Path, id: &TopicId) -> Result<()> {
    checkpoint::write_atomic(&partition_dir.join(PARTITION_METADATA), format(id).as_bytes())
}

/// What to do with a replica's log when the broker starts hosting it (see the module
/// docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The log is the topic's: serve it.
    Keep,
    /// No id recorded: serve the log and record the topic's id.
    Adopt,
    /// The log belongs to another topic of the same name (deleted since): set it aside
    /// (never deleted), start the replica empty, record the topic's id.
    Replace {
        /// The id the log recorded.
        stale: TopicId,
    },
    /// The file is damaged or unreadable: serve nothing, delete nothing.
    Offline {
        /// Why, naming the file.
        reason: String,
    },
}

/// [`Decision`] for a replica of the topic `current` whose directory recorded `on_disk`
/// ([`read`]'s answer).
pub fn decide(current: &TopicId, on_disk: &Result<Option<TopicId>>) -> Decision {
    match on_disk {
        Ok(Some(id)) if id == current => Decision::Keep,
        Ok(Some(id)) => Decision::Replace { stale: *id },
        Ok(None) => Decision::Adopt,
        Err(e) => Decision::Offline { reason: e.to_string() },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: TopicId = [0xf1, 0x4b, 0x75, 0x0b, 0x91, 0xb3, 0x43, 0xda, 0x87, 0x04, 0x27, 0x7a, 0xcc, 0xb9, 0x03, 0x38];

    #[test]
    fn the_text_is_kafkas_and_round_trips() {
        assert_eq!(format(&ID), "version: 0\ntopic_id: 8Ut1C5GzQ9qHBCd6zLkDOA");
        // Kafka's reserved metadata topic id, as Kafka prints it.
        let mut metadata_topic = [0u8; 16];
        metadata_topic[15] = 1;
        assert_eq!(format(&metadata_topic), "version: 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAQ");
        assert_eq!(parse(format(&ID).as_bytes()), Ok(ID));
        assert_eq!(parse(b"version: 0\ntopic_id: 8Ut1C5GzQ9qHBCd6zLkDOA\n"), Ok(ID), "one trailing newline is read");
        assert_eq!(parse(b"version:  0\ntopic_id:\t8Ut1C5GzQ9qHBCd6zLkDOA"), Ok(ID), "Kafka splits on `:\\s+`");
    }

    #[test]
    fn anything_else_is_refused_with_a_reason() {
        let cases: &[&[u8]] = &[
            b"",
            b"\n",
            b"version: 0",
            b"version: 0\n",
            b"version: 1\ntopic_id: 8Ut1C5GzQ9qHBCd6zLkDOA",
            b"version: x\ntopic_id: 8Ut1C5GzQ9qHBCd6zLkDOA",
            b"version 0\ntopic_id: 8Ut1C5GzQ9qHBCd6zLkDOA",
            b"version:0\ntopic_id: 8Ut1C5GzQ9qHBCd6zLkDOA",
            b"topic_id: 8Ut1C5GzQ9qHBCd6zLkDOA\nversion: 0",
            b"version: 0\ntopic_id: 8Ut1C5GzQ9qHBCd6zLkDO",
            b"version: 0\ntopic_id: 8Ut1C5GzQ9qHBCd6zLkDOAAA",
            b"version: 0\ntopic_id: 8Ut1C5GzQ9qHBCd6zLkDOA==",
            b"version: 0\ntopic_id: 8Ut1C5GzQ9qHBCd6zLkD+A",
            b"version: 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAA",
            b"version: 0\ntopic_id: 8Ut1C5GzQ9qHBCd6zLkDOA extra",
            b"version: 0\ntopic_id: 8Ut1C5GzQ9qHBCd6zLkDOA\n\n",
            b"version: 0\ntopic_id: 8Ut1C5GzQ9qHBCd6zLkDOA\nmore: 1",
            b"version: 0\r\ntopic_id: 8Ut1C5GzQ9qHBCd6zLkDOA",
            b"version: 0\ntopic_id: \xff\xfe",
            b"\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0",
        ];
        for bad in cases {
            assert!(parse(bad).is_err(), "{:?} parsed", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn read_and_write_through_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()).unwrap(), None, "no file");
        assert_eq!(read(&dir.path().join("absent")).unwrap(), None, "no directory");
        write(dir.path(), &ID).unwrap();
        assert_eq!(fs::read_to_string(dir.path().join(PARTITION_METADATA)).unwrap(), format(&ID));
        assert_eq!(read(dir.path()).unwrap(), Some(ID));
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, [PARTITION_METADATA], "no temp file left behind");
        let mut other = ID;
        other[0] ^= 1;
        write(dir.path(), &other).unwrap();
        assert_eq!(read(dir.path()).unwrap(), Some(other), "rewritten in place");

        fs::write(dir.path().join(PARTITION_METADATA), "version: 0\ntopic_id: garbage").unwrap();
        let err = read(dir.path()).unwrap_err();
        assert!(matches!(err, Error::MalformedPartitionMetadata { .. }), "{err:?}");
        assert!(err.to_string().contains(PARTITION_METADATA), "the error names the file: {err}");
        fs::write(dir.path().join(PARTITION_METADATA), vec![b'x'; 5000]).unwrap();
        assert!(matches!(read(dir.path()), Err(Error::MalformedPartitionMetadata { detail: "larger than 4 KiB", .. })));
        fs::remove_file(dir.path().join(PARTITION_METADATA)).unwrap();
        fs::create_dir(dir.path().join(PARTITION_METADATA)).unwrap();
        assert!(matches!(read(dir.path()), Err(Error::Io { .. })), "a directory in its place is unreadable, not missing");
    }

    #[test]
    fn a_log_dir_refuses_a_damaged_file_keeps_the_partitions_place_and_opens_it_once_repaired() {
        use crate::{LogConfig, LogManager, TopicPartition, Unhealthy};
        let dir = tempfile::tempdir().unwrap();
        let tp = TopicPartition::new("t", 0);
        let file = dir.path().join("t-0").join(PARTITION_METADATA);
        let append = |log: &crate::Log| {
            let mut b = fjord_record::BatchBuilder::new(1_000);
            b.append(1_000, None, Some(b"value"), &[]);
            log.append(&mut b.build_vec(), 0).unwrap();
        };
        {
            let m = LogManager::open(dir.path(), LogConfig::default()).unwrap();
            let log = m.get_or_create(&tp, LogConfig::default()).unwrap();
            append(&log);
            log.set_high_watermark(1);
            assert_eq!(m.topic_id(&tp).unwrap(), None);
            m.write_topic_id(&tp, &ID).unwrap();
            assert_eq!(m.topic_id(&tp).unwrap(), Some(ID));
            assert!(m.write_topic_id(&TopicPartition::new("absent", 0), &ID).is_err(), "only for an open log");
            m.close().unwrap();
        }
        fs::write(&file, "version: 0\ntopic_id: ?").unwrap();
        let m = LogManager::open(dir.path(), LogConfig::default()).unwrap();
        assert!(m.is_offline(&tp), "a damaged file keeps the log closed at start");
        let Some(Unhealthy::Offline { reason }) = m.unhealthy().get(&tp).cloned() else { panic!("{:?}", m.unhealthy()) };
        assert!(reason.contains(PARTITION_METADATA) && reason.contains("damaged"), "{reason}");
        assert!(m.get_or_create(&tp, LogConfig::default()).is_err(), "and at every later attempt");
        assert_eq!(fs::read(&file).unwrap(), b"version: 0\ntopic_id: ?", "nothing rewritten");

        write(file.parent().unwrap(), &ID).unwrap();
        let log = m.get_or_create(&tp, LogConfig::default()).unwrap();
        assert_eq!((log.log_end_offset(), log.high_watermark()), (1, 1), "repaired, it opens with its place");
        // Taken offline while open (the broker found the file damaged after start).
        m.take_offline(&tp, "partition.metadata damaged".to_owned());
        assert!(m.is_offline(&tp) && m.get(&tp).is_none());
        assert!(m.unhealthy().contains_key(&tp), "listed at once");
        let log = m.get_or_create(&tp, LogConfig::default()).unwrap();
        assert_eq!((log.log_end_offset(), log.high_watermark()), (1, 1), "its place was kept");
        assert!(!m.is_offline(&tp));
    }

    #[test]
    fn the_decision_keeps_adopts_replaces_or_refuses() {
        let mut other = ID;
        other[15] ^= 0x80;
        assert_eq!(decide(&ID, &Ok(Some(ID))), Decision::Keep);
        assert_eq!(decide(&ID, &Ok(None)), Decision::Adopt);
        assert_eq!(decide(&ID, &Ok(Some(other))), Decision::Replace { stale: other });
        let damaged = Err(Error::MalformedPartitionMetadata { path: "t-0/partition.metadata".into(), detail: "not UTF-8 text" });
        let Decision::Offline { reason } = decide(&ID, &damaged) else { panic!("a damaged file is refused") };
        assert!(reason.contains("t-0/partition.metadata") && reason.contains("not UTF-8 text"), "{reason}");
        let unreadable =
            Err(Error::Io { path: "t-0/partition.metadata".into(), source: std::io::ErrorKind::PermissionDenied.into() });
        assert!(matches!(decide(&ID, &unreadable), Decision::Offline { .. }), "an unreadable file is refused too");
    }
}
