//! One client connection: a reader that decodes and handles requests one at a time (so
//! produce requests on a connection are appended in the order they were sent, as Kafka
//! does), and a writer that sends the responses in the same order while the reader goes
//! on with the next request.
//!
//! Anything that is not a well-formed frame (negative or oversized length, truncation,
//! bytes that do not decode) closes this connection with a log line; nothing else is
//! affected.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::codec::decode_request;
use crate::handler::Broker;
use crate::response::{Chunk, Response};
use crate::{Error, Result};

/// Responses queued for the writer; the reader waits when the client does not read.
const RESPONSE_QUEUE: usize = 16;
/// Small response pieces are gathered into one write up to this size.
const WRITE_BUFFER: usize = 64 * 1024;

/// Serves one connection until the client leaves, misbehaves, or `shutdown` fires.
pub(crate) async fn serve(broker: Arc<Broker>, stream: TcpStream, peer: SocketAddr, shutdown: CancellationToken) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(%peer, error = %e, "could not set TCP_NODELAY");
    }
    let (read, write) = stream.into_split();
    let (responses, queue) = mpsc::channel(RESPONSE_QUEUE);
    let writer = tokio::spawn(write_responses(write, queue));
    let read_result = tokio::select! {
        result = read_requests(&broker, read, responses, peer) => result,
        () = shutdown.cancelled() => Ok(()),
    };
    // The reader has dropped its sender: the writer drains what is queued and stops,
    // unless a client that stopped reading holds it up at shutdown.
    let mut writer = writer;
    let write_result = tokio::select! {
        joined = &mut writer => joined.unwrap_or_else(|e| Err(Error::Task(e))),
        () = shutdown.cancelled() => {
            writer.abort();
            Ok(())
        }
    };
    match read_result.and(write_result) {
        Ok(()) => tracing::debug!(%peer, "connection closed"),
        Err(e @ (Error::Protocol(_) | Error::FrameTooLarge { .. })) => {
            broker.metrics.malformed();
            tracing::warn!(%peer, error = %e, "closing connection after bad request")
        }
        Err(e) => tracing::info!(%peer, error = %e, "connection closed"),
    }
}

async fn read_requests(
    broker: &Broker,
    mut read: OwnedReadHalf,
    responses: mpsc::Sender<Response>,
    peer: SocketAddr,
) -> Result<()> {
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let max = broker.config.socket_request_max_bytes;
    while let Some(frame) = read_frame(&mut read, &mut buf, max).await? {
        let decoded = decode_request(frame).map_err(Error::Protocol)?;
        if let Some(response) = broker.handle(decoded, peer).await {
            if responses.send(response).await.is_err() {
                break; // the writer failed: the client is gone
            }
        }
    }
    Ok(())
}

/// Reads one `i32 length | body` frame; `None` at a clean end of stream.
async fn read_frame(read: &mut OwnedReadHalf, buf: &mut BytesMut, max: usize) -> Result<Option<Bytes>> {
    loop {
        if buf.len() >= 4 {
            let size = i32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
            let size = match usize::try_from(size) {
                Ok(size) if size <= max => size,
                _ => return Err(Error::FrameTooLarge { size: i64::from(size), max }),
            };
            if buf.len() >= 4 + size {
                buf.advance(4);
                return Ok(Some(buf.split_to(size).freeze()));
            }
            buf.reserve(4 + size - buf.len());
        }
        if read.read_buf(buf).await.map_err(Error::Network)? == 0 {
            return if buf.is_empty() {
                Ok(None)
            } else {
                Err(Error::Protocol(format!("connection closed inside a frame ({} bytes pending)", buf.len())))
            };
        }
    }
}

async fn write_responses(mut write: OwnedWriteHalf, mut queue: mpsc::Receiver<Response>) -> Result<()> {
    let mut out: Vec<u8> = Vec::with_capacity(WRITE_BUFFER);
    while let Some(response) = queue.recv().await {
        let mut next = Some(response);
        while let Some(response) = next {
            for chunk in response.chunks {
                match chunk {
                    Chunk::Bytes(bytes) if bytes.len() <= WRITE_BUFFER => out.extend_from_slice(&bytes),
                    Chunk::Bytes(bytes) => {
                        flush(&mut write, &mut out).await?;
                        write.write_all(&bytes).await.map_err(Error::Network)?;
                    }
                    Chunk::File { file, position, len } => {
                        flush(&mut write, &mut out).await?;
                        send_file(write.as_ref(), &file, position, len).await.map_err(Error::Network)?;
                    }
                }
            }
            if out.len() >= WRITE_BUFFER {
                flush(&mut write, &mut out).await?;
            }
            // Gather responses that are already waiting into the same write.
            next = queue.try_recv().ok();
        }
        flush(&mut write, &mut out).await?;
    }
    Ok(())
}

async fn flush(write: &mut OwnedWriteHalf, out: &mut Vec<u8>) -> Result<()> {
    if !out.is_empty() {
        write.write_all(out).await.map_err(Error::Network)?;
        out.clear();
    }
    Ok(())
}

/// Sends `len` bytes of `file` from `position` to the socket with sendfile(2): the
/// kernel moves page-cache pages to the socket, nothing passes through user space.
async fn send_file(stream: &TcpStream, file: &std::fs::File, position: u64, len: usize) -> io::Result<()> {
    let mut offset = i64::try_from(position).map_err(|_| io::Error::other("file position beyond i64"))?;
    let mut remaining = len;
    while remaining > 0 {
        stream.writable().await?;
        let sent = stream.try_io(Interest::WRITABLE, || {
            nix::sys::sendfile::sendfile(stream.as_fd(), file.as_fd(), Some(&mut offset), remaining).map_err(io::Error::from)
        });
        match sent {
            // The file ended early (truncated under us): the frame length is already on
            // the wire, so the only honest way out is to drop the connection.
            Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "segment file shorter than the fetched region")),
            Ok(n) => remaining -= n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
