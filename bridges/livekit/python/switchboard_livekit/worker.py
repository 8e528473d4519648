"""A LiveKit worker whose calls run in switchboard: ``python -m switchboard_livekit.worker
dev`` (or ``start`` in production; the LiveKit CLI's commands).

Environment:
- ``LIVEKIT_URL``, ``LIVEKIT_API_KEY``, ``LIVEKIT_API_SECRET``: your LiveKit Cloud project or
  server (the worker registers there and is dispatched to rooms, and to SIP calls routed
  to it).
- ``SWITCHBOARD_BRIDGE_URL`` (``ws://host:port``) and ``SWITCHBOARD_BRIDGE_TOKEN``: the
  switchboard ``LiveKitBridge`` and its shared token.
- ``SWITCHBOARD_STT`` (default ``deepgram/nova-3``) and ``SWITCHBOARD_TTS`` (default
  ``cartesia/sonic-3``): LiveKit Inference model strings; or replace them below with any
  livekit-plugins STT and TTS.
- ``SWITCHBOARD_AGENT_NAME``: the agent name for explicit dispatch (empty: every room).

Each room is one switchboard session, named by the room; a reconnect of the worker to
switchboard within the bridge's resume window continues the same call.
"""

from __future__ import annotations

import os

from livekit.agents import AgentServer, AgentSession, JobContext, cli

from .agent import SwitchboardAgent, bridge_session_options

server = AgentServer()


@server.rtc_session(agent_name=os.environ.get("SWITCHBOARD_AGENT_NAME", ""))
async def entrypoint(ctx: JobContext) -> None:
    await ctx.connect()
    caller = await ctx.wait_for_participant()
    session = AgentSession(
        stt=os.environ.get("SWITCHBOARD_STT", "deepgram/nova-3"),
        tts=os.environ.get("SWITCHBOARD_TTS", "cartesia/sonic-3"),
        **bridge_session_options(),
    )
    agent = SwitchboardAgent(
        url=os.environ["SWITCHBOARD_BRIDGE_URL"],
        token=os.environ["SWITCHBOARD_BRIDGE_TOKEN"],
        session_id=ctx.room.name,
        room=ctx.room.name,
        participant={
            "identity": caller.identity,
            "name": caller.name,
            "metadata": caller.metadata,
            "attributes": dict(caller.attributes),
        },
        metadata=ctx.job.metadata or None,
    )
    await session.start(agent, room=ctx.room)
    # Switchboard ended the call (a tool hung up, the session closed): leave the room.
    await agent.ended.wait()
    session.shutdown()


if __name__ == "__main__":
    cli.run_app(server)
