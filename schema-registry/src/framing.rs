//! The de-facto Confluent framing of an Avro payload:
//!
//! ```text
//! byte 0      magic, always 0
//! bytes 1..5  schema id, 4-byte big-endian (a registry global id)
//! bytes 5..   the Avro binary encoding of one datum (no container file header)
//! ```
//!
//! ```
//! use fjord_schema_registry::framing::{frame, unframe};
//! let payload = frame(7, &[0x02, 0x61]);
//! assert_eq!(payload, [0, 0, 0, 0, 7, 0x02, 0x61]);
//! assert_eq!(unframe(&payload).unwrap(), (7, &[0x02, 0x61][..]));
//! ```

use crate::{Error, Result};

/// The only magic byte Confluent's serializers write.
pub const MAGIC: u8 = 0;
/// Magic byte + 4-byte id.
pub const HEADER_LEN: usize = 5;

/// Prefixes an Avro datum with the magic byte and the schema id.
pub fn frame(schema_id: i32, datum: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + datum.len());
    out.push(MAGIC);
    out.extend_from_slice(&schema_id.to_be_bytes());
    out.extend_from_slice(datum);
    out
}

/// Splits a framed payload into its schema id and the Avro datum bytes.
pub fn unframe(payload: &[u8]) -> Result<(i32, &[u8])> {
    if payload.len() < HEADER_LEN {
        return Err(Error::ShortPayload { len: payload.len() });
    }
    if payload[0] != MAGIC {
        return Err(Error::BadMagic(payload[0]));
    }
    let id = i32::from_be_bytes([payload[1], payload[2], payload[3], payload[4]]);
    Ok((id, &payload[HEADER_LEN..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_big_endian_id() {
        let framed = frame(0x0102_0304, b"xyz");
        assert_eq!(&framed[..5], &[0, 1, 2, 3, 4]);
        assert_eq!(unframe(&framed).unwrap(), (0x0102_0304, &b"xyz"[..]));
        // An empty datum is legal (e.g. a record with no fields).
        assert_eq!(unframe(&frame(1, &[])).unwrap(), (1, &[][..]));
    }

    proptest::proptest! {
        #[test]
        fn unframe_never_panics_and_inverts_frame(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64), id in proptest::prelude::any::<i32>()) {
            let _ = unframe(&bytes);
            let framed = frame(id, &bytes);
            proptest::prop_assert_eq!(unframe(&framed).unwrap(), (id, &bytes[..]));
        }
    }

    #[test]
    fn short_and_bad_magic_are_typed_errors() {
        for len in 0..HEADER_LEN {
            assert!(matches!(unframe(&vec![0; len]), Err(Error::ShortPayload { len: l }) if l == len));
        }
        assert!(matches!(unframe(&[1, 0, 0, 0, 1, 9]), Err(Error::BadMagic(1))));
    }
}
