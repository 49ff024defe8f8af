"""End to end, issue 18's observability with the Edge Function: its queue client (queue.ts)
reads metrics(), throughput() and trace contexts through the PostgREST stand-in, against the
real database, and the function (its own index.ts under `deno run`) serves the metrics to a
Prometheus scraper at GET /metrics."""

from __future__ import annotations

from pathlib import Path

import httpx
import psycopg
from prometheus_client.parser import text_string_to_metric_families

from testkit.postgrest import PostgRESTStandIn
from testkit.stack import point_wake_ups
from tests.sql.test_queue import enqueue_n, expire_lease

from .deno_worker import Deno, EdgeWorker, run_queue_client

TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_the_queue_client_reads_metrics_throughput_and_trace_contexts(
    db: psycopg.Connection,
    deno: Deno,
    probe_function_dir: Path,
    postgrest: PostgRESTStandIn,
) -> None:
    point_wake_ups(db, None, None)
    traced, plain, refused, many = run_queue_client(
        deno,
        probe_function_dir,
        postgrest,
        [
            ["enqueue", "probe", {}, {"traceparent": TRACE, "queue": "edge-obs"}],
            ["enqueue", "probe", {}, {"queue": "edge-obs"}],
            ["enqueue", "probe", {}, {"traceparent": "00-nope"}],
            ["enqueueMany", [{"kind": "probe", "queue": "edge-obs", "traceparent": TRACE}]],
        ],
    )
    assert refused["error"]["code"] == "22023"
    assert "traceparent must be a W3C trace context header" in refused["error"]["reason"]
    ids = [traced["ok"], plain["ok"], *many["ok"]]
    metrics, throughput, contexts, bad_window = run_queue_client(
        deno,
        probe_function_dir,
        postgrest,
        [["metrics"], ["throughput", 3], ["traceContexts", ids], ["throughput", 0]],
    )
    queued = [
        m["value"]
        for m in metrics["ok"]
        if m["metric"] == "pgqueue_jobs_queued"
        and m["labels"] == {"queue": "edge-obs", "kind": "probe"}
    ]
    assert queued == [3]
    assert [p["queue"] for p in throughput["ok"]] == ["edge-obs"] * 3
    assert contexts["ok"] == {str(ids[0]): TRACE, str(ids[2]): TRACE}
    assert bad_window["error"]["code"] == "22023"
    assert db.execute("select count(*) from pgqueue.jobs").fetchone() == (3,), (
        "nothing refused stays"
    )


# A queue name with every character the text format escapes in a label value.
ODD_QUEUE = 'we"ird\\queue\nname'


def test_get_metrics_serves_the_sql_metrics_as_prometheus_text(
    db: psycopg.Connection, edge_worker: EdgeWorker
) -> None:
    point_wake_ups(db, None, None)  # the jobs stay as they are put
    enqueue_n(db, 3, "send_email")
    enqueue_n(db, 2, "send_email", queue=ODD_QUEUE)
    (stuck,) = enqueue_n(db, 1, "slow")
    db.execute("select pgqueue.claim('w', 1, kinds => array['slow'])")
    expire_lease(db, stuck)
    db.execute("select pgqueue.sweep()")  # a rescue for the counter

    response = httpx.get(
        f"{edge_worker.url}/metrics", headers={"Authorization": f"Bearer {edge_worker.key}"}
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    families = {f.name: f for f in text_string_to_metric_families(response.text)}

    expected = {
        (metric, tuple(sorted(labels.items())), value)
        for metric, labels, value in db.execute("select * from pgqueue.metrics()").fetchall()
        if metric != "pgqueue_oldest_runnable_age_seconds"  # grows between the two reads
    }
    scraped = {
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for f in families.values()
        for s in f.samples
        if s.name != "pgqueue_oldest_runnable_age_seconds"
    }
    assert scraped == expected
    assert ("pgqueue_jobs_queued", (("kind", "send_email"), ("queue", ODD_QUEUE)), 2.0) in scraped
    assert families["pgqueue_lease_rescues"].type == "counter"  # the parser drops _total
    assert [s.value for s in families["pgqueue_lease_rescues"].samples] == [
        db.execute("select value from pgqueue.counters where name = 'lease_rescues'").fetchone()[0]
    ]
    assert families["pgqueue_jobs_queued"].type == "gauge"
    assert families["pgqueue_jobs_queued"].documentation == "Jobs in the queue, due now or later."
    ages = families["pgqueue_oldest_runnable_age_seconds"].samples
    assert {s.labels["queue"] for s in ages} == {"default", ODD_QUEUE}


def test_get_metrics_without_the_service_key_is_refused(edge_worker: EdgeWorker) -> None:
    for headers in ({}, {"Authorization": "Bearer not-the-key"}):
        response = httpx.get(f"{edge_worker.url}/metrics", headers=headers)
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == 'Bearer realm="metrics"'
        assert "pgqueue_" not in response.text
