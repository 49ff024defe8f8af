# Worker machinery: you should not need to edit this file (handlers live in handlers/).
"""Optional OpenTelemetry traces: each handler run is a span in the trace that enqueued its job.

Off unless WORKER_TRACING=on, which needs the `tracing` extra (`uv sync --extra tracing`).
A switch of its own, rather than the OTEL_* variables alone: with tracing on, the worker
makes one more call per claimed batch (the claim does not return trace contexts, so the hot
path pays nothing for them while tracing is off), and an installed SDK (the dev extra has
one) should not turn that on by itself. Where spans go is the standard OTEL_* variables'
business: the worker uses the global TracerProvider, one your code set up before it
started, or else one it installs that exports over OTLP/HTTP (OTEL_EXPORTER_OTLP_ENDPOINT,
OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, ...).

With tracing on:
- after each claim the worker reads the batch's traceparents (`trace_contexts(ids)`, one call);
- each handler runs in a CONSUMER span `pgqueue.job <kind>` whose parent is the traceparent
  its job was enqueued with (W3C Trace Context), with OpenTelemetry's messaging attributes and
  the job's id, kind, queue and attempt; a handler that raises leaves the span with status
  ERROR and the exception recorded;
- producers pass current_traceparent() to `enqueue(..., traceparent=...)`; the CLI's
  `enqueue` does so inside a PRODUCER span of its own (JobTracing.enqueue_span()).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ..queue import Job, QueueClient
from ..settings import tracing_available
from .logs import describe_exception

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

log = logging.getLogger(__name__)

# The instrumentation's name, as trace backends show it: this package's.
TRACER_NAME = __name__.partition(".")[0]


class JobTracing:
    """Spans for handler runs, from the global TracerProvider."""

    def __init__(self, tracer: Tracer) -> None:
        self._tracer = tracer

    @contextlib.contextmanager
    def span(self, job: Job, traceparent: str | None) -> Iterator[None]:
        """A span around one run of `job`'s handler, a child of `traceparent` when given."""
        from opentelemetry.trace import SpanKind, Status, StatusCode
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        parent = None
        if traceparent is not None:
            parent = TraceContextTextMapPropagator().extract({"traceparent": traceparent})
        with self._tracer.start_as_current_span(
            f"pgqueue.job {job.kind}",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes={
                "messaging.system": "pgqueue",
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "messaging.destination.name": job.queue,
                "messaging.message.id": str(job.id),
                "pgqueue.job.id": job.id,
                "pgqueue.job.kind": job.kind,
                "pgqueue.job.queue": job.queue,
                "pgqueue.job.attempt": job.attempts,
            },
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                yield
            except asyncio.CancelledError:
                span.set_status(
                    Status(StatusCode.ERROR, "stopped: timed out, lease lost, or shutting down")
                )
                raise
            except Exception as exc:
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, describe_exception(exc)))
                raise

    @contextlib.contextmanager
    def enqueue_span(self, kind: str, queue: str) -> Iterator[str | None]:
        """A PRODUCER span around one enqueue, yielding the traceparent to enqueue with."""
        from opentelemetry.trace import SpanKind

        with self._tracer.start_as_current_span(
            f"pgqueue.enqueue {kind}",
            kind=SpanKind.PRODUCER,
            attributes={
                "messaging.system": "pgqueue",
                "messaging.operation.type": "send",
                "messaging.destination.name": queue,
                "pgqueue.job.kind": kind,
            },
        ):
            yield current_traceparent()


def start_tracing() -> JobTracing:
    """Spans from the global TracerProvider; when none is set, install the SDK's, exporting
    over OTLP/HTTP as the OTEL_* variables say (flushed when the process exits)."""
    from opentelemetry import trace

    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(provider)
    return JobTracing(trace.get_tracer(TRACER_NAME))


def current_traceparent() -> str | None:
    """The W3C traceparent of the current span, for `enqueue(..., traceparent=...)`: the job's
    handler span then joins this trace. None outside a span, or without the tracing extra."""
    if not tracing_available():
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier.get("traceparent")


async def read_traceparents(
    queue: QueueClient, tracing: JobTracing | None, jobs: list[Job]
) -> dict[int, str]:
    """The traceparents the claimed jobs were enqueued with, read in one call when tracing is
    on (the claim does not return them); without them the spans start new traces."""
    if tracing is None or not jobs:
        return {}
    try:
        return await queue.trace_contexts([job.id for job in jobs])
    except Exception as exc:  # an older database, or an outage: the jobs run all the same
        log.warning(
            "trace contexts unavailable (apply the migrations: supabase migration up): %s",
            exc,
            extra={"event": "worker.trace_contexts_failed", "error": str(exc)},
        )
        return {}
