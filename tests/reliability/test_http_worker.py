"""The HTTP worker's door: only a wake-up the database signed with the worker's secret opens
it, once, and only for a small body. A real wake-up, signed in the database and sent by the
real pg_net, is caught on its way, then sent to the worker as it came, replayed, and forged:
unsigned, with the secret as a bearer token (as 1.1.0 sent it), signed with another key,
with its body or id changed, stale or ahead by 6 minutes. Each forgery gets 401 or 403, bodies
over the limit get 413, nothing is claimed meanwhile, and the refusals are logged once."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import psycopg

from testkit.postgrest import make_jwt
from testkit.stack import point_wake_ups, wait_for_pg_net
from tests.support.http_sink import HttpSink, Request
from tests.support.jobs import enqueue, job, wait_until
from tests.support.wake_signing import secret_for, signed

from .conftest import HTTP, Fleet
from .harness import executions, figures

MAX_BODY_BYTES = 64 * 1024  # worker/app.py's limit
KEY = secret_for("wake-secret-of-the-reliability-suite-0123")
SIGNATURE_HEADERS = ("webhook-id", "webhook-timestamp", "webhook-signature")


def caught_wake_up(db: psycopg.Connection) -> Request:
    """A wake-up as the database signs it and pg_net sends it (enqueue a job with wake-ups
    pointed at a recording server)."""
    with HttpSink() as sink:
        point_wake_ups(db, sink.url, KEY)
        try:
            enqueue(db, "strict_order", order_id=1)
            wait_for_pg_net(db)
        finally:
            point_wake_ups(db, None, None)
    (request,) = sink.requests
    return request


def forgeries(real: Request) -> dict[str, tuple[dict[str, str], bytes, int]]:
    """name: (headers, body, the status it must get)."""
    headers = {name: real.headers[name] for name in SIGNATURE_HEADERS}
    now = datetime.now(tz=UTC)
    signature = headers["webhook-signature"].removeprefix("v1,")
    return {
        "unsigned": ({}, real.body, 401),
        "the secret as a bearer token": ({"Authorization": f"Bearer {KEY}"}, real.body, 401),
        "anon JWT": ({"Authorization": f"Bearer {make_jwt('anon')}"}, real.body, 401),
        "signed with another key": (signed(secret_for("not-the-key"), real.body), real.body, 403),
        "changed body": (headers, real.body.replace(b"default", b"elsewhere"), 403),
        "id changed": ({**headers, "webhook-id": "wake_another"}, real.body, 403),
        "timestamp changed": (
            {**headers, "webhook-timestamp": str(int(headers["webhook-timestamp"]) + 1)},
            real.body,
            403,
        ),
        "signature of version v2": (
            {**headers, "webhook-signature": f"v2,{signature}"},
            real.body,
            403,
        ),
        "stale by 6 minutes": (
            signed(KEY, real.body, at=now - timedelta(minutes=6)),
            real.body,
            403,
        ),
        "ahead by 6 minutes": (
            signed(KEY, real.body, at=now + timedelta(minutes=6)),
            real.body,
            403,
        ),
    }


def test_wake_takes_the_databases_wake_up_once_and_refuses_forgeries_and_big_bodies(
    db: psycopg.Connection, fleet: Fleet, audit_dir: Path
) -> None:
    worker = fleet(
        HTTP,
        SERVICE_ROLE_KEY=make_jwt("service_role"),
        WAKE_SECRET=KEY,
        WORKER_POLL_INTERVAL=60,
        WORKER_LINGER_SECONDS=0,
    ).start()
    # caught before the worker could get it; no idle poll and no linger: only the requests
    # below can wake the worker
    real = caught_wake_up(db)
    (job_id,) = [row[0] for row in db.execute("select id from pgqueue.all_jobs").fetchall()]
    assert "Authorization" not in real.headers and KEY not in str(real.headers)
    wake = f"{worker.url}/wake"
    statuses: dict[str, int] = {}
    expected: dict[str, int] = {}

    with httpx.Client(timeout=10) as http:
        for name, (headers, body, status) in forgeries(real).items():
            statuses[name], expected[name] = (
                http.post(wake, headers=headers, content=body).status_code,
                status,
            )
        too_big = {
            "limit + 1 byte": b"x" * (MAX_BODY_BYTES + 1),
            "1 MiB": b"x" * (1 << 20),
        }
        for name, content in too_big.items():
            headers = signed(KEY, content)
            statuses[f"body {name}"] = http.post(wake, headers=headers, content=content).status_code
        chunked = iter([b"x" * 32768] * 4)
        headers = signed(KEY, b"x" * 32768 * 4)
        statuses["body chunked, 4 x 32 KiB"] = http.post(
            wake, headers=headers, content=chunked
        ).status_code
        statuses["unsigned, 1 MiB body"] = http.post(wake, content=b"x" * (1 << 20)).status_code

        time.sleep(0.5)
        untouched = job(db, job_id)
        health = http.get(f"{worker.url}/health", headers=worker.health_headers).json()
        assert (untouched["status"], untouched["attempts"]) == ("queued", 0)
        assert (health["draining"], health["counts"]) == (False, {})
        assert not executions(audit_dir)

        # the database's own wake-up is taken, once
        headers = {name: real.headers[name] for name in SIGNATURE_HEADERS}
        accepted = http.post(wake, headers=headers, content=real.body).status_code
        replayed = http.post(wake, headers=headers, content=real.body).status_code
    wait_until(lambda: job(db, job_id)["status"] == "done", what="the job to run")

    refused = {name: code for name, code in statuses.items() if name in expected}
    figures(
        "http door",
        forgeries_refused=sum(code in (401, 403) for code in refused.values()),
        forgeries_tried=len(refused),
        bodies_413=sum(code == 413 for name, code in statuses.items() if name.startswith("body")),
        claimed_while_refusing=untouched["attempts"],
        accepted=accepted,
        replayed=replayed,
    )
    assert refused == expected, refused
    assert {code for name, code in statuses.items() if name.startswith("body")} == {413}, statuses
    assert statuses["unsigned, 1 MiB body"] == 401
    assert (accepted, replayed) == (202, 403)
    assert worker.proc.poll() is None
    # a dozen refusals within a minute: one line, saying what to check, and never the secret
    (logged,) = worker.events("wake.refused")
    assert "WAKE_SECRET" in logged["msg"] and "clock" in logged["msg"], logged
    assert KEY not in worker.output()
