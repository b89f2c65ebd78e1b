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
pub fn check_publish_request(mut message: &[u8]) -> Result<(), Status> {
    let (mut events, mut headers) = (0usize, 0usize);
    while let Some((field, value)) = next_field(&mut message) {
        let Some(event) = value else { continue };
        if field != EVENTS_FIELD {
            continue;
        }
        events += 1;
        if events > MAX_PUBLISH_EVENTS {
            return Err(Status::resource_exhausted(format!(
                "a PublishRequest may hold at most {MAX_PUBLISH_EVENTS} events; this one holds more: split it"
            )));
        }
        let mut event = event;
        while let Some((field, value)) = next_field(&mut event) {
            headers += usize::from(field == HEADERS_FIELD && value.is_some());
        }
        if headers > MAX_PUBLISH_HEADERS {
            return Err(Status::resource_exhausted(format!(
                "a PublishRequest may hold at most {MAX_PUBLISH_HEADERS} headers over all its events; this one holds more: split it"
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
        _ => return None,
    };
    Some((key >> 3, value))
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
        PublishRequest { topic: "t".into(), events: vec![event; events], acks: 1, batch_id: 9 }.encode_to_vec()
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
    fn malformed_messages_are_left_to_prost() {
        for bad in [&[0x12, 0x7f][..], &[0xff; 11], &[0x0b]] {
            assert!(check_publish_request(bad).is_ok());
            assert!(PublishRequest::decode(bad).is_err());
        }
    }
}
