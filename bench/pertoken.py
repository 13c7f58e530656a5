#!/usr/bin/env python
"""The pieces of a streamed token's path, each timed alone in one process: for changes of a few microseconds a
token, which `bench/workloads.py` cannot resolve on a shared machine (its cells move by 10-25% from one run of the
same code to the next).

    python bench/pertoken.py                          # every piece, this checkout
    python bench/pertoken.py --against /tmp/before    # that checkout and this one, alternated, --pairs times
    python bench/pertoken.py --only encode,hop

Pieces (`PIECES`), each the best (least CPU) of `--repeat` passes, per token or per call:

* ``feed``   - `MessageStreamer.feed` of a 4,000-chunk `messages-tuple` reply (serialize the chunk, its delta);
* ``partial`` - the same reply in `messages` mode (each `messages/partial`: the message so far, held as a delta);
* ``encode`` - the delta alone (`PartialEncoder.encode` of the same tuple frames, with their content span where
               the checkout's encoder takes one);
* ``decode`` - a subscriber rebuilding those frames (`PartialDecoder.decode`);
* ``pack``   - a finished run's 4,000 held events packed (`broker/memory.py: _Packed`), per event;
* ``hop``    - a call through the node threads (`NodeThreads`, the loop's default executor), as LangChain runs a
               synchronous model's `next(chunk)` per token; CPU of every thread of the process.

Each checkout runs in its own process (`PYTHONPATH`), the two alternated. No assertions: a measuring tool.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PIECES = ("feed", "partial", "encode", "decode", "pack", "hop")
METADATA = {"langgraph_step": 1, "langgraph_node": "respond", "langgraph_triggers": ["branch:to:respond"],
            "langgraph_path": ["__pregel_pull", "respond"], "langgraph_checkpoint_ns": "respond:" + "8f0a" * 9,
            "checkpoint_ns": "respond:" + "8f0a" * 9, "ls_provider": "genericfakechatmodel",
            "ls_model_type": "chat", "thread_id": "5b0e" * 9, "run_id": "1f0a" * 9}
TOKENS = 4000


def chunks() -> list[Any]:
    from langchain_core.messages import AIMessageChunk

    words = ("the quick brown fox jumps over the lazy dog " * (TOKENS // 16 + 1)).split(" ")[:TOKENS // 2]
    return [AIMessageChunk(content=text, id="run-" + "1f0a" * 9) for w in words for text in (w, " ")]


def best(fn: Callable[[], Any], repeat: int) -> float:
    """Least CPU seconds (every thread of the process) of `repeat` calls of `fn`."""
    out = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        out = min(out, time.process_time() - t0)
    return out


def piece(name: str, repeat: int) -> float:
    """Microseconds of CPU per token (per event, per call) of one piece."""
    from threadline.core.messages import MessageStreamer
    from threadline.core.partials import PartialDecoder, PartialEncoder
    from threadline.serde import dumps

    msgs = chunks()
    if name in ("feed", "partial"):
        def feed() -> None:
            streamer = MessageStreamer(legacy=name == "partial", tuples=name == "feed")
            for m in msgs:
                for _ in streamer.feed((m, METADATA)):
                    pass
        return 1e6 * best(feed, repeat) / len(msgs)
    meta = dumps(METADATA)
    frames = []
    for m in msgs:
        body = dumps(m)
        text = dumps(m.content)
        frames.append((b"[" + body + b"," + meta + b"]", (12, 12 + len(text))))
    spans = "span" in inspect.signature(PartialEncoder.encode).parameters
    if name == "encode":
        def encode() -> None:
            encoder = PartialEncoder()
            for frame, span in frames:
                encoder.encode("m", frame, span) if spans else encoder.encode("m", frame)
        return 1e6 * best(encode, repeat) / len(frames)
    if name == "decode":
        encoder = PartialEncoder()
        held = [encoder.encode("m", frame) for frame, _ in frames]

        def decode() -> None:
            decoder = PartialDecoder()
            for h in held:
                decoder.decode(h)
        return 1e6 * best(decode, repeat) / len(held)
    if name == "pack":
        from collections import deque

        from threadline.broker.base import StreamEvent
        from threadline.broker.memory import _Packed

        events = deque((i, StreamEvent(f"1765000000000-{i}", "messages", h), len(h))
                       for i, h in enumerate((dumps([i, 1]) + b"\n" + f[0][:40] for i, f in enumerate(frames)), 1))
        return 1e6 * best(lambda: _Packed(events), repeat) / len(events)
    if name == "hop":
        return hop(repeat)
    raise SystemExit(f"unknown piece {name}")


def hop(repeat: int) -> float:
    from threadline.core.executor import NodeThreads

    async def main() -> float:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(NodeThreads())

        async def calls() -> None:
            NodeThreads.track()
            it = iter(range(TOKENS))
            for _ in range(TOKENS):
                await loop.run_in_executor(None, next, it)

        out = float("inf")
        for _ in range(repeat):
            t0 = time.process_time()
            await asyncio.create_task(calls())
            out = min(out, time.process_time() - t0)
        return 1e6 * out / TOKENS

    from threadline.cli import run_loop

    return run_loop(main())


def child(pieces: list[str], repeat: int) -> int:
    print(json.dumps({name: round(piece(name, repeat), 3) for name in pieces}))
    return 0


def measure(src: str | None, pieces: list[str], repeat: int) -> dict[str, float]:
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
    out = subprocess.run([sys.executable, __file__, "--child", ",".join(pieces), "--repeat", str(repeat)],
                         env=env, cwd=str(HERE), capture_output=True, text=True, timeout=600, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--against", default=None, help="another checkout, measured in alternating processes")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--repeat", type=int, default=9, help="passes per piece; the least CPU counts (default 9)")
    p.add_argument("--only", default=",".join(PIECES))
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    cfg = p.parse_args(argv)
    if cfg.child:
        return child(cfg.child.split(","), cfg.repeat)
    pieces = [x.strip() for x in cfg.only.split(",") if x.strip()]
    sides = [("old", cfg.against), ("new", str(HERE.parent))] if cfg.against else [("this", str(HERE.parent))]
    rows: dict[str, dict[str, list[float]]] = {}
    for i in range(cfg.pairs if cfg.against else 1):
        for label, src in sides if i % 2 == 0 else sides[::-1]:
            got = measure(src, pieces, cfg.repeat)
            print(f"{label}: " + "  ".join(f"{k} {v:.2f} us" for k, v in got.items()), flush=True)
            for k, v in got.items():
                rows.setdefault(k, {}).setdefault(label, []).append(v)
    print("\n| piece | " + " | ".join(label for label, _ in sides) + (" | new/old |" if cfg.against else " |"))
    print("|---|" + "---:|" * (len(sides) + (1 if cfg.against else 0)))
    for k, by in rows.items():
        cells = [" / ".join(f"{v:.2f}" for v in by[label]) for label, _ in sides]
        ratio = f" {min(by['new']) / min(by['old']):.2f} |" if cfg.against else ""
        print(f"| {k} (us) | " + " | ".join(cells) + " |" + ratio)
    return 0


if __name__ == "__main__":
    sys.exit(main())
