"""The project configuration, in LangGraph's `langgraph.json` format.

Each section is a pydantic model mirroring LangGraph's CLI schema (`langgraph_cli.schemas.Config`): a field per
key, typed as LangGraph's server reads it. A wrong value stops startup with one message naming the key; a key
Threadline does not know is kept (`extra="allow"`) and reported at startup as having no effect; a key that only
matters to `langgraph build` is accepted and reported as ignored. `null` means absent, except where LangGraph
gives it a meaning of its own (`checkpointer.serde`). Images built by `langgraph build` carry the sections in
environment variables (`LANGSERVE_GRAPHS`, `LANGGRAPH_HTTP`, ...: `ENV_SECTIONS`); they win over the file.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from threadline.errors import ConfigError

log = logging.getLogger("threadline.config")

EXAMPLE_CONFIG = Path(__file__).parent / "example" / "langgraph.json"

# Keys that only matter when building a container image: accepted and reported as ignored.
BUILD_ONLY = ("python_version", "node_version", "pip_config_file", "pip_installer", "dockerfile_lines",
              "image_distro", "base_image", "keep_pkg_tools", "api_version", "source", "_INTERNAL_docker_tag")
# Keys parsed into typed settings whose behaviour is not in Threadline yet: still reported at startup.
NOT_YET_HONOURED = ("priority",)
# `http.disable_<family>`: the route families LangGraph's server lets a project turn off.
ROUTE_FAMILIES = ("assistants", "threads", "runs", "store", "meta", "mcp", "a2a", "webhooks", "ui")
# The environment variables LangGraph's server reads its configuration from, and the section each replaces.
ENV_SECTIONS = {
    "LANGSERVE_GRAPHS": "graphs", "LANGGRAPH_AUTH": "auth", "LANGGRAPH_HTTP": "http", "LANGGRAPH_STORE": "store",
    "LANGGRAPH_CHECKPOINTER": "checkpointer", "LANGGRAPH_UI": "ui", "LANGGRAPH_UI_CONFIG": "ui_config",
    "LANGGRAPH_ENCRYPTION": "encryption", "LANGGRAPH_WEBHOOKS": "webhooks",
}
# `webhooks.allowed_fields`: the webhook payload's keys a project may keep (as LangGraph's server lists them).
WEBHOOK_FIELDS = ("run_id", "thread_id", "assistant_id", "created_at", "updated_at", "metadata", "kwargs",
                  "multitask_strategy", "status", "run_started_at", "run_ended_at", "webhook_sent_at", "values",
                  "error")
# `${{ env.VAR }}` in `webhooks.headers`: resolved once, at startup.
_TEMPLATE = re.compile(r"\$\{\{\s*([^}]+?)\s*\}\}")


class _Said(ValueError):
    """A message that names its key itself (it is not prefixed with the key's path)."""


def _expect(phrase: str, ok: Callable[[Any], bool]) -> BeforeValidator:
    def check(value: Any) -> Any:
        if not ok(value):
            raise ValueError(f"must be {phrase}, got {value!r}")
        return value
    return BeforeValidator(check)


def _strings(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


Flag = Annotated[bool, _expect("true or false", lambda v: isinstance(v, bool))]
Text = Annotated[str, _expect("a string", lambda v: isinstance(v, str))]
Strings = Annotated[tuple[str, ...], _expect("a list of strings", _strings)]
Int = Annotated[int, _expect("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool))]
PositiveInt = Annotated[int, _expect("a positive int", lambda v: _number(v) and float(v).is_integer() and v > 0)]
PositiveNumber = Annotated[float, _expect("a positive number", lambda v: _number(v) and v > 0)]
# `ui_config`: the bundler's options; `shared`, the packages the page provides (left out of the bundle).
UiConfig = Annotated[dict[str, Any], _expect('{"shared": [package names]}',
                                             lambda v: isinstance(v, dict) and _strings(v.get("shared", [])))]
ImportPath = Annotated[str, _expect("'path.py:attr' or 'module:attr'", lambda v: isinstance(v, str) and ":" in v)]


class Section(BaseModel):
    """An object of langgraph.json. Unknown keys are kept in `model_extra` (reported, never an error)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    keeps_null: ClassVar[bool] = False  # else a `null` value means the key is absent

    @model_validator(mode="before")
    @classmethod
    def _an_object(cls, raw: Any) -> Any:
        if isinstance(raw, cls):  # built in Python (`WebhooksConfig(url=WebhookPolicy(...))`): already checked
            return raw
        if not isinstance(raw, dict):
            raise ValueError(f"must be an object, got {raw!r}")
        return raw if cls.keeps_null else {k: v for k, v in raw.items() if v is not None}

    def declared(self) -> dict[str, Any]:
        """The declared keys and their values (unknown keys left out), as plain data."""
        return self.model_dump(include=set(type(self).model_fields))


def unknown_keys(section: BaseModel, prefix: str = "") -> Iterator[str]:
    """The keys of `section` (and of the sections inside it) that no field declares, as dotted paths."""
    for key in section.model_extra or {}:
        yield f"{prefix}{key}"
    for name in type(section).model_fields:
        value = getattr(section, name)
        if isinstance(value, BaseModel):
            yield from unknown_keys(value, f"{prefix}{name}.")


# --- checkpointer ----------------------------------------------------------------------------------------


def _delete_only(value: Any) -> Any:
    if value != "delete":
        raise _Said(f"checkpointer.ttl.strategy {value!r} is not supported; use 'delete'")
    return value


class CheckpointerTTL(Section):
    """`checkpointer.ttl`: expired threads are deleted with their checkpoints and runs.

    A thread expires `ttl` minutes after its last update; `default_ttl` is stamped on threads created
    while it is configured (a thread's own `ttl` from the API wins), so threads created before keep none.
    """

    strategy: Annotated[str, BeforeValidator(_delete_only)] = "delete"
    sweep_interval_minutes: PositiveNumber = 5.0
    default_ttl: PositiveNumber | None = None
    sweep_limit: PositiveInt = 1000


ModulePaths = Annotated[
    tuple[tuple[str, ...], ...] | bool | None,
    _expect("true, null or a list of module paths ([\"my_agent.models\", \"MyState\"])",
            lambda v: v is None or isinstance(v, bool) or (isinstance(v, list) and all(_strings(p) for p in v))),
]


class SerdeConfig(Section):
    """`checkpointer.serde`: how LangGraph's serializer reads checkpoints back, as LangGraph's server sets it.

    `allowed_json_modules`: the modules custom objects may be rebuilt from out of JSON (true: any; absent or
    null: none). `allowed_msgpack_modules`: the types beyond LangGraph's safe ones that msgpack may rebuild
    (absent or true: any, with a warning; null: only the safe ones). `pickle_fallback`: values msgpack cannot
    encode are pickled, and pickled values are read back (LangGraph's server: on unless set false).
    """

    keeps_null: ClassVar[bool] = True
    allowed_json_modules: ModulePaths = None
    allowed_msgpack_modules: ModulePaths = True
    pickle_fallback: Flag = True

    def given(self) -> dict[str, Any]:
        """The settings for LangGraph's serializer: those given, and `pickle_fallback` (on unless set false)."""
        return {name: getattr(self, name) for name in type(self).model_fields
                if name in self.model_fields_set or name == "pickle_fallback"}


class CheckpointerConfig(Section):
    """`checkpointer`. `path` is a project's own saver factory (an async context manager yielding a
    `BaseCheckpointSaver`), parsed here; `NOT_YET_HONOURED` says whether the storage layer uses it."""

    path: ImportPath | None = None
    ttl: CheckpointerTTL | None = None
    serde: SerdeConfig | None = None


class StoreConfig(Section):
    """`store`: `index` (semantic search) and `ttl`, passed on to LangGraph's store as LangGraph reads them."""

    index: dict[str, Any] | None = None
    ttl: dict[str, Any] | None = None


# --- http ------------------------------------------------------------------------------------------------


class HeaderPatterns(Section):
    """`http.configurable_headers` (or `logging_headers`): header names, `*` as a wildcard. An excluded
    header is never taken, even if included; with no `includes`, nothing is. LangGraph's docs say
    `include`/`exclude`, its schema `includes`/`excludes`: both work there, and here."""

    includes: Annotated[tuple[str, ...], _expect("a list of header names or patterns", _strings)] = Field(
        default=(), validation_alias=AliasChoices("includes", "include"))
    excludes: Annotated[tuple[str, ...], _expect("a list of header names or patterns", _strings)] = Field(
        default=(), validation_alias=AliasChoices("excludes", "exclude"))

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, raw: Any) -> Any:
        if not isinstance(raw, dict):
            raise ValueError("must be an object with 'includes' and/or 'excludes'")
        for key in raw:
            if key not in ("includes", "include", "excludes", "exclude"):
                raise ValueError(f"has {key!r}, not a known key; use 'includes' and 'excludes'")
        return {k: [] if v is None else v for k, v in raw.items()}


class CorsConfig(Section):
    """`http.cors`: keyword arguments of Starlette's CORSMiddleware (which LangGraph's server uses too)."""

    allow_origins: Strings | None = None
    allow_methods: Strings | None = None
    allow_headers: Strings | None = None
    allow_credentials: Flag | None = None
    allow_origin_regex: Text | None = None
    expose_headers: Strings | None = None
    max_age: Int | None = None

    def options(self) -> dict[str, Any]:
        """The keys given, as CORSMiddleware takes them."""
        return {name: list(value) if isinstance(value, tuple) else value
                for name in type(self).model_fields if (value := getattr(self, name)) is not None}


def _mount_prefix(value: Any) -> Any:
    if not isinstance(value, str) or (value and not value.startswith("/")):
        raise ValueError(f"must be a path starting with '/', got {value!r}")
    return value.rstrip("/")


def _middleware_order(value: Any) -> Any:
    if value not in ("auth_first", "middleware_first"):
        raise ValueError(f"must be 'auth_first' or 'middleware_first', got {value!r}")
    return value


class HttpConfig(Section):
    """The `http` section: the project's own app, CORS, run headers, route families and the URL prefix."""

    app: ImportPath | None = None
    cors: CorsConfig | None = None
    configurable_headers: HeaderPatterns | None = None
    logging_headers: HeaderPatterns | None = None
    mount_prefix: Annotated[str, BeforeValidator(_mount_prefix)] = ""
    enable_custom_route_auth: Flag = False
    middleware_order: Annotated[str, BeforeValidator(_middleware_order)] = "middleware_first"
    disable_assistants: Flag = False
    disable_threads: Flag = False
    disable_runs: Flag = False
    disable_store: Flag = False
    disable_meta: Flag = False
    disable_mcp: Flag = False
    disable_a2a: Flag = False
    disable_webhooks: Flag = False
    disable_ui: Flag = False

    @property
    def disabled(self) -> frozenset[str]:
        """The route families turned off (`disable_<family>: true`)."""
        return frozenset(f for f in ROUTE_FAMILIES if getattr(self, f"disable_{f}"))


# --- auth, encryption ------------------------------------------------------------------------------------


def _security(value: Any) -> Any:
    if not (isinstance(value, dict) and set(value) <= {"securitySchemes", "security", "paths"}
            and isinstance(value.get("securitySchemes", {}), dict) and isinstance(value.get("security", []), list)):
        raise ValueError("must be an object with 'securitySchemes' (an object) and/or 'security' (a list)")
    return value


class AuthCache(Section):
    """`auth.cache`: the `@auth.authenticate` handler's answers kept per value of the `cache_keys` headers, for
    `ttl_seconds`, at most `max_size` of them (least recently used go first); LangGraph's defaults 60 s, 1000.
    A request that shows none of the headers is never answered from the cache."""

    cache_keys: Strings = ()
    ttl_seconds: PositiveNumber = 60.0
    max_size: PositiveInt = 1000


class AuthConfig(Section):
    """The `auth` section: the project's `langgraph_sdk.Auth` (`path`), and the security schemes
    `/openapi.json` and `/docs` show (`openapi`). `disable_studio_auth` is accepted: Threadline has no
    Studio bypass, so every request goes through the project's handler either way."""

    path: ImportPath
    openapi: Annotated[dict[str, Any], BeforeValidator(_security)] | None = None
    disable_studio_auth: Flag = False
    cache: AuthCache | None = None


class EncryptionConfig(Section):
    """`encryption`: `path` names the project's `langgraph_sdk.encryption.Encryption` instance (checked when
    the storage layer loads it)."""

    path: Text


class PriorityConfig(Section):
    """`priority`: `path` names the project's `Priority` instance (parsed; not honoured yet)."""

    path: Text


# --- webhooks --------------------------------------------------------------------------------------------


def _ports(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


class WebhookPolicy(Section):
    """`webhooks.url`: which webhook URLs a run may give. `allow_private_networks` None means: refused once
    authentication is on (a client must not make the server call into its own network), allowed without."""

    require_https: Flag = False
    allowed_domains: Annotated[tuple[str, ...], _expect("a list of strs", _strings),
                               AfterValidator(lambda v: tuple(d.lower() for d in v))] = ()
    allowed_ports: Annotated[tuple[int, ...], _expect("a list of ints", _ports)] = ()
    max_url_length: PositiveInt = 2048
    disable_loopback: Flag = False
    allow_private_networks: Flag | None = None


class WebhooksConfig(Section):
    """The `webhooks` section: the URL policy, and the headers every webhook POST carries. A header value may
    hold `${{ env.VAR }}`, filled in at startup from the environment; `VAR` must start with `env_prefix`
    (LangGraph's default `LG_WEBHOOK_`; empty: any variable), so a header cannot leak other secrets.
    `allowed_fields`: the payload keeps only these keys (absent or empty: all of them)."""

    keeps_null: ClassVar[bool] = True
    url: WebhookPolicy = Field(default_factory=WebhookPolicy)
    env_prefix: Text = "LG_WEBHOOK_"
    headers: Annotated[dict[str, str], _expect("an object of header names to strings",
                                               lambda v: isinstance(v, dict) and _strings(list(v.values())))] = {}
    allowed_fields: Annotated[tuple[str, ...] | None, _expect(
        f"null or a list of {', '.join(WEBHOOK_FIELDS)}",
        lambda v: v is None or (_strings(v) and set(v) <= set(WEBHOOK_FIELDS)))] = None

    @model_validator(mode="before")
    @classmethod
    def _nulls(cls, raw: Any) -> Any:
        if not isinstance(raw, dict):
            return raw
        return {**raw, **{k: {} for k in ("url", "headers") if k in raw and raw[k] is None}}

    def resolved(self, environ: Mapping[str, str]) -> WebhooksConfig:
        """These settings with every `${{ env.VAR }}` in `headers` replaced by its value."""
        def value(match: re.Match[str]) -> str:
            expression = match.group(1)
            name = expression.removeprefix("env.")
            if not expression.startswith("env.") or not name or "." in name:
                raise ConfigError(f"webhooks.headers: {match.group(0)!r} is not an environment reference; "
                                  f"write ${{{{ env.{self.env_prefix}NAME }}}}")
            if not name.startswith(self.env_prefix):
                raise ConfigError(f"webhooks.headers: the environment variable {name} does not start with "
                                  f"webhooks.env_prefix {self.env_prefix!r}")
            if name not in environ:
                raise ConfigError(f"webhooks.headers: the environment variable {name} is not set")
            return environ[name]

        return self.model_copy(update={"headers": {k: _TEMPLATE.sub(value, v) for k, v in self.headers.items()}})


# --- the whole file --------------------------------------------------------------------------------------


def _graphs(value: Any) -> Any:
    if not isinstance(value, dict) or not value:
        raise _Said("'graphs' must map graph ids to 'path.py:attr' or 'module:attr'")
    graphs = {}
    for graph_id, spec in value.items():
        if isinstance(spec, dict):  # {"path": ..., "description": ...}
            spec = spec.get("path")
        if not isinstance(spec, str) or ":" not in spec:
            raise _Said(f"graph {graph_id!r} must be 'path.py:attr' or 'module:attr', got {spec!r}")
        graphs[graph_id] = spec
    return graphs


class ThreadlineSection(Section):
    """The `threadline` section: settings of ours that belong to the project (`default_agent`)."""

    default_agent: Text | None = None


class LanggraphJson(Section):
    """The whole of a langgraph.json, as LangGraph's CLI schema declares it."""

    graphs: Annotated[dict[str, str], BeforeValidator(_graphs)]
    env: Annotated[dict[str, Any] | str, _expect("a path to a .env file or a mapping",
                                                 lambda v: isinstance(v, (dict, str)))] | None = None
    dependencies: Annotated[list[str], _expect("a list of folders ('.', './lib') or package names", _strings)] = []
    store: StoreConfig = Field(default_factory=StoreConfig)
    checkpointer: CheckpointerConfig = Field(default_factory=CheckpointerConfig)
    http: HttpConfig = Field(default_factory=HttpConfig)
    auth: AuthConfig | None = None
    encryption: EncryptionConfig | None = None
    priority: PriorityConfig | None = None
    webhooks: WebhooksConfig = Field(default_factory=WebhooksConfig)
    ui: dict[str, str] | None = None
    ui_config: UiConfig | None = None
    threadline: ThreadlineSection = Field(default_factory=ThreadlineSection)
    build: dict[str, Any] = {}  # the BUILD_ONLY keys given, moved here by `_build_keys`

    @model_validator(mode="before")
    @classmethod
    def _build_keys(cls, raw: Any) -> Any:
        if not isinstance(raw, dict):
            return raw
        kept = {k: v for k, v in raw.items() if k not in BUILD_ONLY and k != "build"}
        return {**kept, "graphs": raw.get("graphs") or {}, "build": {k: v for k, v in raw.items() if k in BUILD_ONLY}}


@dataclass(frozen=True)
class ProjectConfig:
    """A parsed langgraph.json: which graphs to serve and how."""

    path: Path
    graphs: dict[str, str]
    env: dict[str, str] = field(default_factory=dict)
    dependencies: list[Path] = field(default_factory=list)
    #: `dependencies` entries that name packages (`"langchain-openai"`, `"humanize>=4"`) rather than folders.
    requirements: list[str] = field(default_factory=list)
    store: StoreConfig = field(default_factory=StoreConfig)
    checkpointer: CheckpointerConfig = field(default_factory=CheckpointerConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    auth: AuthConfig | None = None
    #: `encryption.path`: the project's `Encryption` instance, for the storage layer to apply.
    encryption: EncryptionConfig | None = None
    webhooks: WebhooksConfig = field(default_factory=WebhooksConfig)
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

    @property
    def store_index(self) -> dict[str, Any] | None:
        return self.store.index

    @property
    def store_ttl(self) -> dict[str, Any] | None:
        return self.store.ttl

    @property
    def checkpointer_ttl(self) -> CheckpointerTTL | None:
        return self.checkpointer.ttl

    @property
    def checkpointer_path(self) -> str | None:
        """`checkpointer.path`: the project's saver factory (`module:attr`), for the storage layer to open."""
        return self.checkpointer.path

    @property
    def serde(self) -> SerdeConfig | None:
        return self.checkpointer.serde


def find_config(explicit: str | None, cwd: Path | None = None, environ: Mapping[str, str] | None = None) -> Path:
    """The config to serve: the one given, ./langgraph.json, or the bundled example. With no file and
    `LANGSERVE_GRAPHS` set (an image built by `langgraph build`), ./langgraph.json though it does not exist:
    the environment holds the configuration, relative paths are read from the working directory."""
    from_env = bool((os.environ if environ is None else environ).get("LANGSERVE_GRAPHS"))
    if explicit:
        path = Path(explicit)
        if not path.is_file() and not from_env:
            raise ConfigError(f"config file not found: {explicit}")
        return path.resolve()
    local = ((cwd or Path.cwd()) / "langgraph.json").resolve()
    if local.is_file() or from_env:
        return local
    return EXAMPLE_CONFIG


def load_config(path: Path, environ: Mapping[str, str] | None = None) -> ProjectConfig:
    """`path`, with the sections the environment gives (`ENV_SECTIONS`) in place of the file's."""
    environ = os.environ if environ is None else environ
    raw = _read(path, environ)
    try:
        parsed = LanggraphJson.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {_message(exc)}") from None
    if parsed.threadline.default_agent not in (None, *parsed.graphs):
        raise ConfigError(f"{path}: threadline.default_agent {parsed.threadline.default_agent!r} is not one of "
                          f"the graphs {sorted(parsed.graphs)}")
    env = _load_env(parsed.env, path.parent)
    try:  # the project's env holds a webhook secret too, as it does in LangGraph's image
        webhooks = parsed.webhooks.resolved({**env, **environ})
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc.message}") from None
    deps = parsed.dependencies
    return ProjectConfig(
        path=path,
        graphs=parsed.graphs,
        env=env,
        dependencies=[(path.parent / d).resolve() for d in deps if _is_path(d, path.parent)],
        requirements=[d for d in deps if not _is_path(d, path.parent)],
        store=parsed.store,
        checkpointer=parsed.checkpointer,
        http=parsed.http,
        auth=parsed.auth,
        encryption=parsed.encryption,
        webhooks=webhooks,
        ui=dict(parsed.ui or {}),
        ui_config=dict(parsed.ui_config or {}),
        default_agent=parsed.threadline.default_agent,
        unsupported=_unsupported(parsed, raw),
        ignored=sorted(parsed.build),
    )


def _read(path: Path, environ: Mapping[str, str]) -> dict[str, Any]:
    from_env = {name: value for name, value in environ.items() if name in ENV_SECTIONS and value}
    if path.is_file() or "LANGSERVE_GRAPHS" not in from_env:
        try:
            raw = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"cannot read {path}: {exc}") from exc
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: 'graphs' must map graph ids to 'path.py:attr' or 'module:attr'")
    else:
        raw = {}
    for name, value in from_env.items():
        try:
            raw[ENV_SECTIONS[name]] = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{name} must hold JSON (its langgraph.json section): {exc}") from None
    ttl = environ.get("LANGGRAPH_THREAD_TTL")
    if ttl:  # LangGraph's server: minutes, or a `checkpointer.ttl` object; it wins over checkpointer.ttl
        try:
            parsed = json.loads(ttl) if ttl.strip().startswith("{") else {"default_ttl": float(ttl)}
        except ValueError as exc:
            raise ConfigError(f"LANGGRAPH_THREAD_TTL must be minutes or a JSON object: {exc}") from None
        raw["checkpointer"] = {**(raw.get("checkpointer") or {}), "ttl": parsed}
    if environ.get("MOUNT_PREFIX"):  # LangGraph's server reads the prefix from here too, over http.mount_prefix
        raw["http"] = {**(raw.get("http") or {}), "mount_prefix": environ["MOUNT_PREFIX"]}
    return raw


def _message(exc: ValidationError) -> str:
    """The first error, as `<key> <what it must be>, got <value>`: the key dotted, quoted at the top level."""
    error = exc.errors()[0]
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, _Said):
        return str(cause)
    keys = [str(part) for part in error["loc"] if isinstance(part, str)]
    where = f"'{keys[0]}'" if len(keys) == 1 else ".".join(keys)
    if cause is not None:
        return f"{where} {cause}"
    if error["type"] == "missing":
        return f"{where} is required"
    return f"{where}: {error['msg']}, got {error.get('input')!r}"


def _unsupported(parsed: LanggraphJson, raw: dict[str, Any]) -> list[str]:
    """Keys given that have no effect: the unknown ones, and the known ones not honoured yet."""
    given = list(unknown_keys(parsed))
    for dotted in NOT_YET_HONOURED:
        section, _, key = dotted.partition(".")
        value = raw.get(section)
        if value is not None and (not key or (isinstance(value, dict) and value.get(key) is not None)):
            given.append(dotted)
    return sorted(given)


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


def _load_env(env: dict[str, Any] | str | None, root: Path) -> dict[str, str]:
    if env is None:
        return {}
    if isinstance(env, dict):
        return {str(k): str(v) for k, v in env.items()}
    from dotenv import dotenv_values

    env_path = root / env
    if not env_path.is_file():
        log.warning("env file %s not found; continuing without it", env_path)
        return {}
    return {k: v for k, v in dotenv_values(env_path).items() if v is not None}
