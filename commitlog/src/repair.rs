//! Repairing a damaged log without destroying the damaged bytes.
//!
//! A repair truncates a partition's log at its first bad batch (a batch that is not
//! whole, fails its CRC or framing, or breaks the offset order), as a follower
//! truncates to its leader. What it cuts off is never deleted: first the damaged
//! segment's bytes from the bad batch on, and every later segment whole, are copied
//! (later segments hard-linked when the file system allows) into a side directory
//! `<log dir>/<topic>-<partition>-damaged-<unix ms>/` with a `repair.txt` saying where
//! each file came from; only once those are on disk (fsynced) is the log truncated.
//! Logs never load that directory, and nothing deletes it but an operator.
//!
//! Three callers:
//! - [`Log::repair`], online: a follower whose copy is damaged truncates below the
//!   damage and fetches the rest again from its leader (the broker's fetcher);
//! - [`repair_partition`], offline, with the broker stopped: `fjord logs repair`, for a
//!   single node where the records after the damage exist nowhere else;
//! - recovery after an unclean shutdown ([`keep_recovery_cut`]): the invalid tail it cuts
//!   above the recovery point is usually a torn write, but may be the only copy of
//!   records a disk fault damaged, so it is kept the same way.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fjord_record::{Offset, TopicPartition};

use crate::checkpoint::{self, sync_dir};
use crate::error::IoContext;
use crate::manager::{lock_log_dir, LOG_START_CHECKPOINT, RECOVERY_POINT_CHECKPOINT, REPLICATION_CHECKPOINT};
use crate::segment::{segment_path, Segment, Step, Walker, LOG_SUFFIX};
use crate::{Error, Log, LogConfig, Result};

/// Between a partition directory's name and the time of the repair, in the name of the
/// directory that keeps what a repair cut off.
pub const DAMAGED_MARKER: &str = "-damaged-";
/// The file in that directory saying what each file is.
pub const REPAIR_MANIFEST: &str = "repair.txt";

/// Bytes a repair moved aside: `bytes` bytes of `from` starting at `from_position`,
/// now the whole of `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MovedAside {
    /// The segment file they came from.
    pub from: PathBuf,
    /// Their position in it (0 for a later segment moved whole).
    pub from_position: u64,
    /// How many.
    pub bytes: u64,
    /// Where they are kept.
    pub to: PathBuf,
}

/// What a repair did, or with `applied == false` (a dry run) would do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repair {
    /// The damaged segment's `.log`.
    pub segment: PathBuf,
    /// Byte position of the first bad batch in it.
    pub position: u64,
    /// What is wrong there.
    pub reason: String,
    /// The records kept are `[log_start_offset, truncated_to)`.
    pub log_start_offset: Offset,
    /// The log end offset after the repair: the offset after the last good batch
    /// before the damage.
    pub truncated_to: Offset,
    /// Bytes of log data kept.
    pub kept_bytes: u64,
    /// The directory keeping what was cut off.
    pub side_dir: PathBuf,
    /// What was (or would be) moved there.
    pub moved: Vec<MovedAside>,
    /// Whether anything was written (false for a dry run).
    pub applied: bool,
}

/// The first damage of a log and what a repair at it cuts.
#[derive(Debug)]
pub(crate) struct Plan {
    segment: PathBuf,
    position: u64,
    reason: String,
    truncate_to: Offset,
    /// `(file, from position, bytes)` to move aside: the damaged segment's tail, then
    /// the later segments whole.
    cut: Vec<(PathBuf, u64, u64)>,
    log_start_offset: Offset,
    kept_bytes: u64,
}

impl Log {
    /// The online repair (see the module docs): scrubs the whole log (CRC and framing,
    /// as reads check), and when it finds damage, moves the damaged batch and everything
    /// after it aside and truncates the log after the last good batch before it.
    /// `Ok(None)` when nothing is damaged. For a follower, whose leader holds the
    /// records again: never on a leader's only copy unless an operator asks.
    pub fn repair(&self, now_ms: u64) -> Result<Option<Repair>> {
        while !self.scrub(u64::MAX)?.1 {}
        self.repair_known_damage(now_ms)
    }

    /// [`Log::repair`] at the first damage already known (found by reads, the open or
    /// the scrubber), without scrubbing first: quick enough to run under a caller's lock
    /// after a scrub outside it. Damage further down that nothing found yet is cut off
    /// with the rest; damage before it is repaired when found.
    pub fn repair_known_damage(&self, now_ms: u64) -> Result<Option<Repair>> {
        let view = self.view();
        let Some((seg, position)) = view.values().find_map(|s| Some((s.clone(), s.damage_at()?))) else {
            return Ok(None);
        };
        let truncate_to = seg.next_offset_before(position)?;
        let mut cut = vec![(seg.path(LOG_SUFFIX), position, seg.size().saturating_sub(position))];
        cut.extend(view.range(seg.base_offset + 1..).map(|(_, s)| (s.path(LOG_SUFFIX), 0, s.size())));
        let kept_bytes = view.range(..seg.base_offset).map(|(_, s)| s.size()).sum::<u64>() + position.min(seg.size());
        let plan = Plan {
            segment: seg.path(LOG_SUFFIX),
            position,
            reason: damage_reason(&seg),
            truncate_to,
            cut,
            log_start_offset: self.log_start_offset().min(truncate_to),
            kept_bytes,
        };
        let (side_dir, moved) = move_aside(self.dir(), &plan, now_ms, REPAIR)?;
        tracing::warn!(
            dir = %self.dir().display(), segment = %plan.segment.display(), position, truncate_to,
            side_dir = %side_dir.display(),
            "repair: the damaged batch and everything after it were moved aside; truncating the log before it"
        );
        self.truncate_to(truncate_to)?;
        Ok(Some(Repair {
            segment: plan.segment,
            position,
            reason: plan.reason,
            log_start_offset: plan.log_start_offset,
            truncated_to: self.log_end_offset(),
            kept_bytes: self.size_bytes(),
            side_dir,
            moved,
            applied: true,
        }))
    }
}

/// What is wrong at a damaged segment's first bad batch.
fn damage_reason(seg: &Arc<Segment>) -> String {
    seg.damage().map_or_else(|| "damaged".to_owned(), |(_, reason)| reason.to_string())
}

/// The offline repair of `tp` in `log_dir`, with the broker stopped (`fjord logs
/// repair`): refuses with [`Error::InUse`] while a broker holds the log dir. Walks every
/// segment (CRC and every record checked, and offsets in order, as recovery does)
/// without writing anything; `Ok(None)` when nothing is damaged. With `dry_run` it
/// stops there and says what it would do. Otherwise it moves the damaged part aside,
/// opens the log, truncates it before the damage (rebuilding the indexes, the epoch
/// and producer state), checks the rest once more, closes it cleanly and sets the
/// partition's entries in the log dir's checkpoint files to the new end.
pub fn repair_partition(log_dir: &Path, tp: &TopicPartition, dry_run: bool, now_ms: u64) -> Result<Option<Repair>> {
    let _lock = lock_log_dir(log_dir)?;
    let dir = log_dir.join(tp.dir_name());
    if !dir.is_dir() {
        return Err(Error::Io { path: dir, source: io::Error::new(io::ErrorKind::NotFound, "no such partition directory") });
    }
    let Some(plan) = inspect(&dir)? else { return Ok(None) };
    if dry_run {
        let side_dir = side_dir_name(&dir, now_ms);
        let moved = plan
            .cut
            .iter()
            .map(|(from, at, bytes)| MovedAside {
                from: from.clone(),
                from_position: *at,
                bytes: *bytes,
                to: side_file(&side_dir, from, *at),
            })
            .collect();
        return Ok(Some(Repair {
            segment: plan.segment,
            position: plan.position,
            reason: plan.reason,
            log_start_offset: plan.log_start_offset,
            truncated_to: plan.truncate_to,
            kept_bytes: plan.kept_bytes,
            side_dir,
            moved,
            applied: false,
        }));
    }
    // Saved before the log is opened: opening may itself cut an invalid tail (past the
    // recovery point), and what it cuts is then already kept.
    let (side_dir, moved) = move_aside(&dir, &plan, now_ms, REPAIR)?;
    let recovery_points = checkpoint::read_offsets(&log_dir.join(RECOVERY_POINT_CHECKPOINT)).unwrap_or_default();
    let recovery_point = recovery_points.get(tp).copied().unwrap_or(0).min(plan.truncate_to);
    let log = Log::open_with_recovery_point(&dir, LogConfig::default(), recovery_point)?;
    log.truncate_to(plan.truncate_to)?;
    while !log.scrub(u64::MAX)?.1 {}
    if let Some((path, position)) = log.damage().into_iter().next() {
        log.close()?;
        return Err(Error::CorruptSegment {
            path,
            position,
            source: fjord_record::Error::MalformedRecord { position: 0, detail: "damage left after the repair; run it again" },
        });
    }
    let end = log.log_end_offset();
    let (start, kept_bytes) = (log.log_start_offset(), log.size_bytes());
    log.close()?;
    // The broker's checkpoints must not point past the new end (a high watermark there
    // would expose offsets that do not exist).
    for name in [RECOVERY_POINT_CHECKPOINT, REPLICATION_CHECKPOINT, LOG_START_CHECKPOINT] {
        let path = log_dir.join(name);
        let Ok(mut offsets) = checkpoint::read_offsets(&path) else {
            // A damaged checkpoint is rebuilt by the broker at start anyway.
            continue;
        };
        let Some(offset) = offsets.get_mut(tp) else { continue };
        let new = if name == RECOVERY_POINT_CHECKPOINT { end } else { (*offset).min(end) };
        if *offset != new {
            *offset = new;
            checkpoint::write_offsets(&path, &offsets)?;
        }
    }
    Ok(Some(Repair {
        segment: plan.segment,
        position: plan.position,
        reason: plan.reason,
        log_start_offset: start.min(end),
        truncated_to: end,
        kept_bytes,
        side_dir,
        moved,
        applied: true,
    }))
}

/// Finds a partition directory's first bad batch by reading its segments, writing
/// nothing.
fn inspect(dir: &Path) -> Result<Option<Plan>> {
    let mut bases: Vec<Offset> = Vec::new();
    for entry in fs::read_dir(dir).at(dir)? {
        let name = entry.at(dir)?.file_name().to_string_lossy().into_owned();
        if let Some(stem) = name.strip_suffix(".log") {
            if stem.len() == 20 && stem.bytes().all(|b| b.is_ascii_digit()) {
                bases.push(stem.parse().unwrap_or(0));
            }
        }
    }
    bases.sort_unstable();
    let Some(&log_start_offset) = bases.first() else { return Ok(None) };
    let mut kept_bytes = 0;
    // The offset the next batch must reach at least: offsets only grow.
    let mut expected = log_start_offset;
    for (i, &base) in bases.iter().enumerate() {
        let path = segment_path(dir, base, LOG_SUFFIX);
        let file = File::open(&path).at(&path)?;
        let len = file.metadata().at(&path)?.len();
        let next_base = bases.get(i + 1).copied();
        let mut walk = Walker::new(&file, 0, len);
        let mut segment_next = base.max(expected);
        let damage = loop {
            match walk.step(true).at(&path)? {
                Step::End => break None,
                Step::Torn { position, reason } => break Some((position, reason.to_string())),
                Step::Batch { position, header } => {
                    if header.base_offset < segment_next || next_base.is_some_and(|n| header.last_offset() >= n) {
                        break Some((position, format!("batch offset {} out of order", header.base_offset)));
                    }
                    segment_next = header.next_offset();
                    expected = segment_next;
                }
            }
        };
        if let Some((position, reason)) = damage {
            let mut cut = vec![(path.clone(), position, len - position)];
            for &later in &bases[i + 1..] {
                let p = segment_path(dir, later, LOG_SUFFIX);
                let bytes = fs::metadata(&p).at(&p)?.len();
                cut.push((p, 0, bytes));
            }
            let truncate_to = if position == 0 { base.max(expected) } else { segment_next };
            return Ok(Some(Plan {
                segment: path,
                position,
                reason,
                truncate_to,
                cut,
                log_start_offset,
                kept_bytes: kept_bytes + position,
            }));
        }
        kept_bytes += len;
    }
    Ok(None)
}

/// `<log dir>/<partition dir>-damaged-<ms>` (13 digits or more, like an orphan's).
fn side_dir_name(partition_dir: &Path, now_ms: u64) -> PathBuf {
    let name = partition_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let parent = partition_dir.parent().unwrap_or(Path::new("."));
    let mut ms = now_ms;
    loop {
        let candidate = parent.join(format!("{name}{DAMAGED_MARKER}{ms:013}"));
        if !candidate.exists() {
            return candidate;
        }
        ms += 1;
    }
}

/// The file in `side_dir` keeping `from`'s bytes from `at`: `<segment>.log` for a whole
/// segment, `<segment>.log.from-<at>` for a tail.
fn side_file(side_dir: &Path, from: &Path, at: u64) -> PathBuf {
    let name = from.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    if at == 0 {
        side_dir.join(name)
    } else {
        side_dir.join(format!("{name}.from-{at}"))
    }
}

/// The first line of a repair's manifest.
const REPAIR: &str = "repair";

/// Recovery after an unclean shutdown is about to cut `segment` (a `.log` of the
/// partition directory `dir`) at `position`, where its first invalid batch is (`reason`),
/// and to delete the `later` segments' files: copies those bytes (later segments
/// hard-linked) into `<dir>-damaged-<now_ms>/` first, fsynced, with a manifest, so the cut
/// loses nothing. `truncate_to` is the log end after the cut; `kept_bytes` the log bytes
/// left. Returns the side directory.
#[allow(clippy::too_many_arguments)] // one call site; the plan's fields spelled out
pub(crate) fn keep_recovery_cut(
    dir: &Path,
    segment: &Path,
    position: u64,
    len: u64,
    reason: &str,
    later: &[PathBuf],
    (log_start_offset, truncate_to, kept_bytes): (Offset, Offset, u64),
    now_ms: u64,
) -> Result<PathBuf> {
    let mut cut = vec![(segment.to_path_buf(), position, len - position)];
    for p in later {
        let bytes = fs::metadata(p).at(p)?.len();
        cut.push((p.clone(), 0, bytes));
    }
    let plan = Plan {
        segment: segment.to_path_buf(),
        position,
        reason: reason.to_owned(),
        truncate_to,
        cut,
        log_start_offset,
        kept_bytes,
    };
    move_aside(dir, &plan, now_ms, "recovery after an unclean shutdown").map(|(side_dir, _)| side_dir)
}

/// Copies what `plan` cuts into a new side directory next to `partition_dir`, fsyncs
/// it, and writes the manifest, headed `<what> of <partition dir>`.
fn move_aside(partition_dir: &Path, plan: &Plan, now_ms: u64, what: &str) -> Result<(PathBuf, Vec<MovedAside>)> {
    let side_dir = side_dir_name(partition_dir, now_ms);
    fs::create_dir(&side_dir).at(&side_dir)?;
    let mut moved = Vec::new();
    for (i, (from, at, bytes)) in plan.cut.iter().enumerate() {
        let to = side_file(&side_dir, from, *at);
        // A later segment is never written again, only deleted: a hard link keeps its
        // bytes without copying them. The damaged segment (the first) is cut short in
        // place, even from its byte 0, which would empty a link too: it is copied.
        if i == 0 || fs::hard_link(from, &to).is_err() {
            copy_range(from, *at, *bytes, &to)?;
        }
        File::open(&to).and_then(|f| f.sync_all()).at(&to)?;
        moved.push(MovedAside { from: from.clone(), from_position: *at, bytes: *bytes, to });
    }
    let mut manifest = format!(
        "{what} of {} at {now_ms} ms since the epoch\nfirst bad batch: byte {} of {}: {}\nkept: offsets [{}, {}), {} bytes\n",
        partition_dir.display(),
        plan.position,
        plan.segment.display(),
        plan.reason,
        plan.log_start_offset,
        plan.truncate_to,
        plan.kept_bytes,
    );
    for m in &moved {
        manifest.push_str(&format!(
            "moved aside: {} <- {} bytes [{}, {})\n",
            m.to.display(),
            m.from.display(),
            m.from_position,
            m.from_position + m.bytes
        ));
    }
    let manifest_path = side_dir.join(REPAIR_MANIFEST);
    let mut f = File::create(&manifest_path).at(&manifest_path)?;
    f.write_all(manifest.as_bytes()).and_then(|()| f.sync_all()).at(&manifest_path)?;
    sync_dir(&side_dir)?;
    sync_dir(partition_dir.parent().unwrap_or(Path::new(".")))?;
    Ok((side_dir, moved))
}

fn copy_range(from: &Path, at: u64, bytes: u64, to: &Path) -> Result<()> {
    let mut src = File::open(from).at(from)?;
    src.seek(SeekFrom::Start(at)).at(from)?;
    let mut dst = OpenOptions::new().write(true).create_new(true).open(to).at(to)?;
    let copied = io::copy(&mut src.take(bytes), &mut dst).at(to)?;
    if copied != bytes {
        return Err(Error::Io {
            path: from.to_path_buf(),
            source: io::Error::new(io::ErrorKind::UnexpectedEof, "segment shorter than planned"),
        });
    }
    Ok(())
}

/// `orders-3-damaged-1764600000000` → (`orders`, 3): a repair's side directory.
pub(crate) fn is_side_dir(name: &str) -> bool {
    name.rsplit_once(DAMAGED_MARKER).is_some_and(|(_, ms)| ms.len() >= 13 && ms.bytes().all(|b| b.is_ascii_digit()))
}
