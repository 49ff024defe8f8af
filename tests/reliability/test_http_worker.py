"""The HTTP worker's door: only the exact service key opens it, and only for a small body.
Bearers that are missing, wrong, or shaped for a timing attack (same length, same prefix as
the key) get 403; bodies over the limit get 413; nothing is claimed either way."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import psycopg

from testkit.postgrest import make_jwt
from tests.support.jobs import enqueue, job, wait_until

from .conftest import HTTP, Fleet
from .harness import executions, figures

MAX_BODY_BYTES = 64 * 1024  # app.py's limit


def bearers(key: str) -> dict[str, dict[str, str]]:
    flipped = "A" if key[-1] != "A" else "B"
    return {
        "missing": {},
        "empty": {"Authorization": "Bearer"},
        "wrong": {"Authorization": "Bearer wrong"},
        "no scheme": {"Authorization": key},
        "basic scheme": {"Authorization": f"Basic {key}"},
        "anon JWT": {"Authorization": f"Bearer {make_jwt('anon')}"},
        "authenticated JWT": {"Authorization": f"Bearer {make_jwt('authenticated')}"},
        "same length, last char differs": {"Authorization": f"Bearer {key[:-1]}{flipped}"},
        "same length, first char differs": {
            "Authorization": f"Bearer {'x' if key[0] != 'x' else 'y'}{key[1:]}"
        },
        "prefix of the key": {"Authorization": f"Bearer {key[:-1]}"},
        "key plus one char": {"Authorization": f"Bearer {key}x"},
        "key in other case": {"Authorization": f"Bearer {key.swapcase()}"},
        "two keys": {"Authorization": f"Bearer {key},{key}"},
    }


def test_wake_refuses_bad_bearers_and_big_bodies_and_claims_nothing(
    db: psycopg.Connection, fleet: Fleet, audit_dir: Path
) -> None:
    key = "wake-secret-of-the-reliability-suite-0123"
    worker = fleet(
        HTTP,
        SERVICE_ROLE_KEY=make_jwt("service_role"),
        WAKE_SECRET=key,
        WORKER_POLL_INTERVAL=60,
        WORKER_LINGER_SECONDS=0,
    ).start()
    # no wake-up configured in this session, no linger: only the requests below can wake the
    # worker
    job_id = enqueue(db, "strict_order", order_id=1)
    wake = f"{worker.url}/wake"
    body = {"reason": "enqueue", "queues": ["default"]}
    statuses: dict[str, int] = {}

    with httpx.Client(timeout=10) as http:
        for name, headers in bearers(key).items():
            statuses[name] = http.post(wake, headers=headers, json=body).status_code
        good = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        too_big = {
            "limit + 1 byte": b"x" * (MAX_BODY_BYTES + 1),
            "1 MiB": b"x" * (1 << 20),
            "chunked, 4 x 32 KiB": iter([b"x" * 32768] * 4),
        }
        for name, content in too_big.items():
            statuses[f"body {name}"] = http.post(wake, headers=good, content=content).status_code
        statuses["wrong bearer, 1 MiB body"] = http.post(
            wake, headers={"Authorization": "Bearer wrong"}, content=b"x" * (1 << 20)
        ).status_code

        time.sleep(0.5)
        untouched = job(db, job_id)
        health = http.get(f"{worker.url}/health", headers=worker.health_headers).json()
        assert (untouched["status"], untouched["attempts"]) == ("queued", 0)
        assert (health["draining"], health["counts"]) == (False, {})
        assert not executions(audit_dir)

        # the right key with a body at the limit is let in, and the job runs
        at_limit = b'{"pad": "' + b"x" * (MAX_BODY_BYTES - 11) + b'"}'
        assert len(at_limit) == MAX_BODY_BYTES
        accepted = http.post(wake, headers=good, content=at_limit).status_code
    wait_until(lambda: job(db, job_id)["status"] == "done", what="the job to run")

    refused = {name: code for name, code in statuses.items() if not name.startswith("body")}
    figures(
        "http door",
        bearers_refused=sum(code == 403 for code in refused.values()),
        bearers_tried=len(refused),
        bodies_413=sum(code == 413 for name, code in statuses.items() if name.startswith("body")),
        bodies_tried=len(too_big),
        claimed_while_refusing=untouched["attempts"],
        accepted_at_limit=accepted,
    )
    assert refused == dict.fromkeys(refused, 403), refused
    assert {statuses[f"body {name}"] for name in too_big} == {413}, statuses
    assert accepted == 202
    assert worker.proc.poll() is None
