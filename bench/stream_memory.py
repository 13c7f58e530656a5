"""Peak RSS of a Threadline server under concurrent long message streams (issue 24).

A `threadline serve` subprocess on SQLite serves a chat graph whose `GenericFakeChatModel` streams a reply of
`--words` words word by word (each word and each space a chunk); `--runs` stateless runs are streamed at
once in the given mode, read to their end by this process, and the server's RSS is sampled every 50 ms.
Prints the idle, peak and after (3 s later) RSS of the server and what was streamed. A measuring tool: no
thresholds.

    python bench/stream_memory.py messages-tuple
    python bench/stream_memory.py messages --code /path/to/other/checkout   # another Threadline's package dir

`--code` puts that directory first on the server's PYTHONPATH (its working directory is a temporary one, so
the checkout this script runs from does not shadow it).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

GRAPH = '''
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langgraph.graph import END, START, MessagesState, StateGraph

REPLY = " ".join(f"word{i}" for i in range(WORDS))


async def reply(state: MessagesState) -> dict:
    model = GenericFakeChatModel(messages=iter([AIMessage(content=REPLY)]))
    return {"messages": [await model.ainvoke(state["messages"])]}


builder = StateGraph(MessagesState)
builder.add_node("reply", reply)
builder.add_edge(START, "reply")
builder.add_edge("reply", END)
graph = builder.compile()
'''


def rss_mb(pid: int) -> tuple[int, int]:
    """(current, peak) resident set size of `pid`, in MB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(fields["VmRSS"].split()[0]) // 1024, int(fields["VmHWM"].split()[0]) // 1024


async def stream(http: httpx.AsyncClient, mode: str) -> int:
    size = 0
    async with http.stream("POST", "/runs/stream", json={
            "assistant_id": "chat", "input": {"messages": [{"role": "user", "content": "hi"}]},
            "stream_mode": mode}) as response:
        async for chunk in response.aiter_raw():
            size += len(chunk)
    return size


async def measure(mode: str, runs: int, words: int, code: str | None) -> None:
    work = Path(tempfile.mkdtemp(prefix="threadline-stream-memory-"))
    (work / "graph.py").write_text(GRAPH.replace("WORDS", str(words)))
    (work / "langgraph.json").write_text('{"graphs": {"chat": "./graph.py:graph"}}')
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, LANGSMITH_TRACING="false")
    if code:
        env["PYTHONPATH"] = code
    # ASYNC230/ASYNC220: once, before anything is measured; the loop has nothing else to run yet.
    with open(work / "server.log", "w") as log:  # noqa: ASYNC230
        server = subprocess.Popen(  # noqa: ASYNC220
            [sys.executable, "-m", "threadline", "serve", "--config", str(work / "langgraph.json"),
             "--database-url", f"sqlite:///{work}/t.db", "--port", str(port), "--ui", "off"],
            env=env, cwd=work, stdout=subprocess.DEVNULL, stderr=log)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=600) as http:
            for _ in range(600):
                try:
                    if (await http.get("/ok")).status_code == 200:
                        break
                except httpx.TransportError:
                    await asyncio.sleep(0.1)
            idle, peak = rss_mb(server.pid)[0], 0

            async def sample() -> None:
                nonlocal peak
                while True:
                    peak = max(peak, rss_mb(server.pid)[0])
                    await asyncio.sleep(0.05)

            sampler = asyncio.create_task(sample())
            started = time.monotonic()
            sizes = await asyncio.gather(*(stream(http, mode) for _ in range(runs)))
            elapsed = time.monotonic() - started
            await asyncio.sleep(3)
            after, high = rss_mb(server.pid)
            sampler.cancel()
        print(f"mode={mode} runs={runs} words={words} idle={idle} MB peak={max(peak, high)} MB "
              f"after_3s={after} MB streamed={sum(sizes) / 1e6:.1f} MB elapsed={elapsed:.1f} s", flush=True)
    finally:
        server.terminate()
        server.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=["messages-tuple", "messages"])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--words", type=int, default=4000)
    parser.add_argument("--code", help="a directory holding another `threadline` package to measure")
    args = parser.parse_args()
    asyncio.run(measure(args.mode, args.runs, args.words, args.code))


if __name__ == "__main__":
    main()
