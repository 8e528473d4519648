//! No public type of the cluster prints a secret in its `Debug` (a log line of a
//! connection's options, a server's settings, a connection error): the method and the
//! user, never the password, token or nkey, and no credentials written into a URL.

use switchboard_cluster::local::{NatsServer, ServerAuth};
use switchboard_cluster::NatsConnect;

const SECRET: &str = "s3cr3t-SECRET";

fn assert_no_secret(what: &str, debug: &str) {
    assert!(
        !debug.contains("SECRET"),
        "{what} printed the secret: {debug}"
    );
}

#[test]
fn connection_options_and_server_settings_print_no_secret() {
    for options in [
        NatsConnect::new("nats://127.0.0.1:4222").user_and_password("worker", SECRET),
        NatsConnect::new("nats://127.0.0.1:4222").token(SECRET),
        NatsConnect::new("nats://127.0.0.1:4222").nkey(SECRET),
        NatsConnect::new(format!(
            "nats://worker:{SECRET}@a.internal:4222,nats://{SECRET}@b.internal:4222"
        )),
    ] {
        let debug = format!("{options:?}");
        assert_no_secret("NatsConnect", &debug);
    }
    let debug = format!(
        "{:?}",
        NatsConnect::new(format!("nats://worker:{SECRET}@a.internal:4222"))
    );
    assert!(debug.contains("nats://…@a.internal:4222"), "{debug}");

    for auth in [
        ServerAuth::UserPassword {
            user: "switchboard".into(),
            password: SECRET.into(),
        },
        ServerAuth::Token(SECRET.into()),
    ] {
        assert_no_secret("ServerAuth", &format!("{auth:?}"));
    }
    let builder = NatsServer::builder().user_password("switchboard", SECRET);
    assert_no_secret("NatsServerBuilder", &format!("{builder:?}"));
    let builder = NatsServer::builder().token(SECRET);
    assert_no_secret("NatsServerBuilder", &format!("{builder:?}"));
}

#[tokio::test]
async fn a_connection_error_names_the_server_without_its_credentials() {
    // Nothing listens on port 1: the error quotes the URL.
    let error = NatsConnect::new(format!("nats://worker:{SECRET}@127.0.0.1:1"))
        .connection_timeout(std::time::Duration::from_millis(200))
        .connect()
        .await
        .unwrap_err();
    assert_no_secret("ConnectError (Debug)", &format!("{error:?}"));
    assert_no_secret("ConnectError (Display)", &error.to_string());
}
