"""docs/client-jobs.md's Python examples run as written: its handler (export_data) in a real
worker, and its supabase-py example, as a signed-in user with their JWT through the Data API
(the PostgREST stand-in), submits a job of that kind and follows it in my_jobs until it is
done. The generated README's examples are the page's."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import psycopg
import pytest

from testkit.postgrest import PostgRESTStandIn, make_jwt
from testkit.project import REPO, variant
from tests.support.doc_examples import Example, examples
from tests.support.workers import Installed, Workers, with_handlers

PAGE = REPO / "docs" / "client-jobs.md"


def page_examples(language: str) -> list[Example]:
    return [e for e in examples(PAGE, "docs/client-jobs.md", language) if not e.skipped]


def the_handler() -> Example:
    [handler] = [e for e in page_examples("python") if "@handler(" in e.code]
    return handler


def the_client() -> Example:
    [client] = [e for e in page_examples("python") if "acreate_client" in e.code]
    return client


@pytest.mark.parametrize("installed", [variant("python", "supabase")], indirect=True, ids=str)
def test_the_pages_supabase_py_example_follows_the_pages_handler_to_the_end(
    installed: Installed,
    workers: Workers,
    app_api: PostgRESTStandIn,
    export_open: psycopg.Connection,
    tmp_path: Path,
) -> None:
    handler = the_handler()
    module = tmp_path / "export_data.py"
    module.write_text(f"from __future__ import annotations\n\n{handler.first}\n{handler.code}")
    workers.start(src=with_handlers(installed.path / "src", tmp_path / "src", module))

    client = the_client()
    script = tmp_path / "client_example.py"
    script.write_text(
        f"import asyncio\n{client.first}\n\nasync def example() -> None:\n"
        f"{textwrap.indent(client.code, '    ')}\n\nasyncio.run(example())\n"
    )
    user = uuid.uuid4()
    env = {
        "SUPABASE_URL": app_api.url,
        "SUPABASE_ANON_KEY": make_jwt("anon"),
        "USER_ACCESS_TOKEN": make_jwt("authenticated", sub=str(user)),
    }
    proc = subprocess.run(
        [sys.executable, str(script)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    # The job ran as the user's: the handler's result names its owner.
    assert proc.stdout.startswith(f"done {{'file': 'exports/{user}/"), proc.stdout


@pytest.mark.parametrize("installed", [variant("python", "supabase")], indirect=True, ids=str)
def test_the_generated_readme_shows_the_pages_examples(installed: Installed) -> None:
    readme = installed.path / "README.md"
    for language in ("python", "ts"):
        shown = {e.code for e in examples(readme, "README.md", language)}
        for example in page_examples(language):
            if "acreate_client" in example.code or "client_enqueue" in example.code:
                assert example.code in shown, f"{example} is not in the README"
