"""Flow control and results with worker processes of each Python variant: a handler's result
and progress read by job id, results the queue cannot store, a concurrency limit held across
two workers, a paused queue; and the command line's flow-control commands."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from itertools import pairwise
from pathlib import Path

import psycopg

from testkit.cluster import Cluster
from testkit.project import run
from tests.support.jobs import (
    enqueue,
    job,
    job_by_id,
    probe_lines,
    running_of_key,
    runs,
    wait_until,
)
from tests.support.workers import PACKAGE, SCRIPT, Installed, Workers, each_transport


def until_finished(db: psycopg.Connection, job_id: int, timeout: float = 20) -> dict:
    return wait_until(
        lambda: (row := job_by_id(db, job_id))["status"] in ("done", "failed") and row,
        timeout,
        what=f"job {job_id} to finish",
    )


def test_a_handlers_result_and_progress_are_read_by_job_id(
    installed: Installed,
    workers: Workers,
    flow: psycopg.Connection,
    wake_secret: str,
    tmp_path: Path,
) -> None:
    db = flow
    worker = workers.start_woken(db, wake_secret)
    log = tmp_path / "runs.jsonl"
    result = {"rows": 2, "names": ["Ada", "Zoë"], "ok": True}
    job_id = enqueue(db, log=str(log), progress={"done": 1, "of": 2}, sleep=2, result=result)

    running = wait_until(
        lambda: (row := job_by_id(db, job_id))["progress"] is not None and row,
        what="the progress to be reported",
    )
    assert (running["status"], running["progress"], running["result"]) == (
        "running",
        {"done": 1, "of": 2},
        None,
    )
    done = until_finished(db, job_id)
    assert (done["status"], done["result"], done["last_error"]) == ("done", result, None)
    [progress] = [line for line in probe_lines(log) if line["at"] == "progress"]
    assert progress["reported"] is True

    # a handler that returns nothing stores no result
    quiet = enqueue(db, log=str(log))
    assert (until_finished(db, quiet)["status"], job_by_id(db, quiet)["result"]) == ("done", None)
    assert worker.proc.poll() is None


def test_results_the_queue_cannot_store_fail_their_own_jobs_only(
    installed: Installed,
    workers: Workers,
    flow: psycopg.Connection,
    config: dict,
    wake_secret: str,
    tmp_path: Path,
) -> None:
    """With max_result_bytes 1000: a result the worker measures over it, one it measures under
    it that the database (measuring jsonb) refuses, and one that is not JSON each fail their
    job for good, with the sizes and the limit named; the jobs claimed with them complete
    with their results, and the worker goes on."""
    db = flow
    db.execute("""select pgqueue.configure('{"max_result_bytes": 1000}')""")
    worker = workers.start_woken(db, wake_secret, WORKER_BATCH_SIZE=10)
    log = tmp_path / "runs.jsonl"
    with db.transaction():  # one wake-up: the bad ones among good ones in the first claims
        good = [enqueue(db, log=str(log), result={"n": n}) for n in range(3)]
        too_big = enqueue(db, log=str(log), result="x" * 2000)
        # 601 bytes of JSON, over 3,000 as jsonb (each number has its own header)
        dense = enqueue(db, log=str(log), result=[0] * 300)
        not_json = enqueue(db, log=str(log), nan_result=True)
        good += [enqueue(db, log=str(log), result={"n": n}) for n in range(3, 6)]

    for n, job_id in enumerate(good):
        row = until_finished(db, job_id)
        assert (row["status"], row["result"]) == ("done", {"n": n}), row
    failed = {job_id: until_finished(db, job_id) for job_id in (too_big, dense, not_json)}
    for row in failed.values():
        assert (row["status"], row["attempts"], row["result"]) == ("failed", 1, None), row
    assert failed[too_big]["last_error"] == (
        f"the result of job {too_big} ('e2e_probe') is 2002 bytes of JSON; the limit is 1000 "
        "(max_result_bytes): store large data elsewhere (e.g. Supabase Storage) and pass a "
        "reference"
    )
    # measured by the database: the size of the jsonb it would have stored
    assert re.fullmatch(
        rf"the result of job {dense} is \d{{4}} bytes; the limit is 1000 \(max_result_bytes\): "
        r"store large data elsewhere \(e\.g\. Supabase Storage\) and pass a reference",
        failed[dense]["last_error"],
    ), failed[dense]["last_error"]
    # (Python words the reason, and newer versions add the value: "...compliant: nan")
    assert failed[not_json]["last_error"].startswith(
        f"the result of job {not_json} ('e2e_probe') is not JSON (Out of range float values "
        "are not JSON compliant"
    )
    assert failed[not_json]["last_error"].endswith(
        "): return a dict, list, str, number, bool or pydantic model"
    )
    later = enqueue(db, log=str(log), result="fine")
    assert until_finished(db, later)["result"] == "fine"
    assert worker.proc.poll() is None


def test_a_concurrency_limit_holds_across_worker_processes(
    installed: Installed,
    workers: Workers,
    flow: psycopg.Connection,
    stack: Cluster,
    wake_secret: str,
    tmp_path: Path,
) -> None:
    """Two workers of four slots each, and a key limited to 1: an auditor sampling the running
    jobs never sees two of the key's at once, and the handlers' own log shows each keyed job
    starting after the one before ended; jobs without a key run side by side meanwhile."""
    db = flow
    assert db.execute("select pgqueue.set_concurrency_limit('e2e-tenant', 1)").fetchone() == (1,)
    workers.start_woken(db, wake_secret, WORKER_NAME="first")
    workers.start(WORKER_NAME="second")  # polls (HTTP: wake-ups go to the first)
    log = tmp_path / "runs.jsonl"
    with running_of_key(stack, "e2e-tenant") as samples:
        with db.transaction():
            keyed = [
                enqueue(db, log=str(log), sleep=0.3, concurrency_key="e2e-tenant") for _ in range(6)
            ]
            free = [enqueue(db, log=str(log), sleep=0.3) for _ in range(6)]
        for job_id in keyed + free:
            assert until_finished(db, job_id, timeout=30)["status"] == "done"

    assert max(samples) == 1, f"{max(samples)} jobs of the key ran at once"
    assert len(samples) > 100

    def spans(ids: list[int]) -> list[tuple[float, float]]:
        times = {(line["job_id"], line["at"]): line["t"] for line in probe_lines(log)}
        return sorted((times[(i, "start")], times[(i, "end")]) for i in ids)

    keyed_spans = spans(keyed)
    for (_, ended), (began, _) in pairwise(keyed_spans):
        assert began >= ended, "a job of the key started before the previous one ended"
    free_spans = spans(free)
    assert any(b_start < a_end for (_, a_end), (b_start, _) in pairwise(free_spans)), (
        "jobs without a key should run side by side"
    )


def test_a_paused_queue_is_not_worked_until_resumed(
    installed: Installed,
    workers: Workers,
    flow: psycopg.Connection,
    wake_secret: str,
    tmp_path: Path,
) -> None:
    """Paused while a job runs: that job finishes, a new one waits untouched; resumed (the
    workers are woken), it runs."""
    db = flow
    worker = workers.start_woken(db, wake_secret)
    log = tmp_path / "runs.jsonl"
    running = enqueue(db, log=str(log), sleep=1.5)
    wait_until(lambda: runs(log, running), what="the first job to start")
    assert db.execute("select pgqueue.pause('default')").fetchone() == (True,)
    waiting = enqueue(db, log=str(log))

    assert until_finished(db, running)["status"] == "done"
    time.sleep(2)  # polls, wake-ups and claims come and go: none takes the job
    row = job(db, waiting)
    assert (row["status"], row["attempts"]) == ("queued", 0)
    assert runs(log, waiting) == []

    assert db.execute("select pgqueue.resume('default')").fetchone() == (True,)
    assert until_finished(db, waiting, timeout=10)["status"] == "done"
    assert worker.proc.poll() is None


# The one-shot commands are the same code in both styles: once per transport is enough.
@each_transport
def test_cli_flow_control_commands(
    installed: Installed, stack_env: dict, flow: psycopg.Connection
) -> None:
    db = flow
    env = {**os.environ, **stack_env}

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [installed.bin(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60
        )

    def ok(*args: str) -> str:
        return run([installed.bin(SCRIPT), *args], env=stack_env)

    def refused(code: int, message: str, *args: str) -> None:
        proc = cli(*args)
        assert (proc.returncode, proc.stdout) == (code, ""), proc
        assert message in proc.stderr, proc.stderr

    def rows(out: str) -> list[dict]:
        return [json.loads(line) for line in out.splitlines()]

    usage = ok("--help")
    listed = {line.split()[0] for line in usage.splitlines() if line.startswith("    ")}
    assert listed >= {"job", "pause", "resume", "queues", "concurrency-limit", "rate-limit"}
    assert listed >= {"schedule", "unschedule", "schedules"}

    # enqueue with a concurrency key, then replace the waiting job by its idempotency key
    keyed = ["--idempotency-key", "cli-1", "--concurrency-key", "tenant-9", "--delay", "3600"]
    first = int(ok("enqueue", "e2e_cli", '{"v": 1}', *keyed))
    replace = ["--idempotency-key", "cli-1", "--on-conflict", "replace"]
    assert int(ok("enqueue", "e2e_cli", '{"v": 2}', *replace)) == first
    shown = json.loads(ok("job", str(first)))
    assert (shown["status"], shown["payload"], shown["concurrency_key"]) == (
        "queued",
        {"v": 2},
        "tenant-9",
    )
    assert shown["idempotency_key"] == "cli-1"
    refused(2, "invalid choice: 'sometimes'", "enqueue", "e2e_cli", "--on-conflict", "sometimes")
    debounce = ["enqueue", "e2e_cli", "--on-conflict", "debounce"]
    refused(2, "--on-conflict debounce needs --idempotency-key", *debounce)

    # job ID: progress while it runs, then the result, or the last error
    [(token,)] = db.execute(
        "select lock_token from pgqueue.claim('w', kinds => array['e2e_cli'])"
    ).fetchall()
    db.execute("""select pgqueue.progress(%s, %s, '{"step": 1}')""", (first, token))
    running = json.loads(ok("job", str(first)))
    assert (running["status"], running["progress"], running["attempts"]) == (
        "running",
        {"step": 1},
        1,
    )
    db.execute("""select pgqueue.complete(%s, %s, '{"rows": 3}')""", (first, token))
    done = json.loads(ok("job", str(first)))
    assert (done["status"], done["result"], done["last_error"]) == ("done", {"rows": 3}, None)
    failing = enqueue(db, kind="e2e_cli", max_attempts=1)
    [(token,)] = db.execute(
        "select lock_token from pgqueue.claim('w', kinds => array['e2e_cli'])"
    ).fetchall()
    db.execute("select pgqueue.fail(%s, %s, 'it broke')", (failing, token))
    dead = json.loads(ok("job", str(failing)))
    assert (dead["status"], dead["last_error"]) == ("dead-lettered", "it broke")
    refused(1, "error: no job 999999: it was never enqueued", "job", "999999")
    refused(2, "invalid int value: 'last'", "job", "last")

    # pause and resume: queues and stats show it
    paused_now = ok("pause", "e2e-q")
    assert paused_now == "queue 'e2e-q' paused: running jobs finish, no more are claimed\n"
    assert ok("pause", "e2e-q") == "queue 'e2e-q' was already paused\n"
    enqueue_in = "select pgqueue.enqueue('e2e_cli', queue => 'e2e-q')"
    db.execute(enqueue_in)
    [paused] = [s for s in rows(ok("queues")) if s["queue"] == "e2e-q"]
    assert (paused["paused"], paused["queued"], paused["running"]) == (True, 1, 0)
    stats = cli("stats")
    assert stats.returncode == 0, stats
    assert {(r["queue"], r["paused"]) for r in rows(stats.stdout)} >= {("e2e-q", True)}
    assert "warning: queue 'e2e-q' is paused (since " in stats.stderr
    assert "its 1 queued jobs wait until `my-app resume e2e-q`" in stats.stderr
    assert ok("resume", "e2e-q") == "queue 'e2e-q' resumed\n"
    assert ok("resume", "e2e-q") == "queue 'e2e-q' was not paused\n"
    assert "queue 'e2e-q' is paused" not in cli("stats").stderr

    # concurrency limits
    limit = ok("concurrency-limit", "tenant-9", "2")
    assert limit == "concurrency key 'tenant-9': at most 2 running at once\n"
    assert db.execute(
        "select max_running from pgqueue.concurrency_limits where concurrency_key = 'tenant-9'"
    ).fetchone() == (2,)
    assert ok("concurrency-limit", "tenant-9", "none") == "concurrency key 'tenant-9': no limit\n"
    refused(2, "max_running must be between 1 and 100000, got 0", "concurrency-limit", "t", "0")
    refused(2, "'two' is not a whole number or none", "concurrency-limit", "t", "two")

    # rate limits
    rate = ok("rate-limit", "e2e-q", "50", "--burst", "100")
    assert rate == "queue 'e2e-q': at most 50 jobs a second, 100 at once\n"
    slow = ok("rate-limit", "e2e-q", "0.5")
    assert slow == "queue 'e2e-q': at most 0.5 jobs a second, 1 at once\n"
    [limited] = [s for s in rows(ok("queues")) if s["queue"] == "e2e-q"]
    assert (limited["rate_per_second"], limited["rate_burst"]) == (0.5, 1)
    assert ok("rate-limit", "e2e-q", "none") == "queue 'e2e-q': no rate limit\n"
    refused(2, "a rate limit needs per_second > 0 and burst >= 1", "rate-limit", "e2e-q", "-1")
    refused(2, "'nan' is not a number of jobs a second or none", "rate-limit", "e2e-q", "nan")
    refused(2, "--burst goes with a rate", "rate-limit", "e2e-q", "none", "--burst", "3")

    # recurring jobs
    email = json.dumps({"to": "ada@example.com", "subject": "Report", "text": "Attached"})
    paris = ["--time-zone", "Europe/Paris", "--catch-up"]
    scheduled = ok("schedule", "e2e-nightly", "0 3 * * *", "send_email", email, "--queue", "mail")
    assert scheduled.startswith(
        "schedule 'e2e-nightly': a 'send_email' job in queue 'mail' on '0 3 * * *' in UTC "
        "(pg_cron job "
    )
    scheduled = ok(
        "schedule", "e2e-nightly", "0 3 * * *", "send_email", email, "--queue", "mail", *paris
    )
    assert scheduled.startswith(
        "schedule 'e2e-nightly': a 'send_email' job in queue 'mail' on '0 3 * * *' in "
        "Europe/Paris, catching up a missed slot (pg_cron job "
    )
    [listed] = rows(ok("schedules"))
    assert (listed["name"], listed["cron"], listed["kind"], listed["queue"]) == (
        "e2e-nightly",
        "0 3 * * *",
        "send_email",
        "mail",
    )
    assert (listed["payload"], listed["active"]) == (json.loads(email), True)
    assert (listed["time_zone"], listed["catch_up"], listed["last_slot"]) == (
        "Europe/Paris",
        True,
        None,
    )
    assert [run[11:] for run in listed["next_runs_local"]] == ["03:00:00"] * 3
    nightly = ["0 3 * * *", "send_email"]
    refused(2, "a cron expression has five fields", "schedule", "bad", "every night", "x", email)
    mars = ["--time-zone", "Mars/Base"]
    refused(2, "unknown time zone 'Mars/Base'", "schedule", "bad", *nightly, email, *mars)
    bad_email = '{"to": "nobody"}'
    invalid = "invalid payload for 'send_email': to: String should match pattern"
    refused(2, invalid, "schedule", "bad", *nightly, bad_email)
    named = "a schedule name is 1 to 100 letters, digits or _ . : -, got 'bad name'"
    refused(2, named, "schedule", "bad name", *nightly, email)
    assert [s["name"] for s in rows(ok("schedules"))] == ["e2e-nightly"]
    removed = ok("unschedule", "e2e-nightly")
    assert removed == "schedule 'e2e-nightly' removed (the jobs it enqueued stay)\n"
    refused(1, "no schedule named 'e2e-nightly'", "unschedule", "e2e-nightly")
    assert ok("schedules") == ""

    # `python -m` runs the same commands
    assert run([installed.bin("python"), "-m", PACKAGE, "queues"], env=stack_env) == ok("queues")
