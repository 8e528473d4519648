"""Calls that tests/livekit_calls.rs runs through the real livekit-agents 1.8.9 against a
switchboard LiveKitBridge: ``python worker_scenarios.py <scenario> <session id>`` with
SB_BRIDGE_URL and SB_BRIDGE_TOKEN set. Each scenario checks what LiveKit saw, prints one
JSON line of what it observed (the Rust test checks switchboard's side), and exits 1 with
the failed check on stderr."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from collections.abc import Callable

from livekit.agents import AgentSession

from switchboard_livekit import SwitchboardAgent, bridge_session_options
from switchboard_livekit.fakes import FakeUser, fake_audio_session

URL = os.environ["SB_BRIDGE_URL"]
TOKEN = os.environ["SB_BRIDGE_TOKEN"]

logging.basicConfig(level=logging.WARNING, stream=sys.stderr)


class CheckFailed(Exception):
    pass


def check(ok: bool, what: str) -> None:
    if not ok:
        raise CheckFailed(what)


async def wait_for(pred: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise CheckFailed(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def spoken(session: AgentSession) -> list[str]:
    """What the agent said, as LiveKit's history has it (cut to what was heard)."""
    return [
        item.text_content or ""
        for item in session.history.items
        if item.type == "message" and item.role == "assistant"
    ]


async def end_call(session: AgentSession, agent: SwitchboardAgent) -> None:
    agent.hang_up()
    await asyncio.wait_for(agent.ended.wait(), 10)
    await agent.bridge.aclose()
    await session.aclose()


async def text_mode(session_id: str) -> dict:
    """No room, no audio: typed turns through session.run(user_input=...)."""
    session = AgentSession(vad=None, **bridge_session_options())
    agent = SwitchboardAgent(url=URL, token=TOKEN, session_id=session_id, room="text-room")
    await session.start(agent)
    await wait_for(lambda: len(agent.played) >= 1, "the greeting")
    check(spoken(session) == ["Hello, this is the concierge."], f"greeting: {spoken(session)}")

    started = time.perf_counter()
    result = await session.run(user_input="What time do you open?")
    plain_ms = (time.perf_counter() - started) * 1000
    said = [e.item.text_content for e in result.events if e.type == "message" and e.item.role == "assistant"]
    check(said == ["We open at nine."], f"the plain turn's run events: {said}")

    result = await session.run(user_input="Reserve a table for two")
    said = [e.item.text_content for e in result.events if e.type == "message" and e.item.role == "assistant"]
    check(said[-1:] == ["Booked: a table for two."], f"the tool turn's run events: {said}")
    history = [(i.role, i.text_content) for i in session.history.items if i.type == "message"]
    await end_call(session, agent)
    return {"history": history, "plain_turn_ms": plain_ms, "end": agent.end_reason}


async def audio_call(session_id: str) -> dict:
    """Fake STT, VAD, TTS and audio: a greeting, an async tool whose result is spoken after
    its turn, a handoff, and a barge-in whose heard text is all that stays."""
    user = FakeUser()
    session = fake_audio_session(user)
    agent = SwitchboardAgent(url=URL, token=TOKEN, session_id=session_id, room="audio-room",
                             participant={"identity": "caller-1", "name": "Ada"})
    await session.start(agent)
    await wait_for(lambda: "Hello, this is the concierge." in spoken(session), "the greeting played")

    await user.says("Book a table for two")
    await wait_for(lambda: any("Checking the book" in t for t in spoken(session)), "the tool's update spoken")
    await wait_for(lambda: any("Your table is booked" in t for t in spoken(session)), "the async result spoken after the turn")

    await user.says("Transfer me to a supervisor")
    await wait_for(lambda: "Supervisor here. How can I help?" in spoken(session), "the supervisor's greeting")

    before = len(agent.played)
    await user.says("Tell me a long story")
    await wait_for(lambda: session.agent_state == "speaking" and len(agent.played) == before, "the story playing", 10)
    await asyncio.sleep(0.4)
    user.start_speaking()
    await asyncio.sleep(0.15)
    user.say_words("stop", is_final=False)
    await wait_for(lambda: any(interrupted for _, interrupted, _ in agent.played[before:]), "the story interrupted", 5)
    user.stop_speaking()
    user.say_words("stop", is_final=True)
    story = next(p for p in agent.played[before:] if p[1])
    heard = story[2] or ""
    check(heard != "" and not heard.endswith("happily ever after."), f"heard part of the story, got {heard!r}")
    await wait_for(lambda: "Okay, I will stop." in spoken(session), "the answer to the barge-in")
    check(heard in spoken(session), f"LiveKit's history keeps the heard text {heard!r}: {spoken(session)}")
    said = spoken(session)
    await end_call(session, agent)
    return {"heard": heard, "spoken": said, "played": agent.played}


async def reconnect(session_id: str) -> dict:
    """The connection to switchboard breaks mid-call, with outputs unacknowledged and
    inputs sent while it is down; the call goes on with nothing lost or doubled."""
    user = FakeUser()
    session = fake_audio_session(user)
    agent = SwitchboardAgent(url=URL, token=TOKEN, session_id=session_id)
    await session.start(agent)
    await wait_for(lambda: "Hello, this is the concierge." in spoken(session), "the greeting played")

    agent.bridge.hold_acks = True  # the bridge must keep and resend every output from here
    await user.says("What time do you open?")
    await wait_for(lambda: session.agent_state == "speaking", "the answer starting")
    await agent.bridge.drop_connection(down_for=1.0)
    # While the connection is down the answer plays out and the user asks again: the
    # playout report and the user's inputs wait, and go out on resume.
    await wait_for(lambda: "We open at nine." in spoken(session), "the answer played out")
    check(agent.bridge.connections == 1, "the answer played out while the connection was down")
    await user.says("And on Sundays?")
    check(agent.bridge.connections == 1 and agent.bridge.unacked_inputs >= 3,
          f"inputs queued while down: {agent.bridge.unacked_inputs}")
    agent.bridge.hold_acks = False
    await wait_for(lambda: agent.bridge.connections >= 2, "the reconnection")
    await wait_for(lambda: "On Sundays we open at ten." in spoken(session), "the answer after the reconnection")
    await wait_for(lambda: agent.bridge.unacked_inputs == 0 and session.agent_state != "speaking", "everything acknowledged")
    ids = [speech for speech, _, _ in agent.played]
    check(len(ids) == len(set(ids)), f"each speech played once: {agent.played}")
    said = spoken(session)
    check(len(said) == len(set(said)), f"nothing said twice: {said}")
    await end_call(session, agent)
    return {"spoken": said, "connections": agent.bridge.connections, "played": agent.played}


async def refused(session_id: str) -> dict:
    """A wrong token is refused, and says so."""
    from switchboard_livekit import BridgeConnection, BridgeRefused

    conn = BridgeConnection(URL, TOKEN + "-wrong", session_id, on_output=lambda _: None, resume_timeout=2)
    try:
        await conn.start()
    except BridgeRefused as e:
        await conn.aclose()
        return {"refused": str(e)}
    await conn.aclose()
    raise CheckFailed("a wrong token was let in")


SCENARIOS = {"text_mode": text_mode, "audio_call": audio_call, "reconnect": reconnect, "refused": refused}


def main() -> None:
    name, session_id = sys.argv[1], sys.argv[2]
    try:
        observed = asyncio.run(asyncio.wait_for(SCENARIOS[name](session_id), 60))
    except CheckFailed as e:
        print(f"check failed: {e}", file=sys.stderr)
        sys.exit(1)
    print(json.dumps(observed))


if __name__ == "__main__":
    main()
