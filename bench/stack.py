"""The benchmark's stack: one durable local cluster, the rendered projects, the machine."""

from __future__ import annotations

import difflib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import jinja2
import yaml

from testkit.cluster import PG_BIN, Cluster

REPO = Path(__file__).resolve().parents[1]
SCHEMA = "pgqueue"
PEER_DATABASES = ("pgqueuer", "procrastinate", "pgmq", "pgflow")
MIGRATIONS = "supabase/migrations"

# Durable commits, as production runs: every commit waits for its WAL to reach the disk.
DURABLE_SETTINGS = {
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
    # room for the 1M-row scenario without a checkpoint storm in the middle of a figure
    "max_wal_size": "'4GB'",
    "shared_buffers": "'512MB'",
}


@dataclass
class Stack:
    cluster: Cluster
    workdir: Path
    projects: dict[str, Path] = field(default_factory=dict)

    def dsn(self, dbname: str = "postgres") -> str:
        return self.cluster.dsn(dbname)

    def destroy(self) -> None:
        self.cluster.destroy()
        shutil.rmtree(self.workdir, ignore_errors=True)


def start(transports: tuple[str, ...] = ("postgres", "supabase")) -> Stack:
    """A durable Supabase-like cluster with the queue pushed by the Supabase CLI, one rendered
    project per transport (the migrations are the same; they are pushed once), one per
    worker style that pg_net wakes (`http`, `http_supabase`, `edge`), and a database per
    peer."""
    # Imported here: worker processes import this module too, and need no copier.
    from testkit.project import push_migrations, render, snapshot_template
    from testkit.stack import start_supabase_like_cluster

    cluster = start_supabase_like_cluster(**DURABLE_SETTINGS)
    workdir = Path(tempfile.mkdtemp(prefix="pgqueue-bench-"))
    stack = Stack(cluster, workdir)
    try:
        template = snapshot_template(workdir / "template")
        # One project per transport, and one per worker style for the pg_net wake-up
        # scenarios (their migrations differ from the others' only in the fallback worker
        # URL, which the scenarios override with the wake-up settings, so they are not pushed).
        styles = {t: ("python", t) for t in transports} | {
            "http": ("python-http", "postgres"),
            "http_supabase": ("python-http", "supabase"),
            "edge": ("edge", "supabase"),
        }
        for name, (style, transport) in styles.items():
            stack.projects[name] = render(
                template,
                workdir / f"bench-{name}",
                project_name=f"Bench {name}",
                project_slug=f"bench-{name.replace('_', '-')}",
                package_name=f"bench_{name}",
                worker_style=style,
                claim_transport=transport,
            )
        # The transports' migrations differ only in the NOTIFY setting they seed (on for the
        # postgres transport, listed first): the scenarios that enqueue set it themselves.
        first, *others = (stack.projects[transport] for transport in transports)
        for other in others:
            if differing_lines(first / MIGRATIONS, other / MIGRATIONS):
                raise RuntimeError("the transports render different migrations: push each one")
        push_migrations(first, cluster.url())
        with cluster.connect(autocommit=True) as conn:
            # The sweeper would run once a minute in the middle of a figure: the benchmark
            # measures claims, not sweeps.
            conn.execute(
                "update cron.job set active = false where jobname = %s", (f"{SCHEMA}-sweep",)
            )
            for name in PEER_DATABASES:
                conn.execute(f"create database {name}")
    except BaseException:
        stack.destroy()
        raise
    return stack


def render_source(project: Path, source: str) -> str:
    """A file of the template repo (Jinja, e.g. a migration step under queue/) rendered with
    `project`'s answers, for scenarios that measure SQL a new project no longer has."""
    answers = yaml.safe_load((project / ".copier-answers.yml").read_text())
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(REPO), keep_trailing_newline=True)
    return env.get_template(source).render(answers)


def differing_lines(a: Path, b: Path) -> list[str]:
    """The lines of two projects' migrations that differ, but for the NOTIFY setting they seed
    (each such line names notify_listeners); a migration only one of them has, whole."""
    found = []
    for name in sorted({p.name for p in a.glob("*.sql")} | {p.name for p in b.glob("*.sql")}):
        if not (a / name).exists() or not (b / name).exists():
            found.append(name)
            continue
        diff = difflib.unified_diff(
            (a / name).read_text().splitlines(), (b / name).read_text().splitlines(), n=0
        )
        found += [
            f"{name}: {line}"
            for line in diff
            if line[:1] in "+-"
            and line[:3] not in ("+++", "---")
            and "notify_listeners" not in line
        ]
    return found


def server_settings(stack: Stack) -> dict[str, str]:
    names = [
        "server_version",
        "fsync",
        "synchronous_commit",
        "full_page_writes",
        "wal_sync_method",
        "shared_buffers",
        "max_wal_size",
        "autovacuum",
    ]
    with stack.cluster.connect() as conn:
        rows = conn.execute(
            "select name, setting, unit from pg_settings where name = any(%s)", (names,)
        ).fetchall()
    return {
        name: f"{setting}{'' if unit is None else ' x ' + unit}" for name, setting, unit in rows
    }


def machine() -> dict[str, object]:
    """What the figures were measured on, and how busy it was."""
    cpu = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem_kb = int(f.readline().split()[1])
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loadavg_at_start": os.getloadavg(),
        # what else was busy: other test suites share this machine's 2 cores
        "busiest_processes_at_start": subprocess.run(
            ["ps", "-eo", "pcpu,comm", "--sort=-pcpu"], capture_output=True, text=True
        ).stdout.splitlines()[1:6],
    }


def fsync_rate(directory: Path, seconds: int = 1) -> dict[str, float]:
    """pg_test_fsync's fdatasync figure (the default wal_sync_method on Linux) on the disk the
    cluster lives on: the floor under every durable commit."""
    target = directory / "pg_test_fsync.out"
    try:
        out = subprocess.run(
            [str(PG_BIN / "pg_test_fsync"), "-s", str(seconds), "-f", str(target)],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    finally:
        target.unlink(missing_ok=True)
    for line in out.splitlines():
        parts = line.split()
        if parts[:1] == ["fdatasync"] and "usecs/op" in line:
            return {"fdatasync_ms": float(parts[-2]) / 1000}
    return {}


def pip_install_editable(*projects: Path) -> None:
    """Install rendered projects into the benchmark's venv (their workers run from there)."""
    editable = [arg for project in projects for arg in ("-e", str(project))]
    if editable:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", *editable],
            check=True,
            capture_output=True,
        )


def wait_idle_autovacuum(stack: Stack, timeout: float = 30) -> None:
    """Let a running autovacuum finish, so it does not compete with the next figure."""
    deadline = time.monotonic() + timeout
    with stack.cluster.connect(autocommit=True) as conn:
        while time.monotonic() < deadline:
            busy = conn.execute(
                "select count(*) from pg_stat_activity where backend_type = 'autovacuum worker'"
            ).fetchone()[0]
            if not busy:
                return
            time.sleep(0.2)
