"""Control flow: a subgraph, `Command` goto, `Send` fan-out, a static breakpoint and a dynamic `interrupt()`."""

import asyncio
import operator
from typing import Annotated, Literal, TypedDict

from langgraph.config import get_stream_writer
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, Send, interrupt


# --- a subgraph added as a node; it shares the `path` key with its parent ---------------------------
class ChildState(TypedDict):
    path: str


def child_step(state: ChildState) -> dict:
    get_stream_writer()({"progress": "inside the child"})
    return {"path": state["path"] + " > child"}


child_builder = StateGraph(ChildState)
child_builder.add_node("child_step", child_step)
child_builder.add_edge(START, "child_step")
child_builder.add_edge("child_step", END)
child = child_builder.compile()


class ParentState(TypedDict):
    path: str


def parent_step(state: ParentState) -> dict:
    get_stream_writer()({"progress": "before the child"})
    return {"path": state["path"] + " > parent"}


parent_builder = StateGraph(ParentState)
parent_builder.add_node("parent_step", parent_step)
parent_builder.add_node("child", child)
parent_builder.add_edge(START, "parent_step")
parent_builder.add_edge("parent_step", "child")
parent_builder.add_edge("child", END)
subgraphs = parent_builder.compile()


# --- Command: a node picks the next node and updates state in one return ----------------------------
class RouteState(TypedDict):
    amount: int
    route: str


def triage(state: RouteState) -> Command[Literal["approve", "escalate"]]:
    target: Literal["approve", "escalate"] = "approve" if state["amount"] < 100 else "escalate"
    return Command(update={"route": f"triage->{target}"}, goto=target)


def approve(state: RouteState) -> dict:
    return {"route": state["route"] + "->approved"}


def escalate(state: RouteState) -> dict:
    return {"route": state["route"] + "->escalated"}


command_builder = StateGraph(RouteState)
command_builder.add_node("triage", triage)
command_builder.add_node("approve", approve)
command_builder.add_node("escalate", escalate)
command_builder.add_edge(START, "triage")
command = command_builder.compile()


# --- Send: map over subjects, reduce the results ------------------------------------------------------
class JokeState(TypedDict):
    subjects: list[str]
    jokes: Annotated[list[str], operator.add]


class SubjectState(TypedDict):
    subject: str


def continue_to_jokes(state: JokeState) -> list[Send]:
    return [Send("write_joke", {"subject": s}) for s in state["subjects"]]


def write_joke(state: SubjectState) -> dict:
    return {"jokes": [f"a joke about {state['subject']}"]}


send_builder = StateGraph(JokeState)
send_builder.add_node("write_joke", write_joke)
send_builder.add_conditional_edges(START, continue_to_jokes, ["write_joke"])
send_builder.add_edge("write_joke", END)
fanout = send_builder.compile()


# --- breakpoints: static (compiled `interrupt_before`) and dynamic (`interrupt()` in a node) -------------
class TaskState(TypedDict):
    task: str
    log: Annotated[list[str], operator.add]


def plan(state: TaskState) -> dict:
    return {"log": [f"planned {state['task']}"]}


def act(state: TaskState) -> dict:
    return {"log": [f"did {state['task']}"]}


static_builder = StateGraph(TaskState)
static_builder.add_node("plan", plan)
static_builder.add_node("act", act)
static_builder.add_edge(START, "plan")
static_builder.add_edge("plan", "act")
static_builder.add_edge("act", END)
static_interrupt = static_builder.compile(interrupt_before=["act"])


def ask_human(state: TaskState) -> dict:
    answer = interrupt({"question": f"May I {state['task']}?"})
    return {"log": [f"human said {answer}"]}


dynamic_builder = StateGraph(TaskState)
dynamic_builder.add_node("plan", plan)
dynamic_builder.add_node("ask_human", ask_human)
dynamic_builder.add_node("act", act)
dynamic_builder.add_edge(START, "plan")
dynamic_builder.add_edge("plan", "ask_human")
dynamic_builder.add_edge("ask_human", "act")
dynamic_builder.add_edge("act", END)
dynamic_interrupt = dynamic_builder.compile()


# --- a long task that reports progress (for joining, cancelling, and busy threads) ---------------------
class ProgressState(TypedDict):
    steps: int
    delay: float
    done: Annotated[list[int], operator.add]


async def work(state: ProgressState) -> dict:
    writer = get_stream_writer()
    for i in range(state["steps"]):
        await asyncio.sleep(state["delay"])
        writer({"step": i})
    return {"done": list(range(state["steps"]))}


progress_builder = StateGraph(ProgressState)
progress_builder.add_node("work", work)
progress_builder.add_edge(START, "work")
progress_builder.add_edge("work", END)
progress = progress_builder.compile()
