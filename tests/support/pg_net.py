"""STAND-IN for pg_net's background worker (see sql/pg_net.sql for the SQL half).

pg_net's worker takes committed rows from net.http_request_queue in batches, sends each
request over HTTP, and writes the outcome to net._http_response (status, headers, body, or
timed_out / error_msg). It never retries. This thread does the same against the test cluster,
so a test can INSERT jobs and watch a real HTTP request reach a real server.
"""

from __future__ import annotations

import threading
import time

import httpx
import psycopg
from psycopg.types.json import Jsonb

BATCH_SIZE = 200  # pg_net's default pg_net.batch_size


class PgNetWorker:
    def __init__(self, dsn: str, poll_interval: float = 0.02) -> None:
        self.dsn = dsn
        self.poll_interval = poll_interval
        self._stop = threading.Event()
        self._idle = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pg_net stand-in", daemon=True)
        self.sent = 0

    def start(self) -> PgNetWorker:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def wait_idle(self, timeout: float = 10) -> None:
        """Block until every committed request has been sent and its response stored."""
        deadline = time.monotonic() + timeout
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while True:
                self._idle.clear()
                pending = conn.execute("select count(*) from net.http_request_queue").fetchone()
                if pending and pending[0] == 0 and self._idle.wait(timeout=1):
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError("pg_net stand-in did not drain its request queue")
                time.sleep(self.poll_interval)

    def _run(self) -> None:
        with (
            psycopg.connect(self.dsn, autocommit=True) as conn,
            httpx.Client() as http,
        ):
            while not self._stop.is_set():
                with conn.transaction():
                    batch = conn.execute(
                        """
                        with next as materialized (
                          select id from net.http_request_queue
                          order by id limit %s for update skip locked
                        )
                        delete from net.http_request_queue as q using next
                        where q.id = next.id
                        returning q.id, q.method, q.url, q.headers, q.body,
                                  q.timeout_milliseconds
                        """,
                        (BATCH_SIZE,),
                    ).fetchall()
                for row in sorted(batch):
                    self._send(conn, http, *row)
                if not batch:
                    self._idle.set()
                    self._stop.wait(self.poll_interval)

    def _send(self, conn, http, request_id, method, url, headers, body, timeout_ms) -> None:
        result: dict = {"id": request_id, "timed_out": False, "error_msg": None}
        try:
            response = http.request(
                method, url, headers=headers, content=body, timeout=timeout_ms / 1000
            )
            result |= {
                "status_code": response.status_code,
                "content_type": response.headers.get("content-type"),
                "headers": Jsonb(dict(response.headers)),
                "content": response.text,
            }
        except httpx.TimeoutException as exc:
            result |= {"timed_out": True, "error_msg": f"Timeout was reached: {exc}"}
        except httpx.HTTPError as exc:
            result |= {"error_msg": f"{type(exc).__name__}: {exc}"}
        self.sent += 1
        conn.execute(
            """
            insert into net._http_response
              (id, status_code, content_type, headers, content, timed_out, error_msg)
            values (%(id)s, %(status_code)s, %(content_type)s, %(headers)s, %(content)s,
                    %(timed_out)s, %(error_msg)s)
            """,
            {"status_code": None, "content_type": None, "headers": None, "content": None} | result,
        )
