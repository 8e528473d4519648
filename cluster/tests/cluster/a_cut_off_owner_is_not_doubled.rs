//! A worker cut off from the server while alive loses its subscriptions as a dead one
//! does, so a gateway finds it silent and the pool may claim its session at once. When
//! its connection comes back (the client reconnects and subscribes again by itself) its
//! lease is still good on its own clock: it must not answer, let alone apply, an input of
//! the session that another worker now owns. Two owners answering one request is two
//! owners applying one input.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{owner_of, within, WorkerProcess};
use futures_util::StreamExt;
use switchboard_cluster::local::NatsServer;
use switchboard_cluster::{GatewayOptions, Namespace, SessionSpec};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A long lease: the cut-off owner's own clock trusts it throughout the test, and its
/// renewals (every third) do not come round while the test runs.
const LEASE_SECS: &str = "60";

/// A TCP relay between one worker and the server that the test can cut and mend, as a
/// network partition would: while cut, every connection through it is closed and new
/// ones are closed at once.
struct Cable {
    url: String,
    cut: Arc<watch::Sender<bool>>,
}

impl Cable {
    async fn to(server: &NatsServer) -> std::io::Result<Self> {
        let upstream = server.url().trim_start_matches("nats://").to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("nats://{}", listener.local_addr()?);
        let cut = Arc::new(watch::channel(false).0);
        let relay_cut = cut.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    return;
                };
                let mut cut = relay_cut.subscribe();
                if *cut.borrow_and_update() {
                    continue;
                }
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut.wait_for(|cut| *cut) => {}
                    }
                });
            }
        });
        Ok(Self { url, cut })
    }

    fn cut(&self) {
        self.cut.send_replace(true);
    }

    fn mend(&self) {
        self.cut.send_replace(false);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_cut_off_and_back_does_not_apply_inputs_beside_the_worker_that_claimed_its_session(
) {
    let _one_at_a_time = common::one_at_a_time().await;
    let server = NatsServer::start().unwrap();
    let cable = Cable::to(&server).await.unwrap();
    let mut args = common::credentials(&server);
    args.extend(["--lease-secs".to_owned(), LEASE_SECS.to_owned()]);
    let _cut_off = WorkerProcess::start_with(&cable.url, "w1", 2, &args);
    let gateway = common::gateway(&server, GatewayOptions::new()).await;
    let observer = common::client(&server, "observer").await;
    let session = gateway
        .start_session(SessionSpec::new("greeter"))
        .await
        .unwrap();
    // Input 1, on w1 (the only worker so far).
    session.run("hello").await.unwrap();
    assert_eq!(
        owner_of(&observer, session.id()).await.unwrap().worker,
        "w1"
    );
    let _taker = WorkerProcess::start(&server, "w2", 2, &["--lease-secs", LEASE_SECS]);
    // Silence counts only on connections up for 2 s (the cluster's own rule).
    tokio::time::sleep(Duration::from_millis(2200)).await;

    // Input 2, while w1 is cut off: the gateway finds nobody subscribed and the pool
    // takes the session over.
    cable.cut();
    within(
        "the turn while w1 is cut off",
        session.run("during the cut"),
    )
    .await
    .unwrap();
    let owner = owner_of(&observer, session.id()).await.unwrap();
    cable.mend();

    // w1 is back once it answers its info subject again.
    let ns = Namespace::default();
    within("w1 to reconnect", async {
        loop {
            let asked = observer
                .nats()
                .request(ns.worker_info("w1"), bytes::Bytes::new())
                .await;
            if asked.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;

    // The gateway's retry of input 2 (as it sends it when an answer is lost): every
    // owner that hears it answers on this inbox.
    let inbox = observer.nats().new_inbox();
    let mut answers = observer.nats().subscribe(inbox.clone()).await.unwrap();
    let retry = br#"{"request":"input","id":2,"input":{"input":"run","text":"during the cut"}}"#;
    observer
        .nats()
        .publish_with_reply(
            ns.session_inputs(session.id()),
            inbox,
            bytes::Bytes::from_static(retry),
        )
        .await
        .unwrap();
    observer.nats().flush().await.unwrap();
    // The owner's answer, then any other within a second of it.
    let first = within("the owner's answer to input 2", answers.next())
        .await
        .unwrap();
    let mut heard = vec![String::from_utf8_lossy(&first.payload).into_owned()];
    while let Ok(Some(answer)) = tokio::time::timeout(Duration::from_secs(1), answers.next()).await
    {
        heard.push(String::from_utf8_lossy(&answer.payload).into_owned());
    }
    assert_eq!(
        heard.len(),
        1,
        "input 2 is answered by the session's owner only ({owner:?}), not also by the \
         worker that was cut off and came back: {heard:?}"
    );
}
