"""A call through the bridge on one machine, with no LiveKit server and no key: fake STT,
VAD, TTS and audio (``switchboard_livekit.fakes``) in front of a switchboard session.
``cargo run -p switchboard-livekit --example livekit_call`` starts the switchboard side and
runs this with SWITCHBOARD_BRIDGE_URL and SWITCHBOARD_BRIDGE_TOKEN set.

It plays a caller who is greeted, books a table (an async tool whose result is spoken
after the turn), asks for the supervisor (a handoff), and talks over a long answer (a
barge-in: only what was heard stays), then hangs up. Prints what LiveKit played.
"""

from __future__ import annotations

import asyncio
import os
import time

from .agent import SwitchboardAgent
from .fakes import FakeUser, fake_audio_session


async def main() -> None:
    started = time.monotonic()
    user = FakeUser()
    session = fake_audio_session(user, seconds_per_char=0.03)

    def show(who: str, text: str) -> None:
        print(f"[{time.monotonic() - started:5.2f}s] {who:>6}: {text}", flush=True)

    session.on("conversation_item_added", lambda ev: ev.item.type == "message" and ev.item.role == "assistant"
               and show("agent", ev.item.text_content + (" [cut short]" if ev.item.interrupted else "")))
    agent = SwitchboardAgent(url=os.environ["SWITCHBOARD_BRIDGE_URL"],
                             token=os.environ["SWITCHBOARD_BRIDGE_TOKEN"],
                             session_id="demo-call", room="demo-room",
                             participant={"identity": "caller", "name": "Ada"})
    await session.start(agent)

    async def turn(text: str, settle: float) -> None:
        show("caller", text)
        await user.says(text)
        await asyncio.sleep(settle)

    await asyncio.sleep(1.5)
    await turn("Book a table for two", 4.0)
    await turn("Transfer me to a supervisor", 2.0)
    await turn("Tell me a long story", 2.5)
    show("caller", "(talks over the story) stop")
    user.start_speaking()
    await asyncio.sleep(0.6)
    user.stop_speaking()
    user.say_words("stop")
    await asyncio.sleep(2.0)
    agent.hang_up()
    await asyncio.wait_for(agent.ended.wait(), 10)
    await agent.bridge.aclose()
    await session.aclose()
    show("call", f"ended ({agent.end_reason})")


if __name__ == "__main__":
    asyncio.run(main())
