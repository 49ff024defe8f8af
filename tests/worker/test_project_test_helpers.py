"""A rendered project's test helpers (`my_app.testing`) catching what they are for: tests a
user might write, each wrong on purpose (tests/support/planted/), run by the project's own
pytest against our stack, through both transports; and the README's examples of them, run as
tests of the project."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import psycopg

from tests.support.doc_examples import examples
from tests.support.workers import Installed, each_transport

# copied into the project as test_helpers_catch.py (so named that ours do not collect it)
PLANTED = Path(__file__).parent.parent / "support" / "planted" / "helpers_catch.py"


def project_pytest(installed: Installed, tests: Path, env: dict) -> subprocess.CompletedProcess:
    """The project's pytest on `tests` (a folder with the project's own conftest.py)."""
    shutil.copy(installed.path / "tests" / "conftest.py", tests / "conftest.py")
    return subprocess.run(
        [installed.bin("pytest"), "-p", "no:cacheprovider", "-q", "--tb=short", "-rfE", str(tests)],
        cwd=tests,
        env={"PATH": str(installed.venv / "bin"), "HOME": str(tests), **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def failures(output: str) -> dict[str, str]:
    """Each failed test's section of pytest's report, by test name."""
    parts = re.split(r"^_{3,} (test_\w+) _{3,}$", output, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


@each_transport
def test_the_helpers_fail_each_wrong_test_saying_why(
    installed: Installed, stack_env: dict, db: psycopg.Connection, tmp_path: Path
) -> None:
    shutil.copy(PLANTED, tmp_path / "test_helpers_catch.py")
    done = project_pytest(installed, tmp_path, stack_env)
    output = done.stdout + done.stderr
    assert "8 failed, 1 passed" in output, output
    failed = failures(output)
    # assert_enqueued found nothing: it says what it looked for and lists what was enqueued
    wrong = failed["test_wrong_enqueue"]
    assert "no job enqueued with kind 'send_email', a payload holding" in wrong
    assert '"to": "ada@example.com"' in wrong
    assert re.search(r"#\d+ send_email on 'test-\w+', queued, run_after .*bob@example\.com", wrong)
    unwanted = failed["test_unwanted_enqueue"]
    assert "enqueued, though it should not be: kind 'send_email'" in unwanted
    assert re.search(r"#\d+ send_email on 'test-\w+', queued, .*ada@example\.com", unwanted)
    # the drain says what each job ended as: a wrong result, a failing handler's error, a
    # handler that never finishes stopped at its kind's timeout
    assert "outcome='done'" in failed["test_wrong_result"]
    assert "result=3.0" in failed["test_wrong_result"]
    failing = failed["test_failing_handler"]
    # (its error first, then its traceback, escaped in the outcome's repr)
    assert "outcome='failed'" in failing
    assert "error='RuntimeError: the API is down\\nTraceback (most recent call last)" in failing
    hanging = failed["test_never_finishing_handler_times_out_in_the_drain"]
    assert "error='TimeoutError: timed out after 1s'" in hanging
    # a drain that runs past its own timeout fails, naming the job still running
    stuck = failed["test_drain_that_does_not_end"]
    assert "did not end within 1s" in stuck and re.search(r"#\d+ double on .*running", stuck)
    # a handler run alone: its kind's timeout, and its result as stored
    assert (
        "HandlerTimedOut: the handler of 'hang' was still running after 1s"
        in (failed["test_never_finishing_handler_run_alone"])
    )
    assert "assert 3.0 == 2" in failed["test_wrong_result_run_alone"]


@each_transport
def test_the_readmes_testing_examples_pass_as_the_projects_tests(
    installed: Installed, stack_env: dict, db: psycopg.Connection, tmp_path: Path
) -> None:
    found = [
        e
        for e in examples(installed.path / "README.md", "README.md", "python")
        if e.marker == "module" and "def test_" in e.code
    ]
    assert len(found) == 2, found
    for n, example in enumerate(found):
        (tmp_path / f"test_readme_{n}.py").write_text(example.code)
    done = project_pytest(installed, tmp_path, stack_env)
    assert "3 passed" in done.stdout and "failed" not in done.stdout, done.stdout + done.stderr
