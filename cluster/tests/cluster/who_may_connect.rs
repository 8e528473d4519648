//! Who may connect: the server runs with authentication on, a client without (or with
//! wrong) credentials is refused, one tenant (a NATS account) cannot read or write another
//! tenant's sessions, and inside a tenant each role is held to the subjects
//! `Permissions` gives it — the server refuses the rest, and the gateway says so.

use crate::common;

use std::time::Duration;

use async_nats::RequestErrorKind;
use common::{within, OwnerRecord, OwnerState, WorkerProcess, PATIENCE};
use futures_util::FutureExt;
use futures_util::StreamExt;
use switchboard_cluster::local::NatsServer;
use switchboard_cluster::{
    ConnectError, GatewayError, GatewayOptions, NameError, Namespace, NatsConnect, Permissions,
    SessionSpec,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_credentials_is_refused() {
    let _one_at_a_time = common::one_at_a_time().await;
    let server = NatsServer::start().unwrap();
    let refused =
        |result: Result<_, ConnectError>| matches!(result, Err(ConnectError::Refused { .. }));
    assert!(
        refused(NatsConnect::new(server.url()).connect().await),
        "no credentials"
    );
    assert!(
        refused(
            NatsConnect::new(server.url())
                .user_and_password("switchboard", "not the password")
                .connect()
                .await
        ),
        "a wrong password"
    );
    assert!(server.connect().connect().await.is_ok(), "the right ones");

    let token_server = NatsServer::builder().token("s3cret-token").start().unwrap();
    assert!(refused(
        NatsConnect::new(token_server.url())
            .token("guess")
            .connect()
            .await
    ));
    assert!(token_server.connect().connect().await.is_ok());

    // A worker process without credentials does not start.
    let mut worker = WorkerProcess::spawn(&server.url(), "anonymous", 1, &[]);
    let status = worker
        .wait_exit(PATIENCE)
        .expect("the refused worker exits");
    assert!(!status.success(), "a refused worker fails: {status}");
}

/// Two tenants, each a NATS account with JetStream: an admin user (creates the streams
/// and bucket), a worker and a gateway with `Permissions::worker` / `::gateway`.
fn two_tenants() -> String {
    let ns = Namespace::default();
    let worker = Permissions::worker(&ns).to_config();
    let gateway = Permissions::gateway(&ns).to_config();
    let tenant = |name: &str| {
        format!(
            "{upper}: {{ jetstream: enabled, users: [\n\
               {{ user: {name}_admin, password: {name}-admin }}\n\
               {{ user: {name}_worker, password: {name}-worker, {worker} }}\n\
               {{ user: {name}_gateway, password: {name}-gateway, {gateway} }}\n\
             ] }}",
            upper = name.to_uppercase()
        )
    };
    format!(
        "accounts: {{\n{}\n{}\n}}\n",
        tenant("acme"),
        tenant("globex")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenant_cannot_reach_another_and_each_role_keeps_to_its_subjects() {
    let _one_at_a_time = common::one_at_a_time().await;
    let server = NatsServer::builder().config(two_tenants()).start().unwrap();
    let connect = |user: &str| {
        NatsConnect::new(server.url())
            .user_and_password(user, user.replace('_', "-"))
            .name(user)
            .connect()
    };
    let ns = Namespace::default();
    for admin in ["acme_admin", "globex_admin"] {
        switchboard_cluster::provision(&connect(admin).await.unwrap(), &ns)
            .await
            .unwrap();
    }

    // ACME's worker and gateway, each with only its role's permissions, run a session.
    let _worker = WorkerProcess::start_with(
        &server.url(),
        "acme-w1",
        2,
        &[
            "--nats-user",
            "acme_worker",
            "--nats-password",
            "acme-worker",
            "--no-provision",
        ]
        .map(String::from),
    );
    let acme = connect("acme_gateway").await.unwrap();
    let gateway = switchboard_cluster::Gateway::new(acme.clone(), GatewayOptions::new());
    let session = gateway
        .start_session(SessionSpec::new("greeter"))
        .await
        .unwrap();
    let inputs = ns.session_inputs(session.id());

    // GLOBEX's gateway listens to every session's events of its own account …
    let globex = connect("globex_gateway").await.unwrap();
    let mut overheard = globex
        .nats()
        .subscribe("sb.session.*.events")
        .await
        .unwrap();
    globex.nats().flush().await.unwrap();
    let turn = within("ACME's turn", session.run("my account number is 42"))
        .await
        .unwrap();
    assert_eq!(turn.assistant_messages().count(), 1);
    // … and hears nothing of ACME's: had anything reached its connection, it would have
    // come before the answer to this flush.
    globex.nats().flush().await.unwrap();
    assert!(
        overheard.next().now_or_never().is_none(),
        "another tenant's gateway overheard a session"
    );
    // Writing to ACME's session: in GLOBEX's account there is nobody at that subject.
    let request = async_nats::Request::new()
        .payload(
            br#"{"request":"input","id":2,"input":{"input":"run","text":"hi"}}"#
                .as_slice()
                .into(),
        )
        .timeout(Some(Duration::from_secs(5)));
    let sent = globex.nats().send_request(inputs.clone(), request).await;
    assert!(
        matches!(&sent, Err(err) if err.kind() == RequestErrorKind::NoResponders),
        "another tenant reached the session: {sent:?}"
    );

    // Inside ACME, the gateway's user may not write owner records …
    let forged = serde_json::to_vec(&serde_json::json!({
        "worker": "impostor", "epoch": 9, "state": "running"
    }))
    .unwrap();
    let owner_key = format!("$KV.{}.{}", ns.owners_bucket(), session.id());
    acme.nats()
        .publish(owner_key.clone(), forged.into())
        .await
        .unwrap();
    assert!(
        acme.refused(&owner_key, PATIENCE).await.is_some(),
        "the server let a gateway write an owner record"
    );
    // … nor write a session's snapshots …
    let snapshot_subject = ns.snapshot_subject(session.id());
    acme.nats()
        .publish(snapshot_subject.clone(), "forged".into())
        .await
        .unwrap();
    assert!(
        acme.refused(&snapshot_subject, PATIENCE).await.is_some(),
        "the server let a gateway write a snapshot"
    );
    // … nor read the inputs of sessions …
    let _eavesdrop = acme.nats().subscribe("sb.session.*.in").await.unwrap();
    assert!(acme.refused("sb.session.*.in", PATIENCE).await.is_some());
    // … nor start sessions outside its namespace: the gateway says the server refused.
    let elsewhere = switchboard_cluster::Gateway::new(
        acme.clone(),
        GatewayOptions::new().namespace(Namespace::new("other").unwrap()),
    );
    match elsewhere.start_session(SessionSpec::new("greeter")).await {
        Err(GatewayError::Refused {
            subject,
            server_said,
        }) => {
            assert_eq!(subject, "other.jobs");
            assert!(
                server_said.contains("Permissions Violation"),
                "{server_said}"
            );
        }
        other => panic!("a start outside the gateway's subjects must be refused: {other:?}"),
    }

    // The session is untouched: its owner record is the worker's, and it goes on.
    let admin = connect("acme_admin").await.unwrap();
    let owners = async_nats::jetstream::new(admin.nats().clone())
        .get_key_value(ns.owners_bucket())
        .await
        .unwrap();
    let record: OwnerRecord =
        serde_json::from_slice(&owners.get(session.id().as_str()).await.unwrap().unwrap()).unwrap();
    assert_eq!(
        (record.worker.as_str(), record.state),
        ("acme-w1", OwnerState::Running)
    );
    let history = within("the close", session.close()).await.unwrap();
    assert_eq!(history.user_messages(), ["my account number is 42"]);
}

/// Two tenants in one NATS account, each with a namespace and an inbox prefix of its own:
/// an admin user (provisions both namespaces), and per tenant a worker and a gateway with
/// `Permissions::worker_with_inbox` / `::gateway_with_inbox` — the permissions as the
/// library derives them, with no hand edits.
fn one_account_two_tenants() -> Result<String, NameError> {
    let tenant = |name: &str| -> Result<String, NameError> {
        let ns = Namespace::new(format!("{name}.sb"))?;
        let inbox = format!("_INBOX_{name}");
        let worker = Permissions::worker_with_inbox(&ns, &inbox)?.to_config();
        let gateway = Permissions::gateway_with_inbox(&ns, &inbox)?.to_config();
        Ok(format!(
            "{{ user: {name}_worker, password: {name}-worker, {worker} }}\n\
             {{ user: {name}_gateway, password: {name}-gateway, {gateway} }}"
        ))
    };
    Ok(format!(
        "accounts: {{ SHARED: {{ jetstream: enabled, users: [\n\
           {{ user: admin, password: admin }}\n{}\n{}\n] }} }}\n",
        tenant("acme")?,
        tenant("globex")?
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_sharing_an_account_cannot_reach_each_other() {
    let _one_at_a_time = common::one_at_a_time().await;
    let server = NatsServer::builder()
        .config(one_account_two_tenants().unwrap())
        .start()
        .unwrap();
    let connect = |user: &str, tenant: &str| {
        NatsConnect::new(server.url())
            .user_and_password(user, user.replace('_', "-"))
            .inbox_prefix(format!("_INBOX_{tenant}"))
            .name(user)
            .connect()
    };
    let namespace = |tenant: &str| Namespace::new(format!("{tenant}.sb")).unwrap();
    let admin = NatsConnect::new(server.url())
        .user_and_password("admin", "admin")
        .connect()
        .await
        .unwrap();
    for tenant in ["acme", "globex"] {
        switchboard_cluster::provision(&admin, &namespace(tenant))
            .await
            .unwrap();
    }

    // Each tenant's worker process and gateway run a session, side by side.
    let worker = |tenant: &str| {
        WorkerProcess::start_with(
            &server.url(),
            &format!("{tenant}-w1"),
            2,
            &[
                "--nats-user".to_owned(),
                format!("{tenant}_worker"),
                "--nats-password".to_owned(),
                format!("{tenant}-worker"),
                "--namespace".to_owned(),
                format!("{tenant}.sb"),
                "--inbox-prefix".to_owned(),
                format!("_INBOX_{tenant}"),
                "--no-provision".to_owned(),
            ],
        )
    };
    let _acme_worker = worker("acme");
    let _globex_worker = worker("globex");
    let acme = connect("acme_gateway", "acme").await.unwrap();
    let globex = connect("globex_gateway", "globex").await.unwrap();
    let gateway = |client: &switchboard_cluster::ClusterClient, tenant: &str| {
        switchboard_cluster::Gateway::new(
            client.clone(),
            GatewayOptions::new().namespace(namespace(tenant)),
        )
    };
    let acme_session = within(
        "ACME's start",
        gateway(&acme, "acme").start_session(SessionSpec::new("greeter")),
    )
    .await
    .unwrap();
    let globex_session = within(
        "GLOBEX's start",
        gateway(&globex, "globex").start_session(SessionSpec::new("greeter")),
    )
    .await
    .unwrap();
    let turn = within("ACME's turn", acme_session.run("my account number is 42"))
        .await
        .unwrap();
    assert_eq!(
        turn.assistant_messages().collect::<Vec<_>>(),
        ["You said: my account number is 42"]
    );
    within("GLOBEX's turn", globex_session.run("hello"))
        .await
        .unwrap();

    // GLOBEX's gateway may not listen to ACME's events or to the replies ACME's clients
    // wait for, nor send ACME's sessions inputs: the server refuses each.
    let acme_ns = namespace("acme");
    let refused = |client: &switchboard_cluster::ClusterClient, subject: String| {
        let client = client.clone();
        async move { client.refused(&subject, PATIENCE).await.is_some() }
    };
    for pattern in ["acme.sb.session.*.events", "_INBOX_acme.>"] {
        let _listening = globex.nats().subscribe(pattern).await.unwrap();
        assert!(
            refused(&globex, pattern.to_owned()).await,
            "GLOBEX's gateway may subscribe to {pattern}"
        );
    }
    let inputs = acme_ns.session_inputs(acme_session.id());
    globex
        .nats()
        .publish(
            inputs.clone(),
            br#"{"request":"input","id":2,"input":{"input":"run","text":"hi"}}"#
                .as_slice()
                .into(),
        )
        .await
        .unwrap();
    assert!(
        refused(&globex, inputs).await,
        "GLOBEX's gateway may send ACME's session an input"
    );
    // Nor start a session in ACME's namespace: its gateway says the server refused.
    match gateway(&globex, "acme")
        .start_session(SessionSpec::new("greeter"))
        .await
    {
        Err(GatewayError::Refused { subject, .. }) => assert_eq!(subject, "acme.sb.jobs"),
        other => panic!("a start in another tenant's namespace must be refused: {other:?}"),
    }

    // GLOBEX's worker user may not pull ACME's jobs, write its owner records, read its
    // snapshots or read its sessions' inputs.
    let globex_worker = connect("globex_worker", "globex").await.unwrap();
    let owners = acme_ns.owners_bucket();
    let snapshots = acme_ns.snapshots_stream();
    for subject in [
        format!(
            "$JS.API.CONSUMER.MSG.NEXT.{}.{}",
            acme_ns.jobs_stream(),
            acme_ns.jobs_consumer()
        ),
        format!("$KV.{owners}.{}", acme_session.id()),
        format!(
            "$JS.API.DIRECT.GET.{snapshots}.{}",
            acme_ns.snapshot_subject(acme_session.id())
        ),
    ] {
        globex_worker
            .nats()
            .publish(subject.clone(), "{}".into())
            .await
            .unwrap();
        assert!(
            refused(&globex_worker, subject.clone()).await,
            "GLOBEX's worker may publish to {subject}"
        );
    }
    let _eavesdrop = globex_worker
        .nats()
        .subscribe("acme.sb.session.*.in")
        .await
        .unwrap();
    assert!(refused(&globex_worker, "acme.sb.session.*.in".to_owned()).await);

    // ACME's session is untouched: one user message, and it goes on.
    let history = within("ACME's close", acme_session.close()).await.unwrap();
    assert_eq!(history.user_messages(), ["my account number is 42"]);
    let history = within("GLOBEX's close", globex_session.close())
        .await
        .unwrap();
    assert_eq!(history.user_messages(), ["hello"]);
}
