//! The inputs task of a remote session: sends inputs one at a time, in order, each with
//! the next id, retrying an input with the same id until its owner answers.
//!
//! One at a time, because the owner's ledger keeps only the last applied id (what a
//! snapshot carries) and because the engine must see inputs in the order the front gave
//! them (speech started, then the transcript). An answer comes within a round trip (a
//! turn answers `Pending` at once and its outcome comes as an event), so one at a time
//! costs a round trip per input, a fraction of a millisecond.
//!
//! An input that found no answer within the input deadline may or may not have been
//! applied; later inputs of the session then fail the same way rather than risk being
//! applied out of order.

use std::sync::Arc;
use std::time::Duration;

use async_nats::RequestErrorKind;
use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::RemoteShared;
use crate::gateway::GatewayError;
use crate::protocol::{Answer, Input, Reply, Request};
use crate::remote_event::InputOutcome;

/// One input to send, with where its answers go.
pub(crate) struct Submission {
    pub(crate) input: Input,
    /// Where its `InputDone` goes, for an input whose answer takes time.
    pub(crate) outcome: Option<oneshot::Sender<InputOutcome>>,
    /// Where the owner's immediate answer goes (none: nobody waits).
    pub(crate) answer: Option<oneshot::Sender<Result<Answer, GatewayError>>>,
}

/// Sends the session's inputs until every handle is gone.
pub(crate) async fn send_inputs(
    shared: Arc<RemoteShared>,
    mut submissions: mpsc::UnboundedReceiver<Submission>,
) {
    let mut next_id = 1u64;
    let mut in_doubt: Option<GatewayError> = None;
    while let Some(Submission {
        input,
        outcome,
        answer,
    }) = submissions.recv().await
    {
        let result = if let Some(err) = &in_doubt {
            Err(err.clone())
        } else if let Some(reason) = shared.ended() {
            Err(shared.ended_error(reason))
        } else {
            let id = next_id;
            if let Some(outcome) = outcome {
                shared.register(id, outcome);
            }
            let result = send_one(&shared, id, &input).await;
            match &result {
                Ok(_) => next_id += 1,
                Err(err @ (GatewayError::Unreachable { .. } | GatewayError::InputsLost { .. })) => {
                    next_id += 1;
                    in_doubt = Some(err.clone());
                }
                // Not applied: the id is free for the next input.
                Err(_) => {}
            }
            if !matches!(result, Ok(Answer::Pending)) {
                shared.forget(id);
            }
            result
        };
        if let Some(answer) = answer {
            let _ = answer.send(result);
        }
    }
}

/// Sends input `id` until its owner answers, the session ends, the server refuses the
/// subject, or the input deadline passes.
async fn send_one(shared: &RemoteShared, id: u64, input: &Input) -> Result<Answer, GatewayError> {
    let gateway = &shared.gateway;
    let options = &gateway.options;
    let request = Request::Input {
        id,
        input: input.clone(),
    };
    let payload =
        Bytes::from(
            serde_json::to_vec(&request).map_err(|err| GatewayError::Protocol {
                session: shared.key.clone(),
                detail: err.to_string(),
            })?,
        );
    let began = Instant::now();
    let deadline = began + options.input_deadline;
    gateway.count(|s| s.inputs_sent += 1);
    let mut attempt = 0u32;
    loop {
        if attempt > 0 {
            gateway.count(|s| s.retries += 1);
        }
        attempt += 1;
        let request = async_nats::Request::new()
            .payload(payload.clone())
            .timeout(Some(options.attempt_timeout));
        let sent = gateway
            .client
            .nats()
            .send_request(shared.inputs_subject.clone(), request)
            .await;
        let no_responders = match sent {
            Ok(message) => return read_reply(shared, id, &message.payload),
            Err(err) => err.kind() == RequestErrorKind::NoResponders,
        };
        if let Some(server_said) = gateway.client.refusal_of(&shared.inputs_subject) {
            return Err(GatewayError::Refused {
                subject: shared.inputs_subject.clone(),
                server_said,
            });
        }
        if let Some(reason) = shared.ended() {
            return Err(shared.ended_error(reason));
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(GatewayError::Unreachable {
                session: shared.key.clone(),
                input: input.name(),
                waited: now - began,
            });
        }
        if no_responders {
            // Nobody subscribed: the owner is reconnecting (or gone). A timeout, on the
            // other hand, already waited: send again at once.
            let pause = Duration::from_millis(10 << attempt.min(4));
            tokio::time::sleep(pause.min(deadline - now)).await;
        }
    }
}

fn read_reply(shared: &RemoteShared, id: u64, payload: &[u8]) -> Result<Answer, GatewayError> {
    match serde_json::from_slice::<Reply>(payload) {
        Ok(Reply::Applied {
            id: answered,
            answer,
        }) if answered == id => Ok(answer),
        Ok(Reply::Ended { reason }) => Err(shared.ended_error(reason)),
        Ok(Reply::OutOfOrder { expected }) => Err(GatewayError::InputsLost {
            session: shared.key.clone(),
            expected,
        }),
        Ok(other) => Err(GatewayError::Protocol {
            session: shared.key.clone(),
            detail: format!("input {id} was answered with {other:?}"),
        }),
        Err(err) => Err(GatewayError::Protocol {
            session: shared.key.clone(),
            detail: format!("unreadable answer to input {id}: {err}"),
        }),
    }
}
