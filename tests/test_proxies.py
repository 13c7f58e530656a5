"""Only `trusted_proxies` decides whether `X-Forwarded-For` names the client. uvicorn's defaults
(`proxy_headers=True`, `forwarded_allow_ips=127.0.0.1`) rewrote the client address from the header, before
Threadline saw the request, for any request from loopback: `threadline serve` turns that off."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.conftest import PROJECT
from tests.processes import serving


def statuses(url: str, forwarded_for: list[str]) -> list[int]:
    with httpx.Client(base_url=url, timeout=30) as client:
        return [client.post("/threads/search", json={}, headers={"x-forwarded-for": address}).status_code
                for address in forwarded_for]


@pytest.mark.e2e  # `threadline serve` behind each proxy setting
@pytest.mark.parametrize(("trusted", "expected"), [
    # Not trusted: every request is loopback's, whatever it claims; the third spends the budget.
    ("", [200, 200, 429]),
    # Loopback is a trusted proxy: each claimed address has its own budget.
    ("127.0.0.1", [200, 200, 200]),
])
def test_serve_reads_x_forwarded_for_only_from_trusted_proxies(tmp_path: Path, trusted: str,
                                                               expected: list[int]) -> None:
    args = ["--config", str(PROJECT), "--database-url", f"sqlite:///{tmp_path / 'threadline.db'}",
            "--workers", "1", "--rate-limit-requests", "2/day"]  # per day: a minute's boundary lets one more through
    if trusted:
        args += ["--trusted-proxies", trusted]
    with serving(tmp_path, *args) as (url, _):
        assert statuses(url, ["203.0.113.1", "203.0.113.2", "203.0.113.3"]) == expected
