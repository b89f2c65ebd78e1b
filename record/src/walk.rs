//! A structural walk over a Kafka message body, done before a codec decodes it.
//!
//! Why: the `kafka-protocol` crate decodes an array by reading its count and calling
//! `Vec::with_capacity(count)` before it reads any element. A message of a few bytes
//! that claims two billion elements makes that allocation fail, and a failed allocation
//! aborts the whole process. The broker must not be taken down that way by a request,
//! nor a client (the mirror, the gateway) by a broker's answer. A [`Walker`] follows a
//! message's schema without allocating and refuses any array longer than the bytes left
//! (every element takes at least one byte), and more elements in one message than its
//! caller allows. A body that walks is safe to decode.
//!
//! This module holds the primitives (the wire types of the Kafka protocol); the schemas,
//! one per API and version, live with the side that decodes them: the broker's request
//! schemas in the broker, the answers' schemas in [`crate::answers`] (decoded by the
//! client and by the broker's peer connections both). The exception is the consumer protocol's
//! embedded messages ([`consumer_subscription`], [`consumer_assignment`]), which travel
//! as opaque bytes inside the group APIs and which both sides decode. It knows nothing of
//! any codec crate.

/// The result of a walking step: `Err` says why the message is malformed or too large.
pub type Walk<T = ()> = Result<T, &'static str>;

/// A cursor over a message body that checks its structure without decoding it.
#[derive(Debug)]
pub struct Walker<'a> {
    buf: &'a [u8],
    /// Whether the message's version is a "flexible" one (KIP-482): compact strings,
    /// arrays and bytes, and tagged fields at the end of every struct.
    flexible: bool,
    /// The most array elements and tagged fields the whole message may hold.
    max_elements: u64,
    /// Array elements and tagged fields walked so far.
    elements: u64,
}

impl<'a> Walker<'a> {
    /// A walker over `body`, in the flexible layout or not, that refuses more than
    /// `max_elements` array elements and tagged fields in all.
    pub fn new(body: &'a [u8], flexible: bool, max_elements: u64) -> Self {
        Self { buf: body, flexible, max_elements, elements: 0 }
    }

    /// Array elements and tagged fields walked so far: what the decoded form will cost.
    pub fn elements(&self) -> u64 {
        self.elements
    }

    /// Bytes not walked yet.
    pub fn remaining(&self) -> usize {
        self.buf.len()
    }

    fn skip(&mut self, n: usize) -> Walk {
        if n > self.buf.len() {
            return Err("field runs past the end of the message");
        }
        self.buf = &self.buf[n..];
        Ok(())
    }

    fn take<const N: usize>(&mut self) -> Walk<[u8; N]> {
        let bytes: [u8; N] = self.buf.get(..N).ok_or("field runs past the end of the message")?.try_into().unwrap_or([0; N]);
        self.buf = &self.buf[N..];
        Ok(bytes)
    }

    /// One byte, returned: the marker of a nullable struct, for one.
    pub fn byte(&mut self) -> Walk<u8> {
        let [byte] = self.take::<1>()?;
        Ok(byte)
    }

    /// An int8 (or a boolean).
    pub fn int8(&mut self) -> Walk {
        self.skip(1)
    }
    /// An int16.
    pub fn int16(&mut self) -> Walk {
        self.skip(2)
    }
    /// An int32.
    pub fn int32(&mut self) -> Walk {
        self.skip(4)
    }
    /// An int64 (or a float64).
    pub fn int64(&mut self) -> Walk {
        self.skip(8)
    }
    /// A UUID.
    pub fn uuid(&mut self) -> Walk {
        self.skip(16)
    }

    /// An unsigned varint of at most 32 bits, returned.
    pub fn unsigned_varint(&mut self) -> Walk<u32> {
        let mut value = 0u32;
        for shift in (0..35).step_by(7) {
            let [byte] = self.take::<1>()?;
            value |= u32::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err("varint longer than 5 bytes")
    }

    /// A (nullable) string or byte string: compact or classic, `classic_len_bytes` wide
    /// when classic.
    pub fn sized(&mut self, classic_len_bytes: usize) -> Walk {
        let len = if self.flexible {
            match self.unsigned_varint()? {
                0 => return Ok(()), // null
                n => i64::from(n) - 1,
            }
        } else if classic_len_bytes == 2 {
            i64::from(i16::from_be_bytes(self.take::<2>()?))
        } else {
            i64::from(i32::from_be_bytes(self.take::<4>()?))
        };
        if len < 0 {
            return Ok(()); // null; the decoder rejects other negative lengths itself
        }
        self.skip(usize::try_from(len).map_err(|_| "length out of range")?)
    }

    /// A (nullable) string.
    pub fn string(&mut self) -> Walk {
        self.sized(2)
    }
    /// A (nullable) byte string; also a records field, which the walk does not look into.
    pub fn bytes(&mut self) -> Walk {
        self.sized(4)
    }

    /// Counts `n` more elements against the message's limit.
    pub fn count(&mut self, n: u64) -> Walk {
        self.elements = self.elements.saturating_add(n);
        if self.elements > self.max_elements {
            return Err("more array elements and tagged fields than one message may hold");
        }
        Ok(())
    }

    /// A (nullable) array whose elements `each` walks; the count may not exceed the bytes
    /// left, nor the message's element limit.
    pub fn array(&mut self, mut each: impl FnMut(&mut Self) -> Walk) -> Walk {
        let count = if self.flexible {
            match self.unsigned_varint()? {
                0 => return Ok(()),
                n => i64::from(n) - 1,
            }
        } else {
            match i32::from_be_bytes(self.take::<4>()?) {
                -1 => return Ok(()),
                n if n < 0 => return Err("negative array length"),
                n => i64::from(n),
            }
        };
        if count > self.buf.len() as i64 {
            return Err("array claims more elements than the message has bytes");
        }
        self.count(count as u64)?;
        for _ in 0..count {
            each(self)?;
        }
        Ok(())
    }

    /// The tagged fields of a flexible struct, none of which the decoder knows: each is
    /// skipped by its declared size.
    pub fn tagged_fields(&mut self) -> Walk {
        self.tagged_fields_with(|_, _| Ok(false))
    }

    /// The tagged fields of a flexible struct, some of which the decoder knows.
    ///
    /// A codec decodes a known tag's value from the message itself, by its schema, not
    /// from the declared size; so `known(tag, walker)` walks such a value (over a walker
    /// that holds exactly the declared bytes) and says `true`, and the value must then
    /// fill its declared size exactly. Otherwise the decoder and this walk would part ways
    /// and the decoder could read an array count the walk never checked. `false` means an
    /// unknown tag, skipped by its size as the decoder skips it.
    pub fn tagged_fields_with(&mut self, mut known: impl FnMut(u32, &mut Self) -> Walk<bool>) -> Walk {
        if !self.flexible {
            return Ok(());
        }
        let count = self.unsigned_varint()?;
        self.count(u64::from(count))?;
        for _ in 0..count {
            let tag = self.unsigned_varint()?;
            let size = self.unsigned_varint()? as usize;
            let value = self.buf.get(..size).ok_or("tagged field runs past the end of the message")?;
            let mut inner = Walker { buf: value, flexible: true, max_elements: self.max_elements, elements: self.elements };
            if known(tag, &mut inner)? && inner.remaining() != 0 {
                return Err("tagged field's value is shorter than its declared size");
            }
            self.elements = inner.elements;
            self.buf = &self.buf[size..];
        }
        Ok(())
    }
}

/// Walks a consumer-protocol subscription (a `consumer` group member's JoinGroup
/// protocol metadata, after its 2-byte version prefix) as the decoder reads it at
/// `version` (0 to 3; later versions only append fields, which the decoder leaves unread
/// and so does the walk). The broker and the group's leader decode these bytes, which any
/// member of the group wrote, so they are walked before.
pub fn consumer_subscription(body: &[u8], version: i16, max_elements: u64) -> Walk {
    if !(0..=3).contains(&version) {
        return Err("no consumer subscription of this version");
    }
    let w = &mut Walker::new(body, false, max_elements);
    w.array(Walker::string)?; // topics
    w.bytes()?; // user data
    if version >= 1 {
        consumer_topic_partitions(w)?; // owned partitions
    }
    if version >= 2 {
        w.int32()?; // generation id
    }
    if version >= 3 {
        w.string()?; // rack id
    }
    Ok(())
}

/// Walks a consumer-protocol assignment (in a SyncGroup request or answer, and in
/// DescribeGroups answers, after its 2-byte version prefix) as the decoder reads it at
/// `version` (0 to 3): the group leader, another client, wrote it.
pub fn consumer_assignment(body: &[u8], version: i16, max_elements: u64) -> Walk {
    if !(0..=3).contains(&version) {
        return Err("no consumer assignment of this version");
    }
    let w = &mut Walker::new(body, false, max_elements);
    consumer_topic_partitions(w)?; // assigned partitions
    w.bytes() // user data
}

/// Topics, each with its partition numbers: the consumer protocol's one nested array.
fn consumer_topic_partitions(w: &mut Walker<'_>) -> Walk {
    w.array(|w| {
        w.string()?; // topic
        w.array(Walker::int32) // partitions
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrays_may_not_claim_more_elements_than_bytes_left() {
        // Classic: 2^31-1 int32s in a 4-byte body.
        let body = i32::MAX.to_be_bytes();
        let w = &mut Walker::new(&body, false, u64::MAX);
        assert_eq!(w.array(Walker::int32), Err("array claims more elements than the message has bytes"));
        // Compact: a count of u32::MAX - 1.
        let w = &mut Walker::new(&[0xff, 0xff, 0xff, 0xff, 0x0f], true, u64::MAX);
        assert_eq!(w.array(Walker::int32), Err("array claims more elements than the message has bytes"));
        // Null arrays walk; other negative counts do not.
        assert_eq!(Walker::new(&(-1i32).to_be_bytes(), false, 10).array(Walker::int32), Ok(()));
        assert_eq!(Walker::new(&(-2i32).to_be_bytes(), false, 10).array(Walker::int32), Err("negative array length"));
    }

    #[test]
    fn counts_elements_against_the_callers_limit() {
        // Three int8s, classic layout.
        let body = [0, 0, 0, 3, 1, 2, 3];
        let w = &mut Walker::new(&body, false, 3);
        assert_eq!(w.array(Walker::int8), Ok(()));
        assert_eq!((w.elements(), w.remaining()), (3, 0));
        let w = &mut Walker::new(&body, false, 2);
        assert_eq!(w.array(Walker::int8), Err("more array elements and tagged fields than one message may hold"));
    }

    #[test]
    fn strings_and_bytes_in_both_layouts() {
        let w = &mut Walker::new(&[0, 2, b'a', b'b', 0xff, 0xff, 0, 0, 0, 1, 7], false, 0);
        assert_eq!((w.string(), w.string(), w.bytes(), w.remaining()), (Ok(()), Ok(()), Ok(()), 0));
        let w = &mut Walker::new(&[3, b'a', b'b', 0, 2, 7], true, 0);
        assert_eq!((w.string(), w.string(), w.bytes(), w.remaining()), (Ok(()), Ok(()), Ok(()), 0));
        assert_eq!(Walker::new(&[0, 3, b'a'], false, 0).string(), Err("field runs past the end of the message"));
        assert_eq!(Walker::new(&[0x80; 6], true, 0).unsigned_varint(), Err("varint longer than 5 bytes"));
    }

    #[test]
    fn consumer_protocol_arrays_may_not_claim_more_than_their_bytes() {
        // A v1 subscription: topics ["t"], null user data, owned partitions [("t", [0, 1])].
        let mut subscription = vec![0, 0, 0, 1, 0, 1, b't', 0xff, 0xff, 0xff, 0xff];
        subscription.extend([0, 0, 0, 1, 0, 1, b't', 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(consumer_subscription(&subscription, 1, 10), Ok(()));
        assert_eq!(
            consumer_subscription(&subscription, 1, 3),
            Err("more array elements and tagged fields than one message may hold")
        );
        // Read as v0, the owned partitions are left unread, as the decoder leaves them.
        assert_eq!(consumer_subscription(&subscription, 0, 10), Ok(()));
        assert!(consumer_subscription(&subscription, 2, 10).is_err(), "no generation id");
        // Topics claiming 2^31-1 entries.
        let hostile = [0x7f, 0xff, 0xff, 0xff, 0, 0];
        assert_eq!(consumer_subscription(&hostile, 0, 10), Err("array claims more elements than the message has bytes"));
        // An assignment: [("t", [2^31-1 partitions])], then user data.
        let hostile = [0, 0, 0, 1, 0, 1, b't', 0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0];
        assert_eq!(consumer_assignment(&hostile, 0, 10), Err("array claims more elements than the message has bytes"));
        assert_eq!(consumer_assignment(&[0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff], 3, 10), Ok(()));
        assert_eq!(consumer_assignment(&[], 4, 10), Err("no consumer assignment of this version"));
    }

    #[test]
    fn known_tagged_fields_must_fill_their_declared_size() {
        // One tagged field, tag 0, of 4 bytes; the caller knows tag 0 as an int32.
        let int32 = |tag: u32, w: &mut Walker<'_>| if tag == 0 { w.int32().map(|()| true) } else { Ok(false) };
        let w = &mut Walker::new(&[1, 0, 4, 0, 0, 0, 9], true, 10);
        assert_eq!((w.tagged_fields_with(int32), w.remaining(), w.elements()), (Ok(()), 0, 1));
        // Declared as 5 bytes: the decoder would read 4 and take the fifth for the next tag.
        let w = &mut Walker::new(&[1, 0, 5, 0, 0, 0, 9, 0], true, 10);
        assert_eq!(w.tagged_fields_with(int32), Err("tagged field's value is shorter than its declared size"));
        // Declared as 2 bytes: the value runs past its field.
        let w = &mut Walker::new(&[1, 0, 2, 0, 0, 0, 9], true, 10);
        assert_eq!(w.tagged_fields_with(int32), Err("field runs past the end of the message"));
        // An unknown tag is skipped by its size, whatever it holds.
        let w = &mut Walker::new(&[1, 5, 3, 0xff, 0xff, 0xff], true, 10);
        assert_eq!((w.tagged_fields_with(int32), w.remaining()), (Ok(()), 0));
        // Not flexible: there are no tagged fields to walk.
        let w = &mut Walker::new(&[1], false, 10);
        assert_eq!((w.tagged_fields(), w.remaining()), (Ok(()), 1));
    }
}
