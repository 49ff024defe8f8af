"""Every command of the CLI, and the worker, answers what goes wrong in a user's first hour with
one `error: ...` line on stderr that says what to do, and a non-zero exit (1: it could not be
done; 2: bad usage): the migrations not applied, a malformed DATABASE_URL (or SUPABASE_URL),
the database (or the Data API) unreachable, a job that does not exist, a bad argument. No
traceback (LOG_LEVEL=DEBUG adds one). Each against a real CLI process and a real database."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from testkit.cluster import Cluster
from testkit.postgrest import PostgRESTStandIn, make_jwt
from testkit.project import PYTHON_VARIANTS
from tests.support.workers import SCRIPT, Installed

EMAIL = '{"to": "ada@example.com", "subject": "Hi", "text": "Hello"}'
# Every command that talks to the queue (the dashboard, with a password, checks it at start).
COMMANDS = [
    ["worker"],
    ["dashboard", "--port", "0"],
    ["enqueue", "send_email", EMAIL],
    ["job", "1"],
    ["workflow", "1"],
    ["stats"],
    ["health"],
    ["dead-letters"],
    ["retry", "1"],
    ["cancel", "1"],
    ["pause", "emails"],
    ["resume", "emails"],
    ["queues"],
    ["concurrency-limit", "tenant-1", "2"],
    ["rate-limit", "webhooks", "5"],
    ["schedule", "nightly", "0 3 * * *", "send_email", EMAIL],
    ["unschedule", "nightly"],
    ["schedules"],
    ["config", "show"],
    ["config", "set", "max_attempts=5"],
]
MIGRATE = "(supabase db push, or supabase migration up locally)"

# The one-shot commands are the same code in both styles: once per transport; the worker's
# start-up differs by style, and the python style's runs here.
PYTHON_STYLE = [v for v in PYTHON_VARIANTS if v.worker_style == "python"]
each_transport = pytest.mark.parametrize("installed", PYTHON_STYLE, indirect=True, ids=str)
# what only the supabase transport meets
data_api_only = pytest.mark.parametrize(
    "installed",
    [v for v in PYTHON_STYLE if v.claim_transport == "supabase"],
    indirect=True,
    ids=str,
)


def environment(installed: Installed, stack_env: dict, **changes: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith(("_URL", "_KEY"))}
    env.pop("LOG_LEVEL", None)
    return {**env, **stack_env, "DASHBOARD_PASSWORD": "correct horse battery", **changes}


def cli(installed: Installed, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [installed.bin(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60
    )


def error_line(proc: subprocess.CompletedProcess, status: int = 1) -> str:
    """The one line the command printed on stderr, which must be an error line."""
    what = f"{proc.args[1:]} exited {proc.returncode}:\n{proc.stderr}"
    assert proc.returncode == status, what
    assert "Traceback" not in proc.stderr, what
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), what
    return lines[0]


def every_command(installed: Installed, env: dict[str, str]) -> dict[str, str]:
    """Each command's error line (a few at a time: each is a Python process of its own)."""
    with ThreadPoolExecutor(4) as pool:
        procs = list(pool.map(lambda args: cli(installed, env, *args), COMMANDS))
    return {proc.args[1]: error_line(proc) for proc in procs}


@pytest.fixture
def empty_database(stack: Cluster) -> Iterator[str]:
    """A database on the stack without the queue (its migrations never applied)."""
    name = f"empty_{uuid.uuid4().hex[:8]}"
    with stack.connect(autocommit=True) as conn:
        conn.execute(f"create database {name}")
    yield name
    with stack.connect(autocommit=True) as conn:
        conn.execute(f"drop database {name} with (force)")


@each_transport
def test_a_database_without_the_migrations(
    installed: Installed, stack: Cluster, stack_env: dict, empty_database: str
) -> None:
    if installed.transport == "postgres":
        env = environment(installed, stack_env, DB_URL=stack.dsn(empty_database, user="postgres"))
        lines = every_command(installed, env)
        expected = (
            "error: the queue schema pgqueue does not exist in this database: apply the "
            f"migrations first {MIGRATE}"
        )
        assert lines == dict.fromkeys(lines, expected)
        return
    with PostgRESTStandIn(stack.dsn(empty_database, user="authenticator")) as api:
        lines = every_command(installed, environment(installed, stack_env, API_URL=api.url))
    for command, line in lines.items():
        assert "in the schema cache: the queue's migrations are not all applied" in line, command
        assert f"apply them {MIGRATE}" in line, command


@data_api_only
@pytest.mark.parametrize("command", [["stats"], ["worker"]], ids=str)
def test_the_data_api_without_the_queue_schema(
    installed: Installed, stack: Cluster, stack_env: dict, command: list[str]
) -> None:
    """PostgREST answers PGRST106 for a schema it does not serve (not migrated, or not exposed)."""
    with PostgRESTStandIn(stack.dsn(user="authenticator"), schemas=("public",)) as api:
        proc = cli(installed, environment(installed, stack_env, API_URL=api.url), *command)
    assert error_line(proc) == (
        f"error: the Data API does not serve the queue schema pgqueue: apply the migrations "
        f"first {MIGRATE}, and expose the schema: [api] schemas in supabase/config.toml "
        "(local), Settings > API > Exposed schemas (hosted)"
    )


@data_api_only
@pytest.mark.parametrize("command", [["stats"], ["worker"]], ids=str)
def test_the_anon_key_given_as_the_service_key(
    installed: Installed, stack_env: dict, command: list[str]
) -> None:
    """A new user gave the anon key: "42501: permission denied for schema pgqueue (None)"
    named no mistake. The line names the likely one and where the right key is."""
    env = environment(installed, stack_env, SERVICE_ROLE_KEY=make_jwt("anon"))
    line = error_line(cli(installed, env, *command))
    assert line.startswith("error: permission denied for schema pgqueue: the key given "), line
    assert "is not the service_role key (the anon key, or a user's token?)" in line, line


@each_transport
def test_an_unreachable_database(installed: Installed, stack_env: dict) -> None:
    """The one-shot commands and the dashboard say so; the worker waits the outage out
    (test_an_unreachable_database_is_waited_out_by_the_worker)."""
    if installed.transport == "postgres":
        env = environment(installed, stack_env, DB_URL="postgresql://postgres@127.0.0.1:1/postgres")
        expected = (
            "error: cannot connect to Postgres: connection failed: connection to server at "
            '"127.0.0.1", port 1 failed: Connection refused: is the database running '
            "(supabase start, locally), and are DATABASE_URL's host, port and password right?"
        )
    else:
        env = environment(installed, stack_env, API_URL="http://127.0.0.1:1")
        expected = (
            "error: cannot reach the Data API: All connection attempts failed: is Supabase "
            "running (supabase start, locally), and is SUPABASE_URL right?"
        )
    commands = [args for args in COMMANDS if args != ["worker"]]
    with ThreadPoolExecutor(4) as pool:
        procs = list(pool.map(lambda args: cli(installed, env, *args), commands))
    assert {proc.args[1]: error_line(proc) for proc in procs} == {
        args[0]: expected for args in commands
    }


@each_transport
def test_an_unreachable_database_is_waited_out_by_the_worker(
    installed: Installed, stack_env: dict
) -> None:
    url = {"postgres": ("DB_URL", "postgresql://postgres@127.0.0.1:1/postgres")}.get(
        installed.transport or "", ("API_URL", "http://127.0.0.1:1")
    )
    env = environment(installed, stack_env, **dict([url]))
    with pytest.raises(subprocess.TimeoutExpired) as waited:
        subprocess.run(
            [installed.bin(SCRIPT), "worker"], env=env, capture_output=True, text=True, timeout=15
        )
    stderr = (waited.value.stderr or b"").decode()
    assert '"event": "worker.unavailable"' in stderr and "Traceback" not in stderr


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgres://user:pass word@host/db", 'unexpected spaces found in "...", use percent'),
        ("host=127.0.0.1 port", 'missing "=" after "..." in connection info string'),
        ("postgresql://postgres:secret@127.0.0.1:abc/postgres", "the port 'abc', not a number"),
    ],
    ids=["spaces", "key-value", "port"],
)
@each_transport
def test_a_malformed_database_url(
    installed: Installed, stack_env: dict, url: str, expected: str
) -> None:
    if installed.transport != "postgres":
        url, expected = url.replace("postgres", "http", 1), "SUPABASE_URL (or API_URL) is not a URL"
    name = "DB_URL" if installed.transport == "postgres" else "API_URL"
    env = environment(installed, stack_env, **{name: url})
    for args in (["worker"], ["stats"], ["enqueue", "send_email", EMAIL], ["dashboard"]):
        line = error_line(cli(installed, env, *args), status=2)
        assert line.startswith("error: ") and expected in line, line
        assert "secret" not in line and "pass word" not in line
        assert "supabase status -o env" in line


@each_transport
def test_a_job_that_does_not_exist(
    installed: Installed, stack_env: dict, db: psycopg.Connection
) -> None:
    env = environment(installed, stack_env)
    for command in ("job", "workflow", "retry", "cancel"):
        assert error_line(cli(installed, env, command, "999999")) == (
            "error: no job 999999: it was never enqueued, or it finished longer ago than the "
            "queue keeps jobs (retention_days, dead_letter_retention_days: `config show`)"
        )
    (queued,) = db.execute("select pgqueue.enqueue('nobody_handles_this')").fetchone()
    assert error_line(cli(installed, env, "retry", str(queued))) == (
        f"error: job {queued} is queued: only a dead-lettered or cancelled job is retried"
    )
    assert cli(installed, env, "cancel", str(queued)).returncode == 0
    assert error_line(cli(installed, env, "cancel", str(queued))) == (
        f"error: job {queued} is cancelled: it has finished, there is nothing to cancel"
    )


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["job", "abc"],
            "error: argument job_id: invalid int value: 'abc' (see `my-app job --help`)",
        ),
        ([], "error: the following arguments are required: COMMAND (see `my-app --help`)"),
        (["stat"], "error: argument COMMAND: invalid choice: 'stat'"),
        (["rate-limit", "q", "fast"], "error: argument PER_SECOND: 'fast' is not a number"),
    ],
    ids=str,
)
@each_transport
def test_a_bad_argument(
    installed: Installed, stack_env: dict, args: list[str], expected: str
) -> None:
    line = error_line(cli(installed, environment(installed, stack_env), *args), status=2)
    assert line.startswith(expected), line


@each_transport
def test_debug_logging_adds_the_traceback(
    installed: Installed, stack: Cluster, stack_env: dict, empty_database: str
) -> None:
    name, value = (
        ("DB_URL", stack.dsn(empty_database, user="postgres"))
        if installed.transport == "postgres"
        else ("API_URL", "http://127.0.0.1:1")
    )
    env = environment(installed, stack_env, LOG_LEVEL="DEBUG", **{name: value})
    proc = cli(installed, env, "stats")
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr
    assert proc.stderr.splitlines()[-1].startswith("error: ")
