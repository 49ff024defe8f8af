"""The steps a new project's user is given, by Copier's closing message and by the README's
local run, give the wake-up secret before the worker starts, to the worker and to the database
alike (issue 47: given after it, the worker's first start failed)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.project import choices, render

SERVE = {
    "python": "uv run my-app worker",
    "python-http": "uv run my-app worker",
    "edge": "supabase functions serve job-worker",
}
# what gives the worker its secret, and the database the same, in each style
GIVE_WORKER = {"python-http": 'export WAKE_SECRET="$(openssl rand -hex 32)"'}
GIVE_WORKER["edge"] = 'echo "PGQUEUE_WAKE_SECRET=$(openssl rand -hex 32)" > supabase/functions/.env'
GIVE_DATABASE = {
    "python-http": "alter database postgres set app.pgqueue_wake_secret = '$WAKE_SECRET'",
    "edge": "alter database postgres set app.pgqueue_wake_secret = '$PGQUEUE_WAKE_SECRET'",
}


def next_steps(template: Path, tmp_path: Path, style: str) -> list[str]:
    """The command lines of Copier's closing message, as `copier copy` prints them."""
    copy = subprocess.run(
        [
            *(sys.executable, "-m", "copier", "copy", "--trust", "--defaults", "--vcs-ref", "HEAD"),
            *("--data", f"worker_style={style}", str(template), str(tmp_path / "my-app")),
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "NO_COLOR": "1"},
    )
    message = copy.stderr[copy.stderr.index("Next steps:") :]
    return [line.strip() for line in message.splitlines() if line.startswith("  ")]


def index(lines: list[str], text: str) -> int:
    [found] = [i for i, line in enumerate(lines) if text in line]
    return found


@pytest.mark.parametrize("style", choices("worker_style"))
def test_copiers_closing_steps_give_the_secret_before_the_worker_starts(
    template: Path, tmp_path: Path, style: str
) -> None:
    lines = next_steps(template, tmp_path, style)
    serve = index(lines, SERVE[style])
    if style == "python":
        assert not [line for line in lines if "SECRET" in line], "nothing wakes this worker"
        return
    assert index(lines, GIVE_WORKER[style]) < index(lines, GIVE_DATABASE[style]) < serve
    if style == "edge":
        assert "--env-file supabase/functions/.env" in lines[serve]


def test_the_readmes_local_run_gives_the_secret_before_the_worker_starts(
    template: Path, tmp_path: Path
) -> None:
    readme = (
        render(template, tmp_path / "app", worker_style="python-http") / "README.md"
    ).read_text()
    block = re.search(r"```sh\nuv sync --extra dev.*?```", readme, re.DOTALL)
    assert block is not None
    lines = block[0].splitlines()
    give = index(lines, GIVE_WORKER["python-http"])
    assert give < index(lines, GIVE_DATABASE["python-http"]) < index(lines, SERVE["python-http"])
    assert index(lines, 'eval "$(supabase status -o env)"') < give
