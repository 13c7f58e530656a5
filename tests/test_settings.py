from __future__ import annotations

import json
from pathlib import Path

import pytest

from threadline.config import load_config
from threadline.errors import ConfigError
from threadline.settings import Settings

DOCS = Path(__file__).parents[1] / "docs" / "configuration.md"


def test_every_setting_is_documented() -> None:
    text = DOCS.read_text()
    for name in Settings.names():
        assert f"`{name}`" in text and f"THREADLINE_{name.upper()}" in text, name


def test_precedence_flag_over_env_over_default() -> None:
    env = {"THREADLINE_PORT": "9000", "THREADLINE_WORKERS": "3"}
    s = Settings.resolve({"port": 9100}, environ=env)
    assert s.port == 9100 and s.workers == 3 and s.host == "127.0.0.1"


def test_bad_env_value_is_reported() -> None:
    with pytest.raises(SystemExit, match="THREADLINE_PORT"):
        Settings.resolve(environ={"THREADLINE_PORT": "eighty"})


def test_unsupported_keys_are_reported(tmp_path: Path) -> None:
    path = tmp_path / "langgraph.json"
    path.write_text(json.dumps({"graphs": {"a": "./a.py:g"}, "frobnicate": {"x": "x"}, "python_version": "3.11",
                                "checkpointer": {"ttl": {}}}))
    cfg = load_config(path)
    assert "frobnicate" in cfg.unsupported and "checkpointer.ttl" not in cfg.unsupported
    assert cfg.ignored == ["python_version"]


def test_graph_import_failure_names_the_line(tmp_path: Path) -> None:
    from threadline.core.graphs import GraphRegistry

    (tmp_path / "broken.py").write_text("raise RuntimeError('kaboom')\n")
    path = tmp_path / "langgraph.json"
    path.write_text(json.dumps({"graphs": {"b": "./broken.py:graph"}}))
    with pytest.raises(ConfigError) as err:
        GraphRegistry.load(load_config(path))
    assert "./broken.py:graph" in str(err.value) and "kaboom" in str(err.value)


def test_bad_default_agent_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "langgraph.json"
    path.write_text(json.dumps({"graphs": {"a": "./a.py:g"}, "threadline": {"default_agent": "zzz"}}))
    with pytest.raises(ConfigError, match="zzz"):
        load_config(path)


async def test_http_app_is_mounted_beside_our_routes(tmp_path: Path) -> None:
    import httpx
    from asgi_lifespan import LifespanManager

    from threadline.api.app import create_app

    config = Path(__file__).parent / "project" / "http_app.json"
    app = create_app(Settings(config=str(config), database_url=f"sqlite:///{tmp_path / 'db'}", workers=0))
    async with LifespanManager(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            assert (await client.get("/custom/hello")).json() == {"hello": "from the project"}
            assert (await client.get("/ok")).json() == {"ok": True}
            assert (await client.post("/assistants/search", json={})).json()[0]["graph_id"] == "counter"


def test_urls_are_printed_without_their_password() -> None:
    from threadline.settings import redact_url

    assert redact_url("postgresql://app:s3cret@db:5432/prod") == "postgresql://app@db:5432/prod"
    assert redact_url("redis://:s3cret@cache:6379/0") == "redis://@cache:6379/0"
    assert redact_url("host=db user=app password=s3cret dbname=prod") == "host=db user=app password=*** dbname=prod"
    assert redact_url("sqlite:///var/lib/tl.db") == "sqlite:///var/lib/tl.db"


def test_dependencies_that_name_packages_are_checked_not_installed(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """`dependencies` holds folders and package names (as LangGraph's CLI reads it); a package that is not
    installed is named at startup with the command that installs it, and nothing is installed."""
    from threadline.core.runtime import Runtime

    (tmp_path / "lib").mkdir()
    (tmp_path / "agent.py").write_text("from threadline.example.agents import echo as graph\n")
    path = tmp_path / "langgraph.json"
    path.write_text(json.dumps({"graphs": {"a": "./agent.py:graph"},
                                "dependencies": [".", "lib", "orjson>=3", "tinyfoo-not-installed>=1.2"]}))
    cfg = load_config(path)
    assert cfg.dependencies == [tmp_path, tmp_path / "lib"]
    assert cfg.requirements == ["orjson>=3", "tinyfoo-not-installed>=1.2"]
    with caplog.at_level("WARNING", logger="threadline"):
        Runtime.load_project(Settings(config=str(path)))
    [warning] = [r.getMessage() for r in caplog.records if "dependencies not installed" in r.getMessage()]
    assert warning.startswith("langgraph.json dependencies not installed: tinyfoo-not-installed>=1.2\n")
    assert warning.endswith("-m pip install 'tinyfoo-not-installed>=1.2'")


def test_dependencies_must_be_a_list_of_strings(tmp_path: Path) -> None:
    path = tmp_path / "langgraph.json"
    path.write_text(json.dumps({"graphs": {"a": "./a.py:g"}, "dependencies": "."}))
    with pytest.raises(ConfigError, match="'dependencies' must be a list"):
        load_config(path)
