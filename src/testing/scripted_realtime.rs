//! `ScriptedRealtime`: a realtime model for tests, without network. It is the simulated
//! OpenAI Realtime server (`realtime_sim.rs`) behind an in-memory connection: the engine
//! speaks the real protocol to it (encoded and decoded as for OpenAI), and it answers
//! from a [`RealtimeScript`] and checks every client event as the service does.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use tokio::sync::mpsc;

use super::realtime_script::RealtimeScript;
use super::realtime_sim::{Control, Outgoing, SimReport, Simulator};
use crate::providers::openai_realtime::codec;
use crate::realtime::{
    ClientEvent, RealtimeCapabilities, RealtimeConnection, RealtimeError, RealtimeModel,
    RealtimeSettings, ServerEvent,
};

/// A scripted realtime model (see the module docs). Cheap to clone; clones share the
/// script, the report and the live connection.
///
/// The caller speaks either through the session's `AudioInput` ([`tone`](super::tone)
/// while speaking, [`silence`](super::silence) after: the simulated server's voice
/// detector ends the turn) or with [`user_starts_speaking`](Self::user_starts_speaking) and
/// [`user_stops_speaking`](Self::user_stops_speaking), which stand for the same without
/// audio.
#[derive(Clone)]
pub struct ScriptedRealtime {
    sim: Simulator,
    settings: RealtimeSettings,
    name: String,
    control: Arc<Mutex<Option<mpsc::UnboundedSender<Control>>>>,
    refuse: Arc<Mutex<u32>>,
}

impl fmt::Debug for ScriptedRealtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScriptedRealtime")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl ScriptedRealtime {
    /// A model that answers from `script`, with the default settings (server VAD that
    /// answers and interrupts, transcription on).
    pub fn new(script: RealtimeScript) -> Self {
        Self {
            sim: Simulator::new(script),
            settings: RealtimeSettings::new(),
            name: "scripted-realtime".to_owned(),
            control: Arc::new(Mutex::new(None)),
            refuse: Arc::new(Mutex::new(0)),
        }
    }

    /// The same, with these session settings.
    pub fn with_settings(mut self, settings: RealtimeSettings) -> Self {
        self.settings = settings;
        self
    }

    /// The model's name (default `scripted-realtime`): two models of one script with
    /// different names are different models (a handoff between them opens a connection).
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// As an `Arc`, for `AgentBuilder::realtime` and `SessionBuilder::realtime`.
    pub fn shared(&self) -> Arc<dyn RealtimeModel> {
        Arc::new(self.clone())
    }

    /// What the simulated server saw: violations, client events, barge-ins.
    pub fn report(&self) -> SimReport {
        self.sim.report()
    }

    /// The next `attempts` connections are refused (the model cannot be reached).
    pub fn refuse_connections(&self, attempts: u32) {
        *self.refuse.lock().unwrap_or_else(|p| p.into_inner()) = attempts;
    }

    /// The server's voice detector hears the user start speaking (no audio needed).
    pub fn user_starts_speaking(&self) {
        self.control(Control::SpeechStarted);
    }

    /// The user stops: the server commits the turn, transcribes it and answers it, as its
    /// voice detector would after a silence.
    pub fn user_stops_speaking(&self) {
        self.control(Control::SpeechStopped);
    }

    fn control(&self, control: Control) {
        if let Some(tx) = &*self.control.lock().unwrap_or_else(|p| p.into_inner()) {
            let _ = tx.send(control);
        }
    }
}

impl RealtimeModel for ScriptedRealtime {
    fn name(&self) -> &str {
        &self.name
    }

    fn capabilities(&self) -> RealtimeCapabilities {
        RealtimeCapabilities::OPENAI
    }

    fn settings(&self) -> &RealtimeSettings {
        &self.settings
    }

    fn connect(&self) -> BoxFuture<'static, Result<Box<dyn RealtimeConnection>, RealtimeError>> {
        let refused = {
            let mut refuse = self.refuse.lock().unwrap_or_else(|p| p.into_inner());
            let refused = *refuse > 0;
            *refuse = refuse.saturating_sub(1);
            refused
        };
        if refused {
            return async {
                Err(RealtimeError::Connect {
                    message: "the scripted model refuses connections".to_owned(),
                })
            }
            .boxed();
        }
        let (to_server, incoming) = mpsc::unbounded_channel();
        let (outgoing, from_server) = mpsc::unbounded_channel();
        let (control, controls) = mpsc::unbounded_channel();
        *self.control.lock().unwrap_or_else(|p| p.into_inner()) = Some(control);
        // On the caller's runtime: a test under paused time paces the replies with it.
        tokio::task::spawn_local(self.sim.clone().serve(incoming, outgoing, controls));
        async move {
            Ok(Box::new(MemoryConnection {
                to_server: Some(to_server),
                from_server,
            }) as Box<dyn RealtimeConnection>)
        }
        .boxed()
    }
}

/// A connection to the simulated server through two channels.
struct MemoryConnection {
    to_server: Option<mpsc::UnboundedSender<String>>,
    from_server: mpsc::UnboundedReceiver<Outgoing>,
}

impl RealtimeConnection for MemoryConnection {
    fn send(&mut self, event: ClientEvent) {
        if let Some(to_server) = &self.to_server {
            let _ = to_server.send(codec::encode(&event));
        }
    }

    fn poll_flush(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), RealtimeError>> {
        Poll::Ready(Ok(()))
    }

    fn poll_next(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<ServerEvent, RealtimeError>>> {
        loop {
            match self.from_server.poll_recv(cx) {
                Poll::Ready(Some(Outgoing::Text(text))) => match codec::decode(&text) {
                    Ok(event) => return Poll::Ready(Some(Ok(event))),
                    Err(why) => {
                        tracing::warn!(%why, "the simulated server sent an unreadable event")
                    }
                },
                Poll::Ready(Some(Outgoing::Close)) | Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn poll_close(&mut self, _cx: &mut Context<'_>) -> Poll<()> {
        self.to_server = None;
        Poll::Ready(())
    }
}
