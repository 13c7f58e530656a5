"""Every difference between LangGraph's server and Threadline that the differential suite knows of: ONE list.

Each entry matches differences by where they happen (`where`: a regex searched in "METHOD /masked/path") and
what differs (`field`: a regex matched against the whole field path: `status`, `header.location`,
`body.kwargs.config`, `sse[debug].data.step`, `exchange` for a request only one server answered,
`session.error` for a session that broke off on one server). Its `status` says why it is accepted:

- `issue13`: being fixed in issue 13 by another branch. When the fix is merged the difference disappears and
  `test_every_accepted_difference_is_still_seen` fails until the entry is removed here (strict, like xfail).
- `open`: a real difference nobody is fixing yet; listed so the suite stays green and the gap stays visible.
- `deliberate`: different on purpose (docs/compatibility.md says why), or a value that belongs to the
  reference's own deployment (LangSmith plan, host, auth) and has no meaning here.

`docs/compatibility.md` carries this list as a table between generated markers; `tests/differential/
test_accepted_doc.py` fails when the two disagree (`python -m tests.differential.accepted` rewrites it).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tests.differential.compare import MISSING

Status = Literal["issue13", "open", "deliberate"]


@dataclass(frozen=True)
class Accepted:
    key: str
    status: Status
    where: str
    field: str
    reason: str
    sessions: str = "."  # a regex searched in the session's name
    steps: str = "."  # a regex searched in the step's label
    sometimes: bool = False  # seen on some runs only (an order nobody defines): exempt from the staleness check
    extra_only: bool = False  # only where the reference has no such field at all (Threadline adds it)
    reference_null: bool = False  # only where the reference answers `null` (Threadline a value)
    answers: tuple[Any, Any] | None = None  # only where the two servers answered exactly these (reference, ours)

    def matches(self, diff: Any) -> bool:
        if self.extra_only and diff.reference != MISSING:
            return False
        if self.reference_null and diff.reference is not None:
            return False
        if self.answers is not None and (diff.reference, diff.threadline) != self.answers:
            return False
        return (bool(re.search(self.sessions, diff.session)) and bool(re.search(self.steps, diff.step))
                and bool(re.search(self.where, diff.where))
                and bool(re.fullmatch(self.field, diff.field)))


_PLATFORM = r"(langgraph_(host|plan|api_url|api_version|version|request_id|auth_user|auth_user_id|auth_permissions)" \
            r"|user_id|run_attempt|__request_start_time_ms__|__after_seconds__|__pregel_node_finished)"
_ERR = r"body\.(code|message|errors|metadata)"  # our error body's extra keys (the SDK shows `detail`)

ACCEPTED: list[Accepted] = [
    Accepted("run-kwargs-config", "deliberate", r"/runs",
             r"body(\[\])?\.kwargs\.config\.(configurable\.graph_id|metadata\.(run_id|thread_id))",
             "A run's `kwargs.config`, rendered from the run's row alone: no `graph_id` in `configurable` for a run "
             "that created its thread (its metadata has none to take it from), and for a graph factory the "
             "reference's `metadata` also has `run_id`/`thread_id`; the graph gets both in its config either way: "
             "docs/compatibility.md, Runs."),
    Accepted("thread-interrupts-error", "deliberate", r"/threads", r"body(\[\])?\.(interrupts|error)",
             "Thread objects: Threadline always has `interrupts` and `error`, so a client reading them never "
             "gets a KeyError; the reference leaves them out of a new, copied or patched thread: "
             "docs/compatibility.md, Threads.", extra_only=True),
    Accepted("thread-config-configurable", "deliberate", r"/threads", r"body(\[\])?\.config\.configurable",
             "Thread `config` stays as created (`{}`); the reference rewrites it at each run's creation (the request's "
             "top-level keys, the assistant's `configurable`, the request's own dropped), which leaves "
             "`{\"configurable\": {}}` after a plain run: docs/compatibility.md, Threads and state."),
    Accepted("thread-copy-values", "deliberate", r"POST /threads/<uuid>/copy$", r"body\.values",
             "`POST /threads/{id}/copy` answers the copy as it is once copied (its `values`, and the status they "
             "imply); the reference answers the new row before its state is copied (no `values`, `idle`)."),
    Accepted("cancelled-error-message", "deliberate", r"GET /threads/<uuid>$", r"body\.error\.message",
             "A thread whose run was cancelled: the error message names the run (`interrupt requested for run "
             "<id>`); the reference's is the route's template with its placeholders left in (`… via POST "
             "/threads/{thread_id}/runs/{run_id}/cancel`)."),
    Accepted("schema-state-defaults", "deliberate", r"/schemas$|/subgraphs",
             r"body(\.\w+)?\.state_schema\.(properties\.\w+\.default|required)",
             "State schemas: the reference gives every field `default: null` and no `required`; Threadline the "
             "declared defaults (pydantic, dataclass) or none, and `required`: docs/compatibility.md, Assistants."),
    Accepted("schema-node-input-fields", "deliberate", r"/schemas$", r"body\.state_schema\.properties\.\w+",
             "State schemas: the reference also lists the fields of a node's own input state (a `Send` target's "
             "`subject`); Threadline only the graph's state, what a thread holds: docs/compatibility.md, "
             "Assistants.", sessions=r"^schemas$", steps=r"^schemas send$"),
    Accepted("schema-agent-state", "deliberate", r"/schemas$",
             r"body\.state_schema\.(additionalProperties|deprecated|description|properties(\.remaining_steps)?)",
             "State schemas the reference prunes or pads: `create_react_agent`'s (Threadline keeps `remaining_steps`, "
             "a channel of its state, `deprecated` and the description) and an `@entrypoint`'s (the reference lists "
             "the internal `__end__` channel): docs/compatibility.md, Assistants."),
    Accepted("store-search-order", "deliberate", r"POST /store/items/search$",
             r"body\.items\[\]\.(key|namespace\.length|value\.\w+)",
             "Store search without a query: the reference lists items in its in-memory store's insertion order; "
             "Threadline serves the store with LangGraph's own SQLite and PostgreSQL store classes, which define "
             "no order for it (the SQLite one has no ORDER BY): docs/compatibility.md, Store.",
             sometimes=True),
    Accepted("ok-services", "deliberate", r"GET /(ok)?$", r"body\.services",
             "`GET /ok` and `GET /`: the reference adds `services: {}` (its deployment's services, none under "
             "`langgraph dev`); Threadline answers `{\"ok\": true}` and checks its database and broker with "
             "`check_db=1`."),
    Accepted("protocol-seq", "deliberate", r"/stream/events$", r"sse\[[^\]]+\]\.data\.(seq|event_id)",
             "Protocol v2 `seq` is per thread and persisted, `event_id` `<run_id>:<seq>` (the reference: per "
             "connection): docs/compatibility.md, Protocol v2."),
    Accepted("protocol-input-value", "deliberate", r"/stream/events$",
             r"sse\[input\.requested\]\.data\.params\.data\.value",
             "`input.requested` carries `value` besides `payload` (langgraph-sdk reads `value`): docs, Protocol v2."),
    Accepted("protocol-updates", "deliberate", r"/stream/events$", r"sse\[[^\]]*updates\](\.data\.params.*)?",
             "Protocol v2: a subscriber of `updates` gets the root's `updates` events (a channel of the protocol); "
             "the reference 0.16.7 sends none: docs/compatibility.md, Protocol v2."),
    # --- deliberate, or the reference's deployment ---------------------------------------------------------------
    Accepted("typeddict-io-schemas-311", "deliberate", r"/schemas$|/subgraphs", r"body(\.\w+)?\.(input|output)_schema",
             "Graphs whose state is a `typing.TypedDict`, on Python 3.11: the reference answers `null` input and "
             "output schemas (pydantic refuses `typing.TypedDict` before 3.12); Threadline describes them through "
             "their `typing_extensions` twin, so Studio draws the input form, MCP lists the graph and A2A takes "
             "text.", reference_null=True),
    Accepted("error-detail-texts", "deliberate", r".", r"body\.detail",
             "Error texts where the reference's says less or is a library's prose: a bare `Not Found` for an "
             "unknown assistant or a deleted run, `Thread with ID … not found` for an unknown run of a known "
             "thread, the JSON Schema validator's paragraph for a bad `limit`, a multi-line list of graphs, "
             "the cancel of a finished run: docs/compatibility.md, Conventions.",
             steps=r"^(get deleted|assistant 404|run 404|unknown assistant|bad limit|cancel finished)$"),
    Accepted("busy-detail", "deliberate", r"POST /threads/<uuid>/state$", r"body\.detail",
             "The 409 for a state update while a run is in flight: the reference's text is a Python repr of its "
             "run rows; Threadline names the runs' ids.", sessions=r"^busy$"),
    Accepted("store-empty-label", "deliberate", r"PUT /store/items$", r"body|header\.content-type",
             "A store namespace with an empty label: the reference answers 422 in plain text, Threadline 422 "
             "with its JSON error body, as for every bad input: docs/compatibility.md, Conventions."),
    Accepted("platform-metadata", "deliberate", r".", rf".*\.(configurable|metadata|data\[\])\.{_PLATFORM}",
             "Values of the reference's deployment that LangGraph passes to the graph: LangSmith plan and host, "
             "API version and URL, the authenticated user, request timing. Threadline's runs carry `graph_id`, "
             "`assistant_id`, `run_id`, `thread_id` and the caller's metadata."),
    Accepted("mcp-tool-result", "deliberate", r"POST /mcp$",
             r"body\.result\.(content\[\]\.text|isError|structuredContent|serverInfo\.(name|version))",
             "MCP: `tools/call` answers the state as JSON text plus `structuredContent` and `isError` (the "
             "reference: a Python repr); `serverInfo` names Threadline: docs/compatibility.md, MCP."),
    Accepted("a2a-agent-card", "deliberate", r"/\.well-known/agent-card\.json", r"body\..*",
             "The A2A agent card lists 1.0 and 0.3 interfaces with the legacy 0.3 fields, describes the skill's "
             "input, has no history-scope extension, names Threadline's version, and lists text before JSON: "
             "docs/compatibility.md, A2A."),
    Accepted("cron-error-detail", "deliberate", r"/crons", r"body\.detail",
             "Cron errors say more than the reference's: a missing cron's 404 names it (`Cron '<id>' not found`; "
             "the reference: `Not Found`), an invalid schedule's 422 gives the parser's reason (`Bad minute`; the "
             "reference repeats `Invalid cron schedule`), a missing thread's 404 is Threadline's usual one: "
             "docs/compatibility.md, Crons.", sessions=r"^crons$"),
    # --- the acceptance audit (session accept:requests, tests/differential/variants.py): statuses only ---------
    Accepted("null-as-absent", "deliberate", r".", r"status",
             "A `null` beside an optional request field: Threadline takes it as absent; the reference refuses it (422) "
             "on most fields (its schemas have no null there) and takes it as absent on a few (`input`, `command`, "
             "`checkpoint_id`, `on_completion`, `on_disconnect`, `if_exists`, `graph_id` on thread create, a cron's "
             "`end_time`, the store's optional fields). langgraph-sdk never sends null (it drops None): "
             "docs/compatibility.md, Requests.", sessions=r"^accept:requests$", steps=r": \w+ null$",
             answers=(422, 200)),
    Accepted("unsupported-fields", "deliberate", r".", r"status",
             "Fields the reference honours and Threadline cannot are refused (422 naming them) rather than silently "
             "ignored: thread search's `extract`: docs/compatibility.md, Requests.",
             sessions=r"^accept:requests$", steps=r": extract$", answers=(200, 422)),
    Accepted("cron-empty-timezone", "deliberate", r"POST /runs/crons$", r"status",
             "A cron with `timezone: \"\"`: Threadline takes it as no timezone (UTC), as when the field is absent; the "
             "reference's 400 is its zone parser failing on the empty name: docs/compatibility.md, Requests.",
             sessions=r"^accept:requests$", steps=r'timezone ""$', answers=(400, 200)),
    Accepted("error-body", "deliberate", r".", _ERR,
             "Threadline's error bodies are always `{detail, code, message}` (+ `errors`, `metadata`): "
             "docs/compatibility.md, Conventions.", extra_only=True),
]


def classify(diff: Any) -> Accepted | None:
    """The entry that accepts this difference, if any."""
    for entry in ACCEPTED:
        if entry.matches(diff):
            return entry
    return None


# --- the table in docs/compatibility.md ---------------------------------------------------------------------
DOC = Path(__file__).resolve().parents[2] / "docs" / "compatibility.md"
BEGIN = "<!-- accepted differences: generated by `python -m tests.differential.accepted` -->"
END = "<!-- end of accepted differences -->"


def table() -> str:
    rows = ["| key | status | where | reason |", "|---|---|---|---|"]
    for e in ACCEPTED:
        status = (("being fixed in issue 13" if e.status == "issue13" else e.status)
                  + (" (sometimes)" if e.sometimes else ""))
        where = f"`{e.where}` `{e.field}`" + (f" (sessions `{e.sessions}`)" if e.sessions != "." else "") \
            + (f" (steps `{e.steps}`)" if e.steps != "." else "")
        rows.append(f"| `{e.key}` | {status} | {where.replace('|', chr(92) + '|')} | {e.reason} |")
    return "\n".join(rows)


def doc_section(text: str) -> str:
    start, stop = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[start:stop].strip()


def rewrite_doc() -> None:
    text = DOC.read_text()
    start, stop = text.index(BEGIN) + len(BEGIN), text.index(END)
    DOC.write_text(text[:start] + "\n" + table() + "\n" + text[stop:])


if __name__ == "__main__":
    rewrite_doc()
    sys.stdout.write(f"{DOC}: {len(ACCEPTED)} accepted differences\n")
