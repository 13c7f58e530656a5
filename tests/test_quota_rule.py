"""The quota rule is written twice: in Python (`storage/rules.py: quota_refusal`, which SQLite's enqueue applies
and which words every refusal) and in PostgreSQL (`threadline_check_quota`, migration 0009, which refuses
inside the counting statement so the enqueue needs no round trip of its own). They must agree case for case:
this test puts both through one table of cases."""

from __future__ import annotations

import itertools

import psycopg
import pytest

from tests.services import ScaleOut
from threadline.errors import QuotaExceeded
from threadline.storage import open_storage
from threadline.storage.base import Quota
from threadline.storage.postgres import QUOTA_SQLSTATE
from threadline.storage.rules import counted_identity, quota_refusal

pytestmark = pytest.mark.integration

#: Every combination of: no identity or one; per-identity cap off, 1 or 3; queue cap off, 1 or 3; the
#: identity's and the queue's active runs below, at and past each cap (the queue's never fewer than the
#: identity's, which it counts).
CASES = [
    (Quota(identity, per_identity, total_cap), mine, max(total, mine))
    for identity, per_identity, total_cap, mine, total in itertools.product(
        [None, "alice"], [0, 1, 3], [0, 1, 3], [0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 7])
]


def _python_refuses(quota: Quota, mine: int, total: int) -> bool:
    try:
        quota_refusal(quota, mine, total)
    except QuotaExceeded:
        return True
    return False


async def test_the_sql_function_and_the_python_rule_agree_case_for_case(scaleout_services: ScaleOut) -> None:
    url = scaleout_services.fresh().database_url
    await (await open_storage(url)).close()  # migrated
    refused_by: dict[str, list[tuple[Quota, int, int]]] = {"python": [], "postgres": []}
    with psycopg.connect(url, autocommit=True) as conn:
        for quota, mine, total in CASES:
            # As `check_quota` calls it (`statements.py`): counted when the run is stored under an identity.
            try:
                conn.execute("SELECT threadline_check_quota(%s, %s, %s, %s, %s)",
                             (mine, total, quota.per_identity, quota.total, counted_identity(quota) is not None))
            except psycopg.Error as exc:
                assert exc.sqlstate == QUOTA_SQLSTATE, exc
                # The counts travel in the detail, for `quota_refusal` to word the refusal.
                assert exc.diag.message_detail == f"{mine} {total}"
                refused_by["postgres"].append((quota, mine, total))
            if _python_refuses(quota, mine, total):
                refused_by["python"].append((quota, mine, total))
    assert refused_by["postgres"] == refused_by["python"]
    # The table holds both answers, so agreeing is not trivially "never" or "always".
    assert 0 < len(refused_by["python"]) < len(CASES)
