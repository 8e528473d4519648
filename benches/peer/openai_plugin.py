#!/usr/bin/env python3
"""The peer side of `benches/provider.rs`: LiveKit Agents 1.8.9's OpenAI plugin
(livekit-plugins-openai 1.8.9) against the same loopback server, in the same sitting.

Run by `BENCH_PEER_PYTHON=<python> cargo bench --bench provider`, which starts the server
and passes its base URL; not run by `cargo test`. Needs a venv with livekit-agents==1.8.9
and livekit-plugins-openai==1.8.9 (see BENCHMARKS.md). Prints one JSON line per scenario,
the same scenarios and fields as ours:

  P_text1000, P_text10, P_tool  openai.LLM.chat(...) read to its end (the plugin's own cost)
  P_turn                        AgentSession(llm=openai.LLM) turn: run("tool: ...") with a
                                function tool; 2 requests; a fresh session per turn

CPU is time.process_time() (this process; asyncio runs everything on one thread).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import statistics
import sys
import time

from livekit.agents import Agent, AgentSession, function_tool, llm
from livekit.agents import __version__ as LK_VERSION
from livekit.plugins import openai

BASE_URL = sys.argv[1]
N = int(os.environ.get("BENCH_N", "300"))
WARMUP = int(os.environ.get("BENCH_WARMUP", "30"))

logging.basicConfig(level=logging.WARNING, stream=sys.stderr)


@function_tool
async def get_weather(location: str) -> str:
    """Current weather"""
    return "sunny, 22 °C"


def summary(samples_s: list[float]) -> dict:
    s = sorted(samples_s)
    rank = lambda p: s[max(1, min(len(s), -(-int(p * len(s) * 1000) // 1000))) - 1]
    us = lambda x: round(x * 1e6, 1)
    return {
        "wall_mean_us": us(statistics.fmean(s)),
        "wall_p50_us": us(rank(0.5)),
        "wall_p99_us": us(rank(0.99)),
    }


def emit(scenario: str, n: int, wall: list[float], cpu: float, per: int, extra: dict) -> None:
    out = {"side": "livekit-plugins-openai", "scenario": scenario, "n": n}
    out.update(summary(wall))
    cpu_req = cpu * 1e6 / n
    out["cpu_per_request_us"] = round(cpu_req, 1)
    if per >= 100:
        out["cpu_per_chunk_us"] = round(cpu_req / per, 3)
    out.update(extra)
    print(json.dumps(out), flush=True)


async def one_request(model: openai.LLM, text: str) -> tuple[int, int]:
    ctx = llm.ChatContext.empty()
    ctx.add_message(role="system", content="You are a weather bot.")
    ctx.add_message(role="user", content=text)
    texts = calls = 0
    async with model.chat(chat_ctx=ctx, tools=[get_weather]) as stream:
        async for chunk in stream:
            if chunk.delta is None:
                continue
            if chunk.delta.content:
                texts += 1
            if chunk.delta.tool_calls:
                calls += len(chunk.delta.tool_calls)
    return texts, calls


async def direct(model: openai.LLM, scenario: str, text: str, n: int, warmup: int) -> None:
    expect = await one_request(model, text)
    for _ in range(warmup):
        assert await one_request(model, text) == expect
    wall = []
    c0 = time.process_time()
    for _ in range(n):
        t0 = time.perf_counter()
        got = await one_request(model, text)
        wall.append(time.perf_counter() - t0)
        assert got == expect, (got, expect)
    cpu = time.process_time() - c0
    emit(scenario, n, wall, cpu, expect[0], {"text_chunks": expect[0], "tool_calls": expect[1]})


async def turn(model: openai.LLM, n: int, warmup: int) -> None:
    wall, cpu = [], 0.0
    for i in range(warmup + n):
        session = AgentSession(llm=model, vad=None, turn_handling={"turn_detection": "manual"})
        await session.start(Agent(instructions="You are a weather bot.", tools=[get_weather]))
        c0 = time.process_time()
        t0 = time.perf_counter()
        await session.run(user_input="tool: the weather in Paris")
        elapsed = time.perf_counter() - t0
        spent = time.process_time() - c0
        items = session.history.items
        calls = sum(1 for it in items if it.type == "function_call")
        replies = sum(1 for it in items if it.type == "message" and it.role == "assistant")
        await session.aclose()
        if calls != 1 or replies != 1:
            raise RuntimeError(f"expected 1 call and 1 reply, got {calls} and {replies}")
        if i >= warmup:
            wall.append(elapsed)
            cpu += spent
    emit("P_turn", n, wall, cpu, 1, {"llm_requests_per_turn": 2})


async def main() -> None:
    print(json.dumps({"meta": True, "side": "livekit-plugins-openai", "livekit_agents": LK_VERSION,
                      "python": sys.version.split()[0]}), flush=True)
    model = openai.LLM(model="gpt-4.1-mini", base_url=BASE_URL, api_key="sk-bench")
    await direct(model, "P_text1000", "text1000", max(1, N // 5), WARMUP // 5)
    await direct(model, "P_text10", "text10", N, WARMUP)
    await direct(model, "P_tool", "tool", N, WARMUP)
    await turn(model, N, WARMUP)
    await model.aclose()


if __name__ == "__main__":
    asyncio.run(main())
