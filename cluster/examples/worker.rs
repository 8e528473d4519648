//! A worker you deploy: a dentist's front desk whose receptionist books appointments, on an
//! OpenAI-compatible model. The program is the factory (agents and tools are code) and a
//! one-line `main`; `switchboard_cluster::runtime` does the rest — settings from flags and
//! `SB_*` variables, the connection to NATS, health and metrics on HTTP, the drain on
//! SIGTERM.
//!
//! ```text
//! OPENAI_API_KEY=… SB_NATS_URL=nats://127.0.0.1:4222 SB_NATS_USER=worker SB_NATS_PASSWORD=… \
//!     cargo run -p switchboard-cluster --example worker -- --name desk-1 --capacity 20
//! curl localhost:8080/readyz    # {"worker":"desk-1","ready":true,…,"free_slots":20}
//! curl localhost:8080/metrics   # switchboard_worker_sessions{worker="desk-1"} 0 …
//! ```
//!
//! `-- --help` lists every setting. A front starts sessions with
//! `gateway.start_session(SessionSpec::new("receptionist"))`.

use std::process::ExitCode;
use std::sync::Arc;

use serde_json::Value;
use switchboard::prelude::*;
use switchboard::providers::openai::OpenAiLlm;
use switchboard::SessionBuilder;
use switchboard_cluster::{FactoryError, SessionFactory, SessionSpec};

/// The arguments of `book_appointment`.
#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Appointment {
    /// The day, e.g. "Tuesday".
    day: String,
    /// The time, e.g. "10:30".
    time: String,
}

/// Builds every session of this worker: one model for all of them (it pools its
/// connections), and the receptionist.
struct FrontDesk {
    llm: Arc<OpenAiLlm>,
}

impl SessionFactory for FrontDesk {
    fn builder(&self, _spec: &SessionSpec) -> Result<SessionBuilder, FactoryError> {
        Ok(Session::builder().llm(self.llm.clone()))
    }

    fn agent(&self, name: &str, data: &Value) -> Result<Agent, FactoryError> {
        if name != "receptionist" {
            return Err(FactoryError::UnknownAgent {
                name: name.to_owned(),
                known: vec!["receptionist".to_owned()],
            });
        }
        let book = Tool::new(
            "book_appointment",
            "Books a check-up",
            |_ctx: RunContext, slot: Appointment| async move {
                // Your booking system here.
                Ok::<_, ToolFailure>(format!("Booked for {} at {}.", slot.day, slot.time))
            },
        );
        Ok(Agent::builder("receptionist")
            .instructions("You are the front desk of a dental practice. Book check-ups.")
            .tool(book)
            // Built again from the same data when another worker resumes the session.
            .restore_data(data)
            .build()?)
    }
}

fn main() -> ExitCode {
    match OpenAiLlm::from_env() {
        Ok(llm) => switchboard_cluster::runtime::run(FrontDesk { llm: Arc::new(llm) }),
        Err(err) => {
            eprintln!("worker: {err}");
            ExitCode::from(2)
        }
    }
}
