"""Loading the graphs a project names, and describing them (schemas, drawings)."""

from __future__ import annotations

import contextlib
import inspect
import logging
import sys
import warnings
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from langgraph.graph import StateGraph
from langgraph.pregel import Pregel

from threadline.config import ProjectConfig
from threadline.errors import ConfigError, NotFound
from threadline.loader import load_object

log = logging.getLogger("threadline.graphs")


@dataclass
class GraphEntry:
    graph_id: str
    spec: str
    target: Any  # a compiled graph, or a factory taking the run config

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
        entries = {gid: GraphEntry(gid, spec, _import(spec, config)) for gid, spec in config.graphs.items()}
        return cls(entries, config.default_agent)

    def ids(self) -> list[str]:
        return list(self.entries)

    def entry(self, graph_id: str) -> GraphEntry:
        try:
            return self.entries[graph_id]
        except KeyError:
            raise NotFound(f"Graph '{graph_id}' not found. Expected one of: {sorted(self.entries)}") from None

    @contextlib.asynccontextmanager
    async def graph(self, graph_id: str, config: dict[str, Any] | None = None) -> AsyncIterator[Pregel]:
        """Yield the compiled graph for one use (factories are called with the run config)."""
        entry = self.entry(graph_id)
        if not entry.is_factory:
            yield entry.target
            return
        made = _call_factory(entry.target, config or {})
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


def _call_factory(factory: Any, config: dict[str, Any]) -> Any:
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        params = {}
    return factory(config) if params else factory()


def _compiled(obj: Any, graph_id: str) -> Pregel:
    if isinstance(obj, StateGraph):
        return obj.compile()
    if isinstance(obj, Pregel):
        return obj
    raise ConfigError(f"graph {graph_id!r} factory returned {type(obj).__name__}, not a graph")


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


def describe_schemas(graph: Pregel, graph_id: str) -> dict[str, Any]:
    """The graph's input/output/state/config/context schemas as JSON Schema."""

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
        "input_schema": safe(graph.get_input_jsonschema),
        "output_schema": safe(graph.get_output_jsonschema),
        "state_schema": safe(lambda: _state_schema(graph)),
        "config_schema": safe(lambda: _configurable_schema(graph.get_config_jsonschema())),
        "context_schema": safe(graph.get_context_jsonschema),
    }


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


def _state_schema(graph: Pregel) -> Any:
    builder = getattr(graph, "builder", None)
    state = getattr(builder, "state_schema", None)
    if state is None:
        return graph.get_output_jsonschema()
    from pydantic import TypeAdapter

    return TypeAdapter(state).json_schema()


def draw(graph: Pregel, xray: int | bool = False) -> dict[str, Any]:
    drawn = graph.get_graph(xray=xray).to_json()
    return dict(drawn)


def subgraph_schemas(graph: Pregel, namespace: str | None, recurse: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for ns, sub in graph.get_subgraphs(namespace=namespace, recurse=recurse):
        out[ns] = describe_schemas(sub, ns)
        out[ns].pop("graph_id", None)
    return out
