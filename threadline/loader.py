"""Loading the Python objects a langgraph.json names: `./file.py:attr` or `package.module:attr`."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import traceback
from pathlib import Path
from typing import Any

from threadline.errors import ConfigError


def load_object(spec: str, root: Path, *, what: str) -> Any:
    """The object `spec` names; a file path is relative to the project `root`.

    Any failure is a ConfigError carrying the spec and the traceback, so startup says which line broke.
    """
    module_ref, _, attr = spec.rpartition(":")
    if not module_ref or not attr:
        raise ConfigError(f"{what} '{spec}' must be 'path.py:attr' or 'module:attr'")
    try:
        module = _load_file(module_ref, root) if _is_file(module_ref) else _load_module(module_ref, root)
        return getattr(module, attr)
    except ConfigError:
        raise
    except Exception as exc:
        missing = missing_package(exc, root)
        if missing:
            raise ConfigError(f"failed to load {what} '{spec}': {missing}") from exc
        raise ConfigError(f"failed to load {what} '{spec}':\n{traceback.format_exc()}") from exc


def missing_package(exc: BaseException, root: Path) -> str | None:
    """For an import of a module that is not installed (`exc` or what caused it): a message naming the
    package and the command that installs it into this Python, else None.

    Threadline does not install a project's dependencies (as `langgraph dev` does not); it says how.
    """
    missing: BaseException | None = exc
    while missing is not None and not isinstance(missing, ModuleNotFoundError):
        missing = missing.__cause__ or missing.__context__  # e.g. LangChain's ImportError raised from it
    if missing is None or not missing.name:
        return None
    module = missing.name.split(".")[0]
    package = module.replace("_", "-")
    python = sys.executable
    commands = [f"{python} -m pip install {package}"]
    if (root / "requirements.txt").is_file():
        commands.insert(0, f"{python} -m pip install -r {root / 'requirements.txt'}")
    elif (root / "pyproject.toml").is_file():
        commands.insert(0, f"{python} -m pip install -e {root}")
    where = _project_frame(missing, root)
    return (f"module '{missing.name}' is not installed{where}; it is usually in the package '{package}'.\n"
            f"  hint: install the project's dependencies into the Python that runs Threadline: "
            + "  or  ".join(commands))


def _project_frame(exc: BaseException, root: Path) -> str:
    """` (imported at file:line)`: the last frame of the traceback inside the project, if any."""
    inside = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith(str(root))]
    return f" (imported at {inside[-1].filename}:{inside[-1].lineno})" if inside else ""


def _is_file(module_ref: str) -> bool:
    return module_ref.endswith(".py") or "/" in module_ref


def _load_file(module_ref: str, root: Path) -> Any:
    path = (root / module_ref).resolve()
    if not path.is_file():
        raise ConfigError(f"file {module_ref} not found under {root}")
    name = f"threadline_project.{path.stem}_{abs(hash(str(path)))}"
    module = sys.modules.get(name)
    if module is None:
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise ConfigError(f"cannot load {path}")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        module_spec.loader.exec_module(module)
    return module


def _load_module(module_ref: str, root: Path) -> Any:
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return importlib.import_module(module_ref)


def resolve_store_index(index: dict[str, Any] | None, root: Path) -> dict[str, Any] | None:
    """`store.index` with a string `embed` that names project code replaced by that object.

    LangGraph's store only understands `"provider:model"` strings (through langchain's `init_embeddings`);
    langgraph.json also allows `"./file.py:attr"` and `"module:attr"`. A string naming no importable
    module (e.g. `"openai:text-embedding-3-small"`) is left for LangGraph.
    """
    if not index or not isinstance(index.get("embed"), str):
        return index
    spec: str = index["embed"]
    module_ref = spec.rpartition(":")[0]
    if not _is_file(module_ref):
        try:
            _load_module(module_ref, root)
        except ImportError:
            return index  # a "provider:model" string
    target = load_object(spec, root, what="store.index.embed")
    from langchain_core.embeddings import Embeddings

    if isinstance(target, type) and issubclass(target, Embeddings):
        target = target()
    return {**index, "embed": target}
