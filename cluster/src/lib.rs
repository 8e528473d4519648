//! switchboard-cluster (docs to come)
#![warn(missing_docs, unreachable_pub, rust_2018_idioms)]
#![deny(unused_must_use)]

mod connect;
mod dispatch;
mod gateway;
pub mod local;
mod namespace;
mod ownership;
mod permissions;
mod protocol;
mod remote_event;
mod remote_session;
mod spec;
mod worker;

pub use connect::{ClusterClient, ConnectError, NatsConnect};
pub use gateway::{Gateway, GatewayError, GatewayOptions, GatewayStats};
pub use namespace::{NameError, Namespace, SessionKey};
pub use ownership::{OwnerRecord, OwnerState};
pub use permissions::Permissions;
pub use protocol::WorkerInfo;
pub use remote_event::{
    EndReason, InputOutcome, RemoteAgentChat, RemoteAgentState, RemoteEvent, RemoteEventKind,
    RemoteFailure, RemoteHistory, RemoteRunResult, RemoteUserState,
};
pub use remote_session::{RemoteEvents, RemoteEventsError, RemoteSay, RemoteSession};
pub use spec::{FactoryError, OutputMode, SessionFactory, SessionSpec};
pub use worker::{provision, DrainReport, Worker, WorkerError, WorkerOptions};
