"""Generative UI: langgraph.json's `ui` components bundled at startup, as `langgraph dev` bundles them.

The bundler is LangGraph's own, `@langchain/langgraph-ui` from the npm registry (esbuild underneath), run as a
program (`settings.ui_bundler`, by default through `npx`). It reads the `ui` map from `LANGGRAPH_UI` and
`ui_config` from `LANGGRAPH_UI_CONFIG`, and writes one folder of assets per graph (`public/<graph>/…`) and an
index of them (`schemas.json`). Threadline serves those at LangGraph's paths (`api/generative_ui.py`).

Under `threadline dev` the bundler also runs in its `watch` mode beside the server, as `langgraph dev` runs it: a
change to a component's source is rebundled into the same folder, and the next request serves it (`Bundle` reads
`schemas.json` again when the file changes). A rebundling that fails keeps the last good files and logs why."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shlex
import signal
from collections.abc import AsyncIterator
from pathlib import Path

from threadline.config import ProjectConfig
from threadline.errors import ConfigError

log = logging.getLogger("threadline.ui")

#: A bound on one bundling: `npx` may first fetch the bundler and esbuild from the registry.
BUNDLE_SECONDS = 300


class Bundle:
    """A bundle in a folder: each graph's asset files, by graph id, as the bundler's `schemas.json` lists them
    (read again when the bundler rewrites it: under `watch`, after each rebundling)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._read_at: int | None = None
        self._assets: dict[str, list[str]] = {}
        self.assets  # noqa: B018 - a first read: a bundle with no readable index is a startup error

    @property
    def assets(self) -> dict[str, list[str]]:
        index = self.folder / "schemas.json"
        try:
            changed = index.stat().st_mtime_ns
            if changed != self._read_at:
                schemas = json.loads(index.read_text())
                # `watch` appends a graph's files to its list at each rebundling: each name once, in order.
                self._assets = {graph: list(dict.fromkeys(str(a) for a in entry.get("assets", [])))
                                for graph, entry in schemas.items()}
                self._read_at = changed
        except (OSError, ValueError, AttributeError) as exc:
            if self._read_at is None:
                raise ConfigError(f"the UI bundler wrote no readable schemas.json in {self.folder}: {exc}") from exc
            # caught mid-write by a rebundling: the last index read stands until the next request
        return self._assets

    def asset(self, graph_id: str, name: str) -> Path | None:
        """The file of one of a graph's assets, or None: only the names the bundler listed are served."""
        if name not in self.assets.get(graph_id, []):
            return None
        return self.folder / "public" / graph_id / name


def _argv(command: str, mode: str, folder: Path) -> list[str]:
    return [*shlex.split(command), mode, "-o", str(folder)]


async def _start(project: ProjectConfig, argv: list[str]) -> asyncio.subprocess.Process:
    """The bundler in the project's folder, its output (esbuild's errors) on one pipe, in its own process group
    (stopping `npx` stops what it started too)."""
    env = {**os.environ, "LANGGRAPH_UI": json.dumps(project.ui), "LANGGRAPH_UI_CONFIG": json.dumps(project.ui_config)}
    return await asyncio.create_subprocess_exec(
        *argv, cwd=project.root, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT, start_new_session=True)


def _kill(process: asyncio.subprocess.Process, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)


async def bundle(project: ProjectConfig, command: str, folder: Path) -> Bundle | None:
    """Bundle the project's `ui` components into `folder`; None when there are none or `command` is `off`.
    A bundler that is missing, fails or overruns `BUNDLE_SECONDS` stops startup with its message (as
    `langgraph dev` stops when its bundler does)."""
    if not project.ui or command.strip().lower() == "off":
        return None
    argv = _argv(command, "build", folder)
    log.info("bundling the generative UI of %s: %s", ", ".join(sorted(project.ui)), shlex.join(argv))
    try:
        process = await _start(project, argv)
    except OSError as exc:
        raise ConfigError(f"cannot run the UI bundler ({exc}); langgraph.json has 'ui', which needs Node.js "
                          "(npx) or --ui-bundler naming the bundler (off: serve no generative UI)") from exc
    try:
        output, _ = await asyncio.wait_for(process.communicate(), BUNDLE_SECONDS)
    except TimeoutError:
        _kill(process, signal.SIGKILL)
        await process.wait()
        raise ConfigError(f"the UI bundler took longer than {BUNDLE_SECONDS} s: {shlex.join(argv)}") from None
    if process.returncode != 0:
        tail = output.decode(errors="replace")[-3000:]
        raise ConfigError(f"the UI bundler failed (exit {process.returncode}): {shlex.join(argv)}\n{tail}")
    found = Bundle(folder)
    log.info("generative UI bundled: %s", ", ".join(f"{g} ({len(a)} files)" for g, a in sorted(found.assets.items())))
    return found


@contextlib.asynccontextmanager
async def watching(project: ProjectConfig, command: str, folder: Path) -> AsyncIterator[None]:
    """The bundler's `watch` mode on an already bundled `folder`, for as long as the context lasts: each change
    to a component's source (or what it imports) is rebundled there. Its output (esbuild's errors) is logged."""
    argv = _argv(command, "watch", folder)
    try:
        process = await _start(project, argv)
    except OSError as exc:  # it bundled a moment ago: a watcher that cannot start costs the rebundling only
        log.warning("cannot watch the generative UI's sources (%s): a change needs a restart", exc)
        yield
        return
    log.info("watching the generative UI's sources: %s", shlex.join(argv))
    relay = asyncio.create_task(_relay(process))
    try:
        yield
    finally:
        _kill(process, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), 5)
        except TimeoutError:
            _kill(process, signal.SIGKILL)
            await process.wait()
        relay.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await relay


async def _relay(process: asyncio.subprocess.Process) -> None:
    assert process.stdout is not None
    async for line in process.stdout:
        if text := line.decode(errors="replace").rstrip():
            log.info("ui bundler: %s", text)
    if await process.wait() not in (0, -signal.SIGTERM):
        log.warning("the generative UI's watcher stopped (exit %s): a change needs a restart", process.returncode)
