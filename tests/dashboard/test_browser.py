"""The dashboard of a rendered project (`my-app dashboard`), in a real browser: Debian's
chromium driven by Playwright, against the live database holding jobs in every state. Its
numbers are SQL's, its buttons change what SQL then reads, a wrong password opens nothing, and
a form from anywhere else changes nothing. Screenshots go to test-artifacts/dashboard/."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import psycopg
from playwright.sync_api import Page
from psycopg.rows import dict_row

from tests.support.jobs import job_by_id

from .conftest import Dashboard

COUNTS = ("queued", "runnable", "running", "done", "failed", "cancelled")


def log_in(page: Page, dashboard: Dashboard) -> None:
    page.goto(f"{dashboard.url}/")
    assert page.url == f"{dashboard.url}/login", "a page without a session goes to the login"
    page.fill("#password", dashboard.password)
    with page.expect_navigation():
        page.click("form[action='/login'] button")
    assert page.url == f"{dashboard.url}/"


def click(page: Page, scope: str, button: str) -> None:
    """Click the button named `button` inside `scope` (a CSS selector), and wait for the page
    it leads to."""
    with page.expect_navigation():
        page.locator(scope).get_by_role("button", name=button).click()


def test_a_wrong_password_opens_nothing(page: Page, dashboard: Dashboard, screenshot) -> None:
    page.goto(f"{dashboard.url}/login")
    page.fill("#password", dashboard.password + "x")
    with page.expect_response(lambda r: r.request.method == "POST") as answer:
        page.click("form[action='/login'] button")
    assert answer.value.status == 401
    assert page.locator("[role=alert]").inner_text() == "Wrong password."
    assert page.locator("#queues, #dead-letters, form[action='/logout']").count() == 0
    assert page.context.cookies() == []
    screenshot("wrong-password")
    page.goto(f"{dashboard.url}/")
    assert page.url == f"{dashboard.url}/login"


def sql_queues(db: psycopg.Connection) -> dict[str, dict]:
    """Each queue's line as the dashboard should show it, from the `stats` and `queue_states`
    views: jobs per status summed over kinds, runnable, the oldest runnable's wait in seconds,
    and whether it is paused."""
    queues: dict[str, dict] = {}
    with db.cursor(row_factory=dict_row) as cur:
        for row in cur.execute("select * from pgqueue.stats"):
            line = queues.setdefault(row["queue"], dict.fromkeys(COUNTS, 0))
            if row["status"] in COUNTS:
                line[row["status"]] += row["jobs"]
            line["runnable"] += row["runnable"]
            if row["oldest_runnable_age"] is not None:
                age = row["oldest_runnable_age"].total_seconds()
                line["oldest"] = max(line.get("oldest", 0), age)
        for state in cur.execute("select * from pgqueue.queue_states"):
            line = queues.setdefault(state["queue"], dict.fromkeys(COUNTS, 0))
            line["paused"] = state["paused"]
    for line in queues.values():
        line.setdefault("paused", False)
        line.setdefault("oldest", None)
    return queues


def shown_queues(page: Page) -> dict[str, dict]:
    queues = {}
    for row in page.locator("#queues tbody tr").all():
        cell = lambda field, row=row: row.locator(f"[data-field={field}]")  # noqa: E731
        line = {field: int(cell(field).inner_text()) for field in COUNTS}
        line["paused"] = cell("state").inner_text() == "paused"
        seconds = cell("oldest_runnable").get_attribute("data-seconds")
        line["oldest"] = float(seconds) if seconds else None
        queues[row.get_attribute("data-queue")] = line
    return queues


def test_the_overview_shows_what_sql_says(
    page: Page, dashboard: Dashboard, db: psycopg.Connection, jobs: dict, screenshot
) -> None:
    before = sql_queues(db)
    log_in(page, dashboard)
    after = sql_queues(db)
    shown = shown_queues(page)
    screenshot("overview", full_page=False)  # docs/images/dashboard.png is one of these
    screenshot("overview-full")

    assert set(shown) == set(before) == {"default", "mail"}
    for queue, line in shown.items():
        # the counts hold still (nothing runs jobs here); the waits grow as time passes
        assert {k: line[k] for k in COUNTS} == {k: before[queue][k] for k in COUNTS}, queue
        assert line["paused"] == before[queue]["paused"], queue
        if line["oldest"] is None:
            assert before[queue]["oldest"] is None
        else:
            assert before[queue]["oldest"] <= line["oldest"] <= after[queue]["oldest"]
    assert shown["mail"]["paused"] and not shown["default"]["paused"]
    assert shown["default"]["running"] == 1 and shown["default"]["failed"] == 6

    kinds = {
        (
            row.get_attribute("data-queue"),
            row.get_attribute("data-kind"),
            row.get_attribute("data-status"),
        ): (
            int(row.locator("[data-field=jobs]").inner_text()),
            int(row.locator("[data-field=runnable]").inner_text()),
        )
        for row in page.locator("#kinds tbody tr").all()
    }
    stats = db.execute("select queue, kind, status, jobs, runnable from pgqueue.stats").fetchall()
    assert kinds == {(q, k, s): (n, r) for q, k, s, n, r in stats}

    dead = [int(r.get_attribute("data-job")) for r in page.locator("#dead-letters tbody tr").all()]
    assert dead == [i for (i,) in db.execute("select id from pgqueue.dead_letters limit 50")]
    assert jobs["dead"] in dead
    retrying = [int(r.get_attribute("data-job")) for r in page.locator("#retrying tbody tr").all()]
    assert (
        retrying
        == [jobs["retrying"]]
        == [
            i
            for (i,) in db.execute(
                "select id from pgqueue.jobs where status = 'queued' and attempts > 0"
                " order by run_after, id"
            )
        ]
    )

    totals = db.execute(
        "select sum(done), sum(failed), sum(cancelled), count(distinct minute)"
        " from pgqueue.throughput(30)"
    ).fetchone()
    assert totals is not None
    done, failed, cancelled, minutes = totals
    assert [int(page.locator(f"[data-total={k}]").inner_text()) for k in COUNTS[3:]] == [
        done,
        failed,
        cancelled,
    ]
    assert done > 50 and failed == 6 and cancelled == 1
    assert page.locator("svg.chart g").count() == minutes

    # an error holding markup is shown as text; no script ever reaches the page
    error = page.locator(f'#dead-letters tr[data-job="{jobs["dead"]}"] .error-text')
    assert "<script>alert('error')</script>" in error.inner_text()
    assert page.locator("script").count() == 0


def test_retry_a_dead_letter(
    page: Page, dashboard: Dashboard, db: psycopg.Connection, jobs: dict, screenshot
) -> None:
    dead = jobs["dead"]
    log_in(page, dashboard)
    click(page, f'#dead-letters tr[data-job="{dead}"]', "Retry")
    assert page.url == f"{dashboard.url}/jobs/{dead}?done=retried"
    assert page.locator("[role=status]").inner_text() == "Queued again."
    assert page.locator("[data-field=status]").inner_text() == "queued"
    state = job_by_id(db, dead)
    assert (state["status"], state["attempts"]) == ("queued", 0)
    screenshot("retried")
    page.goto(f"{dashboard.url}/")
    assert page.locator(f'#dead-letters tr[data-job="{dead}"]').count() == 0
    assert shown_queues(page)["default"]["queued"] == sql_queues(db)["default"]["queued"]


def paused(db: psycopg.Connection, queue: str) -> bool:
    row = db.execute("select paused from pgqueue.queue_states where queue = %s", (queue,))
    return bool((row.fetchone() or (False,))[0])


def test_pause_and_resume_a_queue(
    page: Page, dashboard: Dashboard, db: psycopg.Connection, jobs: dict, screenshot
) -> None:
    log_in(page, dashboard)
    row = '#queues tr[data-queue="default"]'
    click(page, row, "Pause")
    assert paused(db, "default")
    assert page.locator(f"{row} [data-field=state]").inner_text() == "paused"
    screenshot("paused")
    click(page, row, "Resume")
    assert not paused(db, "default")
    assert page.locator(f"{row} [data-field=state]").inner_text() == "running"
    click(page, '#queues tr[data-queue="mail"]', "Resume")
    assert not paused(db, "mail")


def test_a_jobs_detail(
    page: Page, dashboard: Dashboard, db: psycopg.Connection, jobs: dict, screenshot
) -> None:
    log_in(page, dashboard)
    page.fill("#find-id", str(jobs["dead"]))
    with page.expect_navigation():
        page.click("form.find button")
    assert page.url == f"{dashboard.url}/jobs/{jobs['dead']}"
    dead = job_by_id(db, jobs["dead"])
    field = lambda name: page.locator(f"[data-field={name}]").inner_text()  # noqa: E731
    assert field("status") == "dead-lettered"
    assert field("kept").startswith("A dead-lettered job keeps its payload and last error")
    assert field("attempts") == "1 of 1"
    assert field("last_error") == dead["last_error"]
    # each failed attempt's error, its markup shown as text
    attempts = page.locator("[data-field=errors] tbody tr")
    assert attempts.count() == 1
    assert attempts.first.get_attribute("data-attempt") == "1"
    assert attempts.first.locator("[data-field=error-type]").inner_text() == "ValueError"
    assert attempts.first.locator("pre").inner_text() == dead["last_error"]
    assert json.loads(field("payload")) == dead["payload"]
    assert page.get_by_role("button", name="Retry").count() == 1
    assert page.locator("script").count() == 0
    screenshot("dead-letter")

    page.goto(f"{dashboard.url}/jobs/{jobs['done']}")
    assert field("status") == "done"
    assert json.loads(field("result")) == {"pages": 12, "url": "s3://r/11.pdf"}
    assert page.get_by_role("button").filter(has_text=re.compile("Retry|Cancel")).count() == 0

    page.goto(f"{dashboard.url}/jobs/{jobs['retrying']}")
    assert page.locator("[data-field=snoozes]").count() == 0
    db.execute("update pgqueue.jobs set run_after = now() where id = %s", (jobs["retrying"],))
    (claimed, token) = db.execute(
        "select id, lock_token from pgqueue.claim('w', kinds => array['send_webhook'])"
    ).fetchone()
    assert claimed == jobs["retrying"]
    db.execute("select pgqueue.fail(%s, %s, 'HTTPError: 503', retry_in => '0 s')", (claimed, token))
    db.execute("select pgqueue.claim('w', kinds => array['send_webhook'])")
    db.execute(
        "select pgqueue.snooze(id, lock_token, 3600) from pgqueue.running_jobs where id = %s",
        (claimed,),
    )
    page.reload()
    assert field("snoozes") == "1"
    # newest first: the second attempt's error above the first's
    rows = page.locator("[data-field=errors] tbody tr")
    assert [rows.nth(i).get_attribute("data-attempt") for i in range(2)] == ["2", "1"]
    assert rows.first.locator("[data-field=error-type]").inner_text() == "HTTPError"
    screenshot("attempt-errors")

    page.goto(f"{dashboard.url}/jobs/{jobs['running']}")
    assert json.loads(field("progress")) == {"pct": 40}
    click(page, ".actions", "Cancel")
    assert job_by_id(db, jobs["running"])["status"] == "cancelled"

    page.goto(f"{dashboard.url}/jobs/999999")
    assert "No job 999999" in page.locator("[role=alert]").inner_text()


@contextmanager
def another_site(html: str) -> Iterator[str]:
    """A page served from another origin (another port), as a site elsewhere would."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = html.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def test_forms_from_elsewhere_change_nothing(
    page: Page, dashboard: Dashboard, db: psycopg.Connection, jobs: dict
) -> None:
    dead = jobs["dead"]
    # A page on another site, opened in the browser that is logged in, posts a form here.
    log_in(page, dashboard)
    forged = (
        f'<form method="post" action="{dashboard.url}/jobs/{dead}/retry">'
        '<input type="hidden" name="csrf" value="guessed"><button>Win a prize</button></form>'
    )
    with another_site(forged) as url:
        page.goto(url)
        with page.expect_response(lambda r: r.request.method == "POST") as answer:
            page.click("button")
    assert answer.value.status == 403

    # Any client: without the form's token, or with it but from another origin.
    with httpx.Client(base_url=dashboard.url) as client:
        login = client.post("/login", data={"password": dashboard.password})
        assert login.status_code == 303
        html = client.get("/").text
        token = re.search(
            rf'action="/jobs/{dead}/retry">\s*<input type="hidden" name="csrf" value="(\w+)"',
            html,
        )
        assert token is not None
        refused = [
            client.post(f"/jobs/{dead}/retry"),
            client.post(f"/jobs/{dead}/retry", data={"csrf": "0" * 64}),
            client.post(
                f"/jobs/{dead}/retry",
                data={"csrf": token[1]},
                headers={"Origin": "https://evil.example"},
            ),
            client.post("/queues/pause", data={"queue": "default", "csrf": token[1]}),
        ]
        assert [r.status_code for r in refused] == [403] * 4
        assert job_by_id(db, dead)["status"] == "failed"
        assert not paused(db, "default")
        # the token itself is good: sent from this site, it works
        assert client.post(f"/jobs/{dead}/retry", data={"csrf": token[1]}).status_code == 303
    assert job_by_id(db, dead)["status"] == "queued"
    assert dashboard.password not in html
