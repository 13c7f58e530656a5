"""What a person reads in the log: a line when each run starts and ends, a failed run's traceback, the
workers' lifecycle, and the same lines as JSON with `--log-format json`."""

from __future__ import annotations

import io
import json
import logging

import pytest
from langgraph_sdk.client import LangGraphClient

from threadline import logs


def _lines(caplog: pytest.LogCaptureFixture, message: str, run_id: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage().startswith(message) and getattr(r, "run_id", None) == run_id]


async def test_a_run_logs_its_start_and_its_end(sdk: LangGraphClient, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="threadline")
    thread = await sdk.threads.create()
    run = await sdk.runs.create(thread["thread_id"], "counter", input={"increment": 2})
    await sdk.runs.join(thread["thread_id"], run["run_id"])
    [started] = _lines(caplog, "run started", run["run_id"])
    [ended] = _lines(caplog, "run ended", run["run_id"])
    for record in (started, ended):
        assert record.levelno == logging.INFO
        assert (record.thread_id, record.assistant_id, record.graph_id, record.attempt) == (  # type: ignore[attr-defined]
            thread["thread_id"], run["assistant_id"], "counter", 1)
    assert ended.status == "success" and ended.duration_ms >= 0  # type: ignore[attr-defined]
    assert ended.exc_info is None


async def test_a_failed_run_logs_its_traceback_once_at_info(sdk: LangGraphClient,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="threadline")
    thread = await sdk.threads.create()
    run = await sdk.runs.create(thread["thread_id"], "failing", input={"reason": "the tool broke"})
    await sdk.runs.join(thread["thread_id"], run["run_id"])
    with_traceback = [r for r in caplog.records if r.exc_info and getattr(r, "run_id", None) == run["run_id"]]
    assert len(with_traceback) == 1
    [ended] = with_traceback
    assert ended.levelno == logging.INFO and ended.getMessage() == "run ended: ValueError: the tool broke"
    assert ended.status == "error" and ended.thread_id == thread["thread_id"]  # type: ignore[attr-defined]
    text = logs.TextFormatter().format(ended)
    first, _, rest = text.partition("\n")
    assert f"run_id={run['run_id']}" in first and f"thread_id={thread['thread_id']}" in first
    assert rest.startswith("Traceback (most recent call last):") and "in _fail" in rest  # the agent's own frame
    assert "ValueError: the tool broke" in rest


async def test_workers_log_starting_and_stopping(settings: object, caplog: pytest.LogCaptureFixture) -> None:
    from asgi_lifespan import LifespanManager

    from threadline.api.app import create_app

    caplog.set_level(logging.INFO, logger="threadline")
    async with LifespanManager(create_app(settings), startup_timeout=30):  # type: ignore[arg-type]
        assert any(r.getMessage() == "worker started: 4 slots" for r in caplog.records)
        assert not any(r.getMessage().startswith("worker stop") for r in caplog.records)
    messages = [r.getMessage() for r in caplog.records if r.name == "threadline.worker"]
    assert messages[-2].startswith("worker stopping: ") and messages[-1] == "worker stopped"


def test_json_format_is_one_object_a_line_with_the_fields() -> None:
    root = logging.getLogger()
    before = (list(root.handlers), root.level)
    try:
        logs.configure("info", "json")
        [handler] = root.handlers
        out = io.StringIO()
        handler.setStream(out)  # type: ignore[attr-defined]
        log = logging.getLogger("threadline.executor")
        log.info("run ended", extra={"run_id": "r1", "thread_id": "t1", "status": "success", "duration_ms": 1.5})
        try:
            raise ValueError("boom")
        except ValueError as exc:
            log.info("run ended: ValueError: boom", exc_info=exc, extra={"run_id": "r2"})
        log.debug("not at info")
        logging.getLogger("uvicorn.error").info("Started server process [%d]", 1, extra={"color_message": "\x1b[36m"})
        first, second, third = (json.loads(line) for line in out.getvalue().splitlines())
        assert third == {"asctime": third["asctime"], "level": "INFO", "name": "uvicorn.error",
                         "message": "Started server process [1]"}  # without uvicorn's coloured copy
        assert {k: first[k] for k in ("level", "name", "message", "run_id", "thread_id", "status", "duration_ms")} \
            == {"level": "INFO", "name": "threadline.executor", "message": "run ended", "run_id": "r1",
                "thread_id": "t1", "status": "success", "duration_ms": 1.5}
        assert second["run_id"] == "r2" and "ValueError: boom" in second["exc_info"]
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in before[0]:
            root.addHandler(handler)
        root.setLevel(before[1])
