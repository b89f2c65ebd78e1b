//! Fjord's gRPC front: the `fjord.v1` protocol ([`Publisher`](v1::publisher_server::Publisher)
//! and [`Subscriber`](v1::subscriber_server::Subscriber)) and its tonic/prost generated code.
//!
//! # Layout
//! - `fjord/v1/events.proto`: the contract, the one source of truth; other languages
//!   (Python grpcio, grpcurl) use it directly or through the gateway's reflection service.
//! - `build.rs`: code generation with the vendored `protoc` (no system package needed).
//! - [`v1`]: the generated messages, clients and servers; `bytes` fields are [`prost::bytes::Bytes`]
//!   so payloads move without copies.
//! - [`FILE_DESCRIPTOR_SET`]: the encoded descriptors, for `tonic-reflection`.
//! - [`codec`]: the codec of every call, prost's with a `PublishRequest`'s event and
//!   header counts bounded before it is decoded.

pub mod codec;

/// The `fjord.v1` package: messages, `*_client` and `*_server` modules.
#[allow(missing_docs, unreachable_pub, clippy::all)]
pub mod v1 {
    tonic::include_proto!("fjord.v1");
}

/// The encoded `FileDescriptorSet` of `fjord.v1`, served by gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("fjord_v1_descriptor");
