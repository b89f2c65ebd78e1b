//! The codec of every `fjord.v1` call: prost's, except that a [`PublishRequest`]'s cost
//! is bounded before it is decoded.
//!
//! Why before: a decoded event costs about a hundred bytes of structs however few bytes
//! it took on the wire (an empty event is two), and a header about seventy. Under the
//! gateway's 10 MiB message limit, a request of empty events decoded into five million
//! of them (about 590 MB once the gateway had converted them), and counting them after
//! decoding would come too late. So the decoder walks the message's protobuf framing
//! first (no allocation: tags, lengths and the events' header fields) and refuses a
//! request over [`MAX_PUBLISH_EVENTS`] events or [`MAX_PUBLISH_HEADERS`] headers with
//! RESOURCE_EXHAUSTED, before prost allocates anything. Every other message decodes as
//! prost decodes it.

use std::any::TypeId;

use prost::Message;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::Status;
use tonic_prost::{ProstCodec, ProstDecoder};

use crate::v1::PublishRequest;

/// Events one `PublishRequest` may hold (a `PublishStream` batch too): 100,000, which
/// a 10 MiB request reaches at 100-byte events; what a batch of that many events costs
/// to decode stays around 25 MB.
pub const MAX_PUBLISH_EVENTS: usize = 100_000;
/// Headers one `PublishRequest` may hold over all its events: four per event of a full
/// request.
pub const MAX_PUBLISH_HEADERS: usize = 4 * MAX_PUBLISH_EVENTS;

/// Field numbers of `PublishRequest.events` and `Event.headers` in `events.proto`.
const EVENTS_FIELD: u64 = 2;
const HEADERS_FIELD: u64 = 3;

/// prost's codec with the check above; the generated clients and servers use it
/// (`build.rs`).
#[derive(Debug, Clone, Default)]
pub struct BoundedCodec<T, U>(ProstCodec<T, U>);

impl<T, U> Codec for BoundedCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = <ProstCodec<T, U> as Codec>::Encoder;
    type Decoder = BoundedDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        self.0.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        BoundedDecoder(self.0.decoder())
    }
}

/// The decoder of [`BoundedCodec`].
#[derive(Debug)]
pub struct BoundedDecoder<U>(ProstDecoder<U>);

impl<U: Message + Default + 'static> Decoder for BoundedDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        if TypeId::of::<U>() == TypeId::of::<PublishRequest>() {
            // tonic hands the decoder one whole message, contiguous in its buffer.
            check_publish_request(bytes::Buf::chunk(buf))?;
        }
        self.0.decode(buf)
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}

/// Counts the events and headers of an encoded `PublishRequest`; refuses it past the
/// limits. Malformed framing is left for prost to report.
pub fn check_publish_request(message: &[u8]) -> Result<(), Status> {
    check_with_limits(message, MAX_PUBLISH_EVENTS, MAX_PUBLISH_HEADERS)
}

fn check_with_limits(mut message: &[u8], max_events: usize, max_headers: usize) -> Result<(), Status> {
    let (mut events, mut headers) = (0usize, 0usize);
    while let Some((field, value)) = next_field(&mut message) {
        let Some(event) = value else { continue };
        if field != EVENTS_FIELD {
            continue;
        }
        events += 1;
        if events > max_events {
            return Err(Status::resource_exhausted(format!(
                "a PublishRequest may hold at most {max_events} events; this one holds more: split it"
            )));
        }
        let mut event = event;
        while let Some((field, value)) = next_field(&mut event) {
            headers += usize::from(field == HEADERS_FIELD && value.is_some());
        }
        if headers > max_headers {
            return Err(Status::resource_exhausted(format!(
                "a PublishRequest may hold at most {max_headers} headers over all its events; this one holds more: split it"
            )));
        }
    }
    Ok(())
}

/// The next field of a protobuf message: its number, and its bytes when it is
/// length-delimited. `None` at the end or at malformed framing.
fn next_field<'a>(buf: &mut &'a [u8]) -> Option<(u64, Option<&'a [u8]>)> {
    let key = varint(buf)?;
    let value = match key & 7 {
        0 => {
            varint(buf)?;
            None
        }
        1 => {
            *buf = buf.get(8..)?;
            None
        }
        2 => {
            let len = usize::try_from(varint(buf)?).ok()?;
            let (value, rest) = (buf.get(..len)?, buf.get(len..)?);
            *buf = rest;
            Some(value)
        }
        5 => {
            *buf = buf.get(4..)?;
            None
        }
        // A (proto2) group: prost skips it as an unknown field and goes on decoding, so
        // the walk skips it too; fields after it must be counted.
        3 => {
            skip_group(buf, key >> 3, 0)?;
            None
        }
        _ => return None,
    };
    Some((key >> 3, value))
}

/// How deep groups may nest: prost's recursion limit, beyond which it refuses the message.
const MAX_GROUP_DEPTH: usize = 100;

/// Skips the fields of group `field` up to and including its end-group key.
fn skip_group(buf: &mut &[u8], field: u64, depth: usize) -> Option<()> {
    if depth >= MAX_GROUP_DEPTH {
        return None;
    }
    loop {
        let key = varint(buf)?;
        match key & 7 {
            4 if key >> 3 == field => return Some(()),
            3 => skip_group(buf, key >> 3, depth + 1)?,
            4 => return None,
            wire_type => skip_value(buf, wire_type)?,
        }
    }
}

/// Skips one value of wire type 0, 1, 2 or 5.
fn skip_value(buf: &mut &[u8], wire_type: u64) -> Option<()> {
    match wire_type {
        0 => {
            varint(buf)?;
        }
        1 => *buf = buf.get(8..)?,
        2 => {
            let len = usize::try_from(varint(buf)?).ok()?;
            *buf = buf.get(len..)?;
        }
        5 => *buf = buf.get(4..)?,
        _ => return None,
    }
    Some(())
}

fn varint(buf: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for (i, &byte) in buf.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            *buf = &buf[i + 1..];
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::{Event, Header};

    fn request(events: usize, headers_each: usize) -> Vec<u8> {
        let event = Event {
            value: Some(b"v".to_vec().into()),
            headers: vec![Header { key: "k".into(), value: b"1".to_vec().into() }; headers_each],
            timestamp_ms: Some(7),
            ..Event::default()
        };
        PublishRequest { topic: "t".into(), events: vec![event; events], acks: 1, batch_id: 9, ..Default::default() }
            .encode_to_vec()
    }

    #[test]
    fn counts_events_and_headers_against_the_limits() {
        assert!(check_publish_request(&request(MAX_PUBLISH_EVENTS, 0)).is_ok());
        let err = check_publish_request(&request(MAX_PUBLISH_EVENTS + 1, 0)).unwrap_err();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        assert!(err.message().contains("100000 events"), "{}", err.message());
        assert!(check_publish_request(&request(1000, MAX_PUBLISH_HEADERS / 1000)).is_ok());
        let err = check_publish_request(&request(1000, MAX_PUBLISH_HEADERS / 1000 + 1)).unwrap_err();
        assert!(err.message().contains("headers"), "{}", err.message());
    }

    #[test]
    fn events_after_a_group_encoded_unknown_field_are_counted() {
        // Field 15 as a (proto2) group: start, one varint inside, end. prost skips it as an
        // unknown field and decodes every event after it, so the walk must too.
        let mut message = vec![0x7b, 0x08, 0x01, 0x7c];
        message.extend(request(MAX_PUBLISH_EVENTS + 1, 0));
        assert_eq!(PublishRequest::decode(&message[..]).unwrap().events.len(), MAX_PUBLISH_EVENTS + 1);
        assert_eq!(check_publish_request(&message).unwrap_err().code(), tonic::Code::ResourceExhausted);
    }

    proptest::proptest! {
        /// Whatever bytes a client sends, a request the walk lets through decodes (if prost
        /// decodes it at all) to no more events and headers than the limits: the walk never
        /// counts fewer than prost decodes. Limits of 3 events and 5 headers, on mutated
        /// small requests with group-encoded unknown fields spliced in.
        #[test]
        fn nothing_prost_decodes_escapes_the_count(
            events in 0usize..6,
            headers in 0usize..3,
            edits in proptest::collection::vec((0usize..512, 0u8..=255, 0u8..3), 0..6),
        ) {
            let mut message = request(events, headers);
            for (at, byte, kind) in edits {
                let at = at % (message.len() + 1);
                match kind {
                    0 if at < message.len() => message[at] = byte,
                    1 => message.insert(at, byte),
                    // An unknown field 15 as a group holding field 1 = byte, in front.
                    _ => message.splice(0..0, [0x7b, 0x08, byte & 0x7f, 0x7c]).for_each(drop),
                }
            }
            if let (Ok(()), Ok(decoded)) = (check_with_limits(&message, 3, 5), PublishRequest::decode(&message[..])) {
                proptest::prop_assert!(decoded.events.len() <= 3, "{} events passed the walk", decoded.events.len());
                let headers: usize = decoded.events.iter().map(|e| e.headers.len()).sum();
                proptest::prop_assert!(headers <= 5, "{headers} headers passed the walk");
            }
        }
    }

    #[test]
    fn malformed_messages_are_left_to_prost() {
        for bad in [&[0x12, 0x7f][..], &[0xff; 11], &[0x0b]] {
            assert!(check_publish_request(bad).is_ok());
            assert!(PublishRequest::decode(bad).is_err());
        }
    }
}
