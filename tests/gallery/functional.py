"""The functional API: an `@entrypoint` that fans work out to `@task`s and asks for a review with `interrupt()`."""

from langgraph.func import entrypoint, task
from langgraph.types import interrupt


@task
def square(n: int) -> int:
    return n * n


@entrypoint()
def workflow(inputs: dict) -> dict:
    futures = [square(n) for n in inputs["numbers"]]
    squares = [future.result() for future in futures]
    if inputs.get("review"):
        verdict = interrupt({"question": "Keep these squares?", "squares": squares})
        return {"squares": squares, "verdict": verdict}
    return {"squares": squares}
