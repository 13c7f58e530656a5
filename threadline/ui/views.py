"""What the console's templates draw, shaped from the API's JSON: chat bubbles, interrupts, namespace trees."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

ROLES = {"human": "human", "user": "human", "ai": "ai", "assistant": "ai", "AIMessageChunk": "ai",
         "tool": "tool", "system": "system"}


@dataclass
class Bubble:
    role: str  # human, ai, tool, system, other
    text: str
    name: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    tool_call_id: str = ""


def _text(content: Any) -> str:
    """A message's content as text: a string, or the text blocks of a list of content blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, dict) and block.get("type") == "text":
                parts.append(str(block.get("text", "")))
            else:
                parts.append(json.dumps(block, default=str))
        return "\n".join(parts)
    return "" if content is None else json.dumps(content, default=str)


def _clip(text: str, limit: int = 240) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def chat_messages(values: Any) -> list[Bubble]:
    """The `messages` of a thread's state values as chat bubbles (none when the state has no messages)."""
    messages = values.get("messages") if isinstance(values, dict) else None
    if not isinstance(messages, list):
        return []
    out = []
    for msg in messages:
        if not isinstance(msg, dict):
            out.append(Bubble("other", _text(msg)))
            continue
        role = ROLES.get(str(msg.get("type") or msg.get("role") or ""), "other")
        calls = [{"name": c.get("name", ""), "id": c.get("id", ""),
                  "args": _clip(json.dumps(c.get("args", {}), ensure_ascii=False, default=str))}
                 for c in msg.get("tool_calls") or [] if isinstance(c, dict)]
        out.append(Bubble(role, _text(msg.get("content")), str(msg.get("name") or ""), calls,
                          str(msg.get("tool_call_id") or "")))
    return out


def interrupts_of(state: Any) -> list[dict[str, Any]]:
    """The pending interrupts in a thread state: each with its value, id and the task that raised it."""
    found = []
    for task in (state or {}).get("tasks") or []:
        for item in task.get("interrupts") or []:
            found.append({"task": task.get("name", ""), "id": item.get("id") or item.get("interrupt_id", ""),
                          "value": item.get("value")})
    if not found:
        for item in (state or {}).get("interrupts") or []:
            found.append({"task": "", "id": item.get("id", ""), "value": item.get("value")})
    return found


@dataclass
class Namespace:
    label: str
    path: list[str]
    children: list[Namespace] = field(default_factory=list)


def namespace_tree(namespaces: Any) -> list[Namespace]:
    """`POST /store/namespaces`'s list of namespaces as a tree of their labels."""
    root = Namespace("", [])
    for ns in namespaces or []:
        node = root
        for i, label in enumerate(ns):
            child = next((c for c in node.children if c.label == label), None)
            if child is None:
                child = Namespace(str(label), [str(p) for p in ns[: i + 1]])
                node.children.append(child)
            node = child
    return root.children
