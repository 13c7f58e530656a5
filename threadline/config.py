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
_SUPPORTED = {"graphs", "env", "dependencies", "store", "checkpointer", "http", "threadline", "auth", "webhooks", "ui",
              "ui_config"}
_TTL_KEYS = {"strategy", "sweep_interval_minutes", "default_ttl", "sweep_limit"}
# `http.disable_<family>`: the route families LangGraph's server lets a project turn off.
ROUTE_FAMILIES = ("assistants", "threads", "runs", "store", "meta", "mcp", "a2a", "webhooks", "ui")
_CORS_KEYS = {
    "allow_origins": list, "allow_methods": list, "allow_headers": list, "allow_credentials": bool,
    "allow_origin_regex": str, "expose_headers": list, "max_age": int,
}
# `webhooks.url`: LangGraph's webhook URL policy, plus ours (`allow_private_networks`).
_WEBHOOK_URL_KEYS: dict[str, type] = {"require_https": bool, "allowed_domains": list, "allowed_ports": list, "max_url_length": int,
                     "disable_loopback": bool, "allow_private_networks": bool}


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
class HeaderPatterns:
    """`http.configurable_headers` (or `logging_headers`): header names, `*` as a wildcard. An excluded
    header is never taken, even if included; with no `includes`, nothing is."""

    includes: tuple[str, ...] = ()
    excludes: tuple[str, ...] = ()

    @classmethod
    def parse(cls, raw: Any, where: str) -> HeaderPatterns:
        if not isinstance(raw, dict):
            raise ConfigError(f"{where} must be an object with 'includes' and/or 'excludes'")
        lists: dict[str, tuple[str, ...]] = {}
        for key in raw:
            if key not in ("includes", "include", "excludes", "exclude"):
                raise ConfigError(f"{where}.{key} is not a known key; use 'includes' and 'excludes'")
            value = raw[key] or []
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"{where}.{key} must be a list of header names or patterns")
            # LangGraph's docs say `include`/`exclude`, its schema `includes`/`excludes`: both work there.
            lists[key.rstrip("s") + "s"] = tuple(value)
        return cls(**lists)


@dataclass(frozen=True)
class HttpConfig:
    """The `http` section: the project's own app, CORS, run headers, route families and the URL prefix."""

    app: str | None = None
    cors: dict[str, Any] | None = None
    configurable_headers: HeaderPatterns | None = None
    logging_headers: HeaderPatterns | None = None
    disabled: frozenset[str] = frozenset()
    mount_prefix: str = ""
    enable_custom_route_auth: bool = False
    middleware_order: str = "middleware_first"

    @classmethod
    def parse(cls, raw: Any, path: Path, unsupported: list[str]) -> HttpConfig:
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: 'http' must be an object")
        given: dict[str, Any] = {}
        disabled = set()
        for key, value in raw.items():
            where = f"{path}: http.{key}"
            if key.startswith("disable_") and key[len("disable_"):] in ROUTE_FAMILIES:
                if not isinstance(value, bool):
                    raise ConfigError(f"{where} must be true or false, got {value!r}")
                if value:
                    disabled.add(key[len("disable_"):])
            elif key == "app":
                if not isinstance(value, str) or ":" not in value:
                    raise ConfigError(f"{where} must be 'path.py:attr' or 'module:attr', got {value!r}")
                given["app"] = value
            elif key == "cors":
                given["cors"] = None if value is None else _cors(value, where, unsupported)
            elif key in ("configurable_headers", "logging_headers"):
                given[key] = None if value is None else HeaderPatterns.parse(value, where)
            elif key == "mount_prefix":
                if not isinstance(value, str) or (value and not value.startswith("/")):
                    raise ConfigError(f"{where} must be a path starting with '/', got {value!r}")
                given["mount_prefix"] = value.rstrip("/")
            elif key == "enable_custom_route_auth":
                if not isinstance(value, bool):
                    raise ConfigError(f"{where} must be true or false, got {value!r}")
                given[key] = value
            elif key == "middleware_order":
                if value not in ("auth_first", "middleware_first"):
                    raise ConfigError(f"{where} must be 'auth_first' or 'middleware_first', got {value!r}")
                given[key] = value
            else:
                unsupported.append(f"http.{key}")
        return cls(disabled=frozenset(disabled), **given)


def _cors(raw: Any, where: str, unsupported: list[str]) -> dict[str, Any]:
    """`http.cors`, as keyword arguments of Starlette's CORSMiddleware (which LangGraph's server uses too)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be an object")
    cors: dict[str, Any] = {}
    for key, value in raw.items():
        kind = _CORS_KEYS.get(key)
        if kind is None:
            unsupported.append(f"http.cors.{key}")
        elif value is None:
            continue
        elif kind is list and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise ConfigError(f"{where}.{key} must be a list of strings, got {value!r}")
        elif kind is not list and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
            raise ConfigError(f"{where}.{key} must be a {kind.__name__}, got {value!r}")
        else:
            cors[key] = value
    return cors


@dataclass(frozen=True)
class AuthConfig:
    """The `auth` section: the project's `langgraph_sdk.Auth` (`path`), and the security schemes
    `/openapi.json` and `/docs` show (`openapi`). `disable_studio_auth` is accepted: Threadline has no
    Studio bypass, so every request goes through the project's handler either way."""

    path: str
    openapi: dict[str, Any] | None = None
    disable_studio_auth: bool = False

    @classmethod
    def parse(cls, raw: Any, path: Path, unsupported: list[str]) -> AuthConfig | None:
        if raw is None:
            return None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: 'auth' must be an object with 'path'")
        spec = raw.get("path")
        if not isinstance(spec, str) or ":" not in spec:
            raise ConfigError(f"{path}: auth.path must be 'path.py:attr' or 'module:attr', got {spec!r}")
        openapi = raw.get("openapi")
        if openapi is not None and not (isinstance(openapi, dict) and set(openapi) <= {"securitySchemes", "security"}
                                        and isinstance(openapi.get("securitySchemes", {}), dict)
                                        and isinstance(openapi.get("security", []), list)):
            raise ConfigError(f"{path}: auth.openapi must be an object with 'securitySchemes' (an object) "
                              "and/or 'security' (a list)")
        studio = raw.get("disable_studio_auth", False)
        if not isinstance(studio, bool):
            raise ConfigError(f"{path}: auth.disable_studio_auth must be true or false, got {studio!r}")
        unsupported += [f"auth.{k}" for k in raw if k not in ("path", "openapi", "disable_studio_auth")]
        return cls(path=spec, openapi=openapi, disable_studio_auth=studio)


@dataclass(frozen=True)
class WebhookPolicy:
    """`webhooks.url`: which webhook URLs a run may give. `allow_private_networks` None means: refused once
    authentication is on (a client must not make the server call into its own network), allowed without."""

    require_https: bool = False
    allowed_domains: tuple[str, ...] = ()
    allowed_ports: tuple[int, ...] = ()
    max_url_length: int = 2048
    disable_loopback: bool = False
    allow_private_networks: bool | None = None

    @classmethod
    def parse(cls, raw: Any, path: Path, unsupported: list[str]) -> WebhookPolicy:
        if raw is None:
            return cls()
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: 'webhooks' must be an object")
        unsupported += [f"webhooks.{k}" for k in raw if k != "url"]
        url = raw.get("url") or {}
        if not isinstance(url, dict):
            raise ConfigError(f"{path}: webhooks.url must be an object")
        given: dict[str, Any] = {}
        for key, value in url.items():
            kind = _WEBHOOK_URL_KEYS.get(key)
            where = f"{path}: webhooks.url.{key}"
            if kind is None:
                unsupported.append(f"webhooks.url.{key}")
            elif kind is list:
                item = int if key == "allowed_ports" else str
                if not isinstance(value, list) or not all(isinstance(v, item) and not isinstance(v, bool)
                                                          for v in value):
                    raise ConfigError(f"{where} must be a list of {item.__name__}s, got {value!r}")
                given[key] = tuple(v.lower() if isinstance(v, str) else v for v in value)
            elif not isinstance(value, kind) or (kind is int and (isinstance(value, bool) or (isinstance(value, int) and value <= 0))):
                raise ConfigError(f"{where} must be a {'positive int' if kind is int else 'true or false'}, "
                                  f"got {value!r}")
            else:
                given[key] = value
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
    http: HttpConfig = field(default_factory=HttpConfig)
    auth: AuthConfig | None = None
    webhooks: WebhookPolicy = field(default_factory=WebhookPolicy)
    default_agent: str | None = None
    #: `ui`: generative UI components, a graph id → its .tsx/.jsx file (relative to the config's folder).
    ui: dict[str, str] = field(default_factory=dict)
    #: `ui_config`: the bundler's options (`shared`: packages the page provides, left out of the bundle).
    ui_config: dict[str, Any] = field(default_factory=dict)
    unsupported: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)

    @property
    def root(self) -> Path:
        return self.path.parent

    @property
    def http_app(self) -> str | None:
        return self.http.app


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
    for section, keys, allowed in (
        ("store", store, {"index", "ttl"}),
        ("checkpointer", checkpointer, {"ttl"}),
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
        http=HttpConfig.parse(raw.get("http") or {}, path, unsupported),
        auth=AuthConfig.parse(raw.get("auth"), path, unsupported),
        webhooks=WebhookPolicy.parse(raw.get("webhooks"), path, unsupported),
        default_agent=default,
        ui=_ui(raw.get("ui"), path),
        ui_config=_ui_config(raw.get("ui_config"), path),
        unsupported=unsupported,
        ignored=ignored,
    )


def _ui(raw: Any, path: Path) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
        raise ConfigError(f"{path}: 'ui' must map graph ids to component files ('./ui.tsx'), got {raw!r}")
    return dict(raw)


def _ui_config(raw: Any, path: Path) -> dict[str, Any]:
    if raw is None:
        return {}
    shared = raw.get("shared", []) if isinstance(raw, dict) else None
    if not isinstance(shared, list) or not all(isinstance(s, str) for s in shared):
        raise ConfigError(f"{path}: 'ui_config' must be {{\"shared\": [package names]}}, got {raw!r}")
    return dict(raw)


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
