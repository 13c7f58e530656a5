"""The environments the suite needs besides `./.venv`, built by `scripts/test` before any test starts.

    .venv/bin/python -m tests.environments        # build what is missing (scripts/test runs this)

- LangGraph's own server, the differential suite's oracle (`tests/differential/`), pinned in
  `tests/differential/reference.txt`, with every package beneath it at the versions
  `tests/differential/reference-constraints.txt` pins (`scripts/lock` writes both constraint files);
- the front-end tests' page and tools (`tests/frontend/`): its npm packages as `package-lock.json` pins them
  (`npm ci`: `useStream`, React, esbuild, and LangGraph's generative UI bundler), and the page built with esbuild;
- a venv per other supported Python this machine has (`python3.12` on PATH or in pyenv), for
  `tests/test_pythons.py`, with Threadline's dependencies (the test extras included, at the versions
  `constraints.txt` pins) but not Threadline: the test runs the checkout itself through PYTHONPATH, so a change
  to the code needs no reinstall.

Each lives in a cache outside the checkout (`$THREADLINE_ENV_CACHE`, else `$XDG_CACHE_HOME/threadline`, else
`~/.cache/threadline`), in a folder named for what it holds (the Python's version and a hash of the pins), so a
fresh clone on a machine that built it before finds it at once, and a change of pins builds a new one beside it.
`./.venv-ref` and `./.venv-py3.X` are links to them (the front-end's folder is found by `frontend_build()`). A
build is bounded (`BUILD_SECONDS`); one that fails or overruns is reported and left out, and the tests that need
it skip with that reason (fail under CI=true).

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
CONSTRAINTS = ROOT / "constraints.txt"  # the versions scripts/test installs (scripts/lock writes it)
REFERENCE_CONSTRAINTS = ROOT / "tests" / "differential" / "reference-constraints.txt"  # the same, for .venv-ref
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


def _build(link: Path, name: str, python: str, requirements: list[str], *,
           constraints: Path | None = None) -> str | None:
    """Build (or find) the cached venv `name` with `requirements` (at the versions `constraints` pins) and point
    `link` at it; an error, or None."""
    target = cache_root() / name
    if not ready(target):
        shutil.rmtree(target, ignore_errors=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        print(f"tests.environments: building {target} (once; cached for later runs)", flush=True)
        try:
            subprocess.run([python, "-m", "venv", str(target)], check=True, timeout=300, capture_output=True)
            pip = [str(target / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
            subprocess.run([*pip, "--upgrade", "pip"], check=True, timeout=BUILD_SECONDS, capture_output=True)
            pinned = ["-c", str(constraints)] if constraints is not None and constraints.exists() else []
            subprocess.run([*pip, *requirements, *pinned], check=True, timeout=BUILD_SECONDS,
                           capture_output=True, cwd=ROOT)
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
    locked = REFERENCE_CONSTRAINTS.read_text() if REFERENCE_CONSTRAINTS.exists() else ""
    return _build(ROOT / ".venv-ref", f"reference-py{version}-{_key(python, pins, locked)}", python, requirements,
                  constraints=REFERENCE_CONSTRAINTS)


def build_other_python(version: str) -> str | None:
    python = find_python(version)
    if python is None:
        return None  # not installed here: tests/test_pythons.py skips and says so
    requirements = threadline_requirements()
    pins = CONSTRAINTS.read_text() if CONSTRAINTS.exists() else ""
    return _build(python_venv(version), f"deps-py{version}-{_key(python, *requirements, pins)}", python, requirements,
                  constraints=CONSTRAINTS)


FRONTEND = ROOT / "tests" / "frontend"
NPM_FILES = ("package.json", "package-lock.json")


def frontend_build() -> Path:
    """The front-end's cached folder for the current pins (built or not): `node_modules/`, and `dist/` with the
    page (`index.html`, `app.js`)."""
    key = _key(*((FRONTEND / name).read_text() for name in NPM_FILES))
    return cache_root() / f"frontend-{key}"


def _page_sources() -> list[Path]:
    return sorted(p for p in (FRONTEND / "src").iterdir() if p.is_file())


def frontend_missing() -> str | None:
    """Why the front-end tests cannot run here, or None."""
    folder = frontend_build()
    if not (folder / COMPLETE).exists():
        return f"the front-end build {folder} is missing (scripts/test builds it: python -m tests.environments)"
    stamp = folder / "dist" / COMPLETE
    if not stamp.exists() or stamp.read_text() != _key(*(p.read_text() for p in _page_sources())):
        return f"the page in {folder / 'dist'} is older than tests/frontend/src (python -m tests.environments)"
    return None


def build_frontend() -> str | None:
    """`npm ci` into the cached folder once per pins; the page rebuilt (esbuild, about a second) when its sources
    change. An error, or None (the front-end tests then skip with the reason, and fail under CI=true)."""
    npm = shutil.which("npm")
    if npm is None:
        return "npm is not installed (Debian: apt-get install npm)"
    target = frontend_build()
    try:
        if not (target / COMPLETE).exists():
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True)
            print(f"tests.environments: building {target} (once; cached for later runs)", flush=True)
            for name in NPM_FILES:
                shutil.copy(FRONTEND / name, target / name)
            subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=target, check=True,
                           timeout=BUILD_SECONDS, capture_output=True)
            (target / COMPLETE).write_text(target.name)
        sources = _page_sources()
        stamp = _key(*(p.read_text() for p in sources))
        dist = target / "dist"
        if not (dist / COMPLETE).exists() or (dist / COMPLETE).read_text() != stamp:
            shutil.rmtree(target / "src", ignore_errors=True)
            shutil.rmtree(dist, ignore_errors=True)
            (target / "src").mkdir()
            for source in sources:  # built inside the folder, so esbuild finds node_modules beside it
                shutil.copy(source, target / "src" / source.name)
            subprocess.run([str(target / "node_modules" / ".bin" / "esbuild"), "src/main.tsx", "--bundle",
                            "--outfile=dist/app.js", "--format=iife", "--target=es2020", "--jsx=automatic",
                            "--define:process.env.NODE_ENV=\"production\"", "--log-level=warning"],
                           cwd=target, check=True, timeout=300, capture_output=True)
            shutil.copy(target / "src" / "index.html", dist / "index.html")
            (dist / COMPLETE).write_text(stamp)
    except subprocess.TimeoutExpired as exc:
        return f"building {target} took longer than {exc.timeout:.0f} s"
    except subprocess.CalledProcessError as exc:
        detail = ((exc.stderr or b"") + (exc.stdout or b"")).decode(errors="replace")[-3000:]
        return f"building {target} failed ({' '.join(map(str, exc.cmd[:3]))}…):\n{detail}"
    return None


def main() -> int:
    for label, build in [("the reference server", lambda: build_reference(base_python())),
                         ("the front-end tests' page", build_frontend),
                         *((f"Python {v}", lambda v=v: build_other_python(v)) for v in other_versions())]:
        error = build()
        if error:
            print(f"tests.environments: could not build the venv for {label}: {error}", file=sys.stderr)
    # Not fatal here: the tests that need a missing venv say so (skip locally, fail under CI=true).
    return 0


if __name__ == "__main__":
    sys.exit(main())
