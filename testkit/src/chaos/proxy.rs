//! A delaying TCP proxy: the latency fault. These machines' kernel has no `netem`
//! qdisc, so every connection a namespace opens to a broker port is redirected (by an
//! nftables DNAT rule in that namespace, see [`super::netns::Network::intercept`]) to
//! this proxy, which connects on to the original destination from the same namespace
//! (so the broker sees the real source address, which replica fetches are checked
//! against) and holds every chunk of bytes, in each direction, for the current delay of
//! either end (zero when no fault is on). Bytes keep their order; a chunk is never sent
//! before the ones read before it. The proxy's own connections carry [`MARK`], which
//! the DNAT rule lets through.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use nix::sys::socket::{getsockopt, setsockopt, sockopt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The socket mark of the proxy's upstream connections (not redirected again).
pub const MARK: u32 = 0x4a;

/// The current delay of each node, by the last octet of its address.
#[derive(Debug)]
pub struct Delays([AtomicU64; 256]);

impl Default for Delays {
    fn default() -> Self {
        Self(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

impl Delays {
    /// Sets the delay of traffic from and to the node at `ip`.
    pub fn set(&self, ip: std::net::Ipv4Addr, delay: Duration) {
        self.0[usize::from(ip.octets()[3])].store(delay.as_micros() as u64, Ordering::Relaxed);
    }

    /// Clears every delay.
    pub fn clear(&self) {
        for d in &self.0 {
            d.store(0, Ordering::Relaxed);
        }
    }

    fn between(&self, a: std::net::Ipv4Addr, b: std::net::Ipv4Addr) -> Duration {
        let of = |ip: std::net::Ipv4Addr| self.0[usize::from(ip.octets()[3])].load(Ordering::Relaxed);
        Duration::from_micros(of(a).max(of(b)))
    }
}

/// Chunks in flight per direction: bounds the memory a slow side can pin.
const QUEUED_CHUNKS: usize = 256;

/// The proxy of one namespace, on a thread of its own inside it.
#[derive(Debug)]
pub struct DelayProxy {
    shutdown: CancellationToken,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl DelayProxy {
    /// Listens on `listen` (an address of namespace `netns`) for redirected connections.
    pub fn start(netns: &str, listen: SocketAddrV4, delays: Arc<Delays>) -> Result<Self> {
        let shutdown = CancellationToken::new();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<()>>();
        let (netns, stop) = (netns.to_owned(), shutdown.clone());
        let thread = std::thread::Builder::new().name(format!("proxy-{listen}")).spawn(move || {
            let setup = || -> Result<(tokio::runtime::Runtime, std::net::TcpListener)> {
                super::netns::enter(&netns)?;
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
                let listener = std::net::TcpListener::bind(listen).with_context(|| format!("proxy bind {listen} in {netns}"))?;
                listener.set_nonblocking(true)?;
                Ok((runtime, listener))
            };
            match setup() {
                Ok((runtime, listener)) => {
                    let _ = ready_tx.send(Ok(()));
                    runtime.block_on(serve(listener, *listen.ip(), delays, stop));
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            }
        })?;
        ready_rx.recv().map_err(|_| anyhow!("the proxy thread for {listen} ended before listening"))??;
        Ok(Self { shutdown, thread: Some(thread) })
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.shutdown.cancel();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn serve(listener: std::net::TcpListener, own: Ipv4Addr, delays: Arc<Delays>, shutdown: CancellationToken) {
    let Ok(listener) = TcpListener::from_std(listener) else { return };
    let tasks = tokio_util::task::TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let Ok((client, _)) = accepted else { continue };
        let (delays, shutdown) = (delays.clone(), shutdown.clone());
        tasks.spawn(async move {
            // Where the connection was going before the DNAT rule redirected it here.
            let Ok(original) = getsockopt(&client, sockopt::OriginalDst) else { return };
            let target =
                SocketAddrV4::new(Ipv4Addr::from(u32::from_be(original.sin_addr.s_addr)), u16::from_be(original.sin_port));
            // A broker down (killed) refuses: the client's connection just closes.
            let Ok(upstream) = connect_marked(target).await else { return };
            let delay = Arc::new(Delayed { delays, from: own, to: *target.ip() });
            let _ = client.set_nodelay(true);
            let _ = upstream.set_nodelay(true);
            let (client_read, client_write) = client.into_split();
            let (up_read, up_write) = upstream.into_split();
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = pipe(client_read, up_write, delay.clone()) => {}
                _ = pipe(up_read, client_write, delay) => {}
            }
        });
    }
    tasks.close();
}

/// The two ends of one proxied connection.
struct Delayed {
    delays: Arc<Delays>,
    from: Ipv4Addr,
    to: Ipv4Addr,
}

/// Connects to `target` with [`MARK`], so the DNAT rule lets it through.
async fn connect_marked(target: SocketAddrV4) -> std::io::Result<TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    setsockopt(&socket, sockopt::Mark, &MARK).map_err(std::io::Error::from)?;
    socket.connect(SocketAddr::V4(target)).await
}

/// Copies one direction, each chunk held until its due time.
async fn pipe(mut from: tokio::net::tcp::OwnedReadHalf, mut to: tokio::net::tcp::OwnedWriteHalf, delay: Arc<Delayed>) {
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(QUEUED_CHUNKS);
    let writer = async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    let reader = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    let due = Instant::now() + delay.delays.between(delay.from, delay.to);
                    if tx.send((due, buf[..n].to_vec())).await.is_err() {
                        return;
                    }
                }
            }
        }
    };
    // The writer finishes what the reader queued before the direction closes.
    tokio::join!(reader, writer);
}
