//! The accept loop of an HTTP/gRPC service: plain TCP, or TLS with every handshake on its
//! own task under `ssl.handshake.timeout.ms`, so garbage instead of a ClientHello, an
//! untrusted certificate or a stalled client fails alone (logged once with its address)
//! while the loop goes on accepting. Established connections, with who the peer is, come
//! out of [`Incoming`] in the order their handshakes finish.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

use super::HttpSecurity;
use crate::Principal;

/// Handshakes in progress at once; past it new connections are closed at once, so a
/// flood of stalled clients holds at most this many sockets.
const MAX_HANDSHAKES: usize = 1024;
/// Established connections waiting for the server to take them.
const READY_QUEUE: usize = 64;

/// Who is at the other end of a connection.
#[derive(Debug, Clone)]
pub struct Peer {
    /// The client's address.
    pub addr: SocketAddr,
    /// The principal of its trusted client certificate, if it presented one.
    pub certificate_principal: Option<Principal>,
}

impl Peer {
    /// The client's IP address, as ACL hosts name it.
    pub fn host(&self) -> String {
        self.addr.ip().to_string()
    }
}

/// An established connection: plain TCP or TLS over it.
#[derive(Debug)]
pub enum Conn {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS, handshake done.
    Tls(Box<TlsStream<TcpStream>>),
}

/// Established connections of one listener.
#[derive(Debug)]
pub struct Incoming {
    ready: mpsc::Receiver<(Conn, Peer)>,
    local: SocketAddr,
}

impl Incoming {
    /// Starts accepting on `listener` (TLS when `security` has it) until `shutdown`.
    pub fn start(listener: TcpListener, security: Arc<HttpSecurity>, shutdown: CancellationToken) -> io::Result<Self> {
        let local = listener.local_addr()?;
        let (tx, ready) = mpsc::channel(READY_QUEUE);
        tokio::spawn(accept_loop(listener, security, tx, shutdown));
        Ok(Self { ready, local })
    }

    /// The next established connection; `None` once the listener stopped.
    pub async fn next(&mut self) -> Option<(Conn, Peer)> {
        self.ready.recv().await
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }
}

async fn accept_loop(
    listener: TcpListener,
    security: Arc<HttpSecurity>,
    ready: mpsc::Sender<(Conn, Peer)>,
    shutdown: CancellationToken,
) {
    let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = shutdown.cancelled() => return,
            () = ready.closed() => return,
        };
        let (stream, addr) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed; retrying in 100 ms");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // Small answers of a stream must not wait for the peer's delayed ACK (Nagle).
        let _ = stream.set_nodelay(true);
        let Some(tls) = security.tls() else {
            let peer = Peer { addr, certificate_principal: None };
            if ready.send((Conn::Plain(stream), peer)).await.is_err() {
                return;
            }
            continue;
        };
        let Ok(permit) = handshakes.clone().try_acquire_owned() else {
            tracing::warn!(%addr, "too many TLS handshakes in progress; connection closed");
            continue;
        };
        let acceptor = tls.acceptor();
        let (security, ready) = (security.clone(), ready.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let timeout = security.config().handshake_timeout;
            let stream = match tokio::time::timeout(timeout, acceptor.accept(stream)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => {
                    tracing::warn!(%addr, error = %e, "TLS handshake failed; connection closed");
                    return;
                }
                Err(_) => {
                    tracing::warn!(%addr, ?timeout, "TLS handshake did not finish in time; connection closed");
                    return;
                }
            };
            let certificate = stream.get_ref().1.peer_certificates().and_then(|chain| chain.first());
            let certificate_principal = match certificate.map(|c| crate::tls::certificate_subject(c)) {
                None => None,
                Some(Some(subject)) => security.tls().map(|tls| tls.config().principal(&subject)),
                Some(None) => {
                    tracing::warn!(%addr, "client certificate subject does not parse; connection closed");
                    return;
                }
            };
            let _ = ready.send((Conn::Tls(Box::new(stream)), Peer { addr, certificate_principal })).await;
        });
    }
}

impl AsyncRead for Conn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Plain(s) => s.is_write_vectored(),
            Conn::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_flush(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// axum serves an [`Incoming`] as it serves a `TcpListener`; handlers see the [`Peer`]
/// through `ConnectInfo<Peer>`.
#[cfg(feature = "axum")]
mod axum_glue {
    use axum::extract::connect_info::Connected;
    use axum::serve::IncomingStream;

    use super::*;

    impl axum::serve::Listener for Incoming {
        type Io = Conn;
        type Addr = Peer;

        async fn accept(&mut self) -> (Conn, Peer) {
            match self.next().await {
                Some(next) => next,
                // The loop stopped (shutdown): the server's graceful shutdown ends serve.
                None => std::future::pending().await,
            }
        }

        fn local_addr(&self) -> io::Result<Peer> {
            Ok(Peer { addr: self.local, certificate_principal: None })
        }
    }

    impl Connected<IncomingStream<'_, Incoming>> for Peer {
        fn connect_info(stream: IncomingStream<'_, Incoming>) -> Self {
            stream.remote_addr().clone()
        }
    }
}
