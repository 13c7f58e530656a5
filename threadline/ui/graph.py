"""A graph from `/assistants/{id}/graph` laid out for SVG: nodes in layers top to bottom, edges between them.

Layers by longest path from the start, ignoring the edges that close a cycle (a tool loop draws back up).
Nodes from an xray'd subgraph (`parent:child`) are framed together under their parent's name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

NODE_H = 34
LAYER_GAP = 70
NODE_GAP = 28
CHAR_W = 7.5
MARGIN = 48


@dataclass
class Box:
    id: str
    label: str
    x: float
    y: float
    w: float
    h: float = NODE_H
    kind: str = "node"  # "start", "end", "node"


@dataclass
class Line:
    source: str
    target: str
    path: str
    conditional: bool
    label: str = ""
    back: bool = False


@dataclass
class Frame:
    label: str
    x: float
    y: float
    w: float
    h: float


@dataclass
class Layout:
    width: float
    height: float
    boxes: list[Box] = field(default_factory=list)
    lines: list[Line] = field(default_factory=list)
    frames: list[Frame] = field(default_factory=list)


def _back_edges(ids: list[str], edges: list[tuple[str, str]]) -> set[tuple[str, str]]:
    """The edges that close a cycle in a depth-first walk from the sources (then from any node left)."""
    out: dict[str, list[str]] = {i: [] for i in ids}
    for s, t in edges:
        out.setdefault(s, []).append(t)
    state: dict[str, int] = {}
    back: set[tuple[str, str]] = set()
    incoming = {t for _, t in edges}
    roots = [i for i in ids if i not in incoming] + ids
    for root in roots:
        if root in state:
            continue
        stack: list[tuple[str, int]] = [(root, 0)]
        state[root] = 1
        while stack:
            node, i = stack.pop()
            targets = out.get(node, [])
            if i < len(targets):
                stack.append((node, i + 1))
                t = targets[i]
                if state.get(t) == 1:
                    back.add((node, t))
                elif t not in state:
                    state[t] = 1
                    stack.append((t, 0))
            else:
                state[node] = 2
    return back


def layout(graph: dict[str, Any]) -> Layout:
    nodes = [n for n in graph.get("nodes") or [] if isinstance(n, dict) and "id" in n]
    ids = [str(n["id"]) for n in nodes]
    known = set(ids)
    edges = [(str(e["source"]), str(e["target"]), bool(e.get("conditional")), str(e.get("data") or ""))
             for e in graph.get("edges") or [] if e.get("source") in known and e.get("target") in known]
    back = _back_edges(ids, [(s, t) for s, t, _, _ in edges])
    layer = {i: 0 for i in ids}
    forward = [(s, t) for s, t, _, _ in edges if (s, t) not in back and s != t]
    for _ in range(len(ids)):  # longest path; the forward edges are acyclic, so this settles
        changed = False
        for s, t in forward:
            if layer[t] < layer[s] + 1:
                layer[t] = layer[s] + 1
                changed = True
        if not changed:
            break
    rows: dict[int, list[str]] = {}
    for i in ids:
        rows.setdefault(layer[i], []).append(i)
    widths = {i: max(80.0, len(_label(i)) * CHAR_W + 24) for i in ids}
    row_w = {r: sum(widths[i] for i in row) + NODE_GAP * (len(row) - 1) for r, row in rows.items()}
    width = max(row_w.values(), default=100) + 2 * MARGIN
    boxes: dict[str, Box] = {}
    for r, row in sorted(rows.items()):
        x = (width - row_w[r]) / 2
        for i in row:
            kind = "start" if i == "__start__" else "end" if i == "__end__" else "node"
            boxes[i] = Box(i, _label(i), x, MARGIN + r * (NODE_H + LAYER_GAP), widths[i], kind=kind)
            x += widths[i] + NODE_GAP
    height = MARGIN * 2 + (max(rows, default=0) + 1) * (NODE_H + LAYER_GAP) - LAYER_GAP
    out = Layout(width, height, list(boxes.values()))
    for s, t, conditional, label in edges:
        out.lines.append(_line(boxes[s], boxes[t], conditional, label, (s, t) in back or s == t, width))
    out.frames = _frames(boxes)
    return out


def _label(node_id: str) -> str:
    return node_id.rsplit(":", 1)[-1] if ":" in node_id else node_id


def _line(a: Box, b: Box, conditional: bool, label: str, back: bool, width: float) -> Line:
    ax, bx = a.x + a.w / 2, b.x + b.w / 2
    if back:  # around the outside, on the side the source is nearer, into the target's side
        if ax < width / 2:
            x, sx, tx = min(a.x, b.x) - 30, a.x, b.x
        else:
            x, sx, tx = max(a.x + a.w, b.x + b.w) + 30, a.x + a.w, b.x + b.w
        path = (f"M{sx:.0f},{a.y + a.h / 2:.0f} C{x:.0f},{a.y + a.h / 2:.0f} {x:.0f},{b.y + b.h / 2:.0f} "
                f"{tx:.0f},{b.y + b.h / 2:.0f}")
    else:
        y1, y2 = a.y + a.h, b.y
        mid = (y1 + y2) / 2
        path = f"M{ax:.0f},{y1:.0f} C{ax:.0f},{mid:.0f} {bx:.0f},{mid:.0f} {bx:.0f},{y2:.0f}"
    return Line(a.id, b.id, path, conditional, label if label not in ("None", a.id, b.id) else "", back)


def _frames(boxes: dict[str, Box]) -> list[Frame]:
    groups: dict[str, list[Box]] = {}
    for box in boxes.values():
        if ":" in box.id:
            groups.setdefault(box.id.rsplit(":", 1)[0], []).append(box)
    frames = []
    for name, members in sorted(groups.items()):
        x1 = min(b.x for b in members) - 10
        y1 = min(b.y for b in members) - 22
        x2 = max(b.x + b.w for b in members) + 10
        y2 = max(b.y + b.h for b in members) + 10
        frames.append(Frame(name, x1, y1, x2 - x1, y2 - y1))
    return frames
