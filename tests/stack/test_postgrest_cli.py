"""The PostgREST stand-in started by hand, with the command docs/testing.md gives (read from the
page, so the doc cannot drift): it serves the queue of the stack's database and prints its URL
and keys as `supabase status -o env` names them; a database it cannot reach ends it with one
error line."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import httpx
import psycopg

from testkit.cluster import Cluster, free_port
from testkit.project import REPO

MARKER = "<!-- example: run by tests/stack/test_postgrest_cli.py -->"


def documented_command() -> list[str]:
    page = (REPO / "docs" / "testing.md").read_text()
    block = re.search(re.escape(MARKER) + r"\n\n```sh\n(.*?)```", page, re.S)
    assert block, "docs/testing.md shows no command to start the stand-in"
    command = shlex.split(block[1])
    assert command[:3] == ["python", "-m", "testkit.postgrest"], command
    return command


def with_options(command: list[str], **values: str) -> list[str]:
    """`command` run by this interpreter, with the values of its `--db-url` and `--port`."""
    args = [sys.executable, *command[1:]]
    for option, value in values.items():
        flag = "--" + option.replace("_", "-")
        assert flag in args, f"the documented command has no {flag}"
        args[args.index(flag) + 1] = value
    return args


def test_the_documented_command_serves_the_queue(stack: Cluster, db: psycopg.Connection) -> None:
    port = free_port()
    args = with_options(
        documented_command(), db_url=stack.dsn(user="authenticator"), port=str(port)
    )
    process = subprocess.Popen(
        args,
        cwd=REPO,
        env=dict(os.environ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        printed = dict(
            line.strip().split("=", 1) for line in (process.stdout.readline() for _ in range(3))
        )
        env = {name: value.strip('"') for name, value in printed.items()}
        assert set(env) == {"API_URL", "ANON_KEY", "SERVICE_ROLE_KEY"}
        assert env["API_URL"] == f"http://127.0.0.1:{port}"
        answer = httpx.post(
            f"{env['API_URL']}/rest/v1/rpc/enqueue",
            json={"kind": "send_email", "payload": {"to": "ada@example.com"}},
            headers={
                "Authorization": f"Bearer {env['SERVICE_ROLE_KEY']}",
                "Content-Profile": "pgqueue",
            },
        )
        assert answer.status_code == 200, answer.text
        row = db.execute("select kind from pgqueue.all_jobs where id = %s", (answer.json(),))
        assert row.fetchone() == ("send_email",)
        # the anon key is the anon role's: the queue refuses it
        refused = httpx.post(
            f"{env['API_URL']}/rest/v1/rpc/enqueue",
            json={"kind": "send_email"},
            headers={"Authorization": f"Bearer {env['ANON_KEY']}", "Content-Profile": "pgqueue"},
        )
        assert refused.status_code in (401, 403), refused.text
    finally:
        process.terminate()
        _, errors = process.communicate(timeout=20)
    assert process.returncode == 0, errors
    assert f"PostgREST stand-in on http://127.0.0.1:{port}/rest/v1" in errors


def test_a_database_it_cannot_reach_ends_it_with_one_error_line() -> None:
    unreachable = f"postgresql://authenticator@127.0.0.1:{free_port()}/postgres"
    done = subprocess.run(
        with_options(documented_command(), db_url=unreachable, port="0"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.startswith(f"error: cannot connect to {unreachable}: "), done.stderr
    assert done.stderr.count("\n") == 1 and done.stdout == "", done.stderr
