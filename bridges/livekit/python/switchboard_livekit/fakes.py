"""Fake media for a bridged ``AgentSession`` with no LiveKit server, no model and no key:
the shape of livekit/agents' own test fakes, driven by the caller instead of a timeline.

- ``FakeUser`` speaks: ``start_speaking()`` / ``stop_speaking()`` reach the session as VAD
  events, ``say_words(text, is_final)`` as STT transcripts.
- ``FakeTTS`` "synthesises" silence, ``seconds_per_char`` of audio per character.
- ``FakeAudioOutput`` plays in real time: a speech flushed is over after its audio's
  duration; a cleared one reports where it stopped, and the transcript synchronizer in
  front of it turns that into the words the user heard.

``fake_audio_session()`` puts them together the way livekit/agents' fake session does.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from livekit import rtc
from livekit.agents import AgentSession, LanguageCode, stt, tts, utils, vad
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS, APIConnectOptions
from livekit.agents.voice.io import AudioInput, AudioOutput, AudioOutputCapabilities, TextOutput
from livekit.agents.voice.transcription.synchronizer import TranscriptSynchronizer

from .agent import bridge_session_options

SAMPLE_RATE = 16000


class FakeUser:
    """The caller: what they do reaches the session's VAD and STT streams."""

    def __init__(self) -> None:
        self.vad_streams: list[_FakeVADStream] = []
        self.stt_streams: list[_FakeSTTStream] = []
        self._speech_started: float | None = None

    def start_speaking(self) -> None:
        self._speech_started = time.perf_counter()
        self._vad(vad.VADEventType.START_OF_SPEECH)

    def stop_speaking(self) -> None:
        self._vad(vad.VADEventType.END_OF_SPEECH)
        self._speech_started = None

    def say_words(self, text: str, *, is_final: bool = True) -> None:
        kind = stt.SpeechEventType.FINAL_TRANSCRIPT if is_final else stt.SpeechEventType.INTERIM_TRANSCRIPT
        event = stt.SpeechEvent(
            type=kind, alternatives=[stt.SpeechData(language=LanguageCode("en"), text=text)]
        )
        for stream in self.stt_streams:
            stream.push(event)

    async def says(self, text: str, *, seconds: float = 0.3) -> None:
        """A whole utterance: starts speaking, an interim transcript, stops, the final one."""
        self.start_speaking()
        words = text.split()
        await asyncio.sleep(seconds / 2)
        self.say_words(" ".join(words[: max(1, len(words) // 2)]), is_final=False)
        await asyncio.sleep(seconds / 2)
        self.stop_speaking()
        self.say_words(text, is_final=True)

    def _vad(self, kind: vad.VADEventType) -> None:
        started = self._speech_started or time.perf_counter()
        duration = time.perf_counter() - started
        event = vad.VADEvent(
            type=kind, samples_index=0, timestamp=time.time(), speech_duration=duration,
            silence_duration=0.0, speaking=kind == vad.VADEventType.START_OF_SPEECH,
        )
        for stream in self.vad_streams:
            stream.push(event)


class FakeVAD(vad.VAD):
    def __init__(self, user: FakeUser) -> None:
        super().__init__(capabilities=vad.VADCapabilities(update_interval=0.05))
        self._user = user

    def stream(self) -> vad.VADStream:
        stream = _FakeVADStream(self)
        self._user.vad_streams.append(stream)
        return stream


class _FakeVADStream(vad.VADStream):
    def push(self, event: vad.VADEvent) -> None:
        self._event_ch.send_nowait(event)

    async def _main_task(self) -> None:
        async for _ in self._input_ch:
            pass


class FakeSTT(stt.STT):
    def __init__(self, user: FakeUser) -> None:
        super().__init__(capabilities=stt.STTCapabilities(streaming=True, interim_results=True))
        self._user = user

    async def _recognize_impl(self, buffer: Any, *, language: Any = None, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS) -> stt.SpeechEvent:
        return stt.SpeechEvent(type=stt.SpeechEventType.FINAL_TRANSCRIPT, alternatives=[])

    def stream(self, *, language: Any = None, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS) -> stt.RecognizeStream:
        stream = _FakeSTTStream(stt=self, conn_options=conn_options)
        self._user.stt_streams.append(stream)
        return stream


class _FakeSTTStream(stt.RecognizeStream):
    def push(self, event: stt.SpeechEvent) -> None:
        self._event_ch.send_nowait(event)

    async def _run(self) -> None:
        async for _ in self._input_ch:
            pass


class FakeTTS(tts.TTS):
    """Silence, ``seconds_per_char`` seconds of it per character of text."""

    def __init__(self, *, seconds_per_char: float = 0.02) -> None:
        super().__init__(capabilities=tts.TTSCapabilities(streaming=False), sample_rate=SAMPLE_RATE, num_channels=1)
        self.seconds_per_char = seconds_per_char
        self.texts: list[str] = []

    def synthesize(self, text: str, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS) -> tts.ChunkedStream:
        self.texts.append(text)
        return _FakeChunkedStream(tts=self, input_text=text, conn_options=conn_options)


class _FakeChunkedStream(tts.ChunkedStream):
    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        fake: FakeTTS = self._tts  # type: ignore[assignment]
        output_emitter.initialize(
            request_id=utils.shortuuid("fake_tts_"), sample_rate=SAMPLE_RATE,
            num_channels=1, mime_type="audio/pcm",
        )
        samples = int(SAMPLE_RATE * fake.seconds_per_char * len(self._input_text))
        step = SAMPLE_RATE // 100
        for start in range(0, samples, step):
            output_emitter.push(b"\x00\x00" * min(step, samples - start))
        output_emitter.flush()


class FakeAudioInput(AudioInput):
    """A microphone that hears silence: 20 ms frames, in real time."""

    def __init__(self) -> None:
        super().__init__(label="FakeAudioInput")

    async def __anext__(self) -> rtc.AudioFrame:
        await asyncio.sleep(0.02)
        samples = SAMPLE_RATE // 50
        return rtc.AudioFrame(data=b"\x00\x00" * samples, sample_rate=SAMPLE_RATE,
                              num_channels=1, samples_per_channel=samples)


class FakeAudioOutput(AudioOutput):
    """A loudspeaker that plays in real time and reports where playback stopped."""

    def __init__(self) -> None:
        super().__init__(label="FakeAudioOutput", capabilities=AudioOutputCapabilities(pause=False))
        self._started_at = 0.0
        self._pushed = 0.0
        self._finish: asyncio.TimerHandle | None = None

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        await super().capture_frame(frame)
        if not self._pushed:
            self._started_at = time.time()
            self.on_playback_started(created_at=self._started_at)
        self._pushed += frame.duration

    def flush(self) -> None:
        super().flush()
        if not self._pushed:
            return

        def _finished() -> None:
            self._finish = None
            pushed, self._pushed = self._pushed, 0.0
            self.on_playback_finished(playback_position=pushed, interrupted=False)

        left = self._pushed - (time.time() - self._started_at)
        if self._finish is not None:
            self._finish.cancel()
        self._finish = asyncio.get_running_loop().call_later(max(left, 0.0), _finished)

    def clear_buffer(self) -> None:
        if not self._pushed:
            return
        if self._finish is not None:
            self._finish.cancel()
            self._finish = None
        played = min(self._pushed, time.time() - self._started_at)
        self._pushed = 0.0
        self.on_playback_finished(playback_position=played, interrupted=True)


class FakeTextOutput(TextOutput):
    """The room's transcription: what the agent's speech showed, one entry per speech."""

    def __init__(self) -> None:
        super().__init__(label="FakeTextOutput", next_in_chain=None)
        self._text = ""
        self.messages: list[str] = []

    async def capture_text(self, text: str) -> None:
        self._text += text

    def flush(self) -> None:
        self.messages.append(self._text)
        self._text = ""


def fake_audio_session(user: FakeUser, *, seconds_per_char: float = 0.02, **options: Any) -> AgentSession:
    """An ``AgentSession`` for a bridged call with fake STT, VAD, TTS and audio I/O, the way
    livekit/agents' fake session is built (the transcript synchronizer between the TTS and
    the loudspeaker tells what was heard)."""
    session = AgentSession(
        stt=FakeSTT(user),
        vad=FakeVAD(user),
        tts=FakeTTS(seconds_per_char=seconds_per_char),
        **bridge_session_options(),
        **options,
    )
    sync = TranscriptSynchronizer(next_in_chain_audio=FakeAudioOutput(), next_in_chain_text=FakeTextOutput())
    session.input.audio = FakeAudioInput()
    session.output.audio = sync.audio_output
    session.output.transcription = sync.text_output
    return session
