"""docs/compatibility.md shows exactly the list of accepted differences in tests/differential/accepted.py."""

from __future__ import annotations

import re

from tests.differential.accepted import ACCEPTED, DOC, doc_section, table


def test_doc_table_is_the_accepted_list() -> None:
    assert doc_section(DOC.read_text()) == table(), (
        "docs/compatibility.md and tests/differential/accepted.py disagree: "
        "run `.venv/bin/python -m tests.differential.accepted` and commit the doc")


def test_every_entry_has_a_reason_and_valid_patterns() -> None:
    keys = [e.key for e in ACCEPTED]
    assert len(keys) == len(set(keys))
    for entry in ACCEPTED:
        assert len(entry.reason) > 20, entry.key
        for pattern in (entry.where, entry.field, entry.sessions):
            re.compile(pattern)
