"""Every attempt's error and snoozes end to end, with real worker processes of each Python
variant (issue 50): a job that fails twice and then succeeds lists both errors in job(id), with
their type and worker, and `job ID` on the command line shows them; a handler that snoozes
three times runs four times, its attempts unchanged."""

from __future__ import annotations

import itertools
import json
import subprocess
from pathlib import Path

import psycopg

from tests.support.jobs import enqueue, job, runs, wait_until
from tests.support.workers import SCRIPT, Installed, Workers


def due_now(db: psycopg.Connection, job_id: int) -> None:
    """A job waiting out its backoff may run now (the test need not wait 5 s, then 10 s)."""
    db.execute(
        "update pgqueue.jobs set run_after = now() where id = %s and run_after > now()", (job_id,)
    )


def test_a_job_that_failed_twice_lists_both_errors_in_job_and_on_the_command_line(
    installed: Installed,
    workers: Workers,
    db: psycopg.Connection,
    worker_env: dict,
    wake_secret: str,
    tmp_path: Path,
) -> None:
    workers.start_woken(db, wake_secret, WORKER_NAME="worker-of-attempts")
    log = tmp_path / "runs.jsonl"
    job_id = enqueue(db, log=str(log), fail_attempts=2)
    wait_until(
        lambda: job(db, job_id)["status"] == "done",
        timeout=30,
        what=f"job {job_id} to succeed at its third attempt",
        tick=lambda: due_now(db, job_id),
        interval=0.2,
    )
    assert runs(log, job_id) == [(1, "start"), (2, "start"), (3, "start"), (3, "end")]
    (errors,) = db.execute("select errors from pgqueue.job(%s)", (job_id,)).fetchone()
    assert [(e["attempt"], e["worker"], e["type"]) for e in errors] == [
        (1, "worker-of-attempts", "ConnectionError"),
        (2, "worker-of-attempts", "ConnectionError"),
    ]
    first = errors[0]["message"]
    assert first.startswith("ConnectionError: attempt 1: the upstream refused the connection")
    assert "Traceback (most recent call last)" in first, "the traceback's end is kept"

    shown = subprocess.run(
        [installed.bin(SCRIPT), "job", str(job_id)],
        env=worker_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    view = json.loads(shown.stdout)
    assert view["status"] == "done"
    assert [(e["attempt"], e["type"], e["worker"]) for e in view["errors"]] == [
        (1, "ConnectionError", "worker-of-attempts"),
        (2, "ConnectionError", "worker-of-attempts"),
    ]
    assert view["errors"][1]["message"].startswith("ConnectionError: attempt 2:")
    assert view["snoozes"] == 0


def test_a_handler_that_snoozes_three_times_runs_four_times_on_one_attempt(
    installed: Installed,
    workers: Workers,
    db: psycopg.Connection,
    wake_secret: str,
    tmp_path: Path,
) -> None:
    worker = workers.start_woken(db, wake_secret)
    log = tmp_path / "runs.jsonl"
    job_id = enqueue(db, log=str(log), snoozes=3, snooze_seconds=0.3, max_attempts=1)
    wait_until(
        lambda: job(db, job_id)["status"] == "done",
        timeout=30,
        what=f"job {job_id} to run after three snoozes",
    )
    # each run was attempt 1: a snooze gives the attempt back (max_attempts 1 would have
    # dead-lettered the job at its second attempt)
    assert runs(log, job_id) == [(1, "start")] * 4 + [(1, "end")]
    row = db.execute(
        "select attempts, snoozes, errors, last_error from pgqueue.job(%s)", (job_id,)
    ).fetchone()
    assert row == (1, 3, [], None)
    starts = [line for line in _probe(log) if line["at"] == "start"]
    assert all(b["t"] - a["t"] >= 0.25 for a, b in itertools.pairwise(starts))
    assert len(worker.events("job.snoozed")) == 3


def _probe(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()]
