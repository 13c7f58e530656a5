"""Where langgraph-sdk's annotations and the server's answers differ, said once for the type gate (issue 29).

The SDK's TypedDicts leave out keys LangGraph's server sends (and Threadline's, as its drop-in), type a few answers
as another record, and give unions where a test knows which member it has. These helpers narrow or retype such an
answer where a test reads it, instead of a cast at each use; the ones that can check what they claim do.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.schema import Cron, Run, RunCreate, Thread


def as_cron(created: Run) -> Cron:
    """What `crons.create` and `crons.create_for_thread` answer: the cron (langgraph-sdk 0.4 annotates both
    `-> Run`; LangGraph's server answers the cron it made, as Threadline's does)."""
    return cast(Cron, created)


async def copy_thread(sdk: LangGraphClient, thread_id: str) -> Thread:
    """`sdk.threads.copy(thread_id)`, with the copy it answers (langgraph-sdk 0.4 annotates it `-> None`, and
    returns the server's answer, the new thread)."""
    copy = cast(Callable[[str], Awaitable[Thread]], sdk.threads.copy)
    return await copy(thread_id)


def batch_entry(assistant_id: str, **keys: Any) -> RunCreate:
    """One run of `runs.create_batch`, with only the keys it sets (the SDK's RunCreate declares every key
    required; the server, like LangGraph's, takes any of them left out)."""
    return cast(RunCreate, {"assistant_id": assistant_id, **keys})


def wire(record: Mapping[str, Any]) -> dict[str, Any]:
    """A record as the server sent it, for a key its SDK TypedDict does not declare (a run's `kwargs`, a
    thread's `state_updated_at`): the JSON object itself, untyped."""
    return cast(dict[str, Any], record)


def one_state(values: list[dict[str, Any]] | dict[str, Any]) -> dict[str, Any]:
    """A graph's state as an object (`runs.wait`'s answer, a thread's or a state's `values`): the SDK allows a
    list too, which a graph with a dict state never gives."""
    assert isinstance(values, dict), values
    return values


def user_says(text: str) -> dict[str, Any]:
    """A chat graph's input: one user message (typed as a JSON object, which a literal of it at the SDK's
    `input=` is not inferred as)."""
    return {"messages": [{"role": "user", "content": text}]}
