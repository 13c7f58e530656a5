"""Identifiers: what counts as one."""

from __future__ import annotations

import uuid
from typing import Any


def is_uuid(value: Any) -> bool:
    """Whether `value` reads as a UUID (ids clients send may also be graph names or free text)."""
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True
