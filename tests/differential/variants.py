"""The acceptance audit's request variants: for each operation a request both servers accept, then the same
request with fields LangGraph's server does not define, with `null` beside the fields that matter, with empty
strings, and (for runs) with `input` beside `command`.

Only the status of each answer is compared (`Session.status`): whether a request is accepted, not what it
answers, which the other sessions compare. Paths name the session's own resources as `{tid}`, `{aid}`, `{cron}`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: Fields no server defines: `order_by` is what Aegra's e2e suite sends to thread search.
EXTRA = {"order_by": "created_at", "not_a_field": {"x": 1}}
COMMAND = {"resume": "yes"}
LATER = 3600  # runs created by the audit wait an hour (they never start, so they cost the servers nothing)


@dataclass(frozen=True)
class Operation:
    """One request body, and the variants to try on it."""

    name: str
    method: str
    path: str
    body: dict[str, Any]
    nulls: tuple[str, ...] = ()  # each sent as `null`
    empty: tuple[str, ...] = ()  # each sent as ""
    more: tuple[tuple[str, dict[str, Any]], ...] = field(default=())  # named changes to the body

    def variants(self) -> list[tuple[str, dict[str, Any]]]:
        out = [("as is", self.body), ("extra fields", {**self.body, **EXTRA})]
        out += [(f"{name} null", {**self.body, name: None}) for name in self.nulls]
        out += [(f'{name} ""', {**self.body, name: ""}) for name in self.empty]
        out += [(label, {**self.body, **change}) for label, change in self.more]
        return out


RUN = {"assistant_id": "typed", "input": {"topic": "audit"}, "after_seconds": LATER}
RUN_NULLS = ("input", "command", "metadata", "config", "context", "checkpoint", "checkpoint_id", "checkpoint_during",
             "interrupt_before", "interrupt_after", "stream_mode", "stream_subgraphs", "stream_resumable",
             "on_disconnect", "on_completion", "multitask_strategy", "if_not_exists", "webhook", "durability",
             "feedback_keys", "assistant_id")
#: `input` beside `command` (Agent Chat UI sends `input: {}` with the command that answers an interrupt).
WITH_COMMAND: tuple[tuple[str, dict[str, Any]], ...] = (
    ("input {} + command", {"input": {}, "command": COMMAND}),
    ("input null + command", {"input": None, "command": COMMAND}),
    ("input + command", {"command": COMMAND}),
    ("command {} + input", {"command": {}}),
)

OPERATIONS: dict[str, list[Operation]] = {
    "assistants": [
        Operation("create assistant", "POST", "/assistants", {"graph_id": "typed", "metadata": {"session": "accept"}},
                  nulls=("assistant_id", "config", "context", "metadata", "name", "description", "if_exists"),
                  empty=("name", "description", "assistant_id", "graph_id")),
        Operation("patch assistant", "PATCH", "/assistants/{aid}", {"metadata": {"n": 1}},
                  nulls=("graph_id", "config", "context", "metadata", "name", "description"), empty=("name",)),
        Operation("search assistants", "POST", "/assistants/search", {"metadata": {"session": "accept"}},
                  nulls=("graph_id", "name", "metadata", "limit", "offset", "sort_by", "sort_order", "select"),
                  empty=("graph_id", "name", "sort_by")),
        Operation("count assistants", "POST", "/assistants/count", {"graph_id": "typed"},
                  nulls=("graph_id", "name", "metadata")),
        Operation("assistant versions", "POST", "/assistants/{aid}/versions", {"limit": 5},
                  nulls=("metadata", "limit", "offset")),
    ],
    "threads": [
        Operation("create thread", "POST", "/threads", {"metadata": {"session": "accept"}},
                  nulls=("thread_id", "metadata", "if_exists", "supersteps", "graph_id", "ttl"),
                  empty=("thread_id", "graph_id")),
        Operation("patch thread", "PATCH", "/threads/{tid}", {"metadata": {"n": 1}}, nulls=("metadata", "ttl")),
        Operation("search threads", "POST", "/threads/search", {"metadata": {"session": "accept"}},
                  nulls=("ids", "metadata", "values", "status", "limit", "offset", "sort_by", "sort_order", "select"),
                  empty=("status", "sort_by"), more=(("extract", {"extract": {"topic": "values.topic"}}),)),
        Operation("count threads", "POST", "/threads/count", {"metadata": {"session": "accept"}},
                  nulls=("metadata", "values", "status")),
        Operation("update state", "POST", "/threads/{tid}/state", {"values": {"topic": "edited"}},
                  nulls=("as_node", "checkpoint", "checkpoint_id")),
        Operation("history", "POST", "/threads/{tid}/history", {"limit": 2},
                  nulls=("limit", "before", "metadata", "checkpoint")),
    ],
    "runs": [
        Operation("create run", "POST", "/threads/{tid}/runs", RUN, nulls=RUN_NULLS,
                  empty=("checkpoint_id", "webhook", "stream_mode", "multitask_strategy"),
                  more=(*WITH_COMMAND, ("langsmith_tracer", {"langsmith_tracer": {"project_name": "audit"}}))),
        Operation("create stateless run", "POST", "/runs", RUN,
                  nulls=("input", "command", "on_completion", "if_not_exists", "config", "metadata"),
                  more=WITH_COMMAND),
    ],
    "crons": [
        Operation("create cron", "POST", "/runs/crons",
                  {"assistant_id": "typed", "schedule": "0 0 1 1 *", "enabled": False,
                   "metadata": {"session": "accept"}},
                  nulls=("input", "metadata", "config", "context", "enabled", "timezone", "end_time",
                         "on_run_completed",
                         "webhook", "multitask_strategy", "interrupt_before", "stream_mode", "durability"),
                  empty=("timezone", "schedule")),
        Operation("patch cron", "PATCH", "/runs/crons/{cron}", {"enabled": False},
                  nulls=("schedule", "input", "metadata", "end_time", "timezone")),
        Operation("search crons", "POST", "/runs/crons/search",
                  {"metadata": {"session": "accept"}, "select": ["schedule"]},
                  nulls=("assistant_id", "thread_id", "enabled", "limit", "offset", "sort_by", "sort_order", "select")),
        Operation("count crons", "POST", "/runs/crons/count", {"metadata": {"session": "accept"}},
                  nulls=("assistant_id", "thread_id", "metadata")),
    ],
    "store": [
        Operation("put item", "PUT", "/store/items", {"namespace": ["accept"], "key": "k", "value": {"v": 1}},
                  nulls=("index", "ttl"), empty=("key",)),
        # Not `namespace_prefix: null`: the reference fails (500) and then drops the connection.
        Operation("search items", "POST", "/store/items/search", {"namespace_prefix": ["accept"]},
                  nulls=("filter", "limit", "offset", "query", "refresh_ttl")),
        Operation("list namespaces", "POST", "/store/namespaces", {"prefix": ["accept"]},
                  nulls=("prefix", "suffix", "max_depth", "limit", "offset")),
        Operation("delete item", "DELETE", "/store/items", {"namespace": ["accept"], "key": "gone"}),
    ],
}
