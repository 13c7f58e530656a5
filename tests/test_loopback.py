"""`langgraph_sdk.get_client()` without a URL reaches the server in-process while it serves
(threadline/api/loopback.py; tests/test_dropin_graphs.py runs an agent that calls it), and nothing once it stops.

Apart from the drop-in tests, which share one started app per module: while it runs, the loopback is wired.
"""

from __future__ import annotations


def test_loopback_is_unwired_at_shutdown() -> None:
    from langgraph_sdk import get_client
    from langgraph_sdk._shared import utilities

    from threadline.api.loopback import serving_loopback

    def app(scope, receive, send):  # type: ignore[no-untyped-def]
        raise AssertionError("not called")

    early = get_client()  # made before the server starts, as a module-level client in a graph file
    sdk_list = utilities._registered_transports
    with serving_loopback(app):
        during = get_client()
        assert early.http.client._transport.app is not None and during.http.client._transport.app is not None
        assert len(utilities._registered_transports) == len(sdk_list)  # per-call clients do not pile up
    assert utilities._registered_transports is sdk_list
    assert early.http.client._transport.app is None and during.http.client._transport.app is None
    assert get_client().http.client._transport.app is None
