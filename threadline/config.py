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
_TTL_KEYS = {"strategy", "sweep_interval_minutes", "default_ttl", "sweep_limit"}


@dataclass(frozen=True)
class CheckpointerTTL:
    """`checkpointer.ttl`: expired threads are deleted with their checkpoints and runs.

    A thread expires `ttl` minutes after its last update; `default_ttl` is stamped on threads created
    while it is configured (a thread's own `ttl` from the API wins), so threads created before keep none.
    """

    strategy: str = "delete"
    sweep_interval_minutes: float = 5.0
    default_ttl: float | None = None
    sweep_limit: int = 1000

    @classmethod
    def parse(cls, raw: Any, path: Path) -> CheckpointerTTL:
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: checkpointer.ttl must be an object")
        if raw.get("strategy", "delete") != "delete":
            raise ConfigError(f"{path}: checkpointer.ttl.strategy {raw['strategy']!r} is not supported; "
                              "use 'delete'")
        given: dict[str, Any] = {}
        for key, kind in (("sweep_interval_minutes", float), ("default_ttl", float), ("sweep_limit", int)):
            value = raw.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0 or (
                    kind is int and value != int(value)):
                raise ConfigError(f"{path}: checkpointer.ttl.{key} must be a positive number, got {value!r}")
            given[key] = kind(value)
        return cls(**given)


@dataclass(frozen=True)
class ProjectConfig:
    """A parsed langgraph.json: which graphs to serve and how."""

    path: Path
    graphs: dict[str, str]
    env: dict[str, str] = field(default_factory=dict)
    dependencies: list[Path] = field(default_factory=list)
    #: `dependencies` entries that name packages (`"langchain-openai"`, `"humanize>=4"`) rather than folders.
    requirements: list[str] = field(default_factory=list)
    store_index: dict[str, Any] | None = None
    store_ttl: dict[str, Any] | None = None
    checkpointer_ttl: CheckpointerTTL | None = None
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
    if isinstance(checkpointer.get("ttl"), dict):
        unsupported += [f"checkpointer.ttl.{k}" for k in checkpointer["ttl"] if k not in _TTL_KEYS]
    graphs = {}
    for graph_id, spec in raw["graphs"].items():
        if isinstance(spec, dict):  # {"path": ..., "description": ...}
            spec = spec.get("path")
        if not isinstance(spec, str) or ":" not in spec:
            raise ConfigError(f"{path}: graph {graph_id!r} must be 'path.py:attr' or 'module:attr', got {spec!r}")
        graphs[graph_id] = spec
    deps = raw.get("dependencies") or []
    if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
        raise ConfigError(f"{path}: 'dependencies' must be a list of folders ('.', './lib') or package names")
    default = (raw.get("threadline") or {}).get("default_agent")
    if default is not None and default not in graphs:
        raise ConfigError(f"{path}: threadline.default_agent {default!r} is not one of the graphs {sorted(graphs)}")
    return ProjectConfig(
        path=path,
        graphs=graphs,
        env=_load_env(raw.get("env"), path.parent),
        dependencies=[(path.parent / d).resolve() for d in deps if _is_path(d, path.parent)],
        requirements=[d for d in deps if not _is_path(d, path.parent)],
        store_index=store.get("index"),
        store_ttl=store.get("ttl"),
        checkpointer_ttl=None if checkpointer.get("ttl") is None else CheckpointerTTL.parse(checkpointer["ttl"], path),
        http_app=http.get("app"),
        default_agent=default,
        unsupported=unsupported,
        ignored=ignored,
    )


def _is_path(dependency: str, root: Path) -> bool:
    """As LangGraph's CLI reads `dependencies`: a local folder (`.`, `./lib`, `/abs`), else a pip requirement."""
    return dependency.startswith((".", "/")) or (root / dependency).is_dir()


def missing_requirements(requirements: list[str]) -> list[str]:
    """The `dependencies` package names not installed in this Python (versions are not checked)."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.requirements import InvalidRequirement, Requirement

    missing = []
    for spec in requirements:
        try:
            version(Requirement(spec).name)
        except (PackageNotFoundError, InvalidRequirement):
            missing.append(spec)
    return missing


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
