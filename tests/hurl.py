"""A small replayer for the Hurl files in tests/journeys (Hurl itself cannot be installed here).

Supports what the journeys use: a request line, headers, a JSON body, `HTTP/1.1 <status>`,
`[Captures]` with `jsonpath`, and `[Asserts]` with `jsonpath "<path>" == <json value>`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import httpx

_METHOD = re.compile(r"^(GET|POST|PUT|PATCH|DELETE) (\S+)$")
_CAPTURE = re.compile(r'^(\w+): jsonpath "([^"]+)"$')
_ASSERT = re.compile(r'^jsonpath "([^"]+)" == (.+)$')


@dataclass
class Entry:
    method: str
    url: str
    headers: dict[str, str] = field(default_factory=dict)
    body: str = ""
    status: int | None = None
    captures: dict[str, str] = field(default_factory=dict)
    asserts: list[tuple[str, Any]] = field(default_factory=list)


def parse(text: str) -> list[Entry]:
    entries: list[Entry] = []
    section = "request"
    body_lines: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#"):
            continue
        if m := _METHOD.match(line):
            if entries:
                entries[-1].body = "\n".join(body_lines).strip()
            entries.append(Entry(m[1], m[2]))
            section, body_lines = "request", []
        elif not entries:
            continue
        elif line.startswith("HTTP/"):
            entries[-1].body = "\n".join(body_lines).strip()
            entries[-1].status = int(line.split()[1])
            section = "response"
        elif line in ("[Captures]", "[Asserts]"):
            section = line
        elif section == "request":
            if re.match(r"^[A-Za-z-]+: ", line) and not body_lines:
                name, value = line.split(": ", 1)
                entries[-1].headers[name] = value
            elif line or body_lines:
                body_lines.append(raw)
        elif section == "[Captures]" and (m := _CAPTURE.match(line)):
            entries[-1].captures[m[1]] = m[2]
        elif section == "[Asserts]" and (m := _ASSERT.match(line)):
            entries[-1].asserts.append((m[1], json.loads(m[2])))
    return entries


def jsonpath(doc: Any, path: str) -> Any:
    """`$.a.b` paths only: what the journeys use."""
    assert path.startswith("$"), path
    for part in [p for p in path[1:].split(".") if p]:
        doc = doc[part]
    return doc


async def replay(client: httpx.AsyncClient, text: str) -> list[httpx.Response]:
    variables: dict[str, Any] = {}
    responses = []
    for entry in parse(text):
        url = re.sub(r"\{\{(\w+)\}\}", lambda m: str(variables[m[1]]), entry.url)
        url = re.sub(r"^https?://localhost:8000", "", url)
        r = await client.request(entry.method, url, headers=entry.headers, content=entry.body or None)
        assert r.status_code == entry.status, f"{entry.method} {url}: {r.status_code} {r.text}"
        for name, path in entry.captures.items():
            variables[name] = jsonpath(r.json(), path)
        for path, expected in entry.asserts:
            assert jsonpath(r.json(), path) == expected, f"{entry.method} {url}: {path} in {r.text}"
        responses.append(r)
    return responses
