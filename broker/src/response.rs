//! A response ready for the socket: byte buffers and regions of segment files, in order.
//! File regions are what make fetch zero-copy: the connection sends them with sendfile(2).

use std::fs::File;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;

/// One piece of a response frame.
#[derive(Debug, Clone)]
pub(crate) enum Chunk {
    /// Bytes in memory.
    Bytes(Bytes),
    /// `len` bytes of `file` from `position`: whole record batches of a segment.
    File {
        /// The segment file, kept open (and so alive across retention) until sent.
        file: Arc<File>,
        /// Byte position in the file.
        position: u64,
        /// Number of bytes.
        len: usize,
    },
}

impl Chunk {
    pub(crate) fn len(&self) -> usize {
        match self {
            Chunk::Bytes(b) => b.len(),
            Chunk::File { len, .. } => *len,
        }
    }
}

/// A whole response frame, length prefix included.
#[derive(Debug, Clone, Default)]
pub(crate) struct Response {
    pub(crate) chunks: Vec<Chunk>,
}

impl From<Bytes> for Response {
    fn from(bytes: Bytes) -> Self {
        Self { chunks: vec![Chunk::Bytes(bytes)] }
    }
}

/// What a handler hands the connection's writer, in request order.
pub(crate) enum Reply {
    /// A response to write now.
    Now(Response),
    /// A response still being completed: an acks=all produce whose batches are appended
    /// and wait for the ISR. The writer waits for it before writing anything queued
    /// after it, so responses keep the order of the requests while the reader goes on
    /// appending the next requests (`None`: nothing to send).
    Later(Pin<Box<dyn Future<Output = Option<Response>> + Send>>),
}

impl From<Response> for Reply {
    fn from(response: Response) -> Self {
        Reply::Now(response)
    }
}
