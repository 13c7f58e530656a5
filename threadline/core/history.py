"""A thread's state history with less work per checkpoint than LangGraph's own, the same snapshots.

LangGraph's `aget_state_history` builds each checkpoint's `StateSnapshot` with `_aprepare_state_snapshot`, which
prepares the checkpoint's next tasks *for execution* (`prepare_next_tasks(..., for_execution=True)`): for each
task a whole runnable config (merged configs, a scratchpad, a runtime, the task's writers), only to read its
id, name and path back, and it lists the graph's subgraphs again for every checkpoint. That is about half of
a 200-checkpoint history's CPU (`bench/README.md`, "Large state and history"). `fast_history` gives the
request's graph (a copy of its own, `core/state.py: bind`) a `_aprepare_state_snapshot` that prepares the
tasks as descriptions (`for_execution=False`, LangGraph's own function: the same ids, names and paths) and
lists the subgraphs once; LangGraph's `aget_state_history` runs unchanged around it.

A checkpoint is handed to LangGraph's own method whenever the two could differ: a call that is not a history's
(`live`, `recurse`), a graph with a node that preparing for execution would treat otherwise (no runnable: left
out of the tasks; an input mapper or a cache policy: run on the task's input, which may raise), or a checkpoint
with pushed tasks (`Send`s, the functional API's calls) or writes of no task (applied to the channels first).
"""

from __future__ import annotations

from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph._internal._constants import CONF, NS_END, NS_SEP, NULL_TASK_ID, TASKS
from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple
from langgraph.pregel._algo import prepare_next_tasks
from langgraph.pregel._checkpoint import achannels_from_checkpoint
from langgraph.pregel._io import read_channels
from langgraph.pregel.debug import tasks_w_writes
from langgraph.pregel.main import patch_checkpoint_map
from langgraph.types import StateSnapshot

from threadline.core.graphs import CompiledGraph


def fast_history(graph: CompiledGraph) -> CompiledGraph:
    """`graph` (the request's own copy) with the lighter snapshot builder, when its nodes allow it."""
    if not all(proc.node is not None and proc.mapper is None and proc.cache_policy is None
               for proc in graph.nodes.values()):
        return graph
    full = graph._aprepare_state_snapshot
    subgraphs: list[set[str]] = []

    async def prepare(config: RunnableConfig, saved: CheckpointTuple | None, *, saver: BaseCheckpointSaver[Any],
                      recurse: bool = False, live: bool = False) -> StateSnapshot:
        if (saved is None or recurse or live
                or any(w[0] == NULL_TASK_ID for w in saved.pending_writes or ())):
            return await full(config, saved, saver=saver, recurse=recurse, live=live)
        graph._migrate_checkpoint(saved.checkpoint)
        channels, managed = await achannels_from_checkpoint(graph.channels, saved.checkpoint, saver=saver,
                                                            config=saved.config)
        pushed = channels.get(TASKS)
        if pushed is not None and pushed.is_available():
            return await full(config, saved, saver=saver, recurse=recurse, live=live)
        step = saved.metadata.get("step", -1) + 1
        tasks = prepare_next_tasks(saved.checkpoint, saved.pending_writes or [], graph.nodes, channels, managed,
                                   saved.config, step, step + 2, for_execution=False)
        if not subgraphs:
            subgraphs.append({name async for name, _ in graph.aget_subgraphs()})
        # As LangGraph's, not recursing: a subgraph task's state is the config that names its namespace.
        parent_ns = saved.config[CONF].get("checkpoint_ns", "")
        states: dict[str, Any] = {}
        for task in tasks.values():
            if task.name in subgraphs[0]:
                task_ns = f"{task.name}{NS_END}{task.id}"
                states[task.id] = {CONF: {"thread_id": saved.config[CONF]["thread_id"],
                                          "checkpoint_ns": f"{parent_ns}{NS_SEP}{task_ns}" if parent_ns else task_ns}}
        with_writes = tasks_w_writes(tasks.values(), saved.pending_writes, states, graph.stream_channels_asis)
        return StateSnapshot(
            read_channels(channels, graph.stream_channels_asis),
            tuple(task.name for task in tasks.values()),  # none has writes: they are not applied in a history
            patch_checkpoint_map(saved.config, saved.metadata),
            saved.metadata,
            saved.checkpoint["ts"],
            patch_checkpoint_map(saved.parent_config, saved.metadata),
            with_writes,
            tuple([i for task in with_writes for i in task.interrupts]),
        )

    graph._aprepare_state_snapshot = prepare  # type: ignore[method-assign]
    return graph
