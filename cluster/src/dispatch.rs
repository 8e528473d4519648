//! Dispatch: sessions to start or resume wait as jobs in a JetStream work-queue stream,
//! which every worker pulls from through one shared durable consumer, and only for as many
//! jobs as it has free slots.
//!
//! * A resume job names a session to take on from its snapshots: a draining worker queues
//!   one for each session it hands over, and the worker that finds a worker's lease dead
//!   queues one for each session of that lease (`worker/resume.rs`). Its message id is
//!   made of what it follows (the `Moving` record's revision, the dead lease), so two
//!   sweeps of one death queue one job between them.
//! * A job is published with the session id as its `Nats-Msg-Id`, so a gateway's retried
//!   publish within the stream's duplicate window is dropped (and reported as a duplicate).
//! * A worker asks for at most as many jobs as it holds free slots (permits of its
//!   capacity semaphore); each delivered job consumes one permit, held until the session's
//!   owner record says `Ended`. So no worker ever holds more sessions than its capacity.
//! * A job is acknowledged (confirmed by the server) only after the worker's claim of the
//!   session succeeded; a job whose session is claimed already is terminated, so no job
//!   runs twice even when JetStream redelivers it.
//! * A worker that cannot claim (the owners bucket unreachable) naks the job for another
//!   try; a job held by a worker that died unacknowledged is redelivered to another
//!   worker after the ack wait, 2 s.

use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy, PullConsumer};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::stream::{self, RetentionPolicy, StorageType};
use async_nats::jetstream::{self};
use bytes::Bytes;

use crate::namespace::{Namespace, SessionKey};
use crate::protocol::SessionJob;
use crate::provisioning::Provisioning;

/// How long a delivered job may stay unacknowledged before JetStream gives it to another
/// worker. A worker claims and acknowledges within milliseconds; this bounds what a job
/// loses when the worker it went to died before acknowledging it (seen once, in a run
/// where a worker was killed just before the next start: that start waited the whole ack
/// wait, then 30 s). A redelivery to a second worker while the first still claims is
/// harmless: the claim is a compare-and-set, and the loser drops the job.
const ACK_WAIT: Duration = Duration::from_secs(2);

/// How long a retried start is recognised as a duplicate.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// How long a job may wait for a free worker before the stream drops it.
const JOB_MAX_AGE: Duration = Duration::from_secs(3600);

/// The jobs stream's consumer, creating the stream and the consumer when `provisioning`
/// says so and they do not exist.
pub(crate) async fn jobs_consumer(
    js: &jetstream::Context,
    namespace: &Namespace,
    provisioning: Provisioning,
) -> Result<PullConsumer, String> {
    let name = namespace.jobs_stream();
    let create = provisioning != Provisioning::Existing;
    let stream = if create {
        js.get_or_create_stream(stream::Config {
            name: name.clone(),
            description: Some("switchboard: sessions waiting for a worker".into()),
            subjects: vec![namespace.jobs_subject()],
            retention: RetentionPolicy::WorkQueue,
            storage: StorageType::File,
            duplicate_window: DUPLICATE_WINDOW,
            max_age: JOB_MAX_AGE,
            num_replicas: provisioning.replicas(),
            ..Default::default()
        })
        .await
        .map_err(|err| format!("cannot create the jobs stream {name}: {err}"))?
    } else {
        js.get_stream(&name)
            .await
            .map_err(|err| format!("no jobs stream {name}: {err}"))?
    };
    let durable = namespace.jobs_consumer();
    let config = pull::Config {
        durable_name: Some(durable.to_owned()),
        description: Some("switchboard: every worker pulls here".into()),
        ack_policy: AckPolicy::Explicit,
        ack_wait: ACK_WAIT,
        ..Default::default()
    };
    let missing = |err: String| format!("no consumer {durable} on the jobs stream {name}: {err}");
    if create {
        stream
            .get_or_create_consumer(durable, config)
            .await
            .map_err(|err| missing(err.to_string()))
    } else {
        stream
            .get_consumer(durable)
            .await
            .map_err(|err| missing(err.to_string()))
    }
}

/// What a job publish came to.
pub(crate) enum Published {
    /// The job is queued.
    Queued,
    /// The stream had a job with this session id already (within the duplicate window).
    Duplicate,
}

/// Publishes a job once (the caller retries on `Err`; the message id makes that safe).
pub(crate) async fn publish_job(
    js: &jetstream::Context,
    namespace: &Namespace,
    job: &SessionJob,
) -> Result<Published, String> {
    let payload = serde_json::to_vec(job).map_err(|err| err.to_string())?;
    let message = PublishMessage::build()
        .payload(Bytes::from(payload))
        .message_id(job.session.as_str());
    let ack = js
        .send_publish(namespace.jobs_subject(), message)
        .await
        .map_err(|err| err.to_string())?
        .await
        .map_err(|err| err.to_string())?;
    Ok(if ack.duplicate {
        Published::Duplicate
    } else {
        Published::Queued
    })
}

/// Queues a resume job for `session` with the message id `id` (retried a few times: a
/// lost one is queued again by the next sweep of the dead lease it follows).
pub(crate) async fn publish_resume(
    js: &jetstream::Context,
    namespace: &Namespace,
    session: &SessionKey,
    id: &str,
) -> Result<(), String> {
    let job = SessionJob {
        session: session.clone(),
        spec: None,
        silent: None,
    };
    publish_resume_job(js, namespace, &job, id).await
}

/// Queues the resume job `job` with the message id `id` (retried a few times).
pub(crate) async fn publish_resume_job(
    js: &jetstream::Context,
    namespace: &Namespace,
    job: &SessionJob,
    id: &str,
) -> Result<(), String> {
    let payload = Bytes::from(serde_json::to_vec(job).map_err(|err| err.to_string())?);
    let mut last_error = String::new();
    for attempt in 0..5u32 {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(50 << attempt)).await;
        }
        let message = PublishMessage::build()
            .payload(payload.clone())
            .message_id(id);
        let sent = js.send_publish(namespace.jobs_subject(), message).await;
        match sent {
            Ok(ack) => match ack.await {
                Ok(_) => return Ok(()),
                Err(err) => last_error = err.to_string(),
            },
            Err(err) => last_error = err.to_string(),
        }
    }
    Err(last_error)
}
