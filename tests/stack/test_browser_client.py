"""A signed-in user of an app submits a job from the browser and watches it finish (issue 39):
a page in chromium, with supabase-js (its browser build, pinned in package.json), calls the
Data API (the PostgREST stand-in, from another origin as an app's page would) with the user's
JWT, and polls `my_jobs` while the job runs and reports progress."""

from __future__ import annotations

import functools
import shutil
import threading
import uuid
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psycopg
import pytest
from playwright.sync_api import Page
from psycopg.types.json import Jsonb

from testkit.postgrest import PostgRESTStandIn, make_jwt
from testkit.project import REPO

SUPABASE_JS = REPO / "node_modules/@supabase/supabase-js/dist/umd/supabase.js"
KIND = "export_data"

# The app's page: submits a job when asked, then shows the job as my_jobs has it, read every
# 100 ms until it has finished.
PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><script src="supabase.js"></script></head>
<body>
<p>job <span id="job"></span>: <span id="status">not submitted</span></p>
<p>progress <span id="progress"></span>, result <span id="result"></span></p>
<p id="error"></p>
<script>
const settings = new URLSearchParams(location.hash.slice(1));
const client = supabase.createClient(settings.get("api"), settings.get("anon"), {
  accessToken: async () => settings.get("token"),
  db: { schema: "pgqueue_public" },
});
const show = (id, value) => {
  const text = typeof value === "string" ? value : JSON.stringify(value);
  document.getElementById(id).textContent = text;
};
window.submitAndFollow = async () => {
  const { data: id, error } = await client.rpc("client_enqueue", {
    kind: "export_data", payload: { format: "csv" },
  });
  if (error) return show("error", error.message);
  show("job", String(id));
  for (;;) {
    const { data, error } = await client.from("my_jobs").select("status, progress, result")
      .eq("id", id);
    if (error) return show("error", error.message);
    const [job] = data;
    show("status", job.status);
    show("progress", job.progress);
    show("result", job.result);
    if (["done", "failed", "cancelled"].includes(job.status)) return;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
};
</script>
</body></html>
"""


@pytest.fixture
def app_origin(tmp_path: Path) -> Iterator[str]:
    """The app's page and supabase-js, served from an origin of their own."""
    (tmp_path / "index.html").write_text(PAGE)
    shutil.copy(SUPABASE_JS, tmp_path / "supabase.js")
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def shown(page: Page, element: str, text: str) -> None:
    page.wait_for_function(
        "([id, text]) => document.getElementById(id).textContent === text",
        arg=[element, text],
        timeout=10_000,
    )


def test_a_signed_in_user_submits_from_the_browser_and_watches_the_job_finish(
    page: Page, app_origin: str, app_api: PostgRESTStandIn, export_open: psycopg.Connection
) -> None:
    user = uuid.uuid4()
    token = make_jwt("authenticated", sub=str(user))
    page.goto(f"{app_origin}/index.html#api={app_api.url}&anon={make_jwt('anon')}&token={token}")
    page.evaluate("() => { window.submitAndFollow(); }")  # not awaited: it runs on in the page
    shown(page, "status", "queued")
    job_id = int(page.text_content("#job") or "0")
    assert export_open.execute(
        "select owner from pgqueue.client_jobs where job_id = %s", (job_id,)
    ).fetchone() == (user,)

    # the worker's side, as the SQL functions a worker calls
    (token_of_claim,) = export_open.execute(
        "select lock_token from pgqueue.claim('browser-test', kinds => array[%s])", (KIND,)
    ).fetchone()
    export_open.execute(
        "select pgqueue.progress(%s, %s, %s)", (job_id, token_of_claim, Jsonb({"rows": 50}))
    )
    shown(page, "status", "running")
    shown(page, "progress", '{"rows":50}')
    export_open.execute(
        "select pgqueue.complete(%s, %s, %s)",
        (job_id, token_of_claim, Jsonb({"url": "exports/report.csv"})),
    )
    shown(page, "status", "done")
    shown(page, "result", '{"url":"exports/report.csv"}')
    assert page.text_content("#error") == ""
