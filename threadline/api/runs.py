"""Runs on both path families: LangGraph's thread-scoped paths and the Agent Protocol's `/runs` paths."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from uuid import UUID

from fastapi import Header, Query, Request
from starlette.responses import Response

from threadline.api.bounds import INT_MAX
from threadline.api.common import JSON, Router, no_content, runtime, select, spec_run_out
from threadline.api.http_config import with_run_headers
from threadline.api.models import RunCancelMany, RunCreate, RunSearch
from threadline.api.ratelimit import identity_of
from threadline.api.sse import event_response, stream_slot
from threadline.api.waits import KeptAliveJSON
from threadline.broker.leases import Release
from threadline.core.runtime import Runtime
from threadline.errors import ClientGone, InvalidInput, NotFound
from threadline.shapes import CancelAction, RunStatus, run_out
from threadline.storage.base import JsonRead
from threadline.storage.records import RunRecord

router = Router(tags=["Runs"])


def _run_path(run: Mapping[str, Any]) -> str:
    return f"/threads/{run['thread_id']}/runs/{run['run_id']}"


def _wait_headers(run: RunRecord) -> dict[str, str]:
    """Where a wait for `run` can be resumed (langgraph-sdk reconnects to `Location` if the answer is cut off)."""
    return {"Content-Location": _run_path(run), "Location": f"{_run_path(run)}/join"}


async def _create(rt: Runtime, thread_id: str | None, body: RunCreate, *, waited: bool = False,
                  identity: str | None = None) -> RunRecord:
    """A run on the path's thread, else on the body's `thread_id` (the Agent Protocol), else stateless.

    `waited`: this request waits for the run (`/wait`, `/stream`), so it may start on this process at once."""
    data = with_run_headers(body.core_body())  # langgraph.json http.configurable_headers
    body_thread = data.pop("thread_id", None)
    return await rt.runs.create(thread_id or (str(body_thread) if body_thread else None), data, start_here=waited,
                                identity=identity)


def _stream(rt: Runtime, run: RunRecord, *, last_event_id: str | None = None, replay: bool = True,
            cancel_on_disconnect: bool = False, path: str | None = None, modes: list[str] | None = None,
            slot: Release | None = None) -> Response:
    """`path`: the run's own path, as `Content-Location` (default: its thread-scoped path). `modes`: a join's
    `stream_mode`, the only modes it sends."""
    path = path or _run_path(run)

    async def disconnect() -> None:
        await rt.runs.stop(run["run_id"], action="interrupt")

    return event_response(
        batches=rt.runs.stream_batches(run["run_id"], last_event_id=last_event_id, replay=replay, modes=modes),
        heartbeat=rt.settings.heartbeat_seconds,
        headers={"Location": f"{path}/stream", "Content-Location": path},
        on_disconnect=disconnect if cancel_on_disconnect else None, draining=rt.draining, slot=slot,
    )


async def _released_on_error(slot: Release | None, creating: Awaitable[RunRecord]) -> RunRecord:
    try:
        return await creating
    except BaseException:
        if slot is not None:
            await slot()
        raise


async def wait_done(request: Request, rt: Runtime, run: RunRecord, *, cancel_on_disconnect: bool,
                    output: JsonRead = True) -> RunRecord:
    """The finished run (its output read as `output` says, if it is read from storage: `Runs.wait`). A client
    that leaves first cancels the run when `cancel_on_disconnect`.

    The endpoint is not cancelled when its client leaves (only streams are), so the disconnect is watched.
    """
    waiting = asyncio.create_task(rt.runs.wait(run["run_id"], output=output))
    leaving = asyncio.create_task(_disconnected(request))
    try:
        await asyncio.wait([waiting, leaving], return_when=asyncio.FIRST_COMPLETED)
    finally:
        leaving.cancel()
        if not waiting.done():
            waiting.cancel()
    if not waiting.done():
        if cancel_on_disconnect:
            await rt.runs.stop(run["run_id"], action="interrupt")
        raise ClientGone()
    done = waiting.result()
    if done is None:
        raise NotFound(f"Run {run['run_id']} was rolled back")
    return done


def _waited(request: Request, rt: Runtime, run: RunRecord, *, cancel_on_disconnect: bool,
            answer: Callable[[RunRecord], Awaitable[Any]], headers: dict[str, str] | None = None) -> Response:
    """The answer made of the finished run by `answer`, with a newline every `heartbeat_seconds` while the
    run goes on (see `threadline.api.waits`). Every answer writes the run's output out as it is: read from
    storage, it is the stored text (`JsonRead`)."""
    async def work() -> Any:
        return await answer(await wait_done(request, rt, run, cancel_on_disconnect=cancel_on_disconnect,
                                            output="text"))

    return KeptAliveJSON(work(), interval=rt.settings.heartbeat_seconds, headers=headers)


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _disconnect_cancels(body: RunCreate) -> bool:
    """A client that leaves `/stream` or `/wait` cancels the run only when it asked to: the default is
    `continue`, as on LangGraph's server (its OpenAPI default, and what it does for stream and wait, thread
    and stateless runs alike)."""
    return body.on_disconnect == "cancel"


# --- LangGraph's thread-scoped paths ----------------------------------------------------------

@router.post("/threads/{thread_id}/runs")
async def create_thread_run(request: Request, thread_id: UUID, body: RunCreate) -> JSON:
    rt = runtime(request)
    run = await _create(rt, str(thread_id), body, identity=identity_of(request))
    return JSON(run_out(run), headers={"Content-Location": _run_path(run)})


@router.post("/threads/{thread_id}/runs/stream")
async def stream_thread_run(request: Request, thread_id: UUID, body: RunCreate) -> Response:
    rt = runtime(request)
    slot = await stream_slot(request)  # before the run: a client over its stream cap creates none
    run = await _released_on_error(slot, _create(rt, str(thread_id), body, waited=True, identity=identity_of(request)))
    return _stream(rt, run, cancel_on_disconnect=_disconnect_cancels(body), slot=slot)


@router.post("/threads/{thread_id}/runs/wait")
async def wait_thread_run(request: Request, thread_id: UUID, body: RunCreate) -> Response:
    rt = runtime(request)
    run = await _create(rt, str(thread_id), body, waited=True, identity=identity_of(request))
    return _waited(request, rt, run, cancel_on_disconnect=_disconnect_cancels(body), answer=rt.runs.output,
                   headers=_wait_headers(run))


@router.get("/threads/{thread_id}/runs")
async def list_thread_runs(request: Request, thread_id: UUID, limit: int = Query(10, ge=1, le=1000),
                           offset: int = Query(0, ge=0, le=INT_MAX), status: RunStatus | None = None,
                           select_: list[str] | None = Query(None, alias="select")) -> JSON:  # noqa: B008
    rt = runtime(request)
    await rt.threads.get(str(thread_id), values=False)
    rows = await rt.runs.search(thread_id=str(thread_id), assistant_id=None, status=status, metadata=None,
                                limit=limit, offset=offset, with_output=False)
    return JSON([select(run_out(r), select_) for r in rows])


@router.get("/threads/{thread_id}/runs/{run_id}")
async def get_thread_run(request: Request, thread_id: UUID, run_id: UUID) -> JSON:
    return JSON(run_out(await runtime(request).runs.get(str(run_id), str(thread_id), output=False)))


@router.delete("/threads/{thread_id}/runs/{run_id}", status_code=204)
async def delete_thread_run(request: Request, thread_id: UUID, run_id: UUID) -> Response:
    await runtime(request).runs.delete(str(run_id), str(thread_id))
    return no_content()


@router.get("/threads/{thread_id}/runs/{run_id}/join")
async def join_thread_run(request: Request, thread_id: UUID, run_id: UUID,
                          cancel_on_disconnect: bool = False) -> Response:
    rt = runtime(request)
    run = await rt.runs.get(str(run_id), str(thread_id))
    return _waited(request, rt, run, cancel_on_disconnect=cancel_on_disconnect, answer=rt.runs.output,
                   headers=_wait_headers(run))


@router.get("/threads/{thread_id}/runs/{run_id}/wait")
async def wait_existing_thread_run(request: Request, thread_id: UUID, run_id: UUID) -> Response:
    """The journeys' wait: the run's fields (status at the top level) with its output in `values`."""
    rt = runtime(request)
    run = await rt.runs.get(str(run_id), str(thread_id))

    async def answer(done: RunRecord) -> Any:
        return {**spec_run_out(done), "values": await rt.runs.output(done)}

    return _waited(request, rt, run, cancel_on_disconnect=False, answer=answer)


@router.get("/threads/{thread_id}/runs/{run_id}/stream")
async def join_thread_run_stream(request: Request, thread_id: UUID, run_id: UUID,
                                 cancel_on_disconnect: bool = False,
                                 stream_mode: list[str] | None = Query(None),  # noqa: B008
                                 last_event_id: str | None = Header(None)) -> Response:
    rt = runtime(request)
    run = await rt.runs.get(str(run_id), str(thread_id))
    return _stream(rt, run, last_event_id=last_event_id, replay=False,
                   cancel_on_disconnect=cancel_on_disconnect, modes=stream_mode)


@router.post("/threads/{thread_id}/runs/{run_id}/cancel")
async def cancel_thread_run(request: Request, thread_id: UUID, run_id: UUID, wait: bool = False,
                            action: CancelAction = "interrupt") -> Response:
    await runtime(request).runs.cancel(str(run_id), str(thread_id), wait=wait, action=action)
    if wait:
        return JSON({}, headers={"Location": f"/threads/{thread_id}/runs/{run_id}/join",
                                 "Content-Location": f"/threads/{thread_id}/runs/{run_id}"})
    return Response(status_code=202)


# --- stateless runs and the Agent Protocol's /runs paths ----------------------------------------

@router.post("/runs")
async def create_run(request: Request, body: RunCreate) -> JSON:
    rt = runtime(request)
    run = await _create(rt, None, body, identity=identity_of(request))
    return JSON(spec_run_out(run), headers={"Content-Location": f"/runs/{run['run_id']}"})


@router.post("/runs/stream")
async def stream_run(request: Request, body: RunCreate) -> Response:
    rt = runtime(request)
    slot = await stream_slot(request)
    run = await _released_on_error(slot, _create(rt, None, body, waited=True, identity=identity_of(request)))
    return _stream(rt, run, cancel_on_disconnect=_disconnect_cancels(body), path=f"/runs/{run['run_id']}", slot=slot)


@router.post("/runs/wait")
async def wait_run(request: Request, body: RunCreate) -> Response:
    """LangGraph's shape (the output itself) by default; the Agent Protocol's RunWaitResponse when the
    request names its agent with the protocol's `agent_id`."""
    rt = runtime(request)
    run = await _create(rt, None, body, waited=True, identity=identity_of(request))

    async def answer(done: RunRecord) -> Any:
        output = await rt.runs.output(done)
        return {"run": spec_run_out(done), "values": output} if body.agent_id is not None else output

    return _waited(request, rt, run, cancel_on_disconnect=_disconnect_cancels(body), answer=answer,
                   headers=_wait_headers(run))


@router.post("/runs/batch")
async def create_runs_batch(request: Request, bodies: list[RunCreate]) -> JSON:
    rt = runtime(request)
    return JSON([run_out(await _create(rt, None, b, identity=identity_of(request))) for b in bodies])


@router.post("/runs/cancel")
async def cancel_runs(request: Request, body: RunCancelMany, action: CancelAction = "interrupt") -> Response:
    if not body.run_ids and not body.thread_id and not body.status:
        raise InvalidInput("Give run_ids, thread_id or status to choose the runs to cancel")
    await runtime(request).runs.cancel_many(run_ids=body.run_ids, thread_id=body.thread_id, status=body.status,
                                            action=action)
    return no_content()


@router.post("/runs/search")
async def search_runs(request: Request, body: RunSearch) -> JSON:
    rows = await runtime(request).runs.search(
        thread_id=body.thread_id, assistant_id=body.agent_id or body.assistant_id, status=body.status,
        metadata=body.metadata, limit=body.limit, offset=body.offset, with_output=False,
    )
    return JSON([spec_run_out(r) for r in rows])


@router.get("/runs/{run_id}")
async def get_run(request: Request, run_id: UUID) -> JSON:
    return JSON(spec_run_out(await runtime(request).runs.get(str(run_id), output=False)))


@router.delete("/runs/{run_id}", status_code=204)
async def delete_run(request: Request, run_id: UUID) -> Response:
    await runtime(request).runs.delete(str(run_id))
    return no_content()


@router.get("/runs/{run_id}/wait")
async def wait_existing_run(request: Request, run_id: UUID) -> Response:
    rt = runtime(request)
    run = await rt.runs.get(str(run_id))

    async def answer(done: RunRecord) -> Any:
        return {"run": spec_run_out(done), "values": await rt.runs.output(done)}

    return _waited(request, rt, run, cancel_on_disconnect=False, answer=answer)


@router.get("/runs/{run_id}/stream")
async def join_run_stream(request: Request, run_id: UUID, last_event_id: str | None = Header(None),
                          stream_mode: list[str] | None = Query(None)) -> Response:  # noqa: B008
    rt = runtime(request)
    run = await rt.runs.get(str(run_id))
    return _stream(rt, run, last_event_id=last_event_id, replay=False, path=f"/runs/{run_id}", modes=stream_mode)


@router.post("/runs/{run_id}/cancel", status_code=204)
async def cancel_run(request: Request, run_id: UUID, wait: bool = False,
                     action: CancelAction = "interrupt") -> Response:
    await runtime(request).runs.cancel(str(run_id), wait=wait, action=action)
    return no_content()
