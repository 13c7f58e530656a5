"""The environments the suite needs besides `./.venv`, built by `scripts/test` before any test starts.

    .venv/bin/python -m tests.environments        # build what is missing (scripts/test runs this)

- LangGraph's own server, the differential suite's oracle (`tests/differential/`), pinned in
  `tests/differential/reference.txt`;
- a venv per other supported Python this machine has (`python3.12` on PATH or in pyenv), for
  `tests/test_pythons.py`, with Threadline's dependencies (the test extras included) but not Threadline: the test
  runs the checkout itself through PYTHONPATH, so a change to the code needs no reinstall.

Each lives in a cache outside the checkout (`$THREADLINE_ENV_CACHE`, else `$XDG_CACHE_HOME/threadline`, else
`~/.cache/threadline`), in a folder named for what it holds (the Python's version and a hash of the pins), so a
fresh clone on a machine that built it before finds it at once, and a change of pins builds a new one beside it.
`./.venv-ref` and `./.venv-py3.X` are links to them. A build is bounded (`BUILD_SECONDS`); one that fails or
overruns is reported and left out, and the tests that need it skip with that reason (fail under CI=true).

Nothing here is built inside a test: a test bounded at 120 s cannot also wait for pip.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUPPORTED = ["3.11", "3.12", "3.13"]
REFERENCE_PINS = ROOT / "tests" / "differential" / "reference.txt"
BUILD_SECONDS = 900  # one venv's pip install, on a slow machine with a cold cache
COMPLETE = ".complete"  # written last: a folder without it is a build that did not finish


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def cache_root() -> Path:
    if os.environ.get("THREADLINE_ENV_CACHE"):
        return Path(os.environ["THREADLINE_ENV_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "threadline"


def _works(python: str, version: str) -> bool:
    try:
        out = subprocess.run([python, "-c", "import sys, venv; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and out.stdout.strip() == version


def find_python(version: str) -> str | None:
    """An interpreter of this minor version: `python3.X` on PATH, else one of pyenv's versions."""
    on_path = shutil.which(f"python{version}")
    if on_path and _works(on_path, version):
        return on_path
    pyenv = shutil.which("pyenv")
    if pyenv:
        listed = subprocess.run([pyenv, "versions", "--bare"], capture_output=True, text=True, timeout=30)
        root = subprocess.run([pyenv, "root"], capture_output=True, text=True, timeout=30).stdout.strip()
        for name in sorted(listed.stdout.split(), reverse=True):
            candidate = Path(root) / "versions" / name / "bin" / "python"
            if name.startswith(f"{version}.") and candidate.exists() and _works(str(candidate), version):
                return str(candidate)
    return None


def other_versions() -> list[str]:
    """The supported minor versions other than the suite's own."""
    own = "{}.{}".format(*sys.version_info[:2])
    return [v for v in SUPPORTED if v != own]


def threadline_requirements() -> list[str]:
    """Threadline's dependencies with its test extras, as pyproject.toml declares them; an extra that names
    Threadline's own (`threadline[otel]`) is replaced by that extra's requirements (Threadline itself is not
    installed in these venvs: the checkout runs through PYTHONPATH)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras: dict[str, list[str]] = project["optional-dependencies"]

    def expand(requirements: list[str]) -> list[str]:
        out: list[str] = []
        for requirement in requirements:
            name, _, rest = requirement.partition("[")
            if name.strip() == project["name"]:
                for extra in rest.split("]", 1)[0].split(","):
                    out += expand(extras[extra.strip()])
            else:
                out.append(requirement)
        return out

    return expand([*project["dependencies"], *extras["test"]])


def _key(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def python_venv(version: str) -> Path:
    """Where the venv for Python `version` is (built or not): `./.venv-py<version>`."""
    return ROOT / f".venv-py{version}"


def reference_venv() -> Path:
    """The reference server's venv: `$THREADLINE_REF_VENV`, else `./.venv-ref`."""
    return Path(os.environ.get("THREADLINE_REF_VENV") or ROOT / ".venv-ref")


def ready(venv: Path) -> bool:
    return (venv / COMPLETE).exists() and (venv / "bin" / "python").exists()


def _build(link: Path, name: str, python: str, requirements: list[str]) -> str | None:
    """Build (or find) the cached venv `name` with `requirements` and point `link` at it; an error, or None."""
    target = cache_root() / name
    if not ready(target):
        shutil.rmtree(target, ignore_errors=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        print(f"tests.environments: building {target} (once; cached for later runs)", flush=True)
        try:
            subprocess.run([python, "-m", "venv", str(target)], check=True, timeout=300, capture_output=True)
            pip = [str(target / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
            subprocess.run([*pip, "--upgrade", "pip"], check=True, timeout=BUILD_SECONDS, capture_output=True)
            subprocess.run([*pip, *requirements], check=True, timeout=BUILD_SECONDS, capture_output=True,
                           cwd=ROOT)
        except subprocess.TimeoutExpired as exc:
            return f"building {target} took longer than {exc.timeout:.0f} s"
        except subprocess.CalledProcessError as exc:
            detail = (exc.stderr or b"").decode(errors="replace")[-3000:]
            return f"building {target} failed ({' '.join(map(str, exc.cmd[:6]))}…):\n{detail}"
        (target / COMPLETE).write_text(name)
    if link.is_symlink() or link.exists():
        if link.resolve() == target.resolve():
            return None
        if link.is_symlink() or link.is_file():
            link.unlink()
        else:
            shutil.rmtree(link)  # a venv an older scripts/test built in place
    link.symlink_to(target)
    return None


def base_python() -> str:
    """The interpreter the suite's own venv was made from (the same path in every clone)."""
    return os.path.realpath(getattr(sys, "_base_executable", sys.executable))


def build_reference(python: str) -> str | None:
    pins = REFERENCE_PINS.read_text()
    version = "{}.{}".format(*sys.version_info[:2])
    requirements = [line.strip() for line in pins.splitlines() if line.strip() and not line.startswith("#")]
    return _build(ROOT / ".venv-ref", f"reference-py{version}-{_key(python, pins)}", python, requirements)


def build_other_python(version: str) -> str | None:
    python = find_python(version)
    if python is None:
        return None  # not installed here: tests/test_pythons.py skips and says so
    requirements = threadline_requirements()
    return _build(python_venv(version), f"deps-py{version}-{_key(python, *requirements)}", python, requirements)


def main() -> int:
    for label, build in [("the reference server", lambda: build_reference(base_python())),
                         *((f"Python {v}", lambda v=v: build_other_python(v)) for v in other_versions())]:
        error = build()
        if error:
            print(f"tests.environments: could not build the venv for {label}: {error}", file=sys.stderr)
    # Not fatal here: the tests that need a missing venv say so (skip locally, fail under CI=true).
    return 0


if __name__ == "__main__":
    sys.exit(main())
