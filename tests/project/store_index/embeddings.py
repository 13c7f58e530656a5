"""A tiny deterministic fake embedding for the store's semantic-search tests: letter counts a..z."""

from __future__ import annotations

import math

DIMS = 26


def embed(texts: list[str]) -> list[list[float]]:
    """Bag-of-letters vectors, L2-normalised, so texts sharing letters are close (cosine)."""
    out = []
    for text in texts:
        vec = [0.0] * DIMS
        for ch in text.lower():
            if "a" <= ch <= "z":
                vec[ord(ch) - ord("a")] += 1.0
        norm = math.sqrt(sum(v * v for v in vec)) or 1.0
        out.append([v / norm for v in vec])
    return out
