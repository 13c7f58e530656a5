"""`langgraph_sdk.get_client()` without a URL reaches the server in-process while it serves
(threadline/api/loopback.py; tests/test_dropin_graphs.py runs an agent that calls it), and nothing once it stops.

Apart from the drop-in tests, which share one started app per module: while it runs, the loopback is wired.
"""

from __future__ import annotations

from typing import Any

import httpx
from langgraph_sdk.client import LangGraphClient


def _app(client: LangGraphClient) -> Any:
    """The app a loopback client's transport points at (None: none)."""
    transport = client.http.client._transport
    assert isinstance(transport, httpx.ASGITransport)  # the SDK's loopback transport, for a client with no URL
    return transport.app


def test_loopback_is_unwired_at_shutdown() -> None:
    from langgraph_sdk import get_client
    from langgraph_sdk._shared import utilities

    from threadline.api.loopback import serving_loopback

    def app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("not called")

    early = get_client()  # made before the server starts, as a module-level client in a graph file
    sdk_list = utilities._registered_transports
    with serving_loopback(app):
        during = get_client()
        assert _app(early) is not None and _app(during) is not None
        assert len(utilities._registered_transports) == len(sdk_list)  # per-call clients do not pile up
    assert utilities._registered_transports is sdk_list
    assert _app(early) is None and _app(during) is None
    assert _app(get_client()) is None
