//! The HTTP endpoint a service serves its `/metrics` on (the broker's `metrics.listen`, the
//! mirror's `--metrics`), with the same security options everywhere: the `metrics.` keys of
//! [`HttpSecurityConfig`] (`metrics.ssl.keystore.location`,
//! `metrics.authentication.method=BASIC`, ...).
//!
//! - With `ssl.keystore.location` the endpoint speaks only TLS (fjord-auth's
//!   [`TlsServer`], the same PEM keys as the listeners), offering only HTTP/1.1 by ALPN:
//!   this endpoint speaks nothing else, and a client offered h2 would speak it.
//! - With `authentication.method=BASIC` a request must carry HTTP Basic credentials of a
//!   user in the metadata store (or a trusted client certificate), else 401 with
//!   `WWW-Authenticate`; the check is fjord-auth's [`HttpSecurity`], as the gateway's and
//!   the registry's. Any authenticated user may read the pages.
//!
//! The HTTP side is one `GET` per connection answered with `Connection: close`,
//! hand-written: the pages are small, and the services carry no HTTP stack for it. Each
//! connection (its TLS handshake included) is bounded by [`REQUEST_TIMEOUT`] and its request
//! head by [`MAX_REQUEST_HEAD`], so a stalled or hostile client costs one short task.

use std::sync::Arc;
use std::time::Duration;

use fjord_auth::http::{HttpSecurity, HttpSecurityConfig, Peer, Unauthenticated};
use fjord_auth::tls::{ClientAuth, SslConfig, TlsServer};
use fjord_coord::Store;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The most bytes of an HTTP request head read before answering 400.
pub const MAX_REQUEST_HEAD: usize = 8 * 1024;
/// A connection that has not sent its request head (TLS handshake included) by then is
/// dropped.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The Prometheus text format's content type.
pub const PROMETHEUS: &str = "text/plain; version=0.0.4; charset=utf-8";

/// One page the endpoint answers a `GET` with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    /// Its `Content-Type`.
    pub content_type: &'static str,
    /// Its body.
    pub body: String,
}

/// What a service serves: rendered on each request, so it reads its counters then.
pub trait Pages: Send + Sync + 'static {
    /// The page at `path` (no query string), `None` for 404.
    fn page(&self, path: &str) -> Option<Page>;
    /// What a 404 tells the client, e.g. "the metrics are at /metrics".
    fn not_found(&self) -> &'static str {
        "the metrics are at /metrics"
    }
}

/// Serves `pages` on `listener` until `shutdown` (the accept loop on `tracker`), secured by
/// `config` (the service's `metrics.*` keys). `store` is where Basic reads the users and
/// the authorizer the ACLs; a config that needs it without one, or a TLS file that does
/// not load, is an error here, before anything is served.
pub async fn serve(
    listener: TcpListener,
    mut config: HttpSecurityConfig,
    store: Option<Store>,
    pages: Arc<dyn Pages>,
    tracker: &TaskTracker,
    shutdown: CancellationToken,
) -> fjord_auth::Result<()> {
    config.validate()?;
    // TLS here, with HTTP/1.1 only by ALPN (HttpSecurity's TLS would offer h2 too).
    let tls = match config.ssl.keystore_location.take() {
        Some(keystore) => {
            let ssl = SslConfig { keystore_location: Some(keystore), ..config.ssl.clone() };
            Some(Arc::new(TlsServer::with_alpn(ssl, vec![b"http/1.1".to_vec()])?))
        }
        None => None,
    };
    // Client certificates are asked for by `tls` above, not by the credential check.
    config.ssl.client_auth = ClientAuth::None;
    let security = HttpSecurity::start(config, store, tracker, shutdown.clone()).await?;
    tracker.spawn(accept_loop(listener, tls, security, pages, shutdown));
    Ok(())
}

async fn accept_loop(
    listener: TcpListener,
    tls: Option<Arc<TlsServer>>,
    security: Arc<HttpSecurity>,
    pages: Arc<dyn Pages>,
    shutdown: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shutdown.cancelled() => return,
        };
        let (stream, addr) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!(error = %e, "metrics accept failed; backing off");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (pages, security, tls) = (pages.clone(), security.clone(), tls.clone());
        // Not tracked: a request (its TLS handshake included) is bounded by
        // REQUEST_TIMEOUT and reads only counters, so shutdown need not wait for it.
        tokio::spawn(async move {
            let answered = async {
                let Some(tls) = tls else {
                    let peer = Peer { addr, certificate_principal: None };
                    return answer(stream, &peer, &security, &*pages).await;
                };
                let stream = tls.acceptor().accept(stream).await?;
                let certificate = stream.get_ref().1.peer_certificates().and_then(|chain| chain.first());
                let subject = certificate.and_then(|c| fjord_auth::tls::certificate_subject(c));
                let peer = Peer { addr, certificate_principal: subject.map(|s| tls.config().principal(&s)) };
                answer(stream, &peer, &security, &*pages).await
            };
            if let Err(e) = tokio::time::timeout(REQUEST_TIMEOUT, answered)
                .await
                .unwrap_or_else(|_| Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "no request head in time")))
            {
                tracing::debug!(peer = %addr, error = %e, "metrics request failed");
            }
        });
    }
}

/// Reads one HTTP request head and answers it.
async fn answer<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    peer: &Peer,
    security: &HttpSecurity,
    pages: &dyn Pages,
) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() > MAX_REQUEST_HEAD {
            return respond(&mut stream, "400 Bad Request", PROMETHEUS, &[], "request head too large\n").await;
        }
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Ok(()); // gone before asking anything
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let mut parts = std::str::from_utf8(line).unwrap_or_default().split(' ');
    let (method, target) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
    let path = target.split('?').next().unwrap_or_default();
    if method.is_empty() {
        return respond(&mut stream, "400 Bad Request", PROMETHEUS, &[], "not an HTTP request\n").await;
    }
    if let Err(why) = security.authenticate(authorization(&head), peer).await {
        tracing::debug!(peer = %peer.addr, %why, "metrics request refused");
        return match why {
            Unauthenticated::Unavailable(_) => {
                respond(&mut stream, "503 Service Unavailable", PROMETHEUS, &[], "try again\n").await
            }
            why => {
                let challenge = ("WWW-Authenticate", security.www_authenticate());
                respond(&mut stream, "401 Unauthorized", PROMETHEUS, &[challenge], &format!("{why}\n")).await
            }
        };
    }
    match pages.page(path) {
        Some(page) if method == "GET" => respond(&mut stream, "200 OK", page.content_type, &[], &page.body).await,
        Some(_) => respond(&mut stream, "405 Method Not Allowed", PROMETHEUS, &[], "only GET\n").await,
        None => respond(&mut stream, "404 Not Found", PROMETHEUS, &[], &format!("{}\n", pages.not_found())).await,
    }
}

/// The value of the request head's `Authorization` header (the name in any case).
fn authorization(head: &[u8]) -> Option<&[u8]> {
    head.split(|&b| b == b'\n').skip(1).find_map(|line| {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let colon = line.iter().position(|&b| b == b':')?;
        let (name, value) = line.split_at(colon);
        name.eq_ignore_ascii_case(b"authorization").then(|| value[1..].trim_ascii())
    })
}

async fn respond<S: AsyncWrite + Unpin>(
    stream: &mut S,
    status: &str,
    content_type: &str,
    headers: &[(&str, String)],
    body: &str,
) -> std::io::Result<()> {
    let extra: String = headers.iter().map(|(name, value)| format!("{name}: {value}\r\n")).collect();
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_authorization_header_is_found_in_any_case_and_only_in_headers() {
        let head = b"GET /metrics HTTP/1.1\r\nHost: x\r\naUtHoRiZaTiOn:  Basic YTpi \r\n\r\n";
        assert_eq!(authorization(head), Some(&b"Basic YTpi"[..]));
        assert_eq!(authorization(b"GET /authorization: x HTTP/1.1\r\nHost: x\r\n\r\n"), None);
        assert_eq!(authorization(b"GET / HTTP/1.1\r\nAuthorization\r\n\r\n"), None);
        assert_eq!(authorization(b"\r\n\r\n"), None);
    }

    struct One;

    impl Pages for One {
        fn page(&self, path: &str) -> Option<Page> {
            (path == "/metrics").then(|| Page { content_type: PROMETHEUS, body: "a 1\n".into() })
        }
    }

    async fn ask(addr: std::net::SocketAddr, request: &[u8]) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.write_all(request).await.unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        answer
    }

    /// Without security: the page, 405 for another method, 404 elsewhere, 400 for a head
    /// that never ends within the limit or is no request, and the loop serves on after each.
    #[tokio::test]
    async fn open_endpoint_answers_pages_and_refuses_bad_requests() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tracker, shutdown) = (TaskTracker::new(), CancellationToken::new());
        serve(listener, HttpSecurityConfig::default(), None, Arc::new(One), &tracker, shutdown.clone()).await.unwrap();
        let ok = ask(addr, b"GET /metrics?x=1 HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n") && ok.ends_with("\r\n\r\na 1\n"), "{ok}");
        assert!(ask(addr, b"POST /metrics HTTP/1.1\r\n\r\n").await.starts_with("HTTP/1.1 405 "));
        assert!(ask(addr, b"GET /elsewhere HTTP/1.1\r\n\r\n").await.starts_with("HTTP/1.1 404 "));
        assert!(ask(addr, b" \r\n\r\n").await.starts_with("HTTP/1.1 400 "));
        let huge = vec![b'A'; MAX_REQUEST_HEAD + 2048];
        assert!(ask(addr, &huge).await.starts_with("HTTP/1.1 400 "));
        assert!(ask(addr, b"GET /metrics HTTP/1.1\r\n\r\n").await.starts_with("HTTP/1.1 200 "));
        shutdown.cancel();
        tracker.close();
        tracker.wait().await;
    }

    /// Basic without a store to read users from is refused at start, not at a request.
    #[tokio::test]
    async fn basic_without_a_store_is_an_error_at_start() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut config = HttpSecurityConfig::default();
        assert_eq!(config.set("authentication.method", "BASIC"), Ok(true));
        let started = serve(listener, config, None, Arc::new(One), &TaskTracker::new(), CancellationToken::new()).await;
        assert!(started.is_err());
    }
}
