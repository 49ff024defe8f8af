"""Jobs of an app's signed-in users, run by a real worker of each transport (release 1.1.0,
docs/client-jobs.md): the handler sees job.owner for a job a user submitted through the Data
API (the PostgREST stand-in, with the user's JWT) and None for one the service enqueued; a
UserFacingError's message is what the owner reads in my_jobs (reported as such with
fail_user_facing(), release 1.2.0), and no other error's, whatever its text."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import httpx
import psycopg
import pytest

from testkit.postgrest import PostgRESTStandIn, make_jwt
from testkit.project import render
from tests.support.jobs import enqueue, job, probe_lines, wait_until
from tests.support.workers import SCRIPT, Installed, Workers, each_transport

PUBLIC = "pgqueue_public"


@pytest.fixture
def probe_open(clients: psycopg.Connection) -> None:
    """The probe's kind open to signed-in users for the test."""
    clients.execute("select pgqueue.allow_client_kind('e2e_probe', 100)")


def as_user(api: PostgRESTStandIn, user: uuid.UUID) -> httpx.Client:
    token = make_jwt("authenticated", sub=str(user))
    return httpx.Client(
        base_url=f"{api.url}/rest/v1",
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Profile": PUBLIC,
            "Accept-Profile": PUBLIC,
        },
        timeout=30,
    )


# The job runner is the same code in both styles: once per transport is enough.
@each_transport
def test_handlers_see_the_owner_and_the_owner_reads_a_user_facing_error(
    installed: Installed,
    workers: Workers,
    db: psycopg.Connection,
    app_api: PostgRESTStandIn,
    probe_open: None,
    wake_secret: str,
    tmp_path: Path,
) -> None:
    log = tmp_path / "runs.jsonl"
    user = uuid.uuid4()
    workers.start_woken(db, wake_secret)
    with as_user(app_api, user) as api:
        submitted = api.post(
            "/rpc/client_enqueue", json={"kind": "e2e_probe", "payload": {"log": str(log)}}
        )
        assert submitted.status_code == 200, submitted.text
        mine = submitted.json()
        refused = api.post(
            "/rpc/client_enqueue",
            json={
                "kind": "e2e_probe",
                "payload": {"log": str(log), "user_error": "that file is too big to export"},
            },
        )
        assert refused.status_code == 200, refused.text
        failing = refused.json()
        # a PermanentError whose text reads like a UserFacingError's stays hidden
        disguised = api.post(
            "/rpc/client_enqueue",
            json={
                "kind": "e2e_probe",
                "payload": {"log": str(log), "permanent_error": "UserFacingError: key=s3cret"},
            },
        ).json()
        theirs = enqueue(db, log=str(log))

        def finished() -> bool:
            ids = (mine, failing, disguised, theirs)
            return all(job(db, i)["status"] in ("done", "failed") for i in ids)

        wait_until(finished, what="the four jobs to finish")
        starts = [line for line in probe_lines(log) if line["at"] == "start"]
        owners = {line["job_id"]: line["owner"] for line in starts}
        assert owners == {mine: str(user), failing: str(user), disguised: str(user), theirs: None}

        # Stored as `UserFacingError: <message>`, failed at once (no retry) ...
        failed = job(db, failing)
        assert (failed["status"], failed["attempts"]) == ("failed", 1)
        assert failed["last_error"] == "UserFacingError: that file is too big to export"
        # ... and the owner reads the message alone; the service's job is not theirs.
        rows = api.get("/my_jobs", params={"select": "id,status,error", "order": "id.desc"})
        assert rows.status_code == 200, rows.text
        assert rows.json() == [
            {"id": disguised, "status": "failed", "error": None},
            {"id": failing, "status": "failed", "error": "that file is too big to export"},
            {"id": mine, "status": "done", "error": None},
        ]
        assert job(db, disguised)["last_error"] == "UserFacingError: key=s3cret"


@each_transport
def test_cli_opens_and_closes_kinds_to_users(
    installed: Installed, stack_env: dict, clients: psycopg.Connection
) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [installed.bin(SCRIPT), *args],
            env={**os.environ, **stack_env},
            capture_output=True,
            text=True,
            timeout=60,
        )

    opened = cli("allow-client-kind", "export_data", "10")
    assert opened.stdout == "kind 'export_data': signed-in users may submit 10 a minute each\n"
    listed = cli("client-kinds")
    assert [json.loads(line) for line in listed.stdout.splitlines()] == [
        {"kind": "export_data", "per_minute": 10}
    ]
    closed = cli("disallow-client-kind", "export_data").stdout
    assert closed == "kind 'export_data': closed to users\n"
    assert cli("disallow-client-kind", "export_data").stdout == "kind 'export_data': was not open\n"
    refused = cli("allow-client-kind", "export_data", "0")
    assert refused.returncode != 0 and refused.stdout == ""
    assert "per_minute must be 1 to 10000 jobs a minute per user, got 0" in refused.stderr
    # the caps: given, then kept when the rate changes alone
    capped = cli(
        "allow-client-kind", "export_data", "10", "--max-per-user", "5", "--max-total", "50"
    )
    assert capped.returncode == 0, capped.stderr
    assert cli("allow-client-kind", "export_data", "20").returncode == 0
    caps = "select per_minute, max_per_user, max_total from pgqueue.client_kinds"
    assert clients.execute(caps).fetchall() == [(20, 5, 50)]
    refused = cli("allow-client-kind", "export_data", "10", "--max-per-user", "0")
    assert refused.returncode != 0
    assert "max_per_user must be 1 to 10000 queued or running jobs, got 0" in refused.stderr


# What queue/owners.py does with the kinds it read: run on pytest's interpreter, with a stand-in for
# the queue client that counts its calls.
OWNERS_SCRIPT = """
import asyncio, json
from types import SimpleNamespace as Job
from my_app.queue.owners import JobOwners

class Queue:
    def __init__(self):
        self.open, self.calls = {}, []
    async def client_kinds(self):
        if self.open is None:
            raise RuntimeError("relation client_kinds does not exist")
        return dict(self.open)
    async def job_owners(self, ids):
        self.calls.append(ids)
        return {i: "user-" + str(i) for i in ids if i % 2}

async def main():
    queue = Queue()
    owners = JobOwners(queue)
    batch = [Job(id=1, kind="export"), Job(id=2, kind="export"), Job(id=3, kind="email")]
    await owners.refresh()
    none_open = await owners.of(batch)
    queue.open = {"export": 10}
    await owners.refresh()
    opened = await owners.of(batch)
    queue.open = None  # a failed read keeps what was known
    await owners.refresh()
    queue.open = {}  # closed: its jobs keep their owners
    await owners.refresh()
    closed = await owners.of(batch)
    print(json.dumps([none_open, opened, closed, queue.calls]))

asyncio.run(main())
"""


def test_owners_are_read_only_for_kinds_open_to_users(
    template: Path, tmp_path: Path, interpreter: Path
) -> None:
    project = render(template, tmp_path / "app", worker_style="python", claim_transport="supabase")
    proc = subprocess.run(
        [interpreter / "bin" / "python", "-c", OWNERS_SCRIPT],
        env={**os.environ, "PYTHONPATH": str(project / "src")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    none_open, opened, closed, calls = json.loads(proc.stdout)
    assert none_open == {}, "no kind open: no call"
    assert opened == closed == {"1": "user-1"}
    assert calls == [[1, 2], [1, 2]], "only the jobs of the open kind are looked up"
    assert "client kinds unavailable" in proc.stderr, "a failed read is logged"
