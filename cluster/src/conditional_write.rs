//! A write that lands only if its subject has not moved: JetStream's compare-and-set on a
//! subject's last sequence. The owner records (a KV bucket, whose revisions are that
//! sequence) and the snapshots stream both fence their writers with it.

use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::Context;

/// Why a conditional write did not land.
pub(crate) enum WriteError {
    /// The subject's last sequence (a key's revision) is not the expected one: someone
    /// else wrote first.
    Moved,
    /// The server could not be asked, or refused for another reason.
    Other(String),
}

/// Publishes `message` to `subject` if the subject's last sequence is `expected` (0: no
/// message yet); the new sequence.
pub(crate) async fn publish_if_last(
    js: &Context,
    subject: String,
    message: PublishMessage,
    expected: u64,
) -> Result<u64, WriteError> {
    let message = message.expected_last_subject_sequence(expected);
    let ack = js
        .send_publish(subject, message)
        .await
        .map_err(|err| WriteError::Other(err.to_string()))?
        .await;
    match ack {
        Ok(ack) => Ok(ack.sequence),
        Err(err) if err.kind() == PublishErrorKind::WrongLastSequence => Err(WriteError::Moved),
        Err(err) => Err(WriteError::Other(err.to_string())),
    }
}
