"""How a Threadline process logs: one handler on the root logger, as text or as one JSON object per line.

uvicorn's loggers propagate to it, so a server's access and error lines share the format. Fields given with
`extra=` (`run_id`, `thread_id`, …) are appended to a text line as `key=value` and are keys of a JSON line, as are
the context's: `request_id` (the request being served, or the one that created the run being executed) and, when
tracing is on, `trace_id` and `span_id` (`threadline.tracing`).
"""

from __future__ import annotations

import logging
import sys

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter

from threadline import tracing

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
# Attributes every LogRecord has: anything else on a record came from `extra=`.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "color_message"}


class TextFormatter(logging.Formatter):
    """The text format, with the record's `extra=` fields as `key=value` after the message."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extra = {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}
        if not extra:
            return line
        head, sep, rest = line.partition("\n")  # a traceback goes after the fields
        fields = " ".join(f"{k}={v}" for k, v in extra.items())
        return f"{head} {fields}{sep}{rest}"


class ContextFields(logging.Filter):
    """Adds the request id and the current trace's ids to each record (unless it already names them)."""

    def filter(self, record: logging.LogRecord) -> bool:
        request_id = tracing.REQUEST_ID.get()
        if request_id is not None and not hasattr(record, "request_id"):
            record.request_id = request_id
        for key, value in tracing.tracer().log_ids().items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


def configure(level: str = "info", fmt: str = "text") -> None:
    """Send every logger's records to stderr at `level`, formatted as `fmt` ("text" or "json")."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter("%(asctime)s %(levelname)s %(name)s %(message)s", rename_fields={"levelname": "level"},
                      reserved_attrs=[*RESERVED_ATTRS, "color_message"])  # uvicorn's message with ANSI colours
        if fmt == "json" else TextFormatter()
    )
    handler.addFilter(ContextFields())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        uv = logging.getLogger(name)
        uv.handlers.clear()
        uv.propagate = True
        uv.setLevel(level.upper())
    # `threadline dev`: uvicorn says which files changed; watchfiles' own "N changes detected" only at debug.
    logging.getLogger("watchfiles").setLevel("DEBUG" if level.lower() == "debug" else "WARNING")
