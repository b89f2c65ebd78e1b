//! A response ready for the socket: byte buffers and regions of segment files, in order.
//! File regions are what make fetch zero-copy: the connection sends them with sendfile(2).

use std::fs::File;
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
