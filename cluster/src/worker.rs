//! `Worker`: runs sessions on a switchboard [`Engine`], taking them from the cluster's
//! jobs stream only while it has a free slot.
//!
//! * **Capacity is a hard bound.** A semaphore of `capacity` permits; the pull loop asks
//!   JetStream for at most as many jobs as it holds free permits, and each session holds
//!   its permit from its claim until its owner record says `Ended` or `Moving`
//!   (`dispatch.rs`). A resumed session takes a slot like a new one.
//! * **One owner per session.** A job becomes a session only after the worker created
//!   the session's owner record by compare-and-set (`ownership.rs`) and then claimed its
//!   snapshots by compare-and-set (`snapshots.rs`): the claim fences every owner before.
//! * **One lease per worker** (`lease.rs`): the worker renews it every third of its
//!   length; its sessions' records name it and are not rewritten while they run, so an
//!   idle session costs the control plane nothing. The session's loop
//!   (`worker/hosted.rs`) stops, writing nothing more, if the lease is lost or the store
//!   refuses its snapshot.
//! * **Resume.** A job whose session ran before (its snapshots say so) restores it from
//!   its last snapshot with the agents the factory builds, one epoch higher. Resume jobs
//!   come from draining workers and from the lease watch (`worker/resume.rs`): every
//!   worker watches the worker leases, and the sessions of one that died are queued to
//!   resume.
//! * **Drain.** [`Worker::drain`] stops pulling (a job delivered meanwhile is handed back
//!   at once), lets every session settle until the deadline, interrupts those that have
//!   not, stores each one's last snapshot, writes its `Moving` record and queues a resume
//!   job for it, then flushes the connection. The other workers resume them; their fronts
//!   see `SessionMoving` and then `SessionResumed`, and their inputs wait meanwhile.
//! * A worker answers its counts on `<ns>.worker.<name>.info` ([`WorkerInfo`]).
//!
//! Dropping a `Worker` without draining stops its tasks at once, as a crash would: its
//! sessions stop without a word, its lease runs out and other workers resume them.

mod apply;
mod counts;
mod event_log;
mod hosted;
mod lapses;
mod ledger;
mod output;
mod residents;
mod resume;
mod silent_owner;
mod tenure;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::{self, AckKind};
use futures_util::StreamExt;
use switchboard::Engine;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::connect::ClusterClient;
use crate::dispatch;
use crate::lease::{Renewal, WorkerLease};
use crate::namespace::{check_worker_name, NameError, Namespace, SessionKey};
use crate::ownership::{ClaimError, Owners};
use crate::protocol::{SessionJob, WorkerInfo};
use crate::provisioning::Provisioning;
use crate::snapshots::{Claimed, SnapshotStream};
use crate::spec::SessionFactory;
use counts::Counts;
use hosted::{Hosting, Start};

/// The most jobs one pull asks for.
const MAX_BATCH: usize = 64;

/// How soon a renewal that could not reach the bucket is tried again while the lease
/// cannot be trusted.
const RENEW_RETRY: Duration = Duration::from_millis(250);

/// Errors of a worker's start and drain.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// A name (the worker's, the namespace) is not usable on NATS.
    #[error(transparent)]
    Name(#[from] NameError),
    /// The worker cannot use a piece of the cluster on NATS: the jobs stream, its
    /// consumer, the owners bucket and its watch, the snapshots stream, its info subject. Missing (start a worker with
    /// `provision(true)`, the default, or create them), or refused by the server's
    /// permissions (see [`Permissions`](crate::Permissions)).
    #[error("worker {worker} cannot use the {what}: {reason}")]
    Setup {
        /// The worker.
        worker: String,
        /// What it could not use.
        what: &'static str,
        /// What NATS said.
        reason: String,
    },
    /// Sessions were still live when the drain's deadline (plus the close grace) ran out.
    #[error("worker {worker} did not finish draining in {waited:?}: {live} sessions still live")]
    DrainTimedOut {
        /// The worker.
        worker: String,
        /// How long it waited.
        waited: Duration,
        /// How many sessions were still live.
        live: usize,
    },
}

/// How a worker runs.
#[derive(Clone, Debug)]
pub struct WorkerOptions {
    pub(crate) name: String,
    pub(crate) capacity: usize,
    pub(crate) namespace: Namespace,
    pub(crate) lease: Duration,
    pub(crate) ended_retention: Duration,
    pub(crate) idle_timeout: Option<Duration>,
    pub(crate) provision: bool,
    pub(crate) replicas: usize,
    fetch_wait: Duration,
    replay_bytes: usize,
    close_grace: Duration,
}

impl WorkerOptions {
    /// A worker named `name` (one subject token, unique in the cluster: it names the
    /// worker in owner records and its info subject), with the defaults below.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            capacity: 100,
            namespace: Namespace::default(),
            lease: Duration::from_secs(10),
            ended_retention: Duration::from_secs(600),
            idle_timeout: Some(Duration::from_secs(600)),
            provision: true,
            replicas: 1,
            fetch_wait: Duration::from_secs(1),
            replay_bytes: 64 * 1024,
            close_grace: Duration::from_secs(5),
        }
    }

    /// How many sessions it holds at most (default 100).
    pub fn capacity(mut self, capacity: usize) -> Self {
        self.capacity = capacity.max(1);
        self
    }

    /// The cluster's namespace (default `sb`).
    pub fn namespace(mut self, namespace: Namespace) -> Self {
        self.namespace = namespace;
        self
    }

    /// How long the worker's lease lives unless renewed (default 10 s; whole seconds, at
    /// least 1). The worker renews it every third of this, one write however many
    /// sessions it holds; a worker that stops renewing (paused, partitioned) loses all its
    /// sessions this long after its last renewal. A killed one loses them at once, when a
    /// gateway finds it silent.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How long the `Ended` record of a session stays (default 10 min): a job for the same
    /// session id is refused meanwhile.
    pub fn ended_retention(mut self, retention: Duration) -> Self {
        self.ended_retention = retention;
        self
    }

    /// Closes a session that got no input for this long (default 10 min; `None`: never),
    /// so a front that vanished does not hold a slot forever.
    pub fn idle_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// Whether the worker creates the jobs stream, its consumer and the owners bucket
    /// when they do not exist (default true). Turn it off when an operator creates them
    /// and workers may not.
    pub fn provision(mut self, provision: bool) -> Self {
        self.provision = provision;
        self
    }

    /// How many replicas the streams and the bucket it creates have (default 1; 3 on a
    /// three-server NATS cluster, so that losing a server loses no job, owner record or
    /// snapshot). What exists already is left as it is.
    pub fn replicas(mut self, replicas: usize) -> Self {
        self.replicas = replicas.max(1);
        self
    }

    /// What its start creates.
    pub(crate) fn provisioning(&self) -> Provisioning {
        if self.provision {
            Provisioning::Create {
                replicas: self.replicas,
            }
        } else {
            Provisioning::Existing
        }
    }

    /// How long one pull waits for jobs before asking again (default 1 s; also the
    /// longest a drain waits for the pull under way).
    pub fn fetch_wait(mut self, wait: Duration) -> Self {
        self.fetch_wait = wait;
        self
    }

    /// How many bytes of its newest events each session keeps to send again to a gateway
    /// that missed them (default 64 KiB).
    pub fn replay_bytes(mut self, bytes: usize) -> Self {
        self.replay_bytes = bytes;
        self
    }

    /// How long a drain waits, past its deadline, for interrupted sessions to close
    /// (their tools' grace periods; default 5 s).
    pub fn close_grace(mut self, grace: Duration) -> Self {
        self.close_grace = grace;
        self
    }
}

/// What a drain did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DrainReport {
    /// Sessions that were live when it began, all now handed over (or ended).
    pub sessions: usize,
    /// Sessions it handed over to other workers (this drain's share of
    /// [`WorkerInfo::moved`]).
    pub moved: u64,
    /// How long it took.
    pub took: Duration,
}

/// Reads a worker's counts; outlives the [`Worker`], whose drain takes it.
#[derive(Clone)]
pub(crate) struct CountsReader(Arc<Shared>);

impl CountsReader {
    /// The counts now.
    pub(crate) fn info(&self) -> WorkerInfo {
        self.0.info()
    }
}

/// Runs sessions from the cluster's jobs stream on an engine. See the module docs.
pub struct Worker {
    shared: Arc<Shared>,
    /// The pull loop and the info responder; aborted on drop.
    tasks: JoinSet<()>,
}

struct Shared {
    name: String,
    options: WorkerOptions,
    slots: Arc<Semaphore>,
    hosting: Arc<Hosting>,
    drain: watch::Sender<Option<Instant>>,
    owners: Owners,
    /// The worker's lease, under which its sessions run.
    lease: WorkerLease,
    snapshots: SnapshotStream,
    consumer: PullConsumer,
    /// One task per session; aborted with the worker.
    sessions: Mutex<JoinSet<()>>,
    /// The sessions this worker claims or hosts now (a job under way), with how many jobs
    /// hold each.
    holding: Mutex<std::collections::HashMap<SessionKey, usize>>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("name", &self.shared.name)
            .field("live", &self.info().live)
            .finish()
    }
}

impl Worker {
    /// Connects the worker to the cluster (creating the jobs stream, consumer and owners
    /// bucket if `provision` is on and they are missing) and starts pulling sessions.
    pub async fn start(
        client: ClusterClient,
        engine: Engine,
        factory: impl SessionFactory,
        options: WorkerOptions,
    ) -> Result<Self, WorkerError> {
        check_worker_name(&options.name)?;
        let name = options.name.clone();
        let setup = |what: &'static str| {
            let worker = name.clone();
            move |reason: String| WorkerError::Setup {
                worker,
                what,
                reason,
            }
        };
        let js = jetstream::ContextBuilder::new()
            .timeout(Duration::from_secs(5))
            .build(client.nats().clone());
        let provisioning = options.provisioning();
        let consumer = dispatch::jobs_consumer(&js, &options.namespace, provisioning)
            .await
            .map_err(setup("jobs stream"))?;
        let owners = Owners::open(
            js.clone(),
            &options.namespace,
            options.lease,
            options.ended_retention,
            provisioning,
        )
        .await
        .map_err(setup("owners bucket"))?;
        let snapshots = SnapshotStream::open(
            js.clone(),
            &options.namespace,
            options.ended_retention,
            provisioning,
        )
        .await
        .map_err(|err| setup("snapshots stream")(err.to_string()))?;
        let leases = owners
            .leases()
            .watch()
            .await
            .map_err(setup("worker leases' watch"))?;
        let info_subject = options.namespace.worker_info(&options.name);
        // Before this worker answers its own info subject: a live lease of its name is a
        // crashed process's if nobody answers for it.
        let (lease, fenced) = WorkerLease::take(
            owners.leases(),
            &options.name,
            client.up_since_cell(),
            async || silent_owner::gone(&client, info_subject.clone()).await,
        )
        .await
        .map_err(|err| setup("worker lease")(err.to_string()))?;
        let info_requests = client
            .nats()
            .subscribe(info_subject)
            .await
            .map_err(|err| setup("info subject")(err.to_string()))?;
        let (drain, drain_rx) = watch::channel(None);
        let counts = Arc::new(Counts::default());
        let shared = Arc::new(Shared {
            name: options.name.clone(),
            slots: Arc::new(Semaphore::new(options.capacity)),
            hosting: Arc::new(Hosting {
                js,
                client,
                namespace: options.namespace.clone(),
                engine,
                factory: Arc::new(factory),
                counts,
                drain: drain_rx,
                idle_timeout: options.idle_timeout,
                replay_bytes: options.replay_bytes,
                residents: Arc::default(),
            }),
            drain,
            owners,
            lease,
            snapshots,
            consumer,
            sessions: Mutex::new(JoinSet::new()),
            holding: Mutex::default(),
            options,
        });
        let mut tasks = JoinSet::new();
        tasks.spawn(pull(shared.clone()));
        tasks.spawn(answer_info(shared.clone(), info_requests));
        tasks.spawn(resume::watch_leases(shared.clone(), leases));
        tasks.spawn(keep_lease(shared.clone()));
        if let Some(incarnation) = fenced {
            tracing::info!(worker = %shared.name, incarnation, "an older process of this name was gone: its lease is fenced");
        }
        {
            // An older process of this name may have died holding sessions: they resume
            // elsewhere (or here).
            let shared = shared.clone();
            tasks.spawn(async move { resume::sweep(&shared, &shared.name).await });
        }
        tracing::info!(worker = %shared.name, capacity = shared.options.capacity, "worker started");
        Ok(Self { shared, tasks })
    }

    /// The worker's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Its counts now (what its info subject answers).
    pub fn info(&self) -> WorkerInfo {
        self.shared.info()
    }

    /// A reader of its counts that goes on answering during and after its drain.
    pub(crate) fn counts_reader(&self) -> CountsReader {
        CountsReader(self.shared.clone())
    }

    /// Stops taking sessions, lets the live ones settle until `deadline` from now,
    /// interrupts those that have not, stores each one's last snapshot, hands it over
    /// (its `Moving` record and a resume job: another worker resumes it) and tells its
    /// front; then flushes the connection. Returns once every session is handed over.
    pub async fn drain(self, deadline: Duration) -> Result<DrainReport, WorkerError> {
        let began = Instant::now();
        let sessions = self.info().live;
        let moved_before = self.info().moved;
        self.shared
            .hosting
            .counts
            .draining
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.shared.drain.send_replace(Some(began + deadline));
        let waited = deadline + self.shared.options.close_grace + self.shared.options.fetch_wait;
        let capacity = u32::try_from(self.shared.options.capacity).unwrap_or(u32::MAX);
        // Every permit back: the pull loop stopped and every session's owner record says
        // `Ended`.
        let all_back = tokio::time::timeout(waited, self.shared.slots.acquire_many(capacity)).await;
        // The goodbye to the server is bounded too: a server gone (or unreachable) would
        // hold a flush for as long as it stays away, and the process past its SIGTERM.
        let goodbye = async {
            if all_back.is_ok() {
                // Every session ended or moved: the lease goes (a sweep catches a
                // hand-over whose job was lost).
                if let Err(err) = self
                    .shared
                    .lease
                    .end(self.shared.owners.leases(), &self.shared.name)
                    .await
                {
                    tracing::warn!(worker = %self.shared.name, %err, "cannot end the lease; it expires");
                }
            }
            let _ = self.shared.hosting.client.nats().flush().await;
        };
        if tokio::time::timeout(GOODBYE, goodbye).await.is_err() {
            tracing::warn!(worker = %self.shared.name, waited = ?GOODBYE, "the server did not take the drain's last writes; the lease expires on its own");
        }
        match all_back {
            Ok(_) => Ok(DrainReport {
                sessions,
                moved: self.info().moved - moved_before,
                took: began.elapsed(),
            }),
            Err(_) => Err(WorkerError::DrainTimedOut {
                worker: self.shared.name.clone(),
                waited,
                live: self.info().live,
            }),
        }
    }
}

/// The longest a drain waits, after its sessions' wait, for the server to take its last
/// writes (the lease's end when every session is back, the flush).
const GOODBYE: Duration = Duration::from_secs(2);

impl Drop for Worker {
    /// Stops every task of the worker, its sessions' too. The session tasks hold the
    /// worker's shared state (which holds their set): without this, they would keep each
    /// other alive and the sessions would run on after the `Worker` is gone.
    fn drop(&mut self) {
        self.tasks.abort_all();
        self.shared
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .abort_all();
    }
}

impl Shared {
    fn info(&self) -> WorkerInfo {
        let mut info = self.hosting.counts.info(&self.name, self.options.capacity);
        let writes = self.snapshots.counts();
        info.snapshot_writes = writes.written.load(std::sync::atomic::Ordering::Relaxed);
        info.snapshot_write_failures = writes.failed.load(std::sync::atomic::Ordering::Relaxed);
        info
    }

    fn draining(&self) -> bool {
        self.drain.borrow().is_some()
    }

    /// Runs a delivered job on its own task, holding one slot.
    fn spawn_session(self: &Arc<Self>, job: jetstream::Message, slot: OwnedSemaphorePermit) {
        Counts::bump(&self.hosting.counts.jobs_pulled);
        let shared = self.clone();
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        // Reap the finished ones so the set holds only live sessions.
        while sessions.try_join_next().is_some() {}
        sessions.spawn(shared.take_job(job, slot));
    }

    /// Claims the job's session — its owner record, then its snapshots — and runs it,
    /// new or resumed; see `dispatch.rs` and `snapshots.rs` for the rules. The slot is
    /// free again when the job is dropped, or once the session has ended (its owner
    /// lingers after its `Ended` record, answering replays, without a slot).
    async fn take_job(self: Arc<Self>, message: jetstream::Message, slot: OwnedSemaphorePermit) {
        let job: SessionJob = match serde_json::from_slice(&message.payload) {
            Ok(job) => job,
            Err(err) => {
                tracing::warn!(worker = %self.name, error = %err, "unreadable job: dropped");
                let _ = message.ack_with(AckKind::Term).await;
                Counts::bump(&self.hosting.counts.refused);
                return;
            }
        };
        let _holding = Holding::new(&self, &job.session);
        let back_soon = AckKind::Nak(Some(Duration::from_millis(200)));
        if job.silent.is_some() {
            // A gateway found the owner silent: claim at once if it is gone.
            match silent_owner::check(&self, &job.session).await {
                Ok(true) => {}
                Ok(false) => {
                    // Not a refused start: nothing was asked that could start.
                    tracing::info!(worker = %self.name, session = %job.session, "the owner a gateway found silent answers, its session does not run, or silence cannot be trusted here: left to its lease");
                    let _ = message.ack_with(AckKind::Term).await;
                    return;
                }
                Err(err) => {
                    tracing::warn!(worker = %self.name, session = %job.session, error = %err, "cannot read the owner a gateway found silent: left to its lease");
                    let _ = message.ack_with(AckKind::Term).await;
                    Counts::bump(&self.hosting.counts.refused);
                    return;
                }
            }
        }
        let Some(tenancy) = self.lease.tenancy() else {
            tracing::info!(worker = %self.name, session = %job.session, "the worker's lease cannot be trusted now; the job goes back");
            let _ = message.ack_with(back_soon).await;
            return;
        };
        let mut ownership = match self
            .owners
            .claim(&job.session, &self.name, tenancy.incarnation, 1)
            .await
        {
            Ok(ownership) => ownership,
            Err(err @ ClaimError::Taken { .. }) => {
                tracing::info!(worker = %self.name, error = %err, "job for a session owned already: dropped");
                let _ = message.ack_with(AckKind::Term).await;
                Counts::bump(&self.hosting.counts.refused);
                return;
            }
            Err(err @ ClaimError::Unreachable { .. }) => {
                tracing::warn!(worker = %self.name, error = %err, "cannot claim; the job goes back");
                let _ = message.ack_with(back_soon).await;
                return;
            }
        };
        let claimed = self
            .snapshots
            .claim(
                &job.session,
                ownership.epoch(),
                &self.name,
                job.spec.as_ref(),
                tenancy.clock.clone(),
            )
            .await;
        let (start, writer) = match claimed {
            Ok(Claimed::Fresh(writer)) => match job.spec {
                Some(spec) => (Start::Fresh(spec), writer),
                // A claim without a spec is never fresh.
                None => return,
            },
            Ok(Claimed::Resumed {
                writer,
                spec,
                snapshot,
            }) => (Start::Resume { spec, snapshot }, writer),
            Ok(Claimed::Nothing) => {
                tracing::info!(worker = %self.name, session = %job.session, "nothing to resume: dropped");
                let _ = ownership.release().await;
                let _ = message.ack_with(AckKind::Term).await;
                Counts::bump(&self.hosting.counts.refused);
                return;
            }
            Err(err) => {
                // Handed back for the next try: the record a claim may take over.
                tracing::warn!(worker = %self.name, session = %job.session, error = %err, "cannot claim the snapshots; the job goes back");
                let _ = ownership.hand_over().await;
                let _ = message.ack_with(back_soon).await;
                return;
            }
        };
        if let Err(err) = ownership.raise_epoch(writer.epoch()).await {
            tracing::warn!(worker = %self.name, session = %job.session, error = %err, "cannot record the session's epoch; the job goes back");
            let _ = ownership.hand_over().await;
            let _ = message.ack_with(back_soon).await;
            return;
        }
        // Confirmed by the server, so JetStream will not hand it to anyone else; if the
        // confirmation is lost, the owner record still refuses a second start.
        if let Err(err) = message.double_ack().await {
            tracing::warn!(worker = %self.name, session = %job.session, error = %err, "job ack not confirmed");
        }
        hosted::host(
            self.hosting.clone(),
            job.session,
            start,
            ownership,
            writer,
            tenancy,
            slot,
        )
        .await;
    }
}

/// Pulls jobs for as many free slots as there are, until the worker drains.
async fn pull(shared: Arc<Shared>) {
    let mut drain = shared.drain.subscribe();
    let mut connections = shared.hosting.client.connections();
    connections.borrow_and_update();
    let mut failures = 0u32;
    loop {
        if shared.draining() {
            break;
        }
        let first = tokio::select! {
            permit = shared.slots.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            _ = drain.changed() => continue,
        };
        let mut slots = vec![first];
        while slots.len() < MAX_BATCH {
            match shared.slots.clone().try_acquire_owned() {
                Ok(permit) => slots.push(permit),
                Err(_) => break,
            }
        }
        let batch = shared
            .consumer
            .batch()
            .max_messages(slots.len())
            .expires(shared.options.fetch_wait)
            .messages()
            .await;
        let mut batch = match batch {
            Ok(batch) => batch,
            Err(err) => {
                failures += 1;
                tracing::warn!(worker = %shared.name, error = %err, "cannot pull jobs");
                drop(slots);
                // The server is away (an outage, a restart): wait before asking again.
                let pause = Duration::from_millis(50 * u64::from(failures.min(20)));
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = drain.changed() => {}
                }
                continue;
            }
        };
        failures = 0;
        // The batch ends by itself (its jobs came, or it expired): read it to the end
        // even when draining, handing back what comes, so no job sits delivered to a
        // worker that will not run it. A reconnection ends it early: the pull request
        // died with the old connection (a restarted server forgot it), and the client
        // would only notice seconds after it expired.
        loop {
            let message = tokio::select! {
                message = batch.next() => message,
                _ = connections.changed() => break,
            };
            let Some(message) = message else { break };
            match message {
                Ok(message) => match slots.pop() {
                    Some(slot) if !shared.draining() => shared.spawn_session(message, slot),
                    _ => {
                        let _ = message.ack_with(AckKind::Nak(None)).await;
                    }
                },
                Err(err) => {
                    tracing::debug!(worker = %shared.name, error = %err, "pull ended");
                    break;
                }
            }
        }
    }
    tracing::info!(worker = %shared.name, "stopped pulling");
}

/// Renews the worker's lease every third of its length, and at once after a reconnection
/// (the lease is trusted again only once a renewal sent since succeeds); takes a new
/// incarnation when it is lost (its sessions stopped).
async fn keep_lease(shared: Arc<Shared>) {
    let leases = shared.owners.leases();
    let every = leases.lease() / 3;
    let mut tick = tokio::time::interval_at(Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut connections = shared.hosting.client.connections();
    connections.borrow_and_update();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            changed = connections.changed() => if changed.is_err() {
                return;
            },
        }
        loop {
            match shared.lease.renew(leases, &shared.name).await {
                // Sent before a reconnection: again, at once.
                Ok(true) => continue,
                Ok(false) => break,
                Err(Renewal::Unreachable(reason)) => {
                    tracing::warn!(worker = %shared.name, %reason, "lease not renewed");
                    // Not trusted now (a reconnection whose first renewal failed, JetStream
                    // not ready yet): asked again soon rather than at the next tick, which
                    // could come after the lease ran out.
                    if shared.lease.tenancy().is_none() && !shared.draining() {
                        tokio::time::sleep(RENEW_RETRY).await;
                        continue;
                    }
                    break;
                }
                Err(Renewal::Ended) => return,
                Err(Renewal::Lost) => {
                    // Its sessions stopped; the next ones run under a new incarnation.
                    while let Err(err) = shared
                        .lease
                        .take_again(leases, &shared.name, shared.hosting.client.up_since_cell())
                        .await
                    {
                        tracing::warn!(worker = %shared.name, %err, "cannot take a new lease; trying again");
                        tokio::time::sleep(every).await;
                    }
                    // The lost incarnation's sessions resume (elsewhere, or here).
                    let shared = shared.clone();
                    tokio::spawn(async move { resume::sweep(&shared, &shared.name).await });
                    break;
                }
            }
        }
    }
}

/// A job under way on a session: the session is this worker's to run, and an owner probe
/// about it does not take it for an orphan.
struct Holding {
    shared: Arc<Shared>,
    session: SessionKey,
}

impl Holding {
    fn new(shared: &Arc<Shared>, session: &SessionKey) -> Self {
        *shared
            .holding
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(session.clone())
            .or_default() += 1;
        Self {
            shared: shared.clone(),
            session: session.clone(),
        }
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        let mut holding = self
            .shared
            .holding
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(count) = holding.get_mut(&self.session) {
            *count -= 1;
            if *count == 0 {
                holding.remove(&self.session);
            }
        }
    }
}

impl Shared {
    fn holds(&self, session: &SessionKey) -> bool {
        self.holding
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(session)
    }
}

/// Hands back `session` if its record names this worker's current lease as running it
/// while no job of this worker holds it: an orphan (a write that would have ended or moved
/// it failed), which no claim could take while the lease lives.
async fn hand_back_orphan(shared: Arc<Shared>, session: SessionKey) {
    let Ok(Some((revision, record))) = shared.owners.running(&session).await else {
        return;
    };
    if record.worker != shared.name
        || record.lease != shared.lease.incarnation()
        || shared.holds(&session)
    {
        return;
    }
    match shared
        .owners
        .hand_back_orphan(&session, revision, record)
        .await
    {
        Ok(moving) => {
            tracing::warn!(worker = %shared.name, %session, "a session this worker's record ran but nothing hosted: handed back");
            let id = format!("{session}.moved.{moving}");
            if dispatch::publish_resume(
                &shared.hosting.js,
                &shared.options.namespace,
                &session,
                &id,
            )
            .await
            .is_ok()
            {
                let _ = shared
                    .owners
                    .leases()
                    .unhost(&shared.name, &session, None)
                    .await;
            }
        }
        Err(err) => {
            tracing::debug!(worker = %shared.name, %session, %err, "orphan not handed back")
        }
    }
}

/// Answers the worker's info subject with its counts. A request that names a session (an
/// owner probe) also hands that session back if it is an orphan here.
async fn answer_info(shared: Arc<Shared>, mut requests: async_nats::Subscriber) {
    while let Some(request) = requests.next().await {
        // An empty payload (a plain info request) names no session: no key is empty.
        let named = std::str::from_utf8(&request.payload)
            .ok()
            .and_then(|text| SessionKey::new(text).ok());
        if let Some(session) = named.filter(|session| !shared.holds(session)) {
            tokio::spawn(hand_back_orphan(shared.clone(), session));
        }
        if let Some(reply) = request.reply {
            let json = serde_json::to_vec(&shared.info()).unwrap_or_default();
            let _ = shared
                .hosting
                .client
                .nats()
                .publish(reply, json.into())
                .await;
        }
    }
}
