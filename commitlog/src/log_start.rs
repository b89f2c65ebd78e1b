//! What a checkpointed log start offset may do when a log opens (#26): pure, so every
//! rule is unit-tested without files.
//!
//! The log start lives in the log dir's `log-start-offset-checkpoint` because a start
//! moved inside a segment (DeleteRecords) is not visible in the segment files. Trusting
//! that file blindly lets metadata destroy data: before this, a version 0 file (no
//! checksum) with one flipped digit moved the start up at open, deleting every segment
//! below it and hiding the rest of the records below it. So:
//! - a checkpoint never deletes a segment: a start that falls past the first segment
//!   only hides the records below it ([`crate::Log::restore_log_start`]); the files stay
//!   until DeleteRecords or retention remove them as they would any other;
//! - a checksummed value is trusted as far as the log reaches (past the log end, the tail
//!   was lost in an unclean shutdown, and the start goes no further than the end);
//! - an unchecksummed (version 0) value is only a claim, applied when the log agrees
//!   with it: not past the log end, and not past the first offset the leader-epoch
//!   checkpoint records. Every move of the log start (DeleteRecords, retention) also
//!   moves the first leader-epoch entry's start offset to it, in a checksummed file
//!   written at the same moment, so a true value is never above it, while a digit
//!   flipped upwards almost always is. A value caught by either rule is ignored with a
//!   warning: the start stays at the first segment, which can only make records that
//!   DeleteRecords removed readable again, never lose one. The next checkpoint rewrites
//!   the file checksummed, with the start in force.

use fjord_record::Offset;

use crate::checkpoint::Format;

/// What the log as opened says about a checkpointed start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Opened {
    /// The first offset of the first segment (the start before any checkpoint applies).
    pub(crate) first_offset: Offset,
    /// The log end offset.
    pub(crate) log_end: Offset,
    /// The start offset of the first leader-epoch entry, `None` with no entries.
    pub(crate) first_epoch_start: Option<Offset>,
}

/// What to do with a checkpointed log start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// At or below the first offset: nothing to hide.
    Nothing,
    /// Hide the records below this offset (no segment is deleted).
    Hide(Offset),
    /// Not believable: ignored, for the reason given (logged by the caller).
    Ignore(&'static str),
}

/// The decision for `checkpointed`, read from a file in `format`, on the log `opened`.
///
/// ```text
/// first 0, end 30, first epoch entry at 13, DeleteRecords(13) checkpointed as 13
/// version 1, 13          -> Hide(13)
/// version 1, 40          -> Hide(30)      (the tail past 30 was lost)
/// version 0, 13          -> Hide(13)
/// version 0, 19 (13 flipped) -> Ignore    (above the first epoch entry's 13)
/// version 0, 93          -> Ignore        (past the end)
/// ```
pub(crate) fn decide(checkpointed: Offset, format: Format, opened: Opened) -> Decision {
    if checkpointed <= opened.first_offset {
        return Decision::Nothing;
    }
    match format {
        Format::Checksummed => Decision::Hide(checkpointed.min(opened.log_end)),
        Format::Unchecksummed if checkpointed > opened.log_end => {
            Decision::Ignore("an unchecksummed (version 0) log start past the log end")
        }
        Format::Unchecksummed if opened.first_epoch_start.is_some_and(|epoch_start| checkpointed > epoch_start) => {
            Decision::Ignore("an unchecksummed (version 0) log start above the first offset the leader-epoch checkpoint records")
        }
        Format::Unchecksummed => Decision::Hide(checkpointed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opened(first_offset: Offset, log_end: Offset, first_epoch_start: Option<Offset>) -> Opened {
        Opened { first_offset, log_end, first_epoch_start }
    }

    #[test]
    fn checksummed_starts_hide_records_as_far_as_the_log_reaches() {
        let log = opened(0, 30, Some(13));
        assert_eq!(decide(13, Format::Checksummed, log), Decision::Hide(13));
        assert_eq!(decide(40, Format::Checksummed, log), Decision::Hide(30), "the tail was lost: no further than the end");
        assert_eq!(decide(0, Format::Checksummed, log), Decision::Nothing);
        assert_eq!(decide(5, Format::Checksummed, opened(9, 30, None)), Decision::Nothing, "below the first segment");
    }

    #[test]
    fn unchecksummed_starts_apply_only_where_the_log_agrees() {
        let log = opened(0, 30, Some(13));
        assert_eq!(decide(13, Format::Unchecksummed, log), Decision::Hide(13), "what DeleteRecords left");
        assert_eq!(decide(7, Format::Unchecksummed, log), Decision::Hide(7), "lower: hides less, never loses");
        assert!(matches!(decide(19, Format::Unchecksummed, log), Decision::Ignore(_)), "13 with a digit flipped");
        assert!(matches!(decide(93, Format::Unchecksummed, log), Decision::Ignore(_)), "past the end");
        assert!(matches!(decide(31, Format::Unchecksummed, opened(0, 30, None)), Decision::Ignore(_)), "past the end");
        assert_eq!(decide(20, Format::Unchecksummed, opened(0, 30, None)), Decision::Hide(20), "no epochs to check against");
        assert_eq!(decide(0, Format::Unchecksummed, log), Decision::Nothing);
    }
}
