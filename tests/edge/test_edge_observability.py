"""End to end, issue 18's observability with the Edge Function: its queue client (queue.ts)
reads metrics(), throughput() and trace contexts through the PostgREST stand-in, against the
real database."""

from __future__ import annotations

from pathlib import Path

import psycopg

from testkit.postgrest import PostgRESTStandIn
from testkit.stack import point_wake_ups

from .deno_worker import Deno, run_queue_client

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
