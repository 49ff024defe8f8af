"""Each Python variant's worker process with METRICS_PORT set: jobs that succeed, fail and
retry, are dead-lettered and lose their lease, then `GET /metrics` over HTTP, read with
prometheus_client's own parser."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import psycopg
from prometheus_client.parser import text_string_to_metric_families

from testkit.cluster import free_port
from tests.support.jobs import enqueue, job, wait_until
from tests.support.workers import Installed, WorkerProcess, Workers

# Samples of one scrape: (name, sorted labels) -> value.
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

EMAIL = {"to": "ada@example.com", "subject": "Hi", "text": "Hello"}


def scrape(port: int) -> Samples:
    response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert response.status_code == 200, response.text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def database_metrics(db: psycopg.Connection) -> Samples:
    """What pgqueue.metrics() returns, as samples."""
    rows = db.execute("select metric, labels, value from pgqueue.metrics()").fetchall()
    return {(name, tuple(sorted(labels.items()))): value for name, labels, value in rows}


def worker_counts(samples: Samples) -> dict[tuple[str, str], float]:
    """The worker's counters of the default queue, as (what, kind) -> count, zeros left out."""
    counts = {}
    for (name, labels), value in samples.items():
        fields = dict(labels)
        if name.startswith("pgqueue_worker_") and name.endswith("_total") and "kind" in fields:
            assert fields["queue"] == "default", (name, fields)
            what = name.removeprefix("pgqueue_worker_").removesuffix("_total")
            if value:
                counts[what, fields["kind"]] = value
    return counts


def settled(db: psycopg.Connection, ids: list[int]) -> bool:
    statuses = {job(db, i)["status"] for i in ids}
    return statuses <= {"done", "failed", "cancelled"}


def start(workers: Workers, db: psycopg.Connection, key: str) -> tuple[WorkerProcess, int]:
    port = free_port()
    # A 2 s lease: heartbeats every second, so a cancelled job's lease is found lost quickly.
    worker = workers.start_woken(
        db, key, METRICS_PORT=port, METRICS_HOST="127.0.0.1", WORKER_LEASE_SECONDS=2
    )
    return worker, port


def test_worker_counts_every_outcome_per_kind(
    installed: Installed,
    workers: Workers,
    db: psycopg.Connection,
    wake_secret: str,
    tmp_path: Path,
) -> None:
    worker, port = start(workers, db, wake_secret)
    log = str(tmp_path / "runs.jsonl")
    with db.transaction():
        ok = [enqueue(db, log=log) for _ in range(4)]
        dead = [enqueue(db, log=log, error="boom", max_attempts=1) for _ in range(2)]
        retried = enqueue(db, log=log, error="again", max_attempts=2)
        emails = [enqueue(db, "send_email", **EMAIL) for _ in range(3)]
        invalid_email = enqueue(db, "send_email", to="nobody")
        lost = enqueue(db, log=log, sleep=30)
    wait_until(lambda: job(db, lost)["status"] == "running", what="the long job to run")
    # Cancelled while it runs: its next heartbeat is refused, and the worker stops it.
    db.execute("select pgqueue.cancel(%s)", (lost,))
    first = wait_until(
        lambda: (row := job(db, retried))["status"] == "queued" and row["attempts"] == 1 and row,
        what="the first failure",
    )
    assert first["last_error"].splitlines()[0] == "RuntimeError: again"
    # Due now instead of after its backoff; the sweeper wakes the worker for it.
    db.execute("update pgqueue.jobs set run_after = now() where id = %s", (retried,))
    finished = [*ok, *dead, retried, *emails, invalid_email, lost]
    wait_until(
        lambda: settled(db, finished),
        timeout=30,
        tick=lambda: db.execute("select pgqueue.sweep()"),
        interval=0.3,
        what="every job to finish",
    )

    expected = {
        ("jobs_claimed", "e2e_probe"): 9,  # 4 + 2 + 2 attempts of the retried one + 1
        ("jobs_done", "e2e_probe"): 4,
        ("jobs_failed", "e2e_probe"): 4,  # 2 dead, the retried one twice
        ("jobs_retried", "e2e_probe"): 1,
        ("jobs_dead_lettered", "e2e_probe"): 3,
        ("leases_lost", "e2e_probe"): 1,
        ("jobs_claimed", "send_email"): 4,
        ("jobs_done", "send_email"): 3,
        ("jobs_failed", "send_email"): 1,  # its payload is invalid: no retry
        ("jobs_dead_lettered", "send_email"): 1,
    }
    # Outcomes are counted once the queue has recorded them: a moment after the rows change.
    wait_until(lambda: worker_counts(scrape(port)) == expected, what="the counts", timeout=10)
    samples = scrape(port)
    assert worker_counts(samples) == expected

    def handler_runs(kind: str) -> float:
        labels = (("kind", kind), ("queue", "default"))
        return samples["pgqueue_worker_handler_duration_seconds_count", labels]

    # Every run of a handler is timed; a payload that does not validate never reaches one.
    assert (handler_runs("e2e_probe"), handler_runs("send_email")) == (9, 3)
    wakeups = {
        dict(labels)["source"]: value
        for (name, labels), value in samples.items()
        if name == "pgqueue_worker_wakeups_total"
    }
    # What brought the worker in: pg_net's POSTs, the enqueue's NOTIFY, or (no push channel
    # over the Data API) its own polls.
    if installed.http:
        assert wakeups["http"] > 0
    elif installed.transport == "postgres":
        assert wakeups["notify"] > 0 and wakeups["http"] == 0
    else:
        assert (wakeups["notify"], wakeups["http"], wakeups["poll"] > 0) == (0, 0, True)
    if installed.http:
        # Never on the port the database wakes.
        assert httpx.get(f"{worker.url}/metrics").status_code == 404
    assert worker.proc.poll() is None


def test_the_queue_gauges_are_the_databases_and_the_dashboard_queries_what_is_served(
    installed: Installed,
    workers: Workers,
    db: psycopg.Connection,
    wake_secret: str,
    tmp_path: Path,
) -> None:
    _, port = start(workers, db, wake_secret)
    log = str(tmp_path / "runs.jsonl")
    with db.transaction():
        done = enqueue(db, log=log)
        dead = enqueue(db, log=log, error="boom", max_attempts=1)
    wait_until(lambda: settled(db, [done, dead]), what="both jobs to finish")
    # Jobs that stay put while the test compares (so no age grows meanwhile): queued for
    # later, one of them on a paused queue.
    later = "run_after => now() + interval '1h'"
    db.execute(f"select pgqueue.enqueue('e2e_probe', '{{}}', {later})")
    db.execute(f"select pgqueue.enqueue('send_email', '{{}}', queue => 'held', {later})")
    db.execute("select pgqueue.pause('held')")

    samples = scrape(port)
    expected = database_metrics(db)
    db.execute("select pgqueue.resume('held')")
    assert samples["pgqueue_metrics_scrape_error", ()] == 0
    assert {key: samples.get(key) for key in expected} == expected
    assert expected["pgqueue_queue_paused", (("queue", "held"),)] == 1
    assert expected["pgqueue_jobs_queued", (("kind", "e2e_probe"), ("queue", "default"))] == 1
    assert expected["pgqueue_dead_letters", (("kind", "e2e_probe"), ("queue", "default"))] == 1

    dashboard = json.loads(
        (installed.path / "observability" / "grafana-dashboard.json").read_text()
    )
    [datasource] = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert datasource["query"] == "prometheus"
    queries = [
        target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])
    ]
    assert len(queries) >= 20
    queried = {name for expr in queries for name in re.findall(r"\bpgqueue_\w+", expr)}
    served = {name for name, _ in samples}
    assert queried - served == set()
    # ... and it shows every metric there is, but for the scrape's own bookkeeping.
    families = {re.sub(r"_(total|bucket|sum|count|created)$", "", name) for name in served}
    shown = {re.sub(r"_(total|bucket|sum|count)$", "", name) for name in queried}
    assert families - shown == set()
