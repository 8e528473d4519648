//! The worker's health server: a small HTTP/1.1 responder on tokio for three paths —
//! `/healthz`, `/readyz`, `/metrics` — each a GET that reads the worker's [`Status`] and
//! answers once, then closes the connection.
//!
//! Small on purpose: probes and scrapers send one short GET per connection, so a request
//! head of at most 8 KiB, read within 5 s, and one answer with `Connection: close` is the
//! whole protocol they need; no HTTP crate enters the build for it. At most 64
//! connections are served at once; more wait in the listener's queue.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use super::status::Status;

/// The longest request head read.
const MAX_HEAD: usize = 8 * 1024;

/// How long a client may take to send its request head.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Connections served at once.
const MAX_CONNECTIONS: usize = 64;

/// Where the status comes from at each request.
pub(crate) type StatusSource = Arc<dyn Fn() -> Status + Send + Sync>;

/// Binds `addr` (port 0: a free one).
pub(crate) async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Answers on `listener` until the task is aborted.
pub(crate) async fn serve(listener: TcpListener, status: StatusSource) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(err) => {
                // A client that left before it was accepted, or no file descriptors: go on.
                tracing::debug!(error = %err, "health server: accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let status = status.clone();
        tokio::spawn(async move {
            let _ = answer(stream, &status).await;
            drop(slot);
        });
    }
}

async fn answer(mut stream: TcpStream, status: &StatusSource) -> std::io::Result<()> {
    let head = match tokio::time::timeout(READ_TIMEOUT, read_head(&mut stream)).await {
        Ok(Ok(head)) => head,
        Ok(Err(err)) => return Err(err),
        Err(_) => return Ok(()),
    };
    let response = respond(&head, status);
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

/// The request head: everything up to the blank line (or `MAX_HEAD` bytes).
async fn read_head(stream: &mut TcpStream) -> std::io::Result<String> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_HEAD {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}

/// The whole response to a request head.
fn respond(head: &str, status: &StatusSource) -> String {
    let mut parts = head.lines().next().unwrap_or("").split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (code, content_type, body) = match (method, path) {
        ("GET" | "HEAD", "/healthz") => (200, JSON, status().json()),
        ("GET" | "HEAD", "/readyz") => {
            let now = status();
            (if now.ready() { 200 } else { 503 }, JSON, now.json())
        }
        ("GET" | "HEAD", "/metrics") => (200, METRICS, status().metrics()),
        ("GET" | "HEAD", _) => (
            404,
            TEXT,
            "not found: try /healthz, /readyz or /metrics\n".to_owned(),
        ),
        _ => (405, TEXT, "only GET and HEAD\n".to_owned()),
    };
    let reason = match code {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Service Unavailable",
    };
    let mut response = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n",
        body.len()
    );
    if code == 405 {
        response.push_str("Allow: GET, HEAD\r\n");
    }
    response.push_str("\r\n");
    if method != "HEAD" {
        response.push_str(&body);
    }
    response
}

const JSON: &str = "application/json";
const TEXT: &str = "text/plain; charset=utf-8";
const METRICS: &str = "text/plain; version=0.0.4; charset=utf-8";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::WorkerInfo;

    fn source(draining: bool) -> StatusSource {
        let engine = switchboard::Engine::with_arbiters(1).unwrap().stats();
        Arc::new(move || Status {
            info: WorkerInfo {
                name: "w1".into(),
                capacity: 4,
                live: 1,
                draining,
                ..WorkerInfo::default()
            },
            connected: true,
            connections: 1,
            engine: engine.clone(),
        })
    }

    fn split(response: &str) -> (&str, &str) {
        let (head, body) = response.split_once("\r\n\r\n").unwrap();
        (head.lines().next().unwrap(), body)
    }

    #[test]
    fn each_path_answers_with_its_status_code() {
        let ready = source(false);
        let draining = source(true);
        assert_eq!(
            split(&respond("GET /healthz HTTP/1.1\r\n\r\n", &draining)).0,
            "HTTP/1.1 200 OK"
        );
        assert_eq!(
            split(&respond("GET /readyz HTTP/1.1\r\n\r\n", &ready)).0,
            "HTTP/1.1 200 OK"
        );
        let response = respond("GET /readyz?verbose HTTP/1.1\r\n\r\n", &draining);
        let (line, body) = split(&response);
        assert_eq!(line, "HTTP/1.1 503 Service Unavailable");
        assert!(body.contains("\"draining\":true"), "{body}");
        let response = respond("GET /metrics HTTP/1.1\r\n\r\n", &ready);
        let (line, body) = split(&response);
        assert_eq!(line, "HTTP/1.1 200 OK");
        assert!(
            body.contains("switchboard_worker_free_slots{worker=\"w1\"} 3"),
            "{body}"
        );
        assert_eq!(
            split(&respond("GET / HTTP/1.1\r\n\r\n", &ready)).0,
            "HTTP/1.1 404 Not Found"
        );
        let refused = respond("POST /readyz HTTP/1.1\r\n\r\n", &ready);
        assert!(refused.starts_with("HTTP/1.1 405") && refused.contains("Allow: GET, HEAD"));
        assert_eq!(
            split(&respond("garbage", &ready)).0,
            "HTTP/1.1 405 Method Not Allowed"
        );
    }

    #[test]
    fn a_head_request_gets_the_headers_only() {
        let response = respond("HEAD /metrics HTTP/1.1\r\n\r\n", &source(false));
        let (head, body) = response.split_once("\r\n\r\n").unwrap();
        assert!(body.is_empty());
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("Content-Length: "))
            .unwrap()
            .parse()
            .unwrap();
        assert!(length > 0);
    }

    #[tokio::test]
    async fn it_answers_over_tcp_and_closes() {
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(serve(listener, source(false)));
        let mut client = TcpStream::connect(addr).await.unwrap();
        client
            .write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut response = String::new();
        tokio::time::timeout(Duration::from_secs(5), client.read_to_string(&mut response))
            .await
            .expect("the server closes the connection")
            .unwrap();
        assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
        assert!(response.contains("\"ready\":true"), "{response}");
        assert!(response.contains("\"free_slots\":3"), "{response}");
        server.abort();
    }
}
