"""System endpoints: liveness, readiness, and what this server is."""

from __future__ import annotations

from fastapi import Request

from threadline import __version__
from threadline.api.common import JSON, Router, runtime
from threadline.broker import broker_kind, broker_url

router = Router(tags=["System"])
# Surfaces beyond the REST core; every one is served (none is optional yet).
SURFACES = ("a2a", "mcp", "streaming_protocol", "metrics")


@router.get("/")
async def root() -> JSON:
    """As LangGraph's server: a health answer at the root, which some load balancers probe."""
    return JSON({"ok": True})


@router.get("/ok")
async def ok(request: Request, check_db: int = 0) -> JSON:
    """Liveness; with `check_db=1`, readiness: the database answers a real query and the broker a ping (503 if not).
    With langgraph.json's `http.disable_meta`, no checks (as LangGraph's server)."""
    if check_db and "meta" not in runtime(request).project.http.disabled:
        await runtime(request).storage.ping()
        await runtime(request).broker.ping()
    return JSON({"ok": True})


@router.get("/info")
async def info(request: Request) -> JSON:
    rt = runtime(request)
    stats = await rt.storage.queue_stats()
    return JSON({
        "version": __version__,
        "server": "threadline",
        "langgraph_py_version": _version("langgraph"),
        "flags": {"assistants": True, "crons": True, "langsmith": False, "agent_protocol": True,
                  **dict.fromkeys(SURFACES, True)},
        "storage": {"backend": rt.storage.url.split(":", 1)[0], **rt.storage.capabilities,
                    # langgraph.json checkpointer.ttl; null: only threads given a `ttl` expire.
                    "thread_ttl": rt.threads.ttl.declared() if rt.threads.ttl else None},
        "broker": broker_kind(broker_url(rt.settings.database_url or "", rt.settings.redis_url)),
        "graphs": rt.graphs.ids(),
        "default_agent": rt.graphs.default_agent,
        "workers": {"size": rt.workers.size if rt.workers else 0, "busy": rt.workers.busy if rt.workers else 0},
        "queue": stats,
    })


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None
