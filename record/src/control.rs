//! Transaction markers: Kafka's control batches that end a transaction in a partition.
//!
//! A marker is a batch with the transactional and control attribute bits set, the
//! producer id and epoch of the transaction it ends, no sequence (-1), and exactly one
//! record, never compressed:
//! ```text
//! key:   version i16 (0) | type i16 (0 = ABORT, 1 = COMMIT)
//! value: version i16 (0) | coordinator epoch i32
//! ```
//! Other control types (Kafka's KRaft uses 2 and up for its own records) are framed the
//! same way; [`parse_marker`] reports them as [`Control::Other`] so a reader can skip
//! them instead of taking them for a commit or an abort.

use crate::batch::{BatchHeader, BATCH_OVERHEAD};
use crate::builder::BatchBuilder;
use crate::records::Records;
use crate::{Compression, Error, Result};

/// Control record type of an abort marker.
pub const ABORT: i16 = 0;
/// Control record type of a commit marker.
pub const COMMIT: i16 = 1;

/// What a control batch holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// The end of a transaction: committed or aborted, written for a coordinator epoch.
    EndTxn {
        /// `true` for COMMIT, `false` for ABORT.
        commit: bool,
        /// The transaction coordinator's epoch (from the value; -1 when it has none).
        coordinator_epoch: i32,
    },
    /// A control record of another type (or a key version this code does not know).
    Other {
        /// The control type from the key.
        control_type: i16,
    },
}

/// Builds the marker batch ending the transaction of `producer_id` at `producer_epoch`
/// (its base offset and leader epoch are the appending broker's to set).
pub fn end_txn_marker(producer_id: i64, producer_epoch: i16, coordinator_epoch: i32, commit: bool, timestamp: i64) -> Vec<u8> {
    let mut key = [0u8; 4];
    key[2..].copy_from_slice(&(if commit { COMMIT } else { ABORT }).to_be_bytes());
    let mut value = [0u8; 6];
    value[2..].copy_from_slice(&coordinator_epoch.to_be_bytes());
    let mut b = BatchBuilder::with_capacity(timestamp, 32).producer(producer_id, producer_epoch, -1).transactional().control();
    b.append(timestamp, Some(&key), Some(&value), &[]);
    b.build_vec()
}

/// Reads the control record of the control batch `batch` (whole, CRC already checked by
/// whoever parsed `header`). A control batch that is compressed, empty, or whose record
/// does not walk is [`Error::MalformedRecord`]: brokers never write such a thing.
pub fn parse_marker(header: &BatchHeader, batch: &[u8]) -> Result<Control> {
    let bad = |detail| Error::MalformedRecord { position: BATCH_OVERHEAD, detail };
    if !header.is_control() {
        return Err(bad("not a control batch"));
    }
    if header.compression() != Compression::None {
        return Err(bad("a control batch is never compressed"));
    }
    let body = batch.get(BATCH_OVERHEAD..header.size()).ok_or_else(|| bad("control batch shorter than its header says"))?;
    let record = Records::new(body, BATCH_OVERHEAD).next().ok_or_else(|| bad("control batch without a record"))??;
    let key = record.key.ok_or_else(|| bad("control record without a key"))?;
    let [kv0, kv1, kt0, kt1, ..] = *key else {
        return Err(bad("control record key shorter than 4 bytes"));
    };
    let (key_version, control_type) = (i16::from_be_bytes([kv0, kv1]), i16::from_be_bytes([kt0, kt1]));
    if key_version != 0 || !(control_type == ABORT || control_type == COMMIT) {
        return Ok(Control::Other { control_type });
    }
    // The value's version (i16) then the coordinator epoch; Kafka reads only these.
    let coordinator_epoch = match record.value {
        Some([_, _, e0, e1, e2, e3, ..]) => i32::from_be_bytes([*e0, *e1, *e2, *e3]),
        _ => return Err(bad("end-transaction marker value shorter than 6 bytes")),
    };
    Ok(Control::EndTxn { commit: control_type == COMMIT, coordinator_epoch })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_round_trip_with_the_control_and_transactional_bits() {
        for commit in [true, false] {
            let bytes = end_txn_marker(42, 3, 7, commit, 1_700_000_000_000);
            let header = BatchHeader::parse_validated(&bytes).unwrap();
            assert!(header.is_control() && header.is_transactional());
            assert_eq!((header.producer_id, header.producer_epoch, header.base_sequence, header.record_count), (42, 3, -1, 1));
            assert_eq!(parse_marker(&header, &bytes).unwrap(), Control::EndTxn { commit, coordinator_epoch: 7 });
            // Kafka's exact record bytes: key 00 00 00 0t, value 00 00 00 00 00 07.
            let t = u8::from(commit);
            assert!(bytes.windows(4).any(|w| w == [0, 0, 0, t]));
            assert!(bytes.windows(6).any(|w| w == [0, 0, 0, 0, 0, 7]));
        }
    }

    #[test]
    fn other_control_types_and_damage_are_told_apart() {
        let data = BatchBuilder::new(0).producer(1, 0, 0).transactional().build_vec();
        assert!(parse_marker(&BatchHeader::parse_unchecked(&data).unwrap(), &data).is_err());
        let mut b = BatchBuilder::new(0).control();
        b.append(0, Some(&[0, 0, 0, 2]), Some(&[0, 0]), &[]);
        let other = b.build_vec();
        let header = BatchHeader::parse_validated(&other).unwrap();
        assert_eq!(parse_marker(&header, &other).unwrap(), Control::Other { control_type: 2 });
        let mut b = BatchBuilder::new(0).control();
        b.append(0, Some(&[0, 0, 0, 1]), Some(&[0, 0, 0]), &[]);
        let short = b.build_vec();
        assert!(parse_marker(&BatchHeader::parse_validated(&short).unwrap(), &short).is_err());
        let mut b = BatchBuilder::new(0).control();
        b.append(0, None, None, &[]);
        let keyless = b.build_vec();
        assert!(parse_marker(&BatchHeader::parse_validated(&keyless).unwrap(), &keyless).is_err());
    }
}
