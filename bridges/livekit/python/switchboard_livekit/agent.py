"""A LiveKit ``AgentSession`` whose conversation runs in switchboard.

``SwitchboardAgent`` is the one LiveKit agent of a bridged call. LiveKit does what it is
good at: the room or SIP call, STT, VAD and TTS, and the audio. Everything the user does
goes to switchboard (user speaking from the VAD, interim and final transcripts from the
STT, typed text), and switchboard's speech comes back and is played with
``session.say(...)`` as a stream of text. What was heard of each speech goes back too: the
speech handle's end, with the text LiveKit's transcript synchronizer says was played.

Switchboard decides what LiveKit would otherwise decide on its own: when the user's turn is
over (its endpointing), whether speech over the agent is a barge-in (its
``min_interruption_duration``, false interruptions), and what to say. So the session is
built with ``bridge_session_options()``: LiveKit's own interruptions and preemptive
generation off, and a placeholder model whose node is never used (``SwitchboardAgent``
replaces the LLM node: a typed turn goes to switchboard instead).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterable
from typing import Any

from livekit.agents import Agent, AgentSession, StopResponse, llm
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS, NOT_GIVEN

from .connection import BridgeConnection

logger = logging.getLogger("switchboard_livekit")


class SwitchboardModel(llm.LLM):
    """Stands where LiveKit expects a model, so that typed turns (``session.run``,
    ``generate_reply(user_input=...)``) reach ``SwitchboardAgent.llm_node``. It is never
    asked for a completion: the conversation's models run in switchboard."""

    @property
    def model(self) -> str:
        return "switchboard"

    @property
    def provider(self) -> str:
        return "switchboard"

    def chat(self, *, chat_ctx, tools=None, conn_options=DEFAULT_API_CONNECT_OPTIONS,
             parallel_tool_calls=NOT_GIVEN, tool_choice=NOT_GIVEN, extra_kwargs=NOT_GIVEN):
        raise RuntimeError(
            "the conversation runs in switchboard: SwitchboardAgent.llm_node forwards turns "
            "there, and LiveKit's LLM node is not used"
        )


def bridge_session_options(**turn_handling: Any) -> dict[str, Any]:
    """The ``AgentSession`` keyword arguments a bridged call needs (add ``stt``, ``vad``,
    ``tts``). ``turn_handling`` entries are merged in (e.g. ``turn_detection="vad"``)."""
    handling: dict[str, Any] = {
        # Switchboard decides when the user's turn is over (its endpointing); LiveKit's
        # VAD and STT events still flow, and its own end-of-turn never fires.
        "turn_detection": "manual",
        # Switchboard decides barge-in; LiveKit keeps listening while the agent speaks.
        "interruption": {
            "enabled": False,
            "discard_audio_if_uninterruptible": False,
            "resume_false_interruption": False,
        },
        # A preemptive generation would send a typed turn before the user finished it.
        "preemptive_generation": {"enabled": False},
    }
    handling.update(turn_handling)
    return {"llm": SwitchboardModel(), "turn_handling": handling}


class _Speech:
    """One switchboard speech being played: its text stream and LiveKit's handle."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[str | None] = asyncio.Queue()
        self.handle: Any = None
        self.text_done = False

    async def text(self) -> AsyncIterable[str]:
        while (chunk := await self.queue.get()) is not None:
            yield chunk

    def end_text(self) -> None:
        if not self.text_done:
            self.text_done = True
            self.queue.put_nowait(None)


class SwitchboardAgent(Agent):
    """The LiveKit agent of a bridged call: forwards the user to switchboard and plays
    switchboard's speech. Give it a ``BridgeConnection`` factory's arguments; it connects
    when the session starts it (``on_enter``), which starts the switchboard session (a
    greeting from switchboard's ``on_enter`` then plays at once)."""

    def __init__(self, *, url: str, token: str, session_id: str, room: str | None = None,
                 participant: dict[str, Any] | None = None, metadata: Any = None,
                 resume_timeout: float = 30.0) -> None:
        super().__init__(instructions="The conversation runs in switchboard.")
        self.bridge = BridgeConnection(
            url, token, session_id, on_output=self._on_output, room=room,
            participant=participant, metadata=metadata, resume_timeout=resume_timeout,
        )
        self._speeches: dict[int, _Speech] = {}
        self._turns: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.played: list[tuple[int, bool, str | None]] = []
        """Each speech's playout as reported to switchboard: (speech, interrupted, heard)."""
        self.ended = asyncio.Event()
        self.end_reason: str | None = None
        self._hung_up = False

    # ------------------------------------------------------------------ LiveKit side

    async def on_enter(self) -> None:
        session = self.session
        audio = session.output.audio
        self.bridge._can_pause = bool(audio is not None and audio.can_pause)
        session.on("user_state_changed", self._on_user_state)
        session.on("user_input_transcribed", self._on_transcribed)
        session.on("close", self._on_close)
        await self.bridge.start()

    async def on_user_turn_completed(self, turn_ctx: llm.ChatContext, new_message: llm.ChatMessage) -> None:
        # The words went to switchboard as they were transcribed; it decides the turn.
        raise StopResponse()

    async def llm_node(self, chat_ctx: llm.ChatContext, tools: list[Any], model_settings: Any) -> None:
        """A typed turn: forwarded to switchboard instead of to a model. The run that
        asked for it (``session.run``) waits for switchboard's answer and for the speech
        it produced to be played."""
        items = chat_ctx.items
        last = items[-1] if items else None
        if last is None or last.type != "message" or last.role != "user":
            return None
        done = self._user_text(last.text_content or "")
        run = self.session._global_run_state  # private in 1.8.9: the run this turn belongs to
        if run is not None and not run.done():
            run._watch_handle(done)
        return None

    def _on_user_state(self, ev: Any) -> None:
        if ev.new_state == "speaking":
            self.bridge.send_input("user_started_speaking")
        elif ev.old_state == "speaking":
            self.bridge.send_input("user_stopped_speaking")

    def _on_transcribed(self, ev: Any) -> None:
        if ev.transcript:
            self.bridge.send_input("transcript", text=ev.transcript, is_final=bool(ev.is_final))

    def _on_close(self, ev: Any) -> None:
        self.hang_up(f"the LiveKit session closed ({getattr(ev, 'reason', '')})")

    def hang_up(self, reason: str = "the caller hung up") -> None:
        """The call is over on LiveKit's side: switchboard closes its session."""
        if not self._hung_up and not self.ended.is_set():
            self._hung_up = True
            self.bridge.send_input("hangup", reason=str(reason))

    def _user_text(self, text: str) -> asyncio.Future[dict[str, Any]]:
        input_id = self.bridge.send_input("user_text", text=text)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._turns[input_id] = fut
        return fut

    # ------------------------------------------------------------------ switchboard side

    def _on_output(self, output: dict[str, Any]) -> None:
        kind = output["kind"]
        if kind == "speech_started":
            self._start_speech(int(output["speech"]))
        elif kind == "speech_chunk":
            if (speech := self._speeches.get(int(output["speech"]))) is not None and not speech.text_done:
                speech.queue.put_nowait(output["text"])
        elif kind == "speech_finished":
            if (speech := self._speeches.get(int(output["speech"]))) is not None:
                speech.end_text()
        elif kind == "interrupt":
            if (speech := self._speeches.get(int(output["speech"]))) is not None:
                speech.end_text()
                if speech.handle is not None:
                    speech.handle.interrupt(force=True)
        elif kind == "pause":
            if (audio := self.session.output.audio) is not None and audio.can_pause:
                audio.pause()
        elif kind == "resume":
            if (audio := self.session.output.audio) is not None and audio.can_pause:
                audio.resume()
        elif kind == "turn_done":
            if (fut := self._turns.pop(int(output["input"]), None)) is not None and not fut.done():
                fut.set_result(output)
        elif kind == "ended":
            self.end_reason = output.get("reason")
            self.bridge.finish()
            self.ended.set()
            for fut in self._turns.values():
                if not fut.done():
                    fut.set_result({"status": "failed", "error": "the call ended"})
            self._turns.clear()

    def _start_speech(self, speech_id: int) -> None:
        speech = _Speech()
        self._speeches[speech_id] = speech
        # Uninterruptible for LiveKit: only switchboard interrupts (force=True).
        handle = self.session.say(speech.text(), allow_interruptions=False, add_to_chat_ctx=True)
        speech.handle = handle
        handle.add_done_callback(lambda h: self._played(speech_id, h))

    def _played(self, speech_id: int, handle: Any) -> None:
        speech = self._speeches.pop(speech_id, None)
        if speech is not None:
            speech.end_text()
        if handle.interrupted:
            said = [item for item in handle.chat_items if item.type == "message"]
            heard: str | None = said[0].text_content if said else ""
        else:
            heard = None
        self.played.append((speech_id, handle.interrupted, heard))
        if not self.ended.is_set():
            self.bridge.send_input("playout_finished", speech=speech_id,
                                   interrupted=bool(handle.interrupted), heard=heard)
