"""Per-turn latency of a typed turn in LiveKit Agents 1.8.9 (text mode, no room): from
``session.run(user_input=...)`` to the first text of the agent's speech reaching the
session's transcription output. Run by benches/bridge_latency.rs; prints one JSON line.

``python turn_latency.py bridged N``: the turn runs in switchboard behind the bridge
(SB_BRIDGE_URL, SB_BRIDGE_TOKEN); its speech comes back and is said with session.say.
``python turn_latency.py livekit N``: LiveKit's own pipeline, its LLM node on a fake model
that answers at once with the same text.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import statistics
import sys
import time

from livekit.agents import Agent, AgentSession, llm
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS, NOT_GIVEN
from livekit.agents.voice.io import TextOutput

from switchboard_livekit import SwitchboardAgent, bridge_session_options

ANSWER = "We open at nine."


class FirstText(TextOutput):
    """The session's transcription output: notes when each speech's first text arrives."""

    def __init__(self) -> None:
        super().__init__(label="FirstText", next_in_chain=None)
        self.first: asyncio.Future[float] | None = None

    async def capture_text(self, text: str) -> None:
        if text and self.first is not None and not self.first.done():
            self.first.set_result(time.perf_counter())

    def flush(self) -> None:
        pass


class _Stream(llm.LLMStream):
    async def _run(self) -> None:
        self._event_ch.send_nowait(
            llm.ChatChunk(id="fake", delta=llm.ChoiceDelta(role="assistant", content=ANSWER))
        )


class FakeLLM(llm.LLM):
    """Answers every request at once with one chunk of text (the peer bench's fake)."""

    def chat(self, *, chat_ctx, tools=None, conn_options=DEFAULT_API_CONNECT_OPTIONS,
             parallel_tool_calls=NOT_GIVEN, tool_choice=NOT_GIVEN, extra_kwargs=NOT_GIVEN):
        return _Stream(self, chat_ctx=chat_ctx, tools=tools or [], conn_options=conn_options)


async def one_call(mode: str, call: int, turns: int) -> list[float]:
    """One session, ``turns`` typed turns; the time of each to its first text out."""
    if mode == "bridged":
        session = AgentSession(vad=None, **bridge_session_options())
        agent: Agent = SwitchboardAgent(url=os.environ["SB_BRIDGE_URL"], token=os.environ["SB_BRIDGE_TOKEN"],
                                        session_id=f"bench-{call}")
    else:
        session = AgentSession(vad=None, llm=FakeLLM(), turn_handling={"turn_detection": "manual"})
        agent = Agent(instructions="You answer.")
    out = FirstText()
    session.output.transcription = out
    await session.start(agent)
    samples = []
    for i in range(turns):
        out.first = asyncio.get_running_loop().create_future()
        started = time.perf_counter()
        run = session.run(user_input=f"What time do you open? ({i})")
        first = await asyncio.wait_for(out.first, 10)
        await run
        samples.append((first - started) * 1000)
    if isinstance(agent, SwitchboardAgent):
        agent.hang_up()
        await asyncio.wait_for(agent.ended.wait(), 10)
        await agent.bridge.aclose()
    await session.aclose()
    return samples


async def measure(mode: str, n: int, warmup: int = 20, turns_per_call: int = 10) -> dict:
    """``n`` timed turns after ``warmup``, in calls of ``turns_per_call`` turns each (a
    fresh session per call, so no history grows past a call's length: LiveKit's pipeline
    copies and scans its whole chat context on every turn)."""
    samples: list[float] = []
    call = 0
    while len(samples) < warmup + n:
        samples += await one_call(mode, call, turns_per_call)
        call += 1
        gc.collect()
    samples = sorted(samples[warmup : warmup + n])
    return {
        "mode": mode,
        "n": n,
        "turns_per_call": turns_per_call,
        "mean_ms": statistics.fmean(samples),
        "p50_ms": samples[len(samples) // 2],
        "p99_ms": samples[min(len(samples) - 1, int(len(samples) * 0.99))],
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(measure(sys.argv[1], int(sys.argv[2])))))
