"""What ships in deploy/ is checked, not just written: the Prometheus alerts by promtool (its rules valid, and
series that fire and do not fire each alert), over metric names the server really exports; every alert has its
runbook entry in docs/operations.md."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from tests.processes import ROOT

DEPLOY = ROOT / "deploy"
RULES = DEPLOY / "prometheus" / "alerts.yaml"
OPERATIONS = ROOT / "docs" / "operations.md"


def needs(tool: str, hint: str) -> str:
    """The tool's path; a skip that says why without it, or a failure under CI (scripts/test installs it)."""
    found = shutil.which(tool)
    if found is None:
        reason = f"{tool} is not installed ({hint})"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{reason}; CI=true needs it")
        pytest.skip(reason)
    return found


def _alerts() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def test_the_alert_rules_are_valid_and_each_fires_and_stays_quiet_as_tested() -> None:
    promtool = needs("promtool", "Debian package prometheus: apt-get install prometheus")
    checked = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run([promtool, "test", "rules", "alerts_test.yaml"], cwd=RULES.parent, capture_output=True,
                            text=True, timeout=60)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # Every alert is exercised by the unit tests (a new alert without tests fails here).
    exercised = set(re.findall(r"alertname: (\w+)", (RULES.parent / "alerts_test.yaml").read_text()))
    assert {a["alert"] for a in _alerts()} <= exercised


async def test_the_alerts_read_metrics_the_server_exports(http: httpx.AsyncClient) -> None:
    exported = set(re.findall(r"^# TYPE (\w+) (\w+)", (await http.get("/metrics")).text, re.M))
    names = {name for name, _ in exported} | {f"{name}_total" for name, kind in exported if kind == "counter"}
    used = {m for a in _alerts() for m in re.findall(r"\b(lg_api_\w+)", a["expr"])}
    assert used and used <= names, used - names


def test_every_alert_has_its_runbook_entry() -> None:
    headings = {h.strip().lower() for h in re.findall(r"^#+ (.+)$", OPERATIONS.read_text(), re.M)}
    for alert in _alerts():
        assert alert["alert"].lower() in headings, f"docs/operations.md has no section {alert['alert']}"
        assert alert["annotations"]["runbook"] == f"docs/operations.md#{alert['alert'].lower()}"
