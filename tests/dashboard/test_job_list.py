"""The dashboard's job list in a real browser (Debian's chromium), against the live database: a
status's jobs page by page as SQL lists them, filtered by kind, queue, time and idempotency key;
retry and cancel of the filtered set after a page that names how many jobs change, changing
those and no other; and a bulk form without this site's token changing nothing.
Screenshots go to test-artifacts/dashboard/."""

from __future__ import annotations

import re
from datetime import UTC

import httpx
import psycopg
import pytest
from playwright.sync_api import Page
from psycopg.types.json import Jsonb

from .conftest import Dashboard
from .test_browser import another_site, click, log_in

PAGE_SIZE = 50


@pytest.fixture
def listed(db: psycopg.Connection) -> dict[str, list[int]]:
    """70 dead letters (45 send_email in `default`, 25 send_webhook in `mail`), finished a
    second apart, 60 queued send_email jobs stored as a batch and one with an idempotency key;
    their ids, newest first, by what they are."""
    ids: dict[str, list[int]] = {}
    for kind, queue, n in (("send_email", "default", 45), ("send_webhook", "mail", 25)):
        db.execute(
            "select pgqueue.enqueue_many(%s)",
            (Jsonb([{"kind": kind, "queue": queue, "payload": {"n": i}} for i in range(n)]),),
        )
        claimed = db.execute(
            "select id, lock_token from pgqueue.claim('w', %s, queue => %s)", (n, queue)
        ).fetchall()
        for job_id, token in claimed:
            db.execute(
                "select pgqueue.fail(%s, %s, 'HTTP 503', retryable => false)", (job_id, token)
            )
        ids[kind] = sorted((i for i, _ in claimed), reverse=True)
    db.execute(
        "update pgqueue.job_history set finished_at = now() - interval '1 hour'"
        " + id * interval '1 second'"
    )
    db.execute(
        "select pgqueue.enqueue_many(%s)",
        (Jsonb([{"kind": "send_email", "payload": {"n": i}} for i in range(60)]),),
    )
    ids["queued"] = [
        i for (i,) in db.execute("select id from pgqueue.live_jobs order by id desc").fetchall()
    ]
    (keyed,) = db.execute(
        "select pgqueue.enqueue('send_email', '{}', idempotency_key => 'order-42')"
    ).fetchone()
    ids["keyed"] = [keyed]
    ids["queued"].insert(0, keyed)
    return ids


def shown(page: Page) -> list[int]:
    return [int(r.get_attribute("data-job")) for r in page.locator("#job-list tbody tr").all()]


def shown_count(page: Page) -> int:
    return int(page.locator("[data-field=count]").get_attribute("data-count"))


def every_page(page: Page) -> list[int]:
    """The ids of this page and of every page after it, following the Next page links."""
    ids = shown(page)
    while page.get_by_role("link", name="Next page").count():
        with page.expect_navigation():
            page.get_by_role("link", name="Next page").click()
        assert len(shown(page)) <= PAGE_SIZE
        ids += shown(page)
    return ids


def submit_filters(page: Page, **fields: str) -> None:
    for name, value in fields.items():
        if name == "status":
            page.select_option("form.filters select[name=status]", value)
        else:
            page.fill(f"form.filters input[name={name}]", value)
    with page.expect_navigation():
        page.click("form.filters button")


def test_the_list_pages_and_filters_as_sql_lists(
    page: Page, dashboard: Dashboard, db: psycopg.Connection, listed: dict, screenshot
) -> None:
    log_in(page, dashboard)
    with page.expect_navigation():
        page.get_by_role("link", name="Jobs", exact=True).click()
    # the dead letters first, the newest finished first: send_webhook's, then send_email's
    newest = listed["send_webhook"] + listed["send_email"]
    assert shown(page) == newest[:PAGE_SIZE] and shown_count(page) == 70
    screenshot("job-list", full_page=False)
    assert every_page(page) == newest

    submit_filters(page, kind="send_webhook")
    assert shown(page) == listed["send_webhook"] and shown_count(page) == 25
    submit_filters(page, kind="", queue="default")
    assert shown(page) == listed["send_email"] and shown_count(page) == 45
    # finished before the 10th newest send_email dead letter: the 35 after it
    (cut,) = db.execute(
        "select finished_at from pgqueue.job_history where id = %s", (listed["send_email"][9],)
    ).fetchone()
    submit_filters(page, until=cut.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S"))
    assert shown(page) == listed["send_email"][10:] and shown_count(page) == 35

    page.goto(f"{dashboard.url}/list?status=queued")
    assert shown_count(page) == 61
    assert every_page(page) == listed["queued"]
    submit_filters(page, status="", key="order-42")
    assert shown(page) == listed["keyed"] and shown_count(page) == 1
    assert page.locator("script").count() == 0


def confirm(page: Page, link: str) -> str:
    """Follow the bulk link named `link`: the confirmation page's heading."""
    with page.expect_navigation():
        page.get_by_role("link", name=link).click()
    return page.locator("#bulk h1").inner_text()


def statuses(db: psycopg.Connection) -> dict[int, str]:
    return dict(db.execute("select id, status from pgqueue.all_jobs").fetchall())


def test_retry_the_filtered_dead_letters_after_confirming_how_many(
    page: Page, dashboard: Dashboard, db: psycopg.Connection, listed: dict, screenshot
) -> None:
    before = statuses(db)
    log_in(page, dashboard)
    page.goto(f"{dashboard.url}/list?status=failed&queue=mail")
    assert confirm(page, "Retry these jobs…") == "Retry 25 jobs?"
    screenshot("bulk-retry-confirm", full_page=False)
    assert statuses(db) == before, "a confirmation changes nothing"
    click(page, "#bulk", "Retry 25 jobs")
    assert page.locator("[data-field=done]").inner_text() == "25"
    after = statuses(db)
    assert {i for i in after if after[i] != before[i]} == set(listed["send_webhook"])
    assert {after[i] for i in listed["send_webhook"]} == {"queued"}
    with page.expect_navigation():
        page.get_by_role("link", name="Back to the list").click()
    assert shown(page) == [] and shown_count(page) == 0


def test_cancel_the_filtered_queued_jobs_after_confirming_how_many(
    page: Page, dashboard: Dashboard, db: psycopg.Connection, listed: dict
) -> None:
    before = statuses(db)
    log_in(page, dashboard)
    page.goto(f"{dashboard.url}/list?status=queued&kind=send_email")
    assert confirm(page, "Cancel these jobs…") == "Cancel 61 jobs?"
    click(page, "#bulk", "Cancel 61 jobs")
    assert page.locator("[data-field=done]").inner_text() == "61"
    after = statuses(db)
    assert {i for i in after if after[i] != before[i]} == set(listed["queued"])
    assert {after[i] for i in listed["queued"]} == {"cancelled"}


def test_a_bulk_form_without_this_sites_token_changes_nothing(
    page: Page, dashboard: Dashboard, db: psycopg.Connection, listed: dict
) -> None:
    before = statuses(db)
    fields = {"status": "failed", "until": "2100-01-01T00:00:00+00:00", "count": "70"}
    log_in(page, dashboard)
    hidden = "".join(f'<input type="hidden" name="{k}" value="{v}">' for k, v in fields.items())
    forged = f'<form method="post" action="{dashboard.url}/list/retry">{hidden}<button>Go</button>'
    with another_site(forged + "</form>") as url:
        page.goto(url)
        with page.expect_response(lambda r: r.request.method == "POST") as answer:
            page.click("button")
    assert answer.value.status == 403

    with httpx.Client(base_url=dashboard.url) as client:
        assert client.post("/login", data={"password": dashboard.password}).status_code == 303
        html = client.get("/list/retry", params={"status": "failed"}).text
        token = re.search(
            r'action="/list/retry">\s*<input type="hidden" name="csrf" value="(\w+)"', html
        )
        assert token is not None and "Retry 70 jobs" in html
        refused = [
            client.post("/list/retry", data=fields),
            client.post("/list/retry", data={**fields, "csrf": "0" * 64}),
            client.post("/list/cancel", data={**fields, "csrf": token[1]}),
            client.post(
                "/list/retry",
                data={**fields, "csrf": token[1]},
                headers={"Origin": "https://evil.example"},
            ),
        ]
        assert [r.status_code for r in refused] == [403] * 4
        assert statuses(db) == before
        # the token itself is good: sent from this site, it works
        done = client.post("/list/retry", data={**fields, "csrf": token[1]})
        assert done.status_code == 200
    assert {statuses(db)[i] for i in listed["send_email"]} == {"queued"}
