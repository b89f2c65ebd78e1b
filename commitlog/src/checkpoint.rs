//! Kafka's checkpoint text files, written atomically and checksummed.
//!
//! ```text
//! 1                 version (Kafka's layout is version 0; 1 adds the checksum line)
//! 2                 number of entries
//! orders 0 1234     one entry per line: space-separated fields
//! orders 1 99
//! crc32c 5d3c0b7e   CRC-32C of every byte above, 8 lowercase hex digits
//! ```
//!
//! Used for `recovery-point-offset-checkpoint`, `replication-offset-checkpoint` and
//! `log-start-offset-checkpoint` (`topic partition offset`), for `leader-epoch-checkpoint`
//! (`epoch start_offset`), for `cleaner-offset-checkpoint` and for producer state
//! snapshots.
//!
//! Why a checksum: these files decide what recovery trusts without reading it (a
//! recovery point too high skips the CRC scan of unflushed data) and what replication
//! answers, and a flipped digit still parses. Writes go to `<file>.tmp`, are fsynced,
//! renamed over the file and the directory fsynced, so a crash leaves the old or the
//! new file; the checksum catches what the disk (or anything else) did to it later.
//! Reading is strict: the version, the count, every line and the checksum must be
//! right, or the file is [`Error::MalformedCheckpoint`], which every caller answers by
//! rebuilding the state from the log with a warning, never by refusing to start.
//! Version 0 files (written before the checksum) are still read, strictly.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::path::Path;

use fjord_record::{Offset, TopicPartition};

use crate::error::IoContext;
use crate::{Error, Result};

const VERSION: &str = "1";
/// Kafka's version: no checksum line.
const LEGACY_VERSION: &str = "0";
const CHECKSUM_PREFIX: &str = "crc32c ";

/// Writes `lines` under the version and count header, with the checksum line: to
/// `<path>.tmp`, fsync, rename over `path`, fsync the directory. A crash leaves either
/// the old or the new file.
pub(crate) fn write_lines(path: &Path, lines: &[String]) -> Result<()> {
    let mut text = format!("{VERSION}\n{}\n", lines.len());
    for l in lines {
        text.push_str(l);
        text.push('\n');
    }
    let crc = fjord_record::batch::crc32c(text.as_bytes());
    text.push_str(&format!("{CHECKSUM_PREFIX}{crc:08x}\n"));
    write_atomic(path, text.as_bytes())
}

/// Writes `bytes` to `<path>.tmp` (the extension replaced), fsyncs it, renames it over
/// `path` and fsyncs the directory: a crash leaves either the old or the new file, and a
/// leftover `.tmp` is removed when the directory is loaded.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = File::create(&tmp).at(&tmp)?;
    f.write_all(bytes).at(&tmp)?;
    f.sync_all().at(&tmp)?;
    fs::rename(&tmp, path).at(path)?;
    if let Some(dir) = path.parent() {
        sync_dir(dir)?;
    }
    Ok(())
}

/// fsyncs a directory so created, renamed or removed entries survive a crash.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).at(dir)
}

/// Reads the entry lines of a checkpoint file, split into fields; `Ok(None)` when
/// the file does not exist. Anything but a well-formed file (not UTF-8, an unknown
/// version, a wrong count, a blank or torn line, a checksum mismatch) is
/// [`Error::MalformedCheckpoint`]; an I/O failure reading it is [`Error::Io`].
pub(crate) fn read_lines(path: &Path) -> Result<Option<Vec<Vec<String>>>> {
    Ok(read_lines_with_format(path)?.map(|(lines, _)| lines))
}

/// Whether a checkpoint file carried a checksum: a version 0 file (Kafka's, or Fjord's
/// before the checksum) parses with a flipped digit, so what it says is only a claim
/// that callers check against the log before acting on it (#26).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// Version 1: the checksum matched.
    Checksummed,
    /// Version 0: nothing vouches for the values.
    Unchecksummed,
}

/// [`read_lines`], with the file's [`Format`].
fn read_lines_with_format(path: &Path) -> Result<Option<(Vec<Vec<String>>, Format)>> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::Io { path: path.to_path_buf(), source: e }),
    };
    parse(&bytes).map(Some).map_err(|(line, detail)| Error::MalformedCheckpoint { path: path.to_path_buf(), line, detail })
}

/// Where a file is malformed: (1-based line, what is wrong).
type Malformed = (usize, &'static str);

/// [`read_lines`] on the file's bytes.
fn parse(bytes: &[u8]) -> std::result::Result<(Vec<Vec<String>>, Format), Malformed> {
    let text = std::str::from_utf8(bytes).map_err(|_| (1, "not UTF-8 text"))?;
    let Some(body) = text.strip_suffix('\n') else {
        return Err((text.lines().count().max(1), "does not end with a newline (torn write)"));
    };
    let mut lines: Vec<&str> = body.split('\n').collect();
    let checksummed = match lines.first().copied() {
        Some(VERSION) => true,
        Some(LEGACY_VERSION) => false,
        _ => return Err((1, "unsupported version (expected 1, or Kafka's 0)")),
    };
    if checksummed {
        let last = lines.pop().unwrap_or_default();
        let line = lines.len() + 1;
        let stored = last.strip_prefix(CHECKSUM_PREFIX).ok_or((line, "missing the crc32c line"))?;
        let stored = u32::from_str_radix(stored, 16).ok().filter(|_| stored.len() == 8).ok_or((line, "bad crc32c value"))?;
        let covered = &text[..text.len() - last.len() - 1];
        if fjord_record::batch::crc32c(covered.as_bytes()) != stored {
            return Err((line, "checksum mismatch: the file was damaged after it was written"));
        }
    }
    let count: usize = lines.get(1).and_then(|l| l.parse().ok()).ok_or((2, "bad entry count"))?;
    let entries = &lines[2.min(lines.len())..];
    if entries.len() != count {
        return Err((2, "entry count does not match the number of lines"));
    }
    let lines = entries
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let fields: Vec<String> = l.split(' ').map(str::to_owned).collect();
            if fields.iter().any(String::is_empty) {
                return Err((i + 3, "empty field (blank line or doubled space)"));
            }
            Ok(fields)
        })
        .collect::<std::result::Result<_, _>>()?;
    Ok((lines, if checksummed { Format::Checksummed } else { Format::Unchecksummed }))
}

/// Offsets per partition (`topic partition offset` lines).
pub(crate) fn read_offsets(path: &Path) -> Result<BTreeMap<TopicPartition, Offset>> {
    read_offsets_with_format(path).map(|(offsets, _)| offsets)
}

/// [`read_offsets`], with the file's [`Format`] (a missing file is an empty checksummed one:
/// nothing in it needs vouching for).
pub(crate) fn read_offsets_with_format(path: &Path) -> Result<(BTreeMap<TopicPartition, Offset>, Format)> {
    let (lines, format) = read_lines_with_format(path)?.unwrap_or((Vec::new(), Format::Checksummed));
    let mut out = BTreeMap::new();
    for (i, fields) in lines.into_iter().enumerate() {
        let bad = |detail| Error::MalformedCheckpoint { path: path.to_path_buf(), line: i + 3, detail };
        let [topic, partition, offset] = fields.as_slice() else {
            return Err(bad("expected `topic partition offset`"));
        };
        let partition = partition.parse().map_err(|_| bad("bad partition"))?;
        let offset = offset.parse().map_err(|_| bad("bad offset"))?;
        out.insert(TopicPartition::new(topic.clone(), partition), offset);
    }
    Ok((out, format))
}

/// Writes offsets per partition.
pub(crate) fn write_offsets(path: &Path, offsets: &BTreeMap<TopicPartition, Offset>) -> Result<()> {
    let lines: Vec<String> = offsets.iter().map(|(tp, o)| format!("{} {} {o}", tp.topic, tp.partition)).collect();
    write_lines(path, &lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_round_trip_in_kafkas_layout_with_a_checksum() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("recovery-point-offset-checkpoint");
        let mut m = BTreeMap::new();
        m.insert(TopicPartition::new("orders", 0), 1234);
        m.insert(TopicPartition::new("my-topic", 11), 0);
        write_offsets(&path, &m).unwrap();
        let text = fs::read_to_string(&path).unwrap();
        let body = "1\n2\nmy-topic 11 0\norders 0 1234\n";
        assert_eq!(text, format!("{body}crc32c {:08x}\n", fjord_record::batch::crc32c(body.as_bytes())));
        assert_eq!(read_offsets(&path).unwrap(), m);
        assert!(read_offsets(&dir.path().join("missing")).unwrap().is_empty());
        // Kafka's version 0 (and Fjord's before the checksum) is still read.
        fs::write(&path, "0\n2\nmy-topic 11 0\norders 0 1234\n").unwrap();
        assert_eq!(read_offsets_with_format(&path).unwrap(), (m.clone(), Format::Unchecksummed), "read, but not vouched for");
        write_offsets(&path, &m).unwrap();
        assert_eq!(read_offsets_with_format(&path).unwrap(), (m, Format::Checksummed));
    }

    #[test]
    fn malformed_files_are_typed_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cp");
        let good = {
            let mut m = BTreeMap::new();
            m.insert(TopicPartition::new("orders", 0), 1234);
            write_offsets(&path, &m).unwrap();
            fs::read(&path).unwrap()
        };
        let flipped_digit = String::from_utf8(good.clone()).unwrap().replace("1234", "9234").into_bytes();
        let torn = good[..good.len() - 3].to_vec();
        let no_checksum = b"1\n1\norders 0 1234\n".to_vec();
        let mut cases: Vec<Vec<u8>> =
            ["1\n0\n", "0\n2\na 0 1\n", "0\n1\na x 1\n", "0\n1\na 0\n", "", "0\nz\n", "0\n1\n\n", "0\n1\na  0 1\n"]
                .iter()
                .map(|t| t.as_bytes().to_vec())
                .collect();
        cases.extend([flipped_digit, torn, no_checksum, vec![0xff, 0xfe, 0x00, 0x17], good[..10].to_vec()]);
        for bytes in cases {
            fs::write(&path, &bytes).unwrap();
            assert!(
                matches!(read_offsets(&path), Err(Error::MalformedCheckpoint { .. })),
                "{:?}",
                String::from_utf8_lossy(&bytes)
            );
        }
    }
}
