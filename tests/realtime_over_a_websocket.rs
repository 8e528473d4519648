//! The realtime scenarios (`realtime_scenarios/`) with the real OpenAI Realtime provider
//! (`OpenAiRealtime`: tungstenite, the GA codec) against the loopback WebSocket server
//! that speaks the protocol and refuses what the service refuses (`RealtimeServer`), in
//! real time with bounded waits.
#![cfg(feature = "realtime")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use switchboard::providers::openai_realtime::OpenAiRealtime;
use switchboard::realtime::{RealtimeModel, RealtimeSettings};
use switchboard::testing::{RealtimeScript, RealtimeServer, SimReport};

mod common;
#[macro_use]
mod realtime_scenarios;
use realtime_scenarios as scenarios;

struct Loopback {
    server: RealtimeServer,
    model: Arc<dyn RealtimeModel>,
}

impl scenarios::Backend for Loopback {
    fn start_with_settings(script: RealtimeScript, settings: RealtimeSettings) -> Self {
        let server = RealtimeServer::start(script).unwrap();
        let model = OpenAiRealtime::builder()
            .base_url(server.base_url())
            .api_key("test-key")
            .settings(settings)
            .build()
            .unwrap();
        Self {
            server,
            model: Arc::new(model),
        }
    }

    fn model(&self) -> Arc<dyn RealtimeModel> {
        self.model.clone()
    }

    fn report(&self) -> SimReport {
        self.server.report()
    }
}

every_scenario_against!(Loopback, pause_time: false);

#[switchboard::test]
async fn a_connection_without_a_key_is_refused_by_the_loopback_server() {
    let server = RealtimeServer::start(RealtimeScript::new([])).unwrap();
    let url = server.base_url().replace("http://", "ws://") + "/realtime?model=m";
    let refused = tokio_tungstenite_client_without_key(&url).await;
    assert!(refused, "a handshake without a bearer token is refused");
}

/// Opens a raw WebSocket without an Authorization header.
async fn tokio_tungstenite_client_without_key(url: &str) -> bool {
    let address = url
        .trim_start_matches("ws://")
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    let mut stream = tokio::net::TcpStream::connect(address.as_str())
        .await
        .unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let path = &url[url.find("/v1").unwrap()..];
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = vec![0; 512];
    let n = stream.read(&mut answer).await.unwrap();
    String::from_utf8_lossy(&answer[..n]).starts_with("HTTP/1.1 401")
}
