"""RSS at rest of Threadline's processes, and which of the modules they import are ours to avoid (issue 24).

    python bench/rest_rss.py --src /work/main --src . --pairs 3     # A/B, alternated; ready, +3 s, then VmRSS

Per source checkout: `threadline serve` (embedded, SQLite), and on PostgreSQL + Redis `threadline serve --workers 0`
(the API process) and `threadline worker`; each started fresh, asked `/ok` (the API processes), left 3 s at rest,
then read. `--modules` also lists, per process, whether a2a / mcp_types / opentelemetry.sdk / ... were imported
(from `-X importtime`, a second start)."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness
import scaleout

ADMIN = "postgresql://postgres@127.0.0.1:5432/test"
REDIS = "redis://127.0.0.1:6379/0"
WATCHED = ("a2a", "google.protobuf", "mcp_types", "opentelemetry.sdk", "opentelemetry.exporter", "limits",
           "prometheus_client", "watchfiles", "jinja2", "threadline.api.a2a", "threadline.api.mcp", "threadline.ui",
           "threadline.api.docs", "threadline.bundler", "fastapi")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(pid)


def wait_ok(url: str, proc: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/ok", timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"{url} not ready")


def wait_line(path: Path, proc: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if scaleout.WORKER_LINE.search(path.read_text(errors="replace")):
            return
        if proc.poll() is not None:
            raise SystemExit(f"worker exited with {proc.returncode}")
        time.sleep(0.2)
    raise SystemExit("worker not ready")


def imported(log: Path) -> set[str]:
    return {line.rsplit("|", 1)[1].strip() for line in log.read_text(errors="replace").splitlines()
            if line.startswith("import time:") and "|" in line}


def one(src: str, tmp: Path, importtime: bool) -> dict[str, object]:
    """One fresh start of each process; RSS 3 s after ready (and the modules, with `importtime`)."""
    tl = [sys.executable, "-m", "threadline"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("THREADLINE_")}
    env.update({"PYTHONPATH": str(Path(src).resolve()), "LANGSMITH_TRACING": "false", "PYTHONUNBUFFERED": "1"})
    if importtime:
        env["PYTHONPROFILEIMPORTTIME"] = "1"
    out: dict[str, object] = {}
    procs = scaleout.Procs()
    token = uuid.uuid4().hex[:10]
    dbname = f"threadline_rest_{token}"
    db_url = scaleout.database_url(ADMIN, dbname)
    pg_env = scaleout.clean_env(env, db_url, REDIS, f"tlrest-{token}")
    scaleout.create_database(ADMIN, dbname)
    try:
        port = harness.free_port()
        log = tmp / f"embedded-{token}.log"
        proc = procs.start("embedded", [*tl, "serve", "--config", str(harness.PROJECT_DIR / "langgraph.json"),
                                        "--port", str(port), "--database-url", f"sqlite:///{tmp / token}.db",
                                        "--log-level", "warning"], env, log)
        wait_ok(f"http://127.0.0.1:{port}", proc)
        time.sleep(3)
        out["embedded"] = rss_mb(proc.pid) if not importtime else imported(log)
        procs.stop_all()
        subprocess.run([*tl, "migrate"], env=pg_env, check=True, capture_output=True, timeout=120)
        port = harness.free_port()
        wlog, alog = tmp / f"worker-{token}.log", tmp / f"api-{token}.log"
        worker = procs.start("worker", [*tl, "worker"], pg_env, wlog)
        api = procs.start("api", [*tl, "serve", "--port", str(port), "--workers", "0"], pg_env, alog)
        wait_line(wlog, worker)
        wait_ok(f"http://127.0.0.1:{port}", api)
        time.sleep(3)
        if importtime:
            out["api"], out["worker"] = imported(alog), imported(wlog)
        else:
            out["api"], out["worker"] = rss_mb(api.pid), rss_mb(worker.pid)
    finally:
        procs.stop_all()
        scaleout.drop_database(ADMIN, dbname)
        scaleout.delete_redis_keys(REDIS, f"tlrest-{token}")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src", action="append", required=True, help="A checkout whose `threadline` is measured (repeat).")
    p.add_argument("--pairs", type=int, default=3, help="Rounds; each starts every --src once, alternated.")
    p.add_argument("--modules", action="store_true", help="Also list which WATCHED modules each process imported.")
    cfg = p.parse_args()
    print(f"load average {os.getloadavg()}")
    rows: dict[str, dict[str, list[float]]] = {s: {"embedded": [], "api": [], "worker": []} for s in cfg.src}
    with tempfile.TemporaryDirectory(prefix="tl-rest-") as folder:
        tmp = Path(folder)
        for _ in range(cfg.pairs):
            for src in cfg.src:
                got = one(src, tmp, importtime=False)
                for role, mb in got.items():
                    rows[src][role].append(float(mb))  # type: ignore[arg-type]
                print(src, {k: round(float(v), 1) for k, v in got.items()}, flush=True)  # type: ignore[arg-type]
        for src in cfg.src:
            print(f"{src}: " + ", ".join(f"{role} {statistics.median(v):.1f} MB (median of {len(v)}: "
                                         f"{' '.join(f'{x:.0f}' for x in v)})" for role, v in rows[src].items())
                  + f"; api + worker {sum(statistics.median(rows[src][r]) for r in ('api', 'worker')):.1f}")
        if cfg.modules:
            for src in cfg.src:
                mods = one(src, tmp, importtime=True)
                for role, names in mods.items():
                    seen = [w for w in WATCHED if any(n == w or n.startswith(w + ".") for n in names)]  # type: ignore[union-attr]
                    print(f"{src} {role}: {len(names)} modules; of the watched: {' '.join(seen) or '-'}")  # type: ignore[arg-type]
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
