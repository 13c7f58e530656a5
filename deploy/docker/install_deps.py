"""Install a project's langgraph.json `dependencies` into the image's Python, as `langgraph build` does.

- a local folder that is a package (`pyproject.toml` or `setup.py`): installed editable, from where it lies in
  the image (`pip install -e /deps/project/lib`), so its code is imported from there;
- a local folder that is not: its `requirements.txt`, if it has one (Threadline puts the folder itself on
  `sys.path` when it loads the graphs, as LangGraph's server does with its faux packages);
- anything else is a pip requirement (`langchain-openai`, `humanize>=4`), installed in one `pip install`.

`pip_config_file` in langgraph.json is passed to pip (`PIP_CONFIG_FILE`). Usage (the Dockerfile's):
`python install_deps.py /deps/project/langgraph.json [--dry-run]`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from threadline.config import load_config


def plan(config_path: Path) -> list[list[str]]:
    """The pip commands that install the project's dependencies, in order."""
    project = load_config(config_path)
    pip = [sys.executable, "-m", "pip", "install", "--no-cache-dir"]
    commands: list[list[str]] = []
    for folder in project.dependencies:
        if (folder / "pyproject.toml").exists() or (folder / "setup.py").exists():
            commands.append([*pip, "-e", str(folder)])
        elif (folder / "requirements.txt").exists():
            commands.append([*pip, "-r", str(folder / "requirements.txt")])
    if project.requirements:
        commands.append([*pip, *project.requirements])
    return commands


def main(argv: list[str]) -> int:
    config_path = Path(argv[0]).resolve()
    raw = json.loads(config_path.read_text())
    env = dict(os.environ)
    if raw.get("pip_config_file"):
        env["PIP_CONFIG_FILE"] = str((config_path.parent / raw["pip_config_file"]).resolve())
    for command in plan(config_path):
        print("+", " ".join(command), flush=True)
        if "--dry-run" not in argv:
            subprocess.run(command, check=True, env=env)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
