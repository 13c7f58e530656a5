"""One small graph per way of declaring state: typing.TypedDict, typing_extensions.TypedDict, pydantic, dataclass."""

import operator
from dataclasses import dataclass, field
from typing import Annotated, TypedDict

import typing_extensions
from langgraph.graph import END, START, StateGraph
from pydantic import BaseModel


class TypedState(TypedDict):
    topic: str
    notes: Annotated[list[str], operator.add]


def draft(state: TypedState) -> dict:
    return {"notes": [f"draft about {state['topic']}"]}


def review(state: TypedState) -> dict:
    return {"notes": [f"reviewed {len(state['notes'])} note(s)"]}


builder = StateGraph(TypedState)
builder.add_node("draft", draft)
builder.add_node("review", review)
builder.add_edge(START, "draft")
builder.add_edge("draft", "review")
builder.add_edge("review", END)
typed = builder.compile()


class ExtState(typing_extensions.TypedDict, total=False):
    topic: str
    notes: Annotated[list[str], operator.add]


ext_builder = StateGraph(ExtState)
ext_builder.add_node("draft", draft)
ext_builder.add_node("review", review)
ext_builder.add_edge(START, "draft")
ext_builder.add_edge("draft", "review")
ext_builder.add_edge("review", END)
typed_ext = ext_builder.compile()


class Order(BaseModel):
    item: str
    quantity: int = 1
    total: float = 0.0
    status: str = "new"


def price(state: Order) -> dict:
    return {"total": round(state.quantity * 2.5, 2)}


def confirm(state: Order) -> dict:
    return {"status": f"confirmed {state.quantity} x {state.item}"}


pydantic_builder = StateGraph(Order)
pydantic_builder.add_node("price", price)
pydantic_builder.add_node("confirm", confirm)
pydantic_builder.add_edge(START, "price")
pydantic_builder.add_edge("price", "confirm")
pydantic_builder.add_edge("confirm", END)
pydantic_state = pydantic_builder.compile()


@dataclass
class Tally:
    word: str = ""
    letters: int = 0
    seen: Annotated[list[str], operator.add] = field(default_factory=list)


def count_letters(state: Tally) -> dict:
    return {"letters": len(state.word), "seen": [state.word]}


dataclass_builder = StateGraph(Tally)
dataclass_builder.add_node("count_letters", count_letters)
dataclass_builder.add_edge(START, "count_letters")
dataclass_builder.add_edge("count_letters", END)
dataclass_state = dataclass_builder.compile()
