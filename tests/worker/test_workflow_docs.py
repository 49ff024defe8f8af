"""docs/workflows.md's Python example run as written: its handlers module is added to a copy
of the project's handlers/ as album.py, a worker runs it, and its make_album() enqueues the
workflow through the project's queue client; the album job ends with the result the page
says."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import psycopg

from testkit.project import REPO
from tests.support.doc_examples import examples
from tests.support.jobs import job_by_id, wait_until
from tests.support.workers import PACKAGE, Installed, Workers, each_transport, wake_to

DOC = REPO / "docs" / "workflows.md"
# what docs/workflows.md says its example's album job returns
ALBUM_RESULT = ["summer: beach.jpg@64w", "summer: beach.jpg@1024w"]
START = f"""
import asyncio

from {PACKAGE}.handlers.album import make_album
from {PACKAGE}.queue import open_queue
from {PACKAGE}.settings import Settings


async def main() -> None:
    queue = await open_queue(Settings.from_env())
    try:
        print(await make_album(queue, "beach.jpg", "summer"))
    finally:
        await queue.close()


asyncio.run(main())
"""


@each_transport
def test_the_docs_python_example_runs_as_written(
    installed: Installed,
    workers: Workers,
    worker_env: dict,
    db: psycopg.Connection,
    wake_secret: str,
    tmp_path: Path,
) -> None:
    [module] = [e for e in examples(DOC, "docs/workflows.md", "python") if e.marker == "module"]
    assert json.dumps(ALBUM_RESULT) in DOC.read_text().replace("\n", " ")
    src = tmp_path / "src"
    shutil.copytree(installed.path / "src", src)
    (src / PACKAGE / "handlers" / "album.py").write_text(module.code)
    worker = workers.start(src=src)
    if installed.http:
        wake_to(db, worker, wake_secret)

    started = subprocess.run(
        [installed.bin("python"), "-c", START],
        env={**os.environ, **worker_env, "PYTHONPATH": str(src)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert started.returncode == 0, started.stderr
    album = int(started.stdout)
    wait_until(lambda: job_by_id(db, album)["status"] == "done", timeout=60, what="the album")
    assert job_by_id(db, album)["result"] == ALBUM_RESULT
