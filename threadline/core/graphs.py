"""Loading the graphs a project names, and describing them (schemas, drawings)."""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import operator
import sys
import types
import typing
import warnings
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

import typing_extensions
from langgraph.graph import StateGraph
from langgraph.pregel import Pregel
from langgraph.pregel.protocol import PregelProtocol

from threadline.config import ProjectConfig
from threadline.errors import ConfigError, NotFound
from threadline.loader import load_object

log = logging.getLogger("threadline.graphs")

#: A compiled graph, whatever its state, context, input and output types.
CompiledGraph = Pregel[Any, Any, Any, Any]


@dataclass
class GraphEntry:
    graph_id: str
    spec: str
    target: Any  # a compiled graph, or a factory (see `GraphRegistry.graph`)

    @property
    def is_factory(self) -> bool:
        return not isinstance(self.target, Pregel)


class GraphRegistry:
    """The project's graphs by id, loaded once at startup."""

    def __init__(self, entries: dict[str, GraphEntry], default_agent: str | None = None) -> None:
        self.entries = entries
        self.default_agent = default_agent

    @classmethod
    def load(cls, config: ProjectConfig) -> GraphRegistry:
        for dep in [config.root, *config.dependencies]:
            if str(dep) not in sys.path:
                sys.path.insert(0, str(dep))
        entries = {gid: GraphEntry(gid, spec, _named(_import(spec, config), gid))
                   for gid, spec in config.graphs.items()}
        return cls(entries, config.default_agent)

    def ids(self) -> list[str]:
        return list(self.entries)

    def entry(self, graph_id: str) -> GraphEntry:
        try:
            return self.entries[graph_id]
        except KeyError:
            raise NotFound(f"Graph '{graph_id}' not found. Expected one of: {sorted(self.entries)}") from None

    @contextlib.asynccontextmanager
    async def graph(self, graph_id: str, config: Mapping[str, Any] | None = None, *,
                    access: AccessContext = "assistants.read", store: Any = None,
                    context: Any = None) -> AsyncIterator[CompiledGraph]:
        """Yield the compiled graph for one use.

        A factory is called as LangGraph's server calls it: with the config (the assistant's, merged with the
        run's for a run), a `langgraph_sdk.runtime.ServerRuntime` telling why (`access`: running it, reading
        or updating a thread's state, describing it) with the store and, for a run, its `context`; or both, or
        neither, as its signature asks. It may be sync or async, and may return an (async) context manager,
        entered for the length of the use."""
        entry = self.entry(graph_id)
        if not entry.is_factory:
            yield entry.target
            return
        made = _call_factory(entry.target, config or {}, lambda: server_runtime(access, store, context))
        if inspect.isawaitable(made):
            made = await made
        if hasattr(made, "__aenter__"):
            async with made as graph:
                yield _compiled(graph, graph_id)
        elif hasattr(made, "__enter__"):
            with made as graph:
                yield _compiled(graph, graph_id)
        else:
            yield _compiled(made, graph_id)


AccessContext = Literal["threads.create_run", "threads.update", "threads.read", "assistants.read"]


def server_runtime(access: AccessContext, store: Any, context: Any) -> Any:
    """The `ServerRuntime` a factory receives: its execution variant (with the run's context) for a run,
    the read variant otherwise."""
    from langgraph_sdk import runtime  # ServerRuntime: langgraph-sdk >= 0.3.5 (a dependency of langgraph)

    if access == "threads.create_run":
        return runtime._ExecutionRuntime(access_context=access, store=store, context=context)
    return runtime._ReadRuntime(access_context=access, store=store)


def _call_factory(factory: Any, config: Mapping[str, Any], make_runtime: Any) -> Any:
    """Call `factory` with what its parameters ask for: the config, the runtime, both or neither.

    A parameter is the runtime when it is named `runtime` or annotated with `ServerRuntime`; any other is
    the config. So `(config)`, `(runtime)`, `(config, runtime)` and `()` all work, as on LangGraph's server."""
    try:
        params = [p for p in inspect.signature(factory).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    args: list[Any] = []
    has_config = False
    for param in params[:2]:
        if _is_runtime_param(param) or (has_config and param.default is param.empty):
            args.append(make_runtime())  # `(config, anything)`: the second is the runtime
        elif not has_config:
            args.append(config)
            has_config = True
    return factory(*args)


def _is_runtime_param(param: inspect.Parameter) -> bool:
    # The annotation is a string under `from __future__ import annotations`; either way its text names it.
    return param.name == "runtime" or "ServerRuntime" in str(param.annotation)


def _compiled(obj: Any, graph_id: str) -> CompiledGraph:
    if isinstance(obj, StateGraph):
        return cast(CompiledGraph, _named(obj.compile(), graph_id))
    if isinstance(obj, Pregel):
        return cast(CompiledGraph, _named(obj, graph_id))
    raise ConfigError(f"graph {graph_id!r} factory returned {type(obj).__name__}, not a graph")


def _named(graph: Any, graph_id: str) -> Any:
    """A compiled graph left with LangGraph's default name takes its graph id, as LangGraph's server names it:
    the root run of `events` mode and traces is called after it, and schema titles are built from it
    (`<graph_id>_input`, `<graph_id>_state`). A copy: the project's own object is left as it is."""
    if isinstance(graph, Pregel) and graph.name == "LangGraph":
        return graph.copy(update={"name": graph_id})
    return graph


def _import(spec: str, config: ProjectConfig) -> Any:
    try:
        target = load_object(spec, config.root, what="graph")
    except ConfigError as exc:
        raise ConfigError(f"{config.path}: {exc.message}") from exc
    if isinstance(target, StateGraph):
        return target.compile()
    if isinstance(target, Pregel) or callable(target):
        return target
    raise ConfigError(f"{config.path}: '{spec}' is a {type(target).__name__}, not a graph or a graph factory")


def describe_schemas(graph: PregelProtocol[Any, Any, Any, Any], graph_id: str) -> dict[str, Any]:
    """The graph's input/output/state/config/context schemas as JSON Schema; all null for a graph that is not a
    local `Pregel` (a `RemoteGraph` subgraph node describes no schemas of its own)."""
    if not isinstance(graph, Pregel):
        return {"graph_id": graph_id, "input_schema": None, "output_schema": None, "state_schema": None,
                "config_schema": None, "context_schema": None}

    def safe(fn: Any) -> Any:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # config schemas are deprecated in LangGraph 1.x, still served
                return fn()
        except Exception:  # a schema we cannot render is reported as absent, not a 500
            log.debug("schema generation failed for %s", graph_id, exc_info=True)
            return None

    return {
        "graph_id": graph_id,
        "input_schema": safe(lambda: _io_schema(graph, "input")),
        "output_schema": safe(lambda: _io_schema(graph, "output")),
        "state_schema": safe(lambda: _state_schema(graph)),
        "config_schema": safe(lambda: _configurable_schema(graph.get_config_jsonschema())),
        "context_schema": safe(graph.get_context_jsonschema),
    }


def _io_schema(graph: CompiledGraph, which: Literal["input", "output"]) -> Any:
    """LangGraph's own input or output schema, except for a `typing.TypedDict` on Python < 3.12, which
    pydantic refuses: it is described as its `typing_extensions` twin (LangGraph's server answers null)."""
    typ = getattr(getattr(graph, "builder", None), f"{which}_schema", None)
    twin = pydantic_compatible(typ) if typ is not None else None
    if twin is not None and twin is not typ:
        from pydantic import TypeAdapter

        return TypeAdapter(twin).json_schema()
    return graph.get_input_jsonschema() if which == "input" else graph.get_output_jsonschema()


def _configurable_schema(config: dict[str, Any]) -> dict[str, Any]:
    """The schema of `config["configurable"]`, as LangGraph's server gives `config_schema`: LangGraph's config
    schema wraps it (`{"properties": {"configurable": {"$ref": …}}, "$defs": …}`); `{}` when there is none."""
    configurable = (config.get("properties") or {}).get("configurable")
    if not isinstance(configurable, dict):
        return {}
    defs = dict(config.get("$defs") or {})
    ref = configurable.get("$ref", "")
    if isinstance(ref, str) and ref.startswith("#/$defs/") and ref[len("#/$defs/"):] in defs:
        schema = dict(defs.pop(ref[len("#/$defs/"):]))
    else:
        schema = {k: v for k, v in configurable.items() if k != "default"}
    if defs:  # the rest of the definitions, which it may refer to
        schema["$defs"] = {**defs, **schema.get("$defs", {})}
    return schema


def _state_schema(graph: CompiledGraph) -> Any:
    """The state's schema, titled after the graph as LangGraph's server titles it (`<name>_state`, or
    `<Name>State` for a name that starts upper-case: langchain's `get_name`)."""
    builder = getattr(graph, "builder", None)
    state = getattr(builder, "state_schema", None)
    if state is None:
        schema = graph.get_output_jsonschema()
    else:
        from pydantic import TypeAdapter

        schema = TypeAdapter(pydantic_compatible(state)).json_schema()
    if isinstance(schema, dict):
        schema["title"] = graph.get_name("State")
    return schema


def pydantic_compatible(tp: Any, _seen: dict[Any, Any] | None = None) -> Any:
    """`tp` with every `typing.TypedDict` in it (itself, its fields, their arguments) made a
    `typing_extensions.TypedDict` with the same fields, which pydantic accepts on Python < 3.12 too.
    `tp` itself when nothing needed converting."""
    if sys.version_info >= (3, 12):
        return tp
    seen = {} if _seen is None else _seen
    try:
        if tp in seen:
            return seen[tp]
    except TypeError:  # an unhashable annotation argument (a metadata object): left as it is
        return tp
    if typing_extensions.is_typeddict(tp):
        return _typed_dict_twin(tp, seen)
    args = typing.get_args(tp)
    if not args:
        return tp
    new_args = tuple(pydantic_compatible(a, seen) for a in args)
    if all(n is a for n, a in zip(new_args, args, strict=True)):
        return tp
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return typing.Annotated[(new_args[0], *tp.__metadata__)]
    if hasattr(tp, "copy_with"):  # typing's generic aliases (List[X], Union[X, Y], Optional[X])
        return tp.copy_with(new_args)
    if origin is types.UnionType:
        return functools.reduce(operator.or_, new_args)
    return origin[new_args] if origin is not None else tp


_REQUIREDNESS = {typing.Required, typing.NotRequired, typing_extensions.Required, typing_extensions.NotRequired}


def _typed_dict_twin(tp: Any, seen: dict[Any, Any]) -> Any:
    hints = typing.get_type_hints(tp, include_extras=True)
    seen[tp] = tp  # a recursive TypedDict stays as it is (pydantic will report it)
    fields = {}
    changed = type(tp).__module__ == "typing"  # pydantic refuses `typing.TypedDict` itself, not just its fields
    for name, hint in hints.items():
        if typing.get_origin(hint) in _REQUIREDNESS:  # kept by include_extras; set again below
            hint = typing.get_args(hint)[0]
        converted = pydantic_compatible(hint, seen)
        changed = changed or converted is not hint
        required = name in getattr(tp, "__required_keys__", ())
        fields[name] = typing_extensions.Required[converted] if required else typing_extensions.NotRequired[converted]
    if not changed:
        return tp
    # misc: mypy checks only TypedDicts it can see statically; this one is made at runtime from `tp`'s fields.
    twin = typing_extensions.TypedDict(tp.__name__, fields)  # type: ignore[misc]
    twin.__doc__ = tp.__doc__
    twin.__module__ = tp.__module__
    seen[tp] = twin
    return twin


def draw(graph: CompiledGraph, xray: int | bool = False) -> dict[str, Any]:
    """The drawn graph as LangGraph's server answers it: a node's `data` is its name, without the class path of
    the runnable behind it (`["langgraph", "_internal", "_runnable", "RunnableCallable"]` for every function)."""
    drawn = dict(graph.get_graph(xray=xray).to_json())
    for node in drawn.get("nodes") or ():
        if node.get("type") == "runnable" and isinstance(node.get("data"), dict):
            node["data"] = {k: v for k, v in node["data"].items() if k != "id"}
    return drawn


def subgraph_schemas(graph: CompiledGraph, namespace: str | None, recurse: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for ns, sub in graph.get_subgraphs(namespace=namespace, recurse=recurse):
        out[ns] = describe_schemas(sub, ns)
        out[ns].pop("graph_id", None)
    return out
