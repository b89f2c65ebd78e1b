//! Kafka's checkpoint text files, written atomically.
//!
//! ```text
//! 0                 version
//! 2                 number of entries
//! orders 0 1234     one entry per line: space-separated fields
//! orders 1 99
//! ```
//!
//! Used for `recovery-point-offset-checkpoint` and `replication-offset-checkpoint`
//! (`topic partition offset`) and for `leader-epoch-checkpoint` (`epoch start_offset`).

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::path::Path;

use fjord_record::{Offset, TopicPartition};

use crate::error::IoContext;
use crate::{Error, Result};

const VERSION: &str = "0";

/// Writes `lines` under the version and count header: to `<path>.tmp`, fsync, rename
/// over `path`, fsync the directory. A crash leaves either the old or the new file.
pub(crate) fn write_lines(path: &Path, lines: &[String]) -> Result<()> {
    let mut text = format!("{VERSION}\n{}\n", lines.len());
    for l in lines {
        text.push_str(l);
        text.push('\n');
    }
    let tmp = path.with_extension("tmp");
    let mut f = File::create(&tmp).at(&tmp)?;
    f.write_all(text.as_bytes()).at(&tmp)?;
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
/// the file does not exist.
pub(crate) fn read_lines(path: &Path) -> Result<Option<Vec<Vec<String>>>> {
    let text = match fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::Io { path: path.to_path_buf(), source: e }),
    };
    let bad = |line, detail| Error::MalformedCheckpoint { path: path.to_path_buf(), line, detail };
    let mut lines = text.lines();
    if lines.next() != Some(VERSION) {
        return Err(bad(1, "unsupported version (expected 0)"));
    }
    let count: usize = lines.next().and_then(|l| l.trim().parse().ok()).ok_or_else(|| bad(2, "bad entry count"))?;
    let entries: Vec<Vec<String>> =
        lines.filter(|l| !l.trim().is_empty()).map(|l| l.split_whitespace().map(str::to_owned).collect()).collect();
    if entries.len() != count {
        return Err(bad(2, "entry count does not match the number of lines"));
    }
    Ok(Some(entries))
}

/// Offsets per partition (`topic partition offset` lines).
pub(crate) fn read_offsets(path: &Path) -> Result<BTreeMap<TopicPartition, Offset>> {
    let mut out = BTreeMap::new();
    for (i, fields) in read_lines(path)?.unwrap_or_default().into_iter().enumerate() {
        let bad = |detail| Error::MalformedCheckpoint { path: path.to_path_buf(), line: i + 3, detail };
        let [topic, partition, offset] = fields.as_slice() else {
            return Err(bad("expected `topic partition offset`"));
        };
        let partition = partition.parse().map_err(|_| bad("bad partition"))?;
        let offset = offset.parse().map_err(|_| bad("bad offset"))?;
        out.insert(TopicPartition::new(topic.clone(), partition), offset);
    }
    Ok(out)
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
    fn offsets_round_trip_in_kafkas_format() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("recovery-point-offset-checkpoint");
        let mut m = BTreeMap::new();
        m.insert(TopicPartition::new("orders", 0), 1234);
        m.insert(TopicPartition::new("my-topic", 11), 0);
        write_offsets(&path, &m).unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "0\n2\nmy-topic 11 0\norders 0 1234\n");
        assert_eq!(read_offsets(&path).unwrap(), m);
        assert!(read_offsets(&dir.path().join("missing")).unwrap().is_empty());
    }

    #[test]
    fn malformed_files_are_typed_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cp");
        for text in ["1\n0\n", "0\n2\na 0 1\n", "0\n1\na x 1\n", "0\n1\na 0\n", "", "0\nz\n"] {
            fs::write(&path, text).unwrap();
            assert!(matches!(read_offsets(&path), Err(Error::MalformedCheckpoint { .. })), "{text:?}");
        }
    }
}
