"""A job's workflow in the dashboard (issue 51), in a real browser (Debian's chromium) against
the live database holding a diamond (A -> B, A -> C, B and C -> D) enqueued through the SQL:
the job page draws its steps a layer per column in dependency order, as an ordered list named
by its heading, each step's status and result or error as SQL says and a link to its page;
the job list lists the waiting jobs and filters by workflow, and retries or cancels a
workflow's jobs as any filtered set, the SQL cascading to what waits on them. And an edge
project's `dashboard workflow ID`. Screenshots go to test-artifacts/dashboard/."""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter

import psycopg
from playwright.sync_api import Page
from psycopg.types.json import Jsonb

from tests.support.diamond import (
    C_ERROR,
    KINDS,
    RESULTS,
    complete,
    enqueue_diamond,
    finish_diamond,
)

from .conftest import Dashboard, EdgeDashboard
from .test_browser import click, log_in
from .test_job_list import confirm, shown, statuses, submit_filters


def drawn(page: Page, workflow: int) -> list[list[tuple[int, str]]]:
    """Each layer of the drawing, in order: its steps' ids and statuses as the badges say."""
    drawing = page.get_by_role("list", name=f"Workflow {workflow}")
    layers = []
    for layer in drawing.locator(":scope > li").all():
        steps = layer.locator("li[data-step]").all()
        layers.append(
            [(int(s.get_attribute("data-step")), s.locator(".badge").inner_text()) for s in steps]
        )
    return layers


def step(page: Page, job_id: int, field: str) -> str:
    return page.locator(f"li[data-step='{job_id}'] [data-field={field}]").inner_text()


def test_a_jobs_page_draws_its_workflow(
    page: Page, dashboard: Dashboard, db: psycopg.Connection, screenshot
) -> None:
    wf = enqueue_diamond(db)
    log_in(page, dashboard)
    page.goto(f"{dashboard.url}/jobs/{wf.d}")
    assert drawn(page, wf.a) == [
        [(wf.a, "done")],
        [(wf.b, "queued"), (wf.c, "queued")],
        [(wf.d, "waiting")],
    ]
    assert page.locator("[aria-current=step]").get_attribute("data-step") == str(wf.d)
    assert json.loads(step(page, wf.a, "step-result")) == RESULTS["a"]
    assert page.locator(f"li[data-step='{wf.d}'] .after").inner_text() == f"after {wf.b}, {wf.c}"
    assert page.locator("[data-field=status]").inner_text() == "waiting"
    waits_for = page.locator("[data-field=depends_on] a").all_inner_texts()
    assert waits_for == [str(wf.b), str(wf.c)]
    assert page.get_by_role("button", name="Cancel").count() == 1  # a waiting job can be
    screenshot("workflow-waiting")

    # each step links to its page, which draws the same workflow
    with page.expect_navigation():
        page.get_by_role("link", name=f"{wf.b} {KINDS['b']}").click()
    assert page.url == f"{dashboard.url}/jobs/{wf.b}"
    assert page.locator("[aria-current=step]").get_attribute("data-step") == str(wf.b)
    assert page.locator("[data-field=dependents] a").all_inner_texts() == [str(wf.d)]

    finish_diamond(db)
    page.goto(f"{dashboard.url}/jobs/{wf.a}")
    assert drawn(page, wf.a) == [
        [(wf.a, "done")],
        [(wf.b, "done"), (wf.c, "dead-lettered")],
        [(wf.d, "cancelled")],
    ]
    assert json.loads(step(page, wf.b, "step-result")) == RESULTS["b"]
    assert step(page, wf.c, "step-error") == C_ERROR  # its markup shown as text
    assert step(page, wf.d, "step-error").startswith(f"dependency {wf.c} was dead-lettered")
    assert page.locator("script").count() == 0
    screenshot("workflow-finished")


def test_the_list_filters_by_workflow_and_lists_waiting_jobs(
    page: Page, dashboard: Dashboard, db: psycopg.Connection
) -> None:
    wf = enqueue_diamond(db)
    # another workflow with a waiting job: X, and Y waiting for it
    (x,) = db.execute("select pgqueue.enqueue('send_email')").fetchone()
    (y,) = db.execute(
        "select pgqueue.enqueue('send_email', depends_on => array[%s])", (x,)
    ).fetchone()
    log_in(page, dashboard)
    page.goto(f"{dashboard.url}/list")
    with page.expect_navigation():
        page.locator("nav.tabs").get_by_role("link", name="Waiting").click()
    assert shown(page) == [y, wf.d]
    submit_filters(page, workflow=str(wf.a))
    assert shown(page) == [wf.d]
    submit_filters(page, status="queued")
    assert shown(page) == [wf.c, wf.b]
    submit_filters(page, workflow=str(wf.c))  # by any of its jobs' id
    assert shown(page) == [wf.c, wf.b]
    # the drawing's counts link to the list of them
    page.goto(f"{dashboard.url}/jobs/{y}")
    with page.expect_navigation():
        page.get_by_role("link", name="1 waiting").click()
    assert shown(page) == [y]


def test_a_workflows_failed_step_is_retried_from_the_list_and_its_dependents_wait_again(
    page: Page, dashboard: Dashboard, db: psycopg.Connection, screenshot
) -> None:
    wf = enqueue_diamond(db)
    finish_diamond(db)  # C dead-lettered, D cancelled with it
    # a dead letter in no workflow, which the workflow filter leaves alone
    (other,) = db.execute("select pgqueue.enqueue('send_email', max_attempts => 1)").fetchone()
    (token,) = db.execute(
        "select lock_token from pgqueue.claim('w', 1, kinds => array['send_email'])"
    ).fetchone()
    db.execute("select pgqueue.fail(%s, %s, 'SMTP 550')", (other, token))
    log_in(page, dashboard)
    page.goto(f"{dashboard.url}/list?status=failed")
    assert shown(page) == [other, wf.c]
    submit_filters(page, workflow=str(wf.a))
    assert shown(page) == [wf.c]

    assert confirm(page, "Retry these jobs…") == f"Retry 1 job of workflow {wf.a}?"
    cascade = page.locator("[data-field=cascade]").inner_text()
    assert "the jobs their failure cancelled" in cascade and "come back too" in cascade
    screenshot("workflow-retry-confirm", full_page=False)
    assert statuses(db)[wf.d] == "cancelled", "a confirmation changes nothing"
    click(page, "#bulk", "Retry 1 job")
    assert page.locator("[data-field=done]").inner_text() == "1"
    after = statuses(db)
    assert (after[wf.c], after[wf.d], after[other]) == ("queued", "waiting", "failed")

    # the list and the drawing show D waiting again, for C; C's success lets D run
    page.goto(f"{dashboard.url}/list?status=waiting&workflow={wf.a}")
    assert shown(page) == [wf.d]
    page.goto(f"{dashboard.url}/jobs/{wf.d}")
    assert drawn(page, wf.a)[2] == [(wf.d, "waiting")]
    complete(db, "c", {"path": "beach@4096w.jpg"})
    assert statuses(db)[wf.d] == "queued"


def test_a_workflows_waiting_jobs_are_cancelled_from_the_list_with_what_waits_on_them(
    page: Page, dashboard: Dashboard, db: psycopg.Connection, screenshot
) -> None:
    """A chain A -> B -> C (A queued, B and C waiting): the waiting resize_small jobs of A's
    workflow cancelled from the list, which cancels C, waiting on B; another workflow's
    waiting resize_small job stays."""
    chain = [
        {"kind": KINDS["a"], "payload": {}},
        {"kind": KINDS["b"], "payload": {}, "depends_on_index": [0]},
        {"kind": KINDS["d"], "payload": {}, "depends_on_index": [1]},
        {"kind": "send_email", "payload": {}},
        {"kind": KINDS["b"], "payload": {}, "depends_on_index": [3]},
    ]
    rows = db.execute("select pgqueue.enqueue_many(%s)", (Jsonb(chain),)).fetchall()
    a, b, c, x, y = (job_id for (job_id,) in rows)
    log_in(page, dashboard)
    page.goto(f"{dashboard.url}/list?status=waiting")
    assert shown(page) == [y, c, b]
    submit_filters(page, workflow=str(a), kind=KINDS["b"])
    assert shown(page) == [b]

    assert confirm(page, "Cancel these jobs…") == f"Cancel 1 job of workflow {a}?"
    cascade = page.locator("[data-field=cascade]").inner_text()
    assert "what waits on these jobs" in cascade and "is cancelled too" in cascade
    screenshot("workflow-cancel-confirm", full_page=False)
    click(page, "#bulk", "Cancel 1 job")
    assert page.locator("[data-field=done]").inner_text() == "1"
    after = statuses(db)
    assert [after[i] for i in (a, b, c, x, y)] == [
        "queued",
        "cancelled",
        "cancelled",
        "queued",
        "waiting",
    ]

    # the cascade, shown: the workflow's cancelled jobs, C with the reason
    page.goto(f"{dashboard.url}/list?status=cancelled&workflow={a}")
    assert shown(page) == [c, b]
    reason = page.locator(f"tr[data-job='{c}'] .error-text").inner_text()
    assert reason == f"dependency {b} was cancelled"
    page.goto(f"{dashboard.url}/jobs/{a}")
    assert drawn(page, a) == [[(a, "queued")], [(b, "cancelled")], [(c, "cancelled")]]
    screenshot("workflow-cancelled")


def test_a_workflow_of_1500_waiting_jobs_is_counted_whole_and_cancelled_by_one_action(
    page: Page, dashboard: Dashboard, db: psycopg.Connection
) -> None:
    """A workflow's count is not one page of its jobs: 1,500 waiting are counted, confirmed
    and cancelled (in calls of 500) by one action, and its first job stays queued."""
    fan_out = [{"kind": KINDS["a"], "payload": {}}] + [
        {"kind": KINDS["b"], "payload": {"n": n}, "depends_on_index": [0]} for n in range(1500)
    ]
    ids = [i for (i,) in db.execute("select pgqueue.enqueue_many(%s)", (Jsonb(fan_out),))]
    root = ids[0]
    log_in(page, dashboard)
    page.goto(f"{dashboard.url}/list?status=waiting&workflow={root}")
    assert page.locator("[data-field=count]").inner_text().startswith("1,500 jobs of workflow")
    assert confirm(page, "Cancel these jobs…") == f"Cancel 1,500 jobs of workflow {root}?"
    assert page.locator("[data-field=more]").count() == 0
    click(page, "#bulk", "Cancel 1,500 jobs")
    assert page.locator("[data-field=done]").inner_text() == "1,500"
    after = statuses(db)
    assert Counter(after[i] for i in ids) == Counter({"queued": 1, "cancelled": 1500})


def test_the_edge_dashboards_workflow_command(
    edge_dashboard: EdgeDashboard, db: psycopg.Connection, stack_env: dict
) -> None:
    """`dashboard workflow ID`: each step of the job's workflow, a line of JSON, with
    DATABASE_URL alone; `dashboard job ID` names what the job waits for."""
    wf = enqueue_diamond(db)
    env = {k: v for k, v in {**os.environ, **stack_env}.items() if "PASSWORD" not in k}
    env = {k: v for k, v in env.items() if not k.endswith("SERVICE_ROLE_KEY")}

    def dashboard(*args: str) -> subprocess.CompletedProcess:
        command = [edge_dashboard.bin("dashboard"), *args]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=30)

    listed = dashboard("workflow", str(wf.b))
    assert listed.returncode == 0, listed.stderr
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [(r["id"], r["status"], r["depends_on"]) for r in rows] == [
        (wf.a, "done", []),
        (wf.b, "queued", [wf.a]),
        (wf.c, "queued", [wf.a]),
        (wf.d, "waiting", [wf.b, wf.c]),
    ]
    assert rows[0]["result"] == RESULTS["a"]
    job = json.loads(dashboard("job", str(wf.d)).stdout)
    assert [(j["id"], j["status"]) for j in job["depends_on"]] == [
        (wf.b, "queued"),
        (wf.c, "queued"),
    ]
    assert job["workflow_id"] == wf.a
    missing = dashboard("workflow", "999999999")
    assert missing.returncode == 1
    assert missing.stderr.startswith("error: no job 999999999: it was never enqueued")
