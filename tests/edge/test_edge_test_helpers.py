"""The Edge Function's test helpers against a database (drainQueue in testing_drain.ts,
queueClock in testing_clock.ts), run by the project's own `deno task test:db` against our
stack (the PostgREST stand-in over the real database), given as `supabase status -o env` names
it: the generated db_tests/ and the README's testing examples pass, and tests a user might
write, each wrong on purpose (tests/support/planted/helpers_catch_test.ts), fail saying why."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import psycopg
import pytest

from tests.support.doc_examples import examples
from tests.support.workflow import job_steps, run_step, runner_env, supabase_status

from .deno_worker import FUNCTION, Deno

PLANTED = Path(__file__).parent.parent / "support" / "planted" / "helpers_catch_test.ts"


@pytest.fixture
def function(function_dir: Path, tmp_path: Path) -> Path:
    """A copy of the rendered function, for the tests to add their own db_tests to."""
    copy = tmp_path / FUNCTION
    shutil.copytree(function_dir, copy)
    return copy


def run_db_tests(deno: Deno, function: Path, env: dict[str, str]) -> str:
    """`deno task test:db` as the README has the user run it; its whole output."""
    # the stack's values are `env`'s alone, never the outer environment's
    outer = {"API_URL", "SERVICE_ROLE_KEY", "DB_URL", "DATABASE_URL"}
    given = {k: v for k, v in deno.env().items() if k not in outer} | env
    done = subprocess.run(
        [deno.binary, "task", "test:db"],
        cwd=function,
        env=given,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.stdout + done.stderr


def failures(output: str) -> dict[str, str]:
    """Each failed test's error, by test name, from `deno test`'s ERRORS section."""
    errors = output.split(" ERRORS ", 1)[-1].split(" FAILURES ", 1)[0]
    parts = re.split(r"^(.+?) => \./db_tests/\S+$", errors, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def own_db_tests(function: Path) -> int:
    """How many tests the project's own db_tests/handlers_test.ts has."""
    own = (function / "db_tests" / "handlers_test.ts").read_text().count("Deno.test(")
    assert own >= 3, "the email, the webhook's retry and the snooze"
    return own


def test_the_helpers_fail_each_wrong_test_saying_why(
    deno: Deno, function: Path, stack_env: dict, flow: psycopg.Connection
) -> None:
    db = flow  # (schedules removed after the test)
    shutil.copy(PLANTED, function / "db_tests" / "helpers_catch_test.ts")
    output = run_db_tests(deno, function, stack_env)
    # the project's own db tests pass, and the planted ones that are right (two)
    assert f"FAILED | {own_db_tests(function) + 2} passed | 6 failed" in output, output
    failed = failures(output)
    assert set(failed) == {
        "wrong enqueue",
        "wrong result",
        "failing handler",
        "never finishing handler",
        "retry not due without the clock",
        "a schedule never defined",
    }, output
    # assertEnqueued: what it looked for, and every job enqueued
    wrong = failed["wrong enqueue"]
    assert 'no job enqueued with kind "send_email", a payload holding {"to":"ada@example.com"}' in (
        wrong
    )
    assert re.search(r'#1 send_email on "default", runAfter .*"to":"bob@example.com"', wrong)
    # drainQueue: what each job ended as, its result as stored
    assert "+       doubled: 6\n-       doubled: 4" in failed["wrong result"]
    assert re.search(r"#\d+ ended retried: Error: the API is down", failed["failing handler"])
    # a handler that never finishes: the drain stops at its timeout, naming the jobs
    hanging = failed["never finishing handler"]
    assert re.search(r'DrainTimedOut: the drain of queue "test-[0-9a-f]{12}" did not end', hanging)
    assert "within 1000 ms (drainQueue's timeoutMs)" in hanging
    stuck = re.search(r"#(\d+) still running then, handed back to the queue", hanging)
    assert stuck and re.search(rf"#{stuck[1]} hang: released", hanging), hanging
    assert re.search(r'#\d+ double: done \(result \{"doubled":3\}\)', hanging)
    # handed back without spending its attempt
    row = db.execute("select status, attempts from pgqueue.all_jobs where id = %s", (stuck[1],))
    assert row.fetchone() == ("queued", 0)
    # a retry is not due until the queue's clock moves (the planted test that moves it passed)
    assert "the retry did not run" in failed["retry not due without the clock"]
    # a schedule's slot fired now (the planted test that fires a defined one passed)
    assert 'no schedule named "nightly-reprot"' in failed["a schedule never defined"]


def test_the_db_tests_and_the_readmes_testing_examples_pass(
    deno: Deno, function: Path, stack_env: dict, db: psycopg.Connection
) -> None:
    found = [
        e
        for e in examples(function / "README.md", "README.md", "ts")
        if "Deno.test(" in e.code and not e.skipped
    ]
    # runJob's, withFakeDataApi's, and drainQueue's with queueClock
    assert len(found) == 3, found
    assert any("drainQueue(" in e.code and "queueClock(" in e.code for e in found)
    for n, example in enumerate(found):
        # imported as a test in db_tests/ imports them (the markers' paths are another
        # function's, which tests/edge/test_ts_examples.py type-checks them as)
        first = example.first.replace(f'"../{FUNCTION}/', '"../')
        (function / "db_tests" / f"readme_{n}_test.ts").write_text(first + example.code)
    output = run_db_tests(deno, function, stack_env)
    expected = own_db_tests(function) + sum(e.code.count("Deno.test(") for e in found)
    assert f"ok | {expected} passed | 0 failed" in output, output


def test_the_db_tests_say_what_they_need_without_a_stack(deno: Deno, function: Path) -> None:
    output = run_db_tests(deno, function, {})
    assert "StackMissing: these tests need a Supabase stack: API_URL and SERVICE_ROLE_KEY" in (
        output
    )
    assert 'eval "$(supabase status -o env)"' in output


def test_the_projects_ci_runs_the_db_tests_against_its_stack(
    deno: Deno, edge_project: Path, stack_env: dict, db: psycopg.Connection, tmp_path: Path
) -> None:
    """The CI workflow's database job, its db_tests step as written, in the folder it names,
    with only what `supabase status -o env` prints (the stack it starts has the Data API)."""
    steps = job_steps(edge_project, "database")
    [start] = [s for s in steps if s.get("name") == "Start the local stack"]
    assert start["run"].startswith("supabase start "), "db_tests need the Data API"
    [ci] = [s for s in steps if s.get("name", "").startswith("Edge Function tests")]
    settings = {k: deno.env()[k] for k in ("DENO_DIR", "DENO_NO_UPDATE_CHECK", "NO_COLOR")}
    env = runner_env(
        [supabase_status(tmp_path / "bin", stack_env), Path(deno.binary).parent], **settings
    )
    done = run_step(ci["run"], edge_project / ci["working-directory"], env)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    function = edge_project / ci["working-directory"]
    assert f"ok | {own_db_tests(function)} passed | 0 failed" in output, output
