"""A checkpointer in front of another (the project's encryption, a state update's memory of what it wrote)."""

from __future__ import annotations

from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver


class SaverWrapper(BaseCheckpointSaver[Any]):
    """Wraps `inner`: what a subclass does not define is the wrapped saver's (its serializer, config specs and
    versions included)."""

    def __init__(self, inner: BaseCheckpointSaver[Any]) -> None:
        super().__init__(serde=inner.serde)
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def config_specs(self) -> list[Any]:
        return self.inner.config_specs

    def get_next_version(self, current: Any, channel: None = None) -> Any:
        return self.inner.get_next_version(current, channel)
