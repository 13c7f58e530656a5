"""A node that calls the server it runs in (`langgraph_sdk.get_client()` without a URL), as deepagents' async
subagents and many tools do, and reports what it could see and make."""

from __future__ import annotations

from typing import Any, TypedDict

from langgraph.graph import START, StateGraph
from langgraph_sdk import get_client


class State(TypedDict, total=False):
    other_thread: str
    seen: dict[str, Any]


async def look_around(state: State) -> dict[str, Any]:
    client = get_client()
    owners = sorted({(t["metadata"] or {}).get("owner") for t in await client.threads.search(limit=100)})
    made = await client.threads.create(metadata={"made_by": "caller"})
    nested = await client.runs.wait(None, "whoami", input={"message": "nested"})
    assert isinstance(nested, dict), nested  # whoami's state is a dict (the SDK types a wait's answer a list or one)
    try:
        await client.threads.get(state["other_thread"])
        other = "found"
    except Exception as exc:  # noqa: BLE001 - langgraph_sdk raises on a 404
        other = type(exc).__name__
    # Credentials an agent puts on its in-process client change nothing: it is its run's caller.
    posing = get_client(headers={"Authorization": "Bearer user-b"})
    posing_owners = sorted({(t["metadata"] or {}).get("owner") for t in await posing.threads.search(limit=100)})
    return {"seen": {"owners": owners, "made_owner": made["metadata"].get("owner"),
                     "nested_user": nested["seen"]["user_id"], "other_thread": other, "posing_owners": posing_owners}}


graph = StateGraph(State).add_node(look_around).add_edge(START, "look_around").compile()
