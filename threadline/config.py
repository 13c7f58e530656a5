"""The project configuration, in LangGraph's `langgraph.json` format."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from threadline.errors import ConfigError

log = logging.getLogger("threadline.config")

EXAMPLE_CONFIG = Path(__file__).parent / "example" / "langgraph.json"

# Keys that only matter when building a container image: accepted and reported as ignored.
_BUILD_ONLY = {
    "python_version", "node_version", "pip_config_file", "pip_installer", "dockerfile_lines",
    "image_distro", "base_image", "keep_pkg_tools", "api_version", "_INTERNAL_docker_tag",
}
_SUPPORTED = {"graphs", "env", "dependencies", "store", "checkpointer", "http", "threadline"}


@dataclass(frozen=True)
class ProjectConfig:
    """A parsed langgraph.json: which graphs to serve and how."""

    path: Path
    graphs: dict[str, str]
    env: dict[str, str] = field(default_factory=dict)
    dependencies: list[Path] = field(default_factory=list)
    store_index: dict[str, Any] | None = None
    store_ttl: dict[str, Any] | None = None
    checkpointer_ttl: dict[str, Any] | None = None
    http_app: str | None = None
    default_agent: str | None = None
    unsupported: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)

    @property
    def root(self) -> Path:
        return self.path.parent


def find_config(explicit: str | None, cwd: Path | None = None) -> Path:
    """The config to serve: the one given, ./langgraph.json, or the bundled example."""
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise ConfigError(f"config file not found: {explicit}")
        return path.resolve()
    local = (cwd or Path.cwd()) / "langgraph.json"
    return local.resolve() if local.is_file() else EXAMPLE_CONFIG


def load_config(path: Path) -> ProjectConfig:
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    if not isinstance(raw, dict) or not isinstance(raw.get("graphs"), dict) or not raw["graphs"]:
        raise ConfigError(f"{path}: 'graphs' must map graph ids to 'path.py:attr' or 'module:attr'")
    unsupported = sorted(k for k in raw if k not in _SUPPORTED and k not in _BUILD_ONLY)
    ignored = sorted(k for k in raw if k in _BUILD_ONLY)
    store = raw.get("store") or {}
    checkpointer = raw.get("checkpointer") or {}
    http = raw.get("http") or {}
    for section, keys, allowed in (
        ("store", store, {"index", "ttl"}),
        ("checkpointer", checkpointer, {"ttl"}),
        ("http", http, {"app"}),
    ):
        unsupported += [f"{section}.{k}" for k in keys if k not in allowed]
    graphs = {}
    for graph_id, spec in raw["graphs"].items():
        if isinstance(spec, dict):  # {"path": ..., "description": ...}
            spec = spec.get("path")
        if not isinstance(spec, str) or ":" not in spec:
            raise ConfigError(f"{path}: graph {graph_id!r} must be 'path.py:attr' or 'module:attr', got {spec!r}")
        graphs[graph_id] = spec
    default = (raw.get("threadline") or {}).get("default_agent")
    if default is not None and default not in graphs:
        raise ConfigError(f"{path}: threadline.default_agent {default!r} is not one of the graphs {sorted(graphs)}")
    return ProjectConfig(
        path=path,
        graphs=graphs,
        env=_load_env(raw.get("env"), path.parent),
        dependencies=[(path.parent / d).resolve() for d in raw.get("dependencies") or []],
        store_index=store.get("index"),
        store_ttl=store.get("ttl"),
        checkpointer_ttl=checkpointer.get("ttl"),
        http_app=http.get("app"),
        default_agent=default,
        unsupported=unsupported,
        ignored=ignored,
    )


def _load_env(env: Any, root: Path) -> dict[str, str]:
    if env is None:
        return {}
    if isinstance(env, dict):
        return {str(k): str(v) for k, v in env.items()}
    if isinstance(env, str):
        from dotenv import dotenv_values

        env_path = root / env
        if not env_path.is_file():
            log.warning("env file %s not found; continuing without it", env_path)
            return {}
        return {k: v for k, v in dotenv_values(env_path).items() if v is not None}
    raise ConfigError("'env' must be a path to a .env file or a mapping")
