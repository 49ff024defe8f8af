"""The function's README shows how to run it under plain Deno: an env file (`.env.deno`) and
one command. That command, read from the README (so the doc cannot drift), runs the function
against our stack (the PostgREST stand-in over the real database) with nothing else in the
environment, and the database's wake-up (pg_net) to the address the env file names drains a
job."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import psycopg

from testkit.cluster import free_port
from testkit.postgrest import PostgRESTStandIn, make_jwt
from testkit.stack import point_wake_ups

from .deno_worker import EDGE_WAKE_SECRET, FUNCTION, Deno, listening_worker, stop_edge_worker
from .test_edge_worker import insert_jobs, wait_for_jobs


def plain_deno_section(readme: Path) -> tuple[dict[str, str], str]:
    """The README's env file (name => value as written) and its command."""
    text = readme.read_text()
    section = re.search(r"^## Running it under plain Deno\n(.*?)^## ", text, re.S | re.M)
    assert section, "the function's README has no section on running it under plain Deno"
    env_file = re.search(r"^```dotenv\n(.*?)^```", section[1], re.S | re.M)
    command = re.search(
        r"<!-- example: run by tests/edge/test_edge_plain_deno.py -->\n\n```sh\n(.*?)```",
        section[1],
        re.S,
    )
    assert env_file and command, section[1]
    settings = dict(line.split("=", 1) for line in env_file[1].splitlines())
    return settings, command[1].strip()


def test_the_readmes_plain_deno_command_runs_the_function(
    deno: Deno, function_dir: Path, postgrest: PostgRESTStandIn, db: psycopg.Connection, tmp_path
) -> None:
    readme = function_dir / "README.md"
    written, command = plain_deno_section(readme)
    assert written["DENO_SERVE_ADDRESS"] == "tcp:127.0.0.1:8000"
    assert f"http://127.0.0.1:8000/{FUNCTION}" in readme.read_text()
    port = free_port()
    ours = {
        "SUPABASE_URL": postgrest.url,
        "SUPABASE_SERVICE_ROLE_KEY": make_jwt("service_role"),
        "PGQUEUE_WAKE_SECRET": EDGE_WAKE_SECRET,
        "DENO_SERVE_ADDRESS": f"tcp:127.0.0.1:{port}",
    }
    # the README names every setting the function needs here, and only those
    assert set(written) == set(ours), written
    env_file = re.fullmatch(r"deno run .*--env-file=(\S+) index\.ts", command)
    assert env_file, command
    function = tmp_path / FUNCTION
    shutil.copytree(function_dir, function)
    (function / env_file[1]).write_text("".join(f"{k}={v}\n" for k, v in ours.items()))
    # Only Deno on the PATH and its cache: the settings come from the env file alone.
    env = deno.env(PATH=f"{Path(deno.binary).parent}:/usr/bin:/bin")
    process = subprocess.Popen(
        ["bash", "-c", command],
        cwd=function,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    worker = listening_worker(process, ours["SUPABASE_SERVICE_ROLE_KEY"])
    try:
        assert worker.url == f"http://127.0.0.1:{port}/{FUNCTION}", worker.output()
        point_wake_ups(db, worker.url, EDGE_WAKE_SECRET)
        (job,) = insert_jobs(db, {"kind": "send_email", "payload": EMAIL})
        done = wait_for_jobs(db, "status = 'done'", worker)
    finally:
        stop_edge_worker(worker)
    assert [(row[0], row[2]) for row in done] == [(job, "done")]


EMAIL = {"to": "ada@example.com", "subject": "Hi", "text": "."}
