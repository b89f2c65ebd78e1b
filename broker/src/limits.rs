//! Resource limits on what requests may ask of this broker: how many partitions one
//! request may create (`max.partitions.per.request`) and how many partition replicas a
//! broker may hold (`max.partitions.per.broker`, by default derived from the open-file
//! limit, which the broker raises to its hard limit at start).
//!
//! Every partition replica holds file descriptors (its active segment's files), so a
//! broker with more replicas than descriptors cannot open them: the ones past the limit
//! were advertised but never served, and a restart failed with "Too many open files"
//! (issue #26). A create that would pass the limit is refused before anything is
//! allocated or written.

use nix::sys::resource::{getrlimit, setrlimit, Resource, RLIM_INFINITY};

/// Descriptors counted per partition replica: its active segment keeps `.log`, `.index`
/// and `.timeindex` open (measured: 300 partitions, 903 descriptors). Sealed segments'
/// files come from the log's descriptor cache (`log.segment.files.open.max`), counted
/// apart.
const DESCRIPTORS_PER_PARTITION: u64 = 3;
/// The share of the open-file limit left for everything but log files: connections
/// (`max.connections`), the metadata store, what a partition opens for a moment (a
/// roll, a checkpoint), the cleaner's files. Half: a broker at its partition limit
/// still accepts about as many connections as its logs hold descriptors.
const RESERVED_SHARE: u64 = 2;
/// Below this many partitions the derived default is worth a warning at start.
const FEW_PARTITIONS: usize = 100;
/// The derived limit when the open-file limit is unlimited or unreadable, and its
/// ceiling: what a common hard limit (1,048,576) gives.
const UNLIMITED_PARTITIONS: usize = 174_762;

/// The limits a topic creation is checked against, resolved at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PartitionLimits {
    /// At most this many partitions in one topic of one CreateTopics (or auto-create).
    pub(crate) per_request: i32,
    /// At most this many partition replicas on one broker, counting every topic.
    pub(crate) per_broker: usize,
}

impl PartitionLimits {
    /// The limits from the config: an unset `max.partitions.per.broker` is derived from
    /// `open_files`, this process's (raised) soft open-file limit, less the
    /// `sealed_segment_files` the log's descriptor cache may hold.
    pub(crate) fn resolve(
        per_request: i32,
        per_broker: Option<usize>,
        open_files: Option<u64>,
        sealed_segment_files: usize,
    ) -> Self {
        let per_broker = per_broker.unwrap_or_else(|| {
            let derived = partitions_for_open_files(open_files, sealed_segment_files);
            if derived < FEW_PARTITIONS {
                tracing::warn!(
                    open_file_limit = open_files,
                    max_partitions_per_broker = derived,
                    "the open-file limit leaves room for few partitions: raise its hard limit \
                     (ulimit -Hn, LimitNOFILE=), or lower log.segment.files.open.max"
                );
            }
            derived
        });
        Self { per_request, per_broker }
    }
}

/// The partition replicas a broker may hold with `open_files` descriptors: half of them,
/// less the `sealed_segment_files` of the descriptor cache, at
/// [`DESCRIPTORS_PER_PARTITION`] each, and at least one. With the default cache of 1,024:
///
/// ```text
/// 4,096 → 341    20,000 → 2,992    1,048,576 → 174,421    unlimited → 174,762
/// ```
pub(crate) fn partitions_for_open_files(open_files: Option<u64>, sealed_segment_files: usize) -> usize {
    match open_files {
        Some(limit) => {
            let budget = (limit / RESERVED_SHARE).saturating_sub(sealed_segment_files as u64);
            usize::try_from(budget / DESCRIPTORS_PER_PARTITION).unwrap_or(UNLIMITED_PARTITIONS).clamp(1, UNLIMITED_PARTITIONS)
        }
        None => UNLIMITED_PARTITIONS,
    }
}

/// Raises this process's soft open-file limit (RLIMIT_NOFILE) to its hard limit, as far
/// as the OS allows, and logs what it got. Returns the soft limit in force afterwards,
/// `None` when unlimited or unreadable.
pub(crate) fn raise_open_file_limit() -> Option<u64> {
    let (soft, hard) = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok(limits) => limits,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the open-file limit (RLIMIT_NOFILE)");
            return None;
        }
    };
    // Linux refuses a soft limit above fs.nr_open, which an unlimited hard limit is.
    let target = match hard {
        RLIM_INFINITY => std::fs::read_to_string("/proc/sys/fs/nr_open").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(soft),
        hard => hard,
    };
    let mut current = soft;
    if soft != RLIM_INFINITY && soft < target {
        match setrlimit(Resource::RLIMIT_NOFILE, target, hard) {
            Ok(()) => current = target,
            Err(e) => tracing::warn!(soft, target, error = %e, "cannot raise the open-file limit"),
        }
    }
    let limit = (current != RLIM_INFINITY).then_some(current);
    tracing::info!(
        open_file_limit = limit.map_or_else(|| "unlimited".to_owned(), |l| l.to_string()),
        was = soft,
        hard = if hard == RLIM_INFINITY { "unlimited".to_owned() } else { hard.to_string() },
        "open-file limit"
    );
    limit
}

/// Whether `error` (or what caused it) is the process or the system running out of
/// file descriptors (EMFILE, ENFILE).
pub(crate) fn out_of_descriptors(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(e) = current {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if matches!(io.raw_os_error(), Some(code) if code == nix::libc::EMFILE || code == nix::libc::ENFILE) {
                return true;
            }
        }
        current = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_per_broker_default_follows_the_open_file_limit() {
        assert_eq!(partitions_for_open_files(Some(4096), 1024), 341);
        assert_eq!(partitions_for_open_files(Some(20_000), 1024), 2_992);
        assert_eq!(partitions_for_open_files(Some(20_000), 1), 3_333);
        assert_eq!(partitions_for_open_files(Some(1 << 20), 1024), 174_421);
        assert_eq!(partitions_for_open_files(Some(u64::MAX - 1), 1024), UNLIMITED_PARTITIONS);
        assert_eq!(partitions_for_open_files(Some(1024), 1024), 1, "never zero, even with no room");
        assert_eq!(partitions_for_open_files(None, 1024), UNLIMITED_PARTITIONS);
    }

    #[test]
    fn running_out_of_descriptors_is_recognised_through_the_log_error() {
        let emfile = fjord_log::Error::Io { path: "p".into(), source: std::io::Error::from_raw_os_error(nix::libc::EMFILE) };
        assert!(out_of_descriptors(&emfile));
        let other = fjord_log::Error::Io { path: "p".into(), source: std::io::Error::from_raw_os_error(nix::libc::ENOSPC) };
        assert!(!out_of_descriptors(&other));
    }

    #[test]
    fn an_explicit_per_broker_limit_wins() {
        assert_eq!(PartitionLimits::resolve(10, Some(7), Some(1024), 1024), PartitionLimits { per_request: 10, per_broker: 7 });
        assert_eq!(PartitionLimits::resolve(10, None, Some(20_000), 1024).per_broker, 2_992);
    }
}
