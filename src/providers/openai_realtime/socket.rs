//! One WebSocket to the OpenAI Realtime API: TCP (no Nagle delay), TLS for `wss://`
//! (rustls, `ring`, Mozilla's roots), tungstenite's client handshake with the bearer
//! token, then JSON text messages through [`codec`](super::codec). While a response's
//! audio is well ahead of its playback, the kernel is asked to wake the reader only once
//! several events have arrived or at a deadline ([`gather`](super::gather)).

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use futures_util::{Sink, Stream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;

use super::codec;
use super::gather::{Gathering, GATHER_BYTES};
use crate::realtime::{ClientEvent, RealtimeConnection, RealtimeError, ServerEvent};

/// TCP, or TLS over TCP.
enum Transport {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl Transport {
    fn tcp(&self) -> &TcpStream {
        match self {
            Transport::Plain(s) => s,
            Transport::Tls(s) => s.get_ref().0,
        }
    }
}

impl AsyncRead for Transport {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Transport::Tls(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Transport {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Transport::Tls(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_flush(cx),
            Transport::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Transport::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// The client's TLS configuration, made once: Mozilla's roots, the `ring` provider.
fn tls() -> Result<Arc<rustls::ClientConfig>, RealtimeError> {
    static CONFIG: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let roots =
                rustls::RootCertStore::from_iter(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
            rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .map(|builder| Arc::new(builder.with_root_certificates(roots).with_no_client_auth()))
            .map_err(|err| err.to_string())
        })
        .clone()
        .map_err(|message| RealtimeError::Connect { message })
}

/// The bytes that must have arrived before the kernel wakes the socket's reader
/// (`SO_RCVLOWAT`); whether it took. Only on Linux, where epoll honours it.
#[cfg(target_os = "linux")]
fn wake_after(tcp: &TcpStream, bytes: usize) -> bool {
    use std::os::fd::AsRawFd;
    let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    // SAFETY: the descriptor is the open socket `tcp` owns, and `value` is a valid c_int
    // of the length passed, read during the call only.
    let status = unsafe {
        libc::setsockopt(
            tcp.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            std::ptr::addr_of!(value).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    status == 0
}

#[cfg(not(target_os = "linux"))]
fn wake_after(_tcp: &TcpStream, bytes: usize) -> bool {
    bytes == 1
}

/// An open connection.
pub(super) struct Socket {
    ws: WebSocketStream<Transport>,
    /// Messages encoded and not yet handed to the WebSocket.
    queue: VecDeque<Message>,
    /// Whether the server's events may gather, and until when.
    gathering: Gathering,
    /// While the kernel wakes the reader only for [`GATHER_BYTES`]: the deadline at which
    /// the socket reads what has gathered anyway. `None`: it wakes at every event.
    gathered_by: Option<Pin<Box<Sleep>>>,
}

impl Socket {
    /// Connects, within `timeout`.
    pub(super) async fn open(
        url: &str,
        api_key: &str,
        timeout: Duration,
        bytes_per_ms: u32,
    ) -> Result<Self, RealtimeError> {
        match tokio::time::timeout(timeout, Self::connect(url, api_key)).await {
            Ok(result) => result.map(|ws| Self {
                ws,
                queue: VecDeque::new(),
                gathering: Gathering::new(bytes_per_ms),
                gathered_by: None,
            }),
            Err(_) => Err(RealtimeError::Connect {
                message: format!("no connection to {url} within {timeout:?}"),
            }),
        }
    }

    async fn connect(
        url: &str,
        api_key: &str,
    ) -> Result<WebSocketStream<Transport>, RealtimeError> {
        let connect = |message: String| RealtimeError::Connect { message };
        let mut request = url
            .into_client_request()
            .map_err(|err| connect(format!("{url}: {err}")))?;
        let bearer = HeaderValue::from_str(&format!("Bearer {api_key}"))
            .map_err(|_| connect("the API key is not a valid header value".to_owned()))?;
        request.headers_mut().insert("Authorization", bearer);
        let uri = request.uri().clone();
        let secure = uri.scheme_str() == Some("wss");
        let host = uri
            .host()
            .ok_or_else(|| connect(format!("{url} names no host")))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = uri.port_u16().unwrap_or(if secure { 443 } else { 80 });
        let tcp = TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|err| connect(format!("{host}:{port}: {err}")))?;
        // Small events go out at once (an append, a truncate): no Nagle delay.
        let _ = tcp.set_nodelay(true);
        let transport = if secure {
            let name = rustls::pki_types::ServerName::try_from(host.clone())
                .map_err(|err| connect(format!("{host}: {err}")))?;
            let tls = tokio_rustls::TlsConnector::from(tls()?)
                .connect(name, tcp)
                .await
                .map_err(|err| connect(format!("TLS with {host}: {err}")))?;
            Transport::Tls(Box::new(tls))
        } else {
            Transport::Plain(tcp)
        };
        // tungstenite zeroes its free read buffer before every read: at its default of 128
        // KiB that is a 128 KiB memset (and a cache flushed) per event of ~1.4 KiB; 8 KiB
        // holds several events and the buffer still grows to any message's length.
        let config = WebSocketConfig::default()
            .max_message_size(Some(64 << 20))
            .read_buffer_size(8 * 1024);
        let (ws, _response) =
            tokio_tungstenite::client_async_with_config(request, transport, Some(config))
                .await
                .map_err(|err| match err {
                    WsError::Http(response) if matches!(response.status().as_u16(), 401 | 403) => {
                        RealtimeError::Auth {
                            message: format!("HTTP {}", response.status()),
                        }
                    }
                    WsError::Http(response) => connect(format!(
                        "{url} answered HTTP {}: {}",
                        response.status(),
                        response
                            .body()
                            .as_deref()
                            .map(String::from_utf8_lossy)
                            .unwrap_or_default()
                    )),
                    other => connect(format!("{url}: {other}")),
                })?;
        Ok(ws)
    }

    /// Nothing is left to read: lets the next events gather while the response's audio is
    /// ahead, or reads them as they come once the deadline has passed or the audio is not
    /// ahead any more. Raising the mark is safe against an event that came meanwhile (its
    /// wake-up is already due); lowering it has the kernel wake the reader at once for
    /// what has gathered.
    fn settle(&mut self, cx: &mut Context<'_>) {
        let now = Instant::now();
        match &mut self.gathered_by {
            Some(deadline) => {
                let due =
                    self.gathering.until(now).is_none() || deadline.as_mut().poll(cx).is_ready();
                if due {
                    self.gathered_by = None;
                    wake_after(self.ws.get_ref().tcp(), 1);
                }
            }
            None => {
                if let Some(until) = self.gathering.until(now) {
                    if wake_after(self.ws.get_ref().tcp(), GATHER_BYTES) {
                        let mut deadline = Box::pin(tokio::time::sleep_until(until));
                        // Registers the waker; the deadline is at least a millisecond away.
                        let _ = deadline.as_mut().poll(cx);
                        self.gathered_by = Some(deadline);
                    }
                }
            }
        }
    }
}

fn dropped(err: WsError) -> RealtimeError {
    RealtimeError::Dropped {
        message: err.to_string(),
    }
}

impl RealtimeConnection for Socket {
    fn send(&mut self, event: ClientEvent) {
        self.queue.push_back(Message::text(codec::encode(&event)));
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), RealtimeError>> {
        while !self.queue.is_empty() {
            ready!(Pin::new(&mut self.ws).poll_ready(cx)).map_err(dropped)?;
            if let Some(message) = self.queue.pop_front() {
                Pin::new(&mut self.ws)
                    .start_send(message)
                    .map_err(dropped)?;
            }
        }
        Pin::new(&mut self.ws).poll_flush(cx).map_err(dropped)
    }

    fn poll_next(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<ServerEvent, RealtimeError>>> {
        loop {
            let next = Pin::new(&mut self.ws).poll_next(cx);
            if next.is_pending() {
                self.settle(cx);
            }
            match ready!(next) {
                Some(Ok(Message::Text(text))) => match codec::decode(text.as_str()) {
                    Ok(event) => {
                        self.gathering.on_event(&event, Instant::now);
                        return Poll::Ready(Some(Ok(event)));
                    }
                    Err(why) => {
                        // One unreadable event is not worth the connection.
                        tracing::warn!(%why, "the realtime model sent an event that cannot be read");
                    }
                },
                Some(Ok(Message::Close(frame))) => {
                    tracing::debug!(?frame, "the realtime model closed the connection");
                    return Poll::Ready(None);
                }
                // Pings are answered by tungstenite; binary frames are not the protocol's.
                Some(Ok(_)) => {}
                Some(Err(WsError::ConnectionClosed | WsError::AlreadyClosed)) | None => {
                    return Poll::Ready(None)
                }
                Some(Err(err)) => return Poll::Ready(Some(Err(dropped(err)))),
            }
        }
    }

    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        Pin::new(&mut self.ws).poll_close(cx).map(|_| ())
    }
}
