//! One WebSocket to the OpenAI Realtime API: TCP (no Nagle delay), TLS for `wss://`
//! (rustls, `ring`, Mozilla's roots), tungstenite's client handshake with the bearer
//! token, then JSON text messages through [`codec`](super::codec).

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use futures_util::{Sink, Stream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;

use super::codec;
use crate::realtime::{ClientEvent, RealtimeConnection, RealtimeError, ServerEvent};

/// TCP, or TLS over TCP.
enum Transport {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
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

/// An open connection.
pub(super) struct Socket {
    ws: WebSocketStream<Transport>,
    /// Messages encoded and not yet handed to the WebSocket.
    queue: VecDeque<Message>,
}

impl Socket {
    /// Connects, within `timeout`.
    pub(super) async fn open(
        url: &str,
        api_key: &str,
        timeout: Duration,
    ) -> Result<Self, RealtimeError> {
        match tokio::time::timeout(timeout, Self::connect(url, api_key)).await {
            Ok(result) => result,
            Err(_) => Err(RealtimeError::Connect {
                message: format!("no connection to {url} within {timeout:?}"),
            }),
        }
    }

    async fn connect(url: &str, api_key: &str) -> Result<Self, RealtimeError> {
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
        Ok(Self {
            ws,
            queue: VecDeque::new(),
        })
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
            match ready!(Pin::new(&mut self.ws).poll_next(cx)) {
                Some(Ok(Message::Text(text))) => match codec::decode(text.as_str()) {
                    Ok(event) => return Poll::Ready(Some(Ok(event))),
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
