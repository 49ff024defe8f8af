"""The dashboard of a rendered project (`my-app dashboard`) against clients that are no browser:
a flood of password guesses sent at once, and cookies, tokens and job ids that are not what
the dashboard hands out (non-ASCII text among them). Each is refused for what it is, quickly,
and the dashboard logs no traceback."""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlencode, urlsplit

import httpx
import psycopg

from tests.support.jobs import job_by_id

from .conftest import Dashboard

# What `my-app dashboard` serves with: a wrong password holds up the next check this long.
LOGIN_DELAY = 1.0
GUESSES = 300


def post_all_at_once(dashboard: Dashboard, passwords: list[str]) -> list[tuple[int, float]]:
    """POST every password to /login at once, each on a connection of its own: each
    answer's status and when it came (seconds after the first was sent). Plain sockets: an
    HTTP client's connection pool costs more time than the answers take to come."""
    address = urlsplit(dashboard.url)

    async def attempt(password: str, started: float) -> tuple[int, float]:
        reader, writer = await asyncio.open_connection(address.hostname, address.port)
        body = urlencode({"password": password}).encode()
        writer.write(
            f"POST /login HTTP/1.1\r\nHost: {address.netloc}\r\n"
            "Content-Type: application/x-www-form-urlencoded\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        status_line = await asyncio.wait_for(reader.readline(), 60)
        answered = time.monotonic() - started
        writer.close()
        return int(status_line.split()[1]), answered

    async def send() -> list[tuple[int, float]]:
        started = time.monotonic()
        return await asyncio.gather(*(attempt(p, started) for p in passwords))

    # In a thread of its own: Playwright's sync API may hold this thread's event loop.
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(asyncio.run, send()).result()


def test_guessing_in_parallel_goes_no_faster(dashboard: Dashboard) -> None:
    """Hundreds of guesses sent at once, the right password last: passwords are checked one at
    a time, a wrong one holds up the next check for the login delay, and what cannot wait its
    turn among a few is turned away at once (429) instead of queueing without bound."""
    wrong = [f"guess number {n}" for n in range(GUESSES)]
    answers = post_all_at_once(dashboard, [*wrong, dashboard.password])

    statuses = [status for status, _ in answers]
    assert set(statuses) <= {303, 401, 429}, statuses
    turned_away = [at for status, at in answers if status == 429]
    assert len(turned_away) >= GUESSES - 20, "attempts queued without bound"
    # Answered without waiting for any check (queued, the last would wait 300 login delays);
    # the bound leaves time for 301 connections on a busy machine.
    assert max(turned_away) < 15, "attempts turned away should be answered at once"
    # When each checked password was checked: a wrong one is answered the login delay after
    # its check, the right one at once.
    checks = sorted(
        at - (LOGIN_DELAY if status == 401 else 0) for status, at in answers if status != 429
    )
    gaps = [later - earlier for earlier, later in itertools.pairwise(checks)]
    assert all(gap > 0.8 * LOGIN_DELAY for gap in gaps), f"checks at {checks}"
    right_status, right_at = answers[-1]
    assert right_status == 429 or right_at >= (statuses.count(401) - 1) * 0.8 * LOGIN_DELAY

    # The flood leaves nothing behind: the right password, sent alone, opens the dashboard.
    with httpx.Client(base_url=dashboard.url) as client:
        assert client.post("/login", data={"password": dashboard.password}).status_code == 303


def test_foreign_cookies_tokens_and_job_ids_are_refused(
    dashboard: Dashboard, db: psycopg.Connection, jobs: dict
) -> None:
    logged_so_far = len(dashboard.output())
    dead = jobs["dead"]
    # A cookie header is bytes: a client may send any, and Starlette reads it as Latin-1.
    foreign = {"Cookie": "dashboard_session=\u00b2.\u00b2".encode()}
    with httpx.Client(base_url=dashboard.url, headers=foreign) as stranger:
        assert stranger.get("/").status_code == 303, "no session: to the login page"
        assert stranger.get("/").headers["location"] == "/login"
        assert stranger.get("/login").status_code == 200
        assert stranger.get(f"/jobs/{dead}").status_code == 303
        assert stranger.post(f"/jobs/{dead}/retry", data={"csrf": "x"}).status_code == 403
        assert stranger.post("/logout", data={"csrf": "x"}).status_code == 403

    with httpx.Client(base_url=dashboard.url) as client:
        assert client.post("/login", data={"password": dashboard.password}).status_code == 303
        token = re.search(
            rf'action="/jobs/{dead}/retry">\s*<input type="hidden" name="csrf" value="(\w+)"',
            client.get("/").text,
        )
        assert token is not None
        for forged in ("\u00b2", token[1][:-1] + "\u00e9", "\u00b2" * 64):
            refused = client.post(f"/jobs/{dead}/retry", data={"csrf": forged})
            assert refused.status_code == 403, forged
        assert job_by_id(db, dead)["status"] == "failed"
        # Digits of other scripts are digits to Python, no job id to the queue.
        for job_id in ("\u00b2", "\u0663", "1\u00b2", "-1", "1e3"):
            assert client.get(f"/jobs/{job_id}").status_code == 400, job_id
            assert client.get("/jobs", params={"id": job_id}).status_code == 400, job_id
            assert client.post(f"/jobs/{job_id}/retry", data={"csrf": "x"}).status_code in (
                400,
                403,
            )
        # A whole number past the largest job id there can be is no such job.
        assert client.get(f"/jobs/{2**63}").status_code == 404
        assert client.get(f"/jobs/{10**19 - 1}").status_code == 404
        assert client.get(f"/jobs/{dead}").status_code == 200, "the session still works"

    logged = dashboard.output()[logged_so_far:]
    assert "Traceback" not in logged, logged
    assert "did not answer" not in logged, logged
