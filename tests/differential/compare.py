"""Record HTTP exchanges, mask what differs by nature (ids, times), and list every remaining difference.

An `Exchange` is one request and its response as a client sees it: status, the headers clients read, and the
body (JSON, or the event sequence of a server-sent event stream). `compare` walks two recordings of the same
scripted session (reference vs Threadline) step by step and returns `Difference`s; `accepted.py` says which of
them are known, and why.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from typing import Any

import httpx

#: The response headers a langgraph-sdk client (or a browser) reads.
HEADERS = ("content-type", "location", "content-location", "x-pagination-total", "x-pagination-next")

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.I)
TIME = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:?\d{2})?")
HEX32 = re.compile(r"\b[0-9a-f]{32}\b")  # interrupt ids, task ids
PORT = re.compile(r"//(127\.0\.0\.1|localhost):\d+")  # each server's own loopback address
TIME_KEYS = {"created_at", "updated_at", "expires_at", "timestamp", "state_updated_at"}


def mask(value: Any) -> Any:
    """The value with ids and times replaced by placeholders, so two servers' answers can be compared."""
    if isinstance(value, dict):
        return {mask(k): ("<time>" if k in TIME_KEYS and isinstance(v, (str, int, float)) and v else mask(v))
                for k, v in value.items()}
    if isinstance(value, list):
        return [mask(v) for v in value]
    if isinstance(value, str):
        out = PORT.sub("//<host>", UUID.sub("<uuid>", value))
        out = TIME.sub("<time>", out)
        return HEX32.sub("<hex>", out)
    return value


def parse_sse(text: str) -> list[dict[str, Any]]:
    """Events of a server-sent event stream: `{"event", "data"}` (comments and ids dropped)."""
    events: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    data: list[str] = []
    for line in text.replace("\r\n", "\n").split("\n"):
        if not line:
            if data or current:
                raw = "\n".join(data)
                try:
                    current["data"] = json.loads(raw) if raw else None
                except ValueError:
                    current["data"] = raw
                events.append({"event": current.get("event", "message"), "data": current.get("data")})
            current, data = {}, []
        elif line.startswith(":"):
            continue
        elif line.startswith("event:"):
            current["event"] = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip(" "))
    return events


@dataclass
class Exchange:
    """One request (method, masked path, the step's label) and what came back."""

    step: str
    method: str
    path: str
    status: int
    headers: dict[str, str]
    body: Any
    sse: bool = False

    @classmethod
    def of(cls, step: str, request: httpx.Request, response: httpx.Response, content: bytes) -> Exchange:
        kind = response.headers.get("content-type", "")
        text = content.decode("utf-8", "replace")
        sse = kind.startswith("text/event-stream")
        if sse:
            body: Any = parse_sse(text)
        else:
            try:
                body = json.loads(text) if text.strip() else None
            except ValueError:
                body = text.strip()  # keep-alive newlines are not part of the body
        path = request.url.path + (f"?{request.url.query.decode()}" if request.url.query else "")
        headers = {h: response.headers[h] for h in HEADERS if h in response.headers}
        return cls(step, request.method, mask(path), response.status_code, mask(headers), mask(body), sse)

    @property
    def where(self) -> str:
        return f"{self.method} {self.path}"


@dataclass(frozen=True)
class Difference:
    """One place where the two servers answered differently."""

    session: str
    step: str
    where: str  # "METHOD /masked/path"
    field: str  # "status", "header.location", "body.values.messages[].id", "sse[].event", …
    reference: Any
    threadline: Any
    index: str = ""  # the same field with list indices, for people

    def __str__(self) -> str:
        return (f"[{self.session} / {self.step}] {self.where} {self.index or self.field}: "
                f"reference={_short(self.reference)} threadline={_short(self.threadline)}")


MISSING = "<absent>"


def _short(value: Any) -> str:
    text = json.dumps(value, default=str, sort_keys=True)
    return text if len(text) <= 160 else text[:157] + "..."


@dataclass
class _Walker:
    session: str
    exchange: Exchange
    out: list[Difference] = field(default_factory=list)

    def add(self, path: str, indexed: str, ref: Any, tl: Any) -> None:
        ex = self.exchange
        self.out.append(Difference(self.session, ex.step, ex.where, path, ref, tl, indexed))

    def walk(self, ref: Any, tl: Any, path: str, indexed: str) -> None:
        if isinstance(ref, dict) and isinstance(tl, dict):
            for key in sorted(set(ref) | set(tl), key=str):
                sub, subi = f"{path}.{key}", f"{indexed}.{key}"
                if key not in tl:
                    self.add(sub, subi, ref[key], MISSING)
                elif key not in ref:
                    self.add(sub, subi, MISSING, tl[key])
                else:
                    self.walk(ref[key], tl[key], sub, subi)
        elif isinstance(ref, list) and isinstance(tl, list):
            if len(ref) != len(tl):
                self.add(f"{path}.length", f"{indexed}.length", len(ref), len(tl))
            for i, (a, b) in enumerate(zip(ref, tl, strict=False)):
                self.walk(a, b, f"{path}[]", f"{indexed}[{i}]")
        elif ref != tl or type(ref) is not type(tl):
            self.add(path, indexed, ref, tl)

    def events(self, ref: list[dict[str, Any]], tl: list[dict[str, Any]]) -> None:
        """Align the two event sequences by event name; compare the data of aligned events. The ends of a
        step's concurrent tasks come in the order the tasks finished, which neither server defines: they are
        compared in a canonical order (`settled_order`)."""
        ref, tl = settled_order(ref), settled_order(tl)
        names = difflib.SequenceMatcher(a=[e["event"] for e in ref], b=[e["event"] for e in tl], autojunk=False)
        for op, a0, a1, b0, b1 in names.get_opcodes():
            if op == "equal":
                for i, j in zip(range(a0, a1), range(b0, b1), strict=True):
                    name = ref[i]["event"]
                    self.walk(ref[i]["data"], tl[j]["data"], f"sse[{name}].data", f"sse[{i}:{name}].data")
                continue
            for i in range(a0, a1):
                self.add(f"sse[{ref[i]['event']}]", f"sse[{i}:{ref[i]['event']}]", ref[i]["data"], MISSING)
            for j in range(b0, b1):
                self.add(f"sse[{tl[j]['event']}]", f"sse[{j}:{tl[j]['event']}]", MISSING, tl[j]["data"])


def _task_end_step(event: dict[str, Any]) -> Any:
    """The step a task's end belongs to: a `debug` `task_result` names it; an `updates` event (a node's or a
    task's return) belongs to the step around it (None); anything else is no task's end. (`tasks` results name
    no step, so they keep their order.)"""
    data = event.get("data")
    if event["event"] == "updates":
        return None
    if event["event"] == "debug" and isinstance(data, dict) and data.get("type") == "task_result" and "step" in data:
        return data["step"]
    return _NOT_A_TASK_END


_NOT_A_TASK_END = object()


def settled_order(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events, with each run of one step's task ends (its `updates` and `debug` `task_result` events,
    consecutive, with two or more `task_result`s of the same step: concurrent tasks) sorted by event and data.
    Everything else keeps its order, and so does a run that names no step twice (sequential nodes)."""
    out: list[dict[str, Any]] = []
    block: list[dict[str, Any]] = []
    steps: list[Any] = []

    def close() -> None:
        named = [step for step in steps if step is not None]
        concurrent = len(named) >= 2 and len(set(map(json.dumps, named))) == 1
        out.extend(sorted(block, key=lambda e: (e["event"], json.dumps(e.get("data"), sort_keys=True, default=str)))
                   if concurrent else block)
        block.clear()
        steps.clear()

    for event in events:
        step = _task_end_step(event)
        if step is _NOT_A_TASK_END or (step is not None and any(s is not None and s != step for s in steps)):
            close()
        if step is _NOT_A_TASK_END:
            out.append(event)
        else:
            block.append(event)
            steps.append(step)
    close()
    return out


def compare(session: str, reference: list[Exchange], threadline: list[Exchange]) -> list[Difference]:
    """Every difference between two recordings of one session. Exchanges are paired by step, method and
    masked path (a client may make an extra request on one server, e.g. following a `Location` header);
    an exchange only one server saw is a difference of its own (field `exchange`)."""
    out: list[Difference] = []
    ref = sorted(reference, key=lambda e: e.step)  # stable: concurrent steps of a session keep their order
    tl = sorted(threadline, key=lambda e: e.step)
    keys = difflib.SequenceMatcher(a=[(e.step, e.where) for e in ref], b=[(e.step, e.where) for e in tl],
                                   autojunk=False)
    for op, a0, a1, b0, b1 in keys.get_opcodes():
        if op == "equal":
            for a, b in zip(ref[a0:a1], tl[b0:b1], strict=True):
                out.extend(_exchange(session, a, b))
            continue
        for a in ref[a0:a1]:
            out.append(Difference(session, a.step, a.where, "exchange", f"{a.status}", MISSING))
        for b in tl[b0:b1]:
            out.append(Difference(session, b.step, b.where, "exchange", MISSING, f"{b.status}"))
    return out


def _exchange(session: str, ref: Exchange, tl: Exchange) -> list[Difference]:
    walker = _Walker(session, ref)
    if ref.status != tl.status:
        walker.add("status", "status", ref.status, tl.status)
    for name in HEADERS:
        a, b = ref.headers.get(name, MISSING), tl.headers.get(name, MISSING)
        if name == "content-type" and a != MISSING and b != MISSING:
            a, b = a.split(";")[0].strip(), b.split(";")[0].strip()  # charset parameters aside
        if a != b:
            walker.add(f"header.{name}", f"header.{name}", a, b)
    if ref.sse and tl.sse:
        walker.events(ref.body, tl.body)
    else:
        walker.walk(ref.body, tl.body, "body", "body")
    return walker.out
