//! The client against a hostile "broker": a plain TCP listener on 127.0.0.1:0 that reads
//! request frames and answers with a body of a few bytes claiming two billion array
//! elements. Decoded unchecked, such an answer makes the codec allocate for all of them,
//! and a failed allocation aborts the process (this test binary with it); the client
//! must refuse the answer with an error instead, and the process carry on.

use std::time::Duration;

use fjord_client::{Admin, ClientConfig, Error};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const METADATA: i16 = 3;
const API_VERSIONS: i16 = 18;

/// Which answer the fake broker makes hostile.
#[derive(Clone, Copy)]
enum Hostile {
    /// The first answer of every connection: ApiVersions v0.
    ApiVersions,
    /// The Metadata answer that follows a correct ApiVersions answer.
    Metadata,
}

/// An ApiVersions v0 body advertising Metadata v0-12 and ApiVersions v0-3.
fn api_versions_body() -> Vec<u8> {
    let mut body = 0i16.to_be_bytes().to_vec(); // error code
    body.extend(2i32.to_be_bytes()); // api keys
    for (key, min, max) in [(METADATA, 0i16, 12i16), (API_VERSIONS, 0, 3)] {
        body.extend(key.to_be_bytes());
        body.extend(min.to_be_bytes());
        body.extend(max.to_be_bytes());
    }
    body
}

/// An ApiVersions v0 body whose api keys claim 0x7fff_ffff entries, in 12 bytes.
fn hostile_api_versions_body() -> Vec<u8> {
    let mut body = 0i16.to_be_bytes().to_vec();
    body.extend(0x7fff_ffffi32.to_be_bytes());
    body.extend([0; 6]); // one api key's worth of bytes
    body
}

/// A Metadata v12 body (flexible) whose topics claim 0x7fff_ffff entries.
fn hostile_metadata_body() -> Vec<u8> {
    let mut body = 0i32.to_be_bytes().to_vec(); // throttle time
    body.push(1); // brokers: compact array of none
    body.push(0); // cluster id: null
    body.extend(1i32.to_be_bytes()); // controller id
    body.extend([0x80, 0x80, 0x80, 0x80, 0x08]); // topics: compact count 0x8000_0000, that is 0x7fff_ffff elements
    body.extend([0; 8]);
    body
}

/// Starts the fake broker; it serves one connection, then stops.
async fn hostile_broker(hostile: Hostile) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("an ephemeral port");
    let addr = listener.local_addr().expect("bound").to_string();
    tokio::spawn(async move {
        let Ok((mut socket, _)) = listener.accept().await else { return };
        loop {
            let Ok(len) = socket.read_i32().await else { return };
            let mut request = vec![0; len as usize];
            if socket.read_exact(&mut request).await.is_err() {
                return;
            }
            // Request header: api key, api version, correlation id, ...
            let api_key = i16::from_be_bytes([request[0], request[1]]);
            let mut answer = request[4..8].to_vec(); // the correlation id
            match (api_key, hostile) {
                (API_VERSIONS, Hostile::ApiVersions) => answer.extend(hostile_api_versions_body()),
                (API_VERSIONS, Hostile::Metadata) => answer.extend(api_versions_body()),
                (METADATA, _) => {
                    answer.push(0); // response header v1: no tagged fields
                    answer.extend(hostile_metadata_body());
                }
                _ => return,
            }
            let frame = [(answer.len() as i32).to_be_bytes().as_slice(), &answer].concat();
            if socket.write_all(&frame).await.is_err() {
                return;
            }
        }
    });
    addr
}

fn client(addr: &str) -> ClientConfig {
    ClientConfig { connect_timeout: Duration::from_secs(5), request_timeout: Duration::from_secs(5), ..ClientConfig::new(addr) }
}

/// The detail of the protocol error `result` failed with.
fn protocol_detail(result: Result<Admin, Error>) -> String {
    match result {
        Err(Error::Protocol { detail, .. }) => detail,
        Err(other) => panic!("expected a protocol error, got {other}"),
        Ok(_) => panic!("the hostile answer was accepted"),
    }
}

#[tokio::test]
async fn a_metadata_answer_claiming_two_billion_topics_is_refused_not_allocated() {
    let addr = hostile_broker(Hostile::Metadata).await;
    let detail = protocol_detail(Admin::connect(client(&addr)).await);
    assert_eq!(detail, "refused the Metadata v12 answer: array claims more elements than the message has bytes");
}

#[tokio::test]
async fn an_api_versions_answer_claiming_two_billion_apis_is_refused_not_allocated() {
    let addr = hostile_broker(Hostile::ApiVersions).await;
    let detail = protocol_detail(Admin::connect(client(&addr)).await);
    assert_eq!(detail, "refused the ApiVersions v0 answer: array claims more elements than the message has bytes");
}
