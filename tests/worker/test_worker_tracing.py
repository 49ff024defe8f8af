"""Traces across processes: the CLI enqueues a job inside a span, and the worker process runs
its handler in a child span of it; both export over OTLP/HTTP to a real HTTP server here."""

from __future__ import annotations

import psycopg

from testkit.project import run
from tests.support.http_sink import HttpSink
from tests.support.jobs import wait_until
from tests.support.workers import SCRIPT, Installed, Workers, each_transport

EMAIL = '{"to": "ada@example.com", "subject": "Hi", "text": "Hello"}'


# The CLI and the job runner are the same code in both styles: once per transport is enough.
@each_transport
def test_a_job_enqueued_by_the_cli_runs_in_a_child_span_of_the_enqueue(
    installed: Installed,
    workers: Workers,
    stack_env: dict,
    db: psycopg.Connection,
    wake_secret: str,
) -> None:
    with HttpSink(status=200) as collector:
        endpoint = collector.url.removesuffix("/wake")
        tracing = {
            "WORKER_TRACING": "on",
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_SERVICE_NAME": "my-app-test",
            "OTEL_BSP_SCHEDULE_DELAY": "100",  # export spans within 0.1 s, not 5 s
        }
        out = run([installed.bin(SCRIPT), "enqueue", "send_email", EMAIL], env=stack_env | tracing)
        job_id = int(out)
        [(traceparent,)] = db.execute(
            "select trace_context from pgqueue.jobs where id = %s", (job_id,)
        ).fetchall()
        _, trace_id, enqueue_span_id, _ = traceparent.split("-")

        def exported(name: str) -> bytes:
            """The body of the OTLP export that holds the span `name` (protobuf)."""
            for request in collector.requests:
                if request.path == "/v1/traces" and name.encode() in request.body:
                    return request.body
            return b""

        # The CLI flushed its span when it exited.
        producer = exported("pgqueue.enqueue send_email")
        assert bytes.fromhex(trace_id) in producer and bytes.fromhex(enqueue_span_id) in producer

        workers.start_woken(db, wake_secret, **tracing)
        consumer = wait_until(lambda: exported("pgqueue.job send_email"), what="the job's span")
        # The same trace, and the enqueue's span as its parent.
        assert bytes.fromhex(trace_id) in consumer
        assert bytes.fromhex(enqueue_span_id) in consumer
        assert b"my-app-test" in consumer
