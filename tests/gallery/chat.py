"""Chat graphs: a `MessagesState` graph and tool-calling agents, each on a deterministic fake chat model."""

from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import create_react_agent


async def call_model(state: MessagesState) -> dict:
    question = state["messages"][-1].content
    # A fake model that streams its answer token by token, as a real one would.
    model = GenericFakeChatModel(messages=iter([AIMessage(content=f"Answer to: {question}")]))
    return {"messages": [await model.ainvoke(state["messages"])]}


builder = StateGraph(MessagesState)
builder.add_node("call_model", call_model)
builder.add_edge(START, "call_model")
builder.add_edge("call_model", END)
messages = builder.compile()


@tool
def get_weather(city: str) -> str:
    """Get the weather for a city."""
    return f"sunny in {city}"


class WeatherModel(BaseChatModel):
    """Calls `get_weather` for the latest question, then answers with the tool's result: no network."""

    @property
    def _llm_type(self) -> str:
        return "gallery-weather"

    def bind_tools(self, tools: Any, **kwargs: Any) -> "WeatherModel":
        return self

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        last = messages[-1]
        if isinstance(last, ToolMessage):
            reply = AIMessage(content=f"The weather: {last.content}.")
        else:
            city = next(str(m.content) for m in reversed(messages) if isinstance(m, HumanMessage))
            reply = AIMessage(content="", tool_calls=[{"name": "get_weather", "args": {"city": city},
                                                       "id": "call_weather"}])
        return ChatResult(generations=[ChatGeneration(message=reply)])


react = create_react_agent(WeatherModel(), tools=[get_weather])

try:  # langchain >= 1.0's agent, when the project has langchain installed
    from langchain.agents import create_agent
except ImportError:  # pragma: no cover - the gallery's langgraph.json then names no `agent`
    create_agent = None

agent = create_agent(WeatherModel(), tools=[get_weather]) if create_agent else None
