"""Semantic search in the store on a PostgreSQL without pgvector: an exact scan.

LangGraph's AsyncPostgresStore searches by meaning only through pgvector. Where the server lacks the
extension, ExactScanStore runs LangGraph's store *without* `index` (items, TTL, filters and namespaces
stay LangGraph's own) and adds the index at `abatch`, the one door every store method, sync or async,
and a graph's `get_store()` go through:

- put: the configured `fields`, or the put's own `index` list, are embedded with the configured `embed`
  (field names as LangGraph gives them: "text", "tags.0", ...) and kept as double precision[] in
  threadline_store_vectors (migration 0002). They replace the item's previous vectors; `index=False`
  leaves the item unindexed; a delete removes them.
- search with `query`: LangGraph's own search (prefix, filter, expiry) lists the candidates, then
  PostgreSQL scores each candidate's vectors against the query and ranks the items by their best field,
  as LangGraph's pgvector search does (cosine unless `distance_type` says otherwise; items without
  vectors are left out; TTLs of the items returned are refreshed). A search without `query` is
  LangGraph's, untouched.

Cost: a semantic search reads every item under the prefix that passes the filter and takes one dot
product per vector of theirs: O(items under the prefix), no index to prune it. Fine for thousands of
items per prefix; past that, install pgvector, and `postgres_store` uses LangGraph's pgvector search.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from langgraph.store.base import (
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    ensure_embeddings,
    get_text_at_path,
    tokenize_path,
)
from langgraph.store.postgres.aio import AsyncPostgresStore
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from threadline.errors import ConfigError

VectorIndex = Literal["pgvector", "exact_scan"]
ItemId = tuple[str, str]  # (prefix, key): LangGraph's primary key of a store item
FieldId = tuple[str, str, str]  # (prefix, key, field name)

_EVERY = 2**63 - 1  # a LIMIT that keeps every candidate

# The similarity LangGraph's pgvector search reports, from the dot product `d.dot` and the lengths of
# the stored vector (`v.norm`) and the query (`%(norm)s`); higher is closer.
_SCORES = {
    "cosine": "coalesce(d.dot / nullif(v.norm * %(norm)s, 0), 0)",
    "inner_product": "d.dot",
    "l2": "-sqrt(greatest(v.norm * v.norm + %(norm)s * %(norm)s - 2 * d.dot, 0))",
}
_RANK = """
WITH candidate AS (
    SELECT * FROM unnest(%(prefixes)s::text[], %(keys)s::text[]) WITH ORDINALITY AS c(prefix, key, n)
), ranked AS (
    SELECT c.prefix, c.key, max({score}) AS score, min(c.n) AS n
    FROM candidate c
    JOIN threadline_store_vectors v ON v.prefix = c.prefix AND v.key = c.key
    CROSS JOIN LATERAL (SELECT sum(a * b) AS dot FROM unnest(v.embedding, %(query)s::float8[]) AS e(a, b)) d
    GROUP BY c.prefix, c.key
    ORDER BY score DESC, n
    LIMIT %(limit)s OFFSET %(offset)s
), refreshed AS (
    UPDATE store s SET expires_at = now() + (s.ttl_minutes || ' minutes')::interval
    FROM ranked r
    WHERE %(refresh)s AND s.prefix = r.prefix AND s.key = r.key AND s.ttl_minutes IS NOT NULL
)
SELECT prefix, key, score FROM ranked ORDER BY score DESC, n
"""
# Ties keep the order of LangGraph's plain search (most recently updated first): pages are stable.
_RANK_BY = {distance: _RANK.format(score=score) for distance, score in _SCORES.items()}
_LOCK_ITEMS = """
SELECT s.prefix, s.key, s.value = p.value AS ours
FROM store s JOIN unnest(%s::text[], %s::text[], %s::jsonb[]) AS p(prefix, key, value)
    ON s.prefix = p.prefix AND s.key = p.key
ORDER BY s.prefix, s.key
FOR UPDATE OF s
"""
_DELETE_VECTORS = """
DELETE FROM threadline_store_vectors v USING unnest(%s::text[], %s::text[]) AS d(prefix, key)
WHERE v.prefix = d.prefix AND v.key = d.key
"""
_INSERT_VECTOR = ("INSERT INTO threadline_store_vectors (prefix, key, field_name, embedding, norm) "
                  "VALUES (%s, %s, %s, %s, %s)")
_DELETE_ORPHANS = """
DELETE FROM threadline_store_vectors v
WHERE NOT EXISTS (SELECT 1 FROM store s WHERE s.prefix = v.prefix AND s.key = v.key)
"""


def postgres_store(pool: AsyncConnectionPool[Any], *, index: dict[str, Any] | None, ttl: dict[str, Any] | None,
                   pgvector: bool) -> tuple[AsyncPostgresStore, VectorIndex | None]:
    """LangGraph's store over `pool`, and how it searches by meaning: pgvector, exact scan, or not at all."""
    if not index:
        return AsyncPostgresStore(pool, ttl=ttl), None  # type: ignore[arg-type]
    if pgvector:
        return AsyncPostgresStore(pool, index=index, ttl=ttl), "pgvector"  # type: ignore[arg-type]
    return ExactScanStore(pool, index=index, ttl=ttl), "exact_scan"


class ExactScanStore(AsyncPostgresStore):
    """LangGraph's PostgreSQL store, plus semantic search by exact scan for servers without pgvector."""

    def __init__(self, pool: AsyncConnectionPool, *, index: dict[str, Any], ttl: dict[str, Any] | None = None) -> None:
        super().__init__(pool, ttl=ttl)  # type: ignore[arg-type]  # no `index`: LangGraph would need pgvector
        self._pool = pool
        self._embeddings = ensure_embeddings(index.get("embed"))
        self._dims: int | None = index.get("dims")
        self._distance = index.get("distance_type", "cosine")
        if self._distance not in _SCORES:
            raise ConfigError(f"store.index.distance_type {self._distance!r}: use one of {', '.join(_SCORES)}")
        fields = index.get("fields") or ["$"]
        fields = [fields] if isinstance(fields, str) else fields
        # As LangGraph reads `fields`: "$" is the whole value, anything else a path into it.
        self._fields = [(path, path if path == "$" else tokenize_path(path)) for path in fields]

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        ops = list(ops)
        searches = {i: op for i, op in enumerate(ops) if isinstance(op, SearchOp) and op.query}
        puts = {(_prefix(op.namespace), op.key): op for op in ops if isinstance(op, PutOp)}  # the last put wins
        if not searches and not puts:
            return await super().abatch(ops)
        # Embed first, as LangGraph does: if the embedder fails, the batch writes nothing.
        fields, texts = self._texts(puts)
        vectors = await self._embed([*texts, *(str(op.query) for op in searches.values())])
        # One batch for LangGraph: the other ops as they are, each semantic search as the plain search
        # listing its candidates. Its reads run before its puts, so ranking reads the vectors before ours.
        results = await super().abatch([_candidates(searches[i]) if i in searches else op for i, op in enumerate(ops)])
        for (i, op), query in zip(searches.items(), vectors[len(texts):], strict=True):
            results[i] = await self._rank(op, results[i], query)
        if puts:
            await self._index(puts, dict(zip(fields, vectors[:len(texts)], strict=True)))
        return results

    async def sweep_ttl(self) -> int:
        """LangGraph's sweep of expired items, then of the vectors they leave behind."""
        swept = await super().sweep_ttl()
        if swept:
            async with self._pool.connection() as conn:
                await conn.execute(_DELETE_ORPHANS)
        return swept

    def _texts(self, puts: dict[ItemId, PutOp]) -> tuple[list[FieldId], list[str]]:
        """Each text to embed for these puts, and the field it is stored under (named as LangGraph does)."""
        fields: list[FieldId] = []
        texts: list[str] = []
        for (prefix, key), op in puts.items():
            if op.value is None or op.index is False:
                continue
            paths = self._fields if op.index is None else [(path, tokenize_path(path)) for path in op.index]
            for path, tokens in paths:
                found = get_text_at_path(op.value, tokens)
                for n, text in enumerate(found):
                    fields.append((prefix, key, f"{path}.{n}" if len(found) > 1 else path))
                    texts.append(text)
        return fields, texts

    async def _embed(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        vectors = await self._embeddings.aembed_documents(texts)
        for vector in vectors:
            if self._dims is not None and len(vector) != self._dims:
                raise ValueError(f"the embedding has {len(vector)} dimensions, store.index.dims says {self._dims}")
        return [[float(x) for x in vector] for vector in vectors]

    async def _rank(self, op: SearchOp, candidates: Any, query: list[float]) -> list[SearchItem]:
        """The candidates with vectors, closest first, the page of them `op` asks for."""
        if not candidates:
            return []
        found = {(_prefix(item.namespace), item.key): item for item in candidates}
        params = {"prefixes": [p for p, _ in found], "keys": [k for _, k in found], "query": query,
                  "norm": math.sqrt(sum(x * x for x in query)), "limit": op.limit, "offset": op.offset,
                  "refresh": bool(op.refresh_ttl)}
        async with self._pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(_RANK_BY[self._distance], params)
            rows = await cur.fetchall()
        ranked = []
        for row in rows:
            item = found[(row["prefix"], row["key"])]
            ranked.append(SearchItem(namespace=item.namespace, key=item.key, value=item.value,
                                     created_at=item.created_at, updated_at=item.updated_at,
                                     score=float(row["score"])))
        return ranked

    async def _index(self, puts: dict[ItemId, PutOp], vectors: dict[FieldId, list[float]]) -> None:
        """Replace the vectors of the items these puts wrote or deleted with the ones just embedded.

        Another process may have written one of those items since: its row is locked and its value
        compared with ours, so an item's vectors are always those of the value it holds."""
        ids = list(puts)
        async with self._pool.connection() as conn, conn.transaction():
            async with conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(_LOCK_ITEMS, ([p for p, _ in ids], [k for _, k in ids],
                                                [_jsonb(puts[i].value) for i in ids]))
                stored = {(row["prefix"], row["key"]): row["ours"] for row in await cur.fetchall()}
            # Ours to index: items still holding the value we put, and items we deleted that stay deleted.
            mine = {i for i in ids if (stored.get(i) is True if puts[i].value is not None else i not in stored)}
            await conn.execute(_DELETE_VECTORS, ([p for p, _ in mine], [k for _, k in mine]))
            rows = [(p, k, name, v, math.sqrt(sum(x * x for x in v)))
                    for (p, k, name), v in vectors.items() if (p, k) in mine]
            if rows:
                async with conn.cursor() as cur:
                    await cur.executemany(_INSERT_VECTOR, rows)


def _candidates(op: SearchOp) -> SearchOp:
    """The plain search listing every item the semantic search `op` ranks."""
    return op._replace(query=None, limit=_EVERY, offset=0, refresh_ttl=False)


def _prefix(namespace: tuple[str, ...]) -> str:
    return ".".join(namespace)  # how LangGraph's `store.prefix` column spells a namespace


def _jsonb(value: Mapping[str, Any] | None) -> Jsonb | None:
    return None if value is None else Jsonb(dict(value))  # as LangGraph writes it, so the two compare equal
