//! The frames between a LiveKit worker and the bridge: JSON text messages on one WebSocket
//! per call, one frame per message. `docs/livekit.md` is the reference a worker in another
//! language is written from; this file is the definition.
//!
//! The worker connects and says [`ClientFrame::Hello`]; the bridge answers
//! [`ServerFrame::Welcome`] or [`ServerFrame::Refused`]. After that each side sends numbered
//! frames (inputs from the worker, outputs from the bridge) and acknowledges the other's
//! numbers. Neither side forgets a frame before the other acknowledged it, and each applies
//! a number once: after a reconnect each resends what the other has not acknowledged, and a
//! number seen before is dropped.

use serde::{Deserialize, Serialize};
use switchboard::{ChatItem, SpeechId};

/// The version of these frames; a worker that speaks another one is refused.
pub const PROTOCOL_VERSION: u32 = 1;

/// What the LiveKit worker sends.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ClientFrame {
    /// The first frame of every connection.
    Hello(Hello),
    /// An input, numbered 1, 2, 3, … per call. The bridge applies each number once and in
    /// order, then acknowledges it.
    Input {
        /// The input's number.
        id: u64,
        /// What the user or the room did.
        input: CallInput,
    },
    /// Every output up to `upto` was applied: the bridge may forget them.
    Ack {
        /// The highest output number applied.
        upto: u64,
    },
}

/// The first frame of a connection: who is calling, and where the worker is in the call.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    /// [`PROTOCOL_VERSION`].
    pub protocol: u32,
    /// The shared token the bridge was configured with.
    pub token: String,
    /// The call's session id: the same on every reconnection of one call.
    pub session: String,
    /// The LiveKit room, when there is one.
    #[serde(default)]
    pub room: Option<String>,
    /// The remote participant (the caller), when known.
    #[serde(default)]
    pub participant: Option<Participant>,
    /// Anything else the worker passes on (the job's metadata, a SIP header).
    #[serde(default)]
    pub metadata: serde_json::Value,
    /// The last output number the worker applied: 0 on the first connection of a call.
    #[serde(default)]
    pub last_output: u64,
    /// Whether the worker's audio output can pause (a barge-in then pauses the speech
    /// first and resumes it if the interruption was false).
    #[serde(default)]
    pub can_pause: bool,
}

impl std::fmt::Debug for Hello {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token is a secret: never printed.
        f.debug_struct("Hello")
            .field("protocol", &self.protocol)
            .field("token", &"<redacted>")
            .field("session", &self.session)
            .field("room", &self.room)
            .field("participant", &self.participant)
            .field("metadata", &self.metadata)
            .field("last_output", &self.last_output)
            .field("can_pause", &self.can_pause)
            .finish()
    }
}

/// A LiveKit participant, as the worker sees it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Participant {
    /// Its identity in the room (for SIP, e.g. `sip_+15550100`).
    pub identity: String,
    /// Its display name.
    #[serde(default)]
    pub name: Option<String>,
    /// Its metadata string.
    #[serde(default)]
    pub metadata: Option<String>,
    /// Its attributes (LiveKit's `sip.*` attributes for a phone caller).
    #[serde(default)]
    pub attributes: serde_json::Map<String, serde_json::Value>,
}

/// What the user or the room did: the host API's inputs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CallInput {
    /// The VAD heard the user start speaking.
    UserStartedSpeaking,
    /// The VAD heard the user stop.
    UserStoppedSpeaking,
    /// A transcript: interim ones are events only; a final one is user input, and final
    /// ones that come within the session's endpointing delay make one user turn.
    Transcript {
        /// The words.
        text: String,
        /// Whether the STT is done with them.
        is_final: bool,
    },
    /// A typed user turn (LiveKit's text input, `session.run(user_input=...)`): answered
    /// by [`CallOutput::TurnDone`] with this input's id.
    UserText {
        /// The text.
        text: String,
    },
    /// A speech's playout ended: played out, or cut short with what the user heard.
    PlayoutFinished {
        /// The speech.
        speech: SpeechId,
        /// Whether it was cut short.
        interrupted: bool,
        /// What the user heard when cut short (`None`: the worker cannot tell).
        #[serde(default)]
        heard: Option<String>,
    },
    /// The call is over on the worker's side (the caller hung up, the room closed): the
    /// session closes and [`CallOutput::Ended`] follows.
    Hangup {
        /// Why, for the logs.
        #[serde(default)]
        reason: Option<String>,
    },
}

/// What the bridge sends.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ServerFrame {
    /// The hello was accepted.
    Welcome {
        /// The call's session id.
        session: String,
        /// Whether the call was already running (a reconnection).
        resumed: bool,
        /// The last input number the bridge applied: the worker resends the later ones.
        last_input: u64,
    },
    /// The hello was refused; the bridge closes the connection.
    Refused {
        /// Why.
        reason: String,
    },
    /// An output, numbered 1, 2, 3, … per call.
    Output {
        /// The output's number.
        seq: u64,
        /// What the session did.
        output: CallOutput,
    },
    /// Every input up to `upto` was applied: the worker may forget them.
    Ack {
        /// The highest input number applied.
        upto: u64,
    },
}

/// What the session did: the speech to play and the answers to inputs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CallOutput {
    /// A speech starts (one at a time, in the order they are to be played).
    SpeechStarted {
        /// The speech.
        speech: SpeechId,
        /// The agent that speaks.
        agent: String,
    },
    /// A piece of a speech's text.
    SpeechChunk {
        /// The speech.
        speech: SpeechId,
        /// The text.
        text: String,
    },
    /// A speech's text is complete; its playout is reported with
    /// [`CallInput::PlayoutFinished`].
    SpeechFinished {
        /// The speech.
        speech: SpeechId,
    },
    /// Stop playing the speech now and report what was heard.
    Interrupt {
        /// The speech.
        speech: SpeechId,
    },
    /// Pause the speech (the user started talking over it).
    Pause {
        /// The speech.
        speech: SpeechId,
    },
    /// Resume a paused speech (the interruption was false).
    Resume {
        /// The speech.
        speech: SpeechId,
    },
    /// The answer to a [`CallInput::UserText`].
    TurnDone {
        /// The input's id.
        input: u64,
        /// How the turn ended.
        #[serde(flatten)]
        outcome: TurnOutcome,
    },
    /// The session is over; the worker ends the call.
    Ended {
        /// Why.
        reason: String,
    },
}

/// How a typed user turn ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum TurnOutcome {
    /// The turn ran.
    Done {
        /// What it added to the conversation, in order.
        events: Vec<ChatItem>,
        /// Whether it was interrupted.
        interrupted: bool,
    },
    /// The session refused or failed it.
    Failed {
        /// Why.
        error: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_read_as_the_docs_show_them() {
        let hello: ClientFrame = serde_json::from_str(
            r#"{"type":"hello","protocol":1,"token":"t","session":"room-1","last_output":3}"#,
        )
        .unwrap();
        let ClientFrame::Hello(hello) = hello else {
            panic!("not a hello: {hello:?}")
        };
        assert_eq!((hello.session.as_str(), hello.last_output), ("room-1", 3));
        assert!(!hello.can_pause);

        let input: ClientFrame = serde_json::from_str(
            r#"{"type":"input","id":2,"input":{"kind":"transcript","text":"hi","is_final":true}}"#,
        )
        .unwrap();
        assert_eq!(
            input,
            ClientFrame::Input {
                id: 2,
                input: CallInput::Transcript {
                    text: "hi".into(),
                    is_final: true
                }
            }
        );

        let done = ServerFrame::Output {
            seq: 9,
            output: CallOutput::TurnDone {
                input: 2,
                outcome: TurnOutcome::Failed {
                    error: "closed".into(),
                },
            },
        };
        assert_eq!(
            serde_json::to_string(&done).unwrap(),
            r#"{"type":"output","seq":9,"output":{"kind":"turn_done","input":2,"status":"failed","error":"closed"}}"#
        );
    }

    #[test]
    fn a_hello_never_prints_its_token() {
        let hello = Hello {
            protocol: PROTOCOL_VERSION,
            token: "s3cret-token".into(),
            session: "room-1".into(),
            room: None,
            participant: None,
            metadata: serde_json::Value::Null,
            last_output: 0,
            can_pause: false,
        };
        let shown = format!("{hello:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("room-1"));
    }
}
