"""The exception hierarchy. `threadline.api.errors` maps each class to each wire: an HTTP status, a JSON-RPC
error code (A2A, MCP) and a Protocol v2 error code. Nothing here knows a wire's codes.

Each class's docstring is its default message.
"""

from __future__ import annotations

from typing import Any


class ThreadlineError(Exception):
    """Internal error."""

    code = "internal_error"

    def __init__(self, message: str | None = None, **metadata: Any) -> None:
        self.message = message or (self.__doc__ or "").strip()
        self.metadata = metadata
        super().__init__(self.message)


class NotFound(ThreadlineError):
    """Not found."""

    code = "not_found"


class Conflict(ThreadlineError):
    """Conflict."""

    code = "conflict"


class InvalidInput(ThreadlineError):
    """Invalid input."""

    code = "invalid_input"


class EncryptionFailed(InvalidInput):
    """The project's encryption handler returned something that cannot be stored (langgraph.json `encryption`)."""


class BadRequest(ThreadlineError):
    """Bad request."""

    code = "bad_request"


class PayloadTooLarge(ThreadlineError):
    """Request body too large."""

    code = "payload_too_large"


class ConfigError(ThreadlineError):
    """The project configuration is invalid."""

    code = "config_error"


class Unavailable(ThreadlineError):
    """A backing service is unavailable. Retry shortly."""

    code = "unavailable"
    #: Seconds a client should wait before trying again (the `Retry-After` of the 503).
    retry_after = 1


class StorageUnavailable(Unavailable):
    """The database is unavailable. Retry shortly."""

    code = "storage_unavailable"


class BrokerUnavailable(Unavailable):
    """The message broker is unavailable. Retry shortly."""

    code = "broker_unavailable"


class QuotaExceeded(ThreadlineError):
    """Too many active runs: try again once some have finished."""

    code = "quota_exceeded"
    #: Seconds a client should wait before trying again (the `Retry-After` of the 429).
    retry_after = 5


class TooManyStreams(QuotaExceeded):
    """Too many open event streams for this client: close one, or try again later."""

    code = "too_many_streams"


class ClientGone(ThreadlineError):
    """The client disconnected before the answer was ready."""

    code = "client_closed_request"


class Unauthorized(ThreadlineError):
    """Unauthorized"""

    code = "unauthorized"

    def __init__(self, message: str | None = None, *, status: int = 401,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        #: The status to answer with: 401, or what the project's `Auth.exceptions.HTTPException` said.
        self.status = status
        self.headers = headers or {}


class AmbiguousCredentials(BadRequest):
    """A request may carry at most one Authorization header and one X-API-Key header."""

    code = "ambiguous_credentials"


# --- A2A tasks (threadline.core.a2a_tasks). The A2A spec names these errors; their JSON-RPC codes are the API's.

class TaskNotFound(NotFound):
    """Task not found."""

    code = "task_not_found"


class TaskNotCancelable(Conflict):
    """Task cannot be canceled."""

    code = "task_not_cancelable"


class UnsupportedOperation(BadRequest):
    """This operation is not supported."""

    code = "unsupported_operation"


class PushNotificationNotSupported(BadRequest):
    """Push notifications are not supported."""

    code = "push_notification_not_supported"


class ContentTypeNotSupported(InvalidInput):
    """Incompatible content types."""

    code = "content_type_not_supported"


class ExtendedCardNotConfigured(NotFound):
    """No authenticated extended agent card is configured."""

    code = "extended_card_not_configured"


# --- thread event streams and their commands (threadline.core.protocol) ----------------------------------------

class NoSuchRun(NotFound):
    """No such run."""

    code = "no_such_run"


class NoSuchInterrupt(NotFound):
    """No such pending interrupt."""

    code = "no_such_interrupt"


class NoSuchSubscription(NotFound):
    """No such subscription."""

    code = "no_such_subscription"


class EventsExpired(ThreadlineError):
    """The events asked for are no longer kept."""

    code = "events_expired"
