"""The worker's end of the bridge protocol: one WebSocket per call to switchboard's
LiveKitBridge, with numbered inputs and outputs, acknowledgements both ways and resume
after a reconnect (docs/livekit.md describes the frames).

Rules this side keeps:
- every input gets the next number and stays in ``_unacked`` until the bridge acknowledges
  it; after a reconnect, every input after the bridge's ``last_input`` is sent again;
- an output is applied only if it is the next number; one seen before is dropped (the
  bridge resends what was not acknowledged), one past the next breaks the connection so
  the bridge resends from the last acknowledged number;
- the token is sent in the hello and never logged.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
from collections.abc import Callable
from typing import Any

import aiohttp

logger = logging.getLogger("switchboard_livekit")

PROTOCOL_VERSION = 1


class BridgeRefused(Exception):
    """The bridge refused the hello (wrong token, unknown session, protocol version)."""


class BridgeConnection:
    """One call's connection to switchboard. ``on_output(output: dict)`` is called once per
    output, in order, on the event loop."""

    def __init__(
        self,
        url: str,
        token: str,
        session_id: str,
        *,
        on_output: Callable[[dict[str, Any]], None],
        room: str | None = None,
        participant: dict[str, Any] | None = None,
        metadata: Any = None,
        can_pause: bool = False,
        resume_timeout: float = 30.0,
    ) -> None:
        self._url = url
        self._token = token
        self.session_id = session_id
        self._on_output = on_output
        self._room = room
        self._participant = participant
        self._metadata = metadata
        self._can_pause = can_pause
        self._resume_timeout = resume_timeout

        self._next_input = 1
        self._unacked: collections.deque[tuple[int, str]] = collections.deque()
        self._last_output = 0
        self._ack_scheduled = False
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = asyncio.Event()
        self._finished = False
        self._down_until = 0.0
        self.connections = 0
        """How many times a connection was accepted (1 + reconnections)."""
        self.hold_acks = False
        """Tests: while set, no output is acknowledged, so the bridge must resend them."""

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Connects (the first hello starts the call's session) and serves the call in the
        background until it ends."""
        self._http = aiohttp.ClientSession()
        await self._connect(deadline=asyncio.get_running_loop().time() + self._resume_timeout)
        self._task = asyncio.create_task(self._serve(), name="switchboard_livekit.connection")

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def aclose(self) -> None:
        self._finished = True
        if self._ws is not None:
            await self._ws.close()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        if self._http is not None:
            await self._http.close()
        self._closed.set()

    def finish(self) -> None:
        """The call is over (the bridge said ``ended``): stop reconnecting."""
        self._finished = True

    async def drop_connection(self, *, down_for: float = 0.0) -> None:
        """Tests: break the connection as a network fault would, for ``down_for`` seconds;
        then the connection comes back on its own and resumes the call."""
        self._down_until = asyncio.get_running_loop().time() + down_for
        if self._ws is not None:
            await self._ws.close()

    # ------------------------------------------------------------------ inputs

    def send_input(self, kind: str, **fields: Any) -> int:
        """Sends an input (``kind`` and its fields, see the protocol); returns its number.
        While disconnected it waits in the unacknowledged list and goes out on resume."""
        input_id = self._next_input
        self._next_input += 1
        frame = json.dumps({"type": "input", "id": input_id, "input": {"kind": kind, **fields}})
        self._unacked.append((input_id, frame))
        self._send_now(frame)
        return input_id

    @property
    def unacked_inputs(self) -> int:
        return len(self._unacked)

    # ------------------------------------------------------------------ internals

    def _send_now(self, frame: str) -> None:
        ws = self._ws
        if ws is None or ws.closed:
            return
        # aiohttp writes the frame synchronously into the transport before its first
        # await, so frames keep the order of the calls.
        fut = asyncio.ensure_future(ws.send_str(frame))
        fut.add_done_callback(_ignore_send_error)

    async def _connect(self, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        if (down := self._down_until - loop.time()) > 0:
            await asyncio.sleep(down)
        delay = 0.02
        last_error: BaseException | None = None
        while loop.time() < deadline and not self._finished:
            try:
                assert self._http is not None
                ws = await self._http.ws_connect(self._url, heartbeat=5.0, max_msg_size=0)
            except (aiohttp.ClientError, OSError) as e:
                last_error = e
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            hello = {
                "type": "hello",
                "protocol": PROTOCOL_VERSION,
                "token": self._token,
                "session": self.session_id,
                "room": self._room,
                "participant": self._participant,
                "metadata": self._metadata,
                "last_output": self._last_output,
                "can_pause": self._can_pause,
            }
            await ws.send_str(json.dumps(hello))
            msg = await ws.receive()
            if msg.type != aiohttp.WSMsgType.TEXT:
                await ws.close()
                last_error = ConnectionError(f"the bridge closed before its welcome ({msg.type})")
                await asyncio.sleep(delay)
                continue
            answer = json.loads(msg.data)
            if answer.get("type") == "refused":
                await ws.close()
                raise BridgeRefused(answer.get("reason", "refused"))
            if answer.get("type") != "welcome":
                await ws.close()
                raise BridgeRefused(f"expected a welcome, got {answer.get('type')!r}")
            self._ws = ws
            self.connections += 1
            self._forget_inputs(int(answer.get("last_input", 0)))
            for _, frame in self._unacked:
                self._send_now(frame)
            return
        raise ConnectionError(f"cannot reach the switchboard bridge at {self._url}: {last_error}")

    def _forget_inputs(self, upto: int) -> None:
        while self._unacked and self._unacked[0][0] <= upto:
            self._unacked.popleft()

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                ws = self._ws
                assert ws is not None
                broken = False
                async for msg in ws:
                    if msg.type != aiohttp.WSMsgType.TEXT:
                        continue
                    if not self._on_frame(json.loads(msg.data)):
                        broken = True
                        break
                if broken:
                    await ws.close()
                self._ws = None
                if self._finished:
                    return
                logger.info("switchboard bridge connection lost; resuming", extra={"session": self.session_id})
                try:
                    await self._connect(deadline=loop.time() + self._resume_timeout)
                except BridgeRefused as e:
                    # The call is gone on switchboard's side (its resume window passed).
                    logger.warning("switchboard refused the resume: %s", e)
                    self._on_output({"kind": "ended", "reason": f"resume refused: {e}"})
                    return
        finally:
            self._closed.set()

    def _on_frame(self, frame: dict[str, Any]) -> bool:
        kind = frame.get("type")
        if kind == "ack":
            self._forget_inputs(int(frame["upto"]))
        elif kind == "output":
            seq = int(frame["seq"])
            if seq <= self._last_output:
                self._schedule_ack()  # a resend of what was applied: acknowledge again
            elif seq == self._last_output + 1:
                self._last_output = seq
                try:
                    self._on_output(frame["output"])
                except Exception:
                    logger.exception("error while applying a switchboard output")
                self._schedule_ack()
            else:
                logger.warning("switchboard output %d came after %d; reconnecting", seq, self._last_output)
                return False
        return True

    def _schedule_ack(self) -> None:
        # One acknowledgement per burst of outputs, not one per output.
        if self._ack_scheduled or self.hold_acks:
            return
        self._ack_scheduled = True

        def _ack() -> None:
            self._ack_scheduled = False
            if not self.hold_acks:
                self._send_now(json.dumps({"type": "ack", "upto": self._last_output}))

        asyncio.get_running_loop().call_soon(_ack)


def _ignore_send_error(fut: asyncio.Future[None]) -> None:
    # A send on a connection that just broke: the frame stays unacknowledged and is sent
    # again on resume.
    if not fut.cancelled():
        fut.exception()
