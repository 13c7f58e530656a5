"""Sending a finished run to its `webhook`: over HTTP, or to this server's own app for a relative URL."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from threadline.core.webhook_policy import WebhookGuard
from threadline.serde import dumps
from threadline.tracing import tracer

log = logging.getLogger("threadline.webhooks")

# POSTs a JSON body, with headers, to a path of this server's own app (the API layer wires it at startup).
LocalPost = Callable[[str, bytes, dict[str, str]], Awaitable[int]]


class Webhooks:
    """Where finished runs are announced. A webhook failure never fails the run: it is logged.

    An absolute `http(s)://` URL is POSTed over the network. A relative one (`/hooks/run-done`) is POSTed
    in-process to this server's app, as LangGraph's server does, so a project's `http.app` route receives it
    without a network hop; `local` is that app, set by the API layer when the server starts (until then, or
    in a worker-only process, relative webhooks are logged and dropped). `enabled=False` is langgraph.json's
    `http.disable_webhooks`: runs still run, no webhook is sent. `headers` (langgraph.json `webhooks.headers`,
    its `${{ env.VAR }}` already filled in) go with every POST, relative or absolute, as on LangGraph's server;
    with `fields` (`webhooks.allowed_fields`) the payload keeps only those keys.
    """

    def __init__(self, *, enabled: bool = True, timeout: float = 10.0, guard: WebhookGuard | None = None,
                 headers: dict[str, str] | None = None, fields: Iterable[str] | None = None) -> None:
        self.enabled = enabled
        self.headers = dict(headers or {})
        self.fields = frozenset(fields or ())  # `webhooks.allowed_fields`: the payload's keys kept (empty: all)
        self.guard = guard  # langgraph.json `webhooks.url`: checked at run creation and again before a POST
        self.timeout = timeout
        self.local: LocalPost | None = None
        self._sending: set[asyncio.Task[None]] = set()

    def send(self, url: str, payload: Any) -> None:
        """Send in the background (a slow receiver must not hold the worker slot)."""
        if not self.enabled:
            return
        if self.fields and isinstance(payload, dict):
            payload = {key: value for key, value in payload.items() if key in self.fields}
        task = asyncio.create_task(self._post(url, dumps(payload)), name="threadline-webhook")
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _post(self, url: str, body: bytes) -> None:
        try:
            if url.startswith("/"):
                if self.local is None:
                    raise RuntimeError("relative webhook, but no app serves this process")
                async with asyncio.timeout(self.timeout):
                    status = await self.local(url, body, self.headers)
            else:
                import httpx

                if self.guard is not None:
                    await self.guard.check(url)  # the name may resolve elsewhere now than at creation
                with tracer().span("threadline.webhook", {"url.full": url, "http.request.method": "POST"},
                                   client=True):
                    headers = {**self.headers, "content-type": "application/json"}
                    tracer().inject(headers)  # the receiver continues the run's trace
                    async with httpx.AsyncClient(timeout=self.timeout) as client:
                        status = (await client.post(url, content=body, headers=headers)).status_code
                    tracer().annotate({"http.response.status_code": status})
            if status >= 400:
                log.warning("webhook %s answered %d", url, status)
        except Exception as exc:  # noqa: BLE001 - a webhook failure never fails the run
            log.warning("webhook %s failed: %s", url, exc)

    async def close(self) -> None:
        """Let webhooks in flight finish (each is bounded by `timeout`)."""
        if self._sending:
            await asyncio.gather(*self._sending, return_exceptions=True)
