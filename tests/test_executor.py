"""Unit tests of the executor's decisions (`threadline/core/executor.py`): how a run that ended one way or
another is recorded, and how a run's request becomes the graph's config, input and options. No services:
each decision is a pure function; `tests/test_runs.py`, `test_timeouts.py` and `test_outages.py` run whole
runs through it on both backends.
"""

from __future__ import annotations

from typing import Any, TypedDict, get_args

import pytest
from langchain_core.runnables import RunnableLambda
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, Send

from threadline.core.executor import (
    STREAM_MODES,
    Outcome,
    _with_events,
    build_config,
    error_of,
    failed,
    failure_kind,
    graph_input,
    rolled_back,
    run_context,
    run_timeout,
    stopped,
    succeeded,
)
from threadline.core.lease import LeaseLost
from threadline.errors import Unavailable
from threadline.shapes import StreamMode, requested_modes, run_durability, run_kwargs_out
from threadline.storage.rules import timed_out

THREAD_NOW = {"values": {"n": 2}, "interrupts": {}, "status": "idle"}


def state(values: Any = None, *, tasks: list[dict[str, Any]] | None = None, next_: tuple[str, ...] = (),
          checkpoint: bool = True) -> dict[str, Any]:
    return {"values": values, "checkpoint": {"id": "c1"} if checkpoint else None, "tasks": tasks or [],
            "next": list(next_)}


# --- how a run ended -------------------------------------------------------------------------------------------
def test_a_graph_that_ran_to_its_end_succeeds_with_its_values_and_clears_the_thread_error() -> None:
    outcome = succeeded(state({"n": 1}))
    assert outcome == Outcome("success", {"values": {"n": 1}, "interrupts": {}, "status": "idle", "error": None},
                              output={"n": 1})
    assert outcome.action is None and outcome.failure is None


def test_a_graph_waiting_at_an_interrupt_succeeds_and_leaves_its_thread_interrupted() -> None:
    ask = {"value": "name?", "id": "i1"}
    outcome = succeeded(state({"n": 1}, tasks=[{"id": "t1", "interrupts": [ask]}], next_=("ask",)))
    assert outcome.status == "success" and outcome.thread_changes["status"] == "interrupted"
    assert outcome.output == {"n": 1, "__interrupt__": [{"response_schema": None, **ask}]}


def test_an_interrupted_run_keeps_its_thread_at_its_last_checkpoint_and_says_the_user_stopped_it() -> None:
    outcome = stopped("interrupt", "r1", THREAD_NOW)
    assert (outcome.status, outcome.action, outcome.output, outcome.error) == ("interrupted", "interrupt", None, None)
    assert outcome.thread_changes == {"values": {"n": 2}, "interrupts": {}, "status": "interrupted",
                                      "error": {"error": "UserInterrupt", "message": "interrupt requested for run r1"}}


def test_a_run_past_its_timeout_ends_timeout_and_answers_waiters_with_the_threads_values() -> None:
    outcome = stopped("timeout", "r1", THREAD_NOW)
    assert (outcome.status, outcome.error, outcome.output) == ("timeout", timed_out(), {"n": 2})
    assert outcome.thread_changes["status"] == "error" and outcome.thread_changes["error"] == timed_out()


def test_a_rolled_back_run_is_interrupted_its_thread_rewritten_once_its_checkpoints_are_gone() -> None:
    outcome = stopped("rollback", "r1", THREAD_NOW)
    assert (outcome.status, outcome.action, outcome.thread_changes) == ("interrupted", "rollback", THREAD_NOW)
    after = rolled_back({"values": None, "status": "idle"}, "r1")
    assert after == {"values": None, "status": "idle",
                     "error": {"error": "UserRollback", "message": "rollback requested for run r1"}}


def test_stopped_does_not_change_the_fields_it_is_given() -> None:
    given = dict(THREAD_NOW)
    stopped("interrupt", "r1", given)
    stopped("timeout", "r1", given)
    assert given == THREAD_NOW


def test_whose_failure_an_exception_is() -> None:
    assert failure_kind(ValueError("agent"), lease_valid=True) == "agent"
    assert failure_kind(Unavailable("db down"), lease_valid=True) == "infrastructure"
    assert failure_kind(LeaseLost("gone"), lease_valid=True) == "lease"
    # Whatever it raised, a worker whose lease lapsed records nothing: the run is another worker's now.
    assert failure_kind(ValueError("agent"), lease_valid=False) == "lease"
    assert failure_kind(Unavailable("db down"), lease_valid=False) == "lease"


def test_an_agents_failure_is_recorded_on_the_run_and_its_thread() -> None:
    exc = ValueError("bad input")
    outcome = failed(exc, THREAD_NOW)
    assert error_of(exc) == {"error": "ValueError", "message": "bad input"}
    assert (outcome.status, outcome.error, outcome.failure, outcome.output) == ("error", error_of(exc), exc, None)
    assert outcome.thread_changes == {"values": {"n": 2}, "interrupts": {}, "status": "error",
                                      "error": error_of(exc)}
    # The thread's state could not be read: the error and the status are still recorded.
    assert failed(exc, None).thread_changes == {"error": error_of(exc), "status": "error"}


def test_an_outcome_is_frozen() -> None:
    outcome = succeeded(state({"n": 1}))
    with pytest.raises(AttributeError):
        outcome.status = "error"  # type: ignore[misc]


# --- the run's request, as the graph gets it ---------------------------------------------------------------------
def test_every_stream_mode_a_client_may_ask_for_is_fed_by_one_of_langgraphs() -> None:
    assert set(STREAM_MODES) == set(get_args(StreamMode))
    assert STREAM_MODES["messages-tuple"] == STREAM_MODES["messages"] == "messages"
    assert STREAM_MODES["events"] is None  # astream_events, not a stream mode


@pytest.mark.parametrize(("kwargs", "modes"), [
    ({}, ["values"]), ({"stream_mode": None}, ["values"]), ({"stream_mode": "updates"}, ["updates"]),
    ({"stream_mode": ["custom", "messages-tuple"]}, ["custom", "messages-tuple"]),
])
def test_requested_modes(kwargs: dict[str, Any], modes: list[str]) -> None:
    assert requested_modes(kwargs) == modes


@pytest.mark.parametrize(("kwargs", "durability"), [
    ({}, "async"), ({"durability": "sync"}, "sync"), ({"checkpoint_during": False}, "exit"),
    ({"checkpoint_during": True}, "async"), ({"durability": "async", "checkpoint_during": False}, "async"),
])
def test_durability_is_the_runs_else_the_legacy_flag_else_langgraphs_default(kwargs: dict[str, Any],
                                                                               durability: str) -> None:
    assert run_durability(kwargs) == durability
    # The one rule: what the worker runs is what the run's public kwargs say.
    shown = run_kwargs_out({"kwargs": kwargs})
    assert shown["durability"] == durability and shown["stream_mode"] == requested_modes(kwargs)


@pytest.mark.parametrize(("configurable", "default", "seconds"), [
    ({}, 0.0, 0.0), ({}, 30.0, 30.0), ({"run_timeout_seconds": 5}, 30.0, 5.0),
    ({"run_timeout_seconds": "2.5"}, 0.0, 2.5), ({"run_timeout_seconds": 0}, 30.0, 30.0),
    ({"run_timeout_seconds": "soon"}, 30.0, 30.0), ({}, -1.0, 0.0),
])
def test_run_timeout(configurable: dict[str, Any], default: float, seconds: float) -> None:
    assert run_timeout({"configurable": configurable}, default) == seconds


ASSISTANT: Any = {"assistant_id": "a1", "graph_id": "agent",
             "config": {"tags": ["a", "b"], "configurable": {"model": "x", "shared": "assistant"},
                        "metadata": {"from": "assistant"}},
             "context": {"tone": "dry"}}


def test_build_config_puts_the_run_over_its_assistant_and_names_the_run() -> None:
    run: Any = {"run_id": "r1", "attempt": 2, "metadata": {"m": 1},
           "kwargs": {"config": {"tags": ["b", "c"], "configurable": {"shared": "run"}, "recursion_limit": 5},
                      "context": {"ctx": 1}, "checkpoint_id": "c9"}}
    config = build_config(run, ASSISTANT, "t1")
    assert config["tags"] == ["a", "b", "c"] and config["recursion_limit"] == 5 and config["run_id"] == "r1"
    configurable = config["configurable"]
    assert configurable["model"] == "x" and configurable["shared"] == "run" and configurable["ctx"] == 1
    assert {k: configurable[k] for k in ("thread_id", "run_id", "assistant_id", "graph_id", "run_attempt",
                                         "checkpoint_id")} == {
        "thread_id": "t1", "run_id": "r1", "assistant_id": "a1", "graph_id": "agent", "run_attempt": 2,
        "checkpoint_id": "c9"}
    # As LangGraph's server: no `checkpoint_ns` unless the run names one (LangGraph's own default is the root's ""),
    # so it is not copied into every event's metadata.
    assert "checkpoint_ns" not in configurable
    assert config["metadata"] == {"from": "assistant", "m": 1, "run_id": "r1", "thread_id": "t1",
                                  "assistant_id": "a1", "graph_id": "agent"}


def test_run_context_is_the_runs_over_the_assistants_and_always_a_dict() -> None:
    run: Any = {"kwargs": {"context": {"tone": "warm"}}}  # a run and an assistant with only what it reads
    assert run_context(run, ASSISTANT) == {"tone": "warm"}
    no_kwargs: Any = {"kwargs": None}
    no_context: Any = {"context": None}
    assert run_context(no_kwargs, no_context) == {}


def test_graph_input_is_the_input_or_the_command() -> None:
    assert graph_input({"input": {"q": 1}}) == {"q": 1}
    command = graph_input({"input": {"q": 1}, "command": {"resume": "yes", "update": {"n": 1}}})
    assert isinstance(command, Command) and command.resume == "yes" and command.update == {"n": 1}
    sent = graph_input({"command": {"goto": {"node": "n1", "input": {"x": 1}}}})
    assert isinstance(sent, Command) and sent.goto == [Send("n1", {"x": 1})]
    assert graph_input({"command": {"goto": "n2"}}).goto == "n2"


class _Numbered(TypedDict, total=False):
    x: int


async def test_events_mode_leaves_out_hidden_runs_and_yields_the_roots_chunks() -> None:
    """As LangGraph's server (checked on `langgraph dev` 0.16.7): no events of runs tagged `langsmith:hidden`
    (the `__start__` task of a conditional entry, its routing function, a node's runnable hidden by its author),
    and the graph's own `on_chain_stream` chunks are the other modes' parts, not events."""
    builder = StateGraph(_Numbered)
    builder.add_node("visible", lambda state: {"x": 1})
    builder.add_node("secret", RunnableLambda(lambda state: {"x": 2}).with_config(tags=["langsmith:hidden"]))
    builder.add_conditional_edges(START, lambda state: "visible", ["visible"])
    builder.add_edge("visible", "secret")
    builder.add_edge("secret", END)
    events: list[tuple[str, str]] = []

    async def publish(mode: str, event: Any) -> None:
        assert mode == "events"
        events.append((event["event"], event["name"]))

    parts = [part async for part in _with_events(builder.compile(name="g"), {"x": 0}, {}, {
        "stream_mode": ["updates"], "subgraphs": False}, publish)]
    assert events == [("on_chain_start", "g"), ("on_chain_start", "visible"), ("on_chain_stream", "visible"),
                      ("on_chain_end", "visible"), ("on_chain_start", "secret"), ("on_chain_stream", "secret"),
                      ("on_chain_end", "secret"), ("on_chain_end", "g")], events
    assert parts == [("updates", {"visible": {"x": 1}}), ("updates", {"secret": {"x": 2}})]
