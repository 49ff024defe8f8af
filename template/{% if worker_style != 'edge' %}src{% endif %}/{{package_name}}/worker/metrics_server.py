# Worker machinery: you should not need to edit this file (handlers live in handlers/).
"""`GET /metrics` on METRICS_HOST:METRICS_PORT: the worker's own metrics (metrics.py), then
the queue's, read from the database on each scrape.

The database's gauges (`pgqueue_jobs_queued`, `pgqueue_oldest_runnable_age_seconds`, ...)
come from `<schema>.metrics()` at scrape time, through the worker's own queue client. When
the database does not answer within SCRAPE_TIMEOUT, the scrape still serves the worker's
metrics, with `pgqueue_metrics_scrape_error 1`.

The endpoint listens on a port of its own, never on the one pg_net wakes: scrapers reach it
on the private network (Fly's `[metrics]`) or from a sidecar (Cloud Run), and the public
port keeps answering only to the service key. It is a small HTTP/1.1 server on the worker's
own event loop (one request per connection, as Prometheus scrapes), so a scrape can await the
database without a thread, and the worker keeps its signal handling.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric as MetricFamily

from ..queue import Metric, QueueClient
from ..settings import Settings
from .metrics import DATABASE_METRICS, WorkerMetrics

log = logging.getLogger(__name__)

# The classic text format, which every Prometheus-compatible scraper reads (prometheus_client's
# own server answers with it too, unless a scraper asks for another).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# How long a scrape waits for <schema>.metrics() before it answers without the database's
# gauges (Prometheus gives a whole scrape 10 s by default).
SCRAPE_TIMEOUT = 3.0
# The most a request line and its headers may take; a scraper sends a few hundred bytes.
_MAX_REQUEST_BYTES = 16 * 1024
_READ_TIMEOUT = 10.0


@contextlib.asynccontextmanager
async def serving_metrics(
    settings: Settings, metrics: WorkerMetrics, queue: QueueClient
) -> AsyncIterator[None]:
    """Serve GET /metrics on METRICS_HOST:METRICS_PORT while the block runs (nothing when
    METRICS_PORT is not set)."""
    if settings.metrics_port is None:
        yield
        return
    endpoint = MetricsEndpoint(metrics, queue)
    host, port = settings.metrics_host, settings.metrics_port
    try:
        server = await asyncio.start_server(endpoint.answer, host, port, limit=_MAX_REQUEST_BYTES)
    except OSError as exc:
        raise OSError(
            exc.errno,
            f"cannot serve metrics on {host}:{port} ({exc.strerror}): set METRICS_PORT to a "
            "free port, or METRICS_HOST to an address of this machine",
        ) from exc
    log.info(
        "serving metrics",
        extra={
            "event": "metrics.start",
            "host": settings.metrics_host,
            "port": settings.metrics_port,
        },
    )
    try:
        yield
    finally:
        server.close()
        await server.wait_closed()


class MetricsEndpoint:
    """Answers scrapes: the worker's metrics, then the database's."""

    def __init__(self, metrics: WorkerMetrics, queue: QueueClient) -> None:
        self._metrics = metrics
        self._queue = queue
        # One read of the database at a time: a scrape that comes while one is slow waits on
        # it instead of starting another.
        self._reading: asyncio.Future[list[Metric]] | None = None

    async def exposition(self) -> bytes:
        """The text Prometheus reads."""
        rows, error = await self._database_metrics()
        snapshot = CollectorRegistry(auto_describe=False)
        snapshot.register(_DatabaseCollector(rows, error))
        return generate_latest(self._metrics.registry) + generate_latest(snapshot)

    async def _database_metrics(self) -> tuple[list[Metric], bool]:
        """The rows of <schema>.metrics(), and whether reading them failed."""
        if self._reading is None or self._reading.done():
            self._reading = asyncio.ensure_future(self._queue.metrics())
            # A read that outlives its scrape still ends; its error is logged here, not lost.
            self._reading.add_done_callback(_retrieve)
        try:
            # shield(): a timeout leaves the call to finish on its own; cancelling a query
            # midway could leave the connection it runs on unusable for the worker.
            return await asyncio.wait_for(asyncio.shield(self._reading), SCRAPE_TIMEOUT), False
        except Exception as exc:
            reason = "timed out" if isinstance(exc, TimeoutError) else str(exc)
            log.warning(
                "metrics from the database unavailable: %s",
                reason,
                extra={"event": "metrics.database_unavailable", "error": reason},
            )
            return [], True

    async def answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One request on one connection, then close it."""
        try:
            method, path = await asyncio.wait_for(_read_request(reader), _READ_TIMEOUT)
            if path.split("?", 1)[0] != "/metrics":
                _respond(writer, "404 Not Found", b"not found: metrics are at /metrics\n")
            elif method not in ("GET", "HEAD"):
                _respond(writer, "405 Method Not Allowed", b"GET /metrics\n", allow="GET, HEAD")
            else:
                body = await self.exposition()
                _respond(writer, "200 OK", body, CONTENT_TYPE, head=method == "HEAD")
            await writer.drain()
        except (
            TimeoutError,
            ValueError,
            ConnectionError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
        ):
            pass  # a client that sent no proper request, too much, or went away: just close
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str]:
    """The method and path of an HTTP request; its headers are read and ignored."""
    method, path, _ = (await reader.readuntil(b"\n")).decode("latin-1").split(" ", 2)
    while (await reader.readuntil(b"\n")).strip():
        pass
    return method, path


def _respond(
    writer: asyncio.StreamWriter,
    status: str,
    body: bytes,
    content_type: str = "text/plain; charset=utf-8",
    *,
    head: bool = False,
    allow: str | None = None,
) -> None:
    headers = [
        f"HTTP/1.1 {status}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
        "Connection: close",
        *([f"Allow: {allow}"] if allow else []),
    ]
    writer.write(("\r\n".join(headers) + "\r\n\r\n").encode("latin-1"))
    if not head:
        writer.write(body)


def _retrieve(future: asyncio.Future[list[Metric]]) -> None:
    if not future.cancelled():
        future.exception()


class _DatabaseCollector:
    """One scrape's rows of <schema>.metrics() as metric families (a name ending in _total is
    a counter, any other a gauge), and `pgqueue_metrics_scrape_error`."""

    def __init__(self, rows: list[Metric], error: bool) -> None:
        self._rows = rows
        self._error = error

    def collect(self) -> Iterator[MetricFamily]:
        yield GaugeMetricFamily(
            "pgqueue_metrics_scrape_error",
            "1 when this scrape could not read the database's metrics (<schema>.metrics()).",
            value=1.0 if self._error else 0.0,
        )
        # Each known metric is declared even without a sample (no queue has jobs, say), so a
        # scraper and a dashboard always know its name and type.
        by_name: dict[str, list[Metric]] = {name: [] for name in DATABASE_METRICS}
        for row in self._rows:
            by_name.setdefault(row.name, []).append(row)
        for name, rows in sorted(by_name.items()):
            keys = sorted({key for row in rows for key in row.labels})
            documentation = DATABASE_METRICS.get(name, "From the queue's metrics() function.")
            family: GaugeMetricFamily | CounterMetricFamily
            if name.endswith("_total"):
                family = CounterMetricFamily(name, documentation, labels=keys)
            else:
                family = GaugeMetricFamily(name, documentation, labels=keys)
            for row in rows:
                family.add_metric([row.labels.get(key, "") for key in keys], row.value)
            yield family
