//! The crash-safe swap of cleaned segments (see the module docs of `cleaner`): file
//! names, and finishing or undoing an interrupted swap on open.

use std::fs::{self, File};
use std::path::{Path, PathBuf};

use fjord_record::Offset;

use super::{CLEANED_SUFFIX, SWAP_SUFFIX};
use crate::checkpoint::sync_dir;
use crate::error::IoContext;
use crate::segment::{segment_path, Step, Walker, INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX};
use crate::Result;

/// `<dir>/<base>.<suffix><extra>`.
pub(crate) fn suffixed(dir: &Path, base: Offset, suffix: &str, extra: &str) -> PathBuf {
    let mut p = segment_path(dir, base, suffix).into_os_string();
    p.push(extra);
    PathBuf::from(p)
}

/// Removes a clean's `.cleaned` and `.swap` files of segment `base`.
pub(crate) fn remove_cleaned(dir: &Path, base: Offset) -> Result<()> {
    for suffix in [LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX] {
        for extra in [CLEANED_SUFFIX, SWAP_SUFFIX] {
            crate::recovery::remove_if_exists(&suffixed(dir, base, suffix, extra))?;
        }
    }
    Ok(())
}

/// Runs on open before segments are loaded: removes uncommitted cleans and
/// finishes committed swaps (see the module docs).
pub(crate) fn finish_interrupted_swaps(dir: &Path) -> Result<()> {
    let mut swaps = Vec::new();
    let mut index_swaps = Vec::new();
    let mut stale = Vec::new();
    let mut logs = Vec::new();
    for entry in fs::read_dir(dir).at(dir)? {
        let entry = entry.at(dir)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if name.ends_with(CLEANED_SUFFIX) {
            stale.push(path);
        } else if let Some(stem) = name.strip_suffix(SWAP_SUFFIX) {
            match parse_name(stem) {
                Some((base, LOG_SUFFIX)) => swaps.push(base),
                Some((base, _)) => index_swaps.push((base, path)),
                None => stale.push(path),
            }
        } else if let Some((base, LOG_SUFFIX)) = parse_name(&name) {
            logs.push(base);
        }
    }
    let mut changed = !stale.is_empty();
    for path in stale {
        tracing::warn!(path = %path.display(), "removing the output of an interrupted clean");
        crate::recovery::remove_if_exists(&path)?;
    }
    for &base in &swaps {
        let swap = suffixed(dir, base, LOG_SUFFIX, SWAP_SUFFIX);
        let file = File::open(&swap).at(&swap)?;
        let len = file.metadata().at(&swap)?.len();
        // The swap file was fsynced before its rename: its batches are whole.
        let mut next = base;
        let mut walk = Walker::new(&file, 0, len);
        while let Step::Batch { header, .. } = walk.step(false).at(&swap)? {
            next = header.next_offset();
        }
        for &old in logs.iter().filter(|&&b| b > base && b < next) {
            tracing::warn!(dir = %dir.display(), segment = old, "removing a segment replaced by an interrupted clean");
            for suffix in [LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX] {
                crate::recovery::remove_if_exists(&segment_path(dir, old, suffix))?;
            }
        }
        for suffix in [INDEX_SUFFIX, TIME_INDEX_SUFFIX] {
            let from = suffixed(dir, base, suffix, SWAP_SUFFIX);
            let to = segment_path(dir, base, suffix);
            if from.exists() {
                fs::rename(&from, &to).at(&to)?;
            } else {
                // Either the new index already, or the replaced segment's: rebuilt on load.
                crate::recovery::remove_if_exists(&to)?;
            }
        }
        fs::rename(&swap, segment_path(dir, base, LOG_SUFFIX)).at(&swap)?;
        tracing::warn!(dir = %dir.display(), segment = base, "finished an interrupted clean");
        changed = true;
    }
    // Index swaps without a log swap: the commit never happened.
    for (base, path) in index_swaps {
        if !swaps.contains(&base) {
            crate::recovery::remove_if_exists(&path)?;
            changed = true;
        }
    }
    if changed {
        sync_dir(dir)?;
    }
    Ok(())
}

/// `00000000000000000123.log` → `(123, "log")`.
pub(super) fn parse_name(name: &str) -> Option<(Offset, &str)> {
    let (stem, suffix) = name.split_once('.')?;
    if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((stem.parse().ok()?, suffix))
}
