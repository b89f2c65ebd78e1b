//! A structural walk over a broker's answer before the codec crate decodes it.
//!
//! Why: `kafka-protocol` decodes an array by reading its count and calling
//! `Vec::with_capacity(count)` before reading any element, and a failed allocation aborts
//! the process. One answer of a few bytes claiming two billion elements, from a hostile
//! or broken broker (or anyone in the middle of a plaintext link), would take down the
//! mirror, the gateway or the CLI, whatever else they were doing. Kafka's Java clients
//! refuse such an answer instead; so does this client, with the answers' schemas in
//! [`fjord_record::answers`] (shared with the broker's connections to its peers), for
//! every API this client sends, at every version it may send it. The walk starts after
//! the response header.
//!
//! The client never asks a version above the walked ones ([`highest_walked`]); an answer
//! at a version without a walk is refused, not decoded unchecked.

use fjord_record::answers;
use fjord_record::walk::Walk;
use kafka_protocol::messages::ApiKey;

use crate::error::Error;

/// The most array elements and tagged fields one answer may hold (see its comment).
pub(crate) use fjord_record::answers::MAX_RESPONSE_ELEMENTS;

/// The highest version of API `key` whose answer is walked (`None`: no walk at all).
/// `Connection::version` never picks a higher one, so a version raised at a call site
/// without its walk stays at the last walked version instead of being refused.
///
/// The shared table also walks answers only the broker receives (AddPartitionsToTxn v4
/// and v5, the broker-to-broker form); the client's one AddPartitionsToTxn call asks v3
/// at most (`preferred`), which this cap does not raise.
pub(crate) fn highest_walked(api_key: i16) -> Option<i16> {
    answers::highest_walked(api_key)
}

/// Checks the body (after the response header) of an answer to a request of API
/// `api_key` at `version`: `Ok` means decoding it allocates no more than its bytes
/// justify. Bytes after the walked body are left to the caller, as the decoder leaves them.
pub(crate) fn check_response(api_key: i16, version: i16, body: &[u8]) -> Walk {
    answers::walk_answer(api_key, version, body, MAX_RESPONSE_ELEMENTS).map(|_| ())
}

/// The error for an answer [`check_response`] refused.
pub(crate) fn refused(broker: &str, api_key: i16, version: i16, reason: &str) -> Error {
    let api = ApiKey::try_from(api_key).map_or_else(|()| format!("api {api_key}"), |key| format!("{key:?}"));
    Error::Protocol { broker: broker.to_owned(), detail: format!("refused the {api} v{version} answer: {reason}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_the_api_the_version_and_the_reason() {
        let error =
            refused("broker:9092", ApiKey::ApiVersions as i16, 0, "array claims more elements than the message has bytes");
        assert_eq!(
            error.to_string(),
            Error::Protocol {
                broker: "broker:9092".into(),
                detail: "refused the ApiVersions v0 answer: array claims more elements than the message has bytes".into()
            }
            .to_string()
        );
        assert!(refused("b:1", i16::MAX, 0, "no walk for this API").to_string().contains("api 32767 v0"));
    }

    #[test]
    fn the_client_asks_no_version_above_the_walked_ones() {
        assert_eq!(highest_walked(ApiKey::Metadata as i16), Some(12));
        assert_eq!(highest_walked(ApiKey::ApiVersions as i16), Some(0));
        assert_eq!(highest_walked(ApiKey::Vote as i16), None, "an API the client never sends");
        assert_eq!(highest_walked(i16::MAX), None);
    }

    #[test]
    fn checks_answers_with_the_shared_walk() {
        // ApiVersions v0: an error code, then api keys claiming 2^31-1 entries.
        let mut body = 0i16.to_be_bytes().to_vec();
        body.extend(i32::MAX.to_be_bytes());
        assert_eq!(
            check_response(ApiKey::ApiVersions as i16, 0, &body),
            Err("array claims more elements than the message has bytes")
        );
        assert_eq!(check_response(ApiKey::ApiVersions as i16, 0, &[0, 0, 0, 0, 0, 0]), Ok(()));
        assert_eq!(check_response(ApiKey::Metadata as i16, 13, &[]), Err("no walk for this API version"));
    }
}
