"""A job's workflow in the dashboard (issue 51), in a real browser (Debian's chromium) against
the live database holding a diamond (A -> B, A -> C, B and C -> D) enqueued through the SQL:
the job page draws its steps a layer per column in dependency order, as an ordered list named
by its heading, each step's status and result or error as SQL says and a link to its page;
the job list lists the waiting jobs and filters by workflow. And an edge project's
`dashboard workflow ID`. Screenshots go to test-artifacts/dashboard/."""

from __future__ import annotations

import json
import os
import subprocess

import psycopg
from playwright.sync_api import Page

from tests.support.diamond import C_ERROR, KINDS, RESULTS, enqueue_diamond, finish_diamond

from .conftest import Dashboard, EdgeDashboard
from .test_browser import log_in
from .test_job_list import shown, submit_filters


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
    assert page.get_by_role("link", name="Cancel these jobs…").count() == 0
    # the drawing's counts link to the list of them
    page.goto(f"{dashboard.url}/jobs/{y}")
    with page.expect_navigation():
        page.get_by_role("link", name="1 waiting").click()
    assert shown(page) == [y]


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
