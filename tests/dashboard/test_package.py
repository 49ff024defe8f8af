"""The dashboard as a project ships it: in the Python project's wheel (what the Dockerfile
installs), with its page templates and stylesheet, which an editable install would not miss;
and in an edge project's dashboard/, a Python project of its own, made of the same files."""

from __future__ import annotations

import json
import os
import subprocess
import zipfile
from pathlib import Path

import psycopg

from testkit.cluster import Cluster
from testkit.project import render, run

from .conftest import EdgeDashboard


def test_the_wheel_carries_the_dashboards_pages(template: Path, tmp_path: Path) -> None:
    project = render(template, tmp_path / "app", worker_style="python")
    run(["uv", "build", "--wheel", "--quiet", "--out-dir", tmp_path / "dist"], cwd=project)
    [wheel] = (tmp_path / "dist").glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    source = project / "src"
    shipped = {
        path.relative_to(source).as_posix()
        for path in (source / "my_app" / "dashboard").rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    assert {
        "my_app/dashboard/templates/overview.html",
        "my_app/dashboard/static/dashboard.css",
    } <= shipped
    assert shipped <= names


def test_the_edge_dashboard_is_the_same_dashboard(
    template: Path, tmp_path: Path, edge_dashboard: EdgeDashboard
) -> None:
    """One source of truth: the edge project's dashboard/ includes the Python variant's files."""
    python = render(template, tmp_path / "app", worker_style="python") / "src" / "my_app"
    edge = edge_dashboard.path / "src" / "my_app"

    def files(package: Path) -> dict[str, bytes]:
        return {
            path.relative_to(package).as_posix(): path.read_bytes()
            for path in (package / "dashboard").rglob("*")
            if path.is_file() and "__pycache__" not in path.parts
        }

    assert files(edge) == files(python)
    assert len(files(edge)) > 10


def test_the_edge_dashboard_passes_ruff_mypy_and_its_own_tests(
    edge_dashboard: EdgeDashboard,
) -> None:
    here = edge_dashboard.path
    run([edge_dashboard.bin("ruff"), "check", "."], cwd=here)
    run([edge_dashboard.bin("ruff"), "format", "--check", "."], cwd=here)
    assert "Success: no issues found" in run([edge_dashboard.bin("mypy")], cwd=here)
    out = run([edge_dashboard.bin("pytest"), "-q", "-p", "no:cacheprovider"], cwd=here)
    assert " passed" in out and "skipped" not in out, out


def test_the_edge_dashboard_says_when_the_migrations_are_missing(
    edge_dashboard: EdgeDashboard, stack: Cluster
) -> None:
    """One line saying what to do, exit 1, no traceback: not a dashboard whose pages fail."""
    with stack.connect(autocommit=True) as conn:
        conn.execute("create database edge_dashboard_empty")
    try:
        env = {
            **os.environ,
            "DATABASE_URL": stack.dsn("edge_dashboard_empty", user="postgres"),
            "DASHBOARD_PASSWORD": "correct horse battery",
        }
        proc = subprocess.run(
            [edge_dashboard.bin("dashboard"), "--port", "0"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        with stack.connect(autocommit=True) as conn:
            conn.execute("drop database edge_dashboard_empty with (force)")
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr == (
        "error: the queue schema pgqueue does not exist in this database: apply the migrations "
        "first (supabase db push, or supabase migration up locally)\n"
    )


def test_the_edge_dashboards_job_command_shows_each_failed_attempt(
    edge_dashboard: EdgeDashboard, db: psycopg.Connection, stack_env: dict
) -> None:
    """`dashboard job ID`, an edge project's `job ID`: the job as JSON with its errors and
    snoozes, with DATABASE_URL alone (no password: it serves nothing); a missing job is one
    line and exit 1."""
    (job_id,) = db.execute("select pgqueue.enqueue('send_email', max_attempts => 1)").fetchone()
    (token,) = db.execute("select lock_token from pgqueue.claim('edge-isolate-1')").fetchone()
    db.execute(
        "select pgqueue.fail(%s, %s, %s, error_type => 'TypeError')",
        (job_id, token, "TypeError: fetch failed\n    at handlers/send_email.ts:12:5"),
    )
    env = {k: v for k, v in {**os.environ, **stack_env}.items() if "PASSWORD" not in k}
    env = {k: v for k, v in env.items() if not k.endswith("SERVICE_ROLE_KEY")}
    command = [edge_dashboard.bin("dashboard"), "job"]
    shown = subprocess.run(
        [*command, str(job_id)], env=env, capture_output=True, text=True, timeout=30
    )
    assert shown.returncode == 0, shown.stderr
    view = json.loads(shown.stdout)
    assert (view["id"], view["status"], view["snoozes"]) == (job_id, "failed", 0)
    [failed] = view["errors"]
    assert (failed["attempt"], failed["worker"], failed["type"]) == (
        1,
        "edge-isolate-1",
        "TypeError",
    )
    assert failed["message"].startswith("TypeError: fetch failed\n    at handlers/send_email.ts")
    missing = subprocess.run(
        [*command, "999999999"], env=env, capture_output=True, text=True, timeout=30
    )
    assert missing.returncode == 1
    assert missing.stderr.startswith("error: no job 999999999: it was never enqueued")
