"""Back-pressure on event streams: a cap on open streams per identity, a slow reader closed while its run
goes on (and a resume that gets the rest), and replay gaps counted; for SSE streams and for the protocol's
WebSocket alike."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import uuid
from typing import Any

import httpx
import orjson
import pytest
from asgi_lifespan import LifespanManager
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.conftest import PROJECT, serving, serving_asgi
from tests.services import Backend
from tests.waits import until
from threadline.api.app import create_app
from threadline.api.sse import Pump
from threadline.settings import Settings


def _settings(backend: Backend, **limits: Any) -> Settings:
    return Settings(config=str(PROJECT), workers=4, heartbeat_seconds=5.0, **backend.settings(), **limits)


async def _one_slow_disconnect(http: httpx.AsyncClient, failure: str) -> None:
    """Until `/metrics` counts one stream dropped for reading too slowly (10 s at most, else `failure`)."""
    for _ in range(200):
        if "lg_api_stream_slow_disconnects_total 1.0" in (await http.get("/metrics")).text:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(failure)


async def _wait_status(http: httpx.AsyncClient, tid: str, run_id: str, wanted: set[str]) -> dict[str, Any]:
    for _ in range(600):
        run = (await http.get(f"/threads/{tid}/runs/{run_id}")).json()
        if run["status"] in wanted:
            return run
        await asyncio.sleep(0.05)
    raise AssertionError(f"run stayed {run['status']}")


def _events(raw: bytes) -> list[tuple[str, str, bytes]]:
    """(id, event, data) of each complete SSE frame in `raw`."""
    out = []
    for block in raw.replace(b"\r\n", b"\n").split(b"\n\n")[:-1]:  # the last part may be cut off
        fields: dict[str, bytes] = {}
        for line in block.split(b"\n"):
            key, _, value = line.partition(b": ")
            fields[key.decode()] = value
        if "event" in fields:
            out.append((fields.get("id", b"").decode(), fields["event"].decode(), fields.get("data", b"")))
    return out


async def test_the_stream_cap_per_identity_refuses_one_more_stream(backend: Backend) -> None:
    async with serving(_settings(backend, max_streams_per_identity=1)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            tid = (await http.post("/threads", json={})).json()["thread_id"]
            run = (await http.post(f"/threads/{tid}/runs", json={
                "assistant_id": "slow", "input": {"tag": "cap", "steps": 100, "delay": 0.05}})).json()
            async with http.stream("GET", f"/threads/{tid}/runs/{run['run_id']}/stream") as first:
                assert first.status_code == 200
                second = await http.get(f"/threads/{tid}/runs/{run['run_id']}/stream")
                assert second.status_code == 429 and second.headers["retry-after"]
                assert "Too many open event streams" in second.json()["detail"]
                # A stream that would create a run creates none.
                created = await http.post(f"/threads/{tid}/runs/stream", json={"assistant_id": "echo"})
                assert created.status_code == 429
                assert len((await http.get(f"/threads/{tid}/runs")).json()) == 1
            await http.post(f"/threads/{tid}/runs/{run['run_id']}/cancel")
            # The first stream closed: its place is free again.
            async with http.stream("GET", f"/threads/{tid}/runs/{run['run_id']}/stream") as again:
                assert again.status_code == 200


@pytest.mark.slow  # a real socket, filled
async def test_a_slow_reader_is_closed_while_its_run_completes_and_resumes(backend: Backend) -> None:
    # 12 MB of events: a buffer larger than the default 8 MiB, so the resume finds every event still kept.
    async with serving(_settings(backend, stream_send_timeout_seconds=0.5, stream_buffer_bytes=32 << 20)) as url:
        port = int(url.rsplit(":", 1)[1])
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            tid = (await http.post("/threads", json={})).json()["thread_id"]
            steps, tag = 60, "x" * 200_000  # 60 events of 200 kB: far more than the sockets buffer
            body = orjson.dumps({"assistant_id": "slow", "input": {"tag": tag, "steps": steps, "delay": 0.01},
                                 "stream_mode": ["custom"]})
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", port))
            sock.sendall(b"POST /threads/%s/runs/stream HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (tid.encode(), len(body), body))
            try:
                # The client reads nothing; the run goes on to its end all the same.
                runs: list[Any] = await until(lambda: _runs_of(http, tid), interval=0.05, what="the run to be listed")
                run_id = runs[0]["run_id"]
                assert (await _wait_status(http, tid, run_id, {"success", "error", "timeout"}))["status"] == "success"
                await _one_slow_disconnect(http, "the slow stream was not closed")
                # What the client gets now: what was buffered, then the end of the connection.
                sock.setblocking(False)
                raw = b""
                loop = asyncio.get_running_loop()
                while True:
                    chunk = await asyncio.wait_for(loop.sock_recv(sock, 1 << 20), 30)
                    if not chunk:
                        break
                    raw += chunk
            finally:
                sock.close()
            head, _, stream = raw.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200")
            got = [e for e in _events(_dechunk(stream)) if e[1] == "custom"]
            assert len(got) < steps  # cut off before the end
            last_id = ([e[0] for e in _events(_dechunk(stream))] or ["-1"])[-1]
            resumed = []
            async with http.stream("GET", f"/threads/{tid}/runs/{run_id}/stream",
                                   headers={"Last-Event-ID": last_id}) as response:
                raw2 = b"".join([chunk async for chunk in response.aiter_raw()])
            resumed = [e for e in _events(raw2) if e[1] == "custom"]
            steps_seen = [orjson.loads(e[2])["step"] for e in got + resumed]
            assert steps_seen == list(range(steps))  # nothing lost, nothing twice


@pytest.mark.slow  # a real socket, read slowly
async def test_a_slow_reader_of_a_long_stream_does_not_grow_what_the_server_holds(backend: Backend) -> None:
    """A client reads, over a real socket and a little at a time, a stream 48 times the run's byte budget
    (and more than the kernel's socket buffers hold), whose run ended long before: what the server holds for
    it stays within its bounds the whole time (the run's buffer, `stream_buffer_bytes`; the stream's
    read-ahead, as `/metrics` reports it), the stream is
    not closed (no send timeout), and what arrives is in order and ends with the run's last event."""
    budget, steps, size = 256 * 1024, 300, 40_000  # 12 MB of events
    app = create_app(_settings(backend, stream_buffer_bytes=budget, stream_send_timeout_seconds=0))
    async with serving_asgi(app) as url:
        broker = app.state.runtime.broker
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            tid = (await http.post("/threads", json={})).json()["thread_id"]
            body = orjson.dumps({"assistant_id": "slow", "input": {"tag": "x" * size, "steps": steps, "delay": 0.001},
                                 "stream_mode": ["custom"]})
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", int(url.rsplit(":", 1)[1])))
            sock.setblocking(False)
            loop = asyncio.get_running_loop()
            await loop.sock_sendall(sock, b"POST /threads/%s/runs/stream HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
                                    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                                    % (tid.encode(), len(body), body))
            raw, run_id, held, ahead = b"", "", [], []
            try:
                while chunk := await asyncio.wait_for(loop.sock_recv(sock, 16384), 30):
                    raw += chunk
                    if not run_id and b"event: metadata" in raw:
                        run_id = (await http.get(f"/threads/{tid}/runs")).json()[0]["run_id"]
                        # The run goes to its end while the client has read next to nothing.
                        assert (await _wait_status(http, tid, run_id, {"success", "error"}))["status"] == "success"
                    if run_id and len(raw) // 16384 % 8 == 0:  # now and then, what the server holds
                        held.append(await broker.buffered_bytes(run_id))
                        metrics = (await http.get("/metrics")).text
                        ahead.append(float(re.search(r"^lg_api_stream_read_ahead_bytes (\S+)$", metrics, re.M)[1]))
                    await asyncio.sleep(0.002)  # the reader's pace: slow
            finally:
                sock.close()
    event = len(orjson.dumps({"tag": "x" * size, "step": steps})) + 200
    assert len(held) > 50 and max(held) <= budget + event, max(held)
    assert 0 < max(ahead) <= Pump.max_bytes + event, max(ahead)  # read ahead, and no more than its bound
    head, _, stream = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    got = [orjson.loads(e[2])["step"] for e in _events(_dechunk(stream)) if e[1] == "custom"]
    assert got == sorted(set(got)) and got[-1] == steps - 1  # in order, to the end (what was dropped, skipped)


def _dechunk(body: bytes) -> bytes:
    """An HTTP/1.1 chunked body (possibly cut off) as its bytes."""
    out, rest = b"", body
    while rest:
        size_line, sep, rest = rest.partition(b"\r\n")
        if not sep:
            break
        try:
            size = int(size_line, 16)
        except ValueError:
            break
        if size == 0:
            break
        out += rest[:size]
        rest = rest[size + 2:]
    return out


async def test_a_resume_past_the_buffer_counts_a_replay_gap(backend: Backend) -> None:
    app = create_app(_settings(backend, stream_buffer_events=5))
    async with LifespanManager(app, startup_timeout=30, shutdown_timeout=30) as manager:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=manager.app), base_url="http://t",
                                     timeout=30) as http:
            tid = (await http.post("/threads", json={})).json()["thread_id"]
            async with http.stream("POST", f"/threads/{tid}/runs/stream", json={
                    "assistant_id": "slow", "input": {"tag": "g", "steps": 3, "delay": 0},
                    "stream_mode": ["custom"]}) as response:
                first = [e for e in _events(b"".join([c async for c in response.aiter_raw()]))]
            run_id = (await http.get(f"/threads/{tid}/runs")).json()[0]["run_id"]
            # Resuming from the last event: nothing was dropped after it.
            await http.get(f"/threads/{tid}/runs/{run_id}/stream", headers={"Last-Event-ID": first[-1][0]})
            assert "lg_api_stream_replay_gaps_total 0.0" in (await http.get("/metrics")).text
            async with http.stream("POST", f"/threads/{tid}/runs/stream", json={
                    "assistant_id": "slow", "input": {"tag": "g2", "steps": 12, "delay": 0},
                    "stream_mode": ["custom"]}) as response:
                second = [e for e in _events(b"".join([c async for c in response.aiter_raw()]))]
            run_id = (await http.get(f"/threads/{tid}/runs")).json()[0]["run_id"]
            # Resuming from its first event: the buffer of 5 no longer holds what came next.
            await http.get(f"/threads/{tid}/runs/{run_id}/stream", headers={"Last-Event-ID": second[0][0]})
            assert "lg_api_stream_replay_gaps_total 1.0" in (await http.get("/metrics")).text


def _ws_url(url: str, tid: str) -> str:
    return url.replace("http", "ws", 1) + f"/threads/{tid}/stream/events"


async def test_the_stream_cap_counts_protocol_websockets(backend: Backend) -> None:
    async with serving(_settings(backend, max_streams_per_identity=1)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            tid = (await http.post("/threads", json={})).json()["thread_id"]
            async with connect(_ws_url(url, tid)) as ws:
                await ws.send(json.dumps({"id": 1, "method": "subscription.subscribe",
                                          "params": {"channels": ["lifecycle"]}}))
                assert json.loads(await ws.recv())["type"] == "success"
                # A second socket, or an SSE stream, of the same client is one stream too many.
                with pytest.raises(InvalidStatus) as refused:
                    async with connect(_ws_url(url, tid)):
                        pass
                response = refused.value.response
                assert response.status_code == 429 and response.headers["retry-after"]
                assert "Too many open event streams" in json.loads(response.body or b"{}")["detail"]
                sse = await http.post(f"/threads/{tid}/stream/events", json={"channels": ["lifecycle"]})
                assert sse.status_code == 429
                # The open socket still works.
                await ws.send(json.dumps({"id": 2, "method": "run.start", "params": {"assistant_id": "counter",
                                                                                    "input": {}}}))
                assert json.loads(await ws.recv())["type"] == "success"
            # Closed: its place is free again, once the server has seen the close and given the place back to
            # the broker (a round trip of its own after the client's close returns).
            async def reconnects() -> bool:
                try:
                    async with connect(_ws_url(url, tid)) as again:
                        await again.send(json.dumps({"id": 1, "method": "agent.getTree", "params": {}}))
                        return bool(json.loads(await again.recv())["type"] == "success")
                except InvalidStatus as still:
                    assert still.response.status_code == 429
                    return False
            await until(reconnects, interval=0.05, what="a socket accepted once the first one closed")


@pytest.mark.slow  # a real socket, filled
async def test_a_websocket_that_stops_reading_is_dropped_while_its_run_completes_and_resumes(
        backend: Backend) -> None:
    async with serving(_settings(backend, stream_send_timeout_seconds=0.5)) as url:
        port = int(url.rsplit(":", 1)[1])
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            tid = str(uuid.uuid4())
            steps, tag = 40, "x" * 200_000  # 40 events of 200 kB: far more than the sockets buffer
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", port))
            got: list[dict[str, Any]] = []
            async with connect(_ws_url(url, tid), sock=sock, max_queue=1, max_size=None, compression=None) as ws:
                await ws.send(json.dumps({"id": 1, "method": "subscription.subscribe",
                                          "params": {"channels": ["custom"]}}))
                assert json.loads(await ws.recv())["type"] == "success"
                started = (await http.post(f"/threads/{tid}/commands", json={
                    "id": 1, "method": "run.start",
                    "params": {"assistant_id": "slow", "input": {"tag": tag, "steps": steps, "delay": 0.01}}})).json()
                run_id = started["result"]["run_id"]
                # The client reads nothing; the run goes on to its end all the same.
                assert (await _wait_status(http, tid, run_id, {"success", "error", "timeout"}))["status"] == "success"
                await _one_slow_disconnect(http, "the socket that stopped reading was not dropped")
                # What the client gets now: what was buffered, then the end of the connection.
                with pytest.raises(ConnectionClosed):
                    while True:
                        got.append(json.loads(await asyncio.wait_for(ws.recv(), 30)))
            assert len(got) < steps  # cut off before the end
            last = got[-1]["seq"] if got else 0
            async with connect(_ws_url(url, tid), max_size=None) as again:
                await again.send(json.dumps({"id": 1, "method": "subscription.subscribe",
                                             "params": {"channels": ["custom"], "since": last}}))
                answer = json.loads(await again.recv())
                rest = [json.loads(await again.recv()) for _ in range(answer["result"]["replayed_events"])]
            seen = [frame["params"]["data"]["payload"]["step"] for frame in got + rest]
            assert seen == list(range(steps))  # nothing lost, nothing twice


async def _runs_of(http: httpx.AsyncClient, tid: str) -> list[Any]:
    return list((await http.get(f"/threads/{tid}/runs")).json())
