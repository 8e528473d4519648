//! No public type's `Debug` prints a secret: a `{:?}` of a configured provider (or
//! `tracing`'s `?builder`) goes into logs, and a key there is a key leaked. Each type
//! that holds an API key or a URL with credentials is formatted here with a secret in
//! every place it can hold one. (The cluster's NATS types have their own test, in
//! `cluster/tests/cluster/secrets_stay_out_of_debug.rs`.)
#![cfg(feature = "openai")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use switchboard::providers::openai::OpenAiLlm;

const SECRET: &str = "sk-live-SECRET123";

fn assert_no_secret(what: &str, debug: &str) {
    assert!(
        !debug.contains(SECRET),
        "{what} printed the secret: {debug}"
    );
    assert!(
        !debug.contains("SECRET"),
        "{what} printed part of it: {debug}"
    );
}

#[test]
fn the_openai_builder_and_model_print_no_key() {
    let builder = OpenAiLlm::builder()
        .model("gpt-4.1-mini")
        .api_key(SECRET)
        .base_url(format!(
            "https://user:{SECRET}@llm.internal/v1?key={SECRET}&api-version=2024"
        ));
    let debug = format!("{builder:?}");
    assert_no_secret("OpenAiBuilder", &debug);
    // What it does print: that a key is set, and the URL without its secrets.
    assert!(debug.contains("api_key: Some(\"…\")"), "{debug}");
    assert!(
        debug.contains("https://…@llm.internal/v1?key=…&api-version=…"),
        "{debug}"
    );

    let llm = builder.build().unwrap();
    assert_no_secret("OpenAiLlm", &format!("{llm:?}"));
    assert_no_secret("OpenAiLlm (pretty)", &format!("{llm:#?}"));
}

#[test]
fn a_refused_base_url_is_quoted_without_its_secrets() {
    let error = OpenAiLlm::builder()
        .model("m")
        .base_url(format!("ftp://user:{SECRET}@llm.internal/v1"))
        .build()
        .unwrap_err();
    assert_no_secret("OpenAiConfigError (Debug)", &format!("{error:?}"));
    assert_no_secret("OpenAiConfigError (Display)", &error.to_string());
}
