"""Each of Threadline's errors becomes one error on each wire, decided in one place (`threadline.api.errors`):
an HTTP status, a JSON-RPC code (A2A, MCP) and a Protocol v2 code."""

from __future__ import annotations

import inspect

import pytest

from threadline import errors
from threadline.api.errors import STATUS, protocol_error, rpc_error

ALL = [cls for _, cls in inspect.getmembers(errors, inspect.isclass) if issubclass(cls, errors.ThreadlineError)]


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_every_error_has_an_http_status_and_its_own_message(cls: type[errors.ThreadlineError]) -> None:
    assert cls is errors.ThreadlineError or any(issubclass(cls, mapped) for mapped in STATUS), cls
    assert cls().message == (cls.__doc__ or "").strip()


@pytest.mark.parametrize(("cls", "code"), [
    # The A2A specification's JSON-RPC codes for its own errors.
    (errors.TaskNotFound, -32001), (errors.TaskNotCancelable, -32002),
    (errors.PushNotificationNotSupported, -32003), (errors.UnsupportedOperation, -32004),
    (errors.ContentTypeNotSupported, -32005), (errors.ExtendedCardNotConfigured, -32007),
    # The rest of a caller's mistakes are invalid params; a server fault is an internal error.
    (errors.NotFound, -32602), (errors.InvalidInput, -32602), (errors.BadRequest, -32602), (errors.Conflict, -32602),
    (errors.ConfigError, -32603),
])
def test_json_rpc_codes(cls: type[errors.ThreadlineError], code: int) -> None:
    assert rpc_error(cls("told")) == (code, "told", None)


@pytest.mark.parametrize(("exc", "code", "data"), [
    # What the client may try again says when, as HTTP's Retry-After.
    (errors.StorageUnavailable("told"), -32603, {"code": "storage_unavailable", "retry_after": 1}),
    (errors.QuotaExceeded("told"), -32000, {"code": "quota_exceeded", "retry_after": 5}),
    (errors.TooManyStreams("told"), -32000, {"code": "too_many_streams", "retry_after": 5}),
])
def test_json_rpc_retryable_errors(exc: errors.ThreadlineError, code: int, data: dict[str, object]) -> None:
    assert rpc_error(exc) == (code, "told", data)


def test_a_json_rpc_answer_never_shows_another_exception() -> None:
    assert rpc_error(RuntimeError("connection to 10.0.0.5 refused")) == (-32603, "Internal error", None)


@pytest.mark.parametrize(("exc", "answer"), [
    (errors.NoSuchRun("r"), ("no_such_run", "r", {})),
    (errors.NoSuchInterrupt("i"), ("no_such_interrupt", "i", {})),
    (errors.NoSuchSubscription("s"), ("no_such_subscription", "s", {})),
    (errors.EventsExpired("gone", since=3, min_available_seq=9), ("resume_gap", "gone", {"since": 3,
                                                                                       "min_available_seq": 9})),
    (errors.InvalidInput("x"), ("invalid_argument", "x", {})),
    (errors.BadRequest("x"), ("invalid_argument", "x", {})),
    (errors.Conflict("x"), ("invalid_argument", "x", {})),
    (errors.NotFound("x"), ("invalid_argument", "x", {})),
    (errors.StorageUnavailable("x"), ("unknown_error", "x", {"retry_after": 1})),
    (errors.QuotaExceeded("x"), ("quota_exceeded", "x", {"retry_after": 5})),
])
def test_protocol_v2_codes(exc: errors.ThreadlineError, answer: tuple[str, str, dict]) -> None:
    assert protocol_error(exc) == answer
