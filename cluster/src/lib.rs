//! switchboard-cluster: sessions on many machines behind NATS JetStream (being built).
#![warn(missing_docs, unreachable_pub, rust_2018_idioms)]
#![deny(unused_must_use)]

mod connect;
pub mod local;

pub use connect::{ClusterClient, ConnectError, NatsConnect};
