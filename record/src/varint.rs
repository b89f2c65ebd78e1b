//! Zig-zag varints (protobuf style), as used by the fields of a v2 record.

/// Appends `value` as a zig-zag varint.
pub fn put_varint(buf: &mut Vec<u8>, value: i32) {
    put_varlong(buf, value as i64);
}

/// Appends `value` as a zig-zag varlong.
pub fn put_varlong(buf: &mut Vec<u8>, value: i64) {
    let mut v = ((value << 1) ^ (value >> 63)) as u64;
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

/// Number of bytes [`put_varlong`] writes for `value`.
pub fn varlong_len(value: i64) -> usize {
    let v = ((value << 1) ^ (value >> 63)) as u64;
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

/// Reads a zig-zag varlong from the start of `buf`: `(value, bytes read)`, or `None`
/// when the buffer ends first or the encoding is longer than 10 bytes.
pub fn get_varlong(buf: &[u8]) -> Option<(i64, usize)> {
    let mut raw: u64 = 0;
    for (i, &byte) in buf.iter().enumerate().take(10) {
        raw |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            let value = ((raw >> 1) as i64) ^ -((raw & 1) as i64);
            return Some((value, i + 1));
        }
    }
    None
}

/// Reads a zig-zag varint; `None` also when the value does not fit an `i32`.
pub fn get_varint(buf: &[u8]) -> Option<(i32, usize)> {
    let (v, n) = get_varlong(buf)?;
    Some((i32::try_from(v).ok()?, n))
}

/// Reads the zig-zag varlong at `*at` of `buf` (the same encoding and limits as
/// [`get_varlong`]) and moves `*at` past it; one and two bytes, nearly all the
/// varints of a record (lengths and deltas below 8192), take no loop.
#[inline(always)]
pub fn varlong_at(buf: &[u8], at: &mut usize) -> Option<i64> {
    let first = *buf.get(*at)?;
    if first < 0x80 {
        *at += 1;
        return Some(i64::from(first >> 1) ^ -i64::from(first & 1));
    }
    if let Some(&second) = buf.get(*at + 1) {
        if second < 0x80 {
            *at += 2;
            let raw = i64::from(first & 0x7f) | i64::from(second) << 7;
            return Some((raw >> 1) ^ -(raw & 1));
        }
    }
    let (value, n) = get_varlong(&buf[*at..])?;
    *at += n;
    Some(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn known_encodings() {
        let cases: [(i64, &[u8]); 5] = [(0, &[0]), (-1, &[1]), (1, &[2]), (63, &[126]), (-65, &[0x81, 0x01])];
        for (value, bytes) in cases {
            let mut buf = Vec::new();
            put_varlong(&mut buf, value);
            assert_eq!(buf, bytes, "{value}");
            assert_eq!(varlong_len(value), bytes.len());
        }
    }

    #[test]
    fn truncated_and_overlong_inputs_are_rejected() {
        assert_eq!(get_varlong(&[0x80]), None);
        assert_eq!(get_varlong(&[0xff; 11]), None);
        assert_eq!(get_varint(&[0xfe, 0xff, 0xff, 0xff, 0x7f]), None);
    }

    proptest! {
        #[test]
        fn round_trip(value in any::<i64>()) {
            let mut buf = Vec::new();
            put_varlong(&mut buf, value);
            prop_assert_eq!(buf.len(), varlong_len(value));
            prop_assert_eq!(get_varlong(&buf), Some((value, buf.len())));
        }
    }
}
