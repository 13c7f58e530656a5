"""A tool-calling agent on a scripted chat model (no network), written as users write one for a front-end:
a model bound to a tool, a ToolNode, `tools_condition`, an approval step that interrupts, and a generative UI
component pushed with `push_ui_message` beside the answer it illustrates.

What the human says picks the path: "weather in <city>" calls the `weather` tool, then answers and pushes the
`weather` card; "approve <thing>" interrupts for a decision; "count to <n>" streams n words slowly (to be
stopped); anything else is echoed."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from typing import Annotated, Any

from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.graph.ui import AnyUIMessage, push_ui_message, ui_message_reducer
from langgraph.prebuilt import ToolNode
from langgraph.types import interrupt
from typing_extensions import TypedDict

from threadline.example.agents import ScriptedChatModel


@tool
def weather(city: str) -> str:
    """The weather in a city."""
    return json.dumps({"city": city, "forecast": "sunny", "celsius": 21})


class ScriptedModel(ScriptedChatModel):
    """A stand-in for a chat model: calls `weather` when asked about it, else answers; streams word by word
    (the example's scripted model, with this script)."""

    delay: float = 0.02

    def _reply(self, messages: list[BaseMessage]) -> AIMessage:
        last = messages[-1]
        if isinstance(last, ToolMessage):
            found = json.loads(str(last.content))
            return AIMessage(content=f"It is {found['forecast']} in {found['city']}, {found['celsius']} degrees.")
        text = str(last.content)
        asked = re.match(r"weather in (\w+)", text)
        if asked:
            return AIMessage(content="", tool_calls=[
                {"name": "weather", "args": {"city": asked.group(1)}, "id": f"call_{uuid.uuid4().hex[:12]}"}])
        counting = re.match(r"count to (\d+)", text)
        if counting:
            return AIMessage(content=" ".join(str(i) for i in range(1, int(counting.group(1)) + 1)))
        return AIMessage(content=f"You said: {text}")


model = ScriptedModel().bind_tools([weather])


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    ui: Annotated[Sequence[AnyUIMessage], ui_message_reducer]


async def call_model(state: State) -> dict[str, Any]:
    reply = await model.ainvoke(state["messages"])
    last = state["messages"][-1]
    if isinstance(last, ToolMessage):  # the answer to a tool call: its card beside the message
        push_ui_message("weather", json.loads(str(last.content)), message=reply)
    return {"messages": [reply]}


def approve(state: State) -> dict[str, Any]:
    asked = str(state["messages"][-1].content).removeprefix("approve ").strip()
    decision = interrupt({"question": f"Approve {asked}?", "action": asked})
    verdict = "approved" if decision.get("approved") else "rejected"
    return {"messages": [AIMessage(content=f"{asked}: {verdict}")]}


def route(state: State) -> str:
    last = state["messages"][-1]
    if isinstance(last, HumanMessage) and str(last.content).startswith("approve "):
        return "approve"
    return "model"


def after_model(state: State) -> str:
    last = state["messages"][-1]
    return "tools" if isinstance(last, AIMessage) and last.tool_calls else END


builder = StateGraph(State)
builder.add_node("model", call_model)
builder.add_node("tools", ToolNode([weather]))
builder.add_node("approve", approve)
builder.add_conditional_edges(START, route, ["model", "approve"])
builder.add_conditional_edges("model", after_model, ["tools", END])
builder.add_edge("tools", "model")
builder.add_edge("approve", END)
graph = builder.compile()
