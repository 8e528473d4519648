"""A LiveKit Agents (1.8.9) worker in front of switchboard: LiveKit supplies the room or SIP
call, STT, VAD, TTS and the audio; switchboard keeps the conversation.

- ``SwitchboardAgent``: the LiveKit agent of a bridged call.
- ``bridge_session_options()``: the ``AgentSession`` settings a bridged call needs.
- ``BridgeConnection``: the protocol's worker side (numbered frames, acks, resume).
- ``fakes``: fake STT, VAD, TTS and audio I/O for tests and the no-key example.
- ``worker``: a LiveKit worker entrypoint for a real room (``python -m switchboard_livekit.worker``).
"""

from .agent import SwitchboardAgent, SwitchboardModel, bridge_session_options
from .connection import BridgeConnection, BridgeRefused

__all__ = [
    "BridgeConnection",
    "BridgeRefused",
    "SwitchboardAgent",
    "SwitchboardModel",
    "bridge_session_options",
]
