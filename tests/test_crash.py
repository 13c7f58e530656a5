"""An unexpected error is a 500 JSON answer on a connection that stays usable (`threadline.api.errors.Contained`):
before, Starlette raised it again after answering, and uvicorn then closed the keep-alive connection without
`Connection: close`, so a pooled client's next request on it failed with a reset."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.conftest import serving_asgi
from threadline.api.app import create_app
from threadline.settings import Settings


def break_thread_count(application: Any) -> None:
    async def broken(**_: Any) -> int:
        raise RuntimeError("connection to 10.0.0.5 refused")

    application.state.runtime.storage.count_threads = broken


async def test_an_unexpected_error_is_a_500_json_answer_and_stays_inside(served: tuple[Any, Any],
                                                                          http: httpx.AsyncClient) -> None:
    break_thread_count(served[0])
    # httpx's ASGI transport raises what the app lets escape: before, this raised RuntimeError.
    response = await http.post("/threads/count", json={})
    assert response.status_code == 500
    assert response.json()["detail"] == "Internal server error: RuntimeError"  # no internals on the wire
    assert (await http.get("/ok")).status_code == 200


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> tuple[bytes, bytes]:
    writer.write(request)
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    return head, await reader.readexactly(length)


@pytest.mark.slow
async def test_the_connection_stays_usable_after_a_500(settings: Settings) -> None:
    application = create_app(settings)
    async with serving_asgi(application) as url:
        break_thread_count(application)
        address = urlsplit(url)
        reader, writer = await asyncio.open_connection(address.hostname, address.port)
        try:
            head, body = await _exchange(reader, writer, b"POST /threads/count HTTP/1.1\r\nHost: t\r\n"
                                         b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
            assert head.startswith(b"HTTP/1.1 500"), head
            assert b"Internal server error" in body
            # The same connection answers the next request (before: the server had closed it, unannounced).
            head, body = await _exchange(reader, writer, b"GET /ok HTTP/1.1\r\nHost: t\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), head
        finally:
            writer.close()
