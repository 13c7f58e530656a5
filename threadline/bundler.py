"""Generative UI: langgraph.json's `ui` components bundled at startup, as `langgraph dev` bundles them.

The bundler is LangGraph's own, `@langchain/langgraph-ui` from the npm registry (esbuild underneath), run as a
program (`settings.ui_bundler`, by default through `npx`). It reads the `ui` map from `LANGGRAPH_UI` and
`ui_config` from `LANGGRAPH_UI_CONFIG`, and writes one folder of assets per graph (`public/<graph>/…`) and an
index of them (`schemas.json`). Threadline serves those at LangGraph's paths (`api/generative_ui.py`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from threadline.config import ProjectConfig
from threadline.errors import ConfigError

log = logging.getLogger("threadline.ui")

#: A bound on one bundling: `npx` may first fetch the bundler and esbuild from the registry.
BUNDLE_SECONDS = 300


@dataclass(frozen=True)
class Bundle:
    """A finished bundle: each graph's asset files, by graph id."""

    folder: Path
    assets: dict[str, list[str]]

    def asset(self, graph_id: str, name: str) -> Path | None:
        """The file of one of a graph's assets, or None: only the names the bundler listed are served."""
        if name not in self.assets.get(graph_id, []):
            return None
        return self.folder / "public" / graph_id / name

    @classmethod
    def read(cls, folder: Path) -> Bundle:
        try:
            schemas = json.loads((folder / "schemas.json").read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"the UI bundler wrote no readable schemas.json in {folder}: {exc}") from exc
        return cls(folder, {graph: [str(a) for a in entry.get("assets", [])] for graph, entry in schemas.items()})


async def bundle(project: ProjectConfig, command: str, folder: Path) -> Bundle | None:
    """Bundle the project's `ui` components into `folder`; None when there are none or `command` is `off`.
    A bundler that is missing, fails or overruns `BUNDLE_SECONDS` stops startup with its message (as
    `langgraph dev` stops when its bundler does)."""
    if not project.ui or command.strip().lower() == "off":
        return None
    argv = [*shlex.split(command), "build", "-o", str(folder)]
    env = {**os.environ, "LANGGRAPH_UI": json.dumps(project.ui), "LANGGRAPH_UI_CONFIG": json.dumps(project.ui_config)}
    log.info("bundling the generative UI of %s: %s", ", ".join(sorted(project.ui)), shlex.join(argv))
    try:
        process = await asyncio.create_subprocess_exec(
            *argv, cwd=project.root, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT)
    except OSError as exc:
        raise ConfigError(f"cannot run the UI bundler ({exc}); langgraph.json has 'ui', which needs Node.js "
                          "(npx) or --ui-bundler naming the bundler (off: serve no generative UI)") from exc
    try:
        output, _ = await asyncio.wait_for(process.communicate(), BUNDLE_SECONDS)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        raise ConfigError(f"the UI bundler took longer than {BUNDLE_SECONDS} s: {shlex.join(argv)}") from None
    if process.returncode != 0:
        tail = output.decode(errors="replace")[-3000:]
        raise ConfigError(f"the UI bundler failed (exit {process.returncode}): {shlex.join(argv)}\n{tail}")
    found = Bundle.read(folder)
    log.info("generative UI bundled: %s", ", ".join(f"{g} ({len(a)} files)" for g, a in sorted(found.assets.items())))
    return found
