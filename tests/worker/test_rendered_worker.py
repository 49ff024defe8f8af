"""Each Python variant as a user gets it: the right files, clean under its own ruff config,
its own test suite green against our stack, and a CLI that works."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from testkit.project import PYTHON_VARIANTS, render, rendered_files, run, variant
from tests.support.jobs import enqueue, job, wait_until
from tests.support.workers import PACKAGE, SCRIPT, Installed, Workers, each_transport
from tests.support.workflow import run_step, runner_env, step, supabase_status


def test_only_the_variants_files_are_rendered(installed: Installed) -> None:
    package = installed.path / "src" / PACKAGE
    transports = {p.name for p in (package / "queue").glob("*_transport.py")}
    assert transports == {f"{installed.transport}_transport.py"}
    assert (package / "worker" / "app.py").exists() == installed.http
    assert (installed.path / "tests" / "test_app.py").exists() == installed.http
    assert {"send_webhook.py", "send_email.py", "README.md"} <= {
        p.name for p in (package / "handlers").iterdir()
    }
    # The machinery says so in its first line; the user's code (handlers/) does not.
    for path in package.rglob("*.py"):
        name = path.relative_to(package).as_posix()
        first = path.read_text().splitlines()[0]
        if name.startswith("handlers/") or name in {"__init__.py", "__main__.py"}:
            assert "machinery" not in first, f"{name}: {first}"
        else:
            assert "machinery" in first and "should not need to edit" in first, f"{name}: {first}"


def test_edge_variant_has_no_python_worker(template: Path, tmp_path: Path) -> None:
    project = render(template, tmp_path / "edge", worker_style="edge")
    names = {p.relative_to(project).parts[0] for p in rendered_files(project)}
    assert not names & {"src", "tests", ".env.example"}


# The quick loop checks one project per worker style this way (a transport each): mypy and a
# project's own suite take half a minute a variant.
QUICK_PROJECTS = {variant("python", "postgres"), variant("python-http", "supabase")}


@pytest.mark.parametrize(
    "installed",
    [
        pytest.param(v, id=str(v), marks=[pytest.mark.quick] if v in QUICK_PROJECTS else [])
        for v in PYTHON_VARIANTS
    ],
    indirect=True,
)
def test_project_passes_ruff_mypy_and_its_own_tests(
    installed: Installed, stack_env: dict, tmp_path: Path
) -> None:
    """Its own tests run as its CI workflow runs them, the steps as written: with only what
    `supabase status -o env` prints (no WAKE_SECRET: the python-http tests make their own)."""
    run([installed.bin("ruff"), "check", "."], cwd=installed.path)
    run([installed.bin("ruff"), "format", "--check", "."], cwd=installed.path)
    assert "Success: no issues found" in run([installed.bin("mypy")], cwd=installed.path)
    assert "WAKE_SECRET" not in stack_env
    env = runner_env(
        [supabase_status(tmp_path / "bin", stack_env)],
        UV_PROJECT_ENVIRONMENT=str(installed.venv),  # where `installed` synced uv.lock
        UV_OFFLINE="1",
        PYTEST_ADDOPTS="-p no:cacheprovider",
    )
    assert "WAKE_SECRET" not in env
    for name in ("Install the worker", "Worker tests against the stack"):
        done = run_step(step(installed.path, "database", name), installed.path, env)
        assert done.returncode == 0, f"{name}:\n{done.stdout}\n{done.stderr}"
    assert " passed" in done.stdout and "skipped" not in done.stdout, done.stdout


# The one-shot commands are the same code in both styles: once per transport is enough.
@each_transport
def test_cli(installed: Installed, stack_env: dict, db: psycopg.Connection) -> None:
    script = installed.bin(SCRIPT)
    email = json.dumps({"to": "ada@example.com", "subject": "Hi", "text": "Hello"})
    job_id = int(run([script, "enqueue", "send_email", email], env=stack_env))
    assert job(db, job_id)["kind"] == "send_email"

    stats = [json.loads(line) for line in run([script, "stats"], env=stack_env).splitlines()]
    [row] = stats
    assert (row["queue"], row["kind"], row["status"], row["jobs"]) == (
        "default",
        "send_email",
        "queued",
        1,
    )

    # a dead letter, listed and retried through `python -m`
    [(token,)] = db.execute(
        "select lock_token from pgqueue.claim('w', kinds => array['send_email'])"
    ).fetchall()
    db.execute("select pgqueue.fail(%s, %s, 'x', retryable => false)", (job_id, token))
    # dead letters are called so (the SQL's status is 'failed'), and what is kept is said
    stats = [json.loads(line) for line in run([script, "stats"], env=stack_env).splitlines()]
    assert [row["status"] for row in stats] == ["dead-lettered"]
    shown = json.loads(run([script, "job", str(job_id)], env=stack_env))
    assert shown["status"] == "dead-lettered"
    assert shown["note"].startswith("a dead-lettered job keeps its payload and last error")
    python = [installed.bin("python"), "-m", PACKAGE]
    dead = json.loads(run([*python, "dead-letters"], env=stack_env).splitlines()[0])
    assert (dead["id"], dead["last_error"]) == (job_id, "x")
    retried = run([*python, "retry", str(job_id)], env=stack_env)
    assert retried.strip() == f"job {job_id} queued again"
    assert job(db, job_id)["status"] == "queued"
    assert run([script, "cancel", str(job_id)], env=stack_env).strip() == f"job {job_id} cancelled"
    assert job(db, job_id)["status"] == "cancelled"

    # a done job without a result or key: what it keeps, and why its payload is null
    (done_id,) = db.execute("select pgqueue.enqueue('send_email')").fetchone()
    assert done_id > job_id
    db.execute(
        "select pgqueue.complete(id, lock_token)"
        " from pgqueue.claim('w', kinds => array['send_email'])"
    )
    done = json.loads(run([script, "job", str(done_id)], env=stack_env))
    assert (done["status"], done["payload"]) == ("done", None)
    assert "its payload, progress, priority" in done["note"]

    bad = subprocess.run(
        [script, "enqueue", "send_email", '{"to": "nobody"}'],
        env={**os.environ, **stack_env},
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2
    assert "invalid payload for 'send_email': to: String should match pattern" in bad.stderr


def test_missing_settings_are_named(installed: Installed) -> None:
    env = {k: v for k, v in os.environ.items() if not k.endswith(("_URL", "_KEY"))}
    proc = subprocess.run(
        [installed.bin(SCRIPT), "worker"], env=env, capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 2
    expected = "DATABASE_URL (or DB_URL)" if installed.transport == "postgres" else "SUPABASE_URL"
    assert f"error: {expected}" in proc.stderr
    assert "supabase status -o env" in proc.stderr


@each_transport
def test_cli_config_shows_and_changes_the_database_configuration(
    installed: Installed, stack_env: dict, db: psycopg.Connection, config: dict
) -> None:
    script = installed.bin(SCRIPT)
    shown = json.loads(run([script, "config", "show"], env=stack_env))
    assert shown == config
    assert (shown["max_attempts"], shown["lease_seconds"]) == (5, 300)

    changed = json.loads(
        run([script, "config", "set", "lease_seconds=600", "worker_url="], env=stack_env)
    )
    assert (changed["lease_seconds"], changed["worker_url"]) == (600, None)
    db.execute("select pgqueue.enqueue('config-probe')")
    (lease,) = db.execute(
        "select extract(epoch from locked_until - locked_at)::integer"
        " from pgqueue.claim('w', kinds => array['config-probe'])"
    ).fetchone()
    assert lease == 600

    for change, message in [
        ("lease_seconds=5", 'violates check constraint "lease_seconds_between_10_and_86400"'),
        ("leases=5", "unknown setting: leases (The settings are max_attempts, "),
        ("max_attempts=", "setting cannot be null: max_attempts"),
        ("lease_seconds", "'lease_seconds' is not NAME=VALUE"),
    ]:
        refused = subprocess.run(
            [script, "config", "set", change],
            env={**os.environ, **stack_env},
            capture_output=True,
            text=True,
        )
        assert refused.returncode == 2, refused
        assert message in refused.stderr
    (after,) = db.execute("select pgqueue.configure()").fetchone()
    assert after["lease_seconds"] == 600, "a refused change changes nothing"


@each_transport
def test_the_worker_leases_jobs_for_the_configured_lease(
    installed: Installed, workers: Workers, db: psycopg.Connection, config: dict, tmp_path: Path
) -> None:
    """No WORKER_LEASE_SECONDS: the worker reads the lease from the database when it starts,
    so `config set lease_seconds=...` (or an answer changed on update) reaches it."""
    db.execute("""select pgqueue.configure('{"lease_seconds": 77}')""")
    worker = workers.start()
    job_id = enqueue(db, log=str(tmp_path / "runs.jsonl"), sleep=5)
    row = wait_until(
        lambda: (r := job(db, job_id))["status"] == "running" and r,
        what="the job to be claimed",
    )
    assert (row["locked_until"] - row["locked_at"]).total_seconds() == 77
    assert [e["lease_seconds"] for e in worker.events("worker.lease")] == [77]


UNTYPED = "\n\ndef untyped(value):\n    return value\n"


@pytest.mark.parametrize("installed", [variant("python", "postgres")], indirect=True, ids=str)
def test_mypy_is_strict_on_the_machinery_only(installed: Installed, tmp_path: Path) -> None:
    project = tmp_path / "project"
    shutil.copytree(installed.path, project, ignore=shutil.ignore_patterns(".mypy_cache"))
    package = project / "src" / PACKAGE
    (package / "handlers" / "loose.py").write_text(f'"""Without type hints."""{UNTYPED}')
    run([installed.bin("mypy")], cwd=project)  # handlers/ is the user's: not strict

    worker = package / "worker" / "loop.py"
    worker.write_text(worker.read_text() + UNTYPED)
    proc = subprocess.run([installed.bin("mypy")], cwd=project, capture_output=True, text=True)
    assert proc.returncode == 1, proc.stdout
    assert "loop.py:" in proc.stdout and "missing a type annotation" in proc.stdout


def test_pip_installs_the_project_too(template: Path, tmp_path: Path) -> None:
    """uv is the project's package manager, but `pip install -e ".[dev]"` works as well (the
    variant with the most dependencies)."""
    project = render(template, tmp_path / "app", worker_style="python-http")
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", venv])
    run([venv / "bin" / "pip", "install", "-q", "--no-compile", "-e", ".[dev]"], cwd=project)
    assert "enqueue" in run([venv / "bin" / SCRIPT, "--help"])
    run([venv / "bin" / "mypy"], cwd=project)


@each_transport
def test_stats_warns_of_queued_kinds_no_worker_claims(
    installed: Installed, workers: Workers, stack_env: dict, db: psycopg.Connection
) -> None:
    db.execute("truncate pgqueue.workers")
    # due in an hour: queued all through the test, whoever claims the kind
    later = "run_after => now() + interval '1 hour'"
    db.execute(f"select pgqueue.enqueue('send_email', {later})")
    db.execute(f"select pgqueue.enqueue('nobody_handles_this', {later})")

    def warnings() -> str:
        proc = subprocess.run(
            [installed.bin(SCRIPT), "stats"],
            env={**os.environ, **stack_env},
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stderr

    assert "queued 'send_email' jobs in queue 'default': no worker" in warnings()
    assert "queued 'nobody_handles_this' jobs" in warnings()
    worker = workers.start()  # checks in with the kinds it has handlers for
    wait_until(
        lambda: db.execute("select count(*) from pgqueue.workers").fetchone()[0] == 1,
        what="the worker to check in",
    )
    assert "'send_email' jobs" not in warnings()
    assert "1 queued 'nobody_handles_this' jobs in queue 'default'" in warnings()
    assert worker.proc.poll() is None
